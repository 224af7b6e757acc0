//! The `tierstack` command.

#![warn(clippy::too_many_lines)]

/// Returns early with a usage error (exit status 2): a bad option value, named with its fix.
macro_rules! usage_bail {
    ($($t:tt)*) => {
        return Err($crate::usage(format!($($t)*)))
    };
}

mod array_cmd;
mod buffers_cmd;
mod checkpoint_cmd;
mod cluster_cmd;
mod config;
mod cost_cmd;
mod demo;
mod doctor_cmd;
mod exec_cmd;
mod export_cmd;
mod exporter_cmd;
mod fanout_cmd;
mod install_cmd;
mod io_cmd;
mod mem_cmd;
mod meta_cmd;
mod mount_cmd;
mod run_cmd;
mod slurm_cmd;
mod stage_cmd;
mod top_cmd;
mod vram_cmd;
mod workloads_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// An error that ends the command with its own exit status: 2 for a usage error (a bad
/// size, duration or combination of options), 126/127 for a program `run` cannot execute or
/// find (as env, timeout and srun).
#[derive(Debug)]
pub struct Exit {
    /// The process's exit status.
    pub code: u8,
    /// The one line shown.
    pub msg: String,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Exit {}

/// A usage error (exit status 2).
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Exit {
        code: 2,
        msg: msg.into(),
    })
}

/// A flag set by Ctrl-C (SIGINT) and SIGTERM; a second Ctrl-C ends the process at once.
pub fn cancel_flag() -> anyhow::Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 1, std::sync::Arc::clone(&flag))
            .map_err(|e| anyhow::anyhow!("cannot install the Ctrl-C handler: {e}"))?;
        signal_hook::flag::register(sig, std::sync::Arc::clone(&flag))
            .map_err(|e| anyhow::anyhow!("cannot install the Ctrl-C handler: {e}"))?;
    }
    Ok(flag)
}

/// A node service's error at the edge: a bad value is a usage error (exit 2).
pub fn node_err(e: tierstack_node::NodeError) -> anyhow::Error {
    match e {
        tierstack_node::NodeError::Usage(m) => usage(m),
        e => anyhow::Error::new(e),
    }
}

/// `--metrics ADDR:PORT`, bound (a bad or busy address is a usage error).
pub fn metrics_bind(addr: &str) -> anyhow::Result<std::net::TcpListener> {
    tierstack_node::metrics::bind(addr).map_err(node_err)
}

/// The size given to `--FLAG` (8G, 512M, 4096...), or a usage error naming the flag.
pub fn size_flag(flag: &str, s: &str) -> anyhow::Result<u64> {
    tierstack_common::parse_size(s).map_err(|e| usage(format!("--{flag}: {e}")))
}

