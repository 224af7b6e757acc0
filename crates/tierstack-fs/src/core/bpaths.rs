//! The namespace as the drainer's namespace rows need it: what a node must look like in
//! BACKING (owner, mode, times, target, extended attributes), where each node is in BACKING
//! as of the rows applied so far (its backing path, its staging file), and the bases pinned
//! into the fast tier before BACKING's copy goes.
//!
//! Lock order as everywhere in the core: `ns` -> a file's lock -> `db`. Methods that
//! write the journal while they hold `ns` say so.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::backing::{Attrs, Backing};
use crate::db;

use super::node::Node;
use super::{join_rel, under, Core, FileData, Kind};

/// The nodes whose base may lie at a path BACKING is about to lose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holders {
    /// Any node but the one given: a folder's path (every file under it) or a rename's
    /// target (all but the node the rename moves there).
    AllBut(Option<u64>),
    /// Only this node: the path is the name of a file (not a folder) that this node's
    /// journal row removes. The drain keeps one node per BACKING file name, and a row names
    /// the node at its path as of that row (renames over it applied before), so no other
    /// node's base lies there; one look instead of a walk of every node, which per row made
    /// removing n drained files cost n times the namespace, under its lock.
    Only(u64),
}

impl Core {
    /// Whether node `ino` is gone from the namespace or has no name left. Takes `ns`.
    pub fn unlinked(&self, ino: u64) -> bool {
        self.ns
            .lock()
            .nodes
            .get(&ino)
            .is_none_or(|n| n.links.is_empty())
    }

    /// Where file `ino`'s staging file is in BACKING (None: it has none, or it is gone).
    /// Takes `ns`, then the file's lock.
    pub fn staged_path(&self, ino: u64) -> Option<Vec<u8>> {
        let d = self.ns.lock().nodes.get(&ino)?.data.clone()?;
        let f = d.lock();
        f.staged.clone()
    }

    /// The store object that holds node `ino`'s pages (None when it is gone), for tests
    /// that put a page into the store as a crash would leave it. Takes `ns`.
    #[cfg(test)]
    pub(crate) fn object_of(&self, ino: u64) -> Option<u64> {
        self.ns.lock().nodes.get(&ino).map(|n| n.obj)
    }

    /// Node `ino`'s kind, the owner, mode and times BACKING must show, and its target (a
    /// symlink's, or a special node's device number); None when it is gone. Takes `ns`.
    pub fn backing_attrs(&self, ino: u64) -> Option<(Kind, Attrs, Vec<u8>)> {
        let ns = self.ns.lock();
        let n = ns.nodes.get(&ino)?;
        Some((
            n.kind,
            Attrs {
                mode: n.mode,
                uid: n.uid,
                gid: n.gid,
                atime: n.atime,
                mtime: n.mtime,
            },
            n.target.clone(),
        ))
    }

    /// Extended attribute `name` of node `ino`: None when the node is gone, `Some(None)`
    /// when it has no such attribute. Takes `ns`.
    pub fn node_xattr(&self, ino: u64, name: &[u8]) -> Option<Option<Vec<u8>>> {
        let ns = self.ns.lock();
        ns.nodes.get(&ino).map(|n| n.xattrs.get(name).cloned())
    }

    /// Every extended attribute of node `ino` (none when it is gone). Takes `ns`.
    pub fn node_xattrs(&self, ino: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
        self.ns
            .lock()
            .nodes
            .get(&ino)
            .map(|n| n.xattrs.clone())
            .unwrap_or_default()
    }

