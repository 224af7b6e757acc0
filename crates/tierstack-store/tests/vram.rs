//! The VRAM tier on a real GPU: the tiered store with GPU memory between DRAM and the array,
//! against a model, through evictions in both tiers, and durable on the array alone after a
//! flush. On a machine without an NVIDIA GPU each test checks instead that the tier refuses
//! to be made with an error that names the fix, and says that it did not run on a GPU.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use common::page;
use proptest::prelude::*;
use tierstack_array::{Array, ArrayOptions};
use tierstack_store::{ArrayTier, Gpu, GpuError, TieredStore, VramTier};

fn array(dir: &std::path::Path) -> (Vec<PathBuf>, Array) {
    common::array(dir, 128 << 20)
}

/// The GPU, or `None` after checking that its absence is reported as it should be.
fn gpu() -> Option<Arc<Gpu>> {
    match Gpu::open(0) {
        Ok(g) => {
            let info = g.info().expect("info");
            assert!(info.total_bytes > 0 && !info.name.is_empty(), "{info:?}");
            eprintln!("on GPU 0: {} ({} bytes)", info.name, info.total_bytes);
            Some(g)
        }
        Err(e) => {
            assert!(
                matches!(e, GpuError::NoDriver(_) | GpuError::NoDevice { .. }),
                "a machine without a GPU should say so, not: {e}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains("--vram"),
                "the message should name the fix: {msg}"
            );
            eprintln!("not run on a GPU: {msg}");
            None
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, max_shrink_iters: 50, ..ProptestConfig::default() })]

    /// 256 KiB of DRAM over 2 MiB of VRAM over the array: most pages pass through the GPU
    /// and many leave it for the array; every read matches the model, and after a flush the
    /// array alone holds everything.
    #[test]
    fn the_store_with_a_vram_tier_matches_a_model(ops in proptest::collection::vec(common::op(96, vec![4096, 65536, 1 << 20]), 1..250)) {
        let Some(gpu) = gpu() else { return Ok(()); };
        let dir = tempfile::tempdir().expect("tmp");
        let (paths, a) = array(dir.path());
        let vram = VramTier::new(gpu, 2 << 20, Box::new(ArrayTier::new(a))).expect("vram tier");
        let store = TieredStore::new(256 << 10, vec![Box::new(vram)]).expect("store");
        let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for op in &ops {
            common::apply(&store, &mut model, 5, op)?;
            let st = store.status();
            prop_assert_eq!(st.len(), 3);
            prop_assert_eq!(st[1].name.as_str(), "vram");
            prop_assert!(st[1].used_bytes <= st[1].capacity_bytes, "{:?}", st[1]);
        }
        store.flush().expect("flush");
        let st = store.status();
        prop_assert_eq!(st[1].dirty_bytes, 0);
        for (k, v) in &model {
            let got = store.get((5, *k)).expect("get");
            prop_assert_eq!(got.as_ref(), Some(v));
        }
        drop(store);
        let a = Array::open(&paths, &ArrayOptions::default()).expect("reopen");
        for k in 0..96u64 {
            let got = a.get((5, k)).expect("get");
            prop_assert_eq!(got.as_ref(), model.get(&k), "on the array after the flush: {}", k);
        }
    }
}

/// Pages the DRAM tier evicts are read back from the GPU, not the drives; a tier full of
/// dirty pages writes them down; a page larger than the whole tier goes straight below.
#[test]
fn evicted_pages_come_back_from_the_gpu() {
    let Some(gpu) = gpu() else { return };
    let dir = tempfile::tempdir().expect("tmp");
    let (_paths, a) = array(dir.path());
    let vram = VramTier::new(gpu, 8 << 20, Box::new(ArrayTier::new(a))).expect("vram tier");
    let store = TieredStore::new(1 << 20, vec![Box::new(vram)]).expect("store");
    // 4 MiB of 64 KiB pages through 1 MiB of DRAM: they all fit in the 8 MiB tier.
    for k in 0..64u64 {
        store.put((1, k), &page(65536, k as u8)).expect("put");
    }
    for k in 0..64u64 {
        assert_eq!(store.get((1, k)).expect("get"), Some(page(65536, k as u8)));
    }
    let st = store.status();
    assert!(st[1].hits > 0, "no read came from the GPU: {:?}", st[1]);
    assert_eq!(st[2].hits, 0, "the array was read: {:?}", st[2]);
    // 24 MiB more: the tier must write down.
    for k in 64..448u64 {
        store.put((1, k), &page(65536, k as u8)).expect("put");
    }
    let st = store.status();
    assert!(
        st[1].evictions > 0 && st[2].puts > 0,
        "{:?} {:?}",
        st[1],
        st[2]
    );
    for k in 0..448u64 {
        assert_eq!(store.get((1, k)).expect("get"), Some(page(65536, k as u8)));
    }
    // Pages read from the array are admitted to the GPU as clean copies.
    let st = store.status();
    assert!(st[2].hits > 0, "{:?}", st[2]);
    assert!(st[1].used_bytes > 0 && st[1].used_bytes <= 8 << 20);
}

/// Several threads through DRAM, VRAM and the array at once.
#[test]
fn many_threads_share_the_vram_tier() {
    let Some(gpu) = gpu() else { return };
    let dir = tempfile::tempdir().expect("tmp");
    let (_paths, a) = array(dir.path());
    let vram = VramTier::new(gpu, 4 << 20, Box::new(ArrayTier::new(a))).expect("vram tier");
    let store = TieredStore::new(1 << 20, vec![Box::new(vram)]).expect("store");
    common::four_threads(&store, 32768);
    let st = store.status();
    assert!(st[1].evictions > 0 && st[1].hits > 0, "{:?}", st[1]);
}
