//! Pulled RDMA WRITEs and SENDs ([`RcQp::set_pull_min`]): the responder copies the whole message from
//! the sender's memory at the first packet, after its own key, bounds and access checks; a
//! pull it cannot read is asked for again and arrives inline; a refused one touches nothing.

use rdma_proto::memory::{AtomicOp, InMemoryTable, MemError, MemKey, MemoryTable};
use rdma_proto::packet::{Packet, Placement, Transmit, TxPlacement};
use rdma_proto::rc::{RcConfig, RcQp};
use rdma_proto::sim::{connect, ConnParams};
use rdma_proto::verbs::{AccessFlags, Completion, PdId, SendOp, SendWr, Sge, WcStatus};

const A_BASE: u64 = 0x10_0000;
const B_BASE: u64 = 0x80_0000;
const SIZE: usize = 1 << 20;
const PD: PdId = PdId(1);

/// A memory table that makes same-host copies: the sender names its (simulated) addresses,
/// the responder reads them from a copy of the sender's memory.
struct Mem {
    t: InMemoryTable,
    /// The sender's memory, as the responder's pull reads it.
    peer: Option<(u64, Vec<u8>)>,
    /// Pulls to refuse with `Unavailable` (a source that cannot be read).
    fail: u32,
    pulls: u32,
}

impl Mem {
    fn new(base: u64) -> Mem {
        Mem {
            t: InMemoryTable::new(base, SIZE),
            peer: None,
            fail: 0,
            pulls: 0,
        }
    }
}

impl MemoryTable for Mem {
    fn check(&self, pd: PdId, k: MemKey, a: u64, l: u64, n: AccessFlags) -> Result<(), MemError> {
        self.t.check(pd, k, a, l, n)
    }
    fn read(&self, pd: PdId, k: MemKey, a: u64, d: &mut [u8]) -> Result<(), MemError> {
        self.t.read(pd, k, a, d)
    }
    fn write(&mut self, pd: PdId, k: MemKey, a: u64, s: &[u8]) -> Result<(), MemError> {
        self.t.write(pd, k, a, s)
    }
    fn atomic_remote(&mut self, pd: PdId, k: u32, a: u64, op: AtomicOp) -> Result<u64, MemError> {
        self.t.atomic_remote(pd, k, a, op)
    }
    fn invalidate_remote(&mut self, pd: PdId, k: u32) -> Result<(), MemError> {
        self.t.invalidate_remote(pd, k)
    }
    fn read_inline(&self, pd: PdId, a: u64, d: &mut [u8]) -> Result<(), MemError> {
        self.t.read_inline(pd, a, d)
    }
    fn locate(
        &self,
        pd: PdId,
        k: MemKey,
        a: u64,
        l: u64,
        out: &mut [u8],
    ) -> Result<usize, MemError> {
        self.t.locate(pd, k, a, l, out)
    }
    fn pull_local(
        &mut self,
        pd: PdId,
        lkey: u32,
        addr: u64,
        len: u64,
        source: &[u8],
        skip: u64,
    ) -> Result<(), MemError> {
        self.t
            .check(pd, MemKey::Local(lkey), addr, len, AccessFlags::LOCAL_WRITE)?;
        let all = self.peer_bytes(source)?;
        let chunk = &all[skip as usize..(skip + len) as usize];
        self.t.bytes_mut(addr, len).unwrap().copy_from_slice(chunk);
        Ok(())
    }
    fn pull_remote(
        &mut self,
        pd: PdId,
        rkey: u32,
        va: u64,
        len: u64,
        source: &[u8],
    ) -> Result<(), MemError> {
        self.t
            .check(pd, MemKey::Remote(rkey), va, len, AccessFlags::REMOTE_WRITE)?;
        let all = self.peer_bytes(source)?;
        assert_eq!(all.len() as u64, len, "the pairs cover the message");
        self.t.write(pd, MemKey::Remote(rkey), va, &all)
    }
}

