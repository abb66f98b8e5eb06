//! Idle QPs cost a progress round nothing: with thousands of connected, idle QPs on each
//! device, a ping-pong on one pair services a handful of QPs per message
//! (`RuntimeStats::qp_services`), not every QP, and a timer of an idle QP still fires.
//!
//! `RDMA_IDLE_QPS` (default 2000) idle QPs per device.

mod common;

use common::{connect, Side};
use rdma_soft::verbs::*;

const MESSAGES: u64 = 200;

fn idle_qps() -> usize {
    std::env::var("RDMA_IDLE_QPS")
        .ok()
        .map(|v| v.parse().expect("RDMA_IDLE_QPS: a number"))
        .unwrap_or(2000)
}

fn qp(s: &Side) -> QueuePair {
    let mut init = QpInitAttr::rc(&s.cq, &s.cq);
    init.cap.max_recv_wr = 4;
    init.cap.max_send_wr = 4;
    s.pd.create_qp(&init).unwrap()
}

#[test]
fn a_round_services_the_qps_with_work_not_every_qp() {
    let (a, b) = (
        Side::new("127.0.92.1", 4096, None),
        Side::new("127.0.92.2", 4096, None),
    );
    connect(&a, &b);
    let n = idle_qps();
    let mut idle = Vec::with_capacity(n);
    for _ in 0..n {
        let (x, y) = (qp(&a), qp(&b));
        x.connect(y.qpn(), 1, 1, b.gid).unwrap();
        y.connect(x.qpn(), 1, 1, a.gid).unwrap();
        idle.push((x, y));
    }
    let before = (a.dev.runtime_stats(), b.dev.runtime_stats());
    for i in 0..MESSAGES {
        b.qp.post_recv(&RecvWr::new(i).with_sge(b.mr.sge(0, 64).unwrap()))
            .unwrap();
        a.mr.write(0, &i.to_le_bytes()).unwrap();
        a.qp.post_send(
            &SendWr::new(i, SendOp::Send)
                .with_sge(a.mr.sge(0, 8).unwrap())
                .signaled(),
        )
        .unwrap();
        let r = b.next_ok();
        assert_eq!((r.opcode, r.byte_len), (WcOpcode::Recv, 8));
        let mut got = [0u8; 8];
        b.mr.read(0, &mut got).unwrap();
        assert_eq!(u64::from_le_bytes(got), i);
        assert_eq!(a.next_ok().opcode, WcOpcode::Send);
    }
    let after = (a.dev.runtime_stats(), b.dev.runtime_stats());
    let services =
        (after.0.qp_services - before.0.qp_services) + (after.1.qp_services - before.1.qp_services);
    let per_message = services as f64 / MESSAGES as f64;
    eprintln!("{n} idle QPs per device: {per_message:.1} QP services per message");
    // Both devices, a post, a packet each way, and the engine's look: a few, never n.
    assert!(
        per_message < 20.0,
        "{per_message} QP services per message with {n} idle QPs"
    );

    // An idle QP's timer still fires: a SEND to a QP whose peer is gone retries and ends
    // in RetryExcErr (the heap, not a scan, finds its deadline).
    let (x, y) = idle.pop().unwrap();
    drop(y);
    a.mr.write(0, b"x").unwrap();
    x.post_send(
        &SendWr::new(7, SendOp::Send)
            .with_sge(a.mr.sge(0, 1).unwrap())
            .signaled(),
    )
    .unwrap();
    let c = a.next();
    assert_eq!((c.wr_id, c.status), (7, WcStatus::RetryExcErr));
}
