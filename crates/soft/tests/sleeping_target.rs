//! An application that posts a READ target and then sleeps still serves READs from a lossy
//! peer: side A (127.0.90.1) registers a patterned region, connects, and then only sleeps
//! (`std::thread::sleep`: no polling, no call into the device) while side B (127.0.90.2)
//! READs from it, with loss, duplication and reordering injected on both sides' sends. Only
//! the process's progress engine answers for A. `RDMA_SOAK_READS` sets the number of READs
//! (default 500; the full run is 10,000).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{connect_with, crc, device_on, fill, wait_completions, ConnOpts};
use rdma_soft::io::WireAddr;
use rdma_soft::verbs::*;

const IP_A: &str = "127.0.90.1";
const IP_B: &str = "127.0.90.2";
/// A's region.
const SRC_LEN: usize = 1 << 20;
/// Longest READ: 16 response packets at the path MTU of 1024 used here.
const MAXLEN: usize = 16 << 10;
/// READs in flight.
const DEPTH: usize = 8;
/// B's destination slot of each READ in flight: the READ's bytes, then canary bytes.
const SLOT: usize = MAXLEN + 64;
const CANARY: u8 = 0xA5;
/// Wall-clock limit of one wait.
const LIMIT: Duration = Duration::from_secs(60);

