//! tierstack-stage: the stager, planned parallel copies into and out of a mount (`tierstack stage`).
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
//!
//! The parts, by job: this file holds the plan's types, the options, the report and the
//! errors; `plan.rs` plans SRC DST paths (the walk, hard-link groups, destination checks);
//! `manifest.rs` parses a manifest and plans from it; `copy.rs` executes a plan (the
//! workers, sparse copies, hashing, read-back); `special.rs` makes hard links and special
//! files.

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use tierstack_common::{io_err, PathIoError};

mod copy;
pub mod fanout;
mod manifest;
mod plan;
mod special;

pub use copy::execute;
pub use manifest::{parse_manifest, plan_manifest, ManifestLine};
pub use plan::plan_paths;

/// Size of one read or write of a copy.
pub const CHUNK: usize = 1 << 20;

/// What can go wrong while planning or carrying out a stage.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// An I/O call failed on a path: `cannot {what} {path}: {error}`.
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// Input that the stager refuses; the message names the problem and the fix.
    #[error("{0}")]
    Refused(String),
    /// A manifest line that the stager refuses (and how many other lines were refused too).
    #[error("manifest line {line}: {msg}{}", if *others > 0 { format!(" ({others} more line(s) refused too)") } else { String::new() })]
    Manifest {
        /// The first refused line's number, from 1.
        line: usize,
        /// What is wrong with it.
        msg: String,
        /// How many further lines were refused.
        others: usize,
    },
    /// A destination whose checksum differs from its source's.
    #[error("verify failed for {}: xxh3 {got:016x} differs from the source's {want:016x}: the destination was changed while it was copied or the storage returns wrong data; run the stage again", dst.display())]
    Verify {
        /// The destination file.
        dst: PathBuf,
        /// The xxh3-64 of the source's contents.
        want: u64,
        /// The xxh3-64 read back from the destination.
        got: u64,
    },
    /// The caller asked to stop.
    #[error(
        "interrupted: files already renamed into place are complete, nothing half-written was left"
    )]
    Cancelled,
}

/// One regular file to copy.
#[derive(Debug, Clone)]
pub struct FileJob {
    /// The source file.
    pub src: PathBuf,
    /// Where the copy goes.
    pub dst: PathBuf,
    /// The source's size in bytes when planned.
    pub len: u64,
    /// Permission, set-ID and sticky bits the copy gets (the source's).
    pub mode: u32,
    /// Modification time the copy gets (None: left as the copy made it).
    pub mtime: Option<SystemTime>,
    /// The source's (`st_dev`, `st_ino`) when it has more than one hard link: names of one
    /// inode within a stage are copied once and linked.
    pub link_id: Option<(u64, u64)>,
}

/// A further name of a file already copied in this stage: a hard link to `target` (that
/// copy's destination), or a copy of `file.src` where the destination refuses the link.
#[derive(Debug, Clone)]
pub struct HardLinkJob {
    /// The further name as a file job: its source, and its destination (the link's name).
    pub file: FileJob,
    /// The destination of the copy already made of the same inode.
    pub target: PathBuf,
}

/// The kind of a special file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecialKind {
    /// A named pipe.
    Fifo,
    /// A Unix domain socket.
    Socket,
    /// A character device node (recreated only as root).
    CharDevice,
    /// A block device node (recreated only as root).
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
    /// The source node.
    pub src: PathBuf,
    /// Where it is recreated.
    pub dst: PathBuf,
    /// What kind of node it is.
    pub kind: SpecialKind,
    /// Permission, set-ID and sticky bits (the source's).
    pub mode: u32,
    /// The source's owner (given to the new node only when running as root).
    pub uid: u32,
    /// The source's group (given to the new node only when running as root).
    pub gid: u32,
    /// The device number of a device node.
    pub rdev: u64,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, i64),
}

/// One directory to create (and give `mode` at the end).
#[derive(Debug, Clone)]
pub struct DirJob {
    /// The directory to create (with its missing parents).
    pub dst: PathBuf,
    /// Permission bits to give it at the end (None: leave it as created, e.g. the parent of
    /// a single file's destination).
    pub mode: Option<u32>,
}

/// One symbolic link to recreate (its target copied as is).
#[derive(Debug, Clone)]
pub struct LinkJob {
    /// The link's target, as the source link holds it.
    pub target: PathBuf,
    /// Where the link is created.
    pub dst: PathBuf,
}

/// Everything a stage will do, checked before anything is written.
#[derive(Debug, Default, Clone)]
pub struct Plan {
    /// Directories to create.
    pub dirs: Vec<DirJob>,
    /// Regular files to copy (one per inode with several hard links).
    pub files: Vec<FileJob>,
    /// Symbolic links to recreate.
    pub links: Vec<LinkJob>,
    /// Further names of files in `files`, made as hard links.
    pub hardlinks: Vec<HardLinkJob>,
    /// FIFOs, sockets and device nodes to recreate.
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
    /// Regular files copied (including names copied where a hard link was refused).
    pub files: u64,
    /// Bytes of the files copied, holes included.
    pub bytes: u64,
    /// Directories of the plan created (or found already there).
    pub dirs: u64,
    /// Symbolic links recreated.
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
    /// The source path (or, for a refused hard link, the destination path).
    pub path: PathBuf,
    /// Why, as a message.
    pub reason: String,
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

pub(crate) fn tmp_name(dst: &std::path::Path) -> PathBuf {
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
pub(crate) struct TmpGuard(pub(crate) Option<PathBuf>);

impl Drop for TmpGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

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
