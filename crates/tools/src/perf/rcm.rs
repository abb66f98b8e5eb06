//! perftest's `-R` mode on the wire (`docs/PERFTEST.md`): a communication connection (RC,
//! no private data) to the port, the in-band exchange of versions, sizes, MTU, parameters
//! and `pingpong_dest`s over SENDs on it, one CM connection per test QP to the same port, the
//! handshakes of each test and its data phase as perftest runs it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_soft::verbs::{
    AccessFlags, Completion, CompletionQueue, MemoryRegion, ProtectionDomain, QpInitAttr,
    QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
};
use rdmacm::cm::{CmId, Cma, ConnParam, EventChannel, EventType, PortSpace};

use super::conn::{wait, Hook};
use super::perftest::{self as pt, BwReport, Dest, Negotiate};
use super::report::{self, BwStats, LatRecorder, Outcome, DASHES};
use super::{Kind, Params, Test, Verb};
use crate::events::describe;

/// perftest's `SYNC_SPEC_ID`: wr_id of the communication QP's work requests.
const SYNC: u64 = 5;
/// Bytes of the communication buffer's receive half (and of its send half).
const CBUF: usize = 4096;
/// Our cycle buffer and cache line (the page size and line of the hosts we run on).
const CYCLE: usize = 4096;
const CACHE_LINE: usize = 64;
/// Receives kept posted on every test QP.
const RQ: usize = 256;
/// Outstanding RDMA READs we offer (and our device's `max_qp_rd_atom` in the negotiation).
const OUT_READS: u32 = 16;
/// The first perftest version that negotiates parameters (not 2π).
#[allow(clippy::approx_constant)]
const NEGOTIATE_FROM: f64 = 6.28;
/// No completion on a test QP for this long: the peer is gone.
const IDLE: Duration = Duration::from_secs(10);

fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// The communication connection (perftest's `user_comm.rdma_ctx`).
pub struct Comm {
    ch: EventChannel,
    id: CmId,
    qp: Arc<QueuePair>,
    cq: CompletionQueue,
    mr: MemoryRegion,
    client: bool,
    stash: Option<Vec<u8>>,
    limit: Duration,
    /// The peer's `pingpong_dest` size (by its version, once exchanged).
    dest_len: usize,
    _pd: ProtectionDomain,
}

impl Comm {
    fn new(ch: EventChannel, id: CmId, client: bool, limit: Duration) -> Result<Comm, String> {
        let dev = id.device().ok_or("the id has no device")?;
        let pd = dev.alloc_pd().map_err(err("alloc_pd"))?;
        let cq = dev.create_cq(16, None).map_err(err("create_cq"))?;
        let mr = pd
            .alloc(2 * CBUF, AccessFlags::LOCAL_WRITE)
            .map_err(err("register memory"))?;
        let mut init = QpInitAttr::rc(&cq, &cq);
        init.cap.max_send_wr = 4;
        init.cap.max_recv_wr = 4;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        let qp = id.create_qp(&pd, &init).map_err(err("create_qp"))?;
        let c = Comm {
            ch,
            id,
            qp,
            cq,
            mr,
            client,
            stash: None,
            limit,
            dest_len: pt::DEST_LEN,
            _pd: pd,
        };
        // perftest's post_one_recv_wqe, before rdma_connect / rdma_accept.
        c.post_recv()?;
        Ok(c)
    }

    fn post_recv(&self) -> Result<(), String> {
        let sge = self.mr.sge(0, CBUF as u32).map_err(err("receive buffer"))?;
        self.qp
            .post_recv(&RecvWr::new(SYNC).with_sge(sge))
            .map_err(err("post_recv"))
    }

    fn completion(&mut self, c: Completion) -> Result<Option<Vec<u8>>, String> {
        if !c.status.is_success() {
            return Err(format!(
                "communication QP: completion with error {:?} ({:?})",
                c.status, c.opcode
            ));
        }
        if c.opcode == WcOpcode::Recv {
            let mut b = vec![0u8; c.byte_len as usize];
            self.mr.read(0, &mut b).map_err(|e| e.to_string())?;
            self.post_recv()?;
            return Ok(Some(b));
        }
        Ok(None)
    }

    fn idle_check(&self, since: Instant) -> Result<(), String> {
        while let Ok(Some(ev)) = self.ch.get_event_timeout(Duration::ZERO) {
            if matches!(
                ev.kind(),
                EventType::Disconnected | EventType::DeviceRemoval | EventType::ConnectError
            ) {
                return Err("the peer closed the communication connection".into());
            }
        }
        if since.elapsed() > self.limit {
            return Err(format!(
                "the peer sent nothing on the communication connection for {} s",
                self.limit.as_secs()
            ));
        }
        Ok(())
    }

    /// `rdma_write_data`: one signaled SEND of exactly `data`, waited for.
    pub fn send(&mut self, data: &[u8]) -> Result<(), String> {
        self.mr.write(CBUF, data).map_err(|e| e.to_string())?;
        let sge = self
            .mr
            .sge(CBUF, data.len() as u32)
            .map_err(err("send buffer"))?;
        self.qp
            .post_send(&SendWr::new(SYNC, SendOp::Send).with_sge(sge).signaled())
            .map_err(err("post_send"))?;
        let t0 = Instant::now();
        let mut spins = 0u32;
        loop {
            match self.cq.poll_one() {
                Some(c) if c.opcode == WcOpcode::Send => {
                    return self.completion(c).map(|_| ());
                }
                Some(c) => {
                    // The peer's answer may come before our SEND's ACK is seen.
                    if let Some(b) = self.completion(c)? {
                        self.stash = Some(b);
                    }
                }
                None => {
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(4096) {
                        self.idle_check(t0)?;
                        std::thread::yield_now();
                    }
                }
            }
        }
    }