impl Mem {
    /// The peer's bytes `source`'s `(address, length)` pairs name, end to end; counts the
    /// pull, and fails it while `fail` says so.
    fn peer_bytes(&mut self, source: &[u8]) -> Result<Vec<u8>, MemError> {
        self.pulls += 1;
        if self.fail > 0 {
            self.fail -= 1;
            return Err(MemError::Unavailable);
        }
        let (base, bytes) = self.peer.as_ref().expect("the peer's memory");
        let mut all = Vec::new();
        for pair in source.chunks_exact(16) {
            let at = u64::from_le_bytes(pair[..8].try_into().unwrap());
            let n = u64::from_le_bytes(pair[8..].try_into().unwrap());
            let at = (at - base) as usize;
            all.extend_from_slice(&bytes[at..at + n as usize]);
        }
        Ok(all)
    }
}

struct Side {
    qp: RcQp,
    mem: Mem,
    key: u32,
}

/// A (sender, pulls WRITEs of 4 KiB and more) and B (responder; its region has `b_access`).
fn pair(b_access: AccessFlags) -> (Side, Side) {
    let p = ConnParams::default();
    let mut a = Side {
        qp: RcQp::new(RcConfig::new(0x11, PD)),
        mem: Mem::new(A_BASE),
        key: 0,
    };
    let mut b = Side {
        qp: RcQp::new(RcConfig::new(0x22, PD)),
        mem: Mem::new(B_BASE),
        key: 0,
    };
    a.key = a
        .mem
        .t
        .register(PD, A_BASE, SIZE as u64, AccessFlags::all())
        .unwrap()
        .lkey;
    b.key = b
        .mem
        .t
        .register(PD, B_BASE, SIZE as u64 / 2, b_access)
        .unwrap()
        .rkey;
    connect(&mut a.qp, 0x22, 100, 500, &p);
    connect(&mut b.qp, 0x11, 500, 100, &p);
    a.qp.set_pull_min(Some(4096));
    let pattern: Vec<u8> = (0..SIZE).map(|i| (i * 7 + i / 251) as u8).collect();
    a.mem
        .t
        .bytes_mut(A_BASE, SIZE as u64)
        .unwrap()
        .copy_from_slice(&pattern);
    b.mem.peer = Some((A_BASE, pattern));
    (a, b)
}

/// Moves every packet both ways (each as its placement says) and fires timers until A has
/// a completion; returns it and the placements A sent.
/// Hands `to` the packet `t` whose payload is at the start of `buf`, as its placement says.
fn deliver(to: &mut Side, now: u64, t: &Transmit, buf: &[u8]) {
    let payload = &buf[..t.payload_len];
    let placement = Placement::decode(t.placement, payload).expect("length prefix");
    let data = if placement == Placement::Inline {
        payload
    } else {
        &[][..]
    };
    let pkt = Packet {
        header: t.header,
        payload: data,
    };
    to.qp.handle_placed(now, &mut to.mem, &pkt, 1, placement);
}

fn run(a: &mut Side, b: &mut Side) -> (Completion, Vec<TxPlacement>) {
    let mut buf = vec![0u8; 8192];
    let mut sent = Vec::new();
    let mut now = 0u64;
    for _ in 0..100_000 {
        if let Some(c) = a.qp.poll_send_completion() {
            return (c, sent);
        }
        let mut moved = false;
        while let Some(t) = a.qp.poll_transmit(now, &mut a.mem, &mut buf) {
            sent.push(t.placement);
            deliver(b, now, &t, &buf);
            moved = true;
        }
        while let Some(t) = b.qp.poll_transmit(now, &mut b.mem, &mut buf) {
            deliver(a, now, &t, &buf);
            moved = true;
        }
        if !moved {
            now = a.qp.poll_timeout().unwrap_or(now + 1_000_000).max(now + 1);
            a.qp.handle_timeout(now);
            b.qp.handle_timeout(now);
        }
    }
    panic!("no completion");
}

fn write(a: &mut Side, b: &Side, src_off: u64, dst_off: u64, len: u32) {
    let wr = SendWr::new(
        7,
        SendOp::RdmaWrite {
            remote_addr: B_BASE + dst_off,
            rkey: b.key,
        },
    )
    .with_sge(Sge {
        addr: A_BASE + src_off,
        length: len,
        lkey: a.key,
    })
    .signaled();
    a.qp.post_send(&a.mem, &wr).unwrap();
}

