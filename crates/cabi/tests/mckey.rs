//! rdma-core's `mckey` (Debian's rdmacm-utils, unmodified) over our libraries: multicast
//! through `rdma_join_multicast_ex`, `rdma_leave_multicast`, the MULTICAST_JOIN event's UD
//! parameters (its address handle sends to the group) and the QP's attachment. A receiver
//! joins, then (once it says it joined) a sender sends; the receiver must get every
//! message and both must exit 0. On 127.0.0.1, between two namespace hosts (root), and
//! against our Rust `mckey` both ways.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::lib_dir;

const C_MCKEY: &str = "/usr/bin/mckey";

/// Our Rust `mckey` (crates/tools), from the same target directory as this test.
fn rust_mckey() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("mckey");
    assert!(
        path.exists(),
        "{} is missing: cargo build -p rdma-tools --bin mckey",
        path.display()
    );
    path
}

/// Debian's mckey (which must be installed) over our libraries, or our Rust one; on `host`
/// when given.
fn mckey(c_side: bool, host: Option<&rdma_testhosts::Host>, args: &[&str]) -> Command {
    let prog = if c_side {
        assert!(
            Path::new(C_MCKEY).exists(),
            "mckey is missing: apt-get install rdmacm-utils (CI does)"
        );
        PathBuf::from(C_MCKEY)
    } else {
        rust_mckey()
    };
    // C stdio to a file is fully buffered: line-buffered, the "joined" line is seen at once.
    let mut c = match host {
        Some(h) => h.command("stdbuf"),
        None => Command::new("stdbuf"),
    };
    c.arg("-oL")
        .arg(prog)
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir());
    c
}

/// A receiver joins `group` (bound to `bind`), a sender sends 5 messages once it has
/// joined; both succeed, the receiver having got all 5.
fn send_and_receive(
    recv: (bool, Option<&rdma_testhosts::Host>, &str),
    send: (bool, Option<&rdma_testhosts::Host>, &str),
    group: &str,
    sender_extra: &[&str],
) {
    let mut r = support::start(mckey(
        recv.0,
        recv.1,
        &["-m", group, "-b", recv.2, "-C", "5"],
    ));
    r.wait_for("mckey: joined dgid: ");
    let mut args = vec!["-m", group, "-b", send.2, "-s", "-C", "5"];
    args.extend_from_slice(sender_extra);
    let (sst, st) = support::finish(support::start(mckey(send.0, send.1, &args)));
    let (rst, rt) = support::finish(r);
    let (sok, rok) = (sst.success(), rst.success());
    assert!(sok, "sender failed:\n{st}\nreceiver:\n{rt}");
    assert!(rok, "receiver failed:\n{rt}\nsender:\n{st}");
    for t in [&st, &rt] {
        assert!(t.contains("data transfers complete"), "{t}");
        assert!(t.contains("return status 0"), "{t}");
    }
    // The group as the event's address handle has it: the group's v4-mapped GID.
    let mapped = format!("joined dgid: ::ffff:{group} ");
    assert!(group.contains(':') || st.contains(&mapped), "{st}");
}

#[test]
fn c_mckey_on_loopback() {
    send_and_receive(
        (true, None, "127.0.0.1"),
        (true, None, "127.0.0.1"),
        "239.1.32.1",
        &[],
    );
    // a send-only join without loopback: rdma_create_qp_ex with
    // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER
    send_and_receive(
        (true, None, "127.0.0.1"),
        (true, None, "127.0.0.1"),
        "239.1.32.2",
        &["-o", "-l"],
    );
}

#[test]
fn c_mckey_against_rust_mckey_both_ways() {
    send_and_receive(
        (false, None, "127.0.0.1"),
        (true, None, "127.0.0.1"),
        "239.1.32.3",
        &[],
    );
    send_and_receive(
        (true, None, "127.0.0.1"),
        (false, None, "127.0.0.1"),
        "239.1.32.4",
        &[],
    );
}

#[test]
fn c_mckey_between_two_namespace_hosts() {
    if !rdma_testhosts::require_root("c_mckey_between_two_namespace_hosts") {
        return;
    }
    let topo = rdma_testhosts::topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (&topo.hosts()[0], &topo.hosts()[1]);
    send_and_receive(
        (true, Some(b), "192.0.2.2"),
        (true, Some(a), "192.0.2.1"),
        "239.1.32.5",
        &[],
    );
    // C receiver, Rust sender, across the link
    send_and_receive(
        (true, Some(a), "192.0.2.1"),
        (false, Some(b), "192.0.2.2"),
        "239.1.32.6",
        &[],
    );
}
