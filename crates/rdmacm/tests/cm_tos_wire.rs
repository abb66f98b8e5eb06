//! `RDMA_OPTION_ID_TOS` on the wire (root; SKIPPED otherwise): two namespace hosts connect
//! through rdmacm ids with `set_option(Tos)` and move data (RC SEND, WRITE, READ) over IPv4
//! and IPv6; an AF_PACKET capture on the server's veth sees every RoCEv2 datagram of both
//! directions, CM MADs (REQ, REP, RTU, DREQ, DREP) and data (SEND, WRITE, READ request, READ
//! responses, ACKs) alike, and each must carry the id's TOS in its IPv4 TOS / IPv6 traffic
//! class byte, as Linux rxe and rdma_cm send it. Each single datagram's ICRC is also checked
//! over the IP/UDP header the kernel really wrote (the ICRC masks that byte).

mod support_cm;
mod support_hosts;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rdma_soft::verbs::{AccessFlags, RecvWr, SendOp, SendWr, WcStatus};
use rdma_testhosts::capture::{Capture, Roce};
use rdma_testhosts::{require_root, topologies, Host};
use rdma_wire::icrc::Encap;
use rdmacm::cm::{CmId, CmOption, Cma, ConnParam, Event, EventChannel, EventType, PortSpace};
use support_cm::expect_within;
use support_hosts::*;

const T: Duration = Duration::from_secs(10);
/// A hang guard, not a speed target: a wait that passes it has stopped, not slowed.
const HANG: Duration = Duration::from_secs(120);
const LEN: usize = 3000; // three packets at the veth's RoCE MTU of 1024

fn expect(ch: &EventChannel, kind: EventType) -> Event {
    expect_within(ch, kind, T)
}

