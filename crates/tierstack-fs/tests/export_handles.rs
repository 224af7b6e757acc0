//! What an NFS export of a mount needs from the file system (`tierstack export`), without
//! FUSE: LOOKUP of "." and ".." through `TierFs::answer` (how the kernel finds a node from a
//! file handle once its inode cache has forgotten it), and generations that are not 0 and,
//! with inode numbers, stay the same when the mount's stack is opened again over the same
//! fast tier (a daemon restart), while a removed node's number is never handed out again.
//!
//! Runs as any user; the end-to-end test through NFS-Ganesha is crates/tierstack-cli/tests/cli_export.rs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tierstack_array::{Array, ArrayOptions, CreateParams, Level};
use tierstack_fs::core::{Attr, Core};
use tierstack_fs::db::Db;
use tierstack_fs::fuse::TierFs;
use tierstack_fs::ops::{Caller, Op, Out};

const ROOT: u64 = 1;

/// The mount's stack over the fast tier in `fast` (made on first use) and BACKING `backing`.
fn stack(fast: &Path, backing: &Path) -> TierFs {
    let drives: Vec<PathBuf> = (0..4).map(|i| fast.join(format!("d{i}"))).collect();
    let opts = ArrayOptions::default();
    let array = if drives[0].exists() {
        Array::open(&drives, &opts).expect("open array")
    } else {
        let params = CreateParams {
            level: Level::Raid5,
            chunk: 64 << 10,
            groups: None,
            size: Some(96 << 20),
        };
        Array::create(&drives, &params, &opts).expect("array")
    };
    let array = Arc::new(array);
    let store = tierstack_store::StackSpec::new(8 << 20)
        .array(array.clone())
        .build()
        .expect("store");
    let db = Db::open(&fast.join("journal.db")).expect("journal");
    let core = Core::new(
        backing.to_path_buf(),
        true,
        store,
        array,
        db,
        64 << 20,
        None,
    );
    TierFs {
        core: Arc::new(core.expect("core")),
        direct_writes: false,
        refresh: Arc::new(tierstack_fs::refresh::Refresher::default()),
        ring: None,
        readdirplus: true,
        only_uid: None,
    }
}

fn ask(fs: &TierFs, op: Op<'_>) -> Result<Out, i32> {
    let (r, then) = fs.answer(op, Caller { uid: 0, gid: 0 });
    fs.after_reply(then);
    r
}

fn lookup(fs: &TierFs, parent: u64, name: &str) -> Result<Attr, i32> {
    match ask(
        fs,
        Op::Lookup {
            parent,
            name: name.as_bytes(),
        },
    )? {
        Out::Entry(a) => Ok(a),
        o => panic!("lookup of {name} answered {o:?}"),
    }
}

fn mkdir(fs: &TierFs, parent: u64, name: &str) -> Attr {
    match ask(
        fs,
        Op::Mkdir {
            parent,
            name: name.as_bytes(),
            mode: 0o755,
            umask: 0,
        },
    ) {
        Ok(Out::Entry(a)) => a,
        o => panic!("mkdir {name} answered {o:?}"),
    }
}

fn create(fs: &TierFs, parent: u64, name: &str) -> Attr {
    let a = match ask(
        fs,
        Op::Create {
            parent,
            name: name.as_bytes(),
            mode: 0o644,
            umask: 0,
            flags: libc::O_WRONLY,
        },
    ) {
        Ok(Out::Created(a, _, _)) => a,
        o => panic!("create {name} answered {o:?}"),
    };
    ask(fs, Op::Release { ino: a.ino, fh: 1 }).expect("release");
    a
}

#[test]
fn dot_and_dotdot_find_nodes_and_their_directories() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (fast, backing) = (tmp.path().join("fast"), tmp.path().join("backing"));
    std::fs::create_dir(&fast).expect("mkdir");
    std::fs::create_dir(&backing).expect("mkdir");
    // A file found in BACKING, and nodes made through the mount.
    std::fs::write(backing.join("old"), b"x").expect("write");
    let fs = stack(&fast, &backing);
    let old = lookup(&fs, ROOT, "old").expect("old");
    let d = mkdir(&fs, ROOT, "d");
    let f = create(&fs, d.ino, "f");
    for a in [&old, &d, &f] {
        assert_ne!(a.generation, 0, "node {} has generation 0", a.ino);
        assert_eq!(a.generation, old.generation, "one generation per fast tier");
    }
    // ".": the node itself, of any kind, with the same generation; "..": its directory.
    for a in [&old, &d, &f] {
        let same = lookup(&fs, a.ino, ".").expect(".");
        assert_eq!((same.ino, same.generation), (a.ino, a.generation));
        assert_eq!(same.kind, a.kind);
    }
    assert_eq!(lookup(&fs, f.ino, "..").expect("..").ino, d.ino);
    assert_eq!(lookup(&fs, d.ino, "..").expect("..").ino, ROOT);
    // The root: its own "." and "..", generation 0 as the kernel's root inode has.
    let root = lookup(&fs, ROOT, ".").expect("root");
    assert_eq!((root.ino, root.generation), (ROOT, 0));
    assert_eq!(lookup(&fs, ROOT, "..").expect("root's ..").ino, ROOT);
    // A node the mount does not know: a stale handle (ESTALE), never a negative entry.
    assert_eq!(lookup(&fs, 999_999, ".").err(), Some(libc::ESTALE));
    assert_eq!(lookup(&fs, 999_999, "..").err(), Some(libc::ESTALE));
}

#[test]
fn handles_outlive_a_restart_and_numbers_are_not_reused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (fast, backing) = (tmp.path().join("fast"), tmp.path().join("backing"));
    std::fs::create_dir(&fast).expect("mkdir");
    std::fs::create_dir(&backing).expect("mkdir");
    let (kept, gone) = {
        let fs = stack(&fast, &backing);
        let kept = create(&fs, ROOT, "kept");
        let gone = create(&fs, ROOT, "gone");
        assert!(gone.ino > kept.ino);
        ask(
            &fs,
            Op::Unlink {
                parent: ROOT,
                name: b"gone",
            },
        )
        .expect("unlink");
        fs.core.sync_all().expect("sync");
        (kept, gone)
    };
    // The same fast tier opened again (a daemon restart): the handle (inode, generation) of
    // `kept` finds it; the number of the removed `gone` (the highest ever handed out) is not
    // handed out again, so its handle stays stale.
    let fs = stack(&fast, &backing);
    let again = lookup(&fs, kept.ino, ".").expect("kept after the restart");
    assert_eq!((again.ino, again.generation), (kept.ino, kept.generation));
    assert_eq!(lookup(&fs, ROOT, "kept").expect("kept").ino, kept.ino);
    assert_eq!(lookup(&fs, gone.ino, ".").err(), Some(libc::ESTALE));
    let new = create(&fs, ROOT, "new");
    assert!(
        new.ino > gone.ino,
        "a new node got number {} after {} was removed",
        new.ino,
        gone.ino
    );
    assert_eq!(new.generation, kept.generation);
    // A new fast tier draws its own generation: handles of the old one do not name its nodes.
    let fast2 = tmp.path().join("fast2");
    std::fs::create_dir(&fast2).expect("mkdir");
    let other = stack(&fast2, &backing);
    let x = create(&other, ROOT, "x");
    assert_ne!(x.generation, 0);
    assert_ne!(x.generation, kept.generation);
}
