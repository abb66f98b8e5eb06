//! The active side (connect, the REP and SIDR_REP, establish), disconnect and the QP
//! attributes. The agent's events are dispatched in `dispatch`.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use rdma_proto::cm::{
    CmPath, CmState, ConnHandle, RepReceived, ReqParams, SidrRepReceived, SidrReqParams,
};
use rdma_proto::verbs::{PathAttr, RtrParams, RtsParams};
use rdma_soft::verbs::{Mtu, QpAttr, QpAttrMask, QpState};
use rdma_wire::cm::SidrStatus;
use rdma_wire::ip_cm::{req_private_data, sidr_req_private_data, IpCmHeaderRepr, ServiceId};
use rdma_wire::time::IbaTime;

use crate::context::id_entry::{IdNum, IdSlot, Remote};
use crate::context::id_entry::{IdState, QpKind};
use crate::context::state::State;
use crate::context::IdRef;
use crate::context::Inner;
use crate::error::{Error, Result};
use crate::host::addr::Gid;
use crate::params::{ConnEventParam, ConnParam, EventType, UdParam};

/// The default Q_Key of rdma_cm UD ids (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

fn gid_of(ip: IpAddr) -> Ipv6Addr {
    Ipv6Addr::from(Gid::from_ip(ip).0)
}

fn state_err(op: &'static str, s: IdState) -> Error {
    Error::InvalidState {
        op,
        state: s.name(),
    }
}

pub(crate) fn connect(id: IdRef<'_>, param: &ConnParam) -> Result<()> {
    let inner = id.inner;
    let mut st = inner.lock();
    let st = &mut *st;
    let s = st.ids.get_mut(&id.num).ok_or(Error::Shutdown)?;
    if s.state != IdState::RouteResolved {
        return Err(state_err("connect", s.state));
    }
    let (Some(path), Some(local), Some(peer), Some(dev)) = (s.path.clone(), s.local, s.peer, s.dev)
    else {
        return Err(state_err("connect", s.state));
    };
    let hdr = IpCmHeaderRepr {
        version: 0,
        src: local.ip(),
        dst: peer.ip(),
        src_port: local.port(),
    };
    let sid = ServiceId::new(s.ps, peer.port()).0;
    let ps_ud = s.qp_kind == QpKind::Ud;
    let qpn = match (&s.qp, param.qp_num) {
        (Some(q), _) => q.qpn(),
        (None, Some(n)) => n,
        (None, None) if ps_ud => 0,
        (None, None) => {
            return Err(Error::InvalidArgument(
                "connect needs a QP (create_qp) or ConnParam::qp_num".into(),
            ))
        }
    };
    if !st.devices.contains_key(&dev) {
        return Err(Error::NoDevice(format!("device {dev}")));
    }
    // The connection's MADs leave from our address on this device with the path's TOS.
    let cm_path = CmPath::new(gid_of(local.ip()), gid_of(peer.ip()), dev)
        .with_traffic_class(path.traffic_class);
    let now = inner.now();
    let (rto, retries) = (st.cm_response_timeout, st.max_cm_retries);
    let d = st
        .devices
        .get_mut(&dev)
        .ok_or_else(|| Error::NoDevice(format!("device {dev}")))?;
    let conn = if ps_ud {
        let pd = sidr_req_private_data(&hdr, &param.private_data)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let mut p = SidrReqParams::new(sid, cm_path);
        p.timeout = IbaTime::from_bits_truncate(rto);
        p.max_retries = retries;
        p.private_data = pd.to_vec();
        d.agent.send_sidr_req(now, p)?
    } else {
        let pd = req_private_data(&hdr, &param.private_data)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let rq_psn = d.agent.random_psn();
        let mut p = ReqParams::new(sid, cm_path, qpn, rq_psn);
        p.path.local_gid = Ipv6Addr::from(path.sgid.0);
        p.path.remote_gid = Ipv6Addr::from(path.dgid.0);
        p.path.flow_label = path.flow_label;
        p.path.traffic_class = path.traffic_class;
        p.path.hop_limit = path.hop_limit;
        p.path.sl = path.sl;
        p.path.mtu = path.mtu.code();
        p.path.packet_life_time = IbaTime::from_bits_truncate(path.packet_lifetime);
        let ack = s
            .opts
            .ack_timeout
            .unwrap_or(path.packet_lifetime.saturating_add(1).min(31));
        p.path.local_ack_timeout = IbaTime::from_bits_truncate(ack);
        p.responder_resources = param.responder_resources;
        p.initiator_depth = param.initiator_depth;
        p.retry_count = param.retry_count.min(7);
        p.rnr_retry_count = param.rnr_retry_count.min(7);
        p.flow_control = param.flow_control;
        p.srq = param.srq;
        p.remote_cm_response_timeout = IbaTime::from_bits_truncate(rto);
        p.local_cm_response_timeout = IbaTime::from_bits_truncate(rto);
        p.max_cm_retries = retries;
        p.private_data = pd.to_vec();
        p.alternate_path = match (&s.alt, &s.rail_offer) {
            (Some(a), _) => Some(crate::ha::migrate::req_path(a, &p.path)),
            (None, Some(o)) => Some(crate::ha::rails::offer_path(o, &p.path)),
            (None, None) => None,
        };
        let c = d.agent.send_req(now, p)?;
        s.rq_psn = rq_psn;
        c
    };
    d.conns.insert(conn, id.num);
    s.counters.reqs_sent += 1;
    s.conn = Some(conn);
    s.user_qpn = if s.qp.is_none() { Some(qpn) } else { None };
    s.conn_param = Some(param.clone());
    s.state = IdState::Connect;
    inner.drain_agent(st, dev);
    Ok(())
}

