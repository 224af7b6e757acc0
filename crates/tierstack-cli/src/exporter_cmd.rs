//! `tierstack exporter`: one Prometheus endpoint for every mount and `tierstack run` of this
//! node (`tierstack_node::exporter`), in the foreground until SIGTERM or Ctrl-C.

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use tierstack_node::exporter::{bind, serve_node, DEFAULT_LISTEN};

#[derive(Args, Debug)]
pub struct ExporterArgs {
    /// Serve `GET /metrics` at ADDR:PORT (9469: beside node_exporter's 9100, dcgm-exporter's
    /// 9400 and the `--metrics` examples' 9464).
    #[arg(long, value_name = "ADDR:PORT", default_value = DEFAULT_LISTEN)]
    pub listen: String,
}

pub fn run(a: ExporterArgs) -> Result<()> {
    let stop = crate::cancel_flag()?;
    let listener = bind(&a.listen).map_err(crate::node_err)?;
    let addr = listener.local_addr()?;
    let first = serve_node(listener).map_err(crate::node_err)?;
    eprintln!(
        "tierstack exporter: serving http://{addr}/metrics for the mounts and runs of {} ({} mounts, {} runs now)",
        tierstack_fs::mount::run_dir().display(),
        first.mounts,
        first.runs
    );
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("tierstack exporter: stopped");
    Ok(())
}

/// `tierstack bench exporter`.
#[derive(Args)]
pub struct BenchExporterArgs {
    /// Mounts to make and scrape.
    #[arg(long, default_value_t = 20)]
    pub mounts: usize,
    /// Files of 4 KiB written into each mount (their drains run during the scrapes).
    #[arg(long, default_value_t = 10_000)]
    pub files: usize,
    /// Scrapes, 200 ms apart.
    #[arg(long, default_value_t = 30)]
    pub scrapes: usize,
    /// The work folder (made, and removed at the end; it must not exist).
    #[arg(long, default_value = "/var/tmp/tierstack-bench-exporter")]
    pub dir: std::path::PathBuf,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn bench(a: BenchExporterArgs) -> Result<()> {
    use anyhow::Context;
    if a.mounts == 0 || a.files == 0 {
        return Err(crate::usage(
            "--mounts and --files must be at least 1 (the target is per mount, with files draining)",
        ));
    }
    if a.dir.exists() {
        return Err(crate::usage(format!(
            "{} exists: give a --dir that does not (the benchmark removes it at the end)",
            a.dir.display()
        )));
    }
    let spec = tierstack_bench::exporter::ExporterSpec {
        exe: std::env::current_exe().context("cannot find the tierstack binary")?,
        root: a.dir,
        mounts: a.mounts,
        files: a.files,
        scrapes: a.scrapes,
    };
    let r = tierstack_bench::exporter::run(&spec)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", tierstack_bench::exporter::table(&r));
    }
    Ok(())
}
