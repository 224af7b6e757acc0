//! The interposed functions. Each looks whether the call is the client's (a path under a
//! mount, a virtual descriptor); if not, or if the daemon leaves it to the kernel, it calls
//! the C library's function with the same arguments.
//!
//! `open`, `openat`, `fcntl` and `ioctl` are variadic in C. They are defined here with their
//! optional argument as a plain one: on the System V ABIs of x86-64 and AArch64 Linux a
//! variadic integer argument is passed where a fixed one would be, and it is read only when
//! the call has it (`O_CREAT`/`O_TMPFILE` for the mode; the commands that take one).

use libc::{c_char, c_int, c_uint, c_ulong, c_void, mode_t, off_t, size_t, ssize_t};
use tierstack_ioproto::chan::MAX_DATA;
use tierstack_ioproto::{Req, SetAttr, Time, WireAttr};

use crate::conn::{Got, Miss, UMASK};
use crate::fds::{self, VFile};
use crate::paths::{self, Under};
use crate::{outside, real, set_errno};

const O_TMPFILE_BIT: c_int = libc::O_TMPFILE & !libc::O_DIRECTORY;

fn fail<T: From<i8>>(e: i32) -> T {
    set_errno(e);
    T::from(-1)
}

fn errno() -> i32 {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Answers a call that came back as `got` with `ok`'s value, an errno, or None (the kernel).
fn answer<T: From<i8>>(got: Result<Got, Miss>, ok: impl FnOnce(Got) -> T) -> Option<T> {
    match got {
        Ok(Got::Err(e)) => Some(fail(e)),
        Ok(g) => Some(ok(g)),
        Err(_) => None,
    }
}

// ---------------------------------------------------------------- attributes

macro_rules! fill_stat {
    ($st:expr, $a:expr, $ty:ty) => {{
        let a: &WireAttr = $a;
        // SAFETY: an all-zero stat is valid; every field is set below or left 0.
        let mut s: $ty = unsafe { std::mem::zeroed() };
        fill_fields!(s, a);
        // SAFETY: the caller's buffer is a struct of this type (the C prototype says so).
        unsafe { std::ptr::write($st, s) };
    }};
}

macro_rules! fill_fields {
    ($s:ident, $a:ident) => {
        $s.st_dev = 0;
        $s.st_ino = $a.ino as _;
        $s.st_nlink = $a.nlink as _;
        $s.st_mode = $a.mode as _;
        $s.st_uid = $a.uid;
        $s.st_gid = $a.gid;
        $s.st_rdev = $a.rdev as _;
        $s.st_size = $a.size as _;
        $s.st_blksize = $a.blksize as _;
        $s.st_blocks = $a.blocks as _;
        $s.st_atime = $a.atime.div_euclid(1_000_000_000) as _;
        $s.st_atime_nsec = $a.atime.rem_euclid(1_000_000_000) as _;
        $s.st_mtime = $a.mtime.div_euclid(1_000_000_000) as _;
        $s.st_mtime_nsec = $a.mtime.rem_euclid(1_000_000_000) as _;
        $s.st_ctime = $a.ctime.div_euclid(1_000_000_000) as _;
        $s.st_ctime_nsec = $a.ctime.rem_euclid(1_000_000_000) as _;
    };
}

/// The mount's device number as the kernel shows it (st_dev).
fn dev_of(mount: usize) -> u64 {
    mounts().get(mount).and_then(|m| m.dev()).unwrap_or(0)
}

unsafe fn put_stat(st: *mut libc::stat, a: &WireAttr, mount: usize) {
    fill_stat!(st, a, libc::stat);
    // SAFETY: `st` was just written as a whole.
    unsafe { (*st).st_dev = dev_of(mount) };
}

unsafe fn put_stat64(st: *mut libc::stat64, a: &WireAttr, mount: usize) {
    fill_stat!(st, a, libc::stat64);
    // SAFETY: as above.
    unsafe { (*st).st_dev = dev_of(mount) };
}

unsafe fn put_statx(sx: *mut libc::statx, a: &WireAttr, mount: usize) {
    // SAFETY: an all-zero statx is valid.
    let mut s: libc::statx = unsafe { std::mem::zeroed() };
    s.stx_mask = libc::STATX_BASIC_STATS;
    s.stx_blksize = a.blksize;
    s.stx_nlink = a.nlink;
    s.stx_uid = a.uid;
    s.stx_gid = a.gid;
    s.stx_mode = a.mode as u16;
    s.stx_ino = a.ino;
    s.stx_size = a.size;
    s.stx_blocks = a.blocks;
    let ts = |ns: i64| {
        // SAFETY: an all-zero statx_timestamp is valid.
        let mut t: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        t.tv_sec = ns.div_euclid(1_000_000_000);
        t.tv_nsec = ns.rem_euclid(1_000_000_000) as u32;
        t
    };
    s.stx_atime = ts(a.atime);
    s.stx_mtime = ts(a.mtime);
    s.stx_ctime = ts(a.ctime);
    s.stx_rdev_major = libc::major(a.rdev) as u32;
    s.stx_rdev_minor = libc::minor(a.rdev) as u32;
    let dev = dev_of(mount);
    s.stx_dev_major = libc::major(dev) as u32;
    s.stx_dev_minor = libc::minor(dev) as u32;
    // SAFETY: the caller's buffer is a struct statx.
    unsafe { std::ptr::write(sx, s) };
}

// ---------------------------------------------------------------- open and close

unsafe fn open_at(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> Option<c_int> {
    if flags & (libc::O_PATH | libc::O_DIRECTORY | O_TMPFILE_BIT) != 0 {
        return None;
    }
    outside(|| {
        // SAFETY: the program passes a NUL-terminated path (or null).
        let u = unsafe { paths::under(dirfd, path) }?;
        let m = mounts().get(u.mount)?;
        let mode = if flags & libc::O_CREAT != 0 { mode } else { 0 };
        let req = Req::Open {
            base: u.base,
            path: &u.rel,
            flags,
            mode,
            umask: UMASK.load(std::sync::atomic::Ordering::Relaxed),
        };
        answer(m.call(&req, &[], &mut []), |g| match g {
            Got::Opened(fh, attr) => adopt(&u, fh, attr.ino, flags),
            _ => fail(libc::EIO),
        })
    })
}

/// A descriptor number for the handle `fh` the daemon opened (a duplicate of the mount's
/// `O_PATH` descriptor), entered in the table.
fn adopt(u: &Under, fh: u64, ino: u64, flags: c_int) -> c_int {
    let (fd, epoch) = mounts()
        .get(u.mount)
        .map_or((-1, 0), |m| (m.open_root(), m.epoch()));
    if fd < 0 {
        let e = errno();
        if let Some(m) = mounts().get(u.mount) {
            let _ = m.call(&Req::Close { ino, fh }, &[], &mut []);
        }
        return fail(e);
    }
    let keep = libc::O_ACCMODE | libc::O_APPEND | libc::O_NONBLOCK | libc::O_SYNC | libc::O_DSYNC;
    fds::insert(
        fd,
        VFile {
            mount: u.mount,
            ino,
            fh,
            flags: flags & keep,
            off: 0,
            cloexec: flags & libc::O_CLOEXEC != 0,
            epoch,
        },
    );
    fd
}

/// # Safety
/// C's `open`.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: the program's arguments.
    if let Some(r) = unsafe { open_at(libc::AT_FDCWD, path, flags, mode) } {
        return r;
    }
    // SAFETY: the C library's open with the program's arguments.
    unsafe { real!(open: fn(*const c_char, c_int, c_uint) -> c_int)(path, flags, mode) }
}

/// # Safety
/// C's `open64`.
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: the program's arguments.
    if let Some(r) = unsafe { open_at(libc::AT_FDCWD, path, flags, mode) } {
        return r;
    }
    // SAFETY: the C library's open64 with the program's arguments.
    unsafe { real!(open64: fn(*const c_char, c_int, c_uint) -> c_int)(path, flags, mode) }
}

/// # Safety
/// glibc's fortified `open` (no mode).
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the program's arguments.
    if let Some(r) = unsafe { open_at(libc::AT_FDCWD, path, flags, 0) } {
        return r;
    }
    // SAFETY: the C library's function with the program's arguments.
    unsafe { real!(__open_2: fn(*const c_char, c_int) -> c_int)(path, flags) }
}

