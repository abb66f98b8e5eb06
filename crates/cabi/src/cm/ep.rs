//! `rdma_getaddrinfo`, endpoints (`rdma_create_ep`, synchronous ids), `rdma_get_request`.
//!
//! Each `extern "C"` function here is rdma-core's function of the same name, with its
//! documented behaviour (its man page); only what differs is commented.
#![allow(missing_docs)]

use std::net::SocketAddr;
use std::ptr::null_mut;

use libc::{c_char, c_int, c_void, sockaddr};
use rdmacm::cm::EventType;

use super::addr;
use super::event::{rdma_ack_cm_event, to_c};
use super::{
    id_ref, rdma_create_id, rdma_create_qp, rdma_destroy_id, rdma_destroy_qp, refresh, Chan,
};
use crate::cm_types::*;
use crate::types::*;
use crate::util::*;

const RAI_PASSIVE: c_int = 1;
const RAI_NUMERICHOST: c_int = 2;

fn resolve(
    node: *const c_char,
    service: *const c_char,
    family: c_int,
    flags: c_int,
) -> Result<Vec<SocketAddr>, c_int> {
    // SAFETY: plain data.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_family = family;
    hints.ai_socktype = libc::SOCK_STREAM;
    if flags & RAI_NUMERICHOST != 0 {
        hints.ai_flags |= libc::AI_NUMERICHOST;
    }
    if flags & RAI_PASSIVE != 0 {
        hints.ai_flags |= libc::AI_PASSIVE;
    }
    let mut res: *mut libc::addrinfo = null_mut();
    // SAFETY: C strings or NULL from the caller; res freed below.
    let r = unsafe { libc::getaddrinfo(node, service, &hints, &mut res) };
    if r != 0 {
        return Err(match r {
            libc::EAI_NONAME => libc::ENOENT,
            libc::EAI_FAMILY => libc::EAFNOSUPPORT,
            _ => libc::EINVAL,
        });
    }
    let mut out = Vec::new();
    let mut p = res;
    // SAFETY: the list getaddrinfo made.
    while let Some(a) = unsafe { p.as_ref() } {
        // SAFETY: its address.
        if let Some(sa) = unsafe { addr::from_c(a.ai_addr) } {
            if !out.contains(&sa) {
                out.push(sa);
            }
        }
        p = a.ai_next;
    }
    // SAFETY: made by getaddrinfo.
    unsafe { libc::freeaddrinfo(res) };
    Ok(out)
}

fn c_addr(a: &SocketAddr) -> *mut sockaddr {
    // SAFETY: plain data.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    addr::to_c(a, &mut s);
    boxed(s).cast()
}

#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null()) {
        return minus_one(libc::EINVAL);
    }
    // SAFETY: the caller's hints, or NULL.
    let h = unsafe { hints.as_ref() };
    let flags = h.map_or(0, |h| h.ai_flags);
    let family = h.map_or(libc::AF_UNSPEC, |h| h.ai_family);
    let addrs = match resolve(node, service, family, flags) {
        Ok(a) if !a.is_empty() => a,
        Ok(_) => return minus_one(libc::ENOENT),
        Err(e) => return minus_one(e),
    };
    let a = addrs[0];
    // SAFETY: plain data.
    let mut ai: rdma_addrinfo = unsafe { std::mem::zeroed() };
    ai.ai_flags = flags;
    ai.ai_family = if a.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    ai.ai_qp_type = h.map_or(2, |h| if h.ai_qp_type != 0 { h.ai_qp_type } else { 2 });
    ai.ai_port_space = h.map_or(0x0106, |h| {
        if h.ai_port_space != 0 {
            h.ai_port_space
        } else {
            0x0106
        }
    });
    if flags & RAI_PASSIVE != 0 {
        ai.ai_src_addr = c_addr(&a);
        ai.ai_src_len = addr::c_len(&a);
    } else {
        ai.ai_dst_addr = c_addr(&a);
        ai.ai_dst_len = addr::c_len(&a);
        // SAFETY: the hints' source address, if any.
        if let Some(s) = h.and_then(|h| unsafe { addr::from_c(h.ai_src_addr) }) {
            ai.ai_src_addr = c_addr(&s);
            ai.ai_src_len = addr::c_len(&s);
        }
    }
    // SAFETY: the caller's out-pointer.
    unsafe { *res = boxed(ai) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: made by rdma_getaddrinfo.
        let ai = unsafe { unbox(p) };
        for a in [ai.ai_src_addr, ai.ai_dst_addr] {
            if !a.is_null() {
                // SAFETY: boxed sockaddr_storage from c_addr.
                unsafe { unbox(a.cast::<libc::sockaddr_storage>()) };
            }
        }
        p = ai.ai_next;
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    out: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's pointers.
    let Some(ai) = (unsafe { res.as_ref() }) else {
        return minus_one(libc::EINVAL);
    };
    if out.is_null() {
        return minus_one(libc::EINVAL);
    }
    let mut id: *mut rdma_cm_id = null_mut();
    // SAFETY: a synchronous id.
    if unsafe { rdma_create_id(null_mut(), &mut id, null_mut(), ai.ai_port_space) } != 0 {
        return -1;
    }
    let fail = |id: *mut rdma_cm_id| {
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
        // SAFETY: our id.
        unsafe { rdma_destroy_id(id) };
        minus_one(e)
    };
    let r = if ai.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: our id, the addrinfo's address.
        unsafe { super::rdma_bind_addr(id, ai.ai_src_addr) }
    } else {
        // SAFETY: as above.
        let r = unsafe { super::rdma_resolve_addr(id, ai.ai_src_addr, ai.ai_dst_addr, 2000) };
        if r == 0 {
            // SAFETY: as above.
            unsafe { super::rdma_resolve_route(id, 2000) }
        } else {
            r
        }
    };
    if r != 0 {
        return fail(id);
    }
    // SAFETY: our id.
    let i = unsafe { id_ref(id) }.expect("just made");
    // SAFETY: the caller's attributes, or NULL.
    if let Some(qa) = unsafe { qp_init.as_mut() } {
        qa.qp_type = ai.ai_qp_type; // as rdma-core: the QP type is the addrinfo's
        if ai.ai_flags & RAI_PASSIVE == 0 {
            // SAFETY: forwarded.
            if unsafe { rdma_create_qp(id, pd, qa) } != 0 {
                return fail(id);
            }
        } else {
            // A listener keeps the attributes for its requests' ids (rdma_get_request).
            i.c.pd = pd;
            i.c.qp_type = qa.qp_type;
            LISTEN_ATTRS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((id as usize, Attr(*qa)));
        }
    }
    i.c.pd = if pd.is_null() { i.c.pd } else { pd };
    // SAFETY: the caller's out-pointer.
    unsafe { *out = id };
    0
}

