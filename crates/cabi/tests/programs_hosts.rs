//! Debian's unmodified RDMA programs over our libraries between two namespace hosts (root;
//! `two_hosts_one_link`: a 192.0.2.1 — b 192.0.2.2, device `eth0`), C against C: rdmacm-utils
//! (ucmatose, udaddy, cmtime, rdma_server/rdma_client), ibverbs-utils' pingpongs (QP data
//! over their TCP exchange, the IPv4 GID's index as on rxe) and fio's rdma engine. The server
//! runs on b, the client on a. programs.rs runs the same pairs on 127.0.0.1 (and rping here).
//!
//! The tests run one after the other: the pingpongs busy-poll, and two pairs at once on a
//! 2-CPU machine starve each other.

mod support;

use rdma_testhosts::Host;
use support::{
    assert_cmtime_done, assert_transfers_done, cm_pair, gid_index, host_prog, serial, tcp_pair,
    two_hosts,
};

/// Runs `body` with the two hosts (a, b) of a fresh topology, one test at a time.
fn on_two_hosts(test: &str, body: impl FnOnce(&Host, &Host)) {
    let _one = serial();
    two_hosts(test, body);
}

fn run(h: &Host, name: &str, args: &[&str]) -> std::process::Command {
    let mut c = host_prog(h, name);
    c.args(args);
    c
}

#[test]
fn ucmatose_two_connections_between_namespace_hosts() {
    on_two_hosts(
        "ucmatose_two_connections_between_namespace_hosts",
        |a, b| {
            let (s, c) = cm_pair(
                Some(b),
                run(
                    b,
                    "ucmatose",
                    &["-b", "192.0.2.2", "-c", "2", "-C", "5", "-p", "17700"],
                ),
                run(
                    a,
                    "ucmatose",
                    &["-s", "192.0.2.2", "-c", "2", "-C", "5", "-p", "17700"],
                ),
                17700,
                true,
            );
            assert_transfers_done(&s, &c, "ucmatose");
            assert!(s.contains("disconnected"), "{s}");
        },
    );
}

#[test]
fn udaddy_two_connections_between_namespace_hosts() {
    on_two_hosts("udaddy_two_connections_between_namespace_hosts", |a, b| {
        // udaddy's port is always 7174 (its -p is the port space); each namespace has its own.
        let (s, c) = cm_pair(
            Some(b),
            run(b, "udaddy", &["-b", "192.0.2.2", "-c", "2", "-C", "5"]),
            run(a, "udaddy", &["-s", "192.0.2.2", "-c", "2", "-C", "5"]),
            7174,
            true,
        );
        assert_transfers_done(&s, &c, "udaddy");
    });
}

#[test]
fn cmtime_ten_connections_between_namespace_hosts() {
    on_two_hosts("cmtime_ten_connections_between_namespace_hosts", |a, b| {
        // The cmtime server runs until stopped.
        let (_, c) = cm_pair(
            Some(b),
            run(b, "cmtime", &["-b", "192.0.2.2", "-c", "10", "-p", "17701"]),
            run(a, "cmtime", &["-s", "192.0.2.2", "-c", "10", "-p", "17701"]),
            17701,
            false,
        );
        assert_cmtime_done(&c, "cmtime");
    });
}

#[test]
fn rdma_server_and_client_between_namespace_hosts() {
    on_two_hosts("rdma_server_and_client_between_namespace_hosts", |a, b| {
        let (s, c) = cm_pair(
            Some(b),
            run(b, "rdma_server", &["-s", "192.0.2.2", "-p", "17702"]),
            run(a, "rdma_client", &["-s", "192.0.2.2", "-p", "17702"]),
            17702,
            true,
        );
        assert!(s.contains("rdma_server: end 0"), "{s}");
        assert!(c.contains("rdma_client: end 0"), "{c}");
    });
}

/// ibverbs-utils' `name` with 50 iterations, device eth0 and each host's IPv4 GID.
fn pingpong(a: &Host, b: &Host, name: &str, port: u16) {
    let (ga, gb) = (
        gid_index(a, "eth0", "192.0.2.1"),
        gid_index(b, "eth0", "192.0.2.2"),
    );
    let p = port.to_string();
    let common = ["-d", "eth0", "-n", "50", "-p", &p];
    let mut server = run(b, name, &common);
    server.args(["-g", &gb]);
    let mut client = run(a, name, &common);
    client.args(["-g", &ga, "192.0.2.2"]);
    let c = tcp_pair(server, client, port);
    assert!(c.contains("50 iters in"), "{c}");
    // the local and the remote address lines, each with its host's GID
    assert!(c.contains("GID ::ffff:192.0.2.1"), "{c}");
    assert!(c.contains("GID ::ffff:192.0.2.2"), "{c}");
}

#[test]
fn ibv_rc_pingpong_between_namespace_hosts() {
    on_two_hosts("ibv_rc_pingpong_between_namespace_hosts", |a, b| {
        pingpong(a, b, "ibv_rc_pingpong", 17703)
    });
}

#[test]
fn ibv_ud_pingpong_between_namespace_hosts() {
    on_two_hosts("ibv_ud_pingpong_between_namespace_hosts", |a, b| {
        pingpong(a, b, "ibv_ud_pingpong", 17704)
    });
}

#[test]
fn ibv_srq_pingpong_between_namespace_hosts() {
    on_two_hosts("ibv_srq_pingpong_between_namespace_hosts", |a, b| {
        pingpong(a, b, "ibv_srq_pingpong", 17705)
    });
}

/// fio's rdma engine: the `--rw=read` job on b listens, the `--rw=write` job on a connects
/// and issues `verb` (as programs.rs's fio jobs on 127.0.0.1). Returns the client's output.
fn fio(a: &Host, b: &Host, verb: &str, port: u16) -> String {
    let p = format!("--port={port}");
    let job = [
        "--ioengine=rdma",
        &p,
        "--bs=64k",
        "--size=4m",
        "--iodepth=4",
    ];
    let mut server = run(b, "fio", &job);
    server.args(["--name=target", "--rw=read"]);
    let mut client = run(a, "fio", &job);
    client.args([
        "--name=initiator",
        "--hostname=192.0.2.2",
        &format!("--verb={verb}"),
        "--rw=write",
    ]);
    cm_pair(Some(b), server, client, port, true).1
}

#[test]
fn fio_rdma_write_and_read_jobs_between_namespace_hosts() {
    on_two_hosts(
        "fio_rdma_write_and_read_jobs_between_namespace_hosts",
        |a, b| {
            let out = fio(a, b, "write", 17706);
            assert!(
                out.contains("WRITE: bw=") && out.contains("io=4096KiB") && out.contains("err= 0:"),
                "{out}"
            );
            let out = fio(a, b, "read", 17707);
            assert!(
                out.contains("io=4096KiB") && out.contains("err= 0:"),
                "{out}"
            );
        },
    );
}
