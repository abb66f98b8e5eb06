//! Interop evidence against Linux rxe: the RC conversations captured between two Linux hosts
//! (`../shared/captures/`, see its README) are replayed into our transport.
//!
//! Responder direction: for each connection and each direction that carries requests, a fresh
//! [`RcQp`] takes the place of the Linux QP that answered them (same QPN, the starting PSN from
//! the REQ/REP, memory regions with the rkeys and VAs the requester used, memory contents
//! derived from what Linux's responder returned). The requests are fed in capture order and
//! what our QP emits is compared with what Linux's responder sent:
//! - every NAK (RNR NAK, PSN sequence error, remote access error): PSN, syndrome, MSN, in order;
//! - READ responses and atomic ACKs: opcode, PSN, MSN, payload / original value, in order;
//! - plain ACKs through the cumulative acknowledged PSN and MSN at the end (ACK coalescing
//!   points may legitimately differ), and, since they agree today, each plain ACK as well.
//!
//! Requester direction: a fresh [`RcQp`] takes the place of the Linux requester, is given the
//! work requests reconstructed from the captured messages, and receives Linux's responses at
//! their capture timestamps (our timers run on the same clock). Its request packets must equal
//! Linux's: opcode, PSN, RETH, AtomicETH, ImmDt, IETH, payload, SE (AckReq: see below).
//!
//! Both directions also compare the BTH fields as emitted on the wire: Dest QP, P_Key, pad
//! count, MigReq and TVer. Every RC frame of a capture must belong to a connection its CM
//! exchange set up (counted, asserted 0), and only `rping-2vm` has datagrams with a bad ICRC
//! (its 4 malformed probes).
//!
//! UD (`ud-send`, `mckey-multicast`, `rping-2vm`'s udaddy): each datagram is received by a UD
//! QP of ours (completion, source QP, immediate, GRH, payload; refused with another Q_Key)
//! and sent by one in place of the sender (same BTH, DETH, immediate, payload). UC (`uc`) is
//! not a transport of ours: each packet is refused as unsupported.
//!
//! Loss cases: netem dropped some of the sending VM's full-size data packets before the
//! capture point, so there the capture must equal what we send minus some 1024-byte data
//! packets (write-loss: 7 of our request packets, read-loss: 28 of our READ responses, the
//! numbers the captures' README gives; asserted).
//!
//! Results (all asserted): for every direction of every connection of write-imm,
//! write-multipacket, write-lat-3000, read-multipacket, read-lat-3000, atomics, rnr-nak,
//! nak-rkey, send-inv, write-loss, read-loss, ipv6-global, ipv6-linklocal, ud-send's
//! handshake and rping-2vm (rping and ucmatose), both our responder's and our requester's
//! packets equal Linux's, ACK coalescing points included (rxe ACKs each message whose last
//! packet has AckReq; so do we). One difference was found and fixed: a READ re-request for the
//! tail of an earlier READ (read-loss) was answered starting with READ Response FIRST (or
//! ONLY); rxe answers MIDDLE.../LAST, and rxe's requester treats FIRST/ONLY past the READ's
//! first PSN as an error.
//!
//! Set `REPLAY_DEBUG=1` to print every packet of a direction and our responses.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use rdma_proto::memory::{AtomicOp, MemError, MemKey, MemoryTable};
use rdma_proto::packet::{Packet, Transmit};
use rdma_proto::psn::{psn_add, psn_diff};
use rdma_proto::rc::{RcConfig, RcQp};
use rdma_proto::sim::{connect, ConnParams};
use rdma_proto::verbs::{
    AccessFlags, Completion, Mtu, PdId, RecvWr, SendFlags, SendOp, SendWr, SgList, Sge, WcOpcode,
    WcStatus,
};
use rdma_proto::wire;
use rdma_wire::icrc::Encap;
use rdma_wire::opcode::{ExtHeader, Opcode, Position};
use rdma_wire::packet::IcrcCheck;
use rdma_wire::packet::PacketRepr;
use rdma_wire::reth::RethRepr;

/// vm1's MAC (the captures' README): the sender of a frame, for IPv4 and IPv6 alike.
const VM1_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x00, 0x02, 0x02];
const MTU: u32 = 1024;
const PD: PdId = PdId(1);

// ---------------------------------------------------------------------------------------------
// pcap reading

#[derive(Debug, Clone)]
struct Frame {
    ts_ns: u64,
    from_vm1: bool,
    data: Vec<u8>,
    /// The outer IP header and UDP header it came with.
    ip: Vec<u8>,
}

/// The UDP 4791 datagrams of a capture, and those refused (bad ICRC or too short: the
/// malformed probes a third host sent in `rping-2vm`).
struct Pcap {
    frames: Vec<Frame>,
    invalid: usize,
}

fn captures_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("RDMA_CAPTURES_DIR") {
        return PathBuf::from(dir);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/captures")
}

