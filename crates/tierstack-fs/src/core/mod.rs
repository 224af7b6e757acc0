//! The file system's state: the namespace (in memory, written through to the journal
//! database), file contents (pages in the tiered store over a base file in BACKING), space
//! accounting and backpressure.
//!
//! [`Core`] is the only way in: it has no public field, and neither have the state types
//! it holds ([`Node`], [`Ns`], [`FileData`], [`Page`]). Outside this module the state is
//! reached only through `Core`'s methods, each named for what its caller means and doing
//! its locked work inside (the lock order below is kept here, in one place).
//!
//! The parts, by job:
//!
//! * this file: [`Core`] itself (construction, loading the namespace from the journal) and
//!   the helpers every part shares (paths, attributes, journal write-through);
//! * `node`: the in-memory namespace types ([`Kind`], [`Node`], [`Ns`], [`Attr`]) and the
//!   name checks;
//! * `namespace`: the namespace operations (lookup, mkdir, create, mknod, symlink, link,
//!   unlink, rename, setattr, xattrs, readdir, open/release) and the set-ID rules;
//! * `data`: file contents ([`FileData`], pages in the store over a base file in BACKING):
//!   read, write, truncate;
//! * `space`: space accounting and backpressure, dropping clean pages, `fsync`, the
//!   background loop and the dirty summaries;
//! * `signals`: the flags the daemon's threads raise for one another (drain requests,
//!   pressure and the drainer's wake-up, the stop, io_uring, polling, conditioning);
//! * `status`: the status figures ([`Figures`]), the last error, and the handles the daemon
//!   uses directly (array, store, BACKING, operation counters);
//! * `journal`: the journal's rows as the drainer reads and deletes them, the quarantine;
//! * `drain_pass`: a file's drain pass ([`DrainPass`]: begin, read the dirty pages, finish);
//! * `adopt`: a local copy taken in as the clean cache of a file in BACKING (`adopt` on the
//!   control socket; the decision, [`adopt::decide`], is pure);
//! * `bpaths`: what namespace rows need in BACKING (attributes, xattrs, backing paths,
//!   staging files) and the bases pinned before BACKING's copy goes.
//!
//! Lock order: `ns` -> a file's `FileData` -> `db`. Writers never hold a lock while they wait
//! for space. The flags' locks (`wake_lock`, `last_error`, `stuck_inos`) and the queue of
//! journal work (`later`, see [`Core::tx_later`]) are taken alone or last.
//!
//! Journal order: a namespace operation changes `ns` and queues its journal work under one
//! hold of `ns` ([`Core::tx_later`]); whoever takes `db` ([`Core::lock_db`]) first runs the
//! queue, so the journal's rows are in the order of the changes, and every reader of the
//! database (the drainer, `fsync`, the committer) sees all of the changes made before it.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use tierstack_array::Array;
use tierstack_ioproto::vers::Versions;
use tierstack_store::{TieredStore, MAX_OBJECT_ID};

use crate::backing::Backing;
use crate::db::{self, Db, InodeRow, OpKind};
use crate::error::{FsError, Result};

pub mod adopt;
mod bpaths;
mod data;
mod drain_pass;
pub mod extents;
mod journal;
mod namespace;
mod node;
mod pindex;
mod signals;
mod space;
mod status;

pub use bpaths::Holders;
pub use data::{FileData, Page};
pub use drain_pass::{DirtyPage, DrainPass, Drained};
pub use namespace::STALE_NS;
pub use node::{check_name, rdev_of, Attr, Counts, Kind, Node, Ns, Seen, NAME_MAX};
pub use space::{default_drive_size, drive_size_within, hold_limit};
pub use status::Figures;

pub use crate::attr::PAGE;

/// Prefix of the drainer's temporary files in BACKING (hidden from the mount).
pub const TMP_PREFIX: &[u8] = b".tierstack-tmp.";

/// Names in BACKING that a listing leaves out: the drainer's staging files ([`TMP_PREFIX`])
/// and the stager's temporary copies (`.NAME.tierstack-stage-PID-N`, renamed into place when
/// complete): another node's copy being written into a shared folder would otherwise show,
/// and stay, in this mount (it does not pick up names others remove).
pub fn transient_name(name: &[u8]) -> bool {
    const STAGE: &[u8] = b".tierstack-stage-";
    name.starts_with(TMP_PREFIX)
        || (name.starts_with(b".") && name.windows(STAGE.len()).any(|w| w == STAGE))
}

/// The inode number of the mount's root directory (BACKING itself).
pub const ROOT: u64 = 1;

/// An errno for the FUSE layer.
pub type Errno = i32;

/// The result of an operation the FUSE layer serves: the value or an errno.
pub type R<T> = std::result::Result<T, Errno>;

/// The time now, in nanoseconds since the epoch (0 if the clock is before it).
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

fn ns_of(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

/// The relative path of `name` in directory `dir` (empty `dir`: the root, so just `name`).
pub fn join_rel(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        let mut p = dir.to_vec();
        p.push(b'/');
        p.extend_from_slice(name);
        p
    }
}

/// Whether path `p` is `root` or lies under it (whole components).
pub fn under(p: &[u8], root: &[u8]) -> bool {
    p == root || (p.len() > root.len() && p.starts_with(root) && p[root.len()] == b'/')
}

/// Where path `p` is after `from` was renamed to `to` (None: `p` is not under `from`).
pub fn moved(p: &[u8], from: &[u8], to: &[u8]) -> Option<Vec<u8>> {
    under(p, from).then(|| {
        let mut n = to.to_vec();
        n.extend_from_slice(&p[from.len()..]);
        n
    })
}

/// The errno of a failed operation: ENOSPC when the fast tier is full (waiting for the drain
/// did not make room), EIO for everything else; logged either way.
fn eio<E: std::fmt::Display + 'static>(e: E) -> Errno {
    let full = (&e as &dyn std::any::Any)
        .downcast_ref::<FsError>()
        .is_some_and(FsError::is_full);
    if full {
        tracing::warn!("{e}");
        libc::ENOSPC
    } else {
        tracing::error!("{e}");
        libc::EIO
    }
}

