//! `tierstack top`: a live view of every tierstack process on the host, with no daemon of its
//! own.
//!
//! Processes are found in the runtime folder `tierstack_fs::mount::run_dir()`
//! (`/run/tierstack`, or `$TIERSTACK_RUN_DIR`):
//!
//! - each mount has its control socket there (`<hash>.sock`), which answers `status`;
//! - each `tierstack run` writes `run/<pid>.json` there when its program starts (the
//!   [`RunRecord`]: program pid, command, DRAM budget, run folder) and removes it at exit.
//!
//! Figures that the processes do not report themselves come from /proc and /sys: the I/O of
//! a mount's daemon and of a run's program (`/proc/PID/io`), a program's resident memory, and
//! the read/write throughput and IOPS of each block device that holds a drive of theirs
//! (`/sys/dev/block/MAJ:MIN/stat`, the same counters as iostat; shared by everything on that
//! device). A run's pager counters (faults, bytes paged, the fault latency histogram) are
//! rewritten by each paged process of the program about once a second and at its exit
//! (`PID.json` in the run folder), so they are live.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use tierstack_bench::fmt_size;
use tierstack_fs::mount::{self as fsmount, MountStatus, TierUse};

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Print plain text frames (as `top -b`) instead of the interactive view.
    #[arg(long)]
    pub batch: bool,
    /// Stop after this many frames (batch mode; the interactive view runs until `q`).
    #[arg(long, short = 'n')]
    pub iterations: Option<u64>,
    /// Time between frames (e.g. 1s, 500ms, 2).
    #[arg(long, short = 'd', default_value = "1s")]
    pub interval: String,
    /// One JSON object per frame, one per line (implies --batch).
    #[arg(long)]
    pub json: bool,
}

/// What `tierstack run` leaves in `run_dir()/run/<tierstack pid>.json` while its program runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// The `tierstack run` process.
    pub tierstack_pid: u32,
    /// The program it started.
    pub pid: u32,
    pub cmd: String,
    pub dram_bytes: u64,
    pub page_bytes: u64,
    /// Unix seconds.
    pub started: u64,
    /// Where the program's processes write their pager counters (live, and at exit).
    pub stats_dir: PathBuf,
    /// `--metrics` address, if any.
    #[serde(default)]
    pub metrics: Option<String>,
}

/// The folder of the run records.
pub fn runs_dir() -> PathBuf {
    fsmount::run_dir().join("run")
}

/// Removes the run record when dropped.
pub struct RunRegistration(PathBuf);

impl Drop for RunRegistration {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Writes the run record (best effort: a runtime folder this user cannot write only hides the
/// run from `top`).
pub fn register_run(rec: &RunRecord) -> Option<RunRegistration> {
    // Records (and run folders) of runs killed before they could remove theirs.
    read_runs();
    let dir = runs_dir();
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::info!(
            "cannot create {}: {e}; `tierstack top` will not list this run",
            dir.display()
        );
        return None;
    }
    let path = dir.join(format!("{}.json", rec.tierstack_pid));
    let tmp = dir.join(format!(".{}.json.tmp", rec.tierstack_pid));
    let ok = serde_json::to_vec(rec)
        .ok()
        .and_then(|b| std::fs::write(&tmp, b).ok())
        .and_then(|_| std::fs::rename(&tmp, &path).ok())
        .is_some();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
        tracing::info!(
            "cannot write {}; `tierstack top` will not list this run",
            path.display()
        );
        return None;
    }
    Some(RunRegistration(path))
}

