//! SIDR_REP, ServiceIDResReqResp (IBA vol1 12.11.2, table 120; attribute 0x0018).

use super::{ClassPortInfoRepr, CM_PAYLOAD_LEN};
use crate::layout::{array, bytes_field, check_bits, check_out, code_enum, view};
use crate::Result;

/// Length of the SIDR_REP additional information (bytes 24..96).
pub const SIDR_REP_ADDITIONAL_INFORMATION_LEN: usize = 72;
/// Length of the SIDR_REP private data (bytes 96..232).
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;

code_enum! {
    /// The status of a SIDR_REP (IBA table 121; Linux's `enum ib_cm_sidr_status`).
    ///
    /// ```
    /// use rdma_wire::cm::SidrStatus;
    /// assert_eq!(SidrStatus::from(0), SidrStatus::Success);
    /// assert_eq!(u8::from(SidrStatus::Redirect), 4);
    /// ```
    pub enum SidrStatus: u8 {
        /// 0: the QPN and Q_Key are valid.
        Success = 0,
        /// 1: the service id is not supported.
        Unsupported = 1,
        /// 2: the service provider rejected the request.
        Reject = 2,
        /// 3: no QP available.
        NoQp = 3,
        /// 4: redirect; the additional information holds a ClassPortInfo.
        Redirect = 4,
        /// 5: unsupported class version.
        UnsupportedVersion = 5,
    }
    /// Any other value.
    other Other
}

view! {
    /// A zero-copy view of a SIDR_REP message.
    ///
    /// ```
    /// use rdma_wire::cm::{SidrRep, CM_PAYLOAD_LEN};
    /// let mut buf = [0u8; CM_PAYLOAD_LEN];
    /// let mut r = SidrRep::new_checked(&mut buf[..]).unwrap();
    /// r.set_qpn(0x12);
    /// r.set_q_key(0x0123_4567);
    /// assert_eq!(&buf[8..12], &[0, 0, 0x12, 0]);
    /// ```
    pub struct SidrRep, len = CM_PAYLOAD_LEN;
    /// RequestID (echoes the SIDR_REQ's).
    request_id / set_request_id: u32(0);
    /// Status.
    status / set_status: u8(4);
    /// Additional Information Length.
    additional_information_length / set_additional_information_length: u8(5);
    /// QPN (24 bits).
    qpn / set_qpn: u24(8);
    /// ServiceID.
    service_id / set_service_id: u64(12);
    /// Q_Key.
    q_key / set_q_key: u32(20);
}

bytes_field!(SidrRep,
    /// Additional Information (72 bytes): a ClassPortInfo when the status is Redirect.
    additional_information / additional_information_mut: 24..96);
bytes_field!(SidrRep,
    /// PrivateData (136 bytes).
    private_data / private_data_mut: 96..CM_PAYLOAD_LEN);

/// A SIDR_REP as plain values.
///
/// ```
/// use rdma_wire::cm::{SidrRepRepr, SidrStatus, CM_PAYLOAD_LEN};
/// let r = SidrRepRepr {
///     request_id: 0x10a9_434f,
///     status: SidrStatus::Success,
///     additional_information_length: 0,
///     qpn: 0x12,
///     service_id: 0x0000_0000_0111_4853,
///     q_key: 0x0123_4567,
///     additional_information: [0; 72],
///     private_data: [0; 136],
/// };
/// let mut buf = [0u8; CM_PAYLOAD_LEN];
/// r.emit(&mut buf).unwrap();
/// assert_eq!(SidrRepRepr::parse(&buf).unwrap(), r);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SidrRepRepr {
    /// RequestID.
    pub request_id: u32,
    /// Status.
    pub status: SidrStatus,
    /// Additional Information Length.
    pub additional_information_length: u8,
    /// QPN (24 bits).
    pub qpn: u32,
    /// ServiceID.
    pub service_id: u64,
    /// Q_Key.
    pub q_key: u32,
    /// Additional Information (ClassPortInfo on redirect).
    pub additional_information: [u8; SIDR_REP_ADDITIONAL_INFORMATION_LEN],
    /// PrivateData.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA_LEN],
}

impl SidrRepRepr {
    /// Length on the wire.
    pub const LEN: usize = CM_PAYLOAD_LEN;

    /// Reads a SIDR_REP from the first 232 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let v = SidrRep::new_checked(buf)?;
        Ok(SidrRepRepr {
            request_id: v.request_id(),
            status: v.status().into(),
            additional_information_length: v.additional_information_length(),
            qpn: v.qpn(),
            service_id: v.service_id(),
            q_key: v.q_key(),
            additional_information: array(v.additional_information(), 0),
            private_data: array(v.private_data(), 0),
        })
    }

    /// The additional information read as a ClassPortInfo (meaningful for
    /// [`SidrStatus::Redirect`]).
    pub fn class_port_info(&self) -> ClassPortInfoRepr {
        ClassPortInfoRepr::from_bytes(&self.additional_information)
    }

    /// Writes the SIDR_REP into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        check_bits(self.qpn.into(), 24, "sidr_rep.qpn")?;
        buf[..Self::LEN].fill(0);
        let mut v = SidrRep::new_unchecked(buf);
        v.set_request_id(self.request_id);
        v.set_status(self.status.into());
        v.set_additional_information_length(self.additional_information_length);
        v.set_qpn(self.qpn);
        v.set_service_id(self.service_id);
        v.set_q_key(self.q_key);
        v.additional_information_mut()
            .copy_from_slice(&self.additional_information);
        v.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}
