//! Automatic path migration in the deterministic simulator: a SEND / WRITE / READ stream from
//! A to B over two paths (port 1 primary, port 2 alternate), with the primary failing
//! mid-stream.
//!
//! `RDMA_SIM_SEEDS=n` sets the seeds per scenario (default 40), `RDMA_SIM_SEED=n` replays
//! one, `RDMA_SIM_APM_OPS=n` the work requests per seed (default 40, at most 60),
//! `RDMA_SIM_WINDOW=n` forces the send window (default per seed: 4, 8 or 16 PSNs).
//!
//! Invariant of every seed: each work request completes exactly once, in order, with the
//! right status and length; each SEND lands once in its receive, in order; every byte that
//! was written, sent or read is exact and nothing outside the targets changed; and the QPs
//! report the path migration events the scenario implies. A seed may end in a legitimate
//! `RetryExcErr` on the lossy alternate (`retry_cnt + 1` rounds without progress there, as the
//! simulator counts them): it is checked like a failure (everything completed before it
//! exact, the rest flushed), and at most one seed in 200 (+1) may end so.

use rdma_proto::rc::{MigrationCause, QpEvent};
use rdma_proto::sim::{load_alt_path, ConnParams, Faults, RcPair, Rng, ALT_PORT};
use rdma_proto::verbs::{
    Completion, MigState, Mtu, QpState, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

const KB: u64 = 1024;
/// Hang guard in virtual time.
const LIMIT_NS: u64 = 60_000_000_000;

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("RDMA_SIM_SEED") {
        return vec![s.parse().expect("RDMA_SIM_SEED must be a number")];
    }
    let n = std::env::var("RDMA_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40u64);
    (0..n).collect()
}

fn ops_per_seed() -> usize {
    std::env::var("RDMA_SIM_APM_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40usize)
        .clamp(4, 60)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    /// The owner forces the migration (link down) and the primary goes black.
    Forced,
    /// The primary goes black: A migrates when its retries run out.
    Blackout,
    /// Both paths go black: A migrates, then the alternate exhausts too.
    BothDie,
    /// Blackout, then the primary comes back, is loaded as the new alternate (Rearm), arms,
    /// and the owner moves the connection back to it.
    ReturnHome,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Send,
    Write,
    Read,
}

#[derive(Clone, Copy, Debug)]
struct Op {
    kind: Kind,
    /// A's address (source of SEND / WRITE, destination of READ).
    a: u64,
    /// B's address (receive slot, WRITE destination, READ source).
    b: u64,
    len: u64,
}

fn black() -> Faults {
    Faults {
        loss: 1.0,
        ..Faults::clean()
    }
}

fn lossy_dup(loss: f64, dup: f64) -> Faults {
    Faults {
        loss,
        dup,
        reorder: 0.1,
        jitter_ns: 2_000,
        ..Faults::clean()
    }
}

fn check(c: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if c {
        Ok(())
    } else {
        Err(msg())
    }
}

struct Run {
    s: RcPair,
    ops: Vec<Op>,
    a_comps: Vec<Completion>,
    b_comps: Vec<Completion>,
    a_events: Vec<QpEvent>,
    b_events: Vec<QpEvent>,
    a_init: Vec<u8>,
    b_init: Vec<u8>,
}

impl Run {
    fn drain(&mut self) {
        while let Some(c) = self.s.a.qp.poll_completion() {
            self.a_comps.push(c);
        }
        while let Some(c) = self.s.b.qp.poll_completion() {
            self.b_comps.push(c);
        }
        while let Some(e) = self.s.a.qp.poll_event() {
            self.a_events.push(e);
        }
        while let Some(e) = self.s.b.qp.poll_event() {
            self.b_events.push(e);
        }
    }

    /// Runs in 5 µs slices until A has `k` completions or everything is idle.
    fn run_until_completions(&mut self, k: usize) {
        self.run_until(|r| r.a_comps.len() >= k)
    }

    /// Runs in 5 µs slices until `done` or everything is idle.
    fn run_until(&mut self, done: impl Fn(&Run) -> bool) {
        loop {
            let until = self.s.now + 5_000;
            let idle = self.s.run_until_idle(until);
            // the simulator's clock only moves to events: move it to the slice's end
            self.s.now = self.s.now.max(until);
            self.drain();
            if idle || done(self) || self.s.now > LIMIT_NS {
                return;
            }
        }
    }

    fn finish(&mut self) -> Result<(), String> {
        let idle = self.s.run_until_idle(self.s.now + LIMIT_NS);
        self.drain();
        check(idle, || "not idle within the hang guard".into())
    }
}

fn setup(seed: u64, n: usize) -> Run {
    let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9) ^ 0xA9A9);
    let mtu = [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096][rng.below(3) as usize];
    let params = ConnParams {
        mtu,
        rd_atomic: 1 + rng.below(8) as u8,
        // a send window bounds the go-back-N rounds a lost READ response can cause:
        // RDMA_SIM_WINDOW=0 RDMA_SIM_SEED=2 (no window) runs 44 s instead of 0.1 s, a
        // go-back-N storm the transport shows without any migration too (docs/HA.md)
        max_outstanding_psns: std::env::var("RDMA_SIM_WINDOW")
            .ok()
            .and_then(|w| w.parse().ok())
            .unwrap_or([4, 8, 16][rng.below(3) as usize]),
        ..ConnParams::default()
    };
    let mut s = RcPair::with_alt_path(seed, lossy_dup(0.05, 0.05), &params);
    // the alternate: as lossy as the primary, or worse
    s.alt_faults = Some([lossy_dup(0.05, 0.05), lossy_dup(0.15, 0.1)][rng.below(2) as usize]);
    let (a0, b0) = (s.a.buf_addr, s.b.buf_addr);
    // A: sources [0,128K), READ destinations [128K,448K)
    // B: receive slots [0,256K) (6K each), WRITE area [256K,448K), READ source [448K,512K)
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
    let a_init = s.a.mem.bytes(a0, 512 * KB).unwrap().to_vec();
    let b_init = s.b.mem.bytes(b0, 512 * KB).unwrap().to_vec();
    let maxlen = 6 * KB;
    let (mut slot, mut woff, mut roff) = (0u64, 0u64, 0u64);
    let mut ops = Vec::new();
    for _ in 0..n {
        let len = 1 + rng.below(maxlen);
        let a_src = a0 + rng.below(128 * KB - len);
        let op = match rng.below(3) {
            0 if slot < 42 => {
                slot += 1;
                Op {
                    kind: Kind::Send,
                    a: a_src,
                    b: b0 + (slot - 1) * 6 * KB,
                    len,
                }
            }
            1 if woff + len <= 192 * KB => {
                woff += len;
                Op {
                    kind: Kind::Write,
                    a: a_src,
                    b: b0 + 256 * KB + woff - len,
                    len,
                }
            }
            _ if roff + len <= 320 * KB => {
                roff += len;
                Op {
                    kind: Kind::Read,
                    a: a0 + 128 * KB + roff - len,
                    b: b0 + 448 * KB + rng.below(64 * KB - len),
                    len,
                }
            }
            _ => Op {
                kind: Kind::Write,
                a: a_src,
                b: b0 + 256 * KB,
                len: 0,
            },
        };
        ops.push(op);
    }
    Run {
        s,
        ops,
        a_comps: Vec::new(),
        b_comps: Vec::new(),
        a_events: Vec::new(),
        b_events: Vec::new(),
        a_init,
        b_init,
    }
}

