//! The `ibv_qp_ex` interface (`ibv_create_qp_ex` with send ops, the `ibv_wr_*` calls) over
//! our libraries: `tests/c/qp_ex.c`, compiled against the system headers (Debian's
//! libibverbs-dev), runs every builder and setter between two RC QPs and two UD QPs on `lo`
//! and checks the data, the completions, and the errors `wr_complete` reports (bad state,
//! too many SGEs, inline data too long, queue full, unsupported ops, abort) as rdma-core's
//! rxe does; `tests/c/cm_qp_ex.c` the same interface on `rdma_create_qp_ex`'s QPs.

mod support;

use std::process::Command;

#[test]
fn wr_api_builds_posts_and_reports_errors_at_wr_complete() {
    let dir = std::env::temp_dir().join(format!("rdma-cabi-qpex-{}", std::process::id()));
    let exe = support::build_c(&dir, "qp_ex", &["-libverbs"]);
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

/// `rdma_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (`tests/c/cm_qp_ex.c`): the
/// id's QP has the `ibv_wr_*` interface (a SEND one way, an RDMA WRITE back over an rdma_cm
/// connection on 127.0.0.1), and unsupported ops make no QP (`EOPNOTSUPP`).
#[test]
fn rdma_create_qp_ex_gives_send_ops() {
    let dir = std::env::temp_dir().join(format!("rdma-cabi-cmqpex-{}", std::process::id()));
    let exe = support::build_c(&dir, "cm_qp_ex", &["-lrdmacm", "-libverbs"]);
    let mut c = Command::new(&exe);
    c.arg("17595").env("LD_LIBRARY_PATH", support::lib_dir());
    let (status, text) = support::finish(support::start(c));
    std::fs::remove_dir_all(&dir).ok();
    assert!(status.success(), "{text}");
    for check in ["unsupported ops", "qp_ex", "send", "write"] {
        assert!(text.contains(&format!("ok {check}\n")), "{check}: {text}");
    }
    assert!(text.ends_with("all passed\n"), "{text}");
}