/// Every UDP datagram to or from port 4791 whose ICRC is valid against its real IP/UDP
/// headers; those that are not are counted.
fn read_pcap(case: &str) -> Pcap {
    let path = captures_dir().join(format!("{case}.pcap"));
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let le = match b[..4] {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => true,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => false,
        _ => panic!("{case}: not a pcap file"),
    };
    let nanos = matches!(b[..4], [0x4d, 0x3c, 0xb2, 0xa1] | [0xa1, 0xb2, 0x3c, 0x4d]);
    let u32at = |o: usize| {
        let a = [b[o], b[o + 1], b[o + 2], b[o + 3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let mut off = 24;
    let mut out = Vec::new();
    let mut invalid = 0;
    while off + 16 <= b.len() {
        let (sec, frac, incl) = (u32at(off), u32at(off + 4), u32at(off + 8) as usize);
        off += 16;
        let pkt = &b[off..off + incl];
        off += incl;
        let ts_ns = sec as u64 * 1_000_000_000
            + if nanos {
                frac as u64
            } else {
                frac as u64 * 1000
            };
        let etype = u16::from_be_bytes([pkt[12], pkt[13]]);
        let (ip, rest) = match etype {
            0x0800 => {
                let ihl = (pkt[14] & 0xf) as usize * 4;
                assert_eq!(pkt[14 + 9], 17);
                let total = u16::from_be_bytes([pkt[16], pkt[17]]) as usize;
                (&pkt[14..14 + ihl], &pkt[14 + ihl..14 + total])
            }
            0x86dd => {
                let plen = u16::from_be_bytes([pkt[18], pkt[19]]) as usize;
                (&pkt[14..54], &pkt[54..54 + plen])
            }
            _ => continue,
        };
        let (udp, payload) = rest.split_at(8);
        let dport = u16::from_be_bytes([udp[2], udp[3]]);
        let sport = u16::from_be_bytes([udp[0], udp[1]]);
        if dport != 4791 && sport != 4791 {
            continue;
        }
        let encap = Encap::from_headers(ip, udp).expect("IP/UDP headers");
        if payload.len() < 16 || encap.verify(payload).is_err() {
            invalid += 1;
            continue;
        }
        out.push(Frame {
            ts_ns,
            from_vm1: pkt[6..12] == VM1_MAC,
            data: payload.to_vec(),
            ip: ip.to_vec(),
        });
    }
    Pcap {
        frames: out,
        invalid,
    }
}

fn parse(f: &Frame) -> Option<Packet<'_>> {
    wire::parse(&f.data, IcrcCheck::Skip).ok()
}

fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

// ---------------------------------------------------------------------------------------------
// connections from the CM exchange

#[derive(Debug, Clone)]
struct Conn {
    /// QPN and starting PSN (the PSN it expects to receive) of the REQ sender (vm1).
    a_qpn: u32,
    a_psn: u32,
    a_resp_res: u8,
    a_init_depth: u8,
    /// Same for the REP sender (vm2).
    b_qpn: u32,
    b_psn: u32,
    b_resp_res: u8,
    b_init_depth: u8,
    rep_private: Vec<u8>,
    /// RTU timestamp: the server's ESTABLISHED.
    established_ns: u64,
    /// Capture frames (indices into the frame list) of this connection's RC packets.
    frames: Vec<usize>,
}

/// The connections set up by the capture's CM exchanges, and how many RC frames (opcode
/// below 0x20) belong to none of them.
fn connections(frames: &[Frame]) -> (Vec<Conn>, usize) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut by_comm: HashMap<u32, usize> = HashMap::new();
    let mut reqs: HashMap<u32, (u32, u32, u8, u8)> = HashMap::new();
    // (from vm1, destination QPN) -> connection
    let mut route: HashMap<(bool, u32), usize> = HashMap::new();
    let mut unmatched = 0;
    for (i, f) in frames.iter().enumerate() {
        let d = &f.data;
        if d[0] == 0x64 && be24(&d[5..8]) == 1 {
            let attr = u16::from_be_bytes([d[36], d[37]]);
            let lcid = u32::from_be_bytes(d[44..48].try_into().unwrap());
            match attr {
                0x0010 => {
                    reqs.insert(lcid, (be24(&d[76..79]), be24(&d[88..91]), d[79], d[83]));
                }
                0x0013 => {
                    let rcid = u32::from_be_bytes(d[48..52].try_into().unwrap());
                    let Some(&(a_qpn, a_psn, a_rr, a_id)) = reqs.get(&rcid) else {
                        continue;
                    };
                    let c = Conn {
                        a_qpn,
                        a_psn,
                        a_resp_res: a_rr,
                        a_init_depth: a_id,
                        b_qpn: be24(&d[56..59]),
                        b_psn: be24(&d[64..67]),
                        b_resp_res: d[68],
                        b_init_depth: d[69],
                        rep_private: d[80..80 + 196].to_vec(),
                        established_ns: 0,
                        frames: Vec::new(),
                    };
                    by_comm.insert(rcid, conns.len());
                    route.insert((true, c.b_qpn), conns.len());
                    route.insert((false, c.a_qpn), conns.len());
                    conns.push(c);
                }
                0x0014 => {
                    // RTU: local comm id is the REQ sender's
                    if let Some(&ci) = by_comm.get(&lcid) {
                        conns[ci].established_ns = f.ts_ns;
                    }
                }
                _ => {}
            }
            continue;
        }
        if d[0] < 0x20 {
            match route.get(&(f.from_vm1, be24(&d[5..8]))) {
                Some(&ci) => conns[ci].frames.push(i),
                None => unmatched += 1,
            }
        }
    }
    (conns, unmatched)
}

// ---------------------------------------------------------------------------------------------
// memory with chosen keys and addresses

#[derive(Debug, Clone)]
struct Region {
    va: u64,
    len: u64,
    access: AccessFlags,
    valid: bool,
}

/// A sparse 64-bit address space with regions registered under keys the test chooses.
#[derive(Debug, Default)]
struct KeyedMem {
    pages: BTreeMap<u64, Box<[u8; 4096]>>,
    regions: HashMap<u32, Region>,
}

impl KeyedMem {
    fn register(&mut self, key: u32, va: u64, len: u64, access: AccessFlags) {
        self.regions.insert(
            key,
            Region {
                va,
                len,
                access,
                valid: true,
            },
        );
    }
    fn put(&mut self, addr: u64, src: &[u8]) {
        for (i, &b) in src.iter().enumerate() {
            let a = addr + i as u64;
            self.pages
                .entry(a & !4095)
                .or_insert_with(|| Box::new([0; 4096]))[(a & 4095) as usize] = b;
        }
    }
    fn get(&self, addr: u64, dst: &mut [u8]) {
        for (i, b) in dst.iter_mut().enumerate() {
            let a = addr + i as u64;
            *b = self
                .pages
                .get(&(a & !4095))
                .map_or(0, |p| p[(a & 4095) as usize]);
        }
    }
    fn check(&self, key: u32, va: u64, len: u64, need: AccessFlags) -> Result<(), MemError> {
        let r = self.regions.get(&key).ok_or(MemError::InvalidKey)?;
        if !r.valid {
            return Err(MemError::InvalidKey);
        }
        let end = va.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if va < r.va || end > r.va + r.len {
            return Err(MemError::OutOfBounds);
        }
        if !r.access.contains(need) {
            return Err(MemError::AccessDenied(need));
        }
        Ok(())
    }
}

impl MemoryTable for KeyedMem {
    fn check(&self, _: PdId, k: MemKey, a: u64, l: u64, n: AccessFlags) -> Result<(), MemError> {
        KeyedMem::check(self, k.value(), a, l, n)
    }
    fn read(&self, _: PdId, k: MemKey, a: u64, dst: &mut [u8]) -> Result<(), MemError> {
        KeyedMem::check(self, k.value(), a, dst.len() as u64, k.read_access())?;
        self.get(a, dst);
        Ok(())
    }
    fn write(&mut self, _: PdId, k: MemKey, a: u64, src: &[u8]) -> Result<(), MemError> {
        KeyedMem::check(self, k.value(), a, src.len() as u64, k.write_access())?;
        self.put(a, src);
        Ok(())
    }
    fn atomic_remote(&mut self, _: PdId, k: u32, a: u64, op: AtomicOp) -> Result<u64, MemError> {
        if a % 8 != 0 {
            return Err(MemError::Misaligned);
        }
        self.check(k, a, 8, AccessFlags::REMOTE_ATOMIC)?;
        let mut b = [0u8; 8];
        self.get(a, &mut b);
        let orig = u64::from_ne_bytes(b);
        self.put(a, &op.apply(orig).to_ne_bytes());
        Ok(orig)
    }
    fn invalidate_remote(&mut self, _: PdId, k: u32) -> Result<(), MemError> {
        let r = self.regions.get_mut(&k).ok_or(MemError::InvalidKey)?;
        if !r.valid {
            return Err(MemError::InvalidKey);
        }
        r.valid = false;
        Ok(())
    }
    fn read_inline(&self, _: PdId, a: u64, dst: &mut [u8]) -> Result<(), MemError> {
        self.get(a, dst);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// one direction of one connection

/// The requests of one direction and the responses to them.
struct Dir<'a> {
    case: &'a str,
    /// Requests (sender's packets that are not responses), capture order.
    reqs: Vec<&'a Frame>,
    /// Responses to them, capture order.
    resps: Vec<&'a Frame>,
    /// Every frame of both, capture order.
    all: Vec<&'a Frame>,
    /// The requester's and the responder's QPN; the PSN the responder expects first.
    req_qpn: u32,
    resp_qpn: u32,
    resp_psn: u32,
    req_init_depth: u8,
    resp_resources: u8,
    rep_private: Option<&'a [u8]>,
    established_ns: u64,
}

fn directions<'a>(case: &'a str, frames: &'a [Frame], c: &'a Conn) -> Vec<Dir<'a>> {
    let mut out = Vec::new();
    for vm1_requests in [true, false] {
        let (req_qpn, resp_qpn, resp_psn, init, res) = if vm1_requests {
            (c.a_qpn, c.b_qpn, c.b_psn, c.a_init_depth, c.b_resp_res)
        } else {
            (c.b_qpn, c.a_qpn, c.a_psn, c.b_init_depth, c.a_resp_res)
        };
        let mut d = Dir {
            case,
            reqs: Vec::new(),
            resps: Vec::new(),
            all: Vec::new(),
            req_qpn,
            resp_qpn,
            resp_psn,
            req_init_depth: init,
            resp_resources: res,
            rep_private: vm1_requests.then_some(&c.rep_private[..]),
            established_ns: c.established_ns,
        };
        for &i in &c.frames {
            let f = &frames[i];
            let is_resp = (0x0D..=0x12).contains(&f.data[0]);
            if f.from_vm1 == vm1_requests && !is_resp {
                d.reqs.push(f);
                d.all.push(f);
            } else if f.from_vm1 != vm1_requests && is_resp {
                d.resps.push(f);
                d.all.push(f);
            }
        }
        if !d.reqs.is_empty() {
            out.push(d);
        }
    }
    out
}

