//! Hostile MADs: thousands of mutated CM messages (taken from a real handshake) sent from a
//! third host into two connected agents. Nothing may panic, no connection may change state,
//! and nothing may be sent to the legitimate peer.

use rdma_proto::cm::*;
use rdma_wire::mad::MAD_LEN;

const SID: u64 = 0x0000_0000_0106_1b58;

fn addr(last: u8) -> CmPath {
    CmPath::new(
        std::net::Ipv6Addr::UNSPECIFIED,
        std::net::Ipv4Addr::new(10, 0, 0, last).to_ipv6_mapped(),
        1,
    )
}

struct Mix(u64);
impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[test]
fn mutated_mads_from_a_third_host_change_nothing() {
    let (pa, pb, evil) = (addr(1), addr(2), addr(66));
    let cfg = |guid, seed| AgentConfig {
        ca_guid: guid,
        seed,
        ..AgentConfig::default()
    };
    let mut a = CmAgent::new(cfg(0xa, 1));
    let mut b = CmAgent::new(cfg(0xb, 2));
    b.listen(SID).unwrap();
    let mut corpus: Vec<[u8; MAD_LEN]> = Vec::new();
    let ca = a.send_req(0, ReqParams::new(SID, pb, 0x11, 1)).unwrap();
    let req = a.poll_transmit().unwrap().mad;
    corpus.push(req);
    b.handle_mad(0, pa, &req);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!()
    };
    b.handle_mad(0, pa, &req);
    corpus.push(b.poll_transmit().unwrap().mad); // MRA
    b.send_rep(0, r.conn, RepParams::new(0x22, 2)).unwrap();
    let rep = b.poll_transmit().unwrap().mad;
    corpus.push(rep);
    a.handle_mad(0, pb, &rep);
    a.send_rtu(0, ca).unwrap();
    let rtu = a.poll_transmit().unwrap().mad;
    corpus.push(rtu);
    b.handle_mad(0, pa, &rtu);
    // A disconnect on a throwaway pair gives DREQ/DREP/REJ shapes with the same ids.
    {
        let mut a2 = CmAgent::new(cfg(0xa, 1));
        let mut b2 = CmAgent::new(cfg(0xb, 2));
        b2.listen(SID).unwrap();
        let c2 = a2.send_req(0, ReqParams::new(SID, pb, 0x11, 1)).unwrap();
        b2.handle_mad(0, pa, &a2.poll_transmit().unwrap().mad);
        let Some(CmEvent::ReqReceived(r2)) = b2.poll_event() else {
            panic!()
        };
        b2.send_rep(0, r2.conn, RepParams::new(0x22, 2)).unwrap();
        a2.handle_mad(0, pb, &b2.poll_transmit().unwrap().mad);
        a2.send_rtu(0, c2).unwrap();
        b2.handle_mad(0, pa, &a2.poll_transmit().unwrap().mad);
        a2.send_dreq(0, c2, &[]).unwrap();
        let dreq = a2.poll_transmit().unwrap().mad;
        b2.handle_mad(0, pa, &dreq);
        b2.send_drep(0, r2.conn, &[]).unwrap();
        corpus.push(dreq);
        corpus.push(b2.poll_transmit().unwrap().mad);
        b2.handle_mad(0, pa, &dreq);
        let mut b3 = CmAgent::new(cfg(0xb, 3));
        b3.handle_mad(0, pa, &req);
        corpus.push(b3.poll_transmit().unwrap().mad); // REJ 8
        let s = a2.send_sidr_req(0, SidrReqParams::new(SID, pb)).unwrap();
        corpus.push(a2.poll_transmit().unwrap().mad);
        let _ = s;
    }
    assert_eq!(a.state(ca), Some(CmState::Established));
    assert_eq!(b.state(r.conn), Some(CmState::Established));

    while a.poll_event().is_some() || b.poll_event().is_some() {}
    while a.poll_transmit().is_some() || b.poll_transmit().is_some() {}
    let mut rng = Mix(0xbad);
    let rounds: usize = std::env::var("RDMA_HOSTILE_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    for round in 0..rounds {
        let base = corpus[(rng.next() % corpus.len() as u64) as usize];
        let mut m = base.to_vec();
        match rng.next() % 4 {
            0 => {} // verbatim, from the wrong host
            1 => {
                for _ in 0..1 + rng.next() % 4 {
                    let i = (rng.next() % MAD_LEN as u64) as usize;
                    m[i] ^= 1 << (rng.next() % 8);
                }
            }
            2 => m.truncate((rng.next() % MAD_LEN as u64) as usize),
            _ => m.extend(std::iter::repeat_n(0, 1 + (rng.next() % 8) as usize)),
        }
        let to_a = rng.next() % 2 == 0;
        let target = if to_a { &mut a } else { &mut b };
        target.handle_mad(round as u64, evil, &m);
        while let Some(CmTransmit { path: to, .. }) = target.poll_transmit() {
            assert_eq!(
                to, evil,
                "round {round}: answer to someone else than the sender"
            );
        }
        while let Some(e) = target.poll_event() {
            // A well-formed REQ/SIDR_REQ from the third host is a legitimate new request.
            assert!(
                matches!(e, CmEvent::ReqReceived(_) | CmEvent::SidrReqReceived(_)),
                "round {round}: {e:?}"
            );
        }
        assert_eq!(a.state(ca), Some(CmState::Established), "round {round}");
        assert_eq!(b.state(r.conn), Some(CmState::Established), "round {round}");
    }
    eprintln!(
        "hostile: {rounds} rounds; a {:?}; b {:?}",
        a.stats(),
        b.stats()
    );
    assert!(a.stats().malformed + b.stats().malformed > 0);
}

