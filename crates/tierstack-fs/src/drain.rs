//! The drainer: replays the namespace journal to BACKING in order.
//!
//! * Namespace rows are applied by the dispatcher thread, one at a time, in `seq` order. Rows
//!   that move or remove existing paths (rename, unlink, rmdir, link, setattr) are barriers:
//!   they wait until no data op is in flight, so every row finds BACKING exactly as the rows
//!   before it left it, also when it is replayed after a crash.
//! * Data rows go to a pool of workers (parallel across files, one at a time per file). A
//!   worker writes the file's whole contents under a temporary name in the destination
//!   directory, fsyncs it, renames it into place and fsyncs the directory: BACKING never shows
//!   a half-written file. Only then is the journal row deleted and the file's pages marked
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

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rustix::fs::OFlags;

use crate::backing::{Attrs, Backing};
use crate::core::{rdev_of, Core, Kind, PAGE, TMP_PREFIX};
use crate::db::{self, JOp, OpKind};

/// Tries of an op that failed with an error that will not heal before it is quarantined.
pub const PERMANENT_TRIES: u32 = 3;

/// Whether BACKING may stop giving this error by itself (space freed, file system remounted
/// read-write, a transient I/O or network error): such errors are retried without end.
pub fn may_heal(e: &io::Error) -> bool {
    match e.raw_os_error() {
        Some(c) => [
            libc::ENOSPC,
            libc::EDQUOT,
            libc::EIO,
            libc::EROFS,
            libc::EAGAIN,
            libc::EINTR,
            libc::ENOMEM,
            libc::ETIMEDOUT,
            libc::ESTALE,
            libc::EBUSY,
            libc::ENOLCK,
            libc::ENFILE,
            libc::EMFILE,
            libc::ENOTCONN,
            libc::ECONNRESET,
            libc::ECONNREFUSED,
            libc::ENETDOWN,
            libc::ENETUNREACH,
            libc::EHOSTUNREACH,
        ]
        .contains(&c),
        // Not an errno: the fast tier or the journal failed, not BACKING's answer.
        None => true,
    }
}

/// A token bucket over bytes written to BACKING.
pub struct RateLimit {
    rate: f64,
    state: Mutex<(Instant, f64)>,
}

impl RateLimit {
    pub fn new(bytes_per_s: u64) -> RateLimit {
        RateLimit {
            rate: bytes_per_s as f64,
            state: Mutex::new((Instant::now(), 0.0)),
        }
    }

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

/// Data ops in flight: per inode, and in all.
#[derive(Default)]
struct Inflight {
    per_ino: HashMap<u64, usize>,
    total: usize,
}

pub struct Drainer {
    core: Arc<Core>,
    jobs: usize,
    rate: Option<RateLimit>,
    inflight: Mutex<Inflight>,
    inflight_cv: Condvar,
    pub stop: AtomicBool,
    /// (time, drained bytes) samples for the drain rate.
    samples: Mutex<VecDeque<(Instant, u64)>>,
    pub retries: AtomicU64,
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((100u64 << attempt.min(6)).min(5000))
}

fn ignore(e: &io::Error, kinds: &[i32]) -> bool {
    e.raw_os_error().is_some_and(|c| kinds.contains(&c))
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// Copies the first `len` bytes of `src` to `dst` inside BACKING (`copy_file_range`, which
/// a file system may do without moving the bytes through us; read and write where it
/// cannot).
fn copy_within_backing(src: &File, dst: &File, len: u64) -> io::Result<()> {
    let mut off = 0u64;
    while off < len {
        let (mut i, mut o) = (off, off);
        match rustix::fs::copy_file_range(
            src,
            Some(&mut i),
            dst,
            Some(&mut o),
            (len - off) as usize,
        ) {
            Ok(0) => break,
            Ok(n) => off += n as u64,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => {
                let mut buf = vec![0u8; PAGE as usize];
                while off < len {
                    let want = (len - off).min(PAGE) as usize;
                    let n = src.read_at(&mut buf[..want], off)?;
                    if n == 0 {
                        break;
                    }
                    dst.write_all_at(&buf[..n], off)?;
                    off += n as u64;
                }
            }
        }
    }
    Ok(())
}

/// The runs of `v` (as byte ranges) made of `block`-sized pieces that are not all zero.
fn nonzero_runs(v: &[u8], block: usize) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, c) in v.chunks(block).enumerate() {
        if c.iter().all(|b| *b == 0) {
            continue;
        }
        let (a, b) = (i * block, i * block + c.len());
        match out.last_mut() {
            Some(last) if last.1 == a => last.1 = b,
            _ => out.push((a, b)),
        }
    }
    out
}

