//! The progress engine: one thread per process that drives every software device (and the
//! connection manager above it) whatever the application is doing, as a NIC does.
//!
//! It sleeps in `epoll_wait` on the fds of its [`Source`]s (a device's wire, the CM's
//! queues) and a doorbell eventfd, with the earliest deadline any source asked for as
//! timeout; an idle process costs nothing. When an fd fires or a deadline passes it calls
//! the source's [`Source::run`] in the engine thread.
//!
//! Fds are level-triggered and stay armed while their source runs (a source that leaves
//! its fd readable runs again at once, and no re-arming costs a system call per wake-up).
//! A source can leave its fds to another thread for a while ([`Run::Deferred`]: a caller
//! busy-polling a CQ drives the device inline, and the engine only checks back at the
//! given time instead of fighting it for the lock on every datagram): its fds are then
//! disarmed until a run returns [`Run::Idle`].
//!
//! Deadlines: each source has a wake time ([`Waker::set_wake`],
//! [`Waker::wake_by`]). Lowering it below what the engine sleeps towards rings the
//! doorbell (one `write(2)`); raising it never does: an engine that wakes early finds
//! nothing due, runs the source, and sleeps again.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::time::{Duration, Instant};
//! use rdma_soft::engine::{self, Run, Source};
//!
//! struct Tick(AtomicUsize);
//! impl Source for Tick {
//!     fn run(&self, _now: Instant) -> Run {
//!         self.0.fetch_add(1, Ordering::Relaxed);
//!         Run::Idle
//!     }
//! }
//! let tick = Arc::new(Tick(AtomicUsize::new(0)));
//! let weak = Arc::downgrade(&tick);
//! let reg = engine::register(weak).unwrap();
//! reg.wake_by(Instant::now()); // run it once, as soon as possible
//! let end = Instant::now() + Duration::from_secs(5);
//! while tick.0.load(Ordering::Relaxed) == 0 && Instant::now() < end {
//!     std::thread::sleep(Duration::from_millis(1));
//! }
//! assert!(tick.0.load(Ordering::Relaxed) >= 1);
//! ```

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Instant;

use crate::{Error, Result};

mod registration;
pub use registration::{Registered, Registration, Waker};

/// What a source's run asks of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// Done: re-arm the fds that fired; run again when one fires or at the wake time.
    Idle,
    /// Someone else drives this source now: keep the fired fds disarmed and look again at
    /// the given time.
    Deferred(Instant),
}

/// Work the engine drives.
pub trait Source: Send + Sync + 'static {
    /// Does what is due. Called in the engine thread when one of the source's fds fired or
    /// its wake time passed; it may take locks the application takes too, but must not
    /// block on anything else.
    fn run(&self, now: Instant) -> Run;
}

/// Wake time "never".
const NEVER: u64 = u64::MAX;
/// Token of the doorbell in the epoll set.
const DOORBELL: u64 = u64::MAX;

/// Serializes a source's runs with its unregistration. The engine holds a strong reference
/// to a source only during its run, under `running`, and a registration's drop waits for
/// that: an owner that drops its registration before its last reference ([`Registered`])
/// tears the source down at once, in its own thread, never later in the engine's.
struct Gate {
    alive: std::sync::atomic::AtomicBool,
    running: Mutex<()>,
    /// The source's last run answered [`Run::Deferred`].
    deferred: std::sync::atomic::AtomicBool,
}

