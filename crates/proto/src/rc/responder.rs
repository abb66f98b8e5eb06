//! Responder: executes incoming requests in PSN order, answers with ACKs, NAKs, READ
//! responses and atomic ACKs, and replays duplicate READs and atomics from its resources.

use super::RcQp;
use crate::memory::{scatter, AtomicOp, MemError, MemKey, MemoryTable, ScatterError};
use crate::packet::{ack, header, Packet, Placement, Transmit};
use crate::psn::{psn_add, psn_diff, PSN_MASK};
use crate::verbs::{AccessFlags, Completion, PostError, RecvWr, WcOpcode, WcStatus};
use rdma_wire::aeth::{AethRepr, AethSyndrome, NakCode, RnrTimer};
use rdma_wire::atomic::AtomicAckEthRepr;
use rdma_wire::opcode::{ExtHeader, Opcode, Position};
use rdma_wire::packet::PacketRepr;
use std::collections::VecDeque;

/// A NAK with `code`.
fn nak(code: NakCode, msn: u32) -> AethRepr {
    AethRepr {
        syndrome: AethSyndrome::Nak(code),
        msn,
    }
}

/// An RNR NAK with the low five bits of `timer` as its timer code.
fn rnr(timer: u8, msn: u32) -> AethRepr {
    let timer = RnrTimer::new(timer & 0x1F).expect("a 5-bit RNR timer code");
    AethRepr {
        syndrome: AethSyndrome::RnrNak { timer },
        msn,
    }
}

/// An RC SEND (First, Middle, Last, Only; with Immediate or Invalidate).
fn is_send(op: Opcode) -> bool {
    use Opcode::*;
    matches!(
        op,
        RcSendFirst
            | RcSendMiddle
            | RcSendLast
            | RcSendLastImm
            | RcSendOnly
            | RcSendOnlyImm
            | RcSendLastInv
            | RcSendOnlyInv
    )
}

/// An RC RDMA WRITE (First, Middle, Last, Only; with Immediate).
fn is_write(op: Opcode) -> bool {
    use Opcode::*;
    matches!(
        op,
        RcRdmaWriteFirst
            | RcRdmaWriteMiddle
            | RcRdmaWriteLast
            | RcRdmaWriteLastImm
            | RcRdmaWriteOnly
            | RcRdmaWriteOnlyImm
    )
}

/// A request that starts a message: First, Only, or a one-packet request (READ request,
/// atomic).
fn starts_message(op: Opcode) -> bool {
    matches!(
        op.position(),
        Position::First | Position::Only | Position::None
    )
}

/// A request that ends a message: Last, Only, or a one-packet request.
fn ends_message(op: Opcode) -> bool {
    matches!(
        op.position(),
        Position::Last | Position::Only | Position::None
    )
}

/// Largest number of packets one READ may span (keeps PSN comparisons unambiguous).
pub(crate) const MAX_READ_PKTS: u32 = 1 << 22;

#[derive(Debug, Clone, Copy)]
enum Cur {
    None,
    Send {
        off: u32,
    },
    Write {
        va: u64,
        rkey: u32,
        remaining: u32,
        total: u32,
    },
}

#[derive(Debug, Clone, Copy)]
struct ReadStream {
    psn: u32,
    va: u64,
    rkey: u32,
    len: u32,
    k: u32,
    npkts: u32,
    msn: u32,
    new: bool,
    /// Resumes an earlier READ past its first packet (a partial re-request): rxe's
    /// requester accepts only MIDDLE and LAST then, never FIRST or ONLY.
    resumed: bool,
}

#[derive(Debug, Clone, Copy)]
enum Out {
    Ack {
        psn: u32,
        aeth: AethRepr,
        /// It answers a duplicate: never merged with the ACK of new packets, so that a
        /// requester sees both (how it finds a probe spurious: `rc/probe.rs`).
        dup: bool,
    },
    Read(ReadStream),
    Atomic {
        psn: u32,
        orig: u64,
        msn: u32,
        new: bool,
    },
}

#[derive(Debug, Clone, Copy)]
enum Replay {
    Read {
        first: u32,
        npkts: u32,
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        psn: u32,
        orig: u64,
    },
}