/// The file system's state, as the FUSE layer, the drainer and the daemon use it: only
/// through its methods (no field is public; see the module's notes for the groups and the
/// lock order).
pub struct Core {
    /// The backing directory's path.
    backing: PathBuf,
    /// BACKING held open: every access to it goes through directory handles.
    bk: Backing,
    /// `--mode sync`: `fsync` makes data durable in the fast tier (false: `--mode async`,
    /// `fsync` returns once the data is in the store's DRAM).
    sync_mode: bool,
    /// The tiered store holding file pages (the fast tier).
    store: TieredStore,
    /// The array under the store.
    array: Arc<Array>,
    /// The in-memory namespace.
    ns: Mutex<Ns>,
    /// The SQLite namespace journal and inode table.
    db: Mutex<Db>,
    /// A second connection to it for `status` (made on first use; see `journal_backlog`).
    reader: Mutex<Option<crate::db::DbReader>>,
    /// Raised by `db` while its group transaction is open ([`Db::uncommitted_flag`]).
    uncommitted: Arc<AtomicBool>,
    /// Bytes of file pages held in the store.
    held: AtomicU64,
    /// Bytes of dirty pages.
    dirty_bytes: AtomicU64,
    /// Above this many held bytes writers wait for the drainer.
    limit: u64,
    space_lock: Mutex<()>,
    space_cv: Condvar,
    /// Wake-ups of the drainer so far; the dispatcher waits on `wake_cv` under this lock.
    wake_lock: Mutex<u64>,
    /// Signalled by [`Core::wake_drainer`].
    wake_cv: Condvar,
    /// Journal work of namespace operations not yet run on the database, in the order the
    /// operations changed the namespace (see [`Core::tx_later`]); run by the next holder of
    /// `db` before anything else ([`Core::lock_db`]).
    later: Mutex<Queue>,
    /// A queued operation's journal work failed: operations run theirs at once again, so
    /// that a failure reaches the caller as EIO.
    later_failed: AtomicBool,
    /// Raised when a group transaction opens; the committer waits on it (see `tx`).
    group_open: Mutex<bool>,
    group_cv: Condvar,
    /// Writers are waiting for space.
    pressure: AtomicBool,
    /// `tierstack drain` asked for every dirty file to be drained now.
    force: AtomicBool,
    /// When the foreground last changed something (a namespace transaction or a write), in
    /// nanoseconds since `epoch`: the drainer waits for a gap in this work (see
    /// `drain::policy::DRAIN_QUIET`).
    activity: AtomicU64,
    epoch: std::time::Instant,
    /// Bytes of file contents written to BACKING by the drainer since the mount started.
    drained_bytes: AtomicU64,
    /// The last error the drainer met (shown by `status`), if any.
    last_error: Mutex<Option<String>>,
    /// Group commit of `fsync` in sync mode: `fsync` calls so far, and how many of them the
    /// last completed flush covered (it started after they arrived). `sync_lock` is held
    /// while a flush runs.
    sync_arrived: AtomicU64,
    sync_covered: AtomicU64,
    sync_lock: Mutex<()>,
    /// Sync mode's intent log (`crate::intent`): small `fsync`s are made durable there.
    intent: Option<crate::intent::IntentLog>,
    /// Bumped when a full flush starts: writes noted under an older value are covered by it.
    flush_gen: AtomicU64,
    /// Bytes written since the last full flush by files whose changes outgrew an intent
    /// record: their `fsync` flushes everything, so background write-back starts early for
    /// them (large streams) instead of waiting for half the DRAM tier.
    unloggable: AtomicU64,
    /// Log commits hold it shared, a full flush (which voids the log) exclusively.
    flush_rw: parking_lot::RwLock<()>,
    /// Namespace commits so far, and how many of them the last durable point covered.
    db_commits: AtomicU64,
    db_durable: AtomicU64,
    /// `fsync`s made durable in the intent log, and by a full flush.
    fsync_logged: AtomicU64,
    /// `fsync`s made durable by a full flush.
    fsync_flushed: AtomicU64,
    /// Intent log records this mount replayed at its start (after a crash).
    intent_replayed: AtomicU64,
    /// The daemon is stopping: background threads end.
    stopping: AtomicBool,
    /// A FUSE thread polls the device now (`crate::poll`).
    polling: AtomicBool,
    /// The kernel's io_uring queues carry the mount's requests (`crate::uring`): nothing
    /// comes through `/dev/fuse` worth polling for.
    uring: AtomicBool,
    /// Milliseconds a FUSE thread spent polling the device since the mount started.
    polled_ms: AtomicU64,
    /// Calls served to interception clients, and clients connected (`crate::io`).
    io_calls: AtomicU64,
    io_clients: AtomicU64,
    /// The fast tier's conditioning has nothing left to do (`mount::condition_when_idle`).
    conditioned: AtomicBool,
    /// Inodes with a quarantined journal row (their dirty data stays in the fast tier).
    stuck_inos: Mutex<std::collections::HashSet<u64>>,
    /// The rename the drainer is making in BACKING (from, to), from before BACKING changes
    /// until the backing paths follow it: a base opened meanwhile at its old path is looked
    /// for at its new one (`base_file`). A leaf lock.
    moving: Mutex<Option<(Vec<u8>, Vec<u8>)>>,
    /// `tierstack drain --retry` asked for the quarantined rows to be tried again.
    retry: AtomicBool,
    /// `tierstack umount --force`: stop without waiting for the drain (the journal keeps
    /// what is left for the next mount).
    force_stop: AtomicBool,
    /// The intent log is being replayed (in `new`, before any drainer runs): writes do not
    /// wait for space (none would be freed), and a full store is an error, not a wait.
    replaying: AtomicBool,
    /// Counts and latencies of the FUSE operations served.
    ops: crate::opstats::OpStats,
    /// Which nodes the kernel may hold (FUSE lookup counts).
    kernel_refs: crate::kernel_refs::KernelRefs,
    /// How often (ns) a loaded directory's folder in BACKING is looked at again for other
    /// writers' names (0: never; see `refresh_dir`).
    coherence_ns: std::sync::atomic::AtomicI64,
    /// The generation of every node but the root ([`Db::generation`]): kept by the fast
    /// tier's database, so a file handle (inode, generation) outlives a daemon restart.
    generation: u32,
    /// The change counters shared with the interception client (`tierstack_ioproto::vers`)
    /// and the descriptor handed to each client; None if the memfd could not be made (the
    /// clients then keep nothing).
    vers: Option<(Arc<Versions>, std::os::fd::OwnedFd)>,
    /// The base files held open ([`data::BaseFds`]).
    base_fds: data::BaseFds,
}