/// # Safety
/// glibc's fortified `open64` (no mode).
#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the program's arguments.
    if let Some(r) = unsafe { open_at(libc::AT_FDCWD, path, flags, 0) } {
        return r;
    }
    // SAFETY: the C library's function with the program's arguments.
    unsafe { real!(__open64_2: fn(*const c_char, c_int) -> c_int)(path, flags) }
}

/// # Safety
/// C's `openat`.
#[no_mangle]
pub unsafe extern "C" fn openat(
    d: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: the program's arguments.
    if let Some(r) = unsafe { open_at(d, path, flags, mode) } {
        return r;
    }
    // SAFETY: the C library's openat with the program's arguments.
    unsafe { real!(openat: fn(c_int, *const c_char, c_int, c_uint) -> c_int)(d, path, flags, mode) }
}

/// # Safety
/// C's `openat64`.
#[no_mangle]
pub unsafe extern "C" fn openat64(
    d: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: the program's arguments.
    if let Some(r) = unsafe { open_at(d, path, flags, mode) } {
        return r;
    }
    // SAFETY: the C library's openat64 with the program's arguments.
    unsafe {
        real!(openat64: fn(c_int, *const c_char, c_int, c_uint) -> c_int)(d, path, flags, mode)
    }
}

/// # Safety
/// glibc's fortified `openat` (no mode).
#[no_mangle]
pub unsafe extern "C" fn __openat_2(d: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the program's arguments.
    if let Some(r) = unsafe { open_at(d, path, flags, 0) } {
        return r;
    }
    // SAFETY: the C library's function with the program's arguments.
    unsafe { real!(__openat_2: fn(c_int, *const c_char, c_int) -> c_int)(d, path, flags) }
}

/// # Safety
/// glibc's fortified `openat64` (no mode).
#[no_mangle]
pub unsafe extern "C" fn __openat64_2(d: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the program's arguments.
    if let Some(r) = unsafe { open_at(d, path, flags, 0) } {
        return r;
    }
    // SAFETY: the C library's function with the program's arguments.
    unsafe { real!(__openat64_2: fn(c_int, *const c_char, c_int) -> c_int)(d, path, flags) }
}

/// # Safety
/// C's `creat`.
#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    // SAFETY: the program's arguments.
    unsafe { open(path, flags, mode) }
}

/// # Safety
/// C's `creat64`.
#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the program's arguments.
    unsafe { creat(path, mode) }
}

/// Closes the virtual descriptor `fd`, if it is one: the daemon's handle and the reserved
/// number. None if `fd` is not virtual.
fn close_virtual(fd: c_int) -> Option<c_int> {
    if !fds::maybe(fd) {
        return None;
    }
    outside(|| {
        let v = fds::remove(fd)?;
        // A handle of a daemon that has gone is only dropped here (nothing to close).
        let r = mounts()
            .get(v.mount)
            .filter(|m| m.epoch() == v.epoch)
            .map(|m| {
                m.call(
                    &Req::Close {
                        ino: v.ino,
                        fh: v.fh,
                    },
                    &[],
                    &mut [],
                )
            });
        // SAFETY: closes the reserved number this library made.
        unsafe { real!(close: fn(c_int) -> c_int)(fd) };
        Some(match r {
            Some(Ok(Got::Err(e))) => fail(e),
            _ => 0,
        })
    })
}

/// # Safety
/// C's `close`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if let Some(r) = close_virtual(fd) {
        return r;
    }
    // SAFETY: the C library's close.
    unsafe { real!(close: fn(c_int) -> c_int)(fd) }
}

// ---------------------------------------------------------------- promotion

/// Makes the virtual descriptor `fd` a real one: the file opened through the kernel at the
/// same offset, in place of the reserved number, and the daemon's handle closed. Err: the
/// errno (the file was removed or replaced since its open: it stays virtual).
fn promote(fd: c_int) -> Result<(), i32> {
    let v = fds::remove(fd).ok_or(libc::EBADF)?;
    let back = |e: i32| {
        fds::insert(fd, v.clone());
        e
    };
    let m = mounts().get(v.mount).ok_or_else(|| back(libc::EBADF))?;
    // Its path now (it may have been renamed since its open), from the daemon.
    let mut rel = vec![0u8; 4096];
    let n = match m.call_on(v.epoch, &Req::PathOf { ino: v.ino }, &[], &mut rel) {
        Ok(Got::Read(n)) => n,
        Ok(Got::Err(e)) => return Err(back(e)),
        _ => return Err(back(libc::EIO)),
    };
    let mut abs = m.root.clone();
    abs.push(b'/');
    abs.extend_from_slice(&rel[..n]);
    let path = std::ffi::CString::new(abs).map_err(|_| back(libc::EINVAL))?;
    let flags = (v.flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC)) | libc::O_CLOEXEC;
    // SAFETY: the C library's open of a NUL-terminated path.
    let nfd =
        unsafe { real!(open: fn(*const c_char, c_int, c_uint) -> c_int)(path.as_ptr(), flags, 0) };
    if nfd < 0 {
        return Err(back(errno()));
    }
    let close = real!(close: fn(c_int) -> c_int);
    // SAFETY: an all-zero stat is valid for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of the descriptor just opened, into a live local.
    let same = unsafe { real!(fstat: fn(c_int, *mut libc::stat) -> c_int)(nfd, &mut st) } == 0
        && st.st_ino == v.ino;
    if !same {
        // SAFETY: the descriptor just opened.
        unsafe { close(nfd) };
        return Err(back(libc::ESTALE));
    }
    if v.flags & libc::O_APPEND == 0 {
        // SAFETY: lseek of the descriptor just opened.
        unsafe {
            real!(lseek: fn(c_int, off_t, c_int) -> off_t)(nfd, v.off as off_t, libc::SEEK_SET)
        };
    }
    let cloexec = if v.cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: dup3 over the reserved number (ours), then the temporary descriptor closed.
    let r = unsafe { real!(dup3: fn(c_int, c_int, c_int) -> c_int)(nfd, fd, cloexec) };
    let e = errno();
    // SAFETY: the descriptor just opened.
    unsafe { close(nfd) };
    if r < 0 {
        return Err(back(e));
    }
    if let Some(m) = mounts().get(v.mount).filter(|m| m.epoch() == v.epoch) {
        let _ = m.call(
            &Req::Close {
                ino: v.ino,
                fh: v.fh,
            },
            &[],
            &mut [],
        );
    }
    Ok(())
}

/// Promotes `fd` if it is virtual; Some(-1) with errno if that fails, None to go on with the
/// real call.
fn promoted(fd: c_int) -> Option<c_int> {
    if !fds::maybe(fd) {
        return None;
    }
    outside(|| {
        fds::get(fd)?;
        match promote(fd) {
            Ok(()) => None,
            Err(e) => Some(fail(e)),
        }
    })
}

/// Promotes every virtual descriptor (`all`), or those a new program would inherit.
fn promote_all(all: bool) {
    outside(|| {
        for (fd, v) in fds::all() {
            if all || !v.cloexec {
                let _ = promote(fd);
            }
        }
        Some(())
    });
}

/// Before a fork: the child inherits real descriptors (a virtual one is this process's).
fn before_fork() {
    promote_all(true);
}

/// The mounts, with the fork hook set at the first look.
fn mounts() -> &'static [crate::conn::Mount] {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| crate::conn::on_fork(before_fork));
    crate::conn::mounts()
}

