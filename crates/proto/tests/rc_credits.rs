//! End-to-end credits (`rc/credit.rs`): a receiver whose application posts its receives
//! slowly (a descheduled process) refuses at most one message at a time with an RNR NAK
//! when its ACKs advertise credits, and the sender resends only that message; without
//! credits (a peer that sends code 0x1f, as Linux rxe) the sender fills the window, the
//! receiver refuses all of it and the sender resends it all (go-back-N). Counts in virtual
//! time, no timing asserted.

use rdma_proto::rc::RcStats;
use rdma_proto::sim::{ConnParams, Faults, RcPair};
use rdma_proto::verbs::{RecvWr, SendFlags, SendOp, SendWr, Sge, WcStatus};

/// Messages sent.
const N: u64 = 120;
/// Messages the sender keeps posted.
const DEPTH: u64 = 16;
/// Bytes per message: two packets at the simulator's 1024-byte MTU.
const LEN: u32 = 2048;
/// The receiver's application posts `BATCH` receives every `PERIOD` ns of virtual time.
const BATCH: u64 = 8;
const PERIOD: u64 = 300_000;

struct Run {
    sender: RcStats,
    receiver: RcStats,
    peer_credits: Option<u32>,
}

/// Sends `N` SENDs from A to B; B advertises credits if `credits`.
fn run(seed: u64, credits: bool) -> Run {
    let p = ConnParams {
        min_rnr_timer: 12, // 640 µs, as the CM sets
        timeout: 17,
        ..ConnParams::default()
    };
    let faults = Faults {
        delay_ns: 2_000,
        jitter_ns: 1_000,
        ..Faults::clean()
    };
    let mut s = RcPair::with_attrs(seed, faults, &p);
    s.in_order = true;
    s.b.qp.set_credits(credits);
    // the sender keeps DEPTH messages posted, as rdma-perf's send_bw does
    let mut queued = 0u64;
    let post_send = |s: &mut RcPair, i: u64| {
        let at = s.a.buf_addr + i * u64::from(LEN);
        s.a.mem.bytes_mut(at, u64::from(LEN)).unwrap().fill(i as u8);
        let wr = SendWr::new(i, SendOp::Send)
            .with_flags(SendFlags::SIGNALED)
            .with_sge(Sge {
                addr: at,
                length: LEN,
                lkey: s.a.lkey,
            });
        s.a.qp.post_send(&s.a.mem, &wr).unwrap();
    };
    while queued < DEPTH {
        post_send(&mut s, queued);
        queued += 1;
    }
    let (mut posted, mut next_post, mut received, mut sent) = (0u64, 0u64, 0u64, 0u64);
    const END: u64 = 10_000_000_000;
    let mut done = false;
    while !done && s.now < END {
        // the application's next post is an event of its own (else the virtual clock would
        // jump from an RNR NAK straight to the RNR timer)
        let until = if posted < N { next_post.min(END) } else { END };
        done = s.run_until(until, |s| {
            while let Some(c) = s.b.qp.poll_recv_completion() {
                assert_eq!(c.status, WcStatus::Success);
                assert_eq!(c.wr_id, received, "in order, each once");
                assert_eq!(c.byte_len, LEN);
                let at = s.b.buf_addr + (c.wr_id % 64) * u64::from(LEN);
                let data = s.b.mem.bytes_mut(at, u64::from(LEN)).unwrap();
                assert!(
                    data.iter().all(|&b| b == c.wr_id as u8),
                    "message {received}"
                );
                received += 1;
            }
            while let Some(c) = s.a.qp.poll_send_completion() {
                assert_eq!(c.status, WcStatus::Success);
                assert_eq!(c.wr_id, sent);
                sent += 1;
                if queued < N {
                    post_send(s, queued);
                    queued += 1;
                }
            }
            // the slow application: a batch of receives each period
            if s.now >= next_post && posted < N {
                for _ in 0..BATCH.min(N - posted) {
                    let wr = RecvWr::new(posted).with_sge(Sge {
                        addr: s.b.buf_addr + (posted % 64) * u64::from(LEN),
                        length: LEN,
                        lkey: s.b.lkey,
                    });
                    s.b.qp.post_recv(&wr).unwrap();
                    posted += 1;
                }
                next_post = s.now + PERIOD;
            }
            received == N && sent == N
        });
        if done {
            break;
        }
        if until == END {
            // idle with every receive posted, or out of time
            break;
        }
        s.now = s.now.max(until);
    }
    assert!(
        done,
        "seed {seed}: {received} of {N} received, {sent} completed"
    );
    Run {
        sender: s.a.qp.stats(),
        receiver: s.b.qp.stats(),
        peer_credits: s.a.qp.peer_credits(),
    }
}

