//! The one place where a process's paging store is made from a DRAM budget: what
//! `tierstack run` builds (through the preload shim) and what `tierstack bench mem`'s
//! tierstack engine measures are the same array, store and budget split by construction.
//!
//! - The array: RAID 5 over four file drives in a folder (three data drives; each drive holds
//!   a third of the store plus 64 MiB of room for the log's cleaner), or a given array. The
//!   chunk is at least the page (a page is one request to one drive), 64 KiB to 1 MiB.
//! - The budget: `--dram` covers everything tierstack holds for the process. The store's own
//!   DRAM tier (a write buffer in front of the array) takes 1/64 of it, at least 1 MiB (and
//!   four pages) and at most 64 MiB; the array's stripe buffers (an open stripe and those in flight) come out of
//!   it too; the rest, at least four pages, is the budget of the regions' resident pages.
//! - The compressed tier (`tierstack_store::CompressedTier`, on unless `--no-compress`): pages
//!   the store's DRAM tier evicts stay in process memory LZ4-compressed when they compress to
//!   half or less (by their arena block), up to [`COMPRESSED_SHARE`] of the resident budget. What it holds is charged to the
//!   regions' budget as it grows (with the array's index), so an incompressible working set
//!   leaves it empty and resident memory as large as without it.
//! - Regions may commit half of the array's capacity (the log needs room to clean).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tierstack_array::{Array, ArrayOptions, CreateParams, Level};
use tierstack_store::TieredStore;

use crate::{MemError, PagerOptions, Result};

/// The page `run` uses unless told otherwise: a random access reads at most twice what it
/// touches; a sequential stream grows its read unit to runs of pages (see the pager's
/// read-ahead). 4 KiB, the hardware page: a random miss reads only what it touches. Since
/// loops larger than memory keep part of the loop resident, 4 KiB is also faster than 8 KiB
/// for butterflies and within a few percent for streams (docs/BENCHMARKS.md). The array's
/// index costs about 50 bytes per stored page in DRAM (outside the budget).
pub const DEFAULT_PAGE: usize = 4096;

/// [`DEFAULT_PAGE`] as the `--page` options of `run` and `bench mem` write their default.
pub const DEFAULT_PAGE_ARG: &str = "4K";

/// Bytes of paging store the preload shim makes when `run` does not say (`_TIERSTACK_SHIM_STORE`).
pub const DEFAULT_STORE: u64 = 64 << 30;

/// The paging store `run` makes in the folder `dir` unless told (`--store`): half of the
/// free space there (8 GiB assumed where it cannot be read), in whole GiB, at least 1 GiB, at
/// most 1 TiB. The drives are sparse files: only what is written takes disk.
pub fn default_store_in(dir: &Path) -> u64 {
    let free = rustix::fs::statvfs(dir)
        .ok()
        .map(|st| st.f_bavail * st.f_frsize);
    ((free.unwrap_or(8 << 30) / 2) & !((1 << 30) - 1)).clamp(1 << 30, 1 << 40)
}

/// The store `bench mem` makes in `dir` for a map of `map` bytes: what `run` would make
/// there, or twice the map where that is more (regions may commit half of the array).
pub fn store_bytes_for(dir: &Path, map: u64) -> u64 {
    default_store_in(dir).max(map.saturating_mul(2))
}

