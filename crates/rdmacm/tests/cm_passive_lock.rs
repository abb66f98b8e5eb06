//! The passive side looks a request's path up (netlink) without holding the context's
//! lock: while the CM engine is between a REQ's arrival and its path, calls into the
//! context go through, and the request's CONNECT_REQUEST comes after its path.
//!
//! Its own test binary: the hold stops the process's progress engine thread, which every
//! context of the process shares. Addresses: 127.0.130.0/24.

mod support_cm;

use std::net::SocketAddr;
use std::time::Duration;

use rdmacm::cm::{CmId, Cma, ConnParam, Event, EventChannel, EventType, PortSpace};
use rdmacm::Error;
use support_cm::{expect_within, sa};

const T: Duration = Duration::from_secs(5);
/// Hang guard: the engine reaching the hold.
const GUARD: Duration = Duration::from_secs(120);

/// One hold at a time: a hold stops the engine thread for every test of the binary.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn expect(ch: &EventChannel, kind: EventType) -> Event {
    expect_within(ch, kind, T)
}

#[test]
fn context_answers_while_a_request_path_is_looked_up() {
    let _serial = serial();
    let server = Cma::new().unwrap();
    let client = Cma::new().unwrap();
    let lch = EventChannel::with_cma(&server).unwrap();
    let l = CmId::new(&lch, PortSpace::Tcp).unwrap();
    l.bind_addr(sa("127.0.130.1:0")).unwrap();
    l.listen(4).unwrap();
    let addr = l.local_addr().unwrap();

    let hold = server.hold_passive_lookups();
    let cch = EventChannel::with_cma(&client).unwrap();
    let c = CmId::new(&cch, PortSpace::Tcp).unwrap();
    c.resolve_addr(Some(sa("127.0.130.2:0")), addr, T).unwrap();
    expect(&cch, EventType::AddrResolved);
    c.resolve_route(T).unwrap();
    expect(&cch, EventType::RouteResolved);
    c.create_qp_default().unwrap();
    c.connect(&ConnParam::default()).unwrap();

    assert!(
        hold.wait_entered(GUARD),
        "the server never started the request's path lookup"
    );
    // The engine holds the REQ and is about to ask netlink: the context is not locked.
    let och = EventChannel::with_cma(&server).unwrap();
    let other = CmId::new(&och, PortSpace::Tcp).unwrap();
    other.bind_addr(sa("127.0.130.1:0")).unwrap();
    assert!(other.local_addr().unwrap().port() != 0);
    assert!(server.devices().iter().any(|(n, _)| n == "lo"));
    // Another run leaves the held request to the run that has it, and no CONNECT_REQUEST
    // exists before its path.
    assert_eq!(server.progress(), 0);
    assert!(matches!(lch.try_get_event(), Err(Error::WouldBlock)));
    assert!(
        hold.release(),
        "a call into the context waited for the held lookup"
    );

    let mut ev = expect(&lch, EventType::ConnectRequest);
    let s = ev.take_id().unwrap();
    drop(ev);
    assert_eq!(s.peer_addr(), c.local_addr());
    s.create_qp_default().unwrap();
    s.accept(&ConnParam::default()).unwrap();
    expect(&cch, EventType::Established);
    expect(&lch, EventType::Established);
}

#[test]
fn listener_destroyed_during_the_lookup_refuses_the_request() {
    let _serial = serial();
    let server = Cma::new().unwrap();
    let client = Cma::new().unwrap();
    let lch = EventChannel::with_cma(&server).unwrap();
    let l = CmId::new(&lch, PortSpace::Tcp).unwrap();
    l.bind_addr(sa("127.0.130.11:0")).unwrap();
    l.listen(4).unwrap();
    let addr = l.local_addr().unwrap();
    // A second listener on the same device keeps the service id registered in the agent,
    // so the REQ is matched, held, and then finds its listener gone.
    let keep = CmId::new(&lch, PortSpace::Tcp).unwrap();
    keep.bind_addr(SocketAddr::new(sa("127.0.130.12:0").ip(), addr.port()))
        .unwrap();
    keep.listen(4).unwrap();

    let hold = server.hold_passive_lookups();
    let cch = EventChannel::with_cma(&client).unwrap();
    let c = CmId::new(&cch, PortSpace::Tcp).unwrap();
    c.resolve_addr(Some(sa("127.0.130.13:0")), addr, T).unwrap();
    expect(&cch, EventType::AddrResolved);
    c.resolve_route(T).unwrap();
    expect(&cch, EventType::RouteResolved);
    c.create_qp_default().unwrap();
    c.connect(&ConnParam::default()).unwrap();
    assert!(hold.wait_entered(GUARD), "the REQ was never held");
    drop(l);
    assert!(
        hold.release(),
        "destroying the listener waited for the lookup"
    );

    // Re-checked after the lookup: the listener is gone, REJ 28 as when it was never there.
    let ev = expect(&cch, EventType::Rejected);
    assert_eq!(ev.status(), 28);
    drop(ev);
    assert_eq!(
        server.reject_counts(),
        vec![(rdmacm::cm::RejectCause::NoListenerForAddress, 1)]
    );
}
