//! The userfaultfd interface the pager needs, over `linux-raw-sys`'s kernel definitions.
//!
//! `linux-raw-sys` (maintained with rustix, which we already build) ships bindings generated
//! from the kernel's UAPI headers ahead of time, so no build step runs bindgen or needs
//! libclang. The structures and ioctl numbers below are the kernel's own; a unit test checks
//! their sizes and the ioctl encodings against `asm-generic/ioctl.h`'s formula.
//!
//! Only what the pager uses is here: create the descriptor with `UFFDIO_API` and the features
//! it requires (and those it can use where the kernel has them: asynchronous write-protect,
//! `MOVE`), register/unregister ranges, read fault messages, `COPY` (optionally
//! write-protected), `ZEROPAGE`, `WAKE`, `WRITEPROTECT` and `MOVE`; and `/proc/self/pagemap`'s
//! `PAGEMAP_SCAN`, which finds the pages written since they were write-protected and
//! protects them again in one call ([`Pagemap`]). What `linux-raw-sys` lacks (the two ioctl
//! numbers and the `MOVE` mode bits) is defined below from the kernel's headers and checked
//! by a test like the others.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use linux_raw_sys::general as k;
use linux_raw_sys::ioctl as io;

/// What the kernel said, as an errno.
pub type Errno = std::io::Error;

fn last_err() -> Errno {
    std::io::Error::last_os_error()
}

/// The kind of a page fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The page is not mapped.
    Missing,
    /// A write hit a write-protected page.
    WriteProtected,
    /// A minor fault (not registered by the pager; reported for completeness).
    Minor,
}

/// A message read from the userfaultfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A page fault at `addr` by thread `tid`.
    Pagefault {
        /// Missing page, write-protect or minor fault.
        kind: FaultKind,
        /// The faulting address.
        addr: usize,
        /// Whether the access was a write.
        write: bool,
        /// The faulting thread.
        tid: u32,
    },
    /// Any other event (not requested by the pager).
    Other(u8),
}

/// Registration modes.
pub const MODE_MISSING: u64 = k::UFFDIO_REGISTER_MODE_MISSING as u64;
/// Write-protect mode.
pub const MODE_WP: u64 = k::UFFDIO_REGISTER_MODE_WP as u64;

/// `UFFDIO_WRITEPROTECT_MODE_WP` and `_DONTWAKE` (`(__u64)1 << n` in the header, which
/// bindgen does not translate).
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;
const WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;

/// `UFFDIO_MOVE_MODE_DONTWAKE` (`(__u64)1 << 0` in linux/userfaultfd.h, Linux 6.8).
const MOVE_MODE_DONTWAKE: u64 = 1 << 0;

/// `UFFDIO_MOVE`: `_IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)` of linux/userfaultfd.h
/// (Linux 6.8); `linux-raw-sys` has the structure and `_UFFDIO_MOVE` but not the number.
const UFFDIO_MOVE: u32 = (3 << 30)
    | ((std::mem::size_of::<k::uffdio_move>() as u32) << 16)
    | (k::UFFDIO << 8)
    | k::_UFFDIO_MOVE;

/// `PAGEMAP_SCAN`: `_IOWR(PAGEMAP_IOCTL_MAGIC, 16, struct pm_scan_arg)` of linux/fs.h
/// (Linux 6.7), `PAGEMAP_IOCTL_MAGIC` being `'f'`; `linux-raw-sys` has the structure and the
/// flags but not the number.
const PAGEMAP_SCAN: u32 =
    (3 << 30) | ((std::mem::size_of::<k::pm_scan_arg>() as u32) << 16) | ((b'f' as u32) << 8) | 16;

/// An open userfaultfd.
pub struct Uffd {
    fd: OwnedFd,
    /// The UFFD_FEATURE_* bits negotiated (required and optional ones granted).
    features: u64,
}

/// `_IO(USERFAULTFD_IOC, 0x00)`: the `/dev/userfaultfd` ioctl that makes a new descriptor.
const USERFAULTFD_IOC_NEW: u32 = k::USERFAULTFD_IOC << 8;

