//! What one FUSE round trip costs on this kernel, by transport (issue 18's measurement).
//!
//! A minimal FUSE server (one directory, files `f0`, `f1`, ... that all exist, attributes
//! never cached) is mounted three ways, and a caller times `stat` of one file: every call is
//! one GETATTR round trip, so the time per call is the transport's cost plus a few
//! microseconds of VFS work. The same loop on a file in a plain folder is the reference.
//!
//! - `classic`: two threads blocking in `read(/dev/fuse)`, replies by `write` (what `fuser`
//!   does);
//! - `poll`: one thread spinning on a non-blocking `/dev/fuse` (what the mount's
//!   `poll.rs` does while small requests come back to back);
//! - `placed`: blocking readers pinned one to each CPU, at SCHED_IDLE (the knobs are in
//!   [`spawn_placed`]); the twelfth session's test of where `/dev/fuse` readers should run
//!   (docs/BENCHMARKS.md);
//! - `uring`: FUSE over io_uring (kernel 6.14+, `fuse.enable_uring=Y`): one thread per CPU,
//!   pinned, serving the kernel's queue for that CPU, so a request is answered on its
//!   caller's CPU.
//!
//! Run as root: `cargo run --release --example fuse_transport -- MODE MOUNTPOINT [CALLS]
//! [REFERENCE_FILE [COMMAND...]]`; COMMAND runs while the file system is mounted. It prints
//! one JSON line. It is a measurement, not part of the product:
//! the mount does not speak io_uring (the `fuser` crate does not).

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use tierstack_fs::uring::{cmd, pin, with_len, CMD_COMMIT_AND_FETCH, CMD_REGISTER, HEADER};

const FUSE_LOOKUP: u32 = 1;
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_SETATTR: u32 = 4;
const FUSE_UNLINK: u32 = 10;
const FUSE_OPEN: u32 = 14;
const FUSE_WRITE: u32 = 16;
const FUSE_RELEASE: u32 = 18;
const FUSE_GETXATTR: u32 = 22;
const FUSE_FLUSH: u32 = 25;
const FUSE_INIT: u32 = 26;
const FUSE_CREATE: u32 = 35;
const FUSE_BATCH_FORGET: u32 = 42;

/// What the mount's INIT asks for (`fuse.rs`): async reads, atomic O_TRUNC, big writes,
/// no umask, writeback cache, parallel directory operations, killpriv v2, POSIX ACLs.
const MOUNT_FLAGS: u32 =
    1 | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 16) | (1 << 18) | (1 << 20) | (1 << 28);

const FUSE_INIT_EXT: u32 = 1 << 30;
const FUSE_MAX_PAGES: u32 = 1 << 22;
/// `FUSE_OVER_IO_URING` is bit 41: bit 9 of `flags2`.
const FUSE_OVER_IO_URING_HI: u32 = 1 << 9;

const IN_HEADER: usize = 40;
const MAX_WRITE: u32 = 128 * 1024;

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// `struct fuse_attr` (88 bytes).
fn attr(ino: u64, mode: u32, nlink: u32, size: u64) -> Vec<u8> {
    let mut a = Vec::with_capacity(88);
    a.extend_from_slice(&ino.to_le_bytes());
    a.extend_from_slice(&size.to_le_bytes());
    a.extend_from_slice(&8u64.to_le_bytes()); // blocks
    for _ in 0..3 {
        a.extend_from_slice(&1_700_000_000u64.to_le_bytes());
    }
    for _ in 0..3 {
        a.extend_from_slice(&0u32.to_le_bytes());
    }
    for v in [mode, nlink, 0, 0, 0, 4096, 0] {
        a.extend_from_slice(&v.to_le_bytes());
    }
    a
}

