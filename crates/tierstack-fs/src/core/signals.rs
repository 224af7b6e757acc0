//! The flags the daemon's threads raise for one another through the core: the drainer's
//! requests (`tierstack drain`, `--retry`, backpressure) and its wake-up, the stop (the
//! daemon stopping, `umount --force`), and the transport's state (io_uring, polling,
//! conditioning). Each is one atomic, read and written `Relaxed` as before; only
//! [`Core::wait_for_wake`] takes a lock (`wake_lock`, alone).

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::Core;

impl Core {
    // ------------------------------------------------------------------ the drainer's requests

    /// `tierstack drain` (and `umount`, a stop): asks for every dirty file to be drained now
    /// (`retry`: the quarantined rows are tried again first), and wakes the drainer. Takes
    /// `wake_lock` (through [`Core::wake_drainer`]).
    pub fn request_drain(&self, retry: bool) {
        if retry {
            self.retry.store(true, Relaxed);
        }
        self.force.store(true, Relaxed);
        self.wake_drainer();
    }

    /// Whether a drain of everything was asked for and not taken yet.
    pub fn drain_requested(&self) -> bool {
        self.force.load(Relaxed)
    }

    /// Takes (clears) the request of [`Core::request_drain`]; whether there was one.
    pub fn take_drain_request(&self) -> bool {
        self.force.swap(false, Relaxed)
    }

    /// Whether `drain --retry` asked for the quarantined rows to be tried again.
    pub fn retry_requested(&self) -> bool {
        self.retry.load(Relaxed)
    }

    /// Takes (clears) the request for a retry of the quarantined rows; whether there was one.
    pub fn take_retry_request(&self) -> bool {
        self.retry.swap(false, Relaxed)
    }

    /// Whether writers are waiting for space (backpressure: the drain is urgent).
    pub fn under_pressure(&self) -> bool {
        self.pressure.load(Relaxed)
    }

    /// The drainer's sleep: waits up to `d` for [`Core::wake_drainer`]. Holds `wake_lock`
    /// (no other lock) while it waits.
    pub fn wait_for_wake(&self, d: Duration) {
        let mut g = self.wake_lock.lock();
        self.wake_cv.wait_for(&mut g, d);
    }

    /// Notes the drainer's latest error, for `status`. Takes `last_error` (alone).
    pub fn set_last_error(&self, msg: String) {
        *self.last_error.lock() = Some(msg);
    }

    /// Notes `bytes` of file contents written to BACKING by the drainer.
    pub(super) fn note_drained(&self, bytes: u64) {
        self.drained_bytes.fetch_add(bytes, Relaxed);
    }

    /// Bytes of file contents written to BACKING by the drainer since the mount started.
    pub fn drained_bytes(&self) -> u64 {
        self.drained_bytes.load(Relaxed)
    }

    // ------------------------------------------------------------------ the stop

    /// The daemon is stopping: the background threads (journal committer, store loop,
    /// poller, conditioner, mount watcher) end.
    pub fn set_stopping(&self) {
        self.stopping.store(true, Relaxed);
    }

    /// Whether the daemon is stopping.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Relaxed)
    }

    /// `tierstack umount --force`, a second stop signal: stop without waiting for the drain
    /// (the journal keeps what is left for the next mount).
    pub fn force_stop(&self) {
        self.force_stop.store(true, Relaxed);
    }

    /// Whether the stop was forced ([`Core::force_stop`]).
    pub fn stop_forced(&self) -> bool {
        self.force_stop.load(Relaxed)
    }

    // ------------------------------------------------------------------ the transport

    /// Records whether the kernel's io_uring queues carry the mount's requests.
    pub fn set_uring(&self, serving: bool) {
        self.uring.store(serving, Relaxed);
    }

    /// Whether the kernel's io_uring queues carry the mount's requests (`crate::uring`):
    /// nothing comes through `/dev/fuse` worth polling for.
    pub fn serves_uring(&self) -> bool {
        self.uring.load(Relaxed)
    }

    /// Records whether a FUSE thread polls the device now (`crate::poll`).
    pub fn set_polling(&self, polling: bool) {
        self.polling.store(polling, Relaxed);
    }

    /// Counts `n` calls served to interception clients.
    pub fn add_io_calls(&self, n: u64) {
        self.io_calls.fetch_add(n, Relaxed);
    }

    /// An interception client connected (`true`) or went (`false`).
    pub fn io_client(&self, connected: bool) {
        if connected {
            self.io_clients.fetch_add(1, Relaxed);
        } else {
            self.io_clients.fetch_sub(1, Relaxed);
        }
    }

    /// Adds `ms` milliseconds to the time FUSE threads spent polling the device.
    pub fn add_polled_ms(&self, ms: u64) {
        self.polled_ms.fetch_add(ms, Relaxed);
    }

    /// Records whether the fast tier's conditioning has nothing left to do now
    /// (`mount::condition_when_idle`).
    pub fn set_conditioned(&self, done: bool) {
        self.conditioned.store(done, Relaxed);
    }
}
