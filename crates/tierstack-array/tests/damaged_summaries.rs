//! Stripe summaries that fail their checksums: repaired from redundancy where it can (parity,
//! a mirror); where it cannot (RAID 0, too many bad drives) never taken for free space or for
//! the end of a segment. `Array::open` refuses the array with `DamagedSummaries` unless
//! `ArrayOptions::accept_damaged`, which quarantines the segments (never reused) and reports
//! them in `status`, `damaged_stripes` and scrub. The newest `MAX_INFLIGHT` (4) stripes are
//! the exception: a crash may have torn them, so a damaged summary there is voided.
//!
//! The arrays here have one stripe per segment unless said otherwise, and every flush seals a
//! stripe into the next free segment: stripe `i` written is segment `i`.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tierstack_array::format::{ENTRY_SIZE, FOOTER_SIZE};
use tierstack_array::{Array, ArrayError, ArrayOptions, CreateParams, EngineKind, Key, Level};

fn opts() -> ArrayOptions {
    ArrayOptions {
        engine: EngineKind::Psync,
        direct: false,
        lock_wait: Duration::from_secs(5),
        ..ArrayOptions::default()
    }
}

fn forced() -> ArrayOptions {
    ArrayOptions {
        accept_damaged: true,
        ..opts()
    }
}

fn val(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

fn create(dir: &Path, level: Level, n: usize, size: u64) -> (Array, Vec<PathBuf>) {
    let paths: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("d{i}"))).collect();
    let params = CreateParams {
        level,
        chunk: 4096,
        groups: None,
        size: Some(size),
    };
    let a = Array::create(&paths, &params, &opts()).expect("create");
    (a, paths)
}

/// Writes six stripes (segments 0 to 5 where a segment holds one stripe). Stripe 1 overwrites
/// (1,0) of stripe 0, deletes (2,0) of stripe 0 and adds (3,0); stripes 2 to 5 add (10+i,0).
/// Stripe 1 is then the fifth newest, outside the 4 a crash can tear.
fn write_six(a: &Array) {
    a.put((1, 0), &val(1, 300)).expect("put");
    a.put((2, 0), &val(2, 500)).expect("put");
    a.flush().expect("flush");
    a.put((1, 0), &val(11, 700)).expect("put");
    assert!(a.delete((2, 0)).expect("delete"));
    a.put((3, 0), &val(3, 100)).expect("put");
    a.flush().expect("flush");
    for i in 2..6u64 {
        a.put((10 + i, 0), &val(100 + i, 4096)).expect("put");
        a.flush().expect("flush");
    }
}

/// What [`write_six`] leaves.
fn check_six(a: &Array) {
    assert_eq!(a.get((1, 0)).expect("get"), Some(val(11, 700)));
    assert_eq!(a.get((2, 0)).expect("get"), None);
    assert_eq!(a.get((3, 0)).expect("get"), Some(val(3, 100)));
    for i in 2..6u64 {
        assert_eq!(a.get((10 + i, 0)).expect("get"), Some(val(100 + i, 4096)));
    }
}

/// Drive and byte offset of byte `off` of the data of global stripe `gs` (the copy on the
/// first drive of its mirror set, for RAID 1).
fn place(a: &Array, gs: u64, off: usize) -> (usize, u64) {
    let g = a.geometry();
    let p = g.pieces(off, 1)[0];
    let row = g.global_row(gs, p.row);
    (g.data_drive(row, p.unit), g.drive_offset(row, p.off))
}

fn flip(path: &Path, at: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open drive");
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).expect("read");
    b[0] ^= 1;
    f.write_all_at(&b, at).expect("write");
}

/// Offset in the stripe data of the version of the last summary entry of a stripe.
fn last_entry_version(stripe_data: usize) -> usize {
    stripe_data - FOOTER_SIZE - ENTRY_SIZE + 16
}

fn contents(paths: &[PathBuf]) -> Vec<Vec<u8>> {
    paths
        .iter()
        .map(|p| std::fs::read(p).expect("read drive"))
        .collect()
}

fn expect_damaged(paths: &[PathBuf], o: &ArrayOptions, want: &[(u32, u32)]) -> ArrayError {
    match Array::open(paths, o) {
        Err(ArrayError::DamagedSummaries { stripes }) => {
            assert_eq!(stripes, want);
            ArrayError::DamagedSummaries { stripes }
        }
        Err(e) => panic!("expected DamagedSummaries, got {e:?}"),
        Ok(_) => panic!("opened an array with a damaged summary"),
    }
}

