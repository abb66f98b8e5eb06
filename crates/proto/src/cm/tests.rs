//! Unit tests: one or more per transition.

use rdma_wire::cm::{CmMadRepr, CmMessage, MessageRef, RejectReason, SidrStatus};
use rdma_wire::mad::MAD_LEN;

use super::*;

const SID: u64 = 0x0000_0000_0106_1b58;
const MS: u64 = 1_000_000;

fn addr_a() -> CmPath {
    CmPath::new(
        std::net::Ipv6Addr::UNSPECIFIED,
        "::ffff:192.0.2.2".parse().unwrap(),
        2,
    )
}
fn addr_b() -> CmPath {
    CmPath::new(
        std::net::Ipv6Addr::UNSPECIFIED,
        "::ffff:192.0.2.3".parse().unwrap(),
        2,
    )
}
fn addr_evil() -> CmPath {
    CmPath::new(
        std::net::Ipv6Addr::UNSPECIFIED,
        "::ffff:192.0.2.66".parse().unwrap(),
        2,
    )
}

fn agent(guid: u64, seed: u64, delayed: bool) -> CmAgent {
    CmAgent::new(AgentConfig {
        ca_guid: guid,
        seed,
        delayed_mra: delayed,
        // Linux's exact timings (the jitter has its own tests in tests/cm_pace.rs, the
        // early DREQ resends theirs below).
        retry_jitter: false,
        early_resends: 0,
        ..AgentConfig::default()
    })
}

fn req_params(qpn: u32) -> ReqParams {
    let mut p = ReqParams::new(SID, addr_b(), qpn, 0x1234);
    p.path.local_gid = addr_a().remote_gid;
    p.private_data = b"hello".to_vec();
    p
}

fn parse(m: &[u8; MAD_LEN]) -> CmMadRepr {
    CmMadRepr::parse(m).unwrap()
}

/// Drains `from`'s transmit queue into a Vec.
fn sent(from: &mut CmAgent) -> Vec<[u8; MAD_LEN]> {
    std::iter::from_fn(|| from.poll_transmit().map(|t| t.mad)).collect()
}

fn events(a: &mut CmAgent) -> Vec<CmEvent> {
    std::iter::from_fn(|| a.poll_event()).collect()
}

/// A (active) sends a REQ to B (passive, listening on `SID`), which answers with `rep`; the
/// REP waits in B's outbox. Returns A's and B's handles.
fn req_then_rep(a: &mut CmAgent, b: &mut CmAgent, rep: RepParams) -> (ConnHandle, ConnHandle) {
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    for m in sent(a) {
        b.handle_mad(0, addr_a(), &m);
    }
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!("no REQ event")
    };
    b.send_rep(0, r.conn, rep).unwrap();
    (ca, r.conn)
}

/// Connects A (active) to B (passive); returns the two handles.
fn connect(a: &mut CmAgent, b: &mut CmAgent) -> (ConnHandle, ConnHandle) {
    b.listen(SID).ok();
    let (ca, cb) = req_then_rep(a, b, RepParams::new(0x22, 0x5678));
    for m in sent(b) {
        a.handle_mad(0, addr_b(), &m);
    }
    assert!(matches!(a.poll_event(), Some(CmEvent::RepReceived(_))));
    a.send_rtu(0, ca).unwrap();
    assert_eq!(a.poll_event(), Some(CmEvent::Established { conn: ca }));
    for m in sent(a) {
        b.handle_mad(0, addr_a(), &m);
    }
    assert_eq!(b.poll_event(), Some(CmEvent::Established { conn: cb }));
    (ca, cb)
}

#[test]
fn handshake_states_and_tids() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    b.listen(SID).unwrap();
    assert_eq!(b.listen(SID), Err(CmError::AlreadyListening(SID)));
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    assert_eq!(a.state(ca), Some(CmState::ReqSent));
    let req = sent(&mut a).pop().unwrap();
    let req_tid = parse(&req).transaction_id;
    b.handle_mad(0, addr_a(), &req);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!()
    };
    assert_eq!(r.listener, SID);
    assert_eq!(&r.req.private_data[..5], b"hello");
    assert_eq!(r.req.local_qpn, 0x11);
    assert_eq!(b.state(r.conn), Some(CmState::MraReqSent));
    assert!(sent(&mut b).is_empty(), "delayed MRA is not sent");
    b.send_rep(0, r.conn, RepParams::new(0x22, 0x5678)).unwrap();
    assert_eq!(b.state(r.conn), Some(CmState::RepSent));
    let rep = sent(&mut b).pop().unwrap();
    assert_eq!(
        parse(&rep).transaction_id,
        req_tid,
        "REP echoes the REQ's TID"
    );
    a.handle_mad(0, addr_b(), &rep);
    let Some(CmEvent::RepReceived(rr)) = a.poll_event() else {
        panic!()
    };
    assert_eq!((rr.rep.local_qpn, rr.rep.starting_psn), (0x22, 0x5678));
    assert_eq!(a.state(ca), Some(CmState::MraRepSent));
    a.send_rtu(0, ca).unwrap();
    let rtu = sent(&mut a).pop().unwrap();
    assert_eq!(
        parse(&rtu).transaction_id,
        req_tid,
        "RTU reuses the REQ's TID"
    );
    b.handle_mad(0, addr_a(), &rtu);
    assert_eq!(b.state(r.conn), Some(CmState::Established));
    assert_eq!(a.remote_comm_id(ca), b.local_comm_id(r.conn));
    assert_eq!(b.remote_comm_id(r.conn), a.local_comm_id(ca));
    assert_eq!(a.poll_timeout(), None);
    assert_eq!(b.poll_timeout(), None);
}

#[test]
fn no_listener_rej8_local_comm_id_zero() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    let req = sent(&mut a).pop().unwrap();
    b.handle_mad(0, addr_a(), &req);
    assert!(b.poll_event().is_none());
    let rej = sent(&mut b).pop().unwrap();
    let m = parse(&rej);
    assert_eq!(m.transaction_id, parse(&req).transaction_id);
    let CmMessage::Rej(x) = m.message else {
        panic!()
    };
    assert_eq!(x.local_comm_id, 0);
    assert_eq!(Some(x.remote_comm_id), a.local_comm_id(ca));
    assert_eq!(x.reason, RejectReason::InvalidServiceId);
    assert_eq!(x.message_rejected, MessageRef::Req);
    a.handle_mad(1, addr_b(), &rej);
    let Some(CmEvent::RejReceived(e)) = a.poll_event() else {
        panic!()
    };
    assert_eq!(e.reason, RejectReason::InvalidServiceId);
    assert_eq!(a.state(ca), Some(CmState::Idle));
    assert_eq!(a.poll_timeout(), None);
    assert_eq!(b.conn_count(), 0);
}

fn agent_retrying(guid: u64, seed: u64, grace: u64) -> CmAgent {
    CmAgent::new(AgentConfig {
        ca_guid: guid,
        seed,
        retry_jitter: false,
        early_resends: 0,
        no_listener_retry: grace,
        ..AgentConfig::default()
    })
}

