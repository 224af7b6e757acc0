//! tierstack-node: what serves a node rather than one mount or one run. Below the CLI, above
//! the fronts (fs, mem):
//!
//! - `runs`: the record each `tierstack run` leaves while its program runs, and the pager
//!   counters its processes publish;
//! - `probe`: what /proc and /sys say about a process or a block device;
//! - `top`: `tierstack top`'s model (one look at every tierstack process, a frame of rates,
//!   its text);
//! - `metrics`: the Prometheus families of a mount and a run, and the exporter that
//!   `mount --metrics` and `run --metrics` serve;
//! - `labels`: the `job` and `user` labels of a mount or a run;
//! - `exporter`: `tierstack exporter`, one endpoint for every mount and run of the node.
//!
//! Nothing here prints or parses a command line; the CLI does.

#![warn(missing_docs)]

pub mod exporter;
pub mod footprint;
pub mod labels;
pub mod metrics;
pub mod probe;
pub mod runs;
pub mod top;

/// What the node services can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// A bad value given by the user (the CLI exits with status 2).
    #[error("{0}")]
    Usage(String),
    /// An exporter address that cannot be bound, or its thread cannot start.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, and the fix where there is one.
        what: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The Prometheus registry refused a metric (a programming error: names collide).
    #[error("metrics registry: {0}")]
    Registry(#[from] prometheus::Error),
}

/// The node services' result.
pub type Result<T, E = NodeError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests;
