//! Deterministic simulation of two RC endpoints over a faulty network.
//!
//! `RDMA_SIM_SEEDS=n` sets the number of seeds per fault mix (default 200);
//! `RDMA_SIM_SEED=n` replays one seed; `RDMA_SIM_WINDOW=n` forces the send window of the
//! mixed workload (otherwise chosen per seed: none, 1, 2, 5 or 16 PSNs).

use rdma_proto::sim::{ConnParams, Faults, RcPair, Rng, BASE_A, BASE_B, MEM_SIZE};
use rdma_proto::verbs::{Mtu, QpState, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus};

const KB: u64 = 1024;

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("RDMA_SIM_SEED") {
        return vec![s.parse().expect("RDMA_SIM_SEED must be a number")];
    }
    let n = std::env::var("RDMA_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200u64);
    (0..n).collect()
}

fn run_mix(name: &str, faults: Faults) {
    let t = std::time::Instant::now();
    let seeds = seeds();
    let mut stats = rdma_proto::sim::NetStats::default();
    let mut exceeded = Vec::new();
    for &seed in &seeds {
        let r = workload(seed, faults).map(|o| match o {
            Outcome::Done(s) => s,
            Outcome::RetryExceeded(s) => {
                exceeded.push(seed);
                s
            }
        });
        match r {
            Ok(s) => {
                stats.sent += s.sent;
                stats.lost += s.lost;
                stats.rejected += s.rejected;
                stats.corrupted += s.corrupted;
                stats.duplicated += s.duplicated;
            }
            Err(e) => panic!(
                "fault mix {name}: seed {seed} failed: {e}\nreplay with RDMA_SIM_SEED={seed}"
            ),
        }
    }
    eprintln!(
        "mix {name}: {} seeds in {:.2?}; retries exceeded (legitimately) {exceeded:?}; \
         datagrams {} lost {} dup {} corrupted {} rejected {}",
        seeds.len(),
        t.elapsed(),
        stats.sent,
        stats.lost,
        stats.duplicated,
        stats.corrupted,
        stats.rejected
    );
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Send {
        src: u64,
        len: u64,
        imm: Option<u32>,
    },
    Write {
        src: u64,
        dst: u64,
        len: u64,
    },
    Read {
        dst: u64,
        src: u64,
        len: u64,
    },
    Fadd {
        add: u64,
    },
    Cas {
        compare: u64,
        swap: u64,
    },
}

fn check(c: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if c {
        Ok(())
    } else {
        Err(msg())
    }
}

/// How a seed ended.
enum Outcome {
    /// Everything completed and checked.
    Done(rdma_proto::sim::NetStats),
    /// A requester ended in `RetryExcErr` after `retry_cnt + 1` rounds in a row without
    /// progress (the simulator's round counter says so): bad luck on a lossy network, not a
    /// transport bug. Data is not checked.
    RetryExceeded(rdma_proto::sim::NetStats),
}

