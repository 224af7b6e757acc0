//! `tierstack bench mem --compare -- CMD`: the user's own program, timed under `tierstack run`
//! at its defaults and under kernel swap (plain, and with zswap where the host lets the switch
//! be set) with the same memory.
//!
//! - `tierstack`: `tierstack run --dram D --dir DIR --json [departures] -- CMD`, the command a
//!   user runs, so the figure is taken through the same code path. Its report (`run --json`)
//!   is kept whole.
//! - `kernel-swap`: CMD in a memory cgroup with a swap file in DIR (the engine of the synthetic
//!   workload, [`crate::mem`]). Its limit is the peak RSS of the program under `tierstack run`
//!   in the same round (same memory: the paged pages, the program's other memory and
//!   tierstack's own), or `--dram` when kernel swap runs alone.
//! - While each program runs, `/proc/meminfo`'s `Zswap`/`Zswapped` and the swap file's use in
//!   `/proc/swaps` are sampled: the peak of what zswap held and in how much memory.
//!
//! Every run has a bound (`timeout`), prints a line every 30 s while it goes on, and stops on
//! Ctrl-C/SIGTERM (SIGTERM to the program, SIGKILL 10 s later); the swap file and the cgroup
//! are removed on every way out.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::mem::{cancelled, kernel_swap_setup};
use crate::zswap::field_kb;
use crate::BenchError;

/// What to run and with what memory.
#[derive(Debug, Clone)]
pub struct ProgramSpec {
    /// The program and its arguments.
    pub cmd: Vec<OsString>,
    /// `--dram` of `tierstack run`; the kernel-swap limit when kernel swap runs alone.
    pub dram: u64,
    /// Folder of tierstack's drives and of the swap file.
    pub dir: PathBuf,
    /// `run` flags that depart from its defaults (`--page 64K`, `--no-compress`, ...).
    pub run_flags: Vec<String>,
    /// Size of the swap file.
    pub swap_bytes: u64,
    /// How long one run may take.
    pub timeout: Duration,
}

/// The peak of what zswap held while the program ran (`/proc/meminfo`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ZswapPeak {
    /// Bytes of pages zswap held (`Zswapped`) at its peak.
    pub stored_bytes: u64,
    /// Memory its pool took for them (`Zswap`) at that moment.
    pub pool_bytes: u64,
    /// `stored_bytes / pool_bytes`.
    pub ratio: f64,
}

/// One run of the program under one engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProgramReport {
    /// `tierstack`, `kernel-swap` or `kernel-swap-zswap`.
    pub engine: String,
    /// Wall time from the start of the command to its exit, in seconds.
    pub wall_s: f64,
    /// Exit status (128 + signal when killed).
    pub exit: i32,
    /// Peak RSS of the program (tierstack: of it and its children, from `run`; kernel
    /// swap: the program's VmHWM, last seen).
    pub peak_rss_bytes: u64,
    /// The memory the engine was given: `--dram` for tierstack, the cgroup limit for
    /// kernel swap.
    pub memory_bytes: u64,
    /// Peak use of the swap file (kernel swap).
    pub swap_peak_bytes: u64,
    /// What zswap held at its peak (kernel swap with zswap; zero otherwise).
    pub zswap: ZswapPeak,
    /// The last lines of the program's standard output.
    pub output_tail: String,
    /// A hash of its whole standard output (xxh3), to check that every engine computed the same.
    pub output_hash: String,
    /// `tierstack run --json`'s object (tierstack engine).
    pub run: Option<serde_json::Value>,
}

