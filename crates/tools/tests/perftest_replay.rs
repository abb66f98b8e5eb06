//! rdma-perf's `-R` mode against a model of perftest 6.29's side of the exchange, both roles,
//! the six tests. The model is written from perftest's source (`perftest_communication.c`,
//! `perftest_resources.c`, `{send,write,read}_{lat,bw}.c`), not from rdma-perf: its own
//! rdma_cm communication connection with one receive posted at a time (`post_one_recv_wqe`),
//! every message read with the size perftest's `memcpy` takes and checked against it, the
//! handshakes in each test's order, its buffers laid out as perftest's (`BUFF_SIZE`,
//! `vaddr = buf + (num_qps + i) * BUFF_SIZE`, receives of exactly `size` bytes) so that an
//! access of ours outside them fails, and its data loops (`run_iter_lat_send`,
//! `run_iter_lat_write`, `run_iter_lat`, `run_iter_bw`, `run_iter_bw_server`). The peer is
//! the real `rdma-perf` process on another loopback address. See `docs/PERFTEST.md`.
//!
//! The `old_*` cases model perftest 4.5 (Debian 12's, which announces 6.06): no parameter
//! negotiation and a 56-byte `pingpong_dest` (no `tail_markers_vaddr`), checked against
//! Linux's `ib_send_lat -R` / `ib_write_bw -R` in the reference VM.

use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_soft::verbs::{
    AccessFlags, CompletionQueue, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair, RecvWr,
    SendOp, SendWr, WcOpcode,
};
use rdmacm::cm::{CmId, Cma, ConnParam, Event, EventChannel, EventType, PortSpace};

const PERF: &str = env!("CARGO_BIN_EXE_rdma-perf");
const SYNC_SPEC_ID: u64 = 5;
const PAGE: usize = 4096;
const CACHE_LINE: usize = 64;
/// What the model's device offers (`max_qp_rd_atom`).
const MODEL_RD_ATOM: u32 = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verb {
    Send = 0,
    Write = 2,
    Read = 4,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    name: &'static str,
    verb: Verb,
    bw: bool,
    size: usize,
    iters: u64,
    qps: u32,
    /// perftest 6.06 (Debian 12's perftest 4.5) rather than 6.29.
    old: bool,
}

fn case(name: &'static str, size: usize, iters: u64, qps: u32) -> Case {
    let verb = match &name[..4] {
        "send" => Verb::Send,
        "writ" => Verb::Write,
        _ => Verb::Read,
    };
    Case {
        name,
        verb,
        bw: name.ends_with("_bw"),
        size,
        iters,
        qps,
        old: false,
    }
}

