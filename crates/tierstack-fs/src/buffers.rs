//! The buffers a node holds: embedded fast tiers (`--dir` folders with a journal) under the
//! default fast-tier folders or folders given, what each still holds for its BACKING, and
//! whether a live daemon serves it. `tierstack buffers` lists them, recovers the undrained
//! ones after a node restart and removes the drained ones.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::db::{Db, Pending};
use crate::error::{io_err, Result};
use crate::mount;

/// One fast tier found on this node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Buffer {
    /// Its folder (`--dir`).
    pub dir: PathBuf,
    /// The BACKING it belongs to (None: a journal that never got that far).
    pub backing: Option<PathBuf>,
    /// Where a live daemon serves it, if one does.
    pub mounted_at: Option<PathBuf>,
    /// Its last daemon stopped cleanly (a crash or `kill -9` did not).
    pub clean_stop: bool,
    /// Journal rows not applied to BACKING yet.
    pub pending_ops: u64,
    /// Rows BACKING refused (quarantined).
    pub stuck: u64,
    /// Files whose contents differ from BACKING, and their sizes in all.
    pub dirty_files: u64,
    /// Bytes of those files.
    pub dirty_bytes: u64,
    /// Bytes its files take on disk.
    pub disk_bytes: u64,
    /// The folder's owner (a recovery drains as this user).
    pub owner: u32,
    /// The folder's group.
    pub group: u32,
}

impl Buffer {
    /// Everything is in BACKING: nothing to recover, safe to remove (when not mounted).
    pub fn drained(&self) -> bool {
        Pending {
            backing: None,
            clean_stop: self.clean_stop,
            ops: self.pending_ops,
            stuck: self.stuck,
            dirty_files: self.dirty_files,
            dirty_bytes: self.dirty_bytes,
        }
        .drained()
    }
}

/// The folders embedded fast tiers are made in by default: root's `/var/tmp/tierstack` and,
/// for root, every user's `/var/tmp/tierstack-UID` (for another user only their own).
pub fn default_roots() -> Vec<PathBuf> {
    let own = mount::default_dir(Path::new("/"));
    let mut out: Vec<PathBuf> = own.parent().map(Path::to_path_buf).into_iter().collect();
    if rustix::process::geteuid().is_root() {
        for e in std::fs::read_dir("/var/tmp")
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("tierstack-") && e.path().is_dir() {
                out.push(e.path());
            }
        }
    }
    out
}

/// The buffers in `roots`: a root that is a fast tier itself, and the fast tiers under each
/// root down to [`FIND_DEPTH`] levels (the SLURM hooks keep theirs at
/// `FAST/jobs/JOBID/tier` and `FAST/node/jobs/JOBID/tier`). The walk does not enter a fast
/// tier, a symbolic link, another file system (a job's mount point) or a folder it cannot
/// read. Live mounts are asked for their fast tier's folder.
pub fn find(roots: &[PathBuf]) -> Result<Vec<Buffer>> {
    let live = live_mounts();
    let mut out = Vec::new();
    for root in roots {
        let mut dirs = Vec::new();
        let dev = std::fs::symlink_metadata(root).map(|m| m.dev()).ok();
        tiers_under(root, dev, FIND_DEPTH, &mut dirs);
        dirs.sort();
        for d in dirs {
            out.push(inspect(&d, &live)?);
        }
    }
    Ok(out)
}

/// How deep under a root [`find`] looks for fast tiers.
pub const FIND_DEPTH: usize = 4;

/// The fast tiers at or under `d` (at most `depth` levels down) on device `dev`.
fn tiers_under(d: &Path, dev: Option<u64>, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(m) = std::fs::symlink_metadata(d) else {
        return;
    };
    if !m.is_dir() || Some(m.dev()) != dev {
        return;
    }
    if is_fast_tier(d) {
        out.push(d.to_path_buf());
        return;
    }
    if depth == 0 {
        return;
    }
    let Ok(rd) = std::fs::read_dir(d) else {
        return;
    };
    for e in rd.flatten() {
        tiers_under(&e.path(), dev, depth - 1, out);
    }
}

fn is_fast_tier(d: &Path) -> bool {
    d.join("journal.db").is_file()
}

