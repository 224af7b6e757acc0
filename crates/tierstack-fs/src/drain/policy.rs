//! The drain's policy: *when* and *whether* rows are drained, as pure functions.
//!
//! The dispatcher and the workers ([`super::Drainer`]) gather what they know (signals read
//! from the [`crate::core::Core`], how long the foreground has been quiet, how long rows have
//! waited, what is in flight, a row's failed tries), call the policy and carry out what it
//! says. Nothing here does I/O, takes a lock or reads the clock: the time comes in as
//! durations measured by the caller, so every decision is a unit test away.
//!
//! * [`choose`]: whether the rows in the journal are drained now, waited on (a gap in the
//!   foreground's work) or slept over, from a [`State`] and the [`Config`];
//! * [`turns_urgent`] and [`cuts_wait`]: what the foreground's signals (pressure, `drain`,
//!   `drain --retry`, stop) do to the waiting;
//! * [`may_start`]: whether a data row or a barrier may start, given what is in flight;
//! * [`after_failure`] (with [`Tries`] and [`may_heal`]): retry with backoff, quarantine or
//!   leave a row that failed; [`waits_for`]: the quarantined row that a row is held behind;
//! * [`stop_drain_goes_on`]: whether a stopping daemon keeps forcing the drain.

use std::io;
use std::time::Duration;

use crate::core::under;
use crate::db::{JOp, OpKind};

/// The drain waits until the foreground has done no namespace work or write for this long
/// (a gap in the job's I/O) ...
pub const DRAIN_QUIET: Duration = Duration::from_millis(300);
/// ... or until rows have waited this long, whichever comes first.
pub const DRAIN_MAX_DELAY: Duration = Duration::from_secs(5);
/// After `tierstack drain` (and `drain --wait`, `umount`) or under pressure, the drain does
/// not wait for gaps for this long.
pub const URGENT_FOR: Duration = Duration::from_secs(2);
/// Tries of an op that failed with an error that will not heal before it is quarantined.
pub const PERMANENT_TRIES: u32 = 3;

/// The drain's timing: the constants every decision is taken against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// A gap in the foreground's work this long lets the drain run ([`DRAIN_QUIET`]).
    pub quiet: Duration,
    /// Rows that have waited this long are drained without a gap ([`DRAIN_MAX_DELAY`]).
    pub max_delay: Duration,
    /// After pressure or a `drain` request, gaps are not waited for this long
    /// ([`URGENT_FOR`]).
    pub urgent_for: Duration,
    /// The longest nap while waiting for a gap (the quiet time is looked at again after it).
    pub nap: Duration,
    /// How often a nap looks at the signals that cut it short ([`cuts_wait`]).
    pub signal_poll: Duration,
    /// The longest sleep with an empty journal (a wake-up ends it sooner).
    pub idle_sleep: Duration,
    /// The pause after the journal could not be read or written.
    pub journal_pause: Duration,
    /// The first retry's backoff; each further one doubles it ...
    pub backoff_first: Duration,
    /// ... up to this.
    pub backoff_max: Duration,
    /// Refusals (errors that do not heal, see [`may_heal`]) before a row is quarantined
    /// ([`PERMANENT_TRIES`]).
    pub permanent_tries: u32,
    /// How often a stopping daemon asks for the drain again while it waits for it.
    pub stop_poll: Duration,
}

impl Config {
    /// The drain's settings.
    pub const DEFAULT: Config = Config {
        quiet: DRAIN_QUIET,
        max_delay: DRAIN_MAX_DELAY,
        urgent_for: URGENT_FOR,
        nap: Duration::from_millis(100),
        signal_poll: Duration::from_millis(5),
        idle_sleep: Duration::from_millis(200),
        journal_pause: Duration::from_millis(500),
        backoff_first: Duration::from_millis(100),
        backoff_max: Duration::from_secs(5),
        permanent_tries: PERMANENT_TRIES,
        stop_poll: Duration::from_millis(100),
    };

    /// The pause before retry number `retry` (0 for the first): exponential from
    /// `backoff_first`, at most `backoff_max` (100 ms, 200 ms ... 3.2 s, then 5 s).
    pub fn backoff(&self, retry: u32) -> Duration {
        self.backoff_first
            .checked_mul(1u32 << retry.min(20))
            .map_or(self.backoff_max, |d| d.min(self.backoff_max))
    }
}

