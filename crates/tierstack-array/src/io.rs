//! I/O engines: io_uring (with O_DIRECT where the file system accepts it) and psync.
//!
//! Every engine executes a *batch* of positioned reads and writes and returns one result per
//! operation, so the array can issue one large aligned write per drive per stripe and wait for
//! all of them together.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use parking_lot::Mutex;

/// Alignment of every I/O buffer and offset (O_DIRECT needs the logical block size).
pub const ALIGN: usize = 4096;

/// A heap buffer aligned to [`ALIGN`], zero-initialised, whose length is a multiple of `ALIGN`.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`, like a Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes rounded up to a multiple of [`ALIGN`] (at least `ALIGN`).
    pub fn new(len: usize) -> Self {
        let len = len.max(1).div_ceil(ALIGN) * ALIGN;
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size and a valid power-of-two alignment (O_DIRECT buffer).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len }
    }

    fn layout(len: usize) -> std::alloc::Layout {
        match std::alloc::Layout::from_size_align(len, ALIGN) {
            Ok(l) => l,
            // Only reachable for lengths near usize::MAX, which no caller can allocate anyway.
            Err(_) => std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; ALIGN]>()),
        }
    }

    /// Length in bytes (a multiple of [`ALIGN`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes (never true: [`AlignedBuf::new`] allocates at least
    /// [`ALIGN`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets every byte to `b`.
    pub fn fill(&mut self, b: u8) {
        self.as_mut_slice().fill(b);
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr points to `len` initialised (zeroed at allocation) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole buffer, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated in `new` with exactly this layout and is freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

/// One positioned operation of a batch.
pub enum IoOp<'a> {
    /// Fill `buf` from `offset` of `fd`.
    Read {
        /// Open descriptor to read from; the caller keeps it open for the whole batch.
        fd: RawFd,
        /// Byte offset in the file or device.
        offset: u64,
        /// Destination; filled completely or the operation fails.
        buf: &'a mut [u8],
    },
    /// Write all of `buf` at `offset` of `fd`.
    Write {
        /// Open descriptor to write to; the caller keeps it open for the whole batch.
        fd: RawFd,
        /// Byte offset in the file or device.
        offset: u64,
        /// Bytes to write.
        buf: &'a [u8],
    },
}

/// Executes batches of positioned I/O. Implementations are shared by many threads.
pub trait IoEngine: Send + Sync {
    /// Short name shown in status and benchmark output.
    fn name(&self) -> &'static str;
    /// Runs every operation of `ops` (concurrently where the engine can) and returns one result
    /// per operation, in order. A short read past the end of a file is an error.
    fn submit(&self, ops: &mut [IoOp<'_>]) -> Vec<io::Result<()>>;
}

/// Which engine to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// io_uring ([`UringEngine`]); parsed from `uring` or `io_uring`.
    Uring,
    /// Plain `pread`/`pwrite` ([`PsyncEngine`]); parsed from `psync`.
    Psync,
}

/// A name that is not an [`EngineKind`]; the message names it and the accepted ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown io engine '{0}': use uring or psync")]
pub struct UnknownEngine(pub String);

impl std::str::FromStr for EngineKind {
    type Err = UnknownEngine;
    fn from_str(s: &str) -> Result<Self, UnknownEngine> {
        match s {
            "uring" | "io_uring" => Ok(EngineKind::Uring),
            "psync" => Ok(EngineKind::Psync),
            other => Err(UnknownEngine(other.to_string())),
        }
    }
}

/// Builds an engine; io_uring falls back to psync when the kernel refuses a ring.
pub fn make_engine(kind: EngineKind, queue_depth: u32) -> Box<dyn IoEngine> {
    match kind {
        EngineKind::Uring => match UringEngine::new(queue_depth) {
            Ok(e) => Box::new(e),
            Err(err) => {
                tracing::warn!("io_uring unavailable ({err}); using psync");
                Box::new(PsyncEngine)
            }
        },
        EngineKind::Psync => Box::new(PsyncEngine),
    }
}

fn run_sync(op: &mut IoOp<'_>) -> io::Result<()> {
    match op {
        IoOp::Read { fd, offset, buf } => {
            let f = borrowed_file(*fd);
            f.read_exact_at(buf, *offset)
        }
        IoOp::Write { fd, offset, buf } => {
            let f = borrowed_file(*fd);
            f.write_all_at(buf, *offset)
        }
    }
}

/// A `File` view of a descriptor owned elsewhere; never closes it.
fn borrowed_file(fd: RawFd) -> std::mem::ManuallyDrop<File> {
    use std::os::fd::FromRawFd;
    // SAFETY: the caller's drive keeps `fd` open for the whole batch; ManuallyDrop prevents the
    // temporary File from closing it.
    std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd) })
}

/// Plain `pread`/`pwrite`, one operation after the other.
pub struct PsyncEngine;

