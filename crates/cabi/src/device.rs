//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`, the queries.
//!
//! The devices are the connection manager's (one process-wide [`rdmacm::cm::Cma`]): a soft
//! device per netdev with an address, named after it, as our `ibv_devices` shows them. Each
//! `ibv_device` lives for the rest of the process (its pointer stays valid and the same).
//!
//! Each `extern "C"` function here is rdma-core's function of the same name, with its
//! documented behaviour (its man page); only what differs is commented.
#![allow(missing_docs)]

use std::mem::{offset_of, size_of, zeroed};
use std::ptr::null_mut;
use std::sync::{Mutex, OnceLock};

use libc::{c_char, c_int, c_void};
use rdma_soft::verbs::{Device, PortState};

use crate::types::*;
use crate::util::*;

/// One device: the C struct first, then ours.
#[repr(C)]
pub struct Dev {
    pub c: ibv_device,
    pub soft: Device,
    /// The context the CM's ids give as `id->verbs` (one per device, made on first use).
    pub cm_ctx: OnceLock<usize>,
}

/// One open context: `verbs_context` (ending with `ibv_context`) first.
#[repr(C)]
pub struct Ctx {
    pub v: verbs_context,
    pub dev: &'static Dev,
    /// `async_fd`: the application's view of the device's async event fd.
    pub async_fd: Option<std::os::fd::OwnedFd>,
}

/// The process-wide connection manager the devices come from.
pub fn cma() -> Result<rdmacm::cm::Cma, rdmacm::Error> {
    crate::config::init();
    let c = rdmacm::cm::Cma::global_with(crate::config::cma_config)?;
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a plain function, run once by exit().
    AT_EXIT.call_once(|| unsafe {
        EXIT_PID.store(std::process::id(), std::sync::atomic::Ordering::Relaxed);
        libc::atexit(end_connections_at_exit);
    });
    Ok(c)
}

/// The process that registered [`end_connections_at_exit`]: a child forked later inherits
/// the registration but not the threads (or the connections) of the context.
static EXIT_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// At exit, what Linux does when the process's rdma_cm file closes: the connections of ids
/// the program did not destroy end (qperf 0.4.11's server exits leaving its connected id,
/// whose DREP its client waits for).
/// Run in a thread of its own: the exiting thread's thread-locals are gone by now.
extern "C" fn end_connections_at_exit() {
    if EXIT_PID.load(std::sync::atomic::Ordering::Relaxed) != std::process::id() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        let t = std::thread::Builder::new()
            .name("rdmacm-exit".into())
            .spawn(|| {
                if let Ok(c) = rdmacm::cm::Cma::global_with(crate::config::cma_config) {
                    c.end_connections();
                }
            });
        if let Ok(t) = t {
            let _ = t.join();
        }
    });
}

fn registry() -> &'static Mutex<Vec<&'static Dev>> {
    static R: OnceLock<Mutex<Vec<&'static Dev>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Vec::new()))
}

/// The `Dev` of a soft device, made (and kept) on first sight.
pub fn dev_for(soft: &Device) -> &'static Dev {
    let mut r = registry().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = r.iter().find(|d| d.soft.name() == soft.name()) {
        return d;
    }
    // SAFETY: ibv_device is plain data; all-zero is a valid value.
    let mut c: ibv_device = unsafe { zeroed() };
    c.node_type = 1; // IBV_NODE_CA
    c.transport_type = 0; // IBV_TRANSPORT_IB (RoCE reports IB)
    copy_cstr(&mut c.name, soft.name());
    copy_cstr(&mut c.dev_name, &format!("uverbs-soft-{}", soft.name()));
    copy_cstr(
        &mut c.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs-soft-{}", soft.name()),
    );
    copy_cstr(
        &mut c.ibdev_path,
        &format!("/sys/class/infiniband/{}", soft.name()),
    );
    let d: &'static Dev = Box::leak(Box::new(Dev {
        c,
        soft: soft.clone(),
        cm_ctx: OnceLock::new(),
    }));
    r.push(d);
    d
}

/// The context behind an `ibv_context` pointer of ours.
///
/// # Safety
/// `p` is NULL or an `ibv_context` this library made.
pub unsafe fn ctx<'a>(p: *mut ibv_context) -> Option<&'a Ctx> {
    if p.is_null() {
        return None;
    }
    let off = offset_of!(Ctx, v) + offset_of!(verbs_context, context);
    // SAFETY: our contexts are embedded in a Ctx at that offset.
    Some(unsafe { &*(p.cast::<u8>().sub(off).cast::<Ctx>()) })
}

