//! The runtime: drives the sans-IO transport of every QP of a device over its datagram wire.
//!
//! Posting a send runs the requester and hands the packets to the wire at once, in the
//! caller's thread ([`Runtime::after_post`]); the process's progress engine
//! ([`crate::engine`]), or a caller polling an empty CQ, calls [`Runtime::progress`], which
//! drains the wire (one `recvmmsg` batch per open address and round), demultiplexes each
//! packet by destination QPN to its QP's transport, runs expired timers, transmits what
//! results (ACKs, READ responses, retransmissions) and moves completions to the CQs.
//!
//! ## Cost per packet
//! The runtime sits behind one mutex per device, taken once per call (per batch of up to
//! [`ROUNDS`] × 32 packets), and takes the memory table's read lock once per round. Per packet
//! it parses headers in place ([`rdma_proto::wire::parse`] borrows the datagram), finds the QP
//! by indexing a slot table with the low 16 bits of the QPN, and emits responses into two
//! buffers allocated when the device opened. Completions go to the lock-free CQ rings; the
//! transport's queues are preallocated at QP creation (rdma-proto's `RcQp` sizes its
//! `VecDeque`s from the queue depths and bounds its response queue). Nothing on this path
//! allocates: `tests/alloc_free.rs` counts heap allocations of a thread posting and polling
//! RC SEND/WRITE (single- and multi-packet), UD SEND and GSI MADs between two devices after
//! a warm-up, and finds none.
//!
//! ## Send window
//! The RC requester puts a whole message in flight when allowed; over UDP a burst larger
//! than the receiver's socket buffer is lost. Every RC QP is therefore created with the
//! transport's send window (`RcConfig::max_outstanding_psns` = [`SEND_WINDOW`], 128 PSNs as
//! in rxe): rdma-proto holds a request packet back while that many request PSNs before it are
//! unacknowledged (a READ counts with the response PSNs it asks for) and asks for an ACK every
//! half window, so the window keeps opening. Responses (ACKs, READ responses) are never held
//! back. The runtime just calls `poll_transmit` until it returns nothing (at most
//! [`TX_BUDGET`] packets per QP and round; a QP with more runs another round) and counts
//! [`RuntimeStats::window_stalls`] when the transport reports `send_window_full`.
//! READ responses have no acknowledgement to pace them: a responder streams a READ as fast
//! as its peer's socket buffer takes it, so applications keep READs in flight to a few MiB
//! (several WRs of at most 1 MiB, `max_rd_atomic` bounding how many).
//!
//! The window's size and the local ACK timeout were chosen by measurement
//! (docs/BENCHMARKS.md, "The send window and the ACK timeout").

use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

use rdma_proto::memory::MemoryTable;
use rdma_proto::packet::Transmit;
use rdma_proto::verbs::QpState;

pub(crate) mod ack_hold;
mod apm;
mod gather;
mod inspect_side;
mod mcast;
mod qp_ctx;
mod rounds;
mod sched;
mod table;
mod ud;
mod verbs_side;
pub(crate) use apm::{Paths, WirePath};
pub(crate) use inspect_side::{RcView, UdView};
pub(crate) use qp_ctx::QpCtx;
pub(crate) use table::add_rc;
pub(crate) use ud::UdCtx;

use crate::gsi::{Gsi, MAD_LEN};
use crate::io::flow::GSI_UDP_SPORT;
use crate::io::{DatagramWire, HostPeer, TxMeta, TxPlacement, WireAddr, WireStats};
use crate::pull;
use crate::queues::AsyncQueue;
use crate::{Error, Result};

/// Most ports a device may have.
pub const MAX_PORTS: usize = 8;

/// Unacknowledged request PSNs an RC QP may have in flight: the transport's send window
/// (`RcConfig::max_outstanding_psns`) every RC QP of the device is created with.
pub const SEND_WINDOW: u32 = 128;
/// Packets one QP transmits per service at most (the rest in the next round).
const TX_BUDGET: u32 = 256;
/// Receive rounds per `Runtime::progress` call at most.
pub const ROUNDS: usize = 8;
/// Largest payload of one packet (MTU 4096).
const MAX_PAYLOAD: usize = 4096;
/// Room for the largest packet: headers, payload, pad, ICRC.
const MAX_PACKET: usize = MAX_PAYLOAD + 128;
/// QP slots (QPN low 16 bits); 0 and 1 are reserved (QP0, QP1).
const SLOTS: usize = 1 << 16;

