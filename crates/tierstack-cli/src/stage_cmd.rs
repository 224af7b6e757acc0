//! `tierstack stage in|out`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use indicatif::ProgressBar;

use tierstack_stage as stage;

#[derive(Args)]
pub struct StageArgs {
    /// `in` (inputs into the job's mount: each copy is read back once so the mount caches
    /// it) or `out` (outputs to the backing directory).
    #[arg(value_parser = ["in", "out"])]
    pub direction: String,
    /// A file or a directory tree; with --manifest, the root the manifest's sources are
    /// relative to.
    pub src: PathBuf,
    /// Where the copy goes (a directory's contents go into DST); with --manifest, the root
    /// the manifest's destinations are relative to.
    pub dst: PathBuf,
    /// File of `SRC DST` lines (relative paths; `#` comments; see the README).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Files copied at the same time.
    #[arg(long, default_value_t = 8)]
    pub jobs: usize,
    /// Read every copy back and compare its xxh3 checksum with the source's.
    #[arg(long)]
    pub verify: bool,
    /// Print what was done as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Keep FILE up to date (a few times a second, replaced atomically) with the progress as
    /// JSON: `{"done":BYTES,"total":BYTES,"bytes":BYTES,"files":N}`; done and total
    /// count every pass (the copy, and the read back or verification), bytes is the data. `tierstack slurm get-status` shows it.
    #[arg(long, value_name = "FILE")]
    pub progress_file: Option<PathBuf>,
    #[command(flatten)]
    pub fanout: crate::fanout_cmd::FanoutArgs,
}

/// Writes `tierstack stage --progress-file`: at most every 200 ms from the copy threads.
struct ProgressFile {
    path: PathBuf,
    total: u64,
    bytes: u64,
    files: usize,
    done: std::sync::atomic::AtomicU64,
    last: std::sync::Mutex<std::time::Instant>,
}

impl ProgressFile {
    fn add(&self, n: u64) {
        use std::sync::atomic::Ordering;
        self.done.fetch_add(n, Ordering::Relaxed);
        let Ok(mut last) = self.last.try_lock() else {
            return;
        };
        if last.elapsed() >= std::time::Duration::from_millis(200) {
            *last = std::time::Instant::now();
            let _ = self.write();
        }
    }

    /// Replaces the file (temporary name in the same folder, then rename).
    fn write(&self) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        let text = serde_json::json!({
            "done": self.done.load(Ordering::Relaxed),
            "total": self.total,
            "bytes": self.bytes,
            "files": self.files,
        })
        .to_string();
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.path)
    }
}

pub fn stage(a: StageArgs) -> Result<()> {
    if a.jobs == 0 || a.jobs > 1024 {
        usage_bail!("--jobs {} is out of range: use 1 to 1024", a.jobs);
    }
    if a.fanout.fanout.is_some() {
        if a.direction != "in" || a.manifest.is_some() || a.progress_file.is_some() {
            usage_bail!("--fanout goes with `stage in SRC DST` alone (no --manifest, no --progress-file): drop those flags or --fanout");
        }
        return crate::fanout_cmd::stage_in(&a.src, &a.dst, &a.fanout, a.json);
    }
    let plan = stage_plan(&a)?;
    let opts = stage::Options {
        jobs: a.jobs,
        verify: a.verify,
        read_back: a.direction == "in",
    };
    let passes = if opts.verify || opts.read_back { 2 } else { 1 };
    let bar = stage_bar(&a, &plan, &opts, passes);
    let progress = progress_file(&a, &plan, passes)?;
    let cancel = crate::cancel_flag()?;
    let t = std::time::Instant::now();
    let r = stage::execute(
        &plan,
        &opts,
        &|n| {
            bar.inc(n);
            if let Some(p) = &progress {
                p.add(n);
            }
        },
        &cancel,
    );
    bar.finish_and_clear();
    if let Some(p) = &progress {
        let _ = p.write();
    }
    let r = r?;
    let secs = t.elapsed().as_secs_f64();
    if a.json {
        print_stage_json(&a, &r, secs);
    } else {
        print_stage_text(&a, &r, secs);
    }
    Ok(())
}

