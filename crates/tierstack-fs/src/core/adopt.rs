//! Adopting a copy as clean cache (`adopt` on the control socket): the stager hands the
//! daemon a local file holding the same bytes as a file already in BACKING (a stage-in
//! fan-out's copy, received from another node), and the daemon takes its pages into the store
//! as clean cache of that file, without writing BACKING and without a journal row: nothing of
//! it is ever drained.
//!
//! Whether it may is decided by [`decide`], a pure function of what the stager claims
//! ([`Claim`]: the copy's length, the source's mtime, the copy's xxh3), what BACKING's file is
//! ([`Stamp`], one `fstat`) and what the mount shows of it ([`View`]). A file the mount has
//! changed, one open for writing, one whose size or mtime in BACKING differs from the claim
//! (a source changed after the copy) or from what the mount shows, are refused; so is a copy
//! whose bytes do not hash to the claim, and a BACKING file that changed while the copy was
//! taken in ([`Stamp::same_file`]). BACKING's contents are never read: the size and the
//! nanosecond mtime are the check, as `make` and `rsync` use them.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};

use serde::{Deserialize, Serialize};
use tierstack_store::PageData;

use super::{Core, Kind, PAGE};

/// What the stager says of the copy it hands over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The copy's length in bytes (the source's size when it was read).
    pub len: u64,
    /// The source's modification time when it was read (ns since the epoch).
    pub mtime_ns: i64,
    /// The xxh3-64 of the copy's bytes, as the stager checked them.
    pub xxh3: u64,
}

/// BACKING's file as one `fstat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Device and inode number.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub len: u64,
    /// Modification time (ns).
    pub mtime_ns: i64,
    /// Status change time (ns).
    pub ctime_ns: i64,
    /// Owner.
    pub uid: u32,
}

impl Stamp {
    /// The stamp of an open file.
    pub fn of(f: &File) -> std::io::Result<Stamp> {
        let m = f.metadata()?;
        Ok(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
            uid: m.uid(),
        })
    }

    /// Whether `later` is the same file, unchanged (same inode, size and times).
    pub fn same_file(&self, later: &Stamp) -> bool {
        self == later
    }
}

/// What the mount shows of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct View {
    /// It is a regular file.
    pub regular: bool,
    /// Its size as the mount shows it.
    pub size: u64,
    /// Its mtime as the mount shows it (ns).
    pub mtime_ns: i64,
    /// It has a base in BACKING, and its first `base_len` bytes are the file.
    pub has_base: bool,
    /// Bytes of the base that are the file's contents.
    pub base_len: u64,
    /// Its contents differ from BACKING, or a data row of it waits in the journal, or a
    /// drain staged it under a temporary name, or a row of it is quarantined.
    pub changed: bool,
    /// Handles open on it that may write.
    pub open_w: u32,
    /// The base the mount holds open is another file than BACKING's at its path now
    /// (replaced there since the mount looked).
    pub base_replaced: bool,
}

/// Why a copy is not adopted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No such file in the mount (yet).
    #[error("the mount shows no file at this path (yet)")]
    Missing,
    /// Not a regular file.
    #[error("not a regular file")]
    NotAFile,
    /// The mount changed the file (it is its own, not BACKING's).
    #[error("the mount has changed this file: its contents are not BACKING's")]
    Changed,
    /// Open for writing through the mount.
    #[error("the file is open for writing through the mount")]
    OpenForWriting,
    /// BACKING's file differs from the claim (a source changed after the copy, or not written
    /// there yet).
    #[error("BACKING's file ({backing_len} bytes, mtime {backing_mtime_ns} ns) is not the copy's source ({claim_len} bytes, mtime {claim_mtime_ns} ns)")]
    BackingDiffers {
        /// BACKING's size.
        backing_len: u64,
        /// BACKING's mtime.
        backing_mtime_ns: i64,
        /// The claimed size.
        claim_len: u64,
        /// The claimed mtime.
        claim_mtime_ns: i64,
    },
    /// The mount shows another version of the file than BACKING holds now.
    #[error("the mount shows another version of this file than BACKING holds now")]
    MountStale,
    /// The caller may not: BACKING's file or the copy is not theirs.
    #[error("{0} does not belong to the caller")]
    NotOwner(&'static str),
    /// The copy is not what the claim says.
    #[error("the copy differs from the claim ({0})")]
    CopyDiffers(String),
    /// BACKING's file changed while the copy was taken in.
    #[error("BACKING's file changed while the copy was taken in")]
    ChangedMeanwhile,
    /// Reading the copy or BACKING failed.
    #[error("{0}")]
    Io(String),
}

