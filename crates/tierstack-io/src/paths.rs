//! Which paths are under a mount the client serves, and how the daemon is to walk them.
//!
//! A path is the program's, made absolute without touching its components: an absolute one
//! as it is, a relative one after the working folder (kept here, read again after each
//! `chdir`) or after the folder of a directory descriptor (`/proc/self/fd`). It is under a
//! mount when it starts with the mountpoint at a component boundary; the rest is what the
//! daemon walks (`.` and `..` included: a lexical `..` is wrong after a symbolic link, and
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

/// The folder a directory descriptor stands for.
fn dir_of(fd: libc::c_int) -> Option<Vec<u8>> {
    let link = format!("/proc/self/fd/{fd}\0");
    let mut buf = vec![0u8; 4096];
    // SAFETY: readlink of a NUL-terminated path into `buf`, at most its length.
    let n = unsafe { libc::readlink(link.as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 || n as usize >= buf.len() {
        return None;
    }
    buf.truncate(n as usize);
    (buf.first() == Some(&b'/')).then_some(buf)
}

/// A path under a mount.
pub struct Under {
    /// The mount's index.
    pub mount: usize,
    /// The path from the mount's root, as the daemon walks it.
    pub rel: Vec<u8>,
    /// The absolute path (to open it through the kernel in a promotion).
    pub abs: Vec<u8>,
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
                    abs: abs.to_vec(),
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
    let base = if dirfd == libc::AT_FDCWD {
        cwd()?
    } else {
        if crate::fds::maybe(dirfd) && crate::fds::get(dirfd).is_some() {
            // A file, not a directory: the kernel answers ENOTDIR.
            return None;
        }
        dir_of(dirfd)?
    };
    let mut abs = base;
    if abs.last() != Some(&b'/') {
        abs.push(b'/');
    }
    abs.extend_from_slice(p);
    split(&abs)
}