fn seeds() -> u64 {
    std::env::var("RDMA_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

/// With credits, each RNR NAK after the first burst costs the resend of one message (two
/// packets) at most, and the sender waited for credits instead of sending into an empty
/// receive queue.
#[test]
fn credits_bound_rnr_resends_to_one_message() {
    for seed in 0..seeds() {
        let r = run(seed, true);
        let rnr = r.sender.rnr_naks_received;
        assert!(r.sender.credit_waits > 0, "seed {seed}: {:?}", r.sender);
        // the first burst leaves before any ACK brought a count (no limit yet): up to DEPTH
        // messages of two packets; after it, each RNR NAK refused one message
        assert!(
            r.sender.retransmitted <= 2 * DEPTH + 2 * rnr.saturating_sub(1),
            "seed {seed}: {} packets resent for {rnr} RNR NAKs: more than the refused messages",
            r.sender.retransmitted
        );
        // one RNR wait per application period at most (the one message sent without credits)
        assert!(
            rnr <= N / BATCH + 1,
            "seed {seed}: {rnr} RNR NAKs for {} periods",
            N / BATCH
        );
        // what the receiver dropped after an RNR NAK is what was resent, nothing more
        assert!(r.receiver.dropped <= r.sender.retransmitted);
        assert!(r.peer_credits.is_some());
        // the application posts every 300 µs, the RNR timer is 640 µs: each wait ends with
        // the receiver's credit update, none lasts the timer
        assert_eq!(
            r.sender.rnr_waits_cut, rnr,
            "seed {seed}: {rnr} RNR waits, {} ended by a credit update",
            r.sender.rnr_waits_cut
        );
        assert_eq!(r.receiver.credit_updates_sent, rnr);
    }
}

/// A peer without credits (code 0x1f in its ACKs, as Linux rxe): the sender is never
/// limited, everything still arrives, with the resends of go-back-N after each RNR NAK (what
/// the credits above remove).
#[test]
fn invalid_credits_mean_no_limit() {
    for seed in 0..seeds() {
        let off = run(seed, false);
        assert_eq!(off.peer_credits, None);
        assert_eq!(off.sender.credit_waits, 0);
        assert!(off.sender.rnr_naks_received > 0);
        let on = run(seed, true);
        assert!(
            off.sender.retransmitted > 4 * on.sender.retransmitted.max(1),
            "seed {seed}: without credits {} resent, with {}",
            off.sender.retransmitted,
            on.sender.retransmitted
        );
    }
}

/// A SEND that waits for credits while the messages holding them did not ask for an ACK
/// (unsignaled, ACKs on demand) does not wait for the ACK probe's quarter of the ACK
/// timeout: the wait itself resends the last packet asking, at once.
#[test]
fn a_credit_wait_asks_for_its_ack_at_once() {
    let p = ConnParams {
        timeout: 17, // 537 ms: the ACK probe's own timer would fire after 134 ms
        ..ConnParams::default()
    };
    let faults = Faults {
        delay_ns: 2_000,
        ..Faults::clean()
    };
    let mut s = RcPair::with_attrs(7, faults, &p);
    s.in_order = true;
    s.b.qp.set_credits(true);
    let recv = |s: &mut RcPair, id: u64| {
        let wr = RecvWr::new(id).with_sge(Sge {
            addr: s.b.buf_addr,
            length: 64,
            lkey: s.b.lkey,
        });
        s.b.qp.post_recv(&wr).unwrap();
    };
    let send = |s: &mut RcPair, id: u64, signaled: bool| {
        let mut wr = SendWr::new(id, SendOp::Send).with_sge(Sge {
            addr: s.a.buf_addr,
            length: 64,
            lkey: s.a.lkey,
        });
        if signaled {
            wr = wr.with_flags(SendFlags::SIGNALED);
        }
        s.a.qp.post_send(&s.a.mem, &wr).unwrap();
    };
    recv(&mut s, 0);
    recv(&mut s, 1);
    // the first message asks (nothing asked yet) and brings the count: one receive left
    send(&mut s, 0, true);
    assert!(s.run_until(1_000_000, |s| s.a.qp.poll_send_completion().is_some()));
    assert_eq!(s.a.qp.peer_credits(), Some(1));
    let received = |s: &mut RcPair, id: u64| {
        std::iter::from_fn(|| s.b.qp.poll_recv_completion()).any(|c| c.wr_id == id)
    };
    assert!(received(&mut s, 0));
    // an unsignaled SEND takes the last credit without asking for an ACK
    send(&mut s, 1, false);
    assert!(s.run_until(1_000_000, |s| received(s, 1)));
    recv(&mut s, 2); // the receiver posts again at once
    let start = s.now;
    send(&mut s, 2, true);
    let done = s.run_until(start + 10_000_000_000, |s| received(s, 2));
    let st = s.a.qp.stats();
    assert!(done, "the waiting SEND never arrived: {st:?}");
    assert_eq!(st.credit_waits, 1, "{st:?}");
    assert_eq!(
        st.ack_probes, 1,
        "the wait resent the last packet asking: {st:?}"
    );
    // in virtual time: well before the ACK probe's own timer (a quarter of 537 ms)
    assert!(
        s.now - start < 1_000_000,
        "the SEND waited {} ns for credits",
        s.now - start
    );
}

/// One SEND into a receiver with no receive posted, which posts one 10 µs after its RNR
/// NAK; returns the sender's and the receiver's counters and the virtual time from the NAK
/// to the SEND's completion. `credits`: the receiver advertises (else code 0x1f, as rxe).
fn rnr_then_post(credits: bool) -> (RcStats, RcStats, u64) {
    let p = ConnParams {
        min_rnr_timer: 12, // 640 µs, as the CM sets
        timeout: 17,
        ..ConnParams::default()
    };
    let faults = Faults {
        delay_ns: 2_000,
        ..Faults::clean()
    };
    let mut s = RcPair::with_attrs(3, faults, &p);
    s.in_order = true;
    s.b.qp.set_credits(credits);
    let wr = SendWr::new(1, SendOp::Send)
        .with_flags(SendFlags::SIGNALED)
        .with_sge(Sge {
            addr: s.a.buf_addr,
            length: 64,
            lkey: s.a.lkey,
        });
    s.a.qp.post_send(&s.a.mem, &wr).unwrap();
    assert!(s.run_until(1_000_000, |s| s.a.qp.stats().rnr_naks_received == 1));
    let nak_at = s.now;
    // nothing happens until the RNR timer: the receiver's application posts at +10 µs
    assert!(!s.run_until(nak_at + 10_000, |_| false));
    s.now = nak_at + 10_000;
    let wr = RecvWr::new(7).with_sge(Sge {
        addr: s.b.buf_addr,
        length: 64,
        lkey: s.b.lkey,
    });
    s.b.qp.post_recv(&wr).unwrap();
    let done = s.run_until(10_000_000, |s| s.a.qp.poll_send_completion().is_some());
    assert!(done, "the SEND never completed: {:?}", s.a.qp.stats());
    let got = std::iter::from_fn(|| s.b.qp.poll_recv_completion()).count();
    assert_eq!(got, 1, "delivered once");
    (s.a.qp.stats(), s.b.qp.stats(), s.now - nak_at)
}

/// A receiver that advertises credits and refused a message with an RNR NAK sends a credit
/// update when its application posts a receive; the sender ends its RNR wait on it and
/// resends the one refused packet then, not after the RNR timer. Without credits (Linux
/// rxe's 0x1f) the wait lasts the timer, as before.
#[test]
fn a_credit_update_ends_the_rnr_wait() {
    let (a, b, waited) = rnr_then_post(true);
    assert_eq!(b.credit_updates_sent, 1, "{b:?}");
    assert_eq!(a.rnr_waits_cut, 1, "{a:?}");
    assert_eq!(a.rnr_naks_received, 1);
    assert_eq!(a.retransmitted, 1, "only the refused packet again: {a:?}");
    // virtual time: the post came 10 µs after the NAK, the RNR timer is 640 µs
    assert!(waited < 100_000, "waited {waited} ns after the RNR NAK");

    let (a, b, waited) = rnr_then_post(false);
    assert_eq!(b.credit_updates_sent, 0, "no count to advertise: {b:?}");
    assert_eq!(a.rnr_waits_cut, 0);
    assert_eq!(a.retransmitted, 1);
    assert!(waited >= 640_000, "0x1f: the whole RNR timer ({waited} ns)");
}