impl Refusal {
    /// A short name of the refusal, as the control socket's answer gives it (`kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::NotAFile => "not_a_file",
            Refusal::Changed => "changed",
            Refusal::OpenForWriting => "open_for_writing",
            Refusal::BackingDiffers { .. } => "backing_differs",
            Refusal::MountStale => "mount_stale",
            Refusal::NotOwner(_) => "not_owner",
            Refusal::CopyDiffers(_) => "copy_differs",
            Refusal::ChangedMeanwhile => "changed_meanwhile",
            Refusal::Io(_) => "io",
        }
    }

    /// Whether asking again later may succeed (the file may not be in BACKING or in the
    /// mount's view yet, or was being replaced).
    pub fn may_pass_later(&self) -> bool {
        matches!(
            self,
            Refusal::Missing | Refusal::BackingDiffers { .. } | Refusal::ChangedMeanwhile
        )
    }
}

/// Whether the copy `claim` describes may become the clean cache of the file the mount shows
/// as `view`, whose BACKING file is `backing`, for a caller of uid `peer` (0: root) whose
/// copy is owned by `copy_uid` and `copy_len` bytes long.
pub fn decide(
    claim: &Claim,
    view: &View,
    backing: &Stamp,
    copy_len: u64,
    copy_uid: u32,
    peer: u32,
) -> Result<(), Refusal> {
    if !view.regular {
        return Err(Refusal::NotAFile);
    }
    if peer != 0 && copy_uid != peer {
        return Err(Refusal::NotOwner("the copy"));
    }
    if peer != 0 && backing.uid != peer {
        return Err(Refusal::NotOwner("BACKING's file"));
    }
    if view.changed || !view.has_base {
        return Err(Refusal::Changed);
    }
    if view.open_w > 0 {
        return Err(Refusal::OpenForWriting);
    }
    if copy_len != claim.len {
        return Err(Refusal::CopyDiffers(format!(
            "{copy_len} bytes, not {}",
            claim.len
        )));
    }
    if backing.len != claim.len || backing.mtime_ns != claim.mtime_ns {
        return Err(Refusal::BackingDiffers {
            backing_len: backing.len,
            backing_mtime_ns: backing.mtime_ns,
            claim_len: claim.len,
            claim_mtime_ns: claim.mtime_ns,
        });
    }
    if view.base_replaced
        || view.size != backing.len
        || view.base_len != backing.len
        || view.mtime_ns != backing.mtime_ns
    {
        return Err(Refusal::MountStale);
    }
    Ok(())
}

/// What an adoption did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Adopted {
    /// Bytes taken into the store as clean cache.
    pub bytes: u64,
    /// Bytes the store held already (left as they were).
    pub held: u64,
    /// Bytes left for reads to fetch from BACKING (the store had no room under its cache
    /// share).
    pub left: u64,
}

