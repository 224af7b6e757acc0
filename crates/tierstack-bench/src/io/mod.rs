//! `tierstack bench io`: seed 001's IOR-style sweep of transfer size × MPI ranks, straight
//! into a folder (the parallel file system's) and through a tierstack mount over it, in the
//! same run so that the ratio is measured, not assumed.
//!
//! The ranks are real MPI processes (`mpirun`, see `mpi`) running a small C program
//! (`ior_rank.c`) built at run time with `mpicc`. IOR's method, POSIX API: per repetition,
//! open (create), write `--size-per-rank` bytes in transfers of `--block` bytes, optional
//! fsync, close; barrier; read back what another rank wrote (rank shift 1, IOR's `-C`). A
//! phase's time runs from the earliest open of any rank to the latest close of any rank, and
//! its bandwidth is the aggregate bytes over that time, as IOR computes it; the repetitions
//! give max, min, mean and (population) standard deviation.
//!
//! The mount is made, drained and unmounted through the CLI contract only (`tierstack mount`,
//! `drain --wait`, `status --json`, `umount`), with the checkpoint benchmark's helpers. Its
//! backing folder is a fresh subfolder of `--target`, so both runs write to the same file
//! system. After each point the time until the drain left nothing dirty is recorded: what the
//! job sees (its bandwidth) against when the data is safe in the backing.
//!
//! - `mpi`: finding MPI, building the rank program, bounded `mpirun`;
//! - `plot`: the heat maps of `--plot`;
//! - `report`: the IOR summary table, the grid tables, CSV, and parsing the summary back;
//! - here: configuration, the sweep, the arithmetic.

pub(crate) mod mpi;
pub use mpi::Launcher;
mod plot;
mod report;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tierstack_common::{io_err, PathIoError};

use crate::checkpoint::mounted::{MountOpts, Mounted};
use crate::checkpoint::CheckpointError;
use crate::BenchError;

pub use mpi::{find as find_mpi, Mpi, RANK_SOURCE};
pub use plot::plot_io;
pub use report::{parse_summary, render, render_csv, render_summary, SummaryLine};

/// What can go wrong in `bench io`; every message names the problem and the fix.
#[derive(Debug, thiserror::Error)]
pub enum IoBenchError {
    /// Bad input or an environment that cannot run the benchmark.
    #[error("{0}")]
    Setup(String),
    /// MPI is missing, did not build the rank program, or a run failed.
    #[error("{0}")]
    Mpi(String),
    /// An I/O call failed on a path: `cannot {what} {path}: {error}`.
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// The tierstack mount (mount, drain, umount) failed.
    #[error("{0}")]
    Mount(#[from] CheckpointError),
    /// The caller asked to stop (Ctrl-C).
    #[error("interrupted: the mount and the files the benchmark made were removed")]
    Cancelled,
}

type Result<T> = std::result::Result<T, IoBenchError>;

/// How to run the sweep.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `tierstack` binary (for `mount`, `drain`, `status`, `umount`).
    pub exe: PathBuf,
    /// Rank counts of the sweep.
    pub ranks: Vec<usize>,
    /// Transfer sizes of the sweep (IOR's `-t`).
    pub blocks: Vec<u64>,
    /// Bytes each rank writes (IOR's `-b` with one segment).
    pub size_per_rank: u64,
    /// fsync each file before closing it (IOR's `-e`).
    pub fsync: bool,
    /// One shared file (segmented) instead of a file per process.
    pub shared: bool,
    /// Random transfer offsets within each rank's range (IOR's `-z`).
    pub random: bool,
    /// Repetitions of each point (1 to 1000).
    pub reps: usize,
    /// The plain folder (e.g. on the parallel file system).
    pub target: PathBuf,
    /// Also run through a tierstack mount whose backing is a subfolder of `target`.
    pub mount: bool,
    /// Only the mount (no plain run).
    pub mount_only: bool,
    /// Work folder: the rank program, the mount point, the mount's fast tier.
    pub dir: PathBuf,
    /// `tierstack mount --mode`.
    pub mode: Option<String>,
    /// `tierstack mount --transport` (None: the mount's default).
    pub transport: Option<String>,
    /// `tierstack mount --dram`.
    pub dram: Option<String>,
    /// Check every byte read against what its writer wrote.
    pub verify: bool,
    /// Drop the reader's file from the page cache before the read phase
    /// (posix_fadvise DONTNEED), so that one node's reads reach the storage.
    pub drop_cache: bool,
    /// Limit for one `mpirun` (all repetitions of one point).
    pub timeout: Duration,
    /// How the ranks are started.
    pub launcher: mpi::Launcher,
}

