//! Helpers of the QP tests: devices on loopback addresses, connected RC QPs, transfers
//! driven from two threads, and a data pattern with its checksum.
#![allow(dead_code)]

pub mod raw;

use std::time::{Duration, Instant};

use rdma_soft::io::{FaultSpec, UdpConfig, UdpWire, WireAddr};
use rdma_soft::verbs::*;

/// A raw RC SEND_ONLY packet of `len` bytes (ICRC room included) to QPN 0x11 with `tag` as
/// its PSN and first payload bytes, the rest a pattern of the tag: for tests of the UDP wire
/// itself (no QP behind it).
pub fn send_only(tag: u16, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len];
    p[0] = 0x04;
    p[2..4].copy_from_slice(&[0xff, 0xff]);
    p[7] = 0x11;
    p[8..12].copy_from_slice(&u32::from(tag).to_be_bytes());
    p[12..14].copy_from_slice(&tag.to_be_bytes());
    for (i, b) in p[14..len - 4].iter_mut().enumerate() {
        *b = (i as u8) ^ (tag as u8);
    }
    p
}

/// Bytes to move per test: `RDMA_SOFT_BYTES` (default 64 MiB), rounded up to whole chunks.
pub fn bytes_from_env(default: usize) -> usize {
    let n = std::env::var("RDMA_SOFT_BYTES")
        .ok()
        .and_then(|s| parse_size(&s))
        .unwrap_or(default);
    n.div_ceil(CHUNK).max(1) * CHUNK
}

/// "64M", "1G", "4096".
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().map(|n| n * mul)
}

/// Message size of the bulk transfers.
pub const CHUNK: usize = 1 << 20;
/// Messages in flight.
pub const DEPTH: usize = 8;
/// Wall-clock limit of one wait.
pub const LIMIT: Duration = Duration::from_secs(300);

/// A device on `lo` whose GID table holds `ip`, with faults as given (None: from the
/// environment).
pub fn device(ip: &str, faults: Option<&str>) -> Device {
    let mut cfg = DeviceConfig::for_netdev("lo").unwrap();
    cfg.gids = vec![ip.parse().unwrap()];
    match faults {
        None => Device::open(cfg).unwrap(),
        Some(spec) => {
            let wire = UdpWire::new(UdpConfig {
                faults: Some(spec.parse::<FaultSpec>().unwrap()),
                ..UdpConfig::default()
            })
            .unwrap();
            Device::open_with_wire(cfg, Box::new(wire)).unwrap()
        }
    }
}

/// One end: device, PD, one CQ for both queues, an RC QP, a region of `len` bytes.
pub struct Side {
    pub gid: [u8; 16],
    pub qp: QueuePair,
    pub mr: MemoryRegion,
    pub cq: CompletionQueue,
    pub pd: ProtectionDomain,
    pub dev: Device,
}

impl Side {
    pub fn new(ip: &str, len: usize, faults: Option<&str>) -> Side {
        let dev = device(ip, faults);
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(4096, None).unwrap();
        let mut init = QpInitAttr::rc(&cq, &cq);
        init.cap.max_recv_wr = 1024;
        init.cap.max_send_wr = 256;
        let qp = pd.create_qp(&init).unwrap();
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mr = pd.register(vec![0u8; len], access).unwrap();
        let gid = ip.parse::<WireAddr>().unwrap().gid();
        Side {
            gid,
            qp,
            mr,
            cq,
            pd,
            dev,
        }
    }

    /// Waits for one completion (driving the device), panicking after [`LIMIT`].
    pub fn next(&self) -> Completion {
        poll_within(&self.cq, LIMIT, "completion")
    }

    /// Waits for one successful completion.
    pub fn next_ok(&self) -> Completion {
        let c = self.next();
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        c
    }
}

/// Busy-polls `cq` (each poll drives the device) until a completion comes, panicking after
/// `limit` with `what` in the message.
pub fn poll_within(cq: &CompletionQueue, limit: Duration, what: &str) -> Completion {
    let end = Instant::now() + limit;
    loop {
        if let Some(c) = cq.poll_one() {
            return c;
        }
        assert!(Instant::now() < end, "no {what} within {limit:?}");
    }
}

