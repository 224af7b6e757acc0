//! Whole-stripe I/O to the drives: stripe images written and read in one batch, drives
//! failed on write errors, sync, and the superblocks.

use std::sync::atomic::Ordering::Relaxed;

use crate::error::Result;
use crate::format::{DriveState, Superblock, SB_SIZE};
use crate::image::StripeImage;
use crate::io::{AlignedBuf, IoOp};

use super::{check_tolerance, io_err, Inner};

impl Inner {
    /// Writes a stripe image to every writable drive. A drive that fails the write is marked
    /// failed if the array can tolerate it; otherwise the error is returned.
    pub(super) fn write_image(&self, img: &StripeImage, gs: u64) -> Result<()> {
        let all: Vec<usize> = (0..self.geo.ndrives).collect();
        self.write_image_to(img, gs, &all)
    }

    fn write_image_to(&self, img: &StripeImage, gs: u64, targets: &[usize]) -> Result<()> {
        self.io_images(Some((std::slice::from_ref(img), gs, targets)), None)
            .map(|_| ())
    }

    /// In one batch: writes consecutive stripe images (from global stripe `wgs0`) to the drives
    /// in their target list, and reads consecutive images (from `rgs0`) from every readable
    /// drive not in their skip list. Drives that fail a write are marked failed (an error if
    /// that exceeds the redundancy). Returns the drives that could not be read.
    #[allow(clippy::type_complexity)]
    pub(super) fn io_images(
        &self,
        writes: Option<(&[StripeImage], u64, &[usize])>,
        reads: Option<(&mut [StripeImage], u64, &[usize])>,
    ) -> Result<Vec<usize>> {
        let geo = &self.geo;
        let mut lost: Vec<usize> = Vec::new();
        let failed_writes: Vec<usize> = {
            let drives = self.drives.read();
            let mut ops = Vec::new();
            // (drive, is_write)
            let mut which: Vec<(usize, bool)> = Vec::new();
            if let Some((imgs, gs0, targets)) = writes {
                for (j, img) in imgs.iter().enumerate() {
                    let offset = geo.drive_offset(geo.global_row(gs0 + j as u64, 0), 0);
                    for &i in targets {
                        let d = &drives.list[i];
                        if let (Some(f), true) = (&d.file, d.writable()) {
                            ops.push(IoOp::Write {
                                fd: f.fd(),
                                offset,
                                buf: &img.bufs[i][..],
                            });
                            which.push((i, true));
                        }
                    }
                }
            }
            let nwrites = ops.len();
            if let Some((imgs, gs0, skip)) = reads {
                lost.extend_from_slice(skip);
                for (j, img) in imgs.iter_mut().enumerate() {
                    let offset = geo.drive_offset(geo.global_row(gs0 + j as u64, 0), 0);
                    for (i, b) in img.bufs.iter_mut().enumerate() {
                        let d = &drives.list[i];
                        match &d.file {
                            Some(f) if d.readable() && !skip.contains(&i) => {
                                ops.push(IoOp::Read {
                                    fd: f.fd(),
                                    offset,
                                    buf: b.as_mut_slice(),
                                });
                                which.push((i, false));
                            }
                            _ => lost.push(i),
                        }
                    }
                }
            }
            let res = self.engine.submit(&mut ops);
            if nwrites > 0 {
                self.counters
                    .drive_bytes_written
                    .fetch_add((nwrites * geo.stripe_drive_bytes()) as u64, Relaxed);
                self.counters.stripes_written.fetch_add(1, Relaxed);
            }
            let mut bad = Vec::new();
            for (r, (i, is_write)) in res.iter().zip(which) {
                if r.is_ok() {
                    continue;
                }
                if is_write {
                    drives.list[i].counters.write_errors.fetch_add(1, Relaxed);
                    bad.push(i);
                } else {
                    drives.list[i].counters.read_errors.fetch_add(1, Relaxed);
                    lost.push(i);
                }
            }
            bad.sort_unstable();
            bad.dedup();
            bad
        };
        lost.sort_unstable();
        lost.dedup();
        if !failed_writes.is_empty() {
            self.drives_failed(&failed_writes)?;
        }
        Ok(lost)
    }

    fn drives_failed(&self, idxs: &[usize]) -> Result<()> {
        {
            let mut drives = self.drives.write();
            for &i in idxs {
                tracing::error!(
                    "drive {i} ({}) failed; continuing degraded",
                    drives.list[i].path.display()
                );
                drives.list[i].state = DriveState::Failed;
                drives.list[i].file = None;
            }
            drives.generation += 1;
            check_tolerance(&self.geo, &drives.list)?;
        }
        self.write_superblocks()
    }

    /// Reads every drive's part of a stripe into `img`, skipping `skip`. Returns the drives
    /// that could not be read (skip plus failures).
    pub(super) fn read_image(
        &self,
        img: &mut StripeImage,
        gs: u64,
        skip: &[usize],
    ) -> Result<Vec<usize>> {
        self.io_images(None, Some((std::slice::from_mut(img), gs, skip)))
    }

    pub(super) fn sync_all(&self) -> Result<()> {
        let drives = self.drives.read();
        for d in &drives.list {
            if let (Some(f), true) = (&d.file, d.writable()) {
                f.sync().map_err(|e| io_err(&d.path, e))?;
            }
        }
        Ok(())
    }

    /// Writes both superblock copies to every writable drive.
    pub(super) fn write_superblocks(&self) -> Result<()> {
        let drives = self.drives.read();
        let geo = &self.geo;
        let states: Vec<DriveState> = drives.list.iter().map(|d| d.state).collect();
        for (i, d) in drives.list.iter().enumerate() {
            let Some(f) = d.file.as_ref().filter(|_| d.writable()) else {
                continue;
            };
            let sb = Superblock {
                uuid: self.uuid,
                drive_index: i as u32,
                ndrives: geo.ndrives as u32,
                level: geo.level.number(),
                chunk: geo.chunk as u32,
                groups: geo.groups as u32,
                stripe_rows: geo.stripe_rows as u32,
                seg_stripes: geo.seg_stripes as u32,
                nsegs: geo.nsegs as u32,
                rows: geo.rows,
                generation: drives.generation,
                created: drives.created,
                states: states.clone(),
            };
            let mut buf = AlignedBuf::new(2 * SB_SIZE);
            let enc = sb.encode();
            buf[..SB_SIZE].copy_from_slice(&enc);
            buf[SB_SIZE..].copy_from_slice(&enc);
            let mut ops = [IoOp::Write {
                fd: f.fd(),
                offset: 0,
                buf: &buf[..],
            }];
            if let Some(Err(e)) = self.engine.submit(&mut ops).pop() {
                d.counters.write_errors.fetch_add(1, Relaxed);
                return Err(io_err(&d.path, e));
            }
            f.sync().map_err(|e| io_err(&d.path, e))?;
        }
        Ok(())
    }
}
