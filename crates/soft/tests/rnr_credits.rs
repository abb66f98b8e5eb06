//! A receiver whose application posts its receives slowly (a descheduled process) costs the
//! sender RNR waits, not go-back-N resends of its whole window: RC QPs with their own receive
//! queue advertise end-to-end credits in their ACKs (`rdma_proto::rc`, `credit.rs`) and the
//! requester sends no SEND beyond them but one at a time. Counts, not timings: one message
//! resent per RNR NAK.

mod common;

use std::time::Duration;

use common::*;
use rdma_soft::verbs::*;

/// Messages of one packet each (4 KiB at the lo device's 4096-byte path MTU).
const N: usize = 64;
const LEN: usize = 4096;
/// Messages the sender keeps in flight.
const WINDOW: usize = 16;
/// The slow application: `BATCH` receives every `PERIOD`.
const BATCH: usize = 4;
const PERIOD: Duration = Duration::from_millis(3);

#[test]
fn slow_receiver_costs_one_message_per_rnr_nak() {
    let a = Side::new("127.0.0.1", N * LEN, None);
    let b = Side::new("127.0.0.2", N * LEN, None);
    connect(&a, &b);
    fill(&a.mr, 0, N * LEN, 0x35);
    let want = crc(&a.mr, 0, N * LEN);
    std::thread::scope(|s| {
        s.spawn(|| {
            let (mut posted, mut done) = (0, 0);
            while done < N {
                // the first message alone: its ACK brings the first count, so no window
                // leaves unlimited (what it would cost is not what this test measures)
                let window = if done == 0 { 1 } else { WINDOW };
                while posted < N && posted - done < window {
                    let sge = a.mr.sge(posted * LEN, LEN as u32).unwrap();
                    let wr = SendWr::new(posted as u64, SendOp::Send)
                        .with_sge(sge)
                        .signaled();
                    a.qp.post_send(&wr).unwrap();
                    posted += 1;
                }
                let c = a.next_ok();
                assert_eq!((c.opcode, c.wr_id), (WcOpcode::Send, done as u64));
                done += 1;
            }
        });
        let mut posted = 0;
        let mut done = 0;
        while done < N {
            if posted < N {
                for _ in 0..BATCH.min(N - posted) {
                    let sge = b.mr.sge(posted * LEN, LEN as u32).unwrap();
                    b.qp.post_recv(&RecvWr::new(posted as u64).with_sge(sge))
                        .unwrap();
                    posted += 1;
                }
            }
            std::thread::sleep(PERIOD);
            while let Some(c) = b.cq.poll_one() {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                assert_eq!((c.wr_id, c.byte_len), (done as u64, LEN as u32));
                done += 1;
            }
        }
    });
    assert_eq!(crc(&b.mr, 0, N * LEN), want, "byte exact");
    let st = a.qp.transport_stats().unwrap();
    eprintln!("sender: {st:?}");
    assert!(
        st.rnr_naks_received > 0,
        "the receiver never ran dry: {st:?}"
    );
    assert!(
        st.credit_waits > 0,
        "the sender never waited for credits: {st:?}"
    );
    // the receiver's posts end the sender's RNR waits (its credit update leaves with the
    // post: `QueuePair::post_recv`), rather than each lasting the RNR timer
    let rx = b.qp.transport_stats().unwrap();
    assert!(
        st.rnr_waits_cut > 0 && rx.credit_updates_sent >= st.rnr_waits_cut,
        "no RNR wait ended by a credit update: {st:?} {rx:?}"
    );
    // (the probe timer's resends, when a held ACK comes late, are counted apart)
    assert!(
        st.retransmitted - st.early_retransmits <= st.rnr_naks_received,
        "more resent than one message per RNR NAK: {st:?}"
    );
}