#[test]
fn refused_req_is_resent_and_meets_a_late_listener() {
    let (mut a, mut b) = (agent_retrying(0xa, 1, 250 * MS), agent(0xb, 2, true));
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    let req = sent(&mut a).pop().unwrap();
    b.handle_mad(0, addr_a(), &req);
    let rej = sent(&mut b).pop().unwrap();
    a.handle_mad(10, addr_b(), &rej);
    // no REJECTED yet: the same REQ again 1 ms after the refusal
    assert!(a.poll_event().is_none());
    assert_eq!(a.state(ca), Some(CmState::ReqSent));
    assert_eq!(a.poll_timeout(), Some(10 + MS));
    a.handle_timeout(10 + MS);
    let again = sent(&mut a);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0], req, "the same MAD (comm id, transaction id)");
    assert_eq!(a.stats().refused_resends, 1);
    // refused again: 2 ms this time
    b.handle_mad(10 + MS, addr_a(), &again[0]);
    let rej = sent(&mut b).pop().unwrap();
    a.handle_mad(20 + MS, addr_b(), &rej);
    assert!(a.poll_event().is_none());
    assert_eq!(a.poll_timeout(), Some(20 + 3 * MS));
    // the listener is there for the third
    b.listen(SID).unwrap();
    a.handle_timeout(20 + 3 * MS);
    let third = sent(&mut a).pop().unwrap();
    b.handle_mad(20 + 3 * MS, addr_a(), &third);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!("the late listener gets the REQ")
    };
    assert_eq!(&r.req.private_data[..5], b"hello");
    // the regular wait for the REP starts afresh from the last send
    assert_eq!(a.poll_timeout(), Some(20 + 3 * MS + 4608 * MS));
}

/// Carries `a`'s request (just sent, from time 0) to `b`, which refuses it for want of a
/// listener, and `b`'s answer back, resend after resend, until `a` reports the refusal:
/// the resends, when, and the event.
fn refused_until_reported(a: &mut CmAgent, b: &mut CmAgent) -> (u32, u64, CmEvent) {
    let mut now = 0;
    let mut resends = 0;
    let mut m = sent(a).pop().unwrap();
    loop {
        b.handle_mad(now, addr_a(), &m);
        a.handle_mad(now, addr_b(), &sent(b).pop().unwrap());
        if let Some(e) = a.poll_event() {
            return (resends, now, e);
        }
        now = a.poll_timeout().unwrap();
        a.handle_timeout(now);
        m = sent(a).pop().unwrap();
        resends += 1;
        assert!(resends < 10, "the resends end");
    }
}

#[test]
fn refusal_stands_once_the_grace_is_spent() {
    let (mut a, mut b) = (agent_retrying(0xa, 1, 10 * MS), agent(0xb, 2, true));
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    let (resends, now, e) = refused_until_reported(&mut a, &mut b);
    let CmEvent::RejReceived(e) = e else {
        panic!("{e:?}")
    };
    assert_eq!(e.reason, RejectReason::InvalidServiceId);
    // 1 + 2 + 4 ms, then the 3 ms left of the 10: four resends, refused at 10 ms
    assert_eq!((resends, now), (4, 10 * MS));
    assert_eq!(a.state(ca), Some(CmState::Idle));
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn other_rejections_are_reported_at_once_with_a_grace() {
    let (mut a, mut b) = (agent_retrying(0xa, 1, 250 * MS), agent(0xb, 2, true));
    b.listen(SID).unwrap();
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    let req = sent(&mut a).pop().unwrap();
    b.handle_mad(0, addr_a(), &req);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!()
    };
    b.send_rej(0, r.conn, RejectReason::ConsumerDefined, &[], b"no")
        .unwrap();
    let rej = sent(&mut b).pop().unwrap();
    a.handle_mad(1, addr_b(), &rej);
    let Some(CmEvent::RejReceived(e)) = a.poll_event() else {
        panic!("a consumer's REJ is the application's answer")
    };
    assert_eq!(e.reason, RejectReason::ConsumerDefined);
    assert_eq!(a.state(ca), Some(CmState::Idle));
    assert_eq!(a.stats().refused_resends, 0);
}

#[test]
fn req_retransmitted_with_same_bytes_then_timeout() {
    let mut a = agent(0xa, 1, true);
    a.send_req(0, req_params(0x11)).unwrap();
    let first = sent(&mut a).pop().unwrap();
    assert_eq!(a.poll_timeout(), Some(4608 * MS));
    a.handle_timeout(4608 * MS - 1);
    assert!(sent(&mut a).is_empty());
    a.handle_timeout(4608 * MS);
    assert_eq!(sent(&mut a), vec![first]);
    assert_eq!(a.stats().retransmits, 1);
}

#[test]
fn duplicate_req_gets_delayed_mra_and_extends_requester_wait() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    b.listen(SID).unwrap();
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    let req = sent(&mut a).pop().unwrap();
    b.handle_mad(0, addr_a(), &req);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!()
    };
    a.handle_timeout(4608 * MS);
    let dup = sent(&mut a).pop().unwrap();
    assert_eq!(dup, req);
    b.handle_mad(4608 * MS, addr_a(), &dup);
    assert!(b.poll_event().is_none(), "a duplicate is no new connection");
    let mra = sent(&mut b).pop().unwrap();
    let CmMessage::Mra(x) = parse(&mra).message else {
        panic!()
    };
    assert_eq!(x.message_mraed, MessageRef::Req);
    assert_eq!(x.service_timeout.value(), 24);
    assert_eq!(Some(x.local_comm_id), b.local_comm_id(r.conn));
    a.handle_mad(4608 * MS, addr_b(), &mra);
    assert_eq!(a.state(ca), Some(CmState::MraReqRcvd));
    assert!(matches!(a.poll_event(), Some(CmEvent::MraReceived { .. })));
    assert_eq!(a.poll_timeout(), Some(4608 * MS + (65536 + 256) * MS));
    // A second MRA changes nothing.
    a.handle_mad(5000 * MS, addr_b(), &mra);
    assert_eq!(a.poll_timeout(), Some(4608 * MS + (65536 + 256) * MS));
}

#[test]
fn without_delayed_mra_duplicates_are_dropped_until_send_mra() {
    let (mut a, mut b) = (agent(0xa, 1, false), agent(0xb, 2, false));
    b.listen(SID).unwrap();
    a.send_req(0, req_params(0x11)).unwrap();
    let req = sent(&mut a).pop().unwrap();
    b.handle_mad(0, addr_a(), &req);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!()
    };
    assert_eq!(b.state(r.conn), Some(CmState::ReqRcvd));
    b.handle_mad(1, addr_a(), &req);
    assert!(sent(&mut b).is_empty());
    b.send_mra(r.conn).unwrap();
    assert_eq!(b.state(r.conn), Some(CmState::MraReqSent));
    assert_eq!(sent(&mut b).len(), 1);
    b.handle_mad(2, addr_a(), &req);
    assert_eq!(sent(&mut b).len(), 1, "duplicate answered with the MRA");
}

#[test]
fn duplicate_req_after_rep_resends_rep() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    b.listen(SID).unwrap();
    a.send_req(0, req_params(0x11)).unwrap();
    let req = sent(&mut a).pop().unwrap();
    b.handle_mad(0, addr_a(), &req);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!()
    };
    b.send_rep(0, r.conn, RepParams::new(0x22, 1)).unwrap();
    let rep = sent(&mut b).pop().unwrap();
    b.handle_mad(1, addr_a(), &req);
    assert_eq!(sent(&mut b), vec![rep]);
    assert_eq!(b.state(r.conn), Some(CmState::RepSent));
}