#[derive(Debug)]
pub(super) struct Responder {
    pub epsn: u32,
    msn: u32,
    rq: VecDeque<RecvWr>,
    cur: Cur,
    nak_seq_sent: bool,
    out: VecDeque<Out>,
    replay: VecDeque<Replay>,
    max_rd: usize,
    new_rd_in_out: usize,
    /// ACKs advertise the receives posted (`RcQp::set_credits`, `credit.rs`).
    pub advertise: bool,
    /// An RNR NAK was sent and no receive posted since: the next post sends a credit
    /// update (`credit.rs`).
    pub rnr_owed: bool,
    /// A credit update was queued by a post (`RcQp::take_credit_update`).
    pub update_queued: bool,
}

impl Responder {
    pub fn new(rq_cap: usize) -> Self {
        Responder {
            epsn: 0,
            msn: 0,
            rq: VecDeque::with_capacity(rq_cap),
            cur: Cur::None,
            nak_seq_sent: false,
            out: VecDeque::with_capacity(16),
            replay: VecDeque::with_capacity(1),
            max_rd: 1,
            new_rd_in_out: 0,
            advertise: false,
            rnr_owed: false,
            update_queued: false,
        }
    }

    /// Whether a response (ACK, NAK, READ or atomic response) waits to be sent.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    pub fn set_max_dest_rd_atomic(&mut self, n: u8) {
        self.max_rd = (n as usize).max(1);
        self.replay = VecDeque::with_capacity(self.max_rd);
        self.out = VecDeque::with_capacity(self.out_cap());
    }

    fn out_cap(&self) -> usize {
        2 * self.max_rd + 8
    }

    pub fn post(&mut self, wr: &RecvWr, cap: usize) -> Result<(), PostError> {
        if self.rq.len() >= cap {
            return Err(PostError::QueueFull);
        }
        self.rq.push_back(*wr);
        Ok(())
    }

    pub fn flush(&mut self, qpn: u32, cq: &mut VecDeque<Completion>) {
        while let Some(r) = self.rq.pop_front() {
            cq.push_back(Completion::new(
                r.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                qpn,
            ));
        }
        self.cur = Cur::None;
        self.replay.clear();
        self.out.retain(|o| matches!(o, Out::Ack { .. }));
        self.new_rd_in_out = 0;
    }

    /// Whether no response is waiting to be sent.
    pub(super) fn idle(&self) -> bool {
        self.out.is_empty()
    }

    /// Queues an ACK of `psn`, merged into a trailing ACK of the same kind (`dup`: it
    /// answers a duplicate request).
    pub(super) fn push_ack(&mut self, psn: u32, dup: bool) {
        let mut aeth = ack(self.msn);
        if self.advertise {
            // the receive a SEND in progress fills is not available
            let filling = usize::from(matches!(self.cur, Cur::Send { .. }));
            aeth.syndrome = AethSyndrome::ack_with_credits(self.rq.len().saturating_sub(filling));
        }
        if let Some(Out::Ack {
            psn: p,
            aeth: a,
            dup: d,
        }) = self.out.back_mut()
        {
            let acks = matches!(a.syndrome, AethSyndrome::Ack { .. })
                && matches!(aeth.syndrome, AethSyndrome::Ack { .. });
            if acks && *d == dup {
                *p = psn;
                *a = aeth;
                return;
            }
        }
        if self.out.len() < self.out_cap() {
            self.out.push_back(Out::Ack { psn, aeth, dup });
        }
    }

    fn push_nak(&mut self, psn: u32, aeth: AethRepr) {
        if self.out.len() < self.out_cap() + 1 {
            self.out.push_back(Out::Ack {
                psn,
                aeth,
                dup: false,
            });
        }
    }

    fn remember(&mut self, r: Replay) {
        if self.replay.len() >= self.max_rd {
            self.replay.pop_front();
        }
        self.replay.push_back(r);
    }
}