/// The same case as perftest 6.06 runs it.
fn old(c: Case) -> Case {
    Case { old: true, ..c }
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_ev(ch: &EventChannel, want: EventType) -> Event {
    let ev = ch
        .get_event_timeout(Duration::from_secs(20))
        .expect("get_event")
        .unwrap_or_else(|| panic!("no {}", want.name()));
    assert_eq!(ev.kind(), want, "event {ev:?}");
    ev
}

/// perftest's `user_comm`: an RC QP with one receive posted (`post_one_recv_wqe`), SENDs
/// of `wr_id` SYNC_SPEC_ID, each waited for (`rdma_write_data` / `rdma_read_data`).
struct ModelComm {
    ch: EventChannel,
    id: CmId,
    qp: Arc<QueuePair>,
    cq: CompletionQueue,
    mr: MemoryRegion,
    client: bool,
    /// sizeof(struct pingpong_dest) in the modelled version.
    dest_len: usize,
    _pd: ProtectionDomain,
}

impl ModelComm {
    fn new(ch: EventChannel, id: CmId, client: bool, c: &Case) -> ModelComm {
        let dev = id.device().expect("device");
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(8, None).unwrap();
        // buf[0]: receives land at 0 and sends go from 0, as perftest's one buffer.
        let mr = pd
            .register(vec![0u8; 2 * PAGE], AccessFlags::LOCAL_WRITE)
            .unwrap();
        let mut init = QpInitAttr::rc(&cq, &cq);
        init.cap.max_send_wr = 1;
        init.cap.max_recv_wr = 1;
        let qp = id.create_qp(&pd, &init).unwrap();
        let c = ModelComm {
            ch,
            id,
            qp,
            cq,
            mr,
            client,
            dest_len: if c.old { 56 } else { 64 },
            _pd: pd,
        };
        c.post_one_recv_wqe();
        c
    }

    fn post_one_recv_wqe(&self) {
        // MAX(sizeof(struct pingpong_dest), sizeof(struct perftest_parameters_negotiate)).
        let sge = self.mr.sge(0, 312).unwrap();
        self.qp
            .post_recv(&RecvWr::new(SYNC_SPEC_ID).with_sge(sge))
            .unwrap();
    }

    fn poll(&self, what: &str) -> rdma_soft::verbs::Completion {
        let hang = Instant::now() + HANG;
        loop {
            if let Some(c) = self.cq.poll_one() {
                assert!(c.status.is_success(), "{what}: {c:?}");
                assert_eq!(c.wr_id, SYNC_SPEC_ID, "{what}");
                return c;
            }
            assert!(
                Instant::now() < hang,
                "{what}: hang, nothing on the communication QP"
            );
            std::thread::yield_now();
        }
    }

    /// rdma_write_data; a receive completing first is kept for the next read.
    fn write(&self, data: &[u8], pending: &mut Option<Vec<u8>>) {
        self.mr.write(0, data).unwrap();
        let sge = self.mr.sge(0, data.len() as u32).unwrap();
        self.qp
            .post_send(
                &SendWr::new(SYNC_SPEC_ID, SendOp::Send)
                    .with_sge(sge)
                    .signaled(),
            )
            .unwrap();
        loop {
            let c = self.poll("send");
            if c.opcode == WcOpcode::Send {
                return;
            }
            assert!(pending.is_none(), "two messages without an answer");
            *pending = Some(self.take(&c));
        }
    }

    fn take(&self, c: &rdma_soft::verbs::Completion) -> Vec<u8> {
        assert_eq!(c.opcode, WcOpcode::Recv);
        let mut b = vec![0u8; c.byte_len as usize];
        self.mr.read(0, &mut b).unwrap();
        self.post_one_recv_wqe();
        b
    }

    fn read(&self, pending: &mut Option<Vec<u8>>) -> Vec<u8> {
        if let Some(b) = pending.take() {
            return b;
        }
        let c = self.poll("recv");
        self.take(&c)
    }

    /// ctx_xchg_data: the peer's message must be exactly `size` bytes (what perftest's
    /// memcpy takes).
    fn xchg(&self, mine: &[u8], size: usize, what: &str) -> Vec<u8> {
        let mut pending = None;
        let b = if self.client {
            self.write(mine, &mut pending);
            self.read(&mut pending)
        } else {
            let b = self.read(&mut pending);
            self.write(mine, &mut pending);
            b
        };
        assert!(pending.is_none(), "{what}: a message too many");
        assert_eq!(b.len(), size, "{what}: message size");
        b
    }

    /// The model keeps 6.29's 64-byte layout; 6.06's has no bytes 32..40 on the wire.
    fn hand_shake(&self, mine: &[u8; 64]) -> [u8; 64] {
        if self.dest_len == 64 {
            let b = self.xchg(mine, 64, "pingpong_dest");
            return b.try_into().unwrap();
        }
        let wire: Vec<u8> = mine[..32].iter().chain(&mine[40..]).copied().collect();
        let b = self.xchg(&wire, 56, "pingpong_dest (6.06)");
        let mut out = [0u8; 64];
        out[..32].copy_from_slice(&b[..32]);
        out[40..].copy_from_slice(&b[32..]);
        out
    }
}

fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes(b[o..o + 4].try_into().unwrap())
}
fn be64(b: &[u8], o: usize) -> u64 {
    u64::from_be_bytes(b[o..o + 8].try_into().unwrap())
}

/// struct pingpong_dest with htobe32/htobe64 fields.
fn dest(qpn: u32, rkey: u32, vaddr: u64, out_reads: u32) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[4..8].copy_from_slice(&out_reads.to_be_bytes());
    b[8..12].copy_from_slice(&qpn.to_be_bytes());
    b[12..16].copy_from_slice(&0x00ab_cdefu32.to_be_bytes());
    b[16..20].copy_from_slice(&rkey.to_be_bytes());
    // The 4 padding bytes of the C struct: perftest's stack garbage.
    b[20..24].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    b[24..32].copy_from_slice(&vaddr.to_be_bytes());
    b[40..56].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1]);
    b
}

/// struct perftest_parameters_negotiate (no mlx5dv): ints htonl, size/iters hton_64, the
/// ibv_device_attr as in memory.
fn negotiate(c: &Case) -> Vec<u8> {
    let mut b = vec![0u8; 312];
    let ints = [0u32, 0, c.verb as u32, u32::from(c.bw), 0, 0, 1];
    for (i, v) in ints.iter().enumerate() {
        b[i * 4..i * 4 + 4].copy_from_slice(&v.to_be_bytes());
    }
    b[32..40].copy_from_slice(&(c.size as u64).to_be_bytes());
    b[40..48].copy_from_slice(&c.iters.to_be_bytes());
    let ints = [0u32, c.qps, 5, 1, 0, 0, 0, 0];
    for (i, v) in ints.iter().enumerate() {
        b[48 + i * 4..52 + i * 4].copy_from_slice(&v.to_be_bytes());
    }
    b[80 + 144..80 + 148].copy_from_slice(&MODEL_RD_ATOM.to_le_bytes());
    b
}