/// Defines `$name` as: promote a virtual first argument, then the C library's function.
macro_rules! promoting {
    ($(#[$doc:meta])* $name:ident ( $fd:ident : c_int $(, $a:ident : $t:ty)* ) -> $r:ty, $err:expr) => {
        $(#[$doc])*
        /// # Safety
        /// The C function's.
        #[no_mangle]
        pub unsafe extern "C" fn $name($fd: c_int $(, $a: $t)*) -> $r {
            if let Some(_e) = promoted($fd) {
                return $err;
            }
            // SAFETY: the C library's function with the program's arguments.
            unsafe { real!($name: fn(c_int $(, $t)*) -> $r)($fd $(, $a)*) }
        }
    };
}

promoting!(flock(fd: c_int, op: c_int) -> c_int, -1);
promoting!(lockf(fd: c_int, cmd: c_int, len: off_t) -> c_int, -1);
promoting!(lockf64(fd: c_int, cmd: c_int, len: off_t) -> c_int, -1);
promoting!(fallocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int, -1);
promoting!(fallocate64(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int, -1);
promoting!(posix_fallocate(fd: c_int, off: off_t, len: off_t) -> c_int, errno());
promoting!(posix_fallocate64(fd: c_int, off: off_t, len: off_t) -> c_int, errno());
promoting!(fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE, std::ptr::null_mut());
promoting!(ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int, -1);
promoting!(fsetxattr(fd: c_int, n: *const c_char, v: *const c_void, s: size_t, f: c_int) -> c_int, -1);
promoting!(fgetxattr(fd: c_int, n: *const c_char, v: *mut c_void, s: size_t) -> ssize_t, -1);

thread_local! {
    /// Where an extended attribute's value comes in (one per thread, made once).
    static XATTR_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `getxattr` (`follow`) or `lgetxattr` of a path under a mount, answered by the daemon
/// (`ls -l` asks two or three per file); None for the kernel.
fn getxattr_call(
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: size_t,
    follow: bool,
) -> Option<ssize_t> {
    if name.is_null() {
        return None;
    }
    outside(|| {
        // SAFETY: the program's NUL-terminated path.
        let u = unsafe { paths::under(libc::AT_FDCWD, path) }?;
        let m = mounts().get(u.mount)?;
        // SAFETY: the program's NUL-terminated name.
        let n = unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes();
        if n.is_empty() || n.len() > 255 {
            return None;
        }
        let req = Req::GetXattr {
            base: u.base,
            path: &u.rel,
            name: n,
            follow,
        };
        XATTR_BUF
            .try_with(|b| {
                let mut buf = b.borrow_mut();
                buf.resize(tierstack_ioproto::msg::XATTR_MAX, 0);
                match m.call(&req, &[], &mut buf) {
                    Ok(Got::Read(len)) if size == 0 => Some(len as ssize_t),
                    Ok(Got::Read(len)) if len > size => Some(fail(libc::ERANGE)),
                    Ok(Got::Read(len)) => {
                        // SAFETY: the program's buffer holds `size` >= `len` bytes.
                        unsafe {
                            std::ptr::copy_nonoverlapping(buf.as_ptr(), value.cast::<u8>(), len)
                        };
                        Some(len as ssize_t)
                    }
                    Ok(Got::Err(e)) => Some(fail(e)),
                    Ok(_) => Some(fail(libc::EIO)),
                    Err(_) => None,
                }
            })
            .ok()
            .flatten()
    })
}

/// # Safety
/// C's `getxattr`.
#[no_mangle]
pub unsafe extern "C" fn getxattr(
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: size_t,
) -> ssize_t {
    if let Some(r) = getxattr_call(path, name, value, size, true) {
        return r;
    }
    // SAFETY: the C library's getxattr with the program's arguments.
    unsafe {
        real!(getxattr: fn(*const c_char, *const c_char, *mut c_void, size_t) -> ssize_t)(
            path, name, value, size,
        )
    }
}

/// # Safety
/// C's `lgetxattr`.
#[no_mangle]
pub unsafe extern "C" fn lgetxattr(
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: size_t,
) -> ssize_t {
    if let Some(r) = getxattr_call(path, name, value, size, false) {
        return r;
    }
    // SAFETY: the C library's lgetxattr with the program's arguments.
    unsafe {
        real!(lgetxattr: fn(*const c_char, *const c_char, *mut c_void, size_t) -> ssize_t)(
            path, name, value, size,
        )
    }
}
promoting!(flistxattr(fd: c_int, l: *mut c_char, s: size_t) -> ssize_t, -1);
promoting!(fremovexattr(fd: c_int, n: *const c_char) -> c_int, -1);
promoting!(dup(fd: c_int) -> c_int, -1);

/// The largest private mapping of a virtual descriptor made from a copy (larger ones promote).
const PRIVATE_COPY_LIMIT: size_t = 16 << 20;

/// A private mapping of a virtual descriptor, as a copy: anonymous memory with the file's
/// bytes read into it (what a `MAP_PRIVATE` mapping shows until the file changes, which POSIX
/// leaves unspecified for private mappings anyway). git maps every file it hashes this way:
/// a promotion (a kernel open) each time cost more than the FUSE path. None: not such a
/// mapping (the caller promotes).
fn private_copy(
    a: *mut c_void,
    l: size_t,
    p: c_int,
    f: c_int,
    fd: c_int,
    o: off_t,
) -> Option<*mut c_void> {
    let private = f & (libc::MAP_SHARED | libc::MAP_PRIVATE) == libc::MAP_PRIVATE;
    if !private || l == 0 || l > PRIVATE_COPY_LIMIT || o < 0 || o % 4096 != 0 {
        return None;
    }
    let v = fds::get(fd)?;
    if v.flags & libc::O_ACCMODE == libc::O_WRONLY {
        set_errno(libc::EACCES);
        return Some(libc::MAP_FAILED);
    }
    outside(|| {
        let map = real!(mmap: fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void);
        let flags = f | libc::MAP_ANONYMOUS;
        // SAFETY: an anonymous private mapping where the program asked for one (its address
        // and MAP_FIXED as given); nothing else refers to it yet.
        let m = unsafe { map(a, l, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if m == libc::MAP_FAILED {
            return Some(m);
        }
        if let Err(e) = read_at(&v, m, l, o as u64) {
            // SAFETY: the mapping just made.
            unsafe { libc::munmap(m, l) };
            set_errno(e);
            return Some(libc::MAP_FAILED);
        }
        // SAFETY: the protection the program asked for, on the mapping just made.
        if unsafe { libc::mprotect(m, l, p) } != 0 {
            let e = errno();
            // SAFETY: the mapping just made.
            unsafe { libc::munmap(m, l) };
            set_errno(e);
            return Some(libc::MAP_FAILED);
        }
        Some(m)
    })
}

/// # Safety
/// C's `mmap`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    a: *mut c_void,
    l: size_t,
    p: c_int,
    f: c_int,
    fd: c_int,
    o: off_t,
) -> *mut c_void {
    if let Some(m) = private_copy(a, l, p, f, fd, o) {
        return m;
    }
    if promoted(fd).is_some() {
        return libc::MAP_FAILED;
    }
    // SAFETY: the C library's mmap with the program's arguments.
    unsafe {
        real!(mmap: fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void)(
            a, l, p, f, fd, o,
        )
    }
}

/// # Safety
/// C's `mmap64`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    a: *mut c_void,
    l: size_t,
    p: c_int,
    f: c_int,
    fd: c_int,
    o: off_t,
) -> *mut c_void {
    if let Some(m) = private_copy(a, l, p, f, fd, o) {
        return m;
    }
    if promoted(fd).is_some() {
        return libc::MAP_FAILED;
    }
    // SAFETY: the C library's mmap64 with the program's arguments.
    unsafe {
        real!(mmap64: fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void)(
            a, l, p, f, fd, o,
        )
    }
}

/// # Safety
/// C's `copy_file_range`.
#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    i: c_int,
    io: *mut off_t,
    o: c_int,
    oo: *mut off_t,
    n: size_t,
    f: c_uint,
) -> ssize_t {
    if promoted(i).is_some() || promoted(o).is_some() {
        return -1;
    }
    // SAFETY: the C library's function with the program's arguments.
    unsafe {
        real!(copy_file_range: fn(c_int, *mut off_t, c_int, *mut off_t, size_t, c_uint) -> ssize_t)(
            i, io, o, oo, n, f,
        )
    }
}

/// # Safety
/// C's `sendfile`.
#[no_mangle]
pub unsafe extern "C" fn sendfile(o: c_int, i: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    if promoted(i).is_some() || promoted(o).is_some() {
        return -1;
    }
    // SAFETY: the C library's function with the program's arguments.
    unsafe { real!(sendfile: fn(c_int, c_int, *mut off_t, size_t) -> ssize_t)(o, i, off, n) }
}

/// # Safety
/// C's `dup2`.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if promoted(old).is_some() {
        return -1;
    }
    if old != new {
        close_virtual(new);
    }
    // SAFETY: the C library's dup2.
    unsafe { real!(dup2: fn(c_int, c_int) -> c_int)(old, new) }
}

/// # Safety
/// C's `dup3`.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if promoted(old).is_some() {
        return -1;
    }
    if old != new {
        close_virtual(new);
    }
    // SAFETY: the C library's dup3.
    unsafe { real!(dup3: fn(c_int, c_int, c_int) -> c_int)(old, new, flags) }
}

