//! tierstack-preload: the LD_PRELOAD shim behind `tierstack run`.
//!
//! Interposes the malloc family (`malloc`, `calloc`, `realloc`, `reallocarray`, `free`,
//! `posix_memalign`, `aligned_alloc`, `memalign`, `valloc`, `pvalloc`, `malloc_usable_size`)
//! and anonymous private `mmap` / `munmap` / `mremap`. A request of at least the threshold
//! (`TIERSTACK_THRESHOLD`, default 64 MiB) becomes a region of the process's
//! [`tierstack_mem::Pager`]: its pages live in DRAM up to the process's budget
//! (`TIERSTACK_DRAM`) and in the tiered store (an array of file drives) beyond it. Everything
//! smaller goes to glibc's allocator (`__libc_malloc` and friends), as do requests made by
//! tierstack's own threads (named `ts-*`) and by the shim while it works (a thread-local flag).
//!
//! - The pager and its store start on the first large request. With `TIERSTACK_DIR` the
//!   process makes its own RAID 5 of four sparse file drives in `DIR/<pid>/` and unlinks them
//!   at once (the space is freed when the process ends, even by `kill -9`); with
//!   `TIERSTACK_ARRAY` it opens that array (one process at a time; its paging data from
//!   earlier runs is discarded).
//! - A region is only created when the store can hold all of it (the pager's commit limit):
//!   otherwise the call fails like an allocation failure (NULL / `MAP_FAILED`, errno ENOMEM).
//! - Threads: any thread may allocate and touch regions. A child that calls `exec` starts
//!   afresh with its own budget and store (the environment is inherited). A child made by
//!   `fork` takes the regions over with a pager and an array of its own, reading what the
//!   parent had paged out from a read-only view of the parent's array as of the fork (see
//!   [`fork_prepare`] and [`fork_in_child`]).
//! - `mremap` is declared with its fifth argument (`new_address`), which is only read with
//!   `MREMAP_FIXED` (the x86-64 calling convention makes the variadic call compatible).
//! - Threads made with `pthread_create` (interposed: the new thread registers itself, then
//!   runs the program's start routine) and the thread that makes the first region tell the
//!   pager where the kernel publishes their current CPU, so each of their faults is served by
//!   the fault thread on their own CPU ([`tierstack_mem::register_current_thread`]).
//! - With `TIERSTACK_STATS_DIR` the process writes its counters to `DIR/<pid>.json` at exit;
//!   `tierstack run --stats` prints them.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::Arc;

use libc::{c_int, c_void, off_t, size_t};
use parking_lot::Mutex;
use tierstack_mem::gate::{Gate, Inside};
use tierstack_mem::{MemError, Pager, Region};

extern "C" {
    fn __libc_malloc(n: size_t) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_calloc(n: size_t, s: size_t) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, n: size_t) -> *mut c_void;
    fn __libc_memalign(a: size_t, n: size_t) -> *mut c_void;
    fn __libc_valloc(n: size_t) -> *mut c_void;
    fn __libc_pvalloc(n: size_t) -> *mut c_void;
}

/// Requests of at least this many bytes become regions; 0 until configured (inert shim).
static THRESHOLD: AtomicUsize = AtomicUsize::new(0);
/// 0: not started, 1: running, 2: off (start failed, or a forked child).
static STATE: AtomicU8 = AtomicU8::new(0);
const OFF: u8 = 2;
const RUNNING: u8 = 1;
/// Set in a child made by fork: regions belong to the parent.
static FORKED: AtomicBool = AtomicBool::new(false);

/// Lock-free table of live regions (base, length), so that `free` of an ordinary pointer
/// costs a few loads and no lock.
const SLOTS: usize = 4096;
static BASES: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static LENS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static HIGH: AtomicUsize = AtomicUsize::new(0);

struct Engine {
    pager: Pager,
    regions: Mutex<HashMap<usize, Region>>,
    stats_dir: Option<std::path::PathBuf>,
    /// The process's own paging array (its store's first tier below DRAM).
    array: Arc<tierstack_array::Array>,
    /// Read-only views of the arrays of the processes this one was forked from, as they
    /// were at each fork, newest first (the store reads them after `array`).
    snapshots: Vec<Arc<tierstack_array::Array>>,
    dram: u64,
    page: usize,
    /// Where a forked child makes its own array.
    dir: std::path::PathBuf,
}

static ENGINE: Mutex<Option<Arc<Engine>>> = Mutex::new(None);

