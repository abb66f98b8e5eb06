//! `ibv_copy_*_kern`: rdma-core's conversions between the kernel's uverbs / SA structs
//! (`rdma/ib_user_verbs.h`, `rdma/ib_user_sa.h`) and the verbs ones, field by field (the
//! kernel's wider integers narrowed as C's assignment does). Nothing of ours calls them;
//! programs that marshal kernel commands themselves may.
#![allow(non_camel_case_types, missing_docs)]

use crate::types::*;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ib_uverbs_global_route {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reserved: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ib_uverbs_ah_attr {
    pub grh: ib_uverbs_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
    pub reserved: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ib_uverbs_qp_attr {
    pub qp_attr_mask: u32,
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub ah_attr: ib_uverbs_ah_attr,
    pub alt_ah_attr: ib_uverbs_ah_attr,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub reserved: [u8; 5],
}

/// `struct ib_user_path_rec` (big-endian fields stay as they are: both sides hold them so).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ib_user_path_rec {
    pub dgid: [u8; 16],
    pub sgid: [u8; 16],
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: u32,
    pub flow_label: u32,
    pub reversible: u32,
    pub mtu: u32,
    pub pkey: u16,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub numb_path: u8,
    pub sl: u8,
    pub mtu_selector: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct ibv_sa_path_rec` (`infiniband/sa.h`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sa_path_rec {
    pub dgid: ibv_gid,
    pub sgid: ibv_gid,
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: i32,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: i32,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

fn ah_from_kern(d: &mut ibv_ah_attr, s: &ib_uverbs_ah_attr) {
    d.grh.dgid.raw = s.grh.dgid;
    d.grh.flow_label = s.grh.flow_label;
    d.grh.sgid_index = s.grh.sgid_index;
    d.grh.hop_limit = s.grh.hop_limit;
    d.grh.traffic_class = s.grh.traffic_class;
    d.dlid = s.dlid;
    d.sl = s.sl;
    d.src_path_bits = s.src_path_bits;
    d.static_rate = s.static_rate;
    d.is_global = s.is_global;
    d.port_num = s.port_num;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *const ib_uverbs_ah_attr,
) {
    // SAFETY: the caller's structs.
    if let (Some(d), Some(s)) = unsafe { (dst.as_mut(), src.as_ref()) } {
        ah_from_kern(d, s);
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *const ib_uverbs_qp_attr,
) {
    // SAFETY: the caller's structs.
    let (Some(d), Some(s)) = (unsafe { (dst.as_mut(), src.as_ref()) }) else {
        return;
    };
    // qp_state is not copied (as rdma-core).
    d.cur_qp_state = s.cur_qp_state as i32;
    d.path_mtu = s.path_mtu as i32;
    d.path_mig_state = s.path_mig_state as i32;
    d.qkey = s.qkey;
    d.rq_psn = s.rq_psn;
    d.sq_psn = s.sq_psn;
    d.dest_qp_num = s.dest_qp_num;
    d.qp_access_flags = s.qp_access_flags;
    d.cap = ibv_qp_cap {
        max_send_wr: s.max_send_wr,
        max_recv_wr: s.max_recv_wr,
        max_send_sge: s.max_send_sge,
        max_recv_sge: s.max_recv_sge,
        max_inline_data: s.max_inline_data,
    };
    ah_from_kern(&mut d.ah_attr, &s.ah_attr);
    ah_from_kern(&mut d.alt_ah_attr, &s.alt_ah_attr);
    d.pkey_index = s.pkey_index;
    d.alt_pkey_index = s.alt_pkey_index;
    d.en_sqd_async_notify = s.en_sqd_async_notify;
    d.sq_draining = s.sq_draining;
    d.max_rd_atomic = s.max_rd_atomic;
    d.max_dest_rd_atomic = s.max_dest_rd_atomic;
    d.min_rnr_timer = s.min_rnr_timer;
    d.port_num = s.port_num;
    d.timeout = s.timeout;
    d.retry_cnt = s.retry_cnt;
    d.rnr_retry = s.rnr_retry;
    d.alt_port_num = s.alt_port_num;
    d.alt_timeout = s.alt_timeout;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *const ib_user_path_rec,
) {
    // SAFETY: the caller's structs.
    let (Some(d), Some(s)) = (unsafe { (dst.as_mut(), src.as_ref()) }) else {
        return;
    };
    d.dgid.raw = s.dgid;
    d.sgid.raw = s.sgid;
    d.dlid = s.dlid;
    d.slid = s.slid;
    d.raw_traffic = s.raw_traffic as i32;
    d.flow_label = s.flow_label;
    d.hop_limit = s.hop_limit;
    d.traffic_class = s.traffic_class;
    d.reversible = s.reversible as i32;
    d.numb_path = s.numb_path;
    d.pkey = s.pkey;
    d.sl = s.sl;
    d.mtu_selector = s.mtu_selector;
    d.mtu = s.mtu as u8;
    d.rate_selector = s.rate_selector;
    d.rate = s.rate;
    d.packet_life_time = s.packet_life_time;
    d.preference = s.preference;
    d.packet_life_time_selector = s.packet_life_time_selector;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *const ibv_sa_path_rec,
) {
    // SAFETY: the caller's structs.
    let (Some(d), Some(s)) = (unsafe { (dst.as_mut(), src.as_ref()) }) else {
        return;
    };
    d.dgid = s.dgid.raw;
    d.sgid = s.sgid.raw;
    d.dlid = s.dlid;
    d.slid = s.slid;
    d.raw_traffic = s.raw_traffic as u32;
    d.flow_label = s.flow_label;
    d.hop_limit = s.hop_limit;
    d.traffic_class = s.traffic_class;
    d.reversible = s.reversible as u32;
    d.numb_path = s.numb_path;
    d.pkey = s.pkey;
    d.sl = s.sl;
    d.mtu_selector = s.mtu_selector;
    d.mtu = s.mtu as u32;
    d.rate_selector = s.rate_selector;
    d.rate = s.rate;
    d.packet_life_time = s.packet_life_time;
    d.preference = s.preference;
    d.packet_life_time_selector = s.packet_life_time_selector;
}