    /// `rdma_read_data`: the next message the peer sends.
    pub fn recv(&mut self) -> Result<Vec<u8>, String> {
        if let Some(b) = self.stash.take() {
            return Ok(b);
        }
        let t0 = Instant::now();
        let mut spins = 0u32;
        loop {
            match self.cq.poll_one() {
                Some(c) => {
                    if let Some(b) = self.completion(c)? {
                        return Ok(b);
                    }
                }
                None => {
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(4096) {
                        self.idle_check(t0)?;
                        std::thread::yield_now();
                    }
                }
            }
        }
    }

    /// `ctx_xchg_data`: the client writes then reads, the server reads then writes. The
    /// peer's message must be `want` bytes long (any of them).
    pub fn xchg(&mut self, mine: &[u8], want: &[usize], what: &str) -> Result<Vec<u8>, String> {
        let b = if self.client {
            self.send(mine)?;
            self.recv()?
        } else {
            let b = self.recv()?;
            self.send(mine)?;
            b
        };
        if !want.contains(&b.len()) {
            return Err(format!(
                "perftest exchange: {what}: got {} bytes, expected {want:?} (is the peer perftest -R running the same test?)",
                b.len()
            ));
        }
        Ok(b)
    }

    /// `ctx_hand_shake`: `pingpong_dest`s of the peer's version's size.
    pub fn hand_shake(&mut self, mine: &Dest) -> Result<Dest, String> {
        let len = self.dest_len;
        let b = self.xchg(&mine.encode_len(len), &[len], "pingpong_dest")?;
        Dest::decode(&b).ok_or_else(|| "bad pingpong_dest".into())
    }
}

/// What the exchange settled.
#[derive(Debug, Clone)]
struct Settled {
    p: Params,
    rem_version: f64,
    cycle: usize,
    cache_line: usize,
    mtu: u8,
    out_reads: u32,
}

fn negotiate_of(p: &Params) -> Negotiate {
    Negotiate {
        test_method: u32::from(p.all),
        connection_type: 0,
        verb: match p.test.verb {
            Verb::Send => pt::verb::SEND,
            Verb::Write => pt::verb::WRITE,
            Verb::Read => pt::verb::READ,
        },
        tst: match p.test.kind {
            Kind::Lat => 0,
            Kind::Bw => 1,
        },
        atomic_type: 0,
        test_type: u32::from(p.duration.is_some()),
        report_fmt: 1,
        size: if p.all { pt::MAX_SIZE } else { p.size as u64 },
        iters: if p.duration.is_some() { 0 } else { p.iters },
        aes_xts: 0,
        num_of_qps: p.qps,
        duration: p.duration.map_or(pt::DEF_DURATION, |d| d.as_secs() as u32),
        use_rdma_cm: 1,
        use_write_with_imm: 0,
        no_enhanced_reorder: 0,
        sig_offload: 0,
        data_validation: 0,
        max_qp_rd_atom: OUT_READS,
        max_qp_init_rd_atom: OUT_READS,
        caps: [1024, 16384, 8, 1024, 65536, 4096, 1024],
        vendor_id: 0,
    }
}

/// The server follows the client's sizes, iterations, duration and QPs.
fn adopt(p: &Params, n: &Negotiate) -> Params {
    let mut q = p.clone();
    q.all = n.test_method == 1;
    if !q.all && n.size > 0 && n.size <= pt::MAX_SIZE {
        q.size = n.size as usize;
    }
    if n.test_type == 1 {
        q.duration = Some(Duration::from_secs(n.duration.max(1).into()));
    } else {
        q.duration = None;
        if n.iters > 0 {
            q.iters = n.iters;
        }
    }
    if (1..=64).contains(&n.num_of_qps) && (q.test.kind == Kind::Bw || n.num_of_qps == 1) {
        q.qps = n.num_of_qps;
    }
    q
}

