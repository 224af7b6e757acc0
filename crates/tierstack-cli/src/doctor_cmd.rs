//! `tierstack doctor`: checks the host for what tierstack needs and what seed 002's tuning
//! guide recommends (§4.3: rcu_nocbs, transparent hugepages, watermark_scale_factor, NUMA
//! locality, equal swap priorities), each with a status (ok, warn, fail), the value found,
//! why it matters and the command that fixes it. Exit status 0 unless a check fails.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;
use tierstack_bench::fmt_size;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// A folder tierstack will use for its fast tier (`--dir` of mount or run); checked for
    /// O_DIRECT and free space. Repeatable. Default: /var/tmp/tierstack and the temporary
    /// folder.
    #[arg(long)]
    pub dir: Vec<PathBuf>,
    /// Also measure each --dir: sequential write and read (O_DIRECT, 1 MiB) and 4K random
    /// reads, about 3 s per folder.
    #[arg(long)]
    pub probe: bool,
    /// Print `{"checks": [{"name", "status", "value", "advice"}]}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    /// What was found.
    pub value: String,
    /// Why it matters and the exact command to fix it (empty advice never: an ok check says
    /// why it is fine).
    pub advice: String,
}

fn check(name: &str, status: Status, value: impl Into<String>, advice: impl Into<String>) -> Check {
    Check {
        name: name.to_string(),
        status,
        value: value.into(),
        advice: advice.into(),
    }
}

fn read_trim(p: &str) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(name))
        .find(|c| c.is_file())
}

fn kernel() -> Check {
    let rel = read_trim("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = rel
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|x| x.parse::<u32>().ok());
    let (maj, min) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    if (maj, min) >= (5, 7) {
        check("kernel", Status::Ok, rel, "5.7 or newer: userfaultfd write-protect (clean pages dropped without a write) and the swap improvements of 4.14 that seed 002 relies on are there")
    } else {
        check("kernel", Status::Warn, rel, "older than 5.7: no userfaultfd write-protect, so every evicted page is written back; upgrade the kernel (seed 002 §4.1 lists the distribution releases with the swap fixes)")
    }
}

fn userfaultfd() -> Check {
    let sysctl = read_trim("/proc/sys/vm/unprivileged_userfaultfd");
    let dev = Path::new("/dev/userfaultfd").exists();
    let value = format!(
        "vm.unprivileged_userfaultfd={}, /dev/userfaultfd {}",
        sysctl.as_deref().unwrap_or("absent"),
        if dev { "present" } else { "absent" }
    );
    match tierstack_mem::uffd::available() {
        Ok(_) => check("userfaultfd", Status::Ok, value, "usable by this user: `tierstack run` can page programs' memory; for other users allow it with `sysctl -w vm.unprivileged_userfaultfd=1` or give them access to /dev/userfaultfd (`chmod 0666 /dev/userfaultfd` or a group)"),
        Err(e) => check("userfaultfd", Status::Fail, format!("{value}; userfaultfd(2) fails: {e}"), "`tierstack run` cannot page memory without it: `sysctl -w vm.unprivileged_userfaultfd=1` (persist in /etc/sysctl.d/99-tierstack.conf), or run as root / with CAP_SYS_PTRACE, or grant access to /dev/userfaultfd"),
    }
}

