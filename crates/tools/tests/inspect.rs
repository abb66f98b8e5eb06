//! The inspection tools against a live process: a child process (this test binary, re-run
//! as `child_with_a_connected_pair`) opens two devices on lo with a connected RC pair,
//! sends under `RDMA_SOFT_FAULTS` loss and then waits; `rdma-soft`, `ibv_devinfo` and
//! `ibv_devices` must show its QPs, their state and counters that moved. A socket left by
//! a dead process must be ignored and removed.
//!
//! Addresses: 127.0.150.1 and 127.0.150.2 (nobody else's block).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdma_soft::io::WireAddr;
use rdma_soft::verbs::{
    AccessFlags, Device, DeviceConfig, QpInitAttr, RecvWr, SendOp, SendWr, WcStatus,
};

const CHILD_ENV: &str = "RDMA_INSPECT_TEST_CHILD";
/// The hang guard: a stop, not a speed target.
const HANG: Duration = Duration::from_secs(120);
const A: &str = "127.0.150.1";
const B: &str = "127.0.150.2";

fn dev(ip: &str) -> Device {
    let mut cfg = DeviceConfig::for_netdev("lo").unwrap();
    cfg.gids = vec![ip.parse().unwrap()];
    Device::open(cfg).unwrap()
}

/// The child: a connected pair, messages under loss (the faults come from the environment
/// the parent set), then `READY <qpn a> <qpn b>` on stdout and a wait for stdin's end.
#[test]
#[ignore = "run by inspection_tools_show_a_live_process"]
fn child_with_a_connected_pair() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let (da, db) = (dev(A), dev(B));
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let (ca, cb) = (
        da.create_cq(256, None).unwrap(),
        db.create_cq(256, None).unwrap(),
    );
    let qa = pa.create_qp(&QpInitAttr::rc(&ca, &ca)).unwrap();
    let mut init = QpInitAttr::rc(&cb, &cb);
    init.cap.max_recv_wr = 256;
    let qb = pb.create_qp(&init).unwrap();
    let gid = |ip: &str| ip.parse::<WireAddr>().unwrap().gid();
    qa.connect(qb.qpn(), 0x200, 0x100, gid(B)).unwrap();
    qb.connect(qa.qpn(), 0x100, 0x200, gid(A)).unwrap();
    let ma = pa
        .register(vec![7u8; 4096], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let mb = pb
        .register(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)
        .unwrap();
    const N: u64 = 64;
    for i in 0..N {
        qb.post_recv(&RecvWr::new(i).with_sge(mb.sge(0, 4096).unwrap()))
            .unwrap();
    }
    let end = Instant::now() + HANG;
    let (mut sent, mut got) = (0u64, 0u64);
    for i in 0..N {
        let wr = SendWr::new(i, SendOp::Send)
            .with_sge(ma.sge(0, 4096).unwrap())
            .signaled();
        qa.post_send(&wr).unwrap();
        while sent <= i || (i + 1 == N && got < N) {
            assert!(
                Instant::now() < end,
                "hang guard: {sent} sent, {got} received"
            );
            if let Some(c) = ca.poll_one() {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                sent += 1;
            }
            if let Some(c) = cb.poll_one() {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                got += 1;
            }
        }
    }
    println!("READY {} {}", qa.qpn(), qb.qpn());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// This test binary re-run as `child_with_a_connected_pair`, serving inspection in `dir`,
/// its stdin and stdout piped.
fn child(dir: &Path) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "child_with_a_connected_pair",
        "--ignored",
        "--nocapture",
    ])
    .env(CHILD_ENV, "1")
    .env(rdma_soft::inspect::DIR_ENV, dir)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped());
    c
}

