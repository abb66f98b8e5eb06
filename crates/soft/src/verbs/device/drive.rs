//! Who drives a device, and how: the progress engine (the device as an engine `Source`,
//! and its spin on a stream's host-local rings), a busy poller inline (with the engine's
//! hand-off), a plain caller or an event loop's watcher; what a drive tells the engine
//! afterwards (timers, bells, held ACKs).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::DeviceShared;
use crate::engine::{Run, Source};
use crate::queues::cq::PolledDevice;
use crate::runtime::Runtime;
use crate::Result;

impl DeviceShared {
    /// Runs the runtime once in the caller's thread (see
    /// [`Device::progress`](super::Device::progress)).
    pub(crate) fn progress(&self) -> Result<usize> {
        let mut rt = self.runtime();
        self.progress_locked(&mut rt)
    }

    /// A busy-polling caller drives the device inline: like `progress`, but does nothing
    /// when another thread (the engine) is running it, and tells the engine to leave the
    /// device to this caller for [`HANDOFF`].
    pub(crate) fn try_progress(&self) -> Result<usize> {
        // The engine's "busy poller" test needs ~100 µs resolution: a clock read every
        // `CLOCK_EVERY`th poll, not every one (a poll of nothing costs less than the read).
        // The same reading serves the runtime's timers (`Runtime::busy_round`).
        // a load and a store, not a locked add: a count lost to a racing poller is harmless
        let k = self.inline_polls.load(Ordering::Relaxed);
        self.inline_polls
            .store(k.wrapping_add(1), Ordering::Relaxed);
        let clock =
            (k % CLOCK_EVERY == 0 || self.inline_at.load(Ordering::Relaxed) == 0).then(|| {
                let now = Instant::now();
                let at = now.saturating_duration_since(self.created).as_nanos() as u64;
                self.inline_at.store(at.max(1), Ordering::Relaxed);
                now
            });
        let Some(mut rt) = self.try_runtime() else {
            return Ok(0);
        };
        let r = self.drive_locked(&mut rt, Drive::Busy(clock));
        if matches!(r, Ok(n) if n > 0) {
            // the next poll reads the clock (it would anyway, for the packets' time stamps):
            // a stream's polls are long, and the engine must see this poller within ACTIVE
            self.inline_polls.store(0, Ordering::Relaxed);
        }
        r
    }

    /// Drives the device once in the caller's thread if no other thread is (the engine
    /// keeps it: not a busy poller's hand-off).
    pub(crate) fn try_drive(&self) -> Result<usize> {
        let Some(mut rt) = self.try_runtime() else {
            return Ok(0);
        };
        self.drive_locked(&mut rt, Drive::Plain)
    }

    /// The inline driver stopped (it is going to sleep): the engine drives the device again.
    pub(crate) fn end_inline(&self) {
        if self.inline_at.swap(0, Ordering::Relaxed) != 0 {
            // left to us meanwhile: take it back now, not at the end of the hand-off
            if let Some(r) = self.waker.get().filter(|r| r.is_deferred()) {
                r.wake_by(Instant::now());
            }
        }
    }

    pub(crate) fn progress_locked(&self, rt: &mut Runtime) -> Result<usize> {
        self.drive_locked(rt, Drive::Plain)
    }

    /// A watcher's drive ([`Device::drive_inline`](super::Device::drive_inline)).
    pub(crate) fn drive_watched(&self, rt: &mut Runtime) -> Result<usize> {
        self.drive_locked(rt, Drive::Watcher)
    }

    /// A thread other than the engine drives the device.
    fn drive_locked(&self, rt: &mut Runtime, how: Drive) -> Result<usize> {
        let r = match how {
            Drive::Busy(clock) => {
                // the memory table's lock only when something is to be done
                let r = match rt.busy_idle(clock) {
                    Ok(false) => rt.busy_round(&mut self.mrs.view(), clock),
                    idle => idle.map(|_| 0),
                };
                if rt.acks_held() {
                    // a poller that stops now would leave them: the engine sends them
                    let now = clock.unwrap_or_else(Instant::now);
                    self.wake_by(now + crate::runtime::ack_hold::ENGINE_WITHIN);
                }
                r
            }
            Drive::Plain | Drive::Watcher => rt.progress(&mut self.mrs.view()),
        };
        // If the engine sleeps now (not deferred to this thread), or an event loop sleeps
        // on the wire fd (the engine defers to it), host-local peers must ring the bell
        // for what comes next: this drive may have taken the datagram that was to wake it.
        // Something published meanwhile, which rang nobody, is the engine's at once (a
        // watcher's: it drives again).
        let engine_sleeps = self.waker.get().is_some_and(|r| !r.is_deferred());
        let mut again = false;
        if (engine_sleeps || self.watch.watched()) && rt.arm_wait() {
            if matches!(how, Drive::Watcher) {
                // the watcher drives again (no thread hop through the engine)
                again = true;
            } else {
                self.wake_by(Instant::now());
            }
        }
        // Timers may have been armed (RNR waits) or moved: the engine must know the
        // earliest before the caller goes away. Only when something happened.
        if rt.take_timers_touched() {
            if let Some(d) = rt.next_deadline() {
                self.wake_by(d);
            }
        }
        if again {
            r.map(|n| n.max(1))
        } else {
            r
        }
    }

    /// Whether the engine left the device to a busy poller (it answered `Deferred`): it
    /// looks back within its hand-off time whatever its wake time says, and the poller
    /// reads the clock and runs the timers meanwhile.
    pub(crate) fn engine_deferred(&self) -> bool {
        self.waker.get().is_some_and(|r| r.is_deferred())
    }

