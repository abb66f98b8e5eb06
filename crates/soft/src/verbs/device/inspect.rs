//! A device's inspection view: its port, GID table, QPs and counters as JSON.

use rdma_proto::rc::RcStats;
use rdma_proto::verbs::QpState;
use serde_json::{json, Value};

use crate::io::WireStats;
use crate::runtime::{add_rc, RcView, RuntimeStats, UdView};
use crate::verbs::{DeviceShared, PortState};

/// The name `rdma resource` prints for a QP state.
pub(crate) fn state_name(s: QpState) -> &'static str {
    match s {
        QpState::Reset => "RESET",
        QpState::Init => "INIT",
        QpState::Rtr => "RTR",
        QpState::Rts => "RTS",
        QpState::Sqd => "SQD",
        QpState::Sqe => "SQE",
        QpState::Err => "ERR",
    }
}

fn rc_counters(s: &RcStats) -> Value {
    json!({
        "req_packets_sent": s.req_packets_sent,
        "retransmitted": s.retransmitted,
        "ack_timeouts": s.timeouts,
        "tail_probes": s.tail_probes,
        "early_retransmits": s.early_retransmits,
        "spurious_probes": s.spurious_probes,
        "rnr_naks_rcvd": s.rnr_naks_received,
        "credit_waits": s.credit_waits,
        "rnr_waits_cut": s.rnr_waits_cut,
        "credit_updates_sent": s.credit_updates_sent,
        "seq_naks_rcvd": s.seq_naks_received,
        "naks_sent": s.naks_sent,
        "responses_sent": s.responses_sent,
        "duplicate_requests": s.duplicates,
        "dropped": s.dropped,
        "ack_probes": s.ack_probes,
        "pulls_sent": s.pulls_sent,
        "pulls_done": s.pulls_done,
        "pull_failures": s.pull_failures,
    })
}

fn qp(c: RcView<'_>) -> Value {
    let rc = c.rc();
    let a = rc.attr();
    let (local, peer) = match c.primary() {
        Some(p) => (
            Value::from(p.local.to_string()),
            Value::from(p.remote.to_string()),
        ),
        None => (Value::Null, Value::Null),
    };
    let alt = c.alt().map_or(
        Value::Null,
        |p| json!({ "port": p.port, "local": p.local.to_string(), "peer": p.remote.to_string() }),
    );
    json!({
        "qpn": c.qpn(),
        "type": "RC",
        "port": a.port_num.max(1),
        "rx_port": c.rx_port(),
        "state": state_name(rc.state()),
        "local": local,
        "peer": peer,
        "dest_qpn": a.dest_qp_num,
        "sq_psn": a.sq_psn,
        "rq_psn": a.rq_psn,
        "unacked_psn": rc.oldest_unacked_psn(),
        "outstanding": rc.outstanding_psns(),
        "send_queue": rc.send_queue_len(),
        "path_mtu": a.path_mtu.bytes(),
        "path_mig_state": format!("{:?}", a.path_mig_state).to_uppercase(),
        "alt": alt,
        "migrations": rc.migrations(),
        "wire": if c.host_local() { "host-local" } else { "udp" },
        "counters": rc_counters(&rc.stats()),
    })
}

fn ud_qp(c: UdView<'_>) -> Value {
    let s = c.ud().stats();
    let local: Vec<String> = c.listening().iter().map(|a| a.to_string()).collect();
    json!({
        "qpn": c.qpn(),
        "type": "UD",
        "port": c.port(),
        "state": state_name(c.ud().state()),
        "local": if local.is_empty() { Value::Null } else { Value::from(local.join(",")) },
        "qkey": c.ud().qkey(),
        "counters": {
            "qkey_mismatch": s.qkey_mismatch,
            "no_receive": s.no_receive,
            "dropped": s.dropped,
        },
    })
}

fn device_counters(total: &RcStats, rt: &RuntimeStats, w: &WireStats) -> Value {
    let mut v = rc_counters(total);
    let f = |s: &crate::io::FaultStats| {
        s.dropped + s.duplicated + s.corrupted + s.reordered + s.delayed
    };
    if let Value::Object(m) = &mut v {
        let more = json!({
            "sent_pkts": w.sent,
            "rcvd_pkts": w.received,
            "send_errors": w.send_errors,
            "icrc_errors": w.icrc_errors,
            "icrc_recovered_id": w.icrc_recovered_id,
            "icrc_implausible_id": w.icrc_implausible_id,
            "gro_coalesced": w.gro_coalesced,
            "malformed": w.malformed,
            "misdelivered": w.misdelivered,
            "forwarded": w.forwarded,
            "unparsable": rt.unparsable,
            "no_such_qp": rt.no_such_qp,
            "wrong_path": rt.wrong_path,
            "cq_overflows": rt.cq_overflows,
            "window_stalls": rt.window_stalls,
            "acks_held": rt.acks_held,
            "qp_services": rt.qp_services,
            "faults_injected": f(&w.faults_send) + f(&w.faults_recv),
            "faults_dropped": w.faults_send.dropped + w.faults_recv.dropped,
            "faults_duplicated": w.faults_send.duplicated + w.faults_recv.duplicated,
            "faults_corrupted": w.faults_send.corrupted + w.faults_recv.corrupted,
            "faults_reordered": w.faults_send.reordered + w.faults_recv.reordered,
            "faults_delayed": w.faults_send.delayed + w.faults_recv.delayed,
            "local_sent_pkts": w.local.sent,
            "local_rcvd_pkts": w.local.received,
            "local_ring_full": w.local.ring_full,
            "local_blocked": w.local.blocked,
            "local_bells": w.local.bells,
            "local_dead": w.local.dead,
            "local_malformed": w.local.malformed,
        });
        if let Value::Object(more) = more {
            m.extend(more);
        }
    }
    v
}

