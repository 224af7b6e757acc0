//! `tierstack bench mem` (pmbench method) and its hidden worker.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Args;
use tierstack_bench::mem::{self, Pattern, WorkerSpec};
use tierstack_bench::{fmt_size, parse_size, plot};

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
    /// uniform, linear, zipf or butterfly (page pairs i, i + 2^k, k sweeping: FFT-like).
    #[arg(long, default_value = "uniform")]
    pattern: String,
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// tierstack (userfaultfd region over an array in --dir), tierstack-dram (the same region
    /// over a store that keeps every page in DRAM: the fault path without the disk; that DRAM
    /// is outside --dram), kernel-swap, or dram.
    #[arg(long, default_value = "kernel-swap")]
    engine: String,
    /// Folder for the swap file and tierstack's drives (the drive under test).
    #[arg(long, default_value = "/tmp")]
    dir: PathBuf,
    /// Run tierstack and kernel-swap back to back and print the ratio of accesses/s.
    #[arg(long)]
    compare: bool,
    /// With --compare: run both engines this many times, alternately, and report each
    /// engine's median run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    repeat: u32,
    /// Draw the read and write latency histograms of every engine that ran into this PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// With --plot: draw from saved `bench mem --json` output (a report or the --compare
    /// object) instead of running a benchmark; `-` reads standard input.
    #[arg(long, requires = "plot")]
    from_json: Option<PathBuf>,
    /// tierstack page size (unit of faulting and eviction): a multiple of 4K up to 1M; 4K, as
    /// `tierstack run`, by default.
    #[arg(long, default_value = "4K")]
    page: String,
    /// RAID level of the tierstack engine's four file drives. 5 by default: what `tierstack
    /// run --dir` makes (the engine uses run's own constructor and budget rule); 0 is like a
    /// swap file without redundancy (seed 000 swaps to an mdadm RAID 0).
    #[arg(long, default_value = "5")]
    level: String,
    /// Print one JSON object on stdout (with --compare: tierstack, kernel_swap, ratio).
    #[arg(long)]
    json: bool,
}

pub fn bench(a: BenchMemArgs) -> Result<()> {
    if let (Some(plot), Some(src)) = (&a.plot, &a.from_json) {
        return plot_saved(plot, src);
    }
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
    let page = parse_size(&a.page).map_err(anyhow::Error::msg)? as usize;
    if page == 0 || !page.is_multiple_of(4096) || page > (1 << 20) {
        bail!(
            "--page {} is not a multiple of 4K up to 1M: use e.g. --page 4K",
            a.page
        );
    }
    if let Some(p) = &a.plot {
        // Fail before a long run, not after it.
        plot::check_target(p).map_err(anyhow::Error::msg)?;
        plot::check_font().map_err(anyhow::Error::msg)?;
    }
    let level: tierstack_array::Level = a
        .level
        .parse()
        .map_err(|e| anyhow::anyhow!("--level: {e}"))?;
    if matches!(
        level,
        tierstack_array::Level::Raid50 | tierstack_array::Level::Raid60
    ) {
        bail!(
            "--level {} needs more than four drives: use 0, 1, 5, 6 or 10",
            a.level
        );
    }
    let note = format!("tierstack page {}, RAID {}", fmt_size(page as u64), level);
    let draw = |reports: &[mem::MemReport]| -> Result<()> {
        if let Some(p) = &a.plot {
            let ran_tierstack = reports.iter().any(|r| r.engine == "tierstack");
            plot::plot_mem(p, reports, ran_tierstack.then_some(note.as_str()))
                .map_err(anyhow::Error::msg)?;
            if !a.json {
                println!("plot: {}", p.display());
            }
        }
        Ok(())
    };
    let spec = WorkerSpec {
        map,
        threads: a.threads,
        read_ratio: ratio,
        pattern,
        seconds: a.seconds,
        cgroup_procs: None,
        tierstack: None,
    };
    let exe = std::env::current_exe()?;
    if a.compare {
        // Back to back, same workload, same folder for the swap file and the drives; with
        // --repeat, alternately, and each engine's median run is reported (this machine's
        // disk swings run to run).
        let repeat = a.repeat as usize;
        let mut ts = Vec::new();
        let mut ks = Vec::new();
        for i in 0..repeat {
            if repeat > 1 && !a.json {
                eprintln!("round {} of {repeat}", i + 1);
            }
            ts.push(
                mem::run_engine(&exe, "tierstack", &spec, dram, &a.dir, page, level)
                    .map_err(anyhow::Error::msg)?,
            );
            ks.push(
                mem::run_engine(&exe, "kernel-swap", &spec, dram, &a.dir, page, level)
                    .map_err(anyhow::Error::msg)?,
            );
        }
        let rounds: Vec<serde_json::Value> = ts
            .iter()
            .zip(&ks)
            .map(|(t, k)| serde_json::json!([t.accesses_per_s, k.accesses_per_s]))
            .collect();
        let t = median_run(ts);
        let k = median_run(ks);
        let ratio = if k.accesses_per_s > 0.0 {
            t.accesses_per_s / k.accesses_per_s
        } else {
            0.0
        };
        if a.json {
            println!(
                "{}",
                serde_json::json!({"tierstack": t, "kernel_swap": k, "ratio": ratio,
                    "repeat": repeat, "rounds_accesses_per_s": rounds})
            );
        } else {
            print!("{}{}", mem::render(&t), mem::render(&k));
            if repeat > 1 {
                println!("(median of {repeat} rounds each)");
            }
            println!("ratio (tierstack / kernel-swap accesses/s): {ratio:.2}");
        }
        return draw(&[t, k]);
    }
    let r = mem::run_engine(&exe, &a.engine, &spec, dram, &a.dir, page, level)
        .map_err(anyhow::Error::msg)?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", mem::render(&r));
    }
    draw(&[r])
}

/// The run with the median accesses/s (the lower middle one of an even count).
fn median_run(mut runs: Vec<mem::MemReport>) -> mem::MemReport {
    runs.sort_by(|a, b| a.accesses_per_s.total_cmp(&b.accesses_per_s));
    let mid = (runs.len() - 1) / 2;
    runs.swap_remove(mid)
}

/// `--plot FILE --from-json JSON`: redraws a plot from saved `--json` output.
fn plot_saved(plot: &Path, src: &Path) -> Result<()> {
    let text = if src == Path::new("-") {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| anyhow::anyhow!("cannot read standard input: {e}"))?;
        s
    } else {
        std::fs::read_to_string(src)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", src.display()))?
    };
    let reports =
        plot::reports_from_json(&text).map_err(|e| anyhow::anyhow!("{}: {e}", src.display()))?;
    plot::plot_mem(plot, &reports, None).map_err(anyhow::Error::msg)?;
    println!("plot: {}", plot.display());
    Ok(())
}

pub fn worker(spec: &str) -> Result<()> {
    let spec: WorkerSpec = serde_json::from_str(spec)?;
    let r = mem::run_worker(&spec).map_err(anyhow::Error::msg)?;
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}
