//! The pager: one userfaultfd, fault threads, an evictor and one budget over all regions.

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::AsFd;
use std::sync::atomic::{
    AtomicBool, AtomicU64, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed,
    Ordering::Release,
};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::uffd::{Event, FaultKind, Uffd};
use parking_lot::{Condvar, Mutex, RwLock};
use tierstack_store::{TieredStore, MAX_PAGE};

use crate::{MemCounters, MemError, Result};

/// Largest prefetch window, in bytes (at least 16 pages).
const PREFETCH_BYTES: usize = 4 << 20;
/// Write heat at which prefetched pages are mapped writable, and its ceiling.
const WRITE_HEAT_ON: u32 = 16;
const WRITE_HEAT_MAX: u32 = 64;
/// Fault streams remembered per region.
const STREAMS: usize = 4;
/// Largest stride (in pages) taken for a stream.
const MAX_STRIDE: i64 = 64;
/// Store object ids of regions: unique in the process, so pagers may share a store.
static NEXT_OBJ: AtomicU64 = AtomicU64::new(1);
/// Victims taken from the clock at a time.
const EVICT_BATCH: usize = 64;

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
    pub page: usize,
    pub budget: u64,
    pub fault_threads: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PageState {
    /// Never written, or evicted while all zero: served by the zero page.
    Zero,
    /// In the store.
    Stored,
    /// Being read from the store (by a fault or a prefetch); whoever set it maps and wakes.
    Loading,
    Resident,
    /// Being written out by an eviction; writers wait in a write-protect fault.
    Evicting,
}

#[derive(Clone, Copy, Default)]
struct Stream {
    /// Page of the last fault of the stream.
    last: i64,
    stride: i64,
    /// Last page prefetched (or faulted) along the stream: the prefetch frontier.
    ahead: i64,
    /// Consecutive faults that followed the stride.
    hits: u32,
    window: u64,
    used: u64,
}

struct RState {
    pages: Vec<PageState>,
    /// For a resident page: written since it came in.
    dirty: Vec<bool>,
    /// For a resident page: what the store holds for it while it is clean (Zero or Stored).
    backed: Vec<PageState>,
    /// In the clock queue.
    queued: Vec<bool>,
    resident: u64,
    streams: [Stream; STREAMS],
    tick: u64,
    /// The region was unmapped; late fault and eviction work undoes itself.
    dead: bool,
}

struct RegionCore {
    /// Recent write-protect faults (+2 each): while the region is being written, prefetched
    /// pages are mapped writable (dirty, -1 each) instead of taking a write-protect fault
    /// each; clean evictions cool it down too.
    write_heat: std::sync::atomic::AtomicU32,
    /// Evictions reading this region's pages outside the lock; drop waits for them.
    inflight: AtomicU64,
    obj: u64,
    base: usize,
    len: usize,
    st: Mutex<RState>,
}

/// A page to read ahead of a fault stream.
struct PrefetchJob {
    core: Arc<RegionCore>,
    idx: usize,
}

/// Threads that read prefetched pages in parallel (the store's reads are synchronous).
const PREFETCH_THREADS: usize = 8;

/// A page fault to serve (read from the userfaultfd, or handed over by another thread).
#[derive(Clone, Copy)]
struct Fault {
    kind: FaultKind,
    addr: usize,
    write: bool,
}

/// Faults handed to one fault thread: those of program threads on its CPU.
#[derive(Default)]
struct Mailbox {
    queue: Mutex<VecDeque<(Fault, Instant)>>,
    len: std::sync::atomic::AtomicUsize,
    /// The owner polls (rather than sleeps): only then is mail handed to it.
    spinning: AtomicBool,
    /// The owner waits for a store read: mail would wait for it, so none is handed to it.
    busy: AtomicBool,
}

/// Mail another fault thread has not taken for this long is served by whoever sees it (the
/// owner's CPU may be busy with another thread); a fault served across CPUs costs ~10 us
/// more here, so waiting longer than that for the owner does not pay.
const STEAL_AFTER: Duration = Duration::from_micros(15);

struct Inner {
    prefetch_tx: Mutex<Option<std::sync::mpsc::Sender<PrefetchJob>>>,
    uffd: Uffd,
    page: usize,
    /// One page of zeros (the source of zero fills).
    zeros: Vec<u8>,
    budget: u64,
    high: u64,
    low: u64,
    store: Arc<TieredStore>,
    regions: RwLock<BTreeMap<usize, Arc<RegionCore>>>,
    clock: Mutex<VecDeque<(Weak<RegionCore>, u32)>>,
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
    /// One per fault thread.
    mail: Vec<Mailbox>,
    /// The fault thread pinned to each CPU.
    thread_on_cpu: Vec<Option<usize>>,
}