thread_local! {
    /// The shim is working on this thread: its own allocations go to glibc.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// The shim's work on regions passes this gate; `fork` closes it (see [`fork_prepare`]).
static GATE: Gate = Gate::new();

/// The shim at work on this thread (allocations go to glibc); the outermost one is inside
/// [`GATE`].
struct Busy {
    prev: bool,
    _inside: Option<Inside<'static>>,
}

impl Busy {
    fn enter() -> Busy {
        let prev = BUSY.with(|b| b.replace(true));
        Busy {
            prev,
            _inside: (!prev).then(|| GATE.enter()),
        }
    }

    /// Busy without passing the gate (the fork handlers, which close it).
    fn outside() -> Busy {
        Busy {
            prev: BUSY.with(|b| b.replace(true)),
            _inside: None,
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let prev = self.prev;
        BUSY.with(|b| b.set(prev));
    }
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Reads a size from the environment without allocating (this runs before the program).
fn env_size(name: &[u8]) -> Option<u64> {
    // SAFETY: `name` is NUL-terminated; getenv returns NULL or a NUL-terminated string that
    // stays valid while the environment is not changed (we copy it out at once).
    let p = unsafe { libc::getenv(name.as_ptr() as *const libc::c_char) };
    if p.is_null() {
        return None;
    }
    // SAFETY: p is a NUL-terminated string (above).
    let s = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
    let mut v: u64 = 0;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((c - b'0') as u64)?;
    }
    Some(v)
}

extern "C" fn configure() {
    if env_size(b"TIERSTACK_DRAM\0").is_none() {
        return;
    }
    let t = env_size(b"TIERSTACK_THRESHOLD\0")
        .unwrap_or(64 << 20)
        .max(16 << 20);
    // Fixed glibc thresholds: blocks of 256 KiB and more are mapped and go back to the system
    // when freed (glibc's sliding threshold would keep freed buffers of up to 32 MiB, and the
    // pager's I/O buffers, in its heaps: resident memory outside the budget).
    // SAFETY: mallopt only sets allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
    THRESHOLD.store(t as usize, SeqCst);
}

#[used]
#[link_section = ".init_array"]
static CONFIGURE: extern "C" fn() = configure;

/// SIGSEGV in a child made by `fork` (one-shot: SA_RESETHAND restores the default, so the
/// faulting access ends the child as before once this returns).
extern "C" fn forked_segv(_sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler of SIGSEGV.
    let addr = unsafe { (*info).si_addr() } as usize;
    if slot_containing(addr).is_some() {
        let msg = b"tierstack: this process was made by fork() and touched memory that its parent's `tierstack run` pages, which this child could not take over (see the message above): exec a new program, use threads, or run the program without tierstack\n";
        // SAFETY: write(2) is async-signal-safe; the buffer is a static byte string.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
        }
    }
}

/// Is this one of tierstack's own threads (pager, array writers)?
fn tierstack_thread() -> bool {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into `name`.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    name.starts_with(b"ts-")
}

fn wants_region(size: usize) -> bool {
    let t = THRESHOLD.load(Relaxed);
    t != 0
        && size >= t
        && STATE.load(Relaxed) != OFF
        && !FORKED.load(Relaxed)
        && !BUSY.with(|b| b.get())
        && !tierstack_thread()
}

/// The folder under which a process makes its own paging array (`DIR/<pid>/`).
fn paging_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("TIERSTACK_DIR")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
}

/// Makes this process's own paging array: RAID 5 of four sparse file drives in
/// `dir/<pid>/`, whose names go at once (nothing is left behind at exit, even by `kill -9`).
fn own_array(dir: &std::path::Path, page: usize) -> Result<tierstack_array::Array, String> {
    let dir = dir.join(std::process::id().to_string());
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let store = env_size(b"TIERSTACK_STORE\0").unwrap_or(64 << 30);
    let made =
        tierstack_mem::setup::create_array(&dir, "", store, tierstack_mem::setup::LEVEL, page);
    for i in 0..tierstack_mem::setup::DRIVES {
        let _ = std::fs::remove_file(dir.join(format!("d{i}")));
    }
    let _ = std::fs::remove_dir(&dir);
    Ok(made.map_err(|e| e.to_string())?.0)
}

fn start() -> Result<Engine, String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let dram = env_size(b"TIERSTACK_DRAM\0").ok_or("TIERSTACK_DRAM is not set")?;
    let page =
        env_size(b"TIERSTACK_PAGE\0").unwrap_or(tierstack_mem::setup::DEFAULT_PAGE as u64) as usize;
    let opts = tierstack_array::ArrayOptions::default();
    let (array, dir) = if let Some(desc) = env("TIERSTACK_ARRAY") {
        let a = tierstack_array::descriptor::open_array(std::path::Path::new(&desc), &opts)
            .map_err(|e| format!("cannot open array {desc}: {e}"))?;
        // Paging data of an earlier run is garbage now.
        for k in a.keys_in(0, tierstack_store::MAX_OBJECT_ID - 1) {
            let _ = a.delete(k);
        }
        // Forked children make theirs beside the array's first drive.
        let dir = paging_dir()
            .or_else(|| {
                a.drive_paths()
                    .first()
                    .and_then(|p| p.parent().map(|d| d.to_path_buf()))
            })
            .unwrap_or_else(std::env::temp_dir);
        (a, dir)
    } else {
        let dir = paging_dir().ok_or("neither TIERSTACK_DIR nor TIERSTACK_ARRAY is set")?;
        (own_array(&dir, page)?, dir)
    };
    let engine = build_engine(Arc::new(array), Vec::new(), dram, page, dir)?;
    // SAFETY: registering plain extern "C" callbacks with no arguments.
    unsafe {
        libc::pthread_atfork(
            Some(fork_prepare),
            Some(fork_in_parent),
            Some(fork_in_child),
        );
        if engine.stats_dir.is_some() {
            libc::atexit(write_stats);
        }
    }
    Ok(engine)
}

