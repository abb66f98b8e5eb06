//! DESIGN.md rows "How does resolve_addr pick a device?", "Bound to one device, route via
//! another?", "Loopback", "Link-local IPv6", and route resolution, in network-namespace
//! hosts (root; SKIPPED otherwise).

mod support_hosts;

use std::time::{Duration, Instant};

use rdma_testhosts::{require_root, topologies};
use rdmacm::host::{Gid, IbMtu, MacAddr, RouteParams};
use support_hosts::*;

const T: Duration = Duration::from_secs(3);

#[test]
fn resolve_uses_full_tuple_route_lookup() {
    if !require_root("resolve_uses_full_tuple_route_lookup") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    let a = t.host("a");
    // Main table: 203.0.113.0/24 via c (eth1); for source 192.0.2.1 table 100: via b (eth0).
    sh(
        a,
        &["route", "add", "203.0.113.0/24", "via", "198.51.100.3"],
    );
    sh(
        a,
        &[
            "route",
            "add",
            "203.0.113.0/24",
            "via",
            "192.0.2.2",
            "table",
            "100",
        ],
    );
    sh(a, &["rule", "add", "from", "192.0.2.1", "table", "100"]);
    let (mac_b, mac_c) = (mac_of(t.host("b"), "eth0"), mac_of(t.host("c"), "eth0"));
    with_resolver(a, |r| {
        wait_running(r, "eth0");
        wait_running(r, "eth1");
        let dst = sip("203.0.113.5");
        let x = r.resolve_addr(None, &dst, None, T).unwrap();
        assert_eq!(x.netdev.name, "eth1");
        assert_eq!(x.gateway, Some(ip("198.51.100.3")));
        assert_eq!(x.next_hop, ip("198.51.100.3"));
        assert_eq!(x.src, ip("198.51.100.1"));
        assert_eq!(x.dmac, Some(mac_c));
        assert_eq!(x.smac, link(r, "eth1").mac.unwrap());
        assert_eq!(x.sgid, Gid::from_ip(ip("198.51.100.1")));
        assert_eq!(x.dgid.to_string(), "::ffff:203.0.113.5");
        assert!(!x.loopback);
        // The source is part of the lookup: policy routing sends it out of eth0.
        let y = r
            .resolve_addr(Some(&sip("192.0.2.1")), &dst, None, T)
            .unwrap();
        assert_eq!(y.netdev.name, "eth0");
        assert_eq!(y.gateway, Some(ip("192.0.2.2")));
        assert_eq!(y.src, ip("192.0.2.1"));
        assert_eq!(y.dmac, Some(mac_b));
        // A direct IPv6 route: no gateway, the peer is the next hop.
        let z = r
            .resolve_addr(None, &sip("2001:db8:2::3"), None, T)
            .unwrap();
        assert_eq!(z.netdev.name, "eth1");
        assert_eq!(z.gateway, None);
        assert_eq!(z.next_hop, ip("2001:db8:2::3"));
        assert_eq!(z.src, ip("2001:db8:2::1"));
        assert_eq!(z.dgid, Gid::from_ip(ip("2001:db8:2::3")));
        assert_eq!(z.dmac, Some(mac_c));
        // A source that is not ours.
        let e = r
            .resolve_addr(Some(&sip("192.0.2.2")), &dst, None, T)
            .unwrap_err();
        assert_eq!(e.errno(), libc::EADDRNOTAVAIL, "{e}");
        // Families must match.
        let e = r
            .resolve_addr(Some(&sip("2001:db8:1::1")), &dst, None, T)
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        // No route at all.
        let e = r
            .resolve_addr(None, &sip("198.18.0.1"), None, T)
            .unwrap_err();
        assert_eq!(e.errno(), libc::ENETUNREACH, "{e}");
    });
}

