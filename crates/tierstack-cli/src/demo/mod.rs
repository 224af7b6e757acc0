//! `tierstack demo`: a tour of the product on embedded defaults, in a temporary folder.
//!
//! Three parts, each with a heading, what the user is looking at, the commands to do it
//! themselves and measured figures: memory beyond DRAM (`tierstack run` on a real program
//! whose working set is four times its budget, against the same program in plain DRAM), the
//! burst buffer (`tierstack mount` over a throttled backing file system, a file-per-process
//! checkpoint, `status` while the drain runs, `umount`, every byte checked in the backing),
//! and the array (RAID 5 on file drives: failure, degraded read, rebuild, scrub, bench).
//!
//! A part whose requirement is missing is skipped with a line saying what is missing; a
//! failed check fails the demo (non-zero exit) after the other parts ran. Everything is made
//! in one temporary folder that is removed at the end, also after Ctrl-C (the first Ctrl-C
//! stops the demo between steps and cleans up; a second one ends it at once).

mod array;
mod mount;
mod run;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// One part of the tour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// Memory beyond DRAM: `tierstack run`.
    Run,
    /// The burst buffer: `tierstack mount`, `status`, `umount`.
    Mount,
    /// The user-space RAID: `tierstack array`.
    Array,
}

impl Part {
    fn title(self) -> &'static str {
        match self {
            Part::Run => "Memory beyond DRAM: tierstack run",
            Part::Mount => "Burst buffer: tierstack mount over a slow parallel file system",
            Part::Array => "User-space RAID: tierstack array",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Part::Run => "An unmodified program allocates four times the DRAM it is given; tierstack pages the rest to an array of file drives (userfaultfd), and the result must equal the plain run's.",
            Part::Mount => "Checkpoint writers write into a tierstack mount at fast-tier speed while tierstack drains to a throttled backing file system in the background; afterwards the backing must hold every byte.",
            Part::Array => "A RAID 5 of five file drives: objects stored and read back, a drive failed and read degraded, replaced and rebuilt, flipped bytes found and repaired by scrub.",
        }
    }
}

/// How a part ended.
pub enum Outcome {
    Done,
    /// A requirement is missing: the line says which and how to get it.
    Skipped(String),
}

/// Prints a step of a part.
fn step(s: &str) {
    println!("\n-- {s}");
}

/// Prints the commands a user would type to do a part themselves.
fn commands(cmds: &[String]) {
    println!("Do it yourself:");
    for c in cmds {
        println!("  $ {c}");
    }
}

/// Stops between steps after Ctrl-C.
fn check_cancel(cancel: &AtomicBool) -> Result<()> {
    if cancel.load(Ordering::Relaxed) {
        bail!("interrupted (Ctrl-C): the demo's folder, mounts and processes were cleaned up");
    }
    Ok(())
}

pub fn run(dir: Option<PathBuf>, size: &str, only: Option<Part>) -> Result<()> {
    let size = crate::size_flag("size", size)?;
    if size < 64 << 20 {
        usage_bail!("--size is below 64M: give each demo drive at least 64M (e.g. --size 256M)");
    }
    let cancel = crate::cancel_flag()?;
    let parent = dir.unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    // Everything the demo makes lives in here and goes with it.
    let tmp = tempfile::Builder::new()
        .prefix("tierstack-demo-")
        .tempdir_in(&parent)
        .with_context(|| format!("cannot make a folder in {}", parent.display()))?;
    let dir = tmp.path().to_path_buf();
    let parts: Vec<Part> = match only {
        Some(p) => vec![p],
        None => vec![Part::Run, Part::Mount, Part::Array],
    };
    println!(
        "tierstack demo: {} in {} (removed at the end)",
        parts
            .iter()
            .map(|p| format!("{p:?}").to_lowercase())
            .collect::<Vec<_>>()
            .join(", "),
        dir.display()
    );
    let t0 = Instant::now();
    let mut results = Vec::new();
    for (i, &p) in parts.iter().enumerate() {
        check_cancel(&cancel)?;
        println!("\n=== {}/{}  {}", i + 1, parts.len(), p.title());
        println!("{}", p.what());
        let t = Instant::now();
        let r = match p {
            Part::Run => run::part(&dir, &cancel),
            Part::Mount => mount::part(&dir, &cancel),
            Part::Array => array::part(&dir, size),
        };
        check_cancel(&cancel)?;
        let secs = t.elapsed().as_secs_f64();
        let line = match &r {
            Ok(Outcome::Done) => format!("ok ({secs:.1} s)"),
            Ok(Outcome::Skipped(why)) => format!("SKIPPED: {why}"),
            Err(e) => format!("FAILED: {e:#}"),
        };
        println!("\n{}: {line}", p.title());
        results.push((p, r.is_err(), line));
    }
    println!("\n=== Summary ({:.0} s)", t0.elapsed().as_secs_f64());
    for (p, _, line) in &results {
        println!("  {:<6} {line}", format!("{p:?}").to_lowercase());
    }
    let failed: Vec<String> = results
        .iter()
        .filter(|r| r.1)
        .map(|r| format!("{:?}", r.0).to_lowercase())
        .collect();
    drop(tmp);
    if !failed.is_empty() {
        bail!("demo: the {} part failed (see above)", failed.join(" and "));
    }
    Ok(())
}
