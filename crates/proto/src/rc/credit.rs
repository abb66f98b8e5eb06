//! End-to-end credits (IBA Vol. 1 §9.7.7.2): the responder's ACKs say how many receive WQEs
//! it has posted beyond the acknowledged message, and the requester starts no SEND (nor
//! RDMA WRITE with immediate) beyond them, except one at a time when it has none: the one
//! the spec allows, which an RNR NAK may refuse. Without credits, a receiver whose
//! application is descheduled refuses a whole send window with RNR NAKs and the requester
//! resends all of it after the RNR timer (go-back-N); with them, at most that one message.
//!
//! A responder advertises only when switched on ([`RcQp::set_credits`]: not for a QP on a
//! shared receive queue, whose receives are not its own); otherwise its ACKs carry code
//! 0x1f, "invalid", as Linux rxe's always do. A requester honours the count of the latest
//! ACK whose code is valid; an ACK with 0x1f lifts the limit (that peer does not count), and
//! an RNR NAK sets it to none until the next ACK. Before the first ACK there is no limit.
//!
//! An RNR wait lasts the responder's RNR timer (640 µs as the CM sets it) although the
//! receiver usually posts again within microseconds. So a responder that advertises and
//! refused a message with an RNR NAK sends a credit update as soon as a receive is posted:
//! an unsolicited ACK that repeats the last acknowledged PSN and MSN with the new count
//! (the "ghost" ACK Linux's qib and hfi1 requesters take credits from). A requester that
//! gets one with credits while it waits out an RNR timer resends at once. Both sides of
//! Linux rxe are unaffected: it never sends a valid count (0x1f ends no wait), and it drops
//! the duplicate ACK as stale.

use super::RcQp;
use crate::verbs::SendOp;
use rdma_wire::aeth::AethSyndrome;

/// The requester's credit state of one QP.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Credits {
    /// Receives the peer has beyond its latest ACK; `None`: no limit (no ACK yet, or a
    /// peer that sends 0x1f).
    limit: Option<u32>,
    /// Receive-consuming messages started and not yet acknowledged.
    out: u32,
    /// The next message waits for credits (counted once per wait).
    waiting: bool,
}

/// Whether `op` consumes a receive WQE at the responder.
pub(super) fn consumes_receive(op: &SendOp) -> bool {
    matches!(
        op,
        SendOp::Send
            | SendOp::SendWithImm { .. }
            | SendOp::SendWithInv { .. }
            | SendOp::RdmaWriteWithImm { .. }
    )
}

impl Credits {
    /// Whether one more receive-consuming message may start now.
    fn allows(&self) -> bool {
        match self.limit {
            None => true,
            // none outstanding: one may go (the one the spec allows without credits)
            Some(c) => self.out == 0 || self.out < c,
        }
    }

    /// An ACK with `syndrome` arrived (after it retired what it acknowledged).
    pub fn on_ack(&mut self, syndrome: AethSyndrome) {
        self.limit = syndrome.credit_count().map(u32::from);
    }

    /// An RNR NAK: the peer has no receive posted (until its next ACK says otherwise).
    pub fn on_rnr(&mut self) {
        self.limit = Some(0);
    }

    /// A receive-consuming message started.
    pub fn started(&mut self) {
        self.out += 1;
        self.waiting = false;
    }

    /// A receive-consuming message was acknowledged (or flushed).
    pub fn retired(&mut self) {
        self.out = self.out.saturating_sub(1);
    }

    /// The QP went to Err: nothing is outstanding.
    pub fn flushed(&mut self) {
        self.out = 0;
        self.limit = None;
        self.waiting = false;
    }
}

impl RcQp {
    /// Switches the advertising of end-to-end credits in ACKs on or off (off by default:
    /// code 0x1f, "invalid", as Linux rxe sends). Switch it on for a QP with its own
    /// receive queue; a QP on a shared receive queue must not advertise (its receives are
    /// taken one at a time from the SRQ). The requester side always honours a peer's
    /// valid credit counts. See the `credit` module.
    ///
    /// ```
    /// use rdma_proto::rc::{RcConfig, RcQp};
    /// use rdma_proto::verbs::PdId;
    /// let mut qp = RcQp::new(RcConfig::new(0x11, PdId(1)));
    /// assert!(!qp.credits());
    /// qp.set_credits(true);
    /// assert!(qp.credits());
    /// ```
    pub fn set_credits(&mut self, on: bool) {
        self.resp.advertise = on;
    }

    /// Whether ACKs advertise credits ([`RcQp::set_credits`]).
    pub fn credits(&self) -> bool {
        self.resp.advertise
    }

    /// The requester's credit limit: receives the peer had beyond its latest ACK (`None`:
    /// not limited).
    pub fn peer_credits(&self) -> Option<u32> {
        self.credit.limit
    }

    /// After a receive was posted: a responder that refused a message with an RNR NAK
    /// (and advertises credits) sends a credit update, an ACK of the last acknowledged PSN.
    pub(super) fn credit_update_after_rnr(&mut self) {
        if !std::mem::take(&mut self.resp.rnr_owed) || !self.resp.advertise {
            return;
        }
        self.stats.credit_updates_sent += 1;
        self.resp.update_queued = true;
        let last = self.resp.epsn.wrapping_sub(1) & crate::psn::PSN_MASK;
        self.resp.push_ack(last, false);
    }

    /// A duplicate ACK of the last acknowledged PSN (`psn`, one before the oldest
    /// outstanding) with `syndrome`: a credit update. Its count is taken; one with credits
    /// ends an RNR wait, and the refused message goes again now.
    pub(super) fn on_credit_update(&mut self, now: u64, syndrome: AethSyndrome) {
        self.credit.on_ack(syndrome);
        let credits = syndrome.credit_count().unwrap_or(0);
        if credits > 0 && self.rnr_until.take().is_some() {
            self.stats.rnr_waits_cut += 1;
            tracing::debug!(qpn = self.cfg.qpn, credits, "credit update: RNR wait ended");
            self.arm_retrans(now);
        }
    }

    /// Whether the next new message of `op` may start; counts a wait when not. A wait
    /// needs an ACK to end: if the last packet sent did not ask for one, the ACK probe
    /// resends it asking, now (`ack_req.rs`).
    pub(super) fn credit_allows(&mut self, now: u64, op: &SendOp) -> bool {
        if !consumes_receive(op) || self.credit.allows() {
            return true;
        }
        if !self.credit.waiting {
            self.credit.waiting = true;
            self.stats.credit_waits += 1;
            if self.ask.unasked.is_some() {
                self.ask.probe_at = Some(now);
            }
        }
        false
    }

    /// Whether the last packet of a receive-consuming message (`started`: counted already)
    /// uses the last credit while the next work request is one that would wait for more:
    /// it asks for the ACK that brings the next count.
    pub(super) fn credit_closes(&self, op: &SendOp, started: bool) -> bool {
        let Some(c) = self.credit.limit else {
            return false;
        };
        consumes_receive(op)
            && self.credit.out + u32::from(!started) >= c
            && self
                .sq
                .get(self.req_idx + 1)
                .is_some_and(|n| consumes_receive(&n.wr.op))
    }
}
