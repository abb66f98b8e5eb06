//! Property tests of the management formats: `parse(emit(x)) == x` for every message over
//! random field values, and `emit(parse(b)) == b` for random bytes whose reserved bits are
//! zero (the defined bits of each layout are found by emitting a parse of all-ones).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use rdma_wire::cm::*;
use rdma_wire::ip_cm::{IpCmHeaderRepr, PortSpace, ServiceId};
use rdma_wire::mad::{MadHeaderRepr, MadRepr, MAD_LEN};
use rdma_wire::time::IbaTime;

fn arr<const N: usize>() -> impl Strategy<Value = [u8; N]> {
    prop::collection::vec(any::<u8>(), N).prop_map(|v| v.try_into().unwrap())
}

fn bits(n: u32) -> impl Strategy<Value = u8> {
    0u8..=((1u16 << n) - 1) as u8
}

fn u24() -> impl Strategy<Value = u32> {
    0u32..(1 << 24)
}

fn time() -> impl Strategy<Value = IbaTime> {
    (0u8..32).prop_map(|t| IbaTime::new(t).unwrap())
}

fn gid() -> impl Strategy<Value = Ipv6Addr> {
    any::<u128>().prop_map(Ipv6Addr::from)
}

fn path() -> impl Strategy<Value = CmPathRepr> {
    (
        (any::<u16>(), any::<u16>(), gid(), gid()),
        (0u32..(1 << 20), bits(6), any::<u8>(), any::<u8>()),
        (bits(4), any::<bool>(), time()),
    )
        .prop_map(
            |((ll, rl, lg, rg), (fl, rate, tc, hl), (sl, sn, ack))| CmPathRepr {
                local_port_lid: ll,
                remote_port_lid: rl,
                local_port_gid: lg,
                remote_port_gid: rg,
                flow_label: fl,
                packet_rate: rate,
                traffic_class: tc,
                hop_limit: hl,
                sl,
                subnet_local: sn,
                local_ack_timeout: ack,
            },
        )
}

fn msg_ref() -> impl Strategy<Value = MessageRef> {
    bits(2).prop_map(MessageRef::from)
}

fn req() -> impl Strategy<Value = ReqRepr> {
    (
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            u24(),
            any::<u8>(),
        ),
        (u24(), any::<u8>(), u24(), time(), bits(2), any::<bool>()),
        (u24(), time(), bits(3), any::<u16>(), bits(4), any::<bool>()),
        (bits(3), bits(4), any::<bool>(), bits(3), any::<bool>()),
        (path(), path(), arr::<REQ_PRIVATE_DATA_LEN>()),
    )
        .prop_map(|(a, b, c, d, e)| ReqRepr {
            local_comm_id: a.0,
            service_id: a.1,
            local_ca_guid: a.2,
            local_q_key: a.3,
            local_qpn: a.4,
            responder_resources: a.5,
            local_eecn: b.0,
            initiator_depth: b.1,
            remote_eecn: b.2,
            remote_cm_response_timeout: b.3,
            transport_service_type: b.4,
            end_to_end_flow_control: b.5,
            starting_psn: c.0,
            local_cm_response_timeout: c.1,
            retry_count: c.2,
            partition_key: c.3,
            path_packet_payload_mtu: c.4,
            rdc_exists: c.5,
            rnr_retry_count: d.0,
            max_cm_retries: d.1,
            srq: d.2,
            extended_transport_type: d.3,
            sap_supported: d.4,
            primary_path: e.0,
            alternate_path: e.1,
            private_data: e.2,
        })
}

fn mra() -> impl Strategy<Value = MraRepr> {
    (any::<u32>(), any::<u32>(), msg_ref(), time(), arr()).prop_map(|(l, r, m, t, pd)| MraRepr {
        local_comm_id: l,
        remote_comm_id: r,
        message_mraed: m,
        service_timeout: t,
        private_data: pd,
    })
}

fn rej() -> impl Strategy<Value = RejRepr> {
    (
        any::<u32>(),
        any::<u32>(),
        msg_ref(),
        bits(7),
        any::<u16>(),
        arr(),
        arr(),
    )
        .prop_map(|(l, r, m, n, reason, ari, pd)| RejRepr {
            local_comm_id: l,
            remote_comm_id: r,
            message_rejected: m,
            reject_info_length: n,
            reason: reason.into(),
            additional_reject_information: ari,
            private_data: pd,
        })
}

