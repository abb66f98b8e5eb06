//! The communication connection (perftest's `user_comm`) and the in-band exchange of
//! versions, sizes, MTU and parameters over it.

use super::*;

/// The communication connection (perftest's `user_comm.rdma_ctx`).
pub struct Comm {
    pub(super) ch: EventChannel,
    pub(super) id: CmId,
    pub(super) qp: Arc<QueuePair>,
    pub(super) cq: CompletionQueue,
    pub(super) mr: MemoryRegion,
    pub(super) client: bool,
    pub(super) stash: Option<Vec<u8>>,
    pub(super) limit: Duration,
    /// The peer's `pingpong_dest` size (by its version, once exchanged).
    pub(super) dest_len: usize,
    pub(super) _pd: ProtectionDomain,
}

impl Comm {
    pub(super) fn new(
        ch: EventChannel,
        id: CmId,
        client: bool,
        limit: Duration,
    ) -> Result<Comm, String> {
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

    pub(super) fn post_recv(&self) -> Result<(), String> {
        let sge = self.mr.sge(0, CBUF as u32).map_err(err("receive buffer"))?;
        self.qp
            .post_recv(&RecvWr::new(SYNC).with_sge(sge))
            .map_err(err("post_recv"))
    }

    pub(super) fn completion(&mut self, c: Completion) -> Result<Option<Vec<u8>>, String> {
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

    pub(super) fn idle_check(&self, since: Instant) -> Result<(), String> {
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
pub(super) struct Settled {
    pub(super) p: Params,
    pub(super) rem_version: f64,
    pub(super) cycle: usize,
    pub(super) cache_line: usize,
    pub(super) mtu: u8,
    pub(super) out_reads: u32,
}

pub(super) fn negotiate_of(p: &Params) -> Negotiate {
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
pub(super) fn adopt(p: &Params, n: &Negotiate) -> Params {
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
pub(super) fn exchange(comm: &mut Comm, p: &Params, follow: bool) -> Result<Settled, String> {
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

pub(super) fn check_len(b: &[u8], sizes: &[usize]) -> Result<(), String> {
    if sizes.contains(&b.len()) {
        Ok(())
    } else {
        Err(format!(
            "perftest exchange: negotiation of {} bytes, expected {sizes:?}",
            b.len()
        ))
    }
}
