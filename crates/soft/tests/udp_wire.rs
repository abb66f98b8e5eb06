//! UdpWire over real sockets on 127.0.0.0/8 and ::1 (never any other address).
//! Each test uses its own addresses so the tests can run in parallel.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rdma_soft::io::{Arrival, DatagramWire, FaultSpec, UdpConfig, UdpWire, WireAddr, WireStats};

fn addr(s: &str) -> WireAddr {
    s.parse().unwrap()
}

/// A wire that does not share its addresses: these tests send packets to made-up QPNs,
/// which a sharing wire drops as another process's (tests/share.rs).
fn wire(faults: Option<&str>) -> UdpWire {
    UdpWire::new(UdpConfig {
        faults: faults.map(|f| f.parse::<FaultSpec>().unwrap()),
        share: false,
        ..UdpConfig::default()
    })
    .unwrap()
}

/// Receives until `want` packets arrived or `timeout` passed.
fn drain(w: &mut UdpWire, want: usize, timeout: Duration) -> Vec<(Arrival, Vec<u8>)> {
    let end = Instant::now() + timeout;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < end {
        let n = w.recv(&mut |a, p| got.push((*a, p.to_vec()))).unwrap();
        if n == 0 {
            wait_readable(w, Duration::from_millis(5));
        }
    }
    got
}

fn wait_readable(w: &UdpWire, max: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: w.wait_fd().unwrap().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, max.as_millis() as i32) > 0 }
}

fn numbered(i: u32) -> Vec<u8> {
    let mut p = vec![0xabu8; 60];
    p[..4].copy_from_slice(&i.to_be_bytes());
    p
}

#[test]
fn ipv4_batch_with_pktinfo() {
    let (la, lb) = (addr("127.0.1.1"), addr("127.0.1.2"));
    let (mut a, mut b) = (wire(None), wire(None));
    a.open(la).unwrap();
    b.open(lb).unwrap();
    assert!(a.is_open(la) && !a.is_open(lb));
    for i in 0..200 {
        a.send(la, lb, &numbered(i)).unwrap();
    }
    a.flush().unwrap();
    let got = drain(&mut b, 200, Duration::from_secs(2));
    assert_eq!(got.len(), 200);
    for (i, (arr, p)) in got.iter().enumerate() {
        assert_eq!(p[..56], numbered(i as u32)[..56], "in order on loopback");
        assert_eq!(arr.local, lb);
        assert_eq!(arr.remote, la);
        assert_eq!(arr.ifindex, 1, "arrived on lo");
        assert_eq!(arr.hop_limit, 64);
    }
    let sa = a.stats();
    assert_eq!(sa.sent, 200);
    assert!(
        sa.send_calls <= 8,
        "batched: {} sendmmsg calls",
        sa.send_calls
    );
    assert!(b.stats().recv_calls < 200, "batched receive");
    // An empty wire delivers nothing and does not block.
    assert_eq!(b.recv(&mut |_, _| panic!("nothing queued")).unwrap(), 0);
}

/// ::1 is the one IPv6 loopback address: another process on this host may hold UDP 4791
/// on it (another test binary's child, a parallel test run: `AddrInUse` failed a release
/// run here). As root the test takes a network namespace of its own, where ::1 is ours.
fn on_own_ipv6_loopback<R: Send>(test: &str, f: impl FnOnce() -> R + Send) -> R {
    if !rdma_testhosts::is_root() {
        return f();
    }
    let t = rdma_testhosts::Topology::builder(test)
        .host("a")
        .build()
        .expect("namespace");
    t.host("a").run(f)
}

#[test]
fn ipv6_loopback() {
    on_own_ipv6_loopback("ipv6_loopback", || {
        let l6 = addr("::1");
        let mut w = wire(None);
        w.open(l6).unwrap();
        w.send(l6, l6, b"to myself over ::1").unwrap();
        w.flush().unwrap();
        let got = drain(&mut w, 1, Duration::from_secs(2));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.local, l6);
        assert_eq!(got[0].0.remote, l6);
        assert_eq!(got[0].0.ifindex, 1);
        assert_eq!(&got[0].1[..14], b"to myself over");
        assert_eq!(w.stats().icrc_errors, 0);
    })
}

