//! What several tierstack crates share and no single layer owns: parsing and printing sizes
//! (every command line), and the latency buckets that the pager's fault histogram, the
//! mount's per-operation histograms and the Prometheus exporter agree on.

#![warn(missing_docs)]

pub mod latency;
pub mod size;

pub use latency::{AtomicHistogram, LATENCY_BOUNDS_US};
pub use size::{fmt_size, parse_size};