/// Which dirty tracking `tierstack run`'s pager uses here (the probe and the choice the
/// pager itself makes, `TIERSTACK_MEM_WP` included), and whether it moves pages with
/// `UFFDIO_MOVE`.
fn dirty_tracking() -> Check {
    use tierstack_mem::DirtyTracking;
    let name = "dirty_tracking";
    let caps = match tierstack_mem::uffd::available() {
        Ok(c) => c,
        Err(e) => {
            return check(
                name,
                Status::Warn,
                format!("no userfaultfd: {e}"),
                "see the userfaultfd check",
            )
        }
    };
    let offered = format!(
        "kernel: async write-protect {}, PAGEMAP_SCAN {}, UFFDIO_MOVE {}",
        yes(caps.wp_async),
        yes(caps.pagemap_scan),
        yes(caps.moves)
    );
    match DirtyTracking::chosen(&caps) {
        Ok(DirtyTracking::Async) => check(name, Status::Ok, format!("run uses async write-protect + PAGEMAP_SCAN, UFFDIO_MOVE at eviction ({offered})"), format!("writes to pages read back take no fault to the pager; `{}=fault` forces the write-protect-fault path (for A/B measurements)", tierstack_mem::WP_ENV)),
        Ok(DirtyTracking::Fault) if caps.async_dirty_tracking() => check(name, Status::Ok, format!("run uses write-protect faults, UFFDIO_MOVE not used: {}=fault ({offered})", tierstack_mem::WP_ENV), format!("unset {} for async write-protect + PAGEMAP_SCAN (no fault per first write)", tierstack_mem::WP_ENV)),
        Ok(DirtyTracking::Fault) => check(name, Status::Ok, format!("run uses write-protect faults, UFFDIO_MOVE not used ({offered})"), "Linux 6.8 or newer tracks written pages without a fault per page (async write-protect, PAGEMAP_SCAN, UFFDIO_MOVE)"),
        Err(e) => check(name, Status::Fail, format!("{e} ({offered})"), format!("unset {} or set it to fault", tierstack_mem::WP_ENV)),
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn fuse_device() -> Check {
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => check("fuse_device", Status::Ok, "/dev/fuse opens read-write", "`tierstack mount` can serve its FUSE file system"),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata("/dev/fuse").map_or(0, |m| m.permissions().mode() & 0o777);
            check("fuse_device", Status::Fail, format!("/dev/fuse is there, mode {mode:o}, and this user may not open it"), "FUSE is loaded; its device must be open to users, as the fuse3 package's udev rule makes it (`KERNEL==\"fuse\", MODE=\"0666\"` in /lib/udev/rules.d; without udev: `chmod 0666 /dev/fuse` as root), and `fusermount3` must be installed (apt install fuse3)")
        }
        Err(e) => check("fuse_device", Status::Fail, format!("/dev/fuse: {e}"), "`tierstack mount` needs FUSE: `modprobe fuse` (and in a container, pass the device: `--device /dev/fuse --cap-add SYS_ADMIN`)"),
    }
}

/// FUSE over io_uring (`tierstack mount --transport auto` uses it where the kernel lets
/// FUSE servers do so).
fn fuse_uring() -> Check {
    let name = "fuse_io_uring";
    match tierstack_fs::uring::kernel_allows() {
        Some(true) => check(name, Status::Ok, "enable_uring=Y", "mounts serve small operations through per-CPU io_uring queues (measured here: 1.2-1.35x the creates, stats and unlinks of /dev/fuse)"),
        Some(false) => check(name, Status::Warn, "enable_uring=N", format!("mounts use /dev/fuse; FUSE over io_uring serves creates, stats and unlinks 1.2-1.35x faster here: `echo Y > {}` (as root; it lets FUSE servers opt in, nothing else changes)", tierstack_fs::uring::ENABLE_URING)),
        None => check(name, Status::Ok, "not in this kernel (before 6.14)", "mounts use /dev/fuse"),
    }
}

fn gpus() -> Check {
    match tierstack_store::Gpu::list() {
        Ok(l) if !l.is_empty() => {
            let shown: Vec<String> = l
                .iter()
                .map(|g| format!("GPU {}: {}, {} free of {}", g.ordinal, g.name, fmt_size(g.free_bytes), fmt_size(g.total_bytes)))
                .collect();
            check("gpu", Status::Ok, shown.join("; "), "a VRAM tier can sit between DRAM and the array: `tierstack mount --vram SIZE [--gpu N]`")
        }
        Ok(_) => check("gpu", Status::Ok, "the NVIDIA driver reports no device", "no VRAM tier here; nothing else needs a GPU"),
        Err(e) => check("gpu", Status::Ok, format!("none usable: {e}"), "no VRAM tier here (`mount --vram` needs an NVIDIA GPU and driver); nothing else needs one"),
    }
}