/// Opens a new context on `dev`.
pub fn open(dev: &'static Dev) -> *mut ibv_context {
    // SAFETY: every field of verbs_context is a pointer, integer or mutex: zero is valid
    // (a zeroed pthread mutex is PTHREAD_MUTEX_INITIALIZER in glibc).
    let mut v: verbs_context = unsafe { zeroed() };
    v.query_port = Some(query_port_ex);
    v.query_device_ex = Some(query_device_ex_op);
    v.create_qp_ex = Some(crate::qp_ex::create_qp_ex);
    v.sz = size_of::<verbs_context>();
    v.context.device = &dev.c as *const ibv_device as *mut ibv_device;
    v.context.ops = crate::ops::context_ops();
    v.context.cmd_fd = -1;
    use std::os::fd::AsRawFd;
    let async_fd = poll_proxy(dev.soft.async_event_fd().as_raw_fd()).ok();
    v.context.async_fd = async_fd.as_ref().map_or(-1, |f| f.as_raw_fd());
    v.context.num_comp_vectors = 1;
    v.context.abi_compat = usize::MAX as *mut c_void; // __VERBS_ABI_IS_EXTENDED
    let ctx = boxed(Ctx { v, dev, async_fd });
    // SAFETY: just made.
    unsafe { &mut (*ctx).v.context }
}

/// The CM's shared context of `dev` (the same pointer for every id on it).
pub fn cm_context(dev: &'static Dev) -> *mut ibv_context {
    *dev.cm_ctx.get_or_init(|| open(dev) as usize) as *mut ibv_context
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    let list = match cma().and_then(|c| c.device_list()) {
        Ok(l) => l,
        Err(e) => return null_err(cm_errno(&e)),
    };
    let mut v: Vec<*mut ibv_device> = list
        .iter()
        .map(|d| &dev_for(d).c as *const ibv_device as *mut ibv_device)
        .collect();
    if !num.is_null() {
        // SAFETY: the caller's int.
        unsafe { *num = v.len() as c_int };
    }
    v.push(null_mut());
    // Freed by ibv_free_device_list (length found by the NULL).
    Box::into_raw(v.into_boxed_slice()).cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: a NULL-terminated list made by ibv_get_device_list.
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: as made: a boxed slice of n + 1 pointers.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    if dev.is_null() {
        return null_err(libc::EINVAL);
    }
    // SAFETY: one of our devices.
    unsafe { (*dev).name.as_ptr() }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    if dev.is_null() {
        set_errno(libc::EINVAL);
        return 0;
    }
    // SAFETY: our devices are the first field of a Dev.
    let d = unsafe { &*dev.cast::<Dev>() };
    d.soft.query_device().node_guid.to_be()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    if dev.is_null() {
        return -1;
    }
    // SAFETY: as above.
    let d = unsafe { &*dev.cast::<Dev>() };
    let r = registry().lock().unwrap_or_else(|e| e.into_inner());
    r.iter()
        .position(|x| std::ptr::eq(*x, d))
        .map_or(-1, |i| i as c_int)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    if dev.is_null() {
        return null_err(libc::EINVAL);
    }
    // SAFETY: our devices are the first field of a leaked, 'static Dev.
    open(unsafe { &*dev.cast::<Dev>() })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(c: *mut ibv_context) -> c_int {
    // SAFETY: the caller's context.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return libc::EINVAL;
    };
    if ctx.dev.cm_ctx.get().is_some_and(|p| *p == c as usize) {
        return 0; // the CM's shared context stays
    }
    // SAFETY: made by open() as a boxed Ctx.
    drop(unsafe { unbox(ctx as *const Ctx as *mut Ctx) });
    0
}

