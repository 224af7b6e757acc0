//! `tierstack exporter`: one Prometheus endpoint for every mount of the node. Real mounts
//! (root and /dev/fuse; elsewhere the test says why and passes), each test in its own runtime
//! folder (TIERSTACK_RUN_DIR), so the exporter sees that test's mounts only. The output must
//! pass `promtool check metrics` (Debian's `prometheus` package; CI installs it).
//!
//! Issue 38's measurement (20 mounts of 10,000 files each, their drains running) is
//! `tierstack bench exporter`; `bench_exporter_measures_and_cleans_up` runs it small.

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{
    detach, free_port, get_metrics, promtool_check, root_with_fuse, s, serial, success_stdout, BIN,
};

fn tierstack(rd: &Path, args: &[&str], job: Option<&str>) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("TIERSTACK_RUN_DIR", rd)
        .env_remove("SLURM_JOB_ID")
        .stdin(Stdio::null());
    if let Some(j) = job {
        c.env("SLURM_JOB_ID", j);
    }
    c.output().expect("run tierstack")
}

/// A mount made for a test, detached however the test ends.
struct TestMount {
    mnt: PathBuf,
    backing: PathBuf,
    pid: Option<u32>,
}

impl Drop for TestMount {
    fn drop(&mut self) {
        detach(&self.mnt, self.pid);
    }
}

/// Mounts `root/NAME/backing` at `root/NAME/mnt` (fast tier in `root/NAME/fast`, a DRAM
/// tier of `dram`), with `SLURM_JOB_ID=job` in the daemon's environment when given.
fn mount(
    rd: &Path,
    root: &Path,
    name: &str,
    job: Option<&str>,
    dram: &str,
    extra: &[&str],
) -> TestMount {
    let base = root.join(name);
    let (backing, mnt, fast) = (base.join("backing"), base.join("mnt"), base.join("fast"));
    std::fs::create_dir_all(&backing).expect("mkdir");
    std::fs::create_dir_all(&mnt).expect("mkdir");
    let mut args = vec![
        "mount",
        s(&backing),
        s(&mnt),
        "--dir",
        s(&fast),
        "--dram",
        dram,
        "--drive-size",
        "64M",
    ];
    args.extend_from_slice(extra);
    success_stdout(&args, tierstack(rd, &args, job));
    let st: serde_json::Value = serde_json::from_str(&success_stdout(
        &[],
        tierstack(rd, &["status", s(&mnt), "--json"], None),
    ))
    .expect("status");
    TestMount {
        mnt: std::fs::canonicalize(&mnt).expect("canon"),
        backing,
        pid: st["pid"].as_u64().map(|p| p as u32),
    }
}