/// Runs the program once under `engine` (`tierstack`, `kernel-swap`; `limit` is the cgroup
/// limit of kernel swap) and names the report and the progress lines `name` (the caller sets
/// the zswap switch for a `kernel-swap-zswap` run).
pub fn run_program(
    exe: &Path,
    engine: &str,
    name: &str,
    spec: &ProgramSpec,
    limit: u64,
) -> Result<ProgramReport, BenchError> {
    if spec.cmd.is_empty() {
        return Err(BenchError::NoProgram);
    }
    let (mut cmd, setup, memory) = match engine {
        "tierstack" => {
            let mut c = Command::new(exe);
            c.arg("run")
                .arg("--dram")
                .arg(spec.dram.to_string())
                .arg("--dir")
                .arg(&spec.dir)
                .arg("--json")
                .args(&spec.run_flags)
                .arg("--")
                .args(&spec.cmd);
            (c, None, spec.dram)
        }
        "kernel-swap" => {
            let (setup, procs) = kernel_swap_setup(&spec.dir, spec.swap_bytes, limit)?;
            // The shell joins the cgroup, then becomes the program (same pid).
            let mut c = Command::new("/bin/sh");
            c.arg("-c")
                .arg("echo $$ > \"$0\" && exec \"$@\"")
                .arg(procs)
                .args(&spec.cmd);
            (c, Some(setup), limit)
        }
        o => return Err(BenchError::UnknownEngine(o.to_string())),
    };
    let swapfile = setup.as_ref().map(|s| s.swapfile().to_path_buf());
    // v1: the group waits in the OOM state instead of being killed (`oom_control`); a group
    // that stays there has run out of memory for good (with v2 the kernel kills the program).
    let oom_control = setup
        .as_ref()
        .and_then(|s| s.cgroup())
        .map(|cg| cg.join("memory.oom_control"))
        .filter(|p| p.exists());
    let mut oom_since: Option<Instant> = None;
    // With zswap on, the group's limit gives up what the pool holds (cgroup v1 does not
    // charge it): both sides then hold the same memory.
    let mut charge = setup
        .as_ref()
        .and_then(|s| s.cgroup())
        .and_then(|cg| crate::zswap::PoolCharge::new(cg, limit));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(BenchError::WorkerStart)?;
    let out = drain(child.stdout.take(), 16 << 20);
    let err = drain(child.stderr.take(), 64 << 10);
    let mut seen = Sampled::default();
    let mut next_note = start + Duration::from_secs(30);
    let status = loop {
        if cancelled() {
            stop(&mut child);
            return Err(BenchError::Cancelled);
        }
        if let Some(st) = child.try_wait().map_err(BenchError::WorkerWait)? {
            break st;
        }
        if start.elapsed() > spec.timeout {
            stop(&mut child);
            return Err(BenchError::ProgramTimeout {
                engine: name.to_string(),
                seconds: spec.timeout.as_secs(),
            });
        }
        seen.sample(child.id(), swapfile.as_deref());
        if let Some(c) = charge.as_mut() {
            c.tick();
        }
        let oom = oom_control
            .as_deref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .is_some_and(|t| under_oom(&t));
        match (oom, oom_since) {
            (false, _) => oom_since = None,
            (true, None) => oom_since = Some(Instant::now()),
            (true, Some(t)) if t.elapsed() >= OOM_GRACE => {
                stop(&mut child);
                return Err(BenchError::ProgramOutOfMemory {
                    engine: name.to_string(),
                    seconds: start.elapsed().as_secs(),
                });
            }
            (true, Some(_)) => {}
        }
        if Instant::now() >= next_note {
            eprintln!(
                "bench mem: {name}: the program has run {:.0} s (bound {} s; Ctrl-C stops it)",
                start.elapsed().as_secs_f64(),
                spec.timeout.as_secs()
            );
            next_note += Duration::from_secs(30);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let wall_s = start.elapsed().as_secs_f64();
    drop(setup);
    // A process the program left behind may hold its pipes open: wait 10 s for them at most.
    let out = join_within(out, Duration::from_secs(10));
    let err = join_within(err, Duration::from_secs(10));
    let exit = exit_code(status);
    let run = if engine == "tierstack" {
        last_json_line(&err)
    } else {
        None
    };
    let peak_rss_bytes = run
        .as_ref()
        .and_then(|r| r.get("peak_rss_bytes"))
        .and_then(|v| v.as_u64())
        .unwrap_or(seen.hwm);
    if exit != 0 {
        return Err(BenchError::ProgramFailed {
            engine: name.to_string(),
            exit,
            stderr: last_words(&err),
        });
    }
    Ok(ProgramReport {
        engine: name.to_string(),
        wall_s,
        exit,
        peak_rss_bytes,
        memory_bytes: memory,
        swap_peak_bytes: seen.swap,
        zswap: seen.zswap,
        output_tail: tail(&out, 400),
        output_hash: format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&out)),
        run,
    })
}