/// `exchange_versions`, `check_sys_data`, `check_mtu`, `negotiate_params`.
fn exchange(comm: &mut Comm, p: &Params, follow: bool) -> Result<Settled, String> {
    let v = comm.xchg(&pt::version_msg(), &[pt::VERSION_LEN], "version")?;
    let rem_version = pt::parse_version(&v);
    if rem_version < 5.70 {
        return Err(format!(
            "the peer's perftest version {rem_version} is older than 5.70"
        ));
    }
    comm.dest_len = pt::dest_len(rem_version);
    if rem_version < NEGOTIATE_FROM {
        tracing::warn!(
            "the peer's perftest {rem_version} does not negotiate: both sides run their own \
             parameters (size {}, iterations {}, QPs {}); give both the same -s, -n, -q",
            p.size,
            p.iters,
            p.qps
        );
    }
    let (mut cycle, mut cache_line) = (CYCLE, CACHE_LINE);
    if rem_version >= 5.32 {
        let b = comm.xchg(&(CYCLE as u32).to_be_bytes(), &[4], "cycle buffer")?;
        cycle = cycle.max(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
        let b = comm.xchg(&(CACHE_LINE as u32).to_be_bytes(), &[4], "cache line")?;
        cache_line = cache_line.max(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
    }
    let dev = comm.id.device().ok_or("the id has no device")?;
    let mut mtu = dev.query_port(1).map_or(3, |a| a.active_mtu as u8);
    if rem_version >= 5.1 {
        let len = if rem_version >= 5.31 { 2 } else { 4 };
        let b = comm.xchg(&pt::mtu_msg(mtu, len), &[len], "MTU")?;
        if let Some(r) = pt::parse_mtu(&b).filter(|r| (1..=5).contains(r)) {
            mtu = mtu.min(r);
        }
    }
    let mut p = p.clone();
    let mut out_reads = OUT_READS;
    if rem_version >= NEGOTIATE_FROM {
        let sizes = [pt::NEGOTIATE_LEN, pt::NEGOTIATE_LEN + 8];
        let remote = if comm.client {
            let mine = negotiate_of(&p);
            comm.send(&mine.encode())?;
            let b = comm.recv()?;
            check_len(&b, &sizes)?;
            Negotiate::decode(&b).ok_or("bad negotiation")?
        } else {
            let b = comm.recv()?;
            check_len(&b, &sizes)?;
            let r = Negotiate::decode(&b).ok_or("bad negotiation")?;
            if follow {
                p = adopt(&p, &r);
            }
            comm.send(&negotiate_of(&p).encode())?;
            r
        };
        if let Some(m) = negotiate_of(&p).mismatch(&remote) {
            return Err(format!("{m} (the peer runs other parameters)"));
        }
        if remote.max_qp_rd_atom > 0 {
            out_reads = out_reads.min(remote.max_qp_rd_atom);
        }
    }
    Ok(Settled {
        p,
        rem_version,
        cycle,
        cache_line,
        mtu,
        out_reads,
    })
}

fn check_len(b: &[u8], sizes: &[usize]) -> Result<(), String> {
    if sizes.contains(&b.len()) {
        Ok(())
    } else {
        Err(format!(
            "perftest exchange: negotiation of {} bytes, expected {sizes:?}",
            b.len()
        ))
    }
}

/// The test QPs and their memory: area 0 (`region` bytes) is what the peer writes to, reads
/// from and where receives land; area 1 is the source of our SENDs and WRITEs and the
/// destination of our READs.
struct Data {
    ch: EventChannel,
    ids: Vec<CmId>,
    qps: Vec<Arc<QueuePair>>,
    cq: CompletionQueue,
    mr: MemoryRegion,
    region: usize,
    max_msg: usize,
    _pd: ProtectionDomain,
}

struct Verbs {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    mr: MemoryRegion,
}

fn max_msg(s: &Settled) -> usize {
    s.p.sizes().into_iter().max().unwrap_or(1)
}

fn region(s: &Settled) -> usize {
    pt::buff_size(max_msg(s), s.cycle).max(CBUF)
}

fn verbs(id: &CmId, s: &Settled) -> Result<Verbs, String> {
    let dev = id.device().ok_or("the id has no device")?;
    let pd = dev.alloc_pd().map_err(err("alloc_pd"))?;
    let cq = dev.create_cq(16384, None).map_err(err("create_cq"))?;
    let mr = pd
        .alloc(
            2 * region(s),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .map_err(err("register memory"))?;
    Ok(Verbs { pd, cq, mr })
}

fn create_qp(id: &CmId, v: &Verbs, s: &Settled) -> Result<Arc<QueuePair>, String> {
    let mut init = QpInitAttr::rc(&v.cq, &v.cq);
    init.cap.max_send_wr = s.p.tx_depth.max(1) + 8;
    init.cap.max_recv_wr = RQ as u32;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    let qp = id.create_qp(&v.pd, &init).map_err(err("create_qp"))?;
    let sge =
        v.mr.sge(0, max_msg(s) as u32)
            .map_err(err("receive buffer"))?;
    for _ in 0..RQ {
        qp.post_recv(&RecvWr::new(0).with_sge(sge))
            .map_err(err("post_recv"))?;
    }
    Ok(qp)
}

/// perftest's test-QP `conn_param`: READ resources only for READ tests, retry and RNR
/// retry 7, no private data.
fn conn_param(s: &Settled, resp: u32, init: u32) -> ConnParam {
    let read = s.p.test.verb == Verb::Read;
    ConnParam {
        private_data: Vec::new(),
        responder_resources: if read { resp as u8 } else { 0 },
        initiator_depth: if read { init as u8 } else { 0 },
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    }
}

fn data(ch: EventChannel, ids: Vec<CmId>, qps: Vec<Arc<QueuePair>>, v: Verbs, s: &Settled) -> Data {
    Data {
        ch,
        ids,
        qps,
        cq: v.cq,
        mr: v.mr,
        region: region(s),
        max_msg: max_msg(s),
        _pd: v.pd,
    }
}

/// `rdma_cm_client_connection`: `qps` ids resolved and connected to the server's port,
/// tried up to 10 times 100 ms apart (the server may not listen yet).
/// Connects the test QPs. A request refused because the server is not listening yet (it
/// listens only after the first sync) is retried on a fresh id, that one alone: the QPs
/// already accepted stay, so the server never sees a request the client then abandons.
fn connect_tests(cma: &Cma, s: &Settled, dst: SocketAddr, hook: Hook<'_>) -> Result<Data, String> {
    const TRIES: u32 = 10;
    let ch = EventChannel::with_cma(cma).map_err(err("event channel"))?;
    let limit = Duration::from_secs(10);
    let fresh = || -> Result<CmId, String> {
        let id = CmId::new(&ch, PortSpace::Tcp).map_err(err("create id"))?;
        id.resolve_addr(s.p.bind, dst, Duration::from_secs(2))
            .map_err(err("resolve addr"))?;
        Ok(id)
    };
    let mut ids = Vec::new();
    for _ in 0..s.p.qps {
        ids.push(fresh()?);
    }
    let mut v: Option<Verbs> = None;
    let mut qps: Vec<Option<Arc<QueuePair>>> = ids.iter().map(|_| None).collect();
    let mut tries = vec![1u32; ids.len()];
    let mut left = ids.len();
    let deadline = Instant::now() + limit * 3;
    while left > 0 {
        let ev = ch
            .get_event_timeout(deadline.saturating_duration_since(Instant::now()))
            .map_err(err("get_event"))?
            .ok_or("connect test QPs: timed out")?;
        hook(&ev);
        let Some(i) = ids.iter().position(|id| id.num() == ev.id_num()) else {
            // A refused id's late event (it is gone): nothing to do.
            continue;
        };
        match ev.kind() {
            EventType::AddrResolved => {
                drop(ev);
                ids[i]
                    .resolve_route(Duration::from_secs(2))
                    .map_err(err("resolve route"))?;
            }
            EventType::RouteResolved => {
                drop(ev);
                if v.is_none() {
                    v = Some(verbs(&ids[i], s)?);
                }
                let vb = v.as_ref().ok_or("no verbs")?;
                qps[i] = Some(create_qp(&ids[i], vb, s)?);
                ids[i]
                    .connect(&conn_param(s, s.out_reads, s.out_reads))
                    .map_err(err("connect"))?;
            }
            EventType::Established => left -= 1,
            EventType::AddrChange | EventType::TimewaitExit => {}
            EventType::Rejected if tries[i] < TRIES => {
                drop(ev);
                tries[i] += 1;
                tracing::debug!(
                    qp = i,
                    attempt = tries[i],
                    "test QP rejected (server not listening yet): retrying on a fresh id"
                );
                // The CM moved the refused QP to error (as rdma_cm does): its posted
                // receives were flushed into the shared CQ. Before any data, flushes of
                // refused QPs (this one, or another whose REJ is next) are all the CQ can
                // hold; they go, or the test would take them for its own.
                qps[i] = None;
                std::thread::sleep(Duration::from_millis(100));
                ids[i] = fresh()?;
                if let Some(vb) = v.as_ref() {
                    while let Some(c) = vb.cq.poll_one() {
                        if c.status != WcStatus::WrFlushErr {
                            return Err(format!(
                                "connect test QPs: a completion before any data: {c:?}"
                            ));
                        }
                    }
                }
            }
            _ => return Err(format!("connect test QPs: {}", describe(&ev))),
        }
    }
    let qps = qps
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or("a QP is missing")?;
    let v = v.ok_or("no verbs")?;
    Ok(data(ch, ids, qps, v, s))
}

/// `rdma_cm_server_connection`: accepts `qps` requests on the listener (requests beyond them
/// are rejected), each with the READ resources perftest's server gives.
fn accept_tests(
    ch: EventChannel,
    listen: CmId,
    s: &Settled,
    hook: Hook<'_>,
) -> Result<Data, String> {
    let mut ids = Vec::new();
    let mut qps = Vec::new();
    let mut v: Option<Verbs> = None;
    let mut established = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while established < s.p.qps {
        let mut ev = ch
            .get_event_timeout(deadline.saturating_duration_since(Instant::now()))
            .map_err(err("get_event"))?
            .ok_or("timed out waiting for the test QPs' connections")?;
        hook(&ev);
        match ev.kind() {
            EventType::ConnectRequest => {
                let (ri, rr) = (ev.param().initiator_depth, ev.param().responder_resources);
                let Some(id) = ev.take_id() else { continue };
                drop(ev);
                if ids.len() as u32 >= s.p.qps {
                    let _ = id.reject(&[]);
                    continue;
                }
                if v.is_none() {
                    v = Some(verbs(&id, s)?);
                }
                let vb = v.as_ref().ok_or("no verbs")?;
                let qp = create_qp(&id, vb, s)?;
                let resp = s.out_reads.min(ri.into());
                let init = s.out_reads.min(rr.into());
                id.accept(&conn_param(s, resp, init))
                    .map_err(err("accept"))?;
                ids.push(id);
                qps.push(qp);
            }
            EventType::Established => established += 1,
            EventType::AddrChange | EventType::TimewaitExit => {}
            _ => return Err(format!("while connecting the test QPs: {}", describe(&ev))),
        }
    }
    drop(listen);
    let v = v.ok_or("no verbs")?;
    Ok(data(ch, ids, qps, v, s))
}

fn gid_of(ip: Option<IpAddr>) -> [u8; 16] {
    match ip {
        Some(IpAddr::V4(a)) => a.to_ipv6_mapped().octets(),
        Some(IpAddr::V6(a)) => a.octets(),
        None => [0; 16],
    }
}

fn my_dests(d: &Data, s: &Settled) -> Vec<Dest> {
    let mut seed = (std::process::id() as u64) << 32
        ^ Instant::now().elapsed().as_nanos() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_nanos() as u64);
    d.ids
        .iter()
        .zip(&d.qps)
        .map(|(id, qp)| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let ip = id.local_addr().map(|a| a.ip());
            let gid_index = match (id.device(), ip) {
                (Some(dev), Some(ip)) => dev.gid_index(ip).unwrap_or(0).into(),
                _ => 0,
            };
            Dest {
                lid: 0,
                out_reads: if s.p.test.verb == Verb::Read {
                    s.out_reads
                } else {
                    1
                },
                qpn: qp.qpn(),
                psn: (seed >> 40) as u32 & 0xff_ffff,
                rkey: d.mr.rkey(),
                vaddr: d.mr.addr(),
                tail_markers_vaddr: 0,
                gid: gid_of(ip),
                srqn: 0,
                gid_index,
            }
        })
        .collect()
}

/// The handshakes between the CM connections and the data phase, test by test.
fn dest_handshakes(comm: &mut Comm, test: Test, mine: &[Dest]) -> Result<Vec<Dest>, String> {
    let mut rem = vec![Dest::default(); mine.len()];
    let each = |comm: &mut Comm, rem: &mut Vec<Dest>| -> Result<(), String> {
        for (i, m) in mine.iter().enumerate() {
            rem[i] = comm.hand_shake(m)?;
        }
        Ok(())
    };
    match (test.verb, test.kind) {
        (Verb::Send, _) => {
            each(comm, &mut rem)?;
            rem[0] = comm.hand_shake(&mine[0])?;
            each(comm, &mut rem)?;
        }
        (_, Kind::Lat) => {
            rem[0] = comm.hand_shake(&mine[0])?;
            each(comm, &mut rem)?;
            each(comm, &mut rem)?;
            rem[0] = comm.hand_shake(&mine[0])?;
        }
        (_, Kind::Bw) => {
            each(comm, &mut rem)?;
            each(comm, &mut rem)?;
            rem[0] = comm.hand_shake(&mine[0])?;
        }
    }
    Ok(rem)
}

/// Polls the test CQ: statuses, receives reposted, a dead peer detected.
struct Poller<'a> {
    d: &'a Data,
    /// When the idle check last saw progress (checked every 1024 empty polls; a clock
    /// read per completion would be a tenth of a 64 B round trip).
    last: Instant,
    spins: u32,
    progressed: bool,
}

