//! The test connections: one CM connection per test QP to the same port, their verbs
//! objects and memory, and the exchange of `pingpong_dest`s.

use super::*;

/// The test QPs and their memory: area 0 (`region` bytes) is what the peer writes to, reads
/// from and where receives land; area 1 is the source of our SENDs and WRITEs and the
/// destination of our READs.
pub(super) struct Data {
    pub(super) ch: EventChannel,
    pub(super) ids: Vec<CmId>,
    pub(super) qps: Vec<Arc<QueuePair>>,
    pub(super) cq: CompletionQueue,
    pub(super) mr: MemoryRegion,
    pub(super) region: usize,
    pub(super) max_msg: usize,
    pub(super) _pd: ProtectionDomain,
}

pub(super) struct Verbs {
    pub(super) pd: ProtectionDomain,
    pub(super) cq: CompletionQueue,
    pub(super) mr: MemoryRegion,
}

pub(super) fn max_msg(s: &Settled) -> usize {
    s.p.sizes().into_iter().max().unwrap_or(1)
}

pub(super) fn region(s: &Settled) -> usize {
    pt::buff_size(max_msg(s), s.cycle).max(CBUF)
}

pub(super) fn verbs(id: &CmId, s: &Settled) -> Result<Verbs, String> {
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

pub(super) fn create_qp(id: &CmId, v: &Verbs, s: &Settled) -> Result<Arc<QueuePair>, String> {
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
pub(super) fn conn_param(s: &Settled, resp: u32, init: u32) -> ConnParam {
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

pub(super) fn data(
    ch: EventChannel,
    ids: Vec<CmId>,
    qps: Vec<Arc<QueuePair>>,
    v: Verbs,
    s: &Settled,
) -> Data {
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
pub(super) fn connect_tests(
    cma: &Cma,
    s: &Settled,
    dst: SocketAddr,
    hook: Hook<'_>,
) -> Result<Data, String> {
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
pub(super) fn accept_tests(
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

pub(super) fn gid_of(ip: Option<IpAddr>) -> [u8; 16] {
    match ip {
        Some(IpAddr::V4(a)) => a.to_ipv6_mapped().octets(),
        Some(IpAddr::V6(a)) => a.octets(),
        None => [0; 16],
    }
}

pub(super) fn my_dests(d: &Data, s: &Settled) -> Vec<Dest> {
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
pub(super) fn dest_handshakes(
    comm: &mut Comm,
    test: Test,
    mine: &[Dest],
) -> Result<Vec<Dest>, String> {
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