impl RcQp {
    /// A fatal responder error: NAK, optional error completion for the receive in use, QP to
    /// Err.
    fn resp_fatal(&mut self, psn: u32, code: NakCode, recv_status: Option<WcStatus>) {
        self.stats.naks_sent += 1;
        tracing::debug!(
            qpn = self.cfg.qpn,
            psn,
            ?code,
            "fatal request error: NAK sent"
        );
        let qpn = self.cfg.qpn;
        if let Some(st) = recv_status {
            if let Some(r) = self.resp.rq.pop_front() {
                self.recv_cq
                    .push_back(Completion::new(r.wr_id, st, WcOpcode::Recv, qpn));
            }
        }
        self.resp.out.retain(|o| matches!(o, Out::Ack { .. }));
        let msn = self.resp.msn;
        self.resp.push_nak(psn, nak(code, msn));
        self.enter_error(None);
    }

    /// A pulled WRITE whose source could not be read: asks for it again (PSN sequence NAK
    /// at the expected PSN), leaving the responder as it was.
    fn pull_failed(&mut self, psn: u32) {
        self.stats.pull_failures += 1;
        tracing::debug!(
            qpn = self.cfg.qpn,
            psn,
            "pulled WRITE unreadable: asked again"
        );
        if !self.resp.nak_seq_sent {
            self.resp.nak_seq_sent = true;
            self.stats.naks_sent += 1;
            let aeth = nak(NakCode::PsnSequenceError, self.resp.msn);
            self.resp.push_nak(psn, aeth);
        }
    }

    /// A pulled SEND: the whole message (`len` bytes, as the pieces in `source` name them)
    /// copied into the receive's scatter list `sg`, each piece with
    /// [`MemoryTable::pull_local`]. Longer than the list: [`ScatterError::TooLong`], nothing
    /// read or written.
    fn scatter_pulled<M: MemoryTable + ?Sized>(
        &mut self,
        mem: &mut M,
        sg: &[crate::verbs::Sge],
        len: u64,
        source: &[u8],
    ) -> Result<(), ScatterError> {
        let room: u64 = sg.iter().map(|s| u64::from(s.length)).sum();
        if len > room {
            return Err(ScatterError::TooLong);
        }
        let mut skip = 0u64;
        for s in sg {
            let n = u64::from(s.length).min(len - skip);
            if n == 0 {
                break;
            }
            mem.pull_local(self.cfg.pd, s.lkey, s.addr, n, source, skip)
                .map_err(ScatterError::Mem)?;
            skip += n;
        }
        self.stats.pulls_done += 1;
        Ok(())
    }

    fn rnr_nak(&mut self, psn: u32) {
        self.stats.naks_sent += 1;
        tracing::debug!(qpn = self.cfg.qpn, psn, "no receive posted: RNR NAK sent");
        let aeth = rnr(self.attr.min_rnr_timer, self.resp.msn);
        self.resp.rnr_owed = self.resp.advertise;
        // replace a trailing RNR NAK for the same PSN rather than queueing another
        if let Some(Out::Ack {
            psn: p, aeth: a, ..
        }) = self.resp.out.back()
        {
            if *p == psn && *a == aeth {
                return;
            }
        }
        self.resp.push_nak(psn, aeth);
    }

    pub(super) fn handle_request<M: MemoryTable + ?Sized>(
        &mut self,
        mem: &mut M,
        pkt: &Packet<'_>,
        placement: Placement<'_>,
    ) {
        let h = &pkt.header;
        let d = psn_diff(h.bth.psn, self.resp.epsn);
        if d > 0 {
            self.stats.dropped += 1;
            if !self.resp.nak_seq_sent {
                self.resp.nak_seq_sent = true;
                self.stats.naks_sent += 1;
                tracing::debug!(
                    qpn = self.cfg.qpn,
                    psn = h.bth.psn,
                    expected = self.resp.epsn,
                    "sequence error: NAK sent"
                );
                let aeth = nak(NakCode::PsnSequenceError, self.resp.msn);
                let e = self.resp.epsn;
                self.resp.push_nak(e, aeth);
            }
            return;
        }
        if d < 0 {
            self.stats.duplicates += 1;
            self.duplicate(mem, h);
            return;
        }
        self.execute(mem, pkt, placement);
    }

