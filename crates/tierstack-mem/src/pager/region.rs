//! Regions: anonymous mappings registered with the pager's userfaultfd, their page states,
//! mapping (`map_region`), discarding and unmapping.

use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;
use tierstack_store::TieredStore;

use super::page::PageState;
use super::sweep::{ideal_pages, Pass, PassTrack};
use super::{Inner, Pager, PagerOptions, RegionOptions};
use crate::{MemCounters, MemError, Result};

/// Write heat at which prefetched pages are mapped writable, and its ceiling.
pub(super) const WRITE_HEAT_ON: u32 = 16;
pub(super) const WRITE_HEAT_MAX: u32 = 64;
/// Store object ids of regions: unique in the process, so pagers may share a store.
static NEXT_OBJ: AtomicU64 = AtomicU64::new(1);

/// Fault streams remembered per region.
pub(super) const STREAMS: usize = 4;

/// A fault stream of a region, followed by `readahead` (see `Inner::stream`).
#[derive(Clone, Copy, Default)]
pub(super) struct Stream {
    /// Page of the last fault of the stream.
    pub(super) last: i64,
    pub(super) stride: i64,
    /// Last page prefetched (or faulted) along the stream: the prefetch frontier.
    pub(super) ahead: i64,
    /// Consecutive faults that followed the stride.
    pub(super) hits: u32,
    pub(super) window: u64,
    pub(super) used: u64,
}

pub(super) struct RState {
    pub(super) pages: Vec<PageState>,
    /// For a resident page: written since it came in.
    pub(super) dirty: Vec<bool>,
    /// For a resident page: what the store holds for it while it is clean (Zero or Stored).
    pub(super) backed: Vec<PageState>,
    /// In the clock queue.
    pub(super) queued: Vec<bool>,
    /// The page was changed during its last stay in memory (written out with new contents
    /// at its eviction). Read back, it is mapped writable and hashed rather than
    /// write-protected: a page a program wrote is likely written again (a state vector that
    /// every gate updates), and its first write then costs no write-protect fault.
    pub(super) wrote: Vec<bool>,
    /// Resident pages mapped writable although they may never be written (along a stream
    /// that writes): the hash of the contents the store holds for them. Eviction
    /// write-protects them like dirty pages, compares, and drops an unchanged one without a
    /// write: no write-protect fault on the program's path, no needless write-back.
    pub(super) hashes: std::collections::HashMap<u32, u128>,
    pub(super) resident: u64,
    pub(super) streams: [Stream; STREAMS],
    pub(super) tick: u64,
    /// The last fault continued a forward sequential stream (set by `stream`).
    pub(super) sequential: bool,
    /// Pages loaded along fault streams, less [`SWEEP_DECAY`] for each fault that followed
    /// none (capped at twice the budget): past the budget in pages, the region is being
    /// swept in a loop larger than memory (see [`RState::sweeping`]).
    pub(super) swept: u64,
    /// Set once `swept` reaches the budget in pages, cleared once it falls under half of it
    /// (so that the few faults that restart a stream at each pass do not end a sweep).
    pub(super) sweep_on: bool,
    /// The current pass of a loop over the region and what it moved (see `sweep.rs`).
    pub(super) pass: PassTrack,
    /// Per page, the number of the pass that last brought it in (`PassTrack::loaded`).
    pub(super) pass_stamps: Vec<u16>,
    /// The region was unmapped; late fault and eviction work undoes itself.
    pub(super) dead: bool,
}

/// Pages a fault that follows no stream takes off [`RState::swept`].
pub(super) const SWEEP_DECAY: u64 = 8;

impl RState {
    /// Whether the region is swept by streams that load more than the whole budget: a loop
    /// over more memory than there is. Its pages then queue for eviction behind the streams
    /// (most recently loaded first out, after a lag), so the part of the loop that stays
    /// resident is read from DRAM on every pass instead of each pass evicting the pages the
    /// next one needs first (as a FIFO or LRU does for a loop larger than memory).
    pub(super) fn sweeping(&self) -> bool {
        self.sweep_on
    }

    /// Counts `loaded` pages brought in along a stream, or (None) a fault that followed no
    /// stream, and sets or clears [`RState::sweeping`] against the budget in pages.
    pub(super) fn note_sweep(&mut self, loaded: Option<u64>, budget_pages: u64) {
        self.swept = match loaded {
            Some(n) => (self.swept + n).min(2 * budget_pages),
            None => self.swept.saturating_sub(SWEEP_DECAY),
        };
        if self.swept >= budget_pages {
            self.sweep_on = true;
        } else if self.swept < budget_pages / 2 {
            self.sweep_on = false;
        }
    }