#[test]
fn duplicate_rep_after_rtu_resends_rtu_and_before_rtu_gets_mra() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    b.listen(SID).unwrap();
    let (ca, cb) = req_then_rep(&mut a, &mut b, RepParams::new(0x22, 1));
    let rep = sent(&mut b).pop().unwrap();
    a.handle_mad(0, addr_b(), &rep);
    a.handle_mad(1, addr_b(), &rep);
    let mra = sent(&mut a).pop().unwrap();
    let CmMessage::Mra(x) = parse(&mra).message else {
        panic!()
    };
    assert_eq!(x.message_mraed, MessageRef::Rep);
    b.handle_mad(1, addr_a(), &mra);
    assert_eq!(b.state(cb), Some(CmState::MraRepRcvd));
    a.send_rtu(1, ca).unwrap();
    let rtu = sent(&mut a).pop().unwrap();
    a.handle_mad(2, addr_b(), &rep);
    assert_eq!(sent(&mut a), vec![rtu]);
    assert_eq!(events(&mut a).len(), 2, "RepReceived and Established only");
    b.handle_mad(2, addr_a(), &rtu);
    assert_eq!(b.state(cb), Some(CmState::Established));
}

#[test]
fn consumer_reject_with_private_data() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    b.listen(SID).unwrap();
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    b.handle_mad(0, addr_a(), &sent(&mut a)[0]);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!()
    };
    assert_eq!(
        b.send_rej(0, r.conn, RejectReason::ConsumerDefined, &[], &[0; 149]),
        Err(CmError::PrivateDataTooLong { max: 148, len: 149 })
    );
    b.send_rej(0, r.conn, RejectReason::ConsumerDefined, &[], b"no thanks")
        .unwrap();
    assert_eq!(b.state(r.conn), Some(CmState::Idle));
    let rej = sent(&mut b).pop().unwrap();
    let CmMessage::Rej(x) = parse(&rej).message else {
        panic!()
    };
    assert_eq!(Some(x.local_comm_id), b.local_comm_id(r.conn));
    assert_eq!(x.message_rejected, MessageRef::Req);
    a.handle_mad(1, addr_b(), &rej);
    let Some(CmEvent::RejReceived(e)) = a.poll_event() else {
        panic!()
    };
    assert_eq!(e.reason, RejectReason::ConsumerDefined);
    assert_eq!(&e.private_data[..9], b"no thanks");
    assert_eq!(e.private_data.len(), 148);
    assert_eq!(a.state(ca), Some(CmState::Idle));
}

#[test]
fn destroy_in_req_sent_sends_rej_timeout_with_ca_guid() {
    let (mut a, mut b) = (agent(0x5054_00ff_fe00_0202, 1, true), agent(0xb, 2, true));
    b.listen(SID).unwrap();
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    b.handle_mad(0, addr_a(), &sent(&mut a)[0]);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!()
    };
    a.destroy(1, ca).unwrap();
    assert_eq!(a.state(ca), None);
    assert_eq!(a.destroy(1, ca), Err(CmError::UnknownConn(ca)));
    let rej = sent(&mut a).pop().unwrap();
    let CmMessage::Rej(x) = parse(&rej).message else {
        panic!()
    };
    assert_eq!(x.reason, RejectReason::Timeout);
    assert_eq!(x.remote_comm_id, 0);
    assert_eq!(x.ari(), &0x5054_00ff_fe00_0202u64.to_be_bytes());
    assert_eq!(a.poll_timeout(), None);
    b.handle_mad(1, addr_a(), &rej);
    assert!(
        matches!(b.poll_event(), Some(CmEvent::RejReceived(e)) if e.reason == RejectReason::Timeout)
    );
    assert_eq!(b.state(r.conn), Some(CmState::Idle));
}

#[test]
fn destroy_passive_before_rep_sends_rej_28_and_after_rep_lingers_in_timewait() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    b.listen(SID).unwrap();
    let (ca, cb) = req_then_rep(&mut a, &mut b, RepParams::new(0x22, 1));
    sent(&mut b);
    b.destroy(1, cb).unwrap();
    let rej = sent(&mut b).pop().unwrap();
    let CmMessage::Rej(x) = parse(&rej).message else {
        panic!()
    };
    assert_eq!(x.reason, RejectReason::ConsumerDefined);
    assert_eq!(b.conn_count(), 1, "lingers in timewait");
    let t = b.poll_timeout().unwrap();
    b.handle_timeout(t);
    assert_eq!(b.conn_count(), 0);
    assert!(
        b.poll_event().is_none(),
        "no event for a destroyed connection"
    );
    a.handle_mad(1, addr_b(), &rej);
    assert!(matches!(a.poll_event(), Some(CmEvent::RejReceived(_))));
    assert_eq!(a.state(ca), Some(CmState::Idle));
}

#[test]
fn disconnect_dreq_drep_timewait() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    let (ca, cb) = connect(&mut a, &mut b);
    a.send_dreq(10, ca, b"bye").unwrap();
    assert_eq!(a.state(ca), Some(CmState::DreqSent));
    let dreq = sent(&mut a).pop().unwrap();
    let dreq_tid = parse(&dreq).transaction_id;
    b.handle_mad(10, addr_a(), &dreq);
    let Some(CmEvent::DreqReceived { conn, private_data }) = b.poll_event() else {
        panic!()
    };
    assert_eq!((conn, &private_data[..3]), (cb, &b"bye"[..]));
    b.send_drep(10, cb, &[]).unwrap();
    assert_eq!(b.state(cb), Some(CmState::Timewait));
    let drep = sent(&mut b).pop().unwrap();
    assert_eq!(parse(&drep).transaction_id, dreq_tid);
    // A duplicate DREQ during the timewait gets the DREP again.
    b.handle_mad(11, addr_a(), &dreq);
    assert_eq!(sent(&mut b), vec![drep]);
    a.handle_mad(11, addr_b(), &drep);
    assert!(matches!(a.poll_event(), Some(CmEvent::DrepReceived { .. })));
    assert_eq!(a.state(ca), Some(CmState::Timewait));
    // Timewait = cm_convert_to_ms(local ACK timeout 17) = 512 ms.
    assert_eq!(a.poll_timeout(), Some(11 + 512 * MS));
    a.handle_timeout(11 + 512 * MS);
    assert_eq!(a.poll_event(), Some(CmEvent::TimewaitExit { conn: ca }));
    assert_eq!(a.state(ca), Some(CmState::Idle));
    b.handle_timeout(10 + 512 * MS);
    assert_eq!(b.poll_event(), Some(CmEvent::TimewaitExit { conn: cb }));
    // After the timewait as well: the DREQ's retransmission (every few seconds) after a
    // lost DREP is answered while the id exists.
    b.handle_mad(4000 * MS, addr_a(), &dreq);
    assert_eq!(sent(&mut b), vec![drep]);
    assert_eq!(b.state(cb), Some(CmState::Idle));
    assert!(b.poll_event().is_none());
    a.destroy(1000 * MS, ca).unwrap();
    assert!(sent(&mut a).is_empty());
    assert_eq!(a.conn_count(), 0);
}

