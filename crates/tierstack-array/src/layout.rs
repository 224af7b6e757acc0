//! RAID levels and the geometry that maps stripe data to drives.
//!
//! Every level is expressed as `groups` redundancy groups of `group_size` drives, each holding
//! `k` data units and `m` redundancy units per row:
//!
//! | level | groups | k | m | redundancy |
//! |---|---|---|---|---|
//! | 0  | 1 | N | 0 | none |
//! | 1  | 1 | 1 | N-1 | copies |
//! | 10 | N/2 | 1 | 1 | copies |
//! | 5  | 1 | N-1 | 1 | P = XOR |
//! | 6  | 1 | N-2 | 2 | P = XOR, Q = GF(2^8) |
//! | 50 | G | N/G-1 | 1 | P per group |
//! | 60 | G | N/G-2 | 2 | P, Q per group |
//!
//! Units rotate over the drives of their group from row to row, so parity is spread evenly.

use serde::{Deserialize, Serialize};

use crate::error::{ArrayError, Result};

/// First byte of the data area on every drive (the superblocks live before it).
pub const DATA_OFFSET: u64 = 1 << 20;
/// Bytes of stripe data a log stripe holds at least; a stripe is a run of whole rows. Four
/// values of [`MAX_VALUE`] and their summary fit, so large values pack with little waste.
pub const STRIPE_TARGET: u64 = (4 << 20) + (64 << 10);
/// Largest value stored under one key.
pub const MAX_VALUE: usize = 1 << 20;
/// Block size of the log: records start on block boundaries.
pub const BLOCK: usize = 4096;
/// Most drives in one array.
pub const MAX_DRIVES: usize = 255;

/// A RAID level; see the module docs for how each maps to groups, data and redundancy units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Level {
    /// Striping without redundancy.
    Raid0,
    /// Mirroring: every drive holds a full copy.
    Raid1,
    /// Striping over mirrored pairs.
    Raid10,
    /// Striping with one XOR parity unit per row.
    Raid5,
    /// Striping with two redundancy units per row (P = XOR, Q = Reed-Solomon over GF(2^8)).
    Raid6,
    /// Striping over RAID 5 groups.
    Raid50,
    /// Striping over RAID 6 groups.
    Raid60,
}

impl Level {
    /// The level's conventional number (0, 1, 10, 5, 6, 50, 60), as stored on disk.
    pub fn number(self) -> u32 {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid10 => 10,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            Level::Raid50 => 50,
            Level::Raid60 => 60,
        }
    }

    /// The level with conventional number `n`, or `None` if there is none.
    pub fn from_number(n: u32) -> Option<Level> {
        Some(match n {
            0 => Level::Raid0,
            1 => Level::Raid1,
            10 => Level::Raid10,
            5 => Level::Raid5,
            6 => Level::Raid6,
            50 => Level::Raid50,
            60 => Level::Raid60,
            _ => return None,
        })
    }
}

impl std::str::FromStr for Level {
    type Err = ArrayError;
    fn from_str(s: &str) -> Result<Level> {
        let t = s.trim().trim_start_matches("raid");
        t.parse::<u32>()
            .ok()
            .and_then(Level::from_number)
            .ok_or_else(|| {
                ArrayError::Config(format!(
                    "unknown RAID level '{s}': use one of 0, 1, 10, 5, 6, 50, 60"
                ))
            })
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.number())
    }
}

/// The shape of an array: how rows, stripes and segments map onto drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    /// RAID level.
    pub level: Level,
    /// Drives in the array.
    pub ndrives: usize,
    /// Chunk size in bytes: a power of two from 4 KiB to 1 MiB.
    pub chunk: usize,
    /// Redundancy groups.
    pub groups: usize,
    /// Drives per group (`k + m`).
    pub group_size: usize,
    /// Data units per group and row.
    pub k: usize,
    /// Redundancy units per group and row.
    pub m: usize,
    /// Rows per drive (each row is one chunk on every drive).
    pub rows: u64,
    /// Rows per log stripe.
    pub stripe_rows: u64,
    /// Stripes per segment.
    pub seg_stripes: u64,
    /// Segments in the array.
    pub nsegs: u64,
}

/// Where a piece of stripe data lives: a data unit of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Row within the stripe.
    pub row: u64,
    /// Data unit index in the row (0 .. groups*k).
    pub unit: usize,
    /// Offset within the chunk.
    pub off: usize,
    /// Bytes in the piece (at most to the end of the chunk).
    pub len: usize,
    /// Offset within the requested range.
    pub dst: usize,
}

