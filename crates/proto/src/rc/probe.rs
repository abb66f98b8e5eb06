//! Early retransmission: a probe timer fitted to the measured round trip, so a lost tail
//! packet or a lost ACK costs a few milliseconds instead of a whole local ACK timeout.
//!
//! Each QP keeps an RTT estimate (RFC 6298: SRTT and RTTVAR) from request packets that asked
//! for an ACK and were sent once (Karn's rule: no sample once anything was resent). When a
//! packet asking for an ACK leaves, the probe timer is set to
//! `PTO = 2 SRTT + max(4 RTTVAR, PROBE_FLOOR_NS)` (before the fourth sample a
//! conservative eighth of the ACK timeout, doubled once at most), doubled for each probe
//! without progress. When
//! it fires with an asked-for acknowledgement still missing, the requester resends without
//! charging `retry_cnt`: first the last packet it sent, asking for an ACK (a tail-loss probe,
//! as TCP's RACK-TLP: the responder answers a duplicate with an ACK, a gap with a sequence
//! NAK, and takes a lost last packet), then on later probes everything from the oldest
//! unacknowledged PSN (go-back-N; a READ is asked again from its first missing response,
//! an atomic is replayed by the responder). A READ or atomic at the tail is always resent
//! the second way.
//!
//! A probe on a clean link whose peer answered late (its engine not scheduled, or handed
//! to a polling thread, for longer than the floor) is spurious: the original arrived, and
//! the peer acknowledges the probe too, as the duplicate it is ([`super::responder`] answers
//! a duplicate with an ACK of its own, never merged into the ACK of new packets; Linux rxe
//! does the same). So a second ACK of the probed PSN after the one that acknowledged it
//! (like TCP's DSACK) marks the probe spurious: the QP's floor doubles, up to the timeout
//! used before any sample (an eighth of the ACK timeout), and the same late answer draws no
//! probe again. When the probe resent a last packet that had not asked for an ACK (an
//! unsignaled message behind the awaited one), its original draws no ACK of its own: then an
//! ACK of the awaited PSN that comes after the probe and before the probe's own ACK is the
//! late original's, and marks the probe spurious the same way (unless a sequence NAK showed
//! a loss). A READ at the tail is asked again whole; the last response of the responder's
//! replay, arriving after the original's, is that second answer. A tail probe that was needed (no second ACK before the next progress)
//! halves it again, down to [`PROBE_FLOOR_NS`].
//!
//! Resending before the negotiated timeout is allowed: the responder handles duplicates by
//! PSN. The negotiated local ACK timeout is untouched: it restarts only on progress, and
//! `retry_cnt` expiries in a row still end in `RetryExcErr` after the same time. Probes
//! stop once the next one would come after that timer, and never run while an RNR wait is
//! pending or with an infinite ACK timeout. RNR waits are unchanged: a lost RNR NAK is
//! answered by the probe's resend (another RNR NAK, charged to `rnr_retry` as the resend
//! after a timeout was), a lost resend after the wait by the next probe.

use super::{ack_timeout_ns, RcQp};
use crate::psn::{psn_add, psn_diff};
use crate::verbs::QpState;

/// The smallest probe timeout in ns, whatever the measured round trip: above the scheduling
/// hiccups of a loaded host and the few milliseconds a peer's ACK may wait (`rdma-soft`'s ACK
/// hold, an engine that left the device to a polling thread: 2-4 ms seen on a loaded 2-core
/// host, where a 2 ms floor fired in 2 of 5 clean rping runs), so a clean link sees (almost)
/// no early retransmission. A resend on such a delay makes the late ACK ambiguous, so the
/// round trip estimate cannot learn it (Karn's rule): the floor must cover it. See
/// `docs/BENCHMARKS.md`, "Loss recovered by probes".
pub const PROBE_FLOOR_NS: u64 = 5_000_000;

/// Round-trip samples before the probe timer follows the estimate: until then it waits the
/// conservative pre-sample timeout. One or two samples of a jittery link say little about
/// its spread (RFC 6298's RTTVAR starts at half the first sample): a first round trip of
/// 2 ms on a link of 2 to 16 ms gave a 9 ms probe timeout and a spurious probe.
const MIN_SAMPLES: u32 = 4;

/// Doublings of the probe timeout without progress, at most.
const MAX_BACKOFF: u32 = 8;

/// Doublings of the pre-sample probe timeout (ACK timeout/8) without progress, at most: it
/// then probes at 1/8, 3/8, 5/8 and 7/8 of the ACK timeout.
const PRE_SAMPLE_BACKOFF: u32 = 1;

