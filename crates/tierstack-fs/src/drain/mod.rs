//! The drainer: replays the namespace journal to BACKING in order.
//!
//! * Namespace rows are applied by the dispatcher thread, one at a time, in `seq` order. Rows
//!   that move or remove existing paths (rename, unlink, rmdir, link, setattr) are barriers:
//!   they wait until no data op is in flight, so every row finds BACKING exactly as the rows
//!   before it left it, also when it is replayed after a crash. A directory's setattr is put
//!   off to the next barrier or the journal batch's end when run as root
//!   ([`Drainer::apply_deferred`]).
//! * Data rows go to a pool of workers (parallel across files, one at a time per file). A
//!   worker writes the file's whole contents under a temporary name in the destination
//!   directory, fsyncs it, renames it into place and fsyncs the directory: BACKING never shows
//!   a half-written file (batched, [`batch`]: many files' syncs shared, each step for the
//!   whole batch before the next). Only then is the journal row deleted and the file's pages marked
//!   clean; clean pages are dropped from the store only under space pressure, so the store
//!   never holds the only copy of anything it drops.
//! * Every access to BACKING goes through directory handles ([`crate::backing`]), so any
//!   depth the mount accepts drains, whatever the length of the full path.
//! * An error that may heal (full, read-only, I/O error) makes the op retry with exponential
//!   backoff (100 ms .. 5 s). An error BACKING will keep giving (permission, name, type) is
//!   retried [`PERMANENT_TRIES`] times, then the row is moved to the quarantine (`stuck`
//!   table) with its data kept in the fast tier: the drain goes on with the rest, `status`
//!   lists it, and it is retried on `drain --retry` or the next mount. Nothing is skipped
//!   silently or lost, and nothing is retried for ever in silence.
//!
//! The parts, by job: `policy.rs` decides *when* and *whether* (the quiet time, the max
//! delay, urgency, the worker limit, retries and the quarantine), as pure functions of what
//! the drainer tells it; this file holds the [`Drainer`], the mechanism (dispatcher, workers,
//! rate limit, the quarantine's table) that gathers that and carries out what the policy
//! says; `meta.rs` applies namespace rows to BACKING (the core keeps the backing paths of
//! the namespace up to date: `Core::set_backing_path` and the like); `data.rs` drains a
//! file's contents (staging, writing the dirty pages, copying within BACKING) between
//! `Core::begin_drain` and `Core::finish_drain`. The drainer reaches the namespace and the
//! journal only through `Core`'s methods.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::attr::Kind;
use crate::backing::Backing;
use crate::core::{Core, TMP_PREFIX};
use crate::db::{JOp, OpKind};

pub use policy::{may_heal, DRAIN_MAX_DELAY, DRAIN_QUIET, PERMANENT_TRIES};
use policy::{AfterFailure, Backlog, Choice, Refused, RowKind, Signals, Slots, State, Tries};

pub mod batch;
#[cfg(test)]
mod crash_tests;
mod data;
mod meta;
pub mod policy;
pub mod slots;

/// A token bucket over bytes written to BACKING.
pub struct RateLimit {
    rate: f64,
    state: Mutex<(Instant, f64)>,
}

impl RateLimit {
    /// A limit of `bytes_per_s` bytes per second (more than 0), with bursts of up to a
    /// quarter second's worth.
    pub fn new(bytes_per_s: u64) -> RateLimit {
        RateLimit {
            rate: bytes_per_s as f64,
            state: Mutex::new((Instant::now(), 0.0)),
        }
    }

