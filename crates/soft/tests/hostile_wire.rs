//! What a datagram from the network can make the shared wire do: nothing before its ICRC
//! is checked (no file-system work, no steering-table change), and after that only what a
//! clock bounds. Loopback only (127.0.111.0/24 and ::1, ports 47950-47951), no root needed.
//!
//! One test per mechanism, each in this binary alone with the process-wide scan counter.

use std::io::Write;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

mod common;

use common::raw::{addr, packet, req, wire};
use rdma_soft::io::{claim_scans, DatagramWire, UdpWire, CLAIMS_FRESH};

/// The scan counter is process-wide: the tests of this binary take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Receives on `w` until nothing came for 20 ms, returning the tags delivered.
fn drain(w: &mut UdpWire) -> Vec<u32> {
    let mut got = Vec::new();
    let mut quiet = 0;
    let end = Instant::now() + Duration::from_secs(60);
    while quiet < 20 && Instant::now() < end {
        let n = w
            .recv(&mut |_, p| got.push(u32::from_be_bytes([p[12], p[13], p[14], p[15]])))
            .unwrap();
        if n == 0 {
            quiet += 1;
            std::thread::sleep(Duration::from_millis(1));
        } else {
            quiet = 0;
        }
    }
    got
}

/// Another process's claim on `port`: a file named for pid 1, its flock held (as its
/// owner holds it) while the returned file lives.
fn foreign_claim(ns: u64, ip: std::net::IpAddr, port: u16, seq: u32) -> std::fs::File {
    let dir = rdma_soft::config::runtime_dir().unwrap();
    let path = dir.join(format!("claim-{ns}-0106-{port}-1-{seq}"));
    let mut f = std::fs::File::create(&path).unwrap();
    // SAFETY: flock on an fd we own.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    writeln!(f, "{ip} 0").unwrap();
    f
}

/// 300 other listeners' claims in the runtime directory, then 50,000 REQ-shaped datagrams
/// with junk ICRCs, then 50,000 with good ones, for a service nobody listens on (each one
/// asks "does another process listen on it?"). The junk costs no read of the directory; the
/// good ones cost a read per `CLAIMS_FRESH` of the run, not one per datagram (the bound is a count
/// `RDMA_FLOOD_DATAGRAMS` sets the count.
#[test]
fn a_req_flood_costs_no_directory_reads_per_datagram() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n: u32 = std::env::var("RDMA_FLOOD_DATAGRAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let port = 47950;
    // Junk over IPv6: an ICRC there is right or wrong (over IPv4 the receiver also tries
    // the kernel's Identifications, which a random ICRC matches once in 2^15). Good ones
    // over IPv4, from another address.
    let (v6, v4, src) = (addr("::1"), addr("127.0.111.1"), addr("127.0.111.2"));
    let (mut a6, mut a4) = (wire(port), wire(port));
    a6.open(v6).unwrap();
    a4.open(v4).unwrap();
    a6.share_slot().unwrap().unwrap();
    a4.share_slot().unwrap().unwrap();
    let ns = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
    let claims: Vec<_> = (0..300u16)
        .map(|k| {
            let ip = if k % 2 == 0 { v6.ip() } else { v4.ip() };
            foreign_claim(ns, ip, 46000 + k, u32::from(k))
        })
        .collect();
    let nobody = (0x0106u64 << 16) | 45999;

    let junk = UdpSocket::bind((v6.ip(), 0)).unwrap();
    let to = std::net::SocketAddr::new(v6.ip(), port);
    let before = claim_scans();
    let icrc_before = a6.stats().icrc_errors;
    let mut received = 0;
    for k in 0..n {
        let mut p = req(nobody, k);
        let l = p.len();
        p[l - 4..].copy_from_slice(&k.to_le_bytes());
        junk.send_to(&p, to).unwrap();
        if k % 32 == 31 {
            received += drain_quick(&mut a6);
        }
    }
    received += drain(&mut a6).len();
    let bad = a6.stats().icrc_errors - icrc_before;
    assert_eq!(received, 0, "a datagram with a junk ICRC was delivered");
    assert!(bad > u64::from(n) / 4, "only {bad} of {n} reached the wire");
    assert_eq!(claim_scans() - before, 0, "directory reads for junk");

    // Good ICRCs, from our own wire.
    let mut s = wire(port);
    s.open(src).unwrap();
    let before = claim_scans();
    let start = Instant::now();
    let mut delivered = 0;
    for k in 0..n {
        s.send(src, v4, &req(nobody, k)).unwrap();
        if k % 32 == 31 {
            s.flush().unwrap();
            delivered += drain_quick(&mut a4);
        }
    }
    s.flush().unwrap();
    delivered += drain(&mut a4).len();
    let took = start.elapsed();
    let scans = claim_scans() - before;
    // The design reads about once per CLAIMS_FRESH of the run (~80 for 50,000 datagrams
    // here); a read per datagram would be n, one per receive batch of 32 n/32. The bound is
    // on the count, not the clock, so a loaded machine does not fail it.
    let bound = 2 + u64::from(n) / 50;
    assert!(delivered > 0, "good REQs for nobody's service are ours");
    assert!(
        scans <= bound,
        "{scans} directory reads for {n} datagrams in {took:?} (bound {bound}; \
         the claims are kept {CLAIMS_FRESH:?})"
    );
    drop(claims);
}

