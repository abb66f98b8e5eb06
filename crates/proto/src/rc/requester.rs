//! Requester: segmentation of send work requests into packets, PSN assignment, go-back-N and
//! the local ACK timer.

use super::{ack_timeout_ns, RcQp};
use crate::memory::{MemError, MemKey, MemoryTable};
use crate::packet::{header, Transmit, TxPlacement};
use crate::psn::{psn_add, psn_diff};
use crate::verbs::{Completion, PostError, QpState, SendFlags, SendOp, SendWr, WcStatus};
use rdma_wire::atomic::AtomicEthRepr;
use rdma_wire::opcode::Opcode;
use rdma_wire::reth::RethRepr;

/// Rewinds over pulled WRITEs after which a QP stops pulling.
const MAX_PULL_REVERTS: u32 = 8;

/// Ask for an ACK at least every this many packets of a long message.
const ACK_REQ_EVERY: u32 = 64;

/// A posted send work request and its transport state.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    /// Position in the inline ring, if the data was copied at post time.
    pub inline_slot: Option<usize>,
    pub len: u32,
    /// PSNs this WR consumes (READ: one per response packet).
    pub npkts: u32,
    /// First PSN, valid once `started`.
    pub first_psn: u32,
    /// The first packet has been sent at least once.
    pub started: bool,
    /// Status to report if the QP is flushed (the WR that caused the error).
    pub error: Option<WcStatus>,
    /// Whether the responder copies this WRITE or SEND from our memory
    /// ([`RcQp::set_pull_min`]).
    pub pull: Pull,
}

/// How a WRITE or SEND carries its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pull {
    /// Not decided: its first packet has not gone out.
    Undecided,
    /// One packet asked the responder to copy the whole message (and took its PSNs).
    Pulled,
    /// Inline: too short, not a WRITE or SEND, or resent (a resent packet carries its
    /// data).
    Inline,
}

impl SendWqe {
    pub fn last_psn(&self) -> u32 {
        psn_add(self.first_psn, self.npkts.saturating_sub(1))
    }
}

impl RcQp {
    pub(super) fn post_send_impl<M: MemoryTable + ?Sized>(
        &mut self,
        mem: &M,
        wr: &SendWr,
    ) -> Result<(), PostError> {
        match self.state {
            QpState::Rts | QpState::Sqd => {}
            QpState::Err => {
                self.send_cq.push_back(Completion::new(
                    wr.wr_id,
                    WcStatus::WrFlushErr,
                    wr.op.wc_opcode(),
                    self.cfg.qpn,
                ));
                return Ok(());
            }
            s => return Err(PostError::InvalidState(s)),
        }
        let cap = self.cfg.max_send_wr.max(1) as usize;
        if self.sq.len() >= cap {
            return Err(PostError::QueueFull);
        }
        let total = wr.total_len();
        if total > (1u64 << 31) {
            return Err(PostError::InvalidWr("message longer than 2^31 bytes"));
        }
        let len = total as u32;
        if wr.op.is_atomic() && len != 8 {
            return Err(PostError::InvalidWr("atomic needs one 8-byte local buffer"));
        }
        let inline = wr.flags.contains(SendFlags::INLINE);
        if inline && wr.op.is_read_or_atomic() {
            return Err(PostError::InvalidWr("inline READ or atomic"));
        }
        let mtu = self.attr.path_mtu.bytes();
        let npkts = if wr.op.is_atomic() {
            1
        } else {
            len.div_ceil(mtu).max(1)
        };
        if npkts >= super::responder::MAX_READ_PKTS {
            return Err(PostError::InvalidWr(
                "message spans too many packets for the PSN window",
            ));
        }
        let seq = self.next_seq;
        let mut inline_slot = None;
        if inline {
            let max = self.cfg.max_inline_data as usize;
            if len as usize > max {
                return Err(PostError::InvalidWr(
                    "inline data longer than max_inline_data",
                ));
            }
            let slot = (seq % cap as u64) as usize;
            let base = slot * max;
            let mut off = 0usize;
            for s in wr.sg.as_slice() {
                let n = s.length as usize;
                mem.read_inline(
                    self.cfg.pd,
                    s.addr,
                    &mut self.inline_buf[base + off..base + off + n],
                )
                .map_err(|_| PostError::InvalidWr("inline data not readable"))?;
                off += n;
            }
            inline_slot = Some(base);
        }
        self.next_seq += 1;
        self.sq.push_back(SendWqe {
            wr: *wr,
            inline_slot,
            len,
            npkts,
            first_psn: 0,
            started: false,
            error: None,
            pull: Pull::Undecided,
        });
        Ok(())
    }

