//! The state a connection's task and its futures share, and the task itself.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use rdma_soft::verbs::{
    Completion, CompletionChannel, MemoryRegion, SendOp, SendWr, WcOpcode, WcStatus,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use super::setup::Parts;
use super::{tag, IMM_CTRL, TAG_CTRL, TAG_OP, TAG_RECV, TAG_SEND, TAG_SHIFT};
use crate::cm::channel::EventChannel;
use crate::cm::event::Event;
use crate::cm::id::CmId;
use crate::error::CloseReason;
use crate::params::EventType;

thread_local! {
    /// The completions buffer of [`Shared::on_queued`].
    static SCRATCH: std::cell::RefCell<Vec<Completion>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The slot of the fence's wr_id (tag [`TAG_CTRL`]; credit messages use slot 0).
const FENCE: u32 = 1;

/// The shared state, behind one mutex.
pub(super) struct State {
    pub closed: Option<CloseReason>,
    /// The connection's window (the smaller of both ends'): the peer's data receives.
    pub window: u32,
    /// The CM reported DISCONNECTED (the peer answered or sent its DREQ).
    pub disconnected: bool,
    /// `rdma_disconnect` was called (DREQ or DREP sent, QP in Err).
    pub dreq_sent: bool,
    pub data_credits: u32,
    pub ctrl_credits: u32,
    pub free_send: Vec<u32>,
    /// Received messages (slot, length) not yet taken.
    pub received: VecDeque<(u32, u32)>,
    /// Bytes of the front message already taken by a byte stream read.
    pub read_off: usize,
    /// Data receives reposted and not yet announced to the peer.
    pub ret_data: u32,
    /// Control receives reposted and not yet announced.
    pub ret_ctrl: u32,
    /// Data credits announced to the peer in total, and data messages received: the
    /// peer holds at most `WINDOW + returned - received_data` credits.
    pub returned: u64,
    pub received_data: u64,
    /// Outstanding operations (one-sided, owned sends): `None` until their completion's
    /// status arrives.
    pub ops: HashMap<u64, Option<WcStatus>>,
    /// Regions of operations whose future was dropped before the completion: kept
    /// registered until it comes, so the device never meets a vanished buffer.
    pub orphans: HashMap<u64, MemoryRegion>,
    pub next_op: u64,
    /// Tasks polling (the byte stream), woken with every change.
    pub wakers: Vec<Waker>,
    /// Length of the message last posted from each send buffer.
    pub send_len: Vec<u32>,
    /// Send buffers whose message completed in error (flushed by a close), in completion
    /// order: what [`super::Connection::reconnect`] hands back.
    pub flushed: Vec<u32>,
    /// The send queue as posted by this layer, oldest first: each WR's id, and the send
    /// buffer of an unsignaled SEND (retired, with no completion of its own, by the
    /// completion of any later WR: an RC send queue completes in order).
    pub sq: VecDeque<(u64, Option<u32>)>,
    /// Unsignaled SENDs posted since the last signaled WR.
    pub unsignaled_tail: u32,
}

impl State {
    pub fn new(window: u32) -> State {
        State {
            closed: None,
            window,
            disconnected: false,
            dreq_sent: false,
            data_credits: window,
            ctrl_credits: super::CONTROL_WINDOW,
            free_send: (0..window).rev().collect(),
            received: VecDeque::new(),
            read_off: 0,
            ret_data: 0,
            ret_ctrl: 0,
            returned: 0,
            received_data: 0,
            ops: HashMap::new(),
            orphans: HashMap::new(),
            next_op: 0,
            wakers: Vec::new(),
            send_len: vec![0; window as usize],
            flushed: Vec::new(),
            sq: VecDeque::new(),
            unsignaled_tail: 0,
        }
    }

    /// Whether the next SEND of a send buffer asks for a completion: every
    /// (window / 2)th one, and the one that takes the last free buffer (so that a
    /// sender out of buffers always waits for a completion that frees some). The others
    /// ask for no ACK of their own (the transport's ACKs on demand): a ping-pong moves one
    /// record per message instead of two, and wakes no one for an ACK.
    pub fn signal_next_send(&self) -> bool {
        self.unsignaled_tail + 1 >= self.window / 2 || self.free_send.len() <= 1
    }

    /// Records a posted WR in the mirror of the send queue.
    pub fn posted(&mut self, wr_id: u64, unsignaled_slot: Option<u32>) {
        self.sq.push_back((wr_id, unsignaled_slot));
        match unsignaled_slot {
            Some(_) => self.unsignaled_tail += 1,
            None => self.unsignaled_tail = 0,
        }
    }

    /// A send-queue completion for `wr_id`: the unsignaled SENDs posted before it are done
    /// (their buffers are free again). Ids this layer did not post (a WR the application
    /// posted on [`super::Connection::qp`]) retire nothing.
    fn retire_through(&mut self, wr_id: u64) {
        let Some(pos) = self.sq.iter().position(|e| e.0 == wr_id) else {
            return;
        };
        for (_, slot) in self.sq.drain(..=pos).take(pos) {
            if let Some(slot) = slot {
                self.free_send.push(slot);
            }
        }
        if self.sq.is_empty() {
            self.unsignaled_tail = 0;
        }
    }

    /// Whether unsignaled SENDs wait for a later signaled WR to report them done
    /// ([`Shared::fence`] posts one).
    pub fn needs_fence(&self) -> bool {
        self.unsignaled_tail > 0
    }

    fn peer_credits_at_most(&self) -> u64 {
        (self.window as u64 + self.returned).saturating_sub(self.received_data)
    }

    /// The immediate of the next SEND (the credits it returns), counted as returned.
    pub fn take_returns(&mut self) -> u32 {
        let imm = self.ret_data | (self.ret_ctrl << 16);
        self.returned += self.ret_data as u64;
        self.ret_data = 0;
        self.ret_ctrl = 0;
        imm
    }

    /// A new operation number (the wr_id of tag [`TAG_OP`]).
    pub fn new_op(&mut self) -> u64 {
        let id = self.next_op;
        self.next_op = (self.next_op + 1) & ((1 << TAG_SHIFT) - 1);
        self.ops.insert(id, None);
        tag(TAG_OP, 0) | id
    }

    /// Adds `w` to the tasks woken at the next change (once).
    pub fn register(&mut self, w: &Waker) {
        if !self.wakers.iter().any(|x| x.will_wake(w)) {
            self.wakers.push(w.clone());
        }
    }

    /// Sends nothing is outstanding for (every send buffer back, no operation pending).
    pub fn sends_idle(&self) -> bool {
        self.free_send.len() == self.window as usize && self.ops.is_empty()
    }
}

pub(super) struct Shared {
    pub parts: Parts,
    /// The device's tokio driver (kept alive while the connection is).
    pub _driver: Option<Arc<super::driver::WireDriver>>,
    pub afd: AsyncFd<CompletionChannel>,
    pub st: Mutex<State>,
    /// The connection's largest message (the smaller of both ends').
    pub max_message: usize,
    pub changed: Notify,
    /// The connection's id: why its QP went to ERR, when the CM did it.
    pub id: Weak<CmId>,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every waiting future and polling task.
    pub fn wake(&self, st: &mut State) {
        for w in st.wakers.drain(..) {
            w.wake();
        }
        self.changed.notify_waiters();
    }

    /// Marks the connection closed (the first reason wins) and wakes every future.
    pub fn close(&self, st: &mut State, why: CloseReason) {
        if st.closed.is_none() {
            st.closed = Some(why);
        }
        self.wake(st);
    }

    /// Sends a control message when the peer may be short of credits we owe it.
    pub fn maybe_return_credits(&self, st: &mut State) {
        if st.closed.is_some() || st.ret_data == 0 || st.ctrl_credits == 0 {
            return;
        }
        if st.ret_data < st.window / 2 && st.peer_credits_at_most() > 0 {
            return;
        }
        let imm = IMM_CTRL | st.take_returns();
        let wr = SendWr::new(tag(TAG_CTRL, 0), SendOp::SendWithImm { imm }).signaled();
        match self.parts.qp.post_send(&wr) {
            Ok(()) => {
                st.ctrl_credits -= 1;
                st.posted(wr.wr_id, None);
            }
            Err(e) => self.close(st, CloseReason::PostFailed(e.to_string())),
        }
    }

    /// Posts a signaled zero-length RDMA WRITE after unsignaled SENDs, so that their end
    /// is reported (a flush waits for it). A zero-length WRITE names no memory: the peer
    /// checks no key (IBA 9.7.4.1.5), only that its QP allows remote writes, as every QP
    /// the CM sets up does (Linux's included).
    pub fn fence(&self, st: &mut State) {
        if st.closed.is_some() || !st.needs_fence() {
            return;
        }
        let wr = SendWr::new(
            tag(TAG_CTRL, FENCE),
            SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            },
        )
        .signaled();
        match self.parts.qp.post_send(&wr) {
            Ok(()) => st.posted(wr.wr_id, None),
            Err(e) => self.close(st, CloseReason::PostFailed(e.to_string())),
        }
    }

    fn on_completion(&self, st: &mut State, c: &Completion) -> Option<WcStatus> {
        let kind = c.wr_id >> TAG_SHIFT;
        let slot = (c.wr_id & ((1 << TAG_SHIFT) - 1)) as u32;
        if kind != TAG_RECV {
            st.retire_through(c.wr_id);
        }
        if kind == TAG_OP {
            let id = c.wr_id & ((1 << TAG_SHIFT) - 1);
            if let Some(op) = st.ops.get_mut(&id) {
                *op = Some(c.status);
            }
            if st.orphans.remove(&id).is_some() {
                st.ops.remove(&id);
            }
        }
        if !c.status.is_success() {
            if kind == TAG_SEND {
                st.flushed.push(slot);
            }
            // Flushes after a close are expected; anything else closes the connection.
            if st.closed.is_none() {
                // Flushed because the align policy ended the connection (the CM moved the
                // QP to ERR before its DISCONNECTED reached us): that is the reason.
                let id = self.id.upgrade();
                let moved = match c.status {
                    WcStatus::WrFlushErr => id.and_then(|id| id.align_status()),
                    // Under migrate, the last path failed too: the CM ends it as align.
                    WcStatus::RetryExcErr if id.is_some_and(|id| id.paths_exhausted()) => {
                        Some(crate::ha_policy::ALIGN_PATH_MOVED)
                    }
                    _ => None,
                };
                let why = match moved {
                    Some(status) => CloseReason::PathMoved { status },
                    None => CloseReason::Failed(c.status),
                };
                self.close(st, why);
                if kind == TAG_SEND {
                    st.free_send.push(slot);
                }
                return Some(c.status);
            }
            if kind == TAG_SEND {
                st.free_send.push(slot);
            }
            return None;
        }
        match kind {
            TAG_SEND => st.free_send.push(slot),
            TAG_RECV => {
                let imm = c.imm().unwrap_or(0);
                st.data_credits += imm & 0xffff;
                st.ctrl_credits += (imm >> 16) & 0xff;
                if c.opcode == WcOpcode::Recv && imm & IMM_CTRL != 0 {
                    st.ret_ctrl += 1;
                    if let Err(e) = self.parts.post_recv(slot) {
                        self.close(st, CloseReason::PostFailed(e.to_string()));
                    }
                } else {
                    st.received.push_back((slot, c.byte_len));
                    st.received_data += 1;
                }
            }
            _ => {}
        }
        None
    }

    /// Takes every queued completion; returns the first failure status, if any. The CQ is
    /// popped under the state lock, so that completions are processed in their order
    /// whichever task drains.
    pub fn drain(&self, buf: &mut Vec<Completion>) -> Option<WcStatus> {
        let mut failed = None;
        // The device is driven only when nothing was queued: after a batch, what is left
        // is the engine's (driving again cost a receive's system call per wake-up).
        let mut took = false;
        loop {
            let mut st = self.lock();
            buf.clear();
            let n = match took {
                false => self.parts.bufs.cq.poll_once(buf, 64),
                true => self.parts.bufs.cq.poll_queued(buf, 64),
            };
            took |= n > 0;
            if n == 0 {
                // About to sleep: arm, then look once more (a completion may have come in
                // between).
                if self.parts.bufs.cq.req_notify(false).is_err()
                    || self.parts.bufs.cq.poll_queued(buf, 64) == 0
                {
                    return failed;
                }
            }
            for c in buf.iter() {
                failed = failed.or(self.on_completion(&mut st, c));
            }
            self.maybe_return_credits(&mut st);
            self.wake(&mut st);
        }
    }

    /// Takes the channel's events and the CQ's completions after the fd was readable.
    pub fn on_readable(&self, id: Option<&CmId>) {
        while let Ok(Some(_)) = self.parts.bufs.cc.get_event() {}
        self.on_queued(id);
    }

    /// Takes the CQ's completions ([`CqWait`] said some are queued).
    pub fn on_queued(&self, id: Option<&CmId>) {
        // A per-thread buffer: no allocation per wake-up.
        let failed = SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut buf) => self.drain(&mut buf),
            Err(_) => self.drain(&mut Vec::with_capacity(64)),
        });
        if failed.is_some() {
            if let Some(id) = id {
                self.disconnect_id(id);
            }
        }
    }

    /// For a poll-based caller that found nothing to do and registered its waker (under
    /// the lock): watches the completion channel too. `Ready` means "look again".
    pub fn poll_completions(&self, cx: &mut Context<'_>, id: Option<&CmId>) -> Poll<()> {
        match self.afd.poll_read_ready(cx) {
            Poll::Ready(Ok(mut g)) => {
                g.clear_ready();
                self.on_readable(id);
                Poll::Ready(())
            }
            // The reactor is gone: the connection's task notices too; wait for its close.
            Poll::Ready(Err(_)) => Poll::Pending,
            Poll::Pending => Poll::Pending,
        }
    }

    /// `rdma_disconnect` once (DREQ, or DREP when the peer disconnected first; the QP goes
    /// to Err and every outstanding work request is flushed).
    pub fn disconnect_id(&self, id: &CmId) {
        let mut st = self.lock();
        Self::disconnect_locked(&mut st, id);
    }

    /// [`Shared::disconnect_id`] under the state lock, so that a future that sees the
    /// close also sees the QP in Err.
    fn disconnect_locked(st: &mut State, id: &CmId) {
        if !std::mem::replace(&mut st.dreq_sent, true) {
            // Fails only when the CM already tore the connection down; then the QP is
            // already in Err.
            let _ = id.disconnect();
        }
    }
}

