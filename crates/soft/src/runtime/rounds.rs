//! The receive round and the progress loop: what the engine and busy pollers call.

use std::time::Instant;

use rdma_proto::memory::MemoryTable;
use rdma_proto::packet::Placement;
use rdma_wire::packet::IcrcCheck;

use super::{port_in, Runtime, ROUNDS};
use crate::gsi::GSI_QPN;
use crate::pull;
use crate::ratelimit::warn_limited;
use crate::Result;

impl Runtime {
    /// One receive round: delivers what the wire has; returns how many datagrams.
    fn receive<M: MemoryTable + ?Sized>(&mut self, now: u64, mem: &mut M) -> Result<usize> {
        let Runtime {
            wire,
            slots,
            stats,
            gsi,
            ud,
            port_map,
            port_hint,
            sched,
            ..
        } = self;
        let n = wire.recv(&mut |arr, bytes| {
            let port = match *port_hint {
                Some((a, p)) if a == arr.local => p,
                _ => {
                    let p = port_in(port_map, arr.local);
                    *port_hint = Some((arr.local, p));
                    p
                }
            };
            stats.rx_by_port[port as usize] += 1;
            let Ok(mut pkt) = rdma_proto::wire::parse(bytes, IcrcCheck::Skip) else {
                stats.unparsable += 1;
                warn_limited!(from = %arr.remote, len = bytes.len(), "unparsable datagram dropped");
                return;
            };
            // a pulled message (`pull.rs`): the wire resolved where its data is
            let placement = match Placement::decode(arr.placement, pkt.payload) {
                Some(Placement::Pull { source, .. }) if source.len() % pull::RESOLVED != 0 => {
                    stats.unparsable += 1;
                    return;
                }
                Some(p) => p,
                None => {
                    stats.unparsable += 1;
                    warn_limited!(from = %arr.remote, "malformed pulled message dropped");
                    return;
                }
            };
            if placement != Placement::Inline {
                pkt.payload = &[];
            }
            let qpn = pkt.header.bth.dest_qp;
            if qpn == GSI_QPN {
                gsi.deliver(arr, &pkt);
                return;
            }
            let ctx = slots
                .get_mut((qpn & 0xFFFF) as usize)
                .and_then(|s| s.as_deref_mut())
                .filter(|c| c.qpn == qpn);
            match ctx {
                Some(ctx) => {
                    ctx.deliver(now, mem, arr, port, (&pkt, placement), stats);
                    if !ctx.queued {
                        ctx.queued = true;
                        sched.push_work(qpn as u16);
                    }
                }
                None => {
                    if !ud.deliver(now, mem, arr, &pkt, stats) {
                        stats.no_such_qp += 1;
                        warn_limited!(qpn, from = %arr.remote, "packet for an unknown QPN dropped");
                    }
                }
            }
        });
        // nobody listens at a peer address any more (ICMP): for the CM
        while let Some((local, remote)) = wire.take_unreachable() {
            gsi.unreachable(local, remote);
        }
        n
    }

    /// Drives every QP: receive, timers, transmit, completions. Returns the datagrams
    /// received.
    pub fn progress<M: MemoryTable + ?Sized>(&mut self, mem: &mut M) -> Result<usize> {
        let now = self.now();
        self.progress_at(now, mem)
    }

    fn progress_at<M: MemoryTable + ?Sized>(&mut self, now: u64, mem: &mut M) -> Result<usize> {
        self.stats.progress_calls += 1;
        self.last_now = now;
        let mut total = 0;
        // Only QPs with work or a due timer are looked at (`runtime/sched.rs`).
        self.requeue_blocked();
        self.run_due_timers(now);
        for _ in 0..ROUNDS {
            let n = self.receive(now, mem)?;
            total += n;
            let more = self.service_queued(now, mem);
            if self.hold.hold_round() {
                self.stats.acks_held += 1;
            } else {
                self.wire.flush()?;
            }
            // Another round only if a queue gave a full batch (more may be waiting) or a QP
            // has more to send: after a partial batch the next `recvmmsg` would most likely
            // find nothing, and the completions would wait for it.
            if (n == 0 || self.wire.recv_drained()) && !more {
                break;
            }
        }
        if total > 0 || self.wire.next_deadline().is_some() {
            self.timers_touched = true;
        }
        Ok(total)
    }

    /// [`Runtime::progress`] for a caller that busy-polls, in two halves: this one needs no
    /// memory table (a busy poller takes none when nothing came): held ACKs leave, and true
    /// when this poll has nothing to do; else [`Runtime::busy_round`] follows (the wire may
    /// look at its slower sources less often:
    /// [`DatagramWire::busy_poll`](crate::io::DatagramWire::busy_poll)).
    /// `clock` is the caller's reading when it took one for this poll (every
    /// `CLOCK_EVERY`th poll); after a call that received something the clock is
    /// read here; the others reuse the last reading (a few µs old: timers are hundreds of
    /// µs and more, and a packet's time stamps are read fresh after it).
    pub fn busy_idle(&mut self, clock: Option<Instant>) -> Result<bool> {
        // ACKs held by the last poll leave now, whatever this one does.
        if self.hold.take_held() {
            self.wire.flush()?;
        }
        // Nothing arrived and nothing is due: the round (every QP's timers and transmit,
        // the flush) is skipped unless the caller read the clock for this poll; posts
        // transmit themselves, and timers are hundreds of µs and more.
        Ok(clock.is_none() && !self.fresh_clock && self.wire.idle_poll())
    }

    /// The round of a busy poll, after [`Runtime::busy_idle`] said false.
    pub fn busy_round<M: MemoryTable + ?Sized>(
        &mut self,
        mem: &mut M,
        clock: Option<Instant>,
    ) -> Result<usize> {
        self.wire.busy_poll(true);
        self.hold.on = true;
        let now = match clock {
            Some(t) => t.saturating_duration_since(self.epoch).as_nanos() as u64,
            None if self.fresh_clock => self.now(),
            None => self.last_now,
        };
        let r = self.progress_at(now, mem);
        self.hold.on = false;
        self.fresh_clock = r.as_ref().is_ok_and(|&n| n > 0);
        self.wire.busy_poll(false);
        r
    }
}
