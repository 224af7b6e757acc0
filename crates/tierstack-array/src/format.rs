//! On-disk structures: the drive superblock and the stripe summary (entries + footer).
//! All integers are little-endian; every structure carries a crc32c. Decoders never panic on
//! any input (they are fuzzed: see fuzz/).

use crate::layout::{Level, BLOCK, MAX_DRIVES, MAX_VALUE};

// Defined with the other errors (so that `error` depends on nothing else in the crate);
// re-exported here, where the decoders return it.
pub use crate::error::FormatError;

/// Size of one superblock copy; two copies are kept at offsets 0 and SB_SIZE.
pub const SB_SIZE: usize = 4096;
/// Magic number at the start of every superblock copy.
pub const SB_MAGIC: &[u8; 8] = b"TSARRAY\x01";
/// On-disk format version written to, and required in, every superblock.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of an encoded stripe footer.
pub const FOOTER_SIZE: usize = 64;
/// Magic number at the start of every stripe footer.
pub const FOOTER_MAGIC: &[u8; 8] = b"TSSTRIP\x01";
/// Bytes of one encoded summary entry.
pub const ENTRY_SIZE: usize = 40;

/// Entry flag: the key was deleted at this version.
pub const ENTRY_TOMBSTONE: u32 = 1;
/// Footer flag: this segment was freed by the cleaner; ignore all of its stripes.
pub const FOOTER_FREE: u32 = 1;

/// State of one drive as recorded in the superblocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DriveState {
    /// In service and up to date.
    Online,
    /// Out of service: neither read nor written.
    Failed,
    /// Being rebuilt from the other drives: written to, but not read from.
    Rebuilding,
}

impl DriveState {
    fn code(self) -> u8 {
        match self {
            DriveState::Online => 0,
            DriveState::Failed => 1,
            DriveState::Rebuilding => 2,
        }
    }
    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0 => DriveState::Online,
            1 => DriveState::Failed,
            2 => DriveState::Rebuilding,
            _ => return None,
        })
    }
}

/// The per-drive header of an array, kept in two copies of [`SB_SIZE`] bytes at the start of
/// every drive. It records the geometry and the state of every drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// The array's UUID, the same on every drive.
    pub uuid: [u8; 16],
    /// Position of this drive in the array (0 .. ndrives).
    pub drive_index: u32,
    /// Drives in the array (1 ..= [`MAX_DRIVES`]).
    pub ndrives: u32,
    /// RAID level number (0, 1, 10, 5, 6, 50, 60).
    pub level: u32,
    /// Chunk size in bytes: a power of two from 4 KiB to 1 MiB.
    pub chunk: u32,
    /// Redundancy groups.
    pub groups: u32,
    /// Rows per log stripe.
    pub stripe_rows: u32,
    /// Stripes per segment.
    pub seg_stripes: u32,
    /// Segments in the array.
    pub nsegs: u32,
    /// Rows per drive.
    pub rows: u64,
    /// Incremented on every change of drive states; the copy with the highest generation wins.
    pub generation: u64,
    /// Creation time of the array, in seconds since the Unix epoch.
    pub created: u64,
    /// State of every drive, indexed by drive index.
    pub states: Vec<DriveState>,
}

struct W<'a> {
    b: &'a mut [u8],
    p: usize,
}
impl W<'_> {
    fn put(&mut self, v: &[u8]) {
        self.b[self.p..self.p + v.len()].copy_from_slice(v);
        self.p += v.len();
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }
}

struct R<'a> {
    b: &'a [u8],
    p: usize,
}
impl R<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], FormatError> {
        let s = self
            .b
            .get(self.p..self.p + n)
            .ok_or(FormatError::Truncated)?;
        self.p += n;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, FormatError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, FormatError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
}

fn crc_tail_ok(b: &[u8]) -> bool {
    let n = b.len();
    let mut c = [0u8; 4];
    c.copy_from_slice(&b[n - 4..]);
    crc32c::crc32c(&b[..n - 4]) == u32::from_le_bytes(c)
}

