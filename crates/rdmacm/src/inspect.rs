//! The connection manager's inspection view: every id of a context, for
//! `rdma-soft resource show cm_id` (see `rdma_soft::inspect`). Field names follow iproute2's
//! `rdma resource show cm_id`.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::inner::Inner;
use crate::slot::QpKind;
use crate::state::State;
use crate::PortSpace;

/// Registers the context's ids under `"cm_ids"`. Store the provider in `inner` and drop it
/// first in `Inner`'s drop.
pub(crate) fn register(inner: &Arc<Inner>) -> rdma_soft::inspect::Provider {
    // SAFETY: the caller stores the provider in `inner`, and `Inner::drop` drops it before
    // anything else (the contract of `register_borrowed`).
    unsafe { rdma_soft::inspect::register_borrowed("cm_ids", Arc::downgrade(inner), snapshot) }
}

fn snapshot(inner: &Inner) -> Value {
    cm_ids(&inner.lock())
}

fn ps_name(ps: PortSpace) -> &'static str {
    match ps {
        PortSpace::Tcp => "TCP",
        PortSpace::Udp => "UDP",
        PortSpace::Ib => "IB",
        PortSpace::IpoIb => "IPOIB",
    }
}

/// The ids of `st`, in id order.
pub(crate) fn cm_ids(st: &State) -> Value {
    let mut ids: Vec<_> = st.ids.iter().collect();
    ids.sort_by_key(|(n, _)| **n);
    let list = ids.into_iter().map(|(num, id)| {
        let link = id
            .dev
            .and_then(|ifx| st.devices.get(&ifx))
            .map(|d| format!("{}/1", d.dev.name()));
        json!({
            "cm-idn": num,
            "link": link,
            "lqpn": id.qp.as_ref().map(|q| q.qpn()).or(id.user_qpn),
            "rqpn": id.remote.map(|r| r.qpn),
            "qp-type": match id.qp_kind { QpKind::Rc => "RC", QpKind::Ud => "UD" },
            "state": id.state.name().trim_start_matches("RDMA_CM_"),
            "ps": ps_name(id.ps),
            "src-addr": id.local.map(|a| a.to_string()),
            "dst-addr": id.peer.map(|a| a.to_string()),
            "parent": id.parent,
        })
    });
    Value::Array(list.collect())
}
