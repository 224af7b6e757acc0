//! On-disk format fixtures of tierstack-fs: the namespace journal (SQLite, `db::Db`) and the
//! intent log (`intent::IntentLog`), as the current code writes them (version 1 of both).
//!
//! `tests/fixtures/v1/` holds files written by the code, committed so that a change that can
//! no longer read them fails here:
//!
//! * `journal.db`: a journal written through `Db::open`, a group of namespace operations
//!   (`put_inode`, `add_dentry`, `put_xattr`, `push_op` in savepoints), `Db::make_durable`, a
//!   row deleted as applied, a row quarantined; closed cleanly (WAL checkpointed and removed).
//!   The tests pin its schema, then open it with `Db::open` and check every row read back;
//! * `intent.log`: three records of generation 1 committed with `IntentLog::commit`;
//! * `intent_torn.log`: the same with the last record torn (its second half zero);
//! * `intent_corrupt.log`: the same with a flipped byte in the second record's payload;
//! * `intent_stale.log`: the log after `reset` (generation 2) and one commit of a record as
//!   long as the first, so the stale records of generation 1 follow it in place;
//! * `intent_bad_header.log`: `intent.log` with a flipped byte in the header's generation.
//!
//! An intent log is a 64 MiB file (`intent::LOG_BYTES`) of zeros after its records; the
//! fixtures hold only the bytes up to the end of the records, and the tests copy them to a
//! temporary directory and extend them with zeros to the full size before opening, which is
//! the file as written (except in the test of a short file). The committed files are never
//! modified.
//!
//! The tests check the layout by hand (intent log header and record fields at their offsets,
//! crc32c computed here) and what `IntentLog::open` replays: whole records of the header's
//! generation, in order, up to the first torn, corrupt or stale one, never a panic; a short
//! file keeps its records; a damaged header gives back the records only when it still shows
//! their generation, and else reports them and never lets them become valid again.
//!
//! Regenerate only on purpose (a new format gets a new `fixtures/v<N>/`; `v1` must stay
//! readable):
//!
//! ```text
//! TIERSTACK_WRITE_FIXTURES=1 cargo test --release -p tierstack-fs --test format_fixtures -- --ignored regenerate
//! ```

use std::path::{Path, PathBuf};

use tierstack_fs::core::extents::Extents;
use tierstack_fs::db::{self, Db, InodeRow, JOp, NewerJournal, OpKind, Pending};
use tierstack_fs::intent::{decode_header, decode_records, IntentLog, Record, HEADER, LOG_BYTES};

fn fixture_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1")
}

fn fixture(name: &str) -> PathBuf {
    fixture_root().join(name)
}

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

/// crc32c (Castagnoli), computed here, independently of the crate's dependency.
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
// The journal's content.

const BACKING: &[u8] = b"/scratch/backing";
/// Times of the fixture's inodes (nanoseconds since the epoch).
const T0: i64 = 1_700_000_000_123_456_789;

fn extents_of(ranges: &[(u64, u64)]) -> Vec<u8> {
    let mut x = Extents::new();
    for &(a, b) in ranges {
        x.add(a, b);
    }
    x.encode()
}

/// The inode rows the journal holds, by inode number.
fn inodes() -> Vec<InodeRow> {
    let base = |ino: u64, kind: u8, mode: u32| InodeRow {
        ino,
        kind,
        mode,
        uid: 1000,
        gid: 100,
        atime: T0 + ino as i64,
        mtime: T0 + 10 * ino as i64,
        ctime: T0 + 100 * ino as i64,
        ..InodeRow::default()
    };
    vec![
        InodeRow {
            uid: 0,
            gid: 0,
            bpath: Some(Vec::new()),
            loaded: true,
            ..base(1, 2, 0o755)
        },
        InodeRow {
            bpath: Some(b"data".to_vec()),
            loaded: true,
            ..base(2, 2, 0o2750)
        },
        InodeRow {
            size: 10_000,
            obj: 7,
            has_base: true,
            base_len: 4096,
            bpath: Some(b"data/a.bin".to_vec()),
            dirty: true,
            staged: Some(b".tierstack-stage-3".to_vec()),
            extents: Some(extents_of(&[(0, 4096), (8192, 10_000)])),
            ..base(3, 1, 0o644)
        },
        InodeRow {
            size: 10,
            target: Some(b"data/a.bin".to_vec()),
            ..base(4, 3, 0o777)
        },
        InodeRow {
            target: Some(0u64.to_le_bytes().to_vec()),
            bpath: Some(b"pipe".to_vec()),
            ..base(5, 4, 0o600)
        },
        InodeRow {
            target: Some(((1u64 << 8) | 3).to_le_bytes().to_vec()),
            bpath: Some(b"null".to_vec()),
            ..base(6, 6, 0o666)
        },
        InodeRow {
            obj: 8,
            bpath: Some(b"b.bin".to_vec()),
            extents: Some(Vec::new()),
            ..base(7, 1, 0o4755)
        },
        InodeRow {
            size: 5,
            obj: 9,
            dirty: true,
            bpath: Some(b"old".to_vec()),
            extents: Some(extents_of(&[(0, 5)])),
            ..base(8, 1, 0o640)
        },
    ]
}

