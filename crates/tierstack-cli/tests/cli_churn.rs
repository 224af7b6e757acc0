//! The churn harness: N workers do seeded random namespace and data operations (create,
//! mkdir, rename over files and directories, hard links, symlinks, FIFOs and device nodes,
//! unlink, rmdir, truncate, buffered, direct and mmap writes, fsync, fallocate with every
//! mode, xattrs, chmod) through a real FUSE mount and, in lockstep, in a plain folder on the
//! same file system. Each operation's outcome (success or errno, and what a read returns)
//! must be the same on both sides. Each worker owns a subtree; a shared subtree is worked
//! under a harness lock, so both sides see the same order there too. At the end the mount's
//! view must equal the plain folder (types, modes, sizes, contents, link counts, symlink
//! targets, device numbers, xattrs; allocated blocks over the whole tree within 10 %), the
//! daemon must have quarantined nothing and logged no lost base, and after `tierstack
//! umount` BACKING must equal both.
//!
//! With kills (`TIERSTACK_CHURN_KILLS=K`), the daemon gets `kill -9` at K random moments;
//! after each, the buffer is mounted again (the drain resumes), every file fsync'd since its
//! last change must hold what was fsync'd (sync mode), and the plain folder is re-based on
//! what the mount shows.
//!
//! `make test` runs a short round; `make churn` (TIERSTACK_CHURN_OPS, _KILLS, _SEED,
//! _WORKERS) runs the long one. A failure names the seed: `TIERSTACK_CHURN_SEED=S` replays it.
//! The tests need root and /dev/fuse; elsewhere they print why and pass.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{detach, is_mounted, ok, root_with_fuse, s, ts};

/// Every operation done, in order per worker ("phase.worker.i: op -> plain / mount"), for
/// the report of a failure: the history of the paths that differ.
static HISTORY: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The inodes (in the plain folder) of the files an operation names, for the history tag
/// ` #ino 12 34`: a file's lines are then found across its renames (until a re-base copies
/// the plain folder).
fn inos(plain: &Path, op: &Op) -> Vec<u64> {
    op.names()
        .into_iter()
        .filter_map(|p| std::fs::symlink_metadata(plain.join(p)).ok())
        .filter(|m| m.is_file())
        .map(|m| m.ino())
        .collect()
}

/// The history tag of inodes `v` (see [`inos`]).
fn ino_tag(mut v: Vec<u64>) -> String {
    v.sort_unstable();
    v.dedup();
    if v.is_empty() {
        return String::new();
    }
    let s: Vec<String> = v.iter().map(u64::to_string).collect();
    format!(" #ino {}", s.join(" "))
}

/// The lines of HISTORY that name `path` or its inode in `a` (the plain folder) (the 40
/// last), and where two files first differ.
fn history_of(path: &str, a: &Path, b: &Path) -> String {
    let h = HISTORY.lock().map(|h| h.clone()).unwrap_or_default();
    let ino = std::fs::symlink_metadata(a.join(path))
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.ino().to_string());
    let mut lines: Vec<String> = h
        .into_iter()
        .filter(|l| {
            let (text, tag) = l.split_once(" #ino ").unwrap_or((l, ""));
            text.split([' ', '"', ',', '(', ')']).any(|w| w == path)
                || ino
                    .as_deref()
                    .is_some_and(|i| tag.split(' ').any(|w| w == i))
        })
        .collect();
    let n = lines.len();
    if n > 40 {
        lines.drain(..n - 40);
    }
    let (x, y) = (std::fs::read(a.join(path)), std::fs::read(b.join(path)));
    let first = match (x, y) {
        (Ok(x), Ok(y)) => {
            let at = x.iter().zip(&y).position(|(p, q)| p != q);
            let end = at.map(|at| {
                (at..x.len().min(y.len()))
                    .find(|&i| x[i] == y[i])
                    .unwrap_or(x.len().min(y.len()))
            });
            let zeros = |v: &[u8], at: usize, e: usize| v[at..e].iter().all(|&c| c == 0);
            match (at, end) {
                (Some(at), Some(e)) => format!(
                    "first difference at {at}..{e} (zeros: {} / {})",
                    zeros(&x, at, e),
                    zeros(&y, at, e)
                ),
                _ => "same bytes".into(),
            }
        }
        _ => "unreadable".into(),
    };
    format!("{path}: {first}\n  {}", lines.join("\n  "))
}

/// Panics with `what` and the differences between two trees (under `a` and `b`), with the
/// history of the first three paths that differ; nothing when they are the same.
fn assert_same_trees(
    t: (&BTreeMap<String, Ent>, &BTreeMap<String, Ent>),
    names: (&str, &str),
    roots: (&Path, &Path),
    what: &str,
) {
    let d = diff(t.0, t.1, names.0, names.1);
    assert!(
        d.is_empty(),
        "{what}:\n{}\n{}",
        d.join("\n"),
        d.iter()
            .take(3)
            .filter_map(|l| l.split(':').next())
            .map(|p| history_of(p, roots.0, roots.1))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// xorshift64*: reproducible from a seed, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(len);
        v
    }
}

/// The outcome of one system call: Ok, or its errno.
type Res = Result<u64, i32>;

fn cs(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn check(r: i64) -> Res {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as u64)
    }
}

/// Opens `p` with `flags`, runs `f` on the descriptor and closes it.
/// A FIFO is opened without blocking (no reader or writer waits), and a device node is not
/// opened at all (a FUSE mount is `nodev`; the plain folder is not): both sides answer
/// ENODEV for it.
fn with_fd(p: &Path, flags: i32, f: impl FnOnce(i32) -> Res) -> Res {
    let device =
        |m: std::fs::Metadata| m.file_type().is_char_device() || m.file_type().is_block_device();
    // Also through a symlink.
    if std::fs::symlink_metadata(p).is_ok_and(device) || std::fs::metadata(p).is_ok_and(device) {
        return Err(libc::ENODEV);
    }
    let flags = flags | libc::O_NONBLOCK;
    let c = cs(p);
    // SAFETY: open(2) of a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
    if fd < 0 {
        return Err(errno());
    }
    let r = f(fd);
    // SAFETY: closing the descriptor opened above.
    let cr = unsafe { libc::close(fd) };
    match r {
        Ok(v) if cr < 0 => Err(errno()).or(Ok(v)),
        r => r,
    }
}

