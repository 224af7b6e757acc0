//! `tierstack bench meta`: the mdtest method. N worker processes (`tierstack bench
//! meta-worker SPEC`) each own `files` files, in a directory of their own (`--unique`, the
//! default) or all in one shared directory; the phases run in order (create: create + write
//! `bytes` + close; stat; read: open + read + close; unlink), every worker starting a phase at
//! the same time (each waits for a `go` line on its stdin; the parent sends it to all once
//! all have reported the phase before). A phase's rate is all the workers' operations over the
//! time from the first worker's start to the last one's end (CLOCK_MONOTONIC stamps taken in
//! the workers), as mdtest reports it.
//!
//! The same run goes to the plain folder (`--target`) and, with `--mount`, through a fresh
//! tierstack mount over a subfolder of it (made with `tierstack mount`, drained and unmounted
//! afterwards through the CLI contract); the report gives both and their ratio.

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checkpoint::{monotonic_ns, CheckpointError};

/// The phases, in order.
pub const PHASES: [&str; 4] = ["create", "stat", "read", "unlink"];

/// What one worker does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    /// The directory its files go in (made by the parent).
    pub dir: PathBuf,
    /// Name prefix of its files (unique per worker).
    pub prefix: String,
    /// Number of files it creates, stats, reads and unlinks.
    pub files: usize,
    /// Bytes written to each file and read back.
    pub bytes: usize,
}

/// One phase of one worker: CLOCK_MONOTONIC ns.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Stamp {
    /// When the worker started the phase.
    pub start_ns: u64,
    /// When the worker finished the phase.
    pub end_ns: u64,
}

/// A worker: waits for `go`, runs the next phase, prints its stamps as one JSON line.
pub fn run_worker(spec: &WorkerSpec, go: impl Read, mut out: impl Write) -> io::Result<()> {
    let mut go = BufReader::new(go);
    let data = vec![0x5au8; spec.bytes];
    let path = |i: usize| spec.dir.join(format!("{}{i}", spec.prefix));
    writeln!(out, "ready")?;
    out.flush()?;
    for phase in PHASES {
        let mut line = String::new();
        if go.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let start_ns = monotonic_ns();
        for i in 0..spec.files {
            let p = path(i);
            match phase {
                "create" => {
                    let mut f = fs::File::create(&p)?;
                    f.write_all(&data)?;
                }
                "stat" => {
                    fs::metadata(&p)?;
                }
                "read" => {
                    let mut f = fs::File::open(&p)?;
                    let mut buf = Vec::with_capacity(spec.bytes);
                    f.read_to_end(&mut buf)?;
                    if buf.len() != spec.bytes {
                        return Err(io::Error::other(format!(
                            "{} holds {} bytes, {} written",
                            p.display(),
                            buf.len(),
                            spec.bytes
                        )));
                    }
                }
                _ => fs::remove_file(&p)?,
            }
        }
        let s = Stamp {
            start_ns,
            end_ns: monotonic_ns(),
        };
        writeln!(
            out,
            "{}",
            serde_json::to_string(&s).map_err(io::Error::other)?
        )?;
        out.flush()?;
    }
    Ok(())
}

/// How to run the benchmark.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `tierstack` binary.
    pub exe: PathBuf,
    /// Number of worker processes (1 to 1024).
    pub procs: usize,
    /// Files per worker (at least 1).
    pub files: usize,
    /// Bytes written to each file and read back.
    pub bytes: usize,
    /// All workers in one directory instead of one each.
    pub shared: bool,
    /// The plain folder.
    pub target: PathBuf,
    /// Also through a tierstack mount over a subfolder of `target`.
    pub mount: bool,
    /// Work folder for the mount point and its fast tier.
    pub dir: PathBuf,
    /// `tierstack mount --mode` for the mount (None: the mount's default).
    pub mode: Option<String>,
    /// `tierstack mount --transport` for the mount (None: the mount's default).
    pub transport: Option<String>,
    /// With `mount`: also through the same mount with the interception client
    /// (`tierstack exec MOUNT -- worker`, libtierstack_io.so).
    pub client: bool,
    /// Limit for one target's four phases: past it (or on Ctrl-C) the workers are killed and
    /// the run fails with a message, rather than wait on a hung file system.
    pub timeout: Duration,
}

