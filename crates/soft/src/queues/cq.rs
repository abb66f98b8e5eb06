//! Completion queues and completion channels.
//!
//! A [`CompletionQueue`] is a lock-free ring: [`CompletionQueue::poll`] costs no system call.
//! A [`CompletionChannel`] is an eventfd: after [`CompletionQueue::req_notify`], the next
//! completion (or, with `solicited_only`, the next solicited or failed one) makes the fd
//! readable and queues the CQ for [`CompletionChannel::get_event`]. The fd works with `poll`,
//! epoll and tokio's `AsyncFd`.
//!
//! The process's progress engine ([`crate::engine`]) drives the device and fills the CQs
//! whatever the application does, so [`CompletionChannel::wait_event`] only waits on the
//! eventfd. Polling an empty CQ also drives the device once in the caller's thread (one
//! `recvmmsg` per open address, timers, transmissions): a busy-polling caller then gets its
//! completions without a thread hop, and the engine leaves the device to it meanwhile.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::Waker;
use std::time::{Duration, Instant};

use rdma_proto::verbs::{Completion, WcOpcode};

use super::cq_wake::{self, Wake};
use super::mpmc::Ring;
use crate::quota::QuotaSlot;
use crate::{Error, Result};

const DISARMED: u8 = 0;
const ARMED_SOLICITED: u8 = 1;
const ARMED_ANY: u8 = 2;

pub(crate) struct CqShared {
    id: u32,
    ring: Ring<Completion>,
    armed: AtomicU8,
    overflowed: AtomicBool,
    channel: Option<CompletionChannel>,
    /// Tasks woken at the next event instead of the channel ([`CompletionQueue::notify_waker`]),
    /// each with whether it waits for receive completions only
    /// ([`CompletionQueue::notify_waker_for_recv`]).
    wakers: Mutex<Vec<(Waker, bool)>>,
    dev: Option<Weak<dyn PolledDevice>>,
    /// Its place among the device's live CQs (none for a CQ without a device).
    _slot: Option<QuotaSlot>,
}

/// What a CQ asks of its device (the verbs layer's device state implements it): polling an
/// empty CQ drives the device, arming it hands the device back to the engine.
pub(crate) trait PolledDevice: Send + Sync {
    /// One non-blocking drive, when no one else is driving (a poll found the CQ empty).
    fn drive_once(&self);
    /// One progress round as a busy poller (`poll_one` found the CQ empty).
    fn progress_once(&self);
    /// The caller stops busy-polling: the engine takes the device back at once.
    fn end_inline(&self);
}

/// A completion queue.
///
/// ```
/// use rdma_soft::verbs::{Device, DeviceConfig};
/// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
/// let ch = dev.create_comp_channel().unwrap();
/// let cq = dev.create_cq(16, Some(&ch)).unwrap();
/// let mut wc = Vec::with_capacity(16);
/// assert_eq!(cq.poll(&mut wc, 16), 0); // nothing yet, and no system call
/// cq.req_notify(false).unwrap();
/// assert!(ch.get_event().unwrap().is_none());
/// ```
#[derive(Clone)]
pub struct CompletionQueue {
    inner: Arc<CqShared>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("id", &self.inner.id)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl PartialEq for CompletionQueue {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl CompletionQueue {
    #[cfg(test)]
    pub(crate) fn new(id: u32, cqe: usize, channel: Option<&CompletionChannel>) -> Self {
        Self::with_device(None, (id, None), cqe, channel)
    }

    /// A CQ of `dev`, numbered and counted by its slot: polling it drives the device.
    pub(crate) fn new_on(
        dev: Weak<dyn PolledDevice>,
        (id, slot): (u32, QuotaSlot),
        cqe: usize,
        channel: Option<&CompletionChannel>,
    ) -> Self {
        Self::with_device(Some(dev), (id, Some(slot)), cqe, channel)
    }

    fn with_device(
        dev: Option<Weak<dyn PolledDevice>>,
        (id, slot): (u32, Option<QuotaSlot>),
        cqe: usize,
        channel: Option<&CompletionChannel>,
    ) -> Self {
        CompletionQueue {
            inner: Arc::new(CqShared {
                id,
                ring: Ring::new(cqe),
                armed: AtomicU8::new(DISARMED),
                overflowed: AtomicBool::new(false),
                channel: channel.cloned(),
                wakers: Mutex::new(Vec::new()),
                dev,
                _slot: slot,
            }),
        }
    }

    /// The CQ's number on its device.
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// How many completions it holds (at least the `cqe` asked for).
    pub fn capacity(&self) -> usize {
        self.inner.ring.capacity()
    }

    /// Moves up to `max` completions into `out` (appending); returns how many. When the queue
    /// is empty it first drives the device once ([`crate::verbs::Device::progress`]: one `recvmmsg`
    /// per open address, skipped if another thread is driving it); with completions queued
    /// it makes no system call.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        if max > 0 && self.inner.ring.len() == 0 {
            self.drive();
        }
        self.poll_queued(out, max)
    }

