//! DESIGN.md row "Passive side", in network-namespace hosts (root; SKIPPED otherwise).

mod support_hosts;

use rdma_testhosts::{require_root, topologies};
use rdmacm::cm::RejectCause;
use rdmacm::Error;
use support_hosts::*;

#[test]
fn passive_side_path_from_arrival_netdev_without_neighbour() {
    if !require_root("passive_side_path_from_arrival_netdev_without_neighbour") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    with_resolver(t.host("a"), |r| {
        let eth0 = link(r, "eth0");
        for (local, peer) in [
            ("192.0.2.1", "192.0.2.2"),
            ("2001:db8:1::1", "2001:db8:1::2"),
        ] {
            // No traffic has flowed: the neighbour table has no entry for the peer.
            let n = r.block_on(r.resolver().view().neighbour(eth0.index, ip(peer)));
            assert!(n.unwrap().is_none_or(|n| !n.state.is_valid()));
            let p = r.accept_path(eth0.index, ip(local), ip(peer)).unwrap();
            assert_eq!(p.netdev.index, eth0.index);
            assert_eq!((p.src, p.dst), (ip(local), ip(peer)));
            assert_eq!(p.dmac, None, "no neighbour needed nor made up");
            assert_eq!(p.smac, eth0.mac.unwrap());
            assert!(!p.loopback);
            // The route can still be computed (dmac unknown).
            let route = r.resolve_route(&p, &Default::default()).unwrap();
            assert_eq!(route.dmac, None);
        }
        // A request for an address that is not ours is refused.
        let e = r
            .accept_path(eth0.index, ip("192.0.2.77"), ip("192.0.2.2"))
            .unwrap_err();
        assert!(
            matches!(e, Error::Rejected(RejectCause::NotOurAddress)),
            "{e}"
        );
    });
}

#[test]
fn passive_side_rejects_arrival_netdev_down() {
    if !require_root("passive_side_rejects_arrival_netdev_down") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    sh(t.host("a"), &["link", "set", "eth0", "down"]);
    with_resolver(t.host("a"), |r| {
        let eth0 = index(r, "eth0");
        let e = r
            .accept_path(eth0, ip("192.0.2.1"), ip("192.0.2.2"))
            .unwrap_err();
        assert!(
            matches!(e, Error::Rejected(RejectCause::ArrivalNetdevDown)),
            "{e}"
        );
        assert_eq!(e.errno(), libc::EHOSTUNREACH);
        assert_eq!(RejectCause::REJ_REASON, 28);
        // A netdev that is gone.
        let e = r
            .accept_path(9999, ip("192.0.2.1"), ip("192.0.2.2"))
            .unwrap_err();
        assert!(
            matches!(e, Error::Rejected(RejectCause::ArrivalNetdevGone)),
            "{e}"
        );
    });
}

#[test]
fn passive_side_rejects_not_on_reverse_route() {
    if !require_root("passive_side_rejects_not_on_reverse_route") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    with_resolver(t.host("a"), |r| {
        let (eth0, eth1) = (index(r, "eth0"), index(r, "eth1"));
        // A request from b (on eth0's subnet) arriving on eth1.
        for (local, peer) in [
            ("192.0.2.1", "192.0.2.2"),
            ("2001:db8:1::1", "2001:db8:1::2"),
        ] {
            let e = r.accept_path(eth1, ip(local), ip(peer)).unwrap_err();
            assert!(
                matches!(e, Error::Rejected(RejectCause::NotOnReverseRoute)),
                "{peer}: {e}"
            );
            assert_eq!(e.errno(), libc::EHOSTUNREACH);
            assert!(r.accept_path(eth0, ip(local), ip(peer)).is_ok());
        }
    });
}

/// A loopback connection (seed 001) is accepted on the passive side too (Linux rejects
/// loopback addresses there).
#[test]
fn passive_side_accepts_loopback_peer() {
    if !require_root("passive_side_accepts_loopback_peer") {
        return;
    }
    let t = topologies::local_route_via_lo().unwrap();
    with_resolver(t.host("a"), |r| {
        let (eth0, lo) = (index(r, "eth0"), index(r, "lo"));
        let p = r
            .accept_path(eth0, ip("192.0.2.11"), ip("198.51.100.1"))
            .unwrap();
        assert!(p.loopback);
        assert_eq!(p.netdev.index, eth0);
        let p = r.accept_path(lo, ip("127.0.0.1"), ip("127.0.0.2")).unwrap();
        assert!(p.loopback);
        let p = r.accept_path(lo, ip("::1"), ip("::1")).unwrap();
        assert_eq!(p.netdev.index, lo);
    });
}
