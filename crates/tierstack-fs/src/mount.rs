//! The mount daemon: fast tier, journal, drainer, FUSE session and control socket; and the
//! client side of the control socket.
//!
//! The control socket of a mount is `/run/tierstack/<xxh3-64 of the canonical mountpoint, 16
//! hex digits>.sock` (`TIERSTACK_RUN_DIR` overrides the folder). It takes one JSON request
//! per connection (`{"cmd":"status"}`, `{"cmd":"drain"}`, `{"cmd":"shutdown"}`,
//! `{"cmd":"adopt",...}`: see [`adopt`]) and answers one JSON line.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tierstack_array::{descriptor, Array, ArrayOptions, CreateParams, Level};
use tierstack_common::mounts::mounted_type;

use crate::core::Core;
use crate::db::Db;
use crate::drain::{policy, Drainer};
use crate::error::{io_err, FsError, Result};

/// What the daemon is asked to do (passed as JSON by `tierstack mount`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MountSpec {
    /// The backing directory (BACKING) the mount shows and drains to.
    pub backing: PathBuf,
    /// Where the file system is mounted.
    pub mountpoint: PathBuf,
    /// Array descriptor of the fast tier, or
    pub array: Option<PathBuf>,
    /// the folder of the embedded fast tier (an array of file drives made there).
    pub dir: Option<PathBuf>,
    /// Size of each file drive made under `dir`.
    pub drive_size: u64,
    /// Bytes of the store's DRAM tier.
    pub dram: u64,
    /// `--mode sync` (true): a returned `fsync` survives a crash of the daemon; false:
    /// `--mode async`.
    pub sync: bool,
    /// Let users other than the mount's owner use it (FUSE `allow_other`).
    pub allow_other: bool,
    /// Bytes per second (None: unlimited).
    pub drain_rate: Option<u64>,
    /// Workers draining file contents in parallel (at least one).
    pub drain_jobs: usize,
    /// Threads serving FUSE requests (at least one).
    pub fuse_threads: usize,
    /// Site-wide drain slots: at most this many drain streams at once across every mount
    /// that names the same [`MountSpec::drain_slots_dir`] (0: no bound; see
    /// [`crate::drain::slots`]).
    #[serde(default)]
    pub drain_slots: u32,
    /// The folder of the site-wide drain slots, on the shared file system drained into.
    #[serde(default)]
    pub drain_slots_dir: Option<PathBuf>,
    /// The drain group whose place in the site's queue this mount's drain shares (a job's
    /// nodes; see [`crate::drain::slots`]). Only with drain slots.
    #[serde(default)]
    pub drain_group: Option<String>,
    /// How often (ms) a loaded directory's folder in BACKING is looked at again for names
    /// other writers added (0: never; see `Core::set_coherence`).
    #[serde(default = "coherence_default")]
    pub coherence_ms: u64,
    /// The optional tiers between the DRAM tier and the array (`--vram`); the mount has no
    /// compressed tier (its pages are files' contents, drained as they are).
    #[serde(default = "no_tiers")]
    pub tiers: tierstack_store::Tiers,
    /// Write-only handles of new or truncated files bypass the kernel's page cache (see
    /// [`crate::refresh`]); false: every handle writes through the page cache.
    #[serde(default = "yes")]
    pub direct_writes: bool,
    /// While the mount is busy, one FUSE thread polls the device instead of sleeping (see
    /// [`crate::poll`]); false, or a machine with one CPU: every FUSE thread sleeps.
    #[serde(default = "yes")]
    pub poll: bool,
    /// How requests reach the daemon: FUSE over io_uring where the kernel offers it, or
    /// `/dev/fuse` (see [`crate::uring`]).
    #[serde(default)]
    pub transport: crate::uring::Transport,
    /// What SIGTERM, SIGINT or SIGHUP do (see [`OnStop`]).
    #[serde(default)]
    pub on_stop: OnStop,
    /// The user (uid, gid) the buffer is for when root mounts it for someone (the SLURM
    /// hooks for a job's user): the control socket is theirs (and root's); nobody else
    /// reaches it. None: the daemon's own user.
    #[serde(default)]
    pub owner: Option<(u32, u32)>,
}

/// What a stop by signal (SIGTERM from systemd or a node's shutdown, Ctrl-C in the
/// foreground, SIGHUP) does before the mount goes away. Either way everything written
/// through the mount before the signal is kept, fsync'd or not, and the next mount of the
/// same fast tier resumes the drain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnStop {
    /// Put what the daemon holds in DRAM on the fast tier's array and make the journal
    /// durable (seconds at most: within systemd's 90 s stop timeout).
    #[default]
    Persist,
    /// Drain to BACKING first, for at most [`STOP_DRAIN_LIMIT`], then persist the rest.
    Drain,
}

/// How long a stop with [`OnStop::Drain`] drains before it persists what is left.
pub const STOP_DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// How long a stop by signal keeps serving handles still open on the detached mount.
pub const STOP_SERVE_LIMIT: Duration = Duration::from_secs(10);

/// Why the daemon stops.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// The mount is gone (`tierstack umount`, or detached from outside): drain, then exit;
    /// unless `keep`, an embedded fast tier (`--dir`) that holds nothing undrained then is
    /// removed.
    Unmounted { keep: bool },
    /// A signal: keep what was written (see [`OnStop`]), detach, exit 0.
    Signal(i32),
}

/// A mount's optional tiers when its spec names none: no VRAM tier, no compressed tier.
fn no_tiers() -> tierstack_store::Tiers {
    tierstack_store::Tiers {
        vram: None,
        compress: false,
    }
}

fn yes() -> bool {
    true
}

/// `mount --coherence`'s default: 1 s.
fn coherence_default() -> u64 {
    1000
}

/// Where a mount's drain stands: what the fast tier holds that BACKING does not yet, and how
/// fast it goes there (part of [`MountStatus`], and of `tierstack top`'s view of a mount).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DrainFigures {
    /// Bytes of file pages in the fast tier that BACKING does not have yet.
    pub dirty_bytes: u64,
    /// Files whose contents differ from BACKING.
    pub dirty_files: u64,
    /// Journal rows not yet applied to BACKING (quarantined rows not counted).
    pub pending_ops: u64,
    /// Files being drained now.
    pub drains_in_flight: usize,
    /// Bytes per second written to BACKING over the last few seconds.
    pub drain_bytes_per_s: f64,
    /// Bytes of file contents written to BACKING since the mount started.
    pub drained_bytes: u64,
}