    /// Like [`Self::poll`], for a caller that polls once before it sleeps on the completion
    /// channel (an event loop), not a busy poller: the device is driven only if no other
    /// thread drives it, and the progress engine keeps it (no hand-off to this thread and
    /// back, no engine wake-up when the caller then arms the CQ).
    ///
    /// ```
    /// use rdma_soft::verbs::{Device, DeviceConfig};
    /// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    /// let cq = dev.create_cq(16, None).unwrap();
    /// let mut out = Vec::new();
    /// assert_eq!(cq.poll_once(&mut out, 16), 0);
    /// ```
    pub fn poll_once(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        if max > 0 && self.inner.ring.len() == 0 {
            if let Some(dev) = self.device() {
                dev.drive_once();
            }
        }
        self.poll_queued(out, max)
    }

    /// Like [`Self::poll`] without driving the device: only what is already queued.
    pub fn poll_queued(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            match self.inner.ring.pop() {
                Some(c) => {
                    out.push(c);
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    /// The oldest completion, if any (driving the device once when the queue is empty).
    pub fn poll_one(&self) -> Option<Completion> {
        if let Some(c) = self.inner.ring.pop() {
            return Some(c);
        }
        self.drive();
        self.inner.ring.pop()
    }

    fn drive(&self) {
        if let Some(dev) = self.device() {
            dev.progress_once();
        }
    }

    fn device(&self) -> Option<Arc<dyn PolledDevice>> {
        self.inner.dev.as_ref().and_then(Weak::upgrade)
    }

    /// Whether this CQ belongs to the device whose state is `dev`.
    pub(crate) fn same_device<T>(&self, dev: &Arc<T>) -> bool {
        self.inner
            .dev
            .as_ref()
            .is_some_and(|d| std::ptr::eq(d.as_ptr() as *const (), Arc::as_ptr(dev) as *const ()))
    }

    /// Asks for one event on the completion channel at the next completion
    /// (`solicited_only`: the next solicited receive or failed completion). EINVAL without a
    /// channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.inner.channel.is_none() {
            return Err(Error::InvalidArgument("CQ has no completion channel"));
        }
        let want = if solicited_only {
            ARMED_SOLICITED
        } else {
            ARMED_ANY
        };
        // Arming for any completion widens an earlier solicited-only request, never narrows it.
        self.inner.armed.fetch_max(want, Ordering::AcqRel);
        // Pairs with the fence in `push` (see there): the caller's poll after this sees a
        // completion pushed before the device saw the arming.
        std::sync::atomic::fence(Ordering::SeqCst);
        // The caller is about to sleep on the channel: no longer a busy poller, so the engine
        // takes the device back at once instead of after the hand-off time.
        if let Some(dev) = self.device() {
            dev.end_inline();
        }
        Ok(())
    }

    /// Like `req_notify(false)` for an async task: the next completion wakes `w` directly
    /// (from the thread that pushes it, no eventfd and no reactor in between) instead of
    /// firing the channel; wakers registered when the event comes take it all, the channel
    /// gets it when none is. Look at the queue after this call (a completion may have come
    /// before the arming), and [`Self::forget_waker`] when the task stops waiting.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::task::{Wake, Waker};
    /// use rdma_soft::verbs::{Device, DeviceConfig};
    /// struct Task;
    /// impl Wake for Task {
    ///     fn wake(self: Arc<Self>) {}
    /// }
    /// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    /// let cq = dev.create_cq(16, None).unwrap();
    /// let w = Waker::from(Arc::new(Task));
    /// cq.notify_waker(&w);
    /// assert_eq!(cq.queued(), 0);
    /// cq.forget_waker(&w);
    /// ```
    pub fn notify_waker(&self, w: &Waker) {
        self.register_waker(w, false);
    }

    /// Like [`Self::notify_waker`] for a task that waits for a receive: a successful
    /// send-side completion (SEND, WRITE, READ, atomic) neither wakes it nor fires the
    /// channel while only such tasks wait (it stays queued for the next poll); a receive
    /// or any failed completion wakes it as usual.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::task::{Wake, Waker};
    /// use rdma_soft::verbs::{Device, DeviceConfig};
    /// struct Task;
    /// impl Wake for Task {
    ///     fn wake(self: Arc<Self>) {}
    /// }
    /// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    /// let cq = dev.create_cq(16, None).unwrap();
    /// let w = Waker::from(Arc::new(Task));
    /// cq.notify_waker_for_recv(&w);
    /// cq.forget_waker(&w);
    /// ```
    pub fn notify_waker_for_recv(&self, w: &Waker) {
        self.register_waker(w, true);
    }

    fn register_waker(&self, w: &Waker, recv_only: bool) {
        {
            let mut ws = self.inner.wakers.lock().unwrap_or_else(|e| e.into_inner());
            match ws.iter_mut().find(|x| x.0.will_wake(w)) {
                Some(x) => x.1 = recv_only,
                None => ws.push((w.clone(), recv_only)),
            }
        }
        self.inner.armed.fetch_max(ARMED_ANY, Ordering::AcqRel);
        // Pairs with the fence in `push`, as in `req_notify`.
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Takes back a waker [`Self::notify_waker`] registered (the task no longer waits), so
    /// that the next event goes to the channel if nobody else waits.
    pub fn forget_waker(&self, w: &Waker) {
        let mut ws = self.inner.wakers.lock().unwrap_or_else(|e| e.into_inner());
        ws.retain(|x| !x.0.will_wake(w));
    }

    /// How many completions are queued now (no driving).
    pub fn queued(&self) -> usize {
        self.inner.ring.len()
    }

    /// Whether a completion was lost because the queue was full (the IB "CQ overrun" error).
    pub fn overflowed(&self) -> bool {
        self.inner.overflowed.load(Ordering::Acquire)
    }

    /// Device side: adds a completion and fires the channel if armed. A full queue refuses it
    /// (EOVERFLOW-like `QueueFull`) and records the overrun.
    pub(crate) fn push(&self, c: Completion) -> Result<()> {
        if self.inner.ring.push(c).is_err() {
            self.inner.overflowed.store(true, Ordering::Release);
            return Err(Error::QueueFull("completion queue"));
        }
        // Pairs with the fence in `req_notify`: the push is visible to a caller that armed
        // and then polls, or its arming is visible here (a release store followed by a load
        // may otherwise be reordered, and the completion would wake nobody).
        std::sync::atomic::fence(Ordering::SeqCst);
        let armed = self.inner.armed.load(Ordering::Acquire);
        let fire = match armed {
            ARMED_ANY => true,
            ARMED_SOLICITED => c.solicited || !c.status.is_success(),
            _ => false,
        };
        if !fire {
            return Ok(());
        }
        let mut ws = self.inner.wakers.lock().unwrap_or_else(|e| e.into_inner());
        // Only tasks waiting for a receive, and a send-side success: nobody to wake yet
        // (the CQ stays armed; the next receive wakes them, and they take this one too).
        let sent = c.status.is_success()
            && !matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        if sent && !ws.is_empty() && ws.iter().all(|x| x.1) {
            return Ok(());
        }
        if self
            .inner
            .armed
            .compare_exchange(armed, DISARMED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // Drained in place (the list keeps its allocation); under a runtime guard the
            // wake-ups only queue, so none runs under this lock.
            let any = !ws.is_empty();
            ws.drain(..).for_each(|w| cq_wake::wake(Wake::Task(w.0)));
            drop(ws);
            match &self.inner.channel {
                Some(ch) if !any => {
                    cq_wake::wake(Wake::Channel(ch.clone(), Arc::downgrade(&self.inner)))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

struct ChannelShared {
    efd: crate::fd::EventFd,
    pending: Mutex<VecDeque<Weak<CqShared>>>,
}

/// A completion channel (`ibv_comp_channel`): an eventfd that polls readable while CQ events
/// are pending.
///
/// ```
/// use std::os::fd::AsRawFd;
/// use rdma_soft::verbs::{Device, DeviceConfig};
/// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
/// let ch = dev.create_comp_channel().unwrap();
/// assert!(ch.as_raw_fd() >= 0); // register it with epoll or tokio's AsyncFd
/// ```
#[derive(Clone)]
pub struct CompletionChannel {
    inner: Arc<ChannelShared>,
}

impl std::fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("fd", &self.inner.efd.as_raw_fd())
            .finish()
    }
}

impl CompletionChannel {
    pub(crate) fn new() -> Result<CompletionChannel> {
        let efd = crate::fd::EventFd::new().map_err(|source| Error::Os {
            op: "eventfd",
            addr: None,
            source,
        })?;
        Ok(CompletionChannel {
            inner: Arc::new(ChannelShared {
                efd,
                pending: Mutex::new(VecDeque::new()),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Weak<CqShared>>> {
        self.inner.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues an event for `cq`; the fd becomes readable. Done under the lock so that the fd is
    /// readable exactly while events are pending.
    pub(super) fn signal(&self, cq: Weak<CqShared>) {
        let mut q = self.lock();
        q.push_back(cq);
        self.inner.efd.signal();
    }

    /// The next CQ event without blocking (`ibv_get_cq_event` on a non-blocking channel).
    pub fn get_event(&self) -> Result<Option<CompletionQueue>> {
        let mut q = self.lock();
        while let Some(weak) = q.pop_front() {
            if q.is_empty() {
                self.inner.efd.clear();
            }
            if let Some(inner) = weak.upgrade() {
                return Ok(Some(CompletionQueue { inner }));
            }
        }
        Ok(None)
    }

    /// Waits up to `timeout` (forever with `None`) for a CQ event (`ibv_get_cq_event` on a
    /// blocking channel). It blocks in `poll(2)` on the eventfd alone: the progress engine
    /// receives, acknowledges, retransmits and fills the CQs meanwhile.
    pub fn wait_event(&self, timeout: Option<Duration>) -> Result<Option<CompletionQueue>> {
        let end = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(cq) = self.get_event()? {
                return Ok(Some(cq));
            }
            if end.is_some_and(|e| Instant::now() >= e) {
                return Ok(None);
            }
            crate::wait::wait_fds(&[self.inner.efd.as_raw_fd()], end)?;
        }
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.efd.as_fd()
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.efd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_proto::verbs::{WcOpcode, WcStatus};

    fn wc(id: u64, solicited: bool, status: WcStatus) -> Completion {
        let mut c = Completion::new(id, status, WcOpcode::Recv, 3);
        c.solicited = solicited;
        c
    }

    #[test]
    fn poll_in_order_and_overflow() {
        let cq = CompletionQueue::new(1, 4, None);
        for i in 0..4 {
            cq.push(wc(i, false, WcStatus::Success)).unwrap();
        }
        assert_eq!(
            cq.push(wc(9, false, WcStatus::Success))
                .unwrap_err()
                .errno(),
            libc::ENOMEM
        );
        assert!(cq.overflowed());
        let mut out = Vec::new();
        assert_eq!(cq.poll(&mut out, 3), 3);
        assert_eq!(cq.poll_one().map(|c| c.wr_id), Some(3));
        assert_eq!(out.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(cq.req_notify(false).unwrap_err().errno(), libc::EINVAL);
    }

    #[test]
    fn notify_once_per_arm_and_solicited_only() {
        let ch = CompletionChannel::new().unwrap();
        let cq = CompletionQueue::new(7, 8, Some(&ch));
        cq.push(wc(0, false, WcStatus::Success)).unwrap();
        assert!(ch.get_event().unwrap().is_none(), "not armed");
        cq.req_notify(false).unwrap();
        cq.push(wc(1, false, WcStatus::Success)).unwrap();
        cq.push(wc(2, false, WcStatus::Success)).unwrap();
        assert_eq!(
            ch.wait_event(Some(Duration::from_secs(1))).unwrap(),
            Some(cq.clone())
        );
        assert!(ch.get_event().unwrap().is_none(), "one event per arm");
        cq.req_notify(true).unwrap();
        cq.push(wc(3, false, WcStatus::Success)).unwrap();
        assert!(
            ch.get_event().unwrap().is_none(),
            "unsolicited success does not fire"
        );
        cq.push(wc(4, true, WcStatus::Success)).unwrap();
        assert_eq!(ch.get_event().unwrap().map(|c| c.id()), Some(7));
        cq.req_notify(true).unwrap();
        cq.push(wc(5, false, WcStatus::RemAccessErr)).unwrap();
        assert!(ch.get_event().unwrap().is_some(), "errors always fire");
        assert!(ch
            .wait_event(Some(Duration::from_millis(1)))
            .unwrap()
            .is_none());
    }

    #[test]
    #[allow(unsafe_code)]
    fn channel_fd_with_tokio_async_fd() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let ch = CompletionChannel::new().unwrap();
            let cq = CompletionQueue::new(2, 8, Some(&ch));
            // SAFETY: the AsyncFd owns a clone of the channel, which owns the fd, so the fd
            // stays open as long as it is registered.
            let afd = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(
                    ch.clone(),
                    tokio::io::Interest::READABLE,
                )
            }
            .unwrap();
            cq.req_notify(false).unwrap();
            let producer = cq.clone();
            let t = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                producer.push(wc(42, false, WcStatus::Success)).unwrap();
            });
            let mut guard = tokio::time::timeout(Duration::from_secs(2), afd.readable())
                .await
                .expect("the channel fd became readable")
                .unwrap();
            let got = afd.get_ref().get_event().unwrap().expect("an event");
            guard.clear_ready();
            assert_eq!(got.poll_one().map(|c| c.wr_id), Some(42));
            t.join().unwrap();
        });
    }
}
