//! The GSI (QP1) MAD path between two devices over real UDP on loopback.
//!
//! Each test uses its own UDP port, so the tests run in parallel and never meet the RC tests
//! (which use 4791).

use std::time::{Duration, Instant};

use rdma_soft::gsi::{GsiLimits, GsiMad, GSI_QKEY, MAD_LEN};
use rdma_soft::io::{DatagramWire, UdpConfig, UdpWire, WireAddr};
use rdma_soft::verbs::{Device, DeviceConfig};

/// Devices and wires that do not share their addresses: these tests send made-up CM MADs,
/// which a sharing wire steers (and drops) by the comm id they happen to hold.
fn device(port: u16) -> Device {
    let wire = UdpWire::new(UdpConfig {
        share: false,
        port,
        faults: None,
        ..UdpConfig::default()
    })
    .unwrap();
    Device::open_with_wire(DeviceConfig::for_netdev("lo").unwrap(), Box::new(wire)).unwrap()
}

fn addr(s: &str) -> WireAddr {
    s.parse().unwrap()
}

/// Receives one MAD, blocking in `gsi_wait`, within 5 s.
fn recv_one(dev: &Device) -> Option<GsiMad> {
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if let Some(m) = dev.gsi_recv().unwrap() {
            return Some(m);
        }
        dev.gsi_wait(Some(Duration::from_millis(50))).unwrap();
    }
    None
}

/// Drives `dev` until nothing arrives for 100 ms.
fn settle(dev: &Device) {
    let mut quiet = Instant::now();
    while quiet.elapsed() < Duration::from_millis(100) {
        if dev.progress().unwrap() > 0 {
            quiet = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn mad(tag: u8) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    m[..4].copy_from_slice(&[1, 7, 2, 3]);
    for (i, b) in m[24..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31) ^ tag;
    }
    m
}

#[test]
fn two_devices_exchange_mads() {
    let (a, b) = (device(47941), device(47941));
    let (la, lb) = (addr("127.0.0.1"), addr("127.0.0.2"));
    a.gsi_open(la).unwrap();
    b.gsi_open(lb).unwrap();
    for i in 0..5u8 {
        a.gsi_send(&la, &lb, &mad(i)).unwrap();
        let got = recv_one(&b).expect("MAD a -> b");
        assert_eq!(
            (got.local, got.remote, got.src_qp, got.pkey),
            (lb, la, 1, 0xFFFF)
        );
        assert_eq!(got.mad, mad(i));
        b.gsi_send(&lb, &got.remote, &mad(100 + i)).unwrap();
        let back = recv_one(&a).expect("MAD b -> a");
        assert_eq!(back.remote, lb);
        assert_eq!(back.mad, mad(100 + i));
    }
    assert_eq!(a.gsi_stats().sent, 5);
    assert_eq!(b.gsi_stats().received, 5);
    // the eventfd is reset once the queue is empty
    assert_eq!(b.gsi_recv().unwrap(), None);
    let fds = b.gsi_wait_fds();
    assert!(fds.wire.is_some());
    assert!(!readable(fds.event));
}

fn readable(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

#[test]
fn mads_queued_by_another_driver_signal_the_eventfd() {
    let (a, b) = (device(47942), device(47942));
    let (la, lb) = (addr("127.0.42.1"), addr("127.0.42.2"));
    a.gsi_open(la).unwrap();
    b.gsi_open(lb).unwrap();
    let ev = b.gsi_wait_fds().event;
    assert!(!readable(ev));
    a.gsi_send(&la, &lb, &mad(1)).unwrap();
    // someone else drives the device (here: progress, as a CQ poller would)
    settle(&b);
    assert!(readable(ev));
    b.gsi_wait(None).unwrap(); // returns at once: a MAD is queued
    assert_eq!(b.gsi_recv().unwrap().unwrap().mad, mad(1));
    assert!(!readable(ev));
}

#[test]
fn send_needs_open_and_close_is_counted() {
    let a = device(47943);
    let (la, lb) = (addr("127.0.43.1"), addr("127.0.43.2"));
    let err = a.gsi_send(&la, &lb, &mad(0)).unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL);
    a.gsi_open(la).unwrap();
    a.gsi_open(la).unwrap();
    assert!(a.gsi_close(la));
    a.gsi_send(&la, &lb, &mad(0)).unwrap();
    assert!(a.gsi_close(la));
    assert!(!a.gsi_close(la));
    assert!(a.gsi_send(&la, &lb, &mad(0)).is_err());
    // the address was released: another wire can take it
    let mut w = UdpWire::new(UdpConfig {
        share: false,
        port: 47943,
        ..UdpConfig::default()
    })
    .unwrap();
    w.open(la).unwrap();
}

/// A raw UD packet to QP1 (BTH, DETH, payload, ICRC room) as a hostile or buggy peer sends.
fn raw_ud(opcode: u8, qkey: u32, pkey: u16, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 12 + 8];
    p[0] = opcode;
    p[2..4].copy_from_slice(&pkey.to_be_bytes());
    p[7] = 1; // dest QP 1
    p[8] = 0x80; // AckReq
    p[12..16].copy_from_slice(&qkey.to_be_bytes());
    p[19] = 1; // src QP 1
    p.extend_from_slice(payload);
    let pad = (4 - payload.len() % 4) % 4;
    p[1] = (pad as u8) << 4;
    p.resize(p.len() + pad + 4, 0);
    p
}

