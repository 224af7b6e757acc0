//! The batched drain of many files: their syncs shared.
//!
//! A worker writes a file's contents into its staging file ([`Drainer::write_file`]) and,
//! instead of syncing it there, parks it here and takes its next row. The committer thread
//! (`drain-sync`) takes the parked files in batches (up to [`BATCH_FILES`], or what waited
//! [`BATCH_WAIT`], or at once when a row of the dispatcher waits for them) and commits each
//! batch in four steps, each for the whole batch before the next begins:
//!
//! 1. the staging files made durable: one `syncfs` of BACKING's file system where that
//!    makes everything on it durable ([`SyncWay::Fs`]), else an `fsync` of each file, all
//!    issued after every write of the batch ([`SyncWay::Files`], and for a file on another
//!    file system than BACKING's root: a mount inside BACKING);
//! 2. each closed file's staging file renamed into place (and its further hard links);
//! 3. the folders whose entries changed made durable: `syncfs` again, or an `fsync` of each
//!    such folder once per batch (those of files synced one by one);
//! 4. only then each file's pass finished ([`Drainer::finish_written`]: pages clean, the
//!    base recorded) and its journal row deleted.
//!
//! So a row is retired only once what it describes is durable in BACKING, as with one file
//! at a time; a crash at any point leaves each file in BACKING old or new and whole (a
//! rename is made only after its contents are durable) and its row in the journal until
//! step 4, to be redone. A file whose step fails is drained again alone, the unbatched way
//! ([`Drainer::drain_file`], with its retries and quarantine).
//!
//! The parked rows stay in flight (a barrier still waits for them, a later row of the same
//! file too) but do not hold a worker: the worker limit counts rows being written.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::db::JOp;

use super::data::{sync_written, Dirs, Written};
use super::Drainer;

/// Files committed together at most.
pub const BATCH_FILES: usize = 128;

/// How long a parked file waits for others before its batch is committed anyway.
pub const BATCH_WAIT: Duration = Duration::from_millis(20);

/// How the committer makes a batch durable in BACKING.
pub enum SyncWay {
    /// `syncfs` of BACKING's file system (a handle on its root): a local file system whose
    /// `syncfs` writes back every dirty page and commits its journal (ext4, XFS, btrfs,
    /// tmpfs: `fs_syncs_all`).
    Fs(OwnedFd),
    /// An `fsync` of each file and of each changed folder (any other file system: network
    /// and FUSE file systems make data durable on their servers at `fsync`, not at `syncfs`).
    Files,
}

impl SyncWay {
    /// The way for BACKING at `root`: `TIERSTACK_DRAIN_SYNC=files` or `fs` chooses (for tests
    /// and measurements); else by BACKING's file system type.
    pub fn for_backing(root: &OwnedFd) -> SyncWay {
        let fs = || root.try_clone().map_or(SyncWay::Files, SyncWay::Fs);
        match std::env::var("TIERSTACK_DRAIN_SYNC").as_deref() {
            Ok("files") => SyncWay::Files,
            Ok("fs") => fs(),
            // `f_type`'s width differs between targets.
            #[allow(clippy::unnecessary_cast)]
            _ => match rustix::fs::fstatfs(root) {
                Ok(st) if fs_syncs_all(st.f_type as i64) => fs(),
                _ => SyncWay::Files,
            },
        }
    }

    /// The sync it makes, for messages.
    fn name(&self) -> &'static str {
        match self {
            SyncWay::Fs(_) => "syncfs",
            SyncWay::Files => "fsync",
        }
    }
}

/// Whether a file system of type `magic` (`statfs`'s `f_type`) is a local one whose `syncfs`
/// makes everything written to it durable (data, inodes and names), as its `fsync`s would.
pub fn fs_syncs_all(magic: i64) -> bool {
    const EXT4: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    const BTRFS: i64 = 0x9123_683E;
    const TMPFS: i64 = 0x0102_1994;
    [EXT4, XFS, BTRFS, TMPFS].contains(&magic)
}

/// The parked files and when the oldest was parked.
#[derive(Default)]
pub(super) struct Parked {
    files: Vec<Written>,
    since: Option<Instant>,
    /// A row of the dispatcher waits for parked rows: commit at once.
    now: bool,
}

impl Parked {
    /// Whether the parked files are to be committed now.
    fn due(&self, stopping: bool) -> bool {
        !self.files.is_empty()
            && (self.now
                || stopping
                || self.files.len() >= BATCH_FILES
                || self.since.is_some_and(|t| t.elapsed() >= BATCH_WAIT))
    }
}

impl Drainer {
    /// Parks a written file for the committer; its row stays in flight until committed.
    pub(super) fn park(&self, w: Written) {
        {
            let mut fl = self.inflight.lock();
            fl.parked += 1;
            self.inflight_cv.notify_all();
        }
        let mut p = self.parked.lock();
        p.since.get_or_insert_with(Instant::now);
        p.files.push(w);
        if p.files.len() >= BATCH_FILES {
            self.parked_cv.notify_one();
        } else if p.files.len() == 1 {
            // The committer sleeps until something is parked.
            self.parked_cv.notify_one();
        }
    }

    /// Asks the committer to commit what is parked at once (a row waits for it).
    pub(super) fn commit_now(&self) {
        let mut p = self.parked.lock();
        if !p.files.is_empty() {
            p.now = true;
            self.parked_cv.notify_one();
        }
    }

