//! A file's contents drained to BACKING: a staged (renamed) base copied within BACKING, the
//! dirty pages written under a temporary name, fsynced and renamed into place.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use std::os::fd::OwnedFd;

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

/// Makes a written file's staging file durable: its data (and, once closed, its size and
/// attributes too) with `fsync`; a file still open only its data.
pub(super) fn sync_written(w: &Written) -> io::Result<()> {
    if w.pass.open() {
        w.file.sync_data()
    } else {
        w.file.sync_all()
    }
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

/// A file's contents written into its staging file in BACKING by [`Drainer::write_file`]:
/// not yet durable, not yet in place. [`Drainer::drain_file`] commits one at once;
/// [`super::batch`] commits many together (their syncs shared).
pub(super) struct Written {
    pub(super) op: JOp,
    pass: DrainPass,
    file: File,
    /// The staging file's path in BACKING.
    srel: Vec<u8>,
    /// Made by this pass (not an earlier pass's staging file): removed again on failure.
    fresh: bool,
    /// (page, version) of the pages written.
    drained: Vec<(u64, u64)>,
    written: u64,
}

impl Written {
    /// The file was open when its pass began: staged, not put in place.
    pub(super) fn open(&self) -> bool {
        self.pass.open()
    }

    /// The device of the file system the staging file is on.
    pub(super) fn dev(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        self.file.metadata().ok().map(|m| m.dev())
    }
}

/// Directories of BACKING opened once per commit (a batch touches few folders), by path.
pub(super) struct Dirs<'a> {
    bk: &'a Backing,
    open: std::collections::BTreeMap<Vec<u8>, OwnedFd>,
}

