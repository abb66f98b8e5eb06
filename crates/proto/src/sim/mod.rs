//! A deterministic network simulator for testing transports: a seeded PRNG, a virtual clock
//! and a faulty datagram network (loss, duplication, reordering, delay, corruption).
//!
//! Packets really go through `rdma-wire`: each one is emitted with its ICRC over a simulated
//! IPv4/UDP encapsulation and parsed back at the receiver with the ICRC checked, so corrupted
//! bytes are caught the way a real receiver catches them.
//!
//! ```
//! use rdma_proto::sim::{Faults, RcPair};
//! use rdma_proto::verbs::{RecvWr, SendOp, SendWr, Sge};
//! let mut s = RcPair::new(1, Faults::lossy(0.1));
//! let (src, dst) = (s.a.buf_addr, s.b.buf_addr);
//! s.a.mem.bytes_mut(src, 5).unwrap().copy_from_slice(b"hello");
//! let rwr = RecvWr::new(1).with_sge(Sge { addr: dst, length: 64, lkey: s.b.lkey });
//! s.b.qp.post_recv(&rwr).unwrap();
//! let wr = SendWr::new(2, SendOp::Send).with_sge(Sge { addr: src, length: 5, lkey: s.a.lkey }).signaled();
//! s.a.qp.post_send(&s.a.mem, &wr).unwrap();
//! s.run_until_idle(10_000_000_000);
//! assert_eq!(s.b.qp.poll_recv_completion().unwrap().byte_len, 5);
//! assert_eq!(s.b.mem.bytes(dst, 5).unwrap(), b"hello");
//! ```

mod paths;
pub use paths::{load_alt_path, ALT_PORT};

use crate::memory::{InMemoryTable, MrKeys};
use crate::rc::{RcConfig, RcQp};
use crate::verbs::{AccessFlags, Mtu, PathAttr, PdId, QpAttr, QpAttrMask as M, QpState};
use crate::wire;
use rdma_wire::aeth::{AethSyndrome, NakCode};
use rdma_wire::icrc::{Encap, IpInfo, Ipv4Info};
use rdma_wire::opcode::Opcode;
use rdma_wire::packet::IcrcCheck;

