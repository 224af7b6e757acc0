//! What the interception client keeps of the daemon's answers, so that `stat`, `lstat`, `fstat` and their
//! kin are answered here with no call while nothing they rest on has changed.
//!
//! Every answer the daemon sends with counts ([`Deps`], see [`crate::vers`]) is
//! kept: a path's walk (each directory's permission count, each name's count) and what the
//! last name named (a node, or nothing), and a node's attributes with their count. A kept
//! answer is used only while the mount's table ([`Versions`], mapped read-only) still holds
//! every count it rests on; a name's absence also for at most the time the daemon gave (the
//! kernel's negative-entry time: names other writers add to BACKING show within it). Any
//! change made through the mount, by this process, another, or the kernel's FUSE path,
//! raises a count first, so the next call asks the daemon again.
//!
//! One cache per connection: a new connection (after a fork, a credential change, a daemon
//! restart) starts empty, since what a walk may see depends on the caller's credentials
//! and a new daemon keeps a new table.

use std::collections::HashMap;

use crate::{Deps, Versions, WireAttr};

/// The most paths (and nodes) kept; past it the cache starts again empty.
const MOST: usize = 1 << 16;

/// What a path's last name named when it was walked.
#[derive(Debug, Clone, Copy)]
enum Named {
    /// A node.
    Node(u64),
    /// Nothing, until this time (ms on the monotonic clock).
    Absent(u64),
}

struct PathEntry {
    /// The walk's counts (its last name's included).
    deps: Vec<(u32, u64)>,
    named: Named,
}

struct NodeEntry {
    slot: u32,
    count: u64,
    attr: WireAttr,
}

/// The answers one connection keeps.
#[derive(Default)]
pub struct Cache {
    paths: HashMap<(u64, Vec<u8>), PathEntry>,
    nodes: HashMap<u64, NodeEntry>,
}

/// What the cache says of a path or node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Its attributes.
    Attr(WireAttr),
    /// It does not exist (ENOENT).
    Absent,
}

impl Cache {
    /// The attributes of `path` from node `base` (0: the mount's root), or its absence, if
    /// kept and still true; `follow`: a final symbolic link is followed (then only the
    /// daemon answers).
    pub fn path(
        &mut self,
        vers: &Versions,
        base: u64,
        path: &[u8],
        follow: bool,
        now_ms: u64,
    ) -> Option<Kept> {
        let key = (base, path.to_vec());
        let e = self.paths.get(&key)?;
        if !e.deps.iter().all(|&(s, c)| vers.holds(s, c)) {
            self.paths.remove(&key);
            return None;
        }
        match e.named {
            Named::Absent(until) if now_ms < until => Some(Kept::Absent),
            Named::Absent(_) => {
                self.paths.remove(&key);
                None
            }
            Named::Node(ino) => {
                let a = self.node(vers, ino)?;
                let link = a.mode & libc::S_IFMT == libc::S_IFLNK;
                (!(link && follow)).then_some(Kept::Attr(a))
            }
        }
    }

    /// The attributes of node `ino`, if kept and still true.
    pub fn node(&mut self, vers: &Versions, ino: u64) -> Option<WireAttr> {
        let n = self.nodes.get(&ino)?;
        if vers.holds(n.slot, n.count) {
            return Some(n.attr);
        }
        self.nodes.remove(&ino);
        None
    }

    /// Keeps a `stat`'s or an open's answer for `path`: the walk's counts, then the node's
    /// attribute count last.
    pub fn keep_attr(&mut self, base: u64, path: &[u8], attr: &WireAttr, deps: &Deps) {
        let Some((&(slot, count), walk)) = deps.as_slice().split_last() else {
            return;
        };
        if !deps.complete() {
            return;
        }
        self.room();
        self.paths.insert(
            (base, path.to_vec()),
            PathEntry {
                deps: walk.to_vec(),
                named: Named::Node(attr.ino),
            },
        );
        self.keep_node(attr, slot, count);
    }

    /// Keeps a node's attributes with their count (a `close`'s answer).
    pub fn keep_node_deps(&mut self, attr: &WireAttr, deps: &Deps) {
        if let (true, [(slot, count)]) = (deps.complete(), deps.as_slice()) {
            self.room();
            self.keep_node(attr, *slot, *count);
        }
    }

    fn keep_node(&mut self, attr: &WireAttr, slot: u32, count: u64) {
        self.nodes.insert(
            attr.ino,
            NodeEntry {
                slot,
                count,
                attr: *attr,
            },
        );
    }

