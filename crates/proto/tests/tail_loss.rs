//! Early retransmission (`rc::probe`): a lost tail packet, ACK, READ response or atomic ACK is
//! resent by the probe timer, fitted to the measured round trip, long before the local ACK
//! timeout; a clean link with delay and jitter resends nothing; the give-up bound
//! (`retry_cnt + 1` ACK timeouts, then `RetryExcErr`) is what it was. Virtual time
//! throughout (the simulator's clock): no wall-clock figure is asserted.
//! `RDMA_SIM_SEEDS=n`: seeds of the clean-link tests (default 20).

use rdma_proto::psn::psn_add;
use rdma_proto::rc::{ack_timeout_ns, RcStats, PROBE_FLOOR_NS};
use rdma_proto::sim::{ConnParams, Faults, RcPair};
use rdma_proto::verbs::{QpState, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};

/// A CM-made QP's ACK timeout (Linux's default: exponent 17, 537 ms).
const TIMEOUT: u8 = 17;
const LIMIT: u64 = 100_000_000_000;

fn seeds() -> u64 {
    std::env::var("RDMA_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

/// A link of 20 µs one way (plus up to 10 µs), in order.
fn pair(seed: u64) -> RcPair {
    let faults = Faults {
        delay_ns: 20_000,
        jitter_ns: 10_000,
        ..Faults::clean()
    };
    let p = ConnParams {
        timeout: TIMEOUT,
        ..ConnParams::default()
    };
    let mut s = RcPair::with_attrs(seed, faults, &p);
    s.in_order = true;
    s
}

/// Posts a receive of `len` at B's buffer start.
fn recv_at_b(s: &mut RcPair, id: u64, len: u32) {
    let wr = RecvWr::new(id).with_sge(Sge {
        addr: s.b.buf_addr,
        length: len,
        lkey: s.b.lkey,
    });
    s.b.qp.post_recv(&wr).unwrap();
}

/// Posts `op` of `len` bytes at A's buffer start (filled with `fill`), signaled; returns
/// the PSN of its first packet.
fn post(s: &mut RcPair, id: u64, op: SendOp, len: u32, fill: u8) -> u32 {
    let psn = s.a.qp.attr().sq_psn;
    s.a.mem
        .bytes_mut(s.a.buf_addr, u64::from(len))
        .unwrap()
        .fill(fill);
    let wr = SendWr::new(id, op)
        .with_sge(Sge {
            addr: s.a.buf_addr,
            length: len,
            lkey: s.a.lkey,
        })
        .signaled();
    s.a.qp.post_send(&s.a.mem, &wr).unwrap();
    psn
}

/// Runs until A's next send completion; returns it and the virtual time it took.
fn complete(s: &mut RcPair) -> (rdma_proto::verbs::Completion, u64) {
    let t0 = s.now;
    let mut got = None;
    let done = s.run_until(LIMIT, |s| {
        got = got.or_else(|| s.a.qp.poll_send_completion());
        got.is_some()
    });
    assert!(done, "no completion; A {:?}", s.a.qp.stats());
    (got.unwrap(), s.now - t0)
}

/// Ten signaled SENDs, so A's round trip is measured; returns A's counters after them.
fn warm_up(s: &mut RcPair) -> RcStats {
    for i in 0..10 {
        recv_at_b(s, 100 + i, 64);
        post(s, 100 + i, SendOp::Send, 64, i as u8);
        let (c, _) = complete(s);
        assert_eq!(c.status, WcStatus::Success);
        assert_eq!(
            s.b.qp.poll_recv_completion().unwrap().status,
            WcStatus::Success
        );
    }
    let rtt = s.a.qp.srtt_ns().expect("round trip measured");
    assert!((40_000..=60_000).contains(&rtt), "srtt {rtt} ns");
    let st = s.a.qp.stats();
    assert_eq!((st.retransmitted, st.tail_probes), (0, 0), "{st:?}");
    st
}

/// What A's probes and timer did since `before`, and how long recovery took: it must be
/// the probe's (within a few probe floors), never a timeout.
fn assert_probed(s: &RcPair, before: &RcStats, took: u64) -> RcStats {
    let st = s.a.qp.stats();
    assert_eq!(st.timeouts, before.timeouts, "an ACK timeout ran: {st:?}");
    assert!(st.tail_probes > before.tail_probes, "no probe: {st:?}");
    assert!(st.early_retransmits > before.early_retransmits, "{st:?}");
    assert!(
        took < 4 * PROBE_FLOOR_NS && took < ack_timeout_ns(TIMEOUT).unwrap() / 10,
        "recovery took {took} ns"
    );
    st
}

#[test]
fn a_lost_last_request_packet_is_resent_by_the_probe() {
    let mut s = pair(1);
    let before = warm_up(&mut s);
    recv_at_b(&mut s, 1, 4096);
    let psn = post(&mut s, 1, SendOp::Send, 3000, 0xA5);
    s.drop_once(true, psn_add(psn, 2));
    let (c, took) = complete(&mut s);
    assert_eq!(c.status, WcStatus::Success);
    let st = assert_probed(&s, &before, took);
    assert_eq!(st.tail_probes - before.tail_probes, 1, "{st:?}");
    assert_eq!(st.early_retransmits - before.early_retransmits, 1, "{st:?}");
    let r = s.b.qp.poll_recv_completion().unwrap();
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, 3000));
    assert!(s.b.qp.poll_recv_completion().is_none());
    assert!(s
        .b
        .mem
        .bytes(s.b.buf_addr, 3000)
        .unwrap()
        .iter()
        .all(|&b| b == 0xA5));
}

