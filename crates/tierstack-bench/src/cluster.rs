//! `tierstack bench cluster`: seed 004's experiment at N nodes on the multi-node test bed
//! (`contrib/testbed/testbed.sh`, embedded in the binary): R ranks per node write a file per
//! process (and optionally many small files each) straight into a real shared file system
//! (MooseFS, rate-limited), and through a node-local tierstack mount on every node over that
//! same file system, drained at the end (`tierstack umount`, all nodes at once), once without
//! and, with `--slots K`, once with site-wide drain slots. A probe in the test bed's control
//! namespace (another job's client, on no compute node) creates, stats and removes a file in the shared system every 50 ms throughout: its
//! latency is what the drains cost everybody else. Everything written is read back from the
//! shared system after the caches are dropped and compared with what the ranks wrote.
//!
//! It needs root, /dev/fuse, the MooseFS packages and python3 (the ranks and the probe are
//! small Python programs, the same for every mode).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde::Serialize;

pub mod stage_in;

/// The longest one step (a mode's writes, its drains, the check) may take, in seconds.
const STEP_LIMIT: &str = "3600";

/// The test bed script, as the source tree has it.
const TESTBED: &str = include_str!("../../../contrib/testbed/testbed.sh");

/// One rank: its big file (a copy of the pattern, fsynced), then its small files.
const RANK_PY: &str = r#"
import os, sys, time, json
pat, out, name, nsmall, ssize, res = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
os.makedirs(out, exist_ok=True)
t0 = time.monotonic()
with open(pat, 'rb') as src, open(os.path.join(out, name), 'wb') as f:
    while True:
        b = src.read(1 << 20)
        if not b:
            break
        f.write(b)
    f.flush()
    os.fsync(f.fileno())
t1 = time.monotonic()
if nsmall:
    d = os.path.join(out, name + '.d')
    os.makedirs(d, exist_ok=True)
    with open(pat, 'rb') as src:
        sb = src.read(ssize)
    for k in range(nsmall):
        with open(os.path.join(d, 'f%d' % k), 'wb') as f:
            f.write(sb)
t2 = time.monotonic()
json.dump({'big_s': t1 - t0, 'small_s': t2 - t1}, open(res, 'w'))
"#;

/// The probe: create + fstat + close + unlink of one file every 50 ms until the stop file
/// appears; its latencies (ms) go to the result file.
const PROBE_PY: &str = r#"
import os, sys, time, json
d, stop, res = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(d, exist_ok=True)
lat = []
k = 0
while not os.path.exists(stop):
    p = os.path.join(d, 'p%d' % k)
    t = time.monotonic()
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    os.fstat(fd)
    os.close(fd)
    os.stat(p)
    os.unlink(p)
    lat.append((time.monotonic() - t) * 1e3)
    k += 1
    time.sleep(0.05)
json.dump(lat, open(res, 'w'))
"#;

/// The check: every rank's files in the shared system, compared with the pattern.
const VERIFY_PY: &str = r#"
import os, sys, json
pat, base, nodes, ranks, nsmall, ssize, res = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
want = open(pat, 'rb').read()
small = want[:ssize]
missing = wrong = files = nbytes = 0
for n in range(1, nodes + 1):
    for r in range(ranks):
        name = os.path.join(base, 'node%d' % n, 'r%d' % r)
        paths = [(name, want)] + [(os.path.join(name + '.d', 'f%d' % k), small) for k in range(nsmall)]
        for p, w in paths:
            files += 1
            try:
                got = open(p, 'rb').read()
            except OSError:
                missing += 1
                continue
            nbytes += len(got)
            if got != w:
                wrong += 1
json.dump({'files': files, 'missing': missing, 'wrong': wrong, 'bytes': nbytes}, open(res, 'w'))
"#;

/// Errors of the cluster benchmark: a step that failed, with what it printed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A step of the run failed.
    #[error("bench cluster: {step} failed: {msg}")]
    Step {
        /// The step.
        step: String,
        /// Why (the last lines the step printed).
        msg: String,
    },
}

