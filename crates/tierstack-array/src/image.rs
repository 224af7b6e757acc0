//! An in-memory image of one log stripe across all drives: the writer fills one, scrub and
//! rebuild read one back. Holds `stripe_rows` chunks per drive, contiguous, so each drive is
//! read or written with one large aligned request.

use crate::io::AlignedBuf;
use crate::layout::Geometry;
use crate::parity;

/// One log stripe held in memory, data and redundancy, laid out as on the drives.
pub struct StripeImage {
    /// One buffer per drive, in drive order, of [`Geometry::stripe_drive_bytes`] bytes each:
    /// row `r` of the stripe is at byte `r * chunk`.
    pub bufs: Vec<AlignedBuf>,
}

impl StripeImage {
    /// A zero-filled image sized for `geo`.
    pub fn new(geo: &Geometry) -> Self {
        StripeImage {
            bufs: (0..geo.ndrives)
                .map(|_| AlignedBuf::new(geo.stripe_drive_bytes()))
                .collect(),
        }
    }

    /// Zeroes every drive's buffer.
    pub fn clear(&mut self) {
        for b in &mut self.bufs {
            b.fill(0);
        }
    }

    /// Copies `data` into the stripe data at byte offset `off` (global stripe `gs`).
    pub fn place(&mut self, geo: &Geometry, gs: u64, off: usize, data: &[u8]) {
        for p in geo.pieces(off, data.len()) {
            let d = geo.data_drive(geo.global_row(gs, p.row), p.unit);
            let at = p.row as usize * geo.chunk + p.off;
            self.bufs[d][at..at + p.len].copy_from_slice(&data[p.dst..p.dst + p.len]);
        }
    }

    /// Copies stripe data `[off, off+out.len())` out of the image.
    pub fn gather(&self, geo: &Geometry, gs: u64, off: usize, out: &mut [u8]) {
        for p in geo.pieces(off, out.len()) {
            let d = geo.data_drive(geo.global_row(gs, p.row), p.unit);
            let at = p.row as usize * geo.chunk + p.off;
            out[p.dst..p.dst + p.len].copy_from_slice(&self.bufs[d][at..at + p.len]);
        }
    }

    fn unit_range(geo: &Geometry, row: u64) -> std::ops::Range<usize> {
        let at = row as usize * geo.chunk;
        at..at + geo.chunk
    }

    /// Computes the redundancy of one group in one row of the stripe.
    fn group_redundancy(&self, geo: &Geometry, gs: u64, row: u64, g: usize) -> Vec<Vec<u8>> {
        let grow = geo.global_row(gs, row);
        let r = Self::unit_range(geo, row);
        let data: Vec<&[u8]> = (0..geo.k)
            .map(|u| &self.bufs[geo.unit_drive(grow, g, u)][r.clone()])
            .collect();
        let mut red = vec![vec![0u8; geo.chunk]; geo.m];
        let mut refs: Vec<&mut [u8]> = red.iter_mut().map(|v| v.as_mut_slice()).collect();
        parity::encode(&data, &mut refs);
        red
    }

    /// Fills in every redundancy unit from the data units.
    pub fn encode(&mut self, geo: &Geometry, gs: u64) {
        if geo.m == 0 {
            return;
        }
        for row in 0..geo.stripe_rows {
            let grow = geo.global_row(gs, row);
            for g in 0..geo.groups {
                let red = self.group_redundancy(geo, gs, row, g);
                let r = Self::unit_range(geo, row);
                for (i, v) in red.iter().enumerate() {
                    let d = geo.unit_drive(grow, g, geo.k + i);
                    self.bufs[d][r.clone()].copy_from_slice(v);
                }
            }
        }
    }

    /// Redundancy units (drive index, row) whose content disagrees with the data units.
    pub fn parity_mismatches(&self, geo: &Geometry, gs: u64) -> Vec<(usize, u64)> {
        let mut bad = Vec::new();
        if geo.m == 0 {
            return bad;
        }
        for row in 0..geo.stripe_rows {
            let grow = geo.global_row(gs, row);
            for g in 0..geo.groups {
                let red = self.group_redundancy(geo, gs, row, g);
                let r = Self::unit_range(geo, row);
                for (i, v) in red.iter().enumerate() {
                    let d = geo.unit_drive(grow, g, geo.k + i);
                    if self.bufs[d][r.clone()] != v[..] {
                        bad.push((d, row));
                    }
                }
            }
        }
        bad
    }

    /// Rebuilds, in every row, the chunks of the drives in `lost` from the others.
    /// Returns false if some group has lost more than it can recover.
    pub fn reconstruct_drives(&mut self, geo: &Geometry, gs: u64, lost: &[usize]) -> bool {
        (0..geo.stripe_rows).all(|row| self.reconstruct_row(geo, gs, row, lost))
    }

    /// Rebuilds the chunks of the drives in `lost` in one row.
    pub fn reconstruct_row(&mut self, geo: &Geometry, gs: u64, row: u64, lost: &[usize]) -> bool {
        let grow = geo.global_row(gs, row);
        let n = geo.group_size;
        let r = Self::unit_range(geo, row);
        for g in 0..geo.groups {
            let drives: Vec<usize> = (0..n).map(|u| geo.unit_drive(grow, g, u)).collect();
            let present: Vec<bool> = drives.iter().map(|d| !lost.contains(d)).collect();
            if present.iter().all(|&p| p) {
                continue;
            }
            let mut units: Vec<Vec<u8>> = drives
                .iter()
                .map(|&d| self.bufs[d][r.clone()].to_vec())
                .collect();
            let mut refs: Vec<&mut [u8]> = units.iter_mut().map(|v| v.as_mut_slice()).collect();
            if !parity::reconstruct(geo.k, &mut refs, &present) {
                return false;
            }
            for (u, &d) in drives.iter().enumerate() {
                if !present[u] {
                    self.bufs[d][r.clone()].copy_from_slice(&units[u]);
                }
            }
        }
        true
    }
}
