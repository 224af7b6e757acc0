//! Scrub: verifies every record checksum and all parity of every written stripe, and with
//! repair rewrites what redundancy can fix.

use std::sync::atomic::Ordering::Relaxed;

use crate::error::Result;
use crate::format;
use crate::image::StripeImage;
use crate::io::IoOp;
use crate::layout::BLOCK;

use super::read::culprit_sets;
use super::{Array, SegState};

/// Result of a scrub.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ScrubReport {
    /// Written stripes read and verified.
    pub stripes_checked: u64,
    /// Values whose checksum was verified.
    pub records_checked: u64,
    /// Values, and stripe summaries, that did not match their checksum.
    pub checksum_errors: u64,
    /// Redundancy chunks that disagreed with their data.
    pub parity_errors: u64,
    /// Chunks rewritten on the drives (with `repair` only).
    pub repaired: u64,
    /// Stripes or values that redundancy could not fix.
    pub unrepairable: u64,
}

impl ScrubReport {
    /// Whether the scrub found nothing wrong.
    pub fn clean(&self) -> bool {
        self.checksum_errors == 0 && self.parity_errors == 0 && self.unrepairable == 0
    }
}

impl Array {
    /// Verifies every record checksum and all parity of every written stripe; with `repair`,
    /// rewrites what it can fix from redundancy.
    pub fn scrub(&self, repair: bool, progress: &dyn Fn(u64, u64)) -> Result<ScrubReport> {
        let geo = self.inner.geo.clone();
        let total = geo.total_stripes();
        let mut rep = ScrubReport::default();
        let mut img = StripeImage::new(&geo);
        for gs in 0..total {
            let seg = (gs / geo.seg_stripes) as usize;
            let s = (gs % geo.seg_stripes) as u32;
            let mut w = self.inner.writer.lock();
            self.finish_inflight(&mut w)?;
            let info = self.inner.index.read().segs[seg];
            let written = match info.state {
                SegState::Free => false,
                _ => s < info.stripes,
            };
            if written {
                self.scrub_stripe(&mut img, gs, repair, &mut rep)?;
            }
            drop(w);
            progress(gs + 1, total);
        }
        if repair {
            self.inner.write_superblocks()?;
        }
        Ok(rep)
    }

