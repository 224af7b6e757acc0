//! Space accounting and backpressure (writers wait, clean pages are dropped), `fsync` with
//! group commit, the store's background loop and the dirty summaries.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::Result;

use super::{eio, Core, FileData, PAGE, R, WRITE_BACK_START};

/// Room a writer that waited leaves free before it ends the pressure (four pages), so that
/// the next writer does not raise it again at once.
const PRESSURE_SLACK: u64 = 4 * PAGE;

/// How long an operation that finds the array full ([`RoomWait`]) waits for the drain to
/// make room without any progress (no page made clean, none dropped) before it fails with
/// ENOSPC.
const FULL_PATIENCE: Duration = Duration::from_secs(60);

/// A wait for room in a full fast tier by an operation that cannot go on without it (a
/// flush, a page put while its file is locked): each step wakes the drainer, raises the
/// pressure (under which the drainer drops clean pages after each file it drains) and drops
/// clean pages itself unless it holds a file's lock (the namespace lock comes before a
/// file's: see `Core::finish_drain`), or naps 50 ms; it gives up once [`FULL_PATIENCE`]
/// passed with no page made clean or dropped, and at once while recovering (no drainer runs
/// yet).
pub(super) struct RoomWait {
    last: (u64, u64),
    since: std::time::Instant,
    /// No file's lock is held: clean pages may be dropped here.
    may_drop: bool,
}

impl RoomWait {
    /// A wait by a caller that holds no file's lock (`may_drop`) or holds one.
    pub(super) fn new(core: &Core, may_drop: bool) -> RoomWait {
        RoomWait {
            last: (core.held.load(Relaxed), core.dirty_bytes.load(Relaxed)),
            since: std::time::Instant::now(),
            may_drop,
        }
    }

    /// One step of the wait; false when the operation is to fail instead (ENOSPC).
    pub(super) fn wait(&mut self, core: &Core) -> bool {
        if core.replaying.load(Relaxed) || self.since.elapsed() >= FULL_PATIENCE {
            return false;
        }
        core.pressure.store(true, Relaxed);
        core.wake_drainer();
        if !(self.may_drop && core.drop_clean(8 * PAGE)) {
            let mut g = core.space_lock.lock();
            core.space_cv.wait_for(&mut g, Duration::from_millis(50));
        }
        let now = (core.held.load(Relaxed), core.dirty_bytes.load(Relaxed));
        if now.0 < self.last.0 || now.1 < self.last.1 {
            self.since = std::time::Instant::now();
        }
        self.last = now;
        true
    }
}

/// The unit of the array's space: a page's bytes take whole blocks of it.
const BLOCK: u64 = 4096;

/// What a page of `len` bytes takes in the fast tier (whole blocks: a file of a few bytes
/// takes a block of the array, and thousands of them fill it).
pub(super) fn footprint(len: u64) -> u64 {
    len.div_ceil(BLOCK) * BLOCK
}

/// The most a mount may hold in its fast tier, in [`footprint`] bytes: `dram` of the DRAM
/// tier and `tiers` of the tiers between it and the array, on top of half the array's
/// `capacity` (the array is a log: its cleaner needs free segments), but never more than
/// two thirds of the array. Everything held reaches the array at the latest when the mount
/// stops (and at every `fsync` in sync mode), so a DRAM tier larger than half the array
/// cannot add to what it holds: with small drives, more would fill the array and fail a
/// flush instead of making writers wait for the drain.
pub fn hold_limit(dram: u64, tiers: u64, capacity: u64) -> u64 {
    (dram + tiers + capacity / 2).min(capacity / 3 * 2)
}

