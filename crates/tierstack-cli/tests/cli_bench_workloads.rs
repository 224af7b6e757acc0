//! `tierstack bench workloads` through the real binary, at small sizes: every workload runs in
//! the plain folder and through a mount with non-zero times, the mount's BACKING ends with the
//! same tree as the plain folder, the drains finish, nothing is left under --dir, and an
//! existing --dir is refused (exit 2).

mod common;
use common::{root_with_fuse, s, ts};

#[test]
fn an_existing_dir_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let o = ts(&["bench", "workloads", "--dir", s(tmp.path())]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("exists") && err.contains("--dir") && err.trim().lines().count() == 1,
        "{err}"
    );
    let o = ts(&[
        "bench",
        "workloads",
        "--dir",
        s(&tmp.path().join("new")),
        "--only",
        "tree,nope",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("tree,pip,h5py,mpi-logs"));
    assert!(!tmp.path().join("new").exists());
}

#[test]
fn every_workload_runs_on_both_sides() {
    if !root_with_fuse() {
        return;
    }
    every_workload_runs(false);
}

/// Issue 39: the same real programs (tar, git, pip, python, h5py, mpirun and its ranks) with
/// the interception client preloaded on the mount's side: they succeed, and the tree the
/// mount's BACKING holds afterwards is the plain folder's.
#[test]
fn every_workload_runs_under_the_interception_client() {
    if !root_with_fuse() {
        return;
    }
    every_workload_runs(true);
}

fn every_workload_runs(client: bool) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("wl");
    let args = [
        "bench",
        "workloads",
        "--dir",
        s(&dir),
        "--tree-entries",
        "600",
        "--pip-modules",
        "10",
        "--h5-datasets",
        "200",
        "--ranks",
        "2",
        "--log-lines",
        "2000",
        "--drain-timeout",
        "120",
        "--timeout",
        "120",
        "--json",
    ];
    let mut args = args.to_vec();
    if client {
        args.push("--client");
    }
    let o = ts(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let ws = j["workloads"].as_array().expect("workloads");
    assert_eq!(ws.len(), 4, "{j}");
    assert_eq!(j["client"], client, "{j}");
    for w in ws {
        let name = w["workload"].as_str().unwrap_or("?");
        if let Some(why) = w["skipped"].as_str() {
            // Only a missing tool, named with its package (.ci/run installs them all).
            assert!(why.contains("apt-get install"), "{name}: {why}");
            assert!(
                std::env::var_os("CI").is_none(),
                "{name} skipped in CI: {why}"
            );
            eprintln!("SKIP {name}: {why}");
            continue;
        }
        let phases = w["phases"].as_array().expect("phases");
        assert!(!phases.is_empty(), "{name}: {w}");
        for p in phases {
            for k in ["plain_s", "mount_s", "ratio"] {
                let v = p[k].as_f64().unwrap_or(0.0);
                assert!(v > 0.0 && v.is_finite(), "{name} {k} = {v}: {p}");
            }
        }
        assert_eq!(w["drained"], true, "{name}: {w}");
        assert_eq!(w["drain_s"].as_array().map(|a| a.len()), Some(1), "{w}");
        if name == "tree" {
            assert_eq!(w["same_as_plain"], true, "{w}");
        }
    }
    assert!(j["host"]["cpus"].as_u64().unwrap_or(0) >= 1, "{j}");
    assert!(!dir.exists(), "left behind under --dir");
    assert_eq!(
        std::fs::read_dir(tmp.path()).expect("list").count(),
        0,
        "left behind"
    );
}
