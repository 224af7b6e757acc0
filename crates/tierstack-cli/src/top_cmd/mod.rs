//! `tierstack top`: a live view of every tierstack process on the host, with no daemon of its
//! own. What it shows is built by `tierstack_node::top` (one look, the rates between two, the
//! text of a frame); this file runs the loop, `tui.rs` the interactive view.

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use tierstack_node::top::{frame, parse_interval, render, sample};

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Print plain text frames (as `top -b`) instead of the interactive view.
    #[arg(long)]
    pub batch: bool,
    /// Stop after this many frames (batch mode; the interactive view runs until `q`).
    #[arg(long, short = 'n')]
    pub iterations: Option<u64>,
    /// Time between frames (e.g. 1s, 500ms, 2).
    #[arg(long, short = 'd', default_value = "1s")]
    pub interval: String,
    /// One JSON object per frame, one per line (implies --batch).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: TopArgs) -> Result<()> {
    let interval = parse_interval(&a.interval).map_err(|e| crate::usage(e.to_string()))?;
    if a.iterations == Some(0) {
        return Err(crate::usage(
            "--iterations 0 prints nothing: give 1 or more",
        ));
    }
    let batch = a.batch || a.json || a.iterations.is_some();
    if !batch {
        use std::io::IsTerminal;
        if !std::io::stdout().is_terminal() {
            bail!("standard output is not a terminal: use `tierstack top --batch --iterations N` (or --json) in scripts");
        }
        return tui::run(interval);
    }
    // The first frame's rates cover a short first look (at most 0.5 s), the rest one interval.
    let mut prev = sample();
    std::thread::sleep(interval.min(Duration::from_millis(500)));
    let mut out = std::io::stdout().lock();
    let mut i = 0u64;
    loop {
        let cur = sample();
        let f = frame(&prev, &cur);
        if a.json {
            writeln!(out, "{}", serde_json::to_string(&f)?)?;
        } else {
            if i > 0 {
                writeln!(out)?;
            }
            write!(out, "{}", render(&f))?;
        }
        out.flush()?;
        prev = cur;
        i += 1;
        if a.iterations.is_some_and(|n| i >= n) {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

mod tui;
