//! `cmtime`: times each step of connection setup and teardown across many connections, as
//! rdma-core's `cmtime` does. Every step runs for all connections at once (all
//! `resolve_addr` calls are issued, then all their events awaited, and so on), and the
//! table reports per step: the total time, the slowest and the fastest connection, and
//! the total divided by the number of connections.
//!
//! Two generations of rdma-core's cmtime are in use, and both are spoken:
//! - rdma-core 52 and later: the client and the server keep in step over an out-of-band
//!   TCP connection to the server's address and CM port (one byte per sync point: before
//!   the first step, after connect, after disconnect), and the server serves one client's
//!   run: it exits when that run is over, so the address and port are free for the next.
//! - rdma-core 51 and earlier (Debian 12 ships 44): no out-of-band connection; the server
//!   accepts every request and disconnects when its client does, until it is killed.
//!
//! Our server accepts requests from the start and takes an out-of-band connection when one
//! comes (then it serves that run and exits), so it serves both. Our client falls back to a
//! run without sync when the server refuses the out-of-band connection (an older server),
//! or skips it with [`SyncMode::Off`].
//!
//! ```text
//! step              total ms     max ms     min us  us / conn
//! create id    :        0.52       0.00       0.25       0.52
//! ...
//! ```

use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rdma_soft::verbs::{CompletionQueue, ProtectionDomain, QpCap, QpInitAttr};
use rdmacm::cm::{CmId, Cma, ConnParam, EventChannel, EventType, PortSpace};

use crate::events::describe;
use crate::progress::{Line, Progress};

/// The steps, in order, with the names cmtime prints.
pub const STEPS: [&str; 8] = [
    "create id",
    "bind addr",
    "resolve addr",
    "resolve route",
    "create qp",
    "connect",
    "disconnect",
    "destroy",
];

const CREATE_ID: usize = 0;
const BIND: usize = 1;
const RESOLVE_ADDR: usize = 2;
const RESOLVE_ROUTE: usize = 3;
const CREATE_QP: usize = 4;
const CONNECT: usize = 5;
const DISCONNECT: usize = 6;
const DESTROY: usize = 7;

/// Client settings (`-s`, `-b`, `-c`, `-p`, `-r`, `-t`).
#[derive(Debug, Clone)]
pub struct ClientOpts {
    /// The server's address and port.
    pub dst: SocketAddr,
    /// Local address to bind (`-b`); the port is ephemeral.
    pub src: Option<SocketAddr>,
    /// Connections (`-c`).
    pub connections: usize,
    /// Retries of a failing resolution and of unanswered CM messages (`-r`).
    pub retries: u8,
    /// Resolution timeout, also the basis of the CM response timeout (`-t`).
    pub timeout: Duration,
    /// Whether to keep in step with the server over an out-of-band connection.
    pub sync: SyncMode,
}

/// The client's out-of-band sync with the server (rdma-core 52's cmtime has it, older ones
/// do not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// Sync when the server takes the out-of-band connection; run without when it refuses
    /// it (an rdma-core 51 or older server, which has no such socket).
    #[default]
    Auto,
    /// Never open the out-of-band connection (as rdma-core 51 and older's client).
    Off,
}

/// Per-connection start and end times of one step.
#[derive(Debug, Clone, Default)]
struct Step {
    begin: Option<Instant>,
    end: Option<Instant>,
    conn: Vec<(Option<Instant>, Option<Instant>)>,
}

/// The measured times of every step.
#[derive(Debug, Clone)]
pub struct Timings {
    steps: Vec<Step>,
    connections: usize,
    bound: bool,
}

/// One row of the table: step name, total ms, max ms, min µs, µs per connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Step name.
    pub step: &'static str,
    /// Time from the step's start to its last completion, ms.
    pub total_ms: f64,
    /// Slowest single connection, ms.
    pub max_ms: f64,
    /// Fastest single connection, µs.
    pub min_us: f64,
    /// Total divided by the connections, µs.
    pub us_per_conn: f64,
}