/// exchange_versions, check_sys_data, check_mtu, negotiate_params: checks what the peer
/// sent.
fn model_exchange(comm: &ModelComm, c: &Case) {
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(if c.old { b"6.06" } else { b"6.29" });
    let r = comm.xchg(&v, 16, "version");
    let s: String = r
        .iter()
        .take_while(|&&x| x != 0)
        .map(|&x| x as char)
        .collect();
    // 6.29: at least 6.28, so both sides negotiate.
    assert_eq!(s, "6.29", "version");
    assert!(r[s.len()..].iter().all(|&x| x == 0));
    let r = comm.xchg(&(PAGE as u32).to_be_bytes(), 4, "cycle_buffer");
    assert_eq!(be32(&r, 0), 4096);
    let r = comm.xchg(&(CACHE_LINE as u32).to_be_bytes(), 4, "cache_line_size");
    assert_eq!(be32(&r, 0), 64);
    let r = comm.xchg(b"5\0", 2, "mtu");
    assert!((b'1'..=b'5').contains(&r[0]) && r[1] == 0, "mtu {r:?}");
    if c.old {
        // negotiate_params came with 6.28: a 6.06 peer goes on to the first sync.
        return;
    }
    let r = comm.xchg(&negotiate(c), 312, "negotiate");
    let mine = negotiate(c);
    // Every compared field equal: the first 80 bytes but the padding at 28.
    assert_eq!(&r[..28], &mine[..28], "negotiate ints");
    assert_eq!(&r[32..80], &mine[32..80], "negotiate size..data_validation");
    let rd_atom = u32::from_le_bytes(r[224..228].try_into().unwrap());
    assert!(rd_atom >= 1, "max_qp_rd_atom {rd_atom}");
}

fn buff_size(size: usize) -> usize {
    size.max(PAGE)
}

fn inc(size: usize) -> usize {
    if size > CACHE_LINE {
        size.div_ceil(CACHE_LINE) * CACHE_LINE
    } else {
        CACHE_LINE
    }
}

/// The model's test resources, as perftest's ctx: one buffer of 2 * qps * BUFF_SIZE.
struct Ctx {
    ch: EventChannel,
    ids: Vec<CmId>,
    qps: Vec<Arc<QueuePair>>,
    peer_qpn: Vec<u32>,
    cq: CompletionQueue,
    mr: MemoryRegion,
    bs: usize,
    _pd: ProtectionDomain,
}

impl Ctx {
    fn vaddr(&self, i: usize) -> u64 {
        self.mr.addr() + ((self.qps.len() + i) * self.bs) as u64
    }
    fn my_dest(&self, i: usize, c: &Case) -> [u8; 64] {
        let reads = if c.verb == Verb::Read {
            MODEL_RD_ATOM
        } else {
            1
        };
        dest(self.qps[i].qpn(), self.mr.rkey(), self.vaddr(i), reads)
    }
}

