//! `tierstack bench mem`: the pmbench method. A worker process maps `--map` bytes, touches
//! every 4 KiB page once, then for `--seconds` each thread touches one word of one page per
//! access (pattern uniform, linear, zipf or butterfly; a read or a write by `--read-ratio`), timing every
//! access. Reported: accesses/s, mean, p50, p99, p99.9 and read and write histograms in log2
//! nanosecond bands, as pmbench prints them.
//!
//! Engines: `dram` (no limit) and `kernel-swap` (root: a swap file in `--dir` and a memory
//! cgroup limited to `--dram`, both removed afterwards), `tierstack` (a userfaultfd region
//! over the array, store and budget split that `tierstack run` makes: `tierstack_mem::setup`)
//! and `tierstack-dram` (the same region over a store kept in DRAM: the fault path alone).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use tierstack_common::{cgroup, io_err};

use crate::BenchError;

/// Set by the command's Ctrl-C / SIGTERM handler (see [`cancel_on`]).
static CANCEL: std::sync::OnceLock<std::sync::Arc<AtomicBool>> = std::sync::OnceLock::new();

/// Makes the benchmark stop when `flag` is set: the running worker is killed and the run
/// returns [`BenchError::Cancelled`], so that the swap file, the cgroup and the zswap switch
/// are put back as on any error (a signal's default action would leave them behind).
pub fn cancel_on(flag: std::sync::Arc<AtomicBool>) {
    let _ = CANCEL.set(flag);
}

pub(crate) fn cancelled() -> bool {
    CANCEL.get().is_some_and(|f| f.load(Relaxed))
}

/// Size of the pages the workload touches, in bytes (4 KiB, as pmbench).
pub const PAGE: usize = 4096;

/// Which page each access of `bench mem` goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// A page drawn uniformly at random.
    Uniform,
    /// Every page in turn, each thread starting at its own share of the map and wrapping around.
    Linear,
    /// Pages drawn from a Zipf distribution with exponent 0.99 (the first page most often).
    Zipf,
    /// Pairs of pages (i, i + 2^k) across the whole map, k sweeping 0..log2(pages): the
    /// access pattern of an FFT or of a state-vector simulator's gates.
    Butterfly,
}

impl std::str::FromStr for Pattern {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        match s {
            "uniform" => Ok(Pattern::Uniform),
            "linear" => Ok(Pattern::Linear),
            "zipf" => Ok(Pattern::Zipf),
            "butterfly" => Ok(Pattern::Butterfly),
            o => Err(BenchError::UnknownPattern(o.to_string())),
        }
    }
}

/// What each page holds after the warm-up (and so how well swapped pages compress).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fill {
    /// One word per page, the rest zeros (pmbench's way; compresses extremely well).
    #[default]
    OneWord,
    /// Every word random (does not compress).
    Random,
    /// Every word a double of a smooth field, as a simulation's state (compresses a little).
    Floats,
}

impl std::str::FromStr for Fill {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        match s {
            "one-word" => Ok(Fill::OneWord),
            "random" => Ok(Fill::Random),
            "floats" => Ok(Fill::Floats),
            o => Err(BenchError::UnknownFill(o.to_string())),
        }
    }
}

/// What one worker run does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    /// Bytes to map and touch; the workload uses whole 4 KiB pages of it.
    pub map: u64,
    /// Threads that access the map during the timed phase (at least one runs).
    pub threads: usize,
    /// Fraction of reads, 0.0 to 1.0.
    pub read_ratio: f64,
    /// Which page each access goes to.
    pub pattern: Pattern,
    /// Length of the timed phase in seconds (at least 0.1).
    pub seconds: f64,
    /// cgroup.procs file to join before touching memory (kernel-swap engine).
    pub cgroup_procs: Option<PathBuf>,
    /// Run in a tierstack userfaultfd region instead of plain memory.
    #[serde(default)]
    pub tierstack: Option<TierstackSpec>,
    /// What the warm-up writes into each page.
    #[serde(default)]
    pub fill: Fill,
    /// The tierstack engine's VRAM tier (`bench mem --vram`), if any.
    #[serde(default)]
    pub vram: Option<tierstack_mem::setup::Vram>,
    /// The tierstack engine without its compressed tier (`bench mem --no-compress`).
    #[serde(default)]
    pub no_compress: bool,
}

