//! The log-structured array: drives, superblocks, the append log of full stripes, the index,
//! recovery, the cleaner, degraded reads, repair, rebuild and scrub.
//!
//! Lock order (never taken in the other direction): `writer` -> `index` -> `drives`.
//! Readers take `index` (read) for the whole of a disk read, so the cleaner, which moves
//! records under `index` (write) before it frees their segment, never frees data in use.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::error::{ArrayError, Result};
use crate::format::{self, DriveState, Entry, Footer, Superblock, FOOTER_FREE, SB_SIZE};
use crate::image::StripeImage;
use crate::io::{self, AlignedBuf, DriveFile, EngineKind, IoEngine, IoOp};
use crate::layout::{Geometry, Level, BLOCK, MAX_VALUE};

/// Stripes written concurrently by background writers (the log's queue depth).
const MAX_INFLIGHT: usize = 4;

/// A key: object id and page number.
pub type Key = (u64, u64);

/// How to build and open an array.
#[derive(Debug, Clone)]
pub struct ArrayOptions {
    pub engine: EngineKind,
    pub queue_depth: u32,
    /// Try O_DIRECT on every drive (falls back to buffered where the file system refuses).
    pub direct: bool,
    /// How long to wait for another owner to release the array's drives. A process killed
    /// with I/O in flight keeps its drives locked until the kernel has completed that I/O.
    pub lock_wait: Duration,
}

impl Default for ArrayOptions {
    fn default() -> Self {
        ArrayOptions {
            engine: EngineKind::Uring,
            queue_depth: 64,
            direct: true,
            lock_wait: Duration::from_secs(10),
        }
    }
}

/// Parameters of `Array::create`.
#[derive(Debug, Clone)]
pub struct CreateParams {
    pub level: Level,
    pub chunk: usize,
    pub groups: Option<usize>,
    /// Size to create or grow file drives to; None uses the drives' current size.
    pub size: Option<u64>,
}

#[derive(Debug, Default)]
pub struct DriveCounters {
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
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
    tombs: HashMap<Key, Tomb>,
    segs: Vec<SegInfo>,
}

/// For each key, the newest summary entry found on the drives and where: (entry, seg, stripe).
type Newest = HashMap<Key, (Entry, u32, u32)>;

impl Index {
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
                self.segs[seg as usize].add_live(e.len, 1);
                self.map.insert(
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

#[derive(Debug, Default)]
struct Counters {
    user_bytes: AtomicU64,
    cleaner_bytes: AtomicU64,
    drive_bytes_written: AtomicU64,
    stripes_written: AtomicU64,
    pad_blocks: AtomicU64,
    repaired: AtomicU64,
    segments_cleaned: AtomicU64,
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
    reserve: u64,
    rebuilding: AtomicBool,
}

/// A handle to an open array. Cheap to clone; safe to share between threads.
#[derive(Clone)]
pub struct Array {
    inner: Arc<Inner>,
    /// Counts user handles (background stripe writers hold `inner` only).
    handles: Arc<()>,
}

/// Per-drive line of [`ArrayStatus`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct DriveStatus {
    pub index: usize,
    pub path: String,
    pub state: DriveState,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
}

/// What `array show` prints.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ArrayStatus {
    pub uuid: String,
    pub level: u32,
    pub chunk: usize,
    pub groups: usize,
    pub group_size: usize,
    pub drives_total: usize,
    /// online | degraded | rebuilding | failed
    pub state: String,
    pub rebuild_percent: Option<f64>,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub objects: u64,
    pub segments: u64,
    pub free_segments: u64,
    pub stripe_bytes: usize,
    pub write_amplification: f64,
    pub repaired: u64,
    pub engine: String,
    pub direct_io: bool,
    pub generation: u64,
    pub drives: Vec<DriveStatus>,
}

/// Result of a scrub.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ScrubReport {
    pub stripes_checked: u64,
    pub records_checked: u64,
    pub checksum_errors: u64,
    pub parity_errors: u64,
    pub repaired: u64,
    pub unrepairable: u64,
}

