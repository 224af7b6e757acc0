//! The multi-node test bed of contrib/testbed (issue 40) through the real thing: a MooseFS
//! (master + 2 chunkservers on throttled loop devices), 4 nodes in namespaces of their own and a
//! SLURM, brought up with `testbed.sh up`, used from several nodes (a file written on one node
//! and read on another, private /tmp, `srun -N4`, a real `tierstack mount` over a folder of the
//! shared file system drained by `tierstack umount`), then brought down with `testbed.sh down`,
//! which must leave nothing behind.
//!
//! Needs root and /dev/fuse (prints SKIP and passes elsewhere). MooseFS and SLURM must be
//! installed (CI's .ci/run installs them); where they are missing the test fails and says what
//! to install.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{is_root, random, repo_root, BIN};

/// Every command of the test bed runs under `timeout` with this bound (seconds).
const CMD_TIMEOUT: &str = "300";

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd} >/dev/null 2>&1")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A test bed under `root`; on drop (a failed assertion included) it is brought down, so that
/// no process, namespace, loop device or mount outlives the test. The root folder is removed
/// after a success and kept (with its logs) after a failure.
struct Bed {
    script: PathBuf,
    root: PathBuf,
    up: bool,
}

impl Bed {
    /// `testbed.sh SUB --root ROOT ARGS...`, bounded.
    fn run(&self, sub: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut c = Command::new("timeout");
        c.args(["-k", "10", CMD_TIMEOUT])
            .arg(&self.script)
            .arg(sub)
            .arg("--root")
            .arg(&self.root)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match stdin {
            None => {
                c.stdin(Stdio::null());
                c.output().expect("run testbed.sh")
            }
            Some(data) => {
                c.stdin(Stdio::piped());
                let mut child = c.spawn().expect("run testbed.sh");
                let mut i = child.stdin.take().expect("stdin");
                let data = data.to_vec();
                let w = std::thread::spawn(move || i.write_all(&data));
                let o = child.wait_with_output().expect("wait testbed.sh");
                w.join().expect("writer").expect("write stdin");
                o
            }
        }
    }

    /// `testbed.sh exec --root ROOT TARGET -- CMD...`.
    fn exec(&self, target: &str, cmd: &[&str]) -> Output {
        let mut args = vec![target, "--"];
        args.extend_from_slice(cmd);
        self.run("exec", &args, None)
    }

    /// `exec` that must succeed; its standard output.
    #[track_caller]
    fn exec_ok(&self, target: &str, cmd: &[&str]) -> String {
        let o = self.exec(target, cmd);
        assert!(
            o.status.success(),
            "{target}: {cmd:?} failed ({}): {}{}{}",
            o.status,
            text(&o.stdout),
            text(&o.stderr),
            self.logs()
        );
        text(&o.stdout)
    }