/// Counters of the runtime (not of the transports or the wire).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Calls of `progress` that ran.
    pub progress_calls: u64,
    /// Packets handed to a QP's transport.
    pub delivered: u64,
    /// Packets transmitted (handed to the wire).
    pub transmitted: u64,
    /// Datagrams that did not parse as a packet this transport handles.
    pub unparsable: u64,
    /// Packets for a QP number that does not exist here.
    pub no_such_qp: u64,
    /// Packets from or to addresses that are none of the QP's paths (primary, alternate,
    /// the one it migrated off last).
    pub wrong_path: u64,
    /// Packets the wire refused to send (the transport sees them as lost).
    pub send_errors: u64,
    /// Completions lost because a CQ was full (the CQ reports it as overflowed).
    pub cq_overflows: u64,
    /// Times a QP stopped transmitting because its send window was full.
    pub window_stalls: u64,
    /// Busy-poll rounds whose ACKs waited for the next send or poll (`runtime/ack_hold.rs`).
    pub acks_held: u64,
    /// Times an RC QP was serviced (transmit, completions): only QPs with work or a due
    /// timer are (`runtime/sched.rs`), so this grows with traffic, not with idle QPs.
    pub qp_services: u64,
    /// Datagrams received per port of the address they arrived on (0: no port's address).
    pub rx_by_port: [u64; MAX_PORTS + 1],
    /// Multicast datagrams a QP that blocks its own loopback did not take (its own sends).
    pub mcast_loopback_blocked: u64,
}

/// Counts a packet handed to the wire (`sent`: whether the wire took it) and tells the ACK
/// hold (`udp`: it went over UDP; the QP's ACK `timeout`).
fn handed_over(
    stats: &mut RuntimeStats,
    hold: &mut ack_hold::AckHold,
    t: &Transmit,
    sent: Result<()>,
    udp: bool,
    timeout: u8,
) {
    tracing::trace!(op = ?t.header.bth.opcode, psn = t.header.bth.psn, len = t.payload_len, "tx");
    match sent {
        Ok(()) => stats.transmitted += 1,
        Err(_) => stats.send_errors += 1,
    }
    hold.emitted(&t.header, udp, timeout);
}

/// Preallocated transmit buffers.
struct TxBufs {
    payload: Box<[u8]>,
    packet: Box<[u8]>,
}

/// The per-device runtime: the wire, the QP table, the clock.
pub(crate) struct Runtime {
    wire: Box<dyn DatagramWire>,
    slots: Vec<Option<Box<QpCtx>>>,
    generation: Vec<u8>,
    live: Vec<u16>,
    free: Vec<u16>,
    next_slot: usize,
    /// The slot handed out last (cyclic QPN allocation continues after it).
    last_slot: usize,
    epoch: Instant,
    tx: TxBufs,
    stats: RuntimeStats,
    gsi: Gsi,
    ud: ud::UdState,
    /// Set by a `progress` that received something, ran timers or gave a QP an earlier
    /// deadline: the earliest deadline may have moved (see [`Runtime::take_timers_touched`]).
    timers_touched: bool,
    /// The device's asynchronous events (`queues/async_event.rs`).
    events: AsyncQueue,
    /// Transport counters of the QPs destroyed so far (device totals for inspection).
    retired: rdma_proto::rc::RcStats,
    /// Every GID of the device's ports, sorted, with its port: which port a datagram
    /// arrived on (replaced when a GID table changes, read per packet without allocating).
    port_map: Vec<(WireAddr, u8)>,
    /// The last arrival address looked up in `port_map` and its port (a run of packets
    /// mostly arrives on one address).
    port_hint: Option<(WireAddr, u8)>,
    /// The clock of the last `progress` (a busy poller reuses it: `busy_round`).
    last_now: u64,
    /// The last busy poll received something: the next reads the clock.
    fresh_clock: bool,
    /// ACKs held back for one busy poll (`runtime/ack_hold.rs`).
    hold: ack_hold::AckHold,
    /// Which QPs a round services, and their timers (`runtime/sched.rs`).
    sched: sched::Sched,
}

