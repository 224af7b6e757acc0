//! The messages of the channel: a request ([`Req`]) as the client writes it into the slot, an
//! answer ([`Rep`]) as the daemon writes it back. Little-endian, a fixed head of
//! [`REQ_HEAD`] / [`REP_HEAD`] bytes and then the variable part (a path, two paths separated by
//! a NUL, or data). The decoders trust no length: a short or malformed message is `None`
//! (property-tested with arbitrary bytes).
//!
//! Paths are relative to the mount's root as the program wrote them (components separated by
//! `/`, `.` and `..` left for the daemon to walk, since a lexical `..` would be wrong after a
//! symbolic link); an empty path is the root.

/// Bytes of a request's fixed head.
pub const REQ_HEAD: usize = 40;
/// Bytes of an answer's fixed head (before its data).
pub const REP_HEAD: usize = 16 + ATTR_LEN;
/// Bytes of an encoded [`WireAttr`].
pub const ATTR_LEN: usize = 80;

/// A request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Req<'a> {
    /// `stat` (follow) or `lstat` of a path.
    Stat {
        /// The directory `path` is relative to (0: the mount's root; a relative path of an
        /// `*at` call names its directory's node).
        base: u64,
        /// The path under the mount.
        path: &'a [u8],
        /// Whether a final symbolic link is followed.
        follow: bool,
    },
    /// `fstat` of a node the client holds open.
    Fstat {
        /// The node.
        ino: u64,
    },
    /// `access`: `mask` is `R_OK | W_OK | X_OK` or `F_OK`.
    Access {
        /// The directory `path` is relative to (0: the mount's root; a relative path of an
        /// `*at` call names its directory's node).
        base: u64,
        /// The path under the mount.
        path: &'a [u8],
        /// The bits asked.
        mask: u32,
    },
    /// `open`/`creat`: answered [`Rep::Opened`], or [`Rep::Fallback`] for what the client
    /// leaves to the kernel (directories, symbolic links, special files).
    Open {
        /// The directory `path` is relative to (0: the mount's root; a relative path of an
        /// `*at` call names its directory's node).
        base: u64,
        /// The path under the mount.
        path: &'a [u8],
        /// `open`'s flags.
        flags: i32,
        /// The mode of a file it creates.
        mode: u32,
        /// The process's umask.
        umask: u32,
    },
    /// The last `close` of an opened handle.
    Close {
        /// The node.
        ino: u64,
        /// The handle [`Rep::Opened`] gave.
        fh: u64,
    },
    /// `pread`: at most `len` bytes at `off`.
    Read {
        /// The node.
        ino: u64,
        /// The handle.
        fh: u64,
        /// The offset.
        off: u64,
        /// The most bytes answered.
        len: u32,
    },
    /// `pwrite`, or an appending write (`append`: at the file's end, `off` ignored).
    Write {
        /// The node.
        ino: u64,
        /// The handle.
        fh: u64,
        /// The offset.
        off: u64,
        /// Whether the write goes to the end of the file (`O_APPEND`).
        append: bool,
        /// The bytes.
        data: &'a [u8],
    },
    /// `fsync` (`fdatasync`: `datasync`).
    Fsync {
        /// The node.
        ino: u64,
        /// Whether only the data is asked for.
        datasync: bool,
    },
    /// `ftruncate` through an open handle.
    Truncate {
        /// The node.
        ino: u64,
        /// The handle.
        fh: u64,
        /// The new size.
        size: u64,
    },
    /// The path of a node from the mount's root (for a promotion: the file opened again
    /// through the kernel), answered as data; ENOENT once it has no name.
    PathOf {
        /// The node.
        ino: u64,
    },
    /// A directory's entries from position `pos` (0: `.`, 1: `..`, then its children), for
    /// `opendir`: answered as data, entries in [`put_entry`]'s form, as many as fit; none
    /// at the end. ENOTDIR for another kind; [`Rep::Fallback`] for a symbolic link on the
    /// way.
    List {
        /// The directory `path` is relative to (0: the mount's root; a relative path of an
        /// `*at` call names its directory's node).
        base: u64,
        /// The path under the mount.
        path: &'a [u8],
        /// The first position wanted.
        pos: u64,
    },
    /// `getxattr` (`follow`) or `lgetxattr` of a path: the value as data (the client
    /// answers a size query from its length), ENODATA when there is none, [`Rep::Fallback`]
    /// for a name whose rules only the kernel keeps (`trusted.`, unknown namespaces).
    GetXattr {
        /// The directory `path` is relative to (0: the mount's root; a relative path of an
        /// `*at` call names its directory's node).
        base: u64,
        /// The path under the mount.
        path: &'a [u8],
        /// The attribute's name.
        name: &'a [u8],
        /// Whether a final symbolic link is followed.
        follow: bool,
    },
    /// `unlink`.
    Unlink {
        /// The directory `path` is relative to (0: the mount's root; a relative path of an
        /// `*at` call names its directory's node).
        base: u64,
        /// The path under the mount.
        path: &'a [u8],
    },
    /// `rmdir`.
    Rmdir {
        /// The directory `path` is relative to (0: the mount's root; a relative path of an
        /// `*at` call names its directory's node).
        base: u64,
        /// The path under the mount.
        path: &'a [u8],
    },
    /// `mkdir`.
    Mkdir {
        /// The directory `path` is relative to (0: the mount's root; a relative path of an
        /// `*at` call names its directory's node).
        base: u64,
        /// The path under the mount.
        path: &'a [u8],
        /// Its mode.
        mode: u32,
        /// The process's umask.
        umask: u32,
    },
    /// `rename` within the mount.
    Rename {
        /// The old path.
        from: &'a [u8],
        /// The new path.
        to: &'a [u8],
    },
    /// `link`: a new name `to` for the node `from` names (a final symbolic link not followed).
    Link {
        /// The existing path.
        from: &'a [u8],
        /// The new path.
        to: &'a [u8],
    },
    /// `fchmod`, `fchown`, `futimens` (by node, `path` empty) or `utimensat`, `chmod`,
    /// `chown` (by path, a final symbolic link followed only when `follow`).
    Setattr {
        /// The node when `path` is empty.
        ino: u64,
        /// The path under the mount, or empty.
        path: &'a [u8],
        /// What to change.
        set: SetAttr,
    },
}