impl Timings {
    fn new(connections: usize, bound: bool) -> Timings {
        let step = Step {
            conn: vec![(None, None); connections],
            ..Default::default()
        };
        Timings {
            steps: vec![step; STEPS.len()],
            connections,
            bound,
        }
    }

    fn begin(&mut self, s: usize) {
        self.steps[s].begin = Some(Instant::now());
    }

    fn finish(&mut self, s: usize) {
        self.steps[s].end = Some(Instant::now());
    }

    fn start(&mut self, s: usize, c: usize) {
        if let Some(x) = self.steps[s].conn.get_mut(c) {
            x.0 = Some(Instant::now());
        }
    }

    fn done(&mut self, s: usize, c: usize) {
        if let Some(x) = self.steps[s].conn.get_mut(c) {
            x.1 = Some(Instant::now());
        }
    }

    /// The rows cmtime prints (no `bind addr` row unless bound).
    pub fn rows(&self) -> Vec<Row> {
        let mut out = Vec::new();
        for (i, s) in self.steps.iter().enumerate() {
            if i == BIND && !self.bound {
                continue;
            }
            let us = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e6;
            let (mut max, mut min) = (0f64, f64::MAX);
            for (a, b) in &s.conn {
                if let (Some(a), Some(b)) = (a, b) {
                    let d = us(*a, *b);
                    max = max.max(d);
                    min = min.min(d);
                }
            }
            if min == f64::MAX {
                min = 0.0;
            }
            let total = match (s.begin, s.end) {
                (Some(a), Some(b)) => us(a, b),
                _ => 0.0,
            };
            out.push(Row {
                step: STEPS[i],
                total_ms: total / 1000.0,
                max_ms: max / 1000.0,
                min_us: min,
                us_per_conn: total / self.connections.max(1) as f64,
            });
        }
        out
    }

    /// The table as cmtime prints it.
    pub fn table(&self) -> String {
        let mut s = String::from("step              total ms     max ms     min us  us / conn\n");
        for r in self.rows() {
            s.push_str(&format!(
                "{:<13}: {:>11.2}{:>11.2}{:>11.2}{:>11.2}\n",
                r.step, r.total_ms, r.max_ms, r.min_us, r.us_per_conn
            ));
        }
        s
    }
}

/// Progress of a slow step: `cmtime: STEP: done/total` on stderr about every second (a
/// bar on a terminal).
fn progress(step: usize, total: usize) -> Progress {
    Progress::new(
        format!("cmtime: {}", STEPS[step]),
        Some(total as u64),
        Line::OfTotal,
    )
}

/// The CM response timeout code (4.096 µs · 2^t) closest below `timeout`.
pub fn timeout_code(timeout: Duration) -> u8 {
    let units = (timeout.as_secs_f64() * 1e6 / 4.096).max(1.0);
    (units.log2().floor() as u8).clamp(8, 31)
}

/// Waits until every connection in `pending` got `want` on `ch`; other events fail the
/// step (`TIMEWAIT_EXIT` and `ADDR_CHANGE` are ignored). `limit` bounds the whole wait.
fn wait_all(
    ch: &EventChannel,
    t: &mut Timings,
    step: usize,
    want: EventType,
    mut pending: usize,
    limit: Duration,
) -> Result<(), String> {
    let total = pending;
    let deadline = Instant::now() + limit;
    let mut prog = progress(step, total);
    while pending > 0 {
        let now = Instant::now();
        if now >= deadline {
            return Err(format!(
                "{}: timed out waiting for {} ({} of {total} outstanding)",
                STEPS[step],
                want.name(),
                pending
            ));
        }
        let wait = (deadline - now).min(Duration::from_millis(200));
        let ev = ch
            .get_event_timeout(wait)
            .map_err(|e| format!("{}: get_event: {e}", STEPS[step]))?;
        prog.tick(Instant::now(), (total - pending) as u64);
        let Some(ev) = ev else { continue };
        let c = ev.context() as usize;
        match ev.kind() {
            k if k == want => {
                t.done(step, c);
                pending -= 1;
            }
            EventType::TimewaitExit | EventType::AddrChange => {}
            EventType::Disconnected if step == CONNECT => {}
            _ => return Err(format!("{}: {}", STEPS[step], describe(&ev))),
        }
    }
    t.finish(step);
    Ok(())
}