    /// The committer thread: commits the parked files batch by batch until the drainer
    /// stops and no worker is left to park one.
    pub(super) fn committer(&self) {
        loop {
            let batch = {
                let mut p = self.parked.lock();
                loop {
                    let stopping = self.stop.load(Relaxed);
                    if p.due(stopping) {
                        break;
                    }
                    if stopping && p.files.is_empty() && self.workers_live.load(Relaxed) == 0 {
                        return;
                    }
                    let nap = match p.since {
                        Some(t) => BATCH_WAIT.saturating_sub(t.elapsed()),
                        None => Duration::from_millis(100),
                    };
                    self.parked_cv
                        .wait_for(&mut p, nap.max(Duration::from_millis(1)));
                }
                p.now = false;
                let take = p.files.len().min(BATCH_FILES);
                let batch: Vec<Written> = p.files.drain(..take).collect();
                p.since = if p.files.is_empty() {
                    None
                } else {
                    Some(Instant::now())
                };
                batch
            };
            let ops: Vec<(i64, u64)> = batch.iter().map(|w| (w.op.seq, w.op.ino)).collect();
            self.commit_batch(batch);
            let mut fl = self.inflight.lock();
            fl.parked -= ops.len();
            for (_, ino) in &ops {
                fl.release(*ino);
            }
            self.inflight_cv.notify_all();
        }
    }

    /// Commits a batch of written files in the four steps of the module's comment; a file
    /// whose step failed is drained again alone ([`Drainer::drain_file`]).
    pub(super) fn commit_batch(&self, batch: Vec<Written>) {
        let mut dirs = Dirs::new(self.core.backing());
        let mut redo: Vec<JOp> = Vec::new();
        let way = &self.sync_way;
        // A file on another file system than BACKING's root (a mount inside BACKING) is
        // synced the per-file way: `syncfs` of the root does not reach it.
        let root_dev = match way {
            SyncWay::Fs(root) => rustix::fs::fstat(root).ok().map(|st| st.st_dev),
            SyncWay::Files => None,
        };
        let on_root = |w: &Written| root_dev.is_some() && w.dev() == root_dev;
        // 1. The staging files durable.
        let mut synced = Vec::with_capacity(batch.len());
        let fs_sync = match way {
            SyncWay::Fs(root) if batch.iter().any(on_root) => {
                rustix::fs::syncfs(root).map_err(std::io::Error::from)
            }
            _ => Ok(()),
        };
        for w in batch {
            let r = match &fs_sync {
                Ok(()) if on_root(&w) => Ok(()),
                Ok(()) => sync_written(&w),
                Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            };
            match r {
                Ok(()) => synced.push(w),
                Err(e) => self.give_up(w, &mut dirs, way.name(), &e, &mut redo),
            }
        }
        // 2. In place.
        let mut placed = Vec::with_capacity(synced.len());
        // Folders whose entries changed, to be synced one by one (all of them the per-file
        // way; with `syncfs`, those of files off the root's file system).
        let mut touched: BTreeSet<Vec<u8>> = BTreeSet::new();
        let mut renamed = false;
        for w in synced {
            match self.put_in_place(&w, &mut dirs) {
                Ok(t) => {
                    if on_root(&w) {
                        renamed |= !w.open();
                    } else {
                        touched.extend(t);
                    }
                    placed.push(w);
                }
                Err(e) => self.give_up(w, &mut dirs, "putting in place", &e, &mut redo),
            }
        }
        // 3. The names durable (the fresh staging files' too, for the per-file way: with
        // `syncfs`, step 1 made them durable).
        let names = match way {
            SyncWay::Fs(root) if renamed => rustix::fs::syncfs(root).map_err(std::io::Error::from),
            _ => Ok(()),
        }
        .and_then(|()| dirs.sync(&touched));
        match names {
            Err(e) => {
                for w in placed {
                    self.give_up(w, &mut dirs, "syncing the folders", &e, &mut redo);
                }
            }
            // 4. Retired.
            Ok(()) => {
                for w in placed {
                    let op = w.op.clone();
                    match self.finish_written(w) {
                        Ok(()) => self.finish_row(op.seq),
                        Err(e) => {
                            self.note_error(
                                &format!(
                                    "recording the drain of {} (drained again alone)",
                                    String::from_utf8_lossy(&op.p1)
                                ),
                                &e,
                            );
                            redo.push(op);
                        }
                    }
                }
            }
        }
        for op in redo {
            self.apply_with_retry(&op, |op| self.drain_file(op));
        }
    }

    /// A file of the batch whose step failed: its fresh staging file removed (unless in
    /// place already) and its row noted to be drained again alone.
    fn give_up(
        &self,
        w: Written,
        dirs: &mut Dirs<'_>,
        what: &str,
        e: &std::io::Error,
        redo: &mut Vec<JOp>,
    ) {
        self.note_error(
            &format!(
                "{what} of {} (drained again alone)",
                String::from_utf8_lossy(&w.op.p1)
            ),
            e,
        );
        self.abandon(&w, dirs);
        redo.push(w.op.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syncfs_only_where_it_makes_everything_durable() {
        // ext4, XFS, btrfs, tmpfs.
        for m in [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994] {
            assert!(fs_syncs_all(m), "{m:#x}");
        }
        // NFS, FUSE (GlusterFS, MooseFS clients), Lustre, GPFS: an fsync of each.
        for m in [0x6969, 0x6573_5546, 0x0BD0_0BD0, 0x4750_4653] {
            assert!(!fs_syncs_all(m), "{m:#x}");
        }
    }
}
