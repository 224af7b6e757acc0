//! A file's contents drained to BACKING: a staged (renamed) base copied within BACKING, the
//! dirty pages written under a temporary name, fsynced and renamed into place.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use rustix::fs::OFlags;

use crate::backing::Backing;
use crate::core::{DrainPass, Drained, PAGE};
use crate::db::JOp;

use super::{tmp_name, Drainer};

/// Copies bytes `[from, len)` of `src` to the same place in `dst` inside BACKING
/// (`copy_file_range`, which a file system may do without moving the bytes through us;
/// read and write where it cannot).
pub(super) fn copy_within_backing(src: &File, dst: &File, from: u64, len: u64) -> io::Result<()> {
    let mut off = from;
    while off < len {
        let (mut i, mut o) = (off, off);
        match rustix::fs::copy_file_range(
            src,
            Some(&mut i),
            dst,
            Some(&mut o),
            (len - off) as usize,
        ) {
            Ok(0) => break,
            Ok(n) => off += n as u64,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => {
                let mut buf = vec![0u8; PAGE as usize];
                while off < len {
                    let want = (len - off).min(PAGE) as usize;
                    let n = src.read_at(&mut buf[..want], off)?;
                    if n == 0 {
                        break;
                    }
                    dst.write_all_at(&buf[..n], off)?;
                    off += n as u64;
                }
            }
        }
    }
    Ok(())
}

/// The runs of `v` (as byte ranges) made of `block`-sized pieces that are not all zero.
pub(super) fn nonzero_runs(v: &[u8], block: usize) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, c) in v.chunks(block).enumerate() {
        if c.iter().all(|b| *b == 0) {
            continue;
        }
        let (a, b) = (i * block, i * block + c.len());
        match out.last_mut() {
            Some(last) if last.1 == a => last.1 = b,
            _ => out.push((a, b)),
        }
    }
    out
}

/// Punches the parts of `[pstart, pstart + len)` in `out` that lie outside `runs`
/// (page-relative, in order): bytes a punched or truncated range left in an earlier pass.
fn punch_between(out: &File, pstart: u64, len: usize, runs: &[(usize, usize)]) -> io::Result<()> {
    let mut at = 0usize;
    let mut gaps = Vec::new();
    for (a, b) in runs {
        if *a > at {
            gaps.push((at, *a));
        }
        at = *b;
    }
    if at < len {
        gaps.push((at, len));
    }
    for (a, b) in gaps {
        let r = rustix::fs::fallocate(
            out,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            pstart + a as u64,
            (b - a) as u64,
        );
        if r.is_err() {
            // No punching there: zeros do.
            out.write_all_at(&vec![0u8; b - a], pstart + a as u64)?;
        }
    }
    Ok(())
}

