//! Real userfaultfd: regions larger than their DRAM budget, paged to a store over an array.

use std::sync::Arc;

use tierstack_array::{Array, ArrayOptions, CreateParams, Level};
use tierstack_mem::{Region, RegionOptions};
use tierstack_store::{ArrayTier, TieredStore};

fn store(dir: &std::path::Path) -> Arc<TieredStore> {
    let paths: Vec<_> = (0..4).map(|i| dir.join(format!("d{i}"))).collect();
    let p = CreateParams {
        level: Level::Raid5,
        chunk: 64 << 10,
        groups: None,
        size: Some(128 << 20),
    };
    let a = Array::create(&paths, &p, &ArrayOptions::default()).expect("array");
    Arc::new(TieredStore::new(4 << 20, vec![Box::new(ArrayTier::new(a))]).expect("store"))
}

fn opts() -> RegionOptions {
    RegionOptions {
        page: 64 << 10,
        budget: 8 << 20,
        fault_threads: 2,
    }
}

fn pager(st: Arc<TieredStore>, budget: u64, commit_limit: Option<u64>) -> tierstack_mem::Pager {
    pager_of(st, 64 << 10, budget, commit_limit)
}

fn pager_of(
    st: Arc<TieredStore>,
    page: usize,
    budget: u64,
    commit_limit: Option<u64>,
) -> tierstack_mem::Pager {
    tierstack_mem::Pager::new(
        st,
        &tierstack_mem::PagerOptions {
            page,
            budget,
            fault_threads: 2,
            commit_limit,
        },
    )
    .expect("pager")
}

/// The region's memory as words, for the calling test alone.
#[allow(clippy::mut_from_ref)]
fn words_of(r: &Region) -> &mut [u64] {
    // SAFETY: a valid mapping of r.len() bytes for the life of `r`; only the calling test
    // touches it.
    unsafe { std::slice::from_raw_parts_mut(r.as_ptr() as *mut u64, r.len() / 8) }
}

/// A region of 32 MiB under [`opts`] whose word `i` holds `i ^ xor`.
fn filled_region(st: Arc<TieredStore>, xor: u64) -> Region {
    let r = Region::new(st, 32 << 20, &opts()).expect("region");
    for (i, w) in words_of(&r).iter_mut().enumerate() {
        *w = i as u64 ^ xor;
    }
    r
}

/// The tests run one at a time: the leak check counts this process's mappings.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn uffd_available() -> bool {
    tierstack_mem::uffd::available().is_ok()
}

/// Serialises the test, checks userfaultfd is usable (None: skip) and builds a store over a
/// fresh array; the guard and the folder must live as long as the store.
fn setup() -> Option<(
    std::sync::MutexGuard<'static, ()>,
    tempfile::TempDir,
    Arc<TieredStore>,
)> {
    let guard = serial();
    if !uffd_available() {
        eprintln!("SKIP: /dev/userfaultfd not usable here");
        return None;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let st = store(dir.path());
    Some((guard, dir, st))
}

/// `words` atomic words at `base`, shared by a test's threads.
///
/// # Safety
/// `base` must be the start of a mapping of at least `words * 8` bytes that outlives every use
/// of the slice.
unsafe fn atomics(base: usize, words: usize) -> &'static [std::sync::atomic::AtomicU64] {
    // SAFETY: guaranteed by the caller; AtomicU64 makes concurrent access well-defined.
    unsafe { std::slice::from_raw_parts(base as *const std::sync::atomic::AtomicU64, words) }
}

