//! [`CompletionStream`]: a CQ's completions as a `futures_core::Stream`, for applications
//! that post their own work requests (on a [`crate::cm::CmId`]'s QP, say).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;
use rdma_soft::verbs::{Completion, CompletionChannel, CompletionQueue};
use tokio::io::unix::AsyncFd;

use crate::error::{Error, Result};

/// The completions of one CQ, woken through its completion channel and tokio's reactor:
/// an empty CQ is armed (`req_notify`) and the task sleeps on the channel's fd; nothing
/// spins. The channel should serve this CQ only (its events are consumed here).
///
/// ```no_run
/// # async fn f(id: &rdmacm::cm::CmId) -> rdmacm::Result<()> {
/// use futures::StreamExt;
/// use rdmacm::verbs::{AccessFlags, QpInitAttr, RecvWr};
/// // A resolved or requested id: make the CQ with a channel, then the QP.
/// let dev = id.device().unwrap();
/// let (pd, cc) = (dev.alloc_pd()?, dev.create_comp_channel()?);
/// let cq = dev.create_cq(256, Some(&cc))?;
/// let qp = id.create_qp(&pd, &QpInitAttr::rc(&cq, &cq))?;
/// let mr = pd.register(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)?;
/// qp.post_recv(&RecvWr::new(1).with_sge(mr.sge(0, 4096)?))?;
/// let mut completions = rdmacm::CompletionStream::new(cq, cc)?;
/// // ... connect or accept, then:
/// while let Some(c) = completions.next().await {
///     println!("wr {} {}: {} bytes", c.wr_id, c.status, c.byte_len);
/// }
/// # Ok(()) }
/// ```
pub struct CompletionStream {
    cq: CompletionQueue,
    afd: AsyncFd<CompletionChannel>,
    ready: VecDeque<Completion>,
    buf: Vec<Completion>,
}

impl std::fmt::Debug for CompletionStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionStream")
            .field("cq", &self.cq)
            .finish()
    }
}

impl CompletionStream {
    /// Completions of `cq`, which was created with `channel`. Needs a tokio runtime.
    pub fn new(cq: CompletionQueue, channel: CompletionChannel) -> Result<CompletionStream> {
        // SAFETY: the AsyncFd owns the channel, which owns the eventfd: the fd stays open
        // as long as it is registered.
        let afd =
            unsafe { AsyncFd::register_with_interest(channel, tokio::io::Interest::READABLE) }
                .map_err(|e| Error::Io(std::io::Error::from(e)))?;
        Ok(CompletionStream {
            cq,
            afd,
            ready: VecDeque::new(),
            buf: Vec::with_capacity(64),
        })
    }

    /// The CQ.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// Waits for at least one completion and moves every one queued (up to `max`) into
    /// `out`; returns how many. For batch consumers that want no per-item overhead.
    pub async fn next_batch(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        std::future::poll_fn(|cx| match self.poll_fill(cx) {
            Poll::Ready(()) => {
                let n = self.ready.len().min(max.max(1));
                out.extend(self.ready.drain(..n));
                Poll::Ready(n)
            }
            Poll::Pending => Poll::Pending,
        })
        .await
    }

    /// `Ready` once `ready` holds a completion.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if !self.ready.is_empty() {
                return Poll::Ready(());
            }
            self.buf.clear();
            if self.cq.poll_once(&mut self.buf, 64) == 0 {
                // Arm, then look once more: a completion may have come in between.
                let _ = self.cq.req_notify(false);
                self.cq.poll_queued(&mut self.buf, 64);
            }
            if !self.buf.is_empty() {
                self.ready.extend(self.buf.drain(..));
                continue;
            }
            match self.afd.poll_read_ready(cx) {
                Poll::Ready(Ok(mut g)) => {
                    g.clear_ready();
                    while let Ok(Some(_)) = self.afd.get_ref().get_event() {}
                }
                // No reactor left to wake us: nothing will ever come.
                Poll::Ready(Err(_)) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Stream for CompletionStream {
    type Item = Completion;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Completion>> {
        let me = self.get_mut();
        match me.poll_fill(cx) {
            Poll::Ready(()) => Poll::Ready(me.ready.pop_front()),
            Poll::Pending => Poll::Pending,
        }
    }
}
