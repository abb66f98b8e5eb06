//! Route resolution for RoCE: the path is computed locally from the resolved address, as
//! Linux's `cma_resolve_iboe_route` does (no SA query).

use rdma_hostview::MacAddr;

use crate::error::{Error, Result};
use crate::host::addr::Gid;
use crate::host::resolve::{Netdev, ResolvedAddr, Resolver};

/// Bytes the software device reserves below the netdev MTU for its headers (IP, UDP, BTH and
/// extended headers, ICRC), as rxe's `RXE_MAX_HDR_LENGTH`.
pub const ROCE_HEADROOM: u32 = 80;

/// Packet lifetime of a RoCE path when no ACK timeout is set (`CMA_IBOE_PACKET_LIFETIME`).
pub const DEFAULT_PACKET_LIFETIME: u8 = 16;

/// Lowest UDP source port RoCE v2 uses for flow entropy (`IB_ROCE_UDP_ENCAP_VALID_PORT_MIN`).
pub const ROCE_UDP_SPORT_MIN: u16 = rdma_soft::io::flow::ROCE_SPORT_MIN;

/// An InfiniBand path MTU.
///
/// ```
/// use rdmacm::host::IbMtu;
/// assert_eq!(IbMtu::for_netdev_mtu(1500), Some(IbMtu::Mtu1024));
/// assert_eq!(IbMtu::for_netdev_mtu(65536), Some(IbMtu::Mtu4096));
/// assert_eq!(IbMtu::for_netdev_mtu(9000).map(IbMtu::bytes), Some(4096));
/// assert_eq!(IbMtu::for_netdev_mtu(300), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IbMtu {
    /// 256 bytes (code 1).
    Mtu256,
    /// 512 bytes (code 2).
    Mtu512,
    /// 1024 bytes (code 3).
    Mtu1024,
    /// 2048 bytes (code 4).
    Mtu2048,
    /// 4096 bytes (code 5).
    Mtu4096,
}

impl IbMtu {
    const ALL: [IbMtu; 5] = [
        IbMtu::Mtu4096,
        IbMtu::Mtu2048,
        IbMtu::Mtu1024,
        IbMtu::Mtu512,
        IbMtu::Mtu256,
    ];

    /// Payload bytes.
    pub fn bytes(self) -> u32 {
        match self {
            IbMtu::Mtu256 => 256,
            IbMtu::Mtu512 => 512,
            IbMtu::Mtu1024 => 1024,
            IbMtu::Mtu2048 => 2048,
            IbMtu::Mtu4096 => 4096,
        }
    }

    /// The IBA encoding (`enum ib_mtu`: 1 = 256 ... 5 = 4096).
    pub fn code(self) -> u8 {
        match self {
            IbMtu::Mtu256 => 1,
            IbMtu::Mtu512 => 2,
            IbMtu::Mtu1024 => 3,
            IbMtu::Mtu2048 => 4,
            IbMtu::Mtu4096 => 5,
        }
    }

    /// The largest IB MTU that fits in `netdev_mtu` minus [`ROCE_HEADROOM`] (as rxe), or
    /// `None` when not even 256 bytes fit.
    pub fn for_netdev_mtu(netdev_mtu: u32) -> Option<IbMtu> {
        let room = netdev_mtu.checked_sub(ROCE_HEADROOM)?;
        IbMtu::ALL.into_iter().find(|m| m.bytes() <= room)
    }
}

/// The RoCE v2 flow label of a connection, as Linux's `cma_get_roce_udp_flow_label`: the
/// IPv6 flow label given by the caller (`sin6_flowinfo`, non-zero, IPv6 only), else
/// `(src_port * 31 + dst_port)` in 20 bits.
///
/// ```
/// assert_eq!(rdmacm::host::flow_label(1, 2, None), 33);
/// assert_eq!(rdmacm::host::flow_label(1, 2, Some(0x12345)), 0x12345);
/// assert_eq!(rdmacm::host::flow_label(1, 2, Some(0)), 33);
/// ```
pub fn flow_label(src_port: u16, dst_port: u16, ipv6_flow_label: Option<u32>) -> u32 {
    match ipv6_flow_label.map(|f| f & 0xF_FFFF) {
        Some(fl) if fl != 0 => fl,
        _ => (u32::from(src_port) * 31 + u32::from(dst_port)) & 0xF_FFFF,
    }
}

/// The UDP source port for a flow label (`rdma_flow_label_to_udp_sport`): the low 14 bits
/// XOR the high 6 bits, in 0xC000..=0xFFFF (`rdma_soft::io::flow` has it with examples).
pub(crate) fn flow_label_to_udp_sport(fl: u32) -> u16 {
    // The device's rule, the one that reaches the wire.
    rdma_soft::io::flow::flow_label_to_udp_sport(fl)
}

/// Per-id inputs of route resolution (rdma_cm options and ports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RouteParams {
    /// Local port of the id (its port space).
    pub src_port: u16,
    /// Peer port.
    pub dst_port: u16,
    /// Type of service (`RDMA_OPTION_ID_TOS`); the traffic class. Default 0.
    pub tos: u8,
    /// IPv6 flow label the caller put in `sin6_flowinfo` of the source, if any.
    pub ipv6_flow_label: Option<u32>,
    /// ACK timeout (`RDMA_OPTION_ID_ACK_TIMEOUT`, IBA exponent) if set.
    pub ack_timeout: Option<u8>,
}