#[test]
fn region_four_times_its_budget_keeps_every_byte() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let r = Region::new(st, 32 << 20, &opts()).expect("region");
    let words = r.len() / 8;
    // SAFETY: the region is a valid mapping of r.len() bytes for the life of `r`; this test
    // is its only user.
    let mem = unsafe { std::slice::from_raw_parts_mut(r.as_ptr() as *mut u64, words) };
    // Untouched memory reads as zero.
    assert_eq!(mem[12345], 0);
    for (i, w) in mem.iter_mut().enumerate() {
        *w = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    assert!(
        r.resident() <= 8 << 20,
        "resident {} over budget",
        r.resident()
    );
    for (i, w) in mem.iter().enumerate() {
        assert_eq!(
            *w,
            (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            "word {i}"
        );
    }
    // Overwrite every other page and check again (pages come back from the store and leave).
    for i in (0..words).step_by(1024) {
        mem[i] ^= 1;
    }
    for i in (0..words).step_by(1024) {
        assert_eq!(mem[i], (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 1);
    }
    assert!(r.error().is_none(), "{:?}", r.error());
    // Only read the first quarter again: clean pages leave without being written.
    let before = r
        .counters()
        .bytes_out
        .load(std::sync::atomic::Ordering::Relaxed);
    let mut sum = 0u64;
    for _ in 0..3 {
        for w in mem[..words / 4].iter() {
            sum = sum.wrapping_add(*w);
        }
        for w in mem[words / 2..words / 2 + words / 4].iter() {
            sum = sum.wrapping_add(*w);
        }
    }
    std::hint::black_box(sum);
    let c = r.counters();
    assert!(
        c.clean_drops.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no clean page was dropped"
    );
    assert_eq!(
        c.bytes_out.load(std::sync::atomic::Ordering::Relaxed),
        before,
        "reading wrote pages out"
    );
    assert!(c.evictions.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert!(c.bytes_in.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert!(
        c.madvise_calls.load(std::sync::atomic::Ordering::Relaxed)
            <= c.evictions.load(std::sync::atomic::Ordering::Relaxed)
    );
}

#[test]
fn threads_write_and_read_while_pages_move() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let r = Region::new(st, 24 << 20, &opts()).expect("region");
    let words = r.len() / 8;
    let base = r.as_ptr() as usize;
    std::thread::scope(|s| {
        for t in 0..4usize {
            s.spawn(move || {
                // SAFETY: each thread writes only the words i ≡ t (mod 4) of a mapping that
                // outlives the scope.
                let mem = unsafe { atomics(base, words) };
                for round in 0..2u64 {
                    for i in (t..words).step_by(4 * 97) {
                        mem[i].store(i as u64 * 3 + round, std::sync::atomic::Ordering::Relaxed);
                    }
                    for i in (t..words).step_by(4 * 97) {
                        assert_eq!(
                            mem[i].load(std::sync::atomic::Ordering::Relaxed),
                            i as u64 * 3 + round
                        );
                    }
                }
            });
        }
    });
    assert!(r.error().is_none(), "{:?}", r.error());
    assert!(r.resident() <= 8 << 20);
}

#[test]
fn regions_created_and_dropped_in_a_loop_leak_nothing() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let maps_before = std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.lines().count())
        .unwrap_or(0);
    let mut objs = Vec::new();
    for round in 0..200u64 {
        let r = Region::new(
            st.clone(),
            1 << 20,
            &RegionOptions {
                page: 64 << 10,
                budget: 256 << 10,
                fault_threads: 1,
            },
        )
        .expect("region");
        objs.push(r.obj());
        // SAFETY: valid mapping for the life of `r`.
        let mem = unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), r.len()) };
        for i in (0..mem.len()).step_by(4096) {
            mem[i] = (round as u8).wrapping_add(1);
        }
        assert_eq!(mem[mem.len() - 4096], (round as u8).wrapping_add(1));
    }
    let maps_after = std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.lines().count())
        .unwrap_or(0);
    assert!(
        maps_after <= maps_before + 4,
        "mappings leaked: {maps_before} -> {maps_after}"
    );
    // Dropped regions removed their pages from the store.
    for obj in objs {
        assert!(st.get((obj, 0)).expect("get").is_none());
    }
}

#[test]
fn bad_options_are_refused() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tmp");
    let st = store(dir.path());
    assert!(Region::new(
        st.clone(),
        1 << 20,
        &RegionOptions {
            page: 5000,
            budget: 1 << 20,
            fault_threads: 1
        }
    )
    .is_err());
    assert!(Region::new(
        st.clone(),
        1 << 20,
        &RegionOptions {
            page: 2 << 20,
            budget: 8 << 20,
            fault_threads: 1
        }
    )
    .is_err());
    assert!(Region::new(
        st,
        1 << 20,
        &RegionOptions {
            page: 64 << 10,
            budget: 4096,
            fault_threads: 1
        }
    )
    .is_err());
}

