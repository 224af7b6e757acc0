//! The throttled backing file system of `--throttle MB/s`.
//!
//! `--throttle MB/s` models a congested parallel file system: BACKING is an ext4 file system
//! on a loop device (image file under the work folder) mounted with `-o sync`, and the writers
//! of both runs and the mount daemon are put in a blkio cgroup (v1, or the io controller of
//! cgroup v2) whose write limit for the loop device is MB/s x 10^6 bytes. `Env` tears all of it
//! down (tierstack mount, ext4 mount, loop device, cgroup, image, work folder) on success, on
//! error and on interruption (the caller sets the cancel flag on Ctrl-C).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tierstack_common::cgroup;
use tierstack_common::mounts::is_mounted;

use super::cmd::tool;
use super::{io_err, CheckpointError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CgKind {
    V1Blkio,
    V2Io,
}

impl CgKind {
    /// The root group of the hierarchy that throttles (v1 blkio, or the unified one).
    fn root(self) -> PathBuf {
        match self {
            CgKind::V1Blkio => cgroup::v1_dir("blkio"),
            CgKind::V2Io => PathBuf::from(cgroup::ROOT),
        }
    }
}

pub(super) struct Throttle {
    image: PathBuf,
    pub(super) loopdev: Option<String>,
    pub(super) devnum: String,
    mp: PathBuf,
    mp_created: bool,
    mounted: bool,
    cgroup: Option<PathBuf>,
    pub(super) kind: CgKind,
}

/// Which cgroup interface throttles writes here.
pub(super) fn cgroup_kind() -> Result<CgKind> {
    if cgroup::v1_dir("blkio")
        .join("blkio.throttle.write_bps_device")
        .exists()
    {
        return Ok(CgKind::V1Blkio);
    }
    if cgroup::v2_has("io") {
        return Ok(CgKind::V2Io);
    }
    Err(CheckpointError::Setup(
        "--throttle needs a blkio cgroup (v1, /sys/fs/cgroup/blkio) or the io controller of cgroup v2, and this machine has neither: leave out --throttle".into(),
    ))
}

/// Whether `--throttle` can work here (root, a blkio or io cgroup, losetup and mkfs.ext4);
/// the error names what is missing.
pub fn throttle_available() -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        return Err(CheckpointError::Setup(
            "a throttled backing file system needs root (a loop device, a mount and a cgroup)"
                .into(),
        ));
    }
    cgroup_kind()?;
    for t in ["losetup", "mkfs.ext4"] {
        let found = Command::new(t)
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Err(CheckpointError::Setup(format!(
                "{t} is not installed (apt-get install util-linux e2fsprogs)"
            )));
        }
    }
    Ok(())
}

