//! Property test: random sequences of put / overwrite / delete / flush / reopen / fail /
//! rebuild / clean, checked against an in-memory model after every step and after reopen.

use std::collections::BTreeMap;
use std::path::PathBuf;

use proptest::prelude::*;
use tierstack_array::{Array, ArrayOptions, CreateParams, Level};

#[derive(Debug, Clone)]
enum Op {
    Put { key: u64, len: usize, seed: u8 },
    Delete { key: u64 },
    Flush,
    Reopen,
    Fail { drive: usize },
    Rebuild,
    Clean,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u64..24, prop_oneof![Just(0usize), 1usize..5000, Just(100_000usize), Just(1usize << 20)], any::<u8>())
            .prop_map(|(key, len, seed)| Op::Put { key, len, seed }),
        2 => (0u64..24).prop_map(|key| Op::Delete { key }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => (0usize..8).prop_map(|drive| Op::Fail { drive }),
        1 => Just(Op::Rebuild),
        1 => Just(Op::Clean),
    ]
}

fn value(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

fn check(a: &Array, model: &BTreeMap<u64, Vec<u8>>, when: &str) -> Result<(), TestCaseError> {
    for k in 0..24u64 {
        let got = a
            .get((7, k))
            .map_err(|e| TestCaseError::fail(format!("{when}: get {k}: {e}")))?;
        prop_assert_eq!(got.as_ref(), model.get(&k), "{}: key {}", when, k);
    }
    // `status` keeps the bytes in use as a running sum: it is the model's.
    let used: u64 = model.values().map(|v| v.len() as u64).sum();
    prop_assert_eq!(a.status().used_bytes, used, "{}: used bytes", when);
    prop_assert_eq!(a.status().objects, model.len() as u64, "{}: objects", when);
    Ok(())
}

fn run(level: Level, n: usize, groups: Option<usize>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut paths: Vec<PathBuf> = (0..n).map(|i| dir.path().join(format!("d{i}"))).collect();
    let opts = ArrayOptions::default();
    let params = CreateParams {
        level,
        chunk: 16 << 10,
        groups,
        size: Some(48 << 20),
    };
    let mut a =
        Array::create(&paths, &params, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let tolerance = a.geometry().m;
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut failed: Vec<usize> = Vec::new();
    let mut spare = 0;
    for (step, op) in ops.into_iter().enumerate() {
        let when = format!("step {step} {op:?}");
        match op {
            Op::Put { key, len, seed } => match a.put((7, key), &value(len, seed)) {
                Ok(()) => {
                    model.insert(key, value(len, seed));
                }
                Err(tierstack_array::ArrayError::NoSpace(_)) => {}
                Err(e) => return Err(TestCaseError::fail(format!("{when}: {e}"))),
            },
            Op::Delete { key } => {
                let existed = a
                    .delete((7, key))
                    .map_err(|e| TestCaseError::fail(format!("{when}: {e}")))?;
                prop_assert_eq!(existed, model.remove(&key).is_some(), "{}", when);
            }
            Op::Flush => a
                .flush()
                .map_err(|e| TestCaseError::fail(format!("{when}: {e}")))?,
            Op::Reopen => {
                drop(a);
                a = Array::open(&paths, &opts)
                    .map_err(|e| TestCaseError::fail(format!("{when}: {e}")))?;
            }
            Op::Fail { drive } => {
                let drive = drive % n;
                // Fail only while the level still tolerates it (per group; be conservative).
                if failed.len() < tolerance && !failed.contains(&drive) {
                    a.fail_drive(drive)
                        .map_err(|e| TestCaseError::fail(format!("{when}: {e}")))?;
                    failed.push(drive);
                }
            }
            Op::Rebuild => {
                for d in failed.drain(..) {
                    spare += 1;
                    let p = dir.path().join(format!("spare{spare}"));
                    a.replace_drive(d, &p)
                        .map_err(|e| TestCaseError::fail(format!("{when}: {e}")))?;
                    paths[d] = p;
                }
                a.rebuild(None, &|_, _| {})
                    .map_err(|e| TestCaseError::fail(format!("{when}: {e}")))?;
                prop_assert_eq!(a.status().state, "online");
            }
            Op::Clean => {
                a.clean(8)
                    .map_err(|e| TestCaseError::fail(format!("{when}: {e}")))?;
            }
        }
        check(&a, &model, &when)?;
    }
    drop(a);
    let a = Array::open(&paths, &opts)
        .map_err(|e| TestCaseError::fail(format!("final reopen: {e}")))?;
    check(&a, &model, "final reopen")?;
    let rep = a
        .scrub(false, &|_, _| {})
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(rep.clean(), "scrub after the sequence: {:?}", rep);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, max_shrink_iters: 50, ..ProptestConfig::default() })]

    #[test]
    fn raid6_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(Level::Raid6, 5, None, ops)?;
    }

    #[test]
    fn raid5_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(Level::Raid5, 4, None, ops)?;
    }

    #[test]
    fn raid10_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(Level::Raid10, 4, None, ops)?;
    }

    #[test]
    fn raid60_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
        run(Level::Raid60, 8, Some(2), ops)?;
    }
}

/// Every single and double drive loss of a RAID 6 and RAID 60, read back exactly.
#[test]
fn every_drive_pair_missing_reads_exact() {
    for (level, n, groups) in [(Level::Raid6, 6, None), (Level::Raid60, 8, Some(2))] {
        let dir = tempfile::tempdir().expect("tmp");
        let paths: Vec<PathBuf> = (0..n).map(|i| dir.path().join(format!("d{i}"))).collect();
        let opts = ArrayOptions::default();
        let params = CreateParams {
            level,
            chunk: 64 << 10,
            groups,
            size: Some(64 << 20),
        };
        let a = Array::create(&paths, &params, &opts).expect("create");
        let vals: Vec<Vec<u8>> = (0..12)
            .map(|i| value(300_000 + i * 50_001, i as u8))
            .collect();
        for (i, v) in vals.iter().enumerate() {
            a.put((1, i as u64), v).expect("put");
        }
        drop(a);
        for x in 0..n {
            for y in x..n {
                let mut p = paths.clone();
                p[x] = dir.path().join("gone-x");
                p[y] = dir.path().join("gone-y");
                let a = Array::open(&p, &opts).expect("open degraded");
                for (i, v) in vals.iter().enumerate() {
                    assert_eq!(
                        &a.get((1, i as u64)).expect("get").expect("present"),
                        v,
                        "{level:?} without {x},{y}"
                    );
                }
            }
        }
    }
}
