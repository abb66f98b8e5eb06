//! DESIGN.md rows "Is an IP address a property of the host or of a device?" and "What does
//! bind do?", in network-namespace hosts (root; SKIPPED otherwise).

mod support_hosts;

use rdma_testhosts::{require_root, topologies};
use rdmacm::host::Gid;
use support_hosts::*;

/// Row 1: addresses belong to the host; a device's GID table holds its netdev's addresses,
/// IPv4 as IPv4-mapped IPv6, IPv6 including link-local.
#[test]
fn gid_table_holds_netdev_addresses_ipv4_mapped() {
    if !require_root("gid_table_holds_netdev_addresses_ipv4_mapped") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    with_resolver(t.host("a"), |r| {
        let eth0 = r.gid_table(index(r, "eth0")).unwrap();
        let gids: Vec<String> = eth0.iter().map(|g| g.gid.to_string()).collect();
        for want in ["::ffff:192.0.2.1", "2001:db8:1::1", "fe80::1"] {
            assert!(gids.iter().any(|g| g == want), "{want} not in {gids:?}");
        }
        // eth1's addresses are eth1's device's, not eth0's.
        assert!(!gids.iter().any(|g| g == "::ffff:198.51.100.1"), "{gids:?}");
        let lo = r.gid_table(index(r, "lo")).unwrap();
        assert!(lo.iter().any(|g| g.gid == Gid::from_ip(ip("127.0.0.1"))));
        assert!(lo.iter().any(|g| g.gid == Gid::from_ip(ip("::1"))));
        assert_eq!(r.gid_table(9999).unwrap_err().errno(), libc::ENODEV);
    });
}

#[test]
fn bind_specific_address_binds_its_netdev() {
    if !require_root("bind_specific_address_binds_its_netdev") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    with_resolver(t.host("a"), |r| {
        for (addr, dev) in [
            ("192.0.2.1", "eth0"),
            ("2001:db8:1::1", "eth0"),
            ("198.51.100.1", "eth1"),
            ("2001:db8:2::1", "eth1"),
        ] {
            let b = r.bind(&sip(addr)).unwrap();
            let nd = b.netdev.unwrap_or_else(|| panic!("{addr} bound no netdev"));
            assert_eq!(nd.name, dev, "{addr}");
            assert_eq!(nd.index, index(r, dev));
            assert_eq!(b.addr, ip(addr));
        }
    });
}

#[test]
fn bind_address_held_by_no_netdev_is_eaddrnotavail() {
    if !require_root("bind_address_held_by_no_netdev_is_eaddrnotavail") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    with_resolver(t.host("a"), |r| {
        // b's address, an address of no one, an IPv6 of b.
        for addr in ["192.0.2.2", "203.0.113.7", "2001:db8:1::2"] {
            let e = r.bind(&sip(addr)).unwrap_err();
            assert_eq!(e.errno(), libc::EADDRNOTAVAIL, "{addr}: {e}");
        }
        assert_eq!(r.bind(&sip("224.0.0.1")).unwrap_err().errno(), libc::EINVAL);
    });
}

#[test]
fn wildcard_bind_binds_no_device() {
    if !require_root("wildcard_bind_binds_no_device") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    with_resolver(t.host("a"), |r| {
        for addr in ["0.0.0.0", "::"] {
            let b = r.bind(&sip(addr)).unwrap();
            assert!(b.is_wildcard());
            assert_eq!(b.netdev, None, "{addr}");
        }
    });
}

/// Deviation from Linux (which treats loopback as "any"): 127.0.0.0/8 and ::1 bind the
/// device on `lo`.
#[test]
fn loopback_bind_binds_the_device_on_lo() {
    if !require_root("loopback_bind_binds_the_device_on_lo") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    with_resolver(t.host("a"), |r| {
        for addr in ["127.0.0.1", "127.0.0.2", "::1"] {
            let b = r.bind(&sip(addr)).unwrap();
            let nd = b.netdev.unwrap_or_else(|| panic!("{addr}: no device"));
            assert_eq!(nd.name, "lo", "{addr}");
            assert!(nd.loopback);
        }
    });
}

#[test]
fn link_local_bind_needs_scope_and_scope_selects_netdev() {
    if !require_root("link_local_bind_needs_scope_and_scope_selects_netdev") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    with_resolver(t.host("a"), |r| {
        let (eth0, eth1) = (index(r, "eth0"), index(r, "eth1"));
        assert_eq!(r.bind(&sip("fe80::1")).unwrap_err().errno(), libc::EINVAL);
        let b = r.bind(&sip("fe80::1%eth0")).unwrap();
        assert_eq!(b.netdev.map(|n| n.index), Some(eth0));
        assert_eq!(b.scope, Some(eth0));
        let b = r.bind(&sip(&format!("fe80::11%{eth1}"))).unwrap();
        assert_eq!(b.netdev.map(|n| n.name), Some("eth1".to_string()));
        // The scope's netdev does not hold the address.
        let e = r.bind(&sip("fe80::1%eth1")).unwrap_err();
        assert_eq!(e.errno(), libc::EADDRNOTAVAIL, "{e}");
        // The scope names no netdev.
        assert_eq!(
            r.bind(&sip("fe80::1%nosuch")).unwrap_err().errno(),
            libc::ENODEV
        );
        assert_eq!(
            r.bind(&sip("fe80::1%9999")).unwrap_err().errno(),
            libc::ENODEV
        );
    });
}

/// A listener on a specific address only gets requests for that address; a wildcard
/// listener gets them from every device.
#[test]
fn specific_listener_gets_only_its_address_wildcard_gets_all() {
    if !require_root("specific_listener_gets_only_its_address_wildcard_gets_all") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    with_resolver(t.host("a"), |r| {
        let (eth0, eth1) = (index(r, "eth0"), index(r, "eth1"));
        let specific = r.bind(&sip("192.0.2.1")).unwrap();
        assert!(specific.accepts(eth0, ip("192.0.2.1"), true));
        assert!(!specific.accepts(eth1, ip("198.51.100.1"), true));
        let wild4 = r.bind(&sip("0.0.0.0")).unwrap();
        assert!(wild4.accepts(eth0, ip("192.0.2.1"), true));
        assert!(wild4.accepts(eth1, ip("198.51.100.1"), true));
        assert!(!wild4.accepts(eth1, ip("2001:db8:2::1"), true));
        let wild6 = r.bind(&sip("::")).unwrap();
        assert!(wild6.accepts(eth1, ip("198.51.100.1"), false));
        assert!(!wild6.accepts(eth1, ip("198.51.100.1"), true));
        let ll = r.bind(&sip("fe80::1%eth0")).unwrap();
        assert!(ll.accepts(eth0, ip("fe80::1"), true));
        assert!(!ll.accepts(eth1, ip("fe80::1"), true));
    });
}
