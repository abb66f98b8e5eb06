//! Another user squats what is ours (issue 34, item 3). Root, network namespaces of their
//! own:
//! - our usual runtime directory, made first by uid 65534 (`/tmp` is shared): rping still
//!   connects on 127.0.0.1 and `rdma-soft` still finds the server, because every process of
//!   ours takes the same fallback. The processes run as uid 54321 (`setpriv`; nobody
//!   else's, so `/tmp/rdma-soft-54321` is this test's alone), without `XDG_RUNTIME_DIR`;
//! - UDP 4791 on 127.0.0.1, held by uid 65534: a wildcard rping server says so and serves
//!   a client on 127.0.0.5.

mod procs;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use procs::{lines_with, spawn, wait_udp_4791};
use rdma_testhosts::{require_root, Topology};

const RPING: &str = env!("CARGO_BIN_EXE_rping");
const RDMA_SOFT: &str = env!("CARGO_BIN_EXE_rdma-soft");
const T: Duration = Duration::from_secs(30);
/// The user the processes run as.
const U: u32 = 54_321;

/// Our fresh directories (`/tmp/rdma-soft-U-*`).
fn fresh_dirs() -> Vec<PathBuf> {
    let prefix = format!("rdma-soft-{U}-");
    std::fs::read_dir("/tmp")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

fn clean(usual: &PathBuf) {
    let _ = std::fs::remove_dir_all(usual);
    for d in fresh_dirs() {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn rping_and_rdma_soft_work_when_another_user_made_the_runtime_directory() {
    if !require_root("rping_and_rdma_soft_work_when_another_user_made_the_runtime_directory") {
        return;
    }
    let usual = PathBuf::from(format!("/tmp/rdma-soft-{U}"));
    clean(&usual);
    let ok = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["mkdir", "-m", "0777"])
        .arg(&usual)
        .status()
        .expect("setpriv (util-linux)")
        .success();
    assert!(ok, "uid 65534 makes {}", usual.display());
    let t = Topology::builder("sqdir")
        .host("a")
        .build()
        .expect("namespace");
    let ns = t.host("a").netns().to_string();
    let as_user = |prog: &str, args: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ns, "setpriv"])
            .arg(format!("--reuid={U}"))
            .arg(format!("--regid={U}"))
            .arg("--clear-groups")
            .arg(prog)
            .args(args)
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("RDMA_SOFT_RUNDIR")
            .env_remove("RDMA_SOFT_INSPECT_DIR")
            .env("HOME", "/");
        c
    };

    let srv = spawn(
        as_user(RPING, &["-s", "-a", "127.0.0.1", "-C", "3", "-v"]),
        "rping server",
    );
    wait_udp_4791("127.0.0.1".parse().unwrap(), Some(&ns));
    // inspection finds the server through the same fallback
    let out = as_user(RDMA_SOFT, &["-j", "resource", "show", "cm_id"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "rdma-soft: {out:?}");
    // `ip netns exec` and `setpriv` exec: the spawned pid is rping's
    let pid = format!("\"pid\":{}", srv.id());
    assert!(text.contains(&pid), "{pid} in {text}");
    assert!(text.contains("127.0.0.1"), "{text}");

    let cli = spawn(
        as_user(RPING, &["-c", "-a", "127.0.0.1", "-C", "3", "-v"]),
        "rping client",
    )
    .wait(T);
    cli.ok("rping client");
    let s = srv.wait(T);
    s.ok("rping server");
    assert_eq!(lines_with(&cli.stdout, "ping data: ").len(), 3, "{cli:#?}");
    assert_eq!(
        lines_with(&s.stdout, "server ping data: ").len(),
        3,
        "{s:#?}"
    );

    // one fresh private directory for all of them; nothing in the squatter's
    let fresh = fresh_dirs();
    assert_eq!(fresh.len(), 1, "{fresh:?}");
    let md = std::fs::metadata(&fresh[0]).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o777), (U, 0o700));
    assert_eq!(std::fs::metadata(&usual).unwrap().uid(), 65534);
    assert_eq!(std::fs::read_dir(&usual).unwrap().count(), 0);
    clean(&usual);
}

const SQUAT_ENV: &str = "RDMA_TOOLS_TEST_SQUAT_ADDR";

/// The squatter: binds `$RDMA_TOOLS_TEST_SQUAT_ADDR` (UDP, no `SO_REUSEPORT`), says so,
/// and holds it until its stdin closes. Run by the test below, as another user.
#[test]
#[ignore = "run by a_wildcard_rping_server_serves_the_addresses_left"]
fn squatter_child() {
    let addr = std::env::var(SQUAT_ENV).expect("run by the test");
    let _s = std::net::UdpSocket::bind(&addr).expect("bind");
    println!("bound");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

#[test]
fn a_wildcard_rping_server_serves_the_addresses_left() {
    if !require_root("a_wildcard_rping_server_serves_the_addresses_left") {
        return;
    }
    let t = Topology::builder("sqrp")
        .host("a")
        .addr("a", "lo", "127.0.0.5/32")
        .build()
        .expect("namespace");
    let a = t.host("a");
    let mut squatter = Command::new("ip")
        .args(["netns", "exec", a.netns(), "setpriv"])
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "squatter_child", "--nocapture"])
        .env(SQUAT_ENV, "127.0.0.1:4791")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux)");
    let mut out = BufReader::new(squatter.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 && !line.contains("bound") {
        line.clear();
    }
    assert!(line.contains("bound"), "the squatter holds 127.0.0.1:4791");

    let mut s = a.command(RPING);
    s.args(["-s", "-a", "0.0.0.0", "-C", "2", "-v"]);
    let srv = spawn(s, "rping server");
    wait_udp_4791("127.0.0.5".parse().unwrap(), Some(a.netns()));
    let mut c = a.command(RPING);
    c.args(["-c", "-a", "127.0.0.5", "-C", "2", "-v"]);
    let cli = spawn(c, "rping client").wait(T);
    let s = srv.wait(T);
    drop(squatter.stdin.take());
    squatter.wait().unwrap();
    cli.ok("rping client");
    s.ok("rping server");
    assert_eq!(lines_with(&cli.stdout, "ping data: ").len(), 2, "{cli:#?}");
    assert!(
        s.stderr
            .contains("unhandled event: RDMA_CM_EVENT_ADDR_CHANGE, ignoring"),
        "{s:#?}"
    );
}
