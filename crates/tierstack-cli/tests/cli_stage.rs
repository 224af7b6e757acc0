//! `tierstack stage in|out` through the real binary.

mod common;
use common::{is_root, s, same_content, ts, BIN};

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rand::{Rng, SeedableRng};

/// What a tree holds: relative path -> ("f", bytes, mode) / ("d", [], mode) / ("l", target, 0).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, (char, Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, (char, Vec<u8>, u32)>) {
        for e in fs::read_dir(dir).expect("read_dir") {
            let e = e.expect("entry");
            let p = e.path();
            let rel = p.strip_prefix(root).expect("prefix").to_path_buf();
            let m = fs::symlink_metadata(&p).expect("meta");
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                let t = fs::read_link(&p).expect("link");
                out.insert(rel, ('l', t.into_os_string().into_encoded_bytes(), 0));
            } else if m.is_dir() {
                out.insert(rel, ('d', Vec::new(), mode));
                walk(root, &p, out);
            } else {
                out.insert(rel, ('f', fs::read(&p).expect("read"), mode));
            }
        }
    }
    walk(root, root, &mut out);
    out
}

fn one_line_error(o: &Output) -> String {
    assert!(!o.status.success(), "expected a failure");
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(err.trim().lines().count(), 1, "not one line: {err:?}");
    assert!(err.starts_with("tierstack: error: "), "{err}");
    err
}

/// A tree with files of many sizes (empty, < 1 MiB, several MiB, not a multiple of 1 MiB),
/// nested directories, an unusual mode and a relative symlink.
fn make_tree(root: &Path) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let sizes = [0usize, 1, 4095, 65536, (1 << 20) + 17, 3 << 20, 123_457];
    for (i, sz) in sizes.iter().enumerate() {
        let d = root.join(format!("d{}/sub{}", i % 3, i % 2));
        fs::create_dir_all(&d).expect("mkdir");
        let mut v = vec![0u8; *sz];
        rng.fill(&mut v[..]);
        fs::write(d.join(format!("f{i}.bin")), v).expect("write");
    }
    for i in 0..20 {
        fs::write(root.join(format!("small{i:02}.txt")), format!("file {i}\n")).expect("write");
    }
    fs::create_dir_all(root.join("empty/dir")).expect("mkdir");
    fs::set_permissions(root.join("small00.txt"), fs::Permissions::from_mode(0o640))
        .expect("chmod");
    std::os::unix::fs::symlink("d0/sub0/f0.bin", root.join("link")).expect("symlink");
}

fn assert_no_temp_names(root: &Path) {
    for (p, _) in snapshot(root) {
        assert!(
            !p.to_string_lossy().contains("tierstack-stage"),
            "temporary file left: {}",
            p.display()
        );
    }
}