fn b_bytes(b: &Side, off: u64, len: usize) -> Vec<u8> {
    b.mem.t.bytes(B_BASE + off, len as u64).unwrap().to_vec()
}

fn a_bytes(b: &Side, off: u64, len: usize) -> Vec<u8> {
    let (_, p) = b.mem.peer.as_ref().unwrap();
    p[off as usize..off as usize + len].to_vec()
}

#[test]
fn a_long_write_is_pulled_once_and_lands_whole() {
    let (mut a, mut b) = pair(AccessFlags::all());
    let len = 64 << 10;
    write(&mut a, &b, 333, 1000, len);
    let (c, sent) = run(&mut a, &mut b);
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(
        b_bytes(&b, 1000, len as usize),
        a_bytes(&b, 333, len as usize)
    );
    assert_eq!(
        b_bytes(&b, 0, 1000),
        vec![0; 1000],
        "nothing before the target"
    );
    assert_eq!(
        b_bytes(&b, 1000 + len as u64, 64),
        vec![0; 64],
        "nothing after it"
    );
    assert_eq!(b.mem.pulls, 1);
    assert_eq!(
        sent,
        [TxPlacement::Pull],
        "one packet for the 64 packets' PSNs"
    );
    assert_eq!((a.qp.stats().pulls_sent, b.qp.stats().pulls_done), (1, 1));
    // the next WRITE's PSNs follow the whole range: it lands too
    write(&mut a, &b, 0, 200_000, 3000);
    let (c, sent) = run(&mut a, &mut b);
    assert_eq!((c.status, sent.len()), (WcStatus::Success, 3));
    assert_eq!(b_bytes(&b, 200_000, 3000), a_bytes(&b, 0, 3000));
    assert_eq!(b.qp.stats().naks_sent, 0);
}

#[test]
fn a_short_write_carries_its_data() {
    let (mut a, mut b) = pair(AccessFlags::all());
    write(&mut a, &b, 0, 0, 4000);
    let (c, sent) = run(&mut a, &mut b);
    assert_eq!(c.status, WcStatus::Success);
    assert!(sent.iter().all(|p| *p == TxPlacement::Inline));
    assert_eq!(b_bytes(&b, 0, 4000), a_bytes(&b, 0, 4000));
    assert_eq!(b.mem.pulls, 0);
}

#[test]
fn an_unreadable_pull_is_asked_again_and_comes_inline() {
    let (mut a, mut b) = pair(AccessFlags::all());
    b.mem.fail = 1;
    let len = 20_000;
    write(&mut a, &b, 5, 7, len);
    let (c, sent) = run(&mut a, &mut b);
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(b_bytes(&b, 7, len as usize), a_bytes(&b, 5, len as usize));
    assert_eq!(b.qp.stats().pull_failures, 1);
    assert!(a.qp.stats().retransmitted > 0);
    // after the NAK every packet of the WRITE went again with its data
    let resent = sent
        .iter()
        .rposition(|p| *p != TxPlacement::Inline)
        .unwrap();
    assert!(sent[resent + 1..].len() >= (len as usize).div_ceil(1024));
}

