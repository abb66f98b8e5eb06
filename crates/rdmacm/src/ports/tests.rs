//! The bind tables against rdma_cm's rules.

use super::config::parse_port_range;
use super::*;

fn tables() -> PortTables {
    PortTables::new(PortConfig {
        ephemeral: (40000, 40009),
        privileged_below: 1024,
        may_bind_privileged: false,
    })
}

fn req(addr: &str, port: u16) -> BindRequest {
    BindRequest::new(addr.parse().unwrap(), port)
}

fn errno(r: Result<(BindHandle, u16)>) -> i32 {
    r.map(|_| 0).unwrap_or_else(|e| e.errno())
}

#[test]
fn ephemeral_ports_come_from_the_range_and_run_out() {
    let mut t = tables();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let (_, p) = t.bind(PortSpace::Tcp, &req("192.0.2.1", 0)).unwrap();
        assert!((40000..=40009).contains(&p));
        assert!(seen.insert(p), "port {p} handed out twice");
    }
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 0))),
        libc::EADDRNOTAVAIL
    );
    // Other spaces have their own tables.
    assert!(t.bind(PortSpace::Udp, &req("192.0.2.1", 0)).is_ok());
    assert!(t.bind(PortSpace::Ib, &req("192.0.2.1", 0)).is_ok());
    assert!(t.bind(PortSpace::IpoIb, &req("192.0.2.1", 0)).is_ok());
}

#[test]
fn ephemeral_skips_last_used_port_after_release() {
    let mut t = tables();
    let (mut h, mut last) = t.bind(PortSpace::Tcp, &req("192.0.2.1", 0)).unwrap();
    for _ in 0..50 {
        // Released, the port is free again, but the next pick never is the last one.
        t.release(h);
        let (h2, q) = t.bind(PortSpace::Tcp, &req("192.0.2.1", 0)).unwrap();
        assert_ne!(q, last);
        (h, last) = (h2, q);
    }
}

#[test]
fn ephemeral_range_is_read_from_proc() {
    let (lo, hi) = read_local_port_range().unwrap();
    assert!(lo <= hi);
    assert_eq!(parse_port_range("32768\t60999\n").unwrap(), (32768, 60999));
    assert!(parse_port_range("5 3").is_err());
    assert!(parse_port_range("").is_err());
    let t = PortTables::from_host();
    assert_eq!(t.config().ephemeral, (lo, hi));
}

#[test]
fn explicit_port_identical_specific_is_eaddrinuse() {
    let mut t = tables();
    t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000)).unwrap();
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000))),
        libc::EADDRINUSE
    );
}

#[test]
fn explicit_port_different_specific_coexist() {
    let mut t = tables();
    t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000)).unwrap();
    t.bind(PortSpace::Tcp, &req("192.0.2.2", 7000)).unwrap();
    t.bind(PortSpace::Tcp, &req("127.0.0.1", 7000)).unwrap();
    t.bind(PortSpace::Tcp, &req("127.0.0.2", 7000)).unwrap();
}

#[test]
fn explicit_port_any_address_conflict_is_eaddrnotavail() {
    let mut t = tables();
    t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000)).unwrap();
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("0.0.0.0", 7000))),
        libc::EADDRNOTAVAIL
    );
    let mut t = tables();
    t.bind(PortSpace::Tcp, &req("0.0.0.0", 7000)).unwrap();
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000))),
        libc::EADDRNOTAVAIL
    );
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("0.0.0.0", 7000))),
        libc::EADDRNOTAVAIL
    );
}

#[test]
fn reuseaddr_on_both_skips_the_conflict() {
    let mut t = tables();
    t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000).reuseaddr(true))
        .unwrap();
    // Only one side reusing: conflict.
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000))),
        libc::EADDRINUSE
    );
    let (h, _) = t
        .bind(PortSpace::Tcp, &req("192.0.2.1", 7000).reuseaddr(true))
        .unwrap();
    // A listener does not share: listening re-checks without REUSEADDR.
    assert_eq!(t.listen(h).unwrap_err().errno(), libc::EADDRINUSE);
}