/// What to copy: from --manifest, or SRC to DST.
fn stage_plan(a: &StageArgs) -> Result<stage::Plan> {
    Ok(match &a.manifest {
        Some(m) => {
            let text = std::fs::read_to_string(m).map_err(|e| {
                anyhow::anyhow!(
                    "cannot read the manifest {}: {e}: check the path",
                    m.display()
                )
            })?;
            stage::plan_manifest(&a.src, &a.dst, &text)?
        }
        None => stage::plan_paths(&a.src, &a.dst)?,
    })
}

/// The progress bar of a stage: every pass over the plan's bytes.
fn stage_bar(a: &StageArgs, plan: &stage::Plan, opts: &stage::Options, passes: u64) -> ProgressBar {
    let bar = ProgressBar::new(plan.bytes() * passes);
    bar.set_style(crate::bar_style(
        "{msg} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        crate::BAR_CHARS,
    ));
    bar.set_message(format!(
        "stage {} {} files{}",
        a.direction,
        plan.files.len(),
        if opts.verify {
            ", copy + verify"
        } else if opts.read_back {
            ", copy + read back"
        } else {
            ""
        }
    ));
    bar
}

/// The --progress-file, written once at the start (so a bad path fails before the copy).
fn progress_file(a: &StageArgs, plan: &stage::Plan, passes: u64) -> Result<Option<ProgressFile>> {
    let progress = a.progress_file.as_ref().map(|p| ProgressFile {
        path: p.clone(),
        total: plan.bytes() * passes,
        bytes: plan.bytes(),
        files: plan.files.len(),
        done: 0.into(),
        last: std::sync::Mutex::new(std::time::Instant::now()),
    });
    if let Some(p) = &progress {
        p.write().map_err(|e| {
            anyhow::anyhow!(
                "cannot write --progress-file {}: {e}: give a writable path",
                p.path.display()
            )
        })?;
    }
    Ok(progress)
}

/// Paths left out or copied as files, with why, as JSON.
fn skipped_json(v: &[stage::Skipped]) -> Vec<serde_json::Value> {
    v.iter()
        .map(|x| serde_json::json!({"path": x.path.to_string_lossy(), "reason": x.reason}))
        .collect()
}

/// Prints what a stage did as one JSON object.
fn print_stage_json(a: &StageArgs, r: &stage::Report, secs: f64) {
    println!(
        "{}",
        serde_json::json!({
            "direction": a.direction,
            "files": r.files,
            "bytes": r.bytes,
            "sparse_bytes": r.sparse_bytes,
            "dirs": r.dirs,
            "symlinks": r.symlinks,
            "hardlinks": r.hardlinks,
            "specials": r.specials,
            "verified": r.verified,
            "read_back_bytes": r.read_back_bytes,
            "skipped": skipped_json(&r.skipped),
            "hardlinks_copied": skipped_json(&r.hardlinks_copied),
            "seconds": secs,
            "mb_s": if secs > 0.0 { r.bytes as f64 / 1e6 / secs } else { 0.0 },
        })
    );
}

/// Prints what a stage did as a summary line, then one line per path not copied as it was.
fn print_stage_text(a: &StageArgs, r: &stage::Report, secs: f64) {
    let mut extra = String::new();
    if r.hardlinks > 0 {
        extra += &format!(", {} hard links", r.hardlinks);
    }
    if r.specials > 0 {
        extra += &format!(", {} special files", r.specials);
    }
    println!(
        "staged {} {} files ({}{}), {} links{}, {} directories in {:.2} s{}{}{}",
        a.direction,
        r.files,
        tierstack_bench::fmt_size(r.bytes),
        if r.sparse_bytes > 0 {
            format!(
                ", {} of it holes",
                tierstack_bench::fmt_size(r.sparse_bytes)
            )
        } else {
            String::new()
        },
        r.symlinks,
        extra,
        r.dirs,
        secs,
        if a.verify {
            format!(", {} checksums verified", r.verified)
        } else {
            String::new()
        },
        if r.hardlinks_copied.is_empty() {
            String::new()
        } else {
            format!(", {} hard links copied as files", r.hardlinks_copied.len())
        },
        if r.skipped.is_empty() {
            String::new()
        } else {
            format!(", {} skipped", r.skipped.len())
        }
    );
    for x in &r.hardlinks_copied {
        println!("copied, not linked: {}: {}", x.path.display(), x.reason);
    }
    for x in &r.skipped {
        println!("skipped: {}: {}", x.path.display(), x.reason);
    }
}
