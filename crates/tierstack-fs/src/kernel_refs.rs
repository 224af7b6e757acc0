//! Which nodes the kernel may hold: the FUSE lookup count of each node, as the protocol
//! keeps it (every answer that gives the kernel an entry adds one: LOOKUP, CREATE, MKDIR,
//! MKNOD, SYMLINK, LINK and each READDIRPLUS entry but `.` and `..`; FORGET takes away what
//! it names). A node the kernel holds no count of is not in its inode cache, and a directory
//! it holds none of has no entries cached under it (a child's entry pins its parent).
//!
//! The interception client's server asks before each cache invalidation it would send
//! (`crate::io`): a program under the client that makes a tree the kernel never looked at
//! (`tar` into a fresh folder) then costs no notification at all, where each used to be a
//! write to `/dev/fuse`. While any FUSE answer is being made, every node counts as held
//! (its count is added once the answer is made, just before the kernel gets it), so a
//! lookup racing with a client's change is never missed: the notification is sent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use parking_lot::Mutex;

/// The kernel's root node (FUSE_ROOT_ID): held from the mount to its end, with no lookup.
const ROOT: u64 = 1;

/// The kernel's lookup counts (see the module's comment).
#[derive(Default)]
pub struct KernelRefs {
    counts: Mutex<HashMap<u64, u64>>,
    /// FUSE answers being made (their entries not counted yet).
    making: AtomicU64,
}

/// A FUSE answer being made (see [`KernelRefs::begin`]); counts its entries when done.
pub struct Making<'a> {
    refs: &'a KernelRefs,
}

impl Making<'_> {
    /// The answer is made: each of `inos` gets one more count.
    pub fn done(self, inos: impl IntoIterator<Item = u64>) {
        let mut inos = inos.into_iter().peekable();
        if inos.peek().is_none() {
            // Most answers give no entry: no lock taken for them.
            return;
        }
        let mut c = self.refs.counts.lock();
        for ino in inos {
            *c.entry(ino).or_default() += 1;
        }
    }
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        self.refs.making.fetch_sub(1, SeqCst);
    }
}

impl KernelRefs {
    /// A FUSE answer starts being made: until [`Making::done`] (or the drop of what this
    /// returns), every node counts as held.
    pub fn begin(&self) -> Making<'_> {
        self.making.fetch_add(1, SeqCst);
        Making { refs: self }
    }

    /// FORGET: the kernel drops `n` counts of `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        let mut c = self.counts.lock();
        if let Some(v) = c.get_mut(&ino) {
            *v = v.saturating_sub(n);
            if *v == 0 {
                c.remove(&ino);
            }
        }
    }

    /// Whether the kernel may hold `ino` (its inode, or entries under it for a
    /// directory): the root always, every node while an answer is being made.
    pub fn may_hold(&self, ino: u64) -> bool {
        ino == ROOT || self.making.load(SeqCst) > 0 || self.counts.lock().contains_key(&ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_held_from_its_answer_until_forget_takes_every_count() {
        let k = KernelRefs::default();
        assert!(!k.may_hold(7));
        assert!(k.may_hold(ROOT));
        k.begin().done([7, 7, 9]);
        assert!(k.may_hold(7) && k.may_hold(9));
        k.forget(7, 1);
        assert!(k.may_hold(7));
        k.forget(7, 1);
        assert!(!k.may_hold(7));
        k.forget(9, 5);
        assert!(!k.may_hold(9));
        // Forgetting what was never counted changes nothing.
        k.forget(11, 1);
        assert!(!k.may_hold(11));
    }

    #[test]
    fn every_node_counts_as_held_while_an_answer_is_made() {
        let k = KernelRefs::default();
        let m = k.begin();
        assert!(k.may_hold(42));
        drop(m);
        assert!(!k.may_hold(42));
        let m = k.begin();
        m.done([]);
        assert!(!k.may_hold(42));
    }
}
