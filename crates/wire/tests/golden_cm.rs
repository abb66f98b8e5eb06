//! Golden vectors: every CM MAD in `../shared/captures/` (Linux 6.1 ib_cm over rxe) is parsed,
//! checked field by field against tshark's decode (or, for the MRA and SIDR messages tshark
//! 4.0 does not dissect, against the facts in `captures/README.md`), and re-emitted byte for
//! byte.
//!
//! tshark 4.0 quirk: it reads the REQ's flow label word as 24 bits, so its "Primary Flow
//! Label" is our 20-bit label shifted right by 8, and its "Primary Packet Rate" is the low
//! 6 bits of the label's first byte. We check those consistently with that reading; the real
//! packet rate (byte 91) is 0 in every capture.
mod support;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rdma_wire::cm::*;
use rdma_wire::ip_cm::{IpCmHeaderRepr, PortSpace, ServiceId};
use rdma_wire::mad::{method, Mad, MadHeaderRepr, MAD_LEN};
use rdma_wire::time::IbaTime;
use support::{num, paren_num, Captured};

/// The decode lines after the line whose key is `title` (the CM message's own section).
fn section<'a>(p: &'a Captured, title: &str) -> &'a [(String, String)] {
    let at = p
        .decode
        .iter()
        .position(|(k, _)| k == title)
        .unwrap_or_else(|| panic!("{}: no {title:?} in decode", p.label()));
    &p.decode[at + 1..]
}

fn field<'a>(sec: &'a [(String, String)], key: &str, label: &str) -> &'a str {
    sec.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("{label}: no {key:?} in the CM section"))
}

/// Checks a numeric field tshark decodes.
fn check(sec: &[(String, String)], key: &str, ours: u64, label: &str) {
    let theirs = num(field(sec, key, label));
    assert_eq!(ours, theirs, "{label}: {key}");
}

/// tshark prints long byte fields as a hex prefix ending in "…".
fn check_hex_prefix(sec: &[(String, String)], key: &str, ours: &[u8], label: &str) {
    let v = field(sec, key, label).trim_end_matches('…');
    let ours_hex: String = ours.iter().map(|b| format!("{b:02x}")).collect();
    assert!(
        !v.is_empty() && ours_hex.starts_with(v),
        "{label}: {key}: tshark {v}, ours {ours_hex}"
    );
}

/// A GID as tshark prints it: dotted IPv4 for IPv4-mapped, IPv6 text, or 32 hex digits.
fn check_gid(sec: &[(String, String)], key: &str, ours: Ipv6Addr, label: &str) {
    let v = field(sec, key, label);
    let theirs = if v.contains('.') {
        v.parse::<Ipv4Addr>().unwrap().to_ipv6_mapped()
    } else if v.contains(':') {
        v.parse::<Ipv6Addr>().unwrap()
    } else {
        Ipv6Addr::from(u128::from_str_radix(v, 16).unwrap())
    };
    assert_eq!(ours, theirs, "{label}: {key}");
}

fn check_ip(sec: &[(String, String)], key: &str, ours: IpAddr, label: &str) {
    let theirs: IpAddr = field(sec, key, label).parse().unwrap();
    assert_eq!(ours, theirs, "{label}: {key}");
}

fn t(x: IbaTime) -> u64 {
    x.value().into()
}

/// The IP source and destination of the datagram.
fn ip_addrs(p: &Captured) -> (IpAddr, IpAddr) {
    let h = &p.ip_header;
    if p.is_ipv6() {
        let s: [u8; 16] = h[8..24].try_into().unwrap();
        let d: [u8; 16] = h[24..40].try_into().unwrap();
        (IpAddr::from(s), IpAddr::from(d))
    } else {
        let s: [u8; 4] = h[12..16].try_into().unwrap();
        let d: [u8; 4] = h[16..20].try_into().unwrap();
        (IpAddr::from(s), IpAddr::from(d))
    }
}

