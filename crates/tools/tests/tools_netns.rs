//! rping and ucmatose between two network-namespace hosts on one link ("two hosts on one
//! link": a 192.0.2.1 / 2001:db8:1::1 — b 192.0.2.2 / 2001:db8:1::2), processes started
//! with `ip netns exec`. Needs root (prints SKIPPED otherwise).

mod procs;

use std::time::Duration;

use procs::{lines_with, spawn, spawn_streamed, wait_udp_4791};
use rdma_testhosts::{require_root, topologies};

const RPING: &str = env!("CARGO_BIN_EXE_rping");
const UCMATOSE: &str = env!("CARGO_BIN_EXE_ucmatose");
const T: Duration = Duration::from_secs(30);

#[test]
fn netns_rping_ipv4_and_ipv6_and_ucmatose() {
    if !require_root("netns_rping_ipv4_and_ipv6_and_ucmatose") {
        return;
    }
    let topo = topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (topo.host("a"), topo.host("b"));

    // rping over IPv4, server bound to its address with -a, client with -I.
    let mut s = b.command(RPING);
    s.args(["-s", "-a", "192.0.2.2", "-v", "-V"]);
    let srv = spawn(s, "rping server");
    wait_udp_4791("192.0.2.2".parse().unwrap(), Some(b.netns()));
    let mut c = a.command(RPING);
    c.args([
        "-c",
        "-a",
        "192.0.2.2",
        "-I",
        "192.0.2.1",
        "-C",
        "4",
        "-v",
        "-V",
    ]);
    let c = spawn(c, "rping client").wait(T);
    c.ok("rping client v4");
    let s = srv.wait(T);
    s.ok("rping server v4");
    assert_eq!(
        lines_with(&c.stdout, "ping data: rdma-ping-").len(),
        4,
        "{c:#?}"
    );
    assert_eq!(
        lines_with(&s.stdout, "server ping data: rdma-ping-").len(),
        4,
        "{s:#?}"
    );

    // rping over IPv6 (global addresses), as the ipv6-global capture.
    let mut s = b.command(RPING);
    s.args(["-s", "-a", "2001:db8:1::2", "-p", "7175", "-v"]);
    let srv = spawn(s, "rping server v6");
    wait_udp_4791("2001:db8:1::2".parse().unwrap(), Some(b.netns()));
    let mut c = a.command(RPING);
    c.args([
        "-c",
        "-a",
        "2001:db8:1::2",
        "-p",
        "7175",
        "-C",
        "2",
        "-v",
        "-V",
        "-d",
    ]);
    let c = spawn(c, "rping client v6").wait(T);
    c.ok("rping client v6");
    srv.wait(T).ok("rping server v6");
    assert_eq!(
        lines_with(&c.stdout, "ping data: rdma-ping-").len(),
        2,
        "{c:#?}"
    );
    assert!(c
        .stdout
        .contains("cma_event type RDMA_CM_EVENT_ESTABLISHED"));

    // ucmatose, 2 connections.
    let mut s = a.command(UCMATOSE);
    s.args(["-b", "192.0.2.1", "-c", "2", "-C", "4"]);
    let srv = spawn(s, "ucmatose server");
    wait_udp_4791("192.0.2.1".parse().unwrap(), Some(a.netns()));
    let mut c = b.command(UCMATOSE);
    c.args(["-s", "192.0.2.1", "-b", "192.0.2.2", "-c", "2", "-C", "4"]);
    let c = spawn(c, "ucmatose client").wait(T);
    c.ok("ucmatose client");
    let s = srv.wait(T);
    s.ok("ucmatose server");
    assert!(c.stdout.contains("data transfers complete\n"), "{c:#?}");
    assert!(
        s.stdout
            .contains("disconnected\ntest complete\nreturn status 0\n"),
        "{s:#?}"
    );

    // No listener on the peer's port: one line, non-zero exit.
    let mut c = a.command(RPING);
    c.args(["-c", "-a", "192.0.2.2", "-p", "7999", "-C", "1"]);
    let mut s = b.command(UCMATOSE);
    s.args(["-b", "192.0.2.2", "-p", "7998"]);
    let holder = spawn(s, "a device holding 192.0.2.2");
    wait_udp_4791("192.0.2.2".parse().unwrap(), Some(b.netns()));
    let c = spawn(c, "rping to nobody").wait(T);
    holder.kill();
    assert_eq!(c.code, Some(1), "{c:#?}");
    assert_eq!(
        c.stderr,
        "rping: cma event RDMA_CM_EVENT_REJECTED, error 8\n"
    );
}

