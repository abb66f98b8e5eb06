//! Fault injection between the transport and the sockets: loss, duplication, reordering, delay
//! and corruption, seeded and deterministic per seed.
//!
//! Off by default. Any program using the device switches it on from its environment
//! ([`crate::SoftConfig::from_env`]) or in its configuration ([`super::UdpConfig::faults`]):
//!
//! ```text
//! RDMA_SOFT_FAULTS=loss=0.05,dup=0.02,reorder=0.05,delay=0.1:2ms,corrupt=0.01,seed=7,dir=send
//! ```
//!
//! | key | value | effect |
//! | --- | --- | --- |
//! | `loss` | probability | the datagram is dropped |
//! | `corrupt` | probability | one random bit of the datagram is flipped (after the ICRC was written on send, before it is checked on receive, so the receiver's ICRC check catches it) |
//! | `dup` | probability | the datagram is delivered twice |
//! | `reorder` | probability | the datagram is held back until a later one has passed (or `reorder_window`, default 1ms, elapsed) |
//! | `delay` | `MAX` or `P:MAX` | a fraction `P` (default 1) of datagrams is held for a uniform random time in `[0, MAX]` |
//! | `seed` | integer | random seed (default 0) |
//! | `dir` | `send`, `recv` or `both` | where faults apply (default `send`, so two faulty peers do not double the rate) |
//! | `reorder_window` | duration | longest time a reordered datagram waits for a later one |
//! | `local` | IP address | faults only on datagrams sent from or received on this local address (e.g. one port of a device group); default: all |
//!
//! Durations take a unit: `ns`, `us`, `ms` or `s`. The decisions for the n-th datagram depend
//! only on the seed and n (one random stream per direction), so a run replays with its seed.

use std::time::{Duration, Instant};

use crate::{Error, Result};

/// The environment variable of fault injection, read by [`crate::SoftConfig::from_env`]
/// (into [`super::UdpConfig::faults`]).
pub const FAULTS_ENV: &str = "RDMA_SOFT_FAULTS";

/// Where faults are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FaultDir {
    /// On datagrams this process sends.
    #[default]
    Send,
    /// On datagrams this process receives.
    Recv,
    /// On both.
    Both,
}

/// A parsed fault specification.
///
/// ```
/// use rdma_soft::io::{FaultDir, FaultSpec};
/// use std::time::Duration;
/// let spec: FaultSpec = "loss=0.05,delay=0.5:2ms,seed=7,dir=both".parse().unwrap();
/// assert_eq!(spec.loss, 0.05);
/// assert_eq!(spec.delay, Some((0.5, Duration::from_millis(2))));
/// assert_eq!(spec.dir, FaultDir::Both);
/// let err = "loss=2".parse::<FaultSpec>().unwrap_err();
/// assert!(err.to_string().contains("loss"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    /// Probability that a datagram is dropped.
    pub loss: f64,
    /// Probability that a datagram is duplicated.
    pub dup: f64,
    /// Probability that a datagram is held back behind a later one.
    pub reorder: f64,
    /// Probability and longest time a datagram is delayed.
    pub delay: Option<(f64, Duration)>,
    /// Probability that one bit of a datagram is flipped.
    pub corrupt: f64,
    /// Seed of the random decisions.
    pub seed: u64,
    /// Where faults apply.
    pub dir: FaultDir,
    /// Longest wait of a reordered datagram for a later one.
    pub reorder_window: Duration,
    /// Only datagrams sent from or received on this local address, if given.
    pub local: Option<std::net::IpAddr>,
}

impl Default for FaultSpec {
    fn default() -> FaultSpec {
        FaultSpec {
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            delay: None,
            corrupt: 0.0,
            seed: 0,
            dir: FaultDir::Send,
            reorder_window: Duration::from_millis(1),
            local: None,
        }
    }
}

impl FaultSpec {
    /// Whether faults apply to sent datagrams.
    pub fn on_send(&self) -> bool {
        matches!(self.dir, FaultDir::Send | FaultDir::Both)
    }