#[test]
fn crossed_dreqs() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    let (ca, cb) = connect(&mut a, &mut b);
    a.send_dreq(0, ca, &[]).unwrap();
    b.send_dreq(0, cb, &[]).unwrap();
    let (da, db) = (sent(&mut a).pop().unwrap(), sent(&mut b).pop().unwrap());
    a.handle_mad(1, addr_b(), &db);
    b.handle_mad(1, addr_a(), &da);
    assert_eq!(a.state(ca), Some(CmState::DreqRcvd));
    assert_eq!(b.state(cb), Some(CmState::DreqRcvd));
    a.disconnect(1, ca).unwrap();
    b.disconnect(1, cb).unwrap();
    let (pa, pb) = (sent(&mut a).pop().unwrap(), sent(&mut b).pop().unwrap());
    a.handle_mad(2, addr_b(), &pb);
    b.handle_mad(2, addr_a(), &pa);
    assert_eq!(a.state(ca), Some(CmState::Timewait));
    assert!(a.disconnect(2, ca).is_err());
    let ea = events(&mut a);
    assert!(matches!(ea[0], CmEvent::DreqReceived { .. }), "{ea:?}");
}

#[test]
fn dreq_timeout_enters_timewait() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    let (ca, _) = connect(&mut a, &mut b);
    a.send_dreq(0, ca, &[]).unwrap();
    assert_eq!(sent(&mut a).len(), 1);
    let mut n = 0;
    while let Some(t) = a.poll_timeout() {
        a.handle_timeout(t);
        n += sent(&mut a).len();
    }
    assert_eq!(n, 15);
    let ev = events(&mut a);
    assert_eq!(
        ev,
        vec![
            CmEvent::DreqTimeout { conn: ca },
            CmEvent::TimewaitExit { conn: ca }
        ]
    );
}

#[test]
fn a_lost_dreq_is_resent_early_on_a_ladder_and_the_retries_stay() {
    let early = |guid, seed| {
        CmAgent::new(AgentConfig {
            ca_guid: guid,
            seed,
            retry_jitter: false,
            ..AgentConfig::default()
        })
    };
    let (mut a, mut b) = (early(0xa, 1), early(0xb, 2));
    let (ca, cb) = connect(&mut a, &mut b);
    let t = a.conns[&ca].response_timeout;
    a.send_dreq(0, ca, &[]).unwrap();
    let first = sent(&mut a);
    assert_eq!(first.len(), 1);
    // lost; the ladder inside the first wait (t/16, 3t/16, 7t/16), then the regular
    // timeouts where Linux has them
    let mut at = Vec::new();
    let mut copies = Vec::new();
    while let Some(when) = a.poll_timeout() {
        a.handle_timeout(when);
        let out = sent(&mut a);
        if !out.is_empty() {
            at.push(when);
            copies.extend(out);
        }
    }
    let steps: Vec<u64> = std::iter::once(0)
        .chain(at.iter().copied())
        .collect::<Vec<_>>()
        .windows(2)
        .map(|w| w[1] - w[0])
        .collect();
    assert_eq!(&at[..4], &[t / 16, 3 * t / 16, 7 * t / 16, t], "{steps:?}");
    assert!(steps[4..].iter().all(|&s| s == t), "{steps:?}");
    // the 15 regular retries are all there, at Linux's times: the early ones come on top
    assert_eq!(copies.len(), 3 + 15);
    assert_eq!(*at.last().unwrap(), 15 * t);
    assert_eq!(a.stats().early_retransmits, 3);
    assert!(
        copies.iter().all(|m| m == &first[0]),
        "every resend is the same DREQ"
    );
    assert!(events(&mut a).contains(&CmEvent::DreqTimeout { conn: ca }));

    // A lost DREP: the first early resend draws it again from the peer's timewait.
    let (mut a, mut b) = (early(0xa, 3), early(0xb, 4));
    let (ca, cb2) = connect(&mut a, &mut b);
    let _ = cb;
    a.send_dreq(0, ca, &[]).unwrap();
    b.handle_mad(MS, addr_a(), &sent(&mut a)[0]);
    b.send_drep(MS, cb2, &[]).unwrap();
    assert_eq!(sent(&mut b).len(), 1, "the DREP, lost");
    let when = a.poll_timeout().unwrap();
    assert_eq!(when, t / 16);
    a.handle_timeout(when);
    let again = sent(&mut a);
    assert_eq!(again.len(), 1);
    b.handle_mad(when + MS, addr_a(), &again[0]);
    let drep = sent(&mut b);
    assert_eq!(drep.len(), 1, "the duplicate DREQ is answered");
    a.handle_mad(when + 2 * MS, addr_b(), &drep[0]);
    assert_eq!(a.state(ca), Some(CmState::Timewait));
}

#[test]
fn a_lost_req_or_rep_is_resent_early_and_an_mra_ends_the_ladder() {
    let early = |guid, seed, delayed| {
        CmAgent::new(AgentConfig {
            ca_guid: guid,
            seed,
            delayed_mra: delayed,
            retry_jitter: false,
            ..AgentConfig::default()
        })
    };
    // The REQ is lost: the first early resend reaches the peer at timeout/16.
    let (mut a, mut b) = (early(0xa, 1, false), early(0xb, 2, false));
    b.listen(SID).unwrap();
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    let t = a.conns[&ca].response_timeout;
    let req = sent(&mut a);
    assert_eq!(a.poll_timeout(), Some(t / 16));
    a.handle_timeout(t / 16);
    let again = sent(&mut a);
    assert_eq!(again, req, "the same REQ, same transaction");
    b.handle_mad(t / 16, addr_a(), &again[0]);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!("the resent REQ arrives as the first")
    };
    // The REP is lost: the next early resend draws it again (our passive side).
    b.send_rep(t / 16, r.conn, RepParams::new(0x22, 0x5678))
        .unwrap();
    let rep = sent(&mut b);
    assert_eq!(rep.len(), 1);
    let next = a.poll_timeout().unwrap();
    assert_eq!(next, t / 16 + t / 8);
    a.handle_timeout(next);
    b.handle_mad(next, addr_a(), &sent(&mut a)[0]);
    assert_eq!(
        sent(&mut b),
        rep,
        "the duplicate REQ is answered with the REP"
    );
    a.handle_mad(next, addr_b(), &rep[0]);
    assert!(matches!(a.poll_event(), Some(CmEvent::RepReceived(_))));
    assert_eq!(a.stats().early_retransmits, 2);

    // A passive side whose application has not answered yet (rdma_cm's prepared MRA):
    // the duplicate draws the MRA, and the ladder ends: the wait is the MRA's now.
    let (mut a, mut b) = (early(0xa, 3, true), early(0xb, 4, true));
    b.listen(SID).unwrap();
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    b.handle_mad(0, addr_a(), &sent(&mut a)[0]);
    assert!(matches!(b.poll_event(), Some(CmEvent::ReqReceived(_))));
    a.handle_timeout(t / 16);
    b.handle_mad(t / 16, addr_a(), &sent(&mut a)[0]);
    let mra = sent(&mut b);
    assert_eq!(mra.len(), 1);
    assert!(matches!(parse(&mra[0]).message, CmMessage::Mra(_)));
    a.handle_mad(t / 16, addr_b(), &mra[0]);
    assert_eq!(a.state(ca), Some(CmState::MraReqRcvd));
    let wait = a.poll_timeout().unwrap() - t / 16;
    assert!(
        wait > 60_000 * MS,
        "the MRA's service timeout, not the ladder: {wait}"
    );
}