/// What `tierstack status` reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MountStatus {
    /// Where the file system is mounted (canonical).
    pub mountpoint: PathBuf,
    /// The backing directory (canonical).
    pub backing: PathBuf,
    /// Process id of the mount daemon.
    pub pid: u32,
    /// `sync` or `async`: what a returned `fsync` guarantees.
    pub mode: String,
    /// Where the drain stands (flattened: its fields are keys of this object).
    #[serde(flatten)]
    pub drain: DrainFigures,
    /// Bytes of file pages held in the fast tier, dirty and clean.
    pub held_bytes: u64,
    /// Above this many held bytes writers wait for the drain (the DRAM tier plus half the
    /// array's capacity).
    pub limit_bytes: u64,
    /// Writers are waiting for space now.
    pub backpressure: bool,
    /// Nothing left to drain: no journal row, no file being drained, no dirty file.
    pub idle: bool,
    /// Drain errors since the mount started, each retried (or quarantined).
    pub drain_retries: u64,
    /// Journal rows that cancelled out before reaching BACKING (files created and removed
    /// within one burst).
    #[serde(default)]
    pub cancelled_ops: u64,
    /// Files whose copy in BACKING was copied back into the fast tier since the mount started,
    /// before a drained rename or removal took that copy's name (each costs a read of the
    /// file and a flush; a file with another name in BACKING moves there instead).
    #[serde(default)]
    pub pinned_bases: u64,
    /// `fsync`s made durable in the intent log (sync mode, small changes), and by a full
    /// flush of the fast tier.
    #[serde(default)]
    pub fsync_logged: u64,
    /// `fsync`s made durable by a full flush of the fast tier.
    #[serde(default)]
    pub fsync_flushed: u64,
    /// Intent log records replayed when this mount started (after a crash).
    #[serde(default)]
    pub intent_replayed: u64,
    /// The last error the drain met, if any (it may have healed since).
    pub last_error: Option<String>,
    /// Use of each tier of the fast tier's store, fastest first.
    pub tiers: Vec<TierUse>,
    /// Journal rows BACKING refused for good (quarantined; their data stays in the fast tier).
    #[serde(default)]
    pub stuck: Vec<StuckRecord>,
    /// Nothing waits but the quarantined rows.
    #[serde(default)]
    pub settled: bool,
    /// A retry of the quarantined rows was asked for and has not started yet.
    #[serde(default)]
    pub retry_pending: bool,
    /// The fast tier's array: online | degraded | rebuilding | failed.
    #[serde(default)]
    pub array_state: String,
    /// Rebuild progress while the array rebuilds.
    #[serde(default)]
    pub rebuild_percent: Option<f64>,
    /// Drives of the array that are not online.
    #[serde(default)]
    pub drives_not_online: usize,
    /// The drive files of the array (the node exporter's device figures; no walk of the
    /// daemon's open files).
    #[serde(default)]
    pub drive_paths: Vec<PathBuf>,
    /// Count and latency of each FUSE operation served since the mount.
    #[serde(default)]
    pub ops: Vec<crate::opstats::OpFigures>,
    /// Bytes of zeros written over never-written parts of the fast tier's file drives while
    /// the mount was idle (see `Array::condition_step`).
    #[serde(default)]
    pub conditioned_bytes: u64,
    /// The conditioning has nothing left to do (or may not go on: block devices, a file
    /// system short of space, a drive not online).
    #[serde(default)]
    pub conditioned: bool,
    /// A FUSE thread polls the device now, instead of sleeping (see `crate::poll`).
    #[serde(default)]
    pub polling: bool,
    /// Milliseconds spent polling the device since the mount started (a CPU busy for them).
    #[serde(default)]
    pub polled_ms: u64,
    /// Calls the interception client's processes made through the io channel (`crate::io`).
    #[serde(default)]
    pub io_calls: u64,
    /// Processes connected to the io channel now.
    #[serde(default)]
    pub io_clients: u64,
    /// How requests reach the daemon: "io_uring" or "/dev/fuse".
    #[serde(default)]
    pub transport: String,
    /// The embedded fast tier's folder (`--dir`; None with `--array`).
    #[serde(default)]
    pub fast_dir: Option<PathBuf>,
}

/// A quarantined journal row, for status output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StuckRecord {
    /// Path relative to BACKING.
    pub path: String,
    /// The operation (Mkdir, Create, Data, Rename ...).
    pub op: String,
    /// What BACKING answered.
    pub error: String,
    /// When it was quarantined (Unix seconds).
    pub since: i64,
}

/// One tier of the store, for status output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TierUse {
    /// The tier's name (`dram`, `array` ...).
    pub name: String,
    /// Bytes the tier can hold.
    pub capacity_bytes: u64,
    /// Bytes the tier holds now.
    pub used_bytes: u64,
    /// Bytes the tier holds that the tier below does not have yet.
    pub dirty_bytes: u64,
}

/// The runtime folder of mounts made by root (and of `tierstack run` records).
pub const SYSTEM_RUN_DIR: &str = "/run/tierstack";

/// The folder of this user's mounts' control sockets and logs: `TIERSTACK_RUN_DIR`, else
/// `/run/tierstack` for root, else `$XDG_RUNTIME_DIR/tierstack` (the user's own, made by
/// systemd at login), else `/tmp/tierstack-UID`.
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TIERSTACK_RUN_DIR") {
        return PathBuf::from(d);
    }
    let uid = rustix::process::geteuid();
    if uid.is_root() {
        return PathBuf::from(SYSTEM_RUN_DIR);
    }
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(x) if x.is_absolute() && x.is_dir() => x.join("tierstack"),
        _ => PathBuf::from(format!("/tmp/tierstack-{}", uid.as_raw())),
    }
}

/// Makes [`run_dir`] if needed: private to its user (0700) unless it is root's system
/// folder. A folder there that another user owns is refused (someone else's socket could
/// stand in for the mount's).
pub fn ensure_run_dir() -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let rd = run_dir();
    let uid = rustix::process::geteuid();
    let mode = if uid.is_root() { 0o755 } else { 0o700 };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(&rd)
        .map_err(io_err(&rd))?;
    let md = std::fs::symlink_metadata(&rd).map_err(io_err(&rd))?;
    if !md.is_dir() || md.uid() != uid.as_raw() && !uid.is_root() {
        return Err(FsError::Config(format!(
            "the runtime folder {} is not a folder of yours: remove it, or set TIERSTACK_RUN_DIR to a folder you own",
            rd.display()
        )));
    }
    Ok(rd)
}

/// The canonical form of a mountpoint that may be a dead FUSE mount (whose own stat fails):
/// its canonical parent joined with its name.
pub fn canonical_mountpoint(p: &Path) -> Result<PathBuf> {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map_err(io_err("."))?.join(p)
    };
    let name = abs
        .file_name()
        .map(|n| n.to_os_string())
        .ok_or_else(|| FsError::Config(format!("{} is not a directory name", p.display())))?;
    let parent = abs.parent().unwrap_or(Path::new("/"));
    let cp = std::fs::canonicalize(parent).map_err(io_err(parent))?;
    Ok(cp.join(name))
}

/// The control socket of the mount at `mountpoint` (canonical), as a client finds it: this
/// user's own, else root's in [`SYSTEM_RUN_DIR`] (a buffer root made for this user).
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    let own = own_socket_path(mountpoint);
    if own.exists() || std::env::var_os("TIERSTACK_RUN_DIR").is_some() {
        return own;
    }
    // A buffer root made (the SLURM hooks make the job's), seen by its user.
    let system = Path::new(SYSTEM_RUN_DIR).join(own.file_name().unwrap_or_default());
    if system.exists() {
        system
    } else {
        own
    }
}

/// Largest a mount's log grows before its next mount moves it aside (to `.log.1`).
pub const LOG_KEEP: u64 = 8 << 20;

/// The folder of the mount daemons' logs, kept after the mount ends: `TIERSTACK_LOG_DIR`,
/// else the runtime folder when `TIERSTACK_RUN_DIR` is set, else `/var/log/tierstack` for
/// root, else `$XDG_STATE_HOME/tierstack` (`~/.local/state/tierstack`), else the runtime
/// folder.
pub fn log_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TIERSTACK_LOG_DIR") {
        return PathBuf::from(d);
    }
    if std::env::var_os("TIERSTACK_RUN_DIR").is_some() {
        return run_dir();
    }
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/var/log/tierstack");
    }
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|h| h.is_absolute() && h.is_dir())
                .map(|h| h.join(".local/state"))
        });
    match state {
        Some(s) => s.join("tierstack"),
        None => run_dir(),
    }
}

/// The log of the mount at `mountpoint` (see [`log_dir`]).
pub fn log_path(mountpoint: &Path) -> PathBuf {
    let h = xxhash_rust::xxh3::xxh3_64(mountpoint.as_os_str().as_bytes());
    log_dir().join(format!("{h:016x}.log"))
}

