//! The UDP source port on the wire, as Linux rxe sends it: every RC QP's datagrams (requests
//! and ACKs) leave from `0xC000 | fold(flow label)`, the label being the QP's address-vector
//! flow label or, when that is 0, one derived from both QPNs (the same port at both ends);
//! UD QPs and QP1 from `0xC000 + hash_32(qpn, 14)`. Checked on a veth between two namespace
//! hosts with a packet capture, with the data byte-exact; and the fallback: a port another
//! program holds makes the QP send from 4791, counted. Needs root.

mod common;

use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::device_with;
use rdma_soft::gsi::{GsiMad, MAD_LEN};
use rdma_soft::io::flow;
use rdma_soft::verbs::*;
use rdma_testhosts::capture::{Capture, Roce};
use rdma_testhosts::{require_root, topologies, Host, Topology};

const IP_A: &str = "192.0.2.1";
const IP_B: &str = "192.0.2.2";
/// Bytes each QP sends and writes.
const LEN: usize = 192 << 10;
/// Flow labels of the second pair's ends; their ports, folded by hand:
/// 0x5_1234: 0x1234 ^ 0x14 = 0x1220; 0xA_0F0F: 0x0F0F ^ 0x28 = 0x0F27.
const FL_A: u32 = 0x5_1234;
const FL_B: u32 = 0xA_0F0F;
const SPORT_FL_A: u16 = 0xD220;
const SPORT_FL_B: u16 = 0xCF27;
/// Hang guard of every wait.
const GUARD: Duration = Duration::from_secs(120);

/// The kernel's `rdma_calc_flow_label` then `rdma_flow_label_to_udp_sport`, written out
/// here from their definition (not through the crate).
fn derived_sport(lqpn: u32, rqpn: u32) -> u16 {
    let mut v = u64::from(lqpn) * u64::from(rqpn);
    v ^= v >> 20;
    v ^= v >> 40;
    let fl = (v & 0xF_FFFF) as u32;
    0xC000 | (((fl & 0x3FFF) ^ (fl >> 14)) & 0x3FFF) as u16
}

/// rxe's port of a QP that never gets an address vector: `0xC000 + hash_32(qpn, 14)`.
fn qpn_sport(qpn: u32) -> u16 {
    0xC000 + (qpn.wrapping_mul(0x61C8_8647) >> 18) as u16
}

fn pattern(len: usize, salt: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ salt as u8)
        .collect()
}

fn hosts() -> (Topology, Host, Host) {
    let topo = topologies::two_hosts_one_link().unwrap();
    let (a, b) = (topo.host("a").clone(), topo.host("b").clone());
    a.wait_carrier("eth0");
    b.wait_carrier("eth0");
    (topo, a, b)
}

/// One host's device with a PD, a CQ, RC QPs, and per QP a region of `2 * LEN` bytes (what
/// it sends, then what it receives).
struct End {
    qps: Vec<QueuePair>,
    mrs: Vec<MemoryRegion>,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    dev: Device,
    gid: [u8; 16],
}

fn end(h: &Host, ip: &'static str, qps: usize) -> End {
    // without GSO: the capture must see each ACK as a datagram of its own (under load an
    // ACK can go as the last segment of a GSO message of WRITE packets, which the capture
    // sees whole, with the WRITE's opcode)
    let udp = rdma_soft::io::UdpConfig {
        gso: false,
        ..Default::default()
    };
    let dev = h.run(|| device_with("eth0", ip, udp));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096, None).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mut init = QpInitAttr::rc(&cq, &cq);
    init.cap.max_send_wr = 64;
    init.cap.max_recv_wr = 64;
    let qps: Vec<QueuePair> = (0..qps).map(|_| pd.create_qp(&init).unwrap()).collect();
    let mrs = (0..qps.len())
        .map(|_| pd.register(vec![0u8; 2 * LEN], access).unwrap())
        .collect();
    let gid = ip.parse::<rdma_soft::io::WireAddr>().unwrap().gid();
    End {
        qps,
        mrs,
        cq,
        pd,
        dev,
        gid,
    }
}

