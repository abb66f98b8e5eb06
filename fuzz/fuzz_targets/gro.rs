//! GRO splitting: one UDP GRO receive from a hostile sender (any bytes, any segment size,
//! some segments sealed with the ICRC of their GSO place) split into its datagrams and each
//! checked as the receive path does: the segments are the receive's bytes in order, a
//! segment sealed for its place is accepted, an accepted one's ICRC holds for the header the
//! checker names (input format: `rdma_soft::fuzzing::gro_receive`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rdma_soft::fuzzing::gro_receive(data);
});
