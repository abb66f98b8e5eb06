//! The connection manager's inspection view (see `rdma_soft::inspect`): every id of a
//! context with its counters, for `rdma-soft resource show cm_id` (field names follow
//! iproute2's `rdma resource show cm_id`), and the context's CM statistics, for
//! `rdma-soft statistic`.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::cm::PortSpace;
use crate::context::counters::CmStatistics;
use crate::context::id_entry::QpKind;
use crate::context::state::State;
use crate::context::Inner;

/// Registers the context's ids under `"cm_ids"` and its statistics under `"cm"`. Store the
/// providers in `inner` and drop them first in `Inner`'s drop.
pub(crate) fn register(inner: &Arc<Inner>) -> [rdma_soft::inspect::Provider; 2] {
    let w = || Arc::downgrade(inner);
    // SAFETY: the caller stores the providers in `inner`, and `Inner::drop` drops them
    // before anything else (the contract of `register_borrowed`).
    unsafe {
        [
            rdma_soft::inspect::register_borrowed("cm_ids", w(), |i: &Inner| cm_ids(&i.lock())),
            rdma_soft::inspect::register_borrowed("cm", w(), |i: &Inner| cm(&i.lock())),
        ]
    }
}

/// The context's entry of `"cm"`: its listeners' addresses and its statistics.
fn cm(st: &State) -> Value {
    let mut ls: Vec<_> = st
        .ids
        .iter()
        .filter(|(_, s)| s.listen.is_some())
        .filter_map(|(n, s)| Some((*n, s.local?.to_string())))
        .collect();
    ls.sort();
    let ls: Vec<String> = ls.into_iter().map(|(_, a)| a).collect();
    json!({ "listeners": ls, "counters": statistics(st).to_json() })
}

/// The context's statistics: its own counters and its devices' CM agents'.
pub(crate) fn statistics(st: &State) -> CmStatistics {
    let mut s = CmStatistics {
        requests_accepted: st.counters.requests_accepted,
        refused: st.counters.rejects.iter().map(|(c, n)| (*c, *n)).collect(),
        ..CmStatistics::default()
    };
    for d in st.devices.values() {
        let a = d.agent.stats();
        s.mads_malformed += a.malformed;
        s.mads_unmatched += a.unmatched;
        s.mads_duplicate += a.duplicates;
        s.overload += a.overload;
        s.retransmits += a.retransmits;
        s.early_retransmits += a.early_retransmits;
        s.refused_resends += a.refused_resends;
    }
    s
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
        let link = id.dev.and_then(|k| st.devices.get(&k)).map(|d| {
            format!(
                "{}/{}",
                d.dev.name(),
                crate::engine::connect::id_port(st, id)
            )
        });
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
            "counters": id.counters.to_json(unacked(st, *num, id), id.listen.is_some()),
        })
    });
    Value::Array(list.collect())
}

/// Events of id `num` queued (a CONNECT_REQUEST on its listener's channel) or handed out
/// and not yet dropped.
fn unacked(st: &State, num: u64, id: &crate::context::id_entry::IdSlot) -> u64 {
    let queued: usize = st
        .channels
        .values()
        .map(|c| c.queue.iter().filter(|e| e.id == num).count())
        .sum();
    (queued + id.outstanding) as u64
}
