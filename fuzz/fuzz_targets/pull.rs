//! Pulled WRITEs from a hostile same-host peer: a pull payload resolved against the region
//! files it handed over, then copied (every address inside a mapping); and `copy_range`
//! over arbitrary resolved pairs (writes in order, inside the pairs, the whole range).
//!
//! Input: byte 0 picks (even: a pull payload, the rest; odd: 8 bytes skip, 8 bytes len,
//! then the pairs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        rdma_soft::fuzzing::pull_rewrite(rest);
    } else if rest.len() >= 16 {
        let skip = u64::from_le_bytes(rest[..8].try_into().unwrap());
        let len = u64::from_le_bytes(rest[8..16].try_into().unwrap()) & 0xffff_ffff;
        rdma_soft::fuzzing::copy_range(&rest[16..], skip, len);
    }
});