fn rep() -> impl Strategy<Value = RepRepr> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            u24(),
            u24(),
            u24(),
        ),
        (any::<u8>(), any::<u8>(), time(), bits(2), any::<bool>()),
        (bits(3), any::<bool>(), any::<u64>(), arr()),
    )
        .prop_map(|(a, b, c)| RepRepr {
            local_comm_id: a.0,
            remote_comm_id: a.1,
            local_q_key: a.2,
            local_qpn: a.3,
            local_ee_context_number: a.4,
            starting_psn: a.5,
            responder_resources: b.0,
            initiator_depth: b.1,
            target_ack_delay: b.2,
            failover_accepted: b.3,
            end_to_end_flow_control: b.4,
            rnr_retry_count: c.0,
            srq: c.1,
            local_ca_guid: c.2,
            private_data: c.3,
        })
}

fn rtu() -> impl Strategy<Value = RtuRepr> {
    (any::<u32>(), any::<u32>(), arr()).prop_map(|(l, r, pd)| RtuRepr {
        local_comm_id: l,
        remote_comm_id: r,
        private_data: pd,
    })
}

fn dreq() -> impl Strategy<Value = DreqRepr> {
    (any::<u32>(), any::<u32>(), u24(), arr()).prop_map(|(l, r, q, pd)| DreqRepr {
        local_comm_id: l,
        remote_comm_id: r,
        remote_qpn_eecn: q,
        private_data: pd,
    })
}

fn drep() -> impl Strategy<Value = DrepRepr> {
    (any::<u32>(), any::<u32>(), arr()).prop_map(|(l, r, pd)| DrepRepr {
        local_comm_id: l,
        remote_comm_id: r,
        private_data: pd,
    })
}

fn lap() -> impl Strategy<Value = LapRepr> {
    (any::<u32>(), any::<u32>(), u24(), time(), path(), arr()).prop_map(|(l, r, q, t, p, pd)| {
        LapRepr {
            local_comm_id: l,
            remote_comm_id: r,
            remote_qpn_eecn: q,
            remote_cm_response_timeout: t,
            alternate_path: p,
            private_data: pd,
        }
    })
}

fn apr() -> impl Strategy<Value = AprRepr> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u8>(),
        any::<u8>(),
        arr(),
        arr(),
    )
        .prop_map(|(l, r, n, s, ai, pd)| AprRepr {
            local_comm_id: l,
            remote_comm_id: r,
            additional_information_length: n,
            ap_status: s.into(),
            additional_information: ai,
            private_data: pd,
        })
}

fn sidr_req() -> impl Strategy<Value = SidrReqRepr> {
    (any::<u32>(), any::<u16>(), any::<u64>(), arr()).prop_map(|(id, pk, sid, pd)| SidrReqRepr {
        request_id: id,
        partition_key: pk,
        service_id: sid,
        private_data: pd,
    })
}

fn sidr_rep() -> impl Strategy<Value = SidrRepRepr> {
    (
        (any::<u32>(), any::<u8>(), any::<u8>(), u24()),
        (any::<u64>(), any::<u32>(), arr(), arr()),
    )
        .prop_map(|(a, b)| SidrRepRepr {
            request_id: a.0,
            status: a.1.into(),
            additional_information_length: a.2,
            qpn: a.3,
            service_id: b.0,
            q_key: b.1,
            additional_information: b.2,
            private_data: b.3,
        })
}

fn class_port_info() -> impl Strategy<Value = ClassPortInfoRepr> {
    (
        (
            any::<u8>(),
            any::<u8>(),
            any::<u16>(),
            0u32..(1 << 27),
            time(),
        ),
        (
            gid(),
            any::<u8>(),
            bits(4),
            0u32..(1 << 20),
            any::<u16>(),
            any::<u16>(),
        ),
        (u24(), any::<u32>()),
        (
            gid(),
            any::<u8>(),
            bits(4),
            0u32..(1 << 20),
            any::<u16>(),
            any::<u16>(),
        ),
        (any::<u8>(), u24(), any::<u32>()),
    )
        .prop_map(|(a, r, r2, t, t2)| ClassPortInfoRepr {
            base_version: a.0,
            class_version: a.1,
            capability_mask: a.2,
            capability_mask2: a.3,
            resp_time_value: a.4,
            redirect_gid: r.0,
            redirect_tc: r.1,
            redirect_sl: r.2,
            redirect_fl: r.3,
            redirect_lid: r.4,
            redirect_p_key: r.5,
            redirect_qp: r2.0,
            redirect_q_key: r2.1,
            trap_gid: t.0,
            trap_tc: t.1,
            trap_sl: t.2,
            trap_fl: t.3,
            trap_lid: t.4,
            trap_p_key: t.5,
            trap_hl: t2.0,
            trap_qp: t2.1,
            trap_q_key: t2.2,
        })
}

