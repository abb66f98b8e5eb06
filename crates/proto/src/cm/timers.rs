//! Timer arithmetic: Linux's `cm_convert_to_ms`, and the retransmission record of the one
//! message a connection may have outstanding.

use rdma_wire::mad::MAD_LEN;
use rdma_wire::time::IbaTime;

use super::{CmPath, Nanos};

const NS_PER_MS: u64 = 1_000_000;

/// `cm_convert_to_ms` in nanoseconds: `1 << max(t - 8, 0)` ms.
pub(crate) fn cm_ns(t: IbaTime) -> Nanos {
    t.to_linux_cm_ms() * NS_PER_MS
}

/// Bounds on the timers a peer chooses for us (IBA time exponents, Linux's conversion:
/// `1 << (t - 8)` ms). A REQ may ask for anything from 1 ms to 2.3 hours; outside these
/// bounds a peer could make us resend every millisecond or hold a connection for hours.
pub const PEER_RESPONSE_BOUNDS: (u8, u8) = (14, 22);
/// Bounds on an MRA's service timeout (Linux's own MRAs ask for 24: 65 s).
pub const PEER_MRA_BOUNDS: (u8, u8) = (14, 24);
/// Longest timewait a peer's path may set (16 s; Linux's default is about 1 s).
pub const PEER_TIMEWAIT_MAX: u8 = 22;

fn clamp_time(t: IbaTime, (lo, hi): (u8, u8)) -> IbaTime {
    IbaTime::from_bits_truncate(t.value().clamp(lo, hi))
}

/// Our retransmission interval for a response the peer said it would answer within `t`
/// (a REQ's local CM response timeout), within [`PEER_RESPONSE_BOUNDS`].
pub(crate) fn peer_response_ns(t: IbaTime) -> Nanos {
    cm_ns(clamp_time(t, PEER_RESPONSE_BOUNDS))
}

/// The timewait a peer's path asks for, at most [`PEER_TIMEWAIT_MAX`].
pub(crate) fn peer_timewait_ns(t: IbaTime) -> Nanos {
    cm_ns(clamp_time(t, (0, PEER_TIMEWAIT_MAX)))
}

/// The wait an MRA asks for (its service timeout, within [`PEER_MRA_BOUNDS`], plus `plt`).
pub(crate) fn peer_mra_ns(service_timeout: IbaTime, plt: IbaTime) -> Nanos {
    mra_timeout(clamp_time(service_timeout, PEER_MRA_BOUNDS), plt)
}

/// The active side's wait for an answer to REQ (and DREQ): `2·PLT + remote response timeout`.
pub(crate) fn request_timeout(plt: IbaTime, remote_response: IbaTime) -> Nanos {
    2 * cm_ns(plt) + cm_ns(remote_response)
}

/// The wait after an MRA: its service timeout plus the packet life time.
pub(crate) fn mra_timeout(service_timeout: IbaTime, plt: IbaTime) -> Nanos {
    cm_ns(service_timeout) + cm_ns(plt)
}

/// A message waiting for its answer, resent until the answer or the last retry.
#[derive(Debug, Clone)]
pub(crate) struct Retx {
    /// The MAD exactly as first sent (same transaction id on every retransmission).
    pub(crate) mad: Box<[u8; MAD_LEN]>,
    /// Where it goes.
    pub(crate) to: CmPath,
    /// When to resend or give up.
    pub(crate) deadline: Nanos,
    /// Wait per attempt.
    pub(crate) timeout: Nanos,
    /// Retransmissions left.
    pub(crate) retries_left: u8,
    /// Whether each wait gets its random extra ([`Retx::arm`]).
    pub(crate) jitter: bool,
    /// Early resends left before the regular schedule ([`Retx::with_early`]).
    pub(crate) early: u8,
    /// When it was last sent.
    pub(crate) sent: Nanos,
    /// The regular deadline of the first attempt, while early resends run inside its wait.
    pub(crate) ladder_end: Option<Nanos>,
    /// Early resends configured ([`Retx::with_early`]).
    pub(crate) early_n: u8,
    /// Refusals (REJ 8) resent so far, and when the first came ([`Retx::refused`]).
    refusals: u8,
    refused_since: Option<Nanos>,
    /// The next resend is a fresh first attempt (after a refusal).
    pub(crate) restart: bool,
}

/// The shortest wait of an early resend ([`super::AgentConfig::early_resends`]).
pub const EARLY_MIN_NS: Nanos = 50 * NS_PER_MS;

impl Retx {
    pub(crate) fn new(
        mad: [u8; MAD_LEN],
        to: CmPath,
        now: Nanos,
        timeout: Nanos,
        retries: u8,
        jitter: bool,
    ) -> Self {
        let mut r = Retx {
            mad: Box::new(mad),
            to,
            deadline: 0,
            timeout,
            retries_left: retries,
            jitter,
            early: 0,
            sent: now,
            ladder_end: None,
            early_n: 0,
            refusals: 0,
            refused_since: None,
            restart: false,
        };
        r.arm(now);
        r
    }

