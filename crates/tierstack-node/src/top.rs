//! `tierstack top`'s model: one look at every tierstack process on the host (a [`Sample`]),
//! the rates between two looks (a [`Frame`]), and a frame as plain text. The CLI runs the loop
//! and the interactive view.
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
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use tierstack_common::fmt_size;
use tierstack_fs::mount::{self as fsmount, MountStatus, TierUse};

use crate::probe::{
    dev_counters, dev_name, now_unix, one_line, open_files, proc_io, rss_bytes, DevCounters, ProcIo,
};
use crate::runs::{read_runs, run_counters, RunCounters, RunRecord};
use crate::{NodeError, Result};

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
/// One look at every mount and run of the host (see [`sample`]).
pub struct Sample {
    t: Instant,
    mounts: Vec<MountSample>,
    runs: Vec<RunSample>,
    devs: BTreeMap<String, DevCounters>,
    /// Control sockets that did not answer (a daemon gone or busy).
    silent: Vec<PathBuf>,
}

/// Mounts that answer in the runtime folder.
pub fn mounts() -> (Vec<MountStatus>, Vec<PathBuf>) {
    let (found, silent) = mount_sockets();
    (found.into_iter().map(|f| f.status).collect(), silent)
}

/// A mount found in the runtime folder: its control socket, its status and how long the
/// status request took.
#[derive(Debug, Clone)]
pub struct FoundMount {
    /// The control socket (owned by the mount's user).
    pub socket: PathBuf,
    /// What the daemon answered.
    pub status: MountStatus,
    /// The status request's round trip.
    pub round_trip: Duration,
}

/// Mounts that answer in the runtime folder (sorted by mount point), and the control
/// sockets that did not answer (sorted).
pub fn mount_sockets() -> (Vec<FoundMount>, Vec<PathBuf>) {
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
    // All at once: a daemon's answer waits mostly on its own locks (status walks its
    // namespace), so one slow mount does not hold up the others' requests.
    let answers: Vec<(PathBuf, Option<(MountStatus, Duration)>)> = std::thread::scope(|sc| {
        let ask = |s: PathBuf| {
            let t0 = Instant::now();
            let st = status_at(&s).map(|st| (st, t0.elapsed()));
            (s, st)
        };
        let mut done = Vec::new();
        let mut asks = Vec::new();
        for s in socks {
            // A thread that cannot start: that socket is asked here, in turn.
            let b = std::thread::Builder::new().name("status".into());
            match b.spawn_scoped(sc, {
                let s = s.clone();
                move || ask(s)
            }) {
                Ok(h) => asks.push(h),
                Err(_) => done.push(ask(s)),
            }
        }
        done.extend(asks.into_iter().filter_map(|h| h.join().ok()));
        done
    });
    for (s, a) in answers {
        match a {
            Some((status, round_trip)) => ok.push(FoundMount {
                round_trip,
                socket: s,
                status,
            }),
            None => silent.push(s),
        }
    }
    ok.sort_by(|a, b| a.status.mountpoint.cmp(&b.status.mountpoint));
    (ok, silent)
}

/// `status` from a control socket path (bounded: 2 s).
fn status_at(sock: &Path) -> Option<MountStatus> {
    fsmount::status_at(sock, Duration::from_secs(2))
}

