//! What the kernel really sends: capture our datagrams on `lo` with an AF_PACKET socket and
//! recompute the ICRC over the real IP and UDP headers. Needs root (CAP_NET_RAW); prints
//! SKIPPED otherwise. Only loopback addresses are used.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use rdma_soft::io::{DatagramWire, UdpConfig, UdpWire, WireAddr};
use rdma_wire::icrc::Encap;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A packet socket on `lo` that sees IP packets of `ethertype` from the network header on.
fn capture_lo(ethertype: u16) -> OwnedFd {
    // SAFETY: plain socket(2); checked below.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            i32::from(ethertype.to_be()),
        )
    };
    assert!(
        raw >= 0,
        "AF_PACKET socket: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: all-zero sockaddr_ll is valid; filled below.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ethertype.to_be();
    // SAFETY: a NUL-terminated name.
    sll.sll_ifindex = unsafe { libc::if_nametoindex(c"lo".as_ptr()) } as i32;
    // SAFETY: `sll` is a valid sockaddr_ll of the given size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(rc, 0, "bind AF_PACKET: {}", std::io::Error::last_os_error());
    fd
}

/// Reads captured packets until `want` accepts one, for at most two seconds.
fn find(fd: &OwnedFd, want: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
    let end = Instant::now() + Duration::from_secs(2);
    let mut buf = vec![0u8; 70_000];
    while Instant::now() < end {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let pkt = &buf[..n as usize];
        if want(pkt) {
            return Some(pkt.to_vec());
        }
    }
    None
}

fn roce_packet(tag: u8) -> Vec<u8> {
    let mut p = vec![0u8; 12 + 40 + 4];
    p[0] = 0x04; // RC SEND_ONLY
    p[2..4].copy_from_slice(&[0xff, 0xff]);
    p[7] = 0x11;
    p[12..52].fill(tag);
    p
}

#[test]
fn kernel_sends_identification_zero() {
    if !is_root() {
        println!("SKIPPED: kernel_sends_identification_zero needs root for an AF_PACKET socket");
        return;
    }
    let cap = capture_lo(libc::ETH_P_IP as u16);
    let (la, lb): (WireAddr, WireAddr) =
        ("127.0.1.30".parse().unwrap(), "127.0.1.31".parse().unwrap());
    let mut a = UdpWire::new(UdpConfig::default()).unwrap();
    let mut b = UdpWire::new(UdpConfig::default()).unwrap();
    a.open(la).unwrap();
    b.open(lb).unwrap();
    for _ in 0..3 {
        a.send(la, lb, &roce_packet(0x5a)).unwrap();
    }
    a.flush().unwrap();
    let ours = |p: &[u8]| {
        p.len() > 28
            && p[0] == 0x45
            && p[9] == 17
            && p[12..16] == [127, 0, 1, 30]
            && p[16..20] == [127, 0, 1, 31]
            && p[22..24] == 4791u16.to_be_bytes()
    };
    let ip = find(&cap, ours).expect("captured our datagram on lo");
    let id = u16::from_be_bytes([ip[4], ip[5]]);
    let flags_frag = u16::from_be_bytes([ip[6], ip[7]]);
    println!("kernel wrote Identification {id:#06x}, flags/fragment {flags_frag:#06x}");
    assert_eq!(id, 0, "Identification");
    assert_eq!(flags_frag, 0x4000, "DF, no fragment offset");
    // The ICRC we wrote is valid over the header the kernel really wrote.
    let encap = Encap::from_headers(&ip[..20], &ip[20..28]).unwrap();
    encap
        .verify(&ip[28..])
        .expect("ICRC over the real IP/UDP header");
    // And the receiving wire accepted all three exactly.
    let mut got = 0;
    let end = Instant::now() + Duration::from_secs(2);
    while got < 3 && Instant::now() < end {
        got += b.recv(&mut |_, _| {}).unwrap();
    }
    assert_eq!(got, 3);
    assert_eq!(b.stats().icrc_errors, 0);
    assert_eq!(b.stats().icrc_recovered_id, 0);
}

#[test]
fn ipv6_icrc_over_the_real_header() {
    if !is_root() {
        println!("SKIPPED: ipv6_icrc_over_the_real_header needs root for an AF_PACKET socket");
        return;
    }
    let cap = capture_lo(libc::ETH_P_IPV6 as u16);
    let l6: WireAddr = "::1".parse().unwrap();
    let mut w = UdpWire::new(UdpConfig {
        port: 47913,
        ..UdpConfig::default()
    })
    .unwrap();
    w.open(l6).unwrap();
    let pkt = roce_packet(0xa6);
    w.send(l6, l6, &pkt).unwrap();
    w.flush().unwrap();
    let ours = |p: &[u8]| {
        p.len() > 48 && p[6] == 17 && p[42..44] == 47913u16.to_be_bytes() && p[60..64] == [0xa6; 4]
    };
    let ip = find(&cap, ours).expect("captured our IPv6 datagram on lo");
    let encap = Encap::from_headers(&ip[..40], &ip[40..48]).unwrap();
    encap
        .verify(&ip[48..])
        .expect("ICRC over the real IPv6/UDP header");
}
