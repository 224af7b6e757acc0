//! `tierstack demo` end to end through the real binary: every part runs (or says why it is
//! skipped), names the commands a user types, prints figures, passes its checks, and leaves
//! nothing behind, also when interrupted with Ctrl-C.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{entries, has_root_and_fuse, root_with_fuse, BIN};

fn demo(dir: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(BIN)
        .arg("demo")
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .output()
        .expect("run tierstack demo");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Nothing of the demo is left in `dir`, and no mount under it.
fn assert_clean(dir: &Path) {
    let left = entries(dir);
    assert!(left.is_empty(), "the demo left {left:?}");
    let mounts = std::fs::read_to_string("/proc/mounts").expect("mounts");
    assert!(
        !mounts.contains(&dir.to_string_lossy().to_string()),
        "a mount is left: {mounts}"
    );
}

#[test]
fn the_whole_tour_runs_and_cleans_up() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let t = Instant::now();
    let (ok, text) = demo(tmp.path(), &[]);
    println!("{text}");
    assert!(ok, "demo failed:\n{text}");
    assert!(
        t.elapsed() < Duration::from_secs(180),
        "the demo took {:?}",
        t.elapsed()
    );
    for heading in [
        "Memory beyond DRAM: tierstack run",
        "Burst buffer: tierstack mount",
        "User-space RAID: tierstack array",
        "=== Summary",
    ] {
        assert!(text.contains(heading), "no `{heading}` in:\n{text}");
    }
    // Each part either ran with its commands and figures or says why it was skipped.
    let summary = &text[text.find("=== Summary").expect("summary")..];
    for (part, cmd, figure) in [
        ("run", "$ tierstack run --dram 64M", "peak RSS"),
        ("mount", "$ tierstack mount ", "speedup"),
        ("array", "$ tierstack array create ", "XOR parity"),
    ] {
        let line = summary
            .lines()
            .find(|l| l.trim_start().starts_with(part))
            .unwrap_or_else(|| panic!("no summary line for {part}:\n{summary}"));
        if line.contains("SKIPPED") {
            eprintln!("SKIP: demo part {part}: {line}");
            continue;
        }
        assert!(line.contains("ok ("), "{part}: {line}");
        assert!(text.contains(cmd), "{part}: no `{cmd}` in:\n{text}");
        assert!(text.contains(figure), "{part}: no `{figure}` in:\n{text}");
    }
    // This machine has what every part needs (root, userfaultfd, cc, FUSE): none may skip.
    if has_root_and_fuse() {
        assert!(
            !summary.contains("SKIPPED"),
            "a part was skipped:\n{summary}"
        );
        assert!(text.contains("0 wrong words"), "{text}");
        assert!(
            text.contains("BACKING holds all 4 files"),
            "the mount part did not check the backing:\n{text}"
        );
    }
    assert_clean(tmp.path());
}

#[test]
fn one_part_only_and_bad_flags() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (ok, text) = demo(tmp.path(), &["--only", "array"]);
    assert!(ok, "{text}");
    assert!(text.contains("User-space RAID: tierstack array"), "{text}");
    assert!(!text.contains("Memory beyond DRAM"), "{text}");
    assert_clean(tmp.path());
    let (ok, text) = demo(tmp.path(), &["--only", "swap"]);
    assert!(!ok);
    assert!(text.contains("--only"), "{text}");
    let (ok, text) = demo(tmp.path(), &["--size", "1M"]);
    assert!(!ok);
    assert!(text.contains("--size"), "{text}");
    assert_clean(tmp.path());
}

#[test]
fn ctrl_c_during_the_mount_part_cleans_up() {
    if !root_with_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(BIN)
        .args(["demo", "--only", "mount", "--dir"])
        .arg(tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start demo");
    // Wait until the mount part has made its work folder, then Ctrl-C.
    let t = Instant::now();
    loop {
        let deep = walk_count(tmp.path());
        if deep > 3 || t.elapsed() > Duration::from_secs(30) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: sending SIGINT to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "demo did not stop within 120 s of Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // It may have finished just before the signal; either way nothing is left.
    let mut err = String::new();
    use std::io::Read;
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    if !status.success() {
        assert!(err.contains("interrupted"), "{err}");
    }
    assert_clean(tmp.path());
}

fn walk_count(p: &Path) -> usize {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            n += 1;
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                n += walk_count(&e.path());
            }
        }
    }
    n
}
