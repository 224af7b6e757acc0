//! Site-wide drain slots: at most K drain streams at once into one shared file system, across
//! every node and job whose mounts name the same slot folder (`mount --drain-slots K
//! --drain-slots-dir DIR`, a folder on that shared file system).
//!
//! A slot is a file `DIR/slot.I` (I below K) that a drain worker holds an exclusive `flock`
//! on while it drains. The lock lives in the shared file system itself, so it needs nothing
//! else a site runs; its lease is the file system's own: a node that dies (or a daemon killed
//! with `kill -9`) loses its locks when its client session ends (its descriptors close), so
//! no node waits for ever behind a dead one.
//!
//! A worker keeps its slot while it has files to drain back to back. A worker that waits for
//! a slot says so with a file `DIR/wait.HOST.PID.WORKER` (touched at each try, removed when
//! it gets one); a holder whose turn ([`TURN`]) is over and sees a fresh one of those lets go
//! and pauses before it asks again, so the waiting workers of other nodes get their turn.
//! Waiting is bounded: after [`MAX_WAIT`] without a slot a worker drains anyway (and says so
//! in the log), so a wrong slot folder slows a drain but never stops it.
//!
//! The slot folder must be shared by the nodes' file system clients, and its file system must
//! carry `flock` to its servers (MooseFS, Lustre with `-o flock`, GPFS, NFSv4 do; a FUSE file
//! system that does not would lock only within one node: [`Slots::check`] cannot see that,
//! the test bed measures it).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

/// The longest a worker keeps its slot while it has work, before it lets others in.
pub const TURN: Duration = Duration::from_secs(1);
/// The longest a worker waits for a slot before it drains without one.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// The first pause between tries; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
/// The longest pause between tries.
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// A waiter's file older than this is from a waiter that died: it is not waited for.
const WAITER_FRESH: Duration = Duration::from_secs(30);

/// The most slots a site may give (a sanity bound on `--drain-slots`).
pub const MAX_SLOTS: u32 = 4096;

/// The site-wide slots of one mount.
#[derive(Debug)]
pub struct Slots {
    dir: PathBuf,
    count: u32,
}

/// A slot held: dropping it closes the descriptor, which releases the lock.
#[derive(Debug)]
pub struct Permit {
    _file: File,
    index: u32,
    since: Instant,
}

impl Permit {
    /// Which slot (for the log).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Whether the holder has had its turn ([`TURN`]).
    pub fn turn_over(&self) -> bool {
        self.since.elapsed() >= TURN
    }

    /// Starts another turn (nobody waited).
    pub fn renew(&mut self) {
        self.since = Instant::now();
    }
}

/// The start of the names of this process's waiter files: `wait.HOST.PID.`.
fn waiter_prefix() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("wait.{}.{}.", host.trim(), std::process::id())
}

impl Slots {
    /// `count` slots in `dir` (made if missing).
    pub fn new(dir: &Path, count: u32) -> Slots {
        Slots {
            dir: dir.to_path_buf(),
            count: count.clamp(1, MAX_SLOTS),
        }
    }

