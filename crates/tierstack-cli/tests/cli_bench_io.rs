//! `tierstack bench io` through the real binary and real MPI ranks (mpirun): a small sweep
//! with 1 and 2 ranks on plain folders (JSON figures consistent with IOR's arithmetic, the
//! summary table's shape, shared file and random 4K), through a tierstack mount when root and
//! /dev/fuse allow it, and the one-line errors (MPI missing, bad sizes). Skipped, saying why,
//! when MPI is not installed (.ci/run installs openmpi-bin and libopenmpi-dev).

mod common;
use common::{f, has_root_and_fuse, s, ts, BIN};

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

const MIB: f64 = 1048576.0;

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

fn mpi_or_skip(test: &str) -> bool {
    if on_path("mpirun") && on_path("mpicc") {
        return true;
    }
    eprintln!("SKIP {test}: mpirun or mpicc not on PATH (install openmpi-bin libopenmpi-dev)");
    false
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "tierstack failed: {}\nstdout: {}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8(o.stdout.clone()).expect("utf8 output")
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

/// Every row's figures follow from its own phase times, as IOR computes them.
fn check_rows(j: &serde_json::Value, target: &str, ranks: &[usize], blocks: &[u64], spr: u64) {
    let rows: Vec<&serde_json::Value> = j["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["target"] == target)
        .collect();
    assert_eq!(rows.len(), ranks.len() * blocks.len(), "{target}: {j}");
    for r in rows {
        for k in [
            "target",
            "ranks",
            "block",
            "api",
            "file_per_process",
            "write_mibps",
            "read_mibps",
            "write_ops",
            "read_ops",
            "reps",
        ] {
            assert!(!r[k].is_null(), "row lacks {k}: {r}");
        }
        let n = r["ranks"].as_u64().expect("ranks");
        let block = r["block"].as_u64().expect("block");
        assert!(
            ranks.contains(&(n as usize)) && blocks.contains(&block),
            "{r}"
        );
        assert_eq!(r["api"], "POSIX");
        let agg = r["aggregate_bytes"].as_u64().expect("aggregate_bytes");
        assert_eq!(agg, n * spr, "{r}");
        assert_eq!(r["read_errors"].as_u64(), Some(0), "{r}");
        let reps = r["reps"].as_u64().expect("reps") as usize;
        for op in ["write", "read"] {
            let secs: Vec<f64> = r[format!("{op}_s")]
                .as_array()
                .expect("times")
                .iter()
                .map(|x| x.as_f64().expect("time"))
                .collect();
            assert_eq!(secs.len(), reps);
            assert!(secs.iter().all(|t| *t > 0.0 && *t < 120.0), "{r}");
            let bws: Vec<f64> = secs.iter().map(|t| agg as f64 / MIB / t).collect();
            let mean = bws.iter().sum::<f64>() / bws.len() as f64;
            let max = bws.iter().copied().fold(f64::MIN, f64::max);
            let min = bws.iter().copied().fold(f64::MAX, f64::min);
            let st = &r[format!("{op}_mib")];
            assert!(close(f(r, &format!("{op}_mibps")), mean), "{op} mean: {r}");
            assert!(close(f(st, "max"), max) && close(f(st, "min"), min), "{r}");
            assert!(f(st, "max") >= f(st, "mean") && f(st, "mean") >= f(st, "min"));
            // OPs are transfers per second: MiB/s scaled by the transfer size.
            assert!(
                close(f(r, &format!("{op}_ops")), mean * MIB / block as f64),
                "{op} ops: {r}"
            );
        }
    }
}

/// The `Summary of all tests:` table: IOR's header, one write and one read line per row,
/// every line with the header's number of fields.
fn check_summary(text: &str, rows: usize) -> Vec<Vec<String>> {
    const HEADER: &str = "Operation   Max(MiB)   Min(MiB)  Mean(MiB)     StdDev   Max(OPs)   Min(OPs)  Mean(OPs)     StdDev    Mean(s) Stonewall(s) Stonewall(MiB) Test# #Tasks tPN reps fPP reord reordoff reordrand seed segcnt   blksiz    xsize aggs(MiB)   API RefNum";
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| *l == "Summary of all tests:")
        .unwrap_or_else(|| panic!("no summary table:\n{text}"));
    assert_eq!(lines[at + 1], HEADER);
    let width = HEADER.split_whitespace().count();
    let data: Vec<Vec<String>> = lines[at + 2..]
        .iter()
        .take_while(|l| l.starts_with("write") || l.starts_with("read"))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    assert_eq!(data.len(), 2 * rows, "{text}");
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d.len(), width, "{d:?}");
        assert_eq!(d[0], if i % 2 == 0 { "write" } else { "read" });
        assert_eq!(d[25], "POSIX");
        for c in &d[1..10] {
            c.parse::<f64>().expect("a figure");
        }
    }
    data
}

