//! The FUSE wire format (the kernel's `include/uapi/linux/fuse.h`) of the requests and
//! answers both transports carry: a request's header (`fuse_in_header`, 40 bytes), the
//! operation's fixed argument (the "op header"), then its payload (names, a write's data);
//! an answer is an error number and the bytes of the operation's reply structure. FUSE over
//! io_uring hands the three parts apart; a `read` of `/dev/fuse` gives them back to back,
//! split by [`split`] (the fixed argument's size is [`arg_len`]). Decoding never trusts a
//! length: a short or unterminated request is answered EINVAL.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::FopenFlags;

use crate::attr::{Attr, PAGE};
use crate::ops::{Answer, Op, Out};

/// Opcodes (`enum fuse_opcode`).
pub mod opcode {
    #![allow(missing_docs)]
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
}

/// Seconds the kernel may keep entries and attributes (as over `/dev/fuse`, `fuse::TTL`).
const TTL_S: u64 = 3600;

/// `struct fuse_in_header`'s length.
pub const IN_HEADER: usize = 40;

/// A request's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The operation.
    pub opcode: u32,
    /// The request's id, echoed in the answer.
    pub unique: u64,
    /// The inode the request is about.
    pub nodeid: u64,
    /// The caller's user id.
    pub uid: u32,
    /// The caller's group id.
    pub gid: u32,
}

fn u32_at(b: &[u8], off: usize) -> Result<u32, i32> {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(libc::EINVAL)
}

fn u64_at(b: &[u8], off: usize) -> Result<u64, i32> {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or(libc::EINVAL)
}

/// A request's header from its first [`IN_HEADER`] bytes.
pub fn header(b: &[u8]) -> Result<Header, i32> {
    Ok(Header {
        opcode: u32_at(b, 4)?,
        unique: u64_at(b, 8)?,
        nodeid: u64_at(b, 16)?,
        uid: u32_at(b, 24)?,
        gid: u32_at(b, 28)?,
    })
}

/// The NUL-terminated string at the start of `b`, and what follows its NUL.
fn cstr(b: &[u8]) -> Result<(&[u8], &[u8]), i32> {
    let n = b.iter().position(|&c| c == 0).ok_or(libc::EINVAL)?;
    if n == 0 {
        return Err(libc::EINVAL);
    }
    Ok((&b[..n], &b[n + 1..]))
}

/// A time from seconds and nanoseconds since the epoch.
fn time(secs: u64, nsecs: u32) -> SystemTime {
    let s = secs as i64;
    let d = Duration::new(s.unsigned_abs(), 0);
    let t = if s >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    };
    t + Duration::from_nanos(u64::from(nsecs.min(999_999_999)))
}

/// What to do with a request.
#[derive(Debug)]
pub enum Request<'a> {
    /// Serve the operation ([`crate::fuse::TierFs::answer`]).
    Serve(Op<'a>),
    /// Answer at once: 0 (done) or an errno, with nothing in the answer.
    Answer(i32),
    /// The kernel dropped its copies of these inodes (FORGET, BATCH_FORGET), each with the
    /// lookup count it drops: no answer.
    Forget(Vec<(u64, u64)>),
    /// Nothing to do and no answer (INTERRUPT: every operation here runs to its end).
    Silent,
}

/// The size of the fixed argument (`struct fuse_*_in`) that precedes the payload of the
/// operations that have one, as a `read` of `/dev/fuse` delivers them (protocol 7.23 and
/// later; `setxattr` without `FUSE_SETXATTR_EXT`, which INIT does not ask for); 0 for those
/// whose payload follows the header at once, None for those without a payload.
pub fn arg_len(opcode: u32) -> Option<usize> {
    use opcode::*;
    match opcode {
        LOOKUP | SYMLINK | UNLINK | RMDIR | REMOVEXATTR => Some(0),
        MKDIR | RENAME | LINK | SETXATTR | GETXATTR => Some(8),
        MKNOD | RENAME2 | CREATE => Some(16),
        WRITE => Some(40),
        _ => None,
    }
}

