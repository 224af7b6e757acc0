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
