//! Redundancy math: copies for mirrors, P = XOR (written here, vectorised by the compiler over
//! 64-byte lanes), and RAID 6's Q = sum g^j * D_j over GF(2^8), whose field arithmetic comes from
//! the `reed-solomon-erasure` crate (`galois_8`, SIMD-accelerated).

use reed_solomon_erasure::galois_8 as gf;

/// Block processed per pass when XOR-ing many sources, small enough to stay in L1.
const XOR_BLOCK: usize = 4096;

/// `dst ^= src` over the common length.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    let n = dst.len().min(src.len());
    let (d, s) = (&mut dst[..n], &src[..n]);
    let mut dc = d.chunks_exact_mut(64);
    let mut sc = s.chunks_exact(64);
    for (a, b) in (&mut dc).zip(&mut sc) {
        for i in 0..64 {
            a[i] ^= b[i];
        }
    }
    for (a, b) in dc.into_remainder().iter_mut().zip(sc.remainder()) {
        *a ^= *b;
    }
}

/// `dst = src[0] ^ src[1] ^ ...`, walking all sources block by block.
pub fn xor_parity(dst: &mut [u8], srcs: &[&[u8]]) {
    let len = dst.len();
    let mut pos = 0;
    while pos < len {
        let end = (pos + XOR_BLOCK).min(len);
        let d = &mut dst[pos..end];
        match srcs.first() {
            Some(first) => d.copy_from_slice(&first[pos..end]),
            None => d.fill(0),
        }
        for s in srcs.iter().skip(1) {
            xor_into(d, &s[pos..end]);
        }
        pos = end;
    }
}

/// The RAID 6 coefficient of data unit `j`: g^j with generator 2.
fn coef(j: usize) -> u8 {
    gf::exp(2, j)
}

/// Computes the `m` redundancy units of a group from its `k` data units.
/// k == 1 is a mirror (every redundancy unit is a copy); otherwise unit 0 is P, unit 1 is Q.
pub fn encode(data: &[&[u8]], red: &mut [&mut [u8]]) {
    // (The SIMD field routines index their first byte: never hand them empty slices.)
    if red.is_empty() || data.first().is_none_or(|d| d.is_empty()) {
        return;
    }
    if data.len() == 1 {
        for r in red.iter_mut() {
            r.copy_from_slice(data[0]);
        }
        return;
    }
    xor_parity(red[0], data);
    if red.len() > 1 {
        let q = &mut *red[1];
        q.copy_from_slice(data[0]);
        for (j, d) in data.iter().enumerate().skip(1) {
            gf::mul_slice_xor(coef(j), d, q);
        }
    }
}