fn hdr(f: &Frame) -> PacketRepr {
    parse(f)
        .expect("transport parses a captured RC packet")
        .header
}

fn npkts_of(h: &PacketRepr) -> u32 {
    match h.reth {
        Some(r) if h.bth.opcode == Opcode::RcRdmaReadRequest => r.dma_len.div_ceil(MTU).max(1),
        _ => 1,
    }
}

/// The BTH fields as they are on the wire that the transport header does not carry (pad
/// count, MigReq, transport version) or that are easy to get wrong (Dest QP, P_Key).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct BthWire {
    dest_qp: u32,
    pkey: u16,
    pad: u8,
    mig_req: bool,
    tver: u8,
}

/// [`BthWire`] of a datagram's bytes (BTH first).
fn bth_wire(d: &[u8]) -> BthWire {
    BthWire {
        dest_qp: be24(&d[5..8]),
        pkey: u16::from_be_bytes([d[2], d[3]]),
        pad: (d[1] >> 4) & 3,
        mig_req: d[1] & 0x40 != 0,
        tver: d[1] & 0x0f,
    }
}

/// [`BthWire`] of what we would put on the wire for this transmit.
fn bth_ours(h: &PacketRepr, payload: &[u8]) -> BthWire {
    let mut out = vec![0u8; payload.len() + 128];
    let n = wire::emit(h, payload, &mut out, None).expect("our packet emits");
    bth_wire(&out[..n])
}

/// A response as compared: (opcode, BTH wire fields, PSN, syndrome, MSN, payload or original
/// value).
#[derive(Clone, PartialEq, Eq)]
struct Resp {
    opcode: u8,
    bth: BthWire,
    psn: u32,
    syndrome: Option<u8>,
    msn: Option<u32>,
    data: Vec<u8>,
}

impl std::fmt::Debug for Resp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "op {:#04x} {:x?} psn {:#08x} syndrome {:02x?} msn {:?} data {} B {:02x?}",
            self.opcode,
            self.bth,
            self.psn,
            self.syndrome,
            self.msn,
            self.data.len(),
            &self.data[..self.data.len().min(8)]
        )
    }
}

impl Resp {
    fn of(h: &PacketRepr, payload: &[u8], bth: BthWire) -> Self {
        let mut data = payload.to_vec();
        if let Some(v) = h.atomic_ack_eth.map(|a| a.orig_rem_dt) {
            data = v.to_be_bytes().to_vec();
        }
        Resp {
            opcode: u8::from(h.bth.opcode),
            bth,
            psn: h.bth.psn,
            syndrome: h
                .aeth
                .map(|a| a.syndrome.to_byte().expect("a syndrome byte")),
            msn: h.aeth.map(|a| a.msn),
            data,
        }
    }
    fn is_plain_ack(&self) -> bool {
        self.opcode == 0x11 && self.syndrome.is_some_and(|s| s >> 5 == 0)
    }
}

const RECV_KEY: u32 = 0xFEED_0001;
const RECV_BASE: u64 = 0x7f00_0000_0000;
const RECV_LEN: u32 = 4096;

struct ResponderRun {
    /// How many of our packets were taken as dropped by netem before the capture point.
    dropped: usize,
    ours: Vec<Resp>,
    theirs: Vec<Resp>,
    recv: Vec<Completion>,
    mem: KeyedMem,
}

