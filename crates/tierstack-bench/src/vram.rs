//! `tierstack bench vram`: what a VRAM tier gives on this machine, per page size. For each
//! size, pages are put into a [`VramTier`] (the tier `mount --vram` and `run --vram` make)
//! over an array of four file drives in `dir`, read back in random order one at a time, and in
//! runs of 64 neighbours (`get_many`, as a stream's read-ahead asks); then the same pages are
//! read from the array alone, the baseline a store without the tier has.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use rand::seq::SliceRandom;
use serde::Serialize;
use tierstack_array::{Array, ArrayOptions, CreateParams, Level};
use tierstack_store::{ArrayTier, Gpu, StoreError, Tier, VramTier};

use crate::error::BenchError;

/// Settings of one `bench vram` run.
#[derive(Debug, Clone)]
pub struct VramBenchOpts {
    /// Folder for the array's drive files (removed afterwards).
    pub dir: PathBuf,
    /// The GPU.
    pub gpu: u32,
    /// Page sizes to measure.
    pub pages: Vec<usize>,
    /// Bytes of pages per size (the tier is made this large, so nothing is evicted).
    pub bytes: u64,
    /// Threads putting and getting.
    pub threads: usize,
}

/// The figures of one page size. Rates in MB/s are 10^6 bytes per second.
#[derive(Debug, Clone, Serialize)]
pub struct VramRow {
    /// Page size, bytes.
    pub page: usize,
    /// Pages of the size.
    pub pages: usize,
    /// Mean time of one put (a copy to the GPU), microseconds, per thread.
    pub put_us: f64,
    /// Bytes put per second, all threads.
    pub put_mb_s: f64,
    /// Mean time of one get from the GPU, microseconds, per thread.
    pub get_us: f64,
    /// Bytes got per second, all threads.
    pub get_mb_s: f64,
    /// Bytes per second of `get_many` in runs of 64 neighbouring pages.
    pub run_get_mb_s: f64,
    /// Mean time of one read of the same page from the array alone, microseconds.
    pub array_get_us: f64,
    /// Bytes per second of those reads.
    pub array_get_mb_s: f64,
    /// array_get_us / get_us.
    pub speedup: f64,
}

/// The figures of `bench vram` (its JSON output).
#[derive(Debug, Clone, Serialize)]
pub struct VramReport {
    /// The GPU's name.
    pub gpu: String,
    /// Threads.
    pub threads: usize,
    /// One row per page size.
    pub rows: Vec<VramRow>,
}

fn store(e: impl Into<StoreError>) -> BenchError {
    BenchError::Store(e.into())
}

/// Runs `f(thread, index)` for every index below `n`, split over `threads` threads; returns
/// the seconds taken.
fn timed(
    threads: usize,
    n: usize,
    f: impl Fn(usize) -> Result<(), BenchError> + Sync,
) -> Result<f64, BenchError> {
    let t0 = Instant::now();
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| s.spawn(move || (t..n).step_by(threads).try_for_each(f)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(store(StoreError::Config(
                        "a benchmark thread panicked".into(),
                    )))
                })
            })
            .collect::<Result<Vec<()>, BenchError>>()
    })?;
    Ok(t0.elapsed().as_secs_f64())
}

/// Runs the benchmark.
pub fn run(o: &VramBenchOpts) -> Result<VramReport, BenchError> {
    let gpu = Gpu::open(o.gpu).map_err(store)?;
    let name = gpu.name().to_string();
    let threads = o.threads.max(1);
    let mut rows = Vec::new();
    for &page in &o.pages {
        let n = (o.bytes / page as u64).max(64) as usize;
        let work = tempfile::Builder::new()
            .prefix("tierstack-bench-vram-")
            .tempdir_in(&o.dir)
            .map_err(tierstack_common::io_err("create a folder in", &o.dir))?;
        let paths: Vec<PathBuf> = (0..4).map(|i| work.path().join(format!("d{i}"))).collect();
        let params = CreateParams {
            level: Level::Raid5,
            chunk: 64 << 10,
            groups: None,
            size: Some((n as u64 * page as u64).max(64 << 20) + (256 << 20)),
        };
        let array =
            Arc::new(Array::create(&paths, &params, &ArrayOptions::default()).map_err(store)?);
        let tier = VramTier::new(
            gpu.clone(),
            (n * page) as u64 + (8 << 20),
            Box::new(ArrayTier::shared(array.clone())),
        )
        .map_err(store)?;
        let data: Vec<u8> = (0..page).map(|i| (i * 7 + 3) as u8).collect();
        let put_s = timed(threads, n, |i| {
            tier.put((1, i as u64), &data).map_err(store)
        })?;
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rand::thread_rng());
        let get = |i: usize| match tier.get((1, order[i] as u64)).map_err(store)? {
            Some(v) if v.len() == page => Ok(()),
            _ => Err(store(StoreError::Config(format!(
                "page {} came back wrong",
                order[i]
            )))),
        };
        let get_s = timed(threads, n, get)?;
        let runs = n / 64;
        let run_s = timed(threads, runs, |r| {
            let keys: Vec<(u64, u64)> = (0..64).map(|j| (1, (r * 64 + j) as u64)).collect();
            let got = tier.get_many(&keys).map_err(store)?;
            if got
                .iter()
                .all(|v| v.as_ref().is_some_and(|v| v.len() == page))
            {
                Ok(())
            } else {
                Err(store(StoreError::Config("a run came back wrong".into())))
            }
        })?;
        // The same pages from the array alone (they are written there first).
        tier.flush().map_err(store)?;
        let array_s = timed(threads, n, |i| {
            match array.get((1, order[i] as u64)).map_err(store)? {
                Some(v) if v.len() == page => Ok(()),
                _ => Err(store(StoreError::Config(format!(
                    "page {} is wrong on the array",
                    order[i]
                )))),
            }
        })?;
        let bytes = (n * page) as f64;
        let per_op = |s: f64, ops: usize| s * 1e6 * threads as f64 / ops.max(1) as f64;
        let get_us = per_op(get_s, n);
        let array_get_us = per_op(array_s, n);
        rows.push(VramRow {
            page,
            pages: n,
            put_us: per_op(put_s, n),
            put_mb_s: bytes / put_s / 1e6,
            get_us,
            get_mb_s: bytes / get_s / 1e6,
            run_get_mb_s: (runs * 64 * page) as f64 / run_s / 1e6,
            array_get_us,
            array_get_mb_s: bytes / array_s / 1e6,
            speedup: array_get_us / get_us.max(1e-9),
        });
    }
    Ok(VramReport {
        gpu: name,
        threads,
        rows,
    })
}

/// The report as a table.
pub fn render(r: &VramReport) -> String {
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|x| {
            vec![
                crate::fmt_size(x.page as u64),
                x.pages.to_string(),
                format!("{:.1}", x.put_us),
                format!("{:.0}", x.put_mb_s),
                format!("{:.1}", x.get_us),
                format!("{:.0}", x.get_mb_s),
                format!("{:.0}", x.run_get_mb_s),
                format!("{:.1}", x.array_get_us),
                format!("{:.0}", x.array_get_mb_s),
                format!("{:.1}", x.speedup),
            ]
        })
        .collect();
    format!(
        "bench vram: {}, {} thread(s); the VRAM tier over an array of 4 file drives, against the array alone\n{}",
        r.gpu,
        r.threads,
        crate::table::render(
            &[
                "page", "pages", "put us", "put MB/s", "get us", "get MB/s", "runs of 64 MB/s",
                "array get us", "array MB/s", "get speedup",
            ],
            &rows,
        )
    )
}