/// Opens the log of the mount at `mountpoint` for appending (its folder made if needed, a
/// log past [`LOG_KEEP`] moved to `.log.1` first): what each mount of it said stays until
/// the next rotation.
pub fn open_log(mountpoint: &Path) -> Result<(std::fs::File, PathBuf)> {
    use std::os::unix::fs::DirBuilderExt;
    let path = log_path(mountpoint);
    if let Some(dir) = path.parent() {
        let mode = if rustix::process::geteuid().is_root() {
            0o755
        } else {
            0o700
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir)
            .map_err(io_err(dir))?;
    }
    if std::fs::metadata(&path).is_ok_and(|m| m.len() > LOG_KEEP) {
        let _ = std::fs::rename(&path, path.with_extension("log.1"));
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(io_err(&path))?;
    Ok((f, path))
}

/// Where a daemon of this user listens for the mount at `mountpoint`.
pub fn own_socket_path(mountpoint: &Path) -> PathBuf {
    let h = xxhash_rust::xxh3::xxh3_64(mountpoint.as_os_str().as_bytes());
    run_dir().join(format!("{h:016x}.sock"))
}

/// Sends one request to a mount's daemon and returns its answer.
pub fn request(
    mountpoint: &Path,
    req: &serde_json::Value,
    timeout: Duration,
) -> Result<serde_json::Value> {
    request_at(&socket_path(mountpoint), req, timeout)
}

/// One request `req` to the daemon listening on `sock`, its answer awaited up to `timeout`.
pub fn request_at(
    sock: &Path,
    req: &serde_json::Value,
    timeout: Duration,
) -> Result<serde_json::Value> {
    let cerr = |msg: String| FsError::Control {
        path: sock.to_path_buf(),
        msg,
    };
    let mut s = UnixStream::connect(sock).map_err(|e| cerr(e.to_string()))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .map_err(|e| cerr(e.to_string()))?;
    let mut line = req.to_string();
    line.push('\n');
    s.write_all(line.as_bytes())
        .map_err(|e| cerr(e.to_string()))?;
    let mut r = BufReader::new(s);
    let mut ans = String::new();
    r.read_line(&mut ans).map_err(|e| cerr(e.to_string()))?;
    serde_json::from_str(&ans).map_err(|e| cerr(format!("bad answer ({e})")))
}

/// The status of the daemon listening on `sock` (None: no answer within `timeout`).
pub fn status_at(sock: &Path, timeout: Duration) -> Option<MountStatus> {
    let ans = request_at(sock, &serde_json::json!({"cmd": "status"}), timeout).ok()?;
    serde_json::from_value(ans).ok()
}

/// Asks the daemon of the mount at `mountpoint` (canonical) for its status.
pub fn status(mountpoint: &Path) -> Result<MountStatus> {
    let v = request(
        mountpoint,
        &serde_json::json!({"cmd": "status"}),
        Duration::from_secs(30),
    )?;
    serde_json::from_value(v.clone()).map_err(|e| FsError::Control {
        path: socket_path(mountpoint),
        msg: format!("bad status ({e}): {v}"),
    })
}

/// Asks the daemon of `mountpoint` to drain now (and, with `retry`, to try the quarantined
/// records again).
pub fn request_drain(mountpoint: &Path, retry: bool) -> Result<()> {
    request_drain_within(mountpoint, retry, Duration::from_secs(30))
}

/// As [`request_drain`], the answer awaited up to `timeout`.
pub fn request_drain_within(mountpoint: &Path, retry: bool, timeout: Duration) -> Result<()> {
    request(
        mountpoint,
        &serde_json::json!({"cmd": "drain", "retry": retry}),
        timeout,
    )?;
    Ok(())
}

/// How [`wait_drained`] ended short of an idle mount.
#[derive(Debug)]
pub enum DrainWait {
    /// Only records BACKING refused again since the wait began are left (quarantined).
    Stuck(Box<MountStatus>),
    /// The time limit passed; the status at that moment.
    TimedOut(Duration, Box<MountStatus>),
    /// The daemon stopped answering.
    Gone(FsError),
}

/// Asks the daemon of `mountpoint` to try quarantined records again and to drain, then waits
/// until nothing is left to drain (`Ok`), only records refused again since are left, or
/// `timeout` passes. `progress` sees each status (about ten a second). Files still open when
/// the drain was asked for are queued again every second.
pub fn wait_drained(
    mountpoint: &Path,
    timeout: Option<Duration>,
    progress: &mut dyn FnMut(&MountStatus),
) -> std::result::Result<(), DrainWait> {
    let t0 = std::time::Instant::now();
    let asked = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    request_drain(mountpoint, true).map_err(DrainWait::Gone)?;
    let mut last_force = std::time::Instant::now();
    loop {
        let s = status(mountpoint).map_err(DrainWait::Gone)?;
        if s.idle {
            progress(&s);
            return Ok(());
        }
        if s.settled
            && !s.retry_pending
            && !s.stuck.is_empty()
            && s.stuck.iter().all(|r| r.since >= asked)
        {
            return Err(DrainWait::Stuck(Box::new(s)));
        }
        if let Some(t) = timeout.filter(|t| t0.elapsed() > *t) {
            return Err(DrainWait::TimedOut(t, Box::new(s)));
        }
        progress(&s);
        if last_force.elapsed() > Duration::from_secs(1) {
            request_drain(mountpoint, false).map_err(DrainWait::Gone)?;
            last_force = std::time::Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether a daemon listens on the control socket of the mount at `mountpoint`
/// (canonical): the connection is taken by the kernel even while the daemon is too busy to
/// answer, and refused (or the socket is missing) once its process is gone. A busy daemon
/// is never mistaken for a dead one by a timeout.
pub fn daemon_listens(mountpoint: &Path) -> bool {
    match UnixStream::connect(socket_path(mountpoint)) {
        Ok(_) => true,
        // Someone else's daemon, alive: not ours to clear.
        Err(e) => e.kind() == std::io::ErrorKind::PermissionDenied,
    }
}

/// Whether the FUSE connection of the mount at `mountpoint` has lost its server: the kernel
/// then answers every request with ENOTCONN ("Transport endpoint is not connected"). A live
/// daemon answers (its control socket may be in a runtime folder this process does not
/// look in: another user's, or `TIERSTACK_RUN_DIR`); one that does not answer within 5 s is
/// busy, not dead.
pub fn connection_dead(mountpoint: &Path) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let mp = mountpoint.to_path_buf();
    let probe = std::thread::Builder::new()
        .name("stale-probe".into())
        .spawn(move || {
            // statfs(2) always reaches the server (a stat may be answered from the
            // kernel's attribute cache, even on a dead connection).
            let r = rustix::fs::statfs(&mp).map(drop);
            let _ = tx.send(r);
        });
    if probe.is_err() {
        return false;
    }
    matches!(
        rx.recv_timeout(Duration::from_secs(5)),
        Ok(Err(e)) if e == rustix::io::Errno::NOTCONN
    )
}

/// Detaches a dead tierstack FUSE mount from `mountpoint`: no daemon listens on its socket
/// and its connection has lost its server ([`connection_dead`]). A mount whose daemon is
/// alive, however busy and wherever its socket is, is left alone.
pub fn clear_stale(mountpoint: &Path) -> Result<bool> {
    let Some(t) = mounted_type(mountpoint) else {
        return Ok(false);
    };
    if !t.starts_with("fuse") {
        return Ok(false);
    }
    if daemon_listens(mountpoint) || !connection_dead(mountpoint) {
        return Ok(false);
    }
    rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH).map_err(|e| {
        FsError::Config(format!(
            "cannot clear the stale mount at {}: {e}",
            mountpoint.display()
        ))
    })?;
    Ok(true)
}

/// Files made for a new embedded fast tier, removed again if start-up fails.
struct Created {
    paths: Vec<PathBuf>,
    dir: Option<PathBuf>,
    armed: bool,
}

impl Drop for Created {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir(d);
        }
    }
}

const EMBEDDED_DRIVES: usize = 4;

/// The embedded fast tier for a buffer that must hold `capacity` bytes: (the size of each of
/// its file drives, the store's DRAM tier). RAID 5 over four drives keeps three drives of
/// data, so each drive gets a third of the capacity (whole MiB, at least 64 MiB); the DRAM
/// tier is a quarter of the capacity, 64 MiB to 1 GiB. The SLURM hooks size each job's
/// buffer by `capacity=` with it.
pub fn fast_tier_for(capacity: u64) -> (u64, u64) {
    let data_drives = (EMBEDDED_DRIVES - 1) as u64;
    let drive = (capacity.div_ceil(data_drives).div_ceil(1 << 20)).max(64) << 20;
    let dram = (capacity / 4).clamp(64 << 20, 1 << 30) >> 20 << 20;
    (drive, dram)
}

