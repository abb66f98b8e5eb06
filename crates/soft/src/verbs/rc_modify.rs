//! `ibv_modify_qp` of an RC QP: the primary and alternate path's addresses from their ports'
//! GID tables, the checks the device adds to rdma-proto's (ports, MTUs, address families),
//! and path migration ([`QueuePair::migrate`], [`QueuePair::connect_with_alt`]).
//!
//! Order, so that nothing is applied when the call fails: the device's checks and the
//! transition table first, then the sockets of new source addresses are opened (EADDRINUSE
//! when another process holds one), then the transport applies the call or refuses it
//! (its path migration rules; the sockets just opened are closed again), and only then does
//! the runtime take the new paths.

use rdma_proto::verbs::{
    check_modify, MigState, Mtu, PathAttr, QpAttr, QpAttrMask, QpState, QpType, RtrParams,
    RtsParams,
};

use super::device::{DeviceArc, DeviceShared};
use super::qp::QueuePair;
use crate::io::{flow, WireAddr};
use crate::runtime::{peer_addr, WirePath};
use crate::{Error, Result};

/// The source and destination address of `path` on port `port` (EINVAL for a port the
/// device lacks, an `sgid_index` beyond its table, or GIDs of two IP families).
fn resolve(dev: &DeviceShared, port: u8, path: &PathAttr) -> Result<(WireAddr, WireAddr)> {
    let local = dev.gid_on(port, path.sgid_index)?;
    let remote = peer_addr(local, path.dgid);
    if local.ip().is_ipv4() != remote.ip().is_ipv4() {
        return Err(Error::InvalidArgument(
            "source and destination GIDs of different IP families",
        ));
    }
    Ok((local, remote))
}

/// The RC part of [`QueuePair::modify`].
pub(super) fn modify(dev: &DeviceArc, qpn: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
    use QpAttrMask as M;
    let mut rt = dev.runtime();
    let cur = rt.rc_qp(qpn)?.attr();
    let cached_alt_port = rt.alt_port(qpn);
    // the QP's port: set at Reset -> Init (port 1 until then)
    let port = if mask.contains(M::PORT) {
        attr.port_num
    } else {
        cur.port_num.max(1)
    };
    let port_mtu = dev.active_mtu_on(port)?;
    let path_mtu = if mask.contains(M::PATH_MTU) {
        attr.path_mtu
    } else {
        cur.path_mtu
    };
    let above = |mtu: Mtu| path_mtu.bytes() > mtu.bytes();
    if mask.contains(M::PATH_MTU) && above(port_mtu) {
        return Err(Error::InvalidArgument(
            "path MTU above the port's active MTU",
        ));
    }
    let primary = if mask.contains(M::AV) {
        Some(resolve(dev, port, &attr.path)?)
    } else {
        None
    };
    // the alternate: a port of this device, the path MTU fits it too
    let alt_port = if mask.contains(M::ALT_PATH) {
        Some(attr.alt_port_num)
    } else if mask.contains(M::PATH_MTU) {
        cached_alt_port
    } else {
        None
    };
    if let Some(p) = alt_port {
        if above(dev.active_mtu_on(p)?) {
            return Err(Error::InvalidArgument(
                "path MTU above the alternate port's active MTU",
            ));
        }
    }
    let alt = if mask.contains(M::ALT_PATH) {
        Some(resolve(dev, attr.alt_port_num, &attr.alt_path)?)
    } else {
        None
    };
    check_modify(QpType::Rc, cur.qp_state, attr, mask)?;
    // UDP 4791 on the new source addresses, before anything changes
    let opened = [primary.map(|p| p.0), alt.map(|a| a.0)];
    for (i, l) in opened.iter().enumerate() {
        if let Some(l) = *l {
            if let Err(e) = rt.open_local(l) {
                for &o in opened[..i].iter().flatten() {
                    rt.close_if_unused(o);
                }
                return Err(e);
            }
        }
    }
    if let Err(e) = rt.rc_qp(qpn)?.modify(attr, mask) {
        for &o in opened.iter().flatten() {
            rt.close_if_unused(o);
        }
        return Err(e.into());
    }
    // as rxe: the AV's flow label, else one from both QPNs (the same at both ends); the
    // socket of that source port is opened here, in the caller's namespace
    let rqpn = rt.rc_qp(qpn)?.attr().dest_qp_num;
    let wire_path = |(local, remote): (WireAddr, WireAddr), port, p: &PathAttr| WirePath {
        local,
        remote,
        port,
        tclass: p.traffic_class,
        sport: flow::connected_udp_sport(p.flow_label, qpn, rqpn),
    };
    let primary = primary.map(|a| wire_path(a, port, &attr.path));
    let alt = alt.map(|a| wire_path(a, attr.alt_port_num, &attr.alt_path));
    let reset = mask.contains(M::STATE) && attr.qp_state == QpState::Reset;
    rt.commit_paths(qpn, primary, alt, reset);
    // a QP on the host-local wire sends no datagram to its peer: no connected socket
    let on_host = rt.host_peer(qpn).is_some();
    for p in [primary, alt].into_iter().flatten() {
        match on_host {
            true => rt.prepare_port(p.local, p.sport),
            false => rt.prepare_path(p.local, p.sport, p.remote),
        }
    }
    if let Some(span) = rt.qp_span(qpn) {
        if mask.contains(M::STATE) {
            tracing::debug!(parent: &span, state = ?attr.qp_state, "QP modified");
        }
        if let Some(a) = alt {
            tracing::debug!(parent: &span, alt_port = a.port, alt = %a.remote, "alternate path loaded");
        }
    }
    // transmits at once (after a forced migration: on the new path)
    let mut mem = dev.mrs.view();
    let r = rt.after_post(qpn, &mut mem);
    dev.posted(&rt, qpn);
    r
}