fn left_behind(target: &Path) -> Vec<String> {
    fs::read_dir(target)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn plain_sweep_json_and_ior_table() {
    if !mpi_or_skip("plain_sweep_json_and_ior_table") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let target = t.path().join("pfs");
    let work = t.path().join("work");
    fs::create_dir(&target).unwrap();
    fs::create_dir(&work).unwrap();
    let o = ts(&[
        "bench",
        "io",
        "--target",
        s(&target),
        "--dir",
        s(&work),
        "--ranks",
        "1,2",
        "--block",
        "256K,1M",
        "--size-per-rank",
        "4M",
        "--reps",
        "2",
        "--fsync",
        "--verify",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(ok(&o).trim()).expect("one JSON object");
    check_rows(&j, "plain", &[1, 2], &[256 << 10, 1 << 20], 4 << 20);
    assert!(j["drain_seconds"].is_null(), "no mount, no drain: {j}");
    assert!(
        j["host"]["mpi"].as_str().unwrap_or("").contains("mpirun"),
        "{j}"
    );
    assert!(
        left_behind(&target).is_empty(),
        "{:?}",
        left_behind(&target)
    );
    assert!(left_behind(&work).is_empty(), "{:?}", left_behind(&work));

    // Shared file, random 4 KiB transfers, text output: IOR's table, parsed back.
    let o = ts(&[
        "bench",
        "io",
        "--target",
        s(&target),
        "--dir",
        s(&work),
        "--ranks",
        "2",
        "--block",
        "4K",
        "--size-per-rank",
        "1M",
        "--shared",
        "--random",
        "--verify",
    ]);
    let text = ok(&o);
    let d = check_summary(&text, 1);
    // #Tasks 2, fPP 0 (shared), reord 1 (rank shift), blksiz 1 MiB, xsize 4 KiB, 2 MiB in all.
    assert_eq!(
        (&d[0][13][..], &d[0][16][..], &d[0][17][..]),
        ("2", "0", "1")
    );
    assert_eq!((&d[0][22][..], &d[0][23][..]), ("1048576", "4096"));
    assert_eq!(d[0][24], "2.0");
    assert!(text.contains("single shared file") && text.contains("random offsets"));
    assert!(text.contains("write MiB/s (mean)") && text.contains("read MiB/s (mean)"));
    assert!(
        left_behind(&target).is_empty(),
        "{:?}",
        left_behind(&target)
    );
}

#[test]
fn through_a_mount_with_the_ratio() {
    if !mpi_or_skip("through_a_mount_with_the_ratio") {
        return;
    }
    if !has_root_and_fuse() {
        eprintln!("SKIP through_a_mount_with_the_ratio: needs root and /dev/fuse for the mount");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let target = t.path().join("pfs");
    let work = t.path().join("work");
    fs::create_dir(&target).unwrap();
    fs::create_dir(&work).unwrap();
    let o = ts(&[
        "bench",
        "io",
        "--target",
        s(&target),
        "--dir",
        s(&work),
        "--ranks",
        "1,2",
        "--block",
        "1M",
        "--size-per-rank",
        "8M",
        "--fsync",
        "--verify",
        "--mount",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(ok(&o).trim()).expect("one JSON object");
    check_rows(&j, "plain", &[1, 2], &[1 << 20], 8 << 20);
    check_rows(&j, "mount", &[1, 2], &[1 << 20], 8 << 20);
    let ratios = j["ratios"].as_array().expect("ratios");
    assert_eq!(ratios.len(), 2, "{j}");
    for q in ratios {
        let m = j["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["target"] == "mount" && r["ranks"] == q["ranks"])
            .expect("mount row");
        let p = j["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["target"] == "plain" && r["ranks"] == q["ranks"])
            .expect("plain row");
        assert!(
            close(f(q, "write"), f(m, "write_mibps") / f(p, "write_mibps")),
            "{q}"
        );
        assert!(
            close(f(q, "read"), f(m, "read_mibps") / f(p, "read_mibps")),
            "{q}"
        );
        assert!(f(m, "drain_seconds") >= 0.0);
    }
    let drain = f(&j, "drain_seconds");
    let sum: f64 = j["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["drain_seconds"].as_f64())
        .sum();
    assert!(close(drain, sum), "{j}");
    // Unmounted, and nothing left in the target or the work folder.
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    assert!(!mounts.contains(s(&work)), "{mounts}");
    assert!(
        left_behind(&target).is_empty(),
        "{:?}",
        left_behind(&target)
    );
    assert!(left_behind(&work).is_empty(), "{:?}", left_behind(&work));
}

#[test]
fn errors_are_one_line_naming_the_fix() {
    let t = tempfile::tempdir().unwrap();
    // No MPI on PATH.
    let o = Command::new(BIN)
        .args(["bench", "io", "--target", s(t.path())])
        .env("PATH", t.path().join("empty"))
        .output()
        .expect("run tierstack");
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("openmpi-bin"), "{e}");
    // Sizes that do not divide.
    let o = ts(&[
        "bench",
        "io",
        "--target",
        s(t.path()),
        "--block",
        "3M",
        "--size-per-rank",
        "4M",
    ]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("not a multiple of --block 3M"), "{e}");
    // A target that is not there.
    let o = ts(&["bench", "io", "--target", s(&t.path().join("nope"))]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not a directory"));
    // An unknown launcher, and srun outside a SLURM allocation (or without SLURM).
    let o = ts(&[
        "bench",
        "io",
        "--target",
        s(t.path()),
        "--launcher",
        "aprun",
    ]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("use mpirun or srun"), "{e}");
    let o = Command::new(BIN)
        .args(["bench", "io", "--target", s(t.path()), "--launcher", "srun"])
        .env_remove("SLURM_JOB_ID")
        .output()
        .expect("run tierstack");
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(
        e.contains("needs a SLURM allocation") || e.contains("install the SLURM client"),
        "{e}"
    );
    assert!(
        left_behind(t.path()).is_empty(),
        "{:?}",
        left_behind(t.path())
    );
}
