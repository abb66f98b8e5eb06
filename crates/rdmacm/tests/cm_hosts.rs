//! The connection manager between network-namespace hosts (root; SKIPPED otherwise):
//! connect / accept / reject / disconnect both ways over veth, many connections, the
//! listener's address rule, a peer that vanishes.

mod support_cm;
mod support_hosts;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rdma_testhosts::{require_root, topologies, Host};
use rdmacm::cm::{CmId, Cma, ConnParam, Event, EventChannel, EventType, PortSpace};
use support_cm::{expect_within, sa};
use support_hosts::*;

const T: Duration = Duration::from_secs(10);

fn conns(default: usize) -> usize {
    std::env::var("RDMA_CM_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn expect(ch: &EventChannel, kind: EventType) -> Event {
    expect_within(ch, kind, T)
}

fn wait_up(h: &Host, dev: &str) {
    let dev = dev.to_string();
    with_resolver(h, move |r| wait_running(r, &dev));
}

/// A server in host `h`: listens on `addr`; requests whose private data starts with
/// "reject" are rejected with "no", others accepted with "welcome"; a request saying
/// "server-disconnects" is disconnected by the server once established; DISCONNECTED is
/// answered. Stops after `n` requests are finished (rejected or disconnected).
fn server(h: &Host, addr: &str, n: usize, ready: mpsc::Sender<()>) {
    let addr = sa(addr);
    h.run(move || {
        let cma = Cma::new().unwrap();
        let ch = EventChannel::with_cma(&cma).unwrap();
        let l = CmId::new(&ch, PortSpace::Tcp).unwrap();
        l.bind_addr(addr).unwrap();
        l.listen(0).unwrap();
        ready.send(()).unwrap();
        let mut live = std::collections::HashMap::new();
        let mut server_disc = std::collections::HashSet::new();
        let mut done = 0;
        while done < n {
            let mut ev = ch
                .get_event_timeout(Duration::from_secs(30))
                .unwrap()
                .expect("server event");
            match ev.kind() {
                EventType::ConnectRequest => {
                    let id = ev.take_id().unwrap();
                    let pd = ev.private_data().to_vec();
                    drop(ev);
                    if pd.starts_with(b"reject") {
                        id.reject(b"no").unwrap();
                        done += 1;
                        continue;
                    }
                    if pd.starts_with(b"server-disconnects") {
                        server_disc.insert(id.num());
                    }
                    id.create_qp_default().unwrap();
                    id.accept(&ConnParam {
                        private_data: b"welcome".to_vec(),
                        ..Default::default()
                    })
                    .unwrap();
                    live.insert(id.num(), id);
                }
                EventType::Established => {
                    let num = ev.id_num();
                    drop(ev);
                    if server_disc.contains(&num) {
                        live[&num].disconnect().unwrap();
                    }
                }
                EventType::Disconnected => {
                    let num = ev.id_num();
                    drop(ev);
                    if let Some(id) = live.remove(&num) {
                        if !server_disc.contains(&num) {
                            id.disconnect().unwrap();
                        }
                    }
                    done += 1;
                }
                EventType::TimewaitExit | EventType::AddrChange => {}
                k => panic!("server: {k} status {}", ev.status()),
            }
        }
    });
}

fn client(ch: &EventChannel, dst: SocketAddr) -> CmId {
    let id = CmId::new(ch, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, dst, T).unwrap();
    expect(ch, EventType::AddrResolved);
    id.resolve_route(T).unwrap();
    expect(ch, EventType::RouteResolved);
    id.create_qp_default().unwrap();
    id
}

#[test]
fn two_hosts_connect_accept_reject_disconnect_both_directions() {
    if !require_root("two_hosts_connect_accept_reject_disconnect_both_directions") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    wait_up(t.host("a"), "eth0");
    wait_up(t.host("b"), "eth0");
    for (listen, dst) in [
        ("0.0.0.0:7471", "192.0.2.2:7471"),
        ("[::]:7472", "[2001:db8:1::2]:7472"),
    ] {
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| server(t.host("b"), listen, 3, tx));
            rx.recv().unwrap();
            t.host("a").run(|| {
                let cma = Cma::new().unwrap();
                let ch = EventChannel::with_cma(&cma).unwrap();
                // 1. Client disconnects.
                let c = client(&ch, sa(dst));
                c.connect(&ConnParam {
                    private_data: b"hello".to_vec(),
                    ..Default::default()
                })
                .unwrap();
                let ev = expect(&ch, EventType::Established);
                assert_eq!(&ev.private_data()[..7], b"welcome");
                drop(ev);
                assert_eq!(c.netdev().unwrap().0, "eth0");
                assert_eq!(c.peer_addr(), Some(sa(dst)));
                c.disconnect().unwrap();
                expect(&ch, EventType::Disconnected);
                // 2. Server disconnects.
                let c2 = client(&ch, sa(dst));
                c2.connect(&ConnParam {
                    private_data: b"server-disconnects".to_vec(),
                    ..Default::default()
                })
                .unwrap();
                expect(&ch, EventType::Established);
                let ev = expect(&ch, EventType::Disconnected);
                assert_eq!(ev.id_num(), c2.num());
                drop(ev);
                c2.disconnect().unwrap();
                // 3. Rejected with private data.
                let c3 = client(&ch, sa(dst));
                c3.connect(&ConnParam {
                    private_data: b"reject".to_vec(),
                    ..Default::default()
                })
                .unwrap();
                let ev = expect(&ch, EventType::Rejected);
                assert_eq!(ev.status(), 28);
                assert_eq!(&ev.private_data()[..2], b"no");
            });
        });
    }
}

