//! Creating and opening an array: preparing and locking drives, reading superblocks, placing
//! each drive at the index its superblock names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::error::{ArrayError, Result};
use crate::format::{DriveState, FormatError, Superblock, FORMAT_VERSION, SB_MAGIC, SB_SIZE};
use crate::image::StripeImage;
use crate::io::{self, DriveFile};
use crate::layout::{Geometry, Level};

use super::{
    check_tolerance, hex, io_err, now_secs, Array, ArrayOptions, Counters, CreateParams, Drive,
    Drives, Index, Inner, SegInfo, SegState, Writer, MAX_INFLIGHT,
};

/// Takes the exclusive lock that makes this process the owner of a drive, waiting up to
/// `wait` for a previous owner to go away.
pub(super) fn lock_drive(df: &DriveFile, path: &Path, wait: Duration) -> Result<()> {
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
    let file = tierstack_common::file::open_or_create(path).map_err(|e| io_err(path, e))?;
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

/// What the superblock area of a drive holds.
#[derive(Debug)]
enum SbProbe {
    /// A copy (with a valid checksum) of an on-disk format version this code does not read.
    /// It wins over a valid copy: a newer tierstack wrote to the drive.
    Version(u32),
    /// The newest valid copy.
    Valid(Superblock),
    /// A copy carries the superblock magic but does not decode (a bad checksum or field): the
    /// drive was part of an array and its superblock is damaged. The error of the first such
    /// copy.
    Damaged(FormatError),
    /// No copy carries the superblock magic: no superblock. The first copy's error.
    Blank(FormatError),
}

/// Reads both superblock copies of a drive and says what they hold.
fn probe_superblock(path: &Path) -> Result<SbProbe> {
    let f = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    let mut buf = vec![0u8; 2 * SB_SIZE];
    use std::os::unix::fs::FileExt;
    f.read_exact_at(&mut buf, 0).map_err(|e| io_err(path, e))?;
    let copies = [&buf[..SB_SIZE], &buf[SB_SIZE..]];
    let decoded = copies.map(Superblock::decode);
    if let Some(v) = decoded.iter().find_map(|d| match d {
        Err(FormatError::Version(v)) => Some(*v),
        _ => None,
    }) {
        return Ok(SbProbe::Version(v));
    }
    let [a, b] = decoded;
    Ok(match (a, b) {
        (Ok(x), Ok(y)) => SbProbe::Valid(if y.generation > x.generation { y } else { x }),
        (Ok(x), Err(_)) | (Err(_), Ok(x)) => SbProbe::Valid(x),
        (Err(ea), Err(eb)) => {
            let magic = |c: &[u8]| &c[..SB_MAGIC.len()] == SB_MAGIC;
            if magic(copies[0]) {
                SbProbe::Damaged(ea)
            } else if magic(copies[1]) {
                SbProbe::Damaged(eb)
            } else {
                SbProbe::Blank(ea)
            }
        }
    })
}

/// Reads the newest valid superblock copy of a drive. A copy of another format version (with
/// a valid checksum) makes it fail with `FormatError::Version`, even beside a valid copy.
pub fn read_superblock_path(path: &Path) -> Result<Superblock> {
    match probe_superblock(path)? {
        SbProbe::Valid(sb) => Ok(sb),
        SbProbe::Version(v) => Err(FormatError::Version(v).into()),
        SbProbe::Damaged(e) | SbProbe::Blank(e) => Err(e.into()),
    }
}

/// The error for a drive whose superblock names format version `version`.
pub(super) fn version_error(path: &Path, version: u32) -> ArrayError {
    ArrayError::FormatVersion {
        path: path.to_path_buf(),
        version,
        supported: FORMAT_VERSION,
    }
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
        // A superblock that does not decode is refused as well: a newer tierstack's format, or
        // a damaged superblock (the drive may still hold an array's data).
        for p in paths {
            let msg = match probe_superblock(p) {
                Ok(SbProbe::Valid(sb)) => format!(
                    "already belongs to array {} (drive {}): wipe it or pick another drive",
                    hex(&sb.uuid),
                    sb.drive_index
                ),
                Ok(SbProbe::Version(v)) => format!(
                    "carries a tierstack superblock of on-disk format version {v} (this tierstack \
                     reads version {FORMAT_VERSION}): it may belong to an array of another \
                     tierstack version; wipe it or pick another drive"
                ),
                Ok(SbProbe::Damaged(e)) => format!(
                    "carries a damaged tierstack superblock ({e}): it may belong to an array; \
                     wipe it or pick another drive"
                ),
                // No superblock, or nothing to read yet (a new or short file).
                Ok(SbProbe::Blank(_)) | Err(_) => continue,
            };
            return Err(ArrayError::Drive {
                path: p.clone(),
                msg,
            });
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
        let reserve = 2 + geo.nsegs / 64;
        Array {
            handles: Arc::new(()),
            inner: Arc::new(Inner {
                engine: io::make_engine(opts.engine, opts.queue_depth),
                uuid,
                drives: RwLock::new(drives),
                writer: Mutex::new(Writer::new(StripeImage::new(&geo))),
                index: RwLock::new(Index {
                    map: HashMap::new(),
                    bytes: 0,
                    tombs: HashMap::new(),
                    segs,
                    damaged: Vec::new(),
                }),
                seq: AtomicU64::new(seq),
                counters: Counters::default(),
                inflight: opts.stripes_in_flight.clamp(1, MAX_INFLIGHT),
                reserve,
                rebuilding: AtomicBool::new(false),
                conditioned: AtomicU64::new(0),
                read_only: false,
                holds: Mutex::new(Vec::new()),
                geo,
            }),
        }
    }

    /// Opens an existing array from its drives (in any order; missing paths may be given and
    /// are treated as failed drives). Rebuilds the index from the segment summaries.
    pub fn open(paths: &[PathBuf], opts: &ArrayOptions) -> Result<Array> {
        // A drive of a newer format version stops the open: counted as failed, it would be
        // rebuilt over. A drive whose superblock is damaged (or missing, or unreadable) is
        // treated as failed: that is a fault of the drive, which redundancy covers.
        let mut sbs: Vec<(PathBuf, Option<Superblock>)> = Vec::new();
        for p in paths {
            let sb = match probe_superblock(p) {
                Ok(SbProbe::Valid(sb)) => Some(sb),
                Ok(SbProbe::Version(v)) => return Err(version_error(p, v)),
                Ok(SbProbe::Damaged(_) | SbProbe::Blank(_)) | Err(_) => None,
            };
            sbs.push((p.clone(), sb));
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
        // `rows` (the drives' rows when the array was created; no reader uses it) is kept as
        // the superblocks have it, so that later superblock writes repeat it.
        let geo = Geometry {
            rows: newest.rows,
            ..geo
        };
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
        arr.recover(opts.accept_damaged)?;
        Ok(arr)
    }
}