/// The deadline `b` asks for, relative to `now`.
fn wait_of(b: &CmAgent, now: u64) -> Option<u64> {
    b.poll_timeout().map(|d| d.saturating_sub(now))
}

/// Linux's `cm_convert_to_ms` of exponent `t`, in nanoseconds.
fn ns(t: u8) -> u64 {
    (1u64 << t.saturating_sub(8)) * 1_000_000
}

/// One peer (one GID) opens 70,000 connections whose REQs ask for the longest timers there
/// are (response timeout and path ACK timeout 31: 2.3 hours each) and ends each with a DREQ;
/// the server's application destroys each id as it goes. Every deadline the server keeps stays
/// within the clamps, the timewaits never lock out a new peer (they are not live
/// connections), and a new GID still connects at the end. `RDMA_CM_FLOOD` sets the count.
#[test]
fn peer_chosen_timers_are_clamped_and_timewait_does_not_fill_the_table() {
    let n: usize = std::env::var("RDMA_CM_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(70_000);
    let (pa, pb, fresh) = (addr(1), addr(2), addr(3));
    let mut a = CmAgent::new(AgentConfig {
        ca_guid: 0xa,
        seed: 1,
        max_conns: usize::MAX,
        ..AgentConfig::default()
    });
    let mut b = CmAgent::new(AgentConfig {
        ca_guid: 0xb,
        seed: 2,
        ..AgentConfig::default()
    });
    let max_conns = b.config().max_conns;
    assert!(n > max_conns || std::env::var("RDMA_CM_FLOOD").is_ok());
    b.listen(SID).unwrap();
    let longest = rdma_wire::time::IbaTime::MAX;
    // A resent REP waits its (clamped) timeout plus up to half of it again (retry jitter).
    let rep_bound = ns(PEER_RESPONSE_BOUNDS.1) * 3 / 2;
    let mut now = 0u64;
    for i in 0..n {
        now += 10_000; // 10 µs apart: 70,000 take 0.7 s, far inside any timewait
                       // A QPN per connection (a reused one is a stale connection: REJ 10).
        let mut p = ReqParams::new(SID, pb, i as u32 + 1, 1);
        p.local_cm_response_timeout = longest;
        p.remote_cm_response_timeout = longest;
        p.path.local_ack_timeout = longest;
        let ca = a.send_req(now, p).unwrap();
        let req = a.poll_transmit().unwrap().mad;
        b.handle_mad(now, pa, &req);
        let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
            panic!(
                "handshake {i}: no REQ event ({} connections held)",
                b.conn_count()
            )
        };
        b.send_rep(now, r.conn, RepParams::new(0x80_0000 + i as u32, 2))
            .unwrap();
        let rep = b.poll_transmit().unwrap().mad;
        assert_eq!(
            u16::from_be_bytes([rep[16], rep[17]]),
            0x13,
            "handshake {i}: a REP"
        );
        if let Some(w) = wait_of(&b, now) {
            assert!(w <= rep_bound, "REP resent after {w} ns");
        }
        a.handle_mad(now, pb, &rep);
        while a.poll_event().is_some() {}
        a.send_rtu(now, ca)
            .unwrap_or_else(|e| panic!("handshake {i}: {e:?}, {:?}", a.stats()));
        let rtu = a.poll_transmit().unwrap().mad;
        b.handle_mad(now, pa, &rtu);
        while b.poll_event().is_some() {}
        a.send_dreq(now, ca, &[]).unwrap();
        let dreq = a.poll_transmit().unwrap().mad;
        b.handle_mad(now, pa, &dreq);
        while b.poll_event().is_some() {}
        b.send_drep(now, r.conn, &[]).unwrap();
        let drep = b.poll_transmit().unwrap().mad;
        b.destroy(now, r.conn).unwrap();
        while b.poll_transmit().is_some() {}
        a.handle_mad(now, pb, &drep);
        while a.poll_event().is_some() {}
        a.destroy(now, ca).unwrap();
        while a.poll_transmit().is_some() {}
        let w = wait_of(&b, now).expect("a timewait is running");
        assert!(
            w <= ns(PEER_TIMEWAIT_MAX),
            "handshake {i}: a deadline {w} ns away"
        );
        b.handle_timeout(now);
    }
    assert!(b.conn_count() <= max_conns);
    assert!(b.stats().timewait_evicted > 0 || n <= max_conns);
    // A new peer still gets in.
    let mut c = CmAgent::new(AgentConfig {
        ca_guid: 0xc,
        seed: 3,
        ..AgentConfig::default()
    });
    c.send_req(now, ReqParams::new(SID, pb, 0x33, 3)).unwrap();
    let req = c.poll_transmit().unwrap().mad;
    b.handle_mad(now, fresh, &req);
    assert!(
        matches!(b.poll_event(), Some(CmEvent::ReqReceived(_))),
        "a new GID is refused: {:?}",
        b.stats()
    );
}

