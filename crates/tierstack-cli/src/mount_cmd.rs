//! `tierstack mount`, `status`, `drain`, `umount` (the burst-buffer front).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args)]
pub struct MountArgs {
    /// The backing directory (on the parallel file system).
    pub backing: PathBuf,
    /// Where to mount.
    pub mountpoint: PathBuf,
}

#[derive(Args)]
pub struct StatusArgs {
    pub mountpoint: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct DrainArgs {
    pub mountpoint: PathBuf,
    #[arg(long)]
    pub wait: bool,
}

#[derive(Args)]
pub struct UmountArgs {
    pub mountpoint: PathBuf,
}

pub fn mount(_a: MountArgs) -> Result<()> {
    bail!("tierstack mount is not built yet")
}

pub fn status(_a: StatusArgs) -> Result<()> {
    bail!("tierstack status is not built yet")
}

pub fn drain(_a: DrainArgs) -> Result<()> {
    bail!("tierstack drain is not built yet")
}

pub fn umount(_a: UmountArgs) -> Result<()> {
    bail!("tierstack umount is not built yet")
}

/// Internal: the mount daemon (spawned by `tierstack mount`); takes its spec as JSON.
pub fn daemon(_spec: &str) -> Result<()> {
    bail!("the mount daemon is not built yet")
}
