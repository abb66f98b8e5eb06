//! Automatic path migration in the runtime: the wire addresses of an RC QP's paths, kept in
//! step with its transport's primary and alternate path, and the async events of its
//! migrations.
//!
//! Each RC QP caches the addresses of its paths ([`Paths`]): the primary (set with the
//! address vector), the alternate (set with `ALT_PATH`) and the one it migrated off last.
//! A packet leaves from the cached path of its [`rdma_proto::packet::Transmit::port`], which
//! is the transport's current primary; a received packet is taken when its addresses are
//! one of the cached paths, and the transport decides by its arrival port whether the path
//! migration rules accept it. The cache changes only when the transport reports a migration
//! ([`rdma_proto::rc::QpEvent`]), drained before every transmission: no lock or allocation
//! per packet.

use rdma_proto::memory::MemoryTable;
use rdma_proto::rc::QpEvent;
use rdma_proto::verbs::{MigState, QpState};

use super::{QpCtx, Runtime};
use crate::io::WireAddr;
use crate::queues::{AsyncEvent, AsyncQueue};

/// The wire addresses of one path of an RC QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WirePath {
    /// The source address (the path's `sgid_index` in its port's GID table).
    pub local: WireAddr,
    /// The destination (the path's `dgid`).
    pub remote: WireAddr,
    /// The device port whose GID table holds `local`.
    pub port: u8,
    /// IPv4 TOS / IPv6 traffic class of every packet on the path (`traffic_class`).
    pub tclass: u8,
    /// UDP source port ([`crate::io::flow::connected_udp_sport`] of the path's flow label).
    pub sport: u16,
}

/// The paths of an RC QP as the runtime knows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Paths {
    /// The path in force (`QpAttr::{path, port_num}`), set at Init → RTR.
    pub primary: Option<WirePath>,
    /// The alternate path loaded with `ALT_PATH`, until migrated to.
    pub alt: Option<WirePath>,
    /// The path migrated off last: the peer may still use it until it migrates too.
    pub prev: Option<WirePath>,
}

impl Paths {
    /// The port of the QP's path a packet to `local` from `remote` belongs to, if any.
    #[inline]
    pub fn admits(&self, local: WireAddr, remote: WireAddr) -> Option<u8> {
        [self.primary, self.alt, self.prev]
            .into_iter()
            .flatten()
            .find(|p| p.local == local && p.remote == remote)
            .map(|p| p.port)
    }

    /// The path packets from `port` leave on: the primary when it is on that port (always,
    /// unless a migration has not been drained), else the cached path on that port, else
    /// the primary.
    #[inline]
    pub fn for_port(&self, port: u8) -> Option<&WirePath> {
        fn on(p: &Option<WirePath>, port: u8) -> Option<&WirePath> {
            p.as_ref().filter(|p| p.port == port)
        }
        on(&self.primary, port)
            .or_else(|| on(&self.alt, port))
            .or_else(|| on(&self.prev, port))
            .or(self.primary.as_ref())
    }

    /// Whether any path uses local address `local`.
    pub fn uses(&self, local: WireAddr) -> bool {
        [self.primary, self.alt, self.prev]
            .iter()
            .any(|p| p.is_some_and(|p| p.local == local))
    }

    /// The local addresses of the paths.
    pub fn locals(&self) -> impl Iterator<Item = WireAddr> {
        [self.primary, self.alt, self.prev]
            .into_iter()
            .flatten()
            .map(|p| p.local)
    }

    /// The transport moved to the alternate path on `to_port`: it becomes the primary, the
    /// old primary is kept as `prev`. False when no alternate on that port was cached.
    fn migrated(&mut self, to_port: u8) -> bool {
        match self.alt.filter(|a| a.port == to_port) {
            Some(alt) => {
                self.prev = self.primary.replace(alt);
                self.alt = None;
                true
            }
            None => false,
        }
    }
}

impl QpCtx {
    /// Moves the transport's events to the device queue, switching the cached path on a
    /// migration. Cheap when there are none (one empty-queue check).
    #[inline]
    pub(crate) fn drain_events(&mut self, events: &mut AsyncQueue) {
        while let Some(e) = self.rc.poll_event() {
            if let QpEvent::PathMigrated { to_port, .. } = e {
                if self.paths.migrated(to_port) {
                    if let Some(p) = self.paths.primary {
                        self.span.record("peer", tracing::field::display(p.remote));
                    }
                } else {
                    tracing::warn!(
                        qpn = self.qpn,
                        to_port,
                        "migrated to a path the runtime does not know"
                    );
                }
            }
            events.push(AsyncEvent::of_qp(self.qpn, e));
        }
    }
}