fn model_resources(id: &CmId, c: &Case) -> (ProtectionDomain, CompletionQueue, MemoryRegion) {
    let dev = id.device().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(8192, None).unwrap();
    let bs = buff_size(c.size);
    let mr = pd
        .register(
            vec![0u8; 2 * c.qps as usize * bs],
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    (pd, cq, mr)
}

fn model_qp(id: &CmId, pd: &ProtectionDomain, cq: &CompletionQueue) -> Arc<QueuePair> {
    let mut init = QpInitAttr::rc(cq, cq);
    init.cap.max_send_wr = 136;
    init.cap.max_recv_wr = 512;
    id.create_qp(pd, &init).unwrap()
}

/// perftest's conn_param: READ resources only in READ tests (and none on the
/// communication connection), retry_count 7, rnr_retry_count 7, no private data.
fn test_param(c: &Case, resp: u8, init: u8) -> ConnParam {
    let read = c.verb == Verb::Read;
    ConnParam {
        private_data: Vec::new(),
        responder_resources: if read { resp } else { 0 },
        initiator_depth: if read { init } else { 0 },
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    }
}

/// ctx_set_recv_wqes: rx_depth receives of exactly `size` bytes per QP, at buf[0] + (qps +
/// i) * BUFF_SIZE.
fn post_recvs(ctx: &Ctx, c: &Case, n: u64) {
    for i in 0..ctx.qps.len() {
        let off = (ctx.qps.len() + i) * ctx.bs;
        for _ in 0..n {
            let sge = ctx.mr.sge(off, c.size as u32).unwrap();
            ctx.qps[i]
                .post_recv(&RecvWr::new(i as u64).with_sge(sge))
                .unwrap();
        }
    }
}

/// A hang guard, not a speed target: a wait that passes it has stopped, not slowed.
const HANG: Duration = Duration::from_secs(120);

fn poll(ctx: &Ctx, what: &str) -> rdma_soft::verbs::Completion {
    let hang = Instant::now() + HANG;
    loop {
        if let Some(c) = ctx.cq.poll_one() {
            assert!(c.status.is_success(), "{what}: {c:?}");
            return c;
        }
        assert!(Instant::now() < hang, "{what}: hang");
    }
}

/// The test handshakes (after set_up_connection), as each test's main() does them.
fn model_dest_handshakes(comm: &ModelComm, ctx: &Ctx, c: &Case) -> Vec<[u8; 64]> {
    let n = ctx.qps.len();
    let mut rem = vec![[0u8; 64]; n];
    let each = |rem: &mut Vec<[u8; 64]>| {
        for (i, r) in rem.iter_mut().enumerate() {
            *r = comm.hand_shake(&ctx.my_dest(i, c));
        }
    };
    match (c.verb, c.bw) {
        (Verb::Send, _) => {
            each(&mut rem);
            rem[0] = comm.hand_shake(&ctx.my_dest(0, c));
            each(&mut rem);
        }
        (_, false) => {
            rem[0] = comm.hand_shake(&ctx.my_dest(0, c));
            each(&mut rem);
            each(&mut rem);
            rem[0] = comm.hand_shake(&ctx.my_dest(0, c));
        }
        (_, true) => {
            each(&mut rem);
            each(&mut rem);
            rem[0] = comm.hand_shake(&ctx.my_dest(0, c));
        }
    }
    // Every QP's dest names the QP its connection reached, with a key and an address.
    let mut qpns: Vec<u32> = rem.iter().map(|d| be32(d, 8)).collect();
    let mut peers = ctx.peer_qpn.clone();
    qpns.sort_unstable();
    peers.sort_unstable();
    assert_eq!(qpns, peers, "the peer's QPNs in its pingpong_dests");
    for d in &rem {
        assert_ne!(be32(d, 16), 0, "rkey");
        assert_ne!(be64(d, 24), 0, "vaddr");
        assert_eq!(be32(d, 0), 0, "lid on RoCE");
        assert_eq!(
            &d[40..52],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff],
            "IPv4 GID"
        );
        let reads = be32(d, 4);
        if c.verb == Verb::Read {
            assert!((1..=MODEL_RD_ATOM).contains(&reads));
        } else {
            assert_eq!(reads, 1);
        }
    }
    rem
}