impl Geometry {
    /// Validates a configuration and derives the geometry for drives of `drive_bytes` each.
    pub fn new(
        level: Level,
        ndrives: usize,
        chunk: usize,
        groups: Option<usize>,
        drive_bytes: u64,
    ) -> Result<Geometry> {
        let cfg = |m: String| Err(ArrayError::Config(m));
        if !(4096..=(1 << 20)).contains(&chunk) || !chunk.is_power_of_two() {
            return cfg(format!(
                "chunk {chunk} is not a power of two between 4K and 1M: use e.g. --chunk 64K"
            ));
        }
        if ndrives > MAX_DRIVES {
            return cfg(format!(
                "{ndrives} drives given; at most {MAX_DRIVES} are supported"
            ));
        }
        if groups.is_some() && !matches!(level, Level::Raid50 | Level::Raid60) {
            return cfg(format!(
                "--groups applies to RAID 50 and 60 only, not RAID {level}: drop --groups"
            ));
        }
        let need = |min: usize, what: &str| -> Result<()> {
            if ndrives < min {
                Err(ArrayError::Config(format!(
                    "RAID {level} needs at least {min} drives{what}, {ndrives} given: add drives or pick another level"
                )))
            } else {
                Ok(())
            }
        };
        let (groups, k, m) = match level {
            Level::Raid0 => {
                need(2, "")?;
                (1, ndrives, 0)
            }
            Level::Raid1 => {
                need(2, "")?;
                (1, 1, ndrives - 1)
            }
            Level::Raid10 => {
                need(4, "")?;
                if !ndrives.is_multiple_of(2) {
                    return cfg(format!(
                        "RAID 10 needs an even number of drives, {ndrives} given: add or remove one"
                    ));
                }
                (ndrives / 2, 1, 1)
            }
            Level::Raid5 => {
                need(3, "")?;
                (1, ndrives - 1, 1)
            }
            Level::Raid6 => {
                need(4, "")?;
                (1, ndrives - 2, 2)
            }
            Level::Raid50 | Level::Raid60 => {
                let m = if level == Level::Raid50 { 1 } else { 2 };
                let g = groups.unwrap_or(2);
                let per = m + 2;
                need(g.max(2) * per, &format!(" ({per} per group)"))?;
                if g < 2 {
                    return cfg(format!(
                        "RAID {level} needs --groups of at least 2, {g} given"
                    ));
                }
                if !ndrives.is_multiple_of(g) {
                    return cfg(format!(
                        "{ndrives} drives do not split into {g} equal groups: use a multiple of {g} drives"
                    ));
                }
                (g, ndrives / g - m, m)
            }
        };
        let group_size = k + m;
        let usable = drive_bytes.saturating_sub(DATA_OFFSET);
        let rows = usable / chunk as u64;
        let row_data = (groups * k * chunk) as u64;
        let stripe_rows = STRIPE_TARGET.div_ceil(row_data).max(1);
        let stripes = rows / stripe_rows;
        let seg_stripes = (stripes / 32).clamp(1, 16);
        let nsegs = stripes / seg_stripes;
        let geo = Geometry {
            level,
            ndrives,
            chunk,
            groups,
            group_size,
            k,
            m,
            rows,
            stripe_rows,
            seg_stripes,
            nsegs,
        };
        if nsegs < 8 {
            let min_drive = DATA_OFFSET + 8 * stripe_rows * chunk as u64;
            return cfg(format!(
                "drives of {drive_bytes} bytes are too small for RAID {level} with chunk {chunk}: each drive needs at least {} (use --size {}M or more)",
                min_drive,
                min_drive.div_ceil(1 << 20)
            ));
        }
        Ok(geo)
    }

    /// Data units per row over all groups.
    pub fn data_units(&self) -> usize {
        self.groups * self.k
    }
    /// Bytes of data per row (excluding redundancy).
    pub fn row_data(&self) -> usize {
        self.data_units() * self.chunk
    }
    /// Bytes of data per log stripe (excluding redundancy).
    pub fn stripe_data(&self) -> usize {
        self.row_data() * self.stripe_rows as usize
    }
    /// Bytes each drive receives per stripe.
    pub fn stripe_drive_bytes(&self) -> usize {
        self.chunk * self.stripe_rows as usize
    }
    /// Data blocks of [`BLOCK`] bytes per log stripe.
    pub fn stripe_blocks(&self) -> usize {
        self.stripe_data() / BLOCK
    }
    /// Log stripes in the array (whole segments only).
    pub fn total_stripes(&self) -> u64 {
        self.nsegs * self.seg_stripes
    }
    /// Bytes of one drive that the array uses (superblock area + rows).
    pub fn drive_bytes_used(&self) -> u64 {
        DATA_OFFSET + self.total_stripes() * self.stripe_rows * self.chunk as u64
    }
    /// Drives that may fail in every group without data loss (the weakest group).
    pub fn tolerance(&self) -> usize {
        self.m
    }
    /// Whether each row holds one data unit and its copies (RAID 1 and 10).
    pub fn is_mirror(&self) -> bool {
        self.k == 1
    }