/// What a paging engine was built as: `tierstack run` publishes it for each paged process
/// and `bench mem` reports it for its tierstack engine, so that the two can be compared.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EngineConfig {
    /// RAID level of the paging array.
    pub level: u32,
    /// Drives of the paging array.
    pub drives: usize,
    /// The array's chunk, bytes.
    pub chunk: usize,
    /// The array's capacity, bytes.
    pub capacity_bytes: u64,
    /// The page (unit of faulting and eviction), bytes.
    pub page: usize,
    /// The `--dram` budget the engine was given.
    pub dram_bytes: u64,
    /// The store's own DRAM tier, out of `dram_bytes`.
    pub store_dram_bytes: u64,
    /// The regions' resident budget, out of `dram_bytes`.
    pub budget_bytes: u64,
    /// Bytes of regions the store may hold.
    pub commit_limit_bytes: Option<u64>,
    /// Bytes of GPU memory between the store's DRAM tier and the array (`--vram`; outside
    /// `dram_bytes`), 0 for none.
    #[serde(default)]
    pub vram_bytes: u64,
    /// The most the compressed tier may hold, out of `dram_bytes` (charged to the regions'
    /// budget as it fills); 0 with `--no-compress`.
    #[serde(default)]
    pub compressed_bytes: u64,
    /// What `dram_bytes` reserves for the pager's threads ([`THREAD_BYTES`] each).
    #[serde(default)]
    pub threads_bytes: u64,
}

/// The compressed tier may grow to the resident pages' budget (what is left of `--dram` after
/// the store's DRAM tier and the array's buffers) times this share (three quarters): it is
/// charged to that budget as it fills, and it fills only with pages that leave DRAM while the working
/// set overflows the budget, where a page kept at 2:1 costs a decompression instead of a drive
/// read (`tierstack_store::compressed::keeps`). A quarter stays for resident pages whatever
/// compresses: the pages a program is working on right now are read without a fault.
pub const COMPRESSED_SHARE: (u64, u64) = (3, 4);

/// The optional tiers of the paging store (`run --vram`, `--no-compress`): seed 000's GPU
/// buffer in front of the swap RAID, the compressed tier of [`COMPRESSED_SHARE`] of `--dram`.
pub use tierstack_store::{Tiers, Vram};

/// The configuration [`store_over`] gives an engine over `array` with `dram`, `page` and the
/// optional `tiers`.
pub fn engine_config(array: &Array, dram: u64, page: usize, tiers: Tiers) -> EngineConfig {
    let st = array.status();
    // The pager's threads are counted in `dram`; how many depends on the budget before them.
    let threads = crate::pager_threads(
        split_budget(dram, array.buffer_bytes(), page, 0).1,
        crate::default_fault_threads(),
    );
    let (store_dram, budget) = split_budget(dram, array.buffer_bytes(), page, threads);
    EngineConfig {
        level: st.level,
        drives: st.drives_total,
        chunk: st.chunk,
        capacity_bytes: st.capacity_bytes,
        page,
        dram_bytes: dram,
        store_dram_bytes: store_dram,
        budget_bytes: budget,
        commit_limit_bytes: Some(st.capacity_bytes / 2),
        vram_bytes: tiers.vram.map_or(0, |v| v.bytes),
        threads_bytes: threads as u64 * THREAD_BYTES,
        compressed_bytes: if tiers.compress {
            budget / COMPRESSED_SHARE.1 * COMPRESSED_SHARE.0
        } else {
            0
        },
    }
}

/// Stripes the paging array writes at once: two rather than four. Each holds a 5.4 MiB stripe
/// image out of `--dram`; the write-back of paging (at most a few hundred MB/s here) keeps
/// two busy at most, and the 11 MiB go to resident pages.
pub const STRIPES_IN_FLIGHT: usize = 2;

/// Below this `--dram`, the paging array writes one stripe at a time ([`stripes_in_flight`]).
pub const SMALL_BUDGET: u64 = 256 << 20;

/// Stripes in flight for a process with `dram` bytes: [`STRIPES_IN_FLIGHT`], or one under
/// [`SMALL_BUDGET`], where a third stripe image (5.4 MiB) would be a tenth or more of the
/// budget (the seed's simulator at `--dram 48M` had 25-28 MiB for resident pages).
pub fn stripes_in_flight(dram: u64) -> usize {
    if dram < SMALL_BUDGET {
        1
    } else {
        STRIPES_IN_FLIGHT
    }
}

/// The RAID level `run` pages to.
pub const LEVEL: Level = Level::Raid5;
/// Drives of the array `run` makes.
pub const DRIVES: usize = 4;