    fn duplicate<M: MemoryTable + ?Sized>(&mut self, mem: &M, h: &PacketRepr) {
        let p = h.bth.psn;
        let mtu = self.attr.path_mtu.bytes();
        match h.bth.opcode {
            Opcode::RcRdmaReadRequest => {
                let Some(reth) = h.reth else { return };
                let found = self.resp.replay.iter().find_map(|r| match *r {
                    Replay::Read {
                        first,
                        npkts,
                        va,
                        rkey,
                        len,
                    } => {
                        let k = psn_diff(p, first);
                        (k >= 0 && (k as u32) < npkts).then_some((k as u32, npkts, va, rkey, len))
                    }
                    _ => None,
                });
                let Some((k, npkts, va, rkey, len)) = found else {
                    self.stats.dropped += 1;
                    return;
                };
                let off = k * mtu;
                let end = va.wrapping_add(len as u64);
                if reth.r_key != rkey
                    || reth.va != va.wrapping_add(off as u64)
                    || reth.va.wrapping_add(reth.dma_len as u64) != end
                    || self.resp.out.len() >= self.resp.out_cap()
                    || (reth.dma_len > 0
                        && mem
                            .check(
                                self.cfg.pd,
                                MemKey::Remote(rkey),
                                reth.va,
                                reth.dma_len as u64,
                                AccessFlags::REMOTE_READ,
                            )
                            .is_err())
                {
                    self.stats.dropped += 1;
                    return;
                }
                let s = ReadStream {
                    psn: p,
                    va: reth.va,
                    rkey,
                    len: reth.dma_len,
                    k: 0,
                    npkts: npkts - k,
                    msn: self.resp.msn,
                    new: false,
                    resumed: k > 0,
                };
                self.resp.out.push_back(Out::Read(s));
            }
            Opcode::RcCompareSwap | Opcode::RcFetchAdd => {
                let found = self.resp.replay.iter().find_map(|r| match *r {
                    Replay::Atomic { psn, orig } if psn == p => Some(orig),
                    _ => None,
                });
                match found {
                    Some(orig) if self.resp.out.len() < self.resp.out_cap() => {
                        let msn = self.resp.msn;
                        self.resp.out.push_back(Out::Atomic {
                            psn: p,
                            orig,
                            msn,
                            new: false,
                        });
                    }
                    _ => self.stats.dropped += 1,
                }
            }
            _ => {
                // SEND / WRITE already executed: acknowledge everything received so far
                let last = self.resp.epsn.wrapping_sub(1) & PSN_MASK;
                self.resp.push_ack(last, true);
            }
        }
    }

