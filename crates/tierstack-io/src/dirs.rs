//! Directory streams of the client: `opendir` of a directory under a mount lists it from the
//! daemon (`Req::List`, every entry at once, a few round trips for a large directory) instead
//! of the kernel's OPENDIR, READDIR(PLUS)... and RELEASEDIR, and `readdir` then answers from
//! that list. The list is the directory as it was at `opendir` (or `rewinddir`), which
//! POSIX allows ("whether an entry added or removed after the most recent call to opendir()
//! or rewinddir() is returned is unspecified").
//!
//! A stream of the client is a `VDir` handed to the program as its `DIR *`; a registry tells
//! them from the C library's, so every function that takes a `DIR *` is interposed here:
//! `readdir`, `readdir64`, `readdir_r`, `readdir64_r`, `closedir`, `dirfd`, `rewinddir`,
//! `telldir` and `seekdir`. `dirfd` opens the directory through the kernel at its first
//! call (a real descriptor, for `fstatat`, `openat`, `fchdir`, `fsync`). The C library's own
//! users of directories (`scandir`, `nftw`, `fts`, `glob`) call its internal functions and
//! get the kernel's streams, which is as correct, only slower.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use libc::{c_char, c_int, c_long, dirent, dirent64, DIR};
use parking_lot::Mutex;
use tierstack_ioproto::msg::{entries, LIST_MAX};
use tierstack_ioproto::Req;

use crate::conn::{mounts, Got, Mount};
use crate::paths::{self, Under};
use crate::{outside, real, set_errno};

// The stream's entry is handed out as either; they are one layout on this platform.
const _: () = assert!(std::mem::size_of::<dirent>() == std::mem::size_of::<dirent64>());

/// One entry of a listing.
struct Ent {
    ino: u64,
    next: u64,
    kind: u8,
    name: Vec<u8>,
}

/// A directory stream of the client.
struct VDir {
    /// The directory, absolute (for `dirfd` and `rewinddir`).
    abs: Vec<u8>,
    mount: usize,
    rel: Vec<u8>,
    ents: Vec<Ent>,
    /// The next entry `readdir` returns.
    at: usize,
    /// What `readdir` returns a pointer to (valid until the next call on the stream).
    ent: dirent64,
    /// The descriptor `dirfd` opened (-1 before).
    fd: c_int,
}

/// The streams of the client, by address.
static DIRS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
/// How many there are (a `readdir` of the C library's stream looks no further while 0).
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The client's stream at `d`, if it is one.
fn ours(d: *mut DIR) -> Option<&'static mut VDir> {
    if d.is_null() || COUNT.load(Relaxed) == 0 {
        return None;
    }
    if !DIRS.lock().as_ref()?.contains(&(d as usize)) {
        return None;
    }
    // SAFETY: `d` is a `VDir` this module allocated and has not freed (it is registered);
    // a stream is used by one thread at a time, as POSIX requires of its callers.
    Some(unsafe { &mut *(d as *mut VDir) })
}

/// Why a listing was not made by the client.
enum NoList {
    /// The kernel is to answer (no connection, or the daemon leaves it).
    Kernel,
    /// This errno.
    Err(i32),
}

/// Every entry of the directory `u` names.
fn list(m: &Mount, u: &Under) -> Result<Vec<Ent>, NoList> {
    let mut buf = vec![0u8; LIST_MAX];
    let mut out: Vec<Ent> = Vec::new();
    let mut pos = 0u64;
    loop {
        let req = Req::List {
            base: u.base,
            path: &u.rel,
            pos,
        };
        let n = match m.call(&req, &[], &mut buf) {
            Ok(Got::Read(n)) => n,
            Ok(Got::Err(e)) => return Err(NoList::Err(e)),
            Ok(_) => return Err(NoList::Err(libc::EIO)),
            Err(_) => return Err(NoList::Kernel),
        };
        if n == 0 {
            return Ok(out);
        }
        let got = entries(&buf[..n]).ok_or(NoList::Err(libc::EIO))?;
        let Some(last) = got.last() else {
            return Ok(out);
        };
        if last.next <= pos {
            // Positions only grow; anything else is a damaged answer, not a loop.
            return Err(NoList::Err(libc::EIO));
        }
        pos = last.next;
        out.extend(got.iter().map(|e| Ent {
            ino: e.ino,
            next: e.next,
            kind: e.kind,
            name: e.name.to_vec(),
        }));
    }
}