/// An engine over `array` (and the snapshots a forked child reads), with the same store and
/// budget rule as `bench mem`'s tierstack engine.
fn build_engine(
    array: Arc<tierstack_array::Array>,
    snapshots: Vec<Arc<tierstack_array::Array>>,
    dram: u64,
    page: usize,
    dir: std::path::PathBuf,
) -> Result<Engine, String> {
    let (store, options) = tierstack_mem::setup::store_over(array.clone(), &snapshots, dram, page)
        .map_err(|e| e.to_string())?;
    let pager = Pager::new(store, &options).map_err(|e| e.to_string())?;
    let stats_dir = std::env::var_os("TIERSTACK_STATS_DIR")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from);
    if let Some(dir) = stats_dir.clone() {
        // Live figures for `tierstack top` and `run --metrics`, about once a second.
        // It runs on the evictor inside one unit of the pager's work, which `fork_prepare`
        // waits for after closing GATE: passing GATE here could deadlock.
        pager.set_reporter(Some(Box::new(move |r| {
            let _b = Busy::outside();
            publish_stats(&dir, r, true);
        })));
    }
    Ok(Engine {
        pager,
        regions: Mutex::new(HashMap::new()),
        stats_dir,
        array,
        snapshots,
        dram,
        page,
        dir,
    })
}

/// Descriptors of the hold made for the fork under way (see [`fork_prepare`]); -1: none.
static HOLD_CHILD: AtomicI32 = AtomicI32::new(-1);
static HOLD_PARENT: AtomicI32 = AtomicI32::new(-1);
/// The engine was quiesced and flushed for the fork under way.
static FORK_READY: AtomicBool = AtomicBool::new(false);

/// Before `fork`: the shim's region work and the pager's threads stop between units of
/// work, the store's write buffer is written to the array and the array's open stripe sealed
/// (so what the drives' files hold is every page not resident; not synced: the child reads
/// the same files), and a hold is made: a file with a shared `flock` on one open file
/// description (the child keeps it, and its own children inherit it) and a second open file
/// description the parent gives the array, whose cleaner then frees no segment until every
/// holder is gone. The child reads the parent's pages from a read-only view of the array
/// made after this point; the parent only appends meanwhile.
extern "C" fn fork_prepare() {
    FORK_READY.store(false, SeqCst);
    if STATE.load(SeqCst) != RUNNING || FORKED.load(SeqCst) {
        return;
    }
    GATE.close();
    let _b = Busy::outside();
    let Some(e) = ENGINE.lock().clone() else {
        return;
    };
    e.pager.pause();
    // The child reads the same files: what they hold must be complete, not durable.
    let settled = e
        .pager
        .store()
        .write_back(u64::MAX)
        .map_err(|e| e.to_string())
        .and_then(|_| e.array.settle().map_err(|e| e.to_string()));
    if let Err(err) = settled {
        eprintln!("tierstack: fork: cannot write the paging store out ({err}); the child will not be able to read paged memory");
        return;
    }
    match make_hold() {
        Ok((child, parent)) => {
            HOLD_CHILD.store(child, SeqCst);
            HOLD_PARENT.store(parent, SeqCst);
            FORK_READY.store(true, SeqCst);
        }
        Err(err) => {
            eprintln!("tierstack: fork: {err}; the child will not be able to read paged memory")
        }
    }
}

/// A memfd with a shared lock on its first open file description, and a second one.
fn make_hold() -> Result<(c_int, c_int), String> {
    // SAFETY: memfd_create takes a NUL-terminated name and flags; flock and open take the
    // descriptors and the path made here.
    unsafe {
        let a = libc::memfd_create(c"tierstack-fork-hold".as_ptr(), libc::MFD_CLOEXEC);
        if a < 0 {
            return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
        }
        if libc::flock(a, libc::LOCK_SH) != 0 {
            let e = std::io::Error::last_os_error();
            libc::close(a);
            return Err(format!("flock: {e}"));
        }
        let path = format!("/proc/self/fd/{a}\0");
        let b = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if b < 0 {
            let e = std::io::Error::last_os_error();
            libc::close(a);
            return Err(format!("cannot reopen the hold through /proc ({e})"));
        }
        Ok((a, b))
    }
}

/// After `fork`, in the parent: the array keeps the child's segments; work resumes.
extern "C" fn fork_in_parent() {
    if STATE.load(SeqCst) != RUNNING || FORKED.load(SeqCst) {
        return;
    }
    let _b = Busy::outside();
    if let Some(e) = ENGINE.lock().clone() {
        let (child, parent) = (HOLD_CHILD.swap(-1, SeqCst), HOLD_PARENT.swap(-1, SeqCst));
        if parent >= 0 {
            use std::os::fd::FromRawFd;
            // SAFETY: `parent` was opened by make_hold for this fork and is owned here.
            e.array
                .hold_segments(unsafe { std::os::fd::OwnedFd::from_raw_fd(parent) });
        }
        if child >= 0 {
            // SAFETY: the child's copy keeps the lock; the parent's descriptor goes.
            unsafe { libc::close(child) };
        }
        e.pager.resume();
    }
    GATE.open();
}