/// Connects two sides by hand: each expects the PSN the other sends from.
pub fn connect(a: &Side, b: &Side) {
    let (psn_a, psn_b) = (0x00_1000, 0xFF_FFF0); // b wraps around 2^24 early
    a.qp.connect(b.qp.qpn(), psn_b, psn_a, b.gid).unwrap();
    b.qp.connect(a.qp.qpn(), psn_a, psn_b, a.gid).unwrap();
}

/// Fills `mr[off..off+len]` with a pattern from `seed`.
pub fn fill(mr: &MemoryRegion, off: usize, len: usize, seed: u64) {
    let mut x = seed | 1;
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done);
        for w in buf[..n].chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            w.copy_from_slice(&b[..w.len()]);
        }
        mr.write(off + done, &buf[..n]).unwrap();
        done += n;
    }
}

/// CRC-32 of `mr[off..off+len]`.
pub fn crc(mr: &MemoryRegion, off: usize, len: usize) -> u32 {
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done);
        mr.read(off + done, &mut buf[..n]).unwrap();
        h.update(&buf[..n]);
        done += n;
    }
    h.finalize()
}

/// Sends `len` bytes from `from.mr[src..]` as SENDs of [`CHUNK`], [`DEPTH`] in flight.
pub fn send_stream(from: &Side, src: usize, len: usize) {
    let n = len / CHUNK;
    let (mut posted, mut done) = (0, 0);
    while done < n {
        while posted < n && posted - done < DEPTH {
            let sge = from.mr.sge(src + posted * CHUNK, CHUNK as u32).unwrap();
            let wr = SendWr::new(posted as u64, SendOp::Send)
                .with_sge(sge)
                .signaled();
            from.qp.post_send(&wr).unwrap();
            posted += 1;
        }
        let c = from.next_ok();
        assert_eq!(c.opcode, WcOpcode::Send);
        done += 1;
    }
}

/// Receives `len` bytes of SENDs into `to.mr[dst..]`, in order.
pub fn recv_stream(to: &Side, dst: usize, len: usize) {
    let n = len / CHUNK;
    let (mut posted, mut done) = (0, 0);
    while done < n {
        while posted < n && posted - done < 4 * DEPTH {
            let sge = to.mr.sge(dst + posted * CHUNK, CHUNK as u32).unwrap();
            to.qp
                .post_recv(&RecvWr::new(posted as u64).with_sge(sge))
                .unwrap();
            posted += 1;
        }
        let c = to.next_ok();
        assert_eq!(
            (c.opcode, c.wr_id, c.byte_len),
            (WcOpcode::Recv, done as u64, CHUNK as u32)
        );
        done += 1;
    }
}

/// WRITEs `len` bytes from `from.mr[src..]` to `va`/`rkey`, the last one with immediate
/// `imm` (which consumes a receive at the target).
pub fn write_stream(from: &Side, src: usize, len: usize, va: u64, rkey: u32, imm: u32) {
    let n = len / CHUNK;
    let (mut posted, mut done) = (0, 0);
    while done < n {
        while posted < n && posted - done < DEPTH {
            let off = posted * CHUNK;
            let remote_addr = va + off as u64;
            let op = if posted + 1 == n {
                SendOp::RdmaWriteWithImm {
                    remote_addr,
                    rkey,
                    imm,
                }
            } else {
                SendOp::RdmaWrite { remote_addr, rkey }
            };
            let sge = from.mr.sge(src + off, CHUNK as u32).unwrap();
            from.qp
                .post_send(&SendWr::new(posted as u64, op).with_sge(sge).signaled())
                .unwrap();
            posted += 1;
        }
        let c = from.next_ok();
        assert_eq!(c.opcode, WcOpcode::RdmaWrite);
        done += 1;
    }
}