/// The exporter, killed if the test ends before it stops it.
struct Exporter(Child);

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `tierstack exporter --listen 127.0.0.1:PORT` and waits until it answers.
fn start_exporter(rd: &Path, port: u16) -> Exporter {
    let child = Command::new(BIN)
        .args(["exporter", "--listen", &format!("127.0.0.1:{port}")])
        .env("TIERSTACK_RUN_DIR", rd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the exporter");
    let e = Exporter(child);
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the exporter does not listen on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    e
}

/// GET /metrics: the body of a 200 answer.
fn scrape(port: u16) -> String {
    let (head, body) = get_metrics(port);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body
}

/// The value of the sample `name` whose labels include every `k="v"` of `labels`.
fn value(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    body.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `promtool check metrics` on the body: it must pass (and promtool must be installed).
fn promtool(body: &str) {
    promtool_check(body, true);
}

/// Writes `n` files of `size` bytes under `dir`.
fn write_files(dir: &Path, n: usize, size: usize) {
    let data = common::random(size, n as u64);
    for i in 0..n {
        std::fs::write(dir.join(format!("f{i:05}")), &data).expect("write through the mount");
    }
}

#[test]
fn exporter_serves_every_mount_and_forgets_the_gone() {
    let _g = serial();
    if !root_with_fuse() {
        return;
    }
    let rd = tempfile::tempdir().expect("tempdir");
    let tmp = tempfile::tempdir_in("/tmp").expect("tempdir");
    let a = mount(rd.path(), tmp.path(), "a", None, "16M", &[]);
    // b's daemon starts inside a SLURM job: its job label comes from its environment.
    let mut b = mount(rd.path(), tmp.path(), "b", Some("4242"), "16M", &[]);
    write_files(&a.mnt, 20, 256 << 10);
    write_files(&b.mnt, 5, 64 << 10);
    let port = free_port();
    let mut exp = start_exporter(rd.path(), port);
    let (ma, mb) = (a.mnt.display().to_string(), b.mnt.display().to_string());
    let la = [
        ("mountpoint", ma.as_str()),
        ("slurm_job", ""),
        ("user", "root"),
    ];
    let lb = [
        ("mountpoint", mb.as_str()),
        ("slurm_job", "4242"),
        ("user", "root"),
    ];
    let body = scrape(port);
    assert_eq!(
        value(&body, "tierstack_exporter_mounts", &[]),
        Some(2.0),
        "{body}"
    );
    assert_eq!(value(&body, "tierstack_exporter_runs", &[]), Some(0.0));
    assert!(
        value(&body, "tierstack_exporter_scrape_duration_seconds", &[]).is_some_and(|d| d > 0.0)
    );
    for (l, files, bytes) in [(&la, 20.0, 20.0 * 262144.0), (&lb, 5.0, 5.0 * 65536.0)] {
        assert_eq!(
            value(&body, "tierstack_mount_up", l),
            Some(1.0),
            "{l:?}: {body}"
        );
        // Everything written is held in the fast tier (drained or not).
        let held = value(&body, "tierstack_held_bytes", l).expect("held");
        assert!(held >= bytes, "{l:?} held {held} < {bytes}: {body}");
        let writes = value(&body, "tierstack_fuse_ops_total", &[l[0], ("op", "write")])
            .expect("write count");
        assert!(writes >= files, "{l:?}: {writes} writes for {files} files");
        let creates = value(&body, "tierstack_fuse_ops_total", &[l[0], ("op", "create")]);
        assert_eq!(creates, Some(files), "{l:?}");
        assert!(value(
            &body,
            "tierstack_tier_capacity_bytes",
            &[l[0], ("tier", "dram")]
        )
        .is_some_and(|c| c >= 16.0 * 1048576.0));
        assert!(value(&body, "tierstack_control_request_duration_seconds_count", l) >= Some(1.0));
        // The daemon's own I/O (its /proc/PID/io) and its drives.
        assert!(
            value(&body, "tierstack_process_written_bytes_total", l).is_some(),
            "{body}"
        );
        assert!(body
            .lines()
            .any(|x| x.starts_with("tierstack_drive_allocated_bytes{")
                && x.contains(&format!("mountpoint=\"{}\"", l[0].1))));
        assert!(value(&body, "tierstack_drain_backlog_bytes", l).is_some());
    }
    promtool(&body);
    // The statfs probe runs once a second per mount.
    std::thread::sleep(Duration::from_millis(1500));
    let body = scrape(port);
    assert!(
        value(&body, "tierstack_mount_probe_duration_seconds_count", &la) >= Some(1.0),
        "{body}"
    );
    assert!(
        value(
            &body,
            "tierstack_control_request_duration_seconds_count",
            &la
        ) >= Some(2.0)
    );
    // b goes: none of its series is left at the next scrape.
    success_stdout(&[], tierstack(rd.path(), &["umount", s(&b.mnt)], None));
    b.pid = None;
    assert_eq!(std::fs::read_dir(&b.backing).expect("backing").count(), 5);
    let body = scrape(port);
    assert_eq!(
        value(&body, "tierstack_exporter_mounts", &[]),
        Some(1.0),
        "{body}"
    );
    assert!(!body.contains(&mb), "{mb} still in:\n{body}");
    assert!(!body.contains("4242"), "{body}");
    assert_eq!(value(&body, "tierstack_mount_up", &la), Some(1.0));
    promtool(&body);
    // A second exporter on the same port: a usage error in one line naming the flag.
    let o = tierstack(
        rd.path(),
        &["exporter", "--listen", &format!("127.0.0.1:{port}")],
        None,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("--listen") && err.contains("free port"),
        "{err}"
    );
    // SIGTERM: exits 0 at once.
    let t0 = Instant::now();
    // SAFETY: kill(2) on the exporter this test started.
    unsafe {
        libc::kill(exp.0.id() as i32, libc::SIGTERM);
    }
    let status = loop {
        if let Some(st) = exp.0.try_wait().expect("wait") {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no exit 5 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let mut err = String::new();
    exp.0
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    assert!(
        err.contains(&format!("http://127.0.0.1:{port}/metrics")),
        "the start line names the address: {err}"
    );
    eprintln!("exporter's log:\n{err}");
    success_stdout(&[], tierstack(rd.path(), &["umount", s(&a.mnt)], None));
}

#[test]
fn exporter_refuses_a_bad_address() {
    let rd = tempfile::tempdir().expect("tempdir");
    let o = tierstack(rd.path(), &["exporter", "--listen", "nowhere"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--listen nowhere is not an address"), "{err}");
}

/// `tierstack bench exporter` (issue 38's measurement, 20 mounts of 10,000 files by default),
/// small here: real mounts through the CLI, drains running at the scrapes, every mount seen,
/// and nothing left behind (no mount, no folder).
#[test]
fn bench_exporter_measures_and_cleans_up() {
    let _g = serial();
    if !root_with_fuse() {
        return;
    }
    let tmp = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let dir = tmp.path().join("bench");
    let o = Command::new(BIN)
        .args([
            "bench",
            "exporter",
            "--mounts",
            "3",
            "--files",
            "2000",
            "--scrapes",
            "3",
            "--json",
            "--dir",
            s(&dir),
        ])
        .env_remove("TIERSTACK_RUN_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("run bench exporter");
    let out = success_stdout(&["bench", "exporter"], o);
    let r: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(r["mounts_seen"], 3, "{r}");
    assert!(
        r["backlog_files"].as_f64().unwrap_or(0.0) > 0.0,
        "drains ended: {r}"
    );
    let per = r["ms_per_mount"].as_f64().expect("ms_per_mount");
    assert!(per > 0.0 && per.is_finite(), "{r}");
    assert_eq!(r["met"].as_bool(), Some(per <= 5.0), "{r}");
    assert!(!dir.exists(), "the work folder is left");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&dir.display().to_string()),
        "a mount is left"
    );
    // A folder that exists is refused: the benchmark removes its folder at the end.
    std::fs::create_dir_all(&dir).expect("mkdir");
    let o = Command::new(BIN)
        .args(["bench", "exporter", "--dir", s(&dir)])
        .stdin(Stdio::null())
        .output()
        .expect("run bench exporter");
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("exists"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
