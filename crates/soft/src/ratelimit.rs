//! Rate-limited warnings for input a remote peer controls (malformed datagrams, unknown
//! QPNs, bad ICRCs): at most one event per second per call site, carrying how many were
//! suppressed since the last one, so a hostile peer cannot flood the log. The counters that
//! count every such datagram are the wire's and the runtime's stats.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Smallest gap between two events of one call site.
const GAP: Duration = Duration::from_secs(1);

/// One call site's state.
pub(crate) struct Limiter {
    /// Nanoseconds since `epoch()` when the next event may go out.
    next: AtomicU64,
    suppressed: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Limiter {
    pub(crate) const fn new() -> Limiter {
        Limiter {
            next: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(suppressed)` when an event may go out now.
    pub(crate) fn allow(&self) -> Option<u64> {
        let now = epoch().elapsed().as_nanos() as u64;
        let next = self.next.load(Ordering::Relaxed);
        if now < next
            || self
                .next
                .compare_exchange(
                    next,
                    now + GAP.as_nanos() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

/// `warn!` at most once per second for this call site (only when WARN is enabled: the
/// check is the macro's level test, nothing is formatted otherwise).
macro_rules! warn_limited {
    ($($arg:tt)+) => {
        if tracing::enabled!(tracing::Level::WARN) {
            static LIMIT: $crate::ratelimit::Limiter = $crate::ratelimit::Limiter::new();
            if let Some(suppressed) = LIMIT.allow() {
                tracing::warn!(suppressed, $($arg)+);
            }
        }
    };
}
pub(crate) use warn_limited;

/// `debug!` at most once per second for this call site (for events a busy data path may
/// repeat, such as a source-port fallback).
macro_rules! debug_limited {
    ($($arg:tt)+) => {
        if tracing::enabled!(tracing::Level::DEBUG) {
            static LIMIT: $crate::ratelimit::Limiter = $crate::ratelimit::Limiter::new();
            if let Some(suppressed) = LIMIT.allow() {
                tracing::debug!(suppressed, $($arg)+);
            }
        }
    };
}
pub(crate) use debug_limited;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_gap_and_the_rest_counted() {
        let l = Limiter::new();
        assert_eq!(l.allow(), Some(0));
        assert_eq!(l.allow(), None);
        assert_eq!(l.allow(), None);
        l.next.store(0, Ordering::Relaxed); // as if the gap had passed
        assert_eq!(l.allow(), Some(2));
    }
}