fn post_all(r: &mut Run) {
    let (lkey_a, lkey_b, rkey_b) = (r.s.a.lkey, r.s.b.lkey, r.s.b.rkey);
    for (i, op) in r.ops.iter().enumerate() {
        if let Kind::Send = op.kind {
            let wr = RecvWr::new(i as u64).with_sge(Sge {
                addr: op.b,
                length: 6 * KB as u32,
                lkey: lkey_b,
            });
            r.s.b.qp.post_recv(&wr).unwrap();
        }
        let sop = match op.kind {
            Kind::Send => SendOp::Send,
            Kind::Write => SendOp::RdmaWrite {
                remote_addr: op.b,
                rkey: rkey_b,
            },
            Kind::Read => SendOp::RdmaRead {
                remote_addr: op.b,
                rkey: rkey_b,
            },
        };
        let mut wr = SendWr::new(i as u64, sop).with_flags(SendFlags::SIGNALED);
        if op.len > 0 {
            wr = wr.with_sge(Sge {
                addr: op.a,
                length: op.len as u32,
                lkey: lkey_a,
            });
        }
        r.s.a.qp.post_send(&r.s.a.mem, &wr).unwrap();
    }
}

/// Completions, receives and memory for the first `done` work requests (all of them when
/// the QP did not fail); the rest must not have touched memory beyond what a partial
/// transfer may write (their targets are not checked).
fn check_data(r: &Run, failed: bool) -> Result<(), String> {
    let n = r.ops.len();
    check(r.a_comps.len() == n, || {
        format!("A has {} completions for {n} WRs", r.a_comps.len())
    })?;
    let done = r
        .a_comps
        .iter()
        .position(|c| c.status != WcStatus::Success)
        .unwrap_or(n);
    check(failed == (done < n), || {
        format!("{done} of {n} WRs succeeded, failure expected: {failed}")
    })?;
    for (i, c) in r.a_comps.iter().enumerate() {
        let op = &r.ops[i];
        check(c.wr_id == i as u64, || {
            format!("A completion {i} is for WR {}", c.wr_id)
        })?;
        let want_op = match op.kind {
            Kind::Send => WcOpcode::Send,
            Kind::Write => WcOpcode::RdmaWrite,
            Kind::Read => WcOpcode::RdmaRead,
        };
        check(c.opcode == want_op, || {
            format!("WR {i}: opcode {:?}", c.opcode)
        })?;
        if i < done {
            check(c.byte_len as u64 == op.len, || {
                format!("WR {i}: byte_len {} of {}", c.byte_len, op.len)
            })?;
        } else {
            let want = if i == done {
                WcStatus::RetryExcErr
            } else {
                WcStatus::WrFlushErr
            };
            check(c.status == want, || {
                format!("WR {i}: {:?}, want {want:?}", c.status)
            })?;
        }
    }
    // receives: the SENDs among the completed WRs, in order, each exactly once
    let sends: Vec<usize> = (0..n)
        .filter(|&i| matches!(r.ops[i].kind, Kind::Send))
        .collect();
    let ok_recvs: Vec<&Completion> = r
        .b_comps
        .iter()
        .filter(|c| c.status == WcStatus::Success)
        .collect();
    let sent_done = sends.iter().filter(|&&i| i < done).count();
    check(
        ok_recvs.len() >= sent_done && ok_recvs.len() <= sends.len(),
        || {
            format!(
                "{} receives for {sent_done} completed SENDs",
                ok_recvs.len()
            )
        },
    )?;
    if !failed {
        check(r.b_comps.len() == sends.len(), || {
            format!(
                "B: {} completions for {} SENDs",
                r.b_comps.len(),
                sends.len()
            )
        })?;
    }
    for (k, c) in ok_recvs.iter().enumerate() {
        let i = sends[k];
        check(c.wr_id == i as u64, || {
            format!("receive {k} is WR {}", c.wr_id)
        })?;
        check(c.byte_len as u64 == r.ops[i].len, || {
            format!("receive {k}: byte_len {} of {}", c.byte_len, r.ops[i].len)
        })?;
    }
    // memory: every completed WR's bytes exact
    let (a0, b0) = (r.s.a.buf_addr, r.s.b.buf_addr);
    let a_mem = r.s.a.mem.bytes(a0, 512 * KB).unwrap();
    let b_mem = r.s.b.mem.bytes(b0, 512 * KB).unwrap();
    let mut a_model = r.a_init.clone();
    let mut b_model = r.b_init.clone();
    let received = ok_recvs.len();
    for (i, op) in r.ops.iter().enumerate() {
        let (ao, bo, len) = ((op.a - a0) as usize, (op.b - b0) as usize, op.len as usize);
        let applied = match op.kind {
            Kind::Send => sends
                .iter()
                .position(|&x| x == i)
                .is_some_and(|k| k < received),
            _ => i < done,
        };
        if !applied {
            if i >= done {
                // a WR that did not complete may have written part of its target
                let (dst, cur) = match op.kind {
                    Kind::Read => (&mut a_model[ao..ao + len], &a_mem[ao..ao + len]),
                    _ => (&mut b_model[bo..bo + len], &b_mem[bo..bo + len]),
                };
                dst.copy_from_slice(cur);
            }
            continue;
        }
        match op.kind {
            Kind::Send | Kind::Write => {
                let src = r.a_init[ao..ao + len].to_vec();
                b_model[bo..bo + len].copy_from_slice(&src);
            }
            Kind::Read => {
                let src = r.b_init[bo..bo + len].to_vec();
                a_model[ao..ao + len].copy_from_slice(&src);
            }
        }
    }
    if let Some(i) = (0..a_mem.len()).find(|&i| a_mem[i] != a_model[i]) {
        return Err(format!("A's memory differs at offset {i:#x}"));
    }
    if let Some(i) = (0..b_mem.len()).find(|&i| b_mem[i] != b_model[i]) {
        return Err(format!("B's memory differs at offset {i:#x}"));
    }
    Ok(())
}

