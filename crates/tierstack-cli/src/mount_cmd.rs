//! `tierstack mount`, `status`, `drain`, `umount` (the burst-buffer front).
//!
//! `mount` checks its input, then starts `tierstack mount-daemon SPEC` in a new session and
//! returns once the daemon's control socket answers (the FUSE mount is up by then). The
//! socket of a mount is found from its canonical mountpoint (see
//! `tierstack_fs::mount::socket_path`).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::ProgressBar;
use tierstack_bench::fmt_size;
use tierstack_fs::mount::{self as fsmount, MountSpec, MountStatus};
use tierstack_fs::notify;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// fsync returns when the data is durable on the array (and the journal on disk).
    Sync,
    /// fsync returns when the data is in the store's DRAM.
    Async,
}

/// How FUSE requests reach the mount daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    /// FUSE over io_uring where the kernel offers it (Linux 6.14+ with
    /// /sys/module/fuse/parameters/enable_uring set to Y), else /dev/fuse.
    Auto,
    /// FUSE over io_uring, or fail.
    Uring,
    /// /dev/fuse only (read and write by the daemon's threads).
    Dev,
}

#[derive(Args)]
pub struct MountArgs {
    /// The backing directory (on the parallel file system).
    pub backing: PathBuf,
    /// Where to mount (an empty directory).
    pub mountpoint: PathBuf,
    /// The fast tier: an array made with `tierstack array create` (its descriptor).
    #[arg(long, conflicts_with = "dir")]
    pub array: Option<PathBuf>,
    /// The fast tier: a folder where tierstack makes (or finds again) a small RAID 5 of file
    /// drives and the namespace journal, removed by a umount after which BACKING holds
    /// everything (see umount --keep). Default: /var/tmp/tierstack/<hash of BACKING>
    /// (/var/tmp/tierstack-UID/... for a user who is not root).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Size of each of the 4 file drives made under --dir (sparse files). Default: 2G, or
    /// three quarters of --dram plus --vram when that is more, so that the array (which a
    /// mount fills to two thirds) can take the fast tiers whole.
    #[arg(long)]
    pub drive_size: Option<String>,
    /// The store's DRAM tier.
    #[arg(long, default_value = "1G")]
    pub dram: String,
    /// A VRAM tier of this size on the GPU (--gpu) between the DRAM tier and the array: pages
    /// DRAM evicts land there at PCIe speed and are written to the array when it fills or at
    /// fsync in sync mode (VRAM is as volatile as DRAM). Needs an NVIDIA driver. Default: none.
    #[arg(long)]
    pub vram: Option<String>,
    /// The GPU of --vram (0 is the first; `tierstack doctor` lists them).
    #[arg(long, default_value_t = 0, requires = "vram")]
    pub gpu: u32,
    /// When fsync returns: sync (data durable on the array) or async (data in DRAM).
    #[arg(long, value_enum, default_value_t = Mode::Sync)]
    pub mode: Mode,
    /// Stay in the foreground (the mount ends with `tierstack umount`, or Ctrl-C: see
    /// --on-stop).
    #[arg(long)]
    pub foreground: bool,
    /// Let other users use the mount (permissions are still checked by the kernel).
    #[arg(long)]
    pub allow_other: bool,
    /// Limit the drain to this many MB/s (default: unlimited).
    #[arg(long, value_name = "MB/s")]
    pub drain_rate: Option<f64>,
    /// Files drained in parallel.
    #[arg(long, default_value_t = 4)]
    pub drain_jobs: usize,
    /// At most this many drain streams at once across every mount, on any node, that names
    /// the same --drain-slots-dir: a site-wide bound on what the shared file system is
    /// asked to take (locks in the file system itself; a dead node's slots free themselves).
    #[arg(long, value_name = "K", requires = "drain_slots_dir")]
    pub drain_slots: Option<u32>,
    /// The folder of the site-wide drain slots: one folder on the shared file system that
    /// BACKING is on, the same for every node (e.g. /pfs/.tierstack-drain-slots).
    #[arg(long, value_name = "DIR", requires = "drain_slots")]
    pub drain_slots_dir: Option<PathBuf>,
    /// Share one place in the drain slots' queue with every mount of the same group (a
    /// job's nodes: the SLURM hooks give `slurm-JOBID`): the group goes in the order of its
    /// first drain, and its mounts take turns. 1 to 64 of A-Z a-z 0-9 - _; no effect
    /// without --drain-slots.
    #[arg(long, value_name = "NAME")]
    pub drain_group: Option<String>,
    /// How soon names that other writers add to BACKING's folders (other nodes' buffers
    /// draining into the same shared file system) show in the mount: a directory's folder
    /// is looked at again at most this often, when a name is missing or the directory is
    /// listed, and names seen absent are forgotten by the kernel after it; `0`: never (this
    /// mount is the only writer). Picked up only while this mount has nothing left to drain.
    #[arg(long, value_name = "DURATION", default_value = "1s")]
    pub coherence: String,
    /// Write every handle through the kernel's page cache. By default a write-only open of a
    /// new or truncated file (a checkpoint writer) sends its writes straight to the daemon,
    /// once, instead of through the page cache; while such a handle is open, its file's mtime
    /// reads as of the open (the kernel keeps a cached file's times itself).
    #[arg(long)]
    pub cached_writes: bool,
    /// Let every FUSE thread sleep between requests. By default, while the mount serves
    /// requests back to back, one FUSE thread polls the device instead of sleeping (one CPU
    /// busy; it stops 3 ms after the last request): a small operation then costs no wake-up
    /// of the daemon. Off by itself on a machine with one CPU.
    #[arg(long)]
    pub no_poll: bool,
    /// How requests reach the daemon. With io_uring each CPU's requests are answered by a
    /// thread on that CPU, without a read or write of /dev/fuse or a wake-up of another CPU:
    /// small operations (create, stat, unlink) cost less.
    #[arg(long, value_enum, default_value = "auto")]
    pub transport: TransportArg,
    /// Serve Prometheus metrics at ADDR:PORT (`GET /metrics`), from the mount daemon.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
    /// What SIGTERM, SIGINT (Ctrl-C in the foreground) and SIGHUP do: `persist` puts what the
    /// daemon holds in DRAM on the fast tier and makes its journal durable (seconds; within
    /// systemd's stop timeout), `drain` drains to the backing directory first (60 s at most),
    /// then persists the rest. Either way nothing written is lost, the mount is detached
    /// (never left "not connected"), and the next mount of the same fast tier resumes the
    /// drain.
    #[arg(long, value_enum, default_value = "persist")]
    pub on_stop: OnStopArg,
    /// Root only: the buffer is for this user (UID:GID, as the SLURM hooks make a job's):
    /// its control socket and log are theirs, so they can `status`, `drain` and `umount` it
    /// and nobody else can.
    #[arg(long, value_name = "UID:GID")]
    pub owner: Option<String>,
}

