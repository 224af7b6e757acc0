//! Reads: normal and degraded (pieces on unreadable drives reconstructed from redundancy),
//! checksum-verified reads that find the culprit drive and repair it in place, and the
//! index queries.

use std::sync::atomic::Ordering::Relaxed;

use crate::error::{ArrayError, Result};
use crate::io::{AlignedBuf, IoOp};
use crate::layout::{Geometry, BLOCK};

use super::{blocks_of, Array, Drives, Index, Key, Loc};

impl Array {
    /// Reads stripe data `[off, off+len)` of global stripe `gs` (block aligned), reconstructing
    /// pieces on unreadable drives. `exclude` lists drives to treat as unreadable. Direct reads
    /// and the reads that feed reconstruction go to the drives in one batch.
    fn read_raw(&self, gs: u64, off: usize, len: usize, exclude: &[usize]) -> Result<AlignedBuf> {
        let geo = &self.inner.geo;
        let mut buf = AlignedBuf::new(len);
        let drives = self.inner.drives.read();
        let ok = |d: usize| drives.list[d].readable() && !exclude.contains(&d);
        let pieces = geo.pieces(off, len);
        // (row, group) -> chunk range [lo, hi) that must be reconstructed.
        let mut recon: Vec<(u64, usize, usize, usize)> = Vec::new();
        for p in &pieces {
            let d = geo.data_drive(geo.global_row(gs, p.row), p.unit);
            if ok(d) {
                continue;
            }
            let g = p.unit / geo.k;
            if !recon.iter().any(|r| r.0 == p.row && r.1 == g) {
                recon.push((p.row, g, p.off, p.off + p.len));
            }
        }
        // Every piece of a row-group being reconstructed comes from the reconstruction inputs,
        // so no chunk is read twice.
        for p in &pieces {
            let g = p.unit / geo.k;
            if let Some(r) = recon.iter_mut().find(|r| r.0 == p.row && r.1 == g) {
                r.2 = r.2.min(p.off);
                r.3 = r.3.max(p.off + p.len);
            }
        }
        let in_recon =
            |p: &crate::layout::Piece| recon.iter().any(|r| r.0 == p.row && r.1 == p.unit / geo.k);
        let n = geo.group_size;
        let mut inputs: Vec<Vec<AlignedBuf>> = recon
            .iter()
            .map(|r| (0..n).map(|_| AlignedBuf::new(r.3 - r.2)).collect())
            .collect();
        let mut present: Vec<Vec<bool>> = recon.iter().map(|_| vec![false; n]).collect();
        let mut failed_direct = Vec::new();
        {
            let mut ops = Vec::new();
            // What each op is: Ok(piece) for a direct read, Err((recon index, unit)) for an input.
            let mut which: Vec<std::result::Result<crate::layout::Piece, (usize, usize)>> =
                Vec::new();
            let mut rest: &mut [u8] = buf.as_mut_slice();
            let mut consumed = 0;
            for p in &pieces {
                let grow = geo.global_row(gs, p.row);
                let d = geo.data_drive(grow, p.unit);
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(p.dst - consumed);
                let (mine, tail) = tail.split_at_mut(p.len);
                rest = tail;
                consumed = p.dst + p.len;
                if in_recon(p) {
                    continue;
                }
                if let (Some(f), true) = (&drives.list[d].file, ok(d)) {
                    ops.push(IoOp::Read {
                        fd: f.fd(),
                        offset: geo.drive_offset(grow, p.off),
                        buf: mine,
                    });
                    which.push(Ok(*p));
                }
            }
            for (ri, (r, bufs)) in recon.iter().zip(inputs.iter_mut()).enumerate() {
                let grow = geo.global_row(gs, r.0);
                // Read the surviving data units and only as many redundancy units as there are
                // data units missing (RAID 6 with one drive gone does not read Q).
                let missing_data = (0..geo.k)
                    .filter(|&u| !ok(geo.unit_drive(grow, r.1, u)))
                    .count();
                let mut parity_wanted = missing_data;
                for (u, b) in bufs.iter_mut().enumerate() {
                    let d = geo.unit_drive(grow, r.1, u);
                    if u >= geo.k && ok(d) {
                        if parity_wanted == 0 {
                            continue;
                        }
                        parity_wanted -= 1;
                    }
                    if let (Some(f), true) = (&drives.list[d].file, ok(d)) {
                        ops.push(IoOp::Read {
                            fd: f.fd(),
                            offset: geo.drive_offset(grow, r.2),
                            buf: b.as_mut_slice(),
                        });
                        which.push(Err((ri, u)));
                    }
                }
            }
            for (res, w) in self.inner.engine.submit(&mut ops).into_iter().zip(which) {
                match (res, w) {
                    (Ok(()), Err((ri, u))) => present[ri][u] = true,
                    (Ok(()), Ok(_)) => {}
                    (Err(_), w) => {
                        let d = match w {
                            Ok(p) => geo.data_drive(geo.global_row(gs, p.row), p.unit),
                            Err((ri, u)) => {
                                geo.unit_drive(geo.global_row(gs, recon[ri].0), recon[ri].1, u)
                            }
                        };
                        drives.list[d].counters.read_errors.fetch_add(1, Relaxed);
                        if let Ok(p) = w {
                            failed_direct.push(p);
                        }
                    }
                }
            }
        }
        for (ri, r) in recon.iter().enumerate() {
            let width = r.3 - r.2;
            let mut refs: Vec<&mut [u8]> = inputs[ri]
                .iter_mut()
                .map(|b| &mut b.as_mut_slice()[..width])
                .collect();
            let ok_recon = crate::parity::reconstruct(geo.k, &mut refs, &present[ri]);
            for p in pieces
                .iter()
                .filter(|p| p.row == r.0 && p.unit / geo.k == r.1)
            {
                if !ok_recon {
                    // A read we counted on failed: rebuild this piece from every unit.
                    failed_direct.push(*p);
                    continue;
                }
                let src = &inputs[ri][p.unit % geo.k][p.off - r.2..p.off - r.2 + p.len];
                buf[p.dst..p.dst + p.len].copy_from_slice(src);
            }
        }
        if !failed_direct.is_empty() {
            self.reconstruct_pieces(&drives, gs, &failed_direct, exclude, buf.as_mut_slice())?;
        }
        Ok(buf)
    }