#[test]
fn address_errors_are_typed() {
    let la = addr("127.0.1.3");
    let mut a = wire(None);
    a.open(la).unwrap();
    a.open(la).unwrap(); // idempotent
                         // A wire that does not share cannot join the address (sharing ones can: tests/share.rs).
    let mut b = UdpWire::new(UdpConfig {
        share: false,
        ..UdpConfig::default()
    })
    .unwrap();
    let e = b.open(la).unwrap_err();
    assert_eq!(e.errno(), libc::EADDRINUSE);
    assert_eq!(
        e.to_string(),
        "UDP 4791 on 127.0.1.3 is held by another process"
    );
    // Not an address of this host: bind fails, nothing is sent anywhere.
    let e = b.open(addr("192.0.2.1")).unwrap_err();
    assert_eq!(e.errno(), libc::EADDRNOTAVAIL, "{e}");
    let e = b.open(addr("fe80::1")).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(e.to_string().contains("scope"), "{e}");
    let e = b.send(addr("127.0.1.4"), la, b"x").unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let e = a.send(la, la, &vec![0u8; 100_000]).unwrap_err();
    assert_eq!(e.errno(), libc::EMSGSIZE);
    // After close another wire may take the address.
    assert!(a.close(la));
    assert!(!a.close(la));
    b.open(la).unwrap();
}

#[test]
fn two_addresses_one_wire() {
    let (l1, l2, peer) = (addr("127.0.1.5"), addr("127.0.1.6"), addr("127.0.1.7"));
    let mut w = wire(None);
    w.open(l1).unwrap();
    w.open(l2).unwrap();
    let mut p = wire(None);
    p.open(peer).unwrap();
    p.send(peer, l1, b"one..............").unwrap();
    p.send(peer, l2, b"two..............").unwrap();
    p.flush().unwrap();
    let mut got = drain(&mut w, 2, Duration::from_secs(2));
    got.sort_by_key(|(a, _)| a.local);
    assert_eq!(got.len(), 2);
    assert_eq!(
        (got[0].0.local, &got[0].1[..13]),
        (l1, &b"one.........."[..])
    );
    assert_eq!(
        (got[1].0.local, &got[1].1[..13]),
        (l2, &b"two.........."[..])
    );
    // replies go out from the address the packet came to
    w.send(l2, peer, &[5u8; 20]).unwrap();
    w.flush().unwrap();
    let r = drain(&mut p, 1, Duration::from_secs(2));
    assert_eq!(r[0].0.remote, l2);
}

/// Sends `n` numbered packets through a faulty sender; returns what arrived and both wires' stats.
fn faulty_run(spec: &str, la: &str, lb: &str, n: u32) -> (Vec<Vec<u8>>, WireStats, WireStats) {
    let (la, lb) = (addr(la), addr(lb));
    let (mut a, mut b) = (wire(Some(spec)), wire(None));
    a.open(la).unwrap();
    b.open(lb).unwrap();
    for i in 0..n {
        a.send(la, lb, &numbered(i)).unwrap();
        if i % 16 == 15 {
            a.flush().unwrap();
        }
    }
    a.flush().unwrap();
    // let held datagrams come due
    let end = Instant::now() + Duration::from_millis(300);
    while a.next_deadline().is_some() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
        a.flush().unwrap();
    }
    assert_eq!(a.next_deadline(), None);
    let got = drain(&mut b, usize::MAX, Duration::from_millis(200));
    (
        got.into_iter().map(|(_, p)| p).collect(),
        a.stats(),
        b.stats(),
    )
}

#[test]
fn faults_on_send_loss_dup_reorder_delay_corrupt() {
    let n = 2000;
    let spec = "loss=0.1,dup=0.05,reorder=0.05,delay=0.05:2ms,corrupt=0.02,seed=7";
    let (got, sa, sb) = faulty_run(spec, "127.0.1.8", "127.0.1.9", n);
    let fs = sa.faults_send;
    assert!(fs.dropped > 150 && fs.dropped < 250, "{fs:?}");
    assert!(fs.duplicated > 50 && fs.reordered > 50 && fs.delayed > 40 && fs.corrupted > 15);
    // Corrupted datagrams (a duplicate of one counts twice) fail the receiver's ICRC check.
    let icrc_errors = sb.icrc_errors;
    let expect = n as u64 - fs.dropped + fs.duplicated;
    assert_eq!(got.len() as u64 + icrc_errors, expect, "{fs:?}");
    assert!(icrc_errors >= fs.corrupted, "{icrc_errors} {fs:?}");
    let out_of_order = got.windows(2).filter(|w| w[0][..4] > w[1][..4]).count();
    assert!(out_of_order > 50, "reordered: {out_of_order}");
    let corrupted = got
        .iter()
        .filter(|p| {
            p[4..] != numbered(0)[4..] || u32::from_be_bytes(p[..4].try_into().unwrap()) >= n
        })
        .count();
    assert!(corrupted > 0);
    // Same seed, same decisions.
    let (again, sa2, _) = faulty_run(spec, "127.0.1.10", "127.0.1.11", n);
    assert_eq!(sa2.faults_send, fs);
    // The same datagrams (without the ICRC, which covers the addresses); the order of delayed
    // ones may differ.
    let strip = |v: &[Vec<u8>]| {
        let mut v: Vec<Vec<u8>> = v.iter().map(|p| p[..56].to_vec()).collect();
        v.sort();
        v
    };
    assert!(strip(&got) == strip(&again), "same seed, same datagrams");
}