/// READs `len` bytes from `va`/`rkey` into `to.mr[dst..]`, in messages of [`CHUNK`] / 4 with
/// [`DEPTH`] in flight (a READ's responses are not paced by ACKs: keep them few).
pub fn read_stream(to: &Side, dst: usize, len: usize, va: u64, rkey: u32) {
    let chunk = CHUNK / 4;
    let n = len / chunk;
    let (mut posted, mut done) = (0, 0);
    while done < n {
        while posted < n && posted - done < DEPTH {
            let off = posted * chunk;
            let sge = to.mr.sge(dst + off, chunk as u32).unwrap();
            let op = SendOp::RdmaRead {
                remote_addr: va + off as u64,
                rkey,
            };
            to.qp
                .post_send(&SendWr::new(posted as u64, op).with_sge(sge).signaled())
                .unwrap();
            posted += 1;
        }
        let c = to.next_ok();
        assert_eq!(c.opcode, WcOpcode::RdmaRead);
        done += 1;
    }
}

/// Drives `side` until `stop` is set (the passive end of a READ).
pub fn serve(side: &Side, stop: &std::sync::atomic::AtomicBool) {
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        if let Some(c) = side.cq.poll_one() {
            panic!("unexpected completion at the passive side: {c:?}");
        }
    }
}

/// A device on `netdev` whose GID table holds `ip`, with exactly the faults given (None: no
/// faults, whatever `RDMA_SOFT_FAULTS` says). Open it in the thread (and network namespace)
/// whose sockets it should use.
pub fn device_on(netdev: &str, ip: &str, faults: Option<FaultSpec>) -> Device {
    device_with(
        netdev,
        ip,
        UdpConfig {
            faults,
            ..UdpConfig::default()
        },
    )
}

/// [`device_on`] with the wire configured as `udp` says.
#[allow(dead_code)]
pub fn device_with(netdev: &str, ip: &str, udp: UdpConfig) -> Device {
    let mut cfg = DeviceConfig::for_netdev(netdev).unwrap();
    cfg.gids = vec![ip.parse().unwrap()];
    let wire = UdpWire::new(udp).unwrap();
    Device::open_with_wire(cfg, Box::new(wire)).unwrap()
}

/// The attributes [`connect_with`] gives a QP on its way to RTS.
#[derive(Debug, Clone, Copy)]
pub struct ConnOpts {
    /// Path MTU (None: the port's active MTU).
    pub mtu: Option<Mtu>,
    /// Local ACK timeout exponent (4.096 us * 2^timeout; 10 = 4 ms).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// READs/atomics in flight each way (initiator depth and responder resources).
    pub rd_atomic: u8,
}

impl Default for ConnOpts {
    /// A short ACK timeout (10: 4 ms) for fast recovery from injected loss, 7 retries, 16
    /// READs/atomics, the port's MTU.
    fn default() -> ConnOpts {
        ConnOpts {
            mtu: None,
            timeout: 10,
            retry_cnt: 7,
            rd_atomic: 16,
        }
    }
}

