//! `rdma_set_option` probed by its effect, not its stored value (root; SKIPPED otherwise),
//! between two namespace hosts (a: 192.0.2.1 / 2001:db8:1::1, b: .2 / ::2):
//! - AFONLY: an IPv6 wildcard listener with AFONLY does not get an IPv4 request (the
//!   request is rejected, invalid service id) and shares its port with an IPv4 listener,
//!   which gets it; without AFONLY the IPv6 wildcard listener gets the IPv4 request.
//! - REUSEADDR: an id still bound to a port after its connection ended (disconnected, in
//!   timewait) keeps the port from a second id, unless both set REUSEADDR: then the second
//!   binds it and connects from it (the server sees that source port).
//! - ACK timeout: with the server's host unable to answer (a blackhole route to the
//!   client), the client's SEND is retransmitted; the capture on the server's veth sees the
//!   retransmissions no sooner than the set timeout apart (4.096 us x 2^18 = 1.07 s, twice
//!   the CM's default of 537 ms, so an ignored option fails), then RetryExcErr.

mod support_cm;
mod support_hosts;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use rdma_soft::verbs::{AccessFlags, SendOp, SendWr, WcStatus};
use rdma_testhosts::capture::Capture;
use rdma_testhosts::{require_root, Host};
use rdmacm::cm::{CmId, CmOption, Cma, ConnParam, Event, EventChannel, EventType, PortSpace};
use support_cm::{expect_within, sa};
use support_hosts::*;

const T: Duration = Duration::from_secs(10);

fn expect(ch: &EventChannel, kind: EventType) -> Event {
    expect_within(ch, kind, T)
}

/// Connects a fresh id on `ch` to `dst`; returns it and the event that ended the attempt
/// (ESTABLISHED, REJECTED, UNREACHABLE ...) with its status.
fn try_connect(ch: &EventChannel, dst: SocketAddr) -> (CmId, EventType, i32) {
    let id = CmId::new(ch, PortSpace::Tcp).unwrap();
    connect_id(ch, &id, dst);
    let ev = ch
        .get_event_timeout(T)
        .unwrap()
        .unwrap_or_else(|| panic!("no outcome of connecting to {dst}"));
    let (k, s) = (ev.kind(), ev.status());
    drop(ev);
    (id, k, s)
}

fn connect_id(ch: &EventChannel, id: &CmId, dst: SocketAddr) {
    id.resolve_addr(None, dst, T).unwrap();
    expect(ch, EventType::AddrResolved);
    id.resolve_route(T).unwrap();
    expect(ch, EventType::RouteResolved);
    id.create_qp_default().unwrap();
    id.connect(&ConnParam::default()).unwrap();
}

/// Serves on `ch` until `n` CONNECT_REQUESTs were accepted; returns, for each, the listener
/// it came through (by id number) and the peer address.
fn accept_n(ch: &EventChannel, n: usize) -> Vec<(u64, SocketAddr, CmId)> {
    let mut got = Vec::new();
    while got.len() < n {
        let mut ev = ch.get_event_timeout(T).unwrap().expect("server: a request");
        match ev.kind() {
            EventType::ConnectRequest => {
                let listener = ev.listen_id().expect("listener of the request");
                let id = ev.take_id().unwrap();
                drop(ev);
                id.create_qp_default().unwrap();
                id.accept(&ConnParam::default()).unwrap();
                let peer = id.peer_addr().unwrap();
                got.push((listener, peer, id));
            }
            EventType::Established
            | EventType::Disconnected
            | EventType::TimewaitExit
            | EventType::AddrChange => {}
            k => panic!("server: {k} status {}", ev.status()),
        }
    }
    got
}

