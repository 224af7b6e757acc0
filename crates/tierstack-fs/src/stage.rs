//! The stager: parallel copies into and out of a mount (`tierstack stage`).
//!
//! A stage is planned completely before anything is written: the source tree is walked, every
//! manifest line is checked (relative, stays under its root, no symlink leading out of it, no
//! two lines writing the same destination), and only a plan that passes all checks is carried
//! out. Nothing is copied when any check fails.
//!
//! Each file is copied to a temporary name in its destination directory
//! (`.NAME.tierstack-stage-PID-N`), given the source's mode and modification time, fsynced and
//! renamed into place, so a destination never shows a half-written file. Symbolic links inside
//! a copied tree are copied as links (never followed); links are created under a temporary
//! name and renamed too. Directories get their source mode at the end.
//!
//! With `verify`, each destination is read back after its rename and its xxh3-64 compared with
//! the xxh3-64 of the source bytes computed while copying. With `read_back` (what `stage in`
//! does), each destination is read back once so that a cache in front of it (the tierstack
//! mount) holds it when the job starts; a verified copy is read back by the verification.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use xxhash_rust::xxh3::Xxh3;

/// Size of one read or write of a copy.
pub const CHUNK: usize = 1 << 20;

/// What can go wrong while planning or carrying out a stage.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// An I/O call failed on a path.
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Input that the stager refuses; the message names the problem and the fix.
    #[error("{0}")]
    Refused(String),
    /// A manifest line that the stager refuses (and how many other lines were refused too).
    #[error("manifest line {line}: {msg}{}", if *others > 0 { format!(" ({others} more line(s) refused too)") } else { String::new() })]
    Manifest {
        line: usize,
        msg: String,
        others: usize,
    },
    /// A destination whose checksum differs from its source's.
    #[error("verify failed for {}: xxh3 {got:016x} differs from the source's {want:016x}: the destination was changed while it was copied or the storage returns wrong data; run the stage again", dst.display())]
    Verify { dst: PathBuf, want: u64, got: u64 },
    /// The caller asked to stop.
    #[error(
        "interrupted: files already renamed into place are complete, nothing half-written was left"
    )]
    Cancelled,
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StageError + 'a {
    move |source| StageError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// One regular file to copy.
#[derive(Debug, Clone)]
pub struct FileJob {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub len: u64,
    pub mode: u32,
    pub mtime: Option<SystemTime>,
}

/// One directory to create (and give `mode` at the end).
#[derive(Debug, Clone)]
pub struct DirJob {
    pub dst: PathBuf,
    pub mode: Option<u32>,
}

/// One symbolic link to recreate (its target copied as is).
#[derive(Debug, Clone)]
pub struct LinkJob {
    pub target: PathBuf,
    pub dst: PathBuf,
}

/// Everything a stage will do, checked before anything is written.
#[derive(Debug, Default, Clone)]
pub struct Plan {
    pub dirs: Vec<DirJob>,
    pub files: Vec<FileJob>,
    pub links: Vec<LinkJob>,
}

impl Plan {
    /// Bytes of file data to copy.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }
}

/// How to carry out a plan.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Files copied at the same time (at least 1).
    pub jobs: usize,
    /// Read each destination back and compare its xxh3 with the source's.
    pub verify: bool,
    /// Read each destination back once (fills a cache in front of it).
    pub read_back: bool,
}

/// What a stage did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub files: u64,
    pub bytes: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Files whose checksums were compared (and matched).
    pub verified: u64,
    /// Bytes read back from the destinations (verification or cache fill).
    pub read_back_bytes: u64,
}

// ---------------------------------------------------------------------------------------------
// Planning

/// Plans `SRC DST` given on the command line: a file is copied to DST (or into DST when DST is
/// an existing directory or ends with `/`); a directory's contents are copied into DST
/// (created if missing).
pub fn plan_paths(src: &Path, dst: &Path) -> Result<Plan, StageError> {
    let mut plan = Plan::default();
    add_entry(&mut plan, src, dst, has_trailing_slash(dst))?;
    check_duplicates(&plan, |_| None)?;
    Ok(plan)
}

fn has_trailing_slash(p: &Path) -> bool {
    p.as_os_str().as_encoded_bytes().last() == Some(&b'/')
}

