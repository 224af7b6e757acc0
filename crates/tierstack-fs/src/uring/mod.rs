//! FUSE over io_uring (kernel 6.14 and later): the kernel hands each request to a queue of
//! the CPU its caller runs on, through an io_uring command the daemon has waiting there, and
//! takes the answer with the daemon's next command for that queue. A request then costs no
//! `read` and `write` of `/dev/fuse` and no wake-up of a thread on another CPU: the caller
//! sleeps, the queue's thread (pinned to the caller's CPU) runs, answers and sleeps, and
//! the caller runs again. On this project's 2-vCPU VM, a null file system answers the
//! smallio loop's creates 1.2x, stats 1.4x and unlinks 1.4x faster this way than a polling
//! `/dev/fuse` reader (docs/BENCHMARKS.md).
//!
//! The mount asks for it in INIT (`FUSE_OVER_IO_URING`) when `--transport` allows and the
//! kernel offers it (`/sys/module/fuse/parameters/enable_uring`). Once INIT has agreed,
//! the kernel holds every new request until each CPU's queue has a command waiting, so
//! [`Ring::start`] registers [`THREADS_PER_QUEUE`] threads per possible CPU at once; if
//! one cannot register, it aborts the FUSE connection (`/sys/fs/fuse/connections/N/abort`)
//! so that nothing waits forever, and the mount reports the error. The `/dev/fuse` readers of
//! [`crate::dev`] keep serving what still comes that way (FORGET, INTERRUPT).
//!
//! Each queue thread has an io_uring of its own with one entry: a 288-byte header buffer
//! and a payload buffer of the mount's largest request. [`THREADS_PER_QUEUE`] threads per
//! CPU let a request that blocks (an `fsync`) leave the CPU's other callers served.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::core::PAGE;
use crate::fuse::{InitOffer, TierFs};
use crate::ops::wire as abi;
use crate::ops::Out;

/// Threads (each with one ring entry) per CPU queue.
pub const THREADS_PER_QUEUE: usize = 2;
/// Ring entries per thread.
pub const ENTRIES_PER_THREAD: usize = 1;
/// A read or write of at least this many bytes is served at normal priority (see [`Policy`]).
const HEAVY_BYTES: usize = 128 << 10;
/// `struct fuse_uring_req_header`: in/out header (128), op header (128), `fuse_uring_ent_in_out` (32).
pub const HEADER: usize = 128 + 128 + 32;
/// Where `fuse_uring_ent_in_out` starts in the header.
const ENT: usize = 256;
/// `FUSE_IO_URING_CMD_REGISTER`.
pub const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
pub const CMD_COMMIT_AND_FETCH: u32 = 2;
/// How long the queues may take to register before the connection is aborted.
const REGISTER_WITHIN: Duration = Duration::from_secs(10);

/// Where the ring stands: INIT not seen yet; INIT deciding (it asks for io_uring);
/// agreed; refused (or not asked for, or given up on before INIT came); serving; failed.
const PENDING: u8 = 0;
const CLAIMED: u8 = 5;
const AGREED: u8 = 1;
const REFUSED: u8 = 2;
const SERVING: u8 = 3;
const FAILED: u8 = 4;

/// The mount's FUSE-over-io_uring transport: asked for or not, agreed in INIT or not,
/// serving or failed.
#[derive(Debug)]
pub struct Ring {
    want: bool,
    state: AtomicU8,
}

impl Ring {
    /// A transport that asks the kernel for io_uring in INIT when `want`.
    pub fn new(want: bool) -> Arc<Ring> {
        Arc::new(Ring {
            want,
            state: AtomicU8::new(PENDING),
        })
    }

