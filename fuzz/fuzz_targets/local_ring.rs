//! A host-local ring written by a hostile producer (header words and records), read by its
//! consumer: an error or the records, never a read outside the ring or a panic.
//!
//! Input: 8 bytes `tail`, 8 bytes `head - tail` (masked to 256 KiB), then the buffer.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rdma_soft::fuzzing::ring_consume(data));
