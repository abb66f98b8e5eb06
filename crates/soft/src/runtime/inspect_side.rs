//! The runtime's QPs as inspection reads them (`verbs/device/inspect.rs`): a read-only view
//! of each, its transport state machine, numbers and paths. The runtime's per-QP records
//! (`QpCtx`, `UdCtx`) stay inside `runtime/`, as for the verbs (`verbs_side.rs`).

use rdma_proto::rc::{RcQp, RcStats};
use rdma_proto::ud::UdQp;

use super::{QpCtx, Runtime, UdCtx, WirePath};
use crate::io::WireAddr;

/// What inspection reads of a live RC QP.
#[derive(Clone, Copy)]
pub(crate) struct RcView<'a>(&'a QpCtx);

impl<'a> RcView<'a> {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.0.qpn
    }

    /// Its transport state machine (attributes, state, counters).
    pub fn rc(&self) -> &'a RcQp {
        &self.0.rc
    }

    /// The port its packets last arrived on.
    pub fn rx_port(&self) -> u8 {
        self.0.rx_port
    }

    /// The path in force, once connected.
    pub fn primary(&self) -> Option<WirePath> {
        self.0.paths.primary
    }

    /// The alternate path, when loaded.
    pub fn alt(&self) -> Option<WirePath> {
        self.0.paths.alt
    }

    /// Whether it runs over the host-local wire (its peer one of our processes here).
    pub fn host_local(&self) -> bool {
        self.0.host.is_some()
    }
}

/// What inspection reads of a live UD QP.
#[derive(Clone, Copy)]
pub(crate) struct UdView<'a>(&'a UdCtx);

impl<'a> UdView<'a> {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.0.qpn
    }

    /// Its transport state machine (state, Q_Key, counters).
    pub fn ud(&self) -> &'a UdQp {
        &self.0.ud
    }

    /// Its port.
    pub fn port(&self) -> u8 {
        self.0.port
    }

    /// The addresses it receives on.
    pub fn listening(&self) -> &'a [WireAddr] {
        &self.0.listening
    }
}

impl Runtime {
    /// Every live RC QP, and the summed counters of those destroyed.
    pub(crate) fn rc_views(&self) -> (impl Iterator<Item = RcView<'_>> + '_, RcStats) {
        let (live, retired) = self.qps();
        (live.map(RcView), retired)
    }

    /// Every live UD QP.
    pub(crate) fn ud_views(&self) -> impl Iterator<Item = UdView<'_>> + '_ {
        self.ud_qps().map(UdView)
    }
}
