//! Completer: ACKs, NAKs, READ responses and atomic ACKs retire send work requests.

use super::{credit, rnr_timer_ns, RcQp};
use crate::memory::{scatter, MemError, MemoryTable};
use crate::packet::{Packet, Placement};
use crate::psn::{psn_add, psn_diff, PSN_MASK};
use crate::verbs::{Completion, SendFlags, SendOp, WcStatus};
use rdma_wire::aeth::{AethSyndrome, NakCode};
use rdma_wire::opcode::Opcode;

impl RcQp {
    /// A READ response from a peer process on this host that names where the whole READ's
    /// data is (`source`): copied into the WR's scatter list at once. It must be the
    /// READ's first PSN and stand for all of it; a source this side cannot read makes it
    /// ask again (the peer's answer to a repeated READ carries the data).
    fn pulled_read<M: MemoryTable + ?Sized>(
        &mut self,
        now: u64,
        mem: &mut M,
        w: &super::requester::SendWqe,
        (len, psns, source): (u32, u32, &[u8]),
    ) {
        let p = self.comp_psn;
        if p != w.first_psn || len != w.len || psns != w.npkts.max(1) {
            self.fail_front(WcStatus::BadRespErr);
            return;
        }
        let mut skip = 0u64;
        for s in w.wr.sg.as_slice() {
            let n = u64::from(s.length).min(u64::from(len) - skip);
            if n == 0 {
                break;
            }
            match mem.pull_local(self.cfg.pd, s.lkey, s.addr, n, source, skip) {
                Ok(()) => skip += n,
                Err(MemError::Unavailable) => {
                    self.stats.pull_failures += 1;
                    self.retry_from(now, p, false);
                    return;
                }
                Err(_) => {
                    self.fail_front(WcStatus::LocProtErr);
                    return;
                }
            }
        }
        self.stats.pulls_done += 1;
        self.comp_psn = psn_add(p, psns);
        self.complete_front(WcStatus::Success);
        self.on_progress(now);
    }

    /// Retires the oldest WR.
    fn complete_front(&mut self, status: WcStatus) {
        let Some(w) = self.sq.pop_front() else { return };
        if w.started && credit::consumes_receive(&w.wr.op) {
            self.credit.retired();
        }
        if w.wr.op.is_read_or_atomic() {
            self.rd_atomic_inflight = self.rd_atomic_inflight.saturating_sub(1);
        }
        if self.req_idx == 0 {
            self.req_off = 0;
        } else {
            self.req_idx -= 1;
        }
        if status != WcStatus::Success
            || self.cfg.sq_sig_all
            || w.wr.flags.contains(SendFlags::SIGNALED)
        {
            let mut c = Completion::new(w.wr.wr_id, status, w.wr.op.wc_opcode(), self.cfg.qpn);
            c.byte_len = w.len;
            self.send_cq.push_back(c);
        }
    }

    /// Completes SENDs and WRITEs acknowledged through `upto`. Returns (progress, blocked):
    /// blocked when `upto` covers a READ or atomic whose response has not arrived (an
    /// implicit NAK for it).
    fn ack_through(&mut self, upto: u32) -> (bool, bool) {
        let mut progress = false;
        while let Some(w) = self.sq.front() {
            if !w.started || psn_diff(upto, w.first_psn) < 0 {
                break;
            }
            if w.wr.op.is_read_or_atomic() {
                return (progress, true);
            }
            let last = w.last_psn();
            if psn_diff(upto, last) >= 0 {
                self.comp_psn = psn_add(last, 1);
                self.complete_front(WcStatus::Success);
                progress = true;
            } else {
                let np = psn_add(upto, 1);
                if psn_diff(np, self.comp_psn) > 0 {
                    self.comp_psn = np;
                    progress = true;
                }
                break;
            }
        }
        (progress, false)
    }

    fn on_progress(&mut self, now: u64) {
        self.note_acked();
        self.retry_left = self.attr.retry_cnt;
        self.rnr_left = self.attr.rnr_retry;
        self.gbn_guard = None;
        self.arm_retrans(now);
        self.probe_progress(now);
    }

