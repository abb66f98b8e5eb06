//! The `ibv_qp_ex` interface (`ibv_create_qp_ex` with send ops, the `ibv_wr_*` calls) over
//! our libraries: `tests/c/qp_ex.c`, compiled against the system headers (Debian's
//! libibverbs-dev), runs every builder and setter between two RC QPs and two UD QPs on `lo`
//! and checks the data, the completions, and the errors `wr_complete` reports (bad state,
//! too many SGEs, inline data too long, queue full, unsupported ops, abort) as rdma-core's
//! rxe does.

mod support;

use std::process::Command;

#[test]
fn wr_api_builds_posts_and_reports_errors_at_wr_complete() {
    let dir = std::env::temp_dir().join(format!("rdma-cabi-qpex-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("qp_ex");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/qp_ex.c");
    let out = Command::new("gcc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .expect("gcc (install gcc and libibverbs-dev)");
    assert!(
        out.status.success(),
        "qp_ex.c does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut c = Command::new(&exe);
    c.env("LD_LIBRARY_PATH", support::lib_dir());
    let (status, text) = support::finish(support::start(c));
    std::fs::remove_dir_all(&dir).ok();
    assert!(status.success(), "{text}");
    for check in ["creation", "bad state", "batch", "atomics", "errors", "ud"] {
        assert!(text.contains(&format!("ok {check}\n")), "{check}: {text}");
    }
    assert!(text.ends_with("all passed\n"), "{text}");
}
