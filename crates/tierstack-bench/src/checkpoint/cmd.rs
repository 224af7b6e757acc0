//! Running the commands the checkpoint benchmark needs (the `tierstack` CLI, losetup,
//! mkfs.ext4, mount), with a timeout and the cancel flag, and reading the mount table.

use std::fs;
use std::io;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tierstack_common::mounts::mount_points;

use super::{CheckpointError, Result};
use crate::BenchError;

/// Runs a command to completion, killing it on `cancel` or after `timeout`. Its stdout on
/// success; an error with the last line of its stderr otherwise.
pub(super) fn run_cmd(
    cmd: &mut Command,
    what: &str,
    cancel: Option<&AtomicBool>,
    timeout: Duration,
) -> Result<String> {
    // Its own process group: a Ctrl-C at the terminal reaches this process (which stops
    // what it runs in order), not a `tierstack mount` halfway through starting its daemon.
    use std::os::unix::process::CommandExt;
    let child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| CheckpointError::Command {
            what: what.to_string(),
            msg: format!("cannot start it: {e}"),
        })?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel::<io::Result<Output>>();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let deadline = Instant::now() + timeout;
    let mut killed = None;
    let out = loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(r) => break r,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                break Err(io::Error::other("lost the child"))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if killed.is_none() {
                    let why = if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                        Some(CheckpointError::Cancelled)
                    } else if Instant::now() > deadline {
                        Some(CheckpointError::Command {
                            what: what.to_string(),
                            msg: format!("no answer in {} s: it was stopped", timeout.as_secs()),
                        })
                    } else {
                        None
                    };
                    if let Some(w) = why {
                        // The child is ours and not yet reaped (the thread reaps it).
                        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                        }
                        killed = Some(w);
                    }
                }
            }
        }
    };
    if let Some(w) = killed {
        return Err(w);
    }
    let out = out.map_err(|e| CheckpointError::Command {
        what: what.to_string(),
        msg: e.to_string(),
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        let last = last.strip_prefix("tierstack: error: ").unwrap_or(last);
        Err(CheckpointError::Command {
            what: what.to_string(),
            msg: if last.is_empty() {
                format!("it exited with {}", out.status)
            } else {
                last.to_string()
            },
        })
    }
}

pub(super) fn tool(name: &str, args: &[&str], what: &str) -> Result<String> {
    run_cmd(
        Command::new(name).args(args),
        what,
        None,
        Duration::from_secs(300),
    )
}

/// Removes a benchmark's work folder, never through a mount still under it; the error
/// names the problem and the fix.
pub(crate) fn remove_work_folder(w: &Path) -> std::result::Result<(), BenchError> {
    let wc = fs::canonicalize(w).unwrap_or_else(|_| w.to_path_buf());
    if mount_points().iter().any(|m| m.starts_with(&wc)) {
        return Err(BenchError::MountLeft(w.to_path_buf()));
    }
    fs::remove_dir_all(w).map_err(|source| BenchError::RemoveFolder {
        path: w.to_path_buf(),
        source,
    })
}
