//! The IB CM connection states (Linux's `enum ib_cm_state`).

/// The state of one CM connection (IBA vol1 12.9, Linux `enum ib_cm_state`).
///
/// ```
/// use rdma_proto::cm::CmState;
/// assert!(CmState::MraReqSent.is_passive_half_open());
/// assert!(!CmState::Established.is_passive_half_open());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CmState {
    /// Nothing in progress: a fresh, rejected, timed-out or post-timewait connection.
    Idle,
    /// A listener (not used for connections; kept for the complete enum).
    Listen,
    /// Active: REQ sent, waiting for REP/REJ/MRA.
    ReqSent,
    /// Passive: REQ received, the application has not answered.
    ReqRcvd,
    /// Passive: REQ received and an MRA sent or prepared ("send only on duplicate").
    MraReqSent,
    /// Active: REQ sent and an MRA for it received (waiting longer).
    MraReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Active: REP received, the application has not sent the RTU yet.
    RepRcvd,
    /// Active: REP received and an MRA for it sent or prepared.
    MraRepSent,
    /// Passive: REP sent and an MRA for it received.
    MraRepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received, the application has not sent the DREP yet.
    DreqRcvd,
    /// Disconnected; the ids stay reserved until the timewait expires.
    Timewait,
    /// SIDR_REQ sent, waiting for SIDR_REP.
    SidrReqSent,
    /// SIDR_REQ received, the application has not answered.
    SidrReqRcvd,
}

impl CmState {
    /// Passive states before the REP: what a listener's backlog counts.
    pub const fn is_passive_half_open(self) -> bool {
        matches!(self, CmState::ReqRcvd | CmState::MraReqSent)
    }

    /// States in which a REQ or REP has been exchanged and the remote ids are known and live
    /// (what stale-connection detection looks at).
    pub(crate) const fn holds_remote(self) -> bool {
        matches!(
            self,
            CmState::ReqRcvd
                | CmState::MraReqSent
                | CmState::RepSent
                | CmState::MraRepRcvd
                | CmState::RepRcvd
                | CmState::MraRepSent
                | CmState::Established
                | CmState::DreqSent
                | CmState::DreqRcvd
                | CmState::Timewait
        )
    }
}
