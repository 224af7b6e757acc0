//! `tierstack bench vram`: the VRAM tier per page size against the array alone.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use tierstack_bench::vram;

#[derive(Args)]
pub struct BenchVramArgs {
    /// Page sizes, comma-separated (4K is `run`'s default page, 1M the mount's).
    #[arg(long, default_value = "4K,64K,1M")]
    pub page: String,
    /// Bytes of pages per size (the tier holds them all: this measures its copies, not its
    /// evictions).
    #[arg(long, default_value = "256M")]
    pub size: String,
    /// Threads putting and getting.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// The GPU (0 is the first; `tierstack doctor` lists them).
    #[arg(long, default_value_t = 0)]
    pub gpu: u32,
    /// Folder for the array's drive files (removed afterwards).
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn bench(a: BenchVramArgs) -> Result<()> {
    let pages = a
        .page
        .split(',')
        .map(|p| {
            let b = crate::size_flag("page", p.trim())?;
            if b == 0 || b > tierstack_store::MAX_PAGE as u64 {
                usage_bail!("--page {p}: give sizes from 1 byte to 1M, e.g. --page 4K,64K,1M");
            }
            Ok(b as usize)
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = crate::size_flag("size", &a.size)?;
    if a.threads == 0 || a.threads > 64 {
        usage_bail!("--threads {} is out of range: give 1 to 64", a.threads);
    }
    crate::mount_cmd::check_gpu("bench vram", a.gpu, bytes + (64 << 20))?;
    let r = vram::run(&vram::VramBenchOpts {
        dir: a.dir,
        gpu: a.gpu,
        pages,
        bytes,
        threads: a.threads,
    })
    .map_err(anyhow::Error::msg)?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", vram::render(&r));
    }
    Ok(())
}
