//! Addresses, handles, configuration and the parameters of the API calls.

use std::net::Ipv6Addr;

use rdma_wire::cm::SidrStatus;
use rdma_wire::time::IbaTime;

use super::Nanos;

/// The path a MAD travels, in the CM's own terms: the two GIDs, an opaque `tag` the runtime
/// uses to name the netdev it arrived on or leaves through, and the traffic class its IP
/// header carries. Each connection keeps the path it was made on; answers to a MAD that
/// matches no connection go back along its arrival path.
///
/// The agent reads only [`CmPath::remote_gid`] (every message of a connection must come from
/// its peer's GID) and sets the traffic class of a passive connection from its REQ.
///
/// ```
/// use rdma_proto::cm::CmPath;
/// let p = CmPath::new("::ffff:192.0.2.1".parse().unwrap(), "::ffff:192.0.2.3".parse().unwrap(), 2);
/// assert!(p.same_node(&CmPath { tag: 7, ..p }));
/// assert_eq!(p.with_traffic_class(0x48).traffic_class, 0x48);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmPath {
    /// Our GID on this path (IPv4 as IPv4-mapped IPv6).
    pub local_gid: Ipv6Addr,
    /// The peer's GID.
    pub remote_gid: Ipv6Addr,
    /// The runtime's name for the netdev (opaque to the CM).
    pub tag: u32,
    /// The IPv4 TOS / IPv6 traffic class of the MADs sent on this path.
    pub traffic_class: u8,
}

impl CmPath {
    /// A path with traffic class 0.
    pub const fn new(local_gid: Ipv6Addr, remote_gid: Ipv6Addr, tag: u32) -> Self {
        CmPath {
            local_gid,
            remote_gid,
            tag,
            traffic_class: 0,
        }
    }

    /// The same path with another traffic class.
    pub const fn with_traffic_class(self, traffic_class: u8) -> Self {
        CmPath {
            traffic_class,
            ..self
        }
    }

    /// True if both lead to the same CM peer (same remote GID).
    pub fn same_node(&self, other: &CmPath) -> bool {
        self.remote_gid == other.remote_gid
    }
}

/// A MAD to send (to QP1 of the peer) and the path it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmTransmit {
    /// Where it goes.
    pub path: CmPath,
    /// The 256-byte MAD.
    pub mad: [u8; rdma_wire::mad::MAD_LEN],
}

/// A connection (or SIDR exchange) of a [`super::CmAgent`]. Never reused by an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnHandle(pub u64);

/// What a listener does with a REQ beyond its limits ([`AgentConfig::listen_backlog`],
/// [`AgentConfig::max_half_open_per_peer`], [`AgentConfig::max_conns`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OverloadPolicy {
    /// Drop it silently: the requester retries (Linux: a full `rdma_cm` backlog makes the
    /// handler fail with `-ENOMEM` and the REQ is dropped).
    Drop,
    /// Answer REJ reason 3 (no resources).
    Reject,
}