#[test]
fn a_refused_pull_touches_nothing_on_either_side() {
    // B's region lacks remote write
    let (mut a, mut b) = pair(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
    write(&mut a, &b, 0, 0, 32 << 10);
    let (c, _) = run(&mut a, &mut b);
    assert_eq!(c.status, WcStatus::RemAccessErr);
    assert_eq!(b.mem.pulls, 0, "refused before any copy");
    assert_eq!(b_bytes(&b, 0, SIZE / 2), vec![0; SIZE / 2]);
    let (_, pattern) = b.mem.peer.as_ref().unwrap();
    assert_eq!(a.mem.t.bytes(A_BASE, SIZE as u64).unwrap(), &pattern[..]);

    // past the end of B's region: refused, nothing written
    let (mut a, mut b) = pair(AccessFlags::all());
    write(&mut a, &b, 0, (SIZE / 2) as u64 - 8192, 16 << 10);
    let (c, _) = run(&mut a, &mut b);
    assert_eq!(c.status, WcStatus::RemAccessErr);
    assert_eq!(b.mem.pulls, 0);
    assert_eq!(b_bytes(&b, 0, SIZE), vec![0; SIZE]);
}

/// A pull that claims PSNs its length does not take, or sits on a packet that is not a
/// whole WRITE, is invalid: the responder NAKs, copies nothing, and the QP fails.
#[test]
fn a_pull_with_the_wrong_psns_or_opcode_is_invalid() {
    for case in 0..3 {
        let (mut a, mut b) = pair(AccessFlags::all());
        a.qp.set_pull_min(if case == 2 { None } else { Some(4096) });
        write(&mut a, &b, 0, 0, 8192);
        let mut buf = vec![0u8; 4096];
        let t = a.qp.poll_transmit(0, &mut a.mem, &mut buf).unwrap();
        let payload = buf[..t.payload_len].to_vec();
        let placement = match case {
            // 8 KiB at a 1 KiB MTU takes 8 PSNs, not 7 or 9
            0 => Placement::Pull {
                len: 8192,
                psns: 7,
                source: &payload[8..],
            },
            1 => Placement::Pull {
                len: 8192,
                psns: 9,
                source: &payload[8..],
            },
            // the first packet of an inline WRITE (opcode First) claimed as a pull
            _ => Placement::Pull {
                len: 8192,
                psns: 8,
                source: &[],
            },
        };
        let pkt = Packet {
            header: t.header,
            payload: &[],
        };
        b.qp.handle_placed(0, &mut b.mem, &pkt, 1, placement);
        assert_eq!(b.mem.pulls, 0, "case {case}");
        assert_eq!(b_bytes(&b, 0, 8192), vec![0; 8192], "case {case}");
        assert_eq!(b.qp.state(), rdma_proto::verbs::QpState::Err, "case {case}");
    }
}

/// A long READ from a peer process on this host is answered with one response that names
/// where the data is; the requester copies it into its scatter list; a source it cannot
/// read makes it ask again, and the answer to that carries the data.
#[test]
fn a_long_read_is_answered_with_where_its_data_is() {
    for fail in [0, 1] {
        let (mut a, mut b) = pair(AccessFlags::all());
        b.qp.set_pull_min(Some(4096));
        let pat: Vec<u8> = (0..SIZE / 2).map(|i| (i * 13 + 5) as u8).collect();
        b.mem
            .t
            .bytes_mut(B_BASE, SIZE as u64 / 2)
            .unwrap()
            .copy_from_slice(&pat);
        a.mem.peer = Some((B_BASE, pat.clone()));
        a.mem.fail = fail;
        let before = a.mem.t.bytes(A_BASE, SIZE as u64).unwrap().to_vec();
        let len = 64 << 10;
        let wr = SendWr::new(
            9,
            SendOp::RdmaRead {
                remote_addr: B_BASE + 100,
                rkey: b.key,
            },
        )
        .with_sge(Sge {
            addr: A_BASE + 50,
            length: 1000,
            lkey: a.key,
        })
        .with_sge(Sge {
            addr: A_BASE + 4096,
            length: len - 1000,
            lkey: a.key,
        })
        .signaled();
        a.qp.post_send(&a.mem, &wr).unwrap();
        let (c, _) = run(&mut a, &mut b);
        assert_eq!(c.status, WcStatus::Success, "fail {fail}");
        let got = a.mem.t.bytes(A_BASE, SIZE as u64).unwrap();
        assert_eq!(&got[50..1050], &pat[100..1100]);
        let rest = (len - 1000) as usize;
        assert_eq!(&got[4096..4096 + rest], &pat[1100..1100 + rest]);
        // nothing else changed
        assert_eq!(&got[..50], &before[..50]);
        assert_eq!(&got[1050..4096], &before[1050..4096]);
        assert_eq!(&got[4096 + rest..], &before[4096 + rest..]);
        let (sa, sb) = (a.qp.stats(), b.qp.stats());
        let fail = u64::from(fail);
        assert_eq!(
            (sb.pulls_sent, sa.pulls_done, sa.pull_failures),
            (1, 1 - fail, fail)
        );
    }
}

/// B's receive buffer: a region of its own after the WRITE target (local write only).
const RECV_OFF: u64 = SIZE as u64 / 2;

/// Registers B's receive region and returns its lkey.
fn recv_region(b: &mut Side) -> u32 {
    b.mem
        .t
        .register(
            PD,
            B_BASE + RECV_OFF,
            SIZE as u64 / 2,
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap()
        .lkey
}

/// Posts a receive on B of two pieces: `first` bytes at 100 and `second` at 50,000 of its
/// receive region.
fn post_recv(b: &mut Side, lkey: u32, first: u32, second: u32) {
    let wr = rdma_proto::verbs::RecvWr::new(3)
        .with_sge(Sge {
            addr: B_BASE + RECV_OFF + 100,
            length: first,
            lkey,
        })
        .with_sge(Sge {
            addr: B_BASE + RECV_OFF + 50_000,
            length: second,
            lkey,
        });
    b.qp.post_recv(&wr).unwrap();
}

fn send(a: &mut Side, src_off: u64, len: u32, imm: Option<u32>) {
    let op = match imm {
        Some(imm) => SendOp::SendWithImm { imm },
        None => SendOp::Send,
    };
    let wr = SendWr::new(8, op)
        .with_sge(Sge {
            addr: A_BASE + src_off,
            length: len,
            lkey: a.key,
        })
        .signaled();
    a.qp.post_send(&a.mem, &wr).unwrap();
}

/// A long SEND is one pulled packet; B scatters it into its receive's two pieces and
/// completes it with its length and immediate; nothing around the pieces changes.
#[test]
fn a_long_send_is_pulled_into_the_receive() {
    for imm in [None, Some(0xfeed)] {
        let (mut a, mut b) = pair(AccessFlags::all());
        let lkey = recv_region(&mut b);
        post_recv(&mut b, lkey, 5000, 100_000);
        let len = 40_000u32;
        send(&mut a, 777, len, imm);
        let (c, sent) = run(&mut a, &mut b);
        assert_eq!(c.status, WcStatus::Success);
        assert_eq!(sent, [TxPlacement::Pull], "one packet for 40 PSNs");
        let r = b.qp.poll_recv_completion().expect("a receive completion");
        assert_eq!((r.status, r.byte_len, r.wr_id), (WcStatus::Success, len, 3));
        assert_eq!(r.imm(), imm);
        let want = a_bytes(&b, 777, len as usize);
        assert_eq!(b_bytes(&b, RECV_OFF + 100, 5000), want[..5000]);
        let rest = len as usize - 5000;
        assert_eq!(b_bytes(&b, RECV_OFF + 50_000, rest), want[5000..]);
        assert_eq!(b_bytes(&b, RECV_OFF, 100), vec![0; 100]);
        assert_eq!(b_bytes(&b, RECV_OFF + 5100, 44_900), vec![0; 44_900]);
        assert_eq!(
            b_bytes(&b, RECV_OFF + 50_000 + rest as u64, 64),
            vec![0; 64]
        );
        assert_eq!((a.qp.stats().pulls_sent, b.qp.stats().pulls_done), (1, 1));
        // the next SEND's PSNs follow the whole range: it lands too, inline
        post_recv(&mut b, lkey, 5000, 0);
        send(&mut a, 0, 3000, None);
        let (c, sent) = run(&mut a, &mut b);
        assert_eq!((c.status, sent.len()), (WcStatus::Success, 3));
        assert_eq!(b_bytes(&b, RECV_OFF + 100, 3000), a_bytes(&b, 0, 3000));
        assert_eq!(b.qp.stats().naks_sent, 0);
    }
}

/// A pulled SEND longer than the receive fails as an inline one does: local length error
/// on B, remote invalid request on A, nothing copied.
#[test]
fn a_pulled_send_longer_than_the_receive_fails_as_an_inline_one() {
    for pull in [Some(4096), None] {
        let (mut a, mut b) = pair(AccessFlags::all());
        a.qp.set_pull_min(pull);
        let lkey = recv_region(&mut b);
        post_recv(&mut b, lkey, 1000, 7000);
        send(&mut a, 0, 8001, None);
        let (c, _) = run(&mut a, &mut b);
        assert_eq!(c.status, WcStatus::RemInvReqErr, "{pull:?}");
        let r = b.qp.poll_recv_completion().expect("the receive fails");
        assert_eq!(r.status, WcStatus::LocLenErr, "{pull:?}");
        if pull.is_some() {
            assert_eq!(b.mem.pulls, 0, "refused before any copy");
            assert_eq!(b_bytes(&b, 0, SIZE), vec![0; SIZE]);
        }
    }
}

/// No receive posted: RNR NAK; posted later, the SEND is pulled again and lands.
#[test]
fn a_pulled_send_without_a_receive_waits_and_is_pulled_again() {
    let (mut a, mut b) = pair(AccessFlags::all());
    let lkey = recv_region(&mut b);
    send(&mut a, 10, 16_384, None);
    let mut buf = vec![0u8; 8192];
    let t = a.qp.poll_transmit(0, &mut a.mem, &mut buf).unwrap();
    assert_eq!(t.placement, TxPlacement::Pull);
    deliver(&mut b, 0, &t, &buf);
    let t =
        b.qp.poll_transmit(0, &mut b.mem, &mut buf)
            .expect("RNR NAK");
    deliver(&mut a, 0, &t, &buf);
    assert_eq!(a.qp.stats().rnr_naks_received, 1);
    assert_eq!(b.mem.pulls, 0);
    post_recv(&mut b, lkey, 16_384, 0);
    let (c, sent) = run(&mut a, &mut b);
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(sent, [TxPlacement::Pull], "pulled again, not inline");
    let r = b.qp.poll_recv_completion().unwrap();
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, 16_384));
    assert_eq!(b_bytes(&b, RECV_OFF + 100, 16_384), a_bytes(&b, 10, 16_384));
    assert_eq!((a.qp.stats().pulls_sent, b.qp.stats().pulls_done), (2, 1));
}

