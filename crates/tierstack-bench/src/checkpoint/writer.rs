//! The writer processes of the checkpoint benchmark.
//!
//! N writer processes (`tierstack bench checkpoint-writer SPEC`) each create one file, write
//! it with 1 MiB writes and fsync it. They are started together: each prints `ready` once it
//! is set up and then blocks reading its stdin, a pipe whose write end the parent closes to
//! start them all at once. The output time runs from that moment until the last writer's
//! fsync returned (CLOCK_MONOTONIC stamps taken in the writers).

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{io_err, monotonic_ns, CheckpointError, Result, BLOCK};

/// What one writer process does (passed as JSON on its command line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriterSpec {
    /// The file to create and write.
    pub path: PathBuf,
    /// Bytes to write.
    pub size: u64,
    /// cgroup.procs file to join before anything else.
    pub cgroup_procs: Option<PathBuf>,
    /// Seed of the data written (each writer gets its own).
    pub seed: u64,
}

/// What one writer reports (one JSON line on stdout).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriterReport {
    /// When it was released (CLOCK_MONOTONIC ns).
    pub start_ns: u64,
    /// When its fsync returned.
    pub done_ns: u64,
    /// Bytes it wrote.
    pub bytes: u64,
    /// xxh3-64 of what it wrote (computed after its fsync, outside the timing).
    pub xxh3: u64,
}

/// Runs one writer: joins the cgroup, says `ready` on `out`, waits for end of file on `go`,
/// then creates, writes and fsyncs its file, and reports on `out`.
pub fn run_writer(spec: &WriterSpec, mut go: impl Read, mut out: impl Write) -> Result<()> {
    if let Some(p) = &spec.cgroup_procs {
        fs::write(p, std::process::id().to_string()).map_err(io_err("join the cgroup", p))?;
    }
    // Not all-zero, different in every file and block.
    let mut buf = vec![0u8; BLOCK];
    let mut x = spec.seed | 1;
    for c in buf.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
    let stdout = Path::new("stdout");
    writeln!(out, "ready")
        .and_then(|_| out.flush())
        .map_err(io_err("write to", stdout))?;
    let mut b = [0u8; 64];
    loop {
        match go.read(&mut b) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("wait on", Path::new("stdin"))(e).into()),
        }
    }
    let start_ns = monotonic_ns();
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&spec.path)
        .map_err(io_err("create", &spec.path))?;
    let mut left = spec.size;
    let mut block = 0u64;
    while left > 0 {
        let n = left.min(BLOCK as u64) as usize;
        buf[..8].copy_from_slice(&block.to_le_bytes());
        f.write_all(&buf[..n])
            .map_err(io_err("write", &spec.path))?;
        left -= n as u64;
        block += 1;
    }
    f.sync_all().map_err(io_err("fsync", &spec.path))?;
    let done_ns = monotonic_ns();
    drop(f);
    // The same bytes again, hashed.
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut left = spec.size;
    let mut block = 0u64;
    while left > 0 {
        let n = left.min(BLOCK as u64) as usize;
        buf[..8].copy_from_slice(&block.to_le_bytes());
        h.update(&buf[..n]);
        left -= n as u64;
        block += 1;
    }
    let r = WriterReport {
        start_ns,
        done_ns,
        bytes: spec.size,
        xxh3: h.digest(),
    };
    let line = serde_json::to_string(&r).map_err(|e| CheckpointError::Setup(e.to_string()))?;
    Ok(writeln!(out, "{line}")
        .and_then(|_| out.flush())
        .map_err(io_err("write to", stdout))?)
}

// ---------------------------------------------------------------------------------------------
// One output phase: N writers into one directory

/// Children that are killed and reaped unless they finished.
struct Writers(Vec<(Child, Option<BufReader<ChildStdout>>)>);

