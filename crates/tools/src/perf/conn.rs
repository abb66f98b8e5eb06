//! Connection setup through the connection manager: the client resolves, creates its QPs
//! and connects with its parameters and buffer in the private data; the server listens,
//! checks the request and accepts with its buffer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_soft::verbs::{
    AccessFlags, CompletionQueue, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair, RecvWr,
};
use rdmacm::cm::{CmId, Cma, ConnParam, Event, EventChannel, EventType, PortSpace};

use super::proto::{decode_remote, encode_remote, Hello, Remote};
use super::Params;
use crate::events::describe;

/// Receives kept posted on every QP.
pub const RQ_DEPTH: usize = 256;

/// Called with every CM event a side sees (the demo prints them).
pub type Hook<'a> = &'a mut dyn FnMut(&Event);

/// A connected side: its QPs (in connection order), CQ, memory and the peer's buffer.
///
/// The memory region holds two areas of [`Link::region`] bytes: the first is what the peer
/// writes into, reads from and what receives land in; the second is the source of sends
/// and writes.
pub struct Link {
    /// The QPs, by connection index.
    pub qps: Vec<Arc<QueuePair>>,
    /// The CQ of every QP, sends and receives.
    pub cq: CompletionQueue,
    /// The memory region (2 × region).
    pub mr: MemoryRegion,
    /// Bytes of each area.
    pub region: usize,
    /// Largest message (receive buffers are this long).
    pub max_msg: usize,
    /// The peer's first area.
    pub remote: Remote,
    /// Time from the first CM call to the last ESTABLISHED.
    pub setup: Duration,
    /// The CM ids, by connection index.
    pub ids: Vec<CmId>,
    /// Their event channel.
    pub ch: EventChannel,
    _pd: ProtectionDomain,
    _cma: Cma,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("qps", &self.qps.len())
            .field("region", &self.region)
            .field("remote", &self.remote)
            .finish()
    }
}

impl Link {
    /// Posts a receive of [`Link::max_msg`] bytes on QP `i`.
    pub fn post_recv(&self, i: usize) -> Result<(), String> {
        let sge = self
            .mr
            .sge(0, self.max_msg as u32)
            .map_err(|e| format!("receive buffer: {e}"))?;
        let qp = self.qps.get(i).ok_or("no such QP")?;
        qp.post_recv(&RecvWr::new(i as u64).with_sge(sge))
            .map_err(|e| format!("post_recv: {e}"))
    }

    /// The index of the QP numbered `qpn`.
    pub fn qp_index(&self, qpn: u32) -> Option<usize> {
        self.qps.iter().position(|q| q.qpn() == qpn)
    }

    /// Disconnects every connection and waits (briefly) for the DISCONNECTED events.
    pub fn disconnect(&self, hook: Hook<'_>) {
        let mut left = 0;
        for id in &self.ids {
            if id.disconnect().is_ok() {
                left += 1;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while left > 0 && Instant::now() < deadline {
            match self.ch.get_event_timeout(Duration::from_millis(100)) {
                Ok(Some(ev)) => {
                    hook(&ev);
                    if ev.kind() == EventType::Disconnected {
                        left -= 1;
                    }
                }
                Ok(None) => {}
                Err(_) => break,
            }
        }
    }

    /// Waits up to `limit` for the peer to disconnect, then disconnects (the server's end).
    pub fn wait_disconnect(&self, limit: Duration, hook: Hook<'_>) {
        let deadline = Instant::now() + limit;
        let mut left = self.ids.len();
        while left > 0 && Instant::now() < deadline {
            match self.ch.get_event_timeout(Duration::from_millis(100)) {
                Ok(Some(ev)) => {
                    hook(&ev);
                    if ev.kind() == EventType::Disconnected {
                        let n = ev.id_num();
                        drop(ev);
                        if let Some(id) = self.ids.iter().find(|i| i.num() == n) {
                            let _ = id.disconnect();
                        }
                        left -= 1;
                    }
                }
                Ok(None) => {}
                Err(_) => break,
            }
        }
    }
}

pub(crate) fn wait(
    ch: &EventChannel,
    want: EventType,
    limit: Duration,
    hook: Hook<'_>,
) -> Result<Event, String> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = ch
            .get_event_timeout(left)
            .map_err(|e| format!("get_event: {e}"))?
            .ok_or_else(|| format!("timed out waiting for {}", want.name()))?;
        hook(&ev);
        if ev.kind() == want {
            return Ok(ev);
        }
        match ev.kind() {
            EventType::AddrChange | EventType::TimewaitExit => {}
            _ => return Err(describe(&ev)),
        }
    }
}

struct Verbs {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    mr: MemoryRegion,
}