impl<'a> Dirs<'a> {
    pub(super) fn new(bk: &'a Backing) -> Dirs<'a> {
        Dirs {
            bk,
            open: Default::default(),
        }
    }

    /// Directory `rel` (empty: the root), opened at its first use.
    pub(super) fn get(&mut self, rel: &[u8]) -> io::Result<&OwnedFd> {
        if !self.open.contains_key(rel) {
            let fd = self.bk.dir(rel)?;
            self.open.insert(rel.to_vec(), fd);
        }
        self.open
            .get(rel)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    /// `fsync`s each directory of `rels` once.
    pub(super) fn sync(&mut self, rels: &std::collections::BTreeSet<Vec<u8>>) -> io::Result<()> {
        for r in rels {
            Backing::fsync_dir(self.get(r)?)?;
        }
        Ok(())
    }
}

/// The further hard links of a data row (`p2`: NUL-separated paths), with the temporary name
/// each is made under (in its own folder) before it is renamed into place.
fn further_links(op: &JOp) -> impl Iterator<Item = (&[u8], Vec<u8>)> {
    op.p2
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .enumerate()
        .map(move |(i, other)| (other, tmp_name(op.ino, &format!(".l{i}"))))
}

impl Drainer {
    /// Drains a file's contents at once, with its own syncs: [`Drainer::write_file`], the
    /// staging file synced, put in place ([`Drainer::put_in_place`]), its folders synced,
    /// then [`Drainer::finish_written`]. The batched drain ([`super::batch`]) does the same
    /// steps for many files with one sync per step, and falls back to this for a file whose
    /// batch failed.
    pub(super) fn drain_file(&self, op: &JOp) -> io::Result<()> {
        let Some(w) = self.write_file(op)? else {
            return Ok(());
        };
        self.commit_written(w)
    }

    /// The steps of [`Drainer::drain_file`] after [`Drainer::write_file`]: synced, put in
    /// place, its folders synced, the pass finished.
    pub(super) fn commit_written(&self, w: Written) -> io::Result<()> {
        let mut dirs = Dirs::new(self.core.backing());
        let r = (|| {
            sync_written(&w)?;
            let touched = self.put_in_place(&w, &mut dirs)?;
            dirs.sync(&touched)
        })();
        if let Err(e) = r {
            self.abandon(&w, &mut dirs);
            return Err(e);
        }
        self.finish_written(w)
    }

    /// Drains a file's dirty pages into its staging file in BACKING (a temporary name in the
    /// directory of the file, or wherever an earlier pass staged it), nothing synced yet.
    /// While the file is still open, that is all it will be (the pages are then clean once
    /// the staging file is durable, and may leave the fast tier; the staging file is their
    /// base). After the last close, the staging file also gets the final size, owner, mode,
    /// times and xattrs here, and is renamed into place once durable
    /// ([`Drainer::put_in_place`]): BACKING never shows a half-written file, and each byte is
    /// written to BACKING once however often the drain runs. None: nothing to drain.
    pub(super) fn write_file(&self, op: &JOp) -> io::Result<Option<Written>> {
        let Some(pass) = self.core.begin_drain(op.ino) else {
            // Deleted since (its later unlink removes every path this op would write), or
            // nothing to drain.
            return Ok(None);
        };
        self.write_pass(op, pass).map(Some)
    }

    /// [`Drainer::write_file`] once its pass has begun. The file may change meanwhile (no
    /// lock of the core is held between the pass's steps).
    pub(super) fn write_pass(&self, op: &JOp, pass: DrainPass) -> io::Result<Written> {
        let c = &self.core;
        let bk = c.backing();
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
        let fresh = staged.is_none();
        let flags = if fresh {
            OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC
        } else {
            OFlags::RDWR | OFlags::CREATE
        };
        if fresh {
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
                match bk.open_file(brel, OFlags::RDONLY, 0) {
                    Ok(src) => {
                        let ranges = match ext {
                            Some(e) => e.within(0, blen),
                            None => crate::backing::data_ranges(&src, blen)?,
                        };
                        for (a, b) in ranges {
                            copy_within_backing(&src, &file, a, b)?;
                        }
                    }
                    // Removed from BACKING by someone else (the mount still shows the
                    // file): drained from the pages the fast tier holds if they are all of
                    // it; else the row is refused, naming the removed copy.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        self.write_held(&pass, blen, &file).map_err(|e| {
                            if e.kind() != io::ErrorKind::NotFound {
                                return e;
                            }
                            io::Error::new(
                                io::ErrorKind::NotFound,
                                format!(
                                    "{}, this file's earlier copy in BACKING, was removed by someone else and the fast tier holds only part of it",
                                    String::from_utf8_lossy(brel)
                                ),
                            )
                        })?;
                    }
                    Err(e) => return Err(e),
                }
                have = blen;
            }
            let out = self.write_dirty(&pass, size, have, &file)?;
            if !open {
                self.final_attrs(op, &file, size, ext)?;
            }
            Ok(out)
        })();
        match res {
            Ok((drained, written)) => Ok(Written {
                op: op.clone(),
                pass,
                file,
                srel,
                fresh,
                drained,
                written,
            }),
            Err(e) => {
                if fresh {
                    let _ = Backing::unlink(&sdir, &sname, false);
                }
                Err(e)
            }
        }
    }

    /// What a closed file's staging file takes before it is put in place: the final size,
    /// the reserved blocks, mode, owner, times and extended attributes.
    fn final_attrs(
        &self,
        op: &JOp,
        file: &File,
        size: u64,
        ext: Option<&crate::core::extents::Extents>,
    ) -> io::Result<()> {
        file.set_len(size)?;
        // Blocks the file reserved without writing them (fallocate) are reserved in BACKING
        // too; a BACKING that cannot reserve keeps them as holes.
        if let Some(e) = ext {
            for (a, b) in e.ranges() {
                let r =
                    rustix::fs::fallocate(file, rustix::fs::FallocateFlags::KEEP_SIZE, a, b - a);
                if r.is_err() {
                    break;
                }
            }
        }
        self.apply_attrs_fd(op.ino, file)?;
        // The renamed file replaces the old one in BACKING: it takes the extended
        // attributes along. A BACKING without them reports it through the xattr rows.
        for (k, v) in &self.core.node_xattrs(op.ino) {
            if let Err(e) = Backing::set_xattr_fd(file, k, v) {
                tracing::warn!(
                    "drain: xattr {} of {}: {e}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(&op.p1)
                );
            }
        }
        Ok(())
    }

    /// Puts a closed file's durable staging file in place (and its further hard links, each
    /// made under a temporary name and renamed); nothing for a file still open. Returns the
    /// folders whose entries changed, to be synced before the row is retired: the staging
    /// file's (a fresh one was made there; a rename took the name away) and each link's.
    pub(super) fn put_in_place(
        &self,
        w: &Written,
        dirs: &mut Dirs<'_>,
    ) -> io::Result<std::collections::BTreeSet<Vec<u8>>> {
        let c = &self.core;
        let op = &w.op;
        let (spart, sname) = crate::backing::split(&w.srel);
        let mut touched = std::collections::BTreeSet::new();
        if w.fresh || !w.pass.open() {
            touched.insert(spart.to_vec());
        }
        if w.pass.open() {
            return Ok(touched);
        }
        let (dpart, dname) = crate::backing::split(&op.p1);
        if dname.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let sdir = dirs.get(spart)?.try_clone()?;
        Backing::rename(&sdir, sname, dirs.get(dpart)?, dname)?;
        touched.insert(dpart.to_vec());
        for (other, t2) in further_links(op) {
            let (opart, oname) = crate::backing::split(other);
            if oname.is_empty() {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            c.note_staging(&crate::core::join_rel(opart, &t2), op.ino)
                .map_err(|e| io::Error::other(e.to_string()))?;
            let ddir = dirs.get(dpart)?.try_clone()?;
            let odir = dirs.get(opart)?;
            let _ = Backing::unlink(odir, &t2, false);
            Backing::link(&ddir, dname, odir, &t2)?;
            Backing::rename(odir, &t2, odir, oname)?;
            touched.insert(opart.to_vec());
        }
        Ok(touched)
    }

    /// A written file that is not to be committed (a step failed): its fresh staging file
    /// is removed again unless it was renamed into place already.
    pub(super) fn abandon(&self, w: &Written, dirs: &mut Dirs<'_>) {
        if w.fresh {
            let (spart, sname) = crate::backing::split(&w.srel);
            if let Ok(d) = dirs.get(spart) {
                let _ = Backing::unlink(d, sname, false);
            }
        }
    }

    /// Ends the pass of a written file once BACKING holds it durably (staged, or in place
    /// after the last close): records that before anything is dropped
    /// ([`Core::finish_drain`]), then forgets the temporary names gone from BACKING.
    pub(super) fn finish_written(&self, w: Written) -> io::Result<()> {
        let c = &self.core;
        let (op, size) = (&w.op, w.pass.size());
        let base_blocks = {
            use std::os::unix::fs::MetadataExt;
            w.file.metadata().map_or(size.div_ceil(512), |m| m.blocks())
        };
        let done = Drained {
            pages: &w.drained,
            written: w.written,
            base_blocks,
            staged_at: &w.srel,
            path: &op.p1,
        };
        c.finish_drain(&w.pass, &done)
            .map_err(|e| io::Error::other(e.to_string()))?;
        if !w.pass.open() {
            // Renamed into place: the temporary names are gone from BACKING.
            let _ = c.forget_staging(&w.srel);
            for (other, t2) in further_links(op) {
                let (opart, _) = crate::backing::split(other);
                let _ = c.forget_staging(&crate::core::join_rel(opart, &t2));
            }
        }
        Ok(())
    }

    /// Writes the pages the fast tier holds of a file's first `blen` bytes (dirty or clean)
    /// to `out`, their allocated ranges only, in place of its base in BACKING (removed by
    /// someone else). Err(NotFound) when they are not all of its data there (`out`, a fresh
    /// staging file, is then removed by the caller).
    fn write_held(&self, pass: &DrainPass, blen: u64, out: &File) -> io::Result<()> {
        let c = &self.core;
        for p in 0..blen.div_ceil(PAGE) {
            let Some(got) = c.read_held_page(pass, p, blen)? else {
                continue;
            };
            let pstart = p * PAGE;
            let end = (pstart + got.data().len() as u64).min(blen);
            let runs = match got.alloc() {
                Some(a) => a.to_vec(),
                None => vec![(pstart, end)],
            };
            for (a, b) in runs {
                let b = b.min(end);
                if a < b {
                    out.write_all_at(&got.data()[(a - pstart) as usize..(b - pstart) as usize], a)?;
                }
            }
        }
        tracing::warn!(
            "drain: inode {}'s copy in BACKING was removed by someone else; drained from the fast tier, which holds all of it",
            pass.ino()
        );
        Ok(())
    }

    /// Writes the dirty pages of a file below `size` to `out`; `have`: bytes `out` already
    /// holds (the base copied, or an earlier pass's staging file). Returns the (page,
    /// version) of the pages written and the bytes written.
    /// Where the file's allocation is known, only its allocated ranges are written, as they
    /// are when the page is read (the file may have changed since the pass began), and
    /// where `out` holds older bytes the rest of each page is punched; without it, all-zero
    /// blocks past `have` stay holes.
    pub(super) fn write_dirty(
        &self,
        pass: &DrainPass,
        size: u64,
        have: u64,
        out: &File,
    ) -> io::Result<(Vec<(u64, u64)>, u64)> {
        let c = &self.core;
        let dirty = c.pages_to_drain(pass, size);
        let mut drained = Vec::new();
        let mut written = 0u64;
        for p in dirty {
            let got = c
                .read_dirty_page(pass, p)
                .map_err(|e| io::Error::other(e.to_string()))?;
            let Some(got) = got else { continue };
            let (page, ver) = (got.data(), got.ver());
            let lim = (size - p * PAGE).min(PAGE) as usize;
            // A page that grew past the size this drain writes (the file was written to
            // since) is not all in BACKING: it stays dirty.
            if page.len() <= lim {
                drained.push((p, ver));
            }
            let v = &page[..lim.min(page.len())];
            let pstart = p * PAGE;
            let runs: Vec<(usize, usize)> = match got.alloc() {
                Some(alloc) => {
                    let end = pstart + v.len() as u64;
                    let runs: Vec<(usize, usize)> = alloc
                        .iter()
                        .filter(|(a, _)| *a < end)
                        .map(|(a, b)| ((a - pstart) as usize, ((*b).min(end) - pstart) as usize))
                        .collect();
                    if pstart < have {
                        punch_between(out, pstart, v.len(), &runs)?;
                    }
                    runs
                }
                // Past what `out` holds, runs of zero blocks stay holes.
                None if pstart >= have => nonzero_runs(v, 4096),
                None => vec![(0, v.len())],
            };
            tracing::debug!(
                "drain page {p} (ver {ver}, {} bytes, have {have}): runs {runs:?}",
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
