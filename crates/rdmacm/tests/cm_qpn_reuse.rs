//! A new context reusing a QPN that the server holds in timewait. Alone in its test
//! binary: the QPN's top byte is the wire's host-wide slot, and the second context gets the
//! first one's slot back only if no other thread of the process took a slot in between (the
//! tests of one binary run in parallel; cargo runs the binaries one after another).

mod support_cm;

use std::time::Duration;

use rdmacm::cm::{CmId, Cma, ConnParam, Event, EventChannel, EventType, PortSpace};
use support_cm::{expect_within, sa};

const T: Duration = Duration::from_secs(5);

fn expect(ch: &EventChannel, kind: EventType) -> Event {
    expect_within(ch, kind, T)
}

/// `cmtime -c 1000` twice in a row against one server: the second client process's soft
/// device hands out the same QPNs as the first's, while the server still holds the first
/// run's connections in timewait. Each context is a CA of its own (its own CA GUID), so the
/// new REQ is a new connection, not a stale one (it was REJ 10).
#[test]
fn next_context_reusing_a_qpn_in_the_servers_timewait_connects() {
    let server = Cma::new().unwrap();
    let lch = EventChannel::with_cma(&server).unwrap();
    let l = CmId::new(&lch, PortSpace::Tcp).unwrap();
    l.bind_addr(sa("127.0.0.113:0")).unwrap();
    l.listen(16).unwrap();
    let addr = l.local_addr().unwrap();
    let src = "127.0.0.114:0";
    let mut qpns = Vec::new();
    for _ in 0..2 {
        let cma = Cma::new().unwrap();
        let ch = EventChannel::with_cma(&cma).unwrap();
        let c = CmId::new(&ch, PortSpace::Tcp).unwrap();
        c.resolve_addr(Some(sa(src)), addr, T).unwrap();
        expect(&ch, EventType::AddrResolved);
        c.resolve_route(T).unwrap();
        expect(&ch, EventType::RouteResolved);
        c.create_qp_default().unwrap();
        qpns.push(c.qp().unwrap().qpn());
        c.connect(&ConnParam::default()).unwrap();
        let s = expect(&lch, EventType::ConnectRequest).take_id().unwrap();
        s.create_qp_default().unwrap();
        s.accept(&ConnParam::default()).unwrap();
        expect(&ch, EventType::Established);
        expect(&lch, EventType::Established);
        c.disconnect().unwrap();
        expect(&lch, EventType::Disconnected);
        // The server's side stays in timewait (512 ms) after this, destroyed or not.
        s.disconnect().unwrap();
        expect(&ch, EventType::Disconnected);
        drop(s);
        drop(c);
        drop(ch);
        drop(cma);
    }
    assert_eq!(qpns[0], qpns[1], "the second context reused the QPN");
}
