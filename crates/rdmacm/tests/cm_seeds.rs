//! DESIGN.md decision rows through the CM API on loopback (no root needed), SIDR for UD
//! ids, and hostile MADs.

mod support_cm;

use std::net::SocketAddr;
use std::time::Duration;

use rdma_soft::io::{UdpConfig, UdpWire, WireAddr};
use rdma_soft::verbs::{Device, DeviceConfig, QpState};
use rdmacm::cm::{
    CmId, Cma, ConnParam, Event, EventChannel, EventType, IdState, PortSpace, RDMA_UDP_QKEY,
};
use support_cm::{expect_within, sa};

const T: Duration = Duration::from_secs(5);

fn expect(ch: &EventChannel, kind: EventType) -> Event {
    expect_within(ch, kind, T)
}

fn listen(ch: &EventChannel, ps: PortSpace, addr: &str) -> (CmId, SocketAddr) {
    let id = CmId::new(ch, ps).unwrap();
    id.bind_addr(sa(addr)).unwrap();
    id.listen(0).unwrap();
    let a = id.local_addr().unwrap();
    (id, a)
}

/// Runs `f` here when UDP 4791 is free on `ip`; otherwise (another process holds it: a tool,
/// a benchmark, another run of the suites) in a fresh network namespace this test creates,
/// where it is free. That needs root: without it the test fails rather than pass having
/// tested nothing.
fn where_free<R: Send>(test: &str, ip: std::net::IpAddr, f: impl FnOnce() -> R + Send) -> R {
    if std::net::UdpSocket::bind(SocketAddr::new(ip, 4791)).is_ok() {
        return f();
    }
    assert!(
        rdma_testhosts::is_root(),
        "{test}: UDP 4791 on {ip} is held by another process, and without root the test \
         cannot run in a namespace of its own"
    );
    println!("{test}: UDP 4791 on {ip} held by another process: testing in a new namespace");
    let t = rdma_testhosts::Topology::builder(test)
        .host("a")
        .build()
        .expect("namespace");
    t.host("a").run(f)
}

fn connect_pair(cma: &Cma, listen_addr: &str) -> (EventChannel, CmId, EventChannel, CmId, CmId) {
    let lch = EventChannel::with_cma(cma).unwrap();
    let (l, addr) = listen(&lch, PortSpace::Tcp, listen_addr);
    let ch = EventChannel::with_cma(cma).unwrap();
    let c = CmId::new(&ch, PortSpace::Tcp).unwrap();
    // From the listener's own address: a context owns UDP 4791 on the addresses it uses
    // and the tests of this file run in parallel, each with its own 127.0.0.x.
    c.resolve_addr(Some(SocketAddr::new(addr.ip(), 0)), addr, T)
        .unwrap();
    expect(&ch, EventType::AddrResolved);
    c.resolve_route(T).unwrap();
    expect(&ch, EventType::RouteResolved);
    c.create_qp_default().unwrap();
    c.connect(&ConnParam::default()).unwrap();
    let s = expect(&lch, EventType::ConnectRequest).take_id().unwrap();
    s.create_qp_default().unwrap();
    s.accept(&ConnParam::default()).unwrap();
    expect(&ch, EventType::Established);
    expect(&lch, EventType::Established);
    (lch, l, ch, c, s)
}

#[test]
fn loopback_127_0_0_1_and_ipv6_1_connect_through_the_device_on_lo() {
    let mut tested = Vec::new();
    for a in ["127.0.0.1:0", "[::1]:0"] {
        // One process per address: another process (a tool, a benchmark) may hold UDP
        // 4791 on 127.0.0.1 or ::1 of this host; then the test runs in a namespace.
        let t = where_free("cm_seeds_loopback", sa(a).ip(), || {
            let cma = Cma::new().unwrap();
            let (_lch, _l, _ch, c, s) = connect_pair(&cma, a);
            assert_eq!(c.netdev().unwrap().0, "lo");
            assert_eq!(s.netdev().unwrap().0, "lo");
            assert!(c.path().unwrap().loopback);
            assert_eq!(c.qp().unwrap().state(), QpState::Rts);
            assert_eq!(s.qp().unwrap().state(), QpState::Rts);
            c.local_addr().unwrap().ip()
        });
        tested.push(t);
    }
    // both addresses really connected (no address skipped)
    assert_eq!(tested, [sa("127.0.0.1:0").ip(), sa("[::1]:0").ip()]);
}

