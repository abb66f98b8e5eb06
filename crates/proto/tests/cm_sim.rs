//! Deterministic two-agent simulation of the IB CM: seeded loss, duplication, delay
//! (and so reordering) of CM MADs on a virtual clock.
//!
//! Each seed picks a scenario (connect and disconnect from either side, simultaneous DREQs,
//! consumer reject with private data, no listener, peer vanishing) and network faults. The
//! invariant: every connection's events follow the CM grammar (ESTABLISHED at most once, then
//! only disconnect events and one TIMEWAIT_EXIT; or one clean error), the scenario's goal is
//! reached (both sides established then disconnected, or the expected REJ), the simulation
//! goes quiet (no timer left: never a hang), and after destroying everything both agents are
//! empty.
//!
//! `RDMA_SIM_SEEDS=N` runs seeds 0..N (default 200); `RDMA_SIM_SEED=S` runs only seed S.
//! A failure prints its seed.

#![allow(clippy::needless_range_loop)] // two sides indexed by 0 and 1 read best as such

use std::collections::BTreeMap;

use rdma_proto::cm::*;
use rdma_wire::cm::RejectReason;
use rdma_wire::mad::MAD_LEN;

const SID: u64 = 0x0000_0000_0106_1b58;
const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    ActiveDisconnects,
    PassiveDisconnects,
    Simultaneous,
    Reject,
    NoListener,
    Vanish,
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Accept(ConnHandle),
    Reject(ConnHandle),
    Rtu(ConnHandle),
    Disconnect(ConnHandle),
}

struct Sim {
    rng: Rng,
    now: u64,
    agents: [CmAgent; 2],
    addrs: [PeerAddr; 2],
    scenario: Scenario,
    loss: f64,
    dup: f64,
    vanish_at: Option<u64>,
    net: Vec<(u64, u64, usize, [u8; MAD_LEN])>,
    seq: u64,
    actions: Vec<(u64, usize, Action)>,
    logs: [BTreeMap<ConnHandle, Vec<CmEvent>>; 2],
    disconnect_at: Option<u64>,
    /// The starting PSN the REQ carried, and those of the REPs B sent.
    req_psn: u32,
    rep_psns: Vec<u32>,
    /// Contents a peer received differently from what was sent.
    bad: Vec<String>,
}

/// The REQ's private data (all 92 bytes a REQ holds) and the QPNs of both sides.
const REQ_PD: [u8; 92] = [0x5a; 92];
const QPN_A: u32 = 0x100;
const QPN_B: u32 = 0x201;

