//! The FUSE side: the file system's operations over [`Core`] ([`TierFs::serve`], one
//! decoded request [`Op`] in, one [`Out`] answer back), and the `fuser::Filesystem` that
//! carries them over `/dev/fuse`. [`crate::uring`] carries the same operations over the
//! kernel's io_uring queues; the operations themselves are the table of [`crate::ops`].

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::core::{now_ns, Attr, Core, Kind, PAGE};
pub use crate::ops::{Answer, Caller, Op, OpKind, Out, Statfs};
use crate::refresh::{is_direct, may_write, open_flags, Refresher, STALE_NS};

/// Attributes and entries may be cached by the kernel this long: only this daemon changes
/// the namespace it shows.
const TTL: Duration = Duration::from_secs(3600);

/// The mounted file system: every operation is served by the core, whichever transport
/// carries it (`fuser`'s `/dev/fuse` threads, and the io_uring queues of [`crate::uring`]
/// when the kernel offers them; each transport holds a clone).
#[derive(Clone)]
pub struct TierFs {
    /// The file system's state: namespace, file contents, journal.
    pub core: Arc<Core>,
    /// Whether write-only handles of new or truncated files bypass the page cache (see
    /// [`crate::refresh`]).
    pub direct_writes: bool,
    /// Drops the kernel's entries of files written by such handles.
    pub refresh: Arc<Refresher>,
    /// A second transport that INIT may offer the kernel (FUSE over io_uring, see
    /// [`crate::uring`]), when the mount asks for it.
    pub ring: Option<Arc<dyn InitOffer>>,
    /// Whether INIT asks for listings with attributes (READDIRPLUS, see `readdirplus`).
    pub readdirplus: bool,
}

/// A transport that is agreed in the FUSE INIT handshake (FUSE over io_uring): INIT asks
/// whether to offer it, and reports the kernel's answer. Implemented by `uring::Ring`; a
/// trait so that this module does not depend on the transports that carry its operations.
pub trait InitOffer: Send + Sync {
    /// Whether INIT offers the transport to the kernel (asked once, by INIT).
    fn wanted(&self) -> bool;
    /// INIT's outcome: whether the kernel agreed.
    fn negotiated(&self, agreed: bool);
}

fn st(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn ft(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

fn fattr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: st(a.atime),
        mtime: st(a.mtime),
        ctime: st(a.ctime),
        crtime: st(a.ctime),
        kind: ft(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        // Large I/O sizes for tools that follow st_blksize (cp, dd without bs).
        blksize: PAGE as u32,
        flags: 0,
    }
}

/// The entry of a name that does not exist: node 0 (the kernel caches it as negative).
fn negative_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: PAGE as u32,
        flags: 0,
    }
}

fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

fn tot(t: Option<TimeOrNow>) -> Option<Option<SystemTime>> {
    t.map(|t| match t {
        TimeOrNow::SpecificTime(s) => Some(s),
        TimeOrNow::Now => None,
    })
}

impl TierFs {
    /// At the close of a direct handle `fh` of `ino`: the kernel still shows the times of the
    /// open; if the file was written later than [`STALE_NS`] after it, its entries are dropped
    /// (see `refresh`).
    fn refresh_times(&self, ino: u64, fh: FileHandle) {
        let Some(opened) = is_direct(Some(fh)) else {
            return;
        };
        if self
            .core
            .mtime_of(ino)
            .is_some_and(|m| m - opened > STALE_NS)
        {
            self.refresh.drop_entries(ino);
        }
    }

    /// The mode a new node in `parent` starts from: the umask applies unless the directory
    /// has a default ACL, which then masks the mode instead (POSIX; the kernel leaves both to
    /// the file system when ACLs are on).
    fn masked(&self, parent: u64, mode: u32, umask: u32) -> u32 {
        if self.core.has_default_acl(parent) {
            mode
        } else {
            mode & !umask
        }
    }
}

impl TierFs {
    /// Serves `op` for `caller` and sends the answer with `send`, then does what must follow
    /// the reply (see [`TierFs::answer`]).
    pub fn serve(&self, op: Op<'_>, caller: Caller, send: impl FnOnce(Answer)) {
        let (r, then) = self.answer(op, caller);
        send(r);
        self.after_reply(then);
    }

