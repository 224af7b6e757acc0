//! MPI for `bench io`, found and used at run time only: `mpicc` builds the rank program
//! (`ior_rank.c`, embedded in the binary) into the work folder, `mpirun` launches it, or
//! `srun` as a job step inside a SLURM allocation (PMIx). Nothing in the tierstack build links
//! or generates bindings for MPI.
//!
//! Every wait is bounded: the compiler and each `mpirun` run under a timeout, after which
//! their process group gets SIGTERM and, 5 s later, SIGKILL; the ranks also carry their own
//! watchdog (`alarm`). Ctrl-C (the cancel flag) stops a run the same way.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{IoBenchError, Result};

/// How the ranks are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Launcher {
    /// `mpirun -np N` (Open MPI's launcher; inside a SLURM allocation it starts its daemons
    /// through SLURM itself).
    #[default]
    Mpirun,
    /// `srun --mpi=pmix --ntasks N`: the ranks are a job step of the SLURM allocation the
    /// benchmark runs in (`salloc`, `sbatch`), wired up by SLURM's PMIx server.
    Srun,
}

impl std::str::FromStr for Launcher {
    type Err = IoBenchError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "mpirun" => Ok(Launcher::Mpirun),
            "srun" => Ok(Launcher::Srun),
            _ => Err(IoBenchError::Setup(format!(
                "--launcher {s}: use mpirun or srun"
            ))),
        }
    }
}

impl std::fmt::Display for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Launcher::Mpirun => "mpirun",
            Launcher::Srun => "srun",
        })
    }
}

/// The rank program's source.
pub const RANK_SOURCE: &str = include_str!("ior_rank.c");

/// The MPI installation found on PATH.
#[derive(Debug, Clone)]
pub struct Mpi {
    /// Path of `mpirun`.
    pub mpirun: PathBuf,
    /// Path of `mpicc`.
    pub mpicc: PathBuf,
    /// First line of `mpirun --version`, e.g. `mpirun (Open MPI) 4.1.4`.
    pub version: String,
    /// Open MPI (its launcher takes `--oversubscribe`, `--bind-to none`).
    pub open_mpi: bool,
    /// How ranks are started.
    pub launcher: Launcher,
    /// Path of `srun` (with [`Launcher::Srun`]).
    pub srun: Option<PathBuf>,
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Finds `mpirun` and `mpicc` (and `srun` with [`Launcher::Srun`], which also needs a SLURM
/// allocation); when one is missing, one line naming the packages or the fix.
pub fn find(launcher: Launcher) -> Result<Mpi> {
    let srun = match launcher {
        Launcher::Mpirun => None,
        Launcher::Srun => {
            let srun = which("srun").ok_or_else(|| {
                IoBenchError::Setup(
                    "--launcher srun: srun is not on PATH: install the SLURM client (apt-get install slurm-client) or use --launcher mpirun".into(),
                )
            })?;
            if std::env::var_os("SLURM_JOB_ID").is_none() {
                return Err(IoBenchError::Setup(
                    "--launcher srun starts the ranks as a job step and needs a SLURM allocation: run the benchmark inside salloc or an sbatch script, or use --launcher mpirun".into(),
                ));
            }
            Some(srun)
        }
    };
    let mpirun = which("mpirun").ok_or_else(|| {
        IoBenchError::Setup(
            "bench io needs MPI and mpirun is not on PATH: install OpenMPI (apt-get install openmpi-bin libopenmpi-dev)".into(),
        )
    })?;
    let mpicc = which("mpicc").ok_or_else(|| {
        IoBenchError::Setup(
            "bench io builds its rank program with mpicc, which is not on PATH: install the MPI development package (apt-get install libopenmpi-dev)".into(),
        )
    })?;
    let out = run_bounded(
        Command::new(&mpirun).arg("--version"),
        "mpirun --version",
        None,
        Duration::from_secs(30),
    )?;
    if !out.ok {
        return Err(IoBenchError::Mpi(format!(
            "mpirun --version failed ({}): check the MPI installation (apt-get install --reinstall openmpi-bin)",
            out.last_err_line()
        )));
    }
    let version = out
        .stdout
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("mpirun")
        .trim()
        .to_string();
    let open_mpi = version.contains("Open MPI") || version.contains("OpenRTE");
    Ok(Mpi {
        mpirun,
        mpicc,
        version,
        open_mpi,
        launcher,
        srun,
    })
}

impl Mpi {
    /// Writes the rank program into `dir` and builds it; the path of the executable.
    pub fn build_rank(&self, dir: &Path) -> Result<PathBuf> {
        let src = dir.join("ior_rank.c");
        let exe = dir.join("tierstack-ior-rank");
        std::fs::write(&src, RANK_SOURCE).map_err(tierstack_common::io_err("write", &src))?;
        let out = run_bounded(
            Command::new(&self.mpicc)
                .arg("-O2")
                .arg("-o")
                .arg(&exe)
                .arg(&src),
            "mpicc",
            None,
            Duration::from_secs(180),
        )?;
        if !out.ok {
            return Err(IoBenchError::Mpi(format!(
                "mpicc could not build the rank program ({}): check that libopenmpi-dev and a C compiler are installed (apt-get install libopenmpi-dev build-essential)",
                out.last_err_line()
            )));
        }
        Ok(exe)
    }

    /// The command that starts `ranks` copies of `exe` with `args` (`mpirun`, or `srun`).
    pub fn command(&self, ranks: usize, exe: &Path, args: &[String]) -> Command {
        if let (Launcher::Srun, Some(srun)) = (self.launcher, &self.srun) {
            let mut c = Command::new(srun);
            // One job step of the allocation: as many tasks as ranks, more than its CPUs
            // allowed (as mpirun's --oversubscribe), the whole step ended if one rank fails.
            c.args([
                "--mpi=pmix",
                "--overcommit",
                "--kill-on-bad-exit=1",
                "--quiet",
            ])
            .arg(format!("--ntasks={ranks}"));
            let k = "OMPI_MCA_btl_vader_single_copy_mechanism";
            if std::env::var_os(k).is_none() {
                c.env(k, "none");
            }
            c.arg(exe).args(args);
            return c;
        }
        let mut c = Command::new(&self.mpirun);
        c.arg("-np").arg(ranks.to_string());
        if self.open_mpi {
            // One node with fewer cores than ranks is the common case here; bindings to
            // cores would then fail or serialise the ranks.
            c.args(["--oversubscribe", "--bind-to", "none"]);
            if rustix::process::geteuid().is_root() {
                // Open MPI refuses root unless told; the benchmark often runs as root (mounts).
                for k in ["OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] {
                    if std::env::var_os(k).is_none() {
                        c.env(k, "1");
                    }
                }
            }
            // Containers often forbid the cross-memory-attach single copy; the ranks only
            // exchange a few bytes, so the copy mechanism does not matter.
            let k = "OMPI_MCA_btl_vader_single_copy_mechanism";
            if std::env::var_os(k).is_none() {
                c.env(k, "none");
            }
        }
        c.arg(exe).args(args);
        c
    }
}

/// What a bounded command printed and how it ended.
#[derive(Debug, Default)]
pub struct Finished {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The most telling line of stderr: the rank program's own message if there is one,
    /// else the last non-empty line.
    pub fn last_err_line(&self) -> String {
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        lines
            .iter()
            .find(|l| l.starts_with("tierstack-ior-rank:"))
            .or_else(|| lines.last())
            .map(|s| s.to_string())
            .unwrap_or_else(|| "no message".into())
    }
}

fn reader(mut r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = r.read_to_end(&mut b);
        let _ = tx.send(String::from_utf8_lossy(&b).into_owned());
    });
    rx
}

