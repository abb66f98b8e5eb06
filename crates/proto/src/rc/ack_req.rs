//! When a request packet asks for an acknowledgement (BTH AckReq).
//!
//! A responder acknowledges only the packets that ask (ours and Linux rxe's alike), so each
//! request asking for an ACK costs one more datagram on the wire: in a ping-pong, half of
//! them. The last packet of a message asks when someone waits for it: a signaled work
//! request, half the send queue waiting to retire, or no ACK asked for in an eighth of the
//! local ACK timeout. Inside long messages a packet asks every half send window and every 64
//! packets. A message that did not ask is acknowledged by the next ACK that covers it; if none
//! is asked for within a quarter of the ACK timeout, the requester resends its last packet
//! asking (an ACK probe), so an unsignaled message never waits for the retransmission timer.
//! With an infinite ACK timeout every message asks, as before.

use super::{ack_timeout_ns, RcQp, SendWqe};
use crate::psn::psn_diff;
use crate::verbs::{QpState, SendFlags};

/// The requester's ACK-request bookkeeping.
#[derive(Debug, Default)]
pub(super) struct AckAsk {
    /// Request packets since the last one that asked.
    pub pkts_since: u32,
    /// When a packet last asked.
    last_at: Option<u64>,
    /// The newest PSN sent without asking and not known to be acknowledged.
    pub unasked: Option<u32>,
    /// When to probe for the ACK of `unasked`.
    pub probe_at: Option<u64>,
    /// The next request packet asks (set by a probe).
    pub force: bool,
}

impl RcQp {
    /// Whether the last packet of `w` asks for an ACK.
    pub(super) fn last_packet_asks(&self, now: u64, w: &SendWqe) -> bool {
        let Some(t) = ack_timeout_ns(self.attr.timeout) else {
            return true;
        };
        let half_sq = (self.cfg.max_send_wr.max(1) as usize / 2).max(1);
        self.cfg.sq_sig_all
            || w.wr.flags.contains(SendFlags::SIGNALED)
            || self.gbn_guard.is_some()
            || self.req_idx + 1 >= half_sq
            || self.credit_closes(&w.wr.op, w.started)
            || self
                .ask
                .last_at
                .map_or(true, |a| now.saturating_sub(a) >= t / 8)
    }

    /// Records a request packet `psn` sent, asking for an ACK or not.
    pub(super) fn note_request(&mut self, now: u64, psn: u32, asked: bool) {
        let a = &mut self.ask;
        if asked {
            a.pkts_since = 0;
            a.last_at = Some(now);
            a.force = false;
            if a.unasked.is_some_and(|u| psn_diff(psn, u) >= 0) {
                a.unasked = None;
                a.probe_at = None;
            }
            return;
        }
        if a.unasked.map_or(true, |u| psn_diff(psn, u) > 0) {
            a.unasked = Some(psn);
        }
        if a.probe_at.is_none() {
            a.probe_at = ack_timeout_ns(self.attr.timeout).map(|t| now.saturating_add(t / 4));
        }
    }

    /// An acknowledgement arrived: forgets what it covers.
    pub(super) fn note_acked(&mut self) {
        if self
            .ask
            .unasked
            .is_some_and(|u| psn_diff(self.comp_psn, u) > 0)
        {
            self.ask.unasked = None;
            self.ask.probe_at = None;
        }
    }

    /// The probe timer fired: resends the last packet sent, asking for an ACK.
    pub(super) fn on_ack_probe(&mut self) {
        self.ask.probe_at = None;
        self.note_acked();
        if self.ask.unasked.is_none()
            || !matches!(self.state, QpState::Rts | QpState::Sqd)
            || self.rnr_until.is_some()
        {
            return;
        }
        let Some(psn) = self.rewind_to_last() else {
            return;
        };
        self.probe.clear_check();
        self.stats.ack_probes += 1;
        tracing::debug!(qpn = self.cfg.qpn, psn, "ACK probe");
    }
}