fn fill_device_attr(dev: &Device, a: &mut ibv_device_attr) {
    let d = dev.query_device();
    // SAFETY: plain data.
    *a = unsafe { zeroed() };
    copy_cstr(&mut a.fw_ver, &d.fw_ver);
    a.node_guid = d.node_guid.to_be();
    a.sys_image_guid = d.sys_image_guid.to_be();
    a.max_mr_size = d.max_mr_size;
    a.page_size_cap = d.page_size_cap;
    a.vendor_id = d.vendor_id;
    a.vendor_part_id = d.vendor_part_id;
    a.max_qp = d.max_qp as c_int;
    a.max_qp_wr = d.max_qp_wr as c_int;
    // IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SRQ_RESIZE? no: RNR NAK gen, port active event,
    // system image guid
    a.device_cap_flags = (1 << 12) | (1 << 11) | (1 << 10);
    a.max_sge = d.max_sge as c_int;
    a.max_sge_rd = d.max_sge_rd as c_int;
    a.max_cq = d.max_cq as c_int;
    a.max_cqe = d.max_cqe as c_int;
    a.max_mr = d.max_mr as c_int;
    a.max_pd = d.max_pd as c_int;
    a.max_qp_rd_atom = d.max_qp_rd_atom as c_int;
    a.max_res_rd_atom = (d.max_qp_rd_atom as u64 * d.max_qp as u64).min(i32::MAX as u64) as c_int;
    a.max_qp_init_rd_atom = d.max_qp_init_rd_atom as c_int;
    a.atomic_cap = if d.atomic_hca { 1 } else { 0 }; // IBV_ATOMIC_HCA
    a.max_ah = d.max_qp as c_int;
    a.max_srq = d.max_srq as c_int;
    a.max_srq_wr = d.max_srq_wr as c_int;
    a.max_srq_sge = d.max_srq_sge as c_int;
    a.max_pkeys = d.max_pkeys;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = d.phys_port_cnt;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    c: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    // SAFETY: the caller's pointers.
    let (Some(ctx), Some(a)) = (unsafe { ctx(c) }, unsafe { attr.as_mut() }) else {
        return libc::EINVAL;
    };
    fill_device_attr(&ctx.dev.soft, a);
    0
}

unsafe extern "C" fn query_device_ex_op(
    c: *mut ibv_context,
    _input: *const c_void,
    attr: *mut ibv_device_attr_ex,
    size: usize,
) -> c_int {
    // SAFETY: the caller's pointers.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() || size < size_of::<ibv_device_attr>() {
        return libc::EINVAL;
    }
    // SAFETY: `size` bytes at attr are the caller's; we write at most that many.
    unsafe { std::ptr::write_bytes(attr.cast::<u8>(), 0, size) };
    let mut full: ibv_device_attr_ex = unsafe { zeroed() };
    fill_device_attr(&ctx.dev.soft, &mut full.orig_attr);
    full.phys_port_cnt_ex = u32::from(full.orig_attr.phys_port_cnt);
    let n = size.min(size_of::<ibv_device_attr_ex>());
    // SAFETY: n bytes fit both.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&full as *const ibv_device_attr_ex).cast::<u8>(),
            attr.cast::<u8>(),
            n,
        )
    };
    0
}

fn fill_port(dev: &Device, port: u8, a: &mut ibv_port_attr) -> c_int {
    let p = match dev.query_port(port) {
        Ok(p) => p,
        Err(e) => return soft_errno(&e),
    };
    a.state = match p.state {
        PortState::Down => 1,
        PortState::Active => 4,
    };
    a.max_mtu = p.max_mtu as c_int;
    a.active_mtu = p.active_mtu as c_int;
    a.gid_tbl_len = p.gid_tbl_len as c_int;
    a.port_cap_flags = 1 << 16; // IBV_PORT_CM_SUP
    a.max_msg_sz = p.max_msg_sz;
    a.bad_pkey_cntr = 0;
    a.qkey_viol_cntr = 0;
    a.pkey_tbl_len = p.pkey_tbl_len;
    a.lid = 0;
    a.sm_lid = 0;
    a.lmc = 0;
    a.max_vl_num = 1;
    a.sm_sl = 0;
    a.subnet_timeout = 0;
    a.init_type_reply = 0;
    a.active_width = 2; // 4X
    a.active_speed = 32; // EDR
    a.phys_state = if p.state == PortState::Active { 5 } else { 3 }; // LinkUp / Disabled
    a.link_layer = if p.link_layer_ethernet { 2 } else { 1 };
    0
}

unsafe extern "C" fn query_port_ex(
    c: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    // SAFETY: the caller's pointers.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() || len < size_of::<ibv_port_attr>() {
        return libc::EINVAL;
    }
    // SAFETY: checked above.
    let a = unsafe { &mut *attr };
    // SAFETY: plain data.
    *a = unsafe { zeroed() };
    fill_port(&ctx.dev.soft, port, a)
}

/// The exported `ibv_query_port` (the old, shorter struct: `flags` and `port_cap_flags2`
/// are not written).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    c: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: the caller's pointers.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: plain data.
    let mut a: ibv_port_attr = unsafe { zeroed() };
    let r = fill_port(&ctx.dev.soft, port, &mut a);
    let n = offset_of!(ibv_port_attr, flags);
    // SAFETY: the compat struct holds the fields before `flags`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&a as *const ibv_port_attr).cast::<u8>(),
            attr.cast::<u8>(),
            n,
        )
    };
    r
}

