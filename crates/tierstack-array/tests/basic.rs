//! The array end to end: every RAID level written, failed, rebuilt, reopened and scrubbed; the
//! cleaner, a full array, concurrent readers and writers, rebuild under load.

use std::path::PathBuf;

use tierstack_array::{Array, ArrayOptions, CreateParams, Level};

fn drives(dir: &std::path::Path, n: usize) -> Vec<PathBuf> {
    (0..n).map(|i| dir.join(format!("d{i}"))).collect()
}

fn val(k: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 * 31 + k * 7 + (i as u64 >> 9)) as u8)
        .collect()
}

fn params(level: Level) -> CreateParams {
    CreateParams {
        level,
        chunk: 65536,
        groups: None,
        size: Some(64 << 20),
    }
}

#[test]
fn roundtrip_fail_rebuild_reopen_all_levels() {
    for (level, n, groups) in [
        (Level::Raid0, 3, None),
        (Level::Raid1, 3, None),
        (Level::Raid10, 4, None),
        (Level::Raid5, 5, None),
        (Level::Raid6, 5, None),
        (Level::Raid50, 6, Some(2)),
        (Level::Raid60, 8, Some(2)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let paths = drives(dir.path(), n);
        let mut p = params(level);
        p.groups = groups;
        let opts = ArrayOptions::default();
        let a = Array::create(&paths, &p, &opts).unwrap();
        let sizes = [0usize, 1, 4095, 4096, 70000, 1 << 20];
        for (i, &s) in sizes.iter().enumerate() {
            a.put((1, i as u64), &val(i as u64, s)).unwrap();
        }
        for (i, &s) in sizes.iter().enumerate() {
            assert_eq!(
                a.get((1, i as u64)).unwrap().unwrap(),
                val(i as u64, s),
                "pending {level:?}"
            );
        }
        a.flush().unwrap();
        for (i, &s) in sizes.iter().enumerate() {
            assert_eq!(
                a.get((1, i as u64)).unwrap().unwrap(),
                val(i as u64, s),
                "flushed {level:?}"
            );
        }
        drop(a);
        let a = Array::open(&paths, &opts).unwrap();
        for (i, &s) in sizes.iter().enumerate() {
            assert_eq!(
                a.get((1, i as u64)).unwrap().unwrap(),
                val(i as u64, s),
                "reopened {level:?}"
            );
        }
        if level == Level::Raid0 {
            continue;
        }
        a.fail_drive(1).unwrap();
        for (i, &s) in sizes.iter().enumerate() {
            assert_eq!(
                a.get((1, i as u64)).unwrap().unwrap(),
                val(i as u64, s),
                "degraded {level:?}"
            );
        }
        a.put((2, 0), &val(99, 300000)).unwrap();
        a.flush().unwrap();
        let newp = dir.path().join("new1");
        a.replace_drive(1, &newp).unwrap();
        a.rebuild(None, &|_, _| {}).unwrap();
        assert_eq!(a.status().state, "online");
        let rep = a.scrub(false, &|_, _| {}).unwrap();
        assert!(rep.clean(), "{level:?} {rep:?}");
        let mut paths2 = paths.clone();
        paths2[1] = newp;
        drop(a);
        let a = Array::open(&paths2, &opts).unwrap();
        assert_eq!(a.get((2, 0)).unwrap().unwrap(), val(99, 300000));
        for (i, &s) in sizes.iter().enumerate() {
            assert_eq!(
                a.get((1, i as u64)).unwrap().unwrap(),
                val(i as u64, s),
                "rebuilt {level:?}"
            );
        }
    }
}

#[test]
fn cleaner_reclaims_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let paths = drives(dir.path(), 3);
    let a = Array::create(&paths, &params(Level::Raid5), &ArrayOptions::default()).unwrap();
    let cap = a.status().capacity_bytes;
    // Overwrite a small working set many times its capacity.
    let v = val(1, 256 << 10);
    let rounds = (3 * cap / (v.len() as u64 * 8)) as u64;
    for r in 0..rounds {
        if r % 7 == 0 {
            a.delete((5, 3)).unwrap();
        }
        for k in 0..8 {
            a.put((5, k), &val(r * 8 + k, v.len())).unwrap();
        }
    }
    a.flush().unwrap();
    let last = rounds - 1;
    for k in 0..8 {
        assert_eq!(a.get((5, k)).unwrap().unwrap(), val(last * 8 + k, v.len()));
    }
    drop(a);
    let a = Array::open(&paths, &ArrayOptions::default()).unwrap();
    for k in 0..8 {
        assert_eq!(a.get((5, k)).unwrap().unwrap(), val(last * 8 + k, v.len()));
    }
}

