//! A source's place in the engine: its [`Registration`], the [`Waker`] a source keeps for
//! its wake time, and [`Registered`], a source with its registration dropped in order.

use std::os::fd::{AsFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::{register, Engine, Gate, Source, NEVER, RUNNING};
use crate::{Error, Result};

/// A source's place in the engine (see [`register`]). Dropping it unregisters the source,
/// waiting for a run in progress (unless the run is the one dropping it). Its wake-time
/// controls are those of its [`Waker`] (`Deref`).
pub struct Registration {
    pub(super) waker: Waker,
}

/// The wake-time controls of a registered source ([`Registration::waker`]): a source keeps
/// one to set its next deadline from its run. Cloning it is cheap; it does not keep the
/// registration (after which its calls do nothing useful, and no harm).
#[derive(Clone)]
pub struct Waker {
    pub(super) engine: &'static Engine,
    pub(super) id: u64,
    pub(super) wake: Arc<AtomicU64>,
    pub(super) gate: Arc<Gate>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("id", &self.waker.id)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waker")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for Registration {
    type Target = Waker;
    fn deref(&self) -> &Waker {
        &self.waker
    }
}

impl Registration {
    /// The wake-time controls, for the source to keep.
    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }

    /// Runs the source whenever `fd` is readable. The fd must stay open until
    /// [`Registration::remove_fd`] or the registration is dropped.
    pub fn add_fd(&self, fd: RawFd) -> Result<()> {
        let w = &self.waker;
        let mut t = w.engine.lock();
        let Some(e) = t.entries.get_mut(&w.id) else {
            return Ok(());
        };
        if e.fds.iter().any(|f| f.0 == fd) {
            return Ok(());
        }
        // a deferred source's fds wait, disarmed, for its next idle run
        let armed = !e.deferred;
        w.engine
            .ctl(
                libc::EPOLL_CTL_ADD,
                fd,
                (w.id << 32) | fd as u32 as u64,
                armed,
            )
            .map_err(|source| Error::Os {
                op: "epoll_ctl (progress engine)",
                addr: None,
                source,
            })?;
        e.fds.push((fd, armed));
        Ok(())
    }

    /// Stops watching `fd`.
    pub fn remove_fd(&self, fd: RawFd) {
        let w = &self.waker;
        let mut t = w.engine.lock();
        if let Some(e) = t.entries.get_mut(&w.id) {
            if let Some(i) = e.fds.iter().position(|f| f.0 == fd) {
                e.fds.swap_remove(i);
                e.fired.retain(|&f| f != fd);
                // failure (already closed) is harmless
                let _ = crate::fd::epoll_ctl(w.engine.epoll.as_fd(), libc::EPOLL_CTL_DEL, fd, 0, 0);
            }
        }
    }
}

impl Waker {
    /// Whether the source's last run answered [`Run::Deferred`](super::Run::Deferred) (the engine left it to
    /// someone else and looks again later).
    pub fn is_deferred(&self) -> bool {
        self.gate.deferred.load(Ordering::Acquire)
    }

    /// The wake time as now set (`None`: only fd events).
    pub fn wake(&self) -> Option<Instant> {
        match self.wake.load(Ordering::Acquire) {
            NEVER => None,
            n => Some(self.engine.epoch + Duration::from_nanos(n)),
        }
    }

    /// Sets the wake time (`None`: only fd events); rings the doorbell only if the engine
    /// would otherwise sleep past it. Call it with the state it was computed from locked,
    /// so that a concurrent [`Waker::wake_by`] is not overwritten.
    pub fn set_wake(&self, at: Option<Instant>) {
        let n = at.map_or(NEVER, |t| self.engine.nanos(t));
        self.wake.store(n, Ordering::SeqCst);
        self.ring_if_needed(n);
    }

    /// Makes the source run at `at` at the latest (earlier wake times stay).
    pub fn wake_by(&self, at: Instant) {
        let n = self.engine.nanos(at);
        let old = self.wake.fetch_min(n, Ordering::SeqCst);
        if n < old {
            self.ring_if_needed(n);
        }
    }

    fn ring_if_needed(&self, n: u64) {
        // See `run_loop`: while the engine computes its sleep this reads NEVER (ring), while
        // it is awake 0 (it reads the wake times before sleeping), asleep its deadline.
        if n < self.engine.sleeping_until.load(Ordering::SeqCst) {
            self.engine.ring();
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let w = &self.waker;
        w.gate.alive.store(false, Ordering::Release);
        // Wait for a run in progress, unless it is this thread's own (a source whose
        // owner is dropped by its own run).
        if RUNNING.with(|r| r.get()) != w.id {
            drop(w.gate.running.lock().unwrap_or_else(|e| e.into_inner()));
        }
        let mut t = w.engine.lock();
        w.engine.remove(&mut t, w.id);
    }
}

/// A source with its registration, dropped in that order: the source leaves the engine
/// (waiting for a run in progress) before this lets go of it, so when this held the last
/// reference the source is torn down in the dropping thread, at once, never in the
/// engine's. Derefs to the source.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Instant;
/// use rdma_soft::engine::{Registered, Run, Source};
///
/// struct Quiet;
/// impl Source for Quiet {
///     fn run(&self, _now: Instant) -> Run {
///         Run::Idle
///     }
/// }
/// let owned = Registered::new(Arc::new(Quiet)).unwrap();
/// owned.registration().wake_by(Instant::now());
/// drop(owned); // unregistered, then `Quiet` dropped here
/// ```
pub struct Registered<T: Source> {
    // declared first: dropped first
    reg: Registration,
    src: Arc<T>,
}

impl<T: Source> Registered<T> {
    /// Registers `src` ([`register`]) and keeps it.
    pub fn new(src: Arc<T>) -> Result<Registered<T>> {
        let weak: Weak<dyn Source> = Arc::downgrade(&src) as Weak<dyn Source>;
        let reg = register(weak)?;
        Ok(Registered { reg, src })
    }

    /// The registration (fds, wake time).
    pub fn registration(&self) -> &Registration {
        &self.reg
    }

    /// The source's `Arc`.
    pub fn source(&self) -> &Arc<T> {
        &self.src
    }
}

impl<T: Source> std::ops::Deref for Registered<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.src
    }
}

impl<T: Source> std::fmt::Debug for Registered<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered")
            .field("reg", &self.reg)
            .finish_non_exhaustive()
    }
}
