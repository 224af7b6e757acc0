//! `StackSpec`, the one builder of a tiered store: the tiers come out in the documented order,
//! pages go down through them and come back, and a tier that needs one below refuses to be
//! built without it.

mod common;

use std::sync::Arc;

use tierstack_store::{StackSpec, StoreError};

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