/// The paging engine of a process: every region it maps shares its budget.
pub struct Pager {
    inner: Arc<Inner>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// A mapping paged by a [`Pager`]. Dropping it unmaps it and removes its pages from the store.
pub struct Region {
    core: Arc<RegionCore>,
    inner: Arc<Inner>,
    /// A stand-alone region owns its pager (dropped after the region).
    _own: Option<Pager>,
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
    pub fn new(store: Arc<TieredStore>, o: &PagerOptions) -> Result<Pager> {
        check_page(o.page)?;
        if o.budget < 4 * o.page as u64 {
            return Err(MemError::Config(format!(
                "budget {} is below four pages of {}",
                o.budget, o.page
            )));
        }
        let uffd = Uffd::open(crate::uffd::PAGER_FEATURES).map_err(|e| {
            MemError::Uffd(format!(
                "cannot create ({e}): run as root or allow /dev/userfaultfd"
            ))
        })?;
        let page = o.page as u64;
        // Watermarks close to the budget: under uniform access the hit rate is the share of
        // the map that is resident, so every idle byte of budget costs faults. The gap
        // (1 % of the budget, at least four prefetch windows, at most a tenth) leaves
        // sequential streams room to read ahead (two windows gave a linear scan 20-30 % less)
        // and lets the evictor work in batches.
        let slack = (o.budget / 100)
            .max(4 * PREFETCH_BYTES as u64)
            .min(o.budget / 10)
            .max(page);
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
        let (tx, rx) = std::sync::mpsc::channel::<PrefetchJob>();
        let rx = Arc::new(Mutex::new(rx));
        let inner = Arc::new(Inner {
            prefetch_tx: Mutex::new(Some(tx)),
            uffd,
            page: o.page,
            zeros: vec![0u8; o.page],
            budget: o.budget,
            high: o.budget.saturating_sub(slack).max(2 * page),
            low: o.budget.saturating_sub(2 * slack).max(page),
            store,
            regions: RwLock::new(BTreeMap::new()),
            clock: Mutex::new(VecDeque::new()),
            resident: AtomicU64::new(0),
            committed: Mutex::new(0),
            commit_limit: o.commit_limit,
            stop: AtomicBool::new(false),
            counters: MemCounters::default(),
            kick: Mutex::new(false),
            kick_cv: Condvar::new(),
            failed: Mutex::new(None),
            zapper: Zapper::new(),
            mail: (0..nthreads).map(|_| Mailbox::default()).collect(),
            thread_on_cpu,
        });
        let mut threads = Vec::new();
        let mut spawn = |name: String, f: Box<dyn FnOnce() + Send>| -> Result<()> {
            let h = std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|e| MemError::Uffd(format!("cannot start a pager thread: {e}")))?;
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
        for i in 0..PREFETCH_THREADS {
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
        map_region(&self.inner, len, align, None)
    }

    /// Resident bytes of all regions.
    pub fn resident(&self) -> u64 {
        self.inner.resident.load(Relaxed)
    }

    pub fn budget(&self) -> u64 {
        self.inner.budget
    }

    pub fn page(&self) -> usize {
        self.inner.page
    }

    pub fn counters(&self) -> &MemCounters {
        &self.inner.counters
    }

    /// Bytes of regions mapped now.
    pub fn committed(&self) -> u64 {
        *self.inner.committed.lock()
    }

    pub fn error(&self) -> Option<String> {
        self.inner.failed.lock().clone()
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

fn map_region(inner: &Arc<Inner>, len: usize, align: usize, own: Option<Pager>) -> Result<Region> {
    if !align.is_power_of_two() {
        return Err(MemError::Config(format!(
            "alignment {align} is not a power of two"
        )));
    }
    let page = inner.page;
    let npages = len.div_ceil(page).max(1);
    let len = npages * page;
    {
        let mut c = inner.committed.lock();
        if let Some(limit) = inner.commit_limit {
            if *c + len as u64 > limit {
                return Err(MemError::NoSpace {
                    want: len as u64,
                    committed: *c,
                    limit,
                });
            }
        }
        *c += len as u64;
    }
    let uncommit = || *inner.committed.lock() -= len as u64;
    let align = align.max(4096);
    let extra = if align > 4096 { align } else { 0 };
    // SAFETY: a fresh private anonymous mapping at an address the kernel chooses; nothing else
    // refers to it until this function returns it.
    let raw = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            len + extra,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE,
        )
    };
    let raw = match raw {
        Ok(p) => p as usize,
        Err(e) => {
            uncommit();
            return Err(MemError::Map(e.to_string()));
        }
    };
    let base = raw.next_multiple_of(align);
    // SAFETY: trimming the unaligned head and the tail of the mapping made above; only the
    // aligned part [base, base+len) is kept and used.
    unsafe {
        if base > raw {
            let _ = rustix::mm::munmap(raw as *mut _, base - raw);
        }
        let end = raw + len + extra;
        if end > base + len {
            let _ = rustix::mm::munmap((base + len) as *mut _, end - base - len);
        }
        // Forked children do not inherit the region (they could not page it): a child that
        // touches it gets SIGSEGV instead of silently wrong data. Huge pages would defeat the
        // page-sized faulting and eviction.
        let _ = rustix::mm::madvise(base as *mut _, len, rustix::mm::Advice::LinuxDontFork);
        let _ = rustix::mm::madvise(base as *mut _, len, rustix::mm::Advice::LinuxNoHugepage);
    }
    if let Err(e) = inner
        .uffd
        .register(base, len, crate::uffd::MODE_MISSING | crate::uffd::MODE_WP)
    {
        // SAFETY: unmapping the mapping created above, which nobody else uses yet.
        let _ = unsafe { rustix::mm::munmap(base as *mut _, len) };
        uncommit();
        return Err(MemError::Uffd(format!("register: {e}")));
    }
    let core = Arc::new(RegionCore {
        write_heat: std::sync::atomic::AtomicU32::new(0),
        inflight: AtomicU64::new(0),
        obj: NEXT_OBJ.fetch_add(1, Relaxed),
        base,
        len,
        st: Mutex::new(RState {
            pages: vec![PageState::Zero; npages],
            dirty: vec![false; npages],
            backed: vec![PageState::Zero; npages],
            queued: vec![false; npages],
            resident: 0,
            streams: [Stream::default(); STREAMS],
            tick: 0,
            dead: false,
        }),
    });
    inner.regions.write().insert(base, core.clone());
    inner.counters.regions.fetch_add(1, Relaxed);
    Ok(Region {
        core,
        inner: inner.clone(),
        _own: own,
    })
}

impl Region {
    /// A region with a pager of its own (its budget is the region's).
    pub fn new(store: Arc<TieredStore>, len: usize, o: &RegionOptions) -> Result<Region> {
        let pager = Pager::new(
            store,
            &PagerOptions {
                page: o.page,
                budget: o.budget,
                fault_threads: o.fault_threads,
                commit_limit: None,
            },
        )?;
        let inner = pager.inner.clone();
        map_region(&inner, len, 4096, Some(pager))
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.core.base as *mut u8
    }