#[derive(Parser)]
#[command(name = "tierstack", version = env!("TIERSTACK_VERSION"), about = "Tiered memory and storage accelerator for HPC and AI nodes: a user-space software RAID under a write-back store", long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create, inspect and repair user-space RAID arrays.
    #[command(subcommand)]
    Array(array_cmd::ArrayCmd),
    /// Benchmarks that print each figure next to its baseline from the same run.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Run an unmodified program with a DRAM budget; the rest of its large allocations is
    /// paged to the array (userfaultfd, LD_PRELOAD).
    Run(run_cmd::RunArgs),
    /// Mount a burst buffer over a backing directory (FUSE); writes land in the fast tier and
    /// drain to the backing directory in the background.
    Mount(mount_cmd::MountArgs),
    /// What a mount holds and how much is still waiting to drain.
    Status(mount_cmd::StatusArgs),
    /// Start (or wait for) the drain of a mount to its backing directory.
    Drain(mount_cmd::DrainArgs),
    /// Drain everything, then unmount.
    Umount(mount_cmd::UmountArgs),
    /// Copy inputs into a mount before a job (`in`) or outputs to the backing directory (`out`).
    Stage(stage_cmd::StageArgs),
    /// Run a command whose calls on files under a mount are served by the mount's daemon
    /// over shared memory (the interception client, libtierstack_io.so), not through FUSE.
    Exec(exec_cmd::ExecArgs),
    /// SLURM burst_buffer/lua integration: `install`, `uninstall` and the hooks it calls.
    #[command(subcommand)]
    Slurm(slurm_cmd::SlurmCmd),
    /// Internal: the mount daemon (takes its spec as JSON).
    #[command(hide = true)]
    MountDaemon {
        spec: String,
        /// Serve Prometheus metrics at ADDR:PORT (from `mount --metrics`).
        #[arg(long)]
        metrics: Option<String>,
    },
    /// Live view of every tierstack mount and `run` on this host (`q` quits).
    Top(top_cmd::TopArgs),
    /// The fast tiers this node holds, mounted or not; recover the undrained ones after a
    /// restart, remove the drained ones.
    Buffers(buffers_cmd::BuffersArgs),
    /// The configuration: every key's value and where it came from (`config show`).
    #[command(subcommand)]
    Config(config::ConfigCmd),
    /// One Prometheus endpoint for every mount and `run` of this node, labelled with mount
    /// point, SLURM job and user (in the foreground until SIGTERM or Ctrl-C).
    Exporter(exporter_cmd::ExporterArgs),
    /// Serve a mount to other nodes over NFSv4 through NFS-Ganesha (`--stop` ends it).
    Export(export_cmd::ExportArgs),
    /// Check this host for what tierstack needs and seed 002's tuning advice.
    Doctor(doctor_cmd::DoctorArgs),
    /// Seed 002's server cost model: relative cost, saving, cost per unit of work.
    Cost(cost_cmd::CostArgs),
    /// A tour of the product on file drives in a temporary folder: `run`, `mount`, `array`.
    Demo {
        /// Run one part only.
        #[arg(long, value_enum)]
        only: Option<demo::Part>,
        /// Where to make the demo's temporary folder (default: $TMPDIR or /tmp).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Size of each of the demo's five drives.
        #[arg(long, default_value = "256M")]
        size: String,
    },
    /// Internal: write the man pages and shell completions (`make install` calls it).
    #[command(hide = true)]
    GenDocs(install_cmd::GenDocsArgs),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Raw drives against the array on the same drives: write, read, random reads, degraded
    /// read, rebuild, XOR rate.
    Array(array_cmd::BenchArrayArgs),
    /// pmbench-style page-access latency: accesses/s and log2 latency histograms.
    Mem(mem_cmd::BenchMemArgs),
    /// Seed 004's experiment: N processes each write and fsync one file, straight into the
    /// backing directory and through a tierstack mount; output time, drain time, speedup.
    Checkpoint(checkpoint_cmd::BenchCheckpointArgs),
    /// Seed 001's IOR-style sweep, transfer size x MPI ranks (mpirun), straight into a folder
    /// and through a tierstack mount over it: IOR's summary table, grids, mount / plain.
    Io(io_cmd::BenchIoArgs),
    /// mdtest's method: N processes create, stat, read and unlink their files, in the plain
    /// folder and through a tierstack mount over it; rates per phase and mount / plain.
    Meta(meta_cmd::BenchMetaArgs),
    /// Seed 004's experiment at N nodes on a multi-node test bed with a real shared file
    /// system (MooseFS): file per process straight into it and through node-local buffers,
    /// the time until everything is there, and what the drains cost another job's metadata
    /// latency (needs root, FUSE, the MooseFS packages and python3)
    Cluster(cluster_cmd::BenchClusterArgs),
    /// The VRAM tier per page size (copies to and from the GPU) against the array alone.
    Vram(vram_cmd::BenchVramArgs),
    /// What a scrape of the node's exporter costs per mount: M real mounts of F files each,
    /// their drains running, scraped S times (target <= 5 ms per mount; needs root or FUSE)
    Exporter(exporter_cmd::BenchExporterArgs),
    /// Real small-file programs (tar + git, pip install + import, h5py, MPI per-rank logs) in
    /// a plain folder and through a fresh mount at its defaults on the same disk: seconds per
    /// phase, plain / mount, the drain apart (needs FUSE)
    Workloads(workloads_cmd::BenchWorkloadsArgs),
    /// Internal: one worker process of `bench meta` (takes its spec as JSON).
    #[command(hide = true)]
    MetaWorker { spec: String },
    /// Internal: one writer process of `bench checkpoint` (takes its spec as JSON).
    #[command(hide = true)]
    CheckpointWriter { spec: String },
    /// Internal: the measured process of `bench mem` (takes its spec as JSON).
    #[command(hide = true)]
    MemWorker { spec: String },
}

/// How most progress bars are drawn: `[===>   ]`.
const BAR_CHARS: &str = "=> ";

/// The style of every progress bar: `template` in indicatif's syntax, the bar drawn with
/// `chars` (indicatif's default style should the template not parse).
fn bar_style(template: &str, chars: &str) -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template(template)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars(chars)
}

/// Whether this invocation is one of tierstack's own internal processes (a mount daemon, a
/// benchmark's worker, `gen-docs`): they take everything from their parent (spec, variables)
/// and read no configuration file.
fn internal(args: &[std::ffi::OsString]) -> bool {
    let a = |i: usize| args.get(i).and_then(|s| s.to_str()).unwrap_or("");
    matches!(a(1), "mount-daemon" | "gen-docs")
        || (a(1) == "bench" && a(2).ends_with("-worker"))
        || (a(1) == "bench" && a(2) == "checkpoint-writer")
}

