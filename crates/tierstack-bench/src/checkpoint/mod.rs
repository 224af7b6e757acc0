//! `tierstack bench checkpoint`: seed 004's file-per-process checkpoint experiment.
//!
//! N writer processes each write and fsync one file, started together (see `writer`). The
//! output time runs from their release until the last writer's fsync returned.
//!
//! The experiment runs once straight into BACKING and once through a fresh tierstack mount
//! over a fresh empty subdirectory of BACKING (driven only through the CLI contract:
//! `tierstack mount`, `status --json`, `drain --wait`, `umount`; see `mounted`). The drain time
//! runs from the end of the mount's output phase until `drain --wait` returned and `status`
//! says no byte is dirty. The speedup is direct output time / mount output time (Table 2 of
//! seed 004).
//!
//! `--throttle MB/s` models a congested parallel file system (see `throttle`). `Env` tears
//! everything down (tierstack mount, ext4 mount, loop device, cgroup, image, work folder) on
//! success, on error and on interruption (the caller sets the cancel flag on Ctrl-C).
//!
//! - `writer`: the writer process and one output phase (N writers into one directory);
//! - `cmd`: running commands (timeouts, cancel) and reading the mount table;
//! - `mounted`: the tierstack mount and sampling of its `status`;
//! - `throttle`: the loop-device ext4 file system and the blkio/io cgroup that throttles it;
//! - here: the configuration, the run of the benchmark, its report and table.

pub(crate) mod cmd;
pub(crate) mod mounted;
mod throttle;
mod writer;

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;
use tierstack_common::{io_err, PathIoError};

/// Size of one write of a writer.
pub const BLOCK: usize = 1 << 20;

/// What can go wrong in the checkpoint benchmark.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Bad input or an environment that cannot run the benchmark; names the problem and fix.
    #[error("{0}")]
    Setup(String),
    /// An I/O call failed on a path: `cannot {what} {path}: {error}`.
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// A command that the benchmark runs failed.
    #[error("{what} failed: {msg}")]
    Command {
        /// What failed: a command (e.g. `tierstack status --json`) or a step (`the drain`).
        what: String,
        /// Why it failed.
        msg: String,
    },
    /// A writer process failed.
    #[error("checkpoint writer {index} failed: {msg}")]
    Writer {
        /// Index of the writer, from 0 (its file is `ckpt.` and the index in five digits).
        index: usize,
        /// Why it failed (usually the last line of its stderr).
        msg: String,
    },
    /// The caller asked to stop (Ctrl-C).
    #[error("interrupted: the loop device, mounts, cgroup and files it had set up were removed")]
    Cancelled,
}

type Result<T> = std::result::Result<T, CheckpointError>;

/// Nanoseconds on CLOCK_MONOTONIC (the same clock in every process of the machine).
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

pub use throttle::throttle_available;
pub use writer::{run_phase, run_writer, Phase, WriterReport, WriterSpec};

use cmd::run_cmd;
use mounted::{sample_status, MountOpts, Mounted};
use throttle::{cgroup_kind, CgKind, Throttle};

/// How to run the benchmark.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `tierstack` binary (writers and mount commands).
    pub exe: PathBuf,
    /// Number of writer processes (1 to 4096).
    pub procs: usize,
    /// Bytes each writer writes into its file.
    pub file_size: u64,
    /// BACKING: required without a throttle; with one, where the throttled file system is
    /// mounted (an empty or new directory; default: under the work folder).
    pub backing: Option<PathBuf>,
    /// Folder for the work folder (image, mount point, fast tier).
    pub dir: PathBuf,
    /// Limit of the writes to a throttled backing file system, MB/s (10^6 bytes per second); None:
    /// no throttle, BACKING as given.
    pub throttle_mb_s: Option<f64>,
    /// `tierstack mount --mode` for the mount (None: the mount's default).
    pub mode: Option<String>,
    /// `tierstack mount --dram` for the mount, as the CLI takes it (None: the mount's default).
    pub dram: Option<String>,
    /// `tierstack mount --vram` for the mount (None: no VRAM tier, the mount's default).
    pub vram: Option<String>,
    /// Only the run straight into BACKING, no mount.
    pub direct_only: bool,
    /// Repetitions of the experiment (1 to 100).
    pub repeat: usize,
    /// Tells the user what happens (the demo): the `tierstack status` output once the writers
    /// are done and the drain runs, and the check of BACKING after `umount`.
    pub narrate: Option<fn(&str)>,
}

