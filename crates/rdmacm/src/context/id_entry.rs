//! The id table's entries: what the CM holds for each id (its state, addresses, options,
//! connection and listener bookkeeping).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use rdma_proto::cm::ConnHandle;
use rdma_soft::verbs::QueuePair;

use crate::context::counters::IdCounters;
use crate::host::resolve::{Binding, ResolvedAddr};
use crate::host::route::RocePath;
use crate::params::ConnEventParam;
use crate::ports::{BindHandle, PortSpace};

/// Number of an id: never reused within a context.
pub(crate) type IdNum = u64;

/// What the peer told us in its REQ or REP.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Remote {
    pub qpn: u32,
    pub psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub rnr_retry: u8,
    pub retry: u8,
    /// Its CA GUID: one of our processes on this host announces its host-local wire there
    /// (`rdma_soft::io::HostPeer`).
    pub ca_guid: u64,
}

/// Per-id options (`rdma_set_option`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IdOptions {
    pub tos: Option<u8>,
    pub reuseaddr: bool,
    pub afonly: Option<bool>,
    pub ack_timeout: Option<u8>,
    /// What the CM does when the connection's path changes (inherited by a listener's
    /// children with the other options).
    pub ha: crate::ha_policy::HaPolicy,
    /// Migrate: stay on the alternate when the primary comes back ([`crate::cm::CmaConfig::ha_stay`]).
    pub ha_stay: bool,
}

/// A listener's bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct ListenState {
    pub backlog: usize,
    /// CONNECT_REQUEST events queued and not yet handed out (Linux's backlog measure).
    pub queued: usize,
    /// (device ifindex, service id) registrations.
    pub regs: Vec<(u32, u64)>,
}

/// The state of one id.
#[derive(Debug)]
pub(crate) struct IdSlot {
    pub state: IdState,
    pub channel: u64,
    pub ps: PortSpace,
    pub context: u64,
    pub opts: IdOptions,
    pub bind: Option<BindHandle>,
    pub binding: Option<Binding>,
    pub local: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    /// ifindex of the device (netdev) the id is attached to.
    pub dev: Option<u32>,
    pub resolved: Option<ResolvedAddr>,
    pub path: Option<RocePath>,
    /// The alternate path (the migrate policy on a device group), once chosen or taken.
    pub alt: Option<crate::host::route::AltPath>,
    /// A passive id's REQ carried an alternate path (taken or not: `alt`).
    pub alt_offered: bool,
    /// The connection was set up with an alternate path on both sides (path migration);
    /// a `migrate` id without one falls back to `align`.
    pub apm: bool,
    /// The alternate proposed in our LAP, until the APR.
    pub lap_alt: Option<crate::host::route::AltPath>,
    /// Our address on another rail, offered in the REQ when no alternate path was found
    /// (`crate::ha::rails`), until the REP.
    pub rail_offer: Option<RailOffer>,
    pub qp: Option<Arc<QueuePair>>,
    pub qp_kind: QpKind,
    pub conn: Option<ConnHandle>,
    pub rq_psn: u32,
    pub remote: Option<Remote>,
    pub listen: Option<ListenState>,
    pub parent: Option<IdNum>,
    /// Events handed out and not yet dropped.
    pub outstanding: usize,
    /// Events of this id in its channel's queue (not handed out yet): a destroy or a
    /// channel move scans the queue only when there are some.
    pub queued_events: usize,
    pub user_qpn: Option<u32>,
    pub conn_param: Option<crate::params::ConnParam>,
    pub watched: bool,
    /// Which watch of the id is current: bumped when a migration moves the watch onto the
    /// new path, so that notifications about the path left are told apart
    /// ([`crate::context::watch_key`]).
    pub watch_gen: u16,
    /// The REP's parameters, reported with ESTABLISHED on the active side.
    pub est_param: ConnEventParam,
    /// The application establishes itself (user QP): no ESTABLISHED event.
    pub suppress_est: bool,
    /// A passive id was accepted or rejected.
    pub accepted: bool,
    /// The netdev the id's path was resolved through (what the watcher judges route
    /// changes against; differs from `dev` for a reconnect pinned to its PD's device).
    pub path_netdev: Option<u32>,
    /// Resolve onto this device whatever netdev the route takes (an async reconnect that
    /// keeps its PD, MRs and CQ).
    pub pin_dev: Option<u32>,
    /// The DISCONNECTED status the align policy ended the connection with (set before
    /// the QP goes to ERR, so that its flushes can be told apart).
    pub align_status: Option<i32>,
    /// What the CM did for it (`rdma-soft resource show cm_id`).
    pub counters: IdCounters,
    /// Its multicast joins (`crate::cm::mcast`).
    pub mc: Vec<McJoin>,
}