fn check_header(p: &Captured, mad: &[u8], h: &MadHeaderRepr) {
    let l = p.label();
    let d = &p.decode;
    check(d, "Base Version", h.base_version.into(), &l);
    check(d, "Management Class", h.mgmt_class.into(), &l);
    check(d, "Class Version", h.class_version.into(), &l);
    let m = u64::from(h.method) | if h.r_bit { 0x80 } else { 0 };
    assert_eq!(m, paren_num(field(d, "Method", &l)), "{l}: Method");
    assert_eq!(h.method, method::SEND, "{l}: CM messages use Send");
    check(d, "Status", h.status.into(), &l);
    check(d, "Class Specific", h.class_specific.into(), &l);
    check(d, "Transaction ID", h.transaction_id, &l);
    check(d, "Attribute ID", h.attribute_id.into(), &l);
    check(d, "Attribute Modifier", h.attribute_modifier.into(), &l);
    check_hex_prefix(d, "MAD Data Payload", &mad[24..], &l);
}

fn check_req(p: &Captured, r: &ReqRepr) {
    let l = p.label();
    let s = section(p, "CM ConnectRequest");
    check(s, "Local Communication ID", r.local_comm_id.into(), &l);
    let prefix = u64::from_str_radix(field(s, "Prefix", &l), 16).unwrap();
    let sid = (prefix << 24)
        | (num(field(s, "Protocol", &l)) << 16)
        | num(field(s, "Destination Port", &l));
    assert_eq!(r.service_id, sid, "{l}: ServiceID");
    check(s, "Local CA GUID", r.local_ca_guid, &l);
    check(s, "Local Q_Key", r.local_q_key.into(), &l);
    check(s, "Local QPN", r.local_qpn.into(), &l);
    check(s, "Responder Resources", r.responder_resources.into(), &l);
    check(s, "Local EECN", r.local_eecn.into(), &l);
    check(s, "Initiator Depth", r.initiator_depth.into(), &l);
    check(s, "Remote EECN", r.remote_eecn.into(), &l);
    check(
        s,
        "Remote CM Response Timeout",
        t(r.remote_cm_response_timeout),
        &l,
    );
    check(
        s,
        "Transport Service Type",
        r.transport_service_type.into(),
        &l,
    );
    check(
        s,
        "End-to-End Flow Control",
        r.end_to_end_flow_control.into(),
        &l,
    );
    check(s, "Starting PSN", r.starting_psn.into(), &l);
    check(
        s,
        "Local CM Response Timeout",
        t(r.local_cm_response_timeout),
        &l,
    );
    check(s, "Retry Count", r.retry_count.into(), &l);
    check(s, "Partition Key", r.partition_key.into(), &l);
    check(
        s,
        "Path Packet Payload MTU",
        r.path_packet_payload_mtu.into(),
        &l,
    );
    check(s, "RDC Exists", r.rdc_exists.into(), &l);
    check(s, "RNR Retry Count", r.rnr_retry_count.into(), &l);
    check(s, "Max CM Retries", r.max_cm_retries.into(), &l);
    check(s, "SRQ", r.srq.into(), &l);
    check(
        s,
        "Extended Transport",
        r.extended_transport_type.into(),
        &l,
    );
    for (name, path) in [
        ("Primary", &r.primary_path),
        ("Alternate", &r.alternate_path),
    ] {
        let k = |f: &str| format!("{name} {f}");
        check(s, &k("Local Port LID"), path.local_port_lid.into(), &l);
        check(s, &k("Remote Port LID"), path.remote_port_lid.into(), &l);
        check_gid(s, &k("Local Port GID"), path.local_port_gid, &l);
        check_gid(s, &k("Remote Port GID"), path.remote_port_gid, &l);
        // tshark 4.0 reads the flow-label word as 24 bits (see the file comment).
        check(s, &k("Flow Label"), (path.flow_label >> 8).into(), &l);
        check(
            s,
            &k("Packet Rate"),
            ((path.flow_label >> 12) & 0x3f).into(),
            &l,
        );
        assert_eq!(path.packet_rate, 0, "{l}: {name} packet rate (byte 91)");
        check(s, &k("Traffic Class"), path.traffic_class.into(), &l);
        check(s, &k("Hop Limit"), path.hop_limit.into(), &l);
        check(s, &k("SL"), path.sl.into(), &l);
        check(s, &k("Subnet Local"), path.subnet_local.into(), &l);
        check(s, &k("Local ACK Timeout"), t(path.local_ack_timeout), &l);
    }
    // The IP CM header of rdma_cm.
    let h = IpCmHeaderRepr::parse(&r.private_data).unwrap_or_else(|e| panic!("{l}: {e}"));
    check(s, "IP CM Major Version", (h.version >> 4).into(), &l);
    check(s, "IP CM Minor Version", (h.version & 0xf).into(), &l);
    let ipv = if h.src.is_ipv4() { 4 } else { 6 };
    check(s, "IP CM IP Version", ipv, &l);
    check(s, "IP CM Source Port", h.src_port.into(), &l);
    check_ip(s, "IP CM Source IP", h.src, &l);
    check_ip(s, "IP CM Destination IP", h.dst, &l);
    check_hex_prefix(s, "IP CM Consumer PrivateData", &r.private_data[36..], &l);
    // Cross-checks with the datagram: the requester's address is the IP source; the GIDs
    // are the IP addresses (IPv4-mapped for IPv4).
    let (src, dst) = ip_addrs(p);
    assert_eq!(h.src, src, "{l}: IP CM source = IP source");
    let gid = |a: IpAddr| match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    };
    assert_eq!(r.primary_path.local_port_gid, gid(src), "{l}");
    assert_eq!(r.primary_path.remote_port_gid, gid(dst), "{l}");
    let (ps, _) = ServiceId(r.service_id).split().unwrap();
    assert_eq!(ps, PortSpace::Tcp, "{l}");
}

