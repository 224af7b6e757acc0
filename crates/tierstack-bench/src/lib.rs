//! Benchmark engines of tierstack. Every figure comes with its baseline from the same run.

#![warn(missing_docs)]

pub mod array;
pub mod checkpoint;
pub mod cluster;
pub mod error;
pub mod exporter;
pub mod io;
pub mod mem;
pub mod meta;
pub mod plot;
pub mod program;
pub mod table;
pub mod vram;
pub mod workloads;
pub mod zswap;

pub use error::BenchError;
pub use tierstack_common::{fmt_size, parse_size, SizeError};

/// The run whose `key` is the median of `runs` (the lower middle one of an even count); `None`
/// for no runs. `bench mem` reports each engine's median run of `--repeat`.
pub fn median_by<T>(mut runs: Vec<T>, key: impl Fn(&T) -> f64) -> Option<T> {
    if runs.is_empty() {
        return None;
    }
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let mid = (runs.len() - 1) / 2;
    Some(runs.swap_remove(mid))
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_is_the_middle_run() {
        assert_eq!(super::median_by(vec![3.0, 1.0, 2.0], |x| *x), Some(2.0));
        assert_eq!(
            super::median_by(vec![4.0, 1.0, 3.0, 2.0], |x| *x),
            Some(2.0)
        );
        assert!(super::median_by(Vec::<f64>::new(), |x| *x).is_none());
    }
}
