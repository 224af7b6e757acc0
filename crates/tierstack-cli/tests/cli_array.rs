//! End-to-end tests of `tierstack array ...` through the real binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rand::{Rng, SeedableRng};

mod common;
use common::{fails, ok, random, s, same_content, ts, BIN};

fn random_file(dir: &Path, name: &str, len: usize, seed: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, random(len, seed)).expect("write input");
    p
}

fn show_json(arr: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(&["array", "show", s(arr), "--json"])).expect("json")
}

struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    arr: PathBuf,
    drives: Vec<PathBuf>,
}

fn setup(level: &str, n: usize, groups: Option<&str>, size: &str) -> Setup {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    let arr = dir.join("a.array");
    let drives: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("d{i}"))).collect();
    let mut args = vec!["array", "create", s(&arr), "--level", level, "--size", size];
    if let Some(g) = groups {
        args.extend(["--groups", g]);
    }
    args.extend(drives.iter().map(|d| s(d)));
    ok(&args);
    Setup {
        _tmp: tmp,
        dir,
        arr,
        drives,
    }
}

const SIZES: [usize; 7] = [0, 1, 4095, 4096, (1 << 20) + 1, 5 << 20, 64 << 20];

fn put_all(st: &Setup) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for (i, &len) in SIZES.iter().enumerate() {
        let name = format!("obj-{len}");
        let f = random_file(&st.dir, &format!("in{i}"), len, i as u64 + 1);
        if i == 2 {
            // One object through stdin.
            let o = Command::new(BIN)
                .args(["array", "put", s(&st.arr), &name])
                .stdin(std::fs::File::open(&f).expect("open"))
                .output()
                .expect("run");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        } else {
            ok(&["array", "put", s(&st.arr), &name, s(&f)]);
        }
        out.push((name, f));
    }
    out
}

#[track_caller]
fn check_all(st: &Setup, objs: &[(String, PathBuf)], what: &str) {
    for (name, f) in objs {
        let out = st.dir.join("out");
        ok(&["array", "get", s(&st.arr), name, s(&out)]);
        assert!(same_content(&out, f), "{what}: {name} differs");
    }
}

#[test]
fn every_level_roundtrips_fails_rebuilds_and_scrubs() {
    for (level, n, groups) in [
        ("0", 3, None),
        ("1", 2, None),
        ("10", 4, None),
        ("5", 4, None),
        ("6", 5, None),
        ("50", 6, Some("2")),
        ("60", 8, Some("2")),
    ] {
        let st = setup(level, n, groups, "160M");
        let objs = put_all(&st);
        check_all(&st, &objs, &format!("RAID {level}"));
        // stdout get of the small object
        let o = ts(&["array", "get", s(&st.arr), &objs[1].0]);
        assert_eq!(o.stdout, std::fs::read(&objs[1].1).expect("read"));
        if level == "0" {
            assert!(fails(&["array", "fail", s(&st.arr), "--drive", "1"]).contains("tolerates"));
            continue;
        }
        let tolerance = if level == "6" || level == "60" { 2 } else { 1 };
        // Fail drives 1 (and the last, for two-parity levels): reads stay exact.
        let mut failed = vec![1usize];
        if tolerance == 2 {
            failed.push(n - 1);
        }
        for &d in &failed {
            ok(&["array", "fail", s(&st.arr), "--drive", &d.to_string()]);
        }
        assert_eq!(show_json(&st.arr)["state"], "degraded", "RAID {level}");
        check_all(&st, &objs, &format!("RAID {level} degraded"));
        // One more failure than the level tolerates is refused.
        let extra = (0..n).find(|i| !failed.contains(i)).expect("drive");
        if level != "1" && level != "10" && level != "50" && level != "60" {
            assert!(
                fails(&["array", "fail", s(&st.arr), "--drive", &extra.to_string()])
                    .contains("tolerates")
            );
        }
        for &d in &failed {
            let nd = st.dir.join(format!("new{d}"));
            ok(&[
                "array",
                "replace",
                s(&st.arr),
                "--drive",
                &d.to_string(),
                s(&nd),
            ]);
        }
        let j = show_json(&st.arr);
        assert_eq!(j["state"], "online", "RAID {level}: {j}");
        let rep: serde_json::Value =
            serde_json::from_str(&ok(&["array", "scrub", s(&st.arr), "--json"])).expect("json");
        assert_eq!(rep["checksum_errors"], 0, "{rep}");
        assert_eq!(rep["parity_errors"], 0, "{rep}");
        check_all(&st, &objs, &format!("RAID {level} rebuilt"));
    }
}

