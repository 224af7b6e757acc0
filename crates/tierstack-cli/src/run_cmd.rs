//! `tierstack run`: an unmodified program with a DRAM budget, paged to the array.
//!
//! The program runs with `LD_PRELOAD=libtierstack_preload.so` (found next to the `tierstack`
//! binary, or at `$TIERSTACK_PRELOAD`) and its settings in the shim's private `_TIERSTACK_SHIM_*` variables
//! (`tierstack_common::env`; a `TIERSTACK_*` variable of the caller passes through). Each
//! process of the program that makes a large allocation gets its own pager, budget and store
//! (see crates/tierstack-preload). With `--dir` (the default: the system's temporary folder)
//! every process makes its drives in a fresh run folder under DIR that is removed when the
//! program ends, however it ends.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use tierstack_node::runs::RunCounters;

use anyhow::{bail, Context, Result};
use clap::Args;
use tierstack_bench::fmt_size;
use tierstack_common::env;

#[derive(Args)]
pub struct RunArgs {
    /// DRAM tierstack may use per process: resident pages of the large allocations, the store's
    /// DRAM tier, the compressed arena, the array's I/O buffers and its index (about 15 to 25
    /// MiB per GiB paged out with 4K pages; it takes at most seven eighths of the pages'
    /// share) and 1 MiB per tierstack thread, together. Peak RSS stays within this plus the
    /// program's own smaller allocations and code (measured: plus at most 16 MiB more from 32M
    /// to 1G); `run` warns past a fixed 192 MiB allowance.
    #[arg(long)]
    pub dram: String,
    /// Page to this existing array (its descriptor) instead of file drives in --dir.
    #[arg(long, conflicts_with = "dir")]
    pub array: Option<PathBuf>,
    /// Folder for the per-process file drives (sparse; removed at exit). Default: $TMPDIR or /tmp.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// tierstack page (unit of faulting and eviction): a multiple of 4K up to 1M. Along a
    /// sequential stream pages are read in runs of up to 256K, whatever the page.
    #[arg(long, default_value = tierstack_mem::setup::DEFAULT_PAGE_ARG)]
    pub page: String,
    /// Allocations of at least this size are paged; smaller ones use the ordinary allocator.
    #[arg(long, default_value = "64M")]
    pub threshold: String,
    /// Size of the per-process array made in --dir (sparse files); paged allocations may take
    /// half of it (the log needs room to clean), and one beyond that fails (NULL / ENOMEM).
    /// Default: half the free space of DIR in whole GiB, at least 1G, at most 1T.
    #[arg(long)]
    pub store: Option<String>,
    /// Print one summary line at exit (peak RSS, faults, prefetch, evictions, bytes moved).
    #[arg(long)]
    pub stats: bool,
    /// Print one JSON object at exit on stderr (stdout is the program's): exit status, peak
    /// RSS, budget, allowance, bytes over it, paged processes, faults, bytes paged.
    #[arg(long)]
    pub json: bool,
    /// Serve Prometheus metrics at ADDR:PORT (`GET /metrics`) while the program runs.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
    /// A VRAM tier of this size per paged process on GPU --gpu, between the store's DRAM tier
    /// and the array (outside --dram): pages evicted from DRAM are kept in GPU memory and read
    /// back from it at PCIe speed; the array takes what the GPU cannot hold. Needs an NVIDIA
    /// driver, whose context adds about 90 MiB to the process's RSS (the allowance grows by
    /// 128 MiB); a forked child pages without it. Default: none.
    #[arg(long)]
    pub vram: Option<String>,
    /// The GPU of --vram (0 is the first; `tierstack doctor` lists them).
    #[arg(long, default_value_t = 0, requires = "vram")]
    pub gpu: u32,
    /// No compressed tier. By default pages that leave DRAM and compress 1.5:1 or better (LZ4;
    /// LZ4 of second differences for smooth fields of doubles; else zstd level 1:
    /// zero-filled, sparse or repetitive memory, arrays of floats) stay in process memory
    /// compressed, packed by size to 64 bytes, as zswap keeps swapped pages, in an arena of up
    /// to three quarters of what --dram leaves for pages (less the index) and within it (the
    /// part written leaves less for resident pages); a
    /// page dropped unchanged leaves a compressed copy there too; other pages go to the drives
    /// as they are, and a working set of such pages soon stops being tried (5 to 15 µs of CPU
    /// a page).
    #[arg(long)]
    pub no_compress: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// Finds libtierstack_preload.so (see [`find_lib`]).
fn preload_lib() -> Result<PathBuf> {
    find_lib("libtierstack_preload.so", "TIERSTACK_PRELOAD")
}

/// Finds the library `file` that ships with tierstack: `$var` if set, else relative to the
/// binary: next to it, in its deps/ folder (cargo's layout), in ../lib, or where `make
/// install` puts it (../lib/tierstack; ../lib64/tierstack and ../lib64 for a lib64 layout,
/// RPM's).
pub fn find_lib(file: &str, var: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("{var}={} is not a file: point it at {file}", p.display());
    }
    let exe = std::env::current_exe().context("cannot find the tierstack binary")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for c in [
        "",
        "deps/",
        "../lib/",
        "../lib/tierstack/",
        "../lib64/tierstack/",
        "../lib64/",
    ] {
        let c = dir.join(format!("{c}{file}"));
        if c.is_file() {
            // `/usr/lib/tierstack/...`, not `/usr/bin/../lib/tierstack/...`, in LD_PRELOAD.
            return Ok(c.canonicalize().unwrap_or(c));
        }
    }
    bail!(
        "cannot find {file} next to {} (nor in its deps/, ../lib, ../lib/tierstack, ../lib64/tierstack, ../lib64): build it with `cargo build --release`, install it with `make install`, or set {var}",
        exe.display()
    )
}

