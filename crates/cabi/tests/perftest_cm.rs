//! Debian's perftest with `-R` (its connections through rdma_cm) over our libraries: the
//! seven tests on 127.0.0.1 and between two namespace hosts (root), the client started once
//! the server's rdma_cm listener is there.
//!
//! perftest 4.5 (4.5+0.17) races itself: after a handshake over its first connection the
//! server creates, binds and listens on a second id while the client resolves and connects
//! at once, and a client faster than the server's `rdma_listen` is refused (REJ 8, as Linux
//! refuses it); perftest's own retry then reuses the ids it has just destroyed (fixed
//! upstream after 4.5). Our CM resends a REQ refused for want of a listener for
//! `RDMACM_NO_LISTENER_RETRY_MS` (default 250 ms), so the second listener gets it: these
//! tests run with the default, and about half of the runs between namespace hosts need it.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Instant;
use support::{cm_listening as listening, finish, lib_dir, start, LIMIT};

const TESTS: [&str; 7] = [
    "ib_send_lat",
    "ib_send_bw",
    "ib_write_lat",
    "ib_write_bw",
    "ib_read_lat",
    "ib_read_bw",
    "ib_atomic_lat",
];

/// perftest's `test -R` (with `extra` arguments on both sides) on `port`: server on
/// `hosts[0]` (device `dev`), client on `hosts[1]` to `addr`.
fn perftest(
    test: &str,
    extra: &[&str],
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
    let cmd = |h: Option<&rdma_testhosts::Host>, dst: &[&str]| {
        let mut c = match h {
            Some(h) => h.command(&path),
            None => Command::new(&path),
        };
        c.args(args)
            .args(extra)
            .args(dst)
            .env("LD_LIBRARY_PATH", lib_dir());
        c
    };
    let s = start(cmd(hosts[0], &[]));
    let end = Instant::now() + LIMIT;
    while !listening(hosts[0], port) {
        if Instant::now() > end {
            let (_, st) = support::finish_or_kill(s, true);
            panic!("{test}: the server never listened:\n{st}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (cs, ct) = finish(start(cmd(hosts[1], &[addr])));
    let (ss, st) = finish(s);
    assert!(
        cs.success() && ss.success(),
        "{test}: client:\n{ct}\nserver:\n{st}"
    );
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
fn perftest_rdma_cm_on_loopback() {
    for (k, test) in TESTS.iter().enumerate() {
        perftest(test, &[], 17630 + k as u16, [None, None], "lo", "127.0.0.1");
    }
}

#[test]
fn perftest_rdma_cm_between_two_namespace_hosts() {
    if !rdma_testhosts::require_root("perftest_rdma_cm_between_two_namespace_hosts") {
        return;
    }
    let topo = rdma_testhosts::topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (&topo.hosts()[0], &topo.hosts()[1]);
    for (k, test) in TESTS.iter().enumerate() {
        perftest(
            test,
            &[],
            17640 + k as u16,
            [Some(b), Some(a)],
            "eth0",
            "192.0.2.2",
        );
    }
}

/// The SEND tests over UD QPs (`-c UD`): their connections are SIDR exchanges, and a
/// SIDR_REQ refused for want of a listener is resent as a REQ is.
#[test]
fn perftest_rdma_cm_ud_on_loopback_and_between_namespace_hosts() {
    let ud = ["-c", "UD"];
    for (k, test) in ["ib_send_lat", "ib_send_bw"].iter().enumerate() {
        perftest(test, &ud, 17660 + k as u16, [None, None], "lo", "127.0.0.1");
    }
    if !rdma_testhosts::require_root("perftest_rdma_cm_ud_between_two_namespace_hosts") {
        return;
    }
    let topo = rdma_testhosts::topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (&topo.hosts()[0], &topo.hosts()[1]);
    for (k, test) in ["ib_send_lat", "ib_send_bw"].iter().enumerate() {
        perftest(
            test,
            &ud,
            17662 + k as u16,
            [Some(b), Some(a)],
            "eth0",
            "192.0.2.2",
        );
    }
}
