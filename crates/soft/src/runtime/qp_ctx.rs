//! The runtime's state for one RC QP: its transport, CQs, paths, and its place in the
//! runtime's work list and timer heap; a packet's delivery to it and its completions' move
//! to the CQs.

use rdma_proto::memory::MemoryTable;
use rdma_proto::packet::{Packet, Placement};
use rdma_proto::rc::RcQp;
use rdma_wire::opcode::Opcode;

use super::{Paths, RuntimeStats};
use crate::io::{Arrival, HostPeer};
use crate::queues::srq::SrqRing;
use crate::queues::CompletionQueue;
use crate::ratelimit::warn_limited;

/// The runtime's state for one QP.
pub(crate) struct QpCtx {
    pub qpn: u32,
    pub rc: RcQp,
    pub send_cq: CompletionQueue,
    pub recv_cq: CompletionQueue,
    pub srq: Option<SrqRing>,
    /// The wire addresses, traffic class (the IPv4 TOS / IPv6 traffic class of every
    /// packet, as in rxe) and UDP source port ([`crate::io::flow`]) of the primary path (set
    /// when the QP moves to RTR), the alternate path and the path migrated off last.
    pub paths: Paths,
    /// Receives moved from the SRQ into the transport and not yet completed.
    pub(super) srq_held: u32,
    /// The device port the last packet for this QP arrived on (0: none yet), for path
    /// migration to tell the primary path from the alternate.
    pub rx_port: u8,
    /// The QP's span (device, QPN, peer), entered while the runtime drives it; a disabled
    /// span costs one branch.
    pub span: tracing::Span,
    /// The host-local peer its packets go to through shared memory instead of UDP
    /// (`io::local`), when its CM chose it.
    pub host: Option<HostPeer>,
    /// On the runtime's work list (`runtime/sched.rs`).
    pub(super) queued: bool,
    /// On the list of QPs whose host-local ring was full.
    pub(super) blocked: bool,
    /// The earliest deadline this QP has in the runtime's timer heap.
    pub(super) armed: Option<u64>,
    /// Its index in the runtime's `live` list.
    pub(super) live_pos: usize,
}

impl QpCtx {
    pub fn new(
        rc: RcQp,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        srq: Option<SrqRing>,
    ) -> QpCtx {
        let mut rc = rc;
        // ACKs advertise the receives posted (end-to-end credits), unless they are an SRQ's
        rc.set_credits(srq.is_none());
        let qpn = rc.qpn();
        QpCtx {
            qpn,
            rc,
            send_cq,
            recv_cq,
            srq,
            paths: Paths::default(),
            srq_held: 0,
            rx_port: 0,
            span: tracing::Span::none(),
            host: None,
            queued: false,
            blocked: false,
            armed: None,
            live_pos: 0,
        }
    }

    /// Whether this request packet consumes a receive WR at the responder.
    fn consumes_receive(op: Opcode) -> bool {
        use Opcode::*;
        // a SEND's first packet, an RDMA WRITE with immediate's last
        matches!(
            op,
            RcSendFirst
                | RcSendOnly
                | RcSendOnlyImm
                | RcSendOnlyInv
                | RcRdmaWriteLastImm
                | RcRdmaWriteOnlyImm
        )
    }

    pub(super) fn deliver<M: MemoryTable + ?Sized>(
        &mut self,
        now: u64,
        mem: &mut M,
        arr: &Arrival,
        port: u8,
        (pkt, placement): (&Packet<'_>, Placement<'_>),
        stats: &mut RuntimeStats,
    ) {
        let path_port = match self.paths.admits(arr.local, arr.remote) {
            Some(p) => p,
            None => {
                stats.wrong_path += 1;
                warn_limited!(
                    qpn = self.qpn,
                    from = %arr.remote,
                    to = %arr.local,
                    "packet on none of the QP's paths dropped"
                );
                return;
            }
        };
        // the arrival address's port; an address no GID table holds any more (removed
        // while in use) counts as on the path it belongs to
        let port = if port != 0 { port } else { path_port };
        self.rx_port = port;
        let _span = self.span.enter();
        let op = pkt.header.bth.opcode;
        tracing::trace!(?op, psn = pkt.header.bth.psn, len = pkt.payload.len(), "rx");
        if !op.is_response() && Self::consumes_receive(op) && self.srq_held == 0 {
            if let Some(wr) = self.srq.as_ref().and_then(|s| s.take()) {
                if self.rc.post_recv(&wr).is_ok() {
                    self.srq_held += 1;
                }
            }
        }
        // the path migration rules need the arrival port (a QP without an alternate path
        // ignores it)
        self.rc.handle_placed(now, mem, pkt, port, placement);
        stats.delivered += 1;
    }

    /// Moves the transport's completions to the CQs.
    pub(super) fn drain_completions(&mut self, stats: &mut RuntimeStats) {
        // successes first: a receive that completed before the QP failed (in the same batch
        // as the NAK that failed it) is not reported after the failure
        while let Some((c, send)) = self.rc.poll_completion_in_order() {
            let cq = if send {
                &self.send_cq
            } else {
                if self.srq.is_some() {
                    self.srq_held = self.srq_held.saturating_sub(1);
                }
                &self.recv_cq
            };
            if cq.push(c).is_err() {
                stats.cq_overflows += 1;
            }
        }
    }
}