/// Finds `program` the way `execvp` does (a name without `/` is looked up in PATH).
fn resolve(program: &std::ffi::OsStr) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Some(p.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(p))
            .find(|c| c.is_file())
    })
}

/// How a program file is started, as far as the preload shim is concerned.
#[derive(Debug, PartialEq, Eq)]
pub enum Linkage {
    /// An ELF program with an interpreter (ld.so): LD_PRELOAD applies.
    Dynamic,
    /// An ELF program without an interpreter: LD_PRELOAD cannot apply.
    Static,
    /// A script: its interpreter is what runs.
    Script(PathBuf),
    /// Not something we can tell (the exec will say).
    Unknown,
}

/// Reads the start of a program file and tells its [`Linkage`].
pub fn linkage(path: &Path) -> Linkage {
    use std::io::Read;
    let mut head = Vec::with_capacity(1 << 16);
    let ok = std::fs::File::open(path)
        .and_then(|f| f.take(1 << 20).read_to_end(&mut head))
        .is_ok();
    if !ok {
        return Linkage::Unknown;
    }
    if let Some(rest) = head.strip_prefix(b"#!") {
        let line = rest.split(|b| *b == b'\n').next().unwrap_or_default();
        let interp = String::from_utf8_lossy(line);
        return match interp.split_whitespace().next() {
            Some(i) => Linkage::Script(PathBuf::from(i)),
            None => Linkage::Unknown,
        };
    }
    let Ok(header) = goblin::elf::Elf::parse_header(&head) else {
        return Linkage::Unknown;
    };
    let ctx = goblin::container::Ctx::new(
        if header.e_ident[goblin::elf::header::EI_CLASS] == goblin::elf::header::ELFCLASS64 {
            goblin::container::Container::Big
        } else {
            goblin::container::Container::Little
        },
        if header.e_ident[goblin::elf::header::EI_DATA] == goblin::elf::header::ELFDATA2MSB {
            goblin::container::Endian::Big
        } else {
            goblin::container::Endian::Little
        },
    );
    match goblin::elf::program_header::ProgramHeader::parse(
        &head,
        header.e_phoff as usize,
        header.e_phnum as usize,
        ctx,
    ) {
        Ok(phs)
            if phs
                .iter()
                .any(|ph| ph.p_type == goblin::elf::program_header::PT_INTERP) =>
        {
            Linkage::Dynamic
        }
        Ok(_) => Linkage::Static,
        Err(_) => Linkage::Unknown,
    }
}

