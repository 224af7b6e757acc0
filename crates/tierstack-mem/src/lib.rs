//! tierstack-mem: memory larger than DRAM with userfaultfd.
//!
//! A [`Pager`] is the process's paging engine: one userfaultfd, several fault threads, an
//! evictor thread, and **one DRAM budget over all its regions**. A [`Region`] is an anonymous
//! mapping registered with that userfaultfd (missing and write-protect faults) whose pages
//! (the tierstack page size, default 4 KiB) live in the tiered store when not resident.
//!
//! - A missing fault is served from the store (`UFFDIO_COPY`) or with the zero page when the
//!   page was never written (or was evicted all-zero). The store read happens outside the
//!   region's lock, so other faults proceed meanwhile.
//! - Pages that came in on a read fault are write-protected before the faulting thread wakes:
//!   the first write is a write-protect fault that marks the page dirty. Clean pages are
//!   dropped on eviction without a write; all-zero pages are never written. Where the kernel
//!   has async write-protect, `PAGEMAP_SCAN` and `UFFDIO_MOVE` (6.8+), writes take no fault
//!   to the pager and eviction finds written pages in batches instead ([`DirtyTracking`];
//!   `TIERSTACK_MEM_WP=fault|async` chooses).
//! - The evictor keeps resident bytes under the high watermark (the budget less a slack of 1 %
//!   of it, at least four prefetch windows, at most a tenth), evicting in clock (FIFO) order
//!   down to the low watermark (two slacks under the budget): dirty victims are write-protected
//!   (a writer racing the eviction waits in a write-protect fault), copied to the store, and
//!   each batch is released with one `MADV_DONTNEED` per run of adjacent pages. A fault that
//!   would pass the budget itself evicts first, so resident bytes stay within the budget plus
//!   one page per fault thread.
//! - Fault streams with a constant stride (sequential, backwards, strided) are detected per
//!   region and prefetched ahead (a window that doubles on each hit). The read unit adapts: a
//!   fault that continues a forward sequential stream reads the pages after it with it (a run
//!   of up to 256 KiB: one request per drive through `Array::get_many`, one `UFFDIO_COPY`),
//!   prefetches of adjacent pages go as runs too, and a random fault reads one page.
//! - `map` refuses a region the store could not hold (`commit_limit`): allocation failure up
//!   front instead of a page that cannot be written out later.
//!
//! Lock order: region state, then the clock. The evictor never holds the clock while it takes
//! a region lock. No lock is held across a store read or write.

#![warn(missing_docs)]

mod cpu;
/// The gate `fork` closes.
pub mod gate;
mod pager;
/// Building a process's paging store from a DRAM budget.
pub mod setup;
/// The userfaultfd interface.
pub mod uffd;