fn pwrite_all(fd: i32, data: &[u8], off: u64) -> Res {
    let mut done = 0usize;
    while done < data.len() {
        // SAFETY: writes from a live slice.
        let n = unsafe {
            libc::pwrite(
                fd,
                data[done..].as_ptr().cast(),
                data.len() - done,
                (off + done as u64) as i64,
            )
        };
        if n < 0 {
            return Err(errno());
        }
        if n == 0 {
            return Err(libc::EIO);
        }
        done += n as usize;
    }
    Ok(done as u64)
}

/// A page-aligned buffer for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    fn new(data: &[u8]) -> Aligned {
        let layout =
            std::alloc::Layout::from_size_align(data.len().max(4096), 4096).expect("layout");
        // SAFETY: a non-zero-sized layout; the buffer is freed in Drop with the same layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "alloc");
        // SAFETY: ptr holds at least data.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
        Aligned {
            ptr,
            len: data.len(),
        }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(4096), 4096).expect("layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// One operation, fully chosen (paths relative to the worker's side root, data included),
/// so that it can be applied identically to the plain folder and to the mount.
#[derive(Debug, Clone)]
enum Op {
    Create(String, Vec<u8>),
    Mkdir(String),
    Rename(String, String),
    Link(String, String),
    Symlink(String, String),
    Mknod(String, u32, u64),
    Unlink(String),
    Rmdir(String),
    Truncate(String, u64),
    Write(String, u64, Vec<u8>),
    Direct(String, u64, Vec<u8>),
    Mmap(String, u64, Vec<u8>),
    Fsync(String),
    Fallocate(String, i32, u64, u64),
    SetXattr(String, String, Vec<u8>),
    RemoveXattr(String, String),
    Chmod(String, u32),
    Read(String),
}

impl Op {
    /// Every path the op names.
    fn names(&self) -> Vec<&str> {
        match self {
            Op::Rename(a, b) | Op::Link(a, b) => vec![a, b],
            Op::Symlink(p, _) | Op::SetXattr(p, ..) | Op::RemoveXattr(p, _) => vec![p],
            Op::Fsync(p) | Op::Read(p) => vec![p],
            _ => self.touches(),
        }
    }

    /// The paths whose contents or existence the op may change (for the fsync oracle).
    fn touches(&self) -> Vec<&str> {
        match self {
            Op::Rename(a, b) | Op::Link(a, b) => vec![a, b],
            Op::Create(p, _)
            | Op::Mkdir(p)
            | Op::Symlink(p, _)
            | Op::Mknod(p, ..)
            | Op::Unlink(p)
            | Op::Rmdir(p)
            | Op::Truncate(p, _)
            | Op::Write(p, ..)
            | Op::Direct(p, ..)
            | Op::Mmap(p, ..)
            | Op::Fallocate(p, ..)
            | Op::Chmod(p, _) => vec![p],
            Op::Fsync(_) | Op::SetXattr(..) | Op::RemoveXattr(..) | Op::Read(_) => vec![],
        }
    }
}

/// Applies `op` under `root`; what it returns (for reads, a hash of the bytes read).
fn apply(root: &Path, op: &Op) -> Res {
    let p = |r: &str| root.join(r);
    match op {
        Op::Create(r, data) => with_fd(
            &p(r),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            |fd| pwrite_all(fd, data, 0),
        ),
        Op::Mkdir(r) => {
            let c = cs(&p(r));
            // SAFETY: mkdir(2) of a NUL-terminated path.
            check(unsafe { libc::mkdir(c.as_ptr(), 0o755) } as i64)
        }
        Op::Rename(a, b) => {
            let (ca, cb) = (cs(&p(a)), cs(&p(b)));
            // SAFETY: rename(2) of NUL-terminated paths.
            check(unsafe { libc::rename(ca.as_ptr(), cb.as_ptr()) } as i64)
        }
        Op::Link(a, b) => {
            let (ca, cb) = (cs(&p(a)), cs(&p(b)));
            // SAFETY: link(2) of NUL-terminated paths.
            check(unsafe { libc::link(ca.as_ptr(), cb.as_ptr()) } as i64)
        }
        Op::Symlink(r, target) => {
            let (c, t) = (cs(&p(r)), CString::new(target.as_bytes()).expect("target"));
            // SAFETY: symlink(2) of NUL-terminated strings.
            check(unsafe { libc::symlink(t.as_ptr(), c.as_ptr()) } as i64)
        }
        Op::Mknod(r, mode, dev) => {
            let c = cs(&p(r));
            // SAFETY: mknod(2) of a NUL-terminated path.
            check(unsafe { libc::mknod(c.as_ptr(), *mode, *dev) } as i64)
        }
        Op::Unlink(r) => {
            let c = cs(&p(r));
            // SAFETY: unlink(2) of a NUL-terminated path.
            check(unsafe { libc::unlink(c.as_ptr()) } as i64)
        }
        Op::Rmdir(r) => {
            let c = cs(&p(r));
            // SAFETY: rmdir(2) of a NUL-terminated path.
            check(unsafe { libc::rmdir(c.as_ptr()) } as i64)
        }
        Op::Truncate(r, len) => {
            let c = cs(&p(r));
            // SAFETY: truncate(2) of a NUL-terminated path.
            check(unsafe { libc::truncate(c.as_ptr(), *len as i64) } as i64)
        }
        Op::Write(r, off, data) => with_fd(&p(r), libc::O_WRONLY | libc::O_NOFOLLOW, |fd| {
            pwrite_all(fd, data, *off)
        }),
        Op::Direct(r, off, data) => {
            let buf = Aligned::new(data);
            with_fd(
                &p(r),
                libc::O_WRONLY | libc::O_DIRECT | libc::O_NOFOLLOW,
                |fd| {
                    // SAFETY: the aligned buffer holds buf.len bytes.
                    let slice = unsafe { std::slice::from_raw_parts(buf.ptr, buf.len) };
                    pwrite_all(fd, slice, *off)
                },
            )
        }
        Op::Mmap(r, off, data) => with_fd(&p(r), libc::O_RDWR | libc::O_NOFOLLOW, |fd| {
            // SAFETY: fstat into a zeroed struct.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat of an open descriptor.
            check(unsafe { libc::fstat(fd, &mut st) } as i64)?;
            let size = st.st_size as u64;
            if st.st_mode & libc::S_IFMT != libc::S_IFREG || size == 0 {
                return Ok(0);
            }
            // Writes inside the file's size only (a mapping cannot grow it).
            let start = *off % size;
            let len = (data.len() as u64).min(size - start) as usize;
            let base = start & !4095;
            let maplen = (start - base) as usize + len;
            // SAFETY: a shared mapping of a range of the open file, unmapped below.
            let m = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    maplen,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    base as i64,
                )
            };
            if m == libc::MAP_FAILED {
                return Err(errno());
            }
            // SAFETY: the range lies inside the mapping and the file.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    (m as *mut u8).add((start - base) as usize),
                    len,
                );
                libc::msync(m, maplen, libc::MS_SYNC);
                libc::munmap(m, maplen);
            }
            Ok(len as u64)
        }),
        Op::Fsync(r) => with_fd(&p(r), libc::O_RDONLY | libc::O_NOFOLLOW, |fd| {
            // SAFETY: fsync of an open descriptor.
            check(unsafe { libc::fsync(fd) } as i64)
        }),
        Op::Fallocate(r, mode, off, len) => {
            with_fd(&p(r), libc::O_WRONLY | libc::O_NOFOLLOW, |fd| {
                // SAFETY: fallocate of an open descriptor.
                check(unsafe { libc::fallocate(fd, *mode, *off as i64, *len as i64) } as i64)
            })
        }
        Op::SetXattr(r, k, v) => {
            let (c, kc) = (cs(&p(r)), CString::new(k.as_bytes()).expect("name"));
            // SAFETY: lsetxattr of NUL-terminated strings and a live value.
            check(
                unsafe { libc::lsetxattr(c.as_ptr(), kc.as_ptr(), v.as_ptr().cast(), v.len(), 0) }
                    as i64,
            )
        }
        Op::RemoveXattr(r, k) => {
            let (c, kc) = (cs(&p(r)), CString::new(k.as_bytes()).expect("name"));
            // SAFETY: lremovexattr of NUL-terminated strings.
            check(unsafe { libc::lremovexattr(c.as_ptr(), kc.as_ptr()) } as i64)
        }
        Op::Chmod(r, mode) => {
            let c = cs(&p(r));
            // SAFETY: chmod(2) of a NUL-terminated path.
            check(unsafe { libc::chmod(c.as_ptr(), *mode) } as i64)
        }
        Op::Read(r) => with_fd(
            &p(r),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            |fd| {
                let mut h = 0xcbf2_9ce4_8422_2325u64;
                let mut buf = vec![0u8; 1 << 20];
                let mut off = 0u64;
                // Up to 16 MiB: enough to see a wrong byte, bounded for sparse giants.
                while off < 16 << 20 {
                    // SAFETY: reads into a live buffer.
                    let n =
                        unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off as i64) };
                    if n < 0 {
                        return Err(errno());
                    }
                    if n == 0 {
                        break;
                    }
                    h = fnv(h, &buf[..n as usize]);
                    off += n as u64;
                }
                Ok(h ^ off)
            },
        ),
    }
}