/// The data phase and closing handshakes of the model (one size: no -a here).
fn model_run(comm: &ModelComm, ctx: &Ctx, c: &Case, rem: &[[u8; 64]], client: bool) {
    let d0 = ctx.my_dest(0, c);
    let size = c.size;
    match (c.verb, c.bw) {
        (Verb::Send, false) => {
            post_recvs(ctx, c, c.iters.min(512));
            comm.hand_shake(&d0);
            // run_iter_lat_send
            let sge = ctx.mr.sge(0, size as u32).unwrap();
            let wr = SendWr::new(0, SendOp::Send).with_sge(sge).signaled();
            let (mut scnt, mut rcnt, mut posted) = (0u64, 0u64, c.iters.min(512));
            while scnt < c.iters || rcnt < c.iters {
                if rcnt < c.iters && !(scnt < 1 && client) {
                    loop {
                        let w = poll(ctx, "send_lat recv");
                        if w.opcode == WcOpcode::Recv {
                            assert_eq!(w.byte_len as usize, size, "SEND size");
                            break;
                        }
                    }
                    rcnt += 1;
                    if posted < c.iters {
                        post_recvs(ctx, c, 1);
                        posted += 1;
                    }
                }
                if scnt < c.iters {
                    ctx.qps[0].post_send(&wr).unwrap();
                    scnt += 1;
                }
            }
            comm.hand_shake(&d0);
        }
        (Verb::Send, true) => {
            if !client {
                post_recvs(ctx, c, c.iters.min(512));
            }
            comm.hand_shake(&d0);
            if client {
                run_iter_bw(ctx, c, rem);
            } else {
                // run_iter_bw_server: exactly iters per QP, each of exactly size bytes.
                let mut per = vec![0u64; ctx.qps.len()];
                let mut posted = vec![c.iters.min(512); ctx.qps.len()];
                while per.iter().sum::<u64>() < c.iters * ctx.qps.len() as u64 {
                    let w = poll(ctx, "send_bw recv");
                    assert_eq!(w.opcode, WcOpcode::Recv);
                    assert_eq!(w.byte_len as usize, size);
                    let i = w.wr_id as usize;
                    per[i] += 1;
                    if posted[i] < c.iters {
                        let off = (ctx.qps.len() + i) * ctx.bs;
                        let sge = ctx.mr.sge(off, size as u32).unwrap();
                        ctx.qps[i]
                            .post_recv(&RecvWr::new(i as u64).with_sge(sge))
                            .unwrap();
                        posted[i] += 1;
                    }
                }
                assert!(per.iter().all(|&n| n == c.iters), "per QP {per:?}");
            }
            comm.hand_shake(&d0);
            // Nothing more arrived on the test QPs than iters per QP.
            assert!(ctx.cq.poll_one().is_none_or(|w| w.opcode != WcOpcode::Recv));
        }
        (Verb::Write, false) => {
            // run_iter_lat_write: the server writes first; poll the last byte.
            let poll_off = ctx.qps.len() * ctx.bs + size - 1;
            let sge = ctx.mr.sge(0, size as u32).unwrap();
            let wr = SendWr::new(
                0,
                SendOp::RdmaWrite {
                    remote_addr: be64(&rem[0], 24),
                    rkey: be32(&rem[0], 16),
                },
            )
            .with_sge(sge)
            .signaled();
            let (mut scnt, mut rcnt, mut ccnt) = (0u64, 0u64, 0u64);
            let mut b = [0u8];
            while scnt < c.iters || ccnt < c.iters || rcnt < c.iters {
                // perftest: !(scnt < 1 && machine == SERVER): the server writes first.
                if rcnt < c.iters && (client || scnt >= 1) {
                    rcnt += 1;
                    let hang = Instant::now() + HANG;
                    loop {
                        if let Some(w) = ctx.cq.poll_one() {
                            assert!(w.status.is_success());
                            ccnt += 1;
                        }
                        ctx.mr.read(poll_off, &mut b).unwrap();
                        if b[0] == rcnt as u8 {
                            break;
                        }
                        assert!(Instant::now() < hang, "write_lat: hang");
                    }
                }
                if scnt < c.iters {
                    scnt += 1;
                    ctx.mr.write(size - 1, &[scnt as u8]).unwrap();
                    ctx.qps[0].post_send(&wr).unwrap();
                }
                while ccnt < scnt {
                    let w = poll(ctx, "write completion");
                    assert_eq!(w.opcode, WcOpcode::RdmaWrite);
                    ccnt += 1;
                }
            }
        }
        (Verb::Read, false) => {
            if client {
                let sge = ctx.mr.sge(0, size as u32).unwrap();
                let wr = SendWr::new(
                    0,
                    SendOp::RdmaRead {
                        remote_addr: be64(&rem[0], 24),
                        rkey: be32(&rem[0], 16),
                    },
                )
                .with_sge(sge)
                .signaled();
                for _ in 0..c.iters {
                    ctx.qps[0].post_send(&wr).unwrap();
                    assert_eq!(poll(ctx, "read").opcode, WcOpcode::RdmaRead);
                }
            }
            comm.hand_shake(&d0);
        }
        (_, true) => {
            if client {
                run_iter_bw(ctx, c, rem);
            }
            comm.hand_shake(&d0);
            // xchg_bw_reports: size, iters, bw_peak, bw_avg, msgRate_avg.
            let mut mine = [0u64; 5];
            mine[0] = size as u64;
            mine[1] = c.iters * c.qps as u64;
            mine[2] = 100f64.to_bits();
            mine[3] = 90f64.to_bits();
            mine[4] = 1f64.to_bits();
            let mut got = [0u64; 5];
            for (g, m) in got.iter_mut().zip(mine) {
                *g = be64(&comm.xchg(&m.to_be_bytes(), 8, "bw report"), 0);
            }
            if !client {
                assert_eq!(got[0], size as u64, "reported size");
                assert_eq!(got[1], c.iters * c.qps as u64, "reported iterations");
                assert!(f64::from_bits(got[3]) > 0.0, "reported average");
            }
            comm.hand_shake(&d0);
        }
    }
}

/// run_iter_bw: iters per QP, 128 in flight, remote addresses through the cycle buffer.
fn run_iter_bw(ctx: &Ctx, c: &Case, rem: &[[u8; 64]]) {
    let n = ctx.qps.len();
    let (mut scnt, mut ccnt) = (vec![0u64; n], vec![0u64; n]);
    while ccnt.iter().sum::<u64>() < c.iters * n as u64 {
        for i in 0..n {
            while scnt[i] < c.iters && scnt[i] - ccnt[i] < 128 {
                let off = if c.size <= PAGE / 2 {
                    (scnt[i] % (PAGE / inc(c.size)) as u64) as usize * inc(c.size)
                } else {
                    0
                };
                let sge = ctx.mr.sge(i * ctx.bs + off, c.size as u32).unwrap();
                let (ra, rk) = (be64(&rem[i], 24) + off as u64, be32(&rem[i], 16));
                let op = match c.verb {
                    Verb::Send => SendOp::Send,
                    Verb::Write => SendOp::RdmaWrite {
                        remote_addr: ra,
                        rkey: rk,
                    },
                    Verb::Read => SendOp::RdmaRead {
                        remote_addr: ra,
                        rkey: rk,
                    },
                };
                ctx.qps[i]
                    .post_send(&SendWr::new(i as u64, op).with_sge(sge).signaled())
                    .unwrap();
                scnt[i] += 1;
            }
        }
        let w = poll(ctx, "bw completion");
        ccnt[w.wr_id as usize] += 1;
    }
}

