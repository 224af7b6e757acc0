//! BACKING by handle: every access to the backing directory goes through directory file
//! descriptors, walking a relative path one component at a time (`openat` with
//! `O_NOFOLLOW`), and then acts on the last name with the `*at` call (`mkdirat`, `renameat`,
//! `unlinkat`, `linkat`, `symlinkat`, `mknodat`, `fchownat`, `utimensat` ...). No absolute
//! path is ever built, so any depth the mount accepts is drained exactly (a deep tree's
//! paths may be far longer than PATH_MAX), and a symlink in BACKING never redirects a drain.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps};

/// The backing directory, held open.
pub struct Backing {
    root: OwnedFd,
    path: PathBuf,
}

fn err(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

/// Timestamps of a nanosecond count since the epoch (negative: before it).
pub fn timespec(ns: i64) -> Timespec {
    Timespec {
        tv_sec: ns.div_euclid(1_000_000_000),
        tv_nsec: ns.rem_euclid(1_000_000_000) as _,
    }
}

/// Splits a relative path into its directory part and its last name (`a/b/c` -> `a/b`, `c`).
pub fn split(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|b| *b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&[], rel),
    }
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Owner, mode and times to give a node in BACKING.
#[derive(Clone, Copy, Debug)]
pub struct Attrs {
    /// Mode bits; only the permission, set-ID and sticky bits (`0o7777`) are applied.
    pub mode: u32,
    /// Owner's user id.
    pub uid: u32,
    /// Owner's group id.
    pub gid: u32,
    /// Last access time, in nanoseconds since the epoch (negative: before it).
    pub atime: i64,
    /// Last modification time, in nanoseconds since the epoch (negative: before it).
    pub mtime: i64,
}

impl Backing {
    /// Opens the backing directory.
    pub fn open(path: &Path) -> io::Result<Backing> {
        let root = rustix::fs::open(path, DIR_FLAGS, Mode::empty()).map_err(err)?;
        Ok(Backing {
            root,
            path: path.to_path_buf(),
        })
    }

    /// The backing directory's path (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `rel` under BACKING, for messages only (never opened).
    pub fn show(&self, rel: &[u8]) -> PathBuf {
        if rel.is_empty() {
            self.path.clone()
        } else {
            self.path.join(OsStr::from_bytes(rel))
        }
    }