/// One repetition.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// Number of the repetition, from 1.
    pub run: usize,
    /// Output time straight into BACKING, seconds: from the writers' release to the last fsync.
    pub direct_output_s: f64,
    /// Output time through the tierstack mount, seconds (None with `direct_only`).
    pub mount_output_s: Option<f64>,
    /// Seconds from the end of the mount's output phase until the drain was done (None with
    /// `direct_only`).
    pub drain_s: Option<f64>,
    /// From the first byte drained (seen by sampling `status`) to the end of the drain.
    pub drain_window_s: Option<f64>,
    /// Highest `drain_bytes_per_s` that `status` showed, in MB/s.
    pub drain_peak_mb_s: Option<f64>,
}

/// The benchmark's figures (means over the repetitions).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Number of writer processes.
    pub procs: usize,
    /// Bytes each writer wrote.
    pub file_size: u64,
    /// Bytes written in one output phase, all writers: procs x file_size.
    pub bytes_total: u64,
    /// The throttle asked for, MB/s (10^6 bytes per second).
    pub throttle_mb_s: Option<f64>,
    /// How the throttle was applied (`blkio v1` or `io v2`), if any.
    pub throttle_cgroup: Option<String>,
    /// BACKING, resolved to an absolute path.
    pub backing: String,
    /// ext4 on a loop device mounted -o sync, or "directory as given".
    pub backing_fs: String,
    /// The mount's mode: as asked for, else as the mount reported it, else `default`.
    pub mode: String,
    /// The mount's VRAM tier (`--vram`), if any.
    #[serde(default)]
    pub vram: Option<String>,
    /// Whether only the direct run was made.
    pub direct_only: bool,
    /// Number of repetitions.
    pub repeat: usize,
    /// Mean output time straight into BACKING, seconds.
    pub direct_output_s: f64,
    /// bytes_total / direct_output_s, in MB/s (10^6 bytes per second).
    pub direct_mb_s: f64,
    /// Mean output time through the tierstack mount, seconds.
    pub mount_output_s: Option<f64>,
    /// bytes_total / mount_output_s, in MB/s (10^6 bytes per second).
    pub mount_mb_s: Option<f64>,
    /// Mean seconds from the end of the mount's output phase until the drain was done.
    pub drain_s: Option<f64>,
    /// From the first byte drained to the end of the drain (the drain starts while the
    /// writers still write).
    pub drain_window_s: Option<f64>,
    /// bytes_total / drain_window_s: the rate the drain sustained into BACKING.
    pub drain_mb_s: Option<f64>,
    /// Highest drain rate `status` showed.
    pub drain_peak_mb_s: Option<f64>,
    /// direct_output_s / mount_output_s.
    pub speedup: Option<f64>,
    /// Each repetition's figures.
    pub runs: Vec<RunResult>,
}

/// Everything set up; torn down in order (tierstack mount, throttle, work folder) on drop.
struct Env {
    mount: Option<Mounted>,
    throttle: Option<Throttle>,
    work: Option<PathBuf>,
    /// Run folders made in a BACKING given by the user.
    made: Vec<PathBuf>,
}

