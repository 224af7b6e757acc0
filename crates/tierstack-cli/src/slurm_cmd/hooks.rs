//! The job's hooks: setup (the pool mount), data in, pre-run, post-run, data out and
//! teardown.

use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use tierstack_bench::{fmt_size, parse_size};

use super::creds::{as_user, exe, run_bounded, tierstack, tierstack_as_user};
use super::directives::{read_request, Mode, Request};
use super::state::{job_dir, jobs_dir, load_state, save_state, set_state, JobState};
use super::{Common, POOL};

// ---------------------------------------------------------------------------------------------
// Hooks

pub(super) fn pool_size(c: &Common) -> Result<u64> {
    parse_size(&c.pool_size).map_err(|e| anyhow!("--pool-size: {e}"))
}

pub(super) fn job_process(
    script: &Path,
    uid: Option<u32>,
    gid: Option<u32>,
    c: &Common,
) -> Result<()> {
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
pub(super) fn check_access(
    r: &Request,
    uid: u32,
    gid: u32,
    c: &Common,
    create: bool,
) -> Result<()> {
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

pub(super) fn setup(
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

pub(super) fn mounted(mnt: &Path) -> bool {
    tierstack_fs::mount::mounted_type(mnt).is_some()
}

pub(super) fn data_in(id: &str, c: &Common) -> Result<()> {
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

pub(super) fn paths(id: &str, path_file: &Path, c: &Common) -> Result<()> {
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

pub(super) fn pre_run(id: &str, c: &Common) -> Result<()> {
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

pub(super) fn post_run(id: &str, c: &Common) -> Result<()> {
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

pub(super) fn data_out(id: &str, c: &Common) -> Result<()> {
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
pub(super) fn teardown_dir(id: &str, dir: &Path, hurry: bool, c: &Common) -> Result<()> {
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

pub(super) fn teardown(id: &str, hurry: bool, c: &Common) -> Result<()> {
    let dir = job_dir(c, id)?;
    if !dir.exists() {
        return Ok(());
    }
    teardown_dir(id, &dir, hurry, c)?;
    println!("job {id}: buffer removed");
    Ok(())
}
