//! Golden tests: the CM MADs of the shared Linux rxe captures (`../shared/captures/`) fed into
//! a [`CmAgent`], whose answers must be those Linux gave (byte for byte where the values are
//! not random per run).

use std::path::{Path, PathBuf};

use rdma_proto::cm::*;
use rdma_wire::cm::{CmMadRepr, CmMessage, RejectReason};
use rdma_wire::mad::MAD_LEN;

/// One CM MAD from a capture.
#[derive(Debug, Clone)]
struct CapturedMad {
    frame: usize,
    src: CmPath,
    mad: [u8; MAD_LEN],
}

impl CapturedMad {
    fn parsed(&self) -> CmMadRepr {
        CmMadRepr::parse(&self.mad).unwrap()
    }
}

fn captures_dir() -> PathBuf {
    if let Ok(d) = std::env::var("RDMA_CAPTURES_DIR") {
        return PathBuf::from(d);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/captures")
}

fn u16be(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Every UD SEND to QP1 carrying a MAD in `case`.pcap (classic little-endian pcap, Ethernet).
fn cm_mads(case: &str) -> Vec<CapturedMad> {
    let path = captures_dir().join(format!("{case}.pcap"));
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&data[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "little-endian pcap");
    let mut out = Vec::new();
    let mut at = 24;
    let mut frame = 0;
    while at + 16 <= data.len() {
        let incl = u32::from_le_bytes(data[at + 8..at + 12].try_into().unwrap()) as usize;
        let pkt = &data[at + 16..at + 16 + incl];
        at += 16 + incl;
        frame += 1;
        let (src, l4) = match u16be(pkt, 12) {
            0x0800 => {
                let ip = &pkt[14..];
                let ihl = usize::from(ip[0] & 0x0f) * 4;
                let s = std::net::Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
                (s.to_ipv6_mapped(), &ip[ihl..])
            }
            0x86dd => {
                let ip = &pkt[14..];
                let s: [u8; 16] = ip[8..24].try_into().unwrap();
                (std::net::Ipv6Addr::from(s), &ip[40..])
            }
            _ => continue,
        };
        if u16be(l4, 2) != 4791 {
            continue;
        }
        let payload = &l4[8..];
        // BTH opcode 0x64 (UD SEND Only) to QP 1.
        if payload.len() < 20 + MAD_LEN || payload[0] != 0x64 || payload[5..8] != [0, 0, 1] {
            continue;
        }
        let mad: [u8; MAD_LEN] = payload[20..20 + MAD_LEN].try_into().unwrap();
        out.push(CapturedMad {
            frame,
            src: CmPath::new(std::net::Ipv6Addr::UNSPECIFIED, src, 1),
            mad,
        });
    }
    out
}

fn agent(guid: u64) -> CmAgent {
    CmAgent::new(AgentConfig {
        ca_guid: guid,
        seed: 0x5eed,
        ..AgentConfig::default()
    })
}

fn sent(a: &mut CmAgent) -> Vec<(CmPath, [u8; MAD_LEN])> {
    std::iter::from_fn(|| a.poll_transmit().map(|t| (t.path, t.mad))).collect()
}

/// Overwrites the 4-byte local comm id (first field of REJ/MRA, at MAD byte 24).
fn with_local_comm_id(mut mad: [u8; MAD_LEN], id: u32) -> [u8; MAD_LEN] {
    mad[24..28].copy_from_slice(&id.to_be_bytes());
    mad
}

#[test]
fn no_listener_answers_exactly_as_linux() {
    let mads = cm_mads("cm-reject-nolistener");
    assert_eq!(mads.len(), 4);
    for pair in mads.chunks(2) {
        let (req, linux_rej) = (&pair[0], &pair[1]);
        assert!(matches!(req.parsed().message, CmMessage::Req(_)));
        let mut b = agent(0x5054_00ff_fe00_0203);
        b.handle_mad(0, req.src, &req.mad);
        let out = sent(&mut b);
        assert_eq!(out.len(), 1, "frame {}", req.frame);
        assert_eq!(out[0].0, req.src);
        assert_eq!(
            out[0].1, linux_rej.mad,
            "frame {}: REJ 8 differs",
            linux_rej.frame
        );
        assert!(b.poll_event().is_none());
        assert_eq!(b.conn_count(), 0);
    }
}

/// Every REQ of every capture: a listener reports it with its fields and answers nothing
/// until the application does; the REP echoes the TID and names the requester's comm id.
#[test]
fn every_captured_req_reaches_a_listener() {
    let dir = captures_dir();
    let mut cases: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .into_string()
                .ok()?
                .strip_suffix(".pcap")
                .map(String::from)
        })
        .collect();
    cases.sort();
    let mut n = 0;
    for case in cases {
        for m in cm_mads(&case) {
            let parsed = m.parsed();
            let CmMessage::Req(req) = parsed.message else {
                continue;
            };
            n += 1;
            let mut b = agent(0x5054_00ff_fe00_0203);
            b.listen(req.service_id).unwrap();
            b.handle_mad(0, m.src, &m.mad);
            let Some(CmEvent::ReqReceived(ev)) = b.poll_event() else {
                panic!("{case} frame {}: no ReqReceived", m.frame)
            };
            assert_eq!(*ev.req, req);
            assert_eq!(ev.path, m.src);
            assert!(
                sent(&mut b).is_empty(),
                "{case}: nothing sent before accept"
            );
            b.send_rep(0, ev.conn, RepParams::new(0x12, 0x00ab_cdef))
                .unwrap();
            let out = sent(&mut b);
            let rep = CmMadRepr::parse(&out[0].1).unwrap();
            assert_eq!(rep.transaction_id, parsed.transaction_id);
            let CmMessage::Rep(rep) = rep.message else {
                panic!()
            };
            assert_eq!(rep.remote_comm_id, req.local_comm_id);
            // The same REQ again is a duplicate: the REP is resent, no new connection.
            b.handle_mad(1, m.src, &m.mad);
            assert!(b.poll_event().is_none());
            assert_eq!(b.conn_count(), 1);
        }
    }
    // every REQ of the captures, counted exactly: a REQ the reader missed fails here
    assert_eq!(n, CAPTURED_REQS, "REQs found in the captures");
}

