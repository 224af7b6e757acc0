//! `tierstack stage in --fanout --fanout-spool` into buffers whose BACKING is the shared
//! file system itself (here: the source folder), through the real binary and real FUSE
//! mounts: the copies enter each mount as clean cache (`adopt`), nothing is written to
//! BACKING, nothing is drained; a source changed after the copy is refused.

mod common;
use common::{detach, free_port, random, s, ts, BIN};

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tierstack_fs::core::adopt::Claim;
use tierstack_fs::mount::AdoptAnswer;

/// (inode, mtime ns, bytes) of a file.
fn stamp(p: &Path) -> (u64, i64, Vec<u8>) {
    let m = fs::metadata(p).expect("stat");
    (
        m.ino(),
        m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        fs::read(p).expect("read"),
    )
}

fn status(mnt: &Path) -> serde_json::Value {
    let o = ts(&["status", s(mnt), "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("status json")
}

fn u(v: &serde_json::Value, k: &str) -> u64 {
    v.get(k)
        .and_then(|x| x.as_u64())
        .unwrap_or_else(|| panic!("no {k} in {v}"))
}

/// Mounts that are detached however the test ends.
struct Mounts(Vec<PathBuf>);

impl Drop for Mounts {
    fn drop(&mut self) {
        for m in &self.0 {
            if common::is_mounted(m) {
                let _ = ts(&["umount", s(m), "--force"]);
                detach(m, None);
            }
        }
    }
}

fn mount(backing: &Path, mnt: &Path, fast: &Path) -> bool {
    for d in [mnt, fast] {
        fs::create_dir_all(d).expect("mkdir");
    }
    let o = common::mount_small(backing, mnt, fast);
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        eprintln!("skipped: tierstack mount failed: {err}");
    }
    o.status.success()
}

#[test]
fn fanned_out_inputs_enter_a_buffer_over_the_source_as_clean_cache() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse");
        return;
    }
    let _g = common::serial();
    let t = tempfile::tempdir().expect("tmp");
    let src = t.path().join("src");
    fs::create_dir_all(src.join("sub")).expect("mkdir");
    let big = random(3 * (1 << 20) + 17, 7);
    fs::write(src.join("sub/big"), &big).expect("write");
    fs::write(src.join("a"), b"hello").expect("write");
    let before: Vec<_> = ["a", "sub/big"]
        .iter()
        .map(|f| stamp(&src.join(f)))
        .collect();
    let total = (big.len() + 5) as u64;
    let mut mounts = Mounts(Vec::new());
    // Two "nodes": two buffers over the same BACKING, the source folder.
    let mnts: Vec<PathBuf> = (0..2).map(|i| t.path().join(format!("mnt{i}"))).collect();
    for (i, m) in mnts.iter().enumerate() {
        if !mount(&src, m, &t.path().join(format!("fast{i}"))) {
            return;
        }
        mounts.0.push(m.clone());
    }
    let ports = [free_port(), free_port()];
    let nodes = format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]);
    let spools: Vec<PathBuf> = (0..2).map(|i| t.path().join(format!("spool{i}"))).collect();
    // Both nodes at once, node 1 first (it waits for its parent).
    let kids: Vec<_> = [1usize, 0]
        .into_iter()
        .map(|i| {
            let mut dst = mnts[i].clone().into_os_string();
            dst.push("/");
            let child = Command::new(BIN)
                .arg("stage")
                .arg("in")
                .arg(&src)
                .arg(dst)
                .args(["--fanout", &nodes, "--fanout-me"])
                .arg(format!("127.0.0.1:{}", ports[i]))
                .arg("--fanout-spool")
                .arg(&spools[i])
                .args(["--fanout-timeout", "10s", "--json"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn stage");
            (i, child)
        })
        .collect();
    let mut reports = vec![serde_json::Value::Null; 2];
    for (i, k) in kids {
        let o = k.wait_with_output().expect("wait stage");
        assert!(
            o.status.success(),
            "node {i}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        reports[i] = serde_json::from_slice(&o.stdout).expect("stage json");
    }
    // The shared system (the source) was read once, by node 0; node 1 got the bytes from it.
    assert_eq!(u(&reports[0], "from_shared"), total, "{}", reports[0]);
    assert_eq!(u(&reports[1], "from_parent"), total, "{}", reports[1]);
    assert_eq!(u(&reports[1], "from_shared"), 0, "{}", reports[1]);
    for r in &reports {
        assert_eq!(u(r, "adopted_files"), 2, "{r}");
        assert_eq!(u(r, "adopted_bytes"), total, "{r}");
        // BACKING held every input as it is: nothing written there.
        assert_eq!(u(r, "published_files"), 0, "{r}");
        assert_eq!(u(r, "copied_into_mount"), 0, "{r}");
        assert_eq!(u(r, "left_to_backing"), 0, "{r}");
    }
    for (m, sp) in mnts.iter().zip(&spools) {
        // Clean cache: held, nothing dirty, nothing pending; the spool is emptied.
        let st = status(m);
        assert!(u(&st, "held_bytes") >= total, "{st}");
        assert_eq!(u(&st, "dirty_bytes"), 0, "{st}");
        assert_eq!(u(&st, "dirty_files"), 0, "{st}");
        assert_eq!(u(&st, "pending_ops"), 0, "{st}");
        assert_eq!(fs::read(m.join("sub/big")).expect("read"), big);
        assert_eq!(fs::read(m.join("a")).expect("read"), b"hello");
        assert!(
            fs::read_dir(sp).map_or(true, |mut d| d.next().is_none()),
            "spool left"
        );
    }

    // A source changed after the copy is refused: node 1's mount is asked to adopt a copy of
    // `c` whose source then changed in BACKING (same size, later mtime; then another size).
    let copy = t.path().join("copy-c");
    fs::write(&copy, b"v1v1").expect("write");
    fs::write(src.join("c"), b"v1v1").expect("write");
    let old = stamp(&src.join("c"));
    let claim = Claim {
        len: 4,
        mtime_ns: old.1,
        xxh3: xxhash_rust::xxh3::xxh3_64(b"v1v1"),
    };
    let mp = fs::canonicalize(&mnts[1]).expect("canonical");
    let ask = |claim: &Claim| {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let a = tierstack_fs::mount::adopt(
                &mp,
                Path::new("c"),
                &copy,
                claim,
                Duration::from_secs(30),
            )
            .expect("adopt request");
            match &a {
                // The mount sees the new name within its coherence interval.
                AdoptAnswer::Refused { kind, .. } if kind == "missing" && Instant::now() < end => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                _ => return a,
            }
        }
    };
    std::thread::sleep(Duration::from_millis(20));
    fs::write(src.join("c"), b"v2v2").expect("write");
    let f = fs::File::options()
        .write(true)
        .open(src.join("c"))
        .expect("open");
    f.set_modified(std::time::UNIX_EPOCH + Duration::from_nanos(old.1 as u64 + 1_000_000_000))
        .expect("set mtime");
    drop(f);
    match ask(&claim) {
        AdoptAnswer::Refused { kind, retry, why } => {
            assert_eq!(kind, "backing_differs", "{why}");
            assert!(retry, "{why}");
        }
        a => panic!("a changed source was adopted: {a:?}"),
    }
    fs::write(src.join("c"), b"v3v3v3").expect("write");
    assert!(matches!(
        ask(&claim),
        AdoptAnswer::Refused { kind, .. } if kind == "backing_differs"
    ));
    // The mount reads BACKING's file, not the refused copy (at the size it knew the file
    // by: a node-local view does not pick up others' changes to files it knows).
    assert_eq!(fs::read(mnts[1].join("c")).expect("read"), b"v3v3");
    let st = status(&mnts[1]);
    assert_eq!(u(&st, "dirty_bytes"), 0, "{st}");

    // The drain writes nothing; BACKING's inputs keep their inode, mtime and bytes.
    for m in &mnts {
        let o = ts(&["drain", s(m), "--wait", "--timeout", "30s"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let st = status(m);
        assert_eq!(u(&st, "drained_bytes"), 0, "{st}");
        let o = ts(&["umount", s(m)]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let after: Vec<_> = ["a", "sub/big"]
        .iter()
        .map(|f| stamp(&src.join(f)))
        .collect();
    assert_eq!(before, after);
    assert_eq!(fs::read(src.join("c")).expect("read"), b"v3v3v3");
}
