//! The file system's state: the namespace (in memory, written through to the journal
//! database), file contents (pages in the tiered store over a base file in BACKING), space
//! accounting and backpressure.
//!
//! Lock order: `ns` -> a file's `FileData` -> `db`. Writers never hold a lock while they wait
//! for space.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use rusqlite::Transaction;
use tierstack_array::Array;
use tierstack_store::{PageData, StoreError, TieredStore, MAX_OBJECT_ID};

use crate::backing::Backing;
use crate::db::{self, Db, InodeRow, OpKind};
use crate::error::{FsError, Result};

/// The page size of file contents in the store (the store's largest value).
pub const PAGE: u64 = 1 << 20;
/// Prefix of the drainer's temporary files in BACKING (hidden from the mount).
pub const TMP_PREFIX: &[u8] = b".tierstack-tmp.";
pub const ROOT: u64 = 1;

/// An errno for the FUSE layer.
pub type Errno = i32;
pub type R<T> = std::result::Result<T, Errno>;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    Socket = 5,
    CharDev = 6,
    BlockDev = 7,
}

impl Kind {
    fn from_u8(v: u8) -> Kind {
        match v {
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Fifo,
            5 => Kind::Socket,
            6 => Kind::CharDev,
            7 => Kind::BlockDev,
            _ => Kind::File,
        }
    }

    /// The kind of a `st_mode`'s type bits (None: not one the mount keeps).
    pub fn of_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            _ => return None,
        })
    }

    /// The type bits of `st_mode`.
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => libc::S_IFREG,
            Kind::Dir => libc::S_IFDIR,
            Kind::Symlink => libc::S_IFLNK,
            Kind::Fifo => libc::S_IFIFO,
            Kind::Socket => libc::S_IFSOCK,
            Kind::CharDev => libc::S_IFCHR,
            Kind::BlockDev => libc::S_IFBLK,
        }
    }

    /// FIFOs, sockets and device nodes (made with `mknod`; `Node::target` holds the device
    /// number as 8 little-endian bytes).
    pub fn is_special(self) -> bool {
        matches!(
            self,
            Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev
        )
    }
}

/// The device number kept in a special node's `target`.
pub fn rdev_of(target: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = target.len().min(8);
    b[..n].copy_from_slice(&target[..n]);
    u64::from_le_bytes(b)
}

/// The longest name in a directory, as on ext4.
pub const NAME_MAX: usize = 255;

/// ENAMETOOLONG for a name longer than [`NAME_MAX`].
pub fn check_name(name: &[u8]) -> R<()> {
    if name.len() > NAME_MAX {
        Err(libc::ENAMETOOLONG)
    } else {
        Ok(())
    }
}

/// A page of a file held in the store.
#[derive(Clone, Copy, Debug)]
pub struct Page {
    /// Changes on every write of the page (0: loaded at start-up or cached from BACKING).
    pub ver: u64,
    /// Differs from BACKING (must be drained before it may be dropped).
    pub dirty: bool,
    pub len: u32,
}

/// The contents of one regular file: pages in the store over an optional base file in
/// BACKING (`bpath`, valid for its first `base_len` bytes).
#[derive(Debug, Default)]
pub struct FileData {
    pub size: u64,
    pub has_base: bool,
    pub base_len: u64,
    pub bpath: Option<Vec<u8>>,
    /// Contents differ from BACKING.
    pub dirty: bool,
    pub pages: BTreeMap<u64, Page>,
    /// Bumped by every change of contents.
    pub ver: u64,
    pub base_fd: Option<Arc<File>>,
    /// A data op for this file is queued in the journal and has not started.
    pub data_pending: bool,
    /// Smallest size since the current drain took its snapshot.
    pub min_size: u64,
    /// A drain of the file while it was still open staged its contents under a temporary
    /// name in BACKING (this path): that file is the base (first `base_len` bytes) until the
    /// drain after the last close renames it into place. Each byte is drained once.
    pub staged: Option<Vec<u8>>,
    /// 512-byte blocks the base holds in BACKING (holes excluded), for `st_blocks`.
    pub base_blocks: u64,
}

impl FileData {
    /// Where the base is in BACKING: the staged temporary file, else the file's own path.
    pub fn base_path(&self) -> Option<&[u8]> {
        self.staged.as_deref().or(self.bpath.as_deref())
    }
}

pub struct Node {
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    /// Size of directories and symlinks (files: `FileData::size`).
    pub size: u64,
    pub target: Vec<u8>,
    /// (parent, name) of every link; directories have one, the root none.
    pub links: Vec<(u64, Vec<u8>)>,
    pub obj: u64,
    /// Where this node is in BACKING as of the journal rows applied so far.
    pub bpath: Option<Vec<u8>>,
    pub loaded: bool,
    pub children: BTreeMap<Vec<u8>, u64>,
    /// Directories among `children` (a directory's link count is 2 + this).
    pub subdirs: u32,
    /// Extended attributes (user.*, trusted.*, security.*).
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    pub open: u32,
    pub data: Option<Arc<Mutex<FileData>>>,
}

#[derive(Default)]
pub struct Ns {
    pub nodes: HashMap<u64, Node>,
    pub next_ino: u64,
    pub next_obj: u64,
}

impl Ns {
    /// Enters `ino` (already in `nodes`) as `name` in directory `parent`.
    pub fn insert_child(&mut self, parent: u64, name: Vec<u8>, ino: u64) {
        let is_dir = self.nodes.get(&ino).is_some_and(|n| n.kind == Kind::Dir);
        if let Some(p) = self.nodes.get_mut(&parent) {
            if p.children.insert(name, ino).is_none() && is_dir {
                p.subdirs += 1;
            }
        }
    }

    /// Removes `name` from directory `parent`.
    pub fn remove_child(&mut self, parent: u64, name: &[u8]) {
        let Some(ino) = self
            .nodes
            .get_mut(&parent)
            .and_then(|p| p.children.remove(name))
        else {
            return;
        };
        let is_dir = self.nodes.get(&ino).is_some_and(|n| n.kind == Kind::Dir);
        if let Some(p) = self.nodes.get_mut(&parent) {
            if is_dir {
                p.subdirs = p.subdirs.saturating_sub(1);
            }
        }
    }

    /// The inode of `name` in directory `parent`, if there is one.
    pub fn child(&self, parent: u64, name: &[u8]) -> Option<u64> {
        self.nodes
            .get(&parent)
            .and_then(|p| p.children.get(name))
            .copied()
    }
}

/// Attributes handed to the FUSE layer.
#[derive(Clone, Debug)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub nlink: u32,
    /// Device number of a device node.
    pub rdev: u64,
    /// 512-byte blocks held: pages in the fast tier and the base's blocks in BACKING (a
    /// sparse file shows what it holds, not its size).
    pub blocks: u64,
}

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