impl IoEngine for PsyncEngine {
    fn name(&self) -> &'static str {
        "psync"
    }
    fn submit(&self, ops: &mut [IoOp<'_>]) -> Vec<io::Result<()>> {
        ops.iter_mut().map(run_sync).collect()
    }
}

/// A ring whose completions do not interrupt a thread running in user space
/// (`COOP_TASKRUN`): a completion that arrives on another CPU than the submitter's only
/// raises a flag in the ring (`TASKRUN_FLAG`), which a polling thread sees and collects with
/// one system call, instead of an inter-processor interrupt (tens of microseconds on a
/// virtual machine). A thread asleep in the ring is woken as before. Kernels before 5.19
/// get a plain ring.
fn new_ring(depth: u32) -> io::Result<io_uring::IoUring> {
    io_uring::IoUring::builder()
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .build(depth)
        .or_else(|_| io_uring::IoUring::new(depth))
}

/// io_uring engine: a pool of rings, one taken per batch, so many threads submit at once.
pub struct UringEngine {
    depth: u32,
    rings: Mutex<Vec<io_uring::IoUring>>,
}

impl UringEngine {
    /// Creates the engine with one ring of `depth` entries (clamped to 1 ..= 4096); further
    /// rings are created on demand. Fails if the kernel refuses a ring.
    pub fn new(depth: u32) -> io::Result<Self> {
        let depth = depth.clamp(1, 4096);
        let first = new_ring(depth)?;
        Ok(UringEngine {
            depth,
            rings: Mutex::new(vec![first]),
        })
    }

    fn take_ring(&self) -> io::Result<io_uring::IoUring> {
        if let Some(r) = self.rings.lock().pop() {
            return Ok(r);
        }
        new_ring(self.depth)
    }

    fn run_batch(
        &self,
        ring: &mut io_uring::IoUring,
        ops: &mut [IoOp<'_>],
        results: &mut [io::Result<()>],
    ) -> io::Result<()> {
        // Operations go in windows of at most `depth`.
        let depth = self.depth as usize;
        let mut start = 0;
        while start < ops.len() {
            let end = (start + depth).min(ops.len());
            for (i, op) in ops[start..end].iter_mut().enumerate() {
                let entry = sqe(op).user_data((start + i) as u64);
                // SAFETY: the buffers referenced by the entry are borrowed mutably/immutably by
                // `ops` for the whole call, and we wait below for every submitted completion
                // before returning, so the kernel never touches freed or aliased memory.
                let pushed = unsafe { ring.submission().push(&entry) };
                if pushed.is_err() {
                    return Err(io::Error::other("io_uring submission queue full"));
                }
            }
            let n = end - start;
            // Once entries are in the ring the kernel may be using their buffers: a wait
            // interrupted by a signal (or a full completion queue) is waited again, never
            // returned, so that the caller cannot reuse or free a buffer still in flight.
            wait_uninterrupted(ring, n)?;
            let mut seen = 0;
            while seen < n {
                let cqes: Vec<(u64, i32)> = ring
                    .completion()
                    .map(|c| (c.user_data(), c.result()))
                    .collect();
                if cqes.is_empty() {
                    wait_uninterrupted(ring, 1)?;
                    continue;
                }
                for (idx, res) in cqes {
                    seen += 1;
                    let idx = idx as usize;
                    results[idx] = complete(&mut ops[idx], res);
                }
            }
            start = end;
        }
        Ok(())
    }
}

/// `submit_and_wait(want)`, retried while a signal interrupts it. EAGAIN and EBUSY (no room
/// for more, completions to reap first) return `Ok` after a short pause: the caller's loop
/// reaps what completed and waits again. Either way the entries already submitted stay in
/// flight and their buffers borrowed: only an error that ends the ring returns `Err`.
fn wait_uninterrupted(ring: &mut io_uring::IoUring, want: usize) -> io::Result<()> {
    loop {
        match ring.submit_and_wait(want) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY)) => {
                std::thread::sleep(std::time::Duration::from_micros(50));
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    }
}

/// The submission entry of one operation (its buffer stays borrowed by `op`).
fn sqe(op: &mut IoOp<'_>) -> io_uring::squeue::Entry {
    use io_uring::{opcode, types};
    match op {
        IoOp::Read { fd, offset, buf } => {
            let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
            opcode::Read::new(types::Fd(*fd), buf.as_mut_ptr(), len)
                .offset(*offset)
                .build()
        }
        IoOp::Write { fd, offset, buf } => {
            let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
            opcode::Write::new(types::Fd(*fd), buf.as_ptr(), len)
                .offset(*offset)
                .build()
        }
    }
}