#[test]
fn full_array_says_no_space() {
    let dir = tempfile::tempdir().unwrap();
    let paths = drives(dir.path(), 3);
    let a = Array::create(&paths, &params(Level::Raid5), &ArrayOptions::default()).unwrap();
    let mut stored = 0u64;
    let err = loop {
        match a.put((9, stored), &val(stored, 1 << 20)) {
            Ok(()) => stored += 1,
            Err(e) => break e,
        }
        assert!(stored < 10_000);
    };
    assert!(
        matches!(err, tierstack_array::ArrayError::NoSpace(_)),
        "{err}"
    );
    a.flush().unwrap();
    for k in 0..stored {
        assert_eq!(a.get((9, k)).unwrap().unwrap(), val(k, 1 << 20));
    }
    // Deleting makes room again.
    for k in 0..stored / 2 {
        a.delete((9, k)).unwrap();
    }
    let s = a.status();
    eprintln!(
        "stored {stored} free_segments {} used {} cap {}",
        s.free_segments, s.used_bytes, s.capacity_bytes
    );
    a.put((9, 100_000), &val(1, 1 << 20)).unwrap();
    a.flush().unwrap();
}

#[test]
fn many_threads_put_and_get_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let paths = drives(dir.path(), 5);
    let a = Array::create(&paths, &params(Level::Raid6), &ArrayOptions::default()).unwrap();
    std::thread::scope(|s| {
        for t in 0..6u64 {
            let a = a.clone();
            s.spawn(move || {
                for i in 0..120u64 {
                    let len = ((t * 7919 + i * 104_729) % 200_000) as usize;
                    a.put((100 + t, i % 40), &val(t * 1000 + i, len)).unwrap();
                    if i % 9 == 0 {
                        a.flush().unwrap();
                    }
                    // Read back our own latest write and someone else's key.
                    assert_eq!(
                        a.get((100 + t, i % 40)).unwrap().unwrap(),
                        val(t * 1000 + i, len)
                    );
                    let _ = a.get((100 + (t + 1) % 6, i % 40)).unwrap();
                }
            });
        }
    });
    a.flush().unwrap();
    drop(a);
    let a = Array::open(&paths, &ArrayOptions::default()).unwrap();
    for t in 0..6u64 {
        for i in 80..120u64 {
            let len = ((t * 7919 + i * 104_729) % 200_000) as usize;
            assert_eq!(
                a.get((100 + t, i % 40)).unwrap().unwrap(),
                val(t * 1000 + i, len)
            );
        }
    }
}

#[test]
fn owner_serves_reads_and_writes_while_rebuilding() {
    let dir = tempfile::tempdir().unwrap();
    let paths = drives(dir.path(), 5);
    let mut p = params(Level::Raid5);
    p.size = Some(128 << 20);
    let a = Array::create(&paths, &p, &ArrayOptions::default()).unwrap();
    for i in 0..150u64 {
        a.put((1, i), &val(i, 400_000)).unwrap();
    }
    a.flush().unwrap();
    a.fail_drive(3).unwrap();
    a.replace_drive(3, &dir.path().join("spare")).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let rb = a.clone();
        let done = &done;
        s.spawn(move || {
            // Slow enough that the other thread overlaps it.
            rb.rebuild(Some(100 << 20), &|_, _| {}).unwrap();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let mut i = 0u64;
        while !done.load(std::sync::atomic::Ordering::SeqCst) || i < 20 {
            assert_eq!(a.get((1, i % 150)).unwrap().unwrap(), val(i % 150, 400_000));
            a.put((2, i % 50), &val(5000 + i, 100_000)).unwrap();
            i += 1;
        }
        assert!(i > 20);
    });
    assert_eq!(a.status().state, "online");
    a.flush().unwrap();
    let rep = a.scrub(false, &|_, _| {}).unwrap();
    assert!(rep.clean(), "{rep:?}");
    drop(a);
    let mut p2 = paths.clone();
    p2[3] = dir.path().join("spare");
    // Read everything with another drive missing: only correct if the rebuild was exact.
    p2[0] = dir.path().join("gone");
    let a = Array::open(&p2, &ArrayOptions::default()).unwrap();
    for i in 0..150u64 {
        assert_eq!(a.get((1, i)).unwrap().unwrap(), val(i, 400_000));
    }
}