const UDADDY: &str = env!("CARGO_BIN_EXE_udaddy");

#[test]
fn netns_udaddy_sidr_and_datagrams() {
    if !require_root("netns_udaddy_sidr_and_datagrams") {
        return;
    }
    let topo = topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (topo.host("a"), topo.host("b"));
    let mut s = b.command(UDADDY);
    s.args(["-b", "192.0.2.2", "-c", "2", "-C", "4", "-S", "500"]);
    let srv = spawn(s, "udaddy server");
    wait_udp_4791("192.0.2.2".parse().unwrap(), Some(b.netns()));
    let mut c = a.command(UDADDY);
    c.args([
        "-s",
        "192.0.2.2",
        "-b",
        "192.0.2.1",
        "-c",
        "2",
        "-C",
        "4",
        "-S",
        "500",
        "-v",
    ]);
    let c = spawn(c, "udaddy client").wait(T);
    c.ok("udaddy client");
    let s = srv.wait(T);
    s.ok("udaddy server");
    let client_lines: Vec<&str> = c
        .stdout
        .lines()
        .filter(|l| !l.starts_with("cma_event"))
        .collect();
    assert_eq!(
        client_lines,
        [
            "udaddy: starting client",
            "udaddy: connecting",
            "initiating data transfers",
            "receiving data transfers",
            "data transfers complete",
            "test complete",
            "return status 0",
        ]
    );
    assert_eq!(
        c.stdout
            .matches("cma_event type RDMA_CM_EVENT_ESTABLISHED")
            .count(),
        2
    );
    assert_eq!(
        s.stdout.lines().collect::<Vec<_>>(),
        [
            "udaddy: starting server",
            "receiving data transfers",
            "sending replies",
            "data transfers complete",
            "test complete",
            "return status 0",
        ]
    );
}

/// `udaddy -t TOS`: the UD data datagrams (and the SIDR MADs) carry the TOS on the wire,
/// as rdma-core's udaddy does through the event's address handle attributes.
#[test]
fn netns_udaddy_tos_reaches_the_wire() {
    if !require_root("netns_udaddy_tos_reaches_the_wire") {
        return;
    }
    let topo = topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (topo.host("a"), topo.host("b"));
    let rec = b
        .run(|| rdma_testhosts::capture::Capture::open("eth0"))
        .expect("capture")
        .record();
    let mut s = b.command(UDADDY);
    s.args(["-b", "192.0.2.2", "-C", "3", "-S", "200", "-t", "0x48"]);
    let srv = spawn(s, "udaddy server");
    wait_udp_4791("192.0.2.2".parse().unwrap(), Some(b.netns()));
    let mut c = a.command(UDADDY);
    c.args([
        "-s",
        "192.0.2.2",
        "-b",
        "192.0.2.1",
        "-C",
        "3",
        "-S",
        "200",
        "-t",
        "0x48",
    ]);
    spawn(c, "udaddy client").wait(T).ok("udaddy client");
    srv.wait(T).ok("udaddy server");
    let pkts: Vec<_> = rec
        .stop()
        .iter()
        .filter_map(|p| rdma_testhosts::capture::Roce::parse(p))
        .collect();
    // UD SEND (only / with immediate) of the data QPs, from each side
    let client: std::net::IpAddr = "192.0.2.1".parse().unwrap();
    let data: Vec<_> = pkts
        .iter()
        .filter(|p| p.opcode & 0xe0 == 0x60 && p.dest_qp != 1)
        .collect();
    for from in ["192.0.2.1", "192.0.2.2"] {
        let ip: std::net::IpAddr = from.parse().unwrap();
        let n = data.iter().filter(|p| p.src == ip).count();
        assert_eq!(n, 3, "UD SENDs from {from}: {pkts:?}");
    }
    // `-t` sets the TOS of the client's ids only, as in rdma-core's udaddy: its SIDR REQ
    // and its datagrams carry it. (Linux's passive side answers with the TOS of the
    // request's IP header; ours with the listener's: see docs/CM.md.)
    let from_client: Vec<_> = pkts.iter().filter(|p| p.src == client).collect();
    assert!(
        from_client.iter().any(|p| p.dest_qp == 1),
        "the SIDR REQ captured: {pkts:?}"
    );
    for p in from_client {
        assert_eq!(
            p.tclass, 0x48,
            "client datagram (QP {}, MAD {:?}) carries the TOS",
            p.dest_qp, p.cm_attr
        );
    }
}