/// A request's fixed argument and payload from the bytes after its header, as a `read` of
/// `/dev/fuse` delivers them (back to back; see [`arg_len`]). A body shorter than its fixed
/// argument gives an empty payload, which decoding answers EINVAL.
pub fn split(opcode: u32, body: &[u8]) -> (&[u8], &[u8]) {
    match arg_len(opcode) {
        Some(n) if n <= body.len() => (&body[..n], &body[n..]),
        Some(_) => (body, &[]),
        None => (body, &[]),
    }
}

/// The bytes a `struct fuse_direntplus` with a name of `name_len` bytes takes in a
/// READDIRPLUS answer (the entry, the dirent, the name padded to 8 bytes).
pub fn direntplus_len(name_len: usize) -> usize {
    128 + (24 + name_len).next_multiple_of(8)
}

/// A decoded request, and the most bytes its answer may hold (what a read, readdir or
/// getxattr asked for).
#[derive(Debug)]
pub struct Decoded<'a> {
    /// What to do.
    pub request: Request<'a>,
    /// The answer's limit in bytes (`usize::MAX`: the buffer's).
    pub limit: usize,
}

/// Decodes the request with header `h`, fixed argument `arg` and payload `payload`.
/// Errors: an errno to answer with (EINVAL for a malformed request).
pub fn decode<'a>(h: &Header, arg: &'a [u8], payload: &'a [u8]) -> Result<Decoded<'a>, i32> {
    use opcode::*;
    let ino = h.nodeid;
    let mut limit = usize::MAX;
    let op = match h.opcode {
        LOOKUP => Op::Lookup {
            parent: ino,
            name: cstr(payload)?.0,
        },
        GETATTR => Op::Getattr { ino },
        SETATTR => {
            const MODE: u32 = 1;
            const UID: u32 = 1 << 1;
            const GID: u32 = 1 << 2;
            const SIZE: u32 = 1 << 3;
            const ATIME: u32 = 1 << 4;
            const MTIME: u32 = 1 << 5;
            const FH: u32 = 1 << 6;
            const ATIME_NOW: u32 = 1 << 7;
            const MTIME_NOW: u32 = 1 << 8;
            let valid = u32_at(arg, 0)?;
            let has = |bit: u32| valid & bit != 0;
            let at = |flag: u32, now: u32, secs: usize, nsecs: usize| -> Result<_, i32> {
                Ok(if !has(flag) {
                    None
                } else if has(now) {
                    Some(None)
                } else {
                    Some(Some(time(u64_at(arg, secs)?, u32_at(arg, nsecs)?)))
                })
            };
            Op::Setattr {
                ino,
                mode: has(MODE).then(|| u32_at(arg, 68)).transpose()?,
                uid: has(UID).then(|| u32_at(arg, 76)).transpose()?,
                gid: has(GID).then(|| u32_at(arg, 80)).transpose()?,
                size: has(SIZE).then(|| u64_at(arg, 16)).transpose()?,
                atime: at(ATIME, ATIME_NOW, 32, 56)?,
                mtime: at(MTIME, MTIME_NOW, 40, 60)?,
                fh: has(FH).then(|| u64_at(arg, 8)).transpose()?,
            }
        }
        READLINK => Op::Readlink { ino },
        SYMLINK => {
            let (name, rest) = cstr(payload)?;
            Op::Symlink {
                parent: ino,
                name,
                target: cstr(rest)?.0,
            }
        }
        MKNOD => Op::Mknod {
            parent: ino,
            name: cstr(payload)?.0,
            mode: u32_at(arg, 0)?,
            rdev: u32_at(arg, 4)?,
            umask: u32_at(arg, 8)?,
        },
        MKDIR => Op::Mkdir {
            parent: ino,
            name: cstr(payload)?.0,
            mode: u32_at(arg, 0)?,
            umask: u32_at(arg, 4)?,
        },
        UNLINK => Op::Unlink {
            parent: ino,
            name: cstr(payload)?.0,
        },
        RMDIR => Op::Rmdir {
            parent: ino,
            name: cstr(payload)?.0,
        },
        RENAME | RENAME2 => {
            let (name, rest) = cstr(payload)?;
            Op::Rename {
                parent: ino,
                name,
                newparent: u64_at(arg, 0)?,
                newname: cstr(rest)?.0,
                flags: if h.opcode == RENAME2 {
                    u32_at(arg, 8)?
                } else {
                    0
                },
            }
        }
        LINK => Op::Link {
            ino: u64_at(arg, 0)?,
            newparent: ino,
            newname: cstr(payload)?.0,
        },
        OPEN => Op::Open {
            ino,
            flags: u32_at(arg, 0)? as i32,
        },
        // struct fuse_read_in: fh, offset, size, ...; the answer holds at most `size` bytes.
        READ | READDIR | READDIRPLUS => {
            let (offset, size) = (u64_at(arg, 8)?, u32_at(arg, 16)?);
            limit = size as usize;
            match h.opcode {
                READ => Op::Read { ino, offset, size },
                READDIR => Op::Readdir { ino, offset, size },
                _ => Op::Readdirplus { ino, offset, size },
            }
        }
        WRITE => {
            /// `FUSE_WRITE_KILL_SUIDGID`.
            const KILL_SUIDGID: u32 = 1 << 2;
            let size = u32_at(arg, 16)? as usize;
            Op::Write {
                ino,
                fh: u64_at(arg, 0)?,
                offset: u64_at(arg, 8)?,
                data: payload.get(..size).ok_or(libc::EINVAL)?,
                kill_suidgid: u32_at(arg, 20)? & KILL_SUIDGID != 0,
            }
        }
        STATFS => Op::Statfs,
        RELEASE => Op::Release {
            ino,
            fh: u64_at(arg, 0)?,
        },
        FSYNC => Op::Fsync { ino },
        SETXATTR => {
            let size = u32_at(arg, 0)? as usize;
            let (name, rest) = cstr(payload)?;
            Op::Setxattr {
                ino,
                name,
                value: rest.get(..size).ok_or(libc::EINVAL)?,
                flags: u32_at(arg, 4)? as i32,
            }
        }
        GETXATTR => {
            let size = u32_at(arg, 0)?;
            limit = size as usize;
            Op::Getxattr {
                ino,
                name: cstr(payload)?.0,
                size,
            }
        }
        LISTXATTR => {
            let size = u32_at(arg, 0)?;
            limit = size as usize;
            Op::Listxattr { ino, size }
        }
        REMOVEXATTR => Op::Removexattr {
            ino,
            name: cstr(payload)?.0,
        },
        FLUSH => Op::Flush {
            ino,
            fh: u64_at(arg, 0)?,
        },
        OPENDIR => Op::Opendir { ino },
        FSYNCDIR => Op::Fsyncdir { ino },
        // struct fuse_fallocate_in: fh, offset, length, mode.
        FALLOCATE => Op::Fallocate {
            ino,
            offset: u64_at(arg, 8)?,
            length: u64_at(arg, 16)?,
            mode: u32_at(arg, 24)? as i32,
        },
        // struct fuse_lseek_in: fh, offset, whence.
        LSEEK => Op::Lseek {
            ino,
            offset: u64_at(arg, 8)?,
            whence: u32_at(arg, 16)? as i32,
        },
        CREATE => Op::Create {
            parent: ino,
            name: cstr(payload)?.0,
            flags: u32_at(arg, 0)? as i32,
            mode: u32_at(arg, 4)?,
            umask: u32_at(arg, 8)?,
        },
        RELEASEDIR | DESTROY => {
            return Ok(Decoded {
                request: Request::Answer(0),
                limit,
            })
        }
        // struct fuse_forget_in: the lookup count to drop.
        FORGET => {
            return Ok(Decoded {
                request: Request::Forget(vec![(ino, u64_at(arg, 0).unwrap_or(0))]),
                limit,
            })
        }
        // struct fuse_batch_forget_in: count, dummy; then count × fuse_forget_one (nodeid,
        // nlookup), which may follow as payload (io_uring) or in the argument (`/dev/fuse`).
        BATCH_FORGET => {
            let count = u32_at(arg, 0)? as usize;
            let ones = if payload.is_empty() {
                arg.get(8..).unwrap_or_default()
            } else {
                payload
            };
            let inos = (0..count)
                .map_while(|i| Some((u64_at(ones, i * 16).ok()?, u64_at(ones, i * 16 + 8).ok()?)))
                .collect();
            return Ok(Decoded {
                request: Request::Forget(inos),
                limit,
            });
        }
        INTERRUPT => {
            return Ok(Decoded {
                request: Request::Silent,
                limit,
            })
        }
        // What `fuser` answers for the operations the mount does not implement.
        _ => {
            return Ok(Decoded {
                request: Request::Answer(libc::ENOSYS),
                limit,
            })
        }
    };
    Ok(Decoded {
        request: Request::Serve(op),
        limit,
    })
}