/// Adds one source (file, directory tree or, at the top, a link followed to what it names) to
/// the plan.
fn add_entry(plan: &mut Plan, src: &Path, dst: &Path, dst_is_dir: bool) -> Result<(), StageError> {
    let meta = match fs::metadata(src) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(StageError::Refused(format!(
                "source {} does not exist: check the path",
                src.display()
            )))
        }
        Err(e) => return Err(io_err("read", src)(e)),
    };
    if meta.is_dir() {
        check_dst_dir(dst)?;
        if let (Ok(cs), Ok(cd)) = (fs::canonicalize(src), canonical_prefix(dst)) {
            if cd.starts_with(&cs) {
                return Err(StageError::Refused(format!(
                    "destination {} is inside the source directory {}: give a destination outside it",
                    dst.display(),
                    src.display()
                )));
            }
        }
        plan.dirs.push(DirJob {
            dst: dst.to_path_buf(),
            mode: Some(meta.permissions().mode() & 0o7777),
        });
        walk(plan, src, dst)
    } else if meta.is_file() {
        let into = dst_is_dir
            || fs::symlink_metadata(dst)
                .map(|m| m.is_dir())
                .unwrap_or(false);
        let dst = if into {
            check_dst_dir(dst)?;
            let name = src.file_name().ok_or_else(|| {
                StageError::Refused(format!(
                    "source {} has no file name: name the file, not '..' or '/'",
                    src.display()
                ))
            })?;
            dst.join(name)
        } else {
            dst.to_path_buf()
        };
        check_dst_file(&dst)?;
        if let Some(parent) = dst.parent().filter(|p| !p.as_os_str().is_empty()) {
            check_dst_dir(parent)?;
            plan.dirs.push(DirJob {
                dst: parent.to_path_buf(),
                mode: None,
            });
        }
        plan.files.push(FileJob {
            src: src.to_path_buf(),
            dst,
            len: meta.len(),
            mode: meta.permissions().mode() & 0o7777,
            mtime: meta.modified().ok(),
        });
        Ok(())
    } else {
        Err(StageError::Refused(format!(
            "source {} is not a regular file or directory: stage files and directory trees only",
            src.display()
        )))
    }
}

/// The canonical form of the deepest existing ancestor of `p`, with the rest appended.
fn canonical_prefix(p: &Path) -> io::Result<PathBuf> {
    let mut rest = Vec::new();
    let mut cur = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    loop {
        match fs::canonicalize(&cur) {
            Ok(mut c) => {
                for r in rest.iter().rev() {
                    c.push(r);
                }
                return Ok(c);
            }
            Err(_) => {
                let name = cur.file_name().map(|n| n.to_os_string());
                match (name, cur.parent()) {
                    (Some(n), Some(par)) => {
                        rest.push(n);
                        cur = par.to_path_buf();
                    }
                    _ => return Ok(cur),
                }
            }
        }
    }
}

/// A destination directory must be a directory (or not exist yet), never a symlink.
fn check_dst_dir(d: &Path) -> Result<(), StageError> {
    match fs::symlink_metadata(d) {
        Ok(m) if m.file_type().is_symlink() => {
            // A symlink given as the top destination on the command line is followed if it
            // names a directory; inside a tree it is refused by the walker.
            match fs::metadata(d) {
                Ok(t) if t.is_dir() => Ok(()),
                _ => Err(StageError::Refused(format!(
                    "destination {} is a symbolic link that does not lead to a directory: give a directory",
                    d.display()
                ))),
            }
        }
        Ok(m) if !m.is_dir() => Err(StageError::Refused(format!(
            "destination {} exists and is not a directory: remove it or give another destination",
            d.display()
        ))),
        _ => Ok(()),
    }
}

/// A destination file may be replaced, but not if it is a directory.
fn check_dst_file(f: &Path) -> Result<(), StageError> {
    match fs::symlink_metadata(f) {
        Ok(m) if m.is_dir() => Err(StageError::Refused(format!(
            "destination {} is a directory but its source is a file: give a file name or remove the directory",
            f.display()
        ))),
        _ => Ok(()),
    }
}

