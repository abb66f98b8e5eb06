//! Summary statistics of per-operation samples.

use std::time::Duration;

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

    /// Summarizes values; `None` for no samples.
    pub fn of(mut v: Vec<f64>) -> Option<Summary> {
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        // nearest-rank percentile
        let pct = |p: f64| {
            let rank = (p * v.len() as f64 / 100.0 - 1e-9).ceil() as usize;
            v[rank.clamp(1, v.len()) - 1]
        };
        Some(Summary {
            count: v.len(),
            min: v[0],
            median: pct(50.0),
            avg: v.iter().sum::<f64>() / v.len() as f64,
            p99: pct(99.0),
            p999: pct(99.9),
            max: v[v.len() - 1],
        })
    }

    /// Adds `{prefix}_min_us`, `_median_us`, `_avg_us`, `_p99_us`, `_p999_us` and `_max_us` to
    /// a JSON object.
    pub fn add_to(&self, o: crate::json::Object, prefix: &str) -> crate::json::Object {
        o.num(&format!("{prefix}_min_us"), self.min)
            .num(&format!("{prefix}_median_us"), self.median)
            .num(&format!("{prefix}_avg_us"), self.avg)
            .num(&format!("{prefix}_p99_us"), self.p99)
            .num(&format!("{prefix}_p999_us"), self.p999)
            .num(&format!("{prefix}_max_us"), self.max)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let s = Summary::of((1..=1000).map(f64::from).collect()).unwrap();
        assert_eq!(s.count, 1000);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.median, 500.0);
        assert_eq!(s.avg, 500.5);
        assert_eq!(s.p99, 990.0);
        assert_eq!(s.p999, 999.0);
        assert_eq!(s.max, 1000.0);
        assert_eq!(s.scaled(2.0).median, 250.0);
        assert!(Summary::of(vec![]).is_none());
        let one = Summary::of(vec![3.0]).unwrap();
        assert_eq!((one.min, one.p999), (3.0, 3.0));
    }
}