/// The default size of each of the four file drives of a new fast tier (a RAID 5: the
/// array holds three of them): 2 GiB, or more when the DRAM tier and the tiers between it
/// and the array (VRAM) are larger, so that [`hold_limit`]'s two thirds of the array take
/// them whole and half as much again: an array of 9/4 of them holds 3/2. With the 2 GiB
/// drives a mount with `--vram 8G` held at most 4 GiB, and writers waited for the drain
/// while the GPU stood half empty. Drives are sparse files: the disk holds what is written.
pub fn default_drive_size(dram: u64, tiers: u64) -> u64 {
    const G: u64 = 1 << 30;
    let fast = dram.saturating_add(tiers);
    (fast.saturating_mul(3) / 4)
        .div_ceil(G)
        .saturating_mul(G)
        .max(2 * G)
}

/// [`default_drive_size`]'s `want` for four drives on a file system with `free` bytes
/// available: drives are sparse, but the array writes its segments ahead of need
/// (conditioning) while a tenth of the file system stays free, so four of them are held to
/// nine tenths of `free`, in whole GiB, never below the 2 GiB of the defaults.
pub fn drive_size_within(want: u64, free: u64) -> u64 {
    const G: u64 = 1 << 30;
    let room = free / 10 * 9 / 4 / G * G;
    want.min(room).max(2 * G)
}

/// Whether `len` more bytes fit in the fast tier, `held` of `limit` bytes held: if not, the
/// writer waits and raises the pressure (the drain turns urgent: see `drain::policy`).
fn fits(held: u64, len: u64, limit: u64) -> bool {
    held + len <= limit
}

/// Whether a writer that waited for space ends the pressure: [`PRESSURE_SLACK`] is free.
fn pressure_relieved(held: u64, limit: u64) -> bool {
    held + PRESSURE_SLACK < limit
}

impl Core {
    /// Waits until the store has room for `len` more bytes: wakes the drainer and drops clean
    /// pages; never fails.
    pub(super) fn wait_space(&self, len: u64) {
        if self.replaying.load(Relaxed) {
            // Recovery runs before the drainer: waiting here would wait for ever. What the
            // log replays was held before the crash, so the overshoot is bounded by the log.
            return;
        }
        let mut waited = false;
        while !fits(self.held.load(Relaxed), len, self.limit) {
            if !waited {
                self.pressure.store(true, Relaxed);
                self.wake_drainer();
                waited = true;
            }
            if self.drop_clean(len) {
                continue;
            }
            let mut g = self.space_lock.lock();
            self.space_cv.wait_for(&mut g, Duration::from_millis(50));
        }
        if waited && pressure_relieved(self.held.load(Relaxed), self.limit) {
            self.pressure.store(false, Relaxed);
        }
    }

    /// Drops clean pages (BACKING holds them) until `want` bytes are free; whether any went.
    pub fn drop_clean(&self, want: u64) -> bool {
        let files: Vec<(Arc<Mutex<FileData>>, u64)> = {
            let ns = self.ns.lock();
            ns.nodes
                .values()
                .filter_map(|n| n.data.as_ref().map(|d| (d.clone(), n.obj)))
                .collect()
        };
        // The records that say BACKING holds these pages must be durable before they go.
        if let Err(e) = self.lock_db().make_durable() {
            tracing::warn!("making the journal durable: {e}");
            return false;
        }
        let mut freed = 0u64;
        for (d, obj) in files {
            let Some(mut f) = d.try_lock() else { continue };
            let clean: Vec<u64> = f
                .pages
                .iter()
                .filter(|(_, pg)| !pg.dirty)
                .map(|(p, _)| *p)
                .collect();
            for p in clean {
                let len = f.pages.get(&p).map_or(0, |pg| footprint(pg.len as u64));
                if self.drop_page(obj, &mut f, p).is_ok() {
                    freed += len;
                }
            }
            if freed >= want && self.held.load(Relaxed) + want <= self.limit {
                break;
            }
        }
        freed > 0
    }

    /// Wakes writers waiting for space (after pages were dropped or made clean).
    pub fn notify_space(&self) {
        self.space_cv.notify_all();
    }