impl Default for Config {
    fn default() -> Config {
        Config::DEFAULT
    }
}

// ------------------------------------------------------------------ when the journal drains

/// The journal's rows beyond the dispatcher's cursor, as the dispatcher found them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backlog {
    /// No row waits.
    Empty,
    /// Rows wait, since `waited` ago (0 when they were just found).
    Rows {
        /// How long rows have been waiting for a gap in the foreground's work.
        waited: Duration,
    },
    /// The journal could not be read.
    Unreadable,
}

/// What the dispatcher knows when it decides whether to drain the journal's rows now. All
/// durations are measured at one `now` by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// The rows waiting.
    pub backlog: Backlog,
    /// How long the foreground has made no namespace change and no write.
    pub quiet_for: Duration,
    /// How long ago the drain last turned urgent ([`turns_urgent`]); None if it never did.
    pub since_urgent: Option<Duration>,
}

/// Why rows are drained now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Within [`Config::urgent_for`] of pressure or a `drain` request.
    Urgent,
    /// The foreground has been quiet for [`Config::quiet`].
    Quiet,
    /// Rows have waited [`Config::max_delay`] (a job that never pauses still drains).
    Overdue,
}

/// What the dispatcher does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Drain the next batch of rows now.
    Drain(Why),
    /// Wait for a gap in the foreground's work: nap for at most this long, cut short by a
    /// signal ([`cuts_wait`]), then choose again. The foreground's own wake-ups do not end it.
    Wait(Duration),
    /// Nothing to drain: sleep until woken, for at most this long.
    Sleep(Duration),
    /// The journal failed: pause this long, then try again.
    Pause(Duration),
}

/// Whether the journal's rows are drained now, and if not, how long the dispatcher waits.
///
/// The drain works in the gaps of the foreground's work: while a job creates, writes and
/// removes, the drain would take CPU and disk from it, and a file created and removed within
/// the burst need never reach BACKING. Rows are drained once the foreground has been quiet
/// for [`Config::quiet`], once they have waited [`Config::max_delay`], and at once within
/// [`Config::urgent_for`] of the drain turning urgent.
pub fn choose(s: &State, cfg: &Config) -> Choice {
    let waited = match s.backlog {
        Backlog::Empty => return Choice::Sleep(cfg.idle_sleep),
        Backlog::Unreadable => return Choice::Pause(cfg.journal_pause),
        Backlog::Rows { waited } => waited,
    };
    if s.since_urgent.is_some_and(|d| d < cfg.urgent_for) {
        Choice::Drain(Why::Urgent)
    } else if s.quiet_for >= cfg.quiet {
        Choice::Drain(Why::Quiet)
    } else if waited >= cfg.max_delay {
        Choice::Drain(Why::Overdue)
    } else {
        Choice::Wait((cfg.quiet - s.quiet_for).min(cfg.nap))
    }
}

/// Whether the drain turns urgent now: writers wait for space (`pressure`) or `tierstack
/// drain` (also `drain --wait`, `umount`) asked for it (`forced`). The dispatcher then queues
/// every dirty file (open ones too) and drains without waiting for gaps for
/// [`Config::urgent_for`].
pub fn turns_urgent(pressure: bool, forced: bool) -> bool {
    pressure || forced
}

/// The signals the foreground, the control socket and the daemon raise for the dispatcher.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals {
    /// The drainer is stopping.
    pub stop: bool,
    /// `tierstack drain` asked for every dirty file to be drained now.
    pub force: bool,
    /// Writers wait for space.
    pub pressure: bool,
    /// `tierstack drain --retry` asked for the quarantined rows to be tried again.
    pub retry: bool,
}

/// Whether a wait for a gap ([`Choice::Wait`]) ends early: any signal does (each changes what
/// [`choose`] says, or stops the drainer).
pub fn cuts_wait(s: &Signals) -> bool {
    s.stop || s.force || s.pressure || s.retry
}

// ------------------------------------------------------------------ rows against the workers