/// After `fork`, in the child: it takes over the parent's regions with a pager of its own.
/// Pages resident at the fork were copied by the kernel; the others are read from a
/// read-only view of the parent's array (kept in place by the hold); what the child writes
/// goes to an array of its own. It gets the same budget (`--dram`) as the parent. Where that
/// cannot be set up, its regions become inaccessible (a touch is a SIGSEGV with a message),
/// never silently zero.
extern "C" fn fork_in_child() {
    GATE.reset();
    if STATE.load(SeqCst) != RUNNING || FORKED.load(SeqCst) {
        return;
    }
    let _b = Busy::outside();
    let parent = HOLD_PARENT.swap(-1, SeqCst);
    if parent >= 0 {
        // SAFETY: the parent's end of the hold is not the child's to keep.
        unsafe { libc::close(parent) };
    }
    // The child's end (shared lock) stays open for the child's life (close-on-exec).
    HOLD_CHILD.store(-1, SeqCst);
    // The parent's engine: its threads do not exist here and its store is the parent's.
    let old = ENGINE.lock().take();
    let Some(old) = old else { return };
    let result = if FORK_READY.load(SeqCst) {
        take_over(&old)
    } else {
        Err("the parent could not prepare its store for the fork".to_string())
    };
    match result {
        Ok(engine) => {
            *ENGINE.lock() = Some(Arc::new(engine));
            tierstack_mem::register_current_thread();
        }
        Err(msg) => {
            eprintln!("tierstack: forked child: cannot take over paged memory ({msg}); it is not accessible in this process");
            fence_regions();
            FORKED.store(true, SeqCst);
            STATE.store(OFF, SeqCst);
        }
    }
    // Never dropped: dropping would unmap the regions and write to the parent's store.
    std::mem::forget(old);
}

fn take_over(old: &Arc<Engine>) -> Result<Engine, String> {
    let view = old
        .array
        .read_only_view()
        .map_err(|e| format!("cannot open the parent's array: {e}"))?;
    let mut snapshots = vec![Arc::new(view)];
    snapshots.extend(old.snapshots.iter().cloned());
    let array = own_array(&old.dir, old.page)?;
    let engine = build_engine(
        Arc::new(array),
        snapshots,
        old.dram,
        old.page,
        old.dir.clone(),
    )?;
    {
        let olds = old.regions.lock();
        let mut news = engine.regions.lock();
        for (&base, r) in olds.iter() {
            let n = engine.pager.adopt(r).map_err(|e| e.to_string())?;
            news.insert(base, n);
        }
    }
    Ok(engine)
}

/// Makes every region inaccessible in a forked child that cannot page them: a touch is a
/// SIGSEGV that says why, never a silent zero.
fn fence_regions() {
    let high = HIGH.load(Acquire);
    for i in 0..high {
        let b = BASES[i].load(Acquire);
        let l = LENS[i].load(Acquire);
        if b == 0 || b == usize::MAX {
            continue;
        }
        // SAFETY: replaces the region's range (ours, registered with the parent's userfaultfd
        // in the parent only) with an inaccessible mapping.
        unsafe {
            libc::syscall(
                libc::SYS_mmap,
                b,
                l,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            );
        }
    }
    // SAFETY: installing a handler for SIGSEGV with a zeroed, then filled, sigaction; the
    // handler only reads atomics and calls async-signal-safe functions.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old);
        // Only where the program has no handler of its own (it inherits that one).
        if old.sa_sigaction == libc::SIG_DFL {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forked_segv as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
        }
    }
}

fn engine() -> Option<Arc<Engine>> {
    let mut g = ENGINE.lock();
    if let Some(e) = g.as_ref() {
        return Some(e.clone());
    }
    if STATE.load(SeqCst) == OFF {
        return None;
    }
    match start() {
        Ok(e) => {
            let e = Arc::new(e);
            *g = Some(e.clone());
            STATE.store(RUNNING, SeqCst);
            Some(e)
        }
        Err(msg) => {
            eprintln!("tierstack: paging is off for this process, large allocations use ordinary memory: {msg}");
            STATE.store(OFF, SeqCst);
            None
        }
    }
}

extern "C" fn write_stats() {
    let _b = Busy::enter();
    let Some(e) = ENGINE.try_lock().and_then(|g| g.clone()) else {
        return;
    };
    let Some(dir) = &e.stats_dir else { return };
    // No live report may land after the final one.
    e.pager.set_reporter(None);
    publish_stats(dir, &e.pager.report(), false);
}

/// Writes this process's pager figures to `DIR/PID.json` (whole: a temporary file renamed
/// into place), `live` while the process runs, not after its exit.
fn publish_stats(dir: &std::path::Path, r: &tierstack_mem::PagerReport, live: bool) {
    let pid = std::process::id();
    let v = serde_json::json!({
        "pid": pid,
        "live": live,
        "budget": r.budget,
        "page": r.page,
        "committed": r.committed,
        "resident": r.resident,
        "stats": r.stats,
    });
    let tmp = dir.join(format!(".{pid}.json.tmp"));
    if std::fs::write(&tmp, v.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, dir.join(format!("{pid}.json")));
    }
}

enum Got {
    Region(*mut c_void),
    /// The store cannot hold it: allocation failure.
    NoMemory,
    /// Paging is off: use ordinary memory.
    Fallback,
}

fn slot_insert(base: usize, len: usize) -> bool {
    for i in 0..SLOTS {
        if BASES[i]
            .compare_exchange(0, usize::MAX, SeqCst, SeqCst)
            .is_ok()
        {
            LENS[i].store(len, SeqCst);
            BASES[i].store(base, SeqCst);
            HIGH.fetch_max(i + 1, SeqCst);
            return true;
        }
    }
    false
}

