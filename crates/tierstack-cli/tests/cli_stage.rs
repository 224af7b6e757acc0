//! `tierstack stage in|out` through the real binary.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rand::{Rng, SeedableRng};

fn ts(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tierstack"))
        .args(args)
        .output()
        .expect("run tierstack")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

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
    let o = ts(&[
        "mount",
        s(&backing),
        s(&mnt),
        "--dir",
        s(&fast),
        "--drive-size",
        "64M",
        "--dram",
        "64M",
    ]);
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