/// The chunk of the paging array for `page`.
pub fn chunk_for(page: usize) -> usize {
    page.clamp(64 << 10, 1 << 20).next_power_of_two()
}

/// What each of tierstack's threads in a paged process costs in memory outside the pages:
/// the touched part of its stack and the malloc arena glibc gives each thread that allocates
/// (0.8 to 1.1 MiB each, measured from `/proc/PID/smaps` under `run --dram 32M`). `--dram`
/// counts it: [`split_budget`] takes it out of the regions' budget.
pub const THREAD_BYTES: u64 = 1 << 20;

/// The least `--dram` a process can page with at page size `page` (bytes): what the budget's
/// split takes before any resident page (the store's smallest DRAM tier, the paging array's
/// stripe buffers at a small budget, the pager's threads with their smallest number of
/// prefetch threads) plus 16 pages. Below it the split would leave the regions nothing and
/// the process would pass `--dram`: `run` refuses such a `--dram` naming this minimum.
pub fn min_dram(page: usize) -> u64 {
    let buffers = tierstack_array::Geometry::new(LEVEL, DRIVES, chunk_for(page), None, 1 << 30)
        .map_or(0, |g| {
            ((stripes_in_flight(0) + 1) * DRIVES * g.stripe_drive_bytes()) as u64
        });
    let store_dram = (1u64 << 20).max(4 * page as u64);
    let threads = crate::pager_threads(0, crate::default_fault_threads()) as u64;
    store_dram + buffers + threads * THREAD_BYTES + 16 * page as u64
}

/// How `dram` is split: (the store's DRAM tier, the regions' budget), given the array's
/// stripe buffers, the page size and the pager's `threads` ([`THREAD_BYTES`] each).
pub fn split_budget(dram: u64, stripe_buffers: u64, page: usize, threads: usize) -> (u64, u64) {
    // A sixty-fourth of the budget, at least 1 MiB and four pages: under small budgets every
    // MiB the write buffer does not need holds resident pages instead (qrack_qft.py 23 under
    // `--dram 48M`: 1 MiB instead of 4 left 36 MiB to pages instead of 33 and ran 8 % faster).
    let floor = (1u64 << 20).max(4 * page as u64);
    let store_dram = (dram / 64).clamp(floor, 64 << 20);
    let budget = dram
        .saturating_sub(store_dram + stripe_buffers + threads as u64 * THREAD_BYTES)
        .max(4 * page as u64);
    (store_dram, budget)
}

/// Creates the paging array of a process with `dram` bytes: `level` over [`DRIVES`] file
/// drives `dir/prefix-d0..` sized so that the data drives hold `store_bytes` (plus room to
/// clean). Returns the array and the drive paths (the caller decides when the names go).
pub fn create_array(
    dir: &Path,
    prefix: &str,
    store_bytes: u64,
    level: Level,
    page: usize,
    dram: u64,
) -> Result<(Array, Vec<PathBuf>)> {
    let paths: Vec<PathBuf> = (0..DRIVES)
        .map(|i| dir.join(format!("{prefix}d{i}")))
        .collect();
    let data_drives = match level {
        Level::Raid0 => DRIVES as u64,
        Level::Raid1 => 1,
        Level::Raid10 => DRIVES as u64 / 2,
        Level::Raid6 => DRIVES as u64 - 2,
        _ => DRIVES as u64 - 1,
    };
    let params = CreateParams {
        level,
        chunk: chunk_for(page),
        groups: None,
        size: Some((store_bytes / data_drives).max(64 << 20) + (64 << 20)),
    };
    let opts = ArrayOptions {
        stripes_in_flight: stripes_in_flight(dram),
        ..ArrayOptions::default()
    };
    let array = Array::create(&paths, &params, &opts).map_err(|e| {
        MemError::Config(format!(
            "cannot create the paging array in {}: {e}",
            dir.display()
        ))
    })?;
    Ok((array, paths))
}