/// The slot of the region starting at `p`.
fn slot_exact(p: usize) -> Option<usize> {
    let high = HIGH.load(Acquire);
    (0..high).find(|&i| BASES[i].load(Acquire) == p)
}

/// The slot of the region containing `p`.
fn slot_containing(p: usize) -> Option<(usize, usize, usize)> {
    let high = HIGH.load(Acquire);
    (0..high).find_map(|i| {
        let b = BASES[i].load(Acquire);
        let l = LENS[i].load(Acquire);
        (b != 0 && b != usize::MAX && p >= b && p < b + l).then_some((i, b, l))
    })
}

/// A new region of `size` bytes aligned to `align`, at `hint` when that is not 0 and the
/// kernel can place it there.
fn new_region(size: usize, align: usize, hint: usize) -> Got {
    let _b = Busy::enter();
    tierstack_mem::register_current_thread();
    let Some(e) = engine() else {
        return Got::Fallback;
    };
    let made = if hint != 0 {
        e.pager.map_near(size, hint)
    } else {
        e.pager.map(size, align)
    };
    match made {
        Ok(r) => {
            let p = r.as_ptr() as usize;
            if !slot_insert(p, r.len()) {
                return Got::Fallback;
            }
            // Under mlockall(MCL_FUTURE) the new mapping is locked (on fault, see `mlockall`):
            // the pager decides what of it is resident.
            // SAFETY: munlock of the region just made; it changes no contents.
            unsafe { libc::syscall(libc::SYS_munlock, p, r.len()) };
            e.regions.lock().insert(p, r);
            Got::Region(p as *mut c_void)
        }
        Err(MemError::NoSpace { .. }) => Got::NoMemory,
        Err(err) => {
            eprintln!(
                "tierstack: cannot map a region of {size} bytes ({err}); using ordinary memory"
            );
            Got::Fallback
        }
    }
}

/// Frees the region at `p` if it is one. In a forked child, regions belong to the parent and
/// are simply forgotten.
fn free_region(p: usize) -> bool {
    if p & 4095 != 0 {
        return false;
    }
    let Some(i) = slot_exact(p) else {
        return false;
    };
    if FORKED.load(Relaxed) {
        return true;
    }
    let _b = Busy::enter();
    BASES[i].store(0, SeqCst);
    let e = ENGINE.lock().clone();
    if let Some(e) = e {
        let r = e.regions.lock().remove(&p);
        drop(r);
    }
    true
}

fn region_len(p: usize) -> Option<usize> {
    if p & 4095 != 0 {
        return None;
    }
    slot_exact(p).map(|i| LENS[i].load(Acquire))
}

fn alloc(size: usize, align: usize, zero: bool) -> *mut c_void {
    if wants_region(size) {
        match new_region(size, align, 0) {
            Got::Region(p) => return p,
            Got::NoMemory => {
                set_errno(libc::ENOMEM);
                return std::ptr::null_mut();
            }
            Got::Fallback => {}
        }
    }
    // SAFETY: plain calls into glibc's allocator.
    unsafe {
        match (zero, align > 16) {
            (true, _) => __libc_calloc(1, size),
            (false, false) => __libc_malloc(size),
            (false, true) => __libc_memalign(align, size),
        }
    }
}

/// # Safety
/// C `malloc`.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    alloc(size, 16, false)
}

/// # Safety
/// C `calloc`.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the program calls this as C `calloc`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        let Some(total) = n.checked_mul(size) else {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        };
        if wants_region(total) {
            // Regions start as zero pages.
            return alloc(total, 16, false);
        }
        __libc_calloc(n, size)
    }
}

/// # Safety
/// C `free`: `p` is NULL or came from this allocator.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    // SAFETY: the program calls this as C `free`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if p.is_null() || free_region(p as usize) {
            return;
        }
        __libc_free(p)
    }
}

/// # Safety
/// C `realloc`.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    // SAFETY: the program calls this as C `realloc`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if p.is_null() {
            return malloc(size);
        }
        if let Some(len) = region_len(p as usize) {
            if size == 0 {
                free(p);
                return std::ptr::null_mut();
            }
            if size <= len {
                return p;
            }
            let q = malloc(size);
            if q.is_null() {
                return q;
            }
            std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, len);
            free(p);
            return q;
        }
        if wants_region(size) {
            let old = real_usable_size(p);
            match new_region(size, 16, 0) {
                Got::Region(q) => {
                    std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(size));
                    __libc_free(p);
                    return q;
                }
                Got::NoMemory => {
                    set_errno(libc::ENOMEM);
                    return std::ptr::null_mut();
                }
                Got::Fallback => {}
            }
        }
        __libc_realloc(p, size)
    }
}

/// # Safety
/// C `reallocarray`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the program calls this as C `reallocarray`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        match n.checked_mul(size) {
            Some(t) => realloc(p, t),
            None => {
                set_errno(libc::ENOMEM);
                std::ptr::null_mut()
            }
        }
    }
}

/// # Safety
/// C `posix_memalign`: `out` is a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    // SAFETY: the program calls this as C `posix_memalign`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<usize>()) {
            return libc::EINVAL;
        }
        let p = alloc(size, align, false);
        if p.is_null() {
            return libc::ENOMEM;
        }
        *out = p;
        0
    }
}

/// # Safety
/// C `aligned_alloc`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    alloc(size, align, false)
}

/// # Safety
/// C `memalign`.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the program calls this as C `memalign`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe { aligned_alloc(align, size) }
}