fn check_rej(p: &Captured, r: &RejRepr) {
    let l = p.label();
    let s = section(p, "CM ConnectReject");
    check(s, "Local Communication ID", r.local_comm_id.into(), &l);
    check(s, "Remote Communication ID", r.remote_comm_id.into(), &l);
    check(
        s,
        "Message REJected",
        u8::from(r.message_rejected).into(),
        &l,
    );
    check(s, "Reject Info Length", r.reject_info_length.into(), &l);
    check(s, "Reason", u16::from(r.reason).into(), &l);
    check_hex_prefix(
        s,
        "Additional Reject Information (ARI)",
        &r.additional_reject_information,
        &l,
    );
    check_hex_prefix(s, "PrivateData", &r.private_data, &l);
    assert!(!matches!(r.reason, RejectReason::Other(_)), "{l}");
}

fn check_rep(p: &Captured, r: &RepRepr) {
    let l = p.label();
    let s = section(p, "CM ConnectReply");
    check(s, "Local Communication ID", r.local_comm_id.into(), &l);
    check(s, "Remote Communication ID", r.remote_comm_id.into(), &l);
    check(s, "Local Q_Key", r.local_q_key.into(), &l);
    check(s, "Local QPN", r.local_qpn.into(), &l);
    check(
        s,
        "Local EE Context Number",
        r.local_ee_context_number.into(),
        &l,
    );
    check(s, "Starting PSN", r.starting_psn.into(), &l);
    check(s, "Responder Resources", r.responder_resources.into(), &l);
    check(s, "Initiator Depth", r.initiator_depth.into(), &l);
    check(s, "Target ACK Delay", t(r.target_ack_delay), &l);
    check(s, "Failover Accepted", r.failover_accepted.into(), &l);
    check(
        s,
        "End-To-End Flow Control",
        r.end_to_end_flow_control.into(),
        &l,
    );
    check(s, "RNR Retry Count", r.rnr_retry_count.into(), &l);
    check(s, "SRQ", r.srq.into(), &l);
    check(s, "Local CA GUID", r.local_ca_guid, &l);
    check_hex_prefix(s, "PrivateData", &r.private_data, &l);
}

fn check_comm_ids(p: &Captured, title: &str, local: u32, remote: u32, pd: &[u8]) {
    let l = p.label();
    let s = section(p, title);
    check(s, "Local Communication ID", local.into(), &l);
    check(s, "Remote Communication ID", remote.into(), &l);
    check_hex_prefix(s, "PrivateData", pd, &l);
}

