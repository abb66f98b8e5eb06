//! Multicast against Linux's wire (root; SKIPPED otherwise): the five group datagrams of
//! `../shared/captures/mckey-multicast.pcap` (Linux mckey sender, rxe, kernel 6.1) replayed
//! from their source address and port into our joined member, which takes every one
//! (ICRC, Q_Key, DQPN 0xFFFFFF), and our own sender's datagrams captured on the wire and
//! compared with Linux's, header by header.

mod support_mcast;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdma_testhosts::capture::{Capture, Roce};
use rdma_testhosts::{require_root, Topology};
use rdmacm::cm::McJoinFlags;
use rdmacm::verbs::{AccessFlags, SendOp, SendWr};
use support_mcast::*;

fn captures_dir() -> PathBuf {
    if let Ok(d) = std::env::var("RDMA_CAPTURES_DIR") {
        return PathBuf::from(d);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/captures")
}

/// The Ethernet frames of a classic pcap file.
fn pcap_frames(path: &Path) -> Vec<Vec<u8>> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        &b[..4],
        &[0xd4, 0xc3, 0xb2, 0xa1],
        "little-endian microsecond pcap"
    );
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= b.len() {
        let caplen = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push(b[at + 16..at + 16 + caplen].to_vec());
        at += 16 + caplen;
    }
    out
}

/// Linux's group datagrams: (IP packet, UDP source port).
fn linux_datagrams() -> Vec<Vec<u8>> {
    let frames = pcap_frames(&captures_dir().join("mckey-multicast.pcap"));
    assert_eq!(frames.len(), 5);
    for f in &frames {
        // to the group's MAC: 01:00:5e and the group's low 23 bits
        assert_eq!(f[..6], [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]);
        assert_eq!(
            rdmacm::cm::CmId::group_mac("239.1.2.3".parse().unwrap()).0,
            f[..6]
        );
    }
    frames.into_iter().map(|f| f[14..].to_vec()).collect()
}

/// `vm1` (192.0.2.2) and `vm2` (192.0.2.3) on one link, as in the capture.
fn vms() -> Topology {
    let t = Topology::builder("mcast-linux")
        .host("vm1")
        .host("vm2")
        .link("vm1", "eth0", "vm2", "eth0")
        .addr("vm1", "eth0", "192.0.2.2/24")
        .addr("vm2", "eth0", "192.0.2.3/24")
        .build()
        .expect("topology");
    t.host("vm1").wait_carrier("eth0");
    t.host("vm2").wait_carrier("eth0");
    t
}

