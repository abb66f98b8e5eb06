//! What we do not support, failing as rdma-core does for a device without it (docs/CABI.md,
//! "Unsupported"), and the provider-side symbols Debian's provider libraries (libmlx5,
//! libefa, which perftest links) need to load: a provider never registers with us, so those
//! are never reached through our devices.
#![allow(missing_docs)]

use libc::{c_int, c_void};

use crate::types::*;
use crate::util::*;

/// dma-buf memory regions: no dma-buf exporter reaches our device; NULL with
/// `errno = EOPNOTSUPP`, as rdma-core for a device without them (libfabric links it).
#[no_mangle]
pub extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    null_err(libc::EOPNOTSUPP)
}

/// No kernel neighbour resolution through verbs: EOPNOTSUPP.
#[no_mangle]
pub extern "C" fn ibv_resolve_eth_l2_from_gid(
    _c: *mut ibv_context,
    _attr: *mut ibv_ah_attr,
    _eth_mac: *mut u8,
    _vid: *mut u16,
) -> c_int {
    libc::EOPNOTSUPP
}

macro_rules! int_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            libc::EOPNOTSUPP
        }
    )*};
}

macro_rules! ptr_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            null_err(libc::EOPNOTSUPP)
        }
    )*};
}

macro_rules! void_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() {}
    )*};
}

// Provider interface (IBVERBS_PRIVATE_34): the kernel command helpers fail as without a
// kernel device.
int_stubs!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
    ibv_cmd_create_cq,
    ibv_cmd_query_device_ex,
    ibv_cmd_alloc_async_fd,
    ibv_cmd_create_qp,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_req_notify_cq,
);
ptr_stubs!(_verbs_init_and_alloc_context, verbs_open_device);
void_stubs!(
    __verbs_log,
    verbs_register_driver_34,
    verbs_set_ops,
    verbs_uninit_context,
    verbs_init_cq,
);

/// rdma-core's flag for providers; never read here.
#[no_mangle]
pub static mut verbs_allow_disassociate_destroy: bool = false;

/// The provider-side ioctl helper: the attribute count it is given (never reached).
#[no_mangle]
pub extern "C" fn __ioctl_final_num_attrs(
    num_attrs: libc::c_uint,
    _link: *mut c_void,
) -> libc::c_uint {
    num_attrs
}

/// Our devices have no sysfs directory: `-1`, `errno = ENOENT` (as `ibv_read_sysfs_file`).
#[no_mangle]
pub extern "C" fn ibv_read_ibdev_sysfs_file(
    _buf: *mut libc::c_char,
    _size: usize,
    _dev: *mut c_void,
    _fnfmt: *const libc::c_char,
) -> c_int {
    minus_one(libc::ENOENT)
}

/// Enhanced connection establishment: our device has none; `EOPNOTSUPP` (as rdma-core's
/// default op), errno too.
#[no_mangle]
pub extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// As [`ibv_query_ece`].
#[no_mangle]
pub extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// Importing a context from a uverbs command fd: our contexts have none (`cmd_fd` is -1).
/// An fd that is not a character device is `EINVAL`; any other is no device of ours,
/// `ENODEV`.
#[no_mangle]
pub extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    // SAFETY: fstat into a local.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(cmd_fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFCHR {
        return null_err(libc::EINVAL);
    }
    null_err(libc::ENODEV)
}

// Sharing PDs, MRs and DM between processes through a uverbs fd: NULL with
// errno = EOPNOTSUPP (rdma-core's default ops); unimport does nothing.
ptr_stubs!(ibv_import_pd, ibv_import_mr, ibv_import_dm);
void_stubs!(ibv_unimport_pd, ibv_unimport_mr, ibv_unimport_dm);

/// The pre-2018 provider registration (`ibv_register_driver@IBVERBS_1.1`, compat only): no
/// provider registers with us; the old call is ignored with a warning, as rdma-core ignores
/// providers too old for it.
#[no_mangle]
pub unsafe extern "C" fn __cabi_ibv_register_driver_1_1(
    name: *const libc::c_char,
    _init: *mut c_void,
) {
    let name = if name.is_null() {
        String::new()
    } else {
        // SAFETY: the caller's C string.
        unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    tracing::warn!(driver = %name, "ibv_register_driver: old provider interface, not loaded");
}

// Bound to the compat (non-default) version only, as rdma-core exports it.
std::arch::global_asm!(".symver __cabi_ibv_register_driver_1_1, ibv_register_driver@IBVERBS_1.1");