/// Directory entries: (parent, name, inode); inode 7 has two links, inode 8 a name that is
/// not UTF-8.
fn dentries() -> Vec<(u64, Vec<u8>, u64)> {
    let mut v = vec![
        (1, b"data".to_vec(), 2),
        (2, b"a.bin".to_vec(), 3),
        (1, b"link".to_vec(), 4),
        (1, b"pipe".to_vec(), 5),
        (1, b"null".to_vec(), 6),
        (1, b"b.bin".to_vec(), 7),
        (2, b"b2.bin".to_vec(), 7),
        (1, b"caf\xe9".to_vec(), 8),
    ];
    v.sort();
    v
}

fn xattrs() -> Vec<(u64, Vec<u8>, Vec<u8>)> {
    let mut v = vec![
        (2, b"user.x".to_vec(), vec![0, 1, 2, 255]),
        (3, b"user.empty".to_vec(), Vec::new()),
        (3, b"user.tag".to_vec(), b"v1".to_vec()),
    ];
    v.sort();
    v
}

/// Every journal row pushed, in order (seq 1, 2, ...): kind, inode, p1, p2.
fn pushed() -> Vec<(OpKind, u64, Vec<u8>, Vec<u8>)> {
    vec![
        (OpKind::Mkdir, 2, b"data".to_vec(), vec![]),
        (OpKind::Create, 3, b"data/a.bin".to_vec(), vec![]),
        (OpKind::Symlink, 4, b"link".to_vec(), b"data/a.bin".to_vec()),
        (
            OpKind::Mknod,
            6,
            b"null".to_vec(),
            ((1u64 << 8) | 3).to_le_bytes().to_vec(),
        ),
        (OpKind::Create, 7, b"b.bin".to_vec(), vec![]),
        (OpKind::Link, 7, b"b.bin".to_vec(), b"data/b2.bin".to_vec()),
        (OpKind::Data, 3, b"data/a.bin".to_vec(), vec![]),
        (OpKind::SetAttr, 2, b"data".to_vec(), vec![]),
        (
            OpKind::Xattr,
            3,
            b"data/a.bin".to_vec(),
            b"user.tag".to_vec(),
        ),
        (OpKind::Rename, 8, b"old".to_vec(), b"caf\xe9".to_vec()),
        (OpKind::Unlink, 9, b"gone".to_vec(), vec![]),
        (OpKind::Rmdir, 10, b"olddir".to_vec(), vec![]),
        (OpKind::Data, 7, b"b.bin".to_vec(), b"data/b2.bin".to_vec()),
        (
            OpKind::Mknod,
            5,
            b"pipe".to_vec(),
            0u64.to_le_bytes().to_vec(),
        ),
    ]
}

/// Rows deleted as applied to BACKING (the first two), and the row quarantined.
const APPLIED: [i64; 2] = [1, 2];
const QUARANTINED: i64 = 11;
const STUCK_ERROR: &str = "No such file or directory (os error 2)";

/// The journal rows left: `pushed` less the applied and quarantined ones.
fn journal_rows() -> Vec<JOp> {
    pushed()
        .into_iter()
        .enumerate()
        .map(|(i, (kind, ino, p1, p2))| JOp {
            seq: i as i64 + 1,
            kind,
            ino,
            p1,
            p2,
        })
        .filter(|o| !APPLIED.contains(&o.seq) && o.seq != QUARANTINED)
        .collect()
}

/// The numbers version 1 stores for each operation kind.
const KIND_CODES: [(OpKind, i64); 11] = [
    (OpKind::Mkdir, 1),
    (OpKind::Create, 2),
    (OpKind::Symlink, 3),
    (OpKind::Link, 4),
    (OpKind::Rename, 5),
    (OpKind::Unlink, 6),
    (OpKind::Rmdir, 7),
    (OpKind::SetAttr, 8),
    (OpKind::Data, 9),
    (OpKind::Mknod, 10),
    (OpKind::Xattr, 11),
];

