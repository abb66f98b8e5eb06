//! Helpers of the path migration tests: two-port devices, RC pairs with an armed alternate
//! path, a wire that blackholes one local address on demand, and a verified stream of
//! SENDs and WRITEs with immediate from one registered region.
#![allow(dead_code)]

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_soft::io::{Arrival, DatagramWire, TxMeta, UdpConfig, UdpWire, WireAddr, WireStats};
use rdma_soft::verbs::*;

/// Hang guard of every wait.
pub const HANG: Duration = Duration::from_secs(120);

pub fn addr(s: &str) -> WireAddr {
    s.parse().unwrap()
}

/// Messages of a stream: `RDMA_SOFT_APM_MSGS` (default 256).
pub fn msgs_from_env() -> usize {
    std::env::var("RDMA_SOFT_APM_MSGS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
        .max(4)
}

/// A two-port device config on `lo`: port 1 (MTU 65536) holds `ips[0]`, port 2 (MTU 1500)
/// `ips[1]`.
pub fn two_port_lo(ips: [&str; 2]) -> DeviceConfig {
    let mut cfg = DeviceConfig::for_netdev("lo").unwrap();
    cfg.name = "grp".into();
    cfg.gids = vec![addr(ips[0])];
    cfg.more_ports = vec![PortConfig {
        netdev: "lo".into(),
        netdev_mtu: 1500,
        up: true,
        gids: vec![addr(ips[1])],
    }];
    cfg
}

/// A UDP wire that drops every datagram sent from or arriving at some local addresses
/// while switched on: paths that fail without the device being told.
pub struct Blackhole {
    inner: UdpWire,
    addrs: Vec<WireAddr>,
    on: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
}

/// The switch of a [`Blackhole`] and its count of dropped datagrams.
#[derive(Clone, Default)]
pub struct BlackholeSwitch {
    pub on: Arc<AtomicBool>,
    pub dropped: Arc<AtomicU64>,
}

impl Blackhole {
    pub fn new(addrs: &[WireAddr]) -> (Blackhole, BlackholeSwitch) {
        let sw = BlackholeSwitch::default();
        let w = Blackhole {
            inner: UdpWire::new(UdpConfig::from_env().unwrap()).unwrap(),
            addrs: addrs.to_vec(),
            on: sw.on.clone(),
            dropped: sw.dropped.clone(),
        };
        (w, sw)
    }

    fn hole(&self, local: WireAddr) -> bool {
        let h = self.addrs.contains(&local) && self.on.load(Ordering::Relaxed);
        if h {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        h
    }
}

impl DatagramWire for Blackhole {
    fn max_packet(&self) -> usize {
        self.inner.max_packet()
    }
    fn open(&mut self, local: WireAddr) -> rdma_soft::Result<()> {
        self.inner.open(local)
    }
    fn close(&mut self, local: WireAddr) -> bool {
        self.inner.close(local)
    }
    fn is_open(&self, local: WireAddr) -> bool {
        self.inner.is_open(local)
    }
    fn send_with(
        &mut self,
        from: WireAddr,
        to: WireAddr,
        meta: TxMeta,
        packet: &[u8],
    ) -> rdma_soft::Result<()> {
        if self.hole(from) {
            return Ok(());
        }
        self.inner.send_with(from, to, meta, packet)
    }
    fn send_from_port(
        &mut self,
        from: WireAddr,
        to: WireAddr,
        sport: u16,
        meta: TxMeta,
        packet: &[u8],
    ) -> rdma_soft::Result<()> {
        if self.hole(from) {
            return Ok(());
        }
        self.inner.send_from_port(from, to, sport, meta, packet)
    }
    fn prepare_port(&mut self, local: WireAddr, sport: u16) {
        self.inner.prepare_port(local, sport)
    }
    fn flush(&mut self) -> rdma_soft::Result<()> {
        self.inner.flush()
    }
    fn recv(&mut self, deliver: &mut dyn FnMut(&Arrival, &[u8])) -> rdma_soft::Result<usize> {
        let (addrs, on, dropped) = (&self.addrs, self.on.clone(), self.dropped.clone());
        self.inner.recv(&mut |arr, b| {
            if addrs.contains(&arr.local) && on.load(Ordering::Relaxed) {
                dropped.fetch_add(1, Ordering::Relaxed);
            } else {
                deliver(arr, b)
            }
        })
    }
    fn recv_drained(&self) -> bool {
        self.inner.recv_drained()
    }
    fn share_slot(&mut self) -> rdma_soft::Result<Option<u8>> {
        self.inner.share_slot()
    }
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.wait_fd()
    }
    fn next_deadline(&self) -> Option<Instant> {
        self.inner.next_deadline()
    }
    fn stats(&self) -> WireStats {
        self.inner.stats()
    }
}

/// One end: a device, a PD, send and receive CQs, an RC QP, one region of `len` bytes.
pub struct End {
    pub qp: QueuePair,
    pub mr: MemoryRegion,
    pub scq: CompletionQueue,
    pub rcq: CompletionQueue,
    pub pd: ProtectionDomain,
    pub dev: Device,
}

pub fn end(dev: Device, len: usize, max_recv: u32) -> End {
    let pd = dev.alloc_pd().unwrap();
    let scq = dev.create_cq(1024, None).unwrap();
    let rcq = dev.create_cq(max_recv as usize + 16, None).unwrap();
    let mut init = QpInitAttr::rc(&scq, &rcq);
    init.cap.max_recv_wr = max_recv;
    let qp = pd.create_qp(&init).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = pd.register(vec![0u8; len], access).unwrap();
    End {
        qp,
        mr,
        scq,
        rcq,
        pd,
        dev,
    }
}

/// Connects `x` to `y` with the primary on port 1 to `y_ips[0]` and the alternate on port 2
/// to `y_ips[1]`, armed; `x` expects `rq_psn` and sends from `sq_psn`.
pub fn connect_armed(x: &End, y: &End, y_ips: [&str; 2], rq_psn: u32, sq_psn: u32) {
    x.qp.connect_with_alt(
        (1, addr(y_ips[0]).gid()),
        (2, addr(y_ips[1]).gid()),
        y.qp.qpn(),
        rq_psn,
        sq_psn,
    )
    .unwrap();
    let q = x.qp.query().unwrap();
    assert_eq!(q.path_mig_state, MigState::Armed);
    assert_eq!((q.port_num, q.alt_port_num), (1, 2));
    assert_eq!(q.alt_path.dgid, addr(y_ips[1]).gid());
}

pub fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ salt)
        .collect()
}

