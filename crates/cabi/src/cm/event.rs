//! `rdma_get_cm_event` / `rdma_ack_cm_event` and the event strings.
//!
//! Each `extern "C"` function here is rdma-core's function of the same name, with its
//! documented behaviour (its man page); only what differs is commented.
#![allow(missing_docs)]

use std::ptr::null_mut;

use libc::{c_char, c_int};
use rdmacm::cm::{Event, EventType};

use super::{id_by_num, new_id, refresh, Id};
use crate::cm_types::*;
use crate::types::*;
use crate::util::*;

/// An event handed to C: the C struct first, then the event (acknowledged when dropped) and
/// its private data.
#[repr(C)]
pub struct Ev {
    pub c: rdma_cm_event,
    pub ev: Option<Event>,
    pub pdata: Vec<u8>,
}

/// rdma-core's number of an event type.
pub fn type_num(k: EventType) -> c_int {
    match k {
        EventType::AddrResolved => 0,
        EventType::AddrError => 1,
        EventType::RouteResolved => 2,
        EventType::RouteError => 3,
        EventType::ConnectRequest => 4,
        EventType::ConnectResponse => 5,
        EventType::ConnectError => 6,
        EventType::Unreachable => 7,
        EventType::Rejected => 8,
        EventType::Established => 9,
        EventType::Disconnected => 10,
        EventType::DeviceRemoval => 11,
        EventType::MulticastJoin => 12,
        EventType::MulticastError => 13,
        EventType::AddrChange => 14,
        EventType::TimewaitExit => 15,
    }
}

/// Builds the C event for `ev` (a CONNECT_REQUEST gets its new id here).
pub fn to_c(mut ev: Event) -> Result<*mut Ev, c_int> {
    let kind = ev.kind();
    let listen = ev.listen_id().and_then(id_by_num);
    let id: *mut Id = if kind == EventType::ConnectRequest {
        let Some(l) = listen else {
            return Err(libc::EINVAL);
        };
        let Some(new) = ev.take_id() else {
            return Err(libc::EINVAL);
        };
        // SAFETY: a live listener of ours.
        let lc = unsafe { &(*l).c };
        new_id(new, lc.channel, lc.context, lc.ps, None)
    } else {
        id_by_num(ev.id_num()).ok_or(libc::EINVAL)?
    };
    // SAFETY: a live id of ours.
    refresh(unsafe { &mut *id });
    let p = ev.param().clone();
    let mut e = Box::new(Ev {
        // SAFETY: plain data.
        c: unsafe { std::mem::zeroed() },
        ev: None,
        pdata: p.private_data.clone(),
    });
    e.c.id = id.cast();
    e.c.listen_id = listen.map_or(null_mut(), |l| l.cast());
    e.c.event = type_num(kind);
    e.c.status = ev.status();
    let pd = if e.pdata.is_empty() {
        std::ptr::null()
    } else {
        e.pdata.as_ptr().cast()
    };
    let pdlen = e.pdata.len().min(255) as u8;
    if let (Some(ud), Some(mc)) = (ev.ud(), ev.mcast()) {
        // A join's event: the context as private data (librdmacm's), the group's handle.
        e.c.param.ud = rdma_ud_param {
            private_data: mc.context as *const libc::c_void,
            private_data_len: 0,
            ah_attr: crate::objects::ah_attr_of(&mc.ah_attr, mc.port_num),
            qp_num: ud.qp_num,
            qkey: ud.qkey,
        };
    } else if let Some(ud) = ev.ud() {
        // SAFETY: a live id of ours.
        let i = unsafe { &*id };
        let port = i.id.port_num().unwrap_or(1);
        let sgid =
            i.id.local_addr()
                .and_then(|l| i.id.device().and_then(|d| d.gid_index_on(port, l.ip())));
        e.c.param.ud = rdma_ud_param {
            private_data: pd,
            private_data_len: pdlen,
            ah_attr: ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: ibv_gid {
                        raw: super::addr::gid_of(&ud.peer),
                    },
                    flow_label: 0,
                    sgid_index: sgid.unwrap_or(0),
                    hop_limit: 64,
                    traffic_class: 0,
                },
                is_global: 1,
                port_num: port,
                ..Default::default()
            },
            qp_num: ud.qp_num,
            qkey: ud.qkey,
        };
    } else {
        e.c.param.conn = rdma_conn_param {
            private_data: pd,
            private_data_len: pdlen,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: u8::from(p.flow_control),
            retry_count: 0,
            rnr_retry_count: p.rnr_retry_count,
            srq: u8::from(p.srq),
            qp_num: p.qp_num,
        };
    }
    e.ev = Some(ev);
    Ok(Box::into_raw(e))
}