    /// Global row number of `row` within global stripe `stripe`.
    pub fn global_row(&self, stripe: u64, row: u64) -> u64 {
        stripe * self.stripe_rows + row
    }

    /// Drive holding unit `u` (0..k data, k..k+m redundancy) of group `g` in global row `row`.
    pub fn unit_drive(&self, row: u64, g: usize, u: usize) -> usize {
        let n = self.group_size;
        g * n + (u + (row % n as u64) as usize) % n
    }

    /// Drive holding data unit `d` (0..groups*k) of global row `row`.
    pub fn data_drive(&self, row: u64, d: usize) -> usize {
        self.unit_drive(row, d / self.k, d % self.k)
    }

    /// Byte offset on a drive of `off` within the chunk of global row `row`.
    pub fn drive_offset(&self, row: u64, off: usize) -> u64 {
        DATA_OFFSET + row * self.chunk as u64 + off as u64
    }

    /// Splits the byte range `[off, off+len)` of stripe data into per-chunk pieces.
    pub fn pieces(&self, off: usize, len: usize) -> Vec<Piece> {
        let mut out = Vec::new();
        let (chunk, row_data) = (self.chunk, self.row_data());
        let mut pos = off;
        let end = off + len;
        while pos < end {
            let row = (pos / row_data) as u64;
            let in_row = pos % row_data;
            let unit = in_row / chunk;
            let coff = in_row % chunk;
            let n = (chunk - coff).min(end - pos);
            out.push(Piece {
                row,
                unit,
                off: coff,
                len: n,
                dst: pos - off,
            });
            pos += n;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_reject() {
        assert_eq!("5".parse::<Level>().ok(), Some(Level::Raid5));
        assert_eq!("raid60".parse::<Level>().ok(), Some(Level::Raid60));
        assert!("7".parse::<Level>().is_err());
    }

    #[test]
    fn geometry_rules() {
        let g = Geometry::new(Level::Raid5, 5, 65536, None, 256 << 20).unwrap();
        assert_eq!((g.k, g.m, g.groups), (4, 1, 1));
        assert_eq!(g.stripe_data(), 17 << 18);
        assert!(Geometry::new(Level::Raid5, 2, 65536, None, 256 << 20).is_err());
        assert!(Geometry::new(Level::Raid10, 5, 65536, None, 256 << 20).is_err());
        assert!(Geometry::new(Level::Raid5, 4, 3000, None, 256 << 20).is_err());
        assert!(Geometry::new(Level::Raid5, 4, 65536, Some(2), 256 << 20).is_err());
        assert!(Geometry::new(Level::Raid5, 4, 65536, None, 2 << 20).is_err());
        let g = Geometry::new(Level::Raid60, 8, 65536, Some(2), 256 << 20).unwrap();
        assert_eq!((g.k, g.m, g.groups), (2, 2, 2));
    }

    #[test]
    fn parity_rotates_and_units_are_distinct() {
        let g = Geometry::new(Level::Raid6, 6, 65536, None, 256 << 20).unwrap();
        for row in 0..12 {
            let mut seen: Vec<usize> = (0..6).map(|u| g.unit_drive(row, 0, u)).collect();
            seen.sort();
            assert_eq!(seen, vec![0, 1, 2, 3, 4, 5]);
        }
        assert_ne!(g.unit_drive(0, 0, 4), g.unit_drive(1, 0, 4));
    }

    #[test]
    fn pieces_cover_range() {
        let g = Geometry::new(Level::Raid5, 5, 65536, None, 256 << 20).unwrap();
        let p = g.pieces(60000, 300000);
        assert_eq!(p.iter().map(|p| p.len).sum::<usize>(), 300000);
        assert_eq!(p[0].off, 60000);
        assert_eq!(p[1].unit, 1);
    }
}
