//! Which RC QPs a progress round looks at: those with work (a packet arrived, a post or
//! modify ran, more to send) and those whose transport timer is due; never every QP. A
//! device with 50,000 idle connections costs a round what one with one does.
//!
//! Timers live in a heap of `(deadline, slot, QPN)`. A QP's `armed` is the earliest
//! deadline it has in the heap; a transport timer that moves later leaves its entry in
//! place, and the entry, when it comes up, is re-pushed at the QP's actual deadline (so a
//! per-packet timer restart costs nothing here). Entries of destroyed QPs or superseded
//! deadlines are dropped when they come up; the heap is rebuilt when such entries
//! outnumber the QPs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rdma_proto::memory::MemoryTable;

use super::Runtime;

/// What [`Runtime::service`] left behind for a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Serviced {
    /// Nothing to send right now.
    Done,
    /// Its budget ran out with more to send: another round.
    More,
    /// Its host-local ring is full: looked at again by every progress until the peer
    /// makes room.
    Blocked,
}

/// The work list and the timer heap.
#[derive(Debug)]
pub(crate) struct Sched {
    /// Slots to service in the next round, each once (`QpCtx::queued`).
    work: Vec<u16>,
    /// The list being serviced (swapped with `work`: no allocation per round).
    spare: Vec<u16>,
    /// Slots whose host-local ring was full (`QpCtx::blocked`).
    blocked: Vec<u16>,
    timers: BinaryHeap<Reverse<(u64, u16, u32)>>,
}

/// Room the lists and the heap start with: a round that queues more QPs than any before
/// grows a list (an allocation), and the two work lists take turns, so each would grow on
/// its own, at some later round; this many cost no allocation on the packet path.
const ROOM: usize = 64;

impl Default for Sched {
    fn default() -> Sched {
        Sched {
            work: Vec::with_capacity(ROOM),
            spare: Vec::with_capacity(ROOM),
            blocked: Vec::with_capacity(ROOM),
            timers: BinaryHeap::with_capacity(4 * ROOM),
        }
    }
}

impl Sched {
    /// Appends a slot the caller marked `queued`.
    pub(crate) fn push_work(&mut self, idx: u16) {
        self.work.push(idx);
    }
}

impl Runtime {
    /// Puts slot `idx` on the next round's work list (once).
    pub(crate) fn queue(&mut self, idx: usize) {
        if let Some(ctx) = self.slots.get_mut(idx).and_then(|s| s.as_deref_mut()) {
            if !ctx.queued {
                ctx.queued = true;
                self.sched.work.push(idx as u16);
            }
        }
    }

    /// Gives slot `idx`'s transport deadline an entry in the heap if it has none as early.
    pub(crate) fn rearm(&mut self, idx: usize) {
        let Some(ctx) = self.slots.get_mut(idx).and_then(|s| s.as_deref_mut()) else {
            return;
        };
        let Some(t) = ctx.rc.poll_timeout() else {
            return;
        };
        if none_or_later(ctx.armed, t) {
            ctx.armed = Some(t);
            self.sched.timers.push(Reverse((t, idx as u16, ctx.qpn)));
            // an earlier deadline than the heap had for this QP: whoever drove this
            // progress tells the engine (a transmit alone can arm a timer)
            self.timers_touched = true;
        }
        if self.sched.timers.len() > 2 * self.live.len() + 64 {
            self.rebuild_timers();
        }
    }

    fn rebuild_timers(&mut self) {
        let mut heap = std::mem::take(&mut self.sched.timers).into_vec();
        heap.clear();
        for &i in &self.live {
            if let Some(ctx) = self.slots[i as usize].as_deref() {
                if let Some(d) = ctx.armed {
                    heap.push(Reverse((d, i, ctx.qpn)));
                }
            }
        }
        self.sched.timers = BinaryHeap::from(heap);
    }

    /// The heap's top entry, if it is current: (deadline, slot).
    fn top_timer(&mut self) -> Option<(u64, usize)> {
        loop {
            let &Reverse((d, idx, qpn)) = self.sched.timers.peek()?;
            let idx = idx as usize;
            let ctx = self
                .slots
                .get_mut(idx)
                .and_then(|s| s.as_deref_mut())
                .filter(|c| c.qpn == qpn && c.armed == Some(d));
            let Some(ctx) = ctx else {
                self.sched.timers.pop(); // destroyed, or superseded by an earlier entry
                continue;
            };
            match ctx.rc.poll_timeout() {
                Some(t) if t <= d => return Some((d, idx)),
                // The timer moved later (or went): the entry moves with it.
                _ => {
                    self.sched.timers.pop();
                    ctx.armed = None;
                    self.rearm(idx);
                }
            }
        }
    }

    /// Runs the transport timers due at `now` and queues their QPs.
    pub(crate) fn run_due_timers(&mut self, now: u64) {
        while let Some((d, idx)) = self.top_timer() {
            if d > now {
                break;
            }
            self.sched.timers.pop();
            if let Some(ctx) = self.slots[idx].as_deref_mut() {
                ctx.armed = None;
                let _span = ctx.span.enter();
                ctx.rc.handle_timeout(now);
                self.timers_touched = true;
            }
            self.queue(idx);
            self.rearm(idx);
        }
    }

    /// The earliest transport deadline of any QP.
    pub(crate) fn next_timer(&mut self) -> Option<u64> {
        self.top_timer().map(|(d, _)| d)
    }

    /// Every progress looks at the QPs whose ring was full again.
    pub(crate) fn requeue_blocked(&mut self) {
        for k in 0..self.sched.blocked.len() {
            let idx = self.sched.blocked[k] as usize;
            if let Some(ctx) = self.slots.get_mut(idx).and_then(|s| s.as_deref_mut()) {
                ctx.blocked = false;
            }
            self.queue(idx);
        }
        self.sched.blocked.clear();
    }

    /// Services every queued QP once; true if one has more to send.
    pub(crate) fn service_queued<M: MemoryTable + ?Sized>(
        &mut self,
        now: u64,
        mem: &mut M,
    ) -> bool {
        std::mem::swap(&mut self.sched.work, &mut self.sched.spare);
        let list = std::mem::take(&mut self.sched.spare);
        let mut more = false;
        for &i in &list {
            more |= self.service_one(i as usize, now, mem);
        }
        let mut list = list;
        list.clear();
        self.sched.spare = list;
        more
    }

    /// Services slot `idx` and files it by the result; true if it has more to send.
    pub(crate) fn service_one<M: MemoryTable + ?Sized>(
        &mut self,
        idx: usize,
        now: u64,
        mem: &mut M,
    ) -> bool {
        match self.slots.get_mut(idx).and_then(|s| s.as_deref_mut()) {
            Some(ctx) => ctx.queued = false,
            None => return false,
        }
        let r = self.service(idx, now, mem);
        match r {
            Serviced::Done => {}
            Serviced::More => self.queue(idx),
            Serviced::Blocked => {
                if let Some(ctx) = self.slots[idx].as_deref_mut() {
                    if !ctx.blocked {
                        ctx.blocked = true;
                        self.sched.blocked.push(idx as u16);
                    }
                }
            }
        }
        self.rearm(idx);
        r == Serviced::More
    }
}

/// Whether `armed` is no entry, or one later than `t`.
fn none_or_later(armed: Option<u64>, t: u64) -> bool {
    !matches!(armed, Some(a) if a <= t)
}