/// Runs the client: sets up and tears down `opts.connections` connections step by step.
pub fn run_client(opts: &ClientOpts) -> Result<Timings, String> {
    let n = opts.connections;
    let cma = Cma::new().map_err(|e| format!("rdma_cm context: {e}"))?;
    cma.set_cm_timeouts(timeout_code(opts.timeout), opts.retries.min(15))
        .map_err(|e| format!("CM timeouts: {e}"))?;
    let ch = EventChannel::with_cma(&cma).map_err(|e| format!("event channel: {e}"))?;
    let mut t = Timings::new(n, opts.src.is_some());
    // Upper bound for steps driven by the peer: every try of every message.
    let cm_limit = Duration::from_secs(30) + opts.timeout * (u32::from(opts.retries) + 2) * 2;
    // rdma-core's cmtime: an out-of-band TCP connection to the server's address and CM port
    // keeps the two in step, and tells the server when the run is over.
    let mut oob = match opts.sync {
        SyncMode::Auto => Oob::connect(opts.dst, cm_limit + SERVER_SYNC_LIMIT)?,
        SyncMode::Off => None,
    };
    if let Some(o) = oob.as_mut() {
        o.sync(SYNC_START)?;
    }

    t.begin(CREATE_ID);
    let mut ids = Vec::with_capacity(n);
    for c in 0..n {
        t.start(CREATE_ID, c);
        let id = CmId::new(&ch, PortSpace::Tcp).map_err(|e| format!("create id: {e}"))?;
        id.set_context(c as u64);
        t.done(CREATE_ID, c);
        ids.push(id);
    }
    t.finish(CREATE_ID);

    if let Some(src) = opts.src {
        t.begin(BIND);
        for (c, id) in ids.iter().enumerate() {
            t.start(BIND, c);
            id.bind_addr(src)
                .map_err(|e| format!("bind addr {src}: {e}"))?;
            t.done(BIND, c);
        }
        t.finish(BIND);
    }

    t.begin(RESOLVE_ADDR);
    resolve_addrs(&ch, &ids, opts, &mut t)?;

    t.begin(RESOLVE_ROUTE);
    for (c, id) in ids.iter().enumerate() {
        t.start(RESOLVE_ROUTE, c);
        id.resolve_route(opts.timeout)
            .map_err(|e| format!("resolve route: {e}"))?;
    }
    wait_all(
        &ch,
        &mut t,
        RESOLVE_ROUTE,
        EventType::RouteResolved,
        n,
        opts.timeout + Duration::from_secs(10),
    )?;

    t.begin(CREATE_QP);
    let mut verbs = Verbs::default();
    for (c, id) in ids.iter().enumerate() {
        t.start(CREATE_QP, c);
        verbs.create_qp(id).map_err(|e| format!("create qp: {e}"))?;
        t.done(CREATE_QP, c);
    }
    t.finish(CREATE_QP);

    t.begin(CONNECT);
    for (c, id) in ids.iter().enumerate() {
        t.start(CONNECT, c);
        id.connect(&ConnParam::default())
            .map_err(|e| format!("connect: {e}"))?;
    }
    wait_all(&ch, &mut t, CONNECT, EventType::Established, n, cm_limit)?;
    if let Some(o) = oob.as_mut() {
        o.sync(SYNC_CONNECT)?;
    }

    t.begin(DISCONNECT);
    for (c, id) in ids.iter().enumerate() {
        t.start(DISCONNECT, c);
        id.disconnect().map_err(|e| format!("disconnect: {e}"))?;
    }
    wait_all(
        &ch,
        &mut t,
        DISCONNECT,
        EventType::Disconnected,
        n,
        cm_limit,
    )?;
    if let Some(o) = oob.as_mut() {
        o.sync(SYNC_DISCONNECT)?;
    }

    t.begin(DESTROY);
    for (c, id) in ids.into_iter().enumerate() {
        t.start(DESTROY, c);
        drop(id);
        t.done(DESTROY, c);
    }
    t.finish(DESTROY);
    Ok(t)
}