    /// Goes back to `psn` unless a go-back to it is still being resent; `count` charges the
    /// retry counter. The local ACK timer keeps running: it bounds the time without progress.
    fn retry_from(&mut self, now: u64, psn: u32, count: bool) {
        if self.gbn_guard.is_some_and(|(g, _)| g == psn) {
            return;
        }
        if count {
            if self.retry_left == 0 {
                tracing::debug!(
                    qpn = self.cfg.qpn,
                    psn,
                    "retry count exceeded (sequence NAKs)"
                );
                self.enter_error(Some(WcStatus::RetryExcErr));
                return;
            }
            self.retry_left -= 1;
        }
        self.go_back(psn);
        if self.retrans_deadline.is_none() {
            self.arm_retrans(now);
        }
    }

    fn fail_front(&mut self, status: WcStatus) {
        if let Some(w) = self.sq.front_mut() {
            w.error = Some(status);
        }
        self.enter_error(None);
    }

    pub(super) fn handle_response<M: MemoryTable + ?Sized>(
        &mut self,
        now: u64,
        mem: &mut M,
        pkt: &Packet<'_>,
        placement: Placement<'_>,
    ) {
        let h = &pkt.header;
        let p = h.bth.psn;
        if placement != Placement::Inline && h.bth.opcode != Opcode::RcRdmaReadResponseOnly {
            self.stats.dropped += 1;
            return;
        }
        let d = psn_diff(p, self.comp_psn);
        let span = psn_diff(self.next_psn, self.comp_psn);
        if d < 0 || d >= span {
            // stale duplicate or a PSN never sent
            self.stats.dropped += 1;
            let ack = h
                .aeth
                .is_some_and(|a| matches!(a.syndrome, AethSyndrome::Ack { .. }));
            let answer = matches!(
                h.bth.opcode,
                Opcode::RcAcknowledge
                    | Opcode::RcRdmaReadResponseLast
                    | Opcode::RcRdmaReadResponseOnly
            );
            if d < 0 && ack && answer {
                self.probe_stale_ack(now, p);
            }
            // the last acknowledged PSN again with a valid count: a credit update
            if d == -1 && h.bth.opcode == Opcode::RcAcknowledge {
                if let Some(a) = h.aeth.filter(|a| a.syndrome.credit_count().is_some()) {
                    self.on_credit_update(now, a.syndrome);
                }
            }
            return;
        }
        let prev = p.wrapping_sub(1) & PSN_MASK;
        match h.bth.opcode {
            Opcode::RcAcknowledge => {
                let Some(aeth) = h.aeth else { return };
                match aeth.syndrome {
                    AethSyndrome::Ack { .. } => {
                        let (prog, blocked) = self.ack_through(p);
                        self.credit.on_ack(aeth.syndrome);
                        if prog {
                            self.on_progress(now);
                        }
                        if blocked {
                            let c = self.comp_psn;
                            self.retry_from(now, c, false);
                        }
                    }
                    AethSyndrome::RnrNak { timer } => {
                        let code = timer.code();
                        let (prog, _) = self.ack_through(prev);
                        if prog {
                            self.on_progress(now);
                        }
                        self.stats.rnr_naks_received += 1;
                        self.credit.on_rnr();
                        tracing::debug!(
                            qpn = self.cfg.qpn,
                            psn = p,
                            timer_ns = rnr_timer_ns(code),
                            rnr_left = self.rnr_left,
                            "RNR NAK received"
                        );
                        if self.attr.rnr_retry != 7 {
                            if self.rnr_left == 0 {
                                tracing::debug!(qpn = self.cfg.qpn, "RNR retry count exceeded");
                                self.fail_front(WcStatus::RnrRetryExcErr);
                                return;
                            }
                            self.rnr_left -= 1;
                        }
                        self.gbn_guard = None;
                        self.go_back_for(p, true);
                        self.retrans_deadline = None;
                        self.rnr_until = Some(now.saturating_add(rnr_timer_ns(code)));
                    }
                    AethSyndrome::Nak(NakCode::PsnSequenceError) => {
                        let before = self.comp_psn;
                        let (prog, blocked) = self.ack_through(prev);
                        // packets were lost: the progress it makes says nothing of a
                        // probe's need (`rc/probe.rs`)
                        self.probe.loss_seen();
                        if prog {
                            self.on_progress(now);
                        }
                        self.stats.seq_naks_received += 1;
                        tracing::debug!(qpn = self.cfg.qpn, psn = p, "sequence error NAK received");
                        // a NAK beyond an unanswered READ/atomic is also an implicit NAK for it;
                        // only a NAK for our oldest PSN without progress costs a retry
                        let target = if blocked { self.comp_psn } else { p };
                        self.retry_from(now, target, !prog && p == before);
                    }
                    AethSyndrome::Nak(NakCode::Reserved(_)) => self.stats.dropped += 1,
                    AethSyndrome::Nak(code) => {
                        let (prog, _) = self.ack_through(prev);
                        let _ = prog;
                        let status = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            _ => WcStatus::RemOpErr,
                        };
                        tracing::debug!(qpn = self.cfg.qpn, psn = p, ?code, "NAK received");
                        self.fail_front(status);
                    }
                }
            }
            Opcode::RcRdmaReadResponseFirst
            | Opcode::RcRdmaReadResponseMiddle
            | Opcode::RcRdmaReadResponseLast
            | Opcode::RcRdmaReadResponseOnly => {
                let (prog, _) = self.ack_through(prev);
                if prog {
                    self.on_progress(now);
                }
                let Some(w) = self.sq.front().copied() else {
                    return;
                };
                let SendOp::RdmaRead { .. } = w.wr.op else {
                    self.stats.dropped += 1;
                    return;
                };
                if p != self.comp_psn {
                    // a response was lost: re-request from the first missing one
                    let c = self.comp_psn;
                    self.retry_from(now, c, false);
                    return;
                }
                if let Placement::Pull { len, psns, source } = placement {
                    self.pulled_read(now, mem, &w, (len, psns, source));
                    return;
                }
                let mtu = self.attr.path_mtu.bytes();
                let k = psn_diff(p, w.first_psn) as u32;
                let last = k + 1 >= w.npkts;
                let op_ok = match h.bth.opcode {
                    Opcode::RcRdmaReadResponseFirst | Opcode::RcRdmaReadResponseMiddle => !last,
                    _ => last,
                };
                let off = k * mtu;
                let expect = if last { w.len - off.min(w.len) } else { mtu };
                if !op_ok || pkt.payload.len() != expect as usize {
                    self.fail_front(WcStatus::BadRespErr);
                    return;
                }
                if scatter(
                    mem,
                    self.cfg.pd,
                    w.wr.sg.as_slice(),
                    off as u64,
                    pkt.payload,
                )
                .is_err()
                {
                    self.fail_front(WcStatus::LocProtErr);
                    return;
                }
                self.comp_psn = psn_add(p, 1);
                if last {
                    self.complete_front(WcStatus::Success);
                }
                self.on_progress(now);
            }
            Opcode::RcAtomicAcknowledge => {
                let (prog, _) = self.ack_through(prev);
                if prog {
                    self.on_progress(now);
                }
                let Some(w) = self.sq.front().copied() else {
                    return;
                };
                if !w.wr.op.is_atomic() || p != self.comp_psn || w.first_psn != p {
                    self.stats.dropped += 1;
                    return;
                }
                let Some(orig) = h.atomic_ack_eth.map(|a| a.orig_rem_dt) else {
                    return;
                };
                if scatter(mem, self.cfg.pd, w.wr.sg.as_slice(), 0, &orig.to_ne_bytes()).is_err() {
                    self.fail_front(WcStatus::LocProtErr);
                    return;
                }
                self.comp_psn = psn_add(p, 1);
                self.complete_front(WcStatus::Success);
                self.on_progress(now);
            }
            _ => self.stats.dropped += 1,
        }
    }
}