thread_local! {
    /// The registration whose source the engine thread is running (0: none).
    static RUNNING: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

struct Entry {
    src: Weak<dyn Source>,
    gate: Arc<Gate>,
    wake: Arc<AtomicU64>,
    /// Registered fds and whether each is armed in the epoll set.
    fds: Vec<(RawFd, bool)>,
    /// Fds that fired since the source last ran.
    fired: Vec<RawFd>,
    /// Deferred: the fds are disarmed until a run returns [`Run::Idle`].
    deferred: bool,
}

/// A source to run this round: id, source, gate, the fds that fired.
type Due = (u64, Weak<dyn Source>, Arc<Gate>, Vec<RawFd>);

struct Table {
    entries: HashMap<u64, Entry>,
    next_id: u64,
}

/// The process's engine (see the module docs).
pub struct Engine {
    epoll: OwnedFd,
    doorbell: crate::fd::EventFd,
    table: Mutex<Table>,
    epoch: Instant,
    /// What the engine thread sleeps towards (nanos since `epoch`; NEVER: no deadline).
    sleeping_until: AtomicU64,
    /// Wake-ups of the engine thread, for tests and counters.
    wakeups: AtomicU64,
}

static ENGINE: OnceLock<std::result::Result<&'static Engine, i32>> = OnceLock::new();

/// The process's engine, started on first use.
pub fn get() -> Result<&'static Engine> {
    match ENGINE.get_or_init(start) {
        Ok(e) => Ok(e),
        Err(errno) => Err(Error::Os {
            op: "start the progress engine",
            addr: None,
            source: std::io::Error::from_raw_os_error(*errno),
        }),
    }
}

fn start() -> std::result::Result<&'static Engine, i32> {
    let last = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    let epoll = crate::fd::epoll_create().map_err(|_| last())?;
    let doorbell = crate::fd::EventFd::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    let db = doorbell.raw();
    let ring = libc::EPOLLIN as u32;
    if crate::fd::epoll_ctl(epoll.as_fd(), libc::EPOLL_CTL_ADD, db, ring, DOORBELL).is_err() {
        return Err(last());
    }
    let engine: &'static Engine = Box::leak(Box::new(Engine {
        epoll,
        doorbell,
        table: Mutex::new(Table {
            entries: HashMap::new(),
            next_id: 1,
        }),
        epoch: Instant::now(),
        sleeping_until: AtomicU64::new(NEVER),
        wakeups: AtomicU64::new(0),
    }));
    std::thread::Builder::new()
        .name("rdma-progress".into())
        .spawn(move || engine.run_loop())
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))?;
    tracing::debug!("progress engine started");
    Ok(engine)
}

/// Registers `src` with the process's engine. It runs when an fd added with
/// [`Registration::add_fd`] fires or its wake time passes; dropping the registration (or
/// the source) ends that. The engine holds `src` strongly only while it runs; drop the
/// registration before the last reference (as [`Registered`] does) to keep the source's
/// teardown out of the engine thread.
pub fn register(src: Weak<dyn Source>) -> Result<Registration> {
    let engine = get()?;
    let wake = Arc::new(AtomicU64::new(NEVER));
    let mut t = engine.lock();
    let id = t.next_id;
    t.next_id += 1;
    t.entries.insert(
        id,
        Entry {
            src,
            gate: Arc::new(Gate::new()),
            wake: wake.clone(),
            fds: Vec::new(),
            fired: Vec::new(),
            deferred: false,
        },
    );
    let gate = t.entries.get(&id).map(|e| e.gate.clone());
    drop(t);
    Ok(Registration {
        waker: Waker {
            engine,
            id,
            wake,
            gate: gate.unwrap_or_else(|| Arc::new(Gate::new())),
        },
    })
}