impl Uffd {
    /// Opens a non-blocking, close-on-exec userfaultfd for kernel and user faults and
    /// negotiates the API with `features` (UFFD_FEATURE_* bits) all required. Tries the
    /// `userfaultfd` system call, then `/dev/userfaultfd` (which grants access by file mode
    /// where the sysctl forbids unprivileged use of the system call).
    pub fn open(features: u64) -> Result<Uffd, Errno> {
        Self::open_with(features, 0)
    }

    /// As [`Uffd::open`], asking also for the `optional` features the kernel has (see
    /// [`Uffd::features`] for what was granted). The kernel's offer is read first on a
    /// throw-away descriptor (`UFFDIO_API` with no features reports them all), since a
    /// descriptor's API is negotiated once.
    pub fn open_with(required: u64, optional: u64) -> Result<Uffd, Errno> {
        let offered = if optional != 0 {
            Self::open_raw(0)?.features
        } else {
            0
        };
        Self::open_raw(required | (optional & offered))
    }

    /// The UFFD_FEATURE_* bits this descriptor was opened with.
    pub fn features(&self) -> u64 {
        self.features
    }

    fn open_raw(features: u64) -> Result<Uffd, Errno> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        // SAFETY: the userfaultfd system call takes one integer of flags and returns a new
        // descriptor or -1; it touches no memory of ours.
        let raw = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as i32;
        let raw = if raw >= 0 {
            raw
        } else {
            let dev = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/userfaultfd")?;
            // SAFETY: USERFAULTFD_IOC_NEW takes the new descriptor's flags by value and
            // returns a new descriptor or -1.
            let r = unsafe {
                libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as libc::c_ulong, flags)
            };
            if r < 0 {
                return Err(last_err());
            }
            r
        };
        // SAFETY: `raw` is a descriptor the kernel just gave us and nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut api = k::uffdio_api {
            api: k::UFFD_API as u64,
            features,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and updates the `struct uffdio_api` it is given.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), io::UFFDIO_API as libc::c_ulong, &mut api) };
        if r < 0 {
            return Err(last_err());
        }
        if api.features & features != features {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                format!(
                    "the kernel lacks userfaultfd features {:#x}",
                    features & !api.features
                ),
            ));
        }
        // With no features asked for, the kernel reports all it has: kept for `open_with`.
        let features = if features == 0 {
            api.features
        } else {
            features
        };
        Ok(Uffd { fd, features })
    }

    fn ioctl<T>(&self, req: u32, arg: &mut T) -> Result<(), Errno> {
        // SAFETY: every caller passes the structure that `req` is defined to take, as a
        // valid exclusive reference the kernel may read and update.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), req as libc::c_ulong, arg as *mut T) };
        if r < 0 {
            Err(last_err())
        } else {
            Ok(())
        }
    }

    fn range(addr: usize, len: usize) -> k::uffdio_range {
        k::uffdio_range {
            start: addr as u64,
            len: len as u64,
        }
    }

    /// Registers `[addr, addr+len)` with `mode` (MODE_* bits).
    pub fn register(&self, addr: usize, len: usize, mode: u64) -> Result<(), Errno> {
        let mut r = k::uffdio_register {
            range: Self::range(addr, len),
            mode,
            ioctls: 0,
        };
        self.ioctl(io::UFFDIO_REGISTER, &mut r)
    }

    /// Unregisters `[addr, addr+len)`.
    pub fn unregister(&self, addr: usize, len: usize) -> Result<(), Errno> {
        let mut r = Self::range(addr, len);
        self.ioctl(io::UFFDIO_UNREGISTER, &mut r)
    }

    /// Wakes threads waiting in faults on `[addr, addr+len)`.
    pub fn wake(&self, addr: usize, len: usize) -> Result<(), Errno> {
        let mut r = Self::range(addr, len);
        self.ioctl(io::UFFDIO_WAKE, &mut r)
    }

    /// Write-protects `[addr, addr+len)` (without waking anybody).
    pub fn write_protect(&self, addr: usize, len: usize) -> Result<(), Errno> {
        let mut w = k::uffdio_writeprotect {
            range: Self::range(addr, len),
            mode: WRITEPROTECT_MODE_WP,
        };
        self.ioctl(io::UFFDIO_WRITEPROTECT, &mut w)
    }

    /// Removes write protection from `[addr, addr+len)`, waking waiters when `wake`.
    pub fn remove_write_protection(
        &self,
        addr: usize,
        len: usize,
        wake: bool,
    ) -> Result<(), Errno> {
        let mut w = k::uffdio_writeprotect {
            range: Self::range(addr, len),
            mode: if wake { 0 } else { WRITEPROTECT_MODE_DONTWAKE },
        };
        self.ioctl(io::UFFDIO_WRITEPROTECT, &mut w)
    }

    /// Maps a copy of `data` at `dst` (a missing range of a registered mapping) without
    /// waking, write-protected when `protect` (so no write slips in between the copy and the
    /// protection). Returns the negative errno the kernel put in `copy` on failure.
    pub fn copy(&self, data: &[u8], dst: usize, protect: bool) -> Result<(), i64> {
        let mut arg = k::uffdio_copy {
            dst: dst as u64,
            src: data.as_ptr() as u64,
            len: data.len() as u64,
            mode: k::UFFDIO_COPY_MODE_DONTWAKE as u64
                | if protect {
                    k::UFFDIO_COPY_MODE_WP as u64
                } else {
                    0
                },
            copy: 0,
        };
        // `data` outlives the call; UFFDIO_COPY only reads it.
        let r = self.ioctl(io::UFFDIO_COPY, &mut arg);
        if r.is_ok() && arg.copy == data.len() as i64 {
            Ok(())
        } else if arg.copy < 0 {
            Err(arg.copy)
        } else {
            Err(-(r.err().and_then(|e| e.raw_os_error()).unwrap_or(libc::EIO) as i64))
        }
    }

    /// Moves the pages of `[src, src+len)` (present, anonymous, private, not shared with
    /// another process) to `[dst, dst+len)` (a missing range of a registered mapping) without
    /// waking and without a copy: afterwards `src` is missing (a touch there faults). Returns
    /// the bytes moved; on failure the bytes moved before it (whole pages) and the kernel's
    /// error (`EBUSY` for a page shared after `fork`, `EINVAL` where the two mappings' flags
    /// differ, `EEXIST` where `dst` is not missing).
    pub fn move_pages(&self, src: usize, dst: usize, len: usize) -> Result<usize, (usize, Errno)> {
        let mut arg = k::uffdio_move {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: MOVE_MODE_DONTWAKE,
            move_: 0,
        };
        match self.ioctl(UFFDIO_MOVE, &mut arg) {
            Ok(()) if arg.move_ == len as i64 => Ok(len),
            Ok(()) => Err((
                arg.move_.max(0) as usize,
                std::io::Error::from_raw_os_error(libc::EAGAIN),
            )),
            Err(e) => Err((arg.move_.max(0) as usize, e)),
        }
    }

    /// Maps zero pages over `[addr, addr+len)` without waking.
    pub fn zeropage(&self, addr: usize, len: usize) -> Result<(), Errno> {
        let mut z = k::uffdio_zeropage {
            range: Self::range(addr, len),
            mode: k::UFFDIO_ZEROPAGE_MODE_DONTWAKE as u64,
            zeropage: 0,
        };
        self.ioctl(io::UFFDIO_ZEROPAGE, &mut z)
    }

    /// Reads one message; `Ok(None)` when none is waiting (the descriptor is non-blocking).
    pub fn read_event(&self) -> Result<Option<Event>, Errno> {
        let mut msg = std::mem::MaybeUninit::<k::uffd_msg>::zeroed();
        let n = std::mem::size_of::<k::uffd_msg>();
        // SAFETY: reading at most `n` bytes into the message buffer we own.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), msg.as_mut_ptr().cast(), n) };
        if r < 0 {
            let e = last_err();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) => Ok(None),
                _ => Err(e),
            };
        }
        if r as usize != n {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "short userfaultfd message",
            ));
        }
        // SAFETY: the kernel wrote a whole message (checked above); all bit patterns of the
        // plain-integer structure are valid.
        let msg = unsafe { msg.assume_init() };
        Ok(Some(decode(&msg)))
    }
}