/// Issues every `resolve_addr`, then waits for their events, retrying ADDR_ERRORs up to
/// `opts.retries` times.
fn resolve_addrs(
    ch: &EventChannel,
    ids: &[CmId],
    opts: &ClientOpts,
    t: &mut Timings,
) -> Result<(), String> {
    let n = ids.len();
    let mut tries = vec![0u8; n];
    for (c, id) in ids.iter().enumerate() {
        t.start(RESOLVE_ADDR, c);
        id.resolve_addr(opts.src, opts.dst, opts.timeout)
            .map_err(|e| format!("resolve addr {}: {e}", opts.dst.ip()))?;
    }
    let mut pending = n;
    let mut prog = progress(RESOLVE_ADDR, n);
    let deadline =
        Instant::now() + opts.timeout * (u32::from(opts.retries) + 1) + Duration::from_secs(10);
    while pending > 0 {
        if Instant::now() >= deadline {
            return Err(format!(
                "resolve addr: timed out ({pending} of {n} outstanding)"
            ));
        }
        let ev = ch
            .get_event_timeout(Duration::from_millis(200))
            .map_err(|e| format!("resolve addr: get_event: {e}"))?;
        prog.tick(Instant::now(), (n - pending) as u64);
        let Some(ev) = ev else { continue };
        let c = ev.context() as usize;
        match ev.kind() {
            EventType::AddrResolved => {
                t.done(RESOLVE_ADDR, c);
                pending -= 1;
            }
            EventType::AddrError if tries.get(c).is_some_and(|&r| r < opts.retries) => {
                tries[c] += 1;
                tracing::debug!(
                    connection = c,
                    attempt = tries[c],
                    "address error: resolving again"
                );
                let id = &ids[c];
                drop(ev);
                id.resolve_addr(opts.src, opts.dst, opts.timeout)
                    .map_err(|e| format!("resolve addr {}: {e}", opts.dst.ip()))?;
            }
            EventType::AddrChange => {}
            _ => return Err(format!("resolve addr: {}", describe(&ev))),
        }
    }
    t.finish(RESOLVE_ADDR);
    Ok(())
}

/// A PD and a CQ per device, shared by the QPs made on it (as cmtime shares them).
#[derive(Default)]
struct Verbs {
    per_dev: HashMap<u32, (ProtectionDomain, CompletionQueue)>,
}