/// `opendir` of a directory under a mount: Some(stream or NULL with errno) or None for the
/// kernel.
fn open_virtual(name: *const c_char) -> Option<*mut DIR> {
    outside(|| {
        // SAFETY: the program's NUL-terminated path.
        let u = unsafe { paths::under(libc::AT_FDCWD, name) }?;
        let m = mounts().get(u.mount)?;
        let ents = match list(m, &u) {
            Ok(e) => e,
            Err(NoList::Kernel) => return None,
            Err(NoList::Err(e)) => {
                set_errno(e);
                return Some(std::ptr::null_mut());
            }
        };
        let mut abs = m.root.clone();
        if !u.rel.is_empty() {
            abs.push(b'/');
            abs.extend_from_slice(&u.rel);
        }
        let d = Box::new(VDir {
            abs,
            mount: u.mount,
            rel: u.rel,
            ents,
            at: 0,
            // SAFETY: an all-zero dirent64 is valid (it is filled before it is handed out).
            ent: unsafe { std::mem::zeroed() },
            fd: -1,
        });
        let p = Box::into_raw(d);
        DIRS.lock()
            .get_or_insert_with(HashSet::new)
            .insert(p as usize);
        COUNT.fetch_add(1, Relaxed);
        Some(p as *mut DIR)
    })
}

impl VDir {
    /// The next entry, filled into `self.ent`; None at the end.
    fn next(&mut self) -> Option<*mut dirent64> {
        let e = self.ents.get(self.at)?;
        self.at += 1;
        let name_room = self.ent.d_name.len() - 1;
        let n = e.name.len().min(name_room);
        self.ent.d_ino = e.ino;
        self.ent.d_off = e.next as i64;
        self.ent.d_type = e.kind;
        // As the kernel's: the name's offset, the name and its NUL, rounded up to 8.
        let base = std::mem::offset_of!(dirent64, d_name);
        self.ent.d_reclen = ((base + n + 1).div_ceil(8) * 8) as u16;
        for (d, s) in self.ent.d_name.iter_mut().zip(&e.name[..n]) {
            *d = *s as c_char;
        }
        self.ent.d_name[n] = 0;
        Some(&mut self.ent)
    }
}

/// # Safety
/// C's `opendir`.
#[no_mangle]
pub unsafe extern "C" fn opendir(name: *const c_char) -> *mut DIR {
    if let Some(d) = open_virtual(name) {
        return d;
    }
    // SAFETY: the C library's opendir with the program's argument.
    unsafe { real!(opendir: fn(*const c_char) -> *mut DIR)(name) }
}

/// # Safety
/// C's `readdir64`.
#[no_mangle]
pub unsafe extern "C" fn readdir64(d: *mut DIR) -> *mut dirent64 {
    if let Some(v) = ours(d) {
        return v.next().unwrap_or(std::ptr::null_mut());
    }
    // SAFETY: the C library's readdir64 of its own stream.
    unsafe { real!(readdir64: fn(*mut DIR) -> *mut dirent64)(d) }
}

/// # Safety
/// C's `readdir`.
#[no_mangle]
pub unsafe extern "C" fn readdir(d: *mut DIR) -> *mut dirent {
    if let Some(v) = ours(d) {
        return v.next().map_or(std::ptr::null_mut(), |e| e.cast());
    }
    // SAFETY: the C library's readdir of its own stream.
    unsafe { real!(readdir: fn(*mut DIR) -> *mut dirent)(d) }
}

/// `readdir_r` of the client's stream `v` into `entry` (`*result`: it, or NULL at the end).
///
/// # Safety
/// `entry` and `result` are the program's, valid for a `dirent64` and a pointer.
unsafe fn next_into(v: &mut VDir, entry: *mut dirent64, result: *mut *mut dirent64) -> c_int {
    let got = v.next();
    // SAFETY: the caller's pointers, valid for writes of these types (readdir_r's contract).
    unsafe {
        match got {
            Some(e) => {
                std::ptr::copy_nonoverlapping(e, entry, 1);
                *result = entry;
            }
            None => *result = std::ptr::null_mut(),
        }
    }
    0
}

