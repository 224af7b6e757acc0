//! Crashes (`kill -9`) at the points where the fast tier and BACKING disagree, each found by
//! the long churn with kills:
//! - between a drain and the write-back of the page it drained: the fast tier's array still
//!   holds an older, shorter version of the page than the one BACKING received. After the next
//!   mount, what the mount shows (that page, and zeros after its end up to the file's size)
//!   and what the drain then writes to BACKING must be the same bytes (seed 2037: BACKING kept
//!   bytes that the mount read as zeros);
//! - between a rename applied to BACKING and the commit of the backing paths that follow it:
//!   the next mount must read the file's base where BACKING has it now (seed 3107: reads
//!   failed with EIO until the drain reached the row again).

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tierstack_array::{descriptor, Array, ArrayOptions, CreateParams, Level};

use crate::core::{Core, PAGE};
use crate::db::Db;
use crate::drain::Drainer;
use crate::fuse::TierFs;
use crate::ops::{Caller, Op, Out};

const ROOT: u64 = 1;

/// A mount's state over the fast tier in `fast` (made when `create`) and BACKING.
struct Bed {
    fs: TierFs,
    drainer: Arc<Drainer>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Bed {
    fn open(fast: &Path, backing: &Path, create: bool) -> Bed {
        Bed::open_with(fast, backing, create, true)
    }

    /// As [`Bed::open`]; without a drainer running unless `drain`.
    fn open_with(fast: &Path, backing: &Path, create: bool, drain: bool) -> Bed {
        Bed::open_sized(fast, backing, create, drain, Sizes::default())
    }

    /// As [`Bed::open_with`], with drives, DRAM tier and limit of `sizes`.
    fn open_sized(fast: &Path, backing: &Path, create: bool, drain: bool, sizes: Sizes) -> Bed {
        let opts = ArrayOptions::default();
        let desc = fast.join("array.toml");
        let array = if create {
            let drives: Vec<_> = (0..4).map(|i| fast.join(format!("d{i}"))).collect();
            let params = CreateParams {
                level: Level::Raid5,
                chunk: 64 << 10,
                groups: None,
                size: Some(sizes.drive),
            };
            let a = Array::create(&drives, &params, &opts).expect("array");
            descriptor::Descriptor::for_array(&a)
                .save(&desc)
                .expect("descriptor");
            a
        } else {
            descriptor::open_array(&desc, &opts).expect("open array")
        };
        let array = Arc::new(array);
        let store = tierstack_store::StackSpec::new(sizes.dram)
            .array(array.clone())
            .build()
            .expect("store");
        let limit = sizes.limit.unwrap_or_else(|| {
            crate::core::hold_limit(sizes.dram, 0, array.status().capacity_bytes)
        });
        let db = Db::open(&fast.join("journal.db")).expect("journal");
        let intent = sizes
            .intent
            .then(|| crate::intent::IntentLog::open(&fast.join("journal.intent")).expect("log"));
        let core = Arc::new(
            Core::new(backing.to_path_buf(), true, store, array, db, limit, intent).expect("core"),
        );
        let drainer = Drainer::new(core.clone(), 2, None);
        let threads = if drain {
            drainer.start().expect("drainer")
        } else {
            Vec::new()
        };
        let fs = TierFs {
            core,
            direct_writes: false,
            refresh: Arc::new(crate::refresh::Refresher::default()),
            ring: None,
            readdirplus: true,
            only_uid: None,
        };
        Bed {
            fs,
            drainer,
            threads,
        }
    }

    fn ask(&self, op: Op<'_>) -> Out {
        let (r, then) = self.fs.answer(op, Caller { uid: 0, gid: 0 });
        self.fs.after_reply(then);
        // The drain's index of paths in BACKING lacks none a node has.
        assert_eq!(self.fs.core.path_index_misses(), Vec::<String>::new());
        r.expect("the file system answers")
    }

    fn write(&self, ino: u64, off: u64, data: &[u8]) {
        let fh = self.write_open(ino, off, data);
        self.ask(Op::Release { ino, fh });
    }

    /// Opens `ino` for writing and writes `data` at `off`; the handle stays open.
    fn write_open(&self, ino: u64, off: u64, data: &[u8]) -> u64 {
        let fh = match self.ask(Op::Open {
            ino,
            flags: libc::O_WRONLY,
        }) {
            Out::Open(fh, _) => fh,
            o => panic!("open answered {o:?}"),
        };
        self.ask(Op::Write {
            ino,
            fh,
            offset: off,
            data,
            kill_suidgid: false,
        });
        fh
    }

    fn read_all(&self, ino: u64, size: u64) -> Vec<u8> {
        match self.ask(Op::Read {
            ino,
            offset: 0,
            size: size as u32,
        }) {
            Out::Data(v) => v,
            o => panic!("read answered {o:?}"),
        }
    }

    /// Drains everything now (bounded).
    fn drain(&self) {
        let t0 = Instant::now();
        loop {
            self.fs.core.request_drain(false);
            if self.drainer.idle() {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "no drain in 60 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops as a `kill -9` would leave things: no clean-stop record, nothing flushed.
    fn crash(self) {
        self.drainer.stop.store(true, Relaxed);
        self.fs.core.wake_drainer();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The sizes of a [`Bed`]'s fast tier.
struct Sizes {
    /// Each of the 4 drives (RAID 5).
    drive: u64,
    /// The DRAM tier.
    dram: u64,
    /// What the mount may hold; None: what a mount of these sizes holds
    /// ([`crate::core::hold_limit`]).
    limit: Option<u64>,
    /// With the intent log of sync mode's small `fsync`s, as a mount has.
    intent: bool,
}

impl Default for Sizes {
    fn default() -> Sizes {
        Sizes {
            drive: 96 << 20,
            dram: 8 << 20,
            limit: Some(64 << 20),
            intent: false,
        }
    }
}

/// A temporary folder with a fast tier's folder and BACKING made in it.
fn folders() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().expect("tmp");
    let (fast, backing) = (tmp.path().join("fast"), tmp.path().join("backing"));
    for d in [&fast, &backing] {
        std::fs::create_dir(d).expect("mkdir");
    }
    (tmp, fast, backing)
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

#[test]
fn a_page_older_than_its_drain_reads_and_drains_the_same() {
    let (_tmp, fast, backing) = folders();
    let first = bytes(7894, 3);
    let later = bytes(117_037, 7);
    let at = 607_302u64;
    let size = at + later.len() as u64;
    assert!(size < PAGE, "both writes in page 0");
    let obj = {
        let bed = Bed::open(&fast, &backing, true);
        let ino = create(&bed, b"f");
        bed.write(ino, 0, &first);
        bed.write(ino, at, &later);
        bed.drain();
        let mut want = first.clone();
        want.resize(at as usize, 0);
        want.extend_from_slice(&later);
        assert_eq!(std::fs::read(backing.join("f")).expect("drained"), want);
        // The array still has the page as it was after the first write: the later
        // version never left the DRAM tier before the kill.
        let obj = bed.fs.core.object_of(ino).expect("node");
        bed.fs
            .core
            .store()
            .put_owned((obj, 0), first.clone())
            .expect("older page");
        bed.fs.core.store().flush().expect("flush");
        bed.crash();
        obj
    };
    let bed = Bed::open(&fast, &backing, false);
    let ino = match bed.ask(Op::Lookup {
        parent: ROOT,
        name: b"f",
    }) {
        Out::Entry(a) => a.ino,
        o => panic!("lookup answered {o:?}"),
    };
    assert_eq!(bed.fs.core.object_of(ino), Some(obj));
    let view = bed.read_all(ino, size);
    assert_eq!(view.len() as u64, size);
    bed.drain();
    let back = std::fs::read(backing.join("f")).expect("BACKING");
    let first_diff = view.iter().zip(&back).position(|(a, b)| a != b);
    assert!(
        first_diff.is_none() && view.len() == back.len(),
        "BACKING differs from what the mount shows at byte {first_diff:?} (mount {} bytes, BACKING {})",
        view.len(),
        back.len()
    );
    assert_eq!(
        bed.read_all(ino, size),
        view,
        "the drain changed the mount's view"
    );
}

fn lookup(bed: &Bed, name: &[u8]) -> Option<u64> {
    match bed
        .fs
        .answer(Op::Lookup { parent: ROOT, name }, Caller { uid: 0, gid: 0 })
        .0
    {
        Ok(Out::Entry(a)) => Some(a.ino),
        _ => None,
    }
}

#[test]
fn a_rename_applied_to_backing_but_not_recorded_reads_from_its_new_place() {
    let (_tmp, fast, backing) = folders();
    // A file BACKING had before the mount: the mount reads it from there (its base).
    let data = bytes(3 * PAGE as usize + 1234, 5);
    std::fs::write(backing.join("f"), &data).expect("BACKING file");
    let seq = {
        let bed = Bed::open_with(&fast, &backing, true, false);
        assert!(lookup(&bed, b"f").is_some());
        bed.ask(Op::Rename {
            parent: ROOT,
            name: b"f",
            newparent: ROOT,
            newname: b"g",
            flags: 0,
        });
        let rows = bed.fs.core.committed_rows_after(0, 100).expect("journal");
        let row = rows
            .iter()
            .find(|r| r.kind == crate::db::OpKind::Rename)
            .expect("a rename row");
        let seq = row.seq;
        // The drainer's step up to the crash: the row marked in flight, BACKING renamed;
        // the backing paths and the row's deletion never committed.
        bed.fs.core.mark_in_flight(seq).expect("mark");
        bed.crash();
        seq
    };
    std::fs::rename(backing.join("f"), backing.join("g")).expect("rename in BACKING");
    let bed = Bed::open(&fast, &backing, false);
    let ino = lookup(&bed, b"g").expect("g after the new mount");
    assert_eq!(
        bed.read_all(ino, data.len() as u64),
        data,
        "the renamed file reads its base where BACKING has it"
    );
    let left = bed.fs.core.committed_rows_after(0, 100).expect("journal");
    assert!(
        left.iter().all(|r| r.seq != seq),
        "the interrupted row was applied and deleted at the start: {left:?}"
    );
    bed.drain();
    assert_eq!(std::fs::read(backing.join("g")).expect("g"), data);
    assert!(!backing.join("f").exists());
}

/// The temporary files of the drainer left in BACKING (under `dir`, recursively).
fn strays(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(strays(&p));
        } else if e
            .file_name()
            .as_encoded_bytes()
            .starts_with(crate::core::TMP_PREFIX)
        {
            out.push(p.display().to_string());
        }
    }
    out
}

fn create(bed: &Bed, name: &[u8]) -> u64 {
    match bed.ask(Op::Create {
        parent: ROOT,
        name,
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        flags: libc::O_WRONLY | libc::O_CREAT,
    }) {
        Out::Created(a, fh, _) => {
            bed.ask(Op::Release { ino: a.ino, fh });
            a.ino
        }
        o => panic!("create answered {o:?}"),
    }
}

/// A file drained while open has a staging file in BACKING; a rename that replaces it, then
/// its last close, must not leave that staging file behind (churn seed 3107 left
/// `p2/n6/.tierstack-tmp.221`).
#[test]
fn a_file_replaced_by_a_rename_leaves_no_staging_file() {
    let (_tmp, fast, backing) = folders();
    let bed = Bed::open(&fast, &backing, true);
    let a = create(&bed, b"a");
    let b = create(&bed, b"b");
    bed.write(b, 0, &bytes(5000, 1));
    // `b` drained first: its own staging file (a closed file also drains through one) must
    // not be counted as `a`'s below.
    let t0 = Instant::now();
    while std::fs::metadata(backing.join("b")).map_or(true, |m| m.len() != 5000)
        || !strays(&backing).is_empty()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "b not drained in 60 s"
        );
        bed.fs.core.request_drain(false);
        std::thread::sleep(Duration::from_millis(20));
    }
    let fh = match bed.ask(Op::Open {
        ino: a,
        flags: libc::O_WRONLY,
    }) {
        Out::Open(fh, _) => fh,
        o => panic!("open answered {o:?}"),
    };
    bed.ask(Op::Write {
        ino: a,
        fh,
        offset: 0,
        data: &bytes(70_000, 2),
        kill_suidgid: false,
    });
    // Drained while open: into its staging file, not yet into place.
    let t0 = Instant::now();
    while strays(&backing).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no staging file in 60 s"
        );
        bed.fs.core.request_drain(false);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        strays(&backing).len(),
        1,
        "the open file drained to its staging file"
    );
    bed.ask(Op::Rename {
        parent: ROOT,
        name: b"b",
        newparent: ROOT,
        newname: b"a",
        flags: 0,
    });
    bed.ask(Op::Release { ino: a, fh });
    bed.drain();
    let t0 = Instant::now();
    while !strays(&backing).is_empty() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(strays(&backing), Vec::<String>::new());
    assert_eq!(std::fs::read(backing.join("a")).expect("a"), bytes(5000, 1));
    bed.crash();
}

