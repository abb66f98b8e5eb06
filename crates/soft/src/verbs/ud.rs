//! Unreliable datagram support: address handles and the UD side of [`QueuePair`].
//!
//! A UD QP (`QpInitAttr::ud`) goes Reset → Init (P_Key index, port, Q_Key) → RTR → RTS
//! like `ibv_modify_qp` does it; from RTR on it receives on its source address, the GID
//! chosen with [`QueuePair::set_ud_source`] or [`QueuePair::ud_ready_on`] (opening UDP 4791
//! there only, so processes sharing a netdev through different addresses do not collide);
//! without one, on every address of the device's GID table that it can open (skipping
//! tentative IPv6 addresses and addresses another process holds; it fails only if none
//! opens). Each datagram is addressed by the WR's `ud` field
//! ([`UdDest`], as `wr.ud` of `ibv_post_send`): an [`AddressHandle`] (source GID index and
//! destination GID), the remote QPN and the remote Q_Key (with the high bit set, the QP's own
//! Q_Key is sent: IBA 10.2.5). Receives start with the 40-byte GRH (for IPv4: 20 zero bytes
//! then the IPv4 header), as verbs delivers them; datagrams with another Q_Key than the QP's
//! are dropped and counted ([`QueuePair::ud_stats`]).
//!
//! ```
//! use rdma_soft::verbs::*;
//! # fn dev(ip: &str) -> Device {
//! #     let mut cfg = DeviceConfig::for_netdev("lo").unwrap();
//! #     cfg.gids = vec![ip.parse().unwrap()];
//! #     let wire = rdma_soft::io::UdpWire::new(rdma_soft::io::UdpConfig { port: 47915, ..Default::default() }).unwrap();
//! #     Device::open_with_wire(cfg, Box::new(wire)).unwrap()
//! # }
//! let (da, db) = (dev("127.0.0.71"), dev("127.0.0.72"));
//! let setup = |d: &Device| {
//!     let pd = d.alloc_pd().unwrap();
//!     let cq = d.create_cq(64, None).unwrap();
//!     let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
//!     qp.ud_ready(0x1111_2222).unwrap(); // Init (Q_Key), RTR, RTS
//!     let mr = pd.register(vec![0u8; 4096], AccessFlags::LOCAL_WRITE).unwrap();
//!     (pd, cq, qp, mr)
//! };
//! let (pa, _cqa, qpa, mra) = setup(&da);
//! let (_pb, cqb, qpb, mrb) = setup(&db);
//! let ah = pa.create_ah(&PathAttr { dgid: "127.0.0.72".parse::<rdma_soft::io::WireAddr>().unwrap().gid(), ..PathAttr::default() }).unwrap();
//! qpb.post_recv(&RecvWr::new(7).with_sge(mrb.sge(0, 4096).unwrap())).unwrap();
//! mra.write(0, b"datagram").unwrap();
//! let wr = SendWr::new(1, SendOp::Send).with_sge(mra.sge(0, 8).unwrap()).with_ud(ah.dest(qpb.qpn(), 0x1111_2222));
//! qpa.post_send(&wr).unwrap();
//! let mut wc = Vec::new();
//! while cqb.poll(&mut wc, 1) == 0 {}
//! assert_eq!((wc[0].wr_id, wc[0].byte_len, wc[0].src_qp), (7, 40 + 8, qpa.qpn()));
//! let mut got = [0u8; 48];
//! mrb.read(0, &mut got).unwrap();
//! assert_eq!(&got[40..], b"datagram");
//! assert_eq!(&got[32..36], &[127, 0, 0, 71]); // IPv4 source address in the GRH
//! ```

use rdma_proto::verbs::{PathAttr, QpAttr, QpAttrMask, QpState, UdDest};

use super::device::{DeviceArc, DeviceShared};
use super::pd::ProtectionDomain;
use super::qp::QueuePair;
use crate::io::WireAddr;
use crate::runtime::peer_addr;
use crate::{Error, Result};

/// An address handle (`ibv_ah`): the source address (GID index of the device) and the
/// destination GID of datagrams. While it lives, UDP 4791 stays open on its source address.
/// See the example at the top of `verbs/ud.rs`.
pub struct AddressHandle {
    dev: DeviceArc,
    id: u32,
    local: WireAddr,
    remote: WireAddr,
}

impl std::fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddressHandle")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish()
    }
}

impl AddressHandle {
    pub(crate) fn create(
        pd: &ProtectionDomain,
        port: u8,
        attr: &PathAttr,
    ) -> Result<AddressHandle> {
        let dev = pd.device().clone();
        let local = dev.gid_on(port, attr.sgid_index)?;
        let remote = peer_addr(local, attr.dgid);
        if local.ip().is_ipv4() != remote.ip().is_ipv4() {
            return Err(Error::InvalidArgument(
                "source and destination GIDs of different IP families",
            ));
        }
        let id = dev.runtime().ah_create(local, remote, attr.traffic_class)?;
        Ok(AddressHandle {
            dev,
            id,
            local,
            remote,
        })
    }

    /// The opaque handle that [`UdDest::ah`] carries.
    pub fn handle(&self) -> u32 {
        self.id
    }

    /// The source address.
    pub fn local(&self) -> WireAddr {
        self.local
    }

    /// The destination address.
    pub fn remote(&self) -> WireAddr {
        self.remote
    }