impl ScrubReport {
    pub fn clean(&self) -> bool {
        self.checksum_errors == 0 && self.parity_errors == 0 && self.unrepairable == 0
    }
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

/// Takes the exclusive lock that makes this process the owner of a drive, waiting up to
/// `wait` for a previous owner to go away.
fn lock_drive(df: &DriveFile, path: &Path, wait: Duration) -> Result<()> {
    use rustix::fs::{flock, FlockOperation};
    let start = Instant::now();
    loop {
        if flock(&df.file, FlockOperation::NonBlockingLockExclusive).is_ok() {
            return Ok(());
        }
        if start.elapsed() >= wait {
            return Err(ArrayError::Busy(format!(
                "drive {} is locked",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Prepares a drive path for a new array: creates or grows a regular file to `size`, or checks
/// a block device. Returns whether the file was created by us (to remove on failure).
pub fn prepare_drive(path: &Path, size: Option<u64>) -> Result<(bool, u64)> {
    let meta = std::fs::metadata(path);
    let created = meta.is_err();
    match &meta {
        Ok(m) if m.is_dir() => {
            return Err(ArrayError::Drive {
                path: path.to_path_buf(),
                msg: "is a directory: give a file or block device".into(),
            })
        }
        Err(_) if size.is_none() => {
            return Err(ArrayError::Drive {
                path: path.to_path_buf(),
                msg: "does not exist: pass --size to create file drives".into(),
            })
        }
        _ => {}
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| io_err(path, e))?;
    let is_file = file.metadata().map(|m| m.is_file()).unwrap_or(false);
    let mut cur = io::device_size(&file).map_err(|e| io_err(path, e))?;
    if let Some(sz) = size {
        if is_file && cur < sz {
            file.set_len(sz).map_err(|e| io_err(path, e))?;
            cur = sz;
        }
    }
    Ok((created, cur))
}

impl Array {
    /// Creates a new array over `paths` (files are created or grown to `params.size`). On error
    /// nothing is left behind: created files are removed, existing ones get their superblocks
    /// cleared only if we wrote them.
    pub fn create(paths: &[PathBuf], params: &CreateParams, opts: &ArrayOptions) -> Result<Array> {
        let mut seen = std::collections::HashSet::new();
        for p in paths {
            let canon = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            if !seen.insert(canon) {
                return Err(ArrayError::Config(format!(
                    "drive {} is given twice: list each drive once",
                    p.display()
                )));
            }
        }
        // Validate the geometry before touching any drive.
        Geometry::new(
            params.level,
            paths.len(),
            params.chunk,
            params.groups,
            params.size.unwrap_or(u64::MAX),
        )?;
        let mut created: Vec<PathBuf> = Vec::new();
        let result = Self::create_inner(paths, params, opts, &mut created);
        if result.is_err() {
            for p in &created {
                let _ = std::fs::remove_file(p);
            }
        }
        result
    }

    fn create_inner(
        paths: &[PathBuf],
        params: &CreateParams,
        opts: &ArrayOptions,
        created: &mut Vec<PathBuf>,
    ) -> Result<Array> {
        // Refuse drives that already belong to an array unless... they are ours to overwrite:
        // a drive of another live array is never silently reused.
        for p in paths {
            if let Ok(sb) = read_superblock_path(p) {
                return Err(ArrayError::Drive {
                    path: p.clone(),
                    msg: format!(
                        "already belongs to array {} (drive {}): wipe it or pick another drive",
                        hex(&sb.uuid),
                        sb.drive_index
                    ),
                });
            }
        }
        let mut sizes = Vec::new();
        for p in paths {
            let (was_created, size) = prepare_drive(p, params.size)?;
            if was_created {
                created.push(p.clone());
            }
            sizes.push(size);
        }
        let min = sizes.iter().copied().min().unwrap_or(0);
        let geo = Geometry::new(params.level, paths.len(), params.chunk, params.groups, min)?;
        let uuid: [u8; 16] = rand::random();
        let mut list = Vec::new();
        for p in paths {
            let df = DriveFile::open(p, opts.direct).map_err(|e| io_err(p, e))?;
            lock_drive(&df, p, opts.lock_wait)?;
            list.push(Drive {
                path: p.clone(),
                file: Some(df),
                state: DriveState::Online,
                counters: Arc::default(),
            });
        }
        let drives = Drives {
            list,
            generation: 1,
            created: now_secs(),
            rebuild_done: 0,
            rebuild_total: 0,
        };
        let segs = vec![
            SegInfo {
                state: SegState::Free,
                seq: 0,
                stripes: 0,
                live_blocks: 0,
                live_recs: 0,
            };
            geo.nsegs as usize
        ];
        let arr = Array::from_parts(geo, uuid, drives, segs, opts, 1);
        // Invalidate whatever an earlier use of these drives left in the log area: every
        // segment starts with a FREE marker stripe. Drive files this call created hold only
        // zeros (no valid summary), so they need none: a large array of fresh sparse files
        // starts at once instead of writing a stripe per segment.
        if created.len() < paths.len() {
            let mut w = arr.inner.writer.lock();
            for seg in 0..arr.inner.geo.nsegs as u32 {
                arr.write_marker(&mut w, seg)?;
            }
        }
        arr.inner.write_superblocks()?;
        arr.inner.sync_all()?;
        Ok(arr)
    }

    fn from_parts(
        geo: Geometry,
        uuid: [u8; 16],
        drives: Drives,
        segs: Vec<SegInfo>,
        opts: &ArrayOptions,
        seq: u64,
    ) -> Array {
        let image = StripeImage::new(&geo);
        let reserve = 2 + geo.nsegs / 64;
        Array {
            handles: Arc::new(()),
            inner: Arc::new(Inner {
                engine: io::make_engine(opts.engine, opts.queue_depth),
                uuid,
                drives: RwLock::new(drives),
                writer: Mutex::new(Writer {
                    seg: None,
                    stripe: 0,
                    image,
                    spare: Vec::new(),
                    inflight: std::collections::VecDeque::new(),
                    used_blocks: 0,
                    entries: Vec::new(),
                    dirty: false,
                }),
                index: RwLock::new(Index {
                    map: HashMap::new(),
                    tombs: HashMap::new(),
                    segs,
                }),
                seq: AtomicU64::new(seq),
                counters: Counters::default(),
                reserve,
                rebuilding: AtomicBool::new(false),
                geo,
            }),
        }
    }

    /// Opens an existing array from its drives (in any order; missing paths may be given and
    /// are treated as failed drives). Rebuilds the index from the segment summaries.
    pub fn open(paths: &[PathBuf], opts: &ArrayOptions) -> Result<Array> {
        let mut sbs: Vec<(PathBuf, Option<Superblock>)> = Vec::new();
        for p in paths {
            sbs.push((p.clone(), read_superblock_path(p).ok()));
        }
        let newest = sbs
            .iter()
            .filter_map(|(_, s)| s.as_ref())
            .max_by_key(|s| s.generation)
            .cloned()
            .ok_or_else(|| {
                ArrayError::Config(
                    "none of the given drives carries a tierstack superblock: check the drive paths".into(),
                )
            })?;
        for (p, s) in &sbs {
            if let Some(s) = s {
                if s.uuid != newest.uuid {
                    return Err(ArrayError::Drive {
                        path: p.clone(),
                        msg: format!(
                            "belongs to another array ({}, not {}): do not mix drives of two arrays",
                            hex(&s.uuid),
                            hex(&newest.uuid)
                        ),
                    });
                }
            }
        }
        let level = Level::from_number(newest.level)
            .ok_or_else(|| ArrayError::Config("superblock has an unknown level".into()))?;
        let n = newest.ndrives as usize;
        let groups =
            matches!(level, Level::Raid50 | Level::Raid60).then_some(newest.groups as usize);
        let used = crate::layout::DATA_OFFSET
            + newest.nsegs as u64
                * newest.seg_stripes as u64
                * newest.stripe_rows as u64
                * newest.chunk as u64;
        let geo = Geometry::new(level, n, newest.chunk as usize, groups, used)?;
        if geo.nsegs != newest.nsegs as u64 || geo.stripe_rows != newest.stripe_rows as u64 {
            return Err(ArrayError::Config(
                "superblock geometry is inconsistent".into(),
            ));
        }
        // Place each drive at the index its superblock names.
        let mut slot: Vec<Option<(PathBuf, Superblock)>> = vec![None; n];
        let mut unplaced: Vec<PathBuf> = Vec::new();
        for (p, s) in sbs {
            match s {
                Some(s) if slot[s.drive_index as usize].is_none() => {
                    let i = s.drive_index as usize;
                    slot[i] = Some((p, s));
                }
                _ => unplaced.push(p),
            }
        }
        let mut list = Vec::new();
        for (i, entry) in slot.into_iter().enumerate() {
            let state = newest.states.get(i).copied().unwrap_or(DriveState::Failed);
            match entry {
                Some((p, _)) if state != DriveState::Failed => {
                    let df = DriveFile::open(&p, opts.direct).map_err(|e| io_err(&p, e))?;
                    lock_drive(&df, &p, opts.lock_wait)?;
                    list.push(Drive {
                        path: p,
                        file: Some(df),
                        state,
                        counters: Arc::default(),
                    });
                }
                Some((p, _)) => list.push(Drive {
                    path: p,
                    file: None,
                    state: DriveState::Failed,
                    counters: Arc::default(),
                }),
                None => {
                    let path = if unplaced.is_empty() {
                        PathBuf::from("(missing)")
                    } else {
                        unplaced.remove(0)
                    };
                    list.push(Drive {
                        path,
                        file: None,
                        state: DriveState::Failed,
                        counters: Arc::default(),
                    })
                }
            }
        }
        let drives = Drives {
            list,
            generation: newest.generation,
            created: newest.created,
            rebuild_done: 0,
            rebuild_total: 0,
        };
        check_tolerance(&geo, &drives.list)?;
        let segs = vec![
            SegInfo {
                state: SegState::Free,
                seq: 0,
                stripes: 0,
                live_blocks: 0,
                live_recs: 0,
            };
            geo.nsegs as usize
        ];
        let arr = Array::from_parts(geo, newest.uuid, drives, segs, opts, 1);
        arr.recover()?;
        Ok(arr)
    }

    pub fn geometry(&self) -> &Geometry {
        &self.inner.geo
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.inner.uuid
    }

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

    // ---------------------------------------------------------------- recovery

    fn recover(&self) -> Result<()> {
        let geo = self.inner.geo.clone();
        let mut best: Newest = HashMap::new();
        let mut segs = vec![
            SegInfo {
                state: SegState::Free,
                seq: 0,
                stripes: 0,
                live_blocks: 0,
                live_recs: 0,
            };
            geo.nsegs as usize
        ];
        let mut max_seq = 0u64;
        let mut latest: Vec<(u64, u32, u32)> = Vec::new(); // (stripe_seq, seg, stripe)
        for seg in 0..geo.nsegs as u32 {
            let mut seg_seq = None;
            for s in 0..geo.seg_stripes as u32 {
                let Some((f, ents)) = self.read_summary(seg, s) else {
                    break;
                };
                max_seq = max_seq.max(f.stripe_seq).max(f.seg_seq);
                if f.seg != seg || f.stripe != s {
                    break;
                }
                if s == 0 {
                    if f.flags & FOOTER_FREE != 0 {
                        latest.push((f.stripe_seq, seg, s));
                        break;
                    }
                    seg_seq = Some(f.seg_seq);
                } else if Some(f.seg_seq) != seg_seq {
                    break;
                }
                latest.push((f.stripe_seq, seg, s));
                segs[seg as usize] = SegInfo {
                    state: SegState::Sealed,
                    seq: f.seg_seq,
                    stripes: s + 1,
                    live_blocks: 0,
                    live_recs: 0,
                };
                for e in ents {
                    max_seq = max_seq.max(e.version);
                    let k = (e.obj, e.page);
                    if best.get(&k).is_none_or(|b| e.version > b.0.version) {
                        best.insert(k, (e, seg, s));
                    }
                }
            }
        }
        self.inner.seq.store(max_seq + 1, Relaxed);
        let mut idx = self.inner.index.write();
        idx.segs = segs;
        idx.install(best);
        drop(idx);
        // Only the stripes that were in flight can be torn by a crash, and at most
        // MAX_INFLIGHT were: check the newest ones and void any whose records cannot be read
        // back (they were never acknowledged by a flush).
        latest.sort_unstable_by_key(|l| std::cmp::Reverse(l.0));
        for &(_, seg, s) in latest.iter().take(MAX_INFLIGHT) {
            self.check_torn(seg, s)?;
        }
        Ok(())
    }

    fn check_torn(&self, seg: u32, s: u32) -> Result<()> {
        let locs: Vec<(Key, Loc)> = {
            let idx = self.inner.index.read();
            idx.map
                .iter()
                .filter(|(_, l)| l.seg == seg && l.stripe == s)
                .map(|(k, l)| (*k, *l))
                .collect()
        };
        let mut torn = false;
        for (_, loc) in &locs {
            let idx = self.inner.index.read();
            if self.read_loc(&idx, loc).is_err() {
                torn = true;
                break;
            }
        }
        if !torn {
            return Ok(());
        }
        tracing::warn!(
            "stripe {s} of segment {seg} was torn by a crash; dropping its unacknowledged records"
        );
        let mut idx = self.inner.index.write();
        for (k, _) in &locs {
            if let Some(l) = idx.map.remove(k) {
                idx.segs[l.seg as usize].add_live(l.len, -1);
            }
        }
        // Older versions of those keys may still exist; the voided stripe must not hide them,
        // so reload them from a full rescan is unnecessary: a torn stripe holds only versions
        // newer than any flushed one, and the flushed ones are what we must keep. Rebuild the
        // affected keys' best flushed version by a second, targeted pass.
        drop(idx);
        self.void_stripe(seg, s)?;
        let keys: Vec<Key> = locs.iter().map(|(k, _)| *k).collect();
        self.reload_keys(&keys)?;
        Ok(())
    }

    /// Rewrites a torn stripe as a valid, empty stripe of its segment.
    fn void_stripe(&self, seg: u32, s: u32) -> Result<()> {
        let seg_seq = self.inner.index.read().segs[seg as usize].seq;
        let mut w = self.inner.writer.lock();
        let gs = self.inner.geo.seg_stripes * seg as u64 + s as u64;
        w.image.clear();
        let mut footer = Footer {
            uuid: self.inner.uuid,
            seg,
            stripe: s,
            seg_seq,
            stripe_seq: self.next_seq(),
            nentries: 0,
            flags: 0,
            summary_crc: 0,
        };
        let summary = format::encode_summary(&[], &mut footer);
        let sd = self.inner.geo.stripe_data();
        w.image
            .place(&self.inner.geo, gs, sd - summary.len(), &summary);
        w.image.encode(&self.inner.geo, gs);
        self.inner.write_image(&w.image, gs)?;
        w.image.clear();
        drop(w);
        self.inner.sync_all()
    }

    /// Re-derives the newest surviving version of `keys` from every valid stripe.
    fn reload_keys(&self, keys: &[Key]) -> Result<()> {
        let want: std::collections::HashSet<Key> = keys.iter().copied().collect();
        let segs: Vec<SegInfo> = self.inner.index.read().segs.clone();
        let mut best: Newest = HashMap::new();
        for (seg, info) in segs.iter().enumerate() {
            if info.state == SegState::Free {
                continue;
            }
            for s in 0..info.stripes {
                let Some((_, ents)) = self.read_summary(seg as u32, s) else {
                    continue;
                };
                for e in ents {
                    let k = (e.obj, e.page);
                    if want.contains(&k) && best.get(&k).is_none_or(|b| e.version > b.0.version) {
                        best.insert(k, (e, seg as u32, s));
                    }
                }
            }
        }
        let mut idx = self.inner.index.write();
        idx.install(best);
        Ok(())
    }

    /// Reads and verifies the summary of stripe `s` of `seg`; None if it is not a valid stripe.
    fn read_summary(&self, seg: u32, s: u32) -> Option<(Footer, Vec<Entry>)> {
        let geo = &self.inner.geo;
        let gs = geo.seg_stripes * seg as u64 + s as u64;
        let sd = geo.stripe_data();
        let max_blocks = geo.stripe_blocks() as u32;
        let check_footer = |b: &[u8]| -> bool {
            format::Footer::decode(&b[b.len() - format::FOOTER_SIZE..])
                .map(|f| f.uuid == self.inner.uuid)
                .unwrap_or(false)
        };
        let last = self
            .read_checked(gs, sd - BLOCK, BLOCK, &check_footer)
            .ok()?;
        let footer = format::Footer::decode(&last[BLOCK - format::FOOTER_SIZE..]).ok()?;
        let need = format::summary_bytes(footer.nentries as usize).div_ceil(BLOCK) * BLOCK;
        if need > sd {
            return None;
        }
        let tail = if need <= BLOCK {
            last
        } else {
            let check = |b: &[u8]| format::decode_summary(b, max_blocks).is_ok();
            self.read_checked(gs, sd - need, need, &check).ok()?
        };
        format::decode_summary(&tail, max_blocks).ok()
    }

    // ---------------------------------------------------------------- reads

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
    fn read_checked(
        &self,
        gs: u64,
        off: usize,
        len: usize,
        check: &dyn Fn(&[u8]) -> bool,
    ) -> Result<AlignedBuf> {
        let buf = self.read_raw(gs, off, len, &[])?;
        if check(&buf) {
            return Ok(buf);
        }
        let geo = &self.inner.geo;
        if geo.m == 0 {
            return Err(ArrayError::DataLoss(format!(
                "checksum mismatch in stripe {gs} (RAID 0 has no redundancy)"
            )));
        }
        for bad in culprit_sets(geo, gs, off, len) {
            let Ok(fixed) = self.read_raw(gs, off, len, &bad) else {
                continue;
            };
            if check(&fixed) {
                self.repair_in_place(gs, off, &buf, &fixed, &bad);
                return Ok(fixed);
            }
        }
        Err(ArrayError::DataLoss(format!(
            "checksum mismatch in stripe {gs} at offset {off} that redundancy cannot repair"
        )))
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

    fn read_loc(&self, _idx: &Index, loc: &Loc) -> Result<Vec<u8>> {
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

    /// DRAM the array holds for stripe images at most: the open stripe and the stripes being
    /// written, every drive's share with its redundancy.
    pub fn buffer_bytes(&self) -> u64 {
        let geo = &self.inner.geo;
        ((MAX_INFLIGHT + 1) * geo.ndrives * geo.stripe_drive_bytes()) as u64
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

    // ---------------------------------------------------------------- writes

    /// Stores `value` (at most [`MAX_VALUE`] bytes) under `key`. Durable after [`Array::flush`].
    pub fn put(&self, key: Key, value: &[u8]) -> Result<()> {
        if value.len() > MAX_VALUE {
            return Err(ArrayError::TooLarge(value.len(), MAX_VALUE));
        }
        let mut w = self.inner.writer.lock();
        let v = self.next_seq();
        self.append(&mut w, key, v, value, Class::User)?;
        self.inner
            .counters
            .user_bytes
            .fetch_add(value.len() as u64, Relaxed);
        Ok(())
    }

    /// Removes `key`. Returns whether it existed. Durable after [`Array::flush`].
    pub fn delete(&self, key: Key) -> Result<bool> {
        let mut w = self.inner.writer.lock();
        if !self.inner.index.read().map.contains_key(&key) {
            return Ok(false);
        }
        let v = self.next_seq();
        self.append_tomb(&mut w, key, v, Class::Delete)?;
        Ok(true)
    }

    /// The durability point: returns when everything written before it is on the drives with
    /// its redundancy.
    pub fn flush(&self) -> Result<()> {
        let mut w = self.inner.writer.lock();
        self.flush_locked(&mut w)
    }

    fn flush_locked(&self, w: &mut Writer) -> Result<()> {
        if w.dirty {
            self.seal_stripe(w)?;
        }
        self.finish_inflight(w)?;
        self.inner.sync_all()
    }

    fn stripe_fits(&self, w: &Writer, blocks: u32, extra_entries: usize) -> bool {
        let sd = self.inner.geo.stripe_data();
        (w.used_blocks + blocks) as usize * BLOCK
            + format::summary_bytes(w.entries.len() + extra_entries)
            <= sd
    }

    /// Makes sure the writer has an open stripe with room for `blocks` more blocks and one entry.
    fn make_room(&self, w: &mut Writer, blocks: u32, class: Class) -> Result<()> {
        if w.seg.is_some() && self.stripe_fits(w, blocks, 1) {
            return Ok(());
        }
        if w.seg.is_some() && w.dirty {
            self.seal_stripe(w)?;
        }
        if w.seg.is_none() {
            let seg = self.alloc_segment(w, class)?;
            w.seg = Some(seg);
            w.stripe = 0;
        }
        Ok(())
    }

    fn append(
        &self,
        w: &mut Writer,
        key: Key,
        version: u64,
        value: &[u8],
        class: Class,
    ) -> Result<()> {
        let blocks = blocks_of(value.len());
        self.make_room(w, blocks, class)?;
        let Some(seg) = w.seg else {
            return Err(ArrayError::NoSpace("no open segment".into()));
        };
        let geo = &self.inner.geo;
        let gs = geo.seg_stripes * seg as u64 + w.stripe as u64;
        let block = w.used_blocks;
        w.image.place(geo, gs, block as usize * BLOCK, value);
        let crc = crc32c::crc32c(value);
        w.used_blocks += blocks;
        w.entries.push(Entry {
            obj: key.0,
            page: key.1,
            version,
            block,
            len: value.len() as u32,
            crc,
            flags: 0,
        });
        w.dirty = true;
        let loc = Loc {
            seg,
            stripe: w.stripe,
            block,
            len: value.len() as u32,
            crc,
            version,
            pending: true,
        };
        let mut idx = self.inner.index.write();
        if let Some(old) = idx.map.insert(key, loc) {
            idx.segs[old.seg as usize].add_live(old.len, -1);
        }
        idx.segs[seg as usize].add_live(value.len() as u32, 1);
        idx.tombs.remove(&key);
        Ok(())
    }

    fn append_tomb(&self, w: &mut Writer, key: Key, version: u64, class: Class) -> Result<()> {
        self.make_room(w, 0, class)?;
        let Some(seg) = w.seg else {
            return Err(ArrayError::NoSpace("no open segment".into()));
        };
        w.entries.push(Entry {
            obj: key.0,
            page: key.1,
            version,
            block: 0,
            len: 0,
            crc: 0,
            flags: format::ENTRY_TOMBSTONE,
        });
        w.dirty = true;
        let mut idx = self.inner.index.write();
        if let Some(old) = idx.map.remove(&key) {
            idx.segs[old.seg as usize].add_live(old.len, -1);
        }
        idx.tombs.insert(key, Tomb { version, seg });
        Ok(())
    }

    /// Writes the open stripe (padded) with its summary and parity, then advances.
    fn seal_stripe(&self, w: &mut Writer) -> Result<()> {
        let Some(seg) = w.seg else { return Ok(()) };
        let geo = &self.inner.geo;
        let gs = geo.seg_stripes * seg as u64 + w.stripe as u64;
        let seg_seq = self.inner.index.read().segs[seg as usize].seq;
        let mut footer = Footer {
            uuid: self.inner.uuid,
            seg,
            stripe: w.stripe,
            seg_seq,
            stripe_seq: self.next_seq(),
            nentries: 0,
            flags: 0,
            summary_crc: 0,
        };
        let summary = format::encode_summary(&w.entries, &mut footer);
        let sd = geo.stripe_data();
        w.image.place(geo, gs, sd - summary.len(), &summary);
        // Keep a few stripes in flight, like a queue depth: wait for the oldest when full.
        while w.inflight.len() >= MAX_INFLIGHT {
            self.finish_oldest(w)?;
        }
        let fresh = w.spare.pop().unwrap_or_else(|| StripeImage::new(geo));
        let mut img = std::mem::replace(&mut w.image, fresh);
        let inner = self.inner.clone();
        // Parity is computed on the writer thread, overlapping the next stripe's filling.
        let handle = std::thread::Builder::new()
            .name("ts-stripe".into())
            .spawn(move || {
                img.encode(&inner.geo, gs);
                let r = inner.write_image(&img, gs);
                (r, img)
            })
            .map_err(|e| ArrayError::io("starting the stripe writer", e))?;
        w.inflight.push_back(InFlight {
            handle,
            seg,
            stripe: w.stripe,
            entries: std::mem::take(&mut w.entries),
        });
        let pad = geo.stripe_blocks() as u64 - w.used_blocks as u64;
        self.inner.counters.pad_blocks.fetch_add(pad, Relaxed);
        w.used_blocks = 0;
        w.dirty = false;
        w.stripe += 1;
        if w.stripe as u64 >= geo.seg_stripes {
            w.seg = None;
        }
        Ok(())
    }

    /// Waits for every stripe in flight (see [`Array::finish_oldest`]).
    fn finish_inflight(&self, w: &mut Writer) -> Result<()> {
        let mut res = Ok(());
        while !w.inflight.is_empty() {
            let r = self.finish_oldest(w);
            if res.is_ok() {
                res = r;
            }
        }
        res
    }

    /// Waits for the oldest stripe in flight, then publishes it: its records stop being
    /// pending and its segment counts it (and is sealed after its last stripe).
    fn finish_oldest(&self, w: &mut Writer) -> Result<()> {
        let Some(f) = w.inflight.pop_front() else {
            return Ok(());
        };
        let res = match f.handle.join() {
            Ok((r, img)) => {
                // No need to zero it: padding is covered by parity like any data, and
                // summaries are read back by their exact length.
                w.spare.push(img);
                r
            }
            Err(_) => Err(ArrayError::DataLoss("the stripe writer panicked".into())),
        };
        {
            let mut idx = self.inner.index.write();
            for e in &f.entries {
                if e.is_tombstone() {
                    continue;
                }
                if let Some(l) = idx.map.get_mut(&(e.obj, e.page)) {
                    if l.version == e.version {
                        l.pending = false;
                    }
                }
            }
            let info = &mut idx.segs[f.seg as usize];
            info.stripes = f.stripe + 1;
            if f.stripe as u64 + 1 >= self.inner.geo.seg_stripes {
                info.state = SegState::Sealed;
            }
        }
        res
    }

    fn alloc_segment(&self, w: &mut Writer, class: Class) -> Result<u32> {
        loop {
            let (free, pick) = {
                let idx = self.inner.index.read();
                let free = idx
                    .segs
                    .iter()
                    .filter(|s| s.state == SegState::Free)
                    .count() as u64;
                let pick = idx.segs.iter().position(|s| s.state == SegState::Free);
                (free, pick)
            };
            let allowed = match class {
                Class::User => free > self.inner.reserve,
                // Deletes may dip into the reserve (they make room), but leave the cleaner one.
                Class::Delete => free > 1,
                Class::Cleaner => free > 0,
            };
            if allowed {
                if let Some(seg) = pick {
                    let seq = self.next_seq();
                    let mut idx = self.inner.index.write();
                    idx.segs[seg] = SegInfo {
                        state: SegState::Open,
                        seq,
                        stripes: 0,
                        live_blocks: 0,
                        live_recs: 0,
                    };
                    return Ok(seg as u32);
                }
            }
            let gained =
                class != Class::Cleaner && self.clean_one(w)? && self.free_segments() > free;
            if !gained {
                return Err(ArrayError::NoSpace(format!(
                    "{} of {} segments free, nothing left to clean",
                    free, self.inner.geo.nsegs
                )));
            }
        }
    }

    fn free_segments(&self) -> u64 {
        let idx = self.inner.index.read();
        idx.segs
            .iter()
            .filter(|s| s.state == SegState::Free)
            .count() as u64
    }

    /// Writes a FREE marker as stripe 0 of `seg`, so that recovery ignores its old contents.
    fn write_marker(&self, w: &mut Writer, seg: u32) -> Result<()> {
        let geo = &self.inner.geo;
        let gs = geo.seg_stripes * seg as u64;
        let mut img = StripeImage::new(geo);
        let mut footer = Footer {
            uuid: self.inner.uuid,
            seg,
            stripe: 0,
            seg_seq: self.next_seq(),
            stripe_seq: self.next_seq(),
            nentries: 0,
            flags: FOOTER_FREE,
            summary_crc: 0,
        };
        let summary = format::encode_summary(&[], &mut footer);
        img.place(geo, gs, geo.stripe_data() - summary.len(), &summary);
        img.encode(geo, gs);
        let _ = w;
        self.inner.write_image(&img, gs)
    }

    // ---------------------------------------------------------------- cleaner

    /// Cleans the sealed segment with the least live data. Returns false if none is worth it.
    ///
    /// Several victims are cleaned together (as many as the free space can take), with one
    /// flush for all of them, so that arrays of small segments still gain space.
    fn clean_one(&self, w: &mut Writer) -> Result<bool> {
        let geo = self.inner.geo.clone();
        let victims: Vec<u32> = {
            let idx = self.inner.index.read();
            // (live blocks incl. summary entries, segment, stripes written), least live first.
            let mut cands: Vec<(u64, u32, u64)> = idx
                .segs
                .iter()
                .enumerate()
                .filter(|(i, s)| s.state == SegState::Sealed && Some(*i as u32) != w.seg)
                .map(|(i, s)| {
                    let ent = (s.live_recs * format::ENTRY_SIZE as u64).div_ceil(BLOCK as u64);
                    (s.live_blocks + ent, i as u32, s.stripes as u64)
                })
                .collect();
            cands.sort_unstable();
            let free = idx
                .segs
                .iter()
                .filter(|s| s.state == SegState::Free)
                .count() as u64;
            // Pick the prefix (least live first) that frees the most stripes, counting a
            // re-packed stripe as 85 % usable, within the free stripes the copies can go to.
            let per_stripe = (geo.stripe_blocks() as u64 * 17 / 20).max(1);
            let free_stripes = free * geo.seg_stripes;
            let (mut live_sum, mut stripes_sum) = (0u64, 0u64);
            let mut best = (0u64, 0usize);
            for (i, &(live, _, stripes)) in cands.iter().enumerate().take(256) {
                live_sum += live;
                stripes_sum += stripes;
                let need = live_sum.div_ceil(per_stripe);
                if need > free_stripes {
                    break;
                }
                let gain = stripes_sum.saturating_sub(need);
                if gain > best.0 {
                    best = (gain, i + 1);
                }
            }
            cands[..best.1].iter().map(|c| c.1).collect()
        };
        if victims.is_empty() {
            return Ok(false);
        }
        // If the copies run out of room part-way (the packing estimate was optimistic), the
        // victims already emptied are still freed below.
        let mut move_err = None;
        for &victim in &victims {
            if let Err(e) = self.move_live(w, victim) {
                move_err = Some(e);
                break;
            }
        }
        if let Some(e) = move_err.take() {
            if !matches!(e, ArrayError::NoSpace(_)) {
                return Err(e);
            }
        }
        // The moved data must be durable before the old copies are invalidated.
        self.flush_locked(w)?;
        let emptied: Vec<u32> = {
            let idx = self.inner.index.read();
            victims
                .iter()
                .copied()
                .filter(|&v| {
                    let si = &idx.segs[v as usize];
                    si.live_blocks == 0
                        && si.live_recs == 0
                        && !idx.tombs.values().any(|t| t.seg == v)
                })
                .collect()
        };
        for &victim in &emptied {
            self.write_marker(w, victim)?;
        }
        self.inner.sync_all()?;
        let mut idx = self.inner.index.write();
        for &victim in &emptied {
            idx.segs[victim as usize] = SegInfo {
                state: SegState::Free,
                seq: 0,
                stripes: 0,
                live_blocks: 0,
                live_recs: 0,
            };
        }
        self.inner
            .counters
            .segments_cleaned
            .fetch_add(emptied.len() as u64, Relaxed);
        Ok(!emptied.is_empty())
    }

    /// Appends the live records and needed tombstones of `victim` to the log.
    fn move_live(&self, w: &mut Writer, victim: u32) -> Result<()> {
        let stripes = self.inner.index.read().segs[victim as usize].stripes;
        for s in 0..stripes {
            let Some((_, ents)) = self.read_summary(victim, s) else {
                continue;
            };
            for e in ents {
                let key = (e.obj, e.page);
                if e.is_tombstone() {
                    let keep = {
                        let idx = self.inner.index.read();
                        match idx.tombs.get(&key) {
                            Some(t) if t.version == e.version && t.seg == victim => {
                                // Keep it while any other segment may hold an older version.
                                Some(idx.segs.iter().enumerate().any(|(i, si)| {
                                    i as u32 != victim
                                        && si.state != SegState::Free
                                        && si.seq < e.version
                                }))
                            }
                            _ => None,
                        }
                    };
                    match keep {
                        Some(true) => self.append_tomb(w, key, e.version, Class::Cleaner)?,
                        Some(false) => {
                            self.inner.index.write().tombs.remove(&key);
                        }
                        None => {}
                    }
                    continue;
                }
                let loc = {
                    let idx = self.inner.index.read();
                    idx.map
                        .get(&key)
                        .copied()
                        .filter(|l| l.version == e.version && l.seg == victim && l.stripe == s)
                };
                let Some(loc) = loc else { continue };
                let data = {
                    let idx = self.inner.index.read();
                    self.read_loc(&idx, &loc)?
                };
                self.append(w, key, e.version, &data, Class::Cleaner)?;
                self.inner
                    .counters
                    .cleaner_bytes
                    .fetch_add(data.len() as u64, Relaxed);
            }
        }
        Ok(())
    }

    /// Runs the cleaner until no segment is worth cleaning or `max` segments were cleaned.
    pub fn clean(&self, max: usize) -> Result<usize> {
        let mut w = self.inner.writer.lock();
        let mut n = 0;
        while n < max && self.clean_one(&mut w)? {
            n += 1;
        }
        Ok(n)
    }

    // ---------------------------------------------------------------- drives

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
        if let Ok(sb) = read_superblock_path(path) {
            if sb.uuid != self.inner.uuid {
                return Err(ArrayError::Drive {
                    path: path.to_path_buf(),
                    msg: format!(
                        "belongs to another array ({}): wipe it or pick another drive",
                        hex(&sb.uuid)
                    ),
                });
            }
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
                    SegState::Sealed => info.stripes as u64,
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

    // ---------------------------------------------------------------- scrub

    /// Verifies every record checksum and all parity of every written stripe; with `repair`,
    /// rewrites what it can fix from redundancy.
    pub fn scrub(&self, repair: bool, progress: &dyn Fn(u64, u64)) -> Result<ScrubReport> {
        let geo = self.inner.geo.clone();
        let total = geo.total_stripes();
        let mut rep = ScrubReport::default();
        let mut img = StripeImage::new(&geo);
        for gs in 0..total {
            let seg = (gs / geo.seg_stripes) as usize;
            let s = (gs % geo.seg_stripes) as u32;
            let mut w = self.inner.writer.lock();
            self.finish_inflight(&mut w)?;
            let info = self.inner.index.read().segs[seg];
            let written = match info.state {
                SegState::Free => false,
                _ => s < info.stripes,
            };
            if written {
                self.scrub_stripe(&mut img, gs, repair, &mut rep)?;
            }
            drop(w);
            progress(gs + 1, total);
        }
        if repair {
            self.inner.write_superblocks()?;
        }
        Ok(rep)
    }

    fn scrub_stripe(
        &self,
        img: &mut StripeImage,
        gs: u64,
        repair: bool,
        rep: &mut ScrubReport,
    ) -> Result<()> {
        let geo = &self.inner.geo;
        let lost: Vec<usize> = {
            let d = self.inner.drives.read();
            (0..geo.ndrives)
                .filter(|&i| !d.list[i].readable())
                .collect()
        };
        let lost = self.inner.read_image(img, gs, &lost)?;
        if !lost.is_empty() && !img.reconstruct_drives(geo, gs, &lost) {
            rep.unrepairable += 1;
            return Ok(());
        }
        rep.stripes_checked += 1;
        let sd = geo.stripe_data();
        let mut dirty: Vec<(usize, u64)> = Vec::new();
        // Summary.
        let mut tail = vec![0u8; sd.min(BLOCK * 64)];
        let tail_off = sd - tail.len();
        img.gather(geo, gs, tail_off, &mut tail);
        let max_blocks = geo.stripe_blocks() as u32;
        let entries = match format::decode_summary(&tail, max_blocks) {
            Ok((_, e)) => e,
            Err(_) => {
                // Try each drive as the culprit for the summary region.
                let found = self.scrub_fix(
                    img,
                    gs,
                    tail_off,
                    tail.len(),
                    &|b| format::decode_summary(b, max_blocks).is_ok(),
                    &mut dirty,
                );
                rep.checksum_errors += 1;
                if !found {
                    rep.unrepairable += 1;
                    return Ok(());
                }
                img.gather(geo, gs, tail_off, &mut tail);
                format::decode_summary(&tail, max_blocks)
                    .map(|(_, e)| e)
                    .unwrap_or_default()
            }
        };
        for e in entries.iter().filter(|e| !e.is_tombstone() && e.len > 0) {
            rep.records_checked += 1;
            let len = e.len as usize;
            let mut v = vec![0u8; len];
            img.gather(geo, gs, e.block as usize * BLOCK, &mut v);
            if crc32c::crc32c(&v) == e.crc {
                continue;
            }
            rep.checksum_errors += 1;
            let crc = e.crc;
            let ok = self.scrub_fix(
                img,
                gs,
                e.block as usize * BLOCK,
                len,
                &|b| crc32c::crc32c(&b[..len]) == crc,
                &mut dirty,
            );
            if !ok {
                rep.unrepairable += 1;
            }
        }
        // Parity (after data fixes).
        for (d, row) in img.parity_mismatches(geo, gs) {
            rep.parity_errors += 1;
            dirty.push((d, row));
        }
        if !dirty.is_empty() {
            img.encode(geo, gs);
        }
        dirty.sort_unstable();
        dirty.dedup();
        if repair && !dirty.is_empty() {
            let drives = self.inner.drives.read();
            for (d, row) in dirty {
                let drv = &drives.list[d];
                let Some(f) = drv.file.as_ref().filter(|_| drv.writable()) else {
                    continue;
                };
                let at = row as usize * geo.chunk;
                let mut ops = [IoOp::Write {
                    fd: f.fd(),
                    offset: geo.drive_offset(geo.global_row(gs, row), 0),
                    buf: &img.bufs[d][at..at + geo.chunk],
                }];
                if self.inner.engine.submit(&mut ops).iter().all(|r| r.is_ok()) {
                    rep.repaired += 1;
                    self.inner.counters.repaired.fetch_add(1, Relaxed);
                } else {
                    drv.counters.write_errors.fetch_add(1, Relaxed);
                }
            }
            drop(drives);
            self.inner.sync_all()?;
        }
        Ok(())
    }

    /// Finds the drive (or pair of drives, for two-parity levels) whose chunks in the range
    /// are wrong, fixes the image and records the chunks to rewrite. A bad drive may have
    /// corrupted several rows; all of its rows in the range are rebuilt together. Returns
    /// whether a fix was found.
    fn scrub_fix(
        &self,
        img: &mut StripeImage,
        gs: u64,
        off: usize,
        len: usize,
        check: &dyn Fn(&[u8]) -> bool,
        dirty: &mut Vec<(usize, u64)>,
    ) -> bool {
        let geo = &self.inner.geo;
        if geo.m == 0 {
            return false;
        }
        let mut rows: Vec<u64> = geo.pieces(off, len).iter().map(|p| p.row).collect();
        rows.dedup();
        for bad in culprit_sets(geo, gs, off, len) {
            let saved: Vec<(usize, u64, Vec<u8>)> = bad
                .iter()
                .flat_map(|&d| rows.iter().map(move |&r| (d, r)))
                .map(|(d, r)| {
                    let at = r as usize * geo.chunk;
                    (d, r, img.bufs[d][at..at + geo.chunk].to_vec())
                })
                .collect();
            let rebuilt = rows.iter().all(|&r| img.reconstruct_row(geo, gs, r, &bad));
            if rebuilt {
                let mut v = vec![0u8; len];
                img.gather(geo, gs, off, &mut v);
                if check(&v) {
                    let drv = self.inner.drives.read();
                    for (d, r, old) in &saved {
                        let at = *r as usize * geo.chunk;
                        if img.bufs[*d][at..at + geo.chunk] != old[..] {
                            drv.list[*d].counters.csum_errors.fetch_add(1, Relaxed);
                            dirty.push((*d, *r));
                        }
                    }
                    return true;
                }
            }
            for (d, r, old) in saved {
                let at = r as usize * geo.chunk;
                img.bufs[d][at..at + geo.chunk].copy_from_slice(&old);
            }
        }
        false
    }

    // ---------------------------------------------------------------- status

    pub fn status(&self) -> ArrayStatus {
        let geo = &self.inner.geo;
        let drives = self.inner.drives.read();
        let idx = self.inner.index.read();
        let seg_bytes = geo.seg_stripes * geo.stripe_data() as u64;
        let capacity = (geo.nsegs - self.inner.reserve) * seg_bytes;
        let used: u64 = idx.map.values().map(|l| l.len as u64).sum();
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

    /// Bytes written to drives (data, parity and padding) since open.
    pub fn drive_bytes_written(&self) -> u64 {
        self.inner.counters.drive_bytes_written.load(Relaxed)
    }
}

impl Inner {
    /// Writes a stripe image to every writable drive. A drive that fails the write is marked
    /// failed if the array can tolerate it; otherwise the error is returned.
    fn write_image(&self, img: &StripeImage, gs: u64) -> Result<()> {
        let all: Vec<usize> = (0..self.geo.ndrives).collect();
        self.write_image_to(img, gs, &all)
    }

    fn write_image_to(&self, img: &StripeImage, gs: u64, targets: &[usize]) -> Result<()> {
        self.io_images(Some((std::slice::from_ref(img), gs, targets)), None)
            .map(|_| ())
    }

    /// In one batch: writes consecutive stripe images (from global stripe `wgs0`) to the drives
    /// in their target list, and reads consecutive images (from `rgs0`) from every readable
    /// drive not in their skip list. Drives that fail a write are marked failed (an error if
    /// that exceeds the redundancy). Returns the drives that could not be read.
    #[allow(clippy::type_complexity)]
    fn io_images(
        &self,
        writes: Option<(&[StripeImage], u64, &[usize])>,
        reads: Option<(&mut [StripeImage], u64, &[usize])>,
    ) -> Result<Vec<usize>> {
        let geo = &self.geo;
        let mut lost: Vec<usize> = Vec::new();
        let failed_writes: Vec<usize> = {
            let drives = self.drives.read();
            let mut ops = Vec::new();
            // (drive, is_write)
            let mut which: Vec<(usize, bool)> = Vec::new();
            if let Some((imgs, gs0, targets)) = writes {
                for (j, img) in imgs.iter().enumerate() {
                    let offset = geo.drive_offset(geo.global_row(gs0 + j as u64, 0), 0);
                    for &i in targets {
                        let d = &drives.list[i];
                        if let (Some(f), true) = (&d.file, d.writable()) {
                            ops.push(IoOp::Write {
                                fd: f.fd(),
                                offset,
                                buf: &img.bufs[i][..],
                            });
                            which.push((i, true));
                        }
                    }
                }
            }
            let nwrites = ops.len();
            if let Some((imgs, gs0, skip)) = reads {
                lost.extend_from_slice(skip);
                for (j, img) in imgs.iter_mut().enumerate() {
                    let offset = geo.drive_offset(geo.global_row(gs0 + j as u64, 0), 0);
                    for (i, b) in img.bufs.iter_mut().enumerate() {
                        let d = &drives.list[i];
                        match &d.file {
                            Some(f) if d.readable() && !skip.contains(&i) => {
                                ops.push(IoOp::Read {
                                    fd: f.fd(),
                                    offset,
                                    buf: b.as_mut_slice(),
                                });
                                which.push((i, false));
                            }
                            _ => lost.push(i),
                        }
                    }
                }
            }
            let res = self.engine.submit(&mut ops);
            if nwrites > 0 {
                self.counters
                    .drive_bytes_written
                    .fetch_add((nwrites * geo.stripe_drive_bytes()) as u64, Relaxed);
                self.counters.stripes_written.fetch_add(1, Relaxed);
            }
            let mut bad = Vec::new();
            for (r, (i, is_write)) in res.iter().zip(which) {
                if r.is_ok() {
                    continue;
                }
                if is_write {
                    drives.list[i].counters.write_errors.fetch_add(1, Relaxed);
                    bad.push(i);
                } else {
                    drives.list[i].counters.read_errors.fetch_add(1, Relaxed);
                    lost.push(i);
                }
            }
            bad.sort_unstable();
            bad.dedup();
            bad
        };
        lost.sort_unstable();
        lost.dedup();
        if !failed_writes.is_empty() {
            self.drives_failed(&failed_writes)?;
        }
        Ok(lost)
    }

    fn drives_failed(&self, idxs: &[usize]) -> Result<()> {
        {
            let mut drives = self.drives.write();
            for &i in idxs {
                tracing::error!(
                    "drive {i} ({}) failed; continuing degraded",
                    drives.list[i].path.display()
                );
                drives.list[i].state = DriveState::Failed;
                drives.list[i].file = None;
            }
            drives.generation += 1;
            check_tolerance(&self.geo, &drives.list)?;
        }
        self.write_superblocks()
    }

    /// Reads every drive's part of a stripe into `img`, skipping `skip`. Returns the drives
    /// that could not be read (skip plus failures).
    fn read_image(&self, img: &mut StripeImage, gs: u64, skip: &[usize]) -> Result<Vec<usize>> {
        self.io_images(None, Some((std::slice::from_mut(img), gs, skip)))
    }

    fn sync_all(&self) -> Result<()> {
        let drives = self.drives.read();
        for d in &drives.list {
            if let (Some(f), true) = (&d.file, d.writable()) {
                f.sync().map_err(|e| io_err(&d.path, e))?;
            }
        }
        Ok(())
    }

    /// Writes both superblock copies to every writable drive.
    fn write_superblocks(&self) -> Result<()> {
        let drives = self.drives.read();
        let geo = &self.geo;
        let states: Vec<DriveState> = drives.list.iter().map(|d| d.state).collect();
        for (i, d) in drives.list.iter().enumerate() {
            let Some(f) = d.file.as_ref().filter(|_| d.writable()) else {
                continue;
            };
            let sb = Superblock {
                uuid: self.uuid,
                drive_index: i as u32,
                ndrives: geo.ndrives as u32,
                level: geo.level.number(),
                chunk: geo.chunk as u32,
                groups: geo.groups as u32,
                stripe_rows: geo.stripe_rows as u32,
                seg_stripes: geo.seg_stripes as u32,
                nsegs: geo.nsegs as u32,
                rows: geo.rows,
                generation: drives.generation,
                created: drives.created,
                states: states.clone(),
            };
            let mut buf = AlignedBuf::new(2 * SB_SIZE);
            let enc = sb.encode();
            buf[..SB_SIZE].copy_from_slice(&enc);
            buf[SB_SIZE..].copy_from_slice(&enc);
            let mut ops = [IoOp::Write {
                fd: f.fd(),
                offset: 0,
                buf: &buf[..],
            }];
            if let Some(Err(e)) = self.engine.submit(&mut ops).pop() {
                d.counters.write_errors.fetch_add(1, Relaxed);
                return Err(io_err(&d.path, e));
            }
            f.sync().map_err(|e| io_err(&d.path, e))?;
        }
        Ok(())
    }
}

/// The drives that could hold bad data in a range of stripe `gs`, as the sets to try as
/// culprits: each drive alone, and each pair where the level has two redundancy units.
fn culprit_sets(geo: &Geometry, gs: u64, off: usize, len: usize) -> Vec<Vec<usize>> {
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

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Reads the newest valid superblock copy of a drive.
pub fn read_superblock_path(path: &Path) -> Result<Superblock> {
    let f = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    let mut buf = vec![0u8; 2 * SB_SIZE];
    use std::os::unix::fs::FileExt;
    f.read_exact_at(&mut buf, 0).map_err(|e| io_err(path, e))?;
    let a = Superblock::decode(&buf[..SB_SIZE]);
    let b = Superblock::decode(&buf[SB_SIZE..]);
    match (a, b) {
        (Ok(x), Ok(y)) => Ok(if y.generation > x.generation { y } else { x }),
        (Ok(x), Err(_)) | (Err(_), Ok(x)) => Ok(x),
        (Err(e), Err(_)) => Err(e.into()),
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
