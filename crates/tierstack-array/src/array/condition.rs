//! Conditioning of file drives. An `O_DIRECT` write into a hole (or an unwritten extent) of a
//! file on ext4 costs the file system an allocation or a conversion, and writes to one file
//! then wait for each other: on this machine's disk 4 files take sequential 1.3 MiB writes
//! at 1.9 GB/s where they are holes and 3.2 GB/s where they were written before. A log-
//! structured array writes each segment of a fresh drive file once before it ever reuses
//! one, so the first pass over the drives runs at the slower rate.
//!
//! [`Array::condition_step`] writes zeros over one stripe of a free segment whose range is
//! still a hole on every drive: the bytes read the same as before (a hole reads as zeros),
//! only the file system's allocation is done ahead of need. It holds the log's writer lock
//! for the write, so no segment it checked as free can be taken meanwhile; it touches only
//! regular files opened `O_DIRECT` on disk-backed file systems (not tmpfs), only while every
//! drive is online, and only while each drive's file system keeps a tenth of its space free
//! afterwards. One call looks at a bounded number of stripes, so the writer lock is never
//! held for long, even over a large array whose free segments were all written before.

use std::os::unix::fs::FileTypeExt;
use std::sync::atomic::Ordering::Relaxed;

use crate::error::{ArrayError, Result};
use crate::format::DriveState;
use crate::io::{AlignedBuf, IoOp};

use super::{Array, SegState};

/// Whether `[off, off + len)` of the open file `fd` holds no data (a hole, or past its end).
fn is_hole(file: &std::fs::File, off: u64, len: u64) -> std::io::Result<bool> {
    match rustix::fs::seek(file, rustix::fs::SeekFrom::Data(off)) {
        Ok(data) => Ok(data >= off + len),
        // No data at or after `off`.
        Err(rustix::io::Errno::NXIO) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Whether the file system of `file` keeps a tenth of its space free after `bytes` more.
fn room_for(file: &std::fs::File, bytes: u64) -> bool {
    match rustix::fs::fstatvfs(file) {
        Ok(st) => {
            let total = st.f_blocks.saturating_mul(st.f_frsize);
            let free = st.f_bavail.saturating_mul(st.f_frsize);
            free.saturating_sub(bytes) > total / 10
        }
        Err(_) => false,
    }
}

/// Whether `file` is a regular file on a disk-backed file system: not a block device (no
/// file system allocates there), not on tmpfs or ramfs (zeros there would take memory, and
/// there is no allocation to save).
fn conditionable(file: &std::fs::File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let regular = file.metadata().is_ok_and(|m| {
        let t = m.file_type();
        t.is_file() && !t.is_block_device()
    });
    // `f_type`'s width differs between targets.
    #[allow(clippy::useless_conversion)]
    let disk = rustix::fs::fstatfs(file)
        .is_ok_and(|st| !matches!(i64::from(st.f_type), TMPFS_MAGIC | RAMFS_MAGIC));
    regular && disk
}

/// Stripes one [`Array::condition_step`] looks at before it lets go of the writer lock.
const SCAN: u64 = 256;

impl Array {
    /// Bytes written by [`Array::condition_step`] since the array was opened.
    pub fn conditioned_bytes(&self) -> u64 {
        self.inner.counters.conditioned_bytes.load(Relaxed)
    }

    /// Writes zeros over the next stripe of a free, never-written segment of every drive (see
    /// the module docs). Returns the bytes written (0: it only looked at up to [`SCAN`]
    /// stripes that needed nothing; call again), or None when there is nothing left to
    /// condition or it may not go on now (a drive not online or not opened `O_DIRECT`, a
    /// rebuild, a block device or tmpfs, a file system short of space, a read-only view). It
    /// remembers where it stopped; segments freed behind that point are not looked at again.
    pub fn condition_step(&self) -> Result<Option<u64>> {
        let inner = &self.inner;
        if inner.read_only || inner.rebuilding.load(Relaxed) {
            return Ok(None);
        }
        let geo = &inner.geo;
        // Appends and segment allocation wait while a stripe is conditioned.
        let _w = inner.writer.lock();
        let drives = inner.drives.read();
        let len = geo.stripe_drive_bytes() as u64;
        let mut files = Vec::with_capacity(drives.list.len());
        for d in &drives.list {
            match &d.file {
                Some(f) if d.state == DriveState::Online && f.direct && conditionable(&f.file) => {
                    if !room_for(&f.file, len) {
                        return Ok(None);
                    }
                    files.push((f, &d.path));
                }
                _ => return Ok(None),
            }
        }
        for _ in 0..SCAN {
            let gs = inner.conditioned.load(Relaxed);
            if gs >= geo.total_stripes() {
                return Ok(None);
            }
            let seg = gs / geo.seg_stripes;
            let next_seg = (seg + 1) * geo.seg_stripes;
            let free = inner
                .index
                .read()
                .segs
                .get(seg as usize)
                .is_some_and(|s| s.state == SegState::Free);
            if !free {
                // In use: its written stripes are allocated, the rest waits for its next life.
                inner.conditioned.store(next_seg, Relaxed);
                continue;
            }
            let offset = geo.drive_offset(geo.global_row(gs, 0), 0);
            let mut fresh = true;
            for (f, path) in &files {
                if !is_hole(&f.file, offset, len).map_err(|e| ArrayError::Drive {
                    path: path.to_path_buf(),
                    msg: e.to_string(),
                })? {
                    fresh = false;
                    break;
                }
            }
            if !fresh {
                // A segment the log wrote before (its stripes are allocated): skip all of it.
                inner.conditioned.store(next_seg, Relaxed);
                continue;
            }
            let zeros = AlignedBuf::new(len as usize);
            let mut ops: Vec<IoOp<'_>> = files
                .iter()
                .map(|(f, _)| IoOp::Write {
                    fd: f.fd(),
                    offset,
                    buf: &zeros[..len as usize],
                })
                .collect();
            for (r, (_, path)) in inner.engine.submit(&mut ops).into_iter().zip(&files) {
                r.map_err(|e| ArrayError::Drive {
                    path: path.to_path_buf(),
                    msg: format!("conditioning: {e}"),
                })?;
            }
            inner.conditioned.store(gs + 1, Relaxed);
            let bytes = len * files.len() as u64;
            inner.counters.conditioned_bytes.fetch_add(bytes, Relaxed);
            return Ok(Some(bytes));
        }
        Ok(Some(0))
    }
}
