//! The fast path behind `ibv_context_ops`: post send / recv, poll, notify. No allocation
//! and no lock of ours per work request: each call converts on the stack and calls straight
//! into rdma-soft.
//!
//! Each `extern "C"` function here is rdma-core's function of the same name, with its
//! documented behaviour (its man page); only what differs is commented.
#![allow(missing_docs)]

use std::mem::zeroed;

use libc::c_int;
use rdma_proto::verbs::SgList;
use rdma_soft::verbs::{Completion, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest};

use crate::cq::Cq;
use crate::objects::{obj, Ah, Srq};
use crate::qp::Qp;
use crate::types::*;
use crate::util::soft_errno;

/// The ops table every context gets.
pub fn context_ops() -> ibv_context_ops {
    // SAFETY: all slots are nullable function pointers.
    let mut o: ibv_context_ops = unsafe { zeroed() };
    o.poll_cq = Some(poll_cq);
    o.req_notify_cq = Some(req_notify_cq);
    o.post_send = Some(post_send);
    o.post_recv = Some(post_recv);
    o.post_srq_recv = Some(post_srq_recv);
    o
}

/// # Safety
/// `list` holds `n` SGEs (or `n <= 0`).
unsafe fn sges(list: *const ibv_sge, n: c_int) -> Result<SgList, c_int> {
    let mut sg = SgList::new();
    if n <= 0 {
        return Ok(sg);
    }
    if list.is_null() {
        return Err(libc::EINVAL);
    }
    for i in 0..n as usize {
        // SAFETY: the caller's array of n.
        let s = unsafe { *list.add(i) };
        sg.push(Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .map_err(|_| libc::EINVAL)?;
    }
    Ok(sg)
}

/// Our send WR from the C one.
///
/// # Safety
/// `w` is a valid `ibv_send_wr` whose `sg_list` and (UD) `ah` are valid.
pub unsafe fn send_wr(w: &ibv_send_wr, ud: bool) -> Result<SendWr, c_int> {
    // SAFETY: the WR's union as its opcode says.
    let (rdma, atomic) = unsafe { (w.wr.rdma, w.wr.atomic) };
    let imm = u32::from_be(w.imm_data);
    let op = match w.opcode {
        0 => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        1 => SendOp::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm,
        },
        2 => SendOp::Send,
        3 => SendOp::SendWithImm { imm },
        4 => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        5 => SendOp::AtomicCmpAndSwp {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        6 => SendOp::AtomicFetchAndAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        9 => SendOp::SendWithInv {
            invalidate_rkey: w.imm_data,
        },
        7 | 8 | 10 | 15 => return Err(libc::EOPNOTSUPP), // LOCAL_INV, BIND_MW, TSO, ATOMIC_WRITE
        _ => return Err(libc::EINVAL),
    };
    let mut wr = SendWr::new(w.wr_id, op);
    wr.flags = SendFlags::from_bits_truncate(w.send_flags & 0xf);
    // SAFETY: forwarded.
    wr.sg = unsafe { sges(w.sg_list, w.num_sge) }?;
    if ud {
        // SAFETY: the UD part of the union; the AH is the caller's.
        let u = unsafe { w.wr.ud };
        let ah = unsafe { obj::<_, Ah>(u.ah) }.ok_or(libc::EINVAL)?;
        wr.ud = Some(UdDest {
            ah: ah.ah.handle(),
            remote_qpn: u.remote_qpn,
            remote_qkey: u.remote_qkey,
        });
    }
    Ok(wr)
}

/// Posts one converted WR, gathering inline data on the stack.
pub fn post_one(q: &Qp, wr: &SendWr) -> Result<(), c_int> {
    if wr.flags.contains(SendFlags::INLINE) {
        let mut buf = [0u8; 1024];
        let mut n = 0usize;
        for s in wr.sg.as_slice() {
            let len = s.length as usize;
            if n + len > buf.len() {
                return Err(libc::EINVAL);
            }
            if len > 0 {
                // SAFETY: inline data is read from the application's address, no lkey check
                // (as verbs does), at post time.
                unsafe {
                    std::ptr::copy_nonoverlapping(s.addr as *const u8, buf[n..].as_mut_ptr(), len)
                };
            }
            n += len;
        }
        let mut w = *wr;
        w.flags = w.flags.difference(SendFlags::INLINE);
        return q
            .qp
            .post_send_inline(&w, &buf[..n])
            .map_err(|e| soft_errno(&e));
    }
    q.qp.post_send(wr).map_err(|e| soft_errno(&e))
}

unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller's QP.
    let Some(q) = (unsafe { obj::<_, Qp>(qp) }) else {
        return libc::EINVAL;
    };
    // SAFETY: a NULL-terminated list of the caller's WRs.
    while let Some(w) = unsafe { wr.as_ref() } {
        // SAFETY: forwarded.
        let r = unsafe { send_wr(w, q.ud) }.and_then(|s| post_one(q, &s));
        if let Err(e) = r {
            if !bad.is_null() {
                // SAFETY: the caller's out-pointer.
                unsafe { *bad = wr };
            }
            return e;
        }
        wr = w.next;
    }
    0
}

unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's QP.
    let Some(q) = (unsafe { obj::<_, Qp>(qp) }) else {
        return libc::EINVAL;
    };
    // SAFETY: a NULL-terminated list.
    while let Some(w) = unsafe { wr.as_ref() } {
        // SAFETY: the WR's SGE list.
        let r = unsafe { sges(w.sg_list, w.num_sge) }.and_then(|sg| {
            q.qp.post_recv(&RecvWr { wr_id: w.wr_id, sg })
                .map_err(|e| soft_errno(&e))
        });
        if let Err(e) = r {
            if !bad.is_null() {
                // SAFETY: the caller's out-pointer.
                unsafe { *bad = wr };
            }
            return e;
        }
        wr = w.next;
    }
    0
}

unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's SRQ.
    let Some(s) = (unsafe { obj::<_, Srq>(srq) }) else {
        return libc::EINVAL;
    };
    // SAFETY: a NULL-terminated list.
    while let Some(w) = unsafe { wr.as_ref() } {
        // SAFETY: the WR's SGE list.
        let r = unsafe { sges(w.sg_list, w.num_sge) }.and_then(|sg| {
            s.srq
                .post_recv(RecvWr { wr_id: w.wr_id, sg })
                .map_err(|e| soft_errno(&e))
        });
        if let Err(e) = r {
            if !bad.is_null() {
                // SAFETY: the caller's out-pointer.
                unsafe { *bad = wr };
            }
            return e;
        }
        wr = w.next;
    }
    0
}

/// The C completion from ours.
pub fn wc_of(c: &Completion) -> ibv_wc {
    let flags = c.wc_flags.bits();
    ibv_wc {
        wr_id: c.wr_id,
        status: c.status as c_int,
        opcode: c.opcode as c_int,
        vendor_err: 0,
        byte_len: c.byte_len,
        imm_data: if flags & 8 != 0 {
            c.invalidated_rkey
        } else {
            c.imm_data.to_be()
        },
        qp_num: c.qp_num,
        src_qp: c.src_qp,
        wc_flags: flags,
        pkey_index: c.pkey_index,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's CQ.
    let Some(q) = (unsafe { obj::<_, Cq>(cq) }) else {
        return -1;
    };
    if n < 0 || (n > 0 && wc.is_null()) {
        return -1;
    }
    let mut got = 0;
    while got < n {
        let Some(c) = q.cq.poll_one() else { break };
        // SAFETY: the caller's array of n.
        unsafe { wc.add(got as usize).write(wc_of(&c)) };
        got += 1;
    }
    got
}

unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited: c_int) -> c_int {
    // SAFETY: the caller's CQ.
    let Some(q) = (unsafe { obj::<_, Cq>(cq) }) else {
        return libc::EINVAL;
    };
    match q.cq.req_notify(solicited != 0) {
        Ok(()) => 0,
        Err(e) => soft_errno(&e),
    }
}
