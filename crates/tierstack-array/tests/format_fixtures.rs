//! On-disk format fixtures of tierstack-array, format version 1 (`format::FORMAT_VERSION`).
//!
//! `tests/fixtures/v1/` holds drive images written by the code of format version 1, committed
//! so that a change that can no longer read what version 1 wrote fails here:
//!
//! * `raid5/clean`: RAID 5, four drives of 12 MiB, 4 KiB chunks, five log stripes written
//!   through the public API (`OPS`: values of 0 B to 9 000 B, an overwrite across stripes, a
//!   deletion), content from a seeded xorshift (`pattern`);
//! * `raid5/degraded`: the same array after `fail_drive(1)`, drive 1's file missing;
//! * `raid5/sb_checksum`: `clean` with a flipped byte in both superblock copies of drive 0 and
//!   in the first copy only of drive 2;
//! * `raid5/future_version`: `clean` with every superblock copy claiming version 2 (checksums
//!   recomputed, so only the version is wrong);
//! * `raid5/data_flip`: `clean` with a flipped byte in a value of the oldest stripe, in a value
//!   of the newest stripe, and in a parity chunk of the middle stripe;
//! * `raid5/footer_flip`: `clean` with a flipped byte in the stripe footer of stripe 0;
//! * `raid5/entries_flip`: `clean` with a flipped byte in the summary entries of stripe 1;
//! * `raid6/clean`: RAID 6, four drives of 18 MiB, 4 KiB chunks, one stripe.
//!
//! The tests pin the byte layout independently of the crate (superblock and footer fields at
//! fixed offsets, crc32c computed here, RAID 5 chunk placement and XOR parity computed here),
//! then open the images with `Array::open` and check every value, the detection and repair of
//! every corruption, and the errors, by variant.
//!
//! The drives are mostly zeros (sparse files), so each is stored as `d<i>.tsimg`: magic
//! `TSFXIMG1`, the file's length (u64 LE), the number of runs (u32 LE), then per run its
//! offset (u64 LE), length (u32 LE) and bytes; every byte outside the runs is zero. The tests
//! expand them into a temporary directory (opening an array writes to its drives) and never
//! modify the committed files.
//!
//! Regenerate only on purpose (a new format version gets a new `fixtures/v<N>/` directory;
//! `v1` must stay readable):
//!
//! ```text
//! TIERSTACK_WRITE_FIXTURES=1 cargo test --release -p tierstack-array --test format_fixtures -- --ignored regenerate
//! ```
//!
//! The uuid and creation time change with every regeneration; everything else the tests check
//! (geometry, versions, sequence numbers, entry placement, byte offsets) is deterministic.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tierstack_array::array::read_superblock_path;
use tierstack_array::format::{
    decode_summary, Entry, Footer, FormatError, Superblock, ENTRY_TOMBSTONE, FOOTER_SIZE,
    FORMAT_VERSION, SB_SIZE,
};
use tierstack_array::{
    Array, ArrayError, ArrayOptions, CreateParams, DriveState, EngineKind, Key, Level,
};

// ---------------------------------------------------------------------------------------------
// The arrays the fixtures hold.

/// Drives of the RAID 5 fixture.
const R5_DRIVES: usize = 4;
/// Size of each RAID 5 drive: the smallest that gives the 8 segments an array needs.
const R5_SIZE: u64 = 12 << 20;
/// Drives of the RAID 6 fixture.
const R6_DRIVES: usize = 4;
/// Size of each RAID 6 drive.
const R6_SIZE: u64 = 18 << 20;
/// Chunk of both fixtures.
const CHUNK: usize = 4096;
/// First byte of the data area (`layout::DATA_OFFSET` in version 1).
const DATA_OFFSET: u64 = 1 << 20;
/// Data units per row of the RAID 5 fixture.
const R5_K: usize = R5_DRIVES - 1;
/// Rows per log stripe of the RAID 5 fixture: ceil((4 MiB + 64 KiB) / (3 * 4 KiB)).
const R5_STRIPE_ROWS: u64 = 347;
/// Bytes of stripe data of the RAID 5 fixture.
const R5_STRIPE_DATA: usize = R5_STRIPE_ROWS as usize * R5_K * CHUNK;
/// Rows per log stripe of the RAID 6 fixture: ceil((4 MiB + 64 KiB) / (2 * 4 KiB)).
const R6_STRIPE_ROWS: u64 = 520;

/// One step of what the RAID 5 fixture was written with.
#[derive(Clone, Copy)]
enum Op {
    /// Put `pattern(seed, len)` under the key.
    Put(Key, usize, u64),
    /// Delete the key.
    Del(Key),
    /// Flush: seals the open stripe (each lands in a segment of its own here).
    Flush,
}

/// What the RAID 5 fixture was written with, in order.
const OPS: &[Op] = &[
    // Stripe 0 (segment 0): small values (the padding of every later stripe repeats what
    // earlier stripes left in the reused stripe buffer, so big values go last).
    Op::Put((1, 0), 0, 10),
    Op::Put((1, 1), 1, 11),
    Op::Put((2, 7), 300, 27),
    Op::Put((3, 0), 200, 30),
    Op::Put((1, 4), 700, 14),
    Op::Flush,
    // Stripe 1 (segment 1): an overwrite of a key of stripe 0, a deletion, a new key.
    Op::Put((3, 0), 300, 31),
    Op::Del((2, 7)),
    Op::Put((4, 0), 500, 40),
    Op::Flush,
    // Stripes 2 and 3 (segments 2 and 3).
    Op::Put((5, 0), 100, 50),
    Op::Flush,
    Op::Put((5, 1), 100, 51),
    Op::Flush,
    // Stripe 4 (segment 4): block-size edges and a value over three chunks. Stripe 0 is then
    // not among the 4 newest stripes that recovery reads back at open.
    Op::Put((1, 2), 4095, 12),
    Op::Put((1, 3), 4096, 13),
    Op::Put((5, 2), 9000, 52),
    Op::Flush,
];

/// The summary entries version 1 wrote for [`OPS`], per stripe: (key, version, block, len,
/// seed of the value, tombstone). Versions come from one sequence that starts at 1 and also
/// numbers segments (`seg_seq`) and stripe writes (`stripe_seq`), see [`R5_FOOTERS`]; a put
/// takes its version before the segment it opens takes its number.
#[allow(clippy::type_complexity)]
const R5_ENTRIES: [&[(Key, u64, u32, u32, u64, bool)]; 5] = [
    &[
        ((1, 0), 1, 0, 0, 10, false),
        ((1, 1), 3, 0, 1, 11, false),
        ((2, 7), 4, 1, 300, 27, false),
        ((3, 0), 5, 2, 200, 30, false),
        ((1, 4), 6, 3, 700, 14, false),
    ],
    &[
        ((3, 0), 8, 0, 300, 31, false),
        ((2, 7), 10, 0, 0, 0, true),
        ((4, 0), 11, 1, 500, 40, false),
    ],
    &[((5, 0), 13, 0, 100, 50, false)],
    &[((5, 1), 16, 0, 100, 51, false)],
    &[
        ((1, 2), 19, 0, 4095, 12, false),
        ((1, 3), 21, 1, 4096, 13, false),
        ((5, 2), 22, 2, 9000, 52, false),
    ],
];