/// The tierstack engine: an array of four file drives in `dir` (RAID `level`), the tiered
/// store over it and a userfaultfd region whose DRAM budget is `dram`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TierstackSpec {
    /// Folder for the array's drive files (created if missing; the files are removed afterwards).
    pub dir: PathBuf,
    /// The DRAM budget in bytes, split between the store and the region as `tierstack run` splits
    /// it (with `in_memory`, the region's resident budget alone).
    pub dram: u64,
    /// Page size in bytes: the unit the region faults in and evicts.
    pub page: usize,
    /// RAID level number (0, 1, 5, 6 or 10).
    pub level: u32,
    /// The `tierstack-dram` engine: the store holds every page in DRAM (no drives), so a run
    /// measures the fault path alone. That DRAM is outside `dram`, which stays the region's
    /// budget.
    #[serde(default)]
    pub in_memory: bool,
    /// A VRAM tier between the store's DRAM tier and the array (`--vram`), if any.
    #[serde(default)]
    pub vram: Option<tierstack_mem::setup::Vram>,
    /// Without the compressed tier (`--no-compress`).
    #[serde(default)]
    pub no_compress: bool,
}

/// Drive files of the tierstack engine, removed on drop.
struct TempDrives(Vec<PathBuf>);

impl Drop for TempDrives {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The memory the workload touches.
enum Backing {
    Plain(Vec<AtomicU64>),
    // Field order matters: the region goes before the drives it pages to.
    Tierstack {
        region: tierstack_mem::Region,
        /// What the engine was built as (None for the in-memory store).
        config: Option<tierstack_mem::setup::EngineConfig>,
        _drives: TempDrives,
    },
}

impl Backing {
    fn pager_stats(&self) -> Option<tierstack_mem::MemStats> {
        match self {
            Backing::Plain(_) => None,
            Backing::Tierstack { region, .. } => Some(region.stats()),
        }
    }

    fn words(&self) -> &[AtomicU64] {
        match self {
            Backing::Plain(v) => v,
            Backing::Tierstack { region: r, .. } => {
                // SAFETY: the region is a page-aligned mapping of r.len() bytes that lives as
                // long as `self`; AtomicU64 makes concurrent access from the threads defined.
                unsafe { std::slice::from_raw_parts(r.as_ptr() as *const AtomicU64, r.len() / 8) }
            }
        }
    }
}

fn tierstack_backing(t: &TierstackSpec, map: u64) -> Result<Backing, BenchError> {
    if t.in_memory {
        let store = tierstack_store::StackSpec::new(map + (64 << 20)).build()?;
        let opts = tierstack_mem::RegionOptions {
            page: t.page,
            budget: t.dram.max(4 * t.page as u64),
            fault_threads: tierstack_mem::default_fault_threads(),
        };
        let region = tierstack_mem::Region::new(std::sync::Arc::new(store), map as usize, &opts)?;
        return Ok(Backing::Tierstack {
            region,
            config: None,
            _drives: TempDrives(Vec::new()),
        });
    }
    std::fs::create_dir_all(&t.dir).map_err(io_err("create", &t.dir))?;
    let level =
        tierstack_array::Level::from_number(t.level).ok_or(BenchError::UnknownLevel(t.level))?;
    // The array, store and budget split `tierstack run` makes (tierstack_mem::setup): its
    // default store size in this folder (sparse drives), or twice the map where that is more.
    let prefix = format!("tierstack-mem-{}-", std::process::id());
    let (array, paths) = tierstack_mem::setup::create_array(
        &t.dir,
        &prefix,
        tierstack_mem::setup::store_bytes_for(&t.dir, map),
        level,
        t.page,
        t.dram,
    )?;
    let drives = TempDrives(paths);
    let tiers = tierstack_mem::setup::Tiers {
        vram: t.vram,
        compress: !t.no_compress,
    };
    let config = tierstack_mem::setup::engine_config(&array, t.dram, t.page, tiers);
    let (store, p) = tierstack_mem::setup::store_and_options(array, t.dram, t.page, tiers)?;
    let opts = tierstack_mem::RegionOptions {
        page: p.page,
        budget: p.budget,
        fault_threads: p.fault_threads,
    };
    let region = tierstack_mem::Region::new(store, map as usize, &opts)?;
    Ok(Backing::Tierstack {
        region,
        config: Some(config),
        _drives: drives,
    })
}

/// One log2 band: accesses that took [2^lo_log2, 2^(lo_log2+1)) nanoseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Band {
    /// Lower bound of the band in nanoseconds (2^k).
    pub lo_ns: u64,
    /// Upper bound of the band in nanoseconds (2^(k+1)), not included.
    pub hi_ns: u64,
    /// Reads whose latency fell in the band.
    pub reads: u64,
    /// Writes whose latency fell in the band.
    pub writes: u64,
}

