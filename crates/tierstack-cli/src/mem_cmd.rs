//! `tierstack bench mem` (pmbench method) and its hidden worker.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use tierstack_bench::mem::{self, Pattern, WorkerSpec};
use tierstack_bench::{fmt_size, parse_size, plot};

#[derive(Args)]
pub struct BenchMemArgs {
    /// Bytes the measured program maps and touches.
    #[arg(long, default_value = "1536M", conflicts_with = "cmd")]
    map: String,
    /// DRAM budget (the memory cgroup limit for kernel-swap).
    #[arg(long, default_value = "512M")]
    dram: String,
    #[arg(long, default_value_t = 1, conflicts_with = "cmd")]
    threads: usize,
    /// Share of reads: 0 to 1, or a percentage (50 = half).
    #[arg(long, default_value_t = 0.5, conflicts_with = "cmd")]
    read_ratio: f64,
    /// uniform, linear, zipf or butterfly (page pairs i, i + 2^k, k sweeping: FFT-like).
    #[arg(long, default_value = "uniform", conflicts_with = "cmd")]
    pattern: String,
    #[arg(long, default_value_t = 10.0, conflicts_with = "cmd")]
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
    #[arg(long, default_value = "one-word", conflicts_with = "cmd")]
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
    #[arg(long, conflicts_with = "cmd")]
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
    #[arg(long, default_value = "5", conflicts_with = "cmd")]
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
    /// With a program: size of kernel swap's swap file in --dir (written out: swap files may
    /// not have holes); it must hold what the program pages out.
    #[arg(long, default_value = "4G", requires = "cmd")]
    swap: String,
    /// With a program: the most one run may take, in seconds; the program is stopped after
    /// it (a line every 30 s says how long it has run).
    #[arg(long, default_value_t = 3600, requires = "cmd", value_parser = clap::value_parser!(u64).range(1..=604_800))]
    timeout: u64,
    /// Your own program instead of the synthetic workload: timed under `tierstack run --dram
    /// D --dir DIR` at run's defaults and under kernel swap (plain and with zswap) given the
    /// same memory (the program's peak RSS under tierstack), e.g. `tierstack bench mem
    /// --compare --dram 48M -- python3 sim.py`.
    #[arg(last = true, value_name = "CMD")]
    cmd: Vec<OsString>,
}

pub fn bench(a: BenchMemArgs) -> Result<()> {
    if let (Some(plot), Some(src)) = (&a.plot, &a.from_json) {
        return plot_saved(plot, src);
    }
    let map = crate::size_flag("map", &a.map)?;
    let dram = crate::size_flag("dram", &a.dram)?;
    // Ctrl-C and SIGTERM stop the run and put back the swap file, cgroup and zswap switch.
    mem::cancel_on(crate::cancel_flag()?);
    if !a.cmd.is_empty() {
        return bench_program(&a, dram);
    }
    let run = Synthetic::from_args(&a, map, dram)?;
    let exe = std::env::current_exe()?;
    if a.compare {
        return bench_compare(&a, &run, &exe);
    }
    let r = run
        .run(&exe, &a.engine, &a.dir)
        .map_err(anyhow::Error::msg)?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", mem::render(&r));
    }
    run.draw(&a, &[r])
}

/// The synthetic workload of `bench mem` and the tierstack engine's settings, validated.
struct Synthetic {
    spec: WorkerSpec,
    dram: u64,
    page: usize,
    level: tierstack_array::Level,
    /// The tierstack engine's settings, as the plot names them.
    note: String,
}

impl Synthetic {
    /// Checks the synthetic workload's flags and builds its worker spec, before any run.
    fn from_args(a: &BenchMemArgs, map: u64, dram: u64) -> Result<Synthetic> {
        let (ratio, pattern, page) = check_workload(a, map, dram)?;
        if let Some(p) = &a.plot {
            // Fail before a long run, not after it.
            plot::check_target(p).map_err(anyhow::Error::msg)?;
            plot::check_font().map_err(anyhow::Error::msg)?;
        }
        let level = tierstack_level(a)?;
        let vram = vram_tier(a)?;
        let note = engine_note(page, level, a.no_compress, vram);
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
        Ok(Synthetic {
            spec,
            dram,
            page,
            level,
            note,
        })
    }

    /// Runs the workload once under `engine`.
    fn run(
        &self,
        exe: &Path,
        engine: &str,
        dir: &Path,
    ) -> Result<mem::MemReport, tierstack_bench::BenchError> {
        mem::run_engine(
            exe, engine, &self.spec, self.dram, dir, self.page, self.level,
        )
    }

