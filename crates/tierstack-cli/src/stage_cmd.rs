//! `tierstack stage in|out` and `tierstack bench checkpoint`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args)]
pub struct StageArgs {
    /// `in` (into the job's fast tier) or `out` (to the backing directory).
    pub direction: String,
    pub src: Option<PathBuf>,
    pub dst: Option<PathBuf>,
}

#[derive(Args)]
pub struct BenchCheckpointArgs {
    #[arg(long)]
    pub json: bool,
}

pub fn stage(_a: StageArgs) -> Result<()> {
    bail!("tierstack stage is not built yet")
}

pub fn bench_checkpoint(_a: BenchCheckpointArgs) -> Result<()> {
    bail!("tierstack bench checkpoint is not built yet")
}

/// Internal: one writer process of `bench checkpoint`.
pub fn checkpoint_writer(_spec: &str) -> Result<()> {
    bail!("tierstack bench checkpoint is not built yet")
}
