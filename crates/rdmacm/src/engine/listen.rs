//! The passive side's requests: matching a REQ / SIDR_REQ to a listener, holding it for
//! its path lookup (made without the lock), the child id, refusals; wildcard listeners on
//! new devices. Accept and reject are in `accept`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use rdma_proto::cm::{ReqReceived, SidrRepParams, SidrReqReceived};
use rdma_wire::cm::{CmPathRepr, RejectReason, SidrStatus};
use rdma_wire::ip_cm::{IpCmHeaderRepr, ServiceId, IP_CM_HEADER_LEN};

use crate::context::held_request::{HeldMad, HeldReq};
use crate::context::id_entry::IdState;
use crate::context::id_entry::{IdNum, IdSlot, Remote};
use crate::context::state::State;
use crate::context::Inner;
use crate::engine::connect::Conn;
use crate::error::{Error, RejectCause, Result};
use crate::host::resolve::ResolvedAddr;
use crate::host::route::{flow_label_to_udp_sport, RocePath, RouteParams};
use crate::params::{ConnEventParam, EventType, PendingEvent};

/// Why a request was refused, and the listener it matched if it got that far.
type Refused = (RejectCause, Option<IdNum>);

/// Counts a refusal for the context and for the listener it matched.
fn count_refusal(st: &mut State, (cause, listener): Refused) {
    *st.counters.rejects.entry(cause).or_default() += 1;
    if let Some(s) = listener.and_then(|l| st.ids.get_mut(&l)) {
        s.counters.refused += 1;
    }
}