pub(crate) fn establish(id: IdRef<'_>) -> Result<()> {
    let inner = id.inner;
    let mut st = inner.lock();
    let st = &mut *st;
    let s = st.ids.get_mut(&id.num).ok_or(Error::Shutdown)?;
    let (Some(dev), Some(conn)) = (s.dev, s.conn) else {
        return Err(state_err("establish", s.state));
    };
    if s.state != IdState::Connect {
        return Err(state_err("establish", s.state));
    }
    s.suppress_est = true;
    let now = inner.now();
    let d = st.devices.get_mut(&dev).ok_or(Error::Shutdown)?;
    d.agent.send_rtu(now, conn)?;
    inner.drain_agent(st, dev);
    Ok(())
}

pub(crate) fn disconnect(id: IdRef<'_>) -> Result<()> {
    let inner = id.inner;
    let mut st = inner.lock();
    let st = &mut *st;
    let s = st.ids.get_mut(&id.num).ok_or(Error::Shutdown)?;
    if !matches!(
        s.state,
        IdState::Connect | IdState::Disconnect | IdState::DeviceRemoval
    ) {
        return Err(state_err("disconnect", s.state));
    }
    let (Some(dev), Some(conn)) = (s.dev, s.conn) else {
        return Err(state_err("disconnect", s.state));
    };
    if let Some(qp) = &s.qp {
        let _ = qp.modify(
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        );
    }
    let now = inner.now();
    let d = st.devices.get_mut(&dev).ok_or(Error::Shutdown)?;
    // before the RTU the agent establishes first (as Linux's COMM_EST), then sends the DREQ
    let dreq = matches!(
        d.agent.state(conn),
        Some(CmState::Established | CmState::RepSent | CmState::MraRepRcvd)
    );
    d.agent.disconnect(now, conn)?;
    if let Some(s) = st.ids.get_mut(&id.num).filter(|_| dreq) {
        s.counters.dreqs_sent += 1;
    }
    inner.drain_agent(st, dev);
    Ok(())
}

pub(crate) use crate::context::state::id_port;