/// Whether INIT offers the kernel FUSE over io_uring (mode `uring`).
static URING: AtomicBool = AtomicBool::new(false);
/// `FUSE_TRANSPORT_LIKE_MOUNT=1`: INIT asks for what the mount asks for (writeback cache,
/// POSIX ACLs, so `default_permissions`, ...) and entries and attributes are cached for an
/// hour, as the mount's are: the kernel then sends the requests it sends the mount.
static LIKE_MOUNT: AtomicBool = AtomicBool::new(false);

/// Requests served, by opcode.
static BY_OPCODE: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// Counters of what each path served.
#[derive(Default)]
struct Served {
    legacy: AtomicU64,
    ring: AtomicU64,
    /// Set once the reply to INIT is written: the ring can only be registered after it.
    initialized: AtomicBool,
}

/// The names in the root directory: name -> (inode, size). `f1` exists from the start.
struct Names {
    by_name: HashMap<Vec<u8>, (u64, u64)>,
    next: u64,
}

fn names() -> &'static Mutex<Names> {
    static NAMES: OnceLock<Mutex<Names>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut by_name = HashMap::new();
        by_name.insert(b"f1".to_vec(), (2, 100));
        Mutex::new(Names { by_name, next: 3 })
    })
}

/// Seconds the kernel may cache entries and attributes (0: attributes never cached).
fn ttls() -> (u64, u64) {
    if LIKE_MOUNT.load(Ordering::Relaxed) {
        (3600, 3600)
    } else {
        (3600, 0)
    }
}

/// `struct fuse_entry_out` for `ino` (0: a negative entry).
fn entry(ino: u64, size: u64) -> Vec<u8> {
    let (entry_valid, attr_valid) = ttls();
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&ino.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // generation
    out.extend_from_slice(&entry_valid.to_le_bytes());
    out.extend_from_slice(&attr_valid.to_le_bytes());
    out.extend_from_slice(&[0u8; 8]);
    out.extend(attr(ino, libc::S_IFREG | 0o644, 1, size));
    out
}

/// The fixed-size argument that precedes a request's payload on `/dev/fuse` (over io_uring
/// it comes in the op header instead).
fn op_header_len(opcode: u32) -> usize {
    match opcode {
        FUSE_GETATTR => 16,
        FUSE_SETATTR => 88,
        FUSE_OPEN => 8,
        FUSE_WRITE => 40,
        FUSE_RELEASE | FUSE_FLUSH => 24,
        FUSE_GETXATTR => 8,
        FUSE_CREATE => 16,
        _ => 0,
    }
}

