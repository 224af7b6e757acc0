//! What the core shows the daemon: the status figures (`mount::status_of`), the last
//! error, and the handles the daemon works with directly (the array, the store, BACKING,
//! the operation counters).

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

use tierstack_array::Array;
use tierstack_store::TieredStore;

use crate::backing::Backing;
use crate::opstats::OpStats;

use super::Core;

/// The core's counters and flags at one look (each read on its own, `Relaxed`: not one
/// atomic snapshot, as `status` always read them). Plain data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// Bytes of file pages held in the store.
    pub held_bytes: u64,
    /// Above this many held bytes writers wait for the drainer.
    pub limit_bytes: u64,
    /// Bytes of dirty pages.
    pub dirty_bytes: u64,
    /// Bytes of file contents the drainer wrote to BACKING since the mount started.
    pub drained_bytes: u64,
    /// Writers are waiting for space.
    pub backpressure: bool,
    /// `drain --retry` was asked for and the drainer has not taken it yet.
    pub retry_pending: bool,
    /// The fast tier's conditioning has nothing left to do now.
    pub conditioned: bool,
    /// A FUSE thread polls the device now.
    pub polling: bool,
    /// Milliseconds FUSE threads spent polling the device since the mount started.
    pub polled_ms: u64,
    /// Calls served to interception clients (`crate::io`).
    pub io_calls: u64,
    /// Interception clients connected now.
    pub io_clients: u64,
    /// The kernel's io_uring queues carry the mount's requests.
    pub uring: bool,
    /// `fsync`s made durable in the intent log.
    pub fsync_logged: u64,
    /// `fsync`s made durable by a full flush.
    pub fsync_flushed: u64,
    /// Intent log records this mount replayed at its start.
    pub intent_replayed: u64,
}

impl Core {
    /// The status figures (no lock taken).
    pub fn figures(&self) -> Figures {
        Figures {
            held_bytes: self.held.load(Relaxed),
            limit_bytes: self.limit,
            dirty_bytes: self.dirty_bytes.load(Relaxed),
            drained_bytes: self.drained_bytes.load(Relaxed),
            backpressure: self.pressure.load(Relaxed),
            retry_pending: self.retry.load(Relaxed),
            conditioned: self.conditioned.load(Relaxed),
            polling: self.polling.load(Relaxed),
            polled_ms: self.polled_ms.load(Relaxed),
            io_calls: self.io_calls.load(Relaxed),
            io_clients: self.io_clients.load(Relaxed),
            uring: self.uring.load(Relaxed),
            fsync_logged: self.fsync_logged.load(Relaxed),
            fsync_flushed: self.fsync_flushed.load(Relaxed),
            intent_replayed: self.intent_replayed.load(Relaxed),
        }
    }

    /// The last error the drainer met, if any. Takes `last_error` (alone).
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    /// The array under the store (status, conditioning).
    pub fn array(&self) -> &Array {
        &self.array
    }

    /// The tiered store holding file pages (status, flush at the stop).
    pub fn store(&self) -> &TieredStore {
        &self.store
    }

    /// BACKING held open: every access to it goes through these directory handles.
    pub fn backing(&self) -> &Backing {
        &self.bk
    }

    /// The backing directory's path (for `statfs` and messages).
    pub fn backing_path(&self) -> &Path {
        &self.backing
    }

    /// Which nodes the kernel may hold (see [`crate::kernel_refs`]).
    pub fn kernel_refs(&self) -> &crate::kernel_refs::KernelRefs {
        &self.kernel_refs
    }

    /// Counts and latencies of the FUSE operations served.
    pub fn ops(&self) -> &OpStats {
        &self.ops
    }
}
