//! The systemd units of contrib/systemd: `systemd-analyze verify` accepts them (with
//! `@BINDIR@` set to this build's binary, as `make install` sets it), and the commands their
//! `ExecStart=` lines run work: the boot recovery on a node with nothing to recover, and a
//! site buffer in the foreground that `systemctl stop` (SIGTERM) ends cleanly, with what was
//! written kept.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{detach, is_mounted, root_with_fuse, BIN};

fn units() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd")
}

/// The unit `name` with `@BINDIR@` replaced, written into `dir`.
fn installed(name: &str, dir: &Path) -> PathBuf {
    let bindir = Path::new(BIN).parent().expect("bin dir");
    let text = std::fs::read_to_string(units().join(name)).expect("unit");
    let p = dir.join(name);
    std::fs::write(&p, text.replace("@BINDIR@", &bindir.to_string_lossy())).expect("write");
    p
}

/// The words of the unit's `ExecStart=` after the binary.
fn exec_args(unit: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(unit).expect("unit");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart=");
    line.split_whitespace()
        .skip(1)
        .map(str::to_string)
        .collect()
}

#[test]
fn systemd_analyze_accepts_the_units() {
    let t = tempfile::tempdir().expect("tmp");
    let files: Vec<PathBuf> = ["tierstack-recover.service", "tierstack@.service"]
        .iter()
        .map(|n| installed(n, t.path()))
        .collect();
    // An instance of the template, as `systemctl enable tierstack@scratch` makes it.
    let inst = t.path().join("tierstack@scratch.service");
    std::fs::copy(&files[1], &inst).expect("copy");
    let o = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&files[0])
        .arg(&inst)
        .output()
        .expect("systemd-analyze (the systemd package) is installed by .ci/run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.trim().is_empty(), "{err}");
}

#[test]
fn the_boot_recovery_command_runs_on_a_node_with_nothing_to_recover() {
    let t = tempfile::tempdir().expect("tmp");
    let unit = installed("tierstack-recover.service", t.path());
    let mut args = exec_args(&unit);
    assert_eq!(args[..2], ["buffers", "--recover"]);
    let empty = t.path().join("none");
    std::fs::create_dir(&empty).expect("mkdir");
    args.extend(["--in".into(), empty.to_string_lossy().into_owned()]);
    let o = Command::new(BIN).args(&args).output().expect("run");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_site_buffer_stops_cleanly_on_systemctl_stop() {
    if !root_with_fuse() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let unit = installed("tierstack@.service", t.path());
    let (backing, mnt, fast) = (t.path().join("b"), t.path().join("m"), t.path().join("f"));
    for d in [&backing, &mnt, &fast] {
        std::fs::create_dir(d).expect("mkdir");
    }
    // The unit's command line with its EnvironmentFile's values, as systemd expands it.
    let opts = format!("--dram 64M --dir {}", fast.display());
    let args: Vec<String> = exec_args(&unit)
        .into_iter()
        .flat_map(|w| match w.as_str() {
            "${ON_STOP}" => vec!["persist".to_string()],
            "$OPTIONS" => opts.split_whitespace().map(str::to_string).collect(),
            "${BACKING}" => vec![backing.to_string_lossy().into_owned()],
            "${MOUNTPOINT}" => vec![mnt.to_string_lossy().into_owned()],
            _ => vec![w],
        })
        .collect();
    let mut child = Command::new(BIN)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start");
    let t0 = Instant::now();
    while !is_mounted(&mnt) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "not mounted in 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(mnt.join("kept"), b"written before the stop").expect("write");
    // SAFETY: kill(2) on the daemon this test started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(150) {
            detach(&mnt, Some(child.id()));
            panic!("the daemon did not stop within the unit's TimeoutStopSec");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit {status:?}");
    assert!(!is_mounted(&mnt), "the mount is gone");
    // The next start (systemd's, after a reboot) finds what was written.
    let o = Command::new(BIN)
        .args(["mount", "--dram", "64M", "--dir"])
        .arg(&fast)
        .arg(&backing)
        .arg(&mnt)
        .output()
        .expect("mount");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = std::fs::read(mnt.join("kept"));
    let um = Command::new(BIN)
        .arg("umount")
        .arg(&mnt)
        .output()
        .expect("umount");
    assert_eq!(got.expect("read"), b"written before the stop");
    assert!(
        um.status.success(),
        "{}",
        String::from_utf8_lossy(&um.stderr)
    );
    assert_eq!(
        std::fs::read(backing.join("kept")).expect("drained"),
        b"written before the stop"
    );
}