#[test]
fn faults_on_receive() {
    let (la, lb) = (addr("127.0.1.12"), addr("127.0.1.13"));
    let mut a = wire(None);
    let mut b = wire(Some("dup=1,dir=recv"));
    a.open(la).unwrap();
    b.open(lb).unwrap();
    for i in 0..10 {
        a.send(la, lb, &numbered(i)).unwrap();
    }
    a.flush().unwrap();
    let got = drain(&mut b, 20, Duration::from_secs(2));
    assert_eq!(got.len(), 20);
    assert_eq!(b.stats().faults_recv.duplicated, 10);
    assert_eq!(a.stats().faults_send.duplicated, 0);
    let mut c = wire(Some("loss=1,dir=both"));
    c.open(addr("127.0.1.14")).unwrap();
    c.send(addr("127.0.1.14"), lb, &[9u8; 20]).unwrap();
    c.flush().unwrap();
    assert!(drain(&mut b, 1, Duration::from_millis(100)).is_empty());
}

/// `local=`: faults only on the datagrams of one local address (one port of a group).
#[test]
fn faults_on_one_local_address_only() {
    let (lossy, clean, to) = (addr("127.0.1.20"), addr("127.0.1.21"), addr("127.0.1.22"));
    let mut a = wire(Some("loss=1,dir=both,local=127.0.1.20"));
    let mut b = wire(None);
    a.open(lossy).unwrap();
    a.open(clean).unwrap();
    b.open(to).unwrap();
    for i in 0..5 {
        a.send(lossy, to, &numbered(i)).unwrap();
        a.send(clean, to, &numbered(100 + i)).unwrap();
    }
    a.flush().unwrap();
    let got = drain(&mut b, 10, Duration::from_millis(300));
    let mut seqs: Vec<u32> = got
        .iter()
        .map(|(arr, p)| {
            assert_eq!(
                arr.remote.ip(),
                clean.ip(),
                "only the clean address's datagrams"
            );
            u32::from_be_bytes(p[..4].try_into().unwrap())
        })
        .collect();
    seqs.sort();
    assert_eq!(seqs, (100..105).collect::<Vec<_>>());
    assert_eq!(a.stats().faults_send.dropped, 5);
    // and on receive: what arrives on the lossy address is dropped, the rest delivered
    for i in 0..3 {
        b.send(to, lossy, &numbered(i)).unwrap();
        b.send(to, clean, &numbered(200 + i)).unwrap();
    }
    b.flush().unwrap();
    let got = drain(&mut a, 6, Duration::from_millis(300));
    assert!(
        got.iter().all(|(arr, _)| arr.local.ip() == clean.ip()),
        "{got:?}"
    );
    assert_eq!(got.len(), 3);
    assert_eq!(a.stats().faults_recv.dropped, 3);
}

#[test]
fn wait_fd_polls_readable() {
    let (la, lb) = (addr("127.0.1.15"), addr("127.0.1.16"));
    let (mut a, mut b) = (wire(None), wire(None));
    a.open(la).unwrap();
    b.open(lb).unwrap();
    assert!(!wait_readable(&b, Duration::from_millis(0)));
    a.send(la, lb, &[7u8; 20]).unwrap();
    a.flush().unwrap();
    assert!(wait_readable(&b, Duration::from_secs(2)));
    assert_eq!(drain(&mut b, 1, Duration::from_secs(1)).len(), 1);
}

#[test]
fn bad_icrc_is_dropped_and_counted() {
    let lb = addr("127.0.1.17");
    let mut b = wire(None);
    b.open(lb).unwrap();
    // A plain UDP sender that writes no valid ICRC.
    let raw = std::net::UdpSocket::bind("127.0.1.18:0").unwrap();
    raw.send_to(&[0x04u8; 40], "127.0.1.17:4791").unwrap();
    raw.send_to(&[1u8; 3], "127.0.1.17:4791").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(drain(&mut b, 1, Duration::from_millis(100)).is_empty());
    assert_eq!(b.stats().icrc_errors, 2);
    // Sending refuses a packet with no room for BTH and ICRC, and mixed families.
    assert_eq!(
        b.send(lb, lb, &[0u8; 15]).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(
        b.send(lb, addr("::1"), &[0u8; 16]).unwrap_err().errno(),
        libc::EINVAL
    );
}
