//! Direct writes: a handle that only writes a new or truncated file bypasses the kernel's page
//! cache (`FOPEN_DIRECT_IO`), so its bytes reach the daemon as they are written, once, instead
//! of being copied into the page cache and handed over again at `fsync` or close. This is the
//! checkpoint writer's path (`open(O_WRONLY|O_CREAT|O_TRUNC)`, large writes, `fsync`, close).
//!
//! The kernel keeps a regular file's times itself in writeback-cache mode, and its direct-write
//! path does not advance them: while such a handle is open the file's mtime reads as of the
//! open. Two things put the daemon's times (the last write's) in front of users again:
//!
//! - The kernel writes its cached times back through an open handle (a SETATTR carrying a
//!   handle and only times, whichever writable handle is first on its list); the daemon then
//!   keeps its mtime if a direct write came later (`Node::direct_mtime`).
//! - At the release (last close) of a direct handle whose last write came later than
//!   [`STALE_NS`] after the open, the file's directory entries are dropped from the kernel's
//!   cache ([`Refresher::drop_entries`], asynchronously: nothing waits for it); with no entry
//!   and no open file left the kernel forgets the inode, and the next lookup reads the
//!   daemon's attributes. The release reaches the daemon after `close` returns (the mount
//!   answers FLUSH with ENOSYS, so a close costs no round trip of its own), so a `stat`
//!   right after the close may still see the open's mtime until the notification lands
//!   (normally within a millisecond); while another process holds the file open the kernel
//!   keeps the inode, and its mtime, until that one closes too: the release that leaves no
//!   handle open drops the entries again (`Node::kernel_stale`). A rename of a file a direct
//!   handle wrote queues the same for its new name: the release may have named the old one
//!   (write a temporary name, close, rename: the checkpoint writer's way). A file written
//!   within [`STALE_NS`] of its open (small files) keeps its entries: its mtime is off by
//!   less than the kernel clock's own granularity.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::mpsc::{self, Sender};

use fuser::{FileHandle, FopenFlags, INodeNo, Notifier};
use parking_lot::Mutex;

use crate::core::Link;

pub use crate::core::STALE_NS;

/// The handle and open flags for an open with `flags` (`fresh`: the open created the file):
/// a direct handle (its number is `started`, the time in ns the open reached the daemon, never
/// below 2) for a write-only,
/// non-appending open of a new or truncated file when `direct` is on; otherwise the page
/// cache is kept (contents change only through this mount) and the handle is 1 when it may
/// write (a create counts as one), 0 when it only reads.
pub fn open_flags(flags: i32, fresh: bool, direct: bool, started: i64) -> (FileHandle, FopenFlags) {
    let write_only = flags & libc::O_ACCMODE == libc::O_WRONLY;
    let append = flags & libc::O_APPEND != 0;
    let whole = fresh || flags & libc::O_TRUNC != 0;
    if direct && write_only && !append && whole {
        let opened = started.max(2) as u64;
        (
            FileHandle(opened),
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
        )
    } else {
        let writes = fresh || flags & libc::O_ACCMODE != libc::O_RDONLY;
        (FileHandle(writes as u64), FopenFlags::FOPEN_KEEP_CACHE)
    }
}

/// Whether `fh` is a direct handle (see [`open_flags`]); its open time in ns if so.
pub fn is_direct(fh: Option<FileHandle>) -> Option<i64> {
    match fh {
        Some(FileHandle(0 | 1)) | None => None,
        Some(FileHandle(t)) => Some(t as i64),
    }
}

/// Whether a handle from [`open_flags`] may write.
pub fn may_write(fh: FileHandle) -> bool {
    fh.0 != 0
}

/// The names a node has now, as (directory, name) pairs.
pub type Names = Box<dyn Fn(u64) -> Vec<Link> + Send>;

/// Sends entry invalidations to the kernel from a thread of its own, never waited for: the
/// kernel locks the parent directory to apply one, and the request holding that lock may be
/// queued behind the FUSE thread that asked (a FUSE thread that waited here could stall every
/// request for as long as it waits). Inodes are queued, not names: the names are looked up
/// when the invalidation goes out, so a file renamed just after its close (a checkpoint's
/// `rename(tmp, final)`) has its new name dropped.
#[derive(Default)]
pub struct Refresher {
    tx: Mutex<Option<Sender<u64>>>,
}

impl Refresher {
    /// Starts the notifying thread over the session's `notifier`, with `names` to find an
    /// inode's names. It ends when the refresher is dropped (with the file system, at
    /// unmount).
    pub fn start(&self, notifier: Notifier, names: Names) -> std::io::Result<()> {
        let (tx, rx) = mpsc::channel::<u64>();
        std::thread::Builder::new()
            .name("fuse-notify".into())
            .spawn(move || {
                while let Ok(ino) = rx.recv() {
                    for (parent, name) in names(ino) {
                        // ENOENT: the kernel holds no such entry; nothing to drop.
                        let _ = notifier.inval_entry(INodeNo(parent), OsStr::from_bytes(&name));
                    }
                }
            })?;
        *self.tx.lock() = Some(tx);
        Ok(())
    }

    /// Queues the dropping of the kernel's entries of inode `ino`.
    pub fn drop_entries(&self, ino: u64) {
        if let Some(tx) = self.tx.lock().as_ref() {
            let _ = tx.send(ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::now_ns;

    #[test]
    fn only_whole_file_write_only_opens_are_direct() {
        let d = |f, fresh| {
            open_flags(f, fresh, true, now_ns())
                .1
                .contains(FopenFlags::FOPEN_DIRECT_IO)
        };
        assert!(d(libc::O_WRONLY, true));
        assert!(d(libc::O_WRONLY | libc::O_TRUNC, false));
        assert!(
            !d(libc::O_WRONLY, false),
            "an overwrite in place keeps the cache"
        );
        assert!(
            !d(libc::O_WRONLY | libc::O_APPEND, true),
            "appenders keep the cache"
        );
        assert!(!d(libc::O_RDWR | libc::O_TRUNC, true));
        assert!(!d(libc::O_RDONLY, false));
        assert!(!open_flags(libc::O_WRONLY, true, false, now_ns())
            .1
            .contains(FopenFlags::FOPEN_DIRECT_IO));
        let (fh, _) = open_flags(libc::O_WRONLY, true, true, now_ns());
        assert!(is_direct(Some(fh)).is_some_and(|t| t > 0));
        assert_eq!(is_direct(Some(FileHandle(0))), None);
        assert_eq!(is_direct(None), None);
    }
}
