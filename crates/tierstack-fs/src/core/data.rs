//! File contents: pages in the tiered store over a base file in BACKING; read, write,
//! truncate, pinning a file's base into the store.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tierstack_store::{PageData, StoreError};

use crate::error::{FsError, Result};

use super::space::{footprint, RoomWait};
use super::{eio, moved, now_ns, Core, Kind, Ns, PAGE, R};

/// A base file open in BACKING, counted in its mount's [`BaseFds`] while it is open.
#[derive(Debug)]
pub struct BaseFd {
    file: File,
    open: Arc<std::sync::atomic::AtomicUsize>,
}

impl std::ops::Deref for BaseFd {
    type Target = File;
    fn deref(&self) -> &File {
        &self.file
    }
}

impl Drop for BaseFd {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Relaxed);
    }
}

/// The base files a mount has open: each file keeps its base open once read, so that its
/// pages come from one file; without a bound, a job that reads more files than the daemon
/// may open (`RLIMIT_NOFILE`) made every later open fail with EMFILE. Past [`BaseFds::cap`]
/// a base is opened for the one read and closed after it.
#[derive(Debug)]
pub struct BaseFds {
    open: Arc<std::sync::atomic::AtomicUsize>,
    cap: usize,
}

impl BaseFds {
    /// A count with room for `cap` held bases.
    pub fn new(cap: usize) -> Self {
        BaseFds {
            open: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            cap,
        }
    }

    /// For this process: a quarter of its descriptor limit (the rest is for handles, the
    /// drives, the journal, the drain), at most 65,536.
    pub fn for_process() -> Self {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into `rl`, a live local.
        let lim = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
            rl.rlim_cur
        } else {
            1024
        };
        Self::new((lim / 4).clamp(64, 65_536) as usize)
    }

    /// `file`, counted.
    pub fn count(&self, file: File) -> Arc<BaseFd> {
        self.open.fetch_add(1, Relaxed);
        Arc::new(BaseFd {
            file,
            open: self.open.clone(),
        })
    }

    /// Whether another base may be held open.
    pub fn room(&self) -> bool {
        self.open.load(Relaxed) < self.cap
    }

    /// Bases open now.
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.open.load(Relaxed)
    }
}

/// A page of a file held in the store.
#[derive(Clone, Copy, Debug)]
pub struct Page {
    /// Changes on every write of the page (0: loaded at start-up or cached from BACKING).
    pub(super) ver: u64,
    /// Differs from BACKING (must be drained before it may be dropped).
    pub(super) dirty: bool,
    /// Bytes of the page held in the store (at most [`PAGE`]).
    pub(super) len: u32,
}

/// The contents of one regular file: pages in the store over an optional base file in
/// BACKING (`bpath`, valid for its first `base_len` bytes).
#[derive(Debug, Default)]
pub struct FileData {
    /// The file's size in bytes, as the mount shows it.
    pub(super) size: u64,
    /// The file has a base in BACKING (see [`FileData::base_path`]).
    pub(super) has_base: bool,
    /// Bytes of the base that are the file's contents; past them the file is what the store
    /// holds, or zeros.
    pub(super) base_len: u64,
    /// The file's path in BACKING as of the journal rows applied so far (`None`: not there
    /// yet).
    pub(super) bpath: Option<Vec<u8>>,
    /// Contents differ from BACKING.
    pub(super) dirty: bool,
    /// The pages held in the store, by page number (offset / [`PAGE`]).
    pub(super) pages: BTreeMap<u64, Page>,
    /// Bumped by every change of contents.
    pub(super) ver: u64,
    /// The base file, held open once read (dropped when the base changes), while the mount
    /// holds fewer than [`BaseFds::cap`] bases.
    pub(super) base_fd: Option<Arc<BaseFd>>,
    /// A data op for this file is queued in the journal and has not started.
    pub(super) data_pending: bool,
    /// Smallest size since the current drain took its snapshot.
    pub(super) min_size: u64,
    /// A drain of the file while it was still open staged its contents under a temporary
    /// name in BACKING (this path): that file is the base (first `base_len` bytes) until the
    /// drain after the last close renames it into place. Each byte is drained once.
    pub(super) staged: Option<Vec<u8>>,
    /// 512-byte blocks the base holds in BACKING (holes excluded), for `st_blocks`.
    pub(super) base_blocks: u64,
    /// Byte ranges written since the full flush of generation `unsynced_gen` (adjacent ones
    /// merged) and their bytes in all: what an `fsync` logs (`crate::intent`).
    pub(super) unsynced: Vec<(u64, u64)>,
    /// The full-flush generation (`Core::flush_gen`) that `unsynced` was gathered under; a
    /// newer one makes the list stale.
    pub(super) unsynced_gen: u64,
    /// The allocated 4 KiB blocks (written or reserved), as ext4 would have them: `st_blocks`,
    /// `SEEK_DATA`/`SEEK_HOLE`, and what the drain writes. None: not known yet (a file found
    /// in BACKING; read from its base's holes at its first change, see
    /// [`Core::ensure_extents`]).
    pub(super) extents: Option<super::extents::Extents>,
    /// Bytes written since that full flush, in all (may exceed the bytes of `unsynced`,
    /// which stops growing past `intent::MAX_RECORD`).
    pub(super) unsynced_bytes: u64,
}