/// A time `utimensat` sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Time {
    /// Left as it is (`UTIME_OMIT`).
    Omit,
    /// The present time (`UTIME_NOW`).
    Now,
    /// This time, ns since the epoch.
    At(i64),
}

/// The attributes a [`Req::Setattr`] changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New access time.
    pub atime: Time,
    /// New modification time.
    pub mtime: Time,
    /// Whether a final symbolic link of the path is followed.
    pub follow: bool,
}

/// Attributes as `stat` gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireAttr {
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Access time, ns since the epoch.
    pub atime: i64,
    /// Modification time, ns.
    pub mtime: i64,
    /// Change time, ns.
    pub ctime: i64,
    /// Type and permission bits (`st_mode`).
    pub mode: u32,
    /// Links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device of a special file.
    pub rdev: u64,
    /// Preferred I/O size.
    pub blksize: u32,
}

/// The most counts one answer's facts rest on ([`Deps`]).
pub const MAX_DEPS: usize = 40;
/// Bytes of one count in an answer.
const DEP_LEN: usize = 12;

/// The counts of the mount's table ([`crate::vers`]) that the facts of an answer rest on,
/// each read before its fact: `(slot, count)`. While the table holds every count, the facts
/// hold (see [`crate::vers`]). At most [`MAX_DEPS`]; a walk longer than that is not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deps {
    n: u8,
    v: [(u32, u64); MAX_DEPS],
}

impl Default for Deps {
    fn default() -> Self {
        Deps {
            n: 0,
            v: [(0, 0); MAX_DEPS],
        }
    }
}

impl Deps {
    /// Adds a count; false (and the set marked full, see [`Deps::complete`]) when there is no
    /// room left.
    pub fn push(&mut self, slot: u32, count: u64) -> bool {
        match self.v.get_mut(self.n as usize) {
            Some(d) if (self.n as usize) < MAX_DEPS => {
                *d = (slot, count);
                self.n += 1;
                true
            }
            _ => {
                self.n = u8::MAX;
                false
            }
        }
    }

    /// Marks the set as not to be kept (a fact no count covers).
    pub fn spoil(&mut self) {
        self.n = u8::MAX;
    }

    /// Whether every count the facts rest on is here (false once one did not fit: such an
    /// answer is not to be kept).
    pub fn complete(&self) -> bool {
        self.n != u8::MAX
    }

    /// The counts.
    pub fn as_slice(&self) -> &[(u32, u64)] {
        &self.v[..(self.n as usize).min(MAX_DEPS)]
    }

    /// The counts up to `len` (a walk's counts before its last step).
    pub fn truncate(&mut self, len: usize) {
        if self.complete() {
            self.n = self.n.min(len.min(MAX_DEPS) as u8);
        }
    }

