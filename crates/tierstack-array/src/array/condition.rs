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
//! regular files, only while every drive is online, and only while the file system keeps a
//! tenth of its space free afterwards.

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

impl Array {
    /// Bytes written by [`Array::condition_step`] since the array was opened.
    pub fn conditioned_bytes(&self) -> u64 {
        self.inner.counters.conditioned_bytes.load(Relaxed)
    }

    /// Writes zeros over the next stripe of a free, never-written segment of every drive (see
    /// the module docs); the bytes written, or None when there is nothing left to condition
    /// or it may not go on now (a drive not online, a rebuild, a block device, a file system
    /// short of space, a read-only view). Cheap to call again: it remembers where it stopped.
    pub fn condition_step(&self) -> Result<Option<u64>> {
        let inner = &self.inner;
        if inner.read_only || inner.rebuilding.load(Relaxed) {
            return Ok(None);
        }
        let geo = &inner.geo;
        // Appends and segment allocation wait while a stripe is conditioned.
        let _w = inner.writer.lock();
        loop {
            let gs = inner.conditioned.load(Relaxed);
            if gs >= geo.total_stripes() {
                return Ok(None);
            }
            let seg = gs / geo.seg_stripes;
            let free = inner
                .index
                .read()
                .segs
                .get(seg as usize)
                .is_some_and(|s| s.state == SegState::Free);
            if !free {
                // In use: its written stripes are allocated, the rest waits for its next life.
                inner
                    .conditioned
                    .store((seg + 1) * geo.seg_stripes, Relaxed);
                continue;
            }
            let drives = inner.drives.read();
            let offset = geo.drive_offset(geo.global_row(gs, 0), 0);
            let len = geo.stripe_drive_bytes() as u64;
            let mut fresh = true;
            for d in &drives.list {
                let Some(f) = &d.file else { return Ok(None) };
                let regular = f.file.metadata().is_ok_and(|m| {
                    let t = m.file_type();
                    t.is_file() && !t.is_block_device()
                });
                if d.state != DriveState::Online || !regular {
                    return Ok(None);
                }
                if !is_hole(&f.file, offset, len).map_err(|e| ArrayError::Drive {
                    path: d.path.clone(),
                    msg: e.to_string(),
                })? {
                    fresh = false;
                }
            }
            if !fresh {
                inner.conditioned.store(gs + 1, Relaxed);
                continue;
            }
            let Some(first) = drives.list.first().and_then(|d| d.file.as_ref()) else {
                return Ok(None);
            };
            if !room_for(&first.file, len * drives.list.len() as u64) {
                return Ok(None);
            }
            let zeros = AlignedBuf::new(len as usize);
            let mut ops: Vec<IoOp<'_>> = drives
                .list
                .iter()
                .filter_map(|d| d.file.as_ref())
                .map(|f| IoOp::Write {
                    fd: f.fd(),
                    offset,
                    buf: &zeros[..len as usize],
                })
                .collect();
            for (r, d) in inner.engine.submit(&mut ops).into_iter().zip(&drives.list) {
                r.map_err(|e| ArrayError::Drive {
                    path: d.path.clone(),
                    msg: format!("conditioning: {e}"),
                })?;
            }
            inner.conditioned.store(gs + 1, Relaxed);
            let bytes = len * drives.list.len() as u64;
            inner.counters.conditioned_bytes.fetch_add(bytes, Relaxed);
            return Ok(Some(bytes));
        }
    }
}