    /// Waits (at most `within`) until INIT's outcome is known; then, if the kernel agreed to
    /// io_uring, registers the queues of every possible CPU on a duplicate of the session's
    /// device `dev` and serves them with `fs`. Returns whether the queues serve. Errors: a
    /// queue could not be registered (the connection is then aborted: requests fail instead
    /// of waiting).
    pub fn start(
        self: &Arc<Self>,
        dev: BorrowedFd<'_>,
        fs: TierFs,
        mountpoint: &Path,
        within: Duration,
    ) -> io::Result<bool> {
        let t0 = Instant::now();
        loop {
            match self.state.load(Ordering::Acquire) {
                PENDING if t0.elapsed() > within => {
                    // Given up: INIT, if it still comes, will not ask for io_uring.
                    if self
                        .state
                        .compare_exchange(PENDING, REFUSED, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        return Ok(false);
                    }
                }
                // INIT is deciding: it answers within moments.
                PENDING | CLAIMED => std::thread::sleep(Duration::from_millis(1)),
                _ => break,
            }
        }
        if self.state.load(Ordering::Acquire) != AGREED {
            return Ok(false);
        }
        let r = self.register(dev, fs, mountpoint);
        if let Err(e) = &r {
            self.state.store(FAILED, Ordering::Release);
            tracing::error!("FUSE over io_uring: {e}; aborting the connection");
            if let Err(a) = abort_connection(mountpoint) {
                tracing::error!("cannot abort the FUSE connection of {mountpoint:?}: {a}");
            }
            return r.map(|()| false);
        }
        self.state.store(SERVING, Ordering::Release);
        Ok(true)
    }

    fn register(&self, dev: BorrowedFd<'_>, fs: TierFs, mountpoint: &Path) -> io::Result<()> {
        // Failure injection for the end-to-end tests: the path a kernel that refuses the
        // queues takes.
        if std::env::var_os("TIERSTACK_INJECT_RING_FAILURE").is_some() {
            return Err(io::Error::other(
                "injected failure (TIERSTACK_INJECT_RING_FAILURE)",
            ));
        }
        let fd = Arc::new(dev.try_clone_to_owned()?);
        let mp = Arc::new(mountpoint.to_path_buf());
        let queues = possible_cpus()?;
        let (tx, rx) = mpsc::channel();
        let mut started = 0;
        for qid in 0..queues {
            for t in 0..THREADS_PER_QUEUE {
                let (fd, fs, tx, mp) = (fd.clone(), fs.clone(), tx.clone(), mp.clone());
                std::thread::Builder::new()
                    .name(format!("fuse-ring-{qid}.{t}"))
                    .spawn(move || queue_thread(&fd, qid, &fs, tx, &mp))?;
                started += 1;
            }
        }
        drop(tx);
        let deadline = Instant::now() + REGISTER_WITHIN;
        for _ in 0..started {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(io::Error::other(format!(
                        "the queues did not register within {REGISTER_WITHIN:?}"
                    )))
                }
            }
        }
        tracing::info!("FUSE over io_uring: {queues} queues, {THREADS_PER_QUEUE} threads each");
        Ok(())
    }
}

impl InitOffer for Ring {
    /// Whether INIT asks for io_uring: when the mount wants it and [`Ring::start`] has not
    /// given up waiting for INIT (then nobody would register the queues, and the kernel
    /// would hold every request). INIT then reports its outcome with [`Ring::negotiated`].
    fn wanted(&self) -> bool {
        self.want
            && self
                .state
                .compare_exchange(PENDING, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// INIT's outcome: whether the kernel agreed to io_uring.
    fn negotiated(&self, agreed: bool) {
        let s = if agreed { AGREED } else { REFUSED };
        self.state.store(s, Ordering::Release);
    }
}

/// The kernel's number of possible CPUs (its queue count), from
/// `/sys/devices/system/cpu/possible` ("0-3", "0-3,6-7", "0").
fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(s.trim()).ok_or_else(|| {
        io::Error::other(format!("cannot read the possible CPUs from {:?}", s.trim()))
    })
}

/// One more than the highest CPU of a kernel CPU list.
fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut top = None;
    for part in s.split(',') {
        let last = part.rsplit('-').next()?;
        let n: usize = last.trim().parse().ok()?;
        top = Some(top.map_or(n, |t: usize| t.max(n)));
    }
    top.map(|t| t + 1)
}

/// Aborts the FUSE connection mounted at `mountpoint` through the fusectl file system
/// (mounted at /sys/fs/fuse/connections if it is not): every request waiting on it fails.
pub fn abort_connection(mountpoint: &Path) -> io::Result<()> {
    let dev = connection_of(mountpoint)?;
    let dir = Path::new("/sys/fs/fuse/connections");
    if std::fs::read_dir(dir)
        .map(|mut d| d.next().is_none())
        .unwrap_or(true)
    {
        let _ = rustix::mount::mount(
            "fusectl",
            dir,
            "fusectl",
            rustix::mount::MountFlags::empty(),
            None,
        );
    }
    std::fs::write(dir.join(dev.to_string()).join("abort"), b"1")
}