/// The store over `array` and the pager options for a process with `dram` bytes.
pub fn store_and_options(
    array: Array,
    dram: u64,
    page: usize,
    tiers: Tiers,
) -> Result<(Arc<TieredStore>, PagerOptions)> {
    store_over(Arc::new(array), &[], dram, page, tiers)
}

/// [`store_and_options`] for a process that also reads pages from `snapshots` (read-only
/// views of its ancestors' arrays as they were when it was forked, newest first): they are
/// read after the array, never written.
pub fn store_over(
    array: Arc<Array>,
    snapshots: &[Arc<Array>],
    dram: u64,
    page: usize,
    tiers: Tiers,
) -> Result<(Arc<TieredStore>, PagerOptions)> {
    let cfg = engine_config(&array, dram, page, tiers);
    let store = tierstack_store::StackSpec::new(cfg.store_dram_bytes)
        .array(array)
        .tiers(&tiers, cfg.compressed_bytes)
        .snapshots(snapshots)
        .build()?;
    Ok((
        Arc::new(store),
        PagerOptions {
            page,
            budget: cfg.budget_bytes,
            fault_threads: crate::default_fault_threads(),
            commit_limit: cfg.commit_limit_bytes,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_option_default_is_the_default_page() {
        assert_eq!(
            tierstack_common::size::parse_size(DEFAULT_PAGE_ARG),
            Ok(DEFAULT_PAGE as u64)
        );
    }

    #[test]
    fn the_budget_rule() {
        let (s, b) = split_budget(512 << 20, 28 << 20, 64 << 10, 0);
        assert_eq!(s, 8 << 20);
        assert_eq!(b, (512 - 8 - 28) << 20);
        // Small budgets keep four pages; large ones cap the store's DRAM at 64 MiB.
        assert_eq!(split_budget(8 << 20, 28 << 20, 4096, 5).1, 4 * 4096);
        assert_eq!(split_budget(64 << 30, 0, 4096, 11).0, 64 << 20);
        // Small budgets: a write buffer of 1 MiB, or four pages of a large page size.
        assert_eq!(split_budget(48 << 20, 0, 4096, 5).0, 1 << 20);
        assert_eq!(split_budget(48 << 20, 0, 1 << 20, 5).0, 4 << 20);
        // The least --dram: with 4K pages, 1 MiB of DRAM tier, two stripes of 4 x 22 chunks
        // of 64K, the threads and 16 pages; it grows with the page (the chunk follows it).
        let threads = crate::pager_threads(0, crate::default_fault_threads()) as u64;
        assert_eq!(
            min_dram(4096),
            (1 << 20) + 2 * 4 * 22 * (64 << 10) + threads * THREAD_BYTES + 16 * 4096
        );
        assert!(min_dram(1 << 20) > 2 * min_dram(4096));
        // Each of the pager's threads takes 1 MiB of the budget.
        assert_eq!(split_budget(48 << 20, 0, 4096, 5).1, (48 - 1 - 5) << 20);
        assert_eq!(chunk_for(4096), 64 << 10);
        assert_eq!(chunk_for(256 << 10), 256 << 10);
    }

    #[test]
    fn builds_a_raid5_store() {
        let t = tempfile::tempdir().expect("tempdir");
        let (a, paths) =
            create_array(t.path(), "x-", 256 << 20, LEVEL, 64 << 10, 1 << 30).expect("array");
        assert_eq!(paths.len(), DRIVES);
        assert_eq!(a.status().level, 5);
        let (store, o) =
            store_and_options(a, 256 << 20, 64 << 10, Tiers::default()).expect("store");
        let names: Vec<String> = store.status().into_iter().map(|s| s.name).collect();
        assert_eq!(names[1], "compressed", "{names:?}");
        assert!(o.budget > 128 << 20 && o.budget < 256 << 20, "{}", o.budget);
        assert!(o.commit_limit.is_some_and(|c| c >= 128 << 20));
    }
}
