//! `tierstack bench checkpoint` (seed 004's Table 2) and its hidden writer processes.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tierstack_bench::checkpoint;

use crate::cancel_flag;

#[derive(Args)]
pub struct BenchCheckpointArgs {
    /// Writer processes (one file each).
    #[arg(long, default_value_t = 64)]
    pub procs: usize,
    /// Size of each process's file (K/M/G suffixes).
    #[arg(long, default_value = "16M")]
    pub file_size: String,
    /// The directory to write into (the parallel file system's). Required without
    /// --throttle; with it, an empty or new directory where the throttled file system is
    /// mounted (default: under --dir).
    #[arg(long)]
    pub backing: Option<PathBuf>,
    /// Model a congested parallel file system: BACKING becomes an ext4 on a loop device
    /// mounted -o sync whose writes are limited to this many MB/s (10^6 bytes) by a blkio
    /// cgroup holding the writers and the mount daemon. Needs root.
    #[arg(long)]
    pub throttle: Option<f64>,
    /// Folder for the work files (loop image, mount point, the mount's fast tier).
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,
    /// The mount's fsync guarantee (`tierstack mount --mode`). async (the default here): fsync
    /// returns when the data is in the store's DRAM, as with seed 004's RAM-disk staging
    /// layer; it survives a clean unmount and the drain, not a crash of the daemon. sync (the
    /// mount's own default): fsync returns when the data is durable on the fast tier's array.
    /// The mode is printed with the figures.
    #[arg(long, value_parser = ["sync", "async"], default_value = "async")]
    pub mode: String,
    /// The mount's DRAM budget (passed to `tierstack mount --dram`).
    #[arg(long)]
    pub dram: Option<String>,
    /// A VRAM tier of this size for the mount (passed to `tierstack mount --vram`; needs an
    /// NVIDIA GPU). Printed with the figures.
    #[arg(long)]
    pub vram: Option<String>,
    /// Only the run straight into BACKING (no mount).
    #[arg(long)]
    pub direct_only: bool,
    /// Runs of both ways; the table shows each and the mean.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Print the figures as one JSON object (direct_output_s, mount_output_s, drain_s,
    /// speedup, ...).
    #[arg(long)]
    pub json: bool,
}

/// `bench checkpoint`: writers straight into BACKING and through a mount, the output and drain times.
pub fn bench_checkpoint(a: BenchCheckpointArgs) -> Result<()> {
    let file_size = crate::size_flag("file-size", &a.file_size)?;
    if let Some(d) = &a.dram {
        crate::size_flag("dram", d)?;
    }
    if let Some(v) = &a.vram {
        crate::size_flag("vram", v)?;
    }
    let cfg = checkpoint::Config {
        exe: std::env::current_exe().context("cannot find the tierstack binary")?,
        procs: a.procs,
        file_size,
        backing: a.backing,
        dir: a.dir,
        throttle_mb_s: a.throttle,
        mode: Some(a.mode),
        dram: a.dram,
        vram: a.vram,
        direct_only: a.direct_only,
        repeat: a.repeat,
        narrate: None,
    };
    let cancel = cancel_flag()?;
    let r = checkpoint::run(&cfg, &cancel)?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", checkpoint::render(&r));
    }
    Ok(())
}

/// Internal: one writer process of `bench checkpoint`.
pub fn checkpoint_writer(spec: &str) -> Result<()> {
    let spec: checkpoint::WriterSpec =
        serde_json::from_str(spec).context("bad checkpoint-writer spec")?;
    checkpoint::run_writer(&spec, std::io::stdin().lock(), std::io::stdout().lock())?;
    Ok(())
}