    /// Takes `n` bytes from the bucket, sleeping until the rate allows them.
    pub fn take(&self, n: u64) {
        let wait = {
            let mut s = self.state.lock();
            let now = Instant::now();
            let burst = self.rate / 4.0;
            s.1 = (s.1 + now.duration_since(s.0).as_secs_f64() * self.rate).min(burst);
            s.0 = now;
            s.1 -= n as f64;
            if s.1 < 0.0 {
                Duration::from_secs_f64(-s.1 / self.rate)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

/// Data ops in flight: per inode, and in all; of them, those parked for a batch's sync.
#[derive(Default)]
struct Inflight {
    per_ino: HashMap<u64, usize>,
    /// The paths in BACKING each inode's data row in flight writes (its name and further
    /// links; one data row per inode at most is in flight).
    names: HashMap<u64, Vec<Vec<u8>>>,
    total: usize,
    parked: usize,
}

impl Inflight {
    /// What is in flight, as the policy sees it for a row of inode `ino`.
    fn slots(&self, ino: u64, jobs: usize) -> Slots {
        Slots {
            in_flight: self.total,
            same_file: self.per_ino.get(&ino).copied().unwrap_or(0),
            jobs,
            parked: self.parked,
        }
    }

    /// A data row of inode `ino` is done.
    fn release(&mut self, ino: u64) {
        self.total -= 1;
        if let Some(c) = self.per_ino.get_mut(&ino) {
            *c -= 1;
            if *c == 0 {
                self.per_ino.remove(&ino);
                self.names.remove(&ino);
            }
        }
    }

    /// Whether a data row in flight is of inode `ino` or writes one of `paths`.
    fn touches(&self, ino: u64, paths: &[&[u8]]) -> bool {
        self.per_ino.contains_key(&ino)
            || self
                .names
                .values()
                .flatten()
                .any(|n| paths.contains(&n.as_slice()))
    }
}

/// The drainer: a dispatcher thread that reads the journal in order and a pool of workers
/// that drain data rows, with retries, the quarantine and an optional rate limit.
pub struct Drainer {
    core: Arc<Core>,
    jobs: usize,
    /// The policy's settings: quiet time, max delay, urgency, backoff, quarantine.
    policy: policy::Config,
    rate: Option<RateLimit>,
    inflight: Mutex<Inflight>,
    inflight_cv: Condvar,
    /// Set to stop the dispatcher and the workers (at unmount); rows not yet applied stay in
    /// the journal for the next mount.
    pub stop: AtomicBool,
    /// (time, drained bytes) samples for the drain rate.
    samples: Mutex<VecDeque<(Instant, u64)>>,
    /// Errors met while draining, each followed by a retry, since the mount started.
    pub retries: AtomicU64,
    /// Journal rows that cancelled out before reaching BACKING (a file created and removed
    /// within one burst).
    pub cancelled_rows: AtomicU64,
    /// Bases copied into the fast tier before their copy in BACKING was removed (a file
    /// that lives on under another name or through an open handle).
    pub pinned: AtomicU64,
    /// The rows in the quarantine since it was last released: a later row that depends on
    /// one (see [`policy::waits_for`]) is held behind it, never tried against a BACKING that
    /// lacks what it needs.
    refused: Mutex<Vec<Refused>>,
    /// Whether the temporary files the drainer recorded are to be looked at again (at the
    /// start, after a crash may have left some, and whenever a drain made one).
    sweep_due: AtomicBool,
    /// Site-wide drain slots (`mount --drain-slots`): a worker drains only while it holds one.
    slots: Option<slots::Slots>,
    /// How a batch of written files is made durable ([`batch`]).
    sync_way: batch::SyncWay,
    /// Whether workers park written files for the committer ([`batch`]) instead of
    /// syncing each alone.
    batched: bool,
    /// The written files waiting for the committer, and its wake-up.
    parked: Mutex<batch::Parked>,
    parked_cv: Condvar,
    /// Whether directories' attribute rows are put off to the next barrier or the end of the
    /// journal batch ([`Drainer::apply_deferred`]): with batching, when run as root.
    defer_dir_attrs: bool,
    /// Workers still running (the committer ends after the last, once it has committed
    /// what they parked).
    workers_live: std::sync::atomic::AtomicUsize,
}

/// The name of the drainer's temporary file for inode `ino` (suffix: a further link).
fn tmp_name(ino: u64, suffix: &str) -> Vec<u8> {
    let mut n = TMP_PREFIX.to_vec();
    n.extend_from_slice(format!("{ino}{suffix}").as_bytes());
    n
}

impl Drainer {
    /// A drainer over `core` with `jobs` data workers (at least one) and an optional limit
    /// in bytes per second written to BACKING (`None` or 0: unlimited). Nothing runs until
    /// [`Drainer::start`].
    pub fn new(core: Arc<Core>, jobs: usize, rate: Option<u64>) -> Arc<Drainer> {
        Drainer::with_slots(core, jobs, rate, None)
    }

    /// [`Drainer::new`] whose workers drain only while they hold one of the site-wide
    /// `slots` (see [`slots`]).
    pub fn with_slots(
        core: Arc<Core>,
        jobs: usize,
        rate: Option<u64>,
        slots: Option<slots::Slots>,
    ) -> Arc<Drainer> {
        let sync_way = core
            .backing()
            .dir(b"")
            .map_or(batch::SyncWay::Files, |root| {
                batch::SyncWay::for_backing(&root)
            });
        // With site-wide slots each file is synced by the worker that wrote it, inside its
        // slot: the committer's syncs would otherwise move data to the shared system outside
        // the bound (on a network file system `fsync` is what sends it), beside the K
        // streams the slots allow.
        let batched =
            std::env::var("TIERSTACK_DRAIN_BATCH").as_deref() != Ok("0") && slots.is_none();
        Arc::new(Drainer {
            core,
            jobs: jobs.max(1),
            policy: policy::Config::DEFAULT,
            rate: rate.filter(|r| *r > 0).map(RateLimit::new),
            inflight: Mutex::new(Inflight::default()),
            inflight_cv: Condvar::new(),
            stop: AtomicBool::new(false),
            samples: Mutex::new(VecDeque::new()),
            retries: AtomicU64::new(0),
            cancelled_rows: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
            refused: Mutex::new(Vec::new()),
            sweep_due: AtomicBool::new(true),
            slots,
            sync_way,
            batched,
            defer_dir_attrs: batched && rustix::process::geteuid().is_root(),
            parked: Mutex::new(batch::Parked::default()),
            parked_cv: Condvar::new(),
            workers_live: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Starts the dispatcher and the workers.
    pub fn start(self: &Arc<Self>) -> io::Result<Vec<std::thread::JoinHandle<()>>> {
        self.finish_interrupted();
        let (tx, rx) = mpsc::channel::<JOp>();
        let rx = Arc::new(Mutex::new(rx));
        let mut hs = Vec::new();
        for i in 0..self.jobs {
            let me = self.clone();
            let rx = rx.clone();
            self.workers_live.fetch_add(1, Relaxed);
            let h = std::thread::Builder::new()
                .name(format!("drain-{i}"))
                .spawn(move || {
                    me.clone().worker(i as u32, &rx);
                    me.workers_live.fetch_sub(1, Relaxed);
                    me.parked_cv.notify_one();
                });
            match h {
                Ok(h) => hs.push(h),
                Err(e) => {
                    self.workers_live.fetch_sub(1, Relaxed);
                    return Err(e);
                }
            }
        }
        if self.batched {
            let me = self.clone();
            hs.push(
                std::thread::Builder::new()
                    .name("drain-sync".into())
                    .spawn(move || me.committer())?,
            );
        }
        let me = self.clone();
        hs.push(
            std::thread::Builder::new()
                .name("drain-dispatch".into())
                .spawn(move || me.dispatch(tx))?,
        );
        Ok(hs)
    }

    /// Applies again, before the mount serves, the row whose change to BACKING a crash may
    /// have cut short (see [`Core::mark_in_flight`]): BACKING may have the change while the
    /// namespace still has the backing paths from before it, and a read of a base there would
    /// fail until the dispatcher reached the row. One try (rows are idempotent); if it fails
    /// (BACKING away), the dispatcher applies it in its turn, as before.
    fn finish_interrupted(&self) {
        let op = match self.core.interrupted_row() {
            Ok(Some(op)) => op,
            Ok(None) => return,
            Err(e) => {
                self.note_error("reading the journal", &e);
                return;
            }
        };
        tracing::info!(
            "recovery: applying again row {} ({:?} {}), which was under way when the daemon stopped",
            op.seq,
            op.kind,
            String::from_utf8_lossy(&op.p1)
        );
        match self.apply_meta(&op) {
            Ok(()) => self.finish_row(op.seq),
            Err(e) => self.note_error(
                &format!("{:?} {}", op.kind, String::from_utf8_lossy(&op.p1)),
                &e,
            ),
        }
    }

    /// At a clean stop, once everything drained: removes the temporary files no file uses
    /// (as the dispatcher does when it goes idle), so that a fast tier removed after the stop
    /// leaves none in BACKING. Nothing while journal rows or drains are pending.
    pub fn sweep_when_settled(&self) {
        if self.core.journal_len().unwrap_or(1) == 0 && self.in_flight() == 0 {
            self.sweep_due.store(true, Relaxed);
            self.sweep_staging();
        }
    }

    /// Removes the temporary files in BACKING that no file uses any more: a staging file of
    /// a file replaced by a rename or deleted while it drained, or one that a crash left
    /// before the namespace recorded it. Runs in the dispatcher when the journal is empty and
    /// no data drain is in flight, so no worker is making one meanwhile. A file that cannot
    /// be removed (BACKING away) stays recorded for the next sweep.
    fn sweep_staging(&self) {
        if !self.sweep_due.swap(false, Relaxed) {
            return;
        }
        if self.in_flight() > 0 {
            self.sweep_due.store(true, Relaxed);
            return;
        }
        let files = match self.core.staging_files() {
            Ok(f) => f,
            Err(e) => {
                self.note_error("reading the staging files", &e);
                return;
            }
        };
        let bk = self.core.backing();
        for (path, ino) in files {
            if self.core.staged_path(ino).as_deref() == Some(path.as_slice()) {
                continue;
            }
            let gone = match bk.parent(&path) {
                Ok((d, name)) => Backing::unlink(&d, name, false),
                Err(e) => Err(e),
            };
            match gone {
                Ok(()) => tracing::debug!(
                    "removed {}: inode {ino} no longer uses it",
                    String::from_utf8_lossy(&path)
                ),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    self.note_error(&format!("removing {}", String::from_utf8_lossy(&path)), &e);
                    continue;
                }
            }
            if let Err(e) = self.core.forget_staging(&path) {
                self.note_error("forgetting a staging file", &e);
            }
        }
    }

    /// Bytes per second drained over the last few seconds.
    pub fn rate(&self) -> f64 {
        let s = self.samples.lock();
        match (s.front(), s.back()) {
            (Some(a), Some(b)) if b.0 > a.0 => {
                (b.1 - a.1) as f64 / b.0.duration_since(a.0).as_secs_f64()
            }
            _ => 0.0,
        }
    }

    fn sample(&self) {
        let mut s = self.samples.lock();
        let now = Instant::now();
        if s.back()
            .is_some_and(|b| now.duration_since(b.0) < Duration::from_millis(250))
        {
            return;
        }
        s.push_back((now, self.core.drained_bytes()));
        while s.len() > 2
            && s.front()
                .is_some_and(|f| now.duration_since(f.0) > Duration::from_secs(5))
        {
            s.pop_front();
        }
    }

    /// Data rows being drained now.
    pub fn in_flight(&self) -> usize {
        self.inflight.lock().total
    }

    fn note_error(&self, what: &str, e: &dyn std::fmt::Display) {
        let msg = format!("{what}: {e}");
        tracing::warn!("drain: {msg} (retrying)");
        self.core.set_last_error(msg);
        self.retries.fetch_add(1, Relaxed);
    }

    /// Moves `op` to the quarantine: BACKING refused it for good.
    fn quarantine(&self, op: &JOp, e: &io::Error) {
        let msg = e.to_string();
        tracing::warn!(
            "drain: {:?} {} refused by BACKING ({msg}): quarantined, the rest goes on",
            op.kind,
            String::from_utf8_lossy(&op.p1)
        );
        self.to_quarantine(op, msg);
    }

    /// Moves `op` to the quarantine behind the row it depends on, untried.
    fn hold_behind(&self, op: &JOp, on: &Refused) {
        let msg = format!("waits for {} (quarantined before it)", on.what());
        tracing::info!(
            "drain: {:?} {} {msg}: held in the quarantine behind it",
            op.kind,
            String::from_utf8_lossy(&op.p1)
        );
        self.to_quarantine(op, msg);
    }

    fn to_quarantine(&self, op: &JOp, msg: String) {
        self.refused.lock().push(Refused::of(op));
        let mut attempt = 0;
        while let Err(e) = self.core.quarantine_row(op, &msg) {
            self.note_error("quarantining a journal row", &e);
            if self.stop.load(Relaxed) {
                return;
            }
            std::thread::sleep(self.policy.backoff(attempt));
            attempt += 1;
        }
        self.core.set_last_error(format!(
            "{:?} {}: {msg} (quarantined)",
            op.kind,
            String::from_utf8_lossy(&op.p1)
        ));
    }

    /// Applies `op` with `f` until it succeeds (its row is then deleted), BACKING refuses it
    /// for good (quarantined) or the drainer stops (the row stays for the next mount); held
    /// in the quarantine untried when it depends on a quarantined row. The policy decides
    /// ([`policy::waits_for`], [`policy::after_failure`]).
    fn apply_with_retry(&self, op: &JOp, f: impl Fn(&JOp) -> io::Result<()>) {
        if self.try_until(op, f).is_some() {
            self.finish_row(op.seq);
        }
    }

    /// [`Drainer::apply_with_retry`] without deleting the row: `f`'s value once it
    /// succeeds; None when the row was quarantined or held, or the drainer stops.
    fn try_until<T>(&self, op: &JOp, f: impl Fn(&JOp) -> io::Result<T>) -> Option<T> {
        let on = policy::waits_for(op, &self.refused.lock()).cloned();
        if let Some(on) = on {
            self.hold_behind(op, &on);
            return None;
        }
        let mut tries = Tries::default();
        loop {
            let e = match f(op) {
                Ok(v) => return Some(v),
                Err(e) => e,
            };
            tries = tries.and_failed(may_heal(&e));
            let next = policy::after_failure(&tries, self.stop.load(Relaxed), &self.policy);
            if next == AfterFailure::Quarantine {
                self.quarantine(op, &e);
                return None;
            }
            self.note_error(
                &format!("{:?} {}", op.kind, String::from_utf8_lossy(&op.p1)),
                &e,
            );
            match next {
                AfterFailure::Retry(after) => std::thread::sleep(after),
                _ => return None,
            }
        }
    }

    /// Waits until the policy lets a row of `kind` (of inode `ino`) start
    /// ([`policy::may_start`]); returns the in-flight count, locked.
    /// A row that waits for parked rows (a barrier, a row of a parked file) has their
    /// batch committed at once.
    fn wait_slot(&self, kind: RowKind, ino: u64) -> MutexGuard<'_, Inflight> {
        let mut fl = self.inflight.lock();
        loop {
            let s = fl.slots(ino, self.jobs);
            if policy::may_start(kind, &s) {
                return fl;
            }
            if s.parked > 0 && (kind != RowKind::Data || s.same_file > 0) {
                self.commit_now();
            }
            self.inflight_cv.wait(&mut fl);
        }
    }

    /// The paths a row of one node that is not a directory names, for the rows that may be
    /// held ([`Drainer::run_batch`]): an unlink, a link, a rename (of a directory, or of a
    /// node gone from the namespace: a barrier, None), a regular file's attributes (`kind`:
    /// the node's kind for an attribute row).
    fn one_node_row<'o>(&self, op: &'o JOp, kind: Option<Kind>) -> Option<Vec<&'o [u8]>> {
        let one = match op.kind {
            OpKind::Unlink | OpKind::Link => true,
            OpKind::Rename => self
                .core
                .backing_attrs(op.ino)
                .is_some_and(|(k, ..)| k != Kind::Dir),
            OpKind::SetAttr => kind == Some(Kind::File),
            _ => false,
        };
        one.then(|| row_paths(op))
    }

    /// Applies the held rows from the first on while no data row in flight touches them
    /// (none waits here); false when the drainer stops.
    fn apply_ready(&self, held: &mut Vec<JOp>) -> bool {
        while let Some(op) = held.first() {
            if self.inflight.lock().touches(op.ino, &row_paths(op)) {
                return true;
            }
            let op = held.remove(0);
            self.apply_with_retry(&op, |op| self.apply_meta(op));
            if self.stop.load(Relaxed) {
                return false;
            }
        }
        true
    }

    /// Applies every held row in order, each once no data row in flight touches it (parked
    /// ones are committed at once); false when the drainer stops.
    fn flush_held(&self, held: &mut Vec<JOp>) -> bool {
        for op in held.drain(..) {
            let paths = row_paths(&op);
            {
                let mut fl = self.inflight.lock();
                while fl.touches(op.ino, &paths) {
                    if fl.parked > 0 {
                        self.commit_now();
                    }
                    self.inflight_cv.wait(&mut fl);
                }
            }
            self.apply_with_retry(&op, |op| self.apply_meta(op));
            if self.stop.load(Relaxed) {
                return false;
            }
        }
        true
    }

    /// Moves the quarantined rows back into the journal once nothing is in flight; the
    /// dispatcher then reads the journal from its start.
    fn release_stuck(&self) -> bool {
        drop(self.wait_slot(RowKind::Barrier, 0));
        match self.core.release_quarantine() {
            Ok(_) => {
                self.refused.lock().clear();
                true
            }
            Err(e) => {
                self.note_error("releasing quarantined rows", &e);
                false
            }
        }
    }

    /// The dispatcher: gathers what the policy needs ([`State`]), asks it ([`policy::choose`])
    /// and carries out its choice, until the drainer stops.
    fn dispatch(self: Arc<Self>, tx: mpsc::Sender<JOp>) {
        let cfg = self.policy;
        // The journal's cursor: rows up to it were handed on.
        let mut last = 0i64;
        // Since when journal rows have been waiting for a gap in the foreground's work.
        let mut waiting_since: Option<Instant> = None;
        // When the drain last turned urgent (after `drain`, under pressure).
        let mut urgent_at: Option<Instant> = None;
        loop {
            self.sample();
            if self.stop.load(Relaxed) {
                break;
            }
            if self.core.take_retry_request() && self.release_stuck() {
                last = 0;
            }
            let pressure = self.core.under_pressure();
            // A request is taken (cleared) only when pressure does not make the drain urgent
            // anyway: under pressure it stays for the turn after.
            let forced = !pressure && self.core.take_drain_request();
            if policy::turns_urgent(pressure, forced) {
                urgent_at = Some(Instant::now());
                if let Err(e) = self.core.queue_all_dirty() {
                    self.note_error("queueing dirty files", &e);
                }
            }
            let state = self.state(last, &mut waiting_since, urgent_at);
            match policy::choose(&state, &cfg) {
                Choice::Sleep(d) => {
                    waiting_since = None;
                    self.sweep_staging();
                    self.core.wait_for_wake(d);
                }
                Choice::Pause(d) => std::thread::sleep(d),
                Choice::Wait(d) => self.nap(d),
                Choice::Drain(_) => {
                    // Only committed rows reach BACKING: a row of a group that a `kill -9`
                    // would lose must not have been applied there.
                    let batch = self.core.committed_rows_after(last, BATCH);
                    let ops = match batch {
                        Ok(o) => o,
                        Err(e) => {
                            self.note_error("reading the journal", &e);
                            std::thread::sleep(cfg.journal_pause);
                            continue;
                        }
                    };
                    waiting_since = None;
                    match self.run_batch(ops, &tx, &mut last) {
                        Flow::Next => {}
                        Flow::Pause => std::thread::sleep(cfg.journal_pause),
                        Flow::End => return,
                    }
                }
            }
        }
    }

    /// What the policy needs to choose, measured at one `now`: the rows after `last` (since
    /// when they wait: `waiting_since`, set when they are first found), the quiet time, the
    /// time since the drain turned urgent.
    fn state(
        &self,
        last: i64,
        waiting_since: &mut Option<Instant>,
        urgent_at: Option<Instant>,
    ) -> State {
        let any = self.core.has_rows_after(last);
        let now = Instant::now();
        let backlog = match any {
            Ok(false) => Backlog::Empty,
            Ok(true) => Backlog::Rows {
                waited: now.saturating_duration_since(*waiting_since.get_or_insert(now)),
            },
            Err(e) => {
                self.note_error("reading the journal", &e);
                Backlog::Unreadable
            }
        };
        State {
            backlog,
            quiet_for: self.core.quiet_at(now),
            since_urgent: urgent_at.map(|t| now.saturating_duration_since(t)),
        }
    }

    /// Waits up to `d` for a gap in the foreground's work. It sleeps through the
    /// foreground's wake-ups meanwhile (each of its operations wakes the drainer; answering
    /// each with a journal query under the database lock cost a busy job a context switch
    /// and lock contention per operation), looking only at the signals that end the wait
    /// early ([`policy::cuts_wait`]).
    fn nap(&self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until && !policy::cuts_wait(&self.signals()) {
            std::thread::sleep(self.policy.signal_poll);
        }
    }

    /// The signals raised for the dispatcher, as they stand (none is taken).
    fn signals(&self) -> Signals {
        Signals {
            stop: self.stop.load(Relaxed),
            force: self.core.drain_requested(),
            pressure: self.core.under_pressure(),
            retry: self.core.retry_requested(),
        }
    }

    /// Hands the rows of a batch on in order, moving the cursor `last` past each: data rows
    /// to the workers (as the worker limit allows), namespace rows applied here (a barrier
    /// once nothing is in flight), rows that cancel out deleted.
    fn run_batch(&self, ops: Vec<JOp>, tx: &mpsc::Sender<JOp>, last: &mut i64) -> Flow {
        // Rows of this batch dropped with a create they cancel with.
        let mut dropped = std::collections::HashSet::new();
        // All the rows cancelled in this batch (some may lie beyond it): deleted in one
        // transaction once the batch is done, before the next is read. A crash before that
        // leaves them in the journal, to be applied by the next mount (a create and its
        // unlink: harmless).
        let mut cancelled = Vec::new();
        // Directories' attribute rows put off to the next barrier or the batch's end
        // (`defer_dir_attrs`).
        let mut deferred: Vec<JOp> = Vec::new();
        // Rows of one node that is not a directory (an unlink, link or rename of it, its
        // attributes) that wait for a data row in flight (their node's, or one writing a
        // path they name) or for an earlier such row: put aside in journal order and applied
        // once what they wait for is done (`apply_ready`, `flush_held`), while the rows after
        // them that touch none of their nodes and paths go on. As barriers, each of the link
        // and unlink rows of `git`'s object writes, and each file's times `tar` set after
        // writing it, committed the batch of files being synced: the drain of a tree synced
        // BACKING once per file.
        let mut held: Vec<JOp> = Vec::new();
        for op in ops {
            *last = op.seq;
            if dropped.remove(&op.seq) {
                continue;
            }
            if !self.apply_ready(&mut held) {
                return Flow::End;
            }
            if op.kind == OpKind::Create {
                if let Some(seqs) = self.cancel(&op) {
                    dropped.extend(seqs.iter().copied());
                    cancelled.extend(seqs);
                    continue;
                }
            }
            if op.kind == OpKind::Data {
                let mut names = vec![op.p1.clone()];
                names.extend(
                    op.p2
                        .split(|b| *b == 0)
                        .filter(|n| !n.is_empty())
                        .map(<[u8]>::to_vec),
                );
                let refs: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
                if held_touch(&held, op.ino, &refs) && !self.flush_held(&mut held) {
                    return Flow::End;
                }
                let mut fl = self.wait_slot(RowKind::Data, op.ino);
                fl.total += 1;
                *fl.per_ino.entry(op.ino).or_default() += 1;
                fl.names.insert(op.ino, names);
                drop(fl);
                if tx.send(op).is_err() {
                    return Flow::End;
                }
                continue;
            }
            let kind = match op.kind {
                OpKind::SetAttr => self.core.backing_attrs(op.ino).map(|a| a.0),
                _ => None,
            };
            if let Some(paths) = self.one_node_row(&op, kind) {
                if held_touch(&held, op.ino, &paths) || self.inflight.lock().touches(op.ino, &paths)
                {
                    held.push(op);
                    continue;
                }
            } else if kind == Some(Kind::Dir) && self.defer_dir_attrs {
                deferred.push(op);
                continue;
            } else if op.kind.is_barrier() {
                if !self.flush_held(&mut held) || !self.apply_deferred(&mut deferred) {
                    return Flow::End;
                }
                drop(self.wait_slot(RowKind::Barrier, op.ino));
            } else if held_touch(&held, op.ino, &[&op.p1, &op.p2]) && !self.flush_held(&mut held) {
                return Flow::End;
            }
            self.apply_with_retry(&op, |op| self.apply_meta(op));
            if self.stop.load(Relaxed) {
                return Flow::End;
            }
        }
        if !self.flush_held(&mut held) || !self.apply_deferred(&mut deferred) {
            return Flow::End;
        }
        if !self.drop_cancelled(&cancelled) {
            // They stay in the journal: read it from its start again (they are cancelled
            // again, or applied if their file came back), after a pause.
            *last = 0;
            return Flow::Pause;
        }
        Flow::Next
    }

    /// Applies the attribute rows put off (`deferred`, in journal order) once no data row is
    /// in flight, and empties it; false when the drainer stops.
    ///
    /// Such a row sets a directory's or a file's mode, owner and times to what the namespace
    /// holds when it is applied, so applying it later gives BACKING the same node (a
    /// directory's times even after the names that later rows add to it; a file's after a
    /// later drain of its data, which sets them too); as a barrier in its place, each of the
    /// directories of a `tar` (which sets each directory's times once its contents are
    /// written) emptied the drain's pipeline, and with it the batch of files being synced; a
    /// file's, waiting for its own data row, committed that batch at once. A directory's is
    /// put off only while the drain may write into any directory whatever its mode (run as
    /// root: `defer_dir_attrs`), a file's only while its data row is in flight; never past a
    /// barrier (which may move or remove the node: a rename, unlink or link of a file is
    /// one), and retired only once applied: a crash before that leaves them in the journal,
    /// applied again by the next mount.
    fn apply_deferred(&self, deferred: &mut Vec<JOp>) -> bool {
        if deferred.is_empty() {
            return true;
        }
        drop(self.wait_slot(RowKind::Barrier, 0));
        for op in deferred.drain(..) {
            self.apply_with_retry(&op, |op| self.apply_meta(op));
            if self.stop.load(Relaxed) {
                return false;
            }
        }
        true
    }

    /// Deletes the journal rows `seqs` (cancelled: they never reach BACKING), in one
    /// transaction; false when that failed (they stay; logged).
    fn drop_cancelled(&self, seqs: &[i64]) -> bool {
        if seqs.is_empty() {
            return true;
        }
        // Counted before the rows go: a `status` that finds the journal empty (`drain
        // --wait` returns on it) finds them counted.
        let n = seqs.len() as u64;
        self.cancelled_rows.fetch_add(n, Relaxed);
        let r = self.core.delete_rows(seqs);
        match r {
            Ok(()) => true,
            Err(e) => {
                self.cancelled_rows.fetch_sub(n, Relaxed);
                self.note_error("dropping cancelled journal rows", &e);
                false
            }
        }
    }

    /// The rows of `create` and those that cancel with it (see [`cancels`]) when its file is
    /// gone now: none of them is to be applied (the caller deletes them).
    fn cancel(&self, create: &JOp) -> Option<Vec<i64>> {
        if !self.core.unlinked(create.ino) {
            return None;
        }
        let later = self.core.rows_of(create.ino, create.seq).ok()?;
        cancels(create, &later)
    }

    fn finish_row(&self, seq: i64) {
        let mut attempt = 0;
        while let Err(e) = self.core.delete_row(seq) {
            self.note_error("deleting a journal row", &e);
            std::thread::sleep(self.policy.backoff(attempt));
            attempt += 1;
        }
    }

    fn worker(self: Arc<Self>, w: u32, rx: &Mutex<mpsc::Receiver<JOp>>) {
        // The site-wide slot this worker holds, kept while files come back to back.
        let mut permit: Option<slots::Permit> = None;
        loop {
            // Work ready now, taken without waiting, keeps the slot; before any wait (for
            // work, or for the queue another worker holds) the slot goes to whoever waits:
            // a slot held while waiting on the queue could be the one the worker that holds
            // the queue's next row needs.
            let ready = rx.try_lock().and_then(|r| match r.try_recv() {
                Ok(op) => Some(Ok(op)),
                Err(mpsc::TryRecvError::Disconnected) => Some(Err(())),
                Err(mpsc::TryRecvError::Empty) => None,
            });
            let op = match ready {
                Some(Ok(op)) => op,
                Some(Err(())) => return,
                None => {
                    permit = None;
                    match rx.lock().recv() {
                        Ok(op) => op,
                        Err(_) => return,
                    }
                }
            };
            if let Some(slots) = &self.slots {
                if let Some(p) = permit.as_mut().filter(|p| p.turn_over()) {
                    if slots.others_wait() {
                        permit = None;
                        std::thread::sleep(slots.yield_pause());
                    } else {
                        p.renew();
                    }
                }
                if permit.is_none() {
                    permit = slots.acquire(w, &self.stop);
                }
            }
            if self.batched {
                // Written, then parked for the committer: the row stays in flight until its
                // batch is durable and retired (`batch.rs`).
                match self.try_until(&op, |op| self.write_file(op)) {
                    Some(Some(w)) => {
                        self.park(w);
                        continue;
                    }
                    Some(None) => self.finish_row(op.seq),
                    None => {}
                }
            } else {
                self.apply_with_retry(&op, |op| self.drain_file(op));
            }
            let mut fl = self.inflight.lock();
            fl.release(op.ino);
            self.inflight_cv.notify_all();
        }
    }

    /// Whether nothing waits: no journal rows, no dirty file, nothing in flight.
    pub fn idle(&self) -> bool {
        let ops = self.core.journal_len().unwrap_or(1);
        ops == 0 && self.in_flight() == 0 && self.core.dirty_summary().0 == 0
    }

    /// Whether nothing waits but what is quarantined: no journal rows, nothing in flight,
    /// and every dirty file one whose drain is quarantined.
    pub fn settled(&self) -> bool {
        let ops = self.core.journal_len().unwrap_or(1);
        ops == 0 && self.in_flight() == 0 && self.core.unsettled_dirty_files() == 0
    }
}

/// Journal rows read at once.
const BATCH: usize = 1024;

/// How the dispatcher goes on after a batch.
enum Flow {
    /// With the next choice.
    Next,
    /// After a pause (the journal failed; the cursor is back at its start).
    Pause,
    /// Not at all: the drainer stops.
    End,
}

/// The rows that cancel out with `create` given the rows of its inode after it (`later`,
/// in order): a regular file created and unlinked again before either reached BACKING, with
/// only its own attribute, xattr and data rows between (no link or rename: its path is the
/// one it was created at). None of them needs to touch BACKING: nothing was created there,
/// nothing staged (its data rows come after its create). None when they do not cancel.
fn cancels(create: &JOp, later: &[JOp]) -> Option<Vec<i64>> {
    let mut own = vec![create.seq];
    for o in later {
        match o.kind {
            OpKind::Data | OpKind::SetAttr | OpKind::Xattr => own.push(o.seq),
            OpKind::Unlink if o.p1 == create.p1 => {
                own.push(o.seq);
                return Some(own);
            }
            _ => return None,
        }
    }
    None
}

/// The path of the drainer's staging file for inode `ino` in directory `dir`.
pub fn tmp_path(dir: &Path, ino: u64) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    dir.join(std::ffi::OsStr::from_bytes(&tmp_name(ino, "")))
}

/// A journal row for the drain's tests: `kind` of inode `ino` at `p1`.
/// Whether a held row is of node `ino` or names one of `paths`.
fn held_touch(held: &[JOp], ino: u64, paths: &[&[u8]]) -> bool {
    held.iter().any(|h| {
        h.ino == ino
            || row_paths(h)
                .iter()
                .any(|p| !p.is_empty() && paths.contains(p))
    })
}

/// The paths in BACKING a namespace row names: its path, and the second one of a link or a
/// rename.
fn row_paths(op: &JOp) -> Vec<&[u8]> {
    match op.kind {
        OpKind::Link | OpKind::Rename => vec![&op.p1, &op.p2],
        _ => vec![&op.p1],
    }
}

#[cfg(test)]
pub(crate) fn test_op(seq: i64, kind: OpKind, ino: u64, p1: &str) -> JOp {
    JOp {
        seq,
        kind,
        ino,
        p1: p1.as_bytes().to_vec(),
        p2: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::test_op as op;

    #[test]
    fn a_create_and_its_unlink_cancel() {
        use OpKind::*;
        let c = op(1, Create, 10, "a");
        // Created, written, its times set, removed: nothing reaches BACKING.
        let later = [
            op(3, SetAttr, 10, "a"),
            op(4, Data, 10, "a"),
            op(6, Unlink, 10, "a"),
        ];
        assert_eq!(cancels(&c, &later), Some(vec![1, 3, 4, 6]));
        // Renamed or linked in between: its create must be replayed.
        let later = [op(3, Rename, 10, "a"), op(6, Unlink, 10, "b")];
        assert_eq!(cancels(&c, &later), None);
        let later = [op(3, Link, 10, "a"), op(6, Unlink, 10, "a")];
        assert_eq!(cancels(&c, &later), None);
        // Not removed (yet), or removed under another path: nothing cancels.
        assert_eq!(cancels(&c, &[op(3, Data, 10, "a")]), None);
        assert_eq!(cancels(&c, &[op(6, Unlink, 10, "x")]), None);
    }

    #[test]
    fn rate_limit_paces_bytes() {
        let r = RateLimit::new(10_000_000);
        let t0 = Instant::now();
        for _ in 0..10 {
            r.take(1_000_000);
        }
        // 10 MB at 10 MB/s with a 2.5 MB burst: at least 0.7 s.
        assert!(
            t0.elapsed() >= Duration::from_millis(700),
            "{:?}",
            t0.elapsed()
        );
    }
}
