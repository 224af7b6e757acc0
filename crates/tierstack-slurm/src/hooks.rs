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

use crate::error::{Context, Result};
use tierstack_common::fmt_size;

use crate::creds::{as_user, exe, run_bounded, tierstack, tierstack_as_user};
use crate::directives::{read_request, Mode, Request};
use crate::state::{
    job_dir, jobs_dir, load_state, load_state_at, node_common, save_state, set_state, JobState,
};
use crate::{Common, IO_OFF_VAR, POOL};

// ---------------------------------------------------------------------------------------------
// Hooks

/// `job_process` (at submission, inside slurmctld): checks the `#BB_LUA` directives of the
/// job script and, given the job's uid and gid, that the user may read and write its paths.
pub fn job_process(script: &Path, uid: Option<u32>, gid: Option<u32>, c: &Common) -> Result<()> {
    let r = read_request(script)?;
    let Some(cap) = r.capacity else {
        println!("no tierstack burst buffer requested");
        return Ok(());
    };
    let pool = c.pool_bytes()?;
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
pub(crate) fn check_access(
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

/// `setup`: makes the job's buffer (a tierstack mount owned by the job's user) over its first
/// stage_out destination, or over a per-job scratch folder.
pub fn setup(
    id: &str,
    uid: u32,
    gid: u32,
    pool: &str,
    size: &str,
    script: &Path,
    c: &Common,
) -> Result<()> {
    let r = read_request(script)?;
    if let Some(n) = r.node_local {
        // The Prolog makes the buffers on each node; the user's access is checked here,
        // where a failure holds the job with the reason instead of draining a node.
        check_access(&r, uid, gid, c, true)?;
        println!(
            "job {id}: node-local buffers of {} are made by the Prolog on each node",
            fmt_size(n)
        );
        return Ok(());
    }
    let Some(cap) = r.capacity else {
        println!("job {id}: no tierstack buffer requested");
        return Ok(());
    };
    if !pool.is_empty() && pool != POOL && pool != "(null)" {
        bail!("job {id} asks for pool {pool}: use pool={POOL}");
    }
    let _ = size;
    make_buffer(id, &r, cap, uid, gid, c)
}

/// Makes the job's buffer: `job_dir/mnt` (a tierstack mount of `cap` over the first
/// stage_out, or a scratch folder) with its fast tier in `job_dir/tier`. A retried call keeps
/// a buffer that is up.
pub(crate) fn make_buffer(
    id: &str,
    r: &Request,
    cap: u64,
    uid: u32,
    gid: u32,
    c: &Common,
) -> Result<()> {
    let dir = job_dir(c, id)?;
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
    check_access(r, uid, gid, c, true)?;
    fs::create_dir_all(jobs_dir(c)).map_err(|e| {
        err!(
            "cannot create {}: {e}: check --fast-dir",
            jobs_dir(c).display()
        )
    })?;
    let res = (|| -> Result<JobState> {
        fs::create_dir(&dir)
            .map_err(|e| err!("cannot create {}: {e}: check --fast-dir", dir.display()))?;
        let made = "cannot make the job's buffer folder: check --fast-dir";
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).context(made)?;
        fs::write(dir.join(MOUNT_LOCK), b"").context(made)?;
        fs::create_dir(dir.join("mnt")).context(made)?;
        let tier = dir.join("tier");
        fs::create_dir(&tier).context(made)?;
        fs::set_permissions(&tier, fs::Permissions::from_mode(0o700)).context(made)?;
        let backing = match r.stage_out.first() {
            Some(p) => p.clone(),
            None => {
                let s = dir.join("scratch");
                fs::create_dir(&s).context(made)?;
                std::os::unix::fs::chown(&s, Some(uid), Some(gid)).context(made)?;
                fs::set_permissions(&s, fs::Permissions::from_mode(0o700)).context(made)?;
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
            backing,
            state: "pending".into(),
        };
        save_state(&dir, &s)?;
        mount_job(id, &dir, &s, c)?;
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

/// Mounts the job's buffer (again: a fast tier that holds undrained data resumes its drain).
/// Its drain is in the job's drain group (`slurm-JOBID`): where the site bounds drains with
/// slots, the job's nodes share one place in the queue.
fn mount_job(id: &str, dir: &Path, s: &JobState, c: &Common) -> Result<()> {
    let mnt = dir.join("mnt");
    let tier = dir.join("tier");
    // The drives are sparse files.
    let (drive, dram) = tierstack_fs::mount::fast_tier_for(s.capacity);
    let drive = format!("{}M", drive >> 20);
    let dram = format!("{}M", dram >> 20);
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "mount".as_ref(),
        s.backing.as_os_str(),
        mnt.as_os_str(),
        "--dir".as_ref(),
        tier.as_os_str(),
        "--drive-size".as_ref(),
        drive.as_ref(),
        "--dram".as_ref(),
        dram.as_ref(),
        "--mode".as_ref(),
        if s.mode == Mode::Sync {
            "sync"
        } else {
            "async"
        }
        .as_ref(),
        "--allow-other".as_ref(),
    ];
    // The job's user may status, drain and unmount their buffer; nobody else.
    let owner = format!("{}:{}", s.uid, s.gid);
    args.push("--owner".as_ref());
    args.push(owner.as_ref());
    let group = format!("slurm-{id}");
    args.push("--drain-group".as_ref());
    args.push(group.as_ref());
    let rate = c.drain_rate.map(|r| r.to_string());
    if let Some(r) = &rate {
        args.push("--drain-rate".as_ref());
        args.push(r.as_ref());
    }
    let (ok, msg) = tierstack(
        &args,
        "tierstack mount",
        Duration::from_secs(c.timeout.min(300)),
    )?;
    if !ok {
        bail!("cannot mount the job's buffer: {msg}");
    }
    Ok(())
}

pub(crate) fn mounted(mnt: &Path) -> bool {
    tierstack_common::mounts::mounted_type(mnt).is_some()
}

/// `data_in`: stages every stage_in source into the job's buffer, as the job's user.
pub fn data_in(id: &str, c: &Common) -> Result<()> {
    if !job_dir(c, id)?.exists() {
        // node_local= jobs: the Prolog stages on each node.
        println!("job {id}: no buffer here to stage into");
        return Ok(());
    }
    let (dir, mut s) = load_state(c, id)?;
    set_state(&dir, &mut s, "staging-in")?;
    // The user's stage commands report their progress here (get-status reads it).
    let progress = dir.join("progress");
    if !progress.is_dir() {
        fs::create_dir(&progress).map_err(|e| {
            err!(
                "cannot create {}: {e}: check --fast-dir",
                progress.display()
            )
        })?;
        std::os::unix::fs::chown(&progress, Some(s.uid), Some(s.gid))
            .context("cannot give the stage-in progress folder to the job's user")?;
    }
    let mnt = dir.join("mnt");
    let mut into = mnt.clone().into_os_string();
    into.push("/");
    let mut files = 0u64;
    for (i, src) in s.stage_in.clone().iter().enumerate() {
        let pf = progress.join(format!("in-{i}.json"));
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "stage".as_ref(),
            "in".as_ref(),
            src.as_os_str(),
            into.as_os_str(),
            "--json".as_ref(),
            "--progress-file".as_ref(),
            pf.as_os_str(),
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

/// `paths`: writes `TIERSTACK_DIR=<mount>` into SLURM's path file (the job's environment),
/// and `TIERSTACK_IO_OFF=1` for a job with `#BB_LUA io=off` (the TaskProlog reads both).
pub fn paths(id: &str, script: &Path, path_file: &Path, c: &Common) -> Result<()> {
    let mut dir = job_dir(c, id)?;
    let r = if dir.join("state.json").exists() {
        // The buffer is made: a script unreadable now leaves the client on, the default.
        read_request(script).unwrap_or_default()
    } else {
        let r = read_request(script)?;
        if r.node_local.is_none() {
            return Ok(());
        }
        // The Prolog mounts each node's buffer at the same path.
        dir = job_dir(&node_common(c), id)?;
        r
    };
    let mut line = format!("TIERSTACK_DIR={}\n", dir.join("mnt").display());
    if r.io == Some(false) {
        line += &format!("{IO_OFF_VAR}=1\n");
    }
    let mut f = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path_file)
        .map_err(|e| {
            err!(
                "cannot write SLURM's path file {}: {e}: check StateSaveLocation",
                path_file.display()
            )
        })?;
    f.write_all(line.as_bytes())
        .map_err(|e| err!("cannot write {}: {e}", path_file.display()))?;
    Ok(())
}

/// `pre_run`: checks that the job's mount is up before the job starts.
pub fn pre_run(id: &str, c: &Common) -> Result<()> {
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

/// `post_run`: the job ended; makes its outputs durable and starts the drain.
pub fn post_run(id: &str, c: &Common) -> Result<()> {
    let (dir, mut s) = match load_state(c, id) {
        Ok(x) => x,
        Err(_) if !job_dir(c, id)?.exists() => return Ok(()),
        Err(e) => return Err(e),
    };
    set_state(&dir, &mut s, "ran")?;
    let mnt = dir.join("mnt");
    if s.stage_out.is_empty() {
        return Ok(());
    }
    make_durable(id, &mnt, Duration::from_secs(c.timeout.min(120)));
    // Start the drain now; data_out waits for it.
    let _ = tierstack(
        &["drain".as_ref(), mnt.as_os_str()],
        "tierstack drain",
        Duration::from_secs(30),
    );
    Ok(())
}

/// Makes what the job wrote durable in the buffer's fast tier: fsync of every file under
/// `mnt` (in `mode=sync` the data is then on the array, so a mount daemon that dies during
/// the stage-out loses none of it; unsynced writes would be in its DRAM only). Best effort
/// within `limit`: the stage-out goes on either way, so problems are only reported.
pub(crate) fn make_durable(id: &str, mnt: &Path, limit: Duration) {
    let start = std::time::Instant::now();
    let mut stack = vec![mnt.to_path_buf()];
    let (mut files, mut failed) = (0u64, 0u64);
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else {
            failed += 1;
            continue;
        };
        for e in rd.flatten() {
            if start.elapsed() > limit {
                eprintln!(
                    "job {id}: stopped making the outputs durable after {} s ({files} files): the stage-out goes on",
                    limit.as_secs()
                );
                return;
            }
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                use std::os::unix::fs::OpenOptionsExt;
                let ok = fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                    .open(e.path())
                    .and_then(|f| f.sync_all())
                    .is_ok();
                if ok {
                    files += 1;
                } else {
                    failed += 1;
                }
            }
        }
    }
    if failed > 0 {
        eprintln!("job {id}: {failed} outputs could not be made durable before the stage-out");
    }
}

/// `data_out`: drains the buffer to the first stage_out destination, unmounts it and copies
/// it to the others, as the job's user.
pub fn data_out(id: &str, c: &Common) -> Result<()> {
    if !job_dir(c, id)?.exists() {
        return Ok(());
    }
    let (dir, mut s) = load_state(c, id)?;
    if s.stage_out.is_empty() {
        // A scratch buffer: nothing to keep; teardown removes it.
        set_state(&dir, &mut s, "staged-out")?;
        println!("job {id}: scratch buffer, nothing to stage out");
        return Ok(());
    }
    set_state(&dir, &mut s, "staging-out")?;
    let remounts = drain_buffer(id, &dir, &s, c)?;
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
    let again = if remounts > 0 {
        format!(" (its daemon had ended: mounted again {remounts} time(s), the drain resumed)")
    } else {
        String::new()
    };
    println!("job {id}: staged out to {}{again}", s.backing.display());
    Ok(())
}

/// Drains the job's buffer to its backing and unmounts it. A mount whose daemon is gone (it
/// was killed) is detached and mounted again over the same fast tier, which resumes the
/// drain where it stopped: what the daemon had acknowledged is not lost. Returns how many
/// times it mounted the buffer again.
pub(crate) fn drain_buffer(id: &str, dir: &Path, s: &JobState, c: &Common) -> Result<u32> {
    let mnt = dir.join("mnt");
    let t = format!("{}s", c.timeout);
    let mut remounts = 0;
    let mut last = String::new();
    for _ in 0..4 {
        if mounted(&mnt) && tierstack_fs::mount::status(&mnt).is_err() {
            // The daemon is gone: detach its stale mount.
            let _ = tierstack_fs::mount::clear_stale(&mnt);
        }
        if !mounted(&mnt) {
            if remounts == 2 {
                break;
            }
            // Under the buffer's mount lock, and never once teardown has begun: a teardown
            // (scancel --hurry runs it while data_out still runs) would otherwise find a
            // fresh mount where it removes the folder.
            let _held = lock_mounts(dir, false)?;
            if dir.join(TEARDOWN).exists() || !dir.join("state.json").exists() {
                bail!("job {id}: the buffer is being removed (scancel): stage-out stopped");
            }
            if !mounted(&mnt) {
                remounts += 1;
                mount_job(id, dir, s, c)?;
                eprintln!("job {id}: mounted the buffer again to resume its drain");
            }
        }
        // A umount that fails (killed, or its daemon died under it) is tried again; one
        // that fails for good (a destination that refuses records) fails every time.
        let (ok, msg) = tierstack(
            &[
                "umount".as_ref(),
                mnt.as_os_str(),
                "--timeout".as_ref(),
                t.as_ref(),
            ],
            "tierstack umount",
            Duration::from_secs(c.timeout + 30),
        )?;
        if ok {
            return Ok(remounts);
        }
        eprintln!("job {id}: tierstack umount failed: {msg}");
        last = msg;
    }
    bail!(
        "job {id}: stage-out to {} failed: {last}; what did not drain stays in the fast tier {}: mount it again over {} with `tierstack mount --dir` to finish, or `scancel` the job to drop it",
        s.backing.display(),
        dir.join("tier").display(),
        s.backing.display()
    )
}

/// Unmounts and removes a job's folder. Unless `hurry`, what was not staged out yet is
/// drained first (a dead daemon's buffer is mounted again for that); with data that cannot
/// drain, the folder is kept and an error says so. With `hurry` (scancel) undrained data is
/// dropped; what already reached the destination stays (the drainer renames each file into
/// place only when it is complete).
pub(crate) fn teardown_dir(id: &str, dir: &Path, hurry: bool, c: &Common) -> Result<()> {
    let mnt = dir.join("mnt");
    let pending = match load_state_at(dir) {
        Ok(s) if !s.stage_out.is_empty() && s.state != "staged-out" && s.state != "pending" => {
            Some(s)
        }
        _ => None,
    };
    if let (Some(s), false) = (&pending, hurry) {
        // On failure the folder is kept (the error says how to finish or drop it).
        drain_buffer(id, dir, s, c)?;
    }
    // From here on nothing mounts this buffer again (see drain_buffer); a mount made before
    // the lock is taken is seen and unmounted below.
    if dir.exists() {
        fs::write(dir.join(TEARDOWN), b"").map_err(|e| {
            err!(
                "cannot write {}: {e}: check --fast-dir",
                dir.join(TEARDOWN).display()
            )
        })?;
    }
    let _held = if dir.exists() {
        Some(lock_mounts(dir, true)?)
    } else {
        None
    };
    if mounted(&mnt) {
        let _ = tierstack(
            &["umount".as_ref(), mnt.as_os_str(), "--force".as_ref()],
            "tierstack umount",
            Duration::from_secs(60),
        );
        if mounted(&mnt) {
            // Last resort after scancel: detach the FUSE mount.
            let c = CString::new(mnt.as_os_str().as_bytes())
                .map_err(|_| err!("{} holds a NUL byte: remove it by hand", mnt.display()))?;
            // SAFETY: c is a valid NUL-terminated path.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
        if let Some(s) = &pending {
            // A drain cut short leaves its temporary file (the drainer renames each file into
            // place only when it is complete); with the fast tier dropped nothing resumes it.
            let mut t = s.backing.clone().into_os_string();
            t.push("/");
            if let Err(e) = tierstack_as_user(
                &["slurm".as_ref(), "user-clean".as_ref(), t.as_ref()],
                s,
                "removing the drain's temporary files",
                c,
            ) {
                eprintln!("job {id}: {e}");
            }
        }
    }
    remove_job_dir(dir)
}

/// Marks a job's folder as being torn down.
const TEARDOWN: &str = "teardown";

/// The lock file of `lock_mounts`.
const MOUNT_LOCK: &str = "mount.lock";

/// The lock that orders mounting a job's buffer (again) and tearing it down; waits at most
/// two minutes for it. Only the buffer's maker and its teardown `create` the lock file: a
/// hook that finds it gone is looking at a buffer being removed.
fn lock_mounts(dir: &Path, create: bool) -> Result<fs::File> {
    use std::os::unix::io::AsRawFd;
    let p = dir.join(MOUNT_LOCK);
    let f = fs::OpenOptions::new()
        .create(create)
        .truncate(false)
        .write(true)
        .open(&p)
        .map_err(|e| {
            err!(
                "cannot open {}: {e}: the buffer is being removed, or check --fast-dir",
                p.display()
            )
        })?;
    let start = std::time::Instant::now();
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(f);
        }
        if start.elapsed() > Duration::from_secs(120) {
            bail!(
                "{} stayed locked for 2 minutes (another hook mounts or removes this buffer): try again",
                p.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Removes a job's folder without ever descending into its mount point: a buffer still (or
/// again) mounted there would have its files, and through the drain the destination's,
/// deleted.
fn remove_job_dir(dir: &Path) -> Result<()> {
    let fail =
        |p: &Path, e: std::io::Error| err!("cannot remove {}: {e}: remove it by hand", p.display());
    // The state first: a hook that gets the mount lock after this sees no buffer.
    match fs::remove_file(dir.join("state.json")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(fail(&dir.join("state.json"), e))
        }
        _ => {}
    }
    let Ok(rd) = fs::read_dir(dir) else {
        return Ok(());
    };
    let mut entries: Vec<fs::DirEntry> = rd.flatten().collect();
    // The lock file last.
    entries.sort_by_key(|e| e.file_name() == MOUNT_LOCK);
    for e in entries {
        let p = e.path();
        if e.file_name() == "mnt" {
            if mounted(&p) {
                bail!(
                    "{} is still mounted: run `tierstack umount {} --force`, then remove {}",
                    p.display(),
                    p.display(),
                    dir.display()
                );
            }
            fs::remove_dir(&p).map_err(|e| fail(&p, e))?;
        } else if e.file_type().is_ok_and(|t| t.is_dir()) {
            fs::remove_dir_all(&p).map_err(|e| fail(&p, e))?;
        } else {
            fs::remove_file(&p).map_err(|e| fail(&p, e))?;
        }
    }
    fs::remove_dir(dir).map_err(|e| fail(dir, e))
}

/// `teardown`: drains what is left (dropped when `hurry`, after `scancel --hurry`), unmounts
/// and removes the job's folder.
pub fn teardown(id: &str, hurry: bool, c: &Common) -> Result<()> {
    let dir = job_dir(c, id)?;
    if !dir.exists() {
        return Ok(());
    }
    teardown_dir(id, &dir, hurry, c)?;
    println!("job {id}: buffer removed");
    Ok(())
}
