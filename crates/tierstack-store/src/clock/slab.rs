//! The compressed tier's allocator: compressed pages packed by size class into slabs, so a
//! page takes its compressed bytes rounded up to 64 instead of the next power of two.
//!
//! A page of 4 KiB that compresses to 1,700 bytes (a smooth field of doubles) took a 2 KiB
//! buddy block: 17 % of the arena lost; one that compressed to 1,413 bytes (a quantum state
//! vector under zstd) lost 31 %. zswap's zsmalloc packs its pages by size class for the same
//! reason. Here:
//! - spans up to [`SLAB_MAX`] are rounded up to [`GRAIN`] bytes, their class; a class takes
//!   slabs (blocks of up to 64 KiB from the [`Buddy`] beneath) and cuts each into slots of
//!   its size: a 1,728-byte class gets 37 slots of a 64 KiB slab (2.4 % of it unused);
//! - a slot is taken from the lowest slab of its class with a free slot, the lowest slot
//!   first, so the memory in use stays near the arena's start as with the buddy alone;
//! - a slab whose last slot is given back goes back to the buddy at once (and from there to
//!   the kernel when the tier trims);
//! - larger spans are buddy blocks of a power of two, as before.

use std::collections::{BTreeSet, HashMap};

use super::buddy::Buddy;

/// Spans are multiples of this: 64 bytes (a zero page compresses to about 20).
pub const GRAIN: u64 = 64;

/// The largest span kept in a slab; larger ones are buddy blocks.
pub const SLAB_MAX: u64 = 4096;

/// The largest slab: 64 KiB (smaller when the region is).
pub const SLAB_ORDER: u32 = 16;

/// The bytes a span of `bytes` holds: rounded up to [`GRAIN`] up to [`SLAB_MAX`], the next
/// power of two above (a buddy block).
pub fn span(bytes: u64) -> u64 {
    let grains = bytes.max(1).div_ceil(GRAIN) * GRAIN;
    if grains <= SLAB_MAX {
        grains
    } else {
        grains.next_power_of_two()
    }
}

/// One slab: the slots of one class, a bit set for each free one.
#[derive(Debug)]
struct Slab {
    class: u64,
    slots: u32,
    used: u32,
    free: Vec<u64>,
}

impl Slab {
    fn new(class: u64, size: u64) -> Slab {
        let slots = (size / class) as u32;
        let mut free = vec![0u64; (slots as usize).div_ceil(64)];
        for i in 0..slots as usize {
            free[i / 64] |= 1 << (i % 64);
        }
        Slab {
            class,
            slots,
            used: 0,
            free,
        }
    }

    /// The lowest free slot, now taken.
    fn take(&mut self) -> Option<u64> {
        let (w, bits) = self.free.iter_mut().enumerate().find(|(_, b)| **b != 0)?;
        let b = bits.trailing_zeros();
        *bits &= !(1 << b);
        self.used += 1;
        Some((w * 64) as u64 + u64::from(b))
    }

    /// Gives slot `i` back; false when it was not taken.
    fn give(&mut self, i: u64) -> bool {
        let (w, b) = ((i / 64) as usize, i % 64);
        match self.free.get_mut(w) {
            Some(bits) if i < u64::from(self.slots) && *bits & (1 << b) == 0 => {
                *bits |= 1 << b;
                self.used -= 1;
                true
            }
            _ => false,
        }
    }

    fn full(&self) -> bool {
        self.used == self.slots
    }
}

/// Slabs of size classes over a buddy allocator (see the module's documentation).
#[derive(Debug)]
pub struct Slabs {
    buddy: Buddy,
    slab_order: u32,
    /// Slabs by offset.
    slabs: HashMap<u64, Slab>,
    /// Per class (span / [`GRAIN`]), the offsets of its slabs that have a free slot.
    partial: HashMap<u64, BTreeSet<u64>>,
    /// Bytes of free slots in slabs.
    slack: u64,
    /// Bytes at the ends of slabs too short for a slot.
    waste: u64,
}