    /// After a post or modify on `qpn`: tells the engine about the timer it may have armed.
    pub(crate) fn posted(&self, rt: &Runtime, qpn: u32) {
        if let Some(t) = rt.post_deadline(qpn) {
            self.wake_by(t);
        }
    }

    /// Makes the engine run the device at `at` at the latest. Call with the runtime locked.
    pub(crate) fn wake_by(&self, at: Instant) {
        if let Some(r) = self.waker.get() {
            r.wake_by(at);
        }
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.runtime().next_deadline()
    }
}

/// How a thread other than the engine drives the device.
enum Drive {
    /// Once ([`Runtime::progress`]).
    Plain,
    /// Once, for a watcher ([`Device::drive_inline`](super::Device::drive_inline)): what is
    /// pending after it is the watcher's to drive next, not the engine's.
    Watcher,
    /// As a busy poller ([`Runtime::busy_idle`]), with the clock if it read it for
    /// this poll.
    Busy(Option<Instant>),
}

/// A busy poller reads the clock on every `CLOCK_EVERY`th poll (`try_progress`; the
/// runtime's own clock likewise, `Runtime::busy_idle`).
pub(crate) const CLOCK_EVERY: u32 = 32;

/// Packets from the host-local rings in one engine run that make it a stream (see
/// [`DeviceShared::spin_on_rings`]).
const STREAM_BATCH: u64 = 64;

/// How long the engine keeps polling a stream's rings after their last packet.
const STREAM_SPIN: Duration = Duration::from_micros(20);

/// How long one engine run polls a stream at most.
const STREAM_SPIN_MAX: Duration = Duration::from_micros(500);

impl DeviceShared {
    /// The engine polls a device whose host-local rings carry a stream until they have been
    /// quiet for [`STREAM_SPIN`] (the runtime's lock is released between polls, so posts
    /// and inline drivers go on), until a thread drives the device inline, or for
    /// [`STREAM_SPIN_MAX`] at most.
    fn spin_on_rings(&self) {
        let start = Instant::now();
        let mut quiet_since = start;
        loop {
            std::hint::spin_loop();
            if self.inline_at.load(Ordering::Relaxed) != 0 {
                return;
            }
            let mut rt = self.runtime();
            let before = rt.wire_stats().local.received;
            let mut mem = self.mrs.view();
            let _ = rt.progress(&mut mem);
            let got = rt.wire_stats().local.received != before;
            drop((rt, mem));
            let now = Instant::now();
            if got {
                quiet_since = now;
            } else if now.duration_since(quiet_since) >= STREAM_SPIN {
                return;
            }
            // the engine's other sources (CMs, devices, timers) get their turn: the run
            // after this one takes the stream up again at once (its rings are not empty)
            if now.duration_since(start) >= STREAM_SPIN_MAX {
                return;
            }
        }
    }
}

/// How long the engine leaves a device to a thread that drives it inline (busy-polls a CQ)
/// before it checks back.
pub(crate) const HANDOFF: Duration = Duration::from_millis(1);

/// A thread counts as busy-polling when it drove the device this recently at the moment the
/// engine looks: a caller that polls now and then (every few hundred µs) is not one, and the
/// engine does not wait for it.
pub(crate) const ACTIVE: Duration = Duration::from_micros(100);

impl Source for DeviceShared {
    fn run(&self, now: Instant) -> Run {
        let last = self.inline_at.load(Ordering::Relaxed);
        if last != 0 {
            let at = self.created + Duration::from_nanos(last);
            if now.saturating_duration_since(at) < ACTIVE {
                return Run::Deferred(now + HANDOFF);
            }
        }
        let now_ns = self.created.elapsed().as_nanos() as u64;
        if let Some(r) = self.watch.engine_run(self, now, now_ns) {
            // Left to the event loop, which sleeps on the wire fd: host-local peers must
            // ring it. What was published unrung meanwhile is the engine's to take now.
            let pending = match self.rt_try_lock() {
                Ok(mut rt) => rt.arm_wait(),
                Err(_) => false,
            };
            if !pending {
                return r;
            }
        }
        let mut rt = self.runtime();
        let mut mem = self.mrs.view();
        // An error here is the wire's (a socket refused a batch): the transports see it as
        // loss and retransmit; nobody else would see it either.
        let rings = rt.wire_stats().local.received;
        let _ = rt.progress(&mut mem);
        if rt.wire_stats().local.received - rings >= STREAM_BATCH {
            // A stream through the host-local rings: a sleep and a bell per batch would
            // cost more than the batch; look again for a short while first.
            drop((rt, mem));
            self.spin_on_rings();
            rt = self.runtime();
            mem = self.mrs.view();
            let _ = rt.progress(&mut mem);
        }
        rt.take_timers_touched();
        // The engine sleeps next: host-local peers must ring; one that published meanwhile
        // makes it run again at once.
        let pending = rt.arm_wait();
        // Lazy deadline: a wake time still ahead stays (it costs at most one early
        // wake-up), so a timer cleared and re-armed per message rings no doorbell.
        let next = match (rt.next_deadline(), self.waker.get().and_then(|r| r.wake())) {
            (Some(a), Some(b)) if b > now => Some(a.min(b)),
            (a, _) => a,
        };
        let next = if pending { Some(now) } else { next };
        if let Some(r) = self.waker.get() {
            r.set_wake(next);
        }
        Run::Idle
    }
}

impl PolledDevice for DeviceShared {
    fn drive_once(&self) {
        // A poll drives on a best-effort basis: an error shows in the next call that needs it.
        let _ = self.try_drive();
    }

    fn progress_once(&self) {
        let _ = self.try_progress();
    }

    fn end_inline(&self) {
        DeviceShared::end_inline(self);
    }
}
