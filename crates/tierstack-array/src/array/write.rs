//! Writes: values are appended to the open stripe in DRAM; a full stripe (or the open one at a
//! flush, padded) is sealed with its summary and written with its parity by a background
//! thread, a few in flight at a time. Segment allocation and FREE markers.

use std::sync::atomic::Ordering::Relaxed;

use crate::error::{ArrayError, Result};
use crate::format::{self, Entry, Footer, FOOTER_FREE};
use crate::image::StripeImage;
use crate::layout::{BLOCK, MAX_VALUE};

use super::{blocks_of, Array, Class, InFlight, Key, Loc, SegInfo, SegState, Tomb, Writer};

impl Array {
    /// Stores `value` (at most [`MAX_VALUE`] bytes) under `key`. Durable after [`Array::flush`].
    pub fn put(&self, key: Key, value: &[u8]) -> Result<()> {
        if value.len() > MAX_VALUE {
            return Err(ArrayError::TooLarge(value.len(), MAX_VALUE));
        }
        self.refuse_if_read_only()?;
        let mut w = self.inner.writer.lock();
        let v = self.next_seq();
        self.append(&mut w, key, v, value, Class::User)?;
        self.inner
            .counters
            .user_bytes
            .fetch_add(value.len() as u64, Relaxed);
        Ok(())
    }

    /// Removes `key`. Returns whether it existed. Durable after [`Array::flush`].
    pub fn delete(&self, key: Key) -> Result<bool> {
        self.refuse_if_read_only()?;
        let mut w = self.inner.writer.lock();
        if !self.inner.index.read().map.contains_key(&key) {
            return Ok(false);
        }
        let v = self.next_seq();
        self.append_tomb(&mut w, key, v, Class::Delete)?;
        Ok(true)
    }

    /// The durability point: returns when everything written before it is on the drives with
    /// its redundancy.
    pub fn flush(&self) -> Result<()> {
        if self.inner.read_only {
            return Ok(());
        }
        let mut w = self.inner.writer.lock();
        self.flush_locked(&mut w)
    }

    /// Puts everything written so far in the drives' files, without waiting for it to be
    /// durable: the open stripe is sealed (padded) and the stripes in flight are written.
    /// What a read-only view made next sees (see `Array::read_only_view`).
    pub fn settle(&self) -> Result<()> {
        if self.inner.read_only {
            return Ok(());
        }
        let mut w = self.inner.writer.lock();
        if w.dirty {
            self.seal_stripe(&mut w)?;
        }
        self.finish_inflight(&mut w)
    }

    pub(super) fn flush_locked(&self, w: &mut Writer) -> Result<()> {
        if w.dirty {
            self.seal_stripe(w)?;
        }
        self.finish_inflight(w)?;
        self.inner.sync_all()
    }

    fn stripe_fits(&self, w: &Writer, blocks: u32, extra_entries: usize) -> bool {
        let sd = self.inner.geo.stripe_data();
        (w.used_blocks + blocks) as usize * BLOCK
            + format::summary_bytes(w.entries.len() + extra_entries)
            <= sd
    }

    /// Makes sure the writer has an open stripe with room for `blocks` more blocks and one entry.
    fn make_room(&self, w: &mut Writer, blocks: u32, class: Class) -> Result<()> {
        if w.seg.is_some() && self.stripe_fits(w, blocks, 1) {
            return Ok(());
        }
        if w.seg.is_some() && w.dirty {
            self.seal_stripe(w)?;
        }
        if w.seg.is_none() {
            let seg = self.alloc_segment(w, class)?;
            w.seg = Some(seg);
            w.stripe = 0;
        }
        Ok(())
    }

    pub(super) fn append(
        &self,
        w: &mut Writer,
        key: Key,
        version: u64,
        value: &[u8],
        class: Class,
    ) -> Result<()> {
        let blocks = blocks_of(value.len());
        self.make_room(w, blocks, class)?;
        let Some(seg) = w.seg else {
            return Err(ArrayError::NoSpace("no open segment".into()));
        };
        let geo = &self.inner.geo;
        let gs = geo.seg_stripes * seg as u64 + w.stripe as u64;
        let block = w.used_blocks;
        w.image.place(geo, gs, block as usize * BLOCK, value);
        let crc = crc32c::crc32c(value);
        w.used_blocks += blocks;
        w.entries.push(Entry {
            obj: key.0,
            page: key.1,
            version,
            block,
            len: value.len() as u32,
            crc,
            flags: 0,
        });
        w.dirty = true;
        let loc = Loc {
            seg,
            stripe: w.stripe,
            block,
            len: value.len() as u32,
            crc,
            version,
            pending: true,
        };
        let mut idx = self.inner.index.write();
        idx.put(key, loc);
        idx.tombs.remove(&key);
        Ok(())
    }

    pub(super) fn append_tomb(
        &self,
        w: &mut Writer,
        key: Key,
        version: u64,
        class: Class,
    ) -> Result<()> {
        self.make_room(w, 0, class)?;
        let Some(seg) = w.seg else {
            return Err(ArrayError::NoSpace("no open segment".into()));
        };
        w.entries.push(Entry {
            obj: key.0,
            page: key.1,
            version,
            block: 0,
            len: 0,
            crc: 0,
            flags: format::ENTRY_TOMBSTONE,
        });
        w.dirty = true;
        let mut idx = self.inner.index.write();
        idx.take(&key);
        idx.tombs.insert(key, Tomb { version, seg });
        Ok(())
    }

