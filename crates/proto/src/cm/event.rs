//! What a [`super::CmAgent`] reports to its user.

use rdma_wire::cm::{MessageRef, RejectReason, RepRepr, ReqRepr, SidrStatus};
use rdma_wire::time::IbaTime;

use super::{CmPath, ConnHandle};

/// A REQ for a service we listen on: a new passive connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqReceived {
    /// The new connection (state REQ_RCVD, or MRA_REQ_SENT with [`super::AgentConfig::delayed_mra`]).
    pub conn: ConnHandle,
    /// The service id of the listener it matched.
    pub listener: u64,
    /// Where it came from (the runtime's source address; answers go there).
    pub path: CmPath,
    /// Every field of the REQ, private data (92 bytes, zero padded) included.
    pub req: Box<ReqRepr>,
}

/// A REP answering our REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepReceived {
    /// The connection (state REP_RCVD or MRA_REP_SENT): move the QP to RTR/RTS, then
    /// [`super::CmAgent::send_rtu`].
    pub conn: ConnHandle,
    /// Every field of the REP, private data (196 bytes) included.
    pub rep: Box<RepRepr>,
}

/// A REJ for one of our connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejReceived {
    /// The connection (now IDLE, or TIMEWAIT if it had exchanged QPNs).
    pub conn: ConnHandle,
    /// The reason (`rdma_cm` reports it as the REJECTED event's status).
    pub reason: RejectReason,
    /// Which message was rejected.
    pub message_rejected: MessageRef,
    /// The additional reject information (its meaningful bytes).
    pub ari: Vec<u8>,
    /// The private data (148 bytes, zero padded).
    pub private_data: Vec<u8>,
}

/// A SIDR_REQ for a service we listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReqReceived {
    /// The new exchange (state SIDR_REQ_RCVD): answer with [`super::CmAgent::send_sidr_rep`].
    pub conn: ConnHandle,
    /// The service id of the listener.
    pub listener: u64,
    /// Where it came from.
    pub path: CmPath,
    /// The requester's request id.
    pub request_id: u32,
    /// The partition key.
    pub partition_key: u16,
    /// The private data (216 bytes).
    pub private_data: Vec<u8>,
}

/// The SIDR_REP answering our SIDR_REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRepReceived {
    /// The exchange (now IDLE).
    pub conn: ConnHandle,
    /// Status (success, or why not).
    pub status: SidrStatus,
    /// The remote UD QPN.
    pub qpn: u32,
    /// The remote Q_Key.
    pub q_key: u32,
    /// Additional information (its meaningful bytes).
    pub additional_information: Vec<u8>,
    /// Private data (136 bytes).
    pub private_data: Vec<u8>,
}

/// An event of a [`super::CmAgent`], drained with [`super::CmAgent::poll_event`].
///
/// The IB CM events map to `rdma_cm` ones: `ReqReceived` → CONNECT_REQUEST,
/// `RepReceived` → CONNECT_RESPONSE (ESTABLISHED once the RTU is sent), `Established` →
/// ESTABLISHED, `RejReceived` → REJECTED, `ReqTimeout`/`RepTimeout`/`SidrReqTimeout` →
/// UNREACHABLE (`-ETIMEDOUT`), `DreqReceived`/`DrepReceived`/`DreqTimeout` → DISCONNECTED
/// (see [`CmEvent::is_disconnect`]), `TimewaitExit` → TIMEWAIT_EXIT.
///
/// No event is reported for a destroyed connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ arrived for a listener.
    ReqReceived(ReqReceived),
    /// A REP arrived for our REQ.
    RepReceived(RepReceived),
    /// The connection is established: RTU sent (active), RTU received or
    /// [`super::CmAgent::establish`] (passive), or a DREQ arrived in REP_SENT (the peer's RTU
    /// was lost; the DREQ proves the peer was established, and is reported next).
    Established {
        /// The connection.
        conn: ConnHandle,
    },
    /// A REJ arrived.
    RejReceived(RejReceived),
    /// An MRA arrived: the peer needs more time; our wait was extended.
    MraReceived {
        /// The connection.
        conn: ConnHandle,
        /// The peer's service timeout.
        service_timeout: IbaTime,
    },
    /// The peer disconnects (state DREQ_RCVD): answer with [`super::CmAgent::send_drep`].
    DreqReceived {
        /// The connection.
        conn: ConnHandle,
        /// Private data (220 bytes).
        private_data: Vec<u8>,
    },
    /// The peer answered our DREQ (state TIMEWAIT).
    DrepReceived {
        /// The connection.
        conn: ConnHandle,
        /// Private data (224 bytes).
        private_data: Vec<u8>,
    },
    /// Our DREQ went unanswered after every retry (state TIMEWAIT).
    DreqTimeout {
        /// The connection.
        conn: ConnHandle,
    },
    /// The timewait is over (state IDLE): the connection may be destroyed.
    TimewaitExit {
        /// The connection.
        conn: ConnHandle,
    },
    /// Our REQ went unanswered after every retry (state IDLE).
    ReqTimeout {
        /// The connection.
        conn: ConnHandle,
    },
    /// Our REP went unanswered after every retry (state IDLE).
    RepTimeout {
        /// The connection.
        conn: ConnHandle,
    },
    /// A SIDR_REQ arrived for a listener.
    SidrReqReceived(SidrReqReceived),
    /// A SIDR_REP arrived for our SIDR_REQ.
    SidrRepReceived(SidrRepReceived),
    /// Our SIDR_REQ went unanswered after every retry (state IDLE).
    SidrReqTimeout {
        /// The exchange.
        conn: ConnHandle,
    },
}

impl CmEvent {
    /// The connection the event is about.
    pub fn conn(&self) -> ConnHandle {
        match self {
            CmEvent::ReqReceived(e) => e.conn,
            CmEvent::RepReceived(e) => e.conn,
            CmEvent::RejReceived(e) => e.conn,
            CmEvent::SidrReqReceived(e) => e.conn,
            CmEvent::SidrRepReceived(e) => e.conn,
            CmEvent::Established { conn }
            | CmEvent::MraReceived { conn, .. }
            | CmEvent::DreqReceived { conn, .. }
            | CmEvent::DrepReceived { conn, .. }
            | CmEvent::DreqTimeout { conn }
            | CmEvent::TimewaitExit { conn }
            | CmEvent::ReqTimeout { conn }
            | CmEvent::RepTimeout { conn }
            | CmEvent::SidrReqTimeout { conn } => *conn,
        }
    }

    /// True for the events `rdma_cm` reports as DISCONNECTED.
    pub fn is_disconnect(&self) -> bool {
        matches!(
            self,
            CmEvent::DreqReceived { .. }
                | CmEvent::DrepReceived { .. }
                | CmEvent::DreqTimeout { .. }
        )
    }

    /// True for the events `rdma_cm` reports as UNREACHABLE.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            CmEvent::ReqTimeout { .. }
                | CmEvent::RepTimeout { .. }
                | CmEvent::SidrReqTimeout { .. }
        )
    }
}
