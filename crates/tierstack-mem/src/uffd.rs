//! The userfaultfd interface the pager needs, over `linux-raw-sys`'s kernel definitions.
//!
//! `linux-raw-sys` (maintained with rustix, which we already build) ships bindings generated
//! from the kernel's UAPI headers ahead of time, so no build step runs bindgen or needs
//! libclang. The structures and ioctl numbers below are the kernel's own; a unit test checks
//! their sizes and the ioctl encodings against `asm-generic/ioctl.h`'s formula.
//!
//! Only what the pager uses is here: create the descriptor with `UFFDIO_API` and the features
//! it requires, register/unregister ranges, read fault messages, `COPY` (optionally
//! write-protected), `ZEROPAGE`, `WAKE` and `WRITEPROTECT`.

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

/// An open userfaultfd.
pub struct Uffd {
    fd: OwnedFd,
}

/// `_IO(USERFAULTFD_IOC, 0x00)`: the `/dev/userfaultfd` ioctl that makes a new descriptor.
const USERFAULTFD_IOC_NEW: u32 = k::USERFAULTFD_IOC << 8;

impl Uffd {
    /// Opens a non-blocking, close-on-exec userfaultfd for kernel and user faults and
    /// negotiates the API with `features` (UFFD_FEATURE_* bits) all required. Tries the
    /// `userfaultfd` system call, then `/dev/userfaultfd` (which grants access by file mode
    /// where the sysctl forbids unprivileged use of the system call).
    pub fn open(features: u64) -> Result<Uffd, Errno> {
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
        Ok(Uffd { fd })
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

/// Whether this process can open a userfaultfd with the pager's features.
pub fn available() -> Result<(), Errno> {
    Uffd::open(PAGER_FEATURES).map(|_| ())
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
