//! The table of file-system operations: every request a transport decodes is an [`Op`] (its
//! arguments borrow the request's buffer), every answer an [`Out`] or an errno. Each
//! operation's row, [`OpKind`], is derived from [`Op`] itself, and gives its name (`status
//! --json`, `top`, the Prometheus labels) and its place in the per-operation timing
//! ([`crate::opstats`]), so a new operation cannot be left unnamed or untimed.
//!
//! Both transports (the `/dev/fuse` readers of [`crate::dev`] and the io_uring queues of
//! [`crate::uring`]) carry the same bytes, the FUSE wire format: [`wire`] decodes a request
//! into an [`Op`] and encodes an [`Out`] into its answer, once for both.
//!
//! Adding an operation touches this table and its handler only: a variant of [`Op`] (its doc
//! says what it asks), its opcode's arm in [`wire::decode`] (and, for an operation with a
//! payload, its fixed argument's size in [`wire::arg_len`]), and its handler in
//! [`crate::fuse::TierFs`]'s `answer`. The compiler then names every `match` left to extend;
//! its name and timing row follow from the variant (`OpKind`).

use std::time::SystemTime;

use fuser::FopenFlags;

use crate::attr::{Attr, Kind};

pub mod wire;

/// Who asked: the caller's user and group ids, from the request's header.
#[derive(Debug, Clone, Copy, Default)]
pub struct Caller {
    /// The caller's effective user id.
    pub uid: u32,
    /// The caller's effective group id.
    pub gid: u32,
}

