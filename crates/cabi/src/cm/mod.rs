//! librdmacm over the `rdmacm` crate: event channels, ids, events (RDMACM_1.x).
//!
//! One process-wide [`rdmacm::cm::Cma`] serves every channel; an id's `verbs` is the shared
//! context of its device ([`crate::device::cm_context`]), the same pointer for every id on
//! that device. An id made without a channel is synchronous (rdma-core's rule): each call
//! waits on a private channel for its own event.
#![allow(missing_docs)]

pub mod addr;
pub mod ep;
pub mod event;
pub mod mcast;

use std::collections::{HashMap, HashSet};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use libc::{c_int, c_void, sockaddr};
use rdmacm::cm::{CmId, CmOption, ConnParam, EventChannel, PortSpace};

use crate::cm_types::*;
use crate::cq::{ibv_create_comp_channel, ibv_create_cq, ibv_destroy_comp_channel, ibv_destroy_cq};
use crate::device::{cm_context, cma, dev_for};
use crate::objects::obj;
use crate::qp::{make, make_with, wrap, Qp};
use crate::types::*;
use crate::util::*;

/// An event channel: the C struct first.
#[repr(C)]
pub struct Chan {
    pub c: rdma_event_channel,
    /// Shared with the threads blocked on the channel ([`ChanRef`]).
    pub ch: Arc<EventChannel>,
    /// `c.fd`: the application's view of the channel's fd ([`poll_proxy`]).
    pub fd: Arc<std::os::fd::OwnedFd>,
    /// Set when the channel is dropped: a wait restarted after it fails with `EBADF`.
    pub closed: Arc<AtomicBool>,
}

/// What a caller holds of a channel, taken under the live set's lock ([`chan_ref`]): a
/// thread blocked in `rdma_get_cm_event` keeps it while another thread may destroy the
/// channel (rping's main thread does, while its CM thread waits), and the wait then goes
/// on, as rdma-core's read of a closed channel fd does, instead of reading freed memory.
pub struct ChanRef {
    pub ch: Arc<EventChannel>,
    pub fd: Arc<std::os::fd::OwnedFd>,
    pub closed: Arc<AtomicBool>,
}

/// The channel at `p`, held ([`ChanRef`]), if it is one of our live channels.
///
/// # Safety
/// NULL, or a pointer the application got from us as a channel (a destroyed one or any
/// other value gives `None`).
pub unsafe fn chan_ref(p: *mut rdma_event_channel) -> Option<ChanRef> {
    // Under the live set's lock: rdma_destroy_event_channel takes the channel out of the
    // set (under it) before it frees the channel.
    let g = LIVE_CHANS.lock().unwrap_or_else(|e| e.into_inner());
    if p.is_null() || !g.as_ref().is_some_and(|s| s.contains(&(p as usize))) {
        return None;
    }
    // SAFETY: one of our live channels, kept alive by the lock.
    let c = unsafe { &*p.cast::<Chan>() };
    Some(c.hold())
}

/// An id: the C struct first.
#[repr(C)]
pub struct Id {
    pub c: rdma_cm_id,
    pub id: CmId,
    /// The private channel of a synchronous id (`rdma_create_id` with no channel).
    pub sync: Option<Box<Chan>>,
    /// CQs and channels `rdma_create_qp` made for the id (destroyed with its QP).
    pub made_cqs: bool,
}

/// The addresses of our live ids and channels: a pointer the application passes is
/// dereferenced only when it is one of them, so that an id or channel used after its
/// destruction (or never ours) is `EINVAL`, never a crash.
static LIVE_IDS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
static LIVE_CHANS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn live_set(m: &Mutex<Option<HashSet<usize>>>, p: usize, add: bool) -> bool {
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    let set = g.get_or_insert_with(HashSet::new);
    if add {
        set.insert(p)
    } else {
        set.remove(&p)
    }
}

