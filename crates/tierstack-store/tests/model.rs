//! The tiered store against a model: random puts, gets, removes and flushes with a DRAM tier
//! far smaller than the data, over a real array; then durability across a reopen.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::page;
use proptest::prelude::*;
use tierstack_array::{Array, ArrayOptions};
use tierstack_store::{ArrayTier, TieredStore};

fn array(dir: &std::path::Path) -> (Vec<PathBuf>, Array) {
    common::array(dir, 64 << 20)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, max_shrink_iters: 50, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(ops in proptest::collection::vec(common::op(64, vec![4096, 65536]), 1..300)) {
        let dir = tempfile::tempdir().expect("tmp");
        let (paths, a) = array(dir.path());
        // 256 KiB of DRAM: most pages live on the array.
        let store = TieredStore::new(256 << 10, vec![Box::new(ArrayTier::new(a))]).expect("store");
        let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for op in &ops {
            common::apply(&store, &mut model, 3, op)?;
            let st = store.status();
            prop_assert!(st[0].used_bytes <= (256 << 10) + 65536, "DRAM over budget: {:?}", st[0]);
        }
        store.flush().expect("flush");
        for (k, v) in &model {
            let got = store.get((3, *k)).expect("get");
            prop_assert_eq!(got.as_ref(), Some(v));
        }
        drop(store);
        // Everything flushed is on the array alone.
        let a = Array::open(&paths, &ArrayOptions::default()).expect("reopen");
        let store = TieredStore::new(1 << 20, vec![Box::new(ArrayTier::new(a))]).expect("store");
        for k in 0..64u64 {
            let got = store.get((3, k)).expect("get");
            prop_assert_eq!(got.as_ref(), model.get(&k), "after reopen {}", k);
        }
    }
}

#[test]
fn many_threads_share_the_store() {
    let dir = tempfile::tempdir().expect("tmp");
    let (_paths, a) = array(dir.path());
    let store = TieredStore::new(1 << 20, vec![Box::new(ArrayTier::new(a))]).expect("store");
    common::four_threads(&store, 16384);
    let st = store.status();
    assert!(
        st[0].evictions > 0,
        "the DRAM tier never evicted: {:?}",
        st[0]
    );
    assert!(st[1].puts > 0);
}

#[test]
fn rejects_bad_input_and_reports_full() {
    assert!(TieredStore::new(0, vec![]).is_err());
    let only_dram = TieredStore::new(64 << 10, vec![]).expect("store");
    assert!(only_dram.put((1u64 << 60, 0), b"x").is_err());
    assert!(only_dram.put((1, 0), &vec![0u8; (1 << 20) + 1]).is_err());
    only_dram.put((1, 0), &vec![1u8; 60 << 10]).expect("fits");
    let err = only_dram
        .put((1, 1), &vec![1u8; 60 << 10])
        .expect_err("full");
    assert!(err.to_string().contains("full"), "{err}");
}

#[test]
fn owned_shared_and_in_place_pages() {
    let dir = tempfile::tempdir().expect("tmp");
    let (_paths, a) = array(dir.path());
    let store = TieredStore::new(8 << 20, vec![Box::new(ArrayTier::new(a))]).expect("store");
    let mut v = store.page_buf(1 << 20);
    assert!(v.is_empty() && v.capacity() >= 1 << 20);
    v.extend_from_slice(&page(1 << 20, 1));
    store.put_owned((1, 0), v).expect("put_owned");
    // In place: cut to 10 bytes, grown to 4096 with zeros, then changed.
    assert!(store
        .update((1, 0), 10, 4096, |b| b[100..104].copy_from_slice(b"abcd"))
        .expect("update"));
    let mut want = page(1 << 20, 1);
    want.truncate(10);
    want.resize(4096, 0);
    want[100..104].copy_from_slice(b"abcd");
    assert_eq!(store.get((1, 0)).expect("get"), Some(want.clone()));
    // A reader holds the contents: no change in place, and what it holds never changes.
    let held = store.get_shared((1, 0)).expect("get").expect("present");
    assert!(!store.update((1, 0), 0, 1, |_| {}).expect("update"));
    store.put((1, 0), b"new").expect("put");
    assert_eq!(held.as_slice(), want.as_slice());
    assert_eq!(
        store.get((1, 0)).expect("get").as_deref(),
        Some(&b"new"[..])
    );
    assert!(!store.update((1, 9), 0, 1, |_| {}).expect("absent page"));
    assert!(store.update((1, 0), 0, (1 << 20) + 1, |_| {}).is_err());
    // Written back: on the array, still readable, nothing dirty.
    assert!(store.write_back(u64::MAX).expect("write back") >= 3);
    assert_eq!(store.dirty_bytes(), 0);
    assert_eq!(store.status()[1].puts, 1);
    assert_eq!(
        store.get((1, 0)).expect("get").as_deref(),
        Some(&b"new"[..])
    );
}

