//! The receive path of [`UdpWire`].

use std::os::fd::AsFd;
use std::time::Instant;

use super::UdpWire;
use crate::io::fault::Verdict;
use crate::io::icrc::{self, IcrcCheck, IcrcChecker};
use crate::io::share::Slot;
use crate::io::steer::{self, Dest};
#[cfg(doc)]
use crate::io::DatagramWire;
use crate::io::{Arrival, TxPlacement, WireAddr, WireStats};
use crate::{Error, Result};

/// Why a datagram that reached this wire is another process's.
#[derive(Debug, Clone, Copy)]
enum Misdelivered {
    /// For this slot's QP or comm id.
    Slot(u8),
    /// A REQ or SIDR_REQ for this service, whose listener is another process's.
    Service(u64),
}

impl UdpWire {
    /// [`DatagramWire::recv`]: one `recvmmsg` per open address, round robin (a busy poller's
    /// asks for one datagram after an empty one); drops what
    /// another process's slot owns or fails the ICRC (checked with the datagram's real
    /// source port: peers may send from any).
    pub(super) fn recv_all(&mut self, deliver: &mut dyn FnMut(&Arrival, &[u8])) -> Result<usize> {
        let mut delivered = 0;
        let count = self.locals.len();
        let now = self.recv_faults.as_ref().map(|_| Instant::now());
        let port = self.cfg.port;
        let mut drained = true;
        let mut got = false;
        let busy = self.local.busy;
        for step in 0..count {
            let i = (self.next_recv + step) % count;
            let local = &mut self.locals[i];
            // a busy poller asks for one datagram after an empty receive (a ping-pong's
            // next), else for a batch (a stream's; a woken thread's)
            let max = if local.quiet && busy {
                1
            } else {
                self.cfg.batch
            };
            let n = match self.inbox.recv(local.fd.as_fd(), max) {
                Ok(n) => n,
                // an ICMP error for something we sent: noted, the datagrams wait for the
                // next round
                Err(e)
                    if self
                        .unreachable
                        .on_recv_error(local.fd.as_fd(), local.addr, port, &e) =>
                {
                    drained = false;
                    continue;
                }
                Err(source) => {
                    return Err(Error::Os {
                        op: "recvmmsg",
                        addr: Some(local.addr),
                        source,
                    })
                }
            };
            local.quiet = n == 0;
            if n == 0 {
                continue;
            }
            got = true;
            // a full batch: more may wait (another round now); one asked-for datagram is
            // handed on at once (the next poll asks for a batch)
            if max > 1 && n >= max.min(self.inbox.capacity()) {
                drained = false;
            }
            self.stats.recv_calls += 1;
            let bound = local.addr;
            let mine = self.slot.as_ref().map(Slot::get);
            let mut evidence = None;
            for k in 0..n {
                let Some(d) = self.inbox.get(k) else { break };
                let Some((remote, src_port)) = d.src.filter(|_| !d.truncated) else {
                    self.stats.malformed += 1;
                    crate::ratelimit::warn_limited!(
                        truncated = d.truncated,
                        "malformed datagram dropped"
                    );
                    continue;
                };
                let local_addr = match d.anc.dst {
                    Some(ip) => WireAddr::new(ip, d.anc.ifindex),
                    None => bound,
                };
                let arrival = Arrival {
                    local: local_addr,
                    remote,
                    ifindex: d.anc.ifindex,
                    tclass: d.anc.tclass,
                    hop_limit: d.anc.hop_limit,
                    placement: TxPlacement::Inline,
                };
                // Under UDP GRO one receive holds a run of one flow's datagrams, each
                // `gro_size` long but the last; segment j of a GSO message has IPv4
                // Identification j.
                let whole = d.data;
                if whole.is_empty() {
                    self.stats.malformed += 1;
                    continue;
                }
                for (place, data) in segments(whole, d.anc.gro_size) {
                    // a group's datagram (DQPN 0xFFFFFF) is every member's: the kernel
                    // gave each joined socket its copy (`udp/mcast.rs`)
                    let mine = mine.filter(|_| !bound.ip().is_multicast());
                    // Only a verified packet may be evidence of misdelivery or cost a look
                    // at the other processes' tables and claims: a forged or corrupt one is
                    // dropped as such (its ICRC), whatever it names.
                    let dest = steer::dest(data);
                    let suspect = match (mine, dest) {
                        (Some(mine), Dest::Slot(s) | Dest::Comm(s)) => s != mine,
                        (Some(_), Dest::Service(_)) => true,
                        _ => false,
                    };
                    let mut verified = false;
                    if suspect {
                        if !accept(
                            &mut self.checker,
                            &mut self.stats,
                            port,
                            (&arrival, src_port, place),
                            data,
                        ) {
                            continue;
                        }
                        verified = true;
                        let member = self.locals[i].member.as_ref();
                        let other = match (mine, dest) {
                            (Some(mine), Dest::Slot(s)) if s != mine => Some(Misdelivered::Slot(s)),
                            (Some(mine), Dest::Comm(s)) if s != mine => member
                                .map_or(true, |m| m.has_member(s))
                                .then_some(Misdelivered::Slot(s)),
                            // A REQ whose listener is another process's (the program was
                            // stale: a member came or went): not ours to refuse with REJ 8.
                            (Some(_), Dest::Service(sid)) => member
                                .is_some_and(|m| m.listener_elsewhere(sid))
                                .then_some(Misdelivered::Service(sid)),
                            _ => None,
                        };
                        if let Some(m) = other {
                            self.stats.misdelivered += 1;
                            evidence = Some(m);
                            // its owner's, if it is alive here: over the ring to its wire,
                            // with the netdev it arrived on (the CM's checks read it). A
                            // slot is host-wide: only a live member of this group's (a dead
                            // owner's slot may be another namespace's process now).
                            let owner = match m {
                                Misdelivered::Slot(s) => {
                                    member.is_some_and(|m| m.has_member(s)).then_some(s)
                                }
                                Misdelivered::Service(sid) => {
                                    member.and_then(|m| m.listener_slot(sid))
                                }
                            };
                            let forwarded = owner.is_some_and(|s| {
                                self.local
                                    .wire
                                    .as_mut()
                                    .is_some_and(|l| l.forward(s, &arrival, data))
                            });
                            if forwarded {
                                self.stats.forwarded += 1;
                                tracing::debug!(?m, addr = %bound, "misdelivered datagram forwarded");
                            } else {
                                tracing::debug!(?m, addr = %bound, "misdelivered datagram dropped");
                            }
                            continue;
                        }
                    }
                    let mut inj = (self.recv_faults.as_deref_mut())
                        .filter(|f| f.applies_to(arrival.local.ip()));
                    let times = match (inj.as_deref_mut(), now) {
                        (Some(inj), Some(now)) => {
                            let verdict = inj.judge(data);
                            match verdict {
                                Verdict::Pass => 1,
                                Verdict::Duplicate => 2,
                                Verdict::Drop => 0,
                                Verdict::Hold { .. } => {
                                    if inj.hold(now, data, (arrival, src_port), verdict) {
                                        0
                                    } else {
                                        1
                                    }
                                }
                            }
                        }
                        _ => 1,
                    };
                    if times > 0 {
                        if let Some(inj) = inj {
                            inj.passed();
                        }
                        if !verified
                            && !accept(
                                &mut self.checker,
                                &mut self.stats,
                                port,
                                (&arrival, src_port, place),
                                data,
                            )
                        {
                            continue;
                        }
                    }
                    for _ in 0..times {
                        deliver(&arrival, data);
                        delivered += 1;
                    }
                }
            }
            match evidence {
                Some(Misdelivered::Slot(seen)) => self.evidence(i, seen),
                Some(Misdelivered::Service(sid)) => self.service_evidence(i, sid),
                None => {}
            }
        }
        if let (Some(inj), Some(now)) = (self.recv_faults.as_deref_mut(), now) {
            let (checker, stats) = (&mut self.checker, &mut self.stats);
            inj.release(now, &mut |(arrival, src_port), data| {
                if accept(checker, stats, port, (&arrival, src_port, 0), data) {
                    deliver(&arrival, data);
                    delivered += 1;
                }
            });
        }
        if count > 0 {
            self.next_recv = (self.next_recv + 1) % count;
        }
        self.stats.received += delivered as u64;
        self.drained = drained;
        self.socket_read_done(busy, got);
        if delivered == 0 && !busy {
            // woken for nothing: maybe an ICMP error on a GSI socket (`udp/err.rs`)
            self.unreachable.check(port);
        }
        Ok(delivered)
    }
}