/// A small, fast, seedable PRNG (SplitMix64). Deterministic across platforms.
///
/// ```
/// let mut r = rdma_proto::sim::Rng::new(42);
/// let a = r.next_u64();
/// assert_eq!(rdma_proto::sim::Rng::new(42).next_u64(), a);
/// assert!(r.below(10) < 10);
/// ```
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeds the generator.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`; 0 gives 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }
}

/// Fault mix of the simulated network. Probabilities are per datagram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Drop probability.
    pub loss: f64,
    /// Probability of delivering a second copy.
    pub dup: f64,
    /// Probability of an extra delay (reordering behind later packets).
    pub reorder: f64,
    /// Probability of flipping one random bit.
    pub corrupt: f64,
    /// Base one-way delay in ns.
    pub delay_ns: u64,
    /// Random extra delay in ns (uniform `0..jitter_ns`).
    pub jitter_ns: u64,
}

impl Faults {
    /// A perfect network with a 2 µs delay.
    pub fn clean() -> Self {
        Faults {
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            delay_ns: 2_000,
            jitter_ns: 0,
        }
    }
    /// Loss only.
    pub fn lossy(loss: f64) -> Self {
        Faults {
            loss,
            ..Self::clean()
        }
    }
    /// Everything at once.
    pub fn all(loss: f64) -> Self {
        Faults {
            loss,
            dup: 0.05,
            reorder: 0.1,
            corrupt: 0.02,
            delay_ns: 2_000,
            jitter_ns: 3_000,
        }
    }
}

/// One simulated host: a QP, its memory and a registered buffer.
#[derive(Debug)]
pub struct Node {
    /// The QP.
    pub qp: RcQp,
    /// The host's memory.
    pub mem: InMemoryTable,
    /// Start of the registered buffer.
    pub buf_addr: u64,
    /// Length of the registered buffer.
    pub buf_len: u64,
    /// Local key of the buffer.
    pub lkey: u32,
    /// Remote key of the buffer.
    pub rkey: u32,
    /// Protection domain.
    pub pd: PdId,
    /// Retry rounds of the requester since its oldest unacknowledged PSN last advanced, as
    /// the simulator observes them: retransmission timeouts with something outstanding, and
    /// PSN sequence NAKs for exactly that oldest PSN that brought no progress (the rounds
    /// the spec charges to `retry_cnt`; a NAK the transport ignores as a repeat of a go-back
    /// in progress is counted too, so this is an upper bound of what was charged).
    pub rounds_without_progress: u32,
    /// [`rounds_without_progress`](Self::rounds_without_progress) when the QP entered the
    /// error state (`None` while it has not). A requester may end in `RetryExcErr` only after
    /// `retry_cnt + 1` such rounds.
    pub rounds_at_error: Option<u32>,
    oldest: u32,
    timeouts: u64,
    encap: Encap,
    /// Encapsulation on port 2 (the alternate path's addresses).
    alt_encap: Encap,
}

impl Node {
    /// Updates the round counters after the QP handled a packet (`nak_for_oldest`: it was a
    /// PSN sequence NAK for the oldest unacknowledged PSN before) or a timeout.
    fn observe(&mut self, nak_for_oldest: bool) {
        let oldest = self.qp.oldest_unacked_psn();
        let timeouts = self.qp.stats().timeouts;
        if oldest != self.oldest {
            self.oldest = oldest;
            self.rounds_without_progress = 0;
        } else if nak_for_oldest {
            self.rounds_without_progress += 1;
        }
        self.rounds_without_progress += (timeouts - self.timeouts) as u32;
        self.timeouts = timeouts;
        if self.qp.state() == QpState::Err && self.rounds_at_error.is_none() {
            self.rounds_at_error = Some(self.rounds_without_progress);
        }
    }
}

#[derive(Debug)]
struct InFlight {
    at: u64,
    seq: u64,
    to_b: bool,
    /// The port it left from and arrives on (1: primary, 2: alternate in [`paths`]).
    port: u8,
    bytes: Vec<u8>,
    /// How the network corrupted it.
    corruption: Corruption,
}

/// Whether (and where) the network flipped a bit of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Corruption {
    None,
    /// A bit of BTH byte 4 (FECN, BECN, resv6a): the ICRC masks these bits (IBA 17.6.2.1.3
    /// / RoCEv2 annex), so no receiver can catch the flip, and the transport ignores them.
    Masked,
    /// Any other bit: covered by the ICRC, so the receiver must refuse the datagram.
    Covered,
}

/// Offset of the BTH byte the ICRC masks (FECN, BECN and the 6 reserved bits).
const BTH_MASKED_BYTE: usize = 4;

/// Simulation counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Datagrams sent by the endpoints.
    pub sent: u64,
    /// Dropped by the network.
    pub lost: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Corrupted in flight.
    pub corrupted: u64,
    /// Of [`corrupted`](Self::corrupted), flips in the BTH bits the ICRC masks (FECN, BECN,
    /// resv6a), which no receiver can detect: delivered as valid packets.
    pub corrupted_masked: u64,
    /// Corrupted datagrams (outside the masked bits) that the receiver's parser accepted:
    /// always 0 unless the ICRC check is broken.
    pub corrupt_accepted: u64,
    /// Delayed behind later datagrams by the reordering fault.
    pub reordered: u64,
    /// Refused by the receiver's parser (ICRC or layout).
    pub rejected: u64,
    /// Delivered to a QP.
    pub delivered: u64,
    /// Packets a QP gave to transmit that `rdma-wire` could not emit (a transport that
    /// builds an impossible header): always 0 unless something is broken.
    pub emit_errors: u64,
    /// Of [`sent`](Self::sent), datagrams sent from port 2 (the alternate path).
    pub sent_alt: u64,
    /// Of [`lost`](Self::lost), datagrams lost on port 1 (the primary path).
    pub lost_primary: u64,
}

impl NetStats {
    /// Adds `o`'s counters to these.
    pub fn add(&mut self, o: &NetStats) {
        self.sent += o.sent;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.corrupted += o.corrupted;
        self.corrupted_masked += o.corrupted_masked;
        self.corrupt_accepted += o.corrupt_accepted;
        self.reordered += o.reordered;
        self.rejected += o.rejected;
        self.delivered += o.delivered;
        self.emit_errors += o.emit_errors;
        self.sent_alt += o.sent_alt;
        self.lost_primary += o.lost_primary;
    }
}

/// Size of each host's simulated address space.
pub const MEM_SIZE: usize = 1 << 20;
/// Base address of host A's memory.
pub const BASE_A: u64 = 0x1000_0000;
/// Base address of host B's memory.
pub const BASE_B: u64 = 0x2000_0000;

/// What one simulator step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Idle,
    Limit,
    Moved,
}

/// Two connected RC QPs over a faulty simulated network.
#[derive(Debug)]
pub struct RcPair {
    /// Host A (QPN 0x11).
    pub a: Node,
    /// Host B (QPN 0x22).
    pub b: Node,
    /// Virtual time in ns.
    pub now: u64,
    /// Network fault mix (may be changed between steps); on port 2 too unless
    /// [`alt_faults`](Self::alt_faults) is set.
    pub faults: Faults,
    /// Fault mix of port 2, the alternate path (None: [`faults`](Self::faults)).
    pub alt_faults: Option<Faults>,
    /// The network's random source.
    pub rng: Rng,
    /// Counters.
    pub stats: NetStats,
    /// Jitter never reorders: a datagram arrives no earlier than the one its sender sent
    /// before it (the reordering fault still reorders). Off by default.
    pub in_order: bool,
    /// Datagrams to drop once each: (sent by A, BTH PSN) ([`RcPair::drop_once`]).
    drops: Vec<(bool, u32)>,
    /// The latest arrival time scheduled per direction (to B, to A), for `in_order`.
    last_at: [u64; 2],
    /// Until when A and B do not run ([`RcPair::pause`]).
    paused: [u64; 2],
    flight: Vec<InFlight>,
    /// Print every datagram's fate to stderr (off by default; a test may turn it on while
    /// it looks into a failure). The simulator reads no environment: it is sans-IO.
    pub trace: bool,
    seq: u64,
    buf: Vec<u8>,
    dgram: Vec<u8>,
}

/// Connection parameters used by [`RcPair::with_attrs`].
#[derive(Debug, Clone, Copy)]
pub struct ConnParams {
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// RNR timer code the responders send.
    pub min_rnr_timer: u8,
    /// Initiator depth and responder resources.
    pub rd_atomic: u8,
    /// QP access flags.
    pub access: AccessFlags,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Send window ([`RcConfig::max_outstanding_psns`]; 0: none).
    pub max_outstanding_psns: u32,
}

impl Default for ConnParams {
    fn default() -> Self {
        ConnParams {
            mtu: Mtu::Mtu1024,
            timeout: 10, // 4.2 ms
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1, // 10 µs
            rd_atomic: 8,
            access: AccessFlags::all(),
            max_send_wr: 256,
            max_outstanding_psns: 0,
        }
    }
}

/// Brings `qp` to RTS against `dest` with the given PSNs.
pub fn connect(qp: &mut RcQp, dest: u32, sq_psn: u32, rq_psn: u32, p: &ConnParams) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: p.access,
        port_num: 1,
        ..Default::default()
    };
    let r = qp.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS);
    debug_assert!(r.is_ok());
    a.qp_state = QpState::Rtr;
    a.path = PathAttr {
        hop_limit: 64,
        ..Default::default()
    };
    a.path_mtu = p.mtu;
    a.dest_qp_num = dest;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = p.rd_atomic;
    a.min_rnr_timer = p.min_rnr_timer;
    let r = qp.modify(
        &a,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    );
    debug_assert!(r.is_ok());
    a.qp_state = QpState::Rts;
    a.sq_psn = sq_psn;
    a.timeout = p.timeout;
    a.retry_cnt = p.retry_cnt;
    a.rnr_retry = p.rnr_retry;
    a.max_rd_atomic = p.rd_atomic;
    let r = qp.modify(
        &a,
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
    );
    debug_assert!(r.is_ok());
}

fn node(qpn: u32, base: u64, ip: [u8; 4], peer: [u8; 4], p: &ConnParams) -> Node {
    let pd = PdId(1);
    let mut mem = InMemoryTable::new(base, MEM_SIZE);
    // the buffer sits in the middle of the address space: canaries on both sides
    let buf_addr = base + (MEM_SIZE as u64) / 4;
    let buf_len = (MEM_SIZE as u64) / 2;
    let MrKeys { lkey, rkey } = mem
        .register(pd, buf_addr, buf_len, AccessFlags::all())
        .unwrap_or(MrKeys { lkey: 0, rkey: 0 });
    let mut cfg = RcConfig::new(qpn, pd);
    cfg.max_send_wr = p.max_send_wr;
    cfg.max_recv_wr = p.max_send_wr;
    cfg.max_outstanding_psns = p.max_outstanding_psns;
    let encap = Encap::new(
        IpInfo::V4(Ipv4Info::new(ip, peer)),
        49152 + (qpn as u16),
        4791,
    );
    let alt = |a: [u8; 4]| [198, 51, 100, a[3]];
    let alt_encap = Encap::new(
        IpInfo::V4(Ipv4Info::new(alt(ip), alt(peer))),
        49152 + (qpn as u16),
        4791,
    );
    Node {
        qp: RcQp::new(cfg),
        mem,
        buf_addr,
        buf_len,
        lkey,
        rkey,
        pd,
        rounds_without_progress: 0,
        rounds_at_error: None,
        oldest: 0,
        timeouts: 0,
        encap,
        alt_encap,
    }
}

impl RcPair {
    /// Two connected QPs with default parameters and random starting PSNs.
    pub fn new(seed: u64, faults: Faults) -> Self {
        Self::with_attrs(seed, faults, &ConnParams::default())
    }

    /// Two connected QPs with the given parameters.
    pub fn with_attrs(seed: u64, faults: Faults, p: &ConnParams) -> Self {
        let mut rng = Rng::new(seed);
        let (ipa, ipb) = ([192, 0, 2, 2], [192, 0, 2, 3]);
        let mut a = node(0x11, BASE_A, ipa, ipb, p);
        let mut b = node(0x22, BASE_B, ipb, ipa, p);
        // starting PSNs near the wrap point half of the time
        let psn = |r: &mut Rng| {
            if r.chance(0.5) {
                0xFF_FFFF - r.below(64) as u32
            } else {
                r.below(1 << 24) as u32
            }
        };
        let (pa, pb) = (psn(&mut rng), psn(&mut rng));
        connect(&mut a.qp, 0x22, pa, pb, p);
        connect(&mut b.qp, 0x11, pb, pa, p);
        a.oldest = a.qp.oldest_unacked_psn();
        b.oldest = b.qp.oldest_unacked_psn();
        RcPair {
            a,
            b,
            now: 0,
            faults,
            alt_faults: None,
            rng,
            stats: NetStats::default(),
            in_order: false,
            drops: Vec::new(),
            last_at: [0; 2],
            paused: [0; 2],
            flight: Vec::new(),
            trace: false,
            seq: 0,
            buf: vec![0; 4096],
            dgram: vec![0; 4096 + 128],
        }
    }

    fn send_from(&mut self, from_a: bool) {
        loop {
            let n = if from_a { &mut self.a } else { &mut self.b };
            let Some(t) = n.qp.poll_transmit(self.now, &mut n.mem, &mut self.buf) else {
                break;
            };
            let port = t.port;
            let encap = if port == 2 { n.alt_encap } else { n.encap };
            let Ok(len) = wire::emit(
                &t.header,
                &self.buf[..t.payload_len],
                &mut self.dgram,
                Some(&encap),
            ) else {
                // counted (tests assert 0): a silently dropped packet would look like loss
                self.stats.emit_errors += 1;
                if self.trace {
                    eprintln!("{:>12} emit error: {:?}", self.now, t.header);
                }
                continue;
            };
            self.stats.sent += 1;
            let f = match self.alt_faults {
                Some(alt) if port == 2 => alt,
                _ => self.faults,
            };
            if port == 2 {
                self.stats.sent_alt += 1;
            }
            let mut lost = self.rng.chance(f.loss);
            let psn = t.header.bth.psn;
            if let Some(i) = self.drops.iter().position(|&d| d == (from_a, psn)) {
                self.drops.swap_remove(i);
                lost = true;
            }
            if self.trace {
                let h = &t.header;
                eprintln!(
                    "{:>12} {}{} {:?} psn {:#x} len {} reth {:?} aeth {:?}{}",
                    self.now,
                    if from_a { "A->B" } else { "B->A" },
                    if h.bth.mig_req {
                        format!(" p{port} M")
                    } else {
                        format!(" p{port}")
                    },
                    h.bth.opcode,
                    h.bth.psn,
                    t.payload_len,
                    h.reth.map(|r| (r.va, r.dma_len)),
                    h.aeth
                        .map(|a| (a.syndrome.to_byte().unwrap_or_default(), a.msn)),
                    if lost { " LOST" } else { "" }
                );
            }
            if lost {
                self.stats.lost += 1;
                if port != 2 {
                    self.stats.lost_primary += 1;
                }
                continue;
            }
            let copies = if self.rng.chance(f.dup) { 2 } else { 1 };
            self.stats.duplicated += copies - 1;
            for _ in 0..copies {
                let mut bytes = self.dgram[..len].to_vec();
                let mut corruption = Corruption::None;
                if self.rng.chance(f.corrupt) {
                    self.stats.corrupted += 1;
                    let i = self.rng.below(len as u64) as usize;
                    bytes[i] ^= 1 << self.rng.below(8);
                    corruption = if i == BTH_MASKED_BYTE {
                        self.stats.corrupted_masked += 1;
                        Corruption::Masked
                    } else {
                        Corruption::Covered
                    };
                }
                let mut at = self.now + f.delay_ns + self.rng.below(f.jitter_ns);
                let dir = usize::from(!from_a);
                if self.rng.chance(f.reorder) {
                    self.stats.reordered += 1;
                    at += self.rng.below(20_000);
                } else if self.in_order {
                    at = at.max(self.last_at[dir]);
                }
                self.last_at[dir] = self.last_at[dir].max(at);
                self.seq += 1;
                self.flight.push(InFlight {
                    at,
                    seq: self.seq,
                    to_b: from_a,
                    port,
                    bytes,
                    corruption,
                });
            }
        }
    }

    /// Runs until nothing is in flight and no timer is pending, or until `limit_ns` of
    /// virtual time. Returns whether it went idle.
    pub fn run_until_idle(&mut self, limit_ns: u64) -> bool {
        loop {
            match self.step(limit_ns) {
                Step::Idle => return true,
                Step::Limit => return false,
                Step::Moved => {}
            }
        }
    }

    /// Runs until `done` holds (checked before each step), nothing is left to do, or the next
    /// event is past `limit_ns`; returns whether `done` held.
    pub fn run_until(&mut self, limit_ns: u64, mut done: impl FnMut(&mut RcPair) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.step(limit_ns) != Step::Moved {
                return done(self);
            }
        }
    }

    /// Host A (`b` false) or B does not run until `until` (virtual ns), as a host whose
    /// progress engine is not scheduled: what arrives meanwhile waits, its timers wait, it
    /// sends nothing; then it takes everything that came as one batch before it sends.
    pub fn pause(&mut self, b: bool, until: u64) {
        self.paused[usize::from(b)] = until;
    }

    /// When `f` is taken by its destination (after that one's pause).
    fn taken_at(&self, f: &InFlight) -> u64 {
        f.at.max(self.paused[usize::from(f.to_b)])
    }

    /// Sends what both QPs have, then delivers the next packet or runs the next timers.
    fn step(&mut self, limit_ns: u64) -> Step {
        let running = [self.now >= self.paused[0], self.now >= self.paused[1]];
        if running[0] {
            self.send_from(true);
        }
        if running[1] {
            self.send_from(false);
        }
        let next_pkt = self.flight.iter().map(|f| (self.taken_at(f), f.seq)).min();
        let next_timer = [
            self.a.qp.poll_timeout().map(|t| t.max(self.paused[0])),
            self.b.qp.poll_timeout().map(|t| t.max(self.paused[1])),
        ]
        .into_iter()
        .flatten()
        .min();
        let next = match (next_pkt, next_timer) {
            (None, None) => return Step::Idle,
            (Some((p, _)), Some(t)) => p.min(t),
            (Some((p, _)), None) => p,
            (None, Some(t)) => t,
        };
        if next > limit_ns {
            return Step::Limit;
        }
        self.now = self.now.max(next);
        if let Some((at, seq)) = next_pkt {
            if at <= self.now {
                if let Some(i) = self.flight.iter().position(|f| f.seq == seq) {
                    let f = self.flight.swap_remove(i);
                    let (to_b, held) = (f.to_b, f.at < at);
                    self.deliver(f);
                    if held {
                        // the end of a pause: everything that waited, as one batch
                        while let Some(i) = self
                            .flight
                            .iter()
                            .enumerate()
                            .filter(|(_, g)| g.to_b == to_b && g.at <= at)
                            .min_by_key(|(_, g)| (g.at, g.seq))
                            .map(|(i, _)| i)
                        {
                            let g = self.flight.swap_remove(i);
                            self.deliver(g);
                        }
                    }
                }
                return Step::Moved;
            }
        }
        let now = self.now;
        if now >= self.paused[0] {
            self.a.qp.handle_timeout(now);
        }
        if now >= self.paused[1] {
            self.b.qp.handle_timeout(now);
        }
        self.a.observe(false);
        self.b.observe(false);
        Step::Moved
    }

    fn deliver(&mut self, f: InFlight) {
        let (dst, src) = if f.to_b {
            (&mut self.b, &self.a)
        } else {
            (&mut self.a, &self.b)
        };
        let src_encap = if f.port == 2 {
            src.alt_encap
        } else {
            src.encap
        };
        match wire::parse(&f.bytes, IcrcCheck::Exact(&src_encap)) {
            Ok(pkt) => {
                self.stats.delivered += 1;
                if f.corruption == Corruption::Covered {
                    // still handed to the QP, so a test sees what a broken ICRC check does
                    self.stats.corrupt_accepted += 1;
                }
                let h = &pkt.header;
                let nak_for_oldest = h.bth.opcode == Opcode::RcAcknowledge
                    && h.bth.psn == dst.qp.oldest_unacked_psn()
                    && h.aeth.is_some_and(|a| {
                        a.syndrome == AethSyndrome::Nak(NakCode::PsnSequenceError)
                    });
                dst.qp
                    .handle_packet_on(self.now, &mut dst.mem, &pkt, f.port);
                dst.observe(nak_for_oldest);
            }
            Err(_) => self.stats.rejected += 1,
        }
    }

    /// Drops the next datagram host A (`from_a`) or B sends with BTH PSN `psn` (a request,
    /// or a response to the other side's request), counted as lost.
    pub fn drop_once(&mut self, from_a: bool, psn: u32) {
        self.drops.push((from_a, psn));
    }

    /// Feeds raw bytes to a host as if they came from the other one (for security tests).
    pub fn inject(&mut self, to_b: bool, bytes: Vec<u8>) {
        self.seq += 1;
        self.flight.push(InFlight {
            at: self.now,
            seq: self.seq,
            to_b,
            port: 1,
            bytes,
            corruption: Corruption::None,
        });
    }

    /// The encapsulation host A (or B) sends with.
    pub fn encap(&self, of_a: bool) -> Encap {
        if of_a {
            self.a.encap
        } else {
            self.b.encap
        }
    }
}