/// The connection number (the minor device number) of the FUSE mount at `mountpoint`, from
/// /proc/self/mountinfo: a `stat` of the mount point could wait on the very connection.
fn connection_of(mountpoint: &Path) -> io::Result<u32> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = mountpoint.to_string_lossy();
    info.lines()
        .rev()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let (dev, mp) = (f.get(2)?, f.get(4)?);
            (*mp == want).then(|| dev.split(':').nth(1)?.parse().ok())?
        })
        .ok_or_else(|| io::Error::other(format!("{mountpoint:?} is not in /proc/self/mountinfo")))
}

/// `struct fuse_uring_cmd_req` in the SQE's 80-byte command area: the commit id of the
/// answer the command carries (0 for a registration) and the queue.
pub fn cmd(qid: u16, commit_id: u64) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_le_bytes());
    c[16..18].copy_from_slice(&qid.to_le_bytes());
    c
}

/// Sets `sqe->len` (the io-uring crate's `UringCmd80` has no setter for it): a
/// registration's number of iovecs.
pub fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `repr(C)`: a 64-byte `io_uring_sqe` then 64 bytes; `len` is the
    // u32 at byte offset 24 of the SQE; both types are plain bytes of the same size.
    unsafe {
        let mut raw: [u8; 128] = std::mem::transmute(sqe);
        raw[24..28].copy_from_slice(&len.to_le_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(raw)
    }
}

/// Pins the calling thread to CPU `cpu`.
pub fn pin(cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it, and
    // sched_setaffinity reads the set of the size passed.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One ring entry's buffers: the kernel writes a request into them and reads the answer
/// back from them.
struct Entry {
    header: Box<[u64]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
}

impl Entry {
    fn new(payload_len: usize) -> Entry {
        let mut header = vec![0u64; HEADER / 8].into_boxed_slice();
        let mut payload = vec![0u8; payload_len].into_boxed_slice();
        let iov = Box::new([
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: HEADER,
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload_len,
            },
        ]);
        Entry {
            header,
            payload,
            iov,
        }
    }

    fn header_bytes(&mut self) -> &mut [u8] {
        // SAFETY: a view of the header's own allocation as bytes (u64 -> u8: any alignment,
        // same length in bytes); the kernel does not write it while the entry is ours.
        unsafe { std::slice::from_raw_parts_mut(self.header.as_mut_ptr().cast(), HEADER) }
    }
}

/// Registers one entry for queue `qid` and serves it until the connection ends. Sends the
/// registration's outcome on `registered`.
fn queue_thread(
    fd: &OwnedFd,
    qid: usize,
    fs: &TierFs,
    registered: mpsc::Sender<io::Result<()>>,
    mountpoint: &PathBuf,
) {
    let mut reported = false;
    let r = serve_queue(fd, qid, fs, &registered, &mut reported);
    if let Err(e) = r {
        if reported {
            // Once the queues serve, a queue that fails must not leave its callers waiting.
            tracing::error!("FUSE ring queue {qid}: {e}; aborting the connection");
            if let Err(a) = abort_connection(mountpoint) {
                tracing::error!("cannot abort the FUSE connection of {mountpoint:?}: {a}");
            }
        } else {
            let _ = registered.send(Err(e));
        }
    }
}

