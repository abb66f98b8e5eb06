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
}

impl Retx {
    pub(crate) fn new(
        mad: [u8; MAD_LEN],
        to: CmPath,
        now: Nanos,
        timeout: Nanos,
        retries: u8,
    ) -> Self {
        Retx {
            mad: Box::new(mad),
            to,
            deadline: now.saturating_add(timeout),
            timeout,
            retries_left: retries,
        }
    }

    /// Extends the wait (MRA): this and later attempts wait `timeout`.
    pub(crate) fn extend(&mut self, now: Nanos, timeout: Nanos) {
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