/// Refuses a program the preload shim cannot reach (statically linked), naming the options.
fn check_linkage(program: &std::ffi::OsStr) -> Result<()> {
    let Some(mut path) = resolve(program) else {
        return Ok(());
    };
    // A script runs its interpreter (one level, as the kernel does).
    if let Linkage::Script(i) = linkage(&path) {
        path = i;
    }
    if linkage(&path) == Linkage::Static {
        bail!(
            "{} is statically linked (no ELF interpreter), so tierstack's LD_PRELOAD shim cannot manage its memory and --dram would not be enforced: run a dynamically linked build of it (e.g. for Go, CGO_ENABLED=1 with -linkmode=external), or run it under kernel swap with a memory cgroup (e.g. `systemd-run --scope -p MemoryMax=SIZE -p MemorySwapMax=infinity CMD`)",
            path.display()
        );
    }
    Ok(())
}

/// Removes the run folder when `run` returns, however it returns.
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(a: RunArgs) -> Result<()> {
    let sizes = RunSizes::from_args(&a)?;
    let Some(program) = a.cmd.first() else {
        return Err(crate::usage(
            "no command given: use `tierstack run --dram 4G -- ./program ARGS`",
        ));
    };
    check_linkage(program)?;
    match tierstack_mem::uffd::available() {
        Err(e) => bail!("userfaultfd is not usable by this user ({e}): run as root, or allow it with `sysctl vm.unprivileged_userfaultfd=1` or access to /dev/userfaultfd"),
        // A bad TIERSTACK_MEM_WP is refused here, in one line, not by the shim in the program.
        Ok(caps) => {
            tierstack_mem::DirtyTracking::chosen(&caps)?;
        }
    }
    let vram = match &a.vram {
        Some(v) => {
            let bytes = crate::size_flag("vram", v)?;
            crate::mount_cmd::check_gpu("--vram", a.gpu, bytes)?;
            Some(bytes)
        }
        None => None,
    };
    let lib = preload_lib()?;
    let metrics_listener = a.metrics.as_deref().map(crate::metrics_bind).transpose()?;
    let mut cmd = program_command(&a, program, lib, &sizes, vram)?;
    let (parent, run_dir) = make_run_dir(a.dir.as_deref())?;
    if a.array.is_none() {
        let store = match &a.store {
            Some(s) => {
                let v = crate::size_flag("store", s)?;
                if v < 64 << 20 {
                    return Err(crate::usage(format!(
                        "--store {s} is too small: give at least 64M"
                    )));
                }
                v
            }
            None => tierstack_mem::setup::default_store_in(&parent),
        };
        cmd.env(env::DIR.name(), &run_dir.0)
            .env(env::STORE.name(), store.to_string());
    }
    // Every process reports its pager's figures at exit (the end-of-run check needs them).
    cmd.env(env::STATS_DIR.name(), &run_dir.0);
    let child = spawn_program(&mut cmd, program)?;
    // `tierstack top` finds the run through this record (removed when `_reg` drops).
    let rec = tierstack_node::runs::RunRecord {
        tierstack_pid: std::process::id(),
        pid: child.id(),
        cmd: a
            .cmd
            .iter()
            .map(|c| c.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        dram_bytes: sizes.dram,
        page_bytes: sizes.page,
        started: tierstack_node::probe::now_unix(),
        stats_dir: run_dir.0.clone(),
        metrics: a.metrics.clone(),
    };
    let _reg = tierstack_node::runs::register_run(&rec);
    if let Some(l) = metrics_listener {
        if let Err(e) = tierstack_node::metrics::serve_run(l, rec) {
            eprintln!("tierstack: warning: {e}; the run goes on without metrics");
        }
    }
    // Where the program's memory is (its smaps, sampled; only for --stats and --json).
    let sampler = (a.stats || a.json)
        .then(|| tierstack_node::footprint::Sampler::start(child.id(), FOOTPRINT_EVERY));
    let (code, max_rss) = wait_child(child.id())?;
    let footprint = sampler.map(|s| s.finish()).unwrap_or_default();
    let st = tierstack_node::runs::run_counters(&run_dir.0);
    report_run(
        &a,
        &st,
        sizes.dram,
        vram.is_some(),
        code,
        (max_rss, footprint),
    );
    drop(_reg);
    drop(run_dir);
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

/// The sizes `run` passes to the pager, checked: --dram, --page and --threshold.
struct RunSizes {
    dram: u64,
    page: u64,
    threshold: u64,
}

impl RunSizes {
    /// Checks --dram, --page and --threshold and how they fit together.
    fn from_args(a: &RunArgs) -> Result<RunSizes> {
        let dram = crate::size_flag("dram", &a.dram)?;
        let page = crate::size_flag("page", &a.page)?;
        if page == 0 || page % 4096 != 0 || page > tierstack_store::MAX_PAGE as u64 {
            return Err(crate::usage(format!(
                "--page {} is not a multiple of 4K up to 1M: use e.g. --page 4K",
                a.page
            )));
        }
        // What tierstack itself takes out of --dram before any page (issue 41: --dram is the
        // whole footprint), plus 16 pages.
        let min = tierstack_mem::setup::min_dram(page as usize);
        if dram < min {
            return Err(crate::usage(format!(
                "--dram {} is below what tierstack itself needs with --page {} ({}: its DRAM tier, the array's stripe buffers, 1 MiB per paging thread, 16 pages): give at least {}M",
                a.dram,
                a.page,
                fmt_size(min),
                min.div_ceil(1 << 20)
            )));
        }
        let threshold = crate::size_flag("threshold", &a.threshold)?;
        if threshold < 16 << 20 {
            return Err(crate::usage(format!(
                "--threshold {} is below 16M (tierstack's own buffers must stay below it): use e.g. --threshold 64M",
                a.threshold
            )));
        }
        Ok(RunSizes {
            dram,
            page,
            threshold,
        })
    }
}

/// The program's command with the preload shim and every setting of the contract in its
/// environment (--array is checked and opened here).
fn program_command(
    a: &RunArgs,
    program: &std::ffi::OsStr,
    lib: PathBuf,
    sizes: &RunSizes,
    vram: Option<u64>,
) -> Result<std::process::Command> {
    let mut cmd = std::process::Command::new(program);
    cmd.args(&a.cmd[1..]);
    let mut preload = lib.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    // Every setting of the contract is chosen here: none passes through from our caller.
    for v in env::RUN_SETTINGS {
        cmd.env_remove(v.name());
    }
    cmd.env("LD_PRELOAD", preload)
        .env(env::DRAM.name(), sizes.dram.to_string())
        .env(env::PAGE.name(), sizes.page.to_string())
        .env(env::THRESHOLD.name(), sizes.threshold.to_string());
    let tiers = tierstack_store::Tiers {
        vram: vram.map(|bytes| tierstack_store::Vram { gpu: a.gpu, bytes }),
        compress: !a.no_compress,
    };
    cmd.env(env::TIERS.name(), tiers.to_shim());
    if let Some(array) = &a.array {
        if !array.is_file() {
            return Err(crate::usage(format!(
                "--array {}: no array descriptor there: create one with `tierstack array create`",
                array.display()
            )));
        }
        // Open it once here: a wrong or busy array is reported before the program starts.
        tierstack_array::descriptor::open_array(array, &tierstack_array::ArrayOptions::default())
            .with_context(|| format!("--array {}", array.display()))?;
        cmd.env(env::ARRAY.name(), std::fs::canonicalize(array)?);
    }
    Ok(cmd)
}

/// Makes the run folder in --dir (or the temporary folder), warning when that is in RAM;
/// returns the parent folder and the run folder.
fn make_run_dir(dir: Option<&Path>) -> Result<(PathBuf, RunDir)> {
    let parent = dir
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    if !parent.is_dir() {
        return Err(crate::usage(format!(
            "--dir {}: no such folder: create it or give another",
            parent.display()
        )));
    }
    if let Some(t) =
        tierstack_common::mounts::fs_type_of(&parent).filter(|t| t == "tmpfs" || t == "ramfs")
    {
        eprintln!(
            "tierstack: warning: --dir {} is on {t}: what tierstack moves out of DRAM stays in RAM there (no memory is saved); give --dir a folder on a disk or NVMe file system",
            parent.display()
        );
    }
    let run_dir = tempfile::Builder::new()
        .prefix("tierstack-run-")
        .tempdir_in(&parent)
        .with_context(|| format!("cannot make a run folder in {}", parent.display()))?
        .keep();
    Ok((parent, RunDir(run_dir)))
}

/// Starts the program with the signal handling of `run` (127 or 126 as the exit code when it
/// cannot be started).
fn spawn_program(
    cmd: &mut std::process::Command,
    program: &std::ffi::OsStr,
) -> Result<std::process::Child> {
    // The program gets Ctrl-C itself; we wait for it and clean up. SIGTERM and SIGHUP sent to
    // us (`timeout`, `kill`, a scheduler's cancel) are passed on to the program, and we still
    // wait for it and clean up: never an orphan that goes on paging, nor a run folder left.
    // SAFETY: ignoring SIGINT/SIGQUIT and installing a handler that only calls kill(2) on an
    // atomic pid; the child resets all four before exec and sets its parent-death signal
    // (signal(2) and prctl(2) are async-signal-safe).
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            // If `tierstack run` itself dies (kill -9), the program gets SIGTERM instead of
            // paging on with nobody to clean up after it.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong);
            Ok(())
        });
    }
    // As env, timeout and srun: 127 when the program is not found, 126 when it cannot be run.
    let child = cmd.spawn().map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        };
        anyhow::Error::new(crate::Exit {
            code,
            msg: format!("cannot run {}: {e}", program.to_string_lossy()),
        })
    })?;
    PROGRAM_PID.store(child.id() as i32, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: `pass_on` is async-signal-safe (an atomic load and kill(2)).
    unsafe {
        libc::signal(libc::SIGTERM, pass_on as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, pass_on as *const () as libc::sighandler_t);
    }
    Ok(child)
}