#[test]
fn any_single_drive_missing_keeps_raid5_and_50_exact() {
    for (level, n, groups) in [("5", 4, None), ("50", 6, Some("2"))] {
        let st = setup(level, n, groups, "64M");
        let objs: Vec<(String, PathBuf)> = (0..4)
            .map(|i| {
                let f = random_file(
                    &st.dir,
                    &format!("in{i}"),
                    3_000_000 + i * 77_777,
                    50 + i as u64,
                );
                let name = format!("o{i}");
                ok(&["array", "put", s(&st.arr), &name, s(&f)]);
                (name, f)
            })
            .collect();
        for d in 0..n {
            // Pull the drive (rename it away), read through the descriptor, put it back.
            let away = st.dir.join("away");
            std::fs::rename(&st.drives[d], &away).expect("rename");
            check_all(&st, &objs, &format!("RAID {level} without drive {d}"));
            std::fs::rename(&away, &st.drives[d]).expect("rename back");
        }
        // Nothing was written while degraded, so the array is whole again.
        assert_eq!(show_json(&st.arr)["state"], "online");
    }
}

#[test]
fn scrub_repairs_flipped_bytes() {
    let st = setup("5", 4, None, "64M");
    let objs: Vec<(String, PathBuf)> = (0..3)
        .map(|i| {
            let f = random_file(&st.dir, &format!("in{i}"), 6 << 20, 90 + i);
            let name = format!("o{i}");
            ok(&["array", "put", s(&st.arr), &name, s(&f)]);
            (name, f)
        })
        .collect();
    // Flip bytes in several places of drive 1's data area.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&st.drives[1])
            .expect("open drive");
        for off in [
            (1u64 << 20) + 100,
            (1 << 20) + 300_000,
            (1 << 20) + 2_000_000,
            (1 << 20) + 5_000_000,
        ] {
            let mut b = [0u8; 16];
            f.read_exact_at(&mut b, off).expect("read");
            for x in &mut b {
                *x ^= 0x5a;
            }
            f.write_all_at(&b, off).expect("write");
        }
        f.sync_all().expect("sync");
    }
    let o = ts(&["array", "scrub", s(&st.arr), "--json"]);
    assert!(
        !o.status.success(),
        "scrub without --repair must report errors"
    );
    let rep: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let found =
        rep["checksum_errors"].as_u64().unwrap_or(0) + rep["parity_errors"].as_u64().unwrap_or(0);
    assert!(found >= 1, "{rep}");
    let rep: serde_json::Value =
        serde_json::from_str(&ok(&["array", "scrub", s(&st.arr), "--repair", "--json"]))
            .expect("json");
    assert!(rep["repaired"].as_u64().unwrap_or(0) >= 1, "{rep}");
    assert_eq!(rep["unrepairable"], 0);
    let rep: serde_json::Value =
        serde_json::from_str(&ok(&["array", "scrub", s(&st.arr), "--json"])).expect("json");
    assert_eq!(rep["checksum_errors"], 0, "{rep}");
    assert_eq!(rep["parity_errors"], 0, "{rep}");
    check_all(&st, &objs, "after repair");
}

#[test]
fn reads_repair_corruption_on_the_fly() {
    let st = setup("6", 5, None, "64M");
    let f = random_file(&st.dir, "in", 4 << 20, 7);
    ok(&["array", "put", s(&st.arr), "x", s(&f)]);
    {
        use std::os::unix::fs::FileExt;
        let d = std::fs::OpenOptions::new()
            .write(true)
            .open(&st.drives[0])
            .expect("open");
        d.write_all_at(&[0xffu8; 8192], (1 << 20) + 8192)
            .expect("write");
        d.sync_all().expect("sync");
    }
    let out = st.dir.join("out");
    ok(&["array", "get", s(&st.arr), "x", s(&out)]);
    assert!(same_content(&out, &f));
}

#[test]
fn lost_descriptor_is_reassembled() {
    let st = setup("6", 5, None, "64M");
    let objs: Vec<(String, PathBuf)> = (0..3)
        .map(|i| {
            let f = random_file(
                &st.dir,
                &format!("in{i}"),
                1_500_000 * (i + 1),
                20 + i as u64,
            );
            let name = format!("o{i}");
            ok(&["array", "put", s(&st.arr), &name, s(&f)]);
            (name, f)
        })
        .collect();
    std::fs::remove_file(&st.arr).expect("rm descriptor");
    assert!(fails(&["array", "show", s(&st.arr)]).contains("assemble"));
    // Drives given in another order.
    let mut shuffled: Vec<&str> = st.drives.iter().map(|d| s(d)).collect();
    shuffled.reverse();
    let mut args = vec!["array", "assemble", s(&st.arr)];
    args.extend(shuffled);
    ok(&args);
    check_all(&st, &objs, "reassembled");
    assert_eq!(show_json(&st.arr)["state"], "online");
}