impl<'a> Poller<'a> {
    fn new(d: &'a Data) -> Poller<'a> {
        Poller {
            d,
            last: Instant::now(),
            spins: 0,
            progressed: false,
        }
    }

    fn poll(&mut self) -> Result<Option<Completion>, String> {
        match self.d.cq.poll_one() {
            Some(c) => {
                if !c.status.is_success() {
                    return Err(format!(
                        "completion with error: {:?} ({:?})",
                        c.status, c.opcode
                    ));
                }
                if c.opcode == WcOpcode::Recv {
                    let sge = self
                        .d
                        .mr
                        .sge(0, self.d.max_msg as u32)
                        .map_err(err("receive buffer"))?;
                    let qp = self
                        .d
                        .qps
                        .iter()
                        .find(|q| q.qpn() == c.qp_num)
                        .ok_or("completion of an unknown QP")?;
                    qp.post_recv(&RecvWr::new(0).with_sge(sge))
                        .map_err(err("post_recv"))?;
                }
                self.progressed = true;
                Ok(Some(c))
            }
            None => {
                self.spins = self.spins.wrapping_add(1);
                if !self.spins.is_multiple_of(1024) {
                    return Ok(None);
                }
                if std::mem::take(&mut self.progressed) {
                    self.last = Instant::now();
                } else if self.last.elapsed() > IDLE {
                    return Err(format!(
                        "the peer stopped answering (nothing for {} s)",
                        IDLE.as_secs()
                    ));
                }
                Ok(None)
            }
        }
    }
}

fn post(d: &Data, qp: usize, wr: &SendWr) -> Result<(), String> {
    d.qps
        .get(qp)
        .ok_or("no QP")?
        .post_send(wr)
        .map_err(err("post_send"))
}

fn over(p: &Params, t0: Instant, done: u64) -> bool {
    match p.duration {
        Some(d) => t0.elapsed() >= d,
        None => done >= p.iters,
    }
}

/// The clock of the latency tests' time stamps: the CPU's counter where it runs at a
/// constant rate (as perftest's `get_cycles`: a few ns, where a system clock read costs
/// tens of ns inside the measured round trip), else the monotonic clock. Calibrated once,
/// before the first test ([`calibrate`]).
fn stamps() -> &'static quanta::Clock {
    static CLOCK: std::sync::OnceLock<quanta::Clock> = std::sync::OnceLock::new();
    CLOCK.get_or_init(quanta::Clock::new)
}

