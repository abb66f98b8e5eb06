//! GSI delivery: datagrams to QP1 from hostile peers (raw, or MADs built with wrong
//! Q_Keys, P_Keys, lengths, opcodes) on opened and unopened addresses, between takes: only
//! MADs that pass the GSI's checks are queued, in order, within the bounds, each datagram
//! counted once, the eventfd readable exactly while MADs wait (input format:
//! `rdma_soft::fuzzing::gsi_deliver`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rdma_soft::fuzzing::gsi_deliver(data);
});