impl super::Chan {
    /// What a caller holds of this channel ([`super::ChanRef`]).
    pub fn hold(&self) -> super::ChanRef {
        super::ChanRef {
            ch: self.ch.clone(),
            fd: self.fd.clone(),
            closed: self.closed.clone(),
        }
    }

    /// [`super::ChanRef::wait_event`] on this channel.
    pub fn wait_event(&self) -> Result<Event, c_int> {
        self.hold().wait_event()
    }
}

impl super::ChanRef {
    /// The next event, blocking on the channel's fd as rdma-core's `read` of it does: a
    /// signal handler without `SA_RESTART` ends the wait with `EINTR`, a wait restarted
    /// after the channel's destruction fails with `EBADF` ([`wait_readable_while_open`]).
    /// Synchronous ids wait here too, as rdma-core's do.
    pub fn wait_event(&self) -> Result<Event, c_int> {
        use std::os::fd::AsRawFd;
        loop {
            match self.ch.get_event_timeout(std::time::Duration::ZERO) {
                Ok(Some(ev)) => return Ok(ev),
                Ok(None) => wait_readable_while_open(self.fd.as_raw_fd(), &|| {
                    !self.closed.load(std::sync::atomic::Ordering::Acquire)
                })?,
                Err(e) => return Err(cm_errno(&e)),
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_event,
) -> c_int {
    // SAFETY: the caller's channel.
    let Some(c) = (unsafe { super::chan_ref(ch) }) else {
        return minus_one(libc::EINVAL);
    };
    if out.is_null() {
        return minus_one(libc::EINVAL);
    }
    let nonblock = {
        use std::os::fd::AsRawFd;
        is_nonblocking(c.fd.as_raw_fd())
    };
    loop {
        let got = if nonblock {
            c.ch.try_get_event().map_err(|e| cm_errno(&e))
        } else {
            c.wait_event()
        };
        let ev = match got {
            Ok(ev) => ev,
            Err(e) => return minus_one(e),
        };
        match to_c(ev) {
            Ok(e) => {
                // SAFETY: the caller's out-pointer.
                unsafe { *out = e.cast() };
                return 0;
            }
            // An event of an id destroyed meanwhile: acknowledged (dropped), skipped.
            Err(_) => continue,
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(ev: *mut rdma_cm_event) -> c_int {
    if ev.is_null() {
        return minus_one(libc::EINVAL);
    }
    // SAFETY: made by to_c; dropping acknowledges.
    drop(unsafe { Box::from_raw(ev.cast::<Ev>()) });
    0
}

#[no_mangle]
pub extern "C" fn rdma_event_str(ev: c_int) -> *const c_char {
    let s: &'static std::ffi::CStr = match ev {
        0 => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        1 => c"RDMA_CM_EVENT_ADDR_ERROR",
        2 => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        3 => c"RDMA_CM_EVENT_ROUTE_ERROR",
        4 => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        5 => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        6 => c"RDMA_CM_EVENT_CONNECT_ERROR",
        7 => c"RDMA_CM_EVENT_UNREACHABLE",
        8 => c"RDMA_CM_EVENT_REJECTED",
        9 => c"RDMA_CM_EVENT_ESTABLISHED",
        10 => c"RDMA_CM_EVENT_DISCONNECTED",
        11 => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        12 => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        13 => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        14 => c"RDMA_CM_EVENT_ADDR_CHANGE",
        15 => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    let list = match crate::device::cma().and_then(|c| c.device_list()) {
        Ok(l) => l,
        Err(e) => return null_err(cm_errno(&e)),
    };
    let mut v: Vec<*mut ibv_context> = list
        .iter()
        .map(|d| crate::device::cm_context(crate::device::dev_for(d)))
        .collect();
    if !num.is_null() {
        // SAFETY: the caller's int.
        unsafe { *num = v.len() as c_int };
    }
    v.push(null_mut());
    Box::into_raw(v.into_boxed_slice()).cast()
}

#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: NULL-terminated, made by rdma_get_devices.
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: as made.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
}
