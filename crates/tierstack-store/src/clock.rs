//! The blocks that the VRAM and compressed tiers share the bookkeeping of: one block (a span
//! of a buddy-allocated region) per page, a map of them, and their clock (second-chance) order.
//! Each block carries the sequence number of the put that made it, and clock entries of
//! blocks that were replaced or left since are skipped (and pruned when they pile up).
//!
//! The region's allocator, [`buddy`], lives here, below both tiers that use it (the VRAM tier
//! re-exports it as `vram::buddy`). Layering: `compressed` → `vram` → `clock` → `clock::buddy`.

pub mod buddy;
pub mod slab;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::PageKey;
use buddy::Buddy;
use slab::Slabs;

/// The allocator a region's blocks come from: the buddy (the VRAM tier) or slabs of size
/// classes over one (the compressed tier).
pub(crate) trait Region {
    /// Gives back the span of `span` bytes at `at`.
    fn release_span(&mut self, at: u64, span: u64);
    /// The bytes it manages.
    fn capacity(&self) -> u64;
}

impl Region for Buddy {
    fn release_span(&mut self, at: u64, span: u64) {
        let order = self.order_of(span);
        self.release(at, order);
    }
    fn capacity(&self) -> u64 {
        Buddy::capacity(self)
    }
}

impl Region for Slabs {
    fn release_span(&mut self, at: u64, span: u64) {
        Slabs::release_span(self, at, span);
    }
    fn capacity(&self) -> u64 {
        Slabs::capacity(self)
    }
}

/// One page's block.
#[derive(Debug)]
pub(crate) struct Block {
    /// Offset of the block in the region.
    pub at: u64,
    /// Bytes the block holds of the region (a power of two from the buddy, a span of
    /// [`Slabs::span_of`]).
    pub span: u64,
    /// Bytes stored at `at` (the page's, or fewer when compressed).
    pub stored: u32,
    /// Bytes of the page.
    pub len: u32,
    /// How the stored bytes encode the page: the tier's own code (0: as they are).
    pub packed: u8,
    /// Whether the tier below lacks it.
    pub dirty: bool,
    /// The clock's second chance, set by readers under the read lock.
    pub referenced: AtomicBool,
    /// The put that made it: a clock entry of another sequence number is stale.
    pub seq: u64,
}

/// Blocks by key, their clock order, the allocator of their region and their totals.
pub(crate) struct Blocks<R: Region = Buddy> {
    pub map: HashMap<PageKey, Block>,
    order: VecDeque<(PageKey, u64)>,
    pub region: R,
    /// Bytes of blocks in use.
    pub used: u64,
    /// Bytes of the dirty pages.
    pub dirty: u64,
}

impl<R: Region> Blocks<R> {
    pub fn new(region: R) -> Self {
        Blocks {
            map: HashMap::new(),
            order: VecDeque::new(),
            region,
            used: 0,
            dirty: 0,
        }
    }

    /// Enters `block` for `key` (whose old block the caller has forgotten) at the clock's
    /// tail.
    pub fn insert(&mut self, key: PageKey, block: Block) {
        self.used += block.span;
        if block.dirty {
            self.dirty += block.len as u64;
        }
        self.order.push_back((key, block.seq));
        self.map.insert(key, block);
        if self.order.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.order
                .retain(|(k, q)| map.get(k).is_some_and(|s| s.seq == *q));
        }
    }

    /// Removes `key`'s block and gives it back to the allocator.
    pub fn forget(&mut self, key: PageKey) -> Option<Block> {
        let s = self.map.remove(&key)?;
        self.region.release_span(s.at, s.span);
        self.used -= s.span;
        if s.dirty {
            self.dirty -= s.len as u64;
        }
        Some(s)
    }

    /// Marks `key`'s block clean (the tier below has it now).
    pub fn mark_clean(&mut self, key: PageKey) {
        if let Some(s) = self.map.get_mut(&key).filter(|s| s.dirty) {
            s.dirty = false;
            self.dirty -= s.len as u64;
        }
    }

    /// The next victim in clock order (a referenced block gets a second chance), taken off
    /// the clock but left in the map; None when the map is empty.
    pub fn next_victim(&mut self) -> Option<PageKey> {
        while let Some((key, seq)) = self.order.pop_front() {
            let Some(s) = self.map.get(&key).filter(|s| s.seq == seq) else {
                continue;
            };
            if s.referenced.swap(false, Relaxed) {
                self.order.push_back((key, seq));
                continue;
            }
            return Some(key);
        }
        None
    }

    /// Puts a victim that could not leave back on the clock: at the head (`first`) or tail.
    pub fn put_back(&mut self, key: PageKey, first: bool) {
        if let Some(s) = self.map.get(&key) {
            let e = (key, s.seq);
            if first {
                self.order.push_front(e);
            } else {
                self.order.push_back(e);
            }
        }
    }

    /// The keys of the dirty blocks, in key order (the pages of a run land next to each
    /// other below).
    pub fn dirty_keys(&self) -> Vec<PageKey> {
        let mut v: Vec<PageKey> = self
            .map
            .iter()
            .filter(|(_, s)| s.dirty)
            .map(|(k, _)| *k)
            .collect();
        v.sort_unstable();
        v
    }

    /// The tier's status: capacity of the region, bytes of blocks in use, dirty bytes.
    pub fn status(&self, name: &str, counters: &crate::TierCounters) -> crate::TierStatus {
        counters.snapshot(name, self.region.capacity(), self.used, self.dirty)
    }

    /// DRAM its tables hold, with their next growth once nearly full
    /// ([`tierstack_common::size::table_charge`]).
    pub fn table_bytes(&self) -> u64 {
        use tierstack_common::size::table_charge;
        table_charge(
            self.map.len(),
            self.map.capacity(),
            std::mem::size_of::<(PageKey, Block)>(),
        ) + table_charge(
            self.order.len(),
            self.order.capacity(),
            std::mem::size_of::<(PageKey, u64)>(),
        )
    }
}
