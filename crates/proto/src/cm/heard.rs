//! When each peer was last heard from, for the early resends
//! ([`super::AgentConfig::early_resends`]): a peer that answered other messages since ours
//! left is busy (a storm), not losing them, and gets the regular wait instead.
//!
//! Only peers we sent an early-resent message to are kept (the network adds none), at most
//! [`MAX_PEERS`]; an entry forgotten early only means an early resend that might have been
//! skipped.

use std::collections::HashMap;
use std::net::Ipv6Addr;

use super::Nanos;

/// Peers kept at most; beyond, entries idle for [`IDLE_NS`] go, then all.
pub(crate) const MAX_PEERS: usize = 4096;
const IDLE_NS: Nanos = 120_000_000_000;

#[derive(Debug, Default)]
pub(crate) struct Heard {
    /// Peer → (last heard from, last sent to), 0 for never.
    peers: HashMap<Ipv6Addr, (Nanos, Nanos)>,
}

impl Heard {
    /// We sent `peer` a message with early resends at `now`.
    pub(crate) fn watch(&mut self, peer: Ipv6Addr, now: Nanos) {
        if self.peers.len() >= MAX_PEERS && !self.peers.contains_key(&peer) {
            self.peers
                .retain(|_, &mut (h, s)| h.max(s).saturating_add(IDLE_NS) > now);
            if self.peers.len() >= MAX_PEERS {
                self.peers.clear();
            }
        }
        self.peers.entry(peer).or_insert((0, 0)).1 = now;
    }

    /// A well-formed MAD came from `peer` at `now`.
    pub(crate) fn saw(&mut self, peer: Ipv6Addr, now: Nanos) {
        if let Some(e) = self.peers.get_mut(&peer) {
            e.0 = now;
        }
    }

    /// When `peer` was last heard from, if since we watched it.
    pub(crate) fn last(&self, peer: Ipv6Addr) -> Option<Nanos> {
        self.peers.get(&peer).map(|e| e.0).filter(|&t| t > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_watched_peers_are_kept_and_the_table_is_bounded() {
        let mut h = Heard::default();
        let p = |i: u32| Ipv6Addr::from(u128::from(i));
        h.saw(p(1), 5);
        assert_eq!(h.last(p(1)), None, "the network adds no entry");
        h.watch(p(1), 10);
        assert_eq!(h.last(p(1)), None);
        h.saw(p(1), 20);
        assert_eq!(h.last(p(1)), Some(20));
        for i in 2..=(MAX_PEERS as u32 + 10) {
            h.watch(p(i), 30);
        }
        assert!(h.peers.len() <= MAX_PEERS);
    }
}