fn step_err(step: impl Into<String>, msg: impl Into<String>) -> ClusterError {
    ClusterError::Step {
        step: step.into(),
        msg: msg.into(),
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The tierstack binary the nodes run.
    pub exe: PathBuf,
    /// The test bed's root folder (made and removed).
    pub root: PathBuf,
    /// Compute nodes (the probe runs in the test bed's control namespace).
    pub nodes: usize,
    /// Ranks per node.
    pub ranks: usize,
    /// Bytes of each rank's file.
    pub size_per_rank: u64,
    /// Small files per rank (0: none).
    pub small_files: usize,
    /// Bytes of each small file.
    pub small_size: usize,
    /// MB/s per chunkserver (the test bed's `--throttle`).
    pub throttle: u32,
    /// Chunkservers of the shared file system.
    pub chunkservers: usize,
    /// Also run the buffered mode with this many site-wide drain slots.
    pub slots: Option<u32>,
    /// Leave the test bed up at the end (for a look; `testbed.sh down --root ROOT` ends it).
    pub keep: bool,
    /// Instead of the writes: stage in this many input files of this many bytes each on every
    /// node, each node reading the shared system and by fan-out (`stage_in.rs`).
    pub stage_in: Option<(usize, u64)>,
}

/// Latency of the probe over one phase, ms.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ProbeFigures {
    /// Probes taken.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
}

fn probe_figures(mut v: Vec<f64>) -> ProbeFigures {
    if v.is_empty() {
        return ProbeFigures::default();
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    ProbeFigures {
        count: v.len(),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: v[v.len() - 1],
        mean_ms: v.iter().sum::<f64>() / v.len() as f64,
    }
}

/// One mode's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ModeReport {
    /// `direct`, `buffered`, or `buffered, K drain slots`.
    pub mode: String,
    /// Seconds from the ranks' start until the last rank's files were written (the job's
    /// output time).
    pub write_s: f64,
    /// Seconds from the ranks' start until everything was in the shared system (for the
    /// buffered modes: until every node's `tierstack umount` returned).
    pub in_shared_s: f64,
    /// The probe's latency while this mode ran (writes and drains).
    pub probe: ProbeFigures,
    /// Files checked in the shared system afterwards, and those missing or wrong.
    pub files: u64,
    /// Files missing in the shared system.
    pub missing: u64,
    /// Files whose bytes differ from what the rank wrote.
    pub wrong: u64,
    /// Bytes the shared system's disks wrote during the mode (the test bed's `io-stats`).
    pub shared_disk_written: u64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    /// Compute nodes.
    pub nodes: usize,
    /// Ranks per node.
    pub ranks: usize,
    /// Bytes of each rank's file.
    pub size_per_rank: u64,
    /// Small files per rank.
    pub small_files: usize,
    /// MB/s per chunkserver.
    pub throttle: u32,
    /// Chunkservers.
    pub chunkservers: usize,
    /// Seconds the test bed took to come up.
    pub up_s: f64,
    /// The probe with nothing else running.
    pub probe_idle: ProbeFigures,
    /// Each mode.
    pub modes: Vec<ModeReport>,
    /// The stage-in modes (`--stage-in`; then `modes` is empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage_in: Option<stage_in::StageInReport>,
}

struct Bed {
    script: PathBuf,
    root: PathBuf,
    keep: bool,
    up: bool,
}

fn tail(o: &Output) -> String {
    let mut s = String::from_utf8_lossy(&o.stderr).into_owned();
    s.push_str(&String::from_utf8_lossy(&o.stdout));
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(6)..].join(" | ")
}

impl Bed {
    fn run(&self, step: &str, args: &[&str]) -> Result<Output, ClusterError> {
        // Every step is bounded: a node that never answers ends the run with the step's name
        // (and `Drop` takes the test bed down) instead of holding it for ever.
        let o = Command::new("timeout")
            .args(["-k", "10", STEP_LIMIT])
            .arg("bash")
            .arg(&self.script)
            .args(args)
            .output()
            .map_err(|e| step_err(step, e.to_string()))?;
        if o.status.code() == Some(124) || o.status.code() == Some(137) {
            return Err(step_err(step, format!("no end after {STEP_LIMIT} s")));
        }
        if !o.status.success() {
            return Err(step_err(step, tail(&o)));
        }
        Ok(o)
    }