/// The result of one engine's run of `bench mem` (its JSON output). Latencies are of single
/// accesses, timed in the worker threads, in microseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemReport {
    /// The engine measured: `dram`, `kernel-swap`, `tierstack` or `tierstack-dram`.
    pub engine: String,
    /// Bytes mapped and touched by the workload.
    pub map_bytes: u64,
    /// The DRAM limit the engine ran under, in bytes (0 for `dram`: no limit).
    pub dram_bytes: u64,
    /// Threads that accessed the map.
    pub threads: usize,
    /// Fraction of accesses asked to be reads (0.0 to 1.0).
    pub read_ratio: f64,
    /// Which page each access went to.
    pub pattern: Pattern,
    /// Length of the timed phase as asked for, in seconds.
    pub seconds: f64,
    /// Accesses made in the timed phase, all threads together.
    pub accesses: u64,
    /// accesses / seconds.
    pub accesses_per_s: f64,
    /// Mean latency of all accesses, reads and writes together.
    pub mean_us: f64,
    /// Median latency of all accesses.
    pub p50_us: f64,
    /// 99th percentile latency of all accesses.
    pub p99_us: f64,
    /// 99.9th percentile latency of all accesses.
    pub p999_us: f64,
    /// Mean latency of the reads.
    pub read_mean_us: f64,
    /// Mean latency of the writes.
    pub write_mean_us: f64,
    /// Read and write counts per log2 nanosecond band, fastest first; bands without any access are
    /// left out.
    pub bands: Vec<Band>,
    /// The tierstack engine's pager during the timed phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pager: Option<PagerPhase>,
    /// The worker's peak resident memory (`VmHWM`): the map's resident pages, and for the
    /// tierstack engine its index, buffers, arena and threads too.
    #[serde(default)]
    pub peak_rss_bytes: u64,
    /// Kernel swap with zswap: the largest zswap pool seen (memory outside the process,
    /// taken off the group's limit: [`crate::zswap::PoolCharge`]).
    #[serde(default)]
    pub zswap_pool_bytes: u64,
    /// What the tierstack engine was built as: the same description `tierstack run`
    /// publishes for each paged process (`run --stats --json`, "engine").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_config: Option<tierstack_mem::setup::EngineConfig>,
}