impl Runtime {
    pub fn new(mut wire: Box<dyn DatagramWire>) -> Result<Runtime> {
        // no UD QP yet: RC and MADs need no TOS or TTL (`Runtime::ud_insert`)
        wire.set_ip_meta(false);
        Ok(Runtime {
            wire,
            slots: Vec::new(),
            generation: Vec::new(),
            live: Vec::new(),
            free: Vec::new(),
            next_slot: 2,
            last_slot: 1,
            epoch: Instant::now(),
            tx: TxBufs {
                payload: vec![0u8; MAX_PAYLOAD].into_boxed_slice(),
                packet: vec![0u8; MAX_PACKET].into_boxed_slice(),
            },
            stats: RuntimeStats::default(),
            gsi: Gsi::new()?,
            ud: ud::UdState::default(),
            timers_touched: false,
            port_map: Vec::new(),
            port_hint: None,
            last_now: 0,
            fresh_clock: true,
            hold: Default::default(),
            sched: Default::default(),
            events: AsyncQueue::new()?,
            retired: Default::default(),
        })
    }

    pub fn gsi_mut(&mut self) -> &mut Gsi {
        &mut self.gsi
    }

    /// Opens `local` for the GSI (one more user).
    pub fn gsi_open(&mut self, local: WireAddr) -> Result<()> {
        self.wire.open(local)?;
        self.wire.prepare_port(local, GSI_UDP_SPORT);
        self.gsi.add_open(local);
        Ok(())
    }

    /// One GSI user of `local` less; closes the address when no one uses it.
    pub fn gsi_close(&mut self, local: WireAddr) -> bool {
        let was = self.gsi.remove_open(local);
        if was {
            self.close_if_unused(local);
        }
        was
    }

    /// Queues a MAD from QP1 with IPv4 TOS / IPv6 traffic class `tclass` in the wire's batch
    /// (sent by [`Runtime::gsi_flush`], or when the batch fills).
    pub fn gsi_queue(
        &mut self,
        local: WireAddr,
        remote: WireAddr,
        tclass: u8,
        mad: &[u8; MAD_LEN],
    ) -> Result<()> {
        if !self.gsi.is_open(local) {
            return Err(Error::NotOpen { addr: local });
        }
        let h = self.gsi.next_header();
        let n = rdma_proto::wire::emit(&h, mad, &mut self.tx.packet, None)
            .map_err(|_| Error::InvalidArgument("MAD header does not encode"))?;
        self.wire.send_from_port(
            local,
            remote,
            GSI_UDP_SPORT,
            TxMeta {
                tclass,
                ..Default::default()
            },
            &self.tx.packet[..n],
        )?;
        self.gsi.on_sent();
        Ok(())
    }

    /// Sends what [`Runtime::gsi_queue`] queued.
    pub fn gsi_flush(&mut self) -> Result<()> {
        self.wire.flush()
    }

    /// Monotonic nanoseconds since the runtime started.
    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub fn gsi_event_fd(&self) -> std::os::fd::RawFd {
        self.gsi.event_fd()
    }