    /// The root directory's descriptor.
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Opens directory `rel` (empty: the root), component by component, following no
    /// symlink.
    pub fn dir(&self, rel: &[u8]) -> io::Result<OwnedFd> {
        let mut cur = rustix::fs::openat(&self.root, ".", DIR_FLAGS, Mode::empty()).map_err(err)?;
        for comp in rel.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
            cur = rustix::fs::openat(&cur, comp, DIR_FLAGS, Mode::empty()).map_err(err)?;
        }
        Ok(cur)
    }

    /// The directory holding `rel`, opened, and the last name of `rel`.
    pub fn parent<'a>(&self, rel: &'a [u8]) -> io::Result<(OwnedFd, &'a [u8])> {
        let (d, name) = split(rel);
        if name.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok((self.dir(d)?, name))
    }

    /// Opens the regular file `rel` with `flags` (O_NOFOLLOW and O_CLOEXEC added).
    pub fn open_file(&self, rel: &[u8], flags: OFlags, mode: u32) -> io::Result<File> {
        let (d, name) = self.parent(rel)?;
        Self::open_in(&d, name, flags, mode)
    }

    /// Opens `name` in directory `d` with `flags` (O_NOFOLLOW and O_CLOEXEC added).
    pub fn open_in(d: &OwnedFd, name: &[u8], flags: OFlags, mode: u32) -> io::Result<File> {
        let fd = rustix::fs::openat(
            d,
            name,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(err)?;
        Ok(File::from(fd))
    }

    /// Gives `name` in `d` (a symlink is not followed) the owner, mode and times of `a`;
    /// symlinks keep their mode. Owner first: a chown clears set-ID bits the mode then sets.
    pub fn set_attrs_at(d: &OwnedFd, name: &[u8], a: &Attrs, symlink: bool) -> io::Result<()> {
        rustix::fs::chownat(
            d,
            name,
            Some(rustix::fs::Uid::from_raw(a.uid)),
            Some(rustix::fs::Gid::from_raw(a.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(err)?;
        if !symlink {
            rustix::fs::chmodat(
                d,
                name,
                Mode::from_raw_mode(a.mode & 0o7777),
                AtFlags::empty(),
            )
            .map_err(err)?;
        }
        let ts = Timestamps {
            last_access: timespec(a.atime),
            last_modification: timespec(a.mtime),
        };
        rustix::fs::utimensat(d, name, &ts, AtFlags::SYMLINK_NOFOLLOW).map_err(err)
    }

    /// Gives an open file the owner, mode and times of `a`.
    pub fn set_attrs_fd(f: &File, a: &Attrs) -> io::Result<()> {
        rustix::fs::fchown(
            f,
            Some(rustix::fs::Uid::from_raw(a.uid)),
            Some(rustix::fs::Gid::from_raw(a.gid)),
        )
        .map_err(err)?;
        rustix::fs::fchmod(f, Mode::from_raw_mode(a.mode & 0o7777)).map_err(err)?;
        let ts = Timestamps {
            last_access: timespec(a.atime),
            last_modification: timespec(a.mtime),
        };
        rustix::fs::futimens(f, &ts).map_err(err)
    }

    /// `mkdirat`; an existing directory is fine (a replay).
    pub fn mkdir(d: &OwnedFd, name: &[u8], mode: u32) -> io::Result<()> {
        match rustix::fs::mkdirat(d, name, Mode::from_raw_mode(mode)) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::EXIST) => {
                let st = rustix::fs::statat(d, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err)?;
                if rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::Directory
                {
                    Ok(())
                } else {
                    Err(io::Error::from_raw_os_error(libc::EEXIST))
                }
            }
            Err(e) => Err(err(e)),
        }
    }

    /// `symlinkat`; the same link already there is fine (a replay).
    pub fn symlink(d: &OwnedFd, name: &[u8], target: &[u8]) -> io::Result<()> {
        match rustix::fs::symlinkat(target, d, name) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::EXIST) => match rustix::fs::readlinkat(d, name, Vec::new()) {
                Ok(t) if t.as_bytes() == target => Ok(()),
                _ => Err(io::Error::from_raw_os_error(libc::EEXIST)),
            },
            Err(e) => Err(err(e)),
        }
    }

    /// `mknodat` of a FIFO, socket or device node (`mode` holds the type bits); the same
    /// kind of node already there is fine (a replay).
    pub fn mknod(d: &OwnedFd, name: &[u8], mode: u32, rdev: u64) -> io::Result<()> {
        let ft = rustix::fs::FileType::from_raw_mode(mode);
        match rustix::fs::mknodat(d, name, ft, Mode::from_raw_mode(mode & 0o7777), rdev) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::EXIST) => {
                let st = rustix::fs::statat(d, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err)?;
                if rustix::fs::FileType::from_raw_mode(st.st_mode) == ft {
                    Ok(())
                } else {
                    Err(io::Error::from_raw_os_error(libc::EEXIST))
                }
            }
            Err(e) => Err(err(e)),
        }
    }

    /// `linkat` (no symlink followed).
    pub fn link(od: &OwnedFd, oname: &[u8], nd: &OwnedFd, nname: &[u8]) -> io::Result<()> {
        rustix::fs::linkat(od, oname, nd, nname, AtFlags::empty()).map_err(err)
    }

    /// `renameat`.
    pub fn rename(od: &OwnedFd, oname: &[u8], nd: &OwnedFd, nname: &[u8]) -> io::Result<()> {
        rustix::fs::renameat(od, oname, nd, nname).map_err(err)
    }

    /// `unlinkat` of a non-directory (`dir`: of a directory).
    pub fn unlink(d: &OwnedFd, name: &[u8], dir: bool) -> io::Result<()> {
        let flags = if dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        rustix::fs::unlinkat(d, name, flags).map_err(err)
    }

    /// `lstat` of `name` in `d`.
    pub fn stat(d: &OwnedFd, name: &[u8]) -> io::Result<rustix::fs::Stat> {
        rustix::fs::statat(d, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err)
    }

    /// The target of symlink `name` in `d`.
    pub fn readlink(d: &OwnedFd, name: &[u8]) -> io::Result<Vec<u8>> {
        rustix::fs::readlinkat(d, name, Vec::new())
            .map(|c| c.into_bytes())
            .map_err(err)
    }

    /// The names in directory `d` (without `.` and `..`).
    pub fn list(d: &OwnedFd) -> io::Result<Vec<Vec<u8>>> {
        let mut dir = rustix::fs::Dir::read_from(d).map_err(err)?;
        let mut out = Vec::new();
        while let Some(e) = dir.read() {
            let e = e.map_err(err)?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                out.push(n.to_vec());
            }
        }
        Ok(out)
    }

    /// Flushes directory `d` (its entries) to disk.
    pub fn fsync_dir(d: &OwnedFd) -> io::Result<()> {
        rustix::fs::fsync(d).map_err(err)
    }
}