/// Walks the directory `src` (not following symlinks) and plans its contents into `dst`.
fn walk(plan: &mut Plan, src: &Path, dst: &Path) -> Result<(), StageError> {
    let mut entries: Vec<_> = fs::read_dir(src)
        .map_err(io_err("read the directory", src))?
        .collect::<Result<_, _>>()
        .map_err(io_err("read the directory", src))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let s = e.path();
        let d = dst.join(e.file_name());
        let meta = fs::symlink_metadata(&s).map_err(io_err("read", &s))?;
        let ft = meta.file_type();
        let existing = fs::symlink_metadata(&d).ok();
        if ft.is_dir() {
            if let Some(x) = &existing {
                if !x.is_dir() {
                    return Err(StageError::Refused(format!(
                        "destination {} exists and is not a directory (a symbolic link or a file) where the source has a directory: remove it",
                        d.display()
                    )));
                }
            }
            plan.dirs.push(DirJob {
                dst: d.clone(),
                mode: Some(meta.permissions().mode() & 0o7777),
            });
            walk(plan, &s, &d)?;
        } else if ft.is_file() {
            if existing.as_ref().is_some_and(|x| x.is_dir()) {
                return Err(StageError::Refused(format!(
                    "destination {} is a directory where the source has a file: remove it",
                    d.display()
                )));
            }
            plan.files.push(FileJob {
                src: s,
                dst: d,
                len: meta.len(),
                mode: meta.permissions().mode() & 0o7777,
                mtime: meta.modified().ok(),
            });
        } else if ft.is_symlink() {
            if existing.as_ref().is_some_and(|x| x.is_dir()) {
                return Err(StageError::Refused(format!(
                    "destination {} is a directory where the source has a symbolic link: remove it",
                    d.display()
                )));
            }
            let target = fs::read_link(&s).map_err(io_err("read the link", &s))?;
            plan.links.push(LinkJob { target, dst: d });
        } else {
            return Err(StageError::Refused(format!(
                "{} is not a regular file, directory or symbolic link (a device, FIFO or socket): remove it from the tree or stage with a manifest that leaves it out",
                s.display()
            )));
        }
    }
    Ok(())
}

/// Refuses a plan in which two entries write the same destination. `line_of` names the
/// manifest line of a destination, where there is one.
fn check_duplicates(
    plan: &Plan,
    line_of: impl Fn(&Path) -> Option<usize>,
) -> Result<(), StageError> {
    let mut seen: HashMap<&Path, ()> = HashMap::new();
    let all = plan
        .files
        .iter()
        .map(|f| f.dst.as_path())
        .chain(plan.links.iter().map(|l| l.dst.as_path()));
    for d in all {
        if seen.insert(d, ()).is_some() {
            let at = line_of(d)
                .map(|l| format!(" (manifest line {l})"))
                .unwrap_or_default();
            return Err(StageError::Refused(format!(
                "destination {} is written twice{at}: keep one source for it",
                d.display()
            )));
        }
    }
    Ok(())
}

/// One parsed manifest line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestLine {
    pub line: usize,
    pub src: String,
    pub dst: String,
}

/// Parses a manifest: one `SRC DST` pair per line, separated by white space; a field holding
/// white space is written in double quotes (`\"` and `\\` inside them); a line with one field
/// copies that path to the same relative path; `#` starts a comment (outside quotes); blank
/// lines are skipped.
pub fn parse_manifest(text: &str) -> Result<Vec<ManifestLine>, StageError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let fields = split_fields(raw).map_err(|msg| StageError::Manifest {
            line,
            msg,
            others: 0,
        })?;
        match fields.len() {
            0 => {}
            1 => out.push(ManifestLine {
                line,
                src: fields[0].clone(),
                dst: fields[0].clone(),
            }),
            2 => out.push(ManifestLine {
                line,
                src: fields[0].clone(),
                dst: fields[1].clone(),
            }),
            n => {
                return Err(StageError::Manifest {
                    line,
                    msg: format!(
                        "{n} fields: write `SRC DST` (quote a path that holds spaces: \"my file\")"
                    ),
                    others: 0,
                })
            }
        }
    }
    Ok(out)
}

fn split_fields(raw: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut chars = raw.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.peek() {
            None | Some('#') => break,
            Some('"') => {
                chars.next();
                let mut f = String::new();
                loop {
                    match chars.next() {
                        None => {
                            return Err(
                                "a quoted path has no closing '\"': close the quotes".to_string()
                            )
                        }
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => f.push(c),
                            None => {
                                return Err(
                                    "a quoted path ends with '\\': close the quotes".to_string()
                                )
                            }
                        },
                        Some(c) => f.push(c),
                    }
                }
                if chars.peek().is_some_and(|c| !c.is_whitespace()) {
                    return Err(
                        "text right after a closing '\"': separate the fields with a space"
                            .to_string(),
                    );
                }
                if f.is_empty() {
                    return Err("an empty path \"\": write `.` for the root itself".to_string());
                }
                fields.push(f);
            }
            Some(_) => {
                let mut f = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() {
                        break;
                    }
                    f.push(c);
                    chars.next();
                }
                fields.push(f);
            }
        }
    }
    Ok(fields)
}