    /// Checks that the slot folder is usable: it exists (or can be made) and a slot file can
    /// be made and locked there. Called at mount, so that a wrong folder is a usage error.
    pub fn check(&self) -> io::Result<()> {
        // Nodes make it at the same moment: a shared file system may answer one of them
        // "exists" while its cache still says it is not there; the open below decides.
        match std::fs::create_dir_all(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let f = self.open(0)?;
        // A lock that someone else holds is fine: locking works.
        match flock(&f, FlockOperation::NonBlockingLockShared) {
            Ok(()) => flock(&f, FlockOperation::Unlock).map_err(io::Error::from),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn open(&self, i: u32) -> io::Result<File> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.dir.join(format!("slot.{i}")))
    }

    /// One pass over the slots, starting at `first`: the first free one, locked.
    fn try_once(&self, first: u32) -> io::Result<Option<Permit>> {
        for k in 0..self.count {
            let i = (first + k) % self.count;
            let f = self.open(i)?;
            match flock(&f, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {
                    return Ok(Some(Permit {
                        _file: f,
                        index: i,
                        since: Instant::now(),
                    }))
                }
                Err(e) if e == rustix::io::Errno::WOULDBLOCK => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// Waits for a slot: tries them all, then pauses (20 ms doubling to 500 ms) and tries
    /// again, until one is free, `stop` is set or [`MAX_WAIT`] has passed (then `None`: the
    /// caller drains without a slot). An error of the slot folder (gone, full) is logged
    /// once and ends the wait the same way: the drain never stops for the slots' sake.
    pub fn acquire(&self, worker: u32, stop: &AtomicBool) -> Option<Permit> {
        let t0 = Instant::now();
        let mut pause = FIRST_PAUSE;
        // Workers start at different slots so that they do not all try slot 0 first.
        let first = worker % self.count;
        let waiter = self.dir.join(format!("{}{worker}", waiter_prefix()));
        let mut announced = false;
        let got = loop {
            match self.try_once(first) {
                Ok(Some(p)) => break Some(p),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(
                        "drain slots in {}: {e}; draining without a slot",
                        self.dir.display()
                    );
                    break None;
                }
            }
            // Made, or its time renewed: holders see a live waiter.
            announced |= std::fs::File::create(&waiter).is_ok();
            if stop.load(Relaxed) || t0.elapsed() >= MAX_WAIT {
                if !stop.load(Relaxed) {
                    tracing::warn!(
                        "drain slots in {}: none free for {:?}; draining without a slot",
                        self.dir.display(),
                        MAX_WAIT
                    );
                }
                break None;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_PAUSE);
        };
        if announced {
            let _ = std::fs::remove_file(&waiter);
        }
        got
    }

    /// Whether a worker of another process waits for a slot (a waiter's file younger than
    /// 30 s that is not this process's).
    pub fn others_wait(&self) -> bool {
        let mine = waiter_prefix();
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return false;
        };
        rd.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("wait.")
                && !name.starts_with(&mine)
                && e.metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age < WAITER_FRESH)
        })
    }

    /// The pause a holder that let go for a waiter takes before it asks again: the waiters'
    /// longest pause between tries, so that one of them finds the slot free.
    pub fn yield_pause(&self) -> Duration {
        MAX_PAUSE + FIRST_PAUSE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    #[test]
    fn at_most_k_holders_at_once() {
        let d = tempfile::tempdir().expect("tmp");
        let slots = Arc::new(Slots::new(d.path(), 2));
        slots.check().expect("check");
        let holders = Arc::new(AtomicU32::new(0));
        let most = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let hs: Vec<_> = (0..6)
            .map(|w| {
                let (slots, holders, most, stop) =
                    (slots.clone(), holders.clone(), most.clone(), stop.clone());
                std::thread::spawn(move || {
                    for _ in 0..5 {
                        let p = slots.acquire(w, &stop).expect("a slot");
                        let now = holders.fetch_add(1, Relaxed) + 1;
                        most.fetch_max(now, Relaxed);
                        std::thread::sleep(Duration::from_millis(5));
                        holders.fetch_sub(1, Relaxed);
                        drop(p);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("worker");
        }
        assert_eq!(most.load(Relaxed), 2, "two slots, six workers");
    }

    #[test]
    fn a_slot_frees_when_its_holder_closes_and_stop_ends_a_wait() {
        let d = tempfile::tempdir().expect("tmp");
        let slots = Slots::new(d.path(), 1);
        let stop = AtomicBool::new(false);
        let p = slots.acquire(0, &stop).expect("free");
        assert_eq!(p.index(), 0);
        assert!(slots.try_once(0).expect("try").is_none(), "held");
        drop(p);
        assert!(
            slots.try_once(0).expect("try").is_some(),
            "freed by the close"
        );
        let _held = slots.acquire(0, &stop).expect("free again");
        stop.store(true, Relaxed);
        let t = Instant::now();
        assert!(slots.acquire(1, &stop).is_none());
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_holder_sees_the_waiters_of_other_processes_only() {
        let d = tempfile::tempdir().expect("tmp");
        let slots = Slots::new(d.path(), 1);
        assert!(!slots.others_wait());
        std::fs::write(d.path().join(format!("{}7", waiter_prefix())), b"").expect("mine");
        assert!(!slots.others_wait(), "this process's own waiter");
        std::fs::write(d.path().join("wait.node9.1.0"), b"").expect("theirs");
        assert!(slots.others_wait());
        let old = std::time::SystemTime::now() - Duration::from_secs(120);
        std::fs::File::options()
            .write(true)
            .open(d.path().join("wait.node9.1.0"))
            .and_then(|f| f.set_modified(old))
            .expect("age it");
        assert!(
            !slots.others_wait(),
            "a stale waiter (dead) is not waited for"
        );
    }

    #[test]
    fn a_folder_that_cannot_hold_slots_is_refused() {
        let d = tempfile::tempdir().expect("tmp");
        let file = d.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        assert!(Slots::new(&file.join("slots"), 2).check().is_err());
    }
}