/// A stream of `n` messages of `size` bytes from `a` to `b`, `depth` in flight.
#[derive(Debug, Clone, Copy)]
pub struct Stream {
    pub n: usize,
    pub size: usize,
    pub depth: usize,
}

impl Stream {
    /// Bytes `a`'s and `b`'s regions need.
    pub fn region(&self) -> usize {
        (self.n + 1) * self.size
    }
}

const MARKER: &[u8] = b"the end!";

/// Runs the stream: message k goes from slot k of `a`'s region to slot k of `b`'s, as a
/// SEND (k even) or a WRITE with immediate k (k odd). `tick(sent, posted)` runs after every
/// round of posting (`sent`: send completions so far), for the test to break a path
/// mid-stream. A marker SEND follows. Checks every send completion once and in order, every
/// receive once and in order (opcode, length, immediate; one spare receive stays unused,
/// so a message executed twice would show), `b`'s region byte for byte, and that the same
/// region and keys served the whole stream. Returns the times of every completion, both
/// sides.
pub fn run_stream(a: &End, b: &End, s: Stream, mut tick: impl FnMut(usize, usize)) -> Vec<Instant> {
    let data = pattern(s.n * s.size, 0x5a);
    a.mr.write(0, &data).unwrap();
    a.mr.write(s.n * s.size, MARKER).unwrap();
    b.mr.fill(0, s.region(), 0).unwrap();
    let (lkey, rkey) = (a.mr.lkey(), b.mr.rkey());
    for k in 0..=s.n + 1 {
        let slot = k.min(s.n) * s.size;
        let wr = RecvWr::new(k as u64).with_sge(b.mr.sge(slot, s.size as u32).unwrap());
        b.qp.post_recv(&wr).unwrap();
    }
    let msg = |k: usize| {
        let sge = a.mr.sge(k * s.size, s.size as u32).unwrap();
        let op = if k % 2 == 0 {
            SendOp::Send
        } else {
            SendOp::RdmaWriteWithImm {
                remote_addr: b.mr.addr() + (k * s.size) as u64,
                rkey: b.mr.rkey(),
                imm: k as u32,
            }
        };
        SendWr::new(k as u64, op).with_sge(sge).signaled()
    };
    let end = Instant::now() + HANG;
    let (mut posted, mut sent, mut rcvd) = (0usize, 0usize, 0usize);
    let mut times = Vec::with_capacity(2 * s.n + 2);
    let mut wc = Vec::new();
    let check_send = |c: &Completion, sent: &mut usize| {
        assert_eq!(c.status, WcStatus::Success, "send {sent}: {c:?}");
        assert_eq!(c.wr_id, *sent as u64, "send completions in order, once");
        *sent += 1;
    };
    let check_recv = |c: &Completion, k: usize| {
        assert_eq!(c.status, WcStatus::Success, "receive {k}: {c:?}");
        assert_eq!(c.wr_id, k as u64, "receives in order, once");
        if k == s.n {
            assert_eq!(
                (c.opcode, c.byte_len),
                (WcOpcode::Recv, MARKER.len() as u32)
            );
        } else if k % 2 == 0 {
            assert_eq!(
                (c.opcode, c.byte_len, c.imm()),
                (WcOpcode::Recv, s.size as u32, None)
            );
        } else {
            let want = (WcOpcode::RecvRdmaWithImm, s.size as u32, Some(k as u32));
            assert_eq!((c.opcode, c.byte_len, c.imm()), want);
        }
    };
    while sent < s.n + 1 || rcvd < s.n + 1 {
        assert!(
            Instant::now() < end,
            "HANG: {sent} sends and {rcvd} receives of {} completed",
            s.n + 1
        );
        while posted < s.n && posted - sent < s.depth {
            a.qp.post_send(&msg(posted)).unwrap();
            posted += 1;
        }
        if sent == s.n && posted == s.n {
            let m = SendWr::new(s.n as u64, SendOp::Send)
                .with_sge(a.mr.sge(s.n * s.size, MARKER.len() as u32).unwrap())
                .signaled();
            a.qp.post_send(&m).unwrap();
            posted += 1;
        }
        tick(sent, posted);
        // (both QPs may have the same number: they are on two devices)
        wc.clear();
        let ns = a.scq.poll(&mut wc, 64);
        let nr = b.rcq.poll(&mut wc, 64);
        if ns + nr == 0 {
            std::thread::sleep(Duration::from_micros(100));
            continue;
        }
        let now = Instant::now();
        for (i, c) in wc.iter().enumerate() {
            times.push(now);
            if i < ns {
                check_send(c, &mut sent);
            } else {
                check_recv(c, rcvd);
                rcvd += 1;
            }
        }
    }
    // nothing more: the spare receive is unused, no send completed twice
    wc.clear();
    assert_eq!(b.rcq.poll(&mut wc, 8), 0, "an extra receive: {wc:?}");
    assert_eq!(
        a.scq.poll(&mut wc, 8),
        0,
        "an extra send completion: {wc:?}"
    );
    let mut got = vec![0u8; s.n * s.size];
    b.mr.read(0, &mut got).unwrap();
    if let Some(i) = got.iter().zip(&data).position(|(x, y)| x != y) {
        panic!("byte {i} (message {}) arrived changed", i / s.size);
    }
    assert_eq!((a.mr.lkey(), b.mr.rkey()), (lkey, rkey));
    assert_eq!(
        (a.dev.mr_count(), b.dev.mr_count()),
        (1, 1),
        "re-registered"
    );
    times
}

