//! The page-level vocabulary every part of the pager shares, below all of them: a page's
//! state, how a loaded page was mapped, the hash that tells a changed page from an unchanged
//! one, the read unit of a run of adjacent pages, and the grouping of page numbers into runs.
//! It depends on no other module of the pager.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum PageState {
    /// Never written, or evicted while all zero: served by the zero page.
    Zero,
    /// In the store.
    Stored,
    /// Being read from the store (by a fault or a prefetch); whoever set it maps and wakes.
    Loading,
    Resident,
    /// Being written out by an eviction; writers wait in a write-protect fault.
    Evicting,
    /// The program mapped something else over (part of) the page (`mmap(MAP_FIXED)`): it is
    /// no longer paged (never evicted, never read back); a fault in what is left of it gets
    /// zeros.
    Foreign,
}

/// How a page was mapped, and so how its eviction learns whether it was written.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Placed {
    /// Write-protected: the first write takes a fault and marks it dirty.
    Tracked,
    /// Writable, with the hash of what the store holds for it (compared at eviction).
    Hashed(u128),
    /// Under asynchronous write-protect: write-protected (a write lifts the protection in
    /// the kernel, no fault reaches the pager; `PAGEMAP_SCAN` finds it), with the hash of
    /// what the store holds for it, which eviction compares to decide unchanged (see
    /// `evict.rs`: the scan alone cannot say that a page is clean when it leaves).
    Watched(u128),
    /// Writable and counted written.
    Dirty,
}

/// The hash that tells an unchanged page from a changed one at eviction (128 bits: an
/// accidental match of a changed page, which would lose its write, is out of reach).
pub(super) fn page_hash(data: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(data)
}

/// Largest run of adjacent pages read and mapped as one, in bytes: the read-ahead unit of a
/// sequential stream grows to this, whatever the page size.
pub(super) const RUN_BYTES: usize = 256 << 10;

/// Runs of adjacent numbers in a sorted list: (first, count).
pub(super) fn runs(v: &[usize]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i + 1;
        while j < v.len() && v[j] == v[j - 1] + 1 {
            j += 1;
        }
        out.push((v[i], j - i));
        i = j;
    }
    out
}