/// Reads race overwrites and the cleaner (which moves live values and reuses the segments
/// it freed): a read must return a value written for its key (reads do not hold the index
/// lock during their I/O), never another key's data or a checksum error.
#[test]
fn reads_race_the_cleaner() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    let dir = tempfile::tempdir().unwrap();
    let paths = drives(dir.path(), 4);
    let mut p = params(Level::Raid5);
    p.size = Some(24 << 20);
    let a = std::sync::Arc::new(Array::create(&paths, &p, &ArrayOptions::default()).unwrap());
    let len = 16 << 10;
    // Value of key k at version r: self-describing, so a reader can check it.
    let value = |k: u64, r: u64| {
        let mut v = val(k * 1_000_003 + r, len);
        v[..8].copy_from_slice(&k.to_le_bytes());
        v[8..16].copy_from_slice(&r.to_le_bytes());
        v
    };
    // Hot keys 0..32 are overwritten every round; one cold key (1000 + round) is written
    // once per round and stays live, so every segment keeps some live data that the cleaner
    // must move while readers read it.
    let hot = 32u64;
    for k in 0..hot {
        a.put((9, k), &value(k, 0)).unwrap();
    }
    let cap = a.status().capacity_bytes;
    let rounds = 3 * cap / (len as u64 * hot);
    let cold = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let checked = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let a = a.clone();
            let (done, checked, cold) = (&done, &checked, &cold);
            s.spawn(move || {
                let mut i = t;
                while !done.load(Relaxed) {
                    let n = cold.load(Relaxed);
                    let k = if i % 2 == 0 || n == 0 {
                        (i * 7919) % hot
                    } else {
                        1000 + (i * 7919) % n
                    };
                    let got = a.get((9, k)).unwrap().unwrap();
                    let r = u64::from_le_bytes(got[8..16].try_into().unwrap());
                    assert_eq!(got, value(k, r), "key {k}: not a value written for it");
                    checked.fetch_add(1, Relaxed);
                    i += 1;
                }
            });
        }
        for r in 1..=rounds {
            for k in 0..hot {
                a.put((9, k), &value(k, r)).unwrap();
            }
            a.put((9, 1000 + r - 1), &value(1000 + r - 1, 0)).unwrap();
            cold.store(r, Relaxed);
        }
        done.store(true, Relaxed);
    });
    assert!(
        a.status().write_amplification > 1.0,
        "the cleaner never moved data"
    );
    assert!(checked.load(Relaxed) > 100);
    a.flush().unwrap();
    for k in 0..hot {
        assert_eq!(a.get((9, k)).unwrap().unwrap(), value(k, rounds));
    }
    for r in 0..rounds {
        assert_eq!(a.get((9, 1000 + r)).unwrap().unwrap(), value(1000 + r, 0));
    }
}

/// A stripe whose summary is larger than 256 KiB (thousands of deletions between two
/// flushes: tombstones take no data blocks) scrubs clean: scrub reads the summary the footer
/// says, not a fixed tail.
#[test]
fn scrub_reads_a_summary_of_thousands_of_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    let paths = drives(dir.path(), 4);
    let mut p = params(Level::Raid5);
    p.size = Some(128 << 20);
    let a = Array::create(&paths, &p, &ArrayOptions::default()).unwrap();
    // Small values, flushed: each key has a value to delete.
    for k in 0..9000u64 {
        a.put((7, k), &val(k, 16)).unwrap();
    }
    a.flush().unwrap();
    // Then only deletions until the next flush.
    for k in 0..9000u64 {
        assert!(a.delete((7, k)).unwrap());
    }
    a.flush().unwrap();
    let rep = a.scrub(false, &|_, _| {}).unwrap();
    assert!(rep.clean(), "{rep:?}");
    assert_eq!(rep.unrepairable, 0, "{rep:?}");
}

