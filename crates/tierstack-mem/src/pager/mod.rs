//! The pager: one userfaultfd, fault threads, an evictor and one budget over all regions.
//!
//! This module holds the [`Pager`] itself (options, shared state, construction, teardown);
//! the work is split by job:
//!
//! - `fault`: the fault-thread loop, routing of faults to the thread on the faulting CPU
//!   (mailboxes), missing and write-protect faults;
//! - `region`: [`Region`] (map, discard, unmap) and the per-region page state (its fault
//!   streams included);
//! - `readahead`: fault-stream detection and the prefetch threads;
//! - `evict`: the evictor, victim selection, write-back and batched `MADV_DONTNEED`;
//! - `sweep`: per-pass accounting of regions swept in a loop larger than the budget;
//! - `page`: what they all share below them (a page's state, how a loaded page was mapped,
//!   the page hash, the read unit of a run, runs of adjacent pages).
//!
//! Layering (no module names one above it): `fault`, `readahead`, `evict` → `region` →
//! `page`, `sweep`.

mod evict;
mod fault;
mod page;
mod readahead;
mod region;
mod sweep;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use crate::uffd::Uffd;
use parking_lot::{Condvar, Mutex, RwLock};
use tierstack_store::{TieredStore, MAX_PAGE};

use crate::{MemCounters, MemError, Result};

use evict::{Staging, Zapper, EVICT_BATCH};
use fault::Mailbox;
use readahead::{prefetch_threads, PrefetchJob, PREFETCH_BYTES};
use region::{map_region, RegionCore};

pub use region::Region;
pub use sweep::{SweepStats, LAST_PASSES};

/// Options of a pager.
#[derive(Debug, Clone)]
pub struct PagerOptions {
    /// Unit of faulting, eviction and I/O: a multiple of 4 KiB, at most 1 MiB.
    pub page: usize,
    /// Resident bytes of all regions together.
    pub budget: u64,
    /// Fault-handling threads; kept one per CPU when there are at least as many CPUs (see
    /// [`default_fault_threads`]).
    pub fault_threads: usize,
    /// Bytes of regions the store can hold; `map` refuses more. None: no limit.
    pub commit_limit: Option<u64>,
}

/// Options of a stand-alone region (a region with its own pager).
#[derive(Debug, Clone)]
pub struct RegionOptions {
    /// As [`PagerOptions::page`].
    pub page: usize,
    /// As [`PagerOptions::budget`].
    pub budget: u64,
    /// As [`PagerOptions::fault_threads`].
    pub fault_threads: usize,
}

struct Inner {
    prefetch_tx: Mutex<Option<std::sync::mpsc::Sender<PrefetchJob>>>,
    uffd: Uffd,
    /// Dirty tracking with asynchronous write-protect (see [`DirtyTracking`]): pages read
    /// from the store are mapped write-protected and hashed (`Placed::Watched`), writes to
    /// them take no fault to the pager, and eviction finds the written ones with
    /// `PAGEMAP_SCAN` and takes victims out of the program's reach with `UFFDIO_MOVE`.
    wp_async: bool,
    /// `/proc/self/pagemap` (async write-protect only).
    pagemap: Option<crate::uffd::Pagemap>,
    /// Where eviction moves its victims (async write-protect only).
    staging: Option<Staging>,
    page: usize,
    /// One page of zeros (the source of zero fills).
    zeros: Vec<u8>,
    budget: u64,
    /// Room kept free under the budget while streams read ahead (see [`Pager::new`]).
    slack_wide: u64,
    /// Room kept free while none does: enough for the evictor to work in batches.
    slack_narrow: u64,
    /// Whether streams read ahead lately (the evictor decides, each round).
    wide: AtomicBool,
    /// `counters.prefetched` at the evictor's last look, and when it last grew.
    prefetch_seen: Mutex<(u64, std::time::Instant)>,
    store: Arc<TieredStore>,
    regions: RwLock<BTreeMap<usize, Arc<RegionCore>>>,
    clock: Mutex<VecDeque<(Weak<RegionCore>, u32)>>,
    /// Pages of regions being swept in a loop larger than memory (`RState::sweeping`),
    /// in load order: eviction takes them first, once more than [`Inner::sweep_lag`] wait.
    behind: Mutex<VecDeque<(Weak<RegionCore>, u32)>>,
    /// Finished passes of swept regions (taken after a region's lock, never before one).
    sweeps: Mutex<sweep::SweepLog>,
    resident: AtomicU64,
    committed: Mutex<u64>,
    commit_limit: Option<u64>,
    stop: AtomicBool,
    counters: MemCounters,
    kick: Mutex<bool>,
    kick_cv: Condvar,
    /// First error the pager hit (a page it could not write out stays resident).
    failed: Mutex<Option<String>>,
    /// Drops scattered ranges of our own mapping in one call with one TLB flush
    /// (`process_madvise(MADV_DONTNEED)`); per-range `madvise` where the kernel lacks it.
    zapper: Zapper,
    /// Every unit of the pager threads' work passes it; `fork` closes it (see
    /// [`Pager::pause`]).
    gate: crate::gate::Gate,
    /// One per fault thread.
    mail: Vec<Mailbox>,
    /// The fault thread pinned to each CPU.
    thread_on_cpu: Vec<Option<usize>>,
    reporter: Mutex<Option<Reporter>>,
    /// When the reporter was last called.
    reported: Mutex<std::time::Instant>,
}

