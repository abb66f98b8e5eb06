//! The passive side: matching a REQ / SIDR_REQ to a listener, the child id, accept and
//! reject.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use rdma_proto::cm::{RepParams, ReqReceived, SidrRepParams, SidrReqReceived};
use rdma_wire::cm::{RejectReason, SidrStatus};
use rdma_wire::ip_cm::{IpCmHeaderRepr, ServiceId, IP_CM_HEADER_LEN};

use crate::connect::{qp_to_rts, Conn, RDMA_UDP_QKEY};
use crate::error::{Error, RejectCause, Result};
use crate::inner::IdRef;
use crate::inner::Inner;
use crate::params::{ConnEventParam, ConnParam, EventType, PendingEvent};
use crate::route::{RocePath, RouteParams};
use crate::slot::{IdNum, IdSlot, Remote};
use crate::slot::{IdState, QpKind};
use crate::state::State;

/// The listener (if any) that gets a request for `local` arriving on netdev `arrival`.
fn find_listener(st: &State, dev: u32, sid: u64, arrival: u32, local: IpAddr) -> Option<IdNum> {
    let d = st.devices.get(&dev)?;
    d.listeners.get(&sid)?.iter().copied().find(|l| {
        st.ids.get(l).is_some_and(|s| {
            s.state == IdState::Listen
                && s.binding
                    .as_ref()
                    .is_some_and(|b| b.accepts(arrival, local, s.afonly()))
        })
    })
}

/// A refused request: logged with its cause, counted, answered as Linux answers it (REJ
/// 28 or 8, or nothing when the backlog is full).
fn refuse(
    inner: &Arc<Inner>,
    st: &mut State,
    dev: u32,
    conn: Conn,
    cause: RejectCause,
    peer: Option<IpAddr>,
) {
    let now = inner.now();
    *st.rejects.entry(cause).or_default() += 1;
    tracing::info!(
        target: "rdmacm",
        device = dev,
        peer = ?peer,
        wire = ?cause.wire_reason(),
        "connection request refused: {cause}"
    );
    let Some(d) = st.devices.get_mut(&dev) else {
        return;
    };
    // A failure to answer is a lost MAD: the requester's CM retries or times out.
    match cause.wire_reason() {
        None => {
            // Backlog full: dropped without an answer, as Linux does (the handler's
            // -ENOMEM); the requester retries its REQ after its CM timeout, and the retry
            // is a new request once the application has taken queued ones.
            let _ = d.agent.destroy_silently(conn);
        }
        Some(8) => {
            let _ = d
                .agent
                .send_rej(now, conn, RejectReason::InvalidServiceId, &[], &[]);
        }
        Some(_) => {
            let _ = d
                .agent
                .send_rej(now, conn, RejectReason::ConsumerDefined, &[], &[]);
        }
    }
}

