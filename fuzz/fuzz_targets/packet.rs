//! Parses arbitrary bytes as a RoCEv2 UDP payload, with and without the ICRC check; whatever
//! parses must re-emit to the same bytes.
//!
//! Input: byte 0 picks the mode (bit 0: IPv6 instead of IPv4; bit 1: overwrite the last 4
//! bytes with the correct ICRC first, so that the checked paths get past the CRC), the rest
//! is the packet.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_wire::icrc::{Encap, IpInfo, Ipv4Info, Ipv6Info};
use rdma_wire::packet::{IcrcCheck, Packet, PacketRepr};

fn encap(v6: bool) -> Encap {
    let ip = if v6 {
        let mut a = [0u8; 16];
        a[0] = 0xfe;
        a[1] = 0x80;
        let mut b = a;
        a[15] = 2;
        b[15] = 3;
        IpInfo::V6(Ipv6Info::new(a, b))
    } else {
        IpInfo::V4(Ipv4Info {
            identification: 0x1234,
            ..Ipv4Info::new([192, 0, 2, 2], [192, 0, 2, 3])
        })
    };
    Encap::new(ip, 49152, 4791)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let encap = encap(mode & 1 != 0);
    let mut bytes = rest.to_vec();
    let mut fixed = false;
    if mode & 2 != 0 && bytes.len() >= 16 {
        let n = bytes.len();
        if let Ok(crc) = encap.compute(&bytes[..n - 4]) {
            bytes[n - 4..].copy_from_slice(&crc.to_le_bytes());
            fixed = true;
        }
    }
    let pkt = Packet::new_unchecked(&bytes[..]);
    // The accessors never panic, whatever the bytes.
    let _ = (
        pkt.payload(),
        pkt.pad(),
        pkt.icrc(),
        pkt.opcode(),
        pkt.bth(),
    );
    let _ = (
        pkt.deth(),
        pkt.reth(),
        pkt.aeth(),
        pkt.atomic_eth(),
        pkt.atomic_ack_eth(),
    );
    let _ = (pkt.rdeth(), pkt.imm_dt(), pkt.ieth());

    let skip = PacketRepr::parse(&pkt, IcrcCheck::Skip);
    let exact = PacketRepr::parse(&pkt, IcrcCheck::Exact(&encap));
    let blind = Encap {
        ip: match encap.ip {
            IpInfo::V4(v4) => IpInfo::V4(Ipv4Info {
                identification: 0,
                ..v4
            }),
            v6 => v6,
        },
        ..encap
    };
    let any_id = PacketRepr::parse(&pkt, IcrcCheck::AnyIpv4Id(&blind));
    // new_checked validates the layout only (Repr parsing also rejects e.g. reserved AETH
    // syndromes), so a parsed packet always has a valid layout.
    if skip.is_ok() {
        assert!(Packet::new_checked(&bytes[..]).is_ok());
    }
    if fixed && skip.is_ok() {
        assert_eq!(exact, skip);
        assert_eq!(any_id, skip);
    }
    if let Ok(e) = exact {
        assert_eq!(Ok(e), skip);
    }

    let Ok(repr) = skip else { return };
    let payload = pkt.payload();
    let mut out = vec![0u8; repr.buffer_len(payload.len())];
    let n = repr
        .emit(payload, &mut out, Some(&encap))
        .expect("a parsed packet re-emits");
    assert_eq!(n, bytes.len());
    let icrc_at = n - 4;
    let pad_at = icrc_at - pkt.pad().len();
    // Emit writes zero pad bytes; everything else must match, and the ICRC too when the
    // input's was right.
    assert_eq!(out[..pad_at], bytes[..pad_at]);
    assert!(out[pad_at..icrc_at].iter().all(|&b| b == 0));
    if exact.is_ok() && pkt.pad().iter().all(|&b| b == 0) {
        assert_eq!(out, bytes);
    }
    assert_eq!(
        PacketRepr::parse(
            &Packet::new_checked(&out[..]).unwrap(),
            IcrcCheck::Exact(&encap)
        ),
        Ok(repr)
    );
});