/// One rank's timestamps for one phase (seconds on rank 0's monotonic clock).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RankTimes {
    /// When the rank began to open its file.
    pub open_start: f64,
    /// When the open returned.
    pub open_end: f64,
    /// When the last transfer returned (before any fsync).
    pub xfer_end: f64,
    /// When the close returned (after the fsync, if any).
    pub close_end: f64,
    /// Bytes the rank wrote or read in the phase.
    pub bytes: u64,
    /// Transfers read that came up short or, with verify, differ from what was written (0 for
    /// writes).
    pub errors: u64,
}

/// One line of the rank program: a phase of one repetition, every rank's times.
#[derive(Debug, Clone, Deserialize)]
pub struct PhaseLine {
    /// Number of the repetition, from 0.
    pub rep: usize,
    /// `write` or `read`.
    pub op: String,
    /// Each rank's `[open_start, open_end, xfer_end, close_end, bytes, errors]`, by rank.
    pub ranks: Vec<[f64; 6]>,
}

impl PhaseLine {
    /// The ranks' entries as [`RankTimes`].
    pub fn times(&self) -> Vec<RankTimes> {
        self.ranks
            .iter()
            .map(|a| RankTimes {
                open_start: a[0],
                open_end: a[1],
                xfer_end: a[2],
                close_end: a[3],
                bytes: a[4] as u64,
                errors: a[5] as u64,
            })
            .collect()
    }
}

/// IOR's phase time and aggregate bytes: from the earliest open start of any rank to the
/// latest close end of any rank.
pub fn phase_time(ranks: &[RankTimes]) -> (f64, u64) {
    let start = ranks
        .iter()
        .map(|r| r.open_start)
        .fold(f64::INFINITY, f64::min);
    let end = ranks
        .iter()
        .map(|r| r.close_end)
        .fold(f64::NEG_INFINITY, f64::max);
    let bytes = ranks.iter().map(|r| r.bytes).sum();
    ((end - start).max(0.0), bytes)
}

/// Max, min, mean and population standard deviation (IOR divides by the count).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Highest value.
    pub max: f64,
    /// Lowest value.
    pub min: f64,
    /// Mean value.
    pub mean: f64,
    /// Population standard deviation.
    pub stddev: f64,
}

/// IOR's summary statistics of `v` (all zero when `v` is empty).
pub fn stats(v: &[f64]) -> Stats {
    if v.is_empty() {
        return Stats {
            max: 0.0,
            min: 0.0,
            mean: 0.0,
            stddev: 0.0,
        };
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    Stats {
        max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        min: v.iter().copied().fold(f64::INFINITY, f64::min),
        mean,
        stddev: var.sqrt(),
    }
}

const MIB: f64 = 1048576.0;

/// A size as the options take it: `128K`, `16M`, `1G`, or bytes.
pub fn short_size(b: u64) -> String {
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{}G", b >> 30)
    } else if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{}K", b >> 10)
    } else {
        format!("{b}")
    }
}

/// One point of the sweep on one target: IOR's summary figures for write and read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// `plain` (the folder) or `mount` (through tierstack).
    pub target: String,
    /// Number of MPI ranks.
    pub ranks: usize,
    /// Transfer size in bytes (IOR's xsize).
    pub block: u64,
    /// I/O interface of the rank program: always `POSIX`.
    pub api: String,
    /// Each rank has a file of its own (else one shared file).
    pub file_per_process: bool,
    /// Transfers at random offsets within each rank's range.
    pub random: bool,
    /// Each file was fsynced before its close.
    pub fsync: bool,
    /// Bytes each rank writes and reads back.
    pub size_per_rank: u64,
    /// Bytes of one phase, all ranks.
    pub aggregate_bytes: u64,
    /// Repetitions of the point.
    pub reps: usize,
    /// IOR's Test# (the point's number in the sweep).
    pub test_id: usize,
    /// Mean over the repetitions, MiB/s (IOR's Mean(MiB)).
    pub write_mibps: f64,
    /// Read bandwidth, mean over the repetitions, MiB/s.
    pub read_mibps: f64,
    /// Transfers per second, mean (IOR's Mean(OPs)).
    pub write_ops: f64,
    /// Reads per second, mean over the repetitions.
    pub read_ops: f64,
    /// Write bandwidth over the repetitions, MiB/s.
    pub write_mib: Stats,
    /// Read bandwidth over the repetitions, MiB/s.
    pub read_mib: Stats,
    /// Writes per second over the repetitions.
    pub write_ops_stats: Stats,
    /// Reads per second over the repetitions.
    pub read_ops_stats: Stats,
    /// Each repetition's phase time, seconds.
    pub write_s: Vec<f64>,
    /// Each repetition's read phase time, seconds.
    pub read_s: Vec<f64>,
    /// Transfers read that differ from what was written (with --verify) or came up short.
    pub read_errors: u64,
    /// Mount rows: from the end of the ranks until nothing was dirty (data safe in the
    /// backing folder).
    pub drain_seconds: Option<f64>,
}