    /// Writes the counts after the head (none for an incomplete set: nothing to keep).
    fn put(&self, out: &mut [u8]) -> Option<usize> {
        let deps = if self.complete() {
            self.as_slice()
        } else {
            &[]
        };
        let room = out.get_mut(REP_HEAD..REP_HEAD + deps.len() * DEP_LEN)?;
        for (c, (slot, count)) in room.chunks_exact_mut(DEP_LEN).zip(deps) {
            c[..4].copy_from_slice(&slot.to_le_bytes());
            c[4..].copy_from_slice(&count.to_le_bytes());
        }
        Some(deps.len())
    }

    fn get(b: &[u8], n: u32) -> Option<Deps> {
        let n = n as usize;
        if n > MAX_DEPS {
            return None;
        }
        let mut d = Deps::default();
        for c in b
            .get(REP_HEAD..REP_HEAD + n * DEP_LEN)?
            .chunks_exact(DEP_LEN)
        {
            d.push(u32_at(c, 0)?, u64_at(c, 4)?);
        }
        Some(d)
    }
}

/// An answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rep<'a> {
    /// Done, nothing to say.
    Done,
    /// Failed with an errno.
    Err(i32),
    /// Not served here: the client makes the call through the kernel (FUSE) instead.
    Fallback,
    /// Attributes.
    Attr(WireAttr),
    /// Attributes that hold while the counts they rest on do: a `stat`'s (the walk's names
    /// and permissions, then the node's attributes), a `close`'s (the node's attributes).
    Known {
        /// The attributes.
        attr: WireAttr,
        /// What they rest on (the node's attribute count last).
        deps: Deps,
    },
    /// ENOENT for a path's last name, which holds while the counts it rests on do, for at
    /// most `ttl_ms` (a name another writer adds to BACKING is seen within it).
    Absent {
        /// What it rests on.
        deps: Deps,
        /// How long it may be kept, in ms.
        ttl_ms: u32,
    },
    /// An open handle `fh` on the node of `attr`.
    Opened {
        /// The handle.
        fh: u64,
        /// The node's attributes after the open (and its truncate).
        attr: WireAttr,
        /// What the path's walk and the attributes rest on, as for [`Rep::Known`] (empty:
        /// nothing to keep).
        deps: Deps,
    },
    /// Data read.
    Data(&'a [u8]),
    /// Bytes written, and the offset just after them.
    Written {
        /// Bytes written.
        n: u32,
        /// The offset after the write (the file's end for an appending write).
        end: u64,
    },
}

const OP_STAT: u8 = 1;
const OP_FSTAT: u8 = 2;
const OP_ACCESS: u8 = 3;
const OP_OPEN: u8 = 4;
const OP_CLOSE: u8 = 5;
const OP_READ: u8 = 6;
const OP_WRITE: u8 = 7;
const OP_FSYNC: u8 = 8;
const OP_TRUNCATE: u8 = 9;
const OP_UNLINK: u8 = 10;
const OP_RMDIR: u8 = 11;
const OP_MKDIR: u8 = 12;
const OP_RENAME: u8 = 13;
const OP_SETATTR: u8 = 14;
const OP_LINK: u8 = 15;
const OP_PATH_OF: u8 = 16;
const OP_LIST: u8 = 17;
const OP_GETXATTR: u8 = 18;

/// The largest extended attribute value (the kernel's `XATTR_SIZE_MAX`).
pub const XATTR_MAX: usize = 64 << 10;

/// The most bytes of entries one [`Req::List`] answer holds.
pub const LIST_MAX: usize = 64 << 10;

/// Bytes of a setattr's fixed tail (uid, gid, atime, mtime) before its path.
const SET_TAIL: usize = 24;

fn time_bits(t: Time, shift: u32) -> (u32, i64) {
    match t {
        Time::Omit => (0, 0),
        Time::Now => (2 << shift, 0),
        Time::At(ns) => (1 << shift, ns),
    }
}

fn time_of(bits: u32, shift: u32, ns: i64) -> Time {
    match (bits >> shift) & 3 {
        1 => Time::At(ns),
        2 => Time::Now,
        _ => Time::Omit,
    }
}

/// The fixed head's fields, as every request lays them out.
#[derive(Default)]
struct Head {
    op: u8,
    bit: bool,
    x: u32,
    y: u32,
    ino: u64,
    fh: u64,
    off: u64,
}

