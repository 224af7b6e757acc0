//! The one place where a process's paging store is made from a DRAM budget: what
//! `tierstack run` builds (through the preload shim) and what `tierstack bench mem`'s
//! tierstack engine measures are the same array, store and budget split by construction.
//!
//! - The array: RAID 5 over four file drives in a folder (three data drives; each drive holds
//!   a third of the store plus 64 MiB of room for the log's cleaner), or a given array. The
//!   chunk is at least the page (a page is one request to one drive), 64 KiB to 1 MiB.
//! - The budget: `--dram` covers everything tierstack holds for the process. The store's own
//!   DRAM tier (a write buffer in front of the array) takes 1/64 of it, at least 4 MiB and at
//!   most 64 MiB; the array's stripe buffers (an open stripe and those in flight) come out of
//!   it too; the rest, at least four pages, is the budget of the regions' resident pages.
//! - Regions may commit half of the array's capacity (the log needs room to clean).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tierstack_array::{Array, ArrayOptions, CreateParams, Level};
use tierstack_store::{ArrayTier, Tier, TieredStore};

use crate::{MemError, PagerOptions, Result};

/// The page `run` uses unless told otherwise: a random access reads at most twice what it
/// touches; a sequential stream grows its read unit to runs of pages (see the pager's
/// read-ahead). 8 KiB rather than 4 KiB: the array's index costs about 50 bytes per page in
/// DRAM (outside the budget), and on the 2-vCPU test machine 8 KiB was as fast for random
/// access and faster for streams (docs/BENCHMARKS.md).
pub const DEFAULT_PAGE: usize = 8192;

/// The RAID level `run` pages to.
pub const LEVEL: Level = Level::Raid5;
/// Drives of the array `run` makes.
pub const DRIVES: usize = 4;

/// The chunk of the paging array for `page`.
pub fn chunk_for(page: usize) -> usize {
    page.clamp(64 << 10, 1 << 20).next_power_of_two()
}

/// How `dram` is split: (the store's DRAM tier, the regions' budget), given the array's
/// stripe buffers and the page size.
pub fn split_budget(dram: u64, stripe_buffers: u64, page: usize) -> (u64, u64) {
    let store_dram = (dram / 64).clamp(4 << 20, 64 << 20);
    let budget = dram
        .saturating_sub(store_dram + stripe_buffers)
        .max(4 * page as u64);
    (store_dram, budget)
}

/// Creates the paging array: `level` over [`DRIVES`] file drives `dir/prefix-d0..` sized so
/// that the data drives hold `store_bytes` (plus room to clean). Returns the array and the
/// drive paths (the caller decides when the names go).
pub fn create_array(
    dir: &Path,
    prefix: &str,
    store_bytes: u64,
    level: Level,
    page: usize,
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
    let array = Array::create(&paths, &params, &ArrayOptions::default()).map_err(|e| {
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
) -> Result<(Arc<TieredStore>, PagerOptions)> {
    store_over(Arc::new(array), &[], dram, page)
}

/// [`store_and_options`] for a process that also reads pages from `snapshots` (read-only
/// views of its ancestors' arrays as they were when it was forked, newest first): they are
/// read after the array, never written.
pub fn store_over(
    array: Arc<Array>,
    snapshots: &[Arc<Array>],
    dram: u64,
    page: usize,
) -> Result<(Arc<TieredStore>, PagerOptions)> {
    let capacity = array.status().capacity_bytes;
    let (store_dram, budget) = split_budget(dram, array.buffer_bytes(), page);
    let mut tiers: Vec<Box<dyn Tier>> = vec![Box::new(ArrayTier::shared(array))];
    for s in snapshots {
        tiers.push(Box::new(ArrayTier::shared(s.clone())));
    }
    let store = TieredStore::new(store_dram, tiers).map_err(|e| MemError::Config(e.to_string()))?;
    Ok((
        Arc::new(store),
        PagerOptions {
            page,
            budget,
            fault_threads: crate::default_fault_threads(),
            commit_limit: Some(capacity / 2),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_rule() {
        let (s, b) = split_budget(512 << 20, 28 << 20, 64 << 10);
        assert_eq!(s, 8 << 20);
        assert_eq!(b, (512 - 8 - 28) << 20);
        // Small budgets keep four pages; large ones cap the store's DRAM at 64 MiB.
        assert_eq!(split_budget(8 << 20, 28 << 20, 4096).1, 4 * 4096);
        assert_eq!(split_budget(64 << 30, 0, 4096).0, 64 << 20);
        assert_eq!(chunk_for(4096), 64 << 10);
        assert_eq!(chunk_for(256 << 10), 256 << 10);
    }

    #[test]
    fn builds_a_raid5_store() {
        let t = tempfile::tempdir().expect("tempdir");
        let (a, paths) = create_array(t.path(), "x-", 256 << 20, LEVEL, 64 << 10).expect("array");
        assert_eq!(paths.len(), DRIVES);
        assert_eq!(a.status().level, 5);
        let (_store, o) = store_and_options(a, 256 << 20, 64 << 10).expect("store");
        assert!(o.budget > 128 << 20 && o.budget < 256 << 20, "{}", o.budget);
        assert!(o.commit_limit.is_some_and(|c| c >= 128 << 20));
    }
}
