//! The VRAM tier through the CLI. Without an NVIDIA GPU every `--vram` (mount, run, bench mem)
//! and `bench vram` is refused before anything is made, with one line that names the fix;
//! on a GPU machine a mount with a VRAM tier shows it in `status` and keeps every byte, in the
//! mount and in BACKING after the drain.

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// A temporary folder with BACKING (`b`) and a mount point (`m`) made in it, and the path of
/// the fast tier's folder (`fast`, not made).
fn folders() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let t = tempfile::tempdir().expect("tmp");
    let (b, m, d) = (
        t.path().join("b"),
        t.path().join("m"),
        t.path().join("fast"),
    );
    std::fs::create_dir(&b).expect("mkdir");
    std::fs::create_dir(&m).expect("mkdir");
    (t, b, m, d)
}

fn gpu_here() -> bool {
    tierstack_store::Gpu::open(0).is_ok()
}

/// Whether the GPU tests can mount here: a GPU, and root with FUSE (says why not).
fn gpu_mount_here() -> bool {
    if !gpu_here() {
        eprintln!("SKIP: no NVIDIA GPU here (vram_is_refused_cleanly_without_a_gpu runs)");
        return false;
    }
    root_with_fuse()
}

#[test]
fn vram_is_refused_cleanly_without_a_gpu() {
    if gpu_here() {
        eprintln!("SKIP: this machine has a GPU (a_mount_with_a_vram_tier_keeps_every_byte runs)");
        return;
    }
    let (t, b, m, d) = folders();
    let e = fails(&["mount", s(&b), s(&m), "--dir", s(&d), "--vram", "1G"]);
    assert!(e.contains("--vram") && e.contains("NVIDIA"), "{e}");
    assert!(!is_mounted(&m), "mounted anyway");
    assert!(
        !d.exists(),
        "the fast tier's folder was made: {}",
        d.display()
    );
    let e = fails(&["run", "--dram", "64M", "--vram", "1G", "--", "true"]);
    assert!(e.contains("--vram") && e.contains("NVIDIA"), "{e}");
    let e = fails(&[
        "bench",
        "mem",
        "--engine",
        "tierstack",
        "--vram",
        "1G",
        "--seconds",
        "1",
        "--map",
        "64M",
        "--dram",
        "32M",
        "--dir",
        s(t.path()),
    ]);
    assert!(e.contains("--vram"), "{e}");
    let e = fails(&["bench", "vram", "--size", "16M", "--dir", s(t.path())]);
    assert!(e.contains("bench vram") && e.contains("NVIDIA"), "{e}");
    // --gpu means nothing without --vram.
    let o = ts(&["mount", s(&b), s(&m), "--gpu", "1"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--vram"));
    // doctor says there is no VRAM tier here, and why, without failing for it.
    let out = String::from_utf8_lossy(&ts(&["doctor", "--json"]).stdout).into_owned();
    let j: serde_json::Value = serde_json::from_str(&out).expect("json");
    let gpu = j["checks"]
        .as_array()
        .or_else(|| j.as_array())
        .and_then(|a| a.iter().find(|c| c["name"] == "gpu"))
        .cloned()
        .expect("a gpu check");
    assert_eq!(gpu["status"], "ok", "{gpu}");
    assert!(
        gpu["value"].as_str().unwrap_or("").contains("none usable"),
        "{gpu}"
    );
}

#[test]
fn a_mount_with_a_vram_tier_keeps_every_byte() {
    if !gpu_mount_here() {
        return;
    }
    let _s = serial();
    let (_t, b, m, d) = folders();
    ok(&[
        "mount",
        s(&b),
        s(&m),
        "--dir",
        s(&d),
        "--dram",
        "16M",
        "--vram",
        "256M",
        "--drive-size",
        "256M",
    ]);
    let data = random(96 << 20, 7);
    let f = m.join("out.bin");
    std::fs::write(&f, &data).expect("write");
    std::fs::File::open(&f)
        .and_then(|f| f.sync_all())
        .expect("fsync");
    let st: serde_json::Value =
        serde_json::from_str(&ok(&["status", s(&m), "--json"])).expect("status json");
    let tiers = st["tiers"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = tiers.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["dram", "vram", "array"], "{st}");
    assert!(
        tiers[1]["used_bytes"].as_u64().unwrap_or(0) > 0,
        "nothing went through VRAM: {st}"
    );
    assert!(
        std::fs::read(&f).expect("read") == data,
        "read back differs"
    );
    ok(&["umount", s(&m)]);
    assert!(!is_mounted(&m));
    assert!(
        std::fs::read(Path::new(&b).join("out.bin")).expect("backing") == data,
        "BACKING differs after the drain"
    );
}

/// Without --drive-size a mount's array is sized to take its VRAM tier whole: the mount may
/// hold all of --dram plus --vram before its writers wait for the drain (with the old 4 x 2G
/// drives a --vram 8G mount held at most 4 GiB and `bench checkpoint` ran at a third of the
/// speed); an explicit --drive-size too small for the tier is mounted with a note naming the
/// size that would take it.
#[test]
fn a_vram_mount_with_default_drives_may_hold_the_whole_tier() {
    if !gpu_mount_here() {
        return;
    }
    let _s = serial();
    let limit = |m: &Path| -> u64 {
        let st: serde_json::Value =
            serde_json::from_str(&ok(&["status", s(m), "--json"])).expect("status json");
        st["limit_bytes"].as_u64().expect("limit_bytes")
    };
    // A --vram 8G mount over 64M of DRAM with `extra`: its folders and stderr.
    let mount = |extra: &[&str]| {
        let (t, b, m, d) = folders();
        let mut args = vec![
            "mount",
            s(&b),
            s(&m),
            "--dir",
            s(&d),
            "--dram",
            "64M",
            "--vram",
            "8G",
        ];
        args.extend_from_slice(extra);
        let o = ts(&args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        success_stdout(&args, o);
        (t, m, err)
    };
    let (_t, m, err) = mount(&["--drive-size", "2G"]);
    assert!(
        err.contains("note") && err.contains("--drive-size 7G"),
        "no note on drives too small for the VRAM tier: {err}"
    );
    assert!(limit(&m) < 8 << 30);
    ok(&["umount", s(&m)]);
    let (_t, m, err) = mount(&[]);
    assert!(!err.contains("note"), "{err}");
    let held = limit(&m);
    assert!(
        held >= (8 << 30) + (64 << 20),
        "a --vram 8G mount may hold only {held} bytes"
    );
    ok(&["umount", s(&m)]);
    assert!(!is_mounted(&m));
}