fn serve_queue(
    fd: &OwnedFd,
    qid: usize,
    fs: &TierFs,
    registered: &mpsc::Sender<io::Result<()>>,
    reported: &mut bool,
) -> io::Result<()> {
    let mut policy = Policy::new(qid);
    // The largest request: a write of `max_write` (PAGE) bytes; a read's answer of as much.
    // The buffers are never freed (see the registration's SAFETY note).
    let ents: Vec<&'static mut Entry> = (0..ENTRIES_PER_THREAD)
        .map(|_| Box::leak(Box::new(Entry::new(PAGE as usize + 4096))))
        .collect();
    let mut ents = ents;
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(4 * ENTRIES_PER_THREAD as u32)?;
    let dev = types::Fd(fd.as_raw_fd());
    let register = |ring: &mut IoUring<squeue::Entry128, cqueue::Entry>, i: usize, e: &Entry| {
        let sqe = opcode::UringCmd80::new(dev, CMD_REGISTER)
            .cmd(cmd(qid as u16, 0))
            .addr(Some(e.iov.as_ptr() as u64))
            .build()
            .user_data(i as u64);
        let sqe = with_len(sqe, 2);
        // SAFETY: the iovecs and the buffers they point at are leaked (`'static`): the kernel
        // may write a request into them until it has cancelled the ring's commands, which
        // ends after the ring is dropped.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("submission queue full"))?;
        ring.submit().map(|_| ())
    };
    // Registration is refused (EAGAIN) until the kernel has INIT's answer.
    let t0 = Instant::now();
    for (i, e) in ents.iter().enumerate() {
        loop {
            register(&mut ring, i, e)?;
            let early: Option<i32> = ring.completion().next().map(|c| c.result());
            match early {
                None => break,
                Some(r) if r == -libc::EAGAIN && t0.elapsed() < REGISTER_WITHIN => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Some(r) => {
                    return Err(io::Error::other(format!(
                        "registering queue {qid}: {}",
                        io::Error::from_raw_os_error(-r)
                    )))
                }
            }
        }
    }
    let _ = registered.send(Ok(()));
    *reported = true;
    let mut out = Vec::with_capacity(4096);
    // The completions of one wait (reused: no allocation per request).
    let mut done: Vec<(usize, i32)> = Vec::with_capacity(ENTRIES_PER_THREAD);
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        }
        done.clear();
        done.extend(
            ring.completion()
                .map(|c| (c.user_data() as usize, c.result())),
        );
        for &(i, res) in &done {
            let Some(e) = ents.get_mut(i) else {
                continue;
            };
            if res < 0 {
                if matches!(-res, libc::ENOTCONN | libc::ECANCELED | libc::ENODEV) {
                    return Ok(());
                }
                if -res == libc::EAGAIN {
                    register(&mut ring, i, e)?;
                    continue;
                }
                return Err(io::Error::from_raw_os_error(-res));
            }
            policy.set(heavy(e));
            let then = answer_entry(e, fs, &mut out);
            let commit_id = {
                let h = e.header_bytes();
                u64::from_le_bytes(h[ENT + 8..ENT + 16].try_into().unwrap_or_default())
            };
            let sqe = opcode::UringCmd80::new(dev, CMD_COMMIT_AND_FETCH)
                .cmd(cmd(qid as u16, commit_id))
                .build()
                .user_data(i as u64);
            // SAFETY: as for the registration: the entry's buffers outlive the ring.
            unsafe { ring.submission().push(&sqe) }
                .map_err(|_| io::Error::other("submission queue full"))?;
            // The commit goes to the kernel with the next wait (one system call), unless
            // something must follow the reply.
            if then.is_some() {
                ring.submit()?;
                fs.after_reply(then);
            }
        }
    }
}

/// The queue threads' scheduling policy and CPU. A queue thread answers on its caller's CPU
/// and wakes the caller there; at that moment the scheduler looks for an idle CPU for the
/// caller, and the CPU it is on is not idle (the queue thread still runs), so it moves the
/// caller to the other CPU, waking that one from its idle state: on this project's VM that
/// doubled the time of a `stat`, and the caller moved on most requests. A CPU that runs only
/// SCHED_IDLE tasks counts as idle there, so a queue thread waits and answers small requests
/// at SCHED_IDLE, pinned to its queue's CPU, and the caller stays. Measured with three
/// CPU-bound processes per CPU, small operations ran 10-15 % slower than at normal priority
/// and still 2-3x faster than over `/dev/fuse` (docs/BENCHMARKS.md).
///
/// A request that may take long (a large read or write, an `fsync`) is served and answered at
/// normal priority, so that other work on the CPU does not starve it, and on any CPU of the
/// process: a reader's read-ahead sends its large reads to its own CPU's queue, and pinned
/// threads then copied them on that one CPU while the other stayed idle (a single `dd` read
/// at half the rate of `/dev/fuse`). The thread goes back to SCHED_IDLE and its CPU when it
/// next serves a small request.
struct Policy {
    cpu: usize,
    /// The process's CPU set when the thread started (where a heavy request may run).
    all: Option<libc::cpu_set_t>,
    /// Serving small requests (SCHED_IDLE, pinned), heavy ones, or not set yet.
    small: Option<bool>,
}

