//! Mount points of this process's mount namespace, read from `/proc/self/mountinfo`: which
//! paths are mounted, and with what file-system type.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

const MOUNTINFO: &str = "/proc/self/mountinfo";

/// The mount points listed in /proc/self/mountinfo, decoded (`\040` is a space ...), in the
/// kernel's order; empty when the file cannot be read.
pub fn mount_points() -> Vec<PathBuf> {
    let info = std::fs::read_to_string(MOUNTINFO).unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(OsString::from_vec(unescape(m))))
        .collect()
}

/// Whether `mountpoint` is listed in /proc/self/mountinfo (as given, not canonicalized), and
/// the file-system type of its first mount.
pub fn mounted_type(mountpoint: &Path) -> Option<String> {
    let info = std::fs::read_to_string(MOUNTINFO).ok()?;
    type_in(&info, mountpoint)
}

/// Whether `p` (canonicalized where it can be) is a mount point.
pub fn is_mounted(p: &Path) -> bool {
    let c = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    mount_points().contains(&c)
}

/// One mount of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted (decoded).
    pub point: PathBuf,
    /// Its file-system type ("ext4", "tmpfs", "fuse"...).
    pub fstype: String,
    /// Its source field ("/dev/sda1", "tierstack:/gpfs/run42"...).
    pub source: String,
}

/// Every mount of this process's namespace, in the kernel's order.
pub fn mounts() -> Vec<Mount> {
    parse(&std::fs::read_to_string(MOUNTINFO).unwrap_or_default())
}

fn parse(info: &str) -> Vec<Mount> {
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some(Mount {
                point: PathBuf::from(OsString::from_vec(unescape(f.get(4)?))),
                fstype: f.get(sep + 1)?.to_string(),
                source: String::from_utf8_lossy(&unescape(f.get(sep + 2)?)).into_owned(),
            })
        })
        .collect()
}

/// The file-system type of the mount that holds `p` (the longest mount point above its
/// canonical path; the last such mount wins, as the kernel stacks them).
pub fn fs_type_of(p: &Path) -> Option<String> {
    let c = std::fs::canonicalize(p).ok()?;
    mounts()
        .into_iter()
        .filter(|m| c.starts_with(&m.point))
        .fold(None::<Mount>, |best, m| match best {
            Some(b) if b.point.as_os_str().len() > m.point.as_os_str().len() => Some(b),
            _ => Some(m),
        })
        .map(|m| m.fstype)
}

/// The file-system type of the first line of mountinfo text `info` that mounts `mountpoint`.
fn type_in(info: &str, mountpoint: &Path) -> Option<String> {
    let want = mountpoint.as_os_str().as_bytes();
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 5 {
            continue;
        }
        if unescape(f[4]) == want {
            // Optional fields end at a lone "-"; the type follows it.
            let sep = f.iter().position(|x| *x == "-")?;
            return f.get(sep + 1).map(|s| s.to_string());
        }
    }
    None
}

/// Decodes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134`
/// backslash) of a mountinfo field.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Some(v) = s
                .get(i + 1..i + 4)
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
        40 22 0:40 / /mnt/a\\040b rw,nosuid shared:2 master:1 - fuse.tierstack tierstack rw\n";

    #[test]
    fn types_and_escapes() {
        assert_eq!(type_in(INFO, Path::new("/")), Some("ext4".into()));
        assert_eq!(
            type_in(INFO, Path::new("/mnt/a b")),
            Some("fuse.tierstack".into())
        );
        assert_eq!(type_in(INFO, Path::new("/mnt/a")), None);
        assert_eq!(unescape("x\\011y\\134"), b"x\ty\\");
        assert_eq!(unescape("tail\\04"), b"tail\\04");
    }

    #[test]
    fn mounts_parse_with_their_source() {
        let m = parse(INFO);
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].point, PathBuf::from("/mnt/a b"));
        assert_eq!(m[1].fstype, "fuse.tierstack");
        assert_eq!(m[1].source, "tierstack");
        assert_eq!(fs_type_of(Path::new("/proc/self")).as_deref(), Some("proc"));
    }

    #[test]
    fn root_is_mounted() {
        assert!(is_mounted(Path::new("/")));
        assert!(mount_points().contains(&PathBuf::from("/")));
    }
}