/// What the tierstack engine's pager did during the timed phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PagerPhase {
    /// Missing faults (every access that found its page not resident and not prefetched).
    pub faults: u64,
    /// Faults served by a read from the store.
    pub store_reads: u64,
    /// Mean time of those reads.
    pub store_read_mean_us: f64,
    /// Mean time from taking such a fault to the call that wakes the program (the wake-up
    /// itself not included: the program usually runs at once on the fault thread's CPU).
    pub store_fault_mean_us: f64,
    /// What tierstack adds per miss beyond the device read: mean fault service time minus
    /// mean store read time, over the faults served by a store read (issue 14's measure;
    /// the wake-up of the program is in neither).
    #[serde(default)]
    pub overhead_us_per_miss: f64,
    /// Pages evicted from the region (clean and dirty).
    pub evictions: u64,
    /// Evictions of clean pages (dropped without a write).
    pub clean_drops: u64,
    /// Faults handed to the fault thread on the faulting thread's CPU, and those of them
    /// another fault thread served because the owner had not taken them in time.
    #[serde(default)]
    pub handed_over: u64,
    /// Of `handed_over`, the faults another fault thread served because their owner had not
    /// taken them in time.
    #[serde(default)]
    pub stolen: u64,
    /// Of `store_reads`, those the compressed tier served (a decompression, no device read).
    #[serde(default)]
    pub compressed_hits: u64,
}

fn pager_phase(a: &tierstack_mem::MemStats, b: &tierstack_mem::MemStats) -> PagerPhase {
    let reads = b.store_reads - a.store_reads;
    let per = |ns: u64| ns as f64 / reads.max(1) as f64 / 1000.0;
    PagerPhase {
        faults: b.faults - a.faults,
        store_reads: reads,
        store_read_mean_us: per(b.store_read_ns - a.store_read_ns),
        store_fault_mean_us: per(b.store_fault_ns - a.store_fault_ns),
        overhead_us_per_miss: per(
            (b.store_fault_ns - a.store_fault_ns).saturating_sub(b.store_read_ns - a.store_read_ns)
        ),
        evictions: b.evictions - a.evictions,
        clean_drops: b.clean_drops - a.clean_drops,
        handed_over: b.handed_over - a.handed_over,
        stolen: b.stolen - a.stolen,
        compressed_hits: b.compressed_hits.saturating_sub(a.compressed_hits),
    }
}

fn hist() -> Histogram<u64> {
    // 1 ns .. 100 s, 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).unwrap_or_else(|_| {
        Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant digits is valid"))
    })
}