    /// Whether faults apply to received datagrams.
    pub fn on_recv(&self) -> bool {
        matches!(self.dir, FaultDir::Recv | FaultDir::Both)
    }

    /// Whether faults apply to datagrams of local address `ip` (see `local`).
    ///
    /// ```
    /// use rdma_soft::io::FaultSpec;
    /// let spec: FaultSpec = "loss=0.1,local=198.51.100.1".parse().unwrap();
    /// assert!(spec.applies_to("198.51.100.1".parse().unwrap()));
    /// assert!(!spec.applies_to("192.0.2.1".parse().unwrap()));
    /// assert!("loss=0.1,local=here".parse::<FaultSpec>().is_err());
    /// ```
    pub fn applies_to(&self, ip: std::net::IpAddr) -> bool {
        self.local.map_or(true, |l| l == ip)
    }
}

fn parse_prob(key: &str, v: &str) -> std::result::Result<f64, String> {
    let p: f64 = v
        .parse()
        .map_err(|_| format!("{key}: {v:?} is not a number"))?;
    if !(0.0..=1.0).contains(&p) {
        return Err(format!("{key}: {p} is not a probability in [0, 1]"));
    }
    Ok(p)
}

fn parse_duration(key: &str, v: &str) -> std::result::Result<Duration, String> {
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{key}: {v:?} needs a unit (ns, us, ms, s)"))?;
    let (num, unit) = v.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{key}: {num:?} is not a number"))?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(format!("{key}: unknown unit {unit:?} (ns, us, ms, s)")),
    };
    let secs = n * scale;
    if !(0.0..=3600.0).contains(&secs) {
        return Err(format!("{key}: {v} is out of range (0 to 1 hour)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl std::str::FromStr for FaultSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<FaultSpec> {
        let bad = |reason: String| Error::FaultSpec {
            spec: s.to_owned(),
            reason,
        };
        let mut spec = FaultSpec::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("{item:?} is not key=value")))?;
            let (key, value) = (key.trim(), value.trim());
            if seen.contains(&key) {
                return Err(bad(format!("{key} given twice")));
            }
            seen.push(key);
            match key {
                "loss" => spec.loss = parse_prob(key, value).map_err(bad)?,
                "dup" => spec.dup = parse_prob(key, value).map_err(bad)?,
                "reorder" => spec.reorder = parse_prob(key, value).map_err(bad)?,
                "corrupt" => spec.corrupt = parse_prob(key, value).map_err(bad)?,
                "delay" => {
                    spec.delay = Some(match value.split_once(':') {
                        Some((p, d)) => (
                            parse_prob(key, p).map_err(bad)?,
                            parse_duration(key, d).map_err(bad)?,
                        ),
                        None => (1.0, parse_duration(key, value).map_err(bad)?),
                    })
                }
                "reorder_window" => {
                    spec.reorder_window = parse_duration(key, value).map_err(bad)?
                }
                "seed" => {
                    spec.seed = value
                        .parse()
                        .map_err(|_| bad(format!("seed: {value:?} is not an unsigned integer")))?
                }
                "local" => {
                    spec.local = Some(value.parse().map_err(|_| {
                        bad(format!("local: {value:?} is not an IP address"))
                    })?)
                }
                "dir" => {
                    spec.dir = match value {
                        "send" => FaultDir::Send,
                        "recv" => FaultDir::Recv,
                        "both" => FaultDir::Both,
                        _ => return Err(bad(format!("dir: {value:?} is not send, recv or both"))),
                    }
                }
                _ => {
                    return Err(bad(format!(
                        "unknown key {key:?} (known: loss, dup, reorder, delay, corrupt, seed, dir, reorder_window, local)"
                    )))
                }
            }
        }
        Ok(spec)
    }
}