/// # Safety
/// C `valloc`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    // SAFETY: the program calls this as C `valloc`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if wants_region(size) {
            return alloc(size, 4096, false);
        }
        __libc_valloc(size)
    }
}

/// # Safety
/// C `pvalloc`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    // SAFETY: the program calls this as C `pvalloc`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if wants_region(size) {
            return alloc(size, 4096, false);
        }
        __libc_pvalloc(size)
    }
}

/// The next definition of `name` after this library's (glibc's), looked up once into `cache`;
/// 0 when there is none.
fn next_symbol(cache: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    let mut f = cache.load(Relaxed);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        cache.store(f, Relaxed);
    }
    f
}

unsafe fn real_usable_size(p: *mut c_void) -> usize {
    // SAFETY: the caller upholds this function's `# Safety` contract, which covers
    // every call and pointer access below.
    unsafe {
        type F = unsafe extern "C" fn(*mut c_void) -> size_t;
        static REAL: AtomicUsize = AtomicUsize::new(0);
        let f = next_symbol(&REAL, c"malloc_usable_size");
        if f == 0 {
            return 0;
        }
        // SAFETY: `f` is glibc's malloc_usable_size, found by dlsym.
        let real: F = std::mem::transmute::<usize, F>(f);
        real(p)
    }
}

/// # Safety
/// C `malloc_usable_size`.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    // SAFETY: the program calls this as C `malloc_usable_size`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if p.is_null() {
            return 0;
        }
        region_len(p as usize).unwrap_or_else(|| real_usable_size(p))
    }
}

fn anonymous_private(addr: *mut c_void, prot: c_int, flags: c_int, fd: c_int) -> bool {
    let odd = libc::MAP_SHARED
        | libc::MAP_FIXED
        | libc::MAP_FIXED_NOREPLACE
        | libc::MAP_HUGETLB
        | libc::MAP_GROWSDOWN
        | libc::MAP_STACK;
    addr.is_null()
        && fd == -1
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & libc::MAP_PRIVATE != 0
        && flags & odd == 0
        && prot == libc::PROT_READ | libc::PROT_WRITE
}

/// # Safety
/// C `mmap`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: the program calls this as C `mmap`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if anonymous_private(addr, prot, flags, fd) && wants_region(len) {
            match new_region(len, 4096, 0) {
                Got::Region(p) => return p,
                Got::NoMemory => {
                    set_errno(libc::ENOMEM);
                    return libc::MAP_FAILED;
                }
                Got::Fallback => {}
            }
        }
        // A reservation (address space the JVM, V8 and other runtimes take inaccessible, then
        // commit piece by piece): a region, inaccessible until parts of it are committed. One
        // the store cannot back stays the kernel's.
        if reservation(prot, flags, fd) && wants_region(len) {
            if let Got::Region(p) = new_region(len, 4096, addr as usize) {
                if let Some(rlen) = region_len(p as usize) {
                    libc::syscall(libc::SYS_mprotect, p, rlen, libc::PROT_NONE);
                }
                return p;
            }
        }
        if flags & libc::MAP_FIXED != 0 && !FORKED.load(Relaxed) {
            if let Some((base, off, olen)) = overlap(addr as usize, len) {
                // A fresh anonymous private mapping inside a region (a runtime commits or
                // uncommits part of its reservation): the range reads as zeros, gets the new
                // protection, and stays paged.
                if olen == len && fresh_anonymous(flags, fd) {
                    commit(addr as usize, base, off, len, prot);
                    return addr;
                }
                // Anything else over part of a region replaces those pages: they stop being
                // the region's (never evicted, never read back) before the kernel maps it.
                let _b = Busy::enter();
                if let Some(e) = ENGINE.lock().clone() {
                    if let Some(r) = e.regions.lock().get(&base) {
                        r.forget(off, olen);
                    }
                }
            }
        }
        libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void
    }
}

/// `mmap` flags of a reservation: private anonymous, inaccessible, not fixed (an address is
/// a hint).
fn reservation(prot: c_int, flags: c_int, fd: c_int) -> bool {
    prot == libc::PROT_NONE && flags & libc::MAP_FIXED == 0 && fresh_anonymous(flags, fd)
}

/// `mmap` flags of a private anonymous mapping with nothing special about it.
fn fresh_anonymous(flags: c_int, fd: c_int) -> bool {
    let odd = libc::MAP_SHARED
        | libc::MAP_FIXED_NOREPLACE
        | libc::MAP_HUGETLB
        | libc::MAP_GROWSDOWN
        | libc::MAP_STACK;
    fd == -1
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & libc::MAP_PRIVATE != 0
        && flags & odd == 0
}

/// `[a, a+len)` (offset `off` of region `base`) becomes a fresh mapping with protection
/// `prot`: zeros, paged as before.
///
/// # Safety
/// The range must lie in the live region `base`.
unsafe fn commit(a: usize, base: usize, off: usize, len: usize, prot: c_int) {
    // SAFETY: the caller upholds this function's `# Safety` contract; the range is ours.
    unsafe {
        zero_range(base, off, len);
        libc::syscall(libc::SYS_mprotect, a, len, prot);
    }
}

