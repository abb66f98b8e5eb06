//! The CM's counters: per context ([`Cma::statistics`], the inspection view's `"cm"`) and
//! per id (the `"counters"` of each `"cm_ids"` entry, what `rdma-soft resource show cm_id`
//! prints), read back from this process's inspection snapshot.
//!
//! Addresses: 127.0.131.0/24.

mod support_cm;

use std::net::SocketAddr;
use std::time::Duration;

use rdmacm::cm::{CmId, Cma, ConnParam, Event, EventChannel, EventType, PortSpace, RejectCause};
use serde_json::Value;
use support_cm::{expect_within, sa};

const T: Duration = Duration::from_secs(5);

fn expect(ch: &EventChannel, kind: EventType) -> Event {
    expect_within(ch, kind, T)
}

fn listener(ch: &EventChannel, addr: &str) -> (CmId, SocketAddr) {
    let id = CmId::new(ch, PortSpace::Tcp).unwrap();
    id.bind_addr(sa(addr)).unwrap();
    id.listen(8).unwrap();
    let a = id.local_addr().unwrap();
    (id, a)
}

/// A client id on `cma` from `src`, resolved to `dst` with a QP, and its channel.
fn client(cma: &Cma, src: &str, dst: SocketAddr) -> (EventChannel, CmId) {
    let ch = EventChannel::with_cma(cma).unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    id.resolve_addr(Some(sa(src)), dst, T).unwrap();
    expect(&ch, EventType::AddrResolved);
    id.resolve_route(T).unwrap();
    expect(&ch, EventType::RouteResolved);
    id.create_qp_default().unwrap();
    (ch, id)
}

/// The counters of the id with local address `local` and peer `peer` in this process's
/// inspection snapshot (the provider's JSON).
fn id_counters(local: SocketAddr, peer: SocketAddr) -> Value {
    let snap = rdma_soft::inspect::snapshot();
    let ids = snap["cm_ids"].as_array().cloned().unwrap_or_default();
    let found = ids.iter().find(|i| {
        i["src-addr"].as_str() == Some(&local.to_string())
            && i["dst-addr"].as_str() == Some(&peer.to_string())
    });
    found
        .unwrap_or_else(|| panic!("no cm_id {local} -> {peer} in {ids:?}"))
        .get("counters")
        .cloned()
        .unwrap_or_else(|| panic!("cm_id {local} -> {peer} without counters"))
}

/// The `"cm"` entry of the context that listens on `addr`.
fn context_counters(addr: SocketAddr) -> Value {
    let snap = rdma_soft::inspect::snapshot();
    let cms = snap["cm"].as_array().cloned().unwrap_or_default();
    let found = cms.iter().find(|c| {
        c["listeners"]
            .as_array()
            .is_some_and(|l| l.iter().any(|a| a.as_str() == Some(&addr.to_string())))
    });
    found
        .unwrap_or_else(|| panic!("no cm context listening on {addr} in {cms:?}"))
        .get("counters")
        .cloned()
        .unwrap()
}

#[test]
fn refused_connect_is_counted_on_the_server_with_its_cause() {
    let server = Cma::new().unwrap();
    let sch = EventChannel::with_cma(&server).unwrap();
    let (_l, addr) = listener(&sch, "127.0.131.1:0");
    // Another listener opens 127.0.131.3 on the server, on another port: a request for
    // 127.0.131.3 on the first listener's port reaches the server but no listener takes it.
    let (_other, other) = listener(&sch, "127.0.131.3:0");
    assert_ne!(other.port(), addr.port());
    let client_cma = Cma::new().unwrap();
    let dst = SocketAddr::new(other.ip(), addr.port());
    let (cch, c) = client(&client_cma, "127.0.131.2:0", dst);
    c.connect(&ConnParam::default()).unwrap();
    let ev = expect(&cch, EventType::Rejected);
    assert_eq!(ev.status(), 28);
    drop(ev);

    let st = server.statistics();
    assert_eq!(st.requests_accepted, 0);
    assert_eq!(st.refused, vec![(RejectCause::NoListenerForAddress, 1)]);
    assert_eq!(st.requests_refused(), 1);
    let cm = context_counters(addr);
    assert_eq!(cm["refused-no_listener_for_address"], 1, "{cm}");
    assert_eq!(cm["requests-refused"], 1, "{cm}");
    assert_eq!(cm["requests-accepted"], 0, "{cm}");

    let cc = id_counters(c.local_addr().unwrap(), dst);
    assert_eq!(cc["reqs-sent"], 1, "{cc}");
    assert_eq!(cc["rejs-received"], 1, "{cc}");
    assert_eq!(cc["rej-reason"], 28, "{cc}");
    // ADDR_RESOLVED, ROUTE_RESOLVED, REJECTED; all dropped.
    assert_eq!(cc["events"], 3, "{cc}");
    assert_eq!(cc["unacked"], 0, "{cc}");
    assert_eq!(client_cma.statistics().requests_refused(), 0);
}