/// SplitMix64: small, fast, and good enough for fault decisions.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// What happens to one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Deliver it as it is (perhaps corrupted in place).
    Pass,
    /// Deliver it twice.
    Duplicate,
    /// Lose it.
    Drop,
    /// Hold it for at most `wait`; with `overtake`, release it as soon as a later datagram
    /// has passed.
    Hold { wait: Duration, overtake: bool },
}

/// Counters of what the injector did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Datagrams dropped.
    pub dropped: u64,
    /// Datagrams duplicated.
    pub duplicated: u64,
    /// Datagrams with a flipped bit.
    pub corrupted: u64,
    /// Datagrams held back behind later ones.
    pub reordered: u64,
    /// Datagrams delayed.
    pub delayed: u64,
}

struct HeldSlot<M> {
    buf: Box<[u8]>,
    len: usize,
    meta: Option<M>,
    due: Instant,
    /// Release once this many datagrams have passed in total.
    overtaken_at: Option<u64>,
}

/// One direction's fault injector: its random stream, its counters and a fixed pool of held
/// datagrams (allocated once; when the pool is full a datagram that would be held passes).
pub(crate) struct FaultInjector<M> {
    spec: FaultSpec,
    rng: Rng,
    passed: u64,
    held: Vec<HeldSlot<M>>,
    stats: FaultStats,
}

/// Held datagrams per direction.
const HELD_SLOTS: usize = 64;

impl<M: Copy> FaultInjector<M> {
    /// An injector for datagrams of up to `slot` bytes; `stream` separates the random streams of
    /// the two directions.
    pub fn new(spec: &FaultSpec, stream: u64, slot: usize) -> FaultInjector<M> {
        let now = Instant::now();
        FaultInjector {
            rng: Rng::new(spec.seed ^ stream.wrapping_mul(0xa076_1d64_78bd_642f)),
            spec: spec.clone(),
            passed: 0,
            held: (0..HELD_SLOTS)
                .map(|_| HeldSlot {
                    buf: vec![0u8; slot].into_boxed_slice(),
                    len: 0,
                    meta: None,
                    due: now,
                    overtaken_at: None,
                })
                .collect(),
            stats: FaultStats::default(),
        }
    }

    /// Whether this injector judges the datagrams of local address `ip`
    /// ([`FaultSpec::applies_to`]).
    pub fn applies_to(&self, ip: std::net::IpAddr) -> bool {
        self.spec.applies_to(ip)
    }

    pub fn stats(&self) -> FaultStats {
        self.stats
    }

    /// Decides the fate of one datagram, corrupting it in place if so decided. Every call draws
    /// the same number of random values, so decisions depend only on the seed and the count.
    pub fn judge(&mut self, data: &mut [u8]) -> Verdict {
        let r_loss = self.rng.next_f64();
        let r_corrupt = self.rng.next_f64();
        let r_bit = self.rng.next_u64();
        let r_dup = self.rng.next_f64();
        let r_reorder = self.rng.next_f64();
        let r_delay = self.rng.next_f64();
        let r_wait = self.rng.next_f64();
        if r_loss < self.spec.loss {
            self.stats.dropped += 1;
            tracing::trace!(len = data.len(), "fault injected: drop");
            return Verdict::Drop;
        }
        if r_corrupt < self.spec.corrupt && !data.is_empty() {
            let bit = (r_bit % (data.len() as u64 * 8)) as usize;
            data[bit / 8] ^= 1 << (bit % 8);
            self.stats.corrupted += 1;
            tracing::trace!(bit, "fault injected: corrupt");
        }
        if r_dup < self.spec.dup {
            self.stats.duplicated += 1;
            tracing::trace!("fault injected: duplicate");
            return Verdict::Duplicate;
        }
        if r_reorder < self.spec.reorder {
            tracing::trace!("fault injected: reorder");
            return Verdict::Hold {
                wait: self.spec.reorder_window,
                overtake: true,
            };
        }
        if let Some((p, max)) = self.spec.delay {
            if r_delay < p {
                tracing::trace!("fault injected: delay");
                return Verdict::Hold {
                    wait: max.mul_f64(r_wait),
                    overtake: false,
                };
            }
        }
        Verdict::Pass
    }

