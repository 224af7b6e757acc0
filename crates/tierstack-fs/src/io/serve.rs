//! The interception client's calls served by the mount: a path walked in the namespace from
//! the root, the kernel's permission rules applied where they can be decided here, and the
//! operation handed to [`TierFs::answer`], the same handler the FUSE transports use (so its
//! timing, journal and drain are the mount's own).
//!
//! A `stat`, an open and a close answer with the change counts their facts rest on (see
//! `tierstack_ioproto::vers`), each read before its fact: every directory walked (who may
//! walk through it), every name looked up (the names its folder lost, or gained for a name
//! not there), and the node's attributes; the client keeps them while the counts hold.
//!
//! What is not decided here is answered [`Rep::Fallback`], and the client makes the call
//! through the kernel instead: a symbolic link on the way (its target may leave the mount), a
//! `..` above the root, directories and special files to open, a node whose permission
//! depends on group membership or an ACL the daemon cannot see, a sticky directory.
//!
//! Coherence with the kernel's view (another process, a shell's `ls`): before the answer
//! goes back, every entry the call added, removed or renamed is invalidated in the kernel's
//! dentry cache (a negative entry for a name the client created would hide it for the
//! coherence interval), and the written range and the attributes of a file the client
//! wrote or truncated in its page and attribute caches (`FUSE_NOTIFY_INVAL_INODE`, which
//! first writes back any page the kernel holds dirty, so a write through the kernel that
//! came before is not written over the client's later one).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use fuser::{INodeNo, Notifier};
use tierstack_ioproto::msg::{put_entry, Entry};
use tierstack_ioproto::vers;
use tierstack_ioproto::{Deps, Rep, Req, SetAttr, Time, WireAttr};

use crate::attr::{Attr, Kind};
use crate::core::{Counts, ROOT};
use crate::fuse::{Caller, Op, Out, TierFs};

/// Why a walk stops short of an answer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// An errno for the program.
    Err(i32),
    /// The kernel is to make the call.
    Fallback,
}

type R<T> = std::result::Result<T, Stop>;

/// What a walk rests on (see `tierstack_ioproto::vers`).
#[derive(Default)]
struct Walk {
    /// The counts read, each before its fact.
    deps: Deps,
    /// It failed with ENOENT for its last name (not on the way).
    last_missing: bool,
}

impl From<i32> for Stop {
    fn from(e: i32) -> Stop {
        Stop::Err(e)
    }
}

const R_OK: u32 = 4;
const W_OK: u32 = 2;
const X_OK: u32 = 1;

/// Whether `caller` may do `want` (`R_OK | W_OK | X_OK` bits) to a node of attributes `a`,
/// as the kernel's `generic_permission` decides it, where that can be decided from the mode
/// alone: root (execute needs an execute bit on a non-directory), the owner (the owner bits,
/// which an ACL does not change), anyone else when the group and other bits agree and there
/// is no ACL (`has_acl`). Otherwise [`Stop::Fallback`]. Pure.
pub(super) fn may(a: &Attr, caller: Caller, want: u32, has_acl: impl FnOnce() -> bool) -> R<()> {
    let want = want & 7;
    if caller.uid == 0 {
        let exec_ok = a.kind == Kind::Dir || a.mode & 0o111 != 0;
        return if want & X_OK != 0 && !exec_ok {
            Err(Stop::Err(libc::EACCES))
        } else {
            Ok(())
        };
    }
    let ok = |bits: u32| bits & want == want;
    if caller.uid == a.uid {
        return if ok(a.mode >> 6) {
            Ok(())
        } else {
            Err(Stop::Err(libc::EACCES))
        };
    }
    let (group, other) = (ok(a.mode >> 3), ok(a.mode));
    if group == other && !has_acl() {
        return if group {
            Ok(())
        } else {
            Err(Stop::Err(libc::EACCES))
        };
    }
    Err(Stop::Fallback)
}