/// A staging file made just before a crash, which the namespace never recorded, is removed
/// by the next mount's drainer.
#[test]
fn a_staging_file_a_crash_left_unrecorded_is_removed() {
    let (_tmp, fast, backing) = folders();
    let stray = backing.join(".tierstack-tmp.77");
    {
        let bed = Bed::open_with(&fast, &backing, true, false);
        let f = create(&bed, b"f");
        bed.write(f, 0, &bytes(3000, 4));
        // The drainer's first step for inode 77, then the crash.
        bed.fs
            .core
            .note_staging(b".tierstack-tmp.77", 77)
            .expect("note");
        std::fs::write(&stray, b"half a drain").expect("stray");
        bed.crash();
    }
    // A temporary name nobody recorded is not the drainer's to remove.
    let foreign = backing.join(".tierstack-tmp.78");
    std::fs::write(&foreign, b"not ours").expect("foreign");
    let bed = Bed::open(&fast, &backing, false);
    bed.drain();
    let t0 = Instant::now();
    while stray.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!stray.exists(), "the unrecorded staging file stays");
    assert!(foreign.exists());
    bed.crash();
}

/// Names another writer adds to BACKING (another node's buffer draining into the same shared
/// folder) show within the coherence interval; not while a change of this mount's waits to
/// drain (a name it removed would come back); once drained, they do; an
/// interval of zero never looks again, and the kernel then keeps absences for an hour.
#[test]
fn names_other_writers_add_show_within_the_coherence_interval() {
    let (_tmp, fast, backing) = folders();
    let every = Duration::from_millis(100);
    let mut bed = Bed::open_with(&fast, &backing, true, false);
    bed.fs.core.set_coherence(every);
    let lookup = |bed: &Bed, name: &[u8]| {
        bed.fs
            .answer(Op::Lookup { parent: ROOT, name }, Caller { uid: 0, gid: 0 })
            .0
    };
    assert!(matches!(lookup(&bed, b"x"), Ok(Out::Negative(t)) if t == every));
    std::fs::write(backing.join("x"), b"other").expect("another writer");
    // Within the interval the folder is not looked at again.
    assert!(matches!(lookup(&bed, b"x"), Ok(Out::Negative(_))));
    std::thread::sleep(every + Duration::from_millis(50));
    assert!(matches!(lookup(&bed, b"x"), Ok(Out::Entry(a)) if a.size == 5));
    // This mount removes x (no drainer runs: the row waits); another writer adds y.
    assert!(matches!(
        bed.ask(Op::Unlink {
            parent: ROOT,
            name: b"x"
        }),
        Out::Empty
    ));
    std::fs::write(backing.join("y"), b"other").expect("another writer");
    std::thread::sleep(every + Duration::from_millis(50));
    assert!(
        matches!(lookup(&bed, b"x"), Ok(Out::Negative(_))),
        "a name removed here came back from BACKING before its removal drained"
    );
    assert!(matches!(lookup(&bed, b"y"), Ok(Out::Negative(_))));
    // The drainer runs: once the removal drained, y shows and x stays gone.
    bed.threads = bed.drainer.start().expect("drainer");
    bed.drain();
    assert!(!backing.join("x").exists());
    std::thread::sleep(every + Duration::from_millis(50));
    assert!(matches!(lookup(&bed, b"y"), Ok(Out::Entry(_))));
    assert!(matches!(lookup(&bed, b"x"), Ok(Out::Negative(_))));
    // Readdir looks too.
    std::fs::write(backing.join("w"), b"other").expect("another writer");
    std::thread::sleep(every + Duration::from_millis(50));
    let names = match bed.ask(Op::Readdir {
        ino: ROOT,
        offset: 0,
        size: 4096,
    }) {
        Out::Dir(ents) => ents.into_iter().map(|e| e.3).collect::<Vec<_>>(),
        o => panic!("readdir answered {o:?}"),
    };
    assert!(names.contains(&b"w".to_vec()), "{names:?}");
    // Zero: never again; absences kept an hour.
    bed.fs.core.set_coherence(Duration::ZERO);
    std::fs::write(backing.join("z"), b"other").expect("another writer");
    std::thread::sleep(every + Duration::from_millis(50));
    assert!(matches!(lookup(&bed, b"z"), Ok(Out::Negative(t)) if t == Duration::from_secs(3600)));
}