/// (seg_seq, stripe_seq) of the footers of stripes 0 to 4 (stripe `i` is stripe 0 of
/// segment `i`).
const R5_FOOTERS: [(u64, u64); 5] = [(2, 7), (9, 12), (14, 15), (17, 18), (20, 23)];

/// The RAID 6 fixture's values (one stripe): key, length, seed.
const R6_VALUES: &[(Key, usize, u64)] =
    &[((1, 0), 9000, 100), ((1, 1), 4096, 101), ((1, 2), 1, 102)];

/// `len` bytes of a xorshift64 stream seeded by `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The values [`OPS`] leave, and the keys they leave deleted.
fn r5_expected() -> (Vec<(Key, Vec<u8>)>, Vec<Key>) {
    let mut m = std::collections::BTreeMap::new();
    let mut deleted = Vec::new();
    for op in OPS {
        match *op {
            Op::Put(k, len, seed) => {
                m.insert(k, pattern(seed, len));
            }
            Op::Del(k) => {
                m.remove(&k);
                deleted.push(k);
            }
            Op::Flush => {}
        }
    }
    (m.into_iter().collect(), deleted)
}

/// crc32c (Castagnoli, reflected, init and final xor !0), computed here, independently of
/// the crate's dependency.
fn crc32c(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

// ---------------------------------------------------------------------------------------------
// The fixture files.

const IMG_MAGIC: &[u8; 8] = b"TSFXIMG1";
/// Zero runs shorter than this do not split a run of the image.
const IMG_GAP: usize = 64;

fn fixture_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1")
}

/// Directory of fixture set `set` (e.g. `raid5/clean`).
fn fixture_dir(set: &str) -> PathBuf {
    fixture_root().join(set)
}

/// The image of a drive: its length and its non-zero runs.
fn compact(b: &[u8]) -> Vec<u8> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == 0 {
            i += 1;
            continue;
        }
        let start = i;
        let mut end = i + 1;
        let mut j = end;
        while j < b.len() && j - end < IMG_GAP {
            if b[j] != 0 {
                end = j + 1;
            }
            j += 1;
        }
        runs.push((start, end));
        i = end;
    }
    let mut out = Vec::new();
    out.extend_from_slice(IMG_MAGIC);
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(&(runs.len() as u32).to_le_bytes());
    for (s, e) in runs {
        out.extend_from_slice(&(s as u64).to_le_bytes());
        out.extend_from_slice(&((e - s) as u32).to_le_bytes());
        out.extend_from_slice(&b[s..e]);
    }
    out
}

/// Writes the drive that image `img` describes to `dest` (a sparse file).
fn expand(img: &[u8], dest: &Path) {
    assert_eq!(
        &img[..8],
        IMG_MAGIC,
        "{}: not a drive image",
        dest.display()
    );
    let len = u64_at(img, 8);
    let n = u32_at(img, 16) as usize;
    let f = std::fs::File::create(dest).expect("create drive file");
    f.set_len(len).expect("size drive file");
    let mut at = 20;
    for _ in 0..n {
        let off = u64_at(img, at);
        let l = u32_at(img, at + 8) as usize;
        let bytes = &img[at + 12..at + 12 + l];
        assert!(off + l as u64 <= len, "run past the end of the drive");
        f.write_all_at(bytes, off).expect("write run");
        at += 12 + l;
    }
    assert_eq!(at, img.len(), "trailing bytes in a drive image");
}

/// Expands fixture set `set` into `dir` as `d0`, `d1`, ...: the paths of all `n` drives, and
/// whether each exists in the set.
fn expand_set(set: &str, n: usize, dir: &Path) -> (Vec<PathBuf>, Vec<bool>) {
    let src = fixture_dir(set);
    let mut paths = Vec::new();
    let mut present = Vec::new();
    for i in 0..n {
        let p = dir.join(format!("d{i}"));
        let img = src.join(format!("d{i}.tsimg"));
        if img.exists() {
            let b = std::fs::read(&img).expect("read fixture");
            expand(&b, &p);
            present.push(true);
        } else {
            present.push(false);
        }
        paths.push(p);
    }
    (paths, present)
}

fn read(path: &Path, off: u64, len: usize) -> Vec<u8> {
    let f = std::fs::File::open(path).expect("open drive");
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, off).expect("read drive");
    b
}

