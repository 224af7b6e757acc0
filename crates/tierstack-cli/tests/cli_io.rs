//! Issue 39: the interception client (`tierstack exec MOUNT -- CMD`, libtierstack_io.so)
//! through the real CLI, a real FUSE mount and real programs (Python, sh): what a program under
//! the client changes is what a shell through FUSE sees at every step, and the other way
//! round; forks, exec'd children, `mmap`, locks and `dup2` get real descriptors; a program
//! killed with -9 leaves its handles released and its data kept; a daemon that dies makes the
//! client fail calls with EIO instead of hanging; another user's process is refused the
//! channel and served by FUSE; bad arguments are one-line errors. Needs root and /dev/fuse
//! (elsewhere each test prints why and passes).

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{detach, fails, is_mounted, root_with_fuse, success_stdout, BIN};

/// The runtime folder of every test's mount (its sockets and log), inside its temporary
/// folder: a daemon killed by a test leaves nothing in /run/tierstack.
fn run_dir(tmp: &Path) -> PathBuf {
    tmp.join("run")
}

/// `tierstack ARGS` with the test's runtime folder; its standard output (it must succeed).
#[track_caller]
fn ok_in(rd: &Path, args: &[&str]) -> String {
    let o = Command::new(BIN)
        .args(args)
        .env("TIERSTACK_RUN_DIR", rd)
        .output()
        .expect("run tierstack");
    success_stdout(args, o)
}

struct Fx {
    _tmp: tempfile::TempDir,
    backing: PathBuf,
    mnt: PathBuf,
    pid: Option<u32>,
}

impl Fx {
    fn new(extra: &[&str]) -> Fx {
        let tmp = tempfile::Builder::new()
            .prefix("ts-io-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let (backing, mnt) = (tmp.path().join("backing"), tmp.path().join("mnt"));
        fs::create_dir(&backing).expect("mkdir");
        fs::create_dir(&mnt).expect("mkdir");
        let fast = tmp.path().join("fast");
        let mut args = vec![
            "mount",
            backing.to_str().expect("utf8"),
            mnt.to_str().expect("utf8"),
            "--dir",
            fast.to_str().expect("utf8"),
        ];
        args.extend_from_slice(extra);
        ok_in(&run_dir(tmp.path()), &args);
        let mut fx = Fx {
            _tmp: tmp,
            backing,
            mnt,
            pid: None,
        };
        fx.pid = fx.status()["pid"].as_u64().map(|p| p as u32);
        fx
    }

    fn rd(&self) -> PathBuf {
        run_dir(self._tmp.path())
    }

    /// `tierstack exec MNT --` with the test's runtime folder, ready for the command.
    fn exec(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("TIERSTACK_RUN_DIR", self.rd())
            .arg("exec")
            .arg(&self.mnt)
            .arg("--");
        c
    }

    fn status(&self) -> serde_json::Value {
        let out = ok_in(
            &self.rd(),
            &["status", self.mnt.to_str().expect("utf8"), "--json"],
        );
        serde_json::from_str(&out).expect("status json")
    }

    fn io_calls(&self) -> u64 {
        self.status()["io_calls"].as_u64().expect("io_calls")
    }

    fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    fn umount(&mut self) {
        let mnt = self.mnt.to_str().expect("utf8");
        ok_in(&self.rd(), &["umount", mnt, "--timeout", "60s"]);
        assert!(!is_mounted(&self.mnt));
        self.pid = None;
    }
}

impl Drop for Fx {
    fn drop(&mut self) {
        detach(&self.mnt, self.pid);
    }
}

fn python() -> Option<&'static str> {
    ["/usr/bin/python3", "python3"].into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "pass"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn can_run() -> Option<&'static str> {
    if !root_with_fuse() {
        return None;
    }
    let p = python();
    if p.is_none() {
        eprintln!("SKIP: no python3");
    }
    p
}

