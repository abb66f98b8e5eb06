//! rdma-core's `mckey` (Debian's rdmacm-utils, unmodified) over our libraries: multicast
//! through `rdma_join_multicast_ex`, `rdma_leave_multicast`, the MULTICAST_JOIN event's UD
//! parameters (its address handle sends to the group) and the QP's attachment. A receiver
//! joins, then (once it says it joined) a sender sends; the receiver must get every
//! message and both must exit 0. On 127.0.0.1, between two namespace hosts (root), and
//! against our Rust `mckey` both ways.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::lib_dir;

/// How long one program may run.
const LIMIT: Duration = Duration::from_secs(60);

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

/// A running program whose output goes to a file.
struct Run {
    child: Child,
    out: PathBuf,
}

impl Run {
    fn start(mut c: Command) -> Run {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let out =
            std::env::temp_dir().join(format!("rdma-cabi-mckey-{}-{n}.out", std::process::id()));
        let f = std::fs::File::create(&out).unwrap();
        let child = c
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn");
        Run { child, out }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.out).unwrap_or_default()).into_owned()
    }

    /// Waits until the output has `line` (the program still running), or fails.
    fn wait_for(&mut self, line: &str) {
        let end = Instant::now() + LIMIT;
        while !self.text().contains(line) {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "exited before {line:?}:\n{}",
                self.text()
            );
            assert!(Instant::now() < end, "no {line:?} in\n{}", self.text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the exit (killed past LIMIT): success and output.
    fn finish(mut self) -> (bool, String) {
        let end = Instant::now() + LIMIT;
        while self.child.try_wait().unwrap().is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let ok = self.child.wait().unwrap().success();
        (ok, self.text())
    }
}

/// A failed test leaves no program running (mckey's receiver polls its CQ without end).
impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
    }
}

/// A receiver joins `group` (bound to `bind`), a sender sends 5 messages once it has
/// joined; both succeed, the receiver having got all 5.
fn send_and_receive(
    recv: (bool, Option<&rdma_testhosts::Host>, &str),
    send: (bool, Option<&rdma_testhosts::Host>, &str),
    group: &str,
    sender_extra: &[&str],
) {
    let mut r = Run::start(mckey(
        recv.0,
        recv.1,
        &["-m", group, "-b", recv.2, "-C", "5"],
    ));
    r.wait_for("mckey: joined dgid: ");
    let mut args = vec!["-m", group, "-b", send.2, "-s", "-C", "5"];
    args.extend_from_slice(sender_extra);
    let (sok, st) = Run::start(mckey(send.0, send.1, &args)).finish();
    let (rok, rt) = r.finish();
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