/// The longest a namespace operation waits in an open group transaction before the group is
/// committed (see [`Core::tx`]).
pub const GROUP_COMMIT: std::time::Duration = std::time::Duration::from_millis(2);

/// Queued journal work ([`Core::tx_later`]) waits for a gap in the foreground's work this
/// long before the committer runs it ([`journal_due`]) ...
pub const JOURNAL_QUIET: std::time::Duration = std::time::Duration::from_millis(5);
/// ... or until its oldest piece has waited this long (a `kill -9` of the daemon loses at
/// most this much of the namespace changes not made durable; ext4 commits its journal every
/// 5 s) ...
pub const JOURNAL_MAX_DEFER: std::time::Duration = std::time::Duration::from_secs(1);
/// ... or until this many pieces are queued (the memory they hold, and the time a caller of
/// [`Core::lock_db`] spends running them first: about 5 µs a piece).
pub const JOURNAL_MAX_QUEUED: usize = 16_384;

/// Whether the committer runs the queued journal work now: `queued` pieces, the oldest
/// queued `oldest` ago, the foreground quiet for `quiet`. The work is the journal's SQLite
/// statements (about 5 µs for each create, release and unlink in one savepoint, 8-9 µs
/// each in its own): run while the foreground is busy, it takes a CPU from the program or
/// the daemon thread answering it (on two vCPUs, a create loop under the client at 26-27k/s
/// against 38-39k/s with it run in the gaps, docs/BENCHMARKS.md). Nothing waits for it: whoever needs the database (`fsync`,
/// the drainer, an operation run at once) runs the queue first ([`Core::lock_db`]).
pub fn journal_due(queued: usize, oldest: std::time::Duration, quiet: std::time::Duration) -> bool {
    queued > 0
        && (queued >= JOURNAL_MAX_QUEUED || oldest >= JOURNAL_MAX_DEFER || quiet >= JOURNAL_QUIET)
}

/// In sync mode, dirty DRAM pages are written to the array in the background once this many
/// bytes are dirty, so an `fsync` finds little left to write.
pub const WRITE_BACK_START: u64 = 32 << 20;

/// One name of a node: (directory inode, name).
pub type Link = (u64, Vec<u8>);

impl Core {
    /// Opens the namespace from the database (creating the root from BACKING if new) and
    /// reconciles it with the pages the array holds after a restart.
    /// The core of a mount; `intent`: the fast tier's intent log and the records it held
    /// (replayed here, after the namespace is loaded, then voided by a full flush). The log
    /// is kept for `fsync` in sync mode only.
    pub fn new(
        backing: PathBuf,
        sync_mode: bool,
        store: TieredStore,
        array: Arc<Array>,
        db: Db,
        limit: u64,
        intent: Option<(crate::intent::IntentLog, Vec<crate::intent::Record>)>,
    ) -> Result<Core> {
        let bk = Backing::open(&backing).map_err(crate::error::io_err(&backing))?;
        let generation = db.generation()?;
        let mut core = Core {
            backing,
            bk,
            sync_mode,
            store,
            array,
            ns: Mutex::new(Ns::default()),
            uncommitted: db.uncommitted_flag(),
            db: Mutex::new(db),
            reader: Mutex::new(None),
            held: AtomicU64::new(0),
            dirty_bytes: AtomicU64::new(0),
            limit,
            space_lock: Mutex::new(()),
            space_cv: Condvar::new(),
            wake_lock: Mutex::new(0),
            wake_cv: Condvar::new(),
            later: Mutex::new(Queue::default()),
            later_failed: AtomicBool::new(false),
            group_open: Mutex::new(false),
            group_cv: Condvar::new(),
            pressure: AtomicBool::new(false),
            force: AtomicBool::new(false),
            activity: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            drained_bytes: AtomicU64::new(0),
            last_error: Mutex::new(None),
            sync_arrived: AtomicU64::new(0),
            sync_covered: AtomicU64::new(0),
            sync_lock: Mutex::new(()),
            intent: None,
            flush_gen: AtomicU64::new(1),
            unloggable: AtomicU64::new(0),
            flush_rw: parking_lot::RwLock::new(()),
            db_commits: AtomicU64::new(0),
            db_durable: AtomicU64::new(0),
            fsync_logged: AtomicU64::new(0),
            fsync_flushed: AtomicU64::new(0),
            intent_replayed: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            polling: AtomicBool::new(false),
            uring: AtomicBool::new(false),
            polled_ms: AtomicU64::new(0),
            io_calls: AtomicU64::new(0),
            io_clients: AtomicU64::new(0),
            conditioned: AtomicBool::new(false),
            stuck_inos: Mutex::new(Default::default()),
            moving: Mutex::new(None),
            retry: AtomicBool::new(false),
            force_stop: AtomicBool::new(false),
            replaying: AtomicBool::new(false),
            ops: Default::default(),
            kernel_refs: Default::default(),
            coherence_ns: std::sync::atomic::AtomicI64::new(0),
            generation,
            base_fds: data::BaseFds::for_process(),
            vers: match Versions::create() {
                Ok((v, fd)) => Some((Arc::new(v), fd)),
                Err(e) => {
                    tracing::warn!("no change counters for the interception client: {e}");
                    None
                }
            },
        };
        core.ns.get_mut().vers = core.vers.as_ref().map(|(v, _)| v.clone());
        // A new mount tries the rows an earlier one quarantined again.
        core.lock_db().release_stuck()?;
        core.load()?;
        if let Some((log, records)) = intent {
            core.intent = Some(log);
            if !records.is_empty() {
                core.replaying.store(true, Relaxed);
                let r = core.replay_intent(&records);
                core.replaying.store(false, Relaxed);
                r?;
            }
            if !sync_mode {
                core.intent = None;
            }
        }
        Ok(core)
    }