/// A Python program under the client that runs the commands it reads, one per line, and
/// answers each with one line (`ok VALUE` or `err ERRNO-NAME`).
struct Prog {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

const DRIVER: &str = r#"
import errno, json, os, sys
fds = {}
def run(cmd, a):
    if cmd == "write":
        fd = os.open(a[0], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, a[1].encode()); os.close(fd); return None
    if cmd == "append":
        fd = os.open(a[0], os.O_WRONLY | os.O_APPEND); os.write(fd, a[1].encode()); os.close(fd); return None
    if cmd == "read":
        with open(a[0], "rb") as f: return f.read().decode()
    if cmd == "stat":
        s = os.stat(a[0]); return [s.st_size, oct(s.st_mode), s.st_nlink]
    if cmd == "full":
        s = os.stat(a[0], follow_symlinks=(len(a) < 2))
        return [s.st_ino, s.st_size, oct(s.st_mode), s.st_nlink, s.st_uid]
    if cmd == "statn":
        for _ in range(int(a[1])): s = os.stat(a[0])
        return s.st_size
    if cmd == "fstat": return os.fstat(fds[a[0]]).st_size
    if cmd == "mtime": return os.stat(a[0]).st_mtime_ns
    if cmd == "mkdir": os.mkdir(a[0]); return None
    if cmd == "rmdir": os.rmdir(a[0]); return None
    if cmd == "unlink": os.unlink(a[0]); return None
    if cmd == "rename": os.rename(a[0], a[1]); return None
    if cmd == "chmod": os.chmod(a[0], int(a[1], 8)); return None
    if cmd == "truncate":
        fd = os.open(a[0], os.O_WRONLY); os.ftruncate(fd, int(a[1])); os.close(fd); return None
    if cmd == "list": return sorted(os.listdir(a[0]))
    if cmd == "open": fds[a[0]] = os.open(a[0], os.O_RDWR | os.O_CREAT, 0o644); return fds[a[0]]
    if cmd == "pwrite": return os.pwrite(fds[a[0]], a[1].encode(), int(a[2]))
    if cmd == "fsync": os.fsync(fds[a[0]]); return None
    if cmd == "ropen": fds["r:" + a[0]] = os.open(a[0], os.O_RDONLY); return None
    if cmd == "rest":
        out = b""
        while True:
            b = os.read(fds["r:" + a[0]], 65536)
            if not b: return out.decode()
            out += b
    if cmd == "eofn":
        fd = fds["r:" + a[0]]; end = os.fstat(fd).st_size
        return sum(len(os.pread(fd, 100, end)) for _ in range(int(a[1])))
    raise ValueError(cmd)
for line in sys.stdin:
    cmd, *a = json.loads(line)
    try:
        r = ["ok", run(cmd, a)]
    except OSError as e:
        r = ["err", errno.errorcode.get(e.errno, str(e.errno))]
    print(json.dumps(r), flush=True)
"#;

impl Prog {
    fn start(py: &str, fx: &Fx) -> Prog {
        let script = fx._tmp.path().join("driver.py");
        fs::write(&script, DRIVER).expect("write driver");
        let mut child = fx
            .exec()
            .arg(py)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the driver");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        Prog {
            child,
            input,
            output,
        }
    }

    fn ask(&mut self, cmd: serde_json::Value) -> serde_json::Value {
        writeln!(self.input, "{cmd}").expect("send");
        self.input.flush().expect("flush");
        let mut line = String::new();
        self.output.read_line(&mut line).expect("answer");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad answer {line:?}: {e}"))
    }
}

impl Drop for Prog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn p(path: &Path) -> String {
    path.to_str().expect("utf8").to_string()
}