impl Row {
    /// Builds a row from the rank program's phase lines.
    pub fn from_phases(base: RowBase, lines: &[PhaseLine]) -> std::result::Result<Row, BenchError> {
        let mut w = Vec::new();
        let mut r = Vec::new();
        let mut errors = 0;
        let mut agg = 0;
        for l in lines {
            let t = l.times();
            if t.len() != base.ranks {
                return Err(BenchError::RankCount {
                    got: t.len(),
                    ranks: base.ranks,
                });
            }
            let (secs, bytes) = phase_time(&t);
            agg = bytes;
            match l.op.as_str() {
                "write" => w.push(secs),
                "read" => {
                    r.push(secs);
                    errors += t.iter().map(|x| x.errors).sum::<u64>();
                }
                o => return Err(BenchError::UnknownPhase(o.to_string())),
            }
        }
        if w.len() != base.reps || r.len() != base.reps {
            return Err(BenchError::PhaseCount {
                writes: w.len(),
                reads: r.len(),
                reps: base.reps,
            });
        }
        let bw = |v: &[f64]| -> Vec<f64> {
            v.iter()
                .map(|s| if *s > 0.0 { agg as f64 / MIB / s } else { 0.0 })
                .collect()
        };
        let ops = |v: &[f64]| -> Vec<f64> {
            v.iter()
                .map(|s| {
                    if *s > 0.0 {
                        agg as f64 / base.block as f64 / s
                    } else {
                        0.0
                    }
                })
                .collect()
        };
        let write_mib = stats(&bw(&w));
        let read_mib = stats(&bw(&r));
        let write_ops_stats = stats(&ops(&w));
        let read_ops_stats = stats(&ops(&r));
        Ok(Row {
            target: base.target,
            ranks: base.ranks,
            block: base.block,
            api: "POSIX".into(),
            file_per_process: base.file_per_process,
            random: base.random,
            fsync: base.fsync,
            size_per_rank: base.size_per_rank,
            aggregate_bytes: agg,
            reps: base.reps,
            test_id: base.test_id,
            write_mibps: write_mib.mean,
            read_mibps: read_mib.mean,
            write_ops: write_ops_stats.mean,
            read_ops: read_ops_stats.mean,
            write_mib,
            read_mib,
            write_ops_stats,
            read_ops_stats,
            write_s: w,
            read_s: r,
            read_errors: errors,
            drain_seconds: None,
        })
    }
}

/// The parameters of a row that do not come from the measurement.
#[derive(Debug, Clone)]
pub struct RowBase {
    /// `plain` or `mount`.
    pub target: String,
    /// Number of MPI ranks.
    pub ranks: usize,
    /// Transfer size in bytes.
    pub block: u64,
    /// Each rank has a file of its own.
    pub file_per_process: bool,
    /// Random transfer offsets.
    pub random: bool,
    /// fsync before close.
    pub fsync: bool,
    /// Bytes each rank writes.
    pub size_per_rank: u64,
    /// Repetitions of the point.
    pub reps: usize,
    /// The point's number in the sweep.
    pub test_id: usize,
}

/// Parses the rank program's `IORANK {...}` lines.
pub fn parse_phase_lines(stdout: &str) -> std::result::Result<Vec<PhaseLine>, BenchError> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("IORANK "))
        .map(|j| {
            serde_json::from_str::<PhaseLine>(j).map_err(|source| BenchError::BadRankLine {
                line: j.to_string(),
                source,
            })
        })
        .collect()
}