fn message() -> impl Strategy<Value = CmMessage> {
    prop_oneof![
        class_port_info().prop_map(CmMessage::ClassPortInfo),
        req().prop_map(CmMessage::Req),
        mra().prop_map(CmMessage::Mra),
        rej().prop_map(CmMessage::Rej),
        rep().prop_map(CmMessage::Rep),
        rtu().prop_map(CmMessage::Rtu),
        dreq().prop_map(CmMessage::Dreq),
        drep().prop_map(CmMessage::Drep),
        sidr_req().prop_map(CmMessage::SidrReq),
        sidr_rep().prop_map(CmMessage::SidrRep),
        lap().prop_map(CmMessage::Lap),
        apr().prop_map(CmMessage::Apr),
    ]
}

fn cm_mad() -> impl Strategy<Value = CmMadRepr> {
    (
        any::<bool>(),
        bits(7),
        any::<u16>(),
        any::<u16>(),
        any::<u64>(),
        any::<u32>(),
        message(),
    )
        .prop_map(|(r, m, st, cs, tid, am, msg)| CmMadRepr {
            r_bit: r,
            method: m,
            status: st,
            class_specific: cs,
            transaction_id: tid,
            attribute_modifier: am,
            message: msg,
        })
}

const ATTRS: [CmAttributeId; 12] = [
    CmAttributeId::CLASS_PORT_INFO,
    CmAttributeId::REQ,
    CmAttributeId::MRA,
    CmAttributeId::REJ,
    CmAttributeId::REP,
    CmAttributeId::RTU,
    CmAttributeId::DREQ,
    CmAttributeId::DREP,
    CmAttributeId::SIDR_REQ,
    CmAttributeId::SIDR_REP,
    CmAttributeId::LAP,
    CmAttributeId::APR,
];

/// The bits of a message's 232 bytes that some field defines (reserved bits are 0).
fn defined_bits(attr: CmAttributeId) -> [u8; CM_PAYLOAD_LEN] {
    let msg = CmMessage::parse(attr, &[0xff; CM_PAYLOAD_LEN]).unwrap();
    let mut out = [0u8; CM_PAYLOAD_LEN];
    msg.emit(&mut out).unwrap();
    out
}

/// Asserts that the `[start, end)` byte ranges of `mask` are all reserved.
fn zero_ranges(mask: &[u8], ranges: &[(usize, usize)]) {
    for &(start, end) in ranges {
        assert!(
            mask[start..end].iter().all(|&b| b == 0),
            "{start}..{end} should be reserved"
        );
    }
}

#[test]
fn reserved_bits_match_the_iba_tables() {
    let req = defined_bits(CmAttributeId::REQ);
    zero_ranges(&req, &[(4, 8), (24, 28)]);
    let expect = [
        (43, 0xff),
        (47, 0xff),
        (50, 0xff),
        (51, 0xff),
        (88, 0xff),
        (90, 0xf0),
        (91, 0x3f),
        (94, 0xf8),
        (95, 0xf8),
        (134, 0xf0),
        (135, 0x3f),
        (138, 0xf8),
        (139, 0xfc),
    ];
    for (at, m) in expect {
        assert_eq!(req[at], m, "REQ byte {at}");
    }
    assert_eq!(req.iter().filter(|&&b| b == 0).count(), 8);

    let mra = defined_bits(CmAttributeId::MRA);
    assert_eq!((mra[8], mra[9]), (0xc0, 0xf8));
    let rej = defined_bits(CmAttributeId::REJ);
    assert_eq!((rej[8], rej[9]), (0xc0, 0xfe));
    let rep = defined_bits(CmAttributeId::REP);
    zero_ranges(&rep, &[(15, 16), (19, 20), (23, 24)]);
    assert_eq!((rep[26], rep[27]), (0xff, 0xf0));
    let dreq = defined_bits(CmAttributeId::DREQ);
    zero_ranges(&dreq, &[(11, 12)]);
    let lap = defined_bits(CmAttributeId::LAP);
    zero_ranges(&lap, &[(8, 12), (16, 20)]);
    assert_eq!(
        (lap[15], lap[58], lap[61], lap[62], lap[63]),
        (0xf8, 0xf0, 0x3f, 0xf8, 0xf8)
    );
    let apr = defined_bits(CmAttributeId::APR);
    zero_ranges(&apr, &[(10, 12)]);
    let sreq = defined_bits(CmAttributeId::SIDR_REQ);
    zero_ranges(&sreq, &[(6, 8)]);
    let srep = defined_bits(CmAttributeId::SIDR_REP);
    zero_ranges(&srep, &[(6, 8), (11, 12)]);
    let cpi = defined_bits(CmAttributeId::CLASS_PORT_INFO);
    zero_ranges(&cpi, &[(32, 33), (72, CM_PAYLOAD_LEN)]);
    assert!(cpi[..32].iter().all(|&b| b == 0xff));
    assert!(cpi[33..72].iter().all(|&b| b == 0xff));
    for attr in [CmAttributeId::RTU, CmAttributeId::DREP] {
        assert!(defined_bits(attr).iter().all(|&b| b == 0xff));
    }
}