/// The configuration of a [`super::CmAgent`].
///
/// ```
/// use rdma_proto::cm::AgentConfig;
/// let c = AgentConfig { ca_guid: 0x5054_00ff_fe00_0202, seed: 7, ..AgentConfig::default() };
/// assert!(c.delayed_mra);
/// assert_eq!(c.mra_service_timeout.value(), 24);
/// ```
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The local CA GUID put in REQ/REP and in the ARI of a REJ "timeout".
    pub ca_guid: u64,
    /// Seed of the random source (a ChaCha stream) that draws comm ids, transaction ids
    /// and PSNs; give it OS randomness outside tests (`rdmacm` does), as they go on the wire
    /// and a peer that could predict them could forge CM messages.
    pub seed: u64,
    /// `rdma_cm`'s MRA behaviour: on a REQ (passive) or REP (active), prepare an MRA without
    /// sending it, and send it only when a duplicate arrives while the application has not
    /// answered (states MRA_REQ_SENT / MRA_REP_SENT). When false, the connection waits in
    /// REQ_RCVD / REP_RCVD, where duplicates are dropped, until [`super::CmAgent::send_mra`].
    pub delayed_mra: bool,
    /// Service timeout in the MRAs we send (`rdma_cm`: 24, about 68.7 s).
    pub mra_service_timeout: IbaTime,
    /// Packet life time assumed for paths we did not set up (the passive side adds it to the
    /// service timeout of a received MRA).
    pub packet_life_time: IbaTime,
    /// Most passive connections per listener not yet answered (REQ_RCVD / MRA_REQ_SENT).
    pub listen_backlog: usize,
    /// Most unanswered passive connections from one peer GID, across listeners.
    pub max_half_open_per_peer: usize,
    /// Most connections (of any state, SIDR included) the agent holds.
    pub max_conns: usize,
    /// What to do with a REQ over these limits.
    pub overload: OverloadPolicy,
    /// Most REQs to one peer GID sent and not answered yet (REP, REJ or MRA); 0: no limit.
    /// A REQ beyond it waits, unsent and without a timer, until one is answered, times out
    /// or is destroyed: a storm of connects then reaches the peer at the rate it answers
    /// instead of overflowing its backlog (Linux's 1024) and timing out in waves. It counts
    /// toward the connect's wait; [`super::CmStats::paced`] counts the REQs that waited.
    pub req_window: usize,
    /// Each wait for an answer (REQ, REP, DREQ, LAP, SIDR_REQ) lasts its timeout plus a
    /// random extra of up to half of it, so that messages sent together are resent spread
    /// out instead of in waves (a storm). Off: exactly the timeout, as Linux.
    pub retry_jitter: bool,
    /// REQ and DREQ resends inside the first attempt's wait, on a ladder: with `n`, after
    /// timeout/2^(n+1), then /2^n ... /4 (at least [`super::EARLY_MIN_NS`] each; with 3: at
    /// 1/16, 3/16 and 7/16 of the timeout), so a lost REQ, REP, DREQ or DREP costs a
    /// fraction of a second instead of a whole CM response timeout (4.6 s for `rdma_cm` over
    /// RoCE). The regular retries keep Linux's times, and a connect or disconnect gives up
    /// when it did, after `max_cm_retries` regular timeouts (with 0: at the first).
    /// Duplicates are harmless to the peer: a duplicate REQ is answered with the REP again
    /// (us), dropped, or draws the passive side's prepared MRA (Linux's `rdma_cm`), which
    /// ends the ladder (the REP then comes when the application accepts, or the peer's own
    /// REP retransmission); a duplicate DREQ is answered with the DREP again or dropped
    /// while the DREP is pending. REP, LAP and SIDR_REQ keep Linux's schedule. 0: Linux's
    /// schedule everywhere.
    pub early_resends: u8,
    /// How long a REQ refused for want of a listener (REJ "invalid service id"), or a
    /// SIDR_REQ (SIDR_REP "service id not supported"), is resent before the refusal is
    /// reported (nanoseconds after the first refusal; 0: at once, as Linux). Resends follow
    /// 1 ms, 2 ms, 4 ms ... (at most 100 ms apart), each a fresh first attempt of the same
    /// message. For a peer whose application listens again right
    /// after telling us to connect (perftest's `-R` does, racing its own client): its
    /// listener then gets the REQ instead of the application a refusal.
    pub no_listener_retry: Nanos,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            ca_guid: 0,
            seed: 0,
            delayed_mra: true,
            mra_service_timeout: IbaTime::from_bits_truncate(24),
            packet_life_time: IbaTime::from_bits_truncate(16),
            listen_backlog: 1024,
            max_half_open_per_peer: 1024,
            max_conns: 65536,
            overload: OverloadPolicy::Drop,
            req_window: 256,
            retry_jitter: true,
            early_resends: 3,
            no_listener_retry: 0,
        }
    }
}

/// The primary path of a connection, as the REQ carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PathParams {
    /// Our GID (the source IP, IPv4-mapped for IPv4).
    pub local_gid: Ipv6Addr,
    /// The peer's GID.
    pub remote_gid: Ipv6Addr,
    /// Local port LID (0xFFFF, permissive, on RoCE as Linux sends).
    pub local_lid: u16,
    /// Remote port LID (0xFFFF on RoCE).
    pub remote_lid: u16,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// IBA rate code (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Path MTU code (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// Local ACK timeout for the QP; also the timewait (`cm_convert_to_ms` of it).
    pub local_ack_timeout: IbaTime,
    /// Packet life time of the path (RoCE: 16).
    pub packet_life_time: IbaTime,
}

impl Default for PathParams {
    fn default() -> Self {
        PathParams {
            local_gid: Ipv6Addr::UNSPECIFIED,
            remote_gid: Ipv6Addr::UNSPECIFIED,
            local_lid: 0xffff,
            remote_lid: 0xffff,
            flow_label: 0,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            mtu: 3,
            local_ack_timeout: IbaTime::from_bits_truncate(17),
            packet_life_time: IbaTime::from_bits_truncate(16),
        }
    }
}