/// Prints a command-line error as one line (clap's first line, the problem, and where to
/// read about the fix) and gives exit status 2; help and version are printed as clap prints
/// them.
fn parse_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    let text = e.to_string();
    let first: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.trim())
        .collect();
    let joined = first.join(" ");
    let msg = joined.trim_start_matches("error: ");
    eprintln!("tierstack: error: {msg} (see `tierstack --help` and the command's --help)");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The configuration's layers become the flags' defaults (and the `[global]` variables),
    // before the log filter is read and before any thread starts.
    let mut root = config::annotate(Cli::command());
    let cfg = if internal(&args) {
        config::Config::none()
    } else {
        match config::Config::load(&root) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("tierstack: error: {e}");
                return ExitCode::from(2);
            }
        }
    };
    root = cfg.apply(root);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TIERSTACK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: a daemon's log file, journald or a pipe
        // gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = match root
        .clone()
        .try_get_matches_from(&args)
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(c) => c,
        Err(e) => return parse_error(e),
    };
    if !matches!(cli.cmd, Cmd::MountDaemon { .. }) {
        // Like Unix tools, end quietly when the reader of our output goes away
        // (`tierstack status | head -1`) instead of panicking on EPIPE. The mount daemon
        // keeps the runtime's default (ignored: a closed control connection is an error).
        // SAFETY: setting a signal's disposition to its default before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let res = match cli.cmd {
        Cmd::Array(c) => array_cmd::run(c),
        Cmd::Bench(BenchCmd::Array(a)) => array_cmd::bench(a),
        Cmd::Bench(BenchCmd::Mem(a)) => mem_cmd::bench(a),
        Cmd::Bench(BenchCmd::MemWorker { spec }) => mem_cmd::worker(&spec),
        Cmd::Bench(BenchCmd::Checkpoint(a)) => checkpoint_cmd::bench_checkpoint(a),
        Cmd::Bench(BenchCmd::CheckpointWriter { spec }) => checkpoint_cmd::checkpoint_writer(&spec),
        Cmd::Bench(BenchCmd::Io(a)) => io_cmd::bench(a),
        Cmd::Bench(BenchCmd::Meta(a)) => meta_cmd::bench(a),
        Cmd::Bench(BenchCmd::Cluster(a)) => cluster_cmd::bench(a),
        Cmd::Bench(BenchCmd::Exporter(a)) => exporter_cmd::bench(a),
        Cmd::Bench(BenchCmd::Vram(a)) => vram_cmd::bench(a),
        Cmd::Bench(BenchCmd::Workloads(a)) => workloads_cmd::bench(a),
        Cmd::Bench(BenchCmd::MetaWorker { spec }) => meta_cmd::worker(&spec),
        Cmd::Run(a) => run_cmd::run(a),
        Cmd::Exec(a) => exec_cmd::exec(a),
        Cmd::Mount(a) => mount_cmd::mount(a),
        Cmd::Status(a) => mount_cmd::status(a),
        Cmd::Drain(a) => mount_cmd::drain(a),
        Cmd::Umount(a) => mount_cmd::umount(a),
        Cmd::Stage(a) => stage_cmd::stage(a),
        Cmd::Slurm(c) => slurm_cmd::run(c),
        Cmd::MountDaemon { spec, metrics } => mount_cmd::daemon(&spec, metrics.as_deref()),
        Cmd::Top(a) => top_cmd::run(a),
        Cmd::Config(c) => config::run(c, &cfg, &root),
        Cmd::Doctor(a) => doctor_cmd::run(a),
        Cmd::Exporter(a) => exporter_cmd::run(a),
        Cmd::Export(a) => export_cmd::run(a),
        Cmd::Buffers(a) => buffers_cmd::run(a),
        Cmd::Cost(a) => cost_cmd::run(a),
        Cmd::Demo { only, dir, size } => demo::run(dir, &size, only),
        Cmd::GenDocs(a) => install_cmd::gen_docs(config::annotate(Cli::command()), a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes.
            let mut msg = e.to_string();
            for cause in e.chain().skip(1) {
                let c = cause.to_string();
                if !msg.contains(&c) {
                    msg.push_str(": ");
                    msg.push_str(&c);
                }
            }
            eprintln!("tierstack: error: {msg}");
            match e.chain().find_map(|c| c.downcast_ref::<Exit>()) {
                Some(x) => ExitCode::from(x.code),
                None => ExitCode::FAILURE,
            }
        }
    }
}