#[test]
fn every_attribute_maps_to_its_message() {
    for attr in ATTRS {
        let msg = CmMessage::parse(attr, &[0; CM_PAYLOAD_LEN]).unwrap();
        assert_eq!(msg.attribute_id(), attr);
        assert!(attr.name().is_some());
    }
}

proptest! {
    #[test]
    fn cm_mad_parse_of_emit(m in cm_mad()) {
        let mut buf = [0u8; MAD_LEN];
        m.emit(&mut buf).unwrap();
        prop_assert_eq!(CmMadRepr::parse(&buf).unwrap(), m.clone());
        // The same through the generic MAD.
        let generic = MadRepr::parse(&buf).unwrap();
        prop_assert_eq!(generic.header, m.header());
        let mut again = [0u8; MAD_LEN];
        generic.emit(&mut again).unwrap();
        prop_assert_eq!(&again[..], &buf[..]);
    }

    #[test]
    fn message_parse_of_emit(m in message()) {
        let mut buf = [0x5au8; CM_PAYLOAD_LEN];
        m.emit(&mut buf).unwrap();
        prop_assert_eq!(CmMessage::parse(m.attribute_id(), &buf).unwrap(), m);
    }

    #[test]
    fn message_emit_of_parse(idx in 0usize..ATTRS.len(), raw in arr::<CM_PAYLOAD_LEN>()) {
        let attr = ATTRS[idx];
        let mask = defined_bits(attr);
        // Any 232 bytes parse; the defined bits come back unchanged.
        let msg = CmMessage::parse(attr, &raw).unwrap();
        let mut out = [0u8; CM_PAYLOAD_LEN];
        msg.emit(&mut out).unwrap();
        let masked: Vec<u8> = raw.iter().zip(mask).map(|(b, m)| b & m).collect();
        prop_assert_eq!(&out[..], &masked[..]);
    }

    #[test]
    fn mad_header_round_trip(raw in arr::<24>()) {
        let h = MadHeaderRepr::parse(&raw).unwrap();
        let mut out = [0u8; 24];
        h.emit(&mut out).unwrap();
        let mut expect = raw;
        expect[18] = 0;
        expect[19] = 0;
        prop_assert_eq!(out, expect);
        prop_assert_eq!(MadHeaderRepr::parse(&out).unwrap(), h);
    }

    #[test]
    fn ip_cm_header_round_trip(
        version in any::<u8>(),
        v6 in any::<bool>(),
        s in any::<u128>(),
        d in any::<u128>(),
        port in any::<u16>(),
    ) {
        let (src, dst) = if v6 {
            (IpAddr::V6(Ipv6Addr::from(s)), IpAddr::V6(Ipv6Addr::from(d)))
        } else {
            (IpAddr::V4(Ipv4Addr::from(s as u32)), IpAddr::V4(Ipv4Addr::from(d as u32)))
        };
        let h = IpCmHeaderRepr { version, src, dst, src_port: port };
        let mut buf = [0xffu8; 36];
        h.emit(&mut buf).unwrap();
        prop_assert_eq!(buf[1], if v6 { 0x60 } else { 0x40 });
        prop_assert_eq!(IpCmHeaderRepr::parse(&buf).unwrap(), h);
    }

    #[test]
    fn ip_cm_header_emit_of_parse(raw in arr::<36>()) {
        // Whatever parses re-emits to the same bytes, except the reserved nibble.
        if let Ok(h) = IpCmHeaderRepr::parse(&raw) {
            let mut out = [0u8; 36];
            h.emit(&mut out).unwrap();
            let mut expect = raw;
            expect[1] &= 0xf0;
            prop_assert_eq!(out, expect);
        }
    }

    #[test]
    fn service_id_split(ps in 0usize..4, port in any::<u16>(), junk in any::<u64>()) {
        let ps = [PortSpace::Tcp, PortSpace::Udp, PortSpace::Ib, PortSpace::IpoIb][ps];
        let sid = ServiceId::new(ps, port);
        prop_assert_eq!(sid.split(), Ok((ps, port)));
        prop_assert_eq!(sid.port(), port);
        if PortSpace::from_value((junk >> 16) as u16).is_none() || junk >> 32 != 0 {
            prop_assert!(ServiceId(junk).split().is_err());
        }
    }

    #[test]
    fn iba_time_ceil(ns in 0u64..(4096u64 << 31)) {
        let d = std::time::Duration::from_nanos(ns);
        let t = IbaTime::from_duration_ceil(d).unwrap();
        prop_assert!(t.to_duration() >= d);
        if t.value() > 0 {
            prop_assert!(IbaTime::new(t.value() - 1).unwrap().to_duration() < d);
        }
    }
}