#[test]
fn bad_input_gets_one_line_and_leaves_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path();
    let arr = d.join("x.array");
    let dr: Vec<PathBuf> = (0..4).map(|i| d.join(format!("n{i}"))).collect();
    let ds: Vec<&str> = dr.iter().map(|p| s(p)).collect();
    let nothing_left = |what: &str| {
        assert!(!arr.exists(), "{what}: descriptor left behind");
        for p in &dr {
            assert!(!p.exists(), "{what}: drive {} left behind", p.display());
        }
    };
    let create = |extra: &[&str], drives: &[&str]| -> String {
        let mut a = vec!["array", "create", s(&arr)];
        a.extend(extra);
        a.extend(drives);
        fails(&a)
    };
    assert!(create(&["--level", "7", "--size", "64M"], &ds).contains("unknown RAID level"));
    nothing_left("level");
    assert!(
        create(&["--level", "5", "--size", "64M", "--chunk", "48K"], &ds).contains("power of two")
    );
    nothing_left("chunk");
    assert!(create(&["--level", "6", "--size", "64M"], &ds[..3]).contains("at least 4 drives"));
    nothing_left("too few");
    assert!(create(&["--level", "5", "--size", "12Q"], &ds).contains("invalid size"));
    nothing_left("size unparseable");
    assert!(create(&["--level", "5", "--size", "3M"], &ds).contains("too small"));
    nothing_left("size too small");
    assert!(create(&["--level", "5"], &ds).contains("--size"));
    nothing_left("no size for new files");
    let missing = d.join("no/such/dir/drive");
    let mut with_missing = ds[..3].to_vec();
    with_missing.push(s(&missing));
    assert!(create(&["--level", "5", "--size", "64M"], &with_missing).contains("does not exist"));
    nothing_left("missing drive folder");
    assert!(create(&["--level", "50", "--groups", "3", "--size", "64M"], &ds).contains("at least"));
    nothing_left("groups");
    assert!(create(&["--level", "5", "--groups", "2", "--size", "64M"], &ds).contains("--groups"));
    nothing_left("groups on raid5");
    // An unwritable drive path (a read-only file, when not root; a directory otherwise).
    assert!(
        create(&["--level", "5", "--size", "64M"], &[ds[0], ds[1], s(d)]).contains("directory")
    );
    nothing_left("directory drive");
    // Drives of two arrays mixed.
    let a1 = setup("5", 3, None, "64M");
    let a2 = setup("5", 3, None, "64M");
    let mixed = [s(&a1.drives[0]), s(&a1.drives[1]), s(&a2.drives[2])];
    let mut args = vec!["array", "assemble", s(&arr)];
    args.extend(mixed);
    assert!(fails(&args).contains("another array"));
    assert!(!arr.exists());
    // A drive of an existing array cannot be reused for a new one.
    assert!(create(
        &["--level", "5", "--size", "64M"],
        &[ds[0], ds[1], s(&a1.drives[0])]
    )
    .contains("already belongs"));
    nothing_left("drive of another array");
    // Other commands.
    assert!(fails(&["array", "fail", s(&a1.arr), "--drive", "9"]).contains("does not exist"));
    assert!(fails(&["array", "get", s(&a1.arr), "nope"]).contains("no object"));
    assert!(fails(&["array", "show", s(&d.join("missing.array"))]).contains("cannot read"));
    assert!(
        fails(&["array", "put", s(&a1.arr), "k", s(&d.join("no-such-input"))])
            .contains("cannot open")
    );
    assert!(fails(&[
        "array",
        "replace",
        s(&a1.arr),
        "--drive",
        "0",
        s(&d.join("z"))
    ])
    .contains("not failed"));
    assert!(fails(&["array", "show", s(&a1.arr), "--engine", "aio"]).contains("unknown io engine"));
}

#[test]
fn kill_dash_nine_never_loses_an_acknowledged_put() {
    let st = setup("5", 4, None, "128M");
    let mut rng = rand::rngs::StdRng::seed_from_u64(4242);
    let mut acked: Vec<(String, PathBuf)> = Vec::new();
    let mut killed = 0;
    for round in 0..60 {
        let len = rng.gen_range(1..3_000_000);
        let f = random_file(&st.dir, &format!("k{round}"), len, 1000 + round);
        let name = format!("k{round}");
        let mut child = Command::new(BIN)
            .args(["array", "put", s(&st.arr), &name, s(&f)])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let wait_ms = rng.gen_range(0..120);
        std::thread::sleep(std::time::Duration::from_millis(wait_ms));
        match child.try_wait().expect("try_wait") {
            Some(status) if status.success() => acked.push((name, f)),
            Some(status) => {
                let o = child.wait_with_output().expect("output");
                panic!(
                    "put failed on its own: {status}: {}",
                    String::from_utf8_lossy(&o.stderr)
                )
            }
            None => {
                let _ = child.kill(); // SIGKILL
                let status = child.wait().expect("wait");
                if status.success() {
                    acked.push((name, f));
                } else {
                    killed += 1;
                    let _ = std::fs::remove_file(&f);
                }
            }
        }
        if round % 15 == 14 {
            check_all(&st, &acked, &format!("after round {round}"));
        }
    }
    assert!(
        killed >= 5,
        "only {killed} puts were killed: the test did not test kills"
    );
    check_all(&st, &acked, "final");
    let rep: serde_json::Value =
        serde_json::from_str(&ok(&["array", "scrub", s(&st.arr), "--json"])).expect("json");
    assert_eq!(rep["unrepairable"], 0, "{rep}");
}