/// A DISCONNECTED status of the align policy (the CM ended the connection itself).
fn is_align_status(status: i32) -> bool {
    status == crate::ha_policy::ALIGN_PATH_MOVED || status == crate::ha_policy::ALIGN_ADDR_GONE
}

/// The connection's task: sleeps on the completion channel and the event channel.
pub(super) async fn run(
    sh: Arc<Shared>,
    ch: Arc<EventChannel>,
    id: Weak<CmId>,
    events: tokio::sync::mpsc::UnboundedSender<Event>,
) {
    let mut buf = Vec::with_capacity(64);
    loop {
        if sh.drain(&mut buf).is_some() {
            if let Some(id) = id.upgrade() {
                sh.disconnect_id(&id);
            }
        }
        tokio::select! {
            ev = ch.next_event() => {
                let Ok(ev) = ev else { return };
                let why = match ev.kind() {
                    EventType::TimewaitExit => continue,
                    EventType::Disconnected if is_align_status(ev.status()) => {
                        Some(CloseReason::PathMoved { status: ev.status() })
                    }
                    EventType::Disconnected => Some(CloseReason::PeerDisconnected),
                    k @ (EventType::Unreachable
                    | EventType::ConnectError
                    | EventType::DeviceRemoval
                    | EventType::Rejected) => Some(CloseReason::Event(k)),
                    _ => None,
                };
                let disconnected = ev.kind() == EventType::Disconnected;
                // Handed over (acknowledged when the application drops it, or at once if
                // the connection is gone) before this task may hold the last reference to
                // the id: destroying an id waits for its events to be acknowledged.
                drop(events.send(ev));
                if let Some(why) = why {
                    // A failure the device already reported (a WRITE refused by the peer,
                    // which then disconnected) is the reason, not the event it caused: the
                    // CQ is taken first.
                    sh.drain(&mut buf);
                    // Closed, QP in Err, then woken: under one lock, so no future returns
                    // the close while the QP is still RTS.
                    let id = id.upgrade();
                    let mut st = sh.lock();
                    st.disconnected |= disconnected;
                    // The CM put the QP in ERR before it queued the event: the flushes
                    // may have closed the connection first, but the path moving is why.
                    let flushed = st.closed == Some(CloseReason::Failed(WcStatus::WrFlushErr));
                    if flushed && matches!(why, CloseReason::PathMoved { .. }) {
                        st.closed = Some(why);
                    } else {
                        st.closed.get_or_insert(why);
                    }
                    if let Some(id) = &id {
                        Shared::disconnect_locked(&mut st, id);
                    }
                    sh.wake(&mut st);
                }
            }
            g = sh.afd.readable() => {
                let Ok(mut g) = g else { return };
                while let Ok(Some(_)) = sh.parts.bufs.cc.get_event() {}
                g.clear_ready();
            }
        }
    }
}

