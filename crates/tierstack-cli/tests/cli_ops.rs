//! Tests of the operating commands (issue 17): `cost`, `doctor`, `top` and the Prometheus
//! metrics of `mount --metrics` and `run --metrics`. Each test uses its own runtime folder
//! (TIERSTACK_RUN_DIR). The mount and run tests need root and /dev/fuse (userfaultfd for
//! run); elsewhere they print why and pass.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{detach, free_port, get_metrics, promtool_check, root_with_fuse, success_stdout, BIN};

fn tierstack(rd: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("TIERSTACK_RUN_DIR", rd)
        .stdin(Stdio::null())
        .output()
        .expect("run tierstack")
}

fn ok(rd: &Path, args: &[&str]) -> String {
    success_stdout(args, tierstack(rd, args))
}

fn fails_with(rd: &Path, args: &[&str], needle: &str) {
    let o = tierstack(rd, args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "tierstack {args:?} should fail");
    assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");
    assert!(
        err.contains(needle),
        "error of {args:?} should name {needle:?}: {err}"
    );
}

/// GET /metrics: (status line, body).
fn scrape(port: u16) -> (String, String) {
    get_metrics(port)
}

/// `promtool check metrics` on the body where promtool is installed.
fn promtool(body: &str) {
    promtool_check(body, false);
}

/// The text format, line by line: comments are HELP/TYPE, samples are `name{labels} value`;
/// every metric name starts with tierstack_.
fn check_format(body: &str) -> Vec<String> {
    let mut names = Vec::new();
    for l in body.lines() {
        if l.is_empty() {
            continue;
        }
        if let Some(c) = l.strip_prefix("# ") {
            assert!(
                c.starts_with("HELP ") || c.starts_with("TYPE "),
                "bad comment {l}"
            );
            continue;
        }
        let name_end = l.find(['{', ' ']).expect("sample name");
        let name = &l[..name_end];
        assert!(
            name.starts_with("tierstack_"),
            "metric without the prefix: {l}"
        );
        let value = l.rsplit(' ').next().expect("value");
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "bad value in {l}"
        );
        names.push(name.to_string());
    }
    names
}