/// One WRITE of `len` bytes (at most the regions' size) from the start of `a`'s region to
/// the start of `b`'s, waited for and checked byte for byte.
pub fn write_once(a: &End, b: &End, len: usize) {
    let len = len.min(a.mr.len()).min(b.mr.len());
    let data = pattern(len, 0xc3);
    a.mr.write(0, &data).unwrap();
    let op = SendOp::RdmaWrite {
        remote_addr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    let wr = SendWr::new(77, op)
        .with_sge(a.mr.sge(0, len as u32).unwrap())
        .signaled();
    a.qp.post_send(&wr).unwrap();
    let end = Instant::now() + HANG;
    let mut wc = Vec::new();
    while a.scq.poll(&mut wc, 1) == 0 {
        assert!(Instant::now() < end, "HANG: the WRITE never completed");
        std::thread::sleep(Duration::from_micros(100));
    }
    assert_eq!((wc[0].wr_id, wc[0].status), (77, WcStatus::Success));
    let mut got = vec![0u8; len];
    b.mr.read(0, &mut got).unwrap();
    assert!(got == data, "the WRITE arrived changed");
}

/// Loads the alternate path on port `port` to `dgid` in RTS, in Rearm (after the CM's
/// LAP/APR, as on the return to a restored primary).
pub fn rearm(e: &End, port: u8, dgid: [u8; 16]) {
    let a = QpAttr {
        alt_path: PathAttr {
            dgid,
            hop_limit: 64,
            ..PathAttr::default()
        },
        alt_port_num: port,
        path_mig_state: MigState::Rearm,
        ..QpAttr::default()
    };
    e.qp.modify(&a, QpAttrMask::ALT_PATH | QpAttrMask::PATH_MIG_STATE)
        .unwrap();
    let q = e.qp.query().unwrap();
    assert_eq!((q.alt_port_num, q.path_mig_state), (port, MigState::Rearm));
}

/// The longest time between two consecutive completions.
pub fn longest_gap(times: &[Instant]) -> Duration {
    times
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .max()
        .unwrap_or_default()
}

/// Waits for `dev`'s next async event that is not a port event.
pub fn next_qp_event(dev: &Device) -> AsyncEvent {
    let end = Instant::now() + HANG;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match dev.wait_async_event(Some(left)).unwrap() {
            Some(AsyncEvent::PortActive { .. } | AsyncEvent::PortError { .. }) => {}
            Some(e) => return e,
            None => panic!("HANG: no async event within {HANG:?}"),
        }
    }
}

/// Both ends on port 2 after a migration, the peer following by `Peer`.
pub fn assert_migrated(a: &End, b: &End, a_cause: MigrationCause) {
    let ea = next_qp_event(&a.dev);
    let eb = next_qp_event(&b.dev);
    let mig = |qpn, cause| AsyncEvent::PathMigrated {
        qpn,
        cause,
        from_port: 1,
        to_port: 2,
    };
    assert_eq!(ea, mig(a.qp.qpn(), a_cause));
    assert_eq!(eb, mig(b.qp.qpn(), MigrationCause::Peer));
    for e in [a, b] {
        let q = e.qp.query().unwrap();
        assert_eq!((q.port_num, q.path_mig_state), (2, MigState::Migrated));
        assert_eq!(q.qp_state, QpState::Rts);
        assert_eq!(e.qp.last_rx_port(), Some(2));
        assert_eq!(e.dev.poll_async_event(), None, "one migration only");
    }
}