    /// What must happen once the reply is with the kernel: the inode whose kernel entries are
    /// to be dropped (see `refresh`), if any. Until the kernel has a release's reply, the
    /// pending release holds the inode, which would then outlive its entries with the
    /// open's mtime.
    pub fn after_reply(&self, then: Option<u64>) {
        if let Some(ino) = then {
            self.refresh.drop_entries(ino);
        }
    }

    /// The answer to `op` for `caller`, and the inode whose kernel entries are to be dropped
    /// once the answer is sent ([`TierFs::after_reply`]). Timed in `status --json`'s `ops`.
    pub fn answer(&self, op: Op<'_>, caller: Caller) -> (Answer, Option<u64>) {
        let _t = self.core.ops().time(op.kind());
        let core = &self.core;
        let r: Answer = match op {
            Op::Lookup { parent, name } => match core.lookup(parent, name) {
                Ok(a) => Ok(Out::Entry(a)),
                // A name that is not there, in a directory that exists and is loaded: a
                // negative entry (node 0) the kernel keeps for TTL, so a program that probes
                // the same missing paths again (an interpreter's module search, a build's
                // header search) is answered from the dentry cache. Safe because every
                // change to the namespace after a directory is loaded goes through this
                // kernel mount (creates, renames and links replace the negative entry there).
                Err(libc::ENOENT) if core.is_dir(parent) => Ok(Out::Negative),
                Err(e) => Err(e),
            },
            Op::Getattr { ino } => core.getattr(ino).map(Out::Attr),
            Op::Setattr {
                ino,
                mode,
                uid,
                gid,
                size,
                atime,
                mtime,
                fh,
            } => {
                // Under FUSE_HANDLE_KILLPRIV_V2 the kernel leaves clearing privileges to us: a
                // chown of a file clears set-ID (as the kernel's chown does, for anyone), a
                // truncate by an unprivileged user too; both drop file capabilities.
                let chown = (uid.is_some() || gid.is_some()) && mode.is_none();
                let killed = if chown || size.is_some() {
                    core.kill_priv(ino, chown || caller.uid != 0)
                } else {
                    Ok(())
                };
                // Only times, through a handle: the kernel writing back the times it keeps in
                // writeback-cache mode (a program's utimes carries no handle). They may
                // predate a direct write it never saw (see `refresh`).
                let from_kernel = fh.is_some()
                    && mode.is_none()
                    && uid.is_none()
                    && gid.is_none()
                    && size.is_none();
                killed
                    .and_then(|()| {
                        core.setattr(ino, mode, uid, gid, size, atime, mtime, from_kernel)
                    })
                    .map(Out::Attr)
            }
            Op::Readlink { ino } => core.readlink(ino).map(Out::Data),
            Op::Mknod {
                parent,
                name,
                mode,
                umask,
                rdev,
            } => {
                if mode & libc::S_IFMT == libc::S_IFREG {
                    core.create(
                        parent,
                        name,
                        self.masked(parent, mode, umask),
                        caller.uid,
                        caller.gid,
                        false,
                    )
                } else if matches!(mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK)
                    && caller.uid != 0
                {
                    // As on ext4: device nodes need CAP_MKNOD.
                    Err(libc::EPERM)
                } else {
                    core.mknod(
                        parent,
                        name,
                        (mode & libc::S_IFMT) | (self.masked(parent, mode, umask) & 0o7777),
                        rdev as u64,
                        caller.uid,
                        caller.gid,
                    )
                }
                .map(Out::Entry)
            }
            Op::Mkdir {
                parent,
                name,
                mode,
                umask,
            } => core
                .mkdir(
                    parent,
                    name,
                    self.masked(parent, mode, umask),
                    caller.uid,
                    caller.gid,
                )
                .map(Out::Entry),
            Op::Unlink { parent, name } => core.unlink(parent, name, false).map(|()| Out::Empty),
            Op::Rmdir { parent, name } => core.unlink(parent, name, true).map(|()| Out::Empty),
            Op::Symlink {
                parent,
                name,
                target,
            } => core
                .symlink(parent, name, target, caller.uid, caller.gid)
                .map(Out::Entry),
            Op::Rename {
                parent,
                name,
                newparent,
                newname,
                flags,
            } => {
                let r = core.rename(parent, name, newparent, newname, flags);
                // A file written through a direct handle and renamed right after its close
                // (write a temporary name, then rename: the checkpoint writer's way): the
                // invalidation queued at its release may have named the old entry before the
                // rename moved it. Queued again for the new name; the kernel applies it once
                // the rename holds the directories no longer.
                let then = r
                    .is_ok()
                    .then(|| core.direct_written_at(newparent, newname))
                    .flatten();
                return (r.map(|()| Out::Empty), then);
            }
            Op::Link {
                ino,
                newparent,
                newname,
            } => core.link(ino, newparent, newname).map(Out::Entry),
            Op::Open { ino, flags } => {
                // Before anything that may wait: the kernel's copy of the times is never
                // older than this by more than a tick of its coarse clock (see
                // `Core::setattr`).
                let started = now_ns();
                // FUSE_ATOMIC_O_TRUNC: the truncate of open(O_TRUNC) arrives here (the kernel
                // checked write permission). Like the truncate it replaces, it clears
                // privileges.
                let truncated = if flags & libc::O_TRUNC != 0 {
                    core.kill_priv(ino, caller.uid != 0).and_then(|()| {
                        core.setattr(ino, None, None, None, Some(0), None, None, false)
                            .map(|_| ())
                    })
                } else {
                    Ok(())
                };
                let (fh, f) = open_flags(flags, false, self.direct_writes, started);
                truncated
                    .and_then(|()| core.open(ino, may_write(fh)))
                    .map(|()| Out::Open(fh.0, f))
            }
            Op::Read { ino, offset, size } => core.read(ino, offset, size).map(Out::Data),
            Op::Write {
                ino,
                fh,
                offset,
                data,
                kill_suidgid,
            } => {
                let kill = caller.uid != 0 || kill_suidgid;
                core.write(ino, offset, data, kill, is_direct(Some(FileHandle(fh))))
                    .map(|n| Out::Written(n as u32))
            }
            // Answered ENOSYS, once: the kernel then stops sending FLUSH at every `close` (one
            // round trip fewer per close; `fuse_flush` still writes the cached pages back and
            // reports their errors to `close`). What a flush would do happens at the last
            // close (`release`): the inode row and the queueing of the drain; the journal
            // promises nothing at a `close` that no `fsync` covered (README, Guarantees). No
            // POSIX locks are kept here (the kernel keeps them), so no lock owner needs the
            // flush either.
            Op::Flush { ino, fh } => {
                let r = core.flush_handle(ino);
                if r.is_ok() {
                    self.refresh_times(ino, FileHandle(fh));
                }
                r.and(Err(libc::ENOSYS))
            }
            Op::Release { ino, fh } => {
                // The entries are dropped after the reply (`after_reply`). With another handle
                // still open (a reader that opened the file meanwhile) the last release drops
                // them instead (`Node::kernel_stale`).
                let h = FileHandle(fh);
                let r = core.release(ino, is_direct(Some(h)), may_write(h));
                if let Err(e) = r {
                    // The kernel does not pass a release's error on (the close has returned).
                    tracing::warn!(
                        "release of inode {ino}: {}",
                        std::io::Error::from_raw_os_error(e)
                    );
                }
                return (r.map(|_| Out::Empty), (r == Ok(true)).then_some(ino));
            }
            Op::Fsync { ino } | Op::Fsyncdir { ino } => core.fsync(ino).map(|()| Out::Empty),
            Op::Fallocate {
                ino,
                offset,
                length,
                mode,
            } => core
                .fallocate(ino, offset, length, mode)
                .map(|()| Out::Empty),
            Op::Lseek {
                ino,
                offset,
                whence,
            } => core.seek(ino, offset, whence).map(Out::Offset),
            Op::Opendir { ino } => match core.getattr(ino) {
                Ok(a) if a.kind == Kind::Dir => Ok(Out::Open(0, FopenFlags::empty())),
                Ok(_) => Err(libc::ENOTDIR),
                Err(e) => Err(e),
            },
            Op::Readdir { ino, offset, .. } => core.readdir(ino, offset).map(|ents| {
                Out::Dir(
                    ents.into_iter()
                        .zip(offset + 1..)
                        .map(|((i, k, name), pos)| (i, pos, k, name))
                        .collect(),
                )
            }),
            Op::Statfs => {
                let bsize = 4096u64;
                let (blocks, bfree) = match rustix::fs::statvfs(core.backing_path()) {
                    Ok(s) => (
                        s.f_blocks * s.f_frsize / bsize,
                        s.f_bavail * s.f_frsize / bsize,
                    ),
                    Err(_) => (0, 0),
                };
                Ok(Out::Statfs(Statfs {
                    blocks,
                    bfree,
                    bavail: bfree,
                    bsize: bsize as u32,
                    namelen: 255,
                }))
            }
            Op::Create {
                parent,
                name,
                mode,
                umask,
                flags,
            } => {
                let started = now_ns();
                core.create(
                    parent,
                    name,
                    self.masked(parent, mode, umask),
                    caller.uid,
                    caller.gid,
                    true,
                )
                .map(|a| {
                    let (fh, f) = open_flags(flags, true, self.direct_writes, started);
                    Out::Created(a, fh.0, f)
                })
            }
            Op::Setxattr {
                ino,
                name,
                value,
                flags,
            } => core
                .setxattr(ino, name, Some(value), flags)
                .map(|()| Out::Empty),
            Op::Getxattr { ino, name, size } => xattr_out(size, core.getxattr(ino, name)),
            Op::Listxattr { ino, size } => xattr_out(size, core.listxattr(ino)),
            Op::Removexattr { ino, name } => core.setxattr(ino, name, None, 0).map(|()| Out::Empty),
        };
        (r, None)
    }
}

