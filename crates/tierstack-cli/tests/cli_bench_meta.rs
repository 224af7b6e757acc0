//! `tierstack bench meta` (mdtest's method) through the real binary: the rates of each phase
//! for the plain folder and through a mount, consistent JSON, nothing left behind.

mod common;
use common::{root_with_fuse, s, ts};

fn rates_ok(r: &serde_json::Value) {
    for k in ["create_per_s", "stat_per_s", "read_per_s", "unlink_per_s"] {
        let v = r[k].as_f64().unwrap_or(0.0);
        assert!(v > 0.0 && v.is_finite(), "{k} = {v} in {r}");
    }
}

#[test]
fn plain_and_mount_phases_with_ratios() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let target = tmp.path().join("pfs");
    std::fs::create_dir(&target).expect("mkdir");
    let o = ts(&[
        "bench",
        "meta",
        "--target",
        s(&target),
        "--files",
        "200",
        "--procs",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(j["procs"], 2);
    assert_eq!(j["files_per_proc"], 200);
    rates_ok(&j["results"][0]);
    assert!(j["ratios"].is_null());
    assert_eq!(
        std::fs::read_dir(&target).expect("list").count(),
        0,
        "left behind"
    );
    // Shared directory, text table.
    let o = ts(&[
        "bench",
        "meta",
        "--target",
        s(&target),
        "--files",
        "50",
        "--shared",
    ]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    for w in ["create", "stat", "read", "unlink", "one shared directory"] {
        assert!(text.contains(w), "{text}");
    }
    // Bad input: one line naming the fix.
    let o = ts(&["bench", "meta", "--target", "/nonexistent-dir"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--target") && err.lines().count() == 1,
        "{err}"
    );
    if !root_with_fuse() {
        return;
    }
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).expect("mkdir");
    let o = ts(&[
        "bench",
        "meta",
        "--target",
        s(&target),
        "--files",
        "200",
        "--mount",
        "--dir",
        s(&work),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(j["results"].as_array().map(|a| a.len()), Some(2), "{j}");
    rates_ok(&j["results"][1]);
    assert!(j["results"][1]["drain_s"].as_f64().is_some(), "{j}");
    assert_eq!(j["ratios"].as_array().map(|a| a.len()), Some(4), "{j}");
    assert_eq!(
        std::fs::read_dir(&target).expect("list").count(),
        0,
        "left behind"
    );
    assert_eq!(
        std::fs::read_dir(&work).expect("list").count(),
        0,
        "left behind"
    );
}
