//! A buddy allocator of offsets in one block of memory (the VRAM tier's device memory, the
//! compressed tier's arena): blocks of a power of two (4 KiB at least by default), split on
//! allocation and merged with their buddy on release, so that pages of every size share the
//! memory without a size class holding on to it. The lowest free block of an order is taken
//! first, so the blocks in use stay near the start.

use std::collections::BTreeSet;

/// The smallest block: 4 KiB.
pub const MIN_ORDER: u32 = 12;
const ORDERS: usize = 48;

/// Free blocks by order (a block of order `o` is `1 << o` bytes at an offset that is a
/// multiple of its size).
#[derive(Debug)]
pub struct Buddy {
    free: Vec<BTreeSet<u64>>,
    capacity: u64,
    min: u32,
}

/// The order of the smallest block that holds `bytes`.
pub fn order_for(bytes: u64) -> u32 {
    let b = bytes.max(1 << MIN_ORDER);
    64 - (b - 1).leading_zeros()
}

impl Buddy {
    /// An allocator over `capacity` bytes (rounded down to 4 KiB), all free.
    pub fn new(capacity: u64) -> Buddy {
        Buddy::with_min_order(capacity, MIN_ORDER)
    }

    /// An allocator over `capacity` bytes whose smallest block is `1 << min` bytes (`min`
    /// from 3 to [`MIN_ORDER`]).
    pub fn with_min_order(capacity: u64, min: u32) -> Buddy {
        let min = min.clamp(3, MIN_ORDER);
        let capacity = capacity & !((1 << MIN_ORDER) - 1);
        let mut b = Buddy {
            free: vec![BTreeSet::new(); ORDERS],
            capacity,
            min,
        };
        let mut at = 0u64;
        while at < capacity {
            let mut o = (ORDERS - 1) as u32;
            while o > min && (!at.is_multiple_of(1 << o) || at + (1 << o) > capacity) {
                o -= 1;
            }
            b.free[o as usize].insert(at);
            at += 1 << o;
        }
        b
    }

    /// The bytes it manages.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The order of the smallest block of this allocator that holds `bytes`.
    pub fn order_of(&self, bytes: u64) -> u32 {
        64 - (bytes.max(1 << self.min) - 1).leading_zeros()
    }

    /// The offset of a free block of `order`, now taken; `None` when no block that large is
    /// free.
    pub fn alloc(&mut self, order: u32) -> Option<u64> {
        let order = order.max(self.min) as usize;
        let from = (order..ORDERS).find(|&o| !self.free[o].is_empty())?;
        let at = self.free[from].pop_first()?;
        for o in (order..from).rev() {
            self.free[o].insert(at + (1 << o));
        }
        Some(at)
    }

    /// Gives back the block of `order` at `at`, merging it with its free buddies.
    pub fn release(&mut self, mut at: u64, order: u32) {
        let mut o = order.max(self.min) as usize;
        while o + 1 < ORDERS {
            let buddy = at ^ (1 << o);
            if !self.free[o].remove(&buddy) {
                break;
            }
            at = at.min(buddy);
            o += 1;
        }
        self.free[o].insert(at);
    }

    /// The free blocks of `min_order` or larger, as (offset, order).
    pub fn free_blocks(&self, min_order: u32) -> Vec<(u64, u32)> {
        (min_order as usize..ORDERS)
            .flat_map(|o| self.free[o].iter().map(move |&at| (at, o as u32)))
            .collect()
    }

    /// Bytes free.
    pub fn free_bytes(&self) -> u64 {
        self.free
            .iter()
            .enumerate()
            .map(|(o, s)| s.len() as u64 * (1u64 << o))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn orders() {
        let small = Buddy::with_min_order(1 << 20, 6);
        assert_eq!(small.order_of(1), 6);
        assert_eq!(small.order_of(65), 7);
        assert_eq!(small.order_of(4096), 12);
        assert_eq!(order_for(1), 12);
        assert_eq!(order_for(4096), 12);
        assert_eq!(order_for(4097), 13);
        assert_eq!(order_for(1 << 20), 20);
    }

    #[test]
    fn an_odd_capacity_is_covered_and_merges_back() {
        let mut b = Buddy::new((5 << 20) + 12345);
        assert_eq!(b.capacity(), (5 << 20) + 12288);
        assert_eq!(b.free_bytes(), b.capacity());
        let mut got = Vec::new();
        while let Some(at) = b.alloc(12) {
            got.push(at);
        }
        assert_eq!(got.len() as u64, b.capacity() / 4096);
        for at in got {
            b.release(at, 12);
        }
        assert_eq!(b.free_bytes(), b.capacity());
        // Merged again: the largest block is whole.
        assert!(b.alloc(22).is_some());
    }

    proptest! {
        /// Against a model: taken blocks never overlap, stay inside the capacity, and what is
        /// free plus what is taken is always the capacity; after everything is given back one
        /// block of each size the capacity allows can be taken again.
        #[test]
        fn blocks_never_overlap(ops in proptest::collection::vec((0u32..6, any::<bool>(), any::<u16>()), 1..300), small in any::<bool>()) {
            let cap = (3 << 20) + (40 << 10);
            let min = if small { 6 } else { MIN_ORDER };
            let mut b = Buddy::with_min_order(cap, min);
            let mut taken: Vec<(u64, u32)> = Vec::new();
            for (o, alloc, pick) in ops {
                if alloc || taken.is_empty() {
                    let order = min + o * 2;
                    if let Some(at) = b.alloc(order) {
                        let end = at + (1 << order);
                        prop_assert!(end <= b.capacity());
                        prop_assert!(at.is_multiple_of(1 << order));
                        for &(t, to) in &taken {
                            prop_assert!(end <= t || t + (1 << to) <= at, "overlap");
                        }
                        taken.push((at, order));
                    }
                } else {
                    let (at, order) = taken.swap_remove(pick as usize % taken.len());
                    b.release(at, order);
                }
                let held: u64 = taken.iter().map(|&(_, o)| 1u64 << o).sum();
                prop_assert_eq!(b.free_bytes() + held, b.capacity());
            }
            for (at, order) in taken.drain(..) {
                b.release(at, order);
            }
            prop_assert_eq!(b.free_bytes(), b.capacity());
            prop_assert!(b.alloc(21).is_some());
        }
    }
}
