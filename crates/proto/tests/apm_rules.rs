//! Path migration rules of one RC QP, packet by packet: which modify calls are legal, the
//! MigReq bit it sends, which packets it accepts on which port, and when it arms or migrates.

use rdma_proto::memory::InMemoryTable;
use rdma_proto::packet::{header, Packet};
use rdma_proto::rc::{MigrationCause, QpEvent, RcConfig, RcQp};
use rdma_proto::sim::{connect, load_alt_path, ConnParams, ALT_PORT};
use rdma_proto::verbs::{
    MigState, ModifyError, PdId, QpAttr, QpAttrMask as M, QpState, RecvWr, SendFlags, SendOp,
    SendWr,
};
use rdma_wire::opcode::Opcode;
use rdma_wire::packet::PacketRepr;
use rdma_wire::reth::RethRepr;

fn qp() -> (RcQp, InMemoryTable) {
    let mut qp = RcQp::new(RcConfig::new(0x11, PdId(1)));
    connect(&mut qp, 0x22, 100, 500, &ConnParams::default());
    (qp, InMemoryTable::new(0, 4096))
}

fn write_req(psn: u32, mig_req: bool) -> PacketRepr {
    let mut h = header(Opcode::RcRdmaWriteOnly, 0x11, psn);
    h.reth = Some(RethRepr {
        va: 0,
        r_key: 0,
        dma_len: 0,
    });
    h.bth.ack_req = true;
    h.bth.mig_req = mig_req;
    h
}

fn deliver(qp: &mut RcQp, mem: &mut InMemoryTable, h: PacketRepr, port: u8) {
    qp.handle_packet_on(
        0,
        mem,
        &Packet {
            header: h,
            payload: &[],
        },
        port,
    );
}

/// A connected QP with an alternate path loaded in Rearm, armed by the peer's WRITE 500
/// (MigReq clear, on the primary), whose ACK was taken.
fn armed() -> (RcQp, InMemoryTable) {
    let (mut qp, mut mem) = qp();
    load_alt_path(&mut qp, MigState::Rearm, 0).unwrap();
    deliver(&mut qp, &mut mem, write_req(500, false), 1);
    assert_eq!(qp.path_mig_state(), MigState::Armed);
    sent(&mut qp, &mut mem);
    (qp, mem)
}

/// Everything the QP sends now: (opcode, psn, MigReq, port).
fn sent(qp: &mut RcQp, mem: &mut InMemoryTable) -> Vec<(Opcode, u32, bool, u8)> {
    let mut buf = [0u8; 4096];
    let mut v = Vec::new();
    while let Some(t) = qp.poll_transmit(0, mem, &mut buf) {
        v.push((
            t.header.bth.opcode,
            t.header.bth.psn,
            t.header.bth.mig_req,
            t.port,
        ));
    }
    v
}

/// Posts `n` zero-length WRITEs (wr ids 0..n) with `flags`.
fn post_writes(qp: &mut RcQp, mem: &InMemoryTable, n: u64, flags: SendFlags) {
    for i in 0..n {
        let op = SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: 0,
        };
        qp.post_send(mem, &SendWr::new(i, op).with_flags(flags))
            .unwrap();
    }
}

#[test]
fn without_an_alternate_nothing_changes() {
    let (mut qp, mut mem) = qp();
    assert_eq!(qp.path_mig_state(), MigState::Migrated);
    assert_eq!(
        qp.migrate(),
        Err(ModifyError::BadValue("path_mig_state transition"))
    );
    // MigReq stays clear, every packet leaves from port 1, a packet on another port is
    // processed as before (no APM rules without an alternate path)
    deliver(&mut qp, &mut mem, write_req(500, true), 7);
    assert_eq!(
        sent(&mut qp, &mut mem),
        vec![(Opcode::RcAcknowledge, 500, false, 1)]
    );
    assert!(qp.poll_event().is_none());
}

#[test]
fn modify_checks_the_alternate_path_and_the_state_machine() {
    let (mut qp, _) = qp();
    let same_port = QpAttr {
        alt_port_num: 1,
        path_mig_state: MigState::Rearm,
        ..QpAttr::default()
    };
    assert!(qp
        .modify(&same_port, M::ALT_PATH | M::PATH_MIG_STATE)
        .is_err());
    let rearm = QpAttr {
        path_mig_state: MigState::Rearm,
        ..QpAttr::default()
    };
    // Rearm needs an alternate path
    assert!(qp.modify(&rearm, M::PATH_MIG_STATE).is_err());
    assert_eq!(qp.path_mig_state(), MigState::Migrated);
    load_alt_path(&mut qp, MigState::Rearm, 12).unwrap();
    assert_eq!(qp.attr().path_mig_state, MigState::Rearm);
    assert_eq!(qp.attr().alt_port_num, ALT_PORT);
    // software cannot arm, nor migrate from Rearm
    let armed = QpAttr {
        path_mig_state: MigState::Armed,
        ..QpAttr::default()
    };
    assert!(qp.modify(&armed, M::PATH_MIG_STATE).is_err());
    assert!(qp.migrate().is_err());
    assert_eq!(qp.path_mig_state(), MigState::Rearm);
}

