//! Drive failure, replacement and rebuild (while the array keeps serving reads and writes).

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{ArrayError, FormatError, Result};
use crate::format::DriveState;
use crate::image::StripeImage;
use crate::io::DriveFile;

use super::assemble::{lock_drive, prepare_drive, read_superblock_path, version_error};
use super::{check_tolerance, hex, io_err, same_file, Array, SegState};

impl Array {
    /// Marks drive `i` failed (as if it had been pulled). Refused if the array would lose data.
    pub fn fail_drive(&self, i: usize) -> Result<()> {
        let _w = self.inner.writer.lock();
        let mut drives = self.inner.drives.write();
        if i >= drives.list.len() {
            return Err(ArrayError::Config(format!(
                "drive {i} does not exist: the array has drives 0..{}",
                drives.list.len() - 1
            )));
        }
        if drives.list[i].state == DriveState::Failed {
            return Err(ArrayError::Config(format!("drive {i} is already failed")));
        }
        let old = drives.list[i].state;
        drives.list[i].state = DriveState::Failed;
        if let Err(e) = check_tolerance(&self.inner.geo, &drives.list) {
            drives.list[i].state = old;
            return Err(e);
        }
        drives.list[i].file = None;
        drives.generation += 1;
        drop(drives);
        self.inner.write_superblocks()?;
        self.inner.sync_all()
    }

    /// Puts `path` in place of failed drive `i` (state rebuilding). Call [`Array::rebuild`] next.
    pub fn replace_drive(&self, i: usize, path: &Path) -> Result<()> {
        let _w = self.inner.writer.lock();
        {
            let drives = self.inner.drives.read();
            if i >= drives.list.len() {
                return Err(ArrayError::Config(format!("drive {i} does not exist")));
            }
            if drives.list[i].state != DriveState::Failed {
                return Err(ArrayError::Config(format!(
                    "drive {i} is {:?}, not failed: run `array fail` on it first",
                    drives.list[i].state
                )));
            }
            for (j, d) in drives.list.iter().enumerate() {
                if j != i && d.file.is_some() && same_file(&d.path, path) {
                    return Err(ArrayError::Config(format!(
                        "{} is already drive {j} of this array: give a new drive",
                        path.display()
                    )));
                }
            }
        }
        match read_superblock_path(path) {
            // A drive of a newer format is never rebuilt over.
            Err(ArrayError::Format(FormatError::Version(v))) => {
                return Err(version_error(path, v));
            }
            Ok(sb) if sb.uuid != self.inner.uuid => {
                return Err(ArrayError::Drive {
                    path: path.to_path_buf(),
                    msg: format!(
                        "belongs to another array ({}): wipe it or pick another drive",
                        hex(&sb.uuid)
                    ),
                });
            }
            _ => {}
        }
        let need = self.inner.geo.drive_bytes_used();
        let (created, size) = prepare_drive(path, Some(need))?;
        let cleanup = |e: ArrayError| {
            if created {
                let _ = std::fs::remove_file(path);
            }
            e
        };
        if size < need {
            return Err(cleanup(ArrayError::Drive {
                path: path.to_path_buf(),
                msg: format!("has {size} bytes, the array needs {need}: use a larger drive"),
            }));
        }
        let direct = self
            .inner
            .drives
            .read()
            .list
            .iter()
            .any(|d| d.file.as_ref().is_some_and(|f| f.direct));
        let df = DriveFile::open(path, direct).map_err(|e| cleanup(io_err(path, e)))?;
        lock_drive(&df, path, Duration::ZERO).map_err(cleanup)?;
        {
            let mut drives = self.inner.drives.write();
            let d = &mut drives.list[i];
            d.path = path.to_path_buf();
            d.file = Some(df);
            d.state = DriveState::Rebuilding;
            d.counters = Arc::default();
            drives.generation += 1;
        }
        self.inner.write_superblocks()?;
        self.inner.sync_all()
    }