/// Rebuilds the missing units of one group in place. `units` holds k data units followed by m
/// redundancy units, all the same length; `present[i]` says which hold valid content. Returns
/// false when too many are missing.
pub fn reconstruct(k: usize, units: &mut [&mut [u8]], present: &[bool]) -> bool {
    let n = units.len();
    let m = n - k;
    let missing: Vec<usize> = (0..n).filter(|&i| !present[i]).collect();
    if missing.is_empty() {
        return true;
    }
    if missing.len() > m {
        return false;
    }
    let len = units[0].len();
    if len == 0 {
        return true;
    }
    if k == 1 {
        // Mirror: copy from any present unit.
        let Some(src) = (0..n).find(|&i| present[i]) else {
            return false;
        };
        let good = units[src].to_vec();
        for &i in &missing {
            units[i].copy_from_slice(&good);
        }
        return true;
    }
    let miss_data: Vec<usize> = missing.iter().copied().filter(|&i| i < k).collect();
    let p_ok = present[k];
    let q_ok = m > 1 && present[k + 1];
    match miss_data.len() {
        0 => {}
        1 if p_ok => {
            let x = miss_data[0];
            let mut acc = units[k].to_vec();
            for j in (0..k).filter(|&j| j != x) {
                xor_into(&mut acc, units[j]);
            }
            units[x].copy_from_slice(&acc);
        }
        1 if q_ok => {
            let x = miss_data[0];
            let mut acc = units[k + 1].to_vec();
            for j in (0..k).filter(|&j| j != x) {
                gf::mul_slice_xor(coef(j), units[j], &mut acc);
            }
            gf::mul_slice(gf::div(1, coef(x)), &acc, units[x]);
        }
        2 if p_ok && q_ok => {
            let (x, y) = (miss_data[0], miss_data[1]);
            let mut pxy = units[k].to_vec();
            let mut qxy = units[k + 1].to_vec();
            for j in (0..k).filter(|&j| j != x && j != y) {
                xor_into(&mut pxy, units[j]);
                gf::mul_slice_xor(coef(j), units[j], &mut qxy);
            }
            // D_x = (Qxy ^ g^y * Pxy) / (g^x ^ g^y); D_y = Pxy ^ D_x.
            gf::mul_slice_xor(coef(y), &pxy, &mut qxy);
            let inv = gf::div(1, coef(x) ^ coef(y));
            let mut dx = vec![0u8; len];
            gf::mul_slice(inv, &qxy, &mut dx);
            xor_into(&mut pxy, &dx);
            units[x].copy_from_slice(&dx);
            units[y].copy_from_slice(&pxy);
        }
        _ => return false,
    }
    // Data is whole now: recompute whatever redundancy was missing.
    if missing.iter().any(|&i| i >= k) {
        let data: Vec<Vec<u8>> = units[..k].iter().map(|u| u.to_vec()).collect();
        let drefs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let mut red: Vec<Vec<u8>> = vec![vec![0u8; len]; m];
        {
            let mut rrefs: Vec<&mut [u8]> = red.iter_mut().map(|r| r.as_mut_slice()).collect();
            encode(&drefs, &mut rrefs);
        }
        for (i, r) in red.iter().enumerate() {
            if !present[k + i] {
                units[k + i].copy_from_slice(r);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn group(k: usize, m: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut units: Vec<Vec<u8>> = (0..k)
            .map(|_| (0..len).map(|_| rng.gen()).collect())
            .collect();
        let mut red = vec![vec![0u8; len]; m];
        {
            let d: Vec<&[u8]> = units.iter().map(|u| u.as_slice()).collect();
            let mut r: Vec<&mut [u8]> = red.iter_mut().map(|r| r.as_mut_slice()).collect();
            encode(&d, &mut r);
        }
        units.extend(red);
        units
    }

    #[test]
    fn every_erasure_pattern_recovers() {
        for (k, m) in [(1, 1), (1, 3), (2, 1), (4, 1), (2, 2), (4, 2), (7, 2)] {
            let orig = group(k, m, 4096 + 40, (k * 10 + m) as u64);
            let n = k + m;
            for a in 0..n {
                for b in a..n {
                    if (a != b && m < 2) || (m == 0) {
                        continue;
                    }
                    let mut work = orig.clone();
                    let mut present = vec![true; n];
                    for &i in &[a, b] {
                        present[i] = false;
                        work[i].fill(0xEE);
                    }
                    let mut refs: Vec<&mut [u8]> =
                        work.iter_mut().map(|u| u.as_mut_slice()).collect();
                    assert!(
                        reconstruct(k, &mut refs, &present),
                        "k{k} m{m} lost {a},{b}"
                    );
                    assert_eq!(work, orig, "k{k} m{m} lost {a},{b}");
                }
            }
        }
    }

    #[test]
    fn too_many_missing_is_refused() {
        let mut g = group(3, 1, 512, 1);
        let mut refs: Vec<&mut [u8]> = g.iter_mut().map(|u| u.as_mut_slice()).collect();
        assert!(!reconstruct(3, &mut refs, &[false, false, true, true]));
    }
}