#[test]
fn sequential_scans_prefetch_and_stay_exact() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let r = filled_region(st, 0xABCD);
    let mem = words_of(&r);
    // A sequential read scan over data that is mostly on the array.
    let mut out = Vec::new();
    for _ in 0..3 {
        out.push(
            r.counters()
                .bytes_out
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        for (i, w) in mem.iter().enumerate() {
            assert_eq!(*w, i as u64 ^ 0xABCD, "word {i}");
        }
    }
    // Prefetch maps pages writable only while the region is being written: a read-only scan
    // after the writes soon drops its pages clean again instead of writing them all back.
    let last_scan = r
        .counters()
        .bytes_out
        .load(std::sync::atomic::Ordering::Relaxed)
        - out[2];
    assert!(
        last_scan < r.len() as u64 / 4,
        "a read-only scan wrote {last_scan} bytes out"
    );
    assert!(r.error().is_none(), "{:?}", r.error());
    assert!(
        r.counters()
            .prefetched
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0,
        "no prefetch on a sequential scan"
    );
    assert!(r.resident() <= 8 << 20);
}

/// Many threads add to the same words while their pages are faulted in, write-protected,
/// evicted and read back: every increment must survive (a lost one is a page evicted with a
/// stale copy or a write slipped past the protection).
#[test]
fn many_threads_adding_to_the_same_pages_lose_nothing() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let pager = pager(st, 4 << 20, None);
    let r = pager.map(16 << 20, 4096).expect("region");
    let words = r.len() / 8;
    let base = r.as_ptr() as usize;
    let threads = 8usize;
    let rounds = 3u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                // SAFETY: the mapping outlives the scope.
                let mem = unsafe { atomics(base, words) };
                for _ in 0..rounds {
                    // Each thread walks the region from its own starting point, one word per
                    // 512 (so every page is hit by every thread in every round).
                    let start = t * words / threads;
                    for k in (0..words).step_by(512) {
                        let i = (start + k) % words;
                        mem[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    // SAFETY: as above; all writers have finished.
    let mem = unsafe { std::slice::from_raw_parts(base as *const u64, words) };
    let want = threads as u64 * rounds;
    let mut hit = 0;
    for (i, &w) in mem.iter().enumerate() {
        let start_hits = (0..threads)
            .filter(|t| ((i + words - t * words / threads) % words).is_multiple_of(512))
            .count() as u64;
        assert_eq!(w, start_hits * rounds, "word {i}");
        hit += start_hits;
    }
    assert_eq!(hit * rounds, want * (words as u64).div_ceil(512));
    assert!(pager.error().is_none(), "{:?}", pager.error());
    assert!(pager.resident() <= (4 << 20) + 2 * (64 << 10));
    let c = pager.counters().snapshot();
    assert!(c.evictions > 0 && c.bytes_in > 0, "{c:?}");
}

/// One pager, 1000 regions mapped, written, read and dropped: no mapping, resident byte,
/// committed byte or store page is left.
#[test]
fn a_thousand_regions_leave_nothing_behind() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let pager = pager(st.clone(), 1 << 20, Some(64 << 20));
    // Virtual size of the process: 1000 regions of 1-5 MiB are 3 GiB; a leak of a tenth of
    // them would show. (Counting lines of /proc/self/maps is not stable: threads of the
    // array come and go with their stacks.)
    let maps = || {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmSize:"))
                    .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
            })
            .and_then(|kb| kb.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    // Warm up: the pager's threads make their allocator arenas (mappings of their own) now.
    for _ in 0..50 {
        let r = pager.map(1 << 20, 4096).expect("region");
        // SAFETY: valid mapping for the life of `r`.
        unsafe { std::ptr::write_bytes(r.as_ptr(), 7, r.len()) };
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let before = maps();
    let mut objs = Vec::new();
    for round in 0..1000u64 {
        let len = (1 + round as usize % 5) << 20;
        let r = pager.map(len, 4096).expect("region");
        objs.push(r.obj());
        // SAFETY: valid mapping for the life of `r`.
        let mem = unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), r.len()) };
        for i in (0..mem.len()).step_by(8192) {
            mem[i] = (round as u8) | 1;
        }
        for i in (0..mem.len()).step_by(8192) {
            assert_eq!(mem[i], (round as u8) | 1, "round {round} byte {i}");
        }
    }
    // Prefetches of dropped regions may still be queued: they undo their charge when they
    // run. Wait for that (bounded).
    let t = std::time::Instant::now();
    while pager.resident() != 0 && t.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(pager.committed(), 0);
    assert_eq!(pager.resident(), 0);
    let after = maps();
    assert!(
        after <= before + (256 << 20),
        "mappings leaked: virtual size {before} -> {after}"
    );
    for obj in objs {
        for p in 0..80 {
            assert!(
                st.get((obj, p)).expect("get").is_none(),
                "obj {obj} page {p}"
            );
        }
    }
    assert!(pager.error().is_none(), "{:?}", pager.error());
    assert_eq!(pager.counters().snapshot().regions, 1050);
}

