use super::*;
use crate::aeth::{AethSyndrome, NakCode, RnrTimer};
use crate::bth::MAX_U24;
use crate::icrc::{IpInfo, Ipv4Info, Ipv6Info};
use proptest::prelude::*;

fn bth(opcode: Opcode, payload_len: usize) -> BthRepr {
    BthRepr {
        opcode,
        se: false,
        mig_req: false,
        pad_cnt: PacketRepr::pad_for(payload_len),
        p_key: 0xffff,
        fecn: false,
        becn: false,
        resv6a: 0,
        dest_qp: 0x11,
        ack_req: true,
        resv7: 0,
        psn: 0x123456,
    }
}

/// Fills every header the opcode needs with values derived from `seed`.
fn full(bth: BthRepr, seed: u64) -> PacketRepr {
    let h = bth.opcode.ext_headers();
    let s32 = seed as u32;
    let pick = |x: ExtHeader| h.contains(x);
    PacketRepr {
        bth,
        rdeth: pick(ExtHeader::Rdeth).then_some(RdethRepr {
            resv8: 0,
            ee_cnxt: s32 & MAX_U24,
        }),
        deth: pick(ExtHeader::Deth).then_some(DethRepr {
            q_key: s32,
            resv8: 0,
            src_qp: (s32 >> 3) & MAX_U24,
        }),
        reth: pick(ExtHeader::Reth).then_some(RethRepr {
            va: seed,
            r_key: s32 ^ 5,
            dma_len: s32 >> 7,
        }),
        atomic_eth: pick(ExtHeader::AtomicEth).then_some(AtomicEthRepr {
            va: seed.rotate_left(3),
            r_key: s32,
            swap_add_data: seed ^ 1,
            compare_data: !seed,
        }),
        aeth: pick(ExtHeader::Aeth).then_some(AethRepr {
            syndrome: match seed % 3 {
                0 => AethSyndrome::Ack {
                    credits: (seed >> 8) as u8 & 0x1f,
                },
                1 => AethSyndrome::RnrNak {
                    timer: RnrTimer::new((seed >> 8) as u8 & 0x1f).unwrap(),
                },
                _ => AethSyndrome::Nak(NakCode::from_code((seed >> 8) as u8)),
            },
            msn: (s32 >> 5) & MAX_U24,
        }),
        atomic_ack_eth: pick(ExtHeader::AtomicAckEth).then_some(AtomicAckEthRepr {
            orig_rem_dt: seed.swap_bytes(),
        }),
        imm_dt: pick(ExtHeader::ImmDt).then_some(s32.rotate_right(9)),
        ieth: pick(ExtHeader::Ieth).then_some(s32 ^ 0x0800_0000),
    }
}

fn v4() -> Encap {
    Encap::new(
        IpInfo::V4(Ipv4Info::new([192, 0, 2, 2], [192, 0, 2, 3])),
        55410,
        4791,
    )
}

fn v6() -> Encap {
    let mut a = [0u8; 16];
    a[..2].copy_from_slice(&[0x20, 0x01]);
    let mut b = a;
    a[15] = 2;
    b[15] = 3;
    Encap::new(IpInfo::V6(Ipv6Info::new(a, b)), 49152, 4791)
}

fn emit_vec(repr: &PacketRepr, payload: &[u8], encap: Option<&Encap>) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len(payload.len())];
    let n = repr.emit(payload, &mut buf, encap).unwrap();
    assert_eq!(n, buf.len());
    buf
}

fn any_repr() -> impl Strategy<Value = (PacketRepr, Vec<u8>)> {
    (
        proptest::sample::select(Opcode::ALL),
        any::<u64>(),
        proptest::collection::vec(any::<u8>(), 0..80),
        any::<(bool, bool, bool, bool, bool)>(),
        any::<u16>(),
        0..=MAX_U24,
        0..=MAX_U24,
    )
        .prop_map(
            |(op, seed, mut payload, (se, m, fecn, becn, a), p_key, qp, psn)| {
                if !op.has_payload() {
                    payload.clear();
                }
                let mut b = bth(op, payload.len());
                b.se = se;
                b.mig_req = m;
                b.fecn = fecn;
                b.becn = becn;
                b.ack_req = a;
                b.p_key = p_key;
                b.dest_qp = qp;
                b.psn = psn;
                (full(b, seed), payload)
            },
        )
}

