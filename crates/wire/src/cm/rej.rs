//! REJ, ConnectReject (IBA vol1 12.6.7, table 108; attribute 0x0012).

use super::{MessageRef, CM_PAYLOAD_LEN};
use crate::layout::{array, bytes_field, check_bits, check_out, code_enum, view};
use crate::Result;

/// Length of the Additional Reject Information (bytes 12..84).
pub const REJ_ARI_LEN: usize = 72;
/// Length of the REJ private data (bytes 84..232).
pub const REJ_PRIVATE_DATA_LEN: usize = 148;

code_enum! {
    /// The reason of a REJ (IBA table 109; Linux's `enum ib_cm_rej_reason`).
    ///
    /// `From<u16>` maps every code with a name to its variant and only the others to
    /// [`RejectReason::Other`], so a parsed value is always canonical.
    ///
    /// ```
    /// use rdma_wire::cm::RejectReason;
    /// assert_eq!(RejectReason::from(8), RejectReason::InvalidServiceId);
    /// assert_eq!(u16::from(RejectReason::ConsumerDefined), 28);
    /// assert_eq!(RejectReason::from(34), RejectReason::Other(34));
    /// ```
    pub enum RejectReason: u16 {
        /// 1: no QP available.
        NoQp = 1,
        /// 2: no EE context available.
        NoEec = 2,
        /// 3: no resources available.
        NoResources = 3,
        /// 4: timeout (Linux sends it when a cm_id in REQ_SENT is destroyed).
        Timeout = 4,
        /// 5: unsupported request.
        Unsupported = 5,
        /// 6: invalid communication id.
        InvalidCommId = 6,
        /// 7: invalid communication instance.
        InvalidCommInstance = 7,
        /// 8: invalid service id (Linux's answer when nobody listens).
        InvalidServiceId = 8,
        /// 9: invalid transport service type.
        InvalidTransportType = 9,
        /// 10: stale connection.
        StaleConn = 10,
        /// 11: RDC does not exist.
        RdcNotExist = 11,
        /// 12: primary remote port GID rejected.
        InvalidGid = 12,
        /// 13: primary remote port LID rejected.
        InvalidLid = 13,
        /// 14: invalid primary SL.
        InvalidSl = 14,
        /// 15: invalid primary traffic class.
        InvalidTrafficClass = 15,
        /// 16: invalid primary hop limit.
        InvalidHopLimit = 16,
        /// 17: invalid primary packet rate.
        InvalidPacketRate = 17,
        /// 18: alternate remote port GID rejected.
        InvalidAltGid = 18,
        /// 19: alternate remote port LID rejected.
        InvalidAltLid = 19,
        /// 20: invalid alternate SL.
        InvalidAltSl = 20,
        /// 21: invalid alternate traffic class.
        InvalidAltTrafficClass = 21,
        /// 22: invalid alternate hop limit.
        InvalidAltHopLimit = 22,
        /// 23: invalid alternate packet rate.
        InvalidAltPacketRate = 23,
        /// 24: port and CM redirection (ARI holds a ClassPortInfo).
        PortCmRedirect = 24,
        /// 25: port redirection.
        PortRedirect = 25,
        /// 26: invalid path MTU.
        InvalidMtu = 26,
        /// 27: insufficient responder resources.
        InsufficientRespResources = 27,
        /// 28: consumer reject (`rdma_reject`, and Linux's passive side on destroy).
        ConsumerDefined = 28,
        /// 29: invalid RNR retry count.
        InvalidRnrRetry = 29,
        /// 30: duplicate local communication id.
        DuplicateLocalCommId = 30,
        /// 31: unsupported class version.
        InvalidClassVersion = 31,
        /// 32: invalid primary flow label.
        InvalidFlowLabel = 32,
        /// 33: invalid alternate flow label.
        InvalidAltFlowLabel = 33,
        /// 35: vendor option (ECE) not supported.
        VendorOptionNotSupported = 35,
    }
    /// Any other code (34 has no name in Linux).
    other Other
}