    fn scrub_stripe(
        &self,
        img: &mut StripeImage,
        gs: u64,
        repair: bool,
        rep: &mut ScrubReport,
    ) -> Result<()> {
        let geo = &self.inner.geo;
        let lost: Vec<usize> = {
            let d = self.inner.drives.read();
            (0..geo.ndrives)
                .filter(|&i| !d.list[i].readable())
                .collect()
        };
        let lost = self.inner.read_image(img, gs, &lost)?;
        if !lost.is_empty() && !img.reconstruct_drives(geo, gs, &lost) {
            rep.unrepairable += 1;
            return Ok(());
        }
        rep.stripes_checked += 1;
        let sd = geo.stripe_data();
        let mut dirty: Vec<(usize, u64)> = Vec::new();
        // Summary: as long as the footer (in the last block) says; a summary can be several
        // MiB (tombstones take no data blocks). With a footer that does not decode, the last
        // 256 KiB are searched for a drive to blame, as before.
        let told = {
            let mut last = vec![0u8; BLOCK];
            img.gather(geo, gs, sd - BLOCK, &mut last);
            format::Footer::decode(&last[BLOCK - format::FOOTER_SIZE..])
                .ok()
                .filter(|f| f.uuid == self.inner.uuid)
                .map(|f| format::summary_bytes(f.nentries as usize).div_ceil(BLOCK) * BLOCK)
                .filter(|&n| n <= sd)
        };
        let mut tail = vec![0u8; told.unwrap_or(sd.min(BLOCK * 64)).max(BLOCK)];
        let tail_off = sd - tail.len();
        img.gather(geo, gs, tail_off, &mut tail);
        let max_blocks = geo.stripe_blocks() as u32;
        let entries = match format::decode_summary(&tail, max_blocks) {
            Ok((_, e)) => e,
            Err(_) => {
                // Try each drive as the culprit for the summary region.
                let found = self.scrub_fix(
                    img,
                    gs,
                    tail_off,
                    tail.len(),
                    &|b| format::decode_summary(b, max_blocks).is_ok(),
                    &mut dirty,
                );
                rep.checksum_errors += 1;
                if !found {
                    rep.unrepairable += 1;
                    return Ok(());
                }
                img.gather(geo, gs, tail_off, &mut tail);
                format::decode_summary(&tail, max_blocks)
                    .map(|(_, e)| e)
                    .unwrap_or_default()
            }
        };
        for e in entries.iter().filter(|e| !e.is_tombstone() && e.len > 0) {
            rep.records_checked += 1;
            let len = e.len as usize;
            let mut v = vec![0u8; len];
            img.gather(geo, gs, e.block as usize * BLOCK, &mut v);
            if crc32c::crc32c(&v) == e.crc {
                continue;
            }
            rep.checksum_errors += 1;
            let crc = e.crc;
            let ok = self.scrub_fix(
                img,
                gs,
                e.block as usize * BLOCK,
                len,
                &|b| crc32c::crc32c(&b[..len]) == crc,
                &mut dirty,
            );
            if !ok {
                rep.unrepairable += 1;
            }
        }
        // Parity (after data fixes).
        for (d, row) in img.parity_mismatches(geo, gs) {
            rep.parity_errors += 1;
            dirty.push((d, row));
        }
        if !dirty.is_empty() {
            img.encode(geo, gs);
        }
        dirty.sort_unstable();
        dirty.dedup();
        if repair && !dirty.is_empty() {
            let drives = self.inner.drives.read();
            for (d, row) in dirty {
                let drv = &drives.list[d];
                let Some(f) = drv.file.as_ref().filter(|_| drv.writable()) else {
                    continue;
                };
                let at = row as usize * geo.chunk;
                let mut ops = [IoOp::Write {
                    fd: f.fd(),
                    offset: geo.drive_offset(geo.global_row(gs, row), 0),
                    buf: &img.bufs[d][at..at + geo.chunk],
                }];
                if self.inner.engine.submit(&mut ops).iter().all(|r| r.is_ok()) {
                    rep.repaired += 1;
                    self.inner.counters.repaired.fetch_add(1, Relaxed);
                } else {
                    drv.counters.write_errors.fetch_add(1, Relaxed);
                }
            }
            drop(drives);
            self.inner.sync_all()?;
        }
        Ok(())
    }

    /// Finds the drive (or pair of drives, for two-parity levels) whose chunks in the range
    /// are wrong, fixes the image and records the chunks to rewrite. A bad drive may have
    /// corrupted several rows; all of its rows in the range are rebuilt together. Returns
    /// whether a fix was found.
    fn scrub_fix(
        &self,
        img: &mut StripeImage,
        gs: u64,
        off: usize,
        len: usize,
        check: &dyn Fn(&[u8]) -> bool,
        dirty: &mut Vec<(usize, u64)>,
    ) -> bool {
        let geo = &self.inner.geo;
        if geo.m == 0 {
            return false;
        }
        let mut rows: Vec<u64> = geo.pieces(off, len).iter().map(|p| p.row).collect();
        rows.dedup();
        for bad in culprit_sets(geo, gs, off, len) {
            let saved: Vec<(usize, u64, Vec<u8>)> = bad
                .iter()
                .flat_map(|&d| rows.iter().map(move |&r| (d, r)))
                .map(|(d, r)| {
                    let at = r as usize * geo.chunk;
                    (d, r, img.bufs[d][at..at + geo.chunk].to_vec())
                })
                .collect();
            let rebuilt = rows.iter().all(|&r| img.reconstruct_row(geo, gs, r, &bad));
            if rebuilt {
                let mut v = vec![0u8; len];
                img.gather(geo, gs, off, &mut v);
                if check(&v) {
                    let drv = self.inner.drives.read();
                    for (d, r, old) in &saved {
                        let at = *r as usize * geo.chunk;
                        if img.bufs[*d][at..at + geo.chunk] != old[..] {
                            drv.list[*d].counters.csum_errors.fetch_add(1, Relaxed);
                            dirty.push((*d, *r));
                        }
                    }
                    return true;
                }
            }
            for (d, r, old) in saved {
                let at = r as usize * geo.chunk;
                img.bufs[d][at..at + geo.chunk].copy_from_slice(&old);
            }
        }
        false
    }
}
