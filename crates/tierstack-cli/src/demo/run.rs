//! The demo's `tierstack run` part: a real program whose working set is four times its DRAM
//! budget, run plainly and under `tierstack run` (the real binary, the LD_PRELOAD shim and
//! userfaultfd), with its result, peak RSS, faults and time compared.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tierstack_bench::fmt_size;

use super::{check_cancel, step, Outcome};

/// The longest a demo program may run (here it takes seconds).
const LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// DRAM budget of the demo's program.
const BUDGET_MIB: u64 = 64;
/// Its working set: four times the budget.
const WORKING_SET_MIB: u64 = 4 * BUDGET_MIB;

/// A C program that fills a large block, updates it in passes, reads it at random and
/// checks every word; prints one result line (equal in both runs) and exits 1 on a wrong word.
const C_PROGRAM: &str = r#"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 10) : 256;
    size_t n = mib << 17; /* 8-byte words */
    uint64_t *a = malloc(n * sizeof *a);
    if (!a) { perror("malloc"); return 2; }
    for (size_t i = 0; i < n; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    for (uint64_t pass = 1; pass <= 3; pass++)
        for (size_t i = 0; i < n; i++) a[i] = a[i] * 3 + pass;
    uint64_t x = 88172645463325252ull, sample = 0;
    for (size_t k = 0; k < n / 4096; k++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        sample += a[x % n];
    }
    size_t bad = 0;
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = i * 0x9E3779B97F4A7C15ull;
        for (uint64_t pass = 1; pass <= 3; pass++) v = v * 3 + pass;
        if (a[i] != v) bad++;
        h = (h ^ a[i]) * 0x100000001B3ull;
        h ^= h >> 29;
    }
    printf("words=%zu wrong=%zu checksum=%016llx random_sample=%016llx\n", n, bad,
           (unsigned long long)h, (unsigned long long)sample);
    free(a);
    return bad != 0;
}
"#;

/// The same work in Python with numpy, where no C compiler is installed.
const NUMPY_PROGRAM: &str = r#"
import sys
import numpy as np
mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
n = mib << 17
a = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
for p in range(1, 4):
    a *= np.uint64(3)
    a += np.uint64(p)