fn set_size(bed: &Bed, ino: u64, size: u64) {
    bed.ask(Op::Setattr {
        ino,
        mode: None,
        uid: None,
        gid: None,
        size: Some(size),
        atime: None,
        mtime: None,
        fh: None,
    });
}

/// Drains file `ino` (at `path`) until it is clean, through the drainer's own steps (no
/// drainer thread runs).
fn drain_now(bed: &Bed, ino: u64, path: &str) {
    let op = crate::drain::test_op(1, crate::db::OpKind::Data, ino, path);
    for _ in 0..4 {
        bed.drainer.drain_file(&op).expect("drain");
    }
    assert!(
        bed.fs.core.begin_drain(ino).is_none(),
        "still dirty after four passes"
    );
}

/// A drain pass over file `ino` (at `path`) with `during` done between its start and its
/// writes to BACKING, then committed.
fn pass_around(bed: &Bed, ino: u64, path: &str, during: impl FnOnce()) {
    let pass = bed.fs.core.begin_drain(ino).expect("a dirty file");
    during();
    let op = crate::drain::test_op(1, crate::db::OpKind::Data, ino, path);
    let w = bed
        .drainer
        .write_pass(&op, pass)
        .expect("the pass's writes");
    bed.drainer.commit_written(w).expect("the pass's commit");
}

