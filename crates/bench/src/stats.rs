//! Summary statistics of per-operation samples: percentiles from an HDR histogram (the
//! `hdrhistogram` crate, as most latency tools report them), minimum, maximum and mean
//! exact.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::ser::{Serialize, SerializeMap, Serializer};

/// The histogram's resolution: 3 significant digits (a reported percentile is at most
/// 0.1% above the sample it stands for), in nanoseconds, up to an hour.
const SIGFIG: u8 = 3;
const MAX_NS: u64 = 3_600_000_000_000;

/// Summary of a set of samples, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Smallest sample.
    pub min: f64,
    /// Median (50th percentile).
    pub median: f64,
    /// Mean.
    pub avg: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
}

impl Summary {
    /// Summarizes durations in microseconds; `None` for no samples.
    pub fn of_durations(samples: &[Duration]) -> Option<Summary> {
        let us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        Summary::of(us)
    }

    /// Summarizes values in microseconds; `None` for no samples. Percentiles are
    /// nearest-rank on the histogram (the highest value of the sample's bucket, never more
    /// than the largest sample).
    pub fn of(v: Vec<f64>) -> Option<Summary> {
        if v.is_empty() {
            return None;
        }
        let mut h =
            Histogram::<u64>::new_with_bounds(1, MAX_NS, SIGFIG).expect("valid histogram bounds");
        let (mut min, mut max, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
        for &x in &v {
            h.saturating_record((x * 1e3).round().max(1.0) as u64);
            min = min.min(x);
            max = max.max(x);
            sum += x;
        }
        let pct = |q: f64| (h.value_at_quantile(q) as f64 / 1e3).clamp(min, max);
        Some(Summary {
            count: v.len(),
            min,
            median: pct(0.5),
            avg: sum / v.len() as f64,
            p99: pct(0.99),
            p999: pct(0.999),
            max,
        })
    }

    /// The summary as JSON members `{prefix}_min_us`, `_median_us`, `_avg_us`, `_p99_us`,
    /// `_p999_us` and `_max_us` (for `#[serde(flatten)]` into an output object).
    pub fn json<'a>(&'a self, prefix: &'a str) -> SummaryJson<'a> {
        SummaryJson {
            summary: self,
            prefix,
        }
    }

    /// Every value divided by `d` (e.g. 2 for half a round trip).
    pub fn scaled(&self, d: f64) -> Summary {
        Summary {
            count: self.count,
            min: self.min / d,
            median: self.median / d,
            avg: self.avg / d,
            p99: self.p99 / d,
            p999: self.p999 / d,
            max: self.max / d,
        }
    }
}

/// A [`Summary`] serialized as prefixed JSON members; see [`Summary::json`].
#[derive(Debug, Clone, Copy)]
pub struct SummaryJson<'a> {
    summary: &'a Summary,
    prefix: &'a str,
}

impl Serialize for SummaryJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let p = self.prefix;
        let v = self.summary;
        let mut m = s.serialize_map(Some(6))?;
        m.serialize_entry(&format!("{p}_min_us"), &crate::json::Num(v.min))?;
        m.serialize_entry(&format!("{p}_median_us"), &crate::json::Num(v.median))?;
        m.serialize_entry(&format!("{p}_avg_us"), &crate::json::Num(v.avg))?;
        m.serialize_entry(&format!("{p}_p99_us"), &crate::json::Num(v.p99))?;
        m.serialize_entry(&format!("{p}_p999_us"), &crate::json::Num(v.p999))?;
        m.serialize_entry(&format!("{p}_max_us"), &crate::json::Num(v.max))?;
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within the histogram's 0.1%, and never below the exact nearest-rank value.
    fn near(got: f64, exact: f64) -> bool {
        got >= exact && got <= exact * 1.001
    }

    #[test]
    fn percentiles() {
        let s = Summary::of((1..=1000).map(f64::from).collect()).unwrap();
        assert_eq!(s.count, 1000);
        assert_eq!(s.min, 1.0);
        assert!(near(s.median, 500.0), "{s:?}");
        assert_eq!(s.avg, 500.5);
        assert!(near(s.p99, 990.0), "{s:?}");
        assert!(near(s.p999, 999.0), "{s:?}");
        assert_eq!(s.max, 1000.0);
        assert!(near(s.scaled(2.0).median, 250.0));
        assert!(Summary::of(vec![]).is_none());
        let one = Summary::of(vec![3.0]).unwrap();
        assert_eq!(
            (one.min, one.median, one.p999, one.max),
            (3.0, 3.0, 3.0, 3.0)
        );
        // Sub-microsecond samples keep their nanoseconds.
        let small = Summary::of(vec![0.25, 0.5, 0.75, 1.0]).unwrap();
        assert_eq!((small.median, small.p99), (0.5, 1.0));
    }

    #[test]
    fn json_members() {
        let s = Summary::of(vec![1.0, 2.0, 3.0]).unwrap();
        let v = serde_json::to_value(s.json("rtt")).unwrap();
        assert_eq!(v["rtt_min_us"], 1.0);
        assert_eq!(v["rtt_max_us"], 3.0);
        assert_eq!(v["rtt_median_us"], 2.0);
        assert_eq!(v.as_object().unwrap().len(), 6);
    }
}