impl Env {
    fn close(&mut self) -> Result<()> {
        let mut first = None;
        if let Some(t) = &self.throttle {
            t.relax();
        }
        if let Some(mut m) = self.mount.take() {
            if let Err(e) = m.close() {
                first.get_or_insert(e);
            }
        }
        for d in self.made.drain(..) {
            let _ = fs::remove_dir_all(&d);
        }
        if let Some(mut t) = self.throttle.take() {
            if let Err(e) = t.close() {
                first.get_or_insert(e);
            }
        }
        if let Some(w) = self.work.take() {
            if let Err(e) = cmd::remove_work_folder(&w) {
                first.get_or_insert(CheckpointError::Setup(e.to_string()));
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

fn check_cancel(cancel: &AtomicBool) -> Result<()> {
    if cancel.load(Ordering::Relaxed) {
        Err(CheckpointError::Cancelled)
    } else {
        Ok(())
    }
}

fn mkdir(p: &Path) -> Result<()> {
    Ok(fs::create_dir(p).map_err(io_err("create", p))?)
}

/// Every drained file holds exactly what its writer wrote.
fn verify_drained(dir: &Path, hashes: &[u64]) -> Result<()> {
    let mut buf = vec![0u8; BLOCK];
    for (i, want) in hashes.iter().enumerate() {
        let p = dir.join(format!("ckpt.{i:05}"));
        let mut f = fs::File::open(&p).map_err(io_err("read the drained file", &p))?;
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        loop {
            let n = f
                .read(&mut buf)
                .map_err(io_err("read the drained file", &p))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        if h.digest() != *want {
            return Err(CheckpointError::Command {
                what: "the drain".into(),
                msg: format!(
                    "{} in BACKING differs from what its writer wrote (xxh3 {:016x}, written {want:016x})",
                    p.display(),
                    h.digest()
                ),
            });
        }
    }
    Ok(())
}

/// Bytes of regular files directly in `dir`.
fn dir_bytes(dir: &Path) -> (usize, u64) {
    let mut n = 0;
    let mut b = 0;
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if let Ok(m) = e.metadata() {
                if m.is_file() && e.file_name().to_string_lossy().starts_with("ckpt.") {
                    n += 1;
                    b += m.len();
                }
            }
        }
    }
    (n, b)
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

/// Runs the benchmark. `cancel` (set on Ctrl-C by the caller) stops it; everything set up is
/// torn down whatever happens.
pub fn run(cfg: &Config, cancel: &AtomicBool) -> Result<Report> {
    if cfg.procs == 0 || cfg.procs > 4096 {
        return Err(CheckpointError::Setup(format!(
            "--procs {} is out of range: use 1 to 4096",
            cfg.procs
        )));
    }
    if cfg.file_size == 0 {
        return Err(CheckpointError::Setup(
            "--file-size must be above 0: use e.g. --file-size 16M".into(),
        ));
    }
    if cfg.repeat == 0 || cfg.repeat > 100 {
        return Err(CheckpointError::Setup(format!(
            "--repeat {} is out of range: use 1 to 100",
            cfg.repeat
        )));
    }
    let bytes_per_s = match cfg.throttle_mb_s {
        Some(t) if !(t.is_finite() && t >= 0.01) => {
            return Err(CheckpointError::Setup(format!(
                "--throttle {t} is out of range: give the limit in MB/s (10^6 bytes), e.g. --throttle 100"
            )))
        }
        Some(t) => Some((t * 1e6) as u64),
        None => None,
    };
    let total = cfg.procs as u64 * cfg.file_size;
    if bytes_per_s.is_some() {
        if !rustix::process::geteuid().is_root() {
            return Err(CheckpointError::Setup(
                "--throttle needs root (a loop device, a mount and a blkio cgroup): run as root or leave out --throttle".into(),
            ));
        }
        cgroup_kind()?;
        if let Some(b) = &cfg.backing {
            let non_empty = fs::read_dir(b)
                .map(|mut d| d.next().is_some())
                .unwrap_or(false);
            if non_empty || (b.exists() && !b.is_dir()) {
                return Err(CheckpointError::Setup(format!(
                    "--backing {} is not an empty directory: with --throttle the benchmark mounts a throttled file system there; give an empty or new directory, or leave out --backing",
                    b.display()
                )));
            }
        }
    } else {
        match &cfg.backing {
            None => {
                return Err(CheckpointError::Setup(
                    "--backing is required without --throttle: give the directory to write the checkpoints into (e.g. a folder on the parallel file system)".into(),
                ))
            }
            Some(b) if !b.is_dir() => {
                return Err(CheckpointError::Setup(format!(
                    "--backing {} is not a directory: create it or give an existing one",
                    b.display()
                )))
            }
            Some(_) => {}
        }
    }
    fs::create_dir_all(&cfg.dir).map_err(io_err("create", &cfg.dir))?;
    let dir = fs::canonicalize(&cfg.dir).map_err(io_err("resolve", &cfg.dir))?;
    let pid = std::process::id();
    let work = dir.join(format!("tierstack-ckpt-{pid}"));
    mkdir(&work)?;
    let mut env = Env {
        mount: None,
        throttle: None,
        work: Some(work.clone()),
        made: Vec::new(),
    };
    let backing = match (bytes_per_s, &cfg.backing) {
        (Some(bps), b) => {
            let mp = b.clone().unwrap_or_else(|| work.join("backing"));
            // Both runs' files, file-system overhead and slack.
            let image = total * 2 + total / 8 + (256 << 20);
            env.throttle = Some(Throttle::setup(&work, &mp, image, bps)?);
            fs::canonicalize(&mp).map_err(io_err("resolve", &mp))?
        }
        (None, Some(b)) => fs::canonicalize(b).map_err(io_err("resolve", b))?,
        (None, None) => {
            return Err(CheckpointError::Setup(
                "--backing is required without --throttle".into(),
            ))
        }
    };
    check_cancel(cancel)?;
    let procs_file = env.throttle.as_ref().and_then(|t| t.procs());
    let mut runs = Vec::new();
    let mut mount_mode: Option<String> = None;
    let drain_timeout = Duration::from_secs_f64(
        600.0
            + bytes_per_s
                .map(|b| 4.0 * total as f64 / b as f64)
                .unwrap_or(0.0),
    );
    for r in 0..cfg.repeat {
        let direct_dir = backing.join(format!("ckpt-{pid}-{r}-direct"));
        mkdir(&direct_dir)?;
        env.made.push(direct_dir.clone());
        let direct = run_phase(
            &cfg.exe,
            &direct_dir,
            cfg.procs,
            cfg.file_size,
            procs_file.as_deref(),
            cancel,
        )?;
        let mut res = RunResult {
            run: r + 1,
            direct_output_s: direct.output_s,
            mount_output_s: None,
            drain_s: None,
            drain_window_s: None,
            drain_peak_mb_s: None,
        };
        if !cfg.direct_only {
            check_cancel(cancel)?;
            let sub = backing.join(format!("ckpt-{pid}-{r}-mount"));
            mkdir(&sub)?;
            env.made.push(sub.clone());
            let mnt = work.join(format!("mnt-{r}"));
            let fast = work.join(format!("fast-{r}"));
            mkdir(&mnt)?;
            mkdir(&fast)?;
            let m = Mounted::mount(
                &cfg.exe,
                &sub,
                &mnt,
                &fast,
                MountOpts {
                    dram: cfg.dram.as_deref(),
                    mode: cfg.mode.as_deref(),
                    vram: cfg.vram.as_deref(),
                    transport: None,
                },
                cancel,
            )?;
            let daemon = m.daemon_pid;
            if mount_mode.is_none() {
                mount_mode = m.mode.clone();
            }
            env.mount = Some(m);
            check_cancel(cancel)?;
            if let Some(t) = &env.throttle {
                let pid = daemon.ok_or_else(|| CheckpointError::Command {
                    what: "tierstack status --json".into(),
                    msg: "it names no daemon pid (field `pid`), so the drain cannot be throttled"
                        .into(),
                })?;
                t.add(pid)?;
            }
            // `status` is sampled meanwhile to see when the drain starts and how fast it runs.
            let stop = AtomicBool::new(false);
            let (r, samples) = std::thread::scope(|s| {
                let sampler = s.spawn(|| sample_status(&cfg.exe, &mnt, &stop));
                let r = (|| -> Result<(Phase, u64)> {
                    let phase = run_phase(
                        &cfg.exe,
                        &mnt,
                        cfg.procs,
                        cfg.file_size,
                        procs_file.as_deref(),
                        cancel,
                    )?;
                    if let Some(say) = cfg.narrate {
                        let st = run_cmd(
                            Command::new(&cfg.exe).arg("status").arg(&mnt),
                            "tierstack status",
                            Some(cancel),
                            Duration::from_secs(60),
                        )?;
                        say(&format!(
                            "writers done after {:.2} s; `tierstack status` while the drain runs:\n{}",
                            phase.output_s,
                            st.trim_end()
                        ));
                    }
                    if let Some(m) = &env.mount {
                        m.drain_wait(cancel, drain_timeout)?;
                    }
                    Ok((phase, monotonic_ns()))
                })();
                stop.store(true, Ordering::Relaxed);
                (r, sampler.join().unwrap_or_default())
            });
            let (phase, drained_ns) = r?;
            let drain_s = drained_ns.saturating_sub(phase.end_ns) as f64 / 1e9;
            // The drain started between the last sample with nothing drained and the first
            // with something drained (or, without samples, when the writers started).
            // `status` counts a file as drained when its copy is complete: when the first
            // sample with anything drained already has everything, the drain's start was not
            // seen, and the writers' start is the bound taken (the rate is then a lower bound).
            let first = samples.iter().position(|x| x.drained > 0);
            let drain_start = match first {
                Some(0) | None => phase.start_ns,
                Some(i) if samples[i].drained >= total => phase.start_ns,
                Some(i) => (samples[i - 1].t_ns + samples[i].t_ns) / 2,
            }
            .max(phase.start_ns);
            res.drain_window_s = Some(drained_ns.saturating_sub(drain_start) as f64 / 1e9);
            res.drain_peak_mb_s = samples
                .iter()
                .map(|x| x.rate / 1e6)
                .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
            // `umount` first (it drains whatever is left), then BACKING alone must hold
            // every byte.
            if let Some(mut m) = env.mount.take() {
                m.close()?;
            }
            let (n, b) = dir_bytes(&sub);
            if n == cfg.procs && b == total {
                verify_drained(&sub, &phase.hashes)?;
            }
            if n != cfg.procs || b != total {
                return Err(CheckpointError::Command {
                    what: "the drain".into(),
                    msg: format!(
                        "status said nothing was dirty and umount returned, but BACKING holds {n} of {} files and {b} of {total} bytes",
                        cfg.procs
                    ),
                });
            }
            if let Some(say) = cfg.narrate {
                say(&format!(
                    "after `tierstack umount`: BACKING holds all {n} files, {} bytes, each file's xxh3 equal to what its writer wrote",
                    b
                ));
            }
            let _ = fs::remove_dir_all(&fast);
            let _ = fs::remove_dir(&mnt);
            res.mount_output_s = Some(phase.output_s);
            res.drain_s = Some(drain_s);
        }
        // Room for the next repetition (not timed).
        for d in env.made.drain(..) {
            let _ = fs::remove_dir_all(&d);
        }
        runs.push(res);
    }
    let (backing_fs, throttle_cgroup) = match &env.throttle {
        Some(t) => (
            format!(
                "ext4 on {} ({}) mounted -o sync",
                t.loopdev.as_deref().unwrap_or("?"),
                t.devnum
            ),
            Some(
                match t.kind {
                    CgKind::V1Blkio => "blkio v1 (blkio.throttle.write_bps_device)",
                    CgKind::V2Io => "io v2 (io.max wbps)",
                }
                .to_string(),
            ),
        ),
        None => ("directory as given".to_string(), None),
    };
    env.close()?;
    let direct_output_s = mean(runs.iter().map(|r| r.direct_output_s));
    let mb = |s: f64| if s > 0.0 { total as f64 / 1e6 / s } else { 0.0 };
    let opt_mean = |f: fn(&RunResult) -> Option<f64>| {
        let v: Vec<f64> = runs.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| mean(v.into_iter()))
    };
    let mount_output_s = opt_mean(|r| r.mount_output_s);
    let drain_s = opt_mean(|r| r.drain_s);
    let drain_window_s = opt_mean(|r| r.drain_window_s);
    let drain_peak_mb_s = runs
        .iter()
        .filter_map(|r| r.drain_peak_mb_s)
        .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
    Ok(Report {
        procs: cfg.procs,
        file_size: cfg.file_size,
        bytes_total: total,
        throttle_mb_s: cfg.throttle_mb_s,
        throttle_cgroup,
        backing: backing.display().to_string(),
        backing_fs,
        mode: cfg
            .mode
            .clone()
            .or(mount_mode)
            .unwrap_or_else(|| "default".into()),
        vram: cfg.vram.clone(),
        direct_only: cfg.direct_only,
        repeat: cfg.repeat,
        direct_output_s,
        direct_mb_s: mb(direct_output_s),
        mount_output_s,
        mount_mb_s: mount_output_s.map(mb),
        drain_s,
        drain_window_s,
        drain_mb_s: drain_window_s.map(mb),
        drain_peak_mb_s,
        speedup: mount_output_s.map(|m| if m > 0.0 { direct_output_s / m } else { 0.0 }),
        runs,
    })
}

/// The table of seed 004 (Table 2): output each way and the drain, per run and the mean.
pub fn render(r: &Report) -> String {
    let mut out = format!(
        "bench checkpoint: {} processes x {} = {} file-per-process, 1 MiB writes + fsync\nbacking {}: {}{}, mount mode {}{}\n\n",
        r.procs,
        crate::fmt_size(r.file_size),
        crate::fmt_size(r.bytes_total),
        r.backing,
        r.backing_fs,
        r.throttle_mb_s
            .map(|t| format!(", writes throttled to {t} MB/s"))
            .unwrap_or_default(),
        r.mode,
        r.vram
            .as_ref()
            .map(|v| format!(", VRAM tier {v} (--vram)"))
            .unwrap_or_default()
    );
    let f = |v: Option<f64>| v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into());
    let header = [
        "",
        "No tierstack: output s",
        "tierstack: output s",
        "tierstack: drain s",
    ];
    let mut rows = Vec::new();
    for x in &r.runs {
        rows.push(vec![
            format!("Run {}", x.run),
            format!("{:.2}", x.direct_output_s),
            f(x.mount_output_s),
            f(x.drain_s),
        ]);
    }
    rows.push(vec![
        "Mean".into(),
        format!("{:.2}", r.direct_output_s),
        f(r.mount_output_s),
        f(r.drain_s),
    ]);
    let g = |v: Option<f64>| v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into());
    rows.push(vec![
        "MB/s".into(),
        format!("{:.1}", r.direct_mb_s),
        g(r.mount_mb_s),
        g(r.drain_mb_s),
    ]);
    out.push_str(&crate::table::render(&header, &rows));
    if let (Some(w), Some(d)) = (r.drain_window_s, r.drain_mb_s) {
        out.push_str(&format!(
            "\ndrain: {w:.2} s from the first byte drained (while the writers still wrote) to the last, {d:.1} MB/s{}",
            r.drain_peak_mb_s
                .map(|p| format!(" (peak {p:.1} MB/s in status)"))
                .unwrap_or_default()
        ));
    }
    match r.speedup {
        Some(s) => out.push_str(&format!(
            "\nspeedup (the application's view: direct output / mount output): {s:.1}x\n"
        )),
        None => out.push_str("\n(direct only: no mount run)\n"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_waits_for_the_start_and_writes_its_file() {
        let t = tempfile::tempdir().unwrap();
        let spec = WriterSpec {
            path: t.path().join("f"),
            size: 3 * BLOCK as u64 + 100,
            cgroup_procs: None,
            seed: 7,
        };
        let mut out = Vec::new();
        run_writer(&spec, std::io::empty(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("ready"));
        let r: WriterReport = serde_json::from_str(lines.next().unwrap()).unwrap();
        assert!(r.done_ns >= r.start_ns);
        assert_eq!(r.bytes, spec.size);
        assert_eq!(fs::metadata(&spec.path).unwrap().len(), spec.size);
    }

    #[test]
    fn renders_direct_only() {
        let r = Report {
            procs: 2,
            file_size: 1 << 20,
            bytes_total: 2 << 20,
            throttle_mb_s: None,
            throttle_cgroup: None,
            backing: "/b".into(),
            backing_fs: "directory as given".into(),
            mode: "default".into(),
            vram: None,
            direct_only: true,
            repeat: 1,
            direct_output_s: 0.5,
            direct_mb_s: 4.2,
            mount_output_s: None,
            mount_mb_s: None,
            drain_s: None,
            drain_window_s: None,
            drain_mb_s: None,
            drain_peak_mb_s: None,
            speedup: None,
            runs: vec![RunResult {
                run: 1,
                direct_output_s: 0.5,
                mount_output_s: None,
                drain_s: None,
                drain_window_s: None,
                drain_peak_mb_s: None,
            }],
        };
        let s = render(&r);
        assert!(
            s.contains("Run 1") && s.contains("Mean") && s.contains("direct only"),
            "{s}"
        );
    }
}
