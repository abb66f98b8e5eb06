//! Linux rxe sends RoCEv2 over IPv6 with a zero UDP checksum (the ICRC covers the packet).
//! Our sockets used to let the kernel drop those datagrams, so a Linux peer's REQ (Linux
//! `rping -c` → our `rping -s` over 2001:db8::/64) and REP (our `rping -c` → Linux's
//! `rping -s` over fe80::) never reached us: the Linux client timed out, ours reported
//! UNREACHABLE -110. `captures/refvm-ipv6.pcap` is that traffic between our rping and Linux
//! 6.1 rxe in `../shared/refvm` (after the fix: both directions, global and link-local);
//! this test replays Linux's REQs from it as Linux sent them, checksum 0, between two
//! namespace hosts holding the capture's addresses (so the ICRC stays valid), and our
//! listener must answer each with a REP. Needs root.

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use rdma_testhosts::{require_root, Topology};
use rdmacm::cm::{CmId, Cma, ConnParam, EventChannel, EventType, PortSpace};

const T: Duration = Duration::from_secs(10);

/// A captured CM REQ: IPv6 source and destination, UDP ports and checksum, UDP payload.
struct Req {
    src: Ipv6Addr,
    dst: Ipv6Addr,
    sport: u16,
    csum: u16,
    payload: Vec<u8>,
}

/// The UD SENDs to QP1 carrying a CM REQ (attribute 0x0010) in the fixture, in order.
fn reqs() -> Vec<Req> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/captures/refvm-ipv6.pcap");
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&data[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "little-endian pcap");
    let be16 = |b: &[u8], at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= data.len() {
        let incl = u32::from_le_bytes(data[at + 8..at + 12].try_into().unwrap()) as usize;
        let pkt = &data[at + 16..at + 16 + incl];
        at += 16 + incl;
        if be16(pkt, 12) != 0x86dd || pkt[14 + 6] != 17 {
            continue;
        }
        let ip = &pkt[14..];
        let udp = &ip[40..];
        if be16(udp, 2) != 4791 {
            continue;
        }
        let payload = &udp[8..be16(udp, 4) as usize];
        let dqp = u32::from_be_bytes([0, payload[5], payload[6], payload[7]]);
        if payload[0] != 0x64 || dqp != 1 || payload.len() < 20 + 256 + 4 {
            continue;
        }
        if be16(&payload[20..], 16) != 0x0010 {
            continue;
        }
        out.push(Req {
            src: Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap()),
            dst: Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap()),
            sport: be16(udp, 0),
            csum: be16(udp, 6),
            payload: payload.to_vec(),
        });
    }
    out
}

/// Linux's REQs in the fixture: those from the VM's addresses (2001:db8::2, its fe80::).
fn linux_req(link_local: bool) -> Req {
    let vm: Ipv6Addr = if link_local {
        "fe80::5054:ff:fe00:202".parse().unwrap()
    } else {
        "2001:db8::2".parse().unwrap()
    };
    reqs()
        .into_iter()
        .find(|r| r.src == vm)
        .unwrap_or_else(|| panic!("a REQ from {vm} in the fixture"))
}

/// Sends like rxe: `UDP_NO_CHECK6_TX`, so the checksum field is 0 on the wire.
fn zero_checksum(s: &UdpSocket) {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt on a valid socket with a c_int of the right size.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_NO_CHECK6_TX,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "UDP_NO_CHECK6_TX: {}",
        std::io::Error::last_os_error()
    );
}

fn replay(link_local: bool) {
    let req = linux_req(link_local);
    assert_eq!(req.csum, 0, "rxe's IPv6 UDP checksum is 0 on the wire");
    let m = &req.payload[20..20 + 256];
    let service = u64::from_be_bytes(m[32..40].try_into().unwrap());
    let port = (service & 0xffff) as u16;
    let req_comm = u32::from_be_bytes(m[24..28].try_into().unwrap());
    let (lin, us) = (req.src, req.dst);
    let topo = Topology::builder(&format!("v6z{}", if link_local { "ll" } else { "g" }))
        .host("linux")
        .host("us")
        .link("linux", "eth0", "us", "eth0")
        .addr("linux", "eth0", &format!("{lin}/64"))
        .addr("us", "eth0", &format!("{us}/64"))
        .build()
        .expect("topology");
    let (lh, uh) = (topo.host("linux"), topo.host("us"));
    let scope = |h: &rdma_testhosts::Host| -> u32 {
        if !link_local {
            return 0;
        }
        // SAFETY: a valid C string.
        h.run(|| unsafe { libc::if_nametoindex(c"eth0".as_ptr()) })
    };
    let (lscope, uscope) = (scope(lh), scope(uh));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            uh.run(move || {
                let cma = Cma::new().unwrap();
                let ch = EventChannel::with_cma(&cma).unwrap();
                let l = CmId::new(&ch, PortSpace::Tcp).unwrap();
                l.bind_addr(SocketAddr::V6(SocketAddrV6::new(us, port, 0, uscope)))
                    .unwrap();
                l.listen(1).unwrap();
                tx.send(()).unwrap();
                let ev = ch.get_event_timeout(T).unwrap();
                let mut ev = ev.expect("CONNECT_REQUEST for Linux's zero-checksum REQ");
                assert_eq!(ev.kind(), EventType::ConnectRequest, "{}", ev.status());
                let id = ev.take_id().unwrap();
                drop(ev);
                assert_eq!(id.peer_addr().unwrap().ip(), IpAddr::V6(lin));
                id.create_qp_default().unwrap();
                id.accept(&ConnParam::default()).unwrap();
                // keep the id until the REP was seen
                std::thread::sleep(Duration::from_millis(500));
                drop(id);
            })
        });
        rx.recv().unwrap();
        lh.run(move || {
            let rep_sock = UdpSocket::bind(SocketAddrV6::new(lin, 4791, 0, lscope)).unwrap();
            rep_sock.set_read_timeout(Some(T)).unwrap();
            let req_sock = UdpSocket::bind(SocketAddrV6::new(lin, req.sport, 0, lscope)).unwrap();
            zero_checksum(&req_sock);
            req_sock
                .send_to(&req.payload, SocketAddrV6::new(us, 4791, 0, lscope))
                .unwrap();
            let mut buf = [0u8; 2048];
            loop {
                let (n, from) = rep_sock.recv_from(&mut buf).expect("a REP to the REQ");
                assert_eq!(from.ip(), IpAddr::V6(us));
                let d = &buf[..n];
                if d.len() < 20 + 256 || d[0] != 0x64 {
                    continue;
                }
                let m = &d[20..20 + 256];
                let attr = u16::from_be_bytes([m[16], m[17]]);
                assert_ne!(attr, 0x0012, "REJ: {m:02x?}");
                if attr == 0x0013 {
                    let remote = u32::from_be_bytes(m[28..32].try_into().unwrap());
                    assert_eq!(remote, req_comm, "the REP answers Linux's REQ");
                    break;
                }
            }
        });
        server.join().unwrap();
    });
}

#[test]
fn linux_zero_checksum_req_global() {
    if !require_root("linux_zero_checksum_req_global") {
        return;
    }
    replay(false);
}

#[test]
fn linux_zero_checksum_req_link_local() {
    if !require_root("linux_zero_checksum_req_link_local") {
        return;
    }
    replay(true);
}