/// The part of `[a, a+len)` that lies in a region: (region base, offset, length).
fn overlap(a: usize, len: usize) -> Option<(usize, usize, usize)> {
    let high = HIGH.load(Acquire);
    (0..high).find_map(|i| {
        let b = BASES[i].load(Acquire);
        let l = LENS[i].load(Acquire);
        if b == 0 || b == usize::MAX {
            return None;
        }
        let lo = a.max(b);
        let hi = a.saturating_add(len).min(b + l);
        (lo < hi).then_some((b, lo - b, hi - lo))
    })
}

/// Makes `[off, off+len)` of region `base` read as zeros and leave the store, as
/// `MADV_DONTNEED` does natively: whole tierstack pages are discarded, the bytes of pages only
/// partly in the range are zeroed in place.
///
/// # Safety
/// The range must lie in the live region `base`.
unsafe fn zero_range(base: usize, off: usize, len: usize) {
    // SAFETY: the caller upholds this function's `# Safety` contract, which covers
    // every call and pointer access below.
    unsafe {
        let _b = Busy::enter();
        let Some(e) = ENGINE.lock().clone() else {
            return;
        };
        let page = e.pager.page();
        let first = off.div_ceil(page) * page;
        let end = ((off + len) / page) * page;
        let regions = e.regions.lock();
        let Some(r) = regions.get(&base) else { return };
        // SAFETY (caller): every byte range below lies inside the region's mapping; a page that
        // is not resident is changed in the store, a resident one in place.
        let part = |o: usize, n: usize| {
            if n > 0 && !r.zero_part(o, n) {
                zero_bytes(base + o, n);
            }
        };
        if first < end {
            r.discard(first, end - first);
            part(off, first - off);
            part(end, off + len - end);
        } else {
            // Within one page: its bytes are zeroed.
            part(off, len);
        }
    }
}

/// Writes zeros over `[a, a+len)` of our own memory directly (where the pager could not).
///
/// # Safety
/// The range must lie in a live region the program may write.
unsafe fn zero_bytes(a: usize, len: usize) {
    // SAFETY: the caller's range lies in a live region the program may write.
    unsafe { std::ptr::write_bytes(a as *mut u8, 0, len) }
}

/// # Safety
/// C `madvise`. On a region, `MADV_DONTNEED`, `MADV_FREE` and `MADV_REMOVE` make the range read
/// as zeros (and leave the store); advice that would change how the kernel pages it
/// (huge pages, merging, fork inheritance, ...) is accepted and ignored, since tierstack pages
/// the region; anything else goes to the kernel.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    // SAFETY: the program calls this as C `madvise`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        let a = addr as usize;
        if !FORKED.load(Relaxed) {
            if let Some((base, off, olen)) = overlap(a, len) {
                match advice {
                    libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE => {
                        zero_range(base, off, olen);
                        // The part outside the region (if any) is the kernel's.
                        if off == 0 && a < base {
                            libc::syscall(libc::SYS_madvise, addr, base - a, advice);
                        }
                        return 0;
                    }
                    libc::MADV_NORMAL
                    | libc::MADV_RANDOM
                    | libc::MADV_SEQUENTIAL
                    | libc::MADV_WILLNEED
                    | libc::MADV_HUGEPAGE
                    | libc::MADV_NOHUGEPAGE
                    | libc::MADV_MERGEABLE
                    | libc::MADV_UNMERGEABLE
                    | libc::MADV_DONTFORK
                    | libc::MADV_DOFORK
                    | libc::MADV_DONTDUMP
                    | libc::MADV_DODUMP
                    | libc::MADV_COLD
                    | libc::MADV_PAGEOUT => return 0,
                    _ => {}
                }
            }
        }
        libc::syscall(libc::SYS_madvise, addr, len, advice) as c_int
    }
}

/// # Safety
/// C `mmap64` (the same as `mmap` on 64-bit Linux).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: the program calls this as C `mmap64`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// Applies `lock` (a memory-locking system call on a range) to the parts of `[a, a+len)`
/// outside the region it overlaps: the pager decides what of a region is resident (locking
/// would fault all of it in past the budget, and locked pages could not be released).
fn lock_outside_regions(a: usize, len: usize, lock: impl Fn(usize, usize) -> c_int) -> c_int {
    if FORKED.load(Relaxed) {
        return lock(a, len);
    }
    let Some((base, off, olen)) = overlap(a, len) else {
        return lock(a, len);
    };
    let (lo, hi) = (base + off, base + off + olen);
    let mut rc = 0;
    if a < lo {
        rc |= lock(a, lo - a);
    }
    if hi < a + len {
        rc |= lock(hi, a + len - hi);
    }
    rc
}

/// # Safety
/// C `mlock`: on a region, accepted and left to the pager (see [`lock_outside_regions`]).
#[no_mangle]
pub unsafe extern "C" fn mlock(addr: *const c_void, len: size_t) -> c_int {
    lock_outside_regions(addr as usize, len, |a, n| {
        // SAFETY: mlock of a range of the program's choosing, as it asked.
        unsafe { libc::syscall(libc::SYS_mlock, a, n) as c_int }
    })
}

/// # Safety
/// C `mlock2`: as [`mlock`].
#[no_mangle]
pub unsafe extern "C" fn mlock2(addr: *const c_void, len: size_t, flags: libc::c_uint) -> c_int {
    lock_outside_regions(addr as usize, len, |a, n| {
        // SAFETY: mlock2 of a range of the program's choosing, as it asked.
        unsafe { libc::syscall(libc::SYS_mlock2, a, n, flags) as c_int }
    })
}

