//! Recovery at open: the index is rebuilt from the stripe summaries on the drives alone;
//! stripes torn by a crash (only those that were in flight) are voided.
//!
//! A summary that fails its checksums is repaired from redundancy (parity, or a mirror) and
//! rewritten in place. One that cannot be repaired is never taken for the end of the log or
//! for free space: among the newest `MAX_INFLIGHT` stripes it may have been torn by a crash
//! (its records were never acknowledged), so it is voided; anywhere else it is damage, and
//! `open` fails with [`ArrayError::DamagedSummaries`] unless told to quarantine its segment
//! ([`super::ArrayOptions::accept_damaged`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use crate::error::{ArrayError, FormatError, Result};
use crate::format::{self, Entry, Footer, FOOTER_FREE, FOOTER_SIZE};
use crate::layout::BLOCK;

use super::{Array, Key, Loc, Newest, SegInfo, SegState, MAX_INFLIGHT};

/// What the end of a stripe holds, as [`Array::read_summary`] reads it.
#[derive(Debug)]
pub(super) enum Summary {
    /// A summary of this array that decodes (repaired from redundancy where needed).
    Valid(Footer, Vec<Entry>),
    /// No summary of this array: never written (zeros), or bytes that are no footer of it.
    Absent,
    /// A summary of this array that fails its checksums, beyond what redundancy repairs: the
    /// footer when it decodes (then its entries are what failed).
    Damaged(Option<Footer>),
}

impl Summary {
    /// The entries of a valid summary.
    pub(super) fn entries(self) -> Option<Vec<Entry>> {
        match self {
            Summary::Valid(_, e) => Some(e),
            _ => None,
        }
    }
}

/// A stripe of a segment's current use, as recovery found it.
struct Found {
    /// When it was sealed, as a rank: `2 * stripe_seq + 1` for a stripe whose footer decodes;
    /// `2 * stripe_seq` of the next stripe of its use for a damaged one without a footer (it
    /// was sealed just before that one).
    order: u64,
    seg: u32,
    stripe: u32,
    /// Its summary is damaged beyond repair.
    damaged: bool,
}

impl Array {
    pub(super) fn recover(&self, accept_damaged: bool) -> Result<()> {
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
        let mut found: Vec<Found> = Vec::new();
        // Damaged stripes that cannot have been in flight at a crash.
        let mut lost: Vec<(u32, u32)> = Vec::new();
        for seg in 0..geo.nsegs as u32 {
            let mut seg_seq = None;
            for s in 0..geo.seg_stripes as u32 {
                let sum = self.read_summary(seg, s)?;
                // Whether a footer is that of stripe `s` of this segment's current use.
                let current = |f: &Footer| {
                    f.seg == seg && f.stripe == s && (s == 0 || Some(f.seg_seq) == seg_seq)
                };
                let (f, ents) = match sum {
                    Summary::Valid(f, ents) if current(&f) => (f, Some(ents)),
                    Summary::Damaged(Some(f)) if current(&f) => (f, None),
                    Summary::Damaged(None) if s == 0 => {
                        // Stripe 0 always holds a footer or zeros (see `unrepaired`).
                        lost.push((seg, s));
                        segs[seg as usize] = SegInfo {
                            state: SegState::Sealed,
                            seq: 0,
                            stripes: 1,
                            live_blocks: 0,
                            live_recs: 0,
                        };
                        break;
                    }
                    // A free segment (or one of another array).
                    _ if s == 0 => break,
                    _ => {
                        // Not a stripe of the current use: where it ends, unless a later stripe
                        // of the use follows (then this one was written, and is lost).
                        let Some(seq) = seg_seq else { break };
                        let Some(next) = self.later_stripe_of_use(seg, s + 1, seq)? else {
                            break;
                        };
                        found.push(Found {
                            order: 2 * next,
                            seg,
                            stripe: s,
                            damaged: true,
                        });
                        segs[seg as usize].stripes = s + 1;
                        continue;
                    }
                };
                max_seq = max_seq.max(f.stripe_seq).max(f.seg_seq);
                found.push(Found {
                    order: 2 * f.stripe_seq + 1,
                    seg,
                    stripe: s,
                    damaged: ents.is_none(),
                });
                if s == 0 {
                    if f.flags & FOOTER_FREE != 0 {
                        // A FREE marker: whatever its entries, the segment is free.
                        if let Some(last) = found.last_mut() {
                            last.damaged = false;
                        }
                        break;
                    }
                    seg_seq = Some(f.seg_seq);
                }
                segs[seg as usize] = SegInfo {
                    state: SegState::Sealed,
                    seq: f.seg_seq,
                    stripes: s + 1,
                    live_blocks: 0,
                    live_recs: 0,
                };
                for e in ents.into_iter().flatten() {
                    max_seq = max_seq.max(e.version);
                    let k = (e.obj, e.page);
                    if best.get(&k).is_none_or(|b| e.version > b.0.version) {
                        best.insert(k, (e, seg, s));
                    }
                }
            }
        }
        self.inner.seq.store(max_seq + 1, Relaxed);
        // Only the stripes that were in flight can be torn by a crash, and at most
        // MAX_INFLIGHT were: the newest ones. A damaged summary among them is voided (its
        // records were never acknowledged by a flush); any other is damage.
        found.sort_by_key(|f| std::cmp::Reverse(f.order));
        let window = found.len().min(MAX_INFLIGHT);
        lost.extend(
            found[window..]
                .iter()
                .filter(|f| f.damaged)
                .map(|f| (f.seg, f.stripe)),
        );
        lost.sort_unstable();
        if !lost.is_empty() {
            if !accept_damaged {
                return Err(ArrayError::DamagedSummaries { stripes: lost });
            }
            for &(seg, s) in &lost {
                tracing::error!(
                    "the summary of stripe {s} of segment {seg} is damaged beyond repair; \
                     segment {seg} is quarantined and keys written there may read back stale"
                );
                segs[seg as usize].state = SegState::Damaged;
            }
        }
        let mut idx = self.inner.index.write();
        idx.segs = segs;
        idx.damaged = lost;
        idx.install(best);
        drop(idx);
        for f in found[..window].iter().filter(|f| f.damaged) {
            tracing::warn!(
                "the summary of stripe {} of segment {} was torn by a crash; voiding the stripe \
                 (its records were never acknowledged)",
                f.stripe,
                f.seg
            );
            self.void_stripe(f.seg, f.stripe)?;
        }
        for f in found[..window].iter().filter(|f| !f.damaged) {
            self.check_torn(f.seg, f.stripe)?;
        }
        Ok(())
    }