/// The rates of one target.
#[derive(Debug, Clone, Serialize)]
pub struct TargetResult {
    /// `plain` (the folder) or `tierstack mount`.
    pub target: String,
    /// Files created, written and closed per second, all workers together. Every rate is all
    /// the files over the time from the first worker's start of the phase to the last one's end.
    pub create_per_s: f64,
    /// Stats per second.
    pub stat_per_s: f64,
    /// Opens, reads and closes per second (one file each).
    pub read_per_s: f64,
    /// Unlinks per second.
    pub unlink_per_s: f64,
    /// With the mount: seconds from the end of the unlink phase until the drain was done.
    pub drain_s: Option<f64>,
    /// With the mount: how requests reached its daemon ("io_uring", "/dev/fuse").
    pub transport: Option<String>,
}

/// The result of `bench meta` (its JSON output).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Number of worker processes.
    pub procs: usize,
    /// Files per worker.
    pub files_per_proc: usize,
    /// Bytes in each file.
    pub bytes: usize,
    /// Whether all workers used one shared directory (else one directory each).
    pub shared_dir: bool,
    /// One result per target: the plain folder first, then the mount if it ran.
    pub results: Vec<TargetResult>,
    /// mount / plain, by phase, when both ran.
    pub ratios: Option<[f64; 4]>,
    /// mount with the interception client / plain, by phase, when it ran.
    pub client_ratios: Option<[f64; 4]>,
}

/// `b` / `a`, phase by phase.
fn ratios_of(a: &TargetResult, b: &TargetResult) -> [f64; 4] {
    [
        b.create_per_s / a.create_per_s,
        b.stat_per_s / a.stat_per_s,
        b.read_per_s / a.read_per_s,
        b.unlink_per_s / a.unlink_per_s,
    ]
}

struct Workers(Vec<(Child, ChildStdin, BufReader<ChildStdout>)>);

