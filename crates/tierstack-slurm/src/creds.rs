//! Running work as the job's user: the user's groups, a child process with the job's uid,
//! gid and groups, bounded in time; the `tierstack` binary run that way.

use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Context, Result};

use crate::state::JobState;
use crate::Common;

// ---------------------------------------------------------------------------------------------
// Running things as the job's user, with bounded waits

/// The supplementary groups of `uid` (with `gid`), from the user database.
pub(crate) fn user_groups(uid: u32, gid: u32) -> Result<Vec<libc::gid_t>> {
    let Some(name) = tierstack_common::users::user_name(uid) else {
        // A uid without a name (e.g. from a container): only its primary group.
        return Ok(vec![gid]);
    };
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

/// A command that runs as `uid`/`gid` with the user's groups (when we are root).
pub(crate) fn as_user(mut cmd: Command, uid: u32, gid: u32) -> Result<Command> {
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

pub(crate) fn exe() -> Result<PathBuf> {
    std::env::current_exe().context("cannot find the tierstack binary: reinstall it")
}

/// The path the binary was run by, for what `slurm install` writes into SLURM's configuration:
/// a Spack view's or an environment module's `bin/tierstack` is a symlink into a versioned
/// prefix that an upgrade replaces, and `current_exe` resolves it. The path as invoked (from
/// `argv[0]`, or the `PATH` entry it was found in) is kept when it names the same file as the
/// running binary; otherwise the running binary's own path.
pub(crate) fn invoked_exe() -> Result<PathBuf> {
    let exe = exe()?;
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let cwd = std::env::current_dir().unwrap_or_default();
    Ok(invoked_path(
        &argv0,
        std::env::var_os("PATH").as_deref(),
        &cwd,
        &exe,
    ))
}

/// [`invoked_exe`]'s choice: the first of `argv0` (made absolute against `cwd` when it has a
/// slash) or, for a bare name, each `PATH` entry joined with it, that is absolute and names the
/// same file as `exe`; else `exe`.
pub(crate) fn invoked_path(
    argv0: &std::ffi::OsStr,
    path_var: Option<&std::ffi::OsStr>,
    cwd: &std::path::Path,
    exe: &std::path::Path,
) -> PathBuf {
    let same = |p: &std::path::Path| {
        p.is_absolute()
            && matches!(
                (p.canonicalize(), exe.canonicalize()),
                (Ok(a), Ok(b)) if a == b
            )
    };
    let a = std::path::Path::new(argv0);
    let candidates: Vec<PathBuf> = if argv0.as_encoded_bytes().contains(&b'/') {
        vec![cwd.join(a)]
    } else {
        path_var
            .map(|v| std::env::split_paths(v).map(|d| d.join(a)).collect())
            .unwrap_or_default()
    };
    candidates
        .into_iter()
        .find(|c| same(c))
        .unwrap_or_else(|| exe.to_path_buf())
}

/// Descriptors inherited from SLURM (slurmscriptd and slurmd read a hook's output through a
/// pipe until EOF) must not reach our children: a mount daemon or a background drain outlives
/// the hook and would hold that pipe open until SLURM's timeout.
fn close_inherited(cmd: &mut Command) {
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
}

/// Runs a command with its output in a temporary file, waiting at most `limit`; returns the
/// exit success and the last non-empty output line.
pub(crate) fn run_bounded(cmd: Command, what: &str, limit: Duration) -> Result<(bool, String)> {
    let (ok, text) = run_capture(cmd, what, limit)?;
    Ok((ok, tierstack_common::process::last_error_line(&text)))
}

/// Runs a command with its output in a temporary file, waiting at most `limit`; returns the
/// exit success and all it printed (stdout and stderr).
pub(crate) fn run_capture(mut cmd: Command, what: &str, limit: Duration) -> Result<(bool, String)> {
    let mut out = tempfile::tempfile().context("cannot make a temporary file: check $TMPDIR")?;
    let err = out.try_clone().context("cannot duplicate a file handle")?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(
            out.try_clone().context("cannot duplicate a file handle")?,
        ))
        .stderr(Stdio::from(err));
    close_inherited(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| err!("cannot start {what}: {e}: check the installation"))?;
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
    match status {
        None => bail!(
            "{what} did not finish within {} s: raise the hook's --timeout or the burst_buffer.conf timeouts",
            limit.as_secs()
        ),
        Some(s) => Ok((s.success(), text)),
    }
}

/// Starts `tierstack ARGS` in a session of its own, its output appended to `log`, and does
/// not wait for it (a drain that goes on after the Epilog has released the node).
pub(crate) fn spawn_detached(args: &[&std::ffi::OsStr], log: &Path) -> Result<u32> {
    let f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| err!("cannot open {}: {e}: check --fast-dir", log.display()))?;
    let mut cmd = Command::new(exe()?);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(
            f.try_clone().context("cannot duplicate a file handle")?,
        ))
        .stderr(Stdio::from(f));
    close_inherited(&mut cmd);
    // SAFETY: setsid is async-signal-safe; it only detaches the child from our session.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| err!("cannot start the background drain: {e}: check the installation"))?;
    Ok(child.id())
}