    /// Keeps the absence of `path`'s last name, for at most `ttl_ms`.
    pub fn keep_absent(&mut self, base: u64, path: &[u8], deps: &Deps, ttl_ms: u32, now_ms: u64) {
        if !deps.complete() || deps.as_slice().is_empty() || ttl_ms == 0 {
            return;
        }
        self.room();
        self.paths.insert(
            (base, path.to_vec()),
            PathEntry {
                deps: deps.as_slice().to_vec(),
                named: Named::Absent(now_ms.saturating_add(u64::from(ttl_ms))),
            },
        );
    }

    fn room(&mut self) {
        if self.paths.len() >= MOST || self.nodes.len() >= MOST {
            self.paths.clear();
            self.nodes.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vers::{attr_slot, gained_slot, lost_slot, perm_slot};

    fn attr(ino: u64, mode: u32) -> WireAttr {
        WireAttr {
            ino,
            mode,
            size: 100,
            ..Default::default()
        }
    }

    fn deps(v: &Versions, slots: &[u32]) -> Deps {
        let mut d = Deps::default();
        for &s in slots {
            d.push(s, v.get(s));
        }
        d
    }

    #[test]
    fn a_kept_answer_serves_until_a_count_it_rests_on_moves() {
        let (v, _fd) = Versions::create().expect("table");
        let mut c = Cache::default();
        let a = attr(9, libc::S_IFREG | 0o644);
        let d = deps(&v, &[perm_slot(1), lost_slot(1), attr_slot(9)]);
        c.keep_attr(0, b"f", &a, &d);
        assert_eq!(c.path(&v, 0, b"f", true, 0), Some(Kept::Attr(a)));
        assert_eq!(c.node(&v, 9), Some(a));
        // A name added to the same directory changes nothing kept.
        v.bump(gained_slot(1));
        assert_eq!(c.path(&v, 0, b"f", false, 0), Some(Kept::Attr(a)));
        // The node's attributes changed: the path's walk holds, the node is asked again.
        v.bump(attr_slot(9));
        assert_eq!(c.path(&v, 0, b"f", true, 0), None);
        assert_eq!(c.node(&v, 9), None);
        // A close's answer brings the node back; the path's walk was kept.
        c.keep_node_deps(&a, &deps(&v, &[attr_slot(9)]));
        assert_eq!(c.path(&v, 0, b"f", true, 0), Some(Kept::Attr(a)));
        // The name was removed or renamed: the path is asked again.
        v.bump(lost_slot(1));
        assert_eq!(c.path(&v, 0, b"f", true, 0), None);
        // The directory's permission changed: a walk through it is asked again.
        c.keep_attr(
            0,
            b"f",
            &a,
            &deps(&v, &[perm_slot(1), lost_slot(1), attr_slot(9)]),
        );
        v.bump(perm_slot(1));
        assert_eq!(c.path(&v, 0, b"f", true, 0), None);
    }

    #[test]
    fn an_absence_is_kept_for_its_time_only_and_a_link_is_never_followed_here() {
        let (v, _fd) = Versions::create().expect("table");
        let mut c = Cache::default();
        c.keep_absent(0, b"nope", &deps(&v, &[gained_slot(1)]), 1000, 5000);
        assert_eq!(c.path(&v, 0, b"nope", true, 5999), Some(Kept::Absent));
        assert_eq!(c.path(&v, 0, b"nope", true, 6000), None);
        c.keep_absent(0, b"nope", &deps(&v, &[gained_slot(1)]), 1000, 5000);
        v.bump(gained_slot(1));
        assert_eq!(c.path(&v, 0, b"nope", true, 5001), None);
        let l = attr(4, libc::S_IFLNK | 0o777);
        c.keep_attr(0, b"l", &l, &deps(&v, &[lost_slot(1), attr_slot(4)]));
        assert_eq!(c.path(&v, 0, b"l", false, 0), Some(Kept::Attr(l)));
        assert_eq!(c.path(&v, 0, b"l", true, 0), None);
    }

    #[test]
    fn an_incomplete_walk_is_not_kept() {
        let (v, _fd) = Versions::create().expect("table");
        let mut c = Cache::default();
        let mut d = deps(&v, &[lost_slot(1), attr_slot(9)]);
        d.spoil();
        c.keep_attr(0, b"f", &attr(9, libc::S_IFREG), &d);
        assert_eq!(c.path(&v, 0, b"f", true, 0), None);
    }
}
