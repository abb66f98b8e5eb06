//! The agent's random source for comm ids, transaction ids and PSNs.
//!
//! A ChaCha stream cipher keyed by the agent's seed: deterministic for a given seed (the
//! simulator replays a run), while its outputs, which go on the wire, say nothing about
//! the next ones. A real agent gets its seed from the OS (`rdmacm` draws it with
//! `getrandom`).

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha12Rng;

/// Unpredictable identifiers from a seed.
#[derive(Debug, Clone)]
pub(crate) struct IdRng(ChaCha12Rng);

impl IdRng {
    pub(crate) fn new(seed: u64) -> Self {
        IdRng(ChaCha12Rng::seed_from_u64(seed))
    }

    pub(crate) fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
}

#[cfg(test)]
mod tests {
    use super::IdRng;

    #[test]
    fn same_seed_same_stream_other_seed_other_stream() {
        let take = |seed| {
            let mut r = IdRng::new(seed);
            (0..64).map(|_| r.next_u32()).collect::<Vec<_>>()
        };
        assert_eq!(take(7), take(7));
        assert_ne!(take(7), take(8));
    }
}