    /// Rebuilds data pieces from the other units of their groups into `out`.
    fn reconstruct_pieces(
        &self,
        drives: &Drives,
        gs: u64,
        pieces: &[crate::layout::Piece],
        exclude: &[usize],
        out: &mut [u8],
    ) -> Result<()> {
        let geo = &self.inner.geo;
        let n = geo.group_size;
        for p in pieces {
            let grow = geo.global_row(gs, p.row);
            let g = p.unit / geo.k;
            let target = p.unit % geo.k;
            let units_drv: Vec<usize> = (0..n).map(|u| geo.unit_drive(grow, g, u)).collect();
            let mut bufs: Vec<AlignedBuf> = (0..n).map(|_| AlignedBuf::new(p.len)).collect();
            let mut present = vec![false; n];
            {
                let mut ops = Vec::new();
                let mut which = Vec::new();
                for (u, b) in bufs.iter_mut().enumerate() {
                    let d = units_drv[u];
                    let drv = &drives.list[d];
                    if u == target || exclude.contains(&d) || !drv.readable() {
                        continue;
                    }
                    if let Some(f) = &drv.file {
                        ops.push(IoOp::Read {
                            fd: f.fd(),
                            offset: geo.drive_offset(grow, p.off),
                            buf: &mut b.as_mut_slice()[..p.len],
                        });
                        which.push(u);
                    }
                }
                for (r, u) in self.inner.engine.submit(&mut ops).into_iter().zip(which) {
                    match r {
                        Ok(()) => present[u] = true,
                        Err(_) => {
                            drives.list[units_drv[u]]
                                .counters
                                .read_errors
                                .fetch_add(1, Relaxed);
                        }
                    }
                }
            }
            let mut refs: Vec<&mut [u8]> = bufs
                .iter_mut()
                .map(|b| &mut b.as_mut_slice()[..p.len])
                .collect();
            if !crate::parity::reconstruct(geo.k, &mut refs, &present) {
                return Err(ArrayError::DataLoss(format!(
                    "row {grow} group {g}: too many drives unreadable to reconstruct"
                )));
            }
            out[p.dst..p.dst + p.len].copy_from_slice(&bufs[target][..p.len]);
        }
        Ok(())
    }

