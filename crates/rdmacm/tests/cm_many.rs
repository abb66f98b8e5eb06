//! Many connections over loopback: sequential and concurrent (size from `RDMA_CM_CONNS`,
//! small by default for CI), backlog overflow, timewait, data over a connected QP, the
//! async layer.

mod support_cm;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_soft::verbs::{AccessFlags, RecvWr, SendOp, SendWr, WcStatus};
use rdmacm::cm::{CmId, Cma, ConnParam, Event, EventChannel, EventType, PortSpace, RejectCause};
use rdmacm::{ConnectOptions, Connection, Listener};
use support_cm::expect_within;

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

fn listener(cma: &Cma, addr: &str, backlog: usize) -> (EventChannel, CmId, SocketAddr) {
    let ch = EventChannel::with_cma(cma).unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    id.bind_addr(addr.parse().unwrap()).unwrap();
    id.listen(backlog).unwrap();
    let a = id.local_addr().unwrap();
    (ch, id, a)
}

fn resolved(ch: &EventChannel, dst: SocketAddr) -> CmId {
    let id = CmId::new(ch, PortSpace::Tcp).unwrap();
    id.resolve_addr(Some(SocketAddr::new(dst.ip(), 0)), dst, T)
        .unwrap();
    expect(ch, EventType::AddrResolved);
    id.resolve_route(T).unwrap();
    expect(ch, EventType::RouteResolved);
    id
}

/// The server side in its own thread: accepts and answers until `n` connections were
/// established and disconnected by the clients.
fn serve(lch: EventChannel, n: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut live = std::collections::HashMap::new();
        let mut done = 0;
        while done < n {
            let mut ev = lch.get_event_timeout(T).unwrap().expect("server event");
            match ev.kind() {
                EventType::ConnectRequest => {
                    let id = ev.take_id().unwrap();
                    drop(ev);
                    id.create_qp_default().unwrap();
                    id.accept(&ConnParam::default()).unwrap();
                    live.insert(id.num(), id);
                }
                EventType::Established => {}
                EventType::Disconnected => {
                    let num = ev.id_num();
                    drop(ev);
                    if let Some(id) = live.remove(&num) {
                        let _ = id.disconnect();
                    }
                    done += 1;
                }
                EventType::TimewaitExit => {}
                k => panic!("server: {k} status {}", ev.status()),
            }
        }
    })
}

#[test]
fn sequential_connections() {
    let n = conns(50);
    let cma = Cma::new().unwrap();
    let (lch, _l, addr) = listener(&cma, "127.0.0.131:0", 0);
    let server = serve(lch, n);
    let ch = EventChannel::with_cma(&cma).unwrap();
    let t0 = Instant::now();
    for _ in 0..n {
        let id = resolved(&ch, addr);
        id.create_qp_default().unwrap();
        id.connect(&ConnParam::default()).unwrap();
        expect(&ch, EventType::Established);
        id.disconnect().unwrap();
        loop {
            let ev = ch.get_event_timeout(T).unwrap().expect("client event");
            if ev.kind() == EventType::Disconnected {
                break;
            }
        }
    }
    let dt = t0.elapsed();
    server.join().unwrap();
    println!(
        "sequential: {n} connect+disconnect in {dt:?}: {:.0} connections/s",
        n as f64 / dt.as_secs_f64()
    );
}

#[test]
fn concurrent_connections() {
    let n = conns(50).min(200);
    let n = if std::env::var("RDMA_CM_CONNS").is_ok() {
        200
    } else {
        n
    };
    let cma = Cma::new().unwrap();
    let (lch, _l, addr) = listener(&cma, "127.0.0.132:0", 0);
    let server = serve(lch, n);
    let ch = EventChannel::with_cma(&cma).unwrap();
    let t0 = Instant::now();
    let mut ids = Vec::new();
    for _ in 0..n {
        let id = resolved(&ch, addr);
        id.create_qp_default().unwrap();
        ids.push(id);
    }
    for id in &ids {
        id.connect(&ConnParam::default()).unwrap();
    }
    let mut est = 0;
    while est < n {
        let ev = ch.get_event_timeout(T).unwrap().expect("established");
        assert_eq!(ev.kind(), EventType::Established, "status {}", ev.status());
        est += 1;
    }
    let dt = t0.elapsed();
    for id in &ids {
        id.disconnect().unwrap();
    }
    let mut disc = 0;
    while disc < n {
        let ev = ch.get_event_timeout(T).unwrap().expect("disconnected");
        if ev.kind() == EventType::Disconnected {
            disc += 1;
        }
    }
    server.join().unwrap();
    println!(
        "concurrent: {n} connections established in {dt:?}: {:.0} connections/s",
        n as f64 / dt.as_secs_f64()
    );
}

