//! DESIGN.md row "Routing changes under a connection": ADDR_CHANGE / DEVICE_REMOVAL hints,
//! nothing torn down. In network-namespace hosts (root; SKIPPED otherwise).
//!
//! Neighbours are installed as permanent entries so no test waits for ARP.

mod support_hosts;

use std::time::Duration;

use rdma_testhosts::{require_root, topologies};
use rdmacm::host::{ChangeReason, MacAddr, Notification};
use support_hosts::*;

const T: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(5);

fn permanent_neighbour(h: &rdma_testhosts::Host, ip: &str, mac: MacAddr, dev: &str) {
    sh(
        h,
        &[
            "neigh",
            "replace",
            ip,
            "lladdr",
            &mac.to_string(),
            "dev",
            dev,
            "nud",
            "permanent",
        ],
    );
}

#[test]
fn addr_change_on_route_replace() {
    if !require_root("addr_change_on_route_replace") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    let a = t.host("a");
    sh(a, &["route", "add", "203.0.113.0/24", "via", "192.0.2.2"]);
    permanent_neighbour(a, "192.0.2.2", mac_of(t.host("b"), "eth0"), "eth0");
    with_resolver(a, |r| {
        let (eth0, eth1) = (index(r, "eth0"), index(r, "eth1"));
        let x = r.resolve_addr(None, &sip("203.0.113.5"), None, T).unwrap();
        assert_eq!((x.netdev.index, x.gateway), (eth0, Some(ip("192.0.2.2"))));
        let mut w = r.watcher().unwrap();
        w.watch(1, &x);
        let key = w.key(1).cloned().unwrap();
        // Changes that do not concern the id: nothing.
        sh(
            a,
            &["route", "add", "203.0.113.128/25", "via", "198.51.100.3"],
        );
        sh(
            a,
            &["route", "add", "2001:db8:99::/64", "via", "2001:db8:2::3"],
        );
        let quiet = drain(r, &mut w, Duration::from_millis(300));
        assert!(quiet.is_empty(), "{quiet:?}");
        // The route to the peer moves to eth1 / another gateway.
        sh(
            a,
            &["route", "replace", "203.0.113.0/24", "via", "198.51.100.3"],
        );
        let seen = wait_for(r, &mut w, WAIT, |n| {
            *n == Notification::AddrChange {
                id: 1,
                reason: ChangeReason::RouteChanged {
                    netdev: Some(eth1),
                    gateway: Some(ip("198.51.100.3")),
                },
            }
        });
        assert_eq!(seen.len(), 1, "{seen:?}");
        // Sticky: the id keeps its key (device and path); nothing is torn down.
        assert_eq!(w.key(1), Some(&key));
        assert_eq!(w.len(), 1);
        // And back: reported again.
        sh(
            a,
            &["route", "replace", "203.0.113.0/24", "via", "192.0.2.2"],
        );
        wait_for(
            r,
            &mut w,
            WAIT,
            |n| matches!(n, Notification::AddrChange { id: 1, reason: ChangeReason::RouteChanged { netdev: Some(d), .. } } if *d == eth0),
        );
        // The route goes away.
        sh(a, &["route", "del", "203.0.113.0/24"]);
        wait_for(r, &mut w, WAIT, |n| {
            matches!(
                n,
                Notification::AddrChange {
                    id: 1,
                    reason: ChangeReason::RouteChanged { netdev: None, .. }
                }
            )
        });
    });
}

#[test]
fn addr_change_on_neighbour_mac_change() {
    if !require_root("addr_change_on_neighbour_mac_change") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    let a = t.host("a");
    let mac_b = mac_of(t.host("b"), "eth0");
    permanent_neighbour(a, "192.0.2.2", mac_b, "eth0");
    with_resolver(a, |r| {
        let x = r.resolve_addr(None, &sip("192.0.2.2"), None, T).unwrap();
        assert_eq!(x.dmac, Some(mac_b));
        let mut w = r.watcher().unwrap();
        w.watch(7, &x);
        let new = MacAddr([0x02, 0, 0, 0, 0, 0x99]);
        permanent_neighbour(a, "192.0.2.2", new, "eth0");
        let seen = wait_for(r, &mut w, WAIT, |n| {
            *n == Notification::AddrChange {
                id: 7,
                reason: ChangeReason::NeighbourMacChanged { old: mac_b, new },
            }
        });
        assert_eq!(seen.len(), 1, "{seen:?}");
        // The same MAC again is no change.
        permanent_neighbour(a, "192.0.2.2", new, "eth0");
        let quiet = drain(r, &mut w, Duration::from_millis(300));
        assert!(quiet.is_empty(), "{quiet:?}");
    });
}

