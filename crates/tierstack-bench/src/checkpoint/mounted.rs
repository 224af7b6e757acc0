//! The tierstack mount of the checkpoint benchmark, driven only through the CLI contract
//! (`tierstack mount`, `status --json`, `drain --wait`, `umount`), and the sampling of its
//! `status` while the writers write and the drain runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tierstack_common::mounts::is_mounted;

use super::cmd::{run_cmd, tool};
use super::{monotonic_ns, CheckpointError, Result};

pub(crate) struct Mounted {
    exe: PathBuf,
    mnt: PathBuf,
    pub(crate) daemon_pid: Option<u32>,
    /// The fsync mode `status` names.
    pub(crate) mode: Option<String>,
    /// Bytes of the fast tier conditioned before the benchmark went on, and how long that
    /// took (see [`Mounted::wait_conditioned`]).
    pub(crate) conditioned: (u64, f64),
    /// How requests reach the daemon, as `status` names it ("io_uring", "/dev/fuse").
    pub(crate) transport: Option<String>,
    active: bool,
}

/// The longest [`Mounted::wait_conditioned`] waits.
const CONDITION_WAIT: Duration = Duration::from_secs(300);

/// The `tierstack mount` options a benchmark passes on (None: the mount's default).
#[derive(Default, Clone, Copy)]
pub(crate) struct MountOpts<'a> {
    pub(crate) dram: Option<&'a str>,
    pub(crate) mode: Option<&'a str>,
    pub(crate) vram: Option<&'a str>,
    /// `tierstack mount --transport`.
    pub(crate) transport: Option<&'a str>,
}

impl Mounted {
    /// `tierstack mount BACKING MNT --dir FAST` with `opts`, then waits for its fast tier's
    /// conditioning ([`Mounted::wait_conditioned`]; `cancel` ends that wait).
    pub(crate) fn mount(
        exe: &Path,
        backing: &Path,
        mnt: &Path,
        fast: &Path,
        opts: MountOpts<'_>,
        cancel: &AtomicBool,
    ) -> Result<Mounted> {
        let MountOpts {
            dram,
            mode,
            vram,
            transport,
        } = opts;
        let mut cmd = Command::new(exe);
        cmd.arg("mount")
            .arg(backing)
            .arg(mnt)
            .arg("--dir")
            .arg(fast);
        if let Some(d) = dram {
            cmd.args(["--dram", d]);
        }
        if let Some(m) = mode {
            cmd.args(["--mode", m]);
        }
        if let Some(v) = vram {
            cmd.args(["--vram", v]);
        }
        if let Some(t) = transport {
            cmd.args(["--transport", t]);
        }
        let mut me = Mounted {
            exe: exe.to_path_buf(),
            mnt: mnt.to_path_buf(),
            daemon_pid: None,
            mode: None,
            conditioned: (0, 0.0),
            transport: None,
            active: true,
        };
        // Not cancelled halfway: its daemon would come up after the teardown. A Ctrl-C
        // meanwhile is seen by the caller once the mount is up (and then torn down).
        run_cmd(&mut cmd, "tierstack mount", None, Duration::from_secs(120))?;
        let st = me.status()?;
        me.daemon_pid = ["pid", "daemon_pid"]
            .iter()
            .find_map(|k| st.get(k).and_then(|v| v.as_u64()))
            .or_else(|| st.pointer("/daemon/pid").and_then(|v| v.as_u64()))
            .map(|p| p as u32);
        me.mode = st.get("mode").and_then(|v| v.as_str()).map(str::to_string);
        me.transport = st
            .get("transport")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        // A Ctrl-C while it conditions ends the wait; dropping `me` unmounts.
        me.wait_conditioned(cancel)?;
        Ok(me)
    }

