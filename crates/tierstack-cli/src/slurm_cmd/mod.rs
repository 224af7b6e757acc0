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
//!   for `#BB_LUA node_local=SIZE` (node.rs).
//!
//! Hooks run as SlurmUser (root); everything that touches the job's files runs in a child
//! process with the job's uid, gid and groups.
//!
//! The parts, by job: this file holds the subcommands and their dispatch; `directives.rs`
//! parses the `#BB_LUA` directives of a job script; `state.rs` keeps each job's state file
//! and answers the status queries; `creds.rs` runs work as the job's user (uid, gid, groups)
//! with a time bound; `hooks.rs` holds the job's hooks (setup, data in, pre/post run, data
//! out, teardown); `install.rs` installs and removes the Slurm plugin files; `node.rs` holds the
//! node-local mode (Prolog/Epilog).

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};
use creds::{user_check, user_clean};
use hooks::{data_in, data_out, job_process, paths, post_run, pre_run, setup, teardown};
use install::{install, uninstall};
use node::{epilog, node_drain, prolog};
use state::{get_status, pools};

mod creds;
mod directives;
mod hooks;
mod install;
mod node;
mod state;

/// The pool name that job scripts must give with `capacity=`.
pub const POOL: &str = "tierstack";

/// Pool granularity reported to SLURM. Measured on 22.05: with a granularity above 1 SLURM no
/// longer holds jobs back when `quantity` bytes are taken (two 1500M jobs ran at once in a 2G
/// pool with 1 MiB granularity), so quantity and capacity are plain bytes.
const GRANULARITY: u64 = 1;

/// First line of every file `install` writes: `uninstall` removes only files that carry it.
const MARKER: &str = "tierstack slurm install";

const LUA_TEMPLATE: &str = include_str!("../../../../contrib/slurm/burst_buffer.lua");

const CONF_TEMPLATE: &str = include_str!("../../../../contrib/slurm/burst_buffer.conf");

const JOB_SUBMIT_TEMPLATE: &str = include_str!("../../../../contrib/slurm/job_submit.lua");

const PROLOG_TEMPLATE: &str = include_str!("../../../../contrib/slurm/prolog.sh");

const EPILOG_TEMPLATE: &str = include_str!("../../../../contrib/slurm/epilog.sh");

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
    /// Limit each buffer's drain to the stage_out destination to this many MB/s
    /// (`tierstack mount --drain-rate`; default unlimited).
    #[arg(long, value_name = "MB/s")]
    pub drain_rate: Option<f64>,
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
        /// Limit each buffer's drain to this many MB/s (spares the parallel file system).
        #[arg(long, value_name = "MB/s")]
        drain_rate: Option<f64>,
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
    /// SLURM Prolog (root, on each compute node): makes the node-local buffer of a job with
    /// `#BB_LUA node_local=SIZE` and stages its inputs in. Reads SLURM_JOB_ID, SLURM_JOB_UID
    /// and SLURM_JOB_GID.
    Prolog {
        #[command(flatten)]
        common: Common,
    },
    /// SLURM Epilog (root, on each compute node): drains the job's node-local buffer to its
    /// stage_out destination in the background (the node is released at once) and removes
    /// it; resumes drains that were interrupted.
    Epilog {
        /// Drain before returning (the node stays busy until the data is out).
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Internal: the Epilog's background drain of one job's node-local buffer.
    #[command(hide = true)]
    NodeDrain {
        job_id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Internal: removes a cut-short drain's temporary files, run as the job's user.
    #[command(hide = true)]
    UserClean { dir: PathBuf },
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
            drain_rate,
        } => install(&install::Settings {
            conf: &conf_dir,
            fast: &fast_dir,
            pool: &pool_size,
            stage_timeout,
            other_timeout,
            drain_rate,
        }),
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
            script,
            path_file,
            common,
        } => paths(&job_id, &script, &path_file, &common),
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
        SlurmCmd::Prolog { common } => prolog(&common),
        SlurmCmd::Epilog { wait, common } => epilog(&common, wait),
        SlurmCmd::NodeDrain { job_id, common } => node_drain(&job_id, &common),
        SlurmCmd::UserCheck { read, write } => user_check(&read, &write),
        SlurmCmd::UserClean { dir } => user_clean(&dir),
    }
}