/// A REQ asking us to answer within 1 ms (response timeout 0) does not draw a REP every
/// millisecond: at most 2 in the first 100 ms.
#[test]
fn a_zero_response_timeout_does_not_draw_a_rep_storm() {
    let (pa, pb) = (addr(1), addr(2));
    let mut a = CmAgent::new(AgentConfig {
        ca_guid: 0xa,
        seed: 1,
        ..AgentConfig::default()
    });
    let mut b = CmAgent::new(AgentConfig {
        ca_guid: 0xb,
        seed: 2,
        retry_jitter: false,
        ..AgentConfig::default()
    });
    b.listen(SID).unwrap();
    let mut p = ReqParams::new(SID, pb, 0x11, 1);
    p.local_cm_response_timeout = rdma_wire::time::IbaTime::MIN;
    p.path.packet_life_time = rdma_wire::time::IbaTime::MIN;
    a.send_req(0, p).unwrap();
    let req = a.poll_transmit().unwrap().mad;
    b.handle_mad(0, pa, &req);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!("no REQ event")
    };
    b.send_rep(0, r.conn, RepParams::new(0x22, 2)).unwrap();
    let mut reps = 0;
    let mut now = 0;
    while now <= 100_000_000 {
        b.handle_timeout(now);
        while b.poll_transmit().is_some() {
            reps += 1;
        }
        now += 100_000; // every 0.1 ms
    }
    assert!(reps <= 2, "{reps} REPs in the first 100 ms");
    assert!(reps >= 1);
}
