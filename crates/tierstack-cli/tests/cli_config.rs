//! The configuration's layers through the real binary: the site file
//! (`$TIERSTACK_SYSCONFDIR/tierstack.toml`), the user's (`$XDG_CONFIG_HOME/tierstack/`),
//! `TIERSTACK_CONFIG`, the variables and the flags, in that order; `config show` names each
//! value's source; the values reach what the commands do (`slurm install`'s files, a real
//! mount's drives and runtime folder); a bad file is one line naming file, line, key and fix,
//! with exit status 2. Each test sets the layers it uses (cargo's `[env]` points the site and
//! user folders at empty places for every other test).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{detach, is_mounted, root_with_fuse, BIN};

/// A temporary site folder, user folder and extra file.
struct Layers {
    tmp: tempfile::TempDir,
}

impl Layers {
    fn new() -> Layers {
        let tmp = tempfile::tempdir().expect("tempdir");
        for d in ["etc", "home/tierstack"] {
            std::fs::create_dir_all(tmp.path().join(d)).expect("mkdir");
        }
        Layers { tmp }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    fn site(&self, text: &str) {
        std::fs::write(self.path("etc/tierstack.toml"), text).expect("site file");
    }

    fn user(&self, text: &str) {
        std::fs::write(self.path("home/tierstack/tierstack.toml"), text).expect("user file");
    }

    /// `tierstack ARGS` with these layers and the variables `env`.
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("TIERSTACK_SYSCONFDIR", self.path("etc"))
            .env("XDG_CONFIG_HOME", self.path("home"))
            .env_remove("TIERSTACK_CONFIG");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("run tierstack")
    }

    fn ok(&self, args: &[&str], env: &[(&str, &str)]) -> String {
        common::success_stdout(args, self.run(args, env))
    }

    /// `config show --json`: key -> (value, source kind, source detail).
    fn show(&self, env: &[(&str, &str)]) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["config", "show", "--json"], env)).expect("json")
    }
}

fn key<'a>(show: &'a serde_json::Value, k: &str) -> &'a serde_json::Value {
    show["keys"]
        .as_array()
        .and_then(|a| a.iter().find(|r| r["key"] == k))
        .unwrap_or_else(|| panic!("no key {k} in {show}"))
}

#[test]
fn layers_apply_in_order_and_show_names_each_source() {
    let l = Layers::new();
    l.site(
        "# the site's defaults\n[mount]\ndram = \"3G\"\ndrive_size = \"4G\"\n\n[stage]\njobs = 2\n",
    );
    l.user("[mount]\ndrive_size = \"5G\"\n");
    let extra = l.path("extra.toml");
    std::fs::write(&extra, "[stage]\njobs = 3\n[umount]\ntimeout = \"90m\"\n").expect("extra");
    let show = l.show(&[
        ("TIERSTACK_MOUNT_DRAM", "6G"),
        ("TIERSTACK_CONFIG", extra.to_str().expect("utf-8")),
    ]);
    let dram = key(&show, "mount.dram");
    assert_eq!(dram["value"], "6G");
    assert_eq!(dram["source"]["kind"], "env");
    assert_eq!(dram["source"]["name"], "TIERSTACK_MOUNT_DRAM");
    let ds = key(&show, "mount.drive_size");
    assert_eq!(ds["value"], "5G", "the user's file wins over the site's");
    assert_eq!(ds["source"]["kind"], "file");
    assert_eq!(ds["source"]["line"], 2);
    assert!(ds["source"]["path"]
        .as_str()
        .is_some_and(|p| p.ends_with("home/tierstack/tierstack.toml")));
    let jobs = key(&show, "stage.jobs");
    assert_eq!(jobs["value"], "3", "TIERSTACK_CONFIG wins over both files");
    assert_eq!(key(&show, "umount.timeout")["value"], "90m");
    let mode = key(&show, "mount.mode");
    assert_eq!(
        (&mode["value"], &mode["source"]["kind"]),
        (&"sync".into(), &"built_in".into())
    );
    let files = show["files"].as_array().expect("files");
    assert_eq!(files.len(), 3);
    assert!(files.iter().all(|f| f["read"] == true), "{files:?}");
    // The text form: one line per key, with its source.
    let text = l.ok(&["config", "show"], &[("TIERSTACK_MOUNT_DRAM", "6G")]);
    let line = text
        .lines()
        .find(|x| x.starts_with("mount.dram "))
        .expect("mount.dram line");
    assert!(
        line.contains("6G") && line.contains("$TIERSTACK_MOUNT_DRAM"),
        "{line}"
    );
    // --help shows the effective default and names the key.
    let help = l.ok(&["mount", "--help"], &[]);
    assert!(help.contains("[default: 3G]"), "{help}");
    assert!(
        help.contains("[config: mount.dram, env: TIERSTACK_MOUNT_DRAM]"),
        "{help}"
    );
}