    /// Reconstructs every drive in state rebuilding, stripe by stripe, while the array keeps
    /// serving reads and writes. `rate` limits the bytes written per second to the new drive(s);
    /// `progress(done, total)` is called after each stripe. Returns bytes written.
    pub fn rebuild(&self, rate: Option<u64>, progress: &dyn Fn(u64, u64)) -> Result<u64> {
        let targets: Vec<usize> = {
            let d = self.inner.drives.read();
            d.list
                .iter()
                .enumerate()
                .filter(|(_, d)| d.state == DriveState::Rebuilding)
                .map(|(i, _)| i)
                .collect()
        };
        if targets.is_empty() {
            return Ok(0);
        }
        if self.inner.rebuilding.swap(true, Relaxed) {
            return Err(ArrayError::Busy("a rebuild is already running".into()));
        }
        let res = self.rebuild_inner(&targets, rate, progress);
        self.inner.rebuilding.store(false, Relaxed);
        res
    }

    fn rebuild_inner(
        &self,
        targets: &[usize],
        rate: Option<u64>,
        progress: &dyn Fn(u64, u64),
    ) -> Result<u64> {
        let geo = self.inner.geo.clone();
        let total = geo.total_stripes();
        {
            let mut d = self.inner.drives.write();
            d.rebuild_total = total;
            d.rebuild_done = 0;
        }
        let start = Instant::now();
        let mut written = 0u64;
        // Stripes per batch: about 64 MiB of reads in flight (a deep queue is what lets the
        // drives' read bandwidth, which bounds a rebuild, be reached).
        let per_stripe = geo.stripe_drive_bytes() * geo.ndrives;
        let batch = ((64usize << 20) / per_stripe.max(1)).clamp(1, 16);
        let mut cur: Vec<StripeImage> = (0..batch).map(|_| StripeImage::new(&geo)).collect();
        let mut next: Vec<StripeImage> = (0..batch).map(|_| StripeImage::new(&geo)).collect();
        for seg in 0..geo.nsegs as usize {
            {
                // The writer lock keeps the segment from being cleaned, reused or appended to
                // underneath the rebuild.
                let mut w = self.inner.writer.lock();
                self.finish_inflight(&mut w)?;
                let info = self.inner.index.read().segs[seg];
                let upto = match info.state {
                    SegState::Free => 1,
                    SegState::Sealed | SegState::Damaged => info.stripes as u64,
                    SegState::Open if w.seg == Some(seg as u32) => w.stripe as u64,
                    SegState::Open => info.stripes as u64,
                };
                let base = geo.seg_stripes * seg as u64;
                let batches: Vec<(u64, usize)> = (0..upto)
                    .step_by(batch)
                    .map(|s| (base + s, (upto - s).min(batch as u64) as usize))
                    .collect();
                // Drives whose content must be reconstructed: the targets plus any other drive
                // that is failed or could not be read.
                let mut lost: Vec<usize> = targets.to_vec();
                if let Some(&(g0, n0)) = batches.first() {
                    lost = self
                        .inner
                        .io_images(None, Some((&mut cur[..n0], g0, targets)))?;
                }
                for (bi, &(gs0, n)) in batches.iter().enumerate() {
                    for (i, img) in cur[..n].iter_mut().enumerate() {
                        if !img.reconstruct_drives(&geo, gs0 + i as u64, &lost) {
                            return Err(ArrayError::DataLoss(format!(
                                "stripe {}: too many drives lost to rebuild",
                                gs0 + i as u64
                            )));
                        }
                    }
                    // Write this batch while the next one is read.
                    let rd = batches
                        .get(bi + 1)
                        .map(|&(g1, n1)| (&mut next[..n1], g1, targets));
                    let has_next = rd.is_some();
                    let l = self.inner.io_images(Some((&cur[..n], gs0, targets)), rd)?;
                    if has_next {
                        lost = l;
                    }
                    std::mem::swap(&mut cur, &mut next);
                    written += (geo.stripe_drive_bytes() * targets.len() * n) as u64;
                    if let Some(r) = rate.filter(|r| *r > 0) {
                        let due = Duration::from_secs_f64(written as f64 / r as f64);
                        let el = start.elapsed();
                        if due > el {
                            std::thread::sleep(due - el);
                        }
                    }
                }
                drop(w);
            }
            let done = geo.seg_stripes * (seg as u64 + 1);
            self.inner.drives.write().rebuild_done = done;
            progress(done, total);
        }
        self.inner.sync_all()?;
        {
            let _w = self.inner.writer.lock();
            let mut d = self.inner.drives.write();
            for &t in targets {
                d.list[t].state = DriveState::Online;
            }
            d.generation += 1;
            d.rebuild_total = 0;
        }
        self.inner.write_superblocks()?;
        self.inner.sync_all()?;
        Ok(written)
    }
}
