//! QPs: create, modify, query, destroy.
//!
//! Each `extern "C"` function here is rdma-core's function of the same name, with its
//! documented behaviour (its man page); only what differs is commented.
#![allow(missing_docs)]

use std::mem::zeroed;
use std::sync::Arc;

use libc::c_int;
use rdma_soft::verbs::{
    AccessFlags, MigState, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueuePair,
};

use crate::cq::Cq;
use crate::device::ctx;
use crate::objects::{ah_attr_of, obj, path_of, Pd, Srq};
use crate::types::*;
use crate::util::*;

/// A QP: `ibv_qp_ex` (which starts with `ibv_qp`) first.
#[repr(C)]
pub struct Qp {
    pub c: ibv_qp_ex,
    pub qp: Arc<QueuePair>,
    pub ud: bool,
    /// The `ibv_wr_*` batch: Some for QPs made with send ops ([`enable_send_ops`]).
    pub batch: Option<Box<crate::qp_ex::Batch>>,
}

/// Wraps `qp` (made here or by the CM) as an `ibv_qp`.
///
/// # Safety
/// `pd` is one of our PDs.
pub unsafe fn wrap(
    qp: Arc<QueuePair>,
    pd: *mut ibv_pd,
    init: &ibv_qp_init_attr,
    ud: bool,
) -> *mut ibv_qp {
    // SAFETY: plain data, zeroed mutex/cond, NULL function pointers.
    let mut x: ibv_qp_ex = unsafe { zeroed() };
    let c = &mut x.qp_base;
    // SAFETY: pd is one of ours.
    c.context = unsafe { (*pd).context };
    c.qp_context = init.qp_context;
    c.pd = pd;
    c.send_cq = init.send_cq;
    c.recv_cq = init.recv_cq;
    c.srq = init.srq;
    c.handle = qp.qpn();
    c.qp_num = qp.qpn();
    c.state = qp.state() as c_int;
    c.qp_type = init.qp_type;
    // SAFETY: make() checked them (ours).
    unsafe { crate::cq::use_cqs(init.send_cq, init.recv_cq, true) };
    boxed(Qp {
        c: x,
        qp,
        ud,
        batch: None,
    })
    .cast()
}

/// Gives `qp` the `ibv_qp_ex` interface (`ibv_qp_to_qp_ex` returns it from now on).
///
/// # Safety
/// `qp` is a QP of ours, just made (no other thread uses it yet).
pub unsafe fn enable_send_ops(qp: *mut ibv_qp) {
    // SAFETY: ours, not shared yet.
    let q = unsafe { &mut *qp.cast::<Qp>() };
    let cap = q.qp.cap();
    let max_sge = (cap.max_send_sge as usize).min(rdma_proto::verbs::MAX_SGE) as u32;
    q.batch = Some(Box::new(crate::qp_ex::Batch::new(
        cap.max_send_wr,
        max_sge,
        cap.max_inline_data,
    )));
    crate::qp_ex::fill_ops(&mut q.c);
}

/// Creates the soft QP for `init` in `pd` (not yet wrapped).
///
/// # Safety
/// The pointers in `init` are NULL or ours.
pub unsafe fn make(
    pd: *mut ibv_pd,
    init: &mut ibv_qp_init_attr,
) -> Result<(Arc<QueuePair>, bool), c_int> {
    // SAFETY: forwarded.
    unsafe {
        make_with(pd, init, |pd, a| {
            pd.create_qp(a).map(Arc::new).map_err(|e| soft_errno(&e))
        })
    }
}