    /// Takes the next resend, early ones first, and starts its wait: `Some(true)` for an
    /// early resend, `Some(false)` for a regular retry, `None` when none is left.
    pub(crate) fn take_resend(&mut self, now: Nanos) -> Option<bool> {
        let early = self.early > 0;
        if early {
            self.early -= 1;
        } else if self.retries_left > 0 {
            self.retries_left -= 1;
        } else {
            return None;
        }
        self.arm(now);
        Some(early)
    }

    /// Starts the wait for an answer to the attempt sent at `now`: `timeout`, plus (with
    /// `jitter`) up to half of it again, drawn from the message's transaction id and the
    /// attempt. Requests sent together (a storm) then come back spread out, not in waves.
    /// During early resends, the next step of the ladder, never past the first attempt's
    /// regular deadline (then that deadline).
    pub(crate) fn arm(&mut self, now: Nanos) {
        self.sent = now;
        if let Some(end) = self.ladder_end {
            if self.early > 0 {
                let step = (self.timeout >> (self.early.min(15) + 1)).max(EARLY_MIN_NS);
                let at = now.saturating_add(step).saturating_add(self.extra(step));
                if at < end {
                    self.deadline = at;
                    return;
                }
            }
            self.early = 0;
            self.ladder_end = None;
            self.deadline = end.max(now);
            return;
        }
        self.deadline = now
            .saturating_add(self.timeout)
            .saturating_add(self.extra(self.timeout));
    }

    /// The random extra of a wait of `wait` (up to half of it), when jittered.
    fn extra(&self, wait: Nanos) -> Nanos {
        if !self.jitter || wait < 2 {
            return 0;
        }
        let tid = u64::from_be_bytes(self.mad[8..16].try_into().expect("8 bytes"));
        let attempt = u64::from(self.retries_left) | u64::from(self.early) << 8;
        let mut z = tid ^ attempt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % (wait / 2)
    }

    /// Resends up to `n` times early, inside the first attempt's wait: after
    /// `timeout/2^(n+1)`, then `timeout/2^n` ... `timeout/4` (at least [`EARLY_MIN_NS`];
    /// with 3: at 1/16, 3/16 and 7/16 of it). The regular deadlines stay where they were,
    /// and so does the time a connect or disconnect gives up.
    pub(crate) fn with_early(mut self, now: Nanos, n: u8) -> Self {
        self.early_n = n;
        self.start(now);
        self
    }

    /// The first attempt leaves at `now` (a REQ parked behind its peer's window leaves
    /// later than it was made): its regular wait, and the early resends inside it.
    pub(crate) fn start(&mut self, now: Nanos) {
        self.early = 0;
        self.ladder_end = None;
        self.arm(now);
        if self.early_n > 0 {
            self.ladder_end = Some(self.deadline);
            self.early = self.early_n;
            self.arm(now);
        }
    }

    /// The peer refused the message for want of a listener: resend it after 1 ms, 2 ms, 4 ms
    /// ... (at most 100 ms) as a fresh first attempt ([`Retx::start`] when it leaves), while
    /// within `grace` of the first refusal. Returns whether it will be resent (false: the
    /// refusal stands).
    pub(crate) fn refused(&mut self, now: Nanos, grace: Nanos) -> bool {
        let since = *self.refused_since.get_or_insert(now);
        let left = since.saturating_add(grace).saturating_sub(now);
        let wait = (NS_PER_MS << self.refusals.min(7))
            .min(100 * NS_PER_MS)
            .min(left);
        if wait == 0 {
            return false;
        }
        self.refusals = self.refusals.saturating_add(1);
        self.restart = true;
        self.deadline = now.saturating_add(wait);
        true
    }

    /// Gives up the early resends: the first attempt's regular deadline.
    pub(crate) fn skip_early(&mut self) {
        self.early = 0;
        let sent = self.sent;
        self.arm(sent);
    }

    /// Extends the wait (MRA): this and later attempts wait `timeout`.
    pub(crate) fn extend(&mut self, now: Nanos, timeout: Nanos) {
        self.early = 0;
        self.ladder_end = None;
        self.timeout = timeout;
        self.deadline = now.saturating_add(timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_cm_roce_timings() {
        let t = |v| IbaTime::new(v).unwrap();
        // RoCE upstream: PLT 16, response timeout 20: 2·256 + 4096 ms.
        assert_eq!(request_timeout(t(16), t(20)), 4608 * NS_PER_MS);
        // MRA 24: 65536 ms + PLT.
        assert_eq!(mra_timeout(t(24), t(16)), (65536 + 256) * NS_PER_MS);
        assert_eq!(cm_ns(t(0)), NS_PER_MS);
    }
}