impl Runtime {
    /// Port `port` went down: every RC QP in RTS whose path in force is on it and whose
    /// migration state is Armed migrates to its alternate path now (the spec's local port
    /// down trigger) and resends what is outstanding there. Returns how many migrated.
    pub fn port_down<M: MemoryTable + ?Sized>(&mut self, port: u8, mem: &mut M) -> usize {
        let now = self.now();
        let mut n = 0;
        for k in 0..self.live.len() {
            let idx = self.live[k] as usize;
            let Some(ctx) = self.slots[idx].as_deref_mut() else {
                continue;
            };
            let rc = &mut ctx.rc;
            let armed = rc.state() == QpState::Rts && rc.path_mig_state() == MigState::Armed;
            if !armed || rc.attr().port_num != port {
                continue;
            }
            let _span = ctx.span.enter();
            if rc.migrate().is_ok() {
                n += 1;
                drop(_span);
                self.service_one(idx, now, mem);
            }
        }
        if n > 0 {
            self.timers_touched = true;
            // an error here is the wire's: the transports see it as loss and retransmit
            let _ = self.wire.flush();
        }
        n
    }

    /// The device's async event queue.
    pub fn async_events(&mut self) -> &mut AsyncQueue {
        &mut self.events
    }

    /// Opens `local` on the wire for a path about to be set (undone by
    /// [`Runtime::close_if_unused`] if the modify then fails).
    pub fn open_local(&mut self, local: WireAddr) -> crate::Result<()> {
        self.wire.open(local)
    }

    /// Sets the cached paths of a QP whose modify succeeded: `primary` with the address
    /// vector, `alt` with `ALT_PATH`; entering Reset forgets the alternate and the old path
    /// (the transport forgets them too). Local addresses no longer used are closed.
    pub fn commit_paths(
        &mut self,
        qpn: u32,
        primary: Option<WirePath>,
        alt: Option<WirePath>,
        reset: bool,
    ) {
        let Some(ctx) = self.get(qpn) else { return };
        let before = ctx.paths;
        if let Some(p) = primary {
            ctx.span.record("peer", tracing::field::display(p.remote));
            ctx.paths.primary = Some(p);
        }
        if alt.is_some() {
            ctx.paths.alt = alt;
        }
        if reset {
            ctx.paths.alt = None;
            ctx.paths.prev = None;
        }
        let after = ctx.paths;
        for l in before.locals().filter(|&l| !after.uses(l)) {
            self.close_if_unused(l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(local: &str, remote: &str, port: u8) -> WirePath {
        WirePath {
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            port,
            tclass: 0,
            sport: 0,
        }
    }

    #[test]
    fn paths_follow_a_migration() {
        let (p1, p2) = (
            path("127.0.9.1", "127.0.9.9", 1),
            path("127.0.9.2", "127.0.9.10", 2),
        );
        let mut ps = Paths {
            primary: Some(p1),
            ..Paths::default()
        };
        assert_eq!(ps.admits(p1.local, p1.remote), Some(1));
        assert_eq!(ps.admits(p2.local, p2.remote), None);
        assert_eq!(ps.admits(p1.local, p2.remote), None, "crossed addresses");
        assert!(!ps.migrated(2), "no alternate cached");
        ps.alt = Some(p2);
        assert_eq!(ps.admits(p2.local, p2.remote), Some(2));
        assert_eq!(ps.for_port(1), Some(&p1));
        assert_eq!(ps.for_port(2), Some(&p2));
        assert!(!ps.migrated(3));
        assert!(ps.migrated(2));
        assert_eq!((ps.primary, ps.alt, ps.prev), (Some(p2), None, Some(p1)));
        assert_eq!(ps.for_port(2), Some(&p2));
        let old = ps.admits(p1.local, p1.remote);
        assert_eq!(old, Some(1), "the old path until the peer follows");
        assert!(ps.uses(p1.local) && ps.uses(p2.local));
        assert_eq!(ps.locals().count(), 2);
        // a port with no path falls back to the primary
        assert_eq!(ps.for_port(7), Some(&p2));
    }
}
