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
            "stats": {"faults": 5, "peak_resident": 70, "fault_latency_buckets": [1, 2]}}),
    );
    w(
        "11.json",
        serde_json::json!({"live": false, "budget": 4000,
            "stats": {"faults": 7, "peak_resident": 90, "fault_latency_buckets": [3, 0, 1]}}),
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