/// A mixed workload from A to B (SEND, WRITE, READ, atomics), plus SENDs from B to A.
fn workload(seed: u64, faults: Faults) -> Result<Outcome, String> {
    let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9) ^ 0xA5A5);
    let mtu = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ][rng.below(5) as usize];
    // the send window from its own generator, so the other choices per seed stay as they
    // were; RDMA_SIM_WINDOW=n forces one. RDMA_SIM_WINDOW=2 RDMA_SIM_SEED=440 ends loss20 in
    // RetryExcErr on a 3-packet READ: after its first response was accepted (retry counter
    // reset), 7 timed-out re-requests for the other two each lost the request or the first
    // missing response (p = 1 - 0.8 * 0.8 = 0.36 per round, 0.36^7 = 8e-4): bad luck, which
    // Outcome::RetryExceeded accepts only with retry_cnt + 1 rounds without progress.
    let window = std::env::var("RDMA_SIM_WINDOW")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or([0, 0, 1, 2, 5, 16][Rng::new(seed ^ 0x5E_ED0F_0D0E).below(6) as usize]);
    let params = ConnParams {
        mtu,
        rd_atomic: 1 + rng.below(8) as u8,
        max_outstanding_psns: window,
        ..ConnParams::default()
    };
    let mut s = RcPair::with_attrs(seed, faults, &params);
    let (a0, b0) = (s.a.buf_addr, s.b.buf_addr);
    // A: source data [0,128K); READ destinations [128K,384K); atomic results at 400K
    // B: receive slots [0,320K) (8K each); WRITE area [320K,448K); READ source [448K,512K)
    let mut fill = |len: u64| -> Vec<u8> {
        (0..len / 8)
            .flat_map(|_| rng.next_u64().to_le_bytes())
            .collect()
    };
    let src = fill(128 * KB);
    s.a.mem
        .bytes_mut(a0, 128 * KB)
        .unwrap()
        .copy_from_slice(&src);
    let rsrc = fill(64 * KB);
    s.b.mem
        .bytes_mut(b0 + 448 * KB, 64 * KB)
        .unwrap()
        .copy_from_slice(&rsrc);
    let counter = b0 + 316 * KB; // 8-byte aligned, after the last receive slot
    let mut counter_model =
        u64::from_ne_bytes(s.b.mem.bytes(counter, 8).unwrap().try_into().unwrap());
    let mut write_model = s.b.mem.bytes(b0 + 320 * KB, 128 * KB).unwrap().to_vec();
    let mut read_model = s.a.mem.bytes(a0 + 128 * KB, 256 * KB).unwrap().to_vec();
    let maxlen = (mtu.bytes() as u64 * 5 / 2).min(6 * KB);

    let n = 20 + rng.below(20) as usize;
    let mut ops = Vec::new();
    let mut nsend = 0;
    let mut read_off = 0u64;
    for _ in 0..n {
        let len = if rng.chance(0.1) {
            0
        } else {
            1 + rng.below(maxlen)
        };
        let src = a0 + rng.below(128 * KB - len);
        let op = match rng.below(10) {
            0..=3 => {
                nsend += 1;
                Op::Send {
                    src,
                    len,
                    imm: rng.chance(0.3).then(|| rng.next_u64() as u32),
                }
            }
            4..=5 => Op::Write {
                src,
                dst: b0 + 320 * KB + rng.below(128 * KB - len),
                len,
            },
            6..=7 => {
                if read_off + len > 256 * KB {
                    read_off = 0;
                }
                let dst = a0 + 128 * KB + read_off;
                read_off += len;
                Op::Read {
                    dst,
                    src: b0 + 448 * KB + rng.below(64 * KB - len),
                    len,
                }
            }
            8 => Op::Fadd {
                add: rng.below(1000),
            },
            _ => {
                let hit = rng.chance(0.5);
                Op::Cas {
                    compare: if hit {
                        counter_model
                    } else {
                        counter_model ^ 1
                    },
                    swap: rng.next_u64(),
                }
            }
        };
        // keep the model of the counter up to date for CAS compares
        match op {
            Op::Fadd { add } => counter_model = counter_model.wrapping_add(add),
            Op::Cas { compare, swap } if compare == counter_model => counter_model = swap,
            _ => {}
        }
        ops.push(op);
    }
    // reset the model: recomputed while checking
    counter_model = u64::from_ne_bytes(s.b.mem.bytes(counter, 8).unwrap().try_into().unwrap());

    // receives at B, one 8K slot per SEND
    for i in 0..nsend {
        let r = RecvWr::new(1000 + i as u64).with_sge(Sge {
            addr: b0 + i as u64 * 8 * KB,
            length: 8 * KB as u32,
            lkey: s.b.lkey,
        });
        s.b.qp
            .post_recv(&r)
            .map_err(|e| format!("post_recv: {e}"))?;
    }
    // B -> A sends, into A's [384K, 400K)
    let nback = rng.below(4) as usize;
    for i in 0..nback {
        let r = RecvWr::new(2000 + i as u64).with_sge(Sge {
            addr: a0 + 384 * KB + i as u64 * 4 * KB,
            length: 4 * KB as u32,
            lkey: s.a.lkey,
        });
        s.a.qp
            .post_recv(&r)
            .map_err(|e| format!("post_recv A: {e}"))?;
        let w = SendWr::new(3000 + i as u64, SendOp::Send)
            .with_sge(Sge {
                addr: b0 + 448 * KB + i as u64 * 100,
                length: 100 + i as u32,
                lkey: s.b.lkey,
            })
            .signaled();
        s.b.qp
            .post_send(&s.b.mem, &w)
            .map_err(|e| format!("post_send B: {e}"))?;
    }

    let mut signaled = Vec::new();
    let mut atomic_idx = 0u64;
    let mut atomic_slots = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let sig = i + 1 == ops.len() || rng.chance(0.7);
        let sge = |addr: u64, len: u64| Sge {
            addr,
            length: len as u32,
            lkey: s.a.lkey,
        };
        let mut wr = match *op {
            Op::Send {
                src,
                len,
                imm: None,
            } => SendWr::new(i as u64, SendOp::Send).with_sge(sge(src, len)),
            Op::Send {
                src,
                len,
                imm: Some(imm),
            } => SendWr::new(i as u64, SendOp::SendWithImm { imm }).with_sge(sge(src, len)),
            Op::Write { src, dst, len } => SendWr::new(
                i as u64,
                SendOp::RdmaWrite {
                    remote_addr: dst,
                    rkey: s.b.rkey,
                },
            )
            .with_sge(sge(src, len)),
            Op::Read { dst, src, len } => SendWr::new(
                i as u64,
                SendOp::RdmaRead {
                    remote_addr: src,
                    rkey: s.b.rkey,
                },
            )
            .with_sge(sge(dst, len)),
            Op::Fadd { add } => {
                let slot = a0 + 400 * KB + 8 * atomic_idx;
                atomic_idx += 1;
                atomic_slots.push(slot);
                SendWr::new(
                    i as u64,
                    SendOp::AtomicFetchAndAdd {
                        remote_addr: counter,
                        rkey: s.b.rkey,
                        add,
                    },
                )
                .with_sge(sge(slot, 8))
            }
            Op::Cas { compare, swap } => {
                let slot = a0 + 400 * KB + 8 * atomic_idx;
                atomic_idx += 1;
                atomic_slots.push(slot);
                SendWr::new(
                    i as u64,
                    SendOp::AtomicCmpAndSwp {
                        remote_addr: counter,
                        rkey: s.b.rkey,
                        compare,
                        swap,
                    },
                )
                .with_sge(sge(slot, 8))
            }
        };
        if matches!(op, Op::Send { len, .. } if *len <= 64) && rng.chance(0.5) {
            wr.flags |= SendFlags::INLINE;
        }
        if sig {
            wr.flags |= SendFlags::SIGNALED;
            signaled.push(i as u64);
        }
        s.a.qp
            .post_send(&s.a.mem, &wr)
            .map_err(|e| format!("post_send {i}: {e}"))?;
        // write and read models, applied in order
        match *op {
            Op::Write { src, dst, len } => {
                let o = (dst - b0 - 320 * KB) as usize;
                write_model[o..o + len as usize].copy_from_slice(s.a.mem.bytes(src, len).unwrap());
            }
            Op::Read { dst, src, len } => {
                let o = (dst - a0 - 128 * KB) as usize;
                read_model[o..o + len as usize].copy_from_slice(s.b.mem.bytes(src, len).unwrap());
            }
            _ => {}
        }
    }

    let idle = s.run_until_idle(600_000_000_000);
    check(idle, || {
        format!(
            "did not go idle; A {:?} B {:?}",
            s.a.qp.stats(),
            s.b.qp.stats()
        )
    })?;
    if s.a.qp.state() != QpState::Rts || s.b.qp.state() != QpState::Rts {
        // the one legitimate way to fail: a requester ran out of retries after
        // retry_cnt + 1 rounds in a row (timeouts, or sequence NAKs for its oldest PSN)
        // without its oldest PSN moving, which a lossy network can do to any transport (and
        // then its peer's requests go unanswered: the peer may end the same way)
        let need = u32::from(params.retry_cnt) + 1;
        let mut firsts = Vec::new();
        let mut legit = faults.loss > 0.0;
        for n in [&mut s.a, &mut s.b] {
            if n.qp.state() == QpState::Rts {
                continue;
            }
            let mut first = None;
            while let Some(c) = n.qp.poll_send_completion() {
                if c.status != WcStatus::Success {
                    first = Some(c);
                    break;
                }
            }
            legit &= n.qp.state() == QpState::Err
                && first.is_some_and(|c| c.status == WcStatus::RetryExcErr)
                && n.rounds_at_error >= Some(need);
            firsts.extend(first);
        }
        if legit {
            return Ok(Outcome::RetryExceeded(s.stats));
        }
        let mut errs = firsts;
        while let Some(c) =
            s.a.qp
                .poll_completion()
                .or_else(|| s.b.qp.poll_completion())
        {
            if c.status != WcStatus::Success && errs.len() < 3 {
                errs.push(c);
            }
        }
        return Err(format!(
            "QP states {:?} {:?}; mtu {:?}; window {window}; first errors {errs:?}; rounds \
             without progress at the error A {:?} B {:?} (retry_cnt {}); A {:?} B {:?}",
            s.a.qp.state(),
            s.b.qp.state(),
            mtu,
            s.a.rounds_at_error,
            s.b.rounds_at_error,
            params.retry_cnt,
            s.a.qp.stats(),
            s.b.qp.stats()
        ));
    }

    // requester completions: signaled ones, in order, all successful
    let mut got = Vec::new();
    while let Some(c) = s.a.qp.poll_send_completion() {
        check(c.status == WcStatus::Success, || {
            format!("A send completion {c:?}")
        })?;
        got.push(c.wr_id);
    }
    check(got == signaled, || {
        format!("A completions {got:?} expected {signaled:?}")
    })?;
    // receive completions at B: exactly once, in order, byte-exact
    let mut k = 0;
    for op in &ops {
        if let Op::Send { src, len, imm } = *op {
            let c =
                s.b.qp
                    .poll_recv_completion()
                    .ok_or_else(|| format!("missing receive {k}"))?;
            check(
                c.status == WcStatus::Success && c.wr_id == 1000 + k && c.opcode == WcOpcode::Recv,
                || format!("B recv {c:?}"),
            )?;
            check(c.byte_len as u64 == len && c.imm() == imm, || {
                format!("B recv {k} len/imm {c:?} want {len} {imm:?}")
            })?;
            let got = s.b.mem.bytes(b0 + k * 8 * KB, len).unwrap();
            check(got == s.a.mem.bytes(src, len).unwrap(), || {
                format!("SEND {k} data differs")
            })?;
            k += 1;
        }
    }
    check(s.b.qp.poll_recv_completion().is_none(), || {
        "extra receive completion at B".into()
    })?;
    // B -> A
    for i in 0..nback as u64 {
        let c =
            s.b.qp
                .poll_send_completion()
                .ok_or("missing B send completion")?;
        check(c.status == WcStatus::Success && c.wr_id == 3000 + i, || {
            format!("B send {c:?}")
        })?;
        let r = s.a.qp.poll_recv_completion().ok_or("missing A receive")?;
        check(r.wr_id == 2000 + i && r.byte_len as u64 == 100 + i, || {
            format!("A recv {r:?}")
        })?;
        let want =
            s.b.mem
                .bytes(b0 + 448 * KB + i * 100, 100 + i)
                .unwrap()
                .to_vec();
        check(
            s.a.mem.bytes(a0 + 384 * KB + i * 4 * KB, 100 + i).unwrap() == want,
            || "B->A data differs".into(),
        )?;
    }
    // memory: WRITEs and READs byte-exact
    check(
        s.b.mem.bytes(b0 + 320 * KB, 128 * KB).unwrap() == write_model,
        || "WRITE area differs".into(),
    )?;
    check(
        s.a.mem.bytes(a0 + 128 * KB, 256 * KB).unwrap() == read_model,
        || "READ results differ".into(),
    )?;
    // atomics exactly once, in order
    let mut slot = 0;
    for op in &ops {
        let want_orig = counter_model;
        match *op {
            Op::Fadd { add } => counter_model = counter_model.wrapping_add(add),
            Op::Cas { compare, swap } => {
                if counter_model == compare {
                    counter_model = swap
                }
            }
            _ => continue,
        }
        let got = u64::from_ne_bytes(
            s.a.mem
                .bytes(atomic_slots[slot], 8)
                .unwrap()
                .try_into()
                .unwrap(),
        );
        check(got == want_orig, || {
            format!("atomic {slot}: original {got:#x} want {want_orig:#x}")
        })?;
        slot += 1;
    }
    let fin = u64::from_ne_bytes(s.b.mem.bytes(counter, 8).unwrap().try_into().unwrap());
    check(fin == counter_model, || {
        format!("counter {fin:#x} want {counter_model:#x}")
    })?;
    // canaries: nothing outside the registered buffers changed
    for (mem, base, buf) in [(&s.a.mem, BASE_A, a0), (&s.b.mem, BASE_B, b0)] {
        let below = mem.bytes(base, buf - base).unwrap();
        let above = mem
            .bytes(buf + 512 * KB, MEM_SIZE as u64 - (buf - base) - 512 * KB)
            .unwrap();
        check(below.iter().chain(above).all(|&b| b == 0), || {
            "memory outside the region changed".into()
        })?;
    }
    Ok(Outcome::Done(s.stats))
}

#[test]
fn sim_clean() {
    run_mix("clean", Faults::clean());
}

#[test]
fn sim_loss_20() {
    run_mix(
        "loss20",
        Faults {
            jitter_ns: 1_000,
            ..Faults::lossy(0.2)
        },
    );
}

#[test]
fn sim_dup_reorder() {
    run_mix(
        "dup+reorder",
        Faults {
            dup: 0.15,
            reorder: 0.3,
            jitter_ns: 5_000,
            ..Faults::clean()
        },
    );
}

#[test]
fn sim_corrupt() {
    run_mix(
        "corrupt",
        Faults {
            corrupt: 0.1,
            ..Faults::clean()
        },
    );
}

#[test]
fn sim_all_faults() {
    run_mix("all", Faults::all(0.1));
}
