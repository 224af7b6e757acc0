//! A file's contents drained to BACKING, the core's side of it: the drainer begins a pass
//! ([`Core::begin_drain`]: what the file is now), reads the dirty pages through it, writes
//! them to BACKING on its own (no lock of the core held), and ends the pass
//! ([`Core::finish_drain`]: pages clean, the base is BACKING's copy, the inode row).
//!
//! Locks: each method takes the namespace lock (`ns`) or the file's lock, the file's inside
//! `ns` at most (`finish_drain`), and `db` only after both are let go.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use parking_lot::Mutex;
use tierstack_store::PageData;

use crate::error::Result;

use super::extents::Extents;
use super::{Core, FileData, PAGE};

/// One drain pass over a regular file, from [`Core::begin_drain`] to
/// [`Core::finish_drain`]: what the file was when the pass began, and the file's contents it
/// works on (held by the pass even if the file is removed meanwhile). Opaque: the drainer
/// reads the snapshot through its methods and hands the pass back to the core's.
pub struct DrainPass {
    data: Arc<Mutex<FileData>>,
    ino: u64,
    obj: u64,
    open: bool,
    size: u64,
    start_ver: u64,
    staged: Option<Vec<u8>>,
    base: Option<(Vec<u8>, u64)>,
    extents: Option<Extents>,
}

impl DrainPass {
    /// A handle is open on the file: the pass stages the contents, the pass after the last
    /// close puts them in place.
    pub fn open(&self) -> bool {
        self.open
    }

    /// The file's size: the pass drains this many bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The file's version when the pass began (a later write makes it stay dirty).
    pub fn ver(&self) -> u64 {
        self.start_ver
    }

    /// Where an earlier pass staged the contents in BACKING, if one did.
    pub fn staged(&self) -> Option<&[u8]> {
        self.staged.as_deref()
    }

    /// The file's own copy in BACKING (path, bytes of it that are the file's) when it was
    /// drained whole before and not staged since: its unchanged bytes are copied from there.
    pub fn base(&self) -> Option<(&[u8], u64)> {
        self.base.as_ref().map(|(p, len)| (p.as_slice(), *len))
    }

    /// The file's allocated blocks, if known: only they are written (holes stay holes).
    pub fn extents(&self) -> Option<&Extents> {
        self.extents.as_ref()
    }

    /// The file's inode number.
    pub fn ino(&self) -> u64 {
        self.ino
    }
}

/// A dirty page as a pass reads it ([`Core::read_dirty_page`]).
pub struct DirtyPage {
    data: PageData,
    ver: u64,
    alloc: Option<Vec<(u64, u64)>>,
}

impl DirtyPage {
    /// Page `p` of file `f` (held locked) holding `data` at version `ver`, with the file's
    /// allocation within it as it is now.
    fn of(f: &FileData, p: u64, data: PageData, ver: u64) -> DirtyPage {
        let start = p * PAGE;
        let alloc = f
            .extents
            .as_ref()
            .map(|e| e.within(start, start + data.len() as u64));
        DirtyPage { data, ver, alloc }
    }

    /// Its bytes (they may reach past the file's size).
    pub fn data(&self) -> &PageData {
        &self.data
    }

    /// Its version: the pass that writes these bytes to BACKING makes it clean unless it
    /// was written again since.
    pub fn ver(&self) -> u64 {
        self.ver
    }

    /// The file's allocated ranges within the page's bytes (file offsets), if the
    /// allocation is known; the rest of the page is holes.
    pub fn alloc(&self) -> Option<&[(u64, u64)]> {
        self.alloc.as_deref()
    }
}

/// What a pass wrote, for [`Core::finish_drain`]. Plain data.
pub struct Drained<'a> {
    /// (page, version) of the pages now in BACKING.
    pub pages: &'a [(u64, u64)],
    /// Bytes written to BACKING.
    pub written: u64,
    /// 512-byte blocks BACKING's copy holds (for `st_blocks`).
    pub base_blocks: u64,
    /// The staging file's path in BACKING (the base while the file is open).
    pub staged_at: &'a [u8],
    /// The file's path in BACKING (its place after the last close).
    pub path: &'a [u8],
}