/// `ibv_qp_init_attr` kept for a passive endpoint (plain data).
struct Attr(ibv_qp_init_attr);
// SAFETY: only the CQ/SRQ pointers of the caller's, which it shares across threads anyway.
unsafe impl Send for Attr {}

static LISTEN_ATTRS: std::sync::Mutex<Vec<(usize, Attr)>> = std::sync::Mutex::new(Vec::new());

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    if id.is_null() {
        return;
    }
    LISTEN_ATTRS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(p, _)| *p != id as usize);
    // SAFETY: our id.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_id(id);
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    out: *mut *mut rdma_cm_id,
) -> c_int {
    // SAFETY: the caller's id.
    let Some(l) = (unsafe { id_ref(listen) }) else {
        return minus_one(libc::EINVAL);
    };
    let Some(s) = &l.sync else {
        return minus_one(libc::EINVAL); // only for synchronous listeners
    };
    loop {
        let ev = match s.wait_event() {
            Ok(ev) => ev,
            Err(e) => return minus_one(e),
        };
        if ev.kind() != EventType::ConnectRequest {
            continue; // acknowledged by dropping
        }
        let e = match to_c(ev) {
            Ok(e) => e,
            Err(e) => return minus_one(e),
        };
        // SAFETY: the event just made; its id is the new one.
        let id = unsafe { (*e).c.id };
        // SAFETY: our new id.
        let i = unsafe { id_ref(id) }.expect("new id");
        // The new id is synchronous too: its own channel.
        let ch = super::rdma_create_event_channel();
        if ch.is_null() {
            // SAFETY: ours.
            unsafe { rdma_ack_cm_event(e.cast()) };
            return -1;
        }
        // SAFETY: just made.
        let chan = unsafe { Box::from_raw(ch.cast::<Chan>()) };
        if let Err(err) = i.id.migrate(&chan.ch) {
            // SAFETY: ours.
            unsafe { rdma_ack_cm_event(e.cast()) };
            return minus_one(cm_errno(&err));
        }
        i.c.channel = &chan.c as *const rdma_event_channel as *mut rdma_event_channel;
        i.sync = Some(chan);
        i.c.event = e.cast();
        refresh(i);
        let attr = LISTEN_ATTRS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(p, _)| *p == listen as usize)
            .map(|(_, a)| a.0);
        if let Some(mut qa) = attr {
            // SAFETY: our new id and the listener's PD.
            if unsafe { rdma_create_qp(id, l.c.pd, &mut qa) } != 0 {
                let err = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EINVAL);
                // SAFETY: ours.
                unsafe { rdma_destroy_id(id) };
                return minus_one(err);
            }
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *out = id };
        return 0;
    }
}

/// `IBV_QP_INIT_ATTR_PD`, `IBV_QP_INIT_ATTR_CREATE_FLAGS`, `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
const INIT_ATTR_PD: u32 = 1;
const INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
const INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
/// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`.
const CREATE_BLOCK_SELF_MCAST_LB: u32 = 1 << 1;

