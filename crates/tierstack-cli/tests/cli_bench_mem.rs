//! `tierstack bench mem` through the real binary.

use std::process::Command;

fn ts(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tierstack"))
        .args(args)
        .output()
        .expect("run")
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
    // Environment limits, not tierstack's: no root, no swap or cgroup support, or a swap file
    // that other processes on the machine filled while the worker ran (swap is global).
    if !o.status.success()
        && (err.contains("needs root")
            || err.contains("swapon failed")
            || err.contains("no memory cgroup")
            || err.contains("made no progress"))
    {
        eprintln!("SKIP kernel_swap_engine_swaps_and_cleans_up: {err}");
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

#[test]
fn bad_options_get_one_line() {
    for (args, needle) in [
        (vec!["--map", "abc"], "invalid size"),
        (vec!["--dram", "0"], "--dram"),
        (vec!["--pattern", "spiral"], "unknown pattern"),
        (vec!["--read-ratio", "150"], "--read-ratio"),
        (vec!["--threads", "0"], "--threads"),
        (vec!["--engine", "nvme"], "unknown engine"),
        (vec!["--plot", "x.png"], "not built yet"),
        (vec!["--no-such-flag"], "unexpected argument"),
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

#[test]
fn tierstack_engine_runs_in_a_userfaultfd_region_and_cleans_up() {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
        .is_err()
    {
        eprintln!("SKIP: /dev/userfaultfd not usable here");
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_str().expect("utf8");
    let o = ts(&[
        "bench",
        "mem",
        "--engine",
        "tierstack",
        "--map",
        "96M",
        "--dram",
        "32M",
        "--seconds",
        "1",
        "--dir",
        dir,
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(j["engine"], "tierstack");
    assert!(j["accesses"].as_u64().unwrap_or(0) > 1000, "{j}");
    assert_eq!(
        std::fs::read_dir(tmp.path()).expect("dir").count(),
        0,
        "drive files left behind"
    );
}