/// Regions beyond the commit limit are refused up front.
#[test]
fn the_commit_limit_refuses_what_the_store_cannot_hold() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let pager = pager(st, 1 << 20, Some(8 << 20));
    let a = pager.map(6 << 20, 4096).expect("fits");
    assert!(matches!(
        pager.map(4 << 20, 4096),
        Err(tierstack_mem::MemError::NoSpace { .. })
    ));
    drop(a);
    let _b = pager.map(8 << 20, 1 << 21).expect("fits again");
    assert_eq!(_b.as_ptr() as usize % (1 << 21), 0, "alignment");
}

/// Strided and backward fault streams are followed: pages ahead of the program are mapped
/// before it touches them, and the data is exact.
#[test]
fn strided_and_backward_streams_prefetch() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let pager = pager(st, 4 << 20, None);
    let page = 64 << 10;
    let r = pager.map(32 << 20, 4096).expect("region");
    let words = r.len() / 8;
    // SAFETY: valid mapping of r.len() bytes for the life of `r`; only this test uses it.
    let mem = unsafe { std::slice::from_raw_parts_mut(r.as_ptr() as *mut u64, words) };
    for (i, w) in mem.iter_mut().enumerate() {
        *w = i as u64 ^ 0x1234_5678;
    }
    let per_page = page / 8;
    let npages = words / per_page;
    let before = pager.counters().snapshot();
    // Every third page, forwards.
    for p in (0..npages).step_by(3) {
        assert_eq!(
            mem[p * per_page + 5],
            (p * per_page + 5) as u64 ^ 0x1234_5678
        );
    }
    let mid = pager.counters().snapshot();
    assert!(
        mid.prefetched > before.prefetched,
        "no prefetch on a stride-3 scan"
    );
    assert!(mid.prefetch_hits > before.prefetch_hits, "{mid:?}");
    // Backwards, every page.
    for p in (0..npages).rev() {
        assert_eq!(
            mem[p * per_page + 9],
            (p * per_page + 9) as u64 ^ 0x1234_5678
        );
    }
    let end = pager.counters().snapshot();
    assert!(
        end.prefetched > mid.prefetched,
        "no prefetch on a backward scan"
    );
    assert!(pager.error().is_none());
}

