//! Multicast: `rdma_join_multicast` / `_ex`, `rdma_leave_multicast` over the CM's joins
//! (`CmId::join_multicast`, docs/CM.md "Multicast"), and `ibv_attach_mcast` /
//! `ibv_detach_mcast` over `QueuePair::attach_mcast` / `detach_mcast`.
//!
//! Each `extern "C"` function here is rdma-core's function of the same name, with its
//! documented behaviour (its man page); only what differs is commented.
#![allow(missing_docs)]

use libc::{c_int, c_void, sockaddr};
use rdmacm::cm::{EventType, McJoinFlags};

use super::{addr, id_ref, refresh, ret, sync_wait};
use crate::cm_types::*;
use crate::qp::Qp;
use crate::types::*;
use crate::util::*;

/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS` and `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS`.
const ATTR_ADDRESS: u32 = 1;
const ATTR_JOIN_FLAGS: u32 = 2;
/// `RDMA_CM_JOIN_MC_ATTR_RESERVED`: the first comp_mask value rdma-core refuses.
const ATTR_RESERVED: u32 = 4;

/// The join itself; a synchronous id waits for its MULTICAST_JOIN (or the error's status).
///
/// # Safety
/// `id` and `a` as the caller's (checked for NULL and ours).
unsafe fn join(id: *mut rdma_cm_id, a: *const sockaddr, flags: u32, ctx: *mut c_void) -> c_int {
    // SAFETY: the caller's pointers (NULL and foreign ones refused).
    let (Some(i), Some(group)) = (unsafe { id_ref(id) }, unsafe { addr::from_c(a) }) else {
        return minus_one(libc::EINVAL);
    };
    let flags = match McJoinFlags::from_raw(flags) {
        Ok(f) => f,
        Err(e) => return minus_one(cm_errno(&e)),
    };
    let r = ret(i.id.join_multicast(group, flags, ctx as u64));
    refresh(i);
    if r != 0 {
        return r;
    }
    sync_wait(i, &[EventType::MulticastJoin])
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut sockaddr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { join(id, addr, 0, context) }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's pointer.
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return minus_one(libc::EINVAL);
    };
    if a.comp_mask >= ATTR_RESERVED {
        return minus_one(libc::EOPNOTSUPP);
    }
    if a.comp_mask & ATTR_ADDRESS == 0 || a.comp_mask & ATTR_JOIN_FLAGS == 0 {
        return minus_one(libc::EINVAL);
    }
    // SAFETY: forwarded (the flags are checked by McJoinFlags::from_raw).
    unsafe { join(id, a.addr, a.join_flags, context) }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(i), Some(group)) = (unsafe { id_ref(id) }, unsafe { addr::from_c(addr) }) else {
        return minus_one(libc::EINVAL);
    };
    ret(i.id.leave_multicast(group))
}

/// The QP behind an `ibv_qp` of ours, with the GID: `EINVAL` for NULL.
///
/// # Safety
/// `qp` is NULL or one of our QPs; `gid` NULL or valid.
unsafe fn qp_gid<'a>(qp: *mut ibv_qp, gid: *const ibv_gid) -> Result<(&'a Qp, [u8; 16]), c_int> {
    // SAFETY: the caller's pointers.
    match unsafe { (qp.cast::<Qp>().as_ref(), gid.as_ref()) } {
        (Some(q), Some(g)) => Ok((q, g.raw)),
        _ => Err(libc::EINVAL),
    }
}

/// Returns the errno itself, as rdma-core's `ibv_attach_mcast`.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    // SAFETY: forwarded.
    match unsafe { qp_gid(qp, gid) } {
        Ok((q, g)) => {
            q.qp.attach_mcast(g, lid)
                .map_or_else(|e| soft_errno(&e), |()| 0)
        }
        Err(e) => e,
    }
}

/// Returns the errno itself, as rdma-core's `ibv_detach_mcast`.
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    // SAFETY: forwarded.
    match unsafe { qp_gid(qp, gid) } {
        Ok((q, g)) => {
            q.qp.detach_mcast(g, lid)
                .map_or_else(|e| soft_errno(&e), |()| 0)
        }
        Err(e) => e,
    }
}