fn opts() -> ArrayOptions {
    ArrayOptions {
        engine: EngineKind::Psync,
        direct: false,
        lock_wait: Duration::from_secs(5),
        ..ArrayOptions::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Version 1's layout, written out here (RAID 5, four drives, 4 KiB chunks).

/// Drive and byte offset of byte `off` of the data of RAID 5 stripe `gs`: data fills rows of
/// `R5_K` chunks; in global row `r` data unit `u` is on drive `(u + r) % 4` and the parity on
/// drive `(3 + r) % 4`; row `r` is at `DATA_OFFSET + r * CHUNK` on every drive.
fn r5_place(gs: u64, off: usize) -> (usize, u64) {
    let row = (off / (R5_K * CHUNK)) as u64;
    let unit = off % (R5_K * CHUNK) / CHUNK;
    let grow = gs * R5_STRIPE_ROWS + row;
    let drive = (unit + (grow % R5_DRIVES as u64) as usize) % R5_DRIVES;
    (
        drive,
        DATA_OFFSET + grow * CHUNK as u64 + (off % CHUNK) as u64,
    )
}

/// Drive holding the parity of RAID 5 global row `grow`.
fn r5_parity_drive(grow: u64) -> usize {
    (R5_K + (grow % R5_DRIVES as u64) as usize) % R5_DRIVES
}

/// Bytes `[off, off+len)` of the data of RAID 5 stripe `gs`, read straight from the drives.
fn r5_raw(paths: &[PathBuf], gs: u64, off: usize, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut pos = off;
    while pos < off + len {
        let n = (CHUNK - pos % CHUNK).min(off + len - pos);
        let (d, at) = r5_place(gs, pos);
        out.extend_from_slice(&read(&paths[d], at, n));
        pos += n;
    }
    out
}

/// The independent reading of a superblock copy: every field at its version 1 offset.
#[derive(Debug, PartialEq)]
struct RawSb {
    version: u32,
    uuid: [u8; 16],
    drive_index: u32,
    ndrives: u32,
    level: u32,
    chunk: u32,
    groups: u32,
    stripe_rows: u32,
    seg_stripes: u32,
    nsegs: u32,
    rows: u64,
    generation: u64,
    created: u64,
    states: Vec<u8>,
}

/// Reads a superblock copy by hand, checking magic, crc32c (last 4 bytes), the reserved
/// word and that every byte between the states and the crc is zero.
fn raw_sb(b: &[u8]) -> RawSb {
    assert_eq!(b.len(), SB_SIZE);
    assert_eq!(&b[..8], b"TSARRAY\x01", "magic");
    assert_eq!(u32_at(b, SB_SIZE - 4), crc32c(&b[..SB_SIZE - 4]), "crc32c");
    assert_eq!(u32_at(b, 12), 0, "reserved word");
    let ndrives = u32_at(b, 36);
    let states = b[88..88 + ndrives as usize].to_vec();
    assert!(
        b[88 + ndrives as usize..SB_SIZE - 4]
            .iter()
            .all(|&x| x == 0),
        "padding is zero"
    );
    RawSb {
        version: u32_at(b, 8),
        uuid: b[16..32].try_into().expect("uuid"),
        drive_index: u32_at(b, 32),
        ndrives,
        level: u32_at(b, 40),
        chunk: u32_at(b, 44),
        groups: u32_at(b, 48),
        stripe_rows: u32_at(b, 52),
        seg_stripes: u32_at(b, 56),
        nsegs: u32_at(b, 60),
        rows: u64_at(b, 64),
        generation: u64_at(b, 72),
        created: u64_at(b, 80),
        states,
    }
}

fn state_code(s: DriveState) -> u8 {
    match s {
        DriveState::Online => 0,
        DriveState::Failed => 1,
        DriveState::Rebuilding => 2,
    }
}

/// Both superblock copies of drive `path`, checked to agree with each other and with
/// `Superblock::decode`, read by hand.
fn check_sb(path: &Path) -> RawSb {
    let b = read(path, 0, 2 * SB_SIZE);
    assert_eq!(b[..SB_SIZE], b[SB_SIZE..], "the two copies are equal");
    let raw = raw_sb(&b[..SB_SIZE]);
    let sb = Superblock::decode(&b[..SB_SIZE]).expect("decode superblock");
    assert_eq!(raw.version, FORMAT_VERSION);
    let mine = RawSb {
        version: FORMAT_VERSION,
        uuid: sb.uuid,
        drive_index: sb.drive_index,
        ndrives: sb.ndrives,
        level: sb.level,
        chunk: sb.chunk,
        groups: sb.groups,
        stripe_rows: sb.stripe_rows,
        seg_stripes: sb.seg_stripes,
        nsegs: sb.nsegs,
        rows: sb.rows,
        generation: sb.generation,
        created: sb.created,
        states: sb.states.iter().map(|&s| state_code(s)).collect(),
    };
    assert_eq!(raw, mine, "{}", path.display());
    assert_eq!(read_superblock_path(path).expect("read superblock"), sb);
    raw
}

/// Every value and deletion of [`OPS`] reads back from `a`.
fn check_r5_content(a: &Array) {
    let (vals, deleted) = r5_expected();
    for (k, v) in &vals {
        let got = a
            .get(*k)
            .expect("get")
            .unwrap_or_else(|| panic!("{k:?} lost"));
        assert!(got == *v, "{k:?}: wrong bytes ({} read)", got.len());
    }
    for k in &deleted {
        assert_eq!(a.get(*k).expect("get"), None, "{k:?} was deleted");
    }
    let keys: Vec<Key> = vals.iter().map(|(k, _)| *k).collect();
    assert_eq!(a.keys_in(0, u64::MAX), keys);
}

/// Expands `clean` and `set`, and lists the bytes where their drives differ: (drive, offset,
/// clean byte, set byte).
fn diff_from_clean(set: &str) -> Vec<(usize, u64, u8, u8)> {
    let t = tempfile::tempdir().expect("tempdir");
    let (a, _) = expand_set("raid5/clean", R5_DRIVES, &mkdir(t.path().join("a")));
    let (b, present) = expand_set(set, R5_DRIVES, &mkdir(t.path().join("b")));
    let mut out = Vec::new();
    for i in 0..R5_DRIVES {
        if !present[i] {
            continue;
        }
        let x = std::fs::read(&a[i]).expect("read");
        let y = std::fs::read(&b[i]).expect("read");
        assert_eq!(x.len(), y.len());
        for (j, (p, q)) in x.iter().zip(&y).enumerate() {
            if p != q {
                out.push((i, j as u64, *p, *q));
            }
        }
    }
    out
}

fn mkdir(p: PathBuf) -> PathBuf {
    std::fs::create_dir_all(&p).expect("mkdir");
    p
}

/// Whether the drives at `paths` hold the same bytes as the `clean` set from byte `from` on.
fn same_as_clean(paths: &[PathBuf], from: usize) -> bool {
    let t = tempfile::tempdir().expect("tempdir");
    let (clean, _) = expand_set("raid5/clean", R5_DRIVES, t.path());
    paths.iter().zip(&clean).all(|(p, c)| {
        std::fs::read(p).expect("read")[from..] == std::fs::read(c).expect("read")[from..]
    })
}

/// `rows` in the superblocks of the RAID 5 sets: the rows of the whole drive,
/// (12 MiB - `DATA_OFFSET`) / 4 KiB, as `Array::create` wrote it; superblocks that an opened
/// array writes later (a repairing scrub, `fail_drive`) repeat it. No reader uses the field.
const R5_ROWS: u64 = 2816;

/// `rows` in the superblocks of the committed `raid5/degraded` set: its `fail_drive` ran on
/// code that rewrote the field as the rows of the area the geometry uses (`DATA_OFFSET` + 8
/// stripes of 347 rows) instead of repeating it. Still version 1 (no reader uses the field);
/// a set regenerated now holds [`R5_ROWS`].
const R5_ROWS_DEGRADED_SET: u64 = 8 * R5_STRIPE_ROWS;

// ---------------------------------------------------------------------------------------------
// The tests.

#[test]
fn images_are_small_and_well_formed() {
    let mut total = 0u64;
    let mut files = 0;
    for set in [
        "raid5/clean",
        "raid5/degraded",
        "raid5/sb_checksum",
        "raid5/future_version",
        "raid5/data_flip",
        "raid5/footer_flip",
        "raid5/entries_flip",
        "raid6/clean",
    ] {
        let dir = fixture_dir(set);
        assert!(dir.is_dir(), "{} missing", dir.display());
        for e in std::fs::read_dir(&dir).expect("list fixtures") {
            let e = e.expect("entry");
            let b = std::fs::read(e.path()).expect("read");
            assert_eq!(&b[..8], IMG_MAGIC, "{}", e.path().display());
            assert!(e.file_name().to_string_lossy().ends_with(".tsimg"));
            total += b.len() as u64;
            files += 1;
        }
    }
    assert_eq!(
        files,
        7 * 4 - 1 + 4,
        "every set has its drives (degraded lacks d1)"
    );
    assert!(total < 1 << 20, "fixtures take {total} bytes");
}

/// Superblocks of the clean RAID 5 set: both copies, every field at its offset, crc32c.
#[test]
fn raid5_superblocks_have_the_v1_layout() {
    let t = tempfile::tempdir().expect("tempdir");
    let (paths, _) = expand_set("raid5/clean", R5_DRIVES, t.path());
    let mut uuid = None;
    for (i, p) in paths.iter().enumerate() {
        assert_eq!(std::fs::metadata(p).expect("stat").len(), R5_SIZE);
        let sb = check_sb(p);
        assert_eq!(sb.drive_index, i as u32);
        assert_eq!(
            (sb.ndrives, sb.level, sb.chunk, sb.groups),
            (4, 5, CHUNK as u32, 1)
        );
        assert_eq!(
            (sb.stripe_rows, sb.seg_stripes, sb.nsegs, sb.rows),
            (R5_STRIPE_ROWS as u32, 1, 8, R5_ROWS)
        );
        assert_eq!(sb.generation, 1);
        assert!(sb.created > 1_600_000_000, "created {}", sb.created);
        assert_eq!(sb.states, vec![0, 0, 0, 0]);
        assert_ne!(sb.uuid, [0; 16]);
        assert_eq!(
            *uuid.get_or_insert(sb.uuid),
            sb.uuid,
            "one uuid on every drive"
        );
    }
}

/// Stripe footers and summaries of the clean RAID 5 set at their version 1 places, every
/// value's bytes where the layout puts them, and XOR parity on every row that holds data.
#[test]
fn raid5_stripes_have_the_v1_layout() {
    let t = tempfile::tempdir().expect("tempdir");
    let (paths, _) = expand_set("raid5/clean", R5_DRIVES, t.path());
    let uuid = check_sb(&paths[0]).uuid;
    let max_blocks = (R5_STRIPE_DATA / 4096) as u32;
    for gs in 0..8u64 {
        let tail = r5_raw(&paths, gs, R5_STRIPE_DATA - 4096, 4096);
        let fb = &tail[4096 - FOOTER_SIZE..];
        if gs >= 5 {
            assert!(
                tail.iter().all(|&b| b == 0),
                "stripe {gs} was never written"
            );
            continue;
        }
        // The footer, by hand.
        let want = R5_ENTRIES[gs as usize];
        assert_eq!(&fb[..8], b"TSSTRIP\x01");
        assert_eq!(&fb[8..24], &uuid);
        assert_eq!(u32_at(fb, 24), gs as u32, "segment");
        assert_eq!(u32_at(fb, 28), 0, "stripe in segment");
        let (seg_seq, stripe_seq) = R5_FOOTERS[gs as usize];
        assert_eq!(u64_at(fb, 32), seg_seq);
        assert_eq!(u64_at(fb, 40), stripe_seq);
        assert_eq!(u32_at(fb, 48), want.len() as u32, "entries");
        assert_eq!(u32_at(fb, 52), 0, "flags");
        let ents = &tail[4096 - FOOTER_SIZE - 40 * want.len()..4096 - FOOTER_SIZE];
        assert_eq!(u32_at(fb, 56), crc32c(ents), "summary crc");
        assert_eq!(u32_at(fb, 60), crc32c(&fb[..60]), "footer crc");
        // The entries, by hand, and as the crate decodes them.
        let mut expect = Vec::new();
        for (i, &(k, version, block, len, seed, tomb)) in want.iter().enumerate() {
            let e = &ents[i * 40..(i + 1) * 40];
            let crc = if tomb {
                0
            } else {
                crc32c(&pattern(seed, len as usize))
            };
            let flags = if tomb { ENTRY_TOMBSTONE } else { 0 };
            assert_eq!((u64_at(e, 0), u64_at(e, 8)), k);
            assert_eq!(u64_at(e, 16), version);
            assert_eq!((u32_at(e, 24), u32_at(e, 28)), (block, len));
            assert_eq!((u32_at(e, 32), u32_at(e, 36)), (crc, flags));
            expect.push(Entry {
                obj: k.0,
                page: k.1,
                version,
                block,
                len,
                crc,
                flags,
            });
            if !tomb {
                let v = r5_raw(&paths, gs, block as usize * 4096, len as usize);
                assert!(
                    v == pattern(seed, len as usize),
                    "{k:?} v{version} in place"
                );
            }
        }
        let (f, e) = decode_summary(&tail, max_blocks).expect("decode summary");
        assert_eq!(e, expect);
        assert_eq!(
            f,
            Footer {
                uuid,
                seg: gs as u32,
                stripe: 0,
                seg_seq,
                stripe_seq,
                nentries: want.len() as u32,
                flags: 0,
                summary_crc: crc32c(ents),
            }
        );
        // Parity of the rows with data (the first ones) and of the summary's row.
        for row in [0, 1, 2, 3, R5_STRIPE_ROWS - 1] {
            let grow = gs * R5_STRIPE_ROWS + row;
            let mut x = vec![0u8; CHUNK];
            for u in 0..R5_K {
                let (d, at) = r5_place(gs, row as usize * R5_K * CHUNK + u * CHUNK);
                for (a, b) in x.iter_mut().zip(read(&paths[d], at, CHUNK)) {
                    *a ^= b;
                }
            }
            let p = read(
                &paths[r5_parity_drive(grow)],
                DATA_OFFSET + grow * CHUNK as u64,
                CHUNK,
            );
            assert!(p == x, "parity of stripe {gs} row {row}");
        }
    }
}

/// The clean set opens, with either engine, and gives back every value; scrub finds it clean.
#[test]
fn raid5_clean_opens_and_reads() {
    for o in [opts(), ArrayOptions::default()] {
        let t = tempfile::tempdir().expect("tempdir");
        let (paths, _) = expand_set("raid5/clean", R5_DRIVES, t.path());
        let a = Array::open(&paths, &o).expect("open");
        check_r5_content(&a);
        let s = a.status();
        assert_eq!((s.level, s.chunk, s.drives_total), (5, CHUNK, 4));
        assert_eq!(s.state, "online");
        assert_eq!(s.generation, 1);
        assert_eq!((s.objects, s.segments, s.free_segments), (10, 8, 3));
        assert_eq!(s.repaired, 0);
        let r = a.scrub(false, &|_, _| {}).expect("scrub");
        assert!(r.clean(), "{r:?}");
        assert_eq!((r.stripes_checked, r.records_checked), (5, 11));
        drop(a);
        assert!(
            same_as_clean(&paths, 0),
            "opening and reading changed nothing"
        );
    }
}

/// With any one drive of the clean set missing (not given, or given and absent) the array
/// opens degraded and every value is reconstructed from parity.
#[test]
fn raid5_one_drive_missing_reads_degraded() {
    for missing in 0..R5_DRIVES {
        for give_path in [false, true] {
            let t = tempfile::tempdir().expect("tempdir");
            let (paths, _) = expand_set("raid5/clean", R5_DRIVES, t.path());
            std::fs::remove_file(&paths[missing]).expect("remove drive");
            let given: Vec<PathBuf> = paths
                .iter()
                .enumerate()
                .filter(|(i, _)| give_path || *i != missing)
                .map(|(_, p)| p.clone())
                .collect();
            let a = Array::open(&given, &opts()).expect("open degraded");
            let s = a.status();
            assert_eq!(s.state, "degraded");
            for d in &s.drives {
                let want = if d.index == missing {
                    DriveState::Failed
                } else {
                    DriveState::Online
                };
                assert_eq!(d.state, want, "drive {}", d.index);
            }
            check_r5_content(&a);
        }
    }
    // Two missing: more than RAID 5 tolerates.
    let t = tempfile::tempdir().expect("tempdir");
    let (paths, _) = expand_set("raid5/clean", R5_DRIVES, t.path());
    match Array::open(&paths[..2], &opts()) {
        Err(ArrayError::Redundancy(m)) => assert!(m.contains("2 drives missing"), "{m}"),
        Err(e) => panic!("expected Redundancy, got {e:?}"),
        Ok(_) => panic!("opened with two drives missing"),
    }
}

/// The degraded set: `fail_drive(1)` recorded in the superblocks of the others (generation 2,
/// drive 1 failed); drive 1's file is gone. Every value reads back.
#[test]
fn raid5_failed_drive_is_recorded_and_read_around() {
    let t = tempfile::tempdir().expect("tempdir");
    let (paths, present) = expand_set("raid5/degraded", R5_DRIVES, t.path());
    assert_eq!(present, vec![true, false, true, true]);
    let t2 = tempfile::tempdir().expect("tempdir");
    let (clean, _) = expand_set("raid5/clean", R5_DRIVES, t2.path());
    let uuid = check_sb(&clean[0]).uuid;
    for i in [0, 2, 3] {
        let sb = check_sb(&paths[i]);
        assert_eq!(sb.uuid, uuid, "the same array as the clean set");
        assert_eq!(sb.generation, 2);
        assert_eq!(sb.states, vec![0, 1, 0, 0]);
        assert_eq!(sb.rows, R5_ROWS_DEGRADED_SET);
        // Only the superblocks changed.
        let a = std::fs::read(&paths[i]).expect("read");
        let b = std::fs::read(&clean[i]).expect("read");
        assert!(
            a[2 * SB_SIZE..] == b[2 * SB_SIZE..],
            "drive {i} data unchanged"
        );
    }
    for given in [
        paths.clone(),
        vec![paths[0].clone(), paths[2].clone(), paths[3].clone()],
    ] {
        let a = Array::open(&given, &opts()).expect("open");
        let s = a.status();
        assert_eq!((s.state.as_str(), s.generation), ("degraded", 2));
        assert_eq!(s.drives[1].state, DriveState::Failed);
        check_r5_content(&a);
    }
    // The failed drive's old superblock (generation 1, all online) loses to generation 2:
    // with the clean drive 1 given back, it stays failed.
    std::fs::copy(&clean[1], &paths[1]).expect("copy drive 1");
    let a = Array::open(&paths, &opts()).expect("open");
    assert_eq!(a.status().drives[1].state, DriveState::Failed);
    check_r5_content(&a);
}

/// A flipped byte in a superblock: the copy fails its checksum (FormatError::Checksum); a
/// drive with both copies bad is treated as missing by open (the array opens degraded); a
/// drive with one bad copy is read from the other.
#[test]
fn raid5_superblock_checksum_flip() {
    let d = diff_from_clean("raid5/sb_checksum");
    assert_eq!(
        d.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(),
        vec![(0, 40), (0, SB_SIZE as u64 + 40), (2, 40)],
        "the flipped bytes: the level field of drive 0 (both copies) and of drive 2 (copy 0)"
    );
    let t = tempfile::tempdir().expect("tempdir");
    let (paths, _) = expand_set("raid5/sb_checksum", R5_DRIVES, t.path());
    let b0 = read(&paths[0], 0, 2 * SB_SIZE);
    assert_eq!(
        Superblock::decode(&b0[..SB_SIZE]),
        Err(FormatError::Checksum)
    );
    assert_eq!(
        Superblock::decode(&b0[SB_SIZE..]),
        Err(FormatError::Checksum)
    );
    match read_superblock_path(&paths[0]) {
        Err(ArrayError::Format(FormatError::Checksum)) => {}
        other => panic!("expected Format(Checksum), got {other:?}"),
    }
    let b2 = read(&paths[2], 0, 2 * SB_SIZE);
    assert_eq!(
        Superblock::decode(&b2[..SB_SIZE]),
        Err(FormatError::Checksum)
    );
    let sb2 = Superblock::decode(&b2[SB_SIZE..]).expect("second copy");
    assert_eq!(read_superblock_path(&paths[2]).expect("drive 2"), sb2);
    assert_eq!((sb2.drive_index, sb2.level), (2, 5));

    let a = Array::open(&paths, &opts()).expect("open");
    let s = a.status();
    assert_eq!(s.state, "degraded");
    let states: Vec<DriveState> = s.drives.iter().map(|d| d.state).collect();
    assert_eq!(
        states,
        vec![
            DriveState::Failed,
            DriveState::Online,
            DriveState::Online,
            DriveState::Online
        ]
    );
    check_r5_content(&a);
}

/// Superblocks claiming format version 2 (with valid checksums) are refused: the decoder
/// names the version, and so does `Array::open` (`FormatVersion`), for an all-version-2 array
/// and for one version 2 drive among version 1 drives alike: a drive of a newer format is never
/// counted as failed (to be rebuilt over). Nothing is written to any drive.
#[test]
fn raid5_future_version_is_refused() {
    let d = diff_from_clean("raid5/future_version");
    for i in 0..R5_DRIVES {
        let at: Vec<u64> = d.iter().filter(|x| x.0 == i).map(|x| x.1).collect();
        // The version's low byte and the crc, in both copies.
        assert_eq!(
            at.iter()
                .filter(|&&o| o == 8 || o == SB_SIZE as u64 + 8)
                .count(),
            2
        );
        assert!(
            at.iter()
                .all(|&o| o == 8 || o == SB_SIZE as u64 + 8 || (o % SB_SIZE as u64) >= 4092),
            "drive {i}: {at:?}"
        );
    }
    let t = tempfile::tempdir().expect("tempdir");
    let (paths, _) = expand_set("raid5/future_version", R5_DRIVES, t.path());
    for p in &paths {
        let b = read(p, 0, 2 * SB_SIZE);
        for c in [&b[..SB_SIZE], &b[SB_SIZE..]] {
            assert_eq!(u32_at(c, 8), 2);
            assert_eq!(u32_at(c, SB_SIZE - 4), crc32c(&c[..SB_SIZE - 4]));
            assert_eq!(Superblock::decode(c), Err(FormatError::Version(2)));
        }
        match read_superblock_path(p) {
            Err(e @ ArrayError::Format(FormatError::Version(2))) => {
                assert_eq!(
                    e.to_string(),
                    "on-disk format: unsupported format version 2"
                )
            }
            other => panic!("expected Format(Version(2)), got {other:?}"),
        }
    }
    let refused = |given: &[PathBuf], v2: &Path| match Array::open(given, &opts()) {
        Err(e @ ArrayError::FormatVersion { .. }) => {
            assert_eq!(
                e.to_string(),
                format!(
                    "drive {} has on-disk format version 2; this tierstack reads version 1: \
                     upgrade tierstack",
                    v2.display()
                )
            );
            match e {
                ArrayError::FormatVersion {
                    path,
                    version,
                    supported,
                } => assert_eq!(
                    (path.as_path(), version, supported),
                    (v2, 2, FORMAT_VERSION)
                ),
                _ => unreachable!(),
            }
        }
        Err(e) => panic!("expected FormatVersion, got {e:?}"),
        Ok(_) => panic!("opened an array with a drive of format version 2"),
    };
    refused(&paths, &paths[0]);
    // Drive 0 of version 2 with drives 1-3 of version 1, given in any place: refused too, not
    // opened degraded with drive 0 counted failed.
    let t2 = tempfile::tempdir().expect("tempdir");
    let (mixed, _) = expand_set("raid5/clean", R5_DRIVES, t2.path());
    std::fs::copy(&paths[0], &mixed[0]).expect("copy drive 0");
    refused(&mixed, &mixed[0]);
    let reordered = vec![
        mixed[1].clone(),
        mixed[2].clone(),
        mixed[0].clone(),
        mixed[3].clone(),
    ];
    refused(&reordered, &mixed[0]);
    // Nothing was written: drive 0 is still the version 2 drive, the others clean.
    assert!(std::fs::read(&mixed[0]).expect("read") == std::fs::read(&paths[0]).expect("read"));
    let (clean, _) = expand_set("raid5/clean", R5_DRIVES, &mkdir(t2.path().join("c")));
    for i in 1..R5_DRIVES {
        assert!(
            std::fs::read(&mixed[i]).expect("read") == std::fs::read(&clean[i]).expect("read"),
            "drive {i} unchanged"
        );
    }
    // Nor is a version 2 drive taken to replace a failed drive (and be rebuilt over).
    let (deg, _) = expand_set("raid5/degraded", R5_DRIVES, &mkdir(t2.path().join("d")));
    let a = Array::open(&deg, &opts()).expect("open degraded");
    match a.replace_drive(1, &paths[1]) {
        Err(ArrayError::FormatVersion { path, version, .. }) => {
            assert_eq!((path.as_path(), version), (paths[1].as_path(), 2))
        }
        other => panic!("expected FormatVersion, got {other:?}"),
    }
    assert_eq!(a.status().drives[1].state, DriveState::Failed);
}

/// Flipped bytes in data: in a value of the newest stripe (repaired from parity at open, by
/// recovery reading back the newest stripes), in value (1,4) of the oldest stripe (found by
/// scrub, repaired by a read), and in a parity chunk of stripe 2 (found by scrub only,
/// repaired by a repairing scrub). Afterwards the drives hold exactly the clean set.
#[test]
fn raid5_data_flip_is_detected_and_repaired() {
    // Where the flips are, by the layout written out above.
    let (d14, o14) = r5_place(0, 3 * 4096 + 100); // value (1,4): block 3 of stripe 0
    let (d52, o52) = r5_place(4, 2 * 4096 + 10); // value (5,2): block 2 of stripe 4
    let grow = 2 * R5_STRIPE_ROWS;
    let (dp, op) = (
        r5_parity_drive(grow),
        DATA_OFFSET + grow * CHUNK as u64 + 10,
    );
    let mut d: Vec<(usize, u64)> = diff_from_clean("raid5/data_flip")
        .iter()
        .map(|x| {
            assert_eq!(x.2 ^ x.3, 1, "one bit flipped");
            (x.0, x.1)
        })
        .collect();
    d.sort_unstable();
    let mut want = vec![(d14, o14), (d52, o52), (dp, op)];
    want.sort_unstable();
    assert_eq!(d, want);

    let t = tempfile::tempdir().expect("tempdir");
    let (paths, _) = expand_set("raid5/data_flip", R5_DRIVES, t.path());
    let a = Array::open(&paths, &opts()).expect("open");
    let s = a.status();
    assert_eq!(s.state, "online");
    assert_eq!(s.repaired, 1, "the newest stripe's value repaired at open");
    assert_eq!(s.drives[d52].checksum_errors, 1);
    let r = a.scrub(false, &|_, _| {}).expect("scrub");
    assert_eq!(
        (r.stripes_checked, r.records_checked, r.checksum_errors),
        (5, 11, 1)
    );
    assert_eq!((r.parity_errors, r.repaired, r.unrepairable), (1, 0, 0));
    // A read returns the right bytes and repairs the drive.
    check_r5_content(&a);
    assert_eq!(a.status().repaired, 2);
    let r = a.scrub(false, &|_, _| {}).expect("scrub");
    assert_eq!((r.checksum_errors, r.parity_errors), (0, 1));
    let r = a.scrub(true, &|_, _| {}).expect("repairing scrub");
    assert_eq!((r.parity_errors, r.repaired, r.unrepairable), (1, 1, 0));
    let r = a.scrub(false, &|_, _| {}).expect("scrub");
    assert!(r.clean(), "{r:?}");
    drop(a);
    assert!(
        same_as_clean(&paths, 2 * SB_SIZE),
        "every flip repaired on the drives"
    );
    // The repairing scrub rewrote the superblocks: the same, `rows` included.
    for (i, p) in paths.iter().enumerate() {
        let sb = check_sb(p);
        assert_eq!((sb.drive_index, sb.generation), (i as u32, 1));
        assert_eq!(sb.rows, R5_ROWS);
    }
    assert!(
        same_as_clean(&paths, 0),
        "superblocks rewritten as they were"
    );
}

/// A flipped byte in the footer of stripe 0: the footer fails its checksum; recovery
/// rebuilds it from parity (and rewrites it) at open, so every value is found.
#[test]
fn raid5_footer_flip_is_repaired_at_open() {
    let (fd, fo) = r5_place(0, R5_STRIPE_DATA - FOOTER_SIZE + 40);
    let d = diff_from_clean("raid5/footer_flip");
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].0, d[0].1), (fd, fo), "the low byte of stripe_seq");
    let t = tempfile::tempdir().expect("tempdir");
    let (paths, _) = expand_set("raid5/footer_flip", R5_DRIVES, t.path());
    let tail = r5_raw(&paths, 0, R5_STRIPE_DATA - FOOTER_SIZE, FOOTER_SIZE);
    assert_eq!(Footer::decode(&tail), Err(FormatError::Checksum));
    let a = Array::open(&paths, &opts()).expect("open");
    let s = a.status();
    assert_eq!((s.repaired, s.drives[fd].checksum_errors), (1, 1));
    check_r5_content(&a);
    drop(a);
    assert!(same_as_clean(&paths, 0), "the footer was rewritten");
}