impl IdSlot {
    pub(crate) fn new(channel: u64, ps: PortSpace, qp_kind: QpKind) -> IdSlot {
        IdSlot {
            state: IdState::Idle,
            channel,
            ps,
            context: 0,
            opts: IdOptions::default(),
            bind: None,
            binding: None,
            local: None,
            peer: None,
            dev: None,
            resolved: None,
            path: None,
            alt: None,
            alt_offered: false,
            apm: false,
            lap_alt: None,
            rail_offer: None,
            qp: None,
            qp_kind,
            conn: None,
            rq_psn: 0,
            remote: None,
            listen: None,
            parent: None,
            outstanding: 0,
            queued_events: 0,
            user_qpn: None,
            conn_param: None,
            watched: false,
            watch_gen: 0,
            est_param: ConnEventParam::default(),
            suppress_est: false,
            accepted: false,
            counters: IdCounters::default(),
            path_netdev: None,
            pin_dev: None,
            align_status: None,
            mc: Vec::new(),
        }
    }

    pub(crate) fn afonly(&self) -> bool {
        match self.opts.afonly {
            Some(v) => v,
            None => match self.local {
                Some(SocketAddr::V6(_)) => read_bindv6only(),
                _ => true,
            },
        }
    }
}

fn read_bindv6only() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only")
        .map(|s| s.trim() == "1")
        .unwrap_or(false)
}

/// The state of an id (`enum rdma_cm_state`). Every call checks it and refuses calls out
/// of order with `EINVAL`; asynchronous steps that fail roll it back so the step can be
/// retried.
///
/// ```text
///            bind_addr                 resolve_addr              resolve_route
///   IDLE ─────────────▶ ADDR_BOUND ──────────────▶ ADDR_QUERY ──▶ ADDR_RESOLVED ──────▶ ROUTE_QUERY
///    │  (resolve_addr binds implicitly)    ▲  ADDR_ERROR │                                   │
///    │                                     └─────────────┘                 ROUTE_RESOLVED ◀──┘
///    │ listen (binds 0.0.0.0)                                                    │ connect
///    ▼                                                                           ▼
///  LISTEN ── REQ ──▶ new id in CONNECT ── accept ──▶ (RTU) ESTABLISHED ◀── CONNECT (REQ sent)
///                                                         │ DISCONNECTED
///                                                         ▼
///                                                     DISCONNECT ── TIMEWAIT_EXIT
///  any ── device gone ──▶ DEVICE_REMOVAL;  drop ──▶ DESTROYING
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdState {
    /// Created, nothing bound.
    Idle,
    /// Address resolution running.
    AddrQuery,
    /// Address resolved: device, source, destination known.
    AddrResolved,
    /// Route resolution running.
    RouteQuery,
    /// Route resolved: ready to connect.
    RouteResolved,
    /// Connecting or connected (also a passive id from its request on).
    Connect,
    /// Disconnected.
    Disconnect,
    /// Bound to an address.
    AddrBound,
    /// Listening.
    Listen,
    /// Its device went away.
    DeviceRemoval,
    /// Being destroyed.
    Destroying,
}

impl IdState {
    /// The kernel's name (`RDMA_CM_IDLE` ...).
    pub fn name(self) -> &'static str {
        match self {
            IdState::Idle => "RDMA_CM_IDLE",
            IdState::AddrQuery => "RDMA_CM_ADDR_QUERY",
            IdState::AddrResolved => "RDMA_CM_ADDR_RESOLVED",
            IdState::RouteQuery => "RDMA_CM_ROUTE_QUERY",
            IdState::RouteResolved => "RDMA_CM_ROUTE_RESOLVED",
            IdState::Connect => "RDMA_CM_CONNECT",
            IdState::Disconnect => "RDMA_CM_DISCONNECT",
            IdState::AddrBound => "RDMA_CM_ADDR_BOUND",
            IdState::Listen => "RDMA_CM_LISTEN",
            IdState::DeviceRemoval => "RDMA_CM_DEVICE_REMOVAL",
            IdState::Destroying => "RDMA_CM_DESTROYING",
        }
    }
}

impl fmt::Display for IdState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The QP type an id's port space implies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpKind {
    /// Reliable connected (TCP and IB port spaces).
    Rc,
    /// Unreliable datagram (UDP port space: SIDR).
    Ud,
}

/// One join of an id.
#[derive(Debug, Clone, Copy)]
pub(crate) struct McJoin {
    /// The group joined.
    pub group: std::net::IpAddr,
    /// Send-only (not attached).
    pub send_only: bool,
    /// The join's context, reported with its events.
    pub context: u64,
}

/// The active side's own address on the other rail, offered in the REQ (`crate::ha::rails`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RailOffer {
    /// The port of our device on that rail.
    pub port: u8,
    /// Our address on it.
    pub local: std::net::IpAddr,
    /// Its prefix length: the peer's answer must be on the same subnet.
    pub prefix_len: u8,
}
