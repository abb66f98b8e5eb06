//! What a connection's verbs objects are made of ([`Setup`]) and their creation.

use std::sync::Arc;

use rdma_soft::verbs::{
    AccessFlags, CompletionChannel, CompletionQueue, MemoryRegion, ProtectionDomain, QpCap,
    QpInitAttr, QueuePair, RecvWr,
};

use super::sizes::MsgSizes;
use super::{tag, CONTROL_WINDOW, MAX_RDMA_OPS, TAG_RECV};
use crate::cm::id::CmId;
use crate::error::{Error, Result};

/// How a [`crate::Connection`]'s PD, CQ and QP are made: bring your own PD (with memory
/// registered in it before the connection exists), or size the queues.
///
/// The message layer needs its window ([`WINDOW`](super::WINDOW) by default) +
/// [`CONTROL_WINDOW`] receives and as many sends,
/// plus [`MAX_RDMA_OPS`] one-sided operations; smaller sizes are raised to that.
///
/// ```no_run
/// # async fn f(l: &rdmacm::Listener) -> rdmacm::Result<()> {
/// let req = l.incoming().await?;
/// let pd = req.device().alloc_pd()?;
/// let setup = rdmacm::Setup { pd: Some(pd), cq_size: 1024, ..Default::default() };
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// The PD of the QP (of the id's device; `None`: a new one).
    pub pd: Option<ProtectionDomain>,
    /// Entries of the CQ shared by sends and receives (0: 256).
    pub cq_size: usize,
    /// The QP's capacities (`Default`: the device's defaults).
    pub cap: QpCap,
}

impl Setup {
    pub(super) fn cap(&self, window: u32) -> QpCap {
        let msgs = window + CONTROL_WINDOW;
        QpCap {
            max_send_wr: self.cap.max_send_wr.max(msgs + MAX_RDMA_OPS as u32),
            max_recv_wr: self.cap.max_recv_wr.max(msgs),
            max_send_sge: self.cap.max_send_sge.max(1),
            max_recv_sge: self.cap.max_recv_sge.max(1),
            ..self.cap
        }
    }
}

/// The verbs objects of a connection, made before the REQ or REP leaves.
pub(super) struct Parts {
    pub qp: Arc<QueuePair>,
    pub bufs: Buffers,
}

/// A connection's CQ (shared by sends and receives), its channel and message buffers:
/// what a reconnection keeps of its [`Parts`].
pub(super) struct Buffers {
    pub cq: CompletionQueue,
    pub cc: CompletionChannel,
    pub send_mr: MemoryRegion,
    pub recv_mr: MemoryRegion,
    /// Bytes of each message buffer (this side's largest message).
    pub stride: usize,
    /// Receive buffers (this side's window and the control receives).
    pub recv_slots: u32,
}

impl Parts {
    /// Creates the PD (unless given), the CQ with its channel, the message buffers and the
    /// QP on the id's device, and posts every receive.
    pub fn create(id: &CmId, setup: &Setup, own: MsgSizes) -> Result<Parts> {
        let dev = id
            .device()
            .ok_or_else(|| Error::InvalidArgument("id has no device yet".into()))?;
        let pd = match &setup.pd {
            Some(pd) => pd.clone(),
            None => dev.alloc_pd()?,
        };
        let cap = setup.cap(own.window);
        let cq_size = setup
            .cq_size
            .max(256)
            .max((cap.max_send_wr + cap.max_recv_wr) as usize);
        let cc = dev.create_comp_channel()?;
        let cq = dev.create_cq(cq_size, Some(&cc))?;
        let send_mr = pd.register(
            vec![0u8; own.window as usize * own.max_message],
            AccessFlags::LOCAL_WRITE,
        )?;
        let recv_mr = pd.register(
            vec![0u8; (own.window + CONTROL_WINDOW) as usize * own.max_message],
            AccessFlags::LOCAL_WRITE,
        )?;
        let bufs = Buffers {
            cq,
            cc,
            send_mr,
            recv_mr,
            stride: own.max_message,
            recv_slots: own.window + CONTROL_WINDOW,
        };
        Parts::with_new_qp(id, &pd, cap, bufs)
    }

    /// A new RC QP on `id` in `pd` with `cap`, over `bufs`' CQ (sends and receives), with
    /// every receive posted: a new connection's, and a reconnection's (which keeps the
    /// buffers of the one before).
    pub fn with_new_qp(
        id: &CmId,
        pd: &ProtectionDomain,
        cap: QpCap,
        bufs: Buffers,
    ) -> Result<Parts> {
        let init = QpInitAttr {
            cap,
            ..QpInitAttr::rc(&bufs.cq, &bufs.cq)
        };
        let qp = id.create_qp(pd, &init)?;
        let parts = Parts { qp, bufs };
        for slot in 0..parts.bufs.recv_slots {
            parts.post_recv(slot)?;
        }
        Ok(parts)
    }

    /// The QP and the buffers apart (a reconnection drops the QP, keeps the buffers).
    pub fn split(self) -> (Arc<QueuePair>, Buffers) {
        (self.qp, self.bufs)
    }

    pub fn post_recv(&self, slot: u32) -> Result<()> {
        let sge = self
            .bufs
            .recv_mr
            .sge(slot as usize * self.bufs.stride, self.bufs.stride as u32)?;
        self.qp
            .post_recv(&RecvWr::new(tag(TAG_RECV, slot)).with_sge(sge))?;
        Ok(())
    }
}
