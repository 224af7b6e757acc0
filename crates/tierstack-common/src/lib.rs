//! What several tierstack crates share and no single layer owns: parsing and printing sizes
//! and durations (every command line and the configuration file), the latency buckets that the pager's fault histogram, the mount's
//! per-operation histograms and the Prometheus exporter agree on, the error of an I/O call on
//! a path, small probes of the machine (mount points, cgroup controllers, whether a process is alive),
//! and the `TIERSTACK_*` environment contract between `run` and the preload shim (`env`).

#![warn(missing_docs)]

pub mod cgroup;
pub mod duration;
pub mod env;
pub mod error;
pub mod file;
pub mod latency;
pub mod mounts;
pub mod process;
pub mod size;
pub mod users;

pub use duration::{fmt_duration, parse_duration, DurationError};
pub use error::{io_err, PathIoError};
pub use latency::{AtomicHistogram, LATENCY_BOUNDS_US};
pub use size::{fmt_size, parse_size, SizeError};
