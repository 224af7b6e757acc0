//! Busy polling of the FUSE device while the mount is busy.
//!
//! A FUSE request is a round trip between two threads: the caller sleeps in the kernel until
//! a FUSE thread, woken from its `read` of `/dev/fuse`, answers. Where waking a sleeping thread
//! is expensive (a CPU that halts when idle must be sent an interrupt; in a virtual machine
//! that is an exit to the host), those wake-ups are most of a small operation's cost: a `stat`
//! served in 10 µs by the daemon takes 25-35 µs here.
//!
//! While the mount serves small requests back to back (at least [`POLL_RATE`] operations per
//! millisecond: a metadata storm, a loop of small unbuffered writes), one FUSE thread's
//! descriptor is switched to non-blocking mode: its reader (`fuser` retries a read that finds
//! nothing) then polls the device instead of sleeping, and picks up the next request without
//! being woken. Large requests (a checkpoint's or IOR's 1 MiB writes, a few per millisecond)
//! keep every thread sleeping: there the CPU is better spent on copying. Once the rate has
//! been under [`POLL_RATE`] for [`QUIET_OFF`], the descriptor blocks again and the thread
//! sleeps. The governor thread that switches it looks every millisecond while polling, every
//! [`CHECK_RECENT`] for a second after the last operation, then every [`CHECK_IDLE`]: an idle
//! mount polls nothing and wakes 20 times a second. Polling takes one CPU while it lasts; it
//! is off on a machine with one CPU, and `mount --no-poll` turns it off.
//!
//! `O_NONBLOCK` belongs to the open file description: the governor switches it through a
//! duplicate of the session's descriptor, which it owns (it can never be a reused number), and
//! which reaches the thread reading the session's original descriptor. Replies and
//! notifications written to the device do not depend on the flag.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};

use crate::core::Core;

/// How often the governor looks while the device is polled.
pub const CHECK_BUSY: Duration = Duration::from_millis(1);
/// How often it looks in the first second after the mount went quiet.
pub const CHECK_RECENT: Duration = Duration::from_millis(5);
/// How often it looks once the mount has been quiet for a second.
pub const CHECK_IDLE: Duration = Duration::from_millis(50);
/// Polling stops once the rate has been under [`POLL_RATE`] for this long.
pub const QUIET_OFF: Duration = Duration::from_millis(3);
/// Operations started per millisecond from which the device is polled.
pub const POLL_RATE: f64 = 5.0;

/// Whether polling pays on this machine: it takes a CPU away from the callers.
pub fn worth_it() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
}

/// Starts the governor over the session's device descriptor `dev`; it returns when the core
/// stops or the FUSE connection is gone (unmounted, or a start that failed after this).
/// Errors: the descriptor cannot be duplicated or the thread cannot start.
pub fn start(dev: BorrowedFd<'_>, core: Arc<Core>) -> std::io::Result<()> {
    let fd = dev.try_clone_to_owned()?;
    std::thread::Builder::new()
        .name("fuse-poll".into())
        .spawn(move || govern(fd, &core))?;
    Ok(())
}

/// Switches polling on `fd` on and off with the mount's operations until the core stops, and
/// leaves the descriptor blocking.
fn govern(fd: OwnedFd, core: &Core) {
    let set = |on: bool| -> bool {
        let Ok(fl) = fcntl_getfl(fd.as_fd()) else {
            return false;
        };
        let want = if on {
            fl | OFlags::NONBLOCK
        } else {
            fl - OFlags::NONBLOCK
        };
        fcntl_setfl(fd.as_fd(), want).is_ok()
    };
    let mut seen = core.ops().started_by_kernel();
    let mut looked = Instant::now();
    let mut last_op = looked;
    let mut busy_until = looked;
    let mut polling = false;
    while !core.stopping() && connected(&fd) {
        let wait = if polling {
            CHECK_BUSY
        } else if last_op.elapsed() < Duration::from_secs(1) {
            CHECK_RECENT
        } else {
            CHECK_IDLE
        };
        std::thread::sleep(wait);
        let now = Instant::now();
        let started = core.ops().started_by_kernel();
        let ms = now.duration_since(looked).as_secs_f64() * 1e3;
        let rate = started.wrapping_sub(seen) as f64 / ms.max(1e-3);
        if started != seen {
            last_op = now;
        }
        seen = started;
        looked = now;
        if polling {
            core.add_polled_ms(ms.round() as u64);
        }
        if rate >= POLL_RATE && !core.serves_uring() {
            busy_until = now + QUIET_OFF;
            if !polling {
                polling = set(true);
            }
        } else if polling && now >= busy_until {
            set(false);
            polling = false;
        }
        core.set_polling(polling);
    }
    core.set_polling(false);
    if polling {
        set(false);
    }
}

/// Whether the FUSE connection of `fd` is up: the device reports an error to `poll` once it is
/// down (unmounted or aborted).
fn connected(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::empty())];
    match poll(&mut fds, Some(&Timespec::default())) {
        Ok(_) => !fds[0]
            .revents()
            .intersects(PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL),
        Err(_) => false,
    }
}