/// The extended attributes the mount keeps: the `user.`, `trusted.` and `security.`
/// namespaces and POSIX ACLs (`system.posix_acl_access`, `system.posix_acl_default`).
pub fn xattr_kept(name: &[u8]) -> bool {
    name.starts_with(b"user.")
        || name.starts_with(b"trusted.")
        || name.starts_with(b"security.")
        || name == b"system.posix_acl_access"
        || name == b"system.posix_acl_default"
}

/// `/proc/self/fd/N/NAME`: a path to `name` in `d` that the `l*xattr` calls take (they have
/// no `*at` form); it does not follow a symlink at `name`.
fn proc_path(d: &OwnedFd, name: &[u8]) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    let mut p = format!("/proc/self/fd/{}/", d.as_raw_fd()).into_bytes();
    p.extend_from_slice(if name.is_empty() { b"." } else { name });
    p
}

impl Backing {
    /// The kept extended attributes of `name` in `d` (none where the file system has none).
    pub fn xattrs(d: &OwnedFd, name: &[u8]) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let p = proc_path(d, name);
        let mut list = vec![0u8; 4096];
        let n = loop {
            match rustix::fs::llistxattr(p.as_slice(), &mut list[..]) {
                Ok(n) => break n,
                Err(rustix::io::Errno::RANGE) if list.len() < (1 << 20) => {
                    list.resize(list.len() * 4, 0)
                }
                Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
                Err(e) => return Err(err(e)),
            }
        };
        let mut out = Vec::new();
        for key in list[..n].split(|b| *b == 0).filter(|k| !k.is_empty()) {
            if !xattr_kept(key) {
                continue;
            }
            let mut v = vec![0u8; 65536];
            match rustix::fs::lgetxattr(p.as_slice(), key, &mut v[..]) {
                Ok(len) => {
                    v.truncate(len);
                    out.push((key.to_vec(), v));
                }
                Err(rustix::io::Errno::NODATA) => {}
                Err(e) => return Err(err(e)),
            }
        }
        Ok(out)
    }

    /// Sets extended attribute `key` of `name` in `d`.
    pub fn set_xattr(d: &OwnedFd, name: &[u8], key: &[u8], value: &[u8]) -> io::Result<()> {
        rustix::fs::lsetxattr(
            proc_path(d, name).as_slice(),
            key,
            value,
            rustix::fs::XattrFlags::empty(),
        )
        .map_err(err)
    }

    /// Removes extended attribute `key` of `name` in `d` (gone already is fine).
    pub fn remove_xattr(d: &OwnedFd, name: &[u8], key: &[u8]) -> io::Result<()> {
        match rustix::fs::lremovexattr(proc_path(d, name).as_slice(), key) {
            Ok(()) | Err(rustix::io::Errno::NODATA) => Ok(()),
            Err(e) => Err(err(e)),
        }
    }

    /// Sets extended attribute `key` of an open file.
    pub fn set_xattr_fd(f: &File, key: &[u8], value: &[u8]) -> io::Result<()> {
        rustix::fs::fsetxattr(f, key, value, rustix::fs::XattrFlags::empty()).map_err(err)
    }
}

