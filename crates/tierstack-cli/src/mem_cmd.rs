//! `tierstack bench mem` (pmbench method) and its hidden worker.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use tierstack_bench::mem::{self, Pattern, WorkerSpec};
use tierstack_bench::parse_size;

#[derive(Args)]
pub struct BenchMemArgs {
    /// Bytes the measured program maps and touches.
    #[arg(long, default_value = "1536M")]
    map: String,
    /// DRAM budget (the memory cgroup limit for kernel-swap).
    #[arg(long, default_value = "512M")]
    dram: String,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Share of reads: 0 to 1, or a percentage (50 = half).
    #[arg(long, default_value_t = 0.5)]
    read_ratio: f64,
    /// uniform, linear or zipf.
    #[arg(long, default_value = "uniform")]
    pattern: String,
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// kernel-swap, dram, or tierstack (not built yet).
    #[arg(long, default_value = "kernel-swap")]
    engine: String,
    /// Folder for the swap file (the drive under test).
    #[arg(long, default_value = "/tmp")]
    dir: PathBuf,
    /// Run tierstack and kernel-swap back to back (needs the tierstack engine).
    #[arg(long)]
    compare: bool,
    /// Draw both histograms into a PNG (not built yet).
    #[arg(long)]
    plot: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn bench(a: BenchMemArgs) -> Result<()> {
    let map = parse_size(&a.map).map_err(anyhow::Error::msg)?;
    let dram = parse_size(&a.dram).map_err(anyhow::Error::msg)?;
    if map < 4096 {
        bail!(
            "--map {} is smaller than one 4 KiB page: use e.g. --map 1536M",
            a.map
        );
    }
    if dram == 0 {
        bail!("--dram must be above 0: use e.g. --dram 512M");
    }
    if a.threads == 0 || a.threads > 1024 {
        bail!("--threads {} is out of range: use 1 to 1024", a.threads);
    }
    let ratio = if a.read_ratio > 1.0 {
        a.read_ratio / 100.0
    } else {
        a.read_ratio
    };
    if !(0.0..=1.0).contains(&ratio) || ratio.is_nan() {
        bail!(
            "--read-ratio {} is out of range: use 0 to 1 or 0 to 100",
            a.read_ratio
        );
    }
    if !(a.seconds > 0.0 && a.seconds <= 86_400.0) {
        bail!(
            "--seconds {} is out of range: use a positive number of seconds",
            a.seconds
        );
    }
    let pattern: Pattern = a.pattern.parse().map_err(anyhow::Error::msg)?;
    if a.compare {
        bail!("--compare needs the tierstack engine (userfaultfd memory front), which is not built yet (issue 3): run --engine kernel-swap and --engine dram separately");
    }
    if a.plot.is_some() {
        bail!("--plot is not built yet: use --json and plot the bands yourself");
    }
    let spec = WorkerSpec {
        map,
        threads: a.threads,
        read_ratio: ratio,
        pattern,
        seconds: a.seconds,
        cgroup_procs: None,
    };
    let exe = std::env::current_exe()?;
    let r = mem::run_engine(&exe, &a.engine, &spec, dram, &a.dir).map_err(anyhow::Error::msg)?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", mem::render(&r));
    }
    Ok(())
}

pub fn worker(spec: &str) -> Result<()> {
    let spec: WorkerSpec = serde_json::from_str(spec)?;
    let r = mem::run_worker(&spec).map_err(anyhow::Error::msg)?;
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}