/// The tree under `root` as FUSE shows it: path -> (mode, size, content).
fn fuse_tree(root: &Path) -> Vec<(String, u32, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).expect("read_dir") {
            let e = e.expect("entry");
            let md = fs::symlink_metadata(e.path()).expect("lstat");
            let rel = p(e.path().strip_prefix(root).expect("prefix"));
            use std::os::unix::fs::MetadataExt;
            let body = if md.is_file() {
                fs::read(e.path()).expect("read")
            } else {
                stack.push(e.path());
                Vec::new()
            };
            out.push((rel, md.mode(), md.size(), body));
        }
    }
    out.sort();
    out
}

#[test]
fn a_program_under_the_client_and_a_shell_through_fuse_see_the_same_tree_at_every_step() {
    let Some(py) = can_run() else { return };
    let fx = Fx::new(&[]);
    let mut prog = Prog::start(py, &fx);
    let before = fx.io_calls();
    let m = |r: &str| p(&fx.m(r));
    // The program changes, FUSE looks.
    let steps: Vec<serde_json::Value> = vec![
        serde_json::json!(["mkdir", m("d")]),
        serde_json::json!(["write", m("d/a"), "first"]),
        serde_json::json!(["append", m("d/a"), "+more"]),
        serde_json::json!(["write", m("b"), "0123456789"]),
        serde_json::json!(["truncate", m("b"), "4"]),
        serde_json::json!(["chmod", m("b"), "600"]),
        serde_json::json!(["rename", m("d/a"), m("d/c")]),
        serde_json::json!(["mkdir", m("e")]),
        serde_json::json!(["rename", m("b"), m("e/b")]),
        serde_json::json!(["unlink", m("e/b")]),
        serde_json::json!(["rmdir", m("e")]),
    ];
    // The kernel looked at the folders first, so it holds entries (negative ones too) the
    // program's changes must replace.
    let _ = fs::metadata(fx.m("d/a"));
    let _ = fs::metadata(fx.m("b"));
    let _ = fs::read_dir(&fx.mnt).map(|r| r.count());
    let mut expected_after: Vec<Box<dyn Fn() -> bool>> = Vec::new();
    expected_after.push(Box::new(|| fx.m("d").is_dir()));
    expected_after.push(Box::new(|| {
        fs::read(fx.m("d/a")).ok().as_deref() == Some(b"first")
    }));
    expected_after.push(Box::new(|| {
        fs::read(fx.m("d/a")).ok().as_deref() == Some(b"first+more")
    }));
    expected_after.push(Box::new(|| {
        fs::read(fx.m("b")).ok().as_deref() == Some(b"0123456789")
    }));
    expected_after.push(Box::new(|| {
        fs::read(fx.m("b")).ok().as_deref() == Some(b"0123")
    }));
    expected_after.push(Box::new(|| {
        fs::metadata(fx.m("b")).is_ok_and(|md| md.permissions().mode() & 0o777 == 0o600)
    }));
    expected_after.push(Box::new(|| {
        !fx.m("d/a").exists() && fs::read(fx.m("d/c")).ok().as_deref() == Some(b"first+more")
    }));
    expected_after.push(Box::new(|| fx.m("e").is_dir()));
    expected_after.push(Box::new(|| !fx.m("b").exists() && fx.m("e/b").is_file()));
    expected_after.push(Box::new(|| !fx.m("e/b").exists()));
    expected_after.push(Box::new(|| !fx.m("e").exists()));
    for (i, (step, check)) in steps.iter().zip(&expected_after).enumerate() {
        let r = prog.ask(step.clone());
        assert_eq!(r[0], "ok", "step {i} {step}: {r}");
        assert!(
            check(),
            "after step {i} {step}, FUSE shows {:?}",
            fuse_tree(&fx.mnt)
        );
    }
    // FUSE changes, the program looks.
    fs::write(fx.m("d/c"), b"from the shell").expect("write");
    assert_eq!(
        prog.ask(serde_json::json!(["read", m("d/c")])),
        serde_json::json!(["ok", "from the shell"])
    );
    fs::create_dir(fx.m("f")).expect("mkdir");
    fs::write(fx.m("f/g"), b"x").expect("write");
    assert_eq!(
        prog.ask(serde_json::json!(["stat", m("f/g")]))[1][0],
        serde_json::json!(1)
    );
    fs::remove_file(fx.m("f/g")).expect("rm");
    assert_eq!(
        prog.ask(serde_json::json!(["stat", m("f/g")])),
        serde_json::json!(["err", "ENOENT"])
    );
    assert_eq!(
        prog.ask(serde_json::json!(["list", m("")])),
        serde_json::json!(["ok", ["d", "f"]])
    );
    // The client served these calls: the daemon counted them.
    drop(prog);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fx.status()["io_clients"].as_u64() != Some(0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let served = fx.io_calls() - before;
    assert!(served >= 20, "only {served} calls went through the client");
}

/// What `full` answers, as the kernel's FUSE path shows it (`lstat` with `link`). Not the
/// times: in writeback-cache mode the kernel keeps its own times of a file written through
/// it until it writes them back, with or without the client (the `utimes` step checks
/// them).
fn full_via_fuse(path: &Path, link: bool) -> serde_json::Value {
    use std::os::unix::fs::MetadataExt;
    let md = if link {
        fs::symlink_metadata(path)
    } else {
        fs::metadata(path)
    };
    match md {
        Ok(md) => serde_json::json!([
            "ok",
            [
                md.ino(),
                md.size(),
                format!("0o{:o}", md.mode()),
                md.nlink(),
                md.uid()
            ]
        ]),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::json!(["err", "ENOENT"]),
        Err(e) => panic!("lstat {}: {e}", path.display()),
    }
}

/// The client keeps what `stat` answered (and answers it again with no call) only while
/// nothing it rests on changed: every change made elsewhere (through FUSE by a shell, or by
/// another process under the client) shows in the next `stat` exactly as FUSE shows it,
/// negative answers included, and a path whose folder was renamed is walked again.
#[test]
fn what_the_client_keeps_of_stat_follows_every_change_made_elsewhere() {
    let Some(py) = can_run() else { return };
    let fx = Fx::new(&[]);
    let m = |r: &str| p(&fx.m(r));
    fs::create_dir_all(fx.m("d/e")).expect("mkdir");
    fs::write(fx.m("d/e/f"), b"12345").expect("write");
    fs::write(fx.m("d/g"), b"x").expect("write");
    fs::create_dir(fx.m("k")).expect("mkdir");
    let mut prog = Prog::start(py, &fx);
    let mut other = Prog::start(py, &fx);
    // `k/g2` becomes a second name of `d/e/f`, in a folder off its path: each name's link
    // count follows the other's removal (nothing on the other name's walk changes).
    let watched = ["d/e/f", "d/g", "d/e/new", "d/h/f", "d/l", "d/e", "k/g2"];
    let look = |prog: &mut Prog, step: &str| {
        for w in watched {
            for link in [false, true] {
                let mut cmd = vec![serde_json::json!("full"), serde_json::json!(m(w))];
                if link {
                    cmd.push(serde_json::json!("l"));
                }
                // Twice: the second answer comes from what the client kept.
                for _ in 0..2 {
                    let got = prog.ask(serde_json::Value::Array(cmd.clone()));
                    let want = full_via_fuse(&fx.m(w), link);
                    assert_eq!(got, want, "after {step}: {w} (lstat: {link})");
                }
            }
        }
    };
    look(&mut prog, "the start");
    type Change<'a> = (&'a str, Box<dyn Fn(&mut Prog) + 'a>);
    let changes: Vec<Change<'_>> = vec![
        (
            "a write through FUSE",
            Box::new(|_: &mut Prog| {
                fs::write(fx.m("d/e/f"), b"longer than before").expect("write")
            }),
        ),
        (
            "a chmod through FUSE",
            Box::new(|_: &mut Prog| {
                fs::set_permissions(fx.m("d/e/f"), fs::Permissions::from_mode(0o600))
                    .expect("chmod")
            }),
        ),
        (
            "a missing name made through FUSE",
            Box::new(|_: &mut Prog| fs::write(fx.m("d/e/new"), b"n").expect("write")),
        ),
        (
            "a hard link through FUSE",
            Box::new(|_: &mut Prog| fs::hard_link(fx.m("d/e/f"), fx.m("k/g2")).expect("link")),
        ),
        (
            "a rename over a name through FUSE",
            Box::new(|_: &mut Prog| fs::rename(fx.m("d/e/new"), fx.m("d/g")).expect("rename")),
        ),
        (
            "a folder renamed through FUSE",
            Box::new(|_: &mut Prog| fs::rename(fx.m("d/e"), fx.m("d/h")).expect("rename")),
        ),
        (
            "a symlink made through FUSE",
            Box::new(|_: &mut Prog| {
                std::os::unix::fs::symlink("h/f", fx.m("d/l")).expect("symlink")
            }),
        ),
        (
            "a folder renamed back by another client",
            Box::new(|o: &mut Prog| {
                let r = o.ask(serde_json::json!(["rename", m("d/h"), m("d/e")]));
                assert_eq!(r[0], "ok", "{r}");
            }),
        ),
        (
            "a truncate by another client",
            Box::new(|o: &mut Prog| {
                let r = o.ask(serde_json::json!(["truncate", m("d/e/f"), "3"]));
                assert_eq!(r[0], "ok", "{r}");
            }),
        ),
        (
            "an append by another client",
            Box::new(|o: &mut Prog| {
                let r = o.ask(serde_json::json!(["append", m("d/e/f"), "abc"]));
                assert_eq!(r[0], "ok", "{r}");
            }),
        ),
        (
            "an unlink by another client",
            Box::new(|o: &mut Prog| {
                let r = o.ask(serde_json::json!(["unlink", m("d/g")]));
                assert_eq!(r[0], "ok", "{r}");
            }),
        ),
        (
            "a file's second name removed by another client",
            Box::new(|o: &mut Prog| {
                let r = o.ask(serde_json::json!(["unlink", m("k/g2")]));
                assert_eq!(r[0], "ok", "{r}");
            }),
        ),
        (
            "times set through FUSE",
            Box::new(|_: &mut Prog| {
                let f = fs::File::options()
                    .write(true)
                    .open(fx.m("d/e/f"))
                    .expect("open");
                f.set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000))
                    .expect("utimes");
            }),
        ),
        (
            "an unlink through FUSE",
            Box::new(|_: &mut Prog| fs::remove_file(fx.m("d/e/f")).expect("rm")),
        ),
    ];
    for (step, change) in &changes {
        change(&mut other);
        look(&mut prog, step);
        if step.starts_with("times") {
            assert_eq!(
                prog.ask(serde_json::json!(["mtime", m("d/e/f")])),
                serde_json::json!(["ok", 1_000_000u64 * 1_000_000_000])
            );
        }
    }
    // Repeated stats of one path are answered by the client itself: the daemon counts
    // (at the client's exit) far fewer calls than the stats made.
    drop(other);
    drop(prog);
    let idle = |fx: &Fx| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while fx.status()["io_clients"].as_u64() != Some(0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    idle(&fx);
    let before = fx.io_calls();
    let mut prog = Prog::start(py, &fx);
    assert_eq!(
        prog.ask(serde_json::json!(["statn", m("d/e"), "2000"])),
        serde_json::json!(["ok", fs::metadata(fx.m("d/e")).expect("stat").len()])
    );
    drop(prog);
    idle(&fx);
    let calls = fx.io_calls() - before;
    assert!(
        (1..100).contains(&calls),
        "2000 stats of one unchanged path made {calls} calls to the daemon"
    );
}

