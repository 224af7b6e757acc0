//! Read-ahead: fault streams with a constant stride (sequential, backwards, strided) are
//! detected per region and the pages ahead of them mapped before the program reaches them
//! (a window that doubles on each hit), read from the store by the prefetch threads.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::page::{page_hash, PageState, Placed, RUN_BYTES};
use super::region::{RState, RegionCore, Stream};
use super::Inner;

/// Largest prefetch window, in bytes (at least 16 pages).
pub(super) const PREFETCH_BYTES: usize = 4 << 20;
/// Largest stride (in pages) taken for a stream.
const MAX_STRIDE: i64 = 64;

/// Pages a sequential stream may jump ahead of its frontier, or a fault may lie behind its
/// last fault, and still belong to it: programs that go through memory in small local
/// permutations (the pairs i, i + 2 and i, i + 4 of an FFT's first butterflies, 4 KiB pages
/// visited two by two) are sequential streams too.
const LOCAL: i64 = 8;

/// How far past a stream's frontier a fault may land and continue it.
fn reach(stride: i64) -> i64 {
    if stride.abs() == 1 {
        LOCAL
    } else {
        stride.abs()
    }
}

/// Pages to read ahead of a fault stream: one page, or a run of adjacent ones read and mapped
/// together.
pub(super) struct PrefetchJob {
    core: Arc<RegionCore>,
    idxs: Vec<usize>,
}

/// The most threads that read prefetched pages in parallel (the store's reads are
/// synchronous).
pub(super) const PREFETCH_THREADS: usize = 8;

/// Prefetch threads for a pager with `budget` resident bytes: one per 32 MiB of budget, two to
/// [`PREFETCH_THREADS`]. Each thread costs its stack and a malloc arena of its own (about
/// 0.8 MiB each, measured with `run --dram 32M`), outside `--dram`; a small budget cannot
/// hold the read-ahead windows of eight threads anyway (they are a tenth of it at most).
pub(super) fn prefetch_threads(budget: u64) -> usize {
    ((budget >> 25) as usize).clamp(2, PREFETCH_THREADS)
}