fn model_teardown(ctx: &Ctx, client: bool) {
    if !client {
        for id in &ctx.ids {
            id.disconnect().unwrap();
        }
    }
    let mut left = ctx.ids.len();
    while left > 0 {
        let ev = ctx
            .ch
            .get_event_timeout(Duration::from_secs(15))
            .unwrap()
            .expect("DISCONNECTED of the test connections");
        match ev.kind() {
            EventType::Disconnected => left -= 1,
            EventType::Established => {}
            k => panic!("teardown: {k:?}"),
        }
    }
}

/// perftest as the client (`ib_<test> -R -s S -n N [-q Q] server`) against `rdma-perf
/// <test> --bind server` (without -R: the server tells perftest's request from ours).
fn model_client(c: Case, me: &str, srv: &str, port: u16) {
    let cma = Cma::new().unwrap();
    let dst: SocketAddr = format!("{srv}:{port}").parse().unwrap();
    let src: SocketAddr = format!("{me}:0").parse().unwrap();
    // rdma_client_connect, retried while the server starts.
    // perftest retries its comm connect until the server listens; so does the model, a
    // bounded number of times (a count, not a clock)
    let mut attempts = 0;
    let comm = loop {
        attempts += 1;
        let ch = EventChannel::with_cma(&cma).unwrap();
        let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
        id.resolve_addr(Some(src), dst, Duration::from_secs(2))
            .unwrap();
        drop(wait_ev(&ch, EventType::AddrResolved));
        id.resolve_route(Duration::from_secs(2)).unwrap();
        drop(wait_ev(&ch, EventType::RouteResolved));
        let comm = ModelComm::new(ch, id, true, &c);
        comm.id.connect(&test_param(&c, 0, 0)).unwrap();
        let ev = comm
            .ch
            .get_event_timeout(Duration::from_secs(20))
            .unwrap()
            .unwrap();
        if ev.kind() == EventType::Established {
            // The comm accept: no READ resources, rnr retry 7.
            assert_eq!(ev.param().responder_resources, 0);
            assert_eq!(ev.param().initiator_depth, 0);
            drop(ev);
            break comm;
        }
        assert_eq!(ev.kind(), EventType::Rejected, "{ev:?}");
        drop(ev);
        assert!(attempts < 100, "server never up after {attempts} connects");
        std::thread::sleep(Duration::from_millis(200));
    };
    model_exchange(&comm, &c);
    assert_eq!(comm.hand_shake(&[0; 64]), [0; 64], "first sync");
    // create_rdma_cm_connection: qps ids, each connected (retried 10 x 100 ms).
    let mut ctx = None;
    for attempt in 0..10 {
        let ch = EventChannel::with_cma(&cma).unwrap();
        let ids: Vec<CmId> = (0..c.qps)
            .map(|_| CmId::new(&ch, PortSpace::Tcp).unwrap())
            .collect();
        for id in &ids {
            id.resolve_addr(Some(src), dst, Duration::from_secs(2))
                .unwrap();
        }
        let mut res = None;
        let mut qps: Vec<Option<Arc<QueuePair>>> = vec![None; ids.len()];
        let mut peer = vec![0u32; ids.len()];
        let mut left = ids.len();
        let mut failed = false;
        while left > 0 {
            let ev = ch
                .get_event_timeout(Duration::from_secs(20))
                .unwrap()
                .unwrap();
            let i = ids.iter().position(|x| x.num() == ev.id_num()).unwrap();
            match ev.kind() {
                EventType::AddrResolved => ids[i].resolve_route(Duration::from_secs(2)).unwrap(),
                EventType::RouteResolved => {
                    let (pd, cq, mr) = res.take().unwrap_or_else(|| model_resources(&ids[i], &c));
                    qps[i] = Some(model_qp(&ids[i], &pd, &cq));
                    res = Some((pd, cq, mr));
                    let reads = MODEL_RD_ATOM as u8;
                    ids[i].connect(&test_param(&c, reads, reads)).unwrap();
                }
                EventType::Established => {
                    let p = ev.param();
                    if c.verb == Verb::Read {
                        assert!(p.responder_resources >= 1 && p.initiator_depth >= 1);
                    }
                    peer[i] = p.qp_num;
                    left -= 1;
                }
                EventType::Rejected | EventType::Unreachable | EventType::ConnectError => {
                    failed = true;
                    break;
                }
                k => panic!("connect: {k:?}"),
            }
        }
        if failed {
            assert!(attempt < 9, "test QPs never connected");
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let (pd, cq, mr) = res.unwrap();
        ctx = Some(Ctx {
            ch,
            ids,
            qps: qps.into_iter().map(Option::unwrap).collect(),
            peer_qpn: peer,
            cq,
            mr,
            bs: buff_size(c.size),
            _pd: pd,
        });
        break;
    }
    let ctx = ctx.unwrap();
    assert_eq!(comm.hand_shake(&[0; 64]), [0; 64], "second sync");
    let rem = model_dest_handshakes(&comm, &ctx, &c);
    model_run(&comm, &ctx, &c, &rem, true);
    model_teardown(&ctx, true);
}

/// perftest as the server (`ib_<test> -R -s S -n N --bind_source_ip server`) against
/// `rdma-perf <test> -R ... server`.
fn model_server(c: Case, me: &str, port: u16, ready: std::sync::mpsc::Sender<()>) {
    let cma = Cma::new().unwrap();
    let addr: SocketAddr = format!("{me}:{port}").parse().unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    let control = CmId::new(&ch, PortSpace::Tcp).unwrap();
    control.bind_addr(addr).unwrap();
    control.listen(c.qps as usize).unwrap();
    ready.send(()).unwrap();
    let mut ev = ch
        .get_event_timeout(Duration::from_secs(30))
        .unwrap()
        .unwrap();
    assert_eq!(ev.kind(), EventType::ConnectRequest);
    // The comm request: no private data after the IP CM header, no READ resources.
    assert!(ev.private_data().iter().all(|&b| b == 0), "private data");
    assert_eq!(ev.param().initiator_depth, 0);
    assert_eq!(ev.param().responder_resources, 0);
    let id = ev.take_id().unwrap();
    drop(ev);
    let comm = ModelComm::new(ch, id, false, &c);
    comm.id.accept(&test_param(&c, 0, 0)).unwrap();
    drop(control);
    model_exchange(&comm, &c);
    let tch = EventChannel::with_cma(&cma).unwrap();
    // ctx_hand_shake then rdma_cm_server_connection: read, write, listen (the client's
    // first connects may be refused and retried, as with perftest).
    let mut pending = None;
    let z = comm.read(&mut pending);
    assert_eq!(z, vec![0u8; comm.dest_len], "first sync");
    comm.write(&vec![0; comm.dest_len], &mut pending);
    let listen = CmId::new(&tch, PortSpace::Tcp).unwrap();
    listen.bind_addr(addr).unwrap();
    listen.listen(c.qps as usize).unwrap();
    let mut ids = Vec::new();
    let mut qps = Vec::new();
    let mut peer = Vec::new();
    let mut res = None;
    while ids.len() < c.qps as usize {
        let mut ev = tch
            .get_event_timeout(Duration::from_secs(20))
            .unwrap()
            .unwrap();
        match ev.kind() {
            EventType::ConnectRequest => {
                let p = ev.param().clone();
                assert!(ev.private_data().iter().all(|&b| b == 0), "private data");
                if c.verb == Verb::Read {
                    assert!(p.initiator_depth >= 1 && p.responder_resources >= 1);
                } else {
                    assert_eq!((p.initiator_depth, p.responder_resources), (0, 0));
                }
                let id = ev.take_id().unwrap();
                drop(ev);
                let (pd, cq, mr) = res.take().unwrap_or_else(|| model_resources(&id, &c));
                qps.push(model_qp(&id, &pd, &cq));
                res = Some((pd, cq, mr));
                let r = (MODEL_RD_ATOM as u8).min(p.initiator_depth);
                let i = (MODEL_RD_ATOM as u8).min(p.responder_resources);
                id.accept(&test_param(&c, r, i)).unwrap();
                peer.push(p.qp_num);
                ids.push(id);
            }
            // rdma_cm_connection_established_handler: nothing to do on the server.
            EventType::Established => {}
            k => panic!("accept: {k:?}"),
        }
    }
    drop(listen);
    let (pd, cq, mr) = res.unwrap();
    let ctx = Ctx {
        ch: tch,
        ids,
        qps,
        peer_qpn: peer,
        cq,
        mr,
        bs: buff_size(c.size),
        _pd: pd,
    };
    assert_eq!(comm.hand_shake(&[0; 64]), [0; 64], "second sync");
    let rem = model_dest_handshakes(&comm, &ctx, &c);
    model_run(&comm, &ctx, &c, &rem, false);
    model_teardown(&ctx, false);
}

fn perf_args(c: &Case) -> Vec<String> {
    let mut a = vec![
        c.name.to_string(),
        "-s".into(),
        c.size.to_string(),
        "-n".into(),
        c.iters.to_string(),
    ];
    if c.qps > 1 {
        a.extend(["-q".into(), c.qps.to_string()]);
    }
    a
}

fn check_output(o: &Output, c: &Case, rows: bool) {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}: {err}\n{out}", c.name);
    if rows {
        let row = out
            .lines()
            .find(|l| {
                l.split_whitespace().next() == Some(&c.size.to_string())
                    && l.split_whitespace().count() >= 5
            })
            .unwrap_or_else(|| panic!("{}: no result row\n{out}", c.name));
        let v: Vec<f64> = row.split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert!(v.iter().all(|x| x.is_finite() && *x > 0.0), "{row}");
    }
}