/// The file system: returns `Some((error, reply payload))`, or `None` when the kernel
/// expects no reply. `hdr` is the request's fixed argument, `payload` what follows it (a
/// name, or a write's data).
fn handle(opcode: u32, nodeid: u64, hdr: &[u8], payload: &[u8]) -> Option<(i32, Vec<u8>)> {
    if let Some(c) = BY_OPCODE.get(opcode as usize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    let name = payload.split(|&c| c == 0).next().unwrap_or_default();
    let like_mount = LIKE_MOUNT.load(Ordering::Relaxed);
    let mut ns = names().lock().unwrap_or_else(|p| p.into_inner());
    match opcode {
        FUSE_INIT => {
            let minor = u32_at(hdr, 4).min(42);
            let max_readahead = u32_at(hdr, 8);
            let flags_in = u32_at(hdr, 12);
            let flags2_in = u32_at(hdr, 16);
            let uring = URING.load(Ordering::Relaxed);
            let mut flags = FUSE_INIT_EXT | FUSE_MAX_PAGES;
            if like_mount {
                flags |= flags_in & MOUNT_FLAGS;
            }
            let mut out = Vec::with_capacity(64);
            for v in [7u32, minor, max_readahead, flags] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&16u16.to_le_bytes()); // max_background
            out.extend_from_slice(&12u16.to_le_bytes()); // congestion_threshold
            out.extend_from_slice(&MAX_WRITE.to_le_bytes());
            out.extend_from_slice(&1u32.to_le_bytes()); // time_gran
            out.extend_from_slice(&32u16.to_le_bytes()); // max_pages
            out.extend_from_slice(&0u16.to_le_bytes()); // map_alignment
            let flags2 = if uring {
                flags2_in & FUSE_OVER_IO_URING_HI
            } else {
                0
            };
            out.extend_from_slice(&flags2.to_le_bytes());
            out.resize(64, 0);
            Some((0, out))
        }
        FUSE_LOOKUP => {
            if nodeid != 1 {
                return Some((-libc::ENOENT, Vec::new()));
            }
            if !like_mount && name.first() == Some(&b'f') {
                return Some((0, entry(2 + name.len() as u64, 100)));
            }
            match ns.by_name.get(name) {
                Some(&(ino, size)) => Some((0, entry(ino, size))),
                // A negative entry the kernel keeps, as the mount answers.
                None if like_mount => Some((0, entry(0, 0))),
                None => Some((-libc::ENOENT, Vec::new())),
            }
        }
        FUSE_CREATE => {
            let ino = ns.next;
            ns.next += 1;
            ns.by_name.insert(name.to_vec(), (ino, 0));
            // A write-only create is a direct handle, as the mount's (`refresh.rs`):
            // FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES.
            let direct = like_mount && u32_at(hdr, 0) as i32 & libc::O_ACCMODE == libc::O_WRONLY;
            let mut out = entry(ino, 0);
            out.extend_from_slice(&ino.to_le_bytes()); // fh
            out.extend_from_slice(&(if direct { 1u32 | 64 } else { 0 }).to_le_bytes());
            out.extend_from_slice(&[0u8; 4]); // backing_id
            Some((0, out))
        }
        FUSE_OPEN => {
            let mut out = nodeid.to_le_bytes().to_vec();
            out.extend_from_slice(&[0u8; 8]);
            Some((0, out))
        }
        FUSE_WRITE => {
            let (off, size) = (u64_at(hdr, 8), u32_at(hdr, 16));
            if let Some(e) = ns.by_name.values_mut().find(|e| e.0 == nodeid) {
                e.1 = e.1.max(off + size as u64);
            }
            Some((
                0,
                size.to_le_bytes()
                    .iter()
                    .chain(&[0u8; 4])
                    .copied()
                    .collect(),
            ))
        }
        FUSE_UNLINK => match ns.by_name.remove(name) {
            Some(_) => Some((0, Vec::new())),
            None => Some((-libc::ENOENT, Vec::new())),
        },
        FUSE_GETATTR | FUSE_SETATTR => {
            let (mode, nlink, size) = if nodeid == 1 {
                (libc::S_IFDIR | 0o755, 2, 4096)
            } else {
                let size = ns
                    .by_name
                    .values()
                    .find(|e| e.0 == nodeid)
                    .map_or(100, |e| e.1);
                (libc::S_IFREG | 0o644, 1, size)
            };
            let mut out = Vec::with_capacity(104);
            out.extend_from_slice(&ttls().1.to_le_bytes());
            out.extend_from_slice(&[0u8; 8]);
            out.extend(attr(nodeid, mode, nlink, size));
            Some((0, out))
        }
        FUSE_RELEASE => Some((0, Vec::new())),
        FUSE_GETXATTR => Some((-libc::ENODATA, Vec::new())),
        FUSE_FORGET | FUSE_BATCH_FORGET => None,
        _ => Some((-libc::ENOSYS, Vec::new())),
    }
}

fn reply_bytes(unique: u64, error: i32, payload: &[u8]) -> Vec<u8> {
    let len = 16 + payload.len() as u32;
    let mut r = Vec::with_capacity(len as usize);
    r.extend_from_slice(&len.to_le_bytes());
    r.extend_from_slice(&error.to_le_bytes());
    r.extend_from_slice(&unique.to_le_bytes());
    r.extend_from_slice(payload);
    r
}

