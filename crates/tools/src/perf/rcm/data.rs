//! The data phase: the test CQ's poller, the latency and bandwidth loops of each verb, and
//! the bandwidth reports the two sides exchange.

use super::*;
use crate::perf::idle::IdleCheck;

/// Polls the test CQ: statuses, receives reposted, a dead peer detected.
pub(super) struct Poller<'a> {
    pub(super) d: &'a Data,
    pub(super) idle: IdleCheck,
}

impl<'a> Poller<'a> {
    pub(super) fn new(d: &'a Data) -> Poller<'a> {
        Poller {
            d,
            idle: IdleCheck::new(),
        }
    }

    pub(super) fn poll(&mut self) -> Result<Option<Completion>, String> {
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
                self.idle.progressed();
                Ok(Some(c))
            }
            None => self.idle.empty_poll().map(|()| None),
        }
    }
}

pub(super) fn post(d: &Data, qp: usize, wr: &SendWr) -> Result<(), String> {
    d.qps
        .get(qp)
        .ok_or("no QP")?
        .post_send(wr)
        .map_err(err("post_send"))
}

pub(super) fn over(p: &Params, t0: Instant, done: u64) -> bool {
    match p.duration {
        Some(d) => t0.elapsed() >= d,
        None => done >= p.iters,
    }
}

/// The clock of the latency tests' time stamps: the CPU's counter where it runs at a
/// constant rate (as perftest's `get_cycles`: a few ns, where a system clock read costs
/// tens of ns inside the measured round trip), else the monotonic clock. Calibrated once,
/// before the first test ([`calibrate`]).
pub(super) fn stamps() -> &'static quanta::Clock {
    static CLOCK: std::sync::OnceLock<quanta::Clock> = std::sync::OnceLock::new();
    CLOCK.get_or_init(quanta::Clock::new)
}

/// Calibrates the time stamps' clock (some ms) outside any measurement.
pub(crate) fn calibrate() {
    stamps();
}

/// A time stamp.
pub(crate) fn stamp() -> u64 {
    stamps().raw()
}

/// µs from time stamp `t` to now.
pub(crate) fn us_since(t: u64) -> f64 {
    stamps().delta_as_nanos(t, stamp()) as f64 / 1e3
}

/// `run_iter_lat_send`: the client sends first; `iters` SENDs of `size` bytes each way.
pub(super) fn send_lat(
    d: &Data,
    s: &Settled,
    size: usize,
    client: bool,
) -> Result<LatRecorder, String> {
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
            post(d, 0, &crate::perf::signal_some(&s.p, wr, scnt))?;
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
pub(super) fn write_lat(
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
                if pl.idle.last.elapsed() > IDLE {
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
            pl.idle.progressed();
            if over(&s.p, t0, scnt) && rcnt >= scnt {
                break;
            }
        }
        scnt += 1;
        d.mr.write(d.region + size - 1, &[scnt as u8])
            .map_err(|e| e.to_string())?;
        sent_at = Some(stamp());
        post(d, 0, &crate::perf::signal_some(&s.p, wr, scnt))?;
    }
    Ok(rec)
}

/// `run_iter_lat` for READ: the client reads `size` bytes from the peer's buffer, one at a
/// time.
pub(super) fn read_lat(
    d: &Data,
    s: &Settled,
    size: usize,
    rem: &Dest,
) -> Result<LatRecorder, String> {
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
pub(super) fn bw_client(
    d: &Data,
    s: &Settled,
    size: usize,
    rem: &[Dest],
) -> Result<BwStats, String> {
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
pub(super) fn send_bw_server(d: &Data, s: &Settled, size: usize) -> Result<BwStats, String> {
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

pub(super) fn lat_outcome(rec: &LatRecorder, size: usize) -> Option<Outcome> {
    rec.stats(size).map(Outcome::Lat)
}

/// `xchg_bw_reports`: five 8-byte messages each way.
pub(super) fn xchg_reports(
    comm: &mut Comm,
    s: &Settled,
    mine: &BwReport,
) -> Result<BwReport, String> {
    let msgs = mine.encode(s.rem_version);
    let mut got = Vec::new();
    for m in &msgs {
        got.push(comm.xchg(m, &[m.len()], "bandwidth report")?);
    }
    BwReport::decode(&got).ok_or_else(|| "bad bandwidth report".into())
}

pub(super) fn report_of(b: &BwStats) -> BwReport {
    BwReport {
        size: b.bytes as u64,
        iters: b.iters,
        bw_peak: b.peak,
        bw_avg: b.avg,
        msg_rate: b.mpps,
    }
}

pub(super) fn stats_of(r: &BwReport) -> BwStats {
    BwStats {
        bytes: r.size as usize,
        iters: r.iters,
        peak: r.bw_peak,
        avg: r.bw_avg,
        mpps: r.msg_rate,
    }
}