/// Runs the workload in this process and returns its report (engine name filled by caller).
pub fn run_worker(spec: &WorkerSpec) -> Result<MemReport, BenchError> {
    if let Some(p) = &spec.cgroup_procs {
        std::fs::write(p, std::process::id().to_string()).map_err(io_err("join cgroup", p))?;
    }
    let pages = (spec.map as usize / PAGE).max(1);
    let words_per_page = PAGE / 8;
    let backing = match &spec.tierstack {
        Some(t) => tierstack_backing(t, spec.map)?,
        // Anonymous memory (a large allocation is an mmap).
        None => Backing::Plain(
            (0..pages * words_per_page)
                .map(|_| AtomicU64::new(0))
                .collect(),
        ),
    };
    let mem = backing.words();
    // Touch every page once, as pmbench does, so the map is resident or swapped out; with a
    // fill other than one word, write all of it.
    for p in 0..pages {
        let page = &mem[p * words_per_page..(p + 1) * words_per_page];
        match spec.fill {
            Fill::OneWord => page[0].store(p as u64, Relaxed),
            Fill::Random => {
                let mut x = (p as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                for w in page {
                    // xorshift64
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    w.store(x, Relaxed);
                }
            }
            Fill::Floats => {
                for (i, w) in page.iter().enumerate() {
                    let t = (p * words_per_page + i) as f64 * 1e-4;
                    w.store((t.sin() * 0.5 + (3.0 * t).cos()).to_bits(), Relaxed);
                }
            }
        }
    }
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let before = backing.pager_stats();
    let (reads, writes): (Vec<Histogram<u64>>, Vec<Histogram<u64>>) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..spec.threads.max(1))
            .map(|t| {
                let mem = &mem;
                let stop = &stop;
                let total = &total;
                s.spawn(move || {
                    // Lets the tierstack engine serve this thread's faults on its own CPU
                    // (nothing for the other engines).
                    tierstack_mem::register_current_thread();
                    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed + t as u64);
                    let zipf = rand_distr::Zipf::new(pages as u64, 0.99).ok();
                    let mut rh = hist();
                    let mut wh = hist();
                    let mut next = (pages / spec.threads.max(1)) * t;
                    // Butterfly: stride exponent, lower index of the pair, which side.
                    let levels = (usize::BITS - 1 - pages.max(2).leading_zeros()) as usize;
                    let (mut bk, mut bi, mut second) = (t % levels.max(1), 0usize, false);
                    let mut n = 0u64;
                    while !stop.load(Relaxed) {
                        for _ in 0..256 {
                            let page = match spec.pattern {
                                Pattern::Uniform => rng.gen_range(0..pages),
                                Pattern::Linear => {
                                    next = (next + 1) % pages;
                                    next
                                }
                                Pattern::Zipf => match &zipf {
                                    Some(z) => (rng.sample(z) as usize).saturating_sub(1) % pages,
                                    None => rng.gen_range(0..pages),
                                },
                                Pattern::Butterfly => {
                                    let stride = 1usize << bk;
                                    let p = if second { bi + stride } else { bi };
                                    if second {
                                        bi += 1;
                                        if bi & stride != 0 {
                                            bi += stride;
                                        }
                                        if bi + stride >= pages {
                                            bi = 0;
                                            bk = (bk + 1) % levels.max(1);
                                        }
                                    }
                                    second = !second;
                                    p % pages
                                }
                            };
                            let word = page * words_per_page + rng.gen_range(0..words_per_page);
                            let is_read = rng.gen_bool(spec.read_ratio.clamp(0.0, 1.0));
                            let t0 = Instant::now();
                            if is_read {
                                std::hint::black_box(mem[word].load(Relaxed));
                            } else {
                                mem[word].store(n, Relaxed);
                            }
                            let ns = t0.elapsed().as_nanos().max(1) as u64;
                            let h = if is_read { &mut rh } else { &mut wh };
                            let _ = h.record(ns);
                            n += 1;
                        }
                    }
                    total.fetch_add(n, Relaxed);
                    (rh, wh)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(spec.seconds.max(0.1)));
        stop.store(true, Relaxed);
        handles.into_iter().filter_map(|h| h.join().ok()).unzip()
    });
    let pager = match (before, backing.pager_stats()) {
        (Some(a), Some(b)) => Some(pager_phase(&a, &b)),
        _ => None,
    };
    let mut rh = hist();
    let mut wh = hist();
    for h in &reads {
        let _ = rh.add(h);
    }
    for h in &writes {
        let _ = wh.add(h);
    }
    let mut all = hist();
    let _ = all.add(&rh);
    let _ = all.add(&wh);
    let accesses = total.load(Relaxed);
    let us = |ns: f64| ns / 1000.0;
    let mut bands = Vec::new();
    for k in 0..40u32 {
        let lo = 1u64 << k;
        let hi = 1u64 << (k + 1);
        let r = rh.count_between(lo, hi - 1);
        let w = wh.count_between(lo, hi - 1);
        if r + w > 0 {
            bands.push(Band {
                lo_ns: lo,
                hi_ns: hi,
                reads: r,
                writes: w,
            });
        }
    }
    Ok(MemReport {
        engine: String::new(),
        map_bytes: spec.map,
        dram_bytes: 0,
        threads: spec.threads,
        read_ratio: spec.read_ratio,
        pattern: spec.pattern,
        seconds: spec.seconds,
        accesses,
        accesses_per_s: accesses as f64 / spec.seconds.max(0.1),
        mean_us: us(all.mean()),
        p50_us: us(all.value_at_quantile(0.50) as f64),
        p99_us: us(all.value_at_quantile(0.99) as f64),
        p999_us: us(all.value_at_quantile(0.999) as f64),
        read_mean_us: us(rh.mean()),
        write_mean_us: us(wh.mean()),
        bands,
        pager,
        peak_rss_bytes: std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| crate::zswap::field_kb(&s, "VmHWM:"))
            .map_or(0, |kb| kb * 1024),
        zswap_pool_bytes: 0,
        engine_config: match &backing {
            Backing::Tierstack { config, .. } => config.clone(),
            Backing::Plain(_) => None,
        },
    })
}