/// Random access with 4 KiB pages: evictions take scattered dirty victims together with the
/// other resident pages of their block (one write-protection over a block with holes and
/// pages being loaded) while four threads keep writing. Each thread adds to its own word of
/// each page it picks, so every page's final contents are known; none may be lost.
/// `threads` threads (registered with the pager's CPU table when `register`) each read a
/// random word and add 1 to its own word of a random 4 KiB page, `per_thread` times, then the
/// region is checked against their counts. Returns whether every thread registered.
fn random_adders(
    pager: &tierstack_mem::Pager,
    r: &Region,
    threads: usize,
    per_thread: usize,
    register: bool,
) -> bool {
    let pages = r.len() / 4096;
    let base = r.as_ptr() as usize;
    let results: Vec<(bool, Vec<u64>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let registered = register && tierstack_mem::register_current_thread();
                    // SAFETY: the mapping outlives the scope.
                    let mem = unsafe { atomics(base, pages * 512) };
                    let mut n = vec![0u64; pages];
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                    for _ in 0..per_thread {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let p = (x % pages as u64) as usize;
                        // Reads of other pages in between: clean victims too.
                        let q = ((x >> 20) % pages as u64) as usize;
                        std::hint::black_box(
                            mem[q * 512 + 300].load(std::sync::atomic::Ordering::Relaxed),
                        );
                        mem[p * 512 + t].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        n[p] += 1;
                    }
                    (registered, n)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    // SAFETY: as above; all writers have finished.
    let mem = unsafe { std::slice::from_raw_parts(base as *const u64, pages * 512) };
    for p in 0..pages {
        for (t, (_, c)) in results.iter().enumerate() {
            assert_eq!(mem[p * 512 + t], c[p], "page {p} word {t}");
        }
    }
    assert!(pager.error().is_none(), "{:?}", pager.error());
    results.iter().all(|(reg, _)| *reg)
}

fn small_page_pager(st: Arc<TieredStore>, fault_threads: usize) -> tierstack_mem::Pager {
    tierstack_mem::Pager::new(
        st,
        &tierstack_mem::PagerOptions {
            page: 4096,
            budget: 2 << 20,
            fault_threads,
            commit_limit: None,
        },
    )
    .expect("pager")
}

/// Threads adding to counters in a few pages while a budget of a quarter of them keeps every
/// page coming and going: every increment must survive. This caught `UFFDIO_MOVE` answering
/// an error for a page it had moved (see `Inner::move_out`), which lost increments on every
/// run. `TIERSTACK_MEM_STRESS_ROUNDS` sets the rounds (default 2).
#[test]
fn counters_in_pages_that_keep_leaving_lose_no_increment() {
    let rounds: usize = std::env::var("TIERSTACK_MEM_STRESS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    for k in 0..rounds {
        // (pages, budget in pages, page size): pages of 16 KiB move in four 4 KiB steps,
        // which a refused move can split.
        for (pages, budget, page) in [
            (64usize, 16u64, 4096usize),
            (512, 64, 4096),
            (64, 16, 16384),
        ] {
            let Some((_serial, _dir, st)) = setup() else {
                return;
            };
            let pager = tierstack_mem::Pager::new(
                st,
                &tierstack_mem::PagerOptions {
                    page,
                    budget: budget * page as u64,
                    fault_threads: tierstack_mem::default_fault_threads(),
                    commit_limit: None,
                },
            )
            .expect("pager");
            let r = pager.map(pages * page, page).expect("region");
            random_adders(&pager, &r, 4, 20_000, k % 2 == 0);
            let c = pager.counters().snapshot();
            eprintln!(
                "round {k} pages {pages} of {page}: evictions {} moved_out {} move_failed {} \
                 move_misreported {}",
                c.evictions, c.moved_out, c.move_failed, c.move_misreported
            );
            assert!(c.evictions > 10_000, "{c:?}");
        }
    }
}

#[test]
fn random_writers_on_small_pages_lose_nothing() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let pager = small_page_pager(st, 2);
    let r = pager.map(12 << 20, 4096).expect("region");
    random_adders(&pager, &r, 4, 20_000, false);
    let c = pager.counters().snapshot();
    assert!(c.evictions > 1000 && c.clean_drops > 0, "{c:?}");
    assert_eq!(c.handed_over, 0, "unregistered threads: {c:?}");
}

#[test]
fn faults_of_registered_threads_go_to_their_cpus_fault_thread_and_stay_exact() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let pager = small_page_pager(st, tierstack_mem::default_fault_threads());
    let r = pager.map(8 << 20, 4096).expect("region");
    let registered = random_adders(&pager, &r, 4, 15_000, true);
    let c = pager.counters().snapshot();
    assert!(c.evictions > 1000, "{c:?}");
    assert!(c.stolen <= c.handed_over, "{c:?}");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus >= 2 && registered {
        // Four program threads on at least two CPUs: some faults are read by the fault
        // thread of another CPU than the faulting thread's and handed over.
        assert!(c.handed_over > 0, "{c:?}");
    } else {
        eprintln!("SKIP (partly): one CPU or no rseq area: no faults to hand over");
    }
}

