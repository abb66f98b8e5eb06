//! DREQ, DisconnectRequest (IBA vol1 12.6.10, table 112; attribute 0x0015).

use super::CM_PAYLOAD_LEN;
use crate::layout::{array, bytes_field, check_bits, check_out, view};
use crate::Result;

/// Length of the DREQ private data (bytes 12..232).
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;

view! {
    /// A zero-copy view of a DREQ message.
    ///
    /// ```
    /// use rdma_wire::cm::{Dreq, CM_PAYLOAD_LEN};
    /// let mut buf = [0u8; CM_PAYLOAD_LEN];
    /// Dreq::new_checked(&mut buf[..]).unwrap().set_remote_qpn_eecn(0x11);
    /// assert_eq!(&buf[8..12], &[0, 0, 0x11, 0]);
    /// ```
    pub struct Dreq, len = CM_PAYLOAD_LEN;
    /// Local Communication ID.
    local_comm_id / set_local_comm_id: u32(0);
    /// Remote Communication ID.
    remote_comm_id / set_remote_comm_id: u32(4);
    /// Remote QPN/EECN (24 bits): the peer's QP being disconnected.
    remote_qpn_eecn / set_remote_qpn_eecn: u24(8);
}

bytes_field!(Dreq,
    /// PrivateData (220 bytes).
    private_data / private_data_mut: 12..CM_PAYLOAD_LEN);

/// A DREQ as plain values.
///
/// ```
/// use rdma_wire::cm::{DreqRepr, CM_PAYLOAD_LEN};
/// let d = DreqRepr { local_comm_id: 1, remote_comm_id: 2, remote_qpn_eecn: 0x12, private_data: [0; 220] };
/// let mut buf = [0u8; CM_PAYLOAD_LEN];
/// d.emit(&mut buf).unwrap();
/// assert_eq!(DreqRepr::parse(&buf).unwrap(), d);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DreqRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits).
    pub remote_qpn_eecn: u32,
    /// PrivateData.
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl DreqRepr {
    /// Length on the wire.
    pub const LEN: usize = CM_PAYLOAD_LEN;

    /// Reads a DREQ from the first 232 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let v = Dreq::new_checked(buf)?;
        Ok(DreqRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            remote_qpn_eecn: v.remote_qpn_eecn(),
            private_data: array(v.private_data(), 0),
        })
    }

    /// Writes the DREQ into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        check_bits(self.remote_qpn_eecn.into(), 24, "dreq.remote_qpn_eecn")?;
        buf[..Self::LEN].fill(0);
        let mut v = Dreq::new_unchecked(buf);
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_remote_qpn_eecn(self.remote_qpn_eecn);
        v.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}