impl FileData {
    /// Where the base is in BACKING: the staged temporary file, else the file's own path.
    pub(super) fn base_path(&self) -> Option<&[u8]> {
        self.staged.as_deref().or(self.bpath.as_deref())
    }
}

pub(super) enum WriteErr {
    Full,
    Other(FsError),
}

impl WriteErr {
    /// A store's error: `Full` (the writer waits for room and writes again: the same bytes
    /// at the same place, whatever of them the store took) or another.
    fn of(e: StoreError) -> WriteErr {
        match e {
            StoreError::Full(_) => WriteErr::Full,
            e => WriteErr::Other(e.into()),
        }
    }
}

impl Core {
    // ------------------------------------------------------------------ contents

    pub(super) fn base_file(&self, f: &mut FileData) -> Result<Option<Arc<BaseFd>>> {
        if let Some(b) = &f.base_fd {
            return Ok(Some(b.clone()));
        }
        let Some(bp) = f.base_path() else {
            return Ok(None);
        };
        let path = self.bjoin(bp);
        let file = match self.bk.open_file(bp, rustix::fs::OFlags::RDONLY, 0) {
            // The drainer is renaming a folder above it in BACKING and has not yet moved
            // the backing paths along: the base is at its new path already.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let now = self
                    .moving
                    .lock()
                    .as_ref()
                    .and_then(|(from, to)| moved(bp, from, to));
                match now {
                    Some(p) => self.bk.open_file(&p, rustix::fs::OFlags::RDONLY, 0),
                    None => Err(e),
                }
            }
            r => r,
        }
        .map_err(crate::error::io_err(&path))?;
        let a = self.base_fds.count(file);
        if self.base_fds.room() {
            f.base_fd = Some(a.clone());
        }
        Ok(Some(a))
    }

    /// Reads page `p` of a file: from the store, else from its base in BACKING (cached in the
    /// store when `cache`), else None (zeros). The contents are shared with the store (a later
    /// write of the page replaces them, it never changes them); they may be longer than the
    /// file's current size.
    pub(super) fn read_page(
        &self,
        obj: u64,
        f: &mut FileData,
        p: u64,
        cache: bool,
    ) -> Result<Option<PageData>> {
        if f.pages.contains_key(&p) {
            return match self.store.get_shared((obj, p))? {
                Some(v) => Ok(Some(v)),
                None => Err(FsError::Config(format!(
                    "page {p} of object {obj} is missing from the fast tier"
                ))),
            };
        }
        let start = p * PAGE;
        if !f.has_base || start >= f.base_len {
            return Ok(None);
        }
        let Some(base) = self.base_file(f)? else {
            return Ok(None);
        };
        let want = (f.base_len - start).min(PAGE) as usize;
        // A hole reads as zeros without a read of the base, and takes no fast-tier space.
        if f.extents
            .as_ref()
            .is_some_and(|e| !e.touches(start, start + want as u64))
        {
            return Ok(None);
        }
        let mut buf = self.store.page_buf(want);
        buf.resize(want, 0);
        let mut got = 0;
        while got < want {
            match base.read_at(&mut buf[got..], start + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(FsError::Io {
                        path: self.bjoin(f.base_path().unwrap_or_default()),
                        source: e,
                    })
                }
            }
        }
        let buf = PageData::new(buf);
        if cache {
            self.cache_clean(obj, f, p, buf.clone());
        }
        Ok(Some(buf))
    }

    /// Holds `buf`, the bytes BACKING has at page `p`, as a clean page of the file, when the
    /// cache's share allows (no pressure, at most half the limit held); returns whether it
    /// did.
    pub(super) fn cache_clean(&self, obj: u64, f: &mut FileData, p: u64, buf: PageData) -> bool {
        let len = buf.len() as u64;
        if self.pressure.load(Relaxed)
            || self.held.load(Relaxed) + footprint(len) > self.limit / 2
            || self.store.put_shared((obj, p), buf).is_err()
        {
            return false;
        }
        f.pages.insert(
            p,
            Page {
                ver: 0,
                dirty: false,
                len: len as u32,
            },
        );
        self.held.fetch_add(footprint(len), Relaxed);
        true
    }

    /// The first `len` bytes of page `p` as a buffer of its own: the page's bytes below the
    /// file's current size, zeros after them.
    pub(super) fn page_copy(
        &self,
        obj: u64,
        f: &mut FileData,
        p: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        let mut buf = self.store.page_buf(len);
        if let Some(v) = self.read_page(obj, f, p, false)? {
            // Bytes beyond the old size read as zeros even where a stale page is longer.
            let valid = (f.size.saturating_sub(p * PAGE).min(PAGE) as usize)
                .min(v.len())
                .min(len);
            buf.extend_from_slice(&v[..valid]);
        }
        buf.resize(len, 0);
        Ok(buf)
    }

    pub(super) fn put_page(
        &self,
        obj: u64,
        f: &mut FileData,
        p: u64,
        data: Vec<u8>,
    ) -> Result<(), WriteErr> {
        let len = data.len() as u64;
        self.store.put_owned((obj, p), data).map_err(WriteErr::of)?;
        self.note_page_written(f, p, len);
        Ok(())
    }

    /// Records that page `p` now holds `len` new (dirty) bytes in the store.
    pub(super) fn note_page_written(&self, f: &mut FileData, p: u64, len: u64) {
        f.ver += 1;
        let new = Page {
            ver: f.ver,
            dirty: true,
            len: len as u32,
        };
        if let Some(old) = f.pages.insert(p, new) {
            self.held.fetch_sub(footprint(old.len as u64), Relaxed);
            if old.dirty {
                self.dirty_bytes.fetch_sub(old.len as u64, Relaxed);
            }
        }
        self.held.fetch_add(footprint(len), Relaxed);
        self.dirty_bytes.fetch_add(len, Relaxed);
    }

    /// [`Core::put_page`] of a copy of `data`, retried while the store has no room and the
    /// drain makes progress ([`RoomWait`]; ENOSPC after that). `f` stays locked meanwhile:
    /// the drain makes room with the other files' pages.
    pub(super) fn put_page_retry(&self, obj: u64, f: &mut FileData, p: u64, data: &[u8]) -> R<()> {
        let mut room = RoomWait::new(self, false);
        loop {
            let mut v = self.store.page_buf(data.len());
            v.extend_from_slice(data);
            match self.put_page(obj, f, p, v) {
                Ok(()) => return Ok(()),
                Err(WriteErr::Full) if room.wait(self) => {}
                Err(WriteErr::Full) => return Err(libc::ENOSPC),
                Err(WriteErr::Other(e)) => return Err(eio(e)),
            }
        }
    }

    /// Forgets page `p` of `f`, once the store has removed it: a removal that fails (a full
    /// array) leaves the page the file's, so that no copy the file no longer counts stays in
    /// the store (the load would take it back after a crash).
    pub(super) fn drop_page(&self, obj: u64, f: &mut FileData, p: u64) -> Result<()> {
        if !f.pages.contains_key(&p) {
            return Ok(());
        }
        self.store.remove((obj, p))?;
        if let Some(old) = f.pages.remove(&p) {
            self.held.fetch_sub(footprint(old.len as u64), Relaxed);
            if old.dirty {
                self.dirty_bytes.fetch_sub(old.len as u64, Relaxed);
            }
            self.space_cv.notify_all();
        }
        Ok(())
    }

    pub(super) fn mark_dirty(&self, ino: u64, f: &mut FileData) -> Result<()> {
        f.ver += 1;
        if !f.dirty {
            f.dirty = true;
            self.persist_content(ino, f)?;
        }
        Ok(())
    }

    pub(super) fn write_locked(
        &self,
        ino: u64,
        obj: u64,
        f: &mut FileData,
        off: u64,
        data: &[u8],
    ) -> Result<(), WriteErr> {
        let end = off + data.len() as u64;
        let new_size = f.size.max(end);
        let mut p = off / PAGE;
        while p * PAGE < end {
            let pstart = p * PAGE;
            let plen = (new_size - pstart).min(PAGE) as usize;
            let lo = off.max(pstart);
            let hi = end.min(pstart + PAGE);
            let src = &data[(lo - off) as usize..(hi - off) as usize];
            // A page the DRAM tier holds unshared is changed in place: a 4 KiB write into a
            // 1 MiB page then copies 4 KiB, not the page.
            if f.pages.contains_key(&p) && !(lo == pstart && hi - pstart >= plen as u64) {
                let keep = (f.size.saturating_sub(pstart).min(PAGE) as usize).min(plen);
                let at = (lo - pstart) as usize;
                let done = self
                    .store
                    .update((obj, p), keep, plen, |b| {
                        b[at..at + src.len()].copy_from_slice(src)
                    })
                    .map_err(WriteErr::of)?;
                if done {
                    self.note_page_written(f, p, plen as u64);
                    p += 1;
                    continue;
                }
            }
            let buf = if lo == pstart && hi - pstart >= plen as u64 {
                // The write covers the whole page: no need to read it.
                let mut buf = self.store.page_buf(plen);
                buf.extend_from_slice(&src[..plen]);
                buf
            } else {
                let mut buf = self.page_copy(obj, f, p, plen).map_err(WriteErr::Other)?;
                buf[(lo - pstart) as usize..(hi - pstart) as usize].copy_from_slice(src);
                buf
            };
            self.put_page(obj, f, p, buf)?;
            p += 1;
        }
        f.size = new_size;
        if let Some(e) = f.extents.as_mut() {
            e.add(off, end);
        }
        self.mark_dirty(ino, f).map_err(WriteErr::Other)
    }

    pub(super) fn file(&self, ino: u64) -> R<(Arc<Mutex<FileData>>, u64)> {
        let ns = self.ns.lock();
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        match &n.data {
            Some(d) => Ok((d.clone(), n.obj)),
            None if n.kind == Kind::Dir => Err(libc::EISDIR),
            None => Err(libc::EINVAL),
        }
    }

    /// Writes `data` at `off`; `kill_setid` when the writer may not keep set-ID bits (see
    /// [`Core::kill_priv`]; file capabilities go on every write); `direct` when it came
    /// through a handle that bypasses the kernel's page cache: the time of that handle's open
    /// (noted in [`super::node::Node::direct_mtime`] and `direct_opened`).
    pub fn write(
        &self,
        ino: u64,
        off: u64,
        data: &[u8],
        kill_setid: bool,
        direct: Option<i64>,
    ) -> R<usize> {
        self.kill_priv(ino, kill_setid)?;
        self.touch();
        let (d, obj) = self.file(ino)?;
        self.wait_space(data.len() as u64);
        loop {
            let r = {
                let mut f = d.lock();
                self.ensure_extents(&mut f).map_err(eio)?;
                let r = self.write_locked(ino, obj, &mut f, off, data);
                if r.is_ok() {
                    self.note_unsynced(&mut f, off, data.len() as u64);
                }
                r
            };
            match r {
                Ok(()) => break,
                Err(WriteErr::Full) => {
                    self.pressure.store(true, Relaxed);
                    self.wake_drainer();
                    if !self.drop_clean(data.len() as u64) {
                        if self.replaying.load(Relaxed) {
                            // No drainer yet to make room: fail the mount rather than hang.
                            return Err(libc::ENOSPC);
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                Err(WriteErr::Other(e)) => return Err(eio(e)),
            }
        }
        let mut ns = self.ns.lock();
        if let Some(n) = ns.nodes.get_mut(&ino) {
            let t = now_ns();
            n.mtime = t;
            n.ctime = t;
            if let Some(opened) = direct {
                n.direct_mtime = t;
                if n.direct_opened != opened {
                    n.direct_opened = opened;
                    n.direct_first = t;
                }
            }
        }
        Ok(data.len())
    }

    /// Up to `size` bytes of file `ino` at `off` (fewer at the end of the file), from the
    /// store or the base in BACKING; holes read as zeros.
    pub fn read(&self, ino: u64, off: u64, size: u32) -> R<Vec<u8>> {
        let (d, obj) = self.file(ino)?;
        let mut f = d.lock();
        self.read_locked(obj, &mut f, off, size as u64)
    }

    /// Up to `len` bytes at `off` (fewer at the end of the file).
    pub(super) fn read_locked(&self, obj: u64, f: &mut FileData, off: u64, len: u64) -> R<Vec<u8>> {
        let end = (off + len).min(f.size);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - off) as usize];
        let mut p = off / PAGE;
        while p * PAGE < end {
            let pstart = p * PAGE;
            if let Some(v) = self.read_page(obj, f, p, true).map_err(eio)? {
                let lo = off.max(pstart);
                let hi = end.min(pstart + v.len() as u64);
                if hi > lo {
                    out[(lo - off) as usize..(hi - off) as usize]
                        .copy_from_slice(&v[(lo - pstart) as usize..(hi - pstart) as usize]);
                }
            }
            p += 1;
        }
        Ok(out)
    }

    /// Notes a write of `len` bytes at `off` for the next `fsync`'s intent record (sync mode;
    /// beyond `intent::MAX_RECORD` bytes the list stops growing: that `fsync` flushes).
    fn note_unsynced(&self, f: &mut FileData, off: u64, len: u64) {
        if self.intent.is_none() {
            return;
        }
        let gen = self.flush_gen.load(std::sync::atomic::Ordering::SeqCst);
        if f.unsynced_gen != gen {
            f.unsynced.clear();
            f.unsynced_bytes = 0;
            f.unsynced_gen = gen;
        }
        f.unsynced_bytes += len;
        if f.unsynced_bytes > crate::intent::MAX_RECORD {
            self.unloggable
                .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        if let Some(last) = f.unsynced.last_mut() {
            if last.0 + last.1 == off {
                last.1 += len;
                return;
            }
        }
        f.unsynced.push((off, len));
    }

    /// The next `fsync` of this file flushes everything instead of logging ranges: a change
    /// that is not a write of bytes (a shrink, a punched or zeroed range) has no range for
    /// the intent log to replay, and old bytes would come back after a crash.
    fn not_loggable(&self, f: &mut FileData) {
        if self.intent.is_none() {
            return;
        }
        f.unsynced_gen = self.flush_gen.load(std::sync::atomic::Ordering::SeqCst);
        f.unsynced.clear();
        f.unsynced_bytes = crate::intent::MAX_RECORD + 1;
    }

    pub(super) fn truncate(&self, ino: u64, new: u64) -> R<()> {
        let (d, obj) = self.file(ino)?;
        self.wait_space(PAGE);
        let mut f = d.lock();
        self.ensure_extents(&mut f).map_err(eio)?;
        // As ext4: a truncation to the size or below frees every block past it (blocks
        // reserved past the end included); growing frees nothing.
        if new <= f.size {
            if let Some(e) = f.extents.as_mut() {
                e.truncate(new);
            }
        }
        if new < f.size {
            self.not_loggable(&mut f);
            let beyond: Vec<u64> = f
                .pages
                .range(new.div_ceil(PAGE)..)
                .map(|(p, _)| *p)
                .collect();
            for p in beyond {
                self.drop_page(obj, &mut f, p).map_err(eio)?;
            }
            if !new.is_multiple_of(PAGE) {
                let p = new / PAGE;
                if let Some(v) = self.read_page(obj, &mut f, p, false).map_err(eio)? {
                    let keep = (new - p * PAGE) as usize;
                    if v.len() > keep {
                        self.put_page_retry(obj, &mut f, p, &v[..keep])?;
                    }
                }
            }
            f.base_len = f.base_len.min(new);
            f.min_size = f.min_size.min(new);
        }
        f.size = new;
        self.mark_dirty(ino, &mut f).map_err(eio)?;
        self.persist_content(ino, &f).map_err(eio)?;
        Ok(())
    }

    /// `lseek(2)` with `SEEK_DATA` or `SEEK_HOLE` on file `ino`, answered as ext4 does from
    /// the file's allocated 4 KiB blocks. While a handle that may write is open, the kernel
    /// may hold written pages it has not sent (it does not write them back before asking,
    /// only at the last release): then the whole file counts as data, as on a file system
    /// without holes (a copy is then whole, never short of what was written).
    pub fn seek(&self, ino: u64, off: u64, whence: i32) -> R<u64> {
        let writers = {
            let ns = self.ns.lock();
            ns.nodes.get(&ino).ok_or(libc::ENOENT)?.open_w
        };
        let (d, _) = self.file(ino)?;
        let mut f = d.lock();
        let size = f.size;
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(libc::EINVAL);
        }
        if off >= size {
            return Err(libc::ENXIO);
        }
        if writers > 0 {
            return Ok(if whence == libc::SEEK_DATA { off } else { size });
        }
        self.ensure_extents(&mut f).map_err(eio)?;
        let e = f.extents.as_ref().ok_or(libc::EIO)?;
        let at = if whence == libc::SEEK_DATA {
            e.seek_data(off, size)
        } else {
            e.seek_hole(off, size)
        };
        at.ok_or(libc::ENXIO)
    }

    /// Makes a file's allocation known (see [`FileData::extents`]): a file found in BACKING
    /// gets its base's data ranges (`SEEK_DATA`/`SEEK_HOLE`) and its changed pages.
    pub(super) fn ensure_extents(&self, f: &mut FileData) -> Result<()> {
        if f.extents.is_some() {
            return Ok(());
        }
        let mut e = super::extents::Extents::new();
        if f.has_base && f.base_len > 0 {
            if let Some(base) = self.base_file(f)? {
                let path = self.bjoin(f.base_path().unwrap_or_default());
                for (a, b) in crate::backing::data_ranges(&base, f.base_len)
                    .map_err(crate::error::io_err(path))?
                {
                    e.add(a, b);
                }
            }
        }
        for (p, pg) in &f.pages {
            if pg.dirty {
                e.add(p * PAGE, p * PAGE + pg.len as u64);
            }
        }
        f.extents = Some(e);
        Ok(())
    }

    /// Zeros `[a, b)` of a file (within its size): pages wholly inside that hold nothing the
    /// base does not are dropped, other bytes are overwritten with zeros.
    fn zero_range(&self, ino: u64, obj: u64, f: &mut FileData, a: u64, b: u64) -> R<()> {
        let b = b.min(f.size);
        if b <= a {
            return Ok(());
        }
        let mut p = a / PAGE;
        while p * PAGE < b {
            let pstart = p * PAGE;
            let pend = (pstart + PAGE).min(f.size);
            let (lo, hi) = (a.max(pstart), b.min(pend));
            let base_here = f.has_base && pstart < f.base_len;
            if lo == pstart && hi == pend && !base_here {
                self.drop_page(obj, f, p).map_err(eio)?;
            } else if f.pages.contains_key(&p) || base_here {
                let zeros = vec![0u8; (hi - lo) as usize];
                match self.write_locked(ino, obj, f, lo, &zeros) {
                    Ok(()) => {}
                    Err(WriteErr::Full) => return Err(libc::ENOSPC),
                    Err(WriteErr::Other(e)) => return Err(eio(e)),
                }
            }
            p += 1;
        }
        Ok(())
    }

    /// `fallocate(2)` on file `ino`: mode 0 and `FALLOC_FL_KEEP_SIZE` reserve blocks (the
    /// size grows without KEEP_SIZE), `FALLOC_FL_PUNCH_HOLE` (with KEEP_SIZE) frees them and
    /// reads zeros after, `FALLOC_FL_ZERO_RANGE` zeros bytes and keeps them allocated, as
    /// ext4 does. A reserved block takes no fast-tier space (it is a hole with zeros until
    /// written); the drain reserves it in BACKING.
    pub fn fallocate(&self, ino: u64, off: u64, len: u64, mode: i32) -> R<()> {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        if mode & !(KEEP | PUNCH | ZERO) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if mode & PUNCH != 0 && (mode & ZERO != 0 || mode & KEEP == 0) {
            return Err(libc::EOPNOTSUPP);
        }
        if len == 0 {
            return Err(libc::EINVAL);
        }
        let end = off.checked_add(len).ok_or(libc::EFBIG)?;
        self.touch();
        let (d, obj) = self.file(ino)?;
        self.wait_space(PAGE);
        let grew = {
            let mut f = d.lock();
            self.ensure_extents(&mut f).map_err(eio)?;
            if mode & (PUNCH | ZERO) != 0 {
                self.zero_range(ino, obj, &mut f, off, end)?;
                self.not_loggable(&mut f);
            }
            let grew = mode & KEEP == 0 && end > f.size;
            if grew {
                f.size = end;
            }
            if let Some(e) = f.extents.as_mut() {
                if mode & PUNCH != 0 {
                    e.remove(off, end);
                } else {
                    e.add(off, end);
                }
            }
            self.mark_dirty(ino, &mut f).map_err(eio)?;
            self.persist_content(ino, &f).map_err(eio)?;
            grew
        };
        if grew || mode & (PUNCH | ZERO) != 0 {
            let mut ns = self.ns.lock();
            if let Some(n) = ns.nodes.get_mut(&ino) {
                let t = now_ns();
                n.mtime = t;
                n.ctime = t;
            }
        }
        Ok(())
    }

    /// Copies the data of a file's base into the store (holes stay holes: only the pages
    /// holding data, found with `SEEK_DATA`), so it no longer depends on BACKING's copy,
    /// which is about to be removed while the file lives on (another hard link, an open
    /// handle). The drainer calls it just before it removes that copy, in journal order,
    /// so no drain of the file is in flight; the caller makes the store and the journal
    /// durable before the removal.
    pub(super) fn pin_base(&self, ino: u64, obj: u64, f: &mut FileData) -> Result<()> {
        if !f.has_base {
            return Ok(());
        }
        let len = f.base_len.min(f.size);
        let base = match self.base_file(f) {
            Ok(b) => b,
            // Removed from BACKING by someone else: there is nothing left to keep.
            Err(FsError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(
                    "the base of inode {ino} vanished from BACKING before it was pinned"
                );
                None
            }
            Err(e) => return Err(e),
        };
        if let Some(base) = base {
            let mut p = 0;
            while p * PAGE < len {
                // The next page that holds data, at or after page p.
                let Some(at) = crate::backing::next_data(&base, p * PAGE).map_err(
                    crate::error::io_err(self.bjoin(f.base_path().unwrap_or_default())),
                )?
                else {
                    break;
                };
                if at >= len {
                    break;
                }
                p = at / PAGE;
                if !f.pages.get(&p).is_some_and(|pg| pg.dirty) {
                    if let Some(v) = self.read_page(obj, f, p, false)? {
                        self.put_page_retry(obj, f, p, &v).map_err(|e| {
                            FsError::Config(format!("pinning page {p} of inode {ino}: errno {e}"))
                        })?;
                    }
                }
                p += 1;
            }
        }
        f.has_base = false;
        f.base_fd = None;
        f.base_blocks = 0;
        f.staged = None;
        // Its blocks as `stat` counts them changed.
        self.changed(ino, false);
        self.mark_dirty(ino, f)?;
        self.persist_content(ino, f)
    }

    pub(super) fn destroy(&self, ns: &mut Ns, ino: u64) {
        ns.seen.remove(&ino);
        if let Some(n) = ns.nodes.remove(&ino) {
            if let Some(b) = &n.bpath {
                ns.paths.forget(b, ino);
            }
            if let Some(d) = &n.data {
                let mut f = d.lock();
                for p in [&f.bpath, &f.staged].into_iter().flatten() {
                    ns.paths.forget(p, ino);
                }
                let pages: Vec<u64> = f.pages.keys().copied().collect();
                for p in pages {
                    if let Err(e) = self.drop_page(n.obj, &mut f, p) {
                        tracing::warn!("dropping page {p} of inode {ino}: {e}");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod base_fd_tests {
    use super::*;

    #[test]
    fn held_bases_are_counted_until_their_last_reference_goes() {
        let fds = BaseFds::new(2);
        let open = || File::open("/proc/self/stat").expect("open");
        let a = fds.count(open());
        let a2 = a.clone();
        let b = fds.count(open());
        assert_eq!(fds.open(), 2);
        assert!(!fds.room(), "two of two held");
        drop(a);
        assert_eq!(fds.open(), 2, "a clone still holds the first");
        drop(a2);
        assert_eq!(fds.open(), 1);
        assert!(fds.room());
        drop(b);
        assert_eq!(fds.open(), 0);
    }

    #[test]
    fn the_process_cap_is_a_quarter_of_the_descriptor_limit() {
        let fds = BaseFds::for_process();
        assert!(fds.cap >= 64 && fds.cap <= 65_536, "{}", fds.cap);
    }
}