/// perftest client → rdma-perf server (no -R on our side, as in the report).
fn perftest_client(c: Case, me: &str, srv: &str, port: u16) {
    // As in the report: the server with its defaults; it follows the client's negotiation.
    // perftest before 6.28 does not negotiate: both sides are given the same parameters.
    let mut args = if c.old {
        perf_args(&c)
    } else {
        vec![c.name.to_string()]
    };
    args.extend(["--bind", srv, "-p", &port.to_string()].map(String::from));
    let child = Command::new(PERF)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut p = Proc(child);
    model_client(c, me, srv, port);
    let hang = Instant::now() + HANG;
    while p.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < hang, "hang: the server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    let child = std::mem::replace(&mut p.0, Command::new("true").spawn().unwrap());
    let o = child.wait_with_output().unwrap();
    // Our server prints a row for every test but read_lat (perftest's server neither).
    check_output(&o, &c, c.name != "read_lat");
}

/// rdma-perf client (-R) → perftest server.
fn perftest_server(c: Case, me: &str, srv: &str, port: u16) {
    let (tx, rx) = std::sync::mpsc::channel();
    let at = srv.to_string();
    let th = std::thread::spawn(move || model_server(c, &at, port, tx));
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut args = perf_args(&c);
    args.extend([
        "-R".into(),
        "--bind".into(),
        me.into(),
        "-p".into(),
        port.to_string(),
        srv.into(),
    ]);
    let o = Command::new(PERF).args(&args).output().unwrap();
    let r = th.join();
    check_output(&o, &c, true);
    r.unwrap();
}