#[test]
fn a_lost_ack_is_asked_again_and_the_duplicate_taken_once() {
    let mut s = pair(2);
    let before = warm_up(&mut s);
    let dups = s.b.qp.stats().duplicates;
    recv_at_b(&mut s, 1, 4096);
    let psn = post(&mut s, 1, SendOp::Send, 1000, 0x3C);
    s.drop_once(false, psn);
    let (c, took) = complete(&mut s);
    assert_eq!(c.status, WcStatus::Success);
    assert_probed(&s, &before, took);
    assert_eq!(
        s.b.qp.stats().duplicates,
        dups + 1,
        "the probe was a duplicate"
    );
    let r = s.b.qp.poll_recv_completion().unwrap();
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, 1000));
    assert!(s.b.qp.poll_recv_completion().is_none(), "received twice");
}

/// A gap in the middle and its NAK both lost: the first probe (the last packet again) meets
/// a responder that NAKs a gap once; the next probe goes back to the oldest PSN.
#[test]
fn a_lost_middle_packet_and_its_nak_are_recovered_by_the_second_probe() {
    let mut s = pair(3);
    let before = warm_up(&mut s);
    recv_at_b(&mut s, 1, 4096);
    let psn = post(&mut s, 1, SendOp::Send, 4000, 0x77);
    s.drop_once(true, psn_add(psn, 1));
    s.drop_once(false, psn_add(psn, 1));
    let (c, took) = complete(&mut s);
    assert_eq!(c.status, WcStatus::Success);
    let st = assert_probed(&s, &before, took);
    assert_eq!(st.tail_probes - before.tail_probes, 2, "{st:?}");
    let r = s.b.qp.poll_recv_completion().unwrap();
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, 4000));
    assert!(s
        .b
        .mem
        .bytes(s.b.buf_addr, 4000)
        .unwrap()
        .iter()
        .all(|&b| b == 0x77));
}

#[test]
fn a_lost_read_request_or_response_tail_is_asked_again() {
    for (what, from_a, k) in [("request", true, 0), ("response tail", false, 3)] {
        let mut s = pair(4);
        let before = warm_up(&mut s);
        let src = s.b.buf_addr + 0x1_0000;
        let data: Vec<u8> = (0..4000u32).map(|i| (i * 7 + 3) as u8).collect();
        s.b.mem.bytes_mut(src, 4000).unwrap().copy_from_slice(&data);
        let op = SendOp::RdmaRead {
            remote_addr: src,
            rkey: s.b.rkey,
        };
        let psn = post(&mut s, 1, op, 4000, 0);
        s.drop_once(from_a, psn_add(psn, k));
        let (c, took) = complete(&mut s);
        assert_eq!(
            (c.status, c.opcode),
            (WcStatus::Success, WcOpcode::RdmaRead),
            "{what}"
        );
        assert_probed(&s, &before, took);
        assert_eq!(
            s.a.mem.bytes(s.a.buf_addr, 4000).unwrap(),
            &data[..],
            "{what}"
        );
    }
}

