//! Control-path latencies between namespace hosts (root; prints SKIPPED otherwise): what the
//! tests check only as behaviour (an event arrives, an error is EHOSTUNREACH and not a
//! timeout) is timed here. `CM_LAT_N` repetitions per row (default 20).
//!
//! ```text
//! sudo cargo run --release -p rdmacm --example cm_latency
//! ```
//!
//! Rows: the netlink monitor's route-change event, neighbour resolution (cold, after a flush,
//! and cached), `resolve_addr` failing EHOSTUNREACH on a bound netdev without a route, and a
//! connection's setup (resolve, route, REQ/REP/RTU) and teardown (DREQ/DREP) between hosts.

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rdma_hostview::{Event as NlEvent, HostView};
use rdma_testhosts::{require_root, topologies};
use rdmacm::cm::{CmId, Cma, ConnParam, EventChannel, EventType, PortSpace};
use rdmacm::host::{BlockingResolver, ScopedIp};

const T: Duration = Duration::from_secs(10);

struct Row {
    name: &'static str,
    h: Histogram<u64>,
}

impl Row {
    fn new(name: &'static str) -> Row {
        Row {
            name,
            h: Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("histogram"),
        }
    }
    fn add(&mut self, d: Duration) {
        self.h.saturating_record(d.as_nanos() as u64);
    }
    fn print(&self) {
        let us = |q: f64| self.h.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} |",
            self.name,
            self.h.len(),
            us(0.5),
            us(0.99),
            self.h.max() as f64 / 1000.0
        );
    }
}

fn expect(ch: &EventChannel, kind: EventType) {
    let ev = ch
        .get_event_timeout(T)
        .expect("get_event")
        .unwrap_or_else(|| panic!("no {kind} within {T:?}"));
    assert_eq!(ev.kind(), kind, "status {}", ev.status());
}

fn main() {
    if !require_root("cm_latency") {
        return;
    }
    let n: usize = std::env::var("CM_LAT_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    println!("cm_latency: {n} repetitions per row, times in µs");
    println!("| row | n | median | p99 | max |\n| --- | --- | --- | --- | --- |");

    // The monitor: `ip route replace` to the event, alternating two gateways.
    let t = topologies::two_nics_two_subnets().expect("topology");
    let a = t.host("a");
    let mut mon_row = Row::new("netlink monitor: route replace -> RouteChanged");
    a.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let hv = HostView::new().expect("hostview");
            let mut mon = hv.monitor().await.expect("monitor");
            let net: IpAddr = "203.0.113.0".parse().unwrap();
            a.ip(&["route", "add", "203.0.113.0/24", "via", "192.0.2.2"])
                .expect("route add");
            for i in 0..n {
                let gw = if i % 2 == 0 {
                    "198.51.100.3"
                } else {
                    "192.0.2.2"
                };
                let want: IpAddr = gw.parse().unwrap();
                let t0 = Instant::now();
                a.ip(&["route", "replace", "203.0.113.0/24", "via", gw])
                    .expect("route replace");
                let deadline = tokio::time::Instant::now() + T;
                loop {
                    match mon.next_before(deadline).await {
                        Ok(NlEvent::RouteChanged(r)) if r.dst == net && r.gateway == Some(want) => {
                            break
                        }
                        Ok(_) => {}
                        Err(e) => panic!("no RouteChanged: {e}"),
                    }
                }
                mon_row.add(t0.elapsed());
            }
        })
    });
    mon_row.print();

    // Resolution on host a of topology two_nics_two_subnets.
    let (mut cold, mut warm, mut unreach) = (
        Row::new("resolve_addr, neighbour cold (after a flush)"),
        Row::new("resolve_addr, neighbour cached"),
        Row::new("resolve_addr, bound netdev without route: EHOSTUNREACH"),
    );
    a.run(|| {
        let r = BlockingResolver::new().expect("resolver");
        let dst: ScopedIp = "192.0.2.2".parse().unwrap();
        for _ in 0..n {
            a.ip(&["neigh", "flush", "dev", "eth0"]).expect("flush");
            let t0 = Instant::now();
            r.resolve_addr(None, &dst, None, T).expect("resolve");
            cold.add(t0.elapsed());
            let t0 = Instant::now();
            r.resolve_addr(None, &dst, None, T).expect("resolve");
            warm.add(t0.elapsed());
        }
        let b = r.bind(&"192.0.2.1".parse().unwrap()).expect("bind");
        let bound = b.netdev.map(|d| d.index);
        let far: ScopedIp = "198.51.100.3".parse().unwrap();
        for _ in 0..n {
            let t0 = Instant::now();
            let e = r.resolve_addr(None, &far, bound, T).unwrap_err();
            unreach.add(t0.elapsed());
            assert_eq!(e.errno(), libc::EHOSTUNREACH, "{e}");
        }
    });
    for row in [&cold, &warm, &unreach] {
        row.print();
    }
    drop(t);

    // Connection setup and teardown between two hosts.
    let t = topologies::two_hosts_one_link().expect("topology");
    let (mut setup, mut down) = (
        Row::new("connect: resolve + route + REQ/REP/RTU -> ESTABLISHED"),
        Row::new("disconnect: DREQ -> DISCONNECTED"),
    );
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::scope(|s| {
        let b = t.host("b");
        s.spawn(move || {
            b.run(move || {
                let cma = Cma::new().expect("cma");
                let ch = EventChannel::with_cma(&cma).expect("channel");
                let l = CmId::new(&ch, PortSpace::Tcp).expect("id");
                l.bind_addr("192.0.2.2:7600".parse().unwrap())
                    .expect("bind");
                l.listen(16).expect("listen");
                ready_tx.send(()).unwrap();
                let mut ids = Vec::new();
                let mut done = 0;
                while done < n {
                    let mut ev = ch
                        .get_event_timeout(T)
                        .expect("event")
                        .expect("server event");
                    match ev.kind() {
                        EventType::ConnectRequest => {
                            let id = ev.take_id().expect("id");
                            drop(ev);
                            id.create_qp_default().expect("qp");
                            id.accept(&ConnParam::default()).expect("accept");
                            ids.push(id);
                        }
                        EventType::Disconnected => {
                            // answer the DREQ (DREP), as rdma_disconnect on the passive side
                            let num = ev.id_num();
                            drop(ev);
                            if let Some(i) = ids.iter().position(|id| id.num() == num) {
                                ids.remove(i).disconnect().expect("disconnect");
                            }
                            done += 1;
                        }
                        _ => {}
                    }
                }
            })
        });
        ready_rx.recv().unwrap();
        t.host("a").run(|| {
            let cma = Cma::new().expect("cma");
            let ch = EventChannel::with_cma(&cma).expect("channel");
            let dst: SocketAddr = "192.0.2.2:7600".parse().unwrap();
            for _ in 0..n {
                let id = CmId::new(&ch, PortSpace::Tcp).expect("id");
                let t0 = Instant::now();
                id.resolve_addr(None, dst, T).expect("resolve_addr");
                expect(&ch, EventType::AddrResolved);
                id.resolve_route(T).expect("resolve_route");
                expect(&ch, EventType::RouteResolved);
                id.create_qp_default().expect("qp");
                id.connect(&ConnParam::default()).expect("connect");
                expect(&ch, EventType::Established);
                setup.add(t0.elapsed());
                let t0 = Instant::now();
                id.disconnect().expect("disconnect");
                expect(&ch, EventType::Disconnected);
                down.add(t0.elapsed());
            }
        });
    });
    setup.print();
    down.print();
}