/// A file changed while a drain pass over it runs, between the pass's start and its read of
/// the pages: truncated to nothing, written again, grown (what `open(O_TRUNC)`, a write and a
/// `truncate` do). The churn under the interception client (seed 1795942961271942977) found
/// BACKING with the file's size but zeros where its first 293 bytes were: the pass wrote the
/// page it read (the new one) only where the allocation it had noted at its start said
/// there was data (nothing), and called it drained. Both what the drain leaves in BACKING
/// and what the mount reads once its clean pages are dropped must be the file.
#[test]
fn a_file_rewritten_during_its_drain_pass_reaches_backing_whole() {
    let (_tmp, fast, backing) = folders();
    let bed = Bed::open_with(&fast, &backing, true, false);
    let ino = create(&bed, b"f");
    bed.write(ino, 0, &bytes(5000, 9));
    set_size(&bed, ino, 100);
    set_size(&bed, ino, 10_000);
    // The drainer begins its pass when the file is 10,000 bytes, 100 of them allocated.
    let first = bytes(293, 4);
    pass_around(&bed, ino, "f", || {
        set_size(&bed, ino, 0);
        bed.write(ino, 0, &first);
        bed.write(ino, 7000, &first);
        set_size(&bed, ino, 12_000);
    });
    drain_now(&bed, ino, "f");
    let mut want = first.clone();
    want.resize(7000, 0);
    want.extend_from_slice(&first);
    want.resize(12_000, 0);
    assert_eq!(bed.read_all(ino, 12_000), want, "the mount's view");
    let back = std::fs::read(backing.join("f")).expect("BACKING");
    assert_eq!(
        back.iter().zip(&want).position(|(a, b)| a != b),
        None,
        "BACKING differs from the file"
    );
    assert_eq!(back.len(), want.len());
    // Its pages leave the fast tier: the mount reads them from BACKING.
    assert!(bed.fs.core.drop_clean(u64::MAX), "clean pages dropped");
    assert_eq!(
        bed.read_all(ino, 12_000),
        want,
        "the mount's view once read from BACKING"
    );
    // Without a truncation: a page written further, in a block it did not hold, while the
    // pass runs.
    let g = create(&bed, b"g");
    bed.write(g, 0, &first[..100]);
    set_size(&bed, g, 10_000);
    pass_around(&bed, g, "g", || bed.write(g, 5000, &first));
    drain_now(&bed, g, "g");
    let mut want = first[..100].to_vec();
    want.resize(5000, 0);
    want.extend_from_slice(&first);
    want.resize(10_000, 0);
    assert!(
        std::fs::read(backing.join("g")).expect("BACKING g") == want,
        "BACKING's g differs from the file"
    );
}

