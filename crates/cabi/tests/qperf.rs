//! Debian's qperf (0.4.11) over our libraries, its connections through rdma_cm (`-cm1`; over
//! its own TCP exchange it sends no GID, which RoCE needs: docs/CABI.md): `rc_lat`, `rc_bw`,
//! `rc_rdma_write_bw` and `rc_rdma_read_lat`, one second each, on 127.0.0.1 and between two
//! namespace hosts (root).
//!
//! qperf 0.4.11's server tells its client the rdma_cm port between its `rdma_bind_addr` and
//! its `rdma_listen` (fixed upstream after 0.4.11, qperf commit 118a571 "Fix rdmacm race"), so
//! a listen slower than the client's resolve and connect gets the client REJ 8: our
//! `rdma_bind_addr` on a wildcard opens what the listen needs (`CmId::prepare_listen`).
//! Its server also exits without destroying its connected id (it destroys the listener):
//! our `atexit` ends such connections as Linux does when the process's rdma_cm file closes
//! (the DREP its client's `rdma_disconnect` waits for; `Cma::end_connections`).
//!
//! Each test runs in a client process of its own: a client that has its devices open
//! already (the second test of one `qperf` run) resolves and connects faster than the fresh
//! server process qperf forks per test listens. That race (port announced before
//! `rdma_listen`, lost whenever the server process is not scheduled for a few ms between the
//! two) gets the client REJ 8, as Linux answers; our CM resends a REQ refused for want of a
//! listener for `RDMACM_NO_LISTENER_RETRY_MS` (default 250 ms), which the listener then
//! takes, so the test runs between namespace hosts too (6 runs in 8 passed before that).

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::{bin, finish, finish_or_kill, lib_dir, start, tcp_listening, LIMIT};

/// The tests, each with the figure its output gives.
const TESTS: [(&str, &str); 4] = [
    ("rc_lat", "latency"),
    ("rc_bw", "bw"),
    ("rc_rdma_write_bw", "bw"),
    ("rc_rdma_read_lat", "latency"),
];

/// Checks that `test` printed its name and a positive `figure` right after it.
fn check(test: &str, figure: &str, out: &str) {
    let mut lines = out.lines().skip_while(|l| l.trim() != format!("{test}:"));
    assert!(lines.next().is_some(), "no {test} in\n{out}");
    let line = lines.next().unwrap_or_default();
    let value = line
        .trim()
        .strip_prefix(figure)
        .and_then(|r| r.trim().strip_prefix('='))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        value.is_some_and(|v| v > 0.0),
        "{test}: no {figure} in '{line}':\n{out}"
    );
}

/// Runs qperf's server (`server`, in a process group of its own: it forks a child per
/// test), waits for its TCP `port` (in the server's namespace), then one client per test
/// (`client()`, a fresh process each, as a user runs them) against `addr`, checking each.
fn run(mut server: Command, client: impl Fn() -> Command, addr: &str, port: u16) {
    // One pair at a time: each busy-polls both CPUs of a small machine.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    use std::os::unix::process::CommandExt;
    server.process_group(0);
    let s = start(server);
    let group = s.pid() as i32;
    let stop = |s| {
        // SAFETY: signals the server's own process group (its forked children too).
        unsafe { libc::kill(-group, libc::SIGKILL) };
        finish_or_kill(s, true).1
    };
    let end = Instant::now() + LIMIT;
    while !tcp_listening(s.pid(), port) {
        if Instant::now() > end {
            panic!("qperf's server never listened:\n{}", stop(s));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let p = port.to_string();
    for (test, figure) in TESTS {
        let mut c = client();
        c.args(["-lp", &p, addr, "-cm1", "-t", "1", "-m", "4096", test]);
        let (cs, ct) = finish(start(c));
        if !cs.success() {
            panic!("{test}: client ({cs:?}):\n{ct}\nserver:\n{}", stop(s));
        }
        check(test, figure, &ct);
    }
    stop(s);
}

fn qperf(port: u16) -> Command {
    let mut c = Command::new(bin("qperf"));
    c.args(["-lp", &port.to_string()])
        .env("LD_LIBRARY_PATH", lib_dir());
    c
}

#[test]
fn qperf_rc_tests_over_rdma_cm_on_loopback() {
    let client = || {
        let mut c = Command::new(bin("qperf"));
        c.env("LD_LIBRARY_PATH", lib_dir());
        c
    };
    run(qperf(17564), client, "127.0.0.1", 17564);
}

#[test]
fn qperf_rc_tests_over_rdma_cm_between_two_namespace_hosts() {
    if !rdma_testhosts::require_root("qperf_rc_tests_over_rdma_cm_between_two_namespace_hosts") {
        return;
    }
    let topo = rdma_testhosts::topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (&topo.hosts()[0], &topo.hosts()[1]);
    a.wait_carrier("eth0");
    b.wait_carrier("eth0");
    let in_host = |h: &rdma_testhosts::Host| {
        let mut c = h.command(bin("qperf").to_str().unwrap());
        c.env("LD_LIBRARY_PATH", lib_dir());
        c
    };
    let mut server = in_host(b);
    server.args(["-lp", "17565"]);
    run(server, || in_host(a), "192.0.2.2", 17565);
}