impl Drop for Workers {
    fn drop(&mut self) {
        for (c, _, _) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn setup_err(msg: String) -> CheckpointError {
    CheckpointError::Setup(msg)
}

/// Runs the four phases in `root` and returns the rates. A watchdog kills the workers past
/// `cfg.timeout` or on Ctrl-C, so no read below waits for ever.
fn run_target(
    cfg: &Config,
    root: &Path,
    name: &str,
    via: Option<&Path>,
    cancel: &AtomicBool,
) -> Result<TargetResult, CheckpointError> {
    let mut w = Workers(Vec::new());
    let done = AtomicBool::new(false);
    let killed = AtomicBool::new(false);
    let pids = std::sync::Mutex::new(Vec::<u32>::new());
    let r = std::thread::scope(|sc| {
        sc.spawn(|| {
            let t0 = std::time::Instant::now();
            while !done.load(Ordering::Relaxed) {
                if t0.elapsed() > cfg.timeout || cancel.load(Ordering::Relaxed) {
                    killed.store(true, Ordering::Relaxed);
                    for &p in pids.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                        if let Some(p) = rustix::process::Pid::from_raw(p as i32) {
                            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                        }
                    }
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let r = phases(cfg, root, name, via, &mut w, &pids);
        done.store(true, Ordering::Relaxed);
        r
    });
    drop(w);
    if killed.load(Ordering::Relaxed) {
        return Err(setup_err(if cancel.load(Ordering::Relaxed) {
            "interrupted: the workers were stopped and their files removed".into()
        } else {
            format!(
                "the {name} run did not finish within {} s: the file system is stuck or slow; raise --timeout or look at `tierstack status`",
                cfg.timeout.as_secs()
            )
        }));
    }
    r
}

/// `via`: the mount whose interception client the workers run under.
fn phases(
    cfg: &Config,
    root: &Path,
    name: &str,
    via: Option<&Path>,
    w: &mut Workers,
    pids: &std::sync::Mutex<Vec<u32>>,
) -> Result<TargetResult, CheckpointError> {
    for i in 0..cfg.procs {
        let dir = if cfg.shared {
            root.to_path_buf()
        } else {
            root.join(format!("rank{i}"))
        };
        fs::create_dir_all(&dir)
            .map_err(|e| setup_err(format!("cannot create {}: {e}", dir.display())))?;
        let spec = WorkerSpec {
            dir,
            prefix: format!("f.{i}."),
            files: cfg.files,
            bytes: cfg.bytes,
        };
        let json = serde_json::to_string(&spec).map_err(|e| setup_err(e.to_string()))?;
        let mut c = Command::new(&cfg.exe);
        if let Some(mnt) = via {
            c.arg("exec").arg(mnt).arg("--").arg(&cfg.exe);
        }
        let mut c = c
            .args(["bench", "meta-worker", &json])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| setup_err(format!("cannot start a worker: {e}")))?;
        pids.lock().unwrap_or_else(|e| e.into_inner()).push(c.id());
        let (Some(stdin), Some(stdout)) = (c.stdin.take(), c.stdout.take()) else {
            return Err(setup_err("a worker has no pipes".into()));
        };
        w.0.push((c, stdin, BufReader::new(stdout)));
    }
    let mut line = String::new();
    for (_, _, out) in &mut w.0 {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 || line.trim() != "ready" {
            return Err(setup_err("a worker did not start".into()));
        }
    }
    let mut rates = [0f64; 4];
    for (k, phase) in PHASES.iter().enumerate() {
        for (_, stdin, _) in &mut w.0 {
            writeln!(stdin, "go")
                .and_then(|_| stdin.flush())
                .map_err(|e| setup_err(format!("a worker stopped before {phase}: {e}")))?;
        }
        let (mut first, mut last) = (u64::MAX, 0u64);
        for (_, _, out) in &mut w.0 {
            line.clear();
            if out.read_line(&mut line).unwrap_or(0) == 0 {
                return Err(setup_err(format!(
                    "a worker failed in the {phase} phase (its error is above)"
                )));
            }
            let s: Stamp = serde_json::from_str(line.trim())
                .map_err(|e| setup_err(format!("bad worker report: {e}")))?;
            first = first.min(s.start_ns);
            last = last.max(s.end_ns);
        }
        let secs = last.saturating_sub(first).max(1) as f64 / 1e9;
        rates[k] = (cfg.procs * cfg.files) as f64 / secs;
    }
    for (c, _, _) in &mut w.0 {
        let _ = c.wait();
    }
    w.0.clear();
    Ok(TargetResult {
        target: name.to_string(),
        create_per_s: rates[0],
        stat_per_s: rates[1],
        read_per_s: rates[2],
        unlink_per_s: rates[3],
        drain_s: None,
        transport: None,
    })
}

/// Runs the benchmark on the plain folder and, with `mount`, through a tierstack mount.
pub fn run(cfg: &Config, cancel: &AtomicBool) -> Result<Report, CheckpointError> {
    if cfg.procs == 0 || cfg.procs > 1024 {
        return Err(setup_err(format!(
            "--procs {} is out of range: use 1 to 1024",
            cfg.procs
        )));
    }
    if cfg.files == 0 {
        return Err(setup_err("--files must be at least 1".into()));
    }
    if !cfg.target.is_dir() {
        return Err(setup_err(format!(
            "--target {} is not a directory: create it or give another",
            cfg.target.display()
        )));
    }
    let pid = std::process::id();
    let plain = cfg.target.join(format!("meta-{pid}-plain"));
    let r = run_target(cfg, &plain, "plain", None, cancel);
    let _ = fs::remove_dir_all(&plain);
    let mut results = vec![r?];
    if cfg.mount {
        let work = cfg.dir.join(format!("tierstack-meta-{pid}"));
        let backing = cfg.target.join(format!("meta-{pid}-backing"));
        let (mnt, fast) = (work.join("mnt"), work.join("fast"));
        for d in [&mnt, &fast, &backing] {
            fs::create_dir_all(d)
                .map_err(|e| setup_err(format!("cannot create {}: {e}", d.display())))?;
        }
        let r = (|| {
            let mut m = crate::checkpoint::mounted::Mounted::mount(
                &cfg.exe,
                &backing,
                &mnt,
                &fast,
                crate::checkpoint::mounted::MountOpts {
                    mode: cfg.mode.as_deref(),
                    transport: cfg.transport.as_deref(),
                    ..Default::default()
                },
                cancel,
            )?;
            let mut r = vec![run_target(
                cfg,
                &mnt.join("bench"),
                "tierstack mount",
                None,
                cancel,
            )?];
            if cfg.client {
                let root = mnt.join("bench-client");
                let name = "tierstack mount + client";
                r.push(run_target(cfg, &root, name, Some(&mnt), cancel)?);
            }
            let t0 = monotonic_ns();
            m.drain_wait(cancel, Duration::from_secs(600))?;
            r[0].drain_s = Some(monotonic_ns().saturating_sub(t0) as f64 / 1e9);
            r[0].transport = m.transport.clone();
            m.close()?;
            Ok::<_, CheckpointError>(r)
        })();
        let _ = fs::remove_dir_all(&backing);
        if let Err(e) = crate::checkpoint::cmd::remove_work_folder(&work) {
            tracing_free_warn(&e.to_string());
        }
        results.extend(r?);
    }
    let ratios = results.get(1).map(|m| ratios_of(&results[0], m));
    let client_ratios = results.get(2).map(|c| ratios_of(&results[0], c));
    Ok(Report {
        procs: cfg.procs,
        files_per_proc: cfg.files,
        bytes: cfg.bytes,
        shared_dir: cfg.shared,
        results,
        ratios,
        client_ratios,
    })
}

/// A teardown problem after the figures were taken: said on stderr, not fatal.
fn tracing_free_warn(msg: &str) {
    eprintln!("tierstack: warning: {msg}");
}

/// The mdtest-style table.
pub fn render(r: &Report) -> String {
    let mut out = format!(
        "bench meta: {} processes x {} files of {} bytes, {} directory\n\n",
        r.procs,
        r.files_per_proc,
        r.bytes,
        if r.shared_dir {
            "one shared"
        } else {
            "a unique"
        }
    );
    let mut header = vec!["operation"];
    for t in &r.results {
        header.push(match t.target.as_str() {
            "plain" => "plain folder /s",
            "tierstack mount" => "tierstack mount /s",
            _ => "mount + client /s",
        });
    }
    if r.ratios.is_some() {
        header.push("mount / plain");
    }
    if r.client_ratios.is_some() {
        header.push("client / plain");
    }
    let mut rows = Vec::new();
    for (k, phase) in PHASES.iter().enumerate() {
        let mut row = vec![phase.to_string()];
        for t in &r.results {
            let v = [t.create_per_s, t.stat_per_s, t.read_per_s, t.unlink_per_s][k];
            row.push(format!("{v:.0}"));
        }
        for x in [r.ratios, r.client_ratios].into_iter().flatten() {
            row.push(format!("{:.2}", x[k]));
        }
        rows.push(row);
    }
    out.push_str(&crate::table::render(&header, &rows));
    if let Some(d) = r.results.iter().find_map(|t| t.drain_s) {
        out.push_str(&format!(
            "\ndrain after the unlink phase: {d:.2} s (until BACKING held the mount's end state)\n"
        ));
    }
    if let Some(t) = r.results.iter().find_map(|t| t.transport.as_deref()) {
        out.push_str(&format!("the mount's FUSE transport: {t}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_runs_every_phase_on_its_files() {
        let t = tempfile::tempdir().expect("tempdir");
        let spec = WorkerSpec {
            dir: t.path().to_path_buf(),
            prefix: "f.0.".into(),
            files: 5,
            bytes: 10,
        };
        let go = "go\ngo\ngo\ngo\n".as_bytes();
        let mut out = Vec::new();
        run_worker(&spec, go, &mut out).expect("worker");
        let text = String::from_utf8(out).expect("utf8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert_eq!(lines[0], "ready");
        for l in &lines[1..] {
            let s: Stamp = serde_json::from_str(l).expect("stamp");
            assert!(s.end_ns >= s.start_ns);
        }
        assert_eq!(fs::read_dir(t.path()).expect("list").count(), 0);
    }
}
