//! A connection request between its arrival and its route lookup. The passive side's path
//! needs netlink ([`crate::host::Resolver::accept_path`]); that runs without the context's lock,
//! so a request that passed the listener checks is held here (one per device: the device's
//! later CM events wait behind it, in order) while the CM engine looks its path up, and is
//! finished under the lock again (`listen::finish_held`).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rdma_proto::cm::{ReqReceived, SidrReqReceived};
use rdma_wire::ip_cm::IpCmHeaderRepr;

/// The request: a REQ or a SIDR_REQ.
pub(crate) enum HeldMad {
    Req(ReqReceived),
    Sidr(SidrReqReceived),
}

/// A request of one device waiting for its path.
pub(crate) struct HeldReq {
    pub mad: HeldMad,
    /// Its IP CM header (parsed when it arrived).
    pub hdr: IpCmHeaderRepr,
    /// A CM engine run is looking its path up (without the lock): others leave it alone.
    pub in_flight: bool,
}

impl HeldReq {
    /// The netdev it arrived on.
    pub fn arrival(&self) -> u32 {
        match &self.mad {
            HeldMad::Req(r) => r.path.tag,
            HeldMad::Sidr(r) => r.path.tag,
        }
    }
}

#[derive(Default)]
struct Gate {
    entered: bool,
    released: bool,
    timed_out: bool,
}

/// The shared part of a [`LookupHold`].
#[derive(Default)]
pub(crate) struct HoldShared {
    gate: Mutex<Gate>,
    cv: Condvar,
}

/// How long a held lookup waits for [`LookupHold::release`] before it goes on alone.
const HOLD_LIMIT: Duration = Duration::from_secs(120);

impl HoldShared {
    /// Called by the CM engine with the lock released, before the lookup: tells the test
    /// and waits until it releases (at most [`HOLD_LIMIT`]).
    pub(crate) fn enter(&self) {
        let mut g = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        g.entered = true;
        self.cv.notify_all();
        let end = Instant::now() + HOLD_LIMIT;
        while !g.released {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                g.timed_out = true;
                return;
            }
            g = self
                .cv
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Test hook ([`crate::cm::Cma::hold_passive_lookups`]): the next passive route lookups stop,
/// with the context's lock released, until [`LookupHold::release`] (or the guard's drop).
/// Not for applications.
pub struct LookupHold {
    pub(crate) shared: Arc<HoldShared>,
    pub(crate) clear: Box<dyn Fn() + Send + Sync>,
}

impl LookupHold {
    /// Waits until a request's lookup has reached the hold; false after `timeout`.
    pub fn wait_entered(&self, timeout: Duration) -> bool {
        let g = self.shared.gate.lock().unwrap_or_else(|e| e.into_inner());
        let (g, _) = self
            .shared
            .cv
            .wait_timeout_while(g, timeout, |g| !g.entered)
            .unwrap_or_else(|e| e.into_inner());
        g.entered
    }

    /// Lets the held lookup (and later ones) go on. True if it was still waiting, false if
    /// it had given up after its limit (something kept the caller from getting here).
    pub fn release(&self) -> bool {
        let mut g = self.shared.gate.lock().unwrap_or_else(|e| e.into_inner());
        g.released = true;
        self.shared.cv.notify_all();
        !g.timed_out
    }
}

impl Drop for LookupHold {
    fn drop(&mut self) {
        self.release();
        (self.clear)();
    }
}

impl std::fmt::Debug for LookupHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LookupHold").finish_non_exhaustive()
    }
}