fn fusermount() -> Check {
    let root = rustix::process::geteuid().is_root();
    match on_path("fusermount3") {
        Some(p) => check("fusermount3", Status::Ok, p.display().to_string(), "present: users other than root can mount"),
        None if root => check("fusermount3", Status::Warn, "not on PATH (root mounts without it)", "users other than root need it to mount: `apt-get install fuse3` (or `dnf install fuse3`)"),
        None => check("fusermount3", Status::Fail, "not on PATH", "mounting as a user needs it: `apt-get install fuse3` (or `dnf install fuse3`)"),
    }
}

fn user_allow_other() -> Check {
    let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    let on = conf
        .lines()
        .map(|l| l.trim())
        .any(|l| l == "user_allow_other");
    if on {
        check("fuse_user_allow_other", Status::Ok, "user_allow_other set in /etc/fuse.conf", "users may mount with --allow-other, so a job's other processes (and the SLURM epilog) see the mount")
    } else {
        check("fuse_user_allow_other", Status::Warn, "not set in /etc/fuse.conf", "without it only root can use `tierstack mount --allow-other` (needed when another user, e.g. the SLURM epilog, reads the mount): `echo user_allow_other >> /etc/fuse.conf`")
    }
}

/// The bracketed choice of a sysfs selector such as `always [madvise] never`.
fn selected(s: &str) -> String {
    s.split_whitespace()
        .find(|w| w.starts_with('['))
        .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
        .unwrap_or_else(|| s.to_string())
}

fn thp() -> Check {
    let base = "/sys/kernel/mm/transparent_hugepage";
    let (Some(en), Some(df)) = (
        read_trim(&format!("{base}/enabled")),
        read_trim(&format!("{base}/defrag")),
    ) else {
        return check(
            "transparent_hugepage",
            Status::Ok,
            "not available in this kernel",
            "nothing to tune",
        );
    };
    let (en, df) = (selected(&en), selected(&df));
    let value = format!("enabled={en} defrag={df}");
    if en == "always" {
        check("transparent_hugepage", Status::Warn, value, "seed 002 §4.3.2: coalescing pages into huge pages and splitting them again on the way to swap costs latency: `echo never > /sys/kernel/mm/transparent_hugepage/enabled; echo never > /sys/kernel/mm/transparent_hugepage/defrag` (or madvise)")
    } else {
        check("transparent_hugepage", Status::Ok, value, "not always: paged memory is not coalesced into huge pages behind the program's back (seed 002 §4.3.2)")
    }
}

fn watermark() -> Check {
    match read_trim("/proc/sys/vm/watermark_scale_factor").and_then(|s| s.parse::<u64>().ok()) {
        Some(v) if v >= 400 => check("watermark_scale_factor", Status::Ok, v.to_string(), "kswapd starts reclaiming early (seed 002 §4.3.3 recommends 400, 4 % of memory)"),
        Some(v) => check("watermark_scale_factor", Status::Warn, v.to_string(), "seed 002 §4.3.3: with a low value kswapd wakes late and programs stall in direct reclaim (kernel-swap baselines, page cache of the drain): `sysctl -w vm.watermark_scale_factor=400`"),
        None => check("watermark_scale_factor", Status::Warn, "unreadable", "cannot read /proc/sys/vm/watermark_scale_factor: run doctor on the host, not in a restricted container"),
    }
}

/// On a virtual machine with the haltpoll cpuidle driver, an idle vCPU halts at once when
/// `guest_halt_poll_ns` is 0, and waking it again costs tens of microseconds. Every FUSE
/// request and every userfaultfd fault wakes a thread that often sleeps on another vCPU.
fn idle_polling() -> Check {
    let name = "vcpu_idle_polling";
    let driver = read_trim("/sys/devices/system/cpu/cpuidle/current_driver");
    if driver.as_deref() != Some("haltpoll") {
        return check(
            name,
            Status::Ok,
            driver.unwrap_or_else(|| "none".into()),
            "not a haltpoll guest: idle CPUs wake as the platform allows",
        );
    }
    match read_trim("/sys/module/haltpoll/parameters/guest_halt_poll_ns").and_then(|s| s.parse::<u64>().ok()) {
        Some(0) => check(name, Status::Warn, "haltpoll, guest_halt_poll_ns=0", "an idle vCPU halts at once, and each FUSE request or page fault that wakes a thread on it waits for the host (measured here with `tierstack bench meta --mount --client`: through the mount unlinks 1.4-1.5x and stats 1.2-1.3x slower, creates up to 1.9x; a futex round trip between two vCPUs 51 us against 7 us with polling): `echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns` now, or at every boot the commented line of tmpfiles.d/tierstack.conf (it costs idle CPU time on the host)"),
        Some(v) => check(name, Status::Ok, format!("haltpoll, guest_halt_poll_ns={v}"), "idle vCPUs poll before halting, so wake-ups for FUSE requests and faults are quick"),
        None => check(name, Status::Warn, "haltpoll, unreadable", "cannot read /sys/module/haltpoll/parameters/guest_halt_poll_ns"),
    }
}

