//! `tierstack bench workloads`: real programs on small files (issue 39 item 3), each in a
//! plain folder and through a fresh `tierstack mount` at its defaults on the same disk, in
//! one run, so that the ratio is measured, not assumed.
//!
//! - `tree`: `tar xf` of a source tree, `git init && git add -A && git commit`; then, with
//!   the kernel's caches dropped before each, `git status`, `ls -lR`, and a read of every file.
//! - `pip`: `python3 -m pip install --no-index --find-links WHEELS --target TARGET` of a few
//!   wheels, then a cold `python3 -c 'import ...'` of them with `PYTHONPATH=TARGET`.
//! - `h5py`: one HDF5 file of many small datasets written and closed, then read back cold
//!   (`h5_small.py`, the time of its file I/O without Python's start).
//! - `mpi-logs`: `mpirun` ranks each appending small records to a file of its own with
//!   periodic `fflush` + `fsync` (`log_rank.c`, built with `mpicc` at run time).
//!
//! Everything lives under `--dir` (made by the benchmark, removed at the end whatever
//! happens): the inputs in `work/`, each plain run in a folder of its own, each mount run's
//! BACKING, mount point and fast tier beside it. After a mount run's writing phases the time
//! until its drain left nothing dirty is taken apart from the phases (bounded; a drain still
//! going at the bound is reported, not waited for). The two sides alternate their order from
//! round to round. Every workload program is started through [`programs::program`], the one
//! place that sets a program's environment (where the interception client's `LD_PRELOAD`
//! will go).

mod programs;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tierstack_common::{io_err, PathIoError};

use crate::checkpoint::mounted::{MountOpts, Mounted};
use crate::checkpoint::CheckpointError;
use crate::io::IoBenchError;

pub use programs::{Inputs, LOG_RANK_SOURCE};

/// The workloads, in the order they run.
pub const WORKLOADS: [&str; 4] = ["tree", "pip", "h5py", "mpi-logs"];

/// What can go wrong in `bench workloads`; every message names the problem and the fix.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadsError {
    /// Bad input (the CLI makes it a usage error, exit status 2).
    #[error("{0}")]
    Usage(String),
    /// A workload program failed.
    #[error("{what} failed in {}: {msg}", dir.display())]
    Program {
        /// The program and workload.
        what: String,
        /// The folder it worked in.
        dir: PathBuf,
        /// The telling line of its standard error.
        msg: String,
    },
    /// A workload program printed no `TIME` line.
    #[error("{what} printed no TIME line: {out}")]
    NoTime {
        /// The program.
        what: String,
        /// The end of what it printed.
        out: String,
    },
    /// An I/O call failed on a path.
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// The tierstack mount (mount, status, umount) failed.
    #[error("{0}")]
    Mount(#[from] CheckpointError),
    /// Starting or bounding a program failed (MPI, a program past its timeout).
    #[error("{0}")]
    Run(#[from] IoBenchError),
    /// The work folder could not be removed.
    #[error("{0}")]
    Cleanup(#[from] crate::BenchError),
    /// Ctrl-C or SIGTERM.
    #[error("interrupted: the mounts and everything under --dir were removed")]
    Cancelled,
}

/// Result of this module.
pub type Result<T> = std::result::Result<T, WorkloadsError>;

/// How to run the benchmark.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `tierstack` binary (for `mount`, `drain`, `status`, `umount`).
    pub exe: PathBuf,
    /// Scratch folder on the disk to test; must not exist (made, and removed at the end).
    pub dir: PathBuf,
    /// The workloads to run, a subset of [`WORKLOADS`].
    pub only: Vec<String>,
    /// Rounds (each runs every workload on both sides).
    pub repeat: usize,
    /// `tree`: a tar to unpack (None: one made at the start from the system's own trees).
    pub tree_tar: Option<PathBuf>,
    /// `tree`: entries of the tar made at the start.
    pub tree_entries: usize,
    /// `pip`: a folder of wheels to install (None: generated ones).
    pub wheels: Option<PathBuf>,
    /// `pip`: generated wheels.
    pub pip_wheels: usize,
    /// `pip`: modules in each generated wheel.
    pub pip_modules: usize,
    /// `h5py`: datasets in the file.
    pub h5_datasets: usize,
    /// `mpi-logs`: ranks.
    pub ranks: usize,
    /// `mpi-logs`: records each rank appends.
    pub log_lines: usize,
    /// `mpi-logs`: records between two `fflush` + `fsync`.
    pub log_sync_every: usize,
    /// Bound of one workload program.
    pub timeout: Duration,
    /// Bound of one drain wait.
    pub drain_timeout: Duration,
    /// The mount side's programs run under the interception client (`tierstack exec MNT
    /// --`, libtierstack_io.so) instead of through FUSE alone.
    pub client: bool,
}

/// One phase of one workload: seconds on each side, per round, and their medians.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseRow {
    /// The phase (`unpack`, `git-commit`, `git-status (cold)`, ...).
    pub phase: String,
    /// Median seconds in the plain folder.
    pub plain_s: f64,
    /// Median seconds through the mount.
    pub mount_s: f64,
    /// plain_s / mount_s: the mount's speed as a fraction of the plain folder's.
    pub ratio: f64,
    /// Every round's seconds in the plain folder.
    pub plain_runs: Vec<f64>,
    /// Every round's seconds through the mount.
    pub mount_runs: Vec<f64>,
}