/// A command line on one line (control characters as spaces), at most `max` characters.
pub fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let flat = flat.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max {
        let mut t: String = flat.chars().take(max.saturating_sub(3)).collect();
        t.push_str("...");
        t
    } else {
        flat
    }
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The counters of /proc/PID/io (bytes that reached the block layer, and all bytes).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcIo {
    pub rchar: u64,
    pub wchar: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

pub fn proc_io(pid: u32) -> Option<ProcIo> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let mut io = ProcIo::default();
    for l in text.lines() {
        let mut it = l.split(':');
        let (Some(k), Some(v)) = (it.next(), it.next()) else {
            continue;
        };
        let v: u64 = v.trim().parse().unwrap_or(0);
        match k {
            "rchar" => io.rchar = v,
            "wchar" => io.wchar = v,
            "read_bytes" => io.read_bytes = v,
            "write_bytes" => io.write_bytes = v,
            _ => {}
        }
    }
    Some(io)
}

/// Resident memory of a process (VmRSS), bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = l.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Counters of one block device (/sys/dev/block/MAJ:MIN/stat).
#[derive(Debug, Clone, Copy, Default)]
pub struct DevCounters {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
}

/// The kernel's name of block device `majmin` (e.g. `vda`), or `majmin` itself.
pub(crate) fn dev_name(majmin: &str) -> String {
    std::fs::read_to_string(format!("/sys/dev/block/{majmin}/uevent"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("DEVNAME=").map(|s| s.to_string()))
        })
        .unwrap_or_else(|| majmin.to_string())
}

pub fn dev_counters(majmin: &str) -> Option<DevCounters> {
    let t = std::fs::read_to_string(format!("/sys/dev/block/{majmin}/stat")).ok()?;
    let f: Vec<u64> = t
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    if f.len() < 7 {
        return None;
    }
    Some(DevCounters {
        reads: f[0],
        read_bytes: f[2] * 512,
        writes: f[4],
        write_bytes: f[6] * 512,
    })
}

/// Regular files a process holds open under `under` (all of them if None), with the block
/// device (MAJ:MIN) each lies on.
pub fn open_files(pid: u32, under: Option<&Path>) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return out;
    };
    let mut seen = BTreeSet::new();
    for e in rd.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        // A drive unlinked after it was opened reads as "PATH (deleted)".
        let target = match target.to_str().and_then(|t| t.strip_suffix(" (deleted)")) {
            Some(t) => PathBuf::from(t),
            None => target,
        };
        if !target.is_absolute() || under.is_some_and(|u| !target.starts_with(u)) {
            continue;
        }
        // The descriptor itself (the path may be gone).
        let Ok(md) = std::fs::metadata(e.path()) else {
            continue;
        };
        if !md.is_file() || !seen.insert(target.clone()) {
            continue;
        }
        let dev = md.dev();
        let majmin = format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev));
        out.push((target, majmin));
    }
    out
}

/// One look at a mount.
#[derive(Debug, Clone)]
struct MountSample {
    status: MountStatus,
    io: Option<ProcIo>,
    /// Block devices (MAJ:MIN) of the daemon's open files outside the mount and backing.
    devices: BTreeSet<String>,
}

#[derive(Debug, Clone)]
struct RunSample {
    rec: RunRecord,
    alive: bool,
    rss: Option<u64>,
    io: Option<ProcIo>,
    devices: BTreeSet<String>,
    counters: RunCounters,
}

#[derive(Debug, Clone)]
struct Sample {
    t: Instant,
    mounts: Vec<MountSample>,
    runs: Vec<RunSample>,
    devs: BTreeMap<String, DevCounters>,
    /// Control sockets that did not answer (a daemon gone or busy).
    silent: Vec<PathBuf>,
}

/// Mounts that answer in the runtime folder.
pub fn mounts() -> (Vec<MountStatus>, Vec<PathBuf>) {
    let mut ok = Vec::new();
    let mut silent = Vec::new();
    let Ok(rd) = std::fs::read_dir(fsmount::run_dir()) else {
        return (ok, silent);
    };
    let mut socks: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .collect();
    socks.sort();
    for s in socks {
        match status_at(&s) {
            Some(st) => ok.push(st),
            None => silent.push(s),
        }
    }
    ok.sort_by(|a, b| a.mountpoint.cmp(&b.mountpoint));
    (ok, silent)
}

