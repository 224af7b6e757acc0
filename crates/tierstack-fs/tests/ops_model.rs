//! The file system's operations against a model, without FUSE: the same stack a mount builds
//! (an array of file drives, the tiered store, the journal, `Core`, the drainer) answers
//! random operations through `TierFs::answer`, the entry point both transports use, and a
//! plain folder on the local file system gets the same operations through std::fs. After
//! every operation the errno (or success) must match; at the end the tree the mount shows
//! (lookup, readdir, getattr, read) must equal the folder, and, once the drain has run, so
//! must BACKING.
//!
//! Runs as any user and needs neither /dev/fuse nor root: the end-to-end tests through a real
//! mount are in crates/tierstack-cli/tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tierstack_array::{Array, ArrayOptions, CreateParams, Level};
use tierstack_fs::core::{Core, Kind};
use tierstack_fs::db::Db;
use tierstack_fs::drain::Drainer;
use tierstack_fs::fuse::TierFs;
use tierstack_fs::ops::{Caller, Op, Out};

const ROOT: u64 = 1;
const NAMES: [&str; 4] = ["a", "b", "c", "d"];
const DIRS: [&str; 2] = ["", "x"];

/// A mount's stack, built as `mount` builds it, minus the kernel.
struct Bed {
    _tmp: tempfile::TempDir,
    backing: PathBuf,
    model: PathBuf,
    fs: TierFs,
    drainer: Arc<Drainer>,
}

impl Bed {
    fn new() -> Bed {
        let tmp = tempfile::tempdir().expect("tmp");
        let backing = tmp.path().join("backing");
        let model = tmp.path().join("model");
        let fast = tmp.path().join("fast");
        for d in [&backing, &model, &fast] {
            std::fs::create_dir(d).expect("mkdir");
        }
        let drives: Vec<PathBuf> = (0..4).map(|i| fast.join(format!("d{i}"))).collect();
        let params = CreateParams {
            level: Level::Raid5,
            chunk: 64 << 10,
            groups: None,
            size: Some(96 << 20),
        };
        let array =
            Arc::new(Array::create(&drives, &params, &ArrayOptions::default()).expect("array"));
        let store = tierstack_store::StackSpec::new(8 << 20)
            .array(array.clone())
            .build()
            .expect("store");
        let db = Db::open(&fast.join("journal.db")).expect("journal");
        let core = Arc::new(
            Core::new(backing.clone(), true, store, array, db, 64 << 20, None).expect("core"),
        );
        let drainer = Drainer::new(core.clone(), 2, None);
        drainer.start().expect("drainer");
        let fs = TierFs {
            core,
            direct_writes: false,
            refresh: Arc::new(tierstack_fs::refresh::Refresher::default()),
            ring: None,
            readdirplus: true,
            only_uid: None,
        };
        Bed {
            _tmp: tmp,
            backing,
            model,
            fs,
            drainer,
        }
    }

    fn ask(&self, op: Op<'_>) -> Result<Out, i32> {
        let (r, then) = self.fs.answer(op, Caller { uid: 0, gid: 0 });
        self.fs.after_reply(then);
        r
    }

    /// The inode at `path` ("" is the root), or the errno of the first step that fails.
    fn resolve(&self, path: &str) -> Result<u64, i32> {
        let mut ino = ROOT;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if let Out::Attr(a) = self.ask(Op::Getattr { ino })? {
                if a.kind != Kind::Dir {
                    return Err(libc::ENOTDIR);
                }
            }
            ino = match self.ask(Op::Lookup {
                parent: ino,
                name: part.as_bytes(),
            })? {
                Out::Entry(a) => a.ino,
                Out::Negative(_) => return Err(libc::ENOENT),
                o => panic!("lookup answered {o:?}"),
            };
        }
        Ok(ino)
    }

    /// The directory a path names its last component in, as the kernel's path walk finds it
    /// (ENOTDIR through a file), and that component.
    fn parent_and_name<'p>(&self, path: &'p str) -> Result<(u64, &'p str), i32> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let ino = self.resolve(dir)?;
        match self.ask(Op::Getattr { ino })? {
            Out::Attr(a) if a.kind == Kind::Dir => Ok((ino, name)),
            Out::Attr(_) => Err(libc::ENOTDIR),
            o => panic!("getattr answered {o:?}"),
        }
    }
}