#[test]
fn dreq_for_unknown_connection_gets_drep() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    let (ca, cb) = connect(&mut a, &mut b);
    a.send_dreq(0, ca, &[]).unwrap();
    let dreq = sent(&mut a).pop().unwrap();
    let mut fresh = agent(0xc, 3, true);
    fresh.handle_mad(0, addr_a(), &dreq);
    let drep = sent(&mut fresh).pop().unwrap();
    let CmMessage::Drep(x) = parse(&drep).message else {
        panic!()
    };
    assert_eq!(Some(x.local_comm_id), b.local_comm_id(cb));
    assert_eq!(Some(x.remote_comm_id), a.local_comm_id(ca));
    assert_eq!(parse(&drep).transaction_id, parse(&dreq).transaction_id);
}

#[test]
fn stale_req_from_established_qp_gets_rej10_and_old_connection_is_disconnected() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    let (_ca, cb) = connect(&mut a, &mut b);
    // A restarts and reuses QPN 0x11 with a new comm id.
    let mut a2 = agent(0xa, 99, true);
    a2.send_req(0, req_params(0x11)).unwrap();
    b.handle_mad(1, addr_a(), &sent(&mut a2)[0]);
    let out = sent(&mut b);
    assert_eq!(out.len(), 2);
    let CmMessage::Rej(x) = parse(&out[0]).message else {
        panic!()
    };
    assert_eq!(x.reason, RejectReason::StaleConn);
    assert!(matches!(parse(&out[1]).message, CmMessage::Dreq(_)));
    assert_eq!(b.state(cb), Some(CmState::DreqSent));
}

#[test]
fn duplicate_req_in_timewait_gets_rej10() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    b.listen(SID).unwrap();
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    let req = sent(&mut a).pop().unwrap();
    b.handle_mad(0, addr_a(), &req);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!()
    };
    b.send_rep(0, r.conn, RepParams::new(0x22, 1)).unwrap();
    a.handle_mad(0, addr_b(), &sent(&mut b)[0]);
    a.send_rtu(0, ca).unwrap();
    b.handle_mad(0, addr_a(), &sent(&mut a)[0]);
    a.send_dreq(0, ca, &[]).unwrap();
    b.handle_mad(0, addr_a(), &sent(&mut a)[0]);
    b.send_drep(0, r.conn, &[]).unwrap();
    sent(&mut b);
    b.handle_mad(1, addr_a(), &req);
    let CmMessage::Rej(x) = parse(&sent(&mut b)[0]).message else {
        panic!()
    };
    assert_eq!(x.reason, RejectReason::StaleConn);
}

/// cmtime run twice in a row against one server: the second client process (same GID, QPNs
/// allocated from the same start) reuses QPN 0x11 while the server still holds the first
/// run's connection in timewait. The stale rule is keyed by (GID, CA GUID, QPN): a REQ from
/// another CA (a new process, whose context has its own CA GUID) is a new connection; from
/// the same CA it is stale (REJ 10), as Linux answers.
#[test]
fn qpn_reused_by_another_ca_during_timewait_is_not_stale() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    let (ca, cb) = connect(&mut a, &mut b);
    a.send_dreq(0, ca, &[]).unwrap();
    b.handle_mad(0, addr_a(), &sent(&mut a)[0]);
    assert!(matches!(b.poll_event(), Some(CmEvent::DreqReceived { .. })));
    b.send_drep(0, cb, &[]).unwrap();
    sent(&mut b);
    b.destroy(1, cb).unwrap();
    assert_eq!(b.state(cb), None);
    // The next client process: another CA GUID, same GID, same QPN, new comm id.
    let mut a2 = agent(0xa2, 99, true);
    let ca2 = a2.send_req(2, req_params(0x11)).unwrap();
    b.handle_mad(2, addr_a(), &sent(&mut a2)[0]);
    assert!(sent(&mut b).is_empty(), "no REJ 10 to another CA");
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!("no REQ event")
    };
    b.send_rep(2, r.conn, RepParams::new(0x22, 1)).unwrap();
    a2.handle_mad(2, addr_b(), &sent(&mut b)[0]);
    assert!(matches!(a2.poll_event(), Some(CmEvent::RepReceived(_))));
    assert_eq!(a2.state(ca2), Some(CmState::MraRepSent));
    // The same CA reusing the QPN within the timewait: stale, REJ 10.
    let mut a3 = agent(0xa, 7, true);
    a3.send_req(3, req_params(0x11)).unwrap();
    b.handle_mad(3, addr_a(), &sent(&mut a3)[0]);
    let CmMessage::Rej(x) = parse(&sent(&mut b)[0]).message else {
        panic!("no REJ")
    };
    assert_eq!(x.reason, RejectReason::StaleConn);
    assert!(b.poll_event().is_none());
}

/// A REJ with these ids, as a peer would send it (the dangerous forgery: it tears a
/// connection down).
fn rej_mad(
    tid: u64,
    local: u32,
    remote: u32,
    msg: MessageRef,
    reason: RejectReason,
) -> [u8; MAD_LEN] {
    let m = CmMadRepr {
        r_bit: false,
        method: rdma_wire::mad::method::SEND,
        status: 0,
        class_specific: 0,
        transaction_id: tid,
        attribute_modifier: 0,
        message: CmMessage::Rej(rdma_wire::cm::RejRepr {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: msg,
            reject_info_length: 0,
            reason,
            additional_reject_information: [0; 72],
            private_data: [0; 148],
        }),
    };
    let mut out = [0u8; MAD_LEN];
    m.emit(&mut out).unwrap();
    out
}

/// After a forgery: `conn` is still in `state`, no event was produced, nothing was sent and
/// no timer was added or removed.
#[track_caller]
fn unchanged(
    x: &mut CmAgent,
    conn: ConnHandle,
    state: CmState,
    timeout: Option<Nanos>,
    what: &str,
) {
    assert_eq!(x.state(conn), Some(state), "{what}: state");
    assert_eq!(x.poll_event(), None, "{what}: event");
    assert!(sent(x).is_empty(), "{what}: something was sent");
    assert_eq!(x.poll_timeout(), timeout, "{what}: timers");
}

