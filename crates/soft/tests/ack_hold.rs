//! A busy poller's ACK waits for its next send or poll (`runtime/ack_hold.rs`); one that
//! stops polling right after the receive must not leave its peer without the ACK: the
//! progress engine flushes it well inside the peer's ACK timeout, so the peer's SEND
//! completes without a single retransmission.

mod common;

use std::time::Duration;

use common::{connect_with, poll_within, ConnOpts, Side};
use rdma_soft::verbs::*;

const IP_A: &str = "127.0.91.1";
const IP_B: &str = "127.0.91.2";
const EXCHANGES: usize = 20;
const LIMIT: Duration = Duration::from_secs(20);

fn poll_until(cq: &CompletionQueue, what: &str) -> Completion {
    let c = poll_within(cq, LIMIT, what);
    assert_eq!(c.status, WcStatus::Success, "{what}: {c:?}");
    c
}

#[test]
fn a_poller_that_stops_after_a_receive_still_acknowledges_it() {
    let (a, b) = (Side::new(IP_A, 4096, None), Side::new(IP_B, 4096, None));
    // a 67 ms ACK timeout (14): long enough for its ACKs to be held
    let o = ConnOpts {
        timeout: 14,
        ..ConnOpts::default()
    };
    connect_with(&a.dev, &a.qp, b.qp.qpn(), 0x20, 0x10, b.gid, &o);
    connect_with(&b.dev, &b.qp, a.qp.qpn(), 0x10, 0x20, a.gid, &o);
    for i in 0..EXCHANGES {
        let payload = [i as u8 ^ 0x5A; 64];
        b.qp.post_recv(&RecvWr::new(i as u64).with_sge(b.mr.sge(0, 4096).unwrap()))
            .unwrap();
        // B busy-polls first, so that its engine leaves the device to it
        for _ in 0..2000 {
            assert!(b.cq.poll_one().is_none());
        }
        a.mr.write(0, &payload).unwrap();
        a.qp.post_send(
            &SendWr::new(i as u64, SendOp::Send)
                .with_sge(a.mr.sge(0, 64).unwrap())
                .signaled(),
        )
        .unwrap();
        let r = poll_until(&b.cq, "receive");
        assert_eq!((r.opcode, r.byte_len), (WcOpcode::Recv, 64));
        let mut got = [0u8; 64];
        b.mr.read(0, &mut got).unwrap();
        assert_eq!(got, payload);
        // B stops polling now; only its engine can send the ACK it may hold
        let s = poll_until(&a.cq, "send completion");
        assert_eq!((s.opcode, s.wr_id), (WcOpcode::Send, i as u64));
    }
    let held = b.dev.runtime_stats().acks_held;
    assert!(
        held > 0,
        "no exchange held its ACK: the test did not test it"
    );
    // A never waited out an ACK B held: no ACK timeout, and at most a stray tail-loss
    // probe (5 ms: a scheduling hiccup on a loaded machine); an ACK held until A asks
    // again would cost a probe in every exchange that held one.
    let t = a.qp.transport_stats().unwrap();
    assert_eq!(
        t.timeouts, 0,
        "A waited for an ACK B held ({held} holds): {t:?}"
    );
    assert_eq!(t.retransmitted, t.early_retransmits, "{t:?}");
    assert!(
        t.tail_probes <= 1 + held / 10,
        "A asked again for ACKs B held ({held} holds): {t:?}"
    );
}
