//! The engine's unit tests.
use super::*;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

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
