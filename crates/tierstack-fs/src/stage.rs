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
//! Sparse files stay sparse: only the data regions the source reports (`SEEK_DATA` /
//! `SEEK_HOLE`) are read and written, and the copy is given the source's size, so its holes
//! stay holes. Files that the source holds as several hard links (same `st_dev`/`st_ino`,
//! `st_nlink > 1`) are copied once per stage; their other names become hard links to that copy
//! (made under a temporary name and renamed into place), or separate copies, reported, where
//! the destination refuses links. FIFOs, sockets and (as root) device nodes are recreated with
//! `mknodat` (their mode, owner when root, and modification time), never opened; one that
//! cannot be recreated is skipped and reported, and the stage goes on.
//!
//! With `verify`, each destination is read back after its rename and its xxh3-64 compared with
//! the xxh3-64 of the source's logical content (holes hashed as zeros) computed while copying.
//! With `read_back` (what `stage in` does), each destination is read back once so that a cache
//! in front of it (the tierstack mount) holds it when the job starts; a verified copy is read
//! back by the verification. Read-backs read the data regions only and hash holes as zeros.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
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
    /// The source's (`st_dev`, `st_ino`) when it has more than one hard link: names of one
    /// inode within a stage are copied once and linked.
    pub link_id: Option<(u64, u64)>,
}

/// A further name of a file already copied in this stage: a hard link to `target` (that
/// copy's destination), or a copy of `file.src` where the destination refuses the link.
#[derive(Debug, Clone)]
pub struct HardLinkJob {
    pub file: FileJob,
    pub target: PathBuf,
}

/// The kind of a special file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecialKind {
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl SpecialKind {
    fn of(ft: &fs::FileType) -> Option<SpecialKind> {
        if ft.is_fifo() {
            Some(SpecialKind::Fifo)
        } else if ft.is_socket() {
            Some(SpecialKind::Socket)
        } else if ft.is_char_device() {
            Some(SpecialKind::CharDevice)
        } else if ft.is_block_device() {
            Some(SpecialKind::BlockDevice)
        } else {
            None
        }
    }

    /// What it is called in messages.
    pub fn name(self) -> &'static str {
        match self {
            SpecialKind::Fifo => "FIFO",
            SpecialKind::Socket => "socket",
            SpecialKind::CharDevice => "character device",
            SpecialKind::BlockDevice => "block device",
        }
    }

    fn file_type(self) -> rustix::fs::FileType {
        match self {
            SpecialKind::Fifo => rustix::fs::FileType::Fifo,
            SpecialKind::Socket => rustix::fs::FileType::Socket,
            SpecialKind::CharDevice => rustix::fs::FileType::CharacterDevice,
            SpecialKind::BlockDevice => rustix::fs::FileType::BlockDevice,
        }
    }

    fn is_device(self) -> bool {
        matches!(self, SpecialKind::CharDevice | SpecialKind::BlockDevice)
    }
}

/// One FIFO, socket or device node to recreate (never opened, never copied as data).
#[derive(Debug, Clone)]
pub struct SpecialJob {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub kind: SpecialKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The device number of a device node.
    pub rdev: u64,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, i64),
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
    pub hardlinks: Vec<HardLinkJob>,
    pub specials: Vec<SpecialJob>,
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
    /// Bytes read back from the destinations (verification or cache fill); holes are not read.
    pub read_back_bytes: u64,
    /// Bytes of `bytes` left as holes (sparse files), neither read nor written.
    pub sparse_bytes: u64,
    /// Hard links created to files copied in this stage.
    pub hardlinks: u64,
    /// FIFOs, sockets and device nodes recreated.
    pub specials: u64,
    /// Source entries that could not be recreated (source path and why); the stage went on.
    pub skipped: Vec<Skipped>,
    /// Destinations that should have been hard links but were copied as separate files
    /// because the destination refused the link (destination path and why).
    pub hardlinks_copied: Vec<Skipped>,
}

/// A path and why it was not staged as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

// ---------------------------------------------------------------------------------------------
// Planning

