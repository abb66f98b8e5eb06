//! What a peer on the network must not be able to do to us: predict our PSNs, or make us
//! answer a third host by naming it in a REQ's IP CM header (loopback, no root needed).

mod support_cm;

use std::net::SocketAddr;
use std::time::Duration;

use rdmacm::cm::{CmId, Cma, ConnParam, Event, EventChannel, EventType, PortSpace};
use support_cm::expect_within;

const T: Duration = Duration::from_secs(5);

fn expect(ch: &EventChannel, kind: EventType) -> Event {
    expect_within(ch, kind, T)
}

/// The send PSNs of `n` connections made in a new context, client side then server side.
fn psns(addr: &str, n: usize) -> Vec<u32> {
    let cma = Cma::new().unwrap();
    let lch = EventChannel::with_cma(&cma).unwrap();
    let l = CmId::new(&lch, PortSpace::Tcp).unwrap();
    l.bind_addr(addr.parse().unwrap()).unwrap();
    l.listen(16).unwrap();
    let dst = l.local_addr().unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let ch = EventChannel::with_cma(&cma).unwrap();
        let c = CmId::new(&ch, PortSpace::Tcp).unwrap();
        c.resolve_addr(Some(SocketAddr::new(dst.ip(), 0)), dst, T)
            .unwrap();
        expect(&ch, EventType::AddrResolved);
        c.resolve_route(T).unwrap();
        expect(&ch, EventType::RouteResolved);
        c.create_qp_default().unwrap();
        c.connect(&ConnParam::default()).unwrap();
        let mut ev = expect(&lch, EventType::ConnectRequest);
        let s = ev.take_id().unwrap();
        drop(ev);
        s.create_qp_default().unwrap();
        s.accept(&ConnParam::default()).unwrap();
        expect(&ch, EventType::Established);
        expect(&lch, EventType::Established);
        out.push(c.qp().unwrap().query().unwrap().sq_psn);
        out.push(s.qp().unwrap().query().unwrap().sq_psn);
        c.disconnect().unwrap();
        expect(&lch, EventType::Disconnected);
        s.disconnect().unwrap();
        expect(&ch, EventType::Disconnected);
    }
    out
}

/// Two contexts made at the same instant in one process draw unrelated PSNs (each CM agent
/// is seeded from the OS, its stream is a cipher's), and PSNs within one are not repeated.
#[test]
fn two_contexts_never_share_a_psn_sequence() {
    let a = psns("127.0.44.1:0", 4);
    let b = psns("127.0.44.2:0", 4);
    assert_ne!(a, b);
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    assert!(same <= 1, "{same} of {} PSNs equal: {a:x?} {b:x?}", a.len());
    let mut d = a.clone();
    d.sort_unstable();
    d.dedup();
    assert_eq!(d.len(), a.len(), "PSNs repeat within one context: {a:x?}");
}

/// A REQ from 127.0.45.2 whose IP CM header claims 127.0.45.3: refused with its own cause
/// (REJ 28 to where it came from, counted), and nothing at all goes to 127.0.45.3.
#[test]
fn a_req_naming_another_source_is_refused() {
    use rdma_proto::cm::{AgentConfig, CmAgent, CmPath, ReqParams};
    use rdma_soft::io::WireAddr;
    use rdma_soft::verbs::{Device, DeviceConfig};
    use rdma_wire::cm::{CmMessage, MessageRef, RejectReason};
    use rdma_wire::ip_cm::{IpCmHeaderRepr, PortSpace as Ps, ServiceId};
    use rdma_wire::mad::Mad;
    use rdmacm::cm::RejectCause;
    use std::net::{IpAddr, Ipv4Addr, UdpSocket};

    let (us, attacker, victim) = (
        Ipv4Addr::new(127, 0, 45, 1),
        Ipv4Addr::new(127, 0, 45, 2),
        Ipv4Addr::new(127, 0, 45, 3),
    );
    // The third host: its RoCEv2 port must stay silent.
    let third = UdpSocket::bind((victim, 4791)).expect("127.0.45.3:4791");
    third.set_nonblocking(true).unwrap();

    let cma = Cma::new().unwrap();
    let lch = EventChannel::with_cma(&cma).unwrap();
    let l = CmId::new(&lch, PortSpace::Tcp).unwrap();
    l.bind_addr(SocketAddr::new(IpAddr::V4(us), 0)).unwrap();
    l.listen(4).unwrap();
    let port = l.local_addr().unwrap().port();

    // The attacker: a device of its own on lo and a CM agent that writes what it likes.
    let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    let from = WireAddr::new(IpAddr::V4(attacker), 0);
    let to = WireAddr::new(IpAddr::V4(us), 0);
    dev.gsi_open(from).unwrap();
    let mut agent = CmAgent::new(AgentConfig {
        ca_guid: 0x0202_0202_0202_0202,
        seed: 1,
        ..AgentConfig::default()
    });
    let hdr = IpCmHeaderRepr {
        version: 0,
        src: IpAddr::V4(victim),
        dst: IpAddr::V4(us),
        src_port: 40000,
    };
    let mut pd = vec![0u8; IpCmHeaderRepr::LEN];
    hdr.emit(&mut pd).unwrap();
    let path = CmPath::new(attacker.to_ipv6_mapped(), us.to_ipv6_mapped(), 0);
    let mut p = ReqParams::new(ServiceId::new(Ps::Tcp, port).0, path, 0x123, 7);
    p.private_data = pd;
    agent.send_req(0, p).unwrap();
    let t = agent.poll_transmit().expect("the REQ");
    let sent = CmMessage::parse_mad(&Mad::new_cm_checked(&t.mad[..]).unwrap()).unwrap();
    let CmMessage::Req(req) = sent else {
        panic!("not a REQ: {sent:?}");
    };
    dev.gsi_send(&from, &to, &t.mad).unwrap();

    // The answer comes back to the attacker's real address: a REJ, consumer defined (28).
    let deadline = std::time::Instant::now() + T;
    let (got, msg) = loop {
        assert!(std::time::Instant::now() < deadline, "no answer to the REQ");
        match dev.gsi_recv().unwrap() {
            Some(m) => {
                let mad = Mad::new_cm_checked(&m.mad[..]).expect("a CM MAD");
                let msg = CmMessage::parse_mad(&mad).expect("a CM message");
                break (m, msg);
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    assert_eq!(got.remote.ip(), IpAddr::V4(us));
    assert_eq!(
        got.local.ip(),
        IpAddr::V4(attacker),
        "answered where it came from"
    );
    let CmMessage::Rej(rej) = msg else {
        panic!("not a REJ: {msg:?}");
    };
    assert_eq!(rej.reason, RejectReason::ConsumerDefined, "REJ 28");
    assert_eq!(
        (rej.remote_comm_id, rej.message_rejected),
        (req.local_comm_id, MessageRef::Req),
        "the REJ answers this REQ"
    );
    let counted = cma
        .reject_counts()
        .into_iter()
        .find(|(c, _)| *c == RejectCause::SourceMismatch)
        .map_or(0, |(_, n)| n);
    assert_eq!(counted, 1, "{:?}", cma.reject_counts());
    assert!(
        lch.get_event_timeout(Duration::from_millis(300))
            .unwrap()
            .is_none(),
        "no CONNECT_REQUEST for a forged source"
    );
    let mut buf = [0u8; 512];
    match third.recv_from(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the third host got something: {other:?}"),
    }
}