/// A drained file's copy in BACKING removed by someone else (`rm` in the shared folder)
/// while the mount still shows the file, which is then written again: its drain needs the
/// bytes it did not change. Where the fast tier holds all of them (the write read the page
/// in), the file drains from there; where it does not, the drain refuses the row with an
/// error naming the removed copy and keeps the file (it never drains holes in place of
/// data). Found by hand: the row was refused for good even once the user had made the
/// folder again, with the whole file in the fast tier.
#[test]
fn a_base_removed_by_someone_else_drains_from_the_fast_tier_when_it_holds_all() {
    let (_tmp, fast, backing) = folders();
    let bed = Bed::open_with(&fast, &backing, true, false);
    let first = bytes(5000, 1);
    let f = create(&bed, b"f");
    bed.write(f, 0, &first);
    drain_now(&bed, f, "f");
    std::fs::remove_file(backing.join("f")).expect("rm in BACKING");
    bed.write(f, 5000, b"three");
    drain_now(&bed, f, "f");
    let mut want = first.clone();
    want.extend_from_slice(b"three");
    assert_eq!(std::fs::read(backing.join("f")).expect("BACKING f"), want);
    // Its pages left the fast tier before the copy was removed: refused, kept.
    let g = create(&bed, b"g");
    bed.write(g, 0, &first);
    bed.write(g, 3 * PAGE, b"x");
    drain_now(&bed, g, "g");
    assert!(bed.fs.core.drop_clean(u64::MAX), "clean pages dropped");
    std::fs::remove_file(backing.join("g")).expect("rm in BACKING");
    bed.write(g, 4 * PAGE, b"y");
    let op = crate::drain::test_op(1, crate::db::OpKind::Data, g, "g");
    let e = bed
        .drainer
        .drain_file(&op)
        .expect_err("the drain of g refused");
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    assert!(
        e.to_string().contains("was removed by someone else"),
        "the error names the removed copy: {e}"
    );
    assert!(!backing.join("g").exists(), "nothing half-made in BACKING");
    assert!(
        strays(&backing).is_empty(),
        "no staging file left: {:?}",
        strays(&backing)
    );
    assert!(bed.fs.core.begin_drain(g).is_some(), "g stays dirty");
}

/// `git`'s way of writing an object: a temporary name, written and closed, linked to the
/// object's name, the temporary name removed. Drained, the removal of the temporary name
/// found the file's base there and pinned it (its bytes copied back into the fast tier,
/// store and journal made durable, the file drained again): 1,504 pins for a `git add` of
/// 1,500 files. The base now moves to the linked name, the same file in BACKING.
#[test]
fn a_file_linked_then_unlinked_keeps_its_base_at_its_other_name() {
    let (_tmp, fast, backing) = folders();
    let bed = Bed::open_with(&fast, &backing, true, false);
    let data = bytes(3 * PAGE as usize + 17, 6);
    let x = create(&bed, b"tmp_obj");
    bed.write(x, 0, &data);
    drain_now(&bed, x, "tmp_obj");
    bed.ask(Op::Link {
        ino: x,
        newparent: ROOT,
        newname: b"obj",
    });
    bed.ask(Op::Unlink {
        parent: ROOT,
        name: b"tmp_obj",
    });
    let rows = bed.fs.core.committed_rows_after(0, 100).expect("journal");
    for r in rows.iter().filter(|r| r.kind != crate::db::OpKind::Data) {
        bed.drainer.apply_meta(r).expect("apply the row");
    }
    assert_eq!(bed.drainer.pinned.load(Relaxed), 0, "nothing pinned");
    assert!(!backing.join("tmp_obj").exists());
    assert_eq!(std::fs::read(backing.join("obj")).expect("obj"), data);
    // Its pages leave the fast tier: the mount reads them from its base, now at `obj`.
    bed.fs.core.drop_clean(u64::MAX);
    assert_eq!(bed.read_all(x, data.len() as u64), data);
}