    /// Runs `cmd` (a shell line) on `target` (`node1`, `node1,node2`, `all`).
    fn exec(&self, step: &str, target: &str, cmd: &str) -> Result<Output, ClusterError> {
        let root = self.root.display().to_string();
        self.run(
            step,
            &["exec", "--root", &root, target, "--", "sh", "-c", cmd],
        )
    }

    fn root_arg(&self) -> String {
        self.root.display().to_string()
    }

    fn disk_written(&self) -> u64 {
        self.io_stat("TESTBED_IO_WRITE_BYTES")
    }

    /// One counter of the test bed's `io-stats` (lines KEY=VALUE; 0 when it cannot tell).
    fn io_stat(&self, key: &str) -> u64 {
        let root = self.root_arg();
        let Ok(o) = self.run("io-stats", &["io-stats", "--root", &root]) else {
            return 0;
        };
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .filter(|(k, _)| *k == key)
            .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
            .next()
            .unwrap_or(0)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if self.up && !self.keep {
            let _ = std::fs::remove_dir_all(self.root.join("bench"));
            let root = self.root_arg();
            let _ = Command::new("bash")
                .arg(&self.script)
                .args(["down", "--root", &root, "--quiet"])
                .output();
        }
    }
}

/// A probe running in a namespace of the test bed until [`Probe::stop`].
struct Probe<'a> {
    bed: &'a Bed,
    tag: String,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<'a> Probe<'a> {
    fn start(bed: &'a Bed, node: &str, tag: &str) -> Probe<'a> {
        let r = bed.root.join("bench");
        let r = r.display();
        let cmd = format!(
            "python3 {r}/probe.py /mnt/pfs/probe-{tag} {r}/results/stop-{tag} {r}/results/probe-{tag}.json"
        );
        let script = bed.script.clone();
        let root = bed.root_arg();
        let node = node.to_string();
        let thread = std::thread::spawn(move || {
            let _ = Command::new("timeout")
                .args(["-k", "10", STEP_LIMIT])
                .arg("bash")
                .arg(&script)
                .args(["exec", "--root", &root, &node, "--", "sh", "-c", &cmd])
                .output();
        });
        // Its first probes before anything starts.
        std::thread::sleep(Duration::from_millis(300));
        Probe {
            bed,
            tag: tag.to_string(),
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> ProbeFigures {
        let r = &self.bed.root.join("bench");
        let _ = std::fs::write(r.join(format!("results/stop-{}", self.tag)), b"");
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let text = std::fs::read_to_string(r.join(format!("results/probe-{}.json", self.tag)))
            .unwrap_or_default();
        probe_figures(serde_json::from_str::<Vec<f64>>(&text).unwrap_or_default())
    }
}

/// The deterministic bytes every rank writes (and the check compares with).
fn write_pattern(path: &Path, size: u64) -> std::io::Result<()> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut buf = Vec::with_capacity(size as usize);
    while (buf.len() as u64) < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf.extend_from_slice(&x.to_le_bytes());
    }
    buf.truncate(size as usize);
    std::fs::write(path, buf)
}

/// Runs the benchmark.
pub fn run(spec: &ClusterSpec) -> Result<ClusterReport, ClusterError> {
    std::fs::create_dir_all(&spec.root)
        .map_err(|e| step_err(format!("making {}", spec.root.display()), e.to_string()))?;
    let script = spec.root.join("testbed.sh");
    std::fs::write(&script, TESTBED)
        .map_err(|e| step_err(format!("writing {}", script.display()), e.to_string()))?;
    // It runs itself again for `exec` on several nodes.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| step_err("making the test bed script executable", e.to_string()))?;
    }
    // The test bed's own root is a folder below ours (it removes what it made).
    let mut bed = Bed {
        script,
        root: spec.root.join("bed"),
        keep: spec.keep,
        up: false,
    };
    let t0 = Instant::now();
    let (nodes, cs, thr) = (
        spec.nodes.to_string(),
        spec.chunkservers.to_string(),
        spec.throttle.to_string(),
    );
    let broot = bed.root_arg();
    bed.up = true;
    bed.run(
        "bringing the test bed up",
        &[
            "up",
            "--root",
            &broot,
            "--nodes",
            &nodes,
            "--chunkservers",
            &cs,
            "--throttle",
            &thr,
            "--quiet",
        ],
    )?;
    // The programs, the pattern and the results go inside the test bed's root, which every
    // node sees at the same path (a folder under /var/tmp or /tmp would be each node's own).
    let work = bed.root.join("bench");
    let root = &work;
    std::fs::create_dir_all(root.join("results"))
        .map_err(|e| step_err(format!("making {}", root.display()), e.to_string()))?;
    for (name, text) in [
        ("rank.py", RANK_PY),
        ("probe.py", PROBE_PY),
        ("verify.py", VERIFY_PY),
    ] {
        let p = root.join(name);
        std::fs::write(&p, text)
            .map_err(|e| step_err(format!("writing {}", p.display()), e.to_string()))?;
    }
    write_pattern(&root.join("pattern"), spec.size_per_rank)
        .map_err(|e| step_err("writing the ranks' pattern", e.to_string()))?;
    let up_s = t0.elapsed().as_secs_f64();
    if let Some((files, size)) = spec.stage_in {
        let si = stage_in::run(&bed, spec, files, size)?;
        return Ok(ClusterReport {
            nodes: spec.nodes,
            ranks: 0,
            size_per_rank: 0,
            small_files: 0,
            throttle: spec.throttle,
            chunkservers: spec.chunkservers,
            up_s,
            probe_idle: ProbeFigures::default(),
            modes: Vec::new(),
            stage_in: Some(si),
        });
    }
    // The probe runs in the test bed's control namespace (it mounts the shared system too):
    // another job's client, on no compute node, so all 8 of the bed's nodes can compute.
    let probe_node = "ctl".to_string();
    let compute: Vec<String> = (1..=spec.nodes).map(|i| format!("node{i}")).collect();
    let compute = compute.join(",");

    // The probe alone.
    let idle = Probe::start(&bed, &probe_node, "idle");
    std::thread::sleep(Duration::from_secs(3));
    let probe_idle = idle.stop();

    let mut modes = Vec::new();
    let mut plan: Vec<(String, Option<u32>)> =
        vec![("direct".into(), None), ("buffered".into(), None)];
    if let Some(k) = spec.slots {
        plan.push((format!("buffered, {k} drain slots"), Some(k)));
    }
    for (i, (mode, slots)) in plan.into_iter().enumerate() {
        let tag = format!("m{i}");
        let direct = i == 0;
        let base = format!("/mnt/pfs/{tag}");
        bed.exec(
            "making the output folder",
            "node1",
            &format!("mkdir -p {base}"),
        )?;
        if !direct {
            let mut m = format!(
                "mkdir -p /mnt/bb && {} mount {base} /mnt/bb --dir /var/tmp/bb",
                spec.exe.display()
            );
            if let Some(k) = slots {
                // The nodes run one job: one drain group, as the SLURM hooks give a job.
                m += &format!(
                    " --drain-slots {k} --drain-slots-dir /mnt/pfs/.tierstack-drain-slots \
                     --drain-group bench-{tag}-{}",
                    std::process::id()
                );
            }
            bed.exec("mounting tierstack on every node", &compute, &m)?;
        }
        let written0 = bed.disk_written();
        let probe = Probe::start(&bed, &probe_node, &tag);
        let r = root.display();
        let ranks: Vec<String> = (0..spec.ranks)
            .map(|j| {
                let out = if direct {
                    format!("{base}/$(hostname)")
                } else {
                    "/mnt/bb/$(hostname)".to_string()
                };
                format!(
                    "python3 {r}/rank.py {r}/pattern {out} r{j} {} {} {r}/results/{tag}-$(hostname)-r{j}.json &",
                    spec.small_files, spec.small_size
                )
            })
            .collect();
        let job = format!("{} wait", ranks.join(" "));
        let t = Instant::now();
        bed.exec("the ranks' writes", &compute, &job)?;
        let write_s = t.elapsed().as_secs_f64();
        if !direct {
            bed.exec(
                "tierstack umount on every node (the drain)",
                &compute,
                &format!("{} umount /mnt/bb --timeout 30m", spec.exe.display()),
            )?;
        }
        let in_shared_s = t.elapsed().as_secs_f64();
        let probe = probe.stop();
        let shared_disk_written = bed.disk_written().saturating_sub(written0);
        bed.run("dropping caches", &["drop-caches", "--root", &broot])?;
        bed.exec(
            "reading everything back from the shared system",
            &probe_node,
            &format!(
                "python3 {r}/verify.py {r}/pattern {base} {} {} {} {} {r}/results/verify-{tag}.json",
                spec.nodes, spec.ranks, spec.small_files, spec.small_size
            ),
        )?;
        let v: serde_json::Value =
            std::fs::read_to_string(root.join(format!("results/verify-{tag}.json")))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .ok_or_else(|| step_err("reading the check's result", "no result"))?;
        let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        modes.push(ModeReport {
            mode,
            write_s,
            in_shared_s,
            probe,
            files: n("files"),
            missing: n("missing"),
            wrong: n("wrong"),
            shared_disk_written,
        });
    }
    Ok(ClusterReport {
        nodes: spec.nodes,
        ranks: spec.ranks,
        size_per_rank: spec.size_per_rank,
        small_files: spec.small_files,
        throttle: spec.throttle,
        chunkservers: spec.chunkservers,
        up_s,
        probe_idle,
        modes,
        stage_in: None,
    })
}