/// getxattr/listxattr: the size when asked for it (`size` 0), else the bytes, or ERANGE when
/// they do not fit.
fn xattr_out(size: u32, r: std::result::Result<Vec<u8>, i32>) -> Answer {
    match r {
        Ok(v) if size == 0 => Ok(Out::Size(v.len() as u32)),
        Ok(v) if v.len() > size as usize => Err(libc::ERANGE),
        Ok(v) => Ok(Out::Data(v)),
        Err(e) => Err(e),
    }
}

/// The caller of a `fuser` request.
fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

/// An answer that is not of the kind the request expects: a bug, answered EIO.
fn mismatch(op: &str, out: &Out) -> i32 {
    tracing::error!("{op}: unexpected answer {out:?}");
    libc::EIO
}

/// Sends an entry answer through `fuser`.
fn send_entry(reply: ReplyEntry, r: Answer) {
    match r {
        Ok(Out::Entry(a)) => reply.entry(&TTL, &fattr(&a), Generation(0)),
        Ok(Out::Negative) => reply.entry(&TTL, &negative_entry(), Generation(0)),
        Ok(o) => reply.error(err(mismatch("entry", &o))),
        Err(e) => reply.error(err(e)),
    }
}

/// Sends an attributes answer through `fuser`.
fn send_attr(reply: ReplyAttr, r: Answer) {
    match r {
        Ok(Out::Attr(a)) => reply.attr(&TTL, &fattr(&a)),
        Ok(o) => reply.error(err(mismatch("attr", &o))),
        Err(e) => reply.error(err(e)),
    }
}