/// Runs `tierstack ARGS` as the job's user; an error carries the command's message.
pub(crate) fn tierstack_as_user(
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
pub(crate) fn tierstack(
    args: &[&std::ffi::OsStr],
    what: &str,
    limit: Duration,
) -> Result<(bool, String)> {
    let mut cmd = Command::new(exe()?);
    cmd.args(args);
    run_bounded(cmd, what, limit)
}

/// Internal `user-check`: runs as the job's user; `access(2)` answers for it.
pub fn user_check(read: &[PathBuf], write: &[PathBuf]) -> Result<()> {
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
            err!(
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
            err!(
                "stage_in={} cannot be read by uid {uid}: {e}: fix the permissions or stage another path",
                p.display()
            )
        })?;
    }
    for p in write {
        match fs::metadata(p) {
            Ok(m) if m.is_dir() => access(p, libc::W_OK | libc::X_OK).map_err(|e| {
                err!(
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
                    err!(
                        "cannot create stage_out={} as uid {uid}: {e}: create it or give a folder the job's user may write",
                        p.display()
                    )
                })?;
            }
        }
    }
    Ok(())
}

/// Internal `user-clean`: runs as the job's user after `scancel --hurry` dropped a buffer
/// whose drain was cut short; removes the drainer's temporary files (`.tierstack-tmp.*`,
/// regular files) under `dir`, following no links, for at most 30 s.
pub fn user_clean(dir: &Path) -> Result<()> {
    let prefix = std::str::from_utf8(tierstack_fs::core::TMP_PREFIX).unwrap_or(".tierstack-tmp.");
    let start = Instant::now();
    let mut stack = vec![dir.to_path_buf()];
    let mut removed = 0u64;
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            if start.elapsed() > Duration::from_secs(30) {
                bail!(
                    "stopped after 30 s in {} ({removed} removed): remove the rest of the {prefix}* files by hand",
                    dir.display()
                );
            }
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file()
                && e.file_name().to_string_lossy().starts_with(prefix)
                && fs::remove_file(e.path()).is_ok()
            {
                removed += 1;
            }
        }
    }
    println!("removed {removed} temporary file(s) of a cut-short drain");
    Ok(())
}

#[cfg(test)]
mod invoked_tests {
    use super::invoked_path;
    use std::ffi::OsStr;

    /// A Spack view: `view/bin/tierstack` is a symlink to the versioned prefix's binary.
    fn view() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let t = tempfile::tempdir().expect("tmp");
        let real = t.path().join("opt/tierstack-0.1.0-abc/bin");
        let view = t.path().join("view/bin");
        std::fs::create_dir_all(&real).expect("mkdir");
        std::fs::create_dir_all(&view).expect("mkdir");
        std::fs::write(real.join("tierstack"), b"binary").expect("write");
        std::os::unix::fs::symlink(real.join("tierstack"), view.join("tierstack"))
            .expect("symlink");
        (t, real.join("tierstack"), view.join("tierstack"))
    }

    #[test]
    fn the_view_path_is_kept_when_found_on_path() {
        let (t, real, link) = view();
        let path = std::env::join_paths([t.path().join("elsewhere"), t.path().join("view/bin")])
            .expect("PATH");
        let got = invoked_path(OsStr::new("tierstack"), Some(&path), t.path(), &real);
        assert_eq!(got, link);
    }

    #[test]
    fn an_argv0_with_a_slash_is_made_absolute_and_kept() {
        let (t, real, link) = view();
        let got = invoked_path(OsStr::new("view/bin/tierstack"), None, t.path(), &real);
        assert_eq!(got, link);
    }

    #[test]
    fn another_file_of_the_same_name_falls_back_to_the_running_binary() {
        let (t, real, _) = view();
        let other = t.path().join("other");
        std::fs::create_dir_all(&other).expect("mkdir");
        std::fs::write(other.join("tierstack"), b"another").expect("write");
        let got = invoked_path(
            OsStr::new("tierstack"),
            Some(other.as_os_str()),
            t.path(),
            &real,
        );
        assert_eq!(got, real);
        let got = invoked_path(OsStr::new("tierstack"), None, t.path(), &real);
        assert_eq!(got, real);
    }
}
