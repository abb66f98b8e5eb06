//! The REQ window per peer ([`AgentConfig::req_window`]) and the listener limits under a
//! storm: what is sent, when timers start, and that answers, timeouts and destroys free
//! the window.

use rdma_proto::cm::*;
use rdma_wire::cm::{CmMadRepr, CmMessage};
use rdma_wire::mad::MAD_LEN;

const SID: u64 = 0x0000_0000_0106_1b58;
const MS: u64 = 1_000_000;

fn path(last: u8) -> CmPath {
    CmPath::new(
        std::net::Ipv6Addr::UNSPECIFIED,
        format!("::ffff:192.0.2.{last}").parse().unwrap(),
        2,
    )
}

fn agent(guid: u64, window: usize, delayed_mra: bool) -> CmAgent {
    CmAgent::new(AgentConfig {
        ca_guid: guid,
        seed: guid,
        req_window: window,
        delayed_mra,
        // exact timings here; `retries_are_spread_out` tests the jitter, cm::tests the early
        // resends
        retry_jitter: false,
        early_resends: 0,
        ..AgentConfig::default()
    })
}

fn req(to: CmPath, qpn: u32) -> ReqParams {
    let mut p = ReqParams::new(SID, to, qpn, 0x1234);
    p.max_cm_retries = 1;
    p
}

fn sent(a: &mut CmAgent) -> Vec<[u8; MAD_LEN]> {
    std::iter::from_fn(|| a.poll_transmit().map(|t| t.mad)).collect()
}

/// The local comm ids of the REQs among `mads`.
fn req_ids(mads: &[[u8; MAD_LEN]]) -> Vec<u32> {
    mads.iter()
        .filter_map(|m| match CmMadRepr::parse(m).unwrap().message {
            CmMessage::Req(r) => Some(r.local_comm_id),
            _ => None,
        })
        .collect()
}

fn id(a: &CmAgent, c: ConnHandle) -> u32 {
    a.local_comm_id(c).unwrap()
}

#[test]
fn a_full_window_parks_reqs_until_an_answer_frees_a_slot() {
    let mut a = agent(0xa, 2, true);
    let mut b = agent(0xb, 2, true);
    b.listen(SID).unwrap();
    let conns: Vec<_> = (0..4)
        .map(|i| a.send_req(0, req(path(3), 0x100 + i)).unwrap())
        .collect();
    let first = sent(&mut a);
    assert_eq!(req_ids(&first), vec![id(&a, conns[0]), id(&a, conns[1])]);
    assert_eq!(a.stats().paced, 2);
    // Another peer has its own window.
    let other = a.send_req(0, req(path(4), 0x200)).unwrap();
    assert_eq!(req_ids(&sent(&mut a)), vec![id(&a, other)]);
    a.destroy(0, other).unwrap();
    sent(&mut a); // its REJ

    // B answers the first REQ at 10 ms: the third leaves then, with its own timer.
    for m in &first {
        b.handle_mad(0, path(2), m);
    }
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!("no REQ event");
    };
    b.send_rep(10 * MS, r.conn, RepParams::new(0x300, 1))
        .unwrap();
    for m in sent(&mut b) {
        a.handle_mad(10 * MS, path(3), &m);
    }
    assert!(matches!(a.poll_event(), Some(CmEvent::RepReceived(_))));
    assert_eq!(req_ids(&sent(&mut a)), vec![id(&a, conns[2])]);

    // Destroying the parked fourth sends nothing; when the second times out (4.608 s
    // after 0), nothing is parked any more and the third's timer runs from 10 ms.
    a.destroy(10 * MS, conns[3]).unwrap();
    assert!(sent(&mut a).is_empty(), "a REQ never sent needs no REJ");
    let t = a.poll_timeout().unwrap();
    assert_eq!(t, 4608 * MS, "only REQs on the wire have timers");
    a.handle_timeout(t);
    assert_eq!(req_ids(&sent(&mut a)), vec![id(&a, conns[1])], "a retry");
    assert_eq!(a.poll_timeout(), Some(10 * MS + 4608 * MS));
}

#[test]
fn an_mra_frees_the_slot() {
    let mut a = agent(0xa, 1, true);
    // B without the delayed MRA: the application sends its MRA itself.
    let mut b = agent(0xb, 1, false);
    b.listen(SID).unwrap();
    let c1 = a.send_req(0, req(path(3), 0x100)).unwrap();
    let c2 = a.send_req(0, req(path(3), 0x101)).unwrap();
    let m = sent(&mut a);
    assert_eq!(req_ids(&m), vec![id(&a, c1)]);
    b.handle_mad(1, path(2), &m[0]);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!("no REQ event");
    };
    b.send_mra(r.conn).unwrap();
    for m in sent(&mut b) {
        a.handle_mad(2, path(3), &m);
    }
    assert_eq!(a.state(c1), Some(CmState::MraReqRcvd));
    assert_eq!(req_ids(&sent(&mut a)), vec![id(&a, c2)]);
}

