//! The log-structured array: drives, superblocks, the append log of full stripes, the index,
//! recovery, the cleaner, degraded reads, repair, rebuild and scrub.
//!
//! Lock order (never taken in the other direction): `writer` -> `index` -> `drives`.
//! A read first looks its record up and reads the drives without the index lock, and accepts
//! the result only if the checksum and the record's version still match; otherwise it reads
//! again holding `index` (read), so the cleaner, which moves records under `index` (write)
//! before it frees their segment, never hands out freed data.
//!
//! This module holds the [`Array`] handle, its shared state (drives, index, writer, counters)
//! and small helpers; the work is split by job:
//!
//! * `assemble`: preparing and locking drives, reading superblocks, `create` and `open`;
//! * `recover`: rebuilding the index from the stripe summaries, torn stripes;
//! * `read`: normal and degraded reads, reconstruction, repair on read, index queries;
//! * `write`: the open stripe, sealing full stripes into the log, flush, segment allocation;
//! * `clean`: the cleaner;
//! * `rebuild`: failing and replacing drives, rebuild;
//! * `scrub`: scrub and repair;
//! * `status`: what `array show` prints, counters;
//! * `snapshot`: read-only views for forked children and the holds that keep their data;
//! * `stripe_io`: whole-stripe I/O to the drives, sync, superblocks.

mod assemble;
mod clean;
mod condition;
mod read;
mod rebuild;
mod recover;
mod scrub;
mod snapshot;
mod status;
mod stripe_io;
mod write;

pub use assemble::{prepare_drive, read_superblock_path};
pub use scrub::ScrubReport;
pub use status::{ArrayStatus, DriveStatus};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::error::{ArrayError, Result};
use crate::format::{DriveState, Entry};
use crate::image::StripeImage;
use crate::io::{DriveFile, EngineKind, IoEngine};
use crate::layout::{Geometry, Level, BLOCK, MAX_VALUE};

/// Most stripes written concurrently by background writers (the log's queue depth; an
/// array may be opened with fewer, [`ArrayOptions::stripes_in_flight`]). Recovery checks
/// this many of the newest stripes.
const MAX_INFLIGHT: usize = 4;

/// A key: object id and page number.
pub type Key = (u64, u64);

/// How to build and open an array.
#[derive(Debug, Clone)]
pub struct ArrayOptions {
    /// I/O engine to use; io_uring falls back to psync where the kernel refuses a ring.
    pub engine: EngineKind,
    /// Entries per io_uring ring (the most operations one ring has in flight).
    pub queue_depth: u32,
    /// Try O_DIRECT on every drive (falls back to buffered where the file system refuses).
    pub direct: bool,
    /// Stripes written concurrently, 1 to 4 (4 by default): each holds a stripe image in
    /// DRAM (about 5 MiB on four drives), so a store that must keep its DRAM small (a paging
    /// process) trades write queue depth for memory.
    pub stripes_in_flight: usize,
    /// How long to wait for another owner to release the array's drives. A process killed
    /// with I/O in flight keeps its drives locked until the kernel has completed that I/O.
    pub lock_wait: Duration,
    /// Open even when stripe summaries are damaged beyond what redundancy repairs (what md's
    /// `--force` is to an array it cannot trust). Without it `open` fails with
    /// [`ArrayError::DamagedSummaries`]. With it the segments holding such stripes are
    /// quarantined: never written, cleaned or reused; the records of their intact stripes are
    /// read; `status` says `damaged`, [`Array::damaged_stripes`] lists them and scrub counts
    /// them unrepairable. Keys whose newest version or deletion was recorded in a damaged
    /// summary read their older value (or none): copy the data off and recreate the array.
    pub accept_damaged: bool,
}

impl Default for ArrayOptions {
    fn default() -> Self {
        ArrayOptions {
            engine: EngineKind::Uring,
            queue_depth: 64,
            direct: true,
            stripes_in_flight: MAX_INFLIGHT,
            lock_wait: Duration::from_secs(10),
            accept_damaged: false,
        }
    }
}

/// Parameters of `Array::create`.
#[derive(Debug, Clone)]
pub struct CreateParams {
    /// RAID level.
    pub level: Level,
    /// Chunk size in bytes: a power of two from 4 KiB to 1 MiB.
    pub chunk: usize,
    /// Redundancy groups for RAID 50 and 60 (default 2); must be `None` for other levels.
    pub groups: Option<usize>,
    /// Size to create or grow file drives to; None uses the drives' current size.
    pub size: Option<u64>,
}

