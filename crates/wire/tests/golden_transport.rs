//! Golden test of the transport layer against real Linux rxe traffic: every RoCEv2 packet of
//! `../shared/captures` parses, its ICRC verifies (IPv4 and IPv6), every BTH and extended
//! header field matches tshark's decode, it re-emits byte for byte (ICRC included), the IPv4
//! Identification can be recovered from the ICRC alone, and the malformed probes are rejected.
mod support;

use std::collections::BTreeMap;

use rdma_wire::aeth::AethSyndrome;
use rdma_wire::icrc::{self, Encap, IpInfo, Ipv4Info};
use rdma_wire::packet::{IcrcCheck, Packet, PacketRepr};
use support::{num, paren_num, Captured};

/// Packets whose ICRC the interop notes found valid: every RoCEv2 packet but the 4 probes.
const VALID_ROCE_PACKETS: usize = 1182;
const PROBES: usize = 4;

fn flag(p: &Captured, key: &str) -> bool {
    match p.value(key) {
        Some("True") => true,
        Some("False") => false,
        v => panic!("{}: {key} = {v:?}", p.label()),
    }
}

fn must<'a>(p: &'a Captured, key: &str) -> &'a str {
    p.value(key)
        .unwrap_or_else(|| panic!("{}: no {key:?} in decode", p.label()))
}

fn hex(v: &str) -> u64 {
    u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("bad hex {v:?}"))
}

/// The value of `key` in the decode lines after `section` (and before the next header line).
fn in_section<'a>(p: &'a Captured, section: &str, key: &str) -> &'a str {
    let start = p
        .decode
        .iter()
        .position(|(k, _)| k == section)
        .unwrap_or_else(|| panic!("{}: no section {section:?}", p.label()));
    p.decode[start + 1..]
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("{}: no {key:?} after {section:?}", p.label()))
}

fn check_bth(p: &Captured, repr: &PacketRepr) {
    let b = &repr.bth;
    let l = p.label();
    assert_eq!(
        paren_num(must(p, "Opcode")),
        u64::from(u8::from(b.opcode)),
        "{l}"
    );
    assert_eq!(flag(p, "Solicited Event"), b.se, "{l}");
    assert_eq!(flag(p, "MigReq"), b.mig_req, "{l}");
    assert_eq!(num(must(p, "Pad Count")), u64::from(b.pad_cnt), "{l}");
    assert_eq!(num(must(p, "Header Version")), 0, "{l}");
    assert_eq!(num(must(p, "Partition Key")), u64::from(b.p_key), "{l}");
    let resv8a = u8::from(b.fecn) << 7 | u8::from(b.becn) << 6 | b.resv6a;
    assert_eq!(
        hex(in_section(p, "Base Transport Header", "Reserved")),
        u64::from(resv8a),
        "{l}"
    );
    assert_eq!(
        num(must(p, "Destination Queue Pair")),
        u64::from(b.dest_qp),
        "{l}"
    );
    assert_eq!(flag(p, "Acknowledge Request"), b.ack_req, "{l}");
    assert_eq!(num(must(p, "Reserved (7 bits)")), u64::from(b.resv7), "{l}");
    assert_eq!(
        num(must(p, "Packet Sequence Number")),
        u64::from(b.psn),
        "{l}"
    );
}