/// Sends an answer with nothing in it through `fuser`.
fn send_empty(reply: ReplyEmpty, r: Answer) {
    match r {
        Ok(Out::Empty) => reply.ok(),
        Ok(o) => reply.error(err(mismatch("empty", &o))),
        Err(e) => reply.error(err(e)),
    }
}

/// Sends a data answer through `fuser`.
fn send_data(reply: ReplyData, r: Answer) {
    match r {
        Ok(Out::Data(v)) => reply.data(&v),
        Ok(o) => reply.error(err(mismatch("data", &o))),
        Err(e) => reply.error(err(e)),
    }
}

/// Sends an extended-attribute answer through `fuser`.
fn send_xattr(reply: ReplyXattr, r: Answer) {
    match r {
        Ok(Out::Size(n)) => reply.size(n),
        Ok(Out::Data(v)) => reply.data(&v),
        Ok(o) => reply.error(err(mismatch("xattr", &o))),
        Err(e) => reply.error(err(e)),
    }
}

/// Sends an open answer through `fuser`.
fn send_open(reply: ReplyOpen, r: Answer) {
    match r {
        Ok(Out::Open(fh, f)) => reply.opened(FileHandle(fh), f),
        Ok(o) => reply.error(err(mismatch("open", &o))),
        Err(e) => reply.error(err(e)),
    }
}

