//! LAP, LoadAlternatePath (IBA vol1 12.8.1, table 115; attribute 0x0019).

use super::{CmPathRepr, CM_PAYLOAD_LEN};
use crate::layout::{array, bytes_field, check_bits, check_out, view};
use crate::time::IbaTime;
use crate::Result;

/// Length of the LAP private data (bytes 64..232).
pub const LAP_PRIVATE_DATA_LEN: usize = 168;

view! {
    /// A zero-copy view of a LAP message (its alternate path layout differs from the REQ's:
    /// traffic class, hop limit and packet rate come in another order).
    ///
    /// ```
    /// use rdma_wire::cm::{Lap, CM_PAYLOAD_LEN};
    /// let mut buf = [0u8; CM_PAYLOAD_LEN];
    /// let mut lap = Lap::new_checked(&mut buf[..]).unwrap();
    /// lap.set_alternate_flow_label(0xabcde);
    /// lap.set_alternate_traffic_class(0x12);
    /// assert_eq!(&buf[56..60], &[0xab, 0xcd, 0xe0, 0x12]);
    /// ```
    pub struct Lap, len = CM_PAYLOAD_LEN;
    /// Local Communication ID.
    local_comm_id / set_local_comm_id: u32(0);
    /// Remote Communication ID.
    remote_comm_id / set_remote_comm_id: u32(4);
    /// Remote QPN/EECN (24 bits).
    remote_qpn_eecn / set_remote_qpn_eecn: u24(12);
    /// Remote CM Response Timeout.
    remote_cm_response_timeout / set_remote_cm_response_timeout: time(15, 3);
    /// Alternate Local Port LID.
    alternate_local_port_lid / set_alternate_local_port_lid: u16(20);
    /// Alternate Remote Port LID.
    alternate_remote_port_lid / set_alternate_remote_port_lid: u16(22);
    /// Alternate Local Port GID.
    alternate_local_port_gid / set_alternate_local_port_gid: gid(24);
    /// Alternate Remote Port GID.
    alternate_remote_port_gid / set_alternate_remote_port_gid: gid(40);
    /// Alternate Flow Label (20 bits).
    alternate_flow_label / set_alternate_flow_label: word(56, 12, 20);
    /// Alternate Traffic Class.
    alternate_traffic_class / set_alternate_traffic_class: u8(59);
    /// Alternate Hop Limit.
    alternate_hop_limit / set_alternate_hop_limit: u8(60);
    /// Alternate Packet Rate (6 bits).
    alternate_packet_rate / set_alternate_packet_rate: bits(61, 0, 6);
    /// Alternate SL (4 bits).
    alternate_sl / set_alternate_sl: bits(62, 4, 4);
    /// Alternate Subnet Local.
    alternate_subnet_local / set_alternate_subnet_local: flag(62, 3);
    /// Alternate Local ACK Timeout.
    alternate_local_ack_timeout / set_alternate_local_ack_timeout: time(63, 3);
}

bytes_field!(Lap,
    /// PrivateData (168 bytes).
    private_data / private_data_mut: 64..CM_PAYLOAD_LEN);

impl<T: AsRef<[u8]>> Lap<T> {
    /// The alternate path fields.
    pub fn alternate_path(&self) -> CmPathRepr {
        CmPathRepr {
            local_port_lid: self.alternate_local_port_lid(),
            remote_port_lid: self.alternate_remote_port_lid(),
            local_port_gid: self.alternate_local_port_gid(),
            remote_port_gid: self.alternate_remote_port_gid(),
            flow_label: self.alternate_flow_label(),
            packet_rate: self.alternate_packet_rate(),
            traffic_class: self.alternate_traffic_class(),
            hop_limit: self.alternate_hop_limit(),
            sl: self.alternate_sl(),
            subnet_local: self.alternate_subnet_local(),
            local_ack_timeout: self.alternate_local_ack_timeout(),
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Lap<T> {
    /// Sets every alternate path field.
    pub fn set_alternate_path(&mut self, p: &CmPathRepr) {
        self.set_alternate_local_port_lid(p.local_port_lid);
        self.set_alternate_remote_port_lid(p.remote_port_lid);
        self.set_alternate_local_port_gid(p.local_port_gid);
        self.set_alternate_remote_port_gid(p.remote_port_gid);
        self.set_alternate_flow_label(p.flow_label);
        self.set_alternate_packet_rate(p.packet_rate);
        self.set_alternate_traffic_class(p.traffic_class);
        self.set_alternate_hop_limit(p.hop_limit);
        self.set_alternate_sl(p.sl);
        self.set_alternate_subnet_local(p.subnet_local);
        self.set_alternate_local_ack_timeout(p.local_ack_timeout);
    }
}

/// A LAP as plain values.
///
/// ```
/// use rdma_wire::cm::{LapRepr, CM_PAYLOAD_LEN};
/// let mut buf = [0u8; CM_PAYLOAD_LEN];
/// let mut lap = LapRepr::parse(&buf).unwrap();
/// lap.alternate_path.hop_limit = 64;
/// lap.emit(&mut buf).unwrap();
/// assert_eq!(buf[60], 64);
/// assert_eq!(LapRepr::parse(&buf).unwrap(), lap);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LapRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits).
    pub remote_qpn_eecn: u32,
    /// Remote CM Response Timeout.
    pub remote_cm_response_timeout: IbaTime,
    /// The alternate path to load.
    pub alternate_path: CmPathRepr,
    /// PrivateData.
    pub private_data: [u8; LAP_PRIVATE_DATA_LEN],
}

impl LapRepr {
    /// Length on the wire.
    pub const LEN: usize = CM_PAYLOAD_LEN;

    /// Reads a LAP from the first 232 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let v = Lap::new_checked(buf)?;
        Ok(LapRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            remote_qpn_eecn: v.remote_qpn_eecn(),
            remote_cm_response_timeout: v.remote_cm_response_timeout(),
            alternate_path: v.alternate_path(),
            private_data: array(v.private_data(), 0),
        })
    }

    /// Writes the LAP into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        check_bits(self.remote_qpn_eecn.into(), 24, "lap.remote_qpn_eecn")?;
        self.alternate_path.check()?;
        buf[..Self::LEN].fill(0);
        let mut v = Lap::new_unchecked(buf);
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_remote_qpn_eecn(self.remote_qpn_eecn);
        v.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        v.set_alternate_path(&self.alternate_path);
        v.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}