fn fnv(mut h: u64, b: &[u8]) -> u64 {
    for x in b {
        h ^= *x as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

const NAMES: u64 = 10;
const MAX_DEPTH: usize = 3;

/// What a worker knows of its subtree: its directories (to build paths in), and the content
/// hash of each file fsync'd since its last change (for the kill oracle).
struct Model {
    root: String,
    dirs: Vec<String>,
    synced: HashMap<String, u64>,
}

impl Model {
    fn new(root: &str) -> Model {
        Model {
            root: root.to_string(),
            dirs: vec![root.to_string()],
            synced: HashMap::new(),
        }
    }

    fn pick_dir(&self, rng: &mut Rng) -> String {
        self.dirs[rng.below(self.dirs.len() as u64) as usize].clone()
    }

    fn pick(&self, rng: &mut Rng) -> String {
        let d = self.pick_dir(rng);
        format!("{d}/n{}", rng.below(NAMES))
    }

    /// Re-reads the directories under the root from the plain folder.
    fn rebase(&mut self, side: &Path) {
        self.dirs.clear();
        self.synced.clear();
        fn walk(base: &Path, rel: &str, out: &mut Vec<String>) {
            out.push(rel.to_string());
            if let Ok(rd) = std::fs::read_dir(base.join(rel)) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        let name = e.file_name().to_string_lossy().into_owned();
                        walk(base, &format!("{rel}/{name}"), out);
                    }
                }
            }
        }
        walk(side, &self.root.clone(), &mut self.dirs);
    }

    /// After `op` succeeded on both sides.
    fn applied(&mut self, op: &Op, reference: &Path) {
        match op {
            Op::Mkdir(p) => self.dirs.push(p.clone()),
            Op::Rmdir(p) => self.dirs.retain(|d| d != p),
            // A directory replaced by the rename is gone; the moved one's subtree moves
            // with it.
            Op::Rename(a, b) if reference.join(b).is_dir() && !reference.join(b).is_symlink() => {
                let under = |d: &str, r: &str| d == r || d.starts_with(&format!("{r}/"));
                self.dirs.retain(|d| d != b);
                for d in self.dirs.iter_mut() {
                    if under(d, a) {
                        *d = format!("{b}{}", &d[a.len()..]);
                    }
                }
            }
            _ => {}
        }
        self.forget(op, reference);
        if let Op::Fsync(p) = op {
            let m = std::fs::symlink_metadata(reference.join(p));
            if m.is_ok_and(|m| m.is_file() && m.nlink() == 1) {
                if let Ok(h) = apply(reference, &Op::Read(p.clone())) {
                    self.synced.insert(p.clone(), h);
                }
            }
        }
    }

    /// Whatever `op` touched (and everything under a touched directory) is no longer known
    /// to be synced; a write through another hard link or a symlink changes a synced path
    /// too. Also for an op that a kill may have cut short.
    fn forget(&mut self, op: &Op, reference: &Path) {
        let touched = op.touches();
        if !touched.is_empty() {
            let (nlink, symlink) = touched.iter().fold((1, false), |(n, l), t| {
                match std::fs::symlink_metadata(reference.join(t)) {
                    Ok(m) => (n.max(m.nlink()), l || m.file_type().is_symlink()),
                    Err(_) => (n, l),
                }
            });
            if nlink > 1 || symlink || matches!(op, Op::Rename(..) | Op::Link(..)) {
                self.synced.clear();
            } else {
                self.synced.retain(|k, _| {
                    !touched
                        .iter()
                        .any(|t| k == t || k.starts_with(&format!("{t}/")))
                });
            }
        }
    }
}

