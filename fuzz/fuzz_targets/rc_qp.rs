//! Drives one connected RC QP (`RcQp::handle_packet` and everything around it: posted work
//! requests, timers, the move to Err) with a sequence of commands, the received packets going
//! through `rdma-wire`'s parser as the device's do.
//!
//! Checked after every command and at the end:
//! - every packet the QP gives to transmit emits through `rdma-wire`, parses back to the same
//!   header and payload, goes to the connected peer QP and fits the path MTU;
//! - `poll_transmit` runs dry (bounded), a completion names a work request that was posted and
//!   not completed yet, on this QP, and a receive completion's `byte_len` fits its buffers;
//! - memory outside the one region remote peers may write (the region with remote read only,
//!   the local-only region and the bytes around them) is byte-for-byte unchanged;
//! - at the end the QP is moved to Err: every receive and every signaled send has completed
//!   exactly once (none lost), unsignaled sends at most once.
//!
//! Input: a 16-byte header, then commands (see `Cmd`). Header: our QPN (3 bytes, big endian),
//! the peer's QPN (3), the expected request PSN (3), the first send PSN (3), then byte 12:
//! path MTU (bits 0-2, mod 5: 256 .. 4096), bit 3 all sends signaled, bit 4 WRITEs of 4 KiB
//! or more pulled (`RcQp::set_pull_min`: one packet for the whole message); byte 13: local ACK
//! timeout exponent (bits 0-4), min RNR timer code (bits 5-7); byte 14: retry count (bits 0-2),
//! RNR retry count (bits 3-5); byte 15: READ/atomic depth (mod 17). `fuzz/seeds/rc_qp/` holds
//! seeds made from `../shared/captures` by `fuzz/make_corpus.py`.
#![no_main]

use std::collections::HashMap;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rdma_proto::memory::InMemoryTable;
use rdma_proto::packet::{Placement, TxPlacement};
use rdma_proto::rc::{RcConfig, RcQp};
use rdma_proto::sim::{connect, ConnParams};
use rdma_proto::verbs::{
    AccessFlags, Completion, Mtu, PdId, QpAttr, QpAttrMask, QpState, RecvWr, SendFlags, SendOp,
    SendWr, Sge, WcOpcode, WcStatus,
};
use rdma_proto::wire;
use rdma_wire::packet::{IcrcCheck, PacketRepr};

/// The simulated address space.
const BASE: u64 = 0x1000_0000;
const MEM: u64 = 256 << 10;
/// Region A: every right; the only memory a peer may change (registered first: key 0x19d).
const A_ADDR: u64 = BASE + (64 << 10);
const A_LEN: u64 = 64 << 10;
/// Region B: local only (LOCAL_WRITE, no remote right; key 0x23a); never a receive or
/// READ/atomic destination here, so nothing may change it.
const B_ADDR: u64 = A_ADDR + A_LEN + 4096;
const B_LEN: u64 = 16 << 10;
/// Region C: remote READ only (key 0x3d7); nothing may change it.
const C_ADDR: u64 = B_ADDR + B_LEN + 4096;
const C_LEN: u64 = 16 << 10;
/// Most bytes `poll_transmit` may give in one drain before it counts as never running dry.
const MAX_TX: usize = 1 << 17;

/// What the address space holds before the run.
fn pattern() -> &'static [u8] {
    static P: OnceLock<Vec<u8>> = OnceLock::new();
    P.get_or_init(|| (0..MEM).map(|i| (i * 7 + (i >> 8)) as u8).collect())
}

