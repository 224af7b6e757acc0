//! Executing a plan: the copy workers (largest file first), temporary names renamed into
//! place, sparse copies (data regions only, holes hashed as zeros), verification and
//! read-back.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use xxhash_rust::xxh3::Xxh3;

use super::special::{make_hard_link, make_special, verify_special};
use super::{
    io_err, tmp_name, FileJob, LinkJob, Options, Plan, Report, Skipped, StageError, TmpGuard, CHUNK,
};

// ---------------------------------------------------------------------------------------------
// Carrying out a plan

/// Zeros hashed for the holes of sparse files.
pub(super) static ZEROS: [u8; 1 << 16] = [0; 1 << 16];

/// Feeds `n` zero bytes (a hole) to `h`.
pub(super) fn hash_zeros(h: &mut Xxh3, mut n: u64) {
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        h.update(&ZEROS[..k]);
        n -= k as u64;
    }
}

/// The next data region `[start, end)` of `f` at or after `from` and before `size`, as the
/// file system reports it (`SEEK_DATA`/`SEEK_HOLE`); `None` when only holes remain. A file
/// system that cannot tell has all of it as data.
pub(super) fn next_data(f: &File, from: u64, size: u64) -> io::Result<Option<(u64, u64)>> {
    use rustix::fs::SeekFrom;
    use rustix::io::Errno;
    if from >= size {
        return Ok(None);
    }
    let start = match rustix::fs::seek(f, SeekFrom::Data(from)) {
        Ok(s) => s,
        // No data at or after `from`.
        Err(Errno::NXIO) => return Ok(None),
        Err(Errno::INVAL | Errno::OPNOTSUPP | Errno::NOSYS) => return Ok(Some((from, size))),
        Err(e) => return Err(e.into()),
    };
    if start >= size {
        return Ok(None);
    }
    let end = match rustix::fs::seek(f, SeekFrom::Hole(start)) {
        Ok(e) => e.min(size),
        Err(Errno::NXIO | Errno::INVAL | Errno::OPNOTSUPP | Errno::NOSYS) => size,
        Err(e) => return Err(e.into()),
    };
    // Never an empty region (the caller moves on to `end`).
    Ok(Some((start, if end > start { end } else { size })))
}

/// Reads at `off` until `buf` is full or the end of the file.
pub(super) fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// What reading a file's data regions found.
pub(super) struct Scan {
    /// The file's size (data and holes).
    size: u64,
    /// Bytes read (the data regions).
    data: u64,
    /// xxh3-64 of the whole logical content (holes as zeros), if asked.
    pub(super) hash: Option<u64>,
}

/// Reads the data regions of `f` up to its size at open, in chunks, handing each to `sink`
/// (offset, bytes); holes are skipped (hashed as zeros). A file that shrinks while it is read
/// is taken as holding zeros from where it ended.
pub(super) fn scan(
    f: &File,
    path: &Path,
    what: &'static str,
    hash: bool,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &AtomicBool,
    mut sink: impl FnMut(u64, &[u8]) -> Result<(), StageError>,
) -> Result<Scan, StageError> {
    let size = f.metadata().map_err(io_err(what, path))?.len();
    let mut hasher = hash.then(Xxh3::new);
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0u64;
    let mut data = 0u64;
    'regions: while let Some((start, end)) = next_data(f, pos, size).map_err(io_err(what, path))? {
        if let Some(h) = hasher.as_mut() {
            hash_zeros(h, start - pos);
        }
        progress(start - pos);
        pos = start;
        while pos < end {
            if cancel.load(Ordering::Relaxed) {
                return Err(StageError::Cancelled);
            }
            let want = (end - pos).min(CHUNK as u64) as usize;
            let n = read_full_at(f, &mut buf[..want], pos).map_err(io_err(what, path))?;
            if n == 0 {
                break 'regions;
            }
            if let Some(h) = hasher.as_mut() {
                h.update(&buf[..n]);
            }
            sink(pos, &buf[..n])?;
            pos += n as u64;
            data += n as u64;
            progress(n as u64);
            if n < want {
                break 'regions;
            }
        }
    }
    if let Some(h) = hasher.as_mut() {
        hash_zeros(h, size - pos);
    }
    progress(size - pos);
    Ok(Scan {
        size,
        data,
        hash: hasher.map(|h| h.digest()),
    })
}

/// Copies one file (its data regions; holes stay holes) to a temporary name, sets its mode
/// and modification time, fsyncs it and renames it into place.
pub(super) fn copy_file(
    job: &FileJob,
    hash: bool,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &AtomicBool,
) -> Result<Scan, StageError> {
    let src = File::open(&job.src).map_err(io_err("open", &job.src))?;
    let (out, tmp, guard) = create_tmp(job)?;
    let copied = scan(&src, &job.src, "read", hash, progress, cancel, |off, b| {
        Ok(out.write_all_at(b, off).map_err(io_err("write", &tmp))?)
    })?;
    // The size, so that trailing holes (and a source that shrank) read as zeros.
    out.set_len(copied.size)
        .map_err(io_err("set the size of", &tmp))?;
    finish_tmp(out, &tmp, guard, job)?;
    Ok(copied)
}