    fn load(&self) -> Result<()> {
        let (rows, dents, xattrs) = {
            let db = self.lock_db();
            (db.load_inodes()?, db.load_dentries()?, db.load_xattrs()?)
        };
        let mut ns = self.ns.lock();
        let mut max_ino = ROOT;
        let mut max_obj = 0;
        // Files whose staging file a drain renamed into place just before the daemon stopped,
        // before the journal recorded it (see `staged_renamed`).
        let mut renamed: Vec<(u64, Vec<u8>)> = Vec::new();
        for r in &rows {
            max_ino = max_ino.max(r.ino);
            max_obj = max_obj.max(r.obj);
            let kind = Kind::from_u8(r.kind);
            let (staged, base_len) = match &r.staged {
                Some(sp) if kind == Kind::File => match self.staged_renamed(r, sp) {
                    Some(len) => {
                        renamed.push((r.ino, sp.clone()));
                        (None, r.base_len.min(len))
                    }
                    None => (Some(sp.clone()), r.base_len),
                },
                s => (s.clone(), r.base_len),
            };
            let data = (kind == Kind::File).then(|| {
                Arc::new(Mutex::new(FileData {
                    size: r.size,
                    has_base: r.has_base,
                    base_len,
                    bpath: r.bpath.clone(),
                    dirty: r.dirty,
                    staged: staged.clone(),
                    base_blocks: r.base_len.div_ceil(512),
                    min_size: r.size,
                    extents: r.extents.as_deref().and_then(extents::Extents::decode),
                    ..Default::default()
                }))
            });
            for p in [&r.bpath, &staged].into_iter().flatten() {
                ns.paths.note(p, r.ino);
            }
            ns.nodes.insert(
                r.ino,
                Node {
                    kind,
                    mode: r.mode,
                    uid: r.uid,
                    gid: r.gid,
                    atime: r.atime,
                    mtime: r.mtime,
                    ctime: r.ctime,
                    size: r.size,
                    target: r.target.clone().unwrap_or_default(),
                    links: Vec::new(),
                    obj: r.obj,
                    bpath: r.bpath.clone(),
                    loaded: r.loaded,
                    children: BTreeMap::new(),
                    subdirs: 0,
                    listed_nlink: 0,
                    xattrs: BTreeMap::new(),
                    open: 0,
                    open_w: 0,
                    direct_mtime: 0,
                    direct_opened: 0,
                    direct_first: 0,
                    kernel_stale: false,
                    data,
                },
            );
        }
        for (ino, name, value) in xattrs {
            if let Some(n) = ns.nodes.get_mut(&ino) {
                n.xattrs.insert(name, value);
            }
        }
        for (parent, name, ino) in dents {
            if !ns.nodes.contains_key(&parent) {
                continue;
            }
            if let Some(n) = ns.nodes.get_mut(&ino) {
                n.links.push((parent, name.clone()));
            } else {
                continue;
            }
            ns.insert_child(parent, name, ino);
        }
        #[allow(clippy::map_entry)]
        if !ns.nodes.contains_key(&ROOT) {
            let md =
                std::fs::metadata(&self.backing).map_err(crate::error::io_err(&self.backing))?;
            let now = now_ns();
            let root = Node {
                kind: Kind::Dir,
                mode: md.mode() & 0o7777,
                uid: md.uid(),
                gid: md.gid(),
                atime: now,
                mtime: md.mtime() * 1_000_000_000 + md.mtime_nsec(),
                ctime: now,
                size: 4096,
                target: Vec::new(),
                links: Vec::new(),
                obj: 0,
                bpath: Some(Vec::new()),
                loaded: false,
                children: BTreeMap::new(),
                subdirs: 0,
                listed_nlink: 0,
                xattrs: BTreeMap::new(),
                open: 0,
                open_w: 0,
                direct_mtime: 0,
                direct_opened: 0,
                direct_first: 0,
                kernel_stale: false,
                data: None,
            };
            let row = row_of(ROOT, &root, None);
            self.tx(|tx| db::put_inode(tx, &row))?;
            ns.paths.note(b"", ROOT);
            ns.nodes.insert(ROOT, root);
        }
        for (ino, sp) in &renamed {
            let d = ns.nodes.get(ino).and_then(|n| n.data.clone());
            if let Some(d) = d {
                self.persist_content(*ino, &d.lock())?;
            }
            self.lock_db().staging_del(sp)?;
            tracing::warn!(
                "recovery: inode {ino}: its staging file {} was renamed into place before the daemon stopped; its base is its own path",
                String::from_utf8_lossy(sp)
            );
        }
        // Orphans (unlinked while open when the daemon stopped) are dropped.
        let orphans: Vec<u64> = ns
            .nodes
            .iter()
            .filter(|(i, n)| **i != ROOT && n.links.is_empty())
            .map(|(i, _)| *i)
            .collect();
        if !orphans.is_empty() {
            self.tx(|tx| {
                for i in &orphans {
                    db::del_inode(tx, *i)?;
                }
                Ok(())
            })?;
            for i in &orphans {
                ns.nodes.remove(i);
            }
        }
        // A number handed out before is never handed out again (file handles name nodes by
        // number and generation; see `Db::generation`).
        let reserved = self.lock_db().ino_next()?;
        ns.next_ino = (max_ino + 1).max(reserved);
        ns.ino_reserved = reserved;
        ns.next_obj = max_obj + 1;
        // Pages the array holds: those of live files (within their size) are their contents;
        // everything else is garbage of files deleted before a crash.
        let mut by_obj: HashMap<u64, Arc<Mutex<FileData>>> = HashMap::new();
        for n in ns.nodes.values() {
            if let Some(d) = &n.data {
                by_obj.insert(n.obj, d.clone());
            }
        }
        // Whether the last daemon stopped cleanly (its files' allocation recorded at exit).
        let clean = {
            let db = self.lock_db();
            let c = db.meta_get("clean")?.is_some_and(|v| v == b"1");
            db.meta_set("clean", b"0")?;
            c
        };
        let keys = self.array.keys_in(0, MAX_OBJECT_ID - 1);
        let mut garbage = 0;
        for k in keys {
            let mut len = self.array.value_len(k).unwrap_or(0) as u64;
            if let Some(d) = by_obj.get(&k.0) {
                let mut f = d.lock();
                if k.1 * PAGE < f.size {
                    // The page may be older than the file's size (a truncation the journal
                    // kept while the shortened page was only in DRAM): its bytes past the
                    // size are not the file's and would show when it grows again.
                    let keep = f.size - k.1 * PAGE;
                    if len > keep {
                        if let Some(v) = self.store.get_shared(k)? {
                            self.store
                                .put_owned(k, v[..(keep as usize).min(v.len())].to_vec())?;
                        }
                        len = keep;
                    }
                    // After a crash the journal may be behind the array: a page written back
                    // just before the daemon died can be newer than BACKING while its file's
                    // row still says clean, and the recorded allocation may miss the last
                    // writes. Every page held then counts as changed (the drain makes BACKING
                    // what the mount shows) and allocated whole (never a hole where data
                    // may be).
                    if !clean {
                        f.dirty = true;
                    }
                    let dirty = f.dirty;
                    if !clean {
                        if let Some(e) = f.extents.as_mut() {
                            e.add(k.1 * PAGE, k.1 * PAGE + len);
                        }
                    }
                    f.pages.insert(
                        k.1,
                        Page {
                            ver: 0,
                            dirty,
                            len: len as u32,
                        },
                    );
                    self.held.fetch_add(space::footprint(len), Relaxed);
                    if dirty {
                        self.dirty_bytes.fetch_add(len, Relaxed);
                    }
                    continue;
                }
            }
            self.store.remove(k)?;
            garbage += 1;
        }
        if garbage > 0 {
            self.store.flush()?;
            tracing::info!("dropped {garbage} stale pages from the fast tier");
        }
        // Every dirty file gets a data op (after whatever the journal already holds).
        let dirty: Vec<u64> = ns
            .nodes
            .iter()
            .filter(|(_, n)| !n.links.is_empty() && n.data.as_ref().is_some_and(|d| d.lock().dirty))
            .map(|(i, _)| *i)
            .collect();
        for ino in dirty {
            self.queue_data(&ns, ino)?;
        }
        Ok(())
    }

