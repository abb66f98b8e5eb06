//! Connection manager over loopback (no root needed): connect / accept / reject with
//! private data / disconnect both ways, no listener, errors, event names.

mod support_cm;

use std::net::SocketAddr;
use std::time::Duration;

use rdmacm::cm::{
    CmId, Cma, CmaConfig, ConnParam, Event, EventChannel, EventType, IdState, PortSpace,
};
use support_cm::{expect_within, sa};

const T: Duration = Duration::from_secs(5);

fn expect(ch: &EventChannel, kind: EventType) -> Event {
    expect_within(ch, kind, T)
}

/// A listener on `addr` (port 0: ephemeral) and its channel.
fn listener(cma: &Cma, addr: &str) -> (EventChannel, CmId, SocketAddr) {
    listener_in(cma, addr, PortSpace::Tcp)
}

fn listener_in(cma: &Cma, addr: &str, ps: PortSpace) -> (EventChannel, CmId, SocketAddr) {
    let ch = EventChannel::with_cma(cma).unwrap();
    let id = CmId::new(&ch, ps).unwrap();
    id.bind_addr(sa(addr)).unwrap();
    id.listen(16).unwrap();
    let a = id.local_addr().unwrap();
    (ch, id, a)
}

/// A client with a QP, resolved to `dst` from `dst`'s address (each test uses its own
/// 127.0.0.x: a context owns UDP 4791 on the addresses it uses, and tests run in parallel).
fn client_to(cma: &Cma, dst: SocketAddr) -> (EventChannel, CmId) {
    client_in(cma, dst, PortSpace::Tcp)
}

fn client_in(cma: &Cma, dst: SocketAddr, ps: PortSpace) -> (EventChannel, CmId) {
    let ch = EventChannel::with_cma(cma).unwrap();
    let id = CmId::new(&ch, ps).unwrap();
    id.resolve_addr(Some(SocketAddr::new(dst.ip(), 0)), dst, T)
        .unwrap();
    expect(&ch, EventType::AddrResolved);
    assert_eq!(id.state(), IdState::AddrResolved);
    id.resolve_route(T).unwrap();
    expect(&ch, EventType::RouteResolved);
    id.create_qp_default().unwrap();
    (ch, id)
}

fn pd(s: &[u8], n: usize) -> Vec<u8> {
    let mut v = s.to_vec();
    v.resize(n, 0);
    v
}

#[test]
fn connect_accept_private_data_disconnect_from_client() {
    let cma = Cma::new().unwrap();
    let (lch, _l, addr) = listener(&cma, "127.0.0.101:0");
    let (cch, c) = client_to(&cma, addr);
    c.connect(&ConnParam {
        private_data: b"hello".to_vec(),
        ..Default::default()
    })
    .unwrap();
    let mut ev = expect(&lch, EventType::ConnectRequest);
    assert_eq!(&ev.private_data()[..5], b"hello");
    assert_eq!(ev.private_data().len(), 56);
    let s = ev.take_id().unwrap();
    drop(ev);
    assert_eq!(s.peer_addr(), c.local_addr());
    assert_eq!(s.local_addr(), Some(addr));
    assert_eq!(s.netdev().unwrap().0, "lo");
    s.create_qp_default().unwrap();
    s.accept(&ConnParam {
        private_data: b"welcome".to_vec(),
        ..Default::default()
    })
    .unwrap();
    let ev = expect(&cch, EventType::Established);
    assert_eq!(&ev.private_data()[..7], b"welcome");
    drop(ev);
    expect(&lch, EventType::Established);
    // The QPs are connected: their PSNs follow the convention.
    let (qc, qs) = (
        c.qp().unwrap().query().unwrap(),
        s.qp().unwrap().query().unwrap(),
    );
    assert_eq!(qc.sq_psn, qs.rq_psn);
    assert_eq!(qs.sq_psn, qc.rq_psn);
    assert_eq!(qc.dest_qp_num, s.qp().unwrap().qpn());
    c.disconnect().unwrap();
    expect(&lch, EventType::Disconnected);
    s.disconnect().unwrap();
    expect(&cch, EventType::Disconnected);
}

#[test]
fn disconnect_from_server() {
    let cma = Cma::new().unwrap();
    let (lch, _l, addr) = listener(&cma, "127.0.0.102:0");
    let (cch, c) = client_to(&cma, addr);
    c.connect(&ConnParam::default()).unwrap();
    let s = expect(&lch, EventType::ConnectRequest).take_id().unwrap();
    s.create_qp_default().unwrap();
    s.accept(&ConnParam::default()).unwrap();
    expect(&cch, EventType::Established);
    expect(&lch, EventType::Established);
    s.disconnect().unwrap();
    expect(&cch, EventType::Disconnected);
    c.disconnect().unwrap();
    expect(&lch, EventType::Disconnected);
}