/// Our QP in place of the Linux responder of this direction.
fn replay_responder(d: &Dir<'_>) -> ResponderRun {
    let mut mem = KeyedMem::default();
    let all = AccessFlags::all();
    // regions: cmrej advertises its buffer (and MW) in the REP private data; otherwise every
    // rkey the requester used, over the span of addresses it used it for
    let mut from_rep = false;
    if let Some(p) = d.rep_private {
        if p.starts_with(b"refvm-rep") {
            let va = u64::from_be_bytes(p[16..24].try_into().unwrap());
            let rkey = u32::from_be_bytes(p[24..28].try_into().unwrap());
            let len = u32::from_be_bytes(p[28..32].try_into().unwrap()) as u64;
            let mw = u32::from_be_bytes(p[32..36].try_into().unwrap());
            mem.register(rkey, va, len, all);
            if mw != 0 {
                mem.register(
                    mw,
                    va,
                    len,
                    AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
                );
            }
            from_rep = true;
        }
    }
    if !from_rep {
        let mut spans: HashMap<u32, (u64, u64)> = HashMap::new();
        for f in &d.reqs {
            let h = hdr(f);
            let (k, va, len) = match (h.reth, h.atomic_eth) {
                (Some(r), _) if r.dma_len > 0 => (r.r_key, r.va, r.dma_len as u64),
                (_, Some(a)) => (a.r_key, a.va, 8),
                _ => continue,
            };
            let e = spans.entry(k).or_insert((va, va + len));
            e.0 = e.0.min(va);
            e.1 = e.1.max(va + len);
        }
        for (k, (lo, hi)) in spans {
            mem.register(k, lo, hi - lo, all);
        }
    }
    mem.register(RECV_KEY, RECV_BASE, 1 << 30, all);
    // memory contents Linux's responder had: READ data from its READ responses, atomic
    // targets from the original value in its first atomic ACK for each address
    let reads: Vec<(u32, u32, u64)> = d
        .reqs
        .iter()
        .map(|f| hdr(f))
        .filter(|h| h.bth.opcode == Opcode::RcRdmaReadRequest)
        .map(|h| (h.bth.psn, npkts_of(&h), h.reth.map_or(0, |r| r.va)))
        .collect();
    let atomics: Vec<(u32, u64)> = d
        .reqs
        .iter()
        .map(|f| hdr(f))
        .filter_map(|h| h.atomic_eth.map(|a| (h.bth.psn, a.va)))
        .collect();
    let mut seeded = std::collections::HashSet::new();
    // what each READ returned, by its first PSN: put back into memory when the READ is
    // replayed, since the application may change its buffer between READs (rping does)
    let mut read_data: HashMap<u32, Vec<(u64, Vec<u8>)>> = HashMap::new();
    for f in &d.resps {
        let p = parse(f).unwrap();
        let h = p.header;
        if h.bth.opcode.is_response()
            && h.bth.opcode != Opcode::RcAcknowledge
            && !p.payload.is_empty()
        {
            if let Some(&(first, _, va)) = reads
                .iter()
                .find(|(first, n, _)| (0..*n as i32).contains(&psn_diff(h.bth.psn, *first)))
            {
                let off = psn_diff(h.bth.psn, first) as u64 * MTU as u64;
                mem.put(va + off, p.payload);
                read_data
                    .entry(first)
                    .or_default()
                    .push((va + off, p.payload.to_vec()));
            }
        }
        if let Some(orig) = h.atomic_ack_eth.map(|a| a.orig_rem_dt) {
            if let Some(&(_, va)) = atomics.iter().find(|(psn, _)| *psn == h.bth.psn) {
                // only the first operation on an address shows the initial value
                let first_on_va = atomics.iter().find(|(_, v)| *v == va).map(|x| x.0);
                if first_on_va == Some(h.bth.psn) && seeded.insert(va) {
                    mem.put(va, &orig.to_ne_bytes());
                }
            }
        }
    }

    let mut cfg = RcConfig::new(d.resp_qpn, PD);
    cfg.max_recv_wr = 64;
    let mut qp = RcQp::new(cfg);
    let params = ConnParams {
        mtu: Mtu::Mtu1024,
        timeout: 0,
        retry_cnt: 7,
        rnr_retry: 7,
        // rdma_cm leaves min_rnr_timer 0 on the responder (655.36 ms)
        min_rnr_timer: 0,
        rd_atomic: d.resp_resources.max(1),
        access: AccessFlags::all(),
        max_send_wr: 64,
        ..ConnParams::default()
    };
    connect(&mut qp, d.req_qpn, 0, d.resp_psn, &params);

    // receives: rnr-nak's server posts them 1.5 s after ESTABLISHED, everyone else before
    let post_at = if d.case == "rnr-nak" {
        d.established_ns + 1_500_000_000
    } else {
        0
    };
    let mut posted = 0u64;
    let mut outstanding = 0usize;
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut recv = Vec::new();
    let mut buf = vec![0u8; 4096];
    for f in &d.all {
        let h = hdr(f);
        if h.bth.opcode.is_response() {
            theirs.push(Resp::of(&h, parse(f).unwrap().payload, bth_wire(&f.data)));
            continue;
        }
        if f.ts_ns >= post_at {
            while outstanding < 8 {
                let sge = Sge {
                    addr: RECV_BASE + posted * RECV_LEN as u64,
                    length: RECV_LEN,
                    lkey: RECV_KEY,
                };
                let wr = RecvWr {
                    wr_id: posted,
                    sg: SgList::from_slice(&[sge]).unwrap(),
                };
                qp.post_recv(&wr).unwrap();
                posted += 1;
                outstanding += 1;
            }
        }
        let p = parse(f).unwrap();
        if h.bth.opcode == Opcode::RcRdmaReadRequest {
            if let Some(&(first, _, _)) = reads
                .iter()
                .find(|(first, n, _)| (0..*n as i32).contains(&psn_diff(h.bth.psn, *first)))
            {
                for (a, data) in read_data.get(&first).into_iter().flatten() {
                    mem.put(*a, data);
                }
            }
        }
        qp.handle_packet(f.ts_ns, &mut mem, &p);
        while let Some(t) = qp.poll_transmit(f.ts_ns, &mut mem, &mut buf) {
            let payload = &buf[..t.payload_len];
            ours.push(Resp::of(&t.header, payload, bth_ours(&t.header, payload)));
        }
        while let Some(c) = qp.poll_recv_completion() {
            outstanding = outstanding.saturating_sub(1);
            recv.push(c);
        }
    }
    ResponderRun {
        dropped: 0,
        ours,
        theirs,
        recv,
        mem,
    }
}

/// Matches `ours` against what the capture shows of the same sender. Without loss they must
/// be equal. With `lossy`, netem dropped some of the sender's full-size data packets before the
/// capture point, so the capture must be `ours` minus some packets `droppable` accepts; returns
/// how many of ours were taken as dropped.
fn match_seq<T: PartialEq + std::fmt::Debug>(
    label: &str,
    ours: &[T],
    theirs: &[T],
    lossy: bool,
    droppable: impl Fn(&T) -> bool,
) -> usize {
    let (mut i, mut j, mut skipped) = (0, 0, 0);
    while j < theirs.len() {
        assert!(
            i < ours.len(),
            "{label}: Linux sent more: next {:?} (#{j})",
            theirs[j]
        );
        if ours[i] == theirs[j] {
            i += 1;
            j += 1;
        } else if lossy && droppable(&ours[i]) {
            i += 1;
            skipped += 1;
        } else {
            panic!(
                "{label}: packet #{i} of ours differs from #{j} of Linux's\n  ours:  {:?}\n  Linux: {:?}",
                ours[i], theirs[j]
            );
        }
    }
    for o in &ours[i..] {
        assert!(lossy && droppable(o), "{label}: we sent more: {o:?}");
        skipped += 1;
    }
    skipped
}

fn check_responder(d: &Dir<'_>, lossy: bool) -> (String, ResponderRun) {
    let mut run = replay_responder(d);
    if std::env::var("REPLAY_DEBUG").is_ok() {
        eprintln!(
            "resources {} init depth {}",
            d.resp_resources, d.req_init_depth
        );
        for f in &d.all {
            let p = parse(f).unwrap();
            eprintln!(
                "  {} {:?}",
                f.ts_ns,
                Resp::of(&p.header, p.payload, bth_wire(&f.data))
            );
            if let Some(r) = p.header.reth {
                eprintln!("     reth {:x?}", r);
            }
        }
        for r in &run.ours {
            eprintln!("  ours {r:?}");
        }
    }
    let label = format!("{} QP {:#x}<-{:#x}", d.case, d.resp_qpn, d.req_qpn);
    let not_ack =
        |v: &[Resp]| -> Vec<Resp> { v.iter().filter(|r| !r.is_plain_ack()).cloned().collect() };
    let (o, t) = (not_ack(&run.ours), not_ack(&run.theirs));
    let dropped = match_seq(&label, &o, &t, lossy, |r| {
        (0x0D..=0x10).contains(&r.opcode) && r.data.len() == MTU as usize
    });
    run.dropped = dropped;
    // cumulative acknowledgement at the end, the highest PSN acknowledged with its MSN
    let highest = |v: &[Resp]| -> Option<(u32, u32)> {
        let mut best: Option<(u32, u32)> = None;
        for r in v {
            let Some(msn) = r.msn else { continue };
            let acked = match r.syndrome.map(|s| s >> 5) {
                Some(0) => r.psn,
                // a NAK acknowledges everything before its PSN
                _ => r.psn.wrapping_sub(1) & 0xFF_FFFF,
            };
            if best.map_or(true, |(p, _)| psn_diff(acked, p) >= 0) {
                best = Some((acked, msn));
            }
        }
        best
    };
    assert_eq!(
        highest(&run.ours),
        highest(&run.theirs),
        "{label}: cumulative acknowledged (PSN, MSN)"
    );
    // stronger than the brief needs: the ACK points agree too (rxe and we both ACK each
    // message whose last packet asks for it); if this ever fails alone, check whether only the
    // coalescing changed, which is allowed
    let acks =
        |v: &[Resp]| -> Vec<Resp> { v.iter().filter(|r| r.is_plain_ack()).cloned().collect() };
    match_seq(
        &format!("{label} (plain ACKs)"),
        &acks(&run.ours),
        &acks(&run.theirs),
        false,
        |_| false,
    );
    let acks_o = run.ours.iter().filter(|r| r.is_plain_ack()).count();
    let acks_t = run.theirs.iter().filter(|r| r.is_plain_ack()).count();
    let s = format!(
        "{label}: {} requests; {} NAK/READ/atomic responses identical ({dropped} more of ours taken as dropped by netem); ACKs ours {acks_o} Linux {acks_t}{}; final ack {:?}",
        d.reqs.len(),
        t.len(),
        if run.ours == run.theirs { " (all responses identical)" } else { "" },
        highest(&run.ours).map(|(p, m)| format!("psn {p:#x} msn {m}")),
    );
    (s, run)
}