#[test]
fn timeouts_free_the_window_and_every_req_still_gets_its_retries() {
    // Nobody answers: 3 REQs, window 1, one retry each (2 x 4.608 s per REQ).
    let mut a = agent(0xa, 1, true);
    let conns: Vec<_> = (0..3)
        .map(|i| a.send_req(0, req(path(3), 0x100 + i)).unwrap())
        .collect();
    let mut log = vec![(0, req_ids(&sent(&mut a)))];
    let mut timeouts = Vec::new();
    while let Some(t) = a.poll_timeout() {
        a.handle_timeout(t);
        log.push((t, req_ids(&sent(&mut a))));
        while let Some(e) = a.poll_event() {
            if let CmEvent::ReqTimeout { conn } = e {
                timeouts.push((t, conn));
            }
        }
    }
    let step = 4608 * MS;
    let ids: Vec<u32> = conns.iter().map(|&c| id(&a, c)).collect();
    assert_eq!(
        log,
        vec![
            (0, vec![ids[0]]),
            (step, vec![ids[0]]),
            (2 * step, vec![ids[1]]),
            (3 * step, vec![ids[1]]),
            (4 * step, vec![ids[2]]),
            (5 * step, vec![ids[2]]),
            (6 * step, vec![]),
        ]
    );
    assert_eq!(
        timeouts,
        vec![
            (2 * step, conns[0]),
            (4 * step, conns[1]),
            (6 * step, conns[2])
        ]
    );
}

#[test]
fn window_zero_sends_everything_at_once() {
    let mut a = agent(0xa, 0, true);
    for i in 0..2000 {
        a.send_req(0, req(path(3), i)).unwrap();
    }
    assert_eq!(sent(&mut a).len(), 2000);
    assert_eq!(a.stats().paced, 0);
}

#[test]
fn the_backlog_counts_only_unanswered_requests() {
    let mut a = agent(0xa, 0, true);
    let mut b = CmAgent::new(AgentConfig {
        ca_guid: 0xb,
        listen_backlog: 2,
        ..AgentConfig::default()
    });
    b.listen(SID).unwrap();
    for i in 0..3 {
        a.send_req(0, req(path(3), 0x100 + i)).unwrap();
    }
    for m in sent(&mut a) {
        b.handle_mad(0, path(2), &m);
    }
    assert_eq!(b.stats().overload, 1, "the third is over the backlog");
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!("no REQ event");
    };
    b.send_rep(0, r.conn, RepParams::new(0x300, 1)).unwrap();
    // Answered: the backlog has room again (the REQ's retry, or a new one, is taken).
    a.send_req(0, req(path(3), 0x200)).unwrap();
    for m in sent(&mut a) {
        b.handle_mad(1, path(2), &m);
    }
    assert_eq!(b.stats().overload, 1);
    assert_eq!(b.conn_count(), 3);
    // A destroyed half-open one frees its place too.
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!("no second REQ event");
    };
    b.destroy_silently(r.conn).unwrap();
    a.send_req(0, req(path(3), 0x201)).unwrap();
    for m in sent(&mut a) {
        b.handle_mad(2, path(2), &m);
    }
    assert_eq!(b.stats().overload, 1);
    assert_eq!(b.conn_count(), 3);
}

#[test]
fn retries_are_spread_out() {
    // 1000 REQs sent at once to a peer that never answers: with the jitter (the default),
    // each wait is 4.608 s plus up to half of it, drawn per message and attempt.
    let mut a = CmAgent::new(AgentConfig {
        req_window: 0,
        // the regular retries' spread (the early resends have no jitter)
        early_resends: 0,
        ..AgentConfig::default()
    });
    for i in 0..1000 {
        a.send_req(0, req(path(3), i)).unwrap();
    }
    assert_eq!(sent(&mut a).len(), 1000);
    let t = 4608 * MS;
    let mut first = Vec::new();
    let mut second = Vec::new();
    while let Some(at) = a.poll_timeout() {
        a.handle_timeout(at);
        let n = sent(&mut a).len();
        if n > 0 {
            // every attempt of this test's REQs is a retry of one sent at 0 or in `first`
            if at < 3 * t / 2 {
                first.extend(std::iter::repeat(at).take(n));
            } else {
                second.extend(std::iter::repeat(at).take(n));
            }
        }
    }
    assert_eq!(first.len() + second.len(), 1000, "one retry each");
    assert!(first.iter().all(|&at| (t..3 * t / 2).contains(&at)));
    // Spread across the half timeout: every tenth of it holds some of them.
    for k in 0..10u64 {
        let lo = t + k * t / 20;
        let n = first
            .iter()
            .filter(|&&at| (lo..lo + t / 20).contains(&at))
            .count();
        assert!(n > 30, "{n} retries in tenth {k} of the spread");
    }
    assert!(second.is_empty());
}