/// `rdma_init_qp_attr` for an RC QP.
pub(crate) fn qp_attr(st: &State, s: &IdSlot, to: QpState) -> Result<(QpAttr, QpAttrMask)> {
    let (mut init, m) = QpAttr::init(QpAttr::RC_ACCESS);
    init.port_num = id_port(st, s);
    if to == QpState::Init {
        return Ok((init, m));
    }
    if !matches!(to, QpState::Rtr | QpState::Rts) {
        return Err(Error::InvalidArgument(format!("init_qp_attr to {to:?}")));
    }
    let (Some(path), Some(remote), Some(dev)) = (&s.path, s.remote, s.dev) else {
        return Err(state_err("init_qp_attr", s.state));
    };
    let d = st.devices.get(&dev).ok_or(Error::Shutdown)?;
    let local_ip = s.local.map(|l| l.ip()).ok_or(Error::Shutdown)?;
    let (port, sgid_index) = d
        .sgid(local_ip)
        .ok_or_else(|| Error::AddressNotAvailable(format!("{local_ip} not in GID table")))?;
    let port_mtu = d
        .dev
        .query_port(port)
        .map(|p| p.active_mtu.bytes())
        .unwrap_or(1024);
    let (mut rtr, mut m) = init.rtr(&RtrParams {
        path: PathAttr {
            dgid: path.dgid.0,
            sgid_index,
            hop_limit: path.hop_limit,
            traffic_class: path.traffic_class,
            flow_label: path.flow_label,
        },
        path_mtu: Mtu::from_bytes(path.mtu.bytes().min(port_mtu)).unwrap_or(Mtu::Mtu1024),
        dest_qp_num: remote.qpn,
        rq_psn: s.rq_psn,
        max_dest_rd_atomic: remote.initiator_depth.max(1),
        min_rnr_timer: 12,
    });
    let timeout = s
        .opts
        .ack_timeout
        .unwrap_or(path.packet_lifetime.saturating_add(1).min(31));
    if let Some(alt) = &s.alt {
        crate::ha::migrate::load(d, alt, path, timeout, &mut rtr, &mut m);
    }
    let alt_loaded = m.contains(QpAttrMask::ALT_PATH);
    if to == QpState::Rtr {
        return Ok((rtr, m));
    }
    let (mut rts, mut m) = rtr.rts(&RtsParams {
        timeout,
        retry_cnt: remote.retry.min(7),
        rnr_retry: remote.rnr_retry.min(7),
        sq_psn: remote.psn,
        max_rd_atomic: remote.responder_resources.max(1),
    });
    if alt_loaded {
        crate::ha::migrate::arm(&mut rts, &mut m);
    }
    Ok((rts, m))
}

/// Moves the id's own QP to RTR then RTS (on the host-local wire when the peer is one of
/// our processes on this host: [`crate::engine::local_wire`]).
pub(crate) fn qp_to_rts(st: &State, s: &IdSlot) -> Result<()> {
    let Some(qp) = &s.qp else { return Ok(()) };
    crate::engine::local_wire::choose(st, s, qp);
    let (a, m) = qp_attr(st, s, QpState::Rtr)?;
    qp.modify(&a, m)?;
    let (a, m) = qp_attr(st, s, QpState::Rts)?;
    qp.modify(&a, m)?;
    Ok(())
}

