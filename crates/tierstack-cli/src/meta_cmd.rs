//! `tierstack bench meta` (the mdtest method) and its worker process.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tierstack_bench::meta;

#[derive(Args)]
pub struct BenchMetaArgs {
    /// The plain folder (e.g. on the parallel file system); with --mount, the mount's backing
    /// is a fresh subfolder of it.
    #[arg(long)]
    pub target: PathBuf,
    /// Worker processes.
    #[arg(long, default_value_t = 1)]
    pub procs: usize,
    /// Files per process.
    #[arg(long, default_value_t = 5000)]
    pub files: usize,
    /// Bytes written into each file at create and read back in the read phase.
    #[arg(long, default_value_t = 100)]
    pub bytes: usize,
    /// All processes in one shared directory (default: a directory each, mdtest's -u).
    #[arg(long)]
    pub shared: bool,
    /// Also run through a tierstack mount over a subfolder of --target (needs FUSE); prints
    /// mount / plain for each phase and the drain time.
    #[arg(long)]
    pub mount: bool,
    /// With --mount: also through the same mount with the interception client
    /// (`tierstack exec`, libtierstack_io.so) preloaded into the workers.
    #[arg(long, requires = "mount")]
    pub client: bool,
    /// Work folder for the mount point and its fast tier.
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,
    /// The mount's fsync guarantee (`tierstack mount --mode`).
    #[arg(long, value_parser = ["sync", "async"])]
    pub mode: Option<String>,
    /// The mount's transport (`tierstack mount --transport`; default: the mount's, auto).
    #[arg(long, value_parser = ["auto", "uring", "dev"])]
    pub transport: Option<String>,
    /// Seconds one target's four phases may take before the workers are stopped.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn bench(a: BenchMetaArgs) -> Result<()> {
    let cfg = meta::Config {
        exe: std::env::current_exe().context("cannot find the tierstack binary")?,
        procs: a.procs,
        files: a.files,
        bytes: a.bytes,
        shared: a.shared,
        target: a.target,
        mount: a.mount,
        dir: a.dir,
        mode: a.mode,
        transport: a.transport,
        client: a.client,
        timeout: std::time::Duration::from_secs(a.timeout.max(1)),
    };
    let cancel = crate::cancel_flag()?;
    let r = meta::run(&cfg, &cancel)?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", meta::render(&r));
    }
    Ok(())
}

/// Internal: one worker process of `bench meta`.
pub fn worker(spec: &str) -> Result<()> {
    let spec: meta::WorkerSpec = serde_json::from_str(spec).context("bad meta-worker spec")?;
    meta::run_worker(&spec, std::io::stdin().lock(), std::io::stdout().lock())
        .context("bench meta worker")?;
    Ok(())
}
