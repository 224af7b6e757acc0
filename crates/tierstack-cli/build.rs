//! Names the commit in `tierstack --version`: sets `TIERSTACK_VERSION` to
//! `0.1.0 (git abc1234, 2026-11-27)` (the short hash and the commit's date) from `git`, or to
//! `0.1.0 (git unknown)` where there is no git or no repository (a tarball, a Spack build):
//! the build never fails for want of them. `TIERSTACK_COMMIT_DATE` is the date alone (empty
//! without git), for the man pages. Reruns when HEAD moves (`.git/HEAD`, its reflog, the
//! branch it points to, `packed-refs`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `git ARGS` run in `dir`, its first line of output; None when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let line = s.lines().next()?.trim().to_string();
    (!line.is_empty()).then_some(line)
}

/// Whether `dir` is in tierstack's own repository: its top level is the workspace root (a
/// tarball unpacked inside some other repository must not take that repository's commit).
fn own_repository(dir: &Path) -> bool {
    let (Some(top), Ok(root)) = (
        git(dir, &["rev-parse", "--show-toplevel"]),
        dir.join("../..").canonicalize(),
    ) else {
        return false;
    };
    Path::new(&top).canonicalize().is_ok_and(|t| t == root)
}

/// The files whose change moves HEAD: HEAD itself and its reflog, the branch file it names and
/// packed-refs (a branch may live there). Only files that exist: cargo reruns for a missing one
/// every time.
fn head_files(dir: &Path) -> Vec<PathBuf> {
    let (Some(git_dir), Some(common)) = (
        git(dir, &["rev-parse", "--git-dir"]),
        git(dir, &["rev-parse", "--git-common-dir"]),
    ) else {
        return Vec::new();
    };
    // Both are relative to `dir` unless git printed them absolute.
    let (git_dir, common) = (dir.join(git_dir), dir.join(common));
    let head = git_dir.join("HEAD");
    // HEAD's reflog moves with every commit, checkout and reset.
    let mut files = vec![
        head.clone(),
        git_dir.join("logs/HEAD"),
        common.join("packed-refs"),
    ];
    if let Ok(text) = std::fs::read_to_string(&head) {
        if let Some(r) = text.trim().strip_prefix("ref: ") {
            // The branch's file, and its folder (a packed branch gets its loose file there on
            // the next commit; cargo scans a folder for any change).
            let branch = common.join(r);
            files.extend(branch.parent().map(Path::to_path_buf));
            files.push(branch);
        }
    }
    files.retain(|f| f.exists());
    files.dedup();
    files
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| ".".into()));
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_else(|_| "unknown".into());
    let (mut hash, mut date) = (None, None);
    if own_repository(&dir) {
        for f in head_files(&dir) {
            println!("cargo:rerun-if-changed={}", f.display());
        }
        hash = git(&dir, &["rev-parse", "--short", "HEAD"]);
        date = git(&dir, &["log", "-1", "--format=%cd", "--date=short", "HEAD"]);
    }
    let full = match (&hash, &date) {
        (Some(h), Some(d)) => format!("{version} (git {h}, {d})"),
        (Some(h), None) => format!("{version} (git {h})"),
        _ => format!("{version} (git unknown)"),
    };
    println!("cargo:rustc-env=TIERSTACK_VERSION={full}");
    // The man pages' date (`tierstack gen-docs`): the commit's, so a rebuild makes the same pages.
    println!(
        "cargo:rustc-env=TIERSTACK_COMMIT_DATE={}",
        date.unwrap_or_default()
    );
}
