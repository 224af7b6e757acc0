//! The journal as the drainer and `status` read it: rows waiting for BACKING, their
//! deletion once applied, and the quarantine (rows BACKING refused for good, with the
//! inodes whose dirty data they keep in the fast tier).
//!
//! Every method here takes the database lock (`db`) for its own work and lets it go before
//! it returns; none takes the namespace lock (`ns`) or a file's lock.

use std::sync::atomic::Ordering::SeqCst;

use crate::db::{JOp, Stuck};
use crate::error::Result;

use super::Core;

/// The `meta` key of the row whose change to BACKING may be under way.
const IN_FLIGHT: &str = "in_flight";

impl Core {
    /// Commits the open group transaction, then reads up to `limit` rows after `seq`, in
    /// order: only committed rows reach BACKING (a row of a group that a `kill -9` would
    /// lose must not have been applied there). Both under one hold of `db`.
    pub fn committed_rows_after(&self, seq: i64, limit: usize) -> Result<Vec<JOp>> {
        let mut db = self.lock_db();
        db.commit_group().and_then(|()| db.ops_after(seq, limit))
    }

    /// Records durably that row `seq` is about to change BACKING (a rename, after which the
    /// namespace's backing paths follow it): everything committed so far, the record
    /// included, survives a crash. If the daemon dies after BACKING changed but before the
    /// backing paths and the row's deletion were committed, the next mount finds the row
    /// here and applies it again before it serves (see [`Core::interrupted_row`]): reads
    /// would otherwise look for bases where BACKING no longer has them. Takes `db`.
    pub fn mark_in_flight(&self, seq: i64) -> Result<()> {
        let mut db = self.lock_db();
        db.meta_set(IN_FLIGHT, &seq.to_le_bytes())?;
        db.make_durable()
    }

    /// The row recorded by [`Core::mark_in_flight`], if it is still in the journal: its
    /// change to BACKING may have been made without the namespace knowing. Takes `db`.
    pub fn interrupted_row(&self) -> Result<Option<JOp>> {
        let db = self.lock_db();
        let Some(v) = db.meta_get(IN_FLIGHT)? else {
            return Ok(None);
        };
        let Ok(b) = <[u8; 8]>::try_from(v.as_slice()) else {
            return Ok(None);
        };
        let seq = i64::from_le_bytes(b);
        Ok(db
            .ops_after(seq - 1, 1)?
            .into_iter()
            .find(|op| op.seq == seq))
    }

    /// Records, committed before it returns, that the drainer is about to make a temporary
    /// file at `path` in BACKING for inode `ino` (a staging file, a further link's temporary
    /// name): a crash before the namespace records what became of it leaves a file nobody
    /// knows, which the drainer's sweep ([`Core::staging_files`]) then removes. Takes `db`.
    pub fn note_staging(&self, path: &[u8], ino: u64) -> Result<()> {
        let mut db = self.lock_db();
        db.staging_add(path, ino)?;
        db.commit_group()
    }

    /// The temporary files recorded by [`Core::note_staging`] and not yet forgotten, with
    /// their inodes. Takes `db`.
    pub fn staging_files(&self) -> Result<Vec<(Vec<u8>, u64)>> {
        self.lock_db().staging_files()
    }

    /// Forgets a temporary file (gone from BACKING, or removed by the sweep). Takes `db`.
    pub fn forget_staging(&self, path: &[u8]) -> Result<()> {
        self.lock_db().staging_del(path)
    }

    /// Whether the journal holds a row after `seq`, or may once the queued journal work has
    /// run (true then without taking `db`: the drainer asks this at every turn, and running
    /// the queue for it would run it while the foreground is busy, which the committer waits
    /// not to do, see [`super::journal_due`]). Takes `db` otherwise.
    pub fn has_rows_after(&self, seq: i64) -> Result<bool> {
        if self.later_queued() {
            return Ok(true);
        }
        self.lock_db().has_ops_after(seq)
    }

    /// The rows of inode `ino` after `seq`, in order. Takes `db`.
    pub fn rows_of(&self, ino: u64, seq: i64) -> Result<Vec<JOp>> {
        self.lock_db().ops_of(ino, seq)
    }

    /// Deletes row `seq` (applied to BACKING). Takes `db`.
    pub fn delete_row(&self, seq: i64) -> Result<()> {
        self.lock_db().del_op(seq)
    }

    /// Deletes the rows `seqs` in one transaction (they cancelled out). Takes `db`.
    pub fn delete_rows(&self, seqs: &[i64]) -> Result<()> {
        self.lock_db().del_ops(seqs)
    }

    /// How many rows the journal holds. Takes `db`.
    pub fn journal_len(&self) -> Result<u64> {
        self.lock_db().count_ops()
    }

    /// For `status`: the journal's committed rows and the quarantined rows, read through a
    /// connection of their own ([`crate::db::DbReader`]: a scrape does not wait for the
    /// drainer or the committer, which hold `db` while they work). Where that connection
    /// cannot be made or read, under one hold of `db` (0 and none where the journal cannot
    /// be read at all). Takes `reader`, and `db` only to make the connection or to fall back.
    pub fn journal_backlog(&self) -> (u64, Vec<Stuck>) {
        let mut reader = self.reader.lock();
        if reader.is_none() {
            *reader = self.lock_db().reader().ok();
        }
        // The reader sees committed rows only: rows may also wait in the queue or in the
        // open group. Looked at before the reader counts (work leaves the queue only into an
        // open group, and the flag falls only once the group is committed), so that work
        // in either then is seen by the reader or here.
        let unseen = self.later_queued() || self.uncommitted.load(SeqCst);
        let read = reader
            .as_ref()
            .and_then(|r| Some((r.count_ops().ok()?, r.stuck().ok()?)));
        if let Some((n, stuck)) = read {
            drop(reader);
            // With none seen by the reader, counted under `db`, so that an empty count
            // means an empty journal (`drain --wait` returns on it).
            if n > 0 || !unseen {
                return (n, stuck);
            }
            return (self.lock_db().count_ops().unwrap_or(n), stuck);
        }
        *reader = None;
        drop(reader);
        let db = self.lock_db();
        (db.count_ops().unwrap_or(0), db.stuck().unwrap_or_default())
    }

    /// Moves `op` from the journal to the quarantine with the error `msg`, and notes its
    /// inode as stuck (its dirty data stays in the fast tier). Takes `db`, lets it go, then
    /// takes `stuck_inos`.
    pub fn quarantine_row(&self, op: &JOp, msg: &str) -> Result<()> {
        self.lock_db().quarantine(op, msg)?;
        self.stuck_inos.lock().insert(op.ino);
        Ok(())
    }

    /// Moves every quarantined row back into the journal (`drain --retry`) and forgets the
    /// stuck inodes. Takes `db`, and `stuck_inos` inside it (order `db` -> `stuck_inos`).
    pub fn release_quarantine(&self) -> Result<usize> {
        let mut db = self.lock_db();
        let n = db.release_stuck()?;
        self.stuck_inos.lock().clear();
        drop(db);
        Ok(n)
    }
}
