//! The CM's multicast events (MULTICAST_JOIN, MULTICAST_ERROR) and the host changes that
//! lose a group; the joins themselves are `crate::cm::mcast`.

use std::net::{IpAddr, SocketAddr};

use rdma_soft::verbs::PathAttr;

use crate::context::id_entry::{IdNum, McJoin};
use crate::context::state::State;
use crate::context::Inner;
use crate::engine::connect::RDMA_UDP_QKEY;
use crate::host::watch::{ChangeReason, Notification};
use crate::params::{ConnEventParam, EventType, McastJoined, PendingEvent, UdParam, MULTICAST_QPN};

/// A group's MGID.
pub(crate) fn mgid(group: IpAddr) -> [u8; 16] {
    match group {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Queues a multicast event about `join` on id `id`.
pub(crate) fn mc_event(st: &mut State, id: IdNum, kind: EventType, status: i32, j: &McJoin) {
    let Some(s) = st.ids.get(&id) else { return };
    let (port, sgid_index) = s
        .dev
        .and_then(|k| st.devices.get(&k))
        .zip(s.local)
        .and_then(|(d, l)| d.sgid(l.ip()))
        .unwrap_or((1, 0));
    let ah_attr = PathAttr {
        dgid: mgid(j.group),
        sgid_index,
        hop_limit: 64,
        traffic_class: s.opts.tos.unwrap_or(0),
        flow_label: 0,
    };
    let ud = UdParam {
        qp_num: MULTICAST_QPN,
        qkey: RDMA_UDP_QKEY,
        peer: SocketAddr::new(j.group, 0),
    };
    Inner::push_event(
        st,
        PendingEvent {
            id,
            kind,
            status,
            param: ConnEventParam::default(),
            ud: Some(ud),
            listen_id: None,
            mc: Some(Box::new(McastJoined {
                group: j.group,
                context: j.context,
                ah_attr,
                port_num: port,
                send_only: j.send_only,
            })),
            addr: None,
        },
    );
}

/// A host change for id `id`: a group is lost when the id's netdev went down or its source
/// address went away (MULTICAST_ERROR, `-ENETRESET` as an IB SA group lost to a port
/// event, once per join).
pub(crate) fn on_notification(st: &mut State, id: IdNum, n: &Notification) {
    let Notification::AddrChange { reason, .. } = n else {
        return;
    };
    if !matches!(
        reason,
        ChangeReason::NetdevDown | ChangeReason::SourceAddressRemoved
    ) {
        return;
    }
    let joins = match st.ids.get(&id) {
        Some(s) => s.mc.clone(),
        None => return,
    };
    for j in &joins {
        tracing::info!(id, group = %j.group, ?reason, "multicast group lost");
        mc_event(st, id, EventType::MulticastError, -libc::ENETRESET, j);
    }
}
