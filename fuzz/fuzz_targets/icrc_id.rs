//! The IPv4 Identification solver: a packet sealed with the ICRC for Identification `id`
//! is recovered as exactly `id`; for any other bytes, an Identification it returns makes
//! the ICRC check pass.
//!
//! Input: 2 bytes Identification, 1 byte mode (bit 0: seal the packet first), then the
//! RoCEv2 UDP payload (ICRC last).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_wire::icrc::{compute, recover_ipv4_identification, verify, IpInfo, Ipv4Info};

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let id = u16::from_be_bytes([data[0], data[1]]);
    let seal = data[2] & 1 != 0;
    let mut pkt = data[3..].to_vec();
    let base = Ipv4Info::new([127, 0, 0, 1], [127, 0, 0, 2]);
    let with = |identification| {
        IpInfo::V4(Ipv4Info {
            identification,
            ..base
        })
    };
    if seal && pkt.len() >= 16 {
        let n = pkt.len();
        if let Ok(crc) = compute(&with(id), 49152, 4791, &pkt[..n - 4]) {
            pkt[n - 4..].copy_from_slice(&crc.to_le_bytes());
            let got = recover_ipv4_identification(&base, 49152, 4791, &pkt);
            assert_eq!(got.ok(), Some(id), "a sealed packet's Identification");
            return;
        }
    }
    if let Ok(found) = recover_ipv4_identification(&base, 49152, 4791, &pkt) {
        assert!(verify(&with(found), 49152, 4791, &pkt).is_ok());
    }
});