/// Decodes a message (split out so a test can feed it messages).
fn decode(msg: &k::uffd_msg) -> Event {
    let event = msg.event;
    if event as u32 != k::UFFD_EVENT_PAGEFAULT {
        return Event::Other(event);
    }
    // SAFETY: a PAGEFAULT message carries the `pagefault` member of the union; all its
    // fields are plain integers. The message is packed, so fields are read unaligned.
    let (flags, addr, tid) = unsafe {
        let pf = std::ptr::addr_of!(msg.arg.pagefault).read_unaligned();
        (pf.flags, pf.address, pf.feat.ptid)
    };
    let kind = if flags & k::UFFD_PAGEFAULT_FLAG_WP as u64 != 0 {
        FaultKind::WriteProtected
    } else if flags & k::UFFD_PAGEFAULT_FLAG_MINOR as u64 != 0 {
        FaultKind::Minor
    } else {
        FaultKind::Missing
    };
    Event::Pagefault {
        kind,
        addr: addr as usize,
        write: flags & k::UFFD_PAGEFAULT_FLAG_WRITE as u64 != 0,
        tid,
    }
}

impl AsFd for Uffd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Uffd {
    fn as_raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// Required features of the pager: write-protect faults and the faulting thread's id.
pub const PAGER_FEATURES: u64 =
    (k::UFFD_FEATURE_PAGEFAULT_FLAG_WP | k::UFFD_FEATURE_THREAD_ID) as u64;

/// Asynchronous write-protect (Linux 6.7): a write to a write-protected page clears the
/// protection in the kernel, with no message and no wait; `PAGEMAP_SCAN` then reports the page
/// written. Applies to the whole descriptor.
pub const FEATURE_WP_ASYNC: u64 = k::UFFD_FEATURE_WP_ASYNC as u64;
/// `UFFDIO_MOVE` (Linux 6.8).
pub const FEATURE_MOVE: u64 = k::UFFD_FEATURE_MOVE as u64;

/// What the kernel offers the pager beyond its required features.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    /// `UFFD_FEATURE_WP_ASYNC`.
    pub wp_async: bool,
    /// `UFFDIO_MOVE`.
    pub moves: bool,
    /// `PAGEMAP_SCAN` on `/proc/self/pagemap` works.
    pub pagemap_scan: bool,
}