/// Whether `caller` may make the changes of `set` to a node of attributes `a`, as the
/// kernel's `setattr_prepare` decides: a mode, explicit times or a group by the owner or
/// root, an owner by root only, the present time also by anyone who may write. What depends
/// on group membership is [`Stop::Fallback`]. Pure but for `writable` (asked last).
pub(super) fn may_setattr(
    a: &Attr,
    caller: Caller,
    set: &SetAttr,
    writable: impl FnOnce() -> R<()>,
) -> R<()> {
    if caller.uid == 0 {
        return Ok(());
    }
    let owner = caller.uid == a.uid;
    if set.uid.is_some_and(|u| u != a.uid) {
        return Err(Stop::Err(libc::EPERM));
    }
    if let Some(g) = set.gid {
        if !owner {
            return Err(Stop::Err(libc::EPERM));
        }
        if g != caller.gid && g != a.gid {
            return Err(Stop::Fallback);
        }
    }
    if let Some(m) = set.mode {
        if !owner {
            return Err(Stop::Err(libc::EPERM));
        }
        // The kernel clears set-group-ID for an owner outside the file's group.
        if m & libc::S_ISGID != 0 && a.gid != caller.gid {
            return Err(Stop::Fallback);
        }
    }
    let explicit = matches!(set.atime, Time::At(_)) || matches!(set.mtime, Time::At(_));
    if explicit && !owner {
        return Err(Stop::Err(libc::EPERM));
    }
    let now = set.atime == Time::Now || set.mtime == Time::Now;
    if now && !owner {
        return writable();
    }
    Ok(())
}

fn system_time(t: Time) -> Option<Option<std::time::SystemTime>> {
    match t {
        Time::Omit => None,
        Time::Now => Some(None),
        Time::At(ns) => Some(Some(if ns >= 0 {
            std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns as u64)
        } else {
            std::time::UNIX_EPOCH - std::time::Duration::from_nanos(ns.unsigned_abs())
        })),
    }
}

/// The answer for a result: the errno or "fallback" of a stop.
fn rep_of(r: R<Rep<'_>>) -> Rep<'_> {
    match r {
        Ok(rep) => rep,
        Err(Stop::Err(e)) => Rep::Err(e),
        Err(Stop::Fallback) => Rep::Fallback,
    }
}

/// The permission `open`'s flags need.
pub(super) fn open_wants(flags: i32) -> u32 {
    let acc = match flags & libc::O_ACCMODE {
        libc::O_WRONLY => W_OK,
        libc::O_RDWR => R_OK | W_OK,
        _ => R_OK,
    };
    acc | if flags & libc::O_TRUNC != 0 { W_OK } else { 0 }
}

/// The components of `path` that name something (empty and `.` ones dropped), and whether
/// it ends with a `/` (then its last node must be a directory).
pub(super) fn components(path: &[u8]) -> (Vec<&[u8]>, bool) {
    let parts = path
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    (parts, path.last() == Some(&b'/'))
}

/// Attributes as `stat` shows them.
pub(super) fn wire_attr(a: &Attr) -> WireAttr {
    WireAttr {
        ino: a.ino,
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        mode: a.kind.mode_bits() | (a.mode & 0o7777),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
    }
}

/// The `DT_*` type of a node of kind `k` (a directory entry's `d_type`).
fn dt_of(k: Kind) -> u8 {
    match k {
        Kind::File => libc::DT_REG,
        Kind::Dir => libc::DT_DIR,
        Kind::Symlink => libc::DT_LNK,
        Kind::Fifo => libc::DT_FIFO,
        Kind::Socket => libc::DT_SOCK,
        Kind::CharDev => libc::DT_CHR,
        Kind::BlockDev => libc::DT_BLK,
    }
}

/// What [`Server::entry`] expects of the name: to be made, to be removed, either.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    New,
    Old,
    Any,
}

/// One client's view of the mount: what it needs to serve a request.
pub(super) struct Server<'a> {
    pub(super) fs: &'a TierFs,
    pub(super) notifier: Option<&'a Notifier>,
    pub(super) caller: Caller,
}