/// Seed 001: `ip route get x from y` answers `local x dev lo`; the connection is a loopback
/// one, honoured: the device is the bound one if bound, else the one holding x.
#[test]
fn local_route_through_lo_is_loopback_seed_001() {
    if !require_root("local_route_through_lo_is_loopback_seed_001") {
        return;
    }
    let t = topologies::local_route_via_lo().unwrap();
    with_resolver(t.host("a"), |r| {
        let (eth0, eth1) = (link(r, "eth0"), link(r, "eth1"));
        for (x, y) in [
            ("192.0.2.11", "198.51.100.1"),
            ("2001:db8:1::11", "2001:db8:2::1"),
        ] {
            // Not bound: the device holding the destination (eth0), no neighbour needed.
            let a = r
                .resolve_addr(Some(&sip(y)), &sip(x), None, T)
                .unwrap_or_else(|e| panic!("{x} from {y}: {e}"));
            assert!(a.loopback, "{x} from {y}");
            assert_eq!(a.netdev.index, eth0.index);
            assert_eq!(a.src, ip(y));
            assert_eq!(a.src_netdev, eth1.index);
            assert_eq!(a.dmac, eth0.mac);
            assert_eq!(a.gateway, None);
            assert_eq!(a.dgid, Gid::from_ip(ip(x)));
            // Bound to y's netdev (eth1): the bind is honoured.
            let b = r.bind(&sip(y)).unwrap();
            let bound = b.netdev.as_ref().map(|n| n.index);
            assert_eq!(bound, Some(eth1.index));
            let a = r.resolve_addr(None, &sip(x), bound, T).unwrap();
            assert!(a.loopback);
            assert_eq!(a.netdev.index, eth1.index);
            assert_eq!(a.src, ip(y));
            assert_eq!(a.dmac, eth1.mac);
            // No source, not bound: the destination is its own source.
            let a = r.resolve_addr(None, &sip(x), None, T).unwrap();
            assert_eq!((a.netdev.index, a.src), (eth0.index, ip(x)));
            // The path is computed as for any other id.
            let p = r.resolve_route(&a, &RouteParams::default()).unwrap();
            assert!(p.loopback && !p.routed);
            assert_eq!(p.mtu, IbMtu::Mtu1024);
        }
    });
}

#[test]
fn bound_netdev_without_route_fails_fast_ehostunreach() {
    if !require_root("bound_netdev_without_route_fails_fast_ehostunreach") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    with_resolver(t.host("a"), |r| {
        for (bind, dst) in [
            ("192.0.2.1", "198.51.100.3"),
            ("2001:db8:1::1", "2001:db8:2::3"),
        ] {
            let b = r.bind(&sip(bind)).unwrap();
            let bound = b.netdev.map(|n| n.index);
            // EHOSTUNREACH, not ETIMEDOUT at the 5 s deadline: it failed without waiting
            let e = r
                .resolve_addr(None, &sip(dst), bound, Duration::from_secs(5))
                .unwrap_err();
            assert_eq!(e.errno(), libc::EHOSTUNREACH, "{dst}: {e}");
        }
    });
}

/// Two NICs on one subnet (topology 3): the bound netdev constrains the lookup, so each
/// bound id goes out of its own NIC to the peer behind it.
#[test]
fn bound_netdev_constrains_lookup_two_nics_same_subnet() {
    if !require_root("bound_netdev_constrains_lookup_two_nics_same_subnet") {
        return;
    }
    let t = topologies::two_nics_same_subnet().unwrap();
    let (mac_b, mac_c) = (mac_of(t.host("b"), "eth0"), mac_of(t.host("c"), "eth0"));
    with_resolver(t.host("a"), |r| {
        wait_running(r, "eth0");
        wait_running(r, "eth1");
        for (bind, dst, dev, mac) in [
            ("192.0.2.11", "192.0.2.3", "eth1", mac_c),
            ("192.0.2.1", "192.0.2.2", "eth0", mac_b),
            ("2001:db8:1::11", "2001:db8:1::3", "eth1", mac_c),
        ] {
            let b = r.bind(&sip(bind)).unwrap();
            let nd = b.netdev.unwrap();
            assert_eq!(nd.name, dev);
            let a = r
                .resolve_addr(Some(&sip(bind)), &sip(dst), Some(nd.index), T)
                .unwrap();
            assert_eq!(a.netdev.name, dev, "{bind} -> {dst}");
            assert_eq!((a.src, a.dmac), (ip(bind), Some(mac)), "{bind} -> {dst}");
        }
    });
}

