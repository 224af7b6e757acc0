//! Node-local buffers for multi-node jobs (`#BB_LUA node_local=SIZE`). burst_buffer/lua runs
//! on the controller, so a buffer on each of a job's compute nodes is made by SLURM's Prolog
//! (`tierstack slurm prolog`, root on each node: mount, then stage_in as the job's user, by
//! fan-out on a job of several nodes: `fanin.rs`) at
//! `FAST/node/jobs/JOBID/mnt`, the `$TIERSTACK_DIR` that the controller's paths hook gives the
//! job. The Epilog (`tierstack slurm epilog`) hands the drain to a background process
//! (`node-drain`) and returns, so the node is released while its outputs still drain to the
//! stage_out destination; a drain that was interrupted (a killed process, a reboot of the
//! daemon) is taken up again by the next Epilog on that node.

use std::fs;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::error::Result;
use tierstack_common::fmt_size;

use crate::creds::{run_capture, spawn_detached};
use crate::directives::parse_directives;
use crate::hooks::{data_in, data_out, make_buffer, make_durable, teardown};
use crate::state::{check_job_id, job_dir, jobs_dir, load_state_at, node_common, set_state};
use crate::Common;

fn env(k: &str) -> Result<String> {
    std::env::var(k).map_err(|_| {
        err!("{k} is not set: `tierstack slurm prolog|epilog` run as SLURM's Prolog/Epilog")
    })
}

fn env_id(k: &str) -> Result<u32> {
    env(k)?
        .parse()
        .map_err(|_| err!("{k} is not a number: run this as SLURM's Prolog/Epilog"))
}

/// The `#BB_LUA` lines of a job, from the BurstBuffer field of `scontrol show job`.
fn job_directives(id: &str) -> Result<String> {
    let mut cmd = Command::new("scontrol");
    cmd.args(["show", "job", id]);
    let (ok, text) = run_capture(cmd, "scontrol show job", Duration::from_secs(30))?;
    if !ok {
        bail!(
            "scontrol show job {id} failed: {}: check SLURM_CONF and slurmctld",
            tierstack_common::process::last_error_line(&text)
        );
    }
    Ok(burst_buffer_field(&text))
}

/// The value of `BurstBuffer=` in `scontrol show job` output: the first line after the key,
/// then the further directive lines (they start with `#`).
pub(crate) fn burst_buffer_field(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    for l in lines.by_ref() {
        if let Some(v) = l.trim_start().strip_prefix("BurstBuffer=") {
            out.push_str(v);
            out.push('\n');
            break;
        }
    }
    if out.is_empty() {
        return out;
    }
    for l in lines {
        if !l.starts_with('#') {
            break;
        }
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// SLURM Prolog (root, each compute node): makes the node-local buffer of a job with
/// `#BB_LUA node_local=SIZE` and stages its inputs in.
pub fn prolog(c: &Common) -> Result<()> {
    let id = env("SLURM_JOB_ID")?;
    check_job_id(&id)?;
    let uid = env_id("SLURM_JOB_UID")?;
    let gid = env_id("SLURM_JOB_GID")?;
    let r = parse_directives(&job_directives(&id)?).map_err(crate::SlurmError::Hook)?;
    let Some(size) = r.node_local else {
        return Ok(());
    };
    let nc = node_common(c);
    make_buffer(&id, &r, size, uid, gid, &nc)?;
    if !crate::fanin::fan_in(&id, &nc)? {
        data_in(&id, &nc)?;
    }
    let dir = job_dir(&nc, &id)?;
    let mut s = load_state_at(&dir)?;
    set_state(&dir, &mut s, "running")?;
    println!(
        "job {id}: node-local buffer of {} ready at {}",
        fmt_size(size),
        dir.join("mnt").display()
    );
    Ok(())
}

/// The arguments that pass this hook's settings on to a `node-drain` process.
fn drain_args(id: &str, c: &Common) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = vec![
        "slurm".into(),
        "node-drain".into(),
        id.into(),
        "--fast-dir".into(),
        c.fast_dir.clone().into_os_string(),
        "--pool-size".into(),
        c.pool_size.clone().into(),
        "--timeout".into(),
        c.timeout.to_string().into(),
    ];
    if let Some(r) = c.drain_rate {
        a.push("--drain-rate".into());
        a.push(r.to_string().into());
    }
    a
}

fn start_drain(id: &str, dir: &Path, c: &Common) -> Result<u32> {
    let args = drain_args(id, c);
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    spawn_detached(&refs, &dir.join("drain.log"))
}

/// SLURM Epilog (root, each compute node): drains the job's node-local buffer in the
/// background (or before returning, with `wait`) and removes it; resumes interrupted drains.
pub fn epilog(c: &Common, wait: bool) -> Result<()> {
    let id = env("SLURM_JOB_ID")?;
    check_job_id(&id)?;
    let nc = node_common(c);
    let dir = job_dir(&nc, &id)?;
    if dir.exists() {
        let mut s = load_state_at(&dir)?;
        set_state(&dir, &mut s, "ran")?;
        if !s.stage_out.is_empty() {
            make_durable(
                &id,
                &dir.join("mnt"),
                Duration::from_secs(c.timeout.min(120)),
            );
        }
        if wait {
            node_drain(&id, c)?;
        } else {
            let pid = start_drain(&id, &dir, c)?;
            println!("job {id}: draining the node-local buffer in the background (pid {pid})");
        }
    }
    // Drains that were interrupted (their process is gone, its lock free) start again.
    if let Ok(rd) = fs::read_dir(jobs_dir(&nc)) {
        for e in rd.flatten() {
            let other = e.file_name().to_string_lossy().into_owned();
            if other == id || check_job_id(&other).is_err() {
                continue;
            }
            let d = e.path();
            let Ok(s) = load_state_at(&d) else { continue };
            if s.state == "staging-out" && lock(&d, false).is_ok_and(|l| l.is_some()) {
                // The lock taken just now is released when `l` is dropped, before the new
                // drain takes it.
                let pid = start_drain(&other, &d, c)?;
                println!("job {other}: resumed the drain of its node-local buffer (pid {pid})");
            }
        }
    }
    Ok(())
}

/// An exclusive lock on the job's folder, held by the process that drains it; None when
/// another process holds it. Only the drain itself may `create` the lock file (a check that
/// made it in a folder being removed would keep the folder from going).
fn lock(dir: &Path, create: bool) -> Result<Option<fs::File>> {
    let p = dir.join("lock");
    let f = fs::OpenOptions::new()
        .create(create)
        .truncate(false)
        .write(true)
        .open(&p)
        .map_err(|e| err!("cannot open {}: {e}: check --fast-dir", p.display()))?;
    // SAFETY: flock on a descriptor we own.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    Ok((r == 0).then_some(f))
}

/// Internal `node-drain`: stages a node-local buffer out and removes it (a background process
/// started by the Epilog).
pub fn node_drain(id: &str, c: &Common) -> Result<()> {
    let nc = node_common(c);
    let dir = job_dir(&nc, id)?;
    if !dir.exists() {
        return Ok(());
    }
    let Some(_held) = lock(&dir, true)? else {
        println!("job {id}: another process drains this buffer");
        return Ok(());
    };
    data_out(id, &nc)?;
    teardown(id, false, &nc)?;
    println!("job {id}: node-local buffer drained and removed");
    Ok(())
}