/// The next operation of a worker, with its weights.
fn choose(rng: &mut Rng, m: &Model) -> Op {
    let depth = |p: &str| p.matches('/').count();
    let w: [(u64, u8); 18] = [
        (10, 0), // create
        (5, 1),  // mkdir
        (8, 2),  // rename
        (4, 3),  // link
        (3, 4),  // symlink
        (3, 5),  // mknod
        (6, 6),  // unlink
        (3, 7),  // rmdir
        (4, 8),  // truncate
        (10, 9), // write
        (3, 10), // direct write
        (3, 11), // mmap write
        (3, 12), // fsync
        (5, 13), // fallocate
        (3, 14), // set xattr
        (2, 15), // remove xattr
        (2, 16), // chmod
        (5, 17), // read
    ];
    let total: u64 = w.iter().map(|x| x.0).sum();
    let mut r = rng.below(total);
    let mut k = 0;
    for (wt, kind) in w {
        if r < wt {
            k = kind;
            break;
        }
        r -= wt;
    }
    let p = m.pick(rng);
    // Offsets mostly near the start, sometimes far out (sparse giants).
    let off = |rng: &mut Rng| -> u64 {
        match rng.below(8) {
            0 => rng.below(256 << 20),
            1..=2 => rng.below(64 << 20),
            _ => rng.below(4 << 20),
        }
    };
    match k {
        0 => {
            let len = rng.below(192 << 10) as usize;
            Op::Create(p, rng.bytes(len))
        }
        1 if depth(&p) <= MAX_DEPTH => Op::Mkdir(p),
        1 => Op::Mkdir(m.pick(rng)),
        2 => {
            // Sometimes a directory moves: src from the known directories.
            let src = if rng.chance(4) && m.dirs.len() > 1 {
                m.dirs[1 + rng.below(m.dirs.len() as u64 - 1) as usize].clone()
            } else {
                p
            };
            Op::Rename(src, m.pick(rng))
        }
        3 => Op::Link(p, m.pick(rng)),
        4 => Op::Symlink(p, format!("n{}", rng.below(NAMES))),
        5 => {
            let (mode, dev) = match rng.below(4) {
                0 => (libc::S_IFIFO | 0o644, 0),
                1 => (libc::S_IFCHR | 0o600, libc::makedev(1, 3)),
                2 => (libc::S_IFBLK | 0o600, libc::makedev(7, 200)),
                _ => (libc::S_IFSOCK | 0o644, 0),
            };
            Op::Mknod(p, mode, dev)
        }
        6 => Op::Unlink(p),
        // Never the worker's own root.
        7 if m.dirs.len() > 1 => {
            Op::Rmdir(m.dirs[1 + rng.below(m.dirs.len() as u64 - 1) as usize].clone())
        }
        7 => Op::Rmdir(p),
        8 => {
            let len = if rng.chance(6) {
                rng.below(256 << 20)
            } else {
                rng.below(4 << 20)
            };
            Op::Truncate(p, len)
        }
        9 => {
            let o = off(rng);
            let len = 1 + rng.below(128 << 10) as usize;
            Op::Write(p, o, rng.bytes(len))
        }
        10 => {
            let o = off(rng) & !4095;
            let len = 4096 * (1 + rng.below(16)) as usize;
            Op::Direct(p, o, rng.bytes(len))
        }
        11 => {
            let o = rng.below(8 << 20);
            let len = 1 + rng.below(64 << 10) as usize;
            Op::Mmap(p, o, rng.bytes(len))
        }
        12 => Op::Fsync(p),
        13 => {
            let mode = match rng.below(4) {
                0 => 0,
                1 => libc::FALLOC_FL_KEEP_SIZE,
                2 => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                _ => libc::FALLOC_FL_ZERO_RANGE,
            };
            let o = off(rng);
            let len = 1 + rng.below(8 << 20);
            Op::Fallocate(p, mode, o, len)
        }
        14 => {
            let len = rng.below(64) as usize;
            Op::SetXattr(p, format!("user.k{}", rng.below(3)), rng.bytes(len))
        }
        15 => Op::RemoveXattr(p, format!("user.k{}", rng.below(3))),
        16 => Op::Chmod(p, [0o644, 0o600, 0o755, 0o640][rng.below(4) as usize]),
        _ => Op::Read(p),
    }
}

/// One entry of a tree as the comparison sees it.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Ent {
    kind: char,
    mode: u32,
    size: u64,
    hash: u64,
    nlink: u64,
    rdev: u64,
    target: String,
    xattrs: BTreeMap<String, Vec<u8>>,
}

fn xattrs_of(p: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let c = cs(p);
    let mut names = vec![0u8; 4096];
    // SAFETY: llistxattr into a live buffer.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return out;
    }
    for name in names[..n as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
    {
        if !name.starts_with(b"user.") {
            continue;
        }
        let kc = CString::new(name).expect("name");
        let mut v = vec![0u8; 65536];
        // SAFETY: lgetxattr into a live buffer.
        let k = unsafe { libc::lgetxattr(c.as_ptr(), kc.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        if k >= 0 {
            v.truncate(k as usize);
            out.insert(String::from_utf8_lossy(name).into_owned(), v);
        }
    }
    out
}

fn file_hash(p: &Path) -> u64 {
    use std::io::Read;
    let Ok(mut f) = std::fs::File::open(p) else {
        return 0;
    };
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf) {
            Ok(0) | Err(_) => return h,
            Ok(n) => h = fnv(h, &buf[..n]),
        }
    }
}