/// A file-system request, decoded from whichever transport carried it (`fuser`'s
/// `/dev/fuse` loop or the io_uring queues of [`crate::uring`]). Names and data borrow the
/// request's buffer.
/// The fields are named as in the FUSE protocol; each variant's doc says what it asks.
#[derive(Debug, strum::EnumDiscriminants)]
#[strum_discriminants(
    name(OpKind),
    doc = "An operation without its arguments: one row of the table (its name, its timing).",
    derive(strum::EnumIter, strum::EnumCount, strum::IntoStaticStr, Hash),
    strum(serialize_all = "lowercase")
)]
#[allow(missing_docs)]
pub enum Op<'a> {
    /// Look `name` up in directory `parent`.
    Lookup { parent: u64, name: &'a [u8] },
    /// The attributes of `ino`.
    Getattr { ino: u64 },
    /// Change attributes (each `Some` is set; a time of `Some(None)` is "now"); `fh`: the
    /// handle the kernel wrote through, if any.
    Setattr {
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<Option<SystemTime>>,
        mtime: Option<Option<SystemTime>>,
        fh: Option<u64>,
    },
    /// A symlink's target.
    Readlink { ino: u64 },
    /// Make a node of type and mode `mode` (a regular file, FIFO, socket or device).
    Mknod {
        parent: u64,
        name: &'a [u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    },
    /// Make a directory.
    Mkdir {
        parent: u64,
        name: &'a [u8],
        mode: u32,
        umask: u32,
    },
    /// Remove a name that is not a directory.
    Unlink { parent: u64, name: &'a [u8] },
    /// Remove an empty directory.
    Rmdir { parent: u64, name: &'a [u8] },
    /// Make symlink `name` pointing at `target`.
    Symlink {
        parent: u64,
        name: &'a [u8],
        target: &'a [u8],
    },
    /// Rename (`flags`: `RENAME_NOREPLACE`, ...).
    Rename {
        parent: u64,
        name: &'a [u8],
        newparent: u64,
        newname: &'a [u8],
        flags: u32,
    },
    /// Add hard link `newname` to `ino`.
    Link {
        ino: u64,
        newparent: u64,
        newname: &'a [u8],
    },
    /// Open a file with open(2) `flags`.
    Open { ino: u64, flags: i32 },
    /// Read up to `size` bytes at `offset`.
    Read { ino: u64, offset: u64, size: u32 },
    /// Write `data` at `offset` through handle `fh`; `kill_suidgid`: the kernel asks for
    /// set-ID bits to be cleared.
    Write {
        ino: u64,
        fh: u64,
        offset: u64,
        data: &'a [u8],
        kill_suidgid: bool,
    },
    /// A `close` of handle `fh`.
    Flush { ino: u64, fh: u64 },
    /// The last close of handle `fh`.
    Release { ino: u64, fh: u64 },
    /// Make the file durable.
    Fsync { ino: u64 },
    /// Open a directory.
    Opendir { ino: u64 },
    /// Entries of a directory after position `offset`, at most `size` bytes of them.
    Readdir { ino: u64, offset: u64, size: u32 },
    /// As `Readdir`, each entry with its attributes as its lookup would answer (READDIRPLUS):
    /// what walks a tree and stats every name (`ls -l`, `git add`, `tar c`, `find`) then
    /// needs no LOOKUP round trip per name.
    Readdirplus { ino: u64, offset: u64, size: u32 },
    /// Make a directory durable.
    Fsyncdir { ino: u64 },
    /// The file system's sizes.
    Statfs,
    /// Create and open a file.
    Create {
        parent: u64,
        name: &'a [u8],
        mode: u32,
        umask: u32,
        flags: i32,
    },
    /// Set extended attribute `name` (`flags`: `XATTR_CREATE`, `XATTR_REPLACE`).
    Setxattr {
        ino: u64,
        name: &'a [u8],
        value: &'a [u8],
        flags: i32,
    },
    /// Read extended attribute `name` (`size` 0: its size).
    Getxattr { ino: u64, name: &'a [u8], size: u32 },
    /// List the extended attributes (`size` 0: the list's size).
    Listxattr { ino: u64, size: u32 },
    /// Remove extended attribute `name`.
    Removexattr { ino: u64, name: &'a [u8] },
    /// Reserve, punch or zero `length` bytes at `offset` (`fallocate(2)` `mode`).
    Fallocate {
        ino: u64,
        offset: u64,
        length: u64,
        mode: i32,
    },
    /// The next data (`SEEK_DATA`) or hole (`SEEK_HOLE`) at or after `offset`.
    Lseek { ino: u64, offset: u64, whence: i32 },
}

impl Op<'_> {
    /// The operation's kind: its row in the table.
    pub fn kind(&self) -> OpKind {
        OpKind::from(self)
    }

    /// The operation's name in `status --json` (the FUSE protocol's name, lower case).
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
}

impl OpKind {
    /// Every operation, in the order `status` lists them.
    pub fn all() -> impl Iterator<Item = OpKind> {
        <OpKind as strum::IntoEnumIterator>::iter()
    }

    /// How many operations there are.
    pub const COUNT: usize = <OpKind as strum::EnumCount>::COUNT;

    /// The operation's name in `status --json`.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The operation's row: its place in [`OpKind::all`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The file system's sizes, as statfs(2) reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statfs {
    /// Blocks of `bsize` bytes in all.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks for unprivileged users.
    pub bavail: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
}

/// What an operation answers, whichever transport carries it back.
#[derive(Debug)]
pub enum Out {
    /// A directory entry (kept by the kernel for the transport's entry timeout).
    Entry(Attr),
    /// A name that is not there, kept by the kernel as a negative entry for this long.
    Negative(std::time::Duration),
    /// Attributes (kept for the transport's attribute timeout).
    Attr(Attr),
    /// Bytes: a read's data, a symlink's target, an extended attribute or their list.
    Data(Vec<u8>),
    /// The size an extended attribute (or their list) would take.
    Size(u32),
    /// Done, nothing to return.
    Empty,
    /// An opened handle and its `FOPEN_*` flags.
    Open(u64, FopenFlags),
    /// A created and opened file.
    Created(Attr, u64, FopenFlags),
    /// Bytes written.
    Written(u32),
    /// An offset in a file (`lseek`).
    Offset(u64),
    /// The file system's sizes.
    Statfs(Statfs),
    /// Directory entries: (inode, position after the entry, type, name).
    Dir(Vec<(u64, u64, Kind, Vec<u8>)>),
    /// Directory entries with their attributes: (attributes, position after the entry,
    /// name).
    DirPlus(Vec<(Attr, u64, Vec<u8>)>),
}

/// An operation's answer: [`Out`] or an errno.
pub type Answer = std::result::Result<Out, i32>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_has_a_unique_name_and_row() {
        let names: Vec<&str> = OpKind::all().map(OpKind::name).collect();
        assert_eq!(names.len(), OpKind::COUNT);
        let unique: std::collections::BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for (i, k) in OpKind::all().enumerate() {
            assert_eq!(k.index(), i);
            let n = k.name();
            assert!(
                !n.is_empty() && n.bytes().all(|b| b.is_ascii_lowercase()),
                "{n}"
            );
        }
        assert_eq!(Op::Statfs.name(), "statfs");
        assert_eq!(Op::Getattr { ino: 1 }.kind(), OpKind::Getattr);
        assert_eq!(OpKind::Removexattr.name(), "removexattr");
    }
}
