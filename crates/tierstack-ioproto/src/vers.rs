//! The mount's table of change counters, shared read-only with every client: what lets a
//! client keep the attributes and names it was told and answer `stat` itself, with no call,
//! while nothing they rest on has changed.
//!
//! The daemon owns one table per mount (four regions of [`REGION`] 64-bit counters in a sealed
//! memfd that a client can map only for reading). Four kinds of facts are counted, each in a
//! slot of its node (`ino` modulo [`REGION`]: the nodes of a tree made at once have numbers
//! that follow each other, so they do not share slots):
//! - [`attr_slot`]`(ino)`: anything `stat` shows of the node (size, times, mode, links...);
//! - [`perm_slot`]`(ino)`: a directory's permission for walking through it (mode, owner,
//!   ACLs);
//! - [`lost_slot`]`(dir)`: a name of the directory was removed, renamed away or replaced (what
//!   a name found there names rests on it);
//! - [`gained_slot`]`(dir)`: a name was added to the directory (what a name not found there
//!   rests on). Adding names does not disturb the names already found, so a directory being
//!   filled (an unpacked tree, `mdtest`'s create phase) keeps every walk through it.
//!
//! The daemon raises a slot **after** the change it counts is visible to its readers (or
//! within the lock under which it is made), and reads a slot **before** it reads the fact
//! (under that lock). So an answer carries, with each fact, the count read before it: a
//! client that later finds every count of an answer unchanged knows the facts still hold; a
//! count raised meanwhile (a change, or another node sharing the slot) only makes it ask
//! again. A counter never goes down, so no answer is ever mistaken for a later one.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::chan::{map_shared, memfd, ChanError};

/// Counters in one region of a table (a power of two).
pub const REGION: usize = 1 << 16;
/// Counters in a table.
pub const SLOTS: usize = 4 * REGION;
/// Bytes of a table.
pub const TABLE_BYTES: usize = SLOTS * 8;

fn slot_of(region: usize, ino: u64) -> u32 {
    (region * REGION + (ino as usize & (REGION - 1))) as u32
}

/// The slot counting changes of `ino`'s attributes.
pub fn attr_slot(ino: u64) -> u32 {
    slot_of(0, ino)
}

/// The slot counting changes of who may walk through directory `ino`.
pub fn perm_slot(ino: u64) -> u32 {
    slot_of(1, ino)
}

/// The slot counting names removed from (renamed away from, replaced in) directory `dir`.
pub fn lost_slot(dir: u64) -> u32 {
    slot_of(2, dir)
}

/// The slot counting names added to directory `dir`.
pub fn gained_slot(dir: u64) -> u32 {
    slot_of(3, dir)
}

/// One mapped table: the daemon's (writable) or a client's (read-only).
#[derive(Debug)]
pub struct Versions {
    map: *mut AtomicU64,
}

// SAFETY: the mapping is owned by the value and only reached through atomics.
unsafe impl Send for Versions {}
// SAFETY: as above: every access is an atomic operation on the shared words.
unsafe impl Sync for Versions {}

impl Versions {
    /// A new table (the daemon's), and a descriptor of it that clients can map only for
    /// reading (sealed against writable mappings and resizing).
    pub fn create() -> Result<(Versions, OwnedFd), ChanError> {
        let fd = memfd(c"tierstack-vers", TABLE_BYTES, libc::MFD_ALLOW_SEALING)?;
        let map = map_shared(fd.as_fd(), TABLE_BYTES, libc::PROT_READ | libc::PROT_WRITE)?;
        let v = Versions { map };
        // After our own writable mapping: later ones (a client's) can only read.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE;
        // SAFETY: fcntl on a descriptor we own, with an int argument.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok((v, fd))
    }

    /// Maps the table in `fd` for reading (a client), after checking its size.
    pub fn attach(fd: BorrowedFd<'_>) -> Result<Versions, ChanError> {
        let map = map_shared(fd, TABLE_BYTES, libc::PROT_READ)?;
        Ok(Versions { map })
    }

    fn word(&self, slot: u32) -> Option<&AtomicU64> {
        let i = slot as usize;
        // SAFETY: `i` is inside the mapping (checked), which is page-aligned (so 8-byte
        // aligned) and lives as long as `self`; the words are only used as atomics.
        (i < SLOTS).then(|| unsafe { &*self.map.add(i) })
    }

    /// The count of `slot` now (the daemon reads it before the fact it counts; 0 for a
    /// slot outside the table).
    pub fn get(&self, slot: u32) -> u64 {
        self.word(slot).map_or(0, |w| w.load(Ordering::SeqCst))
    }

    /// Whether `slot` still holds `count` (false for a slot outside the table).
    pub fn holds(&self, slot: u32, count: u64) -> bool {
        self.word(slot)
            .is_some_and(|w| w.load(Ordering::SeqCst) == count)
    }

    /// Raises `slot` (the daemon's table only: a client's mapping cannot be written).
    pub fn bump(&self, slot: u32) {
        if let Some(w) = self.word(slot) {
            w.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Versions {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no reference outlives `self`.
        unsafe { libc::munmap(self.map.cast(), TABLE_BYTES) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_client_sees_the_daemons_counts_and_cannot_write_them() {
        let (daemon, fd) = Versions::create().expect("table");
        let client = Versions::attach(fd.as_fd()).expect("attach");
        let s = lost_slot(7);
        let before = daemon.get(s);
        assert!(client.holds(s, before));
        daemon.bump(s);
        assert!(!client.holds(s, before));
        assert!(client.holds(s, before + 1));
        // A writable mapping of the sealed table is refused.
        // SAFETY: mmap of the descriptor, only to see it refused (unmapped if not).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                TABLE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p != libc::MAP_FAILED {
            // SAFETY: the mapping just made.
            unsafe { libc::munmap(p, TABLE_BYTES) };
        }
        assert_eq!(
            p,
            libc::MAP_FAILED,
            "a writable mapping of the table was allowed"
        );
        assert!(!client.holds(SLOTS as u32, 0));
    }

    #[test]
    fn the_four_kinds_of_fact_fall_in_different_slots() {
        let all = [attr_slot(5), perm_slot(5), lost_slot(5), gained_slot(5)];
        for (i, a) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|b| b != a));
        }
        // Nodes made one after another do not share slots.
        let many: std::collections::HashSet<u32> =
            (1000..1000 + REGION as u64).map(attr_slot).collect();
        assert_eq!(many.len(), REGION);
        assert!((gained_slot(u64::MAX) as usize) < SLOTS);
    }
}