/// How long a kernel-swap group may stay in the OOM state before the run counts as out of
/// memory (the OOM killer would have ended it).
const OOM_GRACE: Duration = Duration::from_secs(20);

/// Whether a v1 `memory.oom_control` says the group is in the OOM state now.
fn under_oom(oom_control: &str) -> bool {
    oom_control
        .lines()
        .any(|l| l.split_whitespace().eq(["under_oom", "1"]))
}

/// Text of one report: a table row.
pub fn render(r: &ProgramReport) -> String {
    let mut notes = Vec::new();
    if let Some(run) = &r.run {
        let g = |k: &str| run.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        notes.push(format!(
            "faults {}, paged in {}, out {}, compressed hits {}",
            g("faults"),
            crate::fmt_size(g("bytes_paged_in")),
            crate::fmt_size(g("bytes_paged_out")),
            g("compressed_hits")
        ));
    }
    if r.swap_peak_bytes > 0 {
        notes.push(format!("swap peak {}", crate::fmt_size(r.swap_peak_bytes)));
    }
    if r.zswap.stored_bytes > 0 {
        notes.push(format!(
            "zswap held {} in {} ({:.1}:1)",
            crate::fmt_size(r.zswap.stored_bytes),
            crate::fmt_size(r.zswap.pool_bytes),
            r.zswap.ratio
        ));
    }
    format!(
        "{:<18} {:>9.2} {:>10} {:>10}  {}\n",
        r.engine,
        r.wall_s,
        crate::fmt_size(r.peak_rss_bytes),
        crate::fmt_size(r.memory_bytes),
        notes.join("; ")
    )
}

/// Header of [`render`]'s rows.
pub const HEADER: &str = "engine                wall s   peak RSS     memory  notes\n";

/// SIGTERM to the program (`run` passes it on and cleans up), SIGKILL if it is still there
/// 10 s later.
fn stop(child: &mut Child) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32);
    if let Some(pid) = pid {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Reads a pipe to its end on a thread, keeping at most the last `cap` bytes.
fn drain<R: Read + Send + 'static>(
    pipe: Option<R>,
    cap: usize,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let Some(mut p) = pipe else { return kept };
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match p.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    kept.extend_from_slice(&buf[..n]);
                    if kept.len() > cap {
                        kept.drain(..kept.len() - cap);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        kept
    })
}

/// What a [`drain`] thread read, once its pipe closes or `bound` has passed (then what is
/// lost is only the figure's output check: the thread is left to end with the pipe).
fn join_within(h: std::thread::JoinHandle<Vec<u8>>, bound: Duration) -> Vec<u8> {
    let end = Instant::now() + bound;
    while !h.is_finished() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    if h.is_finished() {
        h.join().unwrap_or_default()
    } else {
        Vec::new()
    }
}

fn exit_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code()
        .or_else(|| st.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// The last line of `text` that parses as a JSON object (`run --json` writes it last).
fn last_json_line(text: &[u8]) -> Option<serde_json::Value> {
    String::from_utf8_lossy(text)
        .lines()
        .rev()
        .filter(|l| l.trim_start().starts_with('{'))
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.is_object())
}

/// The program's last line on standard error (not `run`'s JSON), for a one-line error.
fn last_words(err: &[u8]) -> String {
    let text = String::from_utf8_lossy(err);
    let line = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('{'))
        .unwrap_or("(nothing on its standard error)");
    line.chars().take(300).collect()
}