    /// Draws `--plot` from the reports of the engines that ran, when it was asked for.
    fn draw(&self, a: &BenchMemArgs, reports: &[mem::MemReport]) -> Result<()> {
        if let Some(p) = &a.plot {
            let ran_tierstack = reports.iter().any(|r| r.engine == "tierstack");
            plot::plot_mem(p, reports, ran_tierstack.then_some(self.note.as_str()))
                .map_err(anyhow::Error::msg)?;
            if !a.json {
                println!("plot: {}", p.display());
            }
        }
        Ok(())
    }
}

/// Checks --map, --dram, --threads, --read-ratio, --seconds, --pattern and --page; returns
/// the read ratio, the pattern and the page size.
fn check_workload(a: &BenchMemArgs, map: u64, dram: u64) -> Result<(f64, Pattern, usize)> {
    if map < 4096 {
        usage_bail!(
            "--map {} is smaller than one 4 KiB page: use e.g. --map 1536M",
            a.map
        );
    }
    if dram == 0 {
        usage_bail!("--dram must be above 0: use e.g. --dram 512M");
    }
    if a.threads == 0 || a.threads > 1024 {
        usage_bail!("--threads {} is out of range: use 1 to 1024", a.threads);
    }
    let ratio = if a.read_ratio > 1.0 {
        a.read_ratio / 100.0
    } else {
        a.read_ratio
    };
    if !(0.0..=1.0).contains(&ratio) || ratio.is_nan() {
        usage_bail!(
            "--read-ratio {} is out of range: use 0 to 1 or 0 to 100",
            a.read_ratio
        );
    }
    if !(a.seconds > 0.0 && a.seconds <= 86_400.0) {
        usage_bail!(
            "--seconds {} is out of range: use a positive number of seconds",
            a.seconds
        );
    }
    let pattern: Pattern = a.pattern.parse().map_err(anyhow::Error::msg)?;
    let page = crate::size_flag("page", &a.page)? as usize;
    if page == 0 || !page.is_multiple_of(4096) || page > (1 << 20) {
        usage_bail!(
            "--page {} is not a multiple of 4K up to 1M: use e.g. --page 4K",
            a.page
        );
    }
    Ok((ratio, pattern, page))
}

/// The tierstack engine's RAID level (--level): one its four drives can make.
fn tierstack_level(a: &BenchMemArgs) -> Result<tierstack_array::Level> {
    let level: tierstack_array::Level = a
        .level
        .parse()
        .map_err(|e| anyhow::anyhow!("--level: {e}"))?;
    if matches!(
        level,
        tierstack_array::Level::Raid50 | tierstack_array::Level::Raid60
    ) {
        usage_bail!(
            "--level {} needs more than four drives: use 0, 1, 5, 6 or 10",
            a.level
        );
    }
    Ok(level)
}

/// The VRAM tier of --vram and --gpu, checked against the GPU; none without --vram.
fn vram_tier(a: &BenchMemArgs) -> Result<Option<tierstack_mem::setup::Vram>> {
    Ok(match &a.vram {
        Some(v) => {
            let bytes = crate::size_flag("vram", v)?;
            crate::mount_cmd::check_gpu("--vram", a.gpu, bytes)?;
            Some(tierstack_mem::setup::Vram { gpu: a.gpu, bytes })
        }
        None => None,
    })
}

/// The tierstack engine's settings in words (page, RAID level, tiers), for the plot.
fn engine_note(
    page: usize,
    level: tierstack_array::Level,
    no_compress: bool,
    vram: Option<tierstack_mem::setup::Vram>,
) -> String {
    let mut note = format!("tierstack page {}, RAID {}", fmt_size(page as u64), level);
    if no_compress {
        note.push_str(", no compressed tier");
    }
    if let Some(v) = vram {
        note.push_str(&format!(
            ", VRAM tier {} on GPU {}",
            fmt_size(v.bytes),
            v.gpu
        ));
    }
    note
}

/// The runs of `bench mem --compare`, each engine's in round order.
struct MemRuns {
    tierstack: Vec<mem::MemReport>,
    kernel: Vec<mem::MemReport>,
    zswap: Vec<mem::MemReport>,
    /// Why kernel swap with zswap failed (it is not run again after).
    zswap_error: Option<String>,
}