#[test]
fn cost_reproduces_the_seed_example() {
    let rd = tempfile::tempdir().expect("tempdir");
    // Seed 002: A 384 GiB DRAM; B 192 GiB DRAM + 2 x 100 GiB drives; the ratio is ours (10).
    let out = ok(
        rd.path(),
        &[
            "cost",
            "--dram-a",
            "384",
            "--dram-b",
            "192",
            "--nvme-b",
            "200",
            "--dram-to-nvme",
            "10",
            "--slowdown",
            "1.2",
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let rc = v["relative_cost"].as_f64().expect("relative_cost");
    assert!(
        (rc - (10.0 * 192.0 + 200.0) / (10.0 * 384.0)).abs() < 1e-9,
        "{v}"
    );
    assert!((v["saving"].as_f64().expect("saving") - (1.0 - rc)).abs() < 1e-9);
    assert!((v["break_even_slowdown"].as_f64().expect("be") - 1.0 / rc).abs() < 1e-9);
    assert!((v["relative_cost_per_work"].as_f64().expect("pw") - 1.2 * rc).abs() < 1e-9);
    // Text output names the figures.
    let text = ok(
        rd.path(),
        &[
            "cost",
            "--dram-a",
            "384G",
            "--dram-b",
            "192G",
            "--nvme-b",
            "200G",
            "--dram-to-nvme",
            "10",
        ],
    );
    assert!(text.contains("relative cost B/A: 0.552"), "{text}");
    assert!(text.contains("break-even slowdown: 1.81x"), "{text}");
    // A TOML file with prices, and a slowdown measured by two saved `bench mem --json` reports.
    let cfg = rd.path().join("cost.toml");
    std::fs::write(
        &cfg,
        "dram_a = 384\ndram_b = \"192G\"\nnvme_b = 200\ndram_price = 5.0\nnvme_price = 0.5\n",
    )
    .expect("write");
    let m = rd.path().join("m.json");
    let b = rd.path().join("b.json");
    std::fs::write(&m, r#"{"engine":"tierstack","accesses_per_s":500000.0}"#).expect("write");
    std::fs::write(&b, r#"{"engine":"dram","accesses_per_s":1000000.0}"#).expect("write");
    let out = ok(
        rd.path(),
        &[
            "cost",
            "--config",
            cfg.to_str().expect("utf8"),
            "--measured",
            m.to_str().expect("utf8"),
            "--baseline",
            b.to_str().expect("utf8"),
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert!(
        (v["relative_cost"].as_f64().expect("rc") - rc).abs() < 1e-9,
        "{v}"
    );
    assert!(
        (v["slowdown"].as_f64().expect("slowdown") - 2.0).abs() < 1e-9,
        "{v}"
    );
    assert!(
        v["saving_per_work"].as_f64().expect("spw") < 0.0,
        "2x slower does not pay: {v}"
    );
    // Bad input: one line naming the fix.
    fails_with(
        rd.path(),
        &[
            "cost", "--dram-a", "384", "--dram-b", "192", "--nvme-b", "200",
        ],
        "--dram-to-nvme",
    );
    fails_with(
        rd.path(),
        &[
            "cost",
            "--dram-a",
            "lots",
            "--dram-b",
            "192",
            "--nvme-b",
            "200",
            "--dram-to-nvme",
            "10",
        ],
        "--dram-a",
    );
    fails_with(
        rd.path(),
        &[
            "cost",
            "--dram-a",
            "384",
            "--dram-b",
            "192",
            "--nvme-b",
            "200",
            "--dram-to-nvme",
            "0",
        ],
        "above 0",
    );
}

#[test]
fn doctor_reports_checks_as_json() {
    let rd = tempfile::tempdir().expect("tempdir");
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let o = tierstack(
        rd.path(),
        &[
            "doctor",
            "--json",
            "--dir",
            dir.path().to_str().expect("utf8"),
        ],
    );
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("doctor --json prints one JSON object");
    let checks = v["checks"].as_array().expect("checks");
    assert!(checks.len() >= 8, "{} checks", checks.len());
    let mut failed = false;
    for c in checks {
        let st = c["status"].as_str().expect("status");
        assert!(["ok", "warn", "fail"].contains(&st), "{c}");
        assert!(!c["name"].as_str().expect("name").is_empty());
        assert!(
            c["value"].is_string() && !c["advice"].as_str().expect("advice").is_empty(),
            "{c}"
        );
        failed |= st == "fail";
    }
    for name in [
        "userfaultfd",
        "dirty_tracking",
        "fuse_device",
        "fuse_io_uring",
        "transparent_hugepage",
        "watermark_scale_factor",
        "rcu_nocbs",
        "io_uring",
    ] {
        assert!(checks.iter().any(|c| c["name"] == name), "no {name} check");
    }
    assert_eq!(
        o.status.success(),
        !failed,
        "exit status 0 unless a check fails: {v}"
    );
    // Text mode ends with the tally.
    let t = tierstack(
        rd.path(),
        &["doctor", "--dir", dir.path().to_str().expect("utf8")],
    );
    assert!(String::from_utf8_lossy(&t.stdout).contains(" checks: "));
    // A folder on tmpfs is named as one (it saves no memory); a disk folder is not.
    assert!(!checks.iter().any(|c| c["name"]
        .as_str()
        .is_some_and(|n| n.starts_with("memory_fs"))));
    if std::path::Path::new("/dev/shm").is_dir() {
        let o = tierstack(rd.path(), &["doctor", "--json", "--dir", "/dev/shm"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        let c = v["checks"]
            .as_array()
            .and_then(|a| {
                a.iter()
                    .find(|c| c["name"] == "memory_fs:/dev/shm")
                    .cloned()
            })
            .unwrap_or_default();
        assert_eq!(c["status"], "warn", "{v}");
    }
}

#[test]
fn top_batch_with_nothing_running() {
    let rd = tempfile::tempdir().expect("tempdir");
    let out = ok(
        rd.path(),
        &["top", "--batch", "--iterations", "2", "--interval", "100ms"],
    );
    assert_eq!(out.matches("tierstack top - ").count(), 2, "{out}");
    assert!(out.contains("no tierstack mount or run"), "{out}");
    let out = ok(
        rd.path(),
        &["top", "--json", "--iterations", "1", "--interval", "100ms"],
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert!(v["mounts"].as_array().expect("mounts").is_empty());
    fails_with(
        rd.path(),
        &["top", "--batch", "--iterations", "1", "--interval", "soon"],
        "--interval",
    );
    // Not a terminal: the interactive view refuses with the batch alternative.
    fails_with(rd.path(), &["top"], "--batch");
}

/// Kills and detaches whatever a test mounted, however it ends.
struct MountGuard {
    mnt: PathBuf,
    pid: Option<u32>,
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        detach(&self.mnt, self.pid);
    }
}

#[test]
fn mount_metrics_while_writing_and_top_lists_the_mount() {
    if !root_with_fuse() {
        return;
    }
    let rd = tempfile::tempdir().expect("tempdir");
    let tmp = tempfile::tempdir_in("/tmp").expect("tempdir");
    let backing = tmp.path().join("backing");
    let mnt = tmp.path().join("mnt");
    let fast = tmp.path().join("fast");
    std::fs::create_dir(&backing).expect("mkdir");
    std::fs::create_dir(&mnt).expect("mkdir");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // A bad address is refused before anything is mounted.
    fails_with(
        rd.path(),
        &[
            "mount",
            backing.to_str().expect("utf8"),
            mnt.to_str().expect("utf8"),
            "--dir",
            fast.to_str().expect("utf8"),
            "--metrics",
            "nowhere",
        ],
        "--metrics",
    );
    ok(
        rd.path(),
        &[
            "mount",
            backing.to_str().expect("utf8"),
            mnt.to_str().expect("utf8"),
            "--dir",
            fast.to_str().expect("utf8"),
            "--dram",
            "16M",
            "--drive-size",
            "64M",
            "--metrics",
            &addr,
        ],
    );
    let st: serde_json::Value = serde_json::from_str(&ok(
        rd.path(),
        &["status", mnt.to_str().expect("utf8"), "--json"],
    ))
    .expect("status");
    let mut guard = MountGuard {
        mnt: mnt.clone(),
        pid: st["pid"].as_u64().map(|p| p as u32),
    };
    // Write a file through the mount while scraping.
    let path = mnt.join("big.dat");
    let writer = std::thread::spawn(move || {
        let mut f = std::fs::File::create(&path).expect("create");
        let block = vec![0x5au8; 1 << 20];
        let t0 = Instant::now();
        let mut n = 0;
        while t0.elapsed() < Duration::from_secs(3) && n < 64 {
            f.write_all(&block).expect("write");
            n += 1;
        }
        f.sync_all().expect("fsync");
        n
    });
    std::thread::sleep(Duration::from_millis(500));
    let (status, body) = scrape(port);
    assert!(status.contains("200"), "{status}");
    let names = check_format(&body);
    for n in [
        "tierstack_tier_used_bytes",
        "tierstack_drain_backlog_bytes",
        "tierstack_fuse_ops_total",
        "tierstack_fuse_op_duration_seconds_bucket",
        "tierstack_mount_probe_duration_seconds_bucket",
        "tierstack_control_request_duration_seconds_bucket",
    ] {
        assert!(names.iter().any(|x| x == n), "no {n} in:\n{body}");
    }
    assert!(body.contains("# TYPE tierstack_control_request_duration_seconds histogram"));
    // The daemon's per-operation latencies are histograms too, in the shared buckets.
    assert!(body.contains("# TYPE tierstack_fuse_op_duration_seconds histogram"));
    assert!(
        body.lines().any(
            |l| l.starts_with("tierstack_fuse_op_duration_seconds_bucket{")
                && l.contains("op=\"write\"")
                && l.contains("le=\"+Inf\"")
        ),
        "{body}"
    );
    let mp = std::fs::canonicalize(&mnt).expect("canon");
    assert!(
        body.contains(&format!("mountpoint=\"{}\"", mp.display())),
        "{body}"
    );
    assert!(body.contains("tier=\""), "{body}");
    let fast_c = std::fs::canonicalize(&fast).expect("canon");
    assert!(
        body.contains(&format!("drive=\"{}/", fast_c.display())),
        "no drive label under {}: {body}",
        fast_c.display()
    );
    assert!(
        body.contains("tierstack_fuse_ops_total{") && body.contains("op=\"write\""),
        "{body}"
    );
    promtool(&body);
    // Any other path is a 404.
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("send");
    let mut r = String::new();
    s.read_to_string(&mut r).expect("read");
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
    // top lists the mount, in text and JSON.
    let out = ok(
        rd.path(),
        &["top", "--batch", "--iterations", "1", "--interval", "200ms"],
    );
    assert!(out.contains(&format!("MOUNT {}", mp.display())), "{out}");
    assert!(out.contains("tiers "), "{out}");
    let out = ok(
        rd.path(),
        &["top", "--json", "--iterations", "1", "--interval", "200ms"],
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["mounts"][0]["mountpoint"], serde_json::json!(mp), "{v}");
    let n = writer.join().expect("writer");
    assert!(n > 0);
    // The scrape after the write counts the written bytes' operations.
    let (_, body) = scrape(port);
    let writes: f64 = body
        .lines()
        .find(|l| l.starts_with("tierstack_fuse_ops_total{") && l.contains("op=\"write\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .expect("write count");
    assert!(writes >= 1.0, "{body}");
    ok(rd.path(), &["umount", mnt.to_str().expect("utf8")]);
    guard.pid = None;
    assert_eq!(
        std::fs::read(backing.join("big.dat"))
            .expect("drained")
            .len(),
        n << 20
    );
}

/// The value of the first sample line starting with `prefix` (name and labels).
fn sample(body: &str, prefix: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn run_is_listed_by_top_and_serves_metrics() {
    if !root_with_fuse() {
        return;
    }
    let rd = tempfile::tempdir().expect("tempdir");
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // A program that pages for a few seconds: 256 MiB touched over and over with 64 MiB of
    // DRAM, so its counters must show while it runs, not only at its exit.
    let prog = "import time\nb = bytearray(256 << 20)\nt = time.time()\nz = b'\\x01' * len(range(0, len(b), 4096))\nwhile time.time() - t < 5:\n    b[::4096] = z\n";
    let mut child = Command::new(BIN)
        .args([
            "run",
            "--dram",
            "64M",
            "--dir",
            dir.path().to_str().expect("utf8"),
            "--metrics",
            &addr,
            "--",
            "/usr/bin/python3",
            "-c",
            prog,
        ])
        .env("TIERSTACK_RUN_DIR", rd.path())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn run");
    // Wait (bounded) for the run record.
    let t0 = Instant::now();
    let runs = rd.path().join("run");
    while t0.elapsed() < Duration::from_secs(10)
        && std::fs::read_dir(&runs).map_or(true, |mut r| r.next().is_none())
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Live figures: within the program's 5 s, a scrape shows faults and the fault-time
    // histogram of a process that is still paging.
    let mut live = None;
    while t0.elapsed() < Duration::from_secs(12) && child.try_wait().expect("wait").is_none() {
        let (status, body) = scrape(port);
        assert!(status.contains("200"), "{status}");
        if sample(&body, "tierstack_run_paging_processes{").unwrap_or(0.0) >= 1.0
            && sample(&body, "tierstack_run_faults_total{").unwrap_or(0.0) > 0.0
            && sample(&body, "tierstack_run_fault_duration_seconds_count{").unwrap_or(0.0) > 0.0
        {
            live = Some(body);
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let Some(body) = live else {
        let _ = child.kill();
        let o = child.wait_with_output().expect("wait");
        panic!(
            "no live fault counters while the program ran; run said: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let names = check_format(&body);
    assert!(
        names.iter().any(|n| n == "tierstack_run_dram_budget_bytes"),
        "{body}"
    );
    assert!(
        body.lines()
            .any(|l| l.starts_with("tierstack_run_dram_budget_bytes{")
                && l.contains("pid=\"")
                && l.ends_with(" 67108864")),
        "{body}"
    );
    assert!(
        body.contains("# TYPE tierstack_run_fault_duration_seconds histogram"),
        "{body}"
    );
    assert!(
        sample(&body, "tierstack_run_fault_duration_seconds_count{").unwrap_or(0.0) > 0.0,
        "{body}"
    );
    promtool(&body);
    let out = ok(
        rd.path(),
        &["top", "--batch", "--iterations", "1", "--interval", "100ms"],
    );
    assert!(
        out.contains("RUN pid") && out.contains("python3") && out.contains("budget 64.0 MiB"),
        "{out}"
    );
    assert!(out.contains("1 paging, 0 exited"), "{out}");
    let out = ok(
        rd.path(),
        &["top", "--json", "--iterations", "1", "--interval", "100ms"],
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    let r = &v["runs"][0];
    assert!(r["faults"].as_u64().unwrap_or(0) > 0, "{v}");
    assert!(r["fault_p99_us"].as_u64().is_some(), "{v}");
    let st = child.wait().expect("wait");
    assert!(st.success());
    // The record is gone with the run.
    assert!(std::fs::read_dir(&runs).map_or(true, |mut r| r.next().is_none()));
}

#[test]
fn interactive_top_draws_and_quits_on_q() {
    // A pseudo-terminal from util-linux `script`; skipped where it is missing.
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: needs script(1) for a pseudo-terminal");
        return;
    }
    let rd = tempfile::tempdir().expect("tempdir");
    let mut c = Command::new("script")
        .args([
            "-qec",
            &format!("stty cols 120 rows 30; {BIN} top --interval 200ms"),
            "/dev/null",
        ])
        .env("TIERSTACK_RUN_DIR", rd.path())
        .env("TERM", "xterm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn script");
    std::thread::sleep(Duration::from_millis(1500));
    let mut stdin = c.stdin.take().expect("stdin");
    stdin.write_all(b"q").expect("send q");
    let t0 = Instant::now();
    while c.try_wait().expect("wait").is_none() {
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = c.kill();
            panic!("top did not quit on q within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(stdin);
    let o = c.wait_with_output().expect("output");
    assert!(o.status.success(), "top exited with {}", o.status);
    let screen = String::from_utf8_lossy(&o.stdout);
    assert!(
        screen.contains("mounts") && screen.contains("quit"),
        "{screen}"
    );
}