impl Superblock {
    /// Encodes one superblock copy, zero-padded, with its crc32c in the last 4 bytes.
    pub fn encode(&self) -> [u8; SB_SIZE] {
        let mut out = [0u8; SB_SIZE];
        let mut w = W { b: &mut out, p: 0 };
        w.put(SB_MAGIC);
        w.u32(FORMAT_VERSION);
        w.u32(0);
        w.put(&self.uuid);
        for v in [
            self.drive_index,
            self.ndrives,
            self.level,
            self.chunk,
            self.groups,
            self.stripe_rows,
            self.seg_stripes,
            self.nsegs,
        ] {
            w.u32(v);
        }
        w.u64(self.rows);
        w.u64(self.generation);
        w.u64(self.created);
        for s in &self.states {
            w.put(&[s.code()]);
        }
        let crc = crc32c::crc32c(&out[..SB_SIZE - 4]);
        out[SB_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a superblock copy from the first [`SB_SIZE`] bytes of `b`, checking magic,
    /// checksum, version and the range of every field.
    pub fn decode(b: &[u8]) -> Result<Superblock, FormatError> {
        if b.len() < SB_SIZE {
            return Err(FormatError::Truncated);
        }
        let b = &b[..SB_SIZE];
        if &b[..8] != SB_MAGIC {
            return Err(FormatError::Magic);
        }
        if !crc_tail_ok(b) {
            return Err(FormatError::Checksum);
        }
        let mut r = R { b, p: 8 };
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(FormatError::Version(version));
        }
        r.u32()?;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.take(16)?);
        let drive_index = r.u32()?;
        let ndrives = r.u32()?;
        let level = r.u32()?;
        let chunk = r.u32()?;
        let groups = r.u32()?;
        let stripe_rows = r.u32()?;
        let seg_stripes = r.u32()?;
        let nsegs = r.u32()?;
        let rows = r.u64()?;
        let generation = r.u64()?;
        let created = r.u64()?;
        if ndrives == 0 || ndrives as usize > MAX_DRIVES {
            return Err(FormatError::Field("ndrives"));
        }
        if drive_index >= ndrives {
            return Err(FormatError::Field("drive_index"));
        }
        if Level::from_number(level).is_none() {
            return Err(FormatError::Field("level"));
        }
        if !chunk.is_power_of_two() || !(4096..=(1 << 20)).contains(&chunk) {
            return Err(FormatError::Field("chunk"));
        }
        if groups == 0 || stripe_rows == 0 || seg_stripes == 0 || nsegs == 0 {
            return Err(FormatError::Field("geometry"));
        }
        let mut states = Vec::with_capacity(ndrives as usize);
        for &c in r.take(ndrives as usize)? {
            states.push(DriveState::from_code(c).ok_or(FormatError::Field("drive state"))?);
        }
        Ok(Superblock {
            uuid,
            drive_index,
            ndrives,
            level,
            chunk,
            groups,
            stripe_rows,
            seg_stripes,
            nsegs,
            rows,
            generation,
            created,
            states,
        })
    }
}

/// One record of a stripe summary: a value (or a deletion) of key (obj, page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Object id (first half of the key).
    pub obj: u64,
    /// Page number within the object (second half of the key).
    pub page: u64,
    /// Array-wide sequence number of the write; the highest version of a key is current.
    pub version: u64,
    /// First block of the value within the stripe.
    pub block: u32,
    /// Length of the value in bytes (0 for a tombstone).
    pub len: u32,
    /// crc32c of the value (0 for a tombstone).
    pub crc: u32,
    /// Flags: [`ENTRY_TOMBSTONE`] or 0.
    pub flags: u32,
}

impl Entry {
    /// Whether the entry records a deletion.
    pub fn is_tombstone(&self) -> bool {
        self.flags & ENTRY_TOMBSTONE != 0
    }
    /// Writes the entry's [`ENTRY_SIZE`] bytes at the start of `out`; panics if `out` is shorter.
    pub fn encode_into(&self, out: &mut [u8]) {
        let mut w = W { b: out, p: 0 };
        w.u64(self.obj);
        w.u64(self.page);
        w.u64(self.version);
        w.u32(self.block);
        w.u32(self.len);
        w.u32(self.crc);
        w.u32(self.flags);
    }
    fn decode(b: &[u8]) -> Result<Entry, FormatError> {
        let mut r = R { b, p: 0 };
        Ok(Entry {
            obj: r.u64()?,
            page: r.u64()?,
            version: r.u64()?,
            block: r.u32()?,
            len: r.u32()?,
            crc: r.u32()?,
            flags: r.u32()?,
        })
    }
}

/// The last 64 bytes of a stripe's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    /// UUID of the array the stripe belongs to.
    pub uuid: [u8; 16],
    /// Segment the stripe was written to.
    pub seg: u32,
    /// Index of the stripe within its segment.
    pub stripe: u32,
    /// Sequence number of the segment's current use; every stripe of one use carries the same.
    pub seg_seq: u64,
    /// Sequence number of this stripe write, unique and increasing across the array.
    pub stripe_seq: u64,
    /// Summary entries that precede the footer.
    pub nentries: u32,
    /// Flags: [`FOOTER_FREE`] or 0.
    pub flags: u32,
    /// crc32c of the encoded entries.
    pub summary_crc: u32,
}

