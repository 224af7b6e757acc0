//! `tierstack buffers`: the fast tiers this node holds (mounted or not, what each still
//! holds for its BACKING), `--recover` (mount, drain and unmount each undrained one that no
//! daemon serves: what a node does at boot before it takes jobs) and `--remove-clean`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use clap::Args;
use tierstack_bench::fmt_size;
use tierstack_fs::buffers::{self, Buffer};
use tierstack_fs::mount as fsmount;

#[derive(Args)]
pub struct BuffersArgs {
    /// Where to look: a fast tier (`--dir` of a mount) or a folder of them (repeatable).
    /// Default: /var/tmp/tierstack and, for root, every /var/tmp/tierstack-UID (a user who is
    /// not root: their own).
    #[arg(long = "in", value_name = "DIR")]
    pub roots: Vec<PathBuf>,
    /// Print one JSON object: `{"buffers": [{dir, backing, mounted_at, clean_stop,
    /// pending_ops, stuck, dirty_files, dirty_bytes, disk_bytes, owner, group}]}`.
    #[arg(long)]
    pub json: bool,
    /// Mount each undrained buffer that no daemon serves at a temporary mount point, drain it
    /// to its BACKING and unmount it (its drained fast tier is then removed). Dead tierstack
    /// mounts (daemon gone) are detached first. As root, each is drained as its folder's
    /// owner (as the SLURM hooks act as the job's user).
    #[arg(long)]
    pub recover: bool,
    /// Remove every buffer that holds nothing its BACKING lacks and that no daemon serves.
    #[arg(long)]
    pub remove_clean: bool,
    /// How long --recover waits for a BACKING that is not there yet (its file system not
    /// mounted at boot: the buffer is then skipped, with a message) and for each drain.
    #[arg(long, default_value = "10m", value_name = "DURATION")]
    pub timeout: String,
}

pub fn run(a: BuffersArgs) -> Result<()> {
    let roots = if a.roots.is_empty() {
        buffers::default_roots()
    } else {
        a.roots.clone()
    };
    let timeout = crate::mount_cmd::parse_duration("timeout", &a.timeout)?;
    let mut failed = 0;
    if a.recover || a.remove_clean {
        let n = buffers::remove_stale_sockets();
        if n > 0 {
            eprintln!("tierstack: removed {n} control socket(s) of daemons that are gone");
        }
    }
    if a.recover {
        for mp in buffers::dead_mounts() {
            match fsmount::clear_stale(&mp) {
                Ok(true) => eprintln!("tierstack: detached {} (its daemon was gone)", mp.display()),
                Ok(false) => {}
                Err(e) => eprintln!("tierstack: warning: {e}"),
            }
        }
        for b in find(&roots)? {
            if b.mounted_at.is_some() || b.drained() {
                continue;
            }
            match recover(&b, timeout) {
                Ok(()) => eprintln!(
                    "tierstack: recovered {}: everything drained to {}",
                    b.dir.display(),
                    backing_of(&b).display()
                ),
                Err(e) => {
                    failed += 1;
                    eprintln!("tierstack: {} not recovered: {e}", b.dir.display());
                }
            }
        }
    }
    if a.remove_clean {
        for b in find(&roots)? {
            if b.mounted_at.is_none() && b.drained() {
                fsmount::remove_fast_tier(&b.dir);
                eprintln!("tierstack: removed {} (drained)", b.dir.display());
            }
        }
    }
    let list = find(&roots)?;
    if a.json {
        println!("{}", serde_json::json!({ "buffers": list }));
    } else {
        print_table(&list);
    }
    if failed > 0 {
        bail!("{failed} buffer(s) not recovered (see above); nothing was removed from them");
    }
    Ok(())
}

fn find(roots: &[PathBuf]) -> Result<Vec<Buffer>> {
    buffers::find(roots).map_err(anyhow::Error::from)
}

fn backing_of(b: &Buffer) -> PathBuf {
    b.backing.clone().unwrap_or_default()
}

fn print_table(list: &[Buffer]) {
    if list.is_empty() {
        println!("no buffers");
        return;
    }
    println!(
        "{:<40} {:<30} {:<24} {:>8} {:>12} {:>6} {:>10}",
        "FAST TIER", "BACKING", "STATE", "OPS", "UNDRAINED", "STUCK", "DISK"
    );
    for b in list {
        let state = match (&b.mounted_at, b.drained(), b.clean_stop) {
            (Some(mp), _, _) => format!("mounted at {}", mp.display()),
            (None, true, _) => "drained".into(),
            (None, false, false) => "undrained (crashed)".into(),
            (None, false, true) => "undrained".into(),
        };
        println!(
            "{:<40} {:<30} {:<24} {:>8} {:>12} {:>6} {:>10}",
            b.dir.display(),
            backing_of(b).display(),
            state,
            b.pending_ops,
            format!("{} in {}", fmt_size(b.dirty_bytes), b.dirty_files),
            b.stuck,
            fmt_size(b.disk_bytes)
        );
    }
}

/// Mounts `b` at a temporary mount point (as its owner), drains it and unmounts it.
fn recover(b: &Buffer, timeout: Duration) -> Result<()> {
    let backing = b
        .backing
        .clone()
        .ok_or_else(|| anyhow!("its journal names no BACKING"))?;
    let t0 = Instant::now();
    let wait = timeout.min(Duration::from_secs(60));
    while !backing.is_dir() {
        if t0.elapsed() > wait {
            bail!(
                "its BACKING {} is not there (its file system not mounted yet?): skipped; run `tierstack buffers --recover` again once it is",
                backing.display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let mp = tempfile::Builder::new()
        .prefix("tierstack-recover-")
        .tempdir_in("/tmp")?;
    let as_owner = rustix::process::geteuid().is_root() && b.owner != 0;
    if as_owner {
        std::os::unix::fs::chown(mp.path(), Some(b.owner), Some(b.group))?;
    }
    let exe = std::env::current_exe()?;
    let run = |args: &[&std::ffi::OsStr]| -> Result<()> {
        let mut c = Command::new(&exe);
        c.args(args);
        if as_owner {
            use std::os::unix::process::CommandExt;
            c.uid(b.owner).gid(b.group);
        }
        let o = c.output()?;
        if !o.status.success() {
            bail!(
                "{}",
                tierstack_common::process::last_error_line(&String::from_utf8_lossy(&o.stderr))
            );
        }
        Ok(())
    };
    let secs = format!("{}s", timeout.as_secs().max(1));
    run(&[
        "mount".as_ref(),
        backing.as_os_str(),
        mp.path().as_os_str(),
        "--dir".as_ref(),
        b.dir.as_os_str(),
    ])?;
    let r = run(&[
        "umount".as_ref(),
        mp.path().as_os_str(),
        "--timeout".as_ref(),
        secs.as_ref(),
    ]);
    if r.is_err() && is_mounted(mp.path()) {
        // Keep nothing half-done: stop it (the fast tier keeps what is not drained).
        let _ = run(&["umount".as_ref(), mp.path().as_os_str(), "--force".as_ref()]);
    }
    r
}

fn is_mounted(p: &Path) -> bool {
    fsmount::daemon_listens(p)
}
