//! The `ibv_qp_ex` interface: `ibv_create_qp_ex` with send ops, and the `ibv_wr_*` builders
//! and setters behind `ibv_qp_to_qp_ex`.
//!
//! As in rdma-core's providers, `wr_start` takes the QP's send lock (a spin flag, once per
//! batch), builders add a WR, setters complete the last one, and nothing reaches the device
//! before `wr_complete`: an error in any call of the batch (bad state, too many SGEs, inline
//! data too long, queue full) is remembered and returned by `wr_complete`, which then posts
//! nothing; `wr_abort` drops the batch. The batch lives in buffers made with the QP (grown
//! only when a batch is longer than any before): no allocation and no lock of ours per
//! work request.
#![allow(missing_docs)]

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

use libc::{c_int, c_void};
use rdma_proto::verbs::SgList;
use rdma_soft::verbs::{SendFlags, SendOp, SendWr, Sge, UdDest};

use crate::objects::{obj, Ah};
use crate::qp::Qp;
use crate::types::*;
use crate::util::soft_errno;

/// `IBV_QP_EX_WITH_*` we build: RDMA write (+imm), send (+imm), read, both atomics, send
/// with invalidate. (LOCAL_INV, BIND_MW, TSO, ATOMIC_WRITE are not supported.)
pub const RC_SEND_OPS: u64 = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x200;
/// On UD QPs: send and send with immediate, as rxe.
pub const UD_SEND_OPS: u64 = 0x4 | 0x8;

/// Whether a QP of `qp_type` (`IBV_QPT_*`) can have the send ops `flags`
/// (`IBV_QP_EX_WITH_*`): what `ibv_create_qp_ex` (and `rdma_create_qp_ex`) accept before
/// [`crate::qp::enable_send_ops`].
pub fn send_ops_supported(qp_type: c_int, flags: u64) -> bool {
    let ok = match qp_type {
        2 => RC_SEND_OPS,
        4 => UD_SEND_OPS,
        _ => 0,
    };
    flags & !ok == 0
}

/// One WR of the open batch: the WR and, when it carries inline data, its range in the
/// batch's inline buffer.
#[derive(Clone, Copy)]
struct Pending {
    wr: SendWr,
    inline: Option<(usize, usize)>,
}

struct State {
    open: bool,
    err: c_int,
    wrs: Vec<Pending>,
    inline: Vec<u8>,
}

/// A QP's `ibv_wr_*` batch.
pub struct Batch {
    lock: AtomicBool,
    st: UnsafeCell<State>,
    max_wr: usize,
    max_sge: usize,
    max_inline: usize,
}

impl Batch {
    /// Buffers for a send queue of `max_wr` WRs (capped: longer batches grow them once).
    pub fn new(max_wr: u32, max_sge: u32, max_inline: u32) -> Batch {
        let max_wr = max_wr as usize;
        let first = max_wr.min(1024);
        Batch {
            lock: AtomicBool::new(false),
            st: UnsafeCell::new(State {
                open: false,
                err: 0,
                wrs: Vec::with_capacity(first),
                inline: Vec::with_capacity((first * max_inline as usize).min(1 << 16)),
            }),
            max_wr,
            max_sge: max_sge as usize,
            max_inline: max_inline as usize,
        }
    }
}

/// Fills `c`'s `ibv_wr_*` pointers (every one: those outside `send_ops_flags` too, so that
/// a call through any of them is an error at `wr_complete`, never a jump to NULL).
pub fn fill_ops(c: &mut ibv_qp_ex) {
    c.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    c.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    c.wr_bind_mw = Some(wr_bind_mw);
    c.wr_local_inv = Some(wr_local_inv);
    c.wr_rdma_read = Some(wr_rdma_read);
    c.wr_rdma_write = Some(wr_rdma_write);
    c.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    c.wr_send = Some(wr_send);
    c.wr_send_imm = Some(wr_send_imm);
    c.wr_send_inv = Some(wr_send_inv);
    c.wr_send_tso = Some(wr_send_tso);
    c.wr_set_ud_addr = Some(wr_set_ud_addr);
    c.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    c.wr_set_inline_data = Some(wr_set_inline_data);
    c.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    c.wr_set_sge = Some(wr_set_sge);
    c.wr_set_sge_list = Some(wr_set_sge_list);
    c.wr_start = Some(wr_start);
    c.wr_complete = Some(wr_complete);
    c.wr_abort = Some(wr_abort);
    c.wr_atomic_write = Some(wr_atomic_write);
}