/// A pulled SEND whose source B cannot read is asked for again and comes inline.
#[test]
fn an_unreadable_pulled_send_comes_inline() {
    let (mut a, mut b) = pair(AccessFlags::all());
    let lkey = recv_region(&mut b);
    post_recv(&mut b, lkey, 30_000, 0);
    b.mem.fail = 1;
    send(&mut a, 3, 20_000, Some(9));
    let (c, sent) = run(&mut a, &mut b);
    assert_eq!(c.status, WcStatus::Success);
    assert!(sent.len() > 20, "resent inline");
    let r = b.qp.poll_recv_completion().unwrap();
    assert_eq!(
        (r.status, r.byte_len, r.imm()),
        (WcStatus::Success, 20_000, Some(9))
    );
    assert_eq!(b_bytes(&b, RECV_OFF + 100, 20_000), a_bytes(&b, 3, 20_000));
    assert_eq!(b.qp.stats().pull_failures, 1);
    assert!(b.qp.poll_recv_completion().is_none(), "one receive used");
}

/// A pulled SEND that claims PSNs its length does not take, or a pull on a SEND packet that
/// is not a whole message, is invalid: NAK, nothing copied into the receive, QP in error.
#[test]
fn a_pulled_send_with_the_wrong_psns_or_opcode_is_invalid() {
    for case in 0..3 {
        let (mut a, mut b) = pair(AccessFlags::all());
        let lkey = recv_region(&mut b);
        post_recv(&mut b, lkey, 10_000, 10_000);
        a.qp.set_pull_min(if case == 2 { None } else { Some(4096) });
        send(&mut a, 0, 8192, None);
        let mut buf = vec![0u8; 4096];
        let t = a.qp.poll_transmit(0, &mut a.mem, &mut buf).unwrap();
        let payload = buf[..t.payload_len].to_vec();
        let source = if case == 2 { &[][..] } else { &payload[8..] };
        let psns = [7, 9, 8][case];
        let placement = Placement::Pull {
            len: 8192,
            psns,
            source,
        };
        let pkt = Packet {
            header: t.header,
            payload: &[],
        };
        b.qp.handle_placed(0, &mut b.mem, &pkt, 1, placement);
        assert_eq!(b.mem.pulls, 0, "case {case}");
        assert_eq!(
            b_bytes(&b, RECV_OFF, SIZE / 2),
            vec![0; SIZE / 2],
            "case {case}"
        );
        assert_eq!(b.qp.state(), rdma_proto::verbs::QpState::Err, "case {case}");
    }
}
