//! The host-local bell: datagrams from a same-user process, each with a descriptor of some
//! kind (none, eventfd, ring, region file, pipe, socket), read by `drain_bell`: refused or
//! taken, never a panic, a block or a record from nowhere.
//!
//! Input: messages `[length, descriptor kind, bytes...]`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rdma_soft::fuzzing::drain_bell(data));