/// The read at a file's end is answered by the client from the size it keeps (no call)
/// only while that size holds: what another process appends, through FUSE or another
/// client, or the program writes through another descriptor, is read after it.
#[test]
fn the_end_of_a_file_the_client_keeps_moves_with_every_write_made_elsewhere() {
    let Some(py) = can_run() else { return };
    let fx = Fx::new(&[]);
    let f = p(&fx.m("f"));
    fs::write(fx.m("f"), b"abc").expect("write");
    let mut prog = Prog::start(py, &fx);
    let mut other = Prog::start(py, &fx);
    let rest = |prog: &mut Prog| prog.ask(serde_json::json!(["rest", f]));
    assert_eq!(prog.ask(serde_json::json!(["ropen", f]))[0], "ok");
    assert_eq!(rest(&mut prog), serde_json::json!(["ok", "abc"]));
    assert_eq!(rest(&mut prog), serde_json::json!(["ok", ""]));
    // Appended through FUSE.
    fs::OpenOptions::new()
        .append(true)
        .open(fx.m("f"))
        .and_then(|mut h| h.write_all(b"def"))
        .expect("append through FUSE");
    assert_eq!(rest(&mut prog), serde_json::json!(["ok", "def"]));
    // Appended by another client.
    assert_eq!(other.ask(serde_json::json!(["append", f, "gh"]))[0], "ok");
    assert_eq!(rest(&mut prog), serde_json::json!(["ok", "gh"]));
    // Written by the program itself through another descriptor.
    assert_eq!(prog.ask(serde_json::json!(["open", f]))[0], "ok");
    assert_eq!(
        prog.ask(serde_json::json!(["pwrite", f, "ij", "8"])),
        serde_json::json!(["ok", 2])
    );
    assert_eq!(rest(&mut prog), serde_json::json!(["ok", "ij"]));
    // Truncated and grown again by another client: the offset (10) is past the end of 3
    // bytes, then inside 12.
    assert_eq!(other.ask(serde_json::json!(["truncate", f, "3"]))[0], "ok");
    assert_eq!(rest(&mut prog), serde_json::json!(["ok", ""]));
    assert_eq!(other.ask(serde_json::json!(["truncate", f, "12"]))[0], "ok");
    assert_eq!(rest(&mut prog), serde_json::json!(["ok", "\u{0}\u{0}"]));
    // Reads at the unchanged end make no call (the daemon counts a client's calls as it
    // goes and at its exit).
    drop(other);
    let clients = |n: u64| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while fx.status()["io_clients"].as_u64() != Some(n) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    clients(1);
    let before = fx.io_calls();
    assert_eq!(
        prog.ask(serde_json::json!(["eofn", f, "2000"])),
        serde_json::json!(["ok", 0])
    );
    drop(prog);
    clients(0);
    let calls = fx.io_calls() - before;
    assert!(
        calls < 100,
        "2000 reads at the unchanged end of a file made {calls} calls to the daemon"
    );
}