/// One port: its netdev, state, MTUs and GID table.
fn port_view(d: &DeviceShared, n: u8, rx: u64) -> Option<Value> {
    let port = d.port_attr(n).ok()?;
    let cfg = d.cfg();
    let (netdev, _, up, gids) = cfg.port_parts(n).ok()?;
    let gids: Vec<Value> = gids
        .iter()
        .enumerate()
        .map(|(i, g)| {
            json!({
                "index": i,
                "gid": std::net::Ipv6Addr::from(g.gid()).to_string(),
                "addr": g.to_string(),
            })
        })
        .collect();
    let state = if up {
        PortState::Active
    } else {
        PortState::Down
    };
    Some(json!({
        "port": n,
        "netdev": netdev,
        "state": match state { PortState::Active => "PORT_ACTIVE", PortState::Down => "PORT_DOWN" },
        "state_num": state as u32,
        "max_mtu": port.max_mtu.bytes(),
        "active_mtu": port.active_mtu.bytes(),
        "netdev_mtu": port.netdev_mtu,
        "gid_tbl_len": gids.len(),
        "pkey_tbl_len": port.pkey_tbl_len,
        "link_layer": if port.link_layer_ethernet { "Ethernet" } else { "InfiniBand" },
        "gids": gids,
        "rx_datagrams": rx,
    }))
}

/// The device's view (the `"devices"` provider of every open device).
pub(crate) fn snapshot(d: &DeviceShared) -> Value {
    let attr = d.attr();
    let rt = d.runtime();
    let (live, mut total) = rt.rc_views();
    let mut qps = Vec::new();
    for c in live {
        add_rc(&mut total, &c.rc().stats());
        qps.push(qp(c));
    }
    let mut qkey_mismatch = 0;
    for c in rt.ud_views() {
        qkey_mismatch += c.ud().stats().qkey_mismatch;
        qps.push(ud_qp(c));
    }
    let stats = rt.stats();
    let mut counters = device_counters(&total, &stats, &rt.wire_stats());
    counters["qkey_mismatch"] = Value::from(qkey_mismatch);
    drop(rt);
    let ports: Vec<Value> = (1..=attr.phys_port_cnt)
        .filter_map(|n| port_view(d, n, stats.rx_by_port.get(n as usize).copied().unwrap_or(0)))
        .collect();
    json!({
        "name": d.name,
        "netdev": d.netdev,
        "node_guid": format!("{:016x}", attr.node_guid),
        "sys_image_guid": format!("{:016x}", attr.sys_image_guid),
        "fw_ver": attr.fw_ver,
        "vendor_id": attr.vendor_id,
        "vendor_part_id": attr.vendor_part_id,
        "phys_port_cnt": attr.phys_port_cnt,
        "ports": ports,
        "qps": qps,
        "counters": counters,
    })
}

#[cfg(test)]
mod tests {
    use crate::verbs::{Device, DeviceConfig, PortConfig};
    use rdma_proto::rc::RcStats;

    /// Every probe counter reaches `statistic qp` and the device's totals.
    #[test]
    fn probe_counters_are_shown_and_summed() {
        let one = RcStats {
            tail_probes: 5,
            early_retransmits: 7,
            spurious_probes: 3,
            ..RcStats::default()
        };
        let mut total = one;
        super::add_rc(&mut total, &one);
        let v = super::rc_counters(&total);
        assert_eq!(
            (
                v["tail_probes"].as_u64(),
                v["early_retransmits"].as_u64(),
                v["spurious_probes"].as_u64()
            ),
            (Some(10), Some(14), Some(6)),
            "{v}"
        );
    }

    #[test]
    fn every_port_is_listed() {
        let mut cfg = DeviceConfig::for_netdev("lo").unwrap();
        cfg.gids = vec!["127.0.171.31".parse().unwrap()];
        cfg.more_ports = vec![PortConfig {
            netdev: "lo".into(),
            netdev_mtu: 1500,
            up: true,
            gids: vec!["127.0.171.32".parse().unwrap(), "::1".parse().unwrap()],
        }];
        let dev = Device::open(cfg).unwrap();
        dev.set_port_state(2, false).unwrap();
        let v = super::snapshot(dev.shared());
        assert_eq!(v["phys_port_cnt"], 2);
        let ports = v["ports"].as_array().unwrap();
        assert_eq!(ports.len(), 2);
        let (p1, p2) = (&ports[0], &ports[1]);
        assert_eq!(
            (p1["port"].as_u64(), p2["port"].as_u64()),
            (Some(1), Some(2))
        );
        assert_eq!((&p1["netdev"], &p2["netdev"]), (&"lo".into(), &"lo".into()));
        assert_eq!(
            (&p1["state"], &p2["state"]),
            (&"PORT_ACTIVE".into(), &"PORT_DOWN".into())
        );
        assert_eq!(
            (p1["active_mtu"].as_u64(), p2["active_mtu"].as_u64()),
            (Some(4096), Some(1024))
        );
        assert_eq!(
            (p1["gid_tbl_len"].as_u64(), p2["gid_tbl_len"].as_u64()),
            (Some(1), Some(2))
        );
        assert_eq!(p2["gids"][0]["addr"], "127.0.171.32");
        assert_eq!(p2["gids"][1]["gid"], "::1");
    }
}