    /// Reads a range and checks it with `check`; on failure, tries each piece as the culprit
    /// (reconstructing it from redundancy), and repairs the drive in place when that works.
    pub(super) fn read_checked(
        &self,
        gs: u64,
        off: usize,
        len: usize,
        check: &dyn Fn(&[u8]) -> bool,
    ) -> Result<AlignedBuf> {
        match self.read_checked_raw(gs, off, len, check)? {
            Ok(buf) => Ok(buf),
            Err(_) if self.inner.geo.m == 0 => Err(ArrayError::DataLoss(format!(
                "checksum mismatch in stripe {gs} (RAID 0 has no redundancy)"
            ))),
            Err(_) => Err(ArrayError::DataLoss(format!(
                "checksum mismatch in stripe {gs} at offset {off} that redundancy cannot repair"
            ))),
        }
    }

    /// [`Array::read_checked`], telling a range that fails its check apart from a failed
    /// read: `Ok(Ok(buf))` passed the check (repaired if needed), `Ok(Err(raw))` fails it and
    /// redundancy cannot repair it (`raw` is what the drives returned), `Err` the range could
    /// not be read at all.
    pub(super) fn read_checked_raw(
        &self,
        gs: u64,
        off: usize,
        len: usize,
        check: &dyn Fn(&[u8]) -> bool,
    ) -> Result<std::result::Result<AlignedBuf, AlignedBuf>> {
        let buf = self.read_raw(gs, off, len, &[])?;
        if check(&buf) {
            return Ok(Ok(buf));
        }
        let geo = &self.inner.geo;
        if geo.m == 0 {
            return Ok(Err(buf));
        }
        for bad in culprit_sets(geo, gs, off, len) {
            let Ok(fixed) = self.read_raw(gs, off, len, &bad) else {
                continue;
            };
            if check(&fixed) {
                if !self.inner.read_only {
                    self.repair_in_place(gs, off, &buf, &fixed, &bad);
                }
                return Ok(Ok(fixed));
            }
        }
        Ok(Err(buf))
    }

    /// Writes the corrected pieces back to the drives that returned bad data.
    fn repair_in_place(
        &self,
        gs: u64,
        off: usize,
        bad_buf: &[u8],
        good: &[u8],
        culprits: &[usize],
    ) {
        let geo = &self.inner.geo;
        let drives = self.inner.drives.read();
        for p in geo.pieces(off, good.len()) {
            let grow = geo.global_row(gs, p.row);
            let d = geo.data_drive(grow, p.unit);
            if !culprits.contains(&d) || bad_buf[p.dst..p.dst + p.len] == good[p.dst..p.dst + p.len]
            {
                continue;
            }
            let drv = &drives.list[d];
            drv.counters.csum_errors.fetch_add(1, Relaxed);
            let Some(f) = &drv.file else { continue };
            if !drv.writable() {
                continue;
            }
            let mut tmp = AlignedBuf::new(p.len);
            tmp[..p.len].copy_from_slice(&good[p.dst..p.dst + p.len]);
            let mut ops = [IoOp::Write {
                fd: f.fd(),
                offset: geo.drive_offset(grow, p.off),
                buf: &tmp[..p.len],
            }];
            if self.inner.engine.submit(&mut ops).iter().all(|r| r.is_ok()) {
                self.inner.counters.repaired.fetch_add(1, Relaxed);
            } else {
                drv.counters.write_errors.fetch_add(1, Relaxed);
            }
        }
    }

    /// Reads the value at `loc`. With `repair` (the caller holds the index lock, which keeps
    /// the segment in place) a checksum mismatch is repaired from redundancy; without (a read
    /// made without the lock) a mismatch or a failed read gives `Ok(None)`.
    fn read_at(&self, loc: &Loc, repair: bool) -> Result<Option<Vec<u8>>> {
        let geo = &self.inner.geo;
        let gs = geo.seg_stripes * loc.seg as u64 + loc.stripe as u64;
        let len = loc.len as usize;
        if len == 0 {
            return Ok(Some(Vec::new()));
        }
        let (off, blen) = (loc.block as usize * BLOCK, blocks_of(len) as usize * BLOCK);
        let crc = loc.crc;
        let check = move |b: &[u8]| crc32c::crc32c(&b[..len]) == crc;
        let buf = if repair {
            self.read_checked(gs, off, blen, &check)?
        } else {
            match self.read_raw(gs, off, blen, &[]) {
                Ok(b) if check(&b) => b,
                _ => return Ok(None),
            }
        };
        Ok(Some(buf[..len].to_vec()))
    }

