//! The in-memory namespace: node kinds, nodes, the inode table and the attributes handed to
//! the FUSE layer; the name checks.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use tierstack_ioproto::vers::{self, Versions};

use super::{FileData, R};
pub use crate::attr::{Attr, Kind};

/// The device number kept in a special node's `target`.
pub fn rdev_of(target: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = target.len().min(8);
    b[..n].copy_from_slice(&target[..n]);
    u64::from_le_bytes(b)
}

/// The longest name in a directory, as on ext4.
pub const NAME_MAX: usize = 255;

/// ENAMETOOLONG for a name longer than [`NAME_MAX`].
pub fn check_name(name: &[u8]) -> R<()> {
    if name.len() > NAME_MAX {
        Err(libc::ENAMETOOLONG)
    } else {
        Ok(())
    }
}

/// One inode of the namespace, as the mount shows it.
pub struct Node {
    /// The node's type.
    pub(super) kind: Kind,
    /// Permission, set-ID and sticky bits (`0o7777`; the type is in `kind`).
    pub(super) mode: u32,
    /// Owner's user id.
    pub(super) uid: u32,
    /// Owner's group id.
    pub(super) gid: u32,
    /// Last access time, in nanoseconds since the epoch.
    pub(super) atime: i64,
    /// Last modification time, in nanoseconds since the epoch.
    pub(super) mtime: i64,
    /// Last status change time, in nanoseconds since the epoch.
    pub(super) ctime: i64,
    /// Size of directories and symlinks (files: `FileData::size`).
    pub(super) size: u64,
    /// A symlink's target, or a special node's device number (see [`rdev_of`]); empty for
    /// other kinds.
    pub(super) target: Vec<u8>,
    /// (parent, name) of every link; directories have one, the root none.
    pub(super) links: Vec<super::Link>,
    /// The object id keying a regular file's pages in the store (0 for other kinds).
    pub(super) obj: u64,
    /// Where this node is in BACKING as of the journal rows applied so far.
    pub(super) bpath: Option<Vec<u8>>,
    /// A directory's entries in BACKING have been listed into the namespace (done once, on
    /// first use).
    pub(super) loaded: bool,
    /// A directory's entries: name to inode number.
    pub(super) children: BTreeMap<Vec<u8>, u64>,
    /// Directories among `children` (a directory's link count is 2 + this).
    pub(super) subdirs: u32,
    /// A directory's link count in BACKING when its parent was listed: its link count until
    /// its own entries are listed (then 2 + `subdirs`), so that the kernel, which keeps
    /// what a lookup told it, does not learn 2 for a folder with subfolders (0: none known).
    pub(super) listed_nlink: u32,
    /// Extended attributes (user.*, trusted.*, security.*).
    pub(super) xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Open handles on the node (a file's data row is queued at the last close).
    pub(super) open: u32,
    /// Of those, the handles that may write (the kernel may hold dirty pages of the file
    /// while one is open: it writes them back at the last release).
    pub(super) open_w: u32,
    /// When a write through a handle that bypasses the kernel's page cache last changed the
    /// file (ns; 0: never since the daemon started). The kernel did not see it: times it
    /// writes back from its cache never set the mtime below this (`Core::setattr`).
    pub(super) direct_mtime: i64,
    /// When the open of the direct handle that last wrote the file reached the daemon (ns;
    /// 0: none, or the kernel has forgotten the inode since). The kernel's cached mtime then
    /// lies between a tick before it and `direct_first` (see
    /// [`Core::setattr`](super::Core::setattr)).
    pub(super) direct_opened: i64,
    /// When that handle's first write reached the daemon (ns).
    pub(super) direct_first: i64,
    /// A direct handle's release found the kernel's cached mtime stale; cleared once the
    /// entries were dropped with no handle left open, or the kernel forgot the inode.
    pub(super) kernel_stale: bool,
    /// A regular file's contents; `None` for other kinds.
    pub(super) data: Option<Arc<Mutex<FileData>>>,
}

impl Node {
    /// Whether `p` is this node's backing path, or its file's or its file's staging file.
    /// Takes the file's lock.
    pub(super) fn has_path(&self, p: &[u8]) -> bool {
        self.bpath.as_deref() == Some(p)
            || self.data.as_ref().is_some_and(|d| {
                let f = d.lock();
                f.bpath.as_deref() == Some(p) || f.staged.as_deref() == Some(p)
            })
    }
}

/// The change counts of a node's facts, read before them (see `tierstack_ioproto::vers`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    attr: u64,
    perm: u64,
}

impl Counts {
    /// Counts of the node's attributes and of who may walk through it.
    pub fn new(attr: u64, perm: u64) -> Counts {
        Counts { attr, perm }
    }

    /// The count of its attributes.
    pub fn attr(&self) -> u64 {
        self.attr
    }

    /// The count of who may walk through it.
    pub fn perm(&self) -> u64 {
        self.perm
    }
}

