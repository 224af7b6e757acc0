//! The FUSE side: a `fuser::Filesystem` over [`Core`].

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};

use crate::core::{now_ns, Attr, Core, Kind, PAGE};
use crate::refresh::{is_direct, open_flags, Refresher, STALE_NS};

/// Attributes and entries may be cached by the kernel this long: only this daemon changes
/// the namespace it shows.
const TTL: Duration = Duration::from_secs(3600);

/// The mounted file system handed to `fuser`: every operation is served by the core.
pub struct TierFs {
    /// The file system's state: namespace, file contents, journal.
    pub core: Arc<Core>,
    /// Whether write-only handles of new or truncated files bypass the page cache (see
    /// [`crate::refresh`]).
    pub direct_writes: bool,
    /// Drops the kernel's entries of files written by such handles.
    pub refresh: Arc<Refresher>,
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

/// Answers a request that returns nothing.
fn empty<E: Into<i32>>(reply: ReplyEmpty, r: std::result::Result<(), E>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(err(e.into())),
    }
}

/// Answers getxattr/listxattr: the size when asked for it (`size` 0), else the bytes, or
/// ERANGE when they do not fit.
fn xattr_reply(reply: ReplyXattr, size: u32, r: std::result::Result<Vec<u8>, i32>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(err(libc::ERANGE)),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(err(e)),
    }
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
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.core.ops.time("lookup");
        match self.core.lookup(parent.0, name.as_bytes()) {
            Ok(a) => reply.entry(&TTL, &fattr(&a), Generation(0)),
            // A name that is not there, in a directory that exists and is loaded: a negative
            // entry (node 0) the kernel keeps for TTL, so a program that probes the same
            // missing paths again (an interpreter's module search, a build's header search)
            // is answered from the dentry cache. Safe because every change to the namespace
            // after a directory is loaded goes through this kernel mount (creates, renames
            // and links replace the negative entry there).
            Err(libc::ENOENT) if self.core.is_dir(parent.0) => {
                reply.entry(&TTL, &negative_entry(), Generation(0))
            }
            Err(e) => reply.error(err(e)),
        }
    }

    /// The kernel evicted the inode: no copy of its times is left in the kernel.
    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        self.core.forget_kernel_copy(ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.core.ops.time("getattr");
        match self.core.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &fattr(&a)),
            Err(e) => reply.error(err(e)),
        }
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
        let _t = self.core.ops.time("setattr");
        // Under FUSE_HANDLE_KILLPRIV_V2 the kernel leaves clearing privileges to us: a chown
        // of a file clears set-ID (as the kernel's chown does, for anyone), a truncate by an
        // unprivileged user too; both drop file capabilities.
        let chown = (uid.is_some() || gid.is_some()) && mode.is_none();
        if chown || size.is_some() {
            if let Err(e) = self.core.kill_priv(ino.0, chown || req.uid() != 0) {
                reply.error(err(e));
                return;
            }
        }
        // Only times, through a handle: the kernel writing back the times it keeps in
        // writeback-cache mode (a program's utimes carries no handle). They may predate a
        // direct write it never saw (see `refresh`).
        let from_kernel =
            fh.is_some() && mode.is_none() && uid.is_none() && gid.is_none() && size.is_none();
        match self.core.setattr(
            ino.0,
            mode,
            uid,
            gid,
            size,
            tot(atime),
            tot(mtime),
            from_kernel,
        ) {
            Ok(a) => reply.attr(&TTL, &fattr(&a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _t = self.core.ops.time("readlink");
        match self.core.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(err(e)),
        }
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
        let _t = self.core.ops.time("mknod");
        let r = if mode & libc::S_IFMT == libc::S_IFREG {
            self.core.create(
                parent.0,
                name.as_bytes(),
                self.masked(parent.0, mode, umask),
                req.uid(),
                req.gid(),
                false,
            )
        } else if matches!(mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK) && req.uid() != 0 {
            // As on ext4: device nodes need CAP_MKNOD.
            Err(libc::EPERM)
        } else {
            self.core.mknod(
                parent.0,
                name.as_bytes(),
                (mode & libc::S_IFMT) | (self.masked(parent.0, mode, umask) & 0o7777),
                rdev as u64,
                req.uid(),
                req.gid(),
            )
        };
        match r {
            Ok(a) => reply.entry(&TTL, &fattr(&a), Generation(0)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _t = self.core.ops.time("setxattr");
        empty(
            reply,
            self.core
                .setxattr(ino.0, name.as_bytes(), Some(value), flags),
        )
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = self.core.ops.time("getxattr");
        tracing::debug!("getxattr {ino:?} {name:?}");
        xattr_reply(reply, size, self.core.getxattr(ino.0, name.as_bytes()))
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = self.core.ops.time("listxattr");
        xattr_reply(reply, size, self.core.listxattr(ino.0))
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.core.ops.time("removexattr");
        empty(reply, self.core.setxattr(ino.0, name.as_bytes(), None, 0))
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
        let _t = self.core.ops.time("mkdir");
        match self.core.mkdir(
            parent.0,
            name.as_bytes(),
            self.masked(parent.0, mode, umask),
            req.uid(),
            req.gid(),
        ) {
            Ok(a) => reply.entry(&TTL, &fattr(&a), Generation(0)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.core.ops.time("unlink");
        empty(reply, self.core.unlink(parent.0, name.as_bytes(), false))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.core.ops.time("rmdir");
        empty(reply, self.core.unlink(parent.0, name.as_bytes(), true))
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _t = self.core.ops.time("symlink");
        match self.core.symlink(
            parent.0,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
            req.uid(),
            req.gid(),
        ) {
            Ok(a) => reply.entry(&TTL, &fattr(&a), Generation(0)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.core.ops.time("rename");
        match self.core.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.bits(),
        ) {
            Ok(()) => {
                reply.ok();
                // A file written through a direct handle and renamed right after its close
                // (write a temporary name, then rename: the checkpoint writer's way): the
                // invalidation queued at its release may have named the old entry before
                // the rename moved it. Queued again for the new name; the kernel applies it
                // once the rename holds the directories no longer.
                if let Some(ino) = self.core.direct_written_at(newparent.0, newname.as_bytes()) {
                    self.refresh.drop_entries(ino);
                }
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _t = self.core.ops.time("link");
        match self.core.link(ino.0, newparent.0, newname.as_bytes()) {
            Ok(a) => reply.entry(&TTL, &fattr(&a), Generation(0)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.core.ops.time("open");
        // Before anything that may wait: the kernel's copy of the times is never older than
        // this by more than a tick of its coarse clock (see `Core::setattr`).
        let started = now_ns();
        // FUSE_ATOMIC_O_TRUNC: the truncate of open(O_TRUNC) arrives here (the kernel checked
        // write permission). Like the truncate it replaces, it clears privileges.
        if flags.0 & libc::O_TRUNC != 0 {
            let r = self.core.kill_priv(ino.0, req.uid() != 0).and_then(|()| {
                self.core
                    .setattr(ino.0, None, None, None, Some(0), None, None, false)
                    .map(|_| ())
            });
            if let Err(e) = r {
                reply.error(err(e));
                return;
            }
        }
        match self.core.open(ino.0) {
            Ok(()) => {
                let (fh, f) = open_flags(flags.0, false, self.direct_writes, started);
                reply.opened(fh, f)
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _t = self.core.ops.time("read");
        match self.core.read(ino.0, offset, size) {
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(err(e)),
        }
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
        let _t = self.core.ops.time("write");
        let kill = req.uid() != 0 || write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let direct = is_direct(Some(fh));
        match self.core.write(ino.0, offset, data, kill, direct) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(err(e)),
        }
    }

    /// Answered ENOSYS, once: the kernel then stops sending FLUSH at every `close` (one
    /// round trip fewer per close; `fuse_flush` still writes the cached pages back and
    /// reports their errors to `close`). What a flush would do happens at the last close
    /// (`release`): the inode row and the queueing of the drain; the journal promises
    /// nothing at a `close` that no `fsync` covered (README, Guarantees). No POSIX locks are
    /// kept here (the kernel keeps them), so no lock owner needs the flush either.
    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = self.core.ops.time("flush");
        let r = self.core.flush_handle(ino.0);
        if r.is_ok() {
            self.refresh_times(ino.0, fh);
        }
        match r {
            Ok(()) => reply.error(Errno::ENOSYS),
            Err(e) => reply.error(err(e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.core.ops.time("release");
        // The entries are dropped after the reply: until the kernel has it, the pending
        // release holds the inode, which would then outlive its entries with the open's
        // mtime (the kernel's end of the release drops that hold when the reply is written).
        // With another handle still open (a reader that opened the file meanwhile) the last
        // release drops them instead (`Node::kernel_stale`).
        let r = self.core.release(ino.0, is_direct(Some(fh)));
        if let Err(e) = r {
            // The kernel does not pass a release's error on (the close has returned).
            tracing::warn!(
                "release of inode {}: {}",
                ino.0,
                std::io::Error::from_raw_os_error(e)
            );
        }
        empty(reply, r.map(|_| ()));
        if r == Ok(true) {
            self.refresh.drop_entries(ino.0);
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.core.ops.time("fsync");
        empty(reply, self.core.fsync(ino.0))
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.core.ops.time("opendir");
        match self.core.getattr(ino.0) {
            Ok(a) if a.kind == Kind::Dir => reply.opened(FileHandle(0), FopenFlags::empty()),
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _t = self.core.ops.time("readdir");
        match self.core.readdir(ino.0, offset) {
            Ok(ents) => {
                let mut pos = offset;
                for (i, k, name) in ents {
                    pos += 1;
                    if reply.add(INodeNo(i), pos, ft(k), OsStr::from_bytes(&name)) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.core.ops.time("fsyncdir");
        empty(reply, self.core.fsync(ino.0))
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _t = self.core.ops.time("statfs");
        let bsize = 4096u64;
        let (blocks, bfree) = match rustix::fs::statvfs(&self.core.backing) {
            Ok(s) => (
                s.f_blocks * s.f_frsize / bsize,
                s.f_bavail * s.f_frsize / bsize,
            ),
            Err(_) => (0, 0),
        };
        reply.statfs(blocks, bfree, bfree, 0, 0, bsize as u32, 255, bsize as u32);
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
        let _t = self.core.ops.time("create");
        let started = now_ns();
        match self.core.create(
            parent.0,
            name.as_bytes(),
            self.masked(parent.0, mode, umask),
            req.uid(),
            req.gid(),
            true,
        ) {
            Ok(a) => {
                let (fh, f) = open_flags(flags, true, self.direct_writes, started);
                reply.created(&TTL, &fattr(&a), Generation(0), fh, f)
            }
            Err(e) => reply.error(err(e)),
        }
    }
}