fn swappiness() -> Check {
    match read_trim("/proc/sys/vm/swappiness").and_then(|s| s.parse::<u64>().ok()) {
        Some(v) if v <= 100 => check("swappiness", Status::Ok, v.to_string(), "within the usual range (seed 002 measured at the default 60); tierstack's own paging does not depend on it"),
        Some(v) => check("swappiness", Status::Warn, v.to_string(), "above 100 the kernel prefers swapping anonymous memory over dropping page cache, which competes with tierstack's DRAM budget: `sysctl -w vm.swappiness=60`"),
        None => check("swappiness", Status::Warn, "unreadable", "cannot read /proc/sys/vm/swappiness"),
    }
}

fn swap_devices() -> Check {
    let text = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    let devs: Vec<(String, i64)> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.to_string(), f.get(4)?.parse().ok()?))
        })
        .collect();
    if devs.is_empty() {
        return check("swap_devices", Status::Ok, "none active", "tierstack does not need kernel swap (the `bench mem --compare` baseline makes its own swap file)");
    }
    let value = devs
        .iter()
        .map(|(d, p)| format!("{d} (priority {p})"))
        .collect::<Vec<_>>()
        .join(", ");
    let equal = devs.iter().all(|(_, p)| *p == devs[0].1);
    if equal {
        check(
            "swap_devices",
            Status::Ok,
            value,
            "all at one priority, so the kernel stripes over them (seed 002 appendix A)",
        )
    } else {
        check("swap_devices", Status::Warn, value, "unequal priorities: the kernel fills the highest first instead of striping: give them one priority, e.g. `swapoff DEV && swapon -p 10 DEV` for each (seed 002 appendix A)")
    }
}

fn numa() -> Check {
    let nodes: Vec<String> = std::fs::read_dir("/sys/devices/system/node")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().to_string();
                    (n.starts_with("node") && n[4..].parse::<u32>().is_ok()).then_some(n)
                })
                .collect()
        })
        .unwrap_or_default();
    let mut drives: Vec<(String, i64)> = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/sys/class/nvme") {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            let node = read_trim(&format!("/sys/class/nvme/{n}/device/numa_node"))
                .and_then(|s| s.parse().ok())
                .unwrap_or(-1);
            drives.push((n, node));
        }
    }
    drives.sort();
    let value = format!(
        "{} node(s); NVMe: {}",
        nodes.len().max(1),
        if drives.is_empty() {
            "none".to_string()
        } else {
            drives
                .iter()
                .map(|(d, n)| format!("{d}@node{n}"))
                .collect::<Vec<_>>()
                .join(" ")
        }
    );
    if nodes.len() <= 1 {
        return check(
            "numa",
            Status::Ok,
            value,
            "one NUMA node: no cross-socket traffic to avoid",
        );
    }
    let used: std::collections::BTreeSet<i64> =
        drives.iter().map(|(_, n)| *n).filter(|n| *n >= 0).collect();
    if drives.len() >= 2 && used.len() < 2 {
        check("numa", Status::Warn, value, "every NVMe drive hangs off one socket: seed 002 §4.3.4 spreads drives evenly over the sockets to avoid UPI traffic; move drives, or pin jobs near them with `numactl --cpunodebind=N --membind=N tierstack run ...`")
    } else {
        check("numa", Status::Ok, value, "drives spread over the sockets (or too few to spread); pin a job near its drives with `numactl --cpunodebind=N`")
    }
}

