//! What /proc and /sys say about a process or a block device: the figures that tierstack's
//! processes do not report themselves (I/O, resident memory, the drives' devices).

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

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

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The counters of /proc/PID/io (bytes that reached the block layer, and all bytes).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcIo {
    /// Bytes read by read-like calls (including the page cache).
    pub rchar: u64,
    /// Bytes written by write-like calls (including the page cache).
    pub wchar: u64,
    /// Bytes read from storage (block layer).
    pub read_bytes: u64,
    /// Bytes written to storage (block layer).
    pub write_bytes: u64,
}

/// `/proc/PID/io` of `pid` (None when it is gone or not readable).
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
    /// Reads completed.
    pub reads: u64,
    /// Bytes read from storage (block layer).
    pub read_bytes: u64,
    /// Writes completed.
    pub writes: u64,
    /// Bytes written to storage (block layer).
    pub write_bytes: u64,
}

/// The kernel's name of block device `majmin` (e.g. `vda`), or `majmin` itself.
pub fn dev_name(majmin: &str) -> String {
    std::fs::read_to_string(format!("/sys/dev/block/{majmin}/uevent"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("DEVNAME=").map(|s| s.to_string()))
        })
        .unwrap_or_else(|| majmin.to_string())
}

/// The counters of block device `majmin` (`/sys/dev/block/MAJ:MIN/stat`).
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
