//! `tierstack slurm`: SLURM burst_buffer/lua integration.
//!
//! The Lua script that `install` writes (contrib/slurm/burst_buffer.lua) is thin: each SLURM
//! hook runs `tierstack slurm HOOK ...` and hands its exit status and the last line it printed
//! back to SLURM. Everything else happens here:
//!
//! - `job-process SCRIPT` (at submission, inside slurmctld): parses and checks the `#BB_LUA`
//!   directives of the job script.
//! - `setup JOBID UID GID POOL SIZE SCRIPT`: checks, as the job's user, that every stage_in
//!   source is readable and every stage_out destination writable (creating the first one),
//!   then mounts a tierstack burst buffer for the job at `FAST/jobs/JOBID/mnt` over the first
//!   stage_out destination (or over a per-job scratch folder when there is none), with its
//!   fast tier in `FAST/jobs/JOBID/tier`.
//! - `data-in JOBID SCRIPT`: `tierstack stage in` of every source into the mount, run as the
//!   job's user.
//! - `paths JOBID SCRIPT PATH_FILE`: writes `TIERSTACK_DIR=<mount>` for the job's environment.
//! - `pre-run`, `post-run`: check that the mount is up / start its drain.
//! - `data-out JOBID SCRIPT`: `tierstack umount` (drains everything to the first stage_out
//!   destination), then copies it to the other stage_out destinations as the job's user.
//! - `teardown JOBID SCRIPT HURRY`: unmounts what is left and removes the job's folder.
//! - `pools`, `get-status`: the `tierstack` pool as SLURM wants it, and a status text.
//!
//! Hooks run as SlurmUser (root); everything that touches the job's files runs in a child
//! process with the job's uid, gid and groups.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs;
use std::io::{Read, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use tierstack_bench::{fmt_size, parse_size};

/// The pool name that job scripts must give with `capacity=`.
pub const POOL: &str = "tierstack";
/// Pool granularity reported to SLURM. Measured on 22.05: with a granularity above 1 SLURM no
/// longer holds jobs back when `quantity` bytes are taken (two 1500M jobs ran at once in a 2G
/// pool with 1 MiB granularity), so quantity and capacity are plain bytes.
const GRANULARITY: u64 = 1;
/// First line of every file `install` writes: `uninstall` removes only files that carry it.
const MARKER: &str = "tierstack slurm install";
const LUA_TEMPLATE: &str = include_str!("../../../contrib/slurm/burst_buffer.lua");
const CONF_TEMPLATE: &str = include_str!("../../../contrib/slurm/burst_buffer.conf");

#[derive(Args, Clone)]
pub struct Common {
    /// Folder of the per-job buffers (their fast tiers and mount points).
    #[arg(long, default_value = "/var/tmp/tierstack-slurm")]
    pub fast_dir: PathBuf,
    /// Size of the `tierstack` pool that SLURM accounts capacity= against.
    #[arg(long, default_value = "2G")]
    pub pool_size: String,
    /// Bound on this hook's own waits, in seconds (SLURM's timeouts kill the hook too).
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
}

#[derive(Subcommand)]
pub enum SlurmCmd {
    /// Write burst_buffer.lua and burst_buffer.conf into SLURM's configuration folder.
    Install {
        /// SLURM's configuration folder (where slurm.conf is).
        #[arg(long)]
        conf_dir: PathBuf,
        /// Folder of the per-job buffers (node-local fast storage, not under /tmp when jobs
        /// get a private /tmp).
        #[arg(long, default_value = "/var/tmp/tierstack-slurm")]
        fast_dir: PathBuf,
        /// Size of the `tierstack` pool (sum of the capacity= of the jobs holding buffers).
        #[arg(long, default_value = "2G")]
        pool_size: String,
        /// StageInTimeout and StageOutTimeout (seconds) written to burst_buffer.conf.
        #[arg(long, default_value_t = 3600)]
        stage_timeout: u64,
        /// OtherTimeout (seconds) written to burst_buffer.conf.
        #[arg(long, default_value_t = 300)]
        other_timeout: u64,
    },
    /// Remove the files `install` wrote (only files that carry its marker line).
    Uninstall {
        #[arg(long)]
        conf_dir: PathBuf,
    },
    /// Hook: check the #BB_LUA directives of a job script (at submission).
    JobProcess {
        script: PathBuf,
        #[arg(long)]
        uid: Option<u32>,
        #[arg(long)]
        gid: Option<u32>,
        #[command(flatten)]
        common: Common,
    },
    /// Hook: make the job's buffer (a tierstack mount owned by the job's user).
    Setup {
        job_id: String,
        uid: u32,
        gid: u32,
        pool: String,
        size: String,
        script: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Hook: stage the job's inputs into its buffer, as the job's user.
    DataIn {
        job_id: String,
        script: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Hook: write TIERSTACK_DIR=... into SLURM's path file (the job's environment).
    Paths {
        job_id: String,
        script: PathBuf,
        path_file: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Hook: check that the job's mount is up before the job starts.
    PreRun {
        job_id: String,
        script: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Hook: the job ended; start the drain of its buffer.
    PostRun {
        job_id: String,
        script: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Hook: drain the buffer to the stage_out destinations and unmount it.
    DataOut {
        job_id: String,
        script: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Hook: remove the job's buffer (`true` after scancel).
    Teardown {
        job_id: String,
        script: PathBuf,
        #[arg(default_value = "false")]
        hurry: String,
        #[command(flatten)]
        common: Common,
    },
    /// Hook: the `tierstack` pool as SLURM's JSON.
    Pools {
        #[command(flatten)]
        common: Common,
    },
    /// Hook: `scontrol show bbstat`: capacity used/free and each job's state.
    GetStatus {
        args: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Internal: access checks run as the job's user.
    #[command(hide = true)]
    UserCheck {
        #[arg(long)]
        read: Vec<PathBuf>,
        #[arg(long)]
        write: Vec<PathBuf>,
    },
}

pub fn run(c: SlurmCmd) -> Result<()> {
    match c {
        SlurmCmd::Install {
            conf_dir,
            fast_dir,
            pool_size,
            stage_timeout,
            other_timeout,
        } => install(
            &conf_dir,
            &fast_dir,
            &pool_size,
            stage_timeout,
            other_timeout,
        ),
        SlurmCmd::Uninstall { conf_dir } => uninstall(&conf_dir),
        SlurmCmd::JobProcess {
            script,
            uid,
            gid,
            common,
        } => job_process(&script, uid, gid, &common),
        SlurmCmd::Setup {
            job_id,
            uid,
            gid,
            pool,
            size,
            script,
            common,
        } => setup(&job_id, uid, gid, &pool, &size, &script, &common),
        SlurmCmd::DataIn {
            job_id,
            script: _,
            common,
        } => data_in(&job_id, &common),
        SlurmCmd::Paths {
            job_id,
            path_file,
            common,
            ..
        } => paths(&job_id, &path_file, &common),
        SlurmCmd::PreRun { job_id, common, .. } => pre_run(&job_id, &common),
        SlurmCmd::PostRun { job_id, common, .. } => post_run(&job_id, &common),
        SlurmCmd::DataOut { job_id, common, .. } => data_out(&job_id, &common),
        SlurmCmd::Teardown {
            job_id,
            hurry,
            common,
            ..
        } => teardown(&job_id, hurry == "true", &common),
        SlurmCmd::Pools { common } => pools(&common),
        SlurmCmd::GetStatus { args: _, common } => get_status(&common),
        SlurmCmd::UserCheck { read, write } => user_check(&read, &write),
    }
}

// ---------------------------------------------------------------------------------------------
// Directives

/// `mode=` of a job's mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Sync,
    Async,
}

/// What a job script asks for in its `#BB_LUA` lines.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    pub pool: Option<String>,
    pub capacity: Option<u64>,
    pub stage_in: Vec<PathBuf>,
    pub stage_out: Vec<PathBuf>,
    pub mode: Option<Mode>,
    pub manifest: Option<PathBuf>,
}

/// Splits a directive line into words; a word may be written in double quotes (`\"`, `\\`).
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            '\\' if quoted => match chars.next() {
                Some(n) => cur.push(n),
                None => return Err("a '\\' ends the line".into()),
            },
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quoted {
        return Err("a '\"' is not closed".into());
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Parses the `#BB_LUA` lines of a job script: they come after the `#!` line, among the
/// leading comment lines (SLURM ignores those after the first command). Each is a list of
/// `KEY=VALUE` words: `pool=tierstack capacity=SIZE [stage_in=SRC]... [stage_out=DST]...
/// [mode=sync|async] [manifest=FILE]`. Errors name the line and the fix.
pub fn parse_directives(script: &str) -> Result<Request, String> {
    let mut r = Request::default();
    for (i, raw) in script.lines().enumerate() {
        let line = raw.trim();
        if i == 0 && line.starts_with("#!") {
            continue;
        }
        if line.is_empty() {
            continue;
        }
        if !line.starts_with('#') {
            break;
        }
        let Some(rest) = line.strip_prefix("#BB_LUA") else {
            continue;
        };
        if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
            continue;
        }
        let n = i + 1;
        let ws = words(rest).map_err(|e| format!("#BB_LUA on line {n}: {e}: fix the quoting"))?;
        for w in ws {
            let Some((k, v)) = w.split_once('=') else {
                return Err(format!(
                    "#BB_LUA on line {n}: '{w}' is not KEY=VALUE: write e.g. capacity=1G"
                ));
            };
            if v.is_empty() {
                return Err(format!(
                    "#BB_LUA on line {n}: {k}= has no value: give one or remove it"
                ));
            }
            let once = |set: bool| -> Result<(), String> {
                if set {
                    Err(format!(
                        "#BB_LUA on line {n}: {k}= is given twice: keep one"
                    ))
                } else {
                    Ok(())
                }
            };
            match k {
                "pool" => {
                    once(r.pool.is_some())?;
                    if v != POOL {
                        return Err(format!(
                            "#BB_LUA on line {n}: pool={v} is unknown: use pool={POOL}"
                        ));
                    }
                    r.pool = Some(v.to_string());
                }
                "capacity" => {
                    once(r.capacity.is_some())?;
                    let c = parse_size(v).map_err(|e| format!("#BB_LUA on line {n}: {e}"))?;
                    if c == 0 {
                        return Err(format!(
                            "#BB_LUA on line {n}: capacity=0: give a size such as 1G"
                        ));
                    }
                    r.capacity = Some(c);
                }
                "stage_in" => r.stage_in.push(abs(n, k, v)?),
                "stage_out" => r.stage_out.push(abs(n, k, v)?),
                "mode" => {
                    once(r.mode.is_some())?;
                    r.mode = Some(match v {
                        "sync" => Mode::Sync,
                        "async" => Mode::Async,
                        _ => {
                            return Err(format!(
                                "#BB_LUA on line {n}: mode={v} is unknown: use mode=sync or mode=async"
                            ))
                        }
                    });
                }
                "manifest" => {
                    once(r.manifest.is_some())?;
                    r.manifest = Some(abs(n, k, v)?);
                }
                _ => {
                    return Err(format!(
                        "#BB_LUA on line {n}: unknown key '{k}': use pool, capacity, stage_in, stage_out, mode or manifest"
                    ))
                }
            }
        }
    }
    if r == Request::default() {
        return Ok(r);
    }
    if r.capacity.is_none() {
        return Err(format!(
            "#BB_LUA: no capacity= given: add e.g. '#BB_LUA pool={POOL} capacity=1G'"
        ));
    }
    if r.pool.is_none() {
        return Err(format!(
            "#BB_LUA: capacity= needs pool={POOL} on the same line: add it"
        ));
    }
    if r.manifest.is_some() && r.stage_in.len() != 1 {
        return Err(
            "#BB_LUA: manifest= lists paths relative to one stage_in= root: give exactly one stage_in="
                .into(),
        );
    }
    Ok(r)
}

fn abs(n: usize, k: &str, v: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(v);
    if !p.is_absolute() {
        return Err(format!(
            "#BB_LUA on line {n}: {k}={v} is not an absolute path: give the full path"
        ));
    }
    Ok(p)
}

fn read_request(script: &Path) -> Result<Request> {
    let text = fs::read(script).map_err(|e| {
        anyhow!(
            "cannot read the job script {}: {e}: check SLURM's StateSaveLocation",
            script.display()
        )
    })?;
    parse_directives(&String::from_utf8_lossy(&text)).map_err(anyhow::Error::msg)
}

// ---------------------------------------------------------------------------------------------
// Per-job state

#[derive(Debug, Clone)]
struct JobState {
    uid: u32,
    gid: u32,
    capacity: u64,
    mode: Mode,
    stage_in: Vec<PathBuf>,
    stage_out: Vec<PathBuf>,
    manifest: Option<PathBuf>,
    backing: PathBuf,
    /// pending, staging-in, staged-in, running, staging-out, staged-out
    state: String,
}

impl JobState {
    fn to_json(&self) -> serde_json::Value {
        let ps = |v: &[PathBuf]| -> Vec<String> {
            v.iter().map(|p| p.to_string_lossy().into_owned()).collect()
        };
        serde_json::json!({
            "uid": self.uid,
            "gid": self.gid,
            "capacity": self.capacity,
            "mode": if self.mode == Mode::Sync { "sync" } else { "async" },
            "stage_in": ps(&self.stage_in),
            "stage_out": ps(&self.stage_out),
            "manifest": self.manifest.as_ref().map(|p| p.to_string_lossy().into_owned()),
            "backing": self.backing.to_string_lossy(),
            "state": self.state,
        })
    }

    fn from_json(v: &serde_json::Value) -> Option<JobState> {
        let paths = |k: &str| -> Option<Vec<PathBuf>> {
            v.get(k)?
                .as_array()?
                .iter()
                .map(|x| x.as_str().map(PathBuf::from))
                .collect()
        };
        Some(JobState {
            uid: u32::try_from(v.get("uid")?.as_u64()?).ok()?,
            gid: u32::try_from(v.get("gid")?.as_u64()?).ok()?,
            capacity: v.get("capacity")?.as_u64()?,
            mode: if v.get("mode")?.as_str()? == "async" {
                Mode::Async
            } else {
                Mode::Sync
            },
            stage_in: paths("stage_in")?,
            stage_out: paths("stage_out")?,
            manifest: v.get("manifest")?.as_str().map(PathBuf::from),
            backing: PathBuf::from(v.get("backing")?.as_str()?),
            state: v.get("state")?.as_str()?.to_string(),
        })
    }
}

fn check_job_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > 20 || !id.bytes().all(|b| b.is_ascii_digit()) {
        bail!("job id '{id}' is not a number: the hook takes SLURM's numeric job id");
    }
    Ok(())
}

fn jobs_dir(c: &Common) -> PathBuf {
    c.fast_dir.join("jobs")
}

fn job_dir(c: &Common, id: &str) -> Result<PathBuf> {
    check_job_id(id)?;
    Ok(jobs_dir(c).join(id))
}

/// Writes a file atomically (temporary name, fsync, rename).
fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tierstack-{}", std::process::id()));
    let res = (|| -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = res {
        let _ = fs::remove_file(&tmp);
        bail!(
            "cannot write {}: {e}: check that the folder exists and is writable",
            path.display()
        );
    }
    Ok(())
}

fn save_state(dir: &Path, s: &JobState) -> Result<()> {
    let text = serde_json::to_string_pretty(&s.to_json())?;
    write_atomic(&dir.join("state.json"), text.as_bytes(), 0o644)
}

fn load_state(c: &Common, id: &str) -> Result<(PathBuf, JobState)> {
    let dir = job_dir(c, id)?;
    let p = dir.join("state.json");
    let text = fs::read_to_string(&p).map_err(|e| {
        anyhow!(
            "job {id} has no tierstack buffer ({}: {e}): the setup hook did not run or failed; see `scontrol show job {id}`",
            p.display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| anyhow!("{} is damaged ({e}): cancel the job", p.display()))?;
    let s = JobState::from_json(&v)
        .ok_or_else(|| anyhow!("{} is damaged: cancel the job", p.display()))?;
    Ok((dir, s))
}

fn set_state(dir: &Path, s: &mut JobState, state: &str) -> Result<()> {
    s.state = state.to_string();
    save_state(dir, s)
}

// ---------------------------------------------------------------------------------------------
// Running things as the job's user, with bounded waits

/// The supplementary groups of `uid` (with `gid`), from the user database.
fn user_groups(uid: u32, gid: u32) -> Result<Vec<libc::gid_t>> {
    let mut buf = vec![0u8; 16384];
    let mut pwd: libc::passwd = unsafe_zeroed_passwd();
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: pwd, buf and result are valid for the call; buf's length is passed.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        // A uid without a name (e.g. from a container): only its primary group.
        return Ok(vec![gid]);
    }
    // SAFETY: getpwuid_r succeeded, so pw_name points to a NUL-terminated string inside buf.
    let name: CString = unsafe { CStr::from_ptr(pwd.pw_name) }.to_owned();
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let mut count = n;
        // SAFETY: groups has room for `count` entries; name is NUL-terminated.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            return Ok(groups);
        }
        if n >= 65536 {
            bail!("user {uid} is in too many groups: check the user database");
        }
        n = count.max(n * 2);
    }
}

fn unsafe_zeroed_passwd() -> libc::passwd {
    // SAFETY: libc::passwd is a plain C struct of integers and pointers; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// A command that runs as `uid`/`gid` with the user's groups (when we are root).
fn as_user(mut cmd: Command, uid: u32, gid: u32) -> Result<Command> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        // Not root (tests, or SlurmUser not root): we can only act as ourselves.
        return Ok(cmd);
    }
    if uid == 0 {
        bail!("root cannot use tierstack burst buffers: submit the job as an ordinary user");
    }
    let groups = user_groups(uid, gid)?;
    // SAFETY: the closure runs in the forked child before exec and only calls async-signal-
    // safe functions (setgroups, setresgid, setresuid) on memory allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd)
}

fn exe() -> Result<PathBuf> {
    std::env::current_exe().context("cannot find the tierstack binary: reinstall it")
}

/// Runs a command with its output in a temporary file, waiting at most `limit`; returns the
/// exit success and the last non-empty output line.
fn run_bounded(mut cmd: Command, what: &str, limit: Duration) -> Result<(bool, String)> {
    let mut out = tempfile::tempfile().context("cannot make a temporary file: check $TMPDIR")?;
    let err = out.try_clone().context("cannot duplicate a file handle")?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(
            out.try_clone().context("cannot duplicate a file handle")?,
        ))
        .stderr(Stdio::from(err));
    // Descriptors inherited from SLURM (slurmscriptd reads the hook's output through a pipe
    // until EOF) must not reach the children: the mount daemon outlives the hook and would
    // hold that pipe open until SLURM's timeout.
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-
    // safe system calls (close_range, fcntl) on the child's own descriptors.
    unsafe {
        cmd.pre_exec(|| {
            let r = libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            if r != 0 {
                for fd in 3..4096 {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| anyhow!("cannot start {what}: {e}: check the tierstack installation"))?;
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child
            .try_wait()
            .context("cannot wait for a child process")?
        {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut text = String::new();
    let _ = out.rewind();
    let _ = out.read_to_string(&mut text);
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .trim_start_matches("tierstack: error: ")
        .to_string();
    match status {
        None => bail!(
            "{what} did not finish within {} s: raise the hook's --timeout or the burst_buffer.conf timeouts",
            limit.as_secs()
        ),
        Some(s) => Ok((s.success(), last)),
    }
}

/// Runs `tierstack ARGS` as the job's user; an error carries the command's message.
fn tierstack_as_user(
    args: &[&std::ffi::OsStr],
    s: &JobState,
    what: &str,
    c: &Common,
) -> Result<String> {
    let mut cmd = Command::new(exe()?);
    cmd.args(args);
    let cmd = as_user(cmd, s.uid, s.gid)?;
    let (ok, msg) = run_bounded(cmd, what, Duration::from_secs(c.timeout))?;
    if !ok {
        bail!("{what} failed: {msg}");
    }
    Ok(msg)
}

/// Runs `tierstack ARGS` as ourselves (root: the mount commands).
fn tierstack(args: &[&std::ffi::OsStr], what: &str, limit: Duration) -> Result<(bool, String)> {
    let mut cmd = Command::new(exe()?);
    cmd.args(args);
    run_bounded(cmd, what, limit)
}

/// Internal `user-check`: runs as the job's user; `access(2)` answers for it.
fn user_check(read: &[PathBuf], write: &[PathBuf]) -> Result<()> {
    fn access(p: &Path, mode: libc::c_int) -> std::io::Result<()> {
        let c = CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: c is a valid NUL-terminated path.
        if unsafe { libc::access(c.as_ptr(), mode) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    for p in read {
        let meta = fs::metadata(p).map_err(|e| {
            anyhow!(
                "stage_in={} cannot be read by uid {uid}: {e}: fix the path or its permissions",
                p.display()
            )
        })?;
        let mode = if meta.is_dir() {
            libc::R_OK | libc::X_OK
        } else {
            libc::R_OK
        };
        access(p, mode).map_err(|e| {
            anyhow!(
                "stage_in={} cannot be read by uid {uid}: {e}: fix the permissions or stage another path",
                p.display()
            )
        })?;
    }
    for p in write {
        match fs::metadata(p) {
            Ok(m) if m.is_dir() => access(p, libc::W_OK | libc::X_OK).map_err(|e| {
                anyhow!(
                    "stage_out={} is not writable by uid {uid}: {e}: give a folder the job's user may write",
                    p.display()
                )
            })?,
            Ok(_) => bail!(
                "stage_out={} exists and is not a folder: give a folder",
                p.display()
            ),
            Err(_) => {
                // Created as the user (one level), so it is the user's.
                fs::create_dir(p).map_err(|e| {
                    anyhow!(
                        "cannot create stage_out={} as uid {uid}: {e}: create it or give a folder the job's user may write",
                        p.display()
                    )
                })?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Hooks

fn pool_size(c: &Common) -> Result<u64> {
    parse_size(&c.pool_size).map_err(|e| anyhow!("--pool-size: {e}"))
}

fn job_process(script: &Path, uid: Option<u32>, gid: Option<u32>, c: &Common) -> Result<()> {
    let r = read_request(script)?;
    let Some(cap) = r.capacity else {
        println!("no tierstack burst buffer requested");
        return Ok(());
    };
    let pool = pool_size(c)?;
    if cap > pool {
        bail!(
            "#BB_LUA capacity={} is larger than the whole {POOL} pool ({}): ask for at most {}",
            fmt_size(cap),
            fmt_size(pool),
            fmt_size(pool)
        );
    }
    for p in r.stage_in.iter().chain(r.manifest.iter()) {
        if fs::symlink_metadata(p).is_err() {
            bail!(
                "#BB_LUA stage_in/manifest {} does not exist: check the path",
                p.display()
            );
        }
    }
    for p in &r.stage_out {
        let parent = p.parent().unwrap_or(Path::new("/"));
        if !p.is_dir() && !parent.is_dir() {
            bail!(
                "#BB_LUA stage_out={}: neither it nor its parent folder exists: create the parent folder",
                p.display()
            );
        }
    }
    // SLURM 22.05 passes no uid here; later versions do, and then the job's user's access is
    // checked now (otherwise at setup, which holds the job with the reason).
    if let (Some(uid), Some(gid)) = (uid, gid) {
        check_access(&r, uid, gid, c, false)?;
    }
    println!(
        "tierstack buffer of {} requested, {} stage_in, {} stage_out",
        fmt_size(cap),
        r.stage_in.len(),
        r.stage_out.len()
    );
    Ok(())
}

/// Checks as the job's user that sources are readable and destinations writable; with
/// `create`, the missing destination folders are created as the user.
fn check_access(r: &Request, uid: u32, gid: u32, c: &Common, create: bool) -> Result<()> {
    let mut cmd = Command::new(exe()?);
    cmd.args(["slurm", "user-check"]);
    for p in r.stage_in.iter().chain(r.manifest.iter()) {
        cmd.arg("--read").arg(p);
    }
    if create {
        for p in &r.stage_out {
            cmd.arg("--write").arg(p);
        }
    }
    let cmd = as_user(cmd, uid, gid)?;
    let (ok, msg) = run_bounded(
        cmd,
        "the access check",
        Duration::from_secs(c.timeout.min(120)),
    )?;
    if !ok {
        bail!("{msg}");
    }
    Ok(())
}

fn setup(
    id: &str,
    uid: u32,
    gid: u32,
    pool: &str,
    size: &str,
    script: &Path,
    c: &Common,
) -> Result<()> {
    let dir = job_dir(c, id)?;
    let r = read_request(script)?;
    let Some(cap) = r.capacity else {
        println!("job {id}: no tierstack buffer requested");
        return Ok(());
    };
    if !pool.is_empty() && pool != POOL && pool != "(null)" {
        bail!("job {id} asks for pool {pool}: use pool={POOL}");
    }
    let _ = size;
    if dir.exists() {
        // A retried setup: keep what is there if the mount is up.
        if let Ok((_, s)) = load_state(c, id) {
            if s.state != "pending" && mounted(&dir.join("mnt")) {
                println!("job {id}: buffer already set up");
                return Ok(());
            }
        }
        teardown_dir(id, &dir, true, c)?;
    }
    check_access(&r, uid, gid, c, true)?;
    fs::create_dir_all(jobs_dir(c)).map_err(|e| {
        anyhow!(
            "cannot create {}: {e}: check --fast-dir",
            jobs_dir(c).display()
        )
    })?;
    let res = (|| -> Result<JobState> {
        fs::create_dir(&dir)
            .map_err(|e| anyhow!("cannot create {}: {e}: check --fast-dir", dir.display()))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
        let mnt = dir.join("mnt");
        let tier = dir.join("tier");
        fs::create_dir(&mnt)?;
        fs::create_dir(&tier)?;
        fs::set_permissions(&tier, fs::Permissions::from_mode(0o700))?;
        let backing = match r.stage_out.first() {
            Some(p) => p.clone(),
            None => {
                let s = dir.join("scratch");
                fs::create_dir(&s)?;
                std::os::unix::fs::chown(&s, Some(uid), Some(gid))?;
                fs::set_permissions(&s, fs::Permissions::from_mode(0o700))?;
                s
            }
        };
        let mut s = JobState {
            uid,
            gid,
            capacity: cap,
            mode: r.mode.unwrap_or(Mode::Sync),
            stage_in: r.stage_in.clone(),
            stage_out: r.stage_out.clone(),
            manifest: r.manifest.clone(),
            backing: backing.clone(),
            state: "pending".into(),
        };
        save_state(&dir, &s)?;
        // RAID 5 of 4 file drives: 3 hold data. The drives are sparse files.
        let drive = (cap.div_ceil(3)).div_ceil(1 << 20).max(64);
        let dram = (cap / 4).clamp(64 << 20, 1 << 30) >> 20;
        let (ok, msg) = tierstack(
            &[
                "mount".as_ref(),
                backing.as_os_str(),
                mnt.as_os_str(),
                "--dir".as_ref(),
                tier.as_os_str(),
                "--drive-size".as_ref(),
                format!("{drive}M").as_ref(),
                "--dram".as_ref(),
                format!("{dram}M").as_ref(),
                "--mode".as_ref(),
                if s.mode == Mode::Sync {
                    "sync"
                } else {
                    "async"
                }
                .as_ref(),
                "--allow-other".as_ref(),
            ],
            "tierstack mount",
            Duration::from_secs(c.timeout.min(300)),
        )?;
        if !ok {
            bail!("cannot mount the job's buffer: {msg}");
        }
        set_state(&dir, &mut s, "set-up")?;
        Ok(s)
    })();
    match res {
        Ok(s) => {
            println!(
                "job {id}: {} buffer mounted at {} over {}",
                fmt_size(s.capacity),
                dir.join("mnt").display(),
                s.backing.display()
            );
            Ok(())
        }
        Err(e) => {
            let _ = teardown_dir(id, &dir, true, c);
            Err(e)
        }
    }
}

fn mounted(mnt: &Path) -> bool {
    tierstack_fs::mount::mounted_type(mnt).is_some()
}

fn data_in(id: &str, c: &Common) -> Result<()> {
    let (dir, mut s) = load_state(c, id)?;
    set_state(&dir, &mut s, "staging-in")?;
    let mnt = dir.join("mnt");
    let mut into = mnt.clone().into_os_string();
    into.push("/");
    let mut files = 0u64;
    for src in s.stage_in.clone() {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "stage".as_ref(),
            "in".as_ref(),
            src.as_os_str(),
            into.as_os_str(),
            "--json".as_ref(),
        ];
        if let Some(m) = &s.manifest {
            args.push("--manifest".as_ref());
            args.push(m.as_os_str());
        }
        let msg = tierstack_as_user(&args, &s, &format!("stage_in={}", src.display()), c)?;
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&msg) {
            files += v.get("files").and_then(|x| x.as_u64()).unwrap_or(0);
        }
    }
    set_state(&dir, &mut s, "staged-in")?;
    println!("job {id}: staged in {files} files");
    Ok(())
}

fn paths(id: &str, path_file: &Path, c: &Common) -> Result<()> {
    let dir = job_dir(c, id)?;
    if !dir.join("state.json").exists() {
        return Ok(());
    }
    let line = format!("TIERSTACK_DIR={}\n", dir.join("mnt").display());
    let mut f = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path_file)
        .map_err(|e| {
            anyhow!(
                "cannot write SLURM's path file {}: {e}: check StateSaveLocation",
                path_file.display()
            )
        })?;
    f.write_all(line.as_bytes())
        .map_err(|e| anyhow!("cannot write {}: {e}", path_file.display()))?;
    Ok(())
}

fn pre_run(id: &str, c: &Common) -> Result<()> {
    let (dir, mut s) = match load_state(c, id) {
        Ok(x) => x,
        Err(_) if !job_dir(c, id)?.exists() => return Ok(()),
        Err(e) => return Err(e),
    };
    if !mounted(&dir.join("mnt")) {
        bail!(
            "job {id}: the buffer at {} is not mounted (its daemon ended): cancel and resubmit the job",
            dir.join("mnt").display()
        );
    }
    set_state(&dir, &mut s, "running")?;
    Ok(())
}

fn post_run(id: &str, c: &Common) -> Result<()> {
    let (dir, mut s) = match load_state(c, id) {
        Ok(x) => x,
        Err(_) if !job_dir(c, id)?.exists() => return Ok(()),
        Err(e) => return Err(e),
    };
    set_state(&dir, &mut s, "ran")?;
    // Start the drain now; data_out waits for it.
    let mnt = dir.join("mnt");
    let _ = tierstack(
        &["drain".as_ref(), mnt.as_os_str()],
        "tierstack drain",
        Duration::from_secs(30),
    );
    Ok(())
}

fn data_out(id: &str, c: &Common) -> Result<()> {
    let (dir, mut s) = match load_state(c, id) {
        Ok(x) => x,
        Err(_) if !job_dir(c, id)?.exists() => return Ok(()),
        Err(e) => return Err(e),
    };
    set_state(&dir, &mut s, "staging-out")?;
    let mnt = dir.join("mnt");
    if mounted(&mnt) {
        let (ok, msg) = tierstack(
            &[
                "umount".as_ref(),
                mnt.as_os_str(),
                "--timeout".as_ref(),
                format!("{}s", c.timeout).as_ref(),
            ],
            "tierstack umount",
            Duration::from_secs(c.timeout + 30),
        )?;
        if !ok {
            bail!(
                "job {id}: stage-out to {} failed: {msg}",
                s.backing.display()
            );
        }
    }
    // The first stage_out is the mount's backing; the others get a copy of it.
    if s.stage_out.len() > 1 {
        let first = s.stage_out[0].clone();
        for d in &s.stage_out[1..] {
            let mut to = d.clone().into_os_string();
            to.push("/");
            tierstack_as_user(
                &[
                    "stage".as_ref(),
                    "out".as_ref(),
                    first.as_os_str(),
                    to.as_os_str(),
                ],
                &s,
                &format!("stage_out={}", d.display()),
                c,
            )?;
        }
    }
    set_state(&dir, &mut s, "staged-out")?;
    println!("job {id}: staged out to {}", s.backing.display());
    Ok(())
}

/// Unmounts (draining unless `hurry`) and removes a job's folder. With `hurry` false and data
/// still waiting, the folder is kept and an error says so.
fn teardown_dir(id: &str, dir: &Path, hurry: bool, c: &Common) -> Result<()> {
    let mnt = dir.join("mnt");
    if mounted(&mnt) {
        let timeout = if hurry { 30 } else { c.timeout };
        let mut args: Vec<&std::ffi::OsStr> = vec!["umount".as_ref(), mnt.as_os_str()];
        let t = format!("{timeout}s");
        if hurry {
            args.push("--force".as_ref());
        } else {
            args.push("--timeout".as_ref());
            args.push(t.as_ref());
        }
        let (ok, msg) = tierstack(&args, "tierstack umount", Duration::from_secs(timeout + 30))?;
        if !ok && !hurry {
            bail!(
                "job {id}: the buffer still holds data that did not drain ({msg}); it is kept in {}: fix the destination and run `tierstack umount {}`, or `scancel` the job to drop it",
                dir.display(),
                mnt.display()
            );
        }
        if mounted(&mnt) {
            // Last resort after scancel: detach the FUSE mount.
            let c = CString::new(mnt.as_os_str().as_bytes())?;
            // SAFETY: c is a valid NUL-terminated path.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
    if dir.exists() {
        fs::remove_dir_all(dir)
            .map_err(|e| anyhow!("cannot remove {}: {e}: remove it by hand", dir.display()))?;
    }
    Ok(())
}

fn teardown(id: &str, hurry: bool, c: &Common) -> Result<()> {
    let dir = job_dir(c, id)?;
    if !dir.exists() {
        return Ok(());
    }
    teardown_dir(id, &dir, hurry, c)?;
    println!("job {id}: buffer removed");
    Ok(())
}

fn jobs(c: &Common) -> Vec<(String, JobState)> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(jobs_dir(c)) {
        for e in rd.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if let Ok((_, s)) = load_state(c, &id) {
                out.push((id, s));
            }
        }
    }
    out.sort_by_key(|(id, _)| id.parse::<u64>().unwrap_or(0));
    out
}

fn pools(c: &Common) -> Result<()> {
    let q = pool_size(c)?;
    println!(
        "{}",
        serde_json::json!({"pools": [{"id": POOL, "quantity": q, "granularity": GRANULARITY}]})
    );
    Ok(())
}

fn get_status(c: &Common) -> Result<()> {
    let q = pool_size(c)?;
    let js = jobs(c);
    let used: u64 = js.iter().map(|(_, s)| s.capacity).sum();
    let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, s) in &js {
        *by_state.entry(s.state.as_str()).or_default() += 1;
    }
    println!(
        "pool {POOL}: {} of {} used, {} free, {} job buffer(s) in {}",
        fmt_size(used),
        fmt_size(q),
        fmt_size(q.saturating_sub(used)),
        js.len(),
        jobs_dir(c).display()
    );
    for (id, s) in &js {
        println!(
            "job {id}: uid {} capacity {} state {} backing {}",
            s.uid,
            fmt_size(s.capacity),
            s.state,
            s.backing.display()
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// install / uninstall

fn lua_quote(s: &str) -> String {
    let mut o = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn install(
    conf: &Path,
    fast: &Path,
    pool: &str,
    stage_timeout: u64,
    other_timeout: u64,
) -> Result<()> {
    let pool_bytes = parse_size(pool).map_err(|e| anyhow!("--pool-size: {e}"))?;
    if pool_bytes < 1 << 20 {
        bail!("--pool-size {pool} is smaller than 1M: give e.g. 2G");
    }
    if !conf.is_dir() {
        bail!(
            "--conf-dir {} is not a folder: give SLURM's configuration folder (where slurm.conf is)",
            conf.display()
        );
    }
    if !fast.is_absolute() {
        bail!(
            "--fast-dir {} is not absolute: give the full path",
            fast.display()
        );
    }
    let exe = exe()?;
    let lua = LUA_TEMPLATE
        .replace("\"@TIERSTACK@\"", &lua_quote(&exe.to_string_lossy()))
        .replace("\"@FAST_DIR@\"", &lua_quote(&fast.to_string_lossy()))
        .replace("\"@POOL_SIZE@\"", &lua_quote(&pool_bytes.to_string()))
        .replace("@STAGE_TIMEOUT@", &stage_timeout.to_string())
        .replace("@OTHER_TIMEOUT@", &other_timeout.to_string());
    let bbconf = CONF_TEMPLATE
        .replace("@STAGE_TIMEOUT@", &stage_timeout.to_string())
        .replace("@OTHER_TIMEOUT@", &other_timeout.to_string());
    let files = [
        (conf.join("burst_buffer.lua"), lua),
        (conf.join("burst_buffer.conf"), bbconf),
    ];
    // Refuse before writing anything if a file is someone else's.
    for (p, _) in &files {
        if let Ok(old) = fs::read_to_string(p) {
            if !old.contains(MARKER) {
                bail!(
                    "{} exists and was not written by tierstack: move it away (or merge it by hand) and run install again",
                    p.display()
                );
            }
        }
    }
    fs::create_dir_all(fast.join("jobs")).map_err(|e| {
        anyhow!(
            "cannot create {}: {e}: give a --fast-dir on a writable file system",
            fast.join("jobs").display()
        )
    })?;
    for (p, text) in &files {
        write_atomic(p, text.as_bytes(), 0o644)?;
    }
    println!(
        "wrote {} and {} (pool {POOL} of {}, buffers in {})",
        files[0].0.display(),
        files[1].0.display(),
        fmt_size(pool_bytes),
        fast.display()
    );
    let slurm_conf = conf.join("slurm.conf");
    let has = fs::read_to_string(&slurm_conf)
        .map(|t| {
            t.lines().any(|l| {
                let l: String = l
                    .split('#')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .collect();
                l.eq_ignore_ascii_case("BurstBufferType=burst_buffer/lua")
            })
        })
        .unwrap_or(false);
    if !has {
        println!(
            "add this line to {} and restart slurmctld: BurstBufferType=burst_buffer/lua",
            slurm_conf.display()
        );
    } else {
        println!("slurm.conf has BurstBufferType=burst_buffer/lua: run `scontrol reconfigure` (or restart slurmctld)");
    }
    Ok(())
}

fn uninstall(conf: &Path) -> Result<()> {
    let mut removed = 0;
    for name in ["burst_buffer.lua", "burst_buffer.conf"] {
        let p = conf.join(name);
        match fs::read_to_string(&p) {
            Ok(t) if t.contains(MARKER) => {
                fs::remove_file(&p).map_err(|e| {
                    anyhow!("cannot remove {}: {e}: remove it by hand", p.display())
                })?;
                removed += 1;
            }
            Ok(_) => eprintln!(
                "tierstack: kept {}: it was not written by tierstack",
                p.display()
            ),
            Err(_) => {}
        }
    }
    println!(
        "removed {removed} file(s) from {}; remove BurstBufferType=burst_buffer/lua from slurm.conf and restart slurmctld",
        conf.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_directives() {
        let s = "#!/bin/bash\n#SBATCH -N1\n#BB_LUA pool=tierstack capacity=1G stage_in=/a/b\n#BB_LUA stage_out=\"/c d\" mode=async\necho hi\n#BB_LUA bogus=1\n";
        let r = parse_directives(s).unwrap();
        assert_eq!(r.capacity, Some(1 << 30));
        assert_eq!(r.stage_in, vec![PathBuf::from("/a/b")]);
        assert_eq!(r.stage_out, vec![PathBuf::from("/c d")]);
        assert_eq!(r.mode, Some(Mode::Async));
        assert_eq!(
            parse_directives("#!/bin/sh\necho\n").unwrap(),
            Request::default()
        );
    }

    #[test]
    fn refuses_bad_directives() {
        for (s, want) in [
            ("#BB_LUA pool=tierstack capacity=1Q", "invalid size"),
            (
                "#BB_LUA pool=tierstack capacity=1G color=red",
                "unknown key 'color'",
            ),
            (
                "#BB_LUA pool=tierstack capacity=1G stage_in=rel",
                "not an absolute path",
            ),
            ("#BB_LUA pool=other capacity=1G", "use pool=tierstack"),
            ("#BB_LUA capacity=1G", "needs pool=tierstack"),
            ("#BB_LUA pool=tierstack", "no capacity="),
            ("#BB_LUA pool=tierstack capacity=1G mode=fast", "mode=fast"),
            (
                "#BB_LUA pool=tierstack capacity=1G manifest=/m",
                "exactly one stage_in",
            ),
        ] {
            let e = parse_directives(s).unwrap_err();
            assert!(e.contains(want), "{s}: {e}");
            assert!(!e.contains('\n'));
        }
    }
}