/// REQs in `../shared/captures/*.pcap` (retransmissions included).
const CAPTURED_REQS: usize = 47;

#[test]
fn duplicate_req_gets_the_mra_linux_sent() {
    let mads = cm_mads("cm-req-dup");
    let req = &mads[0];
    assert_eq!(mads[1].mad, req.mad, "frame 2 is the retransmitted REQ");
    let linux_mra = &mads[2];
    assert!(matches!(linux_mra.parsed().message, CmMessage::Mra(_)));
    let mut b = agent(0x5054_00ff_fe00_0203);
    let CmMessage::Req(r) = req.parsed().message else {
        panic!()
    };
    b.listen(r.service_id).unwrap();
    b.handle_mad(0, req.src, &req.mad);
    let Some(CmEvent::ReqReceived(ev)) = b.poll_event() else {
        panic!()
    };
    assert!(sent(&mut b).is_empty());
    b.handle_mad(6_260_000_000, mads[1].src, &mads[1].mad);
    let out = sent(&mut b);
    assert_eq!(out.len(), 1);
    let ours = b.local_comm_id(ev.conn).unwrap();
    assert_eq!(
        out[0].1,
        with_local_comm_id(linux_mra.mad, ours),
        "MRA differs"
    );
}

#[test]
fn consumer_reject_matches_linux() {
    let mads = cm_mads("cm-consumer-reject");
    let (req, linux_rej) = (&mads[0], &mads[1]);
    let CmMessage::Req(r) = req.parsed().message else {
        panic!()
    };
    let CmMessage::Rej(lr) = linux_rej.parsed().message else {
        panic!()
    };
    assert_eq!(lr.reason, RejectReason::ConsumerDefined);
    let mut b = agent(0x5054_00ff_fe00_0203);
    b.listen(r.service_id).unwrap();
    b.handle_mad(0, req.src, &req.mad);
    let Some(CmEvent::ReqReceived(ev)) = b.poll_event() else {
        panic!()
    };
    b.send_rej(
        0,
        ev.conn,
        RejectReason::ConsumerDefined,
        &[],
        &lr.private_data,
    )
    .unwrap();
    let out = sent(&mut b);
    let ours = b.local_comm_id(ev.conn).unwrap();
    assert_eq!(
        out[0].1,
        with_local_comm_id(linux_rej.mad, ours),
        "REJ 28 differs"
    );
}