#[test]
fn addr_change_when_source_address_removed() {
    if !require_root("addr_change_when_source_address_removed") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    let a = t.host("a");
    permanent_neighbour(a, "192.0.2.2", mac_of(t.host("b"), "eth0"), "eth0");
    with_resolver(a, |r| {
        let x = r.resolve_addr(None, &sip("192.0.2.2"), None, T).unwrap();
        assert_eq!(x.src, ip("192.0.2.1"));
        let mut w = r.watcher().unwrap();
        w.watch(3, &x);
        sh(a, &["addr", "del", "192.0.2.1/24", "dev", "eth0"]);
        wait_for(r, &mut w, WAIT, |n| {
            *n == Notification::AddrChange {
                id: 3,
                reason: ChangeReason::SourceAddressRemoved,
            }
        });
    });
}

#[test]
fn addr_change_when_netdev_goes_down() {
    if !require_root("addr_change_when_netdev_goes_down") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    let a = t.host("a");
    permanent_neighbour(a, "192.0.2.2", mac_of(t.host("b"), "eth0"), "eth0");
    with_resolver(a, |r| {
        wait_running(r, "eth0");
        let x = r.resolve_addr(None, &sip("192.0.2.2"), None, T).unwrap();
        let mut w = r.watcher().unwrap();
        w.watch(4, &x);
        sh(a, &["link", "set", "eth0", "down"]);
        let seen = wait_for(r, &mut w, WAIT, |n| {
            *n == Notification::AddrChange {
                id: 4,
                reason: ChangeReason::NetdevDown,
            }
        });
        assert!(!seen
            .iter()
            .any(|n| matches!(n, Notification::DeviceRemoval { .. })));
    });
}

/// Linux's one ADDR_CHANGE case (a bond fail-over changes the bound netdev's MAC) is
/// reported too.
#[test]
fn addr_change_when_local_mac_changes() {
    if !require_root("addr_change_when_local_mac_changes") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    let a = t.host("a");
    permanent_neighbour(a, "192.0.2.2", mac_of(t.host("b"), "eth0"), "eth0");
    with_resolver(a, |r| {
        let x = r.resolve_addr(None, &sip("192.0.2.2"), None, T).unwrap();
        let mut w = r.watcher().unwrap();
        w.watch(5, &x);
        let new = MacAddr([0x02, 0, 0, 0, 0, 0x42]);
        sh(a, &["link", "set", "eth0", "address", &new.to_string()]);
        wait_for(r, &mut w, WAIT, |n| {
            *n == Notification::AddrChange {
                id: 5,
                reason: ChangeReason::LocalMacChanged { old: x.smac, new },
            }
        });
    });
}

#[test]
fn device_removal_when_netdev_deleted() {
    if !require_root("device_removal_when_netdev_deleted") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    let a = t.host("a");
    permanent_neighbour(a, "192.0.2.2", mac_of(t.host("b"), "eth0"), "eth0");
    permanent_neighbour(a, "198.51.100.3", mac_of(t.host("c"), "eth0"), "eth1");
    with_resolver(a, |r| {
        let eth1 = index(r, "eth1");
        let on_eth1 = r.resolve_addr(None, &sip("198.51.100.3"), None, T).unwrap();
        let on_eth0 = r.resolve_addr(None, &sip("192.0.2.2"), None, T).unwrap();
        let mut w = r.watcher().unwrap();
        w.watch(1, &on_eth1);
        w.watch(2, &on_eth0);
        sh(a, &["link", "del", "eth1"]);
        let seen = wait_for(r, &mut w, WAIT, |n| {
            *n == Notification::DeviceRemoval {
                id: 1,
                netdev: eth1,
            }
        });
        let later = drain(r, &mut w, Duration::from_millis(300));
        let all: Vec<_> = seen.iter().chain(&later).collect();
        assert!(all.iter().all(|n| n.id() == 1), "id 2 untouched: {all:?}");
        assert_eq!(
            all.iter()
                .filter(|n| matches!(n, Notification::DeviceRemoval { .. }))
                .count(),
            1,
            "{all:?}"
        );
        // Still watched: removal is reported, not acted on.
        assert_eq!(w.len(), 2);
        assert!(w.unwatch(1));
    });
}