/// A RoCE path: what the CM puts in its REQ and the QP's address vector.
///
/// ```no_run
/// # fn f() -> rdmacm::Result<()> {
/// use std::time::Duration;
/// let r = rdmacm::host::BlockingResolver::new()?;
/// let a = r.resolve_addr(None, &"127.0.0.1".parse()?, None, Duration::from_secs(1))?;
/// let p = r.resolve_route(&a, &rdmacm::host::RouteParams { src_port: 40000, dst_port: 7471, ..Default::default() })?;
/// assert_eq!(p.mtu, rdmacm::host::IbMtu::Mtu4096); // lo: MTU 65536
/// assert!(p.udp_sport >= 0xC000);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RocePath {
    /// The netdev / device.
    pub netdev: Netdev,
    /// Source GID.
    pub sgid: Gid,
    /// Destination GID.
    pub dgid: Gid,
    /// Source MAC.
    pub smac: MacAddr,
    /// Destination MAC (unknown on a passive path without a neighbour entry).
    pub dmac: Option<MacAddr>,
    /// Hop limit from the resolved route.
    pub hop_limit: u8,
    /// Traffic class = TOS.
    pub traffic_class: u8,
    /// Service level: 0 (no VLAN egress map or DCB priority mapping on software netdevs).
    pub sl: u8,
    /// Path MTU for the netdev MTU.
    pub mtu: IbMtu,
    /// Packet lifetime (IBA exponent).
    pub packet_lifetime: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// UDP source port derived from the flow label.
    pub udp_sport: u16,
    /// Through a gateway: routed (RoCE v2 required), not L2-adjacent.
    pub routed: bool,
    /// A loopback connection (stays on the host).
    pub loopback: bool,
}

impl RocePath {
    /// Computes the path from a resolved address, the current state of its netdev and the
    /// id's parameters. `EINVAL` if the netdev MTU is too small for RoCE.
    ///
    /// ```
    /// # fn f(a: &rdmacm::host::ResolvedAddr) -> rdmacm::Result<()> {
    /// let p = rdmacm::host::RocePath::compute(a, &a.netdev, &rdmacm::host::RouteParams::default())?;
    /// assert_eq!(p.packet_lifetime, 16);
    /// # Ok(()) }
    /// ```
    pub fn compute(addr: &ResolvedAddr, netdev: &Netdev, params: &RouteParams) -> Result<RocePath> {
        let mtu = IbMtu::for_netdev_mtu(netdev.mtu).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "MTU {} of {} is too small for RoCE",
                netdev.mtu, netdev.name
            ))
        })?;
        let v6_label = if addr.dst.is_ipv6() {
            params.ipv6_flow_label
        } else {
            None
        };
        let fl = flow_label(params.src_port, params.dst_port, v6_label);
        Ok(RocePath {
            netdev: netdev.clone(),
            sgid: addr.sgid,
            dgid: addr.dgid,
            smac: netdev.mac,
            dmac: addr.dmac,
            hop_limit: addr.hop_limit,
            traffic_class: params.tos,
            sl: 0,
            mtu,
            packet_lifetime: params
                .ack_timeout
                .map_or(DEFAULT_PACKET_LIFETIME, |t| t.saturating_sub(1)),
            flow_label: fl,
            udp_sport: flow_label_to_udp_sport(fl),
            routed: addr.gateway.is_some(),
            loopback: addr.loopback,
        })
    }
}

impl Resolver {
    /// Resolves the route of a resolved address (`rdma_resolve_route` on RoCE): re-reads the
    /// netdev (`ENODEV` if it is gone or its index now names another netdev) and computes the
    /// path with [`RocePath::compute`]. Immediate: nothing is sent.
    pub async fn resolve_route(
        &self,
        addr: &ResolvedAddr,
        params: &RouteParams,
    ) -> Result<RocePath> {
        let nd = self.netdev(addr.netdev.index).await?;
        if nd.name != addr.netdev.name {
            return Err(Error::NoDevice(format!(
                "{} (ifindex {}) is gone",
                addr.netdev.name, addr.netdev.index
            )));
        }
        RocePath::compute(addr, &nd, params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_thresholds() {
        assert_eq!(IbMtu::for_netdev_mtu(4176), Some(IbMtu::Mtu4096));
        assert_eq!(IbMtu::for_netdev_mtu(4175), Some(IbMtu::Mtu2048));
        assert_eq!(IbMtu::for_netdev_mtu(336), Some(IbMtu::Mtu256));
        assert_eq!(IbMtu::for_netdev_mtu(335), None);
        assert_eq!(IbMtu::for_netdev_mtu(0), None);
    }

    #[test]
    fn flow_label_and_sport() {
        // 20-bit wrap of the hash.
        assert_eq!(flow_label(0xFFFF, 0xFFFF, None), (0xFFFF * 32) & 0xF_FFFF);
        // Only the low 20 bits of a given label count.
        assert_eq!(flow_label(0, 0, Some(0xFFF0_0001)), 1);
        for fl in [0u32, 1, 0x3FFF, 0x4000, 0xF_FFFF, 0x1_2345] {
            let p = flow_label_to_udp_sport(fl);
            assert!(p >= 0xC000);
            assert_eq!(u32::from(p & 0x3FFF), (fl & 0x3FFF) ^ (fl >> 14));
        }
    }
}

/// An alternate path of a connection (the `migrate` policy), from this side's point of
/// view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AltPath {
    /// The port of the id's device it leaves from (never the primary's).
    pub port: u8,
    /// Our address on that port.
    pub local: std::net::IpAddr,
    /// The peer's address on it.
    pub remote: std::net::IpAddr,
}
