//! The test loops of both sides, one phase per message size.

use std::time::{Duration, Instant};

use rdma_soft::verbs::{Completion, SendOp, SendWr, WcFlags, WcOpcode};

use super::conn::{self, Hook, Link};
use super::idle::{IdleCheck, IDLE};
use super::proto::{IMM_END, IMM_READY};
use super::report::{self, BwStats, LatRecorder, LatStats, Outcome};
use super::{Kind, Params, Verb};
use crate::progress::{Line, Progress};

/// wr_id of control SENDs.
const CTL: u64 = u64::MAX;
/// Polls the CQ of a link: checks statuses, reposts receives, detects a dead peer.
struct Poller<'a> {
    link: &'a Link,
    idle: IdleCheck,
}

impl<'a> Poller<'a> {
    fn new(link: &'a Link) -> Poller<'a> {
        Poller {
            link,
            idle: IdleCheck::new(),
        }
    }

    /// Checks a completion's status and reposts the receive it used.
    fn take(link: &Link, c: &Completion) -> Result<(), String> {
        if !c.status.is_success() {
            return Err(format!(
                "completion with error: {:?} ({:?})",
                c.status, c.opcode
            ));
        }
        if matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            let i = link.qp_index(c.qp_num).unwrap_or(0);
            link.post_recv(i)?;
        }
        Ok(())
    }

    fn poll(&mut self) -> Result<Option<Completion>, String> {
        match self.link.cq.poll_one() {
            Some(c) => {
                Self::take(self.link, &c)?;
                self.idle.progressed();
                Ok(Some(c))
            }
            None => self.idle.empty_poll().map(|()| None),
        }
    }

    /// Polls until the receive carrying immediate `imm`.
    fn wait_imm(&mut self, imm: u32) -> Result<(), String> {
        loop {
            if let Some(c) = self.poll()? {
                if is_ctl(&c) && c.imm_data == imm {
                    return Ok(());
                }
            }
        }
    }

    /// Polls until the completion of the control SEND.
    fn wait_ctl_sent(&mut self) -> Result<(), String> {
        loop {
            if let Some(c) = self.poll()? {
                if c.wr_id == CTL && c.opcode == WcOpcode::Send {
                    return Ok(());
                }
            }
        }
    }
}

fn is_ctl(c: &Completion) -> bool {
    c.opcode == WcOpcode::Recv && c.wc_flags.contains(WcFlags::WITH_IMM)
}

fn send_ctl(link: &Link, imm: u32) -> Result<(), String> {
    let qp = link.qps.first().ok_or("no QP")?;
    qp.post_send(&SendWr::new(CTL, SendOp::SendWithImm { imm }).signaled())
        .map_err(|e| format!("post_send: {e}"))
}

/// Progress of a long phase: `rdma-perf: TEST SIZE B: N iterations` on stderr about every
/// second (a bar on a terminal).
fn progress(p: &Params, size: usize) -> Progress {
    Progress::new(
        format!("rdma-perf: {} {size} B", p.test.name()),
        p.duration.is_none().then_some(p.iters),
        Line::Iterations,
    )
}

/// Whether a phase that started at `t0` and did `done` iterations is over.
fn over(p: &Params, t0: Instant, now: Instant, done: u64) -> bool {
    match p.duration {
        Some(d) => now.duration_since(t0) >= d,
        None => done >= p.iters,
    }
}