/// Ready when the CQ holds a completion; the device wakes the task directly at the next one
/// (`CompletionQueue::notify_waker`: no eventfd, no reactor, no second task in between),
/// and the waker is taken back when the wait ends or is dropped, so that the connection's
/// task gets the channel's event when nobody waits.
pub(super) struct CqWait<'a> {
    cq: &'a rdma_soft::verbs::CompletionQueue,
    waker: Option<Waker>,
    /// Woken by receive (and failed) completions only
    /// (`CompletionQueue::notify_waker_for_recv`).
    recv_only: bool,
}

impl<'a> CqWait<'a> {
    pub fn new(cq: &'a rdma_soft::verbs::CompletionQueue, recv_only: bool) -> CqWait<'a> {
        CqWait {
            cq,
            waker: None,
            recv_only,
        }
    }
}

impl std::future::Future for CqWait<'_> {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            if let Some(old) = self.waker.take() {
                self.cq.forget_waker(&old);
            }
            self.waker = Some(cx.waker().clone());
        }
        match self.recv_only {
            true => self.cq.notify_waker_for_recv(cx.waker()),
            false => self.cq.notify_waker(cx.waker()),
        }
        if self.cq.queued() > 0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for CqWait<'_> {
    fn drop(&mut self) {
        if let Some(w) = self.waker.take() {
            self.cq.forget_waker(&w);
        }
    }
}