/// mount / plain for one point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ratio {
    /// Number of MPI ranks.
    pub ranks: usize,
    /// Transfer size in bytes.
    pub block: u64,
    /// Mount write bandwidth / plain write bandwidth (0 when the plain one is 0).
    pub write: f64,
    /// Mount read bandwidth / plain read bandwidth (0 when the plain one is 0).
    pub read: f64,
}

/// Where and on what the benchmark ran.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Host {
    /// The machine's host name.
    pub hostname: String,
    /// CPUs available to the benchmark process.
    pub cpus: usize,
    /// First line of `mpirun --version`.
    pub mpi: String,
    /// How the ranks were started (`mpirun` or `srun`).
    #[serde(default)]
    pub launcher: mpi::Launcher,
    /// Kernel release (`uname -r`).
    pub kernel: String,
}

/// The sweep's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Every point's figures: the plain rows first, then the mount's, each in sweep order.
    pub rows: Vec<Row>,
    /// Where and on what the sweep ran.
    pub host: Host,
    /// Sum of the mount rows' drain times (None without --mount).
    pub drain_seconds: Option<f64>,
    /// mount / plain per point (with both targets).
    pub ratios: Vec<Ratio>,
    /// The `--target` folder, resolved to an absolute path.
    pub target: String,
    /// The mount's mode, as the mount reported it or as asked for (None without --mount).
    pub mount_mode: Option<String>,
    /// Bytes of its fast tier the new mount conditioned before the first point (its file
    /// drives written once while idle), and the seconds that took (None without --mount).
    #[serde(default)]
    pub mount_conditioned: Option<(u64, f64)>,
    /// How the mount's requests reached its daemon ("io_uring", "/dev/fuse"; None without
    /// --mount).
    #[serde(default)]
    pub mount_transport: Option<String>,
    /// Bytes each rank writes.
    pub size_per_rank: u64,
    /// Each rank had a file of its own (else one shared file).
    pub file_per_process: bool,
    /// Each file was fsynced before its close.
    pub fsync: bool,
    /// Transfers at random offsets.
    pub random: bool,
    /// Repetitions of each point.
    pub reps: usize,
    /// The reader's file was dropped from the page cache before each read phase.
    pub drop_cache: bool,
    /// Every byte read was checked against what was written.
    pub verify: bool,
}

/// Progress of the sweep: runs done, runs in all, what runs now.
pub type Progress<'a> = &'a (dyn Fn(usize, usize, &str) + Sync);

/// Everything set up; torn down (mount, run folders, work folder) on drop.
struct Env {
    mount: Option<Mounted>,
    work: Option<PathBuf>,
    made: Vec<PathBuf>,
}