/// See [`MountArgs::on_stop`].
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnStopArg {
    Persist,
    Drain,
}

#[derive(Args)]
pub struct StatusArgs {
    pub mountpoint: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct DrainArgs {
    pub mountpoint: PathBuf,
    /// Wait until everything is in the backing directory (stops with an error naming a
    /// record the backing refuses).
    #[arg(long)]
    pub wait: bool,
    /// Try the quarantined records (`status` lists them under `stuck`) again, e.g. after
    /// fixing the backing directory's permissions or making again a folder someone removed.
    #[arg(long)]
    pub retry: bool,
    /// With --wait: give up after this long (e.g. 90s, 10m, 2h) with a non-zero exit. Also
    /// bounds the wait for a busy daemon to take the request (at most 30 s).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
}

#[derive(Args)]
pub struct UmountArgs {
    pub mountpoint: PathBuf,
    /// Give up waiting for a busy daemon, the drain and the unmount after this long (e.g. 90s,
    /// 10m, 2h; default an hour): exit non-zero with nothing lost.
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Unmount without waiting for the drain or despite quarantined records: whatever is not
    /// in the backing directory yet stays in the fast tier (--dir/--array), and mounting the
    /// same backing with it again resumes the drain.
    #[arg(long)]
    pub force: bool,
    /// Keep the fast tier's drive files (--dir) after everything drained. By default a
    /// fast tier that holds nothing BACKING lacks is removed at umount; one that still holds
    /// something (--force, quarantined records) is always kept.
    #[arg(long)]
    pub keep: bool,
}

/// Parses `--FLAG`'s duration (`90s`, `10m`, `2h 30m`, a number of seconds), or a usage error
/// naming the flag.
pub(crate) fn parse_duration(flag: &str, s: &str) -> Result<Duration> {
    tierstack_common::parse_duration(s).map_err(|e| crate::usage(format!("--{flag}: {e}")))
}

/// One line naming the quarantined records and what to do.
fn stuck_message(mp: &Path, s: &MountStatus) -> String {
    let first = &s.stuck[0];
    let mut path = first.path.clone();
    if path.len() > 120 {
        let cut = (0..=path.len() - 100)
            .rev()
            .find(|i| path.is_char_boundary(*i))
            .unwrap_or(0);
        path = format!("...{}", &path[cut..]);
    }
    // A folder on the way gone from BACKING (removed by someone else while the mount still
    // shows it): say which, and how to make it again.
    let fix = match first.path.rsplit_once('/') {
        Some((dir, _)) if first.error.contains("(os error 2)") => format!(
            "make the folder again if it is missing (`mkdir -p {}`)",
            s.backing.join(dir).display()
        ),
        _ => "fix the backing".to_string(),
    };
    format!(
        "{} record(s) refused by the backing directory (first: {} {}: {}); their data is kept in the fast tier: {fix} and run `tierstack drain {} --retry`, or `tierstack umount {} --force` to keep them for the next mount",
        s.stuck.len(),
        first.op,
        path,
        first.error,
        mp.display(),
        mp.display()
    )
}

fn size_arg(name: &str, s: &str, min: u64) -> Result<u64> {
    let v = crate::size_flag(name, s)?;
    if v < min {
        return Err(crate::usage(format!(
            "--{name} {s} is too small: give at least {}",
            fmt_size(min)
        )));
    }
    Ok(v)
}

/// `--owner UID:GID` (root only).
fn owner_arg(s: &str) -> Result<(u32, u32)> {
    let bad = || crate::usage(format!("--owner {s}: give UID:GID, e.g. --owner 1000:1000"));
    let (u, g) = s.split_once(':').ok_or_else(bad)?;
    let ids = (
        u.trim().parse().map_err(|_| bad())?,
        g.trim().parse().map_err(|_| bad())?,
    );
    if !rustix::process::geteuid().is_root() {
        return Err(crate::usage(
            "--owner: only root mounts a buffer for another user",
        ));
    }
    Ok(ids)
}

fn is_inside(a: &Path, b: &Path) -> bool {
    a == b || a.starts_with(b)
}

/// The error for a request to the daemon of `mp` that got no answer (`e`): a daemon that is
/// alive but busy is said to be so (nothing is lost; try again), never "not mounted".
fn no_answer(mp: &Path, what: &str, e: &dyn std::fmt::Display) -> anyhow::Error {
    if fsmount::daemon_listens(mp) {
        anyhow!(
            "the daemon of {} is alive but did not answer {what} ({e}): it is busy (see `tierstack status {}` or its log); nothing is lost: try again",
            mp.display(),
            mp.display()
        )
    } else {
        not_mounted(mp)
    }
}

fn not_mounted(mp: &Path) -> anyhow::Error {
    anyhow!(
        "no tierstack mount answers at {} (mount it with `tierstack mount BACKING {}`)",
        mp.display(),
        mp.display()
    )
}

fn connect_status(mp: &Path) -> Result<MountStatus> {
    fsmount::status(mp).map_err(|e| match e {
        tierstack_fs::FsError::Control { path, msg } if msg.contains("ermission denied") => {
            anyhow!(
                "the mount at {} belongs to another user: its control socket {} refuses you (permission denied); run this as the mount's owner or as root",
                mp.display(),
                path.display()
            )
        }
        _ => not_mounted(mp),
    })
}

pub fn mount(a: MountArgs) -> Result<()> {
    let sizes = MountSizes::from_args(&a)?;
    let backing = check_backing(&a.backing)?;
    let mp = check_mountpoint(&a.mountpoint, &backing)?;
    let (array, dir) = fast_tier(&a, &backing, &mp)?;
    let sizes = match &dir {
        Some(d) if a.drive_size.is_none() => sizes.within_free(d),
        _ => sizes,
    };
    let spec = mount_spec(&a, sizes, backing, mp, array, dir)?;
    if let Some(m) = &a.metrics {
        tierstack_node::metrics::check_addr(m).map_err(crate::node_err)?;
    }
    if a.foreground {
        if let Some(m) = &a.metrics {
            tierstack_node::metrics::serve_mount(m, &spec.mountpoint).map_err(crate::node_err)?;
        }
        return fsmount::run(spec, |s| {
            println!(
                "mounted {} at {} (pid {}, foreground)",
                s.backing.display(),
                s.mountpoint.display(),
                std::process::id()
            );
            // Under systemd (tierstack@.service, Type=notify): the mount is served.
            notify::notify_logged(&format!(
                "READY=1\nSTATUS={}",
                notify::status_line(&format!(
                    "serving {} at {}",
                    s.backing.display(),
                    s.mountpoint.display()
                ))
            ));
        })
        .map_err(anyhow::Error::from);
    }
    spawn_daemon(&spec, a.metrics.as_deref())
}

/// The sizes and rates of a mount, checked: tiers, drives and drain.
#[derive(Clone, Copy)]
struct MountSizes {
    dram: u64,
    /// Bytes of the VRAM tier (0: none).
    vram: u64,
    drive_size: u64,
    /// Bytes per second (none: unlimited).
    drain_rate: Option<u64>,
}

impl MountSizes {
    /// The default drive size held to the free space where a new fast tier in `dir` would
    /// be made (its nearest existing folder), with a note when that makes it smaller than
    /// the fast tiers want. An existing fast tier keeps its drives whatever is asked.
    fn within_free(self, dir: &Path) -> MountSizes {
        if dir.join("array.toml").exists() {
            return self;
        }
        let Some(free) = dir
            .ancestors()
            .find_map(|p| rustix::fs::statvfs(p).ok())
            .map(|st| st.f_bavail.saturating_mul(st.f_frsize))
        else {
            return self;
        };
        let fits = tierstack_fs::core::drive_size_within(self.drive_size, free);
        if fits < self.drive_size {
            eprintln!(
                "tierstack: note: the fast tier's drives are {}G each, not the {}G that would take the DRAM and VRAM tiers whole: {} has {} free; give --dir on a larger file system (or --drive-size)",
                fits >> 30,
                self.drive_size >> 30,
                dir.display(),
                fmt_size(free)
            );
        }
        MountSizes {
            drive_size: fits,
            ..self
        }
    }