const REJ_PD: &[u8] = b"refvm-rej: consumer reject from cmrej server\0";

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let scenario = match rng.below(6) {
            0 => Scenario::ActiveDisconnects,
            1 => Scenario::PassiveDisconnects,
            2 => Scenario::Simultaneous,
            3 => Scenario::Reject,
            4 => Scenario::NoListener,
            _ => Scenario::Vanish,
        };
        let loss = [0.0, 0.05, 0.15, 0.3][rng.below(4) as usize];
        let dup = [0.0, 0.1, 0.3][rng.below(3) as usize];
        let vanish_at = (scenario == Scenario::Vanish).then(|| rng.below(12 * S));
        let cfg = |guid, seed| AgentConfig {
            ca_guid: guid,
            seed,
            ..AgentConfig::default()
        };
        let agents = [
            CmAgent::new(cfg(0xa, rng.next())),
            CmAgent::new(cfg(0xb, rng.next())),
        ];
        let addrs = [
            PeerAddr::new("::ffff:10.0.0.1".parse().unwrap(), 4791, 1),
            PeerAddr::new("::ffff:10.0.0.2".parse().unwrap(), 4791, 1),
        ];
        Sim {
            rng,
            now: 0,
            agents,
            addrs,
            scenario,
            loss,
            dup,
            vanish_at,
            net: Vec::new(),
            seq: 0,
            actions: Vec::new(),
            logs: [BTreeMap::new(), BTreeMap::new()],
            disconnect_at: (scenario == Scenario::Simultaneous).then_some(200 * S),
            req_psn: 0,
            rep_psns: Vec::new(),
            bad: Vec::new(),
        }
    }

    fn describe(&self) -> String {
        format!(
            "{:?} loss {} dup {} vanish {:?}",
            self.scenario, self.loss, self.dup, self.vanish_at
        )
    }

    /// Moves everything agent `i` wants to send onto the network, and its events to the app.
    fn pump(&mut self, i: usize) {
        while let Some((to, mad)) = self.agents[i].poll_transmit() {
            let j = if to.same_node(&self.addrs[0]) { 0 } else { 1 };
            assert_ne!(i, j, "agent sent to itself");
            if self.vanish_at.is_some_and(|t| self.now >= t) {
                continue;
            }
            let copies = if self.rng.chance(self.dup) { 2 } else { 1 };
            for _ in 0..copies {
                if self.rng.chance(self.loss) {
                    continue;
                }
                let at = self.now + self.rng.below(20 * MS);
                self.seq += 1;
                self.net.push((at, self.seq, j, mad));
            }
        }
        while let Some(e) = self.agents[i].poll_event() {
            self.app(i, e);
        }
    }

    fn app_delay(&mut self) -> u64 {
        // Mostly prompt, sometimes slower than the peer's retransmission timer, which
        // exercises the MRA paths.
        if self.rng.chance(0.15) {
            5 * S + self.rng.below(5 * S)
        } else {
            self.rng.below(50 * MS)
        }
    }

    fn app(&mut self, i: usize, e: CmEvent) {
        let conn = e.conn();
        self.logs[i].entry(conn).or_default().push(e.clone());
        let at = self.now;
        // what the peer sent arrives intact: QPN, PSN, the 92 bytes of private data
        let wrong = match (&e, i) {
            (CmEvent::ReqReceived(r), 1) => {
                r.req.local_qpn != QPN_A
                    || r.req.starting_psn != self.req_psn
                    || r.req.private_data[..] != REQ_PD[..]
            }
            (CmEvent::RepReceived(r), 0) => {
                r.rep.local_qpn != QPN_B || !self.rep_psns.contains(&r.rep.starting_psn)
            }
            (CmEvent::ReqReceived(_), _) | (CmEvent::RepReceived(_), _) => true,
            _ => false,
        };
        if wrong {
            self.bad.push(format!(
                "side {i} got {e:?} (REQ PSN sent {:#x}, REP PSNs sent {:x?})",
                self.req_psn, self.rep_psns
            ));
        }
        match e {
            CmEvent::ReqReceived(_) => {
                let d = self.app_delay();
                let act = if self.scenario == Scenario::Reject {
                    Action::Reject(conn)
                } else {
                    Action::Accept(conn)
                };
                self.actions.push((at + d, i, act));
            }
            CmEvent::RepReceived(_) => {
                let d = self.app_delay();
                self.actions.push((at + d, i, Action::Rtu(conn)));
            }
            CmEvent::Established { .. } => {
                let mine = matches!(
                    (self.scenario, i),
                    (Scenario::ActiveDisconnects, 0)
                        | (Scenario::PassiveDisconnects, 1)
                        | (Scenario::Vanish, 0)
                );
                if mine {
                    let d = self.rng.below(100 * MS);
                    self.actions.push((at + d, i, Action::Disconnect(conn)));
                } else if let Some(t) = self.disconnect_at {
                    self.actions.push((t.max(at), i, Action::Disconnect(conn)));
                }
            }
            CmEvent::DreqReceived { .. } => {
                let d = self.rng.below(20 * MS);
                self.actions.push((at + d, i, Action::Disconnect(conn)));
            }
            _ => {}
        }
    }

    fn act(&mut self, i: usize, a: Action) {
        let now = self.now;
        let ag = &mut self.agents[i];
        // Errors are fine here: the state may have moved on (e.g. a crossed DREP).
        let _ = match a {
            Action::Accept(c) => {
                let psn = ag.random_psn();
                self.rep_psns.push(psn);
                ag.send_rep(now, c, RepParams::new(0x200 + i as u32, psn))
            }
            Action::Reject(c) => ag.send_rej(now, c, RejectReason::ConsumerDefined, &[], REJ_PD),
            Action::Rtu(c) => ag.send_rtu(now, c),
            Action::Disconnect(c) => match ag.state(c) {
                Some(CmState::Established) | Some(CmState::DreqRcvd) => ag.disconnect(now, c),
                _ => Ok(()),
            },
        };
    }

    /// Runs until nothing is pending. Err on a hang.
    fn run(&mut self) -> Result<(), String> {
        for step in 0..200_000 {
            let t_net = self.net.iter().map(|p| (p.0, p.1)).min();
            let t_act = self.actions.iter().map(|a| a.0).min();
            let t_a = self.agents[0].poll_timeout();
            let t_b = self.agents[1].poll_timeout();
            let next = [t_net.map(|t| t.0), t_act, t_a, t_b]
                .into_iter()
                .flatten()
                .min();
            let Some(next) = next else {
                return Ok(());
            };
            if next > 6 * 3600 * S {
                return Err(format!("still busy at {} s (step {step}): hang", next / S));
            }
            self.now = self.now.max(next);
            if let Some(k) = self
                .net
                .iter()
                .position(|p| Some((p.0, p.1)) == t_net && p.0 <= self.now)
            {
                let (_, _, j, mad) = self.net.swap_remove(k);
                let from = self.addrs[1 - j];
                self.agents[j].handle_mad(self.now, from, &mad);
                self.pump(j);
                continue;
            }
            if let Some(k) = self.actions.iter().position(|a| a.0 <= self.now) {
                let (_, i, a) = self.actions.remove(k);
                self.act(i, a);
                self.pump(i);
                continue;
            }
            for i in 0..2 {
                self.agents[i].handle_timeout(self.now);
                self.pump(i);
            }
        }
        Err("too many steps: hang".into())
    }

    fn start(&mut self) -> Result<(), String> {
        if self.scenario != Scenario::NoListener {
            self.agents[1].listen(SID).map_err(|e| e.to_string())?;
        }
        self.req_psn = self.agents[0].random_psn();
        let mut p = ReqParams::new(SID, self.addrs[1], QPN_A, self.req_psn);
        p.path.local_gid = self.addrs[0].gid;
        p.private_data = REQ_PD.to_vec();
        self.agents[0].send_req(0, p).map_err(|e| e.to_string())?;
        self.pump(0);
        Ok(())
    }
}

