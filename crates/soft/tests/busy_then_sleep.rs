//! A busy poller over RoCEv2/UDP takes its device's sockets out of the wire's epoll set
//! (`io/udp/park.rs`); when it stops and sleeps on a completion channel instead, the
//! engine must see the next datagram: the sockets are back in the set. Loopback only.

use std::time::Duration;

use rdma_soft::io::UdpConfig;
use rdma_soft::verbs::{
    AccessFlags, CompletionQueue, QpInitAttr, RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus,
};

mod common;
use common::{device_with, poll_within, wait_completions};

const LIMIT: Duration = Duration::from_secs(10);

/// Polls `cq` back to back (the busy poller) until one successful completion comes.
fn busy_next(cq: &CompletionQueue) -> rdma_soft::verbs::Completion {
    let c = poll_within(cq, LIMIT, "completion");
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    c
}

#[test]
fn a_sleeper_after_a_busy_poller_still_receives() {
    // RoCEv2 over UDP only: the host-local rings would carry these two devices' packets
    let udp = || UdpConfig {
        host_local: false,
        ..UdpConfig::default()
    };
    let (ip_a, ip_b) = ("127.0.9.21", "127.0.9.22");
    let (da, db) = (
        device_with("lo", ip_a, udp()),
        device_with("lo", ip_b, udp()),
    );
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let cqa = da.create_cq(64, None).unwrap();
    let ch = db.create_comp_channel().unwrap();
    let cqb = db.create_cq(64, Some(&ch)).unwrap();
    let qa = pa.create_qp(&QpInitAttr::rc(&cqa, &cqa)).unwrap();
    let qb = pb.create_qp(&QpInitAttr::rc(&cqb, &cqb)).unwrap();
    let ma = pa
        .register(vec![7u8; 64], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let mb = pb
        .register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let gid = |ip: &str| ip.parse::<rdma_soft::io::WireAddr>().unwrap().gid();
    qa.connect(qb.qpn(), 100, 200, gid(ip_b)).unwrap();
    qb.connect(qa.qpn(), 200, 100, gid(ip_a)).unwrap();
    let send = |qp: &rdma_soft::verbs::QueuePair, mr: &rdma_soft::verbs::MemoryRegion, id| {
        let wr = SendWr::new(id, SendOp::Send)
            .with_sge(mr.sge(0, 64).unwrap())
            .with_flags(SendFlags::SIGNALED);
        qp.post_send(&wr).unwrap();
    };

    // a ping-pong in which both sides busy-poll their CQs; each side has its next receive
    // posted before it sends (the peer answers only what it received)
    let rounds = 2_000u64;
    qb.post_recv(&RecvWr::new(0).with_sge(mb.sge(0, 64).unwrap()))
        .unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut sent_done = 0;
            for i in 0..rounds {
                // a's message i (its own send completions may come in between)
                while busy_next(&cqb).opcode != WcOpcode::Recv {
                    sent_done += 1;
                }
                qb.post_recv(&RecvWr::new(i + 1).with_sge(mb.sge(0, 64).unwrap()))
                    .unwrap();
                send(&qb, &mb, i);
            }
            while sent_done < rounds {
                busy_next(&cqb);
                sent_done += 1;
            }
        });
        for i in 0..rounds {
            qa.post_recv(&RecvWr::new(i).with_sge(ma.sge(0, 64).unwrap()))
                .unwrap();
            send(&qa, &ma, i);
            busy_next(&cqa);
            busy_next(&cqa);
        }
    });
    assert!(
        db.wire_stats().sockets_parked >= 1,
        "the busy poller parked its sockets: {:?}",
        db.wire_stats()
    );

    // b stops polling and sleeps on its completion channel; once its engine has taken the
    // device back and gone idle (no timer left: nothing is outstanding), a sends. Only the
    // wire's epoll set can wake b's engine now.
    // (b's receive `rounds` is posted)
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            send(&qa, &ma, rounds);
            busy_next(&cqa);
        });
        let got = wait_completions(&cqb, &ch, 1, LIMIT);
        assert_eq!(
            got.len(),
            1,
            "the datagram after the busy poll was received"
        );
        assert_eq!((got[0].wr_id, got[0].status), (rounds, WcStatus::Success));
    });
    assert_eq!(mb.to_vec(), vec![7u8; 64]);
}
