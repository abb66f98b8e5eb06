//! REQ, ConnectRequest (IBA vol1 12.6.5, table 106; attribute 0x0010).

use super::{CmPathRepr, CM_PAYLOAD_LEN};
use crate::layout::{array, bytes_field, check_bits, check_out, view};
use crate::time::IbaTime;
use crate::Result;

/// Length of the REQ private data (bytes 140..232).
pub const REQ_PRIVATE_DATA_LEN: usize = 92;

const PD: usize = CM_PAYLOAD_LEN - REQ_PRIVATE_DATA_LEN;

view! {
    /// A zero-copy view of a REQ message (the 232-byte data of its MAD).
    ///
    /// ```
    /// use rdma_wire::cm::{Req, CM_PAYLOAD_LEN};
    /// let mut buf = [0u8; CM_PAYLOAD_LEN];
    /// let mut req = Req::new_checked(&mut buf[..]).unwrap();
    /// req.set_service_id(0x0000_0000_0106_1b58);
    /// req.set_local_qpn(0x11);
    /// req.set_responder_resources(1);
    /// assert_eq!(req.local_qpn(), 0x11);
    /// assert_eq!(&buf[32..36], &[0, 0, 0x11, 1]);
    /// ```
    pub struct Req, len = CM_PAYLOAD_LEN;
    /// Local Communication ID.
    local_comm_id / set_local_comm_id: u32(0);
    /// ServiceID.
    service_id / set_service_id: u64(8);
    /// Local CA GUID.
    local_ca_guid / set_local_ca_guid: u64(16);
    /// Local Q_Key.
    local_q_key / set_local_q_key: u32(28);
    /// Local QPN (24 bits).
    local_qpn / set_local_qpn: u24(32);
    /// Responder Resources.
    responder_resources / set_responder_resources: u8(35);
    /// Local EECN (24 bits).
    local_eecn / set_local_eecn: u24(36);
    /// Initiator Depth.
    initiator_depth / set_initiator_depth: u8(39);
    /// Remote EECN (24 bits).
    remote_eecn / set_remote_eecn: u24(40);
    /// Remote CM Response Timeout.
    remote_cm_response_timeout / set_remote_cm_response_timeout: time(43, 3);
    /// Transport Service Type (2 bits: 0 RC, 1 UC, 2 RD, 3 extended).
    transport_service_type / set_transport_service_type: bits(43, 1, 2);
    /// End-to-End Flow Control.
    end_to_end_flow_control / set_end_to_end_flow_control: flag(43, 0);
    /// Starting PSN (24 bits): the PSN the sender expects to receive first.
    starting_psn / set_starting_psn: u24(44);
    /// Local CM Response Timeout.
    local_cm_response_timeout / set_local_cm_response_timeout: time(47, 3);
    /// Retry Count (3 bits).
    retry_count / set_retry_count: bits(47, 0, 3);
    /// Partition Key.
    partition_key / set_partition_key: u16(48);
    /// Path Packet Payload MTU (4 bits: 1 = 256 ... 5 = 4096).
    path_packet_payload_mtu / set_path_packet_payload_mtu: bits(50, 4, 4);
    /// RDC Exists.
    rdc_exists / set_rdc_exists: flag(50, 3);
    /// RNR Retry Count (3 bits; 7 = infinite).
    rnr_retry_count / set_rnr_retry_count: bits(50, 0, 3);
    /// Max CM Retries (4 bits).
    max_cm_retries / set_max_cm_retries: bits(51, 4, 4);
    /// SRQ.
    srq / set_srq: flag(51, 3);
    /// Extended Transport Type (3 bits).
    extended_transport_type / set_extended_transport_type: bits(51, 0, 3);
    /// Primary Local Port LID.
    primary_local_port_lid / set_primary_local_port_lid: u16(52);
    /// Primary Remote Port LID.
    primary_remote_port_lid / set_primary_remote_port_lid: u16(54);
    /// Primary Local Port GID.
    primary_local_port_gid / set_primary_local_port_gid: gid(56);
    /// Primary Remote Port GID.
    primary_remote_port_gid / set_primary_remote_port_gid: gid(72);
    /// Primary Flow Label (20 bits).
    primary_flow_label / set_primary_flow_label: word(88, 12, 20);
    /// Primary Packet Rate (6 bits).
    primary_packet_rate / set_primary_packet_rate: bits(91, 0, 6);
    /// Primary Traffic Class.
    primary_traffic_class / set_primary_traffic_class: u8(92);
    /// Primary Hop Limit.
    primary_hop_limit / set_primary_hop_limit: u8(93);
    /// Primary SL (4 bits).
    primary_sl / set_primary_sl: bits(94, 4, 4);
    /// Primary Subnet Local.
    primary_subnet_local / set_primary_subnet_local: flag(94, 3);
    /// Primary Local ACK Timeout.
    primary_local_ack_timeout / set_primary_local_ack_timeout: time(95, 3);
    /// Alternate Local Port LID.
    alternate_local_port_lid / set_alternate_local_port_lid: u16(96);
    /// Alternate Remote Port LID.
    alternate_remote_port_lid / set_alternate_remote_port_lid: u16(98);
    /// Alternate Local Port GID.
    alternate_local_port_gid / set_alternate_local_port_gid: gid(100);
    /// Alternate Remote Port GID.
    alternate_remote_port_gid / set_alternate_remote_port_gid: gid(116);
    /// Alternate Flow Label (20 bits).
    alternate_flow_label / set_alternate_flow_label: word(132, 12, 20);
    /// Alternate Packet Rate (6 bits).
    alternate_packet_rate / set_alternate_packet_rate: bits(135, 0, 6);
    /// Alternate Traffic Class.
    alternate_traffic_class / set_alternate_traffic_class: u8(136);
    /// Alternate Hop Limit.
    alternate_hop_limit / set_alternate_hop_limit: u8(137);
    /// Alternate SL (4 bits).
    alternate_sl / set_alternate_sl: bits(138, 4, 4);
    /// Alternate Subnet Local.
    alternate_subnet_local / set_alternate_subnet_local: flag(138, 3);
    /// Alternate Local ACK Timeout.
    alternate_local_ack_timeout / set_alternate_local_ack_timeout: time(139, 3);
    /// SAP Supported (the bit after the alternate local ACK timeout; Linux's
    /// `CM_REQ_SAP_SUPPORTED`).
    sap_supported / set_sap_supported: flag(139, 2);
}

