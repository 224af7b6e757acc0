//! `tierstack bench checkpoint` through the real binary: JSON consistency, the throttled
//! backing file system, and that nothing (loop device, mount, cgroup, image) is left behind.

mod common;
use common::{f, is_root, s, ts, BIN};

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether this machine can run the throttled variant (root, loop devices, a blkio cgroup).
fn can_throttle() -> bool {
    let root = is_root();
    let cg = Path::new("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device").exists()
        || fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .map(|c| c.split_whitespace().any(|x| x == "io"))
            .unwrap_or(false);
    let tools = ["losetup", "mkfs.ext4"].iter().all(|t| {
        Command::new(t)
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    });
    root && cg && tools
}

/// Nothing of a run under `dir` is left: no loop device on an image there, no mount there,
/// no benchmark cgroup of the benchmark's process, and `dir` itself empty.
fn assert_clean(dir: &Path, bench_pid: Option<u32>) {
    let dir = fs::canonicalize(dir).expect("canonicalize");
    let d = dir.to_string_lossy().to_string();
    let loops = Command::new("losetup")
        .arg("-a")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    assert!(!loops.contains(&d), "loop device left: {loops}");
    let mounts = fs::read_to_string("/proc/mounts").expect("mounts");
    assert!(!mounts.contains(&d), "mount left: {mounts}");
    if let Some(p) = bench_pid {
        for cg in ["/sys/fs/cgroup/blkio", "/sys/fs/cgroup"] {
            let c = Path::new(cg).join(format!("tierstack-ckpt-{p}"));
            assert!(!c.exists(), "cgroup left: {}", c.display());
        }
    }
    let left: Vec<_> = fs::read_dir(&dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").path())
        .collect();
    assert!(left.is_empty(), "files left: {left:?}");
}

/// The benchmark's pid is in the name of its work folder, which the JSON's backing path shows
/// when BACKING is under it.
fn bench_pid(j: &serde_json::Value) -> Option<u32> {
    let b = j["backing"].as_str()?;
    let i = b.find("tierstack-ckpt-")? + "tierstack-ckpt-".len();
    b[i..].split('/').next()?.parse().ok()
}

fn check_consistent(j: &serde_json::Value, procs: u64, size: u64) {
    assert_eq!(j["procs"], procs, "{j}");
    assert_eq!(j["file_size"], size, "{j}");
    assert_eq!(j["bytes_total"], procs * size, "{j}");
    let d = f(j, "direct_output_s");
    assert!(d > 0.0, "{j}");
    let mbs = f(j, "direct_mb_s");
    let want = (procs * size) as f64 / 1e6 / d;
    assert!((mbs - want).abs() / want < 1e-6, "{j}");
    let runs = j["runs"].as_array().expect("runs");
    assert_eq!(runs.len() as u64, j["repeat"].as_u64().expect("repeat"));
    let mean = runs
        .iter()
        .map(|r| r["direct_output_s"].as_f64().expect("run"))
        .sum::<f64>()
        / runs.len() as f64;
    assert!((mean - d).abs() < 1e-9, "{j}");
    if j["direct_only"] == true {
        assert!(j["mount_output_s"].is_null(), "{j}");
        assert!(j["drain_s"].is_null(), "{j}");
        assert!(j["speedup"].is_null(), "{j}");
    } else {
        let m = f(j, "mount_output_s");
        let dr = f(j, "drain_s");
        assert!(m > 0.0 && dr >= 0.0, "{j}");
        assert!((f(j, "speedup") - d / m).abs() < 1e-6, "{j}");
        // The drain window runs from the first byte drained (after the writers started) to
        // the end of the drain.
        let w = f(j, "drain_window_s");
        assert!(w > 0.0 && w <= m + dr + 1e-6, "{j}");
        let dm = f(j, "drain_mb_s");
        assert!(
            (dm - (procs * size) as f64 / 1e6 / w).abs() / dm < 1e-6,
            "{j}"
        );
        assert!(j["mode"] == "sync" || j["mode"] == "async", "{j}");
    }
}

#[test]
fn direct_only_json_is_consistent_and_leaves_nothing() {
    let t = tempfile::tempdir().expect("tmp");
    let backing = t.path().join("pfs");
    let work = t.path().join("work");
    fs::create_dir_all(&backing).expect("mkdir");
    let o = ts(&[
        "bench",
        "checkpoint",
        "--procs",
        "6",
        "--file-size",
        "1M",
        "--backing",
        s(&backing),
        "--dir",
        s(&work),
        "--direct-only",
        "--repeat",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    check_consistent(&j, 6, 1 << 20);
    assert_eq!(j["backing_fs"], "directory as given");
    assert!(j["throttle_mb_s"].is_null());
    assert_clean(&backing, None);
    assert_clean(&work, None);
    // The table.
    let o = ts(&[
        "bench",
        "checkpoint",
        "--procs",
        "2",
        "--file-size",
        "64K",
        "--backing",
        s(&backing),
        "--dir",
        s(&work),
        "--direct-only",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("No tierstack: output s") && text.contains("Run 1") && text.contains("Mean"),
        "{text}"
    );
}

#[test]
fn throttled_backing_is_throttled_and_torn_down() {
    if !can_throttle() {
        eprintln!("skipped: needs root, losetup, mkfs.ext4 and a blkio/io cgroup");
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    // 4 x 3 MiB = 12.6 MB at 25 MB/s: about half a second when the throttle works, a few
    // hundredths of a second without it.
    let o = ts(&[
        "bench",
        "checkpoint",
        "--procs",
        "4",
        "--file-size",
        "3M",
        "--throttle",
        "25",
        "--dir",
        s(t.path()),
        "--direct-only",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    check_consistent(&j, 4, 3 << 20);
    assert_eq!(f(&j, "throttle_mb_s"), 25.0);
    assert!(
        j["backing_fs"]
            .as_str()
            .is_some_and(|b| b.contains("ext4 on /dev/loop") && b.contains("-o sync")),
        "{j}"
    );
    let mbs = f(&j, "direct_mb_s");
    assert!(mbs < 25.0 * 1.6, "the throttle did not hold: {j}");
    assert!(mbs > 25.0 * 0.3, "far below the throttle: {j}");
    assert_clean(t.path(), bench_pid(&j));
}

#[test]
fn ctrl_c_tears_everything_down() {
    if !can_throttle() {
        eprintln!("skipped: needs root, losetup, mkfs.ext4 and a blkio/io cgroup");
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    // 4 x 8 MiB at 5 MB/s: 6.7 s if it ran to the end.
    let child = Command::new(BIN)
        .args([
            "bench",
            "checkpoint",
            "--procs",
            "4",
            "--file-size",
            "8M",
            "--throttle",
            "5",
            "--dir",
            s(t.path()),
            "--direct-only",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    // Wait until the writers run (the throttled file system is mounted under the folder).
    let d = fs::canonicalize(t.path()).expect("canonicalize");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mounts = fs::read_to_string("/proc/mounts").expect("mounts");
        if mounts.contains(&*d.to_string_lossy()) {
            break;
        }
        assert!(Instant::now() < deadline, "the backing was never mounted");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let p = rustix::process::Pid::from_raw(pid as i32).expect("pid");
    rustix::process::kill_process(p, rustix::process::Signal::INT).expect("kill -INT");
    let o = child.wait_with_output().expect("wait");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "teardown took {:?}",
        started.elapsed()
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("interrupted"), "{err}");
    assert_clean(t.path(), Some(pid));
}

#[test]
fn bad_options_get_one_line() {
    let t = tempfile::tempdir().expect("tmp");
    let dir = s(t.path());
    let missing = t.path().join("missing");
    let file = t.path().join("file");
    fs::write(&file, b"x").expect("write");
    let busy = t.path().join("busy");
    fs::create_dir_all(busy.join("x")).expect("mkdir");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--procs", "0", "--backing", dir], "--procs"),
        (vec!["--procs", "lots", "--backing", dir], "lots"),
        (vec!["--file-size", "12Q", "--backing", dir], "12Q"),
        (vec!["--file-size", "0", "--backing", dir], "--file-size"),
        (vec![], "--backing is required"),
        (vec!["--backing", s(&missing)], "not a directory"),
        (vec!["--backing", s(&file)], "not a directory"),
        (vec!["--backing", dir, "--throttle", "0"], "--throttle"),
        (vec!["--backing", dir, "--throttle=-3"], "--throttle"),
        (vec!["--backing", dir, "--mode", "fast"], "fast"),
        (vec!["--backing", dir, "--repeat", "0"], "--repeat"),
        (vec!["--backing", dir, "--dram", "lots"], "lots"),
        (
            vec!["--throttle", "10", "--backing", s(&busy)],
            "not an empty directory",
        ),
    ];
    for (extra, why) in cases {
        let mut args = vec!["bench", "checkpoint", "--dir", dir, "--direct-only"];
        args.extend(extra.iter());
        let o = ts(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        let mut left: Vec<_> = fs::read_dir(t.path())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
            .collect();
        left.sort();
        assert_eq!(left, vec!["busy", "file"], "{args:?}");
    }
}

/// Both ways through a real tierstack mount, once `tierstack mount` exists: the JSON is
/// consistent, the drain put every byte in BACKING, and nothing is left behind.
#[test]
fn through_the_mount_when_it_is_built() {
    let probe = ts(&["mount", "--help"]);
    let help = String::from_utf8_lossy(&probe.stdout);
    let t = tempfile::tempdir().expect("tmp");
    let backing = t.path().join("pfs");
    let work = t.path().join("work");
    fs::create_dir_all(&backing).expect("mkdir");
    let mut args = vec![
        "bench",
        "checkpoint",
        "--procs",
        "4",
        "--file-size",
        "2M",
        "--dir",
        s(&work),
        "--json",
    ];
    let throttle = can_throttle();
    if throttle {
        args.extend(["--throttle", "50"]);
    } else {
        args.extend(["--backing", s(&backing)]);
    }
    let o = ts(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() && (err.contains("not built yet") || !help.contains("--mode")) {
        eprintln!("skipped: tierstack mount is not built yet ({})", err.trim());
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert_clean(&work, None);
        return;
    }
    assert!(o.status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    check_consistent(&j, 4, 2 << 20);
    // async is the benchmark's default (seed 004's RAM-disk staging layer).
    assert_eq!(j["mode"], "async", "{j}");
    assert_clean(&work, bench_pid(&j));
    assert_clean(&backing, None);
    // --mode sync stays available and is reported.
    args.extend(["--mode", "sync"]);
    let o = ts(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    check_consistent(&j, 4, 2 << 20);
    assert_eq!(j["mode"], "sync", "{j}");
    assert_clean(&work, bench_pid(&j));
    assert_clean(&backing, None);
}