#[test]
fn link_local_without_scope_is_einval_and_rolls_back() {
    let cma = Cma::new().unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    id.bind_addr(sa("[::]:0")).unwrap();
    let e = id.resolve_addr(None, sa("[fe80::1]:7471"), T).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert_eq!(
        id.state(),
        IdState::AddrBound,
        "rolled back: may be retried"
    );
}

#[test]
fn wildcard_bind_binds_no_device_specific_binds_lo() {
    let cma = Cma::new().unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    let w = CmId::new(&ch, PortSpace::Tcp).unwrap();
    w.bind_addr(sa("0.0.0.0:0")).unwrap();
    assert!(w.device().is_none());
    let s = CmId::new(&ch, PortSpace::Tcp).unwrap();
    s.bind_addr(sa("127.0.0.151:0")).unwrap();
    assert_eq!(s.device().unwrap().name(), "lo");
    assert_eq!(s.port_num(), Some(1));
}

#[test]
fn udp_port_space_resolves_peer_qpn_and_qkey_with_sidr() {
    let cma = Cma::new().unwrap();
    let lch = EventChannel::with_cma(&cma).unwrap();
    let (_l, addr) = listen(&lch, PortSpace::Udp, "127.0.0.152:0");
    let ch = EventChannel::with_cma(&cma).unwrap();
    let c = CmId::new(&ch, PortSpace::Udp).unwrap();
    c.resolve_addr(Some(SocketAddr::new(addr.ip(), 0)), addr, T)
        .unwrap();
    expect(&ch, EventType::AddrResolved);
    c.resolve_route(T).unwrap();
    expect(&ch, EventType::RouteResolved);
    c.connect(&ConnParam {
        private_data: b"ud?".to_vec(),
        qp_num: Some(0x1234),
        ..Default::default()
    })
    .unwrap();
    let mut ev = expect(&lch, EventType::ConnectRequest);
    assert_eq!(&ev.private_data()[..3], b"ud?");
    let s = ev.take_id().unwrap();
    drop(ev);
    s.accept(&ConnParam {
        qp_num: Some(0x5678),
        ..Default::default()
    })
    .unwrap();
    let ev = expect(&ch, EventType::Established);
    let ud = ev.ud().unwrap();
    assert_eq!((ud.qp_num, ud.qkey, ud.peer), (0x5678, RDMA_UDP_QKEY, addr));
}