/// One look at every mount and run of the host.
pub fn sample() -> Sample {
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
    /// Unix seconds.
    pub time: u64,
    /// Seconds between the two looks the rates cover.
    pub interval_s: f64,
    /// Mounts that answer.
    pub mounts: Vec<MountView>,
    /// Live runs.
    pub runs: Vec<RunView>,
    /// Block devices holding drives of these processes.
    pub devices: Vec<DeviceView>,
    /// Control sockets in the runtime folder that did not answer.
    pub silent_sockets: Vec<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
/// One FUSE operation of a mount.
pub struct OpView {
    /// The operation's name.
    pub op: String,
    /// Operations since the mount.
    pub count: u64,
    /// Operations per second over the frame.
    pub per_s: f64,
    /// Median latency in microseconds (bucket upper bound).
    pub p50_us: u64,
    /// 99th percentile latency in microseconds (bucket upper bound).
    pub p99_us: u64,
}

#[derive(Debug, Clone, Serialize)]
/// One mount in a frame.
pub struct MountView {
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// The backing directory it drains to.
    pub backing: PathBuf,
    /// The process id.
    pub pid: u32,
    /// `sync` or `async`.
    pub mode: String,
    /// Capacity, use and dirty bytes per tier.
    pub tiers: Vec<TierUse>,
    #[serde(flatten)]
    /// The drain's backlog, rate and time to empty.
    pub drain: tierstack_fs::mount::DrainFigures,
    /// dirty_bytes / drain rate, when the drain moves.
    pub drain_eta_s: Option<f64>,
    /// Writers are being held back (the fast tier is full).
    pub backpressure: bool,
    /// Records the drain has quarantined.
    pub stuck: usize,
    /// The first quarantined record, as text.
    pub stuck_first: Option<String>,
    /// The fast tier's array health: state, rebuild progress, drives not online.
    pub array_state: String,
    /// Progress of an array rebuild, if one runs.
    pub rebuild_percent: Option<f64>,
    /// Drives of the array that are not online.
    pub drives_not_online: usize,
    /// The drain's last error.
    pub last_error: Option<String>,
    /// The daemon's own I/O (its drives, journal and the drain's writes to BACKING).
    pub read_bytes_per_s: f64,
    /// Bytes per second the process wrote to block devices over the frame.
    pub write_bytes_per_s: f64,
    /// Its FUSE operations.
    pub ops: Vec<OpView>,
    /// Names of the block devices holding its drives.
    pub devices: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
/// One `tierstack run` in a frame.
pub struct RunView {
    /// The `tierstack run` process.
    pub tierstack_pid: u32,
    /// The process id.
    pub pid: u32,
    /// The command line.
    pub cmd: String,
    /// The program still runs.
    pub alive: bool,
    /// Seconds since it started.
    pub uptime_s: u64,
    /// Its `--dram` budget in bytes.
    pub dram_budget_bytes: u64,
    /// Its page size in bytes.
    pub page_bytes: u64,
    /// The program's resident memory.
    pub rss_bytes: Option<u64>,
    /// The program's block I/O (its paging to the drives in its run folder, and its own I/O).
    pub read_bytes_per_s: f64,
    /// Bytes per second the process wrote to block devices over the frame.
    pub write_bytes_per_s: f64,
    /// Processes of the program paging now (they report about once a second).
    pub paging_processes: u64,
    /// Processes of the program that have exited and left their pager counters.
    pub exited_processes: u64,
    /// Faults served by tierstack so far (live and exited processes).
    pub faults: u64,
    /// Faults served per second over the frame.
    pub faults_per_s: f64,
    /// Bytes paged in since the start.
    pub bytes_paged_in: u64,
    /// Bytes paged out since the start.
    pub bytes_paged_out: u64,
    /// Time from a fault to the program's wake-up, for faults read from the store.
    pub mean_fault_us: Option<f64>,
    /// Median fault service time in microseconds.
    pub fault_p50_us: Option<u64>,
    /// 99th percentile fault service time in microseconds.
    pub fault_p99_us: Option<u64>,
    /// Names of the block devices holding its drives.
    pub devices: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
/// One block device in a frame.
pub struct DeviceView {
    /// The kernel's name (`vda`).
    pub device: String,
    /// MAJ:MIN.
    pub majmin: String,
    /// Bytes read per second over the frame.
    pub read_bytes_per_s: f64,
    /// Bytes per second the process wrote to block devices over the frame.
    pub write_bytes_per_s: f64,
    /// Reads per second.
    pub read_iops: f64,
    /// Writes per second.
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

/// The frame between two looks (rates over the time between them).
pub fn frame(prev: &Sample, cur: &Sample) -> Frame {
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

/// Bytes per second as MB/s text.
pub fn mbs(b: f64) -> String {
    format!("{:.1} MB/s", b / 1e6)
}

/// A time to empty as text (`-` when unknown).
pub fn eta(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 90.0 => format!("{s:.0} s"),
        Some(s) if s < 5400.0 => format!("{:.0} min", s / 60.0),
        Some(s) => format!("{:.1} h", s / 3600.0),
    }
}

/// The tiers of a mount on one line (use/capacity, dirty).
pub fn tiers_line(ts: &[TierUse]) -> String {
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

/// Parses `--interval` (`1s`, `500ms`, `2m`, a number of seconds: the grammar of every
/// duration), from 50 ms to 1 h.
pub fn parse_interval(s: &str) -> Result<Duration> {
    match tierstack_common::parse_duration(s) {
        Ok(d) if d >= Duration::from_millis(50) && d <= Duration::from_secs(3600) => Ok(d),
        _ => Err(NodeError::Usage(format!(
            "--interval {s} is not a duration from 50ms to 1h: give e.g. 1s, 500ms or 2"
        ))),
    }
}
