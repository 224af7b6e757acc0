//! The check every CLI test binary runs when it exits (issue 37: nothing left behind): no
//! tierstack process it started is still alive (a mount daemon, a `run`), and nothing new
//! stays in the default folders (`/var/tmp/tierstack`, `/var/tmp/tierstack-slurm`, the
//! runtime folder `/run/tierstack` and its run records). A leftover fails the binary (exit
//! status 101, with the list), so `cargo test` and `make test` fail.
//!
//! How: before `main` (ctor), the binary notes what those folders hold and marks its own
//! environment with `_TIERSTACK_TEST_OWNER=<pid>`, which every process it starts inherits;
//! at exit (atexit) it looks for live processes with that mark (and kills them, so that none
//! keeps the test's output pipe open) and for entries that were not there before. Log folders are not checked: logs are kept after a umount by design. Other
//! activity on the host in the same folders (a second test run at the same time) can show up
//! as a leftover; CI runs one binary at a time.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The variable that marks the processes a test binary started.
const MARK: &str = "_TIERSTACK_TEST_OWNER";

/// The default folders, and what they held when the binary started.
static BEFORE: OnceLock<BTreeSet<PathBuf>> = OnceLock::new();

fn folders() -> Vec<PathBuf> {
    [
        "/var/tmp/tierstack",
        "/var/tmp/tierstack-slurm",
        "/run/tierstack",
        "/run/tierstack/run",
    ]
    .iter()
    .map(PathBuf::from)
    .collect()
}

/// Every entry of the default folders (one level each).
fn snapshot() -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for d in folders() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            out.insert(e.path());
        }
    }
    out
}

#[ctor::ctor]
fn start() {
    if std::env::var_os("TIERSTACK_NO_LEFTOVER_CHECK").is_some() {
        return;
    }
    let _ = BEFORE.set(snapshot());
    // Before main, no other thread: the environment may be changed.
    std::env::set_var(MARK, std::process::id().to_string());
    // SAFETY: registers a plain `extern "C" fn()` with the C library's atexit; it runs once,
    // at exit, after the test harness has finished.
    unsafe {
        libc::atexit(at_exit);
    }
}

/// The live processes (pid, command line) whose environment has this binary's mark.
fn marked_processes() -> Vec<(u32, String)> {
    let me = std::process::id();
    let want = format!("{MARK}={me}");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if !env.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd: Vec<String> = cmd
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        // Only tierstack's own processes: a test's helper programs (sleep, a shell) that a
        // killed `run` leaves to their own end are not ours to judge.
        let is_ours = cmd
            .first()
            .is_some_and(|a| Path::new(a).file_name().is_some_and(|n| n == "tierstack"));
        let zombie = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(false);
        if is_ours && !zombie {
            out.push((pid, cmd.join(" ")));
        }
    }
    out
}

/// What this binary left: marked processes still alive after a grace period (a daemon may
/// be finishing its exit), and new entries of the default folders.
pub fn leftovers() -> Vec<String> {
    let t0 = Instant::now();
    let mut procs = marked_processes();
    while !procs.is_empty() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        procs = marked_processes();
    }
    let mut out: Vec<String> = procs
        .into_iter()
        .map(|(pid, cmd)| {
            // Killed after it is reported: a process left holding the test's output pipe
            // would keep `cargo test` waiting for ever.
            // SAFETY: kill(2) of a process this test binary started (it has its mark).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let cmd: String = cmd.chars().take(160).collect();
            format!("process {pid} still ran (now killed): {cmd}")
        })
        .collect();
    if let Some(before) = BEFORE.get() {
        for p in snapshot().difference(before) {
            // A folder that was made (the runtime folder's `run/`) is not a leftover itself.
            if folders().contains(p) {
                continue;
            }
            out.push(format!("{} was left", p.display()));
        }
    }
    out
}

extern "C" fn at_exit() {
    let left = leftovers();
    if left.is_empty() {
        return;
    }
    eprintln!(
        "\nleftover check: this test binary left {} thing(s) behind (tests/common/leftovers.rs):",
        left.len()
    );
    for l in &left {
        eprintln!("  {l}");
    }
    // SAFETY: ends the process at once with a failure status, from an atexit handler (where
    // `exit` must not be called again).
    unsafe { libc::_exit(101) }
}