/// What a [`Reporter`] is handed: the pager's figures now.
#[derive(Debug, Clone)]
pub struct PagerReport {
    /// The DRAM budget.
    pub budget: u64,
    /// The page size.
    pub page: usize,
    /// Bytes of regions mapped.
    pub committed: u64,
    /// Bytes of pages resident.
    pub resident: u64,
    /// The counters.
    pub stats: crate::MemStats,
}

/// Called by the evictor about once a second with the pager's figures (for live views such
/// as `tierstack top` and `run --metrics`). It runs on a pager thread inside one unit of
/// the pager's work (see [`Pager::pause`]): it must be short and take none of the pager's
/// locks.
pub type Reporter = Box<dyn Fn(&PagerReport) + Send>;

/// How often the evictor calls the [`Reporter`].
const REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The paging engine of a process: every region it maps shares its budget.
pub struct Pager {
    inner: Arc<Inner>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

fn check_page(page: usize) -> Result<()> {
    if page == 0 || !page.is_multiple_of(4096) || page > MAX_PAGE {
        return Err(MemError::Config(format!(
            "page size {page} is not a multiple of 4 KiB up to {} KiB",
            MAX_PAGE / 1024
        )));
    }
    Ok(())
}

impl Pager {
    /// A pager over `store` with its threads started.
    pub fn new(store: Arc<TieredStore>, o: &PagerOptions) -> Result<Pager> {
        check_page(o.page)?;
        if o.budget < 4 * o.page as u64 {
            return Err(MemError::Config(format!(
                "budget {} is below four pages of {}",
                o.budget, o.page
            )));
        }
        let caps = crate::uffd::available().map_err(|e| MemError::Uffd {
            what: "cannot create one (run as root, or allow /dev/userfaultfd)",
            source: e,
        })?;
        let wp_async = DirtyTracking::chosen(&caps)? == DirtyTracking::Async;
        let features = if wp_async {
            crate::uffd::FEATURE_WP_ASYNC | crate::uffd::FEATURE_MOVE
        } else {
            0
        };
        let uffd =
            Uffd::open(crate::uffd::PAGER_FEATURES | features).map_err(|e| MemError::Uffd {
                what: "cannot create one (run as root, or allow /dev/userfaultfd)",
                source: e,
            })?;
        let pagemap = if wp_async {
            Some(crate::uffd::Pagemap::open().map_err(|e| MemError::Uffd {
                what: "cannot open /proc/self/pagemap for PAGEMAP_SCAN",
                source: e,
            })?)
        } else {
            None
        };
        let page = o.page as u64;
        // Watermarks close to the budget: under uniform access the hit rate is the share of
        // the map that is resident, so every idle byte of budget costs faults. While streams
        // read ahead, the gap (1 % of the budget, at least four prefetch windows, at most a
        // tenth) leaves them room (two windows gave a linear scan 20-30 % less); while none
        // does, 1 % of the budget (at least two eviction batches) lets the evictor work in
        // batches and leaves the rest to resident pages.
        let slack_narrow = (o.budget / 100)
            .max(2 * EVICT_BATCH as u64 * page)
            .min(o.budget / 10)
            .max(page);
        let slack_wide = slack_narrow.max((4 * PREFETCH_BYTES as u64).min(o.budget / 10));
        // One fault thread per CPU where there are enough CPUs, each kept on its CPU: a
        // program thread waiting in a fault then finds a fault thread on its own CPU, which
        // keeps that CPU out of the idle state (on a virtual machine, waking a halted CPU
        // costs tens of microseconds per fault). Faults of program threads that registered
        // (`register_current_thread`) are handed to the fault thread of their CPU, which
        // wakes them without an inter-processor interrupt.
        let cpus = allowed_cpus();
        let nthreads = o.fault_threads.max(1);
        let pin: Vec<usize> = if nthreads <= cpus.len() {
            cpus[..nthreads].to_vec()
        } else {
            Vec::new()
        };
        let mut thread_on_cpu = vec![None; pin.iter().max().map_or(0, |m| m + 1)];
        for (i, &c) in pin.iter().enumerate() {
            thread_on_cpu[c] = Some(i);
        }
        let staging = if wp_async {
            // One slot per thread that may evict: the evictor and each fault thread.
            Some(Staging::new(&uffd, o.page, nthreads + 1)?)
        } else {
            None
        };
        let (tx, rx) = std::sync::mpsc::channel::<PrefetchJob>();
        let rx = Arc::new(Mutex::new(rx));
        let inner = Arc::new(Inner {
            prefetch_tx: Mutex::new(Some(tx)),
            uffd,
            wp_async,
            pagemap,
            staging,
            page: o.page,
            zeros: vec![0u8; o.page],
            budget: o.budget,
            slack_wide,
            slack_narrow,
            wide: AtomicBool::new(true),
            prefetch_seen: Mutex::new((0, std::time::Instant::now())),
            store,
            regions: RwLock::new(BTreeMap::new()),
            clock: Mutex::new(VecDeque::new()),
            behind: Mutex::new(VecDeque::new()),
            sweeps: Mutex::new(sweep::SweepLog::default()),
            resident: AtomicU64::new(0),
            committed: Mutex::new(0),
            commit_limit: o.commit_limit,
            stop: AtomicBool::new(false),
            counters: MemCounters::default(),
            kick: Mutex::new(false),
            kick_cv: Condvar::new(),
            failed: Mutex::new(None),
            zapper: Zapper::new(),
            gate: crate::gate::Gate::new(),
            mail: (0..nthreads).map(|_| Mailbox::default()).collect(),
            thread_on_cpu,
            reporter: Mutex::new(None),
            reported: Mutex::new(std::time::Instant::now()),
        });
        let mut threads = Vec::new();
        let mut spawn = |name: String, f: Box<dyn FnOnce() + Send>| -> Result<()> {
            let h = std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(MemError::Thread)?;
            threads.push(h);
            Ok(())
        };
        for i in 0..nthreads {
            let s = inner.clone();
            let cpu = pin.get(i).copied();
            spawn(
                format!("ts-fault-{i}"),
                Box::new(move || {
                    // A dead fault thread would leave the program asleep in a fault forever.
                    // A program waits in the fault for every read this thread makes.
                    tierstack_store::poll_reads_on_this_thread(true);
                    if let Some(cpu) = cpu {
                        pin_to_cpu(cpu);
                    }
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.serve(i)))
                        .is_err()
                    {
                        fatal("a fault-handling thread panicked");
                    }
                }),
            )?;
        }
        let s = inner.clone();
        spawn("ts-evict".into(), Box::new(move || s.evictor()))?;
        for i in 0..prefetch_threads(o.budget) {
            let s = inner.clone();
            let rx = rx.clone();
            spawn(
                format!("ts-prefetch-{i}"),
                Box::new(move || {
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.prefetcher(&rx)))
                        .is_err()
                    {
                        fatal("a prefetch thread panicked");
                    }
                }),
            )?;
        }
        Ok(Pager { inner, threads })
    }

    /// Maps `len` bytes (rounded up to whole pages) aligned to `align` (a power of two; the
    /// mapping is at least page-aligned).
    pub fn map(&self, len: usize, align: usize) -> Result<Region> {
        map_region(&self.inner, len, align, 0, None)
    }

    /// [`Pager::map`] at `hint` if the kernel can place it there (as `mmap` with an address
    /// and no `MAP_FIXED`: elsewhere otherwise).
    pub fn map_near(&self, len: usize, hint: usize) -> Result<Region> {
        map_region(&self.inner, len, 4096, hint, None)
    }

    /// Resident bytes of all regions.
    pub fn resident(&self) -> u64 {
        self.inner.resident.load(Relaxed)
    }

    /// The DRAM budget.
    pub fn budget(&self) -> u64 {
        self.inner.budget
    }

    /// The page size.
    pub fn page(&self) -> usize {
        self.inner.page
    }

    /// How this pager learns which pages were written.
    pub fn dirty_tracking(&self) -> DirtyTracking {
        if self.inner.wp_async {
            DirtyTracking::Async
        } else {
            DirtyTracking::Fault
        }
    }

    /// Its counters.
    pub fn counters(&self) -> &MemCounters {
        &self.inner.counters
    }

    /// The pager's figures now.
    pub fn report(&self) -> PagerReport {
        self.inner.report()
    }

    /// Sets (or with None removes) the function the evictor calls about once a second with
    /// [`Pager::report`]. When this returns, no call of the previous one is under way.
    pub fn set_reporter(&self, r: Option<Reporter>) {
        *self.inner.reporter.lock() = r;
    }

    /// Bytes of regions mapped now.
    pub fn committed(&self) -> u64 {
        *self.inner.committed.lock()
    }

    /// The first error the pager hit, if any (a page it could not write out stays resident).
    pub fn error(&self) -> Option<String> {
        self.inner.failed.lock().clone()
    }

    /// The store the pager's regions page to.
    pub fn store(&self) -> &Arc<TieredStore> {
        &self.inner.store
    }

    /// Stops the pager's threads between units of work (for `fork`): returns when none is
    /// serving a fault, prefetching or evicting. Program threads that fault meanwhile wait
    /// until [`Pager::resume`]. No page is `Loading` or `Evicting` while paused.
    pub fn pause(&self) {
        self.inner.gate.close();
    }

    /// Lets the pager's threads go on after [`Pager::pause`].
    pub fn resume(&self) {
        self.inner.gate.open();
    }

    /// In a child made by `fork`, with this pager inherited from the parent (paused there):
    /// takes over `old`, one of that pager's regions, at the same address with the same page
    /// states. Pages resident at the fork are resident here too (the kernel copied them);
    /// the others are read from this pager's store, which must hold what the parent's store
    /// held at the fork (see `tierstack_store::ArrayTier` over `Array::read_only_view`).
    pub fn adopt(&self, old: &Region) -> Result<Region> {
        region::adopt_region(&self.inner, old)
    }

    /// In a child made by `fork`: lets go of a pager inherited from the parent without
    /// touching what it shares with the parent (its threads do not exist here; its store and
    /// regions belong to the parent). Its userfaultfd descriptor is closed; its memory stays.
    pub fn abandon(self) {
        use std::os::fd::AsRawFd;
        let fd = self.inner.uffd.as_raw_fd();
        std::mem::forget(self);
        // SAFETY: the descriptor belongs to the pager just forgotten, which never closes it.
        unsafe { libc::close(fd) };
    }
}