#[test]
fn bad_qkey_length_opcode_pkey_are_dropped_and_counted() {
    let b = device(47944);
    let (la, lb) = (addr("127.0.44.1"), addr("127.0.44.2"));
    b.gsi_open(lb).unwrap();
    let mut w = UdpWire::new(UdpConfig {
        share: false,
        port: 47944,
        ..UdpConfig::default()
    })
    .unwrap();
    w.open(la).unwrap();
    let m = mad(9);
    let sends = [
        raw_ud(0x64, 0x8001_0001, 0xFFFF, &m),     // wrong Q_Key
        raw_ud(0x64, GSI_QKEY, 0xFFFF, &m[..200]), // short
        raw_ud(0x64, GSI_QKEY, 0x1234, &m),        // other partition
        raw_ud(0x65, GSI_QKEY, 0xFFFF, &m),        // SEND_ONLY with immediate: wrong length/opcode
        raw_ud(0x64, GSI_QKEY, 0x7FFF, &m),        // limited member: accepted
    ];
    for p in &sends {
        w.send(la, lb, p).unwrap();
    }
    w.flush().unwrap();
    let got = recv_one(&b).expect("the good MAD");
    assert_eq!((got.pkey, got.mad), (0x7FFF, m));
    settle(&b);
    assert_eq!(b.gsi_recv().unwrap(), None);
    let s = b.gsi_stats();
    assert_eq!(
        (s.bad_qkey, s.bad_length, s.bad_pkey, s.received),
        (1, 1, 1, 1)
    );
    assert_eq!(s.bad_opcode, 1);
}

#[test]
fn queue_bounds_hold_in_total_and_per_peer() {
    let b = device(47945);
    let lb = addr("127.0.45.9");
    b.gsi_open(lb).unwrap();
    b.gsi_set_limits(GsiLimits {
        queue_len: 6,
        per_peer: 4,
    })
    .unwrap();
    assert!(b
        .gsi_set_limits(GsiLimits {
            queue_len: 0,
            per_peer: 1
        })
        .is_err());
    let peers: Vec<Device> = (1..=2).map(|_| device(47945)).collect();
    let addrs = [addr("127.0.45.1"), addr("127.0.45.2")];
    for (p, a) in peers.iter().zip(addrs) {
        p.gsi_open(a).unwrap();
    }
    // peer 1 floods 10, peer 2 sends 3 after it
    for i in 0..10 {
        peers[0].gsi_send(&addrs[0], &lb, &mad(i)).unwrap();
    }
    settle(&b);
    for i in 0..3 {
        peers[1].gsi_send(&addrs[1], &lb, &mad(50 + i)).unwrap();
    }
    settle(&b);
    let mut got = Vec::new();
    while let Some(m) = b.gsi_recv().unwrap() {
        got.push(m);
    }
    let from = |a: WireAddr| got.iter().filter(|m| m.remote == a).count();
    assert_eq!((from(addrs[0]), from(addrs[1])), (4, 2));
    let s = b.gsi_stats();
    assert_eq!((s.peer_full, s.queue_full, s.received), (6, 1, 6));
    // the first MADs of each peer were kept, in order
    assert_eq!(got[0].mad, mad(0));
    assert_eq!(got[3].mad, mad(3));
    assert_eq!(got[4].mad, mad(50));
}