/// Init -> RTR -> RTS towards `peer` at `dgid`, with address-vector flow label `fl`.
fn connect(qp: &QueuePair, peer: u32, dgid: [u8; 16], fl: u32) {
    use QpAttrMask as M;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        port_num: 1,
        ..QpAttr::default()
    };
    qp.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    a.qp_state = QpState::Rtr;
    a.path.dgid = dgid;
    a.path.hop_limit = 64;
    a.path.flow_label = fl;
    a.path_mtu = Mtu::Mtu1024;
    a.dest_qp_num = peer;
    a.rq_psn = 0x100;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    qp.modify(
        &a,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )
    .unwrap();
    a.qp_state = QpState::Rts;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0x100;
    a.max_rd_atomic = 1;
    qp.modify(
        &a,
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

/// `n` successful completions of `cq`.
fn completions(cq: &CompletionQueue, n: usize) -> Vec<Completion> {
    let end = Instant::now() + GUARD;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < end, "{} of {n} completions", got.len());
        let room = n - got.len();
        if cq.poll(&mut got, room) == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    for c in &got {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
    got
}

/// Over pair `k`: `a` SENDs its pattern to `b`, `b` WRITEs its pattern into `a`; both land
/// byte-exact.
fn transfer(a: &End, b: &End, k: usize) {
    let (pa, pb) = (pattern(LEN, 2 * k as u32), pattern(LEN, 2 * k as u32 + 1));
    a.mrs[k].write(0, &pa).unwrap();
    b.mrs[k].write(0, &pb).unwrap();
    b.qps[k]
        .post_recv(&RecvWr::new(1).with_sge(b.mrs[k].sge(LEN, LEN as u32).unwrap()))
        .unwrap();
    let send = SendWr::new(2, SendOp::Send)
        .with_sge(a.mrs[k].sge(0, LEN as u32).unwrap())
        .signaled();
    a.qps[k].post_send(&send).unwrap();
    let write = SendWr::new(
        3,
        SendOp::RdmaWrite {
            remote_addr: a.mrs[k].addr() + LEN as u64,
            rkey: a.mrs[k].rkey(),
        },
    )
    .with_sge(b.mrs[k].sge(0, LEN as u32).unwrap())
    .signaled();
    b.qps[k].post_send(&write).unwrap();
    completions(&a.cq, 1);
    completions(&b.cq, 2);
    let mut got = vec![0u8; LEN];
    b.mrs[k].read(LEN, &mut got).unwrap();
    assert!(got == pa, "pair {k}: the SEND arrived changed");
    a.mrs[k].read(LEN, &mut got).unwrap();
    assert!(got == pb, "pair {k}: the WRITE arrived changed");
}

/// The RoCEv2 datagrams to `dest_qp` from `src`, by source port.
fn sports(pkts: &[Roce], src: &str, dest_qp: u32) -> Vec<u16> {
    let src: IpAddr = src.parse().unwrap();
    let mut v: Vec<u16> = pkts
        .iter()
        .filter(|r| r.src == src && r.dest_qp == dest_qp)
        .map(|r| r.udp_sport)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn capture(h: &Host) -> rdma_testhosts::capture::Recording {
    h.run(|| Capture::open("eth0")).unwrap().record()
}

fn roce(pkts: Vec<Vec<u8>>) -> Vec<Roce> {
    pkts.iter().filter_map(|p| Roce::parse(p)).collect()
}

#[test]
fn rc_ud_and_mads_leave_from_linux_source_ports() {
    if !require_root("rc_ud_and_mads_leave_from_linux_source_ports") {
        return;
    }
    let (_topo, ha, hb) = hosts();
    let (a, b) = (end(&ha, IP_A, 2), end(&hb, IP_B, 2));
    let rec = capture(&hb);
    // pair 0: no flow label (derived from both QPNs); pair 1: a label per end
    let (a0, b0, a1, b1) = (
        a.qps[0].qpn(),
        b.qps[0].qpn(),
        a.qps[1].qpn(),
        b.qps[1].qpn(),
    );
    // in each host's namespace: RTR opens the address and the port's socket
    ha.run(|| connect(&a.qps[0], b0, b.gid, 0));
    hb.run(|| connect(&b.qps[0], a0, a.gid, 0));
    ha.run(|| connect(&a.qps[1], b1, b.gid, FL_A));
    hb.run(|| connect(&b.qps[1], a1, a.gid, FL_B));
    transfer(&a, &b, 0);
    transfer(&a, &b, 1);
    // IPv4: no socket connected to the peer (its Identification would not be 0)
    for e in [&a, &b] {
        let s = e.dev.wire_stats();
        assert_eq!((s.sent_connected, s.peer_sockets), (0, 0), "{s:?}");
    }

    // UD: a datagram from a UD QP of a to one of b
    let (ud_a, ud_b) = (ha.run(|| ud_end(&a)), hb.run(|| ud_end(&b)));
    let got = ud_exchange(&ha, &a, &ud_a, &ud_b, &b);
    assert!(got == pattern(512, 9), "the UD datagram arrived changed");

    // QP1: a MAD each way
    let (la, lb) = (IP_A.parse().unwrap(), IP_B.parse().unwrap());
    ha.run(|| a.dev.gsi_open(la)).unwrap();
    hb.run(|| b.dev.gsi_open(lb)).unwrap();
    let mut mad = [0u8; MAD_LEN];
    mad[..4].copy_from_slice(&[1, 7, 2, 3]);
    a.dev.gsi_send(&la, &lb, &mad).unwrap();
    let m = recv_mad(&b.dev);
    assert_eq!((m.remote, m.mad), (la, mad));
    b.dev.gsi_send(&lb, &la, &mad).unwrap();
    assert_eq!(recv_mad(&a.dev).remote, lb);

    let pkts = roce(rec.stop());
    let d0 = derived_sport(a0, b0);
    assert_eq!(d0, derived_sport(b0, a0), "the derived label is symmetric");
    assert_eq!(flow::flow_label_to_udp_sport(FL_A), SPORT_FL_A);
    assert_eq!(flow::flow_label_to_udp_sport(FL_B), SPORT_FL_B);
    for (what, src, dest, want) in [
        ("pair 0 a -> b", IP_A, b0, d0),
        ("pair 0 b -> a", IP_B, a0, d0),
        ("pair 1 a -> b", IP_A, b1, SPORT_FL_A),
        ("pair 1 b -> a", IP_B, a1, SPORT_FL_B),
        ("UD a -> b", IP_A, ud_b.qp.qpn(), qpn_sport(ud_a.qp.qpn())),
        ("QP1 a -> b", IP_A, 1, qpn_sport(1)),
        ("QP1 b -> a", IP_B, 1, qpn_sport(1)),
    ] {
        assert_eq!(sports(&pkts, src, dest), vec![want], "{what}: source ports");
    }
    assert_eq!(qpn_sport(1), flow::GSI_UDP_SPORT);
    // the port covers requests and ACKs: a sent SENDs and ACKed b's WRITEs, b the reverse
    // (the capture sees GSO messages whole, so datagrams are not counted)
    let ops = |src: &str, dest: u32| -> Vec<u8> {
        let src: IpAddr = src.parse().unwrap();
        let mut v: Vec<u8> = pkts
            .iter()
            .filter(|r| r.src == src && r.dest_qp == dest)
            .map(|r| r.opcode)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    const ACK: u8 = 0x11;
    for (src, dest, req) in [
        (IP_A, b0, 0x00..=0x04),
        (IP_B, a0, 0x06..=0x0A),
        (IP_A, b1, 0x00..=0x04),
        (IP_B, a1, 0x06..=0x0A),
    ] {
        let seen = ops(src, dest);
        assert!(
            seen.contains(&ACK),
            "{src} -> QP {dest:#x}: no ACK in {seen:x?}"
        );
        assert!(
            seen.iter().any(|o| req.contains(o)),
            "{src} -> QP {dest:#x}: no request in {seen:x?}"
        );
    }
    for e in [&a, &b] {
        let s = e.dev.wire_stats();
        assert_eq!(
            (s.icrc_errors, s.sport_fallback, s.send_errors),
            (0, 0, 0),
            "{s:?}"
        );
    }
}

#[test]
fn a_port_held_by_another_program_falls_back_to_4791() {
    if !require_root("a_port_held_by_another_program_falls_back_to_4791") {
        return;
    }
    let (_topo, ha, hb) = hosts();
    let (a, b) = (end(&ha, IP_A, 1), end(&hb, IP_B, 1));
    let (qa, qb) = (a.qps[0].qpn(), b.qps[0].qpn());
    let port = derived_sport(qa, qb);
    // a plain socket (no SO_REUSEPORT) on a's port of this connection
    let held = ha
        .run(|| UdpSocket::bind((IP_A, port)))
        .expect("bind the flow port first");
    let rec = capture(&hb);
    ha.run(|| connect(&a.qps[0], qb, b.gid, 0));
    hb.run(|| connect(&b.qps[0], qa, a.gid, 0));
    transfer(&a, &b, 0);
    let pkts = roce(rec.stop());
    assert_eq!(sports(&pkts, IP_A, qb), vec![4791], "a sends from 4791");
    assert_eq!(sports(&pkts, IP_B, qa), vec![port], "b keeps the flow port");
    let (sa, sb) = (a.dev.wire_stats(), b.dev.wire_stats());
    assert!(sa.sport_fallback > 0, "{sa:?}");
    assert_eq!(sb.sport_fallback, 0, "{sb:?}");
    assert_eq!((sa.icrc_errors, sb.icrc_errors), (0, 0));
    drop(held);
}

struct UdEnd {
    qp: QueuePair,
    mr: MemoryRegion,
    cq: CompletionQueue,
}

fn ud_end(e: &End) -> UdEnd {
    let cq = e.dev.create_cq(16, None).unwrap();
    let qp = e.pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    qp.ud_ready(0x77).unwrap();
    let mr =
        e.pd.register(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)
            .unwrap();
    UdEnd { qp, mr, cq }
}

/// One 512-byte datagram from `ua` (of `a`) to `ub` (of `b`); what arrived after the GRH.
fn ud_exchange(ha: &Host, a: &End, ua: &UdEnd, ub: &UdEnd, b: &End) -> Vec<u8> {
    let ah = ha
        .run(|| {
            a.pd.create_ah(&PathAttr {
                dgid: b.gid,
                ..PathAttr::default()
            })
        })
        .unwrap();
    ub.qp
        .post_recv(&RecvWr::new(5).with_sge(ub.mr.sge(0, 4096).unwrap()))
        .unwrap();
    ua.mr.write(0, &pattern(512, 9)).unwrap();
    let wr = SendWr::new(6, SendOp::Send)
        .with_sge(ua.mr.sge(0, 512).unwrap())
        .with_ud(ah.dest(ub.qp.qpn(), 0x77))
        .signaled();
    ua.qp.post_send(&wr).unwrap();
    completions(&ua.cq, 1);
    let c = completions(&ub.cq, 1);
    assert_eq!(c[0].byte_len, 40 + 512);
    let mut got = vec![0u8; 512];
    ub.mr.read(40, &mut got).unwrap();
    got
}

fn recv_mad(dev: &Device) -> GsiMad {
    let end = Instant::now() + GUARD;
    loop {
        if let Some(m) = dev.gsi_recv().unwrap() {
            return m;
        }
        assert!(Instant::now() < end, "no MAD");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// An RC SEND_ONLY packet to QP 0x11 of `len` bytes (ICRC room included) carrying `tag`.
fn raw_packet(tag: u8, len: usize) -> Vec<u8> {
    let mut p = vec![tag; len];
    p[..12].copy_from_slice(&[0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, tag]);
    p
}

#[test]
fn one_batch_leaves_from_each_datagrams_port_on_loopback() {
    use rdma_soft::io::{DatagramWire, TxMeta, UdpConfig, UdpWire, WireAddr};
    let port = 47961;
    let (la, lb): (WireAddr, WireAddr) = (
        "127.0.88.11".parse().unwrap(),
        "127.0.88.12".parse().unwrap(),
    );
    // made-up QPNs: wires that do not share
    let cfg = UdpConfig {
        port,
        share: false,
        ..UdpConfig::default()
    };
    let mut a = UdpWire::new(cfg.clone()).unwrap();
    a.open(la).unwrap();
    // interleaved ports in one batch: runs of equal size (GSO groups) per port
    let plan: Vec<(u16, u8)> = [0xC123, 0xC123, 0, 0xC123, 0xE001, 0xE001, 0, 0xE001]
        .iter()
        .enumerate()
        .map(|(k, &p)| (p, k as u8))
        .collect();
    let send_all = |a: &mut UdpWire| {
        for &(sport, tag) in &plan {
            let p = raw_packet(tag, 1040);
            a.send_from_port(la, lb, sport, TxMeta::default(), &p)
                .unwrap();
        }
        a.flush().unwrap();
    };
    // 1. a plain socket on lb sees each datagram's source port (0: the wire's own)
    let rx = UdpSocket::bind(("127.0.88.12", port)).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    send_all(&mut a);
    let mut seen = std::collections::HashMap::new();
    let mut buf = [0u8; 2048];
    for _ in 0..plan.len() {
        let (n, from) = rx.recv_from(&mut buf).expect("datagram");
        assert_eq!(n, 1040);
        seen.insert(buf[11], from.port());
    }
    for &(sport, tag) in &plan {
        let want = if sport == 0 { port } else { sport };
        assert_eq!(seen[&tag], want, "datagram {tag}: source port");
    }
    let s = a.stats();
    assert_eq!((s.sent, s.send_errors, s.sport_fallback), (8, 0, 0));
    assert_eq!(s.send_calls, 3, "one sendmmsg per socket of the batch");
    drop(rx);
    // 2. a wire on lb accepts them: each ICRC was sealed for its datagram's real port
    let mut b = UdpWire::new(cfg).unwrap();
    b.open(lb).unwrap();
    send_all(&mut a);
    let mut got = Vec::new();
    let end = Instant::now() + GUARD;
    while got.len() < plan.len() {
        assert!(
            Instant::now() < end,
            "{} of {} datagrams",
            got.len(),
            plan.len()
        );
        b.recv(&mut |_, pkt| got.push(pkt[11])).unwrap();
    }
    got.sort_unstable();
    assert_eq!(got, (0..8).collect::<Vec<u8>>());
    assert_eq!(b.stats().icrc_errors, 0);
    if a.stats().gso_refused == 0 {
        // the two pairs of equal port and size went as GSO messages: their second segments
        // carry IPv4 Identification 1, sealed for it on the port's own socket (checked for
        // it under UDP GRO, else recovered)
        let st = b.stats();
        assert_eq!(st.icrc_recovered_id + st.gro_coalesced, 2);
    }
}

/// A path prepared for an RC QP (`prepare_path`) over IPv6 sends from a socket connected to
/// its peer: the same source port and a valid ICRC, no destination per datagram; another
/// port still leaves from the port's unconnected socket. Over IPv4 nothing is connected
/// (its Identification would no longer be the 0 the ICRC was sealed for:
/// `kernel_identification.rs` checks the real headers).
#[test]
fn an_rc_path_leaves_from_a_socket_connected_to_its_peer() {
    use rdma_soft::io::{DatagramWire, TxMeta, UdpConfig, UdpWire, WireAddr};
    let cfg = |port| UdpConfig {
        port,
        share: false,
        ..UdpConfig::default()
    };
    // IPv6: one wire on ::1 sends to itself
    let l6: WireAddr = "::1".parse().unwrap();
    let mut w = UdpWire::new(cfg(47963)).unwrap();
    w.open(l6).unwrap();
    w.prepare_path(l6, 0xC125, l6);
    let plan = [(0xC125u16, 0u8), (0xC125, 1), (0xE003, 2)];
    for &(sport, tag) in &plan {
        w.send_from_port(l6, l6, sport, TxMeta::default(), &raw_packet(tag, 200))
            .unwrap();
    }
    w.flush().unwrap();
    let mut got = Vec::new();
    let end = Instant::now() + GUARD;
    while got.len() < plan.len() {
        assert!(Instant::now() < end, "{} of 3 datagrams", got.len());
        w.recv(&mut |_, pkt| got.push(pkt[11])).unwrap();
    }
    got.sort_unstable();
    assert_eq!(got, vec![0, 1, 2]);
    let s = w.stats();
    assert_eq!((s.sent, s.send_errors, s.sport_fallback), (3, 0, 0));
    assert_eq!(
        s.sent_connected, 2,
        "the prepared path's two datagrams: {s:?}"
    );
    assert_eq!(s.peer_sockets, 1);
    assert_eq!((s.icrc_errors, s.icrc_recovered_id), (0, 0));
    // IPv4: prepared, yet unconnected, and each datagram from its port
    let (la, lb): (WireAddr, WireAddr) = (
        "127.0.88.21".parse().unwrap(),
        "127.0.88.22".parse().unwrap(),
    );
    let mut a = UdpWire::new(cfg(47962)).unwrap();
    a.open(la).unwrap();
    a.prepare_path(la, 0xC124, lb);
    let rx = UdpSocket::bind(("127.0.88.22", 47962)).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    a.send_from_port(la, lb, 0xC124, TxMeta::default(), &raw_packet(3, 200))
        .unwrap();
    a.flush().unwrap();
    let mut buf = [0u8; 512];
    let (n, from) = rx.recv_from(&mut buf).expect("datagram");
    assert_eq!((n, buf[11], from.port()), (200, 3, 0xC124));
    let s = a.stats();
    assert_eq!(
        (s.sent, s.sent_connected, s.peer_sockets),
        (1, 0, 0),
        "{s:?}"
    );
}
