//! Drives one IB CM agent (`CmAgent::handle_mad` and the application calls and timers around
//! it) holding connections in many states, with a sequence of received MADs.
//!
//! Before the input, a helper agent (the peer, 192.0.2.2) and the agent under test (192.0.2.3,
//! listening on the TCP port-space services of the captures, 7000, 7005, 7174, 7471 and 18515,
//! and UDP 7174 and 18515 for SIDR) exchange real MADs until the agent holds one connection in
//! each of: REQ received (MRA prepared with delayed MRA), MRA sent (a duplicate REQ came, or
//! the application asked for it), REP sent,
//! established (passive), REQ sent, established (active), DREQ sent, DREQ received, timewait,
//! SIDR REQ received. The helper is then dropped: the input speaks for the peer.
//!
//! Checked after every step and at the end:
//! - every MAD the agent sends parses as a CM MAD, and the agent never sends to itself;
//! - a REQ/SIDR_REQ event names a new connection; no connection is ESTABLISHED twice; nothing
//!   is reported for a connection after its TIMEWAIT_EXIT or after it was destroyed;
//! - at the end every connection is destroyed and the timers run out within a bounded number
//!   of rounds; then the agent holds no connection and wants no timer (nothing left behind).
//!
//! Input: records of `ctl act mad[256]`. `ctl`: bits 0-3 pick a known connection (setup ones
//! first, then those the input created) whose communication ids are written into the MAD
//! (bit 4 set: not patched): the sender's id (bytes 24..28) becomes the connection's remote id
//! when it has one (an answer to our REQ keeps its own), and for all but REQ and SIDR_REQ the
//! receiver's id (28..32) becomes the connection's local id (for a SIDR_REP: its request id,
//! 24..28); bit 5: the MAD comes from a stranger (192.0.2.9) instead of the peer; bits 6-7: time
//! passes before the MAD (nothing, 1 ms, 5 s, up to the next timer). `act`: what the
//! application does afterwards, bits 0-2 (nothing, REP, RTU, disconnect, REJ, MRA, destroy,
//! establish or SIDR_REP), on the connection of bits 4-7. `fuzz/seeds/cm_agent/` holds seeds
//! made from the CM MADs of `../shared/captures` by `fuzz/make_corpus.py`.
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use rdma_proto::cm::{
    AgentConfig, CmAgent, CmEvent, CmPath, CmState, CmTransmit, ConnHandle, RepParams, ReqParams,
    SidrRepParams, SidrReqParams,
};
use rdma_wire::cm::{CmMadRepr, RejectReason};
use rdma_wire::mad::MAD_LEN;

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;
const TCP: u64 = 0x0000_0000_0106_0000;
const UDP: u64 = 0x0000_0000_0111_0000;
/// Services the agent listens on: the captures' (never 9998/9999, nobody listens there).
const LISTEN: [u64; 7] = [
    TCP | 7000,
    TCP | 7005,
    TCP | 7174,
    TCP | 7471,
    TCP | 18515,
    UDP | 7174,
    UDP | 18515,
];
/// The helper's service for the agent's own REQs.
const PEER_SID: u64 = TCP | 7001;
/// Most timer rounds after everything is destroyed before the agent counts as never idle.
const MAX_ROUNDS: usize = 10_000;

fn addr(s: &str) -> CmPath {
    CmPath::new(std::net::Ipv6Addr::UNSPECIFIED, s.parse().unwrap(), 1)
}

struct Fx {
    agent: CmAgent,
    me: CmPath,
    peer: CmPath,
    stranger: CmPath,
    now: u64,
    /// Every connection handle the agent has shown, in order.
    conns: Vec<ConnHandle>,
    seen: BTreeSet<ConnHandle>,
    established: BTreeSet<ConnHandle>,
    ended: BTreeSet<ConnHandle>,
    destroyed: BTreeSet<ConnHandle>,
}

/// Moves every MAD `from` sends to `to` (as coming from `src`).
fn deliver(from: &mut CmAgent, to: &mut CmAgent, src: CmPath, now: u64) -> usize {
    let mut n = 0;
    while let Some(CmTransmit { mad, .. }) = from.poll_transmit() {
        to.handle_mad(now, src, &mad);
        n += 1;
    }
    n
}