#[test]
fn linux_group_datagrams_reach_our_member() {
    if !require_root("linux_group_datagrams_reach_our_member") {
        return;
    }
    let linux = linux_datagrams();
    let t = vms();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let vm2 = t.host("vm2").clone();
    let recv = std::thread::spawn(move || {
        vm2.run(move || {
            let mut m = Member::new("192.0.2.3:0", "239.1.2.3:0", 8, false);
            m.join(McJoinFlags::FullMember);
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            let mut got = Vec::new();
            let mut wc = Vec::new();
            let t0 = std::time::Instant::now();
            while got.len() < 5 && t0.elapsed() < T {
                wc.clear();
                m.cq.poll(&mut wc, 8);
                for c in &wc {
                    let mut buf = vec![0u8; GRH + 100];
                    m.mr.read(c.wr_id as usize * (GRH + SIZE), &mut buf)
                        .unwrap();
                    got.push((c.status, c.src_qp, c.imm(), c.byte_len, buf));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            (got, m.id.device().unwrap().wire_stats())
        })
    });
    ready_rx.recv_timeout(T).unwrap();
    let payloads: Vec<(u16, Vec<u8>)> = linux
        .iter()
        .map(|ip| {
            let r = Roce::parse(ip).expect("a RoCEv2 datagram");
            (r.udp_sport, ip[r.ip_len + 8..].to_vec())
        })
        .collect();
    t.host("vm1").run(|| {
        // from Linux's address and source port, DF set as rxe sends
        let s = UdpSocket::bind(SocketAddr::from(([192, 0, 2, 2], payloads[0].0))).unwrap();
        let df: libc::c_int = libc::IP_PMTUDISC_DO;
        // SAFETY: an int option of the socket's own fd.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                (&df as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        s.set_multicast_ttl_v4(64).unwrap();
        for (sport, p) in &payloads {
            assert_eq!(*sport, payloads[0].0);
            s.send_to(p, "239.1.2.3:4791").unwrap();
        }
    });
    go_tx.send(()).unwrap();
    let (got, stats) = recv.join().unwrap();
    assert_eq!(
        got.len(),
        5,
        "Linux's datagrams taken: {} ({stats:?})",
        got.len()
    );
    for (k, (status, src_qp, imm, len, buf)) in got.iter().enumerate() {
        assert_eq!(*status, rdmacm::verbs::WcStatus::Success);
        assert_eq!(
            (*src_qp, *imm, *len),
            (0x11, Some(0x11), 140),
            "datagram {k}"
        );
        let data = &payloads[k].1[12 + 8 + 4..12 + 8 + 4 + 100];
        assert_eq!(&buf[GRH..], data, "datagram {k}'s bytes");
        assert_eq!(&buf[32..40], &[192, 0, 2, 2, 239, 1, 2, 3], "GRH addresses");
    }
    assert_eq!(stats.icrc_errors, 0);
}

#[test]
fn our_group_datagrams_have_linux_layout() {
    if !require_root("our_group_datagrams_have_linux_layout") {
        return;
    }
    let linux = linux_datagrams();
    let t = vms();
    let vm1 = t.host("vm1");
    let (ours, qpn) = vm1.run(|| {
        let cap = Capture::open("eth0").unwrap();
        let mut m = Member::new("192.0.2.2:0", "239.1.2.3:0", 0, false);
        m.join(McJoinFlags::FullMember);
        let rec = cap.record();
        // as mckey: 5 SENDs with immediate (the QPN) of 100 bytes
        let ah = m.ah.as_ref().unwrap();
        let buf = m.pd.alloc(100, AccessFlags::LOCAL_WRITE).unwrap();
        for _ in 0..5 {
            let wr = SendWr::new(0, SendOp::SendWithImm { imm: m.qp.qpn() })
                .with_sge(buf.sge(0, 100).unwrap())
                .with_ud(ah.dest(0xFF_FFFF, 0x0123_4567));
            m.qp.post_send(&wr).unwrap();
        }
        let ours: Vec<Vec<u8>> = rec
            .stop()
            .into_iter()
            .filter(|p| Roce::parse(p).is_some_and(|r| r.dst == IpAddr::from([239, 1, 2, 3])))
            .collect();
        (ours, m.qp.qpn())
    });
    assert_eq!(ours.len(), 5, "our datagrams on the wire");
    for (k, (o, l)) in ours.iter().zip(&linux).enumerate() {
        assert_eq!(o.len(), l.len(), "datagram {k}: length");
        // IPv4: version/IHL, TOS, total length, flags (DF) and offset, TTL 64, protocol
        assert_eq!(o[0..4], l[0..4], "datagram {k}: version, TOS, length");
        assert_eq!(o[6..10], l[6..10], "datagram {k}: DF, TTL, protocol");
        assert_eq!(o[6] & 0x40, 0x40, "DF");
        assert_eq!(o[8], 64, "TTL");
        assert_eq!(o[12..20], l[12..20], "datagram {k}: addresses");
        // UDP: destination port and length (the source port is the QP's own)
        assert_eq!(o[22..26], l[22..26], "datagram {k}: UDP port and length");
        // BTH, DETH: all but the source QPN; the immediate is the sender's QPN
        let (ob, lb) = (&o[28..], &l[28..]);
        assert_eq!(ob[..12], lb[..12], "datagram {k}: BTH");
        assert_eq!(ob[12..17], lb[12..17], "datagram {k}: Q_Key");
        assert_eq!(ob[17..20], qpn.to_be_bytes()[1..], "source QPN");
        assert_eq!(ob[20..24], qpn.to_be_bytes(), "immediate");
        assert!(
            ob[24..124].iter().all(|&b| b == 0),
            "our payload: the zeroed buffer"
        );
    }
}

/// IGMP packets (IPv4 protocol 2) among captured IP packets.
fn igmp(packets: &[Vec<u8>]) -> usize {
    packets
        .iter()
        .filter(|p| p.first().is_some_and(|b| b >> 4 == 4) && p.get(9) == Some(&2))
        .count()
}

/// A full-member join makes the host report the group (IGMP), a send-only join does not
/// (as Linux since 2021); the id's TOS is the datagrams' IPv4 TOS, TTL 64, DF.
#[test]
fn full_join_reports_the_group_send_only_does_not_and_tos_goes_on_the_wire() {
    if !require_root("full_join_reports_the_group_send_only_does_not_and_tos_goes_on_the_wire") {
        return;
    }
    let t = vms();
    t.host("vm1").run(|| {
        // send-only, with TOS 0x48 (DSCP AF21)
        let rec = Capture::open("eth0").unwrap().record();
        let mut s = Member::new("192.0.2.2:0", "239.1.2.4:0", 0, false);
        s.id.set_option(rdmacm::cm::CmOption::Tos(0x48)).unwrap();
        s.join(McJoinFlags::SendOnlyFullMember);
        s.send(1, 0..3);
        std::thread::sleep(Duration::from_millis(300));
        let p = rec.stop();
        assert_eq!(igmp(&p), 0, "a send-only join reported the group");
        let ours: Vec<Roce> = p.iter().filter_map(|p| Roce::parse(p)).collect();
        assert_eq!(ours.len(), 3);
        for r in &ours {
            assert_eq!(r.dst, IpAddr::from([239, 1, 2, 4]));
            assert_eq!(
                (r.tclass, r.ip[8], r.ip[6] & 0x40),
                (0x48, 64, 0x40),
                "TOS, TTL, DF"
            );
        }
        // a full member: the kernel reports the group at once
        let rec = Capture::open("eth0").unwrap().record();
        let mut f = Member::new("192.0.2.2:0", "239.1.2.5:0", 4, false);
        f.join(McJoinFlags::FullMember);
        std::thread::sleep(Duration::from_millis(300));
        let p = rec.stop();
        assert!(igmp(&p) >= 1, "no IGMP report after a full-member join");
    });
}
