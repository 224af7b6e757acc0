//! Latency buckets shared by every latency histogram tierstack exports: the pager's fault
//! service time (`tierstack run`), the mount's per-FUSE-operation times, and the Prometheus
//! histograms built from both. One set of bounds, so a dashboard can put them side by side.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds of the buckets, in microseconds (1-2.5-5 steps from 1 µs to 10 s). A value
/// above the last bound falls in the overflow bucket (Prometheus' `+Inf`).
pub const LATENCY_BOUNDS_US: [u64; 22] = [
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000,
    250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Buckets including the overflow bucket.
pub const BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

/// The bucket of a value in nanoseconds.
pub fn bucket_of_ns(ns: u64) -> usize {
    // A value counts in the first bucket whose bound it does not exceed (Prometheus `le`).
    LATENCY_BOUNDS_US.partition_point(|&b| b * 1000 < ns)
}

/// A lock-free latency histogram: one relaxed atomic add per observation (cheap enough for
/// the fault path), read as per-bucket counts plus the sum.
#[derive(Debug, Default)]
pub struct AtomicHistogram {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl AtomicHistogram {
    /// Counts one observation of `ns` nanoseconds.
    pub fn observe_ns(&self, ns: u64) {
        self.counts[bucket_of_ns(ns)].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// Per-bucket counts (not cumulative), [`BUCKETS`] of them.
    pub fn counts(&self) -> Vec<u64> {
        self.counts.iter().map(|c| c.load(Relaxed)).collect()
    }

    /// The sum of all observations, in nanoseconds.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns.load(Relaxed)
    }
}

/// The quantile `q` (0..=1) of per-bucket `counts`, as the upper bound of the bucket it falls
/// in, in microseconds (None when empty; the overflow bucket reports twice the last bound).
pub fn quantile_us(counts: &[u64], q: f64) -> Option<u64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(
                LATENCY_BOUNDS_US
                    .get(i)
                    .copied()
                    .unwrap_or(2 * LATENCY_BOUNDS_US[LATENCY_BOUNDS_US.len() - 1]),
            );
        }
    }
    None
}

/// Adds `b` into `a` bucket by bucket (lengths may differ: an empty `a` takes `b`'s).
pub fn add_counts(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_prometheus_le() {
        assert_eq!(bucket_of_ns(0), 0);
        assert_eq!(bucket_of_ns(1000), 0); // 1 µs <= le 1
        assert_eq!(bucket_of_ns(1001), 1);
        assert_eq!(bucket_of_ns(7_000), 3); // le 10
        assert_eq!(bucket_of_ns(10_000_000_000), LATENCY_BOUNDS_US.len() - 1);
        assert_eq!(bucket_of_ns(10_000_000_001), LATENCY_BOUNDS_US.len());
    }

    #[test]
    fn histogram_and_quantiles() {
        let h = AtomicHistogram::default();
        for _ in 0..90 {
            h.observe_ns(4_000); // le 5 µs
        }
        for _ in 0..10 {
            h.observe_ns(300_000); // le 500 µs
        }
        let c = h.counts();
        assert_eq!(c.len(), BUCKETS);
        assert_eq!(c.iter().sum::<u64>(), 100);
        assert_eq!(quantile_us(&c, 0.5), Some(5));
        assert_eq!(quantile_us(&c, 0.9), Some(5));
        assert_eq!(quantile_us(&c, 0.99), Some(500));
        assert_eq!(h.sum_ns(), 90 * 4_000 + 10 * 300_000);
        assert_eq!(quantile_us(&[], 0.5), None);
        let mut s = Vec::new();
        add_counts(&mut s, &c);
        add_counts(&mut s, &c);
        assert_eq!(s.iter().sum::<u64>(), 200);
    }
}
