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
//!
//! Two more facts spare notifications the kernel does not need (a program under the client
//! that creates 5,000 files in a folder made through FUSE sent two per file):
//! - *names given under a directory*: the kernel holds an entry (positive or negative) under
//!   a directory only after an answer that named something there (LOOKUP, found or not,
//!   READDIRPLUS, and the changes made through FUSE: CREATE, MKNOD, MKDIR, SYMLINK, LINK,
//!   UNLINK, RMDIR, RENAME). Noted before the answer is made; an entry invalidation under a
//!   directory that no answer named anything under is not sent.
//! - *attributes dropped*: once an attribute invalidation of a node is sent, the kernel
//!   asks for them again before it uses them; until an answer carrying them is made, a
//!   second invalidation is not sent. An answer that began before the invalidation is
//!   ignored by the kernel (its attribute version is older), and one being made at the
//!   check makes the notification go out.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use parking_lot::Mutex;

/// The kernel's root node (FUSE_ROOT_ID): held from the mount to its end, with no lookup.
const ROOT: u64 = 1;

/// The kernel's lookup counts (see the module's comment).
#[derive(Default)]
pub struct KernelRefs {
    held: Mutex<Held>,
    /// FUSE answers being made (their entries not counted yet).
    making: AtomicU64,
}

/// What the kernel holds, as far as the answers it got tell.
#[derive(Default)]
struct Held {
    /// The lookup count of each node the kernel holds.
    counts: HashMap<u64, u64>,
    /// Directories an answer named something under (see the module's comment).
    named_under: HashSet<u64>,
    /// Nodes whose attributes were invalidated and not given since.
    attrs_dropped: HashSet<u64>,
}

impl Held {
    fn holds(&self, ino: u64) -> bool {
        ino == ROOT || self.counts.contains_key(&ino)
    }
}

/// A FUSE answer being made (see [`KernelRefs::begin`]); counts its entries when done.
pub struct Making<'a> {
    refs: &'a KernelRefs,
}

impl Making<'_> {
    /// The answer is made: each of `inos` gets one more count (an entry carries its node's
    /// attributes too), and `attrs` (a GETATTR's or SETATTR's node) was given its
    /// attributes.
    pub fn done(self, inos: impl IntoIterator<Item = u64>, attrs: Option<u64>) {
        let mut inos = inos.into_iter().peekable();
        if inos.peek().is_none() && attrs.is_none() {
            // Most answers give no entry: no lock taken for them.
            return;
        }
        let mut h = self.refs.held.lock();
        for ino in inos {
            *h.counts.entry(ino).or_default() += 1;
            h.attrs_dropped.remove(&ino);
        }
        if let Some(ino) = attrs {
            h.attrs_dropped.remove(&ino);
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
        self.begin_naming([])
    }

    /// As [`KernelRefs::begin`], for an answer that may name something under each of
    /// `dirs` (noted before the answer is made).
    pub fn begin_naming(&self, dirs: impl IntoIterator<Item = u64>) -> Making<'_> {
        let mut dirs = dirs.into_iter().peekable();
        if dirs.peek().is_some() {
            self.held.lock().named_under.extend(dirs);
        }
        self.making.fetch_add(1, SeqCst);
        Making { refs: self }
    }

    /// FORGET: the kernel drops `n` counts of `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        let mut h = self.held.lock();
        if let Some(v) = h.counts.get_mut(&ino) {
            *v = v.saturating_sub(n);
            if *v == 0 {
                h.counts.remove(&ino);
                h.named_under.remove(&ino);
                h.attrs_dropped.remove(&ino);
            }
        }
    }

    /// Whether the kernel may hold `ino` (its inode, or entries under it for a
    /// directory): the root always, every node while an answer is being made.
    pub fn may_hold(&self, ino: u64) -> bool {
        ino == ROOT || self.making.load(SeqCst) > 0 || self.held.lock().holds(ino)
    }

    /// Whether an invalidation of an entry under directory `parent` is to be sent: the
    /// kernel may hold the directory and an answer named something under it (or one is
    /// being made).
    pub fn inval_entry(&self, parent: u64) -> bool {
        let h = self.held.lock();
        if self.making.load(SeqCst) > 0 {
            return true;
        }
        h.holds(parent) && h.named_under.contains(&parent)
    }

    /// Whether an invalidation of `ino`'s attributes is to be sent: the kernel may hold the
    /// node, and it has been given its attributes since the last one sent (or an answer is
    /// being made). Noted as sent when it is to be.
    pub fn inval_attrs(&self, ino: u64) -> bool {
        let mut h = self.held.lock();
        let making = self.making.load(SeqCst) > 0;
        if !h.holds(ino) {
            // Held only if the answer being made gives it: sent, and not noted (a node the
            // kernel never holds would stay in the set).
            return making;
        }
        if !making && h.attrs_dropped.contains(&ino) {
            return false;
        }
        h.attrs_dropped.insert(ino);
        true
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
        k.begin().done([7, 7, 9], None);
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
    fn an_entry_is_invalidated_only_under_a_directory_an_answer_named_something_in() {
        let k = KernelRefs::default();
        // The kernel holds directory 7 (made through FUSE) but looked nothing up in it.
        k.begin_naming([ROOT]).done([7], None);
        assert!(!k.inval_entry(7));
        assert!(k.inval_entry(ROOT));
        // A lookup under it, found or not, is noted before its answer is made.
        let m = k.begin_naming([7]);
        assert!(k.inval_entry(7));
        m.done([], None);
        assert!(k.inval_entry(7));
        // Forgotten: nothing of it or under it is cached.
        k.forget(7, 1);
        assert!(!k.inval_entry(7));
        // While any answer is made, every invalidation goes out.
        k.begin_naming([ROOT]).done([8], None);
        let m = k.begin();
        assert!(k.inval_entry(8));
        drop(m);
        assert!(!k.inval_entry(8));
    }

    #[test]
    fn attributes_once_dropped_are_not_dropped_again_until_given() {
        let k = KernelRefs::default();
        assert!(!k.inval_attrs(7), "not held: nothing to drop");
        k.begin().done([7], None);
        assert!(k.inval_attrs(7));
        assert!(!k.inval_attrs(7), "the kernel has not asked for them since");
        // A GETATTR's answer gives them again.
        k.begin().done([], Some(7));
        assert!(k.inval_attrs(7));
        // So does an entry of it (LOOKUP, READDIRPLUS).
        k.begin().done([7], None);
        assert!(k.inval_attrs(7));
        // An answer being made at the check: sent, whatever was sent before.
        let m = k.begin();
        assert!(k.inval_attrs(7));
        drop(m);
        assert!(!k.inval_attrs(7));
        // A node the kernel may get from the answer being made: sent, not noted.
        let m = k.begin();
        assert!(k.inval_attrs(9));
        drop(m);
        assert!(!k.inval_attrs(9));
        k.forget(7, 2);
        k.begin().done([7], None);
        assert!(
            k.inval_attrs(7),
            "forgotten then looked up again: held afresh"
        );
    }

    #[test]
    fn every_node_counts_as_held_while_an_answer_is_made() {
        let k = KernelRefs::default();
        let m = k.begin();
        assert!(k.may_hold(42));
        drop(m);
        assert!(!k.may_hold(42));
        let m = k.begin();
        m.done([], None);
        assert!(!k.may_hold(42));
    }
}