fn rcu_nocbs() -> Check {
    let cmdline = read_trim("/proc/cmdline").unwrap_or_default();
    match cmdline.split_whitespace().find(|w| w.starts_with("rcu_nocbs")) {
        Some(w) => check("rcu_nocbs", Status::Ok, w.to_string(), "RCU callbacks run in their own kernel threads, not in softirq (seed 002 §4.3.1)"),
        None => check("rcu_nocbs", Status::Warn, "not on the kernel command line", "seed 002 §4.3.1: RCU callback processing in softirq adds long latencies under heavy paging: add `rcu_nocbs=0-N` (N = CPUs - 1) to GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, then `update-grub` and reboot"),
    }
}

fn memory_cgroup() -> Check {
    match tierstack_common::cgroup::v2_controllers() {
        Some(c) if c.split_whitespace().any(|x| x == "memory") => check("memory_cgroup_v2", Status::Ok, format!("cgroup v2, controllers: {c}"), "memory.max/memory.swap.max work: the kernel-swap baseline of `bench mem` and the fallback for static programs can cap memory"),
        Some(c) => check("memory_cgroup_v2", Status::Warn, format!("cgroup v2 without memory: {c}"), "enable the memory controller: `echo +memory > /sys/fs/cgroup/cgroup.subtree_control`"),
        None => check("memory_cgroup_v2", Status::Warn, "no unified cgroup v2 hierarchy", "the kernel-swap baseline of `bench mem` needs cgroup v2: boot with `systemd.unified_cgroup_hierarchy=1`"),
    }
}

fn open_files() -> Check {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let soft = lim.current.unwrap_or(u64::MAX);
    let hard = lim.maximum.unwrap_or(u64::MAX);
    let show = |v: u64| {
        if v == u64::MAX {
            "unlimited".to_string()
        } else {
            v.to_string()
        }
    };
    let value = format!("soft {} hard {}", show(soft), show(hard));
    if soft >= 65536 {
        check(
            "open_files",
            Status::Ok,
            value,
            "enough descriptors for the mount's open files, drives and drain jobs",
        )
    } else if soft >= 1024 {
        check("open_files", Status::Warn, value, "a mount holds a descriptor per open file plus drives and drain jobs; thousands of ranks writing file-per-process (seed 004) need more: `ulimit -n 65536` in the job, or `LimitNOFILE=65536` / nofile in /etc/security/limits.conf")
    } else {
        check(
            "open_files",
            Status::Fail,
            value,
            "too few descriptors for a mount: `ulimit -n 65536`",
        )
    }
}

fn io_uring() -> Check {
    let disabled = read_trim("/proc/sys/kernel/io_uring_disabled");
    // io_uring_params is 120 bytes; zero it and ask for a one-entry ring.
    let mut params = [0u32; 30];
    // SAFETY: io_uring_setup(2) with a valid pointer to a zeroed, large enough params struct;
    // it writes only into that struct.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    if fd >= 0 {
        // SAFETY: closing the descriptor io_uring_setup just returned to us.
        unsafe {
            libc::close(fd as libc::c_int);
        }
        check(
            "io_uring",
            Status::Ok,
            format!(
                "available (kernel.io_uring_disabled={})",
                disabled.as_deref().unwrap_or("absent")
            ),
            "the array submits drive I/O in batches through io_uring",
        )
    } else {
        check("io_uring", Status::Warn, format!("io_uring_setup fails: {err} (kernel.io_uring_disabled={})", disabled.as_deref().unwrap_or("absent")), "the array falls back to pread/pwrite (slower at high queue depth): `sysctl -w kernel.io_uring_disabled=0`, or allow io_uring_setup in the container's seccomp profile")
    }
}

fn runtime_dir() -> Check {
    let rd = tierstack_fs::mount::run_dir();
    let ok = tierstack_fs::mount::ensure_run_dir().is_ok() && tempfile::tempfile_in(&rd).is_ok();
    if ok {
        check("runtime_dir", Status::Ok, rd.display().to_string(), "mounts put their control sockets here and `run` registers its processes here; `tierstack top` finds them here")
    } else {
        check("runtime_dir", Status::Warn, format!("{} not writable", rd.display()), "mounts and `top` need a writable runtime folder: set TIERSTACK_RUN_DIR=$XDG_RUNTIME_DIR/tierstack, or `mkdir -p /run/tierstack && chmod 1777 /run/tierstack`")
    }
}