/// Opens (or makes) the fast tier's array and the journal database.
fn open_fast_tier(spec: &MountSpec, created: &mut Created) -> Result<(Array, PathBuf)> {
    let opts = ArrayOptions::default();
    if let Some(a) = &spec.array {
        let arr = descriptor::open_array(a, &opts)?;
        let mut db = a.as_os_str().to_owned();
        db.push(".journal.db");
        return Ok((arr, PathBuf::from(db)));
    }
    let dir = spec
        .dir
        .clone()
        .ok_or_else(|| FsError::Config("give --array ARRAY or --dir DIR".into()))?;
    if !dir.exists() {
        // Only its owner may enter: the drive files hold whatever was written through the
        // mount, whoever may read it there.
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io_err(&dir))?;
        created.dir = Some(dir.clone());
    }
    let desc = dir.join("array.toml");
    let dbp = dir.join("journal.db");
    if desc.exists() {
        return Ok((descriptor::open_array(&desc, &opts)?, dbp));
    }
    let drives: Vec<PathBuf> = (0..EMBEDDED_DRIVES)
        .map(|i| dir.join(format!("drive{i}")))
        .collect();
    for d in &drives {
        if d.exists() {
            return Err(FsError::Config(format!(
                "{} exists but {} does not: give an empty --dir or the array's descriptor with --array",
                d.display(),
                desc.display()
            )));
        }
    }
    created.paths.extend(drives.iter().cloned());
    created.paths.push(desc.clone());
    created.paths.push(dbp.clone());
    let mut wal = dbp.as_os_str().to_owned();
    wal.push("-wal");
    created.paths.push(PathBuf::from(wal));
    let mut shm = dbp.as_os_str().to_owned();
    shm.push("-shm");
    created.paths.push(PathBuf::from(shm));
    let params = CreateParams {
        level: Level::Raid5,
        chunk: 64 << 10,
        groups: None,
        size: Some(spec.drive_size),
    };
    let arr = Array::create(&drives, &params, &opts)?;
    descriptor::Descriptor::for_array(&arr).save(&desc)?;
    Ok((arr, dbp))
}

/// A mounted session and its `/dev/fuse` readers: `fuser` mounted and agreed INIT; the
/// readers of [`crate::dev`] serve the requests. Dropping it unmounts, if the mount is
/// still there.
struct Served {
    _session: fuser::Session<crate::fuse::TierFs>,
    readers: crate::dev::Readers,
}

impl Served {
    /// Waits until the readers end (the mount is gone), then lets the session go.
    fn join(self) -> std::io::Result<()> {
        self.readers.join()
    }
}

/// A running mount.
pub struct Daemon {
    /// The file system's state, shared with the FUSE session and the drainer.
    pub core: Arc<Core>,
    /// The drainer replaying the journal to BACKING.
    pub drainer: Arc<Drainer>,
    session: Option<Served>,
    io: Option<crate::io::IoServer>,
    spec: MountSpec,
    sock: PathBuf,
    shutdown_rx: mpsc::Receiver<Stop>,
}