    pub(super) fn read_loc(&self, _idx: &Index, loc: &Loc) -> Result<Vec<u8>> {
        Ok(self.read_at(loc, true)?.unwrap_or_default())
    }

    /// Reads the value of `key`, verifying its checksum (repairing from redundancy if needed).
    pub fn get(&self, key: Key) -> Result<Option<Vec<u8>>> {
        // Fast path: the drives are read without holding the index lock (a writer appending
        // to the index, and every other reader behind it, would wait for this read's I/O).
        // The value is taken if its checksum matches and the index still points at the same
        // version afterwards; otherwise (the segment was cleaned meanwhile, or a drive
        // returned bad data) it is read again below under the lock, which keeps the segment
        // in place, repairing from redundancy if needed.
        let first = self.inner.index.read().map.get(&key).copied();
        match first {
            None => return Ok(None),
            Some(loc) if !loc.pending => {
                if let Ok(Some(v)) = self.read_at(&loc, false) {
                    let same = self
                        .inner
                        .index
                        .read()
                        .map
                        .get(&key)
                        .is_some_and(|l| l.version == loc.version);
                    if same {
                        return Ok(Some(v));
                    }
                }
            }
            Some(_) => {}
        }
        {
            let idx = self.inner.index.read();
            match idx.map.get(&key) {
                None => return Ok(None),
                Some(loc) if !loc.pending => return self.read_loc(&idx, loc).map(Some),
                Some(_) => {}
            }
        }
        // The value is pending: in the stripe being filled (read it from there) or in a stripe
        // being written (wait for that write, then read it from the drives).
        let mut w = self.inner.writer.lock();
        loop {
            let idx = self.inner.index.read();
            let Some(loc) = idx.map.get(&key).copied() else {
                return Ok(None);
            };
            if !loc.pending {
                drop(w);
                return self.read_loc(&idx, &loc).map(Some);
            }
            if w.seg == Some(loc.seg) && w.stripe == loc.stripe {
                let geo = &self.inner.geo;
                let gs = geo.seg_stripes * loc.seg as u64 + loc.stripe as u64;
                let mut out = vec![0u8; loc.len as usize];
                w.image
                    .gather(geo, gs, loc.block as usize * BLOCK, &mut out);
                return Ok(Some(out));
            }
            drop(idx);
            if w.inflight.is_empty() {
                return Err(ArrayError::DataLoss(format!(
                    "key {key:?} is pending in no stripe"
                )));
            }
            self.finish_oldest(&mut w)?;
        }
    }

    /// Reads the values of several keys (None for a key without one). Values that lie close
    /// together in one stripe (a run of pages written out together) are read with one request
    /// per drive; each value's checksum and version are checked as in [`Array::get`], and a
    /// key whose batched read fails that check (or whose value is still being written) is
    /// read again alone with [`Array::get`], which repairs and waits as needed.
    pub fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<Vec<u8>>>> {
        /// Blocks of other values a batched read may cover between two wanted ones.
        const GAP_BLOCKS: u32 = 16;
        let locs: Vec<Option<Loc>> = {
            let idx = self.inner.index.read();
            keys.iter().map(|k| idx.map.get(k).copied()).collect()
        };
        let mut out: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        let mut alone: Vec<usize> = Vec::new();
        let mut order: Vec<(usize, Loc)> = Vec::new();
        for (i, l) in locs.iter().enumerate() {
            match l {
                None => {}
                Some(l) if l.pending || l.len == 0 => alone.push(i),
                Some(l) => order.push((i, *l)),
            }
        }
        order.sort_by_key(|(_, l)| (l.seg, l.stripe, l.block));
        let geo = &self.inner.geo;
        let mut start = 0;
        while start < order.len() {
            let first = order[start].1;
            let mut end_block = first.block + blocks_of(first.len as usize);
            let mut end = start + 1;
            while end < order.len() {
                let l = order[end].1;
                if l.seg != first.seg
                    || l.stripe != first.stripe
                    || l.block > end_block + GAP_BLOCKS
                {
                    break;
                }
                end_block = end_block.max(l.block + blocks_of(l.len as usize));
                end += 1;
            }
            let gs = geo.seg_stripes * first.seg as u64 + first.stripe as u64;
            let off = first.block as usize * BLOCK;
            match self.read_raw(gs, off, end_block as usize * BLOCK - off, &[]) {
                Ok(buf) => {
                    for &(i, l) in &order[start..end] {
                        let at = (l.block - first.block) as usize * BLOCK;
                        let v = &buf[at..at + l.len as usize];
                        if crc32c::crc32c(v) == l.crc {
                            out[i] = Some(v.to_vec());
                        } else {
                            alone.push(i);
                        }
                    }
                }
                Err(_) => alone.extend(order[start..end].iter().map(|(i, _)| *i)),
            }
            start = end;
        }
        // A value read without the lock counts only if the index still names that version
        // (the cleaner may have moved it and reused its place meanwhile).
        {
            let idx = self.inner.index.read();
            for (i, l) in &order {
                if out[*i].is_some() && idx.map.get(&keys[*i]).map(|x| x.version) != Some(l.version)
                {
                    out[*i] = None;
                    alone.push(*i);
                }
            }
        }
        for i in alone {
            out[i] = self.get(keys[i])?;
        }
        Ok(out)
    }

