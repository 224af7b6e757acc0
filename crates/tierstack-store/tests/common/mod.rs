//! Helpers the store's integration tests share: page contents, a small RAID 5 of file drives,
//! and several threads writing and reading through one store.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tierstack_array::{Array, ArrayOptions, CreateParams, Level};
use tierstack_store::TieredStore;

/// A page of `len` bytes whose contents depend on `seed`.
pub fn page(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8) ^ seed.wrapping_mul(13) ^ (i >> 8) as u8)
        .collect()
}

/// `len` bytes that do not compress (xorshift from `seed`).
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A RAID 5 of four file drives in `dir`, `size` bytes each.
pub fn array(dir: &Path, size: u64) -> (Vec<PathBuf>, Array) {
    let paths: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("d{i}"))).collect();
    let p = CreateParams {
        level: Level::Raid5,
        chunk: 64 << 10,
        groups: None,
        size: Some(size),
    };
    let a = Array::create(&paths, &p, &ArrayOptions::default()).expect("create");
    (paths, a)
}

/// Four threads each put 64 pages of `len` bytes three times over, reading every page back
/// after each round.
pub fn four_threads(store: &TieredStore, len: usize) {
    std::thread::scope(|s| {
        for t in 0..4u64 {
            s.spawn(move || {
                for round in 0..3u8 {
                    for k in 0..64u64 {
                        store.put((t, k), &page(len, round ^ k as u8)).expect("put");
                    }
                    for k in 0..64u64 {
                        assert_eq!(
                            store.get((t, k)).expect("get").expect("present"),
                            page(len, round ^ k as u8)
                        );
                    }
                }
            });
        }
    });
}

/// One step of a model test.
#[derive(Debug, Clone)]
pub enum Op {
    /// Put key, length, seed.
    Put(u64, usize, u8),
    /// Get key.
    Get(u64),
    /// Remove key.
    Remove(u64),
    /// Flush the store.
    Flush,
}

/// Steps over keys below `keys`, with pages of the given lengths or 1 to 20000 bytes.
pub fn op(keys: u64, lens: Vec<usize>) -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let len = prop_oneof![proptest::sample::select(lens), 1usize..20000];
    prop_oneof![
        6 => (0..keys, len, any::<u8>()).prop_map(|(k, l, s)| Op::Put(k, l, s)),
        4 => (0..keys).prop_map(Op::Get),
        1 => (0..keys).prop_map(Op::Remove),
        1 => Just(Op::Flush),
    ]
}

/// Applies `op` to the store (object `obj`) and the model, checking what the store answers.
pub fn apply(
    store: &TieredStore,
    model: &mut std::collections::BTreeMap<u64, Vec<u8>>,
    obj: u64,
    op: &Op,
) -> Result<(), proptest::test_runner::TestCaseError> {
    match *op {
        Op::Put(k, l, s) => {
            store.put((obj, k), &page(l, s)).expect("put");
            model.insert(k, page(l, s));
        }
        Op::Get(k) => {
            let got = store.get((obj, k)).expect("get");
            proptest::prop_assert_eq!(got.as_ref(), model.get(&k), "get {}", k);
        }
        Op::Remove(k) => {
            let had = store.remove((obj, k)).expect("remove");
            proptest::prop_assert_eq!(had, model.remove(&k).is_some());
        }
        Op::Flush => store.flush().expect("flush"),
    }
    Ok(())
}
