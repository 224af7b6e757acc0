//! Status: what `array show` prints, and the array's counters.

use std::sync::atomic::Ordering::Relaxed;

use crate::format::DriveState;
use crate::layout::BLOCK;

use super::{check_tolerance, hex, Array, Key, Loc, SegInfo, SegState, Tomb};

/// Per-drive line of [`ArrayStatus`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct DriveStatus {
    /// Position of the drive in the array.
    pub index: usize,
    /// Path of the drive.
    pub path: String,
    /// State recorded in the superblocks.
    pub state: DriveState,
    /// Failed reads since open.
    pub read_errors: u64,
    /// Failed writes since open.
    pub write_errors: u64,
    /// Pieces found wrong by a checksum and rebuilt from redundancy, since open.
    pub checksum_errors: u64,
}

/// What `array show` prints.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ArrayStatus {
    /// The array's UUID in hex.
    pub uuid: String,
    /// RAID level number.
    pub level: u32,
    /// Chunk size in bytes.
    pub chunk: usize,
    /// Redundancy groups.
    pub groups: usize,
    /// Drives per group.
    pub group_size: usize,
    /// Drives in the array, whatever their state.
    pub drives_total: usize,
    /// online | degraded | rebuilding | damaged | failed: `damaged` where an array opened
    /// with `ArrayOptions::accept_damaged` holds stripe summaries damaged beyond repair
    /// ([`Array::damaged_stripes`]); `failed` where more drives are gone than the level
    /// tolerates.
    pub state: String,
    /// Progress of a running rebuild in percent; `None` when no drive is rebuilding.
    pub rebuild_percent: Option<f64>,
    /// Bytes of stripe data in all segments but the cleaner's reserve.
    pub capacity_bytes: u64,
    /// Sum of the lengths of all live values, in bytes.
    pub used_bytes: u64,
    /// `capacity_bytes` less the blocks live values occupy.
    pub free_bytes: u64,
    /// Live keys (values, not named objects).
    pub objects: u64,
    /// Segments in the array.
    pub segments: u64,
    /// Segments holding no data.
    pub free_segments: u64,
    /// Bytes of data per log stripe.
    pub stripe_bytes: usize,
    /// Bytes written by users and the cleaner per byte written by users (1.0 before any
    /// write); parity and padding are not counted.
    pub write_amplification: f64,
    /// Pieces rewritten from redundancy since open (repair on read and scrub).
    pub repaired: u64,
    /// Name of the I/O engine in use.
    pub engine: String,
    /// Whether any drive is open with O_DIRECT.
    pub direct_io: bool,
    /// Superblock generation.
    pub generation: u64,
    /// One line per drive, in drive order.
    pub drives: Vec<DriveStatus>,
}

impl Array {
    /// DRAM the array holds for stripe images at most: the open stripe and the stripes being
    /// written, every drive's share with its redundancy.
    pub fn buffer_bytes(&self) -> u64 {
        let geo = &self.inner.geo;
        ((self.inner.inflight + 1) * geo.ndrives * geo.stripe_drive_bytes()) as u64
    }

    /// DRAM the array's index holds: its tables' allocated entries (a hash table keeps its
    /// capacity when entries go), about 50 to 100 bytes per stored value, and a table's next
    /// growth once it is nearly full ([`tierstack_common::size::table_charge`]). A paging
    /// process charges this to its budget.
    pub fn index_bytes(&self) -> u64 {
        use tierstack_common::size::table_charge;
        let idx = self.inner.index.read();
        table_charge(
            idx.map.len(),
            idx.map.capacity(),
            std::mem::size_of::<(Key, Loc)>(),
        ) + table_charge(
            idx.tombs.len(),
            idx.tombs.capacity(),
            std::mem::size_of::<(Key, Tomb)>(),
        ) + (idx.segs.capacity() * std::mem::size_of::<SegInfo>()) as u64
    }

    /// A snapshot of the array's configuration, state, space and counters.
    pub fn status(&self) -> ArrayStatus {
        let geo = &self.inner.geo;
        let drives = self.inner.drives.read();
        let idx = self.inner.index.read();
        let seg_bytes = geo.seg_stripes * geo.stripe_data() as u64;
        let capacity = (geo.nsegs - self.inner.reserve) * seg_bytes;
        let used = idx.bytes;
        debug_assert_eq!(
            used,
            idx.map.values().map(|l| u64::from(l.len)).sum::<u64>()
        );
        let free_segments = idx
            .segs
            .iter()
            .filter(|s| s.state == SegState::Free)
            .count() as u64;
        let live_blocks: u64 = idx.segs.iter().map(|s| s.live_blocks).sum();
        let failed = drives
            .list
            .iter()
            .filter(|d| d.state == DriveState::Failed)
            .count();
        let rebuilding = drives
            .list
            .iter()
            .any(|d| d.state == DriveState::Rebuilding);
        let state = if check_tolerance(geo, &drives.list).is_err() {
            "failed"
        } else if !idx.damaged.is_empty() {
            "damaged"
        } else if rebuilding {
            "rebuilding"
        } else if failed > 0 {
            "degraded"
        } else {
            "online"
        };
        let c = &self.inner.counters;
        let user = c.user_bytes.load(Relaxed);
        let wa = if user == 0 {
            1.0
        } else {
            (user + c.cleaner_bytes.load(Relaxed)) as f64 / user as f64
        };
        ArrayStatus {
            uuid: hex(&self.inner.uuid),
            level: geo.level.number(),
            chunk: geo.chunk,
            groups: geo.groups,
            group_size: geo.group_size,
            drives_total: geo.ndrives,
            state: state.into(),
            rebuild_percent: (rebuilding && drives.rebuild_total > 0)
                .then(|| 100.0 * drives.rebuild_done as f64 / drives.rebuild_total as f64),
            capacity_bytes: capacity,
            used_bytes: used,
            free_bytes: capacity.saturating_sub(live_blocks * BLOCK as u64),
            objects: idx.map.len() as u64,
            segments: geo.nsegs,
            free_segments,
            stripe_bytes: geo.stripe_data(),
            write_amplification: wa,
            repaired: c.repaired.load(Relaxed),
            engine: self.inner.engine.name().into(),
            direct_io: drives
                .list
                .iter()
                .any(|d| d.file.as_ref().is_some_and(|f| f.direct)),
            generation: drives.generation,
            drives: drives
                .list
                .iter()
                .enumerate()
                .map(|(i, d)| DriveStatus {
                    index: i,
                    path: d.path.display().to_string(),
                    state: d.state,
                    read_errors: d.counters.read_errors.load(Relaxed),
                    write_errors: d.counters.write_errors.load(Relaxed),
                    checksum_errors: d.counters.csum_errors.load(Relaxed),
                })
                .collect(),
        }
    }

    /// The stripes whose summaries were found damaged beyond repair at open, as (segment,
    /// stripe within the segment), in order; empty unless the array was opened with
    /// `ArrayOptions::accept_damaged`. Their segments are quarantined (never written, cleaned
    /// or reused) and scrub counts each such stripe unrepairable.
    pub fn damaged_stripes(&self) -> Vec<(u32, u32)> {
        self.inner.index.read().damaged.clone()
    }

    /// Bytes written to drives (data, parity and padding) since open.
    pub fn drive_bytes_written(&self) -> u64 {
        self.inner.counters.drive_bytes_written.load(Relaxed)
    }
}
