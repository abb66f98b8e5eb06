//! What a device is opened with ([`DeviceConfig`]) and what it reports
//! ([`DeviceAttr`], `ibv_query_device`); the active MTU a netdev MTU gives.

use rdma_proto::verbs::Mtu;

use crate::io::WireAddr;
use crate::verbs::port::PortConfig;
use crate::Result;

/// Worst-case bytes around a full-MTU payload: IPv6 (40) + UDP (8) + BTH (12) + RETH (16) +
/// ImmDt (4) + ICRC (4), as carried by RDMA WRITE ONLY with immediate over IPv6. Linux rxe
/// subtracts a fixed 80; ours is the exact worst case.
pub const ROCE_MAX_HEADERS: u32 = 40 + 8 + 12 + 16 + 4 + 4;

/// The active MTU for a netdev MTU, as rxe derives it: the largest IB MTU (256 to 4096) that
/// fits the netdev MTU less the RoCEv2 headers; `None` below 256.
///
/// ```
/// use rdma_soft::verbs::{active_mtu, Mtu};
/// assert_eq!(active_mtu(1500), Some(Mtu::Mtu1024));
/// assert_eq!(active_mtu(9000), Some(Mtu::Mtu4096));
/// assert_eq!(active_mtu(65536), Some(Mtu::Mtu4096)); // lo
/// assert_eq!(active_mtu(4180), Some(Mtu::Mtu4096));
/// assert_eq!(active_mtu(4179), Some(Mtu::Mtu2048));
/// assert_eq!(active_mtu(300), None);
/// ```
pub fn active_mtu(netdev_mtu: u32) -> Option<Mtu> {
    Mtu::fitting(netdev_mtu.checked_sub(ROCE_MAX_HEADERS)?)
}

/// Device attributes (`ibv_device_attr`, the fields a RoCEv2 device fills).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID (EUI-64 style, from the config).
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Supported page sizes.
    pub page_size_cap: u64,
    /// Vendor id (0: software).
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Queue pairs.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Scatter/gather elements per work request.
    pub max_sge: u32,
    /// Scatter/gather elements per RDMA READ.
    pub max_sge_rd: u32,
    /// Completion queues.
    pub max_cq: u32,
    /// Entries per completion queue.
    pub max_cqe: u32,
    /// Memory regions.
    pub max_mr: u32,
    /// Protection domains.
    pub max_pd: u32,
    /// Outstanding READ/atomic requests a QP accepts as responder.
    pub max_qp_rd_atom: u32,
    /// Outstanding READ/atomic requests a QP issues as requester.
    pub max_qp_init_rd_atom: u32,
    /// Shared receive queues.
    pub max_srq: u32,
    /// Work requests per SRQ.
    pub max_srq_wr: u32,
    /// Scatter/gather elements per SRQ work request.
    pub max_srq_sge: u32,
    /// P_Keys.
    pub max_pkeys: u16,
    /// Physical ports.
    pub phys_port_cnt: u8,
    /// Atomics are atomic against every access through this device (`IBV_ATOMIC_HCA`).
    pub atomic_hca: bool,
    /// Bytes of inline data per send work request.
    pub max_inline_data: u32,
    /// Largest message.
    pub max_msg_sz: u32,
}

/// How to open a [`Device`](super::Device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Device name (by default the netdev's name, as the design says).
    pub name: String,
    /// The netdev it is attached to.
    pub netdev: String,
    /// That netdev's MTU.
    pub netdev_mtu: u32,
    /// Whether the netdev is up.
    pub up: bool,
    /// The GID table: the netdev's addresses.
    pub gids: Vec<WireAddr>,
    /// Node GUID.
    pub node_guid: u64,
    /// Ports 2, 3, ...: a device group ([`DeviceConfig::group`]); empty for a one-port
    /// device. The fields above are port 1.
    pub more_ports: Vec<PortConfig>,
}

impl DeviceConfig {
    /// A device named after `netdev`, with its MTU read from the kernel, up, no GIDs yet
    /// (the layer that knows the host's addresses fills them in).
    pub fn for_netdev(netdev: &str) -> Result<DeviceConfig> {
        let netdev_mtu = crate::io::netdev_mtu(netdev)?;
        Ok(DeviceConfig {
            name: netdev.to_owned(),
            netdev: netdev.to_owned(),
            netdev_mtu,
            up: true,
            gids: Vec::new(),
            node_guid: 0,
            more_ports: Vec::new(),
        })
    }
}