    /// Copies `out.len()` bytes of the WR's data starting at `off`.
    fn gather<M: MemoryTable + ?Sized>(
        &self,
        mem: &M,
        w: &SendWqe,
        off: u32,
        out: &mut [u8],
    ) -> Result<(), MemError> {
        if let Some(base) = w.inline_slot {
            let s = base + off as usize;
            out.copy_from_slice(&self.inline_buf[s..s + out.len()]);
            return Ok(());
        }
        let mut skip = off as u64;
        let mut done = 0usize;
        for s in w.wr.sg.as_slice() {
            if done == out.len() {
                break;
            }
            let l = s.length as u64;
            if skip >= l {
                skip -= l;
                continue;
            }
            let n = ((l - skip) as usize).min(out.len() - done);
            mem.read(
                self.cfg.pd,
                MemKey::Local(s.lkey),
                s.addr + skip,
                &mut out[done..done + n],
            )?;
            done += n;
            skip = 0;
        }
        Ok(())
    }

    /// Writes the pull payload of a WRITE or SEND (see [`TxPlacement::Pull`]) into `out`: its
    /// length and PSNs, then where each piece of its data is
    /// ([`MemoryTable::locate`]). `Ok(None)` when it does not fit or the memory table
    /// makes no same-host copies of it.
    fn describe<M: MemoryTable + ?Sized>(
        &self,
        mem: &M,
        w: &SendWqe,
        out: &mut [u8],
    ) -> Result<Option<usize>, MemError> {
        if out.len() < 8 {
            return Ok(None);
        }
        out[..4].copy_from_slice(&w.len.to_le_bytes());
        out[4..8].copy_from_slice(&w.npkts.to_le_bytes());
        let mut at = 8;
        for s in w.wr.sg.as_slice().iter().filter(|s| s.length > 0) {
            let len = u64::from(s.length);
            match mem.locate(
                self.cfg.pd,
                MemKey::Local(s.lkey),
                s.addr,
                len,
                &mut out[at..],
            ) {
                Ok(n) => at += n,
                Err(MemError::Unavailable) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(at))
    }

    /// A rewind (go-back-N, ACK probe) resends the WRs from `idx` on with their data.
    pub(super) fn unpull_from(&mut self, idx: usize) {
        let mut reverted = false;
        for w in self.sq.iter_mut().skip(idx) {
            if w.pull == Pull::Pulled {
                w.pull = Pull::Inline;
                reverted = true;
            }
        }
        self.count_revert(reverted);
    }

    /// An RNR rewind to the start of WR `idx`: the responder had no receive, not a source
    /// it could not read, so pulled WRs from `idx` on are decided again (pulled again).
    pub(super) fn repull_from(&mut self, idx: usize) {
        for w in self.sq.iter_mut().skip(idx) {
            if w.pull == Pull::Pulled {
                w.pull = Pull::Undecided;
            }
        }
    }

    fn count_revert(&mut self, reverted: bool) {
        // a responder that keeps failing to pull (the kernel refuses it) gets data
        if reverted && self.pull_min.is_some() {
            self.pull_reverts += 1;
            if self.pull_reverts >= MAX_PULL_REVERTS {
                tracing::debug!(qpn = self.cfg.qpn, "pulled WRITEs resent too often: off");
                self.pull_min = None;
            }
        }
    }

    pub(super) fn arm_retrans(&mut self, now: u64) {
        let outstanding =
            self.sq.front().is_some_and(|w| w.started) && self.comp_psn != self.next_psn;
        self.retrans_deadline = if outstanding && self.rnr_until.is_none() {
            ack_timeout_ns(self.attr.timeout).map(|t| now.saturating_add(t))
        } else {
            None
        };
    }

    /// Restarts transmission at `psn` (which must be in the oldest WR). Returns how many
    /// packets that resends.
    pub(super) fn go_back(&mut self, psn: u32) -> u64 {
        self.go_back_for(psn, false)
    }

    /// [`Self::go_back`]; `rnr`: after an RNR NAK, which keeps pulled WRs pulled when the
    /// rewind starts at the first PSN of one.
    pub(super) fn go_back_for(&mut self, psn: u32, rnr: bool) -> u64 {
        let Some(w) = self.sq.front() else { return 0 };
        if !w.started {
            return 0;
        }
        let d = psn_diff(psn, w.first_psn);
        if d < 0 || d as u32 >= w.npkts {
            return 0;
        }
        // count what is resent: everything from psn to the last PSN sent
        let until = self.current_req_psn();
        let resent = psn_diff(until, psn).max(0) as u64;
        self.stats.retransmitted += resent;
        tracing::debug!(
            qpn = self.cfg.qpn,
            psn,
            packets = resent,
            "retransmitting (go-back-N)"
        );
        self.req_idx = 0;
        self.req_off = d as u32;
        if rnr && d == 0 {
            self.repull_from(0);
        } else {
            self.unpull_from(0);
        }
        // a resend of the probed PSN would be acknowledged twice too
        self.probe.clear_check();
        // ignore further evidence of the same gap until everything in flight was resent
        self.gbn_guard = Some((psn, until));
        resent
    }

    /// Whether the send window lets a request packet with PSN `psn` go out.
    pub(super) fn window_allows(&self, psn: u32) -> bool {
        let cap = self.cfg.max_outstanding_psns;
        cap == 0 || psn_diff(psn, self.comp_psn) < cap.min(1 << 22) as i32
    }

    pub(super) fn current_req_psn(&self) -> u32 {
        match self.sq.get(self.req_idx) {
            Some(w) if w.started => psn_add(w.first_psn, self.req_off),
            _ => self.next_psn,
        }
    }

    pub(super) fn on_retrans_timeout(&mut self, now: u64) {
        self.retrans_deadline = None;
        let outstanding =
            self.sq.front().is_some_and(|w| w.started) && self.comp_psn != self.next_psn;
        if !outstanding || self.state == QpState::Err {
            return;
        }
        self.stats.timeouts += 1;
        tracing::debug!(
            qpn = self.cfg.qpn,
            psn = self.comp_psn,
            retry_left = self.retry_left,
            "local ACK timeout"
        );
        if self.retry_left == 0 {
            if self.retries_exhausted() {
                return;
            }
            tracing::debug!(qpn = self.cfg.qpn, "retry count exceeded (ACK timeouts)");
            self.enter_error(Some(WcStatus::RetryExcErr));
            return;
        }
        self.retry_left -= 1;
        let p = self.comp_psn;
        self.go_back(p);
        self.arm_retrans(now);
    }

    pub(super) fn next_request<M: MemoryTable + ?Sized>(
        &mut self,
        now: u64,
        mem: &mut M,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        if self.state != QpState::Rts && self.state != QpState::Sqd {
            return None;
        }
        if self.rnr_until.is_some() {
            return None;
        }
        let idx = self.req_idx;
        let w = *self.sq.get(idx)?;
        if !w.started {
            if self.state == QpState::Sqd {
                return None;
            }
            if w.wr.flags.contains(SendFlags::FENCE) && self.rd_atomic_inflight > 0 {
                return None;
            }
            if w.wr.op.is_read_or_atomic()
                && self.rd_atomic_inflight >= self.attr.max_rd_atomic.max(1) as u32
            {
                return None;
            }
            if !self.credit_allows(now, &w.wr.op) {
                return None;
            }
        }
        let mtu = self.attr.path_mtu.bytes();
        let first_psn = if w.started {
            w.first_psn
        } else {
            self.next_psn
        };
        let k = self.req_off;
        let psn = psn_add(first_psn, k);
        if !self.window_allows(psn) {
            return None;
        }
        let dqp = self.attr.dest_qp_num;
        let mut h = header(Opcode::RcSendOnly, dqp, psn);
        let mut payload_len = 0usize;
        let mut placement = TxPlacement::Inline;
        let mut psns = 1; // PSNs this packet takes
        let whole; // this packet ends the WR's transmission
        match w.wr.op {
            SendOp::RdmaRead { remote_addr, rkey } => {
                let off = k * mtu;
                h.bth.opcode = Opcode::RcRdmaReadRequest;
                h.reth = Some(RethRepr {
                    va: remote_addr.wrapping_add(off as u64),
                    r_key: rkey,
                    dma_len: w.len - off.min(w.len),
                });
                h.bth.ack_req = true;
                whole = true;
            }
            SendOp::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                h.bth.opcode = Opcode::RcCompareSwap;
                h.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    r_key: rkey,
                    swap_add_data: swap,
                    compare_data: compare,
                });
                h.bth.ack_req = true;
                whole = true;
            }
            SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add,
            } => {
                h.bth.opcode = Opcode::RcFetchAdd;
                h.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    r_key: rkey,
                    swap_add_data: add,
                    compare_data: 0,
                });
                h.bth.ack_req = true;
                whole = true;
            }
            op => {
                let off = k * mtu;
                let n = (w.len - off.min(w.len)).min(mtu);
                let first = k == 0;
                let mut last = k + 1 >= w.npkts;
                if w.pull == Pull::Undecided {
                    // WRITEs and plain SENDs (the responder scatters a pulled SEND)
                    let pullable = matches!(
                        op,
                        SendOp::RdmaWrite { .. }
                            | SendOp::RdmaWriteWithImm { .. }
                            | SendOp::Send
                            | SendOp::SendWithImm { .. }
                    );
                    let long = self.pull_min.is_some_and(|m| w.len >= m.max(1));
                    let mut pull = Pull::Inline;
                    if pullable && long && first && w.inline_slot.is_none() {
                        match self.describe(mem, &w, buf) {
                            Ok(Some(len)) => {
                                // one packet (Only) for the whole message and its PSNs
                                pull = Pull::Pulled;
                                payload_len = len;
                                placement = TxPlacement::Pull;
                                last = true;
                                psns = w.npkts;
                                self.stats.pulls_sent += 1;
                            }
                            Ok(None) => {}
                            Err(_) => {
                                self.sq[idx].error = Some(WcStatus::LocProtErr);
                                self.enter_error(None);
                                return None;
                            }
                        }
                    }
                    self.sq[idx].pull = pull;
                }
                whole = last;
                if placement == TxPlacement::Inline {
                    if let Err(_e) = self.gather(mem, &w, off, &mut buf[..n as usize]) {
                        // local protection error on the gather: this WR fails, the QP goes
                        // to Err
                        self.sq[idx].error = Some(WcStatus::LocProtErr);
                        self.enter_error(None);
                        return None;
                    }
                    payload_len = n as usize;
                }
                use Opcode::*;
                h.bth.opcode = match (op, first, last) {
                    (SendOp::Send, true, true) => RcSendOnly,
                    (SendOp::SendWithImm { .. }, true, true) => RcSendOnlyImm,
                    (SendOp::SendWithInv { .. }, true, true) => RcSendOnlyInv,
                    (SendOp::RdmaWrite { .. }, true, true) => RcRdmaWriteOnly,
                    (SendOp::RdmaWriteWithImm { .. }, true, true) => RcRdmaWriteOnlyImm,
                    (_, true, true) => RcSendOnly,
                    (SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }, true, false) => {
                        RcRdmaWriteFirst
                    }
                    (SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }, false, false) => {
                        RcRdmaWriteMiddle
                    }
                    (SendOp::RdmaWrite { .. }, false, true) => RcRdmaWriteLast,
                    (SendOp::RdmaWriteWithImm { .. }, false, true) => RcRdmaWriteLastImm,
                    (_, true, false) => RcSendFirst,
                    (_, false, false) => RcSendMiddle,
                    (SendOp::SendWithImm { .. }, false, true) => RcSendLastImm,
                    (SendOp::SendWithInv { .. }, false, true) => RcSendLastInv,
                    (_, false, true) => RcSendLast,
                };
                match op {
                    SendOp::RdmaWrite { remote_addr, rkey }
                    | SendOp::RdmaWriteWithImm {
                        remote_addr, rkey, ..
                    } if first => {
                        h.reth = Some(RethRepr {
                            va: remote_addr,
                            r_key: rkey,
                            dma_len: w.len,
                        });
                    }
                    _ => {}
                }
                if last {
                    match op {
                        SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } => {
                            h.imm_dt = Some(imm)
                        }
                        SendOp::SendWithInv { invalidate_rkey } => h.ieth = Some(invalidate_rkey),
                        _ => {}
                    }
                    h.bth.se = w.wr.flags.contains(SendFlags::SOLICITED);
                }
                self.ask.pkts_since += 1;
                // with a send window, ask for ACKs often enough that it keeps opening: every
                // half window, and on the packet that fills it (see `ack_req`)
                let cap = self.cfg.max_outstanding_psns;
                let every = match cap {
                    0 => ACK_REQ_EVERY,
                    c => ACK_REQ_EVERY.min((c / 2).max(1)),
                };
                h.bth.ack_req = self.ask.force
                    || (last && self.last_packet_asks(now, &w))
                    || self.ask.pkts_since >= every
                    || !self.window_allows(psn_add(psn, psns));
            }
        }
        self.note_request(now, psn_add(psn, psns - 1), h.bth.ack_req);
        // commit
        if !w.started {
            let e = &mut self.sq[idx];
            e.started = true;
            e.first_psn = first_psn;
            self.next_psn = psn_add(first_psn, w.npkts);
            if w.wr.op.is_read_or_atomic() {
                self.rd_atomic_inflight += 1;
            }
            if super::credit::consumes_receive(&w.wr.op) {
                self.credit.started();
            }
        }
        if whole {
            self.req_idx += 1;
            self.req_off = 0;
        } else {
            self.req_off += 1;
        }
        self.stats.req_packets_sent += 1;
        if let Some((_, until)) = self.gbn_guard {
            if psn_diff(psn_add(psn, 1), until) >= 0 {
                self.gbn_guard = None;
            }
        }
        if self.retrans_deadline.is_none() {
            self.arm_retrans(now);
        }
        let read = matches!(w.wr.op, SendOp::RdmaRead { .. });
        let end = if read {
            psn_add(first_psn, w.npkts.max(1) - 1)
        } else {
            psn_add(psn, psns - 1)
        };
        self.probe_sent(now, psn, end, h.bth.ack_req, read);
        Some(Transmit {
            header: h,
            payload_len,
            port: self.attr.port_num,
            placement,
        })
    }
}