    pub fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.wire.wait_fd().map(|f| f.as_raw_fd())
    }

    pub fn stats(&self) -> RuntimeStats {
        self.stats
    }

    pub fn share_slot(&mut self) -> Result<Option<u8>> {
        self.wire.share_slot()
    }

    pub fn wire_stats(&self) -> WireStats {
        self.wire.stats()
    }

    /// Opens now, in the caller's network namespace, the socket datagrams from `local` with
    /// UDP source port `sport` leave from (see [`DatagramWire::prepare_port`]).
    pub fn prepare_port(&mut self, local: WireAddr, sport: u16) {
        self.wire.prepare_port(local, sport);
    }

    /// Opens now, in the caller's network namespace, the sockets datagrams of an RC path
    /// from `local` with UDP source port `sport` to `remote` leave from (see
    /// [`DatagramWire::prepare_path`]).
    pub fn prepare_path(&mut self, local: WireAddr, sport: u16, remote: WireAddr) {
        self.wire.prepare_path(local, sport, remote);
    }

    /// Transmits what one QP has to send (its transport holds requests back at the send
    /// window), at most [`TX_BUDGET`] packets, and moves its completions. Returns whether the
    /// budget ran out with more to send.
    fn service<M: MemoryTable + ?Sized>(
        &mut self,
        idx: usize,
        now: u64,
        mem: &mut M,
    ) -> sched::Serviced {
        let Runtime {
            wire,
            slots,
            tx,
            stats,
            events,
            hold,
            ..
        } = self;
        let Some(ctx) = slots.get_mut(idx).and_then(|s| s.as_deref_mut()) else {
            return sched::Serviced::Done;
        };
        stats.qp_services += 1;
        // a migration (forced, by retries, the peer's) changes the path packets leave on
        ctx.drain_events(events);
        let span = ctx.span.enter();
        let mut budget = TX_BUDGET;
        let mut left = sched::Serviced::Done;
        loop {
            // nothing to send: neither the ring's room nor the transport is asked
            if !ctx.rc.may_transmit() {
                break;
            }
            if budget == 0 {
                left = sched::Serviced::More;
                break;
            }
            // a full host-local ring holds the packets back (the peer wakes us with room)
            if ctx.host.is_some_and(|h| !wire.host_ready(h)) {
                left = sched::Serviced::Blocked;
                break;
            }
            // over UDP, the payload goes straight into the datagram's slot; a path the wire
            // refuses takes the way below, where the packet is taken and counted lost
            if let (None, Some(p)) = (ctx.host, ctx.paths.for_port(ctx.rc.port())) {
                match gather::transmit(&mut **wire, &mut ctx.rc, p, (now, &mut *mem), MAX_PACKET) {
                    Ok(Some((t, r))) => {
                        budget -= 1;
                        handed_over(stats, hold, &t, r, true, ctx.rc.ack_timeout());
                        continue;
                    }
                    Ok(None) => break,
                    Err(_) => {}
                }
            }
            let Some(t) = ctx.rc.poll_transmit(now, mem, &mut tx.payload) else {
                break;
            };
            budget -= 1;
            // from the address of the port the transport sends on: its current primary
            let Some(p) = ctx.paths.for_port(t.port) else {
                tracing::trace!(op = ?t.header.bth.opcode, psn = t.header.bth.psn, len = t.payload_len, "tx");
                stats.send_errors += 1;
                continue;
            };
            let meta = TxMeta {
                tclass: p.tclass,
                placement: t.placement,
                ifindex: 0,
            };
            let payload = tx.payload.get(..t.payload_len).unwrap_or(&[]);
            if let (Some(h), TxPlacement::Pull) = (ctx.host, t.placement) {
                // the peer gets the files of the regions it will copy from first
                for piece in pull::pieces(payload).into_iter().flatten() {
                    // SAFETY: the region's memfd, open while the memory table's view (held
                    // for this whole round) keeps the region registered
                    #[allow(unsafe_code)] // the SAFETY comment above
                    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(piece.fd) };
                    wire.host_share(h, piece.token, fd);
                }
            }
            let sent = match ctx.host {
                // straight into the peer's ring: no packet buffer in between
                Some(h) => wire.emit_host(h, p.local, p.remote, meta, MAX_PACKET, &mut |room| {
                    rdma_proto::wire::emit(&t.header, payload, room, None).unwrap_or(0)
                }),
                // UDP packets leave through `gather::transmit` above: here only those of a
                // path the wire refused, lost (the transport retransmits them)
                None => Err(Error::InvalidArgument("the wire refused the QP's path")),
            };
            handed_over(
                stats,
                hold,
                &t,
                sent,
                ctx.host.is_none(),
                ctx.rc.ack_timeout(),
            );
        }
        if left == sched::Serviced::Done && ctx.rc.send_window_full() {
            stats.window_stalls += 1;
        }
        drop(span);
        ctx.drain_completions(stats);
        left
    }

    /// After a post or modify on `qpn`: transmit at once and flush.
    pub fn after_post<M: MemoryTable + ?Sized>(&mut self, qpn: u32, mem: &mut M) -> Result<()> {
        let now = self.now();
        self.after_post_at(qpn, mem, now)
    }

    /// [`Runtime::after_post`] while a busy poller drives the device: its last clock
    /// reading (at most a few polls old, [`Runtime::busy_idle`]) stands for now, so a
    /// post reads no clock.
    pub fn after_post_busy<M: MemoryTable + ?Sized>(
        &mut self,
        qpn: u32,
        mem: &mut M,
    ) -> Result<()> {
        let now = match self.last_now {
            0 => self.now(),
            t => t,
        };
        self.after_post_at(qpn, mem, now)
    }

    fn after_post_at<M: MemoryTable + ?Sized>(
        &mut self,
        qpn: u32,
        mem: &mut M,
        now: u64,
    ) -> Result<()> {
        let idx = (qpn & 0xFFFF) as usize;
        if self.get(qpn).is_some() {
            self.service_one(idx, now, mem);
        }
        self.hold.flushed();
        self.wire.flush()
    }

    /// Replaces the table of which port each local address belongs to.
    pub fn set_port_map(&mut self, map: Vec<(WireAddr, u8)>) {
        self.port_map = map;
        self.port_hint = None;
    }

    /// Whether the wire's batch holds ACKs for the next send or poll (`runtime/ack_hold.rs`):
    /// the caller must make sure the engine runs within [`ack_hold::ENGINE_WITHIN`].
    pub fn acks_held(&self) -> bool {
        self.hold.held()
    }

    /// The caller is about to sleep on the wire's fd ([`DatagramWire::arm_wait`]); true
    /// when something already waits.
    pub fn arm_wait(&mut self) -> bool {
        self.wire.arm_wait()
    }

    /// The device's host-local identity, if its wire has one.
    pub fn host_local(&mut self) -> Option<HostPeer> {
        self.wire.host_local()
    }

    /// Sends QP `qpn`'s packets to `peer` through the host-local wire from now on. An
    /// error leaves the QP on UDP.
    pub fn set_host_peer(&mut self, qpn: u32, peer: HostPeer) -> Result<()> {
        self.wire.host_connect(peer)?;
        let min = self.wire.pull_min();
        let ctx = self.get(qpn).ok_or(Error::InvalidArgument("no such QP"))?;
        ctx.host = Some(peer);
        ctx.rc.set_pull_min(min);
        // the rings lose nothing (a full ring holds packets back): no early retransmission,
        // and no probe timer to wake the engine for it
        ctx.rc.set_early_retransmit(false);
        Ok(())
    }

    /// Whether a `progress` since the last call may have moved the earliest deadline;
    /// clears the flag.
    pub fn take_timers_touched(&mut self) -> bool {
        std::mem::take(&mut self.timers_touched)
    }

    /// The deadline a post on `qpn` may have set: its transport timer, or a packet the
    /// wire holds back (fault injection). O(1): the QP and the wire only.
    pub fn post_deadline(&self, qpn: u32) -> Option<Instant> {
        let qp = self
            .slots
            .get((qpn & 0xFFFF) as usize)
            .and_then(|s| s.as_ref())
            .filter(|c| c.qpn == qpn)
            .and_then(|c| c.rc.poll_timeout())
            .map(|t| self.epoch + Duration::from_nanos(t));
        match (qp, self.wire.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When progress must run next even if nothing arrives: the earliest transport timer or
    /// wire deadline.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        let qp = self
            .next_timer()
            .map(|t| self.epoch + Duration::from_nanos(t));
        match (qp, self.wire.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The state of a QP, for `query`.
    pub fn state(&mut self, qpn: u32) -> Option<QpState> {
        self.get(qpn).map(|c| c.rc.state())
    }
}

/// The remote address of a path's destination GID (IPv4-mapped GIDs become IPv4).
/// The port of `local` in a sorted port table (0: none).
fn port_in(map: &[(WireAddr, u8)], local: WireAddr) -> u8 {
    match map.binary_search_by_key(&local, |e| e.0) {
        Ok(i) => map[i].1,
        Err(_) => 0,
    }
}

pub(crate) fn gid_addr(gid: [u8; 16]) -> WireAddr {
    WireAddr::from(IpAddr::V6(Ipv6Addr::from(gid)))
}

/// The remote address of a path from `local` to destination GID `dgid`: a link-local
/// destination is reached through `local`'s interface, so it takes `local`'s scope. Packets
/// from it arrive with that scope too (the kernel reports the arrival interface), so the
/// QP's path check matches them; without it every packet of a link-local connection was
/// dropped as coming from the wrong path (and the sender ended in RetryExcErr).
pub(crate) fn peer_addr(local: WireAddr, dgid: [u8; 16]) -> WireAddr {
    let remote = gid_addr(dgid);
    if remote.is_link_local() && remote.scope_id() == 0 {
        WireAddr::new(remote.ip(), local.scope_id())
    } else {
        remote
    }
}
