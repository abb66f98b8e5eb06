//! rping under `RDMACM_HA` (issue 11) between two namespace hosts with two links (root;
//! SKIPPED otherwise): with `align`, moving the client host's route to the server from
//! h0 to h1 ends the client with a message saying why; a malformed value is refused
//! naming the variable.

mod procs;

use std::time::Duration;

use procs::{spawn, spawn_streamed, wait_udp_4791};
use rdma_testhosts::{require_root, topologies, Host};

const RPING: &str = env!("CARGO_BIN_EXE_rping");
const T: Duration = Duration::from_secs(30);

fn ip(h: &Host, args: &[&str]) -> String {
    h.ip(args).unwrap_or_else(|e| panic!("ip {args:?}: {e}"))
}

#[test]
fn rping_align_exits_saying_why_when_the_route_moves() {
    if !require_root("rping_align_exits_saying_why_when_the_route_moves") {
        return;
    }
    let t = topologies::two_hosts_two_links_builder()
        .route("h", "192.0.2.2/32 dev h0 metric 10")
        .build()
        .expect("topology");
    let (h, b) = (t.host("h"), t.host("b"));
    for (x, d) in [(h, "h0"), (h, "h1"), (b, "b0"), (b, "b1")] {
        x.wait_carrier(d);
    }
    for d in ["all", "default", "b0", "b1"] {
        let _ = b.set_sysctl(&format!("net/ipv4/conf/{d}/rp_filter"), "0");
    }

    // A malformed value: refused before anything happens, naming the variable.
    let mut c = h.command(RPING);
    c.env("RDMACM_HA", "sideways")
        .args(["-c", "-a", "192.0.2.2", "-C", "1"]);
    let out = spawn(c, "rping bad RDMACM_HA").wait(T);
    assert_ne!(out.code, Some(0), "{out:#?}");
    assert!(out.stderr.contains("RDMACM_HA"), "{out:#?}");

    let mut s = b.command(RPING);
    s.args(["-s", "-a", "192.0.2.2"]);
    let srv = spawn(s, "rping server");
    wait_udp_4791("192.0.2.2".parse().unwrap(), Some(b.netns()));
    let mut c = h.command(RPING);
    c.env("RDMACM_HA", "align")
        .args(["-c", "-a", "192.0.2.2", "-C", "0", "-S", "64", "-V"]);
    let cli = spawn(c, "rping client");
    // Let it connect and ping over h0 (a wait, not a measurement; no -v: nobody reads
    // the pipes until the end).
    std::thread::sleep(Duration::from_secs(2));
    ip(
        h,
        &[
            "route",
            "replace",
            "192.0.2.2/32",
            "via",
            "198.51.100.2",
            "dev",
            "h1",
        ],
    );
    let out = cli.wait(T);
    // The server prints the DREQ's DISCONNECTED when it comes (it then waits for the next
    // client): give it time before stopping it.
    std::thread::sleep(Duration::from_secs(2));
    let srv = srv.kill();
    assert_ne!(out.code, Some(0), "{out:#?}");
    assert!(
        out.stderr.contains("connection ended by RDMACM_HA=align")
            && out.stderr.contains("route to the peer moved"),
        "{out:#?}"
    );
    assert!(
        srv.stderr.contains("server DISCONNECT EVENT"),
        "server: {:?} (code {:?})",
        srv.stderr,
        srv.code
    );
}

/// `RDMACM_DEVICES` and `RDMACM_HA=migrate` alone, on both ends (the mission's S10): a
/// verifying rping whose client host loses h0 midway finishes every iteration, over h1.
#[test]
fn rping_migrate_survives_the_link_going_down() {
    if !require_root("rping_migrate_survives_the_link_going_down") {
        return;
    }
    let t = topologies::two_hosts_two_links_builder()
        .route("h", "192.0.2.2/32 dev h0 metric 10")
        .route("h", "192.0.2.2/32 via 198.51.100.2 dev h1 metric 100")
        .build()
        .expect("topology");
    let (h, b) = (t.host("h"), t.host("b"));
    for (x, d) in [(h, "h0"), (h, "h1"), (b, "b0"), (b, "b1")] {
        x.wait_carrier(d);
    }
    for (x, ifs) in [(h, ["h0", "h1"]), (b, ["b0", "b1"])] {
        for d in ["all", "default", ifs[0], ifs[1]] {
            let _ = x.set_sysctl(&format!("net/ipv4/conf/{d}/rp_filter"), "0");
        }
    }
    let count = std::env::var("RDMA_HA_PINGS").unwrap_or_else(|_| "3000".into());
    let mut s = b.command(RPING);
    s.env("RDMACM_DEVICES", "hb=b0+b1")
        .env("RDMACM_HA", "migrate")
        .args(["-s", "-a", "192.0.2.2", "-C", &count, "-S", "200", "-V"]);
    let srv = spawn(s, "rping server");
    wait_udp_4791("192.0.2.2".parse().unwrap(), Some(b.netns()));
    let mut c = h.command(RPING);
    c.env("RDMACM_DEVICES", "ha=h0+h1")
        .env("RDMACM_HA", "migrate")
        .args([
            "-c",
            "-a",
            "192.0.2.2",
            "-C",
            &count,
            "-S",
            "200",
            "-V",
            "-v",
        ]);
    let mut cli = spawn_streamed(c, "rping client");
    // The link goes down while it pings over h0 (a fixed sleep let a fast run end first).
    let k = (count.parse::<usize>().unwrap_or(3000) / 10).min(100);
    assert!(
        cli.wait_for_stdout(&format!("rdma-ping-{k}:"), Duration::from_secs(30)),
        "the client never pinged"
    );
    ip(h, &["link", "set", "h0", "down"]);
    let out = cli.wait(Duration::from_secs(120));
    assert_eq!(out.code, Some(0), "client: {out:#?}");
    // The migration happened under the run (the CM's report of it, which rping ignores as
    // rdma-core's does), and it went on.
    assert!(
        out.stderr
            .contains("unhandled event: RDMA_CM_EVENT_ADDR_CHANGE, ignoring"),
        "client: {out:#?}"
    );
    let srv = srv.wait(Duration::from_secs(120));
    assert_eq!(srv.code, Some(0), "server: {srv:#?}");
}
