//! The cleaner: moves the live records of the segments with the least live data to the head
//! of the log and frees those segments.

use std::sync::atomic::Ordering::Relaxed;

use crate::error::{ArrayError, Result};
use crate::format;
use crate::layout::BLOCK;

use super::{Array, Class, SegInfo, SegState, Writer};

impl Array {
    /// Cleans the sealed segment with the least live data. Returns false if none is worth it.
    ///
    /// Several victims are cleaned together (as many as the free space can take), with one
    /// flush for all of them, so that arrays of small segments still gain space.
    pub(super) fn clean_one(&self, w: &mut Writer) -> Result<bool> {
        // A forked child still reads segments this array no longer needs.
        if self.inner.read_only || self.segments_held() {
            return Ok(false);
        }
        let geo = self.inner.geo.clone();
        let victims: Vec<u32> = {
            let idx = self.inner.index.read();
            // (live blocks incl. summary entries, segment, stripes written), least live first.
            let mut cands: Vec<(u64, u32, u64)> = idx
                .segs
                .iter()
                .enumerate()
                .filter(|(i, s)| s.state == SegState::Sealed && Some(*i as u32) != w.seg)
                .map(|(i, s)| {
                    let ent = (s.live_recs * format::ENTRY_SIZE as u64).div_ceil(BLOCK as u64);
                    (s.live_blocks + ent, i as u32, s.stripes as u64)
                })
                .collect();
            cands.sort_unstable();
            let free = idx
                .segs
                .iter()
                .filter(|s| s.state == SegState::Free)
                .count() as u64;
            // Pick the prefix (least live first) that frees the most stripes, counting a
            // re-packed stripe as 85 % usable, within the free stripes the copies can go to.
            let per_stripe = (geo.stripe_blocks() as u64 * 17 / 20).max(1);
            let free_stripes = free * geo.seg_stripes;
            let (mut live_sum, mut stripes_sum) = (0u64, 0u64);
            let mut best = (0u64, 0usize);
            for (i, &(live, _, stripes)) in cands.iter().enumerate().take(256) {
                live_sum += live;
                stripes_sum += stripes;
                let need = live_sum.div_ceil(per_stripe);
                if need > free_stripes {
                    break;
                }
                let gain = stripes_sum.saturating_sub(need);
                if gain > best.0 {
                    best = (gain, i + 1);
                }
            }
            cands[..best.1].iter().map(|c| c.1).collect()
        };
        if victims.is_empty() {
            return Ok(false);
        }
        // If the copies run out of room part-way (the packing estimate was optimistic), the
        // victims already emptied are still freed below.
        let mut move_err = None;
        for &victim in &victims {
            if let Err(e) = self.move_live(w, victim) {
                move_err = Some(e);
                break;
            }
        }
        if let Some(e) = move_err.take() {
            if !matches!(e, ArrayError::NoSpace(_)) {
                return Err(e);
            }
        }
        // The moved data must be durable before the old copies are invalidated.
        self.flush_locked(w)?;
        let emptied: Vec<u32> = {
            let idx = self.inner.index.read();
            victims
                .iter()
                .copied()
                .filter(|&v| {
                    let si = &idx.segs[v as usize];
                    si.live_blocks == 0
                        && si.live_recs == 0
                        && !idx.tombs.values().any(|t| t.seg == v)
                })
                .collect()
        };
        for &victim in &emptied {
            self.write_marker(w, victim)?;
        }
        self.inner.sync_all()?;
        let mut idx = self.inner.index.write();
        for &victim in &emptied {
            idx.segs[victim as usize] = SegInfo {
                state: SegState::Free,
                seq: 0,
                stripes: 0,
                live_blocks: 0,
                live_recs: 0,
            };
        }
        self.inner
            .counters
            .segments_cleaned
            .fetch_add(emptied.len() as u64, Relaxed);
        Ok(!emptied.is_empty())
    }

    /// Appends the live records and needed tombstones of `victim` to the log.
    fn move_live(&self, w: &mut Writer, victim: u32) -> Result<()> {
        let stripes = self.inner.index.read().segs[victim as usize].stripes;
        for s in 0..stripes {
            // A stripe whose summary cannot be read keeps its records counted live, so the
            // segment is not freed below.
            let Some(ents) = self
                .read_summary(victim, s)
                .ok()
                .and_then(|sum| sum.entries())
            else {
                continue;
            };
            for e in ents {
                let key = (e.obj, e.page);
                if e.is_tombstone() {
                    let keep = {
                        let idx = self.inner.index.read();
                        match idx.tombs.get(&key) {
                            Some(t) if t.version == e.version && t.seg == victim => {
                                // Keep it while any other segment may hold an older version.
                                Some(idx.segs.iter().enumerate().any(|(i, si)| {
                                    i as u32 != victim
                                        && si.state != SegState::Free
                                        && si.seq < e.version
                                }))
                            }
                            _ => None,
                        }
                    };
                    match keep {
                        Some(true) => self.append_tomb(w, key, e.version, Class::Cleaner)?,
                        Some(false) => {
                            self.inner.index.write().tombs.remove(&key);
                        }
                        None => {}
                    }
                    continue;
                }
                let loc = {
                    let idx = self.inner.index.read();
                    idx.map
                        .get(&key)
                        .copied()
                        .filter(|l| l.version == e.version && l.seg == victim && l.stripe == s)
                };
                let Some(loc) = loc else { continue };
                let data = {
                    let idx = self.inner.index.read();
                    self.read_loc(&idx, &loc)?
                };
                self.append(w, key, e.version, &data, Class::Cleaner)?;
                self.inner
                    .counters
                    .cleaner_bytes
                    .fetch_add(data.len() as u64, Relaxed);
            }
        }
        Ok(())
    }

    /// Runs the cleaner until no segment is worth cleaning or `max` segments were cleaned.
    pub fn clean(&self, max: usize) -> Result<usize> {
        let mut w = self.inner.writer.lock();
        let mut n = 0;
        while n < max && self.clean_one(&mut w)? {
            n += 1;
        }
        Ok(n)
    }
}