/// The atomic's ACK lost: the probe resends the atomic, the responder answers from its
/// replay of the first execution (the add is applied once).
#[test]
fn a_lost_atomic_ack_is_replayed_not_executed_twice() {
    let mut s = pair(5);
    let before = warm_up(&mut s);
    let counter = s.b.buf_addr + 0x2_0000;
    s.b.mem
        .bytes_mut(counter, 8)
        .unwrap()
        .copy_from_slice(&40u64.to_ne_bytes());
    let op = SendOp::AtomicFetchAndAdd {
        remote_addr: counter,
        rkey: s.b.rkey,
        add: 2,
    };
    let psn = post(&mut s, 1, op, 8, 0);
    s.drop_once(false, psn);
    let (c, took) = complete(&mut s);
    assert_eq!(
        (c.status, c.opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    assert_probed(&s, &before, took);
    let got = |m: &rdma_proto::memory::InMemoryTable, a| {
        u64::from_ne_bytes(m.bytes(a, 8).unwrap().try_into().unwrap())
    };
    assert_eq!(got(&s.b.mem, counter), 42, "added once");
    assert_eq!(got(&s.a.mem, s.a.buf_addr), 40, "the original value");
    assert!(s.b.qp.stats().duplicates > 0);
}

/// A dead link: probes resend early, but charge no retry, and the QP fails with
/// `RetryExcErr` exactly `retry_cnt + 1` ACK timeouts after its last progress, as before.
#[test]
fn the_give_up_bound_is_unchanged() {
    for retry_cnt in [0u8, 3, 7] {
        let p = ConnParams {
            timeout: 14, // 67 ms
            retry_cnt,
            ..ConnParams::default()
        };
        let mut s = RcPair::with_attrs(
            6,
            Faults {
                delay_ns: 20_000,
                ..Faults::clean()
            },
            &p,
        );
        recv_at_b(&mut s, 1, 64);
        post(&mut s, 1, SendOp::Send, 64, 1);
        assert_eq!(complete(&mut s).0.status, WcStatus::Success);
        s.faults.loss = 1.0;
        let t0 = s.now;
        post(&mut s, 2, SendOp::Send, 64, 2);
        let (c, took) = complete(&mut s);
        assert_eq!(c.status, WcStatus::RetryExcErr);
        assert_eq!(s.a.qp.state(), QpState::Err);
        let st = s.a.qp.stats();
        assert_eq!(st.timeouts, u64::from(retry_cnt) + 1, "{st:?}");
        assert!(st.tail_probes > 0, "no probe before the timeout: {st:?}");
        let bound = (u64::from(retry_cnt) + 1) * ack_timeout_ns(14).unwrap();
        // the first send leaves at t0 (the post), the error comes with the last expiry
        assert_eq!(
            took, bound,
            "retry_cnt {retry_cnt}: failed after {took} ns, t0 {t0}"
        );
    }
}

/// SENDs of 64 bytes from A, each answered late: B does not run for `late_ns` after the
/// SEND leaves (its engine not scheduled). Returns A's counters after them.
fn late_answers(s: &mut RcPair, n: u64, late_ns: u64) -> RcStats {
    for i in 0..n {
        recv_at_b(s, 1000 + i, 64);
        post(s, 1000 + i, SendOp::Send, 64, i as u8);
        let until = s.now + late_ns;
        s.pause(true, until);
        let (c, took) = complete(s);
        assert_eq!(c.status, WcStatus::Success, "message {i}");
        assert!(
            took >= late_ns,
            "message {i} completed before B ran: {took} ns"
        );
        assert_eq!(
            s.b.qp.poll_recv_completion().map(|r| r.status),
            Some(WcStatus::Success),
            "message {i} received once"
        );
        assert!(s.b.qp.poll_recv_completion().is_none(), "message {i} twice");
    }
    s.a.qp.stats()
}

/// A clean link whose peer answers late by more than the probe floor (B paused 7 ms after
/// each SEND, the floor 5 ms): the first late answer draws one probe, which B acknowledges
/// as the duplicate it is after acknowledging the original; that second ACK marks it
/// spurious, the QP's floor doubles, and the same late answers draw no probe again.
/// (Before: a probe for every late answer, each making the next one unmeasurable.)
#[test]
fn a_peer_late_by_more_than_the_floor_costs_one_spurious_probe() {
    let mut s = pair(3);
    let before = warm_up(&mut s);
    let st = late_answers(&mut s, 10, 7_000_000);
    let probes = st.tail_probes - before.tail_probes;
    assert_eq!(probes, 1, "one probe for ten late answers: {st:?}");
    assert_eq!(st.spurious_probes, 1, "{st:?}");
    assert_eq!(st.retransmitted - before.retransmitted, 1, "{st:?}");
    assert_eq!(st.timeouts, 0, "{st:?}");
    assert_eq!(s.a.qp.probe_floor_ns(), 2 * PROBE_FLOOR_NS);
    // B took the probe as a duplicate and answered it
    assert_eq!(s.b.qp.stats().duplicates, 1, "{:?}", s.b.qp.stats());
}

/// As above, with an unsignaled SEND behind each signaled one (an application that
/// signals only some of its WRs): the probe resends that last packet, which did not ask for an ACK the first time,
/// so B answers it once only; the late ACK of the signaled SEND, arriving after the probe
/// and before the probe's own ACK, marks it spurious. (Before: no second ACK of the probed
/// PSN could come, the probe counted as needed, and every late answer drew a probe.)
#[test]
fn a_late_answer_behind_an_unasked_tail_is_found_spurious() {
    let mut s = pair(6);
    let before = warm_up(&mut s);
    for i in 0..10u64 {
        recv_at_b(&mut s, 2000 + 2 * i, 64);
        recv_at_b(&mut s, 2001 + 2 * i, 64);
        post(&mut s, 2000 + 2 * i, SendOp::Send, 64, i as u8);
        let wr = SendWr::new(2001 + 2 * i, SendOp::Send).with_sge(Sge {
            addr: s.a.buf_addr,
            length: 64,
            lkey: s.a.lkey,
        });
        s.a.qp.post_send(&s.a.mem, &wr).unwrap();
        let until = s.now + 7_000_000;
        s.pause(true, until);
        let (c, _) = complete(&mut s);
        assert_eq!(c.status, WcStatus::Success, "message {i}");
        assert!(s.run_until_idle(LIMIT), "message {i}: A idle");
        for k in 0..2 {
            assert_eq!(
                s.b.qp.poll_recv_completion().map(|r| r.status),
                Some(WcStatus::Success),
                "message {i}.{k} received"
            );
        }
        assert!(s.b.qp.poll_recv_completion().is_none(), "message {i} twice");
    }
    assert_one_probe_found_spurious(&s, &before);
}

/// A READ whose responses come late by more than the floor: the probe asks for the READ
/// again, B replays it after answering the original, and the replay's last response,
/// arriving after the original's, marks the probe spurious. (Before: a READ's probe had no
/// verdict, and every late READ drew one; rping's server READs each ping.)
#[test]
fn a_late_read_answer_is_found_spurious() {
    let mut s = pair(7);
    let before = warm_up(&mut s);
    for i in 0..10u64 {
        let op = SendOp::RdmaRead {
            remote_addr: s.b.buf_addr + 0x1_0000,
            rkey: s.b.rkey,
        };
        post(&mut s, 3000 + i, op, 4000, 0);
        let until = s.now + 7_000_000;
        s.pause(true, until);
        let (c, _) = complete(&mut s);
        assert_eq!(c.status, WcStatus::Success, "READ {i}");
        assert!(s.run_until_idle(LIMIT), "READ {i}: A idle");
    }
    assert_one_probe_found_spurious(&s, &before);
}

/// Since `before`: one probe, found spurious, no timeout, and the floor doubled.
fn assert_one_probe_found_spurious(s: &RcPair, before: &RcStats) {
    let st = s.a.qp.stats();
    assert_eq!(st.tail_probes - before.tail_probes, 1, "{st:?}");
    assert_eq!(st.spurious_probes, 1, "{st:?}");
    assert_eq!(st.timeouts, 0, "{st:?}");
    assert_eq!(s.a.qp.probe_floor_ns(), 2 * PROBE_FLOOR_NS);
}

/// The same with answers late by 20 ms, past the second (go-back-N) probe of the first
/// wait: B answers every resend as a duplicate, so the first two waits are found spurious
/// (3 probes), the floor is 20 ms, and the other eight waits draw none.
#[test]
fn a_peer_late_past_two_probes_raises_the_floor_twice() {
    let mut s = pair(5);
    let before = warm_up(&mut s);
    let st = late_answers(&mut s, 10, 20_000_000);
    assert_eq!(st.tail_probes - before.tail_probes, 3, "{st:?}");
    assert_eq!(st.spurious_probes, 2, "{st:?}");
    assert_eq!(st.timeouts, 0, "{st:?}");
    assert_eq!(s.a.qp.probe_floor_ns(), 4 * PROBE_FLOOR_NS);
}

/// After a spurious probe raised the floor, a lost tail packet is still resent by a probe
/// (long before the ACK timeout), and that needed probe lowers the floor again.
#[test]
fn a_needed_probe_lowers_a_raised_floor() {
    let mut s = pair(4);
    warm_up(&mut s);
    late_answers(&mut s, 1, 7_000_000);
    assert!(s.run_until_idle(LIMIT), "B's second ACK arrives");
    assert_eq!(s.a.qp.probe_floor_ns(), 2 * PROBE_FLOOR_NS);
    let before = s.a.qp.stats();
    recv_at_b(&mut s, 1, 64);
    let psn = post(&mut s, 1, SendOp::Send, 64, 0x5A);
    s.drop_once(true, psn);
    let (c, took) = complete(&mut s);
    assert_eq!(c.status, WcStatus::Success);
    let st = s.a.qp.stats();
    assert_eq!(st.timeouts, before.timeouts, "{st:?}");
    assert_eq!(st.tail_probes - before.tail_probes, 1, "{st:?}");
    assert!(
        took < 4 * PROBE_FLOOR_NS && took < ack_timeout_ns(TIMEOUT).unwrap() / 10,
        "recovery took {took} ns"
    );
    // the next exchange's progress shows no second ACK came for the probed PSN
    recv_at_b(&mut s, 2, 64);
    post(&mut s, 2, SendOp::Send, 64, 0x5B);
    assert_eq!(complete(&mut s).0.status, WcStatus::Success);
    assert_eq!(s.a.qp.stats().spurious_probes, 1);
    assert_eq!(s.a.qp.probe_floor_ns(), PROBE_FLOOR_NS);
}

/// Signaled ping-pongs over a clean link whose one-way delay varies between `delay` and
/// `delay + jitter` (in order): no probe fires, nothing is resent.
fn clean_ping_pong(delay_ns: u64, jitter_ns: u64) {
    clean_ping_pong_seeds(delay_ns, jitter_ns, 0..seeds());
}

/// [`clean_ping_pong`] for the given seeds.
fn clean_ping_pong_seeds(delay_ns: u64, jitter_ns: u64, seeds: impl Iterator<Item = u64>) {
    for seed in seeds {
        let p = ConnParams {
            timeout: TIMEOUT,
            ..ConnParams::default()
        };
        let f = Faults {
            delay_ns,
            jitter_ns,
            ..Faults::clean()
        };
        let mut s = RcPair::with_attrs(seed, f, &p);
        s.in_order = true;
        for i in 0..200u64 {
            let len = [64, 1000, 3000, 8192][(i % 4) as usize];
            recv_at_b(&mut s, i, 8192);
            let op = if i % 5 == 4 {
                SendOp::RdmaRead {
                    remote_addr: s.b.buf_addr + 0x1_0000,
                    rkey: s.b.rkey,
                }
            } else {
                SendOp::Send
            };
            post(&mut s, i, op, len, i as u8);
            // a second message in flight behind it, half of the time
            if i % 2 == 0 {
                let wr = SendWr::new(
                    10_000 + i,
                    SendOp::RdmaWrite {
                        remote_addr: s.b.buf_addr + 0x4_0000,
                        rkey: s.b.rkey,
                    },
                )
                .with_sge(Sge {
                    addr: s.a.buf_addr + 0x4_0000,
                    length: 2048,
                    lkey: s.a.lkey,
                });
                s.a.qp.post_send(&s.a.mem, &wr).unwrap();
            }
            let (c, _) = complete(&mut s);
            assert_eq!(c.status, WcStatus::Success, "seed {seed} message {i}");
            if !matches!(op, SendOp::RdmaRead { .. }) {
                assert!(s.b.qp.poll_recv_completion().is_some());
            }
        }
        assert!(s.run_until_idle(LIMIT));
        let st = s.a.qp.stats();
        assert_eq!(
            (st.retransmitted, st.tail_probes, st.timeouts, st.ack_probes),
            (0, 0, 0, 0),
            "seed {seed}: {st:?}"
        );
        let rtt = s.a.qp.srtt_ns().unwrap();
        assert!(rtt >= 2 * delay_ns, "seed {seed}: srtt {rtt}");
    }
}

#[test]
fn a_clean_lan_link_resends_nothing() {
    clean_ping_pong(20_000, 30_000);
}

/// A round trip between 2 and 16 ms, up to three probe floors: only the measured round trip
/// and its variation keep the probe from firing.
#[test]
fn a_clean_slow_jittery_link_resends_nothing() {
    clean_ping_pong(1_000_000, 7_000_000);
    // seed 24 (past CI's 20): its first round trips were short, and a PTO fitted to one
    // sample fired before a later, longer one (fixed: the estimate needs 4 samples)
    clean_ping_pong_seeds(1_000_000, 7_000_000, 24..25);
}

/// Whether `n`'s requester has PSNs outstanding without a timer to resend them.
fn stalled(n: &rdma_proto::sim::Node) -> bool {
    n.qp.state() == QpState::Rts && n.qp.outstanding_psns() > 0 && n.qp.poll_timeout().is_none()
}

/// rping's exchange (A: SEND; B: READ of A's buffer, SEND; A: SEND; B: WRITE, SEND) under
/// the issue's faults: every message completes, and no requester ever has PSNs outstanding
/// without a timer.
#[test]
fn an_rping_exchange_under_the_issue_faults_never_stalls() {
    for seed in 0..seeds() {
        let faults = Faults {
            loss: 0.05,
            dup: 0.02,
            reorder: 0.05,
            delay_ns: 20_000,
            jitter_ns: 30_000,
            ..Faults::clean()
        };
        let p = ConnParams {
            timeout: TIMEOUT,
            ..ConnParams::default()
        };
        let mut s = RcPair::with_attrs(seed, faults, &p);
        for i in 0..50u64 {
            for (from_a, op) in [
                (true, 0),
                (false, 1),
                (false, 0),
                (true, 0),
                (false, 2),
                (false, 0),
            ] {
                let (me, peer) = if from_a {
                    (&mut s.a, &mut s.b)
                } else {
                    (&mut s.b, &mut s.a)
                };
                let len = if op == 0 { 64 } else { 4000 };
                if op == 0 {
                    let r = RecvWr::new(i).with_sge(Sge {
                        addr: peer.buf_addr,
                        length: 64,
                        lkey: peer.lkey,
                    });
                    peer.qp.post_recv(&r).unwrap();
                }
                let sop = match op {
                    0 => SendOp::Send,
                    1 => SendOp::RdmaRead {
                        remote_addr: peer.buf_addr + 0x1000,
                        rkey: peer.rkey,
                    },
                    _ => SendOp::RdmaWrite {
                        remote_addr: peer.buf_addr + 0x4000,
                        rkey: peer.rkey,
                    },
                };
                let wr = SendWr::new(i, sop)
                    .with_sge(Sge {
                        addr: me.buf_addr + 0x8000,
                        length: len,
                        lkey: me.lkey,
                    })
                    .signaled();
                me.qp.post_send(&me.mem, &wr).unwrap();
                let mut stall = None;
                let done = s.run_until(LIMIT, |s| {
                    if stalled(&s.a) || stalled(&s.b) {
                        stall = Some((
                            s.a.qp.stats(),
                            s.b.qp.stats(),
                            s.a.qp.outstanding_psns(),
                            s.b.qp.outstanding_psns(),
                        ));
                        return true;
                    }
                    let n = if from_a { &mut s.a } else { &mut s.b };
                    n.qp.poll_send_completion().is_some()
                });
                assert!(
                    stall.is_none(),
                    "seed {seed} iteration {i}: stalled {stall:?}"
                );
                assert!(done, "seed {seed} iteration {i}: no completion");
                if op == 0 {
                    let got = s.run_until(LIMIT, |s| {
                        let n = if from_a { &s.b } else { &s.a };
                        n.qp.pending_recv_completions() > 0
                    });
                    assert!(got, "seed {seed} iteration {i}: SEND not received");
                    let n = if from_a { &mut s.b } else { &mut s.a };
                    assert_eq!(
                        n.qp.poll_recv_completion().unwrap().status,
                        WcStatus::Success
                    );
                }
            }
        }
    }
}
