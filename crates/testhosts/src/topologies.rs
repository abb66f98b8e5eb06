//! The named topologies the connection manager's tests use.
//!
//! Address plan (documentation ranges only):
//! * subnet 1: 192.0.2.0/24, 2001:db8:1::/64; subnet 2: 198.51.100.0/24, 2001:db8:2::/64;
//! * every veth end also holds a fixed link-local `fe80::<n>/64`.

use crate::topology::{Error, Topology, TopologyBuilder};

/// Names accepted by [`by_name`] (and by the `testhosts up` command).
pub const NAMES: &[&str] = &[
    "two-hosts",
    "two-subnets",
    "same-subnet",
    "link-local",
    "local-route",
    "router",
    "two-links",
];

/// Builds a topology by its name in [`NAMES`].
pub fn by_name(name: &str) -> Result<Topology, Error> {
    builder_by_name(name)?.build()
}

/// The description of a topology by its name in [`NAMES`], not yet built.
pub fn builder_by_name(name: &str) -> Result<TopologyBuilder, Error> {
    Ok(match name {
        "two-hosts" => two_hosts_one_link_builder(),
        "two-subnets" => two_nics_two_subnets_builder(),
        "same-subnet" => two_nics_same_subnet_builder(),
        "link-local" => link_local_only_builder(),
        "local-route" => local_route_via_lo_builder(),
        "router" => router_between_subnets_builder(),
        "two-links" => two_hosts_two_links_builder(),
        _ => return Err(Error(format!("unknown topology {name}; one of {NAMES:?}"))),
    })
}

/// 1. `a:eth0` — `b:eth0` on one link: 192.0.2.1/.2, 2001:db8:1::1/::2, fe80::1/fe80::2.
pub fn two_hosts_one_link() -> Result<Topology, Error> {
    two_hosts_one_link_builder().build()
}

fn two_hosts_one_link_builder() -> TopologyBuilder {
    Topology::builder("two-hosts")
        .host("a")
        .host("b")
        .link("a", "eth0", "b", "eth0")
        .addr("a", "eth0", "192.0.2.1/24")
        .addr("a", "eth0", "2001:db8:1::1/64")
        .addr("a", "eth0", "fe80::1/64")
        .addr("b", "eth0", "192.0.2.2/24")
        .addr("b", "eth0", "2001:db8:1::2/64")
        .addr("b", "eth0", "fe80::2/64")
}

/// 2. `a` with two NICs on two subnets: `a:eth0` (192.0.2.1, 2001:db8:1::1) — `b:eth0`
///    (192.0.2.2, 2001:db8:1::2) and `a:eth1` (198.51.100.1, 2001:db8:2::1) — `c:eth0`
///    (198.51.100.3, 2001:db8:2::3).
pub fn two_nics_two_subnets() -> Result<Topology, Error> {
    two_nics_two_subnets_builder().build()
}

fn two_nics_two_subnets_builder() -> TopologyBuilder {
    Topology::builder("two-subnets")
        .host("a")
        .host("b")
        .host("c")
        .link("a", "eth0", "b", "eth0")
        .link("a", "eth1", "c", "eth0")
        .addr("a", "eth0", "192.0.2.1/24")
        .addr("a", "eth0", "2001:db8:1::1/64")
        .addr("a", "eth0", "fe80::1/64")
        .addr("a", "eth1", "198.51.100.1/24")
        .addr("a", "eth1", "2001:db8:2::1/64")
        .addr("a", "eth1", "fe80::11/64")
        .addr("b", "eth0", "192.0.2.2/24")
        .addr("b", "eth0", "2001:db8:1::2/64")
        .addr("b", "eth0", "fe80::2/64")
        .addr("c", "eth0", "198.51.100.3/24")
        .addr("c", "eth0", "2001:db8:2::3/64")
        .addr("c", "eth0", "fe80::3/64")
}

/// 3. `a` with two NICs on the same subnet: `a:eth0` (192.0.2.1, 2001:db8:1::1) — `b:eth0`
///    (192.0.2.2, 2001:db8:1::2) and `a:eth1` (192.0.2.11, 2001:db8:1::11) — `c:eth0`
///    (192.0.2.3, 2001:db8:1::3).
pub fn two_nics_same_subnet() -> Result<Topology, Error> {
    two_nics_same_subnet_builder().build()
}

