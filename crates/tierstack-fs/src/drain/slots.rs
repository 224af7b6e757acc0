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
//! a slot says so with a file `DIR/wait.TICKET.HOST.PID.WORKER` (touched at each try, removed
//! when it gets one); a holder whose turn ([`TURN`]) is over and sees a fresh one of those
//! lets go and pauses before it asks again, so the waiting workers of other nodes get their
//! turn.
//!
//! A mount may name its drain's group (`mount --drain-group NAME`; the SLURM hooks name a
//! job's buffers `slurm-JOBID`): the drains of one group share one ticket, the time the
//! group's first drain began to ask, kept in `DIR/group.NAME` (made with its contents in one
//! step, a private file linked to that name: the first node to link it sets the ticket, the
//! others read it). So a job's nodes hold one place in the queue: a job that ended first goes
//! first with all its nodes, and its nodes take turns among themselves. A group's file that
//! no drain of the group asked for in [`GROUP_FRESH`] is from an earlier use of the name: it
//! is made anew.
//!
//! A holder lets go after its turn only for a waiter of another process that is not behind it
//! (an earlier ticket, or the same one: another node of its group); a later drain waits until
//! it has nothing left ([`yields_to`]).
//!
//! Drains go in the order they began to wait (first come, first served): TICKET is the
//! wall-clock time (µs) at which this mount's drain began to ask for slots, kept by all its
//! workers, turn after turn, for as long as one of them waits or holds a slot (the drain's
//! backlog; it is taken anew once they all have let go), and a waiter tries the slots only
//! while fewer than K live waiters hold an earlier ticket ([`may_try`]). So drains are served
//! in the order they began, instead of each worker queueing behind later jobs after each
//! turn (a holder still lets go after its turn when another drain waits: at one slot the
//! oldest drain and the next one alternate, and later ones wait for both); a job's nodes,
//! whose drains begin at its end, are served next to each other; and a newcomer never takes
//! a freed slot ahead of those that waited. A worker that
//! finds nobody waiting takes a free slot at once. Tickets compare wall clocks of different nodes: a site's nodes keep
//! theirs in step (NTP); a node whose clock is off is served early or late, never not.
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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

/// The longest a worker keeps its slot while it has work, before it lets others in.
pub const TURN: Duration = Duration::from_secs(1);
/// The longest a worker waits for a slot before it drains without one.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// The first pause between tries; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
/// The pause between tries of a waiter whose turn it is ([`may_try`]): a slot let go is taken
/// within it. Only the K waiters in front try this often (the metadata they cost the shared
/// file system is bounded by K); the others back off to [`MAX_PAUSE`].
const FRONT_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between tries.
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// A waiter's file older than this is from a waiter that died: it is not waited for.
const WAITER_FRESH: Duration = Duration::from_secs(30);

/// The most slots a site may give (a sanity bound on `--drain-slots`).
pub const MAX_SLOTS: u32 = 4096;

/// A group's ticket file that no drain of the group asked for in this long is from an
/// earlier use of the name (see the module's comment).
pub const GROUP_FRESH: Duration = Duration::from_secs(3600);

/// Whether a drain group's name is usable in a file name: 1 to 64 of `A-Z a-z 0-9 - _`.
pub fn valid_group(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The site-wide slots of one mount.
#[derive(Debug)]
pub struct Slots {
    dir: PathBuf,
    count: u32,
    /// The mount's drain's ticket (see the module's comment), shared with its permits.
    drain: Arc<DrainTicket>,
    /// The drain group whose ticket this mount's drain shares (see the module's comment).
    group: Option<String>,
}

/// A drain's place in the site's queue: its ticket, kept while any of its workers waits for
/// a slot or holds one.
#[derive(Debug, Default)]
struct DrainTicket {
    /// (workers waiting or holding, the ticket while there are any).
    state: Mutex<(u32, Option<u64>)>,
}

impl DrainTicket {
    /// A worker begins to ask: the drain's ticket (taken from `take` if it had none).
    fn join(&self, take: impl FnOnce() -> u64) -> u64 {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.0 += 1;
        *st.1.get_or_insert_with(take)
    }

    /// A worker stops waiting or holding; the last one to go lets the ticket go.
    fn leave(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.0 = st.0.saturating_sub(1);
        if st.0 == 0 {
            st.1 = None;
        }
    }

    fn current(&self) -> Option<u64> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1
    }
}