impl Gate {
    fn new() -> Gate {
        Gate {
            alive: std::sync::atomic::AtomicBool::new(true),
            running: Mutex::new(()),
            deferred: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Engine {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn nanos(&self, t: Instant) -> u64 {
        (t.saturating_duration_since(self.epoch).as_nanos() as u64).min(NEVER - 1)
    }

    fn ring(&self) {
        self.doorbell.signal();
    }

    /// Engine-thread wake-ups so far (fd events, deadlines and doorbells).
    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    /// `op` on `fd` with `token`, armed (level-triggered) or not.
    fn ctl(&self, op: i32, fd: RawFd, token: u64, armed: bool) -> std::io::Result<()> {
        let events = if armed { libc::EPOLLIN as u32 } else { 0 };
        crate::fd::epoll_ctl(self.epoll.as_fd(), op, fd, events, token)
    }

    fn run_loop(&'static self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        let mut due: Vec<Due> = Vec::new();
        loop {
            let timeout = {
                // Any wake time lowered from here on rings the doorbell; those lowered
                // before are in the minimum read next.
                self.sleeping_until.store(NEVER, Ordering::SeqCst);
                let t = self.lock();
                let next = t
                    .entries
                    .values()
                    .map(|e| e.wake.load(Ordering::SeqCst))
                    .min()
                    .unwrap_or(NEVER);
                self.sleeping_until.store(next, Ordering::SeqCst);
                if next == NEVER {
                    -1
                } else {
                    let now = self.nanos(Instant::now());
                    // round up to whole ms, so a deadline 0.3 ms away does not spin
                    (next.saturating_sub(now).div_ceil(1_000_000)).min(i32::MAX as u64) as i32
                }
            };
            // EINTR: a wake-up with nothing ready
            let n = crate::fd::epoll_wait(self.epoll.as_fd(), &mut events, timeout).unwrap_or(0);
            // awake: wake times set now are read before the next sleep
            self.sleeping_until.store(0, Ordering::SeqCst);
            self.wakeups.fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            let now_ns = self.nanos(now);
            {
                let mut t = self.lock();
                for ev in events.iter().take(n) {
                    let token = ev.u64;
                    if token == DOORBELL {
                        self.doorbell.clear();
                        continue;
                    }
                    let (id, fd) = (token >> 32, token as u32 as RawFd);
                    if let Some(e) = t.entries.get_mut(&id) {
                        if e.fds.iter().any(|f| f.0 == fd) && !e.fired.contains(&fd) {
                            e.fired.push(fd);
                        }
                    }
                }
                let mut gone = Vec::new();
                for (&id, e) in t.entries.iter_mut() {
                    let timer = e.wake.load(Ordering::Acquire) <= now_ns;
                    let fired = !e.fired.is_empty() && !e.deferred;
                    if !(timer || fired) {
                        continue;
                    }
                    if e.src.strong_count() == 0 {
                        gone.push(id);
                        continue;
                    }
                    // a run consumes the wake time; the source sets the next one
                    if timer {
                        e.wake.store(NEVER, Ordering::Release);
                    }
                    due.push((
                        id,
                        e.src.clone(),
                        e.gate.clone(),
                        std::mem::take(&mut e.fired),
                    ));
                }
                for id in gone {
                    self.remove(&mut t, id);
                }
            }
            for (id, src, gate, fired) in due.drain(..) {
                let r = {
                    let _running = gate.running.lock().unwrap_or_else(|e| e.into_inner());
                    if !gate.alive.load(Ordering::Acquire) {
                        continue;
                    }
                    let Some(src) = src.upgrade() else {
                        continue;
                    };
                    RUNNING.with(|r| r.set(id));
                    let r = src.run(now);
                    // Let go before `running` is released: a registration dropped during
                    // the run waits for that, so the engine never holds the last
                    // reference of a source whose owner drops its registration first
                    // (see `Registered`). Only a run that drops its own owner ends here.
                    drop(src);
                    RUNNING.with(|r| r.set(0));
                    gate.deferred
                        .store(matches!(r, Run::Deferred(_)), Ordering::Release);
                    r
                };
                let mut t = self.lock();
                let Some(e) = t.entries.get_mut(&id) else {
                    continue;
                };
                // Armed fds stay armed (level-triggered); only a deferral disarms them.
                let arm = matches!(r, Run::Idle);
                for f in e.fds.iter_mut().filter(|f| f.1 != arm) {
                    let token = (id << 32) | f.0 as u32 as u64;
                    if self.ctl(libc::EPOLL_CTL_MOD, f.0, token, arm).is_ok() {
                        f.1 = arm;
                    }
                }
                match r {
                    Run::Idle => e.deferred = false,
                    Run::Deferred(at) => {
                        e.deferred = true;
                        e.fired.extend(fired);
                        e.wake.fetch_min(self.nanos(at), Ordering::AcqRel);
                    }
                }
            }
        }
    }

    fn remove(&self, t: &mut Table, id: u64) {
        if let Some(e) = t.entries.remove(&id) {
            for (fd, _) in e.fds {
                // failure (fd already closed) is harmless
                let _ = crate::fd::epoll_ctl(self.epoll.as_fd(), libc::EPOLL_CTL_DEL, fd, 0, 0);
            }
        }
    }
}

#[cfg(test)]
mod tests;