/// The schema version 1 writes: (table, [(column, declared type)]).
const SCHEMA: &[(&str, &[(&str, &str)])] = &[
    (
        "dentries",
        &[("parent", "INTEGER"), ("name", "BLOB"), ("ino", "INTEGER")],
    ),
    (
        "inodes",
        &[
            ("ino", "INTEGER"),
            ("kind", "INTEGER"),
            ("mode", "INTEGER"),
            ("uid", "INTEGER"),
            ("gid", "INTEGER"),
            ("size", "INTEGER"),
            ("atime", "INTEGER"),
            ("mtime", "INTEGER"),
            ("ctime", "INTEGER"),
            ("target", "BLOB"),
            ("obj", "INTEGER"),
            ("has_base", "INTEGER"),
            ("base_len", "INTEGER"),
            ("bpath", "BLOB"),
            ("loaded", "INTEGER"),
            ("dirty", "INTEGER"),
            ("staged", "BLOB"),
            ("extents", "BLOB"),
        ],
    ),
    (
        "journal",
        &[
            ("seq", "INTEGER"),
            ("kind", "INTEGER"),
            ("ino", "INTEGER"),
            ("p1", "BLOB"),
            ("p2", "BLOB"),
        ],
    ),
    ("meta", &[("k", "TEXT"), ("v", "BLOB")]),
    ("sqlite_sequence", &[("name", ""), ("seq", "")]),
    (
        "stuck",
        &[
            ("seq", "INTEGER"),
            ("kind", "INTEGER"),
            ("ino", "INTEGER"),
            ("p1", "BLOB"),
            ("p2", "BLOB"),
            ("error", "TEXT"),
            ("since", "INTEGER"),
        ],
    ),
    (
        "xattrs",
        &[("ino", "INTEGER"), ("name", "BLOB"), ("value", "BLOB")],
    ),
];

/// The schema of the database at `path`, read with a plain connection: tables with their
/// columns, and the names of the explicit indexes.
#[allow(clippy::type_complexity)]
fn schema_of(path: &Path) -> (Vec<(String, Vec<(String, String)>)>, Vec<String>) {
    let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open read-only");
    let names = |sql: &str| -> Vec<String> {
        let mut st = c.prepare(sql).expect("prepare");
        let rows = st.query_map([], |r| r.get::<_, String>(0)).expect("query");
        rows.map(|r| r.expect("row")).collect()
    };
    let tables = names("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name");
    let indexes = names(
        "SELECT name FROM sqlite_master WHERE type='index' AND sql IS NOT NULL ORDER BY name",
    );
    let mut out = Vec::new();
    for t in tables {
        let mut st = c
            .prepare(&format!("PRAGMA table_info({t})"))
            .expect("table_info");
        let cols = st
            .query_map([], |r| Ok((r.get::<_, String>(1)?, r.get::<_, String>(2)?)))
            .expect("query")
            .map(|r| r.expect("row"))
            .collect();
        out.push((t, cols));
    }
    (out, indexes)
}

/// A copy of fixture `name` in `dir`.
fn copy_fixture(name: &str, dir: &Path) -> PathBuf {
    let p = dir.join(name);
    std::fs::copy(fixture(name), &p).expect("copy fixture");
    p
}

// ---------------------------------------------------------------------------------------------
// The journal tests.