/// Serve `/dev/fuse` by read/write until the connection ends. `spin`: non-blocking reads.
fn serve_legacy(fd: i32, spin: bool, served: &Served) -> io::Result<()> {
    let mut buf = vec![0u8; MAX_WRITE as usize + 4096];
    loop {
        // SAFETY: `buf` is a live, writable buffer of the length passed.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) if spin => continue,
                Some(libc::EINTR) | Some(libc::ENOENT) => continue,
                Some(libc::ENODEV) => return Ok(()),
                _ => return Err(e),
            }
        }
        let req = &buf[..n as usize];
        if req.len() < IN_HEADER {
            continue;
        }
        let opcode = u32_at(req, 4);
        let unique = u64_at(req, 8);
        let nodeid = u64_at(req, 16);
        let body = &req[IN_HEADER..];
        let (hdr, payload) = body.split_at(op_header_len(opcode).min(body.len()));
        let hdr = if opcode == FUSE_INIT { body } else { hdr };
        served.legacy.fetch_add(1, Ordering::Relaxed);
        if let Some((error, payload)) = handle(opcode, nodeid, hdr, payload) {
            let r = reply_bytes(unique, error, &payload);
            // SAFETY: `r` is a live buffer of the length passed.
            let w = unsafe { libc::write(fd, r.as_ptr().cast(), r.len()) };
            if w < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENODEV) {
                    return Ok(());
                }
                if e.raw_os_error() != Some(libc::ENOENT) {
                    return Err(e);
                }
            }
            if opcode == FUSE_INIT {
                served.initialized.store(true, Ordering::Release);
            }
        }
    }
}

/// One ring entry: the header and payload buffers the kernel writes requests into.
struct Entry {
    header: Box<[u64]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
}

/// Serve queue `qid` (the requests of callers running on CPU `qid`) over io_uring.
fn serve_ring(fd: i32, qid: usize, entries: usize, served: &Served) -> io::Result<()> {
    pin(qid)?;
    while !served.initialized.load(Ordering::Acquire) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(16)?;
    let mut ents: Vec<Entry> = (0..entries)
        .map(|_| {
            let mut header = vec![0u64; HEADER / 8].into_boxed_slice();
            let mut payload = vec![0u8; MAX_WRITE as usize].into_boxed_slice();
            let iov = Box::new([
                libc::iovec {
                    iov_base: header.as_mut_ptr().cast(),
                    iov_len: HEADER,
                },
                libc::iovec {
                    iov_base: payload.as_mut_ptr().cast(),
                    iov_len: payload.len(),
                },
            ]);
            Entry {
                header,
                payload,
                iov,
            }
        })
        .collect();
    for (i, e) in ents.iter().enumerate() {
        let sqe = opcode::UringCmd80::new(types::Fd(fd), CMD_REGISTER)
            .cmd(cmd(qid as u16, 0))
            .addr(Some(e.iov.as_ptr() as u64))
            .build()
            .user_data(i as u64);
        let sqe = with_len(sqe, 2);
        // SAFETY: the iovecs and the buffers they point at live in `ents` until this
        // function returns, after the ring is gone.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("submission queue full"))?;
    }
    ring.submit()?;
    // `EXP_DEBUG=1` prints each request served from the ring.
    let debug = std::env::var_os("EXP_DEBUG").is_some();
    if debug {
        eprintln!("ring {qid}: registered {entries}");
    }
    loop {
        ring.submit_and_wait(1)?;
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (i, res) in done {
            if res < 0 {
                if res == -libc::ENOTCONN || res == -libc::ECANCELED {
                    return Ok(());
                }
                return Err(io::Error::from_raw_os_error(-res));
            }
            let e = &mut ents[i as usize];
            // SAFETY: the kernel completed this entry's command: until it is committed,
            // the buffers are ours alone; u64 -> u8 view of the same allocation.
            let hdr: &mut [u8] =
                unsafe { std::slice::from_raw_parts_mut(e.header.as_mut_ptr().cast(), HEADER) };
            let opcode = u32_at(hdr, 4);
            let unique = u64_at(hdr, 8);
            let nodeid = u64_at(hdr, 16);
            let commit_id = u64_at(hdr, 256 + 8);
            let payload_sz = u32_at(hdr, 256 + 16) as usize;
            served.ring.fetch_add(1, Ordering::Relaxed);
            if debug {
                eprintln!("ring {qid}: op {opcode} unique {unique} node {nodeid} commit {commit_id} payload {payload_sz}");
            }
            let (error, out) = handle(
                opcode,
                nodeid,
                &hdr[128..256],
                &e.payload[..payload_sz.min(e.payload.len())],
            )
            .unwrap_or((0, Vec::new()));
            hdr[..16].copy_from_slice(&reply_bytes(unique, error, &[])[..16]);
            e.payload[..out.len()].copy_from_slice(&out);
            hdr[256 + 16..256 + 20].copy_from_slice(&(out.len() as u32).to_le_bytes());
            let sqe = opcode::UringCmd80::new(types::Fd(fd), CMD_COMMIT_AND_FETCH)
                .cmd(cmd(qid as u16, commit_id))
                .build()
                .user_data(i);
            // SAFETY: as above; the entry's buffers stay alive.
            unsafe { ring.submission().push(&sqe) }
                .map_err(|_| io::Error::other("submission queue full"))?;
        }
    }
}

