//! Namespace rows applied to BACKING (create, mkdir, symlink, special files, link, unlink,
//! rmdir, rename, setattr, xattrs). The namespace's side of each (the backing paths it
//! keeps, the bases it pins before BACKING's copy goes) is done by the core's methods.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;

use rustix::fs::OFlags;

use crate::backing::Backing;
use crate::core::{rdev_of, Holders, Kind, TMP_PREFIX};
use crate::db::{JOp, OpKind};

use super::{tmp_name, Drainer};

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
    /// Sets mode, owner and times of `name` in `d` from the inode, if it still exists.
    pub(super) fn apply_attrs(&self, ino: u64, d: &OwnedFd, name: &[u8]) -> io::Result<()> {
        let Some((kind, a, _)) = self.core.backing_attrs(ino) else {
            return Ok(());
        };
        Backing::set_attrs_at(d, name, &a, kind == Kind::Symlink)
    }

    /// Sets mode, owner and times of an open file from the inode, if it still exists.
    pub(super) fn apply_attrs_fd(&self, ino: u64, f: &File) -> io::Result<()> {
        let Some((_, a, _)) = self.core.backing_attrs(ino) else {
            return Ok(());
        };
        Backing::set_attrs_fd(f, &a)
    }

    /// Applies one namespace row to BACKING (idempotent: a replay after a crash finds its
    /// effect already there and succeeds).
    pub(super) fn apply_meta(&self, op: &JOp) -> io::Result<()> {
        let bk = self.core.backing();
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
                self.core.set_backing_path(op.ino, Some(&op.p1));
            }
            OpKind::Create => {
                let (d, name) = bk.parent(&op.p1)?;
                let f = Backing::open_in(&d, name, OFlags::WRONLY | OFlags::CREATE, 0o600)?;
                self.apply_attrs_fd(op.ino, &f)?;
                self.core.set_backing_path(op.ino, Some(&op.p1));
            }
            OpKind::Symlink => {
                let (d, name) = bk.parent(&op.p1)?;
                Backing::symlink(&d, name, &op.p2)?;
                self.apply_attrs(op.ino, &d, name)?;
                self.core.set_backing_path(op.ino, Some(&op.p1));
            }
            OpKind::Mknod => {
                let (d, name) = bk.parent(&op.p1)?;
                match self.core.backing_attrs(op.ino) {
                    Some((kind, a, target)) => {
                        let rdev = if op.p2.is_empty() {
                            rdev_of(&target)
                        } else {
                            rdev_of(&op.p2)
                        };
                        Backing::mknod(&d, name, kind.mode_bits() | (a.mode & 0o7777), rdev)?;
                        Backing::set_attrs_at(&d, name, &a, false)?;
                        self.core.set_backing_path(op.ino, Some(&op.p1));
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
                self.core
                    .pin_bases_under(&op.p2, Holders::AllBut(Some(op.ino)), &self.pinned)?;
                // From here until the row is deleted, BACKING and the backing paths below
                // differ: a crash in between is mended by the next start (`Drainer::start`).
                self.core
                    .mark_in_flight(op.seq)
                    .map_err(|e| io::Error::other(e.to_string()))?;
                // Reads of bases below find them at either path until the paths follow.
                self.core.moving_backing(Some((&op.p1, &op.p2)));
                let r = Backing::rename(&od, oname, &nd, nname).or_else(|e| {
                    // Replayed after a crash: the rename is done already.
                    if e.kind() == io::ErrorKind::NotFound && Backing::stat(&nd, nname).is_ok() {
                        Ok(())
                    } else {
                        Err(e)
                    }
                });
                if let Err(e) = r.and_then(|()| Backing::fsync_dir(&nd)) {
                    self.core.moving_backing(None);
                    return Err(e);
                }
                self.core.rename_backing_paths(op.ino, &op.p1, &op.p2);
                self.core.moving_backing(None);
                self.core
                    .move_staged(op.ino, &op.p2, &tmp_name(op.ino, ""))?;
                // A file this rename replaced may leave a staging file behind.
                self.sweep_due
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            OpKind::Unlink => {
                // Its folder removed from BACKING by someone else: the name is gone already
                // (and any base there with it: nothing to pin).
                let Some((d, name)) = present(bk.parent(&op.p1))? else {
                    self.core.clear_backing_paths(&op.p1, Holders::Only(op.ino));
                    return Ok(());
                };
                // Still named elsewhere in BACKING (a hard link): its base moves there.
                self.core.move_base_to_link(op.ino, &op.p1);
                self.core
                    .pin_bases_under(&op.p1, Holders::Only(op.ino), &self.pinned)?;
                if let Err(e) = Backing::unlink(&d, name, false) {
                    if e.kind() != io::ErrorKind::NotFound {
                        return Err(e);
                    }
                }
                // A file with no name left leaves no staging file behind (one still open
                // keeps its contents: pinned first).
                if self.core.unlinked(op.ino) {
                    let (dir, _) = crate::backing::split(&op.p1);
                    let staging = crate::core::join_rel(dir, &tmp_name(op.ino, ""));
                    tracing::debug!(
                        "unlink of inode {}'s last name: its staging file {} goes",
                        op.ino,
                        String::from_utf8_lossy(&staging)
                    );
                    self.core
                        .pin_bases_under(&staging, Holders::Only(op.ino), &self.pinned)?;
                    let _ = Backing::unlink(&d, &tmp_name(op.ino, ""), false);
                }
                self.core.clear_backing_paths(&op.p1, Holders::Only(op.ino));
            }
            OpKind::Rmdir => {
                let Some((d, name)) = present(bk.parent(&op.p1))? else {
                    self.core.clear_backing_paths(&op.p1, Holders::AllBut(None));
                    return Ok(());
                };
                self.core
                    .pin_bases_under(&op.p1, Holders::AllBut(None), &self.pinned)?;
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
                self.core.clear_backing_paths(&op.p1, Holders::AllBut(None));
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
                let Some(value) = self.core.node_xattr(op.ino, &op.p2) else {
                    // Deleted since: nothing to set.
                    return Ok(());
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
}

/// `r`'s value, or None when it failed because something on the way is not there.
fn present<T>(r: io::Result<T>) -> io::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