fn two_nics_same_subnet_builder() -> TopologyBuilder {
    Topology::builder("same-subnet")
        .host("a")
        .host("b")
        .host("c")
        .link("a", "eth0", "b", "eth0")
        .link("a", "eth1", "c", "eth0")
        .addr("a", "eth0", "192.0.2.1/24")
        .addr("a", "eth0", "2001:db8:1::1/64")
        .addr("a", "eth1", "192.0.2.11/24")
        .addr("a", "eth1", "2001:db8:1::11/64")
        .addr("b", "eth0", "192.0.2.2/24")
        .addr("b", "eth0", "2001:db8:1::2/64")
        .addr("c", "eth0", "192.0.2.3/24")
        .addr("c", "eth0", "2001:db8:1::3/64")
}

/// 4. `a:eth0` — `b:eth0` joined only by link-local addresses fe80::1 and fe80::2.
pub fn link_local_only() -> Result<Topology, Error> {
    link_local_only_builder().build()
}

fn link_local_only_builder() -> TopologyBuilder {
    Topology::builder("link-local")
        .host("a")
        .host("b")
        .link("a", "eth0", "b", "eth0")
        .addr("a", "eth0", "fe80::1/64")
        .addr("b", "eth0", "fe80::2/64")
}

/// 5. Seed 001's local route: `a:eth0` holds x = 192.0.2.11 (2001:db8:1::11) towards
///    `b:eth0` (192.0.2.12), `a:eth1` holds y = 198.51.100.1 (2001:db8:2::1) towards `c:eth0`
///    (198.51.100.3); `ip route get x from y` in `a` answers `local x dev lo`.
pub fn local_route_via_lo() -> Result<Topology, Error> {
    local_route_via_lo_builder().build()
}

fn local_route_via_lo_builder() -> TopologyBuilder {
    Topology::builder("local-route")
        .host("a")
        .host("b")
        .host("c")
        .link("a", "eth0", "b", "eth0")
        .link("a", "eth1", "c", "eth0")
        .addr("a", "eth0", "192.0.2.11/24")
        .addr("a", "eth0", "2001:db8:1::11/64")
        .addr("a", "eth1", "198.51.100.1/24")
        .addr("a", "eth1", "2001:db8:2::1/64")
        .addr("b", "eth0", "192.0.2.12/24")
        .addr("b", "eth0", "2001:db8:1::12/64")
        .addr("c", "eth0", "198.51.100.3/24")
        .addr("c", "eth0", "2001:db8:2::3/64")
}

/// 6. A router `r` between two subnets, forwarding on: `a:eth0` (192.0.2.1, 2001:db8:1::1) —
///    `r:eth0` (192.0.2.254, 2001:db8:1::fe); `r:eth1` (198.51.100.254, 2001:db8:2::fe) —
///    `b:eth0` (198.51.100.2, 2001:db8:2::2). `a` and `b` route the other subnet via `r`.
pub fn router_between_subnets() -> Result<Topology, Error> {
    router_between_subnets_builder().build()
}

fn router_between_subnets_builder() -> TopologyBuilder {
    Topology::builder("router")
        .host("a")
        .host("r")
        .host("b")
        .link("a", "eth0", "r", "eth0")
        .link("r", "eth1", "b", "eth0")
        .addr("a", "eth0", "192.0.2.1/24")
        .addr("a", "eth0", "2001:db8:1::1/64")
        .addr("r", "eth0", "192.0.2.254/24")
        .addr("r", "eth0", "2001:db8:1::fe/64")
        .addr("r", "eth1", "198.51.100.254/24")
        .addr("r", "eth1", "2001:db8:2::fe/64")
        .addr("b", "eth0", "198.51.100.2/24")
        .addr("b", "eth0", "2001:db8:2::2/64")
        .forwarding("r")
        .route("a", "198.51.100.0/24 via 192.0.2.254")
        .route("a", "2001:db8:2::/64 via 2001:db8:1::fe")
        .route("b", "192.0.2.0/24 via 198.51.100.254")
        .route("b", "2001:db8:1::/64 via 2001:db8:2::fe")
}

/// 7. Two hosts joined by two links, one subnet each (the high-availability tests):
///    `h:h0` (192.0.2.1) — `b:b0` (192.0.2.2) and `h:h1` (198.51.100.1) — `b:b1`
///    (198.51.100.2), IPv4 only, no extra routes (tests add theirs to the builder).
pub fn two_hosts_two_links() -> Result<Topology, Error> {
    two_hosts_two_links_builder().build()
}

/// The description of [`two_hosts_two_links`], for a test to add routes to.
pub fn two_hosts_two_links_builder() -> TopologyBuilder {
    Topology::builder("two-links")
        .host("h")
        .host("b")
        .link("h", "h0", "b", "b0")
        .link("h", "h1", "b", "b1")
        .addr("h", "h0", "192.0.2.1/24")
        .addr("b", "b0", "192.0.2.2/24")
        .addr("h", "h1", "198.51.100.1/24")
        .addr("b", "b1", "198.51.100.2/24")
}