/// The outcome of `op` from its completion result: an error, done, or a short transfer that
/// is finished synchronously from where the kernel stopped.
fn complete(op: &mut IoOp<'_>, res: i32) -> io::Result<()> {
    let want = match op {
        IoOp::Read { buf, .. } => buf.len(),
        IoOp::Write { buf, .. } => buf.len(),
    };
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else if (res as usize) < want {
        finish_short(op, res as usize)
    } else {
        Ok(())
    }
}

fn finish_short(op: &mut IoOp<'_>, done: usize) -> io::Result<()> {
    match op {
        IoOp::Read { fd, offset, buf } => {
            let mut rest = IoOp::Read {
                fd: *fd,
                offset: *offset + done as u64,
                buf: &mut buf[done..],
            };
            run_sync(&mut rest)
        }
        IoOp::Write { fd, offset, buf } => {
            let mut rest = IoOp::Write {
                fd: *fd,
                offset: *offset + done as u64,
                buf: &buf[done..],
            };
            run_sync(&mut rest)
        }
    }
}

thread_local! {
    static POLL_READS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes this thread wait for its single reads by polling the io_uring completion queue
/// instead of sleeping, for at most [`POLL_LIMIT`] per read. For threads whose reads are on a
/// latency-critical path (the memory front's page-fault handlers): a sleeping thread is woken
/// by the completion interrupt, which costs 15–20 us per 4 KiB read on a virtual machine
/// (46 us polled against 60–67 us with `pread` here, measured with O_DIRECT on the disk).
pub fn set_poll_reads(on: bool) {
    POLL_READS.with(|p| p.set(on));
}

/// Longest a polling thread spins for one read before it sleeps until the completion.
pub const POLL_LIMIT: std::time::Duration = std::time::Duration::from_micros(500);

impl UringEngine {
    /// One operation, its completion polled (see [`set_poll_reads`]).
    fn run_polled(&self, ring: &mut io_uring::IoUring, op: &mut IoOp<'_>) -> io::Result<()> {
        let entry = sqe(op);
        // SAFETY: the buffer referenced by the entry is borrowed by `op` for the whole call,
        // and the completion is awaited below before returning.
        if unsafe { ring.submission().push(&entry) }.is_err() {
            return Err(io::Error::other("io_uring submission queue full"));
        }
        ring.submit()?;
        let start = std::time::Instant::now();
        let res = loop {
            if let Some(c) = ring.completion().next() {
                break c.result();
            }
            if ring.submission().taskrun() {
                // The completion waits for this thread to enter the kernel.
                ring.submit()?;
                continue;
            }
            if start.elapsed() > POLL_LIMIT {
                if let Err(e) = ring.submit_and_wait(1) {
                    // Interrupted: the read is still in flight and its buffer borrowed.
                    if !matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN)) {
                        return Err(e);
                    }
                }
            } else {
                std::hint::spin_loop();
            }
        };
        complete(op, res)
    }
}

impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "io_uring"
    }
    fn submit(&self, ops: &mut [IoOp<'_>]) -> Vec<io::Result<()>> {
        let mut results: Vec<io::Result<()>> = ops.iter().map(|_| Ok(())).collect();
        if ops.len() == 1 {
            let polled = POLL_READS.with(|p| p.get());
            if polled {
                if let Ok(mut ring) = self.take_ring() {
                    // On failure the ring is dropped, as in the batch path below, and the
                    // operation redone synchronously.
                    if self.run_polled(&mut ring, &mut ops[0]).is_ok() {
                        self.rings.lock().push(ring);
                        return results;
                    }
                }
            }
            results[0] = run_sync(&mut ops[0]);
            return results;
        }
        let mut ring = match self.take_ring() {
            Ok(r) => r,
            Err(_) => return PsyncEngine.submit(ops),
        };
        match self.run_batch(&mut ring, ops, &mut results) {
            Ok(()) => {
                self.rings.lock().push(ring);
                results
            }
            // The ring is in an unknown state: drop it (this waits for nothing the kernel still
            // holds, because run_batch only fails before submission or on submit itself) and
            // redo the batch synchronously.
            Err(_) => PsyncEngine.submit(ops),
        }
    }
}

/// An open drive: a regular file or a block device, opened with O_DIRECT when possible.
pub struct DriveFile {
    /// The open file or device, read-write.
    pub file: File,
    /// Whether it was opened with O_DIRECT (buffers and offsets must then be aligned to
    /// [`ALIGN`]).
    pub direct: bool,
}

impl DriveFile {
    /// Opens `path` read-write, trying O_DIRECT first unless `direct` is false.
    pub fn open(path: &Path, direct: bool) -> io::Result<Self> {
        if direct {
            match OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(file) => return Ok(DriveFile { file, direct: true }),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(e),
            }
        }
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(DriveFile {
            file,
            direct: false,
        })
    }

    /// The raw descriptor, for [`IoOp`]s.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Flushes written data to stable storage (`fdatasync`).
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// Size in bytes of a regular file or block device.
pub fn device_size(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = file;
    f.seek(SeekFrom::End(0))
}