#[test]
fn loopback_127_and_ipv6_1_resolve_through_lo() {
    if !require_root("loopback_127_and_ipv6_1_resolve_through_lo") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    with_resolver(t.host("a"), |r| {
        let lo = link(r, "lo");
        for (dst, src) in [
            ("127.0.0.1", "127.0.0.1"),
            ("127.0.0.5", "127.0.0.5"),
            ("::1", "::1"),
            ("0.0.0.0", "127.0.0.1"),
            ("::", "::1"),
        ] {
            let a = r.resolve_addr(None, &sip(dst), None, T).unwrap();
            assert_eq!(a.netdev.index, lo.index, "{dst}");
            assert!(a.loopback && a.netdev.loopback, "{dst}");
            assert_eq!(a.src, ip(src), "{dst}");
            assert_eq!(a.dmac, Some(MacAddr::default()));
            let p = r
                .resolve_route(
                    &a,
                    &RouteParams {
                        src_port: 40000,
                        dst_port: 7471,
                        ..Default::default()
                    },
                )
                .unwrap();
            assert_eq!(p.mtu, IbMtu::Mtu4096, "lo MTU 65536");
            assert_eq!(p.sgid, p.dgid, "{dst}");
        }
        // A server on 127.0.0.1 and a client from 127.0.0.2 share the device on lo.
        let a = r
            .resolve_addr(Some(&sip("127.0.0.2")), &sip("127.0.0.1"), None, T)
            .unwrap();
        assert_eq!((a.netdev.index, a.src), (lo.index, ip("127.0.0.2")));
        // Bound to eth0: the bound device is kept even for 127.0.0.1.
        let eth0 = index(r, "eth0");
        let a = r
            .resolve_addr(None, &sip("127.0.0.1"), Some(eth0), T)
            .unwrap();
        assert!(a.loopback);
        assert_eq!(a.netdev.index, eth0);
    });
}

#[test]
fn link_local_without_scope_is_einval() {
    if !require_root("link_local_without_scope_is_einval") {
        return;
    }
    let t = topologies::link_local_only().unwrap();
    with_resolver(t.host("a"), |r| {
        // EINVAL, not ETIMEDOUT: refused without waiting for anything
        let e = r.resolve_addr(None, &sip("fe80::2"), None, T).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        let e = r
            .resolve_addr(Some(&sip("fe80::1")), &sip("fe80::2%eth0"), None, T)
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        // The scope names no netdev.
        let e = r
            .resolve_addr(None, &sip("fe80::2%nosuch"), None, T)
            .unwrap_err();
        assert_eq!(e.errno(), libc::ENODEV, "{e}");
        // Scopes that disagree.
        let lo = index(r, "lo");
        let e = r
            .resolve_addr(
                None,
                &sip(&format!("fe80::2%{lo}")),
                Some(index(r, "eth0")),
                T,
            )
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
    });
}

#[test]
fn link_local_scope_selects_the_netdev() {
    if !require_root("link_local_scope_selects_the_netdev") {
        return;
    }
    let t = topologies::link_local_only().unwrap();
    let mac_b = mac_of(t.host("b"), "eth0");
    with_resolver(t.host("a"), |r| {
        wait_running(r, "eth0");
        let eth0 = index(r, "eth0");
        let a = r.resolve_addr(None, &sip("fe80::2%eth0"), None, T).unwrap();
        assert_eq!(a.netdev.index, eth0);
        assert_eq!(a.src, ip("fe80::1"));
        assert_eq!((a.src_scope, a.dst_scope), (Some(eth0), Some(eth0)));
        assert_eq!(a.dmac, Some(mac_b));
        // With a scoped link-local source too.
        let a = r
            .resolve_addr(
                Some(&sip("fe80::1%eth0")),
                &sip(&format!("fe80::2%{eth0}")),
                None,
                T,
            )
            .unwrap();
        assert_eq!(a.netdev.index, eth0);
        // Our own link-local address on that netdev: a loopback connection.
        let a = r.resolve_addr(None, &sip("fe80::1%eth0"), None, T).unwrap();
        assert!(a.loopback);
    });
}

#[test]
fn neighbour_timeout_is_etimedout() {
    if !require_root("neighbour_timeout_is_etimedout") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    with_resolver(t.host("a"), |r| {
        wait_running(r, "eth0");
        let t0 = Instant::now();
        let e = r
            .resolve_addr(None, &sip("192.0.2.99"), None, Duration::from_millis(300))
            .unwrap_err();
        assert_eq!(e.errno(), libc::ETIMEDOUT, "{e}");
        // it waited for its deadline (no upper bound: timings belong to benchmarks)
        let el = t0.elapsed();
        assert!(el >= Duration::from_millis(300), "{el:?}");
    });
}

