//! Counts and latencies of the FUSE operations the mount serves, for `status --json`
//! (`ops`): the next slow path is found by measuring, not guessing.

use std::time::Instant;

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::ops::OpKind;

/// Latencies (microseconds, 3 significant digits up to 100 s) of each operation.
pub struct OpStats {
    /// One per row of the operation table, [`OpKind`] (None only if hdrhistogram refused
    /// the bounds).
    hists: Vec<Option<Mutex<Histogram<u64>>>>,
    /// Operations started since the mount started (all kinds).
    started: std::sync::atomic::AtomicU64,
    /// Of those, operations the interception client's channel asked for (`crate::io`).
    from_io: std::sync::atomic::AtomicU64,
}

/// One operation's figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpFigures {
    /// The operation's name ([`OpKind::name`]).
    pub op: String,
    /// Operations served since the mount started.
    pub count: u64,
    /// Mean latency, in microseconds.
    pub mean_us: f64,
    /// Median latency, in microseconds.
    pub p50_us: u64,
    /// 99th percentile latency, in microseconds.
    pub p99_us: u64,
    /// Longest latency, in microseconds (at most 100 s).
    pub max_us: u64,
    /// Operations per latency bucket (not cumulative; bounds:
    /// `tierstack_common::LATENCY_BOUNDS_US`, then the overflow bucket).
    #[serde(default)]
    pub buckets: Vec<u64>,
}

/// Records the time from its creation to its drop under one operation.
pub struct Timer<'a> {
    stats: &'a OpStats,
    op: OpKind,
    t0: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        let us = self.t0.elapsed().as_micros().min(100_000_000) as u64;
        if let Some(Some(h)) = self.stats.hists.get(self.op.index()) {
            h.lock().saturating_record(us.max(1));
        }
    }
}

fn new_hist() -> Option<Histogram<u64>> {
    Histogram::new_with_bounds(1, 100_000_000, 3).ok()
}

impl Default for OpStats {
    fn default() -> Self {
        OpStats {
            hists: OpKind::all().map(|_| new_hist().map(Mutex::new)).collect(),
            started: std::sync::atomic::AtomicU64::new(0),
            from_io: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl OpStats {
    /// Starts timing operation `op`; recorded when the timer drops.
    pub fn time(&self, op: OpKind) -> Timer<'_> {
        self.started
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Timer {
            stats: self,
            op,
            t0: Instant::now(),
        }
    }

    /// Operations started since the mount started.
    pub fn started(&self) -> u64 {
        self.started.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes that the next operation started comes from the interception client's channel,
    /// not from the kernel.
    pub fn note_io(&self) {
        self.from_io
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Operations the kernel asked for (over `/dev/fuse` or io_uring) since the mount
    /// started: what the polling governor of `crate::poll` watches.
    pub fn started_by_kernel(&self) -> u64 {
        self.started()
            .wrapping_sub(self.from_io.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The figures of every operation served at least once.
    pub fn figures(&self) -> Vec<OpFigures> {
        OpKind::all()
            .zip(&self.hists)
            .filter_map(|(op, h)| figures_of(op.name(), &h.as_ref()?.lock()))
            .collect()
    }
}

fn figures_of(op: &str, h: &Histogram<u64>) -> Option<OpFigures> {
    (!h.is_empty()).then(|| OpFigures {
        op: op.to_string(),
        count: h.len(),
        mean_us: h.mean(),
        p50_us: h.value_at_quantile(0.5),
        p99_us: h.value_at_quantile(0.99),
        max_us: h.max(),
        buckets: buckets(h),
    })
}

/// The histogram's counts in the shared latency buckets: one pass over its recorded values
/// (each bucket holds the values up to its bound, as `count_between(0, bound)` counts them,
/// less the buckets below). `status` computes this for every operation at each scrape.
fn buckets(h: &Histogram<u64>) -> Vec<u64> {
    let bounds = &tierstack_common::LATENCY_BOUNDS_US;
    let tops: Vec<u64> = bounds.iter().map(|&b| h.highest_equivalent(b)).collect();
    let mut out = vec![0u64; bounds.len() + 1];
    for v in h.iter_recorded() {
        let i = tops.partition_point(|&t| t < v.value_iterated_to());
        out[i] += v.count_at_value();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buckets as `count_between` gives them (the former computation).
    fn buckets_by_ranges(h: &Histogram<u64>) -> Vec<u64> {
        let mut out = Vec::new();
        let mut below = 0;
        for &b in &tierstack_common::LATENCY_BOUNDS_US {
            let upto = h.count_between(0, b).max(below);
            out.push(upto - below);
            below = upto;
        }
        out.push(h.len().saturating_sub(below));
        out
    }

    #[test]
    fn one_pass_buckets_equal_the_range_counts() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 100_000_000, 3).expect("histogram");
        let mut x: u64 = 12345;
        for i in 0..20_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Spread over 1 us .. 60 s, with many at the buckets' bounds.
            let v = match i % 3 {
                0 => 1 + (x >> 40) % 60_000_000,
                1 => 1 + (x >> 50) % 5000,
                _ => tierstack_common::LATENCY_BOUNDS_US
                    [(x >> 33) as usize % tierstack_common::LATENCY_BOUNDS_US.len()]
                .min(60_000_000),
            };
            h.record(v).expect("record");
        }
        assert_eq!(buckets(&h), buckets_by_ranges(&h));
        assert_eq!(buckets(&h).iter().sum::<u64>(), h.len());
    }

    #[test]
    fn records_per_operation() {
        let s = OpStats::default();
        for _ in 0..10 {
            let _t = s.time(OpKind::Lookup);
        }
        {
            let _t = s.time(OpKind::Write);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let f = s.figures();
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].op, "lookup");
        assert_eq!(f[0].count, 10);
        assert_eq!(f[1].op, "write");
        assert!(f[1].p50_us >= 2000, "{:?}", f[1]);
        // Ten lookups of a few microseconds at most, one write of 2 ms or more (le 2.5 ms,
        // 5 ms or later on a busy machine).
        assert_eq!(f[0].buckets.iter().sum::<u64>(), 10);
        assert_eq!(f[1].buckets.iter().sum::<u64>(), 1);
        let w = f[1].buckets.iter().position(|&c| c == 1).unwrap_or(0);
        assert!(
            tierstack_common::LATENCY_BOUNDS_US
                .get(w)
                .is_none_or(|&b| b >= 2_500),
            "{:?}",
            f[1]
        );
    }

    /// Every row of the operation table is timed and listed under its name, in table order.
    #[test]
    fn every_operation_is_timed() {
        let s = OpStats::default();
        for (i, k) in OpKind::all().enumerate() {
            for _ in 0..=i {
                drop(s.time(k));
            }
        }
        let f = s.figures();
        assert_eq!(f.len(), OpKind::COUNT);
        for ((i, k), x) in OpKind::all().enumerate().zip(&f) {
            assert_eq!((x.op.as_str(), x.count), (k.name(), i as u64 + 1));
        }
        assert_eq!(s.started(), (1..=OpKind::COUNT as u64).sum::<u64>());
    }
}