#[test]
fn listening_id_is_not_shared_by_later_reuseaddr_binds() {
    let mut t = tables();
    let (h, _) = t
        .bind(PortSpace::Tcp, &req("0.0.0.0", 7000).reuseaddr(true))
        .unwrap();
    t.listen(h).unwrap();
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("0.0.0.0", 7000).reuseaddr(true))),
        libc::EADDRNOTAVAIL
    );
}

#[test]
fn afonly_different_families_coexist() {
    let mut t = tables();
    t.bind(PortSpace::Tcp, &req("0.0.0.0", 7000)).unwrap();
    // IPv6 wildcard not AF-only: conflicts with the IPv4 wildcard.
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("::", 7000))),
        libc::EADDRNOTAVAIL
    );
    // AF-only IPv6 wildcard: coexists.
    t.bind(PortSpace::Tcp, &req("::", 7000).afonly(true))
        .unwrap();
}

#[test]
fn ports_below_1024_need_root() {
    let mut t = tables();
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 80))),
        libc::EACCES
    );
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("0.0.0.0", 1023))),
        libc::EACCES
    );
    t.bind(PortSpace::Tcp, &req("0.0.0.0", 1024)).unwrap();
    let mut t = PortTables::new(PortConfig {
        may_bind_privileged: true,
        ..PortConfig::default()
    });
    t.bind(PortSpace::Tcp, &req("192.0.2.1", 80)).unwrap();
}

#[test]
fn release_frees_the_port() {
    let mut t = tables();
    let (h, _) = t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000)).unwrap();
    assert_eq!(t.port_of(h), Some((PortSpace::Tcp, 7000)));
    assert!(t.release(h));
    assert!(!t.release(h));
    t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000)).unwrap();
}

#[test]
fn connect_time_ephemeral_port_shared_when_tuple_unique() {
    let mut t = PortTables::new(PortConfig {
        ephemeral: (40000, 40000),
        ..PortConfig::default()
    });
    let peer1: SocketAddr = "192.0.2.2:7471".parse().unwrap();
    let peer2: SocketAddr = "192.0.2.3:7471".parse().unwrap();
    let (_, p) = t
        .bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer1))
        .unwrap();
    assert_eq!(p, 40000);
    // The single-port range: the port is also the last used one, so nothing is left.
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer2))),
        libc::EADDRNOTAVAIL
    );
    let mut t = PortTables::new(PortConfig {
        ephemeral: (40000, 40001),
        ..PortConfig::default()
    });
    let a = t
        .bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer1))
        .unwrap();
    let b = t
        .bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer1))
        .unwrap();
    assert_ne!(a.1, b.1);
    // Both ports used; a third connect to another peer shares one (not the last used).
    let c = t
        .bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer2))
        .unwrap();
    assert_eq!(c.1, a.1);
    // Same tuple again: not unique on a's port, unique on b's (other peer).
    let d = t
        .bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer2))
        .unwrap();
    assert_eq!(d.1, b.1);
    // And once more: unique nowhere.
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer2))),
        libc::EADDRNOTAVAIL
    );
    // Without a peer a used port is never shared.
    assert_eq!(
        errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 0))),
        libc::EADDRNOTAVAIL
    );
}

#[test]
fn one_table_per_port_space_and_ipv4_ids_are_af_only() {
    let r = BindRequest::new("0.0.0.0".parse().unwrap(), 0).reuseaddr(true);
    assert!(r.afonly);
    assert!(!BindRequest::new("::".parse().unwrap(), 0).afonly);
    let mut t = PortTables::new(PortConfig::default());
    let a = || BindRequest::new("192.0.2.1".parse().unwrap(), 7471);
    let (h, port) = t.bind(PortSpace::Tcp, &a()).unwrap();
    assert_eq!(port, 7471);
    assert_eq!(
        t.bind(PortSpace::Tcp, &a()).unwrap_err().errno(),
        libc::EADDRINUSE
    );
    // another port space is another table
    assert!(t.bind(PortSpace::Udp, &a()).is_ok());
    t.release(h);
    assert!(t.bind(PortSpace::Tcp, &a()).is_ok());
}