const RDMA_PERF: &str = env!("CARGO_BIN_EXE_rdma-perf");

/// Every tool over IPv6, data both ways: link-local only (a fe80::1%eth0 — b fe80::2%eth0)
/// and global (2001:db8:1::1 — 2001:db8:1::2). RC data over link-local used to fail: the
/// QP's path held the peer without its scope, the packets arrived with it, and every one was
/// dropped as from the wrong path (RetryExcErr on the first SEND although the CM had
/// connected).
#[test]
fn netns_link_local_every_tool_moves_data() {
    if !require_root("netns_link_local_every_tool_moves_data") {
        return;
    }
    let topo = topologies::link_local_only().expect("topology");
    every_tool_v6(&topo, "fe80::2%eth0", "fe80::2", 18700);
}

#[test]
fn netns_ipv6_global_every_tool_moves_data() {
    if !require_root("netns_ipv6_global_every_tool_moves_data") {
        return;
    }
    let topo = topologies::two_hosts_one_link().expect("topology");
    every_tool_v6(&topo, "2001:db8:1::2", "2001:db8:1::2", 18710);
}

fn every_tool_v6(topo: &rdma_testhosts::Topology, addr: &str, srv_ip: &str, base_port: usize) {
    let (a, b) = (topo.host("a"), topo.host("b"));
    let srv_ip: std::net::IpAddr = srv_ip.parse().unwrap();

    // rping: READ (server from client) and WRITE (server to client) of every ping, verified
    let mut s = b.command(RPING);
    s.args(["-s", "-a", addr, "-v", "-V"]);
    let srv = spawn(s, "rping server ll");
    wait_udp_4791(srv_ip, Some(b.netns()));
    let mut c = a.command(RPING);
    c.args(["-c", "-a", addr, "-C", "3", "-v", "-V"]);
    let c = spawn(c, "rping client ll").wait(T);
    c.ok("rping client ll");
    let s = srv.wait(T);
    s.ok("rping server ll");
    assert_eq!(
        lines_with(&c.stdout, "ping data: rdma-ping-").len(),
        3,
        "{c:#?}"
    );
    assert_eq!(
        lines_with(&s.stdout, "server ping data: rdma-ping-").len(),
        3,
        "{s:#?}"
    );

    // ucmatose: SENDs both ways on 2 connections
    let mut s = b.command(UCMATOSE);
    s.args(["-b", addr, "-c", "2", "-C", "4"]);
    let srv = spawn(s, "ucmatose server ll");
    wait_udp_4791(srv_ip, Some(b.netns()));
    let mut c = a.command(UCMATOSE);
    c.args(["-s", addr, "-c", "2", "-C", "4"]);
    let c = spawn(c, "ucmatose client ll").wait(T);
    c.ok("ucmatose client ll");
    let s = srv.wait(T);
    s.ok("ucmatose server ll");
    assert!(c.stdout.contains("data transfers complete\n"), "{c:#?}");
    assert!(s.stdout.contains("data transfers complete\n"), "{s:#?}");

    // udaddy: SIDR, then UD datagrams and replies
    let mut s = b.command(UDADDY);
    s.args(["-b", addr, "-c", "2", "-C", "4"]);
    let srv = spawn(s, "udaddy server ll");
    wait_udp_4791(srv_ip, Some(b.netns()));
    let mut c = a.command(UDADDY);
    c.args(["-s", addr, "-c", "2", "-C", "4"]);
    let c = spawn(c, "udaddy client ll").wait(T);
    c.ok("udaddy client ll");
    let s = srv.wait(T);
    s.ok("udaddy server ll");
    assert!(c.stdout.contains("data transfers complete\n"), "{c:#?}");
    assert!(s.stdout.contains("sending replies\n"), "{s:#?}");

    // rdma-perf: SEND latency (both ways), WRITE and READ bandwidth
    for (k, test) in ["send_lat", "write_bw", "read_bw"].into_iter().enumerate() {
        let port = (base_port + k).to_string();
        let mut s = b.command(RDMA_PERF);
        s.args([test, "-n", "200", "-p", &port, "--bind", addr]);
        let srv = spawn(s, "rdma-perf server ll");
        wait_udp_4791(srv_ip, Some(b.netns()));
        let mut c = a.command(RDMA_PERF);
        c.args([test, "-n", "200", "-p", &port, addr]);
        let c = spawn(c, "rdma-perf client ll").wait(T);
        c.ok(test);
        srv.wait(T).ok(test);
        let rows = c
            .stdout
            .lines()
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() >= 4 && f[0].parse::<u64>().is_ok() && f[1] == "200"
            })
            .count();
        assert_eq!(rows, 1, "{test}: one result row: {c:#?}");
    }
}

