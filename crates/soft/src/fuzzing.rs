//! Entry points for the cargo-fuzz targets in `fuzz/` (feature `fuzzing`; not an API).
//! Each takes untrusted bytes as a hostile peer would write them and panics only when a
//! check of the code under test fails.

/// A host-local ring written by a hostile producer, read to the end by its consumer.
pub fn ring_consume(input: &[u8]) {
    crate::io::local::fuzz_ring_consume(input);
}

/// A pull payload from a hostile peer: resolved against two region files, then copied.
pub fn pull_rewrite(payload: &[u8]) {
    crate::io::local::fuzz_pull_rewrite(payload);
}

/// `copy_range` over arbitrary resolved pairs (never dereferenced).
pub fn copy_range(source: &[u8], skip: u64, len: u64) {
    crate::pull::fuzz_copy_range(source, skip, len);
}

/// Bell datagrams from a same-user process, each with a descriptor of some kind
/// (eventfd, ring, region file, pipe, socket), read by the host-local wire.
pub fn drain_bell(input: &[u8]) {
    crate::io::local::fuzz_drain_bell(input);
}