fn migrated(e: &QpEvent) -> Option<(MigrationCause, u8, u8)> {
    match *e {
        QpEvent::PathMigrated {
            cause,
            from_port,
            to_port,
        } => Some((cause, from_port, to_port)),
        _ => None,
    }
}

/// Ok(true): the seed ended in a legitimate `RetryExcErr` on the lossy alternate (bad luck:
/// `retry_cnt + 1` rounds without progress there), checked like a failure.
fn scenario(seed: u64, sc: Scenario) -> Result<bool, String> {
    let n = ops_per_seed();
    let mut r = setup(seed, n);
    post_all(&mut r);
    let mut ev_rng = Rng::new(seed ^ 0x00A9_0A9A);
    let k = 1 + ev_rng.below(n as u64 / 2) as usize;
    r.run_until_completions(k);
    check(r.a_comps.len() < n, || {
        "the stream ended before the failure".into()
    })?;
    check(r.s.a.qp.path_mig_state() == MigState::Armed, || {
        format!("A not armed after traffic: {:?}", r.s.a.qp.path_mig_state())
    })?;
    match sc {
        Scenario::Forced => {
            r.s.faults = black();
            r.s.a.qp.migrate().map_err(|e| format!("migrate: {e}"))?;
        }
        Scenario::Blackout | Scenario::ReturnHome => r.s.faults = black(),
        Scenario::BothDie => {
            r.s.faults = black();
            r.s.alt_faults = Some(black());
        }
    }
    if sc == Scenario::ReturnHome {
        // run until A migrated and a few more WRs completed on the alternate
        r.run_until(|r| r.s.a.qp.migrations() > 0);
        let k2 = (r.a_comps.len() + 3).min(n);
        r.run_until_completions(k2);
        check(r.s.a.qp.attr().port_num == ALT_PORT, || {
            "A did not migrate".into()
        })?;
        // the primary is back: both sides load it as the new alternate
        r.s.faults = lossy_dup(0.05, 0.05);
        let t = r.s.a.qp.attr().timeout;
        load_alt_path(&mut r.s.a.qp, MigState::Rearm, t).map_err(|e| e.to_string())?;
        load_alt_path(&mut r.s.b.qp, MigState::Rearm, t).map_err(|e| e.to_string())?;
        check(r.s.a.qp.migrate().is_err(), || {
            "migrate allowed in Rearm".into()
        })?;
        // A arms when the first packet B sent after its own Rearm arrives (MigReq clear)
        r.run_until(|r| r.s.a.qp.path_mig_state() == MigState::Armed || r.a_comps.len() == n);
        if r.a_comps.len() < n {
            check(r.s.a.qp.path_mig_state() == MigState::Armed, || {
                format!("A not re-armed: {:?}", r.s.a.qp.path_mig_state())
            })?;
            r.s.alt_faults = Some(black()); // the alternate fails now
            r.s.a
                .qp
                .migrate()
                .map_err(|e| format!("migrate back: {e}"))?;
        }
    }
    r.finish()?;
    let a_fail = r
        .a_events
        .iter()
        .filter(|e| matches!(e, QpEvent::PathMigrationFailed { .. }))
        .count();
    // rounds since the last progress: with none since the migration they span both paths
    let rounds_needed = 8 * (1 + a_fail as u32);
    let unlucky = sc != Scenario::BothDie
        && r.s.a.qp.state() == QpState::Err
        && r.s.a.rounds_at_error.is_some_and(|n| n >= rounds_needed);
    let failed = sc == Scenario::BothDie || unlucky;
    check_data(&r, failed)?;
    check(
        r.s.a.qp.state() == if failed { QpState::Err } else { QpState::Rts },
        || format!("A ends in {:?}", r.s.a.qp.state()),
    )?;
    check(r.s.stats.emit_errors == 0, || "emit errors".into())?;
    let a_mig: Vec<_> = r.a_events.iter().filter_map(migrated).collect();
    let b_mig: Vec<_> = r.b_events.iter().filter_map(migrated).collect();
    let first = match sc {
        Scenario::Forced => MigrationCause::Forced,
        _ => MigrationCause::RetryExhausted,
    };
    check(a_mig.first() == Some(&(first, 1, ALT_PORT)), || {
        format!("A's migrations: {a_mig:?}")
    })?;
    check(
        a_fail == usize::from(failed) || (unlucky && a_fail == 0),
        || format!("A's events: {:?}", r.a_events),
    )?;
    if !failed {
        check(
            b_mig.first() == Some(&(MigrationCause::Peer, 1, ALT_PORT)),
            || format!("B's migrations: {b_mig:?}"),
        )?;
        check(b_mig.len() == a_mig.len(), || {
            format!("A migrated {a_mig:?}, B {b_mig:?}")
        })?;
    }
    let want_migrations = if sc == Scenario::ReturnHome && a_mig.len() == 2 {
        check(a_mig[1] == (MigrationCause::Forced, ALT_PORT, 1), || {
            format!("A's second migration: {a_mig:?}")
        })?;
        check(
            unlucky || (r.s.a.qp.attr().port_num == 1 && r.s.b.qp.attr().port_num == 1),
            || "not back on port 1".into(),
        )?;
        2
    } else {
        1
    };
    check(a_mig.len() == want_migrations, || {
        format!("A's migrations: {a_mig:?}")
    })?;
    Ok(unlucky)
}

