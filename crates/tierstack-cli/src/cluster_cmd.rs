//! `tierstack bench cluster`: seed 004's experiment at N nodes on the multi-node test bed.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tierstack_bench::cluster;

#[derive(Args)]
pub struct BenchClusterArgs {
    /// Compute nodes of the test bed (1 to 8; the probe runs in its control namespace).
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Ranks per node, each writing a file of its own.
    #[arg(long, default_value_t = 4)]
    pub ranks: usize,
    /// Bytes each rank writes into its file.
    #[arg(long, default_value = "32M")]
    pub size_per_rank: String,
    /// Small files each rank writes after its file (the many-small-files variant).
    #[arg(long, default_value_t = 0)]
    pub small_files: usize,
    /// Bytes of each small file.
    #[arg(long, default_value = "4K")]
    pub small_size: String,
    /// MB/s of each chunkserver of the shared file system (0: unlimited).
    #[arg(long, default_value_t = 50)]
    pub throttle: u32,
    /// Chunkservers of the shared file system.
    #[arg(long, default_value_t = 2)]
    pub chunkservers: usize,
    /// Also run the buffered mode with K site-wide drain slots (`mount --drain-slots`).
    #[arg(long, value_name = "K")]
    pub slots: Option<u32>,
    /// The test bed's folder (made, and removed at the end).
    #[arg(long, default_value = "/var/tmp/tierstack-bench-cluster")]
    pub root: PathBuf,
    /// Leave the test bed up at the end (`contrib/testbed/testbed.sh down --root ROOT/bed`).
    #[arg(long)]
    pub keep: bool,
    /// Instead of the writes: every node stages in the same inputs (the shared system's read
    /// bytes, the time, each node's copy checked), each node reading the shared system, then
    /// by fan-out (`stage in --fanout`).
    #[arg(long)]
    pub stage_in: bool,
    /// With --stage-in: input files.
    #[arg(long, default_value_t = 4, requires = "stage_in")]
    pub input_files: usize,
    /// With --stage-in: bytes of each input file.
    #[arg(long, default_value = "32M", requires = "stage_in")]
    pub input_size: String,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn bench(a: BenchClusterArgs) -> Result<()> {
    if !(1..=8).contains(&a.nodes) {
        return Err(crate::usage(format!(
            "--nodes {} is out of range: give 1 to 8 (the test bed holds 8 nodes)",
            a.nodes
        )));
    }
    if a.ranks == 0 {
        return Err(crate::usage("--ranks 0: give at least one rank per node"));
    }
    if !rustix::process::geteuid().is_root() {
        return Err(crate::usage(
            "bench cluster builds a test bed of namespaces, loop devices and a MooseFS: run it as root",
        ));
    }
    let spec = cluster::ClusterSpec {
        exe: std::env::current_exe().context("cannot find the tierstack binary")?,
        root: a.root,
        nodes: a.nodes,
        ranks: a.ranks,
        size_per_rank: crate::size_flag("size-per-rank", &a.size_per_rank)?,
        small_files: a.small_files,
        small_size: crate::size_flag("small-size", &a.small_size)? as usize,
        throttle: a.throttle,
        chunkservers: a.chunkservers.clamp(1, 7),
        slots: a.slots.filter(|k| *k > 0),
        keep: a.keep,
        stage_in: if a.stage_in {
            Some((
                a.input_files.max(1),
                crate::size_flag("input-size", &a.input_size)?,
            ))
        } else {
            None
        },
    };
    let r = cluster::run(&spec)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", cluster::table(&r));
    }
    if let Some(si) = &r.stage_in {
        for m in &si.modes {
            if m.nodes_identical != r.nodes
                || m.dirty_bytes + m.pending_ops > 0
                || !m.inputs_unchanged
            {
                anyhow::bail!(
                    "stage-in ({}): {} of {} nodes' copies match the inputs, {} dirty bytes and {} pending operations in the buffers, inputs in the shared system {}: see the logs under the test bed's root (--keep)",
                    m.mode,
                    m.nodes_identical,
                    r.nodes,
                    m.dirty_bytes,
                    m.pending_ops,
                    if m.inputs_unchanged { "unchanged" } else { "changed" }
                );
            }
        }
    }
    let bad: u64 = r.modes.iter().map(|m| m.missing + m.wrong).sum();
    if bad > 0 {
        anyhow::bail!(
            "{bad} files in the shared system are missing or differ from what the ranks wrote"
        );
    }
    Ok(())
}