/// The end-of-run report on stderr: --stats, --json, and the warning when peak RSS passed
/// --dram by more than the allowance.
/// How often `run --stats`/`--json` samples the program's smaps for its footprint.
const FOOTPRINT_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

fn report_run(
    a: &RunArgs,
    st: &RunCounters,
    dram: u64,
    vram: bool,
    code: i32,
    (max_rss, footprint): (u64, tierstack_node::footprint::Footprint),
) {
    if a.stats {
        eprintln!("{}", stats_line(st, max_rss, code, &footprint));
    }
    let allowance = RSS_ALLOWANCE + if vram { CUDA_ALLOWANCE } else { 0 };
    let over = max_rss.saturating_sub(dram + allowance);
    if a.json {
        let g = |k: &str| st.get(k);
        eprintln!(
            "{}",
            serde_json::json!({
                "exit": code,
                "peak_rss_bytes": max_rss,
                "budget_bytes": dram,
                "allowance_bytes": allowance,
                "over_budget_bytes": over,
                "paged_processes": st.processes(),
                "peak_resident_bytes": g("peak_resident"),
                "index_bytes": g("index_bytes"),
                "faults": g("faults"),
                "bytes_paged_in": g("bytes_in"),
                "bytes_paged_out": g("bytes_out"),
                "store_fault_p50_us": st.fault_quantile_us(0.5),
                "store_fault_p99_us": st.fault_quantile_us(0.99),
                "compressed_hits": g("compressed_hits"),
                "compressed_bytes": g("compressed_bytes"),
                "sweeps": sweeps(st),
                "footprint": footprint,
                "engine": st.engine,
            })
        );
    }
    if over > 0 {
        eprintln!(
            "tierstack: warning: peak RSS {} passed --dram {} by {} more than the {} allowance: memory grew outside tierstack's management ({}); see `tierstack run --help`",
            fmt_size(max_rss),
            fmt_size(dram),
            fmt_size(over),
            fmt_size(allowance),
            if st.processes() == 0 {
                "no process made an allocation of --threshold or more: lower --threshold, or the program reserves and commits address space itself (JVM, V8)"
            } else {
                "allocations below --threshold, or address space the program's runtime reserves and commits itself (JVM, V8)"
            }
        );
    }
}