impl Server<'_> {
    fn has_acl(&self, ino: u64) -> bool {
        self.fs
            .core
            .getxattr(ino, b"system.posix_acl_access")
            .is_ok()
    }

    fn may(&self, a: &Attr, want: u32) -> R<()> {
        may(a, self.caller, want, || self.has_acl(a.ino))
    }

    /// The directory that holds the last component of `path` (walked from node `base`, 0:
    /// the root), and that component (None for the start itself; a path ending in `..` is
    /// left to the kernel).
    fn parent_of<'p>(&self, base: u64, path: &'p [u8]) -> R<(Attr, Option<&'p [u8]>)> {
        self.parent_of_v(base, path, &mut Walk::default())
            .map(|(a, _, last)| (a, last))
    }

    /// As [`Server::parent_of`], noting in `w` the counts the walk rests on (see
    /// `tierstack_ioproto::vers`): each directory's permission count and each name's count,
    /// read before the fact; with the directory's counts.
    fn parent_of_v<'p>(
        &self,
        base: u64,
        path: &'p [u8],
        w: &mut Walk,
    ) -> R<(Attr, Counts, Option<&'p [u8]>)> {
        let core = &self.fs.core;
        let (parts, _) = components(path);
        let (mut dir, mut counts) = core.getattr_v(if base == 0 { ROOT } else { base })?;
        if dir.kind != Kind::Dir {
            return Err(Stop::Err(libc::ENOTDIR));
        }
        w.deps.push(vers::perm_slot(dir.ino), counts.perm());
        let Some((last, walk)) = parts.split_last() else {
            return Ok((dir, counts, None));
        };
        for c in walk {
            self.may(&dir, X_OK)?;
            if *c == b".." {
                if dir.ino == ROOT {
                    return Err(Stop::Fallback);
                }
                // What `..` names changes with renames of the directory, which count only
                // its names: such a walk is not kept.
                w.deps.spoil();
                (dir, counts) = (core.lookup(dir.ino, b"..")?, Counts::default());
                continue;
            }
            let ((slot, named), r) = core.lookup_v(dir.ino, c);
            w.deps.push(slot, named);
            let (a, ac) = r?;
            match a.kind {
                Kind::Dir => {
                    w.deps.push(vers::perm_slot(a.ino), ac.perm());
                    (dir, counts) = (a, ac);
                }
                Kind::Symlink => return Err(Stop::Fallback),
                _ => return Err(Stop::Err(libc::ENOTDIR)),
            }
        }
        if *last == b".." {
            return Err(Stop::Fallback);
        }
        self.may(&dir, X_OK)?;
        Ok((dir, counts, Some(last)))
    }

    /// The node `path` names (a final symbolic link followed only by the kernel).
    fn node(&self, base: u64, path: &[u8], follow: bool) -> R<Attr> {
        self.node_v(base, path, follow, &mut Walk::default())
    }

    /// As [`Server::node`], noting the counts the answer rests on in `w` (the node's
    /// attribute count last), and whether it failed for want of the last name.
    fn node_v(&self, base: u64, path: &[u8], follow: bool, w: &mut Walk) -> R<Attr> {
        let (dir, counts, last) = self.parent_of_v(base, path, w)?;
        let Some(name) = last else {
            w.deps.push(vers::attr_slot(dir.ino), counts.attr());
            return Ok(dir);
        };
        let ((slot, named), r) = self.fs.core.lookup_v(dir.ino, name);
        w.deps.push(slot, named);
        let (a, ac) = r.inspect_err(|&e| w.last_missing = e == libc::ENOENT)?;
        if a.kind == Kind::Symlink && (follow || path.last() == Some(&b'/')) {
            return Err(Stop::Fallback);
        }
        if path.last() == Some(&b'/') && a.kind != Kind::Dir {
            return Err(Stop::Err(libc::ENOTDIR));
        }
        w.deps.push(vers::attr_slot(a.ino), ac.attr());
        Ok(a)
    }

    /// The answer to a `stat`: the attributes with what they rest on, or the absence of the
    /// last name with what it rests on (kept by the client for at most the negative-entry
    /// time the kernel gets).
    fn stat(&self, base: u64, path: &[u8], follow: bool) -> R<Rep<'static>> {
        let mut w = Walk::default();
        match self.node_v(base, path, follow, &mut w) {
            Ok(a) => Ok(Rep::Known {
                attr: wire_attr(&a),
                deps: w.deps,
            }),
            Err(Stop::Err(libc::ENOENT)) if w.last_missing => Ok(Rep::Absent {
                deps: w.deps,
                ttl_ms: u32::try_from(self.fs.core.negative_ttl().as_millis()).unwrap_or(u32::MAX),
            }),
            Err(e) => Err(e),
        }
    }

    /// The directory and name of a path that is to be made or removed, with write and search
    /// permission on the directory checked (a sticky directory is left to the kernel). The
    /// name is looked up first, as the kernel does before it checks the directory's write
    /// permission (or the node's kind): a name to be made that exists is EEXIST, a name to
    /// be removed that does not is ENOENT.
    fn entry<'p>(&self, base: u64, path: &'p [u8], want: Want) -> R<(Attr, &'p [u8])> {
        // `.` or `..` last, or the root itself: the kernel's errors (EINVAL, ENOTEMPTY,
        // EBUSY...) differ by call.
        let raw_last = path.split(|&b| b == b'/').rfind(|c| !c.is_empty());
        if matches!(raw_last, None | Some(b".") | Some(b"..")) {
            return Err(Stop::Fallback);
        }
        let (dir, last) = self.parent_of(base, path)?;
        let name = last.ok_or(Stop::Err(libc::EBUSY))?;
        if dir.kind != Kind::Dir {
            return Err(Stop::Err(libc::ENOTDIR));
        }
        match (want, self.fs.core.lookup(dir.ino, name)) {
            (Want::New, Ok(_)) => return Err(Stop::Err(libc::EEXIST)),
            (Want::Old, Err(e)) => return Err(Stop::Err(e)),
            _ => {}
        }
        self.may(&dir, W_OK | X_OK)?;
        if dir.mode & libc::S_ISVTX != 0 && self.caller.uid != 0 {
            return Err(Stop::Fallback);
        }
        Ok((dir, name))
    }

    /// Releases handle `fh` of `ino` (after the close's answer went back).
    pub(super) fn release(&self, ino: u64, fh: u64) {
        if let Err(e) = self.op(Op::Release { ino, fh }) {
            tracing::warn!(
                "release of inode {ino} for an io client: {}",
                std::io::Error::from_raw_os_error(e)
            );
        }
    }

    /// `ino`'s attributes with the count they rest on, for the client to keep (its `fstat`
    /// and the end of file it reads at are answered from them while the count holds).
    fn known(&self, ino: u64) -> std::result::Result<Rep<'static>, i32> {
        let (a, c) = self.fs.core.getattr_v(ino)?;
        let mut deps = Deps::default();
        deps.push(vers::attr_slot(ino), c.attr());
        Ok(Rep::Known {
            attr: wire_attr(&a),
            deps,
        })
    }

    fn op(&self, op: Op<'_>) -> std::result::Result<Out, i32> {
        // Not the kernel's: the FUSE device's polling does not turn on for these.
        self.fs.core.ops().note_io();
        let (r, then) = self.fs.answer(op, self.caller);
        self.fs.after_reply(then);
        r
    }

    /// The kernel forgets `name` in `parent` (a negative entry included) and the
    /// directory's attributes (its times and link count changed).
    fn inval_entry(&self, parent: u64, name: &[u8]) {
        // A directory the kernel holds no count of has no entries cached under it, nor one
        // under which no answer named anything; its attributes once dropped stay so until
        // the kernel asks for them (see `crate::kernel_refs`).
        let refs = self.fs.core.kernel_refs();
        if let Some(n) = self.notifier {
            if refs.inval_entry(parent) {
                let _ = n.inval_entry(INodeNo(parent), OsStr::from_bytes(name));
            }
            if refs.inval_attrs(parent) {
                let _ = n.inval_inode(INodeNo(parent), -1, 0);
            }
        }
    }

    /// Makes the kernel read `ino`'s size and times from the daemon again. In writeback-cache
    /// mode the kernel keeps a regular file's size and times as its own once it has the
    /// inode (an attribute invalidation does not change them), so the file's names are
    /// dropped from its dentry cache: with no kernel handle open, the kernel then lets the
    /// inode go, and the next lookup brings the daemon's attributes. A file also open
    /// through the kernel shows the client's size once those handles close (close-to-open,
    /// as NFS gives).
    fn drop_kernel_inode(&self, ino: u64) {
        let refs = self.fs.core.kernel_refs();
        if !refs.may_hold(ino) {
            // Not in the kernel's inode cache, so none of its names are either.
            return;
        }
        self.inval_inode(ino, -1, 0);
        for (parent, name) in self.fs.core.links_of(ino) {
            if let Some(n) = self.notifier.filter(|_| refs.inval_entry(parent)) {
                let _ = n.inval_entry(INodeNo(parent), OsStr::from_bytes(&name));
            }
        }
    }

    /// Drops `len` bytes at `off` of `ino` from the kernel's page cache (-1, 0: its
    /// attributes), unless the kernel holds no copy of the node.
    fn inval_inode(&self, ino: u64, off: i64, len: i64) {
        let refs = self.fs.core.kernel_refs();
        // Attributes only (off < 0): not again until the kernel has asked for them.
        let send = if off < 0 {
            refs.inval_attrs(ino)
        } else {
            refs.may_hold(ino)
        };
        if !send {
            return;
        }
        if let Some(n) = self.notifier {
            let _ = n.inval_inode(INodeNo(ino), off, len);
        }
    }

    /// The answer to `req`, and the handle it opened or closed (for the connection's
    /// table of handles to release if the client goes).
    pub(super) fn serve<'b>(&self, req: Req<'_>, data: &'b mut Vec<u8>) -> (Rep<'b>, Handle) {
        let r = match req {
            Req::Open {
                base,
                path,
                flags,
                mode,
                umask,
            } => return self.open(base, path, flags, mode, umask),
            Req::Close { ino, fh } => {
                // The release itself (the inode row, the drain's queue) is made by the
                // connection's loop (`release`): before the answer for a handle that may have
                // written, after it for a read-only one (see `io::connection`). Its size and
                // times are the daemon's already, so the kernel's view is refreshed first.
                if crate::refresh::may_write(fuser::FileHandle(fh)) {
                    self.drop_kernel_inode(ino);
                }
                // Its attributes as its writes left them, for the client to keep (the
                // release changes none of them).
                let rep = self.known(ino).unwrap_or(Rep::Done);
                return (rep, Handle::Closed(ino, fh));
            }
            Req::GetXattr {
                base,
                path,
                name,
                follow,
            } => self.getxattr(base, path, name, follow).map(|v| {
                *data = v;
                Rep::Data(data.as_slice())
            }),
            Req::List { base, path, pos } => self.list(base, path, pos).map(|v| {
                *data = v;
                Rep::Data(data.as_slice())
            }),
            Req::PathOf { ino } => match self.fs.core.paths_of(ino).into_iter().next() {
                Some(p) => {
                    *data = p;
                    Ok(Rep::Data(data.as_slice()))
                }
                None => Err(Stop::Err(libc::ENOENT)),
            },
            Req::Read { ino, off, len, .. } => match self.op(Op::Read {
                ino,
                offset: off,
                size: len.min(tierstack_ioproto::chan::MAX_DATA as u32),
            }) {
                Ok(Out::Data(v)) => {
                    *data = v;
                    Ok(Rep::Data(data.as_slice()))
                }
                Ok(_) => Err(Stop::Err(libc::EIO)),
                Err(e) => Err(Stop::Err(e)),
            },
            other => self.serve_plain(other),
        };
        (rep_of(r), Handle::None)
    }

    /// The entries of directory `path` from position `pos`, as many as an answer holds
    /// (`opendir` and `readdir` of the client: the kernel's read permission on the
    /// directory, search permission on the way).
    fn list(&self, base: u64, path: &[u8], pos: u64) -> R<Vec<u8>> {
        let a = self.node(base, path, true)?;
        if a.kind != Kind::Dir {
            return Err(Stop::Err(libc::ENOTDIR));
        }
        self.may(&a, R_OK)?;
        let ents = self.fs.core.readdir(a.ino, pos)?;
        let mut out = Vec::new();
        for ((ino, kind, name), next) in ents.iter().zip(pos + 1..) {
            let e = Entry {
                ino: *ino,
                next,
                kind: dt_of(*kind),
                name,
            };
            if !put_entry(&mut out, &e, tierstack_ioproto::msg::LIST_MAX) {
                break;
            }
        }
        Ok(out)
    }

    /// The value of extended attribute `name` of `path`, with the kernel's rules for
    /// reading it (`xattr_permission`): `user.` names only on files and directories (ENODATA
    /// elsewhere) and with read permission; `security.` names and the POSIX ACLs to anyone
    /// who reaches the node; any other namespace is the kernel's.
    fn getxattr(&self, base: u64, path: &[u8], name: &[u8], follow: bool) -> R<Vec<u8>> {
        let a = self.node(base, path, follow)?;
        if name.starts_with(b"user.") {
            if !matches!(a.kind, Kind::File | Kind::Dir) {
                return Err(Stop::Err(libc::ENODATA));
            }
            self.may(&a, R_OK)?;
        } else if !(name.starts_with(b"security.")
            || name == b"system.posix_acl_access"
            || name == b"system.posix_acl_default")
        {
            return Err(Stop::Fallback);
        }
        // The core's own answer (not `TierFs::answer`): the FUSE request counters of
        // `status` then count only what the kernel asked, as for listings.
        Ok(self.fs.core.getxattr(a.ino, name)?)
    }

    fn serve_plain(&self, req: Req<'_>) -> R<Rep<'static>> {
        let core = &self.fs.core;
        Ok(match req {
            Req::Stat { base, path, follow } => self.stat(base, path, follow)?,
            Req::Fstat { ino } => self.known(ino)?,
            Req::Access { base, path, mask } => {
                let a = self.node(base, path, true)?;
                self.may(&a, mask)?;
                Rep::Done
            }
            Req::Write {
                ino,
                fh,
                off,
                append,
                data,
            } => {
                let off = if append { core.getattr(ino)?.size } else { off };
                // Any page the kernel holds dirty goes to the daemon before this write.
                self.inval_inode(ino, off as i64, data.len() as i64);
                match self.op(Op::Write {
                    ino,
                    fh,
                    offset: off,
                    data,
                    kill_suidgid: false,
                })? {
                    Out::Written(n) => {
                        self.inval_inode(ino, off as i64, n as i64);
                        Rep::Written {
                            n,
                            end: off + n as u64,
                        }
                    }
                    _ => return Err(Stop::Err(libc::EIO)),
                }
            }
            Req::Fsync { ino, .. } => {
                self.op(Op::Fsync { ino })?;
                Rep::Done
            }
            Req::Truncate { ino, fh, size } => {
                self.inval_inode(ino, 0, 0);
                let out = self.op(Op::Setattr {
                    ino,
                    mode: None,
                    uid: None,
                    gid: None,
                    size: Some(size),
                    atime: None,
                    mtime: None,
                    fh: Some(fh),
                })?;
                self.inval_inode(ino, 0, 0);
                self.drop_kernel_inode(ino);
                match out {
                    Out::Attr(a) => Rep::Attr(wire_attr(&a)),
                    _ => Rep::Done,
                }
            }
            Req::Unlink { base, path } | Req::Rmdir { base, path } => {
                let dir_op = matches!(req, Req::Rmdir { .. });
                let (dir, name) = self.entry(base, path, Want::Old)?;
                let parent = dir.ino;
                let node = core.lookup(parent, name).ok().map(|a| a.ino);
                self.op(if dir_op {
                    Op::Rmdir { parent, name }
                } else {
                    Op::Unlink { parent, name }
                })?;
                self.inval_entry(parent, name);
                // Its other names' link count, as the kernel holds it.
                if let Some(ino) = node {
                    self.inval_inode(ino, -1, 0);
                }
                Rep::Done
            }
            Req::Mkdir {
                base,
                path,
                mode,
                umask,
            } => {
                let (dir, name) = self.entry(base, path, Want::New)?;
                // As the kernel's `vfs_mkdir`: permission bits and the sticky bit only.
                let out = self.op(Op::Mkdir {
                    parent: dir.ino,
                    name,
                    mode: mode & 0o1777,
                    umask,
                })?;
                self.inval_entry(dir.ino, name);
                match out {
                    Out::Entry(a) => Rep::Attr(wire_attr(&a)),
                    _ => Rep::Done,
                }
            }
            Req::Rename { from, to } => {
                let (fdir, fname) = self.entry(0, from, Want::Old)?;
                let (tdir, tname) = self.entry(0, to, Want::Any)?;
                // A directory renamed, or a name renamed over one: the kernel's checks of
                // ancestry come first (a directory into itself is EINVAL, over one of its
                // ancestors ENOTEMPTY, whatever the kinds), and only the kernel sees them all.
                let core = &self.fs.core;
                let dir_at =
                    |d: &Attr, n: &[u8]| core.lookup(d.ino, n).is_ok_and(|a| a.kind == Kind::Dir);
                if dir_at(&fdir, fname) || dir_at(&tdir, tname) {
                    return Err(Stop::Fallback);
                }
                let replaced = core.lookup(tdir.ino, tname).ok().map(|a| a.ino);
                self.op(Op::Rename {
                    parent: fdir.ino,
                    name: fname,
                    newparent: tdir.ino,
                    newname: tname,
                    flags: 0,
                })?;
                self.inval_entry(fdir.ino, fname);
                self.inval_entry(tdir.ino, tname);
                // The replaced node's other names' link count, as the kernel holds it.
                if let Some(ino) = replaced {
                    self.inval_inode(ino, -1, 0);
                }
                Rep::Done
            }
            Req::Link { from, to } => {
                let a = self.node(0, from, false)?;
                let (dir, name) = self.entry(0, to, Want::New)?;
                if a.kind == Kind::Dir {
                    return Err(Stop::Err(libc::EPERM));
                }
                let out = self.op(Op::Link {
                    ino: a.ino,
                    newparent: dir.ino,
                    newname: name,
                })?;
                self.inval_entry(dir.ino, name);
                // Its link count and change time.
                self.inval_inode(a.ino, -1, 0);
                match out {
                    Out::Entry(a) => Rep::Attr(wire_attr(&a)),
                    _ => Rep::Done,
                }
            }
            Req::Setattr { ino, path, set } => {
                // `ino` is the node itself without a path, the path's directory with one.
                let a = if path.is_empty() {
                    core.getattr(ino)?
                } else {
                    self.node(ino, path, set.follow)?
                };
                if a.kind == Kind::Symlink && set.mode.is_some() {
                    // `fchmodat(AT_SYMLINK_NOFOLLOW)` of a link: Linux has no link modes.
                    return Err(Stop::Err(libc::EOPNOTSUPP));
                }
                may_setattr(&a, self.caller, &set, || self.may(&a, W_OK))?;
                let out = self.op(Op::Setattr {
                    ino: a.ino,
                    mode: set.mode,
                    uid: set.uid,
                    gid: set.gid,
                    size: None,
                    atime: system_time(set.atime),
                    mtime: system_time(set.mtime),
                    fh: None,
                })?;
                self.drop_kernel_inode(a.ino);
                match out {
                    Out::Attr(a) => Rep::Attr(wire_attr(&a)),
                    _ => Rep::Done,
                }
            }
            Req::Open { .. }
            | Req::Close { .. }
            | Req::Read { .. }
            | Req::PathOf { .. }
            | Req::List { .. }
            | Req::GetXattr { .. } => return Err(Stop::Err(libc::EINVAL)),
        })
    }

    fn open(
        &self,
        base: u64,
        path: &[u8],
        flags: i32,
        mode: u32,
        umask: u32,
    ) -> (Rep<'static>, Handle) {
        match self.open_inner(base, path, flags, mode, umask) {
            Ok((fh, a, deps)) => (
                Rep::Opened {
                    fh,
                    attr: wire_attr(&a),
                    deps,
                },
                Handle::Opened(a.ino, fh),
            ),
            Err(stop) => (rep_of(Err(stop)), Handle::None),
        }
    }

    fn open_inner(
        &self,
        base: u64,
        path: &[u8],
        flags: i32,
        mode: u32,
        umask: u32,
    ) -> R<(u64, Attr, Deps)> {
        let core = &self.fs.core;
        // O_PATH, O_TMPFILE and the like are the kernel's.
        if flags & (libc::O_PATH | libc::O_TMPFILE & !libc::O_DIRECTORY) != 0 {
            return Err(Stop::Fallback);
        }
        // The answer carries what the path's walk rests on, as a `stat`'s does: the client
        // keeps the file's attributes from its open.
        let mut w = Walk::default();
        let (dir, _, last) = self.parent_of_v(base, path, &mut w)?;
        let Some(name) = last else {
            return Err(Stop::Fallback);
        };
        let walked = w.deps.as_slice().len();
        let creat = flags & libc::O_CREAT != 0;
        let ((slot, named), found) = core.lookup_v(dir.ino, name);
        w.deps.push(slot, named);
        match found.map(|(a, _)| a) {
            Ok(a) => {
                if creat && flags & libc::O_EXCL != 0 {
                    return Err(Stop::Err(libc::EEXIST));
                }
                match a.kind {
                    Kind::File => {}
                    Kind::Symlink if flags & libc::O_NOFOLLOW != 0 => {
                        return Err(Stop::Err(libc::ELOOP))
                    }
                    _ => return Err(Stop::Fallback),
                }
                if flags & libc::O_DIRECTORY != 0 || path.last() == Some(&b'/') {
                    return Err(Stop::Err(libc::ENOTDIR));
                }
                self.may(&a, open_wants(flags))?;
                let trunc = flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY;
                if trunc {
                    self.inval_inode(a.ino, 0, 0);
                }
                let fh = match self.op(Op::Open { ino: a.ino, flags })? {
                    Out::Open(fh, _) => fh,
                    _ => return Err(Stop::Err(libc::EIO)),
                };
                if trunc {
                    self.inval_inode(a.ino, 0, 0);
                }
                let (a, c) = core.getattr_v(a.ino)?;
                w.deps.push(vers::attr_slot(a.ino), c.attr());
                Ok((fh, a, w.deps))
            }
            Err(libc::ENOENT) if creat => {
                if dir.kind != Kind::Dir {
                    return Err(Stop::Err(libc::ENOTDIR));
                }
                if path.last() == Some(&b'/') {
                    return Err(Stop::Err(libc::EISDIR));
                }
                self.may(&dir, W_OK | X_OK)?;
                let out = self.op(Op::Create {
                    parent: dir.ino,
                    name,
                    mode: libc::S_IFREG | (mode & 0o7777),
                    umask,
                    flags,
                })?;
                self.inval_entry(dir.ino, name);
                let Out::Created(a, fh, _) = out else {
                    return Err(Stop::Err(libc::EIO));
                };
                // The name's count went up with the create: read again (then the node's), so
                // that what the answer rests on is the name as the create left it.
                w.deps.truncate(walked);
                let ((slot, named), found) = core.lookup_v(dir.ino, name);
                w.deps.push(slot, named);
                match found {
                    Ok((now, c)) if now.ino == a.ino => {
                        w.deps.push(vers::attr_slot(now.ino), c.attr());
                        Ok((fh, now, w.deps))
                    }
                    // Replaced or removed by another process meanwhile: nothing to keep.
                    _ => Ok((fh, a, Deps::default())),
                }
            }
            Err(e) => Err(Stop::Err(e)),
        }
    }
}

