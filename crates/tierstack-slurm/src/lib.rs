//! tierstack-slurm: the SLURM burst_buffer/lua integration behind `tierstack slurm`.
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
//! - `paths JOBID SCRIPT PATH_FILE`: writes `TIERSTACK_DIR=<mount>` for the job's environment
//!   (and `TIERSTACK_IO_OFF=1` for a job with `#BB_LUA io=off`).
//! - `pre-run`, `post-run`: check that the mount is up / fsync the outputs and start the drain.
//! - `data-out JOBID SCRIPT`: `tierstack umount` (drains everything to the first stage_out
//!   destination; a mount whose daemon died is mounted again over its fast tier and the drain
//!   resumes), then copies it to the other stage_out destinations as the job's user.
//! - `teardown JOBID SCRIPT HURRY`: drains what is left (unless HURRY, after `scancel
//!   --hurry`: then it is dropped, with the drain's temporary files), unmounts and removes
//!   the job's folder.
//! - `pools`, `get-status`: the `tierstack` pool as SLURM wants it, and a status text with
//!   each job's state and its stage-in progress.
//! - `prolog`, `epilog` (SLURM's Prolog/Epilog on each compute node): node-local buffers
//!   for `#BB_LUA node_local=SIZE` (node.rs; on several nodes the inputs are read from the
//!   shared file system once and fanned out node to node, fanin.rs).
//! - `task-prolog` (SLURM's TaskProlog, as the job's user before each task): puts the task
//!   under the interception client (`libtierstack_io.so`) for the job's buffer (task.rs).
//!
//! Hooks run as SlurmUser (root); everything that touches the job's files runs in a child
//! process with the job's uid, gid and groups.
//!
//! The parts, by job: this file holds the settings every hook shares and the public hooks
//! (the CLI's `slurm_cmd.rs` only parses the command line and calls them); `directives.rs`
//! parses the `#BB_LUA` directives of a job script; `state.rs` keeps each job's state file
//! and answers the status queries; `creds.rs` runs work as the job's user (uid, gid, groups)
//! with a time bound; `hooks.rs` holds the job's hooks (setup, data in, pre/post run, data
//! out, teardown); `install.rs` installs and removes the Slurm plugin files; `node.rs` holds the
//! node-local mode (Prolog/Epilog); `task.rs` the TaskProlog.

use std::path::PathBuf;

pub use creds::{user_check, user_clean};
pub use error::{Result, SlurmError};
pub use hooks::{data_in, data_out, job_process, paths, post_run, pre_run, setup, teardown};
pub use install::{install, uninstall, Settings as InstallSettings};
pub use node::{epilog, node_drain, prolog};
pub use state::{get_status, pools};
pub use task::task_prolog;

#[macro_use]
mod error;
mod creds;
mod directives;
mod fanin;
mod hooks;
mod install;
mod node;
mod state;
mod task;

/// The pool name that job scripts must give with `capacity=`.
pub const POOL: &str = "tierstack";

/// Set to `1` in a job's environment (by the paths hook for `#BB_LUA io=off`, or by the
/// user) to keep the TaskProlog from putting its tasks under the interception client.
pub const IO_OFF_VAR: &str = "TIERSTACK_IO_OFF";

/// Pool granularity reported to SLURM. Measured on 22.05: with a granularity above 1 SLURM no
/// longer holds jobs back when `quantity` bytes are taken (two 1500M jobs ran at once in a 2G
/// pool with 1 MiB granularity), so quantity and capacity are plain bytes.
const GRANULARITY: u64 = 1;

/// First line of every file `install` writes: `uninstall` removes only files that carry it.
const MARKER: &str = "tierstack slurm install";

const LUA_TEMPLATE: &str = include_str!("../../../contrib/slurm/burst_buffer.lua");

const CONF_TEMPLATE: &str = include_str!("../../../contrib/slurm/burst_buffer.conf");

const JOB_SUBMIT_TEMPLATE: &str = include_str!("../../../contrib/slurm/job_submit.lua");

const PROLOG_TEMPLATE: &str = include_str!("../../../contrib/slurm/prolog.sh");

const EPILOG_TEMPLATE: &str = include_str!("../../../contrib/slurm/epilog.sh");

const TASK_PROLOG_TEMPLATE: &str = include_str!("../../../contrib/slurm/task_prolog.sh");

/// What every hook is given (`tierstack slurm HOOK --fast-dir … --pool-size … --timeout …`).
#[derive(Clone, Debug)]
pub struct Common {
    /// Folder of the per-job buffers (their fast tiers and mount points).
    pub fast_dir: PathBuf,
    /// Size of the `tierstack` pool that SLURM accounts capacity= against, as given.
    pub pool_size: String,
    /// Bound on this hook's own waits, in seconds (SLURM's timeouts kill the hook too).
    pub timeout: u64,
    /// Limit each buffer's drain to the stage_out destination to this many MB/s.
    pub drain_rate: Option<f64>,
}

/// `--pool-size` in bytes; a bad size is a usage error.
fn pool_bytes(s: &str) -> Result<u64> {
    tierstack_common::parse_size(s).map_err(|e| SlurmError::Usage(format!("--pool-size: {e}")))
}

impl Common {
    /// The pool's size in bytes; a bad `--pool-size` is a usage error.
    pub fn pool_bytes(&self) -> Result<u64> {
        pool_bytes(&self.pool_size)
    }
}

#[cfg(test)]
mod tests;