#[test]
fn reject_with_private_data() {
    let cma = Cma::new().unwrap();
    let (lch, _l, addr) = listener(&cma, "127.0.0.103:0");
    let (cch, c) = client_to(&cma, addr);
    c.connect(&ConnParam::default()).unwrap();
    let s = expect(&lch, EventType::ConnectRequest).take_id().unwrap();
    s.reject(b"go away").unwrap();
    let ev = expect(&cch, EventType::Rejected);
    assert_eq!(ev.status(), 28);
    assert_eq!(&ev.private_data()[..7], b"go away");
    assert_eq!(ev.private_data().len(), 148);
}

#[test]
fn no_listener_is_rej_8() {
    let cma = Cma::new().unwrap();
    // Something listens on the device (opens the address), but not on this port.
    let (_lch, _l, addr) = listener(&cma, "127.0.0.104:0");
    let other = SocketAddr::new(addr.ip(), addr.port().wrapping_add(1).max(1));
    let (cch, c) = client_to(&cma, other);
    c.connect(&ConnParam::default()).unwrap();
    let ev = expect(&cch, EventType::Rejected);
    assert_eq!(ev.status(), 8);
}

/// perftest -R's race in port space `ps` on `ip`: the client connects before the server
/// listens, its request is refused and resent (the grace is long here so that a loaded
/// machine cannot spend it) until the listener comes and accepts; `check` is given the
/// server's id and the client's ESTABLISHED (before the ids go: destroying an id waits
/// for its events to be released).
fn a_late_listener_accepts_the_refused_request(
    ps: PortSpace,
    ip: &str,
    check: impl FnOnce(&CmId, &Event),
) {
    let cfg = CmaConfig::builder()
        .no_listener_retry(Duration::from_secs(20))
        .build();
    let cma = Cma::with_config(cfg).unwrap();
    let (_lch, _l, addr) = listener_in(&cma, &format!("{ip}:0"), ps);
    let later = SocketAddr::new(addr.ip(), addr.port().wrapping_add(1).max(1));
    let (cch, c) = client_in(&cma, later, ps);
    c.connect(&ConnParam {
        private_data: b"early".to_vec(),
        ..Default::default()
    })
    .unwrap();
    // refused at least once before the listener comes
    let end = std::time::Instant::now() + T;
    while cma.statistics().refused_resends == 0 {
        assert!(
            std::time::Instant::now() < end,
            "no request was refused and resent"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        matches!(cch.try_get_event(), Err(rdmacm::Error::WouldBlock)),
        "no REJECTED or UNREACHABLE while resending"
    );
    let (lch, _l2, _) = listener_in(&cma, &later.to_string(), ps);
    let mut ev = expect(&lch, EventType::ConnectRequest);
    assert_eq!(&ev.private_data()[..5], b"early");
    let s = ev.take_id().unwrap();
    drop(ev);
    s.create_qp_default().unwrap();
    s.accept(&ConnParam::default()).unwrap();
    check(&s, &expect(&cch, EventType::Established));
}

#[test]
fn a_listener_on_its_way_gets_the_refused_req() {
    a_late_listener_accepts_the_refused_request(PortSpace::Tcp, "127.0.0.110", |s, ev| {
        assert_eq!(ev.status(), 0);
        assert!(s.qp().is_some());
    });
}

#[test]
fn a_listener_on_its_way_gets_the_refused_sidr_req() {
    // The same race in the UDP port space (perftest -R -c UD): the SIDR_REQ answered
    // "service id not supported" is resent too.
    a_late_listener_accepts_the_refused_request(PortSpace::Udp, "127.0.0.112", |s, ev| {
        let ud = ev.ud().expect("the server's QP number and Q_Key");
        assert_eq!(ud.qp_num, s.qp().unwrap().qpn());
    });
}

#[test]
fn no_listener_retry_off_refuses_at_once() {
    let cfg = CmaConfig::builder()
        .no_listener_retry(Duration::ZERO)
        .build();
    let cma = Cma::with_config(cfg).unwrap();
    let (_lch, _l, addr) = listener(&cma, "127.0.0.111:0");
    let other = SocketAddr::new(addr.ip(), addr.port().wrapping_add(1).max(1));
    let (cch, c) = client_to(&cma, other);
    c.connect(&ConnParam::default()).unwrap();
    let ev = expect(&cch, EventType::Rejected);
    assert_eq!(ev.status(), 8);
    assert_eq!(cma.statistics().refused_resends, 0);
}

#[test]
fn private_data_limits_are_einval() {
    let cma = Cma::new().unwrap();
    let (lch, _l, addr) = listener(&cma, "127.0.0.105:0");
    let (_cch, c) = client_to(&cma, addr);
    let e = c
        .connect(&ConnParam {
            private_data: vec![1; 57],
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert_eq!(c.state(), IdState::RouteResolved);
    c.connect(&ConnParam {
        private_data: vec![1; 56],
        ..Default::default()
    })
    .unwrap();
    let s = expect(&lch, EventType::ConnectRequest).take_id().unwrap();
    assert_eq!(s.reject(&[0; 149]).unwrap_err().errno(), libc::EINVAL);
    s.create_qp_default().unwrap();
    let e = s
        .accept(&ConnParam {
            private_data: vec![0; 197],
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    s.accept(&ConnParam {
        private_data: pd(b"x", 196),
        ..Default::default()
    })
    .unwrap();
}

#[test]
fn calls_out_of_order_are_einval() {
    let cma = Cma::new().unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    assert_eq!(id.resolve_route(T).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(
        id.connect(&ConnParam::default()).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(
        id.accept(&ConnParam::default()).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(id.disconnect().unwrap_err().errno(), libc::EINVAL);
    id.bind_addr(sa("127.0.0.120:0")).unwrap();
    assert_eq!(
        id.bind_addr(sa("127.0.0.120:0")).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(id.state(), IdState::AddrBound);
    assert_eq!(id.netdev().unwrap().0, "lo");
    assert_eq!(
        id.resolve_route(Duration::ZERO).unwrap_err().errno(),
        libc::EINVAL
    );
}

#[test]
fn bind_conflicts() {
    let cma = Cma::new().unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    let a = CmId::new(&ch, PortSpace::Tcp).unwrap();
    a.bind_addr(sa("127.0.0.121:0")).unwrap();
    let port = a.local_addr().unwrap().port();
    let b = CmId::new(&ch, PortSpace::Tcp).unwrap();
    let e = b
        .bind_addr(SocketAddr::new(sa("127.0.0.121:0").ip(), port))
        .unwrap_err();
    assert_eq!(e.errno(), libc::EADDRINUSE);
    // Another port space has its own table.
    let u = CmId::new(&ch, PortSpace::Udp).unwrap();
    u.bind_addr(SocketAddr::new(sa("127.0.0.121:0").ip(), port))
        .unwrap();
    let w = CmId::new(&ch, PortSpace::Tcp).unwrap();
    assert_eq!(
        w.bind_addr(sa("192.0.2.77:0")).unwrap_err().errno(),
        libc::EADDRNOTAVAIL
    );
}

#[test]
fn event_names_are_rdma_event_str() {
    assert_eq!(
        EventType::ConnectRequest.to_string(),
        "RDMA_CM_EVENT_CONNECT_REQUEST"
    );
    assert_eq!(
        EventType::DeviceRemoval.to_string(),
        "RDMA_CM_EVENT_DEVICE_REMOVAL"
    );
    assert_eq!(
        EventType::AddrChange.to_string(),
        "RDMA_CM_EVENT_ADDR_CHANGE"
    );
}

#[test]
fn nobody_at_the_address_gives_unreachable_after_the_cm_timeouts() {
    let cma = Cma::new().unwrap();
    cma.set_cm_timeouts(14, 1).unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    // 127.0.0.107 is local (lo's /8) but no process has UDP 4791 open there.
    let dst = sa("127.0.0.107:7471");
    id.resolve_addr(Some(sa("127.0.0.108:0")), dst, T).unwrap();
    expect(&ch, EventType::AddrResolved);
    id.resolve_route(T).unwrap();
    expect(&ch, EventType::RouteResolved);
    id.create_qp_default().unwrap();
    id.connect(&ConnParam::default()).unwrap();
    let ev = expect(&ch, EventType::Unreachable);
    assert_eq!(ev.status(), -libc::ETIMEDOUT);
    assert_eq!(
        cma.set_cm_timeouts(32, 1).unwrap_err().errno(),
        libc::EINVAL
    );
}

#[test]
fn channel_fd_alone_gets_events() {
    let cma = Cma::new().unwrap();
    let (lch, _l, addr) = listener(&cma, "127.0.0.109:0");
    let (cch, c) = client_to(&cma, addr);
    c.connect(&ConnParam::default()).unwrap();
    // Wait on the listener channel's fd only: the progress engine delivers the request.
    let mut p = libc::pollfd {
        fd: lch.fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let n = unsafe { libc::poll(&mut p, 1, 5000) };
    assert_eq!(n, 1);
    let s = lch.try_get_event().unwrap().take_id().unwrap();
    s.create_qp_default().unwrap();
    s.accept(&ConnParam::default()).unwrap();
    expect(&cch, EventType::Established);
}

#[test]
fn listen_on_an_address_held_by_another_process_fails_naming_it() {
    // Another process (here: a plain socket) owns UDP 4791 on 127.0.0.199.
    let _holder = std::net::UdpSocket::bind("127.0.0.199:4791").unwrap();
    let cma = Cma::new().unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    id.bind_addr(sa("127.0.0.199:0")).unwrap();
    let err = id.listen(4).unwrap_err();
    assert_eq!(err.errno(), libc::EADDRINUSE, "{err}");
    assert!(err.to_string().contains("127.0.0.199"), "{err}");
    assert_eq!(id.state(), IdState::AddrBound);
}
