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
    /// What each page holds: one-word (one word per page, pmbench's way), random (does not
    /// compress) or floats (a smooth field of doubles, as a simulation's state).
    #[arg(long, default_value = "one-word")]
    fill: String,
    /// With --compare: do not run kernel swap with zswap (by default it runs where the host
    /// lets the switch be set).
    #[arg(long)]
    no_zswap: bool,
    /// With --compare: run the engines this many times, alternately, and report each
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
    #[arg(long, default_value = tierstack_mem::setup::DEFAULT_PAGE_ARG)]
    page: String,
    /// RAID level of the tierstack engine's four file drives. 5 by default: what `tierstack
    /// run --dir` makes (the engine uses run's own constructor and budget rule); 0 is like a
    /// swap file without redundancy (seed 000 swaps to an mdadm RAID 0).
    #[arg(long, default_value = "5")]
    level: String,
    /// A VRAM tier of this size on GPU --gpu between the tierstack engine's DRAM and its
    /// array, as `tierstack run --vram` makes (outside --dram). Default: none.
    #[arg(long)]
    vram: Option<String>,
    /// The GPU of --vram (0 is the first).
    #[arg(long, default_value_t = 0, requires = "vram")]
    gpu: u32,
    /// No compressed tier in the tierstack engine (as `tierstack run --no-compress`).
    #[arg(long)]
    no_compress: bool,
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
    // Ctrl-C and SIGTERM stop the run and put back the swap file, cgroup and zswap switch.
    mem::cancel_on(crate::stage_cmd::cancel_flag()?);
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
    let vram = match &a.vram {
        Some(v) => {
            let bytes = parse_size(v).map_err(|e| anyhow::anyhow!("--vram: {e}"))?;
            crate::mount_cmd::check_gpu("--vram", a.gpu, bytes)?;
            Some(tierstack_mem::setup::Vram { gpu: a.gpu, bytes })
        }
        None => None,
    };
    let mut note = format!("tierstack page {}, RAID {}", fmt_size(page as u64), level);
    if a.no_compress {
        note.push_str(", no compressed tier");
    }
    if let Some(v) = vram {
        note.push_str(&format!(
            ", VRAM tier {} on GPU {}",
            fmt_size(v.bytes),
            v.gpu
        ));
    }
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
        fill: a.fill.parse().map_err(anyhow::Error::msg)?,
        vram,
        no_compress: a.no_compress,
    };
    let exe = std::env::current_exe()?;
    if a.compare {
        // Back to back, same workload, same folder for the swap file and the drives; with
        // --repeat, alternately, and each engine's median run is reported (this machine's
        // disk swings run to run).
        let repeat = a.repeat as usize;
        // Kernel swap with zswap too, where the host has it (set for the run, restored after).
        let zswap = if a.no_zswap { None } else { Zswap::find() };
        let mut zswap_error: Option<String> = None;
        let mut ts = Vec::new();
        let mut ks = Vec::new();
        let mut zs = Vec::new();
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
            if let (Some(z), None) = (&zswap, &zswap_error) {
                let r = z.with_enabled(|| {
                    mem::run_engine(&exe, "kernel-swap", &spec, dram, &a.dir, page, level)
                });
                // A peer that fails is reported, not the end of the comparison (a cancel is).
                match r {
                    Ok(mut r) => {
                        r.engine = "kernel-swap-zswap".into();
                        zs.push(r);
                    }
                    Err(e @ tierstack_bench::BenchError::Cancelled) => {
                        return Err(anyhow::Error::msg(e))
                    }
                    Err(e) => zswap_error = Some(e.to_string()),
                }
            }
        }
        let rounds: Vec<serde_json::Value> = ts
            .iter()
            .zip(&ks)
            .enumerate()
            .map(|(i, (t, k))| match zs.get(i) {
                Some(z) => {
                    serde_json::json!([t.accesses_per_s, k.accesses_per_s, z.accesses_per_s])
                }
                None => serde_json::json!([t.accesses_per_s, k.accesses_per_s]),
            })
            .collect();
        let t = median_run(ts);
        let k = median_run(ks);
        let z = (!zs.is_empty() && zswap_error.is_none()).then(|| median_run(zs));
        let ratio_of = |o: &mem::MemReport| {
            if o.accesses_per_s > 0.0 {
                t.accesses_per_s / o.accesses_per_s
            } else {
                0.0
            }
        };
        let ratio = ratio_of(&k);
        let ratio_zswap = z.as_ref().map(ratio_of);
        if a.json {
            println!(
                "{}",
                serde_json::json!({"tierstack": t, "kernel_swap": k, "ratio": ratio,
                    "kernel_swap_zswap": z, "ratio_zswap": ratio_zswap,
                    "zswap_error": zswap_error,
                    "fill": a.fill, "repeat": repeat, "rounds_accesses_per_s": rounds})
            );
        } else {
            print!("{}{}", mem::render(&t), mem::render(&k));
            if let Some(z) = &z {
                print!("{}", mem::render(z));
            }
            if repeat > 1 {
                println!("(median of {repeat} rounds each)");
            }
            println!("ratio (tierstack / kernel-swap accesses/s): {ratio:.2}");
            match (ratio_zswap, &zswap_error) {
                (Some(rz), _) => println!("ratio (tierstack / kernel-swap with zswap): {rz:.2}"),
                (None, Some(e)) => println!("kernel swap with zswap: failed: {e}"),
                (None, None) if a.no_zswap => println!("kernel swap with zswap: not run (--no-zswap)"),
                (None, None) => println!(
                    "kernel swap with zswap: not run (no writable /sys/module/zswap/parameters/enabled)"
                ),
            }
        }
        let mut all = vec![t, k];
        all.extend(z);
        return draw(&all);
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

/// The host's zswap switch, when it can be set.
struct Zswap {
    path: PathBuf,
}

impl Zswap {
    fn find() -> Option<Zswap> {
        let path = PathBuf::from("/sys/module/zswap/parameters/enabled");
        let now = std::fs::read_to_string(&path).ok()?;
        // Writable: writing the value it has changes nothing.
        std::fs::write(&path, now.trim()).ok()?;
        Some(Zswap { path })
    }

    /// Runs `f` with zswap enabled, then puts the switch back as it was.
    fn with_enabled<T>(&self, f: impl FnOnce() -> T) -> T {
        let before = std::fs::read_to_string(&self.path).unwrap_or_else(|_| "N".into());
        let _ = std::fs::write(&self.path, "Y");
        let r = f();
        let _ = std::fs::write(&self.path, before.trim());
        r
    }
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