pub use cpu::register_current_thread;
pub use pager::WP_ENV;
pub use pager::{
    default_fault_threads, pager_threads, DirtyTracking, Pager, PagerOptions, PagerReport, Region,
    RegionOptions, Reporter, SweepStats, LAST_PASSES,
};

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What paging can fail with.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// A bad page size, budget or option.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The userfaultfd could not be made or used: what was being done, the kernel's error.
    #[error("userfaultfd: {what}: {source}")]
    Uffd {
        /// What failed (with the fix where there is one).
        what: &'static str,
        /// The kernel's error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel refused a mapping.
    #[error("mmap: {0}")]
    Map(#[source] std::io::Error),
    /// A pager thread could not be started.
    #[error("cannot start a pager thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The tier stack below the pager could not be built.
    #[error("the store: {0}")]
    Store(#[from] tierstack_store::StoreError),
    /// The store cannot hold another region of this size.
    #[error("the store cannot back {want} more bytes ({committed} of {limit} committed)")]
    NoSpace {
        /// Bytes asked for.
        want: u64,
        /// Bytes of regions mapped now.
        committed: u64,
        /// The pager's commit limit.
        limit: u64,
    },
}

/// Paging's results.
pub type Result<T, E = MemError> = std::result::Result<T, E>;

/// Counters of a pager (all its regions).
#[derive(Debug, Default)]
pub struct MemCounters {
    /// Missing faults (the program touched a page that was not resident).
    pub faults: AtomicU64,
    /// Missing faults on never-written pages, filled with zeros.
    pub zero_fills: AtomicU64,
    /// Write-protect faults (the first write to a clean resident page).
    pub wp_faults: AtomicU64,
    /// Pages evicted.
    pub evictions: AtomicU64,
    /// Pages mapped ahead of a fault stream.
    pub prefetched: AtomicU64,
    /// Prefetched pages the stream then went past (the program used them without a fault).
    pub prefetch_hits: AtomicU64,
    /// Evictions of clean pages, dropped without a write.
    pub clean_drops: AtomicU64,
    /// Evictions of all-zero pages (not stored).
    pub zero_evictions: AtomicU64,
    /// Evictions done by a fault thread because the evictor had not kept up.
    pub sync_evictions: AtomicU64,
    /// Bytes read from the store.
    pub bytes_in: AtomicU64,
    /// Bytes written to the store.
    pub bytes_out: AtomicU64,
    /// Missing faults served by a read from the store (not zero fills, not prefetched).
    pub store_reads: AtomicU64,
    /// Time those reads took, in all.
    pub store_read_ns: AtomicU64,
    /// Time from taking such a fault to the call that wakes the program, in all.
    pub store_fault_ns: AtomicU64,
    /// The same times, one by one, in the shared latency buckets.
    pub fault_latency: tierstack_common::AtomicHistogram,
    /// `madvise(MADV_DONTNEED)` calls made to release pages.
    pub madvise_calls: AtomicU64,
    /// Faults handed by the fault thread that read them to the one on the faulting thread's
    /// CPU.
    pub handed_over: AtomicU64,
    /// Handed faults that another fault thread served after 15 us because
    /// their owner had not taken them.
    pub stolen: AtomicU64,
    /// Pages `PAGEMAP_SCAN` found written at eviction (async write-protect).
    pub scanned_written: AtomicU64,
    /// Pages eviction moved out of the program's mapping with `UFFDIO_MOVE` (async
    /// write-protect).
    pub moved_out: AtomicU64,
    /// Pages `UFFDIO_MOVE` refused as shared with a forked process, made private by a write
    /// fault that writes nothing (`MADV_POPULATE_WRITE`) and moved then.
    pub move_unshared: AtomicU64,
    /// Victims eviction left resident because `UFFDIO_MOVE` would not take them (async
    /// write-protect: a page still in the program's reach cannot be dropped safely).
    pub move_failed: AtomicU64,
    /// Pages `UFFDIO_MOVE` moved while answering an error (see the pager's eviction), found
    /// in the staging slot and counted moved.
    pub move_misreported: AtomicU64,
    /// Faults the kernel raised in the staging area (a program's `mlockall` faulting every
    /// mapping in), ended with a zero page.
    pub staging_faults: AtomicU64,
    /// Highest resident bytes seen.
    pub peak_resident: AtomicU64,
    /// Regions mapped so far.
    pub regions: AtomicU64,
    /// DRAM the store's index holds (last reading), charged to the budget: resident pages
    /// get the budget less this.
    pub index_bytes: AtomicU64,
}

/// A plain copy of [`MemCounters`] (for printing and JSON); each field as there.
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct MemStats {
    pub faults: u64,
    pub zero_fills: u64,
    pub wp_faults: u64,
    pub evictions: u64,
    pub prefetched: u64,
    pub prefetch_hits: u64,
    pub clean_drops: u64,
    pub zero_evictions: u64,
    pub sync_evictions: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    #[serde(default)]
    pub store_reads: u64,
    #[serde(default)]
    pub store_read_ns: u64,
    #[serde(default)]
    pub store_fault_ns: u64,
    /// Faults served from the store per latency bucket (not cumulative; bounds:
    /// `tierstack_common::LATENCY_BOUNDS_US`, then the overflow bucket).
    #[serde(default)]
    pub fault_latency_buckets: Vec<u64>,
    pub madvise_calls: u64,
    #[serde(default)]
    pub handed_over: u64,
    #[serde(default)]
    pub stolen: u64,
    #[serde(default)]
    pub scanned_written: u64,
    #[serde(default)]
    pub moved_out: u64,
    #[serde(default)]
    pub move_unshared: u64,
    #[serde(default)]
    pub move_failed: u64,
    #[serde(default)]
    pub move_misreported: u64,
    #[serde(default)]
    pub staging_faults: u64,
    pub peak_resident: u64,
    pub regions: u64,
    #[serde(default)]
    pub index_bytes: u64,
    /// Reads the store's compressed tier served (filled in by the pager's report).
    #[serde(default)]
    pub compressed_hits: u64,
    /// Bytes of the compressed tier's blocks in use (likewise).
    #[serde(default)]
    pub compressed_bytes: u64,
    /// Per-pass volumes of regions swept in a loop larger than the budget (filled in by the
    /// pager's report).
    #[serde(default)]
    pub sweeps: SweepStats,
}

impl MemCounters {
    /// The counters now.
    pub fn snapshot(&self) -> MemStats {
        MemStats {
            faults: self.faults.load(Relaxed),
            zero_fills: self.zero_fills.load(Relaxed),
            wp_faults: self.wp_faults.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            prefetched: self.prefetched.load(Relaxed),
            prefetch_hits: self.prefetch_hits.load(Relaxed),
            clean_drops: self.clean_drops.load(Relaxed),
            zero_evictions: self.zero_evictions.load(Relaxed),
            sync_evictions: self.sync_evictions.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            bytes_out: self.bytes_out.load(Relaxed),
            store_reads: self.store_reads.load(Relaxed),
            store_read_ns: self.store_read_ns.load(Relaxed),
            store_fault_ns: self.store_fault_ns.load(Relaxed),
            fault_latency_buckets: self.fault_latency.counts(),
            madvise_calls: self.madvise_calls.load(Relaxed),
            handed_over: self.handed_over.load(Relaxed),
            stolen: self.stolen.load(Relaxed),
            scanned_written: self.scanned_written.load(Relaxed),
            moved_out: self.moved_out.load(Relaxed),
            move_unshared: self.move_unshared.load(Relaxed),
            move_failed: self.move_failed.load(Relaxed),
            move_misreported: self.move_misreported.load(Relaxed),
            staging_faults: self.staging_faults.load(Relaxed),
            peak_resident: self.peak_resident.load(Relaxed),
            regions: self.regions.load(Relaxed),
            index_bytes: self.index_bytes.load(Relaxed),
            compressed_hits: 0,
            compressed_bytes: 0,
            sweeps: SweepStats::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MemError;
    use std::error::Error as _;

    /// The kernel's error stays the cause (for `anyhow`'s chain at the CLI), not a string.
    #[test]
    fn errors_keep_their_cause() {
        let e = MemError::Uffd {
            what: "register",
            source: std::io::Error::from_raw_os_error(libc::EPERM),
        };
        assert_eq!(
            e.source()
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .and_then(|s| s.raw_os_error()),
            Some(libc::EPERM)
        );
        assert!(e.to_string().starts_with("userfaultfd: register: "), "{e}");
        let e = MemError::Map(std::io::Error::from_raw_os_error(libc::ENOMEM));
        assert!(e.source().is_some());
        let e = MemError::from(tierstack_store::StoreError::Config("x".into()));
        assert!(matches!(e, MemError::Store(_)) && e.source().is_some());
    }
}
