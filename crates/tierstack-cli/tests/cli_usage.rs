//! Every usage error — a bad option value on any command — is one line naming the option and
//! its fix, exit status 2 (as clap's own errors), and creates nothing.

mod common;

use common::ts;

#[test]
fn bad_option_values_exit_2_with_one_line() {
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path().to_str().expect("utf-8 path");
    let none = format!("{t}/none");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["stage", "in", "--jobs", "0", t, &none], "--jobs"),
        (vec!["bench", "mem", "--threads", "0"], "--threads"),
        (vec!["bench", "mem", "--dram", "0"], "--dram"),
        (
            vec!["bench", "array", "--dir", &none, "--threads", "0"],
            "--threads",
        ),
        (vec!["bench", "vram", "--threads", "0"], "--threads"),
        (
            vec!["bench", "checkpoint", "--file-size", "1X"],
            "--file-size",
        ),
        (
            vec!["array", "show", &none, "--queue-depth", "0"],
            "--queue-depth",
        ),
        (vec!["top", "--batch", "--interval", "soon"], "--interval"),
        (vec!["top", "--batch", "--iterations", "0"], "--iterations"),
        (vec!["demo", "--dir", t, "--size", "1M"], "--size"),
        (vec!["run", "--dram", "1X", "--", "true"], "--dram"),
        (
            vec!["mount", t, &none, "--drain-group", "a/b"],
            "--drain-group",
        ),
        (
            vec![
                "run",
                "--dram",
                "64M",
                "--metrics",
                "not an address",
                "--",
                "true",
            ],
            "--metrics",
        ),
        (
            vec!["slurm", "install", "--conf-dir", t, "--pool-size", "2X"],
            "--pool-size",
        ),
    ];
    for (args, flag) in cases {
        let o = ts(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "tierstack {args:?}: {err}");
        assert_eq!(
            err.trim().lines().count(),
            1,
            "tierstack {args:?}: one line: {err}"
        );
        assert!(err.contains(flag), "tierstack {args:?} names {flag}: {err}");
    }
    assert!(!std::path::Path::new(&none).exists());
    assert_eq!(
        std::fs::read_dir(tmp.path()).expect("dir").count(),
        0,
        "nothing created"
    );
}