#[track_caller]
fn next_event(a: &mut CmAgent) -> CmEvent {
    a.poll_event().expect("setup: an event")
}

impl Fx {
    fn new(cfg: u8) -> Self {
        let (me, peer) = (addr("::ffff:192.0.2.3"), addr("::ffff:192.0.2.2"));
        let mut agent = CmAgent::new(AgentConfig {
            ca_guid: 0x5054_00ff_fe00_0203,
            seed: 2,
            delayed_mra: cfg & 1 == 0,
            ..AgentConfig::default()
        });
        let mut h = CmAgent::new(AgentConfig {
            ca_guid: 0x5054_00ff_fe00_0202,
            seed: 1,
            ..AgentConfig::default()
        });
        for sid in LISTEN {
            agent.listen(sid).unwrap();
        }
        h.listen(PEER_SID).unwrap();
        let mut fx = Fx {
            agent,
            me,
            peer,
            stranger: addr("::ffff:192.0.2.9"),
            now: 0,
            conns: Vec::new(),
            seen: BTreeSet::new(),
            established: BTreeSet::new(),
            ended: BTreeSet::new(),
            destroyed: BTreeSet::new(),
        };
        let a = &mut fx.agent;
        // each REQ with its own QPN (a QPN already connected makes the REQ stale)
        let req = |h: &mut CmAgent, sid, qpn| {
            let mut p = ReqParams::new(sid, me, qpn, h.random_psn());
            p.path.local_gid = peer.remote_gid;
            p.private_data = vec![0x5a; 56];
            h.send_req(0, p).unwrap()
        };
        // passive: a REQ the application has not answered
        req(&mut h, TCP | 7000, 0x100);
        deliver(&mut h, a, peer, 0);
        let CmEvent::ReqReceived(r) = next_event(a) else {
            panic!("setup: no REQ")
        };
        let req_rcvd = r.conn;
        // passive: the REQ came twice (with delayed MRA, the duplicate gets the MRA)
        req(&mut h, TCP | 7005, 0x101);
        let mad = h.poll_transmit().unwrap().mad;
        a.handle_mad(0, peer, &mad);
        a.handle_mad(0, peer, &mad);
        let CmEvent::ReqReceived(r) = next_event(a) else {
            panic!("setup: no REQ")
        };
        let mra = r.conn;
        if cfg & 1 != 0 {
            a.send_mra(mra).unwrap();
        }
        assert!(a.poll_transmit().is_some(), "setup: no MRA");
        // passive: REP sent, no RTU yet
        req(&mut h, TCP | 7174, 0x102);
        deliver(&mut h, a, peer, 0);
        let CmEvent::ReqReceived(r) = next_event(a) else {
            panic!("setup: no REQ")
        };
        let rep_sent = r.conn;
        a.send_rep(0, rep_sent, RepParams::new(0x201, 0x1234))
            .unwrap();
        while a.poll_transmit().is_some() {}
        // passive, established; and then DREQ received; and then a passive one whose
        // disconnect went through (timewait)
        let passive_established = |a: &mut CmAgent, h: &mut CmAgent, qpn| {
            let hc = req(h, TCP | 7471, qpn + 0x100);
            deliver(h, a, peer, 0);
            let CmEvent::ReqReceived(r) = next_event(a) else {
                panic!("setup: no REQ")
            };
            a.send_rep(0, r.conn, RepParams::new(qpn, 0x4321)).unwrap();
            deliver(a, h, me, 0);
            let CmEvent::RepReceived(_) = next_event(h) else {
                panic!("setup: no REP")
            };
            h.send_rtu(0, hc).unwrap();
            while h.poll_event().is_some() {}
            deliver(h, a, peer, 0);
            assert!(matches!(next_event(a), CmEvent::Established { .. }));
            (r.conn, hc)
        };
        let (est_passive, _) = passive_established(a, &mut h, 0x202);
        let (dreq_rcvd, hc) = passive_established(a, &mut h, 0x203);
        h.disconnect(0, hc).unwrap();
        deliver(&mut h, a, peer, 0);
        assert!(matches!(next_event(a), CmEvent::DreqReceived { .. }));
        let (timewait, hc) = passive_established(a, &mut h, 0x204);
        a.disconnect(0, timewait).unwrap();
        deliver(a, &mut h, me, 0);
        while h.poll_event().is_some() {}
        h.disconnect(0, hc).unwrap();
        deliver(&mut h, a, peer, 0);
        assert!(matches!(next_event(a), CmEvent::DrepReceived { .. }));
        // active: REQ sent, unanswered
        let active_req = |a: &mut CmAgent, qpn| {
            let mut p = ReqParams::new(PEER_SID, peer, qpn, 0x777);
            p.path.local_gid = me.remote_gid;
            a.send_req(0, p).unwrap()
        };
        let req_sent = active_req(a, 0x400);
        while a.poll_transmit().is_some() {}
        // active, established; and then DREQ sent
        let active_established = |a: &mut CmAgent, h: &mut CmAgent, qpn| {
            let c = active_req(a, qpn);
            deliver(a, h, me, 0);
            let CmEvent::ReqReceived(r) = next_event(h) else {
                panic!("setup: no REQ at the peer")
            };
            h.send_rep(0, r.conn, RepParams::new(qpn + 0x100, 0x999))
                .unwrap();
            deliver(h, a, peer, 0);
            assert!(matches!(next_event(a), CmEvent::RepReceived(_)));
            a.send_rtu(0, c).unwrap();
            assert!(matches!(next_event(a), CmEvent::Established { .. }));
            while a.poll_transmit().is_some() {}
            c
        };
        let est_active = active_established(a, &mut h, 0x401);
        let dreq_sent = active_established(a, &mut h, 0x402);
        a.disconnect(0, dreq_sent).unwrap();
        while a.poll_transmit().is_some() {}
        // SIDR: a request the application has not answered
        h.send_sidr_req(0, SidrReqParams::new(UDP | 7174, me))
            .unwrap();
        deliver(&mut h, a, peer, 0);
        let CmEvent::SidrReqReceived(r) = next_event(a) else {
            panic!("setup: no SIDR_REQ")
        };
        let sidr = r.conn;
        assert_eq!(a.poll_event(), None);
        let want = [
            (
                req_rcvd,
                if cfg & 1 == 0 {
                    CmState::MraReqSent // prepared, not sent
                } else {
                    CmState::ReqRcvd
                },
            ),
            (mra, CmState::MraReqSent),
            (rep_sent, CmState::RepSent),
            (est_passive, CmState::Established),
            (req_sent, CmState::ReqSent),
            (est_active, CmState::Established),
            (dreq_sent, CmState::DreqSent),
            (dreq_rcvd, CmState::DreqRcvd),
            (timewait, CmState::Timewait),
            (sidr, CmState::SidrReqRcvd),
        ];
        for (c, st) in want {
            assert_eq!(a.state(c), Some(st), "setup: {c:?}");
            fx.conns.push(c);
            fx.seen.insert(c);
        }
        for c in [est_passive, est_active, dreq_sent, dreq_rcvd, timewait] {
            fx.established.insert(c);
        }
        fx
    }