/// A flipped byte in the summary entries of stripe 1 (its footer intact): the entries fail
/// their checksum; recovery rebuilds the summary's block from parity (and rewrites it) at open,
/// exactly as for a flipped footer, so stripe 1's records are all found: (3,0) reads its newer
/// value, (2,7) stays deleted, (4,0) is there, segment 1 is not free, and scrub finds it clean.
#[test]
fn raid5_entries_flip_is_repaired_at_open() {
    let (ed, eo) = r5_place(1, R5_STRIPE_DATA - FOOTER_SIZE - 40 + 16);
    let d = diff_from_clean("raid5/entries_flip");
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].0, d[0].1), (ed, eo), "the version of (4,0)'s entry");
    let t = tempfile::tempdir().expect("tempdir");
    let (paths, _) = expand_set("raid5/entries_flip", R5_DRIVES, t.path());
    let tail = r5_raw(&paths, 1, R5_STRIPE_DATA - 4096, 4096);
    let max_blocks = (R5_STRIPE_DATA / 4096) as u32;
    assert!(Footer::decode(&tail[4096 - FOOTER_SIZE..]).is_ok());
    assert_eq!(
        decode_summary(&tail, max_blocks),
        Err(FormatError::Checksum)
    );
    let a = Array::open(&paths, &opts()).expect("open");
    let s = a.status();
    assert_eq!((s.state.as_str(), s.repaired), ("online", 1));
    assert_eq!(s.drives[ed].checksum_errors, 1);
    assert_eq!(s.free_segments, 3, "segment 1 is in use");
    assert_eq!(a.get((3, 0)).expect("get"), Some(pattern(31, 300)));
    assert_eq!(a.get((2, 7)).expect("get"), None);
    assert_eq!(a.get((4, 0)).expect("get"), Some(pattern(40, 500)));
    assert!(a.damaged_stripes().is_empty());
    check_r5_content(&a);
    let r = a.scrub(false, &|_, _| {}).expect("scrub");
    assert!(r.clean(), "{r:?}");
    assert_eq!((r.stripes_checked, r.records_checked), (5, 11));
    drop(a);
    assert!(same_as_clean(&paths, 0), "the entries were rewritten");
}