#[test]
fn stage_in_and_out_of_trees_is_byte_exact() {
    let t = tempfile::tempdir().expect("tmp");
    let src = t.path().join("pfs/inputs");
    make_tree(&src);
    let cache = t.path().join("mnt/inputs");
    let o = ts(&[
        "stage",
        "in",
        s(&src),
        s(&cache),
        "--jobs",
        "4",
        "--verify",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let want = snapshot(&src);
    let files = want.values().filter(|v| v.0 == 'f').count() as u64;
    let bytes: u64 = want
        .values()
        .filter(|v| v.0 == 'f')
        .map(|v| v.1.len() as u64)
        .sum();
    assert_eq!(j["files"], files, "{j}");
    assert_eq!(j["bytes"], bytes, "{j}");
    assert_eq!(j["verified"], files, "{j}");
    assert_eq!(j["symlinks"], 1, "{j}");
    // `in` reads every copy back once (the verification does it here).
    assert_eq!(j["read_back_bytes"], bytes, "{j}");
    assert_eq!(snapshot(&cache), want);
    assert_no_temp_names(&cache);

    // And back out, into a destination that already holds an older version of one file.
    let out = t.path().join("pfs/results");
    fs::create_dir_all(out.join("d0/sub0")).expect("mkdir");
    fs::write(out.join("d0/sub0/f0.bin"), b"stale").expect("write");
    let o = ts(&[
        "stage",
        "out",
        s(&cache),
        s(&out),
        "--jobs",
        "4",
        "--verify",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(j["verified"], files, "{j}");
    assert_eq!(snapshot(&out), want);
    assert_no_temp_names(&out);
    // Modification times follow the source.
    let a = fs::metadata(src.join("d1/sub1/f1.bin"))
        .and_then(|m| m.modified())
        .expect("mtime");
    let b = fs::metadata(out.join("d1/sub1/f1.bin"))
        .and_then(|m| m.modified())
        .expect("mtime");
    assert_eq!(a, b);

    // A single file into an existing directory, without a manifest; plain text output.
    let o = ts(&["stage", "out", s(&src.join("small05.txt")), s(&out)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("staged out 1 files"));
    assert_eq!(
        fs::read(out.join("small05.txt")).expect("read"),
        b"file 5\n"
    );
}

#[test]
fn manifest_copies_exactly_its_lines() {
    let t = tempfile::tempdir().expect("tmp");
    let src = t.path().join("src");
    make_tree(&src);
    fs::write(src.join("with space.dat"), b"spaced").expect("write");
    let dst = t.path().join("dst");
    fs::create_dir_all(dst.join("existing")).expect("mkdir");
    let manifest = t.path().join("stage.manifest");
    fs::write(
        &manifest,
        "# inputs of job 42\n\
         \n\
         d1/sub1/f1.bin   input/a.bin      # renamed on the way\n\
         \"with space.dat\" \"out dir/x.dat\"\n\
         d2                tree2\n\
         small03.txt       existing/\n\
         small04.txt\n",
    )
    .expect("manifest");
    let o = ts(&[
        "stage",
        "in",
        s(&src),
        s(&dst),
        "--manifest",
        s(&manifest),
        "--jobs",
        "4",
        "--verify",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = snapshot(&dst);
    let files: Vec<String> = got
        .iter()
        .filter(|(_, v)| v.0 == 'f')
        .map(|(p, _)| p.to_string_lossy().into_owned())
        .collect();
    let mut want_files = vec![
        "input/a.bin".to_string(),
        "out dir/x.dat".to_string(),
        "existing/small03.txt".to_string(),
        "small04.txt".to_string(),
    ];
    let src_snap = snapshot(&src);
    for (p, v) in &src_snap {
        if v.0 == 'f' {
            if let Ok(r) = p.strip_prefix("d2") {
                want_files.push(format!("tree2/{}", r.display()));
            }
        }
    }
    want_files.sort();
    assert_eq!(files, want_files);
    assert_eq!(
        got[Path::new("input/a.bin")].1,
        src_snap[Path::new("d1/sub1/f1.bin")].1
    );
    assert_eq!(got[Path::new("out dir/x.dat")].1, b"spaced");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(j["verified"].as_u64(), Some(want_files.len() as u64), "{j}");
}

/// Each bad manifest is refused with one line naming the line, and nothing is copied, even
/// though its first line is good.
#[test]
fn manifest_escaping_its_root_is_refused_with_nothing_copied() {
    let t = tempfile::tempdir().expect("tmp");
    let src = t.path().join("src");
    make_tree(&src);
    fs::write(t.path().join("secret"), b"outside the root").expect("write");
    // A link inside the source root leading out of it, and one in the destination root.
    std::os::unix::fs::symlink(t.path(), src.join("up")).expect("symlink");
    std::os::unix::fs::symlink("../../secret", src.join("d0/secret")).expect("symlink");
    let dst = t.path().join("dst");
    fs::create_dir_all(&dst).expect("mkdir");
    let elsewhere = t.path().join("elsewhere");
    fs::create_dir_all(&elsewhere).expect("mkdir");
    std::os::unix::fs::symlink(&elsewhere, dst.join("out")).expect("symlink");
    let cases: &[(&str, &str)] = &[
        ("small01.txt a\n../secret b\n", "escapes the source root"),
        (
            "small01.txt a\nd0/../../secret b\n",
            "escapes the source root",
        ),
        (
            "small01.txt a\nsmall02.txt ../b\n",
            "escapes the destination root",
        ),
        ("small01.txt a\n/etc/passwd b\n", "is absolute"),
        ("small01.txt a\nsmall02.txt /tmp/b\n", "is absolute"),
        ("small01.txt a\nup/secret b\n", "symbolic link"),
        ("small01.txt a\nd0/secret b\n", "symbolic link"),
        ("small01.txt a\nsmall02.txt out/b\n", "symbolic link"),
        ("small01.txt a\nsmall02.txt a\n", "written twice"),
        ("small01.txt a\nnot-there b\n", "does not exist"),
        ("small01.txt a b\n", "3 fields"),
    ];
    for (text, why) in cases {
        let manifest = t.path().join("m");
        fs::write(&manifest, text).expect("manifest");
        let o = ts(&["stage", "out", s(&src), s(&dst), "--manifest", s(&manifest)]);
        let err = one_line_error(&o);
        assert!(err.contains(why), "{text:?}: {err}");
        assert!(
            err.contains("manifest line") || err.contains("destination"),
            "{text:?}: {err}"
        );
        // Nothing copied: dst holds only the link it had, and nothing went through it.
        let names: Vec<_> = fs::read_dir(&dst)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out")], "{text:?}");
        assert_eq!(
            fs::read_dir(&elsewhere).expect("read_dir").count(),
            0,
            "{text:?}"
        );
    }
    // The line number and how many other lines were refused.
    let manifest = t.path().join("m");
    fs::write(&manifest, "# c\nsmall01.txt a\n../x y\n/abs z\n").expect("manifest");
    let err = one_line_error(&ts(&[
        "stage",
        "in",
        s(&src),
        s(&dst),
        "--manifest",
        s(&manifest),
    ]));
    assert!(
        err.contains("manifest line 3") && err.contains("1 more line"),
        "{err}"
    );
}

#[test]
fn bad_input_gets_one_line_and_copies_nothing() {
    let t = tempfile::tempdir().expect("tmp");
    let src = t.path().join("src");
    make_tree(&src);
    let dst = t.path().join("dst");
    let file = t.path().join("plain");
    fs::write(&file, b"x").expect("write");
    let inner = src.join("d0/inner");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["stage", "in", s(&src), s(&dst), "--jobs", "0"],
            "--jobs",
        ),
        (
            vec!["stage", "in", s(&src), s(&dst), "--jobs", "many"],
            "many",
        ),
        (vec!["stage", "sideways", s(&src), s(&dst)], "sideways"),
        (vec!["stage", "in", s(&src)], "required"),
        (
            vec!["stage", "in", "/no/such/src", s(&dst)],
            "does not exist",
        ),
        (vec!["stage", "in", s(&src), s(&file)], "not a directory"),
        (vec!["stage", "in", s(&src), s(&inner)], "inside"),
        (
            vec![
                "stage",
                "in",
                s(&src),
                s(&dst),
                "--manifest",
                "/no/manifest",
            ],
            "cannot read the manifest",
        ),
        (
            vec!["stage", "in", s(&file), s(&dst), "--manifest", s(&file)],
            "must be a directory",
        ),
        (vec!["stage", "in", s(&src), s(&dst), "--bogus"], "--bogus"),
    ];
    for (args, why) in cases {
        let err = one_line_error(&ts(&args));
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(!dst.exists(), "{args:?} created {}", dst.display());
        assert!(!inner.exists());
        assert_eq!(fs::read(&file).expect("read"), b"x");
    }
}

/// `stage in` into a real tierstack mount: the copy reads back exactly through the mount, and
/// after `umount` BACKING holds the same tree; `stage out` from the mount works too.
#[test]
fn stage_in_into_a_mount_and_out_of_it() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse");
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let src = t.path().join("pfs/inputs");
    make_tree(&src);
    let backing = t.path().join("backing");
    let mnt = t.path().join("mnt");
    let fast = t.path().join("fast");
    for d in [&backing, &mnt, &fast] {
        fs::create_dir_all(d).expect("mkdir");
    }
    let o = common::mount_small(&backing, &mnt, &fast);
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("not built yet"), "mount failed: {err}");
        eprintln!("skipped: tierstack mount is not built yet");
        return;
    }
    let inputs = mnt.join("inputs");
    let o = ts(&[
        "stage",
        "in",
        s(&src),
        s(&inputs),
        "--jobs",
        "4",
        "--verify",
        "--json",
    ]);
    let staged = o.status.success();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    let through_mount = staged.then(|| snapshot(&inputs));
    let out = t.path().join("out");
    let o2 = ts(&["stage", "out", s(&inputs), s(&out), "--verify"]);
    let um = ts(&["umount", s(&mnt)]);
    assert!(staged, "stage in failed: {err}");
    assert!(
        o2.status.success(),
        "{}",
        String::from_utf8_lossy(&o2.stderr)
    );
    assert!(
        um.status.success(),
        "{}",
        String::from_utf8_lossy(&um.stderr)
    );
    let want = snapshot(&src);
    assert_eq!(through_mount, Some(want.clone()));
    assert_eq!(snapshot(&out), want);
    assert_eq!(snapshot(&backing.join("inputs")), want);
    assert_no_temp_names(&backing);
}

fn run_ok(args: &[&str]) -> Output {
    let o = ts(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn json_of(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).expect("json")
}

/// A 256 MiB file with three small data regions stays sparse in and out, and verifies.
#[test]
fn sparse_files_keep_their_holes() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let t = tempfile::tempdir().expect("tmp");
    let src = t.path().join("src");
    fs::create_dir_all(&src).expect("mkdir");
    let size: u64 = 256 << 20;
    let f = fs::File::create(src.join("sparse.bin")).expect("create");
    f.set_len(size).expect("set_len");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for off in [0u64, 100 << 20, size - 5000] {
        let mut v = vec![0u8; 5000];
        rng.fill(&mut v[..]);
        f.write_all_at(&v, off).expect("write");
    }
    f.sync_all().expect("fsync");
    drop(f);
    // A file of zeros that are data (not holes) is copied as data.
    fs::write(src.join("zeros.bin"), vec![0u8; 1 << 20]).expect("write");
    let src_meta = fs::metadata(src.join("sparse.bin")).expect("meta");
    assert!(
        src_meta.blocks() < 1024,
        "the test file system does not keep holes ({} blocks)",
        src_meta.blocks()
    );

    let cache = t.path().join("cache");
    let j = json_of(&run_ok(&[
        "stage",
        "in",
        s(&src),
        s(&cache),
        "--verify",
        "--json",
    ]));
    assert_eq!(j["files"], 2, "{j}");
    assert_eq!(j["verified"], 2, "{j}");
    assert_eq!(j["bytes"], size + (1 << 20), "{j}");
    // Data regions are whole blocks of the file system: 3 x 5000 bytes span a few of them.
    let holes = j["sparse_bytes"].as_u64().expect("sparse_bytes");
    assert!(
        holes <= size - 3 * 5000 && holes >= size - 3 * (64 << 10),
        "{j}"
    );
    assert_eq!(j["skipped"], serde_json::json!([]), "{j}");
    let got = fs::metadata(cache.join("sparse.bin")).expect("meta");
    assert_eq!(got.len(), size);
    assert!(
        got.blocks() <= src_meta.blocks() + 64,
        "destination has {} blocks, source {}",
        got.blocks(),
        src_meta.blocks()
    );
    assert!(same_content(
        &src.join("sparse.bin"),
        &cache.join("sparse.bin")
    ));
    assert!(same_content(
        &src.join("zeros.bin"),
        &cache.join("zeros.bin")
    ));
    assert_eq!(
        fs::metadata(cache.join("zeros.bin")).expect("meta").len(),
        1 << 20
    );

    // And back out (plain text), still sparse.
    let out = t.path().join("out");
    let o = run_ok(&["stage", "out", s(&cache), s(&out), "--verify"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("of it holes"), "{text}");
    assert!(text.contains("2 checksums verified"), "{text}");
    let back = fs::metadata(out.join("sparse.bin")).expect("meta");
    assert_eq!(back.len(), size);
    assert!(back.blocks() <= src_meta.blocks() + 64, "{}", back.blocks());
    assert!(same_content(
        &src.join("sparse.bin"),
        &out.join("sparse.bin")
    ));
    assert_no_temp_names(&out);
}

/// Names of one inode within a stage stay one inode; a name whose other links are outside the
/// stage is a plain copy.
#[test]
fn hard_linked_files_stay_linked() {
    use std::os::unix::fs::MetadataExt;
    let t = tempfile::tempdir().expect("tmp");
    let src = t.path().join("src");
    fs::create_dir_all(src.join("sub")).expect("mkdir");
    fs::write(src.join("a"), b"linked data").expect("write");
    fs::hard_link(src.join("a"), src.join("sub/b")).expect("link");
    fs::write(src.join("x"), vec![9u8; 3 << 20]).expect("write");
    fs::hard_link(src.join("x"), src.join("y")).expect("link");
    fs::hard_link(src.join("x"), src.join("sub/z")).expect("link");
    fs::write(t.path().join("outside"), b"half in").expect("write");
    fs::hard_link(t.path().join("outside"), src.join("lone")).expect("link");
    fs::write(src.join("plain"), b"plain").expect("write");

    let dst = t.path().join("dst");
    let j = json_of(&run_ok(&[
        "stage",
        "in",
        s(&src),
        s(&dst),
        "--jobs",
        "4",
        "--verify",
        "--json",
    ]));
    // a, x, lone, plain copied; sub/b, y, sub/z linked.
    assert_eq!(j["files"], 4, "{j}");
    assert_eq!(j["hardlinks"], 3, "{j}");
    assert_eq!(j["verified"], 4, "{j}");
    assert_eq!(j["hardlinks_copied"], serde_json::json!([]), "{j}");
    let m = |p: &str| fs::symlink_metadata(dst.join(p)).expect("meta");
    assert_eq!(m("a").ino(), m("sub/b").ino());
    assert_eq!(m("a").nlink(), 2);
    assert_eq!(m("x").ino(), m("y").ino());
    assert_eq!(m("x").ino(), m("sub/z").ino());
    assert_eq!(m("x").nlink(), 3);
    assert_ne!(m("a").ino(), m("x").ino());
    assert_eq!(m("lone").nlink(), 1);
    assert_eq!(m("plain").nlink(), 1);
    assert_eq!(fs::read(dst.join("sub/b")).expect("read"), b"linked data");
    assert_eq!(fs::read(dst.join("lone")).expect("read"), b"half in");
    assert!(same_content(&src.join("x"), &dst.join("sub/z")));
    assert_no_temp_names(&dst);

    // Again over the existing copy: still linked (the links are replaced, not appended to).
    let j = json_of(&run_ok(&["stage", "out", s(&src), s(&dst), "--json"]));
    assert_eq!(j["hardlinks"], 3, "{j}");
    assert_eq!(m("a").ino(), m("sub/b").ino());
    assert_eq!(m("a").nlink(), 2);
    assert_eq!(m("x").nlink(), 3);

    // Through a manifest: two lines naming one inode give one inode.
    let manifest = t.path().join("m");
    fs::write(&manifest, "a first\nsub/b second\n").expect("manifest");
    let dst2 = t.path().join("dst2");
    let j = json_of(&run_ok(&[
        "stage",
        "in",
        s(&src),
        s(&dst2),
        "--manifest",
        s(&manifest),
        "--json",
    ]));
    assert_eq!(
        (j["files"].as_u64(), j["hardlinks"].as_u64()),
        (Some(1), Some(1)),
        "{j}"
    );
    let a = fs::metadata(dst2.join("first")).expect("meta");
    let b = fs::metadata(dst2.join("second")).expect("meta");
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));

    // A destination that refuses the link (here: another file system mounted on dst3/sub, so
    // link() gets EXDEV): the name is copied instead, and reported.
    if !is_root() {
        eprintln!("refused-link part skipped: not root");
        return;
    }
    let dst3 = t.path().join("dst3");
    fs::create_dir_all(dst3.join("sub")).expect("mkdir");
    let mounted = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=64m",
            "tmpfs",
            s(&dst3.join("sub")),
        ])
        .status()
        .is_ok_and(|st| st.success());
    if !mounted {
        eprintln!("refused-link part skipped: cannot mount a tmpfs");
        return;
    }
    struct Umount(PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _umount = Umount(dst3.join("sub"));
    let o = run_ok(&["stage", "out", s(&src), s(&dst3), "--verify"]);
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let j = json_of(&run_ok(&[
        "stage",
        "out",
        s(&src),
        s(&dst3),
        "--verify",
        "--json",
    ]));
    // sub/ is another file system. Its names come first in the walk for x (sub/z): x is
    // copied, and y linked to that copy; sub/b (a's other name) is copied.
    assert_eq!(j["hardlinks"], 1, "{j}");
    assert_eq!(j["files"], 6, "{j}");
    assert_eq!(j["verified"], 6, "{j}");
    let copied: Vec<&str> = j["hardlinks_copied"]
        .as_array()
        .expect("array")
        .iter()
        .map(|x| x["path"].as_str().expect("path"))
        .collect();
    let (b3, x3) = (dst3.join("sub/b"), dst3.join("x"));
    assert_eq!(copied, vec![s(&b3), s(&x3)], "{j}");
    assert!(text.contains(", 2 hard links copied as files"), "{text}");
    assert!(
        text.contains(&format!("copied, not linked: {}: ", b3.display())),
        "{text}"
    );
    assert_eq!(fs::read(&b3).expect("read"), b"linked data");
    assert!(same_content(&src.join("x"), &dst3.join("sub/z")));
    assert!(same_content(&src.join("x"), &x3));
    let (x, y) = (
        fs::metadata(&x3).expect("meta"),
        fs::metadata(dst3.join("y")).expect("meta"),
    );
    assert_eq!((x.ino(), x.nlink()), (y.ino(), 2));
    assert_no_temp_names(&dst3);
}

