//! UD delivery: one UD QP (`UdQp::handle_packet`) fed datagrams as they come out of the
//! parser (raw bytes, or UD SENDs built from the input with its Q_Keys, destinations,
//! sources and lengths), between posted receives (some into a region without local write,
//! some with a bad key or too short) and a move to Err.
//!
//! Checked after every command:
//! - receive completions come in posting order and name a posted receive not completed yet;
//! - a successful one is for a packet to this QP (or to the multicast QPN) with this QP's
//!   Q_Key, a UD opcode and a payload within the MTU; its `byte_len` is the GRH's 40 bytes
//!   plus the payload, its `src_qp` the DETH's, and its buffer holds the payload after the GRH;
//! - memory changes only inside the buffer of a receive that completed (not at all when none
//!   did), and never in the region without local write;
//! - at the end, after the move to Err, every posted receive has completed exactly once.
//!
//! Input: 4 bytes Q_Key, then commands: byte `op` (`op % 4`: 0 post a receive, 1 a raw
//! datagram, 2 a built UD SEND, 3 move to Err), each followed by its own bytes (see below).
#![no_main]

use std::collections::VecDeque;

use libfuzzer_sys::fuzz_target;
use rdma_proto::memory::InMemoryTable;
use rdma_proto::packet::header;
use rdma_proto::ud::{GrhInfo, UdConfig, UdQp, GRH_LEN, MULTICAST_QPN};
use rdma_proto::verbs::{
    AccessFlags, PdId, QpAttr, QpAttrMask, QpState, RecvWr, Sge, WcOpcode, WcStatus,
};
use rdma_proto::wire;
use rdma_wire::deth::DethRepr;
use rdma_wire::opcode::{Opcode, Transport};
use rdma_wire::packet::IcrcCheck;

const BASE: u64 = 0x10_0000;
const MEM: u64 = 24 << 10;
/// Region A: local write (receives land here).
const A_ADDR: u64 = BASE + 4096;
const A_LEN: u64 = 8 << 10;
/// Region B: no local write; nothing may change it.
const B_ADDR: u64 = A_ADDR + A_LEN + 4096;
const B_LEN: u64 = 4 << 10;
const QPN: u32 = 0x12;
const PD: PdId = PdId(1);

struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = b;
        Some(a)
    }
    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