/// Runs tierstack, kernel swap and (where the host has it) kernel swap with zswap, `repeat`
/// times alternately.
fn compare_rounds(a: &BenchMemArgs, run: &Synthetic, exe: &Path, repeat: usize) -> Result<MemRuns> {
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
            run.run(exe, "tierstack", &a.dir)
                .map_err(anyhow::Error::msg)?,
        );
        ks.push(
            run.run(exe, "kernel-swap", &a.dir)
                .map_err(anyhow::Error::msg)?,
        );
        if let (Some(z), None) = (&zswap, &zswap_error) {
            let r = z.with_enabled(|| run.run(exe, "kernel-swap", &a.dir));
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
    Ok(MemRuns {
        tierstack: ts,
        kernel: ks,
        zswap: zs,
        zswap_error,
    })
}

/// `bench mem --compare`: tierstack against kernel swap (and with zswap), reported and plotted.
fn bench_compare(a: &BenchMemArgs, run: &Synthetic, exe: &Path) -> Result<()> {
    // Back to back, same workload, same folder for the swap file and the drives; with
    // --repeat, alternately, and each engine's median run is reported (this machine's
    // disk swings run to run).
    let repeat = a.repeat as usize;
    let MemRuns {
        tierstack: ts,
        kernel: ks,
        zswap: zs,
        zswap_error,
    } = compare_rounds(a, run, exe, repeat)?;
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
    let median_run = |runs| {
        tierstack_bench::median_by(runs, |r: &mem::MemReport| r.accesses_per_s)
            .ok_or_else(|| anyhow::anyhow!("no run"))
    };
    let t = median_run(ts)?;
    let k = median_run(ks)?;
    let z = if zswap_error.is_none() {
        median_run(zs).ok()
    } else {
        None
    };
    let ratio_of = |o: &mem::MemReport| {
        if o.accesses_per_s > 0.0 {
            t.accesses_per_s / o.accesses_per_s
        } else {
            0.0
        }
    };
    let ratio = ratio_of(&k);
    let ratio_zswap = z.as_ref().map(ratio_of);
    // zswap held the same memory only if its pool fit under what its limit gave up (a pool of
    // incompressible pages can outgrow the memory itself: the limit stops at a quarter).
    let zswap_equal = z
        .as_ref()
        .map(|z| z.peak_rss_bytes + z.zswap_pool_bytes <= z.dram_bytes + z.dram_bytes / 20);
    if a.json {
        println!(
            "{}",
            serde_json::json!({"tierstack": t, "kernel_swap": k, "ratio": ratio,
                "kernel_swap_zswap": z, "ratio_zswap": ratio_zswap,
                "zswap_equal_memory": zswap_equal,
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
        println!(
            "{}",
            zswap_line(
                ratio_zswap,
                &zswap_error,
                a.no_zswap,
                "tierstack / kernel-swap with zswap"
            )
        );
        if let (Some(false), Some(z)) = (zswap_equal, &z) {
            println!(
                "kernel swap with zswap held more memory than it was given: peak RSS {} + pool {} (cgroup v1 does not charge the pool; its limit was lowered down to a quarter): not an equal-memory comparison",
                fmt_size(z.peak_rss_bytes),
                fmt_size(z.zswap_pool_bytes)
            );
        }
    }
    let mut all = vec![t, k];
    all.extend(z);
    run.draw(a, &all)
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

/// The comparison's line about kernel swap with zswap: its ratio (`what`), or why there is none.
fn zswap_line(ratio: Option<f64>, error: &Option<String>, no_zswap: bool, what: &str) -> String {
    match (ratio, error) {
        (Some(r), _) => format!("ratio ({what}): {r:.2}"),
        (None, Some(e)) => format!("kernel swap with zswap: failed: {e}"),
        (None, None) if no_zswap => "kernel swap with zswap: not run (--no-zswap)".into(),
        (None, None) => {
            "kernel swap with zswap: not run (no writable /sys/module/zswap/parameters/enabled)"
                .into()
        }
    }
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

/// `bench mem [--compare] -- CMD`: the user's program under `tierstack run` and kernel swap.
fn bench_program(a: &BenchMemArgs, dram: u64) -> Result<()> {
    use tierstack_bench::program;
    let spec = program_spec(a, dram)?;
    let exe = std::env::current_exe()?;
    let shown: Vec<String> = a
        .cmd
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let run_line = format!(
        "tierstack run --dram {} --dir {}{}{} -- {}",
        a.dram,
        a.dir.display(),
        if spec.run_flags.is_empty() { "" } else { " " },
        spec.run_flags.join(" "),
        shown.join(" ")
    );
    if !a.compare {
        let engine = a.engine.as_str();
        let r =
            program::run_program(&exe, engine, engine, &spec, dram).map_err(anyhow::Error::msg)?;
        if a.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            print!("{}{}", program::HEADER, program::render(&r));
        }
        return Ok(());
    }
    let runs = program_rounds(a, &exe, &spec, &run_line)?;
    let cmp = ProgramComparison::of(runs, a.repeat as usize)?;
    if a.json {
        cmp.print_json(&shown, &run_line, &spec.run_flags);
    } else {
        cmp.print_text(&run_line, &spec.run_flags, a.no_zswap);
    }
    Ok(())
}

/// Checks a program run's flags and builds its spec, with the `run` flags that depart from
/// run's defaults.
fn program_spec(a: &BenchMemArgs, dram: u64) -> Result<tierstack_bench::program::ProgramSpec> {
    if dram == 0 {
        usage_bail!("--dram must be above 0: use e.g. --dram 512M");
    }
    let engine = a.engine.as_str();
    if !a.compare && !matches!(engine, "tierstack" | "kernel-swap") {
        usage_bail!("--engine {engine} does not run a program: use --compare, --engine tierstack or --engine kernel-swap");
    }
    let swap_bytes = crate::size_flag("swap", &a.swap)?;
    if swap_bytes < 64 << 20 {
        usage_bail!("--swap {} is too small: give at least 64M", a.swap);
    }
    // `run` flags that depart from its defaults, passed on and printed.
    let mut run_flags = Vec::new();
    let page = crate::size_flag("page", &a.page)?;
    if page != parse_size(tierstack_mem::setup::DEFAULT_PAGE_ARG).unwrap_or(4096) {
        run_flags.extend(["--page".to_string(), a.page.clone()]);
    }
    if a.no_compress {
        run_flags.push("--no-compress".into());
    }
    if let Some(v) = &a.vram {
        run_flags.extend([
            "--vram".to_string(),
            v.clone(),
            "--gpu".into(),
            a.gpu.to_string(),
        ]);
    }
    Ok(tierstack_bench::program::ProgramSpec {
        cmd: a.cmd.clone(),
        dram,
        dir: a.dir.clone(),
        run_flags,
        swap_bytes,
        timeout: std::time::Duration::from_secs(a.timeout),
    })
}

/// The runs of `bench mem --compare -- CMD`, each engine's in round order.
struct ProgramRuns {
    tierstack: Vec<tierstack_bench::program::ProgramReport>,
    kernel: Vec<tierstack_bench::program::ProgramReport>,
    zswap: Vec<tierstack_bench::program::ProgramReport>,
    /// Why kernel swap failed (it is not run again after).
    kernel_error: Option<String>,
    /// Why kernel swap with zswap failed (it is not run again after).
    zswap_error: Option<String>,
    /// Each round's wall times: tierstack's, then each peer's (None where it failed).
    rounds: Vec<Vec<Option<f64>>>,
}

/// Runs the program under tierstack, then kernel swap (and with zswap) given its peak RSS,
/// --repeat times; a peer that fails is recorded, a cancel ends the comparison.
fn program_rounds(
    a: &BenchMemArgs,
    exe: &Path,
    spec: &tierstack_bench::program::ProgramSpec,
    run_line: &str,
) -> Result<ProgramRuns> {
    use tierstack_bench::program;
    let dram = spec.dram;
    let repeat = a.repeat as usize;
    let zswap = if a.no_zswap { None } else { Zswap::find() };
    // A peer that fails (out of memory, past --timeout) is reported, not the end of the
    // comparison; a cancel is.
    let mut kernel_error: Option<String> = None;
    let mut zswap_error: Option<String> = None;
    let (mut ts, mut ks, mut zs) = (Vec::new(), Vec::new(), Vec::new());
    let mut rounds = Vec::new();
    for i in 0..repeat {
        if !a.json {
            eprintln!("round {} of {repeat}: {run_line}", i + 1);
        }
        let t = program::run_program(exe, "tierstack", "tierstack", spec, dram)
            .map_err(anyhow::Error::msg)?;
        // Kernel swap gets the memory the program had under tierstack: its peak RSS.
        let limit = t.peak_rss_bytes.max(dram);
        let mut round = vec![Some(t.wall_s)];
        // A kernel-swap run, with zswap on where `z` is given.
        let mut peer =
            |z: Option<&Zswap>, name: &str, error: &mut Option<String>, runs: &mut Vec<_>| {
                if error.is_some() {
                    return Ok(());
                }
                let run = || program::run_program(exe, "kernel-swap", name, spec, limit);
                match z.map_or_else(run, |z| z.with_enabled(run)) {
                    Ok(r) => {
                        round.push(Some(r.wall_s));
                        runs.push(r);
                    }
                    Err(e @ tierstack_bench::BenchError::Cancelled) => {
                        return Err(anyhow::Error::msg(e))
                    }
                    Err(e) => {
                        round.push(None);
                        *error = Some(e.to_string());
                    }
                }
                Ok(())
            };
        peer(None, "kernel-swap", &mut kernel_error, &mut ks)?;
        if let Some(z) = &zswap {
            peer(Some(z), "kernel-swap-zswap", &mut zswap_error, &mut zs)?;
        }
        rounds.push(round);
        ts.push(t);
    }
    Ok(ProgramRuns {
        tierstack: ts,
        kernel: ks,
        zswap: zs,
        kernel_error,
        zswap_error,
        rounds,
    })
}

/// Each engine's median run of a program comparison and their ratios to tierstack.
struct ProgramComparison {
    t: tierstack_bench::program::ProgramReport,
    k: Option<tierstack_bench::program::ProgramReport>,
    z: Option<tierstack_bench::program::ProgramReport>,
    /// Kernel swap's wall time over tierstack's (above 1: tierstack finished sooner).
    ratio: Option<f64>,
    /// The same for kernel swap with zswap.
    ratio_zswap: Option<f64>,
    /// Whether every run printed the same output.
    same_output: bool,
    kernel_error: Option<String>,
    zswap_error: Option<String>,
    rounds: Vec<Vec<Option<f64>>>,
    repeat: usize,
}

impl ProgramComparison {
    /// Takes each engine's median run (none for an engine that failed) and the ratios.
    fn of(runs: ProgramRuns, repeat: usize) -> Result<ProgramComparison> {
        use tierstack_bench::program;
        let ProgramRuns {
            tierstack: ts,
            kernel: ks,
            zswap: zs,
            kernel_error,
            zswap_error,
            rounds,
        } = runs;
        let same_output = ts
            .iter()
            .chain(&ks)
            .chain(&zs)
            .all(|r| r.output_hash == ts[0].output_hash);
        let median = |runs| tierstack_bench::median_by(runs, |r: &program::ProgramReport| r.wall_s);
        let t = median(ts).ok_or_else(|| anyhow::anyhow!("no tierstack run"))?;
        let k = if kernel_error.is_none() {
            median(ks)
        } else {
            None
        };
        let z = if zswap_error.is_none() {
            median(zs)
        } else {
            None
        };
        // Above 1: tierstack finished sooner.
        let ratio_of = |o: &program::ProgramReport| o.wall_s / t.wall_s.max(1e-9);
        let ratio = k.as_ref().map(ratio_of);
        let ratio_zswap = z.as_ref().map(ratio_of);
        Ok(ProgramComparison {
            t,
            k,
            z,
            ratio,
            ratio_zswap,
            same_output,
            kernel_error,
            zswap_error,
            rounds,
            repeat,
        })
    }

    /// Prints the comparison as one JSON object.
    fn print_json(&self, shown: &[String], run_line: &str, run_flags: &[String]) {
        println!(
            "{}",
            serde_json::json!({"program": shown, "run": run_line, "departures": run_flags,
                "tierstack": self.t, "kernel_swap": self.k, "kernel_swap_zswap": self.z,
                "ratio": self.ratio, "ratio_zswap": self.ratio_zswap,
                "kernel_swap_error": self.kernel_error, "zswap_error": self.zswap_error,
                "same_output": self.same_output, "repeat": self.repeat,
                "rounds_wall_s": self.rounds})
        );
    }

    /// Prints the comparison as a table and lines of ratios.
    fn print_text(&self, run_line: &str, run_flags: &[String], no_zswap: bool) {
        use tierstack_bench::program;
        let repeat = self.repeat;
        println!("{run_line}");
        if !run_flags.is_empty() {
            println!("departures from run's defaults: {}", run_flags.join(" "));
        }
        print!("{}{}", program::HEADER, program::render(&self.t));
        for r in self.k.iter().chain(&self.z) {
            print!("{}", program::render(r));
        }
        if repeat > 1 {
            println!("(median of {repeat} rounds each)");
        }
        println!("kernel swap's memory: the program's peak RSS under tierstack run");
        match (self.ratio, &self.kernel_error) {
            (Some(r), _) => {
                println!("ratio (kernel-swap wall time / tierstack wall time): {r:.2}")
            }
            (None, e) => println!("kernel swap: failed: {}", e.as_deref().unwrap_or("no run")),
        }
        println!(
            "{}",
            zswap_line(
                self.ratio_zswap,
                &self.zswap_error,
                no_zswap,
                "kernel-swap with zswap / tierstack"
            )
        );
        println!(
            "output: {}",
            if self.same_output {
                "the same under every engine and round"
            } else {
                "differs between engines or rounds (a program that prints times does; see --json output_tail)"
            }
        );
    }
}
