//! The runs of this node: the record each `tierstack run` leaves in the runtime folder while
//! its program runs, and the pager counters its processes publish in its run folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tierstack_fs::mount as fsmount;

/// What `tierstack run` leaves in `run_dir()/run/<tierstack pid>.json` while its program runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// The `tierstack run` process.
    pub tierstack_pid: u32,
    /// The program it started.
    pub pid: u32,
    /// The command line.
    pub cmd: String,
    /// Its `--dram` budget in bytes.
    pub dram_bytes: u64,
    /// Its page size in bytes.
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

/// The live runs' records; records (and run folders) of runs that were killed go.
pub fn read_runs() -> Vec<RunRecord> {
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
    /// The per-pass figures of swept regions (`tierstack_mem::SweepStats`) of the process
    /// that reported the most passes (passes of different processes are not merged).
    pub sweeps: Option<serde_json::Value>,
}

impl RunCounters {
    /// The summed counter `k` (0 when no process reported it).
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
            if let Some(s) = o.get("sweeps").filter(|s| s.is_object()) {
                let n = |v: &serde_json::Value| v["sweeps"].as_u64().unwrap_or(0);
                if rc.sweeps.as_ref().is_none_or(|b| n(s) > n(b)) {
                    rc.sweeps = Some(s.clone());
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