#[test]
fn forks_exec_mmap_locks_and_dup2_get_real_descriptors() {
    let Some(py) = can_run() else { return };
    let mut fx = Fx::new(&[]);
    let script = r#"
import fcntl, mmap, os, subprocess, sys
m = sys.argv[1]
with open(m + "/log", "w") as f:
    f.write("parent 1\n"); f.flush()
    pid = os.fork()
    if pid == 0:
        os.write(f.fileno(), b"child\n"); os._exit(0)
    os.waitpid(pid, 0)
    subprocess.run(["sh", "-c", "echo exec"], stdout=f, check=True)
    f.write("parent 2\n")
with open(m + "/map", "wb") as f:
    f.write(b"abcd" * 1024)
with open(m + "/map", "r+b") as f:
    mm = mmap.mmap(f.fileno(), 0)
    assert mm[:4] == b"abcd"
    mm[:4] = b"WXYZ"; mm.flush(); mm.close()
with open(m + "/map", "rb") as f:
    pm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    assert pm[:8] == b"WXYZabcd", pm[:8]
    pm[:1] = b"q"; pm.close()
fd = os.open(m + "/lock", os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX); fcntl.lockf(fd, fcntl.LOCK_UN)
fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b"locked"); os.close(fd)
fd = os.open(m + "/dup", os.O_WRONLY | os.O_CREAT, 0o644)
os.dup2(fd, 9); os.write(9, b"via nine"); os.close(9); os.close(fd)
print("done")
"#;
    let o = fx
        .exec()
        .args([py, "-c", script])
        .arg(&fx.mnt)
        .output()
        .expect("run");
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        fs::read_to_string(fx.m("log")).expect("log"),
        "parent 1\nchild\nexec\nparent 2\n"
    );
    let map = fs::read(fx.m("map")).expect("map");
    assert_eq!(&map[..8], b"WXYZabcd");
    assert_eq!(fs::read(fx.m("lock")).expect("lock"), b"locked");
    assert_eq!(fs::read(fx.m("dup")).expect("dup"), b"via nine");
    fx.umount();
    assert_eq!(
        fs::read_to_string(fx.backing.join("log")).expect("drained log"),
        "parent 1\nchild\nexec\nparent 2\n"
    );
}