#[test]
fn forged_messages_change_nothing() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    b.listen(SID).unwrap();
    let ca = a.send_req(0, req_params(0x11)).unwrap();
    let req = sent(&mut a).pop().unwrap();
    let tid = parse(&req).transaction_id;
    b.handle_mad(0, addr_a(), &req);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!()
    };
    let (ida, idb) = (
        a.local_comm_id(ca).unwrap(),
        b.local_comm_id(r.conn).unwrap(),
    );
    let ta = a.poll_timeout();
    // REJs of the REQ while A waits for the REP: from the wrong host, and from the right
    // host naming another comm id (B has not sent its REP, so A does not know B's id)
    for (from, remote, what) in [
        (addr_evil(), ida, "REJ of the REQ from the wrong host"),
        (addr_b(), ida ^ 1, "REJ of the REQ naming another comm id"),
    ] {
        let m = rej_mad(
            tid,
            idb,
            remote,
            MessageRef::Req,
            RejectReason::ConsumerDefined,
        );
        a.handle_mad(0, from, &m);
        unchanged(&mut a, ca, CmState::ReqSent, ta, what);
    }
    b.send_rep(0, r.conn, RepParams::new(0x22, 1)).unwrap();
    let rep = sent(&mut b).pop().unwrap();
    let tb = b.poll_timeout();
    // REJs of the REP while B waits for the RTU: wrong host, wrong ids; and a timeout REJ
    // (which names B by A's id and A's CA GUID) from the wrong host
    for (from, local, remote, what) in [
        (addr_evil(), ida, idb, "REJ of the REP from the wrong host"),
        (
            addr_a(),
            ida ^ 1,
            idb,
            "REJ of the REP with the wrong sender id",
        ),
        (
            addr_a(),
            ida,
            idb ^ 1,
            "REJ of the REP naming another comm id",
        ),
    ] {
        let m = rej_mad(
            tid,
            local,
            remote,
            MessageRef::Rep,
            RejectReason::ConsumerDefined,
        );
        b.handle_mad(0, from, &m);
        unchanged(&mut b, r.conn, CmState::RepSent, tb, what);
    }
    let mut m = parse(&rej_mad(
        tid,
        ida,
        0,
        MessageRef::Req,
        RejectReason::Timeout,
    ));
    if let CmMessage::Rej(x) = &mut m.message {
        x.reject_info_length = 8;
        x.additional_reject_information[..8].copy_from_slice(&0xau64.to_be_bytes());
    }
    let mut timeout_rej = [0u8; MAD_LEN];
    m.emit(&mut timeout_rej).unwrap();
    b.handle_mad(0, addr_evil(), &timeout_rej);
    unchanged(
        &mut b,
        r.conn,
        CmState::RepSent,
        tb,
        "timeout REJ from the wrong host",
    );

    // The right REP from the wrong host.
    a.handle_mad(0, addr_evil(), &rep);
    unchanged(&mut a, ca, CmState::ReqSent, ta, "REP from the wrong host");
    // A REP naming another comm id.
    let mut m = parse(&rep);
    if let CmMessage::Rep(x) = &mut m.message {
        x.remote_comm_id ^= 1;
    }
    let mut forged = [0u8; MAD_LEN];
    m.emit(&mut forged).unwrap();
    a.handle_mad(0, addr_b(), &forged);
    unchanged(
        &mut a,
        ca,
        CmState::ReqSent,
        ta,
        "REP naming another comm id",
    );
    a.handle_mad(0, addr_b(), &rep);
    assert!(matches!(a.poll_event(), Some(CmEvent::RepReceived(_))));
    a.send_rtu(0, ca).unwrap();
    assert_eq!(a.poll_event(), Some(CmEvent::Established { conn: ca }));
    let rtu = sent(&mut a).pop().unwrap();
    // RTU from the wrong host, RTU with the wrong remote id.
    b.handle_mad(0, addr_evil(), &rtu);
    unchanged(
        &mut b,
        r.conn,
        CmState::RepSent,
        tb,
        "RTU from the wrong host",
    );
    let mut m = parse(&rtu);
    if let CmMessage::Rtu(x) = &mut m.message {
        x.local_comm_id ^= 1;
    }
    m.emit(&mut forged).unwrap();
    b.handle_mad(0, addr_a(), &forged);
    unchanged(
        &mut b,
        r.conn,
        CmState::RepSent,
        tb,
        "RTU with the wrong remote id",
    );
    b.handle_mad(0, addr_a(), &rtu);
    assert_eq!(b.state(r.conn), Some(CmState::Established));
    assert_eq!(b.poll_event(), Some(CmEvent::Established { conn: r.conn }));
    assert!(sent(&mut b).is_empty());
    // DREQ with the wrong QPN or from the wrong host.
    a.send_dreq(0, ca, &[]).unwrap();
    let dreq = sent(&mut a).pop().unwrap();
    b.handle_mad(0, addr_evil(), &dreq);
    // a DREQ for no connection gets a DREP back to its sender, as Linux's cm_issue_drep
    // does; it goes to the forger, not to A, and the connection is untouched
    let out: Vec<_> = std::iter::from_fn(|| b.poll_transmit()).collect();
    assert_eq!(out.len(), 1, "one DREP to the wrong host");
    assert_eq!(out[0].path, addr_evil());
    assert!(matches!(parse(&out[0].mad).message, CmMessage::Drep(_)));
    unchanged(
        &mut b,
        r.conn,
        CmState::Established,
        None,
        "DREQ from the wrong host",
    );
    let mut m = parse(&dreq);
    if let CmMessage::Dreq(x) = &mut m.message {
        x.remote_qpn_eecn = 0x23;
    }
    m.emit(&mut forged).unwrap();
    b.handle_mad(0, addr_a(), &forged);
    unchanged(
        &mut b,
        r.conn,
        CmState::Established,
        None,
        "DREQ with the wrong QPN",
    );
    // REJs for the established connection: from the wrong host, with the wrong ids (the
    // REP the comment here once said was a REJ is sent too)
    b.handle_mad(0, addr_evil(), &rep);
    unchanged(
        &mut b,
        r.conn,
        CmState::Established,
        None,
        "REP from the wrong host",
    );
    for (from, local, remote, what) in [
        (
            addr_evil(),
            ida,
            idb,
            "REJ of an established connection from the wrong host",
        ),
        (addr_a(), ida ^ 1, idb, "REJ with the wrong sender id"),
        (addr_a(), ida, idb ^ 1, "REJ naming another comm id"),
    ] {
        for msg in [MessageRef::Rep, MessageRef::Other] {
            let m = rej_mad(tid, local, remote, msg, RejectReason::ConsumerDefined);
            b.handle_mad(0, from, &m);
            unchanged(&mut b, r.conn, CmState::Established, None, what);
        }
    }
    let before = b.stats();
    for len in [0, 24, 255, 257] {
        b.handle_mad(0, addr_a(), &vec![0u8; len]);
    }
    let mut junk = rtu;
    junk[17] = 0x99; // unknown attribute
    b.handle_mad(0, addr_a(), &junk);
    assert_eq!(b.stats().malformed, before.malformed + 5);
    unchanged(&mut b, r.conn, CmState::Established, None, "malformed MADs");
    // the control: the same REJ from the right host with the right ids does tear it down,
    // so the forgeries above were refused for what they got wrong
    let m = rej_mad(
        tid,
        ida,
        idb,
        MessageRef::Other,
        RejectReason::ConsumerDefined,
    );
    b.handle_mad(0, addr_a(), &m);
    assert_eq!(b.state(r.conn), Some(CmState::Timewait));
    assert!(matches!(b.poll_event(), Some(CmEvent::RejReceived(x)) if x.conn == r.conn));
}