/// [`make`] with the QP made by `create` (the CM makes an RC id's QP itself).
///
/// # Safety
/// As [`make`].
pub unsafe fn make_with(
    pd: *mut ibv_pd,
    init: &mut ibv_qp_init_attr,
    create: impl FnOnce(
        &rdma_soft::verbs::ProtectionDomain,
        &QpInitAttr<'_>,
    ) -> Result<Arc<QueuePair>, c_int>,
) -> Result<(Arc<QueuePair>, bool), c_int> {
    // SAFETY: the caller's pointers.
    let p = unsafe { obj::<_, Pd>(pd) }.ok_or(libc::EINVAL)?;
    let scq = unsafe { obj::<_, Cq>(init.send_cq) }.ok_or(libc::EINVAL)?;
    let rcq = unsafe { obj::<_, Cq>(init.recv_cq) }.ok_or(libc::EINVAL)?;
    let srq = unsafe { obj::<_, Srq>(init.srq) };
    let (qp_type, ud) = match init.qp_type {
        2 => (QpType::Rc, false),
        4 => (QpType::Ud, true),
        3 | 8 | 9 | 10 => return Err(libc::EOPNOTSUPP), // UC, raw packet, XRC
        _ => return Err(libc::EINVAL),
    };
    let max_inline = p.pd_max_inline();
    let cap = QpCap {
        max_send_wr: init.cap.max_send_wr.max(1),
        max_recv_wr: init.cap.max_recv_wr.max(1),
        max_send_sge: init.cap.max_send_sge.max(1),
        max_recv_sge: init.cap.max_recv_sge.max(1),
        max_inline_data: init.cap.max_inline_data,
    };
    if cap.max_inline_data > max_inline {
        return Err(libc::EINVAL);
    }
    let attr = QpInitAttr {
        qp_type,
        send_cq: &scq.cq,
        recv_cq: &rcq.cq,
        srq: srq.map(|s| &s.srq),
        cap,
        sq_sig_all: init.sq_sig_all != 0,
    };
    let qp = create(&p.pd, &attr)?;
    let got = qp.cap();
    init.cap = ibv_qp_cap {
        max_send_wr: got.max_send_wr,
        max_recv_wr: got.max_recv_wr,
        max_send_sge: got.max_send_sge,
        max_recv_sge: got.max_recv_sge,
        max_inline_data: got.max_inline_data,
    };
    Ok((qp, ud))
}