    /// The journal, locked, with the queued operations' work run first
    /// ([`Core::tx_later`]): whoever reads or writes the database sees every operation that
    /// changed the namespace before it.
    fn lock_db(&self) -> parking_lot::MutexGuard<'_, Db> {
        let mut db = self.db.lock();
        self.run_later(&mut db);
        db
    }

    /// Runs the queued journal work, oldest first, all in one savepoint of the group (a
    /// savepoint each cost its statements and a copy of every page it touched into the
    /// statement journal: a fifth of the work). If that fails, it is rolled back and each
    /// piece is run again in its own savepoint, so that only the failing pieces are lost; a
    /// failure is logged and shown by `status`, and stops the queueing (`later_failed`).
    /// Queued work was counted in `db_commits` when it was queued.
    fn run_later(&self, db: &mut Db) {
        if !self.later_queued() {
            return;
        }
        // The group opens before the work leaves the queue (only a holder of `db` takes
        // it): a `status` that finds neither queued work nor an open group then finds the
        // rows committed (see `journal_backlog`).
        let opened = self.open_group(db);
        let queued = self.later.lock().take();
        let all = opened.and_then(|()| {
            let db: &Db = db;
            db.in_savepoint(|tx| queued.iter().try_for_each(|w| Self::rows(db, tx, w)))
        });
        if all.is_err() {
            for work in &queued {
                if let Err(e) = self.run_one(db, work) {
                    self.later_failed.store(true, Relaxed);
                    let msg = format!("writing the namespace journal: {e}");
                    tracing::error!("{msg}");
                    self.set_last_error(msg);
                }
            }
        }
        self.commit_if_old(db);
    }

    /// As [`Core::tx`] for a namespace operation made under `ns`, without waiting for the
    /// database: `f` is queued and run, in the order of the queue, by the next holder of
    /// `db` ([`Core::lock_db`]), at the latest by the committer once [`journal_due`] (in
    /// the first gap of [`JOURNAL_QUIET`] in the foreground's work, at most
    /// [`JOURNAL_MAX_DEFER`] after). The operation's rows are committed with the group they
    /// run in, and `kill -9` before that loses them. What
    /// changes is that the namespace lock is no longer held across the SQLite statements
    /// (8-18 µs an operation, the longest hold of that lock: 4 client processes on a 16-CPU
    /// node spent more time waiting for it than creating). A failure of the queued work
    /// is reported by [`Core::run_later`]; after one, operations run their work at once again
    /// and get EIO as before.
    fn tx_later(
        &self,
        f: impl Fn(&rusqlite::Connection) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        if self.later_failed.load(Relaxed) {
            return self.tx(f);
        }
        self.queue(Later::Rows(Box::new(f)));
        Ok(())
    }

    /// Queues `work` for the next holder of `db` and wakes the committer if the queue was
    /// empty.
    fn queue(&self, work: Later) {
        self.touch();
        let first = self.later.lock().push(work);
        // Counted after it is queued: a `journal_durable` that sees the count finds the work
        // in the queue (its `lock_db` runs it before the durable commit).
        self.db_commits
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if first {
            *self.group_open.lock() = true;
            self.group_cv.notify_one();
        }
    }

    /// Runs `f` as one namespace operation: a savepoint (all of it or none of it) inside the
    /// group transaction that nearby operations share (group commit: one SQLite commit per
    /// [`GROUP_COMMIT`] instead of one per operation). What an operation wrote is seen at
    /// once by every later database access (one connection); it survives a `kill -9` of the
    /// daemon once its group is committed (within a few milliseconds), and a power loss
    /// once made durable (fsync of the file or a directory, umount).
    fn tx<T>(&self, f: impl FnOnce(&rusqlite::Connection) -> Result<T>) -> Result<T> {
        let mut db = self.lock_db();
        self.tx_in(&mut db, f)
    }

    /// As [`Core::tx`], with the database lock already held (taken while the namespace lock
    /// was, so that the operation's rows keep their place in the journal after that lock is
    /// let go: see [`Core::release`]).
    fn tx_in<T>(
        &self,
        db: &mut Db,
        f: impl FnOnce(&rusqlite::Connection) -> Result<T>,
    ) -> Result<T> {
        self.touch();
        self.db_commits.fetch_add(1, Relaxed);
        self.tx_run(db, f)
    }

    /// Runs `f` in its savepoint of the group (opened if need be), and commits the group
    /// once it is [`GROUP_COMMIT`] old. Counted in `db_commits`, and the foreground's
    /// activity noted, by the caller (queued work was when it was queued).
    fn tx_run<T>(
        &self,
        db: &mut Db,
        f: impl FnOnce(&rusqlite::Connection) -> Result<T>,
    ) -> Result<T> {
        self.open_group(db)?;
        let v = db.in_savepoint(f)?;
        self.commit_if_old(db);
        Ok(v)
    }

    /// Opens the group transaction if none is, and tells the committer.
    fn open_group(&self, db: &mut Db) -> Result<()> {
        if db.begin_group()? {
            *self.group_open.lock() = true;
            self.group_cv.notify_one();
        }
        Ok(())
    }

    /// Commits the group once it is [`GROUP_COMMIT`] old: under steady load the committer
    /// thread may wait for the lock. The operations are done; a failed commit is retried by
    /// the next one.
    fn commit_if_old(&self, db: &mut Db) {
        if db.group_age().is_some_and(|a| a >= GROUP_COMMIT) {
            if let Err(e) = db.commit_group() {
                tracing::warn!("committing the journal: {e}");
            }
        }
    }

    /// Writes `row`, an attribute change of `ino` (at `path`), with its `SetAttr` journal
    /// row, unless the journal's last row is this group's own `Create` or `SetAttr` of the
    /// same node at the same path ([`Db::own_last_row`]): the drainer applies a node's
    /// attributes as they are when it gets to that row, which is after this change, so a
    /// second row would only repeat it (`tar` sets times, owner and mode of each file it
    /// makes: one row instead of four, and no barrier for each). Queued as
    /// [`Core::tx_later`]'s work is (the test of the last row is made when it runs, after
    /// the work queued before it).
    fn tx_attrs(&self, ino: u64, path: &[u8], row: &db::InodeRow) -> Result<()> {
        let work = Later::Attrs {
            ino,
            path: path.to_vec(),
            row: row.clone(),
        };
        if self.later_failed.load(Relaxed) {
            let mut db = self.lock_db();
            self.touch();
            self.db_commits.fetch_add(1, Relaxed);
            return self.run_one(&mut db, &work);
        }
        self.queue(work);
        Ok(())
    }

    /// Runs one piece of queued journal work on `db` in its own savepoint (not counted in
    /// `db_commits`).
    fn run_one(&self, db: &mut Db, work: &Later) -> Result<()> {
        self.open_group(db)?;
        let r = {
            let db: &Db = db;
            db.in_savepoint(|tx| Self::rows(db, tx, work))
        };
        self.commit_if_old(db);
        r
    }

    /// Writes the rows of one piece of queued journal work on `tx`, the connection of `db`.
    fn rows(db: &Db, tx: &rusqlite::Connection, work: &Later) -> Result<()> {
        match work {
            Later::Rows(f) => f(tx),
            Later::Attrs { ino, path, row } => {
                let repeat = matches!(
                    db.own_last_row()?,
                    Some((OpKind::Create | OpKind::SetAttr, i, p)) if i == *ino && p == *path
                );
                db::put_inode(tx, row)?;
                if !repeat {
                    db::push_op(tx, OpKind::SetAttr, *ino, path, &[])?;
                }
                Ok(())
            }
        }
    }

    /// The mount's committer thread: waits for a group transaction to open or journal work
    /// to be queued, lets it gather the operations of [`GROUP_COMMIT`], and commits the
    /// group (if an operation has not already); queued work it runs first only once
    /// [`journal_due`] says so, and until then looks again every [`GROUP_COMMIT`].
    /// Returns when the core stops.
    pub fn group_committer(&self) {
        while !self.stopping.load(Relaxed) {
            {
                let mut open = self.group_open.lock();
                if !*open {
                    self.group_cv
                        .wait_for(&mut open, std::time::Duration::from_millis(100));
                }
                if !*open {
                    continue;
                }
                *open = false;
            }
            std::thread::sleep(GROUP_COMMIT);
            let (queued, oldest) = self.later.lock().size_age();
            let run = journal_due(queued, oldest, self.quiet_for());
            // Not due: the open group (operations run at once, all of them before the queued
            // work) is committed without it, and the queue looked at again next turn.
            let mut db = if run { self.lock_db() } else { self.db.lock() };
            let r = db.commit_group();
            drop(db);
            if let Err(e) = &r {
                tracing::warn!("committing the journal: {e}");
            }
            if r.is_err() || (queued > 0 && !run) {
                // Try again at the next turn.
                *self.group_open.lock() = true;
            }
        }
    }

    /// Queues `f` as a namespace operation's journal work (for tests of the queue).
    #[cfg(test)]
    pub(crate) fn queue_rows(
        &self,
        f: impl Fn(&rusqlite::Connection) -> Result<()> + Send + 'static,
    ) {
        self.queue(Later::Rows(Box::new(f)));
    }

    /// Whether journal work is queued ([`Core::tx_later`]).
    pub(crate) fn later_queued(&self) -> bool {
        !self.later.lock().work.is_empty()
    }

    /// Notes foreground work now.
    pub fn touch(&self) {
        self.activity
            .store(self.epoch.elapsed().as_nanos() as u64, Relaxed);
    }

    /// How long the foreground has been quiet.
    pub fn quiet_for(&self) -> std::time::Duration {
        self.quiet_at(std::time::Instant::now())
    }

    /// How long the foreground has been quiet at `now` (the drainer reads the clock once for
    /// all the durations its policy compares; see `drain::policy`).
    pub fn quiet_at(&self, now: std::time::Instant) -> std::time::Duration {
        let now = now.saturating_duration_since(self.epoch).as_nanos() as u64;
        std::time::Duration::from_nanos(now.saturating_sub(self.activity.load(Relaxed)))
    }

    /// Wakes the drainer's dispatcher to look at the journal.
    pub fn wake_drainer(&self) {
        let mut g = self.wake_lock.lock();
        *g += 1;
        self.wake_cv.notify_all();
    }

    /// The path of `rel` under BACKING, for messages (BACKING is accessed by handle).
    pub fn bjoin(&self, rel: &[u8]) -> PathBuf {
        self.bk.show(rel)
    }

    // ------------------------------------------------------------------ namespace helpers

    /// The path of `ino` relative to the mount's root, by its first link (None if it has no
    /// link or is nested deeper than 4096 levels).
    fn path_of(ns: &Ns, ino: u64) -> Option<Vec<u8>> {
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut cur = ino;
        let mut depth = 0;
        while cur != ROOT {
            let n = ns.nodes.get(&cur)?;
            let (p, name) = n.links.first()?;
            parts.push(name);
            cur = *p;
            depth += 1;
            if depth > 4096 {
                return None;
            }
        }
        let mut out = Vec::new();
        for (i, p) in parts.iter().rev().enumerate() {
            if i > 0 {
                out.push(b'/');
            }
            out.extend_from_slice(p);
        }
        Some(out)
    }

    fn child_path(ns: &Ns, parent: u64, name: &[u8]) -> R<Vec<u8>> {
        let p = Self::path_of(ns, parent).ok_or(libc::ENOENT)?;
        Ok(join_rel(&p, name))
    }

    /// The attributes of node `n` (inode `ino`) as the FUSE layer reports them; a file's
    /// size and blocks come from its [`FileData`].
    fn attr_of(&self, ino: u64, n: &Node) -> Attr {
        let (size, blocks) = match &n.data {
            Some(d) => {
                let f = d.lock();
                // Pages held, counted whole (O(1): getattr is hot; a page's bytes past the
                // end of the file are capped by `most` below).
                match &f.extents {
                    // Allocated blocks as ext4 counts them (also those reserved past the
                    // end with FALLOC_FL_KEEP_SIZE).
                    Some(e) => (f.size, e.bytes() / 512),
                    None => {
                        let held = f.pages.len() as u64 * PAGE;
                        let base = if f.has_base {
                            (f.base_blocks * 512).min(f.base_len)
                        } else {
                            0
                        };
                        let most = f.size.div_ceil(4096) * 8;
                        (f.size, (held + base).div_ceil(512).min(most))
                    }
                }
            }
            None => (n.size, n.size.div_ceil(4096) * 8),
        };
        Attr {
            ino,
            kind: n.kind,
            mode: n.mode,
            uid: n.uid,
            gid: n.gid,
            size,
            atime: n.atime,
            mtime: n.mtime,
            ctime: n.ctime,
            nlink: match n.kind {
                Kind::Dir if n.loaded => 2 + n.subdirs,
                Kind::Dir => (2 + n.subdirs).max(n.listed_nlink),
                _ => n.links.len() as u32,
            },
            blocks,
            rdev: if n.kind.is_special() {
                rdev_of(&n.target)
            } else {
                0
            },
            generation: if ino == ROOT { 0 } else { self.generation },
        }
    }

    /// Queues a data op for `ino` (all its current paths) unless one is queued already.
    fn queue_data(&self, ns: &Ns, ino: u64) -> Result<()> {
        let Some(n) = ns.nodes.get(&ino) else {
            return Ok(());
        };
        let Some(d) = &n.data else { return Ok(()) };
        let mut f = d.lock();
        if f.data_pending || n.links.is_empty() {
            return Ok(());
        }
        let paths = Self::link_paths(ns, n);
        let Some(first) = paths.first() else {
            return Ok(());
        };
        let rest = paths[1..].join(&0u8);
        self.tx(|tx| db::push_op(tx, OpKind::Data, ino, first, &rest))?;
        f.data_pending = true;
        drop(f);
        self.wake_drainer();
        Ok(())
    }

    /// The paths (from the mount's root) of every name of node `n`.
    /// The paths (relative to the mount's root) of node `ino`'s names; none for a node the
    /// namespace does not hold or that has no name left.
    pub fn paths_of(&self, ino: u64) -> Vec<Vec<u8>> {
        let ns = self.ns.lock();
        ns.nodes
            .get(&ino)
            .map(|n| Self::link_paths(&ns, n))
            .unwrap_or_default()
    }

    fn link_paths(ns: &Ns, n: &Node) -> Vec<Vec<u8>> {
        n.links
            .iter()
            .filter_map(|(p, name)| Self::path_of(ns, *p).map(|pp| join_rel(&pp, name)))
            .collect()
    }

    fn persist_node(&self, ns: &Ns, ino: u64) -> Result<()> {
        let Some(n) = ns.nodes.get(&ino) else {
            return Ok(());
        };
        let f = n.data.as_ref().map(|d| d.lock());
        let row = row_of(ino, n, f.as_deref());
        drop(f);
        self.tx(|tx| db::put_inode(tx, &row))
    }

    /// Records every file's allocation and size, then marks the stop clean: the next mount
    /// trusts the recorded allocation (after a crash it counts each page held as
    /// allocated whole). The daemon's last step before it exits.
    pub fn record_clean_stop(&self) -> Result<()> {
        let files: Vec<(u64, Arc<Mutex<FileData>>)> = {
            let ns = self.ns.lock();
            ns.nodes
                .iter()
                .filter_map(|(i, n)| n.data.clone().map(|d| (*i, d)))
                .collect()
        };
        for (ino, d) in files {
            let f = d.lock();
            self.persist_content(ino, &f)?;
        }
        let mut db = self.lock_db();
        db.meta_set("clean", b"1")?;
        db.make_durable()
    }

    /// Whether the staging file `sp` of the file of row `r` was renamed into place by a drain
    /// whose record did not reach the journal before the daemon stopped: the drain's last
    /// pass after the last close renames the staging file over the file's path, then records
    /// it (group commit: a `kill -9` within those milliseconds keeps the row of the pass
    /// before). Then `sp` is gone from BACKING and the file's own path holds the base (that
    /// pass's, which holds the row's base and what the fast tier still holds since: nothing
    /// it drained was dropped before its record was durable); its length then. Anything else
    /// (the staging file there, or neither) is left as it is.
    fn staged_renamed(&self, r: &InodeRow, sp: &[u8]) -> Option<u64> {
        let gone = matches!(
            std::fs::symlink_metadata(self.bjoin(sp)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound
        );
        if !gone || !r.has_base {
            return None;
        }
        let bp = r.bpath.as_ref()?;
        std::fs::symlink_metadata(self.bjoin(bp))
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len())
    }

    fn persist_content(&self, ino: u64, f: &FileData) -> Result<()> {
        self.db_commits.fetch_add(1, Relaxed);
        let db = self.lock_db();
        db.conn
            .prepare_cached(
                "UPDATE inodes SET size=?2, has_base=?3, base_len=?4, dirty=?5, bpath=?6, staged=?7, extents=?8 WHERE ino=?1",
            )?
            .execute(rusqlite::params![
                ino as i64,
                f.size as i64,
                f.has_base as i64,
                f.base_len as i64,
                f.dirty as i64,
                f.bpath,
                f.staged,
                f.extents.as_ref().map(|e| e.encode())
            ])?;
        Ok(())
    }
}