/// What the run saw, per case: message counts and the values later checks need.
#[derive(Default)]
struct CaseLog {
    counts: BTreeMap<&'static str, usize>,
    req_comm_ids: Vec<u32>,
    rep_comm_ids: Vec<u32>,
    mras: Vec<(String, MraRepr)>,
    rejs: Vec<RejRepr>,
    sidr_reqs: Vec<(String, SidrReqRepr, IpAddr, IpAddr)>,
    sidr_reps: Vec<(String, SidrRepRepr)>,
}

#[test]
fn every_cm_mad_matches_tshark_and_re_emits_byte_for_byte() {
    let mut cases: BTreeMap<String, CaseLog> = BTreeMap::new();
    for p in support::roce_packets() {
        if p.probe || p.payload.first() != Some(&0x64) || p.payload.get(5..8) != Some(&[0, 0, 1]) {
            continue;
        }
        let l = p.label();
        let mad = &p.payload[20..20 + MAD_LEN];
        assert_eq!(
            p.payload.len(),
            20 + MAD_LEN + 4,
            "{l}: BTH + DETH + MAD + ICRC"
        );
        let view = Mad::new_cm_checked(mad).unwrap_or_else(|e| panic!("{l}: {e}"));
        let header = MadHeaderRepr::parse(view.header_bytes()).unwrap();
        let m = CmMadRepr::parse(mad).unwrap_or_else(|e| panic!("{l}: {e}"));
        assert_eq!(m.header(), header, "{l}");
        check_header(&p, mad, &header);

        let mut out = [0u8; MAD_LEN];
        m.emit(&mut out).unwrap();
        assert_eq!(&out[..], mad, "{l}: re-emitted MAD differs");

        let log = cases.entry(p.case.clone()).or_default();
        let name = m.message.attribute_id().name().unwrap();
        *log.counts.entry(name).or_default() += 1;
        match &m.message {
            CmMessage::Req(r) => {
                check_req(&p, r);
                log.req_comm_ids.push(r.local_comm_id);
            }
            CmMessage::Rej(r) => {
                check_rej(&p, r);
                log.rejs.push(r.clone());
            }
            CmMessage::Rep(r) => {
                check_rep(&p, r);
                log.rep_comm_ids.push(r.local_comm_id);
            }
            CmMessage::Rtu(r) => check_comm_ids(
                &p,
                "CM ReadyToUse",
                r.local_comm_id,
                r.remote_comm_id,
                &r.private_data,
            ),
            CmMessage::Dreq(r) => {
                check_comm_ids(
                    &p,
                    "CM DisconnectRequest",
                    r.local_comm_id,
                    r.remote_comm_id,
                    &r.private_data,
                );
                check(
                    section(&p, "CM DisconnectRequest"),
                    "Remote QPN/EECN",
                    r.remote_qpn_eecn.into(),
                    &l,
                );
            }
            CmMessage::Drep(r) => check_comm_ids(
                &p,
                "CM DisconnectReply",
                r.local_comm_id,
                r.remote_comm_id,
                &r.private_data,
            ),
            CmMessage::Mra(r) => {
                section(&p, "CM MsgRcptAck (Dissector Not Implemented)");
                log.mras.push((l, r.clone()));
            }
            CmMessage::SidrReq(r) => {
                section(&p, "CM ServiceIDResReq (Dissector Not Implemented)");
                let (src, dst) = ip_addrs(&p);
                log.sidr_reqs.push((l, r.clone(), src, dst));
            }
            CmMessage::SidrRep(r) => {
                section(&p, "CM ServiceIDResReqResp (Dissector Not Implemented)");
                log.sidr_reps.push((l, r.clone()));
            }
            other => panic!("{l}: unexpected {other:?}"),
        }
    }

    let mut total = 0;
    for (case, log) in &cases {
        let n: usize = log.counts.values().sum();
        total += n;
        println!("{case}: {n} CM MADs {:?}", log.counts);
        check_mras(log);
        check_sidr(case, log);
    }
    println!("total: {total} CM MADs in {} cases", cases.len());

    // Facts from captures/README.md.
    let count = |case: &str, msg: &str| cases.get(case).and_then(|c| c.counts.get(msg)).copied();
    assert_eq!(count("cm-reject-nolistener", "REJ"), Some(2));
    assert_eq!(count("cm-req-timeout", "REQ"), Some(6));
    assert_eq!(count("cm-req-dup", "MRA"), Some(1));
    assert_eq!(count("cmtime-10", "REQ"), Some(10));
    assert_eq!(count("ud-send", "SIDR_REQ"), Some(1));
    assert_eq!(count("rping-2vm", "SIDR_REP"), Some(1));
    // every CM MAD of the captures, counted exactly
    assert_eq!(total, 206, "CM MADs in the captures");
    let rejs = |case: &str| cases[case].rejs.clone();
    for r in rejs("cm-reject-nolistener") {
        assert_eq!(r.reason, RejectReason::InvalidServiceId);
        assert_eq!((r.local_comm_id, r.message_rejected), (0, MessageRef::Req));
        assert!(cases["cm-reject-nolistener"]
            .req_comm_ids
            .contains(&r.remote_comm_id));
        assert!(r.ari().is_empty() && r.private_data.iter().all(|&b| b == 0));
    }
    let r = &rejs("cm-consumer-reject")[0];
    assert_eq!(r.reason, RejectReason::ConsumerDefined);
    assert!(r
        .private_data
        .starts_with(b"refvm-rej: consumer reject from cmrej server\0"));
    let r = &rejs("cm-req-timeout")[0];
    assert_eq!((r.reason, r.remote_comm_id), (RejectReason::Timeout, 0));
    assert_eq!(r.ari(), &0x5054_00ff_fe00_0202u64.to_be_bytes());
}