    /// Checks --dram, --vram (against the GPU), --drive-size, --drain-rate and --drain-jobs.
    fn from_args(a: &MountArgs) -> Result<MountSizes> {
        let dram = size_arg("dram", &a.dram, 4 << 20)?;
        let vram = match &a.vram {
            Some(v) => {
                let bytes = size_arg("vram", v, 1 << 20)?;
                check_gpu("--vram", a.gpu, bytes)?;
                bytes
            }
            None => 0,
        };
        let drive_size = match &a.drive_size {
            Some(d) => {
                let drive = size_arg("drive-size", d, 16 << 20)?;
                let fast = dram + vram;
                // Three drives of data, less a little for superblocks and summaries.
                let held = tierstack_fs::core::hold_limit(dram, vram, drive * 3 / 100 * 98);
                // Said for a VRAM tier, where the GPU memory would stand idle (a DRAM tier
                // larger than the array still caches what is read).
                if vram > 0 && held < fast {
                    eprintln!(
                        "tierstack: note: a new fast tier of 4 x --drive-size {d} holds at most {} of what is written, less than --dram plus --vram ({}): writers then wait for the drain; give --drive-size {}G (or leave it out) to use them whole",
                        fmt_size(held),
                        fmt_size(fast),
                        tierstack_fs::core::default_drive_size(dram, vram) >> 30
                    );
                }
                drive
            }
            None => tierstack_fs::core::default_drive_size(dram, vram),
        };
        let drain_rate = match a.drain_rate {
            Some(r) if !(r.is_finite() && r > 0.0) => {
                usage_bail!("--drain-rate {r} is not a rate: give MB/s above 0")
            }
            Some(r) => Some((r * 1e6) as u64),
            None => None,
        };
        if let Some(k) = a.drain_slots {
            if k == 0 || k > tierstack_fs::drain::slots::MAX_SLOTS {
                usage_bail!(
                    "--drain-slots {k} is out of range: give 1 to {}",
                    tierstack_fs::drain::slots::MAX_SLOTS
                );
            }
        }
        if let Some(g) = &a.drain_group {
            if !tierstack_fs::drain::slots::valid_group(g) {
                usage_bail!(
                    "--drain-group {g:?} is not a group name: give 1 to 64 of A-Z a-z 0-9 - _"
                );
            }
        }
        if a.drain_jobs == 0 || a.drain_jobs > 256 {
            usage_bail!(
                "--drain-jobs {} is out of range: give 1 to 256",
                a.drain_jobs
            );
        }
        Ok(MountSizes {
            dram,
            vram,
            drive_size,
            drain_rate,
        })
    }
}

/// The backing directory, canonical; it must exist and be a directory.
fn check_backing(backing: &Path) -> Result<PathBuf> {
    let canonical = std::fs::canonicalize(backing).map_err(|e| {
        anyhow!(
            "backing directory {} cannot be used ({e}): give an existing directory",
            backing.display()
        )
    })?;
    if !canonical.is_dir() {
        bail!(
            "backing {} is not a directory: give the directory to mount over",
            canonical.display()
        );
    }
    Ok(canonical)
}

/// The mountpoint, canonical: an empty directory that nothing is mounted on (a dead
/// daemon's mount is cleared) and that does not overlap `backing`.
fn check_mountpoint(mountpoint: &Path, backing: &Path) -> Result<PathBuf> {
    let mp = fsmount::canonical_mountpoint(mountpoint)
        .map_err(|e| anyhow!("mountpoint {}: {e}", mountpoint.display()))?;
    // A mount whose daemon died (kill -9, crash) is detached first; the drain resumes.
    if fsmount::status(&mp).is_ok() {
        let st = fsmount::status(&mp).ok();
        bail!(
            "{} is already a tierstack mount (daemon pid {}): run `tierstack umount {}` first",
            mp.display(),
            st.map_or(0, |s| s.pid),
            mp.display()
        );
    }
    if fsmount::daemon_listens(&mp) && tierstack_common::mounts::is_mounted(&mp) {
        bail!(
            "{} is already a tierstack mount (its daemon is busy and did not answer): run `tierstack umount {}` first",
            mp.display(),
            mp.display()
        );
    }
    fsmount::clear_stale(&mp).map_err(anyhow::Error::from)?;
    if let Some(t) = tierstack_common::mounts::mounted_type(&mp) {
        bail!(
            "{} is already a mount point ({t}): unmount it first or pick another directory",
            mp.display()
        );
    }
    let md = std::fs::metadata(&mp).map_err(|e| {
        anyhow!(
            "mountpoint {} cannot be used ({e}): create an empty directory there",
            mp.display()
        )
    })?;
    if !md.is_dir() {
        bail!(
            "mountpoint {} is not a directory: give an empty directory",
            mp.display()
        );
    }
    let mut entries =
        std::fs::read_dir(&mp).with_context(|| format!("cannot list {}", mp.display()))?;
    if entries.next().is_some() {
        bail!(
            "mountpoint {} is not empty: give an empty directory",
            mp.display()
        );
    }
    if is_inside(&mp, backing) || is_inside(backing, &mp) {
        bail!(
            "the mountpoint {} and the backing directory {} overlap: mount elsewhere",
            mp.display(),
            backing.display()
        );
    }
    Ok(mp)
}

/// The fast tier: the array descriptor (canonical) or the folder of file drives (absolute,
/// --dir or the default), which must lie outside the mountpoint and the backing directory.
fn fast_tier(
    a: &MountArgs,
    backing: &Path,
    mp: &Path,
) -> Result<(Option<PathBuf>, Option<PathBuf>)> {
    let array = match &a.array {
        Some(p) => {
            let c = std::fs::canonicalize(p).map_err(|e| {
                anyhow!(
                    "array descriptor {} cannot be read ({e}): create it with `tierstack array create`",
                    p.display()
                )
            })?;
            Some(c)
        }
        None => None,
    };
    let dir = match (&array, &a.dir) {
        (Some(_), _) => None,
        (None, Some(d)) => Some(d.clone()),
        (None, None) => Some(fsmount::default_dir(backing)),
    };
    if let Some(d) = &dir {
        if d.exists() && !d.is_dir() {
            usage_bail!("--dir {} is not a directory", d.display());
        }
        let dabs = std::path::absolute(d).unwrap_or(d.clone());
        if is_inside(&dabs, mp) || is_inside(&dabs, backing) {
            usage_bail!(
                "--dir {} lies inside the mountpoint or the backing directory: put the fast tier elsewhere",
                d.display()
            );
        }
    }
    let dir = dir.map(|d| std::path::absolute(&d).unwrap_or(d));
    Ok((array, dir))
}

/// The daemon's spec from the checked paths and sizes and the remaining flags (--owner is
/// checked here).
fn mount_spec(
    a: &MountArgs,
    sizes: MountSizes,
    backing: PathBuf,
    mp: PathBuf,
    array: Option<PathBuf>,
    dir: Option<PathBuf>,
) -> Result<MountSpec> {
    Ok(MountSpec {
        backing,
        mountpoint: mp,
        array,
        dir,
        drive_size: sizes.drive_size,
        dram: sizes.dram,
        sync: a.mode == Mode::Sync,
        allow_other: a.allow_other,
        drain_rate: sizes.drain_rate,
        drain_jobs: a.drain_jobs,
        drain_slots: a.drain_slots.unwrap_or(0),
        drain_slots_dir: a.drain_slots_dir.clone(),
        drain_group: a.drain_group.clone(),
        coherence_ms: parse_duration("coherence", &a.coherence)?.as_millis() as u64,
        fuse_threads: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(4)
            .clamp(4, 16),
        tiers: tierstack_store::Tiers {
            vram: (sizes.vram > 0).then_some(tierstack_store::Vram {
                gpu: a.gpu,
                bytes: sizes.vram,
            }),
            compress: false,
        },
        direct_writes: !a.cached_writes,
        poll: !a.no_poll,
        transport: match a.transport {
            TransportArg::Auto => tierstack_fs::uring::Transport::Auto,
            TransportArg::Uring => tierstack_fs::uring::Transport::Uring,
            TransportArg::Dev => tierstack_fs::uring::Transport::Dev,
        },
        on_stop: match a.on_stop {
            OnStopArg::Persist => fsmount::OnStop::Persist,
            OnStopArg::Drain => fsmount::OnStop::Drain,
        },
        owner: a.owner.as_deref().map(owner_arg).transpose()?,
    })
}

/// Refuses `what` (`--vram`, `bench vram`) before anything is made when GPU `gpu` is missing
/// or has less than `bytes` free.
pub(crate) fn check_gpu(what: &str, gpu: u32, bytes: u64) -> Result<()> {
    let g = tierstack_store::Gpu::open(gpu).map_err(|e| anyhow!("{what}: {e}"))?;
    let info = g.info().map_err(|e| anyhow!("{what}: {e}"))?;
    if bytes > info.free_bytes {
        bail!(
            "{what}: {} is more than GPU {gpu} ({}) has free ({}): give a smaller size",
            fmt_size(bytes),
            info.name,
            fmt_size(info.free_bytes)
        );
    }
    Ok(())
}

fn spawn_daemon(spec: &MountSpec, metrics: Option<&str>) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the tierstack executable")?;
    let json = serde_json::to_string(spec)?;
    fsmount::ensure_run_dir().map_err(anyhow::Error::from)?;
    let (log, log_path) = fsmount::open_log(&spec.mountpoint).map_err(anyhow::Error::from)?;
    if let Some((uid, gid)) = spec.owner {
        std::os::unix::fs::chown(&log_path, Some(uid), Some(gid))
            .with_context(|| format!("cannot give {} to {uid}:{gid}", log_path.display()))?;
    }
    let log2 = log.try_clone()?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount-daemon").arg(json);
    if let Some(m) = metrics {
        cmd.arg("--metrics").arg(m);
    }
    cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
    // Under systemd this process is the service's main one and hands it to the daemon
    // (MAINPID= below), which then says STOPPING=1 itself: it keeps NOTIFY_SOCKET, not the
    // pid that made this process the one to speak. Anywhere else (a hook of another service)
    // the daemon gets no NOTIFY_SOCKET at all.
    let notifies = notify::addr().is_some();
    if notifies {
        cmd.env_remove(notify::EXEC_PID_VAR);
    } else {
        cmd.env_remove(notify::SOCKET_VAR);
    }
    // SAFETY: the closure runs in the forked child before exec and only calls setsid(2),
    // which is async-signal-safe; it touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the mount daemon")?;
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            let mut text = String::new();
            if let Ok(mut f) = std::fs::File::open(&log_path) {
                let _ = f.read_to_string(&mut text);
            }
            let last = tierstack_common::process::last_error_line(&text);
            bail!(
                "the mount daemon stopped ({st}): {}",
                if last.is_empty() {
                    "no message".into()
                } else {
                    last
                }
            );
        }
        if let Ok(s) = fsmount::status(&spec.mountpoint) {
            if notifies {
                notify::notify_logged(&format!(
                    "MAINPID={}\nREADY=1\nSTATUS={}",
                    child.id(),
                    notify::status_line(&format!(
                        "serving {} at {} (daemon pid {})",
                        spec.backing.display(),
                        spec.mountpoint.display(),
                        child.id()
                    ))
                ));
            }
            println!(
                "mounted {} at {} (daemon pid {}, mode {}, log {})",
                spec.backing.display(),
                spec.mountpoint.display(),
                s.pid,
                s.mode,
                log_path.display()
            );
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            let _ = fsmount::clear_stale(&spec.mountpoint);
            bail!(
                "the mount daemon did not get ready in 120 s (see {})",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn print_status(s: &MountStatus) {
    println!(
        "mount       {} -> {}",
        s.mountpoint.display(),
        s.backing.display()
    );
    println!("daemon pid  {}  mode {}", s.pid, s.mode);
    println!(
        "waiting     {} in {} files, {} journal ops ({} drains in flight)",
        fmt_size(s.drain.dirty_bytes),
        s.drain.dirty_files,
        s.drain.pending_ops,
        s.drain.drains_in_flight
    );
    println!(
        "drain       {}/s, {} drained{}",
        fmt_size(s.drain.drain_bytes_per_s as u64),
        fmt_size(s.drain.drained_bytes),
        if s.backpressure {
            ", writers waiting (backpressure)"
        } else {
            ""
        }
    );
    if s.cancelled_ops > 0 {
        println!(
            "cancelled   {} journal ops of files created and removed before they drained",
            s.cancelled_ops
        );
    }
    if s.pinned_bases > 0 {
        println!(
            "pinned      {} files copied back from BACKING before a drained rename or removal took their names",
            s.pinned_bases
        );
    }
    if s.fsync_logged + s.fsync_flushed + s.intent_replayed > 0 {
        println!(
            "fsync       {} in the intent log, {} by a full flush{}",
            s.fsync_logged,
            s.fsync_flushed,
            if s.intent_replayed > 0 {
                format!("; {} intent records replayed at start", s.intent_replayed)
            } else {
                String::new()
            }
        );
    }
    if s.conditioned_bytes > 0 || !s.conditioned {
        println!(
            "condition   {} of never-written drive space zeroed while idle{}",
            fmt_size(s.conditioned_bytes),
            if s.conditioned {
                ", nothing left to do now"
            } else {
                ", going on when idle"
            }
        );
    }
    if !s.transport.is_empty() {
        println!("transport   {}", s.transport);
    }
    if s.io_calls > 0 || s.io_clients > 0 {
        println!(
            "io client   {} calls served over shared memory, {} processes connected",
            s.io_calls, s.io_clients
        );
    }
    if s.polled_ms > 0 || s.polling {
        println!(
            "poll        {:.1} s of one CPU spent polling the FUSE device{}",
            s.polled_ms as f64 / 1000.0,
            if s.polling { ", polling now" } else { "" }
        );
    }
    for t in &s.tiers {
        println!(
            "tier {:<6} {} of {} used, {} dirty",
            t.name,
            fmt_size(t.used_bytes),
            fmt_size(t.capacity_bytes),
            fmt_size(t.dirty_bytes)
        );
    }
    if let Some(e) = &s.last_error {
        println!("last error  {e} ({} retries)", s.drain_retries);
    }
    if !s.stuck.is_empty() {
        println!("stuck       {}", stuck_message(&s.mountpoint, s));
    }
    // The busiest operations (all of them in --json).
    let mut ops = s.ops.clone();
    ops.sort_by_key(|o| std::cmp::Reverse(o.count));
    for o in ops.iter().take(6) {
        println!(
            "op {:<8} {:>9} served, p50 {} us, p99 {} us, max {} us",
            o.op, o.count, o.p50_us, o.p99_us, o.max_us
        );
    }
}

pub fn status(a: StatusArgs) -> Result<()> {
    let mp = fsmount::canonical_mountpoint(&a.mountpoint).map_err(anyhow::Error::from)?;
    let s = connect_status(&mp)?;
    if a.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        print_status(&s);
    }
    Ok(())
}

fn request_drain(mp: &Path, timeout: Option<Duration>) -> Result<()> {
    request_drain_with(mp, false, timeout)
}

/// The drain request, its answer awaited 30 s or `timeout` if shorter.
fn request_drain_with(mp: &Path, retry: bool, timeout: Option<Duration>) -> Result<()> {
    let within = timeout.map_or(Duration::from_secs(30), |t| t.min(Duration::from_secs(30)));
    fsmount::request_drain_within(mp, retry, within)
        .map_err(|e| no_answer(mp, "the drain request", &e))
}

/// Waits until nothing is left to drain (`tierstack_fs::mount::wait_drained`), with a
/// progress bar (a line every 30 s where stderr is no terminal). Stops with an error when only records the backing refused again are left,
/// or `timeout` passed.
fn wait_drained(mp: &Path, timeout: Option<Duration>) -> Result<()> {
    let bar = ProgressBar::new(0);
    bar.set_style(crate::bar_style(
        "draining [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
        crate::BAR_CHARS,
    ));
    let mut most = 0u64;
    // Where stderr is no terminal (a job script's log, systemd's journal) the bar shows
    // nothing: a plain line every `TIERSTACK_PROGRESS_EVERY` seconds (30) says the wait is
    // moving, and what is left.
    let lines = !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let every = Duration::from_secs_f64(
        std::env::var("TIERSTACK_PROGRESS_EVERY")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| *v > 0.0 && v.is_finite())
            .unwrap_or(30.0),
    );
    let t0 = Instant::now();
    let mut last_line = t0;
    let r = fsmount::wait_drained(mp, timeout, &mut |s| {
        most = most.max(s.drain.dirty_bytes);
        bar.set_length(most);
        bar.set_position(most - s.drain.dirty_bytes);
        let mut msg = format!(
            "{} files, {} ops waiting",
            s.drain.dirty_files, s.drain.pending_ops
        );
        if let Some(e) = &s.last_error {
            if s.drain_retries > 0 {
                msg.push_str(&format!("; retrying: {e}"));
            }
        }
        if lines && !s.idle && last_line.elapsed() >= every {
            last_line = Instant::now();
            eprintln!(
                "tierstack: draining {} ({:.0} s): {} left, {}",
                mp.display(),
                t0.elapsed().as_secs_f64(),
                fmt_size(s.drain.dirty_bytes),
                msg
            );
        }
        bar.set_message(msg);
    });
    match r {
        Ok(()) => {
            bar.set_length(most);
            bar.set_position(most);
            bar.finish_with_message("done");
            Ok(())
        }
        Err(fsmount::DrainWait::Stuck(s)) => {
            bar.abandon_with_message("stuck");
            bail!("{}", stuck_message(mp, &s));
        }
        Err(fsmount::DrainWait::TimedOut(t, s)) => {
            bar.abandon_with_message("timed out");
            bail!(
                "timed out after {:.0} s with {} in {} files and {} journal ops still to drain{}; the mount stays and nothing is lost: wait longer (`tierstack drain {} --wait`) or `tierstack umount {} --force` to keep the rest in the fast tier for the next mount",
                t.as_secs_f64(),
                fmt_size(s.drain.dirty_bytes),
                s.drain.dirty_files,
                s.drain.pending_ops,
                s.last_error
                    .as_ref()
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default(),
                mp.display(),
                mp.display()
            );
        }
        Err(fsmount::DrainWait::Gone(_)) => {
            bar.abandon();
            Err(not_mounted(mp))
        }
    }
}

