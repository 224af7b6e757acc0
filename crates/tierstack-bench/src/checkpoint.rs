//! `tierstack bench checkpoint`: seed 004's file-per-process checkpoint experiment.
//!
//! N writer processes (`tierstack bench checkpoint-writer SPEC`) each create one file, write
//! it with 1 MiB writes and fsync it. They are started together: each prints `ready` once it
//! is set up and then blocks reading its stdin, a pipe whose write end the parent closes to
//! start them all at once. The output time runs from that moment until the last writer's
//! fsync returned (CLOCK_MONOTONIC stamps taken in the writers).
//!
//! The experiment runs once straight into BACKING and once through a fresh tierstack mount
//! over a fresh empty subdirectory of BACKING (driven only through the CLI contract:
//! `tierstack mount`, `status --json`, `drain --wait`, `umount`). The drain time runs from the
//! end of the mount's output phase until `drain --wait` returned and `status` says no byte is
//! dirty. The speedup is direct output time / mount output time (Table 2 of seed 004).
//!
//! `--throttle MB/s` models a congested parallel file system: BACKING is an ext4 file system
//! on a loop device (image file under the work folder) mounted with `-o sync`, and the writers
//! of both runs and the mount daemon are put in a blkio cgroup (v1, or the io controller of
//! cgroup v2) whose write limit for the loop device is MB/s x 10^6 bytes. `Env` tears all of it
//! down (tierstack mount, ext4 mount, loop device, cgroup, image, work folder) on success, on
//! error and on interruption (the caller sets the cancel flag on Ctrl-C).

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Size of one write of a writer.
pub const BLOCK: usize = 1 << 20;

/// What can go wrong in the checkpoint benchmark.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Bad input or an environment that cannot run the benchmark; names the problem and fix.
    #[error("{0}")]
    Setup(String),
    /// An I/O call failed on a path.
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A command that the benchmark runs failed.
    #[error("{what} failed: {msg}")]
    Command { what: String, msg: String },
    /// A writer process failed.
    #[error("checkpoint writer {index} failed: {msg}")]
    Writer { index: usize, msg: String },
    /// The caller asked to stop (Ctrl-C).
    #[error("interrupted: the loop device, mounts, cgroup and files it had set up were removed")]
    Cancelled,
}

type Result<T> = std::result::Result<T, CheckpointError>;

fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> CheckpointError + 'a {
    move |source| CheckpointError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Nanoseconds on CLOCK_MONOTONIC (the same clock in every process of the machine).
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

// ---------------------------------------------------------------------------------------------
// The writer process

/// What one writer process does (passed as JSON on its command line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriterSpec {
    pub path: PathBuf,
    pub size: u64,
    /// cgroup.procs file to join before anything else.
    pub cgroup_procs: Option<PathBuf>,
    pub seed: u64,
}

/// What one writer reports (one JSON line on stdout).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriterReport {
    /// When it was released (CLOCK_MONOTONIC ns).
    pub start_ns: u64,
    /// When its fsync returned.
    pub done_ns: u64,
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
            Err(e) => return Err(io_err("wait on", Path::new("stdin"))(e)),
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
    writeln!(out, "{line}")
        .and_then(|_| out.flush())
        .map_err(io_err("write to", stdout))
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

// ---------------------------------------------------------------------------------------------
// Running commands

/// Runs a command to completion, killing it on `cancel` or after `timeout`. Its stdout on
/// success; an error with the last line of its stderr otherwise.
fn run_cmd(
    cmd: &mut Command,
    what: &str,
    cancel: Option<&AtomicBool>,
    timeout: Duration,
) -> Result<String> {
    // Its own process group: a Ctrl-C at the terminal reaches this process (which stops
    // what it runs in order), not a `tierstack mount` halfway through starting its daemon.
    use std::os::unix::process::CommandExt;
    let child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| CheckpointError::Command {
            what: what.to_string(),
            msg: format!("cannot start it: {e}"),
        })?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel::<io::Result<Output>>();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let deadline = Instant::now() + timeout;
    let mut killed = None;
    let out = loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(r) => break r,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                break Err(io::Error::other("lost the child"))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if killed.is_none() {
                    let why = if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                        Some(CheckpointError::Cancelled)
                    } else if Instant::now() > deadline {
                        Some(CheckpointError::Command {
                            what: what.to_string(),
                            msg: format!("no answer in {} s: it was stopped", timeout.as_secs()),
                        })
                    } else {
                        None
                    };
                    if let Some(w) = why {
                        // The child is ours and not yet reaped (the thread reaps it).
                        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                        }
                        killed = Some(w);
                    }
                }
            }
        }
    };
    if let Some(w) = killed {
        return Err(w);
    }
    let out = out.map_err(|e| CheckpointError::Command {
        what: what.to_string(),
        msg: e.to_string(),
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        let last = last.strip_prefix("tierstack: error: ").unwrap_or(last);
        Err(CheckpointError::Command {
            what: what.to_string(),
            msg: if last.is_empty() {
                format!("it exited with {}", out.status)
            } else {
                last.to_string()
            },
        })
    }
}