/// # Safety
/// C's `fcntl`.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if let Some(r) = fcntl_virtual(fd, cmd, arg) {
        return r;
    }
    // SAFETY: the C library's fcntl.
    unsafe { real!(fcntl: fn(c_int, c_int, c_ulong) -> c_int)(fd, cmd, arg) }
}

/// # Safety
/// C's `fcntl64`.
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if let Some(r) = fcntl_virtual(fd, cmd, arg) {
        return r;
    }
    // SAFETY: the C library's fcntl64.
    unsafe { real!(fcntl64: fn(c_int, c_int, c_ulong) -> c_int)(fd, cmd, arg) }
}

/// `fcntl` of a virtual descriptor: its flags here, anything else after a promotion.
fn fcntl_virtual(fd: c_int, cmd: c_int, arg: c_ulong) -> Option<c_int> {
    let v = fds::get(fd)?;
    match cmd {
        libc::F_GETFD => Some(if v.cloexec { libc::FD_CLOEXEC } else { 0 }),
        libc::F_SETFD => {
            fds::update(fd, |f| f.cloexec = arg as c_int & libc::FD_CLOEXEC != 0);
            Some(0)
        }
        libc::F_GETFL => Some(v.flags | libc::O_LARGEFILE),
        libc::F_SETFL => {
            let m = libc::O_APPEND | libc::O_NONBLOCK;
            fds::update(fd, |f| f.flags = (f.flags & !m) | (arg as c_int & m));
            Some(0)
        }
        _ => promoted(fd),
    }
}

/// # Safety
/// C's `posix_fadvise` (advice only: a virtual descriptor takes it as done).
#[no_mangle]
pub unsafe extern "C" fn posix_fadvise(fd: c_int, o: off_t, l: off_t, a: c_int) -> c_int {
    if fds::get(fd).is_some() {
        return 0;
    }
    // SAFETY: the C library's function.
    unsafe { real!(posix_fadvise: fn(c_int, off_t, off_t, c_int) -> c_int)(fd, o, l, a) }
}

/// # Safety
/// C's `posix_fadvise64`.
#[no_mangle]
pub unsafe extern "C" fn posix_fadvise64(fd: c_int, o: off_t, l: off_t, a: c_int) -> c_int {
    // SAFETY: the same function.
    unsafe { posix_fadvise(fd, o, l, a) }
}

/// # Safety
/// C's `fchdir` (a virtual descriptor is a file: ENOTDIR).
#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    if fds::get(fd).is_some() {
        return fail(libc::ENOTDIR);
    }
    // SAFETY: the C library's function.
    let r = unsafe { real!(fchdir: fn(c_int) -> c_int)(fd) };
    paths::cwd_changed();
    r
}

/// # Safety
/// C's `fdopendir` (a virtual descriptor is a file: ENOTDIR).
#[no_mangle]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut libc::DIR {
    if fds::get(fd).is_some() {
        set_errno(libc::ENOTDIR);
        return std::ptr::null_mut();
    }
    // SAFETY: the C library's function.
    unsafe { real!(fdopendir: fn(c_int) -> *mut libc::DIR)(fd) }
}

/// # Safety
/// C's `chdir`.
#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    // SAFETY: the C library's function.
    let r = unsafe { real!(chdir: fn(*const c_char) -> c_int)(path) };
    paths::cwd_changed();
    r
}

/// # Safety
/// C's `umask`.
#[no_mangle]
pub unsafe extern "C" fn umask(m: mode_t) -> mode_t {
    // SAFETY: the C library's function.
    let old = unsafe { real!(umask: fn(mode_t) -> mode_t)(m) };
    UMASK.store(m & 0o777, std::sync::atomic::Ordering::Relaxed);
    old
}

/// Defines an `exec`-family function as: promote the descriptors a new program inherits,
/// then the C library's.
macro_rules! execing {
    ($name:ident ( $($a:ident : $t:ty),* ) -> $r:ty) => {
        /// # Safety
        /// The C function's.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $r {
            promote_all(false);
            // SAFETY: the C library's function with the program's arguments.
            unsafe { real!($name: fn($($t),*) -> $r)($($a),*) }
        }
    };
}

execing!(execve(p: *const c_char, a: *const *const c_char, e: *const *const c_char) -> c_int);
execing!(execv(p: *const c_char, a: *const *const c_char) -> c_int);
execing!(execvp(p: *const c_char, a: *const *const c_char) -> c_int);
execing!(execvpe(p: *const c_char, a: *const *const c_char, e: *const *const c_char) -> c_int);
execing!(fexecve(fd: c_int, a: *const *const c_char, e: *const *const c_char) -> c_int);
execing!(posix_spawn(pid: *mut libc::pid_t, p: *const c_char, fa: *const c_void, at: *const c_void, a: *const *mut c_char, e: *const *mut c_char) -> c_int);
execing!(posix_spawnp(pid: *mut libc::pid_t, p: *const c_char, fa: *const c_void, at: *const c_void, a: *const *mut c_char, e: *const *mut c_char) -> c_int);

/// Defines a credential-changing function as: the C library's, then, if it worked, every
/// connection made again (the daemon knows a caller by the credentials of its connect).
macro_rules! credentials {
    ($name:ident ( $($a:ident : $t:ty),* )) => {
        /// # Safety
        /// The C function's.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            // SAFETY: the C library's function with the program's arguments.
            let r = unsafe { real!($name: fn($($t),*) -> c_int)($($a),*) };
            if r == 0 {
                crate::conn::credentials_changed();
            }
            r
        }
    };
}

credentials!(setuid(u: libc::uid_t));
credentials!(seteuid(u: libc::uid_t));
credentials!(setreuid(r: libc::uid_t, e: libc::uid_t));
credentials!(setresuid(r: libc::uid_t, e: libc::uid_t, s: libc::uid_t));
credentials!(setgid(g: libc::gid_t));
credentials!(setegid(g: libc::gid_t));
credentials!(setregid(r: libc::gid_t, e: libc::gid_t));
credentials!(setresgid(r: libc::gid_t, e: libc::gid_t, s: libc::gid_t));
credentials!(setgroups(n: size_t, l: *const libc::gid_t));

/// # Safety
/// C's `vfork`, made a `fork` (which POSIX allows): a `vfork` child returning through this
/// function would pull the stack from under its parent.
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: the C library's fork.
    unsafe { real!(fork: fn() -> libc::pid_t)() }
}

// ---------------------------------------------------------------- data

fn read_at(v: &VFile, buf: *mut c_void, n: size_t, off: u64) -> Result<(usize, u64), i32> {
    if v.flags & libc::O_ACCMODE == libc::O_WRONLY {
        return Err(libc::EBADF);
    }
    let m = mounts().get(v.mount).ok_or(libc::EBADF)?;
    if n == 0 {
        return Ok((0, off));
    }
    // The end of the file, while its kept size holds (every write and truncate, from any
    // process, moves the count it rests on): the read that ends a whole-file read (`cat`,
    // Python's and Rust's read-to-end) makes no call.
    if m.kept_node(v.epoch, v.ino).is_some_and(|a| off >= a.size) {
        return Ok((0, off));
    }
    // SAFETY: the program gives a buffer of `n` bytes.
    let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, n) };
    let (mut done, mut off) = (0usize, off);
    while done < n {
        let len = (n - done).min(MAX_DATA);
        let req = Req::Read {
            ino: v.ino,
            fh: v.fh,
            off,
            len: len as u32,
        };
        match m.call_on(v.epoch, &req, &[], &mut out[done..done + len]) {
            Ok(Got::Read(k)) => {
                done += k;
                off += k as u64;
                if k < len {
                    break;
                }
            }
            Ok(Got::Err(e)) if done == 0 => return Err(e),
            Err(_) if done == 0 => return Err(libc::EIO),
            _ => break,
        }
    }
    Ok((done, off))
}

