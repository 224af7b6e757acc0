//! `tierstack bench io`: the IOR-style sweep of transfer size × MPI ranks (seed 001), on a
//! folder and through a tierstack mount over it in the same run.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use tierstack_bench::io;

#[derive(Args)]
pub struct BenchIoArgs {
    /// The plain folder to write into (e.g. on the parallel file system); with --mount, the
    /// mount's backing is a fresh subfolder of it.
    #[arg(long)]
    pub target: PathBuf,
    /// MPI rank counts of the sweep, comma-separated.
    #[arg(long, default_value = "2,4", value_delimiter = ',')]
    pub ranks: Vec<usize>,
    /// Transfer sizes of the sweep (IOR's -t), comma-separated, K/M/G suffixes.
    #[arg(long, default_value = "1M", value_delimiter = ',')]
    pub block: Vec<String>,
    /// Bytes each rank writes and reads back (IOR's -b); a multiple of every --block.
    #[arg(long, default_value = "64M")]
    pub size_per_rank: String,
    /// fsync each file before its close (IOR's -e).
    #[arg(long)]
    pub fsync: bool,
    /// One file per rank (the default; IOR's -F).
    #[arg(long, conflicts_with = "shared")]
    pub file_per_process: bool,
    /// One shared file, each rank writing its own segment.
    #[arg(long, alias = "shared-file")]
    pub shared: bool,
    /// Random transfer offsets within each rank's range (IOR's -z), e.g. with --block 4K.
    #[arg(long)]
    pub random: bool,
    /// Repetitions of each point (IOR's -i): max, min, mean and stddev over them.
    #[arg(long, default_value_t = 1)]
    pub reps: usize,
    /// Also run every point through a tierstack mount (made and unmounted by the benchmark;
    /// needs FUSE) whose backing is a subfolder of --target; prints mount / plain.
    #[arg(long)]
    pub mount: bool,
    /// With --mount: only the mount, no plain run.
    #[arg(long, requires = "mount")]
    pub mount_only: bool,
    /// Work folder for the rank program, the mount point and the mount's fast tier.
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,
    /// The mount's fsync guarantee (`tierstack mount --mode`).
    #[arg(long, value_parser = ["sync", "async"])]
    pub mode: Option<String>,
    /// The mount's transport (`tierstack mount --transport`; default: the mount's, auto).
    #[arg(long, value_parser = ["auto", "uring", "dev"])]
    pub transport: Option<String>,
    /// The mount's DRAM budget (`tierstack mount --dram`).
    #[arg(long)]
    pub dram: Option<String>,
    /// Check every byte read against what its writer wrote.
    #[arg(long)]
    pub verify: bool,
    /// Drop the file a rank is about to read from the page cache first (on one node the
    /// rank shift alone does not keep the reads off the page cache).
    #[arg(long)]
    pub drop_cache: bool,
    /// How the ranks start: mpirun, or srun (a job step of the SLURM allocation the benchmark
    /// runs in, `salloc` or `sbatch`; PMIx).
    #[arg(long, default_value = "mpirun")]
    pub launcher: String,
    /// Limit in seconds for one point (all its repetitions) before its ranks are stopped.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Print one JSON object: {"rows": [...], "host": ..., "drain_seconds": ..., ...}.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print one CSV line per row instead of the tables.
    #[arg(long)]
    pub csv: bool,
    /// Also draw the write and read heat maps (ranks x block, one panel per target) as PNG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

pub fn bench(a: BenchIoArgs) -> Result<()> {
    let blocks = a
        .block
        .iter()
        .map(|b| crate::size_flag("block", b))
        .collect::<Result<Vec<u64>>>()?;
    let size_per_rank = crate::size_flag("size-per-rank", &a.size_per_rank)?;
    if let Some(d) = &a.dram {
        crate::size_flag("dram", d)?;
    }
    if let Some(p) = &a.plot {
        // A missing font or folder fails now, not after the sweep.
        tierstack_bench::plot::check_font().map_err(anyhow::Error::msg)?;
        tierstack_bench::plot::check_target(p).map_err(anyhow::Error::msg)?;
    }
    if a.timeout == 0 {
        usage_bail!("--timeout 0 is out of range: give seconds, e.g. --timeout 600");
    }
    let cfg = io::Config {
        exe: std::env::current_exe()
            .map_err(|e| anyhow::anyhow!("cannot find the tierstack binary: {e}"))?,
        ranks: a.ranks,
        blocks,
        size_per_rank,
        fsync: a.fsync,
        shared: a.shared,
        random: a.random,
        reps: a.reps,
        target: a.target,
        mount: a.mount,
        mount_only: a.mount_only,
        dir: a.dir,
        mode: a.mode,
        transport: a.transport,
        dram: a.dram,
        verify: a.verify,
        drop_cache: a.drop_cache,
        timeout: Duration::from_secs(a.timeout),
        launcher: a.launcher.parse().map_err(anyhow::Error::new)?,
    };
    let cancel = crate::cancel_flag()?;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        // indicatif's own bar characters.
        crate::bar_style("{bar:30} {pos}/{len} runs  {msg}", "█░"),
    );
    let progress = |done: usize, total: usize, msg: &str| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(msg.to_string());
    };
    let r = io::run(&cfg, &cancel, &progress);
    bar.finish_and_clear();
    let r = r?;
    if let Some(p) = &a.plot {
        io::plot_io(p, &r).map_err(anyhow::Error::msg)?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else if a.csv {
        print!("{}", io::render_csv(&r));
    } else {
        print!("{}", io::render(&r));
    }
    Ok(())
}
