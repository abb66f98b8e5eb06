//! The rest of libibverbs' small calls: strings, fork, async events, rates.
//!
//! Each `extern "C"` function here is rdma-core's function of the same name, with its
//! documented behaviour (its man page); only what differs is commented.
#![allow(missing_docs)]

use std::ffi::CStr;

use libc::{c_char, c_int, c_void};

use crate::device::ctx;
use crate::types::*;
use crate::util::*;

fn cs(s: &'static CStr) -> *const c_char {
    s.as_ptr()
}

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    const S: [&CStr; 22] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
    ];
    cs(S.get(status as usize).copied().unwrap_or(c"unknown"))
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(ev: c_int) -> *const c_char {
    const S: [&CStr; 22] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
        c"unknown",
        c"unknown",
    ];
    cs(S.get(ev as usize).copied().unwrap_or(c"unknown"))
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: c_int) -> *const c_char {
    cs(match t {
        1 => c"InfiniBand channel adapter",
        2 => c"InfiniBand switch",
        3 => c"InfiniBand router",
        4 => c"iWARP NIC",
        5 => c"usNIC",
        6 => c"usNIC UDP",
        7 => c"unspecified",
        _ => c"unknown",
    })
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: c_int) -> *const c_char {
    cs(match s {
        0 => c"PORT_NOP",
        1 => c"PORT_DOWN",
        2 => c"PORT_INIT",
        3 => c"PORT_ARMED",
        4 => c"PORT_ACTIVE",
        5 => c"PORT_ACTIVE_DEFER",
        _ => c"invalid state",
    })
}

/// Nothing to do: our memory is never pinned by a kernel (always "initialized").
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2 // IBV_FORK_UNNEEDED
}

#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    c: *mut ibv_context,
    ev: *mut ibv_async_event,
) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(ctx), Some(out)) = (unsafe { ctx(c) }, unsafe { ev.as_mut() }) else {
        return minus_one(libc::EINVAL);
    };
    let fd = ctx.v.context.async_fd;
    let got = if fd < 0 {
        ctx.dev.soft.wait_async_event(None)
    } else if is_nonblocking(fd) {
        Ok(ctx.dev.soft.poll_async_event())
    } else {
        // Waits on the application's fd, so that a signal interrupts it as it interrupts
        // rdma-core's read (util::wait_readable_or_signal).
        loop {
            if let Some(e) = ctx.dev.soft.poll_async_event() {
                break Ok(Some(e));
            }
            if let Err(e) = crate::util::wait_readable_or_signal(fd) {
                return minus_one(e);
            }
        }
    };
    match got {
        Ok(Some(e)) => {
            out.event_type = e.event_type() as c_int;
            // Port events carry the port; QP events the QP number (our QPs are not mapped
            // back to their ibv_qp yet: see docs/CABI.md).
            out.element = e.port().map_or_else(
                || e.qpn().unwrap_or(0) as usize as *mut c_void,
                |p| p as usize as *mut c_void,
            );
            0
        }
        Ok(None) => minus_one(libc::EAGAIN),
        Err(e) => minus_one(soft_errno(&e)),
    }
}

#[no_mangle]
pub extern "C" fn ibv_ack_async_event(_ev: *mut ibv_async_event) {}

/// `enum ibv_rate` values with their link rate in Mb/s (`IBV_RATE_2_5_GBPS` = 2 … the
/// InfiniBand data rates, FDR/EDR/HDR/NDR ones at their signalling rate, as rdma-core).
const RATES: [(c_int, c_int); 23] = [
    (2, 2500),
    (5, 5000),
    (3, 10000),
    (6, 20000),
    (4, 30000),
    (7, 40000),
    (8, 60000),
    (9, 80000),
    (10, 120000),
    (11, 14062),
    (12, 56250),
    (13, 112500),
    (14, 168750),
    (15, 25781),
    (16, 103125),
    (17, 206250),
    (18, 309375),
    (19, 28125),
    (20, 53125),
    (21, 425000),
    (22, 637500),
    (23, 850000),
    (24, 1275000),
];

/// The rates rdma-core gives a multiple of 2.5 Gb/s (28 and 50 Gb/s rounded: 11, 20).
const MULTS: [(c_int, c_int); 15] = [
    (2, 1),
    (5, 2),
    (3, 4),
    (6, 8),
    (4, 12),
    (7, 16),
    (8, 24),
    (9, 32),
    (10, 48),
    (19, 11),
    (20, 20),
    (21, 160),
    (22, 240),
    (23, 320),
    (24, 480),
];

/// -1 for a rate that is no multiple of 2.5 Gb/s.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    MULTS.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// `IBV_RATE_MAX` (0) for an unknown multiple.
#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    MULTS.iter().find(|r| r.1 == mult).map_or(0, |r| r.0)
}

/// -1 for an unknown rate.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// `IBV_RATE_MAX` (0) for a figure that is no rate's (the table above).
#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mbps).map_or(0, |r| r.0)
}

/// Our devices have no sysfs directory: every read fails with ENOENT (callers such as
/// `ibv_devinfo` then leave the field out).
#[no_mangle]
pub extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    minus_one(libc::ENOENT)
}

/// The sysfs root rdma-core reports (`SYSFS_PATH` or `/sys`).
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}