    /// The stripe_seq of the first stripe of `seg` from `from` on that belongs to the use of
    /// the segment numbered `seg_seq` (its footer decodes, whether or not its entries do).
    fn later_stripe_of_use(&self, seg: u32, from: u32, seg_seq: u64) -> Result<Option<u64>> {
        for s in from..self.inner.geo.seg_stripes as u32 {
            let f = match self.read_summary(seg, s)? {
                Summary::Valid(f, _) | Summary::Damaged(Some(f)) => f,
                _ => continue,
            };
            if f.seg == seg && f.stripe == s && f.seg_seq == seg_seq {
                return Ok(Some(f.stripe_seq));
            }
        }
        Ok(None)
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
            idx.take(k);
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
                let Some(ents) = self.read_summary(seg as u32, s)?.entries() else {
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

    /// Reads and verifies the summary of stripe `s` of `seg`, repairing it from redundancy
    /// where it fails its checksums (the footer's, and the entries' whether they share the
    /// footer's block or not). Fails only where the drives cannot be read.
    pub(super) fn read_summary(&self, seg: u32, s: u32) -> Result<Summary> {
        let geo = &self.inner.geo;
        let uuid = self.inner.uuid;
        let gs = geo.seg_stripes * seg as u64 + s as u64;
        let sd = geo.stripe_data();
        let max_blocks = geo.stripe_blocks() as u32;
        let ours = |b: &[u8]| {
            Footer::decode(&b[b.len() - FOOTER_SIZE..])
                .ok()
                .filter(|f| f.uuid == uuid)
        };
        let need_of =
            |f: &Footer| format::summary_bytes(f.nentries as usize).div_ceil(BLOCK) * BLOCK;
        // The last block passes if its footer does, and the whole summary where it fits in
        // the block: a flipped entry is repaired like a flipped footer.
        let check_last = |b: &[u8]| match ours(b) {
            Some(f) if need_of(&f) <= BLOCK => format::decode_summary(b, max_blocks).is_ok(),
            Some(f) => need_of(&f) <= sd,
            None => false,
        };
        let last = match self.read_checked_raw(gs, sd - BLOCK, BLOCK, &check_last)? {
            Ok(b) => b,
            Err(raw) => return Ok(self.unrepaired(&raw, s)),
        };
        let Some(footer) = ours(&last) else {
            return Ok(Summary::Absent);
        };
        let need = need_of(&footer);
        let tail = if need <= BLOCK {
            last
        } else {
            let check = |b: &[u8]| format::decode_summary(b, max_blocks).is_ok();
            match self.read_checked_raw(gs, sd - need, need, &check)? {
                Ok(b) => b,
                Err(_) => return Ok(Summary::Damaged(Some(footer))),
            }
        };
        Ok(match format::decode_summary(&tail, max_blocks) {
            Ok((f, e)) => Summary::Valid(f, e),
            Err(_) => Summary::Damaged(Some(footer)),
        })
    }

    /// What the last block of stripe `s` of a segment holds when it fails the checks of
    /// [`Array::read_summary`] and redundancy cannot repair it. A footer of this array (its
    /// entries are what failed), or a footer's magic with a bad checksum, is damage. So is
    /// anything but zeros without the magic in stripe 0: `create` and the cleaner leave a
    /// FREE marker there (or zeros, in drive files `create` made), so stripe 0 always holds a
    /// footer or nothing; a later stripe may hold whatever the drive held before.
    fn unrepaired(&self, raw: &[u8], s: u32) -> Summary {
        let fb = &raw[raw.len() - FOOTER_SIZE..];
        match Footer::decode(fb) {
            Ok(f) if f.uuid == self.inner.uuid => Summary::Damaged(Some(f)),
            Ok(_) => Summary::Absent,
            Err(FormatError::Magic) if s == 0 && fb.iter().any(|&b| b != 0) => {
                Summary::Damaged(None)
            }
            Err(FormatError::Magic) => Summary::Absent,
            Err(_) => Summary::Damaged(None),
        }
    }
}