fn reads() -> usize {
    std::env::var("RDMA_SOAK_READS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500)
}

/// xorshift64.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A 4 ms ACK timeout, 7 retries, path MTU 1024 (multi-packet READs).
fn opts() -> ConnOpts {
    ConnOpts {
        mtu: Some(Mtu::Mtu1024),
        ..ConnOpts::default()
    }
}

#[test]
fn a_sleeping_target_serves_reads_from_a_lossy_peer() {
    let n = reads();
    let faults = |seed: u64| {
        Some(
            format!("loss=0.05,dup=0.02,reorder=0.05,seed={seed}")
                .parse()
                .unwrap(),
        )
    };
    // B's objects live in this thread; A's in a thread of its own that sleeps
    let b_dev = device_on("lo", IP_B, faults(2));
    let pd = b_dev.alloc_pd().unwrap();
    let ch = b_dev.create_comp_channel().unwrap();
    let cq = b_dev.create_cq(64, Some(&ch)).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let dst = pd
        .register(vec![CANARY; DEPTH * SLOT], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let gid_b = IP_B.parse::<WireAddr>().unwrap().gid();
    let done = AtomicBool::new(false);
    let done = &done;
    let (tx, rx) = std::sync::mpsc::channel();
    let (tx_b, rx_b) = std::sync::mpsc::channel();
    let t0 = Instant::now();
    let stats_a = std::thread::scope(|s| {
        let a = s.spawn(move || {
            let dev = device_on("lo", IP_A, faults(1));
            let pd = dev.alloc_pd().unwrap();
            let cq = dev.create_cq(64, None).unwrap();
            let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
            let mr = pd
                .register(vec![0u8; SRC_LEN], AccessFlags::REMOTE_READ)
                .unwrap();
            fill(&mr, 0, SRC_LEN, 0x5EED);
            let want = crc(&mr, 0, SRC_LEN);
            tx.send((qp.qpn(), mr.addr(), mr.rkey())).unwrap();
            let b_qpn: u32 = rx_b.recv().unwrap();
            connect_with(&dev, &qp, b_qpn, 0x200, 0x100, gid_b, &opts());
            // from here on A only sleeps
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(10));
            }
            // nothing completed at the passive side, and its region is unchanged
            assert_eq!(cq.poll_one(), None, "a completion at the sleeping target");
            assert_eq!(qp.state(), QpState::Rts);
            assert_eq!(crc(&mr, 0, SRC_LEN), want, "the READ source changed");
            (dev.wire_stats(), qp.transport_stats().unwrap())
        });
        let (a_qpn, addr, rkey) = rx.recv().unwrap();
        tx_b.send(qp.qpn()).unwrap();
        let gid_a = IP_A.parse::<WireAddr>().unwrap().gid();
        connect_with(&b_dev, &qp, a_qpn, 0x100, 0x200, gid_a, &opts());
        // A's pattern, to check each READ against
        let mut pattern = vec![0u8; SRC_LEN];
        {
            let mut x = 0x5EED | 1;
            for w in pattern.chunks_mut(8) {
                w.copy_from_slice(&next(&mut x).to_le_bytes()[..w.len()]);
            }
        }
        let mut rng = 0x0123_4567_89AB_CDEF_u64;
        // the READ in flight in each slot: (offset in A, length)
        let mut inflight: Vec<Option<(usize, usize)>> = vec![None; DEPTH];
        let (mut posted, mut completed) = (0usize, 0usize);
        let post = |slot: usize, posted: &mut usize, rng: &mut u64| {
            let len = 1 + (next(rng) as usize % MAXLEN);
            let off = next(rng) as usize % (SRC_LEN - len);
            let wr = SendWr::new(
                slot as u64,
                SendOp::RdmaRead {
                    remote_addr: addr + off as u64,
                    rkey,
                },
            )
            .with_sge(dst.sge(slot * SLOT, len as u32).unwrap())
            .signaled();
            qp.post_send(&wr).unwrap();
            *posted += 1;
            (off, len)
        };
        for (slot, f) in inflight.iter_mut().enumerate().take(n.min(DEPTH)) {
            *f = Some(post(slot, &mut posted, &mut rng));
        }
        while completed < n {
            let got = wait_completions(&cq, &ch, 1, LIMIT);
            let c = got.first().unwrap_or_else(|| {
                panic!(
                    "READ {completed} of {n}: no completion within {LIMIT:?} (QP {:?}, \
                     transport {:?}, wire {:?})",
                    qp.state(),
                    qp.transport_stats(),
                    b_dev.wire_stats()
                )
            });
            assert_eq!(
                (c.status, c.opcode),
                (WcStatus::Success, WcOpcode::RdmaRead),
                "READ {completed} of {n}: {c:?}"
            );
            let slot = c.wr_id as usize;
            let (off, len) = inflight[slot].take().expect("a completion of an idle slot");
            let mut got = vec![0u8; SLOT];
            dst.read(slot * SLOT, &mut got).unwrap();
            assert!(
                got[..len] == pattern[off..off + len],
                "READ {completed} of {n} ({len} bytes at {off:#x}): data differs"
            );
            assert!(
                got[len..].iter().all(|&b| b == CANARY),
                "READ {completed} of {n} ({len} bytes): bytes written past its end"
            );
            dst.fill(slot * SLOT, SLOT, CANARY).unwrap();
            completed += 1;
            if posted < n {
                inflight[slot] = Some(post(slot, &mut posted, &mut rng));
            }
        }
        done.store(true, Ordering::Release);
        a.join().unwrap()
    });
    let (wire_a, rc_a) = stats_a;
    let (wire_b, rc_b) = (b_dev.wire_stats(), qp.transport_stats().unwrap());
    eprintln!("{n} READs in {:.2?}", t0.elapsed());
    eprintln!("A (sleeping) wire {wire_a:?}\n  rc {rc_a:?}");
    eprintln!("B (reading) wire {wire_b:?}\n  rc {rc_b:?}");
    assert_eq!(cq.poll_one(), None, "an extra completion at the reader");
    // the faults happened on both sides, and the sleeping side answered through them
    assert!(wire_a.faults_send.dropped > 0, "{wire_a:?}");
    assert!(wire_b.faults_send.dropped > 0, "{wire_b:?}");
    assert!(
        rc_a.duplicates > 0,
        "the sleeping side answered re-requested READs"
    );
    assert!(rc_a.responses_sent > 0);
}