proptest! {
    #[test]
    fn parse_emit_round_trips((repr, payload) in any_repr(), six in any::<bool>()) {
        let encap = if six { v6() } else { v4() };
        let bytes = emit_vec(&repr, &payload, Some(&encap));
        let pkt = Packet::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(pkt.payload(), &payload[..]);
        prop_assert!(pkt.pad().iter().all(|&b| b == 0));
        prop_assert_eq!(PacketRepr::parse(&pkt, IcrcCheck::Exact(&encap)), Ok(repr));
        prop_assert_eq!(PacketRepr::parse(&pkt, IcrcCheck::AnyIpv4Id(&encap)), Ok(repr));
        prop_assert_eq!(emit_vec(&repr, pkt.payload(), Some(&encap)), bytes.clone());
        // Every shorter prefix is rejected with a typed error, never a panic.
        for n in 0..bytes.len() {
            let err = PacketRepr::parse(&Packet::new_unchecked(&bytes[..n]), IcrcCheck::Exact(&encap)).unwrap_err();
            prop_assert!(matches!(err, Error::Truncated { .. } | Error::BadPadCount(_)
                | Error::BadPayloadLength { .. } | Error::BadIcrc { .. }), "{:?}", err);
        }
        // Any single flipped bit outside BTH byte 4 breaks the ICRC.
        let mut bad = bytes.clone();
        let at = (repr.bth.psn as usize) % bytes.len();
        let at = if at == 4 { 5 } else { at };
        bad[at] ^= 0x10;
        prop_assert!(PacketRepr::parse(&Packet::new_unchecked(&bad[..]), IcrcCheck::Exact(&encap)).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_re_emit(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
        let pkt = Packet::new_unchecked(&bytes[..]);
        let _ = (pkt.payload(), pkt.pad(), pkt.icrc(), pkt.reth(), pkt.aeth(), pkt.opcode());
        let _ = PacketRepr::parse(&pkt, IcrcCheck::Exact(&v4()));
        let _ = PacketRepr::parse(&pkt, IcrcCheck::AnyIpv4Id(&v4()));
        if let Ok(repr) = PacketRepr::parse(&pkt, IcrcCheck::Skip) {
            let mut out = emit_vec(&repr, pkt.payload(), None);
            let n = out.len();
            out[n - 4..].copy_from_slice(&bytes[n - 4..]);
            let mut expect = bytes.clone();
            expect[n - 4 - pkt.pad().len()..n - 4].fill(0);
            prop_assert_eq!(out, expect);
        }
    }
}

#[test]
fn typed_errors_for_malformed_packets() {
    let repr = full(bth(Opcode::RcRdmaWriteOnly, 5), 7);
    let good = emit_vec(&repr, b"hello", Some(&v4()));
    // Unknown opcode (the captures' probes use 0x72) and a bad TVer.
    let mut b = good.clone();
    b[0] = 0x72;
    assert_eq!(
        Packet::new_checked(&b[..]).err(),
        Some(Error::UnknownOpcode(0x72))
    );
    let mut b = good.clone();
    b[1] |= 5;
    assert_eq!(
        Packet::new_checked(&b[..]).err(),
        Some(Error::BadTransportVersion(5))
    );
    // Pad count larger than the bytes before the ICRC.
    let ack = full(bth(Opcode::RcAcknowledge, 0), 1);
    let mut b = emit_vec(&ack, &[], None);
    b[1] |= 0x20;
    assert_eq!(
        Packet::new_checked(&b[..]).err(),
        Some(Error::BadPadCount(2))
    );
    // Payload on an ACK, and a payload area that is not a multiple of 4.
    let mut b = emit_vec(&ack, &[], None);
    b.extend_from_slice(&[0; 4]);
    assert_eq!(
        Packet::new_checked(&b[..]).err(),
        Some(Error::BadPayloadLength {
            opcode: 0x11,
            len: 4
        })
    );
    let mut b = good.clone();
    b.push(0);
    assert!(matches!(
        Packet::new_checked(&b[..]),
        Err(Error::BadPayloadLength {
            opcode: 0x0a,
            len: 9
        })
    ));
    // Bad ICRC, and the right ICRC checked against the wrong encapsulation.
    let mut b = good.clone();
    let n = b.len();
    b[n - 1] ^= 1;
    let pkt = Packet::new_checked(&b[..]).unwrap();
    assert!(matches!(
        PacketRepr::parse(&pkt, IcrcCheck::Exact(&v4())),
        Err(Error::BadIcrc { .. })
    ));
    assert!(PacketRepr::parse(&pkt, IcrcCheck::Skip).is_ok());
    let pkt = Packet::new_checked(&good[..]).unwrap();
    assert!(matches!(
        PacketRepr::parse(&pkt, IcrcCheck::Exact(&v6())),
        Err(Error::BadIcrc { .. })
    ));
    // A reserved AETH syndrome type.
    let mut b = emit_vec(&ack, &[], None);
    b[12] = 0x40;
    assert_eq!(
        PacketRepr::parse(&Packet::new_unchecked(&b[..]), IcrcCheck::Skip),
        Err(Error::BadField("aeth.syndrome"))
    );
}

#[test]
fn emit_rejects_mismatches() {
    let mut buf = [0u8; 128];
    let write = full(bth(Opcode::RcRdmaWriteOnly, 5), 7);
    let no_reth = PacketRepr {
        reth: None,
        ..write
    };
    assert_eq!(
        no_reth.emit(b"hello", &mut buf, None),
        Err(Error::HeaderMismatch {
            opcode: 0x0a,
            header: "RETH"
        })
    );
    let extra = PacketRepr {
        imm_dt: Some(1),
        ..write
    };
    assert_eq!(
        extra.emit(b"hello", &mut buf, None),
        Err(Error::HeaderMismatch {
            opcode: 0x0a,
            header: "ImmDt"
        })
    );
    assert_eq!(
        write.emit(b"hell", &mut buf, None),
        Err(Error::BadPadCount(3))
    );
    assert_eq!(
        write.emit(b"hello", &mut buf[..35], None),
        Err(Error::BufferTooSmall { need: 40, have: 35 })
    );
    let read = full(bth(Opcode::RcRdmaReadRequest, 0), 7);
    assert_eq!(
        read.emit(b"x", &mut buf, None),
        Err(Error::BadPayloadLength {
            opcode: 0x0c,
            len: 1
        })
    );
    let mut wide = write;
    wide.bth.dest_qp = 1 << 24;
    assert_eq!(
        wide.emit(b"hello", &mut buf, None),
        Err(Error::BadField("bth.dest_qp"))
    );
    let mut wide = full(bth(Opcode::UdSendOnly, 0), 7);
    wide.deth = Some(DethRepr {
        q_key: 0,
        resv8: 0,
        src_qp: 1 << 24,
    });
    assert_eq!(
        wide.emit(&[], &mut buf, None),
        Err(Error::BadField("deth.src_qp"))
    );
}

#[test]
fn every_opcode_emits_and_parses() {
    for &op in Opcode::ALL {
        let payload: &[u8] = if op.has_payload() { b"abcdef" } else { b"" };
        let repr = full(
            bth(op, payload.len()),
            u64::from(u8::from(op)) * 0x0101_0101_0101,
        );
        let bytes = emit_vec(&repr, payload, Some(&v6()));
        let pkt = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(pkt.opcode(), Ok(op));
        assert_eq!(
            PacketRepr::parse(&pkt, IcrcCheck::Exact(&v6())),
            Ok(repr),
            "{op}"
        );
        assert_eq!(pkt.payload(), payload);
        assert_eq!(pkt.reth().map(|r| r.va()), repr.reth.map(|r| r.va));
        assert_eq!(pkt.imm_dt().map(|r| r.imm_dt()), repr.imm_dt);
    }
}

#[test]
fn in_place_building() {
    let repr = full(bth(Opcode::UdSendOnlyImm, 8), 3);
    let mut buf = emit_vec(&repr, &[0; 8], None);
    let mut pkt = Packet::new_checked(&mut buf[..]).unwrap();
    pkt.payload_mut().copy_from_slice(b"12345678");
    pkt.fill_icrc(&v4()).unwrap();
    let pkt = Packet::new_checked(&buf[..]).unwrap();
    assert_eq!(pkt.check_icrc(IcrcCheck::Exact(&v4())), Ok(()));
    assert_eq!(pkt.payload(), b"12345678");
}