impl Daemon {
    /// Opens the fast tier and the journal, resumes the drain, mounts and listens on the
    /// control socket. On error nothing it made is left behind.
    pub fn start(spec: MountSpec) -> Result<Daemon> {
        let mut created = Created {
            paths: Vec::new(),
            dir: None,
            armed: true,
        };
        // From here a stop signal is noted (and acted on once the mount is up), never the
        // default death that leaves a dead mount.
        let signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGHUP,
        ])
        .map_err(|e| FsError::Config(format!("cannot handle stop signals: {e}")))?;
        let backing = std::fs::canonicalize(&spec.backing).map_err(io_err(&spec.backing))?;
        let mp = canonical_mountpoint(&spec.mountpoint)?;
        clear_stale(&mp)?;
        let (array, dbp) = open_fast_tier(&spec, &mut created)?;
        let db = Db::open(&dbp)?;
        match db.meta_get("backing")? {
            Some(b) if b != backing.as_os_str().as_bytes() => {
                return Err(FsError::Config(format!(
                    "the fast tier holds the journal of a mount of {}, not {}: give another --dir or --array",
                    String::from_utf8_lossy(&b),
                    backing.display()
                )))
            }
            Some(_) => {}
            None => db.meta_set("backing", backing.as_os_str().as_bytes())?,
        }
        let array = Arc::new(array);
        let capacity = array.status().capacity_bytes;
        let store = tierstack_store::StackSpec::new(spec.dram)
            .array(array.clone())
            .tiers(&spec.tiers, 0)
            .build()?;
        let limit = crate::core::hold_limit(spec.dram, spec.tiers.device_bytes(), capacity);
        // The intent log of sync mode's small fsyncs, beside the journal; its records are
        // replayed whatever the mode now (they were acknowledged as durable).
        let log_path = dbp.with_extension("intent");
        if !log_path.exists() {
            // Made by this start: removed again if the start fails.
            created.paths.push(log_path.clone());
        }
        let intent = crate::intent::IntentLog::open(&log_path).map_err(io_err(&log_path))?;
        let core = Arc::new(Core::new(
            backing.clone(),
            spec.sync,
            store,
            array,
            db,
            limit,
            Some(intent),
        )?);
        core.set_coherence(Duration::from_millis(spec.coherence_ms));
        let slots = match (&spec.drain_slots_dir, spec.drain_slots) {
            (Some(dir), k) if k > 0 => {
                let slots =
                    crate::drain::slots::Slots::new(dir, k).with_group(spec.drain_group.as_deref());
                slots.check().map_err(|e| {
                    FsError::Config(format!(
                        "--drain-slots-dir {}: cannot hold drain slots there ({e}): give a folder on the shared file system that every node can write",
                        dir.display()
                    ))
                })?;
                Some(slots)
            }
            _ => None,
        };
        let drainer = Drainer::with_slots(core.clone(), spec.drain_jobs, spec.drain_rate, slots);
        drainer
            .start()
            .map_err(|e| FsError::Config(format!("cannot start the drainer: {e}")))?;

        ensure_run_dir()?;
        let sock = own_socket_path(&mp);
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock).map_err(io_err(&sock))?;
        {
            // Only the buffer's user (and root) may status, drain or unmount it.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))
                .map_err(io_err(&sock))?;
            if let Some((uid, gid)) = spec.owner {
                std::os::unix::fs::chown(&sock, Some(uid), Some(gid)).map_err(io_err(&sock))?;
            }
        }

        use fuser::MountOption as O;
        let options = vec![
            O::FSName(format!("tierstack:{}", backing.display())),
            O::Subtype("tierstack".into()),
            O::DefaultPermissions,
            O::RW,
            O::NoDev,
            O::NoSuid,
        ];
        let mut cfg = fuser::Config::default();
        cfg.mount_options = options;
        cfg.acl = if spec.allow_other {
            fuser::SessionACL::All
        } else {
            fuser::SessionACL::Owner
        };
        let refresh = Arc::new(crate::refresh::Refresher::default());
        let ring = crate::uring::Ring::new(spec.transport != crate::uring::Transport::Dev);
        let fs = crate::fuse::TierFs {
            core: core.clone(),
            direct_writes: spec.direct_writes,
            refresh: refresh.clone(),
            ring: Some(ring.clone() as Arc<dyn crate::fuse::InitOffer>),
            // A diagnostic switch for comparisons (docs/BENCHMARKS.md), not a setting.
            readdirplus: std::env::var_os("TIERSTACK_FUSE_NO_READDIRPLUS").is_none(),
            only_uid: (!spec.allow_other).then(|| rustix::process::geteuid().as_raw()),
        };
        let ring_fs = fs.clone();
        let io_fs = fs.clone();
        let mut dev = None;
        let mut io_notifier = None;
        let session = fuser::Session::new(fs, &mp, &cfg)
            .and_then(|s| {
                use std::os::fd::AsFd;
                let names = core.clone();
                refresh.start(s.notifier(), Box::new(move |ino| names.links_of(ino)))?;
                io_notifier = Some(s.notifier());
                if spec.poll && crate::poll::worth_it() {
                    crate::poll::start(s.as_fd(), core.clone())?;
                }
                dev = Some(s.as_fd().try_clone_to_owned()?);
                let readers = crate::dev::Readers::start(s.as_fd(), spec.fuse_threads, &ring_fs)?;
                Ok(Served {
                    _session: s,
                    readers,
                })
            })
            .map_err(|e| {
                let _ = std::fs::remove_file(&sock);
                FsError::Config(format!("cannot mount at {}: {e}", mp.display()))
            })?;
        // INIT is answered by the session's thread: then the io_uring queues register (or
        // the mount goes on over /dev/fuse).
        if let Some(dev) = &dev {
            use std::os::fd::AsFd;
            match ring.start(dev.as_fd(), ring_fs, &mp, Duration::from_secs(10)) {
                Ok(serving) => core.set_uring(serving),
                Err(e) => {
                    let _ = std::fs::remove_file(&sock);
                    drop(session);
                    return Err(FsError::Config(format!(
                        "FUSE over io_uring failed at {}: {e}; mount with --transport dev",
                        mp.display()
                    )));
                }
            }
        }
        if spec.transport == crate::uring::Transport::Uring && !core.serves_uring() {
            let _ = std::fs::remove_file(&sock);
            drop(session);
            return Err(FsError::Config(format!(
                "--transport uring: the kernel did not offer FUSE over io_uring at {} (it needs \
                 Linux 6.14+ and `echo Y > {}`); use --transport auto or dev",
                mp.display(),
                crate::uring::ENABLE_URING
            )));
        }

        // The interception client's channel (`libtierstack_io.so`), beside the control socket.
        let io = match io_notifier {
            Some(n) => {
                let path = crate::io::io_socket_path(&sock);
                // The buffer's user (the SLURM hooks mount as root for a job's user).
                let owner = spec
                    .owner
                    .map_or_else(|| rustix::process::geteuid().as_raw(), |o| o.0);
                Some(
                    crate::io::IoServer::start(&path, &mp, io_fs, n, owner, spec.allow_other)
                        .map_err(|e| {
                            let _ = std::fs::remove_file(&sock);
                            FsError::Config(format!(
                                "cannot listen for io clients at {}: {e}",
                                path.display()
                            ))
                        })?,
                )
            }
            None => None,
        };
        tune_bdi(&mp);
        let (shutdown_tx, shutdown_rx) = mpsc::channel();
        let watch_tx = shutdown_tx.clone();
        // Set while a `shutdown` request unmounts: the mount leaves mountinfo before the
        // kernel has written its cache back through this daemon, and the watcher must not
        // take that for an unmount from outside (the daemon would exit before answering).
        let unmounting = Arc::new(AtomicBool::new(false));
        {
            // The first signal starts the stop; a second one while it drains (OnStop::Drain)
            // cuts the drain short.
            let tx = shutdown_tx.clone();
            let core = core.clone();
            let mut signals = signals;
            std::thread::Builder::new()
                .name("signals".into())
                .spawn(move || {
                    let mut first = true;
                    for sig in signals.forever() {
                        if first {
                            let _ = tx.send(Stop::Signal(sig));
                            first = false;
                        } else {
                            core.force_stop();
                        }
                    }
                })
                .map_err(|e| FsError::Config(format!("cannot start the signal thread: {e}")))?;
        }
        {
            let core = core.clone();
            let drainer = drainer.clone();
            let mp = mp.clone();
            let spec2 = spec.clone();
            let unmounting = unmounting.clone();
            std::thread::Builder::new()
                .name("control".into())
                .spawn(move || {
                    for conn in listener.incoming().flatten() {
                        let core = core.clone();
                        let drainer = drainer.clone();
                        let mp = mp.clone();
                        let spec = spec2.clone();
                        let tx = shutdown_tx.clone();
                        let unmounting = unmounting.clone();
                        let _ = std::thread::Builder::new()
                            .name("control-conn".into())
                            .spawn(move || {
                                let ctl = Control {
                                    core: &core,
                                    drainer: &drainer,
                                    mp: &mp,
                                    spec: &spec,
                                    shutdown: &tx,
                                    unmounting: &unmounting,
                                };
                                ctl.serve(conn)
                            });
                    }
                })
                .map_err(|e| FsError::Config(format!("cannot start the control thread: {e}")))?;
        }
        {
            // A mount point detached from outside (`umount -l`, `fusermount3 -u`): drain what
            // is held and exit instead of lingering with nothing to serve.
            let tx = watch_tx;
            let mp = mp.clone();
            let core = core.clone();
            std::thread::Builder::new()
                .name("mount-watch".into())
                .spawn(move || {
                    // A read of mountinfo while other mounts come and go can miss a line (seen
                    // under CI load; a stage-out then mounted the same fast tier a second time
                    // while this daemon still drained it). The mount counts as gone only when
                    // mountinfo lacks it and the mount point is no longer our file system (its
                    // device differs), three times in a row (1.5 s).
                    use std::os::unix::fs::MetadataExt;
                    let own_dev = std::fs::symlink_metadata(&mp).ok().map(|m| m.dev());
                    let mut misses = 0;
                    loop {
                        std::thread::sleep(Duration::from_millis(500));
                        if core.stopping() {
                            return;
                        }
                        let ours = || {
                            own_dev.is_some()
                                && std::fs::symlink_metadata(&mp).ok().map(|m| m.dev()) == own_dev
                        };
                        if unmounting.load(Relaxed) || mounted_type(&mp).is_some() || ours() {
                            misses = 0;
                            continue;
                        }
                        misses += 1;
                        if misses >= 3 {
                            tracing::warn!(
                                "{} was unmounted from outside: draining and exiting",
                                mp.display()
                            );
                            let _ = tx.send(Stop::Unmounted { keep: true });
                            return;
                        }
                    }
                })
                .map_err(|e| FsError::Config(format!("cannot start the mount watcher: {e}")))?;
        }
        created.armed = false;
        let mut spec = spec;
        spec.mountpoint = mp;
        spec.backing = backing;
        {
            // Group commit of the namespace journal: a group left open by the last operations
            // of a burst is committed within a few milliseconds, queued journal work in the
            // first gap in the foreground's work (`core::journal_due`).
            let core = core.clone();
            std::thread::Builder::new()
                .name("journal-commit".into())
                .spawn(move || core.group_committer())
                .map_err(|e| FsError::Config(format!("cannot start the journal committer: {e}")))?;
        }
        {
            let core = core.clone();
            std::thread::Builder::new()
                .name("store-bg".into())
                .spawn(move || core.background_loop())
                .map_err(|e| FsError::Config(format!("cannot start the store thread: {e}")))?;
        }
        {
            let core = core.clone();
            let drainer = drainer.clone();
            std::thread::Builder::new()
                .name("condition".into())
                .spawn(move || condition_when_idle(&core, &drainer))
                .map_err(|e| FsError::Config(format!("cannot start the conditioner: {e}")))?;
        }
        Ok(Daemon {
            core,
            drainer,
            session: Some(session),
            io,
            spec,
            sock,
            shutdown_rx,
        })
    }

    /// Serves until asked to shut down (the FUSE mount is gone by then), then drains
    /// everything and makes the fast tier durable. On a stop signal: keeps what was written
    /// (see [`OnStop`]), detaches the mount, and returns Ok (exit 0).
    pub fn wait(mut self) -> Result<()> {
        let why = self
            .shutdown_rx
            .recv()
            .unwrap_or(Stop::Unmounted { keep: true });
        let keep = match why {
            Stop::Signal(sig) => return self.stop_on_signal(sig),
            Stop::Unmounted { keep } => keep,
        };
        crate::notify::notify_logged(&format!(
            "STOPPING=1\nSTATUS={}",
            crate::notify::status_line(&format!(
                "unmounted {}: draining to {}",
                self.spec.mountpoint.display(),
                self.spec.backing.display()
            ))
        ));
        if let Some(s) = self.session.take() {
            if let Err(e) = s.join() {
                tracing::warn!("FUSE session ended with: {e}");
            }
        }
        // Whatever was written after the last drain check. Quarantined rows, and with
        // `umount --force` everything not drained yet, stay in the journal for the next
        // mount of the same fast tier.
        self.core.request_drain(false);
        self.drain_for_stop(None);
        self.drainer.sweep_when_settled();
        self.drainer.stop.store(true, Relaxed);
        if let Some(io) = &self.io {
            io.close();
        }
        self.core.set_stopping();
        self.core.sync_all()?;
        self.core.record_clean_stop()?;
        let _ = std::fs::remove_file(&self.sock);
        tracing::info!("unmounted {}", self.spec.mountpoint.display());
        if let (false, Some(dir)) = (keep, &self.spec.dir) {
            // Nothing left behind: the drive files of a fast tier whose every byte is in
            // BACKING (never an --array, never a fast tier that still holds anything).
            match self.core.fully_drained() {
                Ok(true) => {
                    remove_fast_tier(dir);
                    tracing::info!("removed the drained fast tier in {}", dir.display());
                }
                Ok(false) => tracing::info!(
                    "the fast tier in {} still holds what BACKING lacks: kept for the next mount",
                    dir.display()
                ),
                Err(e) => tracing::warn!("kept the fast tier in {}: {e}", dir.display()),
            }
        }
        Ok(())
    }
}