/// Plans `SRC DST` given on the command line: a file is copied to DST (or into DST when DST is
/// an existing directory or ends with `/`); a directory's contents are copied into DST
/// (created if missing).
pub fn plan_paths(src: &Path, dst: &Path) -> Result<Plan, StageError> {
    let mut plan = Plan::default();
    add_entry(&mut plan, src, dst, has_trailing_slash(dst))?;
    group_hard_links(&mut plan);
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
            link_id: link_id(&meta),
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
                link_id: link_id(&meta),
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
        } else if let Some(kind) = SpecialKind::of(&ft) {
            if existing.as_ref().is_some_and(|x| x.is_dir()) {
                return Err(StageError::Refused(format!(
                    "destination {} is a directory where the source has a {}: remove it",
                    d.display(),
                    kind.name()
                )));
            }
            plan.specials.push(SpecialJob {
                src: s,
                dst: d,
                kind,
                mode: meta.mode() & 0o7777,
                uid: meta.uid(),
                gid: meta.gid(),
                rdev: meta.rdev(),
                mtime: (meta.mtime(), meta.mtime_nsec()),
            });
        } else {
            return Err(StageError::Refused(format!(
                "{} is not a regular file, directory or symbolic link (a device, FIFO or socket): remove it from the tree or stage with a manifest that leaves it out",
                s.display()
            )));
        }
    }
    Ok(())
}

/// The (`st_dev`, `st_ino`) of a file with more than one hard link.
fn link_id(meta: &fs::Metadata) -> Option<(u64, u64)> {
    (meta.nlink() > 1).then(|| (meta.dev(), meta.ino()))
}

/// Turns every further name (another source path) of an inode already planned into a hard
/// link to the first name's destination.
fn group_hard_links(plan: &mut Plan) {
    let mut first: HashMap<(u64, u64), usize> = HashMap::new();
    for f in std::mem::take(&mut plan.files) {
        if let Some(id) = f.link_id {
            match first.get(&id) {
                Some(&i) if plan.files[i].src != f.src => {
                    let target = plan.files[i].dst.clone();
                    plan.hardlinks.push(HardLinkJob { file: f, target });
                    continue;
                }
                Some(_) => {}
                None => {
                    first.insert(id, plan.files.len());
                }
            }
        }
        plan.files.push(f);
    }
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
        .chain(plan.links.iter().map(|l| l.dst.as_path()))
        .chain(plan.hardlinks.iter().map(|h| h.file.dst.as_path()))
        .chain(plan.specials.iter().map(|x| x.dst.as_path()));
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
        let before = (plan.files.len(), plan.links.len(), plan.specials.len());
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
        for x in &plan.specials[before.2..] {
            line_of.entry(x.dst.clone()).or_insert(line);
        }
    }
    group_hard_links(&mut plan);
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

/// Zeros hashed for the holes of sparse files.
static ZEROS: [u8; 1 << 16] = [0; 1 << 16];

/// Feeds `n` zero bytes (a hole) to `h`.
fn hash_zeros(h: &mut Xxh3, mut n: u64) {
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        h.update(&ZEROS[..k]);
        n -= k as u64;
    }
}

