//! SIDR_REQ, ServiceIDResReq (IBA vol1 12.11.1, table 119; attribute 0x0017).

use super::CM_PAYLOAD_LEN;
use crate::layout::{array, bytes_field, check_out, view};
use crate::Result;

/// Length of the SIDR_REQ private data (bytes 16..232).
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;

view! {
    /// A zero-copy view of a SIDR_REQ message.
    ///
    /// ```
    /// use rdma_wire::cm::{SidrReq, CM_PAYLOAD_LEN};
    /// let mut buf = [0u8; CM_PAYLOAD_LEN];
    /// let mut r = SidrReq::new_checked(&mut buf[..]).unwrap();
    /// r.set_partition_key(0xffff);
    /// r.set_service_id(0x0000_0000_0111_4853);
    /// assert_eq!(&buf[4..6], &[0xff, 0xff]);
    /// ```
    pub struct SidrReq, len = CM_PAYLOAD_LEN;
    /// RequestID.
    request_id / set_request_id: u32(0);
    /// Partition Key.
    partition_key / set_partition_key: u16(4);
    /// ServiceID.
    service_id / set_service_id: u64(8);
}

bytes_field!(SidrReq,
    /// PrivateData (216 bytes; rdma_cm puts its IP CM header in the first 36).
    private_data / private_data_mut: 16..CM_PAYLOAD_LEN);

/// A SIDR_REQ as plain values.
///
/// ```
/// use rdma_wire::cm::{SidrReqRepr, CM_PAYLOAD_LEN};
/// let r = SidrReqRepr {
///     request_id: 0x10a9_434f,
///     partition_key: 0xffff,
///     service_id: 0x0000_0000_0111_4853,
///     private_data: [0; 216],
/// };
/// let mut buf = [0u8; CM_PAYLOAD_LEN];
/// r.emit(&mut buf).unwrap();
/// assert_eq!(SidrReqRepr::parse(&buf).unwrap(), r);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SidrReqRepr {
    /// RequestID.
    pub request_id: u32,
    /// Partition Key.
    pub partition_key: u16,
    /// ServiceID.
    pub service_id: u64,
    /// PrivateData.
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA_LEN],
}

impl SidrReqRepr {
    /// Length on the wire.
    pub const LEN: usize = CM_PAYLOAD_LEN;

    /// Reads a SIDR_REQ from the first 232 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let v = SidrReq::new_checked(buf)?;
        Ok(SidrReqRepr {
            request_id: v.request_id(),
            partition_key: v.partition_key(),
            service_id: v.service_id(),
            private_data: array(v.private_data(), 0),
        })
    }

    /// Writes the SIDR_REQ into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        buf[..Self::LEN].fill(0);
        let mut v = SidrReq::new_unchecked(buf);
        v.set_request_id(self.request_id);
        v.set_partition_key(self.partition_key);
        v.set_service_id(self.service_id);
        v.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}