#[test]
fn rtu_lost_then_dreq_implies_established() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    b.listen(SID).unwrap();
    let (ca, cb) = req_then_rep(&mut a, &mut b, RepParams::new(0x22, 1));
    a.handle_mad(0, addr_b(), &sent(&mut b)[0]);
    a.send_rtu(0, ca).unwrap();
    sent(&mut a); // lost
    a.send_dreq(0, ca, &[]).unwrap();
    b.handle_mad(0, addr_a(), &sent(&mut a)[0]);
    let ev = events(&mut b);
    assert_eq!(ev[0], CmEvent::Established { conn: cb });
    assert!(matches!(ev[1], CmEvent::DreqReceived { .. }));
    assert_eq!(b.poll_timeout(), None, "REP no longer retransmitted");
}

#[test]
fn disconnect_before_the_rtu_establishes_then_sends_the_dreq() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    b.listen(SID).unwrap();
    let (ca, cb) = req_then_rep(&mut a, &mut b, RepParams::new(0x22, 1));
    a.handle_mad(0, addr_b(), &sent(&mut b)[0]);
    a.send_rtu(0, ca).unwrap();
    let rtu = sent(&mut a).pop().unwrap(); // not there yet
    assert_eq!(b.state(cb), Some(CmState::RepSent));
    b.disconnect(5, cb).unwrap();
    assert_eq!(b.state(cb), Some(CmState::DreqSent));
    assert_eq!(b.poll_event(), Some(CmEvent::Established { conn: cb }));
    let dreq = sent(&mut b).pop().unwrap();
    assert!(matches!(parse(&dreq).message, CmMessage::Dreq(_)));
    // the RTU arriving now changes nothing; the active side answers the DREQ
    b.handle_mad(6, addr_a(), &rtu);
    assert_eq!(b.state(cb), Some(CmState::DreqSent));
    a.handle_mad(6, addr_b(), &dreq);
    assert!(events(&mut a)
        .iter()
        .any(|e| matches!(e, CmEvent::DreqReceived { .. })));
    a.send_drep(6, ca, &[]).unwrap();
    b.handle_mad(7, addr_a(), &sent(&mut a)[0]);
    assert!(events(&mut b)
        .iter()
        .any(|e| matches!(e, CmEvent::DrepReceived { .. })));
    assert_eq!(b.state(cb), Some(CmState::Timewait));
    // before the REP, disconnecting is still refused
    let c2 = a.send_req(8, req_params(0x12)).unwrap();
    assert!(matches!(
        a.disconnect(8, c2),
        Err(CmError::InvalidState { .. })
    ));
}

#[test]
fn private_data_limits() {
    let mut a = agent(0xa, 1, true);
    let mut p = req_params(0x11);
    p.private_data = vec![1; 93];
    assert_eq!(
        a.send_req(0, p),
        Err(CmError::PrivateDataTooLong { max: 92, len: 93 })
    );
    let mut p = req_params(0x11);
    p.local_qpn = 1 << 24;
    assert!(matches!(a.send_req(0, p), Err(CmError::InvalidParam(_))));
    assert_eq!(a.conn_count(), 0);
    let mut b = agent(0xb, 2, true);
    b.listen(SID).unwrap();
    a.send_req(0, req_params(0x11)).unwrap();
    b.handle_mad(0, addr_a(), &sent(&mut a)[0]);
    let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
        panic!()
    };
    let mut rp = RepParams::new(0x22, 1);
    rp.private_data = vec![0; 197];
    assert_eq!(
        b.send_rep(0, r.conn, rp),
        Err(CmError::PrivateDataTooLong { max: 196, len: 197 })
    );
    assert_eq!(b.state(r.conn), Some(CmState::MraReqSent));
    assert!(matches!(
        b.send_rtu(0, r.conn),
        Err(CmError::InvalidState { .. })
    ));
}

#[test]
fn backlog_limit_drop_or_reject() {
    for policy in [OverloadPolicy::Drop, OverloadPolicy::Reject] {
        let mut b = CmAgent::new(AgentConfig {
            ca_guid: 0xb,
            seed: 5,
            listen_backlog: 2,
            overload: policy,
            ..AgentConfig::default()
        });
        b.listen(SID).unwrap();
        let mut a = agent(0xa, 1, true);
        for qpn in 1..=3 {
            a.send_req(0, req_params(qpn)).unwrap();
            b.handle_mad(0, addr_a(), &sent(&mut a)[0]);
        }
        assert_eq!(events(&mut b).len(), 2);
        let out = sent(&mut b);
        match policy {
            OverloadPolicy::Drop => assert!(out.is_empty()),
            OverloadPolicy::Reject => {
                let CmMessage::Rej(x) = parse(&out[0]).message else {
                    panic!()
                };
                assert_eq!(x.reason, RejectReason::NoResources);
            }
        }
        assert_eq!(b.stats().overload, 1);
    }
}

#[test]
fn sidr_exchange_no_listener_and_timeout() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    let usid = 0x0000_0000_0111_4853;
    b.listen(usid).unwrap();
    let mut p = SidrReqParams::new(usid, addr_b());
    p.private_data = vec![7; 36];
    let ca = a.send_sidr_req(0, p).unwrap();
    assert_eq!(a.state(ca), Some(CmState::SidrReqSent));
    let req = sent(&mut a).pop().unwrap();
    b.handle_mad(0, addr_a(), &req);
    b.handle_mad(0, addr_a(), &req);
    let ev = events(&mut b);
    assert_eq!(ev.len(), 1, "duplicate dropped");
    let CmEvent::SidrReqReceived(r) = &ev[0] else {
        panic!()
    };
    b.send_sidr_rep(r.conn, SidrRepParams::success(0x12, 0x0123_4567))
        .unwrap();
    let rep = sent(&mut b).pop().unwrap();
    assert_eq!(parse(&rep).transaction_id, parse(&req).transaction_id);
    a.handle_mad(1, addr_b(), &rep);
    let Some(CmEvent::SidrRepReceived(x)) = a.poll_event() else {
        panic!()
    };
    assert_eq!(
        (x.status, x.qpn, x.q_key),
        (SidrStatus::Success, 0x12, 0x0123_4567)
    );
    assert_eq!(a.state(ca), Some(CmState::Idle));
    // No listener: status 1.
    let ca2 = a
        .send_sidr_req(0, SidrReqParams::new(usid + 1, addr_b()))
        .unwrap();
    b.handle_mad(0, addr_a(), &sent(&mut a)[0]);
    a.handle_mad(0, addr_b(), &sent(&mut b)[0]);
    assert!(
        matches!(a.poll_event(), Some(CmEvent::SidrRepReceived(x)) if x.status == SidrStatus::Unsupported && x.conn == ca2)
    );
    // Nobody at all: 15 retries of 4096 ms, then a timeout.
    let ca3 = a
        .send_sidr_req(0, SidrReqParams::new(usid, addr_evil()))
        .unwrap();
    let mut now = 0;
    while let Some(t) = a.poll_timeout() {
        now = t;
        a.handle_timeout(t);
    }
    assert_eq!(now, 16 * 4096 * MS);
    assert_eq!(a.poll_event(), Some(CmEvent::SidrReqTimeout { conn: ca3 }));
}

