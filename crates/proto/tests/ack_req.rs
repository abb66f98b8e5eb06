//! ACK requests: a responder acknowledges only the packets that ask (BTH AckReq), so a
//! requester asks where someone waits (signaled work requests, a filling send queue, time) and
//! probes for what nobody asked about; see `rc::ack_req`. `RDMA_SIM_SEEDS=n`: lossy seeds
//! (default 20).

use rdma_proto::rc::ack_timeout_ns;
use rdma_proto::sim::{ConnParams, Faults, RcPair};
use rdma_proto::verbs::{RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};

const LIMIT: u64 = 100_000_000_000;
const LEN: u32 = 64;

fn recv(s: &mut RcPair, on_b: bool, id: u64) {
    let n = if on_b { &mut s.b } else { &mut s.a };
    let wr = RecvWr::new(id).with_sge(Sge {
        addr: n.buf_addr + 0x8000,
        length: LEN,
        lkey: n.lkey,
    });
    n.qp.post_recv(&wr).unwrap();
}

fn send(s: &mut RcPair, from_a: bool, id: u64, signaled: bool) {
    let n = if from_a { &mut s.a } else { &mut s.b };
    let off = (id % 64) * u64::from(LEN);
    n.mem
        .bytes_mut(n.buf_addr + off, LEN as u64)
        .unwrap()
        .fill(id as u8);
    let mut wr = SendWr::new(id, SendOp::Send).with_sge(Sge {
        addr: n.buf_addr + off,
        length: LEN,
        lkey: n.lkey,
    });
    if signaled {
        wr = wr.signaled();
    }
    n.qp.post_send(&n.mem, &wr).unwrap();
}

/// Waits for one receive completion on `on_b`'s QP and checks its data.
fn take_recv(s: &mut RcPair, on_b: bool, id: u64) {
    let got = s.run_until(LIMIT, |s| {
        let n = if on_b { &s.b } else { &s.a };
        n.qp.pending_recv_completions() > 0
    });
    assert!(got, "message {id} never arrived");
    let n = if on_b { &mut s.b } else { &mut s.a };
    let c = n.qp.poll_recv_completion().unwrap();
    assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Recv));
    let data = n.mem.bytes(n.buf_addr + 0x8000, LEN as u64).unwrap();
    assert!(
        data.iter().all(|&b| b == id as u8),
        "message {id}: {data:?}"
    );
}

/// A ping-pong of `n` messages each way; returns the ACKs (responses) each side sent.
fn ping_pong(s: &mut RcPair, n: u64, signal_every: u64) -> (u64, u64) {
    for i in 0..n {
        let signaled = signal_every > 0 && (i + 1) % signal_every == 0;
        recv(s, true, i);
        recv(s, false, i);
        send(s, true, i, signaled);
        take_recv(s, true, i);
        send(s, false, i, signaled);
        take_recv(s, false, i);
    }
    assert!(s.run_until_idle(LIMIT));
    (s.b.qp.stats().responses_sent, s.a.qp.stats().responses_sent)
}

#[test]
fn an_unsignaled_ping_pong_asks_for_few_acks() {
    let mut s = RcPair::new(1, Faults::clean());
    let (b_acks, a_acks) = ping_pong(&mut s, 300, 0);
    // every message asked before: 300 ACKs each way
    assert!(b_acks <= 30 && a_acks <= 30, "ACKs {b_acks} / {a_acks}");
    for n in [&mut s.a, &mut s.b] {
        let st = n.qp.stats();
        assert_eq!(n.qp.send_queue_len(), 0, "every send retired");
        assert_eq!((st.timeouts, st.retransmitted), (0, 0), "{st:?}");
        assert_eq!(
            n.qp.poll_send_completion(),
            None,
            "unsignaled: no completion"
        );
    }
}

#[test]
fn a_signaled_send_asks_at_once() {
    let mut s = RcPair::new(2, Faults::clean());
    let (b_acks, _) = ping_pong(&mut s, 50, 1);
    assert_eq!(b_acks, 50, "one ACK per signaled message");
    let mut ids = Vec::new();
    while let Some(c) = s.a.qp.poll_send_completion() {
        assert_eq!(c.status, WcStatus::Success);
        ids.push(c.wr_id);
    }
    assert_eq!(ids, (0..50).collect::<Vec<_>>());
    assert_eq!(s.a.qp.stats().ack_probes, 0);
}