    /// `fsync`: in sync mode the file's data goes down to the array and is flushed there and
    /// the journal is made durable; in async mode the data is in the store's DRAM already.
    /// A small change of a regular file goes to the intent log instead (see `crate::intent`).
    pub fn fsync(&self, ino: u64) -> R<()> {
        if self.sync_mode && self.log_fsync(ino) {
            self.fsync_logged.fetch_add(1, Relaxed);
            return Ok(());
        }
        {
            let ns = self.ns.lock();
            self.persist_node(&ns, ino).map_err(eio)?;
        }
        if self.sync_mode {
            self.sync_all().map_err(eio)?;
            self.fsync_flushed.fetch_add(1, Relaxed);
        }
        Ok(())
    }

    /// Makes the changes of file `ino` since the last full flush durable in the intent log;
    /// false when they are too large for a record (or it is not a regular file, or the log is
    /// full or failed): the caller flushes everything instead.
    fn log_fsync(&self, ino: u64) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let Some(log) = &self.intent else {
            return false;
        };
        let _shared = self.flush_rw.read();
        let gen = self.flush_gen.load(SeqCst);
        let Ok((d, obj)) = self.file(ino) else {
            // A directory (or another node without contents): its entries are namespace rows,
            // durable once the journal is.
            let dir = self
                .ns
                .lock()
                .nodes
                .get(&ino)
                .is_some_and(|n| n.data.is_none());
            return dir && self.journal_durable();
        };
        let rec = {
            let mut f = d.lock();
            let fresh = f.unsynced_gen == gen;
            if fresh && f.unsynced_bytes > crate::intent::MAX_RECORD {
                return false;
            }
            let ranges = if fresh {
                f.unsynced_bytes = 0;
                std::mem::take(&mut f.unsynced)
            } else {
                Vec::new()
            };
            let mut extents = Vec::with_capacity(ranges.len());
            for (off, len) in ranges {
                match self.read_locked(obj, &mut f, off, len) {
                    Ok(b) if !b.is_empty() => extents.push((off, b)),
                    Ok(_) => {}
                    Err(_) => return false,
                }
            }
            crate::intent::Record {
                ino,
                obj,
                size: f.size,
                extents,
            }
        };
        // The file's name and inode row (a create, a rename) must be durable with it.
        if !self.journal_durable() {
            return false;
        }
        match log.commit(rec) {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!("{e}; fsync falls back to a full flush");
                false
            }
        }
    }

    /// Makes every namespace commit so far durable (one synchronous SQLite commit, skipped
    /// when nothing was committed since the last); false on error.
    fn journal_durable(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let commits = self.db_commits.load(SeqCst);
        if self.db_durable.load(SeqCst) == commits {
            return true;
        }
        if let Err(e) = self.lock_db().make_durable() {
            tracing::warn!("making the journal durable: {e}");
            return false;
        }
        self.db_durable.fetch_max(commits, SeqCst);
        true
    }

    /// After a crash: applies the intent log's records (each a file's bytes and size at an
    /// acknowledged `fsync`, in order) to the files they name, then flushes everything and
    /// voids the log.
    pub(super) fn replay_intent(&self, records: &[crate::intent::Record]) -> Result<()> {
        let mut applied = 0u64;
        for r in records {
            let same = {
                let ns = self.ns.lock();
                ns.nodes
                    .get(&r.ino)
                    .is_some_and(|n| n.obj == r.obj && n.data.is_some())
            };
            if !same {
                // Removed (durably) since: nothing to bring back.
                continue;
            }
            for (off, b) in &r.extents {
                self.write(r.ino, *off, b, false, None).map_err(|e| {
                    crate::error::FsError::Config(if e == libc::ENOSPC {
                        format!(
                            "replaying the intent log: inode {}: the fast tier is full and nothing drains during recovery: copy the fast tier folder aside and report it",
                            r.ino
                        )
                    } else {
                        format!(
                            "replaying the intent log: write of inode {}: errno {e}",
                            r.ino
                        )
                    })
                })?;
            }
            self.setattr(r.ino, None, None, None, Some(r.size), None, None, false)
                .map_err(|e| {
                    crate::error::FsError::Config(format!(
                        "replaying the intent log: size of inode {}: errno {e}",
                        r.ino
                    ))
                })?;
            applied += 1;
        }
        tracing::warn!(
            "recovery: {applied} of {} intent log records replayed (fsyncs acknowledged before the daemon stopped)",
            records.len()
        );
        self.intent_replayed.store(applied, Relaxed);
        self.sync_all()
    }

    /// Makes every page and every journal row written before the call durable. Concurrent
    /// callers share one flush (group commit): a caller returns once a flush that started
    /// after it arrived has completed.
    pub fn sync_all(&self) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let ticket = self.sync_arrived.fetch_add(1, SeqCst) + 1;
        let _g = self.sync_lock.lock();
        if self.sync_covered.load(SeqCst) >= ticket {
            return Ok(());
        }
        // Everyone who arrived until now wrote their data before this flush starts.
        let covers = self.sync_arrived.load(SeqCst);
        // No log record is written while the flush runs; writes from here on are noted for
        // the log's next generation.
        let _exclusive = self.flush_rw.write();
        self.flush_gen.fetch_add(1, SeqCst);
        self.unloggable.store(0, SeqCst);
        let commits = self.db_commits.load(SeqCst);
        self.flush_store()?;
        self.lock_db().make_durable()?;
        self.db_durable.fetch_max(commits, SeqCst);
        if let Some(log) = &self.intent {
            // Everything the log held is in the array now.
            log.reset()
                .map_err(|e| crate::error::FsError::Config(e.to_string()))?;
        }
        self.sync_covered.store(covers, SeqCst);
        Ok(())
    }

    /// Writes every page of the store down to the array and makes it durable. When the array
    /// is full (more is held than it takes at once: pages of files being drained, blocks of
    /// small files), waits for the drain to make pages clean and drops them, as a writer
    /// does ([`Core::wait_space`]); gives up with the store's `Full` error (ENOSPC) once
    /// [`FULL_PATIENCE`] passes with nothing made clean or dropped, and at once while
    /// recovering (no drainer runs yet).
    fn flush_store(&self) -> Result<()> {
        let mut room = RoomWait::new(self, true);
        loop {
            match self.store.flush() {
                Ok(()) => return Ok(()),
                Err(e @ tierstack_store::StoreError::Full(_)) => {
                    if !room.wait(self) {
                        return Err(e.into());
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The store's background work, until the daemon stops: eviction ahead of need (so a
    /// writer seldom evicts inside its own write), and in sync mode writing dirty DRAM pages
    /// to the array once [`WRITE_BACK_START`] bytes are dirty (not yet durable: `fsync`
    /// makes them so, with less left to write). With the intent log, small `fsync`s do not
    /// need the pages in the array, and a 4 KiB write dirties a whole 1 MiB page: write-back
    /// then waits until half the DRAM tier is dirty (unless [`Core::unloggable`] bytes of
    /// large streams are waiting for a full flush anyway), and the log is folded (a full flush)
    /// once it is half full, so that an `fsync` seldom finds it full.
    pub fn background_loop(&self) {
        let dram = self.store.status().first().map_or(0, |t| t.capacity_bytes);
        let headroom = (dram / 8).min(128 << 20);
        let write_back_start = if self.intent.is_some() {
            (dram / 2).max(WRITE_BACK_START)
        } else {
            WRITE_BACK_START
        };
        let mut idle = Duration::from_millis(1);
        while !self.stopping.load(Relaxed) {
            let mut busy = match self.store.make_room(headroom) {
                Ok(b) => b,
                Err(e) => {
                    // The pages stay in DRAM; writers evicting themselves report the error.
                    tracing::warn!("background eviction: {e}");
                    false
                }
            };
            // Streams too large for the log start write-back at once: their `fsync` writes
            // everything to the array, and what was written before has less to wait for.
            let start = if self.unloggable.load(Relaxed) >= WRITE_BACK_START {
                WRITE_BACK_START
            } else {
                write_back_start
            };
            if self.sync_mode && self.store.dirty_bytes() >= start {
                match self.store.write_back(8 * PAGE) {
                    Ok(_) => busy = true,
                    Err(e) => tracing::warn!("background write to the fast tier: {e}"),
                }
            }
            if self
                .intent
                .as_ref()
                .is_some_and(|l| l.used() > crate::intent::LOG_BYTES / 2)
            {
                if let Err(e) = self.sync_all() {
                    tracing::warn!("folding the intent log: {e}");
                }
                busy = true;
            }
            if busy {
                idle = Duration::from_millis(1);
            } else {
                std::thread::sleep(idle);
                idle = (idle * 2).min(Duration::from_millis(20));
            }
        }
    }

    /// FUSE `flush` (a `close` of a handle): writes the node's attributes and contents
    /// fields through to the inode table.
    pub fn flush_handle(&self, ino: u64) -> R<()> {
        let ns = self.ns.lock();
        self.persist_node(&ns, ino).map_err(eio)
    }

    /// The modification time (ns) of node `ino`.
    pub fn mtime_of(&self, ino: u64) -> Option<i64> {
        self.ns.lock().nodes.get(&ino).map(|n| n.mtime)
    }

    /// The inode at `name` in `parent` if a direct-write handle ever wrote it (its mtime in
    /// the kernel's cache may then be older than the mount's: see `crate::refresh`).
    pub fn direct_written_at(&self, parent: u64, name: &[u8]) -> Option<u64> {
        let ns = self.ns.lock();
        let ino = ns.child(parent, name)?;
        ns.nodes
            .get(&ino)
            .is_some_and(|n| n.direct_mtime > 0)
            .then_some(ino)
    }

    /// The names of node `ino` (directory, name).
    pub fn links_of(&self, ino: u64) -> Vec<super::Link> {
        self.ns
            .lock()
            .nodes
            .get(&ino)
            .map(|n| n.links.clone())
            .unwrap_or_default()
    }

    // ------------------------------------------------------------------ status

    /// (dirty files, dirty bytes) by a walk of the namespace.
    pub fn dirty_summary(&self) -> (u64, u64) {
        let ns = self.ns.lock();
        let mut files = 0;
        let mut bytes = 0;
        for n in ns.nodes.values() {
            if let Some(d) = &n.data {
                // A file someone holds (the drainer pinning or draining it, a write) counts
                // as dirty: the summary (what `status`, and so every Prometheus scrape,
                // shows) never waits behind that work. (It used to wait up to 5 ms per held
                // file: most of a scrape's cost while drains ran.)
                let Some(f) = d.try_lock() else {
                    if !n.links.is_empty() {
                        files += 1;
                    }
                    continue;
                };
                if f.dirty && !n.links.is_empty() {
                    files += 1;
                    bytes += f
                        .pages
                        .values()
                        .filter(|p| p.dirty)
                        .map(|p| p.len as u64)
                        .sum::<u64>();
                }
            }
        }
        (files, bytes)
    }

    /// For `status`, in one walk of the namespace: the dirty files (as
    /// [`Core::dirty_summary`] counts them) and those of them whose drain is not quarantined
    /// (as [`Core::unsettled_dirty_files`]). A file someone holds counts in both, without a
    /// wait.
    pub fn dirty_and_unsettled(&self) -> (u64, u64) {
        let stuck = self.stuck_inos.lock().clone();
        let ns = self.ns.lock();
        let (mut files, mut unsettled) = (0, 0);
        for (i, n) in ns.nodes.iter() {
            let Some(d) = &n.data else { continue };
            if n.links.is_empty() || !d.try_lock().is_none_or(|f| f.dirty) {
                continue;
            }
            files += 1;
            if !stuck.contains(i) {
                unsettled += 1;
            }
        }
        (files, unsettled)
    }

    /// Dirty files whose drain is not quarantined.
    pub fn unsettled_dirty_files(&self) -> u64 {
        let stuck = self.stuck_inos.lock().clone();
        let ns = self.ns.lock();
        ns.nodes
            .iter()
            .filter(|(i, n)| {
                // A file someone holds counts as unsettled (it is being written or drained):
                // the answer never waits behind that work.
                !stuck.contains(i)
                    && !n.links.is_empty()
                    && n.data
                        .as_ref()
                        .is_some_and(|d| d.try_lock().is_none_or(|f| f.dirty))
            })
            .count() as u64
    }

    /// Whether BACKING holds everything: no journal row, nothing quarantined, no changed
    /// file.
    pub fn fully_drained(&self) -> Result<bool> {
        {
            let db = self.lock_db();
            if db.count_ops()? > 0 || !db.stuck()?.is_empty() {
                return Ok(false);
            }
        }
        let ns = self.ns.lock();
        Ok(!ns
            .nodes
            .values()
            .any(|n| n.data.as_ref().is_some_and(|d| d.lock().dirty)))
    }

    /// Queues a data op for every dirty file that has none (not those whose drain is
    /// quarantined: they wait for `drain --retry` or the next mount).
    pub fn queue_all_dirty(&self) -> Result<()> {
        let stuck = self.stuck_inos.lock().clone();
        let ns = self.ns.lock();
        let inos: Vec<u64> = ns
            .nodes
            .iter()
            .filter(|(i, n)| {
                !stuck.contains(i)
                    && !n.links.is_empty()
                    && n.data
                        .as_ref()
                        .is_some_and(|d| d.try_lock().is_some_and(|f| f.dirty && !f.data_pending))
            })
            .map(|(i, _)| *i)
            .collect();
        for ino in inos {
            self.queue_data(&ns, ino)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_starts_when_a_write_does_not_fit_and_ends_with_slack() {
        let limit = 100 * PAGE;
        assert!(fits(90 * PAGE, 10 * PAGE, limit));
        assert!(!fits(90 * PAGE, 10 * PAGE + 1, limit));
        // Room for the write alone does not end it: four pages must be free.
        assert!(!pressure_relieved(96 * PAGE, limit));
        assert!(pressure_relieved(96 * PAGE - 1, limit));
    }

    #[test]
    fn what_a_mount_holds_fits_its_array_whatever_its_dram_tier() {
        const G: u64 = 1 << 30;
        // The defaults (1 GiB of DRAM, four 2 GiB drives in RAID 5: 6 GiB): DRAM on top of
        // half the array.
        assert_eq!(hold_limit(G, 0, 6 * G), 4 * G);
        // Small drives (four of 512 MiB) under the default DRAM tier: two thirds of the
        // array, not more than it takes.
        assert_eq!(hold_limit(G, 0, 3 * G / 2), G);
        assert!(hold_limit(64 * G, 8 * G, 6 * G) <= 4 * G);
        // Default drives take the fast tiers in whole, with room to spare in the array
        // (its capacity a little under three drives: superblocks and summaries).
        for (dram, vram) in [(G, 0), (G / 2, 8 * G), (16 * G, 0), (4 * G, 80 * G), (0, 0)] {
            let drive = default_drive_size(dram, vram);
            let capacity = 3 * drive / 100 * 98;
            assert!(drive >= 2 * G);
            assert!(hold_limit(dram, vram, capacity) >= dram + vram + (dram + vram) / 4);
        }
        // The defaults stay as they were: four drives of 2 GiB.
        assert_eq!(default_drive_size(G, 0), 2 * G);
        assert_eq!(default_drive_size(G / 2, 8 * G), 7 * G);
        // Four drives fit in nine tenths of the free space, never below the defaults.
        assert_eq!(drive_size_within(7 * G, 100 * G), 7 * G);
        assert_eq!(drive_size_within(7 * G, 20 * G), 4 * G);
        assert_eq!(drive_size_within(7 * G, G), 2 * G);
        // A small file's bytes take whole blocks.
        assert_eq!(footprint(0), 0);
        assert_eq!(footprint(1), 4096);
        assert_eq!(footprint(4096), 4096);
        assert_eq!(footprint(PAGE - 1), PAGE);
    }
}