/// The report as a table.
pub fn table(r: &ClusterReport) -> String {
    if let Some(si) = &r.stage_in {
        return format!(
            "bench cluster: {} nodes, MooseFS with {} chunkservers at {} MB/s each (test bed up in {:.1} s)\n{}",
            r.nodes,
            r.chunkservers,
            r.throttle,
            r.up_s,
            stage_in::table(si)
        );
    }
    let mut s = format!(
        "bench cluster: {} nodes x {} ranks, {} per rank{}, MooseFS with {} chunkservers at {} MB/s each (test bed up in {:.1} s)\n",
        r.nodes,
        r.ranks,
        crate::fmt_size(r.size_per_rank),
        if r.small_files > 0 {
            format!(" + {} small files", r.small_files)
        } else {
            String::new()
        },
        r.chunkservers,
        r.throttle,
        r.up_s
    );
    s += &format!(
        "probe (create+stat+unlink in the shared system) idle: p50 {:.2} ms, p99 {:.2} ms\n",
        r.probe_idle.p50_ms, r.probe_idle.p99_ms
    );
    s += &format!(
        "{:<28} {:>9} {:>13} {:>10} {:>10} {:>10} {:>8}\n",
        "mode", "write s", "in shared s", "probe p50", "probe p99", "probe max", "check"
    );
    for m in &r.modes {
        s += &format!(
            "{:<28} {:>9.2} {:>13.2} {:>10.2} {:>10.2} {:>10.2} {:>8}\n",
            m.mode,
            m.write_s,
            m.in_shared_s,
            m.probe.p50_ms,
            m.probe.p99_ms,
            m.probe.max_ms,
            if m.missing == 0 && m.wrong == 0 {
                format!("{} ok", m.files)
            } else {
                format!("{}m/{}w", m.missing, m.wrong)
            }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_percentiles() {
        let f = probe_figures((1..=100).map(f64::from).collect());
        assert_eq!(f.count, 100);
        assert_eq!(f.max_ms, 100.0);
        assert!((f.p50_ms - 50.0).abs() <= 1.0);
        assert!(f.p99_ms >= 98.0);
        assert_eq!(probe_figures(Vec::new()).count, 0);
    }

    #[test]
    fn the_pattern_is_not_zeros_and_has_its_size() {
        let d = tempfile::tempdir().expect("tmp");
        let p = d.path().join("p");
        write_pattern(&p, 1000).expect("write");
        let b = std::fs::read(&p).expect("read");
        assert_eq!(b.len(), 1000);
        assert!(b.iter().filter(|x| **x == 0).count() < 100);
    }
}