/// A stream that writes makes its region hot: pages read ahead are then mapped writable with
/// a hash instead of write-protected, and eviction compares. Sweeps that change a scattered
/// third of the pages, a word anywhere in each, must keep every change (a changed page taken
/// for unchanged would lose it) while the unchanged pages leave without a write.
#[test]
fn hashed_pages_of_a_written_stream_keep_every_write() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let pager = tierstack_mem::Pager::new(
        st,
        &tierstack_mem::PagerOptions {
            page: 8192,
            budget: 4 << 20,
            fault_threads: 2,
            commit_limit: None,
        },
    )
    .expect("pager");
    let r = pager.map(24 << 20, 8192).expect("region");
    let words = r.len() / 8;
    let wpp = 8192 / 8;
    let pages = words / wpp;
    // SAFETY: valid mapping of r.len() bytes for the life of `r`; only this test uses it.
    let mem = unsafe { std::slice::from_raw_parts_mut(r.as_ptr() as *mut u64, words) };
    // The model: every word's value is a function of (page, word, the page's version) with
    // the version bumped in one word per changed page.
    let mut ver = vec![0u64; pages];
    let value = |p: usize, w: usize, v: u64| (p as u64) << 32 ^ (w as u64) << 8 ^ v;
    for p in 0..pages {
        for w in 0..wpp {
            mem[p * wpp + w] = value(p, w, 0);
        }
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // Which word of each page holds its version (the rest keep version 0).
    let mut at = vec![0usize; pages];
    let before = pager.counters().snapshot();
    for _sweep in 0..4 {
        for p in 0..pages {
            // Read the page's first and version words (they fault it in).
            assert_eq!(
                mem[p * wpp],
                value(p, 0, if at[p] == 0 { ver[p] } else { 0 })
            );
            assert_eq!(mem[p * wpp + at[p]], value(p, at[p], ver[p]), "page {p}");
            if rnd() % 3 == 0 {
                // Change it: move its version to another word.
                let w = (rnd() % wpp as u64) as usize;
                mem[p * wpp + at[p]] = value(p, at[p], 0);
                ver[p] += 1;
                at[p] = w;
                mem[p * wpp + w] = value(p, w, ver[p]);
            }
        }
    }
    for p in 0..pages {
        for w in 0..wpp {
            let v = if w == at[p] { ver[p] } else { 0 };
            assert_eq!(mem[p * wpp + w], value(p, w, v), "page {p} word {w}");
        }
    }
    let c = pager.counters().snapshot();
    assert!(pager.error().is_none(), "{:?}", pager.error());
    // The written stream took (almost) no write-protect faults, and the pages it did not
    // change left without a write: less than all of the sweeps' pages were written out.
    let evicted = c.evictions - before.evictions;
    let written = (c.bytes_out - before.bytes_out) / 8192;
    assert!(
        c.clean_drops > before.clean_drops && written < evicted,
        "evicted {evicted}, written {written}: {c:?}"
    );
    assert!(
        c.wp_faults - before.wp_faults < evicted / 4,
        "write-protect faults {} for {evicted} evictions: {c:?}",
        c.wp_faults - before.wp_faults
    );
}

/// Two sequential streams interleaved a few pages apart (the pairs i, i + 2^k of an FFT
/// butterfly) are both followed: most of their pages come in by read-ahead, not by faults.
#[test]
fn interleaved_nearby_streams_are_both_prefetched() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let r = Region::new(st, 32 << 20, &opts()).expect("region");
    let page = 64 << 10;
    let pages = r.len() / page;
    let wpp = page / 8;
    // SAFETY: valid mapping of r.len() bytes for the life of `r`; only this test uses it.
    let mem = unsafe { std::slice::from_raw_parts_mut(r.as_ptr() as *mut u64, r.len() / 8) };
    for (i, w) in mem.iter_mut().enumerate() {
        *w = i as u64;
    }
    let c = || r.counters().snapshot();
    let before = c();
    // Pairs (i, i + 32), read, over half the region (256 of its 512 pages; 128 fit).
    let stride = 32;
    let mut touched = 0u64;
    for i in 0..pages / 2 {
        let j = (i / stride) * 2 * stride + i % stride;
        for p in [j, j + stride] {
            if p < pages {
                assert_eq!(mem[p * wpp], (p * wpp) as u64, "page {p}");
                touched += 1;
            }
        }
    }
    let after = c();
    let reads = after.store_reads - before.store_reads;
    // Before both were followed every page faulted (512 of 512); now about 190 do (a small
    // budget leaves the read-ahead little room here).
    assert!(
        reads * 2 < touched,
        "{reads} store reads on faults for {touched} pages touched: {after:?}"
    );
    assert!(r.error().is_none(), "{:?}", r.error());
}

/// A loop over more memory than the budget (a solver sweeping its arrays every iteration)
/// keeps part of the loop resident across passes: the pages loaded behind the sweep are
/// evicted first, so a later pass reads only what did not stay, where FIFO eviction would
/// read every page on every pass.
#[test]
fn a_loop_larger_than_the_budget_keeps_part_of_it_resident() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let r = filled_region(st, 0);
    let words = r.len() / 8;
    let mem = words_of(&r);
    let wpp = (64 << 10) / 8;
    let mut last_pass = 0;
    for pass in 0..4u64 {
        let before = r.counters().snapshot().bytes_in;
        for i in (0..words).step_by(wpp / 4) {
            assert_eq!(mem[i] & 0xFFFF_FFFF, i as u64, "word {i}, pass {pass}");
            if i % (2 * wpp) == 0 {
                mem[i] = (pass + 1) << 32 | i as u64;
            }
        }
        last_pass = r.counters().snapshot().bytes_in - before;
    }
    // 32 MiB looped with an 8 MiB budget: a FIFO reads all 32 MiB each pass.
    assert!(
        last_pass < (32 << 20) * 9 / 10,
        "the last pass read {last_pass} bytes of 32 MiB: nothing of the loop stayed resident"
    );
    assert!(r.error().is_none(), "{:?}", r.error());
}