impl Verbs {
    fn create_qp(&mut self, id: &CmId) -> Result<(), String> {
        let (_, idx) = id.netdev().ok_or("id has no device")?;
        if let std::collections::hash_map::Entry::Vacant(e) = self.per_dev.entry(idx) {
            let dev = id.device().ok_or("id has no device")?;
            let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
            let cq = dev.create_cq(64, None).map_err(|e| e.to_string())?;
            e.insert((pd, cq));
        }
        let (pd, cq) = self.per_dev.get(&idx).ok_or("no PD")?;
        let mut init = QpInitAttr::rc(cq, cq);
        init.cap = QpCap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        id.create_qp(pd, &init).map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// The out-of-band sync points, as rdma-core's cmtime has them: the byte one side sends and
/// the other echoes once it is there too. `SYNC_START` before the first step, `SYNC_CONNECT`
/// when the client has every connection established, `SYNC_DISCONNECT` when it has every
/// connection disconnected (the last one: the server's run ends with it).
const SYNC_START: u8 = 0;
const SYNC_CONNECT: u8 = CONNECT as u8;
const SYNC_DISCONNECT: u8 = DISCONNECT as u8;

/// How long the server waits at a sync point for its side of the step (its connections
/// established, or disconnected) before it answers anyway; at the disconnect point it then
/// disconnects what is left itself (rdma-core's cmtime does the same, for a lost DREQ).
const SERVER_SYNC_LIMIT: Duration = Duration::from_secs(10);

/// The client's end of the out-of-band connection: one TCP connection to the server's
/// address and CM port, made before the first step.
struct Oob(TcpStream);

impl Oob {
    /// `None` when the server refuses the connection: a server without the out-of-band
    /// socket (rdma-core 51 or older), which needs no sync.
    fn connect(dst: SocketAddr, limit: Duration) -> Result<Option<Oob>, String> {
        let s = match TcpStream::connect_timeout(&dst, limit) {
            Ok(s) => s,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                tracing::info!(%dst, "no out-of-band socket at the server: running without sync");
                return Ok(None);
            }
            Err(e) => return Err(format!("connect to {dst} (out-of-band socket): {e}")),
        };
        let _ = s.set_nodelay(true);
        s.set_read_timeout(Some(limit))
            .map_err(|e| format!("out-of-band socket: {e}"))?;
        Ok(Some(Oob(s)))
    }

    /// Sends `step` and waits for the server to echo it.
    fn sync(&mut self, step: u8) -> Result<(), String> {
        let what = match step {
            SYNC_START => "start",
            s => STEPS[usize::from(s)],
        };
        let err = |e: std::io::Error| format!("{what}: out-of-band sync with the server: {e}");
        self.0.write_all(&[step]).map_err(err)?;
        let mut b = [0u8];
        self.0.read_exact(&mut b).map_err(err)?;
        if b[0] != step {
            return Err(format!(
                "{what}: out-of-band sync: the server answered {} for {step}",
                b[0]
            ));
        }
        Ok(())
    }
}

/// Runs the server: listens on `addr` and accepts every connection request from the start,
/// disconnects and destroys each connection when its client disconnects, and takes an
/// out-of-band TCP connection on the same address and port when one comes. With one
/// (rdma-core 52's client) it answers the client's sync points and returns when that run is
/// over (its last sync point), so the address and port are free again; it fails when the
/// client closes the out-of-band connection before that (its run failed). Without one
/// (rdma-core 51's client, which never opens it) it serves until killed, as that
/// generation's server does.
pub fn run_server(addr: SocketAddr) -> Result<(), String> {
    let cma = Cma::new().map_err(|e| format!("rdma_cm context: {e}"))?;
    let ch = EventChannel::with_cma(&cma).map_err(|e| format!("event channel: {e}"))?;
    let listen = CmId::new(&ch, PortSpace::Tcp).map_err(|e| format!("create id: {e}"))?;
    listen
        .bind_addr(addr)
        .map_err(|e| format!("bind addr {addr}: {e}"))?;
    listen.listen(0).map_err(|e| format!("listen: {e}"))?;
    // Ready for connection requests before the client can start (as rdma-core: listen first,
    // then the out-of-band socket). Requests are answered while no out-of-band connection is
    // there: an older client never makes one, and a request must never wait on it.
    let oob = TcpListener::bind(addr).map_err(|e| format!("out-of-band socket {addr}: {e}"))?;
    oob.set_nonblocking(true)
        .map_err(|e| format!("out-of-band socket: {e}"))?;
    let mut oob = Some(oob);
    let mut sock: Option<TcpStream> = None;

    let mut verbs = Verbs::default();
    let mut live: HashMap<u64, CmId> = HashMap::new();
    let mut established: HashSet<u64> = HashSet::new();
    // The sync point the client waits at, and since when.
    let mut waiting: Option<(u8, Instant)> = None;
    // The out-of-band sockets are read when no event is queued or every OOB_EVERY: not once
    // per event (a system call each, in a storm of thousands).
    let mut oob_at = Instant::now();
    loop {
        let ev = ch
            .get_event_timeout(Duration::from_millis(10))
            .map_err(|e| format!("get_event: {e}"))?;
        let idle = ev.is_none();
        if let Some(ev) = ev {
            server_event(ev, &mut verbs, &mut live, &mut established);
        }
        let look = idle || oob_at.elapsed() >= OOB_EVERY;
        if look {
            oob_at = Instant::now();
        }
        if let (true, Some(l)) = (look, oob.as_ref()) {
            match l.accept() {
                Ok((s, peer)) => {
                    tracing::debug!(%peer, "out-of-band connection: serving its run");
                    let _ = s.set_nodelay(true);
                    s.set_nonblocking(true)
                        .map_err(|e| format!("out-of-band socket: {e}"))?;
                    sock = Some(s);
                    oob = None;
                }
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(format!("out-of-band socket {addr}: accept: {e}")),
            }
        }
        let Some(sock) = sock.as_mut() else { continue };
        if waiting.is_none() && look {
            let mut b = [0u8];
            match sock.read(&mut b) {
                Ok(0) => {
                    return Err(
                        "the client closed the out-of-band connection before its run ended".into(),
                    )
                }
                Ok(_) => waiting = Some((b[0], Instant::now())),
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(format!("out-of-band socket: {e}")),
            }
        }
        let Some((step, since)) = waiting else {
            continue;
        };
        let late = since.elapsed() >= SERVER_SYNC_LIMIT;
        let ready = match step {
            SYNC_CONNECT => live.keys().all(|n| established.contains(n)),
            SYNC_DISCONNECT => live.is_empty(),
            _ => true,
        };
        if !ready && !late {
            continue;
        }
        if step == SYNC_DISCONNECT && !live.is_empty() {
            eprintln!(
                "cmtime: timed out waiting for the client to disconnect ({} left)",
                live.len()
            );
            for (_, id) in live.drain() {
                let _ = id.disconnect();
            }
        }
        sock.set_nonblocking(false)
            .and_then(|_| sock.write_all(&[step]))
            .and_then(|_| sock.set_nonblocking(true))
            .map_err(|e| format!("out-of-band socket: {e}"))?;
        waiting = None;
        if step == SYNC_DISCONNECT {
            return Ok(());
        }
    }
}

/// A non-blocking socket's "nothing now" (or an interrupted call).
fn would_block(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
}

/// How often a busy server looks at the out-of-band socket.
const OOB_EVERY: Duration = Duration::from_millis(1);

/// The server's answer to one CM event.
fn server_event(
    mut ev: rdmacm::cm::Event,
    verbs: &mut Verbs,
    live: &mut HashMap<u64, CmId>,
    established: &mut HashSet<u64>,
) {
    match ev.kind() {
        EventType::ConnectRequest => {
            let Some(id) = ev.take_id() else { return };
            drop(ev);
            let ok = verbs
                .create_qp(&id)
                .and_then(|_| id.accept(&ConnParam::default()).map_err(|e| e.to_string()));
            match ok {
                Ok(()) => {
                    live.insert(id.num(), id);
                }
                Err(e) => {
                    eprintln!("cmtime: accept: {e}");
                    let _ = id.reject(&[]);
                }
            }
        }
        EventType::Established => {
            established.insert(ev.id_num());
        }
        EventType::Disconnected | EventType::ConnectError | EventType::Unreachable => {
            let num = ev.id_num();
            drop(ev);
            established.remove(&num);
            if let Some(id) = live.remove(&num) {
                let _ = id.disconnect();
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shape() {
        let mut t = Timings::new(2, false);
        for s in 0..STEPS.len() {
            t.begin(s);
            t.start(s, 0);
            t.done(s, 0);
            t.start(s, 1);
            t.done(s, 1);
            t.finish(s);
        }
        let tab = t.table();
        let lines: Vec<&str> = tab.lines().collect();
        assert_eq!(lines.len(), 8);
        assert!(lines[1].starts_with("create id    : "));
        assert!(!tab.contains("bind addr"));
    }

    #[test]
    fn timeout_codes() {
        assert_eq!(timeout_code(Duration::from_millis(2000)), 18);
        assert_eq!(timeout_code(Duration::ZERO), 8);
    }
}
