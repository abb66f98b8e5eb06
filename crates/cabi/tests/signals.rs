//! Signals during the blocking calls, as rdma-core's blocking `read` of the fd behind each:
//! a handler installed without `SA_RESTART` ends the wait with -1 / `EINTR` (qperf ends its
//! tests with such a `SIGALRM` and expects the blocked call to return), one with
//! `SA_RESTART` lets it wait on. One C program per call (`tests/c/*_signal.c`; a channel
//! destroyed under a waiter: `*_destroy.c`; shared code: `signal_util.h`), compiled
//! against the system headers. A thread of each program checks, 2 s after a signal without
//! `SA_RESTART`, that the call has returned, and, after one with it, that it still waits:
//! a library that keeps waiting, or one that ends every wait, fails in seconds.

mod support;

use std::process::Command;

/// Builds and runs `tests/c/<name>.c` linked with `libs`; the run's output must show each
/// of `checks` (`ok <check>`) and end with `all passed`.
fn run(name: &str, libs: &[&str], checks: &[&str]) {
    run_with(name, libs, checks, |_| {});
}

/// [`run`], with `more` adding the program's arguments and environment.
fn run_with(name: &str, libs: &[&str], checks: &[&str], more: impl FnOnce(&mut Command)) {
    let dir = std::env::temp_dir().join(format!("rdma-cabi-{name}-{}", std::process::id()));
    let exe = support::build_c(&dir, name, libs);
    let mut c = Command::new(&exe);
    c.env("LD_LIBRARY_PATH", support::lib_dir());
    more(&mut c);
    let (status, text) = support::finish(support::start(c));
    std::fs::remove_dir_all(&dir).ok();
    assert!(status.success(), "{name}: {text}");
    for check in checks {
        assert!(text.contains(&format!("ok {check}\n")), "{check}: {text}");
    }
    assert!(text.ends_with("all passed\n"), "{text}");
}

/// `ibv_get_cq_event` (qperf's server waits there for its SIGALRM; before, our wait went on
/// and qperf's client timed out waiting for the results): EINTR without `SA_RESTART`; with
/// it, still waiting after the signal ran.
#[test]
fn ibv_get_cq_event_is_interrupted_by_a_signal() {
    run(
        "cq_event_signal",
        &["-libverbs", "-lpthread"],
        &["eintr", "restart"],
    );
}

/// `rdma_get_cm_event`: EINTR without `SA_RESTART`; with it, the event that comes after
/// the signal (an address resolution started then) ends the wait.
#[test]
fn rdma_get_cm_event_is_interrupted_by_a_signal() {
    run(
        "cm_event_signal",
        &["-lrdmacm", "-libverbs", "-lpthread"],
        &["eintr", "restart"],
    );
}

/// `ibv_get_async_event`: EINTR without `SA_RESTART`; with it, still waiting after the
/// signal ran.
#[test]
fn ibv_get_async_event_is_interrupted_by_a_signal() {
    run(
        "async_event_signal",
        &["-libverbs", "-lpthread"],
        &["eintr", "restart"],
    );
}

/// `ibv_destroy_comp_channel` under a thread blocked in `ibv_get_cq_event` on the channel
/// (`tests/c/cq_event_destroy.c`): EBUSY while a CQ is attached; after the destroy a
/// restarted wait fails with EBADF, as rdma-core's restarted `read` of the closed fd;
/// `ibv_destroy_cq` is EBUSY while a QP uses the CQ, and waits for the ack of an event it
/// reported (before: it freed the CQ at once, both times);
/// and rounds of an event arriving at the destroy end with the event or EINTR. glibc fills
/// freed memory (`MALLOC_PERTURB_`, no tcache), so that a waiter reading the freed channel
/// crashes: the library before the fix failed both checks (SIGSEGV, or a waiter spinning on
/// the freed channel). `RDMA_CABI_DESTROY_ROUNDS` rounds (default 1000; the full run 10000,
/// about 35 s: the soft device hands out 2^14 CQ numbers per process and reuses none, so
/// past about 16,000 rounds `ibv_create_cq` fails with ENOMEM).
#[test]
fn ibv_destroy_comp_channel_under_a_waiter() {
    let rounds = std::env::var("RDMA_CABI_DESTROY_ROUNDS").unwrap_or_else(|_| "1000".into());
    run_with(
        "cq_event_destroy",
        &["-libverbs", "-lpthread"],
        &["ebusy", "closed", "cq_in_use", "acked", "race"],
        |c| {
            c.arg(rounds)
                .env("MALLOC_PERTURB_", "85")
                .env("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0");
        },
    );
}

/// `rdma_destroy_event_channel` under a thread blocked in `rdma_get_cm_event` on the
/// channel (`tests/c/cm_event_destroy.c`): the wait goes on; restarted after the destroy it
/// fails with EBADF (before: it went on waiting, killed after 5 s of signals), and the
/// destroyed channel is EINVAL.
#[test]
fn rdma_destroy_event_channel_under_a_waiter() {
    run_with(
        "cm_event_destroy",
        &["-lrdmacm", "-libverbs", "-lpthread"],
        &["closed", "stale"],
        |c| {
            c.env("MALLOC_PERTURB_", "85")
                .env("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0");
        },
    );
}