/// RAID 0: a flipped byte in the summary entries of stripe 1 cannot be repaired. `open`
/// refuses the array and writes nothing; with `accept_damaged` it opens with segment 1
/// quarantined: never written again, not free, reported by status, `damaged_stripes` and
/// scrub, and refused again at the next plain open.
#[test]
fn raid0_damaged_summary_is_refused_or_quarantined() {
    let t = tempfile::tempdir().expect("tempdir");
    let (a, paths) = create(t.path(), Level::Raid0, 2, 18 << 20);
    assert_eq!(a.geometry().seg_stripes, 1);
    write_six(&a);
    let sd = a.geometry().stripe_data();
    let (d, at) = place(&a, 1, last_entry_version(sd));
    let geo = a.geometry().clone();
    drop(a);
    flip(&paths[d], at);

    let before = contents(&paths);
    let e = expect_damaged(&paths, &opts(), &[(1, 0)]);
    assert_eq!(
        e.to_string(),
        "1 stripe summary is damaged beyond repair (segment 1 stripe 0): keys written or \
         deleted there may read back stale; open it with --accept-damaged \
         (ArrayOptions::accept_damaged) to quarantine them and read the rest, then copy the data \
         off"
    );
    assert!(contents(&paths) == before, "a refused open writes nothing");

    let a = Array::open(&paths, &forced()).expect("open with accept_damaged");
    let s = a.status();
    assert_eq!(s.state, "damaged");
    assert_eq!(a.damaged_stripes(), vec![(1, 0)]);
    assert_eq!(
        s.free_segments, 2,
        "segments 0 to 5 in use, segment 1 quarantined"
    );
    // What accepting the damage means: stripe 1's records are unknown, so (1,0) reads its
    // older value, the deleted (2,0) is back and (3,0) is gone. The other stripes are whole.
    assert_eq!(a.get((1, 0)).expect("get"), Some(val(1, 300)));
    assert_eq!(a.get((2, 0)).expect("get"), Some(val(2, 500)));
    assert_eq!(a.get((3, 0)).expect("get"), None);
    for i in 2..6u64 {
        assert_eq!(a.get((10 + i, 0)).expect("get"), Some(val(100 + i, 4096)));
    }
    let r = a.scrub(false, &|_, _| {}).expect("scrub");
    assert_eq!((r.checksum_errors, r.unrepairable), (1, 1), "{r:?}");
    assert!(!r.clean());

    // Segment 1 is never reused: write (and clean) through every other segment many times.
    let seg1 = |paths: &[PathBuf]| -> Vec<Vec<u8>> {
        let off = geo.drive_offset(geo.global_row(1, 0), 0);
        paths
            .iter()
            .map(|p| {
                let f = std::fs::File::open(p).expect("open");
                let mut b = vec![0u8; geo.stripe_drive_bytes()];
                f.read_exact_at(&mut b, off).expect("read");
                b
            })
            .collect()
    };
    let held = seg1(&paths);
    for round in 0..24u64 {
        for i in 2..6u64 {
            a.put((10 + i, 0), &val(1000 + round * 10 + i, 4096))
                .expect("put");
        }
        a.flush().expect("flush");
    }
    assert!(a.status().repaired == 0);
    assert_eq!(a.damaged_stripes(), vec![(1, 0)]);
    drop(a);
    assert!(seg1(&paths) == held, "segment 1 was written");

    // Still refused without the option; with it, the new values are there.
    expect_damaged(&paths, &opts(), &[(1, 0)]);
    let a = Array::open(&paths, &forced()).expect("open with accept_damaged");
    assert_eq!(a.damaged_stripes(), vec![(1, 0)]);
    for i in 2..6u64 {
        assert_eq!(
            a.get((10 + i, 0)).expect("get"),
            Some(val(1000 + 23 * 10 + i, 4096))
        );
    }
}

/// RAID 0: stripe 0 of a segment always holds a footer (or zeros, never written): bytes that
/// are neither there are damage, not free space.
#[test]
fn raid0_flipped_footer_magic_is_damage_not_free_space() {
    let t = tempfile::tempdir().expect("tempdir");
    let (a, paths) = create(t.path(), Level::Raid0, 2, 18 << 20);
    write_six(&a);
    let sd = a.geometry().stripe_data();
    let (d, at) = place(&a, 1, sd - FOOTER_SIZE);
    drop(a);
    flip(&paths[d], at);
    expect_damaged(&paths, &opts(), &[(1, 0)]);
    let a = Array::open(&paths, &forced()).expect("open with accept_damaged");
    assert_eq!(a.status().free_segments, 2);
    assert_eq!(a.damaged_stripes(), vec![(1, 0)]);
}

/// RAID 0 with three stripes per segment: a footer flipped beyond recognition in stripe 1 of
/// segment 0, which stripe 2 of the same use follows, is damage (not the end of the segment).
#[test]
fn raid0_lost_footer_inside_a_segment_is_damage() {
    let t = tempfile::tempdir().expect("tempdir");
    let (a, paths) = create(t.path(), Level::Raid0, 4, 100 << 20);
    assert_eq!(a.geometry().seg_stripes, 3);
    write_six(&a);
    let sd = a.geometry().stripe_data();
    let (d, at) = place(&a, 1, sd - FOOTER_SIZE);
    drop(a);
    flip(&paths[d], at);
    expect_damaged(&paths, &opts(), &[(0, 1)]);
    let a = Array::open(&paths, &forced()).expect("open with accept_damaged");
    assert_eq!(a.damaged_stripes(), vec![(0, 1)]);
    // Stripe 2 of segment 0 (the first of the (10+i) values) is read.
    assert_eq!(a.get((12, 0)).expect("get"), Some(val(102, 4096)));
}