fn write_at(v: &VFile, buf: *const c_void, n: size_t, off: u64) -> Result<(usize, u64), i32> {
    if v.flags & libc::O_ACCMODE == libc::O_RDONLY {
        return Err(libc::EBADF);
    }
    let m = mounts().get(v.mount).ok_or(libc::EBADF)?;
    if n == 0 {
        return Ok((0, off));
    }
    // SAFETY: the program gives `n` bytes at `buf`.
    let data = unsafe { std::slice::from_raw_parts(buf as *const u8, n) };
    let append = v.flags & libc::O_APPEND != 0;
    let (mut done, mut off) = (0usize, off);
    while done < n {
        let chunk = &data[done..(done + MAX_DATA).min(n)];
        let req = Req::Write {
            ino: v.ino,
            fh: v.fh,
            off,
            append,
            data: &[],
        };
        match m.call_on(v.epoch, &req, chunk, &mut []) {
            Ok(Got::Written(k, end)) => {
                done += k as usize;
                off = end;
                if (k as usize) < chunk.len() {
                    break;
                }
            }
            Ok(Got::Err(e)) if done == 0 => return Err(e),
            Err(_) if done == 0 => return Err(libc::EIO),
            _ => break,
        }
    }
    if v.flags & (libc::O_SYNC | libc::O_DSYNC) != 0 {
        let req = Req::Fsync {
            ino: v.ino,
            datasync: v.flags & libc::O_SYNC == 0,
        };
        if let Ok(Got::Err(e)) = m.call_on(v.epoch, &req, &[], &mut []) {
            return Err(e);
        }
    }
    Ok((done, off))
}

/// A read or write of a virtual descriptor at its offset (`at` None, the offset moves) or
/// at `at`. None if `fd` is not virtual.
fn data_call(
    fd: c_int,
    at: Option<u64>,
    io: impl FnOnce(&VFile, u64) -> Result<(usize, u64), i32>,
) -> Option<ssize_t> {
    if !fds::maybe(fd) {
        return None;
    }
    outside(|| {
        let v = fds::get(fd)?;
        Some(match io(&v, at.unwrap_or(v.off)) {
            Ok((n, off)) => {
                if at.is_none() {
                    fds::update(fd, |f| f.off = off);
                }
                n as ssize_t
            }
            Err(e) => fail(e),
        })
    })
}

/// # Safety
/// C's `read`.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if let Some(r) = data_call(fd, None, |v, off| read_at(v, buf, n, off)) {
        return r;
    }
    // SAFETY: the C library's read.
    unsafe { real!(read: fn(c_int, *mut c_void, size_t) -> ssize_t)(fd, buf, n) }
}

/// # Safety
/// C's `write`.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if let Some(r) = data_call(fd, None, |v, off| write_at(v, buf, n, off)) {
        return r;
    }
    // SAFETY: the C library's write.
    unsafe { real!(write: fn(c_int, *const c_void, size_t) -> ssize_t)(fd, buf, n) }
}

fn check_off(off: off_t) -> Result<u64, i32> {
    u64::try_from(off).map_err(|_| libc::EINVAL)
}

/// # Safety
/// C's `pread`.
#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    if fds::maybe(fd) && fds::get(fd).is_some() {
        let at = match check_off(off) {
            Ok(o) => o,
            Err(e) => return fail(e),
        };
        if let Some(r) = data_call(fd, Some(at), |v, o| read_at(v, buf, n, o)) {
            return r;
        }
    }
    // SAFETY: the C library's pread.
    unsafe { real!(pread: fn(c_int, *mut c_void, size_t, off_t) -> ssize_t)(fd, buf, n, off) }
}

/// # Safety
/// C's `pread64`.
#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    // SAFETY: the same function (off_t is 64 bits here).
    unsafe { pread(fd, buf, n, off) }
}

/// # Safety
/// C's `pwrite`.
#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    if fds::maybe(fd) && fds::get(fd).is_some() {
        let at = match check_off(off) {
            Ok(o) => o,
            Err(e) => return fail(e),
        };
        if let Some(r) = data_call(fd, Some(at), |v, o| write_at(v, buf, n, o)) {
            return r;
        }
    }
    // SAFETY: the C library's pwrite.
    unsafe { real!(pwrite: fn(c_int, *const c_void, size_t, off_t) -> ssize_t)(fd, buf, n, off) }
}

/// # Safety
/// C's `pwrite64`.
#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    // SAFETY: the same function.
    unsafe { pwrite(fd, buf, n, off) }
}

/// `readv`/`writev` of a virtual descriptor, one buffer after the other.
fn vectored(fd: c_int, iov: *const libc::iovec, cnt: c_int, write: bool) -> Option<ssize_t> {
    if !fds::maybe(fd) || fds::get(fd).is_none() {
        return None;
    }
    if !(0..=1024).contains(&cnt) {
        return Some(fail(libc::EINVAL));
    }
    // SAFETY: the program gives `cnt` iovecs at `iov`.
    let iovs = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    let mut total: ssize_t = 0;
    for v in iovs {
        let r = if write {
            data_call(fd, None, |f, off| write_at(f, v.iov_base, v.iov_len, off))
        } else {
            data_call(fd, None, |f, off| read_at(f, v.iov_base, v.iov_len, off))
        }?;
        if r < 0 {
            return Some(if total > 0 { total } else { r });
        }
        total += r;
        if (r as usize) < v.iov_len {
            break;
        }
    }
    Some(total)
}

/// # Safety
/// C's `readv`.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    if let Some(r) = vectored(fd, iov, cnt, false) {
        return r;
    }
    // SAFETY: the C library's readv.
    unsafe { real!(readv: fn(c_int, *const libc::iovec, c_int) -> ssize_t)(fd, iov, cnt) }
}

/// # Safety
/// C's `writev`.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    if let Some(r) = vectored(fd, iov, cnt, true) {
        return r;
    }
    // SAFETY: the C library's writev.
    unsafe { real!(writev: fn(c_int, *const libc::iovec, c_int) -> ssize_t)(fd, iov, cnt) }
}

fn fstat_attr(v: &VFile) -> Result<WireAttr, i32> {
    let m = mounts().get(v.mount).ok_or(libc::EBADF)?;
    if let Some(a) = m.kept_node(v.epoch, v.ino) {
        return Ok(a);
    }
    match m.call_on(v.epoch, &Req::Fstat { ino: v.ino }, &[], &mut []) {
        Ok(Got::Attr(a)) => Ok(a),
        Ok(Got::Err(e)) => Err(e),
        _ => Err(libc::EIO),
    }
}

fn lseek_virtual(fd: c_int, off: off_t, whence: c_int) -> Option<off_t> {
    let v = fds::get(fd)?;
    if whence == libc::SEEK_DATA || whence == libc::SEEK_HOLE {
        promoted(fd)?;
        return None;
    }
    outside(|| {
        let base = match whence {
            libc::SEEK_SET => 0,
            libc::SEEK_CUR => v.off as i64,
            libc::SEEK_END => match fstat_attr(&v) {
                Ok(a) => a.size as i64,
                Err(e) => return Some(fail(e)),
            },
            _ => return Some(fail(libc::EINVAL)),
        };
        let to = match base.checked_add(off) {
            Some(t) if t >= 0 => t,
            _ => return Some(fail(libc::EINVAL)),
        };
        fds::update(fd, |f| f.off = to as u64);
        Some(to)
    })
}

/// # Safety
/// C's `lseek`.
#[no_mangle]
pub unsafe extern "C" fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t {
    if let Some(r) = lseek_virtual(fd, off, whence) {
        return r;
    }
    // SAFETY: the C library's lseek.
    unsafe { real!(lseek: fn(c_int, off_t, c_int) -> off_t)(fd, off, whence) }
}

/// # Safety
/// C's `lseek64`.
#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off_t, whence: c_int) -> off_t {
    // SAFETY: the same function.
    unsafe { lseek(fd, off, whence) }
}

fn sync_virtual(fd: c_int, datasync: bool) -> Option<c_int> {
    let v = fds::get(fd)?;
    outside(|| {
        let m = mounts().get(v.mount)?;
        let req = Req::Fsync {
            ino: v.ino,
            datasync,
        };
        answer(m.call_on(v.epoch, &req, &[], &mut []), |_| 0)
    })
}

/// # Safety
/// C's `fsync`.
#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if let Some(r) = sync_virtual(fd, false) {
        return r;
    }
    // SAFETY: the C library's fsync.
    unsafe { real!(fsync: fn(c_int) -> c_int)(fd) }
}

/// # Safety
/// C's `fdatasync`.
#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    if let Some(r) = sync_virtual(fd, true) {
        return r;
    }
    // SAFETY: the C library's fdatasync.
    unsafe { real!(fdatasync: fn(c_int) -> c_int)(fd) }
}

fn truncate_virtual(fd: c_int, len: off_t) -> Option<c_int> {
    let v = fds::get(fd)?;
    if v.flags & libc::O_ACCMODE == libc::O_RDONLY {
        return Some(fail(libc::EINVAL));
    }
    let Ok(size) = check_off(len) else {
        return Some(fail(libc::EINVAL));
    };
    outside(|| {
        let m = mounts().get(v.mount)?;
        let req = Req::Truncate {
            ino: v.ino,
            fh: v.fh,
            size,
        };
        answer(m.call_on(v.epoch, &req, &[], &mut []), |_| 0)
    })
}