fn marker(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

fn post(link: &Link, qp: usize, wr: &SendWr) -> Result<(), String> {
    link.qps
        .get(qp)
        .ok_or("no QP")?
        .post_send(wr)
        .map_err(|e| format!("post_send: {e}"))
}

fn data_wr(
    link: &Link,
    p: &Params,
    size: usize,
    slot: usize,
    wr_id: u64,
) -> Result<SendWr, String> {
    let off = slot * size;
    let remote = link.remote.addr + (off % link.remote.len.max(1) as usize) as u64;
    let rkey = link.remote.rkey;
    let (op, local) = match p.test.verb {
        Verb::Send => (SendOp::Send, link.region + off),
        Verb::Write => (
            SendOp::RdmaWrite {
                remote_addr: remote,
                rkey,
            },
            link.region + off,
        ),
        Verb::Read => (
            SendOp::RdmaRead {
                remote_addr: remote,
                rkey,
            },
            off,
        ),
    };
    let sge = link
        .mr
        .sge(local, size as u32)
        .map_err(|e| format!("buffer: {e}"))?;
    Ok(SendWr::new(wr_id, op).with_sge(sge).signaled())
}

/// The client's latency loop: samples in µs (half the round trip for SEND and WRITE, the
/// round trip for READ, as perftest reports them).
fn lat_client(
    link: &Link,
    p: &Params,
    size: usize,
    pl: &mut Poller<'_>,
) -> Result<LatStats, String> {
    let mut samples = LatRecorder::new();
    let mut prog = progress(p, size);
    let wr = data_wr(link, p, size, 0, 1)?;
    let t_phase = Instant::now();
    let mut i = 0u64;
    loop {
        i += 1;
        let m = marker(i);
        if p.test.verb == Verb::Write {
            link.mr
                .write(link.region + size - 1, &[m])
                .map_err(|e| e.to_string())?;
        }
        let t0 = super::rcm::stamp();
        match p.test.verb {
            Verb::Read => post(link, 0, &wr)?,
            _ => post(link, 0, &super::signal_some(p, wr, i))?,
        }
        match p.test.verb {
            Verb::Send => loop {
                if let Some(c) = pl.poll()? {
                    if c.opcode == WcOpcode::Recv && !is_ctl(&c) {
                        break;
                    }
                }
            },
            Verb::Read => loop {
                if let Some(c) = pl.poll()? {
                    if c.opcode == WcOpcode::RdmaRead {
                        break;
                    }
                }
            },
            Verb::Write => {
                let mut b = [0u8];
                loop {
                    pl.poll()?;
                    link.mr.read(size - 1, &mut b).map_err(|e| e.to_string())?;
                    if b[0] == m {
                        break;
                    }
                }
            }
        }
        let us = super::rcm::us_since(t0);
        let t1 = Instant::now();
        samples.record(if p.test.verb == Verb::Read {
            us
        } else {
            us / 2.0
        });
        prog.tick(t1, i);
        if over(p, t_phase, t1, i) {
            return samples.stats(size).ok_or_else(|| "no samples".to_string());
        }
    }
}

/// The server's side of a latency phase: answers until the client's END.
fn lat_server(
    link: &Link,
    p: &Params,
    size: usize,
    end: u32,
    pl: &mut Poller<'_>,
) -> Result<(), String> {
    let wr = data_wr(link, p, size, 0, 1)?;
    let mut i = 1u64;
    let mut sent = 0u64;
    let mut b = [0u8];
    loop {
        let c = pl.poll()?;
        if let Some(c) = &c {
            if is_ctl(c) && c.imm_data == end {
                return Ok(());
            }
            if p.test.verb == Verb::Send && c.opcode == WcOpcode::Recv && !is_ctl(c) {
                sent += 1;
                post(link, 0, &super::signal_some(p, wr, sent))?;
            }
        }
        if p.test.verb == Verb::Write {
            link.mr.read(size - 1, &mut b).map_err(|e| e.to_string())?;
            if b[0] == marker(i) {
                link.mr
                    .write(link.region + size - 1, &[marker(i)])
                    .map_err(|e| e.to_string())?;
                post(link, 0, &super::signal_some(p, wr, i))?;
                i += 1;
            }
        }
    }
}

/// The client's bandwidth loop.
fn bw_client(link: &Link, p: &Params, size: usize, pl: &mut Poller<'_>) -> Result<BwStats, String> {
    let slots = (link.region / size).max(1);
    // At most about 1 MiB in flight (at least 4 messages): deeper queues only overflow
    // the loopback socket buffers and stall on retransmission timeouts.
    let depth = u64::from(p.tx_depth).min(((1usize << 20) / size).max(4) as u64);
    let q = link.qps.len().max(1);
    let window: u64 = if p.duration.is_some() {
        4096
    } else {
        (p.iters / 16).clamp(16, 4096)
    };
    let mut prog = progress(p, size);
    let (mut posted, mut done) = (0u64, 0u64);
    let mut stop = false;
    let t0 = Instant::now();
    let (mut win_t, mut win_n, mut peak) = (t0, 0u64, 0f64);
    while !stop || done < posted {
        while !stop && posted - done < depth {
            let wr = data_wr(link, p, size, (posted % slots as u64) as usize, posted)?;
            post(link, (posted % q as u64) as usize, &wr)?;
            posted += 1;
            if p.duration.is_none() && posted >= p.iters {
                stop = true;
            }
        }
        if let Some(c) = pl.poll()? {
            if c.wr_id == CTL || matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                continue;
            }
            done += 1;
            win_n += 1;
            let now = Instant::now();
            if win_n == window {
                let dt = now.duration_since(win_t).as_secs_f64();
                if dt > 0.0 {
                    peak = peak.max((window as usize * size) as f64 / dt);
                }
                win_t = now;
                win_n = 0;
            }
            prog.tick(now, done);
            if !stop && p.duration.is_some() && over(p, t0, now, done) {
                stop = true;
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    let mb = (1u64 << 20) as f64;
    let avg = (done as usize * size) as f64 / secs;
    Ok(BwStats {
        bytes: size,
        iters: done,
        peak: peak.max(avg) / mb,
        avg: avg / mb,
        mpps: done as f64 / secs / 1e6,
    })
}

/// The server's side of a bandwidth phase: keeps the device running (and receives
/// reposted) until the client's END.
fn bw_server(end: u32, pl: &mut Poller<'_>) -> Result<(), String> {
    let link = pl.link;
    // The passive side of WRITE/READ gets no completion until END: it neither spins nor
    // drives the device (the progress engine serves the peer); it sleeps in 1 ms slices,
    // looks at what is queued, and takes the peer for gone only when
    // nothing at all arrives for IDLE (no completion and no datagram), not merely no
    // completion (under loss a one-sided transfer can take longer than IDLE).
    let dev = link.ids.first().and_then(|id| id.device());
    let heard = || dev.as_ref().map_or(0, |d| d.wire_stats().received);
    let (mut seen, mut last) = (heard(), Instant::now());
    let mut wc = Vec::with_capacity(16);
    loop {
        wc.clear();
        link.cq.poll_queued(&mut wc, 16);
        for c in wc.drain(..) {
            Poller::take(link, &c)?;
            if is_ctl(&c) && c.imm_data == end {
                return Ok(());
            }
        }
        // a plain sleep: the CM's events stay for the teardown that reads them
        std::thread::sleep(Duration::from_millis(1));
        let now = heard();
        if now != seen {
            (seen, last) = (now, Instant::now());
        } else if last.elapsed() > IDLE {
            return Err(format!(
                "the peer stopped answering (nothing for {} s)",
                IDLE.as_secs()
            ));
        }
    }
}

/// Runs the client: connects, runs every size, prints perftest's output when `print`, and
/// returns the results and the connection setup time.
pub fn client_with(
    p: &Params,
    hook: Hook<'_>,
    print: bool,
) -> Result<(Vec<Outcome>, Duration), String> {
    let link = conn::client(p, &mut *hook)?;
    if print {
        println!("{}", report::banner(p, &device_name(&link), "4096[B]"));
        print_addresses(&link);
        println!("{}", report::header(p.test.kind));
    }
    let mut pl = Poller::new(&link);
    let mut out = Vec::new();
    for (phase, size) in p.sizes().into_iter().enumerate() {
        pl.wait_imm(IMM_READY | phase as u32)?;
        let o = match p.test.kind {
            Kind::Lat => {
                if p.test.verb == Verb::Write {
                    link.mr.fill(0, size, 0).map_err(|e| e.to_string())?;
                }
                Outcome::Lat(lat_client(&link, p, size, &mut pl)?)
            }
            Kind::Bw => Outcome::Bw(bw_client(&link, p, size, &mut pl)?),
        };
        send_ctl(&link, IMM_END | phase as u32)?;
        pl.wait_ctl_sent()?;
        if print {
            println!("{}", o.row());
        }
        out.push(o);
    }
    if print {
        println!("{}", report::DASHES);
    }
    link.disconnect(hook);
    Ok((out, link.setup))
}

/// `rdma-perf TEST ... server`: the client, printing perftest's output.
pub fn client(p: &Params, hook: Hook<'_>) -> Result<(), String> {
    client_with(p, hook, true).map(|_| ())
}

/// `rdma-perf TEST`: the server, for one client; prints the banner and the table frame.
pub fn server(p: &Params, hook: Hook<'_>) -> Result<(), String> {
    server_with(p, hook, true, &mut || {})
}

/// The server; prints perftest's frame when `print`; `ready` is called once it listens.
pub fn server_with(
    p: &Params,
    hook: Hook<'_>,
    print: bool,
    ready: &mut dyn FnMut(),
) -> Result<(), String> {
    if print {
        println!("\n************************************\n* Waiting for client to connect... *\n************************************");
    }
    let (link, cp) = conn::server(p, &mut *hook, ready)?;
    serve_link(link, cp, hook, print)
}

/// `rdma-perf TEST` as a server: our client's protocol, or perftest's `-R` when the first
/// request carries no rdma-perf private data (`ib_send_lat -R ...` against us).
pub fn server_auto(p: &Params, hook: Hook<'_>, print: bool) -> Result<(), String> {
    if print {
        println!("\n************************************\n* Waiting for client to connect... *\n************************************");
    }
    match conn::server_any(p, &mut *hook, &mut || {}, true)? {
        conn::Served::Native(link, cp) => serve_link(*link, cp, hook, print),
        conn::Served::Perftest(req) => super::rcm::serve(p, req, hook, print).map(|_| ()),
    }
}

fn serve_link(link: Link, cp: Params, hook: Hook<'_>, print: bool) -> Result<(), String> {
    if print {
        println!("{}", report::banner(&cp, &device_name(&link), "4096[B]"));
        print_addresses(&link);
    }
    let mut pl = Poller::new(&link);
    for (phase, size) in cp.sizes().into_iter().enumerate() {
        let end = IMM_END | phase as u32;
        if cp.test.verb == Verb::Write && cp.test.kind == Kind::Lat {
            link.mr.fill(0, size, 0).map_err(|e| e.to_string())?;
        }
        send_ctl(&link, IMM_READY | phase as u32)?;
        match cp.test.kind {
            Kind::Lat => lat_server(&link, &cp, size, end, &mut pl)?,
            Kind::Bw => bw_server(end, &mut pl)?,
        }
    }
    if print {
        println!("{}", report::DASHES);
    }
    link.wait_disconnect(Duration::from_secs(5), hook);
    Ok(())
}

fn device_name(link: &Link) -> String {
    link.ids
        .first()
        .and_then(|id| id.netdev())
        .map_or_else(|| "?".into(), |(n, _)| n)
}

fn print_addresses(link: &Link) {
    for (id, qp) in link.ids.iter().zip(&link.qps) {
        let a =
            |x: Option<std::net::SocketAddr>| x.map_or_else(|| "?".into(), |a| a.ip().to_string());
        println!(
            " local address: {} QPN {:#08x} RKey {:#08x} VAddr {:#018x}",
            a(id.local_addr()),
            qp.qpn(),
            link.mr.rkey(),
            link.mr.addr()
        );
        println!(
            " remote address: {} RKey {:#08x} VAddr {:#018x}",
            a(id.peer_addr()),
            link.remote.rkey,
            link.remote.addr
        );
    }
}