/// RAID 0: a damaged summary in the newest stripe may be a write torn by a crash (its
/// records never acknowledged): the stripe is voided, the array opens, and the keys keep
/// their older values. Voided, it reads as an empty stripe from then on.
#[test]
fn raid0_damaged_newest_summary_is_voided_as_torn() {
    let t = tempfile::tempdir().expect("tempdir");
    // Room for a seventh stripe without cleaning.
    let (a, paths) = create(t.path(), Level::Raid0, 2, 26 << 20);
    write_six(&a);
    a.put((12, 0), &val(7, 50)).expect("put");
    a.flush().expect("flush"); // stripe 6: the newest
    let sd = a.geometry().stripe_data();
    let (d, at) = place(&a, 6, last_entry_version(sd));
    drop(a);
    flip(&paths[d], at);
    for _ in 0..2 {
        let a = Array::open(&paths, &opts()).expect("open");
        assert!(a.damaged_stripes().is_empty());
        assert_eq!(a.status().state, "online");
        check_six(&a);
        let r = a.scrub(false, &|_, _| {}).expect("scrub");
        assert!(r.clean(), "{r:?}");
        assert_eq!(r.stripes_checked, 7);
    }
}

/// RAID 5: the entries of stripe 1 flipped, and another drive missing: parity cannot repair
/// them, so the array is refused; with every drive it repairs them at open.
#[test]
fn raid5_summary_beyond_parity_is_refused_then_repaired_with_all_drives() {
    let t = tempfile::tempdir().expect("tempdir");
    let (a, paths) = create(t.path(), Level::Raid5, 4, 12 << 20);
    write_six(&a);
    let sd = a.geometry().stripe_data();
    let (d, at) = place(&a, 1, last_entry_version(sd));
    drop(a);
    flip(&paths[d], at);
    let gone = (d + 1) % 4;
    let given: Vec<PathBuf> = (0..4)
        .filter(|&i| i != gone)
        .map(|i| paths[i].clone())
        .collect();
    expect_damaged(&given, &opts(), &[(1, 0)]);
    let a = Array::open(&paths, &opts()).expect("open");
    let s = a.status();
    assert_eq!((s.state.as_str(), s.repaired), ("online", 1));
    assert_eq!(s.drives[d].checksum_errors, 1);
    check_six(&a);
    drop(a);
    // Repaired on the drives: now it opens without `gone` too.
    let a = Array::open(&given, &opts()).expect("open degraded");
    check_six(&a);
}

/// RAID 1: flipped summary entries are repaired from the mirror at open.
#[test]
fn raid1_entries_flip_is_repaired_from_the_mirror() {
    let t = tempfile::tempdir().expect("tempdir");
    let (a, paths) = create(t.path(), Level::Raid1, 2, 36 << 20);
    write_six(&a);
    let sd = a.geometry().stripe_data();
    let (d, at) = place(&a, 1, last_entry_version(sd));
    drop(a);
    flip(&paths[d], at);
    let a = Array::open(&paths, &opts()).expect("open");
    let s = a.status();
    assert_eq!((s.state.as_str(), s.repaired), ("online", 1));
    check_six(&a);
    let r = a.scrub(false, &|_, _| {}).expect("scrub");
    assert!(r.clean(), "{r:?}");
}

/// A summary of several blocks (more entries than one block holds): a flipped entry in its
/// first block is repaired from parity on RAID 5, and refused on RAID 0.
#[test]
fn multi_block_summary_entries_flip() {
    for level in [Level::Raid5, Level::Raid0] {
        let t = tempfile::tempdir().expect("tempdir");
        let (a, paths) = create(t.path(), level, 4, 12 << 20);
        // Stripe 0: 300 one-byte values (300 entries, 3 blocks of summary).
        let keys: Vec<Key> = (0..300u64).map(|i| (50, i)).collect();
        for (i, k) in keys.iter().enumerate() {
            a.put(*k, &val(i as u64, 1)).expect("put");
        }
        a.flush().expect("flush");
        for i in 1..6u64 {
            a.put((60, i), &val(i, 10)).expect("put");
            a.flush().expect("flush");
        }
        let sd = a.geometry().stripe_data();
        let first = sd - FOOTER_SIZE - 300 * ENTRY_SIZE;
        assert!(first < sd - 4096, "the summary spans blocks");
        let (d, at) = place(&a, 0, first + 16);
        drop(a);
        flip(&paths[d], at);
        if level == Level::Raid0 {
            expect_damaged(&paths, &opts(), &[(0, 0)]);
            continue;
        }
        let a = Array::open(&paths, &opts()).expect("open");
        assert_eq!(a.status().repaired, 1);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(a.get(*k).expect("get"), Some(val(i as u64, 1)), "{k:?}");
        }
    }
}