/// The `inodes` table row of node `n` (inode `ino`), with the contents fields of `f` for a
/// regular file.
fn row_of(ino: u64, n: &Node, f: Option<&FileData>) -> InodeRow {
    InodeRow {
        ino,
        kind: n.kind as u8,
        mode: n.mode,
        uid: n.uid,
        gid: n.gid,
        size: f.map_or(n.size, |f| f.size),
        atime: n.atime,
        mtime: n.mtime,
        ctime: n.ctime,
        target: (n.kind == Kind::Symlink || n.kind.is_special()).then(|| n.target.clone()),
        obj: n.obj,
        has_base: f.is_some_and(|f| f.has_base),
        base_len: f.map_or(0, |f| f.base_len),
        bpath: match f {
            Some(f) => f.bpath.clone(),
            None => n.bpath.clone(),
        },
        loaded: n.loaded,
        dirty: f.is_some_and(|f| f.dirty),
        staged: f.and_then(|f| f.staged.clone()),
        extents: f.and_then(|f| f.extents.as_ref().map(|e| e.encode())),
    }
}

/// An operation's rows, written when the queue runs (again, in a savepoint of their own,
/// if the queue's savepoint failed: see [`Core::run_later`]).
type Rows = Box<dyn Fn(&rusqlite::Connection) -> Result<()> + Send>;