/// The entries flip with a drive other than the one holding them missing: parity cannot
/// rebuild the summary. Stripe 1 is among the `MAX_INFLIGHT` (4) newest stripes, which a crash
/// may have torn, so version 1 cannot tell this from a torn write: the stripe is voided (its
/// records dropped, as for a torn stripe). A stripe outside that window is refused instead:
/// see `tests/damaged_summaries.rs`.
#[test]
fn raid5_entries_flip_degraded_newest_stripe_counts_as_torn() {
    let (ed, _) = r5_place(1, R5_STRIPE_DATA - FOOTER_SIZE - 40 + 16);
    let gone = (ed + 1) % R5_DRIVES;
    let t = tempfile::tempdir().expect("tempdir");
    let (paths, _) = expand_set("raid5/entries_flip", R5_DRIVES, t.path());
    let given: Vec<PathBuf> = (0..R5_DRIVES)
        .filter(|&i| i != gone)
        .map(|i| paths[i].clone())
        .collect();
    let a = Array::open(&given, &opts()).expect("open");
    let s = a.status();
    assert_eq!(s.state, "degraded");
    assert!(a.damaged_stripes().is_empty());
    // Stripe 1 voided: its records are gone, the older ones are back.
    assert_eq!(a.get((3, 0)).expect("get"), Some(pattern(30, 200)));
    assert_eq!(a.get((2, 7)).expect("get"), Some(pattern(27, 300)));
    assert_eq!(a.get((4, 0)).expect("get"), None);
    // Voided means rewritten as an empty stripe of segment 1: not free, and scrub checks it.
    assert_eq!(s.free_segments, 3);
    let r = a.scrub(false, &|_, _| {}).expect("scrub");
    assert!(r.clean(), "{r:?}");
    assert_eq!(r.stripes_checked, 5);
}