/// # Safety
/// C `munlock`.
#[no_mangle]
pub unsafe extern "C" fn munlock(addr: *const c_void, len: size_t) -> c_int {
    lock_outside_regions(addr as usize, len, |a, n| {
        // SAFETY: munlock of a range of the program's choosing, as it asked.
        unsafe { libc::syscall(libc::SYS_munlock, a, n) as c_int }
    })
}

/// # Safety
/// C `mlockall`. Pages are locked as they are faulted in (`MCL_ONFAULT` is added: locking
/// everything at once would fault every region in past the budget), and regions, present and
/// future, are left to the pager.
#[no_mangle]
pub unsafe extern "C" fn mlockall(flags: c_int) -> c_int {
    // SAFETY: mlockall with the program's flags plus MCL_ONFAULT; then munlock of our regions.
    unsafe {
        let onfault = if THRESHOLD.load(Relaxed) != 0 && !FORKED.load(Relaxed) {
            libc::MCL_ONFAULT
        } else {
            0
        };
        let rc = libc::syscall(libc::SYS_mlockall, flags | onfault) as c_int;
        if rc == 0 && onfault != 0 {
            let high = HIGH.load(Acquire);
            for i in 0..high {
                let b = BASES[i].load(Acquire);
                let l = LENS[i].load(Acquire);
                if b != 0 && b != usize::MAX {
                    libc::syscall(libc::SYS_munlock, b, l);
                }
            }
        }
        rc
    }
}

/// # Safety
/// C `munmap`.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    // SAFETY: the program calls this as C `munmap`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        let a = addr as usize;
        if let Some((_, base, rlen)) = slot_containing(a) {
            if FORKED.load(Relaxed) {
                return 0;
            }
            if a == base && len >= rlen {
                free_region(a);
            } else {
                // Part of a region: its pages are released, the range stays reserved until the
                // whole region is unmapped.
                let _b = Busy::enter();
                if let Some(e) = ENGINE.lock().clone() {
                    if let Some(r) = e.regions.lock().get(&base) {
                        r.discard(a - base, len);
                    }
                }
                // A touch there faults, as natively.
                let len = len.min(base + rlen - a);
                libc::syscall(libc::SYS_mprotect, a, len, libc::PROT_NONE);
            }
            return 0;
        }
        libc::syscall(libc::SYS_munmap, addr, len) as c_int
    }
}

/// # Safety
/// C `mremap` (see the module notes on its fifth argument).
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: the program calls this as C `mremap`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        let a = old as usize;
        if let Some(rlen) = region_len(a) {
            if FORKED.load(Relaxed) || flags & libc::MREMAP_FIXED != 0 {
                set_errno(libc::EINVAL);
                return libc::MAP_FAILED;
            }
            if new_len <= rlen {
                if new_len < old_len.min(rlen) {
                    munmap(
                        (a + new_len.next_multiple_of(4096)) as *mut c_void,
                        rlen - new_len.min(rlen),
                    );
                }
                return old;
            }
            if flags & libc::MREMAP_MAYMOVE == 0 {
                set_errno(libc::ENOMEM);
                return libc::MAP_FAILED;
            }
            let q = match new_region(new_len, 4096, 0) {
                Got::Region(q) => q,
                Got::NoMemory | Got::Fallback => {
                    set_errno(libc::ENOMEM);
                    return libc::MAP_FAILED;
                }
            };
            std::ptr::copy_nonoverlapping(old as *const u8, q as *mut u8, old_len.min(rlen));
            free_region(a);
            return q;
        }
        libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void
    }
}

type StartRoutine = extern "C" fn(*mut c_void) -> *mut c_void;
type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    StartRoutine,
    *mut c_void,
) -> c_int;

/// The program's start routine and argument, handed to [`registered_start`].
struct Start {
    routine: StartRoutine,
    arg: *mut c_void,
}

extern "C" fn registered_start(p: *mut c_void) -> *mut c_void {
    // SAFETY: `p` is the `Start` boxed by `pthread_create` below, handed over to this thread.
    let Start { routine, arg } = *unsafe { Box::from_raw(p as *mut Start) };
    tierstack_mem::register_current_thread();
    // The box is freed already: a thread that ends with pthread_exit leaks nothing.
    routine(arg)
}

/// # Safety
/// C `pthread_create`. With paging configured the new thread first registers its CPU word
/// with the pager, then runs `routine(arg)`; otherwise glibc's function is called directly.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    routine: StartRoutine,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the program calls this as C `pthread_create`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        static REAL: AtomicUsize = AtomicUsize::new(0);
        let f = next_symbol(&REAL, c"pthread_create");
        if f == 0 {
            return libc::EAGAIN;
        }
        // SAFETY: `f` is glibc's pthread_create, found by dlsym.
        let real: PthreadCreate = std::mem::transmute::<usize, PthreadCreate>(f);
        if THRESHOLD.load(Relaxed) == 0 {
            return real(thread, attr, routine, arg);
        }
        let start = Box::into_raw(Box::new(Start { routine, arg }));
        let rc = real(thread, attr, registered_start, start as *mut c_void);
        if rc != 0 {
            // SAFETY: the thread was not created; the box is still ours.
            drop(Box::from_raw(start));
        }
        rc
    }
}