    /// Counts a datagram that went through (for reorder release).
    pub fn passed(&mut self) {
        self.passed += 1;
    }

    /// Keeps a copy of `data` until its release; returns false (the caller then passes it on
    /// at once) when no slot is free or the datagram does not fit.
    pub fn hold(&mut self, now: Instant, data: &[u8], meta: M, verdict: Verdict) -> bool {
        let Verdict::Hold { wait, overtake } = verdict else {
            return false;
        };
        let Some(slot) = self
            .held
            .iter_mut()
            .find(|s| s.meta.is_none() && s.buf.len() >= data.len())
        else {
            return false;
        };
        slot.buf[..data.len()].copy_from_slice(data);
        slot.len = data.len();
        slot.meta = Some(meta);
        slot.due = now + wait;
        slot.overtaken_at = overtake.then_some(self.passed + 1);
        if overtake {
            self.stats.reordered += 1;
        } else {
            self.stats.delayed += 1;
        }
        true
    }

    /// Hands every held datagram that is due to `out`, oldest deadline first within a call is
    /// not guaranteed (delays are random anyway).
    pub fn release(&mut self, now: Instant, out: &mut dyn FnMut(M, &mut [u8])) {
        let passed = self.passed;
        for slot in self.held.iter_mut() {
            let Some(meta) = slot.meta else { continue };
            let overtaken = slot.overtaken_at.is_some_and(|at| passed >= at);
            if overtaken || now >= slot.due {
                slot.meta = None;
                out(meta, &mut slot.buf[..slot.len]);
            }
        }
    }

    /// Earliest deadline of a held datagram.
    pub fn next_due(&self) -> Option<Instant> {
        self.held
            .iter()
            .filter(|s| s.meta.is_some())
            .map(|s| s.due)
            .min()
    }

