//! tierstack-mem: memory larger than DRAM with userfaultfd.
//!
//! A [`Region`] is an anonymous mapping registered with userfaultfd (missing and
//! write-protect faults). Fault threads serve a missing page from the tiered store
//! (`UFFDIO_COPY`) or with a zero page when it was never written. When the region's resident
//! bytes pass its DRAM budget, the faulting thread evicts a batch in clock order: each victim
//! is write-protected (a writer racing the eviction blocks in a WP fault), copied out, written
//! to the store (an all-zero page is dropped instead: it comes back as a zero page), and the
//! batch is released with `MADV_DONTNEED`, coalesced into runs of adjacent pages.
//!
//! Pages are write-protected when they come in, so the first write marks them dirty; clean
//! pages are dropped on eviction without a write.
//!
//! A fault that follows the previous one (a sequential stream) maps up to 16 pages ahead.
//!
//! State of this first cut (see issue 3): the budget is per region, eviction and prefetch run
//! in the fault path, no strided prefetch, no LD_PRELOAD shim.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tierstack_store::{TieredStore, MAX_PAGE};
use userfaultfd::{Event, FaultKind, RegisterMode, Uffd, UffdBuilder};

/// Most pages mapped ahead of one sequential fault.
const PREFETCH_MAX: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum MemError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("userfaultfd: {0}")]
    Uffd(String),
    #[error("mmap: {0}")]
    Map(String),
}

pub type Result<T, E = MemError> = std::result::Result<T, E>;