/// A FUSE operation of the mount's daemon in one mount run (`status --json`'s `ops`).
#[derive(Debug, Clone, Serialize)]
pub struct OpTime {
    /// The operation (`lookup`, `getattr`, ...).
    pub op: String,
    /// How many the daemon answered.
    pub count: u64,
    /// Mean time in the daemon, microseconds.
    pub mean_us: f64,
    /// count × mean, milliseconds.
    pub total_ms: f64,
}

/// One workload's result.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadReport {
    /// `tree`, `pip`, `h5py` or `mpi-logs`.
    pub workload: String,
    /// What it did (sizes).
    pub what: String,
    /// Why it did not run (its tool is missing), else None.
    pub skipped: Option<String>,
    /// Its phases, in order.
    pub phases: Vec<PhaseRow>,
    /// Seconds of the mount's drain after the workload, per round (not in the phases).
    pub drain_s: Vec<f64>,
    /// Whether every drain finished within its bound.
    pub drained: bool,
    /// `tree`: whether the mount's BACKING held, after its unmount, the same tree as the
    /// plain folder (paths, types, modes, contents; `.git/index` holds inode numbers and
    /// times and is left out).
    pub same_as_plain: Option<bool>,
    /// The daemon's operations in the last mount run, by total time, the 8 largest.
    pub mount_ops: Vec<OpTime>,
    /// Notes: phases not run and why.
    pub notes: Vec<String>,
}

/// The machine the figures come from.
#[derive(Debug, Clone, Serialize)]
pub struct Host {
    /// Host name.
    pub hostname: String,
    /// CPUs this process may use.
    pub cpus: usize,
    /// Kernel release.
    pub kernel: String,
    /// `PRETTY_NAME` of /etc/os-release.
    pub os: String,
    /// The fuse module's `enable_uring` switch (None: this kernel has none).
    pub fuse_enable_uring: Option<String>,
    /// The Python the workloads ran.
    pub python: String,
}

/// The result of `bench workloads` (its JSON output).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The machine.
    pub host: Host,
    /// Rounds.
    pub repeat: usize,
    /// Whether the cold phases ran with the kernel's caches dropped (needs root).
    pub cold: bool,
    /// The mount's FUSE transport, as its `status` names it.
    pub mount_transport: Option<String>,
    /// Whether the mount side ran under the interception client (`--client`).
    pub client: bool,
    /// One entry per workload asked for, in order.
    pub workloads: Vec<WorkloadReport>,
}

/// One side's run of one workload.
struct SideRun {
    phases: Vec<(String, f64)>,
    drain_s: f64,
    drained: bool,
    ops: Vec<OpTime>,
    transport: Option<String>,
    listing: Option<Vec<String>>,
}