/// Checks every extended header field; returns how many fields were compared.
fn check_ext(p: &Captured, repr: &PacketRepr) -> usize {
    let l = p.label();
    let has = |section: &str| p.value(section).is_some();
    let mut fields = 0;
    assert_eq!(
        has("DETH - Datagram Extended Transport Header"),
        repr.deth.is_some(),
        "{l}"
    );
    if let Some(d) = repr.deth {
        assert_eq!(num(must(p, "Queue Key")), u64::from(d.q_key), "{l}");
        assert_eq!(
            hex(in_section(
                p,
                "DETH - Datagram Extended Transport Header",
                "Reserved"
            )),
            u64::from(d.resv8)
        );
        assert_eq!(
            num(must(p, "Source Queue Pair")),
            u64::from(d.src_qp),
            "{l}"
        );
        fields += 3;
    }
    assert_eq!(
        has("RETH - RDMA Extended Transport Header"),
        repr.reth.is_some(),
        "{l}"
    );
    if let Some(r) = repr.reth {
        assert_eq!(num(must(p, "Virtual Address")), r.va, "{l}");
        assert_eq!(num(must(p, "Remote Key")), u64::from(r.r_key), "{l}");
        let len = must(p, "DMA Length");
        assert_eq!(num(len), u64::from(r.dma_len), "{l}");
        assert_eq!(paren_num(len), u64::from(r.dma_len), "{l}");
        fields += 3;
    }
    assert_eq!(
        has("AETH - ACK Extended Transport Header"),
        repr.aeth.is_some(),
        "{l}"
    );
    if let Some(a) = repr.aeth {
        let syndrome = a.syndrome.to_byte().unwrap();
        // "31, Ack"
        let text = must(p, "Syndrome");
        assert_eq!(
            num(text.split(',').next().unwrap()),
            u64::from(syndrome),
            "{l}: {text}"
        );
        assert_eq!(
            paren_num(in_section(
                p,
                "AETH - ACK Extended Transport Header",
                "OpCode"
            )),
            u64::from(syndrome >> 5)
        );
        match a.syndrome {
            AethSyndrome::Ack { credits } => {
                assert_eq!(num(must(p, "Credit Count")), u64::from(credits), "{l}")
            }
            AethSyndrome::RnrNak { timer } => {
                let v = must(p, "Timer");
                assert_eq!(paren_num(v), u64::from(timer.code()), "{l}");
                // "655.36 ms (0)": the duration tshark prints is the one our table gives.
                let ms: f64 = v.split_whitespace().next().unwrap().parse().unwrap();
                assert_eq!(
                    (ms * 1000.0).round() as u128,
                    timer.duration().as_micros(),
                    "{l}"
                );
                fields += 1;
            }
            AethSyndrome::Nak(code) => {
                assert_eq!(
                    paren_num(must(p, "Error Code")),
                    u64::from(code.code()),
                    "{l}"
                )
            }
        }
        assert_eq!(
            num(must(p, "Message Sequence Number")),
            u64::from(a.msn),
            "{l}"
        );
        fields += 4;
    }
    assert_eq!(
        has("AtomicETH - Atomic Extended Transport Header"),
        repr.atomic_eth.is_some(),
        "{l}"
    );
    if let Some(a) = repr.atomic_eth {
        assert_eq!(num(must(p, "Virtual Address")), a.va, "{l}");
        assert_eq!(num(must(p, "Remote Key")), u64::from(a.r_key), "{l}");
        assert_eq!(num(must(p, "Swap (Or Add) Data")), a.swap_add_data, "{l}");
        assert_eq!(num(must(p, "Compare Data")), a.compare_data, "{l}");
        fields += 4;
    }
    assert_eq!(
        has("ATOMICACKETH - Atomic ACK Extended Transport Header"),
        repr.atomic_ack_eth.is_some(),
        "{l}"
    );
    if let Some(a) = repr.atomic_ack_eth {
        assert_eq!(num(must(p, "Original Remote Data")), a.orig_rem_dt, "{l}");
        fields += 1;
    }
    assert_eq!(
        has("IMMDT - Immediate Data Extended Transport Header"),
        repr.imm_dt.is_some(),
        "{l}"
    );
    if let Some(imm) = repr.imm_dt {
        assert_eq!(hex(must(p, "Immediate Data")), u64::from(imm), "{l}");
        fields += 1;
    }
    assert_eq!(
        has("IETH - Invalidate Extended Transport Header"),
        repr.ieth.is_some(),
        "{l}"
    );
    if let Some(rkey) = repr.ieth {
        assert_eq!(hex(must(p, "RKey")), u64::from(rkey), "{l}");
        fields += 1;
    }
    assert!(repr.rdeth.is_none(), "{l}: no RD traffic in the captures");
    fields
}