impl Slabs {
    /// An allocator over `capacity` bytes (rounded down to 4 KiB), all free.
    pub fn new(capacity: u64) -> Slabs {
        let buddy = Buddy::new(capacity);
        let fits = 63 - buddy.capacity().max(1).leading_zeros();
        Slabs {
            slab_order: fits.clamp(super::buddy::MIN_ORDER, SLAB_ORDER),
            buddy,
            slabs: HashMap::new(),
            partial: HashMap::new(),
            slack: 0,
            waste: 0,
        }
    }

    /// The bytes it manages.
    pub fn capacity(&self) -> u64 {
        self.buddy.capacity()
    }

    /// The bytes a span of `bytes` holds: rounded up to [`GRAIN`] up to [`SLAB_MAX`], the
    /// next power of two above.
    pub fn span_of(&self, bytes: u64) -> u64 {
        span(bytes)
    }

    /// The offset of a span of `bytes` (see [`Slabs::span_of`]), now taken; `None` when
    /// nothing that large is free.
    pub fn alloc_span(&mut self, bytes: u64) -> Option<u64> {
        let span = self.span_of(bytes);
        if span > SLAB_MAX {
            return self.buddy.alloc(self.buddy.order_of(span));
        }
        let class = span / GRAIN;
        let size = 1u64 << self.slab_order;
        let at = match self.partial.get(&class).and_then(|p| p.first().copied()) {
            Some(at) => at,
            None => {
                let at = self.buddy.alloc(self.slab_order)?;
                let slab = Slab::new(span, size);
                self.slack += u64::from(slab.slots) * span;
                self.waste += size - u64::from(slab.slots) * span;
                self.slabs.insert(at, slab);
                self.partial.entry(class).or_default().insert(at);
                at
            }
        };
        let slab = self.slabs.get_mut(&at)?;
        let i = slab.take()?;
        self.slack -= span;
        if slab.full() {
            if let Some(p) = self.partial.get_mut(&class) {
                p.remove(&at);
            }
        }
        Some(at + i * span)
    }

    /// Gives back the span of `bytes` at `at` taken by [`Slabs::alloc_span`].
    pub fn release_span(&mut self, at: u64, bytes: u64) {
        let span = self.span_of(bytes);
        if span > SLAB_MAX {
            self.buddy.release(at, self.buddy.order_of(span));
            return;
        }
        let base = at & !((1u64 << self.slab_order) - 1);
        let Some(slab) = self.slabs.get_mut(&base) else {
            return;
        };
        if slab.class != span || !slab.give((at - base) / span) {
            return;
        }
        self.slack += span;
        let class = span / GRAIN;
        if slab.used == 0 {
            self.slack -= u64::from(slab.slots) * span;
            self.waste -= (1u64 << self.slab_order) - u64::from(slab.slots) * span;
            self.slabs.remove(&base);
            if let Some(p) = self.partial.get_mut(&class) {
                p.remove(&base);
            }
            self.buddy.release(base, self.slab_order);
        } else {
            self.partial.entry(class).or_default().insert(base);
        }
    }

    /// The runs of whole 4 KiB pages that hold nothing, as (offset, bytes): the buddy's free
    /// blocks of 4 KiB or more, and the pages of slabs that only free slots (or a slab's
    /// unused end) cover. What a tier may give back to the kernel.
    pub fn free_pages(&self) -> Vec<(u64, u64)> {
        const PAGE: u64 = 4096;
        let mut runs: Vec<(u64, u64)> = self
            .buddy
            .free_blocks(12)
            .into_iter()
            .map(|(at, o)| (at, 1u64 << o))
            .collect();
        let size = 1u64 << self.slab_order;
        for (&base, slab) in &self.slabs {
            if slab.full() {
                continue;
            }
            let taken_in = |from: u64, to: u64| {
                let first = from / slab.class;
                let last = ((to - 1) / slab.class).min(u64::from(slab.slots).saturating_sub(1));
                (first..=last).any(|i| {
                    i < u64::from(slab.slots) && slab.free[(i / 64) as usize] & (1 << (i % 64)) == 0
                })
            };
            for p in 0..size / PAGE {
                let (from, to) = (p * PAGE, (p + 1) * PAGE);
                if !taken_in(from, to) {
                    runs.push((base + from, PAGE));
                }
            }
        }
        runs
    }

