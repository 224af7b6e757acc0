//! `tierstack slurm`: the command line of the SLURM integration; the hooks themselves are
//! in the tierstack-slurm crate.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};
use tierstack_slurm::{
    data_in, data_out, epilog, get_status, install, job_process, node_drain, paths, pools,
    post_run, pre_run, prolog, setup, task_prolog, teardown, uninstall, user_check, user_clean,
    InstallSettings, SlurmError,
};

#[derive(Args, Clone)]
pub struct CommonArgs {
    /// Folder of the per-job buffers (their fast tiers and mount points).
    #[arg(long, default_value = "/var/tmp/tierstack-slurm")]
    pub fast_dir: PathBuf,
    /// Size of the `tierstack` pool that SLURM accounts capacity= against.
    #[arg(long, default_value = "2G")]
    pub pool_size: String,
    /// Bound on this hook's own waits (`90s`, `1h`, or seconds; SLURM's timeouts kill the
    /// hook too).
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    pub timeout: String,
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
        /// StageInTimeout and StageOutTimeout written to burst_buffer.conf (`1h`, `90m`, or
        /// seconds).
        #[arg(long, value_name = "DURATION", default_value = "1h")]
        stage_timeout: String,
        /// OtherTimeout written to burst_buffer.conf (`5m`, or seconds).
        #[arg(long, value_name = "DURATION", default_value = "5m")]
        other_timeout: String,
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
        common: CommonArgs,
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
        common: CommonArgs,
    },
    /// Hook: stage the job's inputs into its buffer, as the job's user.
    DataIn {
        job_id: String,
        script: PathBuf,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Hook: write TIERSTACK_DIR=... into SLURM's path file (the job's environment).
    Paths {
        job_id: String,
        script: PathBuf,
        path_file: PathBuf,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Hook: check that the job's mount is up before the job starts.
    PreRun {
        job_id: String,
        script: PathBuf,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Hook: the job ended; start the drain of its buffer.
    PostRun {
        job_id: String,
        script: PathBuf,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Hook: drain the buffer to the stage_out destinations and unmount it.
    DataOut {
        job_id: String,
        script: PathBuf,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Hook: remove the job's buffer (`true` after scancel).
    Teardown {
        job_id: String,
        script: PathBuf,
        #[arg(default_value = "false")]
        hurry: String,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Hook: the `tierstack` pool as SLURM's JSON.
    Pools {
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Hook: `scontrol show bbstat`: capacity used/free and each job's state.
    GetStatus {
        args: Vec<String>,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// SLURM Prolog (root, on each compute node): makes the node-local buffer of a job with
    /// `#BB_LUA node_local=SIZE` and stages its inputs in. Reads SLURM_JOB_ID, SLURM_JOB_UID
    /// and SLURM_JOB_GID.
    Prolog {
        #[command(flatten)]
        common: CommonArgs,
    },
    /// SLURM Epilog (root, on each compute node): drains the job's node-local buffer to its
    /// stage_out destination in the background (the node is released at once) and removes
    /// it; resumes drains that were interrupted.
    Epilog {
        /// Drain before returning (the node stays busy until the data is out).
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// SLURM TaskProlog (as the job's user, before each task): prints the `export` lines that
    /// preload the interception client (`libtierstack_io.so`) for the job's buffer
    /// (`$TIERSTACK_DIR`), unless the job has `#BB_LUA io=off` or `TIERSTACK_IO_OFF=1`. Never
    /// fails: problems go to stderr and the task runs without the client.
    #[command(hide = true)]
    TaskProlog,
    /// Internal: the Epilog's background drain of one job's node-local buffer.
    #[command(hide = true)]
    NodeDrain {
        job_id: String,
        #[command(flatten)]
        common: CommonArgs,
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

impl CommonArgs {
    fn settings(&self) -> tierstack_slurm::Result<tierstack_slurm::Common> {
        Ok(tierstack_slurm::Common {
            fast_dir: self.fast_dir.clone(),
            pool_size: self.pool_size.clone(),
            timeout: seconds("timeout", &self.timeout)?,
            drain_rate: self.drain_rate,
        })
    }
}

/// `--FLAG`'s duration in whole seconds (rounded up: SLURM's timeouts are seconds), or a
/// usage error naming the flag.
fn seconds(flag: &str, s: &str) -> tierstack_slurm::Result<u64> {
    let d = tierstack_common::parse_duration(s)
        .map_err(|e| SlurmError::Usage(format!("--{flag}: {e}")))?;
    Ok(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// A usage error (a bad size) leaves with exit status 2, as every other usage error does.
pub fn run(c: SlurmCmd) -> Result<()> {
    hook(c).map_err(|e| match e {
        SlurmError::Usage(m) => crate::usage(m),
        e => anyhow::Error::new(e),
    })
}

fn hook(c: SlurmCmd) -> tierstack_slurm::Result<()> {
    match c {
        SlurmCmd::Install {
            conf_dir,
            fast_dir,
            pool_size,
            stage_timeout,
            other_timeout,
            drain_rate,
        } => install(&InstallSettings {
            conf: &conf_dir,
            fast: &fast_dir,
            pool: &pool_size,
            stage_timeout: seconds("stage-timeout", &stage_timeout)?,
            other_timeout: seconds("other-timeout", &other_timeout)?,
            drain_rate,
        }),
        SlurmCmd::Uninstall { conf_dir } => uninstall(&conf_dir),
        SlurmCmd::JobProcess {
            script,
            uid,
            gid,
            common,
        } => job_process(&script, uid, gid, &common.settings()?),
        SlurmCmd::Setup {
            job_id,
            uid,
            gid,
            pool,
            size,
            script,
            common,
        } => setup(
            &job_id,
            uid,
            gid,
            &pool,
            &size,
            &script,
            &common.settings()?,
        ),
        SlurmCmd::DataIn {
            job_id,
            script: _,
            common,
        } => data_in(&job_id, &common.settings()?),
        SlurmCmd::Paths {
            job_id,
            script,
            path_file,
            common,
        } => paths(&job_id, &script, &path_file, &common.settings()?),
        SlurmCmd::PreRun { job_id, common, .. } => pre_run(&job_id, &common.settings()?),
        SlurmCmd::PostRun { job_id, common, .. } => post_run(&job_id, &common.settings()?),
        SlurmCmd::DataOut { job_id, common, .. } => data_out(&job_id, &common.settings()?),
        SlurmCmd::Teardown {
            job_id,
            hurry,
            common,
            ..
        } => teardown(&job_id, hurry == "true", &common.settings()?),
        SlurmCmd::Pools { common } => pools(&common.settings()?),
        SlurmCmd::GetStatus { args: _, common } => get_status(&common.settings()?),
        SlurmCmd::Prolog { common } => prolog(&common.settings()?),
        SlurmCmd::Epilog { wait, common } => epilog(&common.settings()?, wait),
        SlurmCmd::TaskProlog => {
            task_prolog(|| crate::exec_cmd::io_lib().map_err(|e| e.to_string()));
            Ok(())
        }
        SlurmCmd::NodeDrain { job_id, common } => node_drain(&job_id, &common.settings()?),
        SlurmCmd::UserCheck { read, write } => user_check(&read, &write),
        SlurmCmd::UserClean { dir } => user_clean(&dir),
    }
}