bytes_field!(Req,
    /// PrivateData (92 bytes; rdma_cm puts its IP CM header in the first 36).
    private_data / private_data_mut: PD..CM_PAYLOAD_LEN);

impl<T: AsRef<[u8]>> Req<T> {
    /// The primary path fields.
    pub fn primary_path(&self) -> CmPathRepr {
        CmPathRepr {
            local_port_lid: self.primary_local_port_lid(),
            remote_port_lid: self.primary_remote_port_lid(),
            local_port_gid: self.primary_local_port_gid(),
            remote_port_gid: self.primary_remote_port_gid(),
            flow_label: self.primary_flow_label(),
            packet_rate: self.primary_packet_rate(),
            traffic_class: self.primary_traffic_class(),
            hop_limit: self.primary_hop_limit(),
            sl: self.primary_sl(),
            subnet_local: self.primary_subnet_local(),
            local_ack_timeout: self.primary_local_ack_timeout(),
        }
    }

    /// The alternate path fields (all zero when there is no alternate path).
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

impl<T: AsRef<[u8]> + AsMut<[u8]>> Req<T> {
    /// Sets every primary path field.
    pub fn set_primary_path(&mut self, p: &CmPathRepr) {
        self.set_primary_local_port_lid(p.local_port_lid);
        self.set_primary_remote_port_lid(p.remote_port_lid);
        self.set_primary_local_port_gid(p.local_port_gid);
        self.set_primary_remote_port_gid(p.remote_port_gid);
        self.set_primary_flow_label(p.flow_label);
        self.set_primary_packet_rate(p.packet_rate);
        self.set_primary_traffic_class(p.traffic_class);
        self.set_primary_hop_limit(p.hop_limit);
        self.set_primary_sl(p.sl);
        self.set_primary_subnet_local(p.subnet_local);
        self.set_primary_local_ack_timeout(p.local_ack_timeout);
    }

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

/// A REQ as plain values.
///
/// ```
/// use rdma_wire::cm::{ReqRepr, CM_PAYLOAD_LEN};
/// let mut buf = [0u8; CM_PAYLOAD_LEN];
/// let mut req = ReqRepr::parse(&buf).unwrap();
/// req.local_comm_id = 0x747e_ca91;
/// req.starting_psn = 0x38_9caa;
/// req.emit(&mut buf).unwrap();
/// assert_eq!(&buf[44..47], &[0x38, 0x9c, 0xaa]);
/// assert_eq!(ReqRepr::parse(&buf).unwrap(), req);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReqRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// ServiceID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_q_key: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder Resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator Depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM Response Timeout.
    pub remote_cm_response_timeout: IbaTime,
    /// Transport Service Type (2 bits).
    pub transport_service_type: u8,
    /// End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Local CM Response Timeout.
    pub local_cm_response_timeout: IbaTime,
    /// Retry Count (3 bits).
    pub retry_count: u8,
    /// Partition Key.
    pub partition_key: u16,
    /// Path Packet Payload MTU (4 bits).
    pub path_packet_payload_mtu: u8,
    /// RDC Exists.
    pub rdc_exists: bool,
    /// RNR Retry Count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM Retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Extended Transport Type (3 bits).
    pub extended_transport_type: u8,
    /// The primary path.
    pub primary_path: CmPathRepr,
    /// The alternate path (all zero when unused).
    pub alternate_path: CmPathRepr,
    /// SAP Supported.
    pub sap_supported: bool,
    /// PrivateData.
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl ReqRepr {
    /// Length on the wire.
    pub const LEN: usize = CM_PAYLOAD_LEN;

    /// Reads a REQ from the first 232 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let v = Req::new_checked(buf)?;
        Ok(ReqRepr {
            local_comm_id: v.local_comm_id(),
            service_id: v.service_id(),
            local_ca_guid: v.local_ca_guid(),
            local_q_key: v.local_q_key(),
            local_qpn: v.local_qpn(),
            responder_resources: v.responder_resources(),
            local_eecn: v.local_eecn(),
            initiator_depth: v.initiator_depth(),
            remote_eecn: v.remote_eecn(),
            remote_cm_response_timeout: v.remote_cm_response_timeout(),
            transport_service_type: v.transport_service_type(),
            end_to_end_flow_control: v.end_to_end_flow_control(),
            starting_psn: v.starting_psn(),
            local_cm_response_timeout: v.local_cm_response_timeout(),
            retry_count: v.retry_count(),
            partition_key: v.partition_key(),
            path_packet_payload_mtu: v.path_packet_payload_mtu(),
            rdc_exists: v.rdc_exists(),
            rnr_retry_count: v.rnr_retry_count(),
            max_cm_retries: v.max_cm_retries(),
            srq: v.srq(),
            extended_transport_type: v.extended_transport_type(),
            primary_path: v.primary_path(),
            alternate_path: v.alternate_path(),
            sap_supported: v.sap_supported(),
            private_data: array(v.private_data(), 0),
        })
    }

