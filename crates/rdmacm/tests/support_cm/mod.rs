//! Helpers of the rdma_cm model's tests: addresses and the next event of a channel.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use rdmacm::cm::{Event, EventChannel, EventType};

/// Parses a socket address.
pub fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// The next event of `ch`, which must come within `t` and be a `kind` (panics otherwise,
/// naming the status of the event that came instead).
pub fn expect_within(ch: &EventChannel, kind: EventType, t: Duration) -> Event {
    let ev = ch
        .get_event_timeout(t)
        .unwrap()
        .unwrap_or_else(|| panic!("timed out waiting for {kind}"));
    assert_eq!(ev.kind(), kind, "status {}", ev.status());
    ev
}
