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
//! Deadlines: each source has a wake time ([`Registration::set_wake`],
//! [`Registration::wake_by`]). Lowering it below what the engine sleeps towards rings the
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
use std::time::{Duration, Instant};

use crate::{Error, Result};

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

/// A source's place in the engine (see [`register`]). Dropping it unregisters the source,
/// waiting for a run in progress (unless the run is the one dropping it). Its wake-time
/// controls are those of its [`Waker`] (`Deref`).
pub struct Registration {
    waker: Waker,
}

/// The wake-time controls of a registered source ([`Registration::waker`]): a source keeps
/// one to set its next deadline from its run. Cloning it is cheap; it does not keep the
/// registration (after which its calls do nothing useful, and no harm).
#[derive(Clone)]
pub struct Waker {
    engine: &'static Engine,
    id: u64,
    wake: Arc<AtomicU64>,
    gate: Arc<Gate>,
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
    /// Whether the source's last run answered [`Run::Deferred`] (the engine left it to
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Counter {
        runs: AtomicUsize,
        efd: crate::fd::EventFd,
        defer_until: Mutex<Option<Instant>>,
    }

    impl Source for Counter {
        fn run(&self, now: Instant) -> Run {
            self.runs.fetch_add(1, Ordering::SeqCst);
            if let Some(t) = *self.defer_until.lock().unwrap() {
                if now < t {
                    return Run::Deferred(t);
                }
            }
            self.efd.clear();
            Run::Idle
        }
    }

    fn counter() -> Arc<Counter> {
        Arc::new(Counter {
            runs: AtomicUsize::new(0),
            efd: crate::fd::EventFd::new().unwrap(),
            defer_until: Mutex::new(None),
        })
    }

    fn poke(c: &Counter) {
        c.efd.signal();
    }

    fn wait_runs(c: &Counter, n: usize) -> bool {
        let end = Instant::now() + Duration::from_secs(5);
        while c.runs.load(Ordering::SeqCst) < n {
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    #[test]
    fn fd_events_and_deadlines_run_the_source() {
        let c = counter();
        let w: Weak<dyn Source> = Arc::downgrade(&c) as Weak<dyn Source>;
        let reg = register(w).unwrap();
        reg.add_fd(c.efd.raw()).unwrap();
        poke(&c);
        assert!(wait_runs(&c, 1), "an fd event runs it");
        let before = c.runs.load(Ordering::SeqCst);
        reg.wake_by(Instant::now() + Duration::from_millis(20));
        assert!(wait_runs(&c, before + 1), "a deadline runs it");
        // a readable fd that the source drains does not make it run again by itself
        std::thread::sleep(Duration::from_millis(30));
        let settled = c.runs.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(c.runs.load(Ordering::SeqCst), settled, "idle: no runs");
        drop(reg);
        poke(&c);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(c.runs.load(Ordering::SeqCst), settled, "unregistered");
    }

    #[test]
    fn deferred_source_keeps_its_fd_disarmed_until_it_takes_over() {
        let c = counter();
        *c.defer_until.lock().unwrap() = Some(Instant::now() + Duration::from_millis(100));
        let w: Weak<dyn Source> = Arc::downgrade(&c) as Weak<dyn Source>;
        let reg = register(w).unwrap();
        reg.add_fd(c.efd.raw()).unwrap();
        poke(&c); // stays readable while deferred
        assert!(wait_runs(&c, 1));
        std::thread::sleep(Duration::from_millis(50));
        // one run, then nothing: the readable fd is disarmed, the check is at 100 ms
        assert_eq!(
            c.runs.load(Ordering::SeqCst),
            1,
            "no spinning while deferred"
        );
        assert!(wait_runs(&c, 2), "checks back at the deferral time");
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(c.runs.load(Ordering::SeqCst), 2, "drained and idle again");
        poke(&c);
        assert!(wait_runs(&c, 3), "re-armed after taking over");
    }

    /// Records where and whether the source was dropped.
    struct Slow {
        started: std::sync::mpsc::SyncSender<()>,
        release: Mutex<std::sync::mpsc::Receiver<()>>,
        dropped_in: Arc<Mutex<Option<std::thread::ThreadId>>>,
    }

    impl Source for Slow {
        fn run(&self, _now: Instant) -> Run {
            let _ = self.started.try_send(());
            let rx = self.release.lock().unwrap();
            let _ = rx.recv_timeout(Duration::from_secs(10));
            Run::Idle
        }
    }

    impl Drop for Slow {
        fn drop(&mut self) {
            *self.dropped_in.lock().unwrap() = Some(std::thread::current().id());
        }
    }

    #[test]
    fn source_dropped_during_its_run_is_torn_down_by_the_dropping_thread() {
        let (started_tx, started) = std::sync::mpsc::sync_channel(1);
        let (release, release_rx) = std::sync::mpsc::channel();
        let dropped_in = Arc::new(Mutex::new(None));
        let owned = Registered::new(Arc::new(Slow {
            started: started_tx,
            release: Mutex::new(release_rx),
            dropped_in: dropped_in.clone(),
        }))
        .unwrap();
        owned.registration().wake_by(Instant::now());
        started
            .recv_timeout(Duration::from_secs(5))
            .expect("the engine runs the source");
        // Another thread lets go of the only reference while the run is in progress.
        let seen = dropped_in.clone();
        let dropper = std::thread::spawn(move || {
            drop(owned);
            // the teardown is done when the drop returns
            (std::thread::current().id(), *seen.lock().unwrap())
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            dropped_in.lock().unwrap().is_none(),
            "the source stays alive while it runs"
        );
        release.send(()).unwrap();
        let (dropper_id, at_return) = dropper.join().unwrap();
        assert_eq!(
            at_return,
            Some(dropper_id),
            "torn down in the dropping thread"
        );
        assert_eq!(*dropped_in.lock().unwrap(), Some(dropper_id));
    }

    /// A source whose run drops its own owner.
    struct SelfDrop {
        owner: Mutex<Option<Registered<SelfDrop>>>,
        dropped: Arc<AtomicUsize>,
    }

    impl Source for SelfDrop {
        fn run(&self, _now: Instant) -> Run {
            let owner = self.owner.lock().unwrap().take();
            drop(owner);
            Run::Idle
        }
    }

    impl Drop for SelfDrop {
        fn drop(&mut self) {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn source_whose_run_drops_its_owner_ends_without_deadlock() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let src = Arc::new(SelfDrop {
            owner: Mutex::new(None),
            dropped: dropped.clone(),
        });
        let owned = Registered::new(src.clone()).unwrap();
        let waker = owned.registration().waker();
        *src.owner.lock().unwrap() = Some(owned);
        drop(src);
        waker.wake_by(Instant::now());
        let end = Instant::now() + Duration::from_secs(5);
        while dropped.load(Ordering::SeqCst) == 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "dropped once, in its run"
        );
    }
}