impl Throttle {
    pub(super) fn setup(
        work: &Path,
        mp: &Path,
        image_size: u64,
        bytes_per_s: u64,
    ) -> Result<Throttle> {
        let kind = cgroup_kind()?;
        let image = work.join("backing.img");
        let mut t = Throttle {
            image: image.clone(),
            loopdev: None,
            devnum: String::new(),
            mp: mp.to_path_buf(),
            mp_created: false,
            mounted: false,
            cgroup: None,
            kind,
        };
        {
            let f = fs::File::create(&image).map_err(io_err("create the image", &image))?;
            f.set_len(image_size)
                .map_err(io_err("size the image", &image))?;
        }
        let img = image.to_string_lossy().into_owned();
        let dev = tool(
            "losetup",
            &["--find", "--show", &img],
            "losetup (attach the image to a loop device)",
        )?
        .trim()
        .to_string();
        if dev.is_empty() {
            return Err(CheckpointError::Setup(
                "losetup named no loop device: check `losetup -f`".into(),
            ));
        }
        t.loopdev = Some(dev.clone());
        let st = rustix::fs::stat(dev.as_str())
            .map_err(|e| io_err("stat", Path::new(&dev))(e.into()))?;
        t.devnum = format!(
            "{}:{}",
            rustix::fs::major(st.st_rdev),
            rustix::fs::minor(st.st_rdev)
        );
        tool(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
                &dev,
            ],
            "mkfs.ext4",
        )?;
        if !mp.exists() {
            fs::create_dir_all(mp).map_err(io_err("create", mp))?;
            t.mp_created = true;
        }
        tool(
            "mount",
            &["-t", "ext4", "-o", "sync", &dev, &mp.to_string_lossy()],
            "mount -o sync (the throttled backing file system)",
        )?;
        t.mounted = true;
        let name = format!("tierstack-ckpt-{}", std::process::id());
        if kind == CgKind::V2Io {
            // The io controller must be enabled for the children of the root.
            let _ = fs::write(kind.root().join("cgroup.subtree_control"), "+io");
        }
        let cg = kind.root().join(&name);
        fs::create_dir(&cg).map_err(io_err("create the cgroup", &cg))?;
        t.cgroup = Some(cg.clone());
        let (file, rule) = match kind {
            CgKind::V1Blkio => (
                "blkio.throttle.write_bps_device",
                format!("{} {bytes_per_s}", t.devnum),
            ),
            CgKind::V2Io => ("io.max", format!("{} wbps={bytes_per_s}", t.devnum)),
        };
        fs::write(cg.join(file), &rule)
            .map_err(io_err("set the write limit in", &cg.join(file)))?;
        Ok(t)
    }

    pub(super) fn procs(&self) -> Option<PathBuf> {
        self.cgroup.as_ref().map(|c| c.join("cgroup.procs"))
    }

    /// Puts a process (all its threads) in the throttled cgroup.
    pub(super) fn add(&self, pid: u32) -> Result<()> {
        if let Some(p) = self.procs() {
            fs::write(&p, pid.to_string()).map_err(io_err("move the mount daemon into", &p))?;
        }
        Ok(())
    }

    /// Lifts the limit (teardown drains faster).
    pub(super) fn relax(&self) {
        if let Some(cg) = &self.cgroup {
            let _ = match self.kind {
                CgKind::V1Blkio => fs::write(
                    cg.join("blkio.throttle.write_bps_device"),
                    format!("{} 0", self.devnum),
                ),
                CgKind::V2Io => fs::write(cg.join("io.max"), format!("{} wbps=max", self.devnum)),
            };
        }
    }

    pub(super) fn close(&mut self) -> Result<()> {
        let mut first: Option<CheckpointError> = None;
        let mut keep = |r: Result<()>| {
            if let Err(e) = r {
                if first.is_none() {
                    first = Some(e);
                }
            }
        };
        self.relax();
        if let Some(cg) = self.cgroup.take() {
            // Whatever is left in it (only processes this benchmark put there) goes back to
            // the root group, then the group is removed.
            let root = self.kind.root().join("cgroup.procs");
            let mut removed = false;
            // Up to 30 s: a daemon that just exited stays in the group until its parent (init,
            // which may be slow to reap here) has reaped it.
            for _ in 0..300 {
                if let Ok(pids) = fs::read_to_string(cg.join("cgroup.procs")) {
                    for p in pids.split_whitespace() {
                        let _ = fs::write(&root, p);
                    }
                }
                if fs::remove_dir(&cg).is_ok() || !cg.exists() {
                    removed = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if !removed {
                keep(Err(CheckpointError::Setup(format!(
                    "cannot remove the cgroup {}: remove it with rmdir once its processes ended",
                    cg.display()
                ))));
            }
        }
        if self.mounted {
            let mp = self.mp.to_string_lossy().into_owned();
            let mut ok = false;
            for _ in 0..20 {
                if tool("umount", &[&mp], "umount").is_ok() || !is_mounted(&self.mp) {
                    ok = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if !ok {
                keep(tool("umount", &["-l", &mp], "umount -l").map(|_| ()));
            }
            self.mounted = false;
        }
        if let Some(dev) = self.loopdev.take() {
            let mut r = Ok(());
            for _ in 0..20 {
                r = tool("losetup", &["-d", &dev], "losetup -d").map(|_| ());
                if r.is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            keep(r);
        }
        if self.image.exists() {
            keep(fs::remove_file(&self.image).map_err(|e| io_err("remove", &self.image)(e).into()));
        }
        if self.mp_created {
            let _ = fs::remove_dir(&self.mp);
            self.mp_created = false;
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