impl Core {
    /// Begins a drain pass over file `ino`: None when there is nothing to drain (the file is
    /// gone or has no name left: its later unlink removes every path the pass would write;
    /// not a regular file; not dirty). Takes its data row off the queue (a change from now on
    /// queues another) and starts tracking the smallest size until the pass ends. Takes
    /// `ns`, lets it go, then takes the file's lock.
    pub fn begin_drain(&self, ino: u64) -> Option<DrainPass> {
        let (data, obj, open) = {
            let ns = self.ns.lock();
            match ns.nodes.get(&ino) {
                Some(n) if !n.links.is_empty() => match &n.data {
                    Some(d) => (d.clone(), n.obj, n.open > 0),
                    None => return None,
                },
                _ => return None,
            }
        };
        let mut f = data.lock();
        f.data_pending = false;
        if !f.dirty {
            return None;
        }
        f.min_size = f.size;
        let base = (f.has_base && f.staged.is_none() && f.base_len > 0)
            .then(|| f.bpath.clone().map(|b| (b, f.base_len)))
            .flatten();
        let (size, start_ver, staged, extents) =
            (f.size, f.ver, f.staged.clone(), f.extents.clone());
        drop(f);
        Some(DrainPass {
            data,
            ino,
            obj,
            open,
            size,
            start_ver,
            staged,
            base,
            extents,
        })
    }

    /// Bytes of the staging file that are still the file's (a truncation since the last
    /// pass took the rest away). Takes the file's lock.
    pub fn staged_len(&self, pass: &DrainPass) -> u64 {
        pass.data.lock().base_len
    }

    /// The dirty pages of the pass's file that begin below `size`, in order. Takes the
    /// file's lock.
    pub fn pages_to_drain(&self, pass: &DrainPass, size: u64) -> Vec<u64> {
        let f = pass.data.lock();
        f.pages
            .iter()
            .filter(|(p, pg)| pg.dirty && **p * PAGE < size)
            .map(|(p, _)| *p)
            .collect()
    }

    /// Page `p` of the pass's file, if it is still dirty and holds data (read from the
    /// store, or the base, not cached): its bytes, its version, and the file's allocated
    /// ranges within them when the allocation is known. All three as the file is now, under
    /// one hold of its lock: the file may have changed since the pass began, and the
    /// allocation noted then ([`DrainPass::extents`]) may not cover what the page holds now
    /// (a truncation and a write since left BACKING with zeros where the page had data).
    /// Takes the file's lock.
    pub fn read_dirty_page(&self, pass: &DrainPass, p: u64) -> Result<Option<DirtyPage>> {
        let mut f = pass.data.lock();
        let Some(ver) = f.pages.get(&p).filter(|pg| pg.dirty).map(|pg| pg.ver) else {
            return Ok(None);
        };
        let Some(data) = self.read_page(pass.obj, &mut f, p, false)? else {
            return Ok(None);
        };
        Ok(Some(DirtyPage::of(&f, p, data, ver)))
    }

    /// Page `p` of the pass's file's first `blen` bytes as the fast tier holds it (dirty or
    /// clean), with the file's allocated ranges within it when known; `Ok(None)` when the
    /// fast tier holds none and none of those bytes are allocated; `Err(NotFound)` when it
    /// holds none but some are (or the allocation is not known): then they were only in the
    /// file's base in BACKING. For a base removed from BACKING by someone else. Takes the
    /// file's lock.
    pub fn read_held_page(
        &self,
        pass: &DrainPass,
        p: u64,
        blen: u64,
    ) -> std::io::Result<Option<DirtyPage>> {
        let f = pass.data.lock();
        let start = p * PAGE;
        let end = (start + PAGE).min(blen);
        let missing = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let Some(ver) = f.pages.get(&p).map(|pg| pg.ver) else {
            return match &f.extents {
                Some(e) if !e.touches(start, end) => Ok(None),
                _ => Err(missing()),
            };
        };
        let data = self
            .store
            .get_shared((pass.obj, p))
            .map_err(|e| std::io::Error::other(e.to_string()))?
            .ok_or_else(missing)?;
        Ok(Some(DirtyPage::of(&f, p, data, ver)))
    }