/// The common part of a new passive id: listener checks, path, child slot.
fn child(
    inner: &Arc<Inner>,
    st: &mut State,
    dev: u32,
    sid: u64,
    arrival: u32,
    hdr: &IpCmHeaderRepr,
    tclass: Option<u8>,
) -> std::result::Result<(IdNum, IdNum), RejectCause> {
    let Some(l) = find_listener(st, dev, sid, arrival, hdr.dst) else {
        // A listener on the port but not for this address (or none matching): REJ 28 as
        // Linux (the agent itself answers REJ 8 when nobody listens on the service id).
        return Err(RejectCause::NoListenerForAddress);
    };
    let ls = st.ids.get(&l).and_then(|s| s.listen.as_ref());
    if ls.is_some_and(|ls| ls.queued >= ls.backlog) {
        return Err(RejectCause::BacklogFull);
    }
    let (local, peer) = (hdr.dst, hdr.src);
    // The path from where the request arrived (no neighbour entry needed); refused when the
    // arrival netdev is down or not on the reverse route (REJ 28).
    let r = inner.block(move |r| async move { r.accept_path(arrival, local, peer).await });
    let addr = match r {
        Ok(a) => a,
        Err(Error::Rejected(cause)) => return Err(cause),
        Err(_) => return Err(RejectCause::NotOnReverseRoute),
    };
    let Some(lslot) = st.ids.get(&l) else {
        return Err(RejectCause::NoListenerForAddress);
    };
    let port = ServiceId(sid).port();
    let params = RouteParams {
        src_port: port,
        dst_port: hdr.src_port,
        // As Linux: a connection's traffic class is the one its REQ's path carries (the
        // active side's TOS); a SIDR request has none and takes the listener's.
        tos: tclass.unwrap_or(lslot.opts.tos.unwrap_or(0)),
        ipv6_flow_label: None,
        ack_timeout: lslot.opts.ack_timeout,
    };
    let Ok(path) = RocePath::compute(&addr, &addr.netdev, &params) else {
        return Err(RejectCause::PathUnusable);
    };
    let mut s = IdSlot::new(lslot.channel, lslot.ps, lslot.qp_kind);
    s.opts = lslot.opts;
    s.context = lslot.context;
    s.local = Some(SocketAddr::new(local, port));
    s.peer = Some(SocketAddr::new(peer, hdr.src_port));
    s.dev = Some(dev);
    s.path = Some(path);
    // Watched like an active id: ADDR_CHANGE when the route to the peer, its neighbour,
    // the local address or the netdev changes. The route is re-looked up without the
    // arrival netdev as constraint, so a route moving to another netdev is seen.
    let mut watched = addr.clone();
    watched.query.oif = None;
    s.resolved = Some(addr);
    s.parent = Some(l);
    s.state = IdState::Connect;
    let num = st.next_id;
    st.next_id += 1;
    st.ids.insert(num, s);
    inner.watch(st, num, &watched);
    Ok((num, l))
}

pub(crate) fn on_req(inner: &Arc<Inner>, st: &mut State, dev: u32, r: ReqReceived) {
    let conn = r.conn;
    let arrival = r.path.tag;
    let from = Some(crate::addr::Gid(r.path.remote_gid.octets()).to_ip());
    let Ok(hdr) = IpCmHeaderRepr::parse(&r.req.private_data) else {
        refuse(inner, st, dev, conn, RejectCause::BadIpCmHeader, from);
        return;
    };
    if ServiceId(r.listener).split().is_err() {
        refuse(inner, st, dev, conn, RejectCause::InvalidServiceId, from);
        return;
    }
    let tclass = Some(r.req.primary_path.traffic_class);
    let (num, l) = match child(inner, st, dev, r.listener, arrival, &hdr, tclass) {
        Ok(x) => x,
        Err(cause) => {
            refuse(inner, st, dev, conn, cause, Some(hdr.src));
            return;
        }
    };
    let req = &r.req;
    if let Some(s) = st.ids.get_mut(&num) {
        s.conn = Some(conn);
        s.remote = Some(Remote {
            qpn: req.local_qpn,
            psn: req.starting_psn,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            rnr_retry: req.rnr_retry_count,
            retry: req.retry_count,
        });
    }
    if let Some(d) = st.devices.get_mut(&dev) {
        d.conns.insert(conn, num);
    }
    if let Some(ls) = st.ids.get_mut(&l).and_then(|s| s.listen.as_mut()) {
        ls.queued += 1;
    }
    let param = ConnEventParam {
        private_data: req.private_data[IP_CM_HEADER_LEN..].to_vec(),
        responder_resources: req.responder_resources,
        initiator_depth: req.initiator_depth,
        flow_control: req.end_to_end_flow_control,
        rnr_retry_count: req.rnr_retry_count,
        srq: req.srq,
        qp_num: req.local_qpn,
        starting_psn: req.starting_psn,
    };
    Inner::push_event(
        st,
        PendingEvent {
            id: num,
            kind: EventType::ConnectRequest,
            status: 0,
            param,
            ud: None,
            listen_id: Some(l),
        },
    );
}