    fn execute<M: MemoryTable + ?Sized>(
        &mut self,
        mem: &mut M,
        pkt: &Packet<'_>,
        placement: Placement<'_>,
    ) {
        let h = &pkt.header;
        let (op, p) = (h.bth.opcode, h.bth.psn);
        let n = placement.len(pkt.payload).unwrap_or(u32::MAX) as usize;
        let mtu = self.attr.path_mtu.bytes() as usize;
        let pd = self.cfg.pd;
        let qa = self.attr.qp_access_flags;
        // opcode sequence
        let seq_ok = match self.resp.cur {
            Cur::Send { .. } => is_send(op) && !starts_message(op),
            Cur::Write { .. } => is_write(op) && !starts_message(op),
            Cur::None => starts_message(op),
        };
        let access_ok = if is_write(op) {
            qa.contains(AccessFlags::REMOTE_WRITE)
        } else if op == Opcode::RcRdmaReadRequest {
            qa.contains(AccessFlags::REMOTE_READ)
        } else if op.ext_headers().contains(ExtHeader::AtomicEth) {
            qa.contains(AccessFlags::REMOTE_ATOMIC)
        } else {
            true
        };
        // a pulled WRITE or SEND is one packet (Only) standing for the whole message and
        // the PSNs its packets would have taken at this path MTU
        let (len_ok, psns) = match placement {
            Placement::Inline if op.has_payload() => {
                (n <= mtu && (ends_message(op) || n == mtu), 1)
            }
            Placement::Inline => (n == 0, 1),
            Placement::Pull { psns, .. } => {
                let want = (n as u64).div_ceil(mtu as u64).max(1);
                let pullable =
                    is_write(op) || matches!(op, Opcode::RcSendOnly | Opcode::RcSendOnlyImm);
                let ok = pullable
                    && starts_message(op)
                    && ends_message(op)
                    && u64::from(psns) == want
                    && psns < MAX_READ_PKTS;
                (ok, psns)
            }
        };
        if !seq_ok || !access_ok || !len_ok {
            let st = matches!(self.resp.cur, Cur::Send { .. }).then_some(WcStatus::LocQpOpErr);
            self.resp_fatal(p, NakCode::InvalidRequest, st);
            return;
        }
        match op {
            _ if is_send(op) => {
                if starts_message(op) {
                    if self.resp.rq.is_empty() {
                        self.rnr_nak(p);
                        return;
                    }
                    self.resp.cur = Cur::Send { off: 0 };
                }
                let Cur::Send { off } = self.resp.cur else {
                    return;
                };
                let Some(r) = self.resp.rq.front().copied() else {
                    return;
                };
                let scattered = match placement {
                    Placement::Pull { source, .. } => {
                        match self.scatter_pulled(mem, r.sg.as_slice(), n as u64, source) {
                            Err(ScatterError::Mem(MemError::Unavailable)) => {
                                // the sender resends it with its data
                                self.resp.cur = Cur::None;
                                self.pull_failed(p);
                                return;
                            }
                            r => r,
                        }
                    }
                    Placement::Inline => scatter(mem, pd, r.sg.as_slice(), off as u64, pkt.payload),
                };
                match scattered {
                    Ok(()) => {}
                    Err(ScatterError::TooLong) => {
                        self.resp_fatal(p, NakCode::InvalidRequest, Some(WcStatus::LocLenErr));
                        return;
                    }
                    Err(ScatterError::Mem(_)) => {
                        self.resp_fatal(
                            p,
                            NakCode::RemoteOperationalError,
                            Some(WcStatus::LocProtErr),
                        );
                        return;
                    }
                }
                let off = off + n as u32;
                self.resp.cur = Cur::Send { off };
                if ends_message(op) {
                    let mut c =
                        Completion::new(r.wr_id, WcStatus::Success, WcOpcode::Recv, self.cfg.qpn);
                    c.byte_len = off;
                    c.solicited = h.bth.se;
                    if let Some(imm) = h.imm_dt {
                        c = c.with_imm(imm);
                    }
                    if let Some(rkey) = h.ieth {
                        if mem.invalidate_remote(pd, rkey).is_err() {
                            self.resp_fatal(p, NakCode::InvalidRequest, Some(WcStatus::LocProtErr));
                            return;
                        }
                        c = c.with_inv(rkey);
                    }
                    self.resp.rq.pop_front();
                    self.recv_cq.push_back(c);
                    self.resp.msn = (self.resp.msn + 1) & PSN_MASK;
                    self.resp.cur = Cur::None;
                }
                self.advance(p, psns, h.bth.ack_req);
            }
            _ if is_write(op) => {
                if op.has_immediate() && self.resp.rq.is_empty() {
                    self.rnr_nak(p);
                    return;
                }
                let mut pulled = false;
                if starts_message(op) {
                    let Some(r) = h.reth else { return };
                    // a zero-length WRITE checks no key (IBA 9.7.4.1.5)
                    if r.dma_len > 0
                        && mem
                            .check(
                                pd,
                                MemKey::Remote(r.r_key),
                                r.va,
                                r.dma_len as u64,
                                AccessFlags::REMOTE_WRITE,
                            )
                            .is_err()
                    {
                        self.resp_fatal(p, NakCode::RemoteAccessError, None);
                        return;
                    }
                    if let Placement::Pull { source, .. } = placement {
                        if n as u32 != r.dma_len {
                            self.resp_fatal(p, NakCode::InvalidRequest, None);
                            return;
                        }
                        match mem.pull_remote(pd, r.r_key, r.va, r.dma_len as u64, source) {
                            Ok(()) => {
                                pulled = true;
                                self.stats.pulls_done += 1;
                            }
                            Err(MemError::Unavailable) => {
                                // the sender resends it with its data
                                self.pull_failed(p);
                                return;
                            }
                            Err(_) => {
                                self.resp_fatal(p, NakCode::RemoteAccessError, None);
                                return;
                            }
                        }
                    }
                    self.resp.cur = Cur::Write {
                        va: r.va,
                        rkey: r.r_key,
                        remaining: r.dma_len,
                        total: r.dma_len,
                    };
                }
                let Cur::Write {
                    va,
                    rkey,
                    remaining,
                    total,
                } = self.resp.cur
                else {
                    return;
                };
                if n as u32 > remaining || (ends_message(op) && n as u32 != remaining) {
                    self.resp_fatal(p, NakCode::InvalidRequest, None);
                    return;
                }
                // a pulled message's data is in place
                if n > 0
                    && !pulled
                    && mem
                        .write(pd, MemKey::Remote(rkey), va, pkt.payload)
                        .is_err()
                {
                    self.resp_fatal(p, NakCode::RemoteAccessError, None);
                    return;
                }
                self.resp.cur = Cur::Write {
                    va: va.wrapping_add(n as u64),
                    rkey,
                    remaining: remaining - n as u32,
                    total,
                };
                if ends_message(op) {
                    if let Some(imm) = h.imm_dt {
                        if let Some(r) = self.resp.rq.pop_front() {
                            let mut c = Completion::new(
                                r.wr_id,
                                WcStatus::Success,
                                WcOpcode::RecvRdmaWithImm,
                                self.cfg.qpn,
                            )
                            .with_imm(imm);
                            c.byte_len = total;
                            c.solicited = h.bth.se;
                            self.recv_cq.push_back(c);
                        }
                    }
                    self.resp.msn = (self.resp.msn + 1) & PSN_MASK;
                    self.resp.cur = Cur::None;
                }
                self.advance(p, psns, h.bth.ack_req);
            }
            Opcode::RcRdmaReadRequest => {
                let Some(r) = h.reth else { return };
                if self.resp.new_rd_in_out >= self.resp.max_rd {
                    self.resp_fatal(p, NakCode::InvalidRequest, None);
                    return;
                }
                let npkts = r.dma_len.div_ceil(mtu as u32).max(1);
                if npkts >= MAX_READ_PKTS {
                    self.resp_fatal(p, NakCode::InvalidRequest, None);
                    return;
                }
                if r.dma_len > 0
                    && mem
                        .check(
                            pd,
                            MemKey::Remote(r.r_key),
                            r.va,
                            r.dma_len as u64,
                            AccessFlags::REMOTE_READ,
                        )
                        .is_err()
                {
                    self.resp_fatal(p, NakCode::RemoteAccessError, None);
                    return;
                }
                self.resp.msn = (self.resp.msn + 1) & PSN_MASK;
                let s = ReadStream {
                    psn: p,
                    va: r.va,
                    rkey: r.r_key,
                    len: r.dma_len,
                    k: 0,
                    npkts,
                    msn: self.resp.msn,
                    new: true,
                    resumed: false,
                };
                self.resp.out.push_back(Out::Read(s));
                self.resp.new_rd_in_out += 1;
                self.resp.remember(Replay::Read {
                    first: p,
                    npkts,
                    va: r.va,
                    rkey: r.r_key,
                    len: r.dma_len,
                });
                self.advance(p, npkts, false);
            }
            Opcode::RcCompareSwap | Opcode::RcFetchAdd => {
                let Some(a) = h.atomic_eth else { return };
                if self.resp.new_rd_in_out >= self.resp.max_rd || a.va % 8 != 0 {
                    self.resp_fatal(p, NakCode::InvalidRequest, None);
                    return;
                }
                let aop = if op == Opcode::RcCompareSwap {
                    AtomicOp::CmpSwap {
                        compare: a.compare_data,
                        swap: a.swap_add_data,
                    }
                } else {
                    AtomicOp::FetchAdd {
                        add: a.swap_add_data,
                    }
                };
                let orig = match mem.atomic_remote(pd, a.r_key, a.va, aop) {
                    Ok(v) => v,
                    Err(MemError::Misaligned) => {
                        self.resp_fatal(p, NakCode::InvalidRequest, None);
                        return;
                    }
                    Err(_) => {
                        self.resp_fatal(p, NakCode::RemoteAccessError, None);
                        return;
                    }
                };
                self.resp.msn = (self.resp.msn + 1) & PSN_MASK;
                let msn = self.resp.msn;
                self.resp.out.push_back(Out::Atomic {
                    psn: p,
                    orig,
                    msn,
                    new: true,
                });
                self.resp.new_rd_in_out += 1;
                self.resp.remember(Replay::Atomic { psn: p, orig });
                self.advance(p, 1, false);
            }
            _ => self.resp_fatal(p, NakCode::InvalidRequest, None),
        }
    }