/// A row as the worker limit sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// A data row: parallel across files, one at a time per file.
    Data,
    /// A row that moves, removes or changes existing paths (or the release of the
    /// quarantine): it runs only when no data row is in flight.
    Barrier,
    /// A row that changes one regular file in place (its mode, owner or times): it waits
    /// only for that file's data rows, not for everyone's (`tar` sets every file's times
    /// after writing it: as a barrier, that made the drain one file at a time).
    OwnFile,
}

/// What is in flight when a row is to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    /// Data rows in flight.
    pub in_flight: usize,
    /// Of them, rows of the row's own file.
    pub same_file: usize,
    /// The worker limit (data rows being written at most).
    pub jobs: usize,
    /// Of the rows in flight, those written and parked for the batch's shared sync
    /// (`batch.rs`): they hold no worker.
    pub parked: usize,
}

/// Parked rows at most (two batches): past them, no data row starts until a batch is
/// committed.
pub const MAX_PARKED: usize = 2 * super::batch::BATCH_FILES;

/// Whether a row of `kind` may start now (else the dispatcher waits for a data row to end).
pub fn may_start(kind: RowKind, s: &Slots) -> bool {
    match kind {
        RowKind::Data => {
            s.in_flight - s.parked.min(s.in_flight) < s.jobs
                && s.parked < MAX_PARKED
                && s.same_file == 0
        }
        RowKind::Barrier => s.in_flight == 0,
        RowKind::OwnFile => s.same_file == 0,
    }
}

// ------------------------------------------------------------------ retries and quarantine

/// Whether BACKING may stop giving this error by itself (space freed, file system remounted
/// read-write, a transient I/O or network error): such errors are retried without end.
pub fn may_heal(e: &io::Error) -> bool {
    match e.raw_os_error() {
        Some(c) => [
            libc::ENOSPC,
            libc::EDQUOT,
            libc::EIO,
            libc::EROFS,
            libc::EAGAIN,
            libc::EINTR,
            libc::ENOMEM,
            libc::ETIMEDOUT,
            libc::ESTALE,
            libc::EBUSY,
            libc::ENOLCK,
            libc::ENFILE,
            libc::EMFILE,
            libc::ENOTCONN,
            libc::ECONNRESET,
            libc::ECONNREFUSED,
            libc::ENETDOWN,
            libc::ENETUNREACH,
            libc::EHOSTUNREACH,
        ]
        .contains(&c),
        // Not an errno: the fast tier or the journal failed, not BACKING's answer.
        None => true,
    }
}

/// A row's failed tries so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tries {
    /// Failed tries, of any error.
    pub failed: u32,
    /// Of them, tries BACKING refused (an error that does not heal, see [`may_heal`]).
    pub refused: u32,
}

impl Tries {
    /// These tries and one more failed one; `heals`: its error may heal.
    pub fn and_failed(self, heals: bool) -> Tries {
        Tries {
            failed: self.failed.saturating_add(1),
            refused: self.refused.saturating_add(u32::from(!heals)),
        }
    }
}

/// What becomes of a row whose try just failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Try it again after this pause.
    Retry(Duration),
    /// BACKING refused it for good: move it to the quarantine, the drain goes on.
    Quarantine,
    /// The drainer is stopping: the row stays in the journal for the next mount.
    Leave,
}

/// What becomes of a row after a failed try (`tries` counts it): quarantined once BACKING
/// refused it [`Config::permanent_tries`] times (even when stopping: the refusal is known);
/// else left to the next mount when the drainer is `stopping`; else retried after
/// [`Config::backoff`]. Errors that may heal are retried without end, never more than
/// [`Config::backoff_max`] apart.
pub fn after_failure(tries: &Tries, stopping: bool, cfg: &Config) -> AfterFailure {
    if tries.refused >= cfg.permanent_tries {
        AfterFailure::Quarantine
    } else if stopping {
        AfterFailure::Leave
    } else {
        AfterFailure::Retry(cfg.backoff(tries.failed.saturating_sub(1)))
    }
}