/// The next data region `[start, end)` of `f` at or after `from` and before `size`, as the
/// file system reports it (`SEEK_DATA`/`SEEK_HOLE`); `None` when only holes remain. A file
/// system that cannot tell has all of it as data.
fn next_data(f: &File, from: u64, size: u64) -> io::Result<Option<(u64, u64)>> {
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
fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
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
struct Scan {
    /// The file's size (data and holes).
    size: u64,
    /// Bytes read (the data regions).
    data: u64,
    /// xxh3-64 of the whole logical content (holes as zeros), if asked.
    hash: Option<u64>,
}

/// Reads the data regions of `f` up to its size at open, in chunks, handing each to `sink`
/// (offset, bytes); holes are skipped (hashed as zeros). A file that shrinks while it is read
/// is taken as holding zeros from where it ended.
fn scan(
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
fn copy_file(
    job: &FileJob,
    hash: bool,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &AtomicBool,
) -> Result<Scan, StageError> {
    let src = File::open(&job.src).map_err(io_err("open", &job.src))?;
    let tmp = tmp_name(&job.dst);
    let out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err("create", &tmp))?;
    let mut guard = TmpGuard(Some(tmp.clone()));
    let copied = scan(&src, &job.src, "read", hash, progress, cancel, |off, b| {
        out.write_all_at(b, off).map_err(io_err("write", &tmp))
    })?;
    // The size, so that trailing holes (and a source that shrank) read as zeros.
    out.set_len(copied.size)
        .map_err(io_err("set the size of", &tmp))?;
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
    Ok(copied)
}

/// Reads the data regions of `path` (holes hashed as zeros, not read); returns (bytes read,
/// xxh3 of the whole logical content if asked).
fn read_back(
    path: &Path,
    hash: bool,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &AtomicBool,
) -> Result<(u64, Option<u64>), StageError> {
    let f = File::open(path).map_err(io_err("read back", path))?;
    let r = scan(&f, path, "read back", hash, progress, cancel, |_, _| Ok(()))?;
    Ok((r.data, r.hash))
}

fn make_link(job: &LinkJob) -> Result<(), StageError> {
    let tmp = tmp_name(&job.dst);
    std::os::unix::fs::symlink(&job.target, &tmp).map_err(io_err("create the link", &tmp))?;
    let mut guard = TmpGuard(Some(tmp.clone()));
    fs::rename(&tmp, &job.dst).map_err(io_err("rename into place", &job.dst))?;
    guard.0 = None;
    Ok(())
}

/// What copying one file (and reading it back) did.
#[derive(Default)]
struct Copy {
    bytes: u64,
    sparse: u64,
    read_back: u64,
    verified: bool,
}

/// Copies one file and, as asked, reads it back and compares checksums.
fn copy_one(
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

fn add_copy(report: &mut Report, c: &Copy) {
    report.files += 1;
    report.bytes += c.bytes;
    report.sparse_bytes += c.sparse;
    report.read_back_bytes += c.read_back;
    report.verified += u64::from(c.verified);
}

/// Errors of `link(2)` that mean the destination does not take (this) hard link.
fn link_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EPERM
                | libc::EXDEV
                | libc::EMLINK
                | libc::EOPNOTSUPP
                | libc::ENOSYS
                | libc::EINVAL
        )
    )
}

/// Makes `job.file.dst` a hard link to `target` (under a temporary name, renamed into
/// place). `Ok(Err(reason))` when the destination refuses the link.
fn make_hard_link(
    job: &HardLinkJob,
    target: &Path,
    verify: bool,
) -> Result<Result<(), String>, StageError> {
    let dst = &job.file.dst;
    let tmp = tmp_name(dst);
    if let Err(e) = fs::hard_link(target, &tmp) {
        if link_refused(&e) {
            return Ok(Err(format!(
                "the destination refused a hard link to {} ({e}): copied as a separate file",
                target.display()
            )));
        }
        return Err(io_err("create the hard link", &tmp)(e));
    }
    let mut guard = TmpGuard(Some(tmp.clone()));
    fs::rename(&tmp, dst).map_err(io_err("rename into place", dst))?;
    guard.0 = None;
    if verify {
        let a = fs::symlink_metadata(target).map_err(io_err("read back", target))?;
        let b = fs::symlink_metadata(dst).map_err(io_err("read back", dst))?;
        if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
            return Err(StageError::Refused(format!(
                "verify failed for the hard link {}: it is not the same file as {}; run the stage again",
                dst.display(),
                target.display()
            )));
        }
    }
    Ok(Ok(()))
}

