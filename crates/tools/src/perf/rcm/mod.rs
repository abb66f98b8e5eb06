//! perftest's `-R` mode on the wire (`docs/PERFTEST.md`): a communication connection (RC,
//! no private data) to the port, the in-band exchange of versions, sizes, MTU, parameters
//! and `pingpong_dest`s over SENDs on it, one CM connection per test QP to the same port, the
//! handshakes of each test and its data phase as perftest runs it.
//!
//! `comm`: the communication connection and the exchange of parameters; `setup`: the test
//! connections, their memory and `pingpong_dest`s; `data`: the latency and bandwidth loops;
//! here: a run's flow on each side (client, listen / serve / server) and its teardown.

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

mod comm;
mod data;
mod setup;

pub use comm::Comm;
use comm::*;
use data::*;
pub(super) use data::{calibrate, stamp, us_since};
use setup::*;

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
use super::idle::IDLE;

fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
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