/// A quarantined row, as later rows may depend on it.
#[derive(Debug, Clone)]
pub struct Refused {
    pub(super) ino: u64,
    /// The paths it would have made or changed in BACKING.
    pub(super) paths: Vec<Vec<u8>>,
    /// "Kind path", for the rows held behind it.
    pub(super) what: String,
}

impl Refused {
    /// The row `op`, quarantined.
    pub fn of(op: &JOp) -> Refused {
        Refused {
            ino: op.ino,
            paths: paths_of(op).into_iter().map(<[u8]>::to_vec).collect(),
            what: format!("{:?} {}", op.kind, String::from_utf8_lossy(&op.p1)),
        }
    }

    /// "Kind path" of the row.
    pub fn what(&self) -> &str {
        &self.what
    }
}

/// The paths row `op` makes or changes in BACKING.
fn paths_of(op: &JOp) -> Vec<&[u8]> {
    let mut paths = vec![op.p1.as_slice()];
    if matches!(op.kind, OpKind::Rename | OpKind::Link) {
        paths.push(&op.p2);
    }
    paths
}

/// The quarantined row that `op` depends on, if any: one of the same inode (its creation,
/// an earlier rename or data of it), or one whose paths hold a path of `op` (a directory
/// BACKING refused to make, a name a refused rename was to bring). Such a row is held behind
/// it untried, and goes back into the journal with it, in journal order.
pub fn waits_for<'a>(op: &JOp, refused: &'a [Refused]) -> Option<&'a Refused> {
    let mine = paths_of(op);
    refused.iter().find(|r| {
        (r.ino == op.ino && op.ino != 0)
            || r.paths
                .iter()
                .any(|rp| !rp.is_empty() && mine.iter().any(|p| under(p, rp)))
    })
}

// ------------------------------------------------------------------ the stop

/// Where the drain of a stopping daemon stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtStop {
    /// Nothing left to drain, or nothing but quarantined rows.
    pub drained: bool,
    /// The drain is cut short (`umount --force`, a second signal).
    pub cut_short: bool,
    /// How long the stop has drained so far.
    pub elapsed: Duration,
    /// How long it may drain at most (None: until drained or cut short).
    pub limit: Option<Duration>,
}

