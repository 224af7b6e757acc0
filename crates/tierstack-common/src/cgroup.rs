//! Where the cgroup controllers are: the v1 hierarchies under `/sys/fs/cgroup/<controller>`
//! and the unified (v2) hierarchy at `/sys/fs/cgroup`.

use std::path::{Path, PathBuf};

/// Root of the cgroup file systems (the unified hierarchy itself under cgroup v2).
pub const ROOT: &str = "/sys/fs/cgroup";

/// The folder of the v1 hierarchy of `controller` (e.g. `memory`, `blkio`); whether it is
/// there is for the caller to check (by a file of that controller).
pub fn v1_dir(controller: &str) -> PathBuf {
    Path::new(ROOT).join(controller)
}

/// The controllers the unified (v2) hierarchy offers, as `cgroup.controllers` lists them
/// (trimmed); None when there is no unified hierarchy (or it cannot be read).
pub fn v2_controllers() -> Option<String> {
    std::fs::read_to_string(Path::new(ROOT).join("cgroup.controllers"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Whether the unified (v2) hierarchy offers `controller` (e.g. `io`, `memory`).
pub fn v2_has(controller: &str) -> bool {
    v2_controllers().is_some_and(|c| c.split_whitespace().any(|x| x == controller))
}