impl Daemon {
    /// Asks for the drain again and again while the drain policy says a stop drains
    /// ([`policy::stop_drain_goes_on`]): until nothing is left but quarantined rows, the
    /// drain is cut short (`umount --force`, a second signal) or `limit` has passed.
    fn drain_for_stop(&self, limit: Option<Duration>) {
        let cfg = policy::Config::DEFAULT;
        let t0 = std::time::Instant::now();
        loop {
            let at = policy::AtStop {
                drained: self.drainer.idle() || self.drainer.settled(),
                cut_short: self.core.stop_forced(),
                elapsed: t0.elapsed(),
                limit,
            };
            if !policy::stop_drain_goes_on(&at) {
                return;
            }
            self.core.request_drain(false);
            std::thread::sleep(cfg.stop_poll);
        }
    }

    /// The stop by signal, in this order: `syncfs` of the mount (the kernel's writeback
    /// cache holds what nobody fsync'd), with [`OnStop::Drain`] a drain bounded by
    /// [`STOP_DRAIN_LIMIT`], the daemon's DRAM onto the array and the journal durable, a lazy
    /// detach of the mount (no process meets a dead mount), the handles still open served for
    /// up to [`STOP_SERVE_LIMIT`], the fast tier made durable again. The clean-stop mark is
    /// written only when the kernel's connection ended (no request can come after it).
    fn stop_on_signal(mut self, sig: i32) -> Result<()> {
        let mp = self.spec.mountpoint.clone();
        tracing::warn!(
            "signal {sig}: stopping ({:?}): what was written is kept, the next mount of this fast tier resumes the drain",
            self.spec.on_stop
        );
        let status = |what: &str| {
            crate::notify::status_line(&format!("signal {sig}: {what} {}", mp.display()))
        };
        crate::notify::notify_logged(&format!(
            "STOPPING=1\nSTATUS={}",
            status("stopping: syncing")
        ));
        {
            let at = mp.clone();
            let synced = bounded(Duration::from_secs(30), move || {
                let dir = std::fs::File::open(&at)?;
                rustix::fs::syncfs(&dir).map_err(std::io::Error::from)
            });
            match synced {
                Some(Ok(())) => {}
                Some(Err(e)) => tracing::warn!("syncfs of {}: {e}", mp.display()),
                None => tracing::warn!("syncfs of {} did not return in 30 s", mp.display()),
            }
        }
        if self.spec.on_stop == OnStop::Drain {
            crate::notify::notify_logged(&format!(
                "STATUS={}",
                status(&format!(
                    "stopping: draining (up to {} s)",
                    STOP_DRAIN_LIMIT.as_secs()
                ))
            ));
            self.drain_for_stop(Some(STOP_DRAIN_LIMIT));
        }
        self.core.sync_all()?;
        crate::notify::notify_logged(&format!(
            "STATUS={}",
            status("stopping: detaching, serving open handles of")
        ));
        if let Err(e) = detach_mount(&mp, true) {
            tracing::warn!("cannot detach {}: {e}", mp.display());
        }
        let ended = match self.session.take() {
            Some(s) => bounded(STOP_SERVE_LIMIT, move || s.join()).is_some(),
            None => true,
        };
        self.drainer.stop.store(true, Relaxed);
        if let Some(io) = &self.io {
            io.close();
        }
        self.core.set_stopping();
        self.core.sync_all()?;
        if ended {
            self.core.record_clean_stop()?;
        } else {
            tracing::warn!(
                "handles on {} still open after {} s: stopping anyway (the next mount treats this as a crash: nothing is lost)",
                mp.display(),
                STOP_SERVE_LIMIT.as_secs()
            );
        }
        let _ = std::fs::remove_file(&self.sock);
        tracing::info!("stopped by signal {sig}; {} detached", mp.display());
        Ok(())
    }
}

/// The files an embedded fast tier keeps in its folder (drives, descriptor, journal, intent
/// log).
fn fast_tier_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = (0..EMBEDDED_DRIVES)
        .map(|i| dir.join(format!("drive{i}")))
        .collect();
    for f in [
        "array.toml",
        "journal.db",
        "journal.db-wal",
        "journal.db-shm",
        "journal.intent",
    ] {
        v.push(dir.join(f));
    }
    v
}

/// Removes an embedded fast tier's files from `dir`, and `dir` if that leaves it empty. Each
/// file is emptied first: its blocks are freed now, not when the last process holding it
/// open exits (a daemon's exit would then free gigabytes of conditioned drive).
pub fn remove_fast_tier(dir: &Path) {
    for f in fast_tier_files(dir) {
        if let Ok(h) = std::fs::OpenOptions::new().write(true).open(&f) {
            let _ = h.set_len(0);
        }
        let _ = std::fs::remove_file(f);
    }
    let _ = std::fs::remove_dir(dir);
}

/// Runs `f` on a thread of its own and waits for it up to `limit` (None: it did not return
/// in time; it goes on, detached).
fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("bounded".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}

/// Removes the mount at `mp` (`lazy`: at once from the namespace, the open handles still
/// served): umount2(2) as root, else `fusermount3 -u` (the setuid helper that mounted it for
/// a user who is not root).
pub fn detach_mount(mp: &Path, lazy: bool) -> std::io::Result<()> {
    let flags = if lazy {
        rustix::mount::UnmountFlags::DETACH
    } else {
        rustix::mount::UnmountFlags::empty()
    };
    match rustix::mount::unmount(mp, flags) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::PERM) => {
            let mut cmd = std::process::Command::new("fusermount3");
            cmd.arg("-u").arg("-q");
            if lazy {
                cmd.arg("-z");
            }
            let out = cmd.arg(mp).output()?;
            if out.status.success() {
                Ok(())
            } else {
                let text = String::from_utf8_lossy(&out.stderr);
                Err(std::io::Error::new(
                    if text.contains("busy") {
                        std::io::ErrorKind::ResourceBusy
                    } else {
                        std::io::ErrorKind::PermissionDenied
                    },
                    format!("fusermount3 -u: {}", text.trim()),
                ))
            }
        }
        Err(e) => Err(e.into()),
    }
}

