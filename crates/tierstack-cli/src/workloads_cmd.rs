//! `tierstack bench workloads`: real small-file programs (tar + git, pip + import, h5py,
//! MPI file-per-rank logs) in a plain folder and through a fresh mount at its defaults.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use tierstack_bench::workloads::{self, WorkloadsError, WORKLOADS};

#[derive(Args)]
pub struct BenchWorkloadsArgs {
    /// Scratch folder on the disk to test: made by the benchmark (it must not exist) and
    /// removed at the end; the plain folders and each mount's BACKING, mount point and fast
    /// tier go under it.
    #[arg(long)]
    pub dir: PathBuf,
    /// The workloads to run, comma-separated: tree, pip, h5py, mpi-logs (default: all; one
    /// whose tool is missing is skipped with a line naming the package).
    #[arg(long, value_delimiter = ',', default_values_t = WORKLOADS.map(String::from))]
    pub only: Vec<String>,
    /// Rounds; each runs every workload in the plain folder and through a mount (the order
    /// alternates); the table gives the median.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// tree: a tar of a source tree to unpack (default: one made at the start from
    /// /usr/lib/python3*, /usr/share/perl*, /usr/include, --tree-entries entries).
    #[arg(long)]
    pub tree_tar: Option<PathBuf>,
    /// tree: entries of the tar made at the start.
    #[arg(long, default_value_t = 8000)]
    pub tree_entries: usize,
    /// pip: a folder of wheels to install (e.g. filled by `pip download numpy requests -d
    /// DIR`; default: deterministic pure-Python wheels generated at the start).
    #[arg(long)]
    pub wheels: Option<PathBuf>,
    /// pip: generated wheels.
    #[arg(long, default_value_t = 4)]
    pub pip_wheels: usize,
    /// pip: modules in each generated wheel (in sub-packages of 10).
    #[arg(long, default_value_t = 60)]
    pub pip_modules: usize,
    /// h5py: small datasets (1-4 KiB) in the HDF5 file.
    #[arg(long, default_value_t = 2000)]
    pub h5_datasets: usize,
    /// mpi-logs: MPI ranks (mpirun --oversubscribe).
    #[arg(long, default_value_t = 4)]
    pub ranks: usize,
    /// mpi-logs: records of 100-200 bytes each rank appends.
    #[arg(long, default_value_t = 50_000)]
    pub log_lines: usize,
    /// mpi-logs: records between two fflush + fsync.
    #[arg(long, default_value_t = 500)]
    pub log_sync_every: usize,
    /// Seconds one workload program may take before it is stopped.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Seconds a mount's drain may take after a workload (past it the run goes on and the
    /// report says the drain did not finish).
    #[arg(long, default_value_t = 600)]
    pub drain_timeout: u64,
    /// The mount side's programs run under the interception client (`tierstack exec`,
    /// libtierstack_io.so) instead of through FUSE alone.
    #[arg(long)]
    pub client: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn bench(a: BenchWorkloadsArgs) -> Result<()> {
    let cfg = workloads::Config {
        exe: std::env::current_exe().context("cannot find the tierstack binary")?,
        dir: a.dir,
        only: a.only.iter().map(|s| s.trim().to_string()).collect(),
        repeat: a.repeat,
        tree_tar: a.tree_tar,
        tree_entries: a.tree_entries,
        wheels: a.wheels,
        pip_wheels: a.pip_wheels,
        pip_modules: a.pip_modules,
        h5_datasets: a.h5_datasets,
        ranks: a.ranks,
        log_lines: a.log_lines,
        log_sync_every: a.log_sync_every,
        timeout: Duration::from_secs(a.timeout.max(1)),
        drain_timeout: Duration::from_secs(a.drain_timeout.max(1)),
        client: a.client,
    };
    let cancel = crate::cancel_flag()?;
    let say = |m: &str| eprintln!("bench workloads: {m}");
    let r = match workloads::run(&cfg, &cancel, &say) {
        Ok(r) => r,
        Err(WorkloadsError::Usage(m)) => return Err(crate::usage(m)),
        Err(e) => return Err(e).context("bench workloads"),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", workloads::render(&r));
    }
    Ok(())
}
