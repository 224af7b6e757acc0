//! The demo's burst-buffer part: `tierstack bench checkpoint`'s experiment (seed 004) at demo
//! size, driven through the real CLI (`tierstack mount`, `status`, `drain --wait`, `umount`):
//! file-per-process checkpoint writers straight into a throttled backing file system, then
//! through a mount over it; `status` while the drain runs; after `umount`, every file in the
//! backing is checked against what its writer wrote.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result};
use tierstack_bench::checkpoint;

use super::{step, Outcome};

/// Writers, each writing one file of FILE_MIB.
const PROCS: usize = 4;
const FILE_MIB: u64 = 32;
/// The slow "parallel file system": writes limited to this many MB/s.
const THROTTLE_MB_S: f64 = 40.0;

fn say(s: &str) {
    for l in s.lines() {
        println!("   {l}");
    }
}

pub fn part(dir: &Path, cancel: &AtomicBool) -> Result<Outcome> {
    if !rustix::process::geteuid().is_root() {
        return Ok(Outcome::Skipped(
            "tierstack mount needs root here (FUSE mounts without fusermount3): run the demo as root to see this part".into(),
        ));
    }
    if !Path::new("/dev/fuse").exists() {
        return Ok(Outcome::Skipped(
            "/dev/fuse is missing: load the fuse module (modprobe fuse) or, in a container, pass --device /dev/fuse".into(),
        ));
    }
    let throttle = match checkpoint::throttle_available() {
        Ok(()) => Some(THROTTLE_MB_S),
        Err(e) => {
            println!(
                "note: no throttled backing ({e}); the backing is a plain folder, so the mount cannot show a speedup"
            );
            None
        }
    };
    let work = dir.join("mount");
    std::fs::create_dir_all(&work)?;
    let backing = match throttle {
        Some(_) => None,
        None => {
            let b = work.join("backing");
            std::fs::create_dir_all(&b)?;
            Some(b)
        }
    };
    super::commands(&[
        "tierstack mount /pfs/run42 /mnt/bb --dir /nvme/tierstack   # returns once mounted".into(),
        "./checkpoint --out /mnt/bb                                # the job writes and fsyncs".into(),
        "tierstack status /mnt/bb                                  # what still waits to drain".into(),
        "tierstack umount /mnt/bb                                  # drains everything, then unmounts".into(),
        format!(
            "tierstack bench checkpoint --procs {PROCS} --file-size {FILE_MIB}M{} --dir DIR   # this experiment",
            throttle.map(|t| format!(" --throttle {t}")).unwrap_or_else(|| " --backing DIR".into())
        ),
    ]);
    step(&format!(
        "{PROCS} writer processes each write and fsync a {FILE_MIB} MiB file, first straight into the backing{}, then through a tierstack mount over it",
        throttle
            .map(|t| format!(" (ext4 on a loop device, -o sync, writes limited to {t} MB/s)"))
            .unwrap_or_default()
    ));
    let cfg = checkpoint::Config {
        exe: std::env::current_exe().context("cannot find the tierstack binary")?,
        procs: PROCS,
        file_size: FILE_MIB << 20,
        backing,
        dir: work,
        throttle_mb_s: throttle,
        mode: None,
        dram: None,
        vram: None,
        direct_only: false,
        repeat: 1,
        narrate: Some(say),
    };
    let r = checkpoint::run(&cfg, cancel)?;
    println!();
    print!("{}", checkpoint::render(&r));
    Ok(Outcome::Done)
}