// ---------------------------------------------------------------------------------------------
// requester direction

/// A request as compared.
#[derive(Clone, PartialEq, Eq)]
struct Req {
    opcode: u8,
    bth: BthWire,
    psn: u32,
    ack_req: bool,
    se: bool,
    reth: Option<(u64, u32, u32)>,
    atomic: Option<(u64, u32, u64, u64)>,
    imm: Option<u32>,
    ieth: Option<u32>,
    payload: Vec<u8>,
}

impl std::fmt::Debug for Req {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "op {:#04x} {:x?} psn {:#08x} ackreq {} se {} reth {:x?} atomic {:x?} imm {:x?} ieth {:x?} payload {} B {:02x?}",
            self.opcode,
            self.bth,
            self.psn,
            self.ack_req,
            self.se,
            self.reth,
            self.atomic,
            self.imm,
            self.ieth,
            self.payload.len(),
            &self.payload[..self.payload.len().min(8)]
        )
    }
}

impl Req {
    fn of(h: &PacketRepr, payload: &[u8], bth: BthWire) -> Self {
        Req {
            opcode: u8::from(h.bth.opcode),
            bth,
            psn: h.bth.psn,
            ack_req: h.bth.ack_req,
            se: h.bth.se,
            reth: h.reth.map(|r| (r.va, r.r_key, r.dma_len)),
            atomic: h
                .atomic_eth
                .map(|a| (a.va, a.r_key, a.swap_add_data, a.compare_data)),
            imm: h.imm_dt,
            ieth: h.ieth,
            payload: payload.to_vec(),
        }
    }
}

const LOCAL_KEY: u32 = 0xC0DE_0001;
const LOCAL_BASE: u64 = 0x6000_0000_0000;

/// Rebuilds the work requests from the first transmission of every request PSN, each with
/// the time Linux first sent its first packet (when it was posted, near enough).
fn work_requests(d: &Dir<'_>, mem: &mut KeyedMem) -> Vec<(u64, SendWr)> {
    let mut first: BTreeMap<i32, (u64, PacketRepr, Vec<u8>)> = BTreeMap::new();
    for f in &d.reqs {
        let p = parse(f).unwrap();
        // a READ re-request for a tail of the response has a PSN inside the original's range
        let covered = first.values().any(|(_, h, _)| {
            let k = psn_diff(p.header.bth.psn, h.bth.psn);
            k > 0 && (k as u32) < npkts_of(h)
        });
        if !covered {
            first
                .entry(psn_diff(p.header.bth.psn, d.resp_psn))
                .or_insert((f.ts_ns, p.header, p.payload.to_vec()));
        }
    }
    let mut wrs = Vec::new();
    let mut data: Vec<u8> = Vec::new();
    let mut start: Option<PacketRepr> = None;
    let mut posted_at = 0;
    let mut addr = LOCAL_BASE;
    for (_, (ts, h, payload)) in first {
        if matches!(
            h.bth.opcode.position(),
            Position::First | Position::Only | Position::None
        ) {
            start = Some(h);
            posted_at = ts;
            data.clear();
        }
        data.extend_from_slice(&payload);
        if !matches!(
            h.bth.opcode.position(),
            Position::Last | Position::Only | Position::None
        ) {
            continue;
        }
        let s = start.take().expect("message starts before it ends");
        let len = match (s.bth.opcode, s.reth) {
            (Opcode::RcRdmaReadRequest, Some(r)) => r.dma_len,
            _ if s.bth.opcode.ext_headers().contains(ExtHeader::AtomicEth) => 8,
            _ => data.len() as u32,
        };
        let reth = s.reth.unwrap_or(RethRepr {
            va: 0,
            r_key: 0,
            dma_len: 0,
        });
        use Opcode::*;
        let op = match h.bth.opcode {
            RcSendOnly | RcSendLast => SendOp::Send,
            RcSendOnlyImm | RcSendLastImm => SendOp::SendWithImm {
                imm: h.imm_dt.unwrap(),
            },
            RcSendOnlyInv | RcSendLastInv => SendOp::SendWithInv {
                invalidate_rkey: h.ieth.unwrap(),
            },
            RcRdmaWriteOnly | RcRdmaWriteLast => SendOp::RdmaWrite {
                remote_addr: reth.va,
                rkey: reth.r_key,
            },
            RcRdmaWriteOnlyImm | RcRdmaWriteLastImm => SendOp::RdmaWriteWithImm {
                remote_addr: reth.va,
                rkey: reth.r_key,
                imm: h.imm_dt.unwrap(),
            },
            RcRdmaReadRequest => SendOp::RdmaRead {
                remote_addr: reth.va,
                rkey: reth.r_key,
            },
            RcCompareSwap => {
                let a = h.atomic_eth.unwrap();
                SendOp::AtomicCmpAndSwp {
                    remote_addr: a.va,
                    rkey: a.r_key,
                    compare: a.compare_data,
                    swap: a.swap_add_data,
                }
            }
            RcFetchAdd => {
                let a = h.atomic_eth.unwrap();
                SendOp::AtomicFetchAndAdd {
                    remote_addr: a.va,
                    rkey: a.r_key,
                    add: a.swap_add_data,
                }
            }
            o => panic!("{}: unexpected request opcode {o:?}", d.case),
        };
        mem.put(addr, &data);
        let mut wr = SendWr::new(wrs.len() as u64, op)
            .with_sge(Sge {
                addr,
                length: len,
                lkey: LOCAL_KEY,
            })
            .with_flags(SendFlags::SIGNALED);
        if h.bth.se {
            wr.flags |= SendFlags::SOLICITED;
        }
        if len == 0 {
            wr.sg = SgList::new();
        }
        addr += (len as u64).div_ceil(4096) * 4096 + 4096;
        wrs.push((posted_at, wr));
    }
    wrs
}

struct RequesterRun {
    /// How many of our packets were taken as dropped by netem before the capture point.
    dropped: usize,
    ours: Vec<Req>,
    theirs: Vec<Req>,
    completions: Vec<Completion>,
}

