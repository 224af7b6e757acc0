//! The map and clock (second-chance) order that the VRAM and compressed tiers share: each
//! slot carries the sequence number of the put that made it, and clock entries of slots that
//! were replaced or left since are skipped (and pruned when they pile up).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::PageKey;

/// What the clock needs of a slot.
pub(crate) trait ClockSlot {
    /// The sequence number of the put that made it.
    fn seq(&self) -> u64;
    /// Its second chance, set by readers.
    fn referenced(&self) -> &AtomicBool;
    /// Whether the tier below lacks it.
    fn dirty(&self) -> bool;
}

/// Slots by key, and their keys in clock order.
pub(crate) struct Clock<S> {
    pub map: HashMap<PageKey, S>,
    order: VecDeque<(PageKey, u64)>,
}

impl<S: ClockSlot> Clock<S> {
    pub fn new() -> Self {
        Clock {
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Enters `slot` for `key` (replacing any slot there) at the clock's tail.
    pub fn insert(&mut self, key: PageKey, slot: S) {
        let seq = slot.seq();
        self.map.insert(key, slot);
        self.order.push_back((key, seq));
        if self.order.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.order
                .retain(|(k, q)| map.get(k).is_some_and(|s| s.seq() == *q));
        }
    }

    /// The next victim in clock order (a referenced slot gets a second chance), taken off the
    /// clock but left in the map; None when the map is empty.
    pub fn next_victim(&mut self) -> Option<PageKey> {
        while let Some((key, seq)) = self.order.pop_front() {
            let Some(s) = self.map.get(&key).filter(|s| s.seq() == seq) else {
                continue;
            };
            if s.referenced().swap(false, Relaxed) {
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
            let e = (key, s.seq());
            if first {
                self.order.push_front(e);
            } else {
                self.order.push_back(e);
            }
        }
    }

    /// The keys of the dirty slots, in key order (the pages of a run land next to each other
    /// below).
    pub fn dirty_keys(&self) -> Vec<PageKey> {
        let mut v: Vec<PageKey> = self
            .map
            .iter()
            .filter(|(_, s)| s.dirty())
            .map(|(k, _)| *k)
            .collect();
        v.sort_unstable();
        v
    }

    /// DRAM its tables hold.
    pub fn table_bytes(&self) -> u64 {
        (self.map.capacity() * (std::mem::size_of::<(PageKey, S)>() + 1)
            + self.order.capacity() * std::mem::size_of::<(PageKey, u64)>()) as u64
    }
}
