//! The monitor reports a route replace, an address removal and a link going down.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rdma_hostview::{Event, Monitor};
use rdma_testhosts::{require_root, topologies, Host};

/// Runs `ip ARGS` in `host`, then waits for the first event `want` accepts; returns the time
/// from just before the command to the event.
async fn change_and_wait(
    mon: &mut Monitor,
    host: &Host,
    args: &[&str],
    want: impl Fn(&Event) -> bool,
) -> Duration {
    let t0 = Instant::now();
    host.ip(args).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match mon.next_before(deadline).await {
            Ok(ev) if want(&ev) => return t0.elapsed(),
            Ok(_) => {}
            Err(e) => panic!("ip {args:?}: no matching event: {e}"),
        }
    }
}

#[test]
fn monitor_reports_route_replace_address_removal_link_down() {
    if !require_root("monitor_reports_route_replace_address_removal_link_down") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    let a = t.host("a");
    a.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let hv = rdma_hostview::HostView::new().unwrap();
            let eth0 = hv.link_by_name("eth0").await.unwrap().index;
            let mut mon = hv.monitor().await.unwrap();
            let net: IpAddr = "203.0.113.0".parse().unwrap();
            let gw_b: IpAddr = "192.0.2.2".parse().unwrap();
            let gw_c: IpAddr = "198.51.100.3".parse().unwrap();

            let added = change_and_wait(&mut mon, a, &["route", "add", "203.0.113.0/24", "via", "192.0.2.2"], |e| {
                matches!(e, Event::RouteAdded(r) if r.dst == net && r.dst_len == 24 && r.gateway == Some(gw_b))
            })
            .await;
            let replaced = change_and_wait(
                &mut mon,
                a,
                &["route", "replace", "203.0.113.0/24", "via", "198.51.100.3"],
                |e| matches!(e, Event::RouteChanged(r) if r.dst == net && r.gateway == Some(gw_c)),
            )
            .await;
            let addr: IpAddr = "198.51.100.1".parse().unwrap();
            let removed = change_and_wait(&mut mon, a, &["addr", "del", "198.51.100.1/24", "dev", "eth1"], |e| {
                matches!(e, Event::AddressRemoved(x) if x.addr == addr)
            })
            .await;
            let down = change_and_wait(&mut mon, a, &["link", "set", "eth0", "down"], |e| {
                matches!(e, Event::LinkDown(l) if l.index == eth0 && !l.flags.up)
            })
            .await;
            let up = change_and_wait(&mut mon, a, &["link", "set", "eth0", "up"], |e| {
                matches!(e, Event::LinkUp(l) if l.index == eth0)
            })
            .await;
            println!(
                "monitor latency (command start -> event): route add {added:?}, route replace {replaced:?}, \
                 address removal {removed:?}, link down {down:?}, link up {up:?}"
            );
            // each event arrived (change_and_wait fails without it); the latencies above are
            // reported, not asserted: timings belong to benchmarks
        });
    });
}

#[test]
fn monitor_reports_neighbour_mac_change() {
    if !require_root("monitor_reports_neighbour_mac_change") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    let a = t.host("a");
    a.ip(&[
        "neigh",
        "add",
        "192.0.2.50",
        "lladdr",
        "02:00:00:00:00:01",
        "dev",
        "eth0",
    ])
    .unwrap();
    a.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut mon = Monitor::new().await.unwrap();
            let d = change_and_wait(
                &mut mon,
                a,
                &["neigh", "replace", "192.0.2.50", "lladdr", "02:00:00:00:00:02", "dev", "eth0"],
                |e| matches!(e, Event::NeighbourMacChanged { old, new, .. }
                    if old.to_string() == "02:00:00:00:00:01" && new.to_string() == "02:00:00:00:00:02"),
            )
            .await;
            println!("neighbour MAC change reported after {d:?}");
            let d = change_and_wait(&mut mon, a, &["link", "del", "eth0"], |e| matches!(e, Event::LinkRemoved(l) if l.name == "eth0")).await;
            println!("link removal reported after {d:?}");
        });
    });
}