/// Our QP in place of the Linux requester: same WRs, posted when Linux first sent them, and
/// Linux's responses at their capture times.
fn replay_requester(d: &Dir<'_>) -> RequesterRun {
    let mut mem = KeyedMem::default();
    mem.register(LOCAL_KEY, LOCAL_BASE, 1 << 40, AccessFlags::all());
    let wrs = work_requests(d, &mut mem);
    let mut cfg = RcConfig::new(d.req_qpn, PD);
    cfg.max_send_wr = wrs.len().max(1) as u32;
    let mut qp = RcQp::new(cfg);
    // Linux's requester resends on its ACK timer only: so does ours here, for the packets to
    // compare (a TCG VM's responses come later than our probe would wait)
    qp.set_early_retransmit(false);
    let params = ConnParams {
        mtu: Mtu::Mtu1024,
        // 4.096 µs * 2^19 = 2.15 s: what rdma_cm gives RoCE QPs (packet life time 18 + 1),
        // consistent with the ~2.3 s retransmission gaps in read-loss under TCG
        timeout: 19,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 0,
        rd_atomic: d.req_init_depth.max(1),
        access: AccessFlags::all(),
        max_send_wr: wrs.len().max(1) as u32,
        // rxe's requester window (RXE_MAX_UNACKED_PSNS): no capture comes near it
        max_outstanding_psns: 128,
    };
    let first_psn = hdr(d.reqs[0]).bth.psn;
    assert_eq!(
        first_psn, d.resp_psn,
        "{}: first request PSN = the peer's starting PSN",
        d.case
    );
    connect(&mut qp, d.resp_qpn, first_psn, 0, &params);
    let mut buf = vec![0u8; 4096];
    let mut ours = Vec::new();
    let mut completions = Vec::new();
    let drain =
        |qp: &mut RcQp, mem: &mut KeyedMem, now: u64, ours: &mut Vec<Req>, buf: &mut [u8]| {
            while let Some(Transmit {
                header,
                payload_len,
                ..
            }) = qp.poll_transmit(now, mem, buf)
            {
                let payload = &buf[..payload_len];
                ours.push(Req::of(&header, payload, bth_ours(&header, payload)));
            }
        };
    // events in time order: posting a WR (before a response with the same time), a response
    let mut events: Vec<(u64, u8, usize)> = wrs
        .iter()
        .enumerate()
        .map(|(i, (t, _))| (*t, 0, i))
        .chain(d.resps.iter().enumerate().map(|(i, f)| (f.ts_ns, 1, i)))
        .collect();
    events.sort();
    for (ts, kind, i) in events {
        while let Some(t) = qp.poll_timeout().filter(|&t| t <= ts) {
            qp.handle_timeout(t);
            drain(&mut qp, &mut mem, t, &mut ours, &mut buf);
        }
        if kind == 0 {
            qp.post_send(&mem, &wrs[i].1).unwrap();
        } else {
            let p = parse(d.resps[i]).unwrap();
            qp.handle_packet(ts, &mut mem, &p);
        }
        drain(&mut qp, &mut mem, ts, &mut ours, &mut buf);
        while let Some(c) = qp.poll_send_completion() {
            completions.push(c);
        }
    }
    let theirs = d
        .reqs
        .iter()
        .map(|f| {
            let p = parse(f).unwrap();
            Req::of(&p.header, p.payload, bth_wire(&f.data))
        })
        .collect();
    RequesterRun {
        dropped: 0,
        ours,
        theirs,
        completions,
    }
}

fn check_requester(d: &Dir<'_>, lossy: bool) -> (String, RequesterRun) {
    let mut run = replay_requester(d);
    let label = format!(
        "{} requester QP {:#x}->{:#x}",
        d.case, d.req_qpn, d.resp_qpn
    );
    let dropped = match_seq(&label, &run.ours, &run.theirs, lossy, |r| {
        r.payload.len() == MTU as usize
    });
    run.dropped = dropped;
    (
        format!(
            "{label}: {} request packets identical ({dropped} more of ours taken as dropped by netem), {} completions",
            run.theirs.len(),
            run.completions.len()
        ),
        run,
    )
}

// ---------------------------------------------------------------------------------------------
// the cases

struct Case {
    frames: Vec<Frame>,
    conns: Vec<Conn>,
}

/// Datagrams with a bad ICRC in each capture: only `rping-2vm` has them (a third host's
/// malformed probes to port 4791; `rdma-wire`'s `captures.rs` checks each is refused).
fn invalid_expected(case: &str) -> usize {
    match case {
        "rping-2vm" => RPING_2VM_PROBES,
        _ => 0,
    }
}

/// The malformed probes in `rping-2vm` whose ICRC (or length) no receiver can accept.
const RPING_2VM_PROBES: usize = 4;

fn load(case: &str) -> Case {
    let Pcap { frames, invalid } = read_pcap(case);
    assert_eq!(
        invalid,
        invalid_expected(case),
        "{case}: datagrams with a bad ICRC"
    );
    let (conns, unmatched) = connections(&frames);
    assert!(!conns.is_empty(), "{case}: no connection found");
    // every RC packet belongs to a connection the CM set up: none is silently left out
    assert_eq!(unmatched, 0, "{case}: RC frames of no known connection");
    // the PSN convention: the requester's first packet carries the REP's starting PSN
    for c in &conns {
        if let Some(&i) = c.frames.iter().find(|&&i| frames[i].from_vm1) {
            let h = hdr(&frames[i]);
            if !h.bth.opcode.is_response() {
                assert_eq!(h.bth.psn, c.b_psn, "{case}: first request PSN");
            }
        }
    }
    Case { frames, conns }
}

/// What [`run_case`] replayed.
struct CaseRun {
    /// Report lines, one per replayed direction and role.
    lines: Vec<String>,
    /// Directions replayed (into our responder, and our requester when asked).
    directions: usize,
    /// Packets of our responders and of our requesters taken as dropped by netem.
    responder_dropped: usize,
    requester_dropped: usize,
}

/// Replays every direction of every connection of `case` into our responder (and requester,
/// unless `requester` is false).
fn run_case(case: &str, requester: bool, lossy: bool) -> CaseRun {
    let c = load(case);
    let mut r = CaseRun {
        lines: Vec::new(),
        directions: 0,
        responder_dropped: 0,
        requester_dropped: 0,
    };
    for conn in &c.conns {
        for d in directions(case, &c.frames, conn) {
            r.directions += 1;
            let (line, run) = check_responder(&d, lossy);
            r.responder_dropped += run.dropped;
            r.lines.push(line);
            if requester {
                let (line, run) = check_requester(&d, lossy);
                assert!(ok_all(&run.completions), "{line}: {:?}", run.completions);
                r.requester_dropped += run.dropped;
                r.lines.push(line);
            }
        }
    }
    for l in &r.lines {
        eprintln!("{l}");
    }
    if !lossy {
        assert_eq!(
            (r.responder_dropped, r.requester_dropped),
            (0, 0),
            "{case}: packets dropped without loss"
        );
    }
    r
}

fn ok_all(v: &[Completion]) -> bool {
    v.iter().all(|c| c.status == WcStatus::Success)
}

