//! A connection's verbs resources (PD, completion channel, CQ, QP) and one wait for "the
//! next completion or CM event", for tools that move data over a CM-made QP (`rping`,
//! `ucmatose`, `udaddy`; usable by `rdma-perf` too).
//!
//! The process's progress engine drives the device and the CM, so [`Endpoint::next`] only
//! looks: it polls the CQ, takes a queued CM event, and otherwise sleeps in `poll(2)` on the
//! completion channel's fd and the CM event channel's fd at once (no slices, no spinning).

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use rdma_soft::verbs::{
    AccessFlags, Completion, CompletionChannel, CompletionQueue, MemoryRegion, ProtectionDomain,
    QpCap, QpInitAttr, QpType, QueuePair,
};
use rdmacm::cm::{CmId, Event, EventChannel};

use crate::events::EventLog;

/// What [`Endpoint::next`] found.
#[derive(Debug)]
pub enum Step {
    /// A work completion (any status: check it).
    Wc(Completion),
    /// A CM event on the connection's channel (already printed by the [`EventLog`]).
    Cm(Event),
}

/// PD, completion channel, one CQ for both directions and a QP on an id's device.
#[derive(Debug)]
pub struct Endpoint {
    /// The protection domain of the QP and of every buffer registered with
    /// [`Endpoint::register`].
    pub pd: ProtectionDomain,
    /// The completion channel of [`Endpoint::cq`].
    pub channel: CompletionChannel,
    /// The CQ of sends and receives.
    pub cq: CompletionQueue,
    /// The QP: made by the CM for RC ids ([`CmId::create_qp`]), by the PD for UD.
    pub qp: Arc<QueuePair>,
}

impl Endpoint {
    /// Resources on `id`'s device (it must be bound to one: after route resolution, or a
    /// CONNECT_REQUEST's id) with a CQ of `cqe` entries and a QP of capacities `cap`.
    /// An RC id gets its QP through [`CmId::create_qp`]; `qp_type` [`QpType::Ud`] creates a
    /// UD QP from the PD (the UD port space takes its number in the ConnParam).
    /// Errors are one-line reasons.
    pub fn new(id: &CmId, qp_type: QpType, cqe: usize, cap: QpCap) -> Result<Endpoint, String> {
        let dev = id
            .device()
            .ok_or_else(|| "the id has no device".to_string())?;
        let pd = dev.alloc_pd().map_err(|e| format!("ibv_alloc_pd: {e}"))?;
        let channel = dev
            .create_comp_channel()
            .map_err(|e| format!("ibv_create_comp_channel: {e}"))?;
        let cq = dev
            .create_cq(cqe, Some(&channel))
            .map_err(|e| format!("ibv_create_cq: {e}"))?;
        let mut init = QpInitAttr::rc(&cq, &cq);
        init.qp_type = qp_type;
        init.cap = cap;
        let qp = if qp_type == QpType::Ud {
            Arc::new(
                pd.create_qp(&init)
                    .map_err(|e| format!("ibv_create_qp: {e}"))?,
            )
        } else {
            id.create_qp(&pd, &init)
                .map_err(|e| format!("rdma_create_qp: {e}"))?
        };
        Ok(Endpoint {
            pd,
            channel,
            cq,
            qp,
        })
    }

    /// Registers a zeroed buffer of `len` bytes with `access`.
    pub fn register(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion, String> {
        self.pd
            .alloc(len, access)
            .map_err(|e| format!("ibv_reg_mr: {e}"))
    }

    /// The next completion or CM event on `cm`, waiting until `deadline` (`Ok(None)` then;
    /// `None`: no limit). CM events are printed through `log`.
    pub fn next(
        &self,
        cm: &EventChannel,
        log: &EventLog,
        deadline: Option<Instant>,
    ) -> Result<Option<Step>, String> {
        loop {
            if let Some(c) = self.cq.poll_one() {
                return Ok(Some(Step::Wc(c)));
            }
            match cm.try_get_event() {
                Ok(ev) => {
                    log.show(&ev);
                    return Ok(Some(Step::Cm(ev)));
                }
                Err(rdmacm::Error::WouldBlock) => {}
                Err(e) => return Err(format!("rdma_get_cm_event: {e}")),
            }
            self.cq
                .req_notify(false)
                .map_err(|e| format!("ibv_req_notify_cq: {e}"))?;
            if let Some(c) = self.cq.poll_queued_one() {
                return Ok(Some(Step::Wc(c)));
            }
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(None);
            }
            // EINTR is a wake-up like any other; a poll error is retried at the top.
            let fds = [self.channel.as_raw_fd(), cm.fd()];
            let _ = rdma_soft::fd::wait_readable(&fds, deadline);
            // consume the CQ event (the CQ is polled at the top of the loop)
            self.channel
                .get_event()
                .map_err(|e| format!("ibv_get_cq_event: {e}"))?;
        }
    }
}

/// Polls only what is queued (no device progress), one completion.
trait PollQueuedOne {
    fn poll_queued_one(&self) -> Option<Completion>;
}

impl PollQueuedOne for CompletionQueue {
    fn poll_queued_one(&self) -> Option<Completion> {
        let mut v = Vec::with_capacity(1);
        self.poll_queued(&mut v, 1);
        v.pop()
    }
}
