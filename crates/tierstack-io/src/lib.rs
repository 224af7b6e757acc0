//! `libtierstack_io.so`, the interception client: preloaded into a program (`tierstack exec
//! MOUNT -- CMD`, or a SLURM job's tasks), it serves the POSIX calls on paths under a
//! tierstack mount straight from the mount's daemon over shared memory
//! ([`tierstack_ioproto`]), with no FUSE round trip; everything else goes to the C library as
//! if it were not there.
//!
//! - [`conn`]: the mounts named by `TIERSTACK_IO` (their io sockets, `:`-separated) and one
//!   connection per mount and process, made at the first call and again in a forked child.
//! - [`fds`]: the descriptors the client serves ("virtual" ones). Each holds a real
//!   descriptor number: an `O_PATH` descriptor of the mount's root (opened for it), so the
//!   number is the program's, the mount is busy while it is open (`umount` says so), and a
//!   call the client does not know fails with EBADF instead of touching another file.
//!   Wherever a real descriptor is needed (`mmap`, locks, `dup`, `fdopen`, `exec` and
//!   `fork`, `ioctl`...) the virtual one is first **promoted**: the file opened through the
//!   kernel at the same offset, in place of the reserved number.
//! - [`paths`]: which paths are under a mount (absolute ones, relative to the working folder,
//!   or to a directory descriptor), as the daemon is to walk them.
//! - [`calls`]: the interposed functions.
//!
//! A call the daemon does not decide (a symbolic link on the way, a directory to open,
//! permission that depends on groups, ...) is answered "fallback" and made through the
//! kernel; a daemon that has gone makes every later call go through the kernel, and one that
//! does not answer within `CALL_LIMIT` fails the call with EIO: a program never hangs on the
//! client. The client's own system calls (made while serving a call) never come back into
//! it: a thread-local guard ([`outside`]) sends them to the C library.

mod calls;
mod conn;
mod dirs;
mod fds;
mod paths;

use std::cell::Cell;

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` as the client (its own calls then go to the C library); None when this thread
/// is already inside the client or its thread-locals are gone (the caller then makes the
/// real call).
fn outside<T>(f: impl FnOnce() -> Option<T>) -> Option<T> {
    let entered = INSIDE
        .try_with(|c| {
            if c.get() {
                false
            } else {
                c.set(true);
                true
            }
        })
        .unwrap_or(false);
    if !entered {
        return None;
    }
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            let _ = INSIDE.try_with(|c| c.set(false));
        }
    }
    let _leave = Leave;
    f()
}

/// Sets `errno`.
fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno, always valid to write.
    unsafe { *libc::__errno_location() = e };
}

/// The C library's definition of `name` (the next one after this library), looked up once.
/// Aborts with a message if there is none: every name looked up is a glibc function.
fn next_symbol(name: &'static [u8], cache: &std::sync::atomic::AtomicUsize) -> usize {
    use std::sync::atomic::Ordering::Relaxed;
    let p = cache.load(Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: dlsym with a NUL-terminated name (every caller passes a literal ending in \0).
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    if p == 0 {
        let msg = b"libtierstack_io.so: a C library function is missing\n";
        // SAFETY: write of a static buffer to stderr; abort never returns.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::abort();
        }
    }
    cache.store(p, Relaxed);
    p
}

/// The C library's `$name`, as a function pointer of the given type.
macro_rules! real {
    ($name:ident : fn($($t:ty),*) -> $r:ty) => {{
        static CACHE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let p = $crate::next_symbol(concat!(stringify!($name), "\0").as_bytes(), &CACHE);
        #[allow(unused_unsafe)]
        // SAFETY: `p` is the non-null address of the C library's function of that name,
        // whose C prototype is the one written here.
        let f = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(p) };
        f
    }};
}
pub(crate) use real;