/// Appends `v`'s little-endian bytes to `out`.
trait Put {
    fn put(&mut self, v: impl Into<Field>);
}

/// A field of a reply structure.
enum Field {
    U32(u32),
    U64(u64),
}

impl From<u32> for Field {
    fn from(v: u32) -> Field {
        Field::U32(v)
    }
}

impl From<u64> for Field {
    fn from(v: u64) -> Field {
        Field::U64(v)
    }
}

impl Put for Vec<u8> {
    fn put(&mut self, v: impl Into<Field>) {
        match v.into() {
            Field::U32(x) => self.extend_from_slice(&x.to_le_bytes()),
            Field::U64(x) => self.extend_from_slice(&x.to_le_bytes()),
        }
    }
}

/// Seconds and nanoseconds of a time in nanoseconds since the epoch.
fn split_ns(ns: i64) -> (u64, u32) {
    (
        ns.div_euclid(1_000_000_000) as u64,
        ns.rem_euclid(1_000_000_000) as u32,
    )
}

/// `struct fuse_attr` (88 bytes); `None`: all zeros (a negative entry's).
fn put_attr(out: &mut Vec<u8>, a: Option<&Attr>) {
    let Some(a) = a else {
        out.resize(out.len() + 88, 0);
        return;
    };
    let (at, atn) = split_ns(a.atime);
    let (mt, mtn) = split_ns(a.mtime);
    let (ct, ctn) = split_ns(a.ctime);
    for v in [a.ino, a.size, a.blocks, at, mt, ct] {
        out.put(v);
    }
    for v in [
        atn,
        mtn,
        ctn,
        a.kind.mode_bits() | (a.mode & 0o7777),
        a.nlink,
        a.uid,
        a.gid,
        a.rdev as u32,
        PAGE as u32,
        0,
    ] {
        out.put(v);
    }
}