    /// Checks what the agent sends and reports.
    fn pump(&mut self) {
        while let Some(CmTransmit { path: to, mad }) = self.agent.poll_transmit() {
            assert!(!to.same_node(&self.me), "the agent sends to itself");
            if let Err(e) = CmMadRepr::parse(&mad) {
                panic!("the agent sent a MAD that does not parse ({e:?}): {mad:02x?}");
            }
        }
        while let Some(e) = self.agent.poll_event() {
            let c = e.conn();
            assert!(!self.destroyed.contains(&c), "{e:?} after destroy");
            assert!(!self.ended.contains(&c), "{e:?} after TIMEWAIT_EXIT");
            match &e {
                CmEvent::ReqReceived(_) | CmEvent::SidrReqReceived(_) => {
                    assert!(self.seen.insert(c), "{e:?} for a known connection");
                    self.conns.push(c);
                }
                CmEvent::Established { .. } => {
                    assert!(self.established.insert(c), "ESTABLISHED twice: {e:?}")
                }
                CmEvent::TimewaitExit { .. } => {
                    self.ended.insert(c);
                }
                _ => assert!(self.seen.contains(&c), "{e:?} for an unknown connection"),
            }
        }
    }

    /// The local and (once known) remote communication ids of known connection `k`.
    fn ids(&self, k: usize) -> Option<(u32, Option<u32>)> {
        let c = *self.conns.get(k)?;
        let remote = self.agent.remote_comm_id(c).filter(|&r| r != 0);
        Some((self.agent.local_comm_id(c)?, remote))
    }