fn eio(e: impl std::fmt::Display) -> Errno {
    tracing::error!("{e}");
    libc::EIO
}

enum WriteErr {
    Full,
    Other(FsError),
}

/// What the FUSE layer and the drainer share.
pub struct Core {
    pub backing: PathBuf,
    /// BACKING held open: every access to it goes through directory handles.
    pub bk: Backing,
    pub sync_mode: bool,
    pub store: TieredStore,
    pub array: Arc<Array>,
    pub ns: Mutex<Ns>,
    pub db: Mutex<Db>,
    /// Bytes of file pages held in the store.
    pub held: AtomicU64,
    /// Bytes of dirty pages.
    pub dirty_bytes: AtomicU64,
    /// Above this many held bytes writers wait for the drainer.
    pub limit: u64,
    space_lock: Mutex<()>,
    space_cv: Condvar,
    pub wake_lock: Mutex<u64>,
    pub wake_cv: Condvar,
    /// Writers are waiting for space.
    pub pressure: AtomicBool,
    /// `tierstack drain` asked for every dirty file to be drained now.
    pub force: AtomicBool,
    pub drained_bytes: AtomicU64,
    pub last_error: Mutex<Option<String>>,
    /// Group commit of `fsync` in sync mode: `fsync` calls so far, and how many of them the
    /// last completed flush covered (it started after they arrived). `sync_lock` is held
    /// while a flush runs.
    sync_arrived: AtomicU64,
    sync_covered: AtomicU64,
    sync_lock: Mutex<()>,
    /// The daemon is stopping: background threads end.
    pub stopping: AtomicBool,
    /// Inodes with a quarantined journal row (their dirty data stays in the fast tier).
    pub stuck_inos: Mutex<std::collections::HashSet<u64>>,
    /// `tierstack drain --retry` asked for the quarantined rows to be tried again.
    pub retry: AtomicBool,
    /// `tierstack umount --force`: stop without waiting for the drain (the journal keeps
    /// what is left for the next mount).
    pub force_stop: AtomicBool,
    /// Counts and latencies of the FUSE operations served.
    pub ops: crate::opstats::OpStats,
}

/// In sync mode, dirty DRAM pages are written to the array in the background once this many
/// bytes are dirty, so an `fsync` finds little left to write.
pub const WRITE_BACK_START: u64 = 32 << 20;

impl Core {
    /// Opens the namespace from the database (creating the root from BACKING if new) and
    /// reconciles it with the pages the array holds after a restart.
    pub fn new(
        backing: PathBuf,
        sync_mode: bool,
        store: TieredStore,
        array: Arc<Array>,
        db: Db,
        limit: u64,
    ) -> Result<Core> {
        let bk = Backing::open(&backing).map_err(crate::error::io_err(&backing))?;
        let core = Core {
            backing,
            bk,
            sync_mode,
            store,
            array,
            ns: Mutex::new(Ns::default()),
            db: Mutex::new(db),
            held: AtomicU64::new(0),
            dirty_bytes: AtomicU64::new(0),
            limit,
            space_lock: Mutex::new(()),
            space_cv: Condvar::new(),
            wake_lock: Mutex::new(0),
            wake_cv: Condvar::new(),
            pressure: AtomicBool::new(false),
            force: AtomicBool::new(false),
            drained_bytes: AtomicU64::new(0),
            last_error: Mutex::new(None),
            sync_arrived: AtomicU64::new(0),
            sync_covered: AtomicU64::new(0),
            sync_lock: Mutex::new(()),
            stopping: AtomicBool::new(false),
            stuck_inos: Mutex::new(Default::default()),
            retry: AtomicBool::new(false),
            force_stop: AtomicBool::new(false),
            ops: Default::default(),
        };
        // A new mount tries the rows an earlier one quarantined again.
        core.db.lock().release_stuck()?;
        core.load()?;
        Ok(core)
    }