#[derive(Default, Debug)]
struct Counts {
    packets: usize,
    ipv6: usize,
    ext_fields: usize,
    probes: usize,
}

#[test]
fn every_captured_packet_parses_verifies_matches_tshark_and_re_emits() {
    let mut per_case: BTreeMap<String, Counts> = BTreeMap::new();
    let mut icrc_lines = 0;
    for p in support::roce_packets() {
        let l = p.label();
        let c = per_case.entry(p.case.clone()).or_default();
        let encap =
            Encap::from_headers(&p.ip_header, &p.udp_header).unwrap_or_else(|e| panic!("{l}: {e}"));
        let pkt = Packet::new_unchecked(&p.payload[..]);
        if p.probe {
            let skip = PacketRepr::parse(&pkt, IcrcCheck::Skip);
            let exact = PacketRepr::parse(&pkt, IcrcCheck::Exact(&encap));
            println!(
                "{l}: probe rejected: {:?} / {:?}",
                skip.unwrap_err(),
                exact.unwrap_err()
            );
            assert!(Packet::new_checked(&p.payload[..]).is_err(), "{l}");
            c.probes += 1;
            continue;
        }
        let repr = PacketRepr::parse(&pkt, IcrcCheck::Exact(&encap))
            .unwrap_or_else(|e| panic!("{l}: {e}"));
        check_bth(&p, &repr);
        c.ext_fields += check_ext(&p, &repr);
        if let Some(v) = p.value("Invariant CRC") {
            // tshark prints the wire bytes; the CRC value is stored little-endian.
            assert_eq!(hex(v) as u32, pkt.icrc().swap_bytes(), "{l}");
            icrc_lines += 1;
        }
        if let Some((k, _)) = p
            .decode
            .iter()
            .find(|(k, _)| k.starts_with("Data (") && k.ends_with(" bytes)"))
        {
            let n: usize = k["Data (".len()..k.len() - " bytes)".len()]
                .parse()
                .unwrap();
            assert_eq!(n, pkt.payload().len(), "{l}");
        }
        assert!(
            pkt.pad().iter().all(|&b| b == 0),
            "{l}: rxe pads with zeros"
        );
        let mut out = vec![0u8; repr.buffer_len(pkt.payload().len())];
        let n = repr
            .emit(pkt.payload(), &mut out, Some(&encap))
            .unwrap_or_else(|e| panic!("{l}: {e}"));
        assert_eq!(n, p.payload.len(), "{l}");
        assert_eq!(out, p.payload, "{l}: re-emitted bytes differ");
        match encap.ip {
            IpInfo::V4(v4) => {
                // A receiver with only a UDP socket: Identification unknown, recovered from the ICRC.
                let unknown = Ipv4Info {
                    identification: 0,
                    ..v4
                };
                let id = icrc::recover_ipv4_identification(
                    &unknown,
                    encap.udp_src,
                    encap.udp_dst,
                    &p.payload,
                );
                assert_eq!(id, Ok(v4.identification), "{l}");
                let blind = Encap {
                    ip: IpInfo::V4(unknown),
                    ..encap
                };
                assert_eq!(
                    PacketRepr::parse(&pkt, IcrcCheck::AnyIpv4Id(&blind)),
                    Ok(repr),
                    "{l}"
                );
            }
            IpInfo::V6(_) => c.ipv6 += 1,
        }
        c.packets += 1;
    }
    let mut total = Counts::default();
    for (case, c) in &per_case {
        println!(
            "{case:>22}: {:4} packets checked ({} IPv6), {:4} extended-header fields, {} probes rejected",
            c.packets, c.ipv6, c.ext_fields, c.probes
        );
        total.packets += c.packets;
        total.ipv6 += c.ipv6;
        total.ext_fields += c.ext_fields;
        total.probes += c.probes;
    }
    println!(
        "{:>22}: {total:?}, {icrc_lines} tshark ICRC lines compared",
        "total"
    );
    assert_eq!(total.packets, VALID_ROCE_PACKETS);
    assert_eq!(total.probes, PROBES);
    assert!(total.ipv6 > 0, "IPv6 masking must be exercised");
}