    pub fn len(&self) -> usize {
        self.core.len
    }

    pub fn is_empty(&self) -> bool {
        self.core.len == 0
    }

    /// The store object that holds this region's pages.
    pub fn obj(&self) -> u64 {
        self.core.obj
    }

    /// Resident bytes of this region.
    pub fn resident(&self) -> u64 {
        self.core.st.lock().resident
    }

    /// Counters of the region's pager.
    pub fn counters(&self) -> &MemCounters {
        &self.inner.counters
    }

    /// The first error of the region's pager, if any.
    pub fn error(&self) -> Option<String> {
        self.inner.failed.lock().clone()
    }

    /// Releases the pages of `[off, off+len)` (whole pages inside it): they read as zeros
    /// afterwards and leave the store. The address range stays mapped.
    pub fn discard(&self, off: usize, len: usize) {
        let page = self.inner.page;
        let first = off.div_ceil(page);
        let end = ((off + len).min(self.core.len)) / page;
        if first >= end {
            return;
        }
        let mut st = self.core.st.lock();
        for i in first..end {
            match st.pages[i] {
                PageState::Resident => {
                    st.resident -= page as u64;
                    self.inner.resident.fetch_sub(page as u64, Relaxed);
                    if st.backed[i] == PageState::Stored {
                        let _ = self.inner.store.remove((self.core.obj, i as u64));
                    }
                    st.pages[i] = PageState::Zero;
                }
                PageState::Stored => {
                    let _ = self.inner.store.remove((self.core.obj, i as u64));
                    st.pages[i] = PageState::Zero;
                }
                // In flight: leave it to its owner (the range is being discarded by a
                // program that no longer uses it).
                _ => {}
            }
        }
        let a = self.core.base + first * page;
        // SAFETY: the pages lie in this region's mapping; their contents are discarded on the
        // program's request.
        let _ = unsafe {
            rustix::mm::madvise(
                a as *mut _,
                (end - first) * page,
                rustix::mm::Advice::LinuxDontNeed,
            )
        };
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let inner = &self.inner;
        let c = &self.core;
        inner.regions.write().remove(&c.base);
        c.st.lock().dead = true;
        // An eviction may be copying one of our pages out: the mapping must outlive it.
        while c.inflight.load(Acquire) > 0 {
            std::thread::yield_now();
        }
        let _ = inner.uffd.unregister(c.base, c.len);
        // SAFETY: the mapping was created by `map_region`; it is no longer registered and the
        // Region (the only owner of the pointer) is being dropped.
        let _ = unsafe { rustix::mm::munmap(c.base as *mut _, c.len) };
        let mut st = c.st.lock();
        inner.resident.fetch_sub(st.resident, Relaxed);
        st.resident = 0;
        // Every page that may have a copy in the store (also those a loader or an eviction
        // still holds: they see `dead` and drop their work).
        for (i, s) in st.pages.iter().enumerate() {
            if *s != PageState::Zero {
                let _ = inner.store.remove((c.obj, i as u64));
            }
        }
        drop(st);
        *inner.committed.lock() -= c.len as u64;
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

    /// Fault thread loop (thread `me`). For 2 ms after each fault the thread polls without
    /// sleeping, yielding its CPU to any other runnable thread between polls (a sleeping
    /// thread costs a cross-CPU wake-up per fault, 60-90 us here; yielding keeps a program
    /// thread that shares the CPU from waiting on the spin); then it sleeps in poll. Each
    /// fault read goes to the fault thread of the faulting thread's CPU when that is known
    /// and the thread polls; mail left untaken for [`STEAL_AFTER`] is served by any thread.
    fn serve(&self, me: usize) {
        let mut last_fault = Instant::now();
        self.mail[me].spinning.store(true, Release);
        while !self.stop.load(Relaxed) {
            if self.take_mail(me, STEAL_AFTER) {
                last_fault = Instant::now();
                continue;
            }
            if last_fault.elapsed() < Duration::from_millis(2) {
                if !self.pending(0) {
                    std::thread::yield_now();
                    continue;
                }
            } else {
                // Going to sleep: no more mail for this thread; whatever came meanwhile is
                // served before (so nothing waits on a sleeping owner).
                self.mail[me].spinning.store(false, Release);
                if self.take_mail(me, Duration::ZERO) {
                    self.mail[me].spinning.store(true, Release);
                    last_fault = Instant::now();
                    continue;
                }
                let ready = self.pending(100_000_000);
                self.mail[me].spinning.store(true, Release);
                if !ready {
                    continue;
                }
            }
            match self.uffd.read_event() {
                Ok(Some(ev)) => {
                    self.route(me, ev);
                    last_fault = Instant::now();
                }
                Ok(None) => {}
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        // Never leave a handed fault behind: its thread would sleep in it for good.
        self.mail[me].spinning.store(false, Release);
        self.take_mail(me, Duration::ZERO);
    }

    /// Serves the mail of thread `me`, and that of other threads waiting for at least
    /// `steal_after`. Returns whether it served any.
    fn take_mail(&self, me: usize, steal_after: Duration) -> bool {
        let mut served = false;
        for (j, m) in self.mail.iter().enumerate() {
            if m.len.load(Acquire) == 0 {
                continue;
            }
            let limit = if j == me { Duration::ZERO } else { steal_after };
            loop {
                let next = {
                    let mut q = m.queue.lock();
                    match q.front() {
                        Some((_, at)) if at.elapsed() >= limit => {
                            m.len.fetch_sub(1, AcqRel);
                            q.pop_front().map(|(f, _)| f)
                        }
                        _ => None,
                    }
                };
                let Some(f) = next else { break };
                if j != me {
                    self.counters.stolen.fetch_add(1, Relaxed);
                }
                self.fault(me, f);
                served = true;
            }
        }
        served
    }

    /// Whether a fault waits on the descriptor, waiting up to `timeout_ns` (below 1 s). A
    /// zero timeout checks without taking the descriptor's wait-queue lock (a `read` takes
    /// it, and the faulting thread needs it to queue its fault).
    fn pending(&self, timeout_ns: i64) -> bool {
        let fd = self.uffd.as_fd();
        let mut pfd = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let ts = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: timeout_ns,
        };
        rustix::event::poll(&mut pfd, Some(&ts)).unwrap_or(0) > 0
    }

    /// Serves a fault read by thread `me`, or hands it to the fault thread on the faulting
    /// thread's CPU.
    fn route(&self, me: usize, ev: Event) {
        // Fork, remap, remove and unmap events are not requested; only page faults come.
        let Event::Pagefault {
            kind,
            addr,
            write,
            tid,
        } = ev
        else {
            return;
        };
        let f = Fault { kind, addr, write };
        let owner =
            crate::cpu::cpu_of(tid).and_then(|c| self.thread_on_cpu.get(c).copied().flatten());
        if let Some(j) = owner {
            let m = &self.mail[j];
            if j != me && m.spinning.load(Acquire) && !m.busy.load(Acquire) {
                {
                    // The count moves with the queue, under its lock.
                    let mut q = m.queue.lock();
                    q.push_back((f, Instant::now()));
                    m.len.fetch_add(1, AcqRel);
                }
                self.counters.handed_over.fetch_add(1, Relaxed);
                return;
            }
        }
        self.fault(me, f);
    }

    fn fault(&self, me: usize, f: Fault) {
        let Fault { kind, addr, write } = f;
        let Some(core) = self.region_of(addr) else {
            // Unmapped meanwhile: nothing to serve; never leave a thread asleep.
            let pa = addr & !4095;
            let _ = self.uffd.wake(pa, 4096);
            return;
        };
        match kind {
            FaultKind::Missing => self.on_missing(&core, addr, write, &self.mail[me].busy),
            FaultKind::WriteProtected => self.on_wp(&core, addr),
            // Not registered for minor faults.
            FaultKind::Minor => {}
        }
    }

    /// Makes room for `pages` more resident pages: wakes the evictor past the high watermark,
    /// and evicts here when the budget itself would be passed.
    fn make_room(&self, pages: u64) {
        let want = self.resident.load(Relaxed) + pages * self.page as u64;
        if want > self.high {
            *self.kick.lock() = true;
            self.kick_cv.notify_one();
        }
        if want > self.budget {
            self.counters.sync_evictions.fetch_add(1, Relaxed);
            let target = self.budget.saturating_sub(pages * self.page as u64);
            self.evict_to(target.min(self.low));
        }
    }

    fn charge(&self, bytes: u64) {
        let now = self.resident.fetch_add(bytes, Relaxed) + bytes;
        self.counters.peak_resident.fetch_max(now, Relaxed);
    }

    /// Reads a page from the store; None when its region was unmapped meanwhile (its pages
    /// left the store). Any other failure stops the program: it must not see wrong data.
    fn read_page(&self, core: &RegionCore, idx: usize) -> Option<Vec<u8>> {
        let r = self.store.get_uncached((core.obj, idx as u64));
        if !matches!(r, Ok(Some(_))) && core.st.lock().dead {
            return None;
        }
        match r {
            Ok(Some(mut v)) => {
                v.resize(self.page, 0);
                Some(v)
            }
            Ok(None) => fatal(&format!(
                "page {idx} of region {} is missing from the store",
                core.obj
            )),
            Err(e) => fatal(&format!(
                "cannot read page {idx} of region {} from the store: {e}",
                core.obj
            )),
        }
    }

    /// Serves a missing fault; `busy` is raised while the store read is waited for.
    fn on_missing(&self, core: &Arc<RegionCore>, addr: usize, write: bool, busy: &AtomicBool) {
        let page = self.page;
        let idx = (addr - core.base) / page;
        let pa = core.base + idx * page;
        self.counters.faults.fetch_add(1, Relaxed);
        let entered = Instant::now();
        self.make_room(1);
        let mut st = core.st.lock();
        match st.pages[idx] {
            PageState::Resident => {
                drop(st);
                let _ = self.uffd.wake(pa, page);
                return;
            }
            // Whoever is loading it wakes the waiters; a program that caught up with a
            // prefetch pushes the stream's frontier further.
            PageState::Loading => {
                let pf = self.stream(&mut st, idx);
                drop(st);
                self.prefetch(core, pf);
                return;
            }
            PageState::Evicting => return,
            PageState::Zero => {
                self.charge(page as u64);
                // A private zero-filled page rather than the shared zero page: it can be
                // write-protected atomically (tracked clean on a read) and a write does not
                // take one copy-on-write fault per 4 KiB afterwards.
                let tracked = self.place(pa, &self.zeros, !write);
                self.counters.zero_fills.fetch_add(1, Relaxed);
                self.mark_resident(core, &mut st, idx, PageState::Zero, !tracked);
                let pf = self.stream(&mut st, idx);
                drop(st);
                let _ = self.uffd.wake(pa, page);
                self.prefetch(core, pf);
                return;
            }
            PageState::Stored => {}
        }
        st.pages[idx] = PageState::Loading;
        self.charge(page as u64);
        drop(st);
        let t0 = Instant::now();
        busy.store(true, Release);
        let data = self.read_page(core, idx);
        busy.store(false, Release);
        let Some(data) = data else {
            self.resident.fetch_sub(page as u64, Relaxed);
            return;
        };
        let c = &self.counters;
        c.store_reads.fetch_add(1, Relaxed);
        c.store_read_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        self.counters.bytes_in.fetch_add(page as u64, Relaxed);
        let tracked = self.place(pa, &data, !write);
        let mut st = core.st.lock();
        if st.dead {
            drop(st);
            self.resident.fetch_sub(page as u64, Relaxed);
            return;
        }
        self.mark_resident(core, &mut st, idx, PageState::Stored, !tracked);
        let pf = self.stream(&mut st, idx);
        drop(st);
        // Timed up to the wake-up call: the woken thread, on this CPU, usually runs at once,
        // so the call itself returns only when the program faults again.
        self.counters
            .store_fault_ns
            .fetch_add(entered.elapsed().as_nanos() as u64, Relaxed);
        let _ = self.uffd.wake(pa, page);
        self.prefetch(core, pf);
    }

    /// Copies one page into place without waking, write-protected in the same step when
    /// `protect` (so the first write is seen, even from a thread that was not waiting on this
    /// page). Returns whether the page is write-protected (tracked clean).
    fn place(&self, pa: usize, data: &[u8], protect: bool) -> bool {
        let page = self.page;
        match self.uffd.copy(data, pa, protect) {
            Ok(()) => protect,
            Err(_) => {
                // Part of the range exists already (or the region is being unmapped): copy
                // 4 KiB at a time, ignoring what exists, and count the page dirty.
                for off in (0..page).step_by(4096) {
                    let _ = self.uffd.copy(&data[off..off + 4096], pa + off, false);
                }
                false
            }
        }
    }

    fn mark_resident(
        &self,
        core: &Arc<RegionCore>,
        st: &mut RState,
        idx: usize,
        backed: PageState,
        dirty: bool,
    ) {
        st.pages[idx] = PageState::Resident;
        st.backed[idx] = backed;
        st.dirty[idx] = dirty;
        st.resident += self.page as u64;
        if !st.queued[idx] {
            st.queued[idx] = true;
            self.clock
                .lock()
                .push_back((Arc::downgrade(core), idx as u32));
        }
    }

    /// Follows the fault streams of the region; returns the pages to prefetch.
    ///
    /// A stream is a run of faults with a constant stride. A fault that continues it (at any
    /// page up to one stride past its prefetch frontier, including a page still being
    /// prefetched: the program has caught up with the reads) doubles the window and moves the
    /// frontier to `window` strides past the fault, so reads stay in flight ahead of the
    /// program instead of starting only when it reaches the end of the last window.
    fn stream(&self, st: &mut RState, idx: usize) -> Vec<usize> {
        let i = idx as i64;
        st.tick += 1;
        let tick = st.tick;
        let npages = st.pages.len() as i64;
        let max_window = ((PREFETCH_BYTES / self.page) as u64)
            .max(16)
            .min((self.budget / self.page as u64 / 8).max(1));
        let continues = |s: &Stream| {
            if s.used == 0 || s.stride == 0 {
                return false;
            }
            let d = i - s.last;
            let sign = s.stride.signum();
            d != 0
                && d.signum() == sign
                && d % s.stride == 0
                && (i - s.ahead) * sign <= s.stride.abs()
        };
        if let Some(s) = st.streams.iter_mut().find(|s| continues(s)) {
            s.hits += 1;
            s.used = tick;
            let sign = s.stride.signum();
            // Pages the program went through without a fault were prefetched ones.
            let passed = ((i - s.last) / s.stride - 1).max(0) as u64;
            self.counters.prefetch_hits.fetch_add(passed, Relaxed);
            s.last = i;
            if s.stride != 1 && s.hits < 2 {
                s.ahead = i;
                return Vec::new();
            }
            s.window = (s.window * 2).clamp(1, max_window);
            let target = i + s.stride * s.window as i64;
            let mut p = if (s.ahead - i) * sign > 0 { s.ahead } else { i } + s.stride;
            let mut out = Vec::new();
            while (target - p) * sign >= 0 && p >= 0 && p < npages {
                out.push(p as usize);
                s.ahead = p;
                p += s.stride;
            }
            return out;
        }
        // Near a stream's last fault: a (new) stride.
        if let Some(s) = st
            .streams
            .iter_mut()
            .find(|s| s.used > 0 && s.last != i && (i - s.last).abs() <= MAX_STRIDE)
        {
            s.stride = i - s.last;
            s.last = i;
            s.ahead = i;
            s.hits = 0;
            s.window = 1;
            s.used = tick;
            return Vec::new();
        }
        // A new stream in the least recently used slot.
        if let Some(s) = st.streams.iter_mut().min_by_key(|s| s.used) {
            *s = Stream {
                last: i,
                stride: 0,
                ahead: i,
                hits: 0,
                window: 1,
                used: tick,
            };
        }
        Vec::new()
    }

    /// Maps the given pages ahead of a fault stream: read from the store outside the lock,
    /// write-protected (clean), waking anybody who faulted on them meanwhile.
    fn prefetch(&self, core: &Arc<RegionCore>, pages: Vec<usize>) {
        if pages.is_empty() {
            return;
        }
        // Only while there is room under the high watermark; prefetch never forces eviction.
        let room = self.high.saturating_sub(self.resident.load(Relaxed)) / self.page as u64;
        let mut zeros = Vec::new();
        let mut stored = Vec::new();
        {
            let mut st = core.st.lock();
            for &j in pages.iter().take(room as usize) {
                match st.pages[j] {
                    PageState::Zero => zeros.push(j),
                    PageState::Stored => stored.push(j),
                    _ => continue,
                }
                st.pages[j] = PageState::Loading;
            }
            self.charge((zeros.len() + stored.len()) as u64 * self.page as u64);
        }
        // Zero pages at once, left writable (a stream that writes them takes no second
        // fault; if they stay all-zero, eviction drops them without a write).
        for &j in &zeros {
            let _ = self.place(core.base + j * self.page, &self.zeros, false);
        }
        self.finish_loads(core, &zeros, PageState::Zero, &vec![false; zeros.len()]);
        // Pages in the store: read in parallel by the prefetch threads.
        let tx = self.prefetch_tx.lock().clone();
        for j in stored {
            let job = PrefetchJob {
                core: core.clone(),
                idx: j,
            };
            let job = match &tx {
                Some(tx) => match tx.send(job) {
                    Ok(()) => continue,
                    Err(e) => e.0,
                },
                None => job,
            };
            self.load_one(job);
        }
    }

    /// Reads one page of a prefetch from the store and maps it, write-protected (clean).
    fn load_one(&self, job: PrefetchJob) {
        let pa = job.core.base + job.idx * self.page;
        let Some(data) = self.read_page(&job.core, job.idx) else {
            self.resident.fetch_sub(self.page as u64, Relaxed);
            return;
        };
        self.counters.bytes_in.fetch_add(self.page as u64, Relaxed);
        // Each page mapped writable spends heat; each write-protect fault adds two. A stream
        // that writes everything settles at two writable pages in three; one that stops
        // writing is back to tracked (clean) pages within a few dozen pages.
        let heat = job.core.write_heat.load(Relaxed);
        let protect = heat < WRITE_HEAT_ON;
        if !protect {
            job.core.write_heat.store(heat - 1, Relaxed);
        }
        let tracked = self.place(pa, &data, protect);
        self.finish_loads(&job.core, &[job.idx], PageState::Stored, &[tracked]);
    }

    /// Marks loaded pages resident (or undoes the charge if the region went away) and wakes
    /// anybody who faulted on them meanwhile.
    fn finish_loads(
        &self,
        core: &Arc<RegionCore>,
        idxs: &[usize],
        was: PageState,
        tracked: &[bool],
    ) {
        if idxs.is_empty() {
            return;
        }
        let page = self.page;
        let mut st = core.st.lock();
        if st.dead {
            drop(st);
            self.resident
                .fetch_sub(idxs.len() as u64 * page as u64, Relaxed);
            return;
        }
        for (&j, &t) in idxs.iter().zip(tracked) {
            self.mark_resident(core, &mut st, j, was, !t);
        }
        drop(st);
        self.counters
            .prefetched
            .fetch_add(idxs.len() as u64, Relaxed);
        for &j in idxs {
            let _ = self.uffd.wake(core.base + j * page, page);
        }
    }

    fn prefetcher(&self, rx: &Mutex<std::sync::mpsc::Receiver<PrefetchJob>>) {
        while !self.stop.load(Relaxed) {
            let job = rx.lock().recv_timeout(Duration::from_millis(50));
            match job {
                Ok(job) => self.load_one(job),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn on_wp(&self, core: &Arc<RegionCore>, addr: usize) {
        self.counters.wp_faults.fetch_add(1, Relaxed);
        let idx = (addr - core.base) / self.page;
        let pa = core.base + idx * self.page;
        let mut st = core.st.lock();
        match st.pages[idx] {
            PageState::Resident => {
                st.dirty[idx] = true;
                let h = core.write_heat.load(Relaxed);
                core.write_heat.store((h + 2).min(WRITE_HEAT_MAX), Relaxed);
                let _ = self.uffd.remove_write_protection(pa, self.page, true);
            }
            // The eviction wakes the writer once the page is gone; it then faults it back.
            PageState::Evicting | PageState::Loading => {}
            _ => {
                drop(st);
                let _ = self.uffd.wake(pa, self.page);
            }
        }
    }

    fn evictor(&self) {
        while !self.stop.load(Relaxed) {
            {
                let mut k = self.kick.lock();
                if !*k {
                    self.kick_cv.wait_for(&mut k, Duration::from_millis(20));
                }
                *k = false;
            }
            if self.resident.load(Relaxed) > self.high {
                self.evict_to(self.low);
            }
        }
    }

    /// Evicts in clock order until resident bytes are at most `target` (or nothing is left to
    /// evict).
    fn evict_to(&self, target: u64) {
        let page = self.page;
        while self.resident.load(Relaxed) > target {
            let mut batch: Vec<(Arc<RegionCore>, u32)> = Vec::new();
            {
                let mut clock = self.clock.lock();
                let need = (self.resident.load(Relaxed) - target).div_ceil(page as u64) as usize;
                while batch.len() < need.min(EVICT_BATCH) {
                    let Some((w, i)) = clock.pop_front() else {
                        break;
                    };
                    if let Some(c) = w.upgrade() {
                        batch.push((c, i));
                    }
                }
            }
            if batch.is_empty() {
                return;
            }
            // Group by region, pages in order (for runs of adjacent pages).
            batch.sort_by_key(|(c, i)| (c.base, *i));
            let mut start = 0;
            while start < batch.len() {
                let mut end = start + 1;
                while end < batch.len() && Arc::ptr_eq(&batch[end].0, &batch[start].0) {
                    end += 1;
                }
                let core = batch[start].0.clone();
                let idxs: Vec<usize> = batch[start..end].iter().map(|(_, i)| *i as usize).collect();
                self.evict_pages(&core, &idxs);
                start = end;
            }
        }
    }

    fn evict_pages(&self, core: &Arc<RegionCore>, idxs: &[usize]) {
        let page = self.page;
        // Phase 1, under the lock: choose, and write-protect the dirty ones.
        let mut clean = Vec::new();
        let mut dirty = Vec::new();
        {
            let mut st = core.st.lock();
            if st.dead {
                return;
            }
            core.inflight.fetch_add(1, AcqRel);
            let mut cand = Vec::new();
            for &i in idxs {
                st.queued[i] = false;
                if st.pages[i] != PageState::Resident {
                    continue;
                }
                if !st.dirty[i] {
                    st.pages[i] = PageState::Evicting;
                    clean.push(i);
                } else {
                    cand.push(i);
                }
            }
            // Dirty victims are write-protected one run of adjacent pages at a time: one
            // ioctl (and one TLB shootdown) per run, not per page.
            for (a, n) in runs(&cand) {
                let pa = core.base + a * page;
                if self.uffd.write_protect(pa, n * page).is_ok() {
                    for i in a..a + n {
                        st.pages[i] = PageState::Evicting;
                        dirty.push(i);
                    }
                } else {
                    // Cannot stop writers: keep them.
                    for i in a..a + n {
                        st.queued[i] = true;
                        self.clock
                            .lock()
                            .push_back((Arc::downgrade(core), i as u32));
                    }
                }
            }
        }
        /// Ends the eviction's hold on the mapping, however the function returns.
        struct Hold<'a>(&'a AtomicU64);
        impl Drop for Hold<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, AcqRel);
            }
        }
        let _hold = Hold(&core.inflight);
        // Phase 2, no lock: write the dirty pages out (writers wait on the protection).
        let mut written = Vec::with_capacity(dirty.len());
        for &i in &dirty {
            let pa = core.base + i * page;
            // SAFETY: the page is resident and write-protected (state Evicting): no one
            // writes it and the mapping stays until the region's drop, which marks the state
            // dead first (checked below before the result is used).
            let bytes = unsafe { std::slice::from_raw_parts(pa as *const u8, page) };
            if bytes.iter().all(|&b| b == 0) {
                let _ = self.store.remove((core.obj, i as u64));
                written.push((i, Some(PageState::Zero)));
            } else {
                match self.store.put((core.obj, i as u64), bytes) {
                    Ok(()) => {
                        self.counters.bytes_out.fetch_add(page as u64, Relaxed);
                        written.push((i, Some(PageState::Stored)));
                    }
                    Err(e) => {
                        self.fail(format!(
                            "cannot write a page out ({e}); it stays in DRAM over the budget"
                        ));
                        written.push((i, None));
                    }
                }
            }
        }
        // Phase 3: the pages leave the mapping in one batched call, outside the lock (they
        // stay `Evicting` meanwhile: a fault on one waits for the wake-up below); then the
        // final states under the lock.
        let mut gone: Vec<usize> = Vec::with_capacity(idxs.len());
        {
            let mut st = core.st.lock();
            if st.dead {
                for &(i, s) in &written {
                    if s == Some(PageState::Stored) {
                        let _ = self.store.remove((core.obj, i as u64));
                    }
                }
                return;
            }
            if !clean.is_empty() {
                let h = core.write_heat.load(Relaxed);
                core.write_heat
                    .store(h.saturating_sub(clean.len() as u32), Relaxed);
            }
            gone.extend_from_slice(&clean);
            for &(i, s) in &written {
                if s.is_some() {
                    gone.push(i);
                } else {
                    st.pages[i] = PageState::Resident;
                    st.queued[i] = true;
                    self.clock
                        .lock()
                        .push_back((Arc::downgrade(core), i as u32));
                }
            }
        }
        gone.sort_unstable();
        let ranges: Vec<(usize, usize)> = runs(&gone)
            .into_iter()
            .map(|(a, n)| (core.base + a * page, n * page))
            .collect();
        self.zapper.zap(&ranges);
        self.counters.madvise_calls.fetch_add(1, Relaxed);
        {
            let mut st = core.st.lock();
            if st.dead {
                return;
            }
            for &i in &clean {
                st.pages[i] = st.backed[i];
                self.counters.clean_drops.fetch_add(1, Relaxed);
            }
            for &(i, s) in &written {
                if let Some(s) = s {
                    if s == PageState::Zero {
                        self.counters.zero_evictions.fetch_add(1, Relaxed);
                    }
                    st.pages[i] = s;
                }
            }
            st.resident -= gone.len() as u64 * page as u64;
            self.resident
                .fetch_sub(gone.len() as u64 * page as u64, Relaxed);
            self.counters
                .evictions
                .fetch_add(gone.len() as u64, Relaxed);
        }
        // Writers blocked on the protection retry and fault the page back in.
        for &(a, n) in &ranges {
            let _ = self.uffd.wake(a, n);
        }
    }
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

/// Drops pages of this process's own mappings (`MADV_DONTNEED`).
struct Zapper {
    /// A pidfd of this process for `process_madvise`, whose vector of ranges costs one TLB
    /// flush in all (one `madvise` per scattered page costs one flush, an IPI to every CPU
    /// running the program, each: 15 us a page measured here); None where the kernel has no
    /// `process_madvise(MADV_DONTNEED)` (before 5.10, or refused).
    pidfd: Option<std::os::fd::OwnedFd>,
    vectored: AtomicBool,
}

impl Zapper {
    fn new() -> Zapper {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
        let pidfd = (fd >= 0).then(|| {
            use std::os::fd::FromRawFd;
            // SAFETY: `fd` is a descriptor we just opened and own.
            unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) }
        });
        Zapper {
            vectored: AtomicBool::new(pidfd.is_some()),
            pidfd,
        }
    }