/// One receive round's worth, without waiting.
fn drain_quick(w: &mut UdpWire) -> usize {
    let mut got = 0;
    while w.recv(&mut |_, _| got += 1).unwrap() > 0 {}
    got
}

/// A GSO message (`UDP_SEGMENT`) whose segments name two members' QPs, with junk ICRCs,
/// 20 times: whichever member the kernel hands the batch to, nothing in it counts as
/// evidence of misdelivery, so the steering table never changes; legitimate traffic then
/// reaches each member.
#[test]
fn forged_gso_batches_never_change_the_steering_table() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let port = 47951;
    let (shared, src) = (addr("127.0.111.5"), addr("127.0.111.6"));
    let mut a = wire(port);
    let mut b = wire(port);
    a.open(shared).unwrap();
    b.open(shared).unwrap();
    let (sa, sb) = (
        a.share_slot().unwrap().unwrap(),
        b.share_slot().unwrap().unwrap(),
    );
    let ns = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
    let dir = rdma_soft::config::runtime_dir().unwrap();
    let tab = dir.join(format!("grp-{ns}-{shared}-{port}.tab"));
    let table = std::fs::read_to_string(&tab).unwrap();
    // Evidence would count once the table has settled.
    std::thread::sleep(Duration::from_millis(300));
    let sock = UdpSocket::bind((src.ip(), 0)).unwrap();
    let seg: libc::c_int = 24;
    // SAFETY: setsockopt with a valid int option on our socket.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            103, // UDP_SEGMENT
            (&seg as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
    let qpn = |slot: u8| (u32::from(slot) << 16) | 5;
    for round in 0..20u32 {
        let mut msg = Vec::new();
        for k in 0..8u32 {
            let slot = if k % 2 == 0 { sa } else { sb };
            let mut p = packet(qpn(slot), round * 100 + k);
            p[20..24].copy_from_slice(&(round ^ k).to_le_bytes()); // junk ICRC
            msg.extend_from_slice(&p);
        }
        sock.send_to(&msg, (shared.ip(), port)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let (ga, gb) = (drain(&mut a), drain(&mut b));
        assert!(
            ga.is_empty() && gb.is_empty(),
            "junk delivered: {ga:?} {gb:?}"
        );
    }
    assert_eq!(a.stats().misdelivered + b.stats().misdelivered, 0);
    assert!(a.stats().icrc_errors + b.stats().icrc_errors >= 20 * 8 / 2);
    assert_eq!(
        std::fs::read_to_string(&tab).unwrap(),
        table,
        "table changed"
    );
    // Legitimate traffic: every datagram reaches the member its QPN names.
    let mut s = wire(port);
    s.open(src).unwrap();
    for k in 0..10 {
        s.send(src, shared, &packet(qpn(sa), k)).unwrap();
        s.send(src, shared, &packet(qpn(sb), 1000 + k)).unwrap();
    }
    s.flush().unwrap();
    let (mut ga, mut gb) = (drain(&mut a), drain(&mut b));
    ga.sort_unstable();
    gb.sort_unstable();
    assert_eq!(ga, (0..10).collect::<Vec<_>>());
    assert_eq!(gb, (1000..1010).collect::<Vec<_>>());
}
