//! DREP, DisconnectReply (IBA vol1 12.6.11, table 113; attribute 0x0016).

use super::CM_PAYLOAD_LEN;
use crate::layout::{array, bytes_field, check_out, view};
use crate::Result;

/// Length of the DREP private data (bytes 8..232).
pub const DREP_PRIVATE_DATA_LEN: usize = 224;

view! {
    /// A zero-copy view of a DREP message.
    ///
    /// ```
    /// use rdma_wire::cm::{Drep, CM_PAYLOAD_LEN};
    /// let mut buf = [0u8; CM_PAYLOAD_LEN];
    /// Drep::new_checked(&mut buf[..]).unwrap().set_remote_comm_id(0x0c78_20a6);
    /// assert_eq!(Drep::new_checked(&buf[..]).unwrap().remote_comm_id(), 0x0c78_20a6);
    /// ```
    pub struct Drep, len = CM_PAYLOAD_LEN;
    /// Local Communication ID.
    local_comm_id / set_local_comm_id: u32(0);
    /// Remote Communication ID.
    remote_comm_id / set_remote_comm_id: u32(4);
}

bytes_field!(Drep,
    /// PrivateData (224 bytes).
    private_data / private_data_mut: 8..CM_PAYLOAD_LEN);

/// A DREP as plain values.
///
/// ```
/// use rdma_wire::cm::{DrepRepr, CM_PAYLOAD_LEN};
/// let drep = DrepRepr { local_comm_id: 1, remote_comm_id: 2, private_data: [7; 224] };
/// let mut buf = [0u8; CM_PAYLOAD_LEN];
/// drep.emit(&mut buf).unwrap();
/// assert_eq!(DrepRepr::parse(&buf).unwrap(), drep);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DrepRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// PrivateData.
    pub private_data: [u8; DREP_PRIVATE_DATA_LEN],
}

impl DrepRepr {
    /// Length on the wire.
    pub const LEN: usize = CM_PAYLOAD_LEN;

    /// Reads a DREP from the first 232 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let v = Drep::new_checked(buf)?;
        Ok(DrepRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            private_data: array(v.private_data(), 0),
        })
    }

    /// Writes the DREP into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        let mut v = Drep::new_unchecked(buf);
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}