#[test]
fn write_imm() {
    let c = load("write-imm");
    assert_eq!(c.conns.len(), 1);
    let ds = directions("write-imm", &c.frames, &c.conns[0]);
    assert_eq!(ds.len(), 1);
    let (s, run) = check_responder(&ds[0], false);
    eprintln!("{s}");
    // the server's log: the receive completions rxe reported
    let got: Vec<(WcOpcode, u32, Option<u32>)> = run
        .recv
        .iter()
        .map(|c| {
            assert_eq!(c.status, WcStatus::Success);
            let imm = c
                .wc_flags
                .contains(rdma_proto::verbs::WcFlags::WITH_IMM)
                .then_some(c.imm_data);
            (c.opcode, c.byte_len, imm)
        })
        .collect();
    use WcOpcode::{Recv, RecvRdmaWithImm};
    assert_eq!(
        got,
        vec![
            (Recv, 32, None),
            (Recv, 48, Some(0x11223344)),
            (RecvRdmaWithImm, 64, Some(0x55667788)),
            (RecvRdmaWithImm, 0, Some(0x99aabbcc)),
            (Recv, 2500, Some(0x0badcafe)),
            (RecvRdmaWithImm, 2500, Some(0xdeadbeef)),
            (Recv, 2500, None),
        ]
    );
    // received data landed where the server read it
    let mut b = [0u8; 32];
    run.mem.get(RECV_BASE, &mut b);
    assert_eq!(&b, b"refvm SEND 32 abcdefghijklmnopqr");
    let (s, run) = check_requester(&ds[0], false);
    eprintln!("{s}");
    assert_eq!(run.completions.len(), 7);
    assert!(ok_all(&run.completions));
}

#[test]
fn write_multipacket() {
    run_case("write-multipacket", true, false);
}

#[test]
fn write_lat_3000() {
    run_case("write-lat-3000", true, false);
}

#[test]
fn read_multipacket() {
    run_case("read-multipacket", true, false);
}

#[test]
fn read_lat_3000() {
    run_case("read-lat-3000", true, false);
}

#[test]
fn atomics() {
    let r = run_case("atomics", true, false);
    assert_eq!(r.directions, ATOMICS_DIRECTIONS, "{:#?}", r.lines);
}

/// Request-carrying directions in `atomics`: 4 connections (handshake + test, twice).
const ATOMICS_DIRECTIONS: usize = 6;

#[test]
fn rnr_nak() {
    let c = load("rnr-nak");
    let ds = directions("rnr-nak", &c.frames, &c.conns[0]);
    let (s, run) = check_responder(&ds[0], false);
    eprintln!("{s}");
    let rnr = run.ours.iter().filter(|r| r.syndrome == Some(0x20)).count();
    assert_eq!(rnr, 3, "three RNR NAKs with timer 0");
    let (s, run) = check_requester(&ds[0], false);
    eprintln!("{s}");
    assert_eq!(run.ours.len(), 4, "the SEND went out four times");
    assert!(ok_all(&run.completions) && run.completions.len() == 1);
}

#[test]
fn nak_rkey() {
    let c = load("nak-rkey");
    let ds = directions("nak-rkey", &c.frames, &c.conns[0]);
    let (s, run) = check_responder(&ds[0], false);
    eprintln!("{s}");
    assert!(run.ours.iter().any(|r| r.syndrome == Some(0x62)));
    let (s, run) = check_requester(&ds[0], false);
    eprintln!("{s}");
    let st: Vec<WcStatus> = run.completions.iter().map(|c| c.status).collect();
    assert_eq!(st, vec![WcStatus::Success, WcStatus::RemAccessErr]);
}

#[test]
fn send_inv() {
    let c = load("send-inv");
    let ds = directions("send-inv", &c.frames, &c.conns[0]);
    let (s, run) = check_responder(&ds[0], false);
    eprintln!("{s}");
    assert_eq!(run.recv.len(), 2);
    assert!(run.recv.iter().all(|c| c.status == WcStatus::Success));
    // the MW was invalidated by the SEND with Invalidate
    let p = ds[0].rep_private.unwrap();
    let mw = u32::from_be_bytes(p[32..36].try_into().unwrap());
    assert_eq!(run.recv[1].invalidated_rkey, mw);
    assert!(!run.mem.regions[&mw].valid);
    let (s, run) = check_requester(&ds[0], false);
    eprintln!("{s}");
    assert!(ok_all(&run.completions) && run.completions.len() == 3);
}

#[test]
fn write_loss() {
    let r = run_case("write-loss", true, true);
    // the captures' README: netem dropped 7 of vm1's 41 data packets (our requester sends
    // them; our responder's ACKs and NAKs are all in the capture)
    assert_eq!((r.requester_dropped, r.responder_dropped), (7, 0));
}

#[test]
fn read_loss() {
    let r = run_case("read-loss", true, true);
    // the captures' README: netem dropped 28 of vm2's 80 READ response packets
    assert_eq!((r.responder_dropped, r.requester_dropped), (28, 0));
}

#[test]
fn psn_helpers_agree_with_capture() {
    // READ requests advance the PSN by one per response packet (read-multipacket)
    let c = load("read-multipacket");
    let data = c.conns.last().unwrap();
    let reads: Vec<PacketRepr> = data
        .frames
        .iter()
        .map(|&i| hdr(&c.frames[i]))
        .filter(|h| h.bth.opcode == Opcode::RcRdmaReadRequest)
        .collect();
    assert_eq!(reads.len(), 5);
    for w in reads.windows(2) {
        assert_eq!(w[1].bth.psn, psn_add(w[0].bth.psn, npkts_of(&w[0])));
    }
}

#[test]
fn ipv6_global() {
    let r = run_case("ipv6-global", true, false);
    assert_eq!(r.directions, 2, "{:#?}", r.lines);
}

#[test]
fn ipv6_linklocal() {
    let r = run_case("ipv6-linklocal", true, false);
    assert_eq!(r.directions, 2, "{:#?}", r.lines);
}

#[test]
fn rping_2vm_rc() {
    let r = run_case("rping-2vm", true, false);
    assert_eq!(r.directions, 4, "{:#?}", r.lines);
}

// ---------------------------------------------------------------------------------------------
// UD (ud-send, mckey-multicast, rping-2vm's udaddy) and UC

/// rdma_cm's Q_Key for UD port spaces (RDMA_UDP_QKEY).
const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// A UD QP of ours in Init -> RTR -> RTS with rdma_cm's Q_Key.
fn ud_qp(qpn: u32, sq_psn: u32) -> rdma_proto::ud::UdQp {
    use rdma_proto::verbs::{QpAttr, QpAttrMask as M, QpState};
    let mut qp = rdma_proto::ud::UdQp::new(rdma_proto::ud::UdConfig::new(qpn, PD));
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qkey: RDMA_UDP_QKEY,
        ..Default::default()
    };
    qp.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .unwrap();
    a.qp_state = QpState::Rtr;
    qp.modify(&a, M::STATE).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = sq_psn;
    qp.modify(&a, M::STATE | M::SQ_PSN).unwrap();
    qp
}