impl Drop for Writers {
    fn drop(&mut self) {
        for (c, _) in &mut self.0 {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

fn child_stderr(c: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = c.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    let s = s.trim();
    let s = s.strip_prefix("tierstack: error: ").unwrap_or(s);
    if s.is_empty() {
        "it ended without a message (killed?)".to_string()
    } else {
        s.lines().last().unwrap_or(s).to_string()
    }
}

/// Result of one output phase.
#[derive(Debug, Clone)]
pub struct Phase {
    /// CLOCK_MONOTONIC ns of the release of the writers.
    pub start_ns: u64,
    /// From the release of the writers to the last fsync.
    pub output_s: f64,
    /// CLOCK_MONOTONIC ns of the last fsync.
    pub end_ns: u64,
    /// Bytes written by all writers together.
    pub bytes: u64,
    /// xxh3-64 of each writer's file, by index.
    pub hashes: Vec<u64>,
}

/// Runs `procs` writers into `dir` (files `ckpt.00000` ...), started together.
pub fn run_phase(
    exe: &Path,
    dir: &Path,
    procs: usize,
    size: u64,
    cgroup_procs: Option<&Path>,
    cancel: &AtomicBool,
) -> Result<Phase> {
    use rustix::pipe::{pipe_with, PipeFlags};
    let (go_r, go_w) = pipe_with(PipeFlags::CLOEXEC)
        .map_err(|e| CheckpointError::Setup(format!("cannot create the start pipe: {e}")))?;
    let mut w = Writers(Vec::with_capacity(procs));
    for i in 0..procs {
        if cancel.load(Ordering::Relaxed) {
            return Err(CheckpointError::Cancelled);
        }
        let spec = WriterSpec {
            path: dir.join(format!("ckpt.{i:05}")),
            size,
            cgroup_procs: cgroup_procs.map(Path::to_path_buf),
            seed: 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1),
        };
        let json =
            serde_json::to_string(&spec).map_err(|e| CheckpointError::Setup(e.to_string()))?;
        let stdin = go_r
            .try_clone()
            .map_err(|e| CheckpointError::Setup(format!("cannot share the start pipe: {e}")))?;
        let mut c = Command::new(exe)
            .args(["bench", "checkpoint-writer", &json])
            .stdin(Stdio::from(stdin))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| CheckpointError::Writer {
                index: i,
                msg: format!(
                    "cannot start {}: {e} (too many processes? lower --procs)",
                    exe.display()
                ),
            })?;
        let out = c.stdout.take().map(BufReader::new);
        w.0.push((c, out));
    }
    drop(go_r);
    // On cancel, a watcher kills the writers (ours, and not reaped before the watcher ends,
    // so their pids cannot have been reused).
    let pids: Vec<i32> = w.0.iter().map(|(c, _)| c.id() as i32).collect();
    let done = AtomicBool::new(false);
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                if cancel.load(Ordering::Relaxed) {
                    for p in pids
                        .iter()
                        .filter_map(|&p| rustix::process::Pid::from_raw(p))
                    {
                        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                    }
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let r = release_and_collect(&mut w, go_w, cancel);
        done.store(true, Ordering::Relaxed);
        r
    });
    drop(w); // Reaps them.
    r
}

/// Waits until every writer is set up, releases them, and collects their reports.
fn release_and_collect(
    w: &mut Writers,
    go_w: std::os::fd::OwnedFd,
    cancel: &AtomicBool,
) -> Result<Phase> {
    for (i, (c, out)) in w.0.iter_mut().enumerate() {
        let mut line = String::new();
        let ok = out
            .as_mut()
            .map(|o| o.read_line(&mut line).is_ok() && line.trim() == "ready")
            .unwrap_or(false);
        if !ok {
            if cancel.load(Ordering::Relaxed) {
                return Err(CheckpointError::Cancelled);
            }
            return Err(CheckpointError::Writer {
                index: i,
                msg: child_stderr(c),
            });
        }
    }
    let t0 = monotonic_ns();
    drop(go_w); // Go.
    let mut end_ns = t0;
    let mut bytes = 0;
    let mut failure = None;
    let mut hashes = Vec::with_capacity(w.0.len());
    for (i, (c, out)) in w.0.iter_mut().enumerate() {
        let mut line = String::new();
        let rep = out
            .as_mut()
            .and_then(|o| o.read_line(&mut line).ok())
            .and_then(|_| serde_json::from_str::<WriterReport>(line.trim()).ok());
        match rep {
            Some(r) => {
                end_ns = end_ns.max(r.done_ns);
                bytes += r.bytes;
                hashes.push(r.xxh3);
            }
            None => {
                if failure.is_none() {
                    failure = Some(CheckpointError::Writer {
                        index: i,
                        msg: child_stderr(c),
                    });
                }
            }
        }
    }
    if cancel.load(Ordering::Relaxed) {
        return Err(CheckpointError::Cancelled);
    }
    if let Some(f) = failure {
        return Err(f);
    }
    Ok(Phase {
        start_ns: t0,
        output_s: (end_ns - t0) as f64 / 1e9,
        end_ns,
        bytes,
        hashes,
    })
}