/// Calibrates the time stamps' clock (some ms) outside any measurement.
pub(super) fn calibrate() {
    stamps();
}

/// A time stamp.
pub(super) fn stamp() -> u64 {
    stamps().raw()
}

/// µs from time stamp `t` to now.
pub(super) fn us_since(t: u64) -> f64 {
    stamps().delta_as_nanos(t, stamp()) as f64 / 1e3
}

/// `run_iter_lat_send`: the client sends first; `iters` SENDs of `size` bytes each way.
fn send_lat(d: &Data, s: &Settled, size: usize, client: bool) -> Result<LatRecorder, String> {
    let mut pl = Poller::new(d);
    let sge = d.mr.sge(d.region, size as u32).map_err(err("buffer"))?;
    let wr = SendWr::new(1, SendOp::Send).with_sge(sge);
    let mut rec = LatRecorder::new();
    let t0 = Instant::now();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut sent_at = None;
    loop {
        let done = over(&s.p, t0, scnt.min(rcnt));
        if done && scnt == rcnt {
            break;
        }
        if (client && scnt == rcnt) || (!client && rcnt > scnt) {
            if s.p.duration.is_some() && t0.elapsed() >= s.p.duration.unwrap_or_default() {
                break;
            }
            sent_at = Some(stamp());
            scnt += 1;
            post(d, 0, &super::signal_some(&s.p, wr, scnt))?;
            continue;
        }
        if let Some(c) = pl.poll()? {
            if c.opcode == WcOpcode::Recv {
                rcnt += 1;
                if let Some(t) = sent_at.take() {
                    rec.record(us_since(t) / 2.0);
                }
            }
        } else if s.p.duration.is_some() && t0.elapsed() >= s.p.duration.unwrap_or_default() {
            break;
        }
    }
    // The last SEND's completion (perftest waits for it too).
    Ok(rec)
}

/// `run_iter_lat_write`: the server writes first; each side waits for the peer's counter in
/// the last byte of its buffer, then writes its own counter in the last byte of `size`.
fn write_lat(
    d: &Data,
    s: &Settled,
    size: usize,
    rem: &Dest,
    client: bool,
) -> Result<LatRecorder, String> {
    let mut pl = Poller::new(d);
    let sge = d.mr.sge(d.region, size as u32).map_err(err("buffer"))?;
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: rem.vaddr,
            rkey: rem.rkey,
        },
    )
    .with_sge(sge);
    let mut rec = LatRecorder::new();
    let t0 = Instant::now();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut sent_at: Option<u64> = None;
    let mut b = [0u8];
    loop {
        if over(&s.p, t0, scnt) && rcnt >= scnt {
            break;
        }
        let need = if client { rcnt == scnt } else { rcnt < scnt };
        if need {
            // Wait for the peer's counter rcnt + 1.
            let want = (rcnt + 1) as u8;
            let mut spins = 0u32;
            loop {
                pl.poll()?;
                d.mr.read(size - 1, &mut b).map_err(|e| e.to_string())?;
                if b[0] == want {
                    break;
                }
                // the clock only now and then: a read per spin would delay seeing the byte
                spins = spins.wrapping_add(1);
                if !spins.is_multiple_of(1024) {
                    continue;
                }
                if s.p.duration.is_some() && t0.elapsed() >= s.p.duration.unwrap_or_default() + IDLE
                {
                    return Ok(rec);
                }
                if pl.last.elapsed() > IDLE {
                    return Err(format!(
                        "the peer stopped writing (nothing for {} s)",
                        IDLE.as_secs()
                    ));
                }
            }
            rcnt += 1;
            if let Some(t) = sent_at.take() {
                rec.record(us_since(t) / 2.0);
            }
            pl.progressed = true;
            if over(&s.p, t0, scnt) && rcnt >= scnt {
                break;
            }
        }
        scnt += 1;
        d.mr.write(d.region + size - 1, &[scnt as u8])
            .map_err(|e| e.to_string())?;
        sent_at = Some(stamp());
        post(d, 0, &super::signal_some(&s.p, wr, scnt))?;
    }
    Ok(rec)
}

