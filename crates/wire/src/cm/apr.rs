//! APR, AlternatePathResponse (IBA vol1 12.8.2, table 116; attribute 0x001A).

use super::CM_PAYLOAD_LEN;
use crate::layout::{array, bytes_field, check_out, code_enum, view};
use crate::Result;

/// Length of the APR additional information (bytes 12..84).
pub const APR_ADDITIONAL_INFORMATION_LEN: usize = 72;
/// Length of the APR private data (bytes 84..232).
pub const APR_PRIVATE_DATA_LEN: usize = 148;

code_enum! {
    /// The AP Status of an APR (IBA table 117; Linux's `enum ib_cm_apr_status`).
    ///
    /// ```
    /// use rdma_wire::cm::ApStatus;
    /// assert_eq!(ApStatus::from(0), ApStatus::Success);
    /// assert_eq!(ApStatus::from(200), ApStatus::Other(200));
    /// ```
    pub enum ApStatus: u8 {
        /// 0: alternate path loaded.
        Success = 0,
        /// 1: invalid communication id.
        InvalidCommId = 1,
        /// 2: alternate path not supported.
        Unsupported = 2,
        /// 3: rejected.
        Reject = 3,
        /// 4: redirect (additional information holds a ClassPortInfo).
        Redirect = 4,
        /// 5: the path is already the current one.
        IsCurrent = 5,
        /// 6: invalid QPN/EECN.
        InvalidQpnEecn = 6,
        /// 7: invalid alternate LID.
        InvalidLid = 7,
        /// 8: invalid alternate GID.
        InvalidGid = 8,
        /// 9: invalid alternate flow label.
        InvalidFlowLabel = 9,
        /// 10: invalid alternate traffic class.
        InvalidTrafficClass = 10,
        /// 11: invalid alternate hop limit.
        InvalidHopLimit = 11,
        /// 12: invalid alternate packet rate.
        InvalidPacketRate = 12,
        /// 13: invalid alternate SL.
        InvalidSl = 13,
    }
    /// Any other value.
    other Other
}

view! {
    /// A zero-copy view of an APR message.
    ///
    /// ```
    /// use rdma_wire::cm::{Apr, CM_PAYLOAD_LEN};
    /// let mut buf = [0u8; CM_PAYLOAD_LEN];
    /// Apr::new_checked(&mut buf[..]).unwrap().set_ap_status(5);
    /// assert_eq!(buf[9], 5);
    /// ```
    pub struct Apr, len = CM_PAYLOAD_LEN;
    /// Local Communication ID.
    local_comm_id / set_local_comm_id: u32(0);
    /// Remote Communication ID.
    remote_comm_id / set_remote_comm_id: u32(4);
    /// Additional Information Length.
    additional_information_length / set_additional_information_length: u8(8);
    /// AP Status.
    ap_status / set_ap_status: u8(9);
}

bytes_field!(Apr,
    /// Additional Information (72 bytes).
    additional_information / additional_information_mut: 12..84);
bytes_field!(Apr,
    /// PrivateData (148 bytes).
    private_data / private_data_mut: 84..CM_PAYLOAD_LEN);

/// An APR as plain values.
///
/// ```
/// use rdma_wire::cm::{ApStatus, AprRepr, CM_PAYLOAD_LEN};
/// let apr = AprRepr {
///     local_comm_id: 1,
///     remote_comm_id: 2,
///     additional_information_length: 0,
///     ap_status: ApStatus::Unsupported,
///     additional_information: [0; 72],
///     private_data: [0; 148],
/// };
/// let mut buf = [0u8; CM_PAYLOAD_LEN];
/// apr.emit(&mut buf).unwrap();
/// assert_eq!(AprRepr::parse(&buf).unwrap(), apr);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AprRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Additional Information Length.
    pub additional_information_length: u8,
    /// AP Status.
    pub ap_status: ApStatus,
    /// Additional Information.
    pub additional_information: [u8; APR_ADDITIONAL_INFORMATION_LEN],
    /// PrivateData.
    pub private_data: [u8; APR_PRIVATE_DATA_LEN],
}

impl AprRepr {
    /// Length on the wire.
    pub const LEN: usize = CM_PAYLOAD_LEN;

    /// Reads an APR from the first 232 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let v = Apr::new_checked(buf)?;
        Ok(AprRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            additional_information_length: v.additional_information_length(),
            ap_status: v.ap_status().into(),
            additional_information: array(v.additional_information(), 0),
            private_data: array(v.private_data(), 0),
        })
    }

    /// Writes the APR into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        buf[..Self::LEN].fill(0);
        let mut v = Apr::new_unchecked(buf);
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_additional_information_length(self.additional_information_length);
        v.set_ap_status(self.ap_status.into());
        v.additional_information_mut()
            .copy_from_slice(&self.additional_information);
        v.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}