/// `status` from a control socket path (bounded: 2 s).
fn status_at(sock: &Path) -> Option<MountStatus> {
    fsmount::status_at(sock, Duration::from_secs(2))
}

fn read_runs() -> Vec<RunRecord> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(runs_dir()) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Some(rec) = std::fs::read(&p)
            .ok()
            .and_then(|b| serde_json::from_slice::<RunRecord>(&b).ok())
        else {
            continue;
        };
        if !tierstack_common::process::alive(rec.tierstack_pid) {
            // Left behind by a `tierstack run` that was killed: not a live run. Its record
            // and its run folder go.
            let _ = std::fs::remove_file(&p);
            if rec
                .stats_dir
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("tierstack-run-"))
            {
                let _ = std::fs::remove_dir_all(&rec.stats_dir);
            }
            continue;
        }
        out.push(rec);
    }
    out.sort_by_key(|r| r.tierstack_pid);
    out
}

/// The pager counters of a run's processes, summed over the files they leave in its run
/// folder: rewritten about once a second while a process runs (`live`), a last time at its
/// exit.
#[derive(Debug, Clone, Default)]
pub struct RunCounters {
    /// Processes paging now (their last report said live).
    pub live: u64,
    /// Processes that exited and wrote their final counters.
    pub exited: u64,
    /// Paged bytes resident in the processes paging now.
    pub live_resident: u64,
    /// The largest `--dram` budget a process reported.
    pub budget: u64,
    /// Each numeric counter of `tierstack_mem::MemStats`, summed.
    pub sum: BTreeMap<String, u64>,
    /// Faults served from the store per latency bucket
    /// (`tierstack_common::LATENCY_BOUNDS_US`, then the overflow bucket), summed.
    pub fault_buckets: Vec<u64>,
    /// What the first process's paging engine was built as (`tierstack_mem::setup::
    /// EngineConfig`; the processes of one run share the rule).
    pub engine: Option<serde_json::Value>,
}

impl RunCounters {
    pub fn get(&self, k: &str) -> u64 {
        self.sum.get(k).copied().unwrap_or(0)
    }

    /// Processes that paged, running or exited.
    pub fn processes(&self) -> u64 {
        self.live + self.exited
    }

    /// The `q` quantile of fault service time in microseconds (bucket upper bound).
    pub fn fault_quantile_us(&self, q: f64) -> Option<u64> {
        tierstack_common::latency::quantile_us(&self.fault_buckets, q)
    }
}

/// Reads and sums the pager counters in a run folder (see [`RunCounters`]).
pub fn run_counters(dir: &Path) -> RunCounters {
    let mut rc = RunCounters::default();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return rc;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json")
            || p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        {
            continue;
        }
        let Some(v) = std::fs::read(&p)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        else {
            continue;
        };
        if v["live"].as_bool() == Some(true) {
            rc.live += 1;
            rc.live_resident += v["resident"].as_u64().unwrap_or(0);
        } else {
            rc.exited += 1;
        }
        rc.budget = rc.budget.max(v["budget"].as_u64().unwrap_or(0));
        if rc.engine.is_none() && v["engine"].is_object() {
            rc.engine = Some(v["engine"].clone());
        }
        if let Some(o) = v["stats"].as_object() {
            for (k, x) in o {
                if let Some(n) = x.as_u64() {
                    let e = rc.sum.entry(k.clone()).or_insert(0);
                    // A peak is not a sum: the highest of the processes'.
                    if k == "peak_resident" {
                        *e = (*e).max(n);
                    } else {
                        *e += n;
                    }
                }
            }
            if let Some(b) = o.get("fault_latency_buckets").and_then(|b| b.as_array()) {
                let b: Vec<u64> = b.iter().map(|x| x.as_u64().unwrap_or(0)).collect();
                tierstack_common::latency::add_counts(&mut rc.fault_buckets, &b);
            }
        }
    }
    rc
}