pub(crate) fn on_sidr_req(inner: &Arc<Inner>, st: &mut State, dev: u32, r: SidrReqReceived) {
    let conn = r.conn;
    let refuse = |st: &mut State, cause: RejectCause, peer: Option<IpAddr>| {
        *st.rejects.entry(cause).or_default() += 1;
        tracing::info!(target: "rdmacm", device = dev, peer = ?peer, "SIDR request refused: {cause}");
        if let Some(d) = st.devices.get_mut(&dev) {
            let mut p = SidrRepParams::success(0, 0);
            p.status = SidrStatus::Reject;
            let _ = d.agent.send_sidr_rep(conn, p);
        }
    };
    let Ok(hdr) = IpCmHeaderRepr::parse(&r.private_data) else {
        let from = Some(crate::addr::Gid(r.path.remote_gid.octets()).to_ip());
        refuse(st, RejectCause::BadIpCmHeader, from);
        return;
    };
    let (num, l) = match child(inner, st, dev, r.listener, r.path.tag, &hdr, None) {
        Ok(x) => x,
        Err(cause) => {
            refuse(st, cause, Some(hdr.src));
            return;
        }
    };
    let tos = st.ids.get_mut(&num).map(|s| {
        s.conn = Some(conn);
        s.path.as_ref().map_or(0, |p| p.traffic_class)
    });
    if let Some(d) = st.devices.get_mut(&dev) {
        d.conns.insert(conn, num);
        // The SIDR_REP leaves with the id's TOS (the listener's).
        let _ = d.agent.set_traffic_class(conn, tos.unwrap_or(0));
    }
    if let Some(ls) = st.ids.get_mut(&l).and_then(|s| s.listen.as_mut()) {
        ls.queued += 1;
    }
    let param = ConnEventParam {
        private_data: r
            .private_data
            .get(IP_CM_HEADER_LEN..)
            .unwrap_or(&[])
            .to_vec(),
        ..ConnEventParam::default()
    };
    Inner::push_event(
        st,
        PendingEvent {
            id: num,
            kind: EventType::ConnectRequest,
            status: 0,
            param,
            ud: None,
            listen_id: Some(l),
        },
    );
}

fn passive<'a>(
    st: &'a mut State,
    id: IdRef<'_>,
    op: &'static str,
) -> Result<(u32, Conn, &'a mut IdSlot)> {
    let s = st.ids.get_mut(&id.num).ok_or(Error::Shutdown)?;
    match (s.state, s.parent, s.dev, s.conn, s.accepted) {
        (IdState::Connect, Some(_), Some(d), Some(c), false) => Ok((d, c, s)),
        _ => Err(Error::InvalidState {
            op,
            state: s.state.name(),
        }),
    }
}

pub(crate) fn accept(id: IdRef<'_>, param: &ConnParam) -> Result<()> {
    let inner = id.inner;
    let mut st = inner.lock();
    let st = &mut *st;
    let (dev, conn, s) = passive(st, id, "accept")?;
    let now = inner.now();
    if s.qp_kind == QpKind::Ud {
        let qpn = param
            .qp_num
            .ok_or_else(|| Error::InvalidArgument("UD accept needs ConnParam::qp_num".into()))?;
        let mut p = SidrRepParams::success(qpn, RDMA_UDP_QKEY);
        p.private_data = param.private_data.clone();
        s.accepted = true;
        let d = st.devices.get_mut(&dev).ok_or(Error::Shutdown)?;
        if let Err(e) = d.agent.send_sidr_rep(conn, p) {
            if let Some(s) = st.ids.get_mut(&id.num) {
                s.accepted = false;
            }
            return Err(e.into());
        }
        inner.drain_agent(st, dev);
        return Ok(());
    }
    if param.private_data.len() > rdma_wire::ip_cm::REP_USER_PRIVATE_DATA_MAX {
        return Err(Error::InvalidArgument(format!(
            "REP private data: {} bytes, at most {}",
            param.private_data.len(),
            rdma_wire::ip_cm::REP_USER_PRIVATE_DATA_MAX
        )));
    }
    let qpn = match (&s.qp, param.qp_num) {
        (Some(q), _) => q.qpn(),
        (None, Some(n)) => n,
        (None, None) => {
            return Err(Error::InvalidArgument(
                "accept needs a QP (create_qp) or ConnParam::qp_num".into(),
            ))
        }
    };
    let Some(d) = st.devices.get_mut(&dev) else {
        return Err(Error::Shutdown);
    };
    let rq_psn = d.agent.random_psn();
    let s = st.ids.get_mut(&id.num).ok_or(Error::Shutdown)?;
    s.rq_psn = rq_psn;
    if let Some(r) = s.remote.as_mut() {
        r.retry = param.retry_count.min(r.retry);
        r.rnr_retry = param.rnr_retry_count;
    }
    let s = &st.ids[&id.num];
    qp_to_rts(st, s)?;
    let mut p = RepParams::new(qpn, rq_psn);
    p.responder_resources = param.responder_resources;
    p.initiator_depth = param.initiator_depth;
    p.rnr_retry_count = param.rnr_retry_count.min(7);
    p.flow_control = param.flow_control;
    p.srq = param.srq;
    p.private_data = param.private_data.clone();
    let d = st.devices.get_mut(&dev).ok_or(Error::Shutdown)?;
    d.agent.send_rep(now, conn, p)?;
    if let Some(s) = st.ids.get_mut(&id.num) {
        s.accepted = true;
        s.user_qpn = if s.qp.is_none() { Some(qpn) } else { None };
    }
    inner.drain_agent(st, dev);
    Ok(())
}