/// Recreates a FIFO, socket or device node under a temporary name (mode, owner when root,
/// modification time) and renames it into place; never opens it. `Err(reason)` when it cannot
/// be recreated (nothing is left behind).
fn make_special(job: &SpecialJob, root: bool) -> Result<(), String> {
    use rustix::fs::{AtFlags, Gid, Mode, Timespec, Timestamps, Uid, CWD, UTIME_OMIT};
    let kind = job.kind.name();
    if job.kind.is_device() && !root {
        return Err(format!(
            "a {kind} ({}:{}) can only be recreated by root: stage as root to recreate it",
            rustix::fs::major(job.rdev),
            rustix::fs::minor(job.rdev)
        ));
    }
    let tmp = tmp_name(&job.dst);
    rustix::fs::mknodat(
        CWD,
        &tmp,
        job.kind.file_type(),
        Mode::from_raw_mode(0o600),
        job.rdev,
    )
    .map_err(|e| {
        let e = io::Error::from(e);
        format!("the destination refused to create the {kind} (mknod: {e})")
    })?;
    let mut guard = TmpGuard(Some(tmp.clone()));
    if root {
        rustix::fs::chownat(
            CWD,
            &tmp,
            Some(Uid::from_raw(job.uid)),
            Some(Gid::from_raw(job.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| {
            format!(
                "cannot give the {kind} its owner {}:{} ({})",
                job.uid,
                job.gid,
                io::Error::from(e)
            )
        })?;
    }
    // After the owner: chown clears set-ID bits. The mode of mknod is cut by the umask.
    rustix::fs::chmodat(CWD, &tmp, Mode::from_raw_mode(job.mode), AtFlags::empty()).map_err(
        |e| {
            format!(
                "cannot give the {kind} its mode {:o} ({})",
                job.mode,
                io::Error::from(e)
            )
        },
    )?;
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: job.mtime.0,
            tv_nsec: job.mtime.1,
        },
    };
    rustix::fs::utimensat(CWD, &tmp, &times, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| {
        format!(
            "cannot set the modification time of the {kind} ({})",
            io::Error::from(e)
        )
    })?;
    fs::rename(&tmp, &job.dst).map_err(|e| format!("cannot rename the {kind} into place ({e})"))?;
    guard.0 = None;
    Ok(())
}

/// Checks that `job.dst` is a special file of the source's kind, permission bits and (device
/// nodes) device number. (Set-ID bits are not compared: the kernel may drop them for a user
/// outside the node's group, and they mean nothing on these files.)
fn verify_special(job: &SpecialJob) -> Result<(), StageError> {
    let m = fs::symlink_metadata(&job.dst).map_err(io_err("read back", &job.dst))?;
    let same = SpecialKind::of(&m.file_type()) == Some(job.kind)
        && m.mode() & 0o1777 == job.mode & 0o1777
        && (!job.kind.is_device() || m.rdev() == job.rdev);
    if same {
        Ok(())
    } else {
        Err(StageError::Refused(format!(
            "verify failed for {}: it is not a {} with mode {:o} like its source; run the stage again",
            job.dst.display(),
            job.kind.name(),
            job.mode
        )))
    }
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
        let done = AtomicU64::new(0);
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

    #[test]
    fn plans_hard_links_and_special_files() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("a"), b"x").unwrap();
        fs::hard_link(src.join("a"), src.join("b")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            src.join("p"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let dst = t.path().join("dst");
        let plan = plan_paths(&src, &dst).unwrap();
        assert_eq!(plan.files.len(), 1);
        assert_eq!(plan.hardlinks.len(), 1);
        assert_eq!(plan.hardlinks[0].target, dst.join("a"));
        assert_eq!(plan.specials.len(), 1);
        assert_eq!(plan.specials[0].kind, SpecialKind::Fifo);
        let opts = Options {
            jobs: 2,
            verify: true,
            read_back: false,
        };
        let r = execute(&plan, &opts, &|_| {}, &AtomicBool::new(false)).unwrap();
        assert_eq!((r.files, r.hardlinks, r.specials), (1, 1, 1));
        assert!(r.skipped.is_empty() && r.hardlinks_copied.is_empty());
        // The same source named twice in a manifest is copied twice, not linked.
        let plan = plan_manifest(&src, &dst, "a x\na y\nb z\n").unwrap();
        assert_eq!((plan.files.len(), plan.hardlinks.len()), (2, 1));
        // A FIFO (in a tree) and a file writing one destination.
        let e = plan_manifest(&src, &dst, ". t\na t/p\n").unwrap_err();
        assert!(e.to_string().contains("written twice"), "{e}");
    }
}
