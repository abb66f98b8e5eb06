//! The runtime's QPs as the verbs layer reaches them: creating one, its transport state
//! machine (rdma-proto's `RcQp` / `UdQp`) and the few fields a verb reads or sets. The
//! runtime's per-QP records (`QpCtx`, `UdCtx`) stay inside `runtime/`.

use rdma_proto::rc::RcQp;
use rdma_proto::ud::UdQp;

use super::{QpCtx, Runtime, UdCtx};
use crate::io::HostPeer;
use crate::queues::srq::SrqRing;
use crate::queues::CompletionQueue;
use crate::{Error, Result};

const DESTROYED: Error = Error::InvalidArgument("QP destroyed");

impl Runtime {
    /// Takes a new RC QP (its QPN allocated with [`Runtime::alloc_qpn`]) of device `device`.
    pub(crate) fn create_rc(
        &mut self,
        rc: RcQp,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        srq: Option<SrqRing>,
        device: &str,
    ) {
        let mut ctx = QpCtx::new(rc, send_cq, recv_cq, srq);
        ctx.span = tracing::debug_span!(
            "qp",
            device = %device,
            qpn = ctx.qpn,
            peer = tracing::field::Empty
        );
        tracing::debug!(parent: &ctx.span, "RC QP created");
        self.insert(ctx);
    }

    /// Takes a new UD QP numbered `qpn` (allocated with [`Runtime::alloc_qpn`]), on port 1.
    pub(crate) fn create_ud(
        &mut self,
        qpn: u32,
        ud: UdQp,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
    ) {
        self.ud_insert(UdCtx {
            qpn,
            ud,
            send_cq,
            recv_cq,
            listening: Vec::new(),
            source: None,
            sport: crate::io::flow::qpn_udp_sport(qpn),
            port: 1,
        });
    }

    /// RC QP `qpn`'s transport (EINVAL once destroyed).
    pub(crate) fn rc_qp(&mut self, qpn: u32) -> Result<&mut RcQp> {
        self.get(qpn).map(|c| &mut c.rc).ok_or(DESTROYED)
    }

    /// UD QP `qpn`'s transport (EINVAL once destroyed).
    pub(crate) fn ud_qp(&mut self, qpn: u32) -> Result<&mut UdQp> {
        self.ud_get(qpn).map(|c| &mut c.ud).ok_or(DESTROYED)
    }

    /// The device port UD QP `qpn` is on.
    pub(crate) fn ud_port(&mut self, qpn: u32) -> Result<u8> {
        self.ud_get(qpn).map(|c| c.port).ok_or(DESTROYED)
    }

    /// Moves UD QP `qpn` to device port `port` (its GID table is the one it receives on).
    pub(crate) fn set_ud_port(&mut self, qpn: u32, port: u8) -> Result<()> {
        self.ud_get(qpn).map(|c| c.port = port).ok_or(DESTROYED)
    }

    /// The GID index UD QP `qpn` receives on from RTR (`None`: every usable address).
    pub(crate) fn ud_source(&mut self, qpn: u32) -> Result<Option<u8>> {
        self.ud_get(qpn).map(|c| c.source).ok_or(DESTROYED)
    }

    /// Sets [`Runtime::ud_source`].
    pub(crate) fn set_ud_source(&mut self, qpn: u32, index: u8) -> Result<()> {
        self.ud_get(qpn)
            .map(|c| c.source = Some(index))
            .ok_or(DESTROYED)
    }

    /// The device port RC QP `qpn`'s last packet arrived on (`None`: none yet, or gone).
    pub(crate) fn rx_port(&mut self, qpn: u32) -> Option<u8> {
        self.get(qpn).map(|c| c.rx_port).filter(|&p| p != 0)
    }

    /// The port of RC QP `qpn`'s alternate path, if one is loaded.
    pub(crate) fn alt_port(&mut self, qpn: u32) -> Option<u8> {
        self.get(qpn)?.paths.alt.map(|a| a.port)
    }

    /// The host-local peer RC QP `qpn`'s packets go to, when its CM chose one.
    pub(crate) fn host_peer(&mut self, qpn: u32) -> Option<HostPeer> {
        self.get(qpn)?.host
    }

    /// RC QP `qpn`'s span (device, QPN, peer), for the verbs' own events.
    pub(crate) fn qp_span(&mut self, qpn: u32) -> Option<tracing::Span> {
        self.get(qpn).map(|c| c.span.clone())
    }
}
