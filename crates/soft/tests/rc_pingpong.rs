//! Runs `examples/rc_pingpong` as two processes (server on 127.0.0.2, client on 127.0.0.1)
//! and checks what they print.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The example binary: cargo builds examples next to the test binaries' `deps` directory.
fn example() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?;
    let p = dir.join("examples").join("rc_pingpong");
    p.exists().then_some(p)
}

#[test]
fn two_processes_ping_pong() {
    let Some(bin) = example() else {
        eprintln!("rc_pingpong example not built (cargo test builds it): skipped");
        return;
    };
    let common = ["-p", "47962", "-U", "47961", "-s", "4096", "-n", "200"];
    let server = Command::new(&bin)
        .args(["-a", "127.0.0.2"])
        .args(common)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = Command::new(&bin)
        .args(["-a", "127.0.0.1"])
        .args(common)
        .arg("127.0.0.2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = client.wait_with_output().unwrap();
    let s = server.wait_with_output().unwrap();
    let (cout, sout) = (
        String::from_utf8_lossy(&c.stdout),
        String::from_utf8_lossy(&s.stdout),
    );
    let diag = format!(
        "client: {cout}{}\nserver: {sout}{}",
        String::from_utf8_lossy(&c.stderr),
        String::from_utf8_lossy(&s.stderr)
    );
    assert!(c.status.success() && s.status.success(), "{diag}");
    for out in [&cout, &sout] {
        assert!(out.contains("1638400 bytes in "), "{diag}");
        assert!(out.contains(" Mbit/sec"), "{diag}");
        assert!(out.contains("200 iters in "), "{diag}");
        assert!(out.contains(" usec/iter"), "{diag}");
    }
    assert!(
        cout.contains("local address:  LID 0x0000, QPN 0x"),
        "{diag}"
    );
    assert!(cout.contains("GID ::ffff:127.0.0.1"), "{diag}");
    assert!(cout.contains("remote address: LID 0x0000"), "{diag}");
    assert!(sout.contains("GID ::ffff:127.0.0.2"), "{diag}");
}