/// cm-req-dup: the MRA answers the duplicate REQ: Message MRAed 0 (REQ), service timeout
/// 24, remote comm id = the REQ's, local comm id = the later REP's, nothing else set.
fn check_mras(log: &CaseLog) {
    for (l, mra) in &log.mras {
        assert_eq!(mra.message_mraed, MessageRef::Req, "{l}");
        assert_eq!(mra.service_timeout, IbaTime::new(24).unwrap(), "{l}");
        assert!(log.req_comm_ids.contains(&mra.remote_comm_id), "{l}");
        assert!(log.rep_comm_ids.contains(&mra.local_comm_id), "{l}");
        assert!(mra.private_data.iter().all(|&b| b == 0), "{l}");
    }
}

/// ud-send and rping-2vm (udaddy): SIDR_REQ with P_Key 0xffff, a UDP port-space service id
/// and an IPv4 IP CM header matching the datagram; SIDR_REP echoing the request id and the
/// service id with status 0, a QPN and the rdma_cm UDP Q_Key 0x01234567.
fn check_sidr(case: &str, log: &CaseLog) {
    for (l, req, src, dst) in &log.sidr_reqs {
        assert_eq!(req.partition_key, 0xffff, "{l}");
        let (ps, port) = ServiceId(req.service_id).split().unwrap();
        assert_eq!(ps, PortSpace::Udp, "{l}");
        if case == "ud-send" {
            assert_eq!(req.service_id, 0x0000_0000_0111_4853, "{l}");
            assert_eq!(port, 18515, "{l}");
        }
        let h = IpCmHeaderRepr::parse(&req.private_data).unwrap();
        assert_eq!((h.version, h.src, h.dst), (0, *src, *dst), "{l}");
        assert_eq!(req.private_data[1], 0x40, "{l}");
        assert!(req.private_data[36..].iter().all(|&b| b == 0), "{l}");
        let (rl, rep) = log
            .sidr_reps
            .iter()
            .find(|(_, r)| r.request_id == req.request_id)
            .unwrap_or_else(|| panic!("{l}: no SIDR_REP"));
        assert_eq!(rep.status, SidrStatus::Success, "{rl}");
        assert_eq!(rep.service_id, req.service_id, "{rl}");
        assert_eq!(rep.q_key, 0x0123_4567, "{rl}");
        assert_eq!(rep.additional_information_length, 0, "{rl}");
        let qpn = if case == "ud-send" { 0x12 } else { 0x13 };
        assert_eq!(rep.qpn, qpn, "{rl}");
    }
    assert_eq!(log.sidr_reqs.len(), log.sidr_reps.len(), "{case}");
}