    /// Writes the open stripe (padded) with its summary and parity, then advances.
    fn seal_stripe(&self, w: &mut Writer) -> Result<()> {
        let Some(seg) = w.seg else { return Ok(()) };
        let geo = &self.inner.geo;
        let gs = geo.seg_stripes * seg as u64 + w.stripe as u64;
        let seg_seq = self.inner.index.read().segs[seg as usize].seq;
        let mut footer = Footer {
            uuid: self.inner.uuid,
            seg,
            stripe: w.stripe,
            seg_seq,
            stripe_seq: self.next_seq(),
            nentries: 0,
            flags: 0,
            summary_crc: 0,
        };
        let summary = format::encode_summary(&w.entries, &mut footer);
        let sd = geo.stripe_data();
        w.image.place(geo, gs, sd - summary.len(), &summary);
        // Keep a few stripes in flight, like a queue depth: wait for the oldest when full.
        while w.inflight.len() >= self.inner.inflight {
            self.finish_oldest(w)?;
        }
        let fresh = w.spare.pop().unwrap_or_else(|| StripeImage::new(geo));
        let mut img = std::mem::replace(&mut w.image, fresh);
        let inner = self.inner.clone();
        // Parity is computed on the writer thread, overlapping the next stripe's filling.
        let handle = std::thread::Builder::new()
            .name("ts-stripe".into())
            .spawn(move || {
                img.encode(&inner.geo, gs);
                let r = inner.write_image(&img, gs);
                (r, img)
            })
            .map_err(|e| ArrayError::io("starting the stripe writer", e))?;
        w.inflight.push_back(InFlight {
            handle,
            seg,
            stripe: w.stripe,
            entries: std::mem::take(&mut w.entries),
        });
        let pad = geo.stripe_blocks() as u64 - w.used_blocks as u64;
        self.inner.counters.pad_blocks.fetch_add(pad, Relaxed);
        w.used_blocks = 0;
        w.dirty = false;
        w.stripe += 1;
        if w.stripe as u64 >= geo.seg_stripes {
            w.seg = None;
        }
        Ok(())
    }

    /// Waits for every stripe in flight (see [`Array::finish_oldest`]).
    pub(super) fn finish_inflight(&self, w: &mut Writer) -> Result<()> {
        let mut res = Ok(());
        while !w.inflight.is_empty() {
            let r = self.finish_oldest(w);
            if res.is_ok() {
                res = r;
            }
        }
        res
    }

    /// Waits for the oldest stripe in flight, then publishes it: its records stop being
    /// pending and its segment counts it (and is sealed after its last stripe).
    pub(super) fn finish_oldest(&self, w: &mut Writer) -> Result<()> {
        let Some(f) = w.inflight.pop_front() else {
            return Ok(());
        };
        let res = match f.handle.join() {
            Ok((r, img)) => {
                // No need to zero it: padding is covered by parity like any data, and
                // summaries are read back by their exact length.
                w.spare.push(img);
                r
            }
            Err(_) => Err(ArrayError::DataLoss("the stripe writer panicked".into())),
        };
        {
            let mut idx = self.inner.index.write();
            for e in &f.entries {
                if e.is_tombstone() {
                    continue;
                }
                if let Some(l) = idx.map.get_mut(&(e.obj, e.page)) {
                    if l.version == e.version {
                        l.pending = false;
                    }
                }
            }
            let info = &mut idx.segs[f.seg as usize];
            info.stripes = f.stripe + 1;
            if f.stripe as u64 + 1 >= self.inner.geo.seg_stripes {
                info.state = SegState::Sealed;
            }
        }
        res
    }

    fn alloc_segment(&self, w: &mut Writer, class: Class) -> Result<u32> {
        loop {
            let (free, pick) = {
                let idx = self.inner.index.read();
                let free = idx
                    .segs
                    .iter()
                    .filter(|s| s.state == SegState::Free)
                    .count() as u64;
                let pick = idx.segs.iter().position(|s| s.state == SegState::Free);
                (free, pick)
            };
            let allowed = match class {
                Class::User => free > self.inner.reserve,
                // Deletes may dip into the reserve (they make room), but leave the cleaner one.
                Class::Delete => free > 1,
                Class::Cleaner => free > 0,
            };
            if allowed {
                if let Some(seg) = pick {
                    let seq = self.next_seq();
                    let mut idx = self.inner.index.write();
                    idx.segs[seg] = SegInfo {
                        state: SegState::Open,
                        seq,
                        stripes: 0,
                        live_blocks: 0,
                        live_recs: 0,
                    };
                    return Ok(seg as u32);
                }
            }
            let gained =
                class != Class::Cleaner && self.clean_one(w)? && self.free_segments() > free;
            if !gained {
                return Err(ArrayError::NoSpace(format!(
                    "{} of {} segments free, nothing left to clean",
                    free, self.inner.geo.nsegs
                )));
            }
        }
    }

    fn free_segments(&self) -> u64 {
        let idx = self.inner.index.read();
        idx.segs
            .iter()
            .filter(|s| s.state == SegState::Free)
            .count() as u64
    }

    /// Writes a FREE marker as stripe 0 of `seg`, so that recovery ignores its old contents.
    pub(super) fn write_marker(&self, w: &mut Writer, seg: u32) -> Result<()> {
        let geo = &self.inner.geo;
        let gs = geo.seg_stripes * seg as u64;
        let mut img = StripeImage::new(geo);
        let mut footer = Footer {
            uuid: self.inner.uuid,
            seg,
            stripe: 0,
            seg_seq: self.next_seq(),
            stripe_seq: self.next_seq(),
            nentries: 0,
            flags: FOOTER_FREE,
            summary_crc: 0,
        };
        let summary = format::encode_summary(&[], &mut footer);
        img.place(geo, gs, geo.stripe_data() - summary.len(), &summary);
        img.encode(geo, gs);
        let _ = w;
        self.inner.write_image(&img, gs)
    }
}