fn put_head(h: &Head, out: &mut Vec<u8>) {
    out.clear();
    out.push(h.op);
    out.push(h.bit as u8);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&h.x.to_le_bytes());
    out.extend_from_slice(&h.y.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&h.ino.to_le_bytes());
    out.extend_from_slice(&h.fh.to_le_bytes());
    out.extend_from_slice(&h.off.to_le_bytes());
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl<'a> Req<'a> {
    /// Writes the request into `out` (cleared first).
    pub fn encode(&self, out: &mut Vec<u8>) {
        if let Req::Setattr { ino, path, set } = self {
            return Self::encode_setattr(*ino, path, set, out);
        }
        let (h, tail): (Head, &[&[u8]]) = match self {
            Req::Stat { base, path, follow } => (
                Head {
                    op: OP_STAT,
                    bit: *follow,
                    ino: *base,
                    ..Head::default()
                },
                &[path],
            ),
            Req::Fstat { ino } => (
                Head {
                    op: OP_FSTAT,
                    ino: *ino,
                    ..Head::default()
                },
                &[],
            ),
            Req::Access { base, path, mask } => (
                Head {
                    op: OP_ACCESS,
                    x: *mask,
                    ino: *base,
                    ..Head::default()
                },
                &[path],
            ),
            Req::Open {
                base,
                path,
                flags,
                mode,
                umask,
            } => (
                Head {
                    op: OP_OPEN,
                    x: *mode,
                    y: *umask,
                    ino: *base,
                    off: *flags as u32 as u64,
                    ..Head::default()
                },
                &[path],
            ),
            Req::Close { ino, fh } => (
                Head {
                    op: OP_CLOSE,
                    ino: *ino,
                    fh: *fh,
                    ..Head::default()
                },
                &[],
            ),
            Req::Read { ino, fh, off, len } => (
                Head {
                    op: OP_READ,
                    x: *len,
                    ino: *ino,
                    fh: *fh,
                    off: *off,
                    ..Head::default()
                },
                &[],
            ),
            Req::Write {
                ino,
                fh,
                off,
                append,
                data,
            } => (
                Head {
                    op: OP_WRITE,
                    bit: *append,
                    ino: *ino,
                    fh: *fh,
                    off: *off,
                    ..Head::default()
                },
                &[data],
            ),
            Req::Fsync { ino, datasync } => (
                Head {
                    op: OP_FSYNC,
                    bit: *datasync,
                    ino: *ino,
                    ..Head::default()
                },
                &[],
            ),
            Req::Truncate { ino, fh, size } => (
                Head {
                    op: OP_TRUNCATE,
                    ino: *ino,
                    fh: *fh,
                    off: *size,
                    ..Head::default()
                },
                &[],
            ),
            Req::PathOf { ino } => (
                Head {
                    op: OP_PATH_OF,
                    ino: *ino,
                    ..Head::default()
                },
                &[],
            ),
            Req::List { base, path, pos } => (
                Head {
                    op: OP_LIST,
                    ino: *base,
                    off: *pos,
                    ..Head::default()
                },
                &[path],
            ),
            Req::Unlink { base, path } => (
                Head {
                    op: OP_UNLINK,
                    ino: *base,
                    ..Head::default()
                },
                &[path],
            ),
            Req::Rmdir { base, path } => (
                Head {
                    op: OP_RMDIR,
                    ino: *base,
                    ..Head::default()
                },
                &[path],
            ),
            Req::Mkdir {
                base,
                path,
                mode,
                umask,
            } => (
                Head {
                    op: OP_MKDIR,
                    x: *mode,
                    y: *umask,
                    ino: *base,
                    ..Head::default()
                },
                &[path],
            ),
            Req::Rename { from, to } | Req::Link { from, to } => (
                Head {
                    op: if matches!(self, Req::Link { .. }) {
                        OP_LINK
                    } else {
                        OP_RENAME
                    },
                    x: from.len() as u32,
                    ..Head::default()
                },
                &[from, to],
            ),
            Req::GetXattr {
                base,
                path,
                name,
                follow,
            } => (
                Head {
                    op: OP_GETXATTR,
                    bit: *follow,
                    ino: *base,
                    x: path.len() as u32,
                    ..Head::default()
                },
                &[path, name],
            ),
            Req::Setattr { .. } => return,
        };
        put_head(&h, out);
        for t in tail {
            out.extend_from_slice(t);
        }
    }

    fn encode_setattr(ino: u64, path: &[u8], set: &SetAttr, out: &mut Vec<u8>) {
        let (ab, at) = time_bits(set.atime, 3);
        let (mb, mt) = time_bits(set.mtime, 5);
        let valid = set.mode.is_some() as u32
            | (set.uid.is_some() as u32) << 1
            | (set.gid.is_some() as u32) << 2
            | ab
            | mb;
        put_head(
            &Head {
                op: OP_SETATTR,
                bit: set.follow,
                x: valid,
                y: set.mode.unwrap_or(0),
                ino,
                ..Head::default()
            },
            out,
        );
        out.extend_from_slice(&set.uid.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&set.gid.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&at.to_le_bytes());
        out.extend_from_slice(&mt.to_le_bytes());
        out.extend_from_slice(path);
    }

    /// The request in `b`, or None when `b` is not one (short, unknown operation, a path
    /// with a NUL, a rename whose first path overruns the message).
    pub fn decode(b: &'a [u8]) -> Option<Req<'a>> {
        if b.len() < REQ_HEAD {
            return None;
        }
        let (op, bit) = (b[0], b[1] != 0);
        let (x, y) = (u32_at(b, 4)?, u32_at(b, 8)?);
        let (ino, fh, off) = (u64_at(b, 16)?, u64_at(b, 24)?, u64_at(b, 32)?);
        let tail = &b[REQ_HEAD..];
        let path = || (!tail.contains(&0)).then_some(tail);
        Some(match op {
            OP_STAT => Req::Stat {
                base: ino,
                path: path()?,
                follow: bit,
            },
            OP_FSTAT => Req::Fstat { ino },
            OP_ACCESS => Req::Access {
                base: ino,
                path: path()?,
                mask: x,
            },
            OP_OPEN => Req::Open {
                base: ino,
                path: path()?,
                flags: u32::try_from(off).ok()? as i32,
                mode: x,
                umask: y,
            },
            OP_CLOSE => Req::Close { ino, fh },
            OP_READ => Req::Read {
                ino,
                fh,
                off,
                len: x,
            },
            OP_WRITE => Req::Write {
                ino,
                fh,
                off,
                append: bit,
                data: tail,
            },
            OP_FSYNC => Req::Fsync { ino, datasync: bit },
            OP_TRUNCATE => Req::Truncate { ino, fh, size: off },
            OP_PATH_OF => Req::PathOf { ino },
            OP_LIST => Req::List {
                base: ino,
                path: path()?,
                pos: off,
            },
            OP_UNLINK => Req::Unlink {
                base: ino,
                path: path()?,
            },
            OP_RMDIR => Req::Rmdir {
                base: ino,
                path: path()?,
            },
            OP_MKDIR => Req::Mkdir {
                base: ino,
                path: path()?,
                mode: x,
                umask: y,
            },
            OP_GETXATTR => {
                let (path, name) = tail.split_at_checked(x as usize)?;
                if path.contains(&0) || name.contains(&0) {
                    return None;
                }
                Req::GetXattr {
                    base: ino,
                    path,
                    name,
                    follow: bit,
                }
            }
            OP_RENAME | OP_LINK => {
                let (from, to) = tail.split_at_checked(x as usize)?;
                if from.contains(&0) || to.contains(&0) {
                    return None;
                }
                if op == OP_LINK {
                    Req::Link { from, to }
                } else {
                    Req::Rename { from, to }
                }
            }
            OP_SETATTR => {
                let (t, path) = tail.split_at_checked(SET_TAIL)?;
                if path.contains(&0) {
                    return None;
                }
                let (uid, gid) = (u32_at(t, 0)?, u32_at(t, 4)?);
                let (at, mt) = (u64_at(t, 8)? as i64, u64_at(t, 16)? as i64);
                Req::Setattr {
                    ino,
                    path,
                    set: SetAttr {
                        mode: (x & 1 != 0).then_some(y),
                        uid: (x & 2 != 0).then_some(uid),
                        gid: (x & 4 != 0).then_some(gid),
                        atime: time_of(x, 3, at),
                        mtime: time_of(x, 5, mt),
                        follow: bit,
                    },
                }
            }
            _ => return None,
        })
    }
}

impl WireAttr {
    fn put(&self, out: &mut [u8]) {
        let fields: [u64; 6] = [
            self.ino,
            self.size,
            self.blocks,
            self.atime as u64,
            self.mtime as u64,
            self.ctime as u64,
        ];
        for (i, v) in fields.iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        let small: [u32; 4] = [self.mode, self.nlink, self.uid, self.gid];
        for (i, v) in small.iter().enumerate() {
            out[48 + i * 4..52 + i * 4].copy_from_slice(&v.to_le_bytes());
        }
        out[64..72].copy_from_slice(&self.rdev.to_le_bytes());
        out[72..76].copy_from_slice(&self.blksize.to_le_bytes());
        out[76..80].fill(0);
    }

    fn get(b: &[u8]) -> Option<WireAttr> {
        Some(WireAttr {
            ino: u64_at(b, 0)?,
            size: u64_at(b, 8)?,
            blocks: u64_at(b, 16)?,
            atime: u64_at(b, 24)? as i64,
            mtime: u64_at(b, 32)? as i64,
            ctime: u64_at(b, 40)? as i64,
            mode: u32_at(b, 48)?,
            nlink: u32_at(b, 52)?,
            uid: u32_at(b, 56)?,
            gid: u32_at(b, 60)?,
            rdev: u64_at(b, 64)?,
            blksize: u32_at(b, 72)?,
        })
    }
}

const REP_DONE: u8 = 0;
const REP_ERR: u8 = 1;
const REP_FALLBACK: u8 = 2;
const REP_ATTR: u8 = 3;
const REP_OPENED: u8 = 4;
const REP_DATA: u8 = 5;
const REP_WRITTEN: u8 = 6;
const REP_KNOWN: u8 = 7;
const REP_ABSENT: u8 = 8;

impl<'a> Rep<'a> {
    /// The head of an answer of `kind` with number `n`, handle or offset `fh` and `attr`,
    /// written into `out[..REP_HEAD]`; the caller puts any data after it.
    fn head(out: &mut [u8], kind: u8, n: u32, fh: u64, attr: &WireAttr) {
        out[0] = kind;
        out[1..4].fill(0);
        out[4..8].copy_from_slice(&n.to_le_bytes());
        out[8..16].copy_from_slice(&fh.to_le_bytes());
        attr.put(&mut out[16..REP_HEAD]);
    }

    /// Writes the answer into `out` (at least [`REP_HEAD`] bytes plus its data); returns the
    /// answer's length, or None if `out` is too short for its data.
    pub fn encode_into(&self, out: &mut [u8]) -> Option<usize> {
        if out.len() < REP_HEAD {
            return None;
        }
        let none = WireAttr::default();
        match self {
            Rep::Done => Self::head(out, REP_DONE, 0, 0, &none),
            Rep::Err(e) => Self::head(out, REP_ERR, *e as u32, 0, &none),
            Rep::Fallback => Self::head(out, REP_FALLBACK, 0, 0, &none),
            Rep::Attr(a) => Self::head(out, REP_ATTR, 0, 0, a),
            Rep::Opened { fh, attr, deps } => {
                let n = deps.put(out)?;
                Self::head(out, REP_OPENED, n as u32, *fh, attr);
                return Some(REP_HEAD + n * DEP_LEN);
            }
            Rep::Known { attr, deps } => {
                let n = deps.put(out)?;
                Self::head(out, REP_KNOWN, n as u32, 0, attr);
                return Some(REP_HEAD + n * DEP_LEN);
            }
            Rep::Absent { deps, ttl_ms } => {
                let n = deps.put(out)?;
                Self::head(out, REP_ABSENT, n as u32, u64::from(*ttl_ms), &none);
                return Some(REP_HEAD + n * DEP_LEN);
            }
            Rep::Written { n, end } => Self::head(out, REP_WRITTEN, *n, *end, &none),
            Rep::Data(d) => {
                let room = out.get_mut(REP_HEAD..REP_HEAD + d.len())?;
                room.copy_from_slice(d);
                Self::head(out, REP_DATA, d.len() as u32, 0, &none);
                return Some(REP_HEAD + d.len());
            }
        }
        Some(REP_HEAD)
    }

    /// The length of what follows `head` (an answer's first [`REP_HEAD`] bytes) when it
    /// carries counts ([`Deps`]): the client reads that much more before decoding.
    pub fn deps_len(head: &[u8]) -> usize {
        match head.first() {
            Some(&(REP_OPENED | REP_KNOWN | REP_ABSENT)) => {
                u32_at(head, 4).map_or(0, |n| (n as usize).min(MAX_DEPS) * DEP_LEN)
            }
            _ => 0,
        }
    }

    /// The length of the data that follows `head` (an answer's first [`REP_HEAD`] bytes) if
    /// it is a [`Rep::Data`]: the client copies it straight where the program wants it.
    pub fn data_len(head: &[u8]) -> Option<usize> {
        (head.len() >= REP_HEAD && head[0] == REP_DATA)
            .then(|| u32_at(head, 4).map(|n| n as usize))?
    }

    /// The answer in `b`, or None when `b` is not one.
    pub fn decode(b: &'a [u8]) -> Option<Rep<'a>> {
        if b.len() < REP_HEAD {
            return None;
        }
        let n = u32_at(b, 4)?;
        let fh = u64_at(b, 8)?;
        let attr = || WireAttr::get(&b[16..REP_HEAD]);
        Some(match b[0] {
            REP_DONE => Rep::Done,
            REP_ERR => Rep::Err(n as i32),
            REP_FALLBACK => Rep::Fallback,
            REP_ATTR => Rep::Attr(attr()?),
            REP_OPENED => Rep::Opened {
                fh,
                attr: attr()?,
                deps: Deps::get(b, n)?,
            },
            REP_KNOWN => Rep::Known {
                attr: attr()?,
                deps: Deps::get(b, n)?,
            },
            REP_ABSENT => Rep::Absent {
                deps: Deps::get(b, n)?,
                ttl_ms: u32::try_from(fh).ok()?,
            },
            REP_WRITTEN => Rep::Written { n, end: fh },
            REP_DATA => Rep::Data(b.get(REP_HEAD..REP_HEAD + n as usize)?),
            _ => return None,
        })
    }
}

/// Bytes of an entry's head in a [`Req::List`] answer (node, next position, type, name
/// length).
pub const ENTRY_HEAD: usize = 8 + 8 + 1 + 2;

/// One directory entry of a [`Req::List`] answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Its node.
    pub ino: u64,
    /// The position of the entry after it (a `telldir` cookie).
    pub next: u64,
    /// Its `DT_*` type.
    pub kind: u8,
    /// Its name (1 to 255 bytes, no `/` or NUL).
    pub name: &'a [u8],
}

/// Appends `e` to `out` unless that would make it longer than `max` bytes (false then).
pub fn put_entry(out: &mut Vec<u8>, e: &Entry<'_>, max: usize) -> bool {
    let Ok(len) = u16::try_from(e.name.len()) else {
        return false;
    };
    if out.len() + ENTRY_HEAD + e.name.len() > max {
        return false;
    }
    out.extend_from_slice(&e.ino.to_le_bytes());
    out.extend_from_slice(&e.next.to_le_bytes());
    out.push(e.kind);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(e.name);
    true
}

/// The entries of a [`Req::List`] answer, in order; None at the first malformed one (a
/// short head, a name past the end, an empty name or one with `/` or NUL).
pub fn entries(mut b: &[u8]) -> Option<Vec<Entry<'_>>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let ino = u64_at(b, 0)?;
        let next = u64_at(b, 8)?;
        let kind = *b.get(16)?;
        let len = u16::from_le_bytes(b.get(17..19)?.try_into().ok()?) as usize;
        let name = b.get(ENTRY_HEAD..ENTRY_HEAD + len)?;
        if name.is_empty() || name.iter().any(|&c| c == 0 || c == b'/') {
            return None;
        }
        out.push(Entry {
            ino,
            next,
            kind,
            name,
        });
        b = &b[ENTRY_HEAD + len..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reqs<'a>(p: &'a [u8], q: &'a [u8], d: &'a [u8], n: u64, f: i32) -> Vec<Req<'a>> {
        vec![
            Req::Stat {
                base: n / 2,
                path: p,
                follow: n.is_multiple_of(2),
            },
            Req::Fstat { ino: n },
            Req::Access {
                base: 0,
                path: p,
                mask: n as u32,
            },
            Req::Open {
                base: n,
                path: p,
                flags: f,
                mode: 0o644,
                umask: 0o22,
            },
            Req::Close { ino: n, fh: n ^ 7 },
            Req::Read {
                ino: n,
                fh: 1,
                off: n << 3,
                len: 4096,
            },
            Req::Write {
                ino: n,
                fh: 1,
                off: n,
                append: f < 0,
                data: d,
            },
            Req::Fsync {
                ino: n,
                datasync: true,
            },
            Req::Truncate {
                ino: n,
                fh: 2,
                size: n,
            },
            Req::Unlink { base: n, path: p },
            Req::Rmdir { base: 1, path: p },
            Req::PathOf { ino: n },
            Req::List {
                base: n,
                path: p,
                pos: n >> 2,
            },
            Req::GetXattr {
                base: n,
                path: p,
                name: q,
                follow: f > 0,
            },
            Req::Mkdir {
                base: n,
                path: p,
                mode: 0o755,
                umask: 0o77,
            },
            Req::Rename { from: p, to: q },
            Req::Link { from: q, to: p },
            Req::Setattr {
                ino: n,
                path: p,
                set: SetAttr {
                    mode: (f > 0).then_some(0o600),
                    uid: n.is_multiple_of(3).then_some(n as u32),
                    gid: None,
                    atime: Time::Now,
                    mtime: Time::At(f as i64 * 1000),
                    follow: f % 2 == 0,
                },
            },
        ]
    }

    proptest! {
        #[test]
        fn every_request_decodes_to_itself(
            p in proptest::collection::vec(1u8..=255, 0..64),
            q in proptest::collection::vec(1u8..=255, 0..64),
            d in proptest::collection::vec(any::<u8>(), 0..300),
            n in any::<u64>(),
            f in any::<i32>(),
        ) {
            let mut buf = Vec::new();
            for r in reqs(&p, &q, &d, n, f) {
                r.encode(&mut buf);
                prop_assert_eq!(Req::decode(&buf), Some(r));
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_decoders(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Req::decode(&b);
            let _ = Rep::decode(&b);
            let _ = entries(&b);
        }

        #[test]
        fn listed_entries_decode_to_themselves_and_stop_at_the_bound(
            names in proptest::collection::vec(proptest::collection::vec(1u8..=255, 1..40), 0..30),
            max in 0usize..600,
        ) {
            let names: Vec<Vec<u8>> = names.into_iter()
                .map(|n| n.into_iter().map(|c| if c == b'/' { b'x' } else { c }).collect())
                .collect();
            let want: Vec<Entry<'_>> = names.iter().enumerate()
                .map(|(i, n)| Entry { ino: i as u64 * 7, next: i as u64 + 3, kind: (i % 12) as u8, name: n })
                .collect();
            let mut out = Vec::new();
            let mut fitted = 0;
            for e in &want {
                if !put_entry(&mut out, e, max) {
                    break;
                }
                fitted += 1;
            }
            prop_assert!(out.len() <= max);
            prop_assert_eq!(entries(&out), Some(want[..fitted].to_vec()));
        }

        #[test]
        fn every_answer_decodes_to_itself(
            d in proptest::collection::vec(any::<u8>(), 0..300),
            n in any::<u32>(),
            x in any::<u64>(),
            t in any::<i64>(),
        ) {
            let attr = WireAttr { ino: x, size: x / 3, blocks: 8, atime: t, mtime: -t, ctime: t / 2,
                mode: n, nlink: 2, uid: n / 5, gid: 7, rdev: x ^ 1, blksize: 4096 };
            let mut deps = Deps::default();
            for (i, b) in d.iter().take(MAX_DEPS).enumerate() {
                deps.push(u32::from(*b) << 8 | i as u32, x.wrapping_add(i as u64));
            }
            let mut out = vec![0u8; REP_HEAD + 600];
            for r in [Rep::Done, Rep::Err(n as i32), Rep::Fallback, Rep::Attr(attr),
                      Rep::Opened { fh: x, attr, deps }, Rep::Data(&d), Rep::Written { n, end: x },
                      Rep::Known { attr, deps }, Rep::Absent { deps, ttl_ms: n }] {
                let len = r.encode_into(&mut out).expect("room");
                prop_assert_eq!(Rep::decode(&out[..len]), Some(r));
            }
        }
    }

    #[test]
    fn a_path_with_a_nul_or_a_rename_past_its_end_is_refused() {
        let mut buf = Vec::new();
        Req::Unlink {
            base: 0,
            path: b"a\0b",
        }
        .encode(&mut buf);
        assert_eq!(Req::decode(&buf), None);
        Req::Rename {
            from: b"abc",
            to: b"d",
        }
        .encode(&mut buf);
        buf[4] = 200;
        assert_eq!(Req::decode(&buf), None);
        assert_eq!(Req::decode(&buf[..10]), None);
    }

    #[test]
    fn data_that_does_not_fit_is_not_encoded() {
        let mut out = vec![0u8; REP_HEAD + 2];
        assert_eq!(Rep::Data(b"abc").encode_into(&mut out), None);
        assert_eq!(Rep::Data(b"ab").encode_into(&mut out), Some(REP_HEAD + 2));
    }

    #[test]
    fn a_walk_longer_than_an_answer_holds_is_not_kept() {
        let mut d = Deps::default();
        for i in 0..MAX_DEPS as u32 {
            assert!(d.push(i, 1));
        }
        assert!(d.complete());
        assert!(!d.push(99, 1));
        assert!(!d.complete());
        assert!(d.as_slice().is_empty() || d.as_slice().len() == MAX_DEPS);
        d.truncate(3);
        assert!(!d.complete());
    }
}