pub fn drain(a: DrainArgs) -> Result<()> {
    let mp = fsmount::canonical_mountpoint(&a.mountpoint).map_err(anyhow::Error::from)?;
    let timeout = a
        .timeout
        .as_deref()
        .map(|t| parse_duration("timeout", t))
        .transpose()?;
    request_drain_with(&mp, a.retry, timeout)?;
    if a.wait {
        wait_drained(&mp, timeout)?;
    }
    Ok(())
}

/// The status of the mount at `mp` for `umount`: a daemon that listens but is too busy to
/// answer is waited for (a line every 10 s, bounded by `timeout`, default an hour); a dead
/// one has its mount detached; no mount is "not mounted". Three different answers.
fn status_for_umount(mp: &Path, timeout: Option<Duration>) -> Result<MountStatus> {
    let t0 = Instant::now();
    let limit = timeout.unwrap_or(Duration::from_secs(3600));
    let mut said = Instant::now();
    loop {
        match fsmount::status(mp) {
            Ok(s) => return Ok(s),
            Err(tierstack_fs::FsError::Control { msg, .. }) if msg.contains("ermission denied") => {
                return connect_status(mp);
            }
            Err(e) if fsmount::daemon_listens(mp) => {
                if t0.elapsed() > limit {
                    bail!(
                        "the daemon of {} is alive but has not answered for {:.0} s ({e}); nothing is lost: try `tierstack umount` again later, or see its log",
                        mp.display(),
                        t0.elapsed().as_secs_f64()
                    );
                }
                if said.elapsed() > Duration::from_secs(10) {
                    eprintln!(
                        "tierstack: the daemon of {} is busy; waiting for it ({:.0} s)",
                        mp.display(),
                        t0.elapsed().as_secs_f64()
                    );
                    said = Instant::now();
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(_) => {
                if fsmount::clear_stale(mp).unwrap_or(false) {
                    bail!(
                        "the daemon of {} was gone; detached its stale mount: mount it again with the same --dir/--array to finish the drain",
                        mp.display()
                    );
                }
                return Err(not_mounted(mp));
            }
        }
    }
}

/// The shutdown request, its answer awaited up to `limit` with a line every 10 s (the daemon
/// answers once the kernel let the mount go). Ctrl-C leaves; the daemon goes on.
fn shutdown_request(
    mp: &Path,
    force: bool,
    keep: bool,
    limit: Duration,
) -> tierstack_fs::Result<serde_json::Value> {
    let (tx, rx) = std::sync::mpsc::channel();
    let m = mp.to_path_buf();
    std::thread::spawn(move || {
        let req = serde_json::json!({"cmd": "shutdown", "force": force, "keep": keep});
        let _ = tx.send(fsmount::request(&m, &req, limit));
    });
    let t0 = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(r) => return r,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => eprintln!(
                "tierstack: the daemon of {} is unmounting (writing back the kernel's cache); waiting ({:.0} s)",
                mp.display(),
                t0.elapsed().as_secs_f64()
            ),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(tierstack_fs::FsError::Control {
                    path: mp.to_path_buf(),
                    msg: "the request's thread ended without an answer".into(),
                })
            }
        }
    }
}