/// Counters of one region.
#[derive(Debug, Default)]
pub struct MemCounters {
    pub faults: AtomicU64,
    pub zero_fills: AtomicU64,
    pub wp_faults: AtomicU64,
    pub evictions: AtomicU64,
    /// Pages mapped ahead of a sequential fault stream.
    pub prefetched: AtomicU64,
    /// Evictions of clean pages, dropped without a write.
    pub clean_drops: AtomicU64,
    pub zero_evictions: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub madvise_calls: AtomicU64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PageState {
    /// Never written, or evicted while all zero: served by a zero page.
    Zero,
    Resident,
    /// In the store.
    Stored,
}

struct State {
    pages: Vec<PageState>,
    /// For a resident page: written since it was faulted in (learned from its first
    /// write-protect fault)?
    dirty: Vec<bool>,
    /// For a resident page: what the store holds for it while it is clean (Zero or Stored).
    backed: Vec<PageState>,
    /// Page of the last missing fault, to detect sequential streams.
    last_fault: Option<usize>,
    clock: VecDeque<usize>,
    resident: u64,
}

struct Shared {
    uffd: Uffd,
    base: usize,
    len: usize,
    page: usize,
    budget: u64,
    obj: u64,
    store: Arc<TieredStore>,
    state: Mutex<State>,
    stop: AtomicBool,
    counters: MemCounters,
    /// First error a fault thread hit; the region is unusable after it.
    failed: Mutex<Option<String>>,
}

/// An anonymous region paged to the tiered store.
pub struct Region {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Options of a region.
#[derive(Debug, Clone)]
pub struct RegionOptions {
    /// Unit of faulting, eviction and I/O: a multiple of 4 KiB, at most 1 MiB.
    pub page: usize,
    /// Resident bytes allowed before eviction.
    pub budget: u64,
    pub fault_threads: usize,
    /// Store object id for this region's pages.
    pub obj: u64,
}

impl Region {
    /// Maps `len` bytes (rounded up to whole pages) backed by `store`.
    pub fn new(store: Arc<TieredStore>, len: usize, o: &RegionOptions) -> Result<Region> {
        if o.page == 0 || !o.page.is_multiple_of(4096) || o.page > MAX_PAGE {
            return Err(MemError::Config(format!(
                "page size {} is not a multiple of 4 KiB up to {} KiB",
                o.page,
                MAX_PAGE / 1024
            )));
        }
        if (o.budget as usize) < 2 * o.page {
            return Err(MemError::Config(format!(
                "budget {} is below two pages of {}",
                o.budget, o.page
            )));
        }
        let npages = len.div_ceil(o.page).max(1);
        let len = npages * o.page;
        let uffd = UffdBuilder::new()
            .close_on_exec(true)
            .non_blocking(true)
            .user_mode_only(false)
            .require_features(userfaultfd::FeatureFlags::PAGEFAULT_FLAG_WP)
            .create()
            .map_err(|e| {
                MemError::Uffd(format!(
                    "cannot create ({e}): run as root or allow /dev/userfaultfd"
                ))
            })?;
        // SAFETY: a fresh private anonymous mapping at an address the kernel chooses; nothing
        // else refers to it until this function returns it.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE,
            )
        }
        .map_err(|e| MemError::Map(e.to_string()))?;
        if let Err(e) = uffd.register_with_mode(
            base,
            len,
            RegisterMode::MISSING | RegisterMode::WRITE_PROTECT,
        ) {
            // SAFETY: unmapping the mapping created above, which nobody else uses yet.
            let _ = unsafe { rustix::mm::munmap(base, len) };
            return Err(MemError::Uffd(format!("register: {e}")));
        }
        let shared = Arc::new(Shared {
            uffd,
            base: base as usize,
            len,
            page: o.page,
            budget: o.budget,
            obj: o.obj,
            store,
            state: Mutex::new(State {
                pages: vec![PageState::Zero; npages],
                dirty: vec![false; npages],
                backed: vec![PageState::Zero; npages],
                last_fault: None,
                clock: VecDeque::new(),
                resident: 0,
            }),
            stop: AtomicBool::new(false),
            counters: MemCounters::default(),
            failed: Mutex::new(None),
        });
        let threads = (0..o.fault_threads.max(1))
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("ts-fault-{i}"))
                    .spawn(move || s.serve(i == 0))
                    .map_err(|e| MemError::Uffd(format!("cannot start fault thread: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Region { shared, threads })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.shared.base as *mut u8
    }

    pub fn len(&self) -> usize {
        self.shared.len
    }

    pub fn is_empty(&self) -> bool {
        self.shared.len == 0
    }

    /// Resident bytes now.
    pub fn resident(&self) -> u64 {
        self.shared.state.lock().resident
    }

    pub fn counters(&self) -> &MemCounters {
        &self.shared.counters
    }

    /// The first error a fault thread hit, if any.
    pub fn error(&self) -> Option<String> {
        self.shared.failed.lock().clone()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let s = &self.shared;
        let _ = s.uffd.unregister(s.base as *mut _, s.len);
        // SAFETY: the mapping was created in `new`, its fault threads have stopped and the
        // Region (the only owner of the pointer) is being dropped.
        let _ = unsafe { rustix::mm::munmap(s.base as *mut _, s.len) };
        let pages = s.state.lock().pages.len();
        for p in 0..pages {
            let _ = s.store.remove((s.obj, p as u64));
        }
    }
}

impl Shared {
    fn fail(&self, msg: String) {
        let mut f = self.failed.lock();
        if f.is_none() {
            *f = Some(msg);
        }
    }

    /// Fault thread loop. With `spin`, the thread polls the descriptor without sleeping for
    /// up to 2 ms after each fault (a sleeping thread costs a cross-CPU wake-up, 60–90 us
    /// here, per fault); then it sleeps in poll like the others.
    fn serve(&self, spin: bool) {
        let mut last_fault = std::time::Instant::now();
        while !self.stop.load(Relaxed) {
            if spin && last_fault.elapsed() < Duration::from_millis(2) {
                match self.uffd.read_event() {
                    Ok(Some(ev)) => {
                        self.handle(ev);
                        last_fault = std::time::Instant::now();
                    }
                    _ => std::hint::spin_loop(),
                }
                continue;
            }
            let ready = {
                let fd = self.uffd.as_fd();
                let mut pfd = [rustix::event::PollFd::new(
                    &fd,
                    rustix::event::PollFlags::IN,
                )];
                let ts = rustix::event::Timespec {
                    tv_sec: 0,
                    tv_nsec: 100_000_000,
                };
                rustix::event::poll(&mut pfd, Some(&ts)).unwrap_or(0)
            };
            if ready == 0 {
                continue;
            }
            match self.uffd.read_event() {
                Ok(Some(ev)) => {
                    self.handle(ev);
                    last_fault = std::time::Instant::now();
                }
                Ok(None) => {}
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }

    fn handle(&self, ev: Event) {
        // Fork, remap, remove and unmap events are not requested; only page faults come.
        let Event::Pagefault { kind, addr, rw, .. } = ev else {
            return;
        };
        let r = match kind {
            FaultKind::Missing => {
                self.on_missing(addr as usize, rw == userfaultfd::ReadWrite::Write)
            }
            FaultKind::WriteProtected => self.on_wp(addr as usize),
            // Not registered for minor faults.
            FaultKind::Minor => Ok(()),
        };
        if let Err(e) = r {
            self.fail(e);
            // Never leave the faulting thread asleep: give it a zero page.
            let pa = self.page_addr(addr as usize);
            // SAFETY: pa..pa+page lies in our registered mapping.
            let _ = unsafe { self.uffd.zeropage(pa as *mut _, self.page, true) };
        }
    }

    fn page_addr(&self, addr: usize) -> usize {
        self.base + (addr - self.base) / self.page * self.page
    }

    fn on_missing(&self, addr: usize, write: bool) -> std::result::Result<(), String> {
        let idx = (addr - self.base) / self.page;
        let pa = self.base + idx * self.page;
        let mut st = self.state.lock();
        self.counters.faults.fetch_add(1, Relaxed);
        if st.pages[idx] == PageState::Resident {
            // Another fault thread served it already.
            let _ = self.uffd.wake(pa as *mut _, self.page);
            return Ok(());
        }
        let data = if st.pages[idx] == PageState::Stored {
            self.store
                .get((self.obj, idx as u64))
                .map_err(|e| format!("store read of page {idx}: {e}"))?
        } else {
            None
        };
        match data {
            Some(mut v) => {
                v.resize(self.page, 0);
                // SAFETY: `v` holds one page; pa..pa+page is a missing page of our mapping.
                let r = unsafe {
                    self.uffd
                        .copy(v.as_ptr() as *const _, pa as *mut _, self.page, false)
                };
                if r.is_err() {
                    // EEXIST (already mapped) or a partial copy: make sure the faulting thread
                    // wakes; a still-missing page simply faults again.
                    let _ = self.uffd.wake(pa as *mut _, self.page);
                }
                self.counters.bytes_in.fetch_add(self.page as u64, Relaxed);
            }
            None => {
                // SAFETY: pa..pa+page is a missing page of our mapping.
                let _ = unsafe { self.uffd.zeropage(pa as *mut _, self.page, false) };
                self.counters.zero_fills.fetch_add(1, Relaxed);
            }
        }
        // Write-protect before waking the faulting thread, so its first write is seen (a WP
        // fault marks the page dirty). Clean pages are dropped on eviction without a write.
        // A write fault dirties the page at once: no protection, no second fault.
        let tracked = !write && self.uffd.write_protect(pa as *mut _, self.page).is_ok();
        let _ = self.uffd.wake(pa as *mut _, self.page);
        st.backed[idx] = st.pages[idx];
        st.dirty[idx] = !tracked;
        st.pages[idx] = PageState::Resident;
        st.clock.push_back(idx);
        st.resident += self.page as u64;
        // A sequential stream (this fault follows the previous page) prefetches ahead, after
        // the faulting thread was woken.
        let sequential = st.last_fault.is_some_and(|l| l + 1 == idx);
        st.last_fault = Some(idx);
        if sequential {
            let window =
                ((self.budget / self.page as u64) / 8).clamp(1, PREFETCH_MAX as u64) as usize;
            for j in idx + 1..(idx + 1 + window).min(st.pages.len()) {
                if st.pages[j] == PageState::Resident {
                    continue;
                }
                self.map_clean(&mut st, j)?;
                self.counters.prefetched.fetch_add(1, Relaxed);
            }
        }
        if st.resident > self.budget {
            self.evict(&mut st, idx)?;
        }
        Ok(())
    }

    /// Maps page `j` (not resident, nobody waiting on it) from the store or as zeros,
    /// write-protected so a later write marks it dirty.
    fn map_clean(&self, st: &mut State, j: usize) -> std::result::Result<(), String> {
        let pa = self.base + j * self.page;
        let data = if st.pages[j] == PageState::Stored {
            self.store
                .get((self.obj, j as u64))
                .map_err(|e| format!("store read of page {j}: {e}"))?
        } else {
            None
        };
        let mapped = match data {
            Some(mut v) => {
                v.resize(self.page, 0);
                self.counters.bytes_in.fetch_add(self.page as u64, Relaxed);
                // SAFETY: `v` holds one page; pa..pa+page is a missing page of our mapping.
                unsafe {
                    self.uffd
                        .copy(v.as_ptr() as *const _, pa as *mut _, self.page, false)
                }
                .is_ok()
            }
            // SAFETY: pa..pa+page is a missing page of our mapping.
            None => unsafe { self.uffd.zeropage(pa as *mut _, self.page, false) }.is_ok(),
        };
        if !mapped {
            // Raced with a fault on the same page (it will be served normally).
            return Ok(());
        }
        let tracked = self.uffd.write_protect(pa as *mut _, self.page).is_ok();
        st.backed[j] = st.pages[j];
        st.dirty[j] = !tracked;
        st.pages[j] = PageState::Resident;
        st.clock.push_back(j);
        st.resident += self.page as u64;
        Ok(())
    }

    fn on_wp(&self, addr: usize) -> std::result::Result<(), String> {
        self.counters.wp_faults.fetch_add(1, Relaxed);
        // An eviction of this page holds the state lock; once we have it, the page is either
        // gone (the writer's retry faults it back in) or resident and writable again.
        let mut st = self.state.lock();
        let pa = self.page_addr(addr);
        let idx = (pa - self.base) / self.page;
        if st.pages[idx] == PageState::Resident {
            st.dirty[idx] = true;
        }
        let _ = self
            .uffd
            .remove_write_protection(pa as *mut _, self.page, true);
        let _ = self.uffd.wake(pa as *mut _, self.page);
        Ok(())
    }

    /// Evicts down to 90 % of the budget, never the page just faulted in.
    fn evict(&self, st: &mut State, keep: usize) -> std::result::Result<(), String> {
        let target = self.budget / 10 * 9;
        let mut victims = Vec::new();
        let mut spins = st.clock.len();
        while st.resident - victims.len() as u64 * self.page as u64 > target && spins > 0 {
            spins -= 1;
            let Some(v) = st.clock.pop_front() else { break };
            if v == keep || st.pages[v] != PageState::Resident {
                if v == keep {
                    st.clock.push_back(v);
                }
                continue;
            }
            victims.push(v);
        }
        if victims.is_empty() {
            return Ok(());
        }
        victims.sort_unstable();
        for &v in &victims {
            let pa = self.base + v * self.page;
            if !st.dirty[v] {
                // Unchanged since it came in: the store (or the zero page) still has it.
                st.pages[v] = st.backed[v];
                st.resident -= self.page as u64;
                self.counters.evictions.fetch_add(1, Relaxed);
                self.counters.clean_drops.fetch_add(1, Relaxed);
                continue;
            }
            // Stop writers before reading the page out.
            self.uffd
                .write_protect(pa as *mut _, self.page)
                .map_err(|e| format!("write-protect page {v}: {e}"))?;
            // SAFETY: the page is resident and write-protected; racing writers block in a WP
            // fault that waits for the state lock we hold.
            let bytes = unsafe { std::slice::from_raw_parts(pa as *const u8, self.page) };
            if bytes.iter().all(|&b| b == 0) {
                let _ = self.store.remove((self.obj, v as u64));
                st.pages[v] = PageState::Zero;
                self.counters.zero_evictions.fetch_add(1, Relaxed);
            } else {
                self.store
                    .put((self.obj, v as u64), bytes)
                    .map_err(|e| format!("store write of page {v}: {e}"))?;
                st.pages[v] = PageState::Stored;
                self.counters.bytes_out.fetch_add(self.page as u64, Relaxed);
            }
            st.resident -= self.page as u64;
            self.counters.evictions.fetch_add(1, Relaxed);
        }
        // One MADV_DONTNEED per run of adjacent victims.
        let mut i = 0;
        while i < victims.len() {
            let mut j = i + 1;
            while j < victims.len() && victims[j] == victims[j - 1] + 1 {
                j += 1;
            }
            let pa = self.base + victims[i] * self.page;
            let n = (j - i) * self.page;
            // SAFETY: the run lies in our mapping and its contents were saved above.
            unsafe { rustix::mm::madvise(pa as *mut _, n, rustix::mm::Advice::LinuxDontNeed) }
                .map_err(|e| format!("madvise: {e}"))?;
            self.counters.madvise_calls.fetch_add(1, Relaxed);
            // Writers blocked on the write protection retry and fault the page back in.
            let _ = self.uffd.wake(pa as *mut _, n);
            i = j;
        }
        Ok(())
    }
}