impl fuser::Filesystem for TierFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(PAGE as u32);
        let _ = config.set_max_readahead(PAGE as u32);
        // Shared mappings of files open for writing (direct I/O handles); kernels before 6.6
        // refuse them instead.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_WRITEBACK_CACHE);
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_PARALLEL_DIROPS);
        // POSIX ACLs: the kernel checks them (default_permissions) and keeps the mode in step;
        // the mount stores them as the two system.posix_acl_* attributes and drains them.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_POSIX_ACL);
        // The mode arrives without the umask; `masked` applies it unless a default ACL rules.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_DONT_MASK);
        // Set-ID bits and file capabilities are cleared here on write, truncate and chown
        // (`Core::kill_priv`), so the kernel need not ask for `security.capability` before
        // every write (it marks inodes S_NOSEC): one round trip less per write(2).
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        // open(O_TRUNC) truncates in the open request instead of a separate setattr.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_ATOMIC_O_TRUNC);
        // FUSE over io_uring (`crate::uring`), when asked for and the kernel offers it.
        let mut uring = false;
        if let Some(ring) = &self.ring {
            uring = ring.wanted()
                && config
                    .add_capabilities(fuser::InitFlags::FUSE_OVER_IO_URING)
                    .is_ok();
            ring.negotiated(uring);
        }
        // Listings with attributes (`readdirplus`), where the kernel finds them worth it
        // (AUTO: after a listing was followed by lookups of its names). Not over io_uring,
        // whose decoder serves READDIR alone.
        if !uring && self.readdirplus {
            let _ = config.add_capabilities(
                fuser::InitFlags::FUSE_DO_READDIRPLUS | fuser::InitFlags::FUSE_READDIRPLUS_AUTO,
            );
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let op = Op::Lookup {
            parent: parent.0,
            name: name.as_bytes(),
        };
        self.serve(op, caller(_req), |r| send_entry(reply, r))
    }

    /// The kernel evicted the inode: no copy of its times is left in the kernel.
    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        self.core.forget_kernel_copy(ino.0);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.serve(Op::Getattr { ino: ino.0 }, caller(req), |r| {
            send_attr(reply, r)
        })
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let op = Op::Setattr {
            ino: ino.0,
            mode,
            uid,
            gid,
            size,
            atime: tot(atime),
            mtime: tot(mtime),
            fh: fh.map(|f| f.0),
        };
        self.serve(op, caller(req), |r| send_attr(reply, r))
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.serve(Op::Readlink { ino: ino.0 }, caller(req), |r| {
            send_data(reply, r)
        })
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let op = Op::Mknod {
            parent: parent.0,
            name: name.as_bytes(),
            mode,
            umask,
            rdev,
        };
        self.serve(op, caller(req), |r| send_entry(reply, r))
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let op = Op::Setxattr {
            ino: ino.0,
            name: name.as_bytes(),
            value,
            flags,
        };
        self.serve(op, caller(req), |r| send_empty(reply, r))
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let op = Op::Getxattr {
            ino: ino.0,
            name: name.as_bytes(),
            size,
        };
        self.serve(op, caller(req), |r| send_xattr(reply, r))
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let op = Op::Listxattr { ino: ino.0, size };
        self.serve(op, caller(req), |r| send_xattr(reply, r))
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let op = Op::Removexattr {
            ino: ino.0,
            name: name.as_bytes(),
        };
        self.serve(op, caller(req), |r| send_empty(reply, r))
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let op = Op::Mkdir {
            parent: parent.0,
            name: name.as_bytes(),
            mode,
            umask,
        };
        self.serve(op, caller(req), |r| send_entry(reply, r))
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let op = Op::Unlink {
            parent: parent.0,
            name: name.as_bytes(),
        };
        self.serve(op, caller(req), |r| send_empty(reply, r))
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let op = Op::Rmdir {
            parent: parent.0,
            name: name.as_bytes(),
        };
        self.serve(op, caller(req), |r| send_empty(reply, r))
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let op = Op::Symlink {
            parent: parent.0,
            name: link_name.as_bytes(),
            target: target.as_os_str().as_bytes(),
        };
        self.serve(op, caller(req), |r| send_entry(reply, r))
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let op = Op::Rename {
            parent: parent.0,
            name: name.as_bytes(),
            newparent: newparent.0,
            newname: newname.as_bytes(),
            flags: flags.bits(),
        };
        self.serve(op, caller(req), |r| send_empty(reply, r))
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let op = Op::Link {
            ino: ino.0,
            newparent: newparent.0,
            newname: newname.as_bytes(),
        };
        self.serve(op, caller(req), |r| send_entry(reply, r))
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let op = Op::Open {
            ino: ino.0,
            flags: flags.0,
        };
        self.serve(op, caller(req), |r| send_open(reply, r))
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let op = Op::Read {
            ino: ino.0,
            offset,
            size,
        };
        self.serve(op, caller(req), |r| send_data(reply, r))
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let op = Op::Write {
            ino: ino.0,
            fh: fh.0,
            offset,
            data,
            kill_suidgid: write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID),
        };
        self.serve(op, caller(req), |r| match r {
            Ok(Out::Written(n)) => reply.written(n),
            Ok(o) => reply.error(err(mismatch("write", &o))),
            Err(e) => reply.error(err(e)),
        })
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let op = Op::Flush {
            ino: ino.0,
            fh: fh.0,
        };
        self.serve(op, caller(req), |r| send_empty(reply, r))
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let op = Op::Release {
            ino: ino.0,
            fh: fh.0,
        };
        self.serve(op, caller(req), |r| send_empty(reply, r))
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.serve(Op::Fsync { ino: ino.0 }, caller(req), |r| {
            send_empty(reply, r)
        })
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let op = Op::Fallocate {
            ino: ino.0,
            offset,
            length,
            mode,
        };
        self.serve(op, caller(req), |r| send_empty(reply, r))
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(err(libc::ENXIO));
        };
        let op = Op::Lseek {
            ino: ino.0,
            offset,
            whence,
        };
        self.serve(op, caller(req), |r| match r {
            Ok(Out::Offset(o)) => reply.offset(o as i64),
            Ok(o) => reply.error(err(mismatch("lseek", &o))),
            Err(e) => reply.error(err(e)),
        })
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.serve(Op::Opendir { ino: ino.0 }, caller(req), |r| {
            send_open(reply, r)
        })
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let op = Op::Readdir {
            ino: ino.0,
            offset,
            size: u32::MAX,
        };
        self.serve(op, caller(req), |r| match r {
            Ok(Out::Dir(ents)) => {
                for (i, pos, k, name) in ents {
                    if reply.add(INodeNo(i), pos, ft(k), OsStr::from_bytes(&name)) {
                        break;
                    }
                }
                reply.ok();
            }
            Ok(o) => reply.error(err(mismatch("readdir", &o))),
            Err(e) => reply.error(err(e)),
        })
    }

    /// A listing with each entry's attributes (READDIRPLUS, asked for in `init`): the
    /// kernel then needs no LOOKUP round trip per entry for what walks a tree and stats every
    /// name (`ls -l`, `git add`, `tar c`, `find`, Python's import). Each entry is answered as
    /// a lookup of its name would be (the same attributes and timeouts; "." and ".." with
    /// their attributes, which the kernel does not enter).
    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let who = caller(req);
        let op = Op::Readdir {
            ino: ino.0,
            offset,
            size: u32::MAX,
        };
        let (r, then) = self.answer(op, who);
        self.after_reply(then);
        let ents = match r {
            Ok(Out::Dir(ents)) => ents,
            Ok(o) => return reply.error(err(mismatch("readdirplus", &o))),
            Err(e) => return reply.error(err(e)),
        };
        for (i, pos, _k, name) in ents {
            let op = if name == b"." || name == b".." {
                Op::Getattr { ino: i }
            } else {
                Op::Lookup {
                    parent: ino.0,
                    name: &name,
                }
            };
            let (r, then) = self.answer(op, who);
            self.after_reply(then);
            let a = match r {
                Ok(Out::Entry(a)) | Ok(Out::Attr(a)) => a,
                // Gone since the listing (a concurrent unlink): the next listing shows it.
                _ => continue,
            };
            let full = reply.add(
                INodeNo(a.ino),
                pos,
                OsStr::from_bytes(&name),
                &TTL,
                &fattr(&a),
                Generation(0),
            );
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.serve(Op::Fsyncdir { ino: ino.0 }, caller(req), |r| {
            send_empty(reply, r)
        })
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.serve(Op::Statfs, caller(req), |r| match r {
            Ok(Out::Statfs(s)) => reply.statfs(
                s.blocks, s.bfree, s.bavail, 0, 0, s.bsize, s.namelen, s.bsize,
            ),
            Ok(o) => reply.error(err(mismatch("statfs", &o))),
            Err(e) => reply.error(err(e)),
        })
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let op = Op::Create {
            parent: parent.0,
            name: name.as_bytes(),
            mode,
            umask,
            flags,
        };
        self.serve(op, caller(req), |r| match r {
            Ok(Out::Created(a, fh, f)) => {
                reply.created(&TTL, &fattr(&a), Generation(0), FileHandle(fh), f)
            }
            Ok(o) => reply.error(err(mismatch("create", &o))),
            Err(e) => reply.error(err(e)),
        })
    }
}