/// Commands, one byte each followed by their operands (big endian):
/// - `0 len:u16 bytes[len]`: a received packet (BTH .. ICRC; the ICRC is not checked);
/// - `1 kind flags len:u16 off:u16 va:u64 rkey:u32 imm:u32`: post a send WR (`kind` mod 8:
///   SEND, SEND imm, SEND inv, WRITE, WRITE imm, READ, CMP_SWP, FETCH_ADD; `flags`: bit 0
///   signaled, 1 solicited, 2 fence, 3 inline, 4 gather from region B, 5 wrong lkey, 6 two
///   SGEs); local data at `off` in region A;
/// - `2 len:u16 off:u16 flags`: post a receive at `off` in region A (flags: bit 0 two SGEs, bit 1
///   wrong lkey);
/// - `3 us:u32`: time passes, timers run;
/// - `4`: time jumps to the next timer, which runs;
/// - `5`: the QP moves to Err;
/// - `6 kind len:u16 bytes[len]`: a received packet whose data is placed (`kind` mod 2: in
///   the packet, or pulled from the pieces its payload names), as a same-host peer sends
///   them (`RcQp::handle_placed`; the table pulls from its own address space);
/// - anything else: nothing.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (h, t) = self.0.split_first_chunk::<N>()?;
        self.0 = t;
        Some(*h)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_be_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_be_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_be_bytes)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Posted {
    /// A send WR: signaled or not.
    Send { signaled: bool, op: WcOpcode },
    /// A receive WR of this many bytes.
    Recv { len: u64 },
}

struct Qp {
    qp: RcQp,
    mem: InMemoryTable,
    keys: [u32; 3],
    peer: u32,
    mtu: u32,
    sig_all: bool,
    now: u64,
    buf: Vec<u8>,
    out: Vec<u8>,
    next_wr: u64,
    /// Outstanding work requests by id.
    posted: HashMap<u64, Posted>,
}

impl Qp {
    fn new(h: [u8; 16]) -> Self {
        let be24 = |i: usize| u32::from_be_bytes([0, h[i], h[i + 1], h[i + 2]]);
        let mut qpn = be24(0);
        if qpn < 2 || qpn == 0xFF_FFFF {
            qpn = 0x11;
        }
        let peer = be24(3);
        let mtu = [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ][usize::from(h[12] & 7) % 5];
        let p = ConnParams {
            mtu,
            timeout: h[13] & 0x1f,
            min_rnr_timer: h[13] >> 5,
            retry_cnt: h[14] & 7,
            rnr_retry: (h[14] >> 3) & 7,
            rd_atomic: h[15] % 17,
            access: AccessFlags::all(),
            max_send_wr: 64,
            max_outstanding_psns: 0,
        };
        let pd = PdId(1);
        let mut mem = InMemoryTable::new(BASE, MEM as usize);
        mem.bytes_mut(BASE, MEM).unwrap().copy_from_slice(pattern());
        let reg =
            |mem: &mut InMemoryTable, addr, len, acc| mem.register(pd, addr, len, acc).unwrap();
        let a = reg(&mut mem, A_ADDR, A_LEN, AccessFlags::all());
        let b = reg(&mut mem, B_ADDR, B_LEN, AccessFlags::LOCAL_WRITE);
        let c = reg(&mut mem, C_ADDR, C_LEN, AccessFlags::REMOTE_READ);
        assert_eq!(a.rkey, 0x19d, "the corpus addresses region A by this key");
        let mut cfg = RcConfig::new(qpn, pd);
        cfg.max_send_wr = 64;
        cfg.max_recv_wr = 64;
        cfg.sq_sig_all = h[12] & 8 != 0;
        let mut qp = RcQp::new(cfg);
        connect(&mut qp, peer, be24(9), be24(6), &p);
        assert_eq!(qp.state(), QpState::Rts);
        if h[12] & 16 != 0 {
            qp.set_pull_min(Some(4096));
        }
        Qp {
            qp,
            mem,
            keys: [a.lkey, b.lkey, c.lkey],
            peer,
            mtu: mtu.bytes(),
            sig_all: cfg.sq_sig_all,
            now: 0,
            buf: vec![0; 4096],
            out: vec![0; 4096 + 128],
            next_wr: 1,
            posted: HashMap::new(),
        }
    }

    /// An SGE of `len` bytes at `off` (wrapped) in region A (or B); a wrong key if `bad`.
    fn sge(&self, region: usize, off: u16, len: u16, bad: bool) -> Sge {
        let (addr, size) = if region == 1 {
            (B_ADDR, B_LEN)
        } else {
            (A_ADDR, A_LEN)
        };
        let len = u64::from(len).min(size);
        let off = u64::from(off) % (size - len + 1);
        Sge {
            addr: addr + off,
            length: len as u32,
            lkey: if bad { 0xdead_0001 } else { self.keys[region] },
        }
    }