fn gid_at(dev: &Device, port: u8, index: usize) -> Option<[u8; 16]> {
    dev.gids_on(port).ok()?.get(index).map(|g| g.gid())
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    // SAFETY: the caller's pointers.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return -1;
    };
    if gid.is_null() || index < 0 {
        return -1;
    }
    // rdma-core: an empty entry in range reads as zeros; beyond the table, -1.
    let len = ctx
        .dev
        .soft
        .query_port(port)
        .map(|p| p.gid_tbl_len as usize)
        .unwrap_or(0);
    if index as usize >= len {
        return -1;
    }
    let raw = gid_at(&ctx.dev.soft, port, index as usize).unwrap_or([0; 16]);
    // SAFETY: checked non-NULL.
    unsafe { (*gid).raw = raw };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: the caller's pointers.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return -1;
    };
    if pkey.is_null() || ctx.dev.soft.query_port(port).is_err() || index != 0 {
        return -1;
    }
    // SAFETY: checked non-NULL.
    unsafe { *pkey = 0xffff_u16.to_be() };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(c: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    // SAFETY: the caller's pointer.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return -1;
    };
    if ctx.dev.soft.query_port(port).is_err() || u16::from_be(pkey) & 0x7fff != 0x7fff {
        return -1;
    }
    0
}

/// `struct ibv_gid_entry`.
#[repr(C)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

fn gid_entry(ctx: &Ctx, port: u8, index: usize, raw: [u8; 16]) -> ibv_gid_entry {
    let ifindex = ctx
        .dev
        .soft
        .port_netdev(port)
        .ok()
        .and_then(|n| std::ffi::CString::new(n).ok())
        // SAFETY: a NUL-terminated name.
        .map_or(0, |n| unsafe { libc::if_nametoindex(n.as_ptr()) });
    ibv_gid_entry {
        gid: ibv_gid { raw },
        gid_index: index as u32,
        port_num: u32::from(port),
        gid_type: 2, // IBV_GID_TYPE_ROCE_V2
        ndev_ifindex: ifindex,
    }
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    _flags: u32,
    entry_size: usize,
) -> c_int {
    // SAFETY: the caller's pointers.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return libc::EINVAL;
    };
    if entry.is_null() || entry_size < size_of::<ibv_gid_entry>() || port > 255 {
        return libc::EINVAL;
    }
    match gid_at(&ctx.dev.soft, port as u8, index as usize) {
        Some(raw) => {
            // SAFETY: checked.
            unsafe { entry.write(gid_entry(ctx, port as u8, index as usize, raw)) };
            0
        }
        None if ctx
            .dev
            .soft
            .query_port(port as u8)
            .is_ok_and(|p| (index as usize) < p.gid_tbl_len as usize) =>
        {
            libc::ENODATA
        }
        None => libc::EINVAL,
    }
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    c: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max: usize,
    _flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: the caller's pointers.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return -(libc::EINVAL as isize);
    };
    if entries.is_null() || entry_size < size_of::<ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    let mut n = 0usize;
    for port in 1..=ctx.dev.soft.port_count() {
        for (i, g) in ctx
            .dev
            .soft
            .gids_on(port)
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            if n == max {
                return -(libc::EINVAL as isize);
            }
            // SAFETY: entry n of max, entry_size apart.
            unsafe {
                entries
                    .cast::<u8>()
                    .add(n * entry_size)
                    .cast::<ibv_gid_entry>()
                    .write_unaligned(gid_entry(ctx, port, i, g.gid()))
            };
            n += 1;
        }
    }
    n as isize
}

/// rdma-core's private `ibv_query_gid_type` (`IBVERBS_PRIVATE_34`, used by Debian's
/// `ibv_devinfo`): every GID of ours is RoCE v2 (`IBV_GID_TYPE_SYSFS_ROCE_V2` = 1).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    c: *mut ibv_context,
    port: u8,
    index: libc::c_uint,
    ty: *mut c_int,
) -> c_int {
    // SAFETY: the caller's pointers.
    let Some(ctx) = (unsafe { ctx(c) }) else {
        return libc::EINVAL;
    };
    if ty.is_null() || gid_at(&ctx.dev.soft, port, index as usize).is_none() {
        return libc::EINVAL;
    }
    // SAFETY: checked non-NULL.
    unsafe { *ty = 1 };
    0
}
