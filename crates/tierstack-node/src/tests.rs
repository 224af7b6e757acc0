//! Unit tests of the node services that need no mount: durations, command lines on one line,
//! a run's counters summed from its run folder, the probes of this process, and the exporter
//! answering over TCP.

use std::io::{Read, Write};
use std::time::Duration;

use crate::probe::{one_line, proc_io, rss_bytes};
use crate::runs::run_counters;
use crate::top::parse_interval;
use crate::NodeError;

#[test]
fn intervals() {
    assert_eq!(parse_interval("1s").unwrap(), Duration::from_secs(1));
    assert_eq!(parse_interval("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_interval("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(parse_interval(" 2 ").unwrap(), Duration::from_secs(2));
    for bad in ["soon", "10ms", "2h", "-1", "NaN", ""] {
        match parse_interval(bad) {
            Err(NodeError::Usage(m)) => assert!(m.contains("--interval"), "{m}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn command_lines_on_one_line() {
    assert_eq!(one_line("a\tb\n  c", 20), "a b c");
    assert_eq!(one_line("abcdefghij", 8), "abcde...");
    assert_eq!(one_line("abcdefgh", 8), "abcdefgh");
}

#[test]
fn run_counters_sum_live_and_exited_processes() {
    let dir = tempfile::tempdir().unwrap();
    let w = |name: &str, v: serde_json::Value| {
        std::fs::write(dir.path().join(name), v.to_string()).unwrap();
    };
    w(
        "10.json",
        serde_json::json!({"live": true, "resident": 100, "budget": 1000,
            "stats": {"faults": 5, "peak_resident": 70, "fault_latency_buckets": [1, 2],
                "sweeps": {"sweeps": 3, "read_max": 9}}}),
    );
    w(
        "11.json",
        serde_json::json!({"live": false, "budget": 4000,
            "stats": {"faults": 7, "peak_resident": 90, "fault_latency_buckets": [3, 0, 1],
                "sweeps": {"sweeps": 1, "read_max": 5}}}),
    );
    // A half-written file (the writers rename into place; a dot file is theirs) is skipped.
    std::fs::write(dir.path().join(".12.json.tmp"), b"{").unwrap();
    std::fs::write(dir.path().join("13.json"), b"{\"live\":").unwrap();
    let rc = run_counters(dir.path());
    assert_eq!((rc.live, rc.exited, rc.processes()), (1, 1, 2));
    assert_eq!(rc.live_resident, 100);
    assert_eq!(rc.budget, 4000);
    assert_eq!(rc.get("faults"), 12);
    assert_eq!(
        rc.get("peak_resident"),
        90,
        "a peak is the highest, not a sum"
    );
    assert_eq!(rc.get("missing"), 0);
    assert_eq!(rc.fault_buckets, vec![4, 2, 1]);
    // Passes are not summed: the process with the most of them.
    assert_eq!(
        rc.sweeps.as_ref().and_then(|s| s["read_max"].as_u64()),
        Some(9)
    );
    assert!(rc.get("sweeps") == 0, "an object is not a counter to sum");
}

#[test]
fn probes_of_this_process() {
    let me = std::process::id();
    assert!(rss_bytes(me).is_some_and(|r| r > 0));
    // /proc/PID/io is readable for our own process (it may be absent in some containers).
    if let Some(io) = proc_io(me) {
        assert!(io.rchar > 0);
    }
    assert!(rss_bytes(u32::MAX).is_none());
}

#[test]
fn the_exporter_answers_get_metrics_only() {
    let l = crate::metrics::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let reg = prometheus::Registry::new();
    let c = prometheus::IntCounter::new("tierstack_test_total", "a test counter").unwrap();
    reg.register(Box::new(c.clone())).unwrap();
    let c2 = c.clone();
    crate::metrics::serve(l, reg, move || c2.inc()).unwrap();
    let get = |path: &str| {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let a = get("/metrics");
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    assert!(
        a.contains("tierstack_test_total 1"),
        "refreshed before the answer: {a}"
    );
    assert!(get("/metrics?x=1").contains("tierstack_test_total 2"));
    assert!(get("/").starts_with("HTTP/1.1 404"));
    match crate::metrics::bind("not an address") {
        Err(NodeError::Usage(m)) => assert!(m.contains("give ADDR:PORT"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn job_ids_from_the_paths_of_slurm_buffers() {
    use crate::labels::job_from_path;
    use std::path::Path;
    let j = |p: &str| job_from_path(Path::new(p));
    // A job's buffer and a node-local one, as the hooks make them under --fast-dir.
    assert_eq!(
        j("/var/tmp/tierstack-slurm/jobs/4711/mnt").as_deref(),
        Some("4711")
    );
    assert_eq!(
        j("/var/tmp/tierstack-slurm/node/jobs/12/mnt").as_deref(),
        Some("12")
    );
    // The fast tier's folder and a drive in it.
    assert_eq!(j("/fast/jobs/9/tier").as_deref(), Some("9"));
    assert_eq!(j("/fast/jobs/9/tier/drive0").as_deref(), Some("9"));
    // The innermost match wins.
    assert_eq!(j("/a/jobs/1/mnt/x/jobs/2/mnt").as_deref(), Some("2"));
    for none in [
        "/scratch/mnt",
        "/fast/jobs/abc/mnt",
        "/fast/jobs/12/other",
        "/fast/jobs//mnt",
        "/fast/jobs/123456789012345678901/mnt",
        "jobs/5",
        "",
    ] {
        assert_eq!(j(none), None, "{none}");
    }
}

#[test]
fn job_ids_from_an_environment() {
    use crate::labels::job_from_environ;
    assert_eq!(
        job_from_environ(b"HOME=/root\0SLURM_JOB_ID=314\0PATH=/bin\0").as_deref(),
        Some("314")
    );
    assert_eq!(job_from_environ(b"SLURM_JOB_ID=77").as_deref(), Some("77"));
    for none in [
        &b"HOME=/root\0"[..],
        b"SLURM_JOB_ID=\0",
        b"SLURM_JOB_ID=12a\0",
        b"XSLURM_JOB_ID=5\0",
        b"SLURM_JOB_IDS=5\0",
        b"",
    ] {
        assert_eq!(job_from_environ(none), None, "{none:?}");
    }
}

#[test]
fn users_from_proc_and_the_user_database() {
    use crate::labels::{proc_uid, uid_from_status, user_name};
    assert_eq!(
        uid_from_status("Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t5\t5\t5\t5\n"),
        Some(1000)
    );
    assert_eq!(uid_from_status("Name:\tx\n"), None);
    assert_eq!(
        proc_uid(std::process::id()),
        Some(rustix::process::getuid().as_raw())
    );
    assert_eq!(user_name(0), "root");
    // A uid with no name is shown as its number.
    assert_eq!(user_name(3_999_999_999), "3999999999");
}

/// A mount's status as its daemon would answer, with `ops` FUSE operations.
fn status(mp: &str, pid: u32, held: u64, ops: usize) -> tierstack_fs::mount::MountStatus {
    let ops: Vec<serde_json::Value> = (0..ops)
        .map(|i| {
            serde_json::json!({"op": format!("op{i}"), "count": 10 + i, "mean_us": 12.5,
                "p50_us": 10, "p99_us": 50, "max_us": 90, "buckets": [1, 2, 3, 4]})
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "mountpoint": mp, "backing": "/nonexistent/backing", "pid": pid, "mode": "sync",
        "dirty_bytes": 4096, "dirty_files": 1, "pending_ops": 2, "drains_in_flight": 1,
        "drain_bytes_per_s": 1e6, "drained_bytes": 8192, "held_bytes": held,
        "limit_bytes": 1 << 30, "backpressure": false, "idle": false, "drain_retries": 0,
        "last_error": null, "array_state": "online", "ops": ops,
        "tiers": [{"name": "dram", "capacity_bytes": 100, "used_bytes": 50, "dirty_bytes": 5}],
    }))
    .unwrap()
}

fn text(reg: &prometheus::Registry) -> String {
    use prometheus::Encoder;
    let mut b = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&reg.gather(), &mut b)
        .unwrap();
    String::from_utf8(b).unwrap()
}

#[test]
fn mount_families_fill_clear_and_forget() {
    use crate::metrics::{Devices, MountMetrics};
    let reg = prometheus::Registry::new();
    let m = MountMetrics::new(&reg).unwrap();
    let d = Devices::new(&reg).unwrap();
    // A pid that does not exist: no /proc figures, the rest from the status.
    let a = ["/mnt/a", "42", "alice"];
    let b = ["/mnt/b", "", "bob"];
    m.answered(&a, Some(Duration::from_millis(2)));
    m.fill(&a, &status("/mnt/a", u32::MAX, 1234, 2), &d);
    m.answered(&b, Some(Duration::from_millis(3)));
    m.fill(&b, &status("/mnt/b", u32::MAX, 99, 1), &d);
    let t = text(&reg);
    assert!(
        t.contains(r#"tierstack_held_bytes{mountpoint="/mnt/a",slurm_job="42",user="alice"} 1234"#),
        "{t}"
    );
    assert!(t.contains(r#"tierstack_held_bytes{mountpoint="/mnt/b",slurm_job="",user="bob"} 99"#));
    assert!(t.contains(
        r#"tierstack_fuse_ops_total{mountpoint="/mnt/a",op="op1",slurm_job="42",user="alice"} 11"#
    ));
    assert!(t.contains(
        r#"tierstack_tier_used_bytes{mountpoint="/mnt/a",slurm_job="42",tier="dram",user="alice"} 50"#
    ));
    assert!(t.contains(
        r#"tierstack_fuse_op_duration_seconds_count{mountpoint="/mnt/b",op="op0",slurm_job="",user="bob"} 10"#
    ));
    assert!(t.contains(r#"tierstack_control_request_duration_seconds_count{mountpoint="/mnt/b",slurm_job="",user="bob"} 1"#));
    // The next scrape finds /mnt/a only: /mnt/b is gone from every family.
    m.clear();
    m.forget(&b);
    m.answered(&a, Some(Duration::from_millis(2)));
    m.fill(&a, &status("/mnt/a", u32::MAX, 2000, 2), &d);
    let t = text(&reg);
    assert!(!t.contains("/mnt/b"), "{t}");
    assert!(
        t.contains(r#"tierstack_held_bytes{mountpoint="/mnt/a",slurm_job="42",user="alice"} 2000"#)
    );
    // The measured histogram keeps its counts across scrapes.
    assert!(
        t.contains(r#"tierstack_control_request_duration_seconds_count{mountpoint="/mnt/a",slurm_job="42",user="alice"} 2"#),
        "{t}"
    );
}

/// What one mount costs the exporter beyond its status request: emptying the families and
/// filling them again, against a registry built afresh, 20 mounts with 30 operations each.
/// `cargo test --release -p tierstack-node fill_cost -- --ignored --nocapture`
#[test]
#[ignore]
fn fill_cost() {
    use crate::metrics::{Devices, MountMetrics};
    use std::time::Instant;
    let sts: Vec<_> = (0..20)
        .map(|i| status(&format!("/mnt/m{i}"), u32::MAX, 1 << 20, 30))
        .collect();
    let labels: Vec<[String; 3]> = (0..20)
        .map(|i| [format!("/mnt/m{i}"), i.to_string(), "root".to_string()])
        .collect();
    let n = 200;
    let fill = |m: &MountMetrics, d: &Devices| {
        for (s, l) in sts.iter().zip(&labels) {
            let l = crate::metrics::label_refs(l);
            m.answered(&l, Some(Duration::from_micros(100)));
            m.fill(&l, s, d);
        }
    };
    let reg = prometheus::Registry::new();
    let m = MountMetrics::new(&reg).unwrap();
    let d = Devices::new(&reg).unwrap();
    let t0 = Instant::now();
    for _ in 0..n {
        m.clear();
        d.clear();
        fill(&m, &d);
        std::hint::black_box(text(&reg));
    }
    let kept = t0.elapsed().as_secs_f64() * 1e3 / n as f64;
    let t0 = Instant::now();
    for _ in 0..n {
        let reg = prometheus::Registry::new();
        let m = MountMetrics::new(&reg).unwrap();
        let d = Devices::new(&reg).unwrap();
        fill(&m, &d);
        std::hint::black_box(text(&reg));
    }
    let fresh = t0.elapsed().as_secs_f64() * 1e3 / n as f64;
    println!(
        "20 mounts x 30 ops, fill + encode: emptied families {kept:.3} ms/scrape ({:.3} ms/mount), fresh registry {fresh:.3} ms/scrape ({:.3} ms/mount)",
        kept / 20.0,
        fresh / 20.0
    );
}