/// A tail probe waiting for its verdict: resent `psn`; `acked` once progress covered it;
/// `awaited`: the newest PSN whose ACK was asked for then (before `psn` when the last
/// packet sent did not ask: its original draws no ACK of its own).
#[derive(Debug, Clone, Copy)]
struct Check {
    psn: u32,
    awaited: u32,
    acked: bool,
}

/// The RTT estimate and the probe timer of one requester.
#[derive(Debug, Default)]
pub(super) struct Probe {
    /// Smoothed round trip in ns (`None`: no sample yet).
    srtt: Option<u64>,
    /// Round-trip variation in ns.
    rttvar: u64,
    /// Samples taken since the path was set (counted up to [`MIN_SAMPLES`]).
    samples: u32,
    /// The packet being timed: the PSN its acknowledgement covers, and when it left.
    timed: Option<(u32, u64)>,
    /// One past the highest request PSN sent: a packet before it is a resend.
    sent_high: u32,
    /// The newest PSN whose acknowledgement was asked for and has not come.
    awaited: Option<u32>,
    /// When the probe timer fires.
    pub at: Option<u64>,
    /// Probes since the last progress.
    backoff: u32,
    /// Early retransmission switched off ([`RcQp::set_early_retransmit`]).
    off: bool,
    /// This QP's floor in ns (0: [`PROBE_FLOOR_NS`]): raised by spurious probes.
    floor: u64,
    /// The last tail probe, until it is known spurious or needed.
    check: Option<Check>,
}

impl Probe {
    /// A fresh requester starting at `psn`.
    pub fn start(&mut self, psn: u32) {
        *self = Probe {
            sent_high: psn,
            off: self.off,
            ..Probe::default()
        };
    }

    /// Forgets the round trip (a new path).
    pub fn new_path(&mut self) {
        self.srtt = None;
        self.rttvar = 0;
        self.samples = 0;
        self.timed = None;
    }

    /// The smoothed round trip, once measured.
    pub fn srtt(&self) -> Option<u64> {
        self.srtt
    }

    fn sample(&mut self, r: u64) {
        self.samples = (self.samples + 1).min(MIN_SAMPLES);
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                self.rttvar = (3 * self.rttvar + s.abs_diff(r)) / 4;
                self.srtt = Some((7 * s + r) / 8);
            }
        }
    }

    /// This QP's floor (ns).
    fn floor(&self) -> u64 {
        self.floor.max(PROBE_FLOOR_NS)
    }

    /// The probe timeout for an ACK timeout of `ack_ns`, backoff included. Before
    /// [`MIN_SAMPLES`] the conservative ACK timeout/8 doubles once at most: doubled without
    /// bound it met the ACK timeout after three probes, and a tail whose three probes were
    /// lost waited for it; never doubled, a dead peer drew seven probes per ACK timeout.
    fn pto(&self, ack_ns: u64) -> u64 {
        match self.srtt.filter(|_| self.samples >= MIN_SAMPLES) {
            Some(s) => (2 * s + (4 * self.rttvar).max(self.floor()))
                .saturating_mul(1 << self.backoff.min(MAX_BACKOFF)),
            None => (ack_ns / 8)
                .max(self.floor())
                .saturating_mul(1 << self.backoff.min(PRE_SAMPLE_BACKOFF)),
        }
    }

    /// Forgets the last tail probe's verdict (its PSN is being resent otherwise).
    pub fn clear_check(&mut self) {
        self.check = None;
    }

    /// A sequence NAK came: packets were lost, so a partial ACK after the last tail probe
    /// is no sign that it was spurious (only a second ACK of the probed PSN is).
    pub fn loss_seen(&mut self) {
        if let Some(k) = self.check.as_mut() {
            k.awaited = k.psn;
        }
    }

    /// The last tail probe was needed: the floor halves (down to [`PROBE_FLOOR_NS`]).
    fn needed(&mut self) {
        self.check = None;
        self.floor = (self.floor() / 2).max(PROBE_FLOOR_NS);
    }
}

impl RcQp {
    /// The smoothed round trip the probe timer is fitted to (ns), once measured.
    ///
    /// ```
    /// use rdma_proto::rc::{RcConfig, RcQp};
    /// use rdma_proto::verbs::PdId;
    /// assert_eq!(RcQp::new(RcConfig::new(0x11, PdId(1))).srtt_ns(), None);
    /// ```
    pub fn srtt_ns(&self) -> Option<u64> {
        self.probe.srtt()
    }