    /// Before `path` is removed or replaced in BACKING: every file still in the namespace
    /// (another name, an open handle) whose base lies there (its name in BACKING or its
    /// staging file) gets the base's data copied into the fast tier ([`Core::pin_base`];
    /// one added to `pinned` for each), and that is made durable (store and journal) before
    /// the caller touches BACKING. `except`: the node a rename moves there (its base is at
    /// its old path). Takes `ns` (with each file's lock inside it) to find them, lets it go,
    /// then each file's lock (with `db` inside it), then `db`.
    pub fn pin_bases_under(
        &self,
        path: &[u8],
        holders: Holders,
        pinned: &AtomicU64,
    ) -> io::Result<()> {
        let victims: Vec<(u64, u64, Arc<Mutex<FileData>>)> = {
            let mut ns = self.ns.lock();
            let inos = match holders {
                Holders::Only(i) => vec![i],
                Holders::AllBut(except) => ns.nodes_at_or_under(path, except),
            };
            let hit = |i: u64, n: &Node| {
                let d = n.data.as_ref()?;
                let f = d.lock();
                let bp = f.base_path()?;
                (f.has_base && under(bp, path)).then(|| (i, n.obj, d.clone()))
            };
            inos.into_iter()
                .filter_map(|i| ns.nodes.get(&i).and_then(|n| hit(i, n)))
                .collect()
        };
        if victims.is_empty() {
            return Ok(());
        }
        for (ino, obj, d) in &victims {
            let mut f = d.lock();
            self.pin_base(*ino, *obj, &mut f)
                .map_err(|e| io::Error::other(e.to_string()))?;
            pinned.fetch_add(1, Relaxed);
        }
        self.store
            .flush()
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.db
            .lock()
            .make_durable()
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// The invariant of the index of paths ([`super::pindex`]), checked: each path a node
    /// has (its backing path, its file's, its file's staging file) that the index lacks, as
    /// "inode N: path". Empty when it holds. For tests; walks every node under `ns`.
    pub fn path_index_misses(&self) -> Vec<String> {
        let ns = self.ns.lock();
        let mut out = Vec::new();
        for (i, n) in &ns.nodes {
            let mut have = vec![n.bpath.clone()];
            if let Some(d) = &n.data {
                let f = d.lock();
                have.push(f.bpath.clone());
                have.push(f.staged.clone());
            }
            for p in have.into_iter().flatten() {
                if !ns.paths.under(&p).contains(&(p.clone(), *i)) {
                    out.push(format!("inode {i}: {}", String::from_utf8_lossy(&p)));
                }
            }
        }
        out
    }

    /// Before `path` is removed from BACKING by an unlink row of node `ino`: if the node's
    /// base lies there and another of its names in the namespace names the same file in
    /// BACKING (a hard link an earlier row made there: `git` writes each object under a
    /// temporary name, links it to its own name and removes the first), its base moves to
    /// that name and nothing has to be pinned (a pin copies the file back into the fast
    /// tier, makes both durable and drains the file again). Whether it moved. Takes `ns`
    /// (with the file's lock inside it), lets it go, looks at BACKING, then
    /// [`Core::set_backing_path`].
    pub fn move_base_to_link(&self, ino: u64, path: &[u8]) -> bool {
        let others: Vec<Vec<u8>> = {
            let ns = self.ns.lock();
            let Some(n) = ns.nodes.get(&ino) else {
                return false;
            };
            let Some(d) = &n.data else {
                return false;
            };
            {
                let f = d.lock();
                if !f.has_base || f.staged.is_some() || f.bpath.as_deref() != Some(path) {
                    return false;
                }
            }
            Self::link_paths(&ns, n)
                .into_iter()
                .filter(|p| p.as_slice() != path)
                .collect()
        };
        let id = |p: &[u8]| {
            self.bk
                .parent(p)
                .and_then(|(d, name)| Backing::stat(&d, name))
                .ok()
                .map(|st| (st.st_dev, st.st_ino))
        };
        let Some(here) = id(path) else {
            return false;
        };
        for q in others {
            if id(&q) == Some(here) {
                tracing::debug!(
                    "inode {ino}'s base moves from {} to {}, the same file in BACKING",
                    String::from_utf8_lossy(path),
                    String::from_utf8_lossy(&q)
                );
                self.set_backing_path(ino, Some(&q));
                return true;
            }
        }
        false
    }

    /// Records that node `ino` is at `bp` in BACKING (None: nowhere yet); a file's base
    /// handle is dropped. Takes `ns` (with the file's lock inside it, let go), and writes the
    /// journal (`db`) while it holds `ns`.
    pub fn set_backing_path(&self, ino: u64, bp: Option<&[u8]>) {
        let mut ns = self.ns.lock();
        let ns = &mut *ns;
        if let Some(n) = ns.nodes.get_mut(&ino) {
            if let Some(old) = &n.bpath {
                ns.paths.forget(old, ino);
            }
            if let Some(b) = bp {
                ns.paths.note(b, ino);
            }
            n.bpath = bp.map(|b| b.to_vec());
            if let Some(d) = &n.data {
                let mut f = d.lock();
                f.bpath = n.bpath.clone();
                f.base_fd = None;
            }
            if let Err(e) = self.tx(|tx| db::set_bpath(tx, ino, bp)) {
                tracing::warn!("recording the backing path of inode {ino}: {e}");
            }
        }
    }

    /// After `path` was removed or replaced in BACKING: nothing is there any more (but
    /// `except`). Takes `ns` (with each file's lock inside it), lets it go, then writes the
    /// journal (`db`).
    pub fn clear_backing_paths(&self, path: &[u8], holders: Holders) {
        let mut changed = Vec::new();
        let mut guard = self.ns.lock();
        let inos = match holders {
            Holders::Only(i) => vec![i],
            Holders::AllBut(except) => guard.nodes_at_or_under(path, except),
        };
        let ns = &mut *guard;
        for ino in inos {
            let Some(n) = ns.nodes.get_mut(&ino) else {
                continue;
            };
            let Some(bp) = &n.bpath else { continue };
            if under(bp, path) {
                ns.paths.forget(bp, ino);
                n.bpath = None;
                if let Some(d) = &n.data {
                    let mut f = d.lock();
                    f.bpath = None;
                    f.base_fd = None;
                    if f.has_base && f.staged.is_none() {
                        // Cannot happen: such files are pinned before their last BACKING name
                        // is removed. Keep the pages; they are the file.
                        tracing::error!(
                            "inode {ino} lost its base at {}",
                            String::from_utf8_lossy(path)
                        );
                        f.has_base = false;
                    }
                }
                changed.push(ino);
            }
        }
        drop(guard);
        let r = self.tx(|tx| {
            for i in &changed {
                db::set_bpath(tx, *i, None)?;
            }
            Ok(())
        });
        if let Err(e) = r {
            tracing::warn!("recording backing paths: {e}");
        }
    }

    /// After file `ino` moved to `to` in BACKING: its staging file (if any, in another
    /// directory) follows, as `name` in `to`'s directory, so removing the old directory never
    /// removes it. Holds the file's lock while it renames in BACKING and writes the journal
    /// (`db`); `ns` only to find the file, let go before.
    pub fn move_staged(&self, ino: u64, to: &[u8], name: &[u8]) -> io::Result<()> {
        let (tdir, _) = crate::backing::split(to);
        let nsp = join_rel(tdir, name);
        let d = {
            let mut ns = self.ns.lock();
            let d = match ns.nodes.get(&ino).and_then(|n| n.data.clone()) {
                Some(d) => d,
                None => return Ok(()),
            };
            // Before the change (the index may hold more than is true, never less).
            ns.paths.note(&nsp, ino);
            d
        };
        let mut f = d.lock();
        let Some(sp) = f.staged.clone() else {
            return Ok(());
        };
        let (sdir, _) = crate::backing::split(&sp);
        if sdir == tdir {
            return Ok(());
        }
        let (od, oname) = self.bk.parent(&sp)?;
        let nd = self.bk.dir(tdir)?;
        self.note_staging(&nsp, ino)
            .map_err(|e| io::Error::other(e.to_string()))?;
        Backing::rename(&od, oname, &nd, name)?;
        Backing::fsync_dir(&nd)?;
        tracing::debug!(
            "inode {ino}'s staging file moves from {} to {}",
            String::from_utf8_lossy(&sp),
            String::from_utf8_lossy(&nsp)
        );
        f.staged = Some(nsp.clone());
        f.base_fd = None;
        drop(f);
        self.ns.lock().paths.forget(&sp, ino);
        self.tx(|tx| {
            tx.execute(
                "UPDATE inodes SET staged=?2 WHERE ino=?1",
                rusqlite::params![ino as i64, nsp],
            )?;
            Ok(())
        })
        .map_err(|e| io::Error::other(e.to_string()))
    }

    /// Notes that the drainer is about to rename `from` to `to` in BACKING (None: done, the
    /// backing paths follow it): bases opened in between are found at their new paths.
    pub fn moving_backing(&self, m: Option<(&[u8], &[u8])>) {
        *self.moving.lock() = m.map(|(f, t)| (f.to_vec(), t.to_vec()));
    }

    /// After node `ino` was renamed from `from` to `to` in BACKING: what was at `to` is gone
    /// ([`Core::clear_backing_paths`]), and every backing path and staging file under `from`
    /// is under `to` now. Takes `ns` (with each file's lock inside it), lets it go, then
    /// writes the journal (`db`).
    pub fn rename_backing_paths(&self, ino: u64, from: &[u8], to: &[u8]) {
        self.clear_backing_paths(to, Holders::AllBut(Some(ino)));
        let mut changed = Vec::new();
        let mut staged = Vec::new();
        let mut guard = self.ns.lock();
        let inos = guard.nodes_at_or_under(from, None);
        let ns = &mut *guard;
        for i in inos {
            let Some(n) = ns.nodes.get_mut(&i) else {
                continue;
            };
            // Staging files inside a renamed directory move with it.
            if let Some(d) = &n.data {
                let mut f = d.lock();
                if let Some(sp) = f.staged.clone().filter(|sp| under(sp, from)) {
                    let mut ns2 = to.to_vec();
                    ns2.extend_from_slice(&sp[from.len()..]);
                    tracing::debug!(
                        "inode {i}'s staging file {} is now {} (directory renamed)",
                        String::from_utf8_lossy(&sp),
                        String::from_utf8_lossy(&ns2)
                    );
                    ns.paths.forget(&sp, i);
                    ns.paths.note(&ns2, i);
                    f.staged = Some(ns2.clone());
                    f.base_fd = None;
                    staged.push((i, ns2));
                }
            }
            let Some(bp) = &n.bpath else { continue };
            if under(bp, from) {
                let mut nb = to.to_vec();
                nb.extend_from_slice(&bp[from.len()..]);
                ns.paths.forget(bp, i);
                ns.paths.note(&nb, i);
                n.bpath = Some(nb.clone());
                if let Some(d) = &n.data {
                    let mut f = d.lock();
                    f.bpath = Some(nb.clone());
                    f.base_fd = None;
                }
                changed.push((i, nb));
            }
        }
        drop(guard);
        let r = self.tx(|tx| {
            for (i, b) in &changed {
                db::set_bpath(tx, *i, Some(b))?;
            }
            for (i, sp) in &staged {
                tx.execute(
                    "UPDATE inodes SET staged=?2 WHERE ino=?1",
                    rusqlite::params![*i as i64, sp],
                )?;
                tx.execute(
                    "INSERT OR REPLACE INTO staging(path, ino) VALUES (?1, ?2)",
                    rusqlite::params![sp, *i as i64],
                )?;
            }
            Ok(())
        });
        if let Err(e) = r {
            tracing::warn!("recording backing paths: {e}");
        }
    }
}