/// The REQ of `cm-consumer-reject.pcap` (frame 1, Linux 6.1 ib_cm over rxe): its RoCEv2
/// datagram (BTH..ICRC), read from the capture with a minimal pcap parser.
fn captured_req() -> Option<Vec<u8>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/captures/cm-consumer-reject.pcap"
    );
    let data = std::fs::read(path)
        .or_else(|_| std::fs::read("/work/shared/captures/cm-consumer-reject.pcap"))
        .ok()?;
    // pcap: 24-byte global header (little-endian magic, Ethernet), 16-byte record headers
    if data.get(..4)? != [0xd4, 0xc3, 0xb2, 0xa1] {
        return None;
    }
    let mut off = 24;
    while off + 16 <= data.len() {
        let caplen = u32::from_le_bytes(data[off + 8..off + 12].try_into().ok()?) as usize;
        let frame = data.get(off + 16..off + 16 + caplen)?;
        off += 16 + caplen;
        // Ethernet II, IPv4, UDP to 4791
        if frame.get(12..14)? != [0x08, 0x00] {
            continue;
        }
        let ip = &frame[14..];
        let ihl = usize::from(ip.first()? & 0x0F) * 4;
        if *ip.get(9)? != 17 {
            continue;
        }
        let udp = ip.get(ihl..)?;
        if udp.get(2..4)? != 4791u16.to_be_bytes() {
            continue;
        }
        let roce = udp.get(8..)?;
        // UD SEND_ONLY to QP1 carrying a CM REQ (attribute id 0x0010)
        if roce.first() == Some(&0x64)
            && roce.get(5..8)? == [0, 0, 1]
            && roce.get(20 + 16..20 + 18)? == [0, 0x10]
        {
            return Some(roce.to_vec());
        }
    }
    None
}

#[test]
fn captured_linux_req_resent_over_loopback_arrives_intact() {
    let req = captured_req().expect("REQ in cm-consumer-reject.pcap");
    assert_eq!(req.len(), 12 + 8 + MAD_LEN + 4);
    let (la, lb) = (addr("127.0.46.1"), addr("127.0.46.2"));
    let b = device(47946);
    b.gsi_open(lb).unwrap();
    // re-sent byte for byte (the wire recomputes the ICRC for the new IP header)
    let mut w = UdpWire::new(UdpConfig {
        share: false,
        port: 47946,
        ..UdpConfig::default()
    })
    .unwrap();
    w.open(la).unwrap();
    w.send(la, lb, &req).unwrap();
    w.flush().unwrap();
    let got = recv_one(&b).expect("the REQ");
    assert_eq!(&got.mad[..], &req[20..20 + MAD_LEN]);
    assert_eq!((got.src_qp, got.pkey, got.remote), (1, 0xFFFF, la));
    assert_eq!(&got.mad[..4], &[1, 7, 2, 3]); // CM class version 2, Send
                                              // and a device sends it as Linux did: same BTH (but the PSN) and DETH
    let a = device(47946);
    let lc = addr("127.0.46.3");
    a.gsi_open(lc).unwrap();
    let mut sniff = UdpWire::new(UdpConfig {
        share: false,
        port: 47946,
        ..UdpConfig::default()
    })
    .unwrap();
    let ld = addr("127.0.46.4");
    sniff.open(ld).unwrap();
    a.gsi_send(&lc, &ld, &got.mad).unwrap();
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(5);
    while seen.is_empty() && Instant::now() < end {
        sniff.recv(&mut |_, p| seen.push(p.to_vec())).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let sent = seen.first().expect("the re-sent REQ");
    assert_eq!(sent.len(), req.len());
    assert_eq!(&sent[..8], &req[..8]); // opcode, flags, P_Key, dest QP
    assert_eq!(sent[8] & 0x80, req[8] & 0x80); // AckReq
    assert_eq!(&sent[12..sent.len() - 4], &req[12..req.len() - 4]); // DETH + MAD
}
