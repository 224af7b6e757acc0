//! Who a mount or a run belongs to, as the Prometheus labels `job` and `user` that every
//! series of a mount (with `mountpoint`) or of a run (with `pid`) carries, in the node-wide
//! exporter and in `--metrics` alike.
//!
//! - `job`: the SLURM job id, where one is known. The SLURM hooks mount a job's buffer at
//!   `FAST/jobs/ID/mnt` (node-local buffers at `FAST/node/jobs/ID/mnt`) with its fast tier at
//!   `FAST/jobs/ID/tier` (`crates/tierstack-slurm/src/hooks.rs`), so the path names the job;
//!   a mount or a run started inside a job script has `SLURM_JOB_ID` in its environment
//!   (`/proc/PID/environ`, readable by its user and root). Empty when neither says.
//! - `user`: the owner of the mount's control socket (the daemon's user, or the job's user a
//!   root daemon was mounted for with `--owner`), else the daemon's or program's real uid,
//!   resolved to a name through the user database (NSS: LDAP users too), else the number.

use std::path::Path;

use tierstack_fs::mount::MountStatus;

use crate::runs::RunRecord;

/// The `job` and `user` labels of a mount or a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    /// The SLURM job id, or empty.
    pub job: String,
    /// The user's name, or the uid as a number, or empty when unknown.
    pub user: String,
}

/// Whether `s` is a SLURM job id as the hooks accept it (1 to 20 digits).
fn is_job_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit())
}

/// The job id in the path of a buffer the SLURM hooks made: `…/jobs/ID/mnt` (its mount
/// point) or `…/jobs/ID/tier` (its fast tier), possibly deeper (the tier's drives).
pub fn job_from_path(p: &Path) -> Option<String> {
    let parts: Vec<&str> = p
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    parts
        .windows(3)
        .rev()
        .find(|w| w[0] == "jobs" && is_job_id(w[1]) && (w[2] == "mnt" || w[2] == "tier"))
        .map(|w| w[1].to_string())
}

/// `SLURM_JOB_ID` in an environment block (`NAME=VALUE` entries separated by NULs, as
/// `/proc/PID/environ`), when it is a job id.
pub fn job_from_environ(env: &[u8]) -> Option<String> {
    env.split(|&b| b == 0)
        .find_map(|e| e.strip_prefix(b"SLURM_JOB_ID="))
        .and_then(|v| std::str::from_utf8(v).ok())
        .filter(|v| is_job_id(v))
        .map(str::to_string)
}

/// `SLURM_JOB_ID` of process `pid` (None when unset or not readable).
pub fn proc_job(pid: u32) -> Option<String> {
    job_from_environ(&std::fs::read(format!("/proc/{pid}/environ")).ok()?)
}

/// The real uid in the text of `/proc/PID/status` (its `Uid:` line).
pub fn uid_from_status(text: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|u| u.parse().ok())
}

/// The real uid of process `pid`.
pub fn proc_uid(pid: u32) -> Option<u32> {
    uid_from_status(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// The name of `uid` in the user database, else the number.
pub fn user_name(uid: u32) -> String {
    tierstack_common::users::user_name(uid)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| uid.to_string())
}

/// The owner of the mount whose status is `st` and control socket `socket`.
pub fn mount_owner(st: &MountStatus, socket: &Path) -> Owner {
    use std::os::unix::fs::MetadataExt;
    let job = job_from_path(&st.mountpoint)
        .or_else(|| st.fast_dir.as_deref().and_then(job_from_path))
        .or_else(|| proc_job(st.pid))
        .unwrap_or_default();
    let uid = std::fs::metadata(socket)
        .ok()
        .map(|m| m.uid())
        .or_else(|| proc_uid(st.pid));
    Owner {
        job,
        user: uid.map(user_name).unwrap_or_default(),
    }
}

/// The owner of a `tierstack run` (its program's, else the `tierstack run` process's).
pub fn run_owner(rec: &RunRecord) -> Owner {
    Owner {
        job: proc_job(rec.pid)
            .or_else(|| proc_job(rec.tierstack_pid))
            .unwrap_or_default(),
        user: proc_uid(rec.pid)
            .or_else(|| proc_uid(rec.tierstack_pid))
            .map(user_name)
            .unwrap_or_default(),
    }
}