#[test]
fn accepted_rejected_and_disconnected_ids_show_their_counters() {
    let server = Cma::new().unwrap();
    let sch = EventChannel::with_cma(&server).unwrap();
    let (l, addr) = listener(&sch, "127.0.131.11:0");
    let client_cma = Cma::new().unwrap();

    // One accepted, then disconnected by the client.
    let (c1ch, c1) = client(&client_cma, "127.0.131.12:0", addr);
    c1.connect(&ConnParam::default()).unwrap();
    let mut ev = expect(&sch, EventType::ConnectRequest);
    let s1 = ev.take_id().unwrap();
    drop(ev);
    s1.create_qp_default().unwrap();
    s1.accept(&ConnParam::default()).unwrap();
    expect(&c1ch, EventType::Established);
    let est = expect(&sch, EventType::Established);
    let c1_local = c1.local_addr().unwrap();
    let sc = id_counters(addr, c1_local);
    assert_eq!(sc["reps-sent"], 1, "{sc}");
    // CONNECT_REQUEST and ESTABLISHED; the second still held.
    assert_eq!(sc["events"], 2, "{sc}");
    assert_eq!(sc["unacked"], 1, "{sc}");
    drop(est);
    c1.disconnect().unwrap();
    expect(&sch, EventType::Disconnected);
    // The server's disconnect answers with the DREP.
    s1.disconnect().unwrap();
    expect(&c1ch, EventType::Disconnected);
    let cc = id_counters(c1_local, addr);
    assert_eq!(cc["dreqs-sent"], 1, "{cc}");
    assert_eq!(cc["dreps-received"], 1, "{cc}");
    let sc = id_counters(addr, c1_local);
    assert_eq!(sc["dreqs-received"], 1, "{sc}");
    assert_eq!(sc["dreqs-sent"], 0, "{sc}");

    // One rejected by the application: a REJ sent by the server's id, not a refusal.
    let (c2ch, c2) = client(&client_cma, "127.0.131.13:0", addr);
    c2.connect(&ConnParam::default()).unwrap();
    let mut ev = expect(&sch, EventType::ConnectRequest);
    let s2 = ev.take_id().unwrap();
    drop(ev);
    s2.reject(b"no").unwrap();
    let ev = expect(&c2ch, EventType::Rejected);
    assert_eq!(ev.status(), 28);
    drop(ev);
    let c2_local = c2.local_addr().unwrap();
    assert_eq!(id_counters(addr, c2_local)["rejs-sent"], 1);
    let cc = id_counters(c2_local, addr);
    assert_eq!(cc["rejs-received"], 1, "{cc}");
    assert_eq!(cc["rej-reason"], 28, "{cc}");

    // The listener took both; the context refused none.
    let snap = rdma_soft::inspect::snapshot();
    let lid = snap["cm_ids"]
        .as_array()
        .and_then(|ids| {
            let mine = |i: &&Value| {
                i["cm-idn"] == l.num() && i["src-addr"].as_str() == Some(&addr.to_string())
            };
            ids.iter().find(mine).cloned()
        })
        .expect("the listener in cm_ids");
    assert_eq!(lid["state"], "LISTEN");
    assert_eq!(lid["counters"]["requests"], 2, "{lid}");
    assert_eq!(lid["counters"]["refused"], 0, "{lid}");
    let st = server.statistics();
    assert_eq!(st.requests_accepted, 2);
    assert!(st.refused.is_empty(), "{:?}", st.refused);
}

#[test]
fn unanswered_req_retransmissions_are_counted_on_its_id() {
    let server = Cma::new().unwrap();
    let sch = EventChannel::with_cma(&server).unwrap();
    let (_l, addr) = listener(&sch, "127.0.131.21:0");
    // The server's CM leaves the REQs queued: nobody answers.
    let pause = server.pause_progress();
    let client_cma = Cma::new().unwrap();
    client_cma.set_cm_timeouts(12, 3).unwrap();
    let (cch, c) = client(&client_cma, "127.0.131.22:0", addr);
    c.connect(&ConnParam::default()).unwrap();
    // UNREACHABLE after the retries (the wait is a hang guard).
    let ev = cch
        .get_event_timeout(Duration::from_secs(120))
        .unwrap()
        .expect("no UNREACHABLE");
    assert_eq!(ev.kind(), EventType::Unreachable);
    assert_eq!(ev.status(), -libc::ETIMEDOUT);
    drop(ev);
    let cc = id_counters(c.local_addr().unwrap(), addr);
    assert_eq!(cc["reqs-sent"], 1, "{cc}");
    // the 3 retries, and the 3 early resends inside the first wait (AgentConfig::
    // early_resends)
    assert_eq!(cc["retransmits"], 3 + 3, "{cc}");
    let st = client_cma.statistics();
    assert_eq!((st.retransmits, st.early_retransmits), (3 + 3, 3));
    drop(pause);
}