/// An array opened with fewer stripes in flight holds fewer stripe images, writes many
/// stripes' worth through its shorter queue, and loses nothing across a reopen with the
/// default depth.
#[test]
fn fewer_stripes_in_flight_hold_less_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let paths = drives(dir.path(), 4);
    let one = ArrayOptions {
        stripes_in_flight: 1,
        ..ArrayOptions::default()
    };
    let a = Array::create(&paths, &params(Level::Raid5), &one).unwrap();
    let deep = Array::buffer_bytes(&a);
    let v = 256 << 10;
    // About twenty stripes of data.
    let n = 20 * (4 << 20) / v as u64;
    for k in 0..n {
        a.put((9, k), &val(k, v)).unwrap();
    }
    a.flush().unwrap();
    drop(a);
    let a = Array::open(&paths, &ArrayOptions::default()).unwrap();
    assert_eq!(
        Array::buffer_bytes(&a),
        deep * 5 / 2,
        "four in flight and the open stripe against one and the open stripe"
    );
    for k in 0..n {
        assert_eq!(a.get((9, k)).unwrap().unwrap(), val(k, v), "key {k}");
    }
}

/// Conditioning writes zeros over never-written free space only: the drive files end up
/// allocated, every value written before, during and after it reads back (also after a
/// reopen), and the open segment's unwritten stripes are left for the log.
#[test]
fn conditioning_allocates_free_space_and_keeps_every_value() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let paths = drives(dir.path(), 4);
    let p = params(Level::Raid5);
    let a = Array::create(&paths, &p, &ArrayOptions::default()).unwrap();
    let allocated = |paths: &[PathBuf]| -> u64 {
        paths
            .iter()
            .map(|d| std::fs::metadata(d).unwrap().blocks() * 512)
            .sum()
    };
    let before = allocated(&paths);
    for k in 0..40u64 {
        a.put((2, k), &val(k, 70000)).unwrap();
    }
    a.flush().unwrap();
    let mut steps = 0;
    while let Some(bytes) = a.condition_step().unwrap() {
        if bytes == 0 {
            continue;
        }
        steps += 1;
        if steps == 5 {
            // Writes go on between steps.
            for k in 40..60u64 {
                a.put((2, k), &val(k, 70000)).unwrap();
            }
        }
    }
    assert!(steps > 10, "{steps} steps");
    assert_eq!(
        a.condition_step().unwrap(),
        None,
        "nothing left the second time"
    );
    assert_eq!(a.conditioned_bytes() as usize % 4, 0);
    let after = allocated(&paths);
    let size: u64 = paths
        .iter()
        .map(|d| std::fs::metadata(d).unwrap().len())
        .sum();
    assert!(
        before < size / 2,
        "fresh drives are sparse: {before} of {size}"
    );
    assert!(
        after > size * 9 / 10,
        "conditioned drives are allocated: {after} of {size}"
    );
    for k in 60..80u64 {
        a.put((2, k), &val(k, 70000)).unwrap();
    }
    a.flush().unwrap();
    for k in 0..80u64 {
        assert_eq!(a.get((2, k)).unwrap().unwrap(), val(k, 70000), "value {k}");
    }
    drop(a);
    let a = Array::open(&paths, &ArrayOptions::default()).unwrap();
    for k in 0..80u64 {
        assert_eq!(
            a.get((2, k)).unwrap().unwrap(),
            val(k, 70000),
            "reopened {k}"
        );
    }
    let r = a.scrub(false, &|_, _| {}).unwrap();
    assert!(r.records_checked >= 80, "{r:?}");
    assert_eq!(
        (r.checksum_errors, r.parity_errors, r.unrepairable),
        (0, 0, 0),
        "{r:?}"
    );
}

/// Drives on tmpfs are never conditioned: zeros there would take memory and save nothing.
#[test]
fn conditioning_leaves_tmpfs_drives_alone() {
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        return;
    };
    let paths = drives(dir.path(), 4);
    let a = Array::create(&paths, &params(Level::Raid5), &ArrayOptions::default()).unwrap();
    assert_eq!(a.condition_step().unwrap(), None);
    assert_eq!(a.conditioned_bytes(), 0);
}
