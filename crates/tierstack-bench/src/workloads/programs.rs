//! The workloads' inputs (the tree's tar, the wheels, the scripts, the MPI rank program), their
//! phases, and [`program`], the one place a workload program gets its environment.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tierstack_common::io_err;

use super::{Config, Result, WorkloadsError};
use crate::io::mpi::{run_bounded, Finished};
use crate::io::{IoBenchError, Launcher, Mpi};

/// The MPI program of `mpi-logs`, built with `mpicc` at run time.
pub const LOG_RANK_SOURCE: &str = include_str!("log_rank.c");
const WHEELS_PY: &str = include_str!("wheels.py");
const H5_PY: &str = include_str!("h5_small.py");

/// Where the default tree's tar comes from: trees every Debian machine has, in this order,
/// up to `--tree-entries` entries.
const TREE_ROOTS: [&str; 3] = ["/usr/lib/python3", "/usr/share/perl", "/usr/include"];

/// Files the drain may leave in BACKING, and the git index (inode numbers and times): left out
/// of the comparison of the two trees.
const NOT_COMPARED: [&str; 2] = [".git/index", ".tierstack-tmp."];

/// The Python the workloads run: Debian's (where `python3-h5py` installs), else the first
/// `python3` on PATH.
pub fn python() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let deb = PathBuf::from("/usr/bin/python3");
        if deb.is_file() {
            deb
        } else {
            which("python3").unwrap_or_else(|| PathBuf::from("python3"))
        }
    })
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `cmd` run under the interception client of the mount at `mnt` (`tierstack exec MNT --
/// CMD`), with the same working folder and environment.
fn under_client(cmd: &Command, exe: &Path, mnt: &Path) -> Command {
    let mut c = Command::new(exe);
    c.arg("exec")
        .arg(mnt)
        .arg("--")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    if let Some(d) = cmd.get_current_dir() {
        c.current_dir(d);
    }
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c
}

