//! Eviction: the evictor thread keeps resident bytes under the high watermark, taking
//! victims in clock (FIFO) order; clean pages are dropped, dirty ones write-protected, written
//! to the store and released, each batch with one `MADV_DONTNEED` per run of adjacent pages
//! (one `process_madvise` call for all of them where the kernel has it).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::AcqRel, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use super::page::{runs, PageState};
use super::region::{RegionCore, WRITE_HEAT_MAX};
use super::Inner;

/// Victims taken from the clock at a time.
pub(super) const EVICT_BATCH: usize = 64;

/// How long after the last read-ahead the wide gap under the budget is kept.
const WIDE_FOR: Duration = Duration::from_secs(1);

impl Inner {
    /// Makes room for `pages` more resident pages: wakes the evictor past the high watermark,
    /// and evicts here when the budget itself would be passed.
    pub(super) fn make_room(&self, pages: u64) {
        let want = self.resident.load(Relaxed) + pages * self.page as u64;
        if want > self.high() {
            *self.kick.lock() = true;
            self.kick_cv.notify_one();
        }
        let cap = self.charged(self.budget);
        if want > cap {
            self.counters.sync_evictions.fetch_add(1, Relaxed);
            let target = cap.saturating_sub(pages * self.page as u64);
            self.evict_to(target.min(self.low()));
        }
    }

    /// `limit` (the budget or a watermark) less the DRAM the store's index holds: the index
    /// grows with what is paged out (about 15 to 25 MiB per GiB of 4 KiB pages, deleted
    /// pages included) and lives in the process too, so it comes out of the resident pages'
    /// share. Never below a quarter of `limit`: an index that large (a store 50 times the
    /// budget) would otherwise leave no room to page; `run --help` says so.
    pub(super) fn charged(&self, limit: u64) -> u64 {
        limit
            .saturating_sub(self.counters.index_bytes.load(Relaxed))
            .max(limit / 4)
            .max(self.page as u64)
    }

    /// The gap kept free under the budget now: wide while streams read ahead.
    fn slack(&self) -> u64 {
        if self.wide.load(Relaxed) {
            self.slack_wide
        } else {
            self.slack_narrow
        }
    }

    /// The high watermark, charged: past it the evictor runs.
    pub(super) fn high(&self) -> u64 {
        let page = self.page as u64;
        self.charged(self.budget.saturating_sub(self.slack()).max(2 * page))
    }

    /// The low watermark, charged: where the evictor stops.
    fn low(&self) -> u64 {
        let page = self.page as u64;
        self.charged(self.budget.saturating_sub(2 * self.slack()).max(page))
    }

    /// The evictor's look at each round: reads the store's index size into the counters, and
    /// keeps the wide gap for a second after the last read-ahead.
    fn observe(&self) {
        let bytes = self.store.index_bytes();
        self.counters.index_bytes.store(bytes, Relaxed);
        let now = self.counters.prefetched.load(Relaxed);
        let mut seen = self.prefetch_seen.lock();
        if now != seen.0 {
            *seen = (now, std::time::Instant::now());
        }
        self.wide.store(seen.1.elapsed() < WIDE_FOR, Relaxed);
    }

    pub(super) fn evictor(&self) {
        while !self.stop.load(Relaxed) {
            // One unit of work for `fork`, the wait included (see `serve`).
            let _in = self.gate.enter();
            self.maybe_report();
            {
                let mut k = self.kick.lock();
                if !*k {
                    self.kick_cv.wait_for(&mut k, Duration::from_millis(20));
                }
                *k = false;
            }
            // Until under the high watermark as charged after each pass: the write-back of
            // a pass may have grown the index.
            self.observe();
            let mut passes = 0;
            while self.resident.load(Relaxed) > self.high() && passes < 8 {
                self.evict_to(self.low());
                self.observe();
                passes += 1;
            }
        }
    }

    /// Pages left behind a sweep before eviction takes them: what a loop may still touch just
    /// after its streams passed (a stencil's neighbours): a sixteenth of the budget, 1 to
    /// 64 MiB.
    fn sweep_lag(&self) -> usize {
        ((self.budget / 16).clamp(1 << 20, 64 << 20) / self.page as u64) as usize
    }

