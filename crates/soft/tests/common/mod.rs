//! Helpers of the QP tests: devices on loopback addresses, connected RC QPs, transfers
//! driven from two threads, and a data pattern with its checksum.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use rdma_soft::io::{FaultSpec, UdpConfig, UdpWire, WireAddr};
use rdma_soft::verbs::*;

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
        let end = Instant::now() + LIMIT;
        loop {
            if let Some(c) = self.cq.poll_one() {
                return c;
            }
            assert!(Instant::now() < end, "no completion within {LIMIT:?}");
        }
    }

    /// Waits for one successful completion.
    pub fn next_ok(&self) -> Completion {
        let c = self.next();
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        c
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
