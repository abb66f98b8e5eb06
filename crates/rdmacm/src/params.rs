//! What events and connect / accept carry: event types and connection parameters.

use std::fmt;
use std::net::SocketAddr;

/// The type of an event (`enum rdma_cm_event_type`). [`fmt::Display`] prints the name
/// `rdma_event_str` prints.
///
/// ```
/// use rdmacm::cm::EventType;
/// assert_eq!(EventType::AddrResolved.to_string(), "RDMA_CM_EVENT_ADDR_RESOLVED");
/// assert_eq!(EventType::TimewaitExit.to_string(), "RDMA_CM_EVENT_TIMEWAIT_EXIT");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Address resolution finished (status 0).
    AddrResolved,
    /// Address resolution failed (status `-errno`: `-ETIMEDOUT`, `-EHOSTUNREACH`, `-ENODEV` ...).
    AddrError,
    /// Route resolution finished.
    RouteResolved,
    /// Route resolution failed (status `-errno`).
    RouteError,
    /// A connection request arrived on a listener: the event carries a new id
    /// ([`Event::take_id`](crate::cm::Event::take_id)) and the listener ([`Event::listen_id`](crate::cm::Event::listen_id)).
    ConnectRequest,
    /// A REP arrived for an id without a QP of ours (a user QP given by
    /// [`ConnParam::qp_num`]): set the QP up from [`Event::param`](crate::cm::Event::param), then
    /// [`CmId::establish`](crate::cm::CmId::establish).
    ConnectResponse,
    /// Setting up the QP after the REP failed (status `-errno`).
    ConnectError,
    /// The peer's CM did not answer (REQ or REP retries exhausted, status `-ETIMEDOUT`), or
    /// SIDR failed (status: the SIDR status).
    Unreachable,
    /// The peer rejected: status is the IB CM reject reason (8: nobody listens on the port,
    /// 28: the application or the listener lookup rejected), with the REJ's private data.
    Rejected,
    /// The connection is established.
    Established,
    /// The connection is down: DREQ or DREP received (status 0) or our DREQ timed out
    /// (`-ETIMEDOUT`).
    Disconnected,
    /// The id's device went away; destroy the id.
    DeviceRemoval,
    /// A multicast join finished ([`crate::cm::CmId::join_multicast`]; [`crate::cm::Event::mcast`]).
    MulticastJoin,
    /// A multicast join failed, or its group was lost (the netdev went down, the address
    /// went away).
    MulticastError,
    /// The route, neighbour, source address or netdev under the id changed (a hint: the id
    /// keeps its device and path; status 0). On a wildcard listener, with status
    /// `-EADDRINUSE`: an address it cannot hear on, named by
    /// [`Event::addr`](crate::cm::Event::addr), because another process (another user: UDP 4791
    /// is unprivileged) holds UDP 4791 there; requests to that address do not reach this
    /// listener, the others still do. That use is rdmacm-specific (Linux has no such
    /// event: its UDP port belongs to the kernel).
    AddrChange,
    /// The timewait after a disconnect is over: the QP may be reused.
    TimewaitExit,
}

impl EventType {
    /// The name `rdma_event_str` gives.
    pub fn name(self) -> &'static str {
        match self {
            EventType::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            EventType::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            EventType::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            EventType::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            EventType::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            EventType::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            EventType::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            EventType::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            EventType::Rejected => "RDMA_CM_EVENT_REJECTED",
            EventType::Established => "RDMA_CM_EVENT_ESTABLISHED",
            EventType::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            EventType::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            EventType::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            EventType::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            EventType::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            EventType::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `struct rdma_conn_param`: what connect and accept put in the REQ / REP.
///
/// ```
/// let p = rdmacm::cm::ConnParam { private_data: b"hello".to_vec(), ..Default::default() };
/// assert_eq!((p.retry_count, p.rnr_retry_count), (7, 7));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data: at most 56 bytes on connect (after the 36-byte IP CM header), 196 on
    /// accept, 148 on reject; more is `EINVAL`.
    pub private_data: Vec<u8>,
    /// RDMA READ / atomic operations the peer may have outstanding at us.
    pub responder_resources: u8,
    /// RDMA READ / atomic operations we may have outstanding at the peer.
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retry count (0-7).
    pub retry_count: u8,
    /// RNR retry count (0-7, 7 = infinite).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// A QP the application manages itself (no [`CmId::create_qp`](crate::cm::CmId::create_qp)): its number goes in
    /// the REQ/REP, and the active side gets CONNECT_RESPONSE instead of ESTABLISHED.
    pub qp_num: Option<u32>,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: None,
        }
    }
}

/// The connection parameters an event carries (`event->param.conn`), plus the peer's QP
/// number and starting PSN for applications that manage their own QP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnEventParam {
    /// The private data of the message behind the event (CONNECT_REQUEST: the user part
    /// after the IP CM header, 56 bytes; ESTABLISHED / CONNECT_RESPONSE on the active side:
    /// the REP's 196; REJECTED: the REJ's 148; DISCONNECTED: the DREQ's or DREP's). Zero
    /// padded as on the wire: carry your own length.
    pub private_data: Vec<u8>,
    /// The peer's responder resources.
    pub responder_resources: u8,
    /// The peer's initiator depth.
    pub initiator_depth: u8,
    /// The peer's flow control bit.
    pub flow_control: bool,
    /// The peer's RNR retry count.
    pub rnr_retry_count: u8,
    /// The peer uses an SRQ.
    pub srq: bool,
    /// The peer's QP number.
    pub qp_num: u32,
    /// The PSN the peer expects to receive first (our send PSN).
    pub starting_psn: u32,
}

/// The UD parameters of an ESTABLISHED event in the UDP port space (`event->param.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdParam {
    /// The peer's UD QP number.
    pub qp_num: u32,
    /// The peer's Q_Key.
    pub qkey: u32,
    /// The peer's address.
    pub peer: SocketAddr,
}

/// What the CM queues for a channel until `get_event` hands it out.
#[derive(Debug)]
pub(crate) struct PendingEvent {
    pub id: u64,
    pub kind: EventType,
    pub status: i32,
    pub param: ConnEventParam,
    pub ud: Option<UdParam>,
    pub listen_id: Option<u64>,
    /// A MULTICAST_JOIN's group, context and address handle (`crate::cm::mcast`).
    pub mc: Option<Box<McastJoined>>,
    /// The local address a listener's ADDR_CHANGE with an error status is about.
    pub addr: Option<std::net::IpAddr>,
}

/// The destination QPN of every datagram to a group.
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// What a MULTICAST_JOIN (or MULTICAST_ERROR) event says about its join
/// ([`crate::cm::Event::mcast`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McastJoined {
    /// The group's address.
    pub group: std::net::IpAddr,
    /// The context given to [`crate::cm::CmId::join_multicast`] (Linux: `param.ud.private_data`).
    pub context: u64,
    /// Address handle attributes to send to the group (`param.ud.ah_attr`): its MGID, the
    /// id's source GID index, hop limit 64, the id's TOS.
    pub ah_attr: rdma_soft::verbs::PathAttr,
    /// The device port (`ah_attr.port_num`): create the handle with
    /// `ProtectionDomain::create_ah_on(port_num, &ah_attr)`.
    pub port_num: u8,
    /// The join was send-only.
    pub send_only: bool,
}