    /// Writes the REQ into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        check_bits(self.local_qpn.into(), 24, "req.local_qpn")?;
        check_bits(self.local_eecn.into(), 24, "req.local_eecn")?;
        check_bits(self.remote_eecn.into(), 24, "req.remote_eecn")?;
        check_bits(
            self.transport_service_type.into(),
            2,
            "req.transport_service_type",
        )?;
        check_bits(self.starting_psn.into(), 24, "req.starting_psn")?;
        check_bits(self.retry_count.into(), 3, "req.retry_count")?;
        check_bits(
            self.path_packet_payload_mtu.into(),
            4,
            "req.path_packet_payload_mtu",
        )?;
        check_bits(self.rnr_retry_count.into(), 3, "req.rnr_retry_count")?;
        check_bits(self.max_cm_retries.into(), 4, "req.max_cm_retries")?;
        check_bits(
            self.extended_transport_type.into(),
            3,
            "req.extended_transport_type",
        )?;
        self.primary_path.check()?;
        self.alternate_path.check()?;
        buf[..Self::LEN].fill(0);
        let mut v = Req::new_unchecked(buf);
        v.set_local_comm_id(self.local_comm_id);
        v.set_service_id(self.service_id);
        v.set_local_ca_guid(self.local_ca_guid);
        v.set_local_q_key(self.local_q_key);
        v.set_local_qpn(self.local_qpn);
        v.set_responder_resources(self.responder_resources);
        v.set_local_eecn(self.local_eecn);
        v.set_initiator_depth(self.initiator_depth);
        v.set_remote_eecn(self.remote_eecn);
        v.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        v.set_transport_service_type(self.transport_service_type);
        v.set_end_to_end_flow_control(self.end_to_end_flow_control);
        v.set_starting_psn(self.starting_psn);
        v.set_local_cm_response_timeout(self.local_cm_response_timeout);
        v.set_retry_count(self.retry_count);
        v.set_partition_key(self.partition_key);
        v.set_path_packet_payload_mtu(self.path_packet_payload_mtu);
        v.set_rdc_exists(self.rdc_exists);
        v.set_rnr_retry_count(self.rnr_retry_count);
        v.set_max_cm_retries(self.max_cm_retries);
        v.set_srq(self.srq);
        v.set_extended_transport_type(self.extended_transport_type);
        v.set_primary_path(&self.primary_path);
        v.set_alternate_path(&self.alternate_path);
        v.set_sap_supported(self.sap_supported);
        v.private_data_mut().copy_from_slice(&self.private_data);
        Ok(())
    }
}