fn status_of(core: &Core, drainer: &Drainer, mp: &Path, spec: &MountSpec) -> MountStatus {
    // One walk of the namespace for both counts: `status` answers every Prometheus scrape.
    let (dirty_files, unsettled) = core.dirty_and_unsettled();
    let (pending_ops, stuck) = core.journal_backlog();
    let inflight = drainer.in_flight();
    let array = core.array().status();
    let fig = core.figures();
    MountStatus {
        mountpoint: mp.to_path_buf(),
        backing: core.backing_path().to_path_buf(),
        pid: std::process::id(),
        mode: if spec.sync { "sync" } else { "async" }.into(),
        drain: DrainFigures {
            dirty_bytes: fig.dirty_bytes,
            dirty_files,
            pending_ops,
            drains_in_flight: inflight,
            drain_bytes_per_s: drainer.rate(),
            drained_bytes: fig.drained_bytes,
        },
        held_bytes: fig.held_bytes,
        limit_bytes: fig.limit_bytes,
        backpressure: fig.backpressure,
        idle: pending_ops == 0 && inflight == 0 && dirty_files == 0,
        settled: pending_ops == 0 && inflight == 0 && unsettled == 0,
        retry_pending: fig.retry_pending,
        array_state: array.state.clone(),
        rebuild_percent: array.rebuild_percent,
        drives_not_online: array
            .drives
            .iter()
            .filter(|d| d.state != tierstack_array::format::DriveState::Online)
            .count(),
        drive_paths: array
            .drives
            .iter()
            .map(|d| PathBuf::from(&d.path))
            .collect(),
        ops: core.ops().figures(),
        conditioned_bytes: core.array().conditioned_bytes(),
        conditioned: fig.conditioned,
        polling: fig.polling,
        polled_ms: fig.polled_ms,
        io_calls: fig.io_calls,
        io_clients: fig.io_clients,
        transport: if fig.uring { "io_uring" } else { "/dev/fuse" }.into(),
        fast_dir: spec.dir.clone(),
        stuck: stuck
            .into_iter()
            .map(|r| StuckRecord {
                path: String::from_utf8_lossy(&r.op.p1).into_owned(),
                op: format!("{:?}", r.op.kind),
                error: r.error,
                since: r.since,
            })
            .collect(),
        drain_retries: drainer.retries.load(Relaxed),
        cancelled_ops: drainer.cancelled_rows.load(Relaxed),
        pinned_bases: drainer.pinned.load(Relaxed),
        fsync_logged: fig.fsync_logged,
        fsync_flushed: fig.fsync_flushed,
        intent_replayed: fig.intent_replayed,
        last_error: core.last_error(),
        tiers: core
            .store()
            .status()
            .into_iter()
            .map(|t| TierUse {
                name: t.name,
                capacity_bytes: t.capacity_bytes,
                used_bytes: t.used_bytes,
                dirty_bytes: t.dirty_bytes,
            })
            .collect(),
    }
}

/// What a connection to the control socket answers from.
struct Control<'a> {
    core: &'a Core,
    drainer: &'a Drainer,
    mp: &'a Path,
    spec: &'a MountSpec,
    shutdown: &'a mpsc::Sender<Stop>,
    /// Set while a `shutdown` request unmounts (the mount watcher then waits).
    unmounting: &'a AtomicBool,
}

impl Control<'_> {
    /// Answers one request on `conn`. A `shutdown` is answered before the daemon is told to
    /// stop: it may exit at once after (nothing left to drain), and the caller must hear that
    /// its unmount was done.
    fn serve(&self, conn: UnixStream) {
        let mut r = BufReader::new(&conn);
        let mut line = String::new();
        if r.read_line(&mut line).is_err() {
            return;
        }
        let req: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        let (ans, then) = self.answer(&conn, &req);
        // One write of the whole line: `Value`'s Display writes token by token, a system
        // call each (about a thousand for a status) straight onto the socket.
        let mut w = &conn;
        let _ = w.write_all(format!("{ans}\n").as_bytes());
        if let Some(stop) = then {
            let _ = self.shutdown.send(stop);
        }
    }

    /// The answer to `req`, and the stop it asks for once answered.
    fn answer(
        &self,
        conn: &UnixStream,
        req: &serde_json::Value,
    ) -> (serde_json::Value, Option<Stop>) {
        let (core, drainer, mp, spec) = (self.core, self.drainer, self.mp, self.spec);
        let ans = match req.get("cmd").and_then(|c| c.as_str()) {
            Some("status") => serde_json::to_value(status_of(core, drainer, mp, spec))
                .unwrap_or_else(|e| serde_json::json!({"error": e.to_string()})),
            Some("drain") => {
                core.request_drain(req.get("retry").and_then(|v| v.as_bool()) == Some(true));
                serde_json::json!({"ok": true})
            }
            Some("shutdown") => {
                if req.get("force").and_then(|v| v.as_bool()) == Some(true) {
                    core.force_stop();
                }
                self.unmounting.store(true, Relaxed);
                let r = unmount_when_free(mp);
                return match r {
                    Ok(()) => {
                        let keep = req.get("keep").and_then(|v| v.as_bool()) == Some(true);
                        (
                            serde_json::json!({"ok": true}),
                            Some(Stop::Unmounted { keep }),
                        )
                    }
                    Err(e) => {
                        self.unmounting.store(false, Relaxed);
                        (
                            serde_json::json!({"ok": false, "error": format!("cannot unmount {}: {e}", mp.display())}),
                            None,
                        )
                    }
                };
            }
            Some("adopt") => serve_adopt(conn, core, req),
            _ => serde_json::json!({"ok": false, "error": "unknown request"}),
        };
        (ans, None)
    }
}

/// The `adopt` request: `{"cmd":"adopt","path":REL,"copy":LOCAL,"len":N,"mtime_ns":T,
/// "xxh3":H}` (see [`crate::core::adopt`]). The copy is opened here (no link followed, no
/// FIFO waited on) and must belong to the caller, as BACKING's file must, unless the caller
/// is root.
fn serve_adopt(conn: &UnixStream, core: &Core, req: &serde_json::Value) -> serde_json::Value {
    use std::os::unix::fs::OpenOptionsExt;
    let refused = |e: String, later: bool| serde_json::json!({"ok": false, "error": e, "retry": later, "kind": "request"});
    let (Some(rel), Some(copy), Ok(claim)) = (
        req.get("path").and_then(|v| v.as_str()),
        req.get("copy").and_then(|v| v.as_str()),
        serde_json::from_value::<crate::core::adopt::Claim>(req.clone()),
    ) else {
        return refused(
            "adopt needs path, copy, len, mtime_ns and xxh3".into(),
            false,
        );
    };
    let Ok((uid, _)) = crate::io::peer(conn) else {
        return refused("cannot tell who asks (SO_PEERCRED)".into(), false);
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(copy)
    {
        Ok(f) => f,
        Err(e) => return refused(format!("cannot open the copy {copy}: {e}"), false),
    };
    match core.adopt(rel.as_bytes(), &file, &claim, uid) {
        Ok(a) => serde_json::json!({"ok": true, "bytes": a.bytes, "held": a.held, "left": a.left}),
        Err(e) => serde_json::json!({"ok": false, "error": format!("{rel}: {e}"),
            "retry": e.may_pass_later(), "kind": e.kind()}),
    }
}

/// What the daemon answered to an `adopt` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdoptAnswer {
    /// Taken in as clean cache.
    Adopted(crate::core::adopt::Adopted),
    /// Refused, with why, and whether asking again later may succeed (the file is not in
    /// BACKING or the mount's view yet, or differs from the claim there).
    Refused {
        /// Why.
        why: String,
        /// Asking again later may succeed.
        retry: bool,
        /// Which refusal (`crate::core::adopt::Refusal::kind`; `request` for a request the
        /// daemon could not take up).
        kind: String,
    },
}