impl Pd {
    fn pd_max_inline(&self) -> u32 {
        // SAFETY: our PD's context.
        unsafe { ctx(self.c.context) }.map_or(0, |c| c.dev.soft.query_device().max_inline_data)
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: the caller's pointer.
    let Some(ia) = (unsafe { init.as_mut() }) else {
        return null_err(libc::EINVAL);
    };
    // SAFETY: forwarded.
    match unsafe { make(pd, ia) } {
        // SAFETY: make() checked pd.
        Ok((qp, ud)) => unsafe { wrap(qp, pd, ia, ud) },
        Err(e) => null_err(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by wrap(); its CQs outlive it (EBUSY while it uses them).
    unsafe { crate::cq::use_cqs((*qp).send_cq, (*qp).recv_cq, false) };
    // SAFETY: made by wrap().
    drop(unsafe { unbox(qp.cast::<Qp>()) });
    0
}

/// Our attributes from the C ones, for the fields in `mask`.
pub fn attr_from_c(a: &ibv_qp_attr, mask: c_int) -> Result<(QpAttr, QpAttrMask), c_int> {
    let m = QpAttrMask::from_bits(mask as u32 & 0x1f_ffff).ok_or(libc::EINVAL)?;
    if mask as u32 & !0x1f_ffff & !(1 << 25) != 0 {
        return Err(libc::EOPNOTSUPP); // rate limit and beyond: only RATE_LIMIT (25) ignored
    }
    let mut q = QpAttr::default();
    if m.contains(QpAttrMask::STATE) {
        q.qp_state = QpState::from_u32(a.qp_state as u32).ok_or(libc::EINVAL)?;
    }
    if m.contains(QpAttrMask::CUR_STATE) {
        q.cur_qp_state = QpState::from_u32(a.cur_qp_state as u32).ok_or(libc::EINVAL)?;
    }
    if m.contains(QpAttrMask::PATH_MTU) {
        q.path_mtu = mtu_from(a.path_mtu).ok_or(libc::EINVAL)?;
    }
    if m.contains(QpAttrMask::PATH_MIG_STATE) {
        q.path_mig_state = match a.path_mig_state {
            0 => MigState::Migrated,
            1 => MigState::Rearm,
            2 => MigState::Armed,
            _ => return Err(libc::EINVAL),
        };
    }
    q.qkey = a.qkey;
    q.rq_psn = a.rq_psn;
    q.sq_psn = a.sq_psn;
    q.dest_qp_num = a.dest_qp_num;
    q.qp_access_flags = AccessFlags::from_bits_truncate(a.qp_access_flags);
    if m.contains(QpAttrMask::AV) && a.ah_attr.is_global == 0 {
        return Err(libc::EINVAL); // RoCE: the GRH is the address
    }
    q.path = path_of(&a.ah_attr);
    q.pkey_index = a.pkey_index;
    q.port_num = a.port_num;
    if m.contains(QpAttrMask::AV) && q.port_num == 0 {
        q.port_num = a.ah_attr.port_num;
    }
    q.timeout = a.timeout;
    q.retry_cnt = a.retry_cnt;
    q.rnr_retry = a.rnr_retry;
    q.min_rnr_timer = a.min_rnr_timer;
    q.max_rd_atomic = a.max_rd_atomic;
    q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    q.alt_path = path_of(&a.alt_ah_attr);
    q.alt_port_num = a.alt_port_num;
    q.alt_pkey_index = a.alt_pkey_index;
    q.alt_timeout = a.alt_timeout;
    // CAP (resize) is not supported; EN_SQD_ASYNC_NOTIFY is accepted and ignored.
    let m = m.difference(QpAttrMask::CAP);
    Ok((q, m))
}

fn mtu_from(v: c_int) -> Option<Mtu> {
    Some(match v {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => return None,
    })
}

/// The C attributes from ours.
pub fn attr_to_c(q: &QpAttr, cap: QpCap) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: q.qp_state as c_int,
        cur_qp_state: q.cur_qp_state as c_int,
        path_mtu: q.path_mtu as c_int,
        path_mig_state: q.path_mig_state as c_int,
        qkey: q.qkey,
        rq_psn: q.rq_psn,
        sq_psn: q.sq_psn,
        dest_qp_num: q.dest_qp_num,
        qp_access_flags: q.qp_access_flags.bits(),
        cap: ibv_qp_cap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        },
        ah_attr: ah_attr_of(&q.path, q.port_num),
        alt_ah_attr: ah_attr_of(&q.alt_path, q.alt_port_num),
        pkey_index: q.pkey_index,
        alt_pkey_index: q.alt_pkey_index,
        max_rd_atomic: q.max_rd_atomic,
        max_dest_rd_atomic: q.max_dest_rd_atomic,
        min_rnr_timer: q.min_rnr_timer,
        port_num: q.port_num,
        timeout: q.timeout,
        retry_cnt: q.retry_cnt,
        rnr_retry: q.rnr_retry,
        alt_port_num: q.alt_port_num,
        alt_timeout: q.alt_timeout,
        ..Default::default()
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(q), Some(a)) = (unsafe { obj::<_, Qp>(qp) }, unsafe { attr.as_ref() }) else {
        return libc::EINVAL;
    };
    // rdma-core's failure is its failed `write`'s: the errno is set too (programs print it)
    let (mut qa, m) = match attr_from_c(a, mask) {
        Ok(x) => x,
        Err(e) => return errno_too(e),
    };
    if q.ud && m.contains(QpAttrMask::PORT) && qa.port_num == 0 {
        qa.port_num = 1;
    }
    match q.qp.modify(&qa, m) {
        Ok(()) => {
            // SAFETY: our QP; `state` mirrors the last transition as rdma-core does.
            unsafe { (*qp).state = q.qp.state() as c_int };
            0
        }
        Err(e) => errno_too(soft_errno(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(q), Some(a)) = (unsafe { obj::<_, Qp>(qp) }, unsafe { attr.as_mut() }) else {
        return libc::EINVAL;
    };
    let qa = match q.qp.query() {
        Ok(x) => x,
        Err(e) => return soft_errno(&e),
    };
    *a = attr_to_c(&qa, q.qp.cap());
    // SAFETY: the caller's pointer, or NULL.
    if let Some(i) = unsafe { init.as_mut() } {
        let c = &q.c.qp_base;
        i.qp_context = c.qp_context;
        i.send_cq = c.send_cq;
        i.recv_cq = c.recv_cq;
        i.srq = c.srq;
        i.cap = a.cap;
        i.qp_type = c.qp_type;
        i.sq_sig_all = 0;
    }
    0
}

/// `ibv_qp_to_qp_ex`: the `ibv_wr_*` interface of a QP made by `ibv_create_qp_ex` with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`; NULL for any other QP, as in rdma-core.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // SAFETY: the caller's QP.
    match unsafe { obj::<_, Qp>(qp) } {
        Some(q) if q.batch.is_some() => qp.cast(),
        _ => std::ptr::null_mut(),
    }
}

/// `ibv_create_ah_from_wc`: an AH back to the sender of a UD receive (its GRH).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut u8,
    port: u8,
) -> *mut ibv_ah {
    let mut attr = ibv_ah_attr::default();
    // SAFETY: the caller's pointers.
    if unsafe { ibv_init_ah_from_wc((*pd.cast::<Pd>()).c.context, port, wc, grh, &mut attr) } != 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: forwarded.
    unsafe { crate::objects::ibv_create_ah(pd, &mut attr) }
}