impl Drainer {
    /// Drains a file's dirty pages into its staging file in BACKING (a temporary name in the
    /// directory of the file, or wherever an earlier pass staged it). While the file is still
    /// open, that is all (the pages are then clean and may leave the fast tier; the staging
    /// file is their base). After the last close, the staging file gets the final size, owner,
    /// mode and times, is synced and renamed into place: BACKING never shows a half-written
    /// file, and each byte is written to BACKING once however often the drain runs.
    pub(super) fn drain_file(&self, op: &JOp) -> io::Result<()> {
        let c = &self.core;
        let bk = c.backing();
        let Some(pass) = c.begin_drain(op.ino) else {
            // Deleted since (its later unlink removes every path this op would write), or
            // nothing to drain.
            return Ok(());
        };
        let (open, size) = (pass.open(), pass.size());
        let (staged, base, ext) = (pass.staged(), pass.base(), pass.extents());
        tracing::debug!(
            "drain file: inode {} {} size {size} ver {} staged {:?} base {:?} extents {} open {open}",
            op.ino,
            String::from_utf8_lossy(&op.p1),
            pass.ver(),
            staged.map(String::from_utf8_lossy),
            base.map(|(b, l)| (String::from_utf8_lossy(b), l)),
            ext.is_some()
        );
        let (dir, dname) = bk.parent(&op.p1)?;
        let (sdir, sname, srel) = match staged {
            Some(rel) => {
                let (sd, sn) = bk.parent(rel)?;
                (sd, sn.to_vec(), rel.to_vec())
            }
            None => {
                let name = tmp_name(op.ino, "");
                let (dpart, _) = crate::backing::split(&op.p1);
                let rel = crate::core::join_rel(dpart, &name);
                (bk.dir(dpart)?, name, rel)
            }
        };
        let flags = if staged.is_some() {
            OFlags::RDWR | OFlags::CREATE
        } else {
            OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC
        };
        if staged.is_none() {
            c.note_staging(&srel, op.ino)
                .map_err(|e| io::Error::other(e.to_string()))?;
            self.sweep_due
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let file = Backing::open_in(&sdir, &sname, flags, 0o600)?;
        let res = (|| -> io::Result<(Vec<(u64, u64)>, u64)> {
            let mut have = match staged {
                // Bytes a truncation took away since the last pass are not the file's.
                Some(_) => {
                    let keep = c.staged_len(&pass);
                    file.set_len(keep)?;
                    keep
                }
                None => 0,
            };
            if let Some((brel, blen)) = base {
                // The file was drained whole before: its unchanged bytes come from there.
                // Only its allocated ranges: its holes stay holes.
                let src = bk.open_file(brel, OFlags::RDONLY, 0)?;
                let ranges = match ext {
                    Some(e) => e.within(0, blen),
                    None => crate::backing::data_ranges(&src, blen)?,
                };
                for (a, b) in ranges {
                    copy_within_backing(&src, &file, a, b)?;
                }
                have = blen;
            }
            self.write_dirty(&pass, size, have, &file, ext, staged.is_some())
        })();
        let (drained, written) = match res {
            Ok(v) => v,
            Err(e) => {
                if staged.is_none() {
                    let _ = Backing::unlink(&sdir, &sname, false);
                }
                return Err(e);
            }
        };
        if open {
            file.sync_data()?;
            if staged.is_none() {
                Backing::fsync_dir(&sdir)?;
            }
        } else {
            let finish = || -> io::Result<()> {
                file.set_len(size)?;
                // Blocks the file reserved without writing them (fallocate) are reserved in
                // BACKING too; a BACKING that cannot reserve keeps them as holes.
                if let Some(e) = ext {
                    for (a, b) in e.ranges() {
                        let r = rustix::fs::fallocate(
                            &file,
                            rustix::fs::FallocateFlags::KEEP_SIZE,
                            a,
                            b - a,
                        );
                        if r.is_err() {
                            break;
                        }
                    }
                }
                self.apply_attrs_fd(op.ino, &file)?;
                // The renamed file replaces the old one in BACKING: it takes the extended
                // attributes along. A BACKING without them reports it through the xattr rows.
                let xattrs = c.node_xattrs(op.ino);
                for (k, v) in &xattrs {
                    if let Err(e) = Backing::set_xattr_fd(&file, k, v) {
                        tracing::warn!(
                            "drain: xattr {} of {}: {e}",
                            String::from_utf8_lossy(k),
                            String::from_utf8_lossy(&op.p1)
                        );
                    }
                }
                file.sync_all()?;
                Backing::rename(&sdir, &sname, &dir, dname)?;
                // Further hard links of the file.
                for (i, other) in op
                    .p2
                    .split(|b| *b == 0)
                    .filter(|p| !p.is_empty())
                    .enumerate()
                {
                    let (odir, oname) = bk.parent(other)?;
                    let t2 = tmp_name(op.ino, &format!(".l{i}"));
                    let (opart, _) = crate::backing::split(other);
                    c.note_staging(&crate::core::join_rel(opart, &t2), op.ino)
                        .map_err(|e| io::Error::other(e.to_string()))?;
                    let _ = Backing::unlink(&odir, &t2, false);
                    Backing::link(&dir, dname, &odir, &t2)?;
                    Backing::rename(&odir, &t2, &odir, oname)?;
                    Backing::fsync_dir(&odir)?;
                }
                // The staging name's folder (where the rename took the name away) and the
                // file's (where it put it); one sync when they are one folder, as they are
                // unless an earlier pass staged the file elsewhere: a small file's drain
                // costs two syncs, not three.
                if crate::backing::split(&srel).0 != crate::backing::split(&op.p1).0 {
                    Backing::fsync_dir(&sdir)?;
                }
                Backing::fsync_dir(&dir)
            };
            if let Err(e) = finish() {
                if staged.is_none() {
                    let _ = Backing::unlink(&sdir, &sname, false);
                }
                return Err(e);
            }
        }
        let base_blocks = {
            use std::os::unix::fs::MetadataExt;
            file.metadata().map_or(size.div_ceil(512), |m| m.blocks())
        };
        // BACKING holds the contents now (staged or in place): record that durably before
        // anything is dropped.
        let done = Drained {
            pages: &drained,
            written,
            base_blocks,
            staged_at: &srel,
            path: &op.p1,
        };
        c.finish_drain(&pass, &done)
            .map_err(|e| io::Error::other(e.to_string()))?;
        if !open {
            // Renamed into place: the temporary names are gone from BACKING.
            let _ = c.forget_staging(&srel);
            for (i, other) in op
                .p2
                .split(|b| *b == 0)
                .filter(|p| !p.is_empty())
                .enumerate()
            {
                let (opart, _) = crate::backing::split(other);
                let t2 = tmp_name(op.ino, &format!(".l{i}"));
                let _ = c.forget_staging(&crate::core::join_rel(opart, &t2));
            }
        }
        Ok(())
    }

    /// Writes the dirty pages of a file below `size` to `out`; `have`: bytes `out` already
    /// holds (an all-zero page past them is a hole and is not written). Returns the (page,
    /// version) of the pages written and the bytes written.
    /// With the file's allocation (`ext`), only its allocated ranges are written and, where
    /// `out` may hold older bytes (`reused`: a staging file of an earlier pass), the rest
    /// of each page is punched; without it, all-zero blocks past `have` stay holes.
    pub(super) fn write_dirty(
        &self,
        pass: &DrainPass,
        size: u64,
        have: u64,
        out: &File,
        ext: Option<&crate::core::extents::Extents>,
        reused: bool,
    ) -> io::Result<(Vec<(u64, u64)>, u64)> {
        let c = &self.core;
        let dirty = c.pages_to_drain(pass, size);
        let mut drained = Vec::new();
        let mut written = 0u64;
        for p in dirty {
            let data = c
                .read_dirty_page(pass, p)
                .map_err(|e| io::Error::other(e.to_string()))?;
            let Some((page, ver)) = data else { continue };
            let lim = (size - p * PAGE).min(PAGE) as usize;
            // A page that grew past the size this drain writes (the file was written to
            // since) is not all in BACKING: it stays dirty.
            if page.len() <= lim {
                drained.push((p, ver));
            }
            let v = &page[..lim.min(page.len())];
            let pstart = p * PAGE;
            let runs: Vec<(usize, usize)> = match ext {
                Some(e) => {
                    let runs: Vec<(usize, usize)> = e
                        .within(pstart, pstart + v.len() as u64)
                        .into_iter()
                        .map(|(a, b)| ((a - pstart) as usize, (b - pstart) as usize))
                        .collect();
                    if reused {
                        punch_between(out, pstart, v.len(), &runs)?;
                    }
                    runs
                }
                // Past what `out` holds, runs of zero blocks stay holes.
                None if pstart >= have => nonzero_runs(v, 4096),
                None => vec![(0, v.len())],
            };
            tracing::debug!(
                "drain page {p} (ver {ver}, {} bytes, have {have}, reused {reused}): runs {runs:?}",
                v.len()
            );
            for (a, b) in runs {
                if let Some(r) = &self.rate {
                    r.take((b - a) as u64);
                }
                out.write_all_at(&v[a..b], p * PAGE + a as u64)?;
                written += (b - a) as u64;
            }
            // A page shorter than the file there reads as zeros after its end (`page_copy`):
            // so must BACKING. Bytes `out` holds there (the base copied above, an earlier
            // pass's staging file) are not the file's: after a kill -9 the array may give
            // back an older, shorter version of a page than the one an earlier drain wrote.
            let tail = (pstart + lim as u64).min(have);
            if tail > pstart + v.len() as u64 {
                punch_between(out, pstart, (tail - pstart) as usize, &[(0, v.len())])?;
            }
        }
        Ok((drained, written))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonzero_runs_skip_zero_blocks() {
        let mut v = vec![0u8; 5 * 4096 + 10];
        v[4096] = 1;
        v[2 * 4096 + 5] = 1;
        v[5 * 4096 + 9] = 1;
        assert_eq!(
            nonzero_runs(&v, 4096),
            vec![(4096, 3 * 4096), (5 * 4096, 5 * 4096 + 10)]
        );
        assert!(nonzero_runs(&[0u8; 8192], 4096).is_empty());
    }
}
