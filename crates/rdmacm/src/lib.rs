//! The rdmacm-rs connection manager: the rdma_cm model (event channels, ids, bind / resolve
//! address / resolve route / listen / connect / accept / reject / disconnect, typed events
//! with Linux's names and statuses) over the software RoCEv2 device and the IB CM, an async
//! layer on top, and underneath it the address-and-route-resolution layer and the port
//! spaces: which netdev — and so which software device, since a device is attached to one
//! netdev and named after it — and which path an id uses, decided from the host's real
//! network state (read over netlink by `rdma-hostview`).
//!
//! # Connection manager
//!
//! * [`Cma`](cm::Cma): the process-wide context (devices, CM agents, ports, ids), driven by the
//!   process's progress engine (one thread asleep in `epoll`; no application call is
//!   needed for the CM to answer its peers).
//!   Its counters: [`Cma::statistics`](cm::Cma::statistics) ([`CmStatistics`](cm::CmStatistics): requests taken, refused by
//!   [`RejectCause`](cm::RejectCause), MADs dropped), and per id in the inspection view
//!   (`rdma-soft resource show cm_id`; `docs/INSPECT.md`).
//! * [`EventChannel`](cm::EventChannel): blocking [`EventChannel::get_event`](cm::EventChannel::get_event), its fd, async
//!   [`EventChannel::next_event`](cm::EventChannel::next_event). [`Event`](cm::Event): [`EventType`](cm::EventType) (Display = `rdma_event_str`),
//!   status, private data; dropping it acknowledges it.
//! * [`CmId`](cm::CmId): [`IdState`](cm::IdState) machine, [`CmId::bind_addr`](cm::CmId::bind_addr), [`CmId::resolve_addr`](cm::CmId::resolve_addr),
//!   [`CmId::resolve_route`](cm::CmId::resolve_route), [`CmId::listen`](cm::CmId::listen), [`CmId::create_qp`](cm::CmId::create_qp), [`CmId::connect`](cm::CmId::connect),
//!   [`CmId::accept`](cm::CmId::accept), [`CmId::reject`](cm::CmId::reject), [`CmId::disconnect`](cm::CmId::disconnect), [`CmId::establish`](cm::CmId::establish),
//!   [`CmId::migrate`](cm::CmId::migrate), [`CmId::set_option`](cm::CmId::set_option), address / device getters.
//! * Async (tokio; `docs/ASYNC.md` walks through it with runnable examples): [`Listener`],
//!   [`Connection`] (messages: [`Connection::send`], [`Connection::recv`]; a byte stream:
//!   [`RdmaStream`]; no-copy [`Buf`]s: [`Connection::send_buf`], [`Connection::write_buf`],
//!   [`Connection::read_buf`]; one-sided with a [`RemoteBuf`]; memory registered before
//!   the connection: [`Incoming`], [`Resolved`], [`Setup`]; teardown:
//!   [`Connection::closed`], [`Connection::disconnect`]), [`CompletionStream`] for your own
//!   work requests. Waiting is on the CQ's completion channel through tokio, never a spin.
//!
//! The data path in a few lines (it runs as a doctest, on the software device over
//! loopback): a message each way, then the server's memory written by the client.
//!
//! ```
//! use rdmacm::{ConnectOptions, Connection, Listener, RemoteBuf};
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> rdmacm::Result<()> {
//! let listener = Listener::bind("127.0.64.9:0".parse().unwrap()).await?;
//! let addr = listener.local_addr().unwrap();
//! let server = tokio::spawn(async move {
//!     let conn = listener.accept().await?;
//!     let mr = conn.register_remote(4096)?;            // the client may WRITE here
//!     conn.send(&RemoteBuf::of(&mr).to_bytes()).await?; // tell it where
//!     let hello = conn.recv().await?;
//!     conn.closed().await;                              // the client is done
//!     Ok::<_, rdmacm::Error>((hello, mr.to_vec()))
//! });
//! let opts = ConnectOptions::new().src("127.0.64.9:0".parse().unwrap());
//! let conn = Connection::connect(addr, opts).await?;
//! let remote = RemoteBuf::from_bytes(&conn.recv().await?).expect("16 bytes");
//! conn.write(&remote, b"written by the client").await?;  // one-sided, completes when placed
//! conn.send(b"hello").await?;
//! conn.disconnect().await?;
//! let (hello, mem) = server.await.unwrap()?;
//! assert_eq!(hello, b"hello");
//! assert_eq!(&mem[..21], b"written by the client");
//! # Ok(()) }
//! ```
//!
//! ```no_run
//! use std::time::Duration;
//! use rdmacm::cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
//! # fn f() -> rdmacm::Result<()> {
//! let ch = EventChannel::new()?;
//! let id = CmId::new(&ch, PortSpace::Tcp)?;
//! id.resolve_addr(None, "192.0.2.2:7471".parse().unwrap(), Duration::from_secs(2))?;
//! assert_eq!(ch.get_event()?.kind(), EventType::AddrResolved);
//! id.resolve_route(Duration::from_secs(2))?;
//! assert_eq!(ch.get_event()?.kind(), EventType::RouteResolved);
//! let qp = id.create_qp_default()?;
//! id.connect(&ConnParam { private_data: b"hello".to_vec(), ..Default::default() })?;
//! let ev = ch.get_event()?;
//! println!("{} (status {}), QPN {}", ev.kind(), ev.status(), qp.qpn());
//! # Ok(()) }
//! ```
//!
//! `docs/CM.md` shows the state machine of an id, the flows, and every place where the
//! connection manager differs from Linux, with the reason. In short: `resolve_addr` does
//! its neighbour resolution in the call; DISCONNECTED is still reported after DEVICE_REMOVAL; `Event::take_id` acknowledges the
//! CONNECT_REQUEST for the new id; any
//! 127.0.0.0/8 address is usable through the `lo` device; CM timeouts are settable
//! ([`Cma::set_cm_timeouts`](cm::Cma::set_cm_timeouts)).
//!
//! Devices: one per netdev that has an address, `lo` included, named after it
//! ([`Cma::device_list`](cm::Cma::device_list)); `RDMACM_DEVICES` or [`CmaConfig`](cm::CmaConfig) restricts and renames them.
//! Their GID tables follow the host's addresses, and wildcard listeners follow new
//! devices.
//!
//! # Resolution layer
//!
//! * [`Resolver::bind`](host::Resolver::bind): a specific address binds the netdev holding it; a wildcard binds
//!   none; link-local addresses need a scope id, which selects the netdev.
//! * [`Resolver::resolve_addr`](host::Resolver::resolve_addr): the full-tuple route lookup, loopback connections, the
//!   fail-fast rule for bound ids, neighbour resolution → [`ResolvedAddr`](host::ResolvedAddr).
//! * [`Resolver::resolve_route`](host::Resolver::resolve_route): the RoCE path computed locally → [`RocePath`](host::RocePath).
//! * [`Resolver::accept_path`](host::Resolver::accept_path): the passive side's path from where a request arrived, or a
//!   rejection ([`Error::Rejected`], REJ reason 28).
//! * [`Watcher`](host::Watcher): per-id [`Notification`](host::Notification)s (ADDR_CHANGE / DEVICE_REMOVAL) from host changes.
//! * `PortTables`: per-port-space bind tables with rdma_cm's conflict rules.
//! * [`BlockingResolver`](host::BlockingResolver): the same for blocking callers.
//! * [`Error`]: typed errors; [`Error::errno`] is the errno rdma_cm would give.
//!
//! ```no_run
//! # async fn f() -> rdmacm::Result<()> {
//! use std::time::Duration;
//! use rdmacm::host::{Resolver, RouteParams};
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

//! # Decisions (DESIGN.md) → API → tests
//!
//! | decision | API | tests (`crates/rdmacm/tests/`) |
//! | --- | --- | --- |
//! | An address belongs to the host; a device's GID table holds its netdev's addresses | [`Resolver::gid_table`](host::Resolver::gid_table), [`Gid`](host::Gid) | `gid_table_holds_netdev_addresses_ipv4_mapped` |
//! | bind: specific → its netdev; wildcard → none; loopback → `lo`; link-local needs scope | [`Resolver::bind`](host::Resolver::bind) | `bind_specific_address_binds_its_netdev`, `bind_address_held_by_no_netdev_is_eaddrnotavail`, `wildcard_bind_binds_no_device`, `loopback_bind_binds_the_device_on_lo`, `link_local_bind_needs_scope_and_scope_selects_netdev` |
//! | specific listener gets its address only, wildcard gets all | [`Binding::accepts`](host::Binding::accepts) | `specific_listener_gets_only_its_address_wildcard_gets_all` |
//! | resolve_addr: full-tuple lookup, neighbour with the caller's timeout | [`Resolver::resolve_addr`](host::Resolver::resolve_addr) | `resolve_uses_full_tuple_route_lookup`, `routed_path_through_gateway_resolves_gateway_mac`, `neighbour_timeout_is_etimedout` |
//! | local route through `lo` is a loopback connection (seed 001) | [`Resolver::resolve_addr`](host::Resolver::resolve_addr) | `local_route_through_lo_is_loopback_seed_001` |
//! | bound netdev without a route: EHOSTUNREACH at once | [`Resolver::resolve_addr`](host::Resolver::resolve_addr) | `bound_netdev_without_route_fails_fast_ehostunreach`, `bound_netdev_constrains_lookup_two_nics_same_subnet` |
//! | 127.0.0.0/8 and ::1 through `lo` | [`Resolver::resolve_addr`](host::Resolver::resolve_addr) | `loopback_127_and_ipv6_1_resolve_through_lo` |
//! | link-local needs a scope id, which selects the netdev | [`Resolver::resolve_addr`](host::Resolver::resolve_addr) | `link_local_without_scope_is_einval`, `link_local_scope_selects_the_netdev` |
//! | RoCE route computed locally | [`Resolver::resolve_route`](host::Resolver::resolve_route), [`RocePath`](host::RocePath) | `resolve_route_computes_roce_path_locally` (+ unit tests) |
//! | passive side: path from the arrival netdev; REJ 28 when down / not on the reverse route | [`Resolver::accept_path`](host::Resolver::accept_path) | `passive_side_path_from_arrival_netdev_without_neighbour`, `passive_side_rejects_arrival_netdev_down`, `passive_side_rejects_not_on_reverse_route`, `passive_side_accepts_loopback_peer` |
//! | routing changes: ADDR_CHANGE / DEVICE_REMOVAL hints, sticky ids | [`Watcher`](host::Watcher) | `addr_change_on_route_replace`, `addr_change_on_neighbour_mac_change`, `addr_change_when_source_address_removed`, `addr_change_when_netdev_goes_down`, `addr_change_when_local_mac_changes`, `device_removal_when_netdev_deleted`, `recheck_after_lost_notifications_finds_changes` |
//! | port spaces (section (a).6) | `PortTables` | unit tests in `ports.rs` |
//!
//! | connect / accept / reject / disconnect, events | [`CmId`](cm::CmId), [`EventChannel`](cm::EventChannel) | `cm_loopback.rs`, `cm_hosts.rs` (`two_hosts_connect_accept_reject_disconnect_both_directions`) |
//! | bind / resolve rows through the CM | [`CmId::bind_addr`](cm::CmId::bind_addr), [`CmId::resolve_addr`](cm::CmId::resolve_addr) | `cm_seeds.rs` (`loopback_127_0_0_1_and_ipv6_1_connect_through_the_device_on_lo`, `link_local_without_scope_is_einval_and_rolls_back`, `wildcard_bind_binds_no_device_specific_binds_lo`), `cm_hosts.rs` (`cm_bound_netdev_without_route_fails_fast_ehostunreach`, `listener_on_specific_address_only_accepts_that_address`) |
//! | sticky connections: changes are hints, a vanished peer times out | [`EventType::AddrChange`](cm::EventType::AddrChange), [`EventType::DeviceRemoval`](cm::EventType::DeviceRemoval) | `peer_vanishes_gives_unreachable_or_disconnected_never_a_hang` |
//! | scale, backlog, timewait, async | [`Listener`], [`Connection`] | `cm_many.rs`, `two_hosts_many_connections` (`RDMA_CM_CONNS`) |
//! | async data path: messages with credits, one-sided WRITE/READ, TCP-like teardown, error text | [`Connection::send`], [`Connection::recv`], [`Connection::write`], [`Connection::read`], [`RemoteBuf`], [`Connection::closed`], [`Connection::disconnect`], [`CloseReason`] | `async_data.rs`, README's async echo (a doctest) |
//! | async byte stream, owned buffers, setup hooks, completion stream, connect errors | [`RdmaStream`], [`Buf`], [`BufPool`], [`Incoming`], [`Resolved`], [`Setup`], [`CompletionStream`], [`ConnectOptions::connect_timeout`] | `async_stream.rs`, `async_owned.rs`, `async_setup.rs`, `async_completions.rs`, `async_errors.rs`, docs/ASYNC.md (doctests) |
//! | SIDR, hostile MADs | [`CmId::connect`](cm::CmId::connect) (UDP port space) | `udp_port_space_resolves_peer_qpn_and_qkey_with_sidr`, `hostile_mads_change_no_connection` |
//!
//! Namespace tests need root and print `SKIPPED` otherwise.

#![warn(missing_docs)]

mod async_api;
mod config;
mod context;
mod engine;
mod error;
mod ha;
mod ha_policy;
mod params;
mod ports;

pub use async_api::{
    AcceptOptions, Buf, BufPool, CompletionStream, ConnectOptions, Connection, Datagram, Incoming,
    Listener, ListenerBuilder, Multicast, RdmaStream, Reconnected, RemoteBuf, Resolved, Setup,
    CONTROL_WINDOW, DISCONNECT_WAIT, MAX_MESSAGE, MAX_RDMA_OPS, MAX_REP_PRIVATE_DATA,
    MAX_REQ_PRIVATE_DATA, WINDOW,
};
pub use error::{CloseReason, Error, Result};

pub mod cm;

pub mod host;

/// The software device's verbs objects and vocabulary, as [`Connection`] and
/// [`cm::CmId`] hand them out (so an application needs no dependency on `rdma-soft` itself).
///
/// ```
/// use rdmacm::verbs::{AccessFlags, QpState, WcStatus};
/// assert_eq!(WcStatus::RetryExcErr as u32, 12);
/// assert!(AccessFlags::LOCAL_WRITE.contains(AccessFlags::LOCAL_WRITE));
/// assert_ne!(QpState::Rts, QpState::Err);
/// ```
pub use rdma_soft::verbs;

#[cfg(test)]
mod tests {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}

    #[test]
    fn handles_cross_threads() {
        send_sync::<crate::host::Resolver>();
        send_sync::<crate::host::ResolvedAddr>();
        send_sync::<crate::ports::PortTables>();
        send_sync::<crate::Error>();
        send::<crate::host::Watcher>();
        send::<crate::host::BlockingResolver>();
        send_sync::<crate::cm::Cma>();
        send_sync::<crate::cm::CmId>();
        send_sync::<crate::cm::EventChannel>();
        send::<crate::cm::Event>();
        send_sync::<crate::Connection>();
        send_sync::<crate::Listener>();
    }
}

/// README.md's code blocks, compiled as doc tests so the quickstart stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// docs/CONFIG.md's code blocks, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/CONFIG.md")]
struct ConfigDoctests;