    fn post_send(&mut self, inp: &mut Input) -> Option<()> {
        let kind = inp.u8()?;
        let flags = inp.u8()?;
        let len = inp.u16()?;
        let off = inp.u16()?;
        let va = inp.u64()?;
        let rkey = inp.u32()?;
        let imm = inp.u32()?;
        let op = match kind % 8 {
            0 => SendOp::Send,
            1 => SendOp::SendWithImm { imm },
            2 => SendOp::SendWithInv {
                invalidate_rkey: imm,
            },
            3 => SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            4 => SendOp::RdmaWriteWithImm {
                remote_addr: va,
                rkey,
                imm,
            },
            5 => SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            6 => SendOp::AtomicCmpAndSwp {
                remote_addr: va,
                rkey,
                compare: u64::from(imm),
                swap: va ^ u64::from(rkey),
            },
            _ => SendOp::AtomicFetchAndAdd {
                remote_addr: va,
                rkey,
                add: u64::from(imm),
            },
        };
        let mut f = SendFlags::empty();
        f.set(SendFlags::SIGNALED, flags & 1 != 0);
        f.set(SendFlags::SOLICITED, flags & 2 != 0);
        f.set(SendFlags::FENCE, flags & 4 != 0);
        f.set(SendFlags::INLINE, flags & 8 != 0);
        // results are scattered into region A only
        let region = if flags & 0x10 != 0 && !op.is_read_or_atomic() {
            1
        } else {
            0
        };
        let len = if op.is_atomic() { 8 } else { len };
        let bad = flags & 0x20 != 0;
        let id = self.next_wr;
        self.next_wr += 1;
        let mut wr = SendWr::new(id, op).with_flags(f);
        if flags & 0x40 != 0 && len >= 2 {
            let half = len / 2;
            wr = wr
                .with_sge(self.sge(region, off, half, bad))
                .with_sge(self.sge(region, off.wrapping_add(half), len - half, false));
        } else {
            wr = wr.with_sge(self.sge(region, off, len, bad));
        }
        let signaled = self.sig_all || f.contains(SendFlags::SIGNALED);
        if self.qp.post_send(&self.mem, &wr).is_ok() {
            let p = Posted::Send {
                signaled,
                op: op.wc_opcode(),
            };
            self.posted.insert(id, p);
        }
        Some(())
    }

    fn post_recv(&mut self, inp: &mut Input) -> Option<()> {
        let len = inp.u16()?;
        let off = inp.u16()?;
        let flags = inp.u8()?;
        let id = (1 << 32) | self.next_wr;
        self.next_wr += 1;
        let bad = flags & 2 != 0;
        let mut wr = RecvWr::new(id);
        if flags & 1 != 0 && len >= 2 {
            wr = wr
                .with_sge(self.sge(0, off, len / 2, bad))
                .with_sge(self.sge(0, off.wrapping_add(len / 2), len - len / 2, false));
        } else {
            wr = wr.with_sge(self.sge(0, off, len, bad));
        }
        let total = wr.sg.total_len();
        if self.qp.post_recv(&wr).is_ok() {
            self.posted.insert(id, Posted::Recv { len: total });
        }
        Some(())
    }

