//! Debian's rdmacm-utils (rdma-core 44) over our libraries against our Rust tools of the same
//! name (crates/tools: ucmatose, udaddy, cmtime), both directions: C server with Rust client,
//! Rust server with C client, on 127.0.0.1 and (root) between two namespace hosts. rping's
//! pair is programs.rs's `c_rping_against_rust_rping_both_ways`.
//!
//! The tests run one after the other: udaddy's port is always 7174, and a listener check
//! must see only the server of its own pair.

mod support;

use std::process::Command;

use rdma_testhosts::Host;
use support::{
    assert_cmtime_done, assert_transfers_done, cm_pair, host_prog, prog, rust_tool, serial,
    two_hosts,
};

/// Where a pair runs: both on 127.0.0.1, or server on b (192.0.2.2) and client on a.
#[derive(Clone, Copy)]
enum Place<'a> {
    Loopback,
    Hosts(&'a Host, &'a Host),
}

impl<'a> Place<'a> {
    /// The server's address.
    fn addr(self) -> &'static str {
        match self {
            Place::Loopback => "127.0.0.1",
            Place::Hosts(..) => "192.0.2.2",
        }
    }

    /// The host whose namespace the server's listener is in.
    fn server_host(self) -> Option<&'a Host> {
        match self {
            Place::Loopback => None,
            Place::Hosts(_, b) => Some(b),
        }
    }

    /// `name`, C (Debian's, over our libraries) or Rust, on the server's or the client's side.
    fn cmd(self, name: &str, rust: bool, server: bool, args: &[&str]) -> Command {
        let host = match self {
            Place::Loopback => None,
            Place::Hosts(a, b) => Some(if server { b } else { a }),
        };
        let mut c = match (host, rust) {
            (None, false) => prog(name),
            (Some(h), false) => host_prog(h, name),
            (None, true) => Command::new(rust_tool(name)),
            (Some(h), true) => h.command(rust_tool(name).to_str().unwrap()),
        };
        c.args(args);
        c
    }
}

/// Runs `body` on 127.0.0.1 and, as root, between two namespace hosts; one test at a time.
fn everywhere(test: &str, body: impl Fn(Place)) {
    let _one = serial();
    body(Place::Loopback);
    two_hosts(test, |a, b| body(Place::Hosts(a, b)));
}

/// Who serves: (server is Rust, client is Rust) for both directions.
const DIRECTIONS: [(bool, bool); 2] = [(false, true), (true, false)];

fn who(rust: bool) -> &'static str {
    if rust {
        "Rust"
    } else {
        "C"
    }
}

#[test]
fn ucmatose_c_against_rust_both_ways() {
    everywhere("ucmatose_c_against_rust_both_ways", |at| {
        for (i, (rs, rc)) in DIRECTIONS.into_iter().enumerate() {
            let port = (17720 + i).to_string();
            let common = ["-c", "2", "-C", "5", "-p", &port];
            let (s, c) = cm_pair(
                at.server_host(),
                at.cmd("ucmatose", rs, true, &common),
                at.cmd(
                    "ucmatose",
                    rc,
                    false,
                    &[&common[..], &["-s", at.addr()]].concat(),
                ),
                port.parse().unwrap(),
                true,
            );
            let pair = format!("{} server, {} client", who(rs), who(rc));
            assert_transfers_done(&s, &c, &pair);
            assert!(s.contains("disconnected"), "{pair}:\n{s}");
        }
    });
}

#[test]
fn udaddy_c_against_rust_both_ways() {
    everywhere("udaddy_c_against_rust_both_ways", |at| {
        for (rs, rc) in DIRECTIONS {
            // C udaddy's port is always 7174 (its -p is the port space), our tool's default.
            let common = ["-c", "2", "-C", "5"];
            let (s, c) = cm_pair(
                at.server_host(),
                at.cmd("udaddy", rs, true, &common),
                at.cmd(
                    "udaddy",
                    rc,
                    false,
                    &[&common[..], &["-s", at.addr()]].concat(),
                ),
                7174,
                true,
            );
            let pair = format!("{} server, {} client", who(rs), who(rc));
            assert_transfers_done(&s, &c, &pair);
        }
    });
}

#[test]
fn cmtime_c_against_rust_both_ways() {
    everywhere("cmtime_c_against_rust_both_ways", |at| {
        for (i, (rs, rc)) in DIRECTIONS.into_iter().enumerate() {
            let port = (17722 + i).to_string();
            let common = ["-c", "10", "-p", &port];
            // Both servers run until stopped: rdma-core 44's cmtime has no out-of-band sync,
            // and our client, refused its sync socket, runs without.
            let (_, c) = cm_pair(
                at.server_host(),
                at.cmd("cmtime", rs, true, &common),
                at.cmd(
                    "cmtime",
                    rc,
                    false,
                    &[&common[..], &["-s", at.addr()]].concat(),
                ),
                port.parse().unwrap(),
                false,
            );
            let pair = format!("{} server, {} client", who(rs), who(rc));
            assert_cmtime_done(&c, &pair);
        }
    });
}