rng = np.random.default_rng(7)
sample = int(a[rng.integers(0, n, n // 4096)].sum(dtype=np.uint64))
v = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
for p in range(1, 4):
    v *= np.uint64(3)
    v += np.uint64(p)
bad = int((a != v).sum())
h = int(np.bitwise_xor.reduce(a))
print(f"words={n} wrong={bad} checksum={h:016x} random_sample={sample:016x}")
sys.exit(1 if bad else 0)
"#;

/// A program of the demo and how to start it.
struct Program {
    what: &'static str,
    argv: Vec<String>,
}

/// A C program built with `cc`, or the numpy one; None when neither can run here.
fn program(dir: &Path) -> Option<Program> {
    let src = dir.join("demo_sim.c");
    let bin = dir.join("demo_sim");
    if std::fs::write(&src, C_PROGRAM).is_ok() {
        let ok = Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&bin)
            .arg(&src)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(Program {
                what: "a C program (compiled with cc -O2)",
                argv: vec![bin.to_string_lossy().into_owned()],
            });
        }
    }
    let py = dir.join("demo_sim.py");
    let has_numpy = Command::new("python3")
        .args(["-c", "import numpy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if has_numpy && std::fs::write(&py, NUMPY_PROGRAM).is_ok() {
        return Some(Program {
            what: "a Python program with numpy (no C compiler found)",
            argv: vec!["python3".into(), py.to_string_lossy().into_owned()],
        });
    }
    None
}

/// What one run of a program gave.
struct Measured {
    code: i32,
    secs: f64,
    /// Peak RSS of the waited-for process and its descendants (bytes).
    max_rss: u64,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` to its end, timing it and taking its peak RSS from `wait4`.
fn measure(cmd: &mut Command) -> Result<Measured> {
    let t = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start the program")?;
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let h_out = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let h_err = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    // Bounded: a demo program that runs past LIMIT (or Ctrl-C) is killed, and the part fails.
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if rx.recv_timeout(LIMIT) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
    });
    let waited = crate::run_cmd::wait_child(pid);
    let _ = tx.send(());
    let _ = watchdog.join();
    let (code, max_rss) = waited?;
    if t.elapsed() >= LIMIT {
        bail!(
            "the demo program did not finish within {} s and was stopped",
            LIMIT.as_secs()
        );
    }
    let secs = t.elapsed().as_secs_f64();
    Ok(Measured {
        code,
        secs,
        max_rss,
        stdout: h_out.join().unwrap_or_default(),
        stderr: h_err.join().unwrap_or_default(),
    })
}

/// A `key=value` of a `key=value ...` line; a value runs to the next word holding `=`
/// (sizes print as `2.7 GiB`).
fn stat(line: &str, key: &str) -> Option<String> {
    let mut words = line.split_whitespace();
    let first = words.find_map(|w| w.strip_prefix(key)?.strip_prefix('='))?;
    let mut v = first.to_string();
    for w in words.take_while(|w| !w.contains('=')) {
        v.push(' ');
        v.push_str(w);
    }
    Some(v)
}

/// The checksum and the count of wrong words of a result line.
fn result(out: &str) -> String {
    match (stat(out, "checksum"), stat(out, "wrong")) {
        (Some(c), Some(w)) => format!("checksum {c}, {w} wrong words"),
        _ => format!("unexpected output: {}", out.trim()),
    }
}

pub fn part(dir: &Path, cancel: &AtomicBool) -> Result<Outcome> {
    if let Err(e) = tierstack_mem::uffd::available() {
        return Ok(Outcome::Skipped(format!(
            "userfaultfd is not usable by this user ({e}): run as root, or `sysctl vm.unprivileged_userfaultfd=1`"
        )));
    }
    let dir = dir.join("run");
    std::fs::create_dir_all(&dir)?;
    let Some(prog) = program(&dir) else {
        return Ok(Outcome::Skipped(
            "no C compiler (cc) and no python3 with numpy to build the demo program: install build-essential or python3-numpy".into(),
        ));
    };
    let exe: PathBuf = std::env::current_exe().context("cannot find the tierstack binary")?;
    let ws = WORKING_SET_MIB.to_string();
    let budget = format!("{BUDGET_MIB}M");
    let shown = prog.argv.join(" ");
    super::commands(&[
        format!("{shown} {ws}    # plain DRAM"),
        format!("tierstack run --dram {budget} --stats -- {shown} {ws}"),
    ]);
    step(&format!(
        "{}: allocates {ws} MiB, fills it, updates it in 3 passes, reads it at random, checks every word",
        prog.what
    ));
    let plain = measure(Command::new(&prog.argv[0]).args(&prog.argv[1..]).arg(&ws))?;
    check_cancel(cancel)?;
    if plain.code != 0 {
        bail!(
            "the demo program failed in plain DRAM (exit {}): {}",
            plain.code,
            plain.stderr.trim()
        );
    }
    let paged = measure(
        Command::new(&exe)
            .args(["run", "--dram", &budget, "--dir"])
            .arg(&dir)
            .args(["--stats", "--"])
            .args(&prog.argv)
            .arg(&ws),
    )?;
    check_cancel(cancel)?;
    let stats = paged
        .stderr
        .lines()
        .find(|l| l.starts_with("tierstack: stats:"))
        .unwrap_or("")
        .to_string();
    // `peak_rss=84.8 MiB (88915968 B)`: the byte count follows in parentheses.
    let peak: u64 = stat(&stats, "peak_rss")
        .and_then(|v| v.split('(').nth(1)?.split_whitespace().next()?.parse().ok())
        .unwrap_or(paged.max_rss);
    let faults = stat(&stats, "faults").unwrap_or_else(|| "?".into());
    let bytes_in = stat(&stats, "bytes_in").unwrap_or_else(|| "?".into());
    let bytes_out = stat(&stats, "bytes_out").unwrap_or_else(|| "?".into());
    let budget_b = BUDGET_MIB << 20;
    let ws_b = WORKING_SET_MIB << 20;
    let rows = vec![
        vec![
            "result".to_string(),
            result(&plain.stdout),
            result(&paged.stdout),
        ],
        vec![
            "time".into(),
            format!("{:.2} s", plain.secs),
            format!("{:.2} s", paged.secs),
        ],
        vec![
            "peak RSS".into(),
            fmt_size(plain.max_rss),
            format!("{} (budget {})", fmt_size(peak), fmt_size(budget_b)),
        ],
        vec![
            "faults served".into(),
            "-".into(),
            format!("{faults} (read {bytes_in}, written {bytes_out})"),
        ],
    ];
    print!(
        "{}",
        tierstack_bench::table::render(
            &["", "plain DRAM", &format!("tierstack run --dram {budget}")],
            &rows
        )
    );
    println!(
        "time under tierstack run: {:.1}x the plain run's, with {:.0} % of its peak RSS",
        paged.secs / plain.secs.max(1e-9),
        100.0 * peak as f64 / plain.max_rss.max(1) as f64
    );
    if paged.code != 0 {
        bail!(
            "the program failed under tierstack run (exit {}): {}",
            paged.code,
            paged.stderr.trim()
        );
    }
    if paged.stdout.trim() != plain.stdout.trim() {
        bail!("the program's result under tierstack run differs from the plain run's");
    }
    if stats.is_empty() {
        bail!("tierstack run --stats printed no stats line");
    }
    // Paging happened: the program held far less than its working set in DRAM.
    if peak >= ws_b * 3 / 4 {
        bail!(
            "peak RSS {} under tierstack run is not below the {} working set: nothing was paged",
            fmt_size(peak),
            fmt_size(ws_b)
        );
    }
    println!(
        "check: same result, every word right; peak RSS {} for a {} working set",
        fmt_size(peak),
        fmt_size(ws_b)
    );
    Ok(Outcome::Done)
}
