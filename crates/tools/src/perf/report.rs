//! perftest's output: the banner, the table header of latency or bandwidth tests and one
//! row per message size. MB is 2^20 bytes, as in perftest.

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
    /// The figures of `samples` (µs; sorted in place). `None` without samples.
    pub fn from_samples(bytes: usize, samples: &mut [f64]) -> Option<LatStats> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(|a, b| a.total_cmp(b));
        let n = samples.len();
        let avg = samples.iter().sum::<f64>() / n as f64;
        let var = samples.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
        let pct = |p: f64| samples[(((n as f64) * p).ceil() as usize).clamp(1, n) - 1];
        Some(LatStats {
            bytes,
            iters: n as u64,
            min: samples[0],
            max: samples[n - 1],
            typical: samples[n / 2],
            avg,
            stdev: var.sqrt(),
            p99: pct(0.99),
            p999: pct(0.999),
        })
    }

    /// The table row.
    pub fn row(&self) -> String {
        format!(
            " {:<7} {:<10}     {:<7.2}        {:<7.2}      {:<7.2}          {:<7.2}        {:<7.2}        {:<7.2}               {:<7.2}",
            self.bytes, self.iters, self.min, self.max, self.typical, self.avg, self.stdev, self.p99, self.p999
        )
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
        let mut s: Vec<f64> = (1..=1000).map(f64::from).collect();
        let l = LatStats::from_samples(64, &mut s).unwrap();
        assert_eq!((l.min, l.max, l.p99, l.p999), (1.0, 1000.0, 990.0, 999.0));
        assert_eq!(l.row().split_whitespace().count(), 9);
        assert!(LatStats::from_samples(1, &mut []).is_none());
        assert_eq!(LAT_HEADER.split("]").count(), 8);
    }
}
