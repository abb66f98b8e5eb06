//! The connection manager's counters: per id (what its connection sent and received,
//! its events) and per context (the requests its listeners took or refused, by cause, and
//! the CM agents' MAD counters). Shown by `rdma-soft resource show cm_id` and
//! `rdma-soft statistic` (`crate::context::inspect`), and by [`crate::cm::Cma::statistics`].

use serde_json::{json, Value};

use crate::error::RejectCause;

/// What the CM did for one id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct IdCounters {
    /// REQs / SIDR_REQs sent (first transmissions).
    pub reqs_sent: u64,
    /// REPs / SIDR_REPs sent.
    pub reps_sent: u64,
    /// REQs / REPs / DREQs resent by the CM's timers.
    pub retransmits: u64,
    /// REJs (or SIDR_REP rejects) sent.
    pub rejs_sent: u64,
    /// REJs received, and the reason of the last one.
    pub rejs_received: u64,
    pub rej_reason: Option<u16>,
    /// DREQs sent and received, DREPs received.
    pub dreqs_sent: u64,
    pub dreqs_received: u64,
    pub dreps_received: u64,
    /// Events queued for the id.
    pub events: u64,
    /// A listener's requests: those that became a CONNECT_REQUEST, those it refused.
    pub requests: u64,
    pub refused: u64,
}

impl IdCounters {
    /// The counters as the inspection view lists them (`unacked`: events queued or handed
    /// out and not yet dropped).
    pub(crate) fn to_json(self, unacked: u64, listener: bool) -> Value {
        let mut v = json!({
            "reqs-sent": self.reqs_sent,
            "reps-sent": self.reps_sent,
            "retransmits": self.retransmits,
            "rejs-sent": self.rejs_sent,
            "rejs-received": self.rejs_received,
            "dreqs-sent": self.dreqs_sent,
            "dreqs-received": self.dreqs_received,
            "dreps-received": self.dreps_received,
            "events": self.events,
            "unacked": unacked,
        });
        if let (Some(r), Some(m)) = (self.rej_reason, v.as_object_mut()) {
            m.insert("rej-reason".into(), r.into());
        }
        if let (true, Some(m)) = (listener, v.as_object_mut()) {
            m.insert("requests".into(), self.requests.into());
            m.insert("refused".into(), self.refused.into());
        }
        v
    }
}

/// The context's own counters (behind its lock).
#[derive(Debug, Clone, Default)]
pub(crate) struct CmCounters {
    /// Requests that became a CONNECT_REQUEST.
    pub requests_accepted: u64,
    /// Requests refused, by cause.
    pub rejects: std::collections::BTreeMap<RejectCause, u64>,
}

/// A context's connection-manager statistics ([`crate::cm::Cma::statistics`]).
///
/// ```no_run
/// let cma = rdmacm::cm::Cma::new()?;
/// let s = cma.statistics();
/// println!("{} taken, {} refused", s.requests_accepted, s.requests_refused());
/// for (cause, n) in &s.refused {
///     println!("  {n} × {cause}");
/// }
/// # Ok::<(), rdmacm::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CmStatistics {
    /// Requests (REQ, SIDR_REQ) its listeners took: each became a CONNECT_REQUEST.
    pub requests_accepted: u64,
    /// Requests refused, by cause (only causes that occurred, in cause order).
    pub refused: Vec<(RejectCause, u64)>,
    /// MADs its CM agents dropped as malformed (length, class, fields).
    pub mads_malformed: u64,
    /// Well-formed MADs that matched no connection in a state that takes them.
    pub mads_unmatched: u64,
    /// Duplicate MADs recognised (answered again or dropped).
    pub mads_duplicate: u64,
    /// Requests dropped or refused by the agents' resource limits.
    pub overload: u64,
    /// REQ, REP, DREQ and SIDR_REQ retransmissions.
    pub retransmits: u64,
    /// Of those, REQs and DREQs resent early, before their first CM timeout
    /// (`rdma_proto::cm::AgentConfig::early_resends`).
    pub early_retransmits: u64,
    /// REQs resent after the peer refused them for want of a listener
    /// ([`crate::cm::CmaConfig::no_listener_retry`]).
    pub refused_resends: u64,
}

impl CmStatistics {
    /// All refused requests.
    pub fn requests_refused(&self) -> u64 {
        self.refused.iter().map(|(_, n)| n).sum()
    }

    /// The inspection view's object (`rdma-soft statistic`): the counters, each refusal
    /// cause as `refused-<cause>`.
    pub(crate) fn to_json(&self) -> Value {
        let mut v = json!({
            "requests-accepted": self.requests_accepted,
            "requests-refused": self.requests_refused(),
            "mads-malformed": self.mads_malformed,
            "mads-unmatched": self.mads_unmatched,
            "mads-duplicate": self.mads_duplicate,
            "overload": self.overload,
            "retransmits": self.retransmits,
            "early-retransmits": self.early_retransmits,
            "refused-resends": self.refused_resends,
        });
        if let Some(m) = v.as_object_mut() {
            for (c, n) in &self.refused {
                m.insert(format!("refused-{}", c.name()), (*n).into());
            }
        }
        v
    }
}