/// The RAID 6 set: superblocks, and every value with any two drives missing (P and Q as
/// version 1 wrote them).
#[test]
fn raid6_reads_with_two_drives_missing() {
    let t = tempfile::tempdir().expect("tempdir");
    let (paths, _) = expand_set("raid6/clean", R6_DRIVES, t.path());
    for (i, p) in paths.iter().enumerate() {
        assert_eq!(std::fs::metadata(p).expect("stat").len(), R6_SIZE);
        let sb = check_sb(p);
        assert_eq!(
            (sb.drive_index, sb.ndrives, sb.level, sb.chunk, sb.groups),
            (i as u32, 4, 6, CHUNK as u32, 1)
        );
        assert_eq!(
            (
                sb.stripe_rows,
                sb.seg_stripes,
                sb.nsegs,
                sb.rows,
                sb.generation
            ),
            (R6_STRIPE_ROWS as u32, 1, 8, 4352, 1)
        );
    }
    let mut sets: Vec<Vec<usize>> = vec![vec![]];
    for a in 0..R6_DRIVES {
        for b in a + 1..R6_DRIVES {
            sets.push(vec![a, b]);
        }
    }
    for missing in sets {
        let given: Vec<PathBuf> = (0..R6_DRIVES)
            .filter(|i| !missing.contains(i))
            .map(|i| paths[i].clone())
            .collect();
        let a = Array::open(&given, &opts()).expect("open");
        for &(k, len, seed) in R6_VALUES {
            let got = a.get(k).expect("get");
            assert!(
                got == Some(pattern(seed, len)),
                "{k:?} without drives {missing:?}"
            );
        }
        if missing.is_empty() {
            let r = a.scrub(false, &|_, _| {}).expect("scrub");
            assert!(r.clean(), "{r:?}");
            assert_eq!((r.stripes_checked, r.records_checked), (1, 3));
        }
    }
}