/// The QP and its batch state behind `p`, if it has the interface.
///
/// # Safety
/// `p` is NULL or an `ibv_qp_ex` of ours; the caller holds the batch (between `wr_start`
/// and `wr_complete` / `wr_abort`, one thread at a time, as rdma-core requires).
unsafe fn parts<'a>(p: *mut ibv_qp_ex) -> Option<(&'a Qp, &'a Batch, &'a mut State)> {
    // SAFETY: forwarded.
    let q = unsafe { obj::<_, Qp>(p) }?;
    let b = q.batch.as_deref()?;
    // SAFETY: the batch's owner (see above) is the only one touching its state.
    let st = unsafe { &mut *b.st.get() };
    Some((q, b, st))
}

/// Adds a WR of `op` with the QP's `wr_id` and `wr_flags`.
unsafe fn build(p: *mut ibv_qp_ex, op: Result<SendOp, c_int>) {
    // SAFETY: forwarded.
    let Some((_, b, st)) = (unsafe { parts(p) }) else {
        return;
    };
    if !st.open {
        st.err = libc::EINVAL;
        return;
    }
    if st.err != 0 {
        return;
    }
    let op = match op {
        Ok(op) => op,
        Err(e) => {
            st.err = e;
            return;
        }
    };
    if st.wrs.len() >= b.max_wr {
        st.err = libc::ENOSPC; // as rxe on a full queue
        return;
    }
    // SAFETY: our ibv_qp_ex.
    let (wr_id, flags) = unsafe { ((*p).wr_id, (*p).wr_flags) };
    let mut wr = SendWr::new(wr_id, op);
    // INLINE comes from wr_set_inline_data*, not from the flags.
    wr.flags = SendFlags::from_bits_truncate(flags & 0x7);
    st.wrs.push(Pending { wr, inline: None });
}

/// The last WR built, for a setter; None (and EINVAL) when there is none.
fn last(st: &mut State) -> Option<&mut Pending> {
    if !st.open || st.err != 0 {
        if !st.open {
            st.err = libc::EINVAL;
        }
        return None;
    }
    if st.wrs.is_empty() {
        st.err = libc::EINVAL;
        return None;
    }
    st.wrs.last_mut()
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    p: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    cmp: u64,
    swap: u64,
) {
    let op = SendOp::AtomicCmpAndSwp {
        remote_addr: addr,
        rkey,
        compare: cmp,
        swap,
    };
    // SAFETY: the caller's QP.
    unsafe { build(p, Ok(op)) }
}

unsafe extern "C" fn wr_atomic_fetch_add(p: *mut ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    let op = SendOp::AtomicFetchAndAdd {
        remote_addr: addr,
        rkey,
        add,
    };
    // SAFETY: the caller's QP.
    unsafe { build(p, Ok(op)) }
}

unsafe extern "C" fn wr_bind_mw(p: *mut ibv_qp_ex, _: *mut c_void, _: u32, _: *const c_void) {
    // SAFETY: the caller's QP.
    unsafe { build(p, Err(libc::EOPNOTSUPP)) }
}

unsafe extern "C" fn wr_local_inv(p: *mut ibv_qp_ex, _: u32) {
    // SAFETY: the caller's QP.
    unsafe { build(p, Err(libc::EOPNOTSUPP)) }
}

unsafe extern "C" fn wr_atomic_write(p: *mut ibv_qp_ex, _: u32, _: u64, _: *const c_void) {
    // SAFETY: the caller's QP.
    unsafe { build(p, Err(libc::EOPNOTSUPP)) }
}

unsafe extern "C" fn wr_send_tso(p: *mut ibv_qp_ex, _: *mut c_void, _: u16, _: u16) {
    // SAFETY: the caller's QP.
    unsafe { build(p, Err(libc::EOPNOTSUPP)) }
}

unsafe extern "C" fn wr_rdma_read(p: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    let op = SendOp::RdmaRead {
        remote_addr: addr,
        rkey,
    };
    // SAFETY: the caller's QP.
    unsafe { build(p, Ok(op)) }
}

unsafe extern "C" fn wr_rdma_write(p: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    let op = SendOp::RdmaWrite {
        remote_addr: addr,
        rkey,
    };
    // SAFETY: the caller's QP.
    unsafe { build(p, Ok(op)) }
}