/// Parameters of [`super::CmAgent::send_req`], defaults as `rdma_cm` over RoCE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqParams {
    /// Service id (for `rdma_cm`, port space and port: see `rdma_wire::ip_cm::ServiceId`).
    pub service_id: u64,
    /// The path to send the REQ on (and every later MAD of the connection).
    pub cm_path: CmPath,
    /// Our QPN (24 bits).
    pub local_qpn: u32,
    /// The PSN we expect to receive first (24 bits).
    pub starting_psn: u32,
    /// The primary path.
    pub path: PathParams,
    /// Responder resources (RDMA READ / atomic depth we accept).
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count (3 bits, 7 = infinite).
    pub rnr_retry_count: u8,
    /// How long the peer's CM may take to answer (rdma_cm: 20).
    pub remote_cm_response_timeout: IbaTime,
    /// How long our CM may take to answer (rdma_cm: 20).
    pub local_cm_response_timeout: IbaTime,
    /// REQ retransmissions before giving up (4 bits, rdma_cm: 15).
    pub max_cm_retries: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// Partition key (0xFFFF on RoCE).
    pub partition_key: u16,
    /// Transport service type (2 bits: 0 RC, 1 UC).
    pub transport_service_type: u8,
    /// Private data, at most 92 bytes (including the 36-byte IP CM header for rdma_cm).
    pub private_data: Vec<u8>,
    /// An alternate path for automatic path migration (the REQ's alternate path fields);
    /// `None` (rdma_cm's choice) leaves them zero.
    pub alternate_path: Option<PathParams>,
}

impl ReqParams {
    /// Parameters with `rdma_cm`'s defaults; fill in `path` GIDs and private data.
    pub fn new(service_id: u64, cm_path: CmPath, local_qpn: u32, starting_psn: u32) -> Self {
        ReqParams {
            service_id,
            cm_path,
            local_qpn,
            starting_psn,
            path: PathParams {
                local_gid: cm_path.local_gid,
                remote_gid: cm_path.remote_gid,
                ..PathParams::default()
            },
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            remote_cm_response_timeout: IbaTime::from_bits_truncate(20),
            local_cm_response_timeout: IbaTime::from_bits_truncate(20),
            max_cm_retries: 15,
            flow_control: false,
            srq: false,
            partition_key: 0xffff,
            transport_service_type: 0,
            private_data: Vec::new(),
            alternate_path: None,
        }
    }
}

/// Parameters of [`super::CmAgent::send_rep`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepParams {
    /// Our QPN (24 bits).
    pub local_qpn: u32,
    /// The PSN we expect to receive first (24 bits).
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay.
    pub target_ack_delay: IbaTime,
    /// Failover accepted (2 bits: 0 accepted, 1 rejected, 2 unsupported).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// Private data, at most 196 bytes.
    pub private_data: Vec<u8>,
}

impl RepParams {
    /// Parameters with `rdma_cm`'s defaults.
    pub fn new(local_qpn: u32, starting_psn: u32) -> Self {
        RepParams {
            local_qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            target_ack_delay: IbaTime::MIN,
            failover_accepted: 0,
            flow_control: false,
            rnr_retry_count: 7,
            srq: false,
            private_data: Vec::new(),
        }
    }
}

/// Parameters of [`super::CmAgent::send_sidr_req`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReqParams {
    /// Service id.
    pub service_id: u64,
    /// The path to send it on.
    pub cm_path: CmPath,
    /// Partition key.
    pub partition_key: u16,
    /// Wait per attempt (rdma_cm: 20, i.e. `1 << (20 - 8)` ms).
    pub timeout: IbaTime,
    /// Retransmissions before giving up (rdma_cm: 15).
    pub max_retries: u8,
    /// Private data, at most 216 bytes (including the IP CM header for rdma_cm).
    pub private_data: Vec<u8>,
}

impl SidrReqParams {
    /// Parameters with `rdma_cm`'s defaults.
    pub fn new(service_id: u64, cm_path: CmPath) -> Self {
        SidrReqParams {
            service_id,
            cm_path,
            partition_key: 0xffff,
            timeout: IbaTime::from_bits_truncate(20),
            max_retries: 15,
            private_data: Vec::new(),
        }
    }
}

/// Parameters of [`super::CmAgent::send_sidr_rep`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRepParams {
    /// Status (0 success).
    pub status: SidrStatus,
    /// The UD QPN (24 bits).
    pub qpn: u32,
    /// The Q_Key (rdma_cm: 0x01234567).
    pub q_key: u32,
    /// Additional information, at most 72 bytes.
    pub additional_information: Vec<u8>,
    /// Private data, at most 136 bytes.
    pub private_data: Vec<u8>,
}

impl SidrRepParams {
    /// A successful answer.
    pub fn success(qpn: u32, q_key: u32) -> Self {
        SidrRepParams {
            status: SidrStatus::Success,
            qpn,
            q_key,
            additional_information: Vec::new(),
            private_data: Vec::new(),
        }
    }
}
