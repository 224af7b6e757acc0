//! Planning a stage from SRC DST paths: the walk of the source tree, hard-link groups and
//! the checks on the destinations, all before anything is written.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{
    io_err, DirJob, FileJob, HardLinkJob, LinkJob, Plan, SpecialJob, SpecialKind, StageError,
};

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

pub(super) fn has_trailing_slash(p: &Path) -> bool {
    p.as_os_str().as_encoded_bytes().last() == Some(&b'/')
}

/// Adds one source (file, directory tree or, at the top, a link followed to what it names) to
/// the plan.
pub(super) fn add_entry(
    plan: &mut Plan,
    src: &Path,
    dst: &Path,
    dst_is_dir: bool,
) -> Result<(), StageError> {
    let meta = match fs::metadata(src) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(StageError::Refused(format!(
                "source {} does not exist: check the path",
                src.display()
            )))
        }
        Err(e) => return Err(io_err("read", src)(e).into()),
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
pub(super) fn canonical_prefix(p: &Path) -> io::Result<PathBuf> {
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
pub(super) fn check_dst_dir(d: &Path) -> Result<(), StageError> {
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
pub(super) fn check_dst_file(f: &Path) -> Result<(), StageError> {
    match fs::symlink_metadata(f) {
        Ok(m) if m.is_dir() => Err(StageError::Refused(format!(
            "destination {} is a directory but its source is a file: give a file name or remove the directory",
            f.display()
        ))),
        _ => Ok(()),
    }
}

/// Walks the directory `src` (not following symlinks) and plans its contents into `dst`.
pub(super) fn walk(plan: &mut Plan, src: &Path, dst: &Path) -> Result<(), StageError> {
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
pub(super) fn link_id(meta: &fs::Metadata) -> Option<(u64, u64)> {
    (meta.nlink() > 1).then(|| (meta.dev(), meta.ino()))
}

/// Turns every further name (another source path) of an inode already planned into a hard
/// link to the first name's destination.
pub(super) fn group_hard_links(plan: &mut Plan) {
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
pub(super) fn check_duplicates(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{execute, plan_manifest, Options};
    use std::sync::atomic::AtomicBool;

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
