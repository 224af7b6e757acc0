//! `tierstack bench cluster` end to end at N = 4 on the real test bed (MooseFS, namespaces):
//! file per process straight into the shared system, through node-local buffers, and through
//! buffers with site-wide drain slots; every byte read back from the shared system.

mod common;

use std::process::Command;

use common::BIN;

/// A folder for the test bed's root, or None (SKIP printed) without root or /dev/fuse; fails
/// with what to install where MooseFS is missing.
fn bed_root(prefix: &str) -> Option<tempfile::TempDir> {
    if !common::root_with_fuse() {
        eprintln!("SKIP: needs root and /dev/fuse");
        return None;
    }
    assert!(
        std::path::Path::new("/usr/sbin/mfsmaster").exists(),
        "the MooseFS packages are missing: apt-get install moosefs-master moosefs-chunkserver moosefs-client"
    );
    Some(
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/var/lib")
            .expect("root"),
    )
}

#[test]
fn bench_cluster_at_four_nodes_loses_nothing_and_reports_each_mode() {
    let Some(root) = bed_root("ts-bench-cluster-") else {
        return;
    };
    let o = Command::new(BIN)
        .args([
            "bench",
            "cluster",
            "--nodes",
            "4",
            "--ranks",
            "2",
            "--size-per-rank",
            "8M",
            "--small-files",
            "20",
            "--throttle",
            "50",
            "--slots",
            "2",
            "--json",
            "--root",
        ])
        .arg(root.path())
        .output()
        .expect("run bench cluster");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(&out).expect("json");
    let modes = r["modes"].as_array().expect("modes");
    let names: Vec<&str> = modes.iter().filter_map(|m| m["mode"].as_str()).collect();
    assert_eq!(
        names,
        ["direct", "buffered", "buffered, 2 drain slots"],
        "{out}"
    );
    for m in modes {
        // 4 nodes x 2 ranks, each a file and 20 small files.
        assert_eq!(m["files"], 4 * 2 * 21, "{m}");
        assert_eq!(m["missing"], 0, "{m}");
        assert_eq!(m["wrong"], 0, "{m}");
        let (w, s) = (
            m["write_s"].as_f64().expect("write_s"),
            m["in_shared_s"].as_f64().expect("in_shared_s"),
        );
        assert!(w > 0.0 && s >= w, "{m}");
        assert!(m["probe"]["count"].as_u64().unwrap_or(0) > 0, "{m}");
    }
    assert!(r["probe_idle"]["count"].as_u64().unwrap_or(0) > 0, "{out}");
    // The test bed is gone: no namespace of it is left.
    let ns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    let left = String::from_utf8_lossy(&ns.stdout).into_owned();
    assert!(!left.contains("-node1"), "namespaces left: {left}");
}

/// `bench cluster --stage-in` at N = 4: the shared system serves the inputs about once by
/// fan-out and by the SLURM Prolog's fan-out into buffers over stage_out (about N times when
/// each node reads), every node's copy matches the inputs
/// (checksums, sizes, mtimes) through its mount, the buffers hold them clean (nothing dirty,
/// nothing to drain), and the inputs in the shared system are unchanged afterwards.
#[test]
fn bench_cluster_stage_in_fans_out_reading_the_inputs_once() {
    let Some(root) = bed_root("ts-bench-stagein-") else {
        return;
    };
    let t = std::time::Instant::now();
    let o = Command::new(BIN)
        .args([
            "bench",
            "cluster",
            "--stage-in",
            "--nodes",
            "4",
            "--input-files",
            "3",
            "--input-size",
            "8M",
            "--json",
            "--root",
        ])
        .arg(root.path())
        .output()
        .expect("run bench cluster --stage-in");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(t.elapsed().as_secs() < 180, "took {:?}", t.elapsed());
    let r: serde_json::Value = serde_json::from_str(&out).expect("json");
    let si = &r["stage_in"];
    assert_eq!(si["input_bytes"], 3 * (8 << 20), "{out}");
    let modes = si["modes"].as_array().expect("modes");
    assert_eq!(modes.len(), 3, "{out}");
    for m in modes {
        assert_eq!(m["nodes_identical"], 4, "{m}");
        assert_eq!(m["dirty_bytes"], 0, "{m}");
        assert_eq!(m["pending_ops"], 0, "{m}");
        assert_eq!(m["drained_bytes"], 0, "{m}");
        assert_eq!(m["inputs_unchanged"], true, "{m}");
        assert_eq!(m["fell_back"], 0, "{m}");
    }
    let x = |m: &serde_json::Value| m["sent_x_inputs"].as_f64().expect("sent_x_inputs");
    // Each node reading: about 4x; fan-out: about 1x (TCP headers, MooseFS' own traffic).
    assert!(x(&modes[0]) > 3.5, "{out}");
    assert!(x(&modes[1]) > 0.95 && x(&modes[1]) < 1.3, "{out}");
    assert_eq!(modes[1]["nodes_from_shared"], 3 * (8 << 20), "{out}");
    // The SLURM Prolog itself (`tierstack slurm prolog` on every node, buffers over the
    // shared stage_out): the inputs read once, written into stage_out once by node 0, and
    // adopted by every node's buffer as clean cache (nothing dirty, nothing drained).
    let p = &modes[2];
    assert!(x(p) > 0.95 && x(p) < 1.3, "{out}");
    assert_eq!(p["nodes_from_shared"], 3 * (8 << 20), "{out}");
    assert_eq!(p["adopted_files"], 4 * 3, "{out}");
    assert_eq!(p["published_files"], 3, "{out}");
    assert_eq!(p["stage_out_identical"], true, "{out}");
}
