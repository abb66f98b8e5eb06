//! UDP GRO on receive: a GSO message arrives as one receive that the wire splits into its
//! datagrams, segment k checked for IPv4 Identification k; datagrams with a bad ICRC inside
//! a coalesced receive are dropped one by one, the others delivered. Loopback only, no root.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use rdma_soft::io::{DatagramWire, UdpConfig, UdpWire, WireAddr};

mod common;
use common::send_only as packet;

fn addr(s: &str) -> WireAddr {
    s.parse().unwrap()
}

/// Receives on `b` until `want` packets came or 5 s passed: (tag, bytes).
fn receive(b: &mut UdpWire, want: usize) -> Vec<(u16, Vec<u8>)> {
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(5);
    while got.len() < want && Instant::now() < end {
        b.recv(&mut |_, pkt| got.push((u16::from_be_bytes([pkt[12], pkt[13]]), pkt.to_vec())))
            .unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
    got
}

fn wires(port: u16, la: WireAddr, lb: WireAddr, gro: bool) -> (UdpWire, UdpWire) {
    let cfg = UdpConfig {
        port,
        share: false, // made-up QPNs
        gro,
        ..UdpConfig::default()
    };
    let mut a = UdpWire::new(cfg.clone()).unwrap();
    let mut b = UdpWire::new(cfg).unwrap();
    a.open(la).unwrap();
    b.open(lb).unwrap();
    (a, b)
}

#[test]
fn a_gso_message_arrives_in_one_receive_and_is_split() {
    let (la, lb) = (addr("127.0.3.11"), addr("127.0.3.12"));
    let (mut a, mut b) = wires(47951, la, lb, true);
    assert!(b.gro(), "this kernel takes UDP_GRO (Linux 5.0 and later)");
    // 11 packets of 1040 bytes and a shorter last one: one GSO message
    let mut sent = Vec::new();
    for k in 0..12u16 {
        let p = packet(k, if k == 11 { 300 } else { 1040 });
        a.send(la, lb, &p).unwrap();
        sent.push(p);
    }
    a.flush().unwrap();
    let got = receive(&mut b, 12);
    assert_eq!(got.len(), 12);
    for (k, (tag, bytes)) in got.iter().enumerate() {
        assert_eq!(*tag as usize, k, "in order");
        // the wire's ICRC is in the last 4 bytes: everything before it as sent
        let n = bytes.len() - 4;
        assert_eq!(&bytes[..n], &sent[k][..n], "packet {k}");
    }
    let (sa, sb) = (a.stats(), b.stats());
    if sa.gso_refused == 0 && sa.send_calls == 1 {
        assert_eq!(sb.gro_coalesced, 11, "{sb:?}");
        assert_eq!(
            sb.icrc_recovered_id, 0,
            "each segment's Identification was its place"
        );
        assert_eq!(sb.recv_calls, 1, "one receive for the message");
    }
    assert_eq!((sb.icrc_errors, sb.malformed), (0, 0));
}

#[test]
fn without_gro_the_kernel_splits_and_the_wire_recovers() {
    let (la, lb) = (addr("127.0.3.13"), addr("127.0.3.14"));
    let (mut a, mut b) = wires(47952, la, lb, false);
    assert!(!b.gro());
    for k in 0..8u16 {
        a.send(la, lb, &packet(k, 1040)).unwrap();
    }
    a.flush().unwrap();
    assert_eq!(receive(&mut b, 8).len(), 8);
    let st = b.stats();
    assert_eq!(st.gro_coalesced, 0);
    if a.stats().gso_refused == 0 {
        assert_eq!(st.icrc_recovered_id, 7);
    }
}

/// `setsockopt(UDP_SEGMENT)` on a plain socket: the kernel sends `buf` as datagrams of `seg`.
fn gso_send(sock: &UdpSocket, to: &str, buf: &[u8], seg: u16) {
    use std::os::fd::AsRawFd;
    let v = i32::from(seg);
    // SAFETY: a valid socket and an int option.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "UDP_SEGMENT");
    sock.send_to(buf, to).unwrap();
}

#[test]
fn bad_datagrams_inside_a_coalesced_receive_are_dropped_alone() {
    let lb = addr("127.0.3.16");
    let cfg = UdpConfig {
        port: 47953,
        share: false,
        ..UdpConfig::default()
    };
    let mut b = UdpWire::new(cfg).unwrap();
    b.open(lb).unwrap();
    // A hostile sender: 6 datagrams of 200 bytes in one GSO message, none with a valid ICRC,
    // then a valid one of ours (a second message).
    let raw = UdpSocket::bind("127.0.3.15:0").unwrap();
    let mut junk = Vec::new();
    for k in 0..6u16 {
        junk.extend_from_slice(&packet(100 + k, 200));
    }
    junk.truncate(junk.len() - 50); // and a short last one
    gso_send(&raw, "127.0.3.16:47953", &junk, 200);
    let la = addr("127.0.3.17");
    let mut a = UdpWire::new(UdpConfig {
        port: 47953,
        share: false,
        ..UdpConfig::default()
    })
    .unwrap();
    a.open(la).unwrap();
    a.send(la, lb, &packet(7, 200)).unwrap();
    a.flush().unwrap();
    let got = receive(&mut b, 1);
    std::thread::sleep(Duration::from_millis(50));
    let late = receive(&mut b, 1);
    assert!(late.is_empty() || late.len() == 1 && got.is_empty());
    let all: Vec<u16> = got.iter().chain(late.iter()).map(|g| g.0).collect();
    assert_eq!(all, vec![7], "only the valid datagram is delivered");
    assert_eq!(b.stats().icrc_errors, 6, "{:?}", b.stats());
}