/// The datagrams of one receive with their places: under UDP GRO (`gro_size` > 0) a run of
/// one flow's datagrams, each `gro_size` bytes long but the last (at most that); else the
/// whole receive, at place 0.
fn segments(whole: &mut [u8], gro_size: u16) -> impl Iterator<Item = (u16, &mut [u8])> {
    let seg = match usize::from(gro_size) {
        0 => whole.len().max(1),
        s => s,
    };
    whole
        .chunks_mut(seg)
        .enumerate()
        .map(|(j, d)| (u16::try_from(j).unwrap_or(u16::MAX), d))
}

#[cfg(feature = "fuzzing")]
#[path = "rx_fuzz.rs"]
pub(crate) mod fuzz;

/// Checks the ICRC of a received datagram, counting what it finds; `place` is its position in
/// a UDP GRO receive (0: first or alone).
fn accept(
    checker: &mut IcrcChecker,
    stats: &mut WireStats,
    port: u16,
    (arrival, src_port, place): (&Arrival, u16, u16),
    data: &[u8],
) -> bool {
    let verdict = match icrc::encap(arrival.remote, arrival.local, src_port, port) {
        Some(encap) => checker.check(&encap, data, place),
        None => IcrcCheck::Bad,
    };
    match verdict {
        IcrcCheck::Exact => {}
        IcrcCheck::Place => stats.gro_coalesced += 1,
        IcrcCheck::RecoveredId(_) => stats.icrc_recovered_id += 1,
        IcrcCheck::Implausible(id) => {
            stats.icrc_errors += 1;
            stats.icrc_implausible_id += 1;
            crate::ratelimit::warn_limited!(
                from = %arrival.remote,
                id,
                "datagram dropped: its ICRC holds only for an IPv4 Identification its source \
                 does not send (it sends 0)"
            );
        }
        IcrcCheck::Bad => {
            stats.icrc_errors += 1;
            crate::ratelimit::warn_limited!(from = %arrival.remote, "datagram with a bad ICRC dropped");
        }
    }
    verdict.accepted()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A datagram from `arrival.remote`'s port `sport` to port `port`, sealed for IPv4
    /// Identification `id`.
    fn datagram(arrival: &Arrival, sport: u16, port: u16, id: u16, tag: u8) -> Vec<u8> {
        let mut pkt = vec![tag; 64];
        pkt[0] = 0x04; // RC SEND_ONLY
        let e = icrc::encap(arrival.remote, arrival.local, sport, port).unwrap();
        assert!(icrc::seal(&icrc::with_identification(e, id), &mut pkt));
        pkt
    }

    /// What `accept` counts for each verdict: a large Identification from a source known to
    /// send 0 (exactly what the solver finds in a corrupted datagram) is refused and counted
    /// as an ICRC error and as implausible; places pass.
    #[test]
    fn accept_refuses_and_counts_an_implausible_identification() {
        let (port, sport) = (4791, 49152);
        let addr = |s: &str| WireAddr::new(s.parse().unwrap(), 0);
        let arrival = Arrival {
            local: addr("192.0.2.1"),
            remote: addr("192.0.2.2"),
            ifindex: 0,
            tclass: 0,
            hop_limit: 64,
            placement: TxPlacement::Inline,
        };
        let mut checker = IcrcChecker::new();
        let mut stats = WireStats::default();
        let mut take = |id: u16, place: u16, tag: u8, stats: &mut WireStats| {
            let d = datagram(&arrival, sport, port, id, tag);
            accept(&mut checker, stats, port, (&arrival, sport, place), &d)
        };
        for k in 0..icrc::ZERO_RUN {
            assert!(take(0, 0, k, &mut stats));
        }
        assert_eq!(stats, WireStats::default(), "exact: nothing counted");
        assert!(
            !take(0xbeef, 0, 1, &mut stats),
            "a large Identification is refused"
        );
        assert_eq!((stats.icrc_errors, stats.icrc_implausible_id), (1, 1));
        assert!(
            take(7, 0, 2, &mut stats),
            "a GSO segment received on its own"
        );
        assert!(take(7, 7, 2, &mut stats), "at its GRO place");
        assert!(
            take(9, 7, 2, &mut stats),
            "a GRO receive that began inside a message"
        );
        assert_eq!((stats.icrc_recovered_id, stats.gro_coalesced), (2, 1));
        let mut bad = datagram(&arrival, sport, port, 0, 3);
        bad[30] ^= 0x10;
        assert!(!accept(
            &mut checker,
            &mut stats,
            port,
            (&arrival, sport, 0),
            &bad
        ));
        assert_eq!((stats.icrc_errors, stats.icrc_implausible_id), (2, 1));
        // another source: not known, so its large Identification passes
        let other = Arrival {
            remote: addr("192.0.2.3"),
            ..arrival
        };
        let d = datagram(&other, sport, port, 0xbeef, 4);
        assert!(accept(
            &mut checker,
            &mut stats,
            port,
            (&other, sport, 0),
            &d
        ));
        assert_eq!(stats.icrc_recovered_id, 3);
    }

    /// A busy poller's receive after an empty one asks for one datagram (a batch `recvmmsg`
    /// that gets one tries again before it returns), the next for a batch; a receive that
    /// is not a busy poll always asks for a batch.
    #[test]
    fn a_busy_poller_asks_for_one_datagram_after_an_empty_receive() {
        use crate::io::{DatagramWire, UdpConfig};
        let wire = || {
            let cfg = UdpConfig {
                port: 47932,
                share: false,
                // datagram by datagram (GSO and GRO would make the ten one receive)
                gso: false,
                gro: false,
                ..UdpConfig::default()
            };
            UdpWire::new(cfg).unwrap()
        };
        let (la, lb): (WireAddr, WireAddr) =
            ("127.0.9.5".parse().unwrap(), "127.0.9.6".parse().unwrap());
        let (mut a, mut b) = (wire(), wire());
        a.open(la).unwrap();
        b.open(lb).unwrap();
        let poll = |b: &mut UdpWire, busy: bool| {
            b.busy_poll(busy);
            let n = b.recv(&mut |_, _| {}).unwrap();
            b.busy_poll(false);
            n
        };
        let send = |a: &mut UdpWire, n: usize| {
            for _ in 0..n {
                a.send(la, lb, &[7u8; 60]).unwrap();
            }
            a.flush().unwrap();
            // loopback delivers within the send call
        };
        assert_eq!(poll(&mut b, true), 0);
        send(&mut a, 10);
        assert_eq!(poll(&mut b, true), 1, "after an empty poll: one");
        assert_eq!(poll(&mut b, true), 9, "then a batch");
        assert_eq!(poll(&mut b, true), 0);
        send(&mut a, 10);
        assert_eq!(poll(&mut b, false), 10, "not busy: a batch");
    }
}
