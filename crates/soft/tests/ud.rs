//! UD queue pairs over real UDP on loopback: datagrams with and without immediate, the GRH
//! in front of the data for IPv4 and IPv6, Q_Key checks. Own UDP ports per test.

use std::time::{Duration, Instant};

use rdma_soft::io::{UdpConfig, UdpWire, WireAddr};
use rdma_soft::verbs::*;

fn device(port: u16, ips: &[&str]) -> Device {
    let mut cfg = DeviceConfig::for_netdev("lo").unwrap();
    cfg.gids = ips.iter().map(|s| s.parse().unwrap()).collect();
    let wire = UdpWire::new(UdpConfig {
        port,
        faults: None,
        ..UdpConfig::default()
    })
    .unwrap();
    Device::open_with_wire(cfg, Box::new(wire)).unwrap()
}

fn gid(s: &str) -> [u8; 16] {
    s.parse::<WireAddr>().unwrap().gid()
}

struct End {
    qp: QueuePair,
    mr: MemoryRegion,
    cq: CompletionQueue,
    pd: ProtectionDomain,
}

fn end(d: &Device, qkey: u32) -> End {
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(64, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    qp.ud_ready(qkey).unwrap();
    let mr = pd
        .register(vec![0u8; 8192], AccessFlags::LOCAL_WRITE)
        .unwrap();
    End { qp, mr, cq, pd }
}

/// Bytes no datagram writes, so a buffer that must stay untouched can be recognised.
fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ salt)
        .collect()
}