fn run(sc: Scenario, seeds: &[u64]) {
    let mut unlucky = Vec::new();
    for &seed in seeds {
        let t = std::time::Instant::now();
        let r = scenario(seed, sc);
        if std::env::var_os("RDMA_SIM_TIMES").is_some() {
            eprintln!("{sc:?} seed {seed}: {:?}", t.elapsed());
        }
        match r {
            Ok(true) => unlucky.push(seed),
            Ok(false) => {}
            Err(e) => panic!("{sc:?}: seed {seed} failed: {e}\nreplay with RDMA_SIM_SEED={seed}"),
        }
    }
    // bad luck is rare: 1 seed in 1,000 of Blackout at the time of writing (seed 746)
    assert!(
        unlucky.len() <= seeds.len() / 200 + 1,
        "{sc:?}: too many seeds ended in RetryExcErr on the alternate: {unlucky:?}"
    );
}

#[test]
fn apm_forced_migration_mid_stream() {
    run(Scenario::Forced, &seeds());
}

#[test]
fn apm_primary_blackout_migrates_on_retry_exhaustion() {
    run(Scenario::Blackout, &seeds());
}

#[test]
fn apm_both_paths_dead_reports_migration_error() {
    let s = seeds();
    let n = s.len().div_ceil(4);
    run(Scenario::BothDie, &s[..n]);
}

#[test]
fn apm_returns_to_the_restored_primary() {
    run(Scenario::ReturnHome, &seeds());
}
