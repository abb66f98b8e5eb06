//! Runs `examples/rc_pingpong` as two processes (server on 127.0.0.2, client on 127.0.0.1)
//! and checks what they print.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The example binary: cargo builds examples next to the test binaries' `deps` directory.
/// `cargo test` builds it; `cargo test --test rc_pingpong` does not, so then this builds it
/// (same cargo, target directory and profile) rather than skip the test.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>");
    let p = profile_dir.join("examples").join("rc_pingpong");
    if !p.exists() {
        let target_dir = profile_dir.parent().expect("target directory");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", "rdma-soft", "--example", "rc_pingpong"])
            .arg("--target-dir")
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("run cargo build for the example");
        assert!(st.success(), "building the rc_pingpong example failed");
    }
    assert!(p.exists(), "{} missing after the build", p.display());
    p
}

#[test]
fn two_processes_ping_pong() {
    let bin = example();
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