/// `--dir` and everything under it, removed on every way out (mounts under it first, by
/// their own drops).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = crate::checkpoint::cmd::remove_work_folder(&self.0) {
            eprintln!("tierstack: warning: {e}");
        }
    }
}

fn check(cfg: &Config) -> Result<()> {
    let bad = |m: String| Err(WorkloadsError::Usage(m));
    if cfg.dir.exists() {
        return bad(format!(
            "{} exists: give a --dir that does not (the benchmark makes it and removes it at the end)",
            cfg.dir.display()
        ));
    }
    if cfg.only.is_empty() {
        return bad(format!(
            "--only names no workload: give some of {}",
            WORKLOADS.join(",")
        ));
    }
    for w in &cfg.only {
        if !WORKLOADS.contains(&w.as_str()) {
            return bad(format!(
                "--only {w}: no such workload: give some of {}",
                WORKLOADS.join(",")
            ));
        }
    }
    if cfg.repeat == 0 || cfg.repeat > 100 {
        return bad(format!(
            "--repeat {} is out of range: use 1 to 100",
            cfg.repeat
        ));
    }
    let sizes = [
        ("--tree-entries", cfg.tree_entries),
        ("--pip-wheels", cfg.pip_wheels),
        ("--pip-modules", cfg.pip_modules),
        ("--h5-datasets", cfg.h5_datasets),
        ("--ranks", cfg.ranks),
        ("--log-lines", cfg.log_lines),
        ("--log-sync-every", cfg.log_sync_every),
    ];
    for (k, v) in sizes {
        if v == 0 {
            return bad(format!("{k} must be at least 1"));
        }
    }
    if cfg.ranks > 256 {
        return bad(format!(
            "--ranks {} is out of range: use 1 to 256",
            cfg.ranks
        ));
    }
    if let Some(t) = &cfg.tree_tar {
        if !t.is_file() {
            return bad(format!(
                "--tree-tar {} is not a file: give a tar of a source tree (tar cf TREE.tar DIR)",
                t.display()
            ));
        }
    }
    if let Some(w) = &cfg.wheels {
        if !w.is_dir() {
            return bad(format!(
                "--wheels {} is not a folder: give one holding .whl files (pip download PKG -d DIR)",
                w.display()
            ));
        }
    }
    if !Path::new("/dev/fuse").exists() {
        return bad(
            "bench workloads mounts tierstack and /dev/fuse is missing: load the fuse module (modprobe fuse)".into(),
        );
    }
    Ok(())
}