/// A posted receive: its id and its one buffer.
struct Posted {
    wr_id: u64,
    addr: u64,
    len: u64,
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let Some(q) = inp.take(4) else { return };
    let qkey = u32::from_be_bytes(q.try_into().unwrap());
    let mut mem = InMemoryTable::new(BASE, MEM as usize);
    let ka = mem
        .register(PD, A_ADDR, A_LEN, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let kb = mem
        .register(PD, B_ADDR, B_LEN, AccessFlags::empty())
        .unwrap();
    for (i, b) in mem.bytes_mut(BASE, MEM).unwrap().iter_mut().enumerate() {
        *b = (i * 13 + (i >> 9)) as u8;
    }
    let mut cfg = UdConfig::new(QPN, PD);
    cfg.max_recv_wr = 16;
    let mut qp = UdQp::new(cfg);
    let up = |qp: &mut UdQp, state, mask| {
        let attr = QpAttr {
            qp_state: state,
            qkey,
            ..Default::default()
        };
        qp.modify(&attr, QpAttrMask::STATE | mask).unwrap();
    };
    up(
        &mut qp,
        QpState::Init,
        QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    );
    up(&mut qp, QpState::Rtr, QpAttrMask::empty());
    up(&mut qp, QpState::Rts, QpAttrMask::SQ_PSN);
    let grh = GrhInfo::V4 {
        src: [192, 0, 2, 2],
        dst: [192, 0, 2, 3],
        tos: 0,
        ttl: 64,
    };
    let mut posted: VecDeque<Posted> = VecDeque::new();
    let mut next_id = 0u64;
    let mut buf = vec![0u8; 10_000];
    let mut in_err = false;
    while let Some(op) = inp.byte() {
        let before = mem.bytes(BASE, MEM).unwrap().to_vec();
        // the packet handed to the QP, if any: (payload, whether it may succeed, src_qp)
        let mut sent: Option<(Vec<u8>, bool, u32)> = None;
        match op % 4 {
            0 => {
                // kind (bits 0-1: region A, A, B, a bad key), length / 8, offset / 64
                let (Some(kind), Some(len8), Some(off)) = (inp.byte(), inp.byte(), inp.byte())
                else {
                    break;
                };
                let len = u64::from(len8) * 8;
                let (addr, lkey) = match kind & 3 {
                    2 => (B_ADDR + (u64::from(off) * 64) % B_LEN, kb.lkey),
                    3 => (A_ADDR, ka.lkey ^ 0x100),
                    _ => (A_ADDR + (u64::from(off) * 64) % A_LEN, ka.lkey),
                };
                let wr = RecvWr::new(next_id).with_sge(Sge {
                    addr,
                    length: len as u32,
                    lkey,
                });
                if qp.post_recv(&wr).is_ok() {
                    posted.push_back(Posted {
                        wr_id: next_id,
                        addr,
                        len,
                    });
                }
                next_id += 1;
            }
            1 => {
                let Some(n) = inp.u16() else { break };
                let Some(raw) = inp.take(usize::from(n) % 4096) else {
                    break;
                };
                if let Ok(pkt) = wire::parse(raw, IcrcCheck::Skip) {
                    let h = &pkt.header;
                    let may = h.bth.opcode.transport() == Transport::Ud
                        && h.deth.is_some_and(|d| d.q_key == qkey)
                        && (h.bth.dest_qp == QPN || h.bth.dest_qp == MULTICAST_QPN)
                        && pkt.payload.len() <= 1024;
                    let src = h.deth.map_or(0, |d| d.src_qp);
                    qp.handle_packet(0, &mut mem, &pkt, &grh);
                    sent = Some((pkt.payload.to_vec(), may, src));
                }
            }
            2 => {
                // flags (bit 0: a wrong Q_Key, 1: immediate, 2: multicast, 3: another QP),
                // source QP (3 bytes), payload length (2 bytes, mod 1200)
                let (Some(f), Some(s), Some(n)) = (inp.byte(), inp.take(3), inp.u16()) else {
                    break;
                };
                let src_qp = u32::from_be_bytes([0, s[0], s[1], s[2]]);
                let payload: Vec<u8> = (0..usize::from(n) % 1200).map(|i| i as u8 ^ f).collect();
                let opcode = if f & 2 != 0 {
                    Opcode::UdSendOnlyImm
                } else {
                    Opcode::UdSendOnly
                };
                let dest = match (f & 4 != 0, f & 8 != 0) {
                    (true, _) => MULTICAST_QPN,
                    (_, true) => QPN + 1,
                    _ => QPN,
                };
                let mut h = header(opcode, dest, u32::from(n));
                let qk = if f & 1 != 0 { qkey ^ 0x8000_0001 } else { qkey };
                h.deth = Some(DethRepr {
                    q_key: qk,
                    resv8: 0,
                    src_qp,
                });
                if f & 2 != 0 {
                    h.imm_dt = Some(0x1234_5678);
                }
                let Ok(len) = wire::emit(&h, &payload, &mut buf, None) else {
                    continue;
                };
                let pkt = wire::parse(&buf[..len], IcrcCheck::Skip).expect("what emit wrote");
                assert_eq!(pkt.payload, &payload[..]);
                let may = qk == qkey && dest != QPN + 1 && payload.len() <= 1024;
                qp.handle_packet(0, &mut mem, &pkt, &grh);
                sent = Some((payload, may, src_qp));
            }
            _ => {
                if !in_err {
                    up(&mut qp, QpState::Err, QpAttrMask::empty());
                    in_err = true;
                }
            }
        }
        // completions, in posting order
        let after = mem.bytes(BASE, MEM).unwrap().to_vec();
        let mut allowed: Vec<(u64, u64)> = Vec::new();
        while let Some(c) = qp.poll_recv_completion() {
            let p = posted
                .pop_front()
                .expect("a completion for a posted receive");
            assert_eq!(c.wr_id, p.wr_id, "receives complete in posting order");
            assert_eq!(c.opcode, WcOpcode::Recv);
            allowed.push((p.addr, p.len));
            if c.status == WcStatus::Success {
                let (payload, may, src) = sent.as_ref().expect("a success needs a packet");
                assert!(*may, "a packet that must be dropped was delivered");
                assert_eq!(c.byte_len as usize, GRH_LEN + payload.len());
                assert_eq!(c.src_qp, *src);
                // the bytes written (not the whole buffer) lie in the writable region
                let end = p.addr + u64::from(c.byte_len);
                assert!(p.addr >= A_ADDR && end <= A_ADDR + A_LEN && end <= p.addr + p.len);
                let at = (p.addr - BASE) as usize + GRH_LEN;
                assert_eq!(&after[at..at + payload.len()], &payload[..]);
            } else {
                assert!(
                    in_err || sent.is_some(),
                    "an error completion without a cause: {c:?}"
                );
            }
        }
        if before == after {
            continue;
        }
        for (i, (a, b)) in before.iter().zip(&after).enumerate() {
            if a != b {
                let addr = BASE + i as u64;
                assert!(
                    allowed.iter().any(|&(s, l)| addr >= s && addr < s + l),
                    "byte at {addr:#x} changed outside a completed receive's buffer"
                );
                assert!(
                    !(B_ADDR..B_ADDR + B_LEN).contains(&addr),
                    "region B changed"
                );
            }
        }
    }
    // the end: Err flushes every receive still posted, each once
    if !in_err {
        up(&mut qp, QpState::Err, QpAttrMask::empty());
    }
    while let Some(c) = qp.poll_recv_completion() {
        let p = posted
            .pop_front()
            .expect("a completion for a posted receive");
        assert_eq!((c.wr_id, c.status), (p.wr_id, WcStatus::WrFlushErr));
    }
    assert!(posted.is_empty(), "receives never completed");
});