/// Error counters of one drive since the array was opened.
#[derive(Debug, Default)]
pub struct DriveCounters {
    /// Reads from the drive that failed.
    pub read_errors: AtomicU64,
    /// Writes to the drive that failed.
    pub write_errors: AtomicU64,
    /// Pieces read from the drive that held wrong data (found by a checksum, then rebuilt
    /// from redundancy).
    pub csum_errors: AtomicU64,
}

struct Drive {
    path: PathBuf,
    file: Option<DriveFile>,
    state: DriveState,
    counters: Arc<DriveCounters>,
}

impl Drive {
    fn readable(&self) -> bool {
        self.state == DriveState::Online && self.file.is_some()
    }
    fn writable(&self) -> bool {
        self.state != DriveState::Failed && self.file.is_some()
    }
}

struct Drives {
    list: Vec<Drive>,
    generation: u64,
    created: u64,
    /// Rows of the rebuilding drive(s) done, for progress.
    rebuild_done: u64,
    rebuild_total: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SegState {
    Free,
    Open,
    Sealed,
    /// Holds a stripe whose summary is damaged beyond repair (opened with
    /// [`ArrayOptions::accept_damaged`]): read, scrubbed and rebuilt like a sealed segment,
    /// never allocated, cleaned or freed.
    Damaged,
}

#[derive(Debug, Clone, Copy)]
struct SegInfo {
    state: SegState,
    seq: u64,
    stripes: u32,
    live_blocks: u64,
    live_recs: u64,
}

impl SegInfo {
    fn add_live(&mut self, len: u32, sign: i64) {
        let b = blocks_of(len as usize) as u64;
        if sign > 0 {
            self.live_blocks += b;
            self.live_recs += 1;
        } else {
            self.live_blocks = self.live_blocks.saturating_sub(b);
            self.live_recs = self.live_recs.saturating_sub(1);
        }
    }
}

/// Who is asking for log space: user writes leave the reserve to deletes and the cleaner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    User,
    Delete,
    Cleaner,
}

#[derive(Debug, Clone, Copy)]
struct Loc {
    seg: u32,
    stripe: u32,
    block: u32,
    len: u32,
    crc: u32,
    version: u64,
    pending: bool,
}

#[derive(Debug, Clone, Copy)]
struct Tomb {
    version: u64,
    seg: u32,
}

struct Index {
    map: HashMap<Key, Loc>,
    /// The sum of the values' lengths in `map` (`status`'s used bytes without a walk of the
    /// map under its lock: the mount answers `status` for every Prometheus scrape).
    bytes: u64,
    tombs: HashMap<Key, Tomb>,
    segs: Vec<SegInfo>,
    /// Stripes whose summaries are damaged beyond repair, (segment, stripe), in order: their
    /// segments are [`SegState::Damaged`].
    damaged: Vec<(u32, u32)>,
}

/// For each key, the newest summary entry found on the drives and where: (entry, seg, stripe).
type Newest = HashMap<Key, (Entry, u32, u32)>;

impl Index {
    /// Enters `loc` for `key`, keeping the segments' live counts and `bytes`; the location
    /// it replaces, if any.
    fn put(&mut self, key: Key, loc: Loc) -> Option<Loc> {
        let old = self.map.insert(key, loc);
        if let Some(o) = &old {
            self.segs[o.seg as usize].add_live(o.len, -1);
            self.bytes -= u64::from(o.len);
        }
        self.segs[loc.seg as usize].add_live(loc.len, 1);
        self.bytes += u64::from(loc.len);
        old
    }

    /// Removes `key`, keeping the segments' live counts and `bytes`; its location, if any.
    fn take(&mut self, key: &Key) -> Option<Loc> {
        let old = self.map.remove(key)?;
        self.segs[old.seg as usize].add_live(old.len, -1);
        self.bytes -= u64::from(old.len);
        Some(old)
    }

    /// Enters the newest entry of each key: a value into the map, a deletion into the tombs.
    fn install(&mut self, best: Newest) {
        for (k, (e, seg, s)) in best {
            if e.is_tombstone() {
                self.tombs.insert(
                    k,
                    Tomb {
                        version: e.version,
                        seg,
                    },
                );
            } else {
                self.put(
                    k,
                    Loc {
                        seg,
                        stripe: s,
                        block: e.block,
                        len: e.len,
                        crc: e.crc,
                        version: e.version,
                        pending: false,
                    },
                );
            }
        }
    }
}

/// A sealed stripe being written by a background thread while the next one fills.
struct InFlight {
    /// Computes the parity, writes the stripe and hands the image back for reuse.
    handle: std::thread::JoinHandle<(Result<()>, StripeImage)>,
    seg: u32,
    stripe: u32,
    entries: Vec<Entry>,
}