/// The name of the drainer's temporary file for inode `ino` (suffix: a further link).
fn tmp_name(ino: u64, suffix: &str) -> Vec<u8> {
    let mut n = TMP_PREFIX.to_vec();
    n.extend_from_slice(format!("{ino}{suffix}").as_bytes());
    n
}

impl Drainer {
    pub fn new(core: Arc<Core>, jobs: usize, rate: Option<u64>) -> Arc<Drainer> {
        Arc::new(Drainer {
            core,
            jobs: jobs.max(1),
            rate: rate.filter(|r| *r > 0).map(RateLimit::new),
            inflight: Mutex::new(Inflight::default()),
            inflight_cv: Condvar::new(),
            stop: AtomicBool::new(false),
            samples: Mutex::new(VecDeque::new()),
            retries: AtomicU64::new(0),
        })
    }

    /// Starts the dispatcher and the workers.
    pub fn start(self: &Arc<Self>) -> io::Result<Vec<std::thread::JoinHandle<()>>> {
        let (tx, rx) = mpsc::channel::<JOp>();
        let rx = Arc::new(Mutex::new(rx));
        let mut hs = Vec::new();
        for i in 0..self.jobs {
            let me = self.clone();
            let rx = rx.clone();
            hs.push(
                std::thread::Builder::new()
                    .name(format!("drain-{i}"))
                    .spawn(move || me.worker(&rx))?,
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
        s.push_back((now, self.core.drained_bytes.load(Relaxed)));
        while s.len() > 2
            && s.front()
                .is_some_and(|f| now.duration_since(f.0) > Duration::from_secs(5))
        {
            s.pop_front();
        }
    }

    pub fn in_flight(&self) -> usize {
        self.inflight.lock().total
    }

    fn note_error(&self, what: &str, e: &dyn std::fmt::Display) {
        let msg = format!("{what}: {e}");
        tracing::warn!("drain: {msg} (retrying)");
        *self.core.last_error.lock() = Some(msg);
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
        let mut attempt = 0;
        while let Err(e) = self.core.db.lock().quarantine(op, &msg) {
            self.note_error("quarantining a journal row", &e);
            if self.stop.load(Relaxed) {
                return;
            }
            std::thread::sleep(backoff(attempt));
            attempt += 1;
        }
        self.core.stuck_inos.lock().insert(op.ino);
        *self.core.last_error.lock() = Some(format!(
            "{:?} {}: {msg} (quarantined)",
            op.kind,
            String::from_utf8_lossy(&op.p1)
        ));
    }

    /// Applies `op` with `f` until it succeeds (its row is then deleted), BACKING refuses it
    /// for good (quarantined) or the drainer stops (the row stays for the next mount).
    fn apply_with_retry(&self, op: &JOp, f: impl Fn(&JOp) -> io::Result<()>) {
        let mut attempt = 0;
        let mut refused = 0;
        loop {
            match f(op) {
                Ok(()) => {
                    self.finish_row(op.seq);
                    return;
                }
                Err(e) => {
                    if !may_heal(&e) {
                        refused += 1;
                        if refused >= PERMANENT_TRIES {
                            self.quarantine(op, &e);
                            return;
                        }
                    }
                    self.note_error(
                        &format!("{:?} {}", op.kind, String::from_utf8_lossy(&op.p1)),
                        &e,
                    );
                    if self.stop.load(Relaxed) {
                        return;
                    }
                    std::thread::sleep(backoff(attempt));
                    attempt += 1;
                }
            }
        }
    }

    /// Moves the quarantined rows back into the journal once nothing is in flight; the
    /// dispatcher then reads the journal from its start.
    fn release_stuck(&self) -> bool {
        {
            let mut fl = self.inflight.lock();
            while fl.total > 0 {
                self.inflight_cv.wait(&mut fl);
            }
        }
        match self.core.db.lock().release_stuck() {
            Ok(_) => {
                self.core.stuck_inos.lock().clear();
                true
            }
            Err(e) => {
                self.note_error("releasing quarantined rows", &e);
                false
            }
        }
    }

    fn dispatch(self: Arc<Self>, tx: mpsc::Sender<JOp>) {
        let mut last = 0i64;
        loop {
            self.sample();
            if self.stop.load(Relaxed) {
                break;
            }
            if self.core.retry.swap(false, Relaxed) && self.release_stuck() {
                last = 0;
            }
            if self.core.pressure.load(Relaxed) || self.core.force.swap(false, Relaxed) {
                if let Err(e) = self.core.queue_all_dirty() {
                    self.note_error("queueing dirty files", &e);
                }
            }
            let ops = match self.core.db.lock().ops_after(last, 256) {
                Ok(o) => o,
                Err(e) => {
                    self.note_error("reading the journal", &e);
                    std::thread::sleep(Duration::from_millis(500));
                    continue;
                }
            };
            if ops.is_empty() {
                let mut g = self.core.wake_lock.lock();
                self.core
                    .wake_cv
                    .wait_for(&mut g, Duration::from_millis(200));
                continue;
            }
            for op in ops {
                last = op.seq;
                if op.kind == OpKind::Data {
                    let mut fl = self.inflight.lock();
                    while fl.total >= self.jobs || fl.per_ino.get(&op.ino).is_some_and(|c| *c > 0) {
                        self.inflight_cv.wait(&mut fl);
                    }
                    fl.total += 1;
                    *fl.per_ino.entry(op.ino).or_default() += 1;
                    drop(fl);
                    if tx.send(op).is_err() {
                        return;
                    }
                    continue;
                }
                if op.kind.is_barrier() {
                    let mut fl = self.inflight.lock();
                    while fl.total > 0 {
                        self.inflight_cv.wait(&mut fl);
                    }
                }
                self.apply_with_retry(&op, |op| self.apply_meta(op));
                if self.stop.load(Relaxed) {
                    return;
                }
            }
        }
    }

    fn finish_row(&self, seq: i64) {
        let mut attempt = 0;
        while let Err(e) = self.core.db.lock().del_op(seq) {
            self.note_error("deleting a journal row", &e);
            std::thread::sleep(backoff(attempt));
            attempt += 1;
        }
    }

    fn worker(self: Arc<Self>, rx: &Mutex<mpsc::Receiver<JOp>>) {
        loop {
            let op = {
                let r = rx.lock();
                match r.recv() {
                    Ok(op) => op,
                    Err(_) => return,
                }
            };
            self.apply_with_retry(&op, |op| self.drain_file(op));
            let mut fl = self.inflight.lock();
            fl.total -= 1;
            if let Some(c) = fl.per_ino.get_mut(&op.ino) {
                *c -= 1;
                if *c == 0 {
                    fl.per_ino.remove(&op.ino);
                }
            }
            self.inflight_cv.notify_all();
        }
    }

    /// The inode's kind and the owner, mode and times BACKING must show (None: deleted).
    fn attrs_of(&self, ino: u64) -> Option<(Kind, Attrs, Vec<u8>)> {
        let ns = self.core.ns.lock();
        let n = ns.nodes.get(&ino)?;
        Some((
            n.kind,
            Attrs {
                mode: n.mode,
                uid: n.uid,
                gid: n.gid,
                atime: n.atime,
                mtime: n.mtime,
            },
            n.target.clone(),
        ))
    }

    /// Sets mode, owner and times of `name` in `d` from the inode, if it still exists.
    fn apply_attrs(&self, ino: u64, d: &OwnedFd, name: &[u8]) -> io::Result<()> {
        let Some((kind, a, _)) = self.attrs_of(ino) else {
            return Ok(());
        };
        Backing::set_attrs_at(d, name, &a, kind == Kind::Symlink)
    }

    /// Sets mode, owner and times of an open file from the inode, if it still exists.
    fn apply_attrs_fd(&self, ino: u64, f: &File) -> io::Result<()> {
        let Some((_, a, _)) = self.attrs_of(ino) else {
            return Ok(());
        };
        Backing::set_attrs_fd(f, &a)
    }

    /// Applies one namespace row to BACKING (idempotent: a replay after a crash finds its
    /// effect already there and succeeds).
    fn apply_meta(&self, op: &JOp) -> io::Result<()> {
        let bk = &self.core.bk;
        match op.kind {
            OpKind::Mkdir => {
                let (d, name) = bk.parent(&op.p1)?;
                Backing::mkdir(&d, name, 0o700)?;
                self.apply_attrs(op.ino, &d, name)?;
                self.set_bpath(op.ino, Some(&op.p1));
            }
            OpKind::Create => {
                let (d, name) = bk.parent(&op.p1)?;
                let f = Backing::open_in(&d, name, OFlags::WRONLY | OFlags::CREATE, 0o600)?;
                self.apply_attrs_fd(op.ino, &f)?;
                self.set_bpath(op.ino, Some(&op.p1));
            }
            OpKind::Symlink => {
                let (d, name) = bk.parent(&op.p1)?;
                Backing::symlink(&d, name, &op.p2)?;
                self.apply_attrs(op.ino, &d, name)?;
                self.set_bpath(op.ino, Some(&op.p1));
            }
            OpKind::Mknod => {
                // Deleted since: its unlink row follows and finds nothing to remove.
                let Some((kind, a, target)) = self.attrs_of(op.ino) else {
                    return Ok(());
                };
                let (d, name) = bk.parent(&op.p1)?;
                let rdev = if op.p2.is_empty() {
                    rdev_of(&target)
                } else {
                    rdev_of(&op.p2)
                };
                Backing::mknod(&d, name, kind.mode_bits() | (a.mode & 0o7777), rdev)?;
                Backing::set_attrs_at(&d, name, &a, false)?;
                self.set_bpath(op.ino, Some(&op.p1));
            }
            OpKind::Link => {
                let (od, oname) = bk.parent(&op.p1)?;
                let (nd, nname) = bk.parent(&op.p2)?;
                if let Err(e) = Backing::link(&od, oname, &nd, nname) {
                    if e.kind() != io::ErrorKind::AlreadyExists {
                        return Err(e);
                    }
                }
            }
            OpKind::Rename => {
                let (od, oname) = bk.parent(&op.p1)?;
                let (nd, nname) = bk.parent(&op.p2)?;
                if let Err(e) = Backing::rename(&od, oname, &nd, nname) {
                    // Replayed after a crash: the rename is done already.
                    if !(e.kind() == io::ErrorKind::NotFound && Backing::stat(&nd, nname).is_ok()) {
                        return Err(e);
                    }
                }
                Backing::fsync_dir(&nd)?;
                self.rename_bpaths(op.ino, &op.p1, &op.p2);
                self.move_staged(op.ino, &op.p2)?;
            }
            OpKind::Unlink => {
                let (d, name) = bk.parent(&op.p1)?;
                if let Err(e) = Backing::unlink(&d, name, false) {
                    if e.kind() != io::ErrorKind::NotFound {
                        return Err(e);
                    }
                }
                // A file gone for good leaves no staging file behind.
                let gone = self
                    .core
                    .ns
                    .lock()
                    .nodes
                    .get(&op.ino)
                    .is_none_or(|n| n.links.is_empty());
                if gone {
                    let _ = Backing::unlink(&d, &tmp_name(op.ino, ""), false);
                }
                self.clear_bpaths(&op.p1, None);
            }
            OpKind::Rmdir => {
                let (d, name) = bk.parent(&op.p1)?;
                match Backing::unlink(&d, name, true) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) if ignore(&e, &[libc::ENOTEMPTY, libc::EEXIST]) => {
                        // Only temporary files of ours may be left there.
                        let sub = bk.dir(&op.p1)?;
                        for ent in Backing::list(&sub)? {
                            if ent.starts_with(TMP_PREFIX) {
                                Backing::unlink(&sub, &ent, false)?;
                            }
                        }
                        Backing::unlink(&d, name, true)?;
                    }
                    Err(e) => return Err(e),
                }
                self.clear_bpaths(&op.p1, None);
            }
            OpKind::SetAttr => {
                let r = if op.p1.is_empty() {
                    let root = bk.dir(b"")?;
                    self.apply_attrs(op.ino, &root, b".")
                } else {
                    bk.parent(&op.p1)
                        .and_then(|(d, name)| self.apply_attrs(op.ino, &d, name))
                };
                match r {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            OpKind::Xattr => {
                let value = {
                    let ns = self.core.ns.lock();
                    match ns.nodes.get(&op.ino) {
                        Some(n) => n.xattrs.get(&op.p2).cloned(),
                        // Deleted since: nothing to set.
                        None => return Ok(()),
                    }
                };
                let (d, name) = if op.p1.is_empty() {
                    (bk.dir(b"")?, &b"."[..])
                } else {
                    bk.parent(&op.p1)?
                };
                let r = match &value {
                    Some(v) => Backing::set_xattr(&d, name, &op.p2, v),
                    None => Backing::remove_xattr(&d, name, &op.p2),
                };
                match r {
                    Ok(()) => {}
                    // Removed in BACKING since (a later row), nothing to do.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            OpKind::Data => return Err(errno(libc::EINVAL)),
        }
        Ok(())
    }

    fn set_bpath(&self, ino: u64, bp: Option<&[u8]>) {
        let mut ns = self.core.ns.lock();
        if let Some(n) = ns.nodes.get_mut(&ino) {
            n.bpath = bp.map(|b| b.to_vec());
            if let Some(d) = &n.data {
                let mut f = d.lock();
                f.bpath = n.bpath.clone();
                f.base_fd = None;
            }
            if let Err(e) = self.core.tx(|tx| db::set_bpath(tx, ino, bp)) {
                tracing::warn!("recording the backing path of inode {ino}: {e}");
            }
        }
    }

    /// After `path` was removed or replaced in BACKING: nothing is there any more.
    fn clear_bpaths(&self, path: &[u8], except: Option<u64>) {
        let mut changed = Vec::new();
        let mut ns = self.core.ns.lock();
        for (ino, n) in ns.nodes.iter_mut() {
            if Some(*ino) == except {
                continue;
            }
            let Some(bp) = &n.bpath else { continue };
            if under(bp, path) {
                n.bpath = None;
                if let Some(d) = &n.data {
                    let mut f = d.lock();
                    f.bpath = None;
                    f.base_fd = None;
                    if f.has_base && f.staged.is_none() {
                        // Cannot happen: such files are pinned before their last BACKING name
                        // is removed. Keep the pages; they are the file.
                        tracing::error!(
                            "inode {ino} lost its base at {}",
                            String::from_utf8_lossy(path)
                        );
                        f.has_base = false;
                    }
                }
                changed.push(*ino);
            }
        }
        drop(ns);
        let r = self.core.tx(|tx| {
            for i in &changed {
                db::set_bpath(tx, *i, None)?;
            }
            Ok(())
        });
        if let Err(e) = r {
            tracing::warn!("recording backing paths: {e}");
        }
    }

    /// After a file moved to `to`: its staging file (if any, in another directory) follows,
    /// so removing the old directory never removes it.
    fn move_staged(&self, ino: u64, to: &[u8]) -> io::Result<()> {
        let d = {
            let ns = self.core.ns.lock();
            match ns.nodes.get(&ino).and_then(|n| n.data.clone()) {
                Some(d) => d,
                None => return Ok(()),
            }
        };
        let mut f = d.lock();
        let Some(sp) = f.staged.clone() else {
            return Ok(());
        };
        let (sdir, _) = crate::backing::split(&sp);
        let (tdir, _) = crate::backing::split(to);
        if sdir == tdir {
            return Ok(());
        }
        let name = tmp_name(ino, "");
        let (od, oname) = self.core.bk.parent(&sp)?;
        let nd = self.core.bk.dir(tdir)?;
        Backing::rename(&od, oname, &nd, &name)?;
        Backing::fsync_dir(&nd)?;
        let nsp = crate::core::join_rel(tdir, &name);
        f.staged = Some(nsp.clone());
        f.base_fd = None;
        drop(f);
        self.core
            .tx(|tx| {
                tx.execute(
                    "UPDATE inodes SET staged=?2 WHERE ino=?1",
                    rusqlite::params![ino as i64, nsp],
                )?;
                Ok(())
            })
            .map_err(|e| io::Error::other(e.to_string()))
    }

    fn rename_bpaths(&self, ino: u64, from: &[u8], to: &[u8]) {
        self.clear_bpaths(to, Some(ino));
        let mut changed = Vec::new();
        let mut staged = Vec::new();
        let mut ns = self.core.ns.lock();
        for (i, n) in ns.nodes.iter_mut() {
            // Staging files inside a renamed directory move with it.
            if let Some(d) = &n.data {
                let mut f = d.lock();
                if let Some(sp) = f.staged.clone().filter(|sp| under(sp, from)) {
                    let mut ns2 = to.to_vec();
                    ns2.extend_from_slice(&sp[from.len()..]);
                    f.staged = Some(ns2.clone());
                    f.base_fd = None;
                    staged.push((*i, ns2));
                }
            }
            let Some(bp) = &n.bpath else { continue };
            if under(bp, from) {
                let mut nb = to.to_vec();
                nb.extend_from_slice(&bp[from.len()..]);
                n.bpath = Some(nb.clone());
                if let Some(d) = &n.data {
                    let mut f = d.lock();
                    f.bpath = Some(nb.clone());
                    f.base_fd = None;
                }
                changed.push((*i, nb));
            }
        }
        drop(ns);
        let r = self.core.tx(|tx| {
            for (i, b) in &changed {
                db::set_bpath(tx, *i, Some(b))?;
            }
            for (i, sp) in &staged {
                tx.execute(
                    "UPDATE inodes SET staged=?2 WHERE ino=?1",
                    rusqlite::params![*i as i64, sp],
                )?;
            }
            Ok(())
        });
        if let Err(e) = r {
            tracing::warn!("recording backing paths: {e}");
        }
    }

    /// Drains a file's dirty pages into its staging file in BACKING (a temporary name in the
    /// directory of the file, or wherever an earlier pass staged it). While the file is still
    /// open, that is all (the pages are then clean and may leave the fast tier; the staging
    /// file is their base). After the last close, the staging file gets the final size, owner,
    /// mode and times, is synced and renamed into place: BACKING never shows a half-written
    /// file, and each byte is written to BACKING once however often the drain runs.
    fn drain_file(&self, op: &JOp) -> io::Result<()> {
        let c = &self.core;
        let (d, obj, open) = {
            let ns = c.ns.lock();
            match ns.nodes.get(&op.ino) {
                Some(n) if !n.links.is_empty() => match &n.data {
                    Some(d) => (d.clone(), n.obj, n.open > 0),
                    None => return Ok(()),
                },
                // Deleted since: its later unlink removes every path this op would write.
                _ => return Ok(()),
            }
        };
        let (size, start_ver, staged, base) = {
            let mut f = d.lock();
            f.data_pending = false;
            if !f.dirty {
                return Ok(());
            }
            f.min_size = f.size;
            let base = (f.has_base && f.staged.is_none() && f.base_len > 0)
                .then(|| f.bpath.clone().map(|b| (b, f.base_len)))
                .flatten();
            (f.size, f.ver, f.staged.clone(), base)
        };
        let (dir, dname) = c.bk.parent(&op.p1)?;
        let (sdir, sname, srel) = match &staged {
            Some(rel) => {
                let (sd, sn) = c.bk.parent(rel)?;
                (sd, sn.to_vec(), rel.clone())
            }
            None => {
                let name = tmp_name(op.ino, "");
                let (dpart, _) = crate::backing::split(&op.p1);
                let rel = crate::core::join_rel(dpart, &name);
                (c.bk.dir(dpart)?, name, rel)
            }
        };
        let flags = if staged.is_some() {
            OFlags::RDWR | OFlags::CREATE
        } else {
            OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC
        };
        let file = Backing::open_in(&sdir, &sname, flags, 0o600)?;
        let res = (|| -> io::Result<(Vec<(u64, u64)>, u64)> {
            let mut have = match &staged {
                // Bytes a truncation took away since the last pass are not the file's.
                Some(_) => {
                    let keep = d.lock().base_len;
                    file.set_len(keep)?;
                    keep
                }
                None => 0,
            };
            if let Some((brel, blen)) = &base {
                // The file was drained whole before: its unchanged bytes come from there.
                let src = c.bk.open_file(brel, OFlags::RDONLY, 0)?;
                copy_within_backing(&src, &file, *blen)?;
                have = *blen;
            }
            self.write_dirty(&d, obj, size, have, &file)
        })();
        let (drained, written) = match res {
            Ok(v) => v,
            Err(e) => {
                if staged.is_none() {
                    let _ = Backing::unlink(&sdir, &sname, false);
                }
                return Err(e);
            }
        };
        if open {
            file.sync_data()?;
            if staged.is_none() {
                Backing::fsync_dir(&sdir)?;
            }
        } else {
            let finish = || -> io::Result<()> {
                file.set_len(size)?;
                self.apply_attrs_fd(op.ino, &file)?;
                // The renamed file replaces the old one in BACKING: it takes the extended
                // attributes along. A BACKING without them reports it through the xattr rows.
                let xattrs =
                    c.ns.lock()
                        .nodes
                        .get(&op.ino)
                        .map(|n| n.xattrs.clone())
                        .unwrap_or_default();
                for (k, v) in &xattrs {
                    if let Err(e) = Backing::set_xattr_fd(&file, k, v) {
                        tracing::warn!(
                            "drain: xattr {} of {}: {e}",
                            String::from_utf8_lossy(k),
                            String::from_utf8_lossy(&op.p1)
                        );
                    }
                }
                file.sync_all()?;
                Backing::rename(&sdir, &sname, &dir, dname)?;
                // Further hard links of the file.
                for (i, other) in op
                    .p2
                    .split(|b| *b == 0)
                    .filter(|p| !p.is_empty())
                    .enumerate()
                {
                    let (odir, oname) = c.bk.parent(other)?;
                    let t2 = tmp_name(op.ino, &format!(".l{i}"));
                    let _ = Backing::unlink(&odir, &t2, false);
                    Backing::link(&dir, dname, &odir, &t2)?;
                    Backing::rename(&odir, &t2, &odir, oname)?;
                    Backing::fsync_dir(&odir)?;
                }
                Backing::fsync_dir(&sdir)?;
                Backing::fsync_dir(&dir)
            };
            if let Err(e) = finish() {
                if staged.is_none() {
                    let _ = Backing::unlink(&sdir, &sname, false);
                }
                return Err(e);
            }
        }
        let base_blocks = {
            use std::os::unix::fs::MetadataExt;
            file.metadata().map_or(size.div_ceil(512), |m| m.blocks())
        };
        // BACKING holds the contents now (staged or in place): record that durably before
        // anything is dropped.
        {
            let mut f = d.lock();
            for (p, ver) in &drained {
                if let Some(pg) = f.pages.get_mut(p) {
                    if pg.ver == *ver && pg.dirty {
                        pg.dirty = false;
                        c.dirty_bytes.fetch_sub(pg.len as u64, Relaxed);
                    }
                }
            }
            f.has_base = true;
            f.base_len = size.min(f.min_size);
            f.base_blocks = base_blocks;
            f.base_fd = None;
            if open {
                // Not in place yet: the drain after the last close renames it.
                f.staged = Some(srel.clone());
                f.dirty = true;
            } else {
                f.staged = None;
                f.bpath = Some(op.p1.clone());
                f.dirty = f.ver != start_ver;
            }
            let row = (
                f.has_base,
                f.base_len,
                f.dirty,
                f.bpath.clone(),
                f.staged.clone(),
            );
            drop(f);
            let r = c.tx(|tx| {
                tx.execute(
                    "UPDATE inodes SET has_base=?2, base_len=?3, dirty=?4, bpath=?5, staged=?6 WHERE ino=?1",
                    rusqlite::params![
                        op.ino as i64,
                        row.0 as i64,
                        row.1 as i64,
                        row.2 as i64,
                        row.3,
                        row.4
                    ],
                )?;
                Ok(())
            });
            if let Err(e) = r {
                return Err(io::Error::other(e.to_string()));
            }
        }
        if !open {
            let mut ns = c.ns.lock();
            if let Some(n) = ns.nodes.get_mut(&op.ino) {
                n.bpath = Some(op.p1.clone());
            }
        }
        c.drained_bytes.fetch_add(written, Relaxed);
        if c.pressure.load(Relaxed) {
            c.drop_clean(0);
        }
        c.notify_space();
        Ok(())
    }

    /// Writes the dirty pages of a file below `size` to `out`; `have`: bytes `out` already
    /// holds (an all-zero page past them is a hole and is not written). Returns the (page,
    /// version) of the pages written and the bytes written.
    fn write_dirty(
        &self,
        d: &Mutex<crate::core::FileData>,
        obj: u64,
        size: u64,
        have: u64,
        out: &File,
    ) -> io::Result<(Vec<(u64, u64)>, u64)> {
        let c = &self.core;
        let dirty: Vec<u64> = {
            let f = d.lock();
            f.pages
                .iter()
                .filter(|(p, pg)| pg.dirty && **p * PAGE < size)
                .map(|(p, _)| *p)
                .collect()
        };
        let mut drained = Vec::new();
        let mut written = 0u64;
        for p in dirty {
            let (data, ver) = {
                let mut f = d.lock();
                let Some(ver) = f.pages.get(&p).filter(|pg| pg.dirty).map(|pg| pg.ver) else {
                    continue;
                };
                let v = c
                    .read_page(obj, &mut f, p, false)
                    .map_err(|e| io::Error::other(e.to_string()))?;
                (v, ver)
            };
            let Some(page) = data else { continue };
            let lim = (size - p * PAGE).min(PAGE) as usize;
            // A page that grew past the size this drain writes (the file was written to
            // since) is not all in BACKING: it stays dirty.
            if page.len() <= lim {
                drained.push((p, ver));
            }
            let v = &page[..lim.min(page.len())];
            // Past what `out` holds, runs of zero blocks stay holes.
            let runs: Vec<(usize, usize)> = if p * PAGE >= have {
                nonzero_runs(v, 4096)
            } else {
                vec![(0, v.len())]
            };
            for (a, b) in runs {
                if let Some(r) = &self.rate {
                    r.take((b - a) as u64);
                }
                out.write_all_at(&v[a..b], p * PAGE + a as u64)?;
                written += (b - a) as u64;
            }
        }
        Ok((drained, written))
    }

    /// Whether nothing waits: no journal rows, no dirty file, nothing in flight.
    pub fn idle(&self) -> bool {
        let ops = self.core.db.lock().count_ops().unwrap_or(1);
        ops == 0 && self.in_flight() == 0 && self.core.dirty_summary().0 == 0
    }

    /// Whether nothing waits but what is quarantined: no journal rows, nothing in flight,
    /// and every dirty file one whose drain is quarantined.
    pub fn settled(&self) -> bool {
        let ops = self.core.db.lock().count_ops().unwrap_or(1);
        ops == 0 && self.in_flight() == 0 && self.core.unsettled_dirty_files() == 0
    }
}

fn under(p: &[u8], root: &[u8]) -> bool {
    p == root || (p.len() > root.len() && p.starts_with(root) && p[root.len()] == b'/')
}

pub fn tmp_path(dir: &Path, ino: u64) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    dir.join(std::ffi::OsStr::from_bytes(&tmp_name(ino, "")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_matches_whole_components() {
        assert!(under(b"a/b", b"a"));
        assert!(under(b"a", b"a"));
        assert!(!under(b"ab", b"a"));
        assert!(!under(b"a", b"a/b"));
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

    #[test]
    fn nonzero_runs_skip_zero_blocks() {
        let mut v = vec![0u8; 5 * 4096 + 10];
        v[4096] = 1;
        v[2 * 4096 + 5] = 1;
        v[5 * 4096 + 9] = 1;
        assert_eq!(
            nonzero_runs(&v, 4096),
            vec![(4096, 3 * 4096), (5 * 4096, 5 * 4096 + 10)]
        );
        assert!(nonzero_runs(&[0u8; 8192], 4096).is_empty());
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(0), Duration::from_millis(100));
        assert!(backoff(3) > backoff(2));
        assert_eq!(backoff(30), Duration::from_millis(5000));
    }
}