/// A new temporary file next to `job.dst` (removed when the guard drops).
pub(super) fn create_tmp(job: &FileJob) -> Result<(File, PathBuf, TmpGuard), StageError> {
    let tmp = tmp_name(&job.dst);
    let out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err("create", &tmp))?;
    let guard = TmpGuard(Some(tmp.clone()));
    Ok((out, tmp, guard))
}

/// Gives the temporary copy the source's mode and modification time, fsyncs it and renames
/// it into place.
pub(super) fn finish_tmp(
    out: File,
    tmp: &Path,
    mut guard: TmpGuard,
    job: &FileJob,
) -> Result<(), StageError> {
    out.set_permissions(fs::Permissions::from_mode(job.mode))
        .map_err(io_err("set the mode of", tmp))?;
    if let Some(t) = job.mtime {
        out.set_modified(t)
            .map_err(io_err("set the modification time of", tmp))?;
    }
    out.sync_all().map_err(io_err("fsync", tmp))?;
    drop(out);
    fs::rename(tmp, &job.dst).map_err(io_err("rename into place", &job.dst))?;
    guard.0 = None;
    Ok(())
}

/// Reads the data regions of `path` (holes hashed as zeros, not read); returns (bytes read,
/// xxh3 of the whole logical content if asked).
pub(super) fn read_back(
    path: &Path,
    hash: bool,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &AtomicBool,
) -> Result<(u64, Option<u64>), StageError> {
    let f = File::open(path).map_err(io_err("read back", path))?;
    let r = scan(&f, path, "read back", hash, progress, cancel, |_, _| Ok(()))?;
    Ok((r.data, r.hash))
}

pub(super) fn make_link(job: &LinkJob) -> Result<(), StageError> {
    let tmp = tmp_name(&job.dst);
    std::os::unix::fs::symlink(&job.target, &tmp).map_err(io_err("create the link", &tmp))?;
    let mut guard = TmpGuard(Some(tmp.clone()));
    fs::rename(&tmp, &job.dst).map_err(io_err("rename into place", &job.dst))?;
    guard.0 = None;
    Ok(())
}

/// What copying one file (and reading it back) did.
#[derive(Default)]
pub(super) struct Copy {
    bytes: u64,
    sparse: u64,
    read_back: u64,
    verified: bool,
}

/// Copies one file and, as asked, reads it back and compares checksums.
pub(super) fn copy_one(
    job: &FileJob,
    opts: &Options,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &AtomicBool,
) -> Result<Copy, StageError> {
    let c = copy_file(job, opts.verify, progress, cancel)?;
    let mut r = Copy {
        bytes: job.len,
        sparse: c.size - c.data,
        ..Copy::default()
    };
    if opts.verify || opts.read_back {
        let (n, got) = read_back(&job.dst, opts.verify, progress, cancel)?;
        r.read_back = n;
        if let (Some(w), Some(g)) = (c.hash, got) {
            if w != g {
                return Err(StageError::Verify {
                    dst: job.dst.clone(),
                    want: w,
                    got: g,
                });
            }
            r.verified = true;
        }
    }
    Ok(r)
}

pub(super) fn add_copy(report: &mut Report, c: &Copy) {
    report.files += 1;
    report.bytes += c.bytes;
    report.sparse_bytes += c.sparse;
    report.read_back_bytes += c.read_back;
    report.verified += u64::from(c.verified);
}