/// # Safety
/// C's `ftruncate`.
#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    if let Some(r) = truncate_virtual(fd, len) {
        return r;
    }
    // SAFETY: the C library's ftruncate.
    unsafe { real!(ftruncate: fn(c_int, off_t) -> c_int)(fd, len) }
}

/// # Safety
/// C's `ftruncate64`.
#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off_t) -> c_int {
    // SAFETY: the same function.
    unsafe { ftruncate(fd, len) }
}

// ---------------------------------------------------------------- stat

/// Attributes of a virtual descriptor (`fd`) or of a path under a mount; None for the
/// kernel. `Err`: the errno.
fn attrs_of(
    fd: Option<c_int>,
    dirfd: c_int,
    path: *const c_char,
    follow: bool,
) -> Option<Result<(WireAttr, usize), i32>> {
    if let Some(fd) = fd {
        let v = fds::get(fd)?;
        return outside(|| Some(fstat_attr(&v).map(|a| (a, v.mount))));
    }
    outside(|| {
        // SAFETY: the program's NUL-terminated path.
        let u = unsafe { paths::under(dirfd, path) }?;
        let m = mounts().get(u.mount)?;
        if let Some(r) = m.kept_path(u.base, &u.rel, follow) {
            return Some(r.map(|a| (a, u.mount)));
        }
        match m.call(
            &Req::Stat {
                base: u.base,
                path: &u.rel,
                follow,
            },
            &[],
            &mut [],
        ) {
            Ok(Got::Attr(a)) => Some(Ok((a, u.mount))),
            Ok(Got::Err(e)) => Some(Err(e)),
            Ok(_) => Some(Err(libc::EIO)),
            Err(_) => None,
        }
    })
}

/// Whether `path` is empty (for `AT_EMPTY_PATH`).
fn empty(path: *const c_char) -> bool {
    // SAFETY: a non-null path is NUL-terminated.
    path.is_null() || unsafe { *path } == 0
}

macro_rules! stat_fns {
    ($ty:ty, $put:ident, $stat:ident, $lstat:ident, $fstat:ident, $fstatat:ident) => {
        /// # Safety
        /// The C function's.
        #[no_mangle]
        pub unsafe extern "C" fn $stat(path: *const c_char, st: *mut $ty) -> c_int {
            match attrs_of(None, libc::AT_FDCWD, path, true) {
                // SAFETY: the program's stat buffer.
                Some(Ok((a, m))) => unsafe { $put(st, &a, m); 0 },
                Some(Err(e)) => fail(e),
                // SAFETY: the C library's function.
                None => unsafe { real!($stat: fn(*const c_char, *mut $ty) -> c_int)(path, st) },
            }
        }

        /// # Safety
        /// The C function's.
        #[no_mangle]
        pub unsafe extern "C" fn $lstat(path: *const c_char, st: *mut $ty) -> c_int {
            match attrs_of(None, libc::AT_FDCWD, path, false) {
                // SAFETY: the program's stat buffer.
                Some(Ok((a, m))) => unsafe { $put(st, &a, m); 0 },
                Some(Err(e)) => fail(e),
                // SAFETY: the C library's function.
                None => unsafe { real!($lstat: fn(*const c_char, *mut $ty) -> c_int)(path, st) },
            }
        }

        /// # Safety
        /// The C function's.
        #[no_mangle]
        pub unsafe extern "C" fn $fstat(fd: c_int, st: *mut $ty) -> c_int {
            match attrs_of(Some(fd), 0, std::ptr::null(), true) {
                // SAFETY: the program's stat buffer.
                Some(Ok((a, m))) => unsafe { $put(st, &a, m); 0 },
                Some(Err(e)) => fail(e),
                // SAFETY: the C library's function.
                None => unsafe { real!($fstat: fn(c_int, *mut $ty) -> c_int)(fd, st) },
            }
        }

        /// # Safety
        /// The C function's.
        #[no_mangle]
        pub unsafe extern "C" fn $fstatat(d: c_int, path: *const c_char, st: *mut $ty, flags: c_int) -> c_int {
            let by_fd = flags & libc::AT_EMPTY_PATH != 0 && empty(path);
            let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
            match attrs_of(by_fd.then_some(d), d, path, follow) {
                // SAFETY: the program's stat buffer.
                Some(Ok((a, m))) => unsafe { $put(st, &a, m); 0 },
                Some(Err(e)) => fail(e),
                // SAFETY: the C library's function.
                None => unsafe { real!($fstatat: fn(c_int, *const c_char, *mut $ty, c_int) -> c_int)(d, path, st, flags) },
            }
        }
    };
}

stat_fns!(libc::stat, put_stat, stat, lstat, fstat, fstatat);
stat_fns!(
    libc::stat64,
    put_stat64,
    stat64,
    lstat64,
    fstat64,
    fstatat64
);

macro_rules! xstat_fns {
    ($ty:ty, $put:ident, $stat:ident, $lstat:ident, $fstat:ident, $fstatat:ident) => {
        /// # Safety
        /// glibc's old versioned function.
        #[no_mangle]
        pub unsafe extern "C" fn $stat(ver: c_int, path: *const c_char, st: *mut $ty) -> c_int {
            match attrs_of(None, libc::AT_FDCWD, path, true) {
                // SAFETY: the program's stat buffer.
                Some(Ok((a, m))) => unsafe { $put(st, &a, m); 0 },
                Some(Err(e)) => fail(e),
                // SAFETY: the C library's function.
                None => unsafe { real!($stat: fn(c_int, *const c_char, *mut $ty) -> c_int)(ver, path, st) },
            }
        }

        /// # Safety
        /// glibc's old versioned function.
        #[no_mangle]
        pub unsafe extern "C" fn $lstat(ver: c_int, path: *const c_char, st: *mut $ty) -> c_int {
            match attrs_of(None, libc::AT_FDCWD, path, false) {
                // SAFETY: the program's stat buffer.
                Some(Ok((a, m))) => unsafe { $put(st, &a, m); 0 },
                Some(Err(e)) => fail(e),
                // SAFETY: the C library's function.
                None => unsafe { real!($lstat: fn(c_int, *const c_char, *mut $ty) -> c_int)(ver, path, st) },
            }
        }

        /// # Safety
        /// glibc's old versioned function.
        #[no_mangle]
        pub unsafe extern "C" fn $fstat(ver: c_int, fd: c_int, st: *mut $ty) -> c_int {
            match attrs_of(Some(fd), 0, std::ptr::null(), true) {
                // SAFETY: the program's stat buffer.
                Some(Ok((a, m))) => unsafe { $put(st, &a, m); 0 },
                Some(Err(e)) => fail(e),
                // SAFETY: the C library's function.
                None => unsafe { real!($fstat: fn(c_int, c_int, *mut $ty) -> c_int)(ver, fd, st) },
            }
        }

        /// # Safety
        /// glibc's old versioned function.
        #[no_mangle]
        pub unsafe extern "C" fn $fstatat(ver: c_int, d: c_int, path: *const c_char, st: *mut $ty, flags: c_int) -> c_int {
            let by_fd = flags & libc::AT_EMPTY_PATH != 0 && empty(path);
            let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
            match attrs_of(by_fd.then_some(d), d, path, follow) {
                // SAFETY: the program's stat buffer.
                Some(Ok((a, m))) => unsafe { $put(st, &a, m); 0 },
                Some(Err(e)) => fail(e),
                // SAFETY: the C library's function.
                None => unsafe { real!($fstatat: fn(c_int, c_int, *const c_char, *mut $ty, c_int) -> c_int)(ver, d, path, st, flags) },
            }
        }
    };
}

xstat_fns!(
    libc::stat,
    put_stat,
    __xstat,
    __lxstat,
    __fxstat,
    __fxstatat
);
xstat_fns!(
    libc::stat64,
    put_stat64,
    __xstat64,
    __lxstat64,
    __fxstat64,
    __fxstatat64
);