fn sample() -> Sample {
    let (sts, silent) = mounts();
    let mut devs = BTreeMap::new();
    let mut ms = Vec::new();
    for st in sts {
        let devices: BTreeSet<String> = open_files(st.pid, None)
            .into_iter()
            .filter(|(p, _)| !p.starts_with(&st.mountpoint) && !p.starts_with(&st.backing))
            .map(|(_, d)| d)
            .collect();
        ms.push(MountSample {
            io: proc_io(st.pid),
            status: st,
            devices,
        });
    }
    let mut rs = Vec::new();
    for rec in read_runs() {
        let devices: BTreeSet<String> = open_files(rec.pid, Some(&rec.stats_dir))
            .into_iter()
            .map(|(_, d)| d)
            .collect();
        rs.push(RunSample {
            alive: tierstack_common::process::alive(rec.pid),
            rss: rss_bytes(rec.pid),
            io: proc_io(rec.pid),
            devices,
            counters: run_counters(&rec.stats_dir),
            rec,
        });
    }
    for d in ms
        .iter()
        .flat_map(|m| m.devices.iter())
        .chain(rs.iter().flat_map(|r| r.devices.iter()))
    {
        if let Some(c) = dev_counters(d) {
            devs.insert(d.clone(), c);
        }
    }
    Sample {
        t: Instant::now(),
        mounts: ms,
        runs: rs,
        devs,
        silent,
    }
}

/// One frame of `top`, as printed by `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Frame {
    pub time: u64,
    pub interval_s: f64,
    pub mounts: Vec<MountView>,
    pub runs: Vec<RunView>,
    pub devices: Vec<DeviceView>,
    /// Control sockets in the runtime folder that did not answer.
    pub silent_sockets: Vec<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
