//! Eviction: the evictor thread keeps resident bytes under the high watermark, taking
//! victims in clock (FIFO) order; clean pages are dropped, dirty ones write-protected, written
//! to the store and released, each batch with one `MADV_DONTNEED` per run of adjacent pages
//! (one `process_madvise` call for all of them where the kernel has it).
//!
//! Under asynchronous write-protect ([`super::DirtyTracking::Async`]) a write-protected page
//! does not stop a writer, so write protection cannot hold a victim still while it is read
//! and dropped. There, each run of victims is scanned (`PAGEMAP_SCAN`: which were written)
//! and then moved out of the program's mapping with
//! `UFFDIO_MOVE` into a staging slot of the pager's own: from then on a touch of the page is
//! a missing fault that waits for the eviction, as a write-protect fault does on the other
//! path. A page found written is written out; any other is compared with the hash of what
//! the store holds for it, taken from the moved page itself: a write that landed between the
//! scan and the move is caught by the hash, so a page is never dropped as clean while it
//! holds data the store lacks. The staging slot is released with one `MADV_DONTNEED`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::AcqRel, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

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
        if want > self.charged(self.budget) {
            self.counters.sync_evictions.fetch_add(1, Relaxed);
            let bytes = pages * self.page as u64;
            self.evict_to(|s| s.charged(s.budget).saturating_sub(bytes).min(s.low()));
        }
    }

    /// `limit` (the budget or a watermark) less the DRAM the store's index holds: the index
    /// grows with what is paged out (about 15 to 25 MiB per GiB of 4 KiB pages, deleted
    /// pages included) and lives in the process too, so it comes out of the resident pages'
    /// share. Never below an eighth of `limit`: an index that large (a store 50 times the
    /// budget) would otherwise leave no room to page; `run --help` says so. What grows by
    /// choice (the compressed tier's arena) is held to three quarters of the low watermark
    /// ([`Inner::observe`]), so the floor binds only for such an index, and an arena past its
    /// limit between two looks takes resident pages' room, not more than the budget.
    pub(super) fn charged(&self, limit: u64) -> u64 {
        limit
            .saturating_sub(self.counters.index_bytes.load(Relaxed))
            .max(limit / 8)
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
        // What grows by choice (the compressed tier) stays within what [`Inner::charged`]
        // takes out of the low watermark before its floor: past it, the floor would let the
        // resident pages and the index together pass the budget.
        let floor_free = self.budget.saturating_sub(2 * self.slack_wide);
        self.store.limit_index(floor_free - floor_free / 4);
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
                self.evict_to(Self::low);
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
    /// evict). The target is taken again after each batch, with the store's index as it is
    /// then: pages evicted into the compressed tier grow its arena (by 1 to 3 KiB each), and
    /// a target taken once would let resident pages and the arena together pass the budget
    /// by what the arena grew during the eviction (a `--dram 1G` run that read a compressed
    /// field back passed it by 40 MiB that way).
    fn evict_to(&self, target: impl Fn(&Self) -> u64) {
        let page = self.page;
        loop {
            let target = target(self);
            if self.resident.load(Relaxed) <= target {
                break;
            }
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
            let evicted = self.counters.evictions.load(Relaxed);
            let kept = self.counters.move_failed.load(Relaxed);
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
            self.counters
                .index_bytes
                .store(self.store.index_bytes(), Relaxed);
            // A batch that evicted nothing because its pages could not be moved out (async
            // write-protect): the next round tries again rather than spinning here on them.
            if self.counters.evictions.load(Relaxed) == evicted
                && self.counters.move_failed.load(Relaxed) != kept
            {
                return;
            }
        }
    }

    fn evict_pages(&self, core: &Arc<RegionCore>, idxs: &[usize]) {
        let page = self.page;
        // Phase 1, under the lock: choose, and write-protect the dirty ones.
        let mut clean = Vec::new();
        // Those of them whose contents the store holds (read from it).
        let mut clean_stored = Vec::new();
        // Dirty victims, with the hash of a hashed one (see `RState::hashes`), and the
        // address their contents are read from.
        let mut dirty: Vec<(usize, Option<u128>, usize)> = Vec::new();
        // Async write-protect: the staging slot the victims are moved to (released, zapped,
        // however this function returns).
        let slot = self.staging.as_ref().map(|s| s.take());
        {
            let mut st = core.st.lock();
            if st.dead {
                return;
            }
            core.inflight.fetch_add(1, AcqRel);
            if let Some(slot) = &slot {
                self.take_out(core, &mut st, idxs, slot, &mut dirty);
            } else {
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
                            dirty.push((i, h, core.base + i * page));
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
        for &(i, hash, from) in &dirty {
            let mut bytes = self.store.page_buf(page);
            bytes.resize(page, 0);
            if slot.is_some() {
                // SAFETY: `from` is a page of our staging slot that `take_out` moved a
                // victim into: present, and nobody else reads or writes the slot.
                let src = unsafe { std::slice::from_raw_parts(from as *const u8, page) };
                bytes.copy_from_slice(src);
            } else {
                // The page is resident and write-protected (state Evicting): no one writes it
                // and the mapping stays until the region's drop, which marks the state dead
                // first (checked below before the result is used).
                self.zapper.read(from, &mut bytes);
            }
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
                    if slot.is_some() {
                        // Moved out: back into the program's mapping, writable and dirty.
                        if let Some(&(_, _, from)) = dirty.iter().find(|d| d.0 == i) {
                            // SAFETY: as above: a page of our slot holding the victim.
                            let src =
                                unsafe { std::slice::from_raw_parts(from as *const u8, page) };
                            let _ = self.place(core.base + i * page, src, false);
                            // A touch meanwhile waits in a missing fault.
                            let _ = self.uffd.wake(core.base + i * page, page);
                        }
                        st.dirty[i] = true;
                    }
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
        if let Some(slot) = slot {
            // Already out of the program's mapping: the slot is released instead.
            drop(slot);
        } else {
            self.zapper.zap(&ranges);
        }
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
                if changed {
                    st.pass.written += page as u64;
                }
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

impl Inner {
    /// Async write-protect, phase 1 of an eviction (under the region's lock `st`): finds which
    /// resident victims of `idxs` were written since they were mapped (one `PAGEMAP_SCAN` per
    /// run; not protecting them again: they leave the mapping next, and a protection would
    /// only add a TLB flush; a victim that stays keeps its written bit in the page table for
    /// the next scan, and in `RState::dirty`), moves each run into `slot` (`UFFDIO_MOVE`: out of the
    /// program's reach, so a touch waits for the eviction), and lists the moved ones in
    /// `dirty` with the hash to compare (None: written, or no hash: written out
    /// unconditionally). Victims that could not be moved stay resident and queued.
    fn take_out(
        &self,
        core: &Arc<RegionCore>,
        st: &mut super::region::RState,
        idxs: &[usize],
        slot: &Slot<'_>,
        dirty: &mut Vec<(usize, Option<u128>, usize)>,
    ) {
        let page = self.page;
        let mut cand = Vec::new();
        for &i in idxs {
            st.queued[i] = false;
            if st.pages[i] == PageState::Resident {
                cand.push(i);
            }
        }
        // A page queued twice comes once (a second move of it would find it gone).
        cand.sort_unstable();
        cand.dedup();
        let mut written = Vec::new();
        for (a, n) in runs(&cand) {
            let pa = core.base + a * page;
            let scanned = self
                .pagemap
                .as_ref()
                .is_some_and(|pm| pm.written(pa, n * page, false, &mut written).is_ok());
            if !scanned {
                // No answer: counted written (the hash is not consulted either).
                for i in a..a + n {
                    st.dirty[i] = true;
                }
            }
        }
        // The written bits into `dirty`, under the lock (the page tables keep theirs).
        for (addr, len) in written {
            let first = (addr - core.base) / page;
            let end = (addr + len - core.base).div_ceil(page).min(st.pages.len());
            for i in first..end {
                if st.pages[i] == PageState::Resident && !st.dirty[i] {
                    st.dirty[i] = true;
                    self.counters.scanned_written.fetch_add(1, Relaxed);
                }
            }
        }
        let mut k = 0;
        for (a, n) in runs(&cand) {
            let src = core.base + a * page;
            let dst = slot.addr + k * page;
            let (moved, put_back) = self.move_out(src, dst, n * page);
            for j in 0..n {
                let i = a + j;
                if j < moved {
                    st.pages[i] = PageState::Evicting;
                    let h = st.hashes.remove(&(i as u32));
                    let h = if st.dirty[i] { None } else { h };
                    dirty.push((i, h, dst + j * page));
                } else {
                    if put_back.contains(&j) {
                        st.dirty[i] = true;
                    }
                    self.counters.move_failed.fetch_add(1, Relaxed);
                    st.queued[i] = true;
                    self.clock
                        .lock()
                        .push_back((Arc::downgrade(core), i as u32));
                }
            }
            self.counters.moved_out.fetch_add(moved as u64, Relaxed);
            k += n;
        }
    }

    /// Moves `[src, src+len)` (resident pages of a region) to `dst` (a staging slot, empty).
    /// Returns the whole pages moved (a prefix of the run), and the pages after them (numbers
    /// in the run) that were put back from the slot, writable: counted dirty by the caller.
    ///
    /// What the slot holds afterwards is the truth, not the kernel's answer: Linux 6.18 was
    /// seen to move a page and then answer `EEXIST` for it (its retry found the page it had
    /// just moved in the destination), with `move` not counting it. Taken at its word, the
    /// page would stay `Resident` while gone from the program's mapping, and the slot's
    /// release would drop its contents (increments lost under the stress test
    /// `counters_in_pages_that_keep_leaving_lose_no_increment`). So after every refusal the pages the slot holds next are counted
    /// moved, and anything it holds past the pages moved goes back. A page shared with
    /// a forked process (EBUSY) is made private by a write fault that writes nothing
    /// (`MADV_POPULATE_WRITE`, only on a present page: a missing one would fault to us) and
    /// moved then. A run `UFFDIO_MOVE` refuses whole is moved one page at a time.
    fn move_out(&self, src: usize, dst: usize, len: usize) -> (usize, Vec<usize>) {
        let page = self.page;
        let mut done = 0;
        let mut unshared = 0;
        let mut cleared = 0;
        // After a refusal of a whole run (it spans two of the program's mappings, say), one
        // page at a time.
        let mut by_page = false;
        let mut unlocked = false;
        while done < len {
            let want = if by_page {
                page.min(len - done)
            } else {
                len - done
            };
            match self.uffd.move_pages(src + done, dst + done, want) {
                Ok(n) => done += n,
                Err((n, e)) => {
                    done += n;
                    let (more, junk) = self.moved_prefix(src + done, dst + done, len - done);
                    if more > 0 {
                        self.counters
                            .move_misreported
                            .fetch_add((more / 4096) as u64, Relaxed);
                        done += more;
                        continue;
                    }
                    if junk && cleared < len / 4096 + 1 {
                        // The slot held a page of its own (its release could not drop it):
                        // dropped now, and the move tried again.
                        cleared += 1;
                        if let Some(s) = &self.staging {
                            s.clear(dst + done, 4096);
                        }
                        continue;
                    }
                    let at = (src + done) & !4095;
                    if e.raw_os_error() == Some(libc::EBUSY) && unshared < len / 4096 + 1 {
                        unshared += 1;
                        let mut present = 0u8;
                        // SAFETY: mincore writes one byte for the one page asked about.
                        let r = unsafe { libc::mincore(at as *mut _, 4096, &mut present) };
                        if r == 0 && present & 1 == 1 {
                            // SAFETY: a write fault on a present page of a region's mapping;
                            // it writes no data (it only breaks the sharing).
                            let r = unsafe {
                                libc::madvise(at as *mut _, 4096, libc::MADV_POPULATE_WRITE)
                            };
                            if r == 0 {
                                self.counters.move_unshared.fetch_add(1, Relaxed);
                                continue;
                            }
                        }
                    } else if n > 0 {
                        continue;
                    } else if e.raw_os_error() == Some(libc::EINVAL) && !unlocked {
                        // The two mappings' flags differ: the program's `mlockall` locked
                        // the staging area too (the shim unlocks only regions).
                        unlocked = true;
                        if let Some(s) = &self.staging {
                            s.unlock();
                        }
                        continue;
                    } else if !by_page && len - done > page && done % page == 0 {
                        by_page = true;
                        continue;
                    }
                    break;
                }
            }
        }
        let whole = done / page;
        // Past the whole pages moved the slot must be empty: part of a page (the rest of it
        // stayed), or anything the kernel moved without saying so, goes back where it was.
        let from = dst + whole * page;
        let mut back: Vec<usize> = Vec::new();
        let stayed = self.populated_set(src + whole * page, len - whole * page);
        for (a, n) in self.populated_runs(from, len - whole * page) {
            for off in (0..n).step_by(4096) {
                let d = a + off;
                let to = src + (d - dst);
                if stayed.contains(&to) {
                    // Not the program's page (that one is still in place): the slot's own.
                    if let Some(s) = &self.staging {
                        s.clear(d, 4096);
                    }
                    continue;
                }
                self.put_back(d, to);
                back.push((d - dst) / page);
            }
        }
        back.dedup();
        (whole, back)
    }

    /// The 4 KiB pages of `[addr, addr+len)` that hold pages.
    fn populated_set(&self, addr: usize, len: usize) -> std::collections::HashSet<usize> {
        self.populated_runs(addr, len)
            .into_iter()
            .flat_map(|(a, n)| (a..a + n).step_by(4096))
            .collect()
    }

    /// After a refused move at `src` to `dst` (a slot, empty when taken), `len` bytes left:
    /// the bytes from there on that the kernel moved anyway (the slot holds them and the
    /// program's mapping no longer does), and whether the slot holds a page of its own at
    /// `dst` while the program's page is still at `src` (a release that could not drop it).
    fn moved_prefix(&self, src: usize, dst: usize, len: usize) -> (usize, bool) {
        let there = self.populated_prefix(dst, len);
        if there == 0 {
            return (0, false);
        }
        let stayed = self.populated_set(src, there);
        let moved = (0..there)
            .step_by(4096)
            .take_while(|off| !stayed.contains(&(src + off)))
            .count()
            * 4096;
        (moved, moved == 0)
    }

    /// Runs `(address, length)` of `[addr, addr+len)` that hold pages (present or swapped),
    /// adjacent runs joined; none where the pager has no pagemap or the scan fails.
    fn populated_runs(&self, addr: usize, len: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let Some(pm) = &self.pagemap else {
            return out;
        };
        if len == 0 || pm.populated(addr, len, &mut out).is_err() {
            return Vec::new();
        }
        let mut joined: Vec<(usize, usize)> = Vec::with_capacity(out.len());
        for (a, n) in out {
            match joined.last_mut() {
                Some(l) if l.0 + l.1 == a => l.1 += n,
                _ => joined.push((a, n)),
            }
        }
        joined
    }

    /// Bytes from `addr` on (at most `len`) that hold pages without a gap.
    fn populated_prefix(&self, addr: usize, len: usize) -> usize {
        match self.populated_runs(addr, len).first() {
            Some(&(a, n)) if a == addr => n.min(len),
            _ => 0,
        }
    }

    /// Puts the 4 KiB page at `from` (in a staging slot) back at `to` (where it was moved
    /// from, missing since), unprotected: moved back, or copied where the move is refused.
    fn put_back(&self, from: usize, to: usize) {
        let _ = self.uffd.move_pages(from, to, 4096);
        if self.populated_prefix(from, 4096) == 0 {
            return;
        }
        // SAFETY: the page at `from` lies in our staging slot and holds a page (just checked:
        // reading it faults nothing to us); nobody else uses the slot.
        let bytes = unsafe { std::slice::from_raw_parts(from as *const u8, 4096) };
        let _ = self.uffd.copy(bytes, to, false);
    }
}

/// The staging area of async write-protect eviction: a mapping of the pager's own, registered
/// with its userfaultfd for missing faults (`UFFDIO_MOVE` moves only into registered
/// mappings) and never touched by the program, in slots of [`EVICT_BATCH`] pages, one per
/// thread that may evict at once.
pub(super) struct Staging {
    base: usize,
    len: usize,
    slot_bytes: usize,
    free: Mutex<Vec<usize>>,
}

/// A slot taken from the [`Staging`] area; dropping it drops what was moved into it and
/// returns it.
pub(super) struct Slot<'a> {
    staging: &'a Staging,
    addr: usize,
}

impl Staging {
    pub(super) fn new(
        uffd: &crate::uffd::Uffd,
        page: usize,
        slots: usize,
    ) -> crate::Result<Staging> {
        let slot_bytes = EVICT_BATCH * page;
        let len = slot_bytes * slots.max(1);
        // SAFETY: a fresh private anonymous mapping of our own, read-write like the regions
        // (`UFFDIO_MOVE` wants both sides' flags alike).
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE,
            )
        }
        .map_err(|e| crate::MemError::Map(e.into()))?;
        let base = p as usize;
        // SAFETY: the mapping made above; regions are mapped without huge pages alike.
        let _ = unsafe { rustix::mm::madvise(p, len, rustix::mm::Advice::LinuxNoHugepage) };
        if let Err(e) = uffd.register(base, len, crate::uffd::MODE_MISSING) {
            // SAFETY: unmapping the mapping made above, used by nobody.
            let _ = unsafe { rustix::mm::munmap(p, len) };
            return Err(crate::MemError::Uffd {
                what: "register the staging area",
                source: e,
            });
        }
        Ok(Staging {
            base,
            len,
            slot_bytes,
            free: Mutex::new((0..slots.max(1)).map(|s| base + s * slot_bytes).collect()),
        })
    }

    /// Whether `addr` lies in the area.
    pub(super) fn contains(&self, addr: usize) -> bool {
        addr >= self.base && addr < self.base + self.len
    }

    /// Unlocks the whole area (which a program's `mlockall(MCL_CURRENT)` locks with the rest
    /// of the process: `UFFDIO_MOVE` wants both mappings locked alike, and regions are kept
    /// unlocked).
    fn unlock(&self) {
        // SAFETY: munlock of our own staging mapping; it changes no contents.
        unsafe { libc::munlock(self.base as *const _, self.len) };
    }

    /// Drops the pages of `[addr, addr+len)` (a part of the area whose contents were saved or
    /// are not wanted). `MADV_DONTNEED` refuses locked memory: a program's `mlockall` locks
    /// the area with the rest of the process, so it is unlocked then and dropped again (a
    /// slot that kept a page would make the next move into it fail).
    pub(super) fn clear(&self, addr: usize, len: usize) {
        let drop_pages = || {
            // SAFETY: the range lies in our staging mapping, which only the pager uses; its
            // contents were saved (or are not wanted) by the caller.
            unsafe { rustix::mm::madvise(addr as *mut _, len, rustix::mm::Advice::LinuxDontNeed) }
        };
        if drop_pages().is_err() {
            self.unlock();
            let _ = drop_pages();
        }
    }

    /// Takes a free slot, waiting for one (each thread that evicts holds at most one).
    pub(super) fn take(&self) -> Slot<'_> {
        loop {
            if let Some(addr) = self.free.lock().pop() {
                return Slot {
                    staging: self,
                    addr,
                };
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        // What was moved into it was saved (or put back) by the eviction that held it.
        self.staging.clear(self.addr, self.staging.slot_bytes);
        self.staging.free.lock().push(self.addr);
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // SAFETY: the staging mapping, which no slot uses any more (slots borrow it).
        let _ = unsafe { rustix::mm::munmap(self.base as *mut _, self.len) };
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