/// `struct fuse_entry_out` (128 bytes); `ttl`: how long the kernel keeps the entry (and a
/// node's attributes), as seconds and nanoseconds.
fn put_entry(out: &mut Vec<u8>, a: Option<&Attr>, ttl: (u64, u32)) {
    out.put(a.map_or(0, |a| a.ino));
    out.put(a.map_or(0, |a| a.generation as u64));
    out.put(ttl.0);
    out.put(ttl.0);
    out.put(ttl.1);
    out.put(ttl.1);
    put_attr(out, a);
}

/// The kernel's entry and attribute timeout of a node the mount answers for.
const TTL: (u64, u32) = (TTL_S, 0);

/// `struct fuse_open_out` (16 bytes).
fn put_open(out: &mut Vec<u8>, fh: u64, flags: FopenFlags) {
    out.put(fh);
    out.put(flags.bits());
    out.put(0u32); // backing_id
}

/// Encodes answer `r` into `out`: the error to put in the answer's header (0 or a negative
/// errno) and the reply's bytes, at most `limit` of them (an answer that does not fit is
/// ERANGE for extended attributes, EIO otherwise; a directory listing stops at the limit).
pub fn encode(r: &Answer, limit: usize, out: &mut Vec<u8>) -> i32 {
    out.clear();
    let r = match r {
        Err(e) => return -e.abs(),
        Ok(o) => o,
    };
    match r {
        Out::Entry(a) => put_entry(out, Some(a), TTL),
        Out::Negative(ttl) => put_entry(out, None, (ttl.as_secs(), ttl.subsec_nanos())),
        Out::Attr(a) => {
            out.put(TTL_S);
            out.put(0u32);
            out.put(0u32);
            put_attr(out, Some(a));
        }
        Out::Data(v) => {
            if v.len() > limit {
                return -libc::EIO;
            }
            out.extend_from_slice(v);
        }
        Out::Size(n) => {
            out.put(*n);
            out.put(0u32);
        }
        Out::Empty => {}
        Out::Open(fh, f) => put_open(out, *fh, *f),
        Out::Created(a, fh, f) => {
            put_entry(out, Some(a), TTL);
            put_open(out, *fh, *f);
        }
        Out::Written(n) => {
            out.put(*n);
            out.put(0u32);
        }
        Out::Offset(o) => out.put(*o),
        Out::Statfs(s) => {
            for v in [s.blocks, s.bfree, s.bavail, 0, 0] {
                out.put(v);
            }
            for v in [s.bsize, s.namelen, s.bsize, 0, 0, 0, 0, 0, 0, 0] {
                out.put(v);
            }
        }
        Out::Dir(ents) => {
            for (ino, pos, kind, name) in ents {
                // `struct fuse_dirent`: 24 bytes, the name, padding to 8 bytes.
                let len = (24 + name.len()).next_multiple_of(8);
                if out.len() + len > limit {
                    break;
                }
                out.put(*ino);
                out.put(*pos);
                out.put(name.len() as u32);
                out.put(kind.mode_bits() >> 12);
                out.extend_from_slice(name);
                out.resize(out.len().next_multiple_of(8), 0);
            }
        }
        Out::DirPlus(ents) => {
            for (a, pos, name) in ents {
                // `struct fuse_direntplus`: the entry as a lookup answers it, then the dirent.
                if out.len() + direntplus_len(name.len()) > limit {
                    break;
                }
                put_entry(out, Some(a), TTL);
                out.put(a.ino);
                out.put(*pos);
                out.put(name.len() as u32);
                out.put(a.kind.mode_bits() >> 12);
                out.extend_from_slice(name);
                out.resize(out.len().next_multiple_of(8), 0);
            }
        }
    }
    0
}