#[test]
fn backlog_overflow_drops_the_req_silently_and_the_retry_succeeds() {
    let cma = Cma::new().unwrap();
    // REQs retried after about 0.6 s (2 x packet life time + 2^(14-8) ms) instead of 4.6 s.
    cma.set_cm_timeouts(14, 15).unwrap();
    let (lch, _l, addr) = listener(&cma, "127.0.0.133:0", 2);
    let ch = EventChannel::with_cma(&cma).unwrap();
    let ids: Vec<CmId> = (0..4)
        .map(|_| {
            let id = resolved(&ch, addr);
            id.create_qp_default().unwrap();
            id.connect(&ConnParam::default()).unwrap();
            id
        })
        .collect();
    // Nobody takes the requests: two fit in the backlog, two are dropped without an
    // answer (Linux: no REJ, the peer retries).
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(300) {
        if let Some(ev) = ch.get_event_timeout(Duration::from_millis(50)).unwrap() {
            panic!("no event expected on the active side, got {}", ev.kind());
        }
    }
    // Two taken, the others refused for the full backlog (a retry that came meanwhile is
    // refused again: nobody took a request yet), none for another cause.
    let s = cma.statistics();
    assert_eq!(s.requests_accepted, 2, "{s:?}");
    assert!(
        s.refused.len() == 1 && s.refused[0].0 == RejectCause::BacklogFull && s.refused[0].1 >= 2,
        "two requests refused for the full backlog: {s:?}"
    );
    // The backlog drains: the two dropped requests come back with their retries.
    let mut servers = Vec::new();
    let mut server_est = 0;
    while servers.len() < 4 || server_est < 4 {
        let mut ev = lch.get_event_timeout(T).unwrap().expect("server event");
        match ev.kind() {
            EventType::ConnectRequest => {
                let s = ev.take_id().unwrap();
                drop(ev);
                s.create_qp_default().unwrap();
                s.accept(&ConnParam::default()).unwrap();
                servers.push(s);
            }
            EventType::Established => server_est += 1,
            k => panic!("unexpected {k} (status {})", ev.status()),
        }
    }
    // (each wait above is bounded by T: the retries came back, or the test failed there;
    // how long they took is for a benchmark, not an assertion)
    let mut est = 0;
    while est < 4 {
        let ev = ch.get_event_timeout(T).unwrap().expect("client event");
        assert_eq!(ev.kind(), EventType::Established, "status {}", ev.status());
        est += 1;
    }
    // The dropped two came in by their retransmissions (no REJ was sent: none received).
    let s = cma.statistics();
    assert_eq!(s.requests_accepted, 4, "{s:?}");
    let dropped = s.refused[0].1;
    assert!(
        s.retransmits >= dropped,
        "each dropped REQ was retransmitted: {s:?}"
    );
    drop(ids);
    drop(servers);
}

#[test]
fn timewait_exit_after_disconnect_and_send_over_the_qp() {
    let cma = Cma::new().unwrap();
    let (lch, _l, addr) = listener(&cma, "127.0.0.134:0", 0);
    let ch = EventChannel::with_cma(&cma).unwrap();
    let c = resolved(&ch, addr);
    let cq_c = c.create_qp_default().unwrap();
    c.connect(&ConnParam::default()).unwrap();
    let s = expect(&lch, EventType::ConnectRequest).take_id().unwrap();
    let qs = s.create_qp_default().unwrap();
    let mr = qs
        .pd()
        .register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)
        .unwrap();
    qs.post_recv(&RecvWr::new(9).with_sge(mr.sge(0, 64).unwrap()))
        .unwrap();
    s.accept(&ConnParam::default()).unwrap();
    expect(&ch, EventType::Established);
    expect(&lch, EventType::Established);
    let mc = cq_c
        .pd()
        .register(b"over the CM's QP".to_vec(), AccessFlags::LOCAL_WRITE)
        .unwrap();
    cq_c.post_send(
        &SendWr::new(1, SendOp::Send)
            .with_sge(mc.sge(0, 16).unwrap())
            .signaled(),
    )
    .unwrap();
    let mut wc = Vec::new();
    let t0 = Instant::now();
    while qs.recv_cq().poll(&mut wc, 1) == 0 {
        assert!(t0.elapsed() < T);
    }
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (9, WcStatus::Success, 16)
    );
    let mut got = [0u8; 16];
    mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"over the CM's QP");
    c.disconnect().unwrap();
    expect(&lch, EventType::Disconnected);
    s.disconnect().unwrap();
    expect(&ch, EventType::Disconnected);
    // Timewait (about 1 s on RoCE) ends on both sides.
    expect(&ch, EventType::TimewaitExit);
    expect(&lch, EventType::TimewaitExit);
}

#[test]
fn async_listener_and_connection() {
    let cma = Cma::new().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let l = Listener::builder()
            .cma(cma.clone())
            .bind("127.0.0.135:0".parse().unwrap())
            .await
            .unwrap();
        let addr = l.local_addr().unwrap();
        let l = Arc::new(l);
        let l2 = l.clone();
        let server = tokio::spawn(async move { l2.accept().await.unwrap() });
        let opts = ConnectOptions::new()
            .private_data(b"async hello".to_vec())
            .src("127.0.0.135:0".parse().unwrap())
            .cma(cma.clone());
        let c = tokio::time::timeout(T, Connection::connect(addr, opts))
            .await
            .unwrap()
            .unwrap();
        let s = tokio::time::timeout(T, server).await.unwrap().unwrap();
        assert_eq!(&s.peer_private_data()[..11], b"async hello");
        assert_eq!(s.peer_addr(), c.local_addr());
        assert_eq!(c.qp().query().unwrap().dest_qp_num, s.qp().qpn());
        tokio::time::timeout(T, c.disconnect())
            .await
            .unwrap()
            .unwrap();
        let ev = tokio::time::timeout(T, s.next_event())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ev.kind(), EventType::Disconnected);
        drop(ev);
        s.disconnect().await.unwrap();
        let ev = tokio::time::timeout(T, c.next_event())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ev.kind(), EventType::Disconnected);
    });
}