struct Writer {
    seg: Option<u32>,
    stripe: u32,
    image: StripeImage,
    spare: Vec<StripeImage>,
    /// Sealed stripes being written, oldest first (at most [`MAX_INFLIGHT`]).
    inflight: std::collections::VecDeque<InFlight>,
    used_blocks: u32,
    entries: Vec<Entry>,
    dirty: bool,
}

impl Writer {
    fn new(image: StripeImage) -> Writer {
        Writer {
            seg: None,
            stripe: 0,
            image,
            spare: Vec::new(),
            inflight: std::collections::VecDeque::new(),
            used_blocks: 0,
            entries: Vec::new(),
            dirty: false,
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    user_bytes: AtomicU64,
    cleaner_bytes: AtomicU64,
    drive_bytes_written: AtomicU64,
    stripes_written: AtomicU64,
    pad_blocks: AtomicU64,
    repaired: AtomicU64,
    segments_cleaned: AtomicU64,
    conditioned_bytes: AtomicU64,
}

struct Inner {
    geo: Geometry,
    uuid: [u8; 16],
    engine: Box<dyn IoEngine>,
    drives: RwLock<Drives>,
    writer: Mutex<Writer>,
    index: RwLock<Index>,
    seq: AtomicU64,
    counters: Counters,
    /// Stripes written concurrently (1 to [`MAX_INFLIGHT`]).
    inflight: usize,
    reserve: u64,
    rebuilding: AtomicBool,
    /// A read-only view (a forked child's snapshot of its parent's array): never written,
    /// flushed, cleaned or repaired.
    read_only: bool,
    /// Snapshot holds (see `snapshot`): while one is held, the cleaner frees no segment.
    holds: Mutex<Vec<std::os::fd::OwnedFd>>,
    /// The next global stripe [`Array::condition_step`] looks at.
    conditioned: AtomicU64,
}

/// A handle to an open array. Cheap to clone; safe to share between threads.
#[derive(Clone)]
pub struct Array {
    inner: Arc<Inner>,
    /// Counts user handles (background stripe writers hold `inner` only).
    handles: Arc<()>,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn blocks_of(len: usize) -> u32 {
    len.div_ceil(BLOCK) as u32
}

fn io_err(path: &Path, e: std::io::Error) -> ArrayError {
    ArrayError::Drive {
        path: path.to_path_buf(),
        msg: e.to_string(),
    }
}

fn check_tolerance(geo: &Geometry, list: &[Drive]) -> Result<()> {
    for g in 0..geo.groups {
        let lost = (0..geo.group_size)
            .filter(|u| list[g * geo.group_size + u].state != DriveState::Online)
            .count();
        if lost > geo.m {
            return Err(ArrayError::Redundancy(format!(
                "group {g} has {lost} drives missing or failed and RAID {} tolerates {} per group",
                geo.level, geo.m
            )));
        }
    }
    Ok(())
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Lower-case hex of `b`, two digits per byte (how UUIDs are shown and stored in descriptors).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Array {
    /// The array's geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.inner.geo
    }

    /// The array's UUID, as stored in every superblock and stripe footer.
    pub fn uuid(&self) -> [u8; 16] {
        self.inner.uuid
    }

    /// Name of the I/O engine in use (`io_uring` or `psync`).
    pub fn engine_name(&self) -> &'static str {
        self.inner.engine.name()
    }

    /// Paths of the drives in index order.
    pub fn drive_paths(&self) -> Vec<PathBuf> {
        self.inner
            .drives
            .read()
            .list
            .iter()
            .map(|d| d.path.clone())
            .collect()
    }

    /// Largest value one key can hold.
    pub fn max_value(&self) -> usize {
        MAX_VALUE
    }

    fn next_seq(&self) -> u64 {
        self.inner.seq.fetch_add(1, Relaxed)
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        // The last handle flushes what was written; errors here cannot be reported.
        if Arc::strong_count(&self.handles) == 1 {
            let _ = self.flush();
        }
    }
}

/// For tests: a RAID 5 array of four file drives `dir/d0..d3` of `size` bytes each, 64 KiB
/// chunks.
#[cfg(test)]
pub(crate) fn test_raid5(dir: &Path, size: u64) -> Array {
    let paths: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("d{i}"))).collect();
    let params = CreateParams {
        level: Level::Raid5,
        chunk: 64 << 10,
        groups: None,
        size: Some(size),
    };
    match Array::create(&paths, &params, &ArrayOptions::default()) {
        Ok(a) => a,
        Err(e) => panic!("create a test array: {e}"),
    }
}
