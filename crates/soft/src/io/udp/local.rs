//! The host-local part of [`UdpWire`] ([`crate::io::local`]): set up on first use, read beside
//! the sockets, looked at less often than the rings while a busy-poller reads them.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use super::UdpWire;
use crate::io::local::{HostLocal, HostPeer};
use crate::io::{share, Arrival, TxMeta, WireAddr};
use crate::{Error, Result};

/// While the rings carry traffic, a busy-polling receive looks at the clock on every
/// `SOCKET_EVERY`th call, and at the sockets and the bell only when `SLOW_EVERY` has
/// passed since it last did, with one `epoll_wait` that reads only what has something (a
/// `recvmmsg` that finds nothing costs more than the packet it would wait for: a fixed
/// call count made it 18% of a ping-pong's time).
const SOCKET_EVERY: u32 = 16;
const SLOW_EVERY: Duration = Duration::from_micros(20);
/// A busy poller whose rings are quiet reads the sockets on every call and the bell on
/// every `BELL_EVERY`th.
const BELL_EVERY: u32 = 64;
/// Calls after the last ring packet during which the rings count as carrying traffic:
/// some 100 µs of empty polls (a peer that takes a few µs to answer must not turn every
/// poll into a socket read; the sockets are still read every `SLOW_EVERY` meanwhile).
const HOT_CALLS: u32 = 4096;

/// The host-local state of a [`UdpWire`].
#[derive(Default)]
pub(super) struct LocalPart {
    pub wire: Option<HostLocal>,
    /// Setting it up failed once (logged): not tried again.
    pub failed: bool,
    /// The caller busy-polls.
    pub busy: bool,
    calls: u32,
    hot: u32,
    /// When a busy poller last read the sockets and the bell.
    slow_at: Option<Instant>,
}