#[test]
fn afonly_v6_listener_gets_no_v4_request() {
    if !require_root("afonly_v6_listener_gets_no_v4_request") {
        return;
    }
    let t = two_hosts_running();
    for afonly in [true, false] {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let port = if afonly { 7501 } else { 7502 };
        std::thread::scope(|s| {
            let b = t.host("b");
            let server = s.spawn(move || {
                b.run(move || {
                    let cma = Cma::new().unwrap();
                    let ch = EventChannel::with_cma(&cma).unwrap();
                    let l6 = CmId::new(&ch, PortSpace::Tcp).unwrap();
                    l6.set_option(CmOption::AfOnly(afonly)).unwrap();
                    l6.bind_addr(sa(&format!("[::]:{port}"))).unwrap();
                    l6.listen(0).unwrap();
                    // an AFONLY IPv6 wildcard and an IPv4 wildcard share the port
                    let l4 = CmId::new(&ch, PortSpace::Tcp).unwrap();
                    let r4 = l4.bind_addr(sa(&format!("0.0.0.0:{port}")));
                    assert_eq!(r4.is_ok(), afonly, "IPv4 bind beside the IPv6 one: {r4:?}");
                    if afonly {
                        l4.listen(0).unwrap();
                    }
                    ready_tx.send(()).unwrap();
                    // the IPv6 request, then the IPv4 one
                    let got = accept_n(&ch, 2);
                    stop_rx.recv().unwrap();
                    got.iter()
                        .map(|(l, peer, _)| (*l == l6.num(), peer.is_ipv4()))
                        .collect::<Vec<_>>()
                })
            });
            ready_rx.recv().unwrap();
            t.host("a").run(|| {
                let cma = Cma::new().unwrap();
                let ch = EventChannel::with_cma(&cma).unwrap();
                let (_c6, k6, _) = try_connect(&ch, sa(&format!("[2001:db8:1::2]:{port}")));
                assert_eq!(k6, EventType::Established, "IPv6 request");
                let (_c4, k4, st) = try_connect(&ch, sa(&format!("192.0.2.2:{port}")));
                assert_eq!(k4, EventType::Established, "IPv4 request (status {st})");
                stop_tx.send(()).unwrap();
            });
            let got = server.join().unwrap();
            // (through the IPv6 listener?, from an IPv4 peer?)
            assert_eq!(
                got[0],
                (true, false),
                "the IPv6 request reached the IPv6 listener"
            );
            assert_eq!(
                got[1],
                (!afonly, true),
                "the IPv4 request went to the IPv6 wildcard listener iff AFONLY is off"
            );
        });
    }
    // AFONLY alone, no IPv4 listener: the IPv4 request finds nobody.
    let (ready_tx, ready_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let b = t.host("b");
        s.spawn(move || {
            b.run(move || {
                let cma = Cma::new().unwrap();
                let ch = EventChannel::with_cma(&cma).unwrap();
                let l6 = CmId::new(&ch, PortSpace::Tcp).unwrap();
                l6.set_option(CmOption::AfOnly(true)).unwrap();
                l6.bind_addr(sa("[::]:7503")).unwrap();
                l6.listen(0).unwrap();
                ready_tx.send(()).unwrap();
                stop_rx.recv().unwrap();
                // nothing came through the listener
                assert!(ch.get_event_timeout(Duration::ZERO).unwrap().is_none());
                // the server knows why it refused
                assert_eq!(
                    cma.reject_counts(),
                    [(rdmacm::cm::RejectCause::NoListenerForAddress, 1)]
                );
            })
        });
        ready_rx.recv().unwrap();
        t.host("a").run(|| {
            let cma = Cma::new().unwrap();
            let ch = EventChannel::with_cma(&cma).unwrap();
            let (_c4, k4, st) = try_connect(&ch, sa("192.0.2.2:7503"));
            // As Linux's rdma_cm: the request reaches the host (a wildcard listener hears on
            // every address), no listener takes it, REJ consumer defined (28).
            assert_eq!(
                (k4, st),
                (EventType::Rejected, 28),
                "IPv4 request to an AFONLY IPv6 listener"
            );
            stop_tx.send(()).unwrap();
        });
    });
}

