//! CQ wake-ups that a device thread holds back until it lets go of the runtime lock.
//!
//! A completion pushed while the runtime is locked used to wake its task at once; the task
//! then ran on another CPU and, posting its next work request, found the lock still held
//! and slept on it until the pusher let go: a second wake-up, two more system calls. A
//! thread that drives the device takes [`hold`] before it locks the runtime; the wake-ups
//! of that drive are kept in a per-thread list and fired when the guard drops, after the
//! lock (guards taken later drop first).

use std::cell::{Cell, RefCell};
use std::sync::Weak;
use std::task::Waker;

use super::cq::{CompletionChannel, CqShared};

/// A wake-up to deliver: a task's waker, or a CQ event on a completion channel.
pub(crate) enum Wake {
    Task(Waker),
    Channel(CompletionChannel, Weak<CqShared>),
}

impl Wake {
    fn fire(self) {
        match self {
            Wake::Task(w) => w.wake(),
            Wake::Channel(ch, cq) => ch.signal(cq),
        }
    }
}

thread_local! {
    static HOLDING: Cell<bool> = const { Cell::new(false) };
    static HELD: RefCell<Vec<Wake>> = const { RefCell::new(Vec::new()) };
}

/// Holds this thread's CQ wake-ups until the returned guard drops (nested guards: the
/// outermost fires them).
pub(crate) fn hold() -> Hold {
    Hold {
        outer: !HOLDING.with(|h| h.replace(true)),
    }
}

/// Delivers `w` now, or when this thread's [`Hold`] drops.
pub(crate) fn wake(w: Wake) {
    if HOLDING.with(Cell::get) {
        HELD.with(|h| h.borrow_mut().push(w));
    } else {
        w.fire();
    }
}

/// See [`hold`].
pub(crate) struct Hold {
    outer: bool,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.outer {
            return;
        }
        HOLDING.with(|h| h.set(false));
        // Taken out first: a wake-up that pushes again (it should not) cannot re-enter the
        // borrow. The list keeps its capacity for the next drive.
        let Some(mut list) = HELD.with(|h| {
            let mut h = h.borrow_mut();
            (!h.is_empty()).then(|| std::mem::take(&mut *h))
        }) else {
            return;
        };
        for w in list.drain(..) {
            w.fire();
        }
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if h.is_empty() {
                *h = list;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake as StdWake;

    struct Count(AtomicUsize);
    impl StdWake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn held_wakes_fire_when_the_outer_guard_drops() {
        let n = Arc::new(Count(AtomicUsize::new(0)));
        let w = Waker::from(n.clone());
        wake(Wake::Task(w.clone()));
        assert_eq!(n.0.load(Ordering::SeqCst), 1, "no guard: at once");
        let outer = hold();
        wake(Wake::Task(w.clone()));
        {
            let _inner = hold();
            wake(Wake::Task(w.clone()));
        }
        assert_eq!(n.0.load(Ordering::SeqCst), 1, "held past the inner guard");
        drop(outer);
        assert_eq!(n.0.load(Ordering::SeqCst), 3);
        wake(Wake::Task(w));
        assert_eq!(
            n.0.load(Ordering::SeqCst),
            4,
            "after the guard: at once again"
        );
    }

    /// A task waiting for a receive is not woken by a successful send-side completion
    /// (it stays queued), but is by a receive and by any failure; a task waiting for
    /// anything is woken by the send.
    #[test]
    fn a_receive_waiter_sleeps_through_its_own_send_completions() {
        use crate::verbs::{Device, DeviceConfig};
        use rdma_proto::verbs::{Completion, WcOpcode, WcStatus};
        let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
        let cq = dev.create_cq(8, None).unwrap();
        let n = Arc::new(Count(AtomicUsize::new(0)));
        let w = Waker::from(n.clone());
        let woken = || n.0.load(Ordering::SeqCst);
        let c = |op, st| Completion::new(1, st, op, 1);
        cq.notify_waker_for_recv(&w);
        cq.push(c(WcOpcode::Send, WcStatus::Success)).unwrap();
        cq.push(c(WcOpcode::RdmaWrite, WcStatus::Success)).unwrap();
        assert_eq!(woken(), 0, "own sends: asleep");
        assert_eq!(cq.queued(), 2, "still queued for the next poll");
        cq.push(c(WcOpcode::Recv, WcStatus::Success)).unwrap();
        assert_eq!(woken(), 1, "a receive wakes it");
        cq.notify_waker_for_recv(&w);
        cq.push(c(WcOpcode::Send, WcStatus::RetryExcErr)).unwrap();
        assert_eq!(woken(), 2, "a failure wakes it");
        cq.notify_waker(&w);
        cq.push(c(WcOpcode::Send, WcStatus::Success)).unwrap();
        assert_eq!(woken(), 3, "waiting for anything: a send wakes it");
    }

    /// Records whether the device's runtime lock was free when it was woken.
    struct SeesLock {
        dev: crate::verbs::Device,
        woken: AtomicUsize,
        lock_free: AtomicUsize,
    }
    impl StdWake for SeesLock {
        fn wake(self: Arc<Self>) {
            self.woken.fetch_add(1, Ordering::SeqCst);
            if self.dev.shared().rt_try_lock().is_ok() {
                self.lock_free.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// A completion pushed under the runtime lock wakes its task only after the lock is
    /// released: the task never wakes to find the lock taken.
    #[test]
    fn a_completion_under_the_runtime_lock_wakes_after_it() {
        use crate::verbs::{Device, DeviceConfig};
        use rdma_proto::verbs::{Completion, WcOpcode, WcStatus};
        let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
        let cq = dev.create_cq(4, None).unwrap();
        let seen = Arc::new(SeesLock {
            dev: dev.clone(),
            woken: AtomicUsize::new(0),
            lock_free: AtomicUsize::new(0),
        });
        cq.notify_waker(&Waker::from(seen.clone()));
        let rt = dev.shared().runtime();
        cq.push(Completion::new(7, WcStatus::Success, WcOpcode::Send, 1))
            .unwrap();
        assert_eq!(seen.woken.load(Ordering::SeqCst), 0, "held while locked");
        drop(rt);
        assert_eq!(seen.woken.load(Ordering::SeqCst), 1);
        assert_eq!(
            seen.lock_free.load(Ordering::SeqCst),
            1,
            "woken after the unlock"
        );
    }
}