pub(crate) fn reject(id: IdRef<'_>, private_data: &[u8]) -> Result<()> {
    let inner = id.inner;
    let mut st = inner.lock();
    let st = &mut *st;
    let (dev, conn, s) = passive(st, id, "reject")?;
    let ud = s.qp_kind == QpKind::Ud;
    let now = inner.now();
    let d = st.devices.get_mut(&dev).ok_or(Error::Shutdown)?;
    if ud {
        let mut p = SidrRepParams::success(0, 0);
        p.status = SidrStatus::Reject;
        p.private_data = private_data.to_vec();
        d.agent.send_sidr_rep(conn, p)?;
    } else {
        d.agent
            .send_rej(now, conn, RejectReason::ConsumerDefined, &[], private_data)?;
    }
    if let Some(s) = st.ids.get_mut(&id.num) {
        s.accepted = true;
    }
    inner.drain_agent(st, dev);
    Ok(())
}

/// A wildcard listener gets requests from every device on every address
/// (Linux: `cma_listen_on_all`, and `cma_add_one` for devices that appear later). Called
/// when address `addr` appears on netdev `dev` (whose device is open): registers every
/// wildcard listener on that device if it is not yet, and opens `addr` (of either family:
/// a request a listener does not take is refused with REJ 28).
pub(crate) fn wildcard_listen_on(st: &mut State, dev: u32, addr: IpAddr) {
    let ls: Vec<(IdNum, u64)> = st
        .ids
        .iter()
        .filter(|(_, s)| {
            s.state == IdState::Listen && s.binding.as_ref().is_some_and(|b| b.is_wildcard())
        })
        .map(|(n, s)| {
            let port = s.local.map(|l| l.port()).unwrap_or(0);
            let sid = ServiceId::new(s.ps, port).0;
            (*n, sid)
        })
        .collect();
    for &(n, sid) in &ls {
        let Some(d) = st.devices.get_mut(&dev) else {
            return;
        };
        let l = d.listeners.entry(sid).or_default();
        if !l.contains(&n) {
            if l.is_empty() && d.agent.listen(sid).is_err() {
                continue;
            }
            l.push(n);
            if let Some(ls) = st.ids.get_mut(&n).and_then(|s| s.listen.as_mut()) {
                ls.regs.push((dev, sid));
            }
        }
    }
    if !ls.is_empty() {
        // Every address, as at listen; one held by another process is skipped.
        let _ = Inner::open_gsi(st, dev, addr);
    }
}

/// Whether some wildcard listener exists (a new netdev then gets a device at once).
pub(crate) fn has_wildcard_listener(st: &State) -> bool {
    st.ids
        .values()
        .any(|s| s.state == IdState::Listen && s.binding.as_ref().is_some_and(|b| b.is_wildcard()))
}