fn mknod(p: &Path, ft: rustix::fs::FileType, mode: u32, dev: u64) -> std::io::Result<()> {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        ft,
        rustix::fs::Mode::from_raw_mode(mode),
        dev,
    )?;
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
}

/// FIFOs and sockets (and, as root, device nodes) are recreated, never opened; a device node
/// staged by someone other than root is skipped and reported, and the stage goes on.
#[test]
fn special_files_are_recreated_or_skipped() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let t = tempfile::tempdir().expect("tmp");
    let src = t.path().join("src");
    fs::create_dir_all(src.join("run")).expect("mkdir");
    fs::write(src.join("data.txt"), b"data").expect("write");
    mknod(&src.join("run/pipe"), rustix::fs::FileType::Fifo, 0o640, 0).expect("mkfifo");
    // A fixed modification time on the FIFO, set without opening it.
    let mtime = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: 1_600_000_000,
            tv_nsec: 0,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: 1_500_000_000,
            tv_nsec: 123_456_789,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        src.join("run/pipe"),
        &mtime,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .expect("utimensat");
    let listener =
        std::os::unix::net::UnixListener::bind(src.join("run/sock")).expect("bind socket");
    drop(listener);
    fs::set_permissions(src.join("run/sock"), fs::Permissions::from_mode(0o751)).expect("chmod");
    // A character device (1:3, like /dev/null) where we may create one.
    let chardev = is_root()
        && mknod(
            &src.join("run/null"),
            rustix::fs::FileType::CharacterDevice,
            0o620,
            rustix::fs::makedev(1, 3),
        )
        .is_ok();
    if !chardev {
        eprintln!("character device part skipped: not root or mknod refused");
    }

    let dst = t.path().join("dst");
    let j = json_of(&run_ok(&[
        "stage",
        "in",
        s(&src),
        s(&dst),
        "--verify",
        "--json",
    ]));
    assert_eq!(j["files"], 1, "{j}");
    assert_eq!(j["specials"], if chardev { 3 } else { 2 }, "{j}");
    assert_eq!(j["skipped"], serde_json::json!([]), "{j}");
    let m = |p: &str| fs::symlink_metadata(dst.join(p)).expect("meta");
    let pipe = m("run/pipe");
    assert!(pipe.file_type().is_fifo());
    assert_eq!(pipe.mode() & 0o7777, 0o640);
    assert_eq!(
        (pipe.mtime(), pipe.mtime_nsec()),
        (1_500_000_000, 123_456_789)
    );
    let sock = m("run/sock");
    assert!(sock.file_type().is_socket());
    assert_eq!(sock.mode() & 0o7777, 0o751);
    if chardev {
        let null = m("run/null");
        assert!(null.file_type().is_char_device());
        assert_eq!(null.mode() & 0o7777, 0o620);
        assert_eq!(null.rdev(), rustix::fs::makedev(1, 3));
        assert_eq!(
            null.uid(),
            fs::symlink_metadata(src.join("run/null"))
                .expect("meta")
                .uid()
        );
    }
    assert_eq!(fs::read(dst.join("data.txt")).expect("read"), b"data");
    let names: Vec<_> = fs::read_dir(dst.join("run"))
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tierstack-stage"))
        .collect();
    assert!(names.is_empty(), "temporary names left: {names:?}");

    // Someone other than root: the device node is skipped and reported (text output), the
    // rest staged.
    if chardev {
        use std::os::unix::process::CommandExt;
        fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let out = t.path().join("user");
        fs::create_dir_all(&out).expect("mkdir");
        fs::set_permissions(&out, fs::Permissions::from_mode(0o777)).expect("chmod");
        let o = Command::new(BIN)
            .args(["stage", "out", s(&src), s(&out.join("tree"))])
            .uid(65534)
            .gid(65534)
            .output()
            .expect("run tierstack");
        let err = String::from_utf8_lossy(&o.stderr);
        if err.contains("Permission denied") && !out.join("tree").exists() {
            eprintln!("non-root part skipped: the binary or the tree is not reachable: {err}");
        } else {
            assert!(o.status.success(), "{err}");
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(text.contains("2 special files"), "{text}");
            assert!(text.contains(", 1 skipped"), "{text}");
            let line = format!("skipped: {}: ", src.join("run/null").display());
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&line) && l.contains("root")),
                "{text}"
            );
            assert!(!out.join("tree/run/null").exists());
            assert!(fs::symlink_metadata(out.join("tree/run/pipe"))
                .expect("meta")
                .file_type()
                .is_fifo());
            assert_eq!(fs::read(out.join("tree/data.txt")).expect("read"), b"data");
        }
    }
}