fn poll(cq: &CompletionQueue, within: Duration) -> Option<Completion> {
    let end = Instant::now() + within;
    let mut wc = Vec::new();
    while Instant::now() < end {
        if cq.poll(&mut wc, 1) > 0 {
            return wc.pop();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

#[test]
fn two_devices_exchange_datagrams_with_grh() {
    let (da, db) = (device(47951, &["127.0.0.1"]), device(47951, &["127.0.0.2"]));
    let (a, b) = (end(&da, 0x11), end(&db, 0x22));
    assert_eq!(a.qp.state(), QpState::Rts);
    assert_eq!(b.qp.query().unwrap().qkey, 0x22);
    let ah =
        a.pd.create_ah(&PathAttr {
            dgid: gid("127.0.0.2"),
            ..PathAttr::default()
        })
        .unwrap();
    let back =
        b.pd.create_ah(&PathAttr {
            dgid: gid("127.0.0.1"),
            ..PathAttr::default()
        })
        .unwrap();
    for i in 0..20u32 {
        let len = 1 + (i as usize * 97) % 4096;
        let data: Vec<u8> = (0..len).map(|k| (k as u32 * 7 + i) as u8).collect();
        a.mr.write(0, &data).unwrap();
        b.qp.post_recv(&RecvWr::new(100 + u64::from(i)).with_sge(b.mr.sge(0, 8192).unwrap()))
            .unwrap();
        let op = if i % 2 == 0 {
            SendOp::Send
        } else {
            SendOp::SendWithImm { imm: 0xABC0 + i }
        };
        let wr = SendWr::new(u64::from(i), op)
            .with_sge(a.mr.sge(0, len as u32).unwrap())
            .with_ud(ah.dest(b.qp.qpn(), 0x22))
            .signaled();
        a.qp.post_send(&wr).unwrap();
        let sc = poll(&a.cq, Duration::from_secs(5)).expect("send completion");
        assert_eq!((sc.wr_id, sc.status), (u64::from(i), WcStatus::Success));
        let rc = poll(&b.cq, Duration::from_secs(5)).expect("datagram");
        assert_eq!(rc.status, WcStatus::Success);
        assert_eq!(rc.wr_id, 100 + u64::from(i));
        assert_eq!(rc.byte_len as usize, 40 + len);
        assert_eq!(rc.src_qp, a.qp.qpn());
        assert!(rc.wc_flags.contains(WcFlags::GRH));
        assert_eq!(rc.imm(), (i % 2 == 1).then_some(0xABC0 + i));
        let mut got = vec![0u8; 40 + len];
        b.mr.read(0, &mut got).unwrap();
        assert_eq!(&got[40..], &data[..]);
        // GRH for IPv4: 20 zero bytes, then the IPv4 header of the datagram
        assert_eq!(&got[..20], &[0u8; 20]);
        let ip = &got[20..40];
        assert_eq!(ip[0], 0x45);
        assert_eq!(ip[9], 17);
        assert_eq!(&ip[12..16], &[127, 0, 0, 1]);
        assert_eq!(&ip[16..20], &[127, 0, 0, 2]);
        let roce = 12 + 8 + if i % 2 == 1 { 4 } else { 0 } + len.div_ceil(4) * 4 + 4;
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, 20 + 8 + roce);
        assert!(ip[8] > 0); // TTL
        let sum = ip
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum::<u32>();
        assert_eq!((sum & 0xFFFF) + (sum >> 16), 0xFFFF, "IPv4 header checksum");
    }
    // and back, with the high-bit rule: Q_Key 0x8000_0000 in the WR sends the QP's own (0x22),
    // which a is not set to: dropped; then b's QP Q_Key equal to a's. a receives into a region
    // of its own (not the one it sends from), patterned, so the drop provably wrote nothing.
    let rx_pattern = pattern(8192, 0xa5);
    let a_rx =
        a.pd.register(rx_pattern.clone(), AccessFlags::LOCAL_WRITE)
            .unwrap();
    b.mr.write(0, b"back").unwrap();
    let (a_before, b_before) = (a.mr.to_vec(), b.mr.to_vec());
    a.qp.post_recv(&RecvWr::new(1).with_sge(a_rx.sge(0, 8192).unwrap()))
        .unwrap();
    let wr = |qkey| {
        SendWr::new(9, SendOp::Send)
            .with_sge(b.mr.sge(0, 4).unwrap())
            .with_ud(back.dest(a.qp.qpn(), qkey))
    };
    b.qp.post_send(&wr(0x8000_0000)).unwrap();
    assert!(poll(&a.cq, Duration::from_millis(200)).is_none());
    assert_eq!(a.qp.ud_stats().unwrap().qkey_mismatch, 1);
    assert!(
        a_rx.to_vec() == rx_pattern,
        "the dropped datagram wrote a's receive buffer"
    );
    assert!(a.mr.to_vec() == a_before, "a's send region changed");
    assert!(b.mr.to_vec() == b_before, "b's region changed");
    // the receive is still posted: the right Q_Key lands in it, GRH and 4 bytes, no more
    b.qp.post_send(&wr(0x11)).unwrap();
    let c = poll(&a.cq, Duration::from_secs(5)).expect("datagram back");
    assert_eq!((c.wr_id, c.byte_len, c.src_qp), (1, 44, b.qp.qpn()));
    let got = a_rx.to_vec();
    assert_eq!(&got[40..44], b"back");
    assert!(got[44..] == rx_pattern[44..], "written past the datagram");
    assert!(a.mr.to_vec() == a_before && b.mr.to_vec() == b_before);
}

#[test]
fn wrong_qkey_is_dropped_and_counted() {
    let (da, db) = (
        device(47952, &["127.0.52.1"]),
        device(47952, &["127.0.52.2"]),
    );
    let (a, b) = (end(&da, 5), end(&db, 6));
    let ah =
        a.pd.create_ah(&PathAttr {
            dgid: gid("127.0.52.2"),
            ..PathAttr::default()
        })
        .unwrap();
    // b receives into its own patterned region; a sends from its own
    let b_pattern = pattern(8192, 0x3c);
    b.mr.write(0, &b_pattern).unwrap();
    b.qp.post_recv(&RecvWr::new(1).with_sge(b.mr.sge(0, 8192).unwrap()))
        .unwrap();
    a.mr.write(0, b"x").unwrap();
    let a_before = a.mr.to_vec();
    for qkey in [5, 7, 0x8000_0006] {
        let wr = SendWr::new(1, SendOp::Send)
            .with_sge(a.mr.sge(0, 1).unwrap())
            .with_ud(ah.dest(b.qp.qpn(), qkey));
        a.qp.post_send(&wr).unwrap();
    }
    assert!(poll(&b.cq, Duration::from_millis(300)).is_none());
    assert_eq!(b.qp.ud_stats().unwrap().qkey_mismatch, 3);
    assert!(
        b.mr.to_vec() == b_pattern,
        "a dropped datagram wrote b's buffer"
    );
    assert!(a.mr.to_vec() == a_before, "a's region changed");
    // a datagram to a QP that does not exist is counted by the runtime (a QPN of b's
    // device: its top byte is the device's slot, else b's wire drops it as another
    // process's)
    let wr = SendWr::new(1, SendOp::Send)
        .with_sge(a.mr.sge(0, 1).unwrap())
        .with_ud(ah.dest((b.qp.qpn() & 0xff_0000) | 0x7777, 6));
    a.qp.post_send(&wr).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while db.runtime_stats().no_such_qp == 0 && Instant::now() < end {
        db.progress().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(db.runtime_stats().no_such_qp, 1);
    assert!(
        b.mr.to_vec() == b_pattern,
        "a datagram to no QP wrote b's buffer"
    );
    // control: b's receive is still posted, and the right Q_Key (b's own, 6) lands in it
    let wr = SendWr::new(2, SendOp::Send)
        .with_sge(a.mr.sge(0, 1).unwrap())
        .with_ud(ah.dest(b.qp.qpn(), 6));
    a.qp.post_send(&wr).unwrap();
    let c = poll(&b.cq, Duration::from_secs(5)).expect("the datagram with the right Q_Key");
    assert_eq!((c.wr_id, c.status, c.byte_len), (1, WcStatus::Success, 41));
    let got = b.mr.to_vec();
    assert_eq!(got[40], b'x');
    assert!(got[41..] == b_pattern[41..], "written past the datagram");
    assert_eq!(b.qp.ud_stats().unwrap().qkey_mismatch, 3);
    assert!(a.mr.to_vec() == a_before);
}

#[test]
fn posting_checks() {
    let d = device(47953, &["127.0.53.1"]);
    let a = end(&d, 1);
    // no wr.ud, or a handle that is not one
    let wr = SendWr::new(1, SendOp::Send).with_sge(a.mr.sge(0, 1).unwrap());
    assert_eq!(a.qp.post_send(&wr).unwrap_err().errno(), libc::EINVAL);
    let bogus = wr.with_ud(UdDest {
        ah: 0x00FF_0003,
        remote_qpn: 2,
        remote_qkey: 1,
    });
    assert_eq!(a.qp.post_send(&bogus).unwrap_err().errno(), libc::EINVAL);
    // SEND with invalidate on UD
    let ah =
        a.pd.create_ah(&PathAttr {
            dgid: gid("127.0.53.2"),
            ..PathAttr::default()
        })
        .unwrap();
    let w = SendWr::new(1, SendOp::SendWithInv { invalidate_rkey: 0 })
        .with_sge(a.mr.sge(0, 1).unwrap())
        .with_ud(ah.dest(2, 1));
    assert!(a.qp.post_send(&w).is_err());
    // family mismatch, GID index out of range
    assert!(a
        .pd
        .create_ah(&PathAttr {
            dgid: gid("::1"),
            ..PathAttr::default()
        })
        .is_err());
    assert!(a
        .pd
        .create_ah(&PathAttr {
            dgid: gid("127.0.53.2"),
            sgid_index: 3,
            ..PathAttr::default()
        })
        .is_err());
    assert!(a.qp.ud_ready(1).is_err()); // already in RTS
}

#[test]
fn ipv6_loopback_grh() {
    let d = device(47954, &["::1"]);
    let (a, b) = (end(&d, 9), end(&d, 9));
    let ah =
        a.pd.create_ah(&PathAttr {
            dgid: gid("::1"),
            ..PathAttr::default()
        })
        .unwrap();
    b.qp.post_recv(&RecvWr::new(3).with_sge(b.mr.sge(0, 8192).unwrap()))
        .unwrap();
    a.mr.write(0, b"over ipv6").unwrap();
    let wr = SendWr::new(1, SendOp::SendWithImm { imm: 42 })
        .with_sge(a.mr.sge(0, 9).unwrap())
        .with_ud(ah.dest(b.qp.qpn(), 9));
    a.qp.post_send(&wr).unwrap();
    let c = poll(&b.cq, Duration::from_secs(5)).expect("datagram");
    assert_eq!(
        (c.status, c.byte_len, c.imm()),
        (WcStatus::Success, 49, Some(42))
    );
    let mut g = [0u8; 49];
    b.mr.read(0, &mut g).unwrap();
    assert_eq!(g[0] >> 4, 6);
    let roce = 12 + 8 + 4 + 12 + 4;
    assert_eq!(u16::from_be_bytes([g[4], g[5]]) as usize, 8 + roce); // payload length
    assert_eq!(g[6], 17); // next header UDP
    assert!(g[7] > 0); // hop limit
    let one = std::net::Ipv6Addr::LOCALHOST.octets();
    assert_eq!(&g[8..24], &one);
    assert_eq!(&g[24..40], &one);
    assert_eq!(&g[40..], b"over ipv6");
}

/// A UD QP opens only its own source address when it has one (`ud_ready_on`), so another
/// process can hold the device's other addresses; without one it opens every address it can
/// and skips those another process holds.
#[test]
fn ud_qp_opens_only_its_source_address() {
    let port = 47931;
    let d = device(port, &["127.0.0.83", "127.0.0.84"]);
    // "another process" holds UDP port on 127.0.0.84
    let other = std::net::UdpSocket::bind(("127.0.0.84", port)).unwrap();
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16, None).unwrap();
    let own = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    own.ud_ready_on(0x99, 0).unwrap();
    // an index beyond the GID table, or after RTR: EINVAL
    let q2 = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    assert_eq!(q2.ud_ready_on(1, 7).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(own.set_ud_source(0).unwrap_err().errno(), libc::EINVAL);
    // its own address taken by someone else: the error says so
    let q3 = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    assert_eq!(q3.ud_ready_on(1, 1).unwrap_err().errno(), libc::EADDRINUSE);
    // no source: every address it can open (127.0.0.84 is skipped)
    let all = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    all.ud_ready(0x98).unwrap();
    drop(other);
    // datagrams to the QP with a source arrive
    let peer = device(port, &["127.0.0.85"]);
    let p = end(&peer, 0x99);
    let mr = pd
        .register(vec![0u8; 256], AccessFlags::LOCAL_WRITE)
        .unwrap();
    own.post_recv(&RecvWr::new(5).with_sge(mr.sge(0, 256).unwrap()))
        .unwrap();
    let ah =
        p.pd.create_ah(&PathAttr {
            dgid: gid("127.0.0.83"),
            ..PathAttr::default()
        })
        .unwrap();
    p.mr.write(0, b"to own").unwrap();
    p.qp.post_send(
        &SendWr::new(1, SendOp::Send)
            .with_sge(p.mr.sge(0, 6).unwrap())
            .with_ud(ah.dest(own.qpn(), 0x99)),
    )
    .unwrap();
    let c = poll(&cq, Duration::from_secs(2)).expect("the datagram arrives");
    assert_eq!((c.wr_id, c.byte_len), (5, 40 + 6));
}