    fn step(&mut self, ctl: u8, act: u8, mut mad: [u8; MAD_LEN]) {
        match ctl >> 6 {
            1 => self.now += MS,
            2 => self.now += 5 * S,
            3 => {
                if let Some(t) = self.agent.poll_timeout() {
                    self.now = self.now.max(t);
                }
            }
            _ => {}
        }
        self.agent.handle_timeout(self.now);
        self.pump();
        if ctl & 0x10 == 0 {
            if let Some((local, remote)) = self.ids(usize::from(ctl & 0x0f)) {
                let attr = u16::from_be_bytes([mad[16], mad[17]]);
                // the sender's id once the connection knows it (an answer to our REQ brings
                // its own), ours as the receiver's
                let sender = |mad: &mut [u8; MAD_LEN]| {
                    if let Some(r) = remote {
                        mad[24..28].copy_from_slice(&r.to_be_bytes());
                    }
                };
                match attr {
                    // REQ, SIDR_REQ: the sender's id only
                    0x0010 | 0x0017 => sender(&mut mad),
                    // SIDR_REP: our request id
                    0x0018 => mad[24..28].copy_from_slice(&local.to_be_bytes()),
                    _ => {
                        sender(&mut mad);
                        mad[28..32].copy_from_slice(&local.to_be_bytes());
                    }
                }
            }
        }
        let src = if ctl & 0x20 != 0 {
            self.stranger
        } else {
            self.peer
        };
        self.agent.handle_mad(self.now, src, &mad);
        self.pump();
        let Some(&c) = self.conns.get(usize::from(act >> 4)) else {
            return;
        };
        let now = self.now;
        let a = &mut self.agent;
        // refusals are fine (the state has moved on); a refusal changes nothing
        let before = a.state(c);
        let r = match act & 7 {
            1 => a.send_rep(now, c, RepParams::new(0x400, 0x5555)),
            2 => a.send_rtu(now, c),
            3 => a.disconnect(now, c),
            4 => a.send_rej(now, c, RejectReason::ConsumerDefined, &[], b"no"),
            5 => a.send_mra(c),
            6 => a.destroy(now, c),
            7 if before == Some(CmState::SidrReqRcvd) => {
                a.send_sidr_rep(c, SidrRepParams::success(0x500, 0x1111_2222))
            }
            7 => a.establish(c),
            _ => return,
        };
        match r {
            Ok(()) if act & 7 == 6 => {
                self.destroyed.insert(c);
            }
            Ok(()) => {}
            Err(e) => assert_eq!(a.state(c), before, "a refused call ({e}) changed the state"),
        }
        self.pump();
    }

    fn finish(&mut self) {
        for c in self.conns.clone() {
            if !self.destroyed.contains(&c) && self.agent.destroy(self.now, c).is_ok() {
                self.destroyed.insert(c);
            }
            self.pump();
        }
        for _ in 0..MAX_ROUNDS {
            let Some(t) = self.agent.poll_timeout() else {
                break;
            };
            self.now = self.now.max(t);
            self.agent.handle_timeout(self.now);
            self.pump();
        }
        assert_eq!(self.agent.poll_timeout(), None, "timers never run out");
        assert_eq!(self.agent.conn_count(), 0, "connections left behind");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, mut rest)) = data.split_first() else {
        return;
    };
    let mut fx = Fx::new(cfg);
    while let Some((&[ctl, act], tail)) = rest.split_first_chunk::<2>() {
        let Some((mad, tail)) = tail.split_first_chunk::<MAD_LEN>() else {
            break;
        };
        fx.step(ctl, act, *mad);
        rest = tail;
    }
    fx.finish();
});