fn tool(name: &str, dir: &Path, args: &[&str]) -> String {
    let exe = match name {
        "rdma-soft" => env!("CARGO_BIN_EXE_rdma-soft"),
        "ibv_devinfo" => env!("CARGO_BIN_EXE_ibv_devinfo"),
        _ => env!("CARGO_BIN_EXE_ibv_devices"),
    };
    let out = Command::new(exe)
        .args(args)
        .env(rdma_soft::inspect::DIR_ENV, dir)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{name} {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn inspection_tools_show_a_live_process() {
    let dir = std::env::temp_dir().join(format!("rdma-inspect-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = child(&dir)
        .env("RDMA_SOFT_FAULTS", "loss=0.1,seed=5")
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut ready = String::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for l in lines.by_ref() {
        let l = l.unwrap();
        if l.starts_with("READY") {
            ready = l;
            break;
        }
    }
    // stale sockets, made once the child serves: one of a pid that cannot exist, one of
    // this (live) process, which serves none: bound, then the listener gone (refused)
    let stale = [
        dir.join("4194305.sock"),
        dir.join(format!("{}.sock", std::process::id())),
    ];
    for s in &stale {
        drop(std::os::unix::net::UnixListener::bind(s).unwrap());
        assert!(s.exists());
    }
    let check = || -> Result<(), String> {
        let q: Vec<u32> = ready
            .split_whitespace()
            .skip(1)
            .filter_map(|w| w.parse().ok())
            .collect();
        if q.len() != 2 {
            return Err(format!("child did not get ready: {ready:?}"));
        }
        let json: serde_json::Value =
            serde_json::from_str(&tool("rdma-soft", &dir, &["-j"])).map_err(|e| e.to_string())?;
        let procs = json.as_array().ok_or("not an array")?;
        assert_eq!(procs.len(), 1, "only the child answers: {json}");
        for s in &stale {
            assert!(!s.exists(), "{s:?} (stale) was removed by the query");
        }
        assert_eq!(procs[0]["pid"], pid);
        let devs = procs[0]["devices"].as_array().unwrap();
        assert_eq!(devs.len(), 2, "{json}");
        let qps: Vec<&serde_json::Value> = devs
            .iter()
            .flat_map(|d| d["qps"].as_array().unwrap())
            .collect();
        let qa = qps.iter().find(|v| v["qpn"] == q[0]).expect("QP a listed");
        assert_eq!(qa["state"], "RTS");
        assert_eq!(qa["dest_qpn"], q[1]);
        assert_eq!(qa["peer"], B);
        let retrans = qa["counters"]["retransmitted"].as_u64().unwrap();
        assert!(retrans > 0, "loss made a's QP retransmit: {qa}");
        let dev_a = devs.iter().find(|d| d["qps"][0]["qpn"] == q[0]).unwrap();
        assert!(
            dev_a["counters"]["faults_dropped"].as_u64().unwrap() > 0,
            "{dev_a}"
        );
        assert!(dev_a["counters"]["retransmitted"].as_u64().unwrap() >= retrans);

        let res = tool("rdma-soft", &dir, &["resource", "show", "qp"]);
        let line = res
            .lines()
            .find(|l| l.contains(&format!("lqpn {} ", q[0])))
            .ok_or(format!("QP a in {res}"))?;
        assert!(
            line.contains(&format!("rqpn {} type RC state RTS", q[1])),
            "{line}"
        );
        assert!(
            // hand-connected QPs (and a fault spec) stay on UDP
            line.contains(&format!("src {A} dst {B} wire udp pid {pid}")),
            "{line}"
        );
        let stat = tool("rdma-soft", &dir, &["statistic", "qp", "show"]);
        let line = stat
            .lines()
            .find(|l| l.contains(&format!("lqpn {} ", q[0])))
            .ok_or(format!("QP a in {stat}"))?;
        assert!(
            line.contains(&format!(" retransmitted {retrans}")),
            "{line}"
        );
        let info = tool("ibv_devinfo", &dir, &["-v"]);
        assert_eq!(info.matches("hca_id:\tlo\n").count(), 2, "{info}");
        assert!(info.contains("PORT_ACTIVE (4)"), "{info}");
        assert!(
            info.contains("0000:0000:0000:0000:0000:ffff:7f00:9601, RoCE v2"),
            "{info}"
        );
        let one = tool("ibv_devinfo", &dir, &["-i", "1"]);
        assert_eq!(one.matches("\t\tport:\t1\n").count(), 2, "{one}");
        assert!(one.contains("\t\t\tnetdev:\t\t\tlo\n"), "{one}");
        let none = tool("ibv_devinfo", &dir, &["-i", "2"]);
        assert!(!none.contains("\t\tport:\t"), "{none}");
        let list = tool("ibv_devices", &dir, &[]);
        assert_eq!(
            list.lines().filter(|l| l.starts_with("    lo ")).count(),
            1,
            "{list}"
        );
        Ok(())
    };
    let r = check();
    // end the child: stdin closes, it returns; its socket goes with its devices
    drop(child.stdin.take());
    let status = child.wait().unwrap();
    r.unwrap();
    assert!(status.success(), "child: {status}");
    assert!(
        !dir.join(format!("{pid}.sock")).exists(),
        "the child removed its socket on drop"
    );
    let after: serde_json::Value = serde_json::from_str(&tool("rdma-soft", &dir, &["-j"])).unwrap();
    assert_eq!(after, serde_json::json!([]));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `RDMA_SOFT_INSPECT=off` (any off value of docs/CONFIG.md): the same child serves no
/// socket, and the tools find no process.
#[test]
fn inspection_off_serves_no_socket() {
    let dir = std::env::temp_dir().join(format!("rdma-inspect-off-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = child(&dir)
        .env("RDMA_SOFT_INSPECT", "off")
        .env_remove("RDMA_SOFT_FAULTS")
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("READY"));
    // devices open and QPs connected: a socket would be there by now
    let served = dir.join(format!("{pid}.sock")).exists();
    let listed: serde_json::Value =
        serde_json::from_str(&tool("rdma-soft", &dir, &["-j"])).unwrap();
    drop(child.stdin.take());
    let status = child.wait().unwrap();
    assert!(ready.is_some(), "the child got ready");
    assert!(status.success(), "child: {status}");
    assert!(!served, "no inspection socket with RDMA_SOFT_INSPECT=off");
    assert_eq!(listed, serde_json::json!([]));
    let _ = std::fs::remove_dir_all(&dir);
}