    /// Whether `key` has a value.
    pub fn contains(&self, key: Key) -> bool {
        self.inner.index.read().map.contains_key(&key)
    }

    /// Length of the value of `key`.
    pub fn value_len(&self, key: Key) -> Option<usize> {
        self.inner
            .index
            .read()
            .map
            .get(&key)
            .map(|l| l.len as usize)
    }

    /// Keys with object id in `[lo, hi]`, sorted.
    pub fn keys_in(&self, lo: u64, hi: u64) -> Vec<Key> {
        let idx = self.inner.index.read();
        let mut v: Vec<Key> = idx
            .map
            .keys()
            .filter(|k| k.0 >= lo && k.0 <= hi)
            .copied()
            .collect();
        v.sort_unstable();
        v
    }
}

/// The drives that could hold bad data in a range of stripe `gs`, as the sets to try as
/// culprits: each drive alone, and each pair where the level has two redundancy units.
pub(super) fn culprit_sets(geo: &Geometry, gs: u64, off: usize, len: usize) -> Vec<Vec<usize>> {
    let mut drives: Vec<usize> = geo
        .pieces(off, len)
        .iter()
        .map(|p| geo.data_drive(geo.global_row(gs, p.row), p.unit))
        .collect();
    drives.sort_unstable();
    drives.dedup();
    let mut sets: Vec<Vec<usize>> = drives.iter().map(|&d| vec![d]).collect();
    if geo.m >= 2 {
        for (i, &a) in drives.iter().enumerate() {
            for &b in &drives[i + 1..] {
                sets.push(vec![a, b]);
            }
        }
    }
    sets
}

#[cfg(test)]
mod tests {

    /// `get_many` gives what `get` gives, key by key: runs written together, scattered keys,
    /// overwritten and deleted ones, absent ones, values still in the open stripe.
    #[test]
    fn get_many_matches_get() {
        let t = tempfile::tempdir().expect("tempdir");
        let a = crate::array::test_raid5(t.path(), 96 << 20);
        let val = |k: u64, r: u64| vec![(k * 7 + r) as u8; 4096 - (k as usize % 3) * 100];
        for k in 0..300u64 {
            a.put((1, k), &val(k, 0)).expect("put");
        }
        a.flush().expect("flush");
        for k in (0..300u64).step_by(7) {
            a.put((1, k), &val(k, 1)).expect("overwrite");
        }
        for k in (0..300u64).step_by(11) {
            a.delete((1, k)).expect("delete");
        }
        // Some values stay in the open stripe (not flushed).
        for k in 300..310u64 {
            a.put((1, k), &val(k, 2)).expect("put");
        }
        let keys: Vec<(u64, u64)> = (0..320u64).map(|k| (1, k)).chain([(2, 5)]).collect();
        let many = a.get_many(&keys).expect("get_many");
        for (k, v) in keys.iter().zip(&many) {
            assert_eq!(*v, a.get(*k).expect("get"), "key {k:?}");
        }
        assert!(many[1].is_some() && many[0].is_none() && many[305].is_some());
    }
}
