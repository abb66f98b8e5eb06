//! The passive side's answers: accept (REP / SIDR_REP) and reject on a child id.

use rdma_proto::cm::{RepParams, SidrRepParams};
use rdma_wire::cm::{RejectReason, SidrStatus};

use crate::context::id_entry::{IdSlot, IdState, QpKind};
use crate::context::state::State;
use crate::context::IdRef;
use crate::engine::connect::{qp_to_rts, Conn, RDMA_UDP_QKEY};
use crate::error::{Error, Result};
use crate::params::ConnParam;

/// The child id of `id` that can still be answered: its device, connection and slot.
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
        // the id's QP, as librdmacm takes it; else the one named
        let qpn =
            s.qp.as_ref()
                .map(|q| q.qpn())
                .or(param.qp_num)
                .ok_or_else(|| {
                    Error::InvalidArgument(
                        "UD accept needs a QP (create_qp) or ConnParam::qp_num".into(),
                    )
                })?;
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
        if let Some(s) = st.ids.get_mut(&id.num) {
            s.counters.reps_sent += 1;
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
    // An alternate without a whole one in the REQ answers a rail offer (crate::ha::rails): our
    // address on it goes at the end of the REP's private data; no room, no alternate.
    let answer = match s.alt.filter(|_| !s.alt_offered) {
        Some(a) => {
            let pd = crate::ha::rails::with_answer(&param.private_data, &a);
            if pd.is_none() {
                tracing::info!(target: "rdmacm", id = id.num, "REP private data too long for the rail answer: no alternate path");
                s.alt = None;
                s.apm = false;
            }
            pd
        }
        None => None,
    };
    let s = &st.ids[&id.num];
    qp_to_rts(st, s)?;
    let mut p = RepParams::new(qpn, rq_psn);
    p.responder_resources = param.responder_resources;
    p.initiator_depth = param.initiator_depth;
    p.rnr_retry_count = param.rnr_retry_count.min(7);
    p.flow_control = param.flow_control;
    p.srq = param.srq;
    p.private_data = answer.unwrap_or_else(|| param.private_data.clone());
    p.failover_accepted = st.ids.get(&id.num).map_or(0, |s| {
        crate::ha::migrate::failover_accepted(s.alt_offered, s.alt.as_ref())
    });
    let d = st.devices.get_mut(&dev).ok_or(Error::Shutdown)?;
    d.agent.send_rep(now, conn, p)?;
    if let Some(s) = st.ids.get_mut(&id.num) {
        s.accepted = true;
        s.counters.reps_sent += 1;
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
        s.counters.rejs_sent += 1;
    }
    inner.drain_agent(st, dev);
    Ok(())
}