fn tool(name: &str, args: &[&str], what: &str) -> Result<String> {
    run_cmd(
        Command::new(name).args(args),
        what,
        None,
        Duration::from_secs(300),
    )
}

/// Mount points (decoded) listed in /proc/self/mounts.
fn mount_points() -> Vec<PathBuf> {
    let text = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|m| {
            PathBuf::from(
                m.replace("\\040", " ")
                    .replace("\\011", "\t")
                    .replace("\\012", "\n")
                    .replace("\\134", "\\"),
            )
        })
        .collect()
}

fn is_mounted(p: &Path) -> bool {
    let c = fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    mount_points().contains(&c)
}

// ---------------------------------------------------------------------------------------------
// The tierstack mount (through the CLI contract only)

struct Mounted {
    exe: PathBuf,
    mnt: PathBuf,
    daemon_pid: Option<u32>,
    /// The fsync mode `status` names.
    mode: Option<String>,
    active: bool,
}

impl Mounted {
    fn mount(
        exe: &Path,
        backing: &Path,
        mnt: &Path,
        fast: &Path,
        dram: Option<&str>,
        mode: Option<&str>,
    ) -> Result<Mounted> {
        let mut cmd = Command::new(exe);
        cmd.arg("mount")
            .arg(backing)
            .arg(mnt)
            .arg("--dir")
            .arg(fast);
        if let Some(d) = dram {
            cmd.args(["--dram", d]);
        }
        if let Some(m) = mode {
            cmd.args(["--mode", m]);
        }
        let mut me = Mounted {
            exe: exe.to_path_buf(),
            mnt: mnt.to_path_buf(),
            daemon_pid: None,
            mode: None,
            active: true,
        };
        // Not cancelled halfway: its daemon would come up after the teardown. A Ctrl-C
        // meanwhile is seen by the caller once the mount is up (and then torn down).
        run_cmd(&mut cmd, "tierstack mount", None, Duration::from_secs(120))?;
        let st = me.status()?;
        me.daemon_pid = ["pid", "daemon_pid"]
            .iter()
            .find_map(|k| st.get(k).and_then(|v| v.as_u64()))
            .or_else(|| st.pointer("/daemon/pid").and_then(|v| v.as_u64()))
            .map(|p| p as u32);
        me.mode = st.get("mode").and_then(|v| v.as_str()).map(str::to_string);
        Ok(me)
    }

    fn status(&self) -> Result<serde_json::Value> {
        let out = run_cmd(
            Command::new(&self.exe)
                .arg("status")
                .arg(&self.mnt)
                .arg("--json"),
            "tierstack status --json",
            None,
            Duration::from_secs(60),
        )?;
        serde_json::from_str(out.trim()).map_err(|e| CheckpointError::Command {
            what: "tierstack status --json".into(),
            msg: format!("its output is not JSON ({e})"),
        })
    }