/// The last `n` bytes of `text` as text, from a line start where there is one.
fn tail(text: &[u8], n: usize) -> String {
    let s = String::from_utf8_lossy(&text[text.len().saturating_sub(n)..]).into_owned();
    match (text.len() > n, s.find('\n')) {
        (true, Some(i)) => s[i + 1..].trim_end().to_string(),
        _ => s.trim_end().to_string(),
    }
}

/// Peaks seen while the program ran.
#[derive(Default)]
struct Sampled {
    hwm: u64,
    swap: u64,
    zswap: ZswapPeak,
}

impl Sampled {
    fn sample(&mut self, pid: u32, swapfile: Option<&Path>) {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(kb) = field_kb(&s, "VmHWM:") {
                self.hwm = self.hwm.max(kb * 1024);
            }
        }
        let Some(swapfile) = swapfile else { return };
        if let Ok(s) = std::fs::read_to_string("/proc/swaps") {
            if let Some(used) = swap_used(&s, swapfile) {
                self.swap = self.swap.max(used);
            }
        }
        if let Ok(s) = std::fs::read_to_string("/proc/meminfo") {
            if let (Some(pool), Some(stored)) = (field_kb(&s, "Zswap:"), field_kb(&s, "Zswapped:"))
            {
                if stored * 1024 > self.zswap.stored_bytes {
                    self.zswap = ZswapPeak {
                        stored_bytes: stored * 1024,
                        pool_bytes: pool * 1024,
                        ratio: if pool > 0 {
                            stored as f64 / pool as f64
                        } else {
                            0.0
                        },
                    };
                }
            }
        }
    }
}

/// Bytes used of `file` in a /proc/swaps table (`Filename Type Size Used Priority`, KiB).
fn swap_used(table: &str, file: &Path) -> Option<u64> {
    let name = file.to_string_lossy();
    table.lines().skip(1).find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == name)
            .then(|| f.nth(2)?.parse::<u64>().ok().map(|kb| kb * 1024))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_proc_tables() {
        let meminfo = "MemTotal:       24000000 kB\nZswap:              1024 kB\nZswapped:          28672 kB\n";
        assert_eq!(field_kb(meminfo, "Zswap:"), Some(1024));
        assert_eq!(field_kb(meminfo, "Zswapped:"), Some(28672));
        assert_eq!(field_kb(meminfo, "SwapCached:"), None);
        let swaps = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/tmp/tierstack-swap-7\tfile\t\t4194300\t\t2048\t\t-2\n/swapfile file 10 5 -3\n";
        assert_eq!(
            swap_used(swaps, Path::new("/tmp/tierstack-swap-7")),
            Some(2048 * 1024)
        );
        assert_eq!(swap_used(swaps, Path::new("/tmp/other")), None);
    }

    #[test]
    fn reads_the_oom_state() {
        assert!(under_oom("oom_kill_disable 1\nunder_oom 1\noom_kill 0\n"));
        assert!(!under_oom("oom_kill_disable 1\nunder_oom 0\noom_kill 0\n"));
        assert!(!under_oom(""));
    }

    #[test]
    fn finds_run_json_after_the_programs_own_lines() {
        let err = b"warning: something\n{\"exit\": 0, \"faults\": 12}\n";
        let v = last_json_line(err).unwrap_or_default();
        assert_eq!(v["faults"], 12);
        assert!(last_json_line(b"{not json\nplain\n").is_none());
    }

    #[test]
    fn last_words_skip_runs_json() {
        assert_eq!(
            last_words(b"a\nboom: no file\n{\"exit\": 1}\n"),
            "boom: no file"
        );
        assert_eq!(last_words(b""), "(nothing on its standard error)");
    }

    #[test]
    fn tails_start_at_a_line() {
        assert_eq!(tail(b"one\ntwo\nthree\n", 9), "three");
        assert_eq!(tail(b"short\n", 100), "short");
    }
}