/// The first offset at or after `off` where `file` holds data (`SEEK_DATA`); None when only
/// a hole follows. A file system without `SEEK_DATA` reports all of a file as data.
pub fn next_data(file: &std::fs::File, off: u64) -> io::Result<Option<u64>> {
    match rustix::fs::seek(file, rustix::fs::SeekFrom::Data(off)) {
        Ok(at) => Ok(Some(at)),
        Err(rustix::io::Errno::NXIO) => Ok(None),
        Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::OPNOTSUPP) => Ok(Some(off)),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// The first offset at or after `off` that is a hole in `file` (`SEEK_HOLE`; the end of the
/// file counts as one).
pub fn next_hole(file: &std::fs::File, off: u64) -> io::Result<u64> {
    match rustix::fs::seek(file, rustix::fs::SeekFrom::Hole(off)) {
        Ok(at) => Ok(at),
        Err(rustix::io::Errno::NXIO) => Ok(off),
        Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::OPNOTSUPP) => {
            Ok(file.metadata()?.len().max(off))
        }
        Err(e) => Err(io::Error::from(e)),
    }
}

/// The data ranges of the first `len` bytes of `file` (`SEEK_DATA`/`SEEK_HOLE`).
pub fn data_ranges(file: &std::fs::File, len: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < len {
        let Some(a) = next_data(file, off)? else {
            break;
        };
        if a >= len {
            break;
        }
        let b = next_hole(file, a)?.clamp(a + 1, len);
        out.push((a, b));
        off = b;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_takes_the_last_component() {
        assert_eq!(split(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
        assert_eq!(split(b"c"), (&b""[..], &b"c"[..]));
    }

    #[test]
    fn works_far_below_path_max() {
        let t = tempfile::tempdir().expect("tempdir");
        let b = Backing::open(t.path()).expect("open");
        let name = vec![b'd'; 200];
        let mut rel = Vec::new();
        for i in 0..40 {
            let (d, _) = (b.dir(&rel).expect("dir"), i);
            Backing::mkdir(&d, &name, 0o755).expect("mkdir");
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(&name);
        }
        assert!(rel.len() > 4096 + 3000);
        let mut leaf = rel.clone();
        leaf.extend_from_slice(b"/file");
        let f = b
            .open_file(&leaf, OFlags::WRONLY | OFlags::CREATE, 0o640)
            .expect("create deep");
        use std::io::Write;
        (&f).write_all(b"deep").expect("write");
        let (d, n) = b.parent(&leaf).expect("parent");
        assert_eq!(Backing::stat(&d, n).expect("stat").st_size, 4);
        Backing::mknod(&d, b"fifo", libc::S_IFIFO | 0o640, 0).expect("mkfifo");
        Backing::mknod(&d, b"fifo", libc::S_IFIFO | 0o640, 0).expect("replayed mkfifo");
        let st = Backing::stat(&d, b"fifo").expect("stat fifo");
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFIFO);
        assert_eq!(st.st_mode & 0o7777, 0o640);
        let mut names = Backing::list(&d).expect("list");
        names.sort();
        assert_eq!(names, vec![b"fifo".to_vec(), b"file".to_vec()]);
        // A symlink in BACKING is never followed on the way down.
        let root = b.dir(b"").expect("root");
        Backing::symlink(&root, b"link", &name).expect("symlink");
        assert!(b.dir(b"link").is_err());
        // Extended attributes through directory handles (where the file system has them).
        let (d, n) = b.parent(&leaf).expect("parent");
        if Backing::set_xattr(&d, n, b"user.k", b"v").is_ok() {
            assert_eq!(
                Backing::xattrs(&d, n).expect("xattrs"),
                vec![(b"user.k".to_vec(), b"v".to_vec())]
            );
            Backing::remove_xattr(&d, n, b"user.k").expect("remove");
            Backing::remove_xattr(&d, n, b"user.k").expect("remove again");
            assert!(Backing::xattrs(&d, n).expect("xattrs").is_empty());
        }
    }
}