/// `rdma_create_qp_ex`: the common part, the PD when given, of the create flags
/// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` (others, XRC, RSS ...: `EOPNOTSUPP`), and
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` as `ibv_create_qp_ex` takes it (`ibv_qp_to_qp_ex` of
/// the id's QP then gives the `ibv_wr_*` interface; unsupported ops: `EOPNOTSUPP`, no QP).
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut c_void) -> c_int {
    // SAFETY: the caller's ibv_qp_init_attr_ex (layout checked in layout.rs).
    let Some(ex) = (unsafe { attr.cast::<ibv_qp_init_attr_ex>().as_mut() }) else {
        return minus_one(libc::EINVAL);
    };
    let known = INIT_ATTR_PD | INIT_ATTR_CREATE_FLAGS | INIT_ATTR_SEND_OPS_FLAGS;
    if ex.comp_mask & !known != 0 {
        return minus_one(libc::EOPNOTSUPP);
    }
    let pd = if ex.comp_mask & INIT_ATTR_PD != 0 {
        ex.pd
    } else {
        null_mut()
    };
    let flags = if ex.comp_mask & INIT_ATTR_CREATE_FLAGS != 0 {
        ex.create_flags
    } else {
        0
    };
    if flags & !CREATE_BLOCK_SELF_MCAST_LB != 0 {
        return minus_one(libc::EOPNOTSUPP);
    }
    let ops = ex.comp_mask & INIT_ATTR_SEND_OPS_FLAGS != 0;
    if ops && !crate::qp_ex::send_ops_supported(ex.qp_type, ex.send_ops_flags) {
        return minus_one(libc::EOPNOTSUPP);
    }
    let mut base = ibv_qp_init_attr {
        qp_context: ex.qp_context,
        send_cq: ex.send_cq,
        recv_cq: ex.recv_cq,
        srq: ex.srq,
        cap: ex.cap,
        qp_type: ex.qp_type,
        sq_sig_all: ex.sq_sig_all,
    };
    // SAFETY: forwarded; `base` lives across the call.
    let r = unsafe { rdma_create_qp(id, pd, &mut base) };
    if r != 0 {
        return r;
    }
    // rdma_create_qp fills in the CQs it made and the capacities it got.
    ex.send_cq = base.send_cq;
    ex.recv_cq = base.recv_cq;
    ex.cap = base.cap;
    // SAFETY: the id's QP, just made by us; the application has not seen it yet.
    let qp = unsafe { id_ref(id).map_or(null_mut(), |i| i.c.qp) };
    if flags & CREATE_BLOCK_SELF_MCAST_LB != 0 {
        // SAFETY: as above.
        let q = unsafe { qp.cast::<crate::qp::Qp>().as_ref() };
        if let Some(Err(e)) = q.map(|q| q.qp.set_block_self_mcast_loopback(true)) {
            // SAFETY: the id's QP.
            unsafe { rdma_destroy_qp(id) };
            return minus_one(soft_errno(&e));
        }
    }
    if ops && !qp.is_null() {
        // SAFETY: as above.
        unsafe { crate::qp::enable_send_ops(qp) };
    }
    0
}

/// rsocket (`r*`) is not provided: every call fails with ENOSYS.
macro_rules! rsocket_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> isize {
            minus_one(libc::ENOSYS) as isize
        }
    )*};
}
rsocket_stubs!(
    raccept,
    rbind,
    rclose,
    rconnect,
    rfcntl,
    rgetpeername,
    rgetsockname,
    rgetsockopt,
    riomap,
    riounmap,
    riowrite,
    rlisten,
    rpoll,
    rread,
    rreadv,
    rrecv,
    rrecvfrom,
    rrecvmsg,
    rselect,
    rsend,
    rsendmsg,
    rsendto,
    rsetsockopt,
    rshutdown,
    rsocket,
    rwrite,
    rwritev,
);

/// ECE is not negotiated: EOPNOTSUPP.
#[no_mangle]
pub extern "C" fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    minus_one(libc::EOPNOTSUPP)
}

/// ECE is not negotiated: EOPNOTSUPP.
#[no_mangle]
pub extern "C" fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    minus_one(libc::EOPNOTSUPP)
}

/// Rejects with a reason but no ECE.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { super::rdma_reject(id, data, len) }
}

/// SRQs through the CM: EOPNOTSUPP (create the SRQ with ibv_create_srq).
#[no_mangle]
pub extern "C" fn rdma_create_srq(
    _id: *mut rdma_cm_id,
    _pd: *mut ibv_pd,
    _attr: *mut c_void,
) -> c_int {
    minus_one(libc::EOPNOTSUPP)
}

/// As [`rdma_create_srq`].
#[no_mangle]
pub extern "C" fn rdma_create_srq_ex(_id: *mut rdma_cm_id, _attr: *mut c_void) -> c_int {
    minus_one(libc::EOPNOTSUPP)
}

/// Nothing to destroy (no CM-made SRQ).
#[no_mangle]
pub extern "C" fn rdma_destroy_srq(_id: *mut rdma_cm_id) {}