#[test]
fn rearm_arms_on_mig_req_clear_then_peer_migration_is_followed() {
    let (mut qp, mut mem) = qp();
    load_alt_path(&mut qp, MigState::Rearm, 12).unwrap();
    // a peer still in Migrated (MigReq set) does not arm us
    deliver(&mut qp, &mut mem, write_req(500, true), 1);
    assert_eq!(qp.path_mig_state(), MigState::Rearm);
    // Rearm and Armed send MigReq clear
    assert_eq!(
        sent(&mut qp, &mut mem),
        vec![(Opcode::RcAcknowledge, 500, false, 1)]
    );
    deliver(&mut qp, &mut mem, write_req(501, false), 1);
    assert_eq!(qp.path_mig_state(), MigState::Armed);
    sent(&mut qp, &mut mem);
    // Armed: a packet on the alternate port with MigReq clear is dropped (a stale one)
    let dropped = qp.stats().dropped;
    deliver(&mut qp, &mut mem, write_req(502, false), ALT_PORT);
    assert_eq!(qp.stats().dropped, dropped + 1);
    assert!(sent(&mut qp, &mut mem).is_empty());
    // with MigReq set it is the peer's migration: we follow, then process the packet
    deliver(&mut qp, &mut mem, write_req(502, true), ALT_PORT);
    assert_eq!(
        qp.poll_event(),
        Some(QpEvent::PathMigrated {
            cause: MigrationCause::Peer,
            from_port: 1,
            to_port: ALT_PORT
        })
    );
    assert_eq!(qp.path_mig_state(), MigState::Migrated);
    assert_eq!(qp.attr().port_num, ALT_PORT);
    assert_eq!(qp.attr().timeout, 12);
    assert_eq!(
        sent(&mut qp, &mut mem),
        vec![(Opcode::RcAcknowledge, 502, true, ALT_PORT)]
    );
    // the peer is on the new path already: the old one is no longer heard
    let dropped = qp.stats().dropped;
    deliver(&mut qp, &mut mem, write_req(503, false), 1);
    assert_eq!(qp.stats().dropped, dropped + 1);
    assert_eq!(qp.attr().rq_psn, 503);
}

#[test]
fn forced_migration_resends_from_the_oldest_unacked_psn_on_the_alternate() {
    let (mut qp, mut mem) = armed();
    qp.post_recv(&RecvWr::new(9)).unwrap();
    post_writes(&mut qp, &mem, 3, SendFlags::empty());
    let first = sent(&mut qp, &mut mem);
    assert_eq!(
        first.iter().map(|p| (p.1, p.2, p.3)).collect::<Vec<_>>(),
        vec![(100, false, 1), (101, false, 1), (102, false, 1)]
    );
    // 100 acknowledged, then the link goes down
    let mut ack = header(Opcode::RcAcknowledge, 0x11, 100);
    ack.aeth = Some(rdma_proto::packet::ack(1));
    deliver(&mut qp, &mut mem, ack, 1);
    qp.migrate().unwrap();
    assert!(matches!(
        qp.poll_event(),
        Some(QpEvent::PathMigrated {
            cause: MigrationCause::Forced,
            ..
        })
    ));
    assert_eq!(qp.state(), QpState::Rts);
    let again = sent(&mut qp, &mut mem);
    assert_eq!(
        again.iter().map(|p| (p.1, p.2, p.3)).collect::<Vec<_>>(),
        vec![(101, true, ALT_PORT), (102, true, ALT_PORT)]
    );
    assert!(qp.poll_timeout().is_some());
    // the peer has not migrated yet: its requests on the old port are still accepted, and
    // answered on the new path with MigReq set...
    deliver(&mut qp, &mut mem, write_req(501, false), 1);
    assert_eq!(
        sent(&mut qp, &mut mem),
        vec![(Opcode::RcAcknowledge, 501, true, ALT_PORT)]
    );
    // ...until it is heard on the new one
    deliver(&mut qp, &mut mem, write_req(502, true), ALT_PORT);
    sent(&mut qp, &mut mem);
    let dropped = qp.stats().dropped;
    deliver(&mut qp, &mut mem, write_req(503, false), 1);
    assert_eq!(qp.stats().dropped, dropped + 1);
    // migrating again needs a new alternate path
    assert!(qp.migrate().is_err());
}