/// Whether a stopping daemon keeps forcing the drain (every [`Config::stop_poll`]).
pub fn stop_drain_goes_on(s: &AtStop) -> bool {
    !s.drained && !s.cut_short && s.limit.is_none_or(|l| s.elapsed < l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const C: Config = Config::DEFAULT;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Rows that have waited `waited`, the foreground quiet for `quiet`, never urgent.
    fn rows(waited: Duration, quiet: Duration) -> State {
        State {
            backlog: Backlog::Rows { waited },
            quiet_for: quiet,
            since_urgent: None,
        }
    }

    #[test]
    fn nothing_to_drain_sleeps_and_a_failed_journal_pauses() {
        let s = State {
            backlog: Backlog::Empty,
            ..rows(ms(0), ms(0))
        };
        assert_eq!(choose(&s, &C), Choice::Sleep(ms(200)));
        // Even when urgent: there is nothing to drain.
        let s = State {
            since_urgent: Some(ms(0)),
            ..s
        };
        assert_eq!(choose(&s, &C), Choice::Sleep(ms(200)));
        let s = State {
            backlog: Backlog::Unreadable,
            ..s
        };
        assert_eq!(choose(&s, &C), Choice::Pause(ms(500)));
    }

    #[test]
    fn quiet_a_file_written_recently_waits_for_a_gap() {
        // Written just now: nap (at most 100 ms at a time) and look again.
        assert_eq!(choose(&rows(ms(0), ms(0)), &C), Choice::Wait(ms(100)));
        // 250 ms quiet: only the 50 ms that are missing.
        assert_eq!(choose(&rows(ms(1000), ms(250)), &C), Choice::Wait(ms(50)));
        // Quiet for DRAIN_QUIET: drained.
        assert_eq!(
            choose(&rows(ms(0), DRAIN_QUIET), &C),
            Choice::Drain(Why::Quiet)
        );
        assert_eq!(
            choose(&rows(ms(0), Duration::from_secs(60)), &C),
            Choice::Drain(Why::Quiet)
        );
    }

    #[test]
    fn max_delay_a_file_that_keeps_being_written_drains_anyway() {
        // The foreground never pauses: the rows wait until DRAIN_MAX_DELAY, not longer.
        let busy = ms(1);
        assert!(matches!(
            choose(&rows(DRAIN_MAX_DELAY - ms(1), busy), &C),
            Choice::Wait(_)
        ));
        assert_eq!(
            choose(&rows(DRAIN_MAX_DELAY, busy), &C),
            Choice::Drain(Why::Overdue)
        );
        assert_eq!(
            choose(&rows(DRAIN_MAX_DELAY * 3, busy), &C),
            Choice::Drain(Why::Overdue)
        );
    }

    #[test]
    fn urgent_pressure_drains_at_once_for_urgent_for() {
        // Writers wait for space: the drain turns urgent ...
        assert!(turns_urgent(true, false));
        // ... and does not wait for a gap while the foreground writes ...
        let s = |since| State {
            since_urgent: Some(since),
            ..rows(ms(0), ms(0))
        };
        assert_eq!(choose(&s(ms(0)), &C), Choice::Drain(Why::Urgent));
        assert_eq!(
            choose(&s(URGENT_FOR - ms(1)), &C),
            Choice::Drain(Why::Urgent)
        );
        // ... until URGENT_FOR has passed since it last turned urgent.
        assert_eq!(choose(&s(URGENT_FOR), &C), Choice::Wait(ms(100)));
        // Neither pressure nor a request: nothing turns urgent.
        assert!(!turns_urgent(false, false));
    }

    #[test]
    fn force_a_drain_request_drains_at_once() {
        // `drain`, `drain --wait`, `umount`: urgent, every dirty file queued.
        assert!(turns_urgent(false, true));
        let s = State {
            since_urgent: Some(ms(0)),
            ..rows(ms(0), ms(0))
        };
        assert_eq!(choose(&s, &C), Choice::Drain(Why::Urgent));
        // A request ends a wait for a gap at once, as do the other signals; the
        // foreground's work does not.
        assert!(!cuts_wait(&Signals::default()));
        for s in [
            Signals {
                force: true,
                ..Signals::default()
            },
            Signals {
                pressure: true,
                ..Signals::default()
            },
            Signals {
                retry: true,
                ..Signals::default()
            },
            Signals {
                stop: true,
                ..Signals::default()
            },
        ] {
            assert!(cuts_wait(&s), "{s:?}");
        }
    }

    #[test]
    fn retry_backs_off_exponentially_and_is_bounded() {
        assert_eq!(C.backoff(0), ms(100));
        assert_eq!(C.backoff(1), ms(200));
        assert_eq!(C.backoff(5), ms(3200));
        assert_eq!(C.backoff(6), ms(5000));
        assert_eq!(C.backoff(u32::MAX), ms(5000));
        // An error that may heal (full, I/O) is retried without end, at most 5 s apart.
        let mut t = Tries::default();
        let mut pauses = Vec::new();
        for _ in 0..100 {
            t = t.and_failed(true);
            match after_failure(&t, false, &C) {
                AfterFailure::Retry(d) => pauses.push(d),
                other => panic!("after {t:?}: {other:?}"),
            }
        }
        assert_eq!(&pauses[..3], &[ms(100), ms(200), ms(400)]);
        assert!(pauses.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(pauses.last(), Some(&ms(5000)));
        // A stopping drainer leaves the row for the next mount.
        assert_eq!(after_failure(&t, true, &C), AfterFailure::Leave);
        let heals = io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(may_heal(&heals));
        assert!(may_heal(&io::Error::other("the journal failed")));
    }

    #[test]
    fn stuck_a_row_refused_permanent_tries_times_is_quarantined() {
        let refusal = io::Error::from_raw_os_error(libc::EACCES);
        assert!(!may_heal(&refusal));
        let mut t = Tries::default();
        for i in 1..PERMANENT_TRIES {
            t = t.and_failed(false);
            // Retried meanwhile, with the same backoff as any error.
            assert_eq!(
                after_failure(&t, false, &C),
                AfterFailure::Retry(C.backoff(i - 1))
            );
        }
        // Healing errors in between do not count towards the quarantine.
        t = t.and_failed(true);
        assert!(matches!(
            after_failure(&t, false, &C),
            AfterFailure::Retry(_)
        ));
        t = t.and_failed(false);
        assert_eq!(t.refused, PERMANENT_TRIES);
        assert_eq!(after_failure(&t, false, &C), AfterFailure::Quarantine);
        // Known refused for good: quarantined even when stopping (status lists it).
        assert_eq!(after_failure(&t, true, &C), AfterFailure::Quarantine);
    }

    use crate::drain::test_op as op;

    #[test]
    fn stuck_rows_wait_for_the_refused_rows_they_depend_on() {
        let mkdir = Refused::of(&op(1, OpKind::Mkdir, 10, "x"));
        let ren = Refused::of(&JOp {
            p2: b"y/b".to_vec(),
            ..op(2, OpKind::Rename, 11, "a")
        });
        let refused = [mkdir, ren];
        let w = |o: &JOp| waits_for(o, &refused).map(|r| r.what().to_string());
        // Under the directory BACKING refused to make.
        assert_eq!(
            w(&op(3, OpKind::Create, 12, "x/f")).as_deref(),
            Some("Mkdir x")
        );
        // A later row of the same inode.
        assert_eq!(
            w(&op(4, OpKind::Data, 11, "q")).as_deref(),
            Some("Rename a")
        );
        // The name a refused rename was to bring, as a rename's target.
        let r2 = JOp {
            p2: b"y/b".to_vec(),
            ..op(5, OpKind::Rename, 13, "c")
        };
        assert_eq!(w(&r2).as_deref(), Some("Rename a"));
        // Unrelated rows, and names that only share a prefix, go on.
        assert_eq!(w(&op(6, OpKind::Create, 14, "xy")), None);
        assert_eq!(w(&op(7, OpKind::Mkdir, 15, "z")), None);
        // Nothing quarantined: nothing waits.
        assert!(waits_for(&op(8, OpKind::Data, 11, "q"), &[]).is_none());
    }

    #[test]
    fn parked_rows_hold_no_worker_but_stay_in_flight() {
        let s = |in_flight, same_file, parked| Slots {
            in_flight,
            same_file,
            jobs: 4,
            parked,
        };
        // Four written and parked for the batch's sync: four more may be written.
        assert!(may_start(RowKind::Data, &s(4, 0, 4)));
        assert!(may_start(RowKind::Data, &s(7, 0, 4)));
        assert!(!may_start(RowKind::Data, &s(8, 0, 4)));
        // At most MAX_PARKED wait for the committer.
        assert!(!may_start(RowKind::Data, &s(MAX_PARKED, 0, MAX_PARKED)));
        // A barrier, and a later row of a parked file, wait for the batch.
        assert!(!may_start(RowKind::Barrier, &s(3, 0, 3)));
        assert!(!may_start(RowKind::Data, &s(3, 1, 3)));
        assert!(!may_start(RowKind::OwnFile, &s(3, 1, 3)));
        assert!(may_start(RowKind::OwnFile, &s(3, 0, 3)));
    }

    #[test]
    fn data_rows_run_in_parallel_across_files_and_barriers_alone() {
        let s = |in_flight, same_file| Slots {
            in_flight,
            same_file,
            jobs: 4,
            parked: 0,
        };
        assert!(may_start(RowKind::Data, &s(0, 0)));
        assert!(may_start(RowKind::Data, &s(3, 0)));
        // The workers are all busy.
        assert!(!may_start(RowKind::Data, &s(4, 0)));
        // One at a time per file.
        assert!(!may_start(RowKind::Data, &s(1, 1)));
        // A barrier waits for every data row to end.
        assert!(may_start(RowKind::Barrier, &s(0, 0)));
        assert!(!may_start(RowKind::Barrier, &s(1, 0)));
        // A file's own change waits for that file's data rows only.
        assert!(may_start(RowKind::OwnFile, &s(4, 0)));
        assert!(!may_start(RowKind::OwnFile, &s(2, 1)));
    }

    #[test]
    fn the_stop_drains_until_drained_cut_short_or_out_of_time() {
        let s = AtStop {
            drained: false,
            cut_short: false,
            elapsed: Duration::from_secs(3600),
            limit: None,
        };
        // `umount`: no limit.
        assert!(stop_drain_goes_on(&s));
        assert!(!stop_drain_goes_on(&AtStop { drained: true, ..s }));
        assert!(!stop_drain_goes_on(&AtStop {
            cut_short: true,
            ..s
        }));
        // A stop by signal: bounded.
        let limit = Some(Duration::from_secs(60));
        assert!(stop_drain_goes_on(&AtStop {
            elapsed: Duration::from_secs(59),
            limit,
            ..s
        }));
        assert!(!stop_drain_goes_on(&AtStop {
            elapsed: Duration::from_secs(60),
            limit,
            ..s
        }));
    }

    /// How long a choice holds the rows back (None: it does not drain them at all).
    fn delay(c: Choice) -> Option<Duration> {
        match c {
            Choice::Drain(_) => Some(Duration::ZERO),
            Choice::Wait(d) => Some(d),
            Choice::Sleep(_) | Choice::Pause(_) => None,
        }
    }

    fn any_state() -> impl Strategy<Value = State> {
        (
            0u64..20_000,
            0u64..2_000,
            proptest::option::of(0u64..10_000),
        )
            .prop_map(|(waited, quiet, urgent)| State {
                backlog: Backlog::Rows { waited: ms(waited) },
                quiet_for: ms(quiet),
                since_urgent: urgent.map(ms),
            })
    }

    proptest! {
        /// More pressure (a more recent urgent turn), a longer quiet time or a longer wait
        /// never delays a drain.
        #[test]
        fn more_urgency_never_delays_a_drain(
            s in any_state(),
            urgent in proptest::option::of(0u64..10_000),
            more_quiet in 0u64..2_000,
            more_wait in 0u64..20_000,
        ) {
            let Backlog::Rows { waited } = s.backlog else { unreachable!() };
            let since_urgent = match (s.since_urgent, urgent.map(ms)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let more = State {
                backlog: Backlog::Rows { waited: waited + ms(more_wait) },
                quiet_for: s.quiet_for + ms(more_quiet),
                since_urgent,
            };
            let (before, after) = (delay(choose(&s, &C)), delay(choose(&more, &C)));
            prop_assert!(after <= before, "{s:?}: {before:?}, {more:?}: {after:?}");
            // Pressure now always drains at once.
            let pressed = State { since_urgent: Some(Duration::ZERO), ..s };
            prop_assert_eq!(choose(&pressed, &C), Choice::Drain(Why::Urgent));
        }

        /// Rows are never held past the max delay, and a wait never outlasts the quiet time
        /// still missing nor one nap.
        #[test]
        fn waits_are_bounded(s in any_state()) {
            let Backlog::Rows { waited } = s.backlog else { unreachable!() };
            match choose(&s, &C) {
                Choice::Wait(d) => {
                    prop_assert!(waited < C.max_delay);
                    prop_assert!(d > Duration::ZERO && d <= C.nap);
                    prop_assert!(s.quiet_for + d <= C.quiet);
                }
                Choice::Drain(_) => {}
                other => prop_assert!(false, "{other:?}"),
            }
        }

        /// Any sequence of failures: a row is retried at most `backoff_max` apart, and
        /// quarantined exactly when BACKING refused it `permanent_tries` times.
        #[test]
        fn failures_retry_boundedly_or_quarantine(heals in proptest::collection::vec(any::<bool>(), 1..40)) {
            let mut t = Tries::default();
            for (i, h) in heals.iter().enumerate() {
                t = t.and_failed(*h);
                let refused = heals[..=i].iter().filter(|h| !**h).count() as u32;
                match after_failure(&t, false, &C) {
                    AfterFailure::Quarantine => {
                        prop_assert_eq!(refused, C.permanent_tries);
                        break;
                    }
                    AfterFailure::Retry(d) => {
                        prop_assert!(refused < C.permanent_tries);
                        prop_assert!(d >= C.backoff_first && d <= C.backoff_max);
                    }
                    AfterFailure::Leave => prop_assert!(false, "left while not stopping"),
                }
            }
        }
    }
}