#[test]
fn small_drives_under_a_large_dram_tier_make_fsync_wait_for_the_drain_not_fail() {
    // Drives small enough that the DRAM tier is larger than half the array: what the mount
    // holds must still fit the array, where every fsync (sync mode) writes it.
    let (_tmp, fast, backing) = folders();
    let sizes = Sizes {
        drive: 24 << 20,
        dram: 64 << 20,
        limit: None,
        intent: false,
    };
    let bed = Bed::open_sized(&fast, &backing, true, true, sizes);
    let cap = bed
        .fs
        .core
        .store()
        .status()
        .last()
        .map_or(0, |t| t.capacity_bytes);
    assert!(
        cap > 0 && cap < 2 * (64 << 20),
        "the array is the smaller: {cap}"
    );
    const LEN: usize = 3 << 20;
    // Twice what the array holds, each file fsynced.
    let n = (2 * cap / LEN as u64) as u8;
    let mut inos = Vec::new();
    for i in 0..n {
        let ino = create(&bed, format!("f{i}").as_bytes());
        bed.write(ino, 0, &bytes(LEN, i));
        // An error (EIO, ENOSPC) fails `ask`.
        bed.ask(Op::Fsync { ino });
        inos.push(ino);
    }
    bed.drain();
    for i in 0..n {
        let got = std::fs::read(backing.join(format!("f{i}"))).expect("drained");
        assert!(got == bytes(LEN, i), "f{i} differs in BACKING");
    }
    // The mount reads them back the same (from the fast tier or BACKING).
    for (i, ino) in inos.iter().enumerate() {
        assert!(
            bed.read_all(*ino, LEN as u64) == bytes(LEN, i as u8),
            "f{i} reads wrong"
        );
    }
}

/// The drain's last pass of a file after its last close renames the staging file into place,
/// then records that in the journal (group commit). A `kill -9` between the two left a row
/// that named the staging file as the base: the next mount's intent-log replay, and any read
/// of a page the fast tier no longer held, failed with EIO (the churn under the client: the
/// mount could not start again). Now the next mount finds the base at the file's own path.
#[test]
fn a_staging_file_renamed_into_place_before_its_record_reads_from_the_files_path() {
    let (_tmp, fast, backing) = folders();
    let data = bytes(300_000, 5);
    let (ino, staged) = {
        let bed = Bed::open(&fast, &backing, true);
        let ino = create(&bed, b"f");
        let fh = bed.write_open(ino, 0, &data);
        // Drained while open: into its staging file, which the journal records.
        let t0 = Instant::now();
        while strays(&backing).is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(60), "no staging file");
            bed.fs.core.request_drain(false);
            std::thread::sleep(Duration::from_millis(20));
        }
        let staged = strays(&backing).pop().expect("the staging file");
        bed.ask(Op::Release { ino, fh });
        bed.drain();
        assert_eq!(std::fs::read(backing.join("f")).expect("f"), data);
        assert!(strays(&backing).is_empty(), "renamed into place");
        // The pages leave the fast tier: BACKING's copy is their base.
        assert!(bed.fs.core.drop_clean(u64::MAX), "clean pages dropped");
        bed.fs.core.store().flush().expect("flush");
        bed.crash();
        (ino, staged)
    };
    // The rename's record lost with the last group commit: the row names the staging file.
    let rel = std::path::Path::new(&staged)
        .strip_prefix(&backing)
        .expect("under BACKING")
        .as_os_str()
        .as_encoded_bytes()
        .to_vec();
    {
        let db = rusqlite::Connection::open(fast.join("journal.db")).expect("journal");
        db.execute(
            "UPDATE inodes SET staged=?1 WHERE ino=?2",
            rusqlite::params![rel, ino as i64],
        )
        .expect("row");
        db.execute(
            "INSERT OR REPLACE INTO staging(path, ino) VALUES (?1, ?2)",
            rusqlite::params![rel, ino as i64],
        )
        .expect("staging");
    }
    let bed = Bed::open(&fast, &backing, false);
    assert!(
        bed.read_all(ino, data.len() as u64) == data,
        "the file reads whole from its own path"
    );
    // And a write into it (as the intent log's replay makes) reads the base it keeps.
    bed.write(ino, 1000, b"later");
    let mut want = data.clone();
    want[1000..1005].copy_from_slice(b"later");
    assert!(bed.read_all(ino, data.len() as u64) == want, "written");
    bed.drain();
    assert!(
        std::fs::read(backing.join("f")).expect("f") == want,
        "drained"
    );
    bed.crash();
}