#[test]
fn two_hosts_many_connections() {
    if !require_root("two_hosts_many_connections") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    wait_up(t.host("a"), "eth0");
    wait_up(t.host("b"), "eth0");
    let n = conns(50);
    let m = if std::env::var("RDMA_CM_CONNS").is_ok() {
        200
    } else {
        n.min(50)
    };
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| server(t.host("b"), "192.0.2.2:7480", n + m, tx));
        rx.recv().unwrap();
        t.host("a").run(|| {
            let cma = Cma::new().unwrap();
            let ch = EventChannel::with_cma(&cma).unwrap();
            let t0 = Instant::now();
            for _ in 0..n {
                let c = client(&ch, sa("192.0.2.2:7480"));
                c.connect(&ConnParam::default()).unwrap();
                expect(&ch, EventType::Established);
                c.disconnect().unwrap();
                expect(&ch, EventType::Disconnected);
            }
            let dt = t0.elapsed();
            println!(
                "two hosts, sequential: {n} in {dt:?}: {:.0} connections/s",
                n as f64 / dt.as_secs_f64()
            );
            let ids: Vec<CmId> = (0..m).map(|_| client(&ch, sa("192.0.2.2:7480"))).collect();
            let t0 = Instant::now();
            for id in &ids {
                id.connect(&ConnParam::default()).unwrap();
            }
            for _ in 0..m {
                let ev = ch.get_event_timeout(T).unwrap().expect("established");
                assert_eq!(ev.kind(), EventType::Established, "status {}", ev.status());
            }
            let dt = t0.elapsed();
            println!(
                "two hosts, concurrent: {m} in {dt:?}: {:.0} connections/s",
                m as f64 / dt.as_secs_f64()
            );
            for id in &ids {
                id.disconnect().unwrap();
            }
            let mut d = 0;
            while d < m {
                let ev = ch.get_event_timeout(T).unwrap().expect("disconnected");
                if ev.kind() == EventType::Disconnected {
                    d += 1;
                }
            }
        });
    });
}

#[test]
fn listener_on_specific_address_only_accepts_that_address() {
    if !require_root("listener_on_specific_address_only_accepts_that_address") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    wait_up(t.host("a"), "eth0");
    wait_up(t.host("b"), "eth0");
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(|| {
            t.host("b").run(move || {
                let cma = Cma::new().unwrap();
                let ch = EventChannel::with_cma(&cma).unwrap();
                let l = CmId::new(&ch, PortSpace::Tcp).unwrap();
                l.bind_addr(sa("192.0.2.2:7490")).unwrap();
                l.listen(0).unwrap();
                // Another listener opens 2001:db8:1::2, another address of the same
                // netdev (device), on another port.
                let l2 = CmId::new(&ch, PortSpace::Tcp).unwrap();
                l2.bind_addr(sa("[2001:db8:1::2]:7491")).unwrap();
                l2.listen(0).unwrap();
                tx.send(()).unwrap();
                let mut got = 0;
                while done_rx.try_recv().is_err() {
                    if let Some(mut ev) = ch.get_event_timeout(Duration::from_millis(50)).unwrap() {
                        assert_eq!(ev.kind(), EventType::ConnectRequest);
                        assert_eq!(ev.listen_id(), Some(l.num()));
                        let id = ev.take_id().unwrap();
                        assert_eq!(id.local_addr(), Some(sa("192.0.2.2:7490")));
                        id.reject(&[]).unwrap();
                        got += 1;
                    }
                }
                assert_eq!(got, 1);
            })
        });
        rx.recv().unwrap();
        t.host("a").run(|| {
            let cma = Cma::new().unwrap();
            let ch = EventChannel::with_cma(&cma).unwrap();
            // For the listener's address: it gets the request (and rejects it).
            let c = client(&ch, sa("192.0.2.2:7490"));
            c.connect(&ConnParam::default()).unwrap();
            assert_eq!(expect(&ch, EventType::Rejected).status(), 28);
            // The same port on another address of the same netdev: the listener does not
            // get it; the CM rejects it (REJ 28, as Linux's listener lookup failing).
            let c = client(&ch, sa("[2001:db8:1::2]:7490"));
            c.connect(&ConnParam::default()).unwrap();
            assert_eq!(expect(&ch, EventType::Rejected).status(), 28);
        });
        done_tx.send(()).unwrap();
    });
}