/// `run_iter_lat` for READ: the client reads `size` bytes from the peer's buffer, one at a
/// time.
fn read_lat(d: &Data, s: &Settled, size: usize, rem: &Dest) -> Result<LatRecorder, String> {
    let mut pl = Poller::new(d);
    let sge = d.mr.sge(d.region, size as u32).map_err(err("buffer"))?;
    let wr = SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: rem.vaddr,
            rkey: rem.rkey,
        },
    )
    .with_sge(sge)
    .signaled();
    let mut rec = LatRecorder::new();
    let t0 = Instant::now();
    let mut n = 0u64;
    while !over(&s.p, t0, n) {
        let t = stamp();
        post(d, 0, &wr)?;
        loop {
            if let Some(c) = pl.poll()? {
                if c.opcode == WcOpcode::RdmaRead {
                    break;
                }
            }
        }
        rec.record(us_since(t));
        n += 1;
    }
    Ok(rec)
}

/// `run_iter_bw`: `iters` messages per QP (or for the duration), `tx_depth` in flight per
/// QP, remote addresses striding through the peer's cycle buffer as perftest's do.
fn bw_client(d: &Data, s: &Settled, size: usize, rem: &[Dest]) -> Result<BwStats, String> {
    let mut pl = Poller::new(d);
    let q = d.qps.len();
    let depth = u64::from(s.p.tx_depth.max(1));
    let mut posted = vec![0u64; q];
    let mut done = vec![0u64; q];
    let t0 = Instant::now();
    let window: u64 = 64;
    let (mut win_t, mut win_n, mut peak) = (t0, 0u64, 0f64);
    let mut stop = false;
    loop {
        if !stop {
            stop = match s.p.duration {
                Some(dur) => t0.elapsed() >= dur,
                None => false,
            };
        }
        let mut all_done = true;
        for i in 0..q {
            let limit_hit = s.p.duration.is_none() && posted[i] >= s.p.iters;
            if !stop && !limit_hit && posted[i] - done[i] < depth {
                let k = posted[i];
                let off = pt::bw_offset(k, size, s.cycle, s.cache_line);
                let sge =
                    d.mr.sge(d.region + off % d.region.max(1), size as u32)
                        .map_err(err("buffer"))?;
                let op = match s.p.test.verb {
                    Verb::Send => SendOp::Send,
                    Verb::Write => SendOp::RdmaWrite {
                        remote_addr: rem[i].vaddr + off as u64,
                        rkey: rem[i].rkey,
                    },
                    Verb::Read => SendOp::RdmaRead {
                        remote_addr: rem[i].vaddr + off as u64,
                        rkey: rem[i].rkey,
                    },
                };
                post(d, i, &SendWr::new(i as u64, op).with_sge(sge).signaled())?;
                posted[i] += 1;
            }
            let finished = if s.p.duration.is_some() {
                stop
            } else {
                posted[i] >= s.p.iters
            };
            if !(finished && done[i] == posted[i]) {
                all_done = false;
            }
        }
        if all_done {
            break;
        }
        if let Some(c) = pl.poll()? {
            if c.opcode == WcOpcode::Recv {
                continue;
            }
            let i = (c.wr_id as usize).min(q - 1);
            done[i] += 1;
            win_n += 1;
            if win_n == window {
                let now = Instant::now();
                let dt = now.duration_since(win_t).as_secs_f64();
                if dt > 0.0 {
                    peak = peak.max((window as usize * size) as f64 / dt);
                }
                win_t = now;
                win_n = 0;
            }
        }
    }
    let total: u64 = done.iter().sum();
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    let mb = (1u64 << 20) as f64;
    let avg = (total as usize * size) as f64 / secs;
    Ok(BwStats {
        bytes: size,
        iters: total,
        peak: peak.max(avg) / mb,
        avg: avg / mb,
        mpps: total as f64 / secs / 1e6,
    })
}

/// `run_iter_bw_server`: `iters` receives per QP (or for the duration).
fn send_bw_server(d: &Data, s: &Settled, size: usize) -> Result<BwStats, String> {
    let mut pl = Poller::new(d);
    let want = s.p.iters * d.qps.len() as u64;
    let mut n = 0u64;
    let mut t0 = None;
    while s.p.duration.is_some() || n < want {
        if let (Some(dur), Some(t)) = (s.p.duration, t0) {
            if Instant::now().duration_since(t) >= dur {
                break;
            }
        }
        if let Some(c) = pl.poll()? {
            if c.opcode == WcOpcode::Recv {
                t0.get_or_insert_with(Instant::now);
                n += 1;
            }
        }
    }
    let secs = t0.map_or(1e-9, |t: Instant| t.elapsed().as_secs_f64().max(1e-9));
    let mb = (1u64 << 20) as f64;
    let avg = (n as usize * size) as f64 / secs;
    Ok(BwStats {
        bytes: size,
        iters: n,
        peak: avg / mb,
        avg: avg / mb,
        mpps: n as f64 / secs / 1e6,
    })
}

fn lat_outcome(rec: &LatRecorder, size: usize) -> Option<Outcome> {
    rec.stats(size).map(Outcome::Lat)
}

