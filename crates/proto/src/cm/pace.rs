//! What a storm of connections may cost: the REQ window per peer (active side) and the
//! half-open counts that the listener limits read (passive side), both O(1) per message.
//!
//! The window: at most [`super::AgentConfig::req_window`] REQs to one peer GID are on the
//! wire without an answer (REP, REJ or MRA). A REQ beyond it is parked, unsent and without
//! a timer, until an earlier one is answered, times out or is destroyed; its retransmission
//! timer starts when it is sent. A storm of connects then reaches a peer at the rate the peer
//! answers, instead of overflowing its socket buffer and backlog and timing out in waves.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv6Addr;

use super::{ConnHandle, Nanos};

/// Where a connection's REQ is with respect to its peer's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ReqSlot {
    /// Not an active connection waiting for its first answer.
    #[default]
    None,
    /// Waiting for a slot: not sent yet, no retransmission timer.
    Parked,
    /// Sent and holding one of the peer's slots until answered.
    Flying,
}

/// REQs in flight to one peer and those waiting behind them.
#[derive(Debug, Default)]
struct Flight {
    flying: usize,
    parked: VecDeque<ConnHandle>,
}

/// The agent's pacing and half-open bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct Pacing {
    flights: HashMap<Ipv6Addr, Flight>,
    /// Peers whose window has a free slot and parked REQs (to look at in the next sync).
    pub(crate) released: Vec<Ipv6Addr>,
    /// Passive connections in REQ_RCVD / MRA_REQ_SENT, per listener and per peer GID.
    half_open_listener: HashMap<u64, usize>,
    half_open_peer: HashMap<Ipv6Addr, usize>,
    /// The latest time an input brought (the send time of a REQ leaving the queue).
    pub(crate) now: Nanos,
}

impl Pacing {
    /// Moves the clock forward (never back).
    pub(crate) fn saw(&mut self, now: Nanos) {
        self.now = self.now.max(now);
    }

    /// Takes a slot of `peer`'s window (`window` 0: unlimited) or parks `h` behind it.
    /// Returns the slot `h` now holds.
    pub(crate) fn admit(&mut self, peer: Ipv6Addr, window: usize, h: ConnHandle) -> ReqSlot {
        let f = self.flights.entry(peer).or_default();
        if window == 0 || (f.flying < window && f.parked.is_empty()) {
            f.flying += 1;
            ReqSlot::Flying
        } else {
            f.parked.push_back(h);
            ReqSlot::Parked
        }
    }

    /// Gives back a slot of `peer`'s window.
    pub(crate) fn release(&mut self, peer: Ipv6Addr) {
        let Some(f) = self.flights.get_mut(&peer) else {
            return;
        };
        f.flying = f.flying.saturating_sub(1);
        if f.parked.is_empty() {
            if f.flying == 0 {
                self.flights.remove(&peer);
            }
        } else {
            self.released.push(peer);
        }
    }

    /// The next parked REQ to `peer` if its window has room; `valid` says whether a parked
    /// handle still waits (a destroyed one is skipped). The caller sends it.
    pub(crate) fn next_parked(
        &mut self,
        peer: Ipv6Addr,
        window: usize,
        mut valid: impl FnMut(ConnHandle) -> bool,
    ) -> Option<ConnHandle> {
        let f = self.flights.get_mut(&peer)?;
        while window == 0 || f.flying < window {
            let Some(h) = f.parked.pop_front() else {
                break;
            };
            if valid(h) {
                f.flying += 1;
                return Some(h);
            }
        }
        if f.flying == 0 && f.parked.is_empty() {
            self.flights.remove(&peer);
        }
        None
    }

    /// REQs parked behind `peer`'s window (destroyed ones not yet skipped included).
    #[cfg(test)]
    pub(crate) fn parked(&self, peer: &Ipv6Addr) -> usize {
        self.flights.get(peer).map_or(0, |f| f.parked.len())
    }

    /// A passive connection entered REQ_RCVD / MRA_REQ_SENT.
    pub(crate) fn open(&mut self, listener: Option<u64>, peer: Ipv6Addr) {
        if let Some(l) = listener {
            *self.half_open_listener.entry(l).or_default() += 1;
        }
        *self.half_open_peer.entry(peer).or_default() += 1;
    }

    /// A passive connection left REQ_RCVD / MRA_REQ_SENT (answered or gone).
    pub(crate) fn close(&mut self, listener: Option<u64>, peer: Ipv6Addr) {
        if let Some(l) = listener {
            dec(&mut self.half_open_listener, l);
        }
        dec(&mut self.half_open_peer, peer);
    }

    /// Half-open passive connections of `listener` and from `peer`.
    pub(crate) fn half_open(&self, listener: u64, peer: &Ipv6Addr) -> (usize, usize) {
        (
            self.half_open_listener.get(&listener).copied().unwrap_or(0),
            self.half_open_peer.get(peer).copied().unwrap_or(0),
        )
    }
}

fn dec<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, k: K) {
    if let Some(n) = m.get_mut(&k) {
        *n -= 1;
        if *n == 0 {
            m.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_parks_and_releases_in_order() {
        let peer: Ipv6Addr = "::ffff:192.0.2.2".parse().unwrap();
        let mut p = Pacing::default();
        assert_eq!(p.admit(peer, 2, ConnHandle(1)), ReqSlot::Flying);
        assert_eq!(p.admit(peer, 2, ConnHandle(2)), ReqSlot::Flying);
        assert_eq!(p.admit(peer, 2, ConnHandle(3)), ReqSlot::Parked);
        assert_eq!(p.admit(peer, 2, ConnHandle(4)), ReqSlot::Parked);
        assert_eq!(p.next_parked(peer, 2, |_| true), None, "window full");
        p.release(peer);
        assert_eq!(p.released, vec![peer]);
        // 3 was destroyed meanwhile: skipped, 4 goes.
        assert_eq!(
            p.next_parked(peer, 2, |h| h != ConnHandle(3)),
            Some(ConnHandle(4))
        );
        assert_eq!(p.parked(&peer), 0);
        p.release(peer);
        p.release(peer);
        assert!(p.flights.is_empty(), "an idle peer costs nothing");
    }

    #[test]
    fn unlimited_window_never_parks() {
        let peer = Ipv6Addr::LOCALHOST;
        let mut p = Pacing::default();
        for h in 0..10_000 {
            assert_eq!(p.admit(peer, 0, ConnHandle(h)), ReqSlot::Flying);
        }
    }

    #[test]
    fn half_open_counts() {
        let (a, b) = (Ipv6Addr::LOCALHOST, Ipv6Addr::UNSPECIFIED);
        let mut p = Pacing::default();
        p.open(Some(7), a);
        p.open(Some(7), b);
        p.open(None, a);
        assert_eq!(p.half_open(7, &a), (2, 2));
        p.close(Some(7), a);
        p.close(None, a);
        assert_eq!(p.half_open(7, &a), (1, 0));
        p.close(Some(7), b);
        assert!(p.half_open_listener.is_empty() && p.half_open_peer.is_empty());
    }
}