/// Checks a manifest path lexically: relative, and its `..` never leave the root. Returns the
/// normalised relative path (empty for the root itself).
fn check_relative(p: &str, side: &str, root: &Path) -> Result<PathBuf, String> {
    let path = Path::new(p);
    if path.is_absolute() {
        return Err(format!(
            "{side} path '{p}' is absolute: manifest paths are relative to the {side} root {}; write it relative to that root",
            root.display()
        ));
    }
    let mut out = PathBuf::new();
    let mut depth = 0usize;
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if depth == 0 {
                    return Err(format!(
                        "{side} path '{p}' escapes the {side} root {} with '..': manifest paths must stay under their root; stage from a higher root instead",
                        root.display()
                    ));
                }
                depth -= 1;
                out.pop();
            }
            Component::Normal(x) => {
                depth += 1;
                out.push(x);
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "{side} path '{p}' is absolute: write it relative to the {side} root {}",
                    root.display()
                ))
            }
        }
    }
    Ok(out)
}

/// Follows the existing part of `root/rel` and refuses it if a symbolic link leads out of the
/// (canonical) root.
fn check_inside(
    root_canon: &Path,
    root: &Path,
    rel: &Path,
    side: &str,
    p: &str,
) -> Result<(), String> {
    let mut cur = root.to_path_buf();
    for c in rel.components() {
        cur.push(c);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                let real = fs::canonicalize(&cur).map_err(|e| {
                    format!(
                        "{side} path '{p}': the symbolic link {} cannot be followed ({e}): fix or remove the link",
                        cur.display()
                    )
                })?;
                if !real.starts_with(root_canon) {
                    return Err(format!(
                        "{side} path '{p}' goes through the symbolic link {} to {}, outside the {side} root {}: stage the real path under a root that holds it",
                        cur.display(),
                        real.display(),
                        root.display()
                    ));
                }
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    Ok(())
}

/// Plans a manifest: each line's SRC is resolved against `src_root` and its DST against
/// `dst_root`. Every line is checked before anything is planned; the first refusal is
/// returned (with how many other lines were refused).
pub fn plan_manifest(src_root: &Path, dst_root: &Path, text: &str) -> Result<Plan, StageError> {
    let lines = parse_manifest(text)?;
    if lines.is_empty() {
        return Err(StageError::Refused(
            "the manifest lists nothing to copy: write one `SRC DST` line per file or directory"
                .to_string(),
        ));
    }
    match fs::metadata(src_root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(StageError::Refused(format!(
                "with --manifest, SRC {} must be a directory (the root the manifest's sources are relative to)",
                src_root.display()
            )))
        }
        Err(_) => {
            return Err(StageError::Refused(format!(
                "source root {} does not exist: check the path",
                src_root.display()
            )))
        }
    }
    check_dst_dir(dst_root)?;
    let src_canon = fs::canonicalize(src_root).map_err(io_err("resolve", src_root))?;
    let dst_canon = canonical_prefix(dst_root).map_err(io_err("resolve", dst_root))?;

    let mut resolved = Vec::new();
    let mut first: Option<(usize, String)> = None;
    let mut refused = 0usize;
    for l in &lines {
        let check = || -> Result<(PathBuf, PathBuf, bool), String> {
            let s = check_relative(&l.src, "source", src_root)?;
            let d = check_relative(&l.dst, "destination", dst_root)?;
            check_inside(&src_canon, src_root, &s, "source", &l.src)?;
            check_inside(&dst_canon, dst_root, &d, "destination", &l.dst)?;
            let sp = src_root.join(&s);
            if fs::symlink_metadata(&sp).is_err() {
                return Err(format!(
                    "source '{}' does not exist under {}: fix the line or the source root",
                    l.src,
                    src_root.display()
                ));
            }
            let into = l.dst.ends_with('/') || d.as_os_str().is_empty();
            Ok((sp, dst_root.join(&d), into))
        };
        match check() {
            Ok(r) => resolved.push((l.line, r)),
            Err(msg) => {
                refused += 1;
                if first.is_none() {
                    first = Some((l.line, msg));
                }
            }
        }
    }
    if let Some((line, msg)) = first {
        return Err(StageError::Manifest {
            line,
            msg,
            others: refused - 1,
        });
    }
    let mut plan = Plan::default();
    let mut line_of: HashMap<PathBuf, usize> = HashMap::new();
    for (line, (sp, dp, into)) in resolved {
        let before = (plan.files.len(), plan.links.len());
        add_entry(&mut plan, &sp, &dp, into).map_err(|e| match e {
            StageError::Refused(msg) => StageError::Manifest {
                line,
                msg,
                others: 0,
            },
            o => o,
        })?;
        for f in &plan.files[before.0..] {
            line_of.entry(f.dst.clone()).or_insert(line);
        }
        for l in &plan.links[before.1..] {
            line_of.entry(l.dst.clone()).or_insert(line);
        }
    }
    check_duplicates(&plan, |d| line_of.get(d).copied())?;
    Ok(plan)
}

