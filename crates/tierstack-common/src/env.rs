//! The environment contract between `tierstack run` and the preload shim in the program it
//! starts: every variable either side reads or writes, named once. They are private to the
//! two, so they carry a prefix of their own, `_TIERSTACK_SHIM_`, apart from the `TIERSTACK_*`
//! names users and sites set (`TIERSTACK_DIR`, the SLURM buffer of a job, passes through
//! `run` untouched). The shim reads them with `getenv` before its allocator is safe to use,
//! so each name is also a NUL-terminated C string.

use std::ffi::CStr;

/// One variable of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var(&'static CStr);

impl Var {
    /// The name as a NUL-terminated C string (for `getenv`).
    pub const fn c(self) -> &'static CStr {
        self.0
    }

    /// The name.
    pub fn name(self) -> &'static str {
        self.0.to_str().unwrap_or_default()
    }
}

/// The prefix of every variable of the contract.
pub const PREFIX: &str = "_TIERSTACK_SHIM_";

/// Bytes of DRAM the program's paged memory may take (`--dram`).
pub const DRAM: Var = Var(c"_TIERSTACK_SHIM_DRAM");
/// The unit of faulting and eviction in bytes (`--page`).
pub const PAGE: Var = Var(c"_TIERSTACK_SHIM_PAGE");
/// Allocations of at least this many bytes are paged (`--threshold`).
pub const THRESHOLD: Var = Var(c"_TIERSTACK_SHIM_THRESHOLD");
/// The run folder the per-process file drives are made in (`--dir`).
pub const DIR: Var = Var(c"_TIERSTACK_SHIM_DIR");
/// Bytes of each process's store array (`--store`).
pub const STORE: Var = Var(c"_TIERSTACK_SHIM_STORE");
/// The descriptor of an array made with `array create` (`--array`).
pub const ARRAY: Var = Var(c"_TIERSTACK_SHIM_ARRAY");
/// The optional tiers (`--vram`, `--gpu`, `--no-compress`), as `tierstack_store::Tiers`
/// writes them: one variable, so that a new tier changes neither this contract nor the shim.
pub const TIERS: Var = Var(c"_TIERSTACK_SHIM_TIERS");
/// Where each process writes its pager's counters (live, and at exit).
pub const STATS_DIR: Var = Var(c"_TIERSTACK_SHIM_STATS_DIR");

/// What `run` sets, or clears when its option is not given, for its program: nothing the
/// caller's environment held passes through unchosen.
pub const RUN_SETTINGS: [Var; 8] = [DRAM, PAGE, THRESHOLD, DIR, STORE, ARRAY, TIERS, STATS_DIR];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_prefixed() {
        let mut names: Vec<&str> = RUN_SETTINGS.iter().map(|v| v.name()).collect();
        assert!(names.iter().all(|n| n.starts_with(PREFIX)));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), RUN_SETTINGS.len());
        assert_eq!(DRAM.c().to_bytes_with_nul(), b"_TIERSTACK_SHIM_DRAM\0");
    }
}