fn is_live(m: &Mutex<Option<HashSet<usize>>>, p: usize) -> bool {
    m.lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|s| s.contains(&p))
}

/// Dropped in place (its box's address): a private channel with its id, or
/// [`rdma_destroy_event_channel`].
impl Drop for Chan {
    fn drop(&mut self) {
        live_set(&LIVE_CHANS, self as *mut Chan as usize, false);
        self.closed.store(true, Ordering::Release);
    }
}

/// Our ids by number, for events.
fn ids() -> &'static Mutex<HashMap<u64, usize>> {
    static M: OnceLock<Mutex<HashMap<u64, usize>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The id of `num`, if it is ours.
pub fn id_by_num(num: u64) -> Option<*mut Id> {
    ids()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&num)
        .map(|p| *p as *mut Id)
}

fn ps_of(ps: c_int) -> Option<PortSpace> {
    Some(match ps {
        0x0106 => PortSpace::Tcp,
        0x0111 => PortSpace::Udp,
        0x013F => PortSpace::Ib,
        0x0002 => PortSpace::IpoIb,
        _ => return None,
    })
}

/// Makes the C id around `id`, registered for events.
pub fn new_id(
    id: CmId,
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_int,
    sync: Option<Box<Chan>>,
) -> *mut Id {
    // SAFETY: plain data.
    let mut c: rdma_cm_id = unsafe { std::mem::zeroed() };
    c.channel = match &sync {
        Some(s) => &s.c as *const rdma_event_channel as *mut rdma_event_channel,
        None => channel,
    };
    c.context = context;
    c.ps = ps;
    c.qp_type = if ps == 0x0111 || ps == 0x0002 { 4 } else { 2 };
    let num = id.num();
    let p = boxed(Id {
        c,
        id,
        sync,
        made_cqs: false,
    });
    live_set(&LIVE_IDS, p as usize, true);
    ids()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(num, p as usize);
    // SAFETY: just made.
    refresh(unsafe { &mut *p });
    p
}

/// Brings the C id's fields (`verbs`, `port_num`, `route.addr`) up to date.
pub fn refresh(i: &mut Id) {
    if let Some(dev) = i.id.device() {
        i.c.verbs = cm_context(dev_for(&dev));
    }
    if let Some(port) = i.id.port_num() {
        i.c.port_num = port;
    }
    let a = &mut i.c.route.addr;
    if let Some(l) = i.id.local_addr() {
        addr::to_c(&l, &mut a.src_storage);
        a.ibaddr.sgid.raw = addr::gid_of(&l);
    }
    if let Some(r) = i.id.peer_addr() {
        addr::to_c(&r, &mut a.dst_storage);
        a.ibaddr.dgid.raw = addr::gid_of(&r);
    }
    a.ibaddr.pkey = 0xffff_u16.to_be();
    i.c.route.num_paths = i32::from(i.id.path().is_some());
}

/// # Safety
/// NULL, or a pointer the application got from us as an id (a destroyed one or any other
/// value gives `None`: perftest 4.5's retry path reuses destroyed ids).
pub unsafe fn id_ref<'a>(p: *mut rdma_cm_id) -> Option<&'a mut Id> {
    if p.is_null() || !is_live(&LIVE_IDS, p as usize) {
        return None;
    }
    // SAFETY: one of our live ids.
    unsafe { p.cast::<Id>().as_mut() }
}

/// 0, or -1 with errno from `r`.
pub fn ret(r: rdmacm::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => minus_one(cm_errno(&e)),
    }
}