impl Caps {
    /// Whether dirty tracking can go without a fault per page: asynchronous write-protect
    /// and `PAGEMAP_SCAN`, and `UFFDIO_MOVE` (which takes a page out of the program's reach
    /// atomically at eviction, since async write protection does not stop writers).
    pub fn async_dirty_tracking(&self) -> bool {
        self.wp_async && self.pagemap_scan && self.moves
    }
}

/// The one userfaultfd capability probe: whether this process can open a userfaultfd with the
/// pager's features, and what else the kernel offers it.
pub fn available() -> Result<Caps, Errno> {
    let u = Uffd::open_with(PAGER_FEATURES, FEATURE_WP_ASYNC | FEATURE_MOVE)?;
    let f = u.features();
    Ok(Caps {
        wp_async: f & FEATURE_WP_ASYNC != 0,
        moves: f & FEATURE_MOVE != 0,
        pagemap_scan: Pagemap::open().is_ok_and(|p| p.probe()),
    })
}

/// `/proc/self/pagemap`, for `PAGEMAP_SCAN`.
pub struct Pagemap {
    file: std::fs::File,
}

/// Regions `PAGEMAP_SCAN` returns per call (the walk resumes where a full vector stopped it).
const SCAN_VEC: usize = 256;

impl Pagemap {
    /// Opens this process's pagemap.
    pub fn open() -> Result<Pagemap, Errno> {
        Ok(Pagemap {
            file: std::fs::File::open("/proc/self/pagemap")?,
        })
    }

    /// Whether `PAGEMAP_SCAN` works here (a scan of one page of our own stack).
    fn probe(&self) -> bool {
        let x = 0u64;
        let a = std::ptr::addr_of!(x) as usize & !4095;
        let mut out = Vec::new();
        self.scan(a, 4096, 0, (0, 0), &mut out).is_ok()
    }

