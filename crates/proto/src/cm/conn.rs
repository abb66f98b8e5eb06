//! One connection's state and the messages it formats.

use rdma_wire::cm::{
    CmMadRepr, CmMessage, DrepRepr, DreqRepr, MessageRef, MraRepr, RejRepr, RejectReason, RtuRepr,
    DREP_PRIVATE_DATA_LEN, DREQ_PRIVATE_DATA_LEN, MRA_PRIVATE_DATA_LEN, REJ_ARI_LEN,
    REJ_PRIVATE_DATA_LEN, RTU_PRIVATE_DATA_LEN,
};
use rdma_wire::mad::MAD_LEN;
use rdma_wire::time::IbaTime;

use super::pace::ReqSlot;
use super::timers::Retx;

use super::{CmError, CmPath, CmState, ConnHandle, Nanos};

/// A 256-byte MAD.
pub(crate) type MadBuf = [u8; MAD_LEN];

/// Everything the agent knows about one connection or SIDR exchange.
#[derive(Debug, Clone)]
pub(crate) struct Conn {
    pub(crate) handle: ConnHandle,
    pub(crate) state: CmState,
    /// Our communication id (the request id for SIDR).
    pub(crate) local_id: u32,
    /// The peer's communication id, 0 until known (the peer's request id for SIDR).
    pub(crate) remote_id: u32,
    pub(crate) remote_ca_guid: u64,
    /// The peer; every message for this connection must come from its GID.
    pub(crate) path: CmPath,
    pub(crate) service_id: u64,
    /// The listener a passive connection came through.
    pub(crate) listener: Option<u64>,
    pub(crate) local_qpn: u32,
    pub(crate) remote_qpn: u32,
    /// Transaction id of the current exchange (REQ's for REQ/REP/RTU/REJ/MRA, DREQ's for
    /// DREQ/DREP).
    pub(crate) tid: u64,
    /// The message waiting for an answer, if any.
    pub(crate) retx: Option<Retx>,
    /// Wait for an answer to our REQ/REP/DREQ.
    pub(crate) response_timeout: Nanos,
    pub(crate) max_cm_retries: u8,
    /// Packet life time (for MRA extension).
    pub(crate) plt: IbaTime,
    /// How long TIMEWAIT lasts.
    pub(crate) timewait: Nanos,
    pub(crate) timewait_deadline: Option<Nanos>,
    /// The last answer we sent that a duplicate must get again (RTU, DREP, MRA).
    pub(crate) last_response: Option<Box<MadBuf>>,
    /// Destroyed by the user while in TIMEWAIT: kept silently until the timewait ends.
    pub(crate) destroyed: bool,
    /// The deadline this connection has in the agent's timer index.
    pub(crate) scheduled: Option<Nanos>,
    /// Alternate path and LAP state.
    pub(crate) ap: super::lap::Ap,
    /// The REQ's place in its peer's window ([`super::pace`]).
    pub(crate) slot: ReqSlot,
    /// Counted as a half-open passive connection ([`super::pace::Pacing::open`]).
    pub(crate) half_open: bool,
}