/// What a request did to the connection's open handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Handle {
    /// Nothing.
    None,
    /// Opened handle `fh` of node `ino`.
    Opened(u64, u64),
    /// Closed it.
    Closed(u64, u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: Kind, mode: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            ino: 5,
            kind,
            mode,
            uid,
            gid,
            size: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            nlink: 1,
            rdev: 0,
            blocks: 0,
            generation: 1,
        }
    }

    fn who(uid: u32) -> Caller {
        Caller { uid, gid: uid }
    }

    #[test]
    fn permission_is_decided_here_only_where_the_mode_alone_decides_it() {
        let f = attr(Kind::File, 0o640, 1000, 1000);
        assert_eq!(may(&f, who(1000), R_OK | W_OK, || false), Ok(()));
        assert_eq!(
            may(&f, who(1000), X_OK, || false),
            Err(Stop::Err(libc::EACCES))
        );
        // Group may read, other may not: whether 1001 is in the group is the kernel's.
        assert_eq!(may(&f, who(1001), R_OK, || false), Err(Stop::Fallback));
        // Neither group nor other may write, and no ACL: refused.
        assert_eq!(
            may(&f, who(1001), W_OK, || false),
            Err(Stop::Err(libc::EACCES))
        );
        // An ACL may grant what the bits do not.
        assert_eq!(may(&f, who(1001), W_OK, || true), Err(Stop::Fallback));
        let open = attr(Kind::File, 0o644, 1000, 1000);
        assert_eq!(may(&open, who(1001), R_OK, || false), Ok(()));
        // Root: anything but executing a file nobody may execute.
        assert_eq!(may(&f, who(0), R_OK | W_OK, || false), Ok(()));
        assert_eq!(
            may(&f, who(0), X_OK, || false),
            Err(Stop::Err(libc::EACCES))
        );
        let d = attr(Kind::Dir, 0o700, 1000, 1000);
        assert_eq!(may(&d, who(0), X_OK, || false), Ok(()));
        assert_eq!(
            may(&d, who(1001), X_OK, || false),
            Err(Stop::Err(libc::EACCES))
        );
    }

    #[test]
    fn attribute_changes_follow_the_kernels_rules() {
        let f = attr(Kind::File, 0o644, 1000, 1000);
        let set = |mode, uid, gid, mtime| SetAttr {
            mode,
            uid,
            gid,
            atime: Time::Omit,
            mtime,
            follow: true,
        };
        let yes = || Ok(());
        let no = || Err(Stop::Err(libc::EACCES));
        let chmod = set(Some(0o600), None, None, Time::Omit);
        assert_eq!(may_setattr(&f, who(1000), &chmod, no), Ok(()));
        assert_eq!(
            may_setattr(&f, who(1001), &chmod, yes),
            Err(Stop::Err(libc::EPERM))
        );
        assert_eq!(may_setattr(&f, who(0), &chmod, no), Ok(()));
        let chown = set(None, Some(1001), None, Time::Omit);
        assert_eq!(
            may_setattr(&f, who(1000), &chown, yes),
            Err(Stop::Err(libc::EPERM))
        );
        let chgrp = set(None, None, Some(2000), Time::Omit);
        assert_eq!(may_setattr(&f, who(1000), &chgrp, yes), Err(Stop::Fallback));
        let touch_at = set(None, None, None, Time::At(5));
        assert_eq!(
            may_setattr(&f, who(1001), &touch_at, yes),
            Err(Stop::Err(libc::EPERM))
        );
        assert_eq!(may_setattr(&f, who(1000), &touch_at, no), Ok(()));
        let touch = set(None, None, None, Time::Now);
        assert_eq!(may_setattr(&f, who(1001), &touch, yes), Ok(()));
        assert_eq!(
            may_setattr(&f, who(1001), &touch, no),
            Err(Stop::Err(libc::EACCES))
        );
    }

    #[test]
    fn open_flags_ask_for_what_the_kernel_asks() {
        assert_eq!(open_wants(libc::O_RDONLY), R_OK);
        assert_eq!(open_wants(libc::O_WRONLY | libc::O_CREAT), W_OK);
        assert_eq!(open_wants(libc::O_RDWR), R_OK | W_OK);
        assert_eq!(open_wants(libc::O_RDONLY | libc::O_TRUNC), R_OK | W_OK);
    }

    #[test]
    fn paths_are_split_into_naming_components() {
        assert_eq!(components(b"a//./b/").0, vec![&b"a"[..], b"b"]);
        assert!(components(b"a/").1);
        assert!(components(b"").0.is_empty());
        assert_eq!(components(b"../x").0, vec![&b".."[..], b"x"]);
    }
}