#[test]
fn a_client_killed_mid_write_leaves_its_data_and_no_open_handle() {
    let Some(py) = can_run() else { return };
    let mut fx = Fx::new(&[]);
    let mut prog = Prog::start(py, &fx);
    let f = p(&fx.m("held"));
    assert_eq!(prog.ask(serde_json::json!(["open", f]))[0], "ok");
    assert_eq!(
        prog.ask(serde_json::json!(["pwrite", f, "kept bytes", "0"]))[0],
        "ok"
    );
    assert_eq!(prog.ask(serde_json::json!(["fsync", f]))[0], "ok");
    assert_eq!(fx.status()["io_clients"].as_u64(), Some(1));
    let _ = prog.child.kill();
    let _ = prog.child.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while fx.status()["io_clients"].as_u64() != Some(0) {
        assert!(
            Instant::now() < deadline,
            "the dead client is still counted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(fs::read(fx.m("held")).expect("read"), b"kept bytes");
    // Nothing holds the mount: it unmounts, and BACKING has the bytes.
    fx.umount();
    assert_eq!(
        fs::read(fx.backing.join("held")).expect("drained"),
        b"kept bytes"
    );
}

#[test]
fn a_dead_daemon_fails_the_clients_calls_instead_of_hanging_them() {
    let Some(py) = can_run() else { return };
    let mut fx = Fx::new(&[]);
    let mut prog = Prog::start(py, &fx);
    let f = p(&fx.m("x"));
    assert_eq!(prog.ask(serde_json::json!(["open", f]))[0], "ok");
    let pid = fx.pid.take().expect("pid");
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let r = prog.ask(serde_json::json!(["pwrite", f, "late", "0"]));
    assert_eq!(r, serde_json::json!(["err", "EIO"]), "{r}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    drop(prog);
    detach(&fx.mnt, None);
}

#[test]
fn another_users_process_is_refused_the_channel_and_served_through_fuse() {
    let Some(_) = can_run() else { return };
    if Command::new("setpriv").arg("--help").output().is_err() {
        eprintln!("SKIP: no setpriv");
        return;
    }
    let fx = Fx::new(&["--allow-other"]);
    fs::set_permissions(&fx.mnt, fs::Permissions::from_mode(0o777)).expect("chmod");
    let before = fx.io_calls();
    let o = fx
        .exec()
        .args([
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
        ])
        .args(["sh", "-c"])
        .arg(format!(
            "echo other > {0}/o && cat {0}/o && stat -c %u {0}/o",
            fx.mnt.display()
        ))
        .output()
        .expect("run");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "other\n65534\n");
    assert_eq!(
        fx.io_calls(),
        before,
        "another user's calls went through the channel"
    );
}

#[test]
fn exec_names_what_is_wrong_in_one_line() {
    let t = tempfile::tempdir().expect("tempdir");
    let file = t.path().join("f");
    fs::write(&file, b"").expect("write");
    let e = fails(&["exec", file.to_str().expect("utf8"), "--", "true"]);
    assert!(e.contains("not a folder"), "{e}");
    let o = Command::new(BIN)
        .args(["exec", file.to_str().expect("utf8"), "--", "true"])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(2));
    let e = fails(&["exec", t.path().to_str().expect("utf8"), "--", "true"]);
    assert!(e.contains("no tierstack mount"), "{e}");
}

/// How many `op` requests the daemon has served through FUSE (`status --json`'s `ops`).
fn fuse_ops(fx: &Fx, op: &str) -> u64 {
    fx.status()["ops"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["op"] == op)
        .and_then(|o| o["count"].as_u64())
        .unwrap_or(0)
}

/// Directory streams (`opendir`, `readdir`, `readdir_r`, `telldir`/`seekdir`, `rewinddir`,
/// `dirfd`) and `getxattr`/`lgetxattr` of a C program under the client answer as in a plain
/// folder (names, types, errors, sizes, ERANGE, ENODATA), and the kernel's OPENDIR and
/// GETXATTR reach the daemon only where the client leaves the call to it: the listing of a
/// symbolic link to a directory and the stream's `dirfd` (a real descriptor), and a
/// `getxattr` that follows a symbolic link.
#[test]
fn directory_streams_and_xattrs_under_the_client_answer_as_a_plain_folder() {
    if can_run().is_none() {
        return;
    }
    let fx = Fx::new(&[]);
    let bin = fx._tmp.path().join("dirs_xattrs");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/dirs_xattrs.c");
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc {} failed", src.display());
    let plain = fx._tmp.path().join("plain");
    fs::create_dir(&plain).expect("mkdir plain");
    let out = |c: &mut Command| -> String {
        let o = c.output().expect("run the program");
        assert!(
            o.status.success(),
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let want = out(Command::new(&bin).arg(&plain));
    assert!(want.contains("list d: ..:4 .:4 f10:8"), "{want}");
    // The OPENDIR and GETXATTR requests the kernel sends for a run (the kernel itself also
    // asks for the ACLs of the directories it checks permissions in).
    let requests = |run: &mut dyn FnMut() -> String| -> (String, u64, u64) {
        let (o, g) = (fuse_ops(&fx, "opendir"), fuse_ops(&fx, "getxattr"));
        let text = run();
        (
            text,
            fuse_ops(&fx, "opendir") - o,
            fuse_ops(&fx, "getxattr") - g,
        )
    };
    let (got, c_open, c_getx) = requests(&mut || out(fx.exec().arg(&bin).arg(&fx.mnt)));
    assert_eq!(
        got, want,
        "under the client (left) and in a plain folder (right)"
    );
    // The same program through FUSE alone, in a folder of its own.
    let again = fx.mnt.join("again");
    fs::create_dir(&again).expect("mkdir");
    let (fused, f_open, f_getx) = requests(&mut || out(Command::new(&bin).arg(&again)));
    assert_eq!(
        fused, want,
        "through FUSE (left) and in a plain folder (right)"
    );
    // Under the client, only `ls` (a link to a directory) and `dirfd` open a directory
    // through the kernel; of the program's 7 attribute reads that FUSE gets (the kernel
    // answers the rest itself), only the one that follows a link goes through it.
    assert!(
        c_open <= 2 && f_open >= c_open + 3,
        "OPENDIR through FUSE: {c_open} under the client, {f_open} without it"
    );
    assert!(
        f_getx >= c_getx + 5,
        "GETXATTR through FUSE: {c_getx} under the client, {f_getx} without it"
    );
}