pub struct OpView {
    pub op: String,
    pub count: u64,
    pub per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MountView {
    pub mountpoint: PathBuf,
    pub backing: PathBuf,
    pub pid: u32,
    pub mode: String,
    pub tiers: Vec<TierUse>,
    #[serde(flatten)]
    pub drain: tierstack_fs::mount::DrainFigures,
    /// dirty_bytes / drain rate, when the drain moves.
    pub drain_eta_s: Option<f64>,
    pub backpressure: bool,
    pub stuck: usize,
    pub stuck_first: Option<String>,
    /// The fast tier's array health: state, rebuild progress, drives not online.
    pub array_state: String,
    pub rebuild_percent: Option<f64>,
    pub drives_not_online: usize,
    pub last_error: Option<String>,
    /// The daemon's own I/O (its drives, journal and the drain's writes to BACKING).
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    pub ops: Vec<OpView>,
    pub devices: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunView {
    pub tierstack_pid: u32,
    pub pid: u32,
    pub cmd: String,
    pub alive: bool,
    pub uptime_s: u64,
    pub dram_budget_bytes: u64,
    pub page_bytes: u64,
    pub rss_bytes: Option<u64>,
    /// The program's block I/O (its paging to the drives in its run folder, and its own I/O).
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    /// Processes of the program paging now (they report about once a second).
    pub paging_processes: u64,
    /// Processes of the program that have exited and left their pager counters.
    pub exited_processes: u64,
    /// Faults served by tierstack so far (live and exited processes).
    pub faults: u64,
    pub faults_per_s: f64,
    pub bytes_paged_in: u64,
    pub bytes_paged_out: u64,
    /// Time from a fault to the program's wake-up, for faults read from the store.
    pub mean_fault_us: Option<f64>,
    pub fault_p50_us: Option<u64>,
    pub fault_p99_us: Option<u64>,
    pub devices: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceView {
    pub device: String,
    pub majmin: String,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    /// Mount points and run pids with drives on it.
    pub used_by: Vec<String>,
}

fn rate(new: u64, old: u64, dt: f64) -> f64 {
    if dt <= 0.0 {
        0.0
    } else {
        new.saturating_sub(old) as f64 / dt
    }
}

fn frame(prev: &Sample, cur: &Sample) -> Frame {
    let dt = cur.t.duration_since(prev.t).as_secs_f64();
    let mut users: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut mounts = Vec::new();
    for m in &cur.mounts {
        let s = &m.status;
        let old = prev.mounts.iter().find(|p| p.status.pid == s.pid);
        let (rd, wr) = match (m.io, old.and_then(|o| o.io)) {
            (Some(n), Some(o)) => (
                rate(n.read_bytes, o.read_bytes, dt),
                rate(n.write_bytes, o.write_bytes, dt),
            ),
            _ => (0.0, 0.0),
        };
        let mut ops: Vec<OpView> = s
            .ops
            .iter()
            .map(|o| {
                let before = old
                    .and_then(|p| p.status.ops.iter().find(|x| x.op == o.op))
                    .map_or(o.count, |x| x.count);
                OpView {
                    op: o.op.clone(),
                    count: o.count,
                    per_s: rate(o.count, before, dt),
                    p50_us: o.p50_us,
                    p99_us: o.p99_us,
                }
            })
            .collect();
        ops.sort_by(|a, b| b.per_s.total_cmp(&a.per_s).then(b.count.cmp(&a.count)));
        for d in &m.devices {
            users
                .entry(d.clone())
                .or_default()
                .push(s.mountpoint.display().to_string());
        }
        mounts.push(MountView {
            mountpoint: s.mountpoint.clone(),
            backing: s.backing.clone(),
            pid: s.pid,
            mode: s.mode.clone(),
            tiers: s.tiers.clone(),
            drain: s.drain.clone(),
            drain_eta_s: (s.drain.drain_bytes_per_s > 0.0 && s.drain.dirty_bytes > 0)
                .then(|| s.drain.dirty_bytes as f64 / s.drain.drain_bytes_per_s),
            backpressure: s.backpressure,
            stuck: s.stuck.len(),
            stuck_first: s
                .stuck
                .first()
                .map(|r| format!("{} {}: {}", r.op, r.path, r.error)),
            array_state: s.array_state.clone(),
            rebuild_percent: s.rebuild_percent,
            drives_not_online: s.drives_not_online,
            last_error: s.last_error.clone(),
            read_bytes_per_s: rd,
            write_bytes_per_s: wr,
            ops,
            devices: m.devices.iter().map(|d| dev_name(d)).collect(),
        });
    }
    let mut runs = Vec::new();
    for r in &cur.runs {
        let old = prev
            .runs
            .iter()
            .find(|p| p.rec.tierstack_pid == r.rec.tierstack_pid);
        let (rd, wr) = match (r.io, old.and_then(|o| o.io)) {
            (Some(n), Some(o)) => (
                rate(n.read_bytes, o.read_bytes, dt),
                rate(n.write_bytes, o.write_bytes, dt),
            ),
            _ => (0.0, 0.0),
        };
        let g = |k: &str| r.counters.get(k);
        let faults_per_s = old.map_or(0.0, |o| rate(g("faults"), o.counters.get("faults"), dt));
        for d in &r.devices {
            users
                .entry(d.clone())
                .or_default()
                .push(format!("run {}", r.rec.pid));
        }
        runs.push(RunView {
            tierstack_pid: r.rec.tierstack_pid,
            pid: r.rec.pid,
            cmd: one_line(&r.rec.cmd, 60),
            alive: r.alive,
            uptime_s: now_unix().saturating_sub(r.rec.started),
            dram_budget_bytes: r.rec.dram_bytes,
            page_bytes: r.rec.page_bytes,
            rss_bytes: r.rss,
            read_bytes_per_s: rd,
            write_bytes_per_s: wr,
            paging_processes: r.counters.live,
            exited_processes: r.counters.exited,
            faults: g("faults"),
            faults_per_s,
            bytes_paged_in: g("bytes_in"),
            bytes_paged_out: g("bytes_out"),
            mean_fault_us: (g("store_reads") > 0)
                .then(|| g("store_fault_ns") as f64 / g("store_reads") as f64 / 1000.0),
            fault_p50_us: r.counters.fault_quantile_us(0.5),
            fault_p99_us: r.counters.fault_quantile_us(0.99),
            devices: r.devices.iter().map(|d| dev_name(d)).collect(),
        });
    }
    let mut devices = Vec::new();
    for (mm, c) in &cur.devs {
        let o = prev.devs.get(mm).copied().unwrap_or(*c);
        devices.push(DeviceView {
            device: dev_name(mm),
            majmin: mm.clone(),
            read_bytes_per_s: rate(c.read_bytes, o.read_bytes, dt),
            write_bytes_per_s: rate(c.write_bytes, o.write_bytes, dt),
            read_iops: rate(c.reads, o.reads, dt),
            write_iops: rate(c.writes, o.writes, dt),
            used_by: users.remove(mm).unwrap_or_default(),
        });
    }
    Frame {
        time: now_unix(),
        interval_s: dt,
        mounts,
        runs,
        devices,
        silent_sockets: cur.silent.clone(),
    }
}

fn mbs(b: f64) -> String {
    format!("{:.1} MB/s", b / 1e6)
}

fn eta(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 90.0 => format!("{s:.0} s"),
        Some(s) if s < 5400.0 => format!("{:.0} min", s / 60.0),
        Some(s) => format!("{:.1} h", s / 3600.0),
    }
}

fn tiers_line(ts: &[TierUse]) -> String {
    ts.iter()
        .map(|t| {
            format!(
                "{} {}/{} ({:.0} %, dirty {})",
                t.name,
                fmt_size(t.used_bytes),
                fmt_size(t.capacity_bytes),
                t.used_bytes as f64 * 100.0 / t.capacity_bytes.max(1) as f64,
                fmt_size(t.dirty_bytes)
            )
        })
        .collect::<Vec<_>>()
        .join("  ")
}

/// A frame as plain text (batch mode).
pub fn render(f: &Frame) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "tierstack top - {} mount(s), {} run(s), {} device(s), interval {:.1} s, runtime folder {}\n",
        f.mounts.len(),
        f.runs.len(),
        f.devices.len(),
        f.interval_s,
        fsmount::run_dir().display()
    ));
    for m in &f.mounts {
        s.push_str(&format!(
            "MOUNT {} <- {}  pid {}  mode {}{}\n",
            m.mountpoint.display(),
            m.backing.display(),
            m.pid,
            m.mode,
            if m.backpressure { "  BACKPRESSURE" } else { "" }
        ));
        s.push_str(&format!("  tiers  {}\n", tiers_line(&m.tiers)));
        if !m.array_state.is_empty() {
            s.push_str(&format!(
                "  array  {}{}{}\n",
                m.array_state,
                m.rebuild_percent
                    .map(|p| format!(", rebuild {p:.0} %"))
                    .unwrap_or_default(),
                if m.drives_not_online > 0 {
                    format!(", {} drive(s) not online", m.drives_not_online)
                } else {
                    String::new()
                }
            ));
        }
        s.push_str(&format!(
            "  drain  waiting {} in {} files, {} journal ops; {}/s, {} drained, ETA {}; stuck {}\n",
            fmt_size(m.drain.dirty_bytes),
            m.drain.dirty_files,
            m.drain.pending_ops,
            fmt_size(m.drain.drain_bytes_per_s as u64),
            fmt_size(m.drain.drained_bytes),
            eta(m.drain_eta_s),
            m.stuck
        ));
        if let Some(x) = &m.stuck_first {
            s.push_str(&format!("  stuck  {x}\n"));
        }
        s.push_str(&format!(
            "  io     read {} write {} (daemon){}\n",
            mbs(m.read_bytes_per_s),
            mbs(m.write_bytes_per_s),
            if m.devices.is_empty() {
                String::new()
            } else {
                format!("; devices {}", m.devices.join(" "))
            }
        ));
        let ops: Vec<String> = m
            .ops
            .iter()
            .take(5)
            .map(|o| {
                format!(
                    "{} {:.0}/s p50 {}us p99 {}us",
                    o.op, o.per_s, o.p50_us, o.p99_us
                )
            })
            .collect();
        if !ops.is_empty() {
            s.push_str(&format!("  ops    {}\n", ops.join("; ")));
        }
    }
    for r in &f.runs {
        s.push_str(&format!(
            "RUN pid {} ({}) {}  budget {}  rss {}  io read {} write {}  up {} s{}\n",
            r.pid,
            if r.alive { "running" } else { "exited" },
            r.cmd,
            fmt_size(r.dram_budget_bytes),
            r.rss_bytes.map_or("-".into(), fmt_size),
            mbs(r.read_bytes_per_s),
            mbs(r.write_bytes_per_s),
            r.uptime_s,
            if r.paging_processes + r.exited_processes > 0 {
                format!(
                    "; {} paging, {} exited: {} faults ({:.0}/s), {} in, {} out, fault p50 {} us p99 {} us",
                    r.paging_processes,
                    r.exited_processes,
                    r.faults,
                    r.faults_per_s,
                    fmt_size(r.bytes_paged_in),
                    fmt_size(r.bytes_paged_out),
                    r.fault_p50_us.map_or("-".into(), |x| x.to_string()),
                    r.fault_p99_us.map_or("-".into(), |x| x.to_string()),
                )
            } else {
                String::new()
            }
        ));
    }
    for d in &f.devices {
        s.push_str(&format!(
            "DEVICE {:<10} read {} {:.0} IOPS  write {} {:.0} IOPS  ({})\n",
            d.device,
            mbs(d.read_bytes_per_s),
            d.read_iops,
            mbs(d.write_bytes_per_s),
            d.write_iops,
            d.used_by.join(", ")
        ));
    }
    if f.mounts.is_empty() && f.runs.is_empty() {
        s.push_str("no tierstack mount or run on this host\n");
    }
    for p in &f.silent_sockets {
        s.push_str(&format!(
            "SILENT {} (a mount daemon that does not answer: busy, or gone; `tierstack umount` clears a dead one)\n",
            p.display()
        ));
    }
    s
}