/// The nearest existing folder at or above `p`.
fn existing(p: &Path) -> Option<PathBuf> {
    let mut c = std::path::absolute(p).ok()?;
    loop {
        if c.is_dir() {
            return Some(c);
        }
        c = c.parent()?.to_path_buf();
    }
}

/// A buffer of `len` bytes aligned to 4096 inside `v`.
fn aligned(v: &mut Vec<u8>, len: usize) -> &mut [u8] {
    v.resize(len + 4096, 0);
    let off = v.as_ptr().align_offset(4096).min(4096);
    &mut v[off..off + len]
}

fn o_direct_file(dir: &Path) -> std::io::Result<(tempfile::TempPath, std::fs::File)> {
    let tp = tempfile::Builder::new()
        .prefix(".tierstack-doctor-")
        .tempfile_in(dir)?
        .into_temp_path();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&tp)?;
    Ok((tp, f))
}

fn o_direct(dir: &Path, shown: &str) -> Check {
    let name = format!("o_direct:{shown}");
    let res = (|| -> std::io::Result<()> {
        let (_tp, mut f) = o_direct_file(dir)?;
        let mut v = Vec::new();
        f.write_all(aligned(&mut v, 4096))?;
        Ok(())
    })();
    match res {
        Ok(()) => check(&name, Status::Ok, format!("{} takes O_DIRECT writes", dir.display()), "the array's drives there bypass the page cache (no double caching)"),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => check(&name, Status::Warn, format!("{} refuses O_DIRECT (tmpfs or similar)", dir.display()), "the array falls back to buffered I/O there, so its pages are cached twice and count against memory: put --dir on an ext4/xfs file system on NVMe"),
        Err(e) => check(&name, Status::Fail, format!("cannot write in {}: {e}", dir.display()), "give a --dir on a writable local file system (`mkdir -p DIR` and check its permissions)"),
    }
}

fn free_space(dir: &Path, shown: &str) -> Check {
    let name = format!("free_space:{shown}");
    match rustix::fs::statvfs(dir) {
        Ok(st) => {
            let free = st.f_bavail * st.f_frsize;
            let v = format!("{} free in {}", fmt_size(free), dir.display());
            if free >= 16 << 30 {
                check(
                    &name,
                    Status::Ok,
                    v,
                    "room for the default fast tier (4 x 2 GiB drives) and a run's paged memory",
                )
            } else if free >= 1 << 30 {
                check(&name, Status::Warn, v, "a mount's default fast tier takes 8 GiB (4 x --drive-size 2G) and `run` pages up to half the free space: free some space or give --drive-size/--store smaller")
            } else {
                check(
                    &name,
                    Status::Fail,
                    v,
                    "too little room for any fast tier: free space or pick another --dir",
                )
            }
        }
        Err(e) => check(
            &name,
            Status::Fail,
            format!("statvfs {}: {e}", dir.display()),
            "give an existing --dir",
        ),
    }
}