/// Moves `qp` of `dev` through Init and RTR to RTS as [`QueuePair::connect`] does (source
/// GID index 0, all remote access, infinite RNR retries, RNR timer 12), with the MTU, ACK
/// timeout, retries and READ/atomic depth of `o`.
pub fn connect_with(
    dev: &Device,
    qp: &QueuePair,
    dest_qpn: u32,
    rq_psn: u32,
    sq_psn: u32,
    dgid: [u8; 16],
    o: &ConnOpts,
) {
    use QpAttrMask as M;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        port_num: 1,
        ..QpAttr::default()
    };
    qp.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    a.qp_state = QpState::Rtr;
    a.path.dgid = dgid;
    a.path.hop_limit = 64;
    a.path_mtu = o
        .mtu
        .unwrap_or_else(|| dev.query_port(1).unwrap().active_mtu);
    a.dest_qp_num = dest_qpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = o.rd_atomic;
    a.min_rnr_timer = 12;
    qp.modify(
        &a,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )
    .unwrap();
    a.qp_state = QpState::Rts;
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = 7;
    a.sq_psn = sq_psn;
    a.max_rd_atomic = o.rd_atomic;
    qp.modify(
        &a,
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

/// Waits on `ch` as a user sleeping on a completion channel does (arm `cq`, sleep in
/// `wait_event`, take what is queued) until `want` completions have arrived or `limit` has
/// passed; returns those that came, in order. It never drives the device itself: every
/// completion it returns was queued by the progress engine, so a stalled engine or a lost
/// wake-up shows as missing completions, not as a pass.
pub fn wait_completions(
    cq: &CompletionQueue,
    ch: &CompletionChannel,
    want: usize,
    limit: Duration,
) -> Vec<Completion> {
    let end = Instant::now() + limit;
    let mut got = Vec::with_capacity(want);
    // only what the engine queued: `poll` would drive the device inline
    let take = |got: &mut Vec<Completion>| cq.poll_queued(got, want - got.len());
    loop {
        take(&mut got);
        if got.len() >= want {
            return got;
        }
        cq.req_notify(false).unwrap();
        // a completion queued between the take and the arming gives no event
        if take(&mut got) > 0 {
            continue;
        }
        let now = Instant::now();
        if now >= end {
            return got;
        }
        // the event only wakes us; what it announces is taken above
        if ch.wait_event(Some(end - now)).unwrap().is_none() {
            return got;
        }
    }
}

/// One end of a [`host_local_pair`]: device, PD, CQ (send and receive) and RC QP.
pub type LocalEnd = (Device, ProtectionDomain, CompletionQueue, QueuePair);

/// Two RC QPs on devices `open(ip_a)` and `open(ip_b)` of this process, put on the
/// host-local wire (what a CM does for peers on this host, before RTR) and connected.
pub fn host_local_pair(
    open: impl Fn(&str) -> Device,
    ip_a: &str,
    ip_b: &str,
) -> (LocalEnd, LocalEnd) {
    let (a, _) = local_end(&open, ip_a, false);
    let (b, _) = local_end(&open, ip_b, false);
    connect_local(&a, &b, ip_a, ip_b);
    (a, b)
}

/// [`host_local_pair`] whose second QP takes its receives from an SRQ (returned).
pub fn host_local_pair_srq(
    open: impl Fn(&str) -> Device,
    ip_a: &str,
    ip_b: &str,
) -> (LocalEnd, LocalEnd, SharedReceiveQueue) {
    let (a, _) = local_end(&open, ip_a, false);
    let (b, srq) = local_end(&open, ip_b, true);
    connect_local(&a, &b, ip_a, ip_b);
    (a, b, srq.unwrap())
}

/// Device, PD, CQ and RC QP on `open(ip)`; with `srq`, the QP on a new SRQ of the PD.
fn local_end(
    open: &impl Fn(&str) -> Device,
    ip: &str,
    srq: bool,
) -> (LocalEnd, Option<SharedReceiveQueue>) {
    let dev = open(ip);
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64, None).unwrap();
    let srq = srq.then(|| dev.create_srq(&pd, 16, 4).unwrap());
    let mut init = QpInitAttr::rc(&cq, &cq);
    init.srq = srq.as_ref();
    let qp = pd.create_qp(&init).unwrap();
    ((dev, pd, cq, qp), srq)
}

/// Puts `a` and `b` on the host-local wire to each other and connects them.
fn connect_local(a: &LocalEnd, b: &LocalEnd, ip_a: &str, ip_b: &str) {
    let (ha, hb) = (a.0.host_local().unwrap(), b.0.host_local().unwrap());
    a.3.use_host_local(hb).unwrap();
    b.3.use_host_local(ha).unwrap();
    let gid = |ip: &str| ip.parse::<WireAddr>().unwrap().gid();
    a.3.connect(b.3.qpn(), 100, 200, gid(ip_b)).unwrap();
    b.3.connect(a.3.qpn(), 200, 100, gid(ip_a)).unwrap();
    assert!(a.3.host_peer().is_some(), "the host-local wire");
}