    /// Follows the passes of a loop over the region with a fault at page `idx` (see
    /// `sweep::begins_pass`); returns the pass it ended if the region is being swept (a
    /// region that is not swept in a loop larger than memory has no passes to report).
    /// `jump`: the fault follows none of the region's streams.
    pub(super) fn note_pass(
        &mut self,
        idx: usize,
        jump: bool,
        budget_pages: u64,
        page: u64,
    ) -> Option<Pass> {
        let npages = self.pages.len();
        let ended = self.pass.fault(
            &self.pass_stamps,
            idx,
            jump,
            ideal_pages(npages, budget_pages),
            page,
        )?;
        self.sweeping().then_some(ended)
    }
}

pub(super) struct RegionCore {
    /// How much the region is being written: +2 for each write-protect fault and for each
    /// hashed page found changed at eviction, -1 for each page evicted unchanged. While it is
    /// at least [`WRITE_HEAT_ON`], pages read from the store are mapped writable and hashed
    /// (see [`RState::hashes`]) instead of write-protected.
    pub(super) write_heat: std::sync::atomic::AtomicU32,
    /// Evictions reading this region's pages outside the lock; drop waits for them.
    pub(super) inflight: AtomicU64,
    pub(super) obj: u64,
    pub(super) base: usize,
    pub(super) len: usize,
    pub(super) st: Mutex<RState>,
}

impl RegionCore {
    /// Whether pages `idxs` read from the store are mapped writable and hashed rather than
    /// write-protected: while the region is hot, or, while it has any write heat left, where
    /// one of them was changed during its last stay in memory (a program that stopped
    /// writing cools the region within a few dozen evictions, and its pages go back to being
    /// tracked). `st` is this region's state, locked by the caller.
    pub(super) fn writable(&self, st: &RState, idxs: &[usize]) -> bool {
        let heat = self.write_heat.load(Relaxed);
        heat >= WRITE_HEAT_ON
            || heat > 0
                && idxs
                    .iter()
                    .any(|&j| st.wrote.get(j).copied().unwrap_or(false))
    }

    /// As [`RegionCore::writable`], taking the region's lock (only when the heat leaves the
    /// answer to the pages' history).
    pub(super) fn map_writable(&self, idxs: &[usize]) -> bool {
        let heat = self.write_heat.load(Relaxed);
        heat >= WRITE_HEAT_ON || heat > 0 && self.writable(&self.st.lock(), idxs)
    }
}

/// A mapping paged by a [`Pager`]. Dropping it unmaps it and removes its pages from the store.
pub struct Region {
    core: Arc<RegionCore>,
    inner: Arc<Inner>,
    /// A stand-alone region owns its pager (dropped after the region).
    _own: Option<Pager>,
}

pub(super) fn map_region(
    inner: &Arc<Inner>,
    len: usize,
    align: usize,
    hint: usize,
    own: Option<Pager>,
) -> Result<Region> {
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
    // With an address hint (where the program asked for it), the kernel's page alignment.
    let align = if hint != 0 { 4096 } else { align.max(4096) };
    let extra = if align > 4096 { align } else { 0 };
    // SAFETY: a fresh private anonymous mapping at an address the kernel chooses; nothing else
    // refers to it until this function returns it.
    let raw = unsafe {
        rustix::mm::mmap_anonymous(
            hint as *mut _,
            len + extra,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE,
        )
    };
    let raw = match raw {
        Ok(p) => p as usize,
        Err(e) => {
            uncommit();
            return Err(MemError::Map(e.into()));
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
        // Huge pages would defeat the page-sized faulting and eviction. A child made by
        // `fork` inherits the mapping (the kernel copies resident pages; the others it must
        // page itself: see `Pager::adopt`).
        let _ = rustix::mm::madvise(base as *mut _, len, rustix::mm::Advice::LinuxNoHugepage);
    }
    // `[anon:tierstack-paged]` in smaps: the resident pages of the program's paged memory.
    tierstack_common::process::name_mapping(
        base,
        len,
        tierstack_common::process::mapping_names::PAGED,
    );
    if let Err(e) = inner
        .uffd
        .register(base, len, crate::uffd::MODE_MISSING | crate::uffd::MODE_WP)
    {
        // SAFETY: unmapping the mapping created above, which nobody else uses yet.
        let _ = unsafe { rustix::mm::munmap(base as *mut _, len) };
        uncommit();
        return Err(MemError::Uffd {
            what: "register",
            source: e,
        });
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
            wrote: vec![false; npages],
            hashes: std::collections::HashMap::new(),
            resident: 0,
            streams: [Stream::default(); STREAMS],
            tick: 0,
            sequential: false,
            swept: 0,
            sweep_on: false,
            pass: PassTrack::default(),
            pass_stamps: vec![0; npages],
            dead: false,
        }),
    });
    Ok(install(inner, core, own))
}