/// Sequential write and read with O_DIRECT (buffered if refused) and 4K random reads.
fn probe(dir: &Path, shown: &str) -> Check {
    let name = format!("probe:{shown}");
    let res = (|| -> std::io::Result<(f64, f64, f64)> {
        let (tp, mut f) = match o_direct_file(dir) {
            Ok(x) => x,
            Err(_) => {
                let tp = tempfile::Builder::new()
                    .prefix(".tierstack-doctor-")
                    .tempfile_in(dir)?
                    .into_temp_path();
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&tp)?;
                (tp, f)
            }
        };
        const BLOCK: usize = 1 << 20;
        let budget = Duration::from_secs(1);
        let mut v = Vec::new();
        let buf = aligned(&mut v, BLOCK);
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        // Write for about a second (at most 1 GiB).
        let t0 = Instant::now();
        let mut written = 0u64;
        while t0.elapsed() < budget && written < 1 << 30 {
            f.write_all(buf)?;
            written += BLOCK as u64;
        }
        f.sync_data()?;
        let w = written as f64 / t0.elapsed().as_secs_f64();
        f.seek(SeekFrom::Start(0))?;
        let t0 = Instant::now();
        let mut read = 0u64;
        while t0.elapsed() < budget && read < written {
            f.read_exact(buf)?;
            read += BLOCK as u64;
        }
        let r = read as f64 / t0.elapsed().as_secs_f64();
        let pages = (written / 4096).max(1);
        let small = &mut buf[..4096];
        let t0 = Instant::now();
        let mut n = 0u64;
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        while t0.elapsed() < budget {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f.seek(SeekFrom::Start((x % pages) * 4096))?;
            f.read_exact(small)?;
            n += 1;
        }
        let iops = n as f64 / t0.elapsed().as_secs_f64();
        drop(f);
        tp.close()?;
        Ok((w, r, iops))
    })();
    match res {
        Ok((w, r, iops)) => {
            let v = format!(
                "sequential write {:.0} MB/s, read {:.0} MB/s, 4K random read {:.0} IOPS (1 thread, QD1)",
                w / 1e6,
                r / 1e6,
                iops
            );
            if iops < 2000.0 {
                check(&name, Status::Warn, v, "few 4K reads per second at QD1: this looks like a disk or network file system, not NVMe; page faults will be slow: put --dir on a local NVMe drive")
            } else {
                check(&name, Status::Ok, v, "quick single-thread probe; `tierstack bench array` measures the array with its queue depth")
            }
        }
        Err(e) => check(
            &name,
            Status::Fail,
            format!("probe in {} failed: {e}", dir.display()),
            "give a --dir on a writable local file system with some free space",
        ),
    }
}

pub fn checks(a: &DoctorArgs) -> Vec<Check> {
    let mut out = vec![
        kernel(),
        userfaultfd(),
        dirty_tracking(),
        fuse_device(),
        fuse_uring(),
        fusermount(),
        user_allow_other(),
        thp(),
        watermark(),
        idle_polling(),
        swappiness(),
        swap_devices(),
        numa(),
        rcu_nocbs(),
        memory_cgroup(),
        open_files(),
        io_uring(),
        runtime_dir(),
        gpus(),
    ];
    let dirs = if a.dir.is_empty() {
        let fast = tierstack_fs::mount::default_dir(Path::new("/"));
        vec![
            fast.parent().map(Path::to_path_buf).unwrap_or(fast),
            std::env::temp_dir(),
        ]
    } else {
        a.dir.clone()
    };
    for d in dirs {
        let shown = d.display().to_string();
        let Some(real) = existing(&d) else {
            out.push(check(
                &format!("dir:{shown}"),
                Status::Fail,
                "no existing folder at or above it",
                "give an existing --dir",
            ));
            continue;
        };
        if let Some(t) =
            tierstack_common::mounts::fs_type_of(&real).filter(|t| t == "tmpfs" || t == "ramfs")
        {
            out.push(check(
                &format!("memory_fs:{shown}"),
                Status::Warn,
                format!("{shown} is on {t}"),
                "a fast tier or `run --dir` there keeps in RAM what tierstack moves out of DRAM (no memory is saved): point --dir (and TMPDIR for `run`) at a disk or NVMe file system",
            ));
        }
        out.push(o_direct(&real, &shown));
        out.push(free_space(&real, &shown));
        if a.probe {
            out.push(probe(&real, &shown));
        }
    }
    out
}

pub fn run(a: DoctorArgs) -> Result<()> {
    let cs = checks(&a);
    if a.json {
        println!("{}", serde_json::json!({ "checks": cs }));
    } else {
        for c in &cs {
            let tag = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            println!("{tag} {:<28} {}", c.name, c.value);
            if c.status != Status::Ok {
                println!("     {:<28} -> {}", "", c.advice);
            }
        }
        let w = cs.iter().filter(|c| c.status == Status::Warn).count();
        let f = cs.iter().filter(|c| c.status == Status::Fail).count();
        println!(
            "{} checks: {} ok, {w} warn, {f} fail (--json shows the advice for every check)",
            cs.len(),
            cs.len() - w - f
        );
    }
    let failed: Vec<&str> = cs
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| c.name.as_str())
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} check(s) failed ({}): apply the advice shown for each and run `tierstack doctor` again",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}