/// The store's index lives in the process too: it is charged to the budget, so once a
/// region many times the budget has been paged out, resident pages keep under the budget
/// less the index (`run`'s peak RSS stays within `--dram` plus the fixed allowance however
/// much is paged out).
#[test]
fn the_store_index_is_charged_to_the_budget() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let budget: u64 = 8 << 20;
    let p = pager_of(st, 4096, budget, None);
    let r = p.map(96 << 20, 4096).expect("region");
    let mem = words_of(&r);
    let wpp = 4096 / 8;
    for pass in 0..2u64 {
        for i in (0..mem.len()).step_by(wpp) {
            mem[i] = pass << 40 | i as u64;
        }
    }
    // Random reads for a while: the evictor keeps looking at the index as it goes.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let pages = mem.len() / wpp;
    let mut worst = 0u64;
    for n in 0..20_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x as usize % pages) * wpp;
        assert_eq!(mem[i], 1 << 40 | i as u64, "word {i}");
        if n % 1000 == 999 {
            std::thread::sleep(std::time::Duration::from_millis(25));
            let index = p
                .counters()
                .index_bytes
                .load(std::sync::atomic::Ordering::Relaxed);
            worst = worst.max((p.resident() + index).saturating_sub(budget));
        }
    }
    let index = p
        .counters()
        .index_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(index > 0, "the index was never measured");
    // One eviction batch of leeway: a fault may map before the evictor catches up.
    assert!(
        worst <= 64 * 4096,
        "resident pages and the index passed the budget by {worst} bytes (index {index})"
    );
    assert!(r.error().is_none(), "{:?}", r.error());
}

/// A program that goes through memory in small local permutations (an FFT's butterflies
/// with pairs i, i + 2: pages 0, 2, 1, 3, 4, 6, 5, 7, ...) is a sequential stream: read ahead,
/// not faulted page by page.
#[test]
fn pairs_two_pages_apart_are_read_ahead_as_a_stream() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let p = pager_of(st, 4096, 8 << 20, None);
    let r = p.map(48 << 20, 4096).expect("region");
    let mem = words_of(&r);
    let wpp = 4096 / 8;
    let pages = mem.len() / wpp;
    for pg in 0..pages {
        mem[pg * wpp] = pg as u64 + 1;
    }
    // Back to the start: the first pages are long evicted.
    let before = p.counters().snapshot();
    for base in (0..pages).step_by(4) {
        for pg in [base, base + 2, base + 1, base + 3] {
            assert_eq!(mem[pg * wpp], pg as u64 + 1, "page {pg}");
        }
    }
    let after = p.counters().snapshot();
    let faults = after.faults - before.faults;
    assert!(
        faults < pages as u64 / 8,
        "{faults} faults for {pages} pages visited two by two: not followed as a stream"
    );
    assert!(r.error().is_none(), "{:?}", r.error());
}

/// Fresh memory a program reads before it writes (zero fills), and pages it changed that
/// come back from the store, take (almost) no write-protect faults on their next write; once
/// the program only reads, pages leave again without being written out. Every value is kept.
#[test]
fn written_pages_come_back_writable_and_readers_write_nothing() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let pager = pager_of(st, 4096, 4 << 20, None);
    let r = pager.map(24 << 20, 4096).expect("region");
    let mem = words_of(&r);
    let wpp = 4096 / 8;
    let pages = mem.len() / wpp;
    // A fixed random order of the pages: no stream for the read-ahead to follow.
    let mut order: Vec<usize> = (0..pages).collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in (1..pages).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let value = |p: usize, round: u64| (p as u64) << 16 | round;
    let before = pager.counters().snapshot();
    // Read, then write: first on fresh memory, then twice on pages that went to the store.
    for round in 0..3u64 {
        for &p in &order {
            let want = if round == 0 { 0 } else { value(p, round - 1) };
            assert_eq!(mem[p * wpp + 7], want, "page {p} round {round}");
            mem[p * wpp + 7] = value(p, round);
        }
    }
    let written = pager.counters().snapshot();
    assert!(pager.error().is_none(), "{:?}", pager.error());
    let wp = written.wp_faults - before.wp_faults;
    assert!(
        wp < 3 * pages as u64 / 10,
        "{wp} write-protect faults for {} page writes: {written:?}",
        3 * pages
    );
    // Then only reads: after the first pass the pages leave without a write.
    for _ in 0..2 {
        for &p in &order {
            assert_eq!(mem[p * wpp + 7], value(p, 2), "page {p}");
        }
    }
    let mid = pager.counters().snapshot();
    for &p in &order {
        assert_eq!(mem[p * wpp + 7], value(p, 2), "page {p}");
    }
    let end = pager.counters().snapshot();
    assert!(pager.error().is_none(), "{:?}", pager.error());
    let out = (end.bytes_out - mid.bytes_out) / 4096;
    let evicted = end.evictions - mid.evictions;
    assert!(
        evicted > pages as u64 / 2 && out < evicted / 10,
        "last read-only pass: {evicted} evictions, {out} pages written: {end:?}"
    );
}

