//! FUSE over `/dev/fuse`: threads that `read` a request from the device, decode it with
//! [`crate::ops::wire`] (as the io_uring queues of [`crate::uring`] do), serve it
//! ([`TierFs::serve_decoded`]) and `writev` the answer.
//!
//! `fuser` mounts and agrees INIT ([`fuser::Session::new`]); its own request loop is not
//! run, so an operation is decoded in one place for both transports, and adding one touches
//! the table of [`crate::ops`] and its handler only.
//!
//! The first reader reads the session's own open file description (a duplicate of its
//! descriptor), which the busy-polling governor of [`crate::poll`] switches to non-blocking
//! while the mount serves small requests back to back: that reader then finds each next
//! request without being woken (EAGAIN is read again). The others read clones
//! (`FUSE_DEV_IOC_CLONE`): the kernel hands each request to one reader. A reader ends when
//! the device says the mount is gone (ENODEV).

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::thread::JoinHandle;

use rustix::io::Errno;

use crate::core::PAGE;
use crate::fuse::{Answer, Out, TierFs};
use crate::ops::wire;

/// Room for a request's headers beside the largest write (`max_write` is [`PAGE`]).
const HEADROOM: usize = 4096;

/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// The running readers of a mount.
#[derive(Debug)]
pub struct Readers {
    threads: Vec<JoinHandle<io::Result<()>>>,
}

impl Readers {
    /// Starts `threads` readers (at least one) of the session whose device descriptor is
    /// `dev`, serving `fs`.
    pub fn start(dev: BorrowedFd<'_>, threads: usize, fs: &TierFs) -> io::Result<Readers> {
        let mut fds = vec![dev.try_clone_to_owned()?];
        for _ in 1..threads.max(1) {
            fds.push(clone_device(dev)?);
        }
        let mut handles = Vec::with_capacity(fds.len());
        for (i, fd) in fds.into_iter().enumerate() {
            let fs = fs.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("fuse-{i}"))
                    .spawn(move || serve(fd, &fs))?,
            );
        }
        Ok(Readers { threads: handles })
    }

    /// Waits until every reader has ended (the mount is gone); the first error any of them
    /// met.
    pub fn join(self) -> io::Result<()> {
        let mut first = Ok(());
        for t in self.threads {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a FUSE reader panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// A new descriptor of `/dev/fuse` attached to the session of `dev`: the kernel hands each
/// request to one of the descriptors that read.
fn clone_device(dev: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    use rustix::fs::{open, Mode, OFlags};
    let fd = open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let mut source = dev.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the session's descriptor) through the
    // pointer, which points at a live local for the call's duration; `fd` is an open
    // descriptor of /dev/fuse that this function owns.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), FUSE_DEV_IOC_CLONE, &mut source) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// One reader: requests in, answers out, until the mount is gone.
fn serve(fd: OwnedFd, fs: &TierFs) -> io::Result<()> {
    let mut buf = vec![0u8; PAGE as usize + HEADROOM];
    let mut scratch = Vec::new();
    loop {
        let n = match rustix::io::read(&fd, &mut buf) {
            Ok(n) => n,
            // Interrupted before it was read, a signal, or nothing yet while polled.
            Err(Errno::NOENT | Errno::INTR | Errno::AGAIN) => continue,
            Err(Errno::NODEV) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let req = &buf[..n];
        let h = match wire::header(req) {
            Ok(h) => h,
            Err(_) => {
                tracing::error!("a FUSE request of {n} bytes has no header: ignored");
                continue;
            }
        };
        let (arg, payload) = wire::split(h.opcode, &req[wire::IN_HEADER..]);
        let Some((r, then, limit)) = fs.serve_decoded(&h, wire::decode(&h, arg, payload)) else {
            continue;
        };
        answer(&fd, h.unique, &r, limit, &mut scratch);
        fs.after_reply(then);
    }
}

/// Writes answer `r` to request `unique` (at most `limit` bytes of reply): a read's data
/// straight from its buffer, anything else encoded in `scratch`.
fn answer(fd: &OwnedFd, unique: u64, r: &Answer, limit: usize, scratch: &mut Vec<u8>) {
    let (error, body): (i32, &[u8]) = match r {
        Ok(Out::Data(v)) if v.len() <= limit => (0, v),
        _ => {
            let error = wire::encode(r, limit, scratch);
            (error, if error == 0 { scratch } else { &[] })
        }
    };
    // `struct fuse_out_header`: len, error, unique.
    let mut head = [0u8; 16];
    head[0..4].copy_from_slice(&((16 + body.len()) as u32).to_le_bytes());
    head[4..8].copy_from_slice(&error.to_le_bytes());
    head[8..16].copy_from_slice(&unique.to_le_bytes());
    match rustix::io::writev(fd, &[IoSlice::new(&head), IoSlice::new(body)]) {
        // The request was interrupted and is gone, or the mount is.
        Ok(_) | Err(Errno::NOENT | Errno::NODEV) => {}
        Err(e) => tracing::warn!("cannot answer FUSE request {unique}: {e}"),
    }
}