impl Footer {
    /// Encodes the footer with its crc32c in the last 4 bytes.
    pub fn encode(&self) -> [u8; FOOTER_SIZE] {
        let mut out = [0u8; FOOTER_SIZE];
        let mut w = W { b: &mut out, p: 0 };
        w.put(FOOTER_MAGIC);
        w.put(&self.uuid);
        w.u32(self.seg);
        w.u32(self.stripe);
        w.u64(self.seg_seq);
        w.u64(self.stripe_seq);
        w.u32(self.nentries);
        w.u32(self.flags);
        w.u32(self.summary_crc);
        let crc = crc32c::crc32c(&out[..FOOTER_SIZE - 4]);
        out[FOOTER_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a footer from the first [`FOOTER_SIZE`] bytes of `b`, checking magic and
    /// checksum.
    pub fn decode(b: &[u8]) -> Result<Footer, FormatError> {
        if b.len() < FOOTER_SIZE {
            return Err(FormatError::Truncated);
        }
        let b = &b[..FOOTER_SIZE];
        if &b[..8] != FOOTER_MAGIC {
            return Err(FormatError::Magic);
        }
        if !crc_tail_ok(b) {
            return Err(FormatError::Checksum);
        }
        let mut r = R { b, p: 8 };
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.take(16)?);
        Ok(Footer {
            uuid,
            seg: r.u32()?,
            stripe: r.u32()?,
            seg_seq: r.u64()?,
            stripe_seq: r.u64()?,
            nentries: r.u32()?,
            flags: r.u32()?,
            summary_crc: r.u32()?,
        })
    }
}

/// Bytes at the end of a stripe taken by a summary of `n` entries and the footer.
pub fn summary_bytes(n: usize) -> usize {
    n * ENTRY_SIZE + FOOTER_SIZE
}

/// Decodes the summary at the end of `tail` (the last bytes of a stripe's data, at least the
/// footer and all entries): the footer, then its entries, checked against the summary crc.
/// `max_blocks` bounds entry block ranges (the stripe's payload blocks).
pub fn decode_summary(tail: &[u8], max_blocks: u32) -> Result<(Footer, Vec<Entry>), FormatError> {
    if tail.len() < FOOTER_SIZE {
        return Err(FormatError::Truncated);
    }
    let footer = Footer::decode(&tail[tail.len() - FOOTER_SIZE..])?;
    let n = footer.nentries as usize;
    let need = n
        .checked_mul(ENTRY_SIZE)
        .and_then(|x| x.checked_add(FOOTER_SIZE))
        .ok_or(FormatError::Field("nentries"))?;
    if need > tail.len() {
        return Err(FormatError::Truncated);
    }
    let ents = &tail[tail.len() - need..tail.len() - FOOTER_SIZE];
    if crc32c::crc32c(ents) != footer.summary_crc {
        return Err(FormatError::Checksum);
    }
    let mut out = Vec::with_capacity(n);
    for c in ents.chunks_exact(ENTRY_SIZE) {
        let e = Entry::decode(c)?;
        if !e.is_tombstone() {
            let blocks = (e.len as u64).div_ceil(BLOCK as u64);
            if e.len as usize > MAX_VALUE || e.block as u64 + blocks > max_blocks as u64 {
                return Err(FormatError::Field("entry range"));
            }
        }
        out.push(e);
    }
    Ok((footer, out))
}

/// Encodes entries followed by the footer (whose nentries and summary_crc are filled in).
pub fn encode_summary(entries: &[Entry], footer: &mut Footer) -> Vec<u8> {
    let mut out = vec![0u8; summary_bytes(entries.len())];
    for (i, e) in entries.iter().enumerate() {
        e.encode_into(&mut out[i * ENTRY_SIZE..(i + 1) * ENTRY_SIZE]);
    }
    let ents_len = entries.len() * ENTRY_SIZE;
    footer.nentries = entries.len() as u32;
    footer.summary_crc = crc32c::crc32c(&out[..ents_len]);
    out[ents_len..].copy_from_slice(&footer.encode());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_roundtrip_and_corruption() {
        let sb = Superblock {
            uuid: [7; 16],
            drive_index: 2,
            ndrives: 5,
            level: 5,
            chunk: 65536,
            groups: 1,
            stripe_rows: 8,
            seg_stripes: 4,
            nsegs: 100,
            rows: 4000,
            generation: 9,
            created: 1,
            states: vec![
                DriveState::Online,
                DriveState::Failed,
                DriveState::Rebuilding,
                DriveState::Online,
                DriveState::Online,
            ],
        };
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b), Ok(sb));
        b[100] ^= 1;
        assert_eq!(Superblock::decode(&b), Err(FormatError::Checksum));
        assert_eq!(Superblock::decode(&b[..10]), Err(FormatError::Truncated));
    }

    #[test]
    fn summary_roundtrip() {
        let ents = vec![
            Entry {
                obj: 1,
                page: 2,
                version: 3,
                block: 0,
                len: 5000,
                crc: 9,
                flags: 0,
            },
            Entry {
                obj: 1,
                page: 3,
                version: 4,
                block: 0,
                len: 0,
                crc: 0,
                flags: ENTRY_TOMBSTONE,
            },
        ];
        let mut f = Footer {
            uuid: [1; 16],
            seg: 3,
            stripe: 1,
            seg_seq: 10,
            stripe_seq: 11,
            nentries: 0,
            flags: 0,
            summary_crc: 0,
        };
        let mut tail = vec![0u8; 4096];
        let s = encode_summary(&ents, &mut f);
        let n = tail.len();
        tail[n - s.len()..].copy_from_slice(&s);
        let (f2, e2) = decode_summary(&tail, 100).unwrap();
        assert_eq!(f2, f);
        assert_eq!(e2, ents);
        tail[n - s.len()] ^= 0xff;
        assert!(decode_summary(&tail, 100).is_err());
    }
}