/// # Safety
/// C's `statx`.
#[no_mangle]
pub unsafe extern "C" fn statx(
    d: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    sx: *mut libc::statx,
) -> c_int {
    let by_fd = flags & libc::AT_EMPTY_PATH != 0 && empty(path);
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    match attrs_of(by_fd.then_some(d), d, path, follow) {
        // SAFETY: the program's statx buffer.
        Some(Ok((a, m))) => unsafe {
            put_statx(sx, &a, m);
            0
        },
        Some(Err(e)) => fail(e),
        // SAFETY: the C library's function.
        None => unsafe {
            real!(statx: fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int)(
                d, path, flags, mask, sx,
            )
        },
    }
}

// ---------------------------------------------------------------- the namespace

/// A path call under a mount: `req` made from the path's walk; None for the kernel.
fn path_call(
    dirfd: c_int,
    path: *const c_char,
    req: impl FnOnce(u64, &[u8]) -> Req<'_>,
) -> Option<c_int> {
    outside(|| {
        // SAFETY: the program's NUL-terminated path.
        let u = unsafe { paths::under(dirfd, path) }?;
        let m = mounts().get(u.mount)?;
        answer(m.call(&req(u.base, &u.rel), &[], &mut []), |_| 0)
    })
}

/// # Safety
/// C's `access`.
#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    if let Some(r) = path_call(libc::AT_FDCWD, path, |b, p| Req::Access {
        base: b,
        path: p,
        mask: mode as u32,
    }) {
        return r;
    }
    // SAFETY: the C library's access.
    unsafe { real!(access: fn(*const c_char, c_int) -> c_int)(path, mode) }
}

/// # Safety
/// C's `faccessat` (with flags: the kernel's).
#[no_mangle]
pub unsafe extern "C" fn faccessat(
    d: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    if flags == 0 {
        if let Some(r) = path_call(d, path, |b, p| Req::Access {
            base: b,
            path: p,
            mask: mode as u32,
        }) {
            return r;
        }
    }
    // SAFETY: the C library's faccessat.
    unsafe {
        real!(faccessat: fn(c_int, *const c_char, c_int, c_int) -> c_int)(d, path, mode, flags)
    }
}

/// # Safety
/// C's `unlink`.
#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    if let Some(r) = path_call(libc::AT_FDCWD, path, |b, p| Req::Unlink {
        base: b,
        path: p,
    }) {
        return r;
    }
    // SAFETY: the C library's unlink.
    unsafe { real!(unlink: fn(*const c_char) -> c_int)(path) }
}

/// # Safety
/// C's `rmdir`.
#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    if let Some(r) = path_call(libc::AT_FDCWD, path, |b, p| Req::Rmdir { base: b, path: p }) {
        return r;
    }
    // SAFETY: the C library's rmdir.
    unsafe { real!(rmdir: fn(*const c_char) -> c_int)(path) }
}

/// # Safety
/// C's `unlinkat`.
#[no_mangle]
pub unsafe extern "C" fn unlinkat(d: c_int, path: *const c_char, flags: c_int) -> c_int {
    let dir = flags & libc::AT_REMOVEDIR != 0;
    if flags & !libc::AT_REMOVEDIR == 0 {
        let r = path_call(d, path, |b, p| {
            if dir {
                Req::Rmdir { base: b, path: p }
            } else {
                Req::Unlink { base: b, path: p }
            }
        });
        if let Some(r) = r {
            return r;
        }
    }
    // SAFETY: the C library's unlinkat.
    unsafe { real!(unlinkat: fn(c_int, *const c_char, c_int) -> c_int)(d, path, flags) }
}

/// # Safety
/// C's `mkdir`.
#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the same call relative to the working folder.
    unsafe { mkdirat(libc::AT_FDCWD, path, mode) }
}

/// # Safety
/// C's `mkdirat`.
#[no_mangle]
pub unsafe extern "C" fn mkdirat(d: c_int, path: *const c_char, mode: mode_t) -> c_int {
    let umask = UMASK.load(std::sync::atomic::Ordering::Relaxed);
    if let Some(r) = path_call(d, path, |b, p| Req::Mkdir {
        base: b,
        path: p,
        mode,
        umask,
    }) {
        return r;
    }
    // SAFETY: the C library's mkdirat.
    unsafe { real!(mkdirat: fn(c_int, *const c_char, mode_t) -> c_int)(d, path, mode) }
}

fn rename_call(d1: c_int, a: *const c_char, d2: c_int, b: *const c_char) -> Option<c_int> {
    outside(|| {
        // SAFETY: the program's NUL-terminated paths.
        let (ua, ub) = unsafe { (paths::under(d1, a)?, paths::under(d2, b)?) };
        // Both from the root: the daemon walks a rename's two paths from there.
        if ua.mount != ub.mount || ua.base != 0 || ub.base != 0 {
            return None;
        }
        let m = mounts().get(ua.mount)?;
        let req = Req::Rename {
            from: &ua.rel,
            to: &ub.rel,
        };
        answer(m.call(&req, &[], &mut []), |_| 0)
    })
}

/// # Safety
/// C's `rename`.
#[no_mangle]
pub unsafe extern "C" fn rename(a: *const c_char, b: *const c_char) -> c_int {
    if let Some(r) = rename_call(libc::AT_FDCWD, a, libc::AT_FDCWD, b) {
        return r;
    }
    // SAFETY: the C library's rename.
    unsafe { real!(rename: fn(*const c_char, *const c_char) -> c_int)(a, b) }
}

/// # Safety
/// C's `renameat`.
#[no_mangle]
pub unsafe extern "C" fn renameat(
    d1: c_int,
    a: *const c_char,
    d2: c_int,
    b: *const c_char,
) -> c_int {
    if let Some(r) = rename_call(d1, a, d2, b) {
        return r;
    }
    // SAFETY: the C library's renameat.
    unsafe {
        real!(renameat: fn(c_int, *const c_char, c_int, *const c_char) -> c_int)(d1, a, d2, b)
    }
}

/// # Safety
/// C's `renameat2` (with flags: the kernel's).
#[no_mangle]
pub unsafe extern "C" fn renameat2(
    d1: c_int,
    a: *const c_char,
    d2: c_int,
    b: *const c_char,
    f: c_uint,
) -> c_int {
    if f == 0 {
        if let Some(r) = rename_call(d1, a, d2, b) {
            return r;
        }
    }
    // SAFETY: the C library's renameat2.
    unsafe {
        real!(renameat2: fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int)(
            d1, a, d2, b, f,
        )
    }
}

fn link_call(d1: c_int, a: *const c_char, d2: c_int, b: *const c_char) -> Option<c_int> {
    outside(|| {
        // SAFETY: the program's NUL-terminated paths.
        let (ua, ub) = unsafe { (paths::under(d1, a)?, paths::under(d2, b)?) };
        // Both from the root: the daemon walks a rename's two paths from there.
        if ua.mount != ub.mount || ua.base != 0 || ub.base != 0 {
            return None;
        }
        let m = mounts().get(ua.mount)?;
        let req = Req::Link {
            from: &ua.rel,
            to: &ub.rel,
        };
        answer(m.call(&req, &[], &mut []), |_| 0)
    })
}

/// # Safety
/// C's `link`.
#[no_mangle]
pub unsafe extern "C" fn link(a: *const c_char, b: *const c_char) -> c_int {
    if let Some(r) = link_call(libc::AT_FDCWD, a, libc::AT_FDCWD, b) {
        return r;
    }
    // SAFETY: the C library's link.
    unsafe { real!(link: fn(*const c_char, *const c_char) -> c_int)(a, b) }
}

/// # Safety
/// C's `linkat` (with flags: the kernel's).
#[no_mangle]
pub unsafe extern "C" fn linkat(
    d1: c_int,
    a: *const c_char,
    d2: c_int,
    b: *const c_char,
    f: c_int,
) -> c_int {
    if f == 0 {
        if let Some(r) = link_call(d1, a, d2, b) {
            return r;
        }
    }
    // SAFETY: the C library's linkat.
    unsafe {
        real!(linkat: fn(c_int, *const c_char, c_int, *const c_char, c_int) -> c_int)(
            d1, a, d2, b, f,
        )
    }
}

// ---------------------------------------------------------------- attributes set

/// A setattr of a virtual descriptor (`fd`) or of a path; None for the kernel.
fn set_call(fd: Option<c_int>, dirfd: c_int, path: *const c_char, set: SetAttr) -> Option<c_int> {
    if let Some(fd) = fd {
        let v = fds::get(fd)?;
        return outside(|| {
            let m = mounts().get(v.mount)?;
            let req = Req::Setattr {
                ino: v.ino,
                path: b"",
                set,
            };
            answer(m.call_on(v.epoch, &req, &[], &mut []), |_| 0)
        });
    }
    // An empty path would name the node by number.
    if empty(path) {
        return None;
    }
    path_call(dirfd, path, |b, p| Req::Setattr {
        ino: b,
        path: p,
        set,
    })
}

