//! Concurrent stress of the whole store (DRAM tier, compressed tier, RAID 5 of file drives)
//! against a model: threads use keys of their own, as the memory front does (one page is
//! handled by one thread at a time), with random puts, reads, batched reads, copies handed to
//! the compressed tier, in-place updates and removals, while another thread evicts ahead,
//! writes back and flushes. Every read must give the model's bytes: what the store's own
//! movements between tiers race with must never show an older version or lose a page.
//! `TIERSTACK_STORE_STRESS_OPS` sets the operations per thread (default 6,000).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use tierstack_store::{ArrayTier, CompressedTier, TieredStore};

/// Contents of a version: half the versions compress (runs of one byte), half do not.
fn contents(key: u64, version: u64, len: usize) -> Vec<u8> {
    let x = (key << 32) ^ version ^ 0x9e37_79b9_7f4a_7c15;
    if version.is_multiple_of(2) {
        let mut v = vec![(x >> 8) as u8; len];
        v[..8].copy_from_slice(&version.to_le_bytes());
        return v;
    }
    common::noise(x, len)
}

#[test]
fn threads_on_keys_of_their_own_always_read_the_last_version() {
    let ops: u64 = std::env::var("TIERSTACK_STORE_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6_000);
    let dir = tempfile::tempdir().expect("tmp");
    let (_paths, array) = common::array(dir.path(), 64 << 20);
    // Small tiers: pages keep moving down (DRAM 256 KiB, arena 512 KiB).
    let compressed = CompressedTier::new(512 << 10, Box::new(ArrayTier::new(array)));
    let store = TieredStore::new(256 << 10, vec![Box::new(compressed)]).expect("store");
    let stop = AtomicBool::new(false);
    const PAGE: usize = 4096;
    const KEYS: u64 = 96;
    std::thread::scope(|s| {
        let store = &store;
        let stop = &stop;
        s.spawn(move || {
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                n += 1;
                match n % 3 {
                    0 => drop(store.make_room(128 << 10)),
                    1 => drop(store.write_back(64 << 10)),
                    _ => drop(store.flush()),
                }
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                s.spawn(move || {
                    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
                    let mut version = 0u64;
                    let mut x = 0x5eed ^ (t + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                    let mut rnd = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    for op in 0..ops {
                        let k = rnd() % KEYS;
                        let key = (t, k);
                        match rnd() % 10 {
                            0..=3 => {
                                version += 1;
                                let v = contents(k, version, PAGE);
                                let mut buf = store.page_buf(PAGE);
                                buf.extend_from_slice(&v);
                                store.put_owned(key, buf).expect("put");
                                model.insert(k, v);
                            }
                            4..=5 => {
                                let got = store.get_uncached(key).expect("get");
                                assert_eq!(got.as_ref(), model.get(&k), "t{t} op {op} key {k}");
                            }
                            6 => {
                                let ks: Vec<u64> = (0..4).map(|j| (k + j) % KEYS).collect();
                                let keys: Vec<(u64, u64)> = ks.iter().map(|&j| (t, j)).collect();
                                let got = store.get_many_uncached(&keys).expect("get many");
                                for (j, g) in ks.iter().zip(got) {
                                    assert_eq!(g.as_ref(), model.get(j), "t{t} op {op} key {j}");
                                }
                            }
                            7 => {
                                // A copy of the current version, as eviction of an unchanged
                                // page hands it.
                                if let Some(v) = model.get(&k) {
                                    if store.wants_copy(key) {
                                        store.admit(key, v).expect("admit");
                                    }
                                }
                            }
                            8 => {
                                if let Some(v) = model.get_mut(&k) {
                                    let b = (op & 0xff) as u8;
                                    if store
                                        .update(key, PAGE, PAGE, |p| p[100] = b)
                                        .expect("update")
                                    {
                                        v[100] = b;
                                    }
                                }
                            }
                            _ => {
                                store.remove(key).expect("remove");
                                model.remove(&k);
                            }
                        }
                    }
                    for (k, v) in &model {
                        let got = store.get_uncached((t, *k)).expect("get");
                        assert_eq!(got.as_ref(), Some(v), "t{t} at the end, key {k}");
                    }
                })
            })
            .collect();
        for w in workers {
            let r = w.join();
            stop.store(true, Relaxed);
            if let Err(e) = r {
                std::panic::resume_unwind(e);
            }
        }
    });
    // Every tier took part: reads were served below DRAM, by the arena and by the drives.
    let st = store.status();
    eprintln!("{st:#?}");
    for t in &st[1..] {
        assert!(t.puts > 0 && t.hits > 0, "{} took no part: {t:?}", t.name);
    }
}