/// `Array::create` refuses a drive whose superblock does not decode but carries the magic (a
/// newer format version, or a damaged superblock), as it refuses a drive of a readable array:
/// one line naming the drive, the problem and the fix; nothing is written to any drive.
#[test]
fn create_refuses_drives_with_unreadable_superblocks() {
    let params = CreateParams {
        level: Level::Raid5,
        chunk: CHUNK,
        groups: None,
        size: Some(R5_SIZE),
    };
    let refused = |set: &str, want: &dyn Fn(&Path) -> String| {
        let t = tempfile::tempdir().expect("tempdir");
        let (paths, _) = expand_set(set, R5_DRIVES, &mkdir(t.path().join("a")));
        let (orig, _) = expand_set(set, R5_DRIVES, &mkdir(t.path().join("b")));
        match Array::create(&paths, &params, &opts()) {
            Err(e @ ArrayError::Drive { .. }) => {
                assert_eq!(e.to_string(), want(&paths[0]), "{set}")
            }
            Err(e) => panic!("{set}: expected Drive, got {e:?}"),
            Ok(_) => panic!("{set}: created over a drive with a superblock"),
        }
        for (p, o) in paths.iter().zip(&orig) {
            assert!(
                std::fs::read(p).expect("read") == std::fs::read(o).expect("read"),
                "{set}: {} unchanged",
                p.display()
            );
        }
    };
    refused("raid5/future_version", &|p| {
        format!(
            "drive {}: carries a tierstack superblock of on-disk format version 2 (this \
             tierstack reads version 1): it may belong to an array of another tierstack \
             version; wipe it or pick another drive",
            p.display()
        )
    });
    // Drive 0 of the set has both copies bad.
    refused("raid5/sb_checksum", &|p| {
        format!(
            "drive {}: carries a damaged tierstack superblock (checksum mismatch): it may \
             belong to an array; wipe it or pick another drive",
            p.display()
        )
    });
    // A valid superblock (drive 0 of the clean set), as before.
    let uuid = {
        let t = tempfile::tempdir().expect("tempdir");
        let (paths, _) = expand_set("raid5/clean", R5_DRIVES, t.path());
        check_sb(&paths[0]).uuid
    };
    refused("raid5/clean", &|p| {
        format!(
            "drive {}: already belongs to array {} (drive 0): wipe it or pick another drive",
            p.display(),
            uuid.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )
    });
}