    /// Switches early retransmission on (the default) or off. Off, only the local ACK timer
    /// resends what was lost, as Linux rxe does (a test comparing our packets with a Linux
    /// capture needs that); the round trip is still measured.
    ///
    /// ```
    /// use rdma_proto::rc::{RcConfig, RcQp};
    /// use rdma_proto::verbs::PdId;
    /// let mut qp = RcQp::new(RcConfig::new(0x11, PdId(1)));
    /// assert!(qp.early_retransmit());
    /// qp.set_early_retransmit(false);
    /// assert!(!qp.early_retransmit());
    /// ```
    pub fn set_early_retransmit(&mut self, on: bool) {
        self.probe.off = !on;
        if !on {
            self.probe.at = None;
        }
    }

    /// Whether early retransmission is on ([`RcQp::set_early_retransmit`]).
    pub fn early_retransmit(&self) -> bool {
        !self.probe.off
    }

    /// This QP's probe floor in ns: [`PROBE_FLOOR_NS`], raised by spurious probes (see the
    /// module docs of `rc::probe`).
    ///
    /// ```
    /// use rdma_proto::rc::{RcConfig, RcQp, PROBE_FLOOR_NS};
    /// use rdma_proto::verbs::PdId;
    /// assert_eq!(RcQp::new(RcConfig::new(0x11, PdId(1))).probe_floor_ns(), PROBE_FLOOR_NS);
    /// ```
    pub fn probe_floor_ns(&self) -> u64 {
        self.probe.floor()
    }

    /// Arms the probe timer `now` plus the probe timeout, unless the local ACK timer would
    /// come first (or is infinite).
    fn arm_probe(&mut self, now: u64) {
        let Some(ack_ns) = ack_timeout_ns(self.attr.timeout).filter(|_| !self.probe.off) else {
            self.probe.at = None;
            return;
        };
        let at = now.saturating_add(self.probe.pto(ack_ns));
        let before_timeout = match self.retrans_deadline {
            Some(d) => at < d,
            None => at < now.saturating_add(ack_ns),
        };
        self.probe.at = before_timeout.then_some(at);
    }

    /// Records a request packet sent: `psn` its PSN, `end` the last PSN its answer covers (a
    /// READ's last response), `asked` whether it asks for an ACK, `read` whether it is a
    /// READ request (timed to its first response).
    pub(super) fn probe_sent(&mut self, now: u64, psn: u32, end: u32, asked: bool, read: bool) {
        let p = &mut self.probe;
        if psn_diff(psn, p.sent_high) >= 0 {
            p.sent_high = psn_add(end, 1);
            if asked && p.timed.is_none() {
                p.timed = Some((if read { psn } else { end }, now));
            }
        } else {
            // Karn: an answer may now be to either copy
            p.timed = None;
        }
        if asked {
            if p.awaited.map_or(true, |a| psn_diff(end, a) > 0) {
                p.awaited = Some(end);
            }
            self.arm_probe(now);
        }
    }

    /// The oldest unacknowledged PSN moved forward: takes the RTT sample it completes,
    /// resets the backoff and restarts the probe timer if an asked-for ACK is still missing.
    pub(super) fn probe_progress(&mut self, now: u64) {
        let c = self.comp_psn;
        let p = &mut self.probe;
        if let Some((psn, at)) = p.timed {
            if psn_diff(c, psn) > 0 {
                p.timed = None;
                p.sample(now.saturating_sub(at));
            }
        }
        p.backoff = 0;
        let mut spurious = None;
        if let Some(k) = p.check {
            if k.acked {
                // past the probed PSN, and no second ACK of it came: it was lost
                p.needed();
            } else if psn_diff(c, k.psn) > 0 {
                p.check = Some(Check { acked: true, ..k });
            } else if psn_diff(c, k.awaited) > 0 {
                // the awaited PSN acknowledged, the probed one (which did not ask) not: an
                // ACK of the original (the probe's would cover the probed PSN)
                spurious = Some(k.psn);
            }
        }
        if p.awaited.is_some_and(|a| psn_diff(c, a) > 0) {
            p.awaited = None;
        }
        if p.awaited.is_some() {
            self.arm_probe(now);
        } else {
            p.at = None;
        }
        if let Some(psn) = spurious {
            self.probe_spurious(now, psn);
        }
    }