#[test]
fn background_replace_then_show_reports_and_finishes() {
    let st = setup("5", 4, None, "128M");
    let f = random_file(&st.dir, "in", 40 << 20, 3);
    ok(&["array", "put", s(&st.arr), "big", s(&f)]);
    ok(&["array", "fail", s(&st.arr), "--drive", "2"]);
    let nd = st.dir.join("new2");
    ok(&[
        "array",
        "replace",
        s(&st.arr),
        "--drive",
        "2",
        s(&nd),
        "--background",
        "--rate",
        "40M",
    ]);
    let first = show_json(&st.arr);
    assert!(
        first["state"] == "rebuilding" || first["state"] == "online",
        "{first}"
    );
    let mut state = first["state"].clone();
    for _ in 0..600 {
        if state == "online" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        state = show_json(&st.arr)["state"].clone();
    }
    assert_eq!(state, "online");
    // The background process may still be exiting: retry the read briefly.
    let out = st.dir.join("out");
    let mut got = false;
    for _ in 0..50 {
        if ts(&["array", "get", s(&st.arr), "big", s(&out)])
            .status
            .success()
        {
            got = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(got && same_content(&out, &f));
}

/// Runs a shell command; None when it is not available or fails (the caller skips).
fn sh(cmd: &str) -> Option<String> {
    let o = Command::new("sh").arg("-c").arg(cmd).output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

#[test]
fn block_devices_as_drives() {
    // Loop devices need root and losetup; skip (loudly) where they are not available.
    let tmp = tempfile::tempdir().expect("tmp");
    let mut loops = Vec::new();
    for i in 0..4 {
        let f = tmp.path().join(format!("img{i}"));
        std::fs::File::create(&f)
            .and_then(|x| x.set_len(96 << 20))
            .expect("img");
        match sh(&format!("losetup -f --show {}", f.display())) {
            Some(dev) if dev.starts_with("/dev/loop") => loops.push(dev),
            _ => {
                eprintln!("SKIP block_devices_as_drives: cannot attach loop devices here");
                for l in &loops {
                    let _ = sh(&format!("losetup -d {l}"));
                }
                return;
            }
        }
    }
    let arr = tmp.path().join("loop.array");
    let mut args = vec!["array", "create", s(&arr), "--level", "5"];
    args.extend(loops.iter().map(|l| l.as_str()));
    let created = ts(&args);
    let f = random_file(tmp.path(), "in", 10 << 20, 77);
    let out = tmp.path().join("out");
    let result = std::panic::catch_unwind(|| {
        assert!(
            created.status.success(),
            "{}",
            String::from_utf8_lossy(&created.stderr)
        );
        ok(&["array", "put", s(&arr), "x", s(&f)]);
        ok(&["array", "fail", s(&arr), "--drive", "1"]);
        ok(&["array", "get", s(&arr), "x", s(&out)]);
        assert!(same_content(&out, &f));
        let j = show_json(&arr);
        assert_eq!(j["state"], "degraded");
    });
    for l in &loops {
        let _ = sh(&format!("losetup -d {l}"));
    }
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn unwritable_drive_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let ro = tmp.path().join("ro");
    std::fs::write(&ro, b"").expect("file");
    // Root ignores permission bits; the immutable attribute stops it. Skip where chattr fails
    // (tmpfs, or no e2fsprogs).
    if sh(&format!("chattr +i {}", ro.display())).is_none() {
        eprintln!("SKIP unwritable_drive_is_refused: chattr +i not supported here");
        return;
    }
    let arr = tmp.path().join("a.array");
    let d: Vec<PathBuf> = (0..2).map(|i| tmp.path().join(format!("d{i}"))).collect();
    let o = ts(&[
        "array",
        "create",
        s(&arr),
        "--level",
        "5",
        "--size",
        "64M",
        s(&d[0]),
        s(&d[1]),
        s(&ro),
    ]);
    let _ = sh(&format!("chattr -i {}", ro.display()));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not writable"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!arr.exists() && !d[0].exists() && !d[1].exists());
}