/// Reads up to `buf.len()` bytes of `f` at `off` (fewer at its end).
fn read_full(f: &File, off: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl Core {
    /// Takes the local file `copy` in as the clean cache of the file at `rel` (a path
    /// relative to the mount's root) for a caller of uid `peer`, if [`decide`] allows it.
    /// Nothing is written to BACKING or the journal. Takes `ns` (the lookups, then briefly)
    /// and holds the file's `FileData` while the copy is read.
    pub fn adopt(
        &self,
        rel: &[u8],
        copy: &File,
        claim: &Claim,
        peer: u32,
    ) -> Result<Adopted, Refusal> {
        let mut ino = super::ROOT;
        for name in rel.split(|b| *b == b'/').filter(|n| !n.is_empty()) {
            ino = self
                .lookup(ino, name)
                .map_err(|e| match e {
                    libc::ENOENT | libc::ENOTDIR => Refusal::Missing,
                    e => Refusal::Io(format!("lookup: errno {e}")),
                })?
                .ino;
        }
        let (data, obj, mut view) = {
            let ns = self.ns.lock();
            let n = ns.nodes.get(&ino).ok_or(Refusal::Missing)?;
            let Some(d) = n.data.clone().filter(|_| n.kind == Kind::File) else {
                return Err(Refusal::NotAFile);
            };
            let view = View {
                regular: true,
                mtime_ns: n.mtime,
                open_w: n.open_w,
                ..View::default()
            };
            (d, n.obj, view)
        };
        let stuck = self.stuck_inos.lock().contains(&ino);
        let mut f = data.lock();
        view.size = f.size;
        view.has_base = f.has_base;
        view.base_len = f.base_len;
        view.changed = f.dirty || f.data_pending || f.staged.is_some() || stuck;
        let bp = f.bpath.clone().ok_or(Refusal::Changed)?;
        let base = self
            .bk
            .open_file(&bp, rustix::fs::OFlags::RDONLY, 0)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Refusal::Missing,
                _ => Refusal::Io(format!("{}: {e}", self.bjoin(&bp).display())),
            })?;
        let io = |what: &str, e: std::io::Error| Refusal::Io(format!("{what}: {e}"));
        let before = Stamp::of(&base).map_err(|e| io("fstat BACKING's file", e))?;
        if let Some(held) = &f.base_fd {
            let h = Stamp::of(held).map_err(|e| io("fstat the base", e))?;
            view.base_replaced = (h.dev, h.ino) != (before.dev, before.ino);
        }
        let cm = copy.metadata().map_err(|e| io("fstat the copy", e))?;
        if !cm.is_file() {
            return Err(Refusal::CopyDiffers("not a regular file".into()));
        }
        decide(claim, &view, &before, cm.len(), cm.uid(), peer)?;
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        let mut taken: Vec<u64> = Vec::new();
        let mut done = Adopted::default();
        let mut p = 0u64;
        while p * PAGE < claim.len {
            let want = (claim.len - p * PAGE).min(PAGE) as usize;
            let mut buf = self.store.page_buf(want);
            buf.resize(want, 0);
            let got = read_full(copy, p * PAGE, &mut buf).map_err(|e| io("reading the copy", e))?;
            if got != want {
                self.unadopt(obj, &mut f, &taken);
                return Err(Refusal::CopyDiffers(format!(
                    "it ends at {} bytes",
                    p * PAGE + got as u64
                )));
            }
            h.update(&buf);
            if f.pages.contains_key(&p) {
                done.held += want as u64;
            } else if self.cache_clean(obj, &mut f, p, PageData::new(buf)) {
                taken.push(p);
                done.bytes += want as u64;
            } else {
                done.left += want as u64;
            }
            p += 1;
        }
        let sum = h.digest();
        let after = Stamp::of(&base).map_err(|e| io("fstat BACKING's file", e));
        let fail = if sum != claim.xxh3 {
            Some(Refusal::CopyDiffers(format!(
                "xxh3 {sum:016x}, not {:016x}",
                claim.xxh3
            )))
        } else {
            match after {
                Ok(a) if before.same_file(&a) => None,
                Ok(_) => Some(Refusal::ChangedMeanwhile),
                Err(e) => Some(e),
            }
        };
        if let Some(why) = fail {
            self.unadopt(obj, &mut f, &taken);
            return Err(why);
        }
        if f.base_fd.is_none() && self.base_fds.room() {
            f.base_fd = Some(self.base_fds.count(base));
        }
        Ok(done)
    }

    /// Drops the pages an adoption took before it was refused.
    fn unadopt(&self, obj: u64, f: &mut super::FileData, taken: &[u64]) {
        for p in taken {
            if let Err(e) = self.drop_page(obj, f, *p) {
                tracing::warn!("dropping an adopted page: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> Claim {
        Claim {
            len: 10,
            mtime_ns: 1_700_000_000_123_456_789,
            xxh3: 7,
        }
    }

    fn backing() -> Stamp {
        Stamp {
            dev: 1,
            ino: 2,
            len: 10,
            mtime_ns: 1_700_000_000_123_456_789,
            ctime_ns: 5,
            uid: 1000,
        }
    }

    fn view() -> View {
        View {
            regular: true,
            size: 10,
            mtime_ns: 1_700_000_000_123_456_789,
            has_base: true,
            base_len: 10,
            ..View::default()
        }
    }

    #[test]
    fn a_copy_of_an_unchanged_file_is_adopted() {
        assert_eq!(
            decide(&claim(), &view(), &backing(), 10, 1000, 1000),
            Ok(())
        );
        // Root may adopt anyone's.
        assert_eq!(decide(&claim(), &view(), &backing(), 10, 0, 0), Ok(()));
    }

    #[test]
    fn a_source_changed_after_the_copy_is_refused() {
        for b in [
            Stamp {
                len: 11,
                ..backing()
            },
            Stamp {
                mtime_ns: backing().mtime_ns + 1,
                ..backing()
            },
        ] {
            let r = decide(&claim(), &view(), &b, 10, 1000, 1000);
            assert!(
                matches!(r, Err(Refusal::BackingDiffers { .. })),
                "{b:?}: {r:?}"
            );
            assert!(r.as_ref().err().is_some_and(Refusal::may_pass_later));
        }
    }

    #[test]
    fn what_the_mount_changed_or_shows_otherwise_is_refused() {
        let cases = [
            (
                View {
                    regular: false,
                    ..view()
                },
                Refusal::NotAFile,
            ),
            (
                View {
                    changed: true,
                    ..view()
                },
                Refusal::Changed,
            ),
            (
                View {
                    has_base: false,
                    ..view()
                },
                Refusal::Changed,
            ),
            (
                View {
                    open_w: 1,
                    ..view()
                },
                Refusal::OpenForWriting,
            ),
            (View { size: 9, ..view() }, Refusal::MountStale),
            (
                View {
                    base_len: 4,
                    ..view()
                },
                Refusal::MountStale,
            ),
            (
                View {
                    mtime_ns: 1,
                    ..view()
                },
                Refusal::MountStale,
            ),
            (
                View {
                    base_replaced: true,
                    ..view()
                },
                Refusal::MountStale,
            ),
        ];
        for (v, want) in cases {
            assert_eq!(
                decide(&claim(), &v, &backing(), 10, 1000, 1000),
                Err(want.clone()),
                "{v:?}"
            );
            assert!(!want.may_pass_later());
        }
    }

    #[test]
    fn only_the_owner_or_root_may_adopt_and_the_copy_must_be_whole() {
        assert_eq!(
            decide(&claim(), &view(), &backing(), 10, 1001, 1001),
            Err(Refusal::NotOwner("BACKING's file"))
        );
        assert_eq!(
            decide(&claim(), &view(), &backing(), 10, 0, 1000),
            Err(Refusal::NotOwner("the copy"))
        );
        assert!(matches!(
            decide(&claim(), &view(), &backing(), 9, 1000, 1000),
            Err(Refusal::CopyDiffers(_))
        ));
    }

    #[test]
    fn a_stamp_is_the_same_file_only_when_nothing_moved() {
        let b = backing();
        assert!(b.same_file(&b));
        for later in [
            Stamp { ino: 3, ..b },
            Stamp { ctime_ns: 6, ..b },
            Stamp { len: 12, ..b },
        ] {
            assert!(!b.same_file(&later));
        }
    }
}
