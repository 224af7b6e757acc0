//! Which 4 KiB blocks of a file are allocated (written, or reserved with `fallocate`), as
//! ext4 would have them: what `st_blocks` reports, what `SEEK_DATA`/`SEEK_HOLE` find, and
//! the only ranges the drain writes to BACKING (the rest stays a hole there).
//!
//! A sorted set of disjoint, non-adjacent `[start, end)` byte ranges whose ends are
//! multiples of [`BLOCK`]. Pure: no I/O, no locks.

use std::collections::BTreeMap;

/// The allocation unit, as ext4's.
pub const BLOCK: u64 = 4096;

/// A file's allocated ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extents {
    /// start -> end, disjoint and not touching.
    map: BTreeMap<u64, u64>,
}

fn down(x: u64) -> u64 {
    x / BLOCK * BLOCK
}

fn up(x: u64) -> u64 {
    x.div_ceil(BLOCK).saturating_mul(BLOCK)
}

impl Extents {
    /// No block allocated.
    pub fn new() -> Extents {
        Extents::default()
    }

    /// Allocates every block that `[a, b)` touches.
    pub fn add(&mut self, a: u64, b: u64) {
        if b <= a {
            return;
        }
        let (mut a, mut b) = (down(a), up(b));
        // Merge every range that overlaps or touches [a, b).
        let touching: Vec<(u64, u64)> = self
            .map
            .range(..=b)
            .rev()
            .take_while(|(_, e)| **e >= a)
            .map(|(s, e)| (*s, *e))
            .collect();
        for (s, e) in touching {
            self.map.remove(&s);
            a = a.min(s);
            b = b.max(e);
        }
        self.map.insert(a, b);
    }

    /// Frees the blocks that lie wholly inside `[a, b)` (a punched hole: the blocks at its
    /// edges keep their other bytes).
    pub fn remove(&mut self, a: u64, b: u64) {
        let (a, b) = (up(a), down(b));
        if b <= a {
            return;
        }
        let hit: Vec<(u64, u64)> = self
            .map
            .range(..b)
            .rev()
            .take_while(|(_, e)| **e > a)
            .map(|(s, e)| (*s, *e))
            .collect();
        for (s, e) in hit {
            self.map.remove(&s);
            if s < a {
                self.map.insert(s, a);
            }
            if e > b {
                self.map.insert(b, e);
            }
        }
    }

    /// Frees every block from the one that holds byte `size` on (a truncation to `size`).
    pub fn truncate(&mut self, size: u64) {
        self.remove(up(size), u64::MAX);
        // `remove` keeps a range's part at or past down(u64::MAX); nothing lives there.
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> u64 {
        self.map.iter().map(|(s, e)| e - s).sum()
    }

    /// The ranges, in order.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(s, e)| (*s, *e))
    }

    /// The parts of the ranges inside `[a, b)`, in order (no allocation: the read path asks).
    fn parts(&self, a: u64, b: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = self.map.range(..=a).next_back().map_or(a, |(s, _)| *s);
        self.map
            .range(first..b.max(first))
            .map(move |(s, e)| ((*s).max(a), (*e).min(b)))
            .filter(|(lo, hi)| lo < hi)
    }

    /// The parts of the ranges inside `[a, b)`, in order.
    pub fn within(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        self.parts(a, b).collect()
    }

    /// Whether any byte of `[a, b)` is allocated.
    pub fn touches(&self, a: u64, b: u64) -> bool {
        self.parts(a, b).next().is_some()
    }

    /// `SEEK_DATA` in a file of `size` bytes: the first allocated offset at or after `off`.
    pub fn seek_data(&self, off: u64, size: u64) -> Option<u64> {
        if off >= size {
            return None;
        }
        self.parts(off, size).next().map(|r| r.0)
    }

    /// `SEEK_HOLE` in a file of `size` bytes: the first offset at or after `off` that is
    /// not allocated (the end of the file counts as a hole).
    pub fn seek_hole(&self, off: u64, size: u64) -> Option<u64> {
        if off >= size {
            return None;
        }
        match self.parts(off, size).next() {
            Some((s, e)) if s == off => Some(e.min(size)),
            _ => Some(off),
        }
    }