// ---------------------------------------------------------------------------------------------
// The generator.

/// Flips bit 0 of byte `at` of the file at `path`.
fn flip(path: &Path, at: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open");
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).expect("read");
    b[0] ^= 1;
    f.write_all_at(&b, at).expect("write");
}

fn copy_set(from: &[PathBuf], dir: &Path) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).expect("mkdir");
    from.iter()
        .enumerate()
        .map(|(i, p)| {
            let q = dir.join(format!("d{i}"));
            std::fs::copy(p, &q).expect("copy");
            q
        })
        .collect()
}

/// Replaces the `.tsimg` files of fixture set `set` with images of the drives at `paths`
/// (`None`: that drive is missing).
fn save_set(set: &str, paths: &[Option<PathBuf>]) {
    let dir = fixture_dir(set);
    std::fs::create_dir_all(&dir).expect("mkdir fixtures");
    for e in std::fs::read_dir(&dir).expect("list") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "tsimg") {
            std::fs::remove_file(&p).expect("remove old image");
        }
    }
    for (i, p) in paths.iter().enumerate() {
        let Some(p) = p else { continue };
        let b = std::fs::read(p).expect("read drive");
        let img = compact(&b);
        let check = tempfile::NamedTempFile::new().expect("temp");
        expand(&img, check.path());
        assert!(
            std::fs::read(check.path()).expect("read") == b,
            "image round trip"
        );
        std::fs::write(dir.join(format!("d{i}.tsimg")), &img).expect("write image");
    }
}

fn all(paths: &[PathBuf]) -> Vec<Option<PathBuf>> {
    paths.iter().cloned().map(Some).collect()
}

/// Writes every fixture anew with the current code. Ignored, and does nothing unless
/// `TIERSTACK_WRITE_FIXTURES=1`: see the module docs.
#[test]
#[ignore = "writes tests/fixtures/v1: run on purpose with TIERSTACK_WRITE_FIXTURES=1"]
fn regenerate() {
    if std::env::var("TIERSTACK_WRITE_FIXTURES").as_deref() != Ok("1") {
        eprintln!("set TIERSTACK_WRITE_FIXTURES=1 to rewrite tests/fixtures/v1");
        return;
    }
    let t = tempfile::tempdir().expect("tempdir");

    // raid5/clean
    let clean: Vec<PathBuf> = (0..R5_DRIVES)
        .map(|i| t.path().join(format!("clean/d{i}")))
        .collect();
    std::fs::create_dir_all(t.path().join("clean")).expect("mkdir");
    let params = CreateParams {
        level: Level::Raid5,
        chunk: CHUNK,
        groups: None,
        size: Some(R5_SIZE),
    };
    let a = Array::create(&clean, &params, &opts()).expect("create raid5");
    for op in OPS {
        match *op {
            Op::Put(k, len, seed) => a.put(k, &pattern(seed, len)).expect("put"),
            Op::Del(k) => assert!(a.delete(k).expect("delete")),
            Op::Flush => a.flush().expect("flush"),
        }
    }
    drop(a);
    save_set("raid5/clean", &all(&clean));

    // raid5/degraded
    let deg = copy_set(&clean, &t.path().join("degraded"));
    let a = Array::open(&deg, &opts()).expect("open");
    a.fail_drive(1).expect("fail drive 1");
    drop(a);
    let mut keep = all(&deg);
    keep[1] = None;
    save_set("raid5/degraded", &keep);

    // raid5/sb_checksum: the level field (offset 40).
    let sbc = copy_set(&clean, &t.path().join("sb_checksum"));
    flip(&sbc[0], 40);
    flip(&sbc[0], SB_SIZE as u64 + 40);
    flip(&sbc[2], 40);
    save_set("raid5/sb_checksum", &all(&sbc));

    // raid5/future_version: version 2 with a valid crc in both copies.
    let fv = copy_set(&clean, &t.path().join("future_version"));
    for p in &fv {
        let mut b = read(p, 0, 2 * SB_SIZE);
        for c in b.chunks_mut(SB_SIZE) {
            c[8..12].copy_from_slice(&2u32.to_le_bytes());
            let crc = crc32c(&c[..SB_SIZE - 4]);
            c[SB_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
        }
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .expect("open");
        f.write_all_at(&b, 0).expect("write");
    }
    save_set("raid5/future_version", &all(&fv));

    // raid5/data_flip
    let df = copy_set(&clean, &t.path().join("data_flip"));
    let (d, o) = r5_place(0, 3 * 4096 + 100);
    flip(&df[d], o);
    let (d, o) = r5_place(4, 2 * 4096 + 10);
    flip(&df[d], o);
    let grow = 2 * R5_STRIPE_ROWS;
    flip(
        &df[r5_parity_drive(grow)],
        DATA_OFFSET + grow * CHUNK as u64 + 10,
    );
    save_set("raid5/data_flip", &all(&df));

    // raid5/footer_flip: stripe_seq of stripe 0's footer.
    let ff = copy_set(&clean, &t.path().join("footer_flip"));
    let (d, o) = r5_place(0, R5_STRIPE_DATA - FOOTER_SIZE + 40);
    flip(&ff[d], o);
    save_set("raid5/footer_flip", &all(&ff));

    // raid5/entries_flip: the version of the last entry of stripe 1.
    let ef = copy_set(&clean, &t.path().join("entries_flip"));
    let (d, o) = r5_place(1, R5_STRIPE_DATA - FOOTER_SIZE - 40 + 16);
    flip(&ef[d], o);
    save_set("raid5/entries_flip", &all(&ef));

    // raid6/clean
    std::fs::create_dir_all(t.path().join("r6")).expect("mkdir");
    let r6: Vec<PathBuf> = (0..R6_DRIVES)
        .map(|i| t.path().join(format!("r6/d{i}")))
        .collect();
    let params = CreateParams {
        level: Level::Raid6,
        chunk: CHUNK,
        groups: None,
        size: Some(R6_SIZE),
    };
    let a = Array::create(&r6, &params, &opts()).expect("create raid6");
    for &(k, len, seed) in R6_VALUES {
        a.put(k, &pattern(seed, len)).expect("put");
    }
    a.flush().expect("flush");
    drop(a);
    save_set("raid6/clean", &all(&r6));
}