unsafe extern "C" fn wr_rdma_write_imm(p: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: addr,
        rkey,
        imm: u32::from_be(imm),
    };
    // SAFETY: the caller's QP.
    unsafe { build(p, Ok(op)) }
}

unsafe extern "C" fn wr_send(p: *mut ibv_qp_ex) {
    // SAFETY: the caller's QP.
    unsafe { build(p, Ok(SendOp::Send)) }
}

unsafe extern "C" fn wr_send_imm(p: *mut ibv_qp_ex, imm: u32) {
    let op = SendOp::SendWithImm {
        imm: u32::from_be(imm),
    };
    // SAFETY: the caller's QP.
    unsafe { build(p, Ok(op)) }
}

unsafe extern "C" fn wr_send_inv(p: *mut ibv_qp_ex, rkey: u32) {
    let op = SendOp::SendWithInv {
        invalidate_rkey: rkey,
    };
    // SAFETY: the caller's QP.
    unsafe { build(p, Ok(op)) }
}

unsafe extern "C" fn wr_set_ud_addr(p: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    // SAFETY: the caller's QP and AH.
    let Some((_, _, st)) = (unsafe { parts(p) }) else {
        return;
    };
    let Some(h) = (unsafe { obj::<_, Ah>(ah) }) else {
        if st.open && st.err == 0 {
            st.err = libc::EINVAL;
        }
        return;
    };
    if let Some(w) = last(st) {
        w.wr.ud = Some(UdDest {
            ah: h.ah.handle(),
            remote_qpn: qpn,
            remote_qkey: qkey,
        });
    }
}

unsafe extern "C" fn wr_set_xrc_srqn(p: *mut ibv_qp_ex, _: u32) {
    // SAFETY: the caller's QP.
    if let Some((_, _, st)) = unsafe { parts(p) } {
        if last(st).is_some() {
            st.err = libc::EOPNOTSUPP; // no XRC
        }
    }
}

/// Gathers `bufs` into the batch's inline buffer for the last WR.
fn set_inline(b: &Batch, st: &mut State, bufs: &mut dyn Iterator<Item = (*const u8, usize)>) {
    if last(st).is_none() {
        return;
    }
    let start = st.inline.len();
    for (addr, len) in bufs {
        if st.inline.len() - start + len > b.max_inline {
            st.inline.truncate(start);
            st.err = libc::ENOSPC; // as rxe
            return;
        }
        if len > 0 {
            // SAFETY: the application's buffer of len bytes, read now as verbs does.
            st.inline
                .extend_from_slice(unsafe { std::slice::from_raw_parts(addr, len) });
        }
    }
    let n = st.inline.len() - start;
    if let Some(w) = st.wrs.last_mut() {
        w.inline = Some((start, n));
        w.wr.sg = SgList::new();
    }
}

unsafe extern "C" fn wr_set_inline_data(p: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
    // SAFETY: the caller's QP.
    let Some((_, b, st)) = (unsafe { parts(p) }) else {
        return;
    };
    if addr.is_null() && len > 0 {
        if st.err == 0 {
            st.err = libc::EINVAL;
        }
        return;
    }
    set_inline(b, st, &mut std::iter::once((addr as *const u8, len)));
}

unsafe extern "C" fn wr_set_inline_data_list(
    p: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    // SAFETY: the caller's QP.
    let Some((_, b, st)) = (unsafe { parts(p) }) else {
        return;
    };
    if list.is_null() && n > 0 {
        if st.err == 0 {
            st.err = libc::EINVAL;
        }
        return;
    }
    // SAFETY: the caller's array of n.
    let bufs = (0..n).map(|i| unsafe {
        let d = *list.add(i);
        (d.addr as *const u8, d.length)
    });
    set_inline(b, st, &mut bufs.into_iter());
}

unsafe extern "C" fn wr_set_sge(p: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: the caller's QP.
    let Some((_, _, st)) = (unsafe { parts(p) }) else {
        return;
    };
    if let Some(w) = last(st) {
        w.inline = None;
        // rxe: a zero length leaves the WR without an SGE.
        w.wr.sg = if length > 0 {
            SgList::from_slice(&[Sge { addr, length, lkey }]).unwrap_or_default()
        } else {
            SgList::new()
        };
    }
}