#[test]
fn hostile_mads_change_no_connection() {
    let cma = Cma::new().unwrap();
    let (lch, _l, ch, c, s) = connect_pair(&cma, "127.0.0.153:0");
    // A third party on another address fires malformed and random CM MADs at both ends.
    let wire = UdpWire::new(UdpConfig::default()).unwrap();
    let evil =
        Device::open_with_wire(DeviceConfig::for_netdev("lo").unwrap(), Box::new(wire)).unwrap();
    let me: WireAddr = "127.0.0.154".parse().unwrap();
    evil.gsi_open(me).unwrap();
    let target: WireAddr = "127.0.0.153".parse().unwrap();
    // Control probes mixed into the hostile stream: a DREQ for no connection, which the
    // target's CM answers with a DREP (as Linux's cm_issue_drep). Each DREP coming back
    // proves the hostile MADs around it reached the same agent.
    let control = |k: u32| -> [u8; 256] {
        let mut m = [0u8; 256];
        m[..4].copy_from_slice(&[1, 7, 2, 3]); // CM class v2, Send
        m[8..16].copy_from_slice(&(0xC0DE_0000_0000_0000u64 | u64::from(k)).to_be_bytes());
        m[16..18].copy_from_slice(&0x0015u16.to_be_bytes()); // DREQ
        m[24..28].copy_from_slice(&(0xC0DE_0000 | k).to_be_bytes()); // its local comm id
        m[28..32].copy_from_slice(&(0x0BAD_0000 | k).to_be_bytes()); // "our" id: unknown
        m[32..35].copy_from_slice(&[0, 0, 0x77]);
        m
    };
    let mut probes = 0u32;
    let mut answers = std::collections::BTreeSet::new();
    let collect = |evil: &Device, answers: &mut std::collections::BTreeSet<u32>| {
        while let Some(m) = evil.gsi_recv().unwrap() {
            let m = m.mad;
            // a DREP (0x0016) with a control DREQ's TID and its ids swapped
            let k = u32::from_be_bytes(m[28..32].try_into().unwrap()) & 0xFFFF;
            if m[16..18] == [0, 0x16]
                && m[8..16] == (0xC0DE_0000_0000_0000u64 | u64::from(k)).to_be_bytes()
                && m[24..28] == (0x0BAD_0000 | k).to_be_bytes()
                && m[28..32] == (0xC0DE_0000 | k).to_be_bytes()
            {
                answers.insert(k);
            }
        }
    };
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..3000u32 {
        let mut mad = [0u8; 256];
        for b in mad.iter_mut() {
            *b = rnd() as u8;
        }
        if i % 3 != 0 {
            // A well-formed CM header with a random CM attribute.
            mad[..4].copy_from_slice(&[1, 7, 2, 3]);
            mad[16] = 0;
            mad[17] = 0x10 + (rnd() % 9) as u8;
        }
        if i % 100 == 0 {
            // drive the target first, so that the control probe heads the next batch (the
            // GSI queue keeps the first MADs of a peer and drops the rest under overload)
            cma.progress();
            collect(&evil, &mut answers);
            evil.gsi_send(&me, &target, &control(probes)).unwrap();
            probes += 1;
        }
        evil.gsi_send(&me, &target, &mad).unwrap();
    }
    // every control DREQ answered (the network is loopback, the GSI queue bounded per peer:
    // the CM may drop hostile MADs under overload, but never its answers to these)
    let deadline = std::time::Instant::now() + T;
    while answers.len() < probes as usize && std::time::Instant::now() < deadline {
        cma.progress();
        evil.gsi_wait(Some(Duration::from_millis(20))).unwrap();
        collect(&evil, &mut answers);
    }
    assert_eq!(
        answers,
        (0..probes).collect(),
        "the target's CM answered every control DREQ: the hostile MADs reached it"
    );
    // No event for anyone, both QPs still in RTS, both ids still connected.
    assert!(ch
        .get_event_timeout(Duration::from_millis(200))
        .unwrap()
        .is_none());
    assert!(lch
        .get_event_timeout(Duration::from_millis(10))
        .unwrap()
        .is_none());
    assert_eq!(c.qp().unwrap().state(), QpState::Rts);
    assert_eq!(s.qp().unwrap().state(), QpState::Rts);
    assert_eq!((c.state(), s.state()), (IdState::Connect, IdState::Connect));
    // And the connection still disconnects cleanly.
    c.disconnect().unwrap();
    expect(&lch, EventType::Disconnected);
}

/// A user-managed QP (`ConnParam::qp_num`, no QP created through the id): the REP gives
/// CONNECT_RESPONSE instead of ESTABLISHED, `init_qp_attr` gives the RTR/RTS attributes from
/// the exchange, and `establish` sends the RTU, after which the passive side is ESTABLISHED.
#[test]
fn user_qp_gets_connect_response_then_establish() {
    let cma = Cma::new().unwrap();
    let lch = EventChannel::with_cma(&cma).unwrap();
    let (_l, addr) = listen(&lch, PortSpace::Tcp, "127.0.0.196:0");
    let ch = EventChannel::with_cma(&cma).unwrap();
    let c = CmId::new(&ch, PortSpace::Tcp).unwrap();
    c.resolve_addr(Some(SocketAddr::new(addr.ip(), 0)), addr, T)
        .unwrap();
    expect(&ch, EventType::AddrResolved);
    c.resolve_route(T).unwrap();
    expect(&ch, EventType::RouteResolved);
    c.connect(&ConnParam {
        qp_num: Some(0x1234),
        ..Default::default()
    })
    .unwrap();
    let s = expect(&lch, EventType::ConnectRequest).take_id().unwrap();
    s.create_qp_default().unwrap();
    s.accept(&ConnParam::default()).unwrap();
    expect(&ch, EventType::ConnectResponse);
    let (rtr, _) = c.init_qp_attr(QpState::Rtr).unwrap();
    assert_eq!(rtr.dest_qp_num, s.qp().unwrap().qpn());
    c.establish().unwrap();
    expect(&lch, EventType::Established);
}
