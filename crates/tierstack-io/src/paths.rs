//! Which paths are under a mount the client serves, and how the daemon is to walk them.
//!
//! A path is the program's, made absolute without touching its components: an absolute one
//! as it is, a relative one after the working folder (kept here, read again after each
//! `chdir`). It is under a mount when it starts with the mountpoint at a component boundary;
//! the rest is what the daemon walks. A path relative to a directory descriptor (the `*at`
//! calls) is under a mount when the descriptor's device is the mount's (`fstat`, which the
//! kernel answers from its cache): the daemon then walks it from that directory's node, so a
//! directory renamed since it was opened is still the one meant (`.` and `..` included: a lexical `..` is wrong after a symbolic link, and
//! the daemon leaves both to the kernel). A mount reached through a symbolic link outside it
//! is not recognised: the kernel serves those paths, correctly.

use std::ffi::CStr;

use parking_lot::Mutex;

use crate::conn::mounts;

static CWD: Mutex<Option<Vec<u8>>> = Mutex::new(None);

/// Forgets the working folder (after a `chdir`).
pub fn cwd_changed() {
    *CWD.lock() = None;
}

fn cwd() -> Option<Vec<u8>> {
    let mut c = CWD.lock();
    if c.is_none() {
        let mut buf = vec![0u8; 4096];
        // SAFETY: getcwd writes at most `buf.len()` bytes into `buf`.
        let p = unsafe { libc::getcwd(buf.as_mut_ptr().cast(), buf.len()) };
        if p.is_null() {
            return None;
        }
        let n = buf.iter().position(|&b| b == 0)?;
        buf.truncate(n);
        *c = Some(buf);
    }
    c.clone()
}

/// The mount and node of the directory descriptor `fd`, if it is one of a mount's. Asked
/// with `AT_STATX_DONT_SYNC`: type, device and inode number never go stale, so the kernel
/// answers from its cache without a GETATTR round trip (the client's own changes invalidate
/// the directory's attributes there).
fn dir_node(fd: libc::c_int) -> Option<(usize, u64)> {
    // SAFETY: an all-zero statx is valid for statx to fill.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    let statx = crate::real!(statx: fn(libc::c_int, *const libc::c_char, libc::c_int, libc::c_uint, *mut libc::statx) -> libc::c_int);
    let flags = libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC;
    // SAFETY: statx of a descriptor with an empty NUL-terminated path into a live local.
    let rc = unsafe {
        statx(
            fd,
            c"".as_ptr(),
            flags,
            libc::STATX_TYPE | libc::STATX_INO,
            &mut sx,
        )
    };
    if rc != 0 || u32::from(sx.stx_mode) & libc::S_IFMT != libc::S_IFDIR {
        return None;
    }
    let dev = libc::makedev(sx.stx_dev_major, sx.stx_dev_minor);
    let m = mounts().iter().position(|m| m.dev() == Some(dev))?;
    Some((m, sx.stx_ino))
}

/// A path under a mount.
pub struct Under {
    /// The mount's index.
    pub mount: usize,
    /// The path from `base`, as the daemon walks it.
    pub rel: Vec<u8>,
    /// The directory node it starts from (0: the mount's root).
    pub base: u64,
}

/// The mount `abs` lies under, and the rest of it.
pub fn split(abs: &[u8]) -> Option<Under> {
    for (i, m) in mounts().iter().enumerate() {
        let root = m.root.as_slice();
        if let Some(rest) = abs.strip_prefix(root) {
            if rest.is_empty() || rest[0] == b'/' || root == b"/" {
                return Some(Under {
                    mount: i,
                    rel: rest.strip_prefix(b"/").unwrap_or(rest).to_vec(),
                    base: 0,
                });
            }
        }
    }
    None
}

/// Where `path` (relative to `dirfd`, `AT_FDCWD` for the working folder) lies, if under a
/// mount.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
pub unsafe fn under(dirfd: libc::c_int, path: *const libc::c_char) -> Option<Under> {
    if path.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let p = unsafe { CStr::from_ptr(path) }.to_bytes();
    if p.is_empty() || mounts().is_empty() {
        return None;
    }
    if p[0] == b'/' {
        return split(p);
    }
    if dirfd != libc::AT_FDCWD {
        if crate::fds::maybe(dirfd) && crate::fds::get(dirfd).is_some() {
            // A file, not a directory: the kernel answers ENOTDIR.
            return None;
        }
        let (mount, base) = dir_node(dirfd)?;
        return Some(Under {
            mount,
            rel: p.to_vec(),
            base,
        });
    }
    let mut abs = cwd()?;
    if abs.last() != Some(&b'/') {
        abs.push(b'/');
    }
    abs.extend_from_slice(p);
    split(&abs)
}