/// A slot held: dropping it closes the descriptor, which releases the lock.
#[derive(Debug)]
pub struct Permit {
    _file: File,
    index: u32,
    since: Instant,
    /// The drain it counts in (None: made outside [`Slots::acquire`]).
    drain: Option<Arc<DrainTicket>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(d) = &self.drain {
            d.leave();
        }
    }
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

/// This process's part of its waiter files' names: `HOST.PID.` (after the ticket).
fn owner_prefix() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}.{}.", host.trim(), std::process::id())
}

/// A waiter file's ticket and owner (`HOST.PID.WORKER`), from its name
/// `wait.TICKET.HOST.PID.WORKER`; None for any other name.
fn parse_waiter(name: &str) -> Option<(u64, &str)> {
    let rest = name.strip_prefix("wait.")?;
    let (ticket, owner) = rest.split_once('.')?;
    Some((ticket.parse().ok()?, owner))
}

/// A waiter file's name.
fn waiter_name(ticket: u64, owner: &str) -> String {
    format!("wait.{ticket:020}.{owner}")
}

/// Whether the waiter with `ticket` (its file named `me`) may try the slots, given the live
/// waiters `others` (ticket, file name): while fewer than `count` of them came before it (an
/// earlier ticket, or the same ticket and a smaller name). Pure: the order of
/// [`Slots::acquire`].
pub fn may_try(ticket: u64, me: &str, others: &[(u64, String)], count: u32) -> bool {
    let ahead = others
        .iter()
        .filter(|(t, n)| n != me && (*t, n.as_str()) < (ticket, me))
        .count();
    ahead < count as usize
}

/// Whether a holder whose drain has `own` ticket (None: it has none) lets go after its turn
/// for a waiter with `theirs`: only for one not behind it (an earlier ticket, or the same: a
/// node of its group). Pure: the other half of the order of [`may_try`].
pub fn yields_to(own: Option<u64>, theirs: u64) -> bool {
    own.is_none_or(|o| theirs <= o)
}

/// A group's ticket as its file holds it (None: no file, or not a ticket yet).
fn read_group(path: &Path) -> Option<(u64, std::time::SystemTime)> {
    let t = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    let at = std::fs::metadata(path).ok()?.modified().ok()?;
    Some((t, at))
}

/// Microseconds since the epoch, now.
fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Whether a directory entry was touched within [`WAITER_FRESH`] (a waiter that lives).
fn fresh(e: &std::fs::DirEntry) -> bool {
    e.metadata()
        .ok()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age < WAITER_FRESH)
}

impl Slots {
    /// `count` slots in `dir` (made if missing).
    pub fn new(dir: &Path, count: u32) -> Slots {
        Slots {
            dir: dir.to_path_buf(),
            count: count.clamp(1, MAX_SLOTS),
            drain: Arc::default(),
            group: None,
        }
    }

    /// The same slots, the drain sharing the ticket of `group` (see the module's comment; a
    /// name [`valid_group`] refuses is ignored).
    pub fn with_group(mut self, group: Option<&str>) -> Slots {
        self.group = group.filter(|g| valid_group(g)).map(str::to_string);
        self
    }