/// The server: a listener with TOS `tos` on `addr`; accepts one connection with a
/// remotely readable and writable region (its address and rkey in the private data),
/// takes one SEND, answers the disconnect.
fn server(h: &Host, addr: SocketAddr, tos: Option<u8>, ready: mpsc::Sender<()>) -> Vec<u8> {
    h.run(move || {
        let cma = Cma::new().unwrap();
        let ch = EventChannel::with_cma(&cma).unwrap();
        let l = CmId::new(&ch, PortSpace::Tcp).unwrap();
        if let Some(tos) = tos {
            l.set_option(CmOption::Tos(tos)).unwrap();
        }
        l.bind_addr(addr).unwrap();
        l.listen(0).unwrap();
        ready.send(()).unwrap();
        let mut ev = expect(&ch, EventType::ConnectRequest);
        let id = ev.take_id().unwrap();
        drop(ev);
        let qp = id.create_qp_default().unwrap();
        let region: Vec<u8> = (0..2 * 4096).map(|i| (i * 7 % 251) as u8).collect();
        let mr = qp
            .pd()
            .register(
                region,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap();
        let inbox = qp
            .pd()
            .register(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)
            .unwrap();
        qp.post_recv(&RecvWr::new(1).with_sge(inbox.sge(0, 4096).unwrap()))
            .unwrap();
        let mut pd = mr.addr().to_be_bytes().to_vec();
        pd.extend_from_slice(&mr.rkey().to_be_bytes());
        id.accept(&ConnParam {
            private_data: pd,
            ..Default::default()
        })
        .unwrap();
        expect(&ch, EventType::Established);
        let mut wc = Vec::new();
        let hang = Instant::now() + HANG;
        while qp.recv_cq().poll(&mut wc, 1) == 0 {
            assert!(Instant::now() < hang, "hang: no SEND arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            (wc[0].status, wc[0].byte_len),
            (WcStatus::Success, LEN as u32)
        );
        expect(&ch, EventType::Disconnected);
        id.disconnect().unwrap();
        let mut got = vec![0u8; LEN];
        inbox.read(0, &mut got).unwrap();
        // what the client wrote at the start of the region
        let mut written = vec![0u8; LEN];
        mr.read(0, &mut written).unwrap();
        got.extend_from_slice(&written);
        got
    })
}

/// The client: an id with TOS `tos` connects to `dst`, SENDs, WRITEs and READs `LEN`
/// bytes each, then disconnects. Returns what the READ brought.
fn client(h: &Host, dst: SocketAddr, tos: u8) -> Vec<u8> {
    h.run(move || {
        let cma = Cma::new().unwrap();
        let ch = EventChannel::with_cma(&cma).unwrap();
        let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
        id.set_option(CmOption::Tos(tos)).unwrap();
        id.resolve_addr(None, dst, T).unwrap();
        expect(&ch, EventType::AddrResolved);
        id.resolve_route(T).unwrap();
        expect(&ch, EventType::RouteResolved);
        assert_eq!(id.path().unwrap().traffic_class, tos, "stored in the path");
        let qp = id.create_qp_default().unwrap();
        let mine = qp
            .pd()
            .register(vec![0u8; 3 * 4096], AccessFlags::LOCAL_WRITE)
            .unwrap();
        mine.write(0, &[0x5e; LEN]).unwrap();
        mine.write(4096, &[0x3a; LEN]).unwrap();
        id.connect(&ConnParam::default()).unwrap();
        let ev = expect(&ch, EventType::Established);
        let pd = ev.private_data().to_vec();
        drop(ev);
        let raddr = u64::from_be_bytes(pd[..8].try_into().unwrap());
        let rkey = u32::from_be_bytes(pd[8..12].try_into().unwrap());
        qp.post_send(
            &SendWr::new(1, SendOp::Send)
                .with_sge(mine.sge(0, LEN as u32).unwrap())
                .signaled(),
        )
        .unwrap();
        qp.post_send(
            &SendWr::new(
                2,
                SendOp::RdmaWrite {
                    remote_addr: raddr,
                    rkey,
                },
            )
            .with_sge(mine.sge(4096, LEN as u32).unwrap())
            .signaled(),
        )
        .unwrap();
        qp.post_send(
            &SendWr::new(
                3,
                SendOp::RdmaRead {
                    remote_addr: raddr + 4096,
                    rkey,
                },
            )
            .with_sge(mine.sge(2 * 4096, LEN as u32).unwrap())
            .signaled(),
        )
        .unwrap();
        let mut wc = Vec::new();
        let hang = Instant::now() + HANG;
        while wc.len() < 3 {
            let mut more = Vec::new();
            if qp.send_cq().poll(&mut more, 3) == 0 {
                assert!(Instant::now() < hang, "hang: completions {wc:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
            wc.extend(more);
        }
        for (k, c) in wc.iter().enumerate() {
            assert_eq!((c.wr_id, c.status), (k as u64 + 1, WcStatus::Success));
        }
        id.disconnect().unwrap();
        expect(&ch, EventType::Disconnected);
        let mut read = vec![0u8; LEN];
        mine.read(2 * 4096, &mut read).unwrap();
        read
    })
}

/// What each kind of datagram was seen with: name -> (count, traffic classes seen).
fn classify(pkts: &[Roce], client: IpAddr) -> BTreeMap<String, (usize, Vec<u8>)> {
    let mut seen: BTreeMap<String, (usize, Vec<u8>)> = BTreeMap::new();
    for p in pkts {
        let from = if p.src == client { "client" } else { "server" };
        let what = match (p.dest_qp, p.cm_attr, p.opcode) {
            (1, Some(0x10), _) => "REQ".to_string(),
            (1, Some(0x13), _) => "REP".to_string(),
            (1, Some(0x14), _) => "RTU".to_string(),
            (1, Some(0x15), _) => "DREQ".to_string(),
            (1, Some(0x16), _) => "DREP".to_string(),
            (1, a, _) => format!("MAD {a:?}"),
            (_, _, 0x00..=0x05) => "SEND".to_string(),
            (_, _, 0x06..=0x0b) => "WRITE".to_string(),
            (_, _, 0x0c) => "READ request".to_string(),
            (_, _, 0x0d..=0x0f) => "READ response".to_string(),
            (_, _, 0x11) => "ACK".to_string(),
            (_, _, op) => format!("opcode {op:#04x}"),
        };
        let e = seen.entry(format!("{from} {what}")).or_default();
        e.0 += 1;
        if !e.1.contains(&p.tclass) {
            e.1.push(p.tclass);
        }
    }
    seen
}

/// `server_tos`: the listener's own TOS, or none (the connection then takes the REQ's).
fn run_case(client_ip: &str, server_sa: &str, tos: u8, server_tos: Option<u8>) {
    let t = topologies::two_hosts_one_link().unwrap();
    for h in ["a", "b"] {
        with_resolver(t.host(h), |r| wait_running(r, "eth0"));
    }
    let server_sa: SocketAddr = server_sa.parse().unwrap();
    let client_ip: IpAddr = client_ip.parse().unwrap();
    let rec = t.host("b").run(|| Capture::open("eth0")).unwrap().record();
    let (tx, rx) = mpsc::channel();
    let (served, read) = std::thread::scope(|s| {
        let srv = s.spawn(|| server(t.host("b"), server_sa, server_tos, tx));
        rx.recv().unwrap();
        let read = client(t.host("a"), server_sa, tos);
        (srv.join().unwrap(), read)
    });
    // the data moved
    assert_eq!(&served[..LEN], &[0x5e; LEN][..], "SEND payload");
    assert_eq!(&served[LEN..], &[0x3a; LEN][..], "WRITE payload");
    let want: Vec<u8> = (4096..4096 + LEN).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(read, want, "READ payload");
    // the DREP may still be on its way out of the server's queue
    std::thread::sleep(Duration::from_millis(100));
    let pkts: Vec<Roce> = rec
        .stop()
        .iter()
        .filter_map(|p| Roce::parse(p))
        .filter(|p| {
            (p.src == client_ip && p.dst == server_sa.ip())
                || (p.src == server_sa.ip() && p.dst == client_ip)
        })
        .collect();
    let seen = classify(&pkts, client_ip);
    println!("{server_sa} TOS {tos:#04x}: {seen:?}");
    for kind in [
        "client REQ",
        "server REP",
        "client RTU",
        "client DREQ",
        "server DREP",
        "client SEND",
        "client WRITE",
        "client READ request",
        "server READ response",
        "server ACK",
    ] {
        assert!(seen.contains_key(kind), "no {kind} captured: {seen:?}");
    }
    for (kind, (_, classes)) in &seen {
        assert_eq!(
            classes,
            &vec![tos],
            "{kind}: IP traffic class on the wire (want {tos:#04x})"
        );
    }
    // The data path leaves from the flow label's UDP source port (as rxe picks it), the
    // same on both ends: never 4791 (a socket that could not be had).
    let sports: std::collections::BTreeSet<u16> = pkts
        .iter()
        .filter(|p| p.dest_qp != 1)
        .map(|p| p.udp_sport)
        .collect();
    assert_eq!(sports.len(), 1, "data path source ports {sports:?}");
    assert!(sports.iter().all(|&p| p >= 0xC000), "{sports:?}");
    // The ICRC of each datagram is valid over the header the kernel wrote. The capture sees a
    // GSO message before segmentation: one longer than the veth's MTU is skipped, a short one
    // (two ACKs, say) is checked segment by segment.
    let mut checked = 0;
    for p in &pkts {
        if p.ip.len() > 1500 {
            continue;
        }
        verify_datagram(p).unwrap_or_else(|e| panic!("ICRC of {p:?}: {e}"));
        checked += 1;
    }
    // at least the five CM MADs, the READ request and an ACK
    assert!(checked >= 7, "ICRC checked on {checked} datagrams");
}

/// Checks the ICRC of a captured datagram, whole or, if that fails, as a UDP GSO message:
/// segments of one size (the last may be shorter), each sealed for the IPv4 Identification
/// of its place (the first's plus its index) as the kernel writes them when it segments.
fn verify_datagram(p: &Roce) -> Result<(), String> {
    let (ip, udp) = (&p.ip[..p.ip_len], &p.ip[p.ip_len..p.ip_len + 8]);
    let body = &p.ip[p.ip_len + 8..];
    let whole = Encap::from_headers(ip, udp).map_err(|e| format!("headers: {e}"))?;
    let Err(e) = whole.verify(body) else {
        return Ok(());
    };
    let v4 = ip[0] >> 4 == 4;
    let base = u16::from_be_bytes([ip[4], ip[5]]);
    // the smallest RoCEv2 packet: BTH, AETH, ICRC
    for size in 20..=body.len() / 2 {
        let ok = body.chunks(size).enumerate().all(|(k, seg)| {
            let mut h = ip.to_vec();
            if v4 {
                h[4..6].copy_from_slice(&base.wrapping_add(k as u16).to_be_bytes());
            }
            Encap::from_headers(&h, udp).is_ok_and(|enc| enc.verify(seg).is_ok())
        });
        if ok {
            return Ok(());
        }
    }
    Err(format!("{e} (whole, and as any GSO message)"))
}

#[test]
fn tos_reaches_the_wire_ipv4() {
    if !require_root("tos_reaches_the_wire_ipv4") {
        return;
    }
    run_case("192.0.2.1", "192.0.2.2:7491", 0x48, Some(0x48));
}

#[test]
fn tos_reaches_the_wire_ipv6() {
    if !require_root("tos_reaches_the_wire_ipv6") {
        return;
    }
    run_case("2001:db8:1::1", "[2001:db8:1::2]:7492", 0xb8, Some(0xb8));
}

/// A listener without a TOS of its own: the passive side's REP, ACKs and READ responses
/// carry the traffic class of the client's REQ, as with Linux (the path comes from the REQ).
#[test]
fn passive_side_takes_the_tos_of_the_req() {
    if !require_root("passive_side_takes_the_tos_of_the_req") {
        return;
    }
    run_case("192.0.2.1", "192.0.2.2:7493", 0x28, None);
}

/// A GSO message of two ACKs as the capture saw it before segmentation (from a run of
/// `passive_side_takes_the_tos_of_the_req`): valid segment by segment; one flipped bit in
/// its second ACK is caught.
#[test]
fn a_short_gso_message_is_checked_segment_by_segment() {
    let mut ip: Vec<u8> = vec![
        69, 40, 0, 68, 0, 0, 64, 0, 64, 17, 182, 125, 192, 0, 2, 2, 192, 0, 2, 1, 210, 144, 18,
        183, 0, 48, 132, 69, 17, 0, 255, 255, 0, 196, 0, 2, 0, 253, 168, 19, 31, 0, 0, 1, 248, 113,
        39, 207, 17, 0, 255, 255, 0, 196, 0, 2, 0, 253, 168, 22, 31, 0, 0, 2, 155, 164, 71, 208,
    ];
    let p = Roce::parse(&ip).expect("a RoCEv2 datagram");
    verify_datagram(&p).unwrap();
    ip[20 + 8 + 20 + 11] ^= 0x10;
    let bad = Roce::parse(&ip).expect("a RoCEv2 datagram");
    assert!(verify_datagram(&bad).is_err());
}