    /// Appends to `out` the runs `(address, length)` of `[addr, addr+len)` written since they
    /// were last write-protected (under userfaultfd async write-protect; a page that is not
    /// present counts as written too: callers scan only present pages), and, when `protect`,
    /// write-protects them again in the same walk (`PM_SCAN_WP_MATCHING |
    /// PM_SCAN_CHECK_WPASYNC`: the range must be registered for write-protect on a descriptor
    /// with async write-protect). Each page's report and its protection happen together
    /// under the page-table lock, and the call returns after the TLB flush: a write the scan
    /// did not report lands after the protection and is reported by the next scan.
    pub fn written(
        &self,
        addr: usize,
        len: usize,
        protect: bool,
        out: &mut Vec<(usize, usize)>,
    ) -> Result<(), Errno> {
        let flags = if protect {
            (k::PM_SCAN_WP_MATCHING | k::PM_SCAN_CHECK_WPASYNC) as u64
        } else {
            0
        };
        let mask = k::PAGE_IS_WRITTEN as u64;
        self.scan(addr, len, flags, (mask, 0), out)
    }

    /// Appends to `out` the runs `(address, length)` of `[addr, addr+len)` whose pages exist
    /// (present in memory or swapped out), whatever their categories otherwise.
    pub fn populated(
        &self,
        addr: usize,
        len: usize,
        out: &mut Vec<(usize, usize)>,
    ) -> Result<(), Errno> {
        let any = (k::PAGE_IS_PRESENT | k::PAGE_IS_SWAPPED) as u64;
        self.scan(addr, len, 0, (0, any), out)
    }