    /// Evicts in clock order until resident bytes are at most `target` (or nothing is left to
    /// evict).
    fn evict_to(&self, target: u64) {
        let page = self.page;
        while self.resident.load(Relaxed) > target {
            let mut batch: Vec<(Arc<RegionCore>, u32)> = Vec::new();
            {
                let need = (self.resident.load(Relaxed) - target).div_ceil(page as u64) as usize;
                let lag = self.sweep_lag();
                // Pages behind a sweep first (see `RState::sweeping`), then clock order.
                let mut behind = self.behind.lock();
                while batch.len() < need.min(EVICT_BATCH) && behind.len() > lag {
                    let Some((w, i)) = behind.pop_front() else {
                        break;
                    };
                    if let Some(c) = w.upgrade() {
                        batch.push((c, i));
                    }
                }
                drop(behind);
                let mut clock = self.clock.lock();
                while batch.len() < need.min(EVICT_BATCH) {
                    let Some((w, i)) = clock.pop_front().or_else(|| self.behind.lock().pop_front())
                    else {
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
            // Under steady pressure this loop may run for seconds: the live figures go on.
            self.maybe_report();
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
        // Those of them whose contents the store holds (read from it).
        let mut clean_stored = Vec::new();
        // Dirty victims, with the hash of a hashed one (see `RState::hashes`).
        let mut dirty: Vec<(usize, Option<u128>)> = Vec::new();
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
                    if st.backed[i] == PageState::Stored {
                        clean_stored.push(i);
                    }
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
                        let h = st.hashes.remove(&(i as u32));
                        dirty.push((i, h));
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
        let (mut unchanged, mut changed) = (0u32, 0u32);
        // First every page's contents, and whether a hashed one is what the store holds.
        let mut pages: Vec<(usize, Vec<u8>, bool)> = Vec::with_capacity(dirty.len());
        for &(i, hash) in &dirty {
            let pa = core.base + i * page;
            let mut bytes = self.store.page_buf(page);
            bytes.resize(page, 0);
            // The page is resident and write-protected (state Evicting): no one writes it
            // and the mapping stays until the region's drop, which marks the state dead
            // first (checked below before the result is used).
            self.zapper.read(pa, &mut bytes);
            let same = hash.is_some_and(|h| super::page::page_hash(&bytes) == h);
            match hash {
                Some(_) if same => unchanged += 1,
                Some(_) => changed += 1,
                None => {}
            }
            pages.push((i, bytes, same));
        }
        // An unchanged page between pages that are written goes with them: a run of pages
        // stays one run in the store (read back with one request per drive) instead of being
        // cut into pieces at every page the stream happened not to change.
        let written_at = |k: usize| pages.get(k).is_some_and(|p: &(usize, Vec<u8>, bool)| !p.2);
        let keep_run: Vec<bool> = (0..pages.len())
            .map(|k| {
                pages[k].2
                    && k > 0
                    && pages[k - 1].0 + 1 == pages[k].0
                    && written_at(k - 1)
                    && pages.get(k + 1).is_some_and(|n| n.0 == pages[k].0 + 1)
                    && written_at(k + 1)
            })
            .collect();
        // Pages the store holds unchanged, whose copies it was handed (see below).
        let mut admitted: Vec<usize> = Vec::new();
        for (k, (i, bytes, same)) in pages.into_iter().enumerate() {
            if same && !keep_run[k] {
                // What the store holds already: dropped without a write (a copy to the
                // compressed tier, where it keeps one).
                if self.store.wants_copy((core.obj, i as u64))
                    && self.store.admit((core.obj, i as u64), &bytes).is_ok()
                {
                    admitted.push(i);
                }
                self.counters.clean_drops.fetch_add(1, Relaxed);
                written.push((i, Some(PageState::Stored), false));
                continue;
            }
            if bytes.iter().all(|&b| b == 0) {
                let _ = self.store.remove((core.obj, i as u64));
                written.push((i, Some(PageState::Zero), false));
            } else {
                match self.store.put_owned((core.obj, i as u64), bytes) {
                    Ok(()) => {
                        self.counters.bytes_out.fetch_add(page as u64, Relaxed);
                        written.push((i, Some(PageState::Stored), true));
                    }
                    Err(e) => {
                        self.fail(format!(
                            "cannot write a page out ({e}); it stays in DRAM over the budget"
                        ));
                        written.push((i, None, false));
                    }
                }
            }
        }
        // Clean victims read from the array and never written: the compressed tier (where
        // the store has one) keeps a copy when they compress, so the next fault on one is a
        // decompression instead of a drive read. A page that is `Stored` here has its current
        // version in the store; it is resident and write-protected (`Evicting`), so its
        // bytes are stable while they are read.
        for &i in &clean_stored {
            let key = (core.obj, i as u64);
            if !self.store.wants_copy(key) {
                continue;
            }
            let mut bytes = self.store.page_buf(page);
            bytes.resize(page, 0);
            self.zapper.read(core.base + i * page, &mut bytes);
            if self.store.admit(key, &bytes).is_ok() {
                admitted.push(i);
            }
        }
        if unchanged + changed > 0 {
            let h = core.write_heat.load(Relaxed);
            let h = (h + 2 * changed)
                .saturating_sub(unchanged)
                .min(WRITE_HEAT_MAX);
            core.write_heat.store(h, Relaxed);
        }
        // Phase 3: the pages leave the mapping in one batched call, outside the lock (they
        // stay `Evicting` meanwhile: a fault on one waits for the wake-up below); then the
        // final states under the lock.
        let mut gone: Vec<usize> = Vec::with_capacity(idxs.len());
        {
            let mut st = core.st.lock();
            if st.dead {
                for &(i, s, _) in &written {
                    if s == Some(PageState::Stored) {
                        let _ = self.store.remove((core.obj, i as u64));
                    }
                }
                for &i in &admitted {
                    let _ = self.store.remove((core.obj, i as u64));
                }
                return;
            }
            if !clean.is_empty() {
                let h = core.write_heat.load(Relaxed);
                core.write_heat
                    .store(h.saturating_sub(clean.len() as u32), Relaxed);
            }
            gone.extend_from_slice(&clean);
            for &(i, s, _) in &written {
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
                st.wrote[i] = false;
                self.counters.clean_drops.fetch_add(1, Relaxed);
            }
            for &(i, s, changed) in &written {
                if let Some(s) = s {
                    st.wrote[i] = changed;
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

/// Reads and drops pages of this process's own mappings.
pub(super) struct Zapper {
    /// `/proc/self/mem` of this process: reads a page whatever the program's protection of
    /// it (a runtime may `mprotect(PROT_NONE)` a page that is still to be written out).
    mem: Option<std::fs::File>,
    /// A pidfd of this process for `process_madvise`, whose vector of ranges costs one TLB
    /// flush in all (one `madvise` per scattered page costs one flush, an IPI to every CPU
    /// running the program, each: 15 us a page measured here); None where the kernel has no
    /// `process_madvise(MADV_DONTNEED)` (before 5.10, or refused).
    pidfd: Option<std::os::fd::OwnedFd>,
    vectored: AtomicBool,
}

impl Zapper {
    pub(super) fn new() -> Zapper {
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
            mem: std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("/proc/{}/mem", std::process::id()))
                .ok(),
        }
    }

    /// Writes `data` at `addr` of our own mapping, whatever the program's protection of it.
    /// The memory must be present and not write-protected by the pager: the kernel cannot
    /// wait on the userfaultfd for a write made this way. Returns whether it was written.
    pub(super) fn write(&self, addr: usize, data: &[u8]) -> bool {
        use std::os::unix::fs::FileExt;
        self.mem
            .as_ref()
            .is_some_and(|m| m.write_all_at(data, addr as u64).is_ok())
    }

    /// Copies the page at `addr` of our own mapping into `buf`.
    pub(super) fn read(&self, addr: usize, buf: &mut [u8]) {
        use std::os::unix::fs::FileExt;
        if let Some(m) = &self.mem {
            if m.read_exact_at(buf, addr as u64).is_ok() {
                return;
            }
        }
        // SAFETY: the caller's page is resident in our mapping and nobody writes it (see
        // `evict_pages`); without /proc the program's protection must allow reading it.
        let src = unsafe { std::slice::from_raw_parts(addr as *const u8, buf.len()) };
        buf.copy_from_slice(src);
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