/// The journal work queued by namespace operations ([`Core::tx_later`]), oldest first, and
/// when the oldest was queued.
#[derive(Default)]
struct Queue {
    work: Vec<Later>,
    since: Option<std::time::Instant>,
}

impl Queue {
    /// Queues `w`; whether the queue was empty.
    fn push(&mut self, w: Later) -> bool {
        self.work.push(w);
        let first = self.since.is_none();
        if first {
            self.since = Some(std::time::Instant::now());
        }
        first
    }

    /// Takes every piece, oldest first.
    fn take(&mut self) -> Vec<Later> {
        self.since = None;
        std::mem::take(&mut self.work)
    }

    /// How many pieces are queued, and how long the oldest has waited.
    fn size_age(&self) -> (usize, std::time::Duration) {
        (
            self.work.len(),
            self.since.map(|t| t.elapsed()).unwrap_or_default(),
        )
    }
}

/// Journal work queued by [`Core::tx_later`] and [`Core::tx_attrs`].
enum Later {
    /// An operation's rows.
    Rows(Rows),
    /// An attribute change ([`Core::tx_attrs`]).
    Attrs {
        ino: u64,
        path: Vec<u8>,
        row: db::InodeRow,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_journal_work_runs_in_a_gap_or_when_old_or_many() {
        use std::time::Duration as D;
        let ms = D::from_millis;
        // Nothing queued: nothing to run, however quiet.
        assert!(!journal_due(0, ms(5000), ms(5000)));
        // A busy foreground: the work waits ...
        assert!(!journal_due(100, ms(10), D::ZERO));
        assert!(!journal_due(
            JOURNAL_MAX_QUEUED - 1,
            JOURNAL_MAX_DEFER - ms(1),
            ms(4)
        ));
        // ... for a gap, for its age or for its size, whichever comes first.
        assert!(journal_due(1, D::ZERO, JOURNAL_QUIET));
        assert!(journal_due(1, JOURNAL_MAX_DEFER, D::ZERO));
        assert!(journal_due(JOURNAL_MAX_QUEUED, D::ZERO, D::ZERO));
        // More of any of the three never makes work wait that was due.
        for (q, a, i) in [(1, 0, 5), (1, 1000, 0), (JOURNAL_MAX_QUEUED, 0, 0)] {
            assert!(journal_due(q, ms(a), ms(i)));
            assert!(journal_due(q + 1, ms(a + 1), ms(i + 1)));
        }
    }

    #[test]
    fn staging_and_stager_temporary_names_are_transient() {
        assert!(transient_name(b".tierstack-tmp.42"));
        assert!(transient_name(b".in0.tierstack-stage-9806-3"));
        assert!(!transient_name(b"in0.tierstack-stage-9806-3"));
        assert!(!transient_name(b".bashrc"));
        assert!(!transient_name(b"in0"));
    }

    #[test]
    fn join_rel_of_root_is_the_name() {
        assert_eq!(join_rel(b"", b"x"), b"x");
        assert_eq!(join_rel(b"a/b", b"x"), b"a/b/x");
    }

    #[test]
    fn under_matches_whole_components() {
        assert!(under(b"a/b", b"a"));
        assert!(under(b"a", b"a"));
        assert!(!under(b"ab", b"a"));
        assert!(!under(b"a", b"a/b"));
    }

    #[test]
    fn moved_paths_follow_a_renamed_directory() {
        assert_eq!(
            moved(b"p1/n3/n4/n8/n6", b"p1/n3/n4", b"p1/n3/n6").as_deref(),
            Some(&b"p1/n3/n6/n8/n6"[..])
        );
        assert_eq!(moved(b"a", b"a", b"b").as_deref(), Some(&b"b"[..]));
        assert_eq!(moved(b"ab/c", b"a", b"b"), None);
    }

    #[test]
    fn barriers_are_the_ops_that_move_or_remove_paths() {
        assert!(OpKind::Rename.is_barrier());
        assert!(OpKind::Unlink.is_barrier());
        assert!(OpKind::Rmdir.is_barrier());
        assert!(OpKind::Link.is_barrier());
        assert!(OpKind::SetAttr.is_barrier());
        assert!(!OpKind::Create.is_barrier());
        assert!(!OpKind::Data.is_barrier());
    }
}