    /// Bytes free: the buddy's and the free slots of slabs.
    #[cfg(test)]
    pub fn free_bytes(&self) -> u64 {
        self.buddy.free_bytes() + self.slack
    }

    /// Bytes neither free nor taken: the ends of slabs too short for a slot of their class.
    #[cfg(test)]
    pub fn waste(&self) -> u64 {
        self.waste
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A 1,700-byte span takes 1,728 bytes; 37 fit a 64 KiB slab, the 38th opens a second;
    /// when all are given back the region is whole again.
    #[test]
    fn a_class_packs_its_slots_and_gives_empty_slabs_back() {
        let mut s = Slabs::new(1 << 20);
        assert_eq!(s.span_of(1700), 1728);
        assert_eq!(s.span_of(1), 64);
        assert_eq!(s.span_of(5000), 8192);
        let got: Vec<u64> = (0..38).map(|_| s.alloc_span(1700).expect("slot")).collect();
        assert_eq!(got[1], got[0] + 1728);
        assert_eq!(got[36], got[0] + 36 * 1728);
        assert_eq!(got[37] & !0xffff, got[0] + (1 << 16), "a second slab");
        assert_eq!(s.waste(), 2 * ((1 << 16) - 37 * 1728));
        assert_eq!(s.free_bytes(), (1 << 20) - 38 * 1728 - s.waste());
        for at in &got[..37] {
            s.release_span(*at, 1700);
        }
        // The freed slab's memory is back with the buddy.
        assert!(s
            .free_pages()
            .iter()
            .any(|&(at, len)| at == got[0] && len >= 1 << 16));
        // In the second slab, only its first page holds a slot: the other 15 are free.
        let second = got[37];
        let in_second: Vec<_> = s
            .free_pages()
            .into_iter()
            .filter(|&(at, _)| at >= second && at < second + (1 << 16))
            .collect();
        assert_eq!(in_second.len(), 15, "{in_second:?}");
        assert!(in_second
            .iter()
            .all(|&(at, len)| len == 4096 && at >= second + 4096));
        s.release_span(got[37], 1700);
        assert_eq!(s.free_bytes(), 1 << 20);
        assert!(s.buddy.alloc(20).is_some(), "merged whole");
    }

    /// A region smaller than a slab still serves spans (its slabs are smaller).
    #[test]
    fn a_small_region_has_small_slabs() {
        let mut s = Slabs::new(4096);
        let a = s.alloc_span(2000).expect("one");
        let b = s.alloc_span(2000).expect("two");
        assert_ne!(a, b);
        assert!(s.alloc_span(2000).is_none(), "full");
        s.release_span(a, 2000);
        s.release_span(b, 2000);
        assert_eq!(s.free_bytes(), 4096);
    }

    proptest! {
        /// Spans of any size against a model: they never overlap, stay inside the capacity,
        /// and what is free plus what is taken is always the capacity; everything given back
        /// leaves the region whole.
        #[test]
        fn spans_never_overlap(ops in proptest::collection::vec((1u64..20_000, any::<bool>(), any::<u16>()), 1..400)) {
            let cap = (3 << 20) + (40 << 10);
            let mut s = Slabs::new(cap);
            let mut taken: Vec<(u64, u64)> = Vec::new();
            for (len, alloc, pick) in ops {
                if alloc || taken.is_empty() {
                    if let Some(at) = s.alloc_span(len) {
                        let end = at + s.span_of(len);
                        prop_assert!(end <= s.capacity());
                        for &(t, tl) in &taken {
                            prop_assert!(end <= t || t + s.span_of(tl) <= at, "overlap");
                        }
                        taken.push((at, len));
                    }
                } else {
                    let (at, len) = taken.swap_remove(pick as usize % taken.len());
                    s.release_span(at, len);
                }
                let held: u64 = taken.iter().map(|&(_, l)| s.span_of(l)).sum();
                prop_assert_eq!(s.free_bytes() + held + s.waste(), s.capacity());
            }
            for (at, len) in taken.drain(..) {
                s.release_span(at, len);
            }
            prop_assert_eq!(s.free_bytes(), s.capacity());
            prop_assert!(s.buddy.alloc(21).is_some());
        }
    }
}