fn no_change() -> SetAttr {
    SetAttr {
        mode: None,
        uid: None,
        gid: None,
        atime: Time::Omit,
        mtime: Time::Omit,
        follow: true,
    }
}

fn owner(uid: libc::uid_t, gid: libc::gid_t, follow: bool) -> SetAttr {
    SetAttr {
        uid: (uid != u32::MAX).then_some(uid),
        gid: (gid != u32::MAX).then_some(gid),
        follow,
        ..no_change()
    }
}

fn ts_time(t: &libc::timespec) -> Time {
    match t.tv_nsec {
        libc::UTIME_NOW => Time::Now,
        libc::UTIME_OMIT => Time::Omit,
        n => Time::At(t.tv_sec.saturating_mul(1_000_000_000).saturating_add(n)),
    }
}

/// The times of `utimensat`'s argument (null: both now).
unsafe fn times_of(ts: *const libc::timespec, follow: bool) -> SetAttr {
    let (atime, mtime) = if ts.is_null() {
        (Time::Now, Time::Now)
    } else {
        // SAFETY: a non-null `times` points at two timespecs.
        unsafe { (ts_time(&*ts), ts_time(&*ts.add(1))) }
    };
    SetAttr {
        atime,
        mtime,
        follow,
        ..no_change()
    }
}

/// The times of `utimes`' argument (null: both now).
unsafe fn tv_times(tv: *const libc::timeval, follow: bool) -> SetAttr {
    let t = |v: &libc::timeval| Time::At(v.tv_sec * 1_000_000_000 + v.tv_usec * 1000);
    let (atime, mtime) = if tv.is_null() {
        (Time::Now, Time::Now)
    } else {
        // SAFETY: a non-null `times` points at two timevals.
        unsafe { (t(&*tv), t(&*tv.add(1))) }
    };
    SetAttr {
        atime,
        mtime,
        follow,
        ..no_change()
    }
}

/// # Safety
/// C's `fchmod`.
#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    let set = SetAttr {
        mode: Some(mode & 0o7777),
        ..no_change()
    };
    if let Some(r) = set_call(Some(fd), 0, std::ptr::null(), set) {
        return r;
    }
    // SAFETY: the C library's fchmod.
    unsafe { real!(fchmod: fn(c_int, mode_t) -> c_int)(fd, mode) }
}

/// # Safety
/// C's `chmod`.
#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    let set = SetAttr {
        mode: Some(mode & 0o7777),
        ..no_change()
    };
    if let Some(r) = set_call(None, libc::AT_FDCWD, path, set) {
        return r;
    }
    // SAFETY: the C library's chmod.
    unsafe { real!(chmod: fn(*const c_char, mode_t) -> c_int)(path, mode) }
}

/// # Safety
/// C's `fchmodat` (with flags: the kernel's).
#[no_mangle]
pub unsafe extern "C" fn fchmodat(
    d: c_int,
    path: *const c_char,
    mode: mode_t,
    flags: c_int,
) -> c_int {
    // AT_SYMLINK_NOFOLLOW too (`tar` sets its folders' modes so): the C library would
    // open the path with O_PATH and change `/proc/self/fd/N`, a walk and a SETATTR
    // through the kernel; the daemon refuses a symbolic link as the kernel does
    // (EOPNOTSUPP).
    if flags & !libc::AT_SYMLINK_NOFOLLOW == 0 {
        let set = SetAttr {
            mode: Some(mode & 0o7777),
            follow: flags == 0,
            ..no_change()
        };
        if let Some(r) = set_call(None, d, path, set) {
            return r;
        }
    }
    // SAFETY: the C library's fchmodat.
    unsafe {
        real!(fchmodat: fn(c_int, *const c_char, mode_t, c_int) -> c_int)(d, path, mode, flags)
    }
}

/// # Safety
/// C's `fchown`.
#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    if let Some(r) = set_call(Some(fd), 0, std::ptr::null(), owner(uid, gid, true)) {
        return r;
    }
    // SAFETY: the C library's fchown.
    unsafe { real!(fchown: fn(c_int, libc::uid_t, libc::gid_t) -> c_int)(fd, uid, gid) }
}

/// # Safety
/// C's `chown`.
#[no_mangle]
pub unsafe extern "C" fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    if let Some(r) = set_call(None, libc::AT_FDCWD, path, owner(uid, gid, true)) {
        return r;
    }
    // SAFETY: the C library's chown.
    unsafe { real!(chown: fn(*const c_char, libc::uid_t, libc::gid_t) -> c_int)(path, uid, gid) }
}

/// # Safety
/// C's `lchown`.
#[no_mangle]
pub unsafe extern "C" fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    if let Some(r) = set_call(None, libc::AT_FDCWD, path, owner(uid, gid, false)) {
        return r;
    }
    // SAFETY: the C library's lchown.
    unsafe { real!(lchown: fn(*const c_char, libc::uid_t, libc::gid_t) -> c_int)(path, uid, gid) }
}

/// # Safety
/// C's `fchownat`.
#[no_mangle]
pub unsafe extern "C" fn fchownat(
    d: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    let by_fd = flags & libc::AT_EMPTY_PATH != 0 && empty(path);
    if flags & !(libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW) == 0 {
        let set = owner(uid, gid, flags & libc::AT_SYMLINK_NOFOLLOW == 0);
        if let Some(r) = set_call(by_fd.then_some(d), d, path, set) {
            return r;
        }
    }
    // SAFETY: the C library's fchownat.
    unsafe {
        real!(fchownat: fn(c_int, *const c_char, libc::uid_t, libc::gid_t, c_int) -> c_int)(
            d, path, uid, gid, flags,
        )
    }
}

/// # Safety
/// C's `futimens`.
#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, ts: *const libc::timespec) -> c_int {
    // SAFETY: the program's `times`.
    let set = unsafe { times_of(ts, true) };
    if let Some(r) = set_call(Some(fd), 0, std::ptr::null(), set) {
        return r;
    }
    // SAFETY: the C library's futimens.
    unsafe { real!(futimens: fn(c_int, *const libc::timespec) -> c_int)(fd, ts) }
}

/// # Safety
/// C's `utimensat` (a null path: the descriptor itself).
#[no_mangle]
pub unsafe extern "C" fn utimensat(
    d: c_int,
    path: *const c_char,
    ts: *const libc::timespec,
    flags: c_int,
) -> c_int {
    if flags & !libc::AT_SYMLINK_NOFOLLOW == 0 {
        // SAFETY: the program's `times`.
        let set = unsafe { times_of(ts, flags & libc::AT_SYMLINK_NOFOLLOW == 0) };
        let fd = path.is_null().then_some(d);
        if let Some(r) = set_call(fd, d, path, set) {
            return r;
        }
    }
    // SAFETY: the C library's utimensat.
    unsafe {
        real!(utimensat: fn(c_int, *const c_char, *const libc::timespec, c_int) -> c_int)(
            d, path, ts, flags,
        )
    }
}

/// # Safety
/// C's `futimes`.
#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    // SAFETY: the program's `times`.
    let set = unsafe { tv_times(tv, true) };
    if let Some(r) = set_call(Some(fd), 0, std::ptr::null(), set) {
        return r;
    }
    // SAFETY: the C library's futimes.
    unsafe { real!(futimes: fn(c_int, *const libc::timeval) -> c_int)(fd, tv) }
}

/// # Safety
/// C's `utimes`.
#[no_mangle]
pub unsafe extern "C" fn utimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: the program's `times`.
    let set = unsafe { tv_times(tv, true) };
    if let Some(r) = set_call(None, libc::AT_FDCWD, path, set) {
        return r;
    }
    // SAFETY: the C library's utimes.
    unsafe { real!(utimes: fn(*const c_char, *const libc::timeval) -> c_int)(path, tv) }
}

/// # Safety
/// C's `lutimes`.
#[no_mangle]
pub unsafe extern "C" fn lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: the program's `times`.
    let set = unsafe { tv_times(tv, false) };
    if let Some(r) = set_call(None, libc::AT_FDCWD, path, set) {
        return r;
    }
    // SAFETY: the C library's lutimes.
    unsafe { real!(lutimes: fn(*const c_char, *const libc::timeval) -> c_int)(path, tv) }
}