/// The one place a workload program gets its working folder and environment: every program
/// of every phase (tar, git, pip, python, mpirun and its ranks) is started through it, so
/// preloading the interception client (`LD_PRELOAD`) is a change here only.
pub(super) fn program(
    mut cmd: Command,
    cwd: &Path,
    home: &Path,
    env: &[(&str, OsString)],
) -> Command {
    cmd.current_dir(cwd)
        .env("HOME", home)
        .env("LC_ALL", "C")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@tierstack")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@tierstack")
        // Fixed dates: the commit is the same object on both sides, so the trees compare.
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
        // No automatic `git gc`: with the tree's thousands of loose objects, `git commit`
        // would start one detached, which outlives the phase, runs into the next ones and
        // leaves the two sides' .git at different stages.
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "gc.auto")
        .env("GIT_CONFIG_VALUE_0", "0")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env("PIP_NO_CACHE_DIR", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Whether the kernel's caches can be dropped (root, and the file writable).
pub fn can_drop_caches() -> bool {
    rustix::process::geteuid().is_root()
        && fs::OpenOptions::new()
            .write(true)
            .open("/proc/sys/vm/drop_caches")
            .is_ok()
}

/// `sync(1)`: everything written reaches the disk (not timed).
pub fn sync() {
    let _ = Command::new("sync").status();
}

fn drop_caches() -> Result<()> {
    sync();
    let p = Path::new("/proc/sys/vm/drop_caches");
    fs::write(p, "3\n").map_err(io_err("write", p))?;
    Ok(())
}

/// Whether `w` has phases run with the caches dropped.
pub fn has_cold_phases(w: &str) -> bool {
    w != "mpi-logs"
}

/// What the workloads take in, made under the work folder at the start.
pub struct Inputs {
    work: PathBuf,
    home: PathBuf,
    tar: Option<PathBuf>,
    wheels: Option<PathBuf>,
    names: Vec<String>,
    mpi: Option<(Mpi, PathBuf)>,
    cfg: Config,
}

impl Inputs {
    /// Inputs under `work` for `cfg`; each workload's are made by [`Inputs::prepare`].
    pub fn new(cfg: &Config, work: &Path) -> Inputs {
        Inputs {
            work: work.to_path_buf(),
            home: work.join("home"),
            tar: None,
            wheels: None,
            names: Vec::new(),
            mpi: None,
            cfg: cfg.clone(),
        }
    }

    /// The top-level names the `pip` workload imports.
    pub fn import_names(&self) -> &[String] {
        &self.names
    }

    fn bounded(&self, cmd: Command, what: &str, cancel: &AtomicBool) -> Result<Finished> {
        let mut cmd = program(cmd, &self.work, &self.home, &[]);
        run_bounded(&mut cmd, what, Some(cancel), self.cfg.timeout).map_err(cancelled)
    }

    /// Makes `w`'s inputs. `Ok(Err(why))`: its tool is missing (why names the package).
    pub fn prepare(
        &mut self,
        w: &str,
        cancel: &AtomicBool,
    ) -> Result<std::result::Result<String, String>> {
        fs::create_dir_all(&self.home).map_err(io_err("create", &self.home))?;
        match w {
            "tree" => self.prepare_tree(cancel),
            "pip" => self.prepare_pip(cancel),
            "h5py" => {
                let mut c = Command::new(python());
                c.args(["-c", "import h5py"]);
                if !self.bounded(c, "python3 -c 'import h5py'", cancel)?.ok {
                    return Ok(Err(format!(
                        "{} cannot import h5py: install python3-h5py (apt-get install python3-h5py)",
                        python().display()
                    )));
                }
                let p = self.work.join("h5_small.py");
                fs::write(&p, H5_PY).map_err(io_err("write", &p))?;
                Ok(Ok(format!(
                    "one HDF5 file of {} datasets of 1-4 KiB in groups of 100 (h5py), written and closed, then read back",
                    self.cfg.h5_datasets
                )))
            }
            _ => self.prepare_mpi(),
        }
    }

    fn prepare_tree(&mut self, cancel: &AtomicBool) -> Result<std::result::Result<String, String>> {
        for (tool, pkg) in [("tar", "tar"), ("git", "git")] {
            if which(tool).is_none() {
                return Ok(Err(format!(
                    "{tool} is not on PATH: install it (apt-get install {pkg})"
                )));
            }
        }
        if let Some(t) = &self.cfg.tree_tar {
            let t = fs::canonicalize(t).map_err(io_err("resolve", t))?;
            let size = fs::metadata(&t).map_err(io_err("read", &t))?.len();
            let what = format!(
                "tar xf of {} ({:.1} MiB)",
                t.display(),
                size as f64 / 1048576.0
            );
            self.tar = Some(t);
            return Ok(Ok(what));
        }
        let mut list = Vec::new();
        let mut bytes = 0u64;
        let mut roots = Vec::new();
        for r in TREE_ROOTS {
            if list.len() >= self.cfg.tree_entries {
                break;
            }
            // The root's versioned siblings too (/usr/lib/python3.11, /usr/share/perl5).
            let (parent, stem) = match (Path::new(r).parent(), Path::new(r).file_name()) {
                (Some(p), Some(s)) => (p, s.to_string_lossy().into_owned()),
                _ => continue,
            };
            let mut dirs: Vec<PathBuf> = fs::read_dir(parent)
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .filter(|e| e.file_name().to_string_lossy().starts_with(&stem))
                        .map(|e| e.path())
                        .filter(|p| p.is_dir() && !p.is_symlink())
                        .collect()
                })
                .unwrap_or_default();
            dirs.sort();
            for d in dirs {
                if list.len() < self.cfg.tree_entries {
                    roots.push(d.display().to_string());
                    walk(&d, self.cfg.tree_entries, &mut list, &mut bytes);
                }
            }
        }
        if list.is_empty() {
            return Ok(Err(format!(
                "none of {} is there to make the tree's tar from: give one with --tree-tar",
                TREE_ROOTS.join(", ")
            )));
        }
        let lst = self.work.join("tree.list");
        let tar = self.work.join("tree.tar");
        fs::write(&lst, list.join("\n") + "\n").map_err(io_err("write", &lst))?;
        let mut c = Command::new("tar");
        c.arg("cf")
            .arg(&tar)
            .args(["-C", "/", "--no-recursion", "-T"])
            .arg(&lst);
        let out = self.bounded(c, "tar cf (the tree's tar)", cancel)?;
        if !out.ok {
            return Err(WorkloadsError::Program {
                what: "tar cf (the tree's tar)".into(),
                dir: self.work.clone(),
                msg: out.last_err_line(),
            });
        }
        self.tar = Some(tar);
        Ok(Ok(format!(
            "tar xf of {} entries, {:.1} MiB (from {}), git init + add -A + commit; cold: git status, ls -lR, read every file",
            list.len(),
            bytes as f64 / 1048576.0,
            roots.join(" ")
        )))
    }

    fn prepare_pip(&mut self, cancel: &AtomicBool) -> Result<std::result::Result<String, String>> {
        let mut c = Command::new(python());
        c.args(["-m", "pip", "--version"]);
        if !self.bounded(c, "python3 -m pip --version", cancel)?.ok {
            return Ok(Err(format!(
                "{} has no pip: install python3-pip (apt-get install python3-pip)",
                python().display()
            )));
        }
        let script = self.work.join("wheels.py");
        fs::write(&script, WHEELS_PY).map_err(io_err("write", &script))?;
        let dir = match &self.cfg.wheels {
            Some(d) => fs::canonicalize(d).map_err(io_err("resolve", d))?,
            None => {
                let d = self.work.join("wheels");
                let mut c = Command::new(python());
                c.arg(&script)
                    .arg("make")
                    .arg(&d)
                    .arg(self.cfg.pip_wheels.to_string())
                    .arg(self.cfg.pip_modules.to_string());
                self.checked(c, "wheels.py make", cancel)?;
                d
            }
        };
        let wheels = wheel_files(&dir)?;
        if wheels.is_empty() {
            return Err(WorkloadsError::Usage(format!(
                "--wheels {} holds no .whl files: fill it first (pip download PKG -d DIR)",
                dir.display()
            )));
        }
        let mut c = Command::new(python());
        c.arg(&script).arg("names").arg(&dir);
        let out = self.checked(c, "wheels.py names", cancel)?;
        self.names = out
            .stdout
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect();
        let what = format!(
            "pip install --no-index --target of {} wheels ({}), then a cold python3 -c 'import {}'",
            wheels.len(),
            if self.cfg.wheels.is_some() {
                dir.display().to_string()
            } else {
                format!("generated, {} modules each", self.cfg.pip_modules)
            },
            self.names.join(", ")
        );
        self.wheels = Some(dir);
        Ok(Ok(what))
    }

    fn prepare_mpi(&mut self) -> Result<std::result::Result<String, String>> {
        let mpi = match crate::io::find_mpi(Launcher::Mpirun) {
            Ok(m) => m,
            Err(IoBenchError::Setup(why)) => {
                return Ok(Err(why.replace("bench io", "bench workloads")));
            }
            Err(e) => return Err(e.into()),
        };
        let src = self.work.join("log_rank.c");
        let exe = self.work.join("tierstack-log-rank");
        fs::write(&src, LOG_RANK_SOURCE).map_err(io_err("write", &src))?;
        let mut c = Command::new(&mpi.mpicc);
        c.arg("-O2").arg("-o").arg(&exe).arg(&src);
        let out = run_bounded(&mut c, "mpicc", None, Duration::from_secs(180))?;
        if !out.ok {
            return Ok(Err(format!(
                "mpicc could not build the rank program ({}): install libopenmpi-dev and a C compiler (apt-get install libopenmpi-dev build-essential)",
                out.last_err_line()
            )));
        }
        self.mpi = Some((mpi, exe));
        Ok(Ok(format!(
            "mpirun of {} ranks, each appending {} records of 100-200 bytes to a file of its own, fflush + fsync every {}",
            self.cfg.ranks, self.cfg.log_lines, self.cfg.log_sync_every
        )))
    }

    fn checked(&self, c: Command, what: &str, cancel: &AtomicBool) -> Result<Finished> {
        let out = self.bounded(c, what, cancel)?;
        if !out.ok {
            return Err(WorkloadsError::Program {
                what: what.into(),
                dir: self.work.clone(),
                msg: out.last_err_line(),
            });
        }
        Ok(out)
    }
}

