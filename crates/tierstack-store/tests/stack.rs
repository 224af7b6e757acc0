//! `StackSpec`, the one builder of a tiered store: the tiers come out in the documented order,
//! pages go down through them and come back, and a tier that needs one below refuses to be
//! built without it.

mod common;

use std::sync::Arc;

use tierstack_store::{
    CompressedTier, PageKey, StackSpec, StoreError, Tier, TierCounters, TierStatus, TieredStore,
};

#[test]
fn builds_the_tiers_in_order_and_pages_reach_the_array() {
    let dir = tempfile::tempdir().expect("tmp");
    let (_paths, a) = common::array(dir.path(), 64 << 20);
    let a = Arc::new(a);
    let store = StackSpec::new(1 << 20)
        .array(a.clone())
        .compressed(2 << 20)
        .build()
        .expect("store");
    let names: Vec<String> = store.status().iter().map(|t| t.name.clone()).collect();
    assert_eq!(names, ["dram", "compressed", "array"], "{names:?}");
    // Far more than DRAM and the compressed tier hold, pages that do not compress.
    let page = |i: u64| common::noise(i.wrapping_mul(0x9e37_79b9_7f4a_7c15), 65536);
    for i in 0..128 {
        store.put((1, i), &page(i)).expect("put");
    }
    store.flush().expect("flush");
    assert!(a.status().used_bytes > 0, "pages went down to the array");
    for i in 0..128 {
        assert_eq!(store.get((1, i)).expect("get"), Some(page(i)), "page {i}");
    }
}

#[test]
fn dram_only_and_refusals() {
    let store = StackSpec::new(1 << 20).build().expect("store");
    assert_eq!(store.status().len(), 1);
    assert!(matches!(
        StackSpec::new(1 << 20).compressed(1 << 20).build(),
        Err(StoreError::Config(_))
    ));
    assert!(matches!(
        StackSpec::new(0).build(),
        Err(StoreError::Config(_))
    ));
}

/// Pages of a state vector after a Fourier transform (32-bit floats that LZ4 shrinks only
/// 1.8:1, zstd 2.9:1) that the DRAM tier evicts stay in the compressed tier, and are read back
/// from it.
#[test]
fn float_pages_the_dram_tier_evicts_stay_compressed() {
    let dir = tempfile::tempdir().expect("tmp");
    let (_paths, a) = common::array(dir.path(), 64 << 20);
    let a = Arc::new(a);
    let store = StackSpec::new(1 << 20)
        .array(a.clone())
        .compressed(8 << 20)
        .build()
        .expect("store");
    let state: &[u8] = include_bytes!("fixtures/qft_state_page.bin");
    let page = |i: u64| -> Vec<u8> {
        let mut v = state.to_vec();
        v[..8].copy_from_slice(&i.to_le_bytes());
        v
    };
    // 8 MiB of pages through a 1 MiB DRAM tier.
    for i in 0..2048 {
        store.put_owned((1, i), page(i)).expect("put");
    }
    let c = store.tier_status("compressed").expect("compressed tier");
    assert!(
        c.used_bytes >= 2 << 20,
        "compressed tier holds {} B",
        c.used_bytes
    );
    for i in 0..2048 {
        assert_eq!(
            store.get_uncached((1, i)).expect("get"),
            Some(page(i)),
            "page {i}"
        );
    }
    // All but what the DRAM tier held came from the compressed tier.
    let hits = store.tier_status("compressed").expect("compressed").hits;
    assert!(hits >= 2048 - 256, "{hits} compressed hits");
}

/// A tier that keeps pages in a map and refuses every removal, as a full array that cannot
/// take a tombstone does.
#[derive(Default)]
struct NoRemoval(parking_lot::Mutex<std::collections::HashMap<PageKey, Vec<u8>>>);

type Result<T> = tierstack_store::Result<T>;

struct Refusing(Arc<NoRemoval>);

impl Tier for Refusing {
    fn name(&self) -> &str {
        "refusing"
    }
    fn put(&self, key: PageKey, data: &[u8]) -> Result<()> {
        self.0 .0.lock().insert(key, data.to_vec());
        Ok(())
    }
    fn get(&self, key: PageKey) -> Result<Option<Vec<u8>>> {
        Ok(self.0 .0.lock().get(&key).cloned())
    }
    fn remove(&self, _key: PageKey) -> Result<bool> {
        Err(StoreError::Full("no segment for the tombstone".into()))
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn status(&self) -> TierStatus {
        TierCounters::default().snapshot("refusing", 0, 0, 0)
    }
}

/// A removal that fails below leaves the newest copy of the page where reads find it: the
/// DRAM tier's and the compressed tier's copies are not dropped before the tier below has
/// dropped its older one (the caller keeps counting the page as the file's, and a crash
/// cannot bring the older copy back under a page the caller forgot).
#[test]
fn a_removal_that_fails_below_keeps_the_newest_copy_readable() {
    let below = Arc::new(NoRemoval::default());
    let old = common::page(4096, 1);
    let new = common::page(4096, 2);
    assert_ne!(old, new);
    // The DRAM tier in front of the refusing tier.
    let store = TieredStore::new(1 << 20, vec![Box::new(Refusing(below.clone()))]).expect("store");
    below.0.lock().insert((1, 0), old.clone());
    store.put_owned((1, 0), new.clone()).expect("put");
    assert!(store.remove((1, 0)).is_err(), "the removal below fails");
    assert_eq!(
        store.get((1, 0)).expect("get"),
        Some(new.clone()),
        "the DRAM copy stays"
    );
    // The compressed tier in front of it.
    let ct = CompressedTier::new(1 << 20, Box::new(Refusing(below.clone())));
    let word = 9u64.to_le_bytes().repeat(512);
    Tier::put(&ct, (2, 0), &word).expect("put");
    below.0.lock().insert((2, 0), old.clone());
    assert!(Tier::remove(&ct, (2, 0)).is_err());
    assert_eq!(
        Tier::get(&ct, (2, 0)).expect("get"),
        Some(word),
        "the compressed copy stays"
    );
}