/// rping goes on through ADDR_CHANGE, as rdma-core's rping does (its event handler prints
/// `unhandled event: RDMA_CM_EVENT_ADDR_CHANGE, ignoring`): the client's neighbour entry for
/// the server is replaced by a wrong MAC and then the right one while pings run, each a
/// change of the id's path; the pings lost meanwhile are retransmitted and every ping is
/// verified.
#[test]
fn netns_rping_goes_on_through_addr_change() {
    if !require_root("netns_rping_goes_on_through_addr_change") {
        return;
    }
    let topo = topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (topo.host("a"), topo.host("b"));
    let mac_b = b.ip(&["-br", "link", "show", "eth0"]).expect("ip link");
    let mac_b = mac_b.split_whitespace().nth(2).expect("a MAC").to_owned();
    let neigh = |mac: &str| {
        a.ip(&[
            "neigh",
            "replace",
            "192.0.2.2",
            "lladdr",
            mac,
            "dev",
            "eth0",
            "nud",
            "permanent",
        ])
        .expect("ip neigh");
    };
    neigh(&mac_b);
    let mut s = b.command(RPING);
    s.args(["-s", "-a", "192.0.2.2", "-p", "7176", "-V"]);
    let srv = spawn(s, "rping server");
    wait_udp_4791("192.0.2.2".parse().unwrap(), Some(b.netns()));
    let mut c = a.command(RPING);
    c.args([
        "-c",
        "-a",
        "192.0.2.2",
        "-p",
        "7176",
        "-C",
        "4000",
        "-V",
        "-v",
    ]);
    let mut c = spawn_streamed(c, "rping client");
    // the change comes while it pings (a fixed sleep let a fast run end first)
    assert!(
        c.wait_for_stdout("rdma-ping-100:", T),
        "the client never pinged"
    );
    neigh("02:00:00:00:00:99");
    std::thread::sleep(Duration::from_millis(100));
    neigh(&mac_b);
    let c = c.wait(T);
    c.ok("rping client through ADDR_CHANGE");
    srv.wait(T).ok("rping server");
    assert_eq!(lines_with(&c.stdout, "ping data: rdma-ping-").len(), 4000);
    assert!(
        c.stderr
            .contains("unhandled event: RDMA_CM_EVENT_ADDR_CHANGE, ignoring"),
        "the client saw the change: {c:#?}"
    );
}

/// "Why was my connect rejected?" is answered on the server: an IPv6 request to an IPv4
/// wildcard listener gets REJ 28 on the wire (as Linux), and the server, run with
/// `RUST_LOG=rdmacm=info`, logs the refusal with its cause.
#[test]
fn netns_rping_server_logs_why_it_rejected() {
    if !require_root("netns_rping_server_logs_why_it_rejected") {
        return;
    }
    let topo = topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (topo.host("a"), topo.host("b"));
    let mut s = b.command(RPING);
    s.env("RUST_LOG", "rdmacm=info")
        .args(["-s", "-p", "7799", "-C", "1"]);
    let srv = spawn(s, "rping server");
    wait_udp_4791("2001:db8:1::2".parse().unwrap(), Some(b.netns()));
    let mut c = a.command(RPING);
    c.args(["-c", "-a", "2001:db8:1::2", "-p", "7799", "-C", "1"]);
    let c = spawn(c, "rping client").wait(T);
    assert_ne!(c.code, Some(0), "the client was refused: {c:#?}");
    assert!(
        c.stdout.contains("REJECTED") || c.stderr.contains("REJECTED"),
        "{c:#?}"
    );
    let s = srv.kill();
    let line = lines_with(&s.stderr, "")
        .into_iter()
        .find(|l| l.contains("connection request refused"))
        .unwrap_or_else(|| panic!("no refusal logged: {s:#?}"));
    assert!(
        line.contains("a listener holds the port but none takes this address or family")
            && line.contains("2001:db8:1::1")
            && line.contains("wire=Some(28)"),
        "{line}"
    );
}