/// A namespace operation queues its journal work ([`Core`]'s `tx_later`) instead of running it
/// under the namespace lock. An `fsync` must still make the file's create durable with its
/// data: here no committer and no drainer run, so only the `fsync` can have written the
/// queued rows, and the crash right after it loses every uncommitted group.
#[test]
fn an_fsynced_file_survives_a_crash_though_its_create_was_queued() {
    let (_tmp, fast, backing) = folders();
    let names: [&[u8]; 3] = [b"one", b"two", b"three"];
    let logged = || Sizes {
        intent: true,
        ..Sizes::default()
    };
    {
        let bed = Bed::open_sized(&fast, &backing, true, false, logged());
        // After the first `fsync` the journal counts as durable: each later one must see
        // that the queued work of the next create is not.
        for (i, name) in names.iter().enumerate() {
            let ino = create(&bed, name);
            bed.write(ino, 0, &bytes(5000, i as u8));
            bed.ask(Op::Fsync { ino });
        }
        assert!(
            bed.fs.core.figures().fsync_logged >= 2,
            "the small fsyncs went to the intent log"
        );
        bed.crash();
    }
    let bed = Bed::open_sized(&fast, &backing, false, false, logged());
    for (i, name) in names.iter().enumerate() {
        let ino = lookup(&bed, name).unwrap_or_else(|| {
            panic!(
                "{} was fsynced before the crash and is gone",
                String::from_utf8_lossy(name)
            )
        });
        assert_eq!(bed.read_all(ino, 5000), bytes(5000, i as u8));
    }
}

/// Queued journal work and work run at once (an extended attribute) keep the order of the
/// changes: the drainer reads create, xattr, rename, unlink, create in that order, and BACKING ends as the
/// mount shows it (after an `fsync` and a crash: what was fsynced is drained).
#[test]
fn queued_and_immediate_journal_rows_keep_the_order_of_the_changes() {
    let (_tmp, fast, backing) = folders();
    let bed = Bed::open_with(&fast, &backing, true, false);
    let a = create(&bed, b"a");
    bed.write(a, 0, b"first");
    // An extended attribute's row is written at once (the others here are queued).
    bed.ask(Op::Setxattr {
        ino: a,
        name: b"user.k",
        value: b"v",
        flags: 0,
    });
    bed.ask(Op::Rename {
        parent: ROOT,
        name: b"a",
        newparent: ROOT,
        newname: b"b",
        flags: 0,
    });
    bed.ask(Op::Unlink {
        parent: ROOT,
        name: b"b",
    });
    let c = create(&bed, b"b");
    bed.write(c, 0, b"second");
    let rows = bed.fs.core.committed_rows_after(0, 100).expect("journal");
    let kinds: Vec<_> = rows
        .iter()
        .map(|r| (r.kind, String::from_utf8_lossy(&r.p1).into_owned()))
        .filter(|(k, _)| *k != crate::db::OpKind::Data && *k != crate::db::OpKind::SetAttr)
        .collect();
    use crate::db::OpKind as K;
    assert_eq!(
        kinds,
        vec![
            (K::Create, "a".to_string()),
            (K::Xattr, "a".to_string()),
            (K::Rename, "a".to_string()),
            (K::Unlink, "b".to_string()),
            (K::Create, "b".to_string()),
        ]
    );
    assert!(rows.windows(2).all(|w| w[0].seq < w[1].seq));
    bed.ask(Op::Fsync { ino: c });
    bed.crash();
    let bed = Bed::open(&fast, &backing, false);
    bed.drain();
    assert_eq!(
        std::fs::read(backing.join("b")).expect("drained"),
        b"second"
    );
    assert!(!backing.join("a").exists());
}