    /// Drops `(address, length)` ranges of our mappings; their contents must be saved.
    fn zap(&self, ranges: &[(usize, usize)]) {
        const IOV_MAX: usize = 1024;
        if let (Some(fd), true) = (&self.pidfd, self.vectored.load(Relaxed)) {
            use std::os::fd::AsRawFd;
            let mut ok = true;
            for chunk in ranges.chunks(IOV_MAX) {
                let iov: Vec<libc::iovec> = chunk
                    .iter()
                    .map(|&(a, n)| libc::iovec {
                        iov_base: a as *mut _,
                        iov_len: n,
                    })
                    .collect();
                let want: usize = chunk.iter().map(|&(_, n)| n).sum();
                // SAFETY: process_madvise reads `iov.len()` iovecs describing ranges of our
                // own mappings, whose contents the caller saved; it changes no memory of ours
                // other than dropping those pages.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_process_madvise,
                        fd.as_raw_fd(),
                        iov.as_ptr(),
                        iov.len(),
                        libc::MADV_DONTNEED,
                        0,
                    )
                };
                if r < 0 || r as usize != want {
                    ok = false;
                    break;
                }
            }
            if ok {
                return;
            }
            // Not supported here (or partly done): per-range madvise is idempotent.
            self.vectored.store(false, Relaxed);
        }
        for &(a, n) in ranges {
            // SAFETY: the range lies in one of our mappings and its contents were saved.
            let _ =
                unsafe { rustix::mm::madvise(a as *mut _, n, rustix::mm::Advice::LinuxDontNeed) };
        }
    }
}

/// Runs of adjacent numbers in a sorted list: (first, count).
fn runs(v: &[usize]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i + 1;
        while j < v.len() && v[j] == v[j - 1] + 1 {
            j += 1;
        }
        out.push((v[i], j - i));
        i = j;
    }
    out
}
