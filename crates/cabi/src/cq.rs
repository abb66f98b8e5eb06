//! CQs and completion channels (`ibv_comp_channel`): CQ events, acks, destruction.
//!
//! Each `extern "C"` function here is rdma-core's function of the same name. A thread
//! blocked in `ibv_get_cq_event` holds the channel's shared part ([`ChanShared`], an `Arc`
//! taken under the live set's lock), so that another thread may destroy the channel
//! meanwhile: the wait goes on, as rdma-core's `read` of a closed fd does, and never reads
//! freed memory.
#![allow(missing_docs)]

use std::collections::{HashMap, HashSet};
use std::mem::zeroed;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use libc::{c_int, c_void};
use rdma_soft::verbs::{CompletionChannel, CompletionQueue};

use crate::device::ctx;
use crate::objects::obj;
use crate::types::*;
use crate::util::*;

#[repr(C)]
pub struct Cq {
    pub c: ibv_cq,
    pub cq: CompletionQueue,
    /// The channel it notifies.
    pub chan: Option<Arc<ChanShared>>,
    /// The events `ibv_get_cq_event` returned for it: `ibv_destroy_cq` waits until the
    /// application acked as many (`c.comp_events_completed`), as rdma-core's does.
    pub reported: AtomicU32,
    /// References from QPs (as send and as receive CQ): `ibv_destroy_cq` is `EBUSY` while
    /// any remains, as the kernel's destroy of a CQ in use.
    pub users: AtomicU32,
}

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

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: the caller's context.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return null_err(libc::EINVAL);
    };
    if cqe <= 0 {
        return null_err(libc::EINVAL);
    }
    // NULL, or one of our live channels.
    let chan = if channel.is_null() {
        None
    } else {
        match with_live(channel, |c| c.s.clone()) {
            Some(s) => Some(s),
            None => return null_err(libc::EINVAL),
        }
    };
    let cq = match ctx
        .dev
        .soft
        .create_cq(cqe as usize, chan.as_ref().map(|c| &c.ch))
    {
        Ok(cq) => cq,
        Err(e) => return null_err(soft_errno(&e)),
    };
    // SAFETY: plain data and a zeroed (initializer) mutex/cond.
    let mut cc: ibv_cq = unsafe { zeroed() };
    cc.context = c;
    cc.channel = channel;
    cc.cq_context = cq_context;
    cc.handle = cq.id();
    cc.cqe = cq.capacity().min(i32::MAX as usize) as c_int;
    let id = cq.id();
    let p = boxed(Cq {
        c: cc,
        cq,
        chan,
        reported: AtomicU32::new(0),
        users: AtomicU32::new(0),
    });
    // Counted in the channel's refcnt (under the live set's lock, as destroy checks it).
    if !channel.is_null() && attach(channel, id, p as usize).is_none() {
        // SAFETY: just made, never given out.
        drop(unsafe { unbox(p) });
        return null_err(libc::EINVAL); // the channel was destroyed meanwhile
    }
    p.cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: the caller's CQ.
    let Some(q) = (unsafe { obj::<_, Cq>(cq) }) else {
        return libc::EINVAL;
    };
    if q.users.load(Ordering::Acquire) > 0 {
        return libc::EBUSY; // a QP uses it (rdma-core: the kernel refuses)
    }
    if let Some(s) = &q.chan {
        // No event is reported for it after this.
        detach(q.c.channel, s, q.cq.id());
        // SAFETY: our CQ; its mutex and cond are the ones ibv_ack_cq_events signals.
        unsafe { wait_acked(cq, &q.reported) };
    }
    // SAFETY: made by ibv_create_cq.
    drop(unsafe { unbox(cq.cast::<Cq>()) });
    0
}

/// Counts (`+1`) or releases (`-1`) a QP's reference to each of its CQs ([`Cq::users`]).
///
/// # Safety
/// `send` and `recv` are NULL or our live CQs.
pub unsafe fn use_cqs(send: *mut ibv_cq, recv: *mut ibv_cq, add: bool) {
    for cq in [send, recv] {
        // SAFETY: forwarded.
        if let Some(q) = unsafe { obj::<_, Cq>(cq) } {
            if add {
                q.users.fetch_add(1, Ordering::AcqRel);
            } else {
                q.users.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    // SAFETY: the caller's CQ.
    let Some(q) = (unsafe { obj::<_, Cq>(cq) }) else {
        return libc::EINVAL;
    };
    // The ring cannot grow: as large as asked is fine, larger is EINVAL.
    if cqe <= 0 || cqe as usize > q.cq.capacity() {
        return libc::EINVAL;
    }
    0
}
