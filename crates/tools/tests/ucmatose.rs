//! ucmatose as two processes on loopback: cmatose's output lines, several connections,
//! a rejected connect in one line, bad usage.

mod procs;

use std::process::Command;
use std::time::Duration;

use procs::{spawn, wait_udp_4791};

const UCMATOSE: &str = env!("CARGO_BIN_EXE_ucmatose");
const T: Duration = Duration::from_secs(20);

fn ucmatose(args: &[&str]) -> Command {
    let mut c = Command::new(UCMATOSE);
    c.args(args);
    c
}

#[test]
fn ucmatose_two_connections_exchange_and_disconnect() {
    let srv = spawn(
        ucmatose(&["-b", "127.0.0.51", "-c", "2", "-C", "5", "-S", "3000"]),
        "server",
    );
    wait_udp_4791("127.0.0.51".parse().unwrap(), None);
    let cli = ucmatose(&[
        "-s",
        "127.0.0.51",
        "-b",
        "127.0.0.52",
        "-c",
        "2",
        "-C",
        "5",
        "-S",
        "3000",
        "-v",
    ]);
    let c = spawn(cli, "client").wait(T);
    c.ok("client");
    let s = srv.wait(T);
    s.ok("server");
    let client_lines: Vec<&str> = c
        .stdout
        .lines()
        .filter(|l| !l.starts_with("cma_event"))
        .collect();
    assert_eq!(
        client_lines,
        [
            "cmatose: starting client",
            "cmatose: connecting",
            "receiving data transfers",
            "sending replies",
            "data transfers complete",
            "test complete",
            "return status 0",
        ]
    );
    assert_eq!(
        s.stdout.lines().collect::<Vec<_>>(),
        [
            "cmatose: starting server",
            "initiating data transfers",
            "completing sends",
            "receiving data transfers",
            "data transfers complete",
            "cmatose: disconnecting",
            "disconnected",
            "test complete",
            "return status 0",
        ]
    );
    let established = c
        .stdout
        .matches("cma_event type RDMA_CM_EVENT_ESTABLISHED")
        .count();
    assert_eq!(established, 2, "{c:#?}");
    assert_eq!(
        c.stdout.matches("RDMA_CM_EVENT_DISCONNECTED").count(),
        2,
        "{c:#?}"
    );
}

#[test]
fn ucmatose_no_listener_is_rejected_in_one_line() {
    let c = spawn(ucmatose(&["-s", "127.0.0.53", "-p", "7399"]), "client").wait(T);
    assert_eq!(c.code, Some(1), "{c:#?}");
    assert_eq!(
        c.stderr,
        "cmatose: event: RDMA_CM_EVENT_REJECTED, error: 8\n"
    );
}

#[test]
fn ucmatose_bad_usage_fails_in_one_line() {
    for args in [&["-q"][..], &["-c", "x"][..], &["-c", "0"][..], &["-t"][..]] {
        let o = spawn(ucmatose(args), "ucmatose").wait(T);
        assert_eq!(o.code, Some(1), "{args:?}: {o:#?}");
        assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {o:#?}");
        assert!(o.stderr.starts_with("cmatose: "), "{args:?}: {o:#?}");
    }
    let h = spawn(ucmatose(&["-h"]), "-h").wait(T);
    h.ok("-h");
    assert!(h
        .stdout
        .contains("\t[-s server_address]\n\t[-b bind_address]\n"));
}