    /// Waits until the mount has conditioned its fast tier (`status` says `conditioned`; a
    /// new mount writes its file drives once while idle, about 5 s for the default 8 GiB
    /// here), so that no run of the benchmark, on the mount or on the plain folder beside it,
    /// shares the disk with it, and the mount is measured as it runs from then on. Progress
    /// every 2 s on stderr; at most [`CONDITION_WAIT`], then it goes on and says so; `cancel`
    /// (Ctrl-C) ends it with [`CheckpointError::Cancelled`].
    fn wait_conditioned(&mut self, cancel: &AtomicBool) -> Result<()> {
        let t0 = Instant::now();
        let mut said = Instant::now();
        loop {
            let st = self.status()?;
            let bytes = st
                .get("conditioned_bytes")
                .and_then(|v| v.as_u64())
                .unwrap_or(0);
            // A daemon without the field does not condition.
            let done = st
                .get("conditioned")
                .and_then(|v| v.as_bool())
                .unwrap_or(true);
            if done {
                self.conditioned = (bytes, t0.elapsed().as_secs_f64());
                return Ok(());
            }
            if cancel.load(Ordering::Relaxed) {
                return Err(CheckpointError::Cancelled);
            }
            if t0.elapsed() > CONDITION_WAIT {
                eprintln!(
                    "... the mount is still conditioning its fast tier after {} s ({} MiB): going on",
                    CONDITION_WAIT.as_secs(),
                    bytes >> 20
                );
                self.conditioned = (bytes, t0.elapsed().as_secs_f64());
                return Ok(());
            }
            if said.elapsed() > Duration::from_secs(2) {
                eprintln!(
                    "... the mount conditions its fast tier (zeros over never-written drive space): {} MiB",
                    bytes >> 20
                );
                said = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub(crate) fn status(&self) -> Result<serde_json::Value> {
        let out = run_cmd(
            Command::new(&self.exe)
                .arg("status")
                .arg(&self.mnt)
                .arg("--json"),
            "tierstack status --json",
            None,
            Duration::from_secs(60),
        )?;
        serde_json::from_str(out.trim()).map_err(|e| CheckpointError::Command {
            what: "tierstack status --json".into(),
            msg: format!("its output is not JSON ({e})"),
        })
    }

    /// `drain --wait`, then until `status` says no byte is dirty.
    pub(crate) fn drain_wait(&self, cancel: &AtomicBool, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        run_cmd(
            Command::new(&self.exe)
                .arg("drain")
                .arg(&self.mnt)
                .arg("--wait"),
            "tierstack drain --wait",
            Some(cancel),
            timeout,
        )?;
        loop {
            let st = self.status()?;
            let dirty = st.get("dirty_bytes").and_then(|v| v.as_u64());
            match dirty {
                Some(0) => return Ok(()),
                None => {
                    return Err(CheckpointError::Command {
                        what: "tierstack status --json".into(),
                        msg: "it has no dirty_bytes field".into(),
                    })
                }
                Some(_) => {}
            }
            if cancel.load(Ordering::Relaxed) {
                return Err(CheckpointError::Cancelled);
            }
            if Instant::now() > deadline {
                return Err(CheckpointError::Command {
                    what: "the drain".into(),
                    msg: format!("bytes still dirty after {} s", timeout.as_secs()),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `tierstack umount` (drains, then unmounts); if that fails, a lazy unmount and the end
    /// of the daemon this benchmark started.
    pub(crate) fn close(&mut self) -> Result<()> {
        if !self.active {
            return Ok(());
        }
        self.active = false;
        let r = run_cmd(
            Command::new(&self.exe).arg("umount").arg(&self.mnt),
            "tierstack umount",
            None,
            Duration::from_secs(600),
        );
        if r.is_err() || is_mounted(&self.mnt) {
            let _ = tool("umount", &["-l", &self.mnt.to_string_lossy()], "umount -l");
            if let Some(p) = self
                .daemon_pid
                .and_then(|p| rustix::process::Pid::from_raw(p as i32))
            {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
        r.map(|_| ())
    }
}

/// One sample of `status --json` during the mount run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    pub(super) t_ns: u64,
    pub(super) drained: u64,
    pub(super) rate: f64,
}

/// Samples `tierstack status MNT --json` every 200 ms until `stop`.
pub(super) fn sample_status(exe: &Path, mnt: &Path, stop: &AtomicBool) -> Vec<Sample> {
    let mut v = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t_ns = monotonic_ns();
        let out = run_cmd(
            Command::new(exe).arg("status").arg(mnt).arg("--json"),
            "tierstack status --json",
            Some(stop),
            Duration::from_secs(10),
        );
        if let Ok(j) = out.and_then(|o| {
            serde_json::from_str::<serde_json::Value>(o.trim()).map_err(|e| {
                CheckpointError::Command {
                    what: "tierstack status --json".into(),
                    msg: e.to_string(),
                }
            })
        }) {
            v.push(Sample {
                t_ns,
                drained: j.get("drained_bytes").and_then(|x| x.as_u64()).unwrap_or(0),
                rate: j
                    .get("drain_bytes_per_s")
                    .and_then(|x| x.as_f64())
                    .unwrap_or(0.0),
            });
        }
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    v
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
