//! Replaying a Linux peer's IPv6 CM REQ from a capture into our passive side (the
//! `cm_linux_ipv6_*` tests): the pcap reader, and one replay between two namespace hosts that
//! hold the capture's addresses (so the captured ICRC stays valid). Needs root.

#![allow(dead_code)]

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::path::Path;
use std::time::Duration;

use rdma_testhosts::Topology;
use rdmacm::cm::{CmId, Cma, ConnParam, EventChannel, EventType, PortSpace};

const T: Duration = Duration::from_secs(10);

/// A captured CM REQ: IPv6 source and destination, UDP source port and checksum, UDP
/// payload.
pub struct Req {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub sport: u16,
    pub csum: u16,
    pub payload: Vec<u8>,
}

impl Req {
    /// The REQ's MAD (after BTH and DETH).
    pub fn mad(&self) -> &[u8] {
        mad(&self.payload)
    }
}

/// The MAD of a UD SEND to QP1: after its BTH (12 bytes) and DETH (8).
fn mad(d: &[u8]) -> &[u8] {
    &d[20..20 + 256]
}

/// The UD SENDs to QP1 carrying a CM REQ (attribute 0x0010) in the pcap at `path`, in order.
pub fn reqs(path: &Path) -> Vec<Req> {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
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
        // BTH: opcode UD SEND_ONLY (0x64), destination QP 1; then DETH (8), the MAD
        let dqp = u32::from_be_bytes([0, payload[5], payload[6], payload[7]]);
        if payload[0] != 0x64 || dqp != 1 || payload.len() < 20 + 256 + 4 {
            continue;
        }
        if be16(mad(payload), 16) != 0x0010 {
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

/// How a replay sends the REQ.
pub struct Replay<'a> {
    /// The topology's name (short: it names the namespaces).
    pub name: &'a str,
    /// The capture's addresses are link-local (the sockets take eth0's scope).
    pub link_local: bool,
    /// The prefix length of both hosts' addresses.
    pub prefix: u8,
    /// Called on the REQ's socket before it sends (e.g. a zero UDP checksum, as rxe).
    pub prepare: fn(&UdpSocket),
}

/// Replays `req` from the "Linux" host at our listener on the "us" host: the listener must
/// report CONNECT_REQUEST with Linux's addresses and answer with a REP to it (no REJ).
pub fn replay(req: &Req, how: &Replay<'_>) {
    let m = req.mad();
    let service = u64::from_be_bytes(m[32..40].try_into().unwrap());
    let port = (service & 0xffff) as u16;
    assert_eq!(service >> 16, 0x0000_0000_0106, "RDMA_PS_TCP service id");
    let req_comm = u32::from_be_bytes(m[24..28].try_into().unwrap());
    let (lin, us) = (req.src, req.dst);
    let topo = Topology::builder(how.name)
        .host("linux")
        .host("us")
        .link("linux", "eth0", "us", "eth0")
        .addr("linux", "eth0", &format!("{lin}/{}", how.prefix))
        .addr("us", "eth0", &format!("{us}/{}", how.prefix))
        .build()
        .expect("topology");
    let (lh, uh) = (topo.host("linux"), topo.host("us"));
    let link_local = how.link_local;
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
                let mut ev = ev.expect("CONNECT_REQUEST for Linux's REQ");
                assert_eq!(ev.kind(), EventType::ConnectRequest, "{}", ev.status());
                let id = ev.take_id().unwrap();
                drop(ev);
                assert_eq!(
                    id.peer_addr().unwrap().ip(),
                    IpAddr::V6(lin),
                    "Linux's address"
                );
                assert_eq!(id.local_addr().unwrap().ip(), IpAddr::V6(us));
                id.create_qp_default().unwrap();
                id.accept(&ConnParam::default()).unwrap();
                // keep the id until the REP was seen
                std::thread::sleep(Duration::from_millis(500));
                drop(id);
            })
        });
        rx.recv().unwrap();
        let prepare = how.prepare;
        lh.run(move || {
            let rep_sock = UdpSocket::bind(SocketAddrV6::new(lin, 4791, 0, lscope)).expect("4791");
            rep_sock.set_read_timeout(Some(T)).unwrap();
            let req_sock =
                UdpSocket::bind(SocketAddrV6::new(lin, req.sport, 0, lscope)).expect("sport");
            prepare(&req_sock);
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
                let m = mad(d);
                let attr = u16::from_be_bytes([m[16], m[17]]);
                assert_ne!(attr, 0x0012, "REJ: {m:02x?}");
                if attr == 0x0013 {
                    // REP: its remote comm id is the REQ's local comm id
                    let remote = u32::from_be_bytes(m[28..32].try_into().unwrap());
                    assert_eq!(remote, req_comm, "the REP answers Linux's REQ");
                    break;
                }
            }
        });
        server.join().unwrap();
    });
}