impl Inner {
    /// Follows the fault streams of the region; returns the pages to prefetch.
    ///
    /// A stream is a run of faults with a constant stride. A fault that continues it (at any
    /// page up to one stride past its prefetch frontier, including a page still being
    /// prefetched: the program has caught up with the reads) doubles the window and moves the
    /// frontier to `window` strides past the fault, so reads stay in flight ahead of the
    /// program instead of starting only when it reaches the end of the last window.
    pub(super) fn stream(&self, st: &mut RState, idx: usize) -> Vec<usize> {
        let i = idx as i64;
        st.tick += 1;
        let tick = st.tick;
        let npages = st.pages.len() as i64;
        let budget_pages = (self.budget / self.page as u64).max(1);
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
                && (i - s.ahead) * sign <= reach(s.stride)
        };
        // A fault a few pages behind the last fault of a followed sequential stream is the
        // program going back over a page the stream skipped: part of the stream, not the
        // start of another (which would take a slot from a stream being followed).
        let behind = |s: &Stream| {
            let d = (i - s.last) * s.stride.signum();
            s.used > 0 && s.hits > 0 && s.stride.abs() == 1 && (-LOCAL..0).contains(&d)
        };
        st.sequential = false;
        // A fault that follows none of the streams: where a new pass of a loop may begin.
        let jump = !st.streams.iter().any(|s| behind(s) || continues(s));
        if let Some(p) = st.note_pass(idx, jump, budget_pages, self.page as u64) {
            self.sweeps.lock().push(p);
        }
        if let Some(s) = st.streams.iter_mut().find(|s| behind(s)) {
            s.used = tick;
            st.note_sweep(Some(1), budget_pages);
            return Vec::new();
        }
        if let Some(s) = st.streams.iter_mut().find(|s| continues(s)) {
            s.hits += 1;
            let forward = s.stride == 1;
            s.used = tick;
            let sign = s.stride.signum();
            // Pages the program went through without a fault were prefetched ones.
            let passed = ((i - s.last) / s.stride - 1).max(0) as u64;
            self.counters.prefetch_hits.fetch_add(passed, Relaxed);
            s.last = i;
            if s.stride != 1 && s.hits < 2 {
                s.ahead = i;
                st.note_sweep(Some(1), budget_pages);
                return Vec::new();
            }
            s.window = (s.window * 2).clamp(1, max_window);
            let window = s.window;
            let target = i + s.stride * s.window as i64;
            // A sequential stream fills from its frontier, the pages it jumped over included;
            // a strided one from past this fault.
            let mut p = if (s.ahead - i) * sign > 0 || s.stride.abs() == 1 {
                s.ahead
            } else {
                i
            } + s.stride;
            let mut out = Vec::new();
            while (target - p) * sign >= 0 && p >= 0 && p < npages {
                if p != i {
                    out.push(p as usize);
                }
                s.ahead = p;
                p += s.stride;
            }
            st.sequential = forward && window > 1;
            st.pass.pos.backward = sign < 0;
            st.note_sweep(Some(1 + out.len() as u64), budget_pages);
            return out;
        }
        st.note_sweep(None, budget_pages);
        // Near the last fault of a stream (the nearest): a candidate stream with that stride,
        // in a slot of its own. The stream it starts from keeps its stride: two streams that
        // interleave close to each other (the pairs i, i + 2^k of a butterfly, a stencil's
        // rows) would otherwise overwrite each other's stride at every fault and neither
        // would ever be followed.
        let stride = st
            .streams
            .iter()
            .filter(|s| s.used > 0 && s.last != i && (i - s.last).abs() <= MAX_STRIDE)
            .min_by_key(|s| ((i - s.last).abs(), i < s.last))
            .map_or(0, |s| i - s.last);
        // In the least recently used slot.
        if let Some(s) = st.streams.iter_mut().min_by_key(|s| s.used) {
            *s = Stream {
                last: i,
                stride,
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
    pub(super) fn prefetch(&self, core: &Arc<RegionCore>, pages: Vec<usize>) {
        if pages.is_empty() {
            return;
        }
        // Only while there is room under the high watermark; prefetch never forces eviction.
        let room = self.high().saturating_sub(self.resident.load(Relaxed)) / self.page as u64;
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
        self.finish_loads(
            core,
            &zeros,
            PageState::Zero,
            &vec![Placed::Dirty; zeros.len()],
        );
        // Pages in the store: read in parallel by the prefetch threads, runs of adjacent pages
        // as one job (one read per drive, one mapping call).
        let tx = self.prefetch_tx.lock().clone();
        let run_max = (RUN_BYTES / self.page).max(1);
        let mut runs: Vec<Vec<usize>> = Vec::new();
        for j in stored {
            match runs.last_mut() {
                Some(r) if r.len() < run_max && r.last().is_some_and(|&l| l + 1 == j) => r.push(j),
                _ => runs.push(vec![j]),
            }
        }
        for idxs in runs {
            let job = PrefetchJob {
                core: core.clone(),
                idxs,
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

    /// Reads the pages of a prefetch from the store and maps them, write-protected (clean)
    /// unless the region is being written; a run of adjacent pages with one mapping call.
    fn load_one(&self, job: PrefetchJob) {
        let page = self.page;
        let core = &job.core;
        let Some(data) = self.read_run(core, &job.idxs) else {
            self.resident
                .fetch_sub((job.idxs.len() * page) as u64, Relaxed);
            return;
        };
        self.counters
            .bytes_in
            .fetch_add((data.len() * page) as u64, Relaxed);
        let placed = self.place_run(core, &job.idxs, &data, core.map_writable(&job.idxs));
        self.finish_loads(core, &job.idxs, PageState::Stored, &placed);
    }

    /// Maps the adjacent pages `idxs` of `core` with contents `data` in one call (page by page
    /// where part of the range exists already): write-protected (tracked), or, when `hashed`
    /// (see [`RegionCore::writable`]), writable with each page's hash, so that a stream that
    /// writes takes no write-protect fault per page and its eviction still skips the pages it
    /// did not change. Returns how each page was mapped.
    pub(super) fn place_run(
        &self,
        core: &RegionCore,
        idxs: &[usize],
        data: &[Vec<u8>],
        hashed: bool,
    ) -> Vec<Placed> {
        let page = self.page;
        let Some(&first) = idxs.first() else {
            return Vec::new();
        };
        if data.len() > 1 {
            let mut run = Vec::with_capacity(data.len() * page);
            for d in data {
                run.extend_from_slice(d);
            }
            // Under async write-protect every page is mapped protected and hashed (`Watched`).
            let protect = self.wp_async || !hashed;
            if self
                .uffd
                .copy(&run, core.base + first * page, protect)
                .is_ok()
            {
                return data
                    .iter()
                    .map(|d| {
                        if self.wp_async {
                            Placed::Watched(page_hash(d))
                        } else if hashed {
                            Placed::Hashed(page_hash(d))
                        } else {
                            Placed::Tracked
                        }
                    })
                    .collect();
            }
        }
        idxs.iter()
            .zip(data)
            .map(|(&j, d)| self.place_clean(core.base + j * page, d, hashed))
            .collect()
    }

    /// Marks loaded pages resident (or undoes the charge if the region went away) and wakes
    /// anybody who faulted on them meanwhile.
    fn finish_loads(
        &self,
        core: &Arc<RegionCore>,
        idxs: &[usize],
        was: PageState,
        placed: &[Placed],
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
        for (&j, &p) in idxs.iter().zip(placed) {
            self.mark_resident(core, &mut st, j, was, p);
        }
        drop(st);
        self.counters
            .prefetched
            .fetch_add(idxs.len() as u64, Relaxed);
        for &j in idxs {
            let _ = self.uffd.wake(core.base + j * page, page);
        }
    }

    pub(super) fn prefetcher(&self, rx: &Mutex<std::sync::mpsc::Receiver<PrefetchJob>>) {
        while !self.stop.load(Relaxed) {
            // One unit of work for `fork`, the wait included (see `serve`).
            let _in = self.gate.enter();
            // Bounded waits for the shared receiver too: a `fork` waits for each of them.
            let Some(rx) = rx.try_lock_for(Duration::from_millis(20)) else {
                continue;
            };
            let job = rx.recv_timeout(Duration::from_millis(20));
            drop(rx);
            match job {
                Ok(job) => self.load_one(job),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_threads_grow_with_the_budget() {
        assert_eq!(prefetch_threads(20 << 20), 2);
        assert_eq!(prefetch_threads(36 << 20), 2);
        assert_eq!(prefetch_threads(100 << 20), 3);
        assert_eq!(prefetch_threads(235 << 20), 7);
        assert_eq!(prefetch_threads(1 << 30), PREFETCH_THREADS);
    }
}