/// Replays every UD datagram of `case` (not to QP1) into a UD QP of ours in place of its
/// receiver (`receiver_qpn`: the QP it answers as; multicast datagrams reach it through
/// 0xFFFFFF), and has a UD QP of ours in place of each sender send the same messages.
/// Receive side: one completion per datagram, in order, with the sender's QPN, the
/// immediate, the GRH (IPv4 header with the datagram's addresses) and the payload byte
/// exact. Send side: the same BTH (wire fields included), DETH, immediate and payload.
/// Returns how many datagrams were replayed.
fn replay_ud(case: &str, receiver_qpn: impl Fn(&PacketRepr) -> u32) -> usize {
    let Pcap { frames, invalid } = read_pcap(case);
    assert_eq!(invalid, invalid_expected(case), "{case}: bad ICRC");
    let ud: Vec<&Frame> = frames
        .iter()
        .filter(|f| matches!(f.data[0], 0x64 | 0x65) && be24(&f.data[5..8]) != 1)
        .collect();
    for (k, f) in ud.iter().enumerate() {
        let p = parse(f).expect("our transport parses a captured UD datagram");
        let h = p.header;
        let deth = h.deth.expect("DETH");
        assert_eq!(deth.q_key, RDMA_UDP_QKEY, "{case}: datagram {k} Q_Key");
        // receive side
        let mut mem = KeyedMem::default();
        mem.register(RECV_KEY, RECV_BASE, 1 << 20, AccessFlags::all());
        let mut rq = ud_qp(receiver_qpn(&h), 0);
        let sge = Sge {
            addr: RECV_BASE,
            length: RECV_LEN,
            lkey: RECV_KEY,
        };
        rq.post_recv(&RecvWr::new(k as u64).with_sge(sge)).unwrap();
        let ip = &f.ip;
        assert_eq!(ip[0] >> 4, 4, "{case}: the UD captures are IPv4");
        let grh = rdma_proto::ud::GrhInfo::V4 {
            src: ip[12..16].try_into().unwrap(),
            dst: ip[16..20].try_into().unwrap(),
            tos: ip[1],
            ttl: ip[8],
        };
        rq.handle_packet(f.ts_ns, &mut mem, &p, &grh);
        let c = rq
            .poll_recv_completion()
            .unwrap_or_else(|| panic!("{case}: datagram {k} not received: {:?}", rq.stats()));
        assert_eq!(
            (c.status, c.wr_id, c.byte_len, c.src_qp, c.imm()),
            (
                WcStatus::Success,
                k as u64,
                (rdma_proto::ud::GRH_LEN + p.payload.len()) as u32,
                deth.src_qp,
                h.imm_dt
            ),
            "{case}: datagram {k} receive completion"
        );
        let mut got = vec![0u8; rdma_proto::ud::GRH_LEN + p.payload.len() + 16];
        mem.get(RECV_BASE, &mut got);
        assert_eq!(got[20], 0x45, "{case}: GRH holds an IPv4 header");
        assert_eq!(&got[32..40], &ip[12..20], "{case}: GRH addresses");
        assert_eq!(&got[40..40 + p.payload.len()], p.payload, "{case}: payload");
        assert!(
            got[40 + p.payload.len()..].iter().all(|&b| b == 0),
            "{case}: beyond it"
        );
        assert!(rq.poll_recv_completion().is_none());
        // the same datagram with another Q_Key is refused and writes nothing
        let mut other = ud_qp(receiver_qpn(&h), 0);
        other
            .modify(
                &rdma_proto::verbs::QpAttr {
                    qkey: RDMA_UDP_QKEY ^ 1,
                    ..Default::default()
                },
                rdma_proto::verbs::QpAttrMask::QKEY,
            )
            .unwrap();
        let mut mem2 = KeyedMem::default();
        mem2.register(RECV_KEY, RECV_BASE, 1 << 20, AccessFlags::all());
        other.post_recv(&RecvWr::new(0).with_sge(sge)).unwrap();
        other.handle_packet(f.ts_ns, &mut mem2, &p, &grh);
        assert!(other.poll_recv_completion().is_none());
        assert_eq!(other.stats().qkey_mismatch, 1);
        assert!(
            mem2.pages.is_empty(),
            "{case}: a refused datagram wrote memory"
        );

        // send side: our QP in place of the sender
        let mut smem = KeyedMem::default();
        smem.register(LOCAL_KEY, LOCAL_BASE, 1 << 20, AccessFlags::all());
        smem.put(LOCAL_BASE, p.payload);
        let mut sq = ud_qp(deth.src_qp, h.bth.psn);
        let op = match h.imm_dt {
            Some(imm) => SendOp::SendWithImm { imm },
            None => SendOp::Send,
        };
        let mut wr = SendWr::new(7, op).with_ud(rdma_proto::verbs::UdDest {
            ah: 0,
            remote_qpn: h.bth.dest_qp,
            remote_qkey: RDMA_UDP_QKEY,
        });
        if !p.payload.is_empty() {
            wr = wr.with_sge(Sge {
                addr: LOCAL_BASE,
                length: p.payload.len() as u32,
                lkey: LOCAL_KEY,
            });
        }
        if h.bth.se {
            wr.flags |= SendFlags::SOLICITED;
        }
        sq.post_send(&smem, &wr).unwrap();
        let mut buf = vec![0u8; 4096];
        let t = sq
            .poll_transmit(f.ts_ns, &mut smem, &mut buf)
            .expect("our UD QP sends");
        let payload = &buf[..t.payload_len];
        assert_eq!(
            (
                Req::of(&t.header, payload, bth_ours(&t.header, payload)),
                t.header.deth
            ),
            (Req::of(&h, p.payload, bth_wire(&f.data)), h.deth),
            "{case}: datagram {k} as we send it"
        );
    }
    ud.len()
}

#[test]
fn ud_send() {
    // the UD test QP: every datagram to QP 0x12 (the SIDR REP's QPN)
    assert_eq!(replay_ud("ud-send", |h| h.bth.dest_qp), 5);
    // and the RC connection of perftest's handshake (crossed DREQs at the end)
    let r = run_case("ud-send", true, false);
    assert_eq!(r.directions, 2, "{:#?}", r.lines);
}

#[test]
fn mckey_multicast() {
    // to 0xFFFFFF: a UD QP of ours (QPN 0x12) attached to the group receives each
    assert_eq!(
        replay_ud("mckey-multicast", |h| {
            assert_eq!(h.bth.dest_qp, rdma_proto::ud::MULTICAST_QPN);
            0x12
        }),
        5
    );
}

#[test]
fn rping_2vm_udaddy() {
    assert_eq!(replay_ud("rping-2vm", |h| h.bth.dest_qp), 4);
}

/// UC is not a transport of ours (librdmacm refuses it too): each UC packet of `uc` is valid
/// at the wire layer and refused by the transport's parser as unsupported, not misread as
/// something else.
#[test]
fn uc_refused_as_unsupported() {
    let Pcap { frames, invalid } = read_pcap("uc");
    assert_eq!(invalid, 0);
    let uc: Vec<&Frame> = frames.iter().filter(|f| f.data[0] >> 5 == 1).collect();
    // 5 SENDs and 5 WRITEs of 2500 B, First/Middle/Last each
    assert_eq!(uc.len(), 30);
    assert_eq!(frames.len(), uc.len(), "uc: only UC packets");
    for f in uc {
        let p = rdma_wire::packet::Packet::new_checked(&f.data[..]).expect("wire layout");
        rdma_wire::packet::PacketRepr::parse(&p, IcrcCheck::Skip).expect("wire parse");
        assert_eq!(
            wire::parse(&f.data, IcrcCheck::Skip).err(),
            Some(wire::ParseError::Unsupported),
            "UC opcode {:#04x}",
            f.data[0]
        );
    }
}