/// The namespace: every inode the mount knows, by inode number.
#[derive(Default)]
pub struct Ns {
    /// The nodes, by inode number.
    pub(super) nodes: HashMap<u64, Node>,
    /// The inode number the next new node gets.
    pub(super) next_ino: u64,
    /// Inode numbers below this are reserved in the database (`db::INO_NEXT`): taking one at
    /// or above it raises the reservation in the same transaction ([`Ns::reserve_ino`]).
    pub(super) ino_reserved: u64,
    /// The store object id the next new regular file gets.
    pub(super) next_obj: u64,
    /// What the mount last saw of each loaded directory's folder in BACKING (in memory
    /// only: after a restart the first look lists the folder again).
    pub(super) seen: HashMap<u64, Seen>,
    /// The change counters of the interception client: every name entered or removed
    /// raises the counts of its directory's names and attributes and of its node's
    /// attributes, under this lock.
    pub(super) vers: Option<Arc<Versions>>,
    /// The nodes by their paths in BACKING (see [`super::pindex`]): whoever gives a node a
    /// backing path or its file a staging file notes it here, under this lock.
    pub(super) paths: super::pindex::PathIndex,
}

/// When a loaded directory's folder in BACKING was last looked at, and its modification
/// and change times (ns) when it was last listed (see `Core::refresh_dir`).
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// When it was looked at (the mount's clock, ns since the epoch).
    pub(super) checked_ns: i64,
    /// Its times when last listed (None: not there then).
    pub(super) stamp: Option<(i64, i64)>,
}

/// How many inode numbers one raise of the database's reservation covers.
const INO_BLOCK: u64 = 4096;

impl Ns {
    /// The nodes with a path at or under `root` in BACKING (their backing path, their
    /// file's staging file) and the node `except` excluded, from the index: each checked by
    /// the caller against the node. The index is first swept of pairs no longer true when
    /// it holds more than twice as many as there are nodes. Takes each file's lock then
    /// (the caller holds none).
    pub(super) fn nodes_at_or_under(&mut self, root: &[u8], except: Option<u64>) -> Vec<u64> {
        if self.paths.len() > 2 * self.nodes.len() + 4096 {
            let nodes = &self.nodes;
            self.paths
                .retain(|p, i| nodes.get(&i).is_some_and(|n| n.has_path(p)));
        }
        let mut v = self.paths.nodes_under(root);
        v.retain(|i| Some(*i) != except);
        v
    }

    /// The reservation to record (`db::set_ino_next`) with nodes numbered below
    /// `next_ino` (the next number after the last one taken), if those pass the current one.
    pub(super) fn reserve_ino(&self, next_ino: u64) -> Option<u64> {
        (next_ino > self.ino_reserved).then(|| next_ino + INO_BLOCK)
    }
    /// Enters `ino` (already in `nodes`) as `name` in directory `parent`.
    pub(super) fn insert_child(&mut self, parent: u64, name: Vec<u8>, ino: u64) {
        let is_dir = self.nodes.get(&ino).is_some_and(|n| n.kind == Kind::Dir);
        let mut replaced = None;
        if let Some(p) = self.nodes.get_mut(&parent) {
            match p.children.insert(name, ino) {
                None if is_dir => p.subdirs += 1,
                None => {}
                Some(old) => replaced = Some(old).filter(|&o| o != ino),
            }
        }
        self.names_changed(parent, true, replaced);
        // Its link count or change time changes with a new name (a link, a rename).
        self.node_changed(ino);
    }

    /// Removes `name` from directory `parent`.
    pub(super) fn remove_child(&mut self, parent: u64, name: &[u8]) {
        let Some(ino) = self
            .nodes
            .get_mut(&parent)
            .and_then(|p| p.children.remove(name))
        else {
            return;
        };
        self.names_changed(parent, false, Some(ino));
        let is_dir = self.nodes.get(&ino).is_some_and(|n| n.kind == Kind::Dir);
        if let Some(p) = self.nodes.get_mut(&parent) {
            if is_dir {
                p.subdirs = p.subdirs.saturating_sub(1);
            }
        }
    }

    /// Raises the counts of the names `parent` gained, of those it lost with the node
    /// `lost` had there (whose link count and change time change too), and of `parent`'s
    /// attributes (its times and link count change with its entries). Called under the
    /// namespace lock, within the operation that makes the change.
    fn names_changed(&self, parent: u64, gained: bool, lost: Option<u64>) {
        if let Some(v) = &self.vers {
            if gained {
                v.bump(vers::gained_slot(parent));
            }
            if let Some(node) = lost {
                v.bump(vers::lost_slot(parent));
                v.bump(vers::attr_slot(node));
            }
            v.bump(vers::attr_slot(parent));
        }
    }

    /// Raises the count of `ino`'s attributes.
    fn node_changed(&self, ino: u64) {
        if let Some(v) = &self.vers {
            v.bump(vers::attr_slot(ino));
        }
    }

    /// The inode of `name` in directory `parent`, if there is one.
    pub(super) fn child(&self, parent: u64, name: &[u8]) -> Option<u64> {
        self.nodes
            .get(&parent)
            .and_then(|p| p.children.get(name))
            .copied()
    }
}
