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

/// The buffers in `roots`: a root that is a fast tier itself, and the fast tiers directly
/// under each root. Live mounts are asked for their fast tier's folder.
pub fn find(roots: &[PathBuf]) -> Result<Vec<Buffer>> {
    let live = live_mounts();
    let mut out = Vec::new();
    for root in roots {
        let mut dirs = Vec::new();
        if is_fast_tier(root) {
            dirs.push(root.clone());
        } else if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.flatten() {
                if is_fast_tier(&e.path()) {
                    dirs.push(e.path());
                }
            }
        }
        dirs.sort();
        for d in dirs {
            out.push(inspect(&d, &live)?);
        }
    }
    Ok(out)
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
