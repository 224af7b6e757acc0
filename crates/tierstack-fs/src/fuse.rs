//! The FUSE side: the file system's operations over [`Core`] ([`TierFs::answer`], one
//! decoded request [`Op`] in, one [`Out`] answer back: the handlers of the table of
//! [`crate::ops`]), and the FUSE INIT handshake (`fuser::Filesystem::init`; `fuser` mounts
//! and agrees INIT, nothing else). The requests themselves reach [`TierFs::serve_decoded`]
//! through [`crate::dev`] (`/dev/fuse`) and [`crate::uring`] (the kernel's io_uring
//! queues), both decoding with [`crate::ops::wire`].

use std::sync::Arc;

use fuser::{FileHandle, FopenFlags, KernelConfig, Request};

use crate::core::{now_ns, Core, Kind, PAGE};
use crate::ops::wire;
pub use crate::ops::{Answer, Caller, Op, OpKind, Out, Statfs};
use crate::refresh::{is_direct, may_write, open_flags, Refresher, STALE_NS};

/// The mounted file system: every operation is served by the core, whichever transport
/// carries it (the `/dev/fuse` readers of [`crate::dev`], and the io_uring queues of
/// [`crate::uring`] when the kernel offers them; each transport holds a clone).
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
    /// Whether INIT asks for listings with attributes (READDIRPLUS, see [`Op::Readdirplus`]).
    pub readdirplus: bool,
    /// The only user whose requests are served, where the mount is not shared
    /// (`--allow-other` not given): the mounting user. Others get EACCES, except for what
    /// the kernel sends on a file's behalf without a caller (reads and writes of open
    /// files, fsync, release, listings).
    pub only_uid: Option<u32>,
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
    /// Serves a request as [`wire::decode`] decoded it, for either transport: its answer,
    /// the inode whose kernel entries are to be dropped once the answer is sent
    /// ([`TierFs::after_reply`]) and the most bytes the answer may hold; None for a request
    /// that takes no answer (FORGET, INTERRUPT).
    pub fn serve_decoded(
        &self,
        h: &wire::Header,
        decoded: Result<wire::Decoded<'_>, i32>,
    ) -> Option<(Answer, Option<u64>, usize)> {
        let d = match decoded {
            Ok(d) => d,
            Err(e) => return Some((Err(e), None, usize::MAX)),
        };
        let (r, then) = match d.request {
            wire::Request::Serve(op) if !self.serves(h.uid, &op) => (Err(libc::EACCES), None),
            wire::Request::Serve(op) => {
                let making = self.core.kernel_refs().begin_naming(dirs_named(&op));
                let (r, then) = self.answer(
                    op,
                    Caller {
                        uid: h.uid,
                        gid: h.gid,
                    },
                );
                let attrs = match &r {
                    Ok(Out::Attr(a)) => Some(a.ino),
                    _ => None,
                };
                making.done(entries_given(&r), attrs);
                (r, then)
            }
            wire::Request::Answer(0) => (Ok(Out::Empty), None),
            wire::Request::Answer(e) => (Err(e), None),
            wire::Request::Forget(inos) => {
                for (ino, n) in inos {
                    self.core.kernel_refs().forget(ino, n);
                    self.core.forget_kernel_copy(ino);
                }
                return None;
            }
            wire::Request::Silent => return None,
        };
        Some((r, then, d.limit))
    }

    /// Whether a request of `uid` for `op` is served (see [`TierFs::only_uid`]).
    fn serves(&self, uid: u32, op: &Op<'_>) -> bool {
        match self.only_uid {
            Some(only) if uid != only => matches!(
                op,
                Op::Read { .. }
                    | Op::Write { .. }
                    | Op::Fsync { .. }
                    | Op::Fsyncdir { .. }
                    | Op::Release { .. }
                    | Op::Readdir { .. }
                    | Op::Readdirplus { .. }
            ),
            _ => true,
        }
    }

    /// What must happen once the reply is with the kernel: the inode whose kernel entries are
    /// to be dropped (see `refresh`), if any. Until the kernel has a release's reply, the
    /// pending release holds the inode, which would then outlive its entries with the
    /// open's mtime.
    pub fn after_reply(&self, then: Option<u64>) {
        // Entries of a node the kernel holds no count of are not in its caches: nothing to
        // drop (a file a program under the interception client wrote).
        if let Some(ino) = then.filter(|&i| self.core.kernel_refs().may_hold(i)) {
            self.refresh.drop_entries(ino);
        }
    }

    /// The answer to `op` for `caller`, and the inode whose kernel entries are to be dropped
    /// once the answer is sent ([`TierFs::after_reply`]). Timed in `status --json`'s `ops`.
    pub fn answer(&self, op: Op<'_>, caller: Caller) -> (Answer, Option<u64>) {
        let touched = Self::touched(&op);
        let out = self.answer_op(op, caller);
        // After the change is made (and visible): see `tierstack_ioproto::vers`.
        if let Some((ino, perm)) = touched {
            self.core.changed(ino, perm);
        }
        out
    }

    /// The node whose attributes `op` may change, and whether who may walk through it too
    /// (the interception client's change counts are raised for it once it is done). Names
    /// entered and removed, and the nodes they name, are counted by the namespace itself
    /// (`Ns::insert_child`, `Ns::remove_child`).
    fn touched(op: &Op<'_>) -> Option<(u64, bool)> {
        match *op {
            Op::Setattr { ino, .. } | Op::Setxattr { ino, .. } | Op::Removexattr { ino, .. } => {
                Some((ino, true))
            }
            Op::Write { ino, .. } | Op::Fallocate { ino, .. } => Some((ino, false)),
            Op::Open { ino, flags } if flags & libc::O_TRUNC != 0 => Some((ino, false)),
            _ => None,
        }
    }

    fn answer_op(&self, op: Op<'_>, caller: Caller) -> (Answer, Option<u64>) {
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
                Err(libc::ENOENT) if core.is_dir(parent) => Ok(Out::Negative(core.negative_ttl())),
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
            Op::Readdirplus { ino, offset, size } => core.readdir(ino, offset).map(|ents| {
                // Each entry as its lookup answers it, as many as fit in `size` bytes: the
                // kernel counts a lookup for each entry it is given, so none is looked up
                // that the answer cannot hold.
                let mut room = size as usize;
                let mut out = Vec::new();
                for ((i, _, name), pos) in ents.into_iter().zip(offset + 1..) {
                    let need = wire::direntplus_len(name.len());
                    if need > room {
                        break;
                    }
                    let a = if name == b"." || name == b".." {
                        core.getattr(i)
                    } else {
                        core.lookup(ino, &name)
                    };
                    // Gone since the listing (a concurrent unlink): the next listing shows it.
                    if let Ok(a) = a {
                        room -= need;
                        out.push((a, pos, name));
                    }
                }
                Out::DirPlus(out)
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

/// The nodes an answer gives the kernel an entry of (each adds one to the node's lookup
/// count: see [`crate::kernel_refs`]); `.` and `..` of a listing add none.
/// The directories under which the kernel may hold an entry once `op` is answered (see
/// [`crate::kernel_refs`]).
fn dirs_named(op: &Op<'_>) -> impl Iterator<Item = u64> {
    let dirs = match *op {
        Op::Lookup { parent, .. }
        | Op::Mknod { parent, .. }
        | Op::Mkdir { parent, .. }
        | Op::Unlink { parent, .. }
        | Op::Rmdir { parent, .. }
        | Op::Symlink { parent, .. }
        | Op::Create { parent, .. } => [Some(parent), None],
        Op::Rename {
            parent, newparent, ..
        } => [Some(parent), Some(newparent)],
        Op::Link { newparent, .. } => [Some(newparent), None],
        Op::Readdirplus { ino, .. } => [Some(ino), None],
        _ => [None, None],
    };
    dirs.into_iter().flatten()
}

fn entries_given(r: &Answer) -> Vec<u64> {
    match r {
        Ok(Out::Entry(a)) | Ok(Out::Created(a, ..)) => vec![a.ino],
        Ok(Out::DirPlus(v)) => v
            .iter()
            .filter(|(_, _, name)| name != b"." && name != b"..")
            .map(|(a, ..)| a.ino)
            .collect(),
        _ => Vec::new(),
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
        // File handles that outlive the kernel's inode cache (`tierstack export`, NFS): the
        // kernel finds a node it has forgotten by LOOKUP of "." in it (and its directory by
        // ".."), checked against the generation the entry carried (`Db::generation`).
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_EXPORT_SUPPORT);
        // FUSE over io_uring (`crate::uring`), when asked for and the kernel offers it.
        if let Some(ring) = &self.ring {
            let uring = ring.wanted()
                && config
                    .add_capabilities(fuser::InitFlags::FUSE_OVER_IO_URING)
                    .is_ok();
            ring.negotiated(uring);
        }
        // Listings with attributes (`Op::Readdirplus`), where the kernel finds them worth it
        // (AUTO: after a listing was followed by lookups of its names).
        if self.readdirplus {
            let _ = config.add_capabilities(
                fuser::InitFlags::FUSE_DO_READDIRPLUS | fuser::InitFlags::FUSE_READDIRPLUS_AUTO,
            );
        }
        Ok(())
    }
}