    /// The request at `p` took `npkts` PSNs; an ACK (when asked) covers the last.
    fn advance(&mut self, p: u32, npkts: u32, ack: bool) {
        self.resp.epsn = psn_add(p, npkts);
        self.resp.nak_seq_sent = false;
        if ack {
            self.resp.push_ack(psn_add(p, npkts.max(1) - 1), false);
        }
    }

    /// A new READ from a peer process on this host ([`RcQp::set_pull_min`]): one response
    /// (Only) that takes all its PSNs and names where the data is, for the requester to
    /// copy itself ([`MemoryTable::locate`]). `None` (the responses then carry the
    /// data) for any other response, or when the memory is not shareable.
    fn pulled_read_response<M: MemoryTable + ?Sized>(
        &mut self,
        mem: &mut M,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let Some(Out::Read(s)) = self.resp.out.front() else {
            return None;
        };
        let s = *s;
        let long = self.pull_min.is_some_and(|m| s.len >= m.max(1));
        if s.k != 0 || !s.new || s.resumed || !long || buf.len() < 8 {
            return None;
        }
        let n = mem
            .locate(
                self.cfg.pd,
                MemKey::Remote(s.rkey),
                s.va,
                u64::from(s.len),
                &mut buf[8..],
            )
            .ok()?;
        buf[..4].copy_from_slice(&s.len.to_le_bytes());
        buf[4..8].copy_from_slice(&s.npkts.to_le_bytes());
        let mut h = header(Opcode::RcRdmaReadResponseOnly, self.attr.dest_qp_num, s.psn);
        h.aeth = Some(ack(s.msn));
        self.resp.out.pop_front();
        self.resp.new_rd_in_out -= 1;
        self.stats.pulls_sent += 1;
        self.stats.responses_sent += 1;
        Some(Transmit {
            header: h,
            payload_len: 8 + n,
            port: self.attr.port_num,
            placement: crate::packet::TxPlacement::Pull,
        })
    }