impl Conn {
    /// The earliest time this connection needs to be woken.
    pub(crate) fn deadline(&self) -> Option<Nanos> {
        // A parked REQ has not been sent: its timer starts when it is.
        let r = self
            .retx
            .as_ref()
            .filter(|_| self.slot != ReqSlot::Parked)
            .map(|r| r.deadline);
        match (r, self.timewait_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Enters TIMEWAIT: cancels any retransmission and arms the timewait timer.
    pub(crate) fn enter_timewait(&mut self, now: Nanos) {
        self.retx = None;
        self.state = CmState::Timewait;
        self.timewait_deadline = Some(now.saturating_add(self.timewait));
    }

    /// Back to IDLE: no timer, nothing outstanding.
    pub(crate) fn reset_to_idle(&mut self) {
        self.retx = None;
        self.timewait_deadline = None;
        self.state = CmState::Idle;
    }

    /// A REJ as Linux's `cm_format_rej` writes it for the current state.
    pub(crate) fn format_rej(&self, reason: RejectReason, ari: &[u8], pd: &[u8]) -> Option<MadBuf> {
        let (local, msg) = match self.state {
            // Linux puts local comm id 0 in a REJ sent from REQ_RCVD.
            CmState::ReqRcvd => (0, MessageRef::Req),
            CmState::MraReqSent => (self.local_id, MessageRef::Req),
            CmState::RepRcvd | CmState::MraRepSent => (self.local_id, MessageRef::Rep),
            _ => (self.local_id, MessageRef::Other),
        };
        let ari_len = ari.len().min(REJ_ARI_LEN);
        let rej = RejRepr {
            local_comm_id: local,
            remote_comm_id: self.remote_id,
            message_rejected: msg,
            reject_info_length: ari_len as u8,
            reason,
            additional_reject_information: pad(&ari[..ari_len]).ok()?,
            private_data: pad(pd).ok()?,
        };
        emit(self.tid, CmMessage::Rej(rej))
    }

    /// An MRA for the REQ or REP we received.
    pub(crate) fn format_mra(&self, what: MessageRef, service_timeout: IbaTime) -> Option<MadBuf> {
        let mra = MraRepr {
            local_comm_id: self.local_id,
            remote_comm_id: self.remote_id,
            message_mraed: what,
            service_timeout,
            private_data: [0; MRA_PRIVATE_DATA_LEN],
        };
        emit(self.tid, CmMessage::Mra(mra))
    }

    pub(crate) fn format_rtu(&self, pd: &[u8]) -> Result<MadBuf, CmError> {
        let rtu = RtuRepr {
            local_comm_id: self.local_id,
            remote_comm_id: self.remote_id,
            private_data: pad_checked::<RTU_PRIVATE_DATA_LEN>(pd)?,
        };
        emit(self.tid, CmMessage::Rtu(rtu)).ok_or(CmError::InvalidParam("rtu"))
    }

    pub(crate) fn format_dreq(&self, pd: &[u8]) -> Result<MadBuf, CmError> {
        let dreq = DreqRepr {
            local_comm_id: self.local_id,
            remote_comm_id: self.remote_id,
            remote_qpn_eecn: self.remote_qpn,
            private_data: pad_checked::<DREQ_PRIVATE_DATA_LEN>(pd)?,
        };
        emit(self.tid, CmMessage::Dreq(dreq)).ok_or(CmError::InvalidParam("dreq"))
    }

    pub(crate) fn format_drep(&self, pd: &[u8]) -> Result<MadBuf, CmError> {
        let drep = DrepRepr {
            local_comm_id: self.local_id,
            remote_comm_id: self.remote_id,
            private_data: pad_checked::<DREP_PRIVATE_DATA_LEN>(pd)?,
        };
        emit(self.tid, CmMessage::Drep(drep)).ok_or(CmError::InvalidParam("drep"))
    }
}

/// Formats a Send-method CM MAD; `None` only if a field is out of range.
pub(crate) fn emit(tid: u64, msg: CmMessage) -> Option<MadBuf> {
    let mut buf = [0u8; MAD_LEN];
    CmMadRepr::send(tid, msg).emit(&mut buf).ok()?;
    Some(buf)
}

/// Copies `data` into a zero-padded array, or `Err` if it is too long.
pub(crate) fn pad<const N: usize>(data: &[u8]) -> Result<[u8; N], usize> {
    if data.len() > N {
        return Err(data.len());
    }
    let mut out = [0u8; N];
    out[..data.len()].copy_from_slice(data);
    Ok(out)
}

/// [`pad`] with the API's error.
pub(crate) fn pad_checked<const N: usize>(data: &[u8]) -> Result<[u8; N], CmError> {
    pad::<N>(data).map_err(|len| CmError::PrivateDataTooLong { max: N, len })
}

/// The REJ Linux's `cm_issue_rej` sends to a message that matched no connection: local comm id
/// taken from the message's remote comm id field (0 for a REQ), remote comm id = its local one,
/// transaction id echoed.
pub(crate) fn issue_rej(
    tid: u64,
    local: u32,
    remote: u32,
    msg: MessageRef,
    reason: RejectReason,
) -> Option<MadBuf> {
    let rej = RejRepr {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: msg,
        reject_info_length: 0,
        reason,
        additional_reject_information: [0; REJ_ARI_LEN],
        private_data: [0; REJ_PRIVATE_DATA_LEN],
    };
    emit(tid, CmMessage::Rej(rej))
}