impl QueuePair {
    /// Forces migration to the alternate path (`ibv_modify_qp` with `path_mig_state =
    /// IBV_MIG_MIGRATED`, as on a local port going down): the alternate becomes the path
    /// in force, packets leave from its addresses, and what is outstanding is resent there
    /// (nothing lost or executed twice). Only in RTS with the migration state Armed; EINVAL
    /// otherwise (nothing changed), and for a UD QP. The device then queues
    /// [`super::AsyncEvent::PathMigrated`].
    ///
    /// ```
    /// use rdma_soft::verbs::*;
    /// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    /// let pd = dev.alloc_pd().unwrap();
    /// let cq = dev.create_cq(4, None).unwrap();
    /// let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    /// assert_eq!(qp.migrate().unwrap_err().errno(), libc::EINVAL); // Reset, no alternate
    /// assert_eq!(qp.query().unwrap().path_mig_state, MigState::Migrated);
    /// ```
    pub fn migrate(&self) -> Result<()> {
        if self.is_ud() {
            return Err(Error::InvalidArgument("a UD QP has no path to migrate"));
        }
        let a = QpAttr {
            path_mig_state: MigState::Migrated,
            ..QpAttr::default()
        };
        self.modify(&a, QpAttrMask::PATH_MIG_STATE)
    }

    /// [`QueuePair::connect_on`] with an alternate path: the primary on port `primary.0` to
    /// GID `primary.1`, the alternate on port `alt.0` (source GID index 0 of its table) to
    /// `alt.1`, loaded at Init → RTR and Armed at RTR → RTS (the peer must do the same,
    /// mirrored). The path MTU is the smaller of the two ports' active MTUs. EINVAL for a
    /// port the device lacks or both paths on one port.
    pub fn connect_with_alt(
        &self,
        primary: (u8, [u8; 16]),
        alt: (u8, [u8; 16]),
        dest_qpn: u32,
        rq_psn: u32,
        sq_psn: u32,
    ) -> Result<()> {
        let dev = self.device();
        let (m1, m2) = (dev.active_mtu_on(primary.0)?, dev.active_mtu_on(alt.0)?);
        let path_mtu = if m1.bytes() <= m2.bytes() { m1 } else { m2 };
        let (mut a, m) = QpAttr::init(QpAttr::RC_ACCESS);
        a.port_num = primary.0;
        self.modify(&a, m)?;
        let path = |dgid| PathAttr {
            dgid,
            hop_limit: 64,
            ..PathAttr::default()
        };
        let (mut a, m) = a.rtr(&RtrParams {
            path: path(primary.1),
            path_mtu,
            dest_qp_num: dest_qpn,
            rq_psn,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
        });
        a.alt_path = path(alt.1);
        a.alt_port_num = alt.0;
        self.modify(&a, m | QpAttrMask::ALT_PATH)?;
        let (mut a, m) = a.rts(&RtsParams {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn,
            max_rd_atomic: 16,
        });
        a.path_mig_state = MigState::Armed;
        self.modify(&a, m | QpAttrMask::PATH_MIG_STATE)
    }
}
