//! The address-and-route-resolution layer of the rdmacm-rs connection manager, and its
//! port spaces: which netdev — and so which software device, since a device is attached to
//! one netdev and named after it — and which path an id uses, decided from the host's real
//! network state (read over netlink by `rdma-hostview`).
//!
//! * [`Resolver::bind`]: a specific address binds the netdev holding it; a wildcard binds
//!   none; link-local addresses need a scope id, which selects the netdev.
//! * [`Resolver::resolve_addr`]: the full-tuple route lookup, loopback connections, the
//!   fail-fast rule for bound ids, neighbour resolution → [`ResolvedAddr`].
//! * [`Resolver::resolve_route`]: the RoCE path computed locally → [`RocePath`].
//! * [`Resolver::accept_path`]: the passive side's path from where a request arrived, or a
//!   rejection ([`Error::Rejected`], REJ reason 28).
//! * [`Watcher`]: per-id [`Notification`]s (ADDR_CHANGE / DEVICE_REMOVAL) from host changes.
//! * [`PortTables`]: per-port-space bind tables with rdma_cm's conflict rules.
//! * [`BlockingResolver`]: the same for blocking callers.
//! * [`Error`]: typed errors; [`Error::errno`] is the errno rdma_cm would give.
//!
//! ```no_run
//! # async fn f() -> rdmacm::Result<()> {
//! use std::time::Duration;
//! use rdmacm::{Resolver, RouteParams};
//! let r = Resolver::new()?;
//! let bound = r.bind(&"192.0.2.1".parse()?).await?;
//! let oif = bound.netdev.as_ref().map(|n| n.index);
//! let a = r
//!     .resolve_addr(None, &"192.0.2.2".parse()?, oif, Duration::from_millis(2000))
//!     .await?;
//! let p = r.resolve_route(&a, &RouteParams { src_port: 40000, dst_port: 7471, ..Default::default() }).await?;
//! println!("{} via {} dmac {:?} mtu {:?}", a.dst, a.netdev.name, a.dmac, p.mtu);
//! # Ok(()) }
//! ```
//!
//! # Deviations from Linux's rdma_cm (all from DESIGN.md's decisions)
//!
//! * **Loopback addresses are specific.** Linux treats 127.0.0.0/8 and `::1` as "any"
//!   (`cma_any_addr`): binding them binds no device, resolving them picks the first RDMA
//!   device and then fails on RoCE with `ENODEV` at route resolution. Here they are
//!   addresses of `lo`: bind and resolve go through the device on `lo`, and a connection to
//!   any local address (also one held by another netdev) stays on the host. For port
//!   conflicts they count as specific addresses too.
//! * **Bound to a netdev without a route: `EHOSTUNREACH` at once.** Linux constrains the
//!   lookup to the bound netdev as well, but IPv4 then guesses "on link" and the id gets
//!   ADDR_ERROR with `ETIMEDOUT` after an ARP that nobody answers.
//! * **Link-local destinations need a scope id** (`EINVAL` at once); Linux checks only the
//!   source and otherwise does an unscoped lookup.
//! * **Passive side accepts loopback peers** (Linux's `validate_net_dev` rejects loopback
//!   addresses); the other rejections (arrival netdev down, not on the reverse route) are
//!   Linux's.
//! * **ADDR_CHANGE for every change under an id** (route, neighbour MAC, source address,
//!   netdev down), not only bonding fail-over; and nothing is torn down (Linux ≥ 6.0 sends
//!   UNREACHABLE on a neighbour MAC change, even to established connections).
//! * **A source address given to `resolve_addr` does not bind**: the CM binds before
//!   resolving if it wants rdma_cm's implicit bind.

#![warn(missing_docs)]

mod addr;
mod blocking;
mod error;
mod ports;
mod resolve;
mod route;
mod watch;

pub use addr::{any_of, classify, loopback_of, AddrClass, Gid, ScopeId, ScopedIp};
pub use blocking::BlockingResolver;
pub use error::{Error, RejectCause, Result};
pub use ports::{
    read_local_port_range, BindHandle, BindRequest, PortConfig, PortSpace, PortTables,
};
pub use rdma_hostview::MacAddr;
pub use resolve::{Binding, GidEntry, Netdev, ResolvedAddr, Resolver, RouteQuery};
pub use route::{
    flow_label, flow_label_to_udp_sport, IbMtu, RocePath, RouteParams, DEFAULT_PACKET_LIFETIME,
    ROCE_HEADROOM, ROCE_UDP_SPORT_MIN,
};
pub use watch::{ChangeReason, Notification, WatchId, WatchKey, Watcher};