impl UdpWire {
    pub(super) fn local_id(&mut self) -> Option<HostPeer> {
        if let Some(l) = &self.local.wire {
            return Some(l.me());
        }
        if self.local.failed || !self.cfg.host_local || !self.cfg.share || self.cfg.faults.is_some()
        {
            return None;
        }
        let made = self.claim_slot().and_then(|slot| {
            let slot = slot.ok_or(Error::InvalidArgument("not sharing"))?;
            HostLocal::new(slot, share::current_netns(), self.cfg.local_ring)
        });
        let l = match made {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "no host-local wire: every QP stays on UDP");
                self.local.failed = true;
                return None;
            }
        };
        let fd = l.bell_fd();
        let added = crate::fd::epoll_ctl(
            self.epoll.as_fd(),
            libc::EPOLL_CTL_ADD,
            fd,
            libc::EPOLLIN as u32,
            fd as u64,
        );
        if added.is_err() {
            tracing::debug!("no host-local wire: epoll_ctl on its bell failed");
            self.local.failed = true;
            return None;
        }
        let me = l.me();
        let mut l = l;
        l.set_epoll(self.epoll.as_raw_fd());
        self.local.wire = Some(l);
        Some(me)
    }

    pub(super) fn local_connect(&mut self, peer: HostPeer) -> Result<()> {
        let l = self.local.wire.as_mut().ok_or(Error::InvalidArgument(
            "this wire has no host-local channel",
        ))?;
        l.connect(peer).map_err(|source| Error::Os {
            op: "open the host-local ring",
            addr: None,
            source,
        })
    }

    /// [`crate::io::DatagramWire::emit_host`]: `write` fills the ring's room directly.
    pub(super) fn local_emit(
        &mut self,
        peer: HostPeer,
        from: WireAddr,
        to: WireAddr,
        meta: TxMeta,
        max: usize,
        write: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<()> {
        let max = max.min(self.cfg.max_packet);
        let l = self.local.wire.as_mut().ok_or(Error::InvalidArgument(
            "this wire has no host-local channel",
        ))?;
        if l.emit(peer, from, to, meta, max, write) {
            Ok(())
        } else {
            Err(Error::QueueFull("host-local ring"))
        }
    }

    /// [`crate::io::DatagramWire::recv`]: the rings, then (unless a busy-poller skips them this
    /// time) the bell and the sockets.
    pub(super) fn recv_with_local(
        &mut self,
        deliver: &mut dyn FnMut(&Arrival, &[u8]),
    ) -> Result<usize> {
        let p = &mut self.local;
        let Some(l) = p.wire.as_mut() else {
            // a busy poller's reads of empty sockets back off (`udp/backoff.rs`)
            if p.busy && self.socket_read_skipped() {
                self.drained = true;
                return Ok(0);
            }
            return self.recv_all(deliver);
        };
        let (n, full) = l.recv(deliver);
        p.calls = p.calls.wrapping_add(1);
        p.hot = if n > 0 {
            HOT_CALLS
        } else {
            p.hot.saturating_sub(1)
        };
        // a busy poller with hot rings looks at the other sources every SLOW_EVERY; one
        // woken (or driven once) looks each time; a busy poller with quiet rings reads
        // the sockets when its back-off says so and the bell every BELL_EVERY
        let look = if p.busy && p.hot > 0 {
            let due = p.calls % SOCKET_EVERY == 0 && {
                let now = Instant::now();
                let due = p
                    .slow_at
                    .map_or(true, |t| now.duration_since(t) >= SLOW_EVERY);
                if due {
                    p.slow_at = Some(now);
                }
                due
            };
            if !due {
                self.drained = !full;
                return Ok(n);
            }
            true
        } else if !p.busy {
            true
        } else {
            if p.calls % BELL_EVERY == 0 {
                l.drain_bell();
            }
            // quiet rings: the sockets' reads back off (`udp/backoff.rs`); several sockets
            // are looked at by one epoll_wait first
            if self.socket_read_skipped() {
                self.drained = !full;
                return Ok(n);
            }
            self.locals.len() > 1
        };
        if look {
            // one look at which sources have something, not a read of each (the bell's
            // wake-ups come with ring packets)
            let Some(l) = self.local.wire.as_mut() else {
                return Ok(n);
            };
            let (bell, sockets) = ready_sources(self.epoll.as_fd(), l.bell_fd());
            if bell {
                l.drain_bell();
            }
            if !sockets {
                let busy = self.local.busy;
                self.socket_read_done(busy, false);
                self.drained = !full;
                return Ok(n);
            }
        }
        let m = self.recv_all(deliver)?;
        self.drained &= !full;
        Ok(n + m)
    }

    /// [`crate::io::DatagramWire::idle_poll`]: the rings carry traffic, none has a record now,
    /// and the sockets and the bell are not due (they would be read on this call).
    pub(super) fn local_idle_poll(&mut self) -> bool {
        let p = &mut self.local;
        let Some(l) = p.wire.as_ref() else {
            return false;
        };
        if p.hot == 0 || (p.calls.wrapping_add(1)) % SOCKET_EVERY == 0 || l.pending() {
            return false;
        }
        p.calls = p.calls.wrapping_add(1);
        p.hot -= 1;
        true
    }

    /// For [`UdpWire::sockets_idle_poll`]: whether the rings must be looked at on this poll
    /// (one has a record, they carry traffic, or the bell is due).
    pub(super) fn local_ring_due(&self) -> bool {
        let p = &self.local;
        p.wire
            .as_ref()
            .is_some_and(|l| p.hot > 0 || l.pending() || p.calls.wrapping_add(1) % BELL_EVERY == 0)
    }

    /// A poll skipped by [`UdpWire::sockets_idle_poll`] counts as a call.
    pub(super) fn local_count_poll(&mut self) {
        self.local.calls = self.local.calls.wrapping_add(1);
    }

    pub(super) fn local_arm(&mut self) -> bool {
        self.local.wire.as_mut().is_some_and(HostLocal::arm)
    }

    pub(super) fn local_flush(&mut self) {
        if let Some(l) = self.local.wire.as_mut() {
            l.flush();
        }
    }
}

/// Whether the bell (`bell`) and any socket of the wire's epoll set `epoll` are readable
/// now, by one `epoll_wait` that does not block; both when it cannot tell. The rings'
/// eventfds in the set are edge-triggered: this call is what consumes their events.
fn ready_sources(epoll: BorrowedFd<'_>, bell: RawFd) -> (bool, bool) {
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
    let n = match crate::fd::epoll_wait(epoll, &mut evs, 0) {
        Ok(n) if n < evs.len() => n,
        _ => return (true, true),
    };
    let (mut b, mut s) = (false, false);
    for ev in &evs[..n] {
        if ev.u64 == bell as u64 {
            b = true;
        } else if ev.u64 & crate::io::local::EFD_TOKEN == 0 {
            s = true;
        }
        // a ring's eventfd (edge-triggered, never read): the rings are read anyway
    }
    (b, s)
}