/// # Safety
/// C's `readdir64_r`.
#[no_mangle]
pub unsafe extern "C" fn readdir64_r(
    d: *mut DIR,
    entry: *mut dirent64,
    result: *mut *mut dirent64,
) -> c_int {
    if let Some(v) = ours(d) {
        // SAFETY: the program's arguments.
        return unsafe { next_into(v, entry, result) };
    }
    // SAFETY: the C library's readdir64_r with the program's arguments.
    unsafe {
        real!(readdir64_r: fn(*mut DIR, *mut dirent64, *mut *mut dirent64) -> c_int)(
            d, entry, result,
        )
    }
}

/// # Safety
/// C's `readdir_r`.
#[no_mangle]
pub unsafe extern "C" fn readdir_r(
    d: *mut DIR,
    entry: *mut dirent,
    result: *mut *mut dirent,
) -> c_int {
    if let Some(v) = ours(d) {
        // SAFETY: the program's arguments; the two entry types are one layout (above).
        return unsafe { next_into(v, entry.cast(), result.cast()) };
    }
    // SAFETY: the C library's readdir_r with the program's arguments.
    unsafe {
        real!(readdir_r: fn(*mut DIR, *mut dirent, *mut *mut dirent) -> c_int)(d, entry, result)
    }
}

/// # Safety
/// C's `closedir`.
#[no_mangle]
pub unsafe extern "C" fn closedir(d: *mut DIR) -> c_int {
    if ours(d).is_some() {
        if let Some(set) = DIRS.lock().as_mut() {
            set.remove(&(d as usize));
        }
        COUNT.fetch_sub(1, Relaxed);
        // SAFETY: `d` was made by Box::into_raw in `open_virtual` and is no longer
        // registered, so nothing reaches it again.
        let v = unsafe { Box::from_raw(d as *mut VDir) };
        if v.fd >= 0 {
            // SAFETY: the descriptor `dirfd` opened for this stream.
            unsafe { real!(close: fn(c_int) -> c_int)(v.fd) };
        }
        return 0;
    }
    // SAFETY: the C library's closedir of its own stream.
    unsafe { real!(closedir: fn(*mut DIR) -> c_int)(d) }
}

/// # Safety
/// C's `dirfd`.
#[no_mangle]
pub unsafe extern "C" fn dirfd(d: *mut DIR) -> c_int {
    if let Some(v) = ours(d) {
        if v.fd < 0 {
            let Ok(p) = std::ffi::CString::new(v.abs.clone()) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            let open = real!(open: fn(*const c_char, c_int, libc::c_uint) -> c_int);
            // SAFETY: the kernel's open of the stream's directory, a NUL-terminated path.
            v.fd = unsafe {
                open(
                    p.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    0,
                )
            };
        }
        return v.fd;
    }
    // SAFETY: the C library's dirfd of its own stream.
    unsafe { real!(dirfd: fn(*mut DIR) -> c_int)(d) }
}

/// # Safety
/// C's `rewinddir`.
#[no_mangle]
pub unsafe extern "C" fn rewinddir(d: *mut DIR) {
    if let Some(v) = ours(d) {
        v.at = 0;
        // The directory as it is now; the old list if it cannot be had.
        let fresh = outside(|| {
            let m = mounts().get(v.mount)?;
            let u = Under {
                mount: v.mount,
                rel: v.rel.clone(),
                base: 0,
            };
            list(m, &u).ok()
        });
        if let Some(e) = fresh {
            v.ents = e;
        }
        return;
    }
    // SAFETY: the C library's rewinddir of its own stream.
    unsafe { real!(rewinddir: fn(*mut DIR) -> ())(d) }
}

/// # Safety
/// C's `telldir`.
#[no_mangle]
pub unsafe extern "C" fn telldir(d: *mut DIR) -> c_long {
    if let Some(v) = ours(d) {
        return v.at as c_long;
    }
    // SAFETY: the C library's telldir of its own stream.
    unsafe { real!(telldir: fn(*mut DIR) -> c_long)(d) }
}

/// # Safety
/// C's `seekdir`.
#[no_mangle]
pub unsafe extern "C" fn seekdir(d: *mut DIR, loc: c_long) {
    if let Some(v) = ours(d) {
        v.at = usize::try_from(loc).unwrap_or(0).min(v.ents.len());
        return;
    }
    // SAFETY: the C library's seekdir of its own stream.
    unsafe { real!(seekdir: fn(*mut DIR, c_long) -> ())(d, loc) }
}