// ---------------------------------------------------------------------------------------------
// Carrying out a plan

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

fn tmp_name(dst: &Path) -> PathBuf {
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Keep the name within NAME_MAX.
    let short: String = name.chars().take(160).collect();
    let n = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let file = format!(".{short}.tierstack-stage-{}-{n}", std::process::id());
    match dst.parent() {
        Some(p) => p.join(file),
        None => PathBuf::from(file),
    }
}

/// Removes a temporary file unless disarmed.
struct TmpGuard(Option<PathBuf>);

impl Drop for TmpGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

fn copy_file(
    job: &FileJob,
    hash: bool,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &AtomicBool,
) -> Result<Option<u64>, StageError> {
    let mut src = File::open(&job.src).map_err(io_err("open", &job.src))?;
    let tmp = tmp_name(&job.dst);
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err("create", &tmp))?;
    let mut guard = TmpGuard(Some(tmp.clone()));
    let mut hasher = hash.then(Xxh3::new);
    let mut buf = vec![0u8; CHUNK];
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(StageError::Cancelled);
        }
        let n = read_full(&mut src, &mut buf).map_err(io_err("read", &job.src))?;
        if n == 0 {
            break;
        }
        if let Some(h) = hasher.as_mut() {
            h.update(&buf[..n]);
        }
        out.write_all(&buf[..n]).map_err(io_err("write", &tmp))?;
        progress(n as u64);
    }
    out.set_permissions(fs::Permissions::from_mode(job.mode))
        .map_err(io_err("set the mode of", &tmp))?;
    if let Some(t) = job.mtime {
        out.set_modified(t)
            .map_err(io_err("set the modification time of", &tmp))?;
    }
    out.sync_all().map_err(io_err("fsync", &tmp))?;
    drop(out);
    fs::rename(&tmp, &job.dst).map_err(io_err("rename into place", &job.dst))?;
    guard.0 = None;
    Ok(hasher.map(|h| h.digest()))
}

/// Reads until `buf` is full or the end of the file.
fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Reads `path` to its end; returns (bytes, xxh3 if asked).
fn read_back(
    path: &Path,
    hash: bool,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &AtomicBool,
) -> Result<(u64, Option<u64>), StageError> {
    let mut f = File::open(path).map_err(io_err("read back", path))?;
    let mut hasher = hash.then(Xxh3::new);
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(StageError::Cancelled);
        }
        let n = read_full(&mut f, &mut buf).map_err(io_err("read back", path))?;
        if n == 0 {
            break;
        }
        if let Some(h) = hasher.as_mut() {
            h.update(&buf[..n]);
        }
        total += n as u64;
        progress(n as u64);
    }
    Ok((total, hasher.map(|h| h.digest())))
}

fn make_link(job: &LinkJob) -> Result<(), StageError> {
    let tmp = tmp_name(&job.dst);
    std::os::unix::fs::symlink(&job.target, &tmp).map_err(io_err("create the link", &tmp))?;
    let mut guard = TmpGuard(Some(tmp.clone()));
    fs::rename(&tmp, &job.dst).map_err(io_err("rename into place", &job.dst))?;
    guard.0 = None;
    Ok(())
}