/// An attribute change queued behind its node's own row writes no row of its own (the test
/// of the journal's last row is made when the queued change runs): `mkdir`, then a mode
/// change and a time change (as `tar` makes them) give a mkdir row and one attribute row,
/// and BACKING gets the mode and the time.
#[test]
fn queued_attribute_changes_of_the_same_node_share_one_row() {
    let (_tmp, fast, backing) = folders();
    let bed = Bed::open_with(&fast, &backing, true, false);
    let d = match bed.ask(Op::Mkdir {
        parent: ROOT,
        name: b"d",
        mode: 0o755,
        umask: 0,
    }) {
        Out::Entry(a) => a.ino,
        o => panic!("mkdir answered {o:?}"),
    };
    let set = |mode: Option<u32>, mtime: Option<Option<std::time::SystemTime>>| {
        bed.ask(Op::Setattr {
            ino: d,
            mode,
            uid: None,
            gid: None,
            size: None,
            atime: None,
            mtime,
            fh: None,
        });
    };
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    set(Some(0o700), None);
    set(None, Some(Some(when)));
    let rows = bed.fs.core.committed_rows_after(0, 100).expect("journal");
    use crate::db::OpKind as K;
    let kinds: Vec<_> = rows.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, vec![K::Mkdir, K::SetAttr]);
    bed.ask(Op::Fsyncdir { ino: d });
    bed.crash();
    let bed = Bed::open(&fast, &backing, false);
    bed.drain();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let m = std::fs::metadata(backing.join("d")).expect("drained");
    assert_eq!(m.permissions().mode() & 0o7777, 0o700);
    assert_eq!(m.mtime(), 1_000_000_000);
}

/// Queued journal work waits while the foreground is busy ([`crate::core::journal_due`]) but
/// not past a gap: with the committer running, files made and written and then left alone
/// for a moment (no `fsync`) are in the journal, committed, when the daemon dies.
#[test]
fn queued_journal_work_is_committed_in_the_first_gap() {
    let (_tmp, fast, backing) = folders();
    {
        let bed = Bed::open_with(&fast, &backing, true, false);
        let core = bed.fs.core.clone();
        let committer = std::thread::spawn(move || core.group_committer());
        for i in 0..200u8 {
            let ino = create(&bed, format!("f{i}").as_bytes());
            bed.write(ino, 0, &[i; 10]);
        }
        // A gap, longer than the quiet time, the committer's turn and its commit; nothing
        // here takes the database meanwhile.
        std::thread::sleep(crate::core::JOURNAL_QUIET * 10 + Duration::from_millis(200));
        bed.fs.core.set_stopping();
        committer.join().expect("committer");
        bed.crash();
    }
    let bed = Bed::open_with(&fast, &backing, false, false);
    for i in 0..200u8 {
        assert!(
            lookup(&bed, format!("f{i}").as_bytes()).is_some(),
            "f{i} was made before a gap and is gone after the crash"
        );
    }
}

/// `status` counts the rows the reader's connection cannot see yet: work still queued, and
/// rows run into the open group and not committed. An empty count means an empty journal:
/// `drain --wait` returns on it (it returned at once after an `rm` whose rows were queued,
/// before the drain had seen them).
#[test]
fn status_counts_queued_and_uncommitted_rows() {
    let (_tmp, fast, backing) = folders();
    let bed = Bed::open_with(&fast, &backing, true, false);
    let core = &bed.fs.core;
    assert_eq!(core.journal_backlog().0, 0);
    // Queued (no committer runs here): not in the database at all yet.
    create(&bed, b"q1");
    assert!(core.later_queued(), "a create's rows are queued");
    let queued = core.journal_backlog().0;
    assert!(queued > 0, "queued rows counted: {queued}");
    // Run into the open group, not committed: the reader still sees none.
    create(&bed, b"q2");
    let all = core.journal_len().expect("journal");
    assert!(!core.later_queued());
    assert_eq!(core.journal_backlog().0, all, "uncommitted rows counted");
    // Committed: the reader's own count.
    let rows = core.committed_rows_after(0, 100).expect("journal");
    assert_eq!(rows.len() as u64, all);
    assert_eq!(core.journal_backlog().0, all);
}

/// The queue runs in one savepoint; when a piece of it fails, the others are run again one
/// by one and kept: only the failing piece is lost, the failure is shown by `status`, and
/// later operations run their work at once (so that a failure reaches them as EIO).
#[test]
fn a_failing_piece_of_queued_journal_work_loses_only_itself() {
    let (_tmp, fast, backing) = folders();
    let bed = Bed::open_with(&fast, &backing, true, false);
    create(&bed, b"before");
    bed.fs.core.queue_rows(|tx| {
        crate::db::push_op(tx, crate::db::OpKind::Mkdir, 999, b"half", b"")?;
        Err(crate::error::FsError::Config("an injected failure".into()))
    });
    create(&bed, b"after");
    let rows = bed.fs.core.committed_rows_after(0, 100).expect("journal");
    let names: Vec<_> = rows
        .iter()
        .filter(|r| r.kind == crate::db::OpKind::Create || r.kind == crate::db::OpKind::Mkdir)
        .map(|r| String::from_utf8_lossy(&r.p1).into_owned())
        .collect();
    assert_eq!(names, vec!["before".to_string(), "after".to_string()]);
    let err = bed.fs.core.last_error().unwrap_or_default();
    assert!(err.contains("an injected failure"), "status shows {err:?}");
    // Queueing is off: the next create's rows are written at once.
    create(&bed, b"third");
    assert!(!bed.fs.core.has_rows_after(i64::MAX).expect("journal"));
    bed.crash();
    let bed = Bed::open_with(&fast, &backing, false, false);
    drop(bed);
}
