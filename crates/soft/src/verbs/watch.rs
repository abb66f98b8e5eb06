//! Event loops that drive a device themselves: the thread hop through the progress engine
//! leaves the critical path.
//!
//! Without a watcher, a datagram wakes the engine thread, which runs the device and fires a
//! completion channel, which wakes the application: two wake-ups per message. An event loop
//! (tokio, say) that registers the device's [`Device::wire_fd`] and calls
//! [`Device::drive_inline`] when it is readable is woken by the kernel directly. While it
//! holds a [`WireWatch`], the engine leaves fresh datagrams to it and looks back every
//! [`GRACE`]: while the watcher drives, the engine does not watch the fd (no wake-up per
//! message); after a GRACE without a drive it runs the device itself (a blocked event loop,
//! or the traffic stopped) and watches the fd again, so the device still always makes
//! progress. Timers stay the engine's.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::TryLockError;
use std::time::{Duration, Instant};

use super::device::{Device, DeviceArc, DeviceShared};
use crate::engine::Run;
use crate::Result;

/// How often the engine looks back at a watcher: datagrams of a watcher that stopped
/// driving wait at most two of these before the engine drives them itself.
pub const GRACE: Duration = Duration::from_millis(1);

/// The watcher bookkeeping of one device (times in ns since the device was created).
#[derive(Default)]
pub(crate) struct WatchState {
    watchers: AtomicU32,
    /// When a watcher last drove the device.
    driven_at: AtomicU64,
    /// When the engine last left fresh datagrams to the watchers (0: it is not waiting).
    left_at: AtomicU64,
    /// Drives by watchers that found the runtime free.
    drives: AtomicU64,
    /// Engine runs left to the watchers, and those it then drove itself (watcher stalled).
    left: AtomicU64,
    taken_back: AtomicU64,
}

impl WatchState {
    /// Whether an event loop watches the device's wire fd now.
    pub(crate) fn watched(&self) -> bool {
        self.watchers.load(Relaxed) > 0
    }

    /// The engine's part: `Some(run)` when it leaves this run to the watchers, `None` when
    /// it must drive the device itself (no watcher, timers due, or the watcher is stalled).
    pub fn engine_run(&self, dev: &DeviceShared, now: Instant, now_ns: u64) -> Option<Run> {
        if self.watchers.load(Relaxed) == 0 {
            self.left_at.store(0, Relaxed);
            return None;
        }
        let next = match dev.rt_try_lock() {
            Ok(mut rt) => rt.next_deadline(),
            Err(TryLockError::Poisoned(_)) => return None,
            // A watcher is driving right now: look again soon.
            Err(TryLockError::WouldBlock) => Some(now + GRACE),
        };
        if next.is_some_and(|d| d <= now) {
            // Timers are the engine's.
            self.left_at.store(0, Relaxed);
            return None;
        }
        let left = self.left_at.swap(0, Relaxed);
        if left == 0 {
            self.left_at.store(now_ns.max(1), Relaxed);
            self.left.fetch_add(1, Relaxed);
            return Some(Run::Deferred(now + GRACE));
        }
        // Looking back: a watcher that drove since keeps the device for one more GRACE,
        // with the engine's fds left unarmed (re-arming them would wake the engine on the
        // next datagram, one wake-up per message); the runtime's timers stay armed.
        if self.driven_at.load(Relaxed) >= left {
            self.left_at.store(now_ns.max(1), Relaxed);
            let check = now + GRACE;
            return Some(Run::Deferred(next.map_or(check, |d| d.min(check))));
        }
        // No drive for a GRACE: traffic stopped, or the watcher is blocked; the engine runs
        // the device (the datagrams of a blocked watcher waited at most two GRACEs) and
        // sleeps on its fds again.
        self.taken_back.fetch_add(1, Relaxed);
        None
    }

    fn driven(&self, now_ns: u64) {
        self.driven_at.store(now_ns.max(1), Relaxed);
        self.drives.fetch_add(1, Relaxed);
    }
}

/// What the watchers of a device did ([`Device::watch_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchStats {
    /// Drives by a watcher ([`Device::drive_inline`] calls that found the device free).
    pub drives: u64,
    /// Times the engine left fresh datagrams to the watchers.
    pub left: u64,
    /// Of those, times no watcher drove within [`GRACE`] and the engine drove itself.
    pub taken_back: u64,
}

/// A promise to drive a device when its [`Device::wire_fd`] is readable (see the module
/// docs). Dropping it gives the device back to the engine.
///
/// ```
/// use rdma_soft::verbs::{Device, DeviceConfig};
/// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
/// let watch = dev.watch_wire();
/// assert!(dev.wire_fd().is_some());
/// dev.drive_inline().unwrap(); // what an event loop does when the fd is readable
/// assert_eq!(dev.watch_stats().drives, 1);
/// drop(watch);
/// ```
pub struct WireWatch {
    shared: DeviceArc,
}

impl Drop for WireWatch {
    fn drop(&mut self) {
        self.shared.watch().watchers.fetch_sub(1, Relaxed);
        // The engine may be waiting for this watcher: let it look now (under the runtime
        // lock, as wake times are set).
        let _rt = self.shared.runtime();
        self.shared.wake_by(Instant::now());
    }
}

impl Device {
    /// The fd that becomes readable when datagrams arrive for this device (`None` for a
    /// wire without one). Register it with an event loop (edge-triggered is fine: call
    /// [`Device::drive_inline`] after clearing the readiness), alongside a [`WireWatch`].
    #[allow(unsafe_code)]
    pub fn wire_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the wire's fd lives as long as the device's shared state, which `self`
        // keeps alive for the borrow.
        self.shared()
            .wait_fd()
            .map(|fd| unsafe { BorrowedFd::borrow_raw(fd) })
    }

    /// Announces a watcher: until it is dropped the engine leaves fresh datagrams to the
    /// caller's event loop for up to [`GRACE`].
    pub fn watch_wire(&self) -> WireWatch {
        self.shared().watch().watchers.fetch_add(1, Relaxed);
        WireWatch {
            shared: self.shared_arc(),
        }
    }

    /// Drives the device once in the caller's thread (receive, deliver, transmit, move
    /// completions), after any other thread's run of it in progress; returns the datagrams
    /// received, or at least 1 when more was published meanwhile without making the fd
    /// readable (host-local rings): call again. What a watcher calls when
    /// [`Device::wire_fd`] is readable. (It waits for
    /// the lock: a watcher that gave up because the engine held it for an instant would
    /// wait for a readiness that already came, and the datagram for the engine's grace.)
    pub fn drive_inline(&self) -> Result<usize> {
        let sh = self.shared();
        let mut rt = sh.runtime();
        sh.watch().driven(sh.now_ns());
        // the loop waits on the wire fd next: this arms the host-local rings for it
        // (`DeviceShared::drive_locked`)
        sh.drive_watched(&mut rt)
    }

    /// What the watchers of this device did.
    pub fn watch_stats(&self) -> WatchStats {
        let w = self.shared().watch();
        WatchStats {
            drives: w.drives.load(Relaxed),
            left: w.left.load(Relaxed),
            taken_back: w.taken_back.load(Relaxed),
        }
    }
}