unsafe extern "C" fn wr_set_sge_list(p: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    // SAFETY: the caller's QP.
    let Some((_, b, st)) = (unsafe { parts(p) }) else {
        return;
    };
    if last(st).is_none() {
        return;
    }
    if n > b.max_sge {
        st.err = libc::ENOSPC; // as rxe: more than max_send_sge
        return;
    }
    if list.is_null() && n > 0 {
        st.err = libc::EINVAL;
        return;
    }
    let mut sg = SgList::new();
    for i in 0..n {
        // SAFETY: the caller's array of n.
        let s = unsafe { *list.add(i) };
        let e = Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
        if sg.push(e).is_err() {
            st.err = libc::ENOSPC;
            return;
        }
    }
    if let Some(w) = st.wrs.last_mut() {
        w.inline = None;
        w.wr.sg = sg;
    }
}

unsafe extern "C" fn wr_start(p: *mut ibv_qp_ex) {
    // SAFETY: the caller's QP.
    let Some(q) = (unsafe { obj::<_, Qp>(p) }) else {
        return;
    };
    let Some(b) = q.batch.as_deref() else {
        return;
    };
    // The send lock, held until wr_complete / wr_abort (rxe's spin lock).
    while b
        .lock
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
    // SAFETY: held.
    let st = unsafe { &mut *b.st.get() };
    st.open = true;
    st.err = 0;
    st.wrs.clear();
    st.inline.clear();
}

/// Closes the batch and releases the send lock (if this batch held it).
fn close(b: &Batch, st: &mut State) {
    let was_open = st.open;
    st.open = false;
    st.err = 0;
    st.wrs.clear();
    st.inline.clear();
    if was_open {
        b.lock.store(false, Ordering::Release);
    }
}

unsafe extern "C" fn wr_complete(p: *mut ibv_qp_ex) -> c_int {
    // SAFETY: the caller's QP.
    let Some((q, b, st)) = (unsafe { parts(p) }) else {
        return libc::EINVAL;
    };
    if !st.open {
        st.err = 0;
        return libc::EINVAL; // wr_complete without wr_start
    }
    let mut r = st.err;
    if r == 0 {
        for w in &st.wrs {
            let res = match w.inline {
                Some((off, n)) => q.qp.post_send_inline(&w.wr, &st.inline[off..off + n]),
                None => q.qp.post_send(&w.wr),
            };
            if let Err(e) = res {
                r = soft_errno(&e);
                break;
            }
        }
    }
    close(b, st);
    r
}

unsafe extern "C" fn wr_abort(p: *mut ibv_qp_ex) {
    // SAFETY: the caller's QP.
    if let Some((_, b, st)) = unsafe { parts(p) } {
        close(b, st);
    }
}

/// `verbs_context.create_qp_ex` (`ibv_create_qp_ex` for anything beyond a PD): a PD, no
/// create flags, and send ops among [`RC_SEND_OPS`] / [`UD_SEND_OPS`]; otherwise NULL with
/// `errno = EOPNOTSUPP`, as rxe.
pub unsafe extern "C" fn create_qp_ex(
    c: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    use crate::util::null_err;
    // SAFETY: the caller's attributes.
    let Some(a) = (unsafe { attr.as_mut() }) else {
        return null_err(libc::EINVAL);
    };
    let supported = 0x1 | 0x4 | 0x40; // PD, CREATE_FLAGS (none set), SEND_OPS_FLAGS
    if a.comp_mask & !supported != 0 || (a.comp_mask & 0x4 != 0 && a.create_flags != 0) {
        return null_err(libc::EOPNOTSUPP);
    }
    if a.comp_mask & 0x1 == 0 || a.pd.is_null() {
        return null_err(libc::EINVAL);
    }
    // SAFETY: the PD is the caller's; one of ours belongs to a context.
    if unsafe { (*a.pd).context } != c {
        return null_err(libc::EINVAL);
    }
    let ops = a.comp_mask & 0x40 != 0;
    if ops && !send_ops_supported(a.qp_type, a.send_ops_flags) {
        return null_err(libc::EOPNOTSUPP);
    }
    let mut init = ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    // SAFETY: forwarded.
    let qp = unsafe { crate::qp::ibv_create_qp(a.pd, &mut init) };
    a.cap = init.cap;
    if !qp.is_null() && ops {
        // SAFETY: just made by us.
        unsafe { crate::qp::enable_send_ops(qp) };
    }
    qp
}