/// The full re-read done after lost notifications (overrun) finds what changed.
#[test]
fn recheck_after_lost_notifications_finds_changes() {
    if !require_root("recheck_after_lost_notifications_finds_changes") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    let a = t.host("a");
    let mac_b = mac_of(t.host("b"), "eth0");
    permanent_neighbour(a, "192.0.2.2", mac_b, "eth0");
    with_resolver(a, |r| {
        let x = r.resolve_addr(None, &sip("192.0.2.2"), None, T).unwrap();
        let mut w = r.watcher().unwrap();
        // As if the MAC, the route and the netdev had changed while nobody listened.
        let mut stale = x.clone();
        let old = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
        stale.dmac = Some(old);
        w.watch(1, &stale);
        let mut gone = x.clone();
        gone.netdev.index = 9999;
        w.watch(2, &gone);
        let mut moved = x.clone();
        moved.gateway = Some(ip("192.0.2.254"));
        w.watch(3, &moved);
        r.block_on(w.recheck()).unwrap();
        let seen = drain(r, &mut w, Duration::from_millis(200));
        let want = [
            Notification::AddrChange {
                id: 1,
                reason: ChangeReason::NeighbourMacChanged { old, new: mac_b },
            },
            Notification::DeviceRemoval {
                id: 2,
                netdev: 9999,
            },
            Notification::AddrChange {
                id: 3,
                reason: ChangeReason::RouteChanged {
                    netdev: Some(x.netdev.index),
                    gateway: None,
                },
            },
        ];
        for n in &want {
            assert!(seen.contains(n), "{n:?} not in {seen:?}");
        }
        assert_eq!(seen.len(), want.len(), "{seen:?}");
    });
}

/// Only a change of the id's own path gives ADDR_CHANGE. Reported against Linux rxe over
/// link-local: ADDR_CHANGE during connection setup after an unrelated address was added to
/// the netdev and the neighbour entry went from incomplete to reachable. For an IPv4 id and a
/// link-local IPv6 id (neighbours learnt by the kernel, not permanent): unrelated addresses
/// added and removed, the neighbour flushed and re-learnt with the same MAC, an unrelated
/// route, the link's MTU changed: nothing. Then a real change of the path (the source
/// address removed) is reported, so the watcher was live throughout.
#[test]
fn no_addr_change_for_changes_off_the_path() {
    if !require_root("no_addr_change_for_changes_off_the_path") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    let a = t.host("a");
    with_resolver(a, |r| {
        wait_running(r, "eth0");
        let eth0 = index(r, "eth0");
        let v4 = r.resolve_addr(None, &sip("192.0.2.2"), None, T).unwrap();
        let ll = r
            .resolve_addr(None, &sip(&format!("fe80::2%{eth0}")), None, T)
            .unwrap();
        assert!(v4.dmac.is_some() && ll.dmac.is_some(), "{v4:?} {ll:?}");
        let mut w = r.watcher().unwrap();
        w.watch(1, &v4);
        w.watch(2, &ll);
        // unrelated addresses on the id's netdev, added and removed
        sh(a, &["addr", "add", "192.0.2.77/24", "dev", "eth0"]);
        sh(
            a,
            &["addr", "add", "2001:db8:1::77/64", "dev", "eth0", "nodad"],
        );
        sh(a, &["addr", "add", "fe80::77/64", "dev", "eth0", "nodad"]);
        sh(a, &["addr", "del", "192.0.2.77/24", "dev", "eth0"]);
        sh(a, &["addr", "del", "2001:db8:1::77/64", "dev", "eth0"]);
        // the neighbours go away and come back, incomplete then reachable, same MACs
        sh(a, &["neigh", "flush", "dev", "eth0"]);
        r.resolve_addr(None, &sip("192.0.2.2"), None, T).unwrap();
        r.resolve_addr(None, &sip(&format!("fe80::2%{eth0}")), None, T)
            .unwrap();
        // an unrelated route, and the link's MTU
        sh(a, &["route", "add", "203.0.113.0/24", "via", "192.0.2.2"]);
        sh(a, &["link", "set", "eth0", "mtu", "1400"]);
        let quiet = drain(r, &mut w, Duration::from_millis(500));
        assert!(quiet.is_empty(), "changes off the path reported: {quiet:?}");
        // a change of the path is reported (control)
        sh(a, &["addr", "del", "192.0.2.1/24", "dev", "eth0"]);
        let seen = wait_for(r, &mut w, WAIT, |n| {
            *n == Notification::AddrChange {
                id: 1,
                reason: ChangeReason::SourceAddressRemoved,
            }
        });
        assert!(
            seen.iter().all(|n| n.id() == 1),
            "only the IPv4 id's path changed: {seen:?}"
        );
    });
}