    /// The probe timer fired: resends early (see the module docs).
    pub(super) fn on_probe(&mut self, now: u64) {
        self.probe.at = None;
        let c = self.comp_psn;
        if self.probe.awaited.is_some_and(|a| psn_diff(c, a) > 0) {
            self.probe.awaited = None;
        }
        let outstanding = self.sq.front().is_some_and(|w| w.started) && c != self.next_psn;
        if self.probe.awaited.is_none()
            || !outstanding
            || !matches!(self.state, QpState::Rts | QpState::Sqd)
            || self.rnr_until.is_some()
        {
            return;
        }
        self.probe.timed = None;
        let first = self.probe.backoff == 0;
        self.probe.backoff += 1;
        self.stats.tail_probes += 1;
        if self.probe.check.is_some_and(|k| k.acked) {
            self.probe.needed();
        }
        // a later probe of the same wait keeps the first one's check: the peer answers the
        // resends as duplicates too if the original arrived
        let keep = self.probe.check.take();
        if first {
            let awaited = self.probe.awaited;
            if let Some(psn) = self.rewind_to_last() {
                self.probe.check = Some(Check {
                    psn,
                    awaited: awaited.unwrap_or(psn),
                    acked: false,
                });
                self.stats.retransmitted += 1;
                self.stats.early_retransmits += 1;
                tracing::debug!(
                    qpn = self.cfg.qpn,
                    psn,
                    srtt_us = self.probe.srtt.map(|s| s / 1000),
                    rttvar_us = self.probe.rttvar / 1000,
                    "probe: last packet resent"
                );
                self.arm_probe(now);
                return;
            }
        }
        tracing::debug!(
            qpn = self.cfg.qpn,
            psn = c,
            backoff = self.probe.backoff,
            srtt_us = self.probe.srtt.map(|s| s / 1000),
            "probe: go-back-N"
        );
        // a READ at the tail is asked again whole: its last response coming twice (the
        // original's, then the replay's) marks the probe spurious as a second ACK does
        let read_end = if first {
            self.last_sent_read_end()
        } else {
            None
        };
        self.stats.early_retransmits += self.go_back(c);
        self.probe.check = match read_end {
            Some(psn) => Some(Check {
                psn,
                awaited: psn,
                acked: false,
            }),
            None => keep,
        };
        // the resend arms the timer again when it leaves; this covers a resend that cannot
        // leave at once (send window, READ credits)
        self.arm_probe(now);
    }

    /// An ACK of `psn` (or a READ's last response) that acknowledged nothing new (a stale
    /// duplicate) arrived: if it is the second ACK of the last tail probe's PSN, the probe
    /// was spurious (module docs).
    pub(super) fn probe_stale_ack(&mut self, now: u64, psn: u32) {
        if !self.probe.check.is_some_and(|k| k.acked && k.psn == psn) {
            return;
        }
        self.probe_spurious(now, psn);
    }

    /// The last tail probe (of `psn`) was spurious: the floor doubles (module docs).
    fn probe_spurious(&mut self, now: u64, psn: u32) {
        let p = &mut self.probe;
        p.check = None;
        let cap = ack_timeout_ns(self.attr.timeout).map_or(PROBE_FLOOR_NS, |a| a / 8);
        p.floor = p.floor().saturating_mul(2).min(cap).max(PROBE_FLOOR_NS);
        self.stats.spurious_probes += 1;
        tracing::debug!(
            qpn = self.cfg.qpn,
            psn,
            floor_us = p.floor / 1000,
            "probe: spurious (the original was acknowledged), floor raised"
        );
        // a probe armed meanwhile (a request sent since) waits the raised floor too
        if self.probe.at.is_some() {
            self.arm_probe(now);
        }
    }

    /// The PSN of the last response of the last request sent, if that is a READ.
    fn last_sent_read_end(&self) -> Option<u32> {
        let idx = if self.req_off > 0 {
            self.req_idx
        } else {
            self.req_idx.checked_sub(1)?
        };
        let w = self.sq.get(idx)?;
        let read = matches!(w.wr.op, crate::verbs::SendOp::RdmaRead { .. });
        (w.started && read).then(|| w.last_psn())
    }

    /// Rewinds to the last request packet sent, to go again asking for an ACK, if it is a
    /// SEND or WRITE packet (a pulled WRITE goes with its data). Returns its PSN.
    pub(super) fn rewind_to_last(&mut self) -> Option<u32> {
        let (idx, off) = if self.req_off > 0 {
            (self.req_idx, self.req_off - 1)
        } else if self.req_idx > 0 {
            (self.req_idx - 1, self.sq[self.req_idx - 1].npkts.max(1) - 1)
        } else {
            return None;
        };
        let w = &self.sq[idx];
        if !w.started || w.wr.op.is_read_or_atomic() {
            return None;
        }
        let psn = psn_add(w.first_psn, off);
        self.req_idx = idx;
        self.req_off = off;
        self.unpull_from(idx);
        self.ask.force = true;
        Some(psn)
    }
}