#[no_mangle]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    let ch = match cma().and_then(|c| EventChannel::with_cma(&c)) {
        Ok(ch) => ch,
        Err(e) => return null_err(cm_errno(&e)),
    };
    let fd = match poll_proxy(ch.fd()) {
        Ok(fd) => fd,
        Err(e) => return null_err(e.raw_os_error().unwrap_or(libc::EMFILE)),
    };
    use std::os::fd::AsRawFd;
    let p = boxed(Chan {
        c: rdma_event_channel { fd: fd.as_raw_fd() },
        ch: Arc::new(ch),
        fd: Arc::new(fd),
        closed: Arc::new(AtomicBool::new(false)),
    });
    live_set(&LIVE_CHANS, p as usize, true);
    p.cast()
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    // Out of the live set first (no new waiter can take it), then freed.
    if !ch.is_null() && live_set(&LIVE_CHANS, ch as usize, false) {
        // SAFETY: made by rdma_create_event_channel; dropped in its box.
        drop(unsafe { Box::from_raw(ch.cast::<Chan>()) });
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    let Some(pspace) = ps_of(ps) else {
        return minus_one(libc::EINVAL);
    };
    // SAFETY: checked against our live channels (and held).
    let held = unsafe { chan_ref(channel) };
    if out.is_null() || (!channel.is_null() && held.is_none()) {
        return minus_one(libc::EINVAL);
    }
    let sync = if channel.is_null() {
        let c = rdma_create_event_channel();
        if c.is_null() {
            return -1;
        }
        // SAFETY: just made.
        Some(unsafe { Box::from_raw(c.cast::<Chan>()) })
    } else {
        None
    };
    // The caller's channel or our private one.
    let ch = match (&sync, &held) {
        (Some(s), _) => &s.ch,
        (None, Some(h)) => &h.ch,
        (None, None) => return minus_one(libc::EINVAL),
    };
    match CmId::new(ch, pspace) {
        Ok(id) => {
            let p = new_id(id, channel, context, ps, sync);
            // SAFETY: the caller's out-pointer.
            unsafe { *out = p.cast() };
            0
        }
        Err(e) => minus_one(cm_errno(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: the caller's id.
    let Some(i) = (unsafe { id_ref(id) }) else {
        return minus_one(libc::EINVAL);
    };
    if !i.c.event.is_null() {
        // SAFETY: a request event kept for rdma_get_request's id.
        unsafe { event::rdma_ack_cm_event(i.c.event) };
        i.c.event = null_mut();
    }
    ids()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&i.id.num());
    live_set(&LIVE_IDS, id as usize, false);
    // SAFETY: made by new_id.
    drop(unsafe { unbox(id.cast::<Id>()) });
    0
}

/// Waits, for a synchronous id, for its next event: Ok if it is `want`.
pub fn sync_wait(i: &mut Id, want: &[rdmacm::cm::EventType]) -> c_int {
    let Some(s) = &i.sync else { return 0 };
    match s.wait_event() {
        Ok(ev) => {
            let (kind, status) = (ev.kind(), ev.status());
            drop(ev);
            refresh(i);
            if want.contains(&kind) {
                0
            } else {
                let e = if status < 0 {
                    -status
                } else {
                    libc::ECONNREFUSED
                };
                minus_one(e)
            }
        }
        Err(e) => minus_one(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, sa: *mut sockaddr) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(i), Some(a)) = (unsafe { id_ref(id) }, unsafe { addr::from_c(sa) }) else {
        return minus_one(libc::EINVAL);
    };
    let r = ret(i.id.bind_addr(a));
    refresh(i);
    if r == 0 && a.ip().is_unspecified() {
        // A wildcard bind is mostly a listener's: open what its listen will need now, so
        // that rdma_listen is quick (qperf 0.4.11 tells its client to connect between the
        // two). A failure is the listen's to report.
        if let Err(e) = i.id.prepare_listen() {
            tracing::debug!(error = %e, "rdma_bind_addr: nothing opened ahead of a listen");
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(i), Some(d)) = (unsafe { id_ref(id) }, unsafe { addr::from_c(dst) }) else {
        return minus_one(libc::EINVAL);
    };
    // SAFETY: as above; NULL is allowed.
    let s = unsafe { addr::from_c(src) };
    let t = Duration::from_millis(timeout_ms.max(1) as u64);
    let r = ret(i.id.resolve_addr(s, d, t));
    refresh(i);
    if r != 0 {
        return r;
    }
    sync_wait(i, &[rdmacm::cm::EventType::AddrResolved])
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    // SAFETY: the caller's id.
    let Some(i) = (unsafe { id_ref(id) }) else {
        return minus_one(libc::EINVAL);
    };
    let r = ret(i
        .id
        .resolve_route(Duration::from_millis(timeout_ms.max(1) as u64)));
    refresh(i);
    if r != 0 {
        return r;
    }
    sync_wait(i, &[rdmacm::cm::EventType::RouteResolved])
}

#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    // SAFETY: the caller's id.
    let Some(i) = (unsafe { id_ref(id) }) else {
        return minus_one(libc::EINVAL);
    };
    let r = ret(i
        .id
        .listen(if backlog <= 0 { 1024 } else { backlog as usize }));
    refresh(i);
    r
}

/// Our connection parameters from the C ones (NULL: the defaults).
///
/// # Safety
/// `p` is NULL or valid, with `private_data_len` bytes at `private_data`.
pub unsafe fn conn_param(p: *const rdma_conn_param, qp_num: Option<u32>) -> ConnParam {
    let mut c = ConnParam::default();
    // SAFETY: the caller's pointer.
    if let Some(p) = unsafe { p.as_ref() } {
        if !p.private_data.is_null() && p.private_data_len > 0 {
            // SAFETY: private_data_len bytes.
            c.private_data = unsafe {
                std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len as usize)
            }
            .to_vec();
        }
        c.responder_resources = p.responder_resources;
        c.initiator_depth = p.initiator_depth;
        c.flow_control = p.flow_control != 0;
        c.retry_count = p.retry_count;
        c.rnr_retry_count = p.rnr_retry_count;
        c.srq = p.srq != 0;
        c.qp_num = qp_num.or(Some(p.qp_num));
    } else {
        c.qp_num = qp_num;
    }
    c
}

/// The QP number the CM should announce: the id's own QP when it has one made elsewhere
/// than [`CmId::create_qp`] (UD ids).
fn own_qpn(i: &Id) -> Option<u32> {
    // SAFETY: our QP, if any.
    let q = unsafe { obj::<_, Qp>(i.c.qp) }?;
    // UD: SIDR_REP carries the QP number even when the CM made the QP.
    (i.id.qp().is_none() || i.c.qp_type == 4).then(|| q.qp.qpn())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    // SAFETY: the caller's id.
    let Some(i) = (unsafe { id_ref(id) }) else {
        return minus_one(libc::EINVAL);
    };
    // SAFETY: the caller's parameters.
    let mut p = unsafe { conn_param(param, own_qpn(i)) };
    if i.id.qp().is_some() {
        p.qp_num = None;
    }
    let r = ret(i.id.connect(&p));
    if r != 0 {
        return r;
    }
    sync_wait(i, &[rdmacm::cm::EventType::Established])
}

#[no_mangle]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    // SAFETY: the caller's id.
    let Some(i) = (unsafe { id_ref(id) }) else {
        return minus_one(libc::EINVAL);
    };
    // SAFETY: the caller's parameters.
    let mut p = unsafe { conn_param(param, own_qpn(i)) };
    if i.id.qp().is_some() && i.c.qp_type != 4 {
        p.qp_num = None;
    }
    let r = ret(i.id.accept(&p));
    if !i.c.event.is_null() {
        // SAFETY: the request event rdma_get_request kept.
        unsafe { event::rdma_ack_cm_event(i.c.event) };
        i.c.event = null_mut();
    }
    if r != 0 || i.c.qp_type == 4 {
        return r;
    }
    sync_wait(i, &[rdmacm::cm::EventType::Established])
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: the caller's id.
    let Some(i) = (unsafe { id_ref(id) }) else {
        return minus_one(libc::EINVAL);
    };
    let pd: &[u8] = if data.is_null() {
        &[]
    } else {
        // SAFETY: len bytes of the caller's.
        unsafe { std::slice::from_raw_parts(data.cast(), len as usize) }
    };
    ret(i.id.reject(pd))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: the caller's id.
    let Some(i) = (unsafe { id_ref(id) }) else {
        return minus_one(libc::EINVAL);
    };
    ret(i.id.disconnect())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: the caller's id.
    let Some(i) = (unsafe { id_ref(id) }) else {
        return minus_one(libc::EINVAL);
    };
    ret(i.id.establish())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    if id.is_null() {
        return minus_one(libc::EINVAL);
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(i), Some(a)) = (unsafe { id_ref(id) }, unsafe { attr.as_mut() }) else {
        return minus_one(libc::EINVAL);
    };
    let Some(state) = rdma_soft::verbs::QpState::from_u32(a.qp_state as u32) else {
        return minus_one(libc::EINVAL);
    };
    match i.id.init_qp_attr(state) {
        Ok((q, m)) => {
            let cap = a.cap;
            *a = crate::qp::attr_to_c(&q, rdma_soft::verbs::QpCap::default());
            a.cap = cap;
            if !mask.is_null() {
                // SAFETY: the caller's int.
                unsafe { *mask = m.bits() as c_int };
            }
            0
        }
        Err(e) => minus_one(cm_errno(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    // SAFETY: the caller's id.
    let Some(i) = (unsafe { id_ref(id) }) else {
        return minus_one(libc::EINVAL);
    };
    if optval.is_null() {
        return minus_one(libc::EINVAL);
    }
    // SAFETY: optlen bytes at optval, read by size.
    let int = || -> Option<c_int> {
        (optlen >= 4).then(|| unsafe { optval.cast::<c_int>().read_unaligned() })
    };
    let byte = || -> Option<u8> { (optlen >= 1).then(|| unsafe { *optval.cast::<u8>() }) };
    let opt = match (level, optname) {
        (0, 0) => byte().map(CmOption::Tos),
        (0, 1) => int().map(|v| CmOption::ReuseAddr(v != 0)),
        (0, 2) => int().map(|v| CmOption::AfOnly(v != 0)),
        (0, 3) => byte().map(CmOption::AckTimeout),
        (1, _) => return minus_one(libc::EOPNOTSUPP), // IB path records: not on RoCE here
        _ => return minus_one(libc::ENOSYS),
    };
    let Some(opt) = opt else {
        return minus_one(libc::EINVAL);
    };
    ret(i.id.set_option(opt))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(i), Some(ch)) = (unsafe { id_ref(id) }, unsafe { chan_ref(channel) }) else {
        return minus_one(libc::EINVAL);
    };
    let r = ret(i.id.migrate(&ch.ch));
    if r == 0 {
        i.c.channel = channel;
        i.sync = None;
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller's id.
    unsafe { id_ref(id) }
        .and_then(|i| i.id.local_addr())
        .map_or(0, |a| a.port().to_be())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller's id.
    unsafe { id_ref(id) }
        .and_then(|i| i.id.peer_addr())
        .map_or(0, |a| a.port().to_be())
}

/// A PD per device for QPs made without one (rdma-core keeps one per device too).
fn default_pd(verbs: *mut ibv_context) -> *mut ibv_pd {
    static M: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    let mut m = M
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    // SAFETY: our context.
    *m.entry(verbs as usize)
        .or_insert_with(|| unsafe { crate::objects::ibv_alloc_pd(verbs) } as usize)
        as *mut ibv_pd
}

/// Makes the send and receive CQs (each with its channel) an id's QP lacks.
unsafe fn make_cqs(i: &mut Id, attr: &mut ibv_qp_init_attr) -> c_int {
    let v = i.c.verbs;
    if attr.recv_cq.is_null() {
        // SAFETY: our context.
        let ch = unsafe { ibv_create_comp_channel(v) };
        let cq = unsafe {
            ibv_create_cq(
                v,
                attr.cap.max_recv_wr.max(1) as c_int,
                i as *mut Id as *mut c_void,
                ch,
                0,
            )
        };
        if cq.is_null() {
            return -1;
        }
        i.c.recv_cq_channel = ch;
        i.c.recv_cq = cq;
        attr.recv_cq = cq;
        i.made_cqs = true;
    }
    if attr.send_cq.is_null() {
        // SAFETY: our context.
        let ch = unsafe { ibv_create_comp_channel(v) };
        let cq = unsafe {
            ibv_create_cq(
                v,
                attr.cap.max_send_wr.max(1) as c_int,
                i as *mut Id as *mut c_void,
                ch,
                0,
            )
        };
        if cq.is_null() {
            return -1;
        }
        i.c.send_cq_channel = ch;
        i.c.send_cq = cq;
        attr.send_cq = cq;
        i.made_cqs = true;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(i), Some(a)) = (unsafe { id_ref(id) }, unsafe { attr.as_mut() }) else {
        return minus_one(libc::EINVAL);
    };
    refresh(i);
    if i.c.verbs.is_null() {
        return minus_one(libc::EINVAL); // no device yet: bind or resolve first
    }
    let pd = if pd.is_null() {
        default_pd(i.c.verbs)
    } else {
        pd
    };
    // SAFETY: our PD.
    if pd.is_null() || unsafe { (*pd).context } != i.c.verbs {
        return minus_one(libc::EINVAL); // a PD of another device
    }
    // SAFETY: the id's own context.
    if unsafe { make_cqs(i, a) } != 0 {
        return -1;
    }
    let ud = a.qp_type == 4;
    // A UD QP on a UD id is the CM's (as an RC one): its joins attach it to their groups.
    let made = if ud && !matches!(i.c.ps, 0x0111 | 0x0002) {
        // SAFETY: the pointers in `a` are ours.
        unsafe { make(pd, a) }.and_then(|(qp, ud)| {
            let port = i.id.port_num().unwrap_or(1);
            qp.ud_ready_port(port, 0x0123_4567)
                .map_err(|e| soft_errno(&e))?;
            Ok((qp, ud))
        })
    } else {
        let cmid = &i.id;
        // SAFETY: as above.
        unsafe {
            make_with(pd, a, |pd, ia| {
                cmid.create_qp(pd, ia).map_err(|e| cm_errno(&e))
            })
        }
    };
    match made {
        Ok((qp, ud)) => {
            // SAFETY: pd is ours (checked above).
            i.c.qp = unsafe { wrap(qp, pd, a, ud) };
            i.c.pd = pd;
            i.c.qp_type = a.qp_type;
            0
        }
        Err(e) => minus_one(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    // SAFETY: the caller's id.
    let Some(i) = (unsafe { id_ref(id) }) else {
        return;
    };
    if !i.c.qp.is_null() {
        // SAFETY: our QP.
        unsafe { crate::qp::ibv_destroy_qp(i.c.qp) };
        i.c.qp = null_mut();
    }
    if i.made_cqs {
        // SAFETY: the CQs and channels made by make_cqs.
        unsafe {
            for (cq, ch) in [
                (i.c.send_cq, i.c.send_cq_channel),
                (i.c.recv_cq, i.c.recv_cq_channel),
            ] {
                if !cq.is_null() {
                    ibv_destroy_cq(cq);
                }
                if !ch.is_null() {
                    ibv_destroy_comp_channel(ch);
                }
            }
        }
        i.c.send_cq = null_mut();
        i.c.recv_cq = null_mut();
        i.c.send_cq_channel = null_mut();
        i.c.recv_cq_channel = null_mut();
        i.made_cqs = false;
    }
}