/// Asks the daemon of the mount at `mountpoint` (canonical) to take the local file `copy` in
/// as the clean cache of the file at `rel` (relative to the mount's root) in BACKING: it does
/// when BACKING's file has the claim's size and mtime, the mount has not changed it, and the
/// copy hashes to the claim (nothing is written to BACKING, nothing is drained).
pub fn adopt(
    mountpoint: &Path,
    rel: &Path,
    copy: &Path,
    claim: &crate::core::adopt::Claim,
    timeout: Duration,
) -> Result<AdoptAnswer> {
    let (Some(r), Some(c)) = (rel.to_str(), copy.to_str()) else {
        return Ok(AdoptAnswer::Refused {
            why: format!("{}: not a UTF-8 path", rel.display()),
            retry: false,
            kind: "request".into(),
        });
    };
    let v = request(
        mountpoint,
        &serde_json::json!({"cmd": "adopt", "path": r, "copy": c, "len": claim.len,
            "mtime_ns": claim.mtime_ns, "xxh3": claim.xxh3}),
        timeout,
    )?;
    if v.get("ok").and_then(|x| x.as_bool()) == Some(true) {
        let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        return Ok(AdoptAnswer::Adopted(crate::core::adopt::Adopted {
            bytes: n("bytes"),
            held: n("held"),
            left: n("left"),
        }));
    }
    Ok(AdoptAnswer::Refused {
        why: v
            .get("error")
            .and_then(|x| x.as_str())
            .unwrap_or("no reason given")
            .to_string(),
        retry: v.get("retry").and_then(|x| x.as_bool()) == Some(true),
        kind: v
            .get("kind")
            .and_then(|x| x.as_str())
            .unwrap_or("request")
            .to_string(),
    })
}

/// Runs a mount in this process until it is unmounted with `tierstack umount`.
pub fn run(spec: MountSpec, on_ready: impl FnOnce(&MountSpec)) -> Result<()> {
    // Pages are 1 MiB buffers allocated and freed at the write rate: keep them on the heap
    // (reused) instead of fresh mmaps that fault and zero every page.
    // SAFETY: mallopt only changes allocator tunables; called before the mount's threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
    let d = Daemon::start(spec)?;
    on_ready(&d.spec);
    d.wait()
}

/// How long an unmount waits for the mount to stop being busy.
const UNMOUNT_WAIT: Duration = Duration::from_secs(2);

/// unmount(2) of `mp`, tried again for up to [`UNMOUNT_WAIT`] while the kernel says it is
/// busy: a file's close returns before the kernel's release of it reaches the daemon, and a
/// path walk holds the mount for a moment, so a mount its last user just left can still be
/// busy for a few milliseconds. A file still open keeps it busy past that: the error then.
fn unmount_when_free(mp: &Path) -> std::io::Result<()> {
    let t0 = std::time::Instant::now();
    loop {
        match detach_mount(mp, false) {
            Err(e)
                if (e.raw_os_error() == Some(libc::EBUSY)
                    || e.kind() == std::io::ErrorKind::ResourceBusy)
                    && t0.elapsed() < UNMOUNT_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

/// The foreground must have been quiet this long before the fast tier is conditioned.
const CONDITION_QUIET: Duration = Duration::from_secs(1);

/// Conditioning runs at most this many bytes (all drives) ahead of what the array has written
/// since the mount: an idle mount allocates this much of its drive files, not all of them,
/// and each byte the workload writes lets it allocate one more.
const CONDITION_AHEAD: u64 = 1 << 30;

/// Whether conditioning may write another stripe: `conditioned` bytes written by it so far,
/// `written` bytes the log wrote to the drives since the mount.
fn may_condition(conditioned: u64, written: u64) -> bool {
    conditioned < written.saturating_add(CONDITION_AHEAD)
}

/// Conditions the fast tier's file drives ([`Array::condition_step`]) while the mount has
/// nothing else to do: the foreground quiet for [`CONDITION_QUIET`], nothing to drain, no
/// dirty page. One stripe at a time, so a write that arrives waits for one stripe at most.
/// `Core::conditioned` says whether there is nothing to do now (done, not possible, or an
/// error, which is logged); after that it looks again every 10 s (60 s after an error). Ends
/// within 50 ms of the daemon stopping.
fn condition_when_idle(core: &Core, drainer: &Drainer) {
    let nap = Duration::from_millis(50);
    let mut pause = nap;
    while !core.stopping() {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < pause && !core.stopping() {
            std::thread::sleep(nap);
        }
        pause = nap;
        if core.quiet_for() < CONDITION_QUIET || core.store().dirty_bytes() > 0 || !drainer.idle() {
            continue;
        }
        while !core.stopping() && core.quiet_for() >= CONDITION_QUIET {
            let array = core.array();
            let ahead = may_condition(array.conditioned_bytes(), array.drive_bytes_written());
            match if ahead {
                array.condition_step()
            } else {
                Ok(None)
            } {
                Ok(Some(_)) => core.set_conditioned(false),
                Ok(None) => {
                    core.set_conditioned(true);
                    pause = Duration::from_secs(10);
                    break;
                }
                Err(e) => {
                    tracing::warn!("conditioning the fast tier: {e}");
                    core.set_conditioned(true);
                    pause = Duration::from_secs(60);
                    break;
                }
            }
        }
    }
}

/// Tunes the mount's backing-device info in /sys (best effort; unchanged where /sys is
/// read-only, and said in the daemon's log):
/// - `max_ratio` 25: the kernel lets a FUSE mount hold only 1 % of the dirty page-cache limit
///   for its files, which throttles the writeback cache's small writes long before the fast
///   tier is busy. The mount daemon is trusted (root): allow it a quarter.
/// - `read_ahead_kb` 4096: the kernel offers a FUSE mount 128 KiB of read-ahead, so a
///   sequential reader gets 128 KiB per round trip to the daemon. A 4 MiB window keeps 1 MiB
///   reads in flight: a 256 MiB file read back at 1.9 GB/s with 128 KiB, 3.0 with 1 MiB,
///   4.2 GB/s with 4 MiB here. The window only grows for sequential reads.
fn tune_bdi(mp: &Path) {
    let Ok(st) = rustix::fs::stat(mp) else { return };
    let dir = format!(
        "/sys/class/bdi/{}:{}",
        rustix::fs::major(st.st_dev),
        rustix::fs::minor(st.st_dev)
    );
    for (knob, value) in [("max_ratio", "25"), ("read_ahead_kb", "4096")] {
        let path = format!("{dir}/{knob}");
        if let Err(e) = std::fs::write(&path, value) {
            tracing::info!("cannot set {path}: {e}");
        }
    }
}

/// The embedded fast tier's folder when neither `--dir` nor `--array` is given:
/// `/var/tmp/tierstack/<xxh3-64 of the canonical BACKING>` for root,
/// `/var/tmp/tierstack-UID/<…>` for another user.
pub fn default_dir(backing: &Path) -> PathBuf {
    let h = xxhash_rust::xxh3::xxh3_64(backing.as_os_str().as_bytes());
    let uid = rustix::process::geteuid();
    // Keyed by user too: two users of one BACKING never share drive files.
    let base = if uid.is_root() {
        PathBuf::from("/var/tmp/tierstack")
    } else {
        PathBuf::from(format!("/var/tmp/tierstack-{}", uid.as_raw()))
    };
    base.join(format!("{h:016x}"))
}

#[cfg(test)]
mod sizing_tests {

    #[test]
    fn conditioning_stays_a_bounded_distance_ahead_of_the_writes() {
        assert!(super::may_condition(0, 0));
        assert!(super::may_condition((1 << 30) - 1, 0));
        assert!(
            !super::may_condition(1 << 30, 0),
            "an idle mount stops at the bound"
        );
        assert!(
            super::may_condition(1 << 30, 4096),
            "each byte written allows one more"
        );
        assert!(super::may_condition(u64::MAX - 1, u64::MAX));
    }
    use super::fast_tier_for;

    #[test]
    fn a_buffer_of_one_gib_gets_three_data_drives_of_a_third() {
        let (drive, dram) = fast_tier_for(1 << 30);
        assert_eq!(drive, 342 << 20);
        assert!(3 * drive >= 1 << 30);
        assert_eq!(dram, 256 << 20);
        // Small buffers keep 64 MiB drives and DRAM; large ones 1 GiB of DRAM.
        assert_eq!(fast_tier_for(1 << 20), (64 << 20, 64 << 20));
        assert_eq!(fast_tier_for(1 << 40).1, 1 << 30);
    }
}