#[test]
fn rearm_follows_a_peer_that_migrated_onto_our_alternate() {
    let (mut qp, mut mem) = qp();
    load_alt_path(&mut qp, MigState::Rearm, 0).unwrap();
    // stale (MigReq clear) on the alternate: dropped, still Rearm
    let dropped = qp.stats().dropped;
    deliver(&mut qp, &mut mem, write_req(500, false), ALT_PORT);
    assert_eq!(qp.stats().dropped, dropped + 1);
    assert_eq!(qp.path_mig_state(), MigState::Rearm);
    // the peer armed on our packets and migrated: we follow
    deliver(&mut qp, &mut mem, write_req(500, true), ALT_PORT);
    assert!(matches!(
        qp.poll_event(),
        Some(QpEvent::PathMigrated {
            cause: MigrationCause::Peer,
            ..
        })
    ));
    assert_eq!(qp.attr().port_num, ALT_PORT);
    assert_eq!(
        sent(&mut qp, &mut mem),
        vec![(Opcode::RcAcknowledge, 500, true, ALT_PORT)]
    );
}

#[test]
fn a_peer_migration_also_resends_our_own_outstanding_requests() {
    let (mut qp, mut mem) = armed();
    post_writes(&mut qp, &mem, 2, SendFlags::SIGNALED);
    assert_eq!(sent(&mut qp, &mut mem).len(), 2); // PSNs 100, 101 on port 1, unacknowledged
    deliver(&mut qp, &mut mem, write_req(501, true), ALT_PORT);
    let out = sent(&mut qp, &mut mem);
    // the ACK for the peer's request and our two requests again, all on the new path
    assert_eq!(out.len(), 3, "{out:?}");
    assert!(out.contains(&(Opcode::RcAcknowledge, 501, true, ALT_PORT)));
    assert!(out.contains(&(Opcode::RcRdmaWriteOnly, 100, true, ALT_PORT)));
    assert!(out.contains(&(Opcode::RcRdmaWriteOnly, 101, true, ALT_PORT)));
    // acknowledged on the new path: both complete once
    let mut ack = header(Opcode::RcAcknowledge, 0x11, 101);
    ack.aeth = Some(rdma_proto::packet::ack(2));
    ack.bth.mig_req = true;
    deliver(&mut qp, &mut mem, ack, ALT_PORT);
    deliver(&mut qp, &mut mem, ack, ALT_PORT);
    assert_eq!(qp.send_queue_len(), 0);
    assert_eq!(qp.oldest_unacked_psn(), 102);
    let ids: Vec<u64> = std::iter::from_fn(|| qp.poll_send_completion())
        .map(|c| c.wr_id)
        .collect();
    assert_eq!(ids, vec![0, 1]);
}

#[test]
fn a_forced_migration_with_nothing_to_send_announces_itself_with_an_ack() {
    let (mut qp, mut mem) = armed();
    qp.post_recv(&RecvWr::new(9)).unwrap();
    qp.migrate().unwrap();
    // no request of ours outstanding: an ACK of the last PSN received, MigReq set, on the
    // new path, so that a peer with requests outstanding follows at once
    assert_eq!(
        sent(&mut qp, &mut mem),
        vec![(Opcode::RcAcknowledge, 500, true, ALT_PORT)]
    );
}

#[test]
fn a_stale_ack_with_mig_req_on_the_alternate_migrates_an_armed_requester() {
    let (mut qp, mut mem) = armed();
    post_writes(&mut qp, &mem, 2, SendFlags::empty());
    // PSNs 100, 101, unacknowledged
    assert_eq!(sent(&mut qp, &mut mem).len(), 2);
    // the peer's announcement: an ACK of a PSN before anything outstanding
    let mut ack = header(Opcode::RcAcknowledge, 0x11, 99);
    ack.aeth = Some(rdma_proto::packet::ack(0));
    ack.bth.mig_req = true;
    deliver(&mut qp, &mut mem, ack, ALT_PORT);
    assert!(matches!(
        qp.poll_event(),
        Some(QpEvent::PathMigrated {
            cause: MigrationCause::Peer,
            ..
        })
    ));
    // it completes nothing, and what is outstanding goes again on the new path
    assert!(qp.poll_send_completion().is_none());
    assert_eq!(qp.oldest_unacked_psn(), 100);
    assert_eq!(
        sent(&mut qp, &mut mem)
            .iter()
            .map(|p| (p.0, p.1, p.2, p.3))
            .collect::<Vec<_>>(),
        vec![
            (Opcode::RcRdmaWriteOnly, 100, true, ALT_PORT),
            (Opcode::RcRdmaWriteOnly, 101, true, ALT_PORT)
        ]
    );
}