/// `xchg_bw_reports`: five 8-byte messages each way.
fn xchg_reports(comm: &mut Comm, s: &Settled, mine: &BwReport) -> Result<BwReport, String> {
    let msgs = mine.encode(s.rem_version);
    let mut got = Vec::new();
    for m in &msgs {
        got.push(comm.xchg(m, &[m.len()], "bandwidth report")?);
    }
    BwReport::decode(&got).ok_or_else(|| "bad bandwidth report".into())
}

fn report_of(b: &BwStats) -> BwReport {
    BwReport {
        size: b.bytes as u64,
        iters: b.iters,
        bw_peak: b.peak,
        bw_avg: b.avg,
        msg_rate: b.mpps,
    }
}

fn stats_of(r: &BwReport) -> BwStats {
    BwStats {
        bytes: r.size as usize,
        iters: r.iters,
        peak: r.bw_peak,
        avg: r.bw_avg,
        mpps: r.msg_rate,
    }
}

/// The data phase and the closing handshakes of one side; the rows it prints.
fn run_tests(
    comm: &mut Comm,
    d: &Data,
    s: &Settled,
    mine: &[Dest],
    rem: &[Dest],
    client: bool,
    print: bool,
) -> Result<Vec<Outcome>, String> {
    let p = &s.p;
    let mut out = Vec::new();
    let row = |o: Outcome, out: &mut Vec<Outcome>| {
        if print {
            println!("{}", o.row());
        }
        out.push(o);
    };
    if print {
        println!("{}", report::header(p.test.kind));
    }
    match (p.test.verb, p.test.kind) {
        (Verb::Send, Kind::Lat) => {
            for size in p.sizes() {
                comm.hand_shake(&mine[0])?;
                let rec = send_lat(d, s, size, client)?;
                if let Some(o) = lat_outcome(&rec, size) {
                    row(o, &mut out);
                }
            }
            comm.hand_shake(&mine[0])?;
        }
        (Verb::Send, Kind::Bw) => {
            for size in p.sizes() {
                comm.hand_shake(&mine[0])?;
                let b = if client {
                    bw_client(d, s, size, rem)?
                } else {
                    send_bw_server(d, s, size)?
                };
                row(Outcome::Bw(b), &mut out);
                if p.all {
                    comm.hand_shake(&mine[0])?;
                }
            }
            comm.hand_shake(&mine[0])?;
        }
        (Verb::Write, Kind::Lat) => {
            for size in p.sizes() {
                let rec = write_lat(d, s, size, &rem[0], client)?;
                if let Some(o) = lat_outcome(&rec, size) {
                    row(o, &mut out);
                }
            }
        }
        (Verb::Read, Kind::Lat) => {
            if client {
                for size in p.sizes() {
                    let rec = read_lat(d, s, size, &rem[0])?;
                    if let Some(o) = lat_outcome(&rec, size) {
                        row(o, &mut out);
                    }
                }
            }
            comm.hand_shake(&mine[0])?;
        }
        (_, Kind::Bw) => {
            let mut last = BwReport::default();
            if client {
                for size in p.sizes() {
                    let b = bw_client(d, s, size, rem)?;
                    last = report_of(&b);
                    row(Outcome::Bw(b), &mut out);
                }
            }
            comm.hand_shake(&mine[0])?;
            let r = xchg_reports(comm, s, &last)?;
            if !client {
                row(Outcome::Bw(stats_of(&r)), &mut out);
            }
            comm.hand_shake(&mine[0])?;
        }
    }
    if print {
        println!("{DASHES}");
    }
    Ok(out)
}

/// `rdma_cm_disconnect_nodes`: the server disconnects every test connection, both sides
/// wait for the DISCONNECTED events (the client disconnects itself if none comes).
fn teardown(d: &Data, comm: &Comm, client: bool, hook: Hook<'_>) {
    if !client {
        for id in &d.ids {
            let _ = id.disconnect();
        }
    }
    let mut left = d.ids.len();
    let deadline = Instant::now() + Duration::from_secs(if client { 10 } else { 5 });
    while left > 0 && Instant::now() < deadline {
        match d.ch.get_event_timeout(Duration::from_millis(100)) {
            Ok(Some(ev)) => {
                hook(&ev);
                if ev.kind() == EventType::Disconnected {
                    let n = ev.id_num();
                    drop(ev);
                    if client {
                        if let Some(id) = d.ids.iter().find(|i| i.num() == n) {
                            let _ = id.disconnect();
                        }
                    }
                    left -= 1;
                }
            }
            Ok(None) => {}
            Err(_) => break,
        }
    }
    if client && left > 0 {
        for id in &d.ids {
            let _ = id.disconnect();
        }
    }
    // perftest leaves its communication connection to the end of the process.
    let _ = comm.id.disconnect();
}

fn comm_limit(p: &Params) -> Duration {
    Duration::from_secs(120 + p.duration.map_or(0, |d| d.as_secs() * 24))
}

fn banner(s: &Settled, d: &Data, mine: &[Dest], rem: &[Dest]) {
    let dev = d
        .ids
        .first()
        .and_then(|id| id.netdev())
        .map_or_else(|| "?".into(), |(n, _)| n);
    let mtu = 128usize << s.mtu.clamp(1, 5);
    println!("{}", report::banner(&s.p, &dev, &format!("{mtu}[B]")));
    let line = |side: &str, x: &Dest| {
        println!(
            " {side} address: LID {:#06x} QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
            x.lid, x.qpn, x.psn, x.rkey, x.vaddr
        );
        let g = x.gid;
        println!(
            " GID: {}",
            g.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        );
    };
    for m in mine {
        line("local", m);
    }
    for r in rem {
        line("remote", r);
    }
}