#[test]
fn a_lone_unsignaled_send_is_retired_by_a_probe_not_a_timeout() {
    let mut s = RcPair::new(3, Faults::clean());
    // the first message asks (no ACK asked for yet); the second, soon after, does not
    for i in 0..2 {
        recv(&mut s, true, i);
        send(&mut s, true, i, false);
        take_recv(&mut s, true, i);
        if i == 0 {
            assert!(s.run_until(LIMIT, |s| s.a.qp.send_queue_len() == 0));
        }
    }
    assert_eq!(
        s.a.qp.send_queue_len(),
        1,
        "the second send waits for its ACK"
    );
    let t0 = s.now;
    let timeout = ack_timeout_ns(ConnParams::default().timeout).unwrap();
    let probe_at = s.a.qp.poll_timeout().expect("a probe is due");
    assert!(
        probe_at <= t0 + timeout / 4,
        "probe at {probe_at}, sent at {t0}"
    );
    assert!(s.run_until_idle(LIMIT));
    let st = s.a.qp.stats();
    assert_eq!(s.a.qp.send_queue_len(), 0);
    assert_eq!(st.ack_probes, 1, "{st:?}");
    assert_eq!((st.timeouts, st.retransmitted), (0, 0), "{st:?}");
    assert_eq!(
        s.b.qp.stats().duplicates,
        1,
        "the probe is the last packet again"
    );
    assert_eq!(
        s.b.qp.pending_recv_completions(),
        0,
        "and it delivered nothing twice"
    );
}

#[test]
fn half_a_send_queue_of_unsignaled_sends_asks() {
    let p = ConnParams {
        max_send_wr: 8,
        ..ConnParams::default()
    };
    let mut s = RcPair::with_attrs(4, Faults::clean(), &p);
    for i in 0..8 {
        recv(&mut s, true, i);
    }
    // eight unsignaled sends posted at once: the first (no ACK asked for yet) asks, and from
    // the fourth on, with half the queue waiting, each does
    for i in 0..8 {
        send(&mut s, true, i, false);
    }
    assert!(s.run_until(LIMIT, |s| s.b.qp.pending_recv_completions() == 8));
    assert!(s.run_until_idle(LIMIT));
    assert_eq!(s.a.qp.send_queue_len(), 0);
    let st = s.a.qp.stats();
    assert_eq!((st.timeouts, st.retransmitted), (0, 0), "{st:?}");
    assert!(s.b.qp.stats().responses_sent >= 2);
}

#[test]
fn an_infinite_ack_timeout_asks_on_every_message() {
    let p = ConnParams {
        timeout: 0,
        ..ConnParams::default()
    };
    let mut s = RcPair::with_attrs(5, Faults::clean(), &p);
    let (b_acks, a_acks) = ping_pong(&mut s, 40, 0);
    assert_eq!((b_acks, a_acks), (40, 40));
    assert_eq!(s.a.qp.send_queue_len(), 0);
}

#[test]
fn unsignaled_messages_survive_loss() {
    let seeds: u64 = std::env::var("RDMA_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    for seed in 0..seeds {
        let mut s = RcPair::new(100 + seed, Faults::lossy(0.1));
        ping_pong(&mut s, 60, 7);
        for n in [&mut s.a, &mut s.b] {
            assert_eq!(n.qp.send_queue_len(), 0, "seed {seed}: all retired");
            assert_eq!(
                n.qp.state(),
                rdma_proto::verbs::QpState::Rts,
                "seed {seed}: {:?} {:?} {:?}",
                n.qp.stats(),
                n.rounds_at_error,
                n.qp.poll_send_completion()
            );
        }
        let mut ids = Vec::new();
        while let Some(c) = s.a.qp.poll_send_completion() {
            assert_eq!(c.status, WcStatus::Success, "seed {seed}");
            ids.push(c.wr_id);
        }
        assert_eq!(
            ids,
            (0..60).filter(|i| (i + 1) % 7 == 0).collect::<Vec<_>>()
        );
    }
}