/// Checks one connection's event sequence against the CM grammar. Returns whether it was
/// established.
fn check_grammar(log: &[CmEvent]) -> Result<bool, String> {
    let mut established = false;
    let mut ended = false;
    let mut disconnected = false;
    for e in log {
        if ended {
            return Err(format!("event after the end: {e:?}"));
        }
        match e {
            CmEvent::ReqReceived(_) | CmEvent::RepReceived(_) | CmEvent::MraReceived { .. } => {
                if established {
                    return Err(format!("{e:?} after ESTABLISHED"));
                }
            }
            CmEvent::Established { .. } => {
                if established {
                    return Err("ESTABLISHED twice".into());
                }
                established = true;
            }
            CmEvent::DreqReceived { .. }
            | CmEvent::DrepReceived { .. }
            | CmEvent::DreqTimeout { .. } => {
                if !established {
                    return Err(format!("{e:?} before ESTABLISHED"));
                }
                disconnected = true;
            }
            CmEvent::TimewaitExit { .. } => {
                if !disconnected && established {
                    return Err("TIMEWAIT_EXIT without a disconnect event".into());
                }
                ended = true;
            }
            CmEvent::RejReceived(_) => {
                if established {
                    return Err("REJ after ESTABLISHED".into());
                }
                ended = true;
            }
            CmEvent::ReqTimeout { .. } | CmEvent::RepTimeout { .. } => {
                if established {
                    return Err(format!("{e:?} after ESTABLISHED"));
                }
                ended = true;
            }
            other => return Err(format!("unexpected {other:?}")),
        }
    }
    if established && !ended && !log.iter().any(CmEvent::is_disconnect) {
        // Established and never disconnected: only legal when the peer vanished.
        return Ok(true);
    }
    Ok(established)
}

