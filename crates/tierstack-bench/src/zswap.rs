//! Equal memory for kernel swap with zswap under a cgroup v1 limit.
//!
//! zswap's pool (the compressed copies of swapped pages) is not charged to a cgroup v1 memory
//! limit: given the same limit, kernel swap with zswap holds the limit in resident pages plus
//! the whole pool on top, up to a fifth of the host's memory (`max_pool_percent`). So that
//! both sides of a comparison hold the same memory, [`PoolCharge`] lowers the group's limit by
//! the pool's size as it grows (sampled every few tens of milliseconds): resident pages plus
//! pool stay within the memory asked for, as they would under cgroup v2, which charges the
//! pool (`memory.zswap.current`). The pool is host-wide (`Zswap:` in `/proc/meminfo`); the
//! benchmark's group is the only one swapping while it runs.

use std::path::{Path, PathBuf};

/// The limit kernel swap with zswap is given when its pool holds `pool` bytes: the memory
/// asked for less the pool, never under a quarter of it (a group whose limit falls under its
/// working set of page tables and code would thrash rather than swap; the pool is reported
/// either way).
pub fn limit_with_pool(memory: u64, pool: u64) -> u64 {
    memory.saturating_sub(pool).max(memory / 4)
}

/// A `Name:   N kB` field of `/proc/PID/status` or `/proc/meminfo`, in KiB.
pub fn field_kb(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Whether the host's zswap is on now.
pub fn enabled() -> bool {
    std::fs::read_to_string("/sys/module/zswap/parameters/enabled")
        .is_ok_and(|s| matches!(s.trim(), "Y" | "1"))
}

/// Keeps a v1 group's limit at the memory asked for less zswap's pool (see the module).
#[derive(Debug)]
pub struct PoolCharge {
    limit_file: PathBuf,
    memory: u64,
    set: u64,
    peak_pool: u64,
}

impl PoolCharge {
    /// For the group at `cgroup` given `memory` bytes: Some only under cgroup v1 (v2 charges
    /// the pool itself) and while zswap is on.
    pub fn new(cgroup: &Path, memory: u64) -> Option<PoolCharge> {
        let limit_file = cgroup.join("memory.limit_in_bytes");
        (limit_file.exists() && enabled()).then_some(PoolCharge {
            limit_file,
            memory,
            set: memory,
            peak_pool: 0,
        })
    }

    /// Reads the pool's size and sets the limit to match (only when it moved by 1 MiB or
    /// more: each write makes the kernel reclaim down to it). A write the kernel refuses
    /// (EBUSY: it could not reclaim that far yet) is tried again at the next tick.
    pub fn tick(&mut self) {
        let Some(pool) = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| field_kb(&s, "Zswap:"))
        else {
            return;
        };
        let pool = pool * 1024;
        self.peak_pool = self.peak_pool.max(pool);
        let want = limit_with_pool(self.memory, pool);
        if want.abs_diff(self.set) >= 1 << 20
            && std::fs::write(&self.limit_file, want.to_string()).is_ok()
        {
            self.set = want;
        }
    }

    /// The largest pool seen.
    pub fn peak_pool(&self) -> u64 {
        self.peak_pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_gives_up_what_the_pool_holds() {
        assert_eq!(limit_with_pool(512 << 20, 0), 512 << 20);
        assert_eq!(limit_with_pool(512 << 20, 100 << 20), 412 << 20);
        assert_eq!(limit_with_pool(512 << 20, 500 << 20), 128 << 20);
    }

    #[test]
    fn reads_meminfo_fields() {
        let t = "MemTotal:       24000000 kB\nZswap:             17000 kB\nZswapped:          40000 kB\n";
        assert_eq!(field_kb(t, "Zswap:"), Some(17000));
        assert_eq!(field_kb(t, "Zswapped:"), Some(40000));
        assert_eq!(field_kb(t, "Swap:"), None);
    }
}