/// Swap file and memory cgroup for the kernel-swap engine; removed on drop.
pub(crate) struct SwapSetup {
    swapfile: PathBuf,
    swapped_on: bool,
    cgroup: Option<PathBuf>,
}

impl SwapSetup {
    /// The swap file.
    pub(crate) fn swapfile(&self) -> &Path {
        &self.swapfile
    }

    /// The memory cgroup, once made.
    pub(crate) fn cgroup(&self) -> Option<&Path> {
        self.cgroup.as_deref()
    }
}

impl Drop for SwapSetup {
    fn drop(&mut self) {
        if self.swapped_on {
            // swapoff pages everything back in; while the measured process is still exiting
            // (its cgroup at its limit) it can fail: try again for up to 5 s. An active swap
            // file cannot be removed, so a failure would leave it on the host.
            for _ in 0..25 {
                let ok = Command::new("swapoff")
                    .arg(&self.swapfile)
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok
                    || !std::fs::read_to_string("/proc/swaps")
                        .unwrap_or_default()
                        .contains(&*self.swapfile.to_string_lossy())
                {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
        let _ = std::fs::remove_file(&self.swapfile);
        if let Some(cg) = &self.cgroup {
            let _ = std::fs::remove_dir(cg);
        }
    }
}

fn sh(cmd: &mut Command, what: &str) -> Result<(), BenchError> {
    let o = cmd.output().map_err(|source| BenchError::CommandStart {
        what: what.to_string(),
        source,
    })?;
    if o.status.success() {
        Ok(())
    } else {
        Err(BenchError::CommandFailed {
            what: what.to_string(),
            stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
        })
    }
}

/// Creates the swap file (size bytes, written out: swap files may not have holes), turns it
/// on and makes a memory cgroup limited to `limit` bytes. Returns the cgroup.procs path.
pub(crate) fn kernel_swap_setup(
    dir: &Path,
    size: u64,
    limit: u64,
) -> Result<(SwapSetup, PathBuf), BenchError> {
    if !rustix::process::geteuid().is_root() {
        return Err(BenchError::NeedsRoot);
    }
    std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let swapfile = dir.join(format!("tierstack-swap-{}", std::process::id()));
    let mut setup = SwapSetup {
        swapfile: swapfile.clone(),
        swapped_on: false,
        cgroup: None,
    };
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&swapfile).map_err(|source| BenchError::SwapFile {
            what: "create",
            source,
        })?;
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..size.div_ceil(1 << 20) {
            if cancelled() {
                return Err(BenchError::Cancelled);
            }
            f.write_all(&zeros).map_err(|source| BenchError::SwapFile {
                what: "write",
                source,
            })?;
        }
        f.sync_all().map_err(|source| BenchError::SwapFile {
            what: "sync",
            source,
        })?;
    }
    let _ = std::fs::set_permissions(
        &swapfile,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    );
    sh(Command::new("mkswap").arg(&swapfile), "mkswap")?;
    sh(Command::new("swapon").arg(&swapfile), "swapon")?;
    setup.swapped_on = true;
    let name = format!("tierstack-bench-{}", std::process::id());
    let v1 = cgroup::v1_dir("memory");
    let (cg, limit_file) = if v1.join("memory.limit_in_bytes").exists() {
        (v1.join(&name), "memory.limit_in_bytes")
    } else if cgroup::v2_controllers().is_some() {
        (Path::new(cgroup::ROOT).join(&name), "memory.max")
    } else {
        return Err(BenchError::NoMemoryCgroup);
    };
    std::fs::create_dir(&cg).map_err(io_err("create cgroup", &cg))?;
    setup.cgroup = Some(cg.clone());
    std::fs::write(cg.join(limit_file), limit.to_string()).map_err(|source| {
        BenchError::CgroupLimit {
            file: limit_file,
            source,
        }
    })?;
    // v1: let the group swap, and make a group that reclaim cannot keep up with wait for
    // swap-out rather than be OOM-killed (heavy swapping to a slow drive trips the memcg OOM
    // killer even with free swap).
    let _ = std::fs::write(cg.join("memory.swappiness"), "60");
    let _ = std::fs::write(cg.join("memory.oom_control"), "1");
    Ok((setup, cg.join("cgroup.procs")))
}

/// Runs one engine (`page` is the tierstack page size): spawns `exe bench mem-worker SPEC_JSON`
/// (in the cgroup for kernel-swap)
/// and parses its JSON report.
pub fn run_engine(
    exe: &Path,
    engine: &str,
    spec: &WorkerSpec,
    dram: u64,
    dir: &Path,
    page: usize,
    level: tierstack_array::Level,
) -> Result<MemReport, BenchError> {
    let mut spec = spec.clone();
    let _setup = match engine {
        "dram" => None,
        "kernel-swap" => {
            // Swapped-in pages keep their swap slots (swap cache), so size the file for the whole map
            // twice over.
            let (setup, procs) = kernel_swap_setup(dir, spec.map * 2 + (256 << 20), dram)?;
            spec.cgroup_procs = Some(procs);
            Some(setup)
        }
        "tierstack" | "tierstack-dram" => {
            spec.tierstack = Some(TierstackSpec {
                dir: dir.to_path_buf(),
                dram,
                page,
                level: level.number(),
                in_memory: engine == "tierstack-dram",
                vram: spec.vram,
                no_compress: spec.no_compress,
            });
            None
        }
        o => return Err(BenchError::UnknownEngine(o.to_string())),
    };
    let json = serde_json::to_string(&spec).map_err(BenchError::Spec)?;
    let mut charge = _setup
        .as_ref()
        .and_then(|s| s.cgroup())
        .and_then(|cg| crate::zswap::PoolCharge::new(cg, dram));
    let mut child = Command::new(exe)
        .args(["bench", "mem-worker", &json])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(BenchError::WorkerStart)?;
    // A worker that cannot make progress (swap exhausted under a frozen cgroup) is stopped.
    // Allowance: the run, plus the warm-up touching every page at no less than 10 MB/s.
    let warmup = 60.0 + spec.map as f64 / 10e6;
    let deadline = Instant::now() + Duration::from_secs_f64(spec.seconds * 2.0 + warmup);
    loop {
        if cancelled() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(BenchError::Cancelled);
        }
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => {
                if let Some(c) = charge.as_mut() {
                    c.tick();
                }
                std::thread::sleep(Duration::from_millis(50))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(BenchError::WorkerStuck);
            }
        }
    }
    let out = child.wait_with_output().map_err(BenchError::WorkerWait)?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(if err.is_empty() {
            BenchError::WorkerDied(out.status)
        } else {
            BenchError::WorkerFailed(err)
        });
    }
    let mut r: MemReport = serde_json::from_slice(&out.stdout).map_err(BenchError::WorkerOutput)?;
    r.engine = engine.to_string();
    r.dram_bytes = if engine == "dram" { 0 } else { dram };
    r.zswap_pool_bytes = charge.map_or(0, |c| c.peak_pool());
    Ok(r)
}