view! {
    /// A zero-copy view of a REJ message.
    ///
    /// ```
    /// use rdma_wire::cm::{Rej, RejectReason, CM_PAYLOAD_LEN};
    /// let mut buf = [0u8; CM_PAYLOAD_LEN];
    /// let mut rej = Rej::new_checked(&mut buf[..]).unwrap();
    /// rej.set_reason(8);
    /// rej.set_reject_info_length(8);
    /// assert_eq!(RejectReason::from(rej.reason()), RejectReason::InvalidServiceId);
    /// assert_eq!(buf[9], 8 << 1);
    /// ```
    pub struct Rej, len = CM_PAYLOAD_LEN;
    /// Local Communication ID.
    local_comm_id / set_local_comm_id: u32(0);
    /// Remote Communication ID.
    remote_comm_id / set_remote_comm_id: u32(4);
    /// Message REJected (2 bits: 0 REQ, 1 REP, 2 none).
    message_rejected / set_message_rejected: bits(8, 6, 2);
    /// Reject Info Length (7 bits): how many ARI bytes are meaningful.
    reject_info_length / set_reject_info_length: bits(9, 1, 7);
    /// Reason.
    reason / set_reason: u16(10);
}

bytes_field!(Rej,
    /// Additional Reject Information (72 bytes).
    additional_reject_information / additional_reject_information_mut: 12..84);
bytes_field!(Rej,
    /// PrivateData (148 bytes).
    private_data / private_data_mut: 84..CM_PAYLOAD_LEN);

/// A REJ as plain values.
///
/// ```
/// use rdma_wire::cm::{MessageRef, RejRepr, RejectReason, CM_PAYLOAD_LEN};
/// let rej = RejRepr {
///     local_comm_id: 0,
///     remote_comm_id: 0x747e_ca91,
///     message_rejected: MessageRef::Req,
///     reject_info_length: 0,
///     reason: RejectReason::InvalidServiceId,
///     additional_reject_information: [0; 72],
///     private_data: [0; 148],
/// };
/// let mut buf = [0u8; CM_PAYLOAD_LEN];
/// rej.emit(&mut buf).unwrap();
/// assert_eq!(&buf[10..12], &[0, 8]);
/// assert_eq!(RejRepr::parse(&buf).unwrap(), rej);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RejRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Message REJected.
    pub message_rejected: MessageRef,
    /// Reject Info Length (7 bits).
    pub reject_info_length: u8,
    /// Reason.
    pub reason: RejectReason,
    /// Additional Reject Information (ARI).
    pub additional_reject_information: [u8; REJ_ARI_LEN],
    /// PrivateData.
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl RejRepr {
    /// Length on the wire.
    pub const LEN: usize = CM_PAYLOAD_LEN;

    /// Reads a REJ from the first 232 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let v = Rej::new_checked(buf)?;
        Ok(RejRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            message_rejected: v.message_rejected().into(),
            reject_info_length: v.reject_info_length(),
            reason: v.reason().into(),
            additional_reject_information: array(v.additional_reject_information(), 0),
            private_data: array(v.private_data(), 0),
        })
    }

    /// The meaningful ARI bytes: the first `reject_info_length` (at most 72).
    pub fn ari(&self) -> &[u8] {
        let n = usize::from(self.reject_info_length).min(REJ_ARI_LEN);
        &self.additional_reject_information[..n]
    }

    /// Writes the REJ into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        let msg = u8::from(self.message_rejected);
        check_bits(msg.into(), 2, "rej.message_rejected")?;
        check_bits(self.reject_info_length.into(), 7, "rej.reject_info_length")?;
        buf[..Self::LEN].fill(0);
        let mut v = Rej::new_unchecked(buf);
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_message_rejected(msg);
        v.set_reject_info_length(self.reject_info_length);
        v.set_reason(self.reason.into());
        v.additional_reject_information_mut()
            .copy_from_slice(&self.additional_reject_information);
        v.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}