/// Every entry under `root` (relative paths), and the blocks allocated to regular files.
fn tree(root: &Path) -> (BTreeMap<String, Ent>, u64) {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Ent>, blocks: &mut u64) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p
                .strip_prefix(root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let t = m.file_type();
            let kind = if t.is_dir() {
                'd'
            } else if t.is_file() {
                'f'
            } else if t.is_symlink() {
                'l'
            } else if t.is_fifo() {
                'p'
            } else if t.is_char_device() {
                'c'
            } else if t.is_block_device() {
                'b'
            } else {
                's'
            };
            if kind == 'f' {
                *blocks += m.blocks();
            }
            out.insert(
                rel,
                Ent {
                    kind,
                    mode: if kind == 'l' { 0 } else { m.mode() & 0o7777 },
                    size: if kind == 'f' || kind == 'l' {
                        m.size()
                    } else {
                        0
                    },
                    hash: if kind == 'f' { file_hash(&p) } else { 0 },
                    nlink: if kind == 'd' { 0 } else { m.nlink() },
                    rdev: if kind == 'c' || kind == 'b' {
                        m.rdev()
                    } else {
                        0
                    },
                    target: if kind == 'l' {
                        std::fs::read_link(&p)
                            .map(|t| t.to_string_lossy().into_owned())
                            .unwrap_or_default()
                    } else {
                        String::new()
                    },
                    xattrs: if kind == 'l' {
                        BTreeMap::new()
                    } else {
                        xattrs_of(&p)
                    },
                },
            );
            if kind == 'd' {
                walk(root, &p, out, blocks);
            }
        }
    }
    let mut out = BTreeMap::new();
    let mut blocks = 0;
    walk(root, root, &mut out, &mut blocks);
    (out, blocks)
}

/// The differences between two trees, at most 20 lines.
fn diff(a: &BTreeMap<String, Ent>, b: &BTreeMap<String, Ent>, an: &str, bn: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in a {
        match b.get(k) {
            None => out.push(format!("{k}: only in {an} ({v:?})")),
            Some(w) if w != v => out.push(format!("{k}: {an} {v:?} != {bn} {w:?}")),
            _ => {}
        }
    }
    for (k, v) in b {
        if !a.contains_key(k) {
            out.push(format!("{k}: only in {bn} ({v:?})"));
        }
    }
    out.truncate(20);
    out
}

fn blocks_close(a: u64, b: u64) -> bool {
    let (lo, hi) = (a.min(b), a.max(b));
    // Within 10 %, and a few MiB of slack for trees that hold almost nothing.
    hi - lo <= hi / 10 + 8192
}

/// A backing directory, a mountpoint, a fast tier folder, the plain folder and a runtime
/// folder under one temporary directory; on drop the mount is detached and its daemon killed.
struct Bed {
    /// The temporary directory, owned by this bed (None: a bed made by the parent process
    /// of a client round, [`Bed::at`]).
    _tmp: Option<tempfile::TempDir>,
    root: PathBuf,
    backing: PathBuf,
    mnt: PathBuf,
    fast: PathBuf,
    plain: PathBuf,
    run: PathBuf,
    pid: Option<u32>,
}

impl Bed {
    fn new() -> Bed {
        let tmp = tempfile::Builder::new()
            .prefix("ts-churn-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let d = |n: &str| {
            let p = tmp.path().join(n);
            std::fs::create_dir(&p).expect("mkdir");
            p
        };
        let (backing, mnt, plain, run) = (d("backing"), d("mnt"), d("plain"), d("run"));
        // SAFETY: setenv before any thread of this test reads the environment; the tests of
        // this file run one at a time (serial()).
        std::env::set_var("TIERSTACK_RUN_DIR", &run);
        Bed {
            fast: tmp.path().join("fast"),
            root: tmp.path().to_path_buf(),
            _tmp: Some(tmp),
            backing,
            mnt,
            plain,
            run,
            pid: None,
        }
    }

    /// The bed another process made under `root` and mounted (the parent of a client
    /// round); its daemon's pid from `status`.
    fn at(root: &Path) -> Bed {
        let run = root.join("run");
        // SAFETY: setenv before any thread of this test reads the environment.
        std::env::set_var("TIERSTACK_RUN_DIR", &run);
        let mut b = Bed {
            _tmp: None,
            root: root.to_path_buf(),
            backing: root.join("backing"),
            mnt: root.join("mnt"),
            fast: root.join("fast"),
            plain: root.join("plain"),
            run,
            pid: None,
        };
        b.pid = Some(b.status()["pid"].as_u64().expect("pid") as u32);
        b
    }

    fn mount(&mut self) {
        ok(&[
            "mount",
            s(&self.backing),
            s(&self.mnt),
            "--dir",
            s(&self.fast),
            "--drive-size",
            "512M",
        ]);
        self.pid = Some(self.status()["pid"].as_u64().expect("pid") as u32);
    }

    fn status(&self) -> serde_json::Value {
        serde_json::from_str(&ok(&["status", s(&self.mnt), "--json"])).expect("status json")
    }

