//! The inspection tools' views: `ibv_devices`, `ibv_devinfo` and `rdma-soft` (the
//! `rdma link` / `rdma resource` / `rdma statistic` views) over the snapshots every live
//! process serves ([`rdma_soft::inspect`]). Each function renders what it is given, so the
//! layouts are tested without processes.
//!
//! ```
//! use rdma_tools::inspect::{ibv_devices, Proc};
//! let snap = serde_json::json!({ "pid": 7, "comm": "rping",
//!     "devices": [{ "name": "lo", "node_guid": "0000000000000000", "qps": [] }] });
//! let out = ibv_devices(&[Proc { pid: 7, comm: "rping".into(), snap }]);
//! assert!(out.lines().nth(2).unwrap().starts_with("    lo  "));
//! ```

use std::fmt::Write;

use serde_json::Value;

/// One live process's snapshot.
#[derive(Debug, Clone)]
pub struct Proc {
    /// Its pid.
    pub pid: u32,
    /// Its name (`/proc/<pid>/comm`).
    pub comm: String,
    /// What it answered (see [`rdma_soft::inspect::snapshot`]).
    pub snap: Value,
}

/// Queries every live process; a process that answers wrongly is reported on stderr
/// (`tool: pid N: reason`) and left out.
pub fn processes(tool: &str) -> Vec<Proc> {
    let mut out = Vec::new();
    for a in rdma_soft::inspect::query_all() {
        match a.snapshot {
            Ok(snap) => {
                let comm = snap["comm"].as_str().unwrap_or("").to_owned();
                out.push(Proc {
                    pid: a.pid,
                    comm,
                    snap,
                });
            }
            Err(e) => eprintln!("{tool}: pid {}: {e}", a.pid),
        }
    }
    out
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn n(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// Every device of every process, with the process.
fn devices(procs: &[Proc]) -> impl Iterator<Item = (&Proc, &Value)> {
    procs
        .iter()
        .flat_map(|p| list(&p.snap, "devices").iter().map(move |d| (p, d)))
}

/// `ibv_devices`: one line per device (name and node GUID; a device answered by several
/// queries of the same process is listed once).
pub fn ibv_devices(procs: &[Proc]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "    {:<16}\t   node GUID", "device");
    let _ = writeln!(out, "    {:<16}\t{:>16}", "------", "----------------");
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for (_, d) in devices(procs) {
        let key = (s(d, "name"), s(d, "node_guid"));
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let _ = writeln!(out, "    {:<16}\t{:>16}", key.0, key.1);
    }
    out
}

/// The IB MTU enum value of a byte count (`ibv_mtu`).
fn mtu_enum(bytes: u64) -> u64 {
    match bytes {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        4096 => 5,
        _ => 0,
    }
}

/// A 64-bit GUID in hex as `ibv_devinfo` prints it (`xxxx:xxxx:xxxx:xxxx`).
fn guid(hex: &str) -> String {
    let h = format!("{:0>16}", hex);
    let b = h.as_bytes();
    let part = |i: usize| std::str::from_utf8(&b[i * 4..i * 4 + 4]).unwrap_or("????");
    if b.len() != 16 {
        return hex.to_owned();
    }
    format!("{}:{}:{}:{}", part(0), part(1), part(2), part(3))
}

/// A GID as `ibv_devinfo -v` prints it: eight groups of four hex digits.
fn gid_long(gid: &str) -> String {
    match gid.parse::<std::net::Ipv6Addr>() {
        Ok(a) => a
            .segments()
            .iter()
            .map(|g| format!("{g:04x}"))
            .collect::<Vec<_>>()
            .join(":"),
        Err(_) => gid.to_owned(),
    }
}

/// `ibv_devinfo -l`: the device names.
pub fn ibv_devinfo_list(procs: &[Proc]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for (_, d) in devices(procs) {
        if !names.contains(&s(d, "name")) {
            names.push(s(d, "name"));
        }
    }
    let mut out = format!(
        "{} HCA{} found:\n",
        names.len(),
        if names.len() == 1 { "" } else { "s" }
    );
    for n in names {
        let _ = writeln!(out, "\t{n}");
    }
    out
}

/// `ibv_devinfo [-d dev] [-v]`: one `hca_id` block per device of each process (a soft
/// device is per process; the `pid:` line says whose), with a `port:` section per port (a
/// device group has several, each naming its netdev). `-v` adds the GID tables.
pub fn ibv_devinfo(procs: &[Proc], dev: Option<&str>, verbose: bool) -> String {
    ibv_devinfo_port(procs, dev, None, verbose)
}

/// `ibv_devinfo -i port`: [`ibv_devinfo`] with only port `port` of each device (`None`:
/// every port).
pub fn ibv_devinfo_port(
    procs: &[Proc],
    dev: Option<&str>,
    only: Option<u64>,
    verbose: bool,
) -> String {
    let mut out = String::new();
    for (p, d) in devices(procs).filter(|(_, d)| dev.is_none_or(|n| s(d, "name") == n)) {
        let _ = writeln!(out, "hca_id:\t{}", s(d, "name"));
        let _ = writeln!(out, "\ttransport:\t\t\tInfiniBand (0)");
        let _ = writeln!(out, "\tfw_ver:\t\t\t\t{}", s(d, "fw_ver"));
        let _ = writeln!(out, "\tnode_guid:\t\t\t{}", guid(s(d, "node_guid")));
        let _ = writeln!(
            out,
            "\tsys_image_guid:\t\t\t{}",
            guid(s(d, "sys_image_guid"))
        );
        let _ = writeln!(out, "\tvendor_id:\t\t\t0x{:04x}", n(d, "vendor_id"));
        let _ = writeln!(out, "\tvendor_part_id:\t\t\t{}", n(d, "vendor_part_id"));
        let _ = writeln!(out, "\thw_ver:\t\t\t\t0x0");
        let _ = writeln!(out, "\tphys_port_cnt:\t\t\t{}", n(d, "phys_port_cnt"));
        let _ = writeln!(out, "\tnetdev:\t\t\t\t{}", s(d, "netdev"));
        let _ = writeln!(out, "\tpid:\t\t\t\t{} ({})", p.pid, p.comm);
        let ports = list(d, "ports").iter();
        for port in ports.filter(|p| only.is_none_or(|o| n(p, "port") == o)) {
            let _ = writeln!(out, "\t\tport:\t{}", n(port, "port"));
            if let Some(nd) = port.get("netdev").and_then(Value::as_str) {
                let _ = writeln!(out, "\t\t\tnetdev:\t\t\t{nd}");
            }
            let _ = writeln!(
                out,
                "\t\t\tstate:\t\t\t{} ({})",
                s(port, "state"),
                n(port, "state_num")
            );
            for key in ["max_mtu", "active_mtu"] {
                let b = n(port, key);
                let _ = writeln!(out, "\t\t\t{key}:\t\t{b} ({})", mtu_enum(b));
            }
            let _ = writeln!(out, "\t\t\tsm_lid:\t\t\t0");
            let _ = writeln!(out, "\t\t\tport_lid:\t\t0");
            let _ = writeln!(out, "\t\t\tport_lmc:\t\t0x00");
            let _ = writeln!(out, "\t\t\tlink_layer:\t\t{}", s(port, "link_layer"));
            if verbose {
                let _ = writeln!(out, "\t\t\tgid_tbl_len:\t\t{}", n(port, "gid_tbl_len"));
                let _ = writeln!(out, "\t\t\tpkey_tbl_len:\t\t{}", n(port, "pkey_tbl_len"));
                for g in list(port, "gids") {
                    let _ = writeln!(
                        out,
                        "\t\t\tGID[{:>3}]:\t\t{}, RoCE v2",
                        n(g, "index"),
                        gid_long(s(g, "gid"))
                    );
                }
            }
        }
        out.push('\n');
    }
    out
}

/// A QP's port (1 when the snapshot does not say).
fn port_num(q: &Value) -> u64 {
    q.get("port").and_then(Value::as_u64).unwrap_or(1)
}

/// `rdma-soft link`: `rdma link show`'s line per device (and process).
pub fn link(procs: &[Proc]) -> String {
    let mut out = String::new();
    for (p, d) in devices(procs) {
        for port in list(d, "ports") {
            let active = s(port, "state") == "PORT_ACTIVE";
            let _ = writeln!(
                out,
                "link {}/{} state {} physical_state {} netdev {} pid {} comm {}",
                s(d, "name"),
                n(port, "port"),
                if active { "ACTIVE" } else { "DOWN" },
                if active { "LINK_UP" } else { "DISABLED" },
                // a device group's ports have a netdev each; older snapshots only the device's
                port.get("netdev")
                    .and_then(Value::as_str)
                    .unwrap_or(s(d, "netdev")),
                p.pid,
                p.comm
            );
        }
    }
    out
}

/// `key value` pairs of a counters object, in key order.
fn pairs(v: &Value) -> String {
    let mut out = String::new();
    if let Some(m) = v.as_object() {
        for (k, v) in m {
            let _ = write!(
                out,
                " {k} {}",
                v.as_u64().map_or_else(|| v.to_string(), |n| n.to_string())
            );
        }
    }
    out
}

/// `rdma-soft resource show qp`: `rdma resource show qp`'s line per QP, with its path and
/// PSNs.
pub fn resource_qp(procs: &[Proc]) -> String {
    let mut out = String::new();
    for (p, d) in devices(procs) {
        for q in list(d, "qps") {
            let _ = writeln!(
                out,
                "link {}/{} lqpn {} rqpn {} type {} state {} rq-psn {} sq-psn {} unacked-psn {} src {} dst {} wire {} pid {} comm {}",
                s(d, "name"),
                port_num(q),
                n(q, "qpn"),
                n(q, "dest_qpn"),
                s(q, "type"),
                s(q, "state"),
                n(q, "rq_psn"),
                n(q, "sq_psn"),
                n(q, "unacked_psn"),
                q.get("local").and_then(Value::as_str).unwrap_or("-"),
                q.get("peer").and_then(Value::as_str).unwrap_or("-"),
                q.get("wire").and_then(Value::as_str).unwrap_or("udp"),
                p.pid,
                p.comm
            );
        }
    }
    out
}

/// The fields of `rdma resource show cm_id`, in its order.
const CM_ID_ORDER: [&str; 9] = [
    "link", "cm-idn", "lqpn", "rqpn", "qp-type", "state", "ps", "src-addr", "dst-addr",
];

/// `rdma-soft resource show cm_id`: one line per CM id a process's connection manager
/// registered (its fields as `key value`, in the order it gave them), then its counters
/// (REQs / REPs sent, retransmissions, REJs sent and received with the last reason, DREQs,
/// events queued and not yet acknowledged; for a listener its requests taken and refused).
pub fn resource_cm_id(procs: &[Proc]) -> String {
    let mut out = String::new();
    for p in procs {
        for id in list(&p.snap, "cm_ids") {
            let mut line = String::new();
            if let Some(m) = id.as_object() {
                // iproute2's order first, then whatever else the provider gave
                let known = CM_ID_ORDER.iter().filter_map(|k| m.get_key_value(*k));
                let rest = m.iter().filter(|(k, _)| !CM_ID_ORDER.contains(&k.as_str()));
                let plain = known
                    .chain(rest)
                    .filter(|(_, v)| !v.is_null() && !v.is_object());
                for (k, v) in plain {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    let _ = write!(line, "{}{k} {v}", if line.is_empty() { "" } else { " " });
                }
            }
            let counters = id.get("counters").map(pairs).unwrap_or_default();
            let _ = writeln!(out, "{line}{counters} pid {} comm {}", p.pid, p.comm);
        }
    }
    out
}

/// `rdma-soft resource`: the count of QPs and CM ids per device and process.
pub fn resource_summary(procs: &[Proc]) -> String {
    let mut out = String::new();
    for (i, (p, d)) in devices(procs).enumerate() {
        let _ = writeln!(
            out,
            "{i}: {}: qp {} cm_id {} pid {} comm {}",
            s(d, "name"),
            list(d, "qps").len(),
            list(&p.snap, "cm_ids").len(),
            p.pid,
            p.comm
        );
    }
    out
}

/// `rdma-soft statistic`: `rdma statistic show`'s line per device: its counters (the wire's,
/// the runtime's, and the transports' of all its QPs, destroyed ones included); then a `cm`
/// line per connection-manager context: its listeners and its CM counters (requests taken,
/// refused in all and by cause, MADs malformed / unmatched / duplicate, retransmissions).
pub fn statistic(procs: &[Proc]) -> String {
    let mut out = String::new();
    for (p, d) in devices(procs) {
        let _ = writeln!(
            out,
            "link {}/1 pid {} comm {}{}",
            s(d, "name"),
            p.pid,
            p.comm,
            pairs(&d["counters"])
        );
    }
    for p in procs {
        for c in list(&p.snap, "cm") {
            let ls: Vec<&str> = list(c, "listeners")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let ls = if ls.is_empty() {
                "-".into()
            } else {
                ls.join(",")
            };
            let _ = writeln!(
                out,
                "cm listeners {ls} pid {} comm {}{}",
                p.pid,
                p.comm,
                pairs(&c["counters"])
            );
        }
    }
    out
}

/// `rdma-soft statistic qp`: one line per QP with its transport counters.
pub fn statistic_qp(procs: &[Proc]) -> String {
    let mut out = String::new();
    for (p, d) in devices(procs) {
        for q in list(d, "qps") {
            let _ = writeln!(
                out,
                "link {}/{} lqpn {} state {} pid {} comm {}{}",
                s(d, "name"),
                port_num(q),
                n(q, "qpn"),
                s(q, "state"),
                p.pid,
                p.comm,
                pairs(&q["counters"])
            );
        }
    }
    out
}

/// The snapshots as one JSON array (`-j`; `pretty`: indented).
pub fn json(procs: &[Proc], pretty: bool) -> String {
    let all = Value::Array(procs.iter().map(|p| p.snap.clone()).collect());
    let text = if pretty {
        serde_json::to_string_pretty(&all)
    } else {
        serde_json::to_string(&all)
    };
    text.unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one() -> Vec<Proc> {
        let snap = json!({ "pid": 9, "comm": "t", "devices": [{
            "name": "lo", "netdev": "lo", "node_guid": "0011223344556677",
            "sys_image_guid": "0011223344556677", "fw_ver": "rdma-soft 0.1.0",
            "vendor_id": 0, "vendor_part_id": 0, "phys_port_cnt": 1,
            "ports": [{ "port": 1, "state": "PORT_ACTIVE", "state_num": 4, "max_mtu": 4096,
                "active_mtu": 1024, "link_layer": "Ethernet", "gid_tbl_len": 1,
                "pkey_tbl_len": 1, "gids": [{ "index": 0, "gid": "::ffff:127.0.0.1" }] }],
            "qps": [{ "qpn": 17, "dest_qpn": 18, "type": "RC", "state": "RTS", "rq_psn": 5,
                "sq_psn": 6, "unacked_psn": 6, "local": "127.0.0.1", "peer": "127.0.0.2",
                "counters": { "retransmitted": 3, "ack_timeouts": 1 } }],
            "counters": { "icrc_errors": 2 } }],
            "cm_ids": [{ "state": "CONNECT", "ps": "TCP", "link": "lo/1", "lqpn": null }] });
        vec![Proc {
            pid: 9,
            comm: "t".into(),
            snap,
        }]
    }

    #[test]
    fn cm_counters_are_shown() {
        let snap = json!({ "pid": 9, "comm": "t", "devices": [],
            "cm_ids": [{ "cm-idn": 3, "state": "LISTEN", "ps": "TCP", "src-addr": "127.0.0.1:7",
                "counters": { "requests": 2, "refused": 1, "unacked": 0 } }],
            "cm": [{ "listeners": ["127.0.0.1:7"],
                "counters": { "requests-accepted": 2, "refused-no_listener_for_address": 1 } }] });
        let p = vec![Proc {
            pid: 9,
            comm: "t".into(),
            snap,
        }];
        assert_eq!(
            resource_cm_id(&p),
            "cm-idn 3 state LISTEN ps TCP src-addr 127.0.0.1:7 refused 1 requests 2 unacked 0 pid 9 comm t\n"
        );
        assert_eq!(
            statistic(&p),
            "cm listeners 127.0.0.1:7 pid 9 comm t refused-no_listener_for_address 1 requests-accepted 2\n"
        );
    }

    #[test]
    fn every_port_of_a_group_is_shown() {
        let port = |n: u64, netdev: &str, state: &str, num: u64, ip: &str| {
            json!({ "port": n, "netdev": netdev, "state": state, "state_num": num,
                "max_mtu": 4096, "active_mtu": 1024, "link_layer": "Ethernet",
                "gid_tbl_len": 1, "pkey_tbl_len": 1,
                "gids": [{ "index": 0, "gid": format!("::ffff:{ip}") }] })
        };
        let snap = json!({ "pid": 9, "comm": "t", "devices": [{
            "name": "ha0", "netdev": "h0", "node_guid": "0011223344556677",
            "sys_image_guid": "0011223344556677", "fw_ver": "rdma-soft 0.1.0",
            "vendor_id": 0, "vendor_part_id": 0, "phys_port_cnt": 2,
            "ports": [port(1, "h0", "PORT_ACTIVE", 4, "192.0.2.1"),
                port(2, "h1", "PORT_DOWN", 1, "198.51.100.1")],
            "qps": [{ "qpn": 17, "port": 2, "dest_qpn": 18, "type": "RC", "state": "RTS",
                "rq_psn": 5, "sq_psn": 6, "unacked_psn": 6, "local": "198.51.100.1",
                "peer": "198.51.100.2", "counters": {} }],
            "counters": {} }], "cm_ids": [] });
        let p = vec![Proc {
            pid: 9,
            comm: "t".into(),
            snap,
        }];
        let info = ibv_devinfo(&p, None, true);
        assert!(info.contains("\tphys_port_cnt:\t\t\t2\n"), "{info}");
        let (one, two) = (
            info.find("\t\tport:\t1\n").expect("port 1"),
            info.find("\t\tport:\t2\n").expect("port 2"),
        );
        assert!(one < two, "{info}");
        assert!(info[two..].contains("PORT_DOWN (1)"), "{info}");
        assert!(info[two..].contains("\t\t\tnetdev:\t\t\th1\n"), "{info}");
        let only = ibv_devinfo_port(&p, None, Some(2), false);
        assert!(
            !only.contains("\t\tport:\t1\n") && only.contains("\t\tport:\t2\n"),
            "{only}"
        );
        assert!(
            info[two..].contains("0000:0000:0000:0000:0000:ffff:c633:6401"),
            "{info}"
        );
        assert_eq!(
            link(&p),
            "link ha0/1 state ACTIVE physical_state LINK_UP netdev h0 pid 9 comm t\n\
             link ha0/2 state DOWN physical_state DISABLED netdev h1 pid 9 comm t\n"
        );
        assert!(
            resource_qp(&p).starts_with("link ha0/2 lqpn 17 "),
            "{}",
            resource_qp(&p)
        );
        assert!(statistic_qp(&p).starts_with("link ha0/2 lqpn 17 "));
    }

    #[test]
    fn layouts_carry_the_fields() {
        let p = one();
        let info = ibv_devinfo(&p, None, true);
        assert!(info.starts_with("hca_id:\tlo\n"), "{info}");
        assert!(
            info.contains("\tnode_guid:\t\t\t0011:2233:4455:6677\n"),
            "{info}"
        );
        assert!(
            info.contains("\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"),
            "{info}"
        );
        assert!(info.contains("\t\t\tactive_mtu:\t\t1024 (3)\n"), "{info}");
        assert!(
            info.contains("GID[  0]:\t\t0000:0000:0000:0000:0000:ffff:7f00:0001, RoCE v2"),
            "{info}"
        );
        assert!(ibv_devinfo(&p, Some("other"), false).is_empty());
        assert_eq!(
            resource_qp(&p),
            "link lo/1 lqpn 17 rqpn 18 type RC state RTS rq-psn 5 sq-psn 6 unacked-psn 6 src 127.0.0.1 dst 127.0.0.2 wire udp pid 9 comm t\n"
        );
        assert_eq!(
            statistic_qp(&p),
            "link lo/1 lqpn 17 state RTS pid 9 comm t ack_timeouts 1 retransmitted 3\n"
        );
        assert_eq!(statistic(&p), "link lo/1 pid 9 comm t icrc_errors 2\n");
        assert_eq!(
            resource_cm_id(&p),
            "link lo/1 state CONNECT ps TCP pid 9 comm t\n"
        );
        assert_eq!(resource_summary(&p), "0: lo: qp 1 cm_id 1 pid 9 comm t\n");
        assert_eq!(ibv_devinfo_list(&p), "1 HCA found:\n\tlo\n");
        assert!(link(&p).starts_with("link lo/1 state ACTIVE physical_state LINK_UP netdev lo"));
    }
}