fn cancelled(e: IoBenchError) -> WorkloadsError {
    match e {
        IoBenchError::Cancelled => WorkloadsError::Cancelled,
        e => e.into(),
    }
}

fn wheel_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io_err("list", dir))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    v.sort();
    Ok(v)
}

/// Adds the entries under `d` (itself first; paths relative to /, sorted, depth first) to
/// `list` until it holds `cap`; `bytes` sums the regular files' sizes.
fn walk(d: &Path, cap: usize, list: &mut Vec<String>, bytes: &mut u64) {
    let Ok(md) = fs::symlink_metadata(d) else {
        return;
    };
    let ft = md.file_type();
    if list.len() >= cap || !(ft.is_dir() || ft.is_file() || ft.is_symlink()) {
        return;
    }
    let rel = d.to_string_lossy();
    list.push(rel.trim_start_matches('/').to_string());
    if ft.is_file() {
        *bytes += md.len();
    }
    if !ft.is_dir() {
        return;
    }
    let mut kids: Vec<PathBuf> = fs::read_dir(d)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    kids.sort();
    for k in kids {
        walk(&k, cap, list, bytes);
    }
}

/// A phase: its name, its command, extra environment, whether the program times itself.
type Step<'a> = (&'a str, Command, Vec<(&'a str, OsString)>, bool);

/// Runs `w`'s writing phases (`cold` false) or its cold phases (`cold` true; the kernel's
/// caches dropped before each) in `root`: each phase's name and seconds.
/// `via`: the mount whose interception client the phases' programs run under.
pub(super) fn run_phases(
    cfg: &Config,
    inputs: &Inputs,
    w: &str,
    root: &Path,
    cold: bool,
    via: Option<&Path>,
    cancel: &AtomicBool,
) -> Result<Vec<(String, f64)>> {
    let py = || Command::new(python());
    let sh = |s: &str| {
        let mut c = Command::new("/bin/sh");
        c.args(["-c", s]);
        c
    };
    let site = root.join("site");
    let h5 = root.join("small.h5");
    let h5py = inputs.work.join("h5_small.py");
    let none: Vec<(&str, OsString)> = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    match (w, cold) {
        ("tree", false) => {
            let mut c = Command::new("tar");
            c.arg("xf").args(inputs.tar.iter());
            steps.push(("unpack (tar xf)", c, none.clone(), false));
            let c = sh("git init -q && git add -A && git commit -q -m tree");
            steps.push(("git init+add+commit", c, none.clone(), false));
        }
        ("tree", true) => {
            steps.push((
                "git status (cold)",
                sh("git status --porcelain >/dev/null"),
                none.clone(),
                false,
            ));
            steps.push((
                "ls -lR (cold)",
                sh("ls -lR >/dev/null"),
                none.clone(),
                false,
            ));
            let c = sh("find . -type f -print0 | xargs -0 cat >/dev/null");
            steps.push(("read every file (cold)", c, none.clone(), false));
        }
        ("pip", false) => {
            let mut c = py();
            c.args([
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--root-user-action=ignore",
                "--find-links",
            ])
            .args(inputs.wheels.iter())
            .arg("--target")
            .arg(&site);
            if let Some(d) = &inputs.wheels {
                c.args(wheel_files(d)?);
            }
            steps.push(("pip install --target", c, none.clone(), false));
        }
        ("pip", true) => {
            let mut c = py();
            c.arg("-c")
                .arg(format!("import {}", inputs.names.join(", ")));
            steps.push((
                "import (cold)",
                c,
                vec![("PYTHONPATH", site.clone().into_os_string())],
                false,
            ));
        }
        ("h5py", false) => {
            let mut c = py();
            c.arg(&h5py)
                .arg("write")
                .arg(&h5)
                .arg(cfg.h5_datasets.to_string());
            steps.push(("write+close", c, none.clone(), true));
        }
        ("h5py", true) => {
            let mut c = py();
            c.arg(&h5py)
                .arg("read")
                .arg(&h5)
                .arg(cfg.h5_datasets.to_string());
            steps.push(("read back (cold)", c, none.clone(), true));
        }
        ("mpi-logs", false) => {
            if let Some((mpi, exe)) = &inputs.mpi {
                let args = [
                    root.display().to_string(),
                    cfg.log_lines.to_string(),
                    cfg.log_sync_every.to_string(),
                ];
                let c = mpi.command(cfg.ranks, exe, &args);
                steps.push(("append+fsync logs", c, none.clone(), true));
            }
        }
        _ => {}
    }
    let mut out = Vec::new();
    for (phase, cmd, env, self_timed) in steps {
        if cold {
            drop_caches()?;
        }
        let what = format!("{w}: {phase}");
        let mut cmd = program(cmd, root, &inputs.home, &env);
        if let Some(mnt) = via {
            cmd = under_client(&cmd, &cfg.exe, mnt);
        }
        let t = Instant::now();
        let f = run_bounded(&mut cmd, &what, Some(cancel), cfg.timeout).map_err(cancelled)?;
        let wall = t.elapsed().as_secs_f64();
        if !f.ok {
            return Err(WorkloadsError::Program {
                what,
                dir: root.to_path_buf(),
                msg: f.last_err_line(),
            });
        }
        let secs = if self_timed {
            self_time(&f, &what)?
        } else {
            wall
        };
        out.push((phase.to_string(), secs));
    }
    Ok(out)
}

/// The `TIME <seconds>` line a self-timed program printed.
fn self_time(f: &Finished, what: &str) -> Result<f64> {
    f.stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("TIME ")
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .ok_or_else(|| WorkloadsError::NoTime {
            what: what.to_string(),
            out: f
                .stdout
                .chars()
                .rev()
                .take(200)
                .collect::<String>()
                .chars()
                .rev()
                .collect(),
        })
}

/// The tree under `root`, one line per entry in sorted order: its relative path, type,
/// permission bits, and size and a hash of its contents (a symbolic link: its target);
/// [`NOT_COMPARED`] left out.
pub(super) fn tree_listing(root: &Path) -> Result<Vec<String>> {
    let mut v = Vec::new();
    list_into(root, root, &mut v)?;
    Ok(v)
}

fn list_into(root: &Path, d: &Path, v: &mut Vec<String>) -> Result<()> {
    let mut kids: Vec<PathBuf> = fs::read_dir(d)
        .map_err(io_err("list", d))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    kids.sort();
    for k in kids {
        let rel = k
            .strip_prefix(root)
            .unwrap_or(&k)
            .to_string_lossy()
            .into_owned();
        let name = k
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if rel == NOT_COMPARED[0] || name.starts_with(NOT_COMPARED[1]) {
            continue;
        }
        let md = fs::symlink_metadata(&k).map_err(io_err("stat", &k))?;
        let mode = md.permissions().mode() & 0o7777;
        let ft = md.file_type();
        if ft.is_symlink() {
            let t = fs::read_link(&k).map_err(io_err("read link", &k))?;
            v.push(format!("{rel} link -> {}", t.display()));
        } else if ft.is_dir() {
            v.push(format!("{rel} dir {mode:o}"));
            list_into(root, &k, v)?;
        } else if ft.is_file() {
            let data = fs::read(&k).map_err(io_err("read", &k))?;
            let h = xxhash_rust::xxh3::xxh3_64(&data);
            v.push(format!("{rel} file {mode:o} {} {h:016x}", md.size()));
        } else {
            v.push(format!("{rel} other {mode:o}"));
        }
    }
    Ok(())
}

/// Up to `max` lines that differ between two listings: `-` only in `a`, `+` only in `b`.
pub(super) fn differences(a: &[String], b: &[String], max: usize) -> Vec<String> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while out.len() < max && (i < a.len() || j < b.len()) {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x == y => {
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if x < y => {
                out.push(format!("- {x}"));
                i += 1;
            }
            (Some(x), None) => {
                out.push(format!("- {x}"));
                i += 1;
            }
            (_, Some(y)) => {
                out.push(format!("+ {y}"));
                j += 1;
            }
            (None, None) => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_sees_contents_and_modes_and_skips_the_index() {
        let t = tempfile::tempdir().expect("tempdir");
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        for r in [&a, &b] {
            fs::create_dir_all(r.join(".git")).expect("mkdir");
            fs::write(r.join("f"), "x").expect("write");
        }
        fs::write(a.join(".git/index"), "1").expect("write");
        fs::write(b.join(".git/index"), "2").expect("write");
        fs::write(b.join(".tierstack-tmp.7"), "2").expect("write");
        let la = tree_listing(&a).expect("a");
        assert_eq!(la, tree_listing(&b).expect("b"));
        fs::write(b.join("f"), "y").expect("write");
        let d = differences(&la, &tree_listing(&b).expect("b"), 5);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d.iter().any(|l| l.starts_with("- f file ")), "{d:?}");
        assert!(d.iter().any(|l| l.starts_with("+ f file ")), "{d:?}");
        fs::write(b.join("f"), "x").expect("write");
        fs::set_permissions(b.join("f"), fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_ne!(la, tree_listing(&b).expect("b"));
    }

    #[test]
    fn walk_stops_at_the_cap() {
        let t = tempfile::tempdir().expect("tempdir");
        for i in 0..5 {
            fs::write(t.path().join(format!("f{i}")), "abc").expect("write");
        }
        let (mut list, mut bytes) = (Vec::new(), 0);
        walk(t.path(), 4, &mut list, &mut bytes);
        assert_eq!(list.len(), 4);
        assert_eq!(bytes, 9);
    }
}
