//! The descriptors the client serves ("virtual"): a table by descriptor number, and a bitmap
//! that answers "is this one of ours" without a lock for the low numbers (every `read` and
//! `write` of the program asks it).

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

use parking_lot::Mutex;

/// An open file served by the client.
#[derive(Debug, Clone)]
pub struct VFile {
    /// Index of its mount in [`crate::conn::mounts`].
    pub mount: usize,
    /// Its node.
    pub ino: u64,
    /// The daemon's handle.
    pub fh: u64,
    /// `open`'s flags as the program sees them (`F_GETFL`): access mode, `O_APPEND`,
    /// `O_NONBLOCK`, `O_SYNC`, `O_DSYNC`.
    pub flags: i32,
    /// The file offset.
    pub off: u64,
    /// Whether the program asked for close-on-exec (the reserved number itself always is).
    pub cloexec: bool,
    /// The connection it was opened under ([`crate::conn::Mount::epoch`]).
    pub epoch: u32,
}

const WORDS: usize = 1024;
/// Descriptor numbers below this are answered by the bitmap.
const LOW: RawFd = (WORDS * 64) as RawFd;

static BITS: [AtomicU64; WORDS] = [const { AtomicU64::new(0) }; WORDS];
/// Whether any virtual descriptor is at or above [`LOW`].
static HIGH: AtomicBool = AtomicBool::new(false);
static TABLE: Mutex<BTreeMap<RawFd, VFile>> = Mutex::new(BTreeMap::new());

fn bit(fd: RawFd) -> (usize, u64) {
    ((fd / 64) as usize, 1u64 << (fd % 64))
}

/// Whether `fd` may be virtual (exact for low numbers; for high ones, whether any is).
pub fn maybe(fd: RawFd) -> bool {
    if fd < 0 {
        return false;
    }
    if fd >= LOW {
        return HIGH.load(SeqCst);
    }
    let (w, b) = bit(fd);
    BITS[w].load(SeqCst) & b != 0
}

/// A copy of the virtual file at `fd`.
pub fn get(fd: RawFd) -> Option<VFile> {
    if !maybe(fd) {
        return None;
    }
    TABLE.lock().get(&fd).cloned()
}

/// Changes the virtual file at `fd` with `f`; false if there is none.
pub fn update(fd: RawFd, f: impl FnOnce(&mut VFile)) -> bool {
    match TABLE.lock().get_mut(&fd) {
        Some(v) => {
            f(v);
            true
        }
        None => false,
    }
}

/// Enters `v` at `fd`.
pub fn insert(fd: RawFd, v: VFile) {
    let mut t = TABLE.lock();
    t.insert(fd, v);
    if fd >= LOW {
        HIGH.store(true, SeqCst);
    } else {
        let (w, b) = bit(fd);
        BITS[w].fetch_or(b, SeqCst);
    }
}

/// Takes the virtual file at `fd` out of the table.
pub fn remove(fd: RawFd) -> Option<VFile> {
    if !maybe(fd) {
        return None;
    }
    let mut t = TABLE.lock();
    let v = t.remove(&fd)?;
    if fd < LOW {
        let (w, b) = bit(fd);
        BITS[w].fetch_and(!b, SeqCst);
    }
    Some(v)
}

/// Every virtual descriptor and its file (for a promotion of all before `fork` or `exec`).
pub fn all() -> Vec<(RawFd, VFile)> {
    TABLE.lock().iter().map(|(k, v)| (*k, v.clone())).collect()
}