    pub(super) fn next_response<M: MemoryTable + ?Sized>(
        &mut self,
        mem: &mut M,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let dqp = self.attr.dest_qp_num;
        let mtu = self.attr.path_mtu.bytes();
        if let Some(t) = self.pulled_read_response(mem, buf) {
            return Some(t);
        }
        let front = self.resp.out.front_mut()?;
        let mut payload_len = 0;
        let h = match front {
            Out::Ack { psn, aeth, .. } => {
                let mut h = header(Opcode::RcAcknowledge, dqp, *psn);
                h.aeth = Some(*aeth);
                self.resp.out.pop_front();
                h
            }
            Out::Atomic {
                psn,
                orig,
                msn,
                new,
            } => {
                let mut h = header(Opcode::RcAtomicAcknowledge, dqp, *psn);
                h.aeth = Some(ack(*msn));
                h.atomic_ack_eth = Some(AtomicAckEthRepr { orig_rem_dt: *orig });
                if *new {
                    self.resp.new_rd_in_out -= 1;
                }
                self.resp.out.pop_front();
                h
            }
            Out::Read(s) => {
                let k = s.k;
                let off = k * mtu;
                let n = (s.len - off.min(s.len)).min(mtu);
                let last = k + 1 >= s.npkts;
                let opcode = match (k == 0 && !s.resumed, last) {
                    (true, true) => Opcode::RcRdmaReadResponseOnly,
                    (true, false) => Opcode::RcRdmaReadResponseFirst,
                    (false, false) => Opcode::RcRdmaReadResponseMiddle,
                    (false, true) => Opcode::RcRdmaReadResponseLast,
                };
                let mut h = header(opcode, dqp, psn_add(s.psn, k));
                if opcode != Opcode::RcRdmaReadResponseMiddle {
                    h.aeth = Some(ack(s.msn));
                }
                let (va, rkey, psn, new) =
                    (s.va.wrapping_add(off as u64), s.rkey, h.bth.psn, s.new);
                s.k += 1;
                if last {
                    self.resp.out.pop_front();
                    if new {
                        self.resp.new_rd_in_out -= 1;
                    }
                }
                if n > 0
                    && mem
                        .read(
                            self.cfg.pd,
                            MemKey::Remote(rkey),
                            va,
                            &mut buf[..n as usize],
                        )
                        .is_err()
                {
                    // the region went away after the request was checked
                    self.resp_fatal(psn, NakCode::RemoteAccessError, None);
                    return self.next_response(mem, buf);
                }
                payload_len = n as usize;
                h
            }
        };
        self.stats.responses_sent += 1;
        Some(Transmit {
            header: h,
            payload_len,
            port: self.attr.port_num,
            placement: crate::packet::TxPlacement::Inline,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::memory::InMemoryTable;
    use crate::packet::{header, Packet};
    use crate::rc::{RcConfig, RcQp};
    use crate::sim::{connect, ConnParams};
    use crate::verbs::{AccessFlags, PdId};
    use rdma_wire::opcode::Opcode;
    use rdma_wire::packet::PacketRepr;
    use rdma_wire::reth::RethRepr;

    fn read_req(psn: u32, va: u64, rkey: u32, len: u32) -> PacketRepr {
        let mut h = header(Opcode::RcRdmaReadRequest, 0x12, psn);
        h.bth.ack_req = true;
        h.reth = Some(RethRepr {
            va,
            r_key: rkey,
            dma_len: len,
        });
        h
    }

    /// A READ re-request for the tail of an earlier READ is answered with MIDDLE/LAST only
    /// (as rxe does; rxe's requester refuses FIRST or ONLY past the READ's first PSN), a
    /// re-request from the first PSN with FIRST/.../LAST (seen in the read-loss capture).
    #[test]
    fn read_rerequest_resumes_with_middle_and_last() {
        let pd = PdId(1);
        let mut mem = InMemoryTable::new(0x1000, 8192);
        let k = mem.register(pd, 0x1000, 4096, AccessFlags::all()).unwrap();
        let mut qp = RcQp::new(RcConfig::new(0x12, pd));
        connect(&mut qp, 0x11, 0, 100, &ConnParams::default());
        let mut buf = [0u8; 4096];
        let mut run = |qp: &mut RcQp, mem: &mut InMemoryTable, h: PacketRepr| {
            qp.handle_packet(
                0,
                mem,
                &Packet {
                    header: h,
                    payload: &[],
                },
            );
            let mut out = Vec::new();
            while let Some(t) = qp.poll_transmit(0, mem, &mut buf) {
                out.push((t.header.bth.opcode, t.header.bth.psn, t.payload_len));
            }
            out
        };
        use Opcode::*;
        let first = run(&mut qp, &mut mem, read_req(100, 0x1000, k.rkey, 3000));
        assert_eq!(
            first,
            vec![
                (RcRdmaReadResponseFirst, 100, 1024),
                (RcRdmaReadResponseMiddle, 101, 1024),
                (RcRdmaReadResponseLast, 102, 952)
            ]
        );
        let tail = run(&mut qp, &mut mem, read_req(101, 0x1400, k.rkey, 1976));
        assert_eq!(
            tail,
            vec![
                (RcRdmaReadResponseMiddle, 101, 1024),
                (RcRdmaReadResponseLast, 102, 952)
            ]
        );
        let last = run(&mut qp, &mut mem, read_req(102, 0x1800, k.rkey, 952));
        assert_eq!(last, vec![(RcRdmaReadResponseLast, 102, 952)]);
        let again = run(&mut qp, &mut mem, read_req(100, 0x1000, k.rkey, 3000));
        assert_eq!(again, first);
    }
}