    /// The `KEY=VALUE` lines `status` (or `io-stats`) prints.
    fn env(&self, sub: &str) -> BTreeMap<String, String> {
        let o = self.run(sub, &[], None);
        assert!(
            o.status.success(),
            "testbed.sh {sub}: {}{}",
            text(&o.stdout),
            text(&o.stderr)
        );
        text(&o.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
            .collect()
    }

    /// The last lines of every log of the test bed, for failure messages.
    fn logs(&self) -> String {
        let mut out = String::new();
        let mut files: Vec<PathBuf> = fs::read_dir(self.root.join("log"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        for f in files {
            let t = fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = t.lines().collect();
            let tail = &lines[lines.len().saturating_sub(12)..];
            if !tail.is_empty() {
                out += &format!("\n--- {} (tail)\n{}", f.display(), tail.join("\n"));
            }
        }
        out
    }

    /// `down`, which must succeed; how long it took.
    fn down(&mut self) -> Duration {
        let t = Instant::now();
        let o = self.run("down", &[], None);
        let took = t.elapsed();
        self.up = false;
        assert!(
            o.status.success(),
            "testbed.sh down: {}{}{}",
            text(&o.stdout),
            text(&o.stderr),
            self.logs()
        );
        took
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if self.up {
            let o = self.run("down", &[], None);
            eprintln!(
                "clean-up: testbed.sh down: {}{}",
                text(&o.stdout),
                text(&o.stderr)
            );
        }
        if std::thread::panicking() {
            eprintln!("test bed root kept for its logs: {}", self.root.display());
        } else {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

/// What is left of a test bed after `down`: namespaces with its prefix, loop devices backed by
/// its files, mounts under its root, its cgroup, processes naming its root.
fn leftovers(root: &Path, prefix: &str) -> Vec<String> {
    let r = root.display().to_string();
    let mut left = Vec::new();
    let o = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    for l in text(&o.stdout).lines() {
        if l.starts_with(&format!("{prefix}-")) {
            left.push(format!("netns {l}"));
        }
    }
    let o = Command::new("losetup")
        .args(["-n", "-l", "-O", "NAME,BACK-FILE"])
        .output()
        .expect("losetup -l");
    for l in text(&o.stdout).lines() {
        if l.contains(&format!("{r}/")) {
            left.push(format!("loop device {l}"));
        }
    }
    let mi = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    for l in mi.lines() {
        if let Some(mp) = l.split(' ').nth(4) {
            if mp == r || mp.starts_with(&format!("{r}/")) {
                left.push(format!("mount {mp}"));
            }
        }
    }
    let cg = format!("/sys/fs/cgroup/blkio/testbed-{prefix}");
    if Path::new(&cg).exists() {
        left.push(format!("cgroup {cg}"));
    }
    let me = std::process::id();
    for e in fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = text(&cmd).replace('\0', " ");
        let comm = fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if cmd.contains(&r) || (comm.starts_with("mfs") && cmd.contains(prefix)) {
            left.push(format!("process {pid} {cmd}"));
        }
    }
    left
}

#[test]
fn testbed_four_nodes_moosefs_slurm_and_a_tierstack_mount() {
    if !is_root() {
        println!("SKIP: not root: the test bed makes namespaces, loop devices and mounts");
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        println!("SKIP: no /dev/fuse");
        return;
    }
    assert!(
        have("mfsmaster") && have("mfschunkserver") && have("mfsmount"),
        "MooseFS is not installed: apt-get install -y moosefs-master moosefs-chunkserver \
         moosefs-client (CI's .ci/run installs it)"
    );
    assert!(
        have("slurmctld") && have("slurmd") && have("srun"),
        "SLURM is not installed: apt-get install -y --no-install-recommends slurmctld slurmd \
         slurm-client slurm-wlm-basic-plugins (CI's .ci/run installs it)"
    );
    let script = repo_root().join("contrib/testbed/testbed.sh");
    let root = PathBuf::from(format!("/var/tmp/tierstack-testbed-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(root.join("data")).expect("mkdir root");
    let mut bed = Bed {
        script,
        root: root.clone(),
        up: true,
    };

    // Up, bounded.
    let t = Instant::now();
    let o = bed.run("up", &["--nodes", "4", "--slurm"], None);
    let up_took = t.elapsed();
    println!("testbed.sh up --nodes 4 --slurm took {up_took:.1?}");
    print!("{}", text(&o.stdout));
    assert!(
        o.status.success(),
        "testbed.sh up failed: {}{}{}",
        text(&o.stdout),
        text(&o.stderr),
        bed.logs()
    );
    assert!(up_took < Duration::from_secs(180), "up took {up_took:?}");
    let st = bed.env("status");
    assert_eq!(
        st.get("TESTBED_UP").map(String::as_str),
        Some("1"),
        "{st:?}"
    );
    assert_eq!(
        st.get("TESTBED_NODES").map(String::as_str),
        Some("4"),
        "{st:?}"
    );
    let prefix = st.get("TESTBED_PREFIX").expect("prefix in status").clone();
    for i in 1..=4 {
        assert_eq!(
            st.get(&format!("TESTBED_NODE{i}_ADDR")),
            Some(&format!("10.77.0.{}", 10 + i)),
            "{st:?}"
        );
        assert_eq!(
            bed.exec_ok(&format!("node{i}"), &["hostname"]).trim(),
            format!("node{i}")
        );
    }

    // A file written with dd on node1 (its bytes through exec's stdin) is read back, byte for
    // byte, on node4; after a drop of the caches the read comes from the chunkservers' disks.
    let data = random(8 << 20, 40);
    let o = bed.run(
        "exec",
        &[
            "node1",
            "--",
            "dd",
            "of=/mnt/pfs/from-node1.bin",
            "bs=1M",
            "iflag=fullblock",
            "conv=fsync",
            "status=none",
        ],
        Some(&data),
    );
    assert!(
        o.status.success(),
        "dd on node1: {}{}",
        text(&o.stderr),
        bed.logs()
    );
    let o = bed.run("drop-caches", &[], None);
    assert!(o.status.success(), "drop-caches: {}", text(&o.stderr));
    let before = bed.env("io-stats");
    let o = bed.exec("node4", &["cat", "/mnt/pfs/from-node1.bin"]);
    assert!(o.status.success(), "cat on node4: {}", text(&o.stderr));
    assert!(
        o.stdout == data,
        "node4 read {} bytes, not node1's {}",
        o.stdout.len(),
        data.len()
    );
    let after = bed.env("io-stats");
    let read = |m: &BTreeMap<String, String>| -> u64 {
        m.get("TESTBED_IO_READ_BYTES")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("TESTBED_IO_READ_BYTES in {m:?}"))
    };
    println!(
        "node4's read of 8 MiB read {} bytes from the chunkservers' loop devices",
        read(&after) - read(&before)
    );
    assert!(
        read(&after) - read(&before) >= data.len() as u64,
        "after drop-caches the read must come from the chunkservers' disks: {before:?} {after:?}"
    );

    // /tmp is private to each node (and none is the host's).
    let mark = format!("/tmp/tierstack-testbed-mark-{}", std::process::id());
    bed.exec_ok("node1", &["sh", "-c", &format!("echo node1 > {mark}")]);
    bed.exec_ok("node1", &["test", "-f", &mark]);
    let o = bed.exec("node2", &["test", "-e", &mark]);
    assert_eq!(o.status.code(), Some(1), "node1's {mark} seen in node2");
    assert!(
        !Path::new(&mark).exists(),
        "node1's {mark} seen on the host"
    );

    // SLURM: 4 idle nodes, and a step on each.
    let sinfo = bed.exec_ok("ctl", &["sinfo", "-h", "-N", "-o", "%N %T"]);
    let mut idle: Vec<&str> = sinfo
        .lines()
        .filter(|l| l.ends_with(" idle"))
        .map(|l| l.split(' ').next().unwrap_or(""))
        .collect();
    idle.sort();
    assert_eq!(idle, ["node1", "node2", "node3", "node4"], "sinfo: {sinfo}");
    let out = bed.exec_ok("ctl", &["timeout", "60", "srun", "-N4", "hostname"]);
    let mut hosts: Vec<&str> = out.lines().map(str::trim).collect();
    hosts.sort();
    assert_eq!(
        hosts,
        ["node1", "node2", "node3", "node4"],
        "srun -N4 hostname: {out}"
    );
    // `exec all`: every node at once, an exit line each.
    let o = bed.exec("all", &["hostname"]);
    assert!(o.status.success(), "exec all: {}", text(&o.stderr));
    for i in 1..=4 {
        assert!(
            text(&o.stdout).contains(&format!("node{i}: node{i}\n")),
            "{}",
            text(&o.stdout)
        );
        assert!(
            text(&o.stderr).contains(&format!("node{i}: exit 0")),
            "{}",
            text(&o.stderr)
        );
    }

    // A real tierstack mount in node2 over a folder of the shared file system: a file written
    // through it is, after `tierstack umount` (which drains), in the shared file system, as
    // node3 sees it.
    let ckpt = random(24 << 20, 41);
    let src = root.join("data/ckpt.bin");
    fs::write(&src, &ckpt).expect("write source");
    let src = src.to_str().expect("utf8 path");
    bed.exec_ok("node2", &["mkdir", "-p", "/mnt/pfs/ts-backing", "/mnt/ts"]);
    let t = Instant::now();
    bed.exec_ok(
        "node2",
        &[
            BIN,
            "mount",
            "/mnt/pfs/ts-backing",
            "/mnt/ts",
            "--drive-size",
            "64M",
            "--dram",
            "64M",
        ],
    );
    let o = bed.exec("node3", &["findmnt", "/mnt/ts"]);
    assert!(
        !o.status.success(),
        "node2's tierstack mount is seen in node3"
    );
    // node4 has a buffer of its own over the same folder, listed (and the name looked up,
    // absent) before node2 writes: what node2 drains shows there within `--coherence` (1 s).
    bed.exec_ok(
        "node4",
        &[
            "sh",
            "-c",
            &format!(
                "mkdir -p /mnt/ts && {BIN} mount /mnt/pfs/ts-backing /mnt/ts --drive-size 64M \
                 --dram 64M && ls /mnt/ts && ! stat /mnt/ts/ckpt.bin 2>/dev/null"
            ),
        ],
    );
    bed.exec_ok(
        "node2",
        &[
            "dd",
            &format!("if={src}"),
            "of=/mnt/ts/ckpt.bin",
            "bs=1M",
            "conv=fsync",
            "status=none",
        ],
    );
    let o = bed.exec("node2", &["timeout", "120", BIN, "umount", "/mnt/ts"]);
    assert!(
        o.status.success(),
        "tierstack umount in node2: {}{}{}",
        text(&o.stdout),
        text(&o.stderr),
        bed.logs()
    );
    println!(
        "tierstack mount + 24 MiB write + umount (drain) in node2: {:.1?}",
        t.elapsed()
    );
    // node4's buffer: the drained file, whole, within the coherence interval and a margin.
    let t = Instant::now();
    let o = bed.exec_ok(
        "node4",
        &[
            "sh",
            "-c",
            &format!(
                "for i in $(seq 1 200); do cmp -s {src} /mnt/ts/ckpt.bin && echo seen && break; \
                 sleep 0.05; done"
            ),
        ],
    );
    let seen = t.elapsed();
    println!("node2's drained file seen through node4's buffer after {seen:.1?}");
    assert!(
        o.contains("seen"),
        "node4's buffer never showed node2's file"
    );
    assert!(seen < Duration::from_secs(5), "seen only after {seen:?}");
    let o = bed.exec("node4", &["timeout", "120", BIN, "umount", "/mnt/ts"]);
    assert!(o.status.success(), "umount in node4: {}", text(&o.stderr));
    let o = bed.exec("node3", &["cat", "/mnt/pfs/ts-backing/ckpt.bin"]);
    assert!(o.status.success(), "cat on node3: {}", text(&o.stderr));
    assert!(
        o.stdout == ckpt,
        "node3 read {} bytes of the drained file, not the {} written in node2",
        o.stdout.len(),
        ckpt.len()
    );

    // Down, bounded, leaving nothing.
    let took = bed.down();
    println!("testbed.sh down took {took:.1?}");
    let left = leftovers(&root, &prefix);
    assert!(left.is_empty(), "left after down: {left:#?}");
    assert!(took < Duration::from_secs(60), "down took {took:?}");
    // down again: nothing to do, still a success.
    bed.down();
}

/// A test bed brought up (`testbed.sh up ARGS`) under `/var/tmp/tierstack-testbed-NAME-PID`
/// for a test without SLURM; None (after SKIP) without root or /dev/fuse.
fn bed_up(name: &str, args: &[&str]) -> Option<Bed> {
    if !is_root() || !Path::new("/dev/fuse").exists() {
        println!("SKIP: needs root and /dev/fuse");
        return None;
    }
    assert!(
        have("mfsmaster") && have("mfsmount"),
        "MooseFS is not installed: apt-get install -y moosefs-master moosefs-chunkserver \
         moosefs-client (CI's .ci/run installs it)"
    );
    let root = PathBuf::from(format!(
        "/var/tmp/tierstack-testbed-{name}-{}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root).expect("mkdir root");
    let bed = Bed {
        script: repo_root().join("contrib/testbed/testbed.sh"),
        root,
        up: true,
    };
    let o = bed.run("up", args, None);
    assert!(
        o.status.success(),
        "up: {}{}{}",
        text(&o.stdout),
        text(&o.stderr),
        bed.logs()
    );
    Some(bed)
}

/// Site-wide drain slots across nodes on MooseFS: while a process on node1 holds the only slot
/// (`flock` on `slot.0` in the shared system), node2's mount drains nothing; once that holder
/// dies (`kill -9`), node2's drain goes on, and `umount` leaves the file in the shared system.
/// node3, whose drain began to wait later than node2's, gets the slot after node2 (first come,
/// first served: the files' bytes arrive in that order). node1's buffer, in node2's drain
/// group (`--drain-group`: one job's nodes) and the last to begin, shares node2's place: its
/// bytes arrive before node3's.
#[test]
fn a_drain_slot_held_on_one_node_bounds_another_and_frees_when_its_holder_dies() {
    let Some(mut bed) = bed_up("slots", &["--nodes", "3", "--throttle", "0"]) else {
        return;
    };
    let slots = "/mnt/pfs/.slots";
    bed.exec_ok(
        "node1",
        &["sh", "-c", &format!("mkdir -p {slots} /mnt/pfs/out")],
    );
    // The holder: a process of node1 with the only slot locked, its pid in the shared system.
    bed.exec_ok(
        "node1",
        &[
            "sh",
            "-c",
            &format!(
                "flock {slots}/slot.0 sh -c 'echo $$ > /mnt/pfs/holder.pid; exec sleep 300' \
                 >/dev/null 2>&1 & sleep 1; test -s /mnt/pfs/holder.pid"
            ),
        ],
    );
    // node2's buffer writes a file: its drain waits for the slot.
    let mount = |name: &str, group: &str| {
        format!(
            "mkdir -p /mnt/bb && {BIN} mount /mnt/pfs/out /mnt/bb --dir /var/tmp/bb \
             --drain-slots 1 --drain-slots-dir {slots} --drain-group {group} && \
             head -c 1048576 /dev/urandom > /mnt/bb/{name} && sha256sum < /mnt/bb/{name}"
        )
    };
    let out = bed.exec_ok("node2", &["sh", "-c", &mount("f", "jobA")]);
    let sum = out.lines().last().unwrap_or_default().to_string() + "\n";
    // Well past the drain's quiet time and its longest delay: nothing may reach the shared
    // system while node1 holds the slot.
    std::thread::sleep(Duration::from_secs(7));
    // The file's name may be there (namespace rows are not drain streams), its bytes not.
    let seen = bed.exec_ok(
        "node1",
        &[
            "sh",
            "-c",
            "sha256sum < /mnt/pfs/out/f 2>/dev/null || echo none",
        ],
    );
    assert_ne!(seen, sum, "drained without a slot");
    // node3's buffer begins to wait later than node2's: first come, first served.
    let out3 = bed.exec_ok("node3", &["sh", "-c", &mount("g", "jobB")]);
    let sum3 = out3.lines().last().unwrap_or_default().to_string() + "\n";
    std::thread::sleep(Duration::from_secs(5));
    // node1's buffer, of node2's job, begins last.
    let out1 = bed.exec_ok("node1", &["sh", "-c", &mount("h", "jobA")]);
    let sum1 = out1.lines().last().unwrap_or_default().to_string() + "\n";
    std::thread::sleep(Duration::from_secs(3));
    // A watcher on node1 notes the order in which the two files' bytes arrive.
    bed.exec_ok(
        "node1",
        &[
            "sh",
            "-c",
            "cd /mnt/pfs/out && (for i in $(seq 1 3000); do \
               for n in f g h; do [ -e .$n.done ] || { [ \"$(stat -c %s $n 2>/dev/null)\" = 1048576 ] \
               && touch .$n.done && echo $n >> /mnt/pfs/order; }; done; \
               [ -e .f.done ] && [ -e .g.done ] && [ -e .h.done ] && break; sleep 0.02; done) \
               >/dev/null 2>&1 &",
        ],
    );
    // The holder dies: its lock goes with it, and node2 drains, then node3.
    bed.exec_ok("node1", &["sh", "-c", "kill -9 $(cat /mnt/pfs/holder.pid)"]);
    let t = Instant::now();
    bed.exec_ok(
        "node2",
        &["sh", "-c", &format!("{BIN} umount /mnt/bb --timeout 120")],
    );
    println!("umount after the holder died: {:.1?}", t.elapsed());
    for node in ["node1", "node3"] {
        bed.exec_ok(
            node,
            &["sh", "-c", &format!("{BIN} umount /mnt/bb --timeout 120")],
        );
    }
    let there = bed.exec_ok("node1", &["sh", "-c", "sha256sum < /mnt/pfs/out/f"]);
    assert_eq!(there, sum, "the shared system holds what node2 wrote");
    let there3 = bed.exec_ok("node1", &["sh", "-c", "sha256sum < /mnt/pfs/out/g"]);
    assert_eq!(there3, sum3, "the shared system holds what node3 wrote");
    let there1 = bed.exec_ok("node1", &["sh", "-c", "sha256sum < /mnt/pfs/out/h"]);
    assert_eq!(there1, sum1, "the shared system holds what node1 wrote");
    let t = Instant::now();
    let order = loop {
        let o = bed.exec_ok(
            "node1",
            &["sh", "-c", "cat /mnt/pfs/order 2>/dev/null; true"],
        );
        if o.lines().count() >= 3 || t.elapsed() > Duration::from_secs(20) {
            break o;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let order: Vec<&str> = order.split_whitespace().collect();
    println!("order the bytes arrived in: {order:?}");
    assert_eq!(order.len(), 3, "{order:?}");
    assert_eq!(
        order[2], "g",
        "the drain that waited first goes first, with its group: {order:?}"
    );
    bed.down();
}

/// Issue 40: a node that dies with data its buffer has not drained yet. node1's buffer over a
/// folder of the shared file system takes a large file and 200 small ones (each fsync'd: in
/// sync mode they are durable in the node's fast tier), and the node "dies" while the
/// drain to the throttled MooseFS runs: every process of the node gets kill -9 (its fast tier,
/// on the node's own /var/tmp, stays, as a node's NVMe does across a crash). While it is down,
/// another node sees in the shared folder whole files and, for those not drained yet, nothing
/// or an empty file (the namespace's replay makes a name before its data comes), never part of
/// a file's data (the drain renames a finished copy into place). When the
/// node comes back, `tierstack mount` of the same buffer recovers it, and `umount` drains the
/// rest: then the shared folder holds every byte that was written, checked by hash from the
/// other node. The times are printed (docs/SCALE.md has them).
#[test]
fn a_node_that_dies_with_undrained_data_drains_it_when_it_returns() {
    // 10 MB/s per chunkserver: the drain of 96 MiB takes seconds, so the node dies in it.
    let Some(mut bed) = bed_up("dead", &["--nodes", "2", "--throttle", "10"]) else {
        return;
    };
    let mount = format!(
        "mkdir -p /mnt/pfs/out /mnt/bb && {BIN} mount /mnt/pfs/out /mnt/bb --dir /var/tmp/bb"
    );
    bed.exec_ok("node1", &["sh", "-c", &mount]);
    let t = Instant::now();
    bed.exec_ok(
        "node1",
        &[
            "sh",
            "-c",
            "cd /mnt/bb && head -c 67108864 /dev/urandom > big && mkdir small && \
             for i in $(seq 1 200); do head -c $((4096 + i * 613)) /dev/urandom > small/f$i; done && \
             sync big small/* && find . -type f | sort | xargs sha256sum > /var/tmp/sums",
        ],
    );
    let wrote = t.elapsed();
    std::thread::sleep(Duration::from_millis(1500));
    // The node dies: its buffer's daemon gets kill -9 (the nodes share the host's process
    // table, so by its pid, from `status`).
    bed.exec_ok(
        "node1",
        &[
            "sh",
            "-c",
            &format!(
                "pid=$({BIN} status /mnt/bb --json | sed -nE 's/.*\"pid\": *([0-9]+).*/\\1/p') && \
                 test -n \"$pid\" && kill -9 $pid && sleep 1"
            ),
        ],
    );
    // What another node sees meanwhile: whole files, or files not drained yet: absent, or
    // empty where the namespace's replay made the name before the data came (a file's create
    // reaches the shared system before its contents); never part of a file's data.
    let sums = bed.exec_ok("node1", &["cat", "/var/tmp/sums"]);
    let check = format!(
        "cd /mnt/pfs/out && printf '%s' '{}' | while read h f; do \
           if [ -e \"$f\" ]; then [ \"$(sha256sum < \"$f\" | cut -d' ' -f1)\" = \"$h\" ] && echo whole || \
             {{ [ -s \"$f\" ] && echo PARTIAL $f || echo empty; }}; \
           else echo absent; fi; done | sort | uniq -c",
        sums.replace('\'', "")
    );
    let seen = bed.exec_ok("node2", &["sh", "-c", &check]);
    println!(
        "while node1 is down, node2 sees in the shared folder: {}",
        seen.trim()
    );
    assert!(
        !seen.contains("PARTIAL"),
        "a half-written file in the shared folder: {seen}"
    );
    // The node comes back: the same buffer is mounted again and drains the rest.
    let t = Instant::now();
    bed.exec_ok(
        "node1",
        &[
            "sh",
            "-c",
            &format!("umount -l /mnt/bb 2>/dev/null; {mount}"),
        ],
    );
    let remounted = t.elapsed();
    bed.exec_ok(
        "node1",
        &["sh", "-c", &format!("{BIN} umount /mnt/bb --timeout 300")],
    );
    let drained = t.elapsed();
    println!(
        "node1: wrote 64 MiB + 200 small files in {wrote:.1?}, killed 1.5 s later; back: \
         mounted again in {remounted:.1?}, everything in the shared folder {drained:.1?} after \
         its return"
    );
    let after = bed.exec_ok("node2", &["sh", "-c", &check]);
    assert_eq!(
        after.trim(),
        "201 whole",
        "after node1 came back and drained, the shared folder holds every file: {after}"
    );
    bed.down();
}

/// Issue 40: a node that dies in the middle of a stage-in fan-out. Four nodes stage 32 MiB of
/// inputs from the shared system (MooseFS, throttled to 10 MB/s per chunkserver) into their
/// buffers by fan-out in a tree of 2 (node1 reads the shared system; node2 and node3 get the
/// inputs from node1; node4 from node2), and node2's stager gets `kill -9` once it is under way.
/// node4, whose parent died, must read what it lacks from the shared system within the
/// fan-out's timeout and hold every input whole; node1 and node3 go on undisturbed. The times
/// and where node4's bytes came from are printed (docs/SCALE.md has them).
#[test]
fn a_node_that_dies_in_a_fan_out_leaves_its_child_to_the_shared_system() {
    let Some(mut bed) = bed_up("fanout", &["--nodes", "4", "--throttle", "10"]) else {
        return;
    };
    bed.exec_ok(
        "node1",
        &[
            "sh",
            "-c",
            "mkdir -p /mnt/pfs/in /mnt/pfs/res && for i in 1 2 3 4; do \
             head -c 16777216 /dev/urandom > /mnt/pfs/in/f$i; done && \
             cd /mnt/pfs/in && sha256sum f1 f2 f3 f4 > /mnt/pfs/res/in.sums",
        ],
    );
    let nodes = ["node1", "node2", "node3", "node4"];
    for n in nodes {
        bed.exec_ok(
            n,
            &[
                "sh",
                "-c",
                &format!(
                    "mkdir -p /mnt/si /var/tmp/si/back && {BIN} mount /var/tmp/si/back /mnt/si \
                     --dir /var/tmp/si/tier"
                ),
            ],
        );
    }
    // Reads come from the chunkservers' throttled disks, not their page cache.
    let o = bed.run("drop-caches", &[], None);
    assert!(o.status.success(), "drop-caches: {}", text(&o.stderr));
    // Every node's stager in the background, its pid and report in the shared system; the
    // children first (they wait for their parents).
    let t = Instant::now();
    for n in nodes.iter().rev() {
        bed.exec_ok(
            n,
            &[
                "sh",
                "-c",
                &format!(
                    "sh -c 'echo $$ > /mnt/pfs/res/pid.{n}; exec {BIN} stage in /mnt/pfs/in \
                     /mnt/si/in/ --fanout node1,node2,node3,node4 --fanout-degree 2 \
                     --fanout-timeout 20s --json > /mnt/pfs/res/{n}.json \
                     2> /mnt/pfs/res/{n}.err' >/dev/null 2>&1 &"
                ),
            ],
        );
    }
    // node2 dies once it is under way: node4 has part of the inputs from it.
    let mut under_way = false;
    while t.elapsed() < Duration::from_secs(30) {
        let o = bed.exec_ok(
            "node4",
            &["sh", "-c", "du -sb /mnt/si/in 2>/dev/null | cut -f1"],
        );
        if o.trim().parse::<u64>().unwrap_or(0) > 0 {
            under_way = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(under_way, "node4 never began to receive");
    bed.exec_ok(
        "node2",
        &["sh", "-c", "kill -9 $(cat /mnt/pfs/res/pid.node2)"],
    );
    println!("node2's stager killed {:.1?} after the start", t.elapsed());
    // The others finish (bounded: the fan-out's timeout and the shared system's read).
    for n in ["node1", "node3", "node4"] {
        let o = bed.exec_ok(
            n,
            &[
                "sh",
                "-c",
                &format!(
                    "for i in $(seq 1 1200); do [ -s /mnt/pfs/res/{n}.json ] && break; \
                     sleep 0.1; done; cat /mnt/pfs/res/{n}.json 2>/dev/null; \
                     cat /mnt/pfs/res/{n}.err 2>/dev/null >&2; true"
                ),
            ],
        );
        println!("{n} done {:.1?} after the start: {}", t.elapsed(), o.trim());
        let r: serde_json::Value = serde_json::from_str(o.trim())
            .unwrap_or_else(|e| panic!("{n}'s report ({e}): {o}{}", bed.logs()));
        let u = |k: &str| r.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        assert_eq!(u("from_parent") + u("from_shared"), 64 << 20, "{n}: {r}");
        if n == "node4" {
            assert!(
                u("from_shared") > 0 && !r["fell_back"].is_null(),
                "node4's parent died: it reads the shared system: {r}"
            );
        } else {
            assert!(r["fell_back"].is_null(), "{n} lost nothing: {r}");
        }
        // Every input whole in the node's buffer.
        bed.exec_ok(
            n,
            &[
                "sh",
                "-c",
                "cd /mnt/si/in && sha256sum -c --quiet /mnt/pfs/res/in.sums",
            ],
        );
    }
    assert!(
        t.elapsed() < Duration::from_secs(90),
        "took {:?}",
        t.elapsed()
    );
    for n in nodes {
        bed.exec_ok(
            n,
            &["sh", "-c", &format!("{BIN} umount /mnt/si --timeout 120")],
        );
    }
    bed.down();
}