fn stat_loop(path: &str, calls: usize) -> io::Result<f64> {
    let c = CString::new(path).map_err(io::Error::other)?;
    // SAFETY: a zeroed `stat` is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid out-buffer.
    if unsafe { libc::stat(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let t = Instant::now();
    for _ in 0..calls {
        // SAFETY: as above.
        if unsafe { libc::stat(c.as_ptr(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / calls as f64)
}

/// A number from the environment variable `k`, or `default`.
fn env_usize(k: &str, default: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Mode `placed`: `FT_PER_CPU` (1) readers per CPU, pinned there unless `FT_PIN=0`, at
/// SCHED_IDLE unless `FT_IDLE=0`; `spin` (`FT_SPIN=1`): the device is non-blocking and they
/// spin. `FT_NORMAL` (0) more readers, unpinned at normal priority, are started by `main`.
fn spawn_placed(fd: i32, spin: bool, served: &Arc<Served>) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (per, do_pin, do_idle) = (
        env_usize("FT_PER_CPU", 1),
        env_usize("FT_PIN", 1) == 1,
        env_usize("FT_IDLE", 1) == 1,
    );
    for i in 0..cpus * per {
        let s = served.clone();
        std::thread::spawn(move || {
            if do_pin {
                let _ = pin(i % cpus);
            }
            if do_idle {
                let param = libc::sched_param { sched_priority: 0 };
                // SAFETY: sets the calling thread's (0) policy from a valid sched_param.
                unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
            }
            if let Err(e) = serve_legacy(fd, spin, &s) {
                eprintln!("legacy server: {e}");
            }
        });
    }
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage =
        "usage: fuse_transport classic|poll|placed|uring MOUNTPOINT [CALLS] [REFERENCE_FILE [COMMAND...]]";
    let mode = args.get(1).ok_or_else(|| io::Error::other(usage))?.clone();
    let mnt = args.get(2).ok_or_else(|| io::Error::other(usage))?.clone();
    let calls: usize = args
        .get(3)
        .map(|s| s.parse().map_err(io::Error::other))
        .transpose()?
        .unwrap_or(200_000);
    URING.store(mode == "uring", Ordering::Relaxed);
    LIKE_MOUNT.store(
        std::env::var_os("FUSE_TRANSPORT_LIKE_MOUNT").is_some_and(|v| v == "1"),
        Ordering::Relaxed,
    );
    let dev = CString::new("/dev/fuse").map_err(io::Error::other)?;
    // SAFETY: opening a device by a NUL-terminated path.
    let raw = unsafe { libc::open(dev.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor we just opened and own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let opts = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other",
        fd.as_raw_fd()
    );
    let (src, tgt, fstype, data) = (
        CString::new("tsexp").map_err(io::Error::other)?,
        CString::new(mnt.as_str()).map_err(io::Error::other)?,
        CString::new("fuse.tsexp").map_err(io::Error::other)?,
        CString::new(opts).map_err(io::Error::other)?,
    );
    // SAFETY: all four are NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let served = Arc::new(Served::default());
    let rawfd = fd.as_raw_fd();
    let spin = mode == "poll" || (mode == "placed" && env_usize("FT_SPIN", 0) == 1);
    if spin {
        // SAFETY: fcntl on a descriptor we own.
        unsafe { libc::fcntl(rawfd, libc::F_SETFL, libc::O_NONBLOCK) };
    }
    if mode == "placed" {
        spawn_placed(rawfd, spin, &served);
    }
    let legacy_threads = match mode.as_str() {
        "classic" => 2,
        "placed" => env_usize("FT_NORMAL", 0),
        _ => 1,
    };
    for _ in 0..legacy_threads {
        let s = served.clone();
        std::thread::spawn(move || {
            if let Err(e) = serve_legacy(rawfd, spin, &s) {
                eprintln!("legacy server: {e}");
            }
        });
    }
    if mode == "uring" {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        for qid in 0..cpus {
            let s = served.clone();
            std::thread::spawn(move || {
                if let Err(e) = serve_ring(rawfd, qid, 2, &s) {
                    eprintln!("ring server {qid}: {e}");
                }
            });
        }
    }
    // Wait for INIT (and, over io_uring, for every queue's registration): the first stat
    // blocks until then.
    let probe = format!("{mnt}/f1");
    stat_loop(&probe, 1)?;
    let before = (
        served.legacy.load(Ordering::Relaxed),
        served.ring.load(Ordering::Relaxed),
    );
    let mount_us = stat_loop(&probe, calls)?;
    let after = (
        served.legacy.load(Ordering::Relaxed),
        served.ring.load(Ordering::Relaxed),
    );
    let reference_us = match args.get(4) {
        Some(p) => stat_loop(p, calls)?,
        None => f64::NAN,
    };
    // Anything after REFERENCE_FILE is a command run while the file system is mounted (with
    // its transport still serving), e.g. a Python loop of `os.stat`.
    if args.len() > 5 {
        let status = std::process::Command::new(&args[5])
            .args(&args[6..])
            .status()?;
        if !status.success() {
            eprintln!("the command failed: {status}");
        }
    }
    // SAFETY: NUL-terminated path.
    unsafe { libc::umount2(tgt.as_ptr(), libc::MNT_DETACH) };
    let by_opcode: Vec<String> = BY_OPCODE
        .iter()
        .enumerate()
        .filter(|(_, c)| c.load(Ordering::Relaxed) > 0)
        .map(|(op, c)| format!("\"{op}\":{}", c.load(Ordering::Relaxed)))
        .collect();
    eprintln!(
        "{{\"requests_by_opcode\":{{{}}},\"legacy_total\":{},\"ring_total\":{}}}",
        by_opcode.join(","),
        served.legacy.load(Ordering::Relaxed),
        served.ring.load(Ordering::Relaxed)
    );
    println!(
        "{{\"mode\":\"{mode}\",\"calls\":{calls},\"mount_us_per_stat\":{mount_us:.2},\"reference_us_per_stat\":{reference_us:.2},\"ratio\":{:.3},\"served_legacy\":{},\"served_ring\":{}}}",
        reference_us / mount_us,
        after.0 - before.0,
        after.1 - before.1
    );
    std::process::exit(0);
}