impl Policy {
    fn new(cpu: usize) -> Policy {
        // SAFETY: a zeroed cpu_set_t is a valid empty set, filled by sched_getaffinity for
        // the calling thread (0) with the size passed.
        let all = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
                .then_some(set)
        };
        let mut p = Policy {
            cpu,
            all,
            small: None,
        };
        p.set(false);
        p
    }

    /// Serve the next request as a heavy one (`heavy`) or a small one, switching policy and
    /// CPU if the thread is not there already. A refusal leaves things as they were (only
    /// slower): a CPU that is offline or outside the process's CPU set cannot be pinned to,
    /// and its queue is then served from wherever the thread runs.
    fn set(&mut self, heavy: bool) {
        let small = !heavy;
        if self.small == Some(small) {
            return;
        }
        let policy = if small {
            libc::SCHED_IDLE
        } else {
            libc::SCHED_OTHER
        };
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sets the calling thread's (0) policy from a valid `sched_param`.
        unsafe { libc::sched_setscheduler(0, policy, &param) };
        if small {
            if let Err(e) = pin(self.cpu) {
                tracing::debug!("queue {} not pinned: {e}", self.cpu);
            }
        } else if let Some(all) = &self.all {
            // SAFETY: sets the calling thread's (0) CPU set from a valid set of the size
            // passed.
            unsafe {
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), all);
            }
        }
        self.small = Some(small);
    }
}

/// Whether the request in `e` may take long: a read or write of [`HEAVY_BYTES`] or more, an
/// `fsync`.
fn heavy(e: &mut Entry) -> bool {
    let h = e.header_bytes();
    let opcode = u32::from_le_bytes(h[4..8].try_into().unwrap_or_default());
    let size = u32::from_le_bytes(h[128 + 16..128 + 20].try_into().unwrap_or_default()) as usize;
    match opcode {
        abi::opcode::READ | abi::opcode::WRITE => size >= HEAVY_BYTES,
        abi::opcode::FSYNC | abi::opcode::FSYNCDIR => true,
        _ => false,
    }
}

/// Serves the request in entry `e` and writes its answer there (header and payload); returns
/// the inode whose kernel entries are to be dropped once the answer is committed.
fn answer_entry(e: &mut Entry, fs: &TierFs, out: &mut Vec<u8>) -> Option<u64> {
    let (h, arg, payload_sz) = {
        let hb = e.header_bytes();
        let h = abi::header(&hb[..abi::IN_HEADER]);
        let mut arg = [0u8; 128];
        arg.copy_from_slice(&hb[128..256]);
        let sz = u32::from_le_bytes(hb[ENT + 16..ENT + 20].try_into().unwrap_or_default());
        (h, arg, sz as usize)
    };
    let payload = &e.payload[..payload_sz.min(e.payload.len())];
    let (error, len, then, unique) = match h {
        Err(err) => (-err, 0, None, 0),
        Ok(h) => {
            // A request that takes no answer (none comes this way) is answered as done.
            let (r, then, limit) = fs
                .serve_decoded(&h, abi::decode(&h, &arg, payload))
                .unwrap_or((Ok(Out::Empty), None, usize::MAX));
            let (error, len) = abi::encode_into(&r, limit, &mut e.payload, out);
            (error, len, then, h.unique)
        }
    };
    let hb = e.header_bytes();
    // `struct fuse_out_header`: len, error, unique.
    hb[0..4].copy_from_slice(&((16 + len) as u32).to_le_bytes());
    hb[4..8].copy_from_slice(&error.to_le_bytes());
    hb[8..16].copy_from_slice(&unique.to_le_bytes());
    hb[ENT + 16..ENT + 20].copy_from_slice(&(len as u32).to_le_bytes());
    then
}

/// What `--transport` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// io_uring when the kernel offers it, else `/dev/fuse`.
    #[default]
    Auto,
    /// io_uring; the mount fails if the kernel does not offer it.
    Uring,
    /// `/dev/fuse` read and write only.
    Dev,
}

/// Whether the kernel lets FUSE servers use io_uring (`fuse.enable_uring`): None when the
/// kernel has no such parameter (before 6.14).
pub fn kernel_allows() -> Option<bool> {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .ok()
        .map(|s| s.trim() == "Y")
}

/// The path of the kernel switch that lets FUSE servers use io_uring.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_give_the_kernels_queue_count() {
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,6-7"), Some(8));
        assert_eq!(parse_cpu_list("x"), None);
    }
}
