//! Stress of the pager's dirty tracking: program threads add to counters in a few pages
//! while a budget of a few pages keeps every page coming and going. Every increment must
//! survive. `TIERSTACK_MEM_STRESS_ROUNDS` sets the rounds (default 2).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use tierstack_array::{Array, ArrayOptions, CreateParams, Level};
use tierstack_store::{ArrayTier, TieredStore};

fn store(dir: &std::path::Path) -> Arc<TieredStore> {
    let paths: Vec<_> = (0..4).map(|i| dir.join(format!("d{i}"))).collect();
    let p = CreateParams {
        level: Level::Raid5,
        chunk: 64 << 10,
        groups: None,
        size: Some(64 << 20),
    };
    let a = Array::create(&paths, &p, &ArrayOptions::default()).expect("array");
    Arc::new(TieredStore::new(1 << 20, vec![Box::new(ArrayTier::new(a))]).expect("store"))
}

fn round(seed: u64, pages: usize, budget_pages: u64, threads: usize, ops: usize, reg: bool) {
    let dir = tempfile::tempdir().expect("tmp");
    let pager = tierstack_mem::Pager::new(
        store(dir.path()),
        &tierstack_mem::PagerOptions {
            page: 4096,
            budget: budget_pages * 4096,
            fault_threads: tierstack_mem::default_fault_threads(),
            commit_limit: None,
        },
    )
    .expect("pager");
    let r = pager.map(pages * 4096, 4096).expect("region");
    let base = r.as_ptr() as usize;
    let counts: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    if reg {
                        tierstack_mem::register_current_thread();
                    }
                    // SAFETY: the region's mapping outlives the scope; atomics make the
                    // threads' accesses well defined.
                    let mem = unsafe {
                        std::slice::from_raw_parts(base as *const AtomicU64, pages * 512)
                    };
                    let mut n = vec![0u64; pages];
                    let mut x = seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    for _ in 0..ops {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let p = (x % pages as u64) as usize;
                        let q = ((x >> 20) % pages as u64) as usize;
                        std::hint::black_box(mem[q * 512 + 300].load(Relaxed));
                        mem[p * 512 + t].fetch_add(1, Relaxed);
                        n[p] += 1;
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    // SAFETY: as above; every writer has finished.
    let mem = unsafe { std::slice::from_raw_parts(base as *const u64, pages * 512) };
    let c = pager.counters().snapshot();
    for p in 0..pages {
        for (t, n) in counts.iter().enumerate() {
            assert_eq!(
                mem[p * 512 + t],
                n[p],
                "seed {seed} pages {pages} budget {budget_pages}: page {p} word {t}; {c:?}"
            );
        }
    }
    assert!(pager.error().is_none(), "{:?}", pager.error());
    eprintln!(
        "seed {seed} pages {pages}: evictions {} moved_out {} move_failed {} move_misreported {}",
        c.evictions, c.moved_out, c.move_failed, c.move_misreported
    );
}

#[test]
fn counters_in_pages_that_keep_leaving_lose_no_increment() {
    let rounds: u64 = std::env::var("TIERSTACK_MEM_STRESS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    if tierstack_mem::uffd::available().is_err() {
        eprintln!("SKIP: /dev/userfaultfd not usable here");
        return;
    }
    for k in 0..rounds {
        let seed = 0x5eed_0000 + k;
        round(seed, 64, 16, 4, 20_000, k % 2 == 0);
        round(seed, 512, 64, 4, 20_000, k % 2 == 1);
    }
}