fn verbs(id: &CmId, p: &Params) -> Result<Verbs, String> {
    let dev = id.device().ok_or("the id has no device")?;
    let pd = dev.alloc_pd().map_err(|e| format!("alloc_pd: {e}"))?;
    let cq = dev
        .create_cq(4096, None)
        .map_err(|e| format!("create_cq: {e}"))?;
    let mr = pd
        .alloc(
            2 * p.region_len(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .map_err(|e| format!("register memory: {e}"))?;
    Ok(Verbs { pd, cq, mr })
}

/// The QPs' local ACK timeout: perftest's default `-u` (DEF_QP_TIME 14, 67 ms), not the
/// CM's packet-lifetime value (17, 537 ms): each lost tail packet of a message costs one
/// timeout, which made lossy bandwidth runs crawl.
const QP_TIMEOUT: u8 = 14;

fn create_qp(id: &CmId, v: &Verbs, p: &Params) -> Result<Arc<QueuePair>, String> {
    id.set_option(rdmacm::cm::CmOption::AckTimeout(QP_TIMEOUT))
        .map_err(|e| format!("set ACK timeout: {e}"))?;
    let mut init = QpInitAttr::rc(&v.cq, &v.cq);
    init.cap.max_send_wr = p.tx_depth + 8;
    init.cap.max_recv_wr = RQ_DEPTH as u32;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    let qp = id
        .create_qp(&v.pd, &init)
        .map_err(|e| format!("create_qp: {e}"))?;
    // Receives go in before the connection exists, so nothing arrives to an empty queue.
    let sge =
        v.mr.sge(0, max_msg(p) as u32)
            .map_err(|e| format!("receive buffer: {e}"))?;
    for _ in 0..RQ_DEPTH {
        qp.post_recv(&RecvWr::new(0).with_sge(sge))
            .map_err(|e| format!("post_recv: {e}"))?;
    }
    Ok(qp)
}

fn max_msg(p: &Params) -> usize {
    p.sizes().into_iter().max().unwrap_or(1)
}

fn param(private_data: Vec<u8>) -> ConnParam {
    ConnParam {
        private_data,
        responder_resources: 16,
        initiator_depth: 16,
        ..Default::default()
    }
}

#[allow(clippy::too_many_arguments)]
fn link(
    ids: Vec<CmId>,
    ch: EventChannel,
    cma: Cma,
    v: Verbs,
    qps: Vec<Arc<QueuePair>>,
    p: &Params,
    remote: Remote,
    t0: Instant,
) -> Link {
    Link {
        qps,
        cq: v.cq,
        mr: v.mr,
        region: p.region_len(),
        max_msg: max_msg(p),
        remote,
        setup: t0.elapsed(),
        ids,
        ch,
        _pd: v.pd,
        _cma: cma,
    }
}

/// The client: `p.qps` connections to `p.server` from `p.bind`.
pub fn client(p: &Params, hook: Hook<'_>) -> Result<Link, String> {
    let dst = p.server.ok_or("no server address")?;
    let cma = Cma::new().map_err(|e| format!("rdma_cm context: {e}"))?;
    // About 0.5 s per try, 7 tries: a busy server (a loaded machine) still answers in time;
    // an absent listener is a REJ at once, only a silent host waits the ~4 s out.
    cma.set_cm_timeouts(17, 6)
        .map_err(|e| format!("CM timeouts: {e}"))?;
    let ch = EventChannel::with_cma(&cma).map_err(|e| format!("event channel: {e}"))?;
    let t0 = Instant::now();
    let limit = Duration::from_secs(10);
    let (mut ids, mut qps) = (Vec::new(), Vec::new());
    let mut v: Option<Verbs> = None;
    let mut remote = None;
    for i in 0..p.qps {
        let id = CmId::new(&ch, PortSpace::Tcp).map_err(|e| format!("create id: {e}"))?;
        id.resolve_addr(p.bind, dst, Duration::from_secs(2))
            .map_err(|e| format!("resolve addr {}: {e}", dst.ip()))?;
        wait(&ch, EventType::AddrResolved, limit, hook)
            .map_err(|e| format!("resolve addr: {e}"))?;
        id.resolve_route(Duration::from_secs(2))
            .map_err(|e| format!("resolve route: {e}"))?;
        wait(&ch, EventType::RouteResolved, limit, hook)
            .map_err(|e| format!("resolve route: {e}"))?;
        if v.is_none() {
            v = Some(verbs(&id, p)?);
        }
        let vb = v.as_ref().ok_or("no verbs")?;
        qps.push(create_qp(&id, vb, p)?);
        let mine = Remote {
            addr: vb.mr.addr(),
            rkey: vb.mr.rkey(),
            len: p.region_len() as u32,
        };
        let hello = Hello::new(p, i as u8, mine);
        id.connect(&param(hello.encode()))
            .map_err(|e| format!("connect: {e}"))?;
        let ev = wait(&ch, EventType::Established, limit * 3, hook)
            .map_err(|e| format!("connect to {dst}: {e}"))?;
        let r = decode_remote(ev.private_data()).ok_or(
            "connect: the server's answer is not rdma-perf's (no parameters in its REP): \
                 a perftest server (ib_* -R) needs rdma-perf's -R",
        )?;
        drop(ev);
        if r.len < p.region_len() as u32 {
            return Err("connect: the server's buffer is too small".into());
        }
        remote = Some(r);
        ids.push(id);
    }
    let v = v.ok_or("no connection")?;
    let remote = remote.ok_or("no connection")?;
    Ok(link(ids, ch, cma, v, qps, p, remote, t0))
}

/// The server: listens on `p.bind` (or every address) at `p.port`, takes one client's
/// connections and returns them with the client's parameters. Requests for another test,
/// or that are not rdma-perf's, are rejected.
pub fn server(
    p: &Params,
    hook: Hook<'_>,
    ready: &mut dyn FnMut(),
) -> Result<(Link, Params), String> {
    match server_any(p, hook, ready, false)? {
        Served::Native(l, cp) => Ok((*l, cp)),
        Served::Perftest(_) => Err("a perftest client".into()),
    }
}

/// What a server got: one of our clients, or perftest's `-R` communication request (a
/// request without our private data, before any of ours).
pub enum Served {
    /// Our client's connections and parameters.
    Native(Box<Link>, Params),
    /// A perftest `-R` client, for [`super::rcm::serve`].
    Perftest(super::rcm::Request),
}

/// [`server`], handing a request that is not ours to perftest's `-R` flow when `perftest`
/// (it is rejected otherwise).
pub fn server_any(
    p: &Params,
    hook: Hook<'_>,
    ready: &mut dyn FnMut(),
    perftest: bool,
) -> Result<Served, String> {
    let cma = Cma::new().map_err(|e| format!("rdma_cm context: {e}"))?;
    let ch = EventChannel::with_cma(&cma).map_err(|e| format!("event channel: {e}"))?;
    let addr = p
        .bind
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], p.port)));
    let listen = CmId::new(&ch, PortSpace::Tcp).map_err(|e| format!("create id: {e}"))?;
    listen
        .bind_addr(addr)
        .map_err(|e| format!("bind {addr}: {e}"))?;
    listen.listen(16).map_err(|e| format!("listen: {e}"))?;
    ready();
    let mut t0 = None;
    let mut cp: Option<Params> = None;
    let mut v: Option<Verbs> = None;
    let mut slots: Vec<Option<(CmId, Arc<QueuePair>)>> = Vec::new();
    let mut established = 0;
    let mut remote = None;
    while cp.as_ref().is_none_or(|c| established < c.qps) {
        let mut ev = ch.get_event().map_err(|e| format!("get_event: {e}"))?;
        hook(&ev);
        match ev.kind() {
            EventType::ConnectRequest => {
                t0.get_or_insert_with(Instant::now);
                let hello = Hello::decode(ev.private_data());
                let Some(id) = ev.take_id() else { continue };
                drop(ev);
                let Some(h) = hello else {
                    if perftest && cp.is_none() {
                        return Ok(Served::Perftest(super::rcm::Request {
                            cma,
                            ch,
                            listen,
                            id,
                        }));
                    }
                    let _ = id.reject(b"not an rdma-perf request");
                    continue;
                };
                let hp = match h.params(p) {
                    Some(hp) if hp.test == p.test => hp,
                    Some(hp) => {
                        eprintln!(
                            "rdma-perf: rejected a {} client (this server runs {})",
                            hp.test.name(),
                            p.test.name()
                        );
                        let _ = id.reject(b"another test");
                        continue;
                    }
                    None => {
                        let _ = id.reject(b"bad parameters");
                        continue;
                    }
                };
                let idx = usize::from(h.qp_index);
                let fits = match &cp {
                    None => true,
                    Some(c) => c.qps == hp.qps && slots.get(idx).is_some_and(|s| s.is_none()),
                };
                if !fits || (h.region.len as usize) < hp.region_len() {
                    let _ = id.reject(b"busy");
                    continue;
                }
                if cp.is_none() {
                    slots = (0..hp.qps).map(|_| None).collect();
                    v = Some(verbs(&id, &hp)?);
                    cp = Some(hp.clone());
                }
                let vb = v.as_ref().ok_or("no verbs")?;
                let qp = create_qp(&id, vb, &hp)?;
                let mine = Remote {
                    addr: vb.mr.addr(),
                    rkey: vb.mr.rkey(),
                    len: hp.region_len() as u32,
                };
                id.accept(&param(encode_remote(&mine)))
                    .map_err(|e| format!("accept: {e}"))?;
                remote = Some(h.region);
                if let Some(s) = slots.get_mut(idx) {
                    *s = Some((id, qp));
                }
            }
            EventType::Established => established += 1,
            EventType::Disconnected | EventType::ConnectError | EventType::Unreachable => {
                return Err(format!("while connecting: {}", describe(&ev)));
            }
            _ => {}
        }
    }
    let cp = cp.ok_or("no client")?;
    let (mut ids, mut qps) = (Vec::new(), Vec::new());
    for s in slots {
        let (id, qp) = s.ok_or("a connection is missing")?;
        ids.push(id);
        qps.push(qp);
    }
    drop(listen);
    let v = v.ok_or("no verbs")?;
    let remote = remote.ok_or("no client")?;
    let l = link(
        ids,
        ch,
        cma,
        v,
        qps,
        &cp,
        remote,
        t0.unwrap_or_else(Instant::now),
    );
    Ok(Served::Native(Box::new(l), cp))
}