    /// Held datagrams.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held.iter().filter(|s| s.meta.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> FaultSpec {
        s.parse().unwrap()
    }

    #[test]
    fn parse_full_and_errors() {
        let s = spec("loss=0.05,dup=0.02,reorder=0.05,delay=3ms,corrupt=0.01,seed=7");
        assert_eq!(s.loss, 0.05);
        assert_eq!(s.dup, 0.02);
        assert_eq!(s.reorder, 0.05);
        assert_eq!(s.delay, Some((1.0, Duration::from_millis(3))));
        assert_eq!(s.corrupt, 0.01);
        assert_eq!(s.seed, 7);
        assert_eq!(s.dir, FaultDir::Send);
        assert_eq!(spec(""), FaultSpec::default());
        assert_eq!(
            spec("delay=0.25:10us").delay,
            Some((0.25, Duration::from_micros(10)))
        );
        for (bad, needle) in [
            ("loss", "not key=value"),
            ("loss=x", "loss: \"x\" is not a number"),
            ("loss=1.5", "not a probability"),
            ("loss=-0.1", "not a probability"),
            ("loss=NaN", "not a probability"),
            ("lose=0.1", "unknown key \"lose\""),
            ("loss=0.1,loss=0.2", "loss given twice"),
            ("delay=5", "needs a unit"),
            ("delay=5h", "unknown unit"),
            ("delay=2:1ms", "not a probability"),
            ("seed=-1", "seed"),
            ("dir=up", "dir"),
        ] {
            let e = bad.parse::<FaultSpec>().unwrap_err();
            assert_eq!(e.errno(), libc::EINVAL);
            let msg = e.to_string();
            assert!(msg.contains(needle), "{bad}: {msg}");
            assert!(msg.contains(bad), "the message quotes the spec: {msg}");
        }
    }

    fn run(spec: &FaultSpec, n: usize) -> (Vec<Verdict>, Vec<Vec<u8>>) {
        let mut inj: FaultInjector<u32> = FaultInjector::new(spec, 1, 64);
        let mut verdicts = Vec::new();
        let mut datas = Vec::new();
        for i in 0..n {
            let mut d = vec![i as u8; 16];
            verdicts.push(inj.judge(&mut d));
            datas.push(d);
        }
        (verdicts, datas)
    }

    #[test]
    fn deterministic_per_seed_and_rates_match() {
        let s = spec("loss=0.1,dup=0.05,corrupt=0.02,reorder=0.05,seed=42");
        let (a, da) = run(&s, 20_000);
        let (b, db) = run(&s, 20_000);
        assert_eq!(a, b);
        assert_eq!(da, db);
        let (c, _) = run(
            &spec("loss=0.1,dup=0.05,corrupt=0.02,reorder=0.05,seed=43"),
            20_000,
        );
        assert_ne!(a, c);
        let n = a.len() as f64;
        let frac = |f: &dyn Fn(&Verdict) -> bool| a.iter().filter(|v| f(v)).count() as f64 / n;
        let loss = frac(&|v| *v == Verdict::Drop);
        let dup = frac(&|v| *v == Verdict::Duplicate);
        let held = frac(&|v| matches!(v, Verdict::Hold { overtake: true, .. }));
        assert!((loss - 0.1).abs() < 0.01, "loss {loss}");
        // dup and reorder are drawn only for datagrams that were not lost.
        assert!((dup - 0.9 * 0.05).abs() < 0.008, "dup {dup}");
        assert!((held - 0.9 * 0.95 * 0.05).abs() < 0.008, "reorder {held}");
        let corrupted = da
            .iter()
            .enumerate()
            .filter(|(i, d)| d.iter().any(|&x| x != *i as u8))
            .count() as f64
            / n;
        assert!(
            (corrupted - 0.9 * 0.02).abs() < 0.006,
            "corrupt {corrupted}"
        );
        // Exactly one bit flipped in each corrupted datagram.
        for (i, d) in da.iter().enumerate() {
            let bits: u32 = d.iter().map(|&x| (x ^ i as u8).count_ones()).sum();
            assert!(bits <= 1);
        }
    }

    #[test]
    fn hold_and_release() {
        let s = spec("reorder=1,reorder_window=50ms");
        let mut inj: FaultInjector<u32> = FaultInjector::new(&s, 0, 32);
        let now = Instant::now();
        let mut d = [1u8; 8];
        let v = inj.judge(&mut d);
        assert!(inj.hold(now, &d, 1, v));
        let mut out = Vec::new();
        inj.release(now, &mut |m, b| out.push((m, b.to_vec())));
        assert!(out.is_empty(), "not yet overtaken");
        inj.passed();
        inj.release(now, &mut |m, b| out.push((m, b.to_vec())));
        assert_eq!(out, vec![(1, vec![1u8; 8])]);
        // A held datagram nobody overtakes is released at its deadline.
        assert!(inj.hold(now, &d, 2, v));
        assert_eq!(inj.next_due(), Some(now + Duration::from_millis(50)));
        out.clear();
        inj.release(now + Duration::from_millis(50), &mut |m, _| {
            out.push((m, vec![]))
        });
        assert_eq!(out.len(), 1);
        assert_eq!(inj.held(), 0);
        // Too big for a slot: not held.
        assert!(!inj.hold(now, &[0u8; 33], 3, v));
        // The pool is bounded.
        for i in 0..HELD_SLOTS {
            assert!(inj.hold(now, &d, i as u32, v));
        }
        assert!(!inj.hold(now, &d, 99, v));
    }

    #[test]
    fn delay_waits_are_bounded() {
        let s = spec("delay=0.5:4ms,seed=1");
        let (v, _) = run(&s, 2000);
        let mut delayed = 0;
        for x in v {
            if let Verdict::Hold { wait, overtake } = x {
                assert!(!overtake && wait <= Duration::from_millis(4));
                delayed += 1;
            }
        }
        assert!((800..1200).contains(&delayed), "{delayed}");
    }
}