macro_rules! both {
    ($t:ident, $name:literal, $size:expr, $iters:expr, $qps:expr, $a:literal, $b:literal, $c:literal, $d:literal) => {
        mod $t {
            use super::*;
            #[test]
            fn perftest_client_our_server() {
                perftest_client(case($name, $size, $iters, $qps), $a, $b, 18515);
            }
            #[test]
            fn our_client_perftest_server() {
                perftest_server(case($name, $size, $iters, $qps), $c, $d, 18515);
            }
        }
    };
}

both!(
    send_lat,
    "send_lat",
    64,
    200,
    1,
    "127.0.40.1",
    "127.0.40.2",
    "127.0.40.3",
    "127.0.40.4"
);
both!(
    send_bw,
    "send_bw",
    4096,
    300,
    2,
    "127.0.41.1",
    "127.0.41.2",
    "127.0.41.3",
    "127.0.41.4"
);
both!(
    write_lat,
    "write_lat",
    64,
    300,
    1,
    "127.0.42.1",
    "127.0.42.2",
    "127.0.42.3",
    "127.0.42.4"
);
both!(
    write_bw,
    "write_bw",
    1000,
    400,
    2,
    "127.0.43.1",
    "127.0.43.2",
    "127.0.43.3",
    "127.0.43.4"
);
both!(
    read_lat,
    "read_lat",
    64,
    200,
    1,
    "127.0.44.1",
    "127.0.44.2",
    "127.0.44.3",
    "127.0.44.4"
);
both!(
    read_bw,
    "read_bw",
    8192,
    300,
    1,
    "127.0.45.1",
    "127.0.45.2",
    "127.0.45.3",
    "127.0.45.4"
);

/// perftest 4.5 (6.10) as Debian 12 ships it, both ways.
macro_rules! both_old {
    ($t:ident, $name:literal, $size:expr, $iters:expr, $qps:expr, $a:literal, $b:literal, $c:literal, $d:literal) => {
        mod $t {
            use super::*;
            #[test]
            fn perftest_client_our_server() {
                perftest_client(old(case($name, $size, $iters, $qps)), $a, $b, 18515);
            }
            #[test]
            fn our_client_perftest_server() {
                perftest_server(old(case($name, $size, $iters, $qps)), $c, $d, 18515);
            }
        }
    };
}

both_old!(
    old_send_lat,
    "send_lat",
    64,
    200,
    1,
    "127.0.48.1",
    "127.0.48.2",
    "127.0.48.3",
    "127.0.48.4"
);
both_old!(
    old_write_bw,
    "write_bw",
    1000,
    400,
    2,
    "127.0.49.1",
    "127.0.49.2",
    "127.0.49.3",
    "127.0.49.4"
);