/// `ibv_init_ah_from_wc`: the reply path from a received GRH (the sender's GID is its
/// source, ours its destination).
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    c: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut u8,
    attr: *mut ibv_ah_attr,
) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(ctx), Some(w), Some(a)) = (unsafe { ctx(c) }, unsafe { wc.as_ref() }, unsafe {
        attr.as_mut()
    }) else {
        return minus_one(libc::EINVAL);
    };
    if grh.is_null() || w.wc_flags & 1 == 0 {
        return minus_one(libc::EINVAL);
    }
    let mut sgid = [0u8; 16];
    let mut dgid = [0u8; 16];
    // SAFETY: the 40-byte GRH at the start of the receive buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(grh.add(8), sgid.as_mut_ptr(), 16);
        std::ptr::copy_nonoverlapping(grh.add(24), dgid.as_mut_ptr(), 16);
    }
    // An IPv4 datagram's GRH holds the IPv4 header (20 bytes) at offset 20: its addresses
    // are at 32 (source) and 36 (destination).
    let v4 = sgid == [0; 16] || (sgid[..10] == [0; 10] && sgid[10..12] != [0xff, 0xff]);
    if v4 {
        let mut s = [0u8; 4];
        let mut d = [0u8; 4];
        // SAFETY: as above.
        unsafe {
            std::ptr::copy_nonoverlapping(grh.add(32), s.as_mut_ptr(), 4);
            std::ptr::copy_nonoverlapping(grh.add(36), d.as_mut_ptr(), 4);
        }
        sgid = std::net::Ipv4Addr::from(s).to_ipv6_mapped().octets();
        dgid = std::net::Ipv4Addr::from(d).to_ipv6_mapped().octets();
    }
    let Some(idx) = ctx
        .dev
        .soft
        .gids_on(port)
        .ok()
        .and_then(|g| g.iter().position(|x| x.gid() == dgid))
    else {
        return minus_one(libc::ENOENT);
    };
    *a = ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: sgid },
            flow_label: 0,
            sgid_index: idx as u8,
            hop_limit: 64,
            traffic_class: 0,
        },
        is_global: 1,
        port_num: port,
        ..Default::default()
    };
    0
}

/// `ibv_query_qp_data_in_order`: 0, no ordering promised (our device gathers and scatters
/// with `memcpy`, whose store order within a message is unspecified), as rxe. Unknown
/// flags give 0 too, as rdma-core.
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order(_qp: *mut ibv_qp, _op: c_int, _flags: u32) -> c_int {
    0
}