/// The file is SQLite in WAL mode, with version 1's tables, columns and index, and no
/// leftover `-wal` beside it in the fixtures.
#[test]
fn journal_has_the_v1_schema() {
    let b = std::fs::read(fixture("journal.db")).expect("read fixture");
    assert_eq!(&b[..16], b"SQLite format 3\0");
    assert_eq!((b[18], b[19]), (2, 2), "WAL mode (file format versions 2)");
    assert!(b.len() <= 128 << 10, "{} bytes", b.len());
    assert!(!fixture("journal.db-wal").exists());
    let t = tempfile::tempdir().expect("tempdir");
    let p = copy_fixture("journal.db", t.path());
    let (tables, indexes) = schema_of(&p);
    let want: Vec<(String, Vec<(String, String)>)> = SCHEMA
        .iter()
        .map(|(t, cols)| {
            (
                t.to_string(),
                cols.iter()
                    .map(|(c, ty)| (c.to_string(), ty.to_string()))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(tables, want);
    assert_eq!(indexes, vec!["journal_ino".to_string()]);
    // Opening it changes no table or column of version 1; it adds the table that later
    // builds keep beside them (the drainer's temporary files in BACKING), which a version 1
    // build opening the same journal again ignores.
    drop(Db::open(&p).expect("open"));
    let mut after = want.clone();
    after.push((
        "staging".to_string(),
        vec![
            ("path".to_string(), "BLOB".to_string()),
            ("ino".to_string(), "INTEGER".to_string()),
        ],
    ));
    after.sort();
    assert_eq!(schema_of(&p), (after, indexes));
}

/// `Db::pending` (read-only) sums up what the journal holds for BACKING.
#[test]
fn journal_pending_reads_v1() {
    let t = tempfile::tempdir().expect("tempdir");
    let p = copy_fixture("journal.db", t.path());
    let got = Db::pending(&p).expect("pending");
    assert_eq!(
        got,
        Pending {
            backing: Some(PathBuf::from("/scratch/backing")),
            clean_stop: true,
            ops: 11,
            stuck: 1,
            dirty_files: 2,
            dirty_bytes: 10_005,
        }
    );
    assert!(!got.drained());
}

/// `Db::open` and every reader give back exactly the rows version 1 wrote.
#[test]
fn journal_rows_read_back() {
    let t = tempfile::tempdir().expect("tempdir");
    let p = copy_fixture("journal.db", t.path());
    let mut db = Db::open(&p).expect("open");
    assert_eq!(
        db.meta_get("backing").expect("meta"),
        Some(BACKING.to_vec())
    );
    assert_eq!(db.meta_get("clean").expect("meta"), Some(b"1".to_vec()));
    let sync = db.meta_get("sync").expect("meta").expect("sync stamp");
    assert_eq!(sync.len(), 8, "make_durable's random stamp");
    assert_eq!(db.meta_get("nothing").expect("meta"), None);

    let mut got = db.load_inodes().expect("inodes");
    got.sort_by_key(|r| r.ino);
    assert_eq!(format!("{got:#?}"), format!("{:#?}", inodes()));
    let file = &got[2];
    let ext = Extents::decode(file.extents.as_deref().expect("extents")).expect("decode");
    assert_eq!(
        ext.ranges().collect::<Vec<_>>(),
        vec![(0, 4096), (8192, 12_288)]
    );
    assert_eq!(
        Extents::decode(got[6].extents.as_deref().expect("extents"))
            .expect("decode")
            .bytes(),
        0
    );
    assert_eq!(
        tierstack_fs::core::rdev_of(got[5].target.as_deref().expect("rdev")),
        259
    );

    let mut d = db.load_dentries().expect("dentries");
    d.sort();
    assert_eq!(d, dentries());
    let mut x = db.load_xattrs().expect("xattrs");
    x.sort();
    assert_eq!(x, xattrs());

    let ops = db.ops_after(0, 100).expect("ops");
    assert_eq!(format!("{ops:?}"), format!("{:?}", journal_rows()));
    assert_eq!(db.count_ops().expect("count"), 11);
    assert!(db.has_ops_after(13).expect("after"));
    assert!(!db.has_ops_after(14).expect("after"));
    let of3: Vec<i64> = db
        .ops_of(3, 0)
        .expect("ops_of")
        .iter()
        .map(|o| o.seq)
        .collect();
    assert_eq!(of3, vec![7, 9]);
    let of7: Vec<i64> = db
        .ops_of(7, 5)
        .expect("ops_of")
        .iter()
        .map(|o| o.seq)
        .collect();
    assert_eq!(of7, vec![6, 13]);
    assert_eq!(db.ops_after(12, 1).expect("ops").len(), 1);

    let stuck = db.stuck().expect("stuck");
    assert_eq!(stuck.len(), 1);
    let s = &stuck[0];
    assert_eq!(
        (s.op.seq, s.op.kind, s.op.ino),
        (QUARANTINED, OpKind::Unlink, 9)
    );
    assert_eq!(
        (s.op.p1.as_slice(), s.op.p2.as_slice()),
        (&b"gone"[..], &b""[..])
    );
    assert_eq!(s.error, STUCK_ERROR);
    assert!(s.since > 1_600_000_000, "since {}", s.since);

    // Work goes on from the file: the next row takes seq 15 (AUTOINCREMENT: numbers are
    // never reused, even of rows deleted), and the quarantined row goes back in its place.
    db.in_savepoint(|tx| db::push_op(tx, OpKind::Create, 11, b"new", b""))
        .expect("push");
    let last = db.ops_after(14, 10).expect("ops");
    assert_eq!(last.len(), 1);
    assert_eq!((last[0].seq, last[0].kind), (15, OpKind::Create));
    assert_eq!(db.release_stuck().expect("release"), 1);
    let seqs: Vec<i64> = db
        .ops_after(10, 10)
        .expect("ops")
        .iter()
        .map(|o| o.seq)
        .collect();
    assert_eq!(seqs, vec![11, 12, 13, 14, 15]);
}

/// The kind numbers are part of the format: raw rows carry them. A kind this version does
/// not know (a row written by a newer tierstack) is never skipped: the readers fail on it
/// rather than return fewer rows than `count_ops` counts, and `Db::open` refuses the journal
/// with a `NewerJournal` that says to upgrade, leaving the file as it was.
#[test]
fn journal_kind_numbers() {
    let t = tempfile::tempdir().expect("tempdir");
    let p = copy_fixture("journal.db", t.path());
    let db = Db::open(&p).expect("open");
    let raw: Vec<(i64, i64)> = {
        let mut st = db
            .conn
            .prepare("SELECT seq, kind FROM journal ORDER BY seq")
            .expect("prepare");
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("query");
        rows.map(|r| r.expect("row")).collect()
    };
    let want: Vec<(i64, i64)> = journal_rows()
        .iter()
        .map(|o| {
            let code = KIND_CODES
                .iter()
                .find(|(k, _)| *k == o.kind)
                .map(|(_, c)| *c)
                .expect("code");
            assert_eq!(o.kind as i64, code);
            (o.seq, code)
        })
        .collect();
    assert_eq!(raw, want);
    db.conn
        .execute(
            "INSERT INTO journal(kind, ino, p1, p2) VALUES (99, 1, x'61', x'')",
            [],
        )
        .expect("insert");
    let e = db
        .ops_after(0, 100)
        .expect_err("an unknown kind is not skipped");
    assert!(e.to_string().contains("newer tierstack"), "{e}");
    assert!(db.ops_of(1, 0).is_err());
    assert_eq!(db.ops_after(0, 11).expect("the rows before it").len(), 11);
    assert_eq!(db.count_ops().expect("count"), 12);
    assert!(db.has_ops_after(14).expect("after"));
    drop(db);
    let before = std::fs::read(&p).expect("read");
    let e = Db::open(&p).err().expect("a newer journal is refused");
    let newer = NewerJournal::of(&e).expect("typed");
    assert_eq!(
        newer,
        &NewerJournal {
            table: "journal",
            seq: 15,
            kind: "99".into(),
            rows: 1
        }
    );
    let msg = e.to_string();
    assert!(msg.starts_with(&p.display().to_string()), "{msg}");
    assert!(
        msg.contains("this journal was written by a newer tierstack: upgrade"),
        "{msg}"
    );
    assert_eq!(std::fs::read(&p).expect("read"), before, "left as it was");
    // `buffers` still reads it, and never as drained.
    let pend = Db::pending(&p).expect("pending");
    assert_eq!((pend.ops, pend.stuck), (12, 1));
    assert!(!pend.drained());

    // The same for a quarantined row of an unknown kind.
    let t = tempfile::tempdir().expect("tempdir");
    let p = copy_fixture("journal.db", t.path());
    let c = rusqlite::Connection::open(&p).expect("open");
    c.execute("UPDATE stuck SET kind=12 WHERE seq=?1", [QUARANTINED])
        .expect("update");
    drop(c);
    let e = Db::open(&p).err().expect("refused");
    let newer = NewerJournal::of(&e).expect("typed");
    assert_eq!(
        (newer.table, newer.seq, newer.kind.as_str()),
        ("stuck", QUARANTINED, "12")
    );
}

// ---------------------------------------------------------------------------------------------
// The intent log.

/// The records of generation 1 in `intent.log`.
fn records() -> Vec<Record> {
    vec![
        Record {
            ino: 3,
            obj: 7,
            size: 10_000,
            extents: vec![(0, pattern(1, 100)), (8192, pattern(2, 300))],
        },
        // A file truncated to nothing: no extents.
        Record {
            ino: 8,
            obj: 9,
            size: 0,
            extents: vec![],
        },
        // An empty extent among others.
        Record {
            ino: 3,
            obj: 7,
            size: 12_000,
            extents: vec![(10_000, pattern(3, 500)), (4096, Vec::new())],
        },
    ]
}

/// The record of generation 2 in `intent_stale.log`: as long as the first of generation 1.
fn record_gen2() -> Record {
    Record {
        ino: 7,
        obj: 8,
        size: 20_000,
        extents: vec![(4096, pattern(4, 100)), (16_384, pattern(5, 300))],
    }
}

/// Offsets of the records of `intent.log` (from the start of the file), and its end.
fn record_offsets() -> (Vec<usize>, usize) {
    let mut at = HEADER as usize;
    let mut v = Vec::new();
    for r in records() {
        v.push(at);
        at += r.encode(1).len();
    }
    (v, at)
}

/// A copy of intent log fixture `name`, extended with zeros to the log's full size.
fn full_log(name: &str, dir: &Path) -> PathBuf {
    let p = copy_fixture(name, dir);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .expect("open");
    f.set_len(LOG_BYTES).expect("extend");
    p
}

/// Opens the log at `path` and returns what it replays.
fn replay(path: &Path) -> Vec<Record> {
    IntentLog::open(path).expect("open intent log").1
}

/// Header and records of `intent.log` by hand: every field at its offset, crc32c.
#[test]
fn intent_log_has_the_v1_layout() {
    let b = std::fs::read(fixture("intent.log")).expect("read");
    let (offs, end) = record_offsets();
    assert_eq!(b.len(), end, "the fixture ends where the records do");
    assert_eq!(&b[..8], b"TSINTENT");
    assert_eq!(u32_at(&b, 8), 1, "version");
    assert_eq!(u64_at(&b, 12), 1, "generation");
    assert_eq!(u32_at(&b, 20), crc32c(&b[..20]));
    assert!(b[24..HEADER as usize].iter().all(|&x| x == 0));
    assert_eq!(decode_header(&b), Some(1));
    for (r, &at) in records().iter().zip(&offs) {
        let rec = &b[at..];
        assert_eq!(&rec[..4], b"TSIR");
        let len = u32_at(rec, 4) as usize;
        assert_eq!(u64_at(rec, 8), 1, "generation");
        let p = &rec[20..20 + len];
        let mut whole = rec[4..16].to_vec();
        whole.extend_from_slice(p);
        assert_eq!(
            u32_at(rec, 16),
            crc32c(&whole),
            "crc of length, generation, payload"
        );
        assert_eq!(
            (u64_at(p, 0), u64_at(p, 8), u64_at(p, 16)),
            (r.ino, r.obj, r.size)
        );
        assert_eq!(u32_at(p, 24) as usize, r.extents.len());
        let mut q = 28;
        for (off, bytes) in &r.extents {
            assert_eq!(u64_at(p, q), *off);
            assert_eq!(u32_at(p, q + 8) as usize, bytes.len());
            assert_eq!(&p[q + 12..q + 12 + bytes.len()], &bytes[..]);
            q += 12 + bytes.len();
        }
        assert_eq!(q, len);
        assert_eq!(
            r.encode(1),
            rec[..20 + len].to_vec(),
            "the encoder writes the same"
        );
    }
    assert_eq!(decode_records(&b[HEADER as usize..], 1), records());
}

/// `IntentLog::open` replays every record of the current generation, in order; after
/// `reset` nothing is replayed.
#[test]
fn intent_log_replays_v1_records() {
    let t = tempfile::tempdir().expect("tempdir");
    let p = full_log("intent.log", t.path());
    let (log, got) = IntentLog::open(&p).expect("open");
    assert_eq!(got, records());
    assert_eq!(log.used(), 0);
    drop(log);
    // Opening leaves the records in place until the caller resets.
    assert_eq!(replay(&p), records());
    let (log, _) = IntentLog::open(&p).expect("open");
    log.reset().expect("reset");
    drop(log);
    let b = std::fs::read(&p).expect("read");
    assert_eq!(b.len() as u64, LOG_BYTES);
    assert_eq!(decode_header(&b), Some(2), "reset started generation 2");
    assert_eq!(replay(&p), Vec::new());
    // An open that finds no record starts a generation of its own.
    let b = std::fs::read(&p).expect("read");
    assert_eq!(decode_header(&b), Some(3));
}

/// A torn last record (its second half never written) is dropped; the records before it
/// are replayed.
#[test]
fn intent_log_torn_tail_is_dropped() {
    let b = std::fs::read(fixture("intent_torn.log")).expect("read");
    let clean = std::fs::read(fixture("intent.log")).expect("read");
    let (offs, end) = record_offsets();
    let cut = offs[2] + (end - offs[2]) / 2;
    assert_eq!(b.len(), cut);
    assert_eq!(b[..], clean[..cut]);
    assert_eq!(
        decode_records(&b[HEADER as usize..], 1),
        records()[..2].to_vec()
    );
    let t = tempfile::tempdir().expect("tempdir");
    assert_eq!(
        replay(&full_log("intent_torn.log", t.path())),
        records()[..2].to_vec()
    );
}

/// A flipped byte in the second record's payload ends the log there: only the first record
/// is replayed (the third, though intact, follows the corrupt one and is dropped too).
#[test]
fn intent_log_corrupt_record_ends_the_log() {
    let b = std::fs::read(fixture("intent_corrupt.log")).expect("read");
    let clean = std::fs::read(fixture("intent.log")).expect("read");
    let (offs, _) = record_offsets();
    let diff: Vec<usize> = (0..b.len()).filter(|&i| b[i] != clean[i]).collect();
    assert_eq!(
        diff,
        vec![offs[1] + 20],
        "the low byte of the second record's ino"
    );
    assert_eq!(b[offs[1] + 20] ^ clean[offs[1] + 20], 1);
    let t = tempfile::tempdir().expect("tempdir");
    assert_eq!(
        replay(&full_log("intent_corrupt.log", t.path())),
        records()[..1].to_vec()
    );
}

/// After a reset, the records of the old generation still on disk are not replayed: the
/// generation 2 record is, and the valid generation 1 records right after it are not.
#[test]
fn intent_log_stale_generation_is_not_replayed() {
    let b = std::fs::read(fixture("intent_stale.log")).expect("read");
    let (offs, end) = record_offsets();
    assert_eq!(b.len(), end);
    assert_eq!(decode_header(&b), Some(2));
    let r2 = record_gen2();
    assert_eq!(r2.encode(2).len(), offs[1] - offs[0]);
    assert_eq!(b[offs[0]..offs[1]], r2.encode(2)[..]);
    assert_eq!(decode_records(&b[offs[1]..], 1), records()[1..].to_vec());
    let t = tempfile::tempdir().expect("tempdir");
    assert_eq!(replay(&full_log("intent_stale.log", t.path())), vec![r2]);
}

/// A header that fails its checksum (here a flipped bit in its generation): its checksum
/// field still shows that it was the header of generation 1, the generation of the records
/// at the start of the log, so the header is rewritten and the records are replayed (no
/// panic, no error), again by the next open until the caller resets; after the reset the
/// old records are stale.
#[test]
fn intent_log_bad_header() {
    let b = std::fs::read(fixture("intent_bad_header.log")).expect("read");
    let clean = std::fs::read(fixture("intent.log")).expect("read");
    let diff: Vec<usize> = (0..b.len()).filter(|&i| b[i] != clean[i]).collect();
    assert_eq!(diff, vec![12], "the low byte of the generation");
    assert_eq!(decode_header(&b), None);
    let t = tempfile::tempdir().expect("tempdir");
    let p = full_log("intent_bad_header.log", t.path());
    let (log, got) = IntentLog::open(&p).expect("open");
    assert_eq!(got, records());
    let d = log.damaged().expect("damage reported");
    assert_eq!((d.gen, d.recovered, d.dropped.len()), (1, 3, 0));
    drop(log);
    let after = std::fs::read(&p).expect("read");
    assert_eq!(decode_header(&after), Some(1));
    assert_eq!(after[..clean.len()], clean[..], "the header as it was");
    assert_eq!(replay(&p), records(), "kept until the caller resets");
    let (log, _) = IntentLog::open(&p).expect("open");
    assert!(log.damaged().is_none());
    log.reset().expect("reset");
    drop(log);
    assert_eq!(replay(&p), Vec::new(), "stale after the reset");
}

/// A header damaged in both its generation and its checksum does not show which generation
/// is current: nothing is replayed, the records are reported (generation, inode, size), and
/// the log goes on above their generation, so no later open replays them as current.
#[test]
fn intent_log_unreadable_header_drops_and_reports() {
    let t = tempfile::tempdir().expect("tempdir");
    for (what, bytes) in [
        ("generation and checksum", &[12usize, 20][..]),
        ("the whole header", &(0..24).collect::<Vec<_>>()[..]),
    ] {
        let p = full_log("intent.log", t.path());
        let mut b = std::fs::read(&p).expect("read");
        for &i in bytes {
            b[i] ^= 0x5a;
        }
        std::fs::write(&p, &b).expect("write");
        let (log, got) = IntentLog::open(&p).expect("open");
        assert_eq!(got, Vec::new(), "{what}");
        let d = log.damaged().expect("damage reported").clone();
        let want: Vec<(u64, u64, u64)> = records().iter().map(|r| (1, r.ino, r.size)).collect();
        assert_eq!((d.gen, d.recovered, &d.dropped), (2, 0, &want), "{what}");
        let msg = d.to_string();
        assert!(
            msg.contains("NOT replayed") && msg.contains("(1, 3, 10000)"),
            "{msg}"
        );
        drop(log);
        let after = std::fs::read(&p).expect("read");
        assert_eq!(decode_header(&after), Some(2), "{what}");
        assert_eq!(
            after[HEADER as usize..],
            b[HEADER as usize..],
            "records left, void"
        );
        assert_eq!(replay(&p), Vec::new(), "{what}: never replayed later");
    }
}

/// After a reset the stale records of generation 1 follow the one of generation 2; with the
/// header's generation damaged, the header is rewritten as generation 2 and only its record
/// is replayed.
#[test]
fn intent_log_bad_header_over_stale_records() {
    let t = tempfile::tempdir().expect("tempdir");
    let p = full_log("intent_stale.log", t.path());
    let mut b = std::fs::read(&p).expect("read");
    b[12] ^= 1;
    std::fs::write(&p, &b).expect("write");
    let (log, got) = IntentLog::open(&p).expect("open");
    assert_eq!(got, vec![record_gen2()]);
    assert_eq!(log.damaged().map(|d| (d.gen, d.recovered)), Some((2, 1)));
}

/// A log file shorter than `LOG_BYTES` (cut inside the third record): its whole records are
/// replayed and the file is brought to full size with zeros past its old end only, so the
/// records are replayed again by a second open (until the caller resets).
#[test]
fn intent_log_short_file() {
    let t = tempfile::tempdir().expect("tempdir");
    let p = copy_fixture("intent_torn.log", t.path());
    let short = std::fs::read(&p).expect("read");
    assert_eq!(replay(&p), records()[..2].to_vec());
    let b = std::fs::read(&p).expect("read");
    assert_eq!(b.len() as u64, LOG_BYTES);
    assert_eq!(b[..short.len()], short[..], "what was there is kept");
    assert!(b[short.len()..].iter().all(|&x| x == 0), "zeros after");
    assert_eq!(replay(&p), records()[..2].to_vec());
}

/// Every prefix of `intent.log` decodes, without a panic, to the whole records it holds.
#[test]
fn intent_log_every_cut_decodes() {
    let b = std::fs::read(fixture("intent.log")).expect("read");
    let (offs, end) = record_offsets();
    for cut in HEADER as usize..=end {
        let got = decode_records(&b[HEADER as usize..cut], 1);
        let whole = offs
            .iter()
            .zip(records())
            .filter(|(&at, r)| at + r.encode(1).len() <= cut)
            .count();
        assert_eq!(got, records()[..whole].to_vec(), "cut at {cut}");
    }
}

// ---------------------------------------------------------------------------------------------
// The generator.

fn write_journal(path: &Path) {
    let mut db = Db::open(path).expect("open");
    db.meta_set("backing", BACKING).expect("meta");
    db.begin_group().expect("begin");
    for r in inodes() {
        db.in_savepoint(|tx| db::put_inode(tx, &r)).expect("inode");
    }
    for (parent, name, ino) in dentries() {
        db.in_savepoint(|tx| db::add_dentry(tx, parent, &name, ino))
            .expect("dentry");
    }
    for (ino, name, value) in xattrs() {
        db.in_savepoint(|tx| db::put_xattr(tx, ino, &name, Some(&value)))
            .expect("xattr");
    }
    // One set and removed again: no row.
    db.in_savepoint(|tx| db::put_xattr(tx, 3, b"user.gone", Some(b"x")))
        .expect("xattr");
    db.in_savepoint(|tx| db::put_xattr(tx, 3, b"user.gone", None))
        .expect("xattr");
    for (kind, ino, p1, p2) in pushed() {
        db.in_savepoint(|tx| db::push_op(tx, kind, ino, &p1, &p2))
            .expect("op");
    }
    db.commit_group().expect("commit");
    db.make_durable().expect("durable");
    db.del_op(APPLIED[0]).expect("del");
    db.del_ops(&APPLIED[1..]).expect("del");
    let op = db
        .ops_after(QUARANTINED - 1, 1)
        .expect("ops")
        .pop()
        .expect("row");
    db.quarantine(&op, STUCK_ERROR).expect("quarantine");
    db.meta_set("clean", b"1").expect("meta");
    drop(db);
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
    let out = fixture_root();
    std::fs::create_dir_all(&out).expect("mkdir");
    let t = tempfile::tempdir().expect("tempdir");

    // The journal, closed cleanly: the WAL is checkpointed into the file and removed.
    let j = t.path().join("journal.db");
    write_journal(&j);
    for ext in ["db-wal", "db-shm"] {
        assert!(!j.with_extension(ext).exists(), "{ext} left behind");
    }
    std::fs::copy(&j, out.join("journal.db")).expect("save journal");

    // The intent log: three commits of generation 1.
    let (_, end) = record_offsets();
    let l = t.path().join("intent.log");
    let (log, old) = IntentLog::open(&l).expect("open");
    assert!(old.is_empty());
    for r in records() {
        assert!(log.commit(r).expect("commit"));
    }
    drop(log);
    let full = std::fs::read(&l).expect("read");
    assert_eq!(full.len() as u64, LOG_BYTES);
    assert!(
        full[end..].iter().all(|&x| x == 0),
        "zeros after the records"
    );
    let clean = full[..end].to_vec();
    std::fs::write(out.join("intent.log"), &clean).expect("save");

    // Torn: the second half of the last record never reached the disk.
    let (offs, _) = record_offsets();
    let cut = offs[2] + (end - offs[2]) / 2;
    std::fs::write(out.join("intent_torn.log"), &clean[..cut]).expect("save");

    // Corrupt: a flipped bit in the second record's payload (its ino).
    let mut c = clean.clone();
    c[offs[1] + 20] ^= 1;
    std::fs::write(out.join("intent_corrupt.log"), &c).expect("save");

    // Bad header: a flipped bit in the generation.
    let mut h = clean.clone();
    h[12] ^= 1;
    std::fs::write(out.join("intent_bad_header.log"), &h).expect("save");

    // Stale: reset, then one record of generation 2 over the first of generation 1.
    let (log, got) = IntentLog::open(&l).expect("reopen");
    assert_eq!(got, records());
    log.reset().expect("reset");
    assert!(log.commit(record_gen2()).expect("commit"));
    drop(log);
    let full = std::fs::read(&l).expect("read");
    assert!(full[end..].iter().all(|&x| x == 0));
    std::fs::write(out.join("intent_stale.log"), &full[..end]).expect("save");
}
