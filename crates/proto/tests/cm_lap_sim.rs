//! LAP / APR between two CM agents over a seeded lossy, duplicating, reordering network.
//!
//! Each seed connects with an alternate path in the REQ, then the active side loads a new
//! alternate with a LAP; the passive side answers (sometimes after an MRA) with APR accept or
//! reject. Invariant: each side sees each exchange's event exactly once (LapReceived,
//! MraLapReceived at most once, AprReceived), both sides end with the same view of the
//! alternate path, the LAP sub-state is idle again and the network goes quiet.
//!
//! `RDMA_SIM_SEEDS=N` runs seeds 0..N (default 100); `RDMA_SIM_SEED=S` only seed S.

use std::net::Ipv6Addr;

use rdma_proto::cm::*;
use rdma_proto::sim::Rng;
use rdma_wire::cm::{ApStatus, CmMadRepr, CmMessage, CmPathRepr};
use rdma_wire::mad::MAD_LEN;

const SID: u64 = 0x0000_0000_0106_1b58;

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("RDMA_SIM_SEED") {
        return vec![s.parse().expect("RDMA_SIM_SEED must be a number")];
    }
    let n = std::env::var("RDMA_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100u64);
    (0..n).collect()
}

fn gid(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// Side `i`'s path to the other (A is 0, B is 1): where its MADs go and arrive.
fn path_to(i: usize) -> CmPath {
    let (a, b) = (gid("::ffff:192.0.2.2"), gid("::ffff:192.0.2.3"));
    if i == 0 {
        CmPath::new(a, b, 1)
    } else {
        CmPath::new(b, a, 1)
    }
}

fn path_params(local: &str, remote: &str) -> PathParams {
    PathParams {
        local_gid: gid(local),
        remote_gid: gid(remote),
        ..PathParams::default()
    }
}

struct Net {
    rng: Rng,
    now: u64,
    agents: [CmAgent; 2],
    /// (deliver at, sequence, to, mad)
    flight: Vec<(u64, u64, usize, [u8; MAD_LEN])>,
    seq: u64,
    loss: f64,
    dup: f64,
    /// Side that receives nothing from now on.
    deaf: Option<usize>,
    ap_log: [Vec<ApEvent>; 2],
    cm_log: [Vec<CmEvent>; 2],
    conn: [Option<ConnHandle>; 2],
}

impl Net {
    fn new(seed: u64, loss: f64, dup: f64) -> Self {
        let cfg = |guid, s| AgentConfig {
            ca_guid: guid,
            seed: s,
            ..AgentConfig::default()
        };
        Net {
            rng: Rng::new(seed ^ 0x1A9),
            now: 0,
            agents: [
                CmAgent::new(cfg(0xa, seed)),
                CmAgent::new(cfg(0xb, seed + 1)),
            ],
            flight: Vec::new(),
            seq: 0,
            loss,
            dup,
            deaf: None,
            ap_log: [Vec::new(), Vec::new()],
            cm_log: [Vec::new(), Vec::new()],
            conn: [None, None],
        }
    }

    fn pump(&mut self) {
        for i in 0..2 {
            while let Some(t) = self.agents[i].poll_transmit() {
                if self.rng.chance(self.loss) {
                    continue;
                }
                let copies = if self.rng.chance(self.dup) { 2 } else { 1 };
                for _ in 0..copies {
                    self.seq += 1;
                    let at = self.now + 1_000 + self.rng.below(200_000_000);
                    self.flight.push((at, self.seq, 1 - i, t.mad));
                }
            }
        }
    }

    /// Reacts to CM events as rdma_cm would (accept, RTU) and logs alternate path events.
    fn app(&mut self, answer: &mut dyn FnMut(&mut CmAgent, &ApEvent)) {
        for i in 0..2 {
            while let Some(e) = self.agents[i].poll_event() {
                let now = self.now;
                match &e {
                    CmEvent::ReqReceived(r) => {
                        self.conn[i] = Some(r.conn);
                        let p = RepParams::new(0x22, 7);
                        self.agents[i].send_rep(now, r.conn, p).unwrap();
                    }
                    CmEvent::RepReceived(r) => self.agents[i].send_rtu(now, r.conn).unwrap(),
                    _ => {}
                }
                self.cm_log[i].push(e);
            }
            while let Some(e) = self.agents[i].poll_ap_event() {
                answer(&mut self.agents[i], &e);
                self.ap_log[i].push(e);
            }
        }
    }

    /// Runs until nothing is in flight and no timer is due, or `limit` of virtual time.
    fn run(&mut self, limit: u64, answer: &mut dyn FnMut(&mut CmAgent, &ApEvent)) -> bool {
        loop {
            self.app(answer);
            self.pump();
            let next_pkt = self.flight.iter().map(|f| (f.0, f.1)).min();
            let next_timer = self.agents.iter().filter_map(|a| a.poll_timeout()).min();
            let next = match (next_pkt.map(|p| p.0), next_timer) {
                (None, None) => return true,
                (a, b) => a.into_iter().chain(b).min().unwrap(),
            };
            if next > limit {
                return false;
            }
            self.now = self.now.max(next);
            if let Some((at, seq)) = next_pkt.filter(|p| p.0 <= self.now) {
                let _ = at;
                let k = self.flight.iter().position(|f| f.1 == seq).unwrap();
                let (_, _, to, mad) = self.flight.swap_remove(k);
                if self.deaf != Some(to) {
                    self.agents[to].handle_mad(self.now, path_to(to), &mad);
                }
                continue;
            }
            let now = self.now;
            for a in &mut self.agents {
                a.handle_timeout(now);
            }
        }
    }

    fn connect(&mut self) -> Result<(), String> {
        self.agents[1].listen(SID).unwrap();
        let mut p = ReqParams::new(SID, path_to(0), 0x11, 5);
        p.alternate_path = Some(path_params("::ffff:198.51.100.2", "::ffff:198.51.100.3"));
        let c = self.agents[0].send_req(0, p).map_err(|e| e.to_string())?;
        self.conn[0] = Some(c);
        self.run(u64::MAX / 4, &mut |_, _| {});
        for i in 0..2 {
            let c = self.conn[i].ok_or("no connection")?;
            let st = self.agents[i].state(c);
            if st != Some(CmState::Established) {
                // the passive side may miss every RTU: first data would establish it
                if i == 1 && st == Some(CmState::Idle) {
                    return Err("passive side timed out its REP".into());
                }
                return Err(format!("side {i} in {st:?}"));
            }
        }
        Ok(())
    }
}

fn alt_gid(p: &CmPathRepr) -> Ipv6Addr {
    p.remote_port_gid
}

/// Retransmissions and duplicates the agents saw in one seed.
fn lap_seed(seed: u64) -> Result<(u64, u64), String> {
    let mut r = Rng::new(seed ^ 0x5EED);
    let (loss, dup) = (
        [0.0, 0.1, 0.2][r.below(3) as usize],
        [0.0, 0.1][r.below(2) as usize],
    );
    let mut n = Net::new(seed, loss, dup);
    n.connect()?;
    let (ca, cb) = (n.conn[0].unwrap(), n.conn[1].unwrap());
    // the REQ's alternate path is known to both sides
    let want = gid("::ffff:198.51.100.3");
    let a_alt = n.agents[0].alternate_path(ca).map(|p| alt_gid(&p));
    let b_req_alt = n.agents[1].alternate_path(cb).map(|p| p.remote_port_gid);
    if a_alt != Some(want) || b_req_alt != Some(want) {
        return Err(format!("REQ alternate: A {a_alt:?}, B {b_req_alt:?}"));
    }
    let accept = r.chance(0.7);
    let mra_first = r.chance(0.5);
    let status = if accept {
        ApStatus::Success
    } else {
        ApStatus::Reject
    };
    let new = path_params("::ffff:203.0.113.2", "::ffff:203.0.113.3");
    let now = n.now;
    n.agents[0]
        .send_lap(now, ca, &new, b"lap")
        .map_err(|e| e.to_string())?;
    if n.agents[0].send_lap(now, ca, &new, &[]).is_ok() {
        return Err("a second LAP while one is outstanding".into());
    }
    let mut answer = |ag: &mut CmAgent, e: &ApEvent| {
        if let ApEvent::LapReceived { conn, .. } = e {
            if mra_first {
                ag.send_mra_lap(*conn).unwrap();
            }
            ag.send_apr(*conn, status, &[], b"apr").unwrap();
        }
    };
    if !n.run(n.now + 600_000_000_000, &mut answer) {
        return Err("not quiet".into());
    }
    let lap_rcvd = n.ap_log[1]
        .iter()
        .filter(|e| matches!(e, ApEvent::LapReceived { private_data, .. } if private_data.starts_with(b"lap")))
        .count();
    let aprs: Vec<&ApEvent> = n.ap_log[0]
        .iter()
        .filter(|e| matches!(e, ApEvent::AprReceived { .. }))
        .collect();
    let mras = n.ap_log[0]
        .iter()
        .filter(|e| matches!(e, ApEvent::MraLapReceived { .. }))
        .count();
    let timeouts = n.ap_log[0]
        .iter()
        .filter(|e| matches!(e, ApEvent::LapTimeout { .. }))
        .count();
    if lap_rcvd != 1 || n.ap_log[1].len() != 1 {
        return Err(format!("B's events: {:?}", n.ap_log[1]));
    }
    if timeouts != 0 || aprs.len() != 1 || mras > usize::from(mra_first) {
        return Err(format!("A's events: {:?}", n.ap_log[0]));
    }
    match aprs[0] {
        ApEvent::AprReceived {
            status: s,
            private_data,
            ..
        } if *s == status && private_data.starts_with(b"apr") => {}
        e => return Err(format!("APR {e:?}")),
    }
    let a_alt = n.agents[0].alternate_path(ca).map(|p| alt_gid(&p));
    let b_alt = n.agents[1].alternate_path(cb).map(|p| p.remote_port_gid);
    let want = if accept {
        gid("::ffff:203.0.113.3")
    } else {
        want
    };
    if a_alt != Some(want) || b_alt != Some(want) {
        return Err(format!(
            "alternate after APR: A {a_alt:?}, B {b_alt:?}, want {want}"
        ));
    }
    for i in 0..2 {
        let c = n.conn[i].unwrap();
        if n.agents[i].lap_state(c) != Some(LapState::Idle)
            || n.agents[i].state(c) != Some(CmState::Established)
        {
            return Err(format!("side {i}: {:?}", n.agents[i].lap_state(c)));
        }
    }
    let st = |i: usize| n.agents[i].stats();
    Ok((
        st(0).retransmits + st(1).retransmits,
        st(0).duplicates + st(1).duplicates,
    ))
}

#[test]
fn lap_apr_under_loss_and_duplication() {
    let seeds = seeds();
    let (mut retx, mut dups) = (0, 0);
    for &seed in &seeds {
        match lap_seed(seed) {
            Ok((r, d)) => {
                retx += r;
                dups += d;
            }
            Err(e) => panic!("seed {seed}: {e}\nreplay with RDMA_SIM_SEED={seed}"),
        }
    }
    // the faults were real: messages were lost (retransmitted) and duplicated
    if seeds.len() >= 20 {
        assert!(
            retx > 0 && dups > 0,
            "retransmits {retx}, duplicates {dups}"
        );
    }
}

#[test]
fn lap_timeout_when_the_peer_is_gone() {
    let mut n = Net::new(1, 0.0, 0.0);
    n.connect().unwrap();
    let ca = n.conn[0].unwrap();
    n.deaf = Some(1);
    let start = n.now;
    let new = path_params("::ffff:203.0.113.2", "::ffff:203.0.113.3");
    n.agents[0].send_lap(start, ca, &new, &[]).unwrap();
    assert!(n.run(u64::MAX / 4, &mut |_, _| {}));
    assert_eq!(n.ap_log[0], vec![ApEvent::LapTimeout { conn: ca }]);
    // 1 + 15 retries, each wait 4.608 s plus the retry jitter (up to half of it): the last
    // expiry ends it
    assert_eq!(n.agents[0].stats().retransmits, 15);
    let waits = n.now - start;
    assert!(
        (16 * 4_608_000_000..16 * 6_912_000_000).contains(&waits),
        "{waits} ns"
    );
    assert_eq!(n.agents[0].state(ca), Some(CmState::Established));
    assert_eq!(n.agents[0].lap_state(ca), Some(LapState::Idle));
    // the REQ's alternate stays; a new LAP may be tried
    assert_eq!(
        n.agents[0].alternate_path(ca).map(|p| p.remote_port_gid),
        Some(gid("::ffff:198.51.100.3"))
    );
    assert!(n.agents[0].send_lap(n.now, ca, &new, &[]).is_ok());
}

fn parse(mad: &[u8; MAD_LEN]) -> CmMessage {
    CmMadRepr::parse(mad).unwrap().message
}

#[test]
fn duplicate_lap_gets_the_same_apr_and_unknown_lap_gets_apr_1() {
    let mut n = Net::new(2, 0.0, 0.0);
    n.connect().unwrap();
    let (ca, cb) = (n.conn[0].unwrap(), n.conn[1].unwrap());
    let new = path_params("::ffff:203.0.113.2", "::ffff:203.0.113.3");
    n.agents[0].send_lap(n.now, ca, &new, &[]).unwrap();
    let lap = n.agents[0].poll_transmit().unwrap().mad;
    assert!(matches!(parse(&lap), CmMessage::Lap(_)));
    let b = &mut n.agents[1];
    b.handle_mad(1, path_to(1), &lap);
    assert!(matches!(b.poll_ap_event(), Some(ApEvent::LapReceived { conn, .. }) if conn == cb));
    assert_eq!(b.lap_state(cb), Some(LapState::LapRcvd));
    // a duplicate before the answer: dropped; after an MRA: the MRA again
    b.handle_mad(2, path_to(1), &lap);
    assert!(b.poll_transmit().is_none());
    b.send_mra_lap(cb).unwrap();
    let mra = b.poll_transmit().unwrap().mad;
    b.handle_mad(3, path_to(1), &lap);
    assert_eq!(b.poll_transmit().unwrap().mad, mra);
    b.send_apr(cb, ApStatus::Success, &[], &[]).unwrap();
    let apr = b.poll_transmit().unwrap().mad;
    assert!(matches!(parse(&apr), CmMessage::Apr(a) if a.ap_status == ApStatus::Success));
    // after the answer: the same APR, no new event
    b.handle_mad(4, path_to(1), &lap);
    assert_eq!(b.poll_transmit().unwrap().mad, apr);
    assert!(b.poll_ap_event().is_none());
    assert!(b.send_apr(cb, ApStatus::Success, &[], &[]).is_err());
    // A: the MRA extends the wait, the APR ends it; a duplicate APR changes nothing
    let a = &mut n.agents[0];
    a.handle_mad(5, path_to(0), &mra);
    assert!(matches!(
        a.poll_ap_event(),
        Some(ApEvent::MraLapReceived { .. })
    ));
    assert_eq!(a.lap_state(ca), Some(LapState::MraLapRcvd));
    a.handle_mad(6, path_to(0), &apr);
    assert!(matches!(
        a.poll_ap_event(),
        Some(ApEvent::AprReceived {
            status: ApStatus::Success,
            ..
        })
    ));
    a.handle_mad(7, path_to(0), &apr);
    assert!(a.poll_ap_event().is_none());
    assert_eq!(a.poll_timeout(), None);
    // a LAP naming no connection: APR "invalid communication id", nothing else
    let mut stranger = CmAgent::new(AgentConfig::default());
    stranger.handle_mad(8, path_to(1), &lap);
    let t = stranger.poll_transmit().unwrap();
    assert_eq!(t.path, path_to(1));
    assert!(matches!(parse(&t.mad), CmMessage::Apr(a) if a.ap_status == ApStatus::InvalidCommId));
    assert!(stranger.poll_ap_event().is_none());
    assert_eq!(stranger.stats().unmatched, 1);
}

#[test]
fn rep_rejecting_failover_drops_the_alternate_on_both_sides() {
    let mut a = CmAgent::new(AgentConfig {
        ca_guid: 0xa,
        seed: 3,
        ..AgentConfig::default()
    });
    let mut b = CmAgent::new(AgentConfig {
        ca_guid: 0xb,
        seed: 4,
        ..AgentConfig::default()
    });
    b.listen(SID).unwrap();
    let mut p = ReqParams::new(SID, path_to(0), 0x11, 5);
    p.alternate_path = Some(path_params("::ffff:198.51.100.2", "::ffff:198.51.100.3"));
    let ca = a.send_req(0, p).unwrap();
    assert!(a.alternate_path(ca).is_some());
    let req = a.poll_transmit().unwrap().mad;
    b.handle_mad(1, path_to(1), &req);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!("no REQ")
    };
    assert_eq!(
        r.req.alternate_path.remote_port_gid,
        gid("::ffff:198.51.100.3")
    );
    assert!(b.alternate_path(r.conn).is_some());
    let mut rep = RepParams::new(0x22, 9);
    rep.failover_accepted = 1;
    b.send_rep(1, r.conn, rep).unwrap();
    assert!(b.alternate_path(r.conn).is_none());
    let rep = b.poll_transmit().unwrap().mad;
    a.handle_mad(2, path_to(0), &rep);
    assert!(matches!(a.poll_event(), Some(CmEvent::RepReceived(_))));
    assert!(a.alternate_path(ca).is_none());
    // a REQ without an alternate path carries zeros there, and nothing is recorded
    let q = ReqParams::new(SID, path_to(0), 0x12, 6);
    let c2 = a.send_req(3, q).unwrap();
    assert!(a.alternate_path(c2).is_none());
    let req = a.poll_transmit().unwrap().mad;
    b.handle_mad(4, path_to(1), &req);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!("no REQ")
    };
    assert_eq!(r.req.alternate_path, CmPathRepr::default());
    assert!(b.alternate_path(r.conn).is_none());
}
