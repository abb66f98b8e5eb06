//! udaddy as two processes on loopback (SIDR, then datagrams both ways; each UD QP opens UDP
//! 4791 only on its id's address), and its command line. Namespace hosts: `tools_netns.rs`.

mod procs;

use std::process::Command;
use std::time::Duration;

use procs::{spawn, wait_udp_4791};

const UDADDY: &str = env!("CARGO_BIN_EXE_udaddy");
const T: Duration = Duration::from_secs(20);

fn udaddy(args: &[&str]) -> Command {
    let mut c = Command::new(UDADDY);
    c.args(args);
    c
}

#[test]
fn udaddy_bad_usage_fails_in_one_line() {
    for args in [
        &["-z"][..],
        &["-C", "-1"][..],
        &["-c", "0"][..],
        &["-p"][..],
        &["-s", "no.such.host.invalid"][..],
    ] {
        let o = spawn(udaddy(args), "udaddy").wait(T);
        assert_eq!(o.code, Some(1), "{args:?}: {o:#?}");
        assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {o:#?}");
        assert!(o.stderr.starts_with("udaddy: "), "{args:?}: {o:#?}");
    }
    let h = spawn(udaddy(&["-h"]), "-h").wait(T);
    h.ok("-h");
    assert!(h
        .stdout
        .starts_with("usage: udaddy\n\t[-s server_address]\n"));
}

#[test]
fn udaddy_two_processes_on_loopback() {
    let srv = spawn(
        udaddy(&["-b", "127.0.0.54", "-c", "2", "-C", "4", "-S", "500"]),
        "server",
    );
    wait_udp_4791("127.0.0.54".parse().unwrap(), None);
    let c = spawn(
        udaddy(&[
            "-s",
            "127.0.0.54",
            "-b",
            "127.0.0.55",
            "-c",
            "2",
            "-C",
            "4",
            "-S",
            "500",
        ]),
        "client",
    )
    .wait(T);
    c.ok("client");
    let s = srv.wait(T);
    s.ok("server");
    for (out, who) in [(&c.stdout, "client"), (&s.stdout, "server")] {
        assert!(out.contains("data transfers complete"), "{who}: {out}");
        assert!(out.ends_with("return status 0\n"), "{who}: {out}");
    }
    assert!(c
        .stdout
        .starts_with("udaddy: starting client\nudaddy: connecting\n"));
}
