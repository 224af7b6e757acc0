//! The systemd units of contrib/systemd: `systemd-analyze verify` accepts them (with
//! `@BINDIR@` set to this build's binary, as `make install` sets it), and the commands their
//! `ExecStart=` lines run work: the boot recovery on a node with nothing to recover, and a
//! site buffer in the foreground that `systemctl stop` (SIGTERM) ends cleanly, with what was
//! written kept.
//!
//! `tierstack@.service` is `Type=notify`: with a `NOTIFY_SOCKET` of the test's own (a datagram
//! socket in a temporary folder, as systemd's), `tierstack mount --foreground` says `READY=1`
//! only once its mount point is a FUSE mount that serves, and `STOPPING=1` when SIGTERM
//! starts its stop; `tierstack mount` (the daemon spawned) says `MAINPID=` of the daemon with
//! its `READY=1`, and the daemon `STOPPING=1`; a `tierstack mount` run below another service
//! (`SYSTEMD_EXEC_PID` names another process) says nothing, nor does its daemon.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{detach, is_mounted, ok, root_with_fuse, s, BIN};

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
    let files: Vec<PathBuf> = [
        "tierstack-recover.service",
        "tierstack@.service",
        "tierstack-exporter.service",
    ]
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
        .arg(&files[2])
        .output()
        .expect("systemd-analyze (the systemd package) is installed by .ci/run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.trim().is_empty(), "{err}");
}

/// The exporter's unit runs `tierstack exporter` on the configured address (here through
/// the configuration's variable, as an `Environment=` line or the site file would give it):
/// it answers a scrape, and `systemctl stop`'s SIGTERM ends it with status 0.
#[test]
fn the_exporter_unit_serves_and_stops_on_sigterm() {
    let t = tempfile::tempdir().expect("tmp");
    let unit = installed("tierstack-exporter.service", t.path());
    let args = exec_args(&unit);
    assert_eq!(args, ["exporter"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(BIN)
        .args(&args)
        .env("TIERSTACK_EXPORTER_LISTEN", &addr)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("exporter");
    let t0 = std::time::Instant::now();
    let body = loop {
        use std::io::{Read, Write};
        if let Ok(mut c) = std::net::TcpStream::connect(&addr) {
            c.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                .expect("ask");
            let mut out = String::new();
            c.read_to_string(&mut out).expect("answer");
            break out;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "no answer at {addr}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(body.contains("tierstack_exporter_mounts"), "{body}");
    // SAFETY: kill(2) of the exporter this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t1 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        assert!(
            t1.elapsed() < std::time::Duration::from_secs(10),
            "no exit on SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
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

/// A `NOTIFY_SOCKET` of the test's own: a datagram socket bound in a temporary folder.
struct NotifySocket {
    sock: UnixDatagram,
    path: PathBuf,
}

impl NotifySocket {
    fn new(dir: &Path) -> NotifySocket {
        let path = dir.join("notify");
        let sock = UnixDatagram::bind(&path).expect("bind the notify socket");
        NotifySocket { sock, path }
    }

    /// The next message, or None when none comes within `wait`.
    fn next(&self, wait: Duration) -> Option<String> {
        self.sock
            .set_read_timeout(Some(wait))
            .expect("read timeout");
        let mut buf = [0u8; 4096];
        match self.sock.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("recv on the notify socket: {e}"),
        }
    }

    /// The messages up to and including the first with the line `want`, which must come
    /// within `wait` (`alive` is asked between tries: false ends the wait early).
    #[track_caller]
    fn until(&self, want: &str, wait: Duration, mut alive: impl FnMut() -> bool) -> Vec<String> {
        let t0 = Instant::now();
        let mut got = Vec::new();
        while t0.elapsed() < wait {
            if let Some(m) = self.next(Duration::from_millis(200)) {
                let done = m.lines().any(|l| l == want);
                got.push(m);
                if done {
                    return got;
                }
            } else if !alive() {
                break;
            }
        }
        panic!("no {want} within {wait:?}; received {got:?}");
    }
}

/// The value of `KEY=` in the message `m`.
fn field<'a>(m: &'a str, key: &str) -> Option<&'a str> {
    m.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

/// Three fresh folders under `t`: BACKING, the mount point and the fast tier.
fn folders(t: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (backing, mnt, fast) = (t.join("b"), t.join("m"), t.join("f"));
    for d in [&backing, &mnt, &fast] {
        std::fs::create_dir(d).expect("mkdir");
    }
    (backing, mnt, fast)
}

/// The mount is a FUSE mount that serves: its type says fuse, a file written through it
/// reads back, and `tierstack status` answers for it.
#[track_caller]
fn serves(mnt: &Path) {
    let ty = tierstack_common::mounts::mounted_type(mnt);
    assert!(
        ty.as_deref().is_some_and(|t| t.starts_with("fuse")),
        "{} is not a FUSE mount: {ty:?}",
        mnt.display()
    );
    std::fs::write(mnt.join("probe"), b"served").expect("write through the mount");
    assert_eq!(std::fs::read(mnt.join("probe")).expect("read"), b"served");
    ok(&["status", s(mnt)]);
}

/// Sends SIGTERM to `pid` (a process this test started).
fn sigterm(pid: u32) {
    // SAFETY: kill(2) on a process this test started.
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
}

/// Whether the process `pid` still exists (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|st| st.rsplit(") ").next().is_some_and(|r| !r.starts_with('Z')))
}

/// Detaches the mount and kills the daemon when the test ends early.
struct Cleanup<'a> {
    mnt: &'a Path,
    pid: Option<u32>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            detach(self.mnt, self.pid);
        }
    }
}

