//! MRA, MsgRcptAck (IBA vol1 12.6.6, table 107; attribute 0x0011).

use super::{MessageRef, CM_PAYLOAD_LEN};
use crate::layout::{array, bytes_field, check_bits, check_out, view};
use crate::time::IbaTime;
use crate::Result;

/// Length of the MRA private data (bytes 10..232).
pub const MRA_PRIVATE_DATA_LEN: usize = 222;

view! {
    /// A zero-copy view of an MRA message.
    ///
    /// ```
    /// use rdma_wire::cm::{Mra, CM_PAYLOAD_LEN};
    /// let mut buf = [0u8; CM_PAYLOAD_LEN];
    /// buf[9] = 0xc0; // what Linux sends: service timeout 24
    /// let mra = Mra::new_checked(&buf[..]).unwrap();
    /// assert_eq!(mra.service_timeout().value(), 24);
    /// assert_eq!(mra.message_mraed(), 0);
    /// ```
    pub struct Mra, len = CM_PAYLOAD_LEN;
    /// Local Communication ID.
    local_comm_id / set_local_comm_id: u32(0);
    /// Remote Communication ID.
    remote_comm_id / set_remote_comm_id: u32(4);
    /// Message MRAed (2 bits: 0 REQ, 1 REP, 2 LAP).
    message_mraed / set_message_mraed: bits(8, 6, 2);
    /// Service Timeout: how long the sender needs before it answers.
    service_timeout / set_service_timeout: time(9, 3);
}

bytes_field!(Mra,
    /// PrivateData (222 bytes).
    private_data / private_data_mut: 10..CM_PAYLOAD_LEN);

/// An MRA as plain values.
///
/// ```
/// use rdma_wire::cm::{MessageRef, MraRepr, CM_PAYLOAD_LEN};
/// use rdma_wire::time::IbaTime;
/// let mra = MraRepr {
///     local_comm_id: 1,
///     remote_comm_id: 2,
///     message_mraed: MessageRef::Req,
///     service_timeout: IbaTime::new(24).unwrap(),
///     private_data: [0; 222],
/// };
/// let mut buf = [0u8; CM_PAYLOAD_LEN];
/// mra.emit(&mut buf).unwrap();
/// assert_eq!(buf[9], 0xc0);
/// assert_eq!(MraRepr::parse(&buf).unwrap(), mra);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MraRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Message MRAed.
    pub message_mraed: MessageRef,
    /// Service Timeout.
    pub service_timeout: IbaTime,
    /// PrivateData.
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl MraRepr {
    /// Length on the wire.
    pub const LEN: usize = CM_PAYLOAD_LEN;

    /// Reads an MRA from the first 232 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let v = Mra::new_checked(buf)?;
        Ok(MraRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            message_mraed: v.message_mraed().into(),
            service_timeout: v.service_timeout(),
            private_data: array(v.private_data(), 0),
        })
    }

    /// Writes the MRA into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        let msg = u8::from(self.message_mraed);
        check_bits(msg.into(), 2, "mra.message_mraed")?;
        buf[..Self::LEN].fill(0);
        let mut v = Mra::new_unchecked(buf);
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_message_mraed(msg);
        v.set_service_timeout(self.service_timeout);
        v.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}