#[derive(Debug, Clone)]
enum FsOp {
    /// Write `len` bytes of `seed` at `off` into the file at the path (created if missing).
    Write {
        path: String,
        off: u64,
        len: usize,
        seed: u8,
    },
    Truncate {
        path: String,
        size: u64,
    },
    Rename {
        from: String,
        to: String,
    },
    Unlink {
        path: String,
    },
    Mkdir {
        path: String,
    },
    Rmdir {
        path: String,
    },
}

fn path() -> impl Strategy<Value = String> {
    (0..DIRS.len(), 0..NAMES.len()).prop_map(|(d, n)| {
        if DIRS[d].is_empty() {
            NAMES[n].to_string()
        } else {
            format!("{}/{}", DIRS[d], NAMES[n])
        }
    })
}

fn dir_path() -> impl Strategy<Value = String> {
    prop_oneof![Just("x".to_string()), path()]
}

fn fs_op() -> impl Strategy<Value = FsOp> {
    prop_oneof![
        4 => (path(), 0u64..3 << 20, 1usize..300_000, any::<u8>())
            .prop_map(|(path, off, len, seed)| FsOp::Write { path, off, len, seed }),
        1 => (path(), 0u64..2 << 20).prop_map(|(path, size)| FsOp::Truncate { path, size }),
        2 => (dir_path(), dir_path()).prop_map(|(from, to)| FsOp::Rename { from, to }),
        1 => path().prop_map(|path| FsOp::Unlink { path }),
        1 => dir_path().prop_map(|path| FsOp::Mkdir { path }),
        1 => dir_path().prop_map(|path| FsOp::Rmdir { path }),
    ]
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// The operation on the plain folder.
fn on_model(root: &Path, op: &FsOp) -> Result<(), i32> {
    use std::io::{Seek, SeekFrom, Write};
    match op {
        FsOp::Write {
            path,
            off,
            len,
            seed,
        } => {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(root.join(path))
                .map_err(errno)?;
            f.seek(SeekFrom::Start(*off)).map_err(errno)?;
            f.write_all(&data(*len, *seed)).map_err(errno)
        }
        FsOp::Truncate { path, size } => std::fs::OpenOptions::new()
            .write(true)
            .open(root.join(path))
            .and_then(|f| f.set_len(*size))
            .map_err(errno),
        FsOp::Rename { from, to } => std::fs::rename(root.join(from), root.join(to)).map_err(errno),
        FsOp::Unlink { path } => std::fs::remove_file(root.join(path)).map_err(errno),
        FsOp::Mkdir { path } => std::fs::create_dir(root.join(path)).map_err(errno),
        FsOp::Rmdir { path } => std::fs::remove_dir(root.join(path)).map_err(errno),
    }
}

/// The operation through the file system's answers, as the kernel would ask it.
fn on_mount(bed: &Bed, op: &FsOp) -> Result<(), i32> {
    match op {
        FsOp::Write {
            path,
            off,
            len,
            seed,
        } => {
            let (parent, name) = bed.parent_and_name(path)?;
            let (ino, fh) = match bed.resolve(path) {
                Ok(ino) => match bed.ask(Op::Open {
                    ino,
                    flags: libc::O_WRONLY,
                })? {
                    Out::Open(fh, _) => (ino, fh),
                    o => panic!("open answered {o:?}"),
                },
                Err(libc::ENOENT) => match bed.ask(Op::Create {
                    parent,
                    name: name.as_bytes(),
                    mode: libc::S_IFREG | 0o644,
                    umask: 0,
                    flags: libc::O_WRONLY | libc::O_CREAT,
                })? {
                    Out::Created(a, fh, _) => (a.ino, fh),
                    o => panic!("create answered {o:?}"),
                },
                Err(e) => return Err(e),
            };
            let bytes = data(*len, *seed);
            let r = bed.ask(Op::Write {
                ino,
                fh,
                offset: *off,
                data: &bytes,
                kill_suidgid: false,
            });
            bed.ask(Op::Release { ino, fh })?;
            match r? {
                Out::Written(n) if n as usize == bytes.len() => Ok(()),
                o => panic!("write answered {o:?}"),
            }
        }
        FsOp::Truncate { path, size } => {
            let ino = bed.resolve(path)?;
            bed.ask(Op::Setattr {
                ino,
                mode: None,
                uid: None,
                gid: None,
                size: Some(*size),
                atime: None,
                mtime: None,
                fh: None,
            })
            .map(drop)
        }
        FsOp::Rename { from, to } => {
            let (parent, name) = bed.parent_and_name(from)?;
            let (newparent, newname) = bed.parent_and_name(to)?;
            // What the kernel's VFS answers itself, before it asks the file system
            // (`do_renameat2`): the source must exist, may not be an ancestor of the target
            // (EINVAL), nor the target an ancestor of the source (ENOTEMPTY); renaming a
            // name onto itself does nothing.
            let src = bed.resolve(from)?;
            let under = |a: &str, b: &str| b.starts_with(a) && b[a.len()..].starts_with('/');
            if under(from, to) {
                return Err(libc::EINVAL);
            }
            if under(to, from) {
                return Err(libc::ENOTEMPTY);
            }
            if bed.resolve(to) == Ok(src) {
                return Ok(());
            }
            bed.ask(Op::Rename {
                parent,
                name: name.as_bytes(),
                newparent,
                newname: newname.as_bytes(),
                flags: 0,
            })
            .map(drop)
        }
        FsOp::Unlink { path } => {
            let (parent, name) = bed.parent_and_name(path)?;
            bed.ask(Op::Unlink {
                parent,
                name: name.as_bytes(),
            })
            .map(drop)
        }
        FsOp::Mkdir { path } => {
            let (parent, name) = bed.parent_and_name(path)?;
            bed.ask(Op::Mkdir {
                parent,
                name: name.as_bytes(),
                mode: 0o755,
                umask: 0,
            })
            .map(drop)
        }
        FsOp::Rmdir { path } => {
            let (parent, name) = bed.parent_and_name(path)?;
            bed.ask(Op::Rmdir {
                parent,
                name: name.as_bytes(),
            })
            .map(drop)
        }
    }
}

/// A tree as path → contents (None: a directory).
type Tree = BTreeMap<String, Option<Vec<u8>>>;

fn folder_tree(root: &Path) -> Tree {
    fn walk(root: &Path, rel: &str, out: &mut Tree) {
        let mut names: Vec<_> = std::fs::read_dir(root.join(rel))
            .expect("readdir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with(".tierstack"))
            .collect();
        names.sort();
        for n in names {
            let p = if rel.is_empty() {
                n
            } else {
                format!("{rel}/{n}")
            };
            let full = root.join(&p);
            if full.is_dir() {
                out.insert(p.clone(), None);
                walk(root, &p, out);
            } else {
                out.insert(p, Some(std::fs::read(full).expect("read")));
            }
        }
    }
    let mut t = Tree::new();
    walk(root, "", &mut t);
    t
}

fn mount_tree(bed: &Bed) -> Tree {
    fn walk(bed: &Bed, ino: u64, rel: &str, out: &mut Tree) {
        let ents = match bed.ask(Op::Readdir {
            ino,
            offset: 0,
            size: u32::MAX,
        }) {
            Ok(Out::Dir(v)) => v,
            o => panic!("readdir of {rel:?} answered {o:?}"),
        };
        for (child, _, kind, name) in ents {
            let n = String::from_utf8_lossy(&name).into_owned();
            if n == "." || n == ".." {
                continue;
            }
            let p = if rel.is_empty() {
                n
            } else {
                format!("{rel}/{n}")
            };
            if kind == Kind::Dir {
                out.insert(p.clone(), None);
                walk(bed, child, &p, out);
                continue;
            }
            let size = match bed.ask(Op::Getattr { ino: child }) {
                Ok(Out::Attr(a)) => a.size,
                o => panic!("getattr of {p:?} answered {o:?}"),
            };
            let mut buf = Vec::new();
            while (buf.len() as u64) < size {
                match bed.ask(Op::Read {
                    ino: child,
                    offset: buf.len() as u64,
                    size: 1 << 20,
                }) {
                    Ok(Out::Data(d)) if !d.is_empty() => buf.extend_from_slice(&d),
                    o => panic!("read of {p:?} at {} answered {o:?}", buf.len()),
                }
            }
            out.insert(p, Some(buf));
        }
    }
    let mut t = Tree::new();
    walk(bed, ROOT, "", &mut t);
    t
}

fn same(what: &str, got: &Tree, want: &Tree) -> Result<(), TestCaseError> {
    let names = |t: &Tree| t.keys().cloned().collect::<Vec<_>>();
    prop_assert_eq!(names(got), names(want), "{}: names", what);
    for (p, w) in want {
        let g = &got[p];
        prop_assert!(
            g == w,
            "{}: {} differs ({:?} vs {:?} bytes)",
            what,
            p,
            g.as_ref().map(Vec::len),
            w.as_ref().map(Vec::len)
        );
    }
    Ok(())
}

/// Asks the drainer to drain everything now and waits (bounded) until it has.
fn drain(bed: &Bed) {
    let t0 = Instant::now();
    loop {
        bed.fs.core.request_drain(false);
        if bed.drainer.idle() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the drain did not finish in 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

proptest! {
    // TIERSTACK_OPS_CASES sets the number of sequences for a long run (16 by default).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("TIERSTACK_OPS_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(16),
        max_shrink_iters: 100,
        ..ProptestConfig::default()
    })]

    #[test]
    fn operations_match_a_plain_folder_and_drain_to_it(ops in proptest::collection::vec(fs_op(), 1..40)) {
        let bed = Bed::new();
        std::fs::create_dir(bed.model.join("x")).expect("mkdir");
        let mkdir = FsOp::Mkdir { path: "x".into() };
        prop_assert_eq!(on_mount(&bed, &mkdir), Ok(()));
        for (i, op) in ops.iter().enumerate() {
            let want = on_model(&bed.model, op);
            let got = on_mount(&bed, op);
            prop_assert_eq!(got, want, "operation {} {:?}", i, op);
            // `status`'s one-walk counts agree with the two walks they replace (the drainer
            // may hold a file meanwhile: then it counts as dirty in all three).
            let core = &bed.fs.core;
            let (files, unsettled) = core.dirty_and_unsettled();
            let again = (core.dirty_summary().0, core.unsettled_dirty_files());
            prop_assert!(
                (files, unsettled) == again || files >= again.0,
                "operation {}: one walk {:?}, two walks {:?}", i, (files, unsettled), again
            );
            // The drain's index of paths in BACKING lacks none a node has.
            let misses = core.path_index_misses();
            prop_assert!(misses.is_empty(), "operation {}: the index of paths lacks {:?}", i, misses);
        }
        let want = folder_tree(&bed.model);
        same("the mount", &mount_tree(&bed), &want)?;
        drain(&bed);
        let misses = bed.fs.core.path_index_misses();
        prop_assert!(misses.is_empty(), "after the drain, the index of paths lacks {:?}", misses);
        same("BACKING after the drain", &folder_tree(&bed.backing), &want)?;
        // What the mount shows is unchanged by the drain (pages now also read from BACKING).
        same("the mount after the drain", &mount_tree(&bed), &want)?;
    }
}
