//! Every named topology builds, carries traffic where it should, and leaves nothing behind.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use rdma_testhosts::{require_root, topologies, Host, Topology};

fn netns_exists(name: &str) -> bool {
    std::path::Path::new(&format!("/var/run/netns/{name}")).exists()
}

/// Sends one datagram from `from` (bound to `src`) to `to` listening on `dst`; true if it arrived.
fn udp_reaches(from: &Host, src: &str, to: &Host, dst: &str) -> bool {
    let dst: SocketAddr = dst.parse().unwrap();
    let src: SocketAddr = src.parse().unwrap();
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let rx_side = s.spawn(move || {
            to.run(move || {
                let sock = UdpSocket::bind(dst).unwrap();
                sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                tx.send(()).unwrap();
                let mut buf = [0u8; 16];
                matches!(sock.recv_from(&mut buf), Ok((5, _)))
            })
        });
        rx.recv().unwrap();
        from.run(move || {
            let sock = UdpSocket::bind(src).unwrap();
            sock.send_to(b"hello", dst).unwrap();
        });
        rx_side.join().unwrap()
    })
}

fn check_gone(names: Vec<String>) {
    for n in names {
        assert!(!netns_exists(&n), "{n} left behind");
    }
}

fn names(t: &Topology) -> Vec<String> {
    t.hosts().iter().map(|h| h.netns().to_string()).collect()
}

#[test]
fn every_topology_builds_and_is_removed() {
    if !require_root("every_topology_builds_and_is_removed") {
        return;
    }
    for name in topologies::NAMES {
        let t = topologies::by_name(name).unwrap();
        let n = names(&t);
        for h in t.hosts() {
            assert!(netns_exists(h.netns()));
            let links = h.ip(&["-j", "link"]).unwrap();
            assert!(links.contains("\"lo\""), "{links}");
        }
        drop(t);
        check_gone(n);
    }
}

#[test]
fn two_hosts_reach_each_other_v4_v6_link_local() {
    if !require_root("two_hosts_reach_each_other_v4_v6_link_local") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    let (a, b) = (t.host("a"), t.host("b"));
    assert!(udp_reaches(a, "192.0.2.1:0", b, "192.0.2.2:40001"));
    assert!(udp_reaches(
        a,
        "[2001:db8:1::1]:0",
        b,
        "[2001:db8:1::2]:40001"
    ));
    let ifa: u32 = a
        .ip(&["-o", "link", "show", "eth0"])
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let ifb: u32 = b
        .ip(&["-o", "link", "show", "eth0"])
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(udp_reaches(
        a,
        &format!("[fe80::1%{ifa}]:0"),
        b,
        &format!("[fe80::2%{ifb}]:40002")
    ));
}

#[test]
fn router_forwards_between_subnets() {
    if !require_root("router_forwards_between_subnets") {
        return;
    }
    let t = topologies::router_between_subnets().unwrap();
    let (a, b) = (t.host("a"), t.host("b"));
    assert!(udp_reaches(a, "192.0.2.1:0", b, "198.51.100.2:40003"));
    assert!(udp_reaches(
        b,
        "[2001:db8:2::2]:0",
        a,
        "[2001:db8:1::1]:40003"
    ));
}

#[test]
fn local_route_goes_through_lo() {
    if !require_root("local_route_goes_through_lo") {
        return;
    }
    let t = topologies::local_route_via_lo().unwrap();
    let out = t
        .host("a")
        .ip(&["route", "get", "192.0.2.11", "from", "198.51.100.1"])
        .unwrap();
    assert!(out.starts_with("local 192.0.2.11"), "{out}");
    assert!(out.contains("dev lo"), "{out}");
}

#[test]
fn panic_inside_a_host_propagates_and_cleans_up() {
    if !require_root("panic_inside_a_host_propagates_and_cleans_up") {
        return;
    }
    let mut kept = Vec::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let t = topologies::two_hosts_one_link().unwrap();
        kept = names(&t);
        t.host("a").run(|| panic!("deliberate"));
    }));
    assert!(r.is_err());
    assert!(!kept.is_empty());
    check_gone(kept);
}

#[test]
fn command_runs_inside_the_host() {
    if !require_root("command_runs_inside_the_host") {
        return;
    }
    let t = topologies::two_nics_same_subnet().unwrap();
    let out = t
        .host("a")
        .command("ip")
        .args(["-o", "-4", "addr"])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("192.0.2.1/24") && s.contains("192.0.2.11/24"),
        "{s}"
    );
    assert_eq!(rdma_testhosts::sweep_stale(), rdma_testhosts::sweep_stale());
}

#[test]
fn sweep_removes_namespaces_of_dead_processes_only() {
    if !require_root("sweep_removes_namespaces_of_dead_processes_only") {
        return;
    }
    // pid_max is at most 4194304, so this pid never runs.
    let stale = "rth4194305x0z";
    let live = format!("rth{}x999999z", std::process::id());
    for n in [stale, live.as_str()] {
        assert!(std::process::Command::new("ip")
            .args(["netns", "add", n])
            .status()
            .unwrap()
            .success());
    }
    // A topology built by a parallel test may have swept first (its first build sweeps too),
    // so assert on what is left, not on the count.
    rdma_testhosts::sweep_stale();
    assert!(!netns_exists(stale));
    assert!(netns_exists(&live));
    std::process::Command::new("ip")
        .args(["netns", "del", &live])
        .status()
        .unwrap();
}