/// The program `run` started, for [`pass_on`].
static PROGRAM_PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Signal handler of `run` for SIGTERM and SIGHUP: the program gets the signal.
extern "C" fn pass_on(sig: libc::c_int) {
    let pid = PROGRAM_PID.load(std::sync::atomic::Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe; `pid` is our child.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Waits for our child `pid` (not waited for yet): its exit code (128 + signal when killed)
/// and the peak RSS in bytes of it and its waited-for descendants (from `wait4`).
pub fn wait_child(pid: u32) -> Result<(i32, u64)> {
    let pid = pid as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: zeroed rusage is a valid value for wait4 to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waiting for our own child with valid out-pointers.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if r < 0 && e.raw_os_error() != Some(libc::EINTR) {
            bail!("waiting for the program: {e}");
        }
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    };
    Ok((code, ru.ru_maxrss.max(0) as u64 * 1024))
}

/// What `run` lets a process hold above `--dram` before it warns: tierstack's own threads,
/// stacks and buffers, the program's allocations below `--threshold`, and its code.
pub const RSS_ALLOWANCE: u64 = 192 << 20;

/// What `run --vram` adds to [`RSS_ALLOWANCE`]: the NVIDIA driver's own host memory for the
/// process's CUDA context (about 90 MiB measured on an H100 with driver 580).
pub const CUDA_ALLOWANCE: u64 = 128 << 20;

/// The footprint at the largest sample, as words of the stats line.
fn footprint_words(fp: &tierstack_node::footprint::Footprint) -> String {
    if fp.named {
        format!(
            "rss={} paged={} tierstack={} other={}",
            fmt_size(fp.rss_bytes),
            fmt_size(fp.paged_resident_bytes),
            fmt_size(fp.tierstack_bytes),
            fmt_size(fp.other_bytes)
        )
    } else {
        format!(
            "rss={} (no split: this kernel does not name mappings, CONFIG_ANON_VMA_NAME)",
            fmt_size(fp.rss_bytes)
        )
    }
}

/// One line: the program's peak RSS and the sums of its processes' counters.
fn stats_line(
    st: &RunCounters,
    peak_rss: u64,
    code: i32,
    fp: &tierstack_node::footprint::Footprint,
) -> String {
    let procs = st.processes();
    let g = |k: &str| st.get(k);
    let q = |x: f64| {
        st.fault_quantile_us(x)
            .map_or("-".into(), |v| v.to_string())
    };
    format!(
        "tierstack: stats: exit={code} peak_rss={} ({peak_rss} B) paged_processes={procs} budget={} peak_resident={} index={} regions={} faults={} zero_fills={} prefetched={} prefetch_hits={} wp_faults={} scanned_written={} moved_out={} move_failed={} staging_faults={} evictions={} clean_drops={} sync_evictions={} bytes_in={} bytes_out={} store_reads={} store_read_mean_us={:.1} store_fault_mean_us={:.1} store_fault_p50_us={} store_fault_p99_us={} handed_over={} stolen={} compressed_hits={} compressed={} {} at_peak: {}",
        fmt_size(peak_rss),
        fmt_size(st.budget),
        fmt_size(g("peak_resident")),
        fmt_size(g("index_bytes")),
        g("regions"),
        g("faults"),
        g("zero_fills"),
        g("prefetched"),
        g("prefetch_hits"),
        g("wp_faults"),
        g("scanned_written"),
        g("moved_out"),
        g("move_failed"),
        g("staging_faults"),
        g("evictions"),
        g("clean_drops"),
        g("sync_evictions"),
        fmt_size(g("bytes_in")),
        fmt_size(g("bytes_out")),
        g("store_reads"),
        g("store_read_ns") as f64 / g("store_reads").max(1) as f64 / 1000.0,
        g("store_fault_ns") as f64 / g("store_reads").max(1) as f64 / 1000.0,
        q(0.5),
        q(0.99),
        g("handed_over"),
        g("stolen"),
        g("compressed_hits"),
        fmt_size(g("compressed_bytes")),
        sweep_words(&sweeps(st)),
        footprint_words(fp),
    )
}

/// The per-pass figures of swept regions the run's processes reported (see
/// [`RunCounters::sweeps`]); none when no region was swept in a loop larger than the budget.
fn sweeps(st: &RunCounters) -> tierstack_mem::SweepStats {
    st.sweeps
        .clone()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default()
}

/// The per-pass figures as words of the stats line: passes, bytes read and written per pass
/// (smallest/median/largest), what an ideal pager reads per pass, the last passes
/// (read:written).
fn sweep_words(s: &tierstack_mem::SweepStats) -> String {
    if s.sweeps == 0 {
        return "sweeps=0".into();
    }
    // Sizes without their space: each figure stays one word.
    let z = |b: u64| fmt_size(b).replace(' ', "");
    let spread = |a: u64, b: u64, c: u64| format!("{}/{}/{}", z(a), z(b), z(c));
    let last: Vec<String> = s
        .last
        .iter()
        .map(|[r, w]| format!("{}:{}", z(*r), z(*w)))
        .collect();
    format!(
        "sweeps={} sweep_read={} sweep_ideal_read={} sweep_written={} sweep_last={}",
        s.sweeps,
        spread(s.read_min, s.read_median, s.read_max),
        z(s.ideal_read),
        spread(s.written_min, s.written_median, s.written_max),
        last.join(","),
    )
}
