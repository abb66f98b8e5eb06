//! PDs, MRs, SRQs, AHs (CQs and completion channels: [`crate::cq`]).
//!
//! Each `extern "C"` function here is rdma-core's function of the same name, with its
//! documented behaviour (its man page); only what differs is commented.
#![allow(missing_docs)]

use std::mem::zeroed;

use libc::{c_int, c_void};
use rdma_soft::verbs::{
    AccessFlags, AddressHandle, MemoryRegion, PathAttr, ProtectionDomain, SharedReceiveQueue,
};

use crate::device::{ctx, Ctx};
use crate::types::*;
use crate::util::*;

/// A PD: `ibv_pd` first.
#[repr(C)]
pub struct Pd {
    pub c: ibv_pd,
    pub pd: ProtectionDomain,
}

#[repr(C)]
pub struct Mr {
    pub c: ibv_mr,
    pub mr: MemoryRegion,
}

#[repr(C)]
pub struct Srq {
    pub c: ibv_srq,
    pub srq: SharedReceiveQueue,
}

#[repr(C)]
pub struct Ah {
    pub c: ibv_ah,
    pub ah: AddressHandle,
}

/// # Safety
/// NULL or an object of this library of type `T` whose C struct is `C` (its first field).
pub unsafe fn obj<'a, C, T>(p: *mut C) -> Option<&'a T> {
    // SAFETY: forwarded.
    unsafe { p.cast::<T>().as_ref() }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: the caller's context.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return null_err(libc::EINVAL);
    };
    match ctx.dev.soft.alloc_pd() {
        Ok(pd) => {
            let handle = pd.id().0;
            boxed(Pd {
                c: ibv_pd { context: c, handle },
                pd,
            })
            .cast()
        }
        Err(e) => null_err(soft_errno(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if pd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by ibv_alloc_pd.
    drop(unsafe { unbox(pd.cast::<Pd>()) });
    0
}

pub(crate) fn access_of(a: c_int) -> Result<AccessFlags, c_int> {
    // MW_BIND, ZERO_BASED, ON_DEMAND, HUGETLB … are not supported.
    let known = 0xf;
    let optional = 0x3ff0_0000u32 as c_int; // IBV_ACCESS_OPTIONAL_RANGE: may be ignored
    if a & !known & !optional & !(1 << 7) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(AccessFlags::from_bits_truncate(a as u32 & 0xf))
}

unsafe fn reg(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> *mut ibv_mr {
    // SAFETY: the caller's PD.
    let Some(p) = (unsafe { obj::<_, Pd>(pd) }) else {
        return null_err(libc::EINVAL);
    };
    let access = match access_of(access) {
        Ok(a) => a,
        Err(e) => return null_err(e),
    };
    // SAFETY: the application keeps its buffer while registered, as verbs requires.
    match unsafe { p.pd.register_raw(addr.cast(), len, access) } {
        Ok(mr) => {
            let c = ibv_mr {
                // SAFETY: pd is a Pd.
                context: unsafe { (*pd).context },
                pd,
                addr,
                length: len,
                handle: mr.lkey(),
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            };
            boxed(Mr { c, mr }).cast()
        }
        Err(e) => null_err(soft_errno(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    unsafe { reg(pd, addr, len, access) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    if iova != addr as u64 {
        return null_err(libc::EOPNOTSUPP); // only iova == addr
    }
    // SAFETY: forwarded.
    unsafe { reg(pd, addr, len, access as c_int) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    unsafe { ibv_reg_mr_iova2(pd, addr, len, iova, access as u32) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by reg(); dropping deregisters and leaves the memory to the caller.
    drop(unsafe { unbox(mr.cast::<Mr>()) });
    0
}

fn ctx_ref(c: *mut ibv_context) -> Option<&'static Ctx> {
    // SAFETY: contexts live until closed; the caller gives one of ours.
    unsafe { ctx(c) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    // SAFETY: the caller's pointers.
    let (Some(p), Some(ia)) = (unsafe { obj::<_, Pd>(pd) }, unsafe { init.as_mut() }) else {
        return null_err(libc::EINVAL);
    };
    // SAFETY: pd is a Pd.
    let c = unsafe { (*pd).context };
    let Some(ctx) = ctx_ref(c) else {
        return null_err(libc::EINVAL);
    };
    let srq =
        match ctx
            .dev
            .soft
            .create_srq(&p.pd, ia.attr.max_wr as usize, ia.attr.max_sge as usize)
        {
            Ok(s) => s,
            Err(e) => return null_err(soft_errno(&e)),
        };
    if ia.attr.srq_limit > 0 {
        if let Err(e) = srq.arm_limit(ia.attr.srq_limit) {
            return null_err(soft_errno(&e));
        }
    }
    let q = srq.query();
    ia.attr.max_wr = q.max_wr as u32;
    ia.attr.max_sge = q.max_sge as u32;
    // SAFETY: plain data, zeroed mutex/cond.
    let mut cs: ibv_srq = unsafe { zeroed() };
    cs.context = c;
    cs.srq_context = ia.srq_context;
    cs.pd = pd;
    boxed(Srq { c: cs, srq }).cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(s), Some(a)) = (unsafe { obj::<_, Srq>(srq) }, unsafe { attr.as_ref() }) else {
        return libc::EINVAL;
    };
    if mask & 1 != 0 {
        return libc::EOPNOTSUPP; // IBV_SRQ_MAX_WR: no resize
    }
    if mask & 2 != 0 {
        if let Err(e) = s.srq.arm_limit(a.srq_limit) {
            return soft_errno(&e);
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(s), Some(a)) = (unsafe { obj::<_, Srq>(srq) }, unsafe { attr.as_mut() }) else {
        return libc::EINVAL;
    };
    let q = s.srq.query();
    *a = ibv_srq_attr {
        max_wr: q.max_wr as u32,
        max_sge: q.max_sge as u32,
        srq_limit: q.srq_limit,
    };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by ibv_create_srq.
    drop(unsafe { unbox(srq.cast::<Srq>()) });
    0
}

/// Our path from an `ibv_ah_attr` (RoCE: the GRH is the address).
pub fn path_of(a: &ibv_ah_attr) -> PathAttr {
    PathAttr {
        dgid: a.grh.dgid.raw,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        // the GRH's field is 20 bits: wider values keep their low 20, as the kernel takes
        // them (UCX passes its "auto", all ones)
        flow_label: a.grh.flow_label & 0xF_FFFF,
    }
}

/// An `ibv_ah_attr` from our path.
pub fn ah_attr_of(p: &PathAttr, port: u8) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: p.dgid },
            flow_label: p.flow_label,
            sgid_index: p.sgid_index,
            hop_limit: p.hop_limit,
            traffic_class: p.traffic_class,
        },
        is_global: 1,
        port_num: port,
        ..Default::default()
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    // SAFETY: the caller's pointers.
    let (Some(p), Some(a)) = (unsafe { obj::<_, Pd>(pd) }, unsafe { attr.as_ref() }) else {
        return null_err(libc::EINVAL);
    };
    if a.is_global == 0 {
        return null_err(libc::EINVAL); // RoCE needs a GRH
    }
    let port = if a.port_num == 0 { 1 } else { a.port_num };
    match p.pd.create_ah_on(port, &path_of(a)) {
        Ok(ah) => {
            let handle = ah.handle();
            // SAFETY: pd is a Pd.
            let context = unsafe { (*pd).context };
            boxed(Ah {
                c: ibv_ah {
                    context,
                    pd,
                    handle,
                },
                ah,
            })
            .cast()
        }
        Err(e) => null_err(soft_errno(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by ibv_create_ah.
    drop(unsafe { unbox(ah.cast::<Ah>()) });
    0
}