#[test]
fn eviction_hands_the_pages_back_intact() {
    let dir = tempfile::tempdir().expect("tmp");
    let (paths, a) = array(dir.path());
    // 4 MiB of DRAM, 24 pages of 1 MiB: most are evicted, their buffers reused.
    let store = TieredStore::new(4 << 20, vec![Box::new(ArrayTier::new(a))]).expect("store");
    for k in 0..24u64 {
        let mut v = store.page_buf(1 << 20);
        v.extend_from_slice(&page(1 << 20, k as u8));
        store.put_owned((2, k), v).expect("put");
    }
    for k in 0..24u64 {
        assert_eq!(
            store.get((2, k)).expect("get"),
            Some(page(1 << 20, k as u8)),
            "page {k}"
        );
    }
    store.flush().expect("flush");
    drop(store);
    let a = Array::open(&paths, &ArrayOptions::default()).expect("reopen");
    let store = TieredStore::new(4 << 20, vec![Box::new(ArrayTier::new(a))]).expect("store");
    for k in 0..24u64 {
        assert_eq!(
            store.get((2, k)).expect("get"),
            Some(page(1 << 20, k as u8))
        );
    }
}

#[test]
fn make_room_evicts_ahead_of_need() {
    let dir = tempfile::tempdir().expect("tmp");
    let (_paths, a) = array(dir.path());
    let store = TieredStore::new(8 << 20, vec![Box::new(ArrayTier::new(a))]).expect("store");
    for k in 0..7u64 {
        store.put((4, k), &page(1 << 20, k as u8)).expect("put");
    }
    assert!(!store.make_room(1 << 20).expect("room"), "1 MiB is free");
    assert!(store.make_room(2 << 20).expect("room"));
    let st = store.status();
    assert!(st[0].used_bytes <= 6 << 20, "{:?}", st[0]);
    assert!(st[0].evictions > 0 && st[1].puts > 0);
    for k in 0..7u64 {
        assert_eq!(
            store.get((4, k)).expect("get"),
            Some(page(1 << 20, k as u8))
        );
    }
    let only_dram = TieredStore::new(1 << 20, vec![]).expect("store");
    only_dram.put((4, 0), &[1u8; 1 << 19]).expect("put");
    assert!(!only_dram.make_room(1 << 20).expect("nothing below DRAM"));
}

/// A sequential read of more than the DRAM tier holds replaces only the pages it brought in:
/// the pages already in DRAM stay there (a plain clock would evict each of them just before
/// the scan reached it, and every read of the scan would go to the array).
#[test]
fn a_scan_larger_than_dram_keeps_what_dram_holds() {
    let dir = tempfile::tempdir().expect("tmp");
    let (_paths, a) = array(dir.path());
    let store = TieredStore::new(8 << 20, vec![Box::new(ArrayTier::new(a))]).expect("store");
    // Sixteen 1 MiB pages through an 8 MiB tier: the first ones go to the array.
    for k in 0..16u64 {
        store.put((5, k), &page(1 << 20, k as u8)).expect("put");
    }
    store.flush().expect("flush");
    let from_array = |store: &TieredStore| {
        let before = store.status()[1].hits;
        for k in 0..16u64 {
            assert_eq!(
                store.get_shared((5, k)).expect("get").as_deref(),
                Some(&page(1 << 20, k as u8))
            );
        }
        store.status()[1].hits - before
    };
    let first = from_array(&store);
    assert!(
        first <= 12,
        "{first} of 16 pages read from the array: DRAM kept none"
    );
    for _ in 0..3 {
        assert_eq!(
            from_array(&store),
            first,
            "a repeated scan read more from the array than the first"
        );
    }
}