/// The values reach what the command does: `slurm install` writes the file's stage timeout
/// (a humantime duration), the variable's other timeout and the flag's pool size (over the
/// file's).
#[test]
fn slurm_install_takes_file_variable_and_flag() {
    let l = Layers::new();
    l.site("[slurm]\nstage_timeout = \"2h\"\npool_size = \"3G\"\n");
    let conf = l.path("slurm");
    std::fs::create_dir(&conf).expect("mkdir");
    // The buffers' folder inside the test's own (install makes its `jobs` folder).
    let fast = l.path("fast");
    l.ok(
        &[
            "slurm",
            "install",
            "--conf-dir",
            conf.to_str().expect("utf-8"),
            "--fast-dir",
            fast.to_str().expect("utf-8"),
            "--pool-size",
            "5G",
        ],
        &[("TIERSTACK_SLURM_OTHER_TIMEOUT", "10m")],
    );
    let bb = std::fs::read_to_string(conf.join("burst_buffer.conf")).expect("burst_buffer.conf");
    assert!(bb.contains("StageInTimeout=7200"), "{bb}");
    assert!(bb.contains("OtherTimeout=600"), "{bb}");
    let lua = std::fs::read_to_string(conf.join("burst_buffer.lua")).expect("burst_buffer.lua");
    let pool = format!("POOL_SIZE = \"{}\"", 5u64 << 30);
    assert!(lua.contains(&pool), "{pool} not in {lua}");
}

/// Bad layers: one line naming the place and the fix, exit status 2, for every command.
#[test]
fn bad_layers_are_one_line_usage_errors() {
    let l = Layers::new();
    let one_line = |o: &Output| {
        assert_eq!(o.status.code(), Some(2), "{o:?}");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{err}");
        lines[0].to_string()
    };
    l.site("[mount]\n\ndrian_jobs = 4\n");
    let e = one_line(&l.run(&["status"], &[]));
    assert!(
        e.contains("etc/tierstack.toml:3: unknown key `drian_jobs` in [mount]"),
        "{e}"
    );
    assert!(e.contains("drain_jobs"), "{e}");
    l.site("[mount]\ndram = \"lots\"\n");
    let e = one_line(&l.run(&["config", "show"], &[]));
    assert!(
        e.contains("tierstack.toml:2: [mount] dram: invalid size 'lots'"),
        "{e}"
    );
    l.site("[mount\n");
    let e = one_line(&l.run(&["config", "show"], &[]));
    assert!(e.contains("tierstack.toml:1:"), "{e}");
    l.site("");
    let e = one_line(&l.run(&["config", "show"], &[("TIERSTACK_MOUNT_MODE", "fast")]));
    assert!(
        e.contains("TIERSTACK_MOUNT_MODE=fast: 'fast' is not one of sync, async"),
        "{e}"
    );
    let e = one_line(&l.run(
        &["config", "show"],
        &[("TIERSTACK_CONFIG", "/nonexistent/t.toml")],
    ));
    assert!(
        e.contains("/nonexistent/t.toml") && e.contains("TIERSTACK_CONFIG"),
        "{e}"
    );
    // An empty site file and a missing user file are fine.
    l.ok(&["config", "show"], &[]);
}

/// A real mount on the file's defaults: its drives in the file's folder at the file's size,
/// its control socket and log in the file's runtime folder (passed on to the daemon), and
/// `umount` finds it there too.
#[test]
fn a_mount_uses_the_files_folders_and_sizes() {
    if !root_with_fuse() {
        return;
    }
    let l = Layers::new();
    let (backing, mnt, fast, run) = (
        l.path("backing"),
        l.path("mnt"),
        l.path("fast"),
        l.path("run"),
    );
    for d in [&backing, &mnt] {
        std::fs::create_dir(d).expect("mkdir");
    }
    l.site(&format!(
        "[global]\nrun_dir = \"{}\"\n[mount]\ndir = \"{}\"\ndrive_size = \"300M\"\ndram = \"64M\"\n",
        run.display(),
        fast.display()
    ));
    let (b, m) = (
        backing.to_str().expect("utf-8"),
        mnt.to_str().expect("utf-8"),
    );
    l.ok(&["mount", b, m], &[]);
    let guard = Unmount(&mnt);
    assert!(is_mounted(&mnt));
    std::fs::write(mnt.join("f"), b"configured").expect("write");
    let socks: Vec<_> = std::fs::read_dir(&run)
        .expect("the file's runtime folder")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "sock"))
        .collect();
    assert_eq!(socks.len(), 1, "no control socket in {}", run.display());
    let st: serde_json::Value =
        serde_json::from_str(&l.ok(&["status", m, "--json"], &[])).expect("status json");
    // The fast tier's folder, made by the mount, is its owner's alone (the drive files hold
    // what was written through the mount).
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&fast)
        .expect("fast tier")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "the fast tier's folder is {mode:o}");
    let drives = drive_files(&fast);
    assert!(
        !drives.is_empty(),
        "no drive files under {}",
        fast.display()
    );
    for d in &drives {
        let len = std::fs::metadata(d).expect("drive").len();
        assert_eq!(len, 300 << 20, "{} is not the file's 300M", d.display());
    }
    l.ok(&["umount", m], &[]);
    std::mem::forget(guard);
    assert!(!is_mounted(&mnt));
    assert_eq!(
        std::fs::read(backing.join("f")).expect("drained"),
        b"configured"
    );
    assert!(st["pid"].as_u64().is_some());
}

/// The drive files under `dir`, however deep.
fn drive_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("drive"))
            {
                out.push(p);
            }
        }
    }
    out
}

/// Detaches the mount if the test fails before its `umount`.
struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        detach(self.0, None);
    }
}
