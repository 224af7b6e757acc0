//! Fault handling: the fault-thread loop, routing of faults to the fault thread on the
//! faulting thread's CPU (mailboxes, stealing of untaken mail), missing faults (zero fills and
//! store reads) and write-protect faults (first writes of tracked-clean pages).

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::{
    AtomicBool, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::uffd::{Event, FaultKind};
use parking_lot::Mutex;

use super::page::{page_hash, PageState, Placed};
use super::region::{RState, RegionCore, WRITE_HEAT_MAX};
use super::{fatal, Inner};

/// A page fault to serve (read from the userfaultfd, or handed over by another thread).
#[derive(Clone, Copy)]
struct Fault {
    kind: FaultKind,
    addr: usize,
    write: bool,
}

/// Faults handed to one fault thread: those of program threads on its CPU.
#[derive(Default)]
pub(super) struct Mailbox {
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

impl Inner {
    /// Fault thread loop (thread `me`). For 2 ms after each fault the thread polls without
    /// sleeping, yielding its CPU to any other runnable thread between polls (a sleeping
    /// thread costs a cross-CPU wake-up per fault, 60-90 us here; yielding keeps a program
    /// thread that shares the CPU from waiting on the spin); then it sleeps in poll (25 ms at a
    /// time, so that a `fork` waits at most that long for it to stop). Each
    /// fault read goes to the fault thread of the faulting thread's CPU when that is known
    /// and the thread polls; mail left untaken for [`STEAL_AFTER`] is served by any thread.
    pub(super) fn serve(&self, me: usize) {
        let mut last_fault = Instant::now();
        self.mail[me].spinning.store(true, Release);
        while !self.stop.load(Relaxed) {
            // Each turn of the loop, its sleep included, is one unit of work for `fork`: a
            // thread that waits at the closed gate holds no lock and is in no lock's queue.
            let _in = self.gate.enter();
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
                let ready = self.pending(25_000_000);
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
            let pa = addr & !4095;
            if self.staging.as_ref().is_some_and(|s| s.contains(pa)) {
                // The kernel touching the staging area, registered with the descriptor as
                // `UFFDIO_MOVE`'s destination: a program's `mlockall(MCL_CURRENT)` faults in
                // every mapping that is not locked on fault, and the area is unlocked while
                // it runs when a move or a drop needed it. A wake alone would make it fault
                // again for ever (the program hung inside `mlockall`, both fault threads
                // busy): a zero page ends the fault; a move into that page later finds it
                // and drops it first (`move_out`). Present already (a victim moved in): the
                // wake suffices.
                self.counters.staging_faults.fetch_add(1, Relaxed);
                let _ = self.uffd.zeropage(pa, 4096);
            }
            // Otherwise unmapped meanwhile: nothing to serve; never leave a thread asleep.
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

    pub(super) fn charge(&self, bytes: u64) {
        let now = self.resident.fetch_add(bytes, Relaxed) + bytes;
        self.counters.peak_resident.fetch_max(now, Relaxed);
    }

    /// Reads a page from the store; None when its region was unmapped meanwhile (its pages
    /// left the store). Any other failure stops the program: it must not see wrong data.
    pub(super) fn read_page(&self, core: &RegionCore, idx: usize) -> Option<Vec<u8>> {
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
                // Usually a race with whoever just placed the page. If the kernel dropped it
                // behind the pager's back (an madvise that bypassed the shim), it reads as
                // zeros, as natively, and stays dirty so no later write to it is lost on
                // eviction; either way the thread is woken, never left faulting for ever.
                let a4 = addr & !4095;
                if self.uffd.zeropage(a4, 4096).is_ok() {
                    st.dirty[idx] = true;
                }
                drop(st);
                let _ = self.uffd.wake(pa, page);
                return;
            }
            PageState::Foreign => {
                drop(st);
                // What is left of a page the program mapped over: zeros, not paged.
                let _ = self.uffd.zeropage(addr & !4095, 4096);
                let _ = self.uffd.wake(addr & !4095, 4096);
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
                // A private zero-filled page rather than the shared zero page, mapped
                // writable and counted dirty: memory a program touches for the first time is
                // nearly always memory it is about to write, and a write-protected page would
                // cost that write a fault served here (with a TLB shootdown to lift the
                // protection). An eviction that finds the page still all zeros drops it
                // without a write.
                self.place(pa, &self.zeros, false);
                self.counters.zero_fills.fetch_add(1, Relaxed);
                self.mark_resident(core, &mut st, idx, PageState::Zero, Placed::Dirty);
                let pf = self.stream(&mut st, idx);
                drop(st);
                let _ = self.uffd.wake(pa, page);
                self.prefetch(core, pf);
                return;
            }
            PageState::Stored => {}
        }
        // Along a sequential stream the fault unit grows: the pages right after this one that
        // the stream wants next are read with it (one request per drive) and mapped in one
        // call, as far as there is room under the high watermark.
        let mut ahead = self.stream(&mut st, idx);
        let room = (self.high().saturating_sub(self.resident.load(Relaxed)) / page as u64) as usize;
        let run_max = (super::page::RUN_BYTES / page).max(1).min(room + 1);
        let mut run = vec![idx];
        if st.sequential {
            while run.len() < run_max
                && idx + run.len() < st.pages.len()
                && st.pages[idx + run.len()] == PageState::Stored
            {
                run.push(idx + run.len());
            }
            let end = idx + run.len();
            ahead.retain(|&j| j >= end);
        }
        for &j in &run {
            st.pages[j] = PageState::Loading;
        }
        self.charge((run.len() * page) as u64);
        // Read (not written) pages of a region being written, or changed during their last
        // stay in memory, are mapped writable and hashed: their first write then costs no
        // write-protect fault. Decided here, under the lock the fault holds anyway.
        let hashed = core.writable(&st, &run);
        drop(st);
        let t0 = Instant::now();
        busy.store(true, Release);
        let data = self.read_run(core, &run);
        busy.store(false, Release);
        let Some(data) = data else {
            self.resident.fetch_sub((run.len() * page) as u64, Relaxed);
            return;
        };
        let c = &self.counters;
        c.store_reads.fetch_add(1, Relaxed);
        c.store_read_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        self.counters
            .bytes_in
            .fetch_add((run.len() * page) as u64, Relaxed);
        let placed = if write {
            self.place(pa, &data[0], false);
            Placed::Dirty
        } else {
            self.place_clean(pa, &data[0], hashed)
        };
        // The rest of the run in one call.
        let rest = if run.len() > 1 {
            self.place_run(core, &run[1..], &data[1..], hashed)
        } else {
            Vec::new()
        };
        let mut st = core.st.lock();
        if st.dead {
            drop(st);
            self.resident.fetch_sub((run.len() * page) as u64, Relaxed);
            return;
        }
        self.mark_resident(core, &mut st, idx, PageState::Stored, placed);
        for (&j, &p) in run[1..].iter().zip(&rest) {
            self.mark_resident(core, &mut st, j, PageState::Stored, p);
        }
        drop(st);
        if run.len() > 1 {
            self.counters
                .prefetched
                .fetch_add(run.len() as u64 - 1, Relaxed);
        }
        // Timed up to the wake-up call: the woken thread, on this CPU, usually runs at once,
        // so the call itself returns only when the program faults again.
        let ns = entered.elapsed().as_nanos() as u64;
        self.counters.store_fault_ns.fetch_add(ns, Relaxed);
        self.counters.fault_latency.observe_ns(ns);
        let _ = self.uffd.wake(pa, run.len() * page);
        self.prefetch(core, ahead);
    }

    /// Reads the pages `run` (adjacent, the first being faulted on) from the store; None when
    /// the region was unmapped meanwhile.
    pub(super) fn read_run(&self, core: &RegionCore, run: &[usize]) -> Option<Vec<Vec<u8>>> {
        if run.len() == 1 {
            return self.read_page(core, run[0]).map(|d| vec![d]);
        }
        let keys: Vec<(u64, u64)> = run.iter().map(|&j| (core.obj, j as u64)).collect();
        let got = self.store.get_many_uncached(&keys).unwrap_or_default();
        let mut out = Vec::with_capacity(run.len());
        for (n, &j) in run.iter().enumerate() {
            match got.get(n).cloned().flatten() {
                Some(mut v) => {
                    v.resize(self.page, 0);
                    out.push(v);
                }
                None => out.push(self.read_page(core, j)?),
            }
        }
        Some(out)
    }

    /// Copies one page into place without waking, write-protected in the same step when
    /// `protect` (so the first write is seen, even from a thread that was not waiting on this
    /// page). Returns whether the page is write-protected (tracked clean).
    pub(super) fn place(&self, pa: usize, data: &[u8], protect: bool) -> bool {
        self.place_whole(pa, data, protect) && protect
    }

    /// As [`Inner::place`]; returns whether the page was mapped whole in one call. Where part
    /// of the range exists already (or the region is being unmapped) it copies 4 KiB at a
    /// time, ignoring what exists, unprotected: the page then counts as dirty.
    fn place_whole(&self, pa: usize, data: &[u8], protect: bool) -> bool {
        let page = self.page;
        match self.uffd.copy(data, pa, protect) {
            Ok(()) => true,
            Err(_) => {
                for off in (0..page).step_by(4096) {
                    let _ = self.uffd.copy(&data[off..off + 4096], pa + off, false);
                }
                false
            }
        }
    }

    /// Maps a page read from the store (without waking): write-protected (tracked), or
    /// writable with its hash when `hashed`; counted dirty where the mapping call had to go
    /// 4 KiB at a time.
    pub(super) fn place_clean(&self, pa: usize, data: &[u8], hashed: bool) -> Placed {
        if self.wp_async {
            return if self.place_whole(pa, data, true) {
                Placed::Watched(page_hash(data))
            } else {
                Placed::Dirty
            };
        }
        match (self.place_whole(pa, data, !hashed), hashed) {
            (true, false) => Placed::Tracked,
            (true, true) => Placed::Hashed(page_hash(data)),
            (false, _) => Placed::Dirty,
        }
    }

    pub(super) fn mark_resident(
        &self,
        core: &Arc<RegionCore>,
        st: &mut RState,
        idx: usize,
        backed: PageState,
        placed: Placed,
    ) {
        st.pages[idx] = PageState::Resident;
        st.backed[idx] = backed;
        st.dirty[idx] = !matches!(placed, Placed::Tracked | Placed::Watched(_));
        match placed {
            Placed::Hashed(h) | Placed::Watched(h) if backed == PageState::Stored => {
                st.hashes.insert(idx as u32, h);
            }
            _ => {
                st.hashes.remove(&(idx as u32));
            }
        }
        st.resident += self.page as u64;
        st.pass.loaded(&mut st.pass_stamps, idx);
        if backed == PageState::Stored {
            st.pass.read += self.page as u64;
        }
        if !st.queued[idx] {
            st.queued[idx] = true;
            let queue = if st.sweeping() {
                &self.behind
            } else {
                &self.clock
            };
            queue.lock().push_back((Arc::downgrade(core), idx as u32));
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
}