    fn load(&self) -> Result<()> {
        let (rows, dents, xattrs) = {
            let db = self.db.lock();
            (db.load_inodes()?, db.load_dentries()?, db.load_xattrs()?)
        };
        let mut ns = self.ns.lock();
        let mut max_ino = ROOT;
        let mut max_obj = 0;
        for r in &rows {
            max_ino = max_ino.max(r.ino);
            max_obj = max_obj.max(r.obj);
            let kind = Kind::from_u8(r.kind);
            let data = (kind == Kind::File).then(|| {
                Arc::new(Mutex::new(FileData {
                    size: r.size,
                    has_base: r.has_base,
                    base_len: r.base_len,
                    bpath: r.bpath.clone(),
                    dirty: r.dirty,
                    staged: r.staged.clone(),
                    base_blocks: r.base_len.div_ceil(512),
                    min_size: r.size,
                    ..Default::default()
                }))
            });
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
                    xattrs: BTreeMap::new(),
                    open: 0,
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
                xattrs: BTreeMap::new(),
                open: 0,
                data: None,
            };
            let row = row_of(ROOT, &root, None);
            self.tx(|tx| db::put_inode(tx, &row))?;
            ns.nodes.insert(ROOT, root);
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
        ns.next_ino = max_ino + 1;
        ns.next_obj = max_obj + 1;
        // Pages the array holds: those of live files (within their size) are their contents;
        // everything else is garbage of files deleted before a crash.
        let mut by_obj: HashMap<u64, Arc<Mutex<FileData>>> = HashMap::new();
        for n in ns.nodes.values() {
            if let Some(d) = &n.data {
                by_obj.insert(n.obj, d.clone());
            }
        }
        let keys = self.array.keys_in(0, MAX_OBJECT_ID - 1);
        let mut garbage = 0;
        for k in keys {
            let len = self.array.value_len(k).unwrap_or(0) as u64;
            if let Some(d) = by_obj.get(&k.0) {
                let mut f = d.lock();
                if k.1 * PAGE < f.size {
                    let dirty = f.dirty;
                    f.pages.insert(
                        k.1,
                        Page {
                            ver: 0,
                            dirty,
                            len: len as u32,
                        },
                    );
                    self.held.fetch_add(len, Relaxed);
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

    /// Runs `f` in one transaction of the journal database.
    pub fn tx<T>(&self, f: impl FnOnce(&Transaction) -> Result<T>) -> Result<T> {
        let mut db = self.db.lock();
        let tx = db.conn.transaction()?;
        let v = f(&tx)?;
        tx.commit()?;
        Ok(v)
    }

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

    pub fn path_of(ns: &Ns, ino: u64) -> Option<Vec<u8>> {
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

    pub fn attr_of(ino: u64, n: &Node) -> Attr {
        let (size, blocks) = match &n.data {
            Some(d) => {
                let f = d.lock();
                let held: u64 = f.pages.values().map(|p| p.len as u64).sum();
                let base = if f.has_base {
                    (f.base_blocks * 512).min(f.base_len)
                } else {
                    0
                };
                let most = f.size.div_ceil(4096) * 8;
                (f.size, (held + base).div_ceil(512).min(most))
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
                Kind::Dir => 2 + n.subdirs,
                _ => n.links.len() as u32,
            },
            blocks,
            rdev: if n.kind.is_special() {
                rdev_of(&n.target)
            } else {
                0
            },
        }
    }

    /// Lists a directory from BACKING the first time it is used.
    fn ensure_loaded(&self, ns: &mut Ns, dir: u64) -> R<()> {
        let (loaded, bpath, kind) = match ns.nodes.get(&dir) {
            Some(n) => (n.loaded, n.bpath.clone(), n.kind),
            None => return Err(libc::ENOENT),
        };
        if kind != Kind::Dir {
            return Err(libc::ENOTDIR);
        }
        if loaded {
            return Ok(());
        }
        let mut new: Vec<(u64, Vec<u8>, Node)> = Vec::new();
        if let Some(bp) = &bpath {
            let dpath = self.bjoin(bp);
            let d = match self.bk.dir(bp) {
                Ok(d) => Some(d),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(eio(format!("{}: {e}", dpath.display()))),
            };
            let names = match &d {
                Some(d) => {
                    Backing::list(d).map_err(|e| eio(format!("{}: {e}", dpath.display())))?
                }
                None => Vec::new(),
            };
            for name in names {
                let Some(d) = &d else { break };
                if name.starts_with(TMP_PREFIX) || name.len() > NAME_MAX {
                    continue;
                }
                let Ok(md) = Backing::stat(d, &name) else {
                    continue;
                };
                let Some(kind) = Kind::of_mode(md.st_mode) else {
                    continue;
                };
                let target = if kind == Kind::Symlink {
                    Backing::readlink(d, &name).unwrap_or_default()
                } else if kind.is_special() {
                    md.st_rdev.to_le_bytes().to_vec()
                } else {
                    Vec::new()
                };
                let md_len = md.st_size as u64;
                let xattrs: BTreeMap<Vec<u8>, Vec<u8>> = if kind == Kind::Symlink {
                    BTreeMap::new()
                } else {
                    Backing::xattrs(d, &name)
                        .unwrap_or_default()
                        .into_iter()
                        .collect()
                };
                let ino = ns.next_ino;
                ns.next_ino += 1;
                let obj = if kind == Kind::File {
                    ns.next_obj += 1;
                    ns.next_obj - 1
                } else {
                    0
                };
                let rel = join_rel(bp, &name);
                let data = (kind == Kind::File).then(|| {
                    Arc::new(Mutex::new(FileData {
                        size: md_len,
                        has_base: true,
                        base_len: md_len,
                        bpath: Some(rel.clone()),
                        min_size: md_len,
                        base_blocks: md.st_blocks as u64,
                        ..Default::default()
                    }))
                });
                let node = Node {
                    kind,
                    mode: md.st_mode & 0o7777,
                    uid: md.st_uid,
                    gid: md.st_gid,
                    atime: md.st_atime * 1_000_000_000 + md.st_atime_nsec as i64,
                    mtime: md.st_mtime * 1_000_000_000 + md.st_mtime_nsec as i64,
                    ctime: md.st_ctime * 1_000_000_000 + md.st_ctime_nsec as i64,
                    size: match kind {
                        Kind::Symlink => target.len() as u64,
                        k if k.is_special() => 0,
                        _ => md_len,
                    },
                    target,
                    links: vec![(dir, name.clone())],
                    obj,
                    bpath: Some(rel),
                    loaded: false,
                    children: BTreeMap::new(),
                    subdirs: 0,
                    xattrs,
                    open: 0,
                    data,
                };
                new.push((ino, name, node));
            }
        }
        let dir_row = {
            let n = ns.nodes.get(&dir).ok_or(libc::ENOENT)?;
            let mut r = row_of(dir, n, None);
            r.loaded = true;
            r
        };
        self.tx(|tx| {
            for (ino, name, node) in &new {
                let f = node.data.as_ref().map(|d| d.lock());
                db::put_inode(tx, &row_of(*ino, node, f.as_deref()))?;
                db::add_dentry(tx, dir, name, *ino)?;
                for (k, v) in &node.xattrs {
                    db::put_xattr(tx, *ino, k, Some(v))?;
                }
            }
            db::put_inode(tx, &dir_row)
        })
        .map_err(eio)?;
        for (ino, name, node) in new {
            ns.nodes.insert(ino, node);
            ns.insert_child(dir, name, ino);
        }
        if let Some(d) = ns.nodes.get_mut(&dir) {
            d.loaded = true;
        }
        Ok(())
    }

    /// Queues a data op for `ino` (all its current paths) unless one is queued already.
    pub fn queue_data(&self, ns: &Ns, ino: u64) -> Result<()> {
        let Some(n) = ns.nodes.get(&ino) else {
            return Ok(());
        };
        let Some(d) = &n.data else { return Ok(()) };
        let mut f = d.lock();
        if f.data_pending || n.links.is_empty() {
            return Ok(());
        }
        let mut paths = Vec::new();
        for (p, name) in &n.links {
            if let Some(pp) = Self::path_of(ns, *p) {
                paths.push(join_rel(&pp, name));
            }
        }
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

    fn persist_node(&self, ns: &Ns, ino: u64) -> Result<()> {
        let Some(n) = ns.nodes.get(&ino) else {
            return Ok(());
        };
        let f = n.data.as_ref().map(|d| d.lock());
        let row = row_of(ino, n, f.as_deref());
        drop(f);
        self.tx(|tx| db::put_inode(tx, &row))
    }

    fn persist_content(&self, ino: u64, f: &FileData) -> Result<()> {
        let db = self.db.lock();
        db.conn
            .prepare_cached(
                "UPDATE inodes SET size=?2, has_base=?3, base_len=?4, dirty=?5, bpath=?6, staged=?7 WHERE ino=?1",
            )?
            .execute(rusqlite::params![
                ino as i64,
                f.size as i64,
                f.has_base as i64,
                f.base_len as i64,
                f.dirty as i64,
                f.bpath,
                f.staged
            ])?;
        Ok(())
    }

    // ------------------------------------------------------------------ contents

    fn base_file(&self, f: &mut FileData) -> Result<Option<Arc<File>>> {
        if let Some(b) = &f.base_fd {
            return Ok(Some(b.clone()));
        }
        let Some(bp) = f.base_path() else {
            return Ok(None);
        };
        let path = self.bjoin(bp);
        let file = self
            .bk
            .open_file(bp, rustix::fs::OFlags::RDONLY, 0)
            .map_err(crate::error::io_err(&path))?;
        let a = Arc::new(file);
        f.base_fd = Some(a.clone());
        Ok(Some(a))
    }

    /// Reads page `p` of a file: from the store, else from its base in BACKING (cached in the
    /// store when `cache`), else None (zeros). The contents are shared with the store (a later
    /// write of the page replaces them, it never changes them); they may be longer than the
    /// file's current size.
    pub fn read_page(
        &self,
        obj: u64,
        f: &mut FileData,
        p: u64,
        cache: bool,
    ) -> Result<Option<PageData>> {
        if f.pages.contains_key(&p) {
            return match self.store.get_shared((obj, p))? {
                Some(v) => Ok(Some(v)),
                None => Err(FsError::Config(format!(
                    "page {p} of object {obj} is missing from the fast tier"
                ))),
            };
        }
        let start = p * PAGE;
        if !f.has_base || start >= f.base_len {
            return Ok(None);
        }
        let Some(base) = self.base_file(f)? else {
            return Ok(None);
        };
        let want = (f.base_len - start).min(PAGE) as usize;
        let mut buf = self.store.page_buf(want);
        buf.resize(want, 0);
        let mut got = 0;
        while got < want {
            match base.read_at(&mut buf[got..], start + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(FsError::Io {
                        path: self.bjoin(f.base_path().unwrap_or_default()),
                        source: e,
                    })
                }
            }
        }
        let buf = PageData::new(buf);
        if cache
            && !self.pressure.load(Relaxed)
            && self.held.load(Relaxed) + want as u64 <= self.limit / 2
            && self.store.put_shared((obj, p), buf.clone()).is_ok()
        {
            f.pages.insert(
                p,
                Page {
                    ver: 0,
                    dirty: false,
                    len: want as u32,
                },
            );
            self.held.fetch_add(want as u64, Relaxed);
        }
        Ok(Some(buf))
    }

    /// The first `len` bytes of page `p` as a buffer of its own: the page's bytes below the
    /// file's current size, zeros after them.
    fn page_copy(&self, obj: u64, f: &mut FileData, p: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = self.store.page_buf(len);
        if let Some(v) = self.read_page(obj, f, p, false)? {
            // Bytes beyond the old size read as zeros even where a stale page is longer.
            let valid = (f.size.saturating_sub(p * PAGE).min(PAGE) as usize)
                .min(v.len())
                .min(len);
            buf.extend_from_slice(&v[..valid]);
        }
        buf.resize(len, 0);
        Ok(buf)
    }

    fn put_page(&self, obj: u64, f: &mut FileData, p: u64, data: Vec<u8>) -> Result<(), WriteErr> {
        let len = data.len() as u64;
        match self.store.put_owned((obj, p), data) {
            Ok(()) => {}
            Err(StoreError::Full(_)) => return Err(WriteErr::Full),
            Err(e) => return Err(WriteErr::Other(e.into())),
        }
        self.note_page_written(f, p, len);
        Ok(())
    }

    /// Records that page `p` now holds `len` new (dirty) bytes in the store.
    fn note_page_written(&self, f: &mut FileData, p: u64, len: u64) {
        f.ver += 1;
        let new = Page {
            ver: f.ver,
            dirty: true,
            len: len as u32,
        };
        if let Some(old) = f.pages.insert(p, new) {
            self.held.fetch_sub(old.len as u64, Relaxed);
            if old.dirty {
                self.dirty_bytes.fetch_sub(old.len as u64, Relaxed);
            }
        }
        self.held.fetch_add(len, Relaxed);
        self.dirty_bytes.fetch_add(len, Relaxed);
    }

    /// [`Core::put_page`] of a copy of `data`, retried until the store has room.
    fn put_page_retry(&self, obj: u64, f: &mut FileData, p: u64, data: &[u8]) -> R<()> {
        loop {
            let mut v = self.store.page_buf(data.len());
            v.extend_from_slice(data);
            match self.put_page(obj, f, p, v) {
                Ok(()) => return Ok(()),
                Err(WriteErr::Full) => std::thread::sleep(Duration::from_millis(50)),
                Err(WriteErr::Other(e)) => return Err(eio(e)),
            }
        }
    }

    fn drop_page(&self, obj: u64, f: &mut FileData, p: u64) -> Result<()> {
        if let Some(old) = f.pages.remove(&p) {
            self.held.fetch_sub(old.len as u64, Relaxed);
            if old.dirty {
                self.dirty_bytes.fetch_sub(old.len as u64, Relaxed);
            }
            self.store.remove((obj, p))?;
            self.space_cv.notify_all();
        }
        Ok(())
    }

    fn mark_dirty(&self, ino: u64, f: &mut FileData) -> Result<()> {
        f.ver += 1;
        if !f.dirty {
            f.dirty = true;
            self.persist_content(ino, f)?;
        }
        Ok(())
    }

    fn write_locked(
        &self,
        ino: u64,
        obj: u64,
        f: &mut FileData,
        off: u64,
        data: &[u8],
    ) -> Result<(), WriteErr> {
        let end = off + data.len() as u64;
        let new_size = f.size.max(end);
        let mut p = off / PAGE;
        while p * PAGE < end {
            let pstart = p * PAGE;
            let plen = (new_size - pstart).min(PAGE) as usize;
            let lo = off.max(pstart);
            let hi = end.min(pstart + PAGE);
            let src = &data[(lo - off) as usize..(hi - off) as usize];
            // A page the DRAM tier holds unshared is changed in place: a 4 KiB write into a
            // 1 MiB page then copies 4 KiB, not the page.
            if f.pages.contains_key(&p) && !(lo == pstart && hi - pstart >= plen as u64) {
                let keep = (f.size.saturating_sub(pstart).min(PAGE) as usize).min(plen);
                let at = (lo - pstart) as usize;
                let done = self
                    .store
                    .update((obj, p), keep, plen, |b| {
                        b[at..at + src.len()].copy_from_slice(src)
                    })
                    .map_err(|e| WriteErr::Other(e.into()))?;
                if done {
                    self.note_page_written(f, p, plen as u64);
                    p += 1;
                    continue;
                }
            }
            let buf = if lo == pstart && hi - pstart >= plen as u64 {
                // The write covers the whole page: no need to read it.
                let mut buf = self.store.page_buf(plen);
                buf.extend_from_slice(&src[..plen]);
                buf
            } else {
                let mut buf = self.page_copy(obj, f, p, plen).map_err(WriteErr::Other)?;
                buf[(lo - pstart) as usize..(hi - pstart) as usize].copy_from_slice(src);
                buf
            };
            self.put_page(obj, f, p, buf)?;
            p += 1;
        }
        f.size = new_size;
        self.mark_dirty(ino, f).map_err(WriteErr::Other)
    }

    fn file(&self, ino: u64) -> R<(Arc<Mutex<FileData>>, u64)> {
        let ns = self.ns.lock();
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        match &n.data {
            Some(d) => Ok((d.clone(), n.obj)),
            None if n.kind == Kind::Dir => Err(libc::EISDIR),
            None => Err(libc::EINVAL),
        }
    }

    /// Waits until the store has room for `len` more bytes: wakes the drainer and drops clean
    /// pages; never fails.
    fn wait_space(&self, len: u64) {
        let mut waited = false;
        while self.held.load(Relaxed) + len > self.limit {
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
        if waited && self.held.load(Relaxed) + 4 * PAGE < self.limit {
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
        if let Err(e) = self.db.lock().make_durable() {
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
                let len = f.pages.get(&p).map_or(0, |pg| pg.len as u64);
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

    pub fn notify_space(&self) {
        self.space_cv.notify_all();
    }

    /// Writes `data` at `off`. `kill_priv`: the writer is not privileged, so the file loses
    /// its set-user-ID bit and, when group-executable, its set-group-ID bit (as the kernel
    /// does on ext4).
    pub fn write(&self, ino: u64, off: u64, data: &[u8], kill_priv: bool) -> R<usize> {
        if kill_priv {
            self.kill_setid(ino)?;
        }
        let (d, obj) = self.file(ino)?;
        self.wait_space(data.len() as u64);
        loop {
            let r = {
                let mut f = d.lock();
                self.write_locked(ino, obj, &mut f, off, data)
            };
            match r {
                Ok(()) => break,
                Err(WriteErr::Full) => {
                    self.pressure.store(true, Relaxed);
                    self.wake_drainer();
                    if !self.drop_clean(data.len() as u64) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                Err(WriteErr::Other(e)) => return Err(eio(e)),
            }
        }
        let mut ns = self.ns.lock();
        if let Some(n) = ns.nodes.get_mut(&ino) {
            let t = now_ns();
            n.mtime = t;
            n.ctime = t;
        }
        Ok(data.len())
    }

    pub fn read(&self, ino: u64, off: u64, size: u32) -> R<Vec<u8>> {
        let (d, obj) = self.file(ino)?;
        let mut f = d.lock();
        let end = (off + size as u64).min(f.size);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - off) as usize];
        let mut p = off / PAGE;
        while p * PAGE < end {
            let pstart = p * PAGE;
            if let Some(v) = self.read_page(obj, &mut f, p, true).map_err(eio)? {
                let lo = off.max(pstart);
                let hi = end.min(pstart + v.len() as u64);
                if hi > lo {
                    out[(lo - off) as usize..(hi - off) as usize]
                        .copy_from_slice(&v[(lo - pstart) as usize..(hi - pstart) as usize]);
                }
            }
            p += 1;
        }
        Ok(out)
    }

    fn truncate(&self, ino: u64, new: u64) -> R<()> {
        let (d, obj) = self.file(ino)?;
        self.wait_space(PAGE);
        let mut f = d.lock();
        if new < f.size {
            let beyond: Vec<u64> = f
                .pages
                .range(new.div_ceil(PAGE)..)
                .map(|(p, _)| *p)
                .collect();
            for p in beyond {
                self.drop_page(obj, &mut f, p).map_err(eio)?;
            }
            if !new.is_multiple_of(PAGE) {
                let p = new / PAGE;
                if let Some(v) = self.read_page(obj, &mut f, p, false).map_err(eio)? {
                    let keep = (new - p * PAGE) as usize;
                    if v.len() > keep {
                        self.put_page_retry(obj, &mut f, p, &v[..keep])?;
                    }
                }
            }
            f.base_len = f.base_len.min(new);
            f.min_size = f.min_size.min(new);
        }
        f.size = new;
        self.mark_dirty(ino, &mut f).map_err(eio)?;
        self.persist_content(ino, &f).map_err(eio)?;
        Ok(())
    }

    /// Copies a file's whole base into the store, so it no longer depends on BACKING's copy
    /// (before that copy may be removed while the file lives on under another name).
    fn pin(&self, n: &Node, ino: u64) -> R<()> {
        let Some(d) = &n.data else { return Ok(()) };
        let mut f = d.lock();
        if !f.has_base {
            return Ok(());
        }
        let npages = f.base_len.min(f.size).div_ceil(PAGE);
        for p in 0..npages {
            if f.pages.get(&p).is_some_and(|pg| pg.dirty) {
                continue;
            }
            if let Some(v) = self.read_page(n.obj, &mut f, p, false).map_err(eio)? {
                self.put_page_retry(n.obj, &mut f, p, &v)?;
            }
        }
        f.has_base = false;
        f.base_fd = None;
        self.mark_dirty(ino, &mut f).map_err(eio)?;
        self.persist_content(ino, &f).map_err(eio)
    }

    fn destroy(&self, ns: &mut Ns, ino: u64) {
        if let Some(n) = ns.nodes.remove(&ino) {
            if let Some(d) = &n.data {
                let mut f = d.lock();
                let pages: Vec<u64> = f.pages.keys().copied().collect();
                for p in pages {
                    if let Err(e) = self.drop_page(n.obj, &mut f, p) {
                        tracing::warn!("dropping page {p} of inode {ino}: {e}");
                    }
                }
            }
        }
    }

    // ------------------------------------------------------------------ FUSE operations

    pub fn getattr(&self, ino: u64) -> R<Attr> {
        let ns = self.ns.lock();
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        Ok(Self::attr_of(ino, n))
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> R<Attr> {
        check_name(name)?;
        let mut ns = self.ns.lock();
        self.ensure_loaded(&mut ns, parent)?;
        let ino = ns.child(parent, name).ok_or(libc::ENOENT)?;
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        Ok(Self::attr_of(ino, n))
    }

    pub fn readlink(&self, ino: u64) -> R<Vec<u8>> {
        let ns = self.ns.lock();
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        if n.kind != Kind::Symlink {
            return Err(libc::EINVAL);
        }
        Ok(n.target.clone())
    }

    /// Entries of a directory from position `off` (0: ".", 1: "..", then children).
    pub fn readdir(&self, ino: u64, off: u64) -> R<Vec<(u64, Kind, Vec<u8>)>> {
        let mut ns = self.ns.lock();
        self.ensure_loaded(&mut ns, ino)?;
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        let parent = n.links.first().map_or(ROOT, |l| l.0);
        let mut out = Vec::new();
        if off == 0 {
            out.push((ino, Kind::Dir, b".".to_vec()));
        }
        if off <= 1 {
            out.push((parent, Kind::Dir, b"..".to_vec()));
        }
        let skip = off.saturating_sub(2) as usize;
        for (name, c) in n.children.iter().skip(skip).take(4096) {
            let kind = ns.nodes.get(c).map_or(Kind::File, |cn| cn.kind);
            out.push((*c, kind, name.clone()));
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn new_node(
        &self,
        ns: &mut Ns,
        parent: u64,
        name: &[u8],
        kind: Kind,
        mode: u32,
        uid: u32,
        gid: u32,
        target: Vec<u8>,
        op: OpKind,
    ) -> R<(u64, Attr)> {
        check_name(name)?;
        self.ensure_loaded(ns, parent)?;
        // A set-group-ID directory hands its group to what is made in it, and its set-GID
        // bit to the directories made in it (as ext4 does).
        let (mut mode, mut gid) = (mode, gid);
        if let Some(p) = ns
            .nodes
            .get(&parent)
            .filter(|p| p.mode & libc::S_ISGID != 0)
        {
            gid = p.gid;
            if kind == Kind::Dir {
                mode |= libc::S_ISGID;
            }
        }
        if ns
            .nodes
            .get(&parent)
            .is_some_and(|p| p.children.contains_key(name))
        {
            return Err(libc::EEXIST);
        }
        check_name(name)?;
        let path = Self::child_path(ns, parent, name)?;
        let ino = ns.next_ino;
        let obj = if kind == Kind::File { ns.next_obj } else { 0 };
        let t = now_ns();
        let data = (kind == Kind::File).then(|| {
            Arc::new(Mutex::new(FileData {
                dirty: true,
                ..Default::default()
            }))
        });
        let node = Node {
            kind,
            mode: mode & 0o7777,
            uid,
            gid,
            atime: t,
            mtime: t,
            ctime: t,
            size: match kind {
                Kind::Dir => 4096,
                Kind::Symlink => target.len() as u64,
                _ => 0,
            },
            target: target.clone(),
            links: vec![(parent, name.to_vec())],
            obj,
            bpath: None,
            loaded: true,
            children: BTreeMap::new(),
            subdirs: 0,
            xattrs: BTreeMap::new(),
            open: 0,
            data,
        };
        let row = {
            let f = node.data.as_ref().map(|d| d.lock());
            row_of(ino, &node, f.as_deref())
        };
        self.tx(|tx| {
            db::put_inode(tx, &row)?;
            db::add_dentry(tx, parent, name, ino)?;
            db::push_op(tx, op, ino, &path, &target)
        })
        .map_err(eio)?;
        ns.next_ino += 1;
        if kind == Kind::File {
            ns.next_obj += 1;
        }
        let attr = Self::attr_of(ino, &node);
        ns.nodes.insert(ino, node);
        ns.insert_child(parent, name.to_vec(), ino);
        if let Some(p) = ns.nodes.get_mut(&parent) {
            p.mtime = t;
            p.ctime = t;
        }
        self.wake_drainer();
        Ok((ino, attr))
    }

    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u32, uid: u32, gid: u32) -> R<Attr> {
        let mut ns = self.ns.lock();
        self.new_node(
            &mut ns,
            parent,
            name,
            Kind::Dir,
            mode,
            uid,
            gid,
            Vec::new(),
            OpKind::Mkdir,
        )
        .map(|r| r.1)
    }

    /// Creates a file (and opens it when `open`).
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
        open: bool,
    ) -> R<Attr> {
        let mut ns = self.ns.lock();
        let (ino, attr) = self.new_node(
            &mut ns,
            parent,
            name,
            Kind::File,
            mode,
            uid,
            gid,
            Vec::new(),
            OpKind::Create,
        )?;
        if let Some(n) = ns.nodes.get_mut(&ino) {
            if open {
                n.open += 1;
            }
        }
        if !open {
            self.queue_data(&ns, ino).map_err(eio)?;
        }
        Ok(attr)
    }

    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], uid: u32, gid: u32) -> R<Attr> {
        let mut ns = self.ns.lock();
        self.new_node(
            &mut ns,
            parent,
            name,
            Kind::Symlink,
            0o777,
            uid,
            gid,
            target.to_vec(),
            OpKind::Symlink,
        )
        .map(|r| r.1)
    }

    /// Extended attribute `name` of `ino` (ENODATA when it has none of that name).
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> R<Vec<u8>> {
        let ns = self.ns.lock();
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        n.xattrs.get(name).cloned().ok_or(libc::ENODATA)
    }

    /// The names of `ino`'s extended attributes, each followed by a NUL.
    pub fn listxattr(&self, ino: u64) -> R<Vec<u8>> {
        let ns = self.ns.lock();
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        let mut out = Vec::new();
        for k in n.xattrs.keys() {
            out.extend_from_slice(k);
            out.push(0);
        }
        Ok(out)
    }

    /// Sets (`value` Some, with XATTR_CREATE/XATTR_REPLACE `flags`) or removes (None) an
    /// extended attribute; journaled and drained to BACKING like any namespace change.
    pub fn setxattr(&self, ino: u64, name: &[u8], value: Option<&[u8]>, flags: i32) -> R<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(libc::ERANGE);
        }
        if !crate::backing::xattr_kept(name) {
            return Err(libc::EOPNOTSUPP);
        }
        if value.is_some_and(|v| v.len() > 65536) {
            return Err(libc::E2BIG);
        }
        let mut ns = self.ns.lock();
        let path = Self::path_of(&ns, ino).ok_or(libc::ENOENT)?;
        let n = ns.nodes.get_mut(&ino).ok_or(libc::ENOENT)?;
        let exists = n.xattrs.contains_key(name);
        match value {
            Some(_) if flags & libc::XATTR_CREATE != 0 && exists => return Err(libc::EEXIST),
            Some(_) if flags & libc::XATTR_REPLACE != 0 && !exists => return Err(libc::ENODATA),
            None if !exists => return Err(libc::ENODATA),
            _ => {}
        }
        self.tx(|tx| {
            db::put_xattr(tx, ino, name, value)?;
            db::push_op(tx, OpKind::Xattr, ino, &path, name)
        })
        .map_err(eio)?;
        match value {
            Some(v) => {
                n.xattrs.insert(name.to_vec(), v.to_vec());
            }
            None => {
                n.xattrs.remove(name);
            }
        }
        n.ctime = now_ns();
        self.wake_drainer();
        Ok(())
    }

    /// Makes a FIFO, socket or device node (`mode` holds the type bits).
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
    ) -> R<Attr> {
        let kind = Kind::of_mode(mode)
            .filter(|k| k.is_special())
            .ok_or(libc::EINVAL)?;
        let rdev = if matches!(kind, Kind::CharDev | Kind::BlockDev) {
            rdev
        } else {
            0
        };
        let mut ns = self.ns.lock();
        self.new_node(
            &mut ns,
            parent,
            name,
            kind,
            mode,
            uid,
            gid,
            rdev.to_le_bytes().to_vec(),
            OpKind::Mknod,
        )
        .map(|r| r.1)
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> R<Attr> {
        check_name(newname)?;
        let mut ns = self.ns.lock();
        self.ensure_loaded(&mut ns, newparent)?;
        {
            let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
            if n.kind == Kind::Dir {
                return Err(libc::EPERM);
            }
        }
        if ns
            .nodes
            .get(&newparent)
            .is_some_and(|p| p.children.contains_key(newname))
        {
            return Err(libc::EEXIST);
        }
        let src = Self::path_of(&ns, ino).ok_or(libc::ENOENT)?;
        let dst = Self::child_path(&ns, newparent, newname)?;
        self.tx(|tx| {
            db::add_dentry(tx, newparent, newname, ino)?;
            db::push_op(tx, OpKind::Link, ino, &src, &dst)
        })
        .map_err(eio)?;
        let t = now_ns();
        if let Some(n) = ns.nodes.get_mut(&ino) {
            n.links.push((newparent, newname.to_vec()));
            n.ctime = t;
        }
        ns.insert_child(newparent, newname.to_vec(), ino);
        if let Some(p) = ns.nodes.get_mut(&newparent) {
            p.mtime = t;
        }
        self.wake_drainer();
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        Ok(Self::attr_of(ino, n))
    }

    /// Removes the link (parent, name) of `ino`; the node goes when nothing refers to it.
    /// Returns the DB work to do in the caller's transaction.
    fn unlink_node(&self, ns: &mut Ns, parent: u64, name: &[u8], ino: u64) -> R<bool> {
        let (remaining, open, has_base) = {
            let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
            let has_base = n.data.as_ref().is_some_and(|d| d.lock().has_base);
            (n.links.len().saturating_sub(1), n.open, has_base)
        };
        if has_base && (remaining > 0 || open > 0) {
            let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
            self.pin(n, ino)?;
        }
        if let Some(n) = ns.nodes.get_mut(&ino) {
            if let Some(i) = n.links.iter().position(|l| l.0 == parent && l.1 == name) {
                n.links.remove(i);
            }
            n.ctime = now_ns();
        }
        ns.remove_child(parent, name);
        if let Some(p) = ns.nodes.get_mut(&parent) {
            p.mtime = now_ns();
        }
        Ok(remaining == 0 && open == 0)
    }

    pub fn unlink(&self, parent: u64, name: &[u8], dir: bool) -> R<()> {
        check_name(name)?;
        let mut ns = self.ns.lock();
        self.ensure_loaded(&mut ns, parent)?;
        let ino = ns.child(parent, name).ok_or(libc::ENOENT)?;
        let kind = ns.nodes.get(&ino).map(|n| n.kind).ok_or(libc::ENOENT)?;
        if dir {
            if kind != Kind::Dir {
                return Err(libc::ENOTDIR);
            }
            self.ensure_loaded(&mut ns, ino)?;
            if ns.nodes.get(&ino).is_some_and(|n| !n.children.is_empty()) {
                return Err(libc::ENOTEMPTY);
            }
        } else if kind == Kind::Dir {
            return Err(libc::EISDIR);
        }
        let path = Self::child_path(&ns, parent, name)?;
        // Write the journal first: if it fails nothing has changed.
        let gone_if_unlinked = ns
            .nodes
            .get(&ino)
            .is_some_and(|n| n.links.len() <= 1 && n.open == 0);
        self.tx(|tx| {
            db::del_dentry(tx, parent, name)?;
            db::push_op(
                tx,
                if dir { OpKind::Rmdir } else { OpKind::Unlink },
                ino,
                &path,
                &[],
            )?;
            if gone_if_unlinked {
                db::del_inode(tx, ino)?;
            }
            Ok(())
        })
        .map_err(eio)?;
        let gone = self.unlink_node(&mut ns, parent, name, ino)?;
        if gone {
            self.destroy(&mut ns, ino);
        }
        self.wake_drainer();
        Ok(())
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> R<()> {
        if flags & libc::RENAME_EXCHANGE != 0 {
            return Err(libc::EINVAL);
        }
        check_name(name)?;
        check_name(newname)?;
        let mut ns = self.ns.lock();
        self.ensure_loaded(&mut ns, parent)?;
        self.ensure_loaded(&mut ns, newparent)?;
        let src = ns.child(parent, name).ok_or(libc::ENOENT)?;
        let existing = ns.child(newparent, newname);
        if existing == Some(src) {
            return Ok(());
        }
        let src_kind = ns.nodes.get(&src).map(|n| n.kind).ok_or(libc::ENOENT)?;
        if src_kind == Kind::Dir {
            // Not into itself or a descendant.
            let mut cur = newparent;
            loop {
                if cur == src {
                    return Err(libc::EINVAL);
                }
                if cur == ROOT {
                    break;
                }
                cur = ns
                    .nodes
                    .get(&cur)
                    .and_then(|n| n.links.first())
                    .map_or(ROOT, |l| l.0);
            }
        }
        if let Some(e) = existing {
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(libc::EEXIST);
            }
            let ek = ns.nodes.get(&e).map(|n| n.kind).ok_or(libc::ENOENT)?;
            match (src_kind == Kind::Dir, ek == Kind::Dir) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) => {
                    self.ensure_loaded(&mut ns, e)?;
                    if ns.nodes.get(&e).is_some_and(|n| !n.children.is_empty()) {
                        return Err(libc::ENOTEMPTY);
                    }
                }
                _ => {}
            }
        }
        let sp = Self::child_path(&ns, parent, name)?;
        let dp = Self::child_path(&ns, newparent, newname)?;
        let existing_gone = existing.is_some_and(|e| {
            ns.nodes
                .get(&e)
                .is_some_and(|n| n.links.len() <= 1 && n.open == 0)
        });
        self.tx(|tx| {
            db::del_dentry(tx, parent, name)?;
            db::add_dentry(tx, newparent, newname, src)?;
            db::push_op(tx, OpKind::Rename, src, &sp, &dp)?;
            if let (Some(e), true) = (existing, existing_gone) {
                db::del_inode(tx, e)?;
            }
            Ok(())
        })
        .map_err(eio)?;
        if let Some(e) = existing {
            let gone = self.unlink_node(&mut ns, newparent, newname, e)?;
            if gone {
                self.destroy(&mut ns, e);
            }
        }
        let t = now_ns();
        ns.remove_child(parent, name);
        ns.insert_child(newparent, newname.to_vec(), src);
        for d in [parent, newparent] {
            if let Some(p) = ns.nodes.get_mut(&d) {
                p.mtime = t;
            }
        }
        if let Some(n) = ns.nodes.get_mut(&src) {
            if let Some(l) = n.links.iter_mut().find(|l| l.0 == parent && l.1 == name) {
                *l = (newparent, newname.to_vec());
            }
            n.ctime = t;
        }
        self.wake_drainer();
        Ok(())
    }

    /// Clears set-user-ID, and set-group-ID where the group may execute, as a write or
    /// truncate by an unprivileged user does.
    pub fn kill_setid(&self, ino: u64) -> R<()> {
        let mode = {
            let ns = self.ns.lock();
            ns.nodes.get(&ino).ok_or(libc::ENOENT)?.mode
        };
        let mut kill = mode & libc::S_ISUID;
        if mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
            kill |= libc::S_ISGID;
        }
        if kill == 0 {
            return Ok(());
        }
        self.setattr(ino, Some(mode & !kill), None, None, None, None, None)
            .map(|_| ())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn setattr(
        &self,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<Option<SystemTime>>,
        mtime: Option<Option<SystemTime>>,
    ) -> R<Attr> {
        if let Some(s) = size {
            self.truncate(ino, s)?;
        }
        let mut ns = self.ns.lock();
        let t = now_ns();
        let meta_change = mode.is_some() || uid.is_some() || gid.is_some();
        let time_change = atime.is_some() || mtime.is_some();
        {
            let n = ns.nodes.get_mut(&ino).ok_or(libc::ENOENT)?;
            if let Some(m) = mode {
                n.mode = m & 0o7777;
            }
            if let Some(u) = uid {
                n.uid = u;
            }
            if let Some(g) = gid {
                n.gid = g;
            }
            if let Some(a) = atime {
                n.atime = a.map_or(t, ns_of);
            }
            if let Some(m) = mtime {
                n.mtime = m.map_or(t, ns_of);
            }
            if size.is_some() && mtime.is_none() {
                n.mtime = t;
            }
            n.ctime = t;
        }
        if meta_change || time_change {
            let path = Self::path_of(&ns, ino).ok_or(libc::ENOENT)?;
            let row = {
                let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
                let f = n.data.as_ref().map(|d| d.lock());
                row_of(ino, n, f.as_deref())
            };
            self.tx(|tx| {
                db::put_inode(tx, &row)?;
                db::push_op(tx, OpKind::SetAttr, ino, &path, &[])
            })
            .map_err(eio)?;
            self.wake_drainer();
        } else {
            self.persist_node(&ns, ino).map_err(eio)?;
        }
        if size.is_some() {
            let open = ns.nodes.get(&ino).map_or(0, |n| n.open);
            if open == 0 {
                self.queue_data(&ns, ino).map_err(eio)?;
            }
        }
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        Ok(Self::attr_of(ino, n))
    }

    pub fn open(&self, ino: u64) -> R<()> {
        let mut ns = self.ns.lock();
        let n = ns.nodes.get_mut(&ino).ok_or(libc::ENOENT)?;
        if n.kind == Kind::File {
            n.open += 1;
        }
        Ok(())
    }

    /// Last close of a handle: the file is queued for draining if it changed.
    pub fn release(&self, ino: u64) -> R<()> {
        let mut ns = self.ns.lock();
        let (gone, dirty) = {
            let n = ns.nodes.get_mut(&ino).ok_or(libc::ENOENT)?;
            n.open = n.open.saturating_sub(1);
            let dirty = n.data.as_ref().is_some_and(|d| d.lock().dirty);
            (n.links.is_empty() && n.open == 0, dirty)
        };
        if gone {
            self.destroy(&mut ns, ino);
            return Ok(());
        }
        self.persist_node(&ns, ino).map_err(eio)?;
        if dirty {
            self.queue_data(&ns, ino).map_err(eio)?;
        }
        Ok(())
    }

    /// `fsync`: in sync mode the file's data goes down to the array and is flushed there and
    /// the journal is made durable; in async mode the data is in the store's DRAM already.
    pub fn fsync(&self, ino: u64) -> R<()> {
        {
            let ns = self.ns.lock();
            self.persist_node(&ns, ino).map_err(eio)?;
        }
        if self.sync_mode {
            self.sync_all().map_err(eio)?;
        }
        Ok(())
    }

    /// Makes every page and every journal row written before the call durable. Concurrent
    /// callers share one flush (group commit): a caller returns once a flush that started
    /// after it arrived has completed.
    fn sync_all(&self) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let ticket = self.sync_arrived.fetch_add(1, SeqCst) + 1;
        let _g = self.sync_lock.lock();
        if self.sync_covered.load(SeqCst) >= ticket {
            return Ok(());
        }
        // Everyone who arrived until now wrote their data before this flush starts.
        let covers = self.sync_arrived.load(SeqCst);
        self.store.flush()?;
        self.db.lock().make_durable()?;
        self.sync_covered.store(covers, SeqCst);
        Ok(())
    }

    /// The store's background work, until the daemon stops: eviction ahead of need (so a
    /// writer seldom evicts inside its own write), and in sync mode writing dirty DRAM pages
    /// to the array once [`WRITE_BACK_START`] bytes are dirty (not yet durable: `fsync`
    /// makes them so, with less left to write).
    pub fn background_loop(&self) {
        let dram = self.store.status().first().map_or(0, |t| t.capacity_bytes);
        let headroom = (dram / 8).min(128 << 20);
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
            if self.sync_mode && self.store.dirty_bytes() >= WRITE_BACK_START {
                match self.store.write_back(8 * PAGE) {
                    Ok(_) => busy = true,
                    Err(e) => tracing::warn!("background write to the fast tier: {e}"),
                }
            }
            if busy {
                idle = Duration::from_millis(1);
            } else {
                std::thread::sleep(idle);
                idle = (idle * 2).min(Duration::from_millis(20));
            }
        }
    }

    pub fn flush_handle(&self, ino: u64) -> R<()> {
        let ns = self.ns.lock();
        self.persist_node(&ns, ino).map_err(eio)
    }

    // ------------------------------------------------------------------ status

    /// (dirty files, dirty bytes) by a walk of the namespace.
    pub fn dirty_summary(&self) -> (u64, u64) {
        let ns = self.ns.lock();
        let mut files = 0;
        let mut bytes = 0;
        for n in ns.nodes.values() {
            if let Some(d) = &n.data {
                let f = d.lock();
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

    /// Dirty files whose drain is not quarantined.
    pub fn unsettled_dirty_files(&self) -> u64 {
        let stuck = self.stuck_inos.lock().clone();
        let ns = self.ns.lock();
        ns.nodes
            .iter()
            .filter(|(i, n)| {
                !stuck.contains(i)
                    && !n.links.is_empty()
                    && n.data.as_ref().is_some_and(|d| d.lock().dirty)
            })
            .count() as u64
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

pub fn row_of(ino: u64, n: &Node, f: Option<&FileData>) -> InodeRow {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_rel_of_root_is_the_name() {
        assert_eq!(join_rel(b"", b"x"), b"x");
        assert_eq!(join_rel(b"a/b", b"x"), b"a/b/x");
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
