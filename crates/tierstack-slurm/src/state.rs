//! Each job's state file (written atomically under the jobs folder) and the status queries
//! (`jobs`, `pools`, `get_status`).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::Result;
use tierstack_common::fmt_size;

use crate::directives::Mode;
use crate::{Common, GRANULARITY, POOL};

// ---------------------------------------------------------------------------------------------
// Per-job state

#[derive(Debug, Clone)]
pub(crate) struct JobState {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) capacity: u64,
    pub(crate) mode: Mode,
    pub(crate) stage_in: Vec<PathBuf>,
    pub(crate) stage_out: Vec<PathBuf>,
    pub(crate) manifest: Option<PathBuf>,
    pub(crate) backing: PathBuf,
    /// pending, staging-in, staged-in, running, staging-out, staged-out
    pub(crate) state: String,
}

impl JobState {
    pub(crate) fn to_json(&self) -> serde_json::Value {
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

    pub(crate) fn from_json(v: &serde_json::Value) -> Option<JobState> {
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

pub(crate) fn check_job_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > 20 || !id.bytes().all(|b| b.is_ascii_digit()) {
        bail!("job id '{id}' is not a number: the hook takes SLURM's numeric job id");
    }
    Ok(())
}

pub(crate) fn jobs_dir(c: &Common) -> PathBuf {
    c.fast_dir.join("jobs")
}

pub(crate) fn job_dir(c: &Common, id: &str) -> Result<PathBuf> {
    check_job_id(id)?;
    Ok(jobs_dir(c).join(id))
}

/// Writes a file atomically (temporary name, fsync, rename).
pub(crate) fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<()> {
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

pub(crate) fn save_state(dir: &Path, s: &JobState) -> Result<()> {
    let text = serde_json::to_string_pretty(&s.to_json())
        .map_err(|e| err!("cannot encode the job's state: {e}"))?;
    write_atomic(&dir.join("state.json"), text.as_bytes(), 0o644)
}

/// The folder of node-local buffers (made by the Prolog on each compute node): `FAST/node`.
pub(crate) fn node_common(c: &Common) -> Common {
    let mut n = c.clone();
    n.fast_dir = c.fast_dir.join("node");
    n
}

pub(crate) fn load_state(c: &Common, id: &str) -> Result<(PathBuf, JobState)> {
    let dir = job_dir(c, id)?;
    let s = load_state_at(&dir)?;
    Ok((dir, s))
}

/// The state of the job whose folder is `dir`.
pub(crate) fn load_state_at(dir: &Path) -> Result<JobState> {
    let id = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let p = dir.join("state.json");
    let text = fs::read_to_string(&p).map_err(|e| {
        err!(
            "job {id} has no tierstack buffer ({}: {e}): the setup hook did not run or failed; see `scontrol show job {id}`",
            p.display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| err!("{} is damaged ({e}): cancel the job", p.display()))?;
    JobState::from_json(&v).ok_or_else(|| err!("{} is damaged: cancel the job", p.display()))
}

/// Stage-in progress of a job: the `tierstack stage --progress-file` files its data_in hook
/// asked for, one a stage_in source (`progress/in-N.json`). Returns (fraction done, bytes of
/// the sources started so far, sources started).
fn stage_in_progress(dir: &Path) -> Option<(f64, u64, usize)> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let (mut done, mut total, mut bytes, mut n) = (0u64, 0u64, 0u64, 0usize);
    for e in fs::read_dir(dir.join("progress")).ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("in-") && name.ends_with(".json")) {
            continue;
        }
        // The folder is the job's user's: read no link they may have put there.
        let Ok(mut f) = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(e.path())
        else {
            continue;
        };
        let mut text = String::new();
        if Read::by_ref(&mut f)
            .take(4096)
            .read_to_string(&mut text)
            .is_err()
        {
            continue;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let get = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        done += get("done");
        total += get("total");
        bytes += get("bytes");
        n += 1;
    }
    if n == 0 {
        return None;
    }
    let frac = if total == 0 {
        1.0
    } else {
        (done as f64 / total as f64).min(1.0)
    };
    Some((frac, bytes, n))
}

pub(crate) fn set_state(dir: &Path, s: &mut JobState, state: &str) -> Result<()> {
    s.state = state.to_string();
    save_state(dir, s)
}

pub(crate) fn jobs(c: &Common) -> Vec<(String, JobState)> {
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

/// `pools`: the `tierstack` pool as SLURM's JSON (capacity, granularity, quantity used).
pub fn pools(c: &Common) -> Result<()> {
    let q = c.pool_bytes()?;
    println!(
        "{}",
        serde_json::json!({"pools": [{"id": POOL, "quantity": q, "granularity": GRANULARITY}]})
    );
    Ok(())
}

/// `get_status` (`scontrol show bbstat`): capacity used and free, and each job's state.
pub fn get_status(c: &Common) -> Result<()> {
    let q = c.pool_bytes()?;
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
        let mut progress = String::new();
        if s.state == "staging-in" || s.state == "staged-in" {
            if let Some((frac, bytes, n)) = stage_in_progress(&jobs_dir(c).join(id)) {
                progress = format!(
                    " stage_in {:.0}% ({} of {} staged, source {n} of {})",
                    frac * 100.0,
                    fmt_size((frac * bytes as f64) as u64),
                    fmt_size(bytes),
                    s.stage_in.len()
                );
            }
        }
        println!(
            "job {id}: uid {} capacity {} state {}{progress} backing {}",
            s.uid,
            fmt_size(s.capacity),
            s.state,
            s.backing.display()
        );
    }
    Ok(())
}
