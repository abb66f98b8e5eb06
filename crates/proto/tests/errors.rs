//! Error paths and security: every refused access leaves memory untouched, the right NAK and
//! completion appear, and the QPs flush.

use rdma_proto::packet::header;
use rdma_proto::psn::psn_add;
use rdma_proto::sim::{ConnParams, Faults, RcPair, BASE_A, BASE_B, MEM_SIZE};
use rdma_proto::verbs::{
    AccessFlags, PdId, QpState, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use rdma_proto::wire;
use rdma_wire::opcode::Opcode;
use rdma_wire::reth::RethRepr;

const LIMIT: u64 = 100_000_000_000;

fn pair() -> RcPair {
    RcPair::new(7, Faults::clean())
}

/// B's whole memory (where requests land).
fn snapshot(s: &RcPair) -> Vec<u8> {
    s.b.mem.bytes(BASE_B, MEM_SIZE as u64).unwrap().to_vec()
}

/// A's whole memory (where READ and atomic results land).
fn snapshot_a(s: &RcPair) -> Vec<u8> {
    s.a.mem.bytes(BASE_A, MEM_SIZE as u64).unwrap().to_vec()
}

/// Posts one op from A and runs; returns A's completion.
fn one(s: &mut RcPair, op: SendOp, len: u32) -> rdma_proto::verbs::Completion {
    let wr = SendWr::new(1, op)
        .with_sge(Sge {
            addr: s.a.buf_addr,
            length: len,
            lkey: s.a.lkey,
        })
        .signaled();
    s.a.qp.post_send(&s.a.mem, &wr).unwrap();
    assert!(s.run_until_idle(LIMIT));
    s.a.qp.poll_send_completion().expect("a completion")
}

fn expect_fatal(s: &mut RcPair, op: SendOp, len: u32, status: WcStatus) {
    // a receive at B to see it flushed
    s.b.qp
        .post_recv(&RecvWr::new(99).with_sge(Sge {
            addr: s.b.buf_addr,
            length: 64,
            lkey: s.b.lkey,
        }))
        .unwrap();
    // distinct patterns on both sides, so that a refused READ or atomic that still moved
    // data (B's bytes into A's destination) or a refused WRITE (A's into B) shows
    let (a0, b0) = (s.a.buf_addr, s.b.buf_addr);
    s.a.mem.bytes_mut(a0, 8192).unwrap().fill(0xA5);
    s.b.mem.bytes_mut(b0, 8192).unwrap().fill(0x5A);
    let (before_a, before_b) = (snapshot_a(s), snapshot(s));
    let c = one(s, op, len);
    assert_eq!(c.status, status, "{c:?}");
    assert_eq!(s.a.qp.state(), QpState::Err);
    assert_eq!(s.b.qp.state(), QpState::Err);
    let r = s.b.qp.poll_recv_completion().unwrap();
    assert_eq!((r.wr_id, r.status), (99, WcStatus::WrFlushErr));
    assert!(
        snapshot(s) == before_b,
        "B's memory changed by a refused request"
    );
    assert!(
        snapshot_a(s) == before_a,
        "A's memory changed by a refused request"
    );
}

#[test]
fn write_with_wrong_rkey() {
    let mut s = pair();
    let (va, rkey) = (s.b.buf_addr, s.b.rkey ^ 0x5a);
    expect_fatal(
        &mut s,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        16,
        WcStatus::RemAccessErr,
    );
}

#[test]
fn read_and_atomics_with_wrong_rkey() {
    for op in [
        |va, rkey| SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        |va, rkey| SendOp::AtomicFetchAndAdd {
            remote_addr: va,
            rkey,
            add: 1,
        },
        |va, rkey| SendOp::AtomicCmpAndSwp {
            remote_addr: va,
            rkey,
            compare: 0x5a5a_5a5a_5a5a_5a5a,
            swap: 1,
        },
    ] {
        let mut s = pair();
        let (va, rkey) = (s.b.buf_addr, s.b.rkey ^ 0x5a);
        let len = if matches!(op(0, 0), SendOp::RdmaRead { .. }) {
            4000
        } else {
            8
        };
        expect_fatal(&mut s, op(va, rkey), len, WcStatus::RemAccessErr);
    }
}

#[test]
fn read_and_atomics_past_the_end_of_the_region() {
    let mut s = pair();
    let (va, rkey) = (s.b.buf_addr + s.b.buf_len - 8, s.b.rkey);
    expect_fatal(
        &mut s,
        SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        16,
        WcStatus::RemAccessErr,
    );
    let mut s = pair();
    let (va, rkey) = (s.b.buf_addr + s.b.buf_len, s.b.rkey);
    expect_fatal(
        &mut s,
        SendOp::AtomicFetchAndAdd {
            remote_addr: va,
            rkey,
            add: 1,
        },
        8,
        WcStatus::RemAccessErr,
    );
}

#[test]
fn write_past_the_end_of_the_region() {
    let mut s = pair();
    let (va, rkey) = (s.b.buf_addr + s.b.buf_len - 8, s.b.rkey);
    expect_fatal(
        &mut s,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        16,
        WcStatus::RemAccessErr,
    );
    let mut s = pair();
    let (va, rkey) = (s.b.buf_addr - 1, s.b.rkey);
    expect_fatal(
        &mut s,
        SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        16,
        WcStatus::RemAccessErr,
    );
}

#[test]
fn multi_packet_write_past_the_end() {
    let mut s = pair();
    // 3 packets; the last 100 bytes fall outside: refused at the first packet, nothing written
    let (va, rkey) = (s.b.buf_addr + s.b.buf_len - 3000 + 100, s.b.rkey);
    expect_fatal(
        &mut s,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        3000,
        WcStatus::RemAccessErr,
    );
}

#[test]
fn missing_access_rights() {
    let mut s = pair();
    let base = s.b.buf_addr;
    let k =
        s.b.mem
            .register(
                s.b.pd,
                base,
                4096,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap();
    expect_fatal(
        &mut s,
        SendOp::RdmaWrite {
            remote_addr: base,
            rkey: k.rkey,
        },
        8,
        WcStatus::RemAccessErr,
    );
    let mut s = pair();
    let k =
        s.b.mem
            .register(
                s.b.pd,
                base,
                4096,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
    expect_fatal(
        &mut s,
        SendOp::RdmaRead {
            remote_addr: base,
            rkey: k.rkey,
        },
        8,
        WcStatus::RemAccessErr,
    );
    let mut s = pair();
    let k =
        s.b.mem
            .register(
                s.b.pd,
                base,
                4096,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
    expect_fatal(
        &mut s,
        SendOp::AtomicFetchAndAdd {
            remote_addr: base,
            rkey: k.rkey,
            add: 1,
        },
        8,
        WcStatus::RemAccessErr,
    );
}

#[test]
fn key_of_another_protection_domain() {
    let mut s = pair();
    let base = s.b.buf_addr;
    let k =
        s.b.mem
            .register(PdId(2), base, 4096, AccessFlags::all())
            .unwrap();
    expect_fatal(
        &mut s,
        SendOp::RdmaWrite {
            remote_addr: base,
            rkey: k.rkey,
        },
        8,
        WcStatus::RemAccessErr,
    );
    // READ and atomics through a key of another PD: refused the same way
    for i in 0..2 {
        let mut s = pair();
        let k =
            s.b.mem
                .register(PdId(2), base, 4096, AccessFlags::all())
                .unwrap();
        let op = if i == 0 {
            SendOp::RdmaRead {
                remote_addr: base,
                rkey: k.rkey,
            }
        } else {
            SendOp::AtomicCmpAndSwp {
                remote_addr: base,
                rkey: k.rkey,
                compare: 0x5a5a_5a5a_5a5a_5a5a,
                swap: 1,
            }
        };
        expect_fatal(&mut s, op, 8, WcStatus::RemAccessErr);
    }
}

#[test]
fn misaligned_atomic_is_an_invalid_request() {
    let mut s = pair();
    let (va, rkey) = (s.b.buf_addr + 4, s.b.rkey);
    expect_fatal(
        &mut s,
        SendOp::AtomicFetchAndAdd {
            remote_addr: va,
            rkey,
            add: 1,
        },
        8,
        WcStatus::RemInvReqErr,
    );
}

#[test]
fn qp_without_remote_write_refuses_writes() {
    let p = ConnParams {
        access: AccessFlags::LOCAL_WRITE,
        ..ConnParams::default()
    };
    let mut s = RcPair::with_attrs(3, Faults::clean(), &p);
    let (va, rkey) = (s.b.buf_addr, s.b.rkey);
    expect_fatal(
        &mut s,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        8,
        WcStatus::RemInvReqErr,
    );
}

#[test]
fn receive_too_small() {
    let mut s = pair();
    s.b.qp
        .post_recv(&RecvWr::new(5).with_sge(Sge {
            addr: s.b.buf_addr,
            length: 10,
            lkey: s.b.lkey,
        }))
        .unwrap();
    let c = one(&mut s, SendOp::Send, 11);
    assert_eq!(c.status, WcStatus::RemInvReqErr);
    let r = s.b.qp.poll_recv_completion().unwrap();
    assert_eq!((r.wr_id, r.status), (5, WcStatus::LocLenErr));
}

fn forge_write(s: &RcPair, psn: u32, va: u64, data: &[u8]) -> Vec<u8> {
    let mut h = header(Opcode::RcRdmaWriteOnly, s.b.qp.qpn(), psn);
    h.reth = Some(RethRepr {
        va,
        r_key: s.b.rkey,
        dma_len: data.len() as u32,
    });
    h.bth.ack_req = true;
    let mut out = vec![0; 256];
    let n = wire::emit(&h, data, &mut out, Some(&s.encap(true))).unwrap();
    out.truncate(n);
    out
}

#[test]
fn forged_and_out_of_window_psns_are_not_executed() {
    let mut s = pair();
    let epsn = s.b.qp.attr().rq_psn;
    let before = snapshot(&s);
    let va = s.b.buf_addr;
    // ahead of the window: one PSN sequence error NAK, nothing executed
    for d in [1u32, 1000, 0x7F_FFFF] {
        let pkt = forge_write(&s, psn_add(epsn, d), va, b"evil");
        s.inject(true, pkt);
    }
    // behind: treated as a duplicate, re-ACKed, not executed
    let pkt = forge_write(&s, psn_add(epsn, 0xFF_FFF0), va, b"evil");
    s.inject(true, pkt);
    assert!(s.run_until_idle(LIMIT));
    assert_eq!(snapshot(&s), before);
    assert_eq!(s.b.qp.stats().naks_sent, 1, "one NAK per gap");
    // A saw a NAK and an ACK for PSNs it never sent: ignored
    assert_eq!(s.a.qp.state(), QpState::Rts);
    assert_eq!(s.b.qp.state(), QpState::Rts);
    // a corrupted packet is refused by the ICRC
    let mut pkt = forge_write(&s, epsn, va, b"evil");
    pkt[30] ^= 4;
    s.inject(true, pkt);
    assert!(s.run_until_idle(LIMIT));
    assert_eq!(snapshot(&s), before);
    assert_eq!(s.stats.rejected, 1);
    // the connection still works
    let (rkey, va2) = (s.b.rkey, s.b.buf_addr + 64);
    let c = one(
        &mut s,
        SendOp::RdmaWrite {
            remote_addr: va2,
            rkey,
        },
        32,
    );
    assert_eq!(c.status, WcStatus::Success);
}

#[test]
fn retries_exhausted_then_flush() {
    let mut s = pair();
    s.faults = Faults::lossy(1.0);
    for i in 0..3 {
        let wr = SendWr::new(i, SendOp::Send)
            .with_sge(Sge {
                addr: s.a.buf_addr,
                length: 8,
                lkey: s.a.lkey,
            })
            .signaled();
        s.a.qp.post_send(&s.a.mem, &wr).unwrap();
    }
    assert!(s.run_until_idle(LIMIT));
    let c: Vec<_> = std::iter::from_fn(|| s.a.qp.poll_send_completion())
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        c,
        vec![
            (0, WcStatus::RetryExcErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(s.a.qp.stats().timeouts, 8, "retry_cnt 7: 1 + 7 tries");
    // 8 timeouts of 4.096 µs * 2^10
    let t = 4096u64 << 10;
    assert!(s.now >= 8 * t && s.now < 9 * t, "{}", s.now);
    // posting in Err completes at once, flushed
    let wr = SendWr::new(9, SendOp::Send);
    s.a.qp.post_send(&s.a.mem, &wr).unwrap();
    assert_eq!(
        s.a.qp.poll_send_completion().unwrap().status,
        WcStatus::WrFlushErr
    );
}

#[test]
fn rnr_retries_exhausted() {
    let p = ConnParams {
        rnr_retry: 2,
        ..ConnParams::default()
    };
    let mut s = RcPair::with_attrs(5, Faults::clean(), &p);
    let c = one(&mut s, SendOp::Send, 8);
    assert_eq!(c.status, WcStatus::RnrRetryExcErr);
    assert_eq!(s.a.qp.stats().rnr_naks_received, 3);
    assert_eq!(s.a.qp.state(), QpState::Err);
}

#[test]
fn rnr_infinite_waits_for_a_receive() {
    let p = ConnParams {
        rnr_retry: 7,
        min_rnr_timer: 0,
        ..ConnParams::default()
    };
    let mut s = RcPair::with_attrs(5, Faults::clean(), &p);
    let wr = SendWr::new(1, SendOp::SendWithImm { imm: 0x1234 })
        .with_sge(Sge {
            addr: s.a.buf_addr,
            length: 8,
            lkey: s.a.lkey,
        })
        .signaled();
    s.a.qp.post_send(&s.a.mem, &wr).unwrap();
    // three RNR periods of 655.36 ms, then a receive appears
    assert!(!s.run_until_idle(3 * 655_360_000));
    assert!(s.a.qp.stats().rnr_naks_received >= 3);
    s.b.qp
        .post_recv(&RecvWr::new(2).with_sge(Sge {
            addr: s.b.buf_addr,
            length: 64,
            lkey: s.b.lkey,
        }))
        .unwrap();
    assert!(s.run_until_idle(LIMIT));
    assert_eq!(
        s.a.qp.poll_send_completion().unwrap().status,
        WcStatus::Success
    );
    let r = s.b.qp.poll_recv_completion().unwrap();
    assert_eq!((r.status, r.imm()), (WcStatus::Success, Some(0x1234)));
}

#[test]
fn send_with_invalidate_and_write_with_imm() {
    let mut s = pair();
    let base = s.b.buf_addr;
    let mw =
        s.b.mem
            .register(s.b.pd, base + 4096, 4096, AccessFlags::all())
            .unwrap();
    for i in 0..2 {
        s.b.qp
            .post_recv(&RecvWr::new(i).with_sge(Sge {
                addr: base,
                length: 64,
                lkey: s.b.lkey,
            }))
            .unwrap();
    }
    let c = one(
        &mut s,
        SendOp::RdmaWriteWithImm {
            remote_addr: base + 4096,
            rkey: mw.rkey,
            imm: 7,
        },
        16,
    );
    assert_eq!(c.status, WcStatus::Success);
    let r = s.b.qp.poll_recv_completion().unwrap();
    assert_eq!(
        (r.opcode, r.byte_len, r.imm()),
        (WcOpcode::RecvRdmaWithImm, 16, Some(7))
    );
    let c = one(
        &mut s,
        SendOp::SendWithInv {
            invalidate_rkey: mw.rkey,
        },
        16,
    );
    assert_eq!(c.status, WcStatus::Success);
    let r = s.b.qp.poll_recv_completion().unwrap();
    assert_eq!((r.opcode, r.invalidated()), (WcOpcode::Recv, Some(mw.rkey)));
    // the rkey is gone
    let c = one(
        &mut s,
        SendOp::RdmaWrite {
            remote_addr: base + 4096,
            rkey: mw.rkey,
        },
        16,
    );
    assert_eq!(c.status, WcStatus::RemAccessErr);
}