/// Encodes answer `r` into `buf` (the ring entry's payload buffer): the error for the
/// answer's header and the bytes written. A read's data is copied once, straight into `buf`;
/// other answers are built in `scratch` first (a few dozen bytes, or a directory listing).
pub fn encode_into(
    r: &Answer,
    limit: usize,
    buf: &mut [u8],
    scratch: &mut Vec<u8>,
) -> (i32, usize) {
    let limit = limit.min(buf.len());
    if let Ok(Out::Data(v)) = r {
        if v.len() > limit {
            return (-libc::EIO, 0);
        }
        buf[..v.len()].copy_from_slice(v);
        return (0, v.len());
    }
    let error = encode(r, limit, scratch);
    if scratch.len() > buf.len() {
        return (-libc::EIO, 0);
    }
    buf[..scratch.len()].copy_from_slice(scratch);
    (error, scratch.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::Kind;
    use proptest::prelude::*;

    fn hdr(opcode: u32) -> Header {
        Header {
            opcode,
            unique: 7,
            nodeid: 1,
            uid: 1000,
            gid: 100,
        }
    }

    #[test]
    fn header_fields_are_where_the_kernel_puts_them() {
        let mut b = vec![0u8; IN_HEADER];
        b[4..8].copy_from_slice(&35u32.to_le_bytes());
        b[8..16].copy_from_slice(&99u64.to_le_bytes());
        b[16..24].copy_from_slice(&5u64.to_le_bytes());
        b[24..28].copy_from_slice(&1000u32.to_le_bytes());
        b[28..32].copy_from_slice(&100u32.to_le_bytes());
        assert_eq!(
            header(&b),
            Ok(Header {
                opcode: 35,
                unique: 99,
                nodeid: 5,
                uid: 1000,
                gid: 100
            })
        );
        assert_eq!(header(&b[..20]), Err(libc::EINVAL));
    }

    #[test]
    fn create_rename_write_and_setattr_decode() {
        let mut arg = vec![0u8; 16];
        arg[0..4].copy_from_slice(&(libc::O_WRONLY as u32).to_le_bytes());
        arg[4..8].copy_from_slice(&0o100644u32.to_le_bytes());
        arg[8..12].copy_from_slice(&0o022u32.to_le_bytes());
        let d = decode(&hdr(opcode::CREATE), &arg, b"f1\0").expect("create");
        assert!(matches!(
            d.request,
            Request::Serve(Op::Create { parent: 1, name: b"f1", mode: 0o100644, umask: 0o022, flags }) if flags == libc::O_WRONLY
        ));
        let mut arg = vec![0u8; 16];
        arg[0..8].copy_from_slice(&9u64.to_le_bytes());
        arg[8..12].copy_from_slice(&1u32.to_le_bytes());
        let d = decode(&hdr(opcode::RENAME2), &arg, b"a\0b\0").expect("rename2");
        assert!(matches!(
            d.request,
            Request::Serve(Op::Rename {
                parent: 1,
                name: b"a",
                newparent: 9,
                newname: b"b",
                flags: 1
            })
        ));
        let mut arg = vec![0u8; 40];
        arg[0..8].copy_from_slice(&3u64.to_le_bytes());
        arg[8..16].copy_from_slice(&4096u64.to_le_bytes());
        arg[16..20].copy_from_slice(&4u32.to_le_bytes());
        arg[20..24].copy_from_slice(&4u32.to_le_bytes());
        let d = decode(&hdr(opcode::WRITE), &arg, b"abcdefgh").expect("write");
        assert!(matches!(
            d.request,
            Request::Serve(Op::Write {
                fh: 3,
                offset: 4096,
                data: b"abcd",
                kill_suidgid: true,
                ..
            })
        ));
        let mut arg = vec![0u8; 88];
        arg[0..4].copy_from_slice(&(1u32 | (1 << 5) | (1 << 8)).to_le_bytes());
        arg[68..72].copy_from_slice(&0o100600u32.to_le_bytes());
        let d = decode(&hdr(opcode::SETATTR), &arg, b"").expect("setattr");
        assert!(matches!(
            d.request,
            Request::Serve(Op::Setattr {
                mode: Some(0o100600),
                mtime: Some(None),
                atime: None,
                size: None,
                ..
            })
        ));
    }

    #[test]
    fn unknown_and_short_requests_are_answered_not_served() {
        // FUSE_COPY_FILE_RANGE, which the mount leaves to the kernel's fallback.
        let d = decode(&hdr(47), &[], &[]).expect("copy_file_range");
        assert!(matches!(d.request, Request::Answer(libc::ENOSYS)));
        // FUSE_LSEEK: fh, offset, whence.
        let mut arg = [0u8; 24];
        arg[8..16].copy_from_slice(&4096u64.to_le_bytes());
        arg[16..20].copy_from_slice(&(libc::SEEK_HOLE as u32).to_le_bytes());
        let d = decode(&hdr(opcode::LSEEK), &arg, b"").expect("lseek");
        assert!(matches!(
            d.request,
            Request::Serve(Op::Lseek {
                offset: 4096,
                whence: libc::SEEK_HOLE,
                ..
            })
        ));
        assert_eq!(
            decode(&hdr(opcode::LSEEK), &arg[..12], b"").err(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            decode(&hdr(opcode::LOOKUP), &[], b"no-nul").err(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            decode(&hdr(opcode::WRITE), &[0u8; 40][..20], b"").err(),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn answers_have_the_kernel_structures_sizes() {
        let a = Attr {
            ino: 5,
            kind: Kind::File,
            mode: 0o644,
            uid: 1,
            gid: 2,
            size: 100,
            atime: -1,
            mtime: 1_500_000_000,
            ctime: 0,
            nlink: 1,
            rdev: 0,
            blocks: 8,
            generation: 7,
        };
        let mut out = Vec::new();
        assert_eq!(encode(&Ok(Out::Entry(a.clone())), usize::MAX, &mut out), 0);
        assert_eq!(out.len(), 128);
        // fuse_entry_out: nodeid, then the generation a file handle is made of.
        assert_eq!((u64_at(&out, 0), u64_at(&out, 8)), (Ok(5), Ok(7)));
        assert_eq!(u32_at(&out, 40 + 60), Ok(libc::S_IFREG | 0o644));
        // atime -1 ns: second -1, nanosecond 999,999,999.
        assert_eq!(u64_at(&out, 40 + 24), Ok(u64::MAX));
        encode(&Ok(Out::Attr(a.clone())), usize::MAX, &mut out);
        assert_eq!(out.len(), 104);
        encode(
            &Ok(Out::Created(a, 9, FopenFlags::FOPEN_DIRECT_IO)),
            usize::MAX,
            &mut out,
        );
        assert_eq!(out.len(), 144);
        assert_eq!(u64_at(&out, 128), Ok(9));
        assert_eq!(
            encode(&Err(libc::ENOENT), usize::MAX, &mut out),
            -libc::ENOENT
        );
        assert!(out.is_empty());
        assert_eq!(encode(&Ok(Out::Data(vec![1; 10])), 4, &mut out), -libc::EIO);
        let ents = (0..200)
            .map(|i| (i + 2, i + 1, Kind::File, format!("name{i}").into_bytes()))
            .collect();
        encode(&Ok(Out::Dir(ents)), 4096, &mut out);
        assert!(out.len() <= 4096 && out.len() > 4096 - 40 && out.len() % 8 == 0);
    }

    #[test]
    fn a_dev_fuse_body_splits_into_argument_and_payload() {
        // mkdir as `read` of /dev/fuse delivers it: fuse_mkdir_in (mode, umask), then the name.
        let mut body = Vec::new();
        body.extend_from_slice(&0o755u32.to_le_bytes());
        body.extend_from_slice(&0o022u32.to_le_bytes());
        body.extend_from_slice(b"dir\0");
        let (arg, payload) = split(opcode::MKDIR, &body);
        let d = decode(&hdr(opcode::MKDIR), arg, payload).expect("mkdir");
        assert!(matches!(
            d.request,
            Request::Serve(Op::Mkdir {
                name: b"dir",
                mode: 0o755,
                umask: 0o022,
                ..
            })
        ));
        // A write's data follows its 40-byte fuse_write_in.
        let mut body = vec![0u8; 40];
        body[16..20].copy_from_slice(&3u32.to_le_bytes());
        body.extend_from_slice(b"xyz");
        let (arg, payload) = split(opcode::WRITE, &body);
        assert_eq!((arg.len(), payload), (40, &b"xyz"[..]));
        // Without a payload, the whole body is the argument; a short body decodes as EINVAL.
        assert_eq!(split(opcode::READ, &[0u8; 40]).0.len(), 40);
        let (arg, payload) = split(opcode::CREATE, &[0u8; 10]);
        assert_eq!(
            decode(&hdr(opcode::CREATE), arg, payload).err(),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn forgets_and_interrupts_take_no_answer() {
        let d = decode(&hdr(opcode::FORGET), &[1, 0, 0, 0, 0, 0, 0, 0], b"").expect("forget");
        assert!(matches!(d.request, Request::Forget(ref v) if v == &[(1, 1)]));
        // fuse_batch_forget_in (count 2), then two fuse_forget_one, as /dev/fuse delivers them.
        let mut body = vec![0u8; 8];
        body[0..4].copy_from_slice(&2u32.to_le_bytes());
        for ino in [7u64, 9] {
            body.extend_from_slice(&ino.to_le_bytes());
            body.extend_from_slice(&(ino - 5).to_le_bytes());
        }
        let (arg, payload) = split(opcode::BATCH_FORGET, &body);
        let d = decode(&hdr(opcode::BATCH_FORGET), arg, payload).expect("batch forget");
        assert!(matches!(d.request, Request::Forget(ref v) if v == &[(7, 2), (9, 4)]));
        // A count larger than what follows forgets what is there.
        body[0..4].copy_from_slice(&5u32.to_le_bytes());
        let d = decode(&hdr(opcode::BATCH_FORGET), &body, b"").expect("short batch");
        assert!(matches!(d.request, Request::Forget(ref v) if v.len() == 2));
        let d = decode(&hdr(opcode::INTERRUPT), &[0u8; 8], b"").expect("interrupt");
        assert!(matches!(d.request, Request::Silent));
    }

    #[test]
    fn readdirplus_answers_entries_with_attributes_within_the_limit() {
        let mut arg = [0u8; 40];
        arg[8..16].copy_from_slice(&2u64.to_le_bytes());
        arg[16..20].copy_from_slice(&4096u32.to_le_bytes());
        let d = decode(&hdr(opcode::READDIRPLUS), &arg, b"").expect("readdirplus");
        assert_eq!(d.limit, 4096);
        assert!(matches!(
            d.request,
            Request::Serve(Op::Readdirplus {
                offset: 2,
                size: 4096,
                ..
            })
        ));
        let attr = |ino| Attr {
            ino,
            kind: Kind::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            nlink: 2,
            rdev: 0,
            blocks: 0,
            generation: 1,
        };
        let ents: Vec<_> = (0..100)
            .map(|i| (attr(i + 2), i + 1, format!("d{i}").into_bytes()))
            .collect();
        let mut out = Vec::new();
        assert_eq!(encode(&Ok(Out::DirPlus(ents)), 4096, &mut out), 0);
        let each = direntplus_len(2);
        assert_eq!(each, 128 + 32);
        assert_eq!(out.len(), 4096 / each * each);
        // The first entry: nodeid, then its dirent after the 128-byte entry: ino, off,
        // namelen, type (DT_DIR), name.
        assert_eq!(u64_at(&out, 0), Ok(2));
        assert_eq!(u64_at(&out, 128), Ok(2));
        assert_eq!(u64_at(&out, 136), Ok(1));
        assert_eq!(u32_at(&out, 144), Ok(2));
        assert_eq!(u32_at(&out, 148), Ok(4));
        assert_eq!(&out[152..154], b"d0");
    }

    proptest! {
        /// No request, however malformed, makes the decoder panic or read out of bounds.
        #[test]
        fn any_bytes_decode_without_panicking(
            op in 0u32..60,
            arg in proptest::collection::vec(any::<u8>(), 0..140),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let _ = decode(&hdr(op), &arg, &payload);
        }
    }
}
