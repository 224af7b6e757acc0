//! Helpers shared by the end-to-end tests (each test file includes this with `mod common;`
//! and uses what it needs).
#![allow(dead_code)]

pub mod leftovers;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

/// The `tierstack` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tierstack");

/// Runs `tierstack ARGS` to its end.
pub fn ts(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run tierstack")
}

/// `tierstack mount BACKING MNT --dir FAST` with a 64 MiB drive and 64 MiB of DRAM.
pub fn mount_small(backing: &Path, mnt: &Path, fast: &Path) -> Output {
    ts(&[
        "mount",
        s(backing),
        s(mnt),
        "--dir",
        s(fast),
        "--drive-size",
        "64M",
        "--dram",
        "64M",
    ])
}

/// Runs `tierstack ARGS`, which must succeed; its standard output.
#[track_caller]
pub fn ok(args: &[&str]) -> String {
    success_stdout(args, ts(args))
}

/// The standard output of `o`, the run of `tierstack ARGS`, which must have succeeded.
#[track_caller]
pub fn success_stdout(args: &[&str], o: Output) -> String {
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

/// Whether `p` (as given) is a mount point of this process's mount namespace.
pub fn is_mounted(p: &Path) -> bool {
    tierstack_common::mounts::mounted_type(p).is_some()
}

/// Whether the tests run as root.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether FUSE mounts can be made here (root and /dev/fuse), saying nothing.
pub fn has_root_and_fuse() -> bool {
    is_root() && Path::new("/dev/fuse").exists()
}

/// Whether FUSE mounts can be made here (root and /dev/fuse); says SKIP when not.
pub fn root_with_fuse() -> bool {
    if !has_root_and_fuse() {
        eprintln!("SKIP: needs root and /dev/fuse");
        return false;
    }
    true
}

/// Whether userfaultfd can be used here, by the probe `tierstack run` makes (says SKIP when
/// not).
pub fn uffd_usable() -> bool {
    match tierstack_mem::uffd::available() {
        Ok(_) => true,
        Err(e) => {
            eprintln!("SKIP: userfaultfd not usable here ({e})");
            false
        }
    }
}

/// Takes this test file's lock: the tests that hold it run one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Detaches `mnt` (`umount -l`) where it is mounted and kills the daemon `pid` (SIGKILL): the
/// clean-up of a test's mount, whatever happened.
pub fn detach(mnt: &Path, pid: Option<u32>) {
    if is_mounted(mnt) {
        let _ = Command::new("umount").arg("-l").arg(mnt).status();
    }
    if let Some(pid) = pid {
        // SAFETY: kill(2) on the daemon this test started.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
    }
}

/// The entries of the folder `dir` (which must exist).
pub fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .map(|e| e.path())
        .collect()
}

/// Whether two files hold the same bytes (read in chunks: they may be large).
pub fn same_content(a: &Path, b: &Path) -> bool {
    use std::io::Read;
    let (mut fa, mut fb) = (
        std::fs::File::open(a).expect("open"),
        std::fs::File::open(b).expect("open"),
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = fa.read(&mut ba).expect("read");
        let mut nb = 0;
        while nb < na {
            let k = fb.read(&mut bb[nb..na]).expect("read");
            if k == 0 {
                return false;
            }
            nb += k;
        }
        if ba[..na] != bb[..na] {
            return false;
        }
        if na == 0 {
            return fb.read(&mut bb).expect("read") == 0;
        }
    }
}

/// The repository's root folder.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// The shim built beside the binary under test (`cargo build --release`, which `make test`
/// runs first).
pub fn preload() -> PathBuf {
    let p = Path::new(BIN).with_file_name("libtierstack_preload.so");
    assert!(
        p.is_file(),
        "{} missing: build it with `cargo build --release` (make test does)",
        p.display()
    );
    p
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// `GET /metrics` on 127.0.0.1:`port` (bounded at 30 s): the status line and the body.
pub fn get_metrics(port: u16) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to /metrics");
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let (head, body) = resp.split_once("\r\n\r\n").expect("http answer");
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// `promtool check metrics` on a scrape's body: it must pass. Where promtool is missing, a
/// test that `requires` it fails (CI installs it); others note it and rely on their own parser.
pub fn promtool_check(body: &str, requires: bool) {
    use std::io::Write;
    use std::process::Stdio;
    let c = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut c = match c {
        Ok(c) => c,
        Err(e) if requires => {
            panic!("promtool (Debian's prometheus package: apt-get install prometheus): {e}")
        }
        Err(_) => {
            eprintln!("promtool not installed: format checked by the test's own parser only");
            return;
        }
    };
    c.stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write");
    let o = c.wait_with_output().expect("promtool");
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "promtool check metrics: {text}\n{body}");
}