    /// The daemon's log so far.
    fn log(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(&self.run).into_iter().flatten().flatten() {
            if e.path().extension().is_some_and(|x| x == "log") {
                out.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
        out
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        detach(&self.mnt, self.pid);
        std::env::remove_var("TIERSTACK_RUN_DIR");
        // TIERSTACK_CHURN_KEEP=1: a failed round's folders (BACKING, plain folder, fast
        // tier with its database, daemon logs) stay for a post-mortem.
        if std::thread::panicking() && std::env::var_os("TIERSTACK_CHURN_KEEP").is_some() {
            if let Some(tmp) = self._tmp.take() {
                let _ = tmp.keep();
            }
            eprintln!("churn: kept {}", self.root.display());
        }
    }
}

fn env_u64(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// A worker's record of the first disagreement.
type Failure = Arc<Mutex<Option<String>>>;

/// Runs `ops` operations on each of `workers` workers (plus the shared subtree) against the
/// plain folder and the mount; stops early when `killed` is set (a kill came: outcomes after
/// it are not compared). The first disagreement goes to `fail`.
#[allow(clippy::too_many_arguments)]
fn run_phase(
    bed: &Bed,
    models: &mut [Model],
    shared: &Arc<Mutex<Model>>,
    seed: u64,
    phase: u64,
    ops: u64,
    killed: &Arc<AtomicBool>,
    fail: &Failure,
) {
    std::thread::scope(|sc| {
        for (w, m) in models.iter_mut().enumerate() {
            let (plain, mnt) = (bed.plain.clone(), bed.mnt.clone());
            let killed = killed.clone();
            let fail = fail.clone();
            let shared = shared.clone();
            sc.spawn(move || {
                let mut rng = Rng::new(seed ^ ((w as u64 + 1) << 40) ^ (phase << 20));
                for i in 0..ops {
                    if killed.load(Relaxed) || fail.lock().expect("lock").is_some() {
                        return;
                    }
                    let in_shared = rng.chance(5);
                    let mut guard = if in_shared {
                        Some(shared.lock().expect("lock"))
                    } else {
                        None
                    };
                    let model: &mut Model = match guard.as_deref_mut() {
                        Some(sm) => sm,
                        None => &mut *m,
                    };
                    let op = choose(&mut rng, model);
                    let mut touched = inos(&plain, &op);
                    let want = apply(&plain, &op);
                    let got = apply(&mnt, &op);
                    touched.extend(inos(&plain, &op));
                    if let Ok(mut h) = HISTORY.lock() {
                        h.push(format!(
                            "{phase}.{w}.{i}: {} -> {want:?} / {got:?}{}",
                            describe(&op),
                            ino_tag(touched)
                        ));
                    }
                    if let Ok(t) = std::env::var("TIERSTACK_CHURN_TRACE") {
                        if describe(&op).contains(&t) {
                            eprintln!("trace: worker {w} op {i}: {} -> {want:?} / {got:?}", describe(&op));
                        }
                    }
                    if killed.load(Relaxed) {
                        // Done on the mount or not: nothing it touched is known to be synced.
                        model.forget(&op, &plain);
                        return;
                    }
                    let same = match (&want, &got) {
                        (Ok(a), Ok(b)) => a == b || !matches!(op, Op::Read(_)),
                        (Err(a), Err(b)) => a == b,
                        _ => false,
                    };
                    if !same {
                        *fail.lock().expect("lock") = Some(format!(
                            "seed {seed} phase {phase} worker {w} op {i}: {} -> plain {want:?}, mount {got:?}",
                            describe(&op)
                        ));
                        return;
                    }
                    if want.is_ok() {
                        model.applied(&op, &plain);
                    }
                }
            });
        }
    });
}

fn describe(op: &Op) -> String {
    match op {
        Op::Create(p, d) => format!("create {p} ({} bytes)", d.len()),
        Op::Write(p, o, d) => format!("write {p} at {o} ({} bytes)", d.len()),
        Op::Direct(p, o, d) => format!("direct write {p} at {o} ({} bytes)", d.len()),
        Op::Mmap(p, o, d) => format!("mmap write {p} at {o} ({} bytes)", d.len()),
        Op::SetXattr(p, k, v) => format!("setxattr {p} {k} ({} bytes)", v.len()),
        other => format!("{other:?}"),
    }
}

/// The whole churn: `TIERSTACK_CHURN_*` or the given defaults.
fn churn(default_ops: u64, default_kills: u64) {
    if !root_with_fuse() {
        return;
    }
    let seed = env_u64(
        "TIERSTACK_CHURN_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    );
    let ops = env_u64("TIERSTACK_CHURN_OPS", default_ops);
    let kills = env_u64("TIERSTACK_CHURN_KILLS", default_kills);
    let workers = env_u64("TIERSTACK_CHURN_WORKERS", 4).max(1) as usize;
    // A client round's child (see `churn_under_the_interception_client`): the bed is the
    // parent's, mounted, and this process runs with the client preloaded.
    let child = std::env::var_os(CHILD_BED).map(PathBuf::from);
    eprintln!(
        "churn: seed {seed}, {workers} workers, {ops} operations in all, {kills} kill(s){}",
        if child.is_some() {
            ", under the interception client"
        } else {
            ""
        }
    );
    let mut bed = match &child {
        Some(root) => Bed::at(root),
        None => {
            let mut b = Bed::new();
            b.mount();
            b
        }
    };
    let mut models: Vec<Model> = (0..workers).map(|w| Model::new(&format!("p{w}"))).collect();
    for m in &models {
        for side in [&bed.plain, &bed.mnt] {
            std::fs::create_dir(side.join(&m.root)).expect("mkdir worker root");
        }
    }
    for side in [&bed.plain, &bed.mnt] {
        std::fs::create_dir(side.join("s")).expect("mkdir shared root");
    }
    let shared = Arc::new(Mutex::new(Model::new("s")));
    let fail: Failure = Arc::new(Mutex::new(None));
    let per_worker = ops / workers as u64;
    let phases = kills + 1;
    let t0 = Instant::now();
    for phase in 0..phases {
        let killed = Arc::new(AtomicBool::new(false));
        let killer = (phase < kills).then(|| {
            let killed = killed.clone();
            let pid = bed.pid.expect("pid");
            let delay = Duration::from_millis(500 + Rng::new(seed ^ phase).below(4000));
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                killed.store(true, Relaxed);
                // SAFETY: kill(2) of the daemon this test started.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            })
        });
        run_phase(
            &bed,
            &mut models,
            &shared,
            seed,
            phase,
            per_worker / phases,
            &killed,
            &fail,
        );
        if let Some(f) = fail.lock().expect("lock").clone() {
            let log = bed.log();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            panic!(
                "churn: {f}\n(replay with TIERSTACK_CHURN_SEED={seed})\ndaemon log, last lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        let Some(k) = killer else { continue };
        if !killed.load(Relaxed) {
            // The phase ended before the kill: kill now.
            killed.store(true, Relaxed);
            // SAFETY: kill(2) of the daemon this test started.
            unsafe { libc::kill(bed.pid.expect("pid") as i32, libc::SIGKILL) };
        }
        k.join().expect("killer");
        // Wait for the daemon to be gone, then mount the same fast tier again.
        let pid = bed.pid.take().expect("pid");
        let t = Instant::now();
        while tierstack_common::process::alive(pid) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        bed.mount();
        // What was fsync'd (sync mode, the default) is there.
        let mut all: Vec<&Model> = models.iter().collect();
        let sh = shared.lock().expect("lock");
        all.push(&sh);
        for m in all {
            for (p, h) in &m.synced {
                let got = apply(&bed.mnt, &Op::Read(p.clone()));
                assert_eq!(
                    got,
                    Ok(*h),
                    "churn: {p} was fsync'd and unchanged since, but after kill -9 and a new mount it reads otherwise (seed {seed}, phase {phase})"
                );
            }
        }
        drop(sh);
        // A drain never changes what the mount shows.
        let (before, _) = tree(&bed.mnt);
        ok(&["drain", s(&bed.mnt), "--wait", "--timeout", "5m"]);
        let (after, _) = tree(&bed.mnt);
        assert_same_trees(
            (&before, &after),
            ("before the drain", "after"),
            (&bed.plain, &bed.mnt),
            &format!("churn (seed {seed}, phase {phase}): after kill -9 and a new mount, the drain changed what the mount shows"),
        );
        // Re-base the plain folder on what the mount shows.
        if let Ok(mut h) = HISTORY.lock() {
            h.push(format!("{phase}: kill -9, mount again, re-base"));
        }
        std::fs::remove_dir_all(&bed.plain).expect("remove plain");
        let st = Command::new("cp")
            .arg("-a")
            .arg(&bed.mnt)
            .arg(&bed.plain)
            .status()
            .expect("cp");
        assert!(st.success(), "cp -a of the mount failed");
        for m in models.iter_mut() {
            m.rebase(&bed.plain);
        }
        shared.lock().expect("lock").rebase(&bed.plain);
    }
    eprintln!(
        "churn: operations done in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // The mount's view is the plain folder's.
    let (want, want_blocks) = tree(&bed.plain);
    let (view, view_blocks) = tree(&bed.mnt);
    assert_same_trees(
        (&want, &view),
        ("plain", "mount"),
        (&bed.plain, &bed.mnt),
        &format!("churn (seed {seed}): the mount differs from the plain folder"),
    );
    // After a kill -9 the mount counts each page it held as allocated whole (its record of
    // the last writes' extents may be gone), and the re-based plain folder is a `cp -a` of
    // it: then the mount may hold more blocks than the plain folder, never fewer, and
    // BACKING must follow the mount.
    if kills == 0 {
        assert!(
            blocks_close(want_blocks, view_blocks),
            "churn (seed {seed}): the mount holds {view_blocks} blocks, the plain folder {want_blocks}"
        );
    } else {
        assert!(
            view_blocks + 8192 >= want_blocks,
            "churn (seed {seed}): the mount holds {view_blocks} blocks, fewer than the plain folder's {want_blocks}"
        );
    }
    let st = bed.status();
    if child.is_some() {
        // The round went through the client, not only through FUSE: this daemon (the one
        // mounted after the last kill) served at least a call per operation of its phase
        // (its count lags by up to 255 calls while the client is connected).
        let calls = st["io_calls"].as_u64().unwrap_or(0);
        let last_phase = ops / (kills + 1);
        eprintln!("churn: {calls} calls served by the interception client in the last phase");
        assert!(
            calls >= last_phase,
            "churn (seed {seed}): the interception client served {calls} calls for the last phase's {last_phase} operations: the round did not go through it"
        );
    }
    // Unmount (drains everything), then BACKING is the same tree.
    let t1 = Instant::now();
    let o = ts(&["umount", s(&bed.mnt), "--timeout", "10m"]);
    assert!(
        o.status.success(),
        "churn (seed {seed}): umount failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!is_mounted(&bed.mnt));
    eprintln!(
        "churn: umount (drain) took {:.1} s",
        t1.elapsed().as_secs_f64()
    );
    let log = bed.log();
    bed.pid = None;
    assert!(
        st["stuck"].as_array().is_none_or(|a| a.is_empty()),
        "churn (seed {seed}): records quarantined: {}",
        st["stuck"]
    );
    assert!(
        !log.contains("lost its base") && !log.contains("quarantined"),
        "churn (seed {seed}): the daemon's log: {}",
        log.lines()
            .filter(|l| l.contains("lost its base") || l.contains("quarantined"))
            .take(10)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let (back, back_blocks) = tree(&bed.backing);
    assert_same_trees(
        (&want, &back),
        ("plain", "BACKING"),
        (&bed.plain, &bed.backing),
        &format!("churn (seed {seed}): BACKING differs from the plain folder"),
    );
    let (like, like_name) = if kills == 0 {
        (want_blocks, "the plain folder")
    } else {
        (view_blocks, "the mount")
    };
    assert!(
        blocks_close(like, back_blocks),
        "churn (seed {seed}): BACKING holds {back_blocks} blocks, {like_name} {like}"
    );
}

/// The short round of `make test`: 4 workers, 2,400 operations, no kill (the rounds with
/// kill -9 are `make churn`; see issue 35's note for what they still find).
#[test]
fn churn_matches_a_plain_folder_and_drains_exactly() {
    let _g = common::serial();
    churn(2_400, 0);
}

/// The variable that makes a test process the child of a client round: the bed's folder.
const CHILD_BED: &str = "TIERSTACK_CHURN_CLIENT_BED";

/// The churn with every worker's calls on the mount made through the interception client
/// (`tierstack exec MNT -- <this test binary>`), kill -9 of the daemon included: the client
/// must give the plain folder's outcomes, keep what was fsync'd, and come back to the
/// daemon mounted again (its old handles failing, as FUSE descriptors of a dead mount do).
/// 4 workers, 2,000 operations, 2 kills here; `TIERSTACK_CHURN_*` as for the other rounds
/// (`make churn-client` runs a long one).
#[test]
fn churn_under_the_interception_client() {
    let _g = common::serial();
    if std::env::var_os(CHILD_BED).is_some() || !root_with_fuse() {
        return;
    }
    let mut bed = Bed::new();
    bed.mount();
    let exe = std::env::current_exe().expect("the test binary");
    let mut cmd = Command::new(common::BIN);
    cmd.args(["exec", s(&bed.mnt), "--"])
        .arg(&exe)
        .args([
            "--exact",
            "churn_client_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_BED, &bed.root)
        .env("TIERSTACK_RUN_DIR", &bed.run);
    for (k, d) in [
        ("TIERSTACK_CHURN_OPS", "2000"),
        ("TIERSTACK_CHURN_KILLS", "2"),
    ] {
        if std::env::var_os(k).is_none() {
            cmd.env(k, d);
        }
    }
    let st = cmd.status().expect("run the churn under tierstack exec");
    // The child unmounted (or its daemon is gone): nothing of it is left to detach.
    bed.pid = None;
    assert!(
        st.success(),
        "churn under the interception client failed (its output is above)"
    );
}

/// The child of [`churn_under_the_interception_client`] (does nothing in a plain run).
#[test]
fn churn_client_child() {
    if std::env::var_os(CHILD_BED).is_none() {
        return;
    }
    // The client is loaded in this process; the commands it runs (`tierstack mount`,
    // `drain`, `cp -a`) get none, as a user's shell would not give the daemon one.
    std::env::remove_var("LD_PRELOAD");
    churn(2_000, 2);
}

/// The long round (`make churn`): 20,000 operations with kill -9 at five random moments, or
/// what TIERSTACK_CHURN_* say.
#[test]
#[ignore = "long: run with `make churn`"]
fn churn_long_with_kills() {
    let _g = common::serial();
    churn(20_000, 5);
}

/// A mount with file `f` written, its daemon stopped (SIGSTOP): alive, answering nothing.
fn stopped_bed() -> (Bed, i32) {
    let mut bed = Bed::new();
    bed.mount();
    std::fs::write(bed.mnt.join("f"), b"kept").expect("write");
    let pid = bed.pid.expect("pid") as i32;
    // SAFETY: kill(2) of the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    (bed, pid)
}

/// `umount` of a mount whose daemon is alive but cannot answer (stopped with SIGSTOP, as a
/// daemon deep in a long drain looks to a client) waits for it instead of detaching the
/// mount and telling the user to mount it; once the daemon answers, the umount completes
/// and BACKING holds the file.
#[test]
fn umount_waits_for_a_busy_daemon_and_never_detaches_it() {
    let _g = common::serial();
    if !root_with_fuse() {
        return;
    }
    let (mut bed, pid) = stopped_bed();
    let child = Command::new(common::BIN)
        .args(["umount", s(&bed.mnt), "--timeout", "2m"])
        .env("TIERSTACK_RUN_DIR", &bed.run)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("umount");
    std::thread::sleep(Duration::from_secs(3));
    let still_mounted = is_mounted(&bed.mnt);
    // SAFETY: kill(2) of the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let out = child.wait_with_output().expect("wait");
    assert!(still_mounted, "umount detached the mount of a live daemon");
    assert!(
        out.status.success(),
        "umount of a busy daemon failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bed.pid = None;
    assert!(!is_mounted(&bed.mnt));
    assert_eq!(std::fs::read(bed.backing.join("f")).expect("read"), b"kept");
}

/// A request to a daemon that is alive but does not answer in time (here: stopped; in the long
/// churn: starved of CPU while it drained) is reported as a busy daemon, never as "no
/// tierstack mount answers ... mount it with", and leaves the mount as it is.
#[test]
fn a_busy_daemon_is_called_busy_not_unmounted() {
    let _g = common::serial();
    if !root_with_fuse() {
        return;
    }
    let (mut bed, pid) = stopped_bed();
    let out = Command::new(common::BIN)
        .args(["drain", s(&bed.mnt), "--timeout", "2s"])
        .env("TIERSTACK_RUN_DIR", &bed.run)
        .output();
    let still_mounted = is_mounted(&bed.mnt);
    // SAFETY: kill(2) of the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let out = out.expect("drain");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "drain of a stopped daemon succeeded");
    assert!(
        err.contains("alive but did not answer") && !err.contains("mount it with"),
        "{err}"
    );
    assert!(still_mounted, "the mount of a live daemon went away");
    ok(&["umount", s(&bed.mnt), "--timeout", "2m"]);
    bed.pid = None;
    assert_eq!(std::fs::read(bed.backing.join("f")).expect("read"), b"kept");
}

/// As on ext4, removing an entry (unlink, rmdir) or adding a hard link advances the
/// directory's mtime and ctime, and the linked file's ctime for every file type, also while
/// the kernel caches the attributes.
#[test]
fn removing_an_entry_advances_the_directory_times() {
    let _g = common::serial();
    if !root_with_fuse() {
        return;
    }
    let mut bed = Bed::new();
    bed.mount();
    let d = bed.mnt.join("d");
    std::fs::create_dir_all(d.join("sub")).expect("mkdir");
    std::fs::write(d.join("f"), b"x").expect("write");
    let times = || {
        let m = std::fs::metadata(&d).expect("stat");
        (
            m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        )
    };
    for (what, step) in [
        (
            "rmdir",
            Box::new(|| std::fs::remove_dir(d.join("sub"))) as Box<dyn Fn() -> std::io::Result<()>>,
        ),
        (
            "link",
            Box::new(|| std::fs::hard_link(d.join("f"), d.join("g"))),
        ),
        ("unlink", Box::new(|| std::fs::remove_file(d.join("g")))),
    ] {
        let (m0, c0) = times();
        std::thread::sleep(Duration::from_millis(20));
        step().expect(what);
        let (m1, c1) = times();
        assert!(m1 > m0, "{what}: the directory's mtime did not advance");
        assert!(c1 > c0, "{what}: the directory's ctime did not advance");
    }
    // A hard link added to or removed from a FIFO, a socket or a regular file advances that
    // file's ctime (the kernel caches the attributes of special files for the TTL).
    for (name, kind) in [
        ("fifo", libc::S_IFIFO),
        ("sock", libc::S_IFSOCK),
        ("reg", libc::S_IFREG),
    ] {
        let p = d.join(name);
        // SAFETY: mknod(2) with a NUL-terminated path.
        let r = unsafe { libc::mknod(cs(&p).as_ptr(), kind | 0o644, 0) };
        assert_eq!(r, 0, "mknod {name}");
        let ctime = || {
            let m = std::fs::symlink_metadata(&p).expect("stat");
            m.ctime() * 1_000_000_000 + m.ctime_nsec()
        };
        let l = d.join(format!("{name}.l"));
        let c0 = ctime();
        std::thread::sleep(Duration::from_millis(20));
        std::fs::hard_link(&p, &l).expect("link");
        let c1 = ctime();
        assert!(c1 > c0, "{name}: link did not advance its ctime");
        std::thread::sleep(Duration::from_millis(20));
        std::fs::remove_file(&l).expect("unlink");
        assert!(
            ctime() > c1,
            "{name}: unlink of a link did not advance its ctime"
        );
    }
    ok(&["umount", s(&bed.mnt)]);
    bed.pid = None;
}