fn run_seed(seed: u64) -> Result<(), String> {
    let mut sim = Sim::new(seed);
    let ctx = sim.describe();
    let wrap = |e: String| format!("{ctx}: {e}");
    sim.start().map_err(wrap)?;
    sim.run().map_err(wrap)?;
    if std::env::var("RDMA_SIM_VERBOSE").is_ok() {
        eprintln!("seed {seed}: {ctx}, end {} ms", sim.now / MS);
        for i in 0..2 {
            for (c, log) in &sim.logs[i] {
                let names: Vec<String> = log
                    .iter()
                    .map(|e| {
                        format!("{e:?}")
                            .split([' ', '('])
                            .next()
                            .unwrap_or("")
                            .to_string()
                    })
                    .collect();
                eprintln!("  side {i} {c:?}: {}", names.join(" "));
            }
            eprintln!("  side {i} stats {:?}", sim.agents[i].stats());
        }
    }
    if !sim.bad.is_empty() {
        return Err(wrap(format!("contents differ at the peer: {:?}", sim.bad)));
    }
    // one REQ: at most one connection per side (a duplicated REQ must not make a second
    // passive one), exactly one each whenever the passive side got the REQ and answered.
    // The exception: once B has rejected the REQ it keeps no record of it (as Linux's ib_cm,
    // whose rejected cm_id goes back to idle and is destroyed), so a retransmitted or
    // duplicated REQ arriving after the REJ is a new request, rejected again; each such
    // passive connection saw exactly one event, its REQ.
    let per_side = [sim.logs[0].len(), sim.logs[1].len()];
    let want_both = matches!(
        sim.scenario,
        Scenario::ActiveDisconnects | Scenario::PassiveDisconnects | Scenario::Simultaneous
    );
    let rejected_again = sim.scenario == Scenario::Reject
        && per_side[0] == 1
        && per_side[1] >= 1
        && sim.logs[1]
            .values()
            .all(|l| matches!(&l[..], [CmEvent::ReqReceived(_)]));
    if !rejected_again
        && (per_side[0] > 1
            || per_side[1] > 1
            || (want_both && per_side != [1, 1])
            || (sim.scenario == Scenario::Reject && per_side != [1, 1]))
    {
        return Err(wrap(format!(
            "connections per side {per_side:?}: {:?}",
            sim.logs
        )));
    }
    let mut est = [0usize; 2];
    for i in 0..2 {
        for (c, log) in &sim.logs[i] {
            let e = check_grammar(log)
                .map_err(|e| wrap(format!("side {i} conn {c:?}: {e}: {log:?}")))?;
            est[i] += e as usize;
            let last = log.last();
            let quiet_established = sim.agents[i].state(*c) == Some(CmState::Established);
            if quiet_established && sim.scenario != Scenario::Vanish {
                return Err(wrap(format!(
                    "side {i} left established without a disconnect: {log:?}"
                )));
            }
            if !quiet_established && sim.agents[i].state(*c) != Some(CmState::Idle) {
                return Err(wrap(format!(
                    "side {i} conn {c:?} ended in {:?}: {log:?}",
                    sim.agents[i].state(*c)
                )));
            }
            let _ = last;
        }
    }
    let a_log: Vec<CmEvent> = sim.logs[0].values().flatten().cloned().collect();
    match sim.scenario {
        Scenario::ActiveDisconnects | Scenario::PassiveDisconnects | Scenario::Simultaneous => {
            if est != [1, 1] {
                return Err(wrap(format!("established {est:?}; logs {:?}", sim.logs)));
            }
            for i in 0..2 {
                let log: Vec<&CmEvent> = sim.logs[i].values().flatten().collect();
                if !matches!(log.last(), Some(CmEvent::TimewaitExit { .. })) {
                    return Err(wrap(format!("side {i} did not finish: {log:?}")));
                }
            }
        }
        Scenario::Reject => {
            if est != [0, 0] {
                return Err(wrap(format!("established {est:?} in a reject")));
            }
            match a_log.last() {
                Some(CmEvent::RejReceived(r))
                    if r.reason == RejectReason::ConsumerDefined
                        && r.private_data.starts_with(REJ_PD) => {}
                other => return Err(wrap(format!("active ended with {other:?}"))),
            }
        }
        Scenario::NoListener => match a_log.last() {
            Some(CmEvent::RejReceived(r)) if r.reason == RejectReason::InvalidServiceId => {}
            other => return Err(wrap(format!("active ended with {other:?}"))),
        },
        Scenario::Vanish => {
            // Anything clean: checked above by the grammar and the quiet end.
            if est[1] > est[0] {
                return Err(wrap(format!("passive established alone: {est:?}")));
            }
        }
    }
    // Destroy everything; the agents must drain to empty.
    for i in 0..2 {
        let conns: Vec<ConnHandle> = sim.logs[i].keys().copied().collect();
        for c in conns {
            let now = sim.now;
            sim.agents[i]
                .destroy(now, c)
                .map_err(|e| wrap(e.to_string()))?;
            sim.pump(i);
        }
    }
    sim.run().map_err(wrap)?;
    for i in 0..2 {
        if sim.agents[i].conn_count() != 0 {
            return Err(wrap(format!(
                "side {i} holds {} connections after destroy",
                sim.agents[i].conn_count()
            )));
        }
    }
    Ok(())
}

#[test]
fn cm_simulation_seeds() {
    let seeds: Vec<u64> = match std::env::var("RDMA_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("RDMA_SIM_SEED")],
        Err(_) => {
            let n = std::env::var("RDMA_SIM_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(200);
            (0..n).collect()
        }
    };
    let started = std::time::Instant::now();
    let mut failures = Vec::new();
    for &seed in &seeds {
        let r = std::panic::catch_unwind(|| run_seed(seed));
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("seed {seed}: {e}")),
            Err(_) => failures.push(format!("seed {seed}: panicked")),
        }
    }
    eprintln!(
        "cm simulation: {} seeds in {:?}, {} failed",
        seeds.len(),
        started.elapsed(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failing seeds (rerun one with RDMA_SIM_SEED=N):\n{}",
        failures.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
