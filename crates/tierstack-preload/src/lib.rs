//! tierstack-preload: the LD_PRELOAD shim behind `tierstack run`.
//!
//! Interposes the malloc family (`malloc`, `calloc`, `realloc`, `reallocarray`, `free`,
//! `posix_memalign`, `aligned_alloc`, `memalign`, `valloc`, `pvalloc`, `malloc_usable_size`)
//! and anonymous private `mmap` / `munmap` / `mremap`. A request of at least the threshold
//! (`_TIERSTACK_SHIM_THRESHOLD`, default 64 MiB) becomes a region of the process's
//! [`tierstack_mem::Pager`]: its pages live in DRAM up to the process's budget
//! (`_TIERSTACK_SHIM_DRAM`) and in the tiered store (an array of file drives) beyond it. Everything
//! smaller goes to glibc's allocator (`__libc_malloc` and friends), as do requests made by
//! tierstack's own threads (named `ts-*`) and by the shim while it works (a thread-local flag).
//!
//! - The pager and its store start on the first large request. With `_TIERSTACK_SHIM_DIR` the
//!   process makes its own RAID 5 of four sparse file drives in `DIR/<pid>/` and unlinks them
//!   at once (the space is freed when the process ends, even by `kill -9`); with
//!   `_TIERSTACK_SHIM_ARRAY` it opens that array (one process at a time; its paging data from
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
//! - With `_TIERSTACK_SHIM_STATS_DIR` the process writes its counters to `DIR/<pid>.json` at exit;
//!   `tierstack run --stats` prints them.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::Arc;

use libc::{c_int, c_void, off_t, size_t};
use parking_lot::Mutex;
use tierstack_common::env as contract;
use tierstack_mem::gate::{Gate, Inside};
use tierstack_mem::setup::Tiers;
use tierstack_mem::{MemError, Pager, Region};

use error::PreloadError;

mod error;
mod fork;
mod heap;
mod mapping;

use fork::*;
use heap::*;

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
    /// What this engine was built as (published with the figures).
    config: tierstack_mem::setup::EngineConfig,
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
fn env_size(var: contract::Var) -> Option<u64> {
    // SAFETY: the name is a NUL-terminated C string; getenv returns NULL or a NUL-terminated
    // string that stays valid while the environment is not changed (we copy it out at once).
    let p = unsafe { libc::getenv(var.c().as_ptr()) };
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
    if env_size(contract::DRAM).is_none() {
        return;
    }
    let t = env_size(contract::THRESHOLD)
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
    std::env::var_os(contract::DIR.name())
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
}

/// Makes this process's own paging array: RAID 5 of four sparse file drives in
/// `dir/<pid>/`, whose names go at once (nothing is left behind at exit, even by `kill -9`).
fn own_array(
    dir: &std::path::Path,
    page: usize,
    dram: u64,
) -> Result<tierstack_array::Array, PreloadError> {
    let dir = dir.join(std::process::id().to_string());
    std::fs::create_dir_all(&dir).map_err(|source| PreloadError::CreateDir {
        path: dir.clone(),
        source,
    })?;
    let store = env_size(contract::STORE).unwrap_or(tierstack_mem::setup::DEFAULT_STORE);
    let made = tierstack_mem::setup::create_array(
        &dir,
        "",
        store,
        tierstack_mem::setup::LEVEL,
        page,
        dram,
    );
    for i in 0..tierstack_mem::setup::DRIVES {
        let _ = std::fs::remove_file(dir.join(format!("d{i}")));
    }
    let _ = std::fs::remove_dir(&dir);
    Ok(made?.0)
}

fn start() -> Result<Engine, PreloadError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let dram = env_size(contract::DRAM).ok_or(PreloadError::NotSet(contract::DRAM.name()))?;
    let page =
        env_size(contract::PAGE).unwrap_or(tierstack_mem::setup::DEFAULT_PAGE as u64) as usize;
    let opts = tierstack_array::ArrayOptions::default();
    let (array, dir) = if let Some(desc) = env(contract::ARRAY.name()) {
        let a = tierstack_array::descriptor::open_array(std::path::Path::new(&desc), &opts)
            .map_err(|source| PreloadError::OpenArray {
                desc: desc.clone(),
                source,
            })?;
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
        let dir = paging_dir().ok_or(PreloadError::NotSet(
            "neither _TIERSTACK_SHIM_DIR nor _TIERSTACK_SHIM_ARRAY",
        ))?;
        (own_array(&dir, page, dram)?, dir)
    };
    let engine = build_engine(Arc::new(array), Vec::new(), dram, page, dir, shim_tiers()?)?;
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

/// The optional tiers `run` chose (`_TIERSTACK_SHIM_TIERS`); the default ones when the shim
/// was preloaded without it.
pub(crate) fn shim_tiers() -> Result<Tiers, PreloadError> {
    match std::env::var(contract::TIERS.name()) {
        Ok(text) if !text.is_empty() => Ok(Tiers::from_shim(&text)?),
        _ => Ok(Tiers::default()),
    }
}

/// An engine over `array` (and the snapshots a forked child reads), with the same store and
/// budget rule as `bench mem`'s tierstack engine, and the optional `tiers` (never a VRAM tier
/// in a forked child: CUDA does not survive fork).
fn build_engine(
    array: Arc<tierstack_array::Array>,
    snapshots: Vec<Arc<tierstack_array::Array>>,
    dram: u64,
    page: usize,
    dir: std::path::PathBuf,
    tiers: Tiers,
) -> Result<Engine, PreloadError> {
    let (store, options) =
        tierstack_mem::setup::store_over(array.clone(), &snapshots, dram, page, tiers)?;
    let pager = Pager::new(store, &options)?;
    let config = tierstack_mem::setup::engine_config(&array, dram, page, tiers);
    let stats_dir = std::env::var_os(contract::STATS_DIR.name())
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from);
    if let Some(dir) = stats_dir.clone() {
        // Live figures for `tierstack top` and `run --metrics`, about once a second.
        // It runs on the evictor inside one unit of the pager's work, which `fork_prepare`
        // waits for after closing GATE: passing GATE here could deadlock.
        let config = config.clone();
        pager.set_reporter(Some(Box::new(move |r| {
            let _b = Busy::outside();
            publish_stats(&dir, r, true, &config);
        })));
    }
    Ok(Engine {
        pager,
        config,
        regions: Mutex::new(HashMap::new()),
        stats_dir,
        array,
        snapshots,
        dram,
        page,
        dir,
    })
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
    publish_stats(dir, &e.pager.report(), false, &e.config);
}

/// Writes this process's pager figures to `DIR/PID.json` (whole: a temporary file renamed
/// into place), `live` while the process runs, not after its exit.
fn publish_stats(
    dir: &std::path::Path,
    r: &tierstack_mem::PagerReport,
    live: bool,
    config: &tierstack_mem::setup::EngineConfig,
) {
    let pid = std::process::id();
    let v = serde_json::json!({
        "pid": pid,
        "live": live,
        "engine": config,
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