#[test]
fn resolve_route_computes_roce_path_locally() {
    if !require_root("resolve_route_computes_roce_path_locally") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    let mac_b = mac_of(t.host("b"), "eth0");
    with_resolver(t.host("a"), |r| {
        wait_running(r, "eth0");
        let eth0 = link(r, "eth0");
        let a = r
            .resolve_addr(None, &sip("192.0.2.2"), Some(eth0.index), T)
            .unwrap();
        let params = RouteParams {
            src_port: 40000,
            dst_port: 7471,
            tos: 0x20,
            ipv6_flow_label: Some(0x12345),
            ack_timeout: Some(14),
        };
        let p = r.resolve_route(&a, &params).unwrap();
        assert_eq!(p.sgid.to_string(), "::ffff:192.0.2.1");
        assert_eq!(p.dgid.to_string(), "::ffff:192.0.2.2");
        assert_eq!((p.smac, p.dmac), (eth0.mac.unwrap(), Some(mac_b)));
        assert_eq!(p.mtu, IbMtu::Mtu1024, "veth MTU 1500");
        assert_eq!(p.traffic_class, 0x20);
        assert_eq!(p.packet_lifetime, 13);
        assert_eq!(p.hop_limit, 64);
        // IPv4: the flow label comes from the ports, never from an IPv6 flow label.
        let fl = (40000 * 31 + 7471) & 0xF_FFFF;
        assert_eq!(p.flow_label, fl);
        assert_eq!(
            p.udp_sport,
            rdma_soft::io::flow::flow_label_to_udp_sport(fl)
        );
        assert!(!p.routed);
        // IPv6: a given flow label wins.
        let a6 = r
            .resolve_addr(None, &sip("2001:db8:1::2"), None, T)
            .unwrap();
        let p6 = r.resolve_route(&a6, &params).unwrap();
        assert_eq!(p6.flow_label, 0x12345);
        assert_eq!(
            p6.udp_sport,
            0xC000 | ((0x12345 & 0x3FFF) ^ (0x12345 >> 14)) as u16
        );
        let p6 = r.resolve_route(&a6, &RouteParams::default()).unwrap();
        assert_eq!(p6.packet_lifetime, 16);
        // A smaller netdev MTU lowers the path MTU; a netdev that is gone is ENODEV.
        sh(t.host("a"), &["link", "set", "eth0", "mtu", "1280"]);
        assert_eq!(r.resolve_route(&a6, &params).unwrap().mtu, IbMtu::Mtu1024);
        sh(t.host("a"), &["link", "set", "eth0", "mtu", "1100"]);
        assert_eq!(r.resolve_route(&a6, &params).unwrap().mtu, IbMtu::Mtu512);
        sh(t.host("a"), &["link", "del", "eth0"]);
        assert_eq!(
            r.resolve_route(&a, &params).unwrap_err().errno(),
            libc::ENODEV
        );
    });
}

/// Topology 6: a peer behind a router; the gateway is the next hop and the path is routed.
#[test]
fn routed_path_through_gateway_resolves_gateway_mac() {
    if !require_root("routed_path_through_gateway_resolves_gateway_mac") {
        return;
    }
    let t = topologies::router_between_subnets().unwrap();
    let mac_r = mac_of(t.host("r"), "eth0");
    with_resolver(t.host("a"), |r| {
        wait_running(r, "eth0");
        for (dst, gw, src) in [
            ("198.51.100.2", "192.0.2.254", "192.0.2.1"),
            ("2001:db8:2::2", "2001:db8:1::fe", "2001:db8:1::1"),
        ] {
            let a = r.resolve_addr(None, &sip(dst), None, T).unwrap();
            assert_eq!(a.gateway, Some(ip(gw)));
            assert_eq!(a.next_hop, ip(gw));
            assert_eq!(a.src, ip(src));
            assert_eq!(a.dmac, Some(mac_r), "{dst}");
            assert_eq!(a.dgid, Gid::from_ip(ip(dst)));
            let p = r.resolve_route(&a, &RouteParams::default()).unwrap();
            assert!(p.routed && !p.loopback);
        }
    });
}