#[test]
fn refused_sidr_req_is_resent_and_meets_a_late_listener() {
    let (mut a, mut b) = (agent_retrying(0xa, 1, 250 * MS), agent(0xb, 2, true));
    let usid = 0x0000_0000_0111_4853;
    let mut p = SidrReqParams::new(usid, addr_b());
    p.private_data = vec![7; 36];
    let ca = a.send_sidr_req(0, p).unwrap();
    let req = sent(&mut a).pop().unwrap();
    b.handle_mad(0, addr_a(), &req);
    let rep = sent(&mut b).pop().unwrap();
    a.handle_mad(10, addr_b(), &rep);
    // "service id not supported" is not reported yet: the same SIDR_REQ 1 ms later
    assert!(a.poll_event().is_none());
    assert_eq!(a.state(ca), Some(CmState::SidrReqSent));
    assert_eq!(a.poll_timeout(), Some(10 + MS));
    a.handle_timeout(10 + MS);
    let again = sent(&mut a);
    assert_eq!(
        again,
        vec![req],
        "the same MAD (request id, transaction id)"
    );
    assert_eq!(a.stats().refused_resends, 1);
    // the listener is there now
    b.listen(usid).unwrap();
    b.handle_mad(10 + MS, addr_a(), &again[0]);
    let Some(CmEvent::SidrReqReceived(r)) = b.poll_event() else {
        panic!("the late listener gets the SIDR_REQ")
    };
    assert_eq!(&r.private_data[..36], &[7; 36]);
    b.send_sidr_rep(r.conn, SidrRepParams::success(0x12, 0x0123_4567))
        .unwrap();
    a.handle_mad(11 + MS, addr_b(), &sent(&mut b)[0]);
    let Some(CmEvent::SidrRepReceived(x)) = a.poll_event() else {
        panic!()
    };
    assert_eq!((x.conn, x.status, x.qpn), (ca, SidrStatus::Success, 0x12));
    assert_eq!(a.state(ca), Some(CmState::Idle));
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn sidr_refusal_stands_once_the_grace_is_spent_and_a_reject_at_once() {
    let (mut a, mut b) = (agent_retrying(0xa, 1, 10 * MS), agent(0xb, 2, true));
    let usid = 0x0000_0000_0111_4853;
    let ca = a
        .send_sidr_req(0, SidrReqParams::new(usid, addr_b()))
        .unwrap();
    let (resends, now, e) = refused_until_reported(&mut a, &mut b);
    let CmEvent::SidrRepReceived(x) = e else {
        panic!("{e:?}")
    };
    assert_eq!((x.conn, x.status), (ca, SidrStatus::Unsupported));
    // 1 + 2 + 4 ms, then the 3 ms left of the 10: four resends, reported at 10 ms
    assert_eq!((resends, now), (4, 10 * MS));
    assert_eq!(a.state(ca), Some(CmState::Idle));
    assert_eq!(a.poll_timeout(), None);
    // a listener's refusal is its answer: reported at once
    b.listen(usid).unwrap();
    let ca2 = a
        .send_sidr_req(now, SidrReqParams::new(usid, addr_b()))
        .unwrap();
    b.handle_mad(now, addr_a(), &sent(&mut a)[0]);
    let Some(CmEvent::SidrReqReceived(r)) = b.poll_event() else {
        panic!()
    };
    let mut rej = SidrRepParams::success(0, 0);
    rej.status = SidrStatus::Reject;
    b.send_sidr_rep(r.conn, rej).unwrap();
    a.handle_mad(now, addr_b(), &sent(&mut b)[0]);
    assert!(
        matches!(a.poll_event(), Some(CmEvent::SidrRepReceived(x)) if x.conn == ca2 && x.status == SidrStatus::Reject)
    );
    assert_eq!(a.stats().refused_resends, 4);
}

#[test]
fn destroy_silently_sends_nothing_and_the_retried_req_is_a_new_request() {
    for delayed in [false, true] {
        let (mut a, mut b) = (agent(0xa, 1, delayed), agent(0xb, 2, delayed));
        b.listen(SID).unwrap();
        let ca = a.send_req(0, req_params(0x11)).unwrap();
        let req = sent(&mut a);
        for m in &req {
            b.handle_mad(0, addr_a(), m);
        }
        let Some(CmEvent::ReqReceived(r)) = b.poll_event() else {
            panic!("no REQ event")
        };
        b.destroy_silently(r.conn).unwrap();
        assert!(sent(&mut b).is_empty(), "nothing on the wire");
        assert_eq!(b.state(r.conn), None);
        assert_eq!(b.conn_count(), 0);
        assert_eq!(
            b.destroy_silently(r.conn),
            Err(CmError::UnknownConn(r.conn))
        );
        // The requester times out and retries: the same REQ is a new request now.
        let t = a.poll_timeout().unwrap();
        a.handle_timeout(t);
        let retry = sent(&mut a);
        assert_eq!(retry, req, "retransmitted as sent");
        for m in &retry {
            b.handle_mad(t, addr_a(), m);
        }
        let Some(CmEvent::ReqReceived(r2)) = b.poll_event() else {
            panic!("the retry is not a new request")
        };
        assert_ne!(r2.conn, r.conn);
        b.send_rep(t, r2.conn, RepParams::new(0x22, 0x5678))
            .unwrap();
        for m in sent(&mut b) {
            a.handle_mad(t, addr_b(), &m);
        }
        assert!(matches!(a.poll_event(), Some(CmEvent::RepReceived(_))));
        a.send_rtu(t, ca).unwrap();
        assert_eq!(a.state(ca), Some(CmState::Established));
    }
}

#[test]
fn destroy_silently_only_before_an_answer() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    let (ca, cb) = connect(&mut a, &mut b);
    assert_eq!(
        b.destroy_silently(cb),
        Err(CmError::InvalidState {
            op: "destroy_silently",
            state: CmState::Established
        })
    );
    assert_eq!(b.state(cb), Some(CmState::Established));
    assert!(matches!(
        a.destroy_silently(ca),
        Err(CmError::InvalidState { .. })
    ));
}

#[test]
fn a_dreq_to_a_peer_no_one_listens_at_ends_without_its_retries() {
    let (mut a, mut b) = (agent(0xa, 1, true), agent(0xb, 2, true));
    let (ca, _) = connect(&mut a, &mut b);
    let peer = a.path(ca).unwrap().remote_gid;
    // another peer's address, or an established connection: nothing ends
    assert_eq!(a.peer_unreachable(0, addr_evil().remote_gid), 0);
    assert_eq!(a.peer_unreachable(0, peer), 0);
    assert_eq!(a.state(ca), Some(CmState::Established));
    a.send_dreq(0, ca, &[]).unwrap();
    assert_eq!(sent(&mut a).len(), 1);
    assert_eq!(a.peer_unreachable(MS, peer), 1);
    assert_eq!(a.state(ca), Some(CmState::Timewait));
    assert_eq!(events(&mut a), vec![CmEvent::DreqTimeout { conn: ca }]);
    // no retry of the DREQ follows, only the timewait's end
    let mut n = 0;
    while let Some(t) = a.poll_timeout() {
        a.handle_timeout(t);
        n += sent(&mut a).len();
    }
    assert_eq!(n, 0);
    assert_eq!(events(&mut a), vec![CmEvent::TimewaitExit { conn: ca }]);
}
