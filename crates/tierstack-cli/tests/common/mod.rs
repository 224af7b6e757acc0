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

/// Runs `tierstack ARGS`, which must succeed; its standard output.
#[track_caller]
pub fn ok(args: &[&str]) -> String {
    let o = ts(args);
    assert!(
        o.status.success(),
        "tierstack {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs `tierstack ARGS`, which must fail with one `tierstack: error: ` line; that line.
#[track_caller]
pub fn fails(args: &[&str]) -> String {
    let o = ts(args);
    assert!(!o.status.success(), "tierstack {args:?} should have failed");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one error line for {args:?}, got: {err}"
    );
    assert!(lines[0].starts_with("tierstack: error: "), "{err}");
    lines[0].to_string()
}

/// `len` reproducible pseudo-random bytes (xorshift from `seed`).
pub fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
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
