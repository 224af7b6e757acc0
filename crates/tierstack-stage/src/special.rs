//! Hard links and special files (FIFOs, sockets, devices) recreated at the destination, and
//! their verification.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{io_err, tmp_name, HardLinkJob, SpecialJob, SpecialKind, StageError, TmpGuard};

/// Errors of `link(2)` that mean the destination does not take (this) hard link.
pub(super) fn link_refused(e: &io::Error) -> bool {
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
pub(super) fn make_hard_link(
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
        return Err(io_err("create the hard link", &tmp)(e).into());
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
pub(super) fn make_special(job: &SpecialJob, root: bool) -> Result<(), String> {
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
pub(super) fn verify_special(job: &SpecialJob) -> Result<(), StageError> {
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