impl Inner {
    fn report(&self) -> PagerReport {
        let mut stats = self.counters.snapshot();
        if let Some(c) = self.store.tier_status("compressed") {
            stats.compressed_hits = c.hits;
            stats.compressed_bytes = c.used_bytes;
        }
        stats.sweeps = self.sweeps.lock().stats();
        PagerReport {
            budget: self.budget,
            page: self.page,
            committed: *self.committed.lock(),
            resident: self.resident.load(Relaxed),
            stats,
        }
    }

    /// Calls the reporter if one is set, its last call was [`REPORT_EVERY`] ago or more and
    /// nobody is replacing it now.
    fn maybe_report(&self) {
        let Some(mut last) = self.reported.try_lock() else {
            return;
        };
        if last.elapsed() < REPORT_EVERY {
            return;
        }
        *last = std::time::Instant::now();
        if let Some(g) = self.reporter.try_lock() {
            if let Some(f) = g.as_ref() {
                f(&self.report());
            }
        }
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        self.inner.stop.store(true, Relaxed);
        self.inner.prefetch_tx.lock().take();
        self.inner.kick_cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn fatal(msg: &str) -> ! {
    // A page that cannot be read back must not be replaced by wrong data.
    eprintln!("tierstack: fatal: {msg}; stopping the program rather than returning wrong data");
    std::process::abort();
}

impl Inner {
    fn fail(&self, msg: String) {
        let mut f = self.failed.lock();
        if f.is_none() {
            eprintln!("tierstack: {msg}");
            *f = Some(msg);
        }
    }

    fn region_of(&self, addr: usize) -> Option<Arc<RegionCore>> {
        let r = self.regions.read();
        let (_, c) = r.range(..=addr).next_back()?;
        (addr < c.base + c.len).then(|| c.clone())
    }
}

/// How a pager learns which resident pages the program wrote (so that eviction drops the
/// others without a write).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirtyTracking {
    /// Userfaultfd write-protect faults: a page read from the store is mapped write-protected
    /// (or writable and hashed, for regions being written) and its first write is a fault the
    /// pager serves (lifting the protection costs a TLB shootdown); eviction write-protects
    /// dirty victims again before writing them out.
    Fault,
    /// Asynchronous write-protect (Linux 6.7+): the kernel lifts the protection itself on a
    /// write, with no fault to the pager; eviction finds the written victims with one
    /// `PAGEMAP_SCAN` per run (protecting them again in the same call), moves the victims out
    /// of the program's reach with `UFFDIO_MOVE` (6.8+) and compares the hash of the others.
    Async,
}

/// The environment variable that chooses the dirty tracking: `fault` or `async` (default:
/// `async` where the kernel offers it, see [`crate::uffd::Caps::async_dirty_tracking`]).
pub const WP_ENV: &str = "TIERSTACK_MEM_WP";

impl DirtyTracking {
    /// What a pager made now uses, given what the kernel offers: [`WP_ENV`] if set (`async`
    /// where the kernel lacks it is an error: a forced A/B measurement must not silently
    /// measure the other path), otherwise async where the kernel offers it.
    pub fn chosen(caps: &crate::uffd::Caps) -> Result<DirtyTracking> {
        let v = std::env::var(WP_ENV).unwrap_or_default();
        match v.trim() {
            "" | "auto" => Ok(if caps.async_dirty_tracking() {
                DirtyTracking::Async
            } else {
                DirtyTracking::Fault
            }),
            "fault" => Ok(DirtyTracking::Fault),
            "async" if caps.async_dirty_tracking() => Ok(DirtyTracking::Async),
            "async" => Err(MemError::Config(format!(
                "{WP_ENV}=async: this kernel lacks userfaultfd async write-protect, \
                 PAGEMAP_SCAN or UFFDIO_MOVE (Linux 6.8 or newer has them): {caps:?}"
            ))),
            other => Err(MemError::Config(format!(
                "{WP_ENV}={other}: expected fault, async or auto"
            ))),
        }
    }
}

/// Threads a pager with `budget` resident bytes and `fault_threads` fault threads starts: the
/// fault threads, the evictor and the prefetch threads (their number grows with the budget).
pub fn pager_threads(budget: u64, fault_threads: usize) -> usize {
    fault_threads.max(1) + 1 + prefetch_threads(budget)
}

/// Fault threads for a process: one per CPU it may run on, from 2 to 8.
pub fn default_fault_threads() -> usize {
    allowed_cpus().len().clamp(2, 8)
}

/// The CPUs this process may run on, in order.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity fills the zero-initialised set it is given.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Keeps the calling thread on `cpu` (best effort).
fn pin_to_cpu(cpu: usize) {
    // SAFETY: sched_setaffinity reads the set it is given; it affects only this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