/// Carries out a plan with `opts.jobs` threads. `progress` is called with each run of bytes
/// copied or read back (holes included); setting `cancel` stops the copy at the next chunk.
pub fn execute(
    plan: &Plan,
    opts: &Options,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &AtomicBool,
) -> Result<Report, StageError> {
    let mut report = Report::default();
    for d in &plan.dirs {
        fs::create_dir_all(&d.dst).map_err(io_err("create the directory", &d.dst))?;
        report.dirs += 1;
    }
    // Largest first, so the last files to finish are small ones.
    let mut order: Vec<&FileJob> = plan.files.iter().collect();
    order.sort_by_key(|f| std::cmp::Reverse(f.len));
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<StageError>> = Mutex::new(None);
    let done: Mutex<Report> = Mutex::new(Report::default());
    let stop = AtomicBool::new(false);
    let halt = |e: StageError| {
        stop.store(true, Ordering::Relaxed);
        let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(e);
        }
    };
    let threads = opts.jobs.clamp(1, order.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                if cancel.load(Ordering::Relaxed) {
                    halt(StageError::Cancelled);
                    return;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = order.get(i) else { return };
                match copy_one(job, opts, progress, cancel) {
                    Ok(c) => add_copy(&mut done.lock().unwrap_or_else(|p| p.into_inner()), &c),
                    Err(e) => {
                        halt(e);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let done = done.into_inner().unwrap_or_else(|p| p.into_inner());
    report.files = done.files;
    report.bytes = done.bytes;
    report.sparse_bytes = done.sparse_bytes;
    report.verified = done.verified;
    report.read_back_bytes = done.read_back_bytes;
    // Further names of files copied above: hard links to their copies. Where the destination
    // refuses a link (another file system below a destination directory, no links at all),
    // the name is copied, and later names of the inode try that copy too.
    let mut copies: HashMap<&Path, Vec<PathBuf>> = HashMap::new();
    for h in &plan.hardlinks {
        if cancel.load(Ordering::Relaxed) {
            return Err(StageError::Cancelled);
        }
        let targets = copies
            .entry(h.target.as_path())
            .or_insert_with(|| vec![h.target.clone()]);
        let mut refused = None;
        for t in targets.iter() {
            match make_hard_link(h, t, opts.verify)? {
                Ok(()) => {
                    refused = None;
                    break;
                }
                Err(reason) => refused = Some(reason),
            }
        }
        match refused {
            None => report.hardlinks += 1,
            Some(reason) => {
                let c = copy_one(&h.file, opts, progress, cancel)?;
                add_copy(&mut report, &c);
                targets.push(h.file.dst.clone());
                report.hardlinks_copied.push(Skipped {
                    path: h.file.dst.clone(),
                    reason,
                });
            }
        }
    }
    for l in &plan.links {
        if cancel.load(Ordering::Relaxed) {
            return Err(StageError::Cancelled);
        }
        make_link(l)?;
        if opts.verify {
            let got = fs::read_link(&l.dst).map_err(io_err("read back the link", &l.dst))?;
            if got != l.target {
                return Err(StageError::Refused(format!(
                    "verify failed for the link {}: it leads to {} instead of {}; run the stage again",
                    l.dst.display(),
                    got.display(),
                    l.target.display()
                )));
            }
        }
        report.symlinks += 1;
    }
    let root = rustix::process::geteuid().is_root();
    for x in &plan.specials {
        if cancel.load(Ordering::Relaxed) {
            return Err(StageError::Cancelled);
        }
        match make_special(x, root) {
            Ok(()) => {
                if opts.verify {
                    verify_special(x)?;
                }
                report.specials += 1;
            }
            Err(reason) => report.skipped.push(Skipped {
                path: x.src.clone(),
                reason,
            }),
        }
    }
    // Directory modes last (deepest first), so a read-only source directory does not stop
    // its own copy.
    for d in plan.dirs.iter().rev() {
        if let Some(m) = d.mode {
            fs::set_permissions(&d.dst, fs::Permissions::from_mode(m))
                .map_err(io_err("set the mode of", &d.dst))?;
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_copy_hashes_the_logical_content() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("s");
        let f = File::create(&src).unwrap();
        let size = 64 * CHUNK as u64 + 3;
        f.set_len(size).unwrap();
        f.write_all_at(&[1u8; 100], 7).unwrap();
        f.write_all_at(&[2u8; 10_000], 40 * CHUNK as u64 - 5)
            .unwrap();
        drop(f);
        let job = FileJob {
            src: src.clone(),
            dst: t.path().join("d"),
            len: size,
            mode: 0o640,
            mtime: None,
            link_id: None,
        };
        let done = std::sync::atomic::AtomicU64::new(0);
        let progress = |n: u64| {
            done.fetch_add(n, Ordering::Relaxed);
        };
        let c = copy_file(&job, true, &progress, &AtomicBool::new(false)).unwrap();
        let whole = fs::read(&src).unwrap();
        assert_eq!(c.hash, Some(xxhash_rust::xxh3::xxh3_64(&whole)));
        assert_eq!(c.size, size);
        assert!(c.data < size / 4, "{}", c.data);
        assert_eq!(done.load(Ordering::Relaxed), size);
        assert_eq!(fs::read(&job.dst).unwrap(), whole);
        let (sm, dm) = (fs::metadata(&src).unwrap(), fs::metadata(&job.dst).unwrap());
        assert!(
            dm.blocks() <= sm.blocks() + 16,
            "{} {}",
            dm.blocks(),
            sm.blocks()
        );
        let (n, h) = read_back(&job.dst, true, &|_| {}, &AtomicBool::new(false)).unwrap();
        assert_eq!((n < size / 4, h), (true, c.hash));
        // All holes, and empty.
        for len in [0, 5 * CHUNK as u64] {
            let f = File::create(&src).unwrap();
            f.set_len(len).unwrap();
            drop(f);
            let c = copy_file(&job, true, &|_| {}, &AtomicBool::new(false)).unwrap();
            assert_eq!(
                c.hash,
                Some(xxhash_rust::xxh3::xxh3_64(&vec![0u8; len as usize]))
            );
            assert_eq!(fs::metadata(&job.dst).unwrap().len(), len);
        }
    }
}