    /// One walk of `PAGEMAP_SCAN` over `[addr, addr+len)`: `masks` are the categories a
    /// page must have all of, and those it must have one of (returned: the union).
    fn scan(
        &self,
        addr: usize,
        len: usize,
        flags: u64,
        masks: (u64, u64),
        out: &mut Vec<(usize, usize)>,
    ) -> Result<(), Errno> {
        let (all, any) = masks;
        let end = (addr + len) as u64;
        let mut start = addr as u64;
        let mut vec = [k::page_region {
            start: 0,
            end: 0,
            categories: 0,
        }; SCAN_VEC];
        while start < end {
            let mut arg = k::pm_scan_arg {
                size: std::mem::size_of::<k::pm_scan_arg>() as u64,
                flags,
                start,
                end,
                walk_end: 0,
                vec: vec.as_mut_ptr() as u64,
                vec_len: SCAN_VEC as u64,
                max_pages: 0,
                category_inverted: 0,
                category_mask: all,
                category_anyof_mask: any,
                return_mask: all | any,
            };
            // SAFETY: PAGEMAP_SCAN reads the argument and writes at most `vec_len` regions
            // into `vec`, which we own and which outlives the call; it changes no memory of
            // ours (it may write-protect page-table entries of the scanned range).
            let r = unsafe {
                libc::ioctl(
                    self.file.as_raw_fd(),
                    PAGEMAP_SCAN as libc::c_ulong,
                    &mut arg as *mut k::pm_scan_arg,
                )
            };
            if r < 0 {
                return Err(last_err());
            }
            for v in &vec[..(r as usize).min(SCAN_VEC)] {
                out.push((v.start as usize, (v.end - v.start) as usize));
            }
            if arg.walk_end <= start {
                break;
            }
            start = arg.walk_end;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `_IOC(dir, type, nr, size)` of asm-generic/ioctl.h.
    fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
        (dir << 30) | ((size as u32) << 16) | (0xAA << 8) | nr
    }
    const W: u32 = 1;
    const R: u32 = 2;

    #[test]
    fn layouts_match_the_kernel_uapi() {
        use std::mem::size_of;
        assert_eq!(size_of::<k::uffd_msg>(), 32);
        assert_eq!(size_of::<k::uffdio_api>(), 24);
        assert_eq!(size_of::<k::uffdio_range>(), 16);
        assert_eq!(size_of::<k::uffdio_register>(), 32);
        assert_eq!(size_of::<k::uffdio_copy>(), 40);
        assert_eq!(size_of::<k::uffdio_zeropage>(), 32);
        assert_eq!(size_of::<k::uffdio_writeprotect>(), 24);
        assert_eq!(io::UFFDIO_API, ioc(R | W, 0x3F, 24));
        assert_eq!(io::UFFDIO_REGISTER, ioc(R | W, 0x00, 32));
        assert_eq!(io::UFFDIO_UNREGISTER, ioc(R, 0x01, 16));
        assert_eq!(io::UFFDIO_WAKE, ioc(R, 0x02, 16));
        assert_eq!(io::UFFDIO_COPY, ioc(R | W, 0x03, 40));
        assert_eq!(io::UFFDIO_ZEROPAGE, ioc(R | W, 0x04, 32));
        assert_eq!(io::UFFDIO_WRITEPROTECT, ioc(R | W, 0x06, 24));
        assert_eq!(USERFAULTFD_IOC_NEW, 0xAA00);
        assert_eq!(size_of::<k::uffdio_move>(), 40);
        assert_eq!(UFFDIO_MOVE, ioc(R | W, 0x05, 40));
        assert_eq!(size_of::<k::pm_scan_arg>(), 96);
        assert_eq!(size_of::<k::page_region>(), 24);
        // _IOWR('f', 16, struct pm_scan_arg), as the kernel's selftests spell it.
        assert_eq!(PAGEMAP_SCAN, 0xC060_6610);
    }

    fn map(len: usize) -> usize {
        // SAFETY: a fresh private anonymous mapping nobody else refers to.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE,
            )
        };
        p.unwrap() as usize
    }

    /// Whether the kernel offers what `what` needs; says SKIP when not.
    fn offers(what: fn(&Caps) -> bool) -> bool {
        match available() {
            Ok(c) if what(&c) => true,
            r => {
                eprintln!("SKIP: the kernel does not offer it here ({r:?})");
                false
            }
        }
    }

    /// Written pages found in one batch, protected again in the same call: a page written
    /// after the scan, and only it, is found by the next one; nothing faults to us.
    #[test]
    fn pagemap_scan_finds_exactly_the_written_pages_and_protects_them_again() {
        if !offers(|c| c.wp_async && c.pagemap_scan) {
            return;
        }
        const P: usize = 4096;
        let u = Uffd::open(PAGER_FEATURES | FEATURE_WP_ASYNC).unwrap();
        let base = map(16 * P);
        u.register(base, 16 * P, MODE_MISSING | MODE_WP).unwrap();
        let data: Vec<u8> = (0..16 * P).map(|i| (i / P) as u8).collect();
        u.copy(&data, base, true).unwrap();
        let pm = Pagemap::open().unwrap();
        let scan = |protect| {
            let mut v = Vec::new();
            pm.written(base, 16 * P, protect, &mut v).unwrap();
            v
        };
        assert_eq!(
            scan(false),
            vec![],
            "copied write-protected: nothing written yet"
        );
        let poke = |i: usize, b: u8| {
            // SAFETY: page i of the mapping above is present; under async write-protect the
            // kernel lifts the protection itself (no fault reaches the descriptor).
            unsafe { std::ptr::write_volatile((base + i * P + 7) as *mut u8, b) }
        };
        poke(1, 0xA1);
        poke(3, 0xA3);
        poke(4, 0xA4);
        assert_eq!(scan(true), vec![(base + P, P), (base + 3 * P, 2 * P)]);
        assert_eq!(scan(false), vec![], "protected again by the scan");
        poke(3, 0xB3);
        assert_eq!(scan(true), vec![(base + 3 * P, P)]);
        assert_eq!(scan(false), vec![]);
        // SAFETY: the whole mapping is present (mapped above).
        let now = unsafe { std::slice::from_raw_parts(base as *const u8, 16 * P) };
        for i in 0..16 {
            let want = match i {
                1 => 0xA1,
                3 => 0xB3,
                4 => 0xA4,
                _ => i as u8,
            };
            assert_eq!(now[i * P + 7], want, "page {i}");
            assert_eq!(now[i * P], i as u8, "page {i}");
        }
        u.unregister(base, 16 * P).unwrap();
        // SAFETY: unmapping the mapping made above, no longer used.
        unsafe { rustix::mm::munmap(base as *mut _, 16 * P).unwrap() };
    }

    /// `UFFDIO_MOVE` takes pages out of one mapping into another (the source is missing
    /// after it), refuses a page shared with a forked child (EBUSY), and takes it once a
    /// write fault (`MADV_POPULATE_WRITE`, which writes nothing) made it private again.
    #[test]
    fn move_takes_pages_out_and_refuses_shared_ones() {
        if !offers(|c| c.moves) {
            return;
        }
        const P: usize = 4096;
        let u = Uffd::open(PAGER_FEATURES | FEATURE_WP_ASYNC | FEATURE_MOVE).unwrap();
        let (a, b) = (map(4 * P), map(4 * P));
        u.register(a, 4 * P, MODE_MISSING | MODE_WP).unwrap();
        u.register(b, 4 * P, MODE_MISSING).unwrap();
        let data: Vec<u8> = (0..4 * P).map(|i| (i / P + 1) as u8).collect();
        u.copy(&data, a, true).unwrap();
        assert_eq!(u.move_pages(a, b, 2 * P).unwrap(), 2 * P);
        let resident = |addr: usize, n: usize| {
            let mut v = vec![0u8; n];
            // SAFETY: mincore writes one byte per page of the range into `v`.
            let r = unsafe { libc::mincore(addr as *mut _, n * P, v.as_mut_ptr()) };
            assert_eq!(r, 0);
            v.iter().map(|x| x & 1 == 1).collect::<Vec<_>>()
        };
        assert_eq!(resident(a, 4), vec![false, false, true, true]);
        // SAFETY: pages 0 and 1 of `b` were just moved in (present).
        let moved = unsafe { std::slice::from_raw_parts(b as *const u8, 2 * P) };
        assert_eq!(moved, &data[..2 * P]);
        // SAFETY: the child only sleeps and exits; it touches nothing of ours.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe {
                libc::sleep(5);
                libc::_exit(0)
            };
        }
        let r = u.move_pages(a + 2 * P, b + 2 * P, P);
        let busy = matches!(&r, Err((0, e)) if e.raw_os_error() == Some(libc::EBUSY));
        // SAFETY: a write fault on a present page of ours, writing no data.
        let pop = unsafe { libc::madvise((a + 2 * P) as *mut _, P, libc::MADV_POPULATE_WRITE) };
        let again = u.move_pages(a + 2 * P, b + 2 * P, P);
        // SAFETY: ending the child made above.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert!(busy, "{r:?}");
        assert_eq!(pop, 0);
        assert_eq!(again.unwrap(), P);
        // SAFETY: page 2 of `b` was just moved in.
        let third = unsafe { std::slice::from_raw_parts((b + 2 * P) as *const u8, P) };
        assert_eq!(third, &data[2 * P..3 * P]);
        u.unregister(a, 4 * P).unwrap();
        u.unregister(b, 4 * P).unwrap();
        // SAFETY: unmapping the mappings made above, no longer used.
        unsafe {
            rustix::mm::munmap(a as *mut _, 4 * P).unwrap();
            rustix::mm::munmap(b as *mut _, 4 * P).unwrap();
        }
    }

    #[test]
    fn decodes_pagefault_messages() {
        let mut raw = [0u8; 32];
        raw[0] = k::UFFD_EVENT_PAGEFAULT as u8;
        let flags = (k::UFFD_PAGEFAULT_FLAG_WRITE | k::UFFD_PAGEFAULT_FLAG_WP) as u64;
        raw[8..16].copy_from_slice(&flags.to_ne_bytes());
        raw[16..24].copy_from_slice(&0x7f00_1234_5000u64.to_ne_bytes());
        raw[24..28].copy_from_slice(&4242u32.to_ne_bytes());
        // SAFETY: uffd_msg is 32 bytes of plain integers; any bytes are a valid value.
        let msg: k::uffd_msg = unsafe { std::mem::transmute(raw) };
        assert_eq!(
            decode(&msg),
            Event::Pagefault {
                kind: FaultKind::WriteProtected,
                addr: 0x7f00_1234_5000,
                write: true,
                tid: 4242
            }
        );
        raw[0] = k::UFFD_EVENT_FORK as u8;
        // SAFETY: as above.
        let msg: k::uffd_msg = unsafe { std::mem::transmute(raw) };
        assert_eq!(decode(&msg), Event::Other(k::UFFD_EVENT_FORK as u8));
    }
}
