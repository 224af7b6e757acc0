//! Recovery at open: the index is rebuilt from the stripe summaries on the drives alone;
//! stripes torn by a crash (only those that were in flight) are voided.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use crate::error::Result;
use crate::format::{self, Entry, Footer, FOOTER_FREE};
use crate::layout::BLOCK;

use super::{Array, Key, Loc, Newest, SegInfo, SegState, MAX_INFLIGHT};

impl Array {
    pub(super) fn recover(&self) -> Result<()> {
        let geo = self.inner.geo.clone();
        let mut best: Newest = HashMap::new();
        let mut segs = vec![
            SegInfo {
                state: SegState::Free,
                seq: 0,
                stripes: 0,
                live_blocks: 0,
                live_recs: 0,
            };
            geo.nsegs as usize
        ];
        let mut max_seq = 0u64;
        let mut latest: Vec<(u64, u32, u32)> = Vec::new(); // (stripe_seq, seg, stripe)
        for seg in 0..geo.nsegs as u32 {
            let mut seg_seq = None;
            for s in 0..geo.seg_stripes as u32 {
                let Some((f, ents)) = self.read_summary(seg, s) else {
                    break;
                };
                max_seq = max_seq.max(f.stripe_seq).max(f.seg_seq);
                if f.seg != seg || f.stripe != s {
                    break;
                }
                if s == 0 {
                    if f.flags & FOOTER_FREE != 0 {
                        latest.push((f.stripe_seq, seg, s));
                        break;
                    }
                    seg_seq = Some(f.seg_seq);
                } else if Some(f.seg_seq) != seg_seq {
                    break;
                }
                latest.push((f.stripe_seq, seg, s));
                segs[seg as usize] = SegInfo {
                    state: SegState::Sealed,
                    seq: f.seg_seq,
                    stripes: s + 1,
                    live_blocks: 0,
                    live_recs: 0,
                };
                for e in ents {
                    max_seq = max_seq.max(e.version);
                    let k = (e.obj, e.page);
                    if best.get(&k).is_none_or(|b| e.version > b.0.version) {
                        best.insert(k, (e, seg, s));
                    }
                }
            }
        }
        self.inner.seq.store(max_seq + 1, Relaxed);
        let mut idx = self.inner.index.write();
        idx.segs = segs;
        idx.install(best);
        drop(idx);
        // Only the stripes that were in flight can be torn by a crash, and at most
        // MAX_INFLIGHT were: check the newest ones and void any whose records cannot be read
        // back (they were never acknowledged by a flush).
        latest.sort_unstable_by_key(|l| std::cmp::Reverse(l.0));
        for &(_, seg, s) in latest.iter().take(MAX_INFLIGHT) {
            self.check_torn(seg, s)?;
        }
        Ok(())
    }

    fn check_torn(&self, seg: u32, s: u32) -> Result<()> {
        let locs: Vec<(Key, Loc)> = {
            let idx = self.inner.index.read();
            idx.map
                .iter()
                .filter(|(_, l)| l.seg == seg && l.stripe == s)
                .map(|(k, l)| (*k, *l))
                .collect()
        };
        let mut torn = false;
        for (_, loc) in &locs {
            let idx = self.inner.index.read();
            if self.read_loc(&idx, loc).is_err() {
                torn = true;
                break;
            }
        }
        if !torn {
            return Ok(());
        }
        tracing::warn!(
            "stripe {s} of segment {seg} was torn by a crash; dropping its unacknowledged records"
        );
        let mut idx = self.inner.index.write();
        for (k, _) in &locs {
            if let Some(l) = idx.map.remove(k) {
                idx.segs[l.seg as usize].add_live(l.len, -1);
            }
        }
        // Older versions of those keys may still exist; the voided stripe must not hide them,
        // so reload them from a full rescan is unnecessary: a torn stripe holds only versions
        // newer than any flushed one, and the flushed ones are what we must keep. Rebuild the
        // affected keys' best flushed version by a second, targeted pass.
        drop(idx);
        self.void_stripe(seg, s)?;
        let keys: Vec<Key> = locs.iter().map(|(k, _)| *k).collect();
        self.reload_keys(&keys)?;
        Ok(())
    }

    /// Rewrites a torn stripe as a valid, empty stripe of its segment.
    fn void_stripe(&self, seg: u32, s: u32) -> Result<()> {
        let seg_seq = self.inner.index.read().segs[seg as usize].seq;
        let mut w = self.inner.writer.lock();
        let gs = self.inner.geo.seg_stripes * seg as u64 + s as u64;
        w.image.clear();
        let mut footer = Footer {
            uuid: self.inner.uuid,
            seg,
            stripe: s,
            seg_seq,
            stripe_seq: self.next_seq(),
            nentries: 0,
            flags: 0,
            summary_crc: 0,
        };
        let summary = format::encode_summary(&[], &mut footer);
        let sd = self.inner.geo.stripe_data();
        w.image
            .place(&self.inner.geo, gs, sd - summary.len(), &summary);
        w.image.encode(&self.inner.geo, gs);
        self.inner.write_image(&w.image, gs)?;
        w.image.clear();
        drop(w);
        self.inner.sync_all()
    }

    /// Re-derives the newest surviving version of `keys` from every valid stripe.
    fn reload_keys(&self, keys: &[Key]) -> Result<()> {
        let want: std::collections::HashSet<Key> = keys.iter().copied().collect();
        let segs: Vec<SegInfo> = self.inner.index.read().segs.clone();
        let mut best: Newest = HashMap::new();
        for (seg, info) in segs.iter().enumerate() {
            if info.state == SegState::Free {
                continue;
            }
            for s in 0..info.stripes {
                let Some((_, ents)) = self.read_summary(seg as u32, s) else {
                    continue;
                };
                for e in ents {
                    let k = (e.obj, e.page);
                    if want.contains(&k) && best.get(&k).is_none_or(|b| e.version > b.0.version) {
                        best.insert(k, (e, seg as u32, s));
                    }
                }
            }
        }
        let mut idx = self.inner.index.write();
        idx.install(best);
        Ok(())
    }

    /// Reads and verifies the summary of stripe `s` of `seg`; None if it is not a valid stripe.
    pub(super) fn read_summary(&self, seg: u32, s: u32) -> Option<(Footer, Vec<Entry>)> {
        let geo = &self.inner.geo;
        let gs = geo.seg_stripes * seg as u64 + s as u64;
        let sd = geo.stripe_data();
        let max_blocks = geo.stripe_blocks() as u32;
        let check_footer = |b: &[u8]| -> bool {
            format::Footer::decode(&b[b.len() - format::FOOTER_SIZE..])
                .map(|f| f.uuid == self.inner.uuid)
                .unwrap_or(false)
        };
        let last = self
            .read_checked(gs, sd - BLOCK, BLOCK, &check_footer)
            .ok()?;
        let footer = format::Footer::decode(&last[BLOCK - format::FOOTER_SIZE..]).ok()?;
        let need = format::summary_bytes(footer.nentries as usize).div_ceil(BLOCK) * BLOCK;
        if need > sd {
            return None;
        }
        let tail = if need <= BLOCK {
            last
        } else {
            let check = |b: &[u8]| format::decode_summary(b, max_blocks).is_ok();
            self.read_checked(gs, sd - need, need, &check).ok()?
        };
        format::decode_summary(&tail, max_blocks).ok()
    }
}