fn signal_group(pgid: u32, sig: rustix::process::Signal) {
    if let Some(p) = rustix::process::Pid::from_raw(pgid as i32) {
        let _ = rustix::process::kill_process_group(p, sig);
    }
}

/// Runs `cmd` in its own process group until it ends, `timeout` passes or `cancel` is set;
/// then SIGTERM to the group and SIGKILL 5 s later. Timeout and cancel are errors.
pub fn run_bounded(
    cmd: &mut Command,
    what: &str,
    cancel: Option<&AtomicBool>,
    timeout: Duration,
) -> Result<Finished> {
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| IoBenchError::Mpi(format!("cannot start {what}: {e}")))?;
    let pgid = child.id();
    let out_rx = child.stdout.take().map(reader);
    let err_rx = child.stderr.take().map(reader);
    let deadline = Instant::now() + timeout;
    let mut stopped: Option<IoBenchError> = None;
    let mut term_at: Option<Instant> = None;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) => {}
            Err(e) => {
                stopped.get_or_insert(IoBenchError::Mpi(format!("cannot wait for {what}: {e}")));
                break None;
            }
        }
        if stopped.is_none() {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                stopped = Some(IoBenchError::Cancelled);
            } else if Instant::now() > deadline {
                stopped = Some(IoBenchError::Mpi(format!(
                    "{what} did not finish in {} s and was stopped: a rank hangs or the target is too slow; use a smaller --size-per-rank or a longer --timeout",
                    timeout.as_secs()
                )));
            }
            if stopped.is_some() {
                signal_group(pgid, rustix::process::Signal::TERM);
                term_at = Some(Instant::now());
            }
        } else if term_at.is_some_and(|t| t.elapsed() > Duration::from_secs(5)) {
            signal_group(pgid, rustix::process::Signal::KILL);
            term_at = None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The pipes close when every process that holds them has ended; a process that left the
    // group could keep them open, so the wait for the output is bounded too.
    let collect = |rx: Option<mpsc::Receiver<String>>| {
        rx.and_then(|r| r.recv_timeout(Duration::from_secs(10)).ok())
            .unwrap_or_default()
    };
    let stdout = collect(out_rx);
    let stderr = collect(err_rx);
    if let Some(e) = stopped {
        if status.is_some() {
            // Whatever is left of the group.
            signal_group(pgid, rustix::process::Signal::KILL);
        }
        return Err(e);
    }
    Ok(Finished {
        ok: status.is_some_and(|s| s.success()),
        stdout,
        stderr,
    })
}