/// pmbench-style text: summary and the log2 histogram.
pub fn render(r: &MemReport) -> String {
    let mut out = format!(
        "engine {}: map {} dram limit {} threads {} read ratio {:.2} pattern {:?}, {:.1} s\n  {:.0} accesses/s, mean {:.2} us, p50 {:.2} us, p99 {:.2} us, p99.9 {:.2} us (reads {:.2} us, writes {:.2} us mean)\n",
        r.engine,
        crate::fmt_size(r.map_bytes),
        if r.dram_bytes == 0 { "none".to_string() } else { crate::fmt_size(r.dram_bytes) },
        r.threads,
        r.read_ratio,
        r.pattern,
        r.seconds,
        r.accesses_per_s,
        r.mean_us,
        r.p50_us,
        r.p99_us,
        r.p999_us,
        r.read_mean_us,
        r.write_mean_us
    );
    if r.peak_rss_bytes > 0 {
        out += &format!("  peak RSS {}", crate::fmt_size(r.peak_rss_bytes));
        if r.zswap_pool_bytes > 0 {
            out += &format!(
                " + zswap pool {} (taken off the group's limit)",
                crate::fmt_size(r.zswap_pool_bytes)
            );
        }
        out += "\n";
    }
    if let Some(c) = &r.engine_config {
        let mut departs = Vec::new();
        if c.page != tierstack_mem::setup::DEFAULT_PAGE {
            departs.push(format!("--page {}", crate::fmt_size(c.page as u64)));
        }
        if c.level != tierstack_mem::setup::LEVEL.number() {
            departs.push(format!("--level {}", c.level));
        }
        if c.vram_bytes > 0 {
            departs.push(format!("--vram {}", crate::fmt_size(c.vram_bytes)));
        }
        if c.compressed_bytes == 0 {
            departs.push("--no-compress".to_string());
        }
        out += &format!(
            "  store: RAID {} of {} drives, page {}, DRAM tier {}, resident budget {}{}{}; {}\n",
            c.level,
            c.drives,
            crate::fmt_size(c.page as u64),
            crate::fmt_size(c.store_dram_bytes),
            crate::fmt_size(c.budget_bytes),
            if c.compressed_bytes > 0 {
                format!(
                    ", compressed tier up to {} (within the budget)",
                    crate::fmt_size(c.compressed_bytes)
                )
            } else {
                String::new()
            },
            if c.vram_bytes > 0 {
                format!(", VRAM tier {}", crate::fmt_size(c.vram_bytes))
            } else {
                String::new()
            },
            if departs.is_empty() {
                "as `tierstack run` makes it".to_string()
            } else {
                format!(
                    "departs from `tierstack run`'s defaults: {}",
                    departs.join(" ")
                )
            }
        );
    }
    if let Some(p) = &r.pager {
        out += &format!(
            "  pager: {} faults, {} read from the store ({} of them from the compressed tier; mean read {:.1} us, mean fault {:.1} us, overhead {:.1} us per miss), {} evictions ({} clean), {} handed to the faulting thread's CPU ({} stolen)\n",
            p.faults, p.store_reads, p.compressed_hits, p.store_read_mean_us, p.store_fault_mean_us, p.overhead_us_per_miss, p.evictions, p.clean_drops, p.handed_over, p.stolen
        );
    }
    let rows: Vec<Vec<String>> = r
        .bands
        .iter()
        .map(|b| {
            vec![
                format!("2^{}", b.lo_ns.trailing_zeros()),
                format!("{}-{} ns", b.lo_ns, b.hi_ns),
                b.reads.to_string(),
                b.writes.to_string(),
            ]
        })
        .collect();
    out.push_str(&crate::table::render(
        &["band", "latency", "reads", "writes"],
        &rows,
    ));
    out
}