/// A refused request: logged with its cause, counted, answered as Linux answers it (REJ
/// 28 or 8, or nothing when the backlog is full).
fn refuse(
    inner: &Arc<Inner>,
    st: &mut State,
    dev: u32,
    conn: Conn,
    refused: Refused,
    peer: Option<IpAddr>,
) {
    let now = inner.now();
    let cause = refused.0;
    count_refusal(st, refused);
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

/// The listener checks of a request, made when it arrives and again after its path was
/// looked up without the lock (the listener may have gone or filled up meanwhile).
fn admit(
    st: &State,
    dev: u32,
    sid: u64,
    arrival: u32,
    local: IpAddr,
) -> std::result::Result<IdNum, Refused> {
    let Some(l) = st.find_listener(dev, sid, arrival, local) else {
        // A listener on the port but not for this address (or none matching): REJ 28 as
        // Linux (the agent itself answers REJ 8 when nobody listens on the service id).
        return Err((RejectCause::NoListenerForAddress, None));
    };
    let ls = st.ids.get(&l).and_then(|s| s.listen.as_ref());
    if ls.is_some_and(|ls| ls.queued >= ls.backlog) {
        return Err((RejectCause::BacklogFull, Some(l)));
    }
    Ok(l)
}

/// Holds a request that passed the listener checks for its path lookup, which the CM
/// engine makes without the lock (`crate::context::held_request`).
fn hold(inner: &Inner, st: &mut State, dev: u32, mad: HeldMad, hdr: IpCmHeaderRepr) {
    st.held.insert(
        dev,
        HeldReq {
            mad,
            hdr,
            in_flight: false,
        },
    );
    // Held by an API call's drain: the engine settles it.
    inner.wake.signal();
}

/// A held request with its path (or the lookup's refusal): the child id and its event.
pub(crate) fn finish_held(
    inner: &Arc<Inner>,
    st: &mut State,
    dev: u32,
    h: HeldReq,
    addr: Result<ResolvedAddr>,
    rail: Option<crate::ha::migrate::AltPath>,
) {
    match h.mad {
        HeldMad::Req(r) => req_with_path(inner, st, dev, r, &h.hdr, addr, rail),
        HeldMad::Sidr(r) => sidr_with_path(inner, st, dev, r, &h.hdr, addr),
    }
}

/// The common part of a new passive id: listener checks again, path, child slot.
#[allow(clippy::too_many_arguments)]
fn child(
    inner: &Arc<Inner>,
    st: &mut State,
    dev: u32,
    sid: u64,
    arrival: u32,
    hdr: &IpCmHeaderRepr,
    req_path: Option<&CmPathRepr>,
    addr: Result<ResolvedAddr>,
) -> std::result::Result<(IdNum, IdNum), Refused> {
    let tclass = req_path.map(|p| p.traffic_class);
    let l = admit(st, dev, sid, arrival, hdr.dst)?;
    let (local, peer) = (hdr.dst, hdr.src);
    // The path from where the request arrived (no neighbour entry needed); refused when the
    // arrival netdev is down or not on the reverse route (REJ 28).
    let addr = match addr {
        Ok(a) => a,
        Err(Error::Rejected(cause)) => return Err((cause, Some(l))),
        Err(_) => return Err((RejectCause::NotOnReverseRoute, Some(l))),
    };
    let Some(lslot) = st.ids.get(&l) else {
        return Err((RejectCause::NoListenerForAddress, None));
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
    let Ok(mut path) = RocePath::compute(&addr, &addr.netdev, &params) else {
        return Err((RejectCause::PathUnusable, Some(l)));
    };
    if let Some(p) = req_path {
        // As Linux: the flow label (so the UDP source port) is the one the REQ's path
        // carries, the same on both ends.
        path.flow_label = p.flow_label;
        path.udp_sport = flow_label_to_udp_sport(p.flow_label);
    }
    let mut s = Box::new(IdSlot::new(lslot.channel, lslot.ps, lslot.qp_kind));
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
    st.counters.requests_accepted += 1;
    if let Some(ls) = st.ids.get_mut(&l) {
        ls.counters.requests += 1;
    }
    Ok((num, l))
}

pub(crate) fn on_req(inner: &Arc<Inner>, st: &mut State, dev: u32, r: ReqReceived) {
    let conn = r.conn;
    let from = Some(crate::host::addr::Gid(r.path.remote_gid.octets()).to_ip());
    let Ok(hdr) = IpCmHeaderRepr::parse(&r.req.private_data) else {
        refuse(
            inner,
            st,
            dev,
            conn,
            (RejectCause::BadIpCmHeader, None),
            from,
        );
        return;
    };
    if ServiceId(r.listener).split().is_err() {
        refuse(
            inner,
            st,
            dev,
            conn,
            (RejectCause::InvalidServiceId, None),
            from,
        );
        return;
    }
    if let Some(arrived) = from.filter(|a| !same_address(*a, hdr.src)) {
        tracing::warn!(
            target: "rdmacm",
            claimed = %hdr.src,
            %arrived,
            "REQ names a source address it did not come from"
        );
        refuse(
            inner,
            st,
            dev,
            conn,
            (RejectCause::SourceMismatch, None),
            from,
        );
        return;
    }
    match admit(st, dev, r.listener, r.path.tag, hdr.dst) {
        Ok(_) => hold(inner, st, dev, HeldMad::Req(r), hdr),
        Err(why) => refuse(inner, st, dev, conn, why, Some(hdr.src)),
    }
}

/// A REQ with its path (and, for a rail offer, the path found to the offered address):
/// the child id and CONNECT_REQUEST, or the refusal.
fn req_with_path(
    inner: &Arc<Inner>,
    st: &mut State,
    dev: u32,
    r: ReqReceived,
    hdr: &IpCmHeaderRepr,
    addr: Result<ResolvedAddr>,
    rail: Option<crate::ha::migrate::AltPath>,
) {
    let conn = r.conn;
    let req_path = r.req.primary_path;
    let (num, l) = match child(
        inner,
        st,
        dev,
        r.listener,
        r.path.tag,
        hdr,
        Some(&req_path),
        addr,
    ) {
        Ok(x) => x,
        Err(why) => {
            refuse(inner, st, dev, conn, why, Some(hdr.src));
            return;
        }
    };
    let req = &r.req;
    let alt_req = &req.alternate_path;
    let offer = crate::ha::rails::offered(alt_req);
    let offered = offer.is_none() && !alt_req.local_port_gid.is_unspecified();
    let alt = st.ids.get(&num).and_then(|s| {
        let d = st.devices.get(&dev)?;
        let primary = crate::engine::connect::id_port(st, s);
        if s.opts.ha != crate::ha_policy::HaPolicy::Migrate {
            None
        } else if let Some(o) = offer {
            crate::ha::rails::answer_alt(d, primary, o, rail)
        } else {
            crate::ha::migrate::from_req(d, primary, alt_req)
        }
    });
    let alt = alt.filter(|a| Inner::open_gsi(st, dev, a.local).is_ok());
    if let Some(s) = st.ids.get_mut(&num) {
        s.alt_offered = offered;
        s.apm = alt.is_some();
        s.alt = alt;
        s.conn = Some(conn);
        s.remote = Some(Remote {
            qpn: req.local_qpn,
            psn: req.starting_psn,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            rnr_retry: req.rnr_retry_count,
            retry: req.retry_count,
            ca_guid: req.local_ca_guid,
        });
    }
    if let Some(d) = st.devices.get_mut(&dev) {
        d.conns.insert(conn, num);
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
    queue_connect_request(st, l, num, param);
}

/// A refused SIDR request: logged, counted, answered with a SIDR_REP "reject".
fn refuse_sidr(st: &mut State, dev: u32, conn: Conn, refused: Refused, peer: Option<IpAddr>) {
    let cause = refused.0;
    count_refusal(st, refused);
    tracing::info!(target: "rdmacm", device = dev, peer = ?peer, "SIDR request refused: {cause}");
    if let Some(d) = st.devices.get_mut(&dev) {
        let mut p = SidrRepParams::success(0, 0);
        p.status = SidrStatus::Reject;
        let _ = d.agent.send_sidr_rep(conn, p);
    }
}

pub(crate) fn on_sidr_req(inner: &Arc<Inner>, st: &mut State, dev: u32, r: SidrReqReceived) {
    let Ok(hdr) = IpCmHeaderRepr::parse(&r.private_data) else {
        let from = Some(crate::host::addr::Gid(r.path.remote_gid.octets()).to_ip());
        refuse_sidr(st, dev, r.conn, (RejectCause::BadIpCmHeader, None), from);
        return;
    };
    let from = crate::host::addr::Gid(r.path.remote_gid.octets()).to_ip();
    if !same_address(from, hdr.src) {
        tracing::warn!(
            target: "rdmacm",
            claimed = %hdr.src,
            arrived = %from,
            "SIDR_REQ names a source address it did not come from"
        );
        refuse_sidr(
            st,
            dev,
            r.conn,
            (RejectCause::SourceMismatch, None),
            Some(from),
        );
        return;
    }
    match admit(st, dev, r.listener, r.path.tag, hdr.dst) {
        Ok(_) => hold(inner, st, dev, HeldMad::Sidr(r), hdr),
        Err(why) => refuse_sidr(st, dev, r.conn, why, Some(hdr.src)),
    }
}

/// A SIDR_REQ with its path: the child id and CONNECT_REQUEST, or the refusal.
fn sidr_with_path(
    inner: &Arc<Inner>,
    st: &mut State,
    dev: u32,
    r: SidrReqReceived,
    hdr: &IpCmHeaderRepr,
    addr: Result<ResolvedAddr>,
) {
    let conn = r.conn;
    let (num, l) = match child(inner, st, dev, r.listener, r.path.tag, hdr, None, addr) {
        Ok(x) => x,
        Err(why) => {
            refuse_sidr(st, dev, conn, why, Some(hdr.src));
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
    let param = ConnEventParam {
        private_data: r
            .private_data
            .get(IP_CM_HEADER_LEN..)
            .unwrap_or(&[])
            .to_vec(),
        ..ConnEventParam::default()
    };
    queue_connect_request(st, l, num, param);
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
        // Every address, as at listen; one held by another process is skipped, and each
        // wildcard listener told.
        if let Err(e) = Inner::open_gsi(st, dev, addr) {
            for &(n, _) in &ls {
                Inner::listen_addr_lost(st, n, addr, &e);
            }
        }
    }
}

/// Whether some wildcard listener exists (a new netdev then gets a device at once).
pub(crate) fn has_wildcard_listener(st: &State) -> bool {
    st.ids
        .values()
        .any(|s| s.state == IdState::Listen && s.binding.as_ref().is_some_and(|b| b.is_wildcard()))
}

/// Whether the IP CM header's source is the address a request came from (an IPv4 address
/// and its IPv4-mapped IPv6 form are the same).
fn same_address(arrived: IpAddr, claimed: IpAddr) -> bool {
    arrived.to_canonical() == claimed.to_canonical()
}

/// Queues child `num`'s CONNECT_REQUEST on listener `l` (counted against its backlog).
fn queue_connect_request(st: &mut State, l: IdNum, num: IdNum, param: ConnEventParam) {
    if let Some(ls) = st.ids.get_mut(&l).and_then(|s| s.listen.as_mut()) {
        ls.queued += 1;
    }
    Inner::push_event(
        st,
        PendingEvent {
            id: num,
            kind: EventType::ConnectRequest,
            status: 0,
            param,
            ud: None,
            listen_id: Some(l),
            mc: None,
            addr: None,
        },
    );
}
