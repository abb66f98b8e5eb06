//! Completion channels (`ibv_comp_channel`) and their CQ events.
//!
//! Each `extern "C"` function here is rdma-core's function of the same name. A thread
//! blocked in `ibv_get_cq_event` holds the channel's shared part ([`ChanShared`], an `Arc`
//! taken under the live set's lock), so that another thread may destroy the channel
//! meanwhile: the wait goes on, as rdma-core's `read` of a closed fd does, and never reads
//! freed memory.
#![allow(missing_docs)]

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use libc::{c_int, c_void};
use rdma_soft::verbs::CompletionChannel;

use crate::device::ctx;
use crate::objects::Cq;
use crate::types::*;
use crate::util::*;

/// A completion channel: the C struct first.
#[repr(C)]
pub struct Chan {
    pub c: ibv_comp_channel,
    /// Shared with the threads blocked on the channel.
    pub s: Arc<ChanShared>,
}

/// What a channel shares with its waiters.
pub struct ChanShared {
    pub ch: CompletionChannel,
    /// The `ibv_cq` of each CQ number notifying this channel: a CQ leaves it (under its lock)
    /// before it is freed.
    pub cqs: Mutex<HashMap<u32, usize>>,
    /// `c.fd`: the application's view of the channel's fd ([`poll_proxy`]).
    pub fd: OwnedFd,
    /// Set by `ibv_destroy_comp_channel`: a wait restarted after it fails with `EBADF`.
    pub destroyed: AtomicBool,
}

/// The addresses of our live channels; `refcnt` of each is changed under its lock.
static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Runs `f` on the channel at `p` under the live set's lock, if it is one of ours and not
/// destroyed (`None` otherwise: NULL, a destroyed channel, any other pointer).
pub fn with_live<R>(p: *mut ibv_comp_channel, f: impl FnOnce(&mut Chan) -> R) -> Option<R> {
    let g = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    if p.is_null() || !g.as_ref().is_some_and(|s| s.contains(&(p as usize))) {
        return None;
    }
    // SAFETY: one of our live channels; destroy frees it only after leaving the set, under
    // this lock.
    Some(f(unsafe { &mut *p.cast::<Chan>() }))
}

/// Attaches the CQ `id` (its `ibv_cq` at `cq`) to the channel `p`: its shared part, or `None`
/// if `p` is not a live channel.
pub fn attach(p: *mut ibv_comp_channel, id: u32, cq: usize) -> Option<Arc<ChanShared>> {
    with_live(p, |c| {
        c.c.refcnt += 1;
        c.s.cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, cq);
        c.s.clone()
    })
}

/// Detaches the CQ `id` from its channel (`p`, shared part `s`) before the CQ is freed.
pub fn detach(p: *mut ibv_comp_channel, s: &ChanShared, id: u32) {
    s.cqs.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    with_live(p, |c| c.c.refcnt -= 1);
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(c: *mut ibv_context) -> *mut ibv_comp_channel {
    // SAFETY: the caller's context.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return null_err(libc::EINVAL);
    };
    match ctx.dev.soft.create_comp_channel() {
        Ok(ch) => {
            let proxy = match poll_proxy(ch.as_raw_fd()) {
                Ok(p) => p,
                Err(e) => return null_err(e.raw_os_error().unwrap_or(libc::EMFILE)),
            };
            let p = boxed(Chan {
                c: ibv_comp_channel {
                    context: c,
                    fd: proxy.as_raw_fd(),
                    refcnt: 0,
                },
                s: Arc::new(ChanShared {
                    ch,
                    cqs: Mutex::new(HashMap::new()),
                    fd: proxy,
                    destroyed: AtomicBool::new(false),
                }),
            });
            let mut g = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            g.get_or_insert_with(HashSet::new).insert(p as usize);
            p.cast()
        }
        Err(e) => null_err(soft_errno(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    {
        // Out of the live set (no new waiter or CQ can take it) before it is freed.
        let mut g = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        let Some(set) = g.as_mut().filter(|s| s.contains(&(ch as usize))) else {
            return libc::EINVAL;
        };
        // SAFETY: one of our live channels.
        if unsafe { (*ch).refcnt } > 0 {
            return libc::EBUSY;
        }
        set.remove(&(ch as usize));
    }
    // SAFETY: made by ibv_create_comp_channel, no longer reachable through the live set.
    let c = unsafe { unbox(ch.cast::<Chan>()) };
    c.s.destroyed.store(true, Ordering::Release);
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    let Some(s) = with_live(ch, |c| c.s.clone()) else {
        return minus_one(libc::EINVAL);
    };
    // A non-blocking fd (O_NONBLOCK set by the application) returns EAGAIN when empty.
    let fd = s.fd.as_raw_fd();
    let nonblock = is_nonblocking(fd);
    let open = || !s.destroyed.load(Ordering::Acquire);
    loop {
        // Blocking: waits on the channel's fd itself, so that a signal interrupts it as
        // it interrupts rdma-core's read (util::wait_readable_while_open).
        let cq = match s.ch.get_event() {
            Ok(Some(cq)) => cq,
            Ok(None) if nonblock => return minus_one(libc::EAGAIN),
            Ok(None) => match wait_readable_while_open(fd, &open) {
                Ok(()) => continue,
                Err(e) => return minus_one(e),
            },
            Err(e) => return minus_one(soft_errno(&e)),
        };
        let cqs = s.cqs.lock().unwrap_or_else(|e| e.into_inner());
        let Some(p) = cqs.get(&cq.id()).map(|&p| p as *mut Cq) else {
            continue; // its ibv_cq was destroyed meanwhile
        };
        // SAFETY: the caller's out-pointers; p is a live Cq (it leaves the map, under the
        // lock held here, before it is freed).
        unsafe {
            (*p).reported.fetch_add(1, Ordering::AcqRel);
            if !cq_out.is_null() {
                *cq_out = p.cast();
            }
            if !ctx_out.is_null() {
                *ctx_out = (*p).c.cq_context;
            }
        }
        return 0;
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: u32) {
    if cq.is_null() {
        return;
    }
    // SAFETY: the caller's CQ; its mutex and cond start zeroed (their initializers).
    unsafe {
        let m = std::ptr::addr_of_mut!((*cq).mutex);
        libc::pthread_mutex_lock(m);
        (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(n);
        libc::pthread_cond_signal(std::ptr::addr_of_mut!((*cq).cond));
        libc::pthread_mutex_unlock(m);
    }
}

/// Waits until the application acked every event reported for `cq` (`reported`), as
/// rdma-core's `ibv_destroy_cq` does: a thread that got an event may still ack it.
///
/// # Safety
/// `cq` is one of our live CQs, out of its channel's map (no new event is reported).
pub unsafe fn wait_acked(cq: *mut ibv_cq, reported: &std::sync::atomic::AtomicU32) {
    // SAFETY: as ibv_ack_cq_events, which changes the count under the same mutex.
    unsafe {
        let m = std::ptr::addr_of_mut!((*cq).mutex);
        libc::pthread_mutex_lock(m);
        while (*cq).comp_events_completed != reported.load(Ordering::Acquire) {
            libc::pthread_cond_wait(std::ptr::addr_of_mut!((*cq).cond), m);
        }
        libc::pthread_mutex_unlock(m);
    }
}
