//! Neighbour resolution across a veth link, and its failure modes against an absent host.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rdma_hostview::{BlockingHostView, Error, MacAddr};
use rdma_testhosts::{require_root, topologies, Host};

fn mac_of(host: &Host, dev: &str) -> MacAddr {
    host.run(|| {
        BlockingHostView::new()
            .unwrap()
            .link_by_name(dev)
            .unwrap()
            .mac
            .unwrap()
    })
}

#[test]
fn resolves_peer_mac_across_veth_v4_v6_link_local() {
    if !require_root("resolves_peer_mac_across_veth_v4_v6_link_local") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    let want = mac_of(t.host("b"), "eth0");
    t.host("a").run(|| {
        let hv = BlockingHostView::new().unwrap();
        let eth0 = hv.link_by_name("eth0").unwrap().index;
        for ip in ["192.0.2.2", "2001:db8:1::2", "fe80::2"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(hv
                .neighbour(eth0, ip)
                .unwrap()
                .is_none_or(|n| !n.state.is_valid()));
            let t0 = Instant::now();
            let mac = hv
                .resolve_neighbour(eth0, ip, Duration::from_secs(3))
                .unwrap();
            let first = t0.elapsed();
            assert_eq!(mac, want, "{ip}");
            let t1 = Instant::now();
            let again = hv
                .resolve_neighbour(eth0, ip, Duration::from_secs(3))
                .unwrap();
            let second = t1.elapsed();
            assert_eq!(again, want);
            let n = hv.neighbour(eth0, ip).unwrap().unwrap();
            assert!(n.state.is_valid(), "{n:?}");
            println!("resolved {ip} -> {mac} in {first:?} (cached: {second:?})");
        }
    });
}

#[test]
fn absent_host_times_out_then_fails() {
    if !require_root("absent_host_times_out_then_fails") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    t.host("a").run(|| {
        let hv = BlockingHostView::new().unwrap();
        let eth0 = hv.link_by_name("eth0").unwrap().index;
        for ip in ["192.0.2.77", "2001:db8:1::77"] {
            let ip: IpAddr = ip.parse().unwrap();
            let t0 = Instant::now();
            let e = hv
                .resolve_neighbour(eth0, ip, Duration::from_millis(300))
                .unwrap_err();
            let took = t0.elapsed();
            assert!(matches!(e, Error::TimedOut), "{e:?}");
            assert_eq!(e.errno(), libc::ETIMEDOUT);
            // it waited for its deadline (not an upper bound: timings belong to benchmarks)
            assert!(took >= Duration::from_millis(290), "{took:?}");
            println!("{ip}: {e} after {took:?}");
        }
        // With a long deadline the kernel gives up first (3 probes, 1 s apart): EHOSTUNREACH.
        for ip in ["192.0.2.78", "2001:db8:1::78"] {
            let ip: IpAddr = ip.parse().unwrap();
            let t0 = Instant::now();
            let e = hv
                .resolve_neighbour(eth0, ip, Duration::from_secs(10))
                .unwrap_err();
            let took = t0.elapsed();
            assert_eq!(e.errno(), libc::EHOSTUNREACH, "{e:?} after {took:?}");
            println!("{ip}: {e} after {took:?} (entry went FAILED)");
        }
    });
}

#[test]
fn loopback_needs_no_neighbour() {
    if !require_root("loopback_needs_no_neighbour") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    t.host("a").run(|| {
        let hv = BlockingHostView::new().unwrap();
        let lo = hv.link_by_name("lo").unwrap();
        assert!(lo.flags.loopback && !lo.needs_neighbour());
        // a 1 ms deadline: answered without any neighbour resolution, or it would time out
        let mac = hv
            .resolve_neighbour(
                lo.index,
                "127.0.0.1".parse().unwrap(),
                Duration::from_millis(1),
            )
            .unwrap();
        assert!(mac.is_zero());
        let e = hv
            .resolve_neighbour(9999, "192.0.2.2".parse().unwrap(), Duration::from_millis(1))
            .unwrap_err();
        assert_eq!(e.errno(), libc::ENODEV, "{e:?}");
    });
}
