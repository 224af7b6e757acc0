//! SLURM's TaskProlog (`tierstack slurm task-prolog`): slurmd runs it as the job's user in
//! the environment of each task (the batch script too) before the task starts, and every
//! `export NAME=VALUE` line it prints becomes part of the task's environment. For a job with a
//! buffer (`$TIERSTACK_DIR`, set by the paths hook) that is a live tierstack mount serving io
//! clients, it prints the `LD_PRELOAD` and `TIERSTACK_IO` that `tierstack exec` would set, so
//! the task's calls on the buffer's files skip the FUSE round trips.
//!
//! On by default; `#BB_LUA io=off` (the paths hook then sets `TIERSTACK_IO_OFF=1`) or
//! `TIERSTACK_IO_OFF=1` in the job's environment turns it off. It never fails a task: any
//! problem is one line on stderr (slurmd's log; a `print` line on stdout would reach the
//! task's output), nothing on stdout, and the task runs as it would without tierstack.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::IO_OFF_VAR;

/// What the TaskProlog reads from the task's environment.
#[derive(Debug, Default, Clone)]
pub(crate) struct TaskEnv {
    /// `TIERSTACK_DIR`: the job's buffer.
    pub dir: Option<OsString>,
    /// `TIERSTACK_IO_OFF`.
    pub off: Option<OsString>,
    /// `LD_PRELOAD`.
    pub preload: Option<OsString>,
    /// `TIERSTACK_IO`.
    pub io: Option<OsString>,
}

impl TaskEnv {
    fn from_env() -> TaskEnv {
        TaskEnv {
            dir: std::env::var_os("TIERSTACK_DIR"),
            off: std::env::var_os(IO_OFF_VAR),
            preload: std::env::var_os(tierstack_fs::client_env::PRELOAD_VAR),
            io: std::env::var_os(tierstack_fs::client_env::IO_VAR),
        }
    }
}

/// Whether a `TIERSTACK_IO_OFF` value turns the client off (set, not empty, not `0`).
fn is_off(v: Option<&OsStr>) -> bool {
    v.is_some_and(|v| !v.is_empty() && v != "0")
}

/// What the TaskProlog prints for a task with environment `env` (pure): `Ok(None)` when the
/// task is none of its business (no buffer, or the job opted out), the `export` lines, or a
/// warning for stderr. `socket` finds the live mount at a folder and its io socket (canonical
/// mountpoint, socket); `lib` finds the client's library; each is asked only when needed.
pub(crate) fn exports(
    env: &TaskEnv,
    socket: impl FnOnce(&Path) -> Result<(PathBuf, PathBuf), String>,
    lib: impl FnOnce() -> Result<PathBuf, String>,
) -> Result<Option<Vec<u8>>, String> {
    let Some(dir) = env.dir.as_deref().filter(|d| !d.is_empty()) else {
        return Ok(None);
    };
    if is_off(env.off.as_deref()) {
        return Ok(None);
    }
    let (mp, sock) = socket(Path::new(dir))?;
    let lib = lib()?;
    // A value is the rest of its line for slurmstepd; `:` and `=` separate TIERSTACK_IO's
    // entries and fields.
    for (what, p, bad) in [
        ("the mountpoint", mp.as_os_str(), &b"\n:="[..]),
        ("the io socket", sock.as_os_str(), b"\n:="),
        ("the client library", lib.as_os_str(), b"\n: "),
    ] {
        if p.as_bytes().iter().any(|b| bad.contains(b)) {
            return Err(format!(
                "{what} {} holds one of {:?}, which the variables cannot carry",
                p.to_string_lossy(),
                String::from_utf8_lossy(bad)
            ));
        }
    }
    let mut out = Vec::new();
    for (k, v) in tierstack_fs::client_env::client_env(
        &lib,
        &mp,
        &sock,
        env.preload.as_deref(),
        env.io.as_deref(),
    ) {
        if v.as_bytes().contains(&b'\n') {
            return Err(format!("{k} holds a line break: left as it is"));
        }
        out.extend_from_slice(b"export ");
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(b'\n');
    }
    Ok(Some(out))
}

/// `tierstack slurm task-prolog` (SLURM's TaskProlog, as the job's user): prints the
/// environment that puts the task under the interception client for the job's buffer; `lib`
/// finds `libtierstack_io.so`. Never fails: a problem is a warning on stderr and the task
/// runs without the client.
pub fn task_prolog(lib: impl FnOnce() -> Result<PathBuf, String>) {
    let socket = |d: &Path| tierstack_fs::client_env::client_socket(d).map_err(|e| e.to_string());
    let warn = |e: &str| {
        eprintln!("tierstack slurm task-prolog: {e}; the task runs without the io client")
    };
    match exports(&TaskEnv::from_env(), socket, lib) {
        Ok(None) => {}
        Ok(Some(text)) => {
            // One write: a task gets both variables or neither.
            let mut out = std::io::stdout().lock();
            if let Err(e) = out.write_all(&text).and_then(|()| out.flush()) {
                warn(&format!("cannot write to slurmstepd: {e}"));
            }
        }
        Err(e) => warn(&e),
    }
}