    /// The `wr.ud` of a send to `remote_qpn` with `remote_qkey` through this handle.
    pub fn dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest {
            ah: self.id,
            remote_qpn,
            remote_qkey,
        }
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        self.dev.runtime().ah_destroy(self.id);
    }
}

/// `modify` of a UD QP.
pub(crate) fn modify(dev: &DeviceShared, qpn: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
    let mut rt = dev.runtime();
    let before = rt.ud_qp(qpn)?.state();
    if mask.contains(QpAttrMask::PORT) {
        dev.port_attr(attr.port_num)?;
    }
    let port = if mask.contains(QpAttrMask::PORT) {
        attr.port_num
    } else {
        rt.ud_port(qpn)?
    };
    let to = if mask.contains(QpAttrMask::STATE) {
        attr.qp_state
    } else {
        before
    };
    let receives = matches!(
        to,
        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
    );
    if receives && before == QpState::Init {
        // validate first, then open the addresses, then change state
        rdma_proto::verbs::check_modify(rdma_proto::verbs::QpType::Ud, before, attr, mask)?;
        let mut gids = dev.gids_of(port)?;
        if gids.is_empty() {
            return Err(Error::InvalidArgument(
                "the device has no GID to receive on",
            ));
        }
        if let Some(i) = rt.ud_source(qpn)? {
            let own = *gids.get(i as usize).ok_or(Error::InvalidArgument(
                "source GID index beyond the GID table",
            ))?;
            gids = vec![own];
        }
        rt.ud_listen(qpn, &gids)?;
    }
    if let Err(e) = rt.ud_qp(qpn)?.modify(attr, mask) {
        if receives && before == QpState::Init {
            rt.ud_listen(qpn, &[])?;
        }
        return Err(e.into());
    }
    rt.set_ud_port(qpn, port)?;
    if matches!(to, QpState::Reset) {
        rt.ud_listen(qpn, &[])?;
    }
    let mut mem = dev.mrs.view();
    rt.ud_service(qpn, &mut mem)
}

/// `query` of a UD QP: state, Q_Key, port, P_Key index.
pub(crate) fn query(dev: &DeviceShared, qpn: u32) -> Result<QpAttr> {
    let mut rt = dev.runtime();
    let port = rt.ud_port(qpn)?;
    let ud = rt.ud_qp(qpn)?;
    Ok(QpAttr {
        qp_state: ud.state(),
        cur_qp_state: ud.state(),
        qkey: ud.qkey(),
        port_num: port,
        path_mtu: dev.active_mtu_on(port)?,
        ..QpAttr::default()
    })
}

impl QueuePair {
    /// Moves a fresh UD QP to RTS: Init with P_Key index 0, port 1 and `qkey`, then RTR, then
    /// RTS with send PSN 0 (what `ibv_ud_pingpong` does). EINVAL for an RC QP.
    pub fn ud_ready(&self, qkey: u32) -> Result<()> {
        self.ud_ready_port(1, qkey)
    }

    /// [`QueuePair::ud_ready`] on port `port` of the device (EINVAL for a port it lacks):
    /// the QP receives on that port's GID table.
    pub fn ud_ready_port(&self, port: u8, qkey: u32) -> Result<()> {
        if !self.is_ud() {
            return Err(Error::InvalidArgument("ud_ready on a QP that is not UD"));
        }
        use QpAttrMask as M;
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qkey,
            port_num: port,
            ..QpAttr::default()
        };
        self.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)?;
        a.qp_state = QpState::Rtr;
        self.modify(&a, M::STATE)?;
        a.qp_state = QpState::Rts;
        a.sq_psn = 0;
        self.modify(&a, M::STATE | M::SQ_PSN)
    }

    /// Makes a UD QP receive only on the address of GID `sgid_index` (its own source address,
    /// e.g. `device.gid_index(ip)` of the address its CM id is bound to) from RTR on, instead
    /// of on every address of the GID table. Call it before the move to RTR (in Reset or
    /// Init); EINVAL for an RC QP, after RTR, or when the index is beyond the GID table.
    pub fn set_ud_source(&self, sgid_index: u8) -> Result<()> {
        if !self.is_ud() {
            return Err(Error::InvalidArgument(
                "set_ud_source on a QP that is not UD",
            ));
        }
        let dev = self.device();
        let mut rt = dev.runtime();
        let qpn = self.qpn();
        if dev.gids_of(rt.ud_port(qpn)?)?.len() <= sgid_index as usize {
            return Err(Error::InvalidArgument(
                "source GID index beyond the GID table",
            ));
        }
        if !matches!(rt.ud_qp(qpn)?.state(), QpState::Reset | QpState::Init) {
            return Err(Error::InvalidArgument(
                "set_ud_source after the QP moved to RTR",
            ));
        }
        rt.set_ud_source(qpn, sgid_index)
    }

    /// [`QueuePair::ud_ready`] receiving only on the address of GID `sgid_index` (see
    /// [`QueuePair::set_ud_source`]).
    pub fn ud_ready_on(&self, qkey: u32, sgid_index: u8) -> Result<()> {
        self.set_ud_source(sgid_index)?;
        self.ud_ready(qkey)
    }

    /// Transport counters of a UD QP (Q_Key mismatches, datagrams without a receive); `None`
    /// for an RC QP.
    pub fn ud_stats(&self) -> Option<rdma_proto::ud::UdStats> {
        if !self.is_ud() {
            return None;
        }
        let dev = self.device();
        let mut rt = dev.runtime();
        rt.ud_qp(self.qpn()).ok().map(|ud| ud.stats())
    }
}