#[test]
fn reuseaddr_binds_a_port_in_timewait() {
    if !require_root("reuseaddr_binds_a_port_in_timewait") {
        return;
    }
    let t = two_hosts_running();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let b = t.host("b");
        let server = s.spawn(move || {
            b.run(move || {
                let cma = Cma::new().unwrap();
                let ch = EventChannel::with_cma(&cma).unwrap();
                let l = CmId::new(&ch, PortSpace::Tcp).unwrap();
                l.bind_addr(sa("192.0.2.2:7511")).unwrap();
                l.listen(0).unwrap();
                ready_tx.send(()).unwrap();
                let first = accept_n(&ch, 1);
                let peer1 = first[0].1;
                // the first connection ends (the client disconnects)
                let ev = expect(&ch, EventType::Established);
                drop(ev);
                loop {
                    let ev = ch.get_event_timeout(T).unwrap().expect("disconnect");
                    if ev.kind() == EventType::Disconnected {
                        break;
                    }
                }
                first[0].2.disconnect().unwrap();
                let second = accept_n(&ch, 1);
                stop_rx.recv().unwrap();
                (peer1, second[0].1)
            })
        });
        ready_rx.recv().unwrap();
        t.host("a").run(|| {
            let cma = Cma::new().unwrap();
            let ch = EventChannel::with_cma(&cma).unwrap();
            let src = sa("192.0.2.1:7512");
            let c1 = CmId::new(&ch, PortSpace::Tcp).unwrap();
            c1.set_option(CmOption::ReuseAddr(true)).unwrap();
            c1.bind_addr(src).unwrap();
            connect_id(&ch, &c1, sa("192.0.2.2:7511"));
            expect(&ch, EventType::Established);
            c1.disconnect().unwrap();
            expect(&ch, EventType::Disconnected);
            // c1 is in timewait (no TIMEWAIT_EXIT yet) and still holds its port
            let plain = CmId::new(&ch, PortSpace::Tcp).unwrap();
            let e = plain.bind_addr(src).unwrap_err();
            assert_eq!(e.errno(), libc::EADDRINUSE, "without REUSEADDR: {e}");
            let c2 = CmId::new(&ch, PortSpace::Tcp).unwrap();
            let e = {
                let half = CmId::new(&ch, PortSpace::Tcp).unwrap();
                half.set_option(CmOption::ReuseAddr(false)).unwrap();
                half.bind_addr(src).unwrap_err()
            };
            assert_eq!(e.errno(), libc::EADDRINUSE);
            c2.set_option(CmOption::ReuseAddr(true)).unwrap();
            c2.bind_addr(src)
                .expect("REUSEADDR binds the port in timewait");
            assert_eq!(
                c1.state().name(),
                "RDMA_CM_DISCONNECT",
                "c1 still in timewait"
            );
            connect_id(&ch, &c2, sa("192.0.2.2:7511"));
            expect(&ch, EventType::Established);
            stop_tx.send(()).unwrap();
        });
        let (p1, p2) = server.join().unwrap();
        assert_eq!(p1, sa("192.0.2.1:7512"));
        assert_eq!(
            p2,
            sa("192.0.2.1:7512"),
            "the second connection came from the reused port"
        );
    });
}

