//! Helpers shared by the end-to-end tests (each test file includes this with `mod common;`
//! and uses what it needs).
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// The `tierstack` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tierstack");

/// Runs `tierstack ARGS` to its end.
pub fn ts(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run tierstack")
}

/// A path as a `&str` (the tests make UTF-8 paths).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

/// A number field of a JSON object.
pub fn f(j: &serde_json::Value, k: &str) -> f64 {
    j[k].as_f64()
        .unwrap_or_else(|| panic!("{k} missing or not a number: {j}"))
}

/// Whether `p` is a mount point of this process's mount namespace.
pub fn is_mounted(p: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let s = p.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|m| m == s))
}

/// Whether FUSE mounts can be made here (root and /dev/fuse); says SKIP when not.
pub fn root_with_fuse() -> bool {
    let root = rustix::process::geteuid().is_root();
    if !root || !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: needs root and /dev/fuse");
        return false;
    }
    true
}