impl Env {
    fn close(&mut self) -> Result<()> {
        let mut first: Option<IoBenchError> = None;
        if let Some(mut m) = self.mount.take() {
            if let Err(e) = m.close() {
                first.get_or_insert(e.into());
            }
        }
        for d in self.made.drain(..) {
            if let Err(e) = fs::remove_dir_all(&d) {
                if e.kind() != io::ErrorKind::NotFound {
                    first.get_or_insert(io_err("remove", &d)(e).into());
                }
            }
        }
        if let Some(w) = self.work.take() {
            if let Err(e) = crate::checkpoint::cmd::remove_work_folder(&w) {
                first.get_or_insert(IoBenchError::Setup(e.to_string()));
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

fn host(mpi: &Mpi) -> Host {
    let read = |p: &str| {
        fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    Host {
        hostname: read("/proc/sys/kernel/hostname"),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        mpi: mpi.version.clone(),
        launcher: mpi.launcher,
        kernel: read("/proc/sys/kernel/osrelease"),
    }
}

fn check(cfg: &Config) -> Result<()> {
    let bad = |m: String| Err(IoBenchError::Setup(m));
    if cfg.ranks.is_empty() || cfg.ranks.iter().any(|&r| r == 0 || r > 4096) {
        return bad(format!(
            "--ranks {:?} is out of range: give rank counts from 1 to 4096, e.g. --ranks 2,4,8",
            cfg.ranks
        ));
    }
    if cfg.blocks.is_empty() || cfg.blocks.contains(&0) {
        return bad("--block needs sizes above 0, e.g. --block 128K,1M,16M".into());
    }
    for &b in &cfg.blocks {
        if cfg.size_per_rank == 0 || !cfg.size_per_rank.is_multiple_of(b) {
            return bad(format!(
                "--size-per-rank {} is not a multiple of --block {}: each rank writes whole transfers; give e.g. --size-per-rank {}",
                short_size(cfg.size_per_rank),
                short_size(b),
                short_size(b * (cfg.size_per_rank / b).max(1))
            ));
        }
    }
    if cfg.reps == 0 || cfg.reps > 1000 {
        return bad(format!(
            "--reps {} is out of range: use 1 to 1000",
            cfg.reps
        ));
    }
    if !cfg.target.is_dir() {
        return bad(format!(
            "--target {} is not a directory: create it or give an existing folder (e.g. on the parallel file system)",
            cfg.target.display()
        ));
    }
    if cfg.mount_only && !cfg.mount {
        return bad("--mount-only needs --mount".into());
    }
    if cfg.mount && !Path::new("/dev/fuse").exists() {
        return bad(
            "--mount needs FUSE and /dev/fuse is missing: load the fuse module (modprobe fuse) or leave out --mount".into(),
        );
    }
    Ok(())
}

fn mkdir(p: &Path) -> Result<()> {
    Ok(fs::create_dir(p).map_err(io_err("create", p))?)
}

/// Runs the sweep. `cancel` (Ctrl-C) stops it; everything set up is torn down whatever happens.
pub fn run(cfg: &Config, cancel: &AtomicBool, progress: Progress) -> Result<Report> {
    check(cfg)?;
    let mpi = mpi::find(cfg.launcher)?;
    fs::create_dir_all(&cfg.dir).map_err(io_err("create", &cfg.dir))?;
    let dir = fs::canonicalize(&cfg.dir).map_err(io_err("resolve", &cfg.dir))?;
    let target = fs::canonicalize(&cfg.target).map_err(io_err("resolve", &cfg.target))?;
    let pid = std::process::id();
    let work = dir.join(format!("tierstack-io-{pid}"));
    mkdir(&work)?;
    let mut env = Env {
        mount: None,
        work: Some(work.clone()),
        made: Vec::new(),
    };
    let rank_exe = mpi.build_rank(&work)?;
    let plain_root = target.join(format!("tierstack-io-{pid}-plain"));
    let mut targets: Vec<(&str, PathBuf)> = Vec::new();
    if !cfg.mount_only {
        mkdir(&plain_root)?;
        env.made.push(plain_root.clone());
        targets.push(("plain", plain_root.clone()));
    }
    let mut mount_mode = None;
    let mut mount_conditioned = None;
    let mut mount_transport = None;
    if cfg.mount {
        let backing = target.join(format!("tierstack-io-{pid}-mount"));
        mkdir(&backing)?;
        env.made.push(backing.clone());
        let mnt = work.join("mnt");
        let fast = work.join("fast");
        mkdir(&mnt)?;
        mkdir(&fast)?;
        let m = Mounted::mount(
            &cfg.exe,
            &backing,
            &mnt,
            &fast,
            MountOpts {
                dram: cfg.dram.as_deref(),
                mode: cfg.mode.as_deref(),
                vram: None,
                transport: cfg.transport.as_deref(),
            },
            cancel,
        )?;
        mount_mode = m.mode.clone().or_else(|| cfg.mode.clone());
        mount_conditioned = Some(m.conditioned);
        mount_transport = m.transport.clone();
        env.mount = Some(m);
        targets.push(("mount", mnt));
    }
    let total = cfg.ranks.len() * cfg.blocks.len() * targets.len();
    let total_bytes_max = cfg.ranks.iter().max().copied().unwrap_or(1) as u64 * cfg.size_per_rank;
    let drain_timeout = Duration::from_secs(600 + total_bytes_max / 10_000_000);
    let mut rows = Vec::new();
    let mut done = 0;
    let mut test_id = 0;
    for &block in &cfg.blocks {
        for &ranks in &cfg.ranks {
            // The targets of one point run back to back, so both see the machine alike.
            for (name, root) in &targets {
                if cancel.load(Ordering::Relaxed) {
                    return Err(IoBenchError::Cancelled);
                }
                progress(
                    done,
                    total,
                    &format!("{name}: {ranks} ranks, {}", short_size(block)),
                );
                let point = root.join(format!("t{test_id}"));
                mkdir(&point)?;
                let args: Vec<String> = [
                    ("--dir", point.to_string_lossy().into_owned()),
                    ("--xfer", block.to_string()),
                    ("--size", cfg.size_per_rank.to_string()),
                    ("--fsync", (cfg.fsync as u8).to_string()),
                    ("--shared", (cfg.shared as u8).to_string()),
                    ("--random", (cfg.random as u8).to_string()),
                    ("--reps", cfg.reps.to_string()),
                    ("--verify", (cfg.verify as u8).to_string()),
                    ("--drop-cache", (cfg.drop_cache as u8).to_string()),
                    ("--timeout", cfg.timeout.as_secs().to_string()),
                    ("--seed", test_id.to_string()),
                ]
                .into_iter()
                .flat_map(|(k, v)| [k.to_string(), v])
                .collect();
                let what = format!("{} of {ranks} ranks (bench io, {name})", mpi.launcher);
                let out = mpi::run_bounded(
                    &mut mpi.command(ranks, &rank_exe, &args),
                    &what,
                    Some(cancel),
                    cfg.timeout + Duration::from_secs(60),
                )?;
                if !out.ok {
                    return Err(IoBenchError::Mpi(format!(
                        "{what} failed on {}: {}",
                        point.display(),
                        out.last_err_line()
                    )));
                }
                let lines =
                    parse_phase_lines(&out.stdout).map_err(|e| IoBenchError::Mpi(e.to_string()))?;
                let base = RowBase {
                    target: name.to_string(),
                    ranks,
                    block,
                    file_per_process: !cfg.shared,
                    random: cfg.random,
                    fsync: cfg.fsync,
                    size_per_rank: cfg.size_per_rank,
                    reps: cfg.reps,
                    test_id,
                };
                let mut row = Row::from_phases(base, &lines)
                    .map_err(|m| IoBenchError::Mpi(format!("{what}: {m}")))?;
                if *name == "mount" {
                    if let Some(m) = &env.mount {
                        let t = Instant::now();
                        m.drain_wait(cancel, drain_timeout)?;
                        row.drain_seconds = Some(t.elapsed().as_secs_f64());
                    }
                }
                // Room for the next point (not timed).
                fs::remove_dir_all(&point).map_err(io_err("remove", &point))?;
                rows.push(row);
                done += 1;
            }
            test_id += 1;
        }
    }
    progress(done, total, "done");
    env.close()?;
    let ratios = if cfg.mount && !cfg.mount_only {
        rows.iter()
            .filter(|r| r.target == "mount")
            .filter_map(|m| {
                rows.iter()
                    .find(|p| p.target == "plain" && p.ranks == m.ranks && p.block == m.block)
                    .map(|p| Ratio {
                        ranks: m.ranks,
                        block: m.block,
                        write: if p.write_mibps > 0.0 {
                            m.write_mibps / p.write_mibps
                        } else {
                            0.0
                        },
                        read: if p.read_mibps > 0.0 {
                            m.read_mibps / p.read_mibps
                        } else {
                            0.0
                        },
                    })
            })
            .collect()
    } else {
        Vec::new()
    };
    // Plain rows first, then the mount's, each in sweep order.
    rows.sort_by_key(|r| (r.target != "plain", r.test_id));
    let drain_seconds = cfg
        .mount
        .then(|| rows.iter().filter_map(|r| r.drain_seconds).sum::<f64>());
    Ok(Report {
        rows,
        host: host(&mpi),
        drain_seconds,
        ratios,
        target: target.display().to_string(),
        mount_mode,
        mount_conditioned,
        mount_transport,
        size_per_rank: cfg.size_per_rank,
        file_per_process: !cfg.shared,
        fsync: cfg.fsync,
        random: cfg.random,
        reps: cfg.reps,
        drop_cache: cfg.drop_cache,
        verify: cfg.verify,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(open_start: f64, close_end: f64, bytes: u64) -> RankTimes {
        RankTimes {
            open_start,
            open_end: open_start,
            xfer_end: close_end,
            close_end,
            bytes,
            errors: 0,
        }
    }

    #[test]
    fn bandwidth_is_aggregate_bytes_over_earliest_start_to_slowest_end() {
        // Hand-computed: 2 ranks of 64 MiB; rank 0 from 10.0 to 11.0 s, rank 1 from 10.5 to
        // 12.0 s: 128 MiB over 2.0 s = 64 MiB/s (not the mean of the ranks' own rates).
        let r = [t(10.0, 11.0, 64 << 20), t(10.5, 12.0, 64 << 20)];
        let (s, b) = phase_time(&r);
        assert!((s - 2.0).abs() < 1e-12);
        assert_eq!(b, 128 << 20);
        let line = |op: &str, a: &[RankTimes]| PhaseLine {
            rep: 0,
            op: op.into(),
            ranks: a
                .iter()
                .map(|x| {
                    [
                        x.open_start,
                        x.open_end,
                        x.xfer_end,
                        x.close_end,
                        x.bytes as f64,
                        0.0,
                    ]
                })
                .collect(),
        };
        // Second repetition: 4 s write, 1 s read.
        let r2 = [t(0.0, 4.0, 64 << 20), t(0.0, 3.0, 64 << 20)];
        let rd = [t(0.0, 1.0, 64 << 20), t(0.2, 0.5, 64 << 20)];
        let lines = vec![
            line("write", &r),
            line("read", &rd),
            line("write", &r2),
            line("read", &rd),
        ];
        let base = RowBase {
            target: "plain".into(),
            ranks: 2,
            block: 1 << 20,
            file_per_process: true,
            random: false,
            fsync: true,
            size_per_rank: 64 << 20,
            reps: 2,
            test_id: 0,
        };
        let row = Row::from_phases(base, &lines).unwrap();
        // Write: 64 and 32 MiB/s: max 64, min 32, mean 48, population stddev 16.
        assert_eq!(row.write_mib.max, 64.0);
        assert_eq!(row.write_mib.min, 32.0);
        assert_eq!(row.write_mibps, 48.0);
        assert_eq!(row.write_mib.stddev, 16.0);
        // 1 MiB transfers: OPs = MiB/s here.
        assert_eq!(row.write_ops, 48.0);
        assert_eq!(row.read_mibps, 128.0);
        assert_eq!(row.read_mib.stddev, 0.0);
        assert_eq!(row.write_s, vec![2.0, 4.0]);
        assert_eq!(row.aggregate_bytes, 128 << 20);
    }

    #[test]
    fn phase_lines_parse_and_are_checked() {
        let out = "noise\nIORANK {\"rep\":0,\"op\":\"write\",\"ranks\":[[1.0,1.1,1.5,2.0,4096,0]]}\nIORANK {\"rep\":0,\"op\":\"read\",\"ranks\":[[3.0,3.1,3.2,3.5,4096,1]]}\n";
        let l = parse_phase_lines(out).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[1].times()[0].errors, 1);
        let base = RowBase {
            target: "mount".into(),
            ranks: 1,
            block: 4096,
            file_per_process: true,
            random: true,
            fsync: false,
            size_per_rank: 4096,
            reps: 1,
            test_id: 3,
        };
        let row = Row::from_phases(base.clone(), &l).unwrap();
        assert_eq!(row.read_errors, 1);
        assert_eq!(row.write_s, vec![1.0]);
        assert!(Row::from_phases(
            RowBase {
                reps: 2,
                ..base.clone()
            },
            &l
        )
        .is_err());
        assert!(Row::from_phases(RowBase { ranks: 2, ..base }, &l).is_err());
        assert!(parse_phase_lines("IORANK {bad").is_err());
    }

    #[test]
    fn stats_match_ior() {
        let s = stats(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!((s.max, s.min, s.mean), (4.0, 1.0, 2.5));
        assert!((s.stddev - 1.25f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn bad_input_is_one_line_naming_the_fix() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            exe: "tierstack".into(),
            ranks: vec![2],
            blocks: vec![3 << 20],
            size_per_rank: 4 << 20,
            fsync: false,
            shared: false,
            random: false,
            reps: 1,
            target: d.path().to_path_buf(),
            mount: false,
            mount_only: false,
            dir: d.path().to_path_buf(),
            mode: None,
            transport: None,
            dram: None,
            verify: false,
            drop_cache: false,
            timeout: Duration::from_secs(60),
            launcher: mpi::Launcher::Mpirun,
        };
        let e = check(&cfg).unwrap_err().to_string();
        assert!(
            e.contains("not a multiple of --block") && !e.contains('\n'),
            "{e}"
        );
        let e = check(&Config {
            ranks: vec![0],
            ..cfg.clone()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("--ranks"), "{e}");
        let e = check(&Config {
            target: d.path().join("nope"),
            blocks: vec![1 << 20],
            ..cfg
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("is not a directory"), "{e}");
    }
}