fn read_trim(p: &str) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn host(python: &Path) -> Host {
    let os = read_trim("/etc/os-release")
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_default();
    Host {
        hostname: read_trim("/proc/sys/kernel/hostname").unwrap_or_default(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        kernel: read_trim("/proc/sys/kernel/osrelease").unwrap_or_default(),
        os,
        fuse_enable_uring: read_trim("/sys/module/fuse/parameters/enable_uring"),
        python: python.display().to_string(),
    }
}

fn median(v: &[f64]) -> f64 {
    crate::median_by(v.to_vec(), |x| *x).unwrap_or(0.0)
}

/// Runs the benchmark. `cancel` (Ctrl-C) stops it; the mounts and `--dir` are removed
/// whatever happens. `say` gets the progress lines and the skip lines.
pub fn run(cfg: &Config, cancel: &AtomicBool, say: &dyn Fn(&str)) -> Result<Report> {
    check(cfg)?;
    fs::create_dir_all(&cfg.dir).map_err(io_err("create", &cfg.dir))?;
    let dir = fs::canonicalize(&cfg.dir).map_err(io_err("resolve", &cfg.dir))?;
    let scratch = Scratch(dir.clone());
    let work = dir.join("work");
    fs::create_dir(&work).map_err(io_err("create", &work))?;
    let mut inputs = Inputs::new(cfg, &work);
    let cold = programs::can_drop_caches();
    if !cold {
        say("the cold phases are skipped: dropping the kernel's caches (/proc/sys/vm/drop_caches) needs root");
    }
    let mut reports = Vec::new();
    let mut ready = Vec::new();
    for w in WORKLOADS
        .iter()
        .filter(|w| cfg.only.iter().any(|o| o == *w))
    {
        let mut rep = WorkloadReport {
            workload: w.to_string(),
            what: String::new(),
            skipped: None,
            phases: Vec::new(),
            drain_s: Vec::new(),
            drained: true,
            same_as_plain: None,
            mount_ops: Vec::new(),
            notes: Vec::new(),
        };
        match inputs.prepare(w, cancel)? {
            Ok(what) => {
                rep.what = what;
                ready.push(reports.len());
            }
            Err(why) => {
                say(&format!("skipped {w}: {why}"));
                rep.skipped = Some(why);
            }
        }
        reports.push(rep);
    }
    let mut transport = None;
    let mut runs: Vec<Vec<(SideRun, SideRun)>> = (0..reports.len()).map(|_| Vec::new()).collect();
    for round in 0..cfg.repeat {
        for &i in &ready {
            let w = reports[i].workload.clone();
            let mut sides: [Option<SideRun>; 2] = [None, None];
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for side in order {
                if cancel.load(Ordering::Relaxed) {
                    return Err(WorkloadsError::Cancelled);
                }
                let name = if side == 0 { "plain folder" } else { "mount" };
                say(&format!(
                    "round {}/{}: {w} in the {name}",
                    round + 1,
                    cfg.repeat
                ));
                let tag = format!("{w}-{round}");
                sides[side] = Some(if side == 0 {
                    run_plain(
                        cfg,
                        &inputs,
                        &w,
                        &dir.join(format!("plain-{tag}")),
                        cold,
                        cancel,
                    )?
                } else {
                    run_mount(cfg, &inputs, &w, &dir, &tag, cold, cancel)?
                });
            }
            let [Some(p), Some(m)] = sides else {
                continue;
            };
            transport = transport.or(m.transport.clone());
            runs[i].push((p, m));
        }
    }
    for (rep, rounds) in reports.iter_mut().zip(runs) {
        summarise(rep, rounds, cold);
    }
    drop(inputs);
    drop(scratch);
    if dir.exists() {
        return Err(WorkloadsError::Cleanup(crate::BenchError::MountLeft(dir)));
    }
    Ok(Report {
        host: host(programs::python()),
        repeat: cfg.repeat,
        cold,
        mount_transport: transport,
        client: cfg.client,
        workloads: reports,
    })
}

fn summarise(rep: &mut WorkloadReport, rounds: Vec<(SideRun, SideRun)>, cold: bool) {
    let Some((first, _)) = rounds.first() else {
        return;
    };
    for (k, (phase, _)) in first.phases.iter().enumerate() {
        let plain: Vec<f64> = rounds.iter().map(|(p, _)| p.phases[k].1).collect();
        let mount: Vec<f64> = rounds.iter().map(|(_, m)| m.phases[k].1).collect();
        let (ps, ms) = (median(&plain), median(&mount));
        rep.phases.push(PhaseRow {
            phase: phase.clone(),
            plain_s: ps,
            mount_s: ms,
            ratio: if ms > 0.0 { ps / ms } else { 0.0 },
            plain_runs: plain,
            mount_runs: mount,
        });
    }
    rep.drain_s = rounds.iter().map(|(_, m)| m.drain_s).collect();
    rep.drained = rounds.iter().all(|(_, m)| m.drained);
    if rep.workload == "tree" {
        rep.same_as_plain = Some(
            rounds
                .iter()
                .all(|(p, m)| p.listing.is_some() && p.listing == m.listing),
        );
        for (p, m) in &rounds {
            if let (Some(a), Some(b)) = (&p.listing, &m.listing) {
                for d in programs::differences(a, b, 5) {
                    rep.notes
                        .push(format!("BACKING differs (- plain, + mount): {d}"));
                }
            }
        }
    }
    if let Some((_, m)) = rounds.last() {
        rep.mount_ops = m.ops.clone();
    }
    if !cold && programs::has_cold_phases(&rep.workload) {
        rep.notes
            .push("cold phases not run: dropping the kernel's caches needs root".into());
    }
}

fn run_plain(
    cfg: &Config,
    inputs: &Inputs,
    w: &str,
    root: &Path,
    cold: bool,
    cancel: &AtomicBool,
) -> Result<SideRun> {
    fs::create_dir(root).map_err(io_err("create", root))?;
    let r = (|| {
        let mut phases = programs::run_phases(cfg, inputs, w, root, false, None, cancel)?;
        programs::sync();
        if cold {
            phases.extend(programs::run_phases(
                cfg, inputs, w, root, true, None, cancel,
            )?);
        }
        let digest = (w == "tree")
            .then(|| programs::tree_listing(root))
            .transpose()?;
        Ok(SideRun {
            phases,
            drain_s: 0.0,
            drained: true,
            ops: Vec::new(),
            transport: None,
            listing: digest,
        })
    })();
    let _ = fs::remove_dir_all(root);
    r
}

/// A bounded drain wait: its seconds and whether it finished (a drain still going at the
/// bound is reported, not an error; Ctrl-C is).
fn drain(m: &Mounted, cfg: &Config, cancel: &AtomicBool) -> Result<(f64, bool)> {
    let t = Instant::now();
    match m.drain_wait(cancel, cfg.drain_timeout) {
        Ok(()) => Ok((t.elapsed().as_secs_f64(), true)),
        Err(CheckpointError::Cancelled) => Err(WorkloadsError::Cancelled),
        Err(e) => {
            eprintln!("tierstack: warning: the drain did not finish: {e}");
            Ok((t.elapsed().as_secs_f64(), false))
        }
    }
}

fn run_mount(
    cfg: &Config,
    inputs: &Inputs,
    w: &str,
    dir: &Path,
    tag: &str,
    cold: bool,
    cancel: &AtomicBool,
) -> Result<SideRun> {
    let backing = dir.join(format!("backing-{tag}"));
    let mnt = dir.join(format!("mnt-{tag}"));
    let fast = dir.join(format!("fast-{tag}"));
    for d in [&backing, &mnt, &fast] {
        fs::create_dir(d).map_err(io_err("create", d))?;
    }
    let r = (|| {
        let mut m = Mounted::mount(
            &cfg.exe,
            &backing,
            &mnt,
            &fast,
            MountOpts::default(),
            cancel,
        )
        .map_err(|e| match e {
            CheckpointError::Cancelled => WorkloadsError::Cancelled,
            e => e.into(),
        })?;
        let via = cfg.client.then_some(mnt.as_path());
        let mut phases = programs::run_phases(cfg, inputs, w, &mnt, false, via, cancel)?;
        let (mut drain_s, mut drained) = drain(&m, cfg, cancel)?;
        if cold {
            phases.extend(programs::run_phases(
                cfg, inputs, w, &mnt, true, via, cancel,
            )?);
            let (s, d) = drain(&m, cfg, cancel)?;
            drain_s += s;
            drained &= d;
        }
        let ops = m.status().map(|st| top_ops(&st)).unwrap_or_default();
        let transport = m.transport.clone();
        m.close()?;
        let digest = (w == "tree")
            .then(|| programs::tree_listing(&backing))
            .transpose()?;
        Ok(SideRun {
            phases,
            drain_s,
            drained,
            ops,
            transport,
            listing: digest,
        })
    })();
    // The mount is down (its drop unmounts it on an error); the rest is plain folders.
    if !tierstack_common::mounts::is_mounted(&mnt) {
        for d in [&backing, &mnt, &fast] {
            let _ = fs::remove_dir_all(d);
        }
    }
    r
}

/// The 8 operations of `status --json`'s `ops` with the most total time in the daemon.
fn top_ops(st: &serde_json::Value) -> Vec<OpTime> {
    let mut v: Vec<OpTime> = st
        .get("ops")
        .and_then(|o| o.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|o| {
                    let count = o.get("count")?.as_u64()?;
                    let mean_us = o.get("mean_us")?.as_f64()?;
                    Some(OpTime {
                        op: o.get("op")?.as_str()?.to_string(),
                        count,
                        mean_us,
                        total_ms: count as f64 * mean_us / 1000.0,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
    v.truncate(8);
    v
}

/// The table: per workload and phase, plain seconds, mount seconds, plain / mount.
pub fn render(r: &Report) -> String {
    let mut out = format!(
        "bench workloads: {} round{}, the mount at its defaults{} against a plain folder on the same disk\n\n",
        r.repeat,
        if r.repeat == 1 { "" } else { "s" },
        if r.client {
            " with the interception client (tierstack exec)"
        } else {
            ""
        }
    );
    let header = [
        "workload",
        "phase",
        "plain s",
        "mount s",
        "speed (plain/mount)",
    ];
    let mut rows = Vec::new();
    for w in &r.workloads {
        if let Some(why) = &w.skipped {
            rows.push(vec![
                w.workload.clone(),
                format!("skipped: {why}"),
                String::new(),
                String::new(),
                String::new(),
            ]);
            continue;
        }
        for p in &w.phases {
            rows.push(vec![
                w.workload.clone(),
                p.phase.clone(),
                format!("{:.3}", p.plain_s),
                format!("{:.3}", p.mount_s),
                format!("{:.2}", p.ratio),
            ]);
        }
        let drain: Vec<String> = w.drain_s.iter().map(|d| format!("{d:.2}")).collect();
        rows.push(vec![
            w.workload.clone(),
            "(drain after, not above)".into(),
            String::new(),
            drain.join(" "),
            if w.drained { "done" } else { "NOT done" }.into(),
        ]);
    }
    out.push_str(&crate::table::render(&header, &rows));
    out.push('\n');
    for w in &r.workloads {
        if w.skipped.is_some() {
            continue;
        }
        out.push_str(&format!("{}: {}\n", w.workload, w.what));
        if let Some(same) = w.same_as_plain {
            out.push_str(&format!(
                "  the mount's BACKING after unmount {} the plain folder's tree\n",
                if same { "holds" } else { "DIFFERS from" }
            ));
        }
        for n in &w.notes {
            out.push_str(&format!("  note: {n}\n"));
        }
    }
    out.push_str(&format!(
        "\nmachine: {} CPUs, {}, kernel {}, fuse enable_uring={}; transport: {}\n",
        r.host.cpus,
        r.host.os,
        r.host.kernel,
        r.host.fuse_enable_uring.as_deref().unwrap_or("absent"),
        r.mount_transport.as_deref().unwrap_or("?")
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dir: &Path) -> Config {
        Config {
            exe: PathBuf::from("tierstack"),
            dir: dir.to_path_buf(),
            only: WORKLOADS.iter().map(|s| s.to_string()).collect(),
            repeat: 1,
            tree_tar: None,
            tree_entries: 10,
            wheels: None,
            pip_wheels: 1,
            pip_modules: 1,
            h5_datasets: 1,
            ranks: 1,
            log_lines: 1,
            log_sync_every: 1,
            timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(10),
            client: false,
        }
    }

    #[test]
    fn bad_input_is_one_line_naming_the_fix() {
        let t = tempfile::tempdir().expect("tempdir");
        let e = check(&cfg(t.path())).expect_err("existing dir").to_string();
        assert!(e.contains("exists") && e.contains("--dir"), "{e}");
        let mut c = cfg(&t.path().join("new"));
        c.only = vec!["nope".into()];
        let e = check(&c).expect_err("bad workload").to_string();
        assert!(e.contains("tree,pip,h5py,mpi-logs"), "{e}");
        let mut c = cfg(&t.path().join("new"));
        c.ranks = 0;
        assert!(check(&c).expect_err("zero").to_string().contains("--ranks"));
    }

    #[test]
    fn top_ops_are_by_total_time() {
        let st = serde_json::json!({"ops": [
            {"op": "lookup", "count": 10, "mean_us": 5.0},
            {"op": "getattr", "count": 100, "mean_us": 2.0},
            {"op": "bad"}
        ]});
        let v = top_ops(&st);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].op, "getattr");
        assert!((v[1].total_ms - 0.05).abs() < 1e-9);
    }
}