    /// The encoding kept in the journal's inode row: (start, end) pairs, little endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.map.len() * 16);
        for (s, e) in &self.map {
            v.extend_from_slice(&s.to_le_bytes());
            v.extend_from_slice(&e.to_le_bytes());
        }
        v
    }

    /// Decodes [`Extents::encode`]'s bytes; None for anything else (a torn or foreign
    /// value: the caller then treats the file's allocation as unknown).
    pub fn decode(b: &[u8]) -> Option<Extents> {
        if !b.len().is_multiple_of(16) {
            return None;
        }
        let mut x = Extents::new();
        for c in b.chunks_exact(16) {
            let s = u64::from_le_bytes(c[..8].try_into().ok()?);
            let e = u64::from_le_bytes(c[8..].try_into().ok()?);
            if e <= s {
                return None;
            }
            x.add(s, e);
        }
        Some(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The model: one flag per block of a small file.
    fn model_apply(m: &mut [bool], op: (u8, u64, u64)) {
        let (k, a, b) = op;
        let n = m.len() as u64 * BLOCK;
        let (a, b) = (a.min(n), b.min(n));
        match k % 3 {
            0 => {
                if b > a {
                    for blk in a / BLOCK..b.div_ceil(BLOCK) {
                        m[blk as usize] = true;
                    }
                }
            }
            1 => {
                for blk in a.div_ceil(BLOCK)..b / BLOCK {
                    m[blk as usize] = false;
                }
            }
            _ => {
                for blk in a.div_ceil(BLOCK)..m.len() as u64 {
                    m[blk as usize] = false;
                }
            }
        }
    }

    fn apply(x: &mut Extents, op: (u8, u64, u64), n: u64) {
        let (k, a, b) = op;
        let (a, b) = (a.min(n), b.min(n));
        match k % 3 {
            0 => x.add(a, b),
            1 => x.remove(a, b),
            _ => x.truncate(a),
        }
    }

    proptest! {
        /// Any sequence of allocations, punches and truncations gives the model's blocks,
        /// kept as disjoint, non-touching, block-aligned ranges; seeks agree with the model;
        /// the encoding round-trips.
        #[test]
        fn extents_match_a_block_model(ops in proptest::collection::vec((0u8..3, 0u64..70_000, 0u64..70_000), 0..40)) {
            let blocks = 16usize;
            let n = blocks as u64 * BLOCK;
            let mut m = vec![false; blocks];
            let mut x = Extents::new();
            for (k, a, b) in ops {
                let (a, b) = (a.min(b), a.max(b));
                model_apply(&mut m, (k, a, b));
                apply(&mut x, (k, a, b), n);
                let want: Vec<bool> = (0..blocks as u64).map(|i| x.touches(i * BLOCK, i * BLOCK + 1)).collect();
                prop_assert_eq!(&want, &m);
                prop_assert_eq!(x.bytes(), m.iter().filter(|b| **b).count() as u64 * BLOCK);
                let r: Vec<_> = x.ranges().collect();
                for w in r.windows(2) {
                    prop_assert!(w[0].1 < w[1].0);
                }
                for (s, e) in &r {
                    prop_assert!(s % BLOCK == 0 && e % BLOCK == 0 && s < e);
                }
                let back = Extents::decode(&x.encode());
                prop_assert_eq!(back.as_ref(), Some(&x));
            }
            let size = n - 100;
            for off in (0..size).step_by(1000) {
                let data = (off / BLOCK..blocks as u64).find(|b| m[*b as usize]).map(|b| (b * BLOCK).max(off)).filter(|d| *d < size);
                prop_assert_eq!(x.seek_data(off, size), data);
                let hole = (off / BLOCK..blocks as u64).find(|b| !m[*b as usize]).map_or(size, |b| (b * BLOCK).max(off)).min(size);
                prop_assert_eq!(x.seek_hole(off, size), Some(hole));
            }
        }
    }

    #[test]
    fn decode_refuses_what_encode_cannot_make() {
        assert!(Extents::decode(&[1, 2, 3]).is_none());
        let mut b = 8u64.to_le_bytes().to_vec();
        b.extend_from_slice(&4u64.to_le_bytes());
        assert!(Extents::decode(&b).is_none());
    }
}
