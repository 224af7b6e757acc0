//! `tierstack bench mem` through the real binary.

mod common;
use common::{ts, uffd_usable};

/// Held by the tests that set the host's zswap switch or count the benchmark's cgroups:
/// both are global, and tests of one binary run at the same time.
static HOST_SWITCHES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn host_switches() -> std::sync::MutexGuard<'static, ()> {
    HOST_SWITCHES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn dram_engine_reports_pmbench_figures() {
    let o = ts(&[
        "bench",
        "mem",
        "--engine",
        "dram",
        "--map",
        "64M",
        "--seconds",
        "0.5",
        "--threads",
        "2",
        "--read-ratio",
        "50",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(j["engine"], "dram");
    assert!(j["accesses"].as_u64().unwrap_or(0) > 10_000, "{j}");
    assert!(j["accesses_per_s"].as_f64().unwrap_or(0.0) > 0.0);
    let bands = j["bands"].as_array().expect("bands");
    let reads: u64 = bands.iter().map(|b| b["reads"].as_u64().unwrap_or(0)).sum();
    let writes: u64 = bands
        .iter()
        .map(|b| b["writes"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(reads + writes, j["accesses"].as_u64().unwrap_or(0));
    // Half reads, half writes, within noise.
    let share = reads as f64 / (reads + writes) as f64;
    assert!((0.45..0.55).contains(&share), "read share {share}");
    assert!(j["p50_us"].as_f64().unwrap_or(-1.0) <= j["p99_us"].as_f64().unwrap_or(-1.0));
}

/// Whether a kernel-swap run failed for environment limits, not tierstack's: no root, no swap
/// or cgroup support, or a swap file that other processes on the machine filled while the
/// worker ran (swap is global). Says so for `test`.
fn swap_unavailable(o: &std::process::Output, test: &str) -> bool {
    let err = String::from_utf8_lossy(&o.stderr);
    let limit = !o.status.success()
        && (err.contains("needs root")
            || err.contains("swapon failed")
            || err.contains("no memory cgroup")
            || err.contains("made no progress"));
    if limit {
        eprintln!("SKIP {test}: {err}");
    }
    limit
}

#[test]
fn kernel_swap_engine_swaps_and_cleans_up() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_str().expect("utf8");
    let o = ts(&[
        "bench",
        "mem",
        "--engine",
        "kernel-swap",
        "--map",
        "96M",
        "--dram",
        "48M",
        "--seconds",
        "1",
        "--dir",
        dir,
        "--json",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    if swap_unavailable(&o, "kernel_swap_engine_swaps_and_cleans_up") {
        return;
    }
    assert!(o.status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(j["engine"], "kernel-swap");
    assert!(j["accesses"].as_u64().unwrap_or(0) > 0);
    // Swap file and cgroup are gone.
    assert_eq!(
        std::fs::read_dir(tmp.path()).expect("dir").count(),
        0,
        "swap file left behind"
    );
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    assert!(!swaps.contains(dir), "swap still on: {swaps}");
}

/// SIGTERM while kernel swap runs: the comparison stops within seconds with one line, and the
/// swap file, the swap area, the cgroup and the zswap switch are as they were before.
#[test]
fn sigterm_during_a_comparison_puts_everything_back() {
    use std::time::{Duration, Instant};
    let _switches = host_switches();
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIP sigterm_during_a_comparison_puts_everything_back: needs root");
        return;
    }
    let zswap = "/sys/module/zswap/parameters/enabled";
    let zswap_before = std::fs::read_to_string(zswap).ok();
    let cgroups = || {
        std::fs::read_dir("/sys/fs/cgroup/memory")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with("tierstack-bench")
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    let cgroups_before = cgroups();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_str().expect("utf8");
    let mut child = std::process::Command::new(common::BIN)
        .args([
            "bench",
            "mem",
            "--compare",
            "--map",
            "256M",
            "--dram",
            "64M",
        ])
        .args(["--seconds", "12", "--dir", dir])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // Wait (bounded) for the swap file to be in use: the kernel-swap run has begun.
    let t0 = Instant::now();
    let swapping = loop {
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        if swaps.contains(dir) {
            break true;
        }
        if t0.elapsed() > Duration::from_secs(120) || child.try_wait().ok().flatten().is_some() {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !swapping {
        let _ = child.kill();
        let o = child.wait_with_output().expect("wait");
        eprintln!(
            "SKIP sigterm_during_a_comparison_puts_everything_back: no swap run: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        return;
    }
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on the child this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let t1 = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        assert!(
            t1.elapsed() < Duration::from_secs(30),
            "no exit 30 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("cancelled"), "{err}");
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    assert!(!swaps.contains(dir), "swap still on: {swaps}");
    assert_eq!(
        std::fs::read_dir(tmp.path()).expect("dir").count(),
        0,
        "files left"
    );
    assert_eq!(cgroups(), cgroups_before, "a cgroup left behind");
    assert_eq!(
        std::fs::read_to_string(zswap).ok(),
        zswap_before,
        "zswap switch changed"
    );
}

#[test]
fn bad_options_get_one_line() {
    for (args, needle) in [
        (vec!["--map", "abc"], "invalid size"),
        (vec!["--dram", "0"], "--dram"),
        (vec!["--pattern", "spiral"], "unknown pattern"),
        (vec!["--read-ratio", "150"], "--read-ratio"),
        (vec!["--threads", "0"], "--threads"),
        (vec!["--engine", "nvme"], "unknown engine"),
        (vec!["--plot", "/no/such/folder/x.png"], "does not exist"),
        (vec!["--from-json", "x.json"], "--plot"),
        (vec!["--no-such-flag"], "unexpected argument"),
        (vec!["--level", "7"], "unknown RAID level"),
        (vec!["--repeat", "0"], "--repeat"),
        (vec!["--level", "60"], "more than four drives"),
        (vec!["--fill", "zeros"], "unknown fill"),
    ] {
        let mut a = vec!["bench", "mem", "--seconds", "0.2"];
        if !args.contains(&"--engine") {
            a.extend(["--engine", "dram"]);
        }
        if !args.contains(&"--map") {
            a.extend(["--map", "8M"]);
        }
        a.extend(args.iter());
        let o = ts(&a);
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// Runs `bench mem --engine ENGINE ARGS --seconds 1 --dir TMP --json` (None where
/// userfaultfd is not usable), checks it succeeded, named its engine and left no file in TMP.
fn tierstack_run_json(engine: &str, args: &[&str]) -> Option<serde_json::Value> {
    if !uffd_usable() {
        return None;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_str().expect("utf8");
    let mut all = vec!["bench", "mem", "--engine", engine];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--seconds", "1", "--dir", dir, "--json"]);
    let o = ts(&all);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(j["engine"], engine);
    assert_eq!(
        std::fs::read_dir(tmp.path()).expect("dir").count(),
        0,
        "drive files left behind"
    );
    Some(j)
}

#[test]
fn tierstack_engine_runs_in_a_userfaultfd_region_and_cleans_up() {
    let Some(j) = tierstack_run_json(
        "tierstack",
        &["--map", "96M", "--dram", "32M", "--level", "5"],
    ) else {
        return;
    };
    assert!(j["accesses"].as_u64().unwrap_or(0) > 1000, "{j}");
    // The pager's own account of the timed phase: every fault it served from the store was
    // timed.
    let p = &j["pager"];
    assert!(p["faults"].as_u64().unwrap_or(0) > 0, "{j}");
    assert!(p["store_reads"].as_u64().unwrap_or(0) <= p["faults"].as_u64().unwrap_or(0));
    if p["store_reads"].as_u64().unwrap_or(0) > 0 {
        assert!(p["store_read_mean_us"].as_f64().unwrap_or(0.0) > 0.0, "{j}");
        // What tierstack adds per miss beyond the device read (issue 14's measure).
        let over = p["overhead_us_per_miss"]
            .as_f64()
            .expect("overhead_us_per_miss");
        let fault = p["store_fault_mean_us"].as_f64().unwrap_or(0.0);
        let read = p["store_read_mean_us"].as_f64().unwrap_or(0.0);
        assert!(over >= 0.0 && over <= fault + 0.01, "{j}");
        assert!((over - (fault - read).max(0.0)).abs() < 1.0, "{j}");
    }
}

#[test]
fn tierstack_dram_engine_pages_without_drives() {
    let Some(j) = tierstack_run_json(
        "tierstack-dram",
        &["--map", "64M", "--dram", "16M", "--page", "4K"],
    ) else {
        return;
    };
    // A map four times the budget: most accesses fault, and every fault that finds its page
    // evicted reads it back from the (in-memory) store; no drive file is made.
    let p = &j["pager"];
    assert!(p["faults"].as_u64().unwrap_or(0) > 1000, "{j}");
    assert!(p["store_reads"].as_u64().unwrap_or(0) > 0, "{j}");
    assert!(p["evictions"].as_u64().unwrap_or(0) > 0, "{j}");
}

#[test]
fn plot_draws_a_png_of_the_histograms() {
    let tmp = tempfile::tempdir().expect("tmp");
    let png = tmp.path().join("OUT.png");
    let json = tmp.path().join("r.json");
    let png_s = png.to_str().expect("utf8");
    let mut args: Vec<&str> = "bench mem --engine dram --map 64M --dram 64M --seconds 1 --json"
        .split(' ')
        .collect();
    args.extend(["--plot", png_s]);
    let o = ts(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    // Without a font the error names the package to install (fonts-dejavu-core; CI installs it).
    assert!(o.status.success(), "{err}");
    // --json output stays pure JSON with --plot.
    let _: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let check = |p: &std::path::Path| {
        let b = std::fs::read(p).expect("png written");
        assert!(b.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        // 1600x1000 RGB: width and height in the IHDR chunk; compressed to a sane size.
        assert_eq!(&b[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes([b[16], b[17], b[18], b[19]]), 1600);
        assert_eq!(u32::from_be_bytes([b[20], b[21], b[22], b[23]]), 1000);
        assert!((20_000..4_800_000).contains(&b.len()), "size {}", b.len());
    };
    check(&png);

    // Drawn again from the saved JSON.
    std::fs::write(&json, &o.stdout).expect("write json");
    let again = tmp.path().join("again.png");
    let redraw = || {
        let (png, json) = (again.to_str().expect("utf8"), json.to_str().expect("utf8"));
        ts(&["bench", "mem", "--plot", png, "--from-json", json])
    };
    let o = redraw();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check(&again);

    // A folder that does not exist: one line, non-zero exit, before any run.
    let bad = tmp.path().join("missing/OUT.png");
    let t0 = std::time::Instant::now();
    let bad_s = bad.to_str().expect("utf8");
    let o = ts(&[
        "bench",
        "mem",
        "--engine",
        "dram",
        "--seconds",
        "5",
        "--plot",
        bad_s,
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(
        t0.elapsed().as_secs_f64() < 4.0,
        "the bad path was found only after the run"
    );
    assert!(!bad.exists());

    // Saved JSON that is not a bench mem report: one line.
    std::fs::write(&json, "{\"x\": 1}").expect("write json");
    let o = redraw();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not bench mem JSON"), "{err}");
}

#[test]
fn compare_with_repeat_reports_each_engines_median() {
    let _switches = host_switches();
    if !uffd_usable() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_str().expect("utf8");
    let o = ts(&[
        "bench",
        "mem",
        "--compare",
        "--repeat",
        "3",
        "--map",
        "64M",
        "--dram",
        "32M",
        "--seconds",
        "0.5",
        "--dir",
        dir,
        "--json",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    if swap_unavailable(&o, "compare_with_repeat_reports_each_engines_median") {
        return;
    }
    assert!(o.status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(j["repeat"], 3);
    let rounds = j["rounds_accesses_per_s"].as_array().expect("rounds");
    assert_eq!(rounds.len(), 3);
    // The reported run of each engine is the median of its three rounds.
    for (col, name) in [(0, "tierstack"), (1, "kernel_swap")] {
        let mut v: Vec<f64> = rounds
            .iter()
            .map(|r| r[col].as_f64().unwrap_or(-1.0))
            .collect();
        v.sort_by(f64::total_cmp);
        assert_eq!(
            j[name]["accesses_per_s"].as_f64(),
            Some(v[1]),
            "{name}: {j}"
        );
    }
    let t = j["tierstack"]["accesses_per_s"].as_f64().unwrap_or(0.0);
    let k = j["kernel_swap"]["accesses_per_s"].as_f64().unwrap_or(1.0);
    let r = j["ratio"].as_f64().unwrap_or(0.0);
    assert!((r - t / k).abs() < 1e-9, "{j}");
    assert_eq!(std::fs::read_dir(tmp.path()).expect("dir").count(), 0);
}

/// `--fill random` and `--fill floats` write whole pages in the warm-up and still measure.
#[test]
fn fills_run() {
    for fill in ["random", "floats", "one-word"] {
        let o = ts(&[
            "bench",
            "mem",
            "--engine",
            "dram",
            "--map",
            "16M",
            "--seconds",
            "0.2",
            "--fill",
            fill,
            "--json",
        ]);
        assert!(
            o.status.success(),
            "{fill}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        assert!(v["accesses"].as_u64().unwrap_or(0) > 0, "{fill}: {v}");
    }
}

/// Whether the test can run programs under `run` and kernel swap; says so when it cannot.
fn root_and_uffd(test: &str) -> bool {
    let ok = rustix::process::geteuid().is_root() && uffd_usable();
    if !ok {
        eprintln!("SKIP {test}: needs root and userfaultfd");
    }
    ok
}

/// The user's own program (`bench mem --compare -- CMD`): timed under `tierstack run` and
/// under kernel swap with the memory the program had under tierstack, plain and with zswap;
/// each engine really paged or swapped, every engine printed the same, and the swap file,
/// the swap area, the cgroup and the zswap switch are as before.
#[test]
fn a_program_is_compared_under_run_and_kernel_swap() {
    let _switches = host_switches();
    if !root_and_uffd("a_program_is_compared_under_run_and_kernel_swap") {
        return;
    }
    let zswap = "/sys/module/zswap/parameters/enabled";
    let zswap_before = std::fs::read_to_string(zswap).ok();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_str().expect("utf8");
    let prog = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/programs/sparse_pages.py"
    );
    let o = ts(&[
        "bench",
        "mem",
        "--compare",
        "--dram",
        "64M",
        "--dir",
        dir,
        "--swap",
        "512M",
        "--json",
        "--",
        "python3",
        prog,
        "192",
    ]);
    if swap_unavailable(&o, "a_program_is_compared_under_run_and_kernel_swap") {
        return;
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let t = &j["tierstack"];
    let k = &j["kernel_swap"];
    assert_eq!(t["engine"], "tierstack");
    assert_eq!(k["engine"], "kernel-swap");
    // The program ran to the end under both and printed the same.
    assert_eq!(t["output_tail"], "ok 49152", "{j}");
    assert_eq!(j["same_output"], true, "{j}");
    assert!(t["wall_s"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(k["wall_s"].as_f64().unwrap_or(0.0) > 0.0);
    // tierstack's figure comes from `run` itself, at its defaults: it paged.
    assert!(
        j["departures"].as_array().is_some_and(|d| d.is_empty()),
        "{j}"
    );
    assert!(t["run"]["faults"].as_u64().unwrap_or(0) > 0, "{j}");
    assert_eq!(t["memory_bytes"].as_u64(), Some(64 << 20));
    // Kernel swap got the program's peak RSS under run, and swapped.
    let peak = t["peak_rss_bytes"].as_u64().unwrap_or(0);
    assert!(peak > 64 << 20, "{j}");
    assert_eq!(k["memory_bytes"].as_u64(), Some(peak), "{j}");
    assert!(k["swap_peak_bytes"].as_u64().unwrap_or(0) > 0, "{j}");
    let ratio = j["ratio"].as_f64().unwrap_or(0.0);
    let expect = k["wall_s"].as_f64().unwrap_or(0.0) / t["wall_s"].as_f64().unwrap_or(1.0);
    assert!((ratio - expect).abs() < 1e-6, "{j}");
    // zswap, where the switch could be set: its pool held the swapped pages compressed.
    if !j["kernel_swap_zswap"].is_null() {
        let z = &j["kernel_swap_zswap"];
        assert_eq!(z["engine"], "kernel-swap-zswap");
        assert!(z["zswap"]["stored_bytes"].as_u64().unwrap_or(0) > 0, "{j}");
        assert!(z["zswap"]["ratio"].as_f64().unwrap_or(0.0) > 4.0, "{j}");
    }
    assert_eq!(
        std::fs::read_dir(tmp.path()).expect("dir").count(),
        0,
        "files left behind"
    );
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    assert!(!swaps.contains(dir), "swap still on: {swaps}");
    assert_eq!(std::fs::read_to_string(zswap).ok(), zswap_before);
}

/// A program that fails or runs past `--timeout` ends the benchmark with one line, and a
/// program that outlives its bound is stopped.
#[test]
fn a_failing_or_endless_program_gets_one_line() {
    use std::time::{Duration, Instant};
    if !root_and_uffd("a_failing_or_endless_program_gets_one_line") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_str().expect("utf8");
    let o = ts(&[
        "bench",
        "mem",
        "--engine",
        "tierstack",
        "--dram",
        "64M",
        "--dir",
        dir,
        "--",
        "false",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("exited with status 1 under tierstack"),
        "{err}"
    );
    let mark = format!("{}", std::process::id());
    let t0 = Instant::now();
    let o = ts(&[
        "bench",
        "mem",
        "--engine",
        "kernel-swap",
        "--dram",
        "64M",
        "--dir",
        dir,
        "--swap",
        "64M",
        "--timeout",
        "2",
        "--",
        "sleep",
        "600",
        &mark,
    ]);
    if swap_unavailable(&o, "a_failing_or_endless_program_gets_one_line") {
        return;
    }
    assert!(!o.status.success());
    assert!(t0.elapsed() < Duration::from_secs(60));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("ran longer than 2 s under kernel-swap"),
        "{err}"
    );
    let left = std::process::Command::new("pgrep")
        .args(["-f", &format!("sleep 600 {mark}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(!left, "the program outlived its bound");
    assert_eq!(std::fs::read_dir(tmp.path()).expect("dir").count(), 0);
    // Flags of the synthetic workload do not apply to a program.
    let o = ts(&[
        "bench",
        "mem",
        "--compare",
        "--pattern",
        "linear",
        "--",
        "true",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--pattern"));
}