#[test]
fn a_foreground_mount_notifies_ready_once_served_and_stopping_on_sigterm() {
    if !root_with_fuse() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let (backing, mnt, fast) = folders(t.path());
    let ns = NotifySocket::new(t.path());
    // The unit's command line (--foreground), under the test's NOTIFY_SOCKET.
    let mut child = Command::new(BIN)
        .args([
            "mount",
            "--foreground",
            "--on-stop",
            "persist",
            "--dram",
            "64M",
            "--dir",
        ])
        .args([&fast, &backing, &mnt])
        .env("NOTIFY_SOCKET", &ns.path)
        .env_remove("SYSTEMD_EXEC_PID")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start");
    let pid = child.id();
    let _cleanup = Cleanup {
        mnt: &mnt,
        pid: Some(pid),
    };
    let msgs = ns.until("READY=1", Duration::from_secs(60), || alive(pid));
    // READY=1 comes only once the mount point is a FUSE mount that answers.
    serves(&mnt);
    let ready = msgs.last().expect("a message");
    assert_eq!(msgs.len(), 1, "nothing before READY=1: {msgs:?}");
    // The process systemd started serves: no hand-over.
    assert_eq!(field(ready, "MAINPID"), None, "{ready}");
    let status = field(ready, "STATUS").expect("STATUS=");
    assert!(status.contains(s(&mnt)), "{status}");

    sigterm(pid);
    let msgs = ns.until("STOPPING=1", Duration::from_secs(30), || alive(pid));
    assert!(
        msgs.iter().all(|m| !m.lines().any(|l| l == "READY=1")),
        "a second READY=1: {msgs:?}"
    );
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(150),
            "the daemon did not stop within the unit's TimeoutStopSec"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    assert!(st.success(), "exit {st:?}: {err}");
    assert!(!is_mounted(&mnt), "the mount is gone");
}

#[test]
fn a_spawned_daemon_is_handed_the_service_with_mainpid() {
    if !root_with_fuse() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let (backing, mnt, fast) = folders(t.path());
    let ns = NotifySocket::new(t.path());
    let mut parent = Command::new(BIN)
        .args(["mount", "--dram", "64M", "--dir"])
        .args([&fast, &backing, &mnt])
        .env("NOTIFY_SOCKET", &ns.path)
        .env_remove("SYSTEMD_EXEC_PID")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start");
    let parent_pid = parent.id();
    let mut cleanup = Cleanup {
        mnt: &mnt,
        pid: None,
    };
    let msgs = ns.until("READY=1", Duration::from_secs(120), || alive(parent_pid));
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    let daemon: u32 = field(&msgs[0], "MAINPID")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no MAINPID= with READY=1: {msgs:?}"));
    cleanup.pid = Some(daemon);
    assert_ne!(
        daemon, parent_pid,
        "MAINPID names the daemon, not `tierstack mount`"
    );
    assert!(parent.wait().expect("wait").success());
    serves(&mnt);
    let st: serde_json::Value =
        serde_json::from_str(&ok(&["status", "--json", s(&mnt)])).expect("status json");
    assert_eq!(st["pid"].as_u64(), Some(u64::from(daemon)), "{st}");

    // systemctl stop signals MAINPID: the daemon says STOPPING=1 itself.
    sigterm(daemon);
    ns.until("STOPPING=1", Duration::from_secs(30), || alive(daemon));
    let t0 = Instant::now();
    while alive(daemon) {
        assert!(
            t0.elapsed() < Duration::from_secs(150),
            "the daemon did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!is_mounted(&mnt), "the mount is gone");
}

#[test]
fn a_mount_below_another_service_never_notifies() {
    if !root_with_fuse() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let (backing, mnt, fast) = folders(t.path());
    let ns = NotifySocket::new(t.path());
    // As slurmd's Prolog: slurmd's NOTIFY_SOCKET and SYSTEMD_EXEC_PID (slurmd's pid, not ours).
    let o = Command::new(BIN)
        .args(["mount", "--dram", "64M", "--dir"])
        .args([&fast, &backing, &mnt])
        .env("NOTIFY_SOCKET", &ns.path)
        .env("SYSTEMD_EXEC_PID", "1")
        .output()
        .expect("mount");
    let _cleanup = Cleanup {
        mnt: &mnt,
        pid: None,
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serves(&mnt);
    let um = Command::new(BIN)
        .arg("umount")
        .arg(&mnt)
        .output()
        .expect("umount");
    assert!(
        um.status.success(),
        "{}",
        String::from_utf8_lossy(&um.stderr)
    );
    assert!(!is_mounted(&mnt));
    // Neither `tierstack mount` nor its daemon (whose stop has begun and ended) said anything.
    assert_eq!(ns.next(Duration::from_millis(500)), None);
}
