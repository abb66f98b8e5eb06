//! Debian's perftest with `-R` (its connections through rdma_cm) over our libraries: the
//! seven tests on 127.0.0.1 and between two namespace hosts (root), the client started once
//! the server's rdma_cm listener is there.
//!
//! Ignored: perftest 4.5 (4.5+0.17) races itself. After a handshake over its first
//! connection the server creates, binds and listens on a second id while the client
//! resolves and connects at once; a client faster than the server's `rdma_listen` gets REJ
//! 8 (no listener: as Linux answers), and perftest's retry then reuses the ids and channel
//! it has just destroyed (`EINVAL` here). Measured on the loaded 2-core machine, release
//! build: about one run in four loses (docs/CABI.md, "Not yet"). Run by hand with
//! `cargo test -p rdma-cabi --test perftest_cm -- --ignored`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::lib_dir;

const LIMIT: Duration = Duration::from_secs(60);
const TESTS: [&str; 7] = [
    "ib_send_lat",
    "ib_send_bw",
    "ib_write_lat",
    "ib_write_bw",
    "ib_read_lat",
    "ib_read_bw",
    "ib_atomic_lat",
];

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// Whether our `rdma-soft` tool (in `host`'s namespace) shows an rdma_cm listener on `port`.
fn listening(host: Option<&rdma_testhosts::Host>, port: u16) -> bool {
    let tool = profile_dir().join("rdma-soft");
    assert!(tool.exists(), "cargo build -p rdma-tools --bin rdma-soft");
    let mut c = match host {
        Some(h) => h.command(tool.to_str().unwrap()),
        None => Command::new(&tool),
    };
    let o = c.args(["resource", "show", "cm_id"]).output().unwrap();
    let want = format!(":{port} ");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .any(|l| l.contains("state LISTEN") && l.contains(&want))
}

fn run(mut c: Command) -> (Child, PathBuf) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("rdma-cabi-pcm-{}-{n}.out", std::process::id()));
    let f = std::fs::File::create(&out).unwrap();
    let child = c
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    (child, out)
}

fn finish((mut child, out): (Child, PathBuf)) -> (bool, String) {
    let end = Instant::now() + LIMIT;
    while child.try_wait().unwrap().is_none() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let ok = child.wait().unwrap().success();
    let t = String::from_utf8_lossy(&std::fs::read(&out).unwrap_or_default()).into_owned();
    let _ = std::fs::remove_file(&out);
    (ok, t)
}

/// perftest's `test -R` on `port`: server on `server` (device `dev`), client to `addr`.
fn perftest(
    test: &str,
    port: u16,
    hosts: [Option<&rdma_testhosts::Host>; 2],
    dev: &str,
    addr: &str,
) {
    let path = format!("/usr/bin/{test}");
    assert!(
        Path::new(&path).exists(),
        "apt-get install perftest (CI does)"
    );
    let p = port.to_string();
    let args = ["-d", dev, "-x", "0", "-p", &p, "-R", "-n", "200"];
    let cmd = |h: Option<&rdma_testhosts::Host>, extra: &[&str]| {
        let mut c = match h {
            Some(h) => h.command(&path),
            None => Command::new(&path),
        };
        c.args(args).args(extra).env("LD_LIBRARY_PATH", lib_dir());
        c
    };
    let mut s = run(cmd(hosts[0], &[]));
    let end = Instant::now() + LIMIT;
    while !listening(hosts[0], port) {
        if Instant::now() > end {
            let _ = s.0.kill();
            let _ = s.0.wait();
            panic!("{test}: the server never listened");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (cok, ct) = finish(run(cmd(hosts[1], &[addr])));
    let (sok, st) = finish(s);
    assert!(cok && sok, "{test}: client:\n{ct}\nserver:\n{st}");
    // the results line: the message size, then the iterations asked for
    assert!(
        ct.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 2 && f[0].parse::<u32>().is_ok() && f[1] == "200"
        }),
        "{test}: no results line in\n{ct}"
    );
}

#[test]
#[ignore = "perftest 4.5 races itself with -R (module docs); run with --ignored"]
fn perftest_rdma_cm_on_loopback() {
    for (k, test) in TESTS.iter().enumerate() {
        perftest(test, 17630 + k as u16, [None, None], "lo", "127.0.0.1");
    }
}

#[test]
#[ignore = "perftest 4.5 races itself with -R (module docs); run with --ignored"]
fn perftest_rdma_cm_between_two_namespace_hosts() {
    if !rdma_testhosts::require_root("perftest_rdma_cm_between_two_namespace_hosts") {
        return;
    }
    let topo = rdma_testhosts::topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (&topo.hosts()[0], &topo.hosts()[1]);
    for (k, test) in TESTS.iter().enumerate() {
        perftest(
            test,
            17640 + k as u16,
            [Some(b), Some(a)],
            "eth0",
            "192.0.2.2",
        );
    }
}