    /// A new ticket for this mount's drain: the group's (set by its first drain, made anew
    /// when stale), or now when it has none or the group's file cannot be used.
    fn new_ticket(&self) -> u64 {
        let now = now_us();
        let Some(group) = &self.group else {
            return now;
        };
        let path = self.dir.join(format!("group.{group}"));
        match read_group(&path) {
            Some((t, at)) if at.elapsed().map_or(true, |age| age < GROUP_FRESH) => {
                // Asked for again: the group's ticket stays fresh.
                let _ = std::fs::File::options()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                return t;
            }
            Some(_) => {
                let _ = std::fs::remove_file(&path);
            }
            None => {}
        }
        let tmp = self
            .dir
            .join(format!(".group.{group}.{}{now}", owner_prefix()));
        if std::fs::write(&tmp, now.to_string()).is_ok() {
            // The first to link it sets the group's ticket; the others read that one.
            let _ = std::fs::hard_link(&tmp, &path);
            let _ = std::fs::remove_file(&tmp);
        }
        read_group(&path).map_or(now, |(t, _)| t)
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
        let path = self.dir.join(format!("slot.{i}"));
        let mut o = std::fs::OpenOptions::new();
        o.read(true).write(true).truncate(false);
        match o.clone().create(true).open(&path) {
            // Nodes that make the same slot file at once: a network file system may answer
            // EEXIST to all but one of them (MooseFS does, seen with 8 nodes mounting at
            // once), although no O_EXCL was asked for. The file is there: open it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => o.open(&path),
            r => r,
        }
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
                        drain: None,
                    }))
                }
                Err(e) if e == rustix::io::Errno::WOULDBLOCK => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// The live waiters (fresh files; stale ones are from waiters that died): ticket and name.
    fn waiters(&self) -> Vec<(u64, String)> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let (ticket, _) = parse_waiter(&name)?;
                fresh(&e).then_some((ticket, name))
            })
            .collect()
    }

    /// Waits for a slot, in the order waiters began to wait ([`may_try`]): tries them all
    /// when its turn allows, then pauses (50 ms while its turn allows, else 20 ms
    /// doubling to 500 ms) and looks again, until
    /// one is free, `stop` is set or [`MAX_WAIT`] has passed (then `None`: the caller drains
    /// without a slot). An error of the slot folder (gone, full) is logged once and ends the
    /// wait the same way: the drain never stops for the slots' sake.
    pub fn acquire(&self, worker: u32, stop: &AtomicBool) -> Option<Permit> {
        let t0 = Instant::now();
        let mut pause = FIRST_PAUSE;
        // Workers start at different slots so that they do not all try slot 0 first.
        let first = worker % self.count;
        let ticket = self.drain.join(|| self.new_ticket());
        let me = waiter_name(ticket, &format!("{}{worker}", owner_prefix()));
        let waiter = self.dir.join(&me);
        let mut announced = false;
        let got = loop {
            // Nobody waiting: a free slot is taken at once, without a waiter file.
            let waiting = self.waiters();
            let turn = if announced || !waiting.is_empty() {
                may_try(ticket, &me, &waiting, self.count)
            } else {
                true
            };
            if turn {
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
            }
            // Made, or its time renewed: holders and later waiters see a live waiter.
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
            if turn {
                std::thread::sleep(FRONT_PAUSE);
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
            }
        };
        if announced {
            let _ = std::fs::remove_file(&waiter);
        }
        match got {
            Some(mut p) => {
                // The permit keeps the drain's place until it is let go.
                p.drain = Some(self.drain.clone());
                Some(p)
            }
            None => {
                self.drain.leave();
                None
            }
        }
    }

    /// The mount's drain's ticket while one of its workers waits or holds a slot.
    pub fn drain_ticket(&self) -> Option<u64> {
        self.drain.current()
    }

    /// Whether a worker of another process waits for a slot that this drain's holders let
    /// go for (a waiter's file younger than 30 s, not this process's, whose ticket is not
    /// behind this drain's: [`yields_to`]).
    pub fn others_wait(&self) -> bool {
        let mine = owner_prefix();
        let own = self.drain.current();
        self.waiters().iter().any(|(_, name)| {
            parse_waiter(name)
                .is_some_and(|(t, owner)| !owner.starts_with(&mine) && yields_to(own, t))
        })
    }

    /// The pause a holder that let go for a waiter takes before it asks again: three of the
    /// front waiters' pauses, so that one of them finds the slot free. (It was the slowest
    /// waiter's pause, 520 ms: with 1 s turns a slot then stood idle about a fifth of the
    /// time, and 2 slots at N = 8 drained 18 % slower than no slots.)
    pub fn yield_pause(&self) -> Duration {
        FRONT_PAUSE * 3
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

    /// A drain keeps its ticket while any of its workers waits or holds a slot, turn after
    /// turn, so a drain that began first stays ahead of later ones; once all have let go, its
    /// next request takes a new ticket.
    #[test]
    fn a_drain_keeps_its_ticket_until_all_its_workers_let_go() {
        let d = tempfile::tempdir().expect("tmp");
        let slots = Arc::new(Slots::new(d.path(), 1));
        let stop = Arc::new(AtomicBool::new(false));
        assert_eq!(slots.drain_ticket(), None);
        let p = slots.acquire(0, &stop).expect("free");
        let t = slots.drain_ticket().expect("a ticket while it holds");
        // A second worker waits for the one slot: its waiter file carries the same ticket.
        let (s2, stop2) = (slots.clone(), stop.clone());
        let waiter = std::thread::spawn(move || s2.acquire(1, &stop2).map(|p| p.index()));
        let name = format!("wait.{t:020}.");
        let seen = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            std::fs::read_dir(d.path())
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&name))
        });
        assert!(seen, "the waiter took the drain's ticket {t}");
        // The holder's turn ends; it lets go and asks again while the other holds: same ticket.
        drop(p);
        assert_eq!(waiter.join().expect("waiter"), Some(0));
        assert_eq!(slots.drain_ticket(), None, "nobody waits or holds");
        std::thread::sleep(Duration::from_millis(2));
        let _p = slots.acquire(0, &stop).expect("free");
        assert!(
            slots.drain_ticket().expect("a new one") > t,
            "a new ticket after a pause"
        );
        stop.store(true, Relaxed);
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
        std::fs::write(
            d.path()
                .join(waiter_name(5, &format!("{}7", owner_prefix()))),
            b"",
        )
        .expect("mine");
        assert!(!slots.others_wait(), "this process's own waiter");
        std::fs::write(d.path().join(waiter_name(6, "node9.1.0")), b"").expect("theirs");
        assert!(slots.others_wait());
        let old = std::time::SystemTime::now() - Duration::from_secs(120);
        std::fs::File::options()
            .write(true)
            .open(d.path().join(waiter_name(6, "node9.1.0")))
            .and_then(|f| f.set_modified(old))
            .expect("age it");
        assert!(
            !slots.others_wait(),
            "a stale waiter (dead) is not waited for"
        );
    }

    /// A holder lets go after its turn for an older drain or one of its own group (the same
    /// ticket), and keeps its slot against a later drain.
    #[test]
    fn a_holder_keeps_its_slot_against_later_drains_only() {
        assert!(yields_to(None, 5), "no ticket: any waiter");
        assert!(yields_to(Some(10), 5) && yields_to(Some(10), 10));
        assert!(!yields_to(Some(10), 11));
        let d = tempfile::tempdir().expect("tmp");
        let slots = Slots::new(d.path(), 1);
        let stop = AtomicBool::new(false);
        let _p = slots.acquire(0, &stop).expect("free");
        let t = slots.drain_ticket().expect("held");
        let later = d.path().join(waiter_name(t + 1, "node9.1.0"));
        std::fs::write(&later, b"").expect("later waiter");
        assert!(!slots.others_wait(), "a later drain waits");
        std::fs::write(d.path().join(waiter_name(t, "node8.1.0")), b"").expect("same");
        assert!(slots.others_wait(), "a node of the same group gets a turn");
        std::fs::remove_file(d.path().join(waiter_name(t, "node8.1.0"))).expect("rm");
        std::fs::write(d.path().join(waiter_name(t - 1, "node7.1.0")), b"").expect("older");
        assert!(slots.others_wait(), "an older drain gets a turn");
    }

    /// Two mounts of one group (a job's two nodes) share the ticket of the group's first
    /// drain, whenever the second begins; another group's later drain gets its own, later
    /// one; a group's stale file is made anew.
    #[test]
    fn the_drains_of_one_group_share_the_first_ones_ticket() {
        let d = tempfile::tempdir().expect("tmp");
        let stop = AtomicBool::new(false);
        let a1 = Slots::new(d.path(), 2).with_group(Some("slurm-41"));
        let a2 = Slots::new(d.path(), 2).with_group(Some("slurm-41"));
        let b = Slots::new(d.path(), 2).with_group(Some("slurm-42"));
        let p1 = a1.acquire(0, &stop).expect("free");
        let t = a1.drain_ticket().expect("held");
        std::thread::sleep(Duration::from_millis(5));
        let p2 = b.acquire(0, &stop).expect("free");
        let tb = b.drain_ticket().expect("held");
        assert!(tb > t, "the later group comes after");
        drop((p1, p2));
        std::thread::sleep(Duration::from_millis(5));
        let _p3 = a2.acquire(1, &stop).expect("free");
        assert_eq!(a2.drain_ticket(), Some(t), "the group's first ticket");
        // Stale: an earlier use of the name.
        let path = d.path().join("group.slurm-41");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(std::time::SystemTime::now() - GROUP_FRESH * 2))
            .expect("age it");
        let a3 = Slots::new(d.path(), 2).with_group(Some("slurm-41"));
        let _p4 = a3.acquire(1, &stop).expect("free");
        assert!(a3.drain_ticket().expect("held") > tb, "a new ticket");
        // No private files left behind; bad names are not used.
        let names: Vec<String> = std::fs::read_dir(d.path())
            .expect("list")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.starts_with(".group.")), "{names:?}");
        assert!(!valid_group("../x") && !valid_group("") && valid_group("slurm-7_a"));
        assert!(Slots::new(d.path(), 1)
            .with_group(Some("a/b"))
            .group
            .is_none());
    }

    #[test]
    fn waiters_go_in_the_order_they_came() {
        let w = |t: u64, n: &str| (t, waiter_name(t, n));
        let others = vec![w(10, "a.1.0"), w(20, "b.1.0"), w(30, "c.1.0")];
        // One slot: only the first waiter tries; two slots: the first two.
        assert!(may_try(10, &others[0].1, &others, 1));
        assert!(!may_try(20, &others[1].1, &others, 1));
        assert!(may_try(20, &others[1].1, &others, 2));
        assert!(!may_try(30, &others[2].1, &others, 2));
        // A newcomer (not yet announced) waits behind all of them.
        assert!(!may_try(40, &waiter_name(40, "d.1.0"), &others, 3));
        assert!(may_try(40, &waiter_name(40, "d.1.0"), &others, 4));
        // The same ticket: the smaller name first.
        let tie = vec![w(10, "a.1.0"), w(10, "b.1.0")];
        assert!(may_try(10, &tie[0].1, &tie, 1));
        assert!(!may_try(10, &tie[1].1, &tie, 1));
        assert_eq!(parse_waiter(&others[1].1), Some((20, "b.1.0")));
        assert_eq!(parse_waiter("wait.x.b.1.0"), None);
        assert_eq!(parse_waiter("slot.0"), None);
    }

    #[test]
    fn a_newcomer_does_not_take_a_freed_slot_ahead_of_an_older_waiter() {
        let d = tempfile::tempdir().expect("tmp");
        let slots = Arc::new(Slots::new(d.path(), 1));
        let stop = Arc::new(AtomicBool::new(false));
        // Another node's worker has waited since long ago (its file fresh: it lives).
        let older = d.path().join(waiter_name(1, "node9.1.0"));
        std::fs::write(&older, b"").expect("older waiter");
        let got = Arc::new(AtomicBool::new(false));
        let h = {
            let (slots, stop, got) = (slots.clone(), stop.clone(), got.clone());
            std::thread::spawn(move || {
                let p = slots.acquire(3, &stop);
                got.store(p.is_some(), Relaxed);
                p
            })
        };
        std::thread::sleep(Duration::from_millis(400));
        assert!(
            !got.load(Relaxed),
            "the slot is free but an older waiter comes first"
        );
        // The older waiter got its slot (or died): its file goes, the newcomer's turn comes.
        std::fs::remove_file(&older).expect("older served");
        let t = Instant::now();
        let p = h.join().expect("newcomer");
        assert!(p.is_some() && t.elapsed() < Duration::from_secs(2));
        // A stale older waiter (dead for 2 minutes) is not waited for.
        drop(p);
        std::fs::write(&older, b"").expect("older waiter");
        std::fs::File::options()
            .write(true)
            .open(&older)
            .and_then(|f| f.set_modified(std::time::SystemTime::now() - Duration::from_secs(120)))
            .expect("age it");
        let t = Instant::now();
        assert!(slots.acquire(4, &stop).is_some());
        assert!(t.elapsed() < Duration::from_millis(500));
    }

    #[test]
    fn a_folder_that_cannot_hold_slots_is_refused() {
        let d = tempfile::tempdir().expect("tmp");
        let file = d.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        assert!(Slots::new(&file.join("slots"), 2).check().is_err());
    }
}