/// Carries out a plan with `opts.jobs` threads. `progress` is called with each run of bytes
/// copied or read back; setting `cancel` stops the copy at the next chunk.
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
    let stop = AtomicBool::new(false);
    let files = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let verified = AtomicU64::new(0);
    let read_bytes = AtomicU64::new(0);
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
                let want = match copy_file(job, opts.verify, progress, cancel) {
                    Ok(h) => h,
                    Err(e) => {
                        halt(e);
                        return;
                    }
                };
                files.fetch_add(1, Ordering::Relaxed);
                bytes.fetch_add(job.len, Ordering::Relaxed);
                if opts.verify || opts.read_back {
                    match read_back(&job.dst, opts.verify, progress, cancel) {
                        Ok((n, got)) => {
                            read_bytes.fetch_add(n, Ordering::Relaxed);
                            if let (Some(w), Some(g)) = (want, got) {
                                if w != g {
                                    halt(StageError::Verify {
                                        dst: job.dst.clone(),
                                        want: w,
                                        got: g,
                                    });
                                    return;
                                }
                                verified.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            halt(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    report.files = files.into_inner();
    report.bytes = bytes.into_inner();
    report.verified = verified.into_inner();
    report.read_back_bytes = read_bytes.into_inner();
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
    fn parses_fields_quotes_and_comments() {
        let m = parse_manifest(
            "# inputs\n\n a.dat  b.dat \n\"with space\" out/x # trailing\nsame\n\"q\\\"d\" d\n",
        )
        .unwrap();
        assert_eq!(
            m,
            vec![
                ManifestLine {
                    line: 3,
                    src: "a.dat".into(),
                    dst: "b.dat".into()
                },
                ManifestLine {
                    line: 4,
                    src: "with space".into(),
                    dst: "out/x".into()
                },
                ManifestLine {
                    line: 5,
                    src: "same".into(),
                    dst: "same".into()
                },
                ManifestLine {
                    line: 6,
                    src: "q\"d".into(),
                    dst: "d".into()
                },
            ]
        );
        assert!(parse_manifest("a b c\n").is_err());
        assert!(parse_manifest("\"open b\n").is_err());
    }

    #[test]
    fn relative_paths_stay_under_their_root() {
        let r = Path::new("/root");
        assert_eq!(
            check_relative("a/../b", "source", r).unwrap(),
            PathBuf::from("b")
        );
        assert_eq!(
            check_relative("./a/./c", "source", r).unwrap(),
            PathBuf::from("a/c")
        );
        assert_eq!(check_relative(".", "source", r).unwrap(), PathBuf::new());
        assert!(check_relative("../x", "source", r).is_err());
        assert!(check_relative("a/../../x", "source", r).is_err());
        assert!(check_relative("/etc/passwd", "source", r).is_err());
    }

    #[test]
    fn copies_a_tree_and_refuses_escapes() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("a"), b"hello").unwrap();
        fs::write(src.join("sub/b"), vec![7u8; 3 * CHUNK + 5]).unwrap();
        std::os::unix::fs::symlink("a", src.join("ln")).unwrap();
        let dst = t.path().join("dst");
        let plan = plan_paths(&src, &dst).unwrap();
        let opts = Options {
            jobs: 3,
            verify: true,
            read_back: false,
        };
        let r = execute(&plan, &opts, &|_| {}, &AtomicBool::new(false)).unwrap();
        assert_eq!(r.files, 2);
        assert_eq!(r.verified, 2);
        assert_eq!(r.symlinks, 1);
        assert_eq!(
            fs::read(dst.join("sub/b")).unwrap(),
            vec![7u8; 3 * CHUNK + 5]
        );
        assert_eq!(fs::read_link(dst.join("ln")).unwrap(), PathBuf::from("a"));
        // No temporary names left.
        for e in fs::read_dir(&dst).unwrap() {
            let n = e.unwrap().file_name();
            assert!(!n.to_string_lossy().contains("tierstack-stage"), "{n:?}");
        }
        // Into itself.
        assert!(plan_paths(&src, &src.join("sub/x")).is_err());
        // A manifest symlink out of the root.
        std::os::unix::fs::symlink(t.path(), src.join("out")).unwrap();
        let e = plan_manifest(&src, &dst, "a a\nout/dst/sub/b x\n").unwrap_err();
        assert!(
            e.to_string().contains("manifest line 2") && e.to_string().contains("symbolic link"),
            "{e}"
        );
        // Duplicate destinations.
        let e = plan_manifest(&src, &dst, "a x\nsub/b x\n").unwrap_err();
        assert!(e.to_string().contains("written twice"), "{e}");
    }
}