#[test]
fn ack_timeout_sets_the_retransmission_interval() {
    if !require_root("ack_timeout_sets_the_retransmission_interval") {
        return;
    }
    const ACK_TIMEOUT: u8 = 18;
    let timeout_ns = 4096u64 << ACK_TIMEOUT;
    let t = two_hosts_running();
    let b: &Host = t.host("b");
    let (ready_tx, ready_rx) = mpsc::channel();
    let (est_tx, est_rx) = mpsc::channel::<()>();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            b.run(move || {
                let cma = Cma::new().unwrap();
                let ch = EventChannel::with_cma(&cma).unwrap();
                let l = CmId::new(&ch, PortSpace::Tcp).unwrap();
                l.bind_addr(sa("192.0.2.2:7521")).unwrap();
                l.listen(0).unwrap();
                ready_tx.send(()).unwrap();
                let mut ev = expect(&ch, EventType::ConnectRequest);
                let id = ev.take_id().unwrap();
                drop(ev);
                id.create_qp_default().unwrap();
                id.accept(&ConnParam {
                    retry_count: 2,
                    ..Default::default()
                })
                .unwrap();
                expect(&ch, EventType::Established);
                est_tx.send(()).unwrap();
                stop_rx.recv().unwrap();
            })
        });
        ready_rx.recv().unwrap();
        let cap = b.run(|| Capture::open("eth0")).unwrap();
        t.host("a").run(move || {
            let cma = Cma::new().unwrap();
            let ch = EventChannel::with_cma(&cma).unwrap();
            let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
            id.set_option(CmOption::AckTimeout(ACK_TIMEOUT)).unwrap();
            id.resolve_addr(None, sa("192.0.2.2:7521"), T).unwrap();
            expect(&ch, EventType::AddrResolved);
            id.resolve_route(T).unwrap();
            expect(&ch, EventType::RouteResolved);
            let qp = id.create_qp_default().unwrap();
            id.connect(&ConnParam {
                retry_count: 2,
                ..Default::default()
            })
            .unwrap();
            expect(&ch, EventType::Established);
            est_rx.recv().unwrap();
            // From now on b cannot answer a: its ACKs go nowhere.
            sh(b, &["route", "add", "blackhole", "192.0.2.1/32"]);
            let mr = qp
                .pd()
                .register(vec![0x77u8; 64], AccessFlags::LOCAL_WRITE)
                .unwrap();
            qp.post_send(
                &SendWr::new(9, SendOp::Send)
                    .with_sge(mr.sge(0, 64).unwrap())
                    .signaled(),
            )
            .unwrap();
            // every transmission of the SEND (RC SEND_ONLY to b) arriving at b
            let mut seen = Vec::new();
            let mut buf = vec![0u8; 9000];
            let mut wc = Vec::new();
            let mut idle = 0;
            while wc.is_empty() || idle < 3 {
                match cap.next(&mut buf) {
                    Some((n, ts)) => {
                        let p = &buf[..n];
                        let ours = n > 40
                            && p[0] >> 4 == 4
                            && p[9] == 17
                            && p[12..16] == [192, 0, 2, 1]
                            && p[22..24] == 4791u16.to_be_bytes()
                            && p[28] == 0x04;
                        if ours {
                            seen.push(ts);
                        }
                    }
                    None if !wc.is_empty() => idle += 1,
                    None => {}
                }
                if wc.is_empty() {
                    qp.send_cq().poll(&mut wc, 1);
                }
                assert!(seen.len() < 20, "retransmitted without end");
            }
            assert_eq!(wc[0].status, WcStatus::RetryExcErr, "{wc:?}");
            let gaps: Vec<u64> = seen.windows(2).map(|w| w[1] - w[0]).collect();
            println!(
                "ACK timeout {ACK_TIMEOUT} ({} ms): {} transmissions, gaps {:?} ms",
                timeout_ns / 1_000_000,
                seen.len(),
                gaps.iter().map(|g| g / 1_000_000).collect::<Vec<_>>()
            );
            assert!(seen.len() >= 2, "the SEND was retransmitted: {seen:?}");
            // Early retransmissions (tail-loss probes) may come before the ACK timeout;
            // the give-up bound is the option's: retry_count 2 means a retransmission at
            // each of the first two timeouts without progress, RetryExcErr at the third.
            // Lower bound only: a busy machine makes the span longer, never shorter.
            let span = seen.last().unwrap() - seen.first().unwrap();
            assert!(
                span >= 2 * timeout_ns - timeout_ns / 50,
                "the last retransmission came {span} ns after the first, before two \
                 {timeout_ns} ns ACK timeouts"
            );
            stop_tx.send(()).unwrap();
        });
    });
}