/// A REP for our REQ (id `id`, connection `conn` of device `dev`): the QP to RTR and RTS
/// and the RTU, ESTABLISHED following; CONNECT_RESPONSE for a user-managed QP; REJ and
/// CONNECT_ERROR when the QP cannot move.
pub(crate) fn on_rep(
    inner: &Inner,
    st: &mut State,
    dev: u32,
    id: IdNum,
    conn: ConnHandle,
    r: RepReceived,
) {
    let Some(s) = st.ids.get_mut(&id) else {
        return;
    };
    let rep = r.rep;
    let mut private_data = rep.private_data.to_vec();
    if rep.failover_accepted != 0 {
        // The peer did not take our alternate path: none on our QP either.
        s.alt = None;
    }
    if let Some(o) = s.rail_offer.take().filter(|_| s.alt.is_none()) {
        // Our offer's answer: the peer's address on the other rail (crate::ha::rails).
        let alt = crate::ha::rails::take_answer(&o, rep.failover_accepted, &mut private_data);
        s.alt = st
            .devices
            .get(&dev)
            .and_then(|d| crate::ha::migrate::checked(d, alt));
        tracing::debug!(target: "rdmacm", id, alt = ?s.alt, "the peer's answer to our rail offer");
    }
    s.apm = s.alt.is_some();
    s.remote = Some(Remote {
        qpn: rep.local_qpn,
        psn: rep.starting_psn,
        responder_resources: rep.responder_resources,
        initiator_depth: rep.initiator_depth,
        rnr_retry: s.conn_param.as_ref().map_or(7, |p| p.rnr_retry_count),
        retry: s.conn_param.as_ref().map_or(7, |p| p.retry_count),
        ca_guid: rep.local_ca_guid,
    });
    let param = ConnEventParam {
        private_data,
        responder_resources: rep.responder_resources,
        initiator_depth: rep.initiator_depth,
        flow_control: rep.end_to_end_flow_control,
        rnr_retry_count: rep.rnr_retry_count,
        srq: rep.srq,
        qp_num: rep.local_qpn,
        starting_psn: rep.starting_psn,
    };
    s.est_param = param.clone();
    if s.qp.is_none() {
        Inner::event(st, id, EventType::ConnectResponse, 0, param);
        return;
    }
    let s = &st.ids[&id];
    match qp_to_rts(st, s) {
        Ok(()) => {
            let now = inner.now();
            if let Some(d) = st.devices.get_mut(&dev) {
                let _ = d.agent.send_rtu(now, conn);
            }
        }
        Err(e) => {
            qp_to_err(s);
            let now = inner.now();
            let sent = st.devices.get_mut(&dev).is_some_and(|d| {
                let r = rdma_wire::cm::RejectReason::ConsumerDefined;
                d.agent.send_rej(now, conn, r, &[], &[]).is_ok()
            });
            if let Some(s) = st.ids.get_mut(&id).filter(|_| sent) {
                s.counters.rejs_sent += 1;
            }
            Inner::event(
                st,
                id,
                EventType::ConnectError,
                -e.errno(),
                ConnEventParam::default(),
            );
        }
    }
}

/// A SIDR_REP for our SIDR_REQ: ESTABLISHED with the peer's QPN and Q_Key, or UNREACHABLE
/// with its status.
pub(crate) fn on_sidr_rep(st: &mut State, id: IdNum, r: SidrRepReceived) {
    let Some(s) = st.ids.get(&id) else {
        return;
    };
    let peer = s.peer;
    if r.status == SidrStatus::Success {
        let ud = UdParam {
            qp_num: r.qpn,
            qkey: r.q_key,
            peer: peer.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
        };
        let param = ConnEventParam {
            private_data: r.private_data,
            qp_num: r.qpn,
            ..ConnEventParam::default()
        };
        Inner::event_ud(st, id, ud, param);
    } else {
        let param = ConnEventParam {
            private_data: r.private_data,
            ..ConnEventParam::default()
        };
        Inner::event(
            st,
            id,
            EventType::Unreachable,
            i32::from(u8::from(r.status)),
            param,
        );
    }
}

/// Moves a connection's QP to ERR (its peer is gone or refused).
pub(crate) fn qp_to_err(s: &IdSlot) {
    if let Some(qp) = &s.qp {
        let _ = qp.modify(
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        );
    }
}

/// The conn handle type, re-exported for the listen module.
pub(crate) type Conn = ConnHandle;