pub fn umount(a: UmountArgs) -> Result<()> {
    let mp = fsmount::canonical_mountpoint(&a.mountpoint).map_err(anyhow::Error::from)?;
    let timeout = a
        .timeout
        .as_deref()
        .map(|t| parse_duration("timeout", t))
        .transpose()?;
    let st = status_for_umount(&mp, timeout)?;
    request_drain(&mp, timeout)?;
    if !a.force {
        wait_drained(&mp, timeout)?;
    }
    // The daemon answers once the kernel let the mount go, which first writes back what the
    // kernel's cache holds through that same daemon: as long as --timeout allows (a daemon
    // starved of CPU took over a minute in the long churn). If the answer is lost but the
    // mount is gone and the daemon lives, the request was carried out: wait for its exit.
    let limit = timeout.unwrap_or(Duration::from_secs(3600));
    let ans = match shutdown_request(&mp, a.force, a.keep, limit) {
        Ok(ans) => ans,
        Err(_)
            if tierstack_common::process::alive(st.pid)
                && !tierstack_common::mounts::mounted_type(&mp)
                    .is_some_and(|t| t.starts_with("fuse")) =>
        {
            serde_json::json!({"ok": true})
        }
        Err(e) => return Err(no_answer(&mp, "the unmount request", &e)),
    };
    if ans.get("ok").and_then(|v| v.as_bool()) != Some(true) {
        let e = ans
            .get("error")
            .and_then(|v| v.as_str())
            .unwrap_or("unknown error");
        bail!(
            "{e} (is a process still using it? see `fuser -m {}`)",
            mp.display()
        );
    }
    // The daemon drains what came in last, makes the fast tier durable and exits.
    // Bounded by --timeout (default an hour), with a line every 10 s while it takes long.
    let t0 = Instant::now();
    let mut said = Instant::now();
    while tierstack_common::process::alive(st.pid) {
        if t0.elapsed() > limit {
            bail!(
                "unmounted {}, but the mount daemon (pid {}) did not finish its last drain within {:.0} s; nothing is lost: its journal in the fast tier resumes at the next mount (stop it with `kill {}` if needed)",
                mp.display(),
                st.pid,
                limit.as_secs_f64(),
                st.pid
            );
        }
        if said.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "tierstack: unmounted; the daemon (pid {}) is finishing its drain ({:.0} s)",
                st.pid,
                t0.elapsed().as_secs_f64()
            );
            said = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if a.force {
        println!(
            "unmounted {} (--force: what was not drained stays in the fast tier; mount {} again with the same --dir/--array to drain it)",
            mp.display(),
            st.backing.display()
        );
    } else {
        println!(
            "unmounted {} (everything drained to {})",
            mp.display(),
            st.backing.display()
        );
    }
    Ok(())
}

/// Internal: the mount daemon (spawned by `tierstack mount`); takes its spec as JSON.
pub fn daemon(spec: &str, metrics: Option<&str>) -> Result<()> {
    let spec: MountSpec = serde_json::from_str(spec).context("bad mount-daemon spec")?;
    // Handles, held base files and client connections each take a descriptor.
    tierstack_common::process::raise_nofile();
    if let Some(m) = metrics {
        tierstack_node::metrics::serve_mount(m, &spec.mountpoint).map_err(crate::node_err)?;
    }
    fsmount::run(spec, |s| {
        tracing::info!(
            "mounted {} at {}",
            s.backing.display(),
            s.mountpoint.display()
        )
    })
    .map_err(anyhow::Error::from)
}