    /// `drain --wait`, then until `status` says no byte is dirty.
    fn drain_wait(&self, cancel: &AtomicBool, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        run_cmd(
            Command::new(&self.exe)
                .arg("drain")
                .arg(&self.mnt)
                .arg("--wait"),
            "tierstack drain --wait",
            Some(cancel),
            timeout,
        )?;
        loop {
            let st = self.status()?;
            let dirty = st.get("dirty_bytes").and_then(|v| v.as_u64());
            match dirty {
                Some(0) => return Ok(()),
                None => {
                    return Err(CheckpointError::Command {
                        what: "tierstack status --json".into(),
                        msg: "it has no dirty_bytes field".into(),
                    })
                }
                Some(_) => {}
            }
            if cancel.load(Ordering::Relaxed) {
                return Err(CheckpointError::Cancelled);
            }
            if Instant::now() > deadline {
                return Err(CheckpointError::Command {
                    what: "the drain".into(),
                    msg: format!("bytes still dirty after {} s", timeout.as_secs()),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `tierstack umount` (drains, then unmounts); if that fails, a lazy unmount and the end
    /// of the daemon this benchmark started.
    fn close(&mut self) -> Result<()> {
        if !self.active {
            return Ok(());
        }
        self.active = false;
        let r = run_cmd(
            Command::new(&self.exe).arg("umount").arg(&self.mnt),
            "tierstack umount",
            None,
            Duration::from_secs(600),
        );
        if r.is_err() || is_mounted(&self.mnt) {
            let _ = tool("umount", &["-l", &self.mnt.to_string_lossy()], "umount -l");
            if let Some(p) = self
                .daemon_pid
                .and_then(|p| rustix::process::Pid::from_raw(p as i32))
            {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
        r.map(|_| ())
    }
}

/// One sample of `status --json` during the mount run.
#[derive(Debug, Clone, Copy)]
struct Sample {
    t_ns: u64,
    drained: u64,
    rate: f64,
}

/// Samples `tierstack status MNT --json` every 200 ms until `stop`.
fn sample_status(exe: &Path, mnt: &Path, stop: &AtomicBool) -> Vec<Sample> {
    let mut v = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t_ns = monotonic_ns();
        let out = run_cmd(
            Command::new(exe).arg("status").arg(mnt).arg("--json"),
            "tierstack status --json",
            Some(stop),
            Duration::from_secs(10),
        );
        if let Ok(j) = out.and_then(|o| {
            serde_json::from_str::<serde_json::Value>(o.trim()).map_err(|e| {
                CheckpointError::Command {
                    what: "tierstack status --json".into(),
                    msg: e.to_string(),
                }
            })
        }) {
            v.push(Sample {
                t_ns,
                drained: j.get("drained_bytes").and_then(|x| x.as_u64()).unwrap_or(0),
                rate: j
                    .get("drain_bytes_per_s")
                    .and_then(|x| x.as_f64())
                    .unwrap_or(0.0),
            });
        }
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    v
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

// ---------------------------------------------------------------------------------------------
// The throttled backing file system

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CgKind {
    V1Blkio,
    V2Io,
}

const V1_BLKIO: &str = "/sys/fs/cgroup/blkio";
const V2_ROOT: &str = "/sys/fs/cgroup";

struct Throttle {
    image: PathBuf,
    loopdev: Option<String>,
    devnum: String,
    mp: PathBuf,
    mp_created: bool,
    mounted: bool,
    cgroup: Option<PathBuf>,
    kind: CgKind,
}

/// Which cgroup interface throttles writes here.
fn cgroup_kind() -> Result<CgKind> {
    if Path::new(V1_BLKIO)
        .join("blkio.throttle.write_bps_device")
        .exists()
    {
        return Ok(CgKind::V1Blkio);
    }
    let ctl = fs::read_to_string(Path::new(V2_ROOT).join("cgroup.controllers")).unwrap_or_default();
    if ctl.split_whitespace().any(|c| c == "io") {
        return Ok(CgKind::V2Io);
    }
    Err(CheckpointError::Setup(
        "--throttle needs a blkio cgroup (v1, /sys/fs/cgroup/blkio) or the io controller of cgroup v2, and this machine has neither: leave out --throttle".into(),
    ))
}

/// Whether `--throttle` can work here (root, a blkio or io cgroup, losetup and mkfs.ext4);
/// the error names what is missing.
pub fn throttle_available() -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        return Err(CheckpointError::Setup(
            "a throttled backing file system needs root (a loop device, a mount and a cgroup)"
                .into(),
        ));
    }
    cgroup_kind()?;
    for t in ["losetup", "mkfs.ext4"] {
        let found = Command::new(t)
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Err(CheckpointError::Setup(format!(
                "{t} is not installed (apt-get install util-linux e2fsprogs)"
            )));
        }
    }
    Ok(())
}

impl Throttle {
    fn setup(work: &Path, mp: &Path, image_size: u64, bytes_per_s: u64) -> Result<Throttle> {
        let kind = cgroup_kind()?;
        let image = work.join("backing.img");
        let mut t = Throttle {
            image: image.clone(),
            loopdev: None,
            devnum: String::new(),
            mp: mp.to_path_buf(),
            mp_created: false,
            mounted: false,
            cgroup: None,
            kind,
        };
        {
            let f = fs::File::create(&image).map_err(io_err("create the image", &image))?;
            f.set_len(image_size)
                .map_err(io_err("size the image", &image))?;
        }
        let img = image.to_string_lossy().into_owned();
        let dev = tool(
            "losetup",
            &["--find", "--show", &img],
            "losetup (attach the image to a loop device)",
        )?
        .trim()
        .to_string();
        if dev.is_empty() {
            return Err(CheckpointError::Setup(
                "losetup named no loop device: check `losetup -f`".into(),
            ));
        }
        t.loopdev = Some(dev.clone());
        let st = rustix::fs::stat(dev.as_str()).map_err(|e| CheckpointError::Io {
            what: "stat",
            path: PathBuf::from(&dev),
            source: e.into(),
        })?;
        t.devnum = format!(
            "{}:{}",
            rustix::fs::major(st.st_rdev),
            rustix::fs::minor(st.st_rdev)
        );
        tool(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
                &dev,
            ],
            "mkfs.ext4",
        )?;
        if !mp.exists() {
            fs::create_dir_all(mp).map_err(io_err("create", mp))?;
            t.mp_created = true;
        }
        tool(
            "mount",
            &["-t", "ext4", "-o", "sync", &dev, &mp.to_string_lossy()],
            "mount -o sync (the throttled backing file system)",
        )?;
        t.mounted = true;
        let name = format!("tierstack-ckpt-{}", std::process::id());
        let cg = match kind {
            CgKind::V1Blkio => Path::new(V1_BLKIO).join(&name),
            CgKind::V2Io => {
                // The io controller must be enabled for the children of the root.
                let _ = fs::write(Path::new(V2_ROOT).join("cgroup.subtree_control"), "+io");
                Path::new(V2_ROOT).join(&name)
            }
        };
        fs::create_dir(&cg).map_err(io_err("create the cgroup", &cg))?;
        t.cgroup = Some(cg.clone());
        let (file, rule) = match kind {
            CgKind::V1Blkio => (
                "blkio.throttle.write_bps_device",
                format!("{} {bytes_per_s}", t.devnum),
            ),
            CgKind::V2Io => ("io.max", format!("{} wbps={bytes_per_s}", t.devnum)),
        };
        fs::write(cg.join(file), &rule)
            .map_err(io_err("set the write limit in", &cg.join(file)))?;
        Ok(t)
    }

    fn procs(&self) -> Option<PathBuf> {
        self.cgroup.as_ref().map(|c| c.join("cgroup.procs"))
    }

    /// Puts a process (all its threads) in the throttled cgroup.
    fn add(&self, pid: u32) -> Result<()> {
        if let Some(p) = self.procs() {
            fs::write(&p, pid.to_string()).map_err(io_err("move the mount daemon into", &p))?;
        }
        Ok(())
    }

    /// Lifts the limit (teardown drains faster).
    fn relax(&self) {
        if let Some(cg) = &self.cgroup {
            let _ = match self.kind {
                CgKind::V1Blkio => fs::write(
                    cg.join("blkio.throttle.write_bps_device"),
                    format!("{} 0", self.devnum),
                ),
                CgKind::V2Io => fs::write(cg.join("io.max"), format!("{} wbps=max", self.devnum)),
            };
        }
    }

    fn close(&mut self) -> Result<()> {
        let mut first: Option<CheckpointError> = None;
        let mut keep = |r: Result<()>| {
            if let Err(e) = r {
                if first.is_none() {
                    first = Some(e);
                }
            }
        };
        self.relax();
        if let Some(cg) = self.cgroup.take() {
            // Whatever is left in it (only processes this benchmark put there) goes back to
            // the root group, then the group is removed.
            let root = match self.kind {
                CgKind::V1Blkio => Path::new(V1_BLKIO).join("cgroup.procs"),
                CgKind::V2Io => Path::new(V2_ROOT).join("cgroup.procs"),
            };
            let mut removed = false;
            for _ in 0..50 {
                if let Ok(pids) = fs::read_to_string(cg.join("cgroup.procs")) {
                    for p in pids.split_whitespace() {
                        let _ = fs::write(&root, p);
                    }
                }
                if fs::remove_dir(&cg).is_ok() || !cg.exists() {
                    removed = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if !removed {
                keep(Err(CheckpointError::Setup(format!(
                    "cannot remove the cgroup {}: remove it with rmdir once its processes ended",
                    cg.display()
                ))));
            }
        }
        if self.mounted {
            let mp = self.mp.to_string_lossy().into_owned();
            let mut ok = false;
            for _ in 0..20 {
                if tool("umount", &[&mp], "umount").is_ok() || !is_mounted(&self.mp) {
                    ok = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if !ok {
                keep(tool("umount", &["-l", &mp], "umount -l").map(|_| ()));
            }
            self.mounted = false;
        }
        if let Some(dev) = self.loopdev.take() {
            let mut r = Ok(());
            for _ in 0..20 {
                r = tool("losetup", &["-d", &dev], "losetup -d").map(|_| ());
                if r.is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            keep(r);
        }
        if self.image.exists() {
            keep(fs::remove_file(&self.image).map_err(io_err("remove", &self.image)));
        }
        if self.mp_created {
            let _ = fs::remove_dir(&self.mp);
            self.mp_created = false;
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

// ---------------------------------------------------------------------------------------------
// The benchmark

/// How to run the benchmark.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `tierstack` binary (writers and mount commands).
    pub exe: PathBuf,
    pub procs: usize,
    pub file_size: u64,
    /// BACKING: required without a throttle; with one, where the throttled file system is
    /// mounted (an empty or new directory; default: under the work folder).
    pub backing: Option<PathBuf>,
    /// Folder for the work folder (image, mount point, fast tier).
    pub dir: PathBuf,
    pub throttle_mb_s: Option<f64>,
    pub mode: Option<String>,
    pub dram: Option<String>,
    pub direct_only: bool,
    pub repeat: usize,
    /// Tells the user what happens (the demo): the `tierstack status` output once the writers
    /// are done and the drain runs, and the check of BACKING after `umount`.
    pub narrate: Option<fn(&str)>,
}

/// One repetition.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub run: usize,
    pub direct_output_s: f64,
    pub mount_output_s: Option<f64>,
    pub drain_s: Option<f64>,
    /// From the first byte drained (seen by sampling `status`) to the end of the drain.
    pub drain_window_s: Option<f64>,
    /// Highest `drain_bytes_per_s` that `status` showed, in MB/s.
    pub drain_peak_mb_s: Option<f64>,
}

/// The benchmark's figures (means over the repetitions).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub procs: usize,
    pub file_size: u64,
    pub bytes_total: u64,
    pub throttle_mb_s: Option<f64>,
    /// How the throttle was applied (`blkio v1` or `io v2`), if any.
    pub throttle_cgroup: Option<String>,
    pub backing: String,
    /// ext4 on a loop device mounted -o sync, or "directory as given".
    pub backing_fs: String,
    pub mode: String,
    pub direct_only: bool,
    pub repeat: usize,
    pub direct_output_s: f64,
    pub direct_mb_s: f64,
    pub mount_output_s: Option<f64>,
    pub mount_mb_s: Option<f64>,
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
            // Never remove through a mount that is still there.
            let wc = fs::canonicalize(&w).unwrap_or_else(|_| w.clone());
            if mount_points().iter().any(|m| m.starts_with(&wc)) {
                first.get_or_insert(CheckpointError::Setup(format!(
                    "a mount under {} is still there: unmount it (umount -l) and remove the folder",
                    w.display()
                )));
            } else if let Err(e) = fs::remove_dir_all(&w) {
                first.get_or_insert(io_err("remove", &w)(e));
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
    fs::create_dir(p).map_err(io_err("create", p))
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
                cfg.dram.as_deref(),
                cfg.mode.as_deref(),
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
        "bench checkpoint: {} processes x {} = {} file-per-process, 1 MiB writes + fsync\nbacking {}: {}{}, mount mode {}\n\n",
        r.procs,
        crate::fmt_size(r.file_size),
        crate::fmt_size(r.bytes_total),
        r.backing,
        r.backing_fs,
        r.throttle_mb_s
            .map(|t| format!(", writes throttled to {t} MB/s"))
            .unwrap_or_default(),
        r.mode
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
        run_writer(&spec, io::empty(), &mut out).unwrap();
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
