//! `tierstack run`: an unmodified program with a DRAM budget, paged to the array.

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args)]
pub struct RunArgs {
    #[arg(long)]
    pub dram: String,
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

pub fn run(_a: RunArgs) -> Result<()> {
    bail!("tierstack run is not built yet")
}