    fn check(&mut self, c: &Completion) {
        let Some(p) = self.posted.remove(&c.wr_id) else {
            panic!("completion of a WR not outstanding: {c:?}");
        };
        assert_eq!(c.qp_num, self.qp.qpn(), "{c:?}");
        match p {
            Posted::Send { signaled, op } => {
                assert!(
                    signaled || c.status != WcStatus::Success,
                    "unsignaled WR completed successfully: {c:?}"
                );
                if c.status == WcStatus::Success {
                    assert_eq!(c.opcode, op, "{c:?}");
                }
            }
            Posted::Recv { len } => {
                assert!(
                    matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm),
                    "{c:?}"
                );
                if c.status == WcStatus::Success && c.opcode == WcOpcode::Recv {
                    assert!(u64::from(c.byte_len) <= len, "{c:?} into {len} bytes");
                }
            }
        }
    }

    /// Sends everything the QP has to send; checks it and the completions.
    fn drain(&mut self) {
        let mut n = 0;
        while let Some(t) = self
            .qp
            .poll_transmit(self.now, &mut self.mem, &mut self.buf)
        {
            n += 1;
            assert!(n <= MAX_TX, "poll_transmit never runs dry");
            assert!(t.payload_len <= self.mtu as usize, "{t:?} beyond the MTU");
            assert_eq!(t.header.bth.dest_qp, self.peer, "{t:?}");
            let payload = &self.buf[..t.payload_len];
            let len = wire::emit(&t.header, payload, &mut self.out, None)
                .unwrap_or_else(|e| panic!("rdma-wire cannot emit {t:?}: {e:?}"));
            let back = wire::parse(&self.out[..len], IcrcCheck::Skip)
                .unwrap_or_else(|e| panic!("{t:?} does not parse back: {e:?}"));
            // the pad count is the emitter's (from the payload's length)
            let mut want = t.header;
            want.bth.pad_cnt = PacketRepr::pad_for(payload.len());
            assert_eq!(back.header, want);
            assert_eq!(back.payload, payload);
            // a pulled WRITE stands for at most its PSNs' path MTUs of data
            match Placement::decode(t.placement, payload) {
                Some(Placement::Inline) => {}
                Some(Placement::Pull { len, psns, .. }) => {
                    assert!(u64::from(len) <= u64::from(psns) * u64::from(self.mtu), "{t:?}");
                }
                None => panic!("{t:?}: no length prefix"),
            }
        }
        while let Some(c) = self.qp.poll_completion() {
            self.check(&c);
        }
    }

    fn run(&mut self, inp: &mut Input) -> Option<()> {
        match inp.u8()? {
            0 => {
                let len = inp.u16()?;
                let bytes = inp.0.get(..usize::from(len))?;
                inp.0 = &inp.0[usize::from(len)..];
                if let Ok(pkt) = wire::parse(bytes, IcrcCheck::Skip) {
                    self.qp.handle_packet(self.now, &mut self.mem, &pkt);
                }
            }
            6 => {
                let kind = [TxPlacement::Inline, TxPlacement::Pull][usize::from(inp.u8()? % 2)];
                let len = inp.u16()?;
                let bytes = inp.0.get(..usize::from(len))?;
                inp.0 = &inp.0[usize::from(len)..];
                if let Ok(mut pkt) = wire::parse(bytes, IcrcCheck::Skip) {
                    if let Some(placed) = Placement::decode(kind, pkt.payload) {
                        if placed != Placement::Inline {
                            pkt.payload = &[];
                        }
                        let port = 1;
                        self.qp
                            .handle_placed(self.now, &mut self.mem, &pkt, port, placed);
                    }
                }
            }
            1 => self.post_send(inp)?,
            2 => self.post_recv(inp)?,
            3 => {
                self.now += u64::from(inp.u32()?) * 1000;
                self.qp.handle_timeout(self.now);
            }
            4 => {
                if let Some(t) = self.qp.poll_timeout() {
                    self.now = self.now.max(t);
                    self.qp.handle_timeout(self.now);
                }
            }
            5 => self.enter_err(),
            _ => {}
        }
        Some(())
    }

    fn enter_err(&mut self) {
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        self.qp
            .modify(&attr, QpAttrMask::STATE)
            .expect("any state may move to Err");
    }

    fn finish(&mut self) {
        self.drain();
        self.enter_err();
        self.drain();
        let lost: Vec<_> = self
            .posted
            .iter()
            .filter(|(_, p)| {
                !matches!(
                    p,
                    Posted::Send {
                        signaled: false,
                        ..
                    }
                )
            })
            .collect();
        assert!(lost.is_empty(), "WRs never completed: {lost:?}");
        let now = self.mem.bytes(BASE, MEM).unwrap();
        let (a0, a1) = ((A_ADDR - BASE) as usize, (A_ADDR - BASE + A_LEN) as usize);
        let was = pattern();
        if now[..a0] != was[..a0] || now[a1..] != was[a1..] {
            let i = (0..now.len())
                .find(|&i| !(a0..a1).contains(&i) && now[i] != was[i])
                .unwrap();
            panic!("byte {:#x} outside region A changed", BASE + i as u64);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let Some(h) = inp.take::<16>() else {
        return;
    };
    let mut q = Qp::new(h);
    while !inp.0.is_empty() {
        if q.run(&mut inp).is_none() {
            break;
        }
        q.drain();
    }
    q.finish();
});