    /// Ends a pass once BACKING holds its contents (staged, or in place after the last
    /// close): the pages it wrote are clean unless written since, the base is BACKING's copy
    /// (the staging file while the file is open, else its path), the file stays dirty if it
    /// changed since the pass began; all of that recorded in the inode row before anything
    /// is dropped; the node's backing path (in place) with them. Then the drained bytes,
    /// and clean pages dropped under pressure. Takes `ns` and the file's lock inside it,
    /// lets them go, then `db` (the row); an error of the row ends it there.
    pub fn finish_drain(&self, pass: &DrainPass, done: &Drained<'_>) -> Result<()> {
        let row = {
            // The namespace first (its lock, then the file's): the node's backing path, its
            // file's, its staging file and the index of paths change together.
            let mut guard = self.ns.lock();
            let ns = &mut *guard;
            let mut f = pass.data.lock();
            let node = ns.nodes.get_mut(&pass.ino);
            let before: Vec<Vec<u8>> = [
                f.staged.clone(),
                f.bpath.clone(),
                node.as_ref().and_then(|n| n.bpath.clone()),
            ]
            .into_iter()
            .flatten()
            .collect();
            // BACKING's copy is the file's up to here: a truncation since the pass began
            // took the rest away from it, even where the pass then wrote a page written
            // after that truncation.
            let base_len = pass.size.min(f.min_size);
            for (p, ver) in done.pages {
                if let Some(pg) = f.pages.get_mut(p) {
                    // Clean only if BACKING's copy, as recorded below, covers it (else a
                    // page dropped later would read as zeros from there).
                    if pg.ver == *ver && pg.dirty && p * PAGE + pg.len as u64 <= base_len {
                        pg.dirty = false;
                        self.dirty_bytes.fetch_sub(pg.len as u64, Relaxed);
                    }
                }
            }
            f.has_base = true;
            f.base_len = base_len;
            f.base_blocks = done.base_blocks;
            // Its blocks as `stat` counts them may have changed.
            self.changed(pass.ino, false);
            f.base_fd = None;
            if pass.open {
                // Not in place yet: the drain after the last close renames it.
                f.staged = Some(done.staged_at.to_vec());
                f.dirty = true;
            } else {
                f.staged = None;
                f.bpath = Some(done.path.to_vec());
                f.dirty = f.ver != pass.start_ver;
            }
            let mut after = vec![f.staged.clone(), f.bpath.clone()];
            if let Some(n) = node {
                if !pass.open {
                    n.bpath = Some(done.path.to_vec());
                }
                after.push(n.bpath.clone());
                for p in before.iter().filter(|p| !after.contains(&Some(p.to_vec()))) {
                    ns.paths.forget(p, pass.ino);
                }
                for p in after.iter().flatten() {
                    ns.paths.note(p, pass.ino);
                }
            }
            tracing::debug!(
                "drained inode {}: base_len {} staged {:?} dirty {} ({} bytes written)",
                pass.ino,
                f.base_len,
                f.staged.as_deref().map(String::from_utf8_lossy),
                f.dirty,
                done.written
            );
            let row = (
                f.has_base,
                f.base_len,
                f.dirty,
                f.bpath.clone(),
                f.staged.clone(),
            );
            drop(f);
            drop(guard);
            row
        };
        self.tx(|tx| {
            tx.execute(
                "UPDATE inodes SET has_base=?2, base_len=?3, dirty=?4, bpath=?5, staged=?6 WHERE ino=?1",
                rusqlite::params![
                    pass.ino as i64,
                    row.0 as i64,
                    row.1 as i64,
                    row.2 as i64,
                    row.3,
                    row.4
                ],
            )?;
            Ok(())
        })?;
        self.note_drained(done.written);
        if self.under_pressure() {
            self.drop_clean(0);
        }
        self.notify_space();
        Ok(())
    }
}