#[test]
fn peer_vanishes_gives_unreachable_or_disconnected_never_a_hang() {
    if !require_root("peer_vanishes_gives_unreachable_or_disconnected_never_a_hang") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    wait_up(t.host("a"), "eth0");
    wait_up(t.host("b"), "eth0");
    let (tx, rx) = mpsc::channel();
    let (gone_tx, gone_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(|| {
            t.host("b").run(move || {
                let cma = Cma::new().unwrap();
                let ch = EventChannel::with_cma(&cma).unwrap();
                let l = CmId::new(&ch, PortSpace::Tcp).unwrap();
                l.bind_addr(sa("192.0.2.2:7500")).unwrap();
                l.listen(0).unwrap();
                tx.send(()).unwrap();
                let id = expect(&ch, EventType::ConnectRequest).take_id().unwrap();
                id.create_qp_default().unwrap();
                id.accept(&ConnParam::default()).unwrap();
                expect(&ch, EventType::Established);
                // Keep the ids until the netdev is gone; then the server may see
                // DEVICE_REMOVAL.
                gone_rx.recv().unwrap();
                drop(id);
            })
        });
        rx.recv().unwrap();
        t.host("a").run(|| {
            let cma = Cma::new().unwrap();
            cma.set_cm_timeouts(14, 2).unwrap();
            let ch = EventChannel::with_cma(&cma).unwrap();
            let c = client(&ch, sa("192.0.2.2:7500"));
            c.connect(&ConnParam::default()).unwrap();
            expect(&ch, EventType::Established);
            // A second id resolved to the peer, not yet connected.
            let c2 = client(&ch, sa("192.0.2.2:7500"));
            // The peer's netdev is deleted (the veth pair goes with it).
            sh(t.host("b"), &["link", "del", "eth0"]);
            gone_tx.send(()).unwrap();
            let t0 = Instant::now();
            c.disconnect().unwrap();
            // The progress engine may already have seen the netdev go (DEVICE_REMOVAL on
            // c2): then connect is refused at once and the removal is c2's end; else the
            // REQ goes unanswered and c2 ends UNREACHABLE.
            let c2_connecting = match c2.connect(&ConnParam::default()) {
                Ok(()) => true,
                Err(e) => {
                    assert!(e.to_string().contains("DEVICE_REMOVAL"), "{e}");
                    false
                }
            };
            let (mut disc, mut unreach) = (false, false);
            while !(disc && unreach) {
                let ev = ch
                    .get_event_timeout(Duration::from_secs(30))
                    .unwrap()
                    .expect("an event before 30 s: the CM must not hang");
                eprintln!(
                    "{:?} {} {} {}",
                    t0.elapsed(),
                    ev.kind(),
                    ev.status(),
                    ev.id_num()
                );
                match ev.kind() {
                    EventType::Disconnected if ev.id_num() == c.num() => {
                        assert_eq!(ev.status(), -libc::ETIMEDOUT);
                        disc = true;
                    }
                    EventType::Unreachable if ev.id_num() == c2.num() => {
                        assert!(c2_connecting, "UNREACHABLE for an id whose connect failed");
                        assert_eq!(ev.status(), -libc::ETIMEDOUT);
                        unreach = true;
                    }
                    EventType::DeviceRemoval if ev.id_num() == c2.num() && !c2_connecting => {
                        unreach = true;
                    }
                    EventType::DeviceRemoval | EventType::AddrChange | EventType::TimewaitExit => {}
                    k => panic!("unexpected {k} status {}", ev.status()),
                }
            }
            println!(
                "peer gone: DISCONNECTED and UNREACHABLE after {:?}",
                t0.elapsed()
            );
        });
    });
}

#[test]
fn cm_bound_netdev_without_route_fails_fast_ehostunreach() {
    if !require_root("cm_bound_netdev_without_route_fails_fast_ehostunreach") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    wait_up(t.host("a"), "eth0");
    t.host("a").run(|| {
        let cma = Cma::new().unwrap();
        let ch = EventChannel::with_cma(&cma).unwrap();
        let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
        id.bind_addr(sa("192.0.2.1:0")).unwrap();
        assert_eq!(id.netdev().unwrap().0, "eth0");
        // EHOSTUNREACH (not ETIMEDOUT at the deadline T): it failed without waiting
        let e = id
            .resolve_addr(None, sa("198.51.100.3:7471"), T)
            .unwrap_err();
        assert_eq!(e.errno(), libc::EHOSTUNREACH);
        assert_eq!(id.state(), rdmacm::cm::IdState::AddrBound);
        assert!(ch
            .get_event_timeout(Duration::from_millis(50))
            .unwrap()
            .is_none());
    });
}