/// Data written under either dirty tracking, forced with `TIERSTACK_MEM_WP`, survives
/// eviction and reload: pages read back and written again (under async write-protect
/// without a fault to the pager, found by `PAGEMAP_SCAN` and moved out with `UFFDIO_MOVE`),
/// pages read back and not written (dropped after their hash matched), and one word per page
/// written by other threads while eviction takes pages.
#[test]
fn writes_survive_eviction_under_both_dirty_trackings() {
    let Some((_serial, _dir, st)) = setup() else {
        return;
    };
    let caps = tierstack_mem::uffd::available().expect("probe");
    let mut modes = vec![("fault", tierstack_mem::DirtyTracking::Fault)];
    if caps.async_dirty_tracking() {
        modes.push(("async", tierstack_mem::DirtyTracking::Async));
    } else {
        eprintln!("SKIP (async half): the kernel lacks it: {caps:?}");
    }
    for (name, mode) in modes {
        // Under the serial lock no other test makes a pager meanwhile.
        std::env::set_var(tierstack_mem::WP_ENV, name);
        let pager = pager_of(st.clone(), 4096, 4 << 20, None);
        std::env::remove_var(tierstack_mem::WP_ENV);
        assert_eq!(pager.dirty_tracking(), mode);
        let r = pager.map(16 << 20, 4096).expect("region");
        let mem = words_of(&r);
        let wpp = 4096 / 8;
        let pages = mem.len() / wpp;
        for (i, w) in mem.iter_mut().enumerate() {
            *w = i as u64;
        }
        let before = pager.counters().snapshot();
        // Every other page read back from the store and written once more; the others read.
        for round in 0..3u64 {
            for p in 0..pages {
                let w = p * wpp + 5;
                assert_eq!(
                    mem[w],
                    if round == 0 || p % 2 == 1 {
                        w as u64
                    } else {
                        (w as u64) << 8 | (round - 1)
                    },
                    "{name}: page {p} round {round}"
                );
                if p % 2 == 0 {
                    mem[w] = (w as u64) << 8 | round;
                }
            }
        }
        // Threads add to one word per page while the pages move.
        let base = r.as_ptr() as usize;
        std::thread::scope(|s| {
            for t in 0..2usize {
                s.spawn(move || {
                    // SAFETY: the region outlives the scope; atomic words.
                    let a = unsafe { atomics(base, pages * wpp) };
                    for p in (0..pages).rev() {
                        a[p * wpp + 100 + t]
                            .fetch_add(1 << 40, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        });
        for p in 0..pages {
            let w = p * wpp + 5;
            let want = if p % 2 == 0 {
                (w as u64) << 8 | 2
            } else {
                w as u64
            };
            assert_eq!(mem[w], want, "{name}: page {p}");
            for t in 0..2 {
                let w = p * wpp + 100 + t;
                assert_eq!(mem[w], w as u64 + (1 << 40), "{name}: page {p} thread {t}");
            }
        }
        let c = pager.counters().snapshot();
        assert!(pager.error().is_none(), "{name}: {:?}", pager.error());
        assert!(
            c.evictions - before.evictions > 2 * pages as u64,
            "{name}: {c:?}"
        );
        match mode {
            tierstack_mem::DirtyTracking::Async => {
                assert_eq!(c.wp_faults, 0, "{name}: {c:?}");
                assert!(
                    c.moved_out > pages as u64 && c.scanned_written > 0,
                    "{name}: {c:?}"
                );
                assert!(c.clean_drops > 0, "{name}: {c:?}");
            }
            tierstack_mem::DirtyTracking::Fault => {
                assert!(c.wp_faults > 0 && c.moved_out == 0, "{name}: {c:?}");
            }
        }
        drop(r);
        drop(pager);
    }
}
