//! [`BenchError`]: what can go wrong in `bench mem`, the PNG plots (`bench mem --plot`,
//! `bench io --plot`), reading the rank program's and IOR's output, and removing a benchmark's
//! work folder. Every message is one line that names the problem (and, where there is one,
//! the fix); the CLI prints it as it is.
//!
//! `bench array` has its own [`crate::array::ArrayBenchError`], the checkpoint benchmark
//! [`crate::checkpoint::CheckpointError`] and `bench io` [`crate::io::IoBenchError`].

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

use tierstack_common::PathIoError;

/// What can go wrong in `bench mem`, the plots and the parsers of benchmark output.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// `--pattern` is not one of the access patterns.
    #[error("unknown pattern '{0}': use uniform, linear, zipf or butterfly")]
    UnknownPattern(String),
    /// `--fill` is not one of the page fills.
    #[error("unknown fill '{0}': use one-word, random or floats")]
    UnknownFill(String),
    /// `--engine` is not one of the memory engines.
    #[error("unknown engine '{0}': use tierstack, tierstack-dram, kernel-swap or dram")]
    UnknownEngine(String),
    /// The RAID level number of the tierstack engine is not a level.
    #[error("unknown RAID level {0}")]
    UnknownLevel(u32),
    /// An I/O call failed on a path: `cannot {what} {path}: {error}`.
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// Creating, writing or syncing the kernel-swap engine's swap file failed.
    #[error("cannot {what} swap file: {source}")]
    SwapFile {
        /// What was being done (`create`, `write` or `sync`).
        what: &'static str,
        /// The error of the call.
        #[source]
        source: io::Error,
    },
    /// Setting the memory limit of the kernel-swap engine's cgroup failed.
    #[error("cannot set {file}: {source}")]
    CgroupLimit {
        /// The limit file (`memory.limit_in_bytes` or `memory.max`).
        file: &'static str,
        /// The error of the write.
        #[source]
        source: io::Error,
    },
    /// The kernel-swap engine was asked for without root.
    #[error("the kernel-swap engine needs root (swapon and a memory cgroup): run as root or use --engine dram")]
    NeedsRoot,
    /// Neither a v1 nor a v2 memory cgroup is there for the kernel-swap engine.
    #[error("no memory cgroup (v1 or v2) found under /sys/fs/cgroup")]
    NoMemoryCgroup,
    /// A command the benchmark runs (mkswap, swapon) could not be started.
    #[error("{what}: {source}")]
    CommandStart {
        /// The command.
        what: String,
        /// Why it could not be started.
        #[source]
        source: io::Error,
    },
    /// A command the benchmark runs (mkswap, swapon) failed.
    #[error("{what} failed: {stderr}")]
    CommandFailed {
        /// The command.
        what: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// The tierstack engine's store could not be made.
    #[error("{0}")]
    Store(#[from] tierstack_store::StoreError),
    /// The tierstack engine's array, store or userfaultfd region could not be made.
    #[error("{0}")]
    Mem(#[from] tierstack_mem::MemError),
    /// The worker's spec could not be written as JSON.
    #[error("{0}")]
    Spec(#[source] serde_json::Error),
    /// The worker process could not be started.
    #[error("cannot start the worker: {0}")]
    WorkerStart(#[source] io::Error),
    /// Waiting for the worker process failed.
    #[error("worker: {0}")]
    WorkerWait(#[source] io::Error),
    /// Ctrl-C or SIGTERM: the run stopped, its worker was killed, and what it set up is put
    /// back on the way out.
    #[error("cancelled (Ctrl-C or SIGTERM): the worker was stopped; the swap file, the cgroup and the zswap switch are put back")]
    Cancelled,
    /// The worker made no progress within its allowance and was stopped.
    #[error("the worker made no progress and was stopped (swap full? other processes may be using the swap file too): give --dir more free space or a larger --dram")]
    WorkerStuck,
    /// The worker ended without a word on its standard error (usually killed for memory).
    #[error("the worker died ({0}): was it killed for memory?")]
    WorkerDied(ExitStatus),
    /// The worker failed.
    #[error("the worker failed: {0}")]
    WorkerFailed(String),
    /// `bench mem` was given `--` with no program after it.
    #[error("no program after `--`: give one, e.g. `-- python3 sim.py`")]
    NoProgram,
    /// The measured program ran past its bound and was stopped.
    #[error("the program ran longer than {seconds} s under {engine} and was stopped: give a larger --timeout or a smaller problem")]
    ProgramTimeout {
        /// The engine it ran under.
        engine: String,
        /// The bound.
        seconds: u64,
    },
    /// Kernel swap could not give the program memory: its cgroup stayed in the OOM state
    /// (where the OOM killer would end it), and it was stopped.
    #[error("the program ran out of memory under {engine} after {seconds} s (its cgroup stayed in the OOM state: the kernel could not swap fast enough, the OOM killer would have ended it)")]
    ProgramOutOfMemory {
        /// The engine it ran under.
        engine: String,
        /// When it was stopped, seconds after its start.
        seconds: u64,
    },
    /// The measured program exited with a failure.
    #[error("the program exited with status {exit} under {engine}: {stderr}")]
    ProgramFailed {
        /// The engine it ran under.
        engine: String,
        /// Its exit status (128 + signal when killed).
        exit: i32,
        /// The end of its standard error.
        stderr: String,
    },
    /// The worker's report is not JSON of a report.
    #[error("worker output: {0}")]
    WorkerOutput(#[source] serde_json::Error),
    /// `TIERSTACK_FONT` names a file that is not a TrueType font.
    #[error("TIERSTACK_FONT={} is not a TrueType font", .0.display())]
    FontNotTrueType(PathBuf),
    /// No TrueType font was found for plot text.
    #[error("no TrueType font for --plot: install fonts-dejavu-core (apt-get install fonts-dejavu-core) or set TIERSTACK_FONT=/path/to/font.ttf")]
    NoFont,
    /// The folder of the plot file does not exist.
    #[error("cannot write the plot to {}: folder {} does not exist", path.display(), folder.display())]
    PlotFolderMissing {
        /// The plot file.
        path: PathBuf,
        /// Its folder.
        folder: PathBuf,
    },
    /// The plot file is a folder.
    #[error("cannot write the plot to {}: it is a folder, give a file name such as mem.png", .0.display())]
    PlotIsFolder(PathBuf),
    /// There is nothing to draw.
    #[error("nothing to plot: {0}")]
    NothingToPlot(&'static str),
    /// plotters could not draw the plot.
    #[error("drawing the plot: {0}")]
    Draw(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The plot could not be encoded as PNG.
    #[error("encoding the plot: {0}")]
    Encode(#[source] png::EncodingError),
    /// The text is not JSON.
    #[error("not bench mem JSON: {0}")]
    NotMemJson(#[source] serde_json::Error),
    /// The JSON holds neither a report nor the `--compare` object.
    #[error("not bench mem JSON: expected a report (with \"bands\") or the --compare object with \"tierstack\" and \"kernel_swap\"")]
    NoMemReport,
    /// An object of the JSON is not a `bench mem` report.
    #[error("not a bench mem report: {0}")]
    NotMemReport(#[source] serde_json::Error),
    /// The rank program printed a line that is not a phase line.
    #[error("the rank program printed a bad line ({source}): {line}")]
    BadRankLine {
        /// The line, without its `IORANK ` prefix.
        line: String,
        /// Why it is not a phase line.
        #[source]
        source: serde_json::Error,
    },
    /// A phase line has a number of ranks other than the run's.
    #[error("the rank program reported {got} ranks for a run of {ranks}")]
    RankCount {
        /// Ranks in the line.
        got: usize,
        /// Ranks of the run.
        ranks: usize,
    },
    /// A phase line has a phase other than `write` and `read`.
    #[error("the rank program reported an unknown phase {0}")]
    UnknownPhase(String),
    /// The phase lines are not one write and one read per repetition.
    #[error(
        "the rank program reported {writes} write and {reads} read phases for {reps} repetitions"
    )]
    PhaseCount {
        /// Write phases reported.
        writes: usize,
        /// Read phases reported.
        reads: usize,
        /// Repetitions of the run.
        reps: usize,
    },
    /// An IOR summary table lacks a column.
    #[error("the summary table has no column {0}")]
    NoColumn(String),
    /// A cell of an IOR summary table is not a number.
    #[error("column {column} of '{line}': {source}")]
    BadColumn {
        /// The column's name.
        column: String,
        /// The table line.
        line: String,
        /// Why the cell is not a number.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A mount is still under a work folder that is to be removed.
    #[error("a mount under {} is still there: unmount it (umount -l) and remove the folder", .0.display())]
    MountLeft(PathBuf),
    /// A work folder could not be removed.
    #[error("cannot remove {}: {source}: remove it by hand once nothing uses it", path.display())]
    RemoveFolder {
        /// The work folder.
        path: PathBuf,
        /// The error of the removal.
        #[source]
        source: io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The messages are the ones the functions gave as `String`s before `BenchError`: users,
    /// scripts and the CLI tests see them.
    #[test]
    fn messages_as_before() {
        let p = Path::new("/tmp/x y");
        let e = || io::Error::from(io::ErrorKind::NotFound);
        let io_text = e().to_string();
        let cases: Vec<(BenchError, String)> = vec![
            (
                BenchError::UnknownPattern("zz".into()),
                "unknown pattern 'zz': use uniform, linear, zipf or butterfly".into(),
            ),
            (
                BenchError::Io(tierstack_common::io_err("join cgroup", p)(e())),
                format!("cannot join cgroup {}: {io_text}", p.display()),
            ),
            (
                BenchError::SwapFile {
                    what: "sync",
                    source: e(),
                },
                format!("cannot sync swap file: {io_text}"),
            ),
            (
                BenchError::CgroupLimit {
                    file: "memory.max",
                    source: e(),
                },
                format!("cannot set memory.max: {io_text}"),
            ),
            (
                BenchError::CommandStart {
                    what: "mkswap".into(),
                    source: e(),
                },
                format!("mkswap: {io_text}"),
            ),
            (
                BenchError::CommandFailed {
                    what: "swapon".into(),
                    stderr: "no".into(),
                },
                "swapon failed: no".into(),
            ),
            (BenchError::UnknownLevel(7), "unknown RAID level 7".into()),
            (
                BenchError::FontNotTrueType(p.into()),
                format!("TIERSTACK_FONT={} is not a TrueType font", p.display()),
            ),
            (
                BenchError::PlotFolderMissing {
                    path: p.join("m.png"),
                    folder: p.into(),
                },
                format!(
                    "cannot write the plot to {}: folder {} does not exist",
                    p.join("m.png").display(),
                    p.display()
                ),
            ),
            (
                BenchError::NothingToPlot("the sweep has no rows"),
                "nothing to plot: the sweep has no rows".into(),
            ),
            (
                BenchError::NoMemReport,
                "not bench mem JSON: expected a report (with \"bands\") or the --compare object with \"tierstack\" and \"kernel_swap\"".into(),
            ),
            (
                BenchError::RankCount { got: 3, ranks: 4 },
                "the rank program reported 3 ranks for a run of 4".into(),
            ),
            (
                BenchError::PhaseCount {
                    writes: 1,
                    reads: 2,
                    reps: 3,
                },
                "the rank program reported 1 write and 2 read phases for 3 repetitions".into(),
            ),
            (
                BenchError::BadColumn {
                    column: "xsize".into(),
                    line: "write 1".into(),
                    source: Box::new("q".parse::<u64>().unwrap_err()),
                },
                format!(
                    "column xsize of 'write 1': {}",
                    "q".parse::<u64>().unwrap_err()
                ),
            ),
            (
                BenchError::MountLeft(p.into()),
                format!(
                    "a mount under {} is still there: unmount it (umount -l) and remove the folder",
                    p.display()
                ),
            ),
            (
                BenchError::RemoveFolder {
                    path: p.into(),
                    source: e(),
                },
                format!(
                    "cannot remove {}: {io_text}: remove it by hand once nothing uses it",
                    p.display()
                ),
            ),
        ];
        for (err, want) in cases {
            assert_eq!(err.to_string(), want);
        }
        let bad = serde_json::from_str::<serde_json::Value>("{bad").unwrap_err();
        let text = bad.to_string();
        assert_eq!(
            BenchError::BadRankLine {
                line: "{bad".into(),
                source: bad,
            }
            .to_string(),
            format!("the rank program printed a bad line ({text}): {{bad")
        );
    }
}
