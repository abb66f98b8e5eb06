//! perftest's output: the banner, the table header of latency or bandwidth tests and one
//! row per message size. MB is 2^20 bytes, as in perftest.

use hdrhistogram::Histogram;

use super::{Kind, Params};

/// perftest's dashed line.
pub const DASHES: &str =
    "---------------------------------------------------------------------------------------";

/// Header of latency tables.
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// Header of bandwidth tables.
pub const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";

/// Latency figures of one message size, in microseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct LatStats {
    /// Message size.
    pub bytes: usize,
    /// Iterations measured.
    pub iters: u64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Median.
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

impl LatStats {
    /// The figures of `samples` (µs). `None` without samples.
    pub fn from_samples(bytes: usize, samples: &[f64]) -> Option<LatStats> {
        let mut r = LatRecorder::new();
        for &x in samples {
            r.record(x);
        }
        r.stats(bytes)
    }

    /// The table row.
    pub fn row(&self) -> String {
        format!(
            " {:<7} {:<10}     {:<7.2}        {:<7.2}      {:<7.2}          {:<7.2}        {:<7.2}        {:<7.2}               {:<7.2}",
            self.bytes, self.iters, self.min, self.max, self.typical, self.avg, self.stdev, self.p99, self.p999
        )
    }
}

/// Latency samples of one phase as they come: an HDR histogram (the `hdrhistogram` crate,
/// 3 significant digits in nanoseconds, as most latency tools keep them) for the median and
/// the percentiles, and exact count, minimum, maximum, mean and standard deviation (Welford).
/// Memory stays the same however long the phase (`-D`) runs.
#[derive(Debug, Clone)]
pub struct LatRecorder {
    hist: Histogram<u64>,
    n: u64,
    min: f64,
    max: f64,
    mean: f64,
    m2: f64,
}

impl Default for LatRecorder {
    fn default() -> Self {
        LatRecorder::new()
    }
}

impl LatRecorder {
    /// Nothing recorded yet.
    pub fn new() -> LatRecorder {
        LatRecorder {
            // 1 ns to an hour: any latency a phase can see.
            hist: Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                .expect("valid histogram bounds"),
            n: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            mean: 0.0,
            m2: 0.0,
        }
    }

    /// Records one sample, in µs.
    pub fn record(&mut self, us: f64) {
        self.hist
            .saturating_record((us * 1e3).round().max(1.0) as u64);
        self.n += 1;
        self.min = self.min.min(us);
        self.max = self.max.max(us);
        let d = us - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (us - self.mean);
    }

    /// The figures of what was recorded, for message size `bytes`; `None` when nothing
    /// was. Percentiles are nearest-rank on the histogram (the highest value of the
    /// sample's bucket, at most 0.1% above it, never more than the maximum).
    pub fn stats(&self, bytes: usize) -> Option<LatStats> {
        if self.n == 0 {
            return None;
        }
        let pct = |q: f64| (self.hist.value_at_quantile(q) as f64 / 1e3).clamp(self.min, self.max);
        Some(LatStats {
            bytes,
            iters: self.n,
            min: self.min,
            max: self.max,
            typical: pct(0.5),
            avg: self.mean,
            stdev: (self.m2 / self.n as f64).sqrt(),
            p99: pct(0.99),
            p999: pct(0.999),
        })
    }
}

/// Bandwidth figures of one message size.
#[derive(Debug, Clone, PartialEq)]
pub struct BwStats {
    /// Message size.
    pub bytes: usize,
    /// Messages completed.
    pub iters: u64,
    /// Best window, MB/s.
    pub peak: f64,
    /// Whole run, MB/s.
    pub avg: f64,
    /// Messages per second, millions.
    pub mpps: f64,
}

impl BwStats {
    /// The table row.
    pub fn row(&self) -> String {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}              {:<7.6}",
            self.bytes, self.iters, self.peak, self.avg, self.mpps
        )
    }
}

/// The result of one message size.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A latency test's.
    Lat(LatStats),
    /// A bandwidth test's.
    Bw(BwStats),
}

impl Outcome {
    /// The table row.
    pub fn row(&self) -> String {
        match self {
            Outcome::Lat(l) => l.row(),
            Outcome::Bw(b) => b.row(),
        }
    }
}

/// perftest's banner: test name and the connection's settings.
pub fn banner(p: &Params, device: &str, mtu: &str) -> String {
    let mut s = String::new();
    s.push_str(DASHES);
    s.push('\n');
    s.push_str(&format!("                    {}\n", p.test.title()));
    s.push_str(&format!(
        " Dual-port       : OFF          Device         : {device}\n"
    ));
    s.push_str(&format!(
        " Number of qps   : {:<14} Transport type : RoCEv2 (rdma-soft)\n",
        p.qps
    ));
    s.push_str(" Connection type : RC             Using SRQ      : OFF\n");
    if p.test.kind == Kind::Bw {
        s.push_str(&format!(" TX depth        : {}\n", p.tx_depth));
    }
    match p.duration {
        Some(d) => s.push_str(&format!(" Duration        : {} [sec]\n", d.as_secs())),
        None => s.push_str(&format!(" Iterations      : {}\n", p.iters)),
    }
    s.push_str(&format!(" Mtu             : {mtu}\n"));
    s.push_str(" Link type       : Ethernet\n");
    s.push_str(" rdma_cm QPs     : ON\n");
    s.push_str(" Data ex. method : rdma_cm\n");
    s.push_str(DASHES);
    s
}

/// The table header for `kind`, between dashed lines as perftest prints it.
pub fn header(kind: Kind) -> String {
    format!(
        "{DASHES}\n{}",
        match kind {
            Kind::Lat => LAT_HEADER,
            Kind::Bw => BW_HEADER,
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let s: Vec<f64> = (1..=1000).map(f64::from).collect();
        let l = LatStats::from_samples(64, &s).unwrap();
        // Within the histogram's 0.1%, never below the exact nearest-rank sample.
        let near = |got: f64, exact: f64| got >= exact && got <= exact * 1.001;
        assert_eq!((l.min, l.max, l.iters), (1.0, 1000.0, 1000));
        assert!(
            near(l.p99, 990.0) && near(l.p999, 999.0) && near(l.typical, 500.0),
            "{l:?}"
        );
        assert_eq!(l.avg, 500.5);
        assert!((l.stdev - 288.675).abs() < 1e-3, "{l:?}");
        assert_eq!(l.row().split_whitespace().count(), 9);
        assert!(LatStats::from_samples(1, &[]).is_none());
        // Below 2.048 µs the histogram is exact to the nanosecond, above within 0.1%.
        let l = LatStats::from_samples(2, &[1.25, 1.5, 2.0]).unwrap();
        assert_eq!((l.typical, l.p99), (1.5, 2.0));
        let l = LatStats::from_samples(2, &[3.25, 3.5, 4.125]).unwrap();
        assert!(near(l.typical, 3.5) && l.p99 == 4.125, "{l:?}");
        assert_eq!(LAT_HEADER.split("]").count(), 8);
    }
}
