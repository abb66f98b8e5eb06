//! A SEND that arrives before its receive (`tests/c/rnr_wait.c`, compiled against the
//! system headers): the responder answers RNR NAK and the requester's SEND completes once
//! the receive is posted, with its data, round after round, over an rdma_cm connection on
//! 127.0.0.1 between two processes over our libraries. The same program is the by-hand
//! check against Linux rxe (docs/CABI.md).

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_send_waits_out_receiver_not_ready_and_completes() {
    let dir = std::env::temp_dir().join(format!("rdma-cabi-rnr-{}", std::process::id()));
    let exe = support::build_c(&dir, "rnr_wait", &["-lrdmacm", "-libverbs"]);
    let port = 17596u16;
    let run = |args: &[&str]| {
        let mut c = Command::new(&exe);
        c.args(args).env("LD_LIBRARY_PATH", support::lib_dir());
        support::start(c)
    };
    // the server posts each receive 100 ms after the last one completed: the client's
    // next SEND, sent at once, finds none
    let s = run(&["s", "127.0.0.1", &port.to_string(), "4", "100"]);
    let end = Instant::now() + support::LIMIT;
    while !support::cm_listening(None, port) {
        assert!(Instant::now() < end, "the server never listened on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (cs, ct) = support::finish(run(&["c", "127.0.0.1", &port.to_string(), "4"]));
    let (ss, st) = support::finish(s);
    std::fs::remove_dir_all(&dir).ok();
    assert!(cs.success() && ss.success(), "client:\n{ct}\nserver:\n{st}");
    for r in 0..4 {
        let want = format!("round {r} ok ");
        assert!(
            ct.contains(&want) && st.contains(&want),
            "round {r}:\n{ct}\n{st}"
        );
    }
    assert!(ct.ends_with("all passed\n") && st.ends_with("all passed\n"));
}
