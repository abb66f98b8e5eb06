//! rping as two processes on loopback (server on 127.0.0.x, client bound to 127.0.0.y):
//! ping data and validation, persistent server, failures with one-line reasons.

mod procs;

use std::process::Command;
use std::time::Duration;

use procs::{lines_with, spawn, wait_udp_4791};

const RPING: &str = env!("CARGO_BIN_EXE_rping");
const T: Duration = Duration::from_secs(20);

fn rping(args: &[&str]) -> Command {
    let mut c = Command::new(RPING);
    c.args(args);
    c
}

/// The ping data rping prints for ping `n` with the default size 64.
fn ping_line(n: u32) -> String {
    let head = format!("rdma-ping-{n}: ");
    let mut s = head.clone();
    let mut c = 65 + (n % 58) as u8;
    for _ in head.len()..63 {
        s.push(c as char);
        c = if c == 122 { 65 } else { c + 1 };
    }
    s
}

#[test]
fn rping_client_server_verbose_validate() {
    let srv = spawn(
        rping(&["-s", "-a", "127.0.0.41", "-C", "3", "-v", "-V"]),
        "server",
    );
    wait_udp_4791("127.0.0.41".parse().unwrap(), None);
    let cli = rping(&[
        "-c",
        "-a",
        "127.0.0.41",
        "-I",
        "127.0.0.42",
        "-C",
        "3",
        "-v",
        "-V",
    ]);
    let c = spawn(cli, "client").wait(T);
    c.ok("client");
    let s = srv.wait(T);
    s.ok("server");
    let pings = lines_with(&c.stdout, "ping data: ");
    assert_eq!(pings.len(), 3, "{c:#?}");
    for (i, l) in pings.iter().enumerate() {
        assert_eq!(*l, format!("ping data: {}", ping_line(i as u32)));
    }
    assert_eq!(
        pings[0],
        "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
    );
    let served = lines_with(&s.stdout, "server ping data: ");
    assert_eq!(served.len(), 3, "{s:#?}");
    assert_eq!(served[2], format!("server ping data: {}", ping_line(2)));
    assert!(s.stderr.contains("server DISCONNECT EVENT..."), "{s:#?}");
}

#[test]
fn rping_debug_prints_cm_events_by_name_and_large_size() {
    let srv = spawn(
        rping(&["-s", "-a", "127.0.0.43", "-p", "7300", "-S", "5000", "-d"]),
        "server",
    );
    wait_udp_4791("127.0.0.43".parse().unwrap(), None);
    let cli = rping(&[
        "-c",
        "-a",
        "127.0.0.43",
        "-I",
        "127.0.0.44",
        "-p",
        "7300",
        "-C",
        "2",
        "-S",
        "5000",
        "-V",
        "-d",
    ]);
    let c = spawn(cli, "client").wait(T);
    c.ok("client");
    let s = srv.wait(T);
    s.ok("server");
    for ev in [
        "RDMA_CM_EVENT_ADDR_RESOLVED",
        "RDMA_CM_EVENT_ROUTE_RESOLVED",
        "RDMA_CM_EVENT_ESTABLISHED",
    ] {
        assert!(
            c.stdout.contains(&format!("cma_event type {ev}")),
            "{ev}: {c:#?}"
        );
    }
    assert!(
        s.stdout
            .contains("cma_event type RDMA_CM_EVENT_CONNECT_REQUEST"),
        "{s:#?}"
    );
    assert!(
        s.stdout
            .contains("cma_event type RDMA_CM_EVENT_DISCONNECTED"),
        "{s:#?}"
    );
    assert!(s.stdout.contains("Received rkey"), "{s:#?}");
}

#[test]
fn rping_persistent_server_serves_clients_one_after_another() {
    let srv = spawn(
        rping(&["-s", "-P", "-a", "127.0.0.45", "-p", "7301", "-v"]),
        "server",
    );
    wait_udp_4791("127.0.0.45".parse().unwrap(), None);
    for src in ["127.0.0.46", "127.0.0.47"] {
        let cli = rping(&[
            "-c",
            "-a",
            "127.0.0.45",
            "-I",
            src,
            "-p",
            "7301",
            "-C",
            "2",
            "-V",
        ]);
        spawn(cli, "client").wait(T).ok(src);
    }
    let s = srv.kill();
    assert_eq!(
        lines_with(&s.stdout, "server ping data: ").len(),
        4,
        "{s:#?}"
    );
}

#[test]
fn rping_no_listener_is_rejected_in_one_line() {
    // Nothing listens on port 7302 of 127.0.0.48: the CM answers REJ reason 8.
    let c = spawn(
        rping(&["-c", "-a", "127.0.0.48", "-p", "7302", "-C", "1"]),
        "client",
    )
    .wait(T);
    assert_ne!(c.code, Some(0));
    assert_eq!(
        c.stderr, "rping: cma event RDMA_CM_EVENT_REJECTED, error 8\n",
        "{c:#?}"
    );
}

#[test]
fn rping_bad_usage_fails_in_one_line() {
    for (args, want) in [
        (
            &["-s", "-S", "10"][..],
            "rping: Invalid size 10 (valid range is 26 to 65536)\n",
        ),
        (
            &["-x"][..],
            "rping: invalid option -- 'x' (try 'rping -h')\n",
        ),
        (
            &["-s", "-p"][..],
            "rping: option requires an argument -- 'p' (try 'rping -h')\n",
        ),
        (
            &["-c"][..],
            "rping: the client needs the server's address: -a addr\n",
        ),
        (&["-c", "-a", "300.1.1.1.1"][..], ""),
        (
            &["-s", "-C", "many"][..],
            "rping: invalid value 'many' for -C\n",
        ),
        (
            &[][..],
            "rping: one of -s (server) or -c (client) is required (try 'rping -h')\n",
        ),
    ] {
        let o = spawn(rping(args), "rping").wait(T);
        assert_eq!(o.code, Some(1), "{args:?}: {o:#?}");
        assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {o:#?}");
        assert!(o.stderr.starts_with("rping: "), "{args:?}: {o:#?}");
        if !want.is_empty() {
            assert_eq!(o.stderr, want, "{args:?}");
        }
    }
    let h = spawn(rping(&["-h"]), "rping -h").wait(T);
    h.ok("-h");
    assert!(h
        .stdout
        .starts_with("rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]\n"));
    assert!(h
        .stdout
        .contains("\t-P\t\tpersistent server mode allowing multiple connections\n"));
}