/// Parses 1s, 500ms, 2m or a number of seconds.
pub fn parse_interval(s: &str) -> Result<Duration> {
    let t = s.trim();
    let (num, mult) = if let Some(x) = t.strip_suffix("ms") {
        (x, 0.001)
    } else if let Some(x) = t.strip_suffix('s') {
        (x, 1.0)
    } else if let Some(x) = t.strip_suffix('m') {
        (x, 60.0)
    } else {
        (t, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v * mult >= 0.05 && v * mult <= 3600.0 => {
            Ok(Duration::from_secs_f64(v * mult))
        }
        _ => bail!("--interval {s} is not a duration from 50ms to 1h: give e.g. 1s, 500ms or 2"),
    }
}

pub fn run(a: TopArgs) -> Result<()> {
    let interval = parse_interval(&a.interval)?;
    if a.iterations == Some(0) {
        bail!("--iterations 0 prints nothing: give 1 or more");
    }
    let batch = a.batch || a.json || a.iterations.is_some();
    if !batch {
        use std::io::IsTerminal;
        if !std::io::stdout().is_terminal() {
            bail!("standard output is not a terminal: use `tierstack top --batch --iterations N` (or --json) in scripts");
        }
        return tui::run(interval);
    }
    // The first frame's rates cover a short first look (at most 0.5 s), the rest one interval.
    let mut prev = sample();
    std::thread::sleep(interval.min(Duration::from_millis(500)));
    let mut out = std::io::stdout().lock();
    let mut i = 0u64;
    loop {
        let cur = sample();
        let f = frame(&prev, &cur);
        if a.json {
            writeln!(out, "{}", serde_json::to_string(&f)?)?;
        } else {
            if i > 0 {
                writeln!(out)?;
            }
            write!(out, "{}", render(&f))?;
        }
        out.flush()?;
        prev = cur;
        i += 1;
        if a.iterations.is_some_and(|n| i >= n) {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

mod tui;