fn inspect(dir: &Path, live: &HashMap<PathBuf, PathBuf>) -> Result<Buffer> {
    let p = Db::pending(&dir.join("journal.db"))?;
    let md = std::fs::metadata(dir).map_err(io_err(dir))?;
    let disk_bytes = std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.blocks() * 512)
        .sum();
    let canon = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    Ok(Buffer {
        dir: dir.to_path_buf(),
        backing: p.backing.clone(),
        mounted_at: live.get(&canon).cloned(),
        clean_stop: p.clean_stop,
        pending_ops: p.ops,
        stuck: p.stuck,
        dirty_files: p.dirty_files,
        dirty_bytes: p.dirty_bytes,
        disk_bytes,
        owner: md.uid(),
        group: md.gid(),
    })
}

/// The control sockets in this user's and the system's runtime folders.
fn sockets() -> Vec<PathBuf> {
    let mut dirs = vec![mount::run_dir()];
    let system = PathBuf::from(mount::SYSTEM_RUN_DIR);
    if !dirs.contains(&system) {
        dirs.push(system);
    }
    dirs.iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .collect()
}

/// Removes the control sockets nobody listens on any more (a daemon killed with `kill -9`
/// leaves its socket behind); the number removed.
pub fn remove_stale_sockets() -> usize {
    sockets()
        .into_iter()
        .filter(|p| {
            matches!(std::os::unix::net::UnixStream::connect(p),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
        })
        .filter(|p| std::fs::remove_file(p).is_ok())
        .count()
}

/// Fast-tier folder → mount point, for every daemon that answers on a socket in this
/// user's or the system's runtime folder.
fn live_mounts() -> HashMap<PathBuf, PathBuf> {
    let mut out = HashMap::new();
    for p in sockets() {
        let Some(st) = mount::status_at(&p, std::time::Duration::from_secs(5)) else {
            continue;
        };
        if let Some(fd) = st.fast_dir {
            let canon = std::fs::canonicalize(&fd).unwrap_or(fd);
            out.insert(canon, st.mountpoint);
        }
    }
    out
}

/// tierstack mounts whose daemon is gone (a node that crashed leaves none after a reboot,
/// a killed daemon leaves one): their mount points, to be detached before a recovery.
pub fn dead_mounts() -> Vec<PathBuf> {
    tierstack_common::mounts::mounts()
        .into_iter()
        // "fuse" (mounted by root) or "fuse.tierstack" (through fusermount3), with the
        // source "tierstack:BACKING".
        .filter(|m| m.fstype.starts_with("fuse") && m.source.starts_with("tierstack:"))
        .map(|m| m.point)
        .filter(|mp| !mount::daemon_listens(mp))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_tiers_are_found_where_mount_and_the_slurm_hooks_keep_them() {
        let t = tempfile::tempdir().expect("tmp");
        let r = t.path();
        let tier = |p: &str| {
            std::fs::create_dir_all(r.join(p)).expect("mkdir");
            std::fs::write(r.join(p).join("journal.db"), b"").expect("write");
        };
        tier("0123abcd");
        tier("jobs/7/tier");
        tier("node/jobs/8/tier");
        tier("jobs/7/tier/inner");
        tier("too/deep/for/the/walk");
        std::fs::create_dir_all(r.join("jobs/7/mnt")).expect("mkdir");
        std::os::unix::fs::symlink(r.join("0123abcd"), r.join("link")).expect("symlink");
        let dev = std::fs::metadata(r).map(|m| m.dev()).ok();
        let mut found = Vec::new();
        tiers_under(r, dev, FIND_DEPTH, &mut found);
        found.sort();
        let want: Vec<PathBuf> = ["0123abcd", "jobs/7/tier", "node/jobs/8/tier"]
            .iter()
            .map(|p| r.join(p))
            .collect();
        assert_eq!(found, want);
        // A root that is a fast tier itself.
        let mut one = Vec::new();
        tiers_under(&r.join("jobs/7/tier"), dev, FIND_DEPTH, &mut one);
        assert_eq!(one, [r.join("jobs/7/tier")]);
        // Another file system is not entered.
        let mut none = Vec::new();
        tiers_under(r, dev.map(|d| d + 1), FIND_DEPTH, &mut none);
        assert!(none.is_empty());
    }
}
