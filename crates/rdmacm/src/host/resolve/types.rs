//! The records of binding and resolution: a netdev, a binding, a GID entry, the route
//! query and the resolved address.

use std::net::IpAddr;

use rdma_hostview::{Link, MacAddr};

use crate::host::addr::Gid;

/// A netdev, as the connection manager records it for an id: the software device of an id is
/// the one attached to this netdev and named after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Netdev {
    /// ifindex.
    pub index: u32,
    /// Name, e.g. `eth0` (also the device's name).
    pub name: String,
    /// Hardware address (all zero for `lo` and links without one).
    pub mac: MacAddr,
    /// MTU in bytes.
    pub mtu: u32,
    /// IFF_LOOPBACK.
    pub loopback: bool,
    /// IFF_NOARP: no neighbour resolution.
    pub noarp: bool,
    /// IFF_UP when it was read.
    pub up: bool,
    /// IFF_RUNNING (carrier) when it was read.
    pub running: bool,
}

impl Netdev {
    /// The record of a hostview link.
    pub fn from_link(l: &Link) -> Netdev {
        Netdev {
            index: l.index,
            name: l.name.clone(),
            mac: l.mac.unwrap_or_default(),
            mtu: l.mtu,
            loopback: l.flags.loopback,
            noarp: l.flags.noarp,
            up: l.flags.up,
            running: l.flags.running,
        }
    }

    /// Whether reaching a peer through it needs a neighbour (ARP/ND) entry.
    pub fn needs_neighbour(&self) -> bool {
        !self.loopback && !self.noarp
    }
}

/// The result of [`crate::host::Resolver::bind`]: the local address and, for a specific address, the
/// netdev (device) the id is bound to.
///
/// ```
/// use rdmacm::host::Binding;
/// let wild = Binding { addr: "0.0.0.0".parse().unwrap(), scope: None, netdev: None };
/// assert!(wild.is_wildcard());
/// assert!(wild.accepts(7, "192.0.2.1".parse().unwrap(), true));
/// assert!(!wild.accepts(7, "2001:db8::1".parse().unwrap(), true));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The bound address (wildcard, loopback or a specific address).
    pub addr: IpAddr,
    /// Its scope (ifindex) for a link-local address.
    pub scope: Option<u32>,
    /// The netdev holding it; `None` for a wildcard bind (no device).
    pub netdev: Option<Netdev>,
}

impl Binding {
    /// True for 0.0.0.0 / `::` (no device bound).
    pub fn is_wildcard(&self) -> bool {
        self.addr.is_unspecified()
    }

    /// Whether a listener bound like this gets a request that arrived on netdev `arrival`
    /// for local address `local`: a wildcard listener gets requests from every device (an
    /// IPv6 wildcard also IPv4 ones unless `afonly`); a specific listener only those for its
    /// address (for a link-local address also only on its scope's netdev).
    pub fn accepts(&self, arrival: u32, local: IpAddr, afonly: bool) -> bool {
        if self.is_wildcard() {
            return self.addr.is_ipv4() == local.is_ipv4() || (self.addr.is_ipv6() && !afonly);
        }
        self.addr == local && self.scope.is_none_or(|s| s == arrival)
    }
}

/// One entry of a device's GID table: an address of its netdev as a GID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID (IPv4-mapped for IPv4).
    pub gid: Gid,
    /// The address.
    pub ip: IpAddr,
}

/// The route lookup behind a resolution: `ip route get DST [from SRC] [oif OIF]`. Kept so
/// that the [`crate::host::Watcher`] can ask the same question again when routes change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteQuery {
    /// Destination (the peer).
    pub dst: IpAddr,
    /// Scope (ifindex) of a link-local destination.
    pub dst_scope: Option<u32>,
    /// Source, if the caller gave one.
    pub src: Option<IpAddr>,
    /// Output netdev: the bound netdev, or the scope of a link-local source/destination.
    pub oif: Option<u32>,
}

/// The outcome of address resolution (active side) or of [`crate::host::Resolver::accept_path`]
/// (passive side): the netdev and everything the route and the CM need.
///
/// ```no_run
/// # fn f() -> rdmacm::Result<()> {
/// use std::time::Duration;
/// let r = rdmacm::host::BlockingResolver::new()?;
/// let a = r.resolve_addr(None, &"192.0.2.2".parse()?, None, Duration::from_secs(2))?;
/// println!(
///     "device {} ({}), {} -> {} via {:?}, dmac {:?}, loopback {}",
///     a.netdev.name, a.netdev.index, a.sgid, a.dgid, a.gateway, a.dmac, a.loopback
/// );
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedAddr {
    /// The netdev, i.e. the device, the id uses.
    pub netdev: Netdev,
    /// Local address.
    pub src: IpAddr,
    /// Scope (ifindex) of a link-local local address.
    pub src_scope: Option<u32>,
    /// ifindex of the netdev that holds `src` (differs from `netdev` only for a loopback
    /// connection from an address of another netdev, seed 001).
    pub src_netdev: u32,
    /// Peer address.
    pub dst: IpAddr,
    /// Scope (ifindex) of a link-local peer address.
    pub dst_scope: Option<u32>,
    /// Source GID (`src` as a GID).
    pub sgid: Gid,
    /// Destination GID (`dst` as a GID).
    pub dgid: Gid,
    /// Gateway, when the route has one (then the path is routed: RoCE v2 only).
    pub gateway: Option<IpAddr>,
    /// The neighbour whose MAC is `dmac`: the gateway, or the peer itself.
    pub next_hop: IpAddr,
    /// Our MAC on `netdev`.
    pub smac: MacAddr,
    /// The next hop's MAC. Always known on the active side (own MAC for loopback, zero on
    /// NOARP links); on the passive side only if the neighbour table has a valid entry.
    pub dmac: Option<MacAddr>,
    /// MTU of `netdev` in bytes.
    pub mtu: u32,
    /// Hop limit / TTL for the path (see [`crate::host::Resolver::resolve_addr`]).
    pub hop_limit: u8,
    /// The peer is one of this host's addresses: the connection stays on the host.
    pub loopback: bool,
    /// The lookup that produced this.
    pub query: RouteQuery,
}

/// What [`crate::host::Resolver::choose`] picked for a query.
#[derive(Debug, Clone)]
pub(crate) struct Choice {
    pub(crate) netdev: Link,
    pub(crate) src: IpAddr,
    pub(crate) gateway: Option<IpAddr>,
    pub(crate) loopback: bool,
}
