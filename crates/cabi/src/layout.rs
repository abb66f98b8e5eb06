//! The offsets and sizes of our C mirrors, for `tests/layout.rs` to compare with what the C
//! compiler makes of rdma-core's headers.

use std::mem::{offset_of, size_of};

use crate::cm_types::*;
use crate::types::*;

/// One checked fact: the C expression (`sizeof(struct x)` or `offsetof(struct x, f)`) and our
/// value.
pub type Fact = (String, usize);

macro_rules! facts {
    ($out:ident; $( $kind:ident $ty:ident { $( $($f:ident).+ $(=> $c:literal)? ),* } )* ) => {
        $(
            $out.push((format!("sizeof({} {})", stringify!($kind), stringify!($ty)), size_of::<$ty>()));
            $(
                let cpath: &str = facts!(@c $($f).+ $(=> $c)?);
                $out.push((
                    format!("offsetof({} {}, {})", stringify!($kind), stringify!($ty), cpath),
                    offset_of!($ty, $($f).+),
                ));
            )*
        )*
    };
    (@c $($f:ident).+ => $c:literal) => { $c };
    (@c $($f:ident).+) => { stringify!($($f).+) };
}

/// Every struct we fill or read, with each field's offset.
pub fn facts() -> Vec<Fact> {
    let mut v = Vec::new();
    facts!(v;
        union ibv_gid { raw }
        struct ibv_device { node_type, transport_type, name, dev_name, dev_path, ibdev_path }
        struct ibv_context_ops { poll_cq, req_notify_cq, post_srq_recv, post_send, post_recv, _compat_async_event }
        struct ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
        struct verbs_context { query_port, create_cq_ex, priv_ => "priv", query_device_ex, create_qp_ex, _unused3 => "get_srq_num", _abi_placeholder3 => "_ABI_placeholder3", sz, context }
        struct ibv_device_attr { fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
            vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd, max_cq,
            max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
            max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
            max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
            max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
            max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt }
        struct ibv_device_attr_ex { orig_attr, comp_mask, phys_port_cnt_ex }
        struct ibv_port_attr { state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz,
            bad_pkey_cntr, qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl,
            subnet_timeout, init_type_reply, active_width, active_speed, phys_state, link_layer,
            flags, port_cap_flags2 }
        struct ibv_pd { context, handle }
        struct ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        struct ibv_comp_channel { context, fd, refcnt }
        struct ibv_cq { context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed, async_events_completed }
        struct ibv_srq { context, srq_context, pd, handle, mutex, cond, events_completed }
        struct ibv_srq_attr { max_wr, max_sge, srq_limit }
        struct ibv_srq_init_attr { srq_context, attr }
        struct ibv_qp { context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex, cond, events_completed }
        struct ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
        struct ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        struct ibv_rx_hash_conf { rx_hash_function, rx_hash_key_len, rx_hash_key, rx_hash_fields_mask }
        struct ibv_qp_init_attr_ex { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all,
            comp_mask, pd, xrcd, create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf,
            source_qpn, send_ops_flags }
        struct ibv_data_buf { addr, length }
        struct ibv_qp_ex { qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp,
            wr_atomic_fetch_add, wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write,
            wr_rdma_write_imm, wr_send, wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr,
            wr_set_xrc_srqn, wr_set_inline_data, wr_set_inline_data_list, wr_set_sge,
            wr_set_sge_list, wr_start, wr_complete, wr_abort, wr_atomic_write }
        struct ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        struct ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
        struct ibv_qp_attr { qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn,
            dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index,
            en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
            port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit }
        struct ibv_sge { addr, length, lkey }
        struct ibv_send_wr { wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data,
            wr.rdma.remote_addr, wr.rdma.rkey, wr.atomic.remote_addr, wr.atomic.compare_add,
            wr.atomic.swap, wr.atomic.rkey, wr.ud.ah, wr.ud.remote_qpn, wr.ud.remote_qkey,
            qp_type => "qp_type.xrc.remote_srqn", _tail => "bind_mw" }
        struct ibv_recv_wr { wr_id, next, sg_list, num_sge }
        struct ibv_wc { wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp,
            wc_flags, pkey_index, slid, sl, dlid_path_bits }
        struct ibv_ah { context, pd, handle }
        struct ibv_async_event { element => "element.qp", event_type }
        struct rdma_event_channel { fd }
        struct rdma_ib_addr { sgid, dgid, pkey }
        struct rdma_addr { src_storage, dst_storage, ibaddr => "addr.ibaddr" }
        struct rdma_route { addr, path_rec, num_paths }
        struct rdma_cm_id { verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel,
            send_cq, recv_cq_channel, recv_cq, srq, pd, qp_type }
        struct rdma_conn_param { private_data, private_data_len, responder_resources, initiator_depth,
            flow_control, retry_count, rnr_retry_count, srq, qp_num }
        struct rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
        struct rdma_cm_event { id, listen_id, event, status, param.conn.private_data,
            param.ud.ah_attr, param.ud.qp_num, param.ud.qkey }
        struct rdma_addrinfo { ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len,
            ai_src_addr, ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route,
            ai_connect_len, ai_connect, ai_next }
    );
    v
}
