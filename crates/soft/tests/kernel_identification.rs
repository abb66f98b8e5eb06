//! What the kernel really sends: capture our datagrams on `lo` with an AF_PACKET socket and
//! recompute the ICRC over the real IP and UDP headers. Needs root (CAP_NET_RAW); prints
//! SKIPPED otherwise. Only loopback addresses are used.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use rdma_soft::io::{DatagramWire, TxMeta, UdpConfig, UdpWire, WireAddr};
use rdma_wire::icrc::Encap;

/// Root, or a skip (a failure under `RDMA_REQUIRE_ROOT=1`) naming what needs it.
fn root_for(test: &str, what: &str) -> bool {
    if rdma_testhosts::is_root() {
        return true;
    }
    rdma_testhosts::skip(test, &format!("needs root for {what}"));
    false
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
    if !root_for("kernel_sends_identification_zero", "an AF_PACKET socket") {
        return;
    }
    let cap = capture_lo(libc::ETH_P_IP as u16);
    let (la, lb): (WireAddr, WireAddr) =
        ("127.0.1.30".parse().unwrap(), "127.0.1.31".parse().unwrap());
    // one datagram per packet (without GSO: `gso_segments_carry_their_identification`
    // covers that)
    // Raw packets to made-up QPNs: a wire that does not share (a sharing one drops them).
    let cfg = UdpConfig {
        gso: false,
        share: false,
        ..UdpConfig::default()
    };
    let mut a = UdpWire::new(cfg.clone()).unwrap();
    let mut b = UdpWire::new(cfg).unwrap();
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
    if !root_for("ipv6_icrc_over_the_real_header", "an AF_PACKET socket") {
        return;
    }
    let cap = capture_lo(libc::ETH_P_IPV6 as u16);
    let l6: WireAddr = "::1".parse().unwrap();
    let mut w = UdpWire::new(UdpConfig {
        port: 47913,
        share: false,
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
    // an RC path's socket connected to its peer: the ICRC holds over its real header too
    let sport = 0xC326u16;
    w.prepare_path(l6, sport, l6);
    w.send_from_port(l6, l6, sport, TxMeta::default(), &roce_packet(0xa7))
        .unwrap();
    w.flush().unwrap();
    assert_eq!(w.stats().sent_connected, 1, "sent connected");
    let connected = |p: &[u8]| {
        p.len() > 48 && p[6] == 17 && p[40..42] == sport.to_be_bytes() && p[60..64] == [0xa7; 4]
    };
    let ip = find(&cap, connected).expect("captured the connected socket's datagram");
    let encap = Encap::from_headers(&ip[..40], &ip[40..48]).unwrap();
    encap
        .verify(&ip[48..])
        .expect("ICRC over the connected socket's real IPv6/UDP header");
}

/// An IPv4 RC path is prepared but stays unconnected: a connected IPv4 socket would number
/// its Identification from a random counter, and the ICRC (sealed for 0) would not hold
/// over the real header.
#[test]
fn an_ipv4_path_keeps_identification_zero() {
    if !root_for(
        "an_ipv4_path_keeps_identification_zero",
        "an AF_PACKET socket",
    ) {
        return;
    }
    let cap = capture_lo(libc::ETH_P_IP as u16);
    let (la, lb): (WireAddr, WireAddr) =
        ("127.0.1.32".parse().unwrap(), "127.0.1.33".parse().unwrap());
    let mut a = UdpWire::new(UdpConfig {
        gso: false,
        share: false,
        ..UdpConfig::default()
    })
    .unwrap();
    a.open(la).unwrap();
    let sport = 0xC327u16;
    a.prepare_path(la, sport, lb);
    for _ in 0..3 {
        a.send_from_port(la, lb, sport, TxMeta::default(), &roce_packet(0x5b))
            .unwrap();
    }
    a.flush().unwrap();
    let ours = |p: &[u8]| {
        p.len() > 28
            && p[0] == 0x45
            && p[9] == 17
            && p[12..16] == [127, 0, 1, 32]
            && p[20..22] == sport.to_be_bytes()
    };
    for k in 0..3 {
        let ip = find(&cap, ours).expect("captured our datagram on lo");
        assert_eq!(
            u16::from_be_bytes([ip[4], ip[5]]),
            0,
            "Identification of datagram {k}"
        );
        let encap = Encap::from_headers(&ip[..20], &ip[20..28]).unwrap();
        encap
            .verify(&ip[28..])
            .expect("ICRC over the real IP/UDP header");
    }
    let s = a.stats();
    assert_eq!((s.sent_connected, s.peer_sockets), (0, 0), "{s:?}");
}

/// `ioctl(SIOCETHTOOL)` on `lo` with `data` as `ifr_data`.
fn ethtool(sock: &OwnedFd, data: &mut [u8]) -> std::io::Result<()> {
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        data: *mut u8,
        _pad: [u8; 16],
    }
    let mut req = IfReq {
        name: [0; 16],
        data: data.as_mut_ptr(),
        _pad: [0; 16],
    };
    req.name[..2].copy_from_slice(b"lo");
    // SAFETY: SIOCETHTOOL reads the ifreq and the command buffer it points to, which are
    // large enough for the command written at its start.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), 0x8946, &mut req) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// In this thread's (fresh) network namespace: brings `lo` up and turns its UDP
/// segmentation offload off, so that the kernel segments a GSO message before the capture
/// point and the capture sees the datagrams a real wire carries.
fn lo_up_without_udp_offload() -> std::io::Result<()> {
    // SAFETY: plain socket(2); checked.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: all-zero ifreq is valid; name and flags set below.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    ifr.ifr_name[0] = b'l' as libc::c_char;
    ifr.ifr_name[1] = b'o' as libc::c_char;
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS on a valid ifreq.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut ifr) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // the index of "tx-udp-segmentation" among the feature names
    const ETH_SS_FEATURES: u32 = 4;
    let mut info = [0u8; 8 + 8 + 4];
    info[..4].copy_from_slice(&0x37u32.to_ne_bytes()); // ETHTOOL_GSSET_INFO
    info[8..16].copy_from_slice(&(1u64 << ETH_SS_FEATURES).to_ne_bytes());
    ethtool(&sock, &mut info)?;
    let count = u32::from_ne_bytes(info[16..20].try_into().unwrap()) as usize;
    let mut names = vec![0u8; 12 + 32 * count];
    names[..4].copy_from_slice(&0x1bu32.to_ne_bytes()); // ETHTOOL_GSTRINGS
    names[4..8].copy_from_slice(&ETH_SS_FEATURES.to_ne_bytes());
    names[8..12].copy_from_slice(&(count as u32).to_ne_bytes());
    ethtool(&sock, &mut names)?;
    let idx = (0..count)
        .find(|&i| {
            let n = &names[12 + 32 * i..12 + 32 * (i + 1)];
            n.starts_with(b"tx-udp-segmentation\0")
        })
        .ok_or_else(|| std::io::Error::other("no tx-udp-segmentation feature"))?;
    let blocks = count.div_ceil(32);
    let mut set = vec![0u8; 8 + 8 * blocks];
    set[..4].copy_from_slice(&0x3bu32.to_ne_bytes()); // ETHTOOL_SFEATURES
    set[4..8].copy_from_slice(&(blocks as u32).to_ne_bytes());
    let b = 8 + 8 * (idx / 32);
    set[b..b + 4].copy_from_slice(&(1u32 << (idx % 32)).to_ne_bytes()); // valid; requested 0
    ethtool(&sock, &mut set)
}

/// A RoCE packet of `payload` bytes tagged `tag` (BTH, payload, ICRC room).
fn sized_packet(tag: u8, payload: usize) -> Vec<u8> {
    let mut p = vec![0u8; 12 + payload + 4];
    p[0] = 0x04; // RC SEND_ONLY
    p[2..4].copy_from_slice(&[0xff, 0xff]);
    p[7] = 0x11;
    p[12..12 + payload].fill(tag);
    p
}

#[test]
fn gso_segments_carry_their_identification() {
    if !root_for(
        "gso_segments_carry_their_identification",
        "a network namespace",
    ) {
        return;
    }
    // A private network namespace (this thread only): its `lo` is ours to reconfigure.
    std::thread::spawn(|| {
        // SAFETY: unshare of this thread's network namespace; no preconditions.
        // As root both must work: a failure here is a failure, not a skip (it used to print
        // SKIPPED and pass, having tested nothing).
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            panic!(
                "unshare(CLONE_NEWNET) as root: {}",
                std::io::Error::last_os_error()
            );
        }
        if let Err(e) = lo_up_without_udp_offload() {
            panic!("cannot turn lo's UDP segmentation offload off: {e}");
        }
        let cap = capture_lo(libc::ETH_P_IP as u16);
        let (la, lb): (WireAddr, WireAddr) =
            ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let alone = UdpConfig {
            share: false,
            ..UdpConfig::default()
        };
        let mut a = UdpWire::new(alone.clone()).unwrap();
        let mut b = UdpWire::new(alone).unwrap();
        a.open(la).unwrap();
        b.open(lb).unwrap();
        // three of one size and a shorter last: one GSO message of four segments
        let sizes = [1000, 1000, 1000, 500];
        for (k, &n) in sizes.iter().enumerate() {
            a.send(la, lb, &sized_packet(0x60 + k as u8, n)).unwrap();
        }
        a.flush().unwrap();
        assert_eq!(a.stats().send_calls, 1);
        assert_eq!(a.stats().sent, 4, "{:?}", a.stats());
        assert_eq!(a.stats().gso_refused, 0);
        for (k, &n) in sizes.iter().enumerate() {
            let tag = 0x60 + k as u8;
            let seg = |p: &[u8]| {
                p.len() == 20 + 8 + 12 + n + 4
                    && p[0] == 0x45
                    && p[9] == 17
                    && p[12..16] == [127, 0, 0, 1]
                    && p[16..20] == [127, 0, 0, 2]
                    && p[40] == tag
            };
            let ip = find(&cap, seg).expect("captured the segment as its own datagram");
            let id = u16::from_be_bytes([ip[4], ip[5]]);
            println!("segment {k}: Identification {id}, {} bytes", ip.len());
            assert_eq!(id, k as u16, "Identification of segment {k}");
            let encap = Encap::from_headers(&ip[..20], &ip[20..28]).unwrap();
            encap
                .verify(&ip[28..])
                .expect("ICRC over the segment's real IP/UDP header");
        }
        let mut got = 0;
        let end = Instant::now() + Duration::from_secs(2);
        while got < 4 && Instant::now() < end {
            got += b.recv(&mut |_, _| {}).unwrap();
        }
        assert_eq!(got, 4);
        assert_eq!(b.stats().icrc_errors, 0);
    })
    .join()
    .unwrap();
}
