//! REP, ConnectReply (IBA vol1 12.6.8, table 110; attribute 0x0013).

use super::CM_PAYLOAD_LEN;
use crate::layout::{array, bytes_field, check_bits, check_out, view};
use crate::time::IbaTime;
use crate::Result;

/// Length of the REP private data (bytes 36..232).
pub const REP_PRIVATE_DATA_LEN: usize = 196;

view! {
    /// A zero-copy view of a REP message.
    ///
    /// ```
    /// use rdma_wire::cm::{Rep, CM_PAYLOAD_LEN};
    /// let mut buf = [0u8; CM_PAYLOAD_LEN];
    /// let mut rep = Rep::new_checked(&mut buf[..]).unwrap();
    /// rep.set_rnr_retry_count(7);
    /// rep.set_starting_psn(0xb3_52e3);
    /// assert_eq!(buf[27], 0xe0);
    /// assert_eq!(&buf[20..23], &[0xb3, 0x52, 0xe3]);
    /// ```
    pub struct Rep, len = CM_PAYLOAD_LEN;
    /// Local Communication ID.
    local_comm_id / set_local_comm_id: u32(0);
    /// Remote Communication ID.
    remote_comm_id / set_remote_comm_id: u32(4);
    /// Local Q_Key.
    local_q_key / set_local_q_key: u32(8);
    /// Local QPN (24 bits).
    local_qpn / set_local_qpn: u24(12);
    /// Local EE Context Number (24 bits).
    local_ee_context_number / set_local_ee_context_number: u24(16);
    /// Starting PSN (24 bits).
    starting_psn / set_starting_psn: u24(20);
    /// Responder Resources.
    responder_resources / set_responder_resources: u8(24);
    /// Initiator Depth.
    initiator_depth / set_initiator_depth: u8(25);
    /// Target ACK Delay.
    target_ack_delay / set_target_ack_delay: time(26, 3);
    /// Failover Accepted (2 bits: 0 accepted, 1 not supported, 2 rejected).
    failover_accepted / set_failover_accepted: bits(26, 1, 2);
    /// End-To-End Flow Control.
    end_to_end_flow_control / set_end_to_end_flow_control: flag(26, 0);
    /// RNR Retry Count (3 bits).
    rnr_retry_count / set_rnr_retry_count: bits(27, 5, 3);
    /// SRQ.
    srq / set_srq: flag(27, 4);
    /// Local CA GUID.
    local_ca_guid / set_local_ca_guid: u64(28);
}

bytes_field!(Rep,
    /// PrivateData (196 bytes).
    private_data / private_data_mut: 36..CM_PAYLOAD_LEN);

/// A REP as plain values.
///
/// ```
/// use rdma_wire::cm::{RepRepr, CM_PAYLOAD_LEN};
/// let mut buf = [0u8; CM_PAYLOAD_LEN];
/// let mut rep = RepRepr::parse(&buf).unwrap();
/// rep.local_qpn = 0x11;
/// rep.emit(&mut buf).unwrap();
/// assert_eq!(&buf[12..16], &[0, 0, 0x11, 0]);
/// assert_eq!(RepRepr::parse(&buf).unwrap(), rep);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RepRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_q_key: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EE Context Number (24 bits).
    pub local_ee_context_number: u32,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Responder Resources.
    pub responder_resources: u8,
    /// Initiator Depth.
    pub initiator_depth: u8,
    /// Target ACK Delay.
    pub target_ack_delay: IbaTime,
    /// Failover Accepted (2 bits).
    pub failover_accepted: u8,
    /// End-To-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// RNR Retry Count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// PrivateData.
    pub private_data: [u8; REP_PRIVATE_DATA_LEN],
}

impl RepRepr {
    /// Length on the wire.
    pub const LEN: usize = CM_PAYLOAD_LEN;

    /// Reads a REP from the first 232 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let v = Rep::new_checked(buf)?;
        Ok(RepRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            local_q_key: v.local_q_key(),
            local_qpn: v.local_qpn(),
            local_ee_context_number: v.local_ee_context_number(),
            starting_psn: v.starting_psn(),
            responder_resources: v.responder_resources(),
            initiator_depth: v.initiator_depth(),
            target_ack_delay: v.target_ack_delay(),
            failover_accepted: v.failover_accepted(),
            end_to_end_flow_control: v.end_to_end_flow_control(),
            rnr_retry_count: v.rnr_retry_count(),
            srq: v.srq(),
            local_ca_guid: v.local_ca_guid(),
            private_data: array(v.private_data(), 0),
        })
    }

    /// Writes the REP into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        check_bits(self.local_qpn.into(), 24, "rep.local_qpn")?;
        check_bits(
            self.local_ee_context_number.into(),
            24,
            "rep.local_ee_context_number",
        )?;
        check_bits(self.starting_psn.into(), 24, "rep.starting_psn")?;
        check_bits(self.failover_accepted.into(), 2, "rep.failover_accepted")?;
        check_bits(self.rnr_retry_count.into(), 3, "rep.rnr_retry_count")?;
        buf[..Self::LEN].fill(0);
        let mut v = Rep::new_unchecked(buf);
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_local_q_key(self.local_q_key);
        v.set_local_qpn(self.local_qpn);
        v.set_local_ee_context_number(self.local_ee_context_number);
        v.set_starting_psn(self.starting_psn);
        v.set_responder_resources(self.responder_resources);
        v.set_initiator_depth(self.initiator_depth);
        v.set_target_ack_delay(self.target_ack_delay);
        v.set_failover_accepted(self.failover_accepted);
        v.set_end_to_end_flow_control(self.end_to_end_flow_control);
        v.set_rnr_retry_count(self.rnr_retry_count);
        v.set_srq(self.srq);
        v.set_local_ca_guid(self.local_ca_guid);
        v.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}