#[test]
fn destroy_in_req_sent_rejects_like_linux() {
    let mads = cm_mads("cm-req-timeout");
    let reqs: Vec<_> = mads
        .iter()
        .filter(|m| matches!(m.parsed().message, CmMessage::Req(_)))
        .collect();
    assert_eq!(reqs.len(), 6);
    assert!(
        reqs.iter().all(|m| m.mad == reqs[0].mad),
        "retransmissions are identical"
    );
    let linux_rej = mads
        .iter()
        .find(|m| matches!(m.parsed().message, CmMessage::Rej(_)))
        .unwrap();
    let CmMessage::Req(r) = reqs[0].parsed().message else {
        panic!()
    };
    let mut a = agent(r.local_ca_guid);
    let peer = CmPath::new(
        std::net::Ipv6Addr::UNSPECIFIED,
        r.primary_path.remote_port_gid,
        1,
    );
    let conn = a
        .send_req(
            0,
            ReqParams::new(r.service_id, peer, r.local_qpn, r.starting_psn),
        )
        .unwrap();
    sent(&mut a);
    a.destroy(40_000_000_000, conn).unwrap();
    let out = sent(&mut a);
    // Same REJ as Linux's but for the comm id and transaction id, which are random per run.
    let mut expected = with_local_comm_id(linux_rej.mad, 0);
    let ours = CmMadRepr::parse(&out[0].1).unwrap();
    let CmMessage::Rej(x) = &ours.message else {
        panic!()
    };
    expected = with_local_comm_id(expected, x.local_comm_id);
    expected[8..16].copy_from_slice(&ours.transaction_id.to_be_bytes());
    assert_eq!(out[0].1, expected, "REJ 4 differs");
}

#[test]
fn captured_conversation_replayed_into_passive_agent() {
    // cmtime-10: 10 REQs, our REPs, then Linux's RTUs and DREQs are addressed to Linux's comm
    // ids, not ours: they must change nothing and get no answer but the DREP Linux gives to
    // a DREQ for an unknown connection.
    let mads = cm_mads("cmtime-10");
    let mut b = agent(0x5054_00ff_fe00_0203);
    let mut listening = false;
    let mut conns = Vec::new();
    let (mut rtus, mut dreqs) = (0, 0);
    for m in &mads {
        let p = m.parsed();
        match p.message {
            CmMessage::Req(r) => {
                if !listening {
                    b.listen(r.service_id).unwrap();
                    listening = true;
                }
                b.handle_mad(0, m.src, &m.mad);
                let Some(CmEvent::ReqReceived(ev)) = b.poll_event() else {
                    panic!()
                };
                b.send_rep(0, ev.conn, RepParams::new(0x30, 1)).unwrap();
                let out = sent(&mut b);
                assert_eq!(out.len(), 1, "frame {}: one REP", m.frame);
                assert_eq!(out[0].0, m.src);
                assert!(matches!(
                    CmMadRepr::parse(&out[0].1).unwrap().message,
                    CmMessage::Rep(_)
                ));
                conns.push(ev.conn);
            }
            CmMessage::Rtu(_) if from_vm1(m) => {
                b.handle_mad(0, m.src, &m.mad);
                rtus += 1;
                assert!(sent(&mut b).is_empty(), "frame {}: RTU answered", m.frame);
                assert!(b.poll_event().is_none(), "frame {}: RTU event", m.frame);
            }
            CmMessage::Dreq(d) if from_vm1(m) => {
                b.handle_mad(0, m.src, &m.mad);
                dreqs += 1;
                assert!(b.poll_event().is_none(), "frame {}: DREQ event", m.frame);
                // the DREP Linux gives a DREQ for no connection: to the sender, naming the
                // ids swapped, with the DREQ's TID: byte for byte the DREP Linux sent
                let out = sent(&mut b);
                assert_eq!(out.len(), 1, "frame {}: one DREP", m.frame);
                assert_eq!(out[0].0, m.src);
                let ours = CmMadRepr::parse(&out[0].1).unwrap();
                assert_eq!(ours.transaction_id, p.transaction_id);
                let CmMessage::Drep(x) = ours.message else {
                    panic!("frame {}: {:?}", m.frame, ours.message)
                };
                assert_eq!(
                    (x.local_comm_id, x.remote_comm_id),
                    (d.remote_comm_id, d.local_comm_id)
                );
                let linux = mads
                    .iter()
                    .find(|l| {
                        !from_vm1(l)
                            && matches!(l.parsed().message, CmMessage::Drep(_))
                            && l.parsed().transaction_id == p.transaction_id
                    })
                    .expect("Linux's DREP for this DREQ");
                assert_eq!(out[0].1, linux.mad, "frame {}: DREP differs", m.frame);
            }
            _ => {}
        }
    }
    assert_eq!(conns.len(), 10);
    assert_eq!((rtus, dreqs), (10, 10), "RTUs and DREQs replayed");
    assert!(conns.iter().all(|c| b.state(*c) == Some(CmState::RepSent)));
    assert_eq!(
        b.stats().unmatched,
        20,
        "the RTUs and DREQs name Linux's comm ids"
    );
}

/// Sent by vm1 (192.0.2.2), the client of every capture.
fn from_vm1(m: &CapturedMad) -> bool {
    m.src.remote_gid.octets()[15] == 2
}
