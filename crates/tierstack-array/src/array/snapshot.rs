//! Snapshots for forked children: a read-only view of the array as it is now, and holds that
//! keep the segments such a view reads from in place.
//!
//! A view shares the drives' files (duplicated descriptors) and copies the index: it reads
//! each key's value where the array had it when the view was made. The array itself goes on
//! appending to the log (a sealed stripe is never written again), so those values stay where
//! they are as long as the cleaner frees no segment. A hold is a file descriptor: while
//! another open file description of the same file carries a shared `flock` (the child's, and
//! its own children's, which inherit it), the cleaner does not run; once the lock is gone
//! (every process holding it has exited or exec'd), the hold is dropped.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::error::{ArrayError, Result};
use crate::image::StripeImage;
use crate::io::{DriveFile, PsyncEngine};

use super::{Array, Counters, Drive, DriveCounters, Drives, Index, Inner, Writer};

impl Array {
    /// A read-only view of the array's current contents. Call it after [`Array::flush`] with
    /// no writer at work (the view sees what is on the drives: values still in the open stripe
    /// are not in it). The view uses plain `pread` (no ring shared with this array) and never
    /// writes, flushes, cleans or repairs.
    pub fn read_only_view(&self) -> Result<Array> {
        let inner = &self.inner;
        let drives = inner.drives.read();
        let mut list = Vec::with_capacity(drives.list.len());
        for d in &drives.list {
            let file = match &d.file {
                Some(f) => Some(DriveFile {
                    file: f.file.try_clone().map_err(|e| super::io_err(&d.path, e))?,
                    direct: f.direct,
                }),
                None => None,
            };
            list.push(Drive {
                path: d.path.clone(),
                file,
                state: d.state,
                counters: Arc::new(DriveCounters::default()),
            });
        }
        let idx = inner.index.read();
        Ok(Array {
            handles: Arc::new(()),
            inner: Arc::new(Inner {
                geo: inner.geo.clone(),
                uuid: inner.uuid,
                engine: Box::new(PsyncEngine),
                drives: RwLock::new(Drives {
                    list,
                    generation: drives.generation,
                    created: drives.created,
                    rebuild_done: 0,
                    rebuild_total: 0,
                }),
                writer: Mutex::new(Writer::new(StripeImage::new(&inner.geo))),
                index: RwLock::new(Index {
                    map: idx.map.clone(),
                    bytes: idx.bytes,
                    tombs: idx.tombs.clone(),
                    segs: idx.segs.clone(),
                    damaged: idx.damaged.clone(),
                }),
                seq: AtomicU64::new(inner.seq.load(Relaxed)),
                counters: Counters::default(),
                inflight: 1,
                reserve: inner.reserve,
                rebuilding: AtomicBool::new(false),
                conditioned: AtomicU64::new(0),
                read_only: true,
                holds: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Whether this is a read-only view.
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// Keeps every segment in place (the cleaner does not run) while another open file
    /// description of `fd`'s file holds a shared `flock` on it.
    pub fn hold_segments(&self, fd: OwnedFd) {
        self.inner.holds.lock().push(fd);
    }

    /// Whether a hold is still held; drops those that are not.
    pub(super) fn segments_held(&self) -> bool {
        use rustix::fs::{flock, FlockOperation};
        let mut holds = self.inner.holds.lock();
        holds.retain(|fd| {
            if flock(fd, FlockOperation::NonBlockingLockExclusive).is_ok() {
                let _ = flock(fd, FlockOperation::Unlock);
                false
            } else {
                true
            }
        });
        !holds.is_empty()
    }

    pub(super) fn refuse_if_read_only(&self) -> Result<()> {
        if self.inner.read_only {
            return Err(ArrayError::Config(
                "this is a read-only snapshot of an array: write to the array itself".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_view_keeps_its_values_while_held() {
        let t = tempfile::tempdir().expect("tempdir");
        let a = crate::array::test_raid5(t.path(), 128 << 20);
        for k in 0..200u64 {
            a.put((1, k), &vec![k as u8; 64 << 10]).expect("put");
        }
        a.flush().expect("flush");
        let view = a.read_only_view().expect("view");
        assert!(view.is_read_only());
        assert!(view.put((1, 0), b"x").is_err());
        // A hold: a shared lock on one open file description, tested through another.
        let f = tempfile::tempfile_in(t.path()).expect("tmp");
        let other = std::fs::File::open(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&f)
        ))
        .expect("reopen");
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockShared).expect("lock");
        a.hold_segments(other.into());
        // The array rewrites and deletes everything, cleaning as it likes.
        for round in 0..3u8 {
            for k in 0..200u64 {
                a.put((1, k), &vec![round.wrapping_add(100); 64 << 10])
                    .expect("rewrite");
            }
            a.flush().expect("flush");
            assert_eq!(a.clean(64).expect("clean"), 0, "held: nothing cleaned");
        }
        for k in 0..200u64 {
            let v = view.get((1, k)).expect("get").expect("present");
            assert!(
                v.iter().all(|&b| b == k as u8),
                "key {k} changed under the view"
            );
        }
        assert!(a.get((1, 5)).expect("get").is_some_and(|v| v[0] == 102));
        // The lock goes: the cleaner runs again.
        drop(f);
        assert!(a.clean(64).expect("clean") > 0);
    }
}