/// Enters a new region's core in the pager's table and makes its handle.
fn install(inner: &Arc<Inner>, core: Arc<RegionCore>, own: Option<Pager>) -> Region {
    inner.regions.write().insert(core.base, core.clone());
    inner.counters.regions.fetch_add(1, Relaxed);
    Region {
        core,
        inner: inner.clone(),
        _own: own,
    }
}

/// See [`Pager::adopt`].
pub(super) fn adopt_region(inner: &Arc<Inner>, old: &Region) -> Result<Region> {
    let page = inner.page;
    if old.inner.page != page {
        return Err(MemError::Config(format!(
            "cannot adopt a region of {} KiB pages into a pager of {} KiB pages",
            old.inner.page / 1024,
            page / 1024
        )));
    }
    let oc = &old.core;
    let (base, len) = (oc.base, oc.len);
    inner
        .uffd
        .register(base, len, crate::uffd::MODE_MISSING | crate::uffd::MODE_WP)
        .map_err(|e| MemError::Uffd {
            what: "register",
            source: e,
        })?;
    let mut st = {
        let o = oc.st.lock();
        RState {
            pages: o.pages.clone(),
            dirty: o.dirty.clone(),
            backed: o.backed.clone(),
            queued: vec![false; o.pages.len()],
            wrote: o.wrote.clone(),
            // The child's store copy is its own: its writable pages count as dirty.
            hashes: std::collections::HashMap::new(),
            resident: 0,
            streams: [Stream::default(); STREAMS],
            tick: 0,
            sequential: false,
            swept: 0,
            sweep_on: false,
            pass: PassTrack::default(),
            pass_stamps: vec![0; o.pages.len()],
            dead: false,
        }
    };
    let mut resident_idx = Vec::new();
    for (i, s) in st.pages.iter_mut().enumerate() {
        match *s {
            PageState::Resident => resident_idx.push(i),
            // The parent's pager was paused between units of work: nothing was in flight.
            // Should one be, the child's copy of the page is what it holds now: resident,
            // and counted dirty so that it is written before it is dropped.
            PageState::Loading | PageState::Evicting => {
                *s = PageState::Resident;
                st.dirty[i] = true;
                resident_idx.push(i);
            }
            _ => {}
        }
    }
    // Clean pages are tracked again: write-protected, so the first write is seen. Where that
    // fails they count as dirty (written out before they are dropped).
    for (a, n) in super::page::runs(&resident_idx) {
        if inner.uffd.write_protect(base + a * page, n * page).is_err() {
            for i in a..a + n {
                st.dirty[i] = true;
            }
        }
    }
    if inner.wp_async {
        // Under async write-protect eviction trusts only a page found written or a hash of
        // what the store holds, and the child knows neither: each is written out once.
        for &i in &resident_idx {
            st.dirty[i] = true;
        }
    }
    st.resident = (resident_idx.len() * page) as u64;
    *inner.committed.lock() += len as u64;
    inner.charge(st.resident);
    let core = Arc::new(RegionCore {
        write_heat: std::sync::atomic::AtomicU32::new(0),
        inflight: AtomicU64::new(0),
        obj: oc.obj,
        base,
        len,
        st: Mutex::new(st),
    });
    {
        let mut st = core.st.lock();
        let mut clock = inner.clock.lock();
        for &i in &resident_idx {
            st.queued[i] = true;
            clock.push_back((Arc::downgrade(&core), i as u32));
        }
    }
    Ok(install(inner, core, None))
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
        map_region(&inner, len, 4096, 0, Some(pager))
    }

    /// Its first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.core.base as *mut u8
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.core.len
    }

    /// Whether it has no bytes.
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

    /// The counters now, with the store's compressed tier's figures (as the pager reports).
    pub fn stats(&self) -> crate::MemStats {
        self.inner.report().stats
    }

    /// The first error of the region's pager, if any.
    pub fn error(&self) -> Option<String> {
        self.inner.failed.lock().clone()
    }

    /// Stops paging every page that `[off, off+len)` touches: the program maps something
    /// else there (`mmap(MAP_FIXED)`), which an eviction must never drop. Their copies leave
    /// the store and DRAM accounting; the pages become [`PageState::Foreign`].
    pub fn forget(&self, off: usize, len: usize) {
        let page = self.inner.page;
        let first = off / page;
        let end = (off + len).min(self.core.len).div_ceil(page);
        for i in first..end {
            // A page only partly mapped over keeps its other bytes: they must be in place
            // (not only in the store) before the page stops being paged.
            let partial = i * page < off || (i + 1) * page > off + len;
            loop {
                let mut st = self.core.st.lock();
                match st.pages[i] {
                    PageState::Loading | PageState::Evicting => {
                        drop(st);
                        std::thread::yield_now();
                        continue;
                    }
                    PageState::Resident => {
                        st.resident -= page as u64;
                        st.hashes.remove(&(i as u32));
                        self.inner.resident.fetch_sub(page as u64, Relaxed);
                        if st.backed[i] == PageState::Stored {
                            let _ = self.inner.store.remove((self.core.obj, i as u64));
                        }
                    }
                    PageState::Stored => {
                        if partial {
                            if let Some(data) = self.inner.read_page(&self.core, i) {
                                self.inner.place(self.core.base + i * page, &data, false);
                            }
                        }
                        let _ = self.inner.store.remove((self.core.obj, i as u64));
                    }
                    PageState::Zero | PageState::Foreign => {}
                }
                st.pages[i] = PageState::Foreign;
                break;
            }
        }
    }

    /// Releases the pages of `[off, off+len)` (whole pages inside it): they read as zeros
    /// afterwards and leave the store. The address range stays mapped. A page being loaded or
    /// written out is waited for (its load or eviction ends with store I/O).
    pub fn discard(&self, off: usize, len: usize) {
        let page = self.inner.page;
        let first = off.div_ceil(page);
        let end = ((off + len).min(self.core.len)) / page;
        if first >= end {
            return;
        }
        let mut i = first;
        while i < end {
            let mut st = self.core.st.lock();
            while i < end {
                match st.pages[i] {
                    PageState::Loading | PageState::Evicting => break,
                    PageState::Resident => {
                        st.resident -= page as u64;
                        st.hashes.remove(&(i as u32));
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
                    PageState::Zero | PageState::Foreign => {}
                }
                i += 1;
            }
            if i < end {
                drop(st);
                std::thread::yield_now();
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

impl Region {
    /// Zeros the bytes `[off, off+len)` of one page (a part of a page that
    /// `MADV_DONTNEED` or a fresh mapping covers), whatever the program's protection of it
    /// and wherever the page is: nothing to do for a page that reads as zeros, in the store
    /// for a page that is there, in place for a resident one. Returns false where it could
    /// not (no `/proc/self/mem`): the caller then writes the bytes itself.
    pub fn zero_part(&self, off: usize, len: usize) -> bool {
        let page = self.inner.page;
        let i = off / page;
        if len == 0 || i >= self.core.st.lock().pages.len() {
            return true;
        }
        let inpage = off - i * page;
        let len = len.min(page - inpage);
        let key = (self.core.obj, i as u64);
        loop {
            let mut st = self.core.st.lock();
            match st.pages[i] {
                PageState::Zero | PageState::Foreign => return true,
                PageState::Loading | PageState::Evicting => {
                    drop(st);
                    std::thread::yield_now();
                }
                PageState::Resident => {
                    // Present; no write protection (a write through /proc cannot wait for the
                    // pager), and dirty from now on.
                    let pa = self.core.base + i * page;
                    let _ = self.inner.uffd.remove_write_protection(pa, page, false);
                    st.dirty[i] = true;
                    return self.inner.zapper.write(pa + inpage, &vec![0u8; len]);
                }
                PageState::Stored => {
                    // Faults on the page wait while it is changed in the store.
                    st.pages[i] = PageState::Loading;
                    drop(st);
                    let data = self.inner.read_page(&self.core, i);
                    let mut st = self.core.st.lock();
                    st.pages[i] = PageState::Stored;
                    if let Some(mut d) = data {
                        d[inpage..inpage + len].fill(0);
                        if d.iter().all(|&b| b == 0) {
                            let _ = self.inner.store.remove(key);
                            st.pages[i] = PageState::Zero;
                        } else if self.inner.store.put_owned(key, d).is_err() {
                            drop(st);
                            let _ = self.inner.uffd.wake(self.core.base + i * page, page);
                            return false;
                        }
                    }
                    drop(st);
                    let _ = self.inner.uffd.wake(self.core.base + i * page, page);
                    return true;
                }
            }
        }
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