/// The client side of perftest's `-R` (`ib_*_* -R server`): what the server printed is up to
/// it; returns our rows.
pub fn client(p: &Params, hook: Hook<'_>, print: bool) -> Result<Vec<Outcome>, String> {
    let dst = p.server.ok_or("no server address")?;
    let cma = Cma::new().map_err(err("rdma_cm context"))?;
    // ~0.5 s per try, 7 tries: a busy peer (a loaded machine) still answers in time; an
    // absent listener is a REJ at once, only a silent host waits them out
    cma.set_cm_timeouts(17, 6).map_err(err("CM timeouts"))?;
    let ch = EventChannel::with_cma(&cma).map_err(err("event channel"))?;
    let limit = Duration::from_secs(10);
    let id = CmId::new(&ch, PortSpace::Tcp).map_err(err("create id"))?;
    id.resolve_addr(p.bind, dst, Duration::from_secs(2))
        .map_err(|e| format!("resolve addr {}: {e}", dst.ip()))?;
    wait(&ch, EventType::AddrResolved, limit, hook).map_err(err("resolve addr"))?;
    id.resolve_route(Duration::from_secs(2))
        .map_err(err("resolve route"))?;
    wait(&ch, EventType::RouteResolved, limit, hook).map_err(err("resolve route"))?;
    let mut comm = Comm::new(ch, id, true, comm_limit(p))?;
    let param = ConnParam {
        private_data: Vec::new(),
        responder_resources: 0,
        initiator_depth: 0,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    };
    comm.id.connect(&param).map_err(err("connect"))?;
    wait(&comm.ch, EventType::Established, limit * 3, hook)
        .map_err(|e| format!("connect to {dst}: {e}"))?;
    let s = exchange(&mut comm, p, false)?;
    comm.hand_shake(&Dest::default())?;
    let d = connect_tests(&cma, &s, dst, &mut *hook)?;
    comm.hand_shake(&Dest::default())?;
    let mine = my_dests(&d, &s);
    let rem = dest_handshakes(&mut comm, s.p.test, &mine)?;
    if print {
        banner(&s, &d, &mine, &rem);
    }
    let out = run_tests(&mut comm, &d, &s, &mine, &rem, true, print);
    teardown(&d, &comm, true, hook);
    out
}

/// A communication request a server has taken (from its listener) and not answered yet.
pub struct Request {
    /// The context of both.
    pub cma: Cma,
    /// The listener's channel.
    pub ch: EventChannel,
    /// The listener.
    pub listen: CmId,
    /// The request's id.
    pub id: CmId,
}

/// Listens on `p.bind` (or every address) at `p.port` and takes the first request.
pub fn listen(p: &Params, hook: Hook<'_>, ready: &mut dyn FnMut()) -> Result<Request, String> {
    let cma = Cma::new().map_err(err("rdma_cm context"))?;
    let ch = EventChannel::with_cma(&cma).map_err(err("event channel"))?;
    let addr = p
        .bind
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], p.port)));
    let listen = CmId::new(&ch, PortSpace::Tcp).map_err(err("create id"))?;
    listen
        .bind_addr(addr)
        .map_err(|e| format!("bind {addr}: {e}"))?;
    listen
        .listen(p.qps.max(1) as usize)
        .map_err(err("listen"))?;
    ready();
    loop {
        let mut ev = ch.get_event().map_err(err("get_event"))?;
        hook(&ev);
        if ev.kind() != EventType::ConnectRequest {
            continue;
        }
        let Some(id) = ev.take_id() else { continue };
        drop(ev);
        return Ok(Request {
            cma,
            ch,
            listen,
            id,
        });
    }
}

/// The server side of perftest's `-R` for one client, from its communication request. The
/// server follows the client's sizes, iterations, duration and QPs (its negotiation).
pub fn serve(
    p: &Params,
    req: Request,
    hook: Hook<'_>,
    print: bool,
) -> Result<Vec<Outcome>, String> {
    let Request {
        cma,
        ch,
        listen,
        id,
    } = req;
    // rdma_server_connect: resources on the request's device, accept, the listener goes.
    let comm_ch = ch;
    let mut comm = Comm::new(comm_ch, id, false, comm_limit(p))?;
    let param = ConnParam {
        private_data: Vec::new(),
        responder_resources: 0,
        initiator_depth: 0,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    };
    comm.id.accept(&param).map_err(err("accept"))?;
    drop(listen);
    let s = exchange(&mut comm, p, true)?;
    // The first sync: we listen for the test QPs before answering it.
    let b = comm.recv()?;
    if b.len() != comm.dest_len {
        return Err(format!(
            "perftest exchange: pingpong_dest: got {} bytes, expected {} (perftest {})",
            b.len(),
            comm.dest_len,
            s.rem_version
        ));
    }
    let tch = EventChannel::with_cma(&cma).map_err(err("event channel"))?;
    let tl = CmId::new(&tch, PortSpace::Tcp).map_err(err("create id"))?;
    let addr = p
        .bind
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], p.port)));
    let addr = SocketAddr::new(addr.ip(), p.port);
    tl.bind_addr(addr)
        .map_err(|e| format!("bind {addr}: {e}"))?;
    tl.listen(s.p.qps as usize).map_err(err("listen"))?;
    comm.send(&Dest::default().encode_len(comm.dest_len))?;
    let d = accept_tests(tch, tl, &s, &mut *hook)?;
    comm.hand_shake(&Dest::default())?;
    let mine = my_dests(&d, &s);
    let rem = dest_handshakes(&mut comm, s.p.test, &mine)?;
    if print {
        banner(&s, &d, &mine, &rem);
    }
    let out = run_tests(&mut comm, &d, &s, &mine, &rem, false, print);
    teardown(&d, &comm, false, hook);
    drop(cma);
    out
}

/// `rdma-perf TEST -R` as a server: listens, serves one perftest client.
pub fn server(
    p: &Params,
    hook: Hook<'_>,
    print: bool,
    ready: &mut dyn FnMut(),
) -> Result<Vec<Outcome>, String> {
    if print {
        println!("\n************************************\n* Waiting for client to connect... *\n************************************");
    }
    let req = listen(p, &mut *hook, ready)?;
    serve(p, req, hook, print)
}
