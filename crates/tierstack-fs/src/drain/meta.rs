//! Namespace rows applied to BACKING (create, mkdir, symlink, special files, link, unlink,
//! rmdir, rename, setattr, xattrs) and the bookkeeping of the namespace's backing paths.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;

use rustix::fs::OFlags;

use crate::backing::{Attrs, Backing};
use crate::core::{rdev_of, Kind, TMP_PREFIX};
use crate::db::{self, JOp, OpKind};

use super::{tmp_name, under, Drainer};

pub(super) fn ignore(e: &io::Error, kinds: &[i32]) -> bool {
    e.raw_os_error().is_some_and(|c| kinds.contains(&c))
}

/// The file-type bits a mknod row carries after its device number (rows of older journals
/// carry none: a FIFO stands in, only ever to be removed again).
fn mknod_type(p2: &[u8]) -> u32 {
    p2.get(8..12)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
        .filter(|t| [libc::S_IFIFO, libc::S_IFSOCK, libc::S_IFCHR, libc::S_IFBLK].contains(t))
        .unwrap_or(libc::S_IFIFO)
}

pub(super) fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl Drainer {
    /// The inode's kind and the owner, mode and times BACKING must show (None: deleted).
    pub(super) fn attrs_of(&self, ino: u64) -> Option<(Kind, Attrs, Vec<u8>)> {
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
    pub(super) fn apply_attrs(&self, ino: u64, d: &OwnedFd, name: &[u8]) -> io::Result<()> {
        let Some((kind, a, _)) = self.attrs_of(ino) else {
            return Ok(());
        };
        Backing::set_attrs_at(d, name, &a, kind == Kind::Symlink)
    }

    /// Sets mode, owner and times of an open file from the inode, if it still exists.
    pub(super) fn apply_attrs_fd(&self, ino: u64, f: &File) -> io::Result<()> {
        let Some((_, a, _)) = self.attrs_of(ino) else {
            return Ok(());
        };
        Backing::set_attrs_fd(f, &a)
    }

    /// Applies one namespace row to BACKING (idempotent: a replay after a crash finds its
    /// effect already there and succeeds).
    pub(super) fn apply_meta(&self, op: &JOp) -> io::Result<()> {
        let bk = &self.core.bk;
        tracing::debug!(
            "replay {} {:?} inode {} {} {}",
            op.seq,
            op.kind,
            op.ino,
            String::from_utf8_lossy(&op.p1),
            String::from_utf8_lossy(&op.p2)
        );
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
                let (d, name) = bk.parent(&op.p1)?;
                match self.attrs_of(op.ino) {
                    Some((kind, a, target)) => {
                        let rdev = if op.p2.is_empty() {
                            rdev_of(&target)
                        } else {
                            rdev_of(&op.p2)
                        };
                        Backing::mknod(&d, name, kind.mode_bits() | (a.mode & 0o7777), rdev)?;
                        Backing::set_attrs_at(&d, name, &a, false)?;
                        self.set_bpath(op.ino, Some(&op.p1));
                    }
                    None => {
                        // Gone from the namespace since, but the rows after this one (a
                        // rename or link of the node, then its removal) act on it in
                        // BACKING: make it as it was made (its type is in the row), owned
                        // by nobody but root, for them to find.
                        let ty = mknod_type(&op.p2);
                        Backing::mknod(&d, name, ty | 0o600, rdev_of(&op.p2))?;
                    }
                }
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
                self.pin_bases_under(&op.p2, Some(op.ino))?;
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
                self.pin_bases_under(&op.p1, None)?;
                if let Err(e) = Backing::unlink(&d, name, false) {
                    if e.kind() != io::ErrorKind::NotFound {
                        return Err(e);
                    }
                }
                // A file with no name left leaves no staging file behind (one still open
                // keeps its contents: pinned first).
                let gone = self
                    .core
                    .ns
                    .lock()
                    .nodes
                    .get(&op.ino)
                    .is_none_or(|n| n.links.is_empty());
                if gone {
                    let (dir, _) = crate::backing::split(&op.p1);
                    let staging = crate::core::join_rel(dir, &tmp_name(op.ino, ""));
                    tracing::debug!(
                        "unlink of inode {}'s last name: its staging file {} goes",
                        op.ino,
                        String::from_utf8_lossy(&staging)
                    );
                    self.pin_bases_under(&staging, None)?;
                    let _ = Backing::unlink(&d, &tmp_name(op.ino, ""), false);
                }
                self.clear_bpaths(&op.p1, None);
            }
            OpKind::Rmdir => {
                let (d, name) = bk.parent(&op.p1)?;
                self.pin_bases_under(&op.p1, None)?;
                match Backing::unlink(&d, name, true) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) if ignore(&e, &[libc::ENOTEMPTY, libc::EEXIST]) => {
                        // Only temporary files of ours may be left there.
                        let sub = bk.dir(&op.p1)?;
                        for ent in Backing::list(&sub)? {
                            if ent.starts_with(TMP_PREFIX) {
                                tracing::debug!(
                                    "rmdir {}: removes {}",
                                    String::from_utf8_lossy(&op.p1),
                                    String::from_utf8_lossy(&ent)
                                );
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

    /// Before `path` is removed or replaced in BACKING: every file still in the namespace
    /// (another name, an open handle) whose base lies there (its name in BACKING or its
    /// staging file) gets the base's data copied into the fast tier, and that is made
    /// durable (store and journal) before the caller touches BACKING. `except`: the node a
    /// rename moves there (its base is at its old path).
    pub(super) fn pin_bases_under(&self, path: &[u8], except: Option<u64>) -> io::Result<()> {
        let victims: Vec<_> = {
            let ns = self.core.ns.lock();
            ns.nodes
                .iter()
                .filter(|(i, _)| Some(**i) != except)
                .filter_map(|(i, n)| {
                    let d = n.data.as_ref()?;
                    let f = d.lock();
                    let bp = f.base_path()?;
                    (f.has_base && under(bp, path)).then(|| (*i, n.obj, d.clone()))
                })
                .collect()
        };
        if victims.is_empty() {
            return Ok(());
        }
        for (ino, obj, d) in &victims {
            let mut f = d.lock();
            self.core
                .pin_base(*ino, *obj, &mut f)
                .map_err(|e| io::Error::other(e.to_string()))?;
            self.pinned
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.core
            .store
            .flush()
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.core
            .db
            .lock()
            .make_durable()
            .map_err(|e| io::Error::other(e.to_string()))
    }

    pub(super) fn set_bpath(&self, ino: u64, bp: Option<&[u8]>) {
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
    pub(super) fn clear_bpaths(&self, path: &[u8], except: Option<u64>) {
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
    pub(super) fn move_staged(&self, ino: u64, to: &[u8]) -> io::Result<()> {
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
        tracing::debug!(
            "inode {ino}'s staging file moves from {} to {}",
            String::from_utf8_lossy(&sp),
            String::from_utf8_lossy(&nsp)
        );
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

    pub(super) fn rename_bpaths(&self, ino: u64, from: &[u8], to: &[u8]) {
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
                    tracing::debug!(
                        "inode {i}'s staging file {} is now {} (directory renamed)",
                        String::from_utf8_lossy(&sp),
                        String::from_utf8_lossy(&ns2)
                    );
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
}
