//! The shared-memory slot of one client connection: a head of three state words and one
//! buffer that holds a request, then its answer.
//!
//! The state word goes idle (0, as made)/`ANSWERED` → `ASKED` (the client wrote a request) →
//! `PICKED` (a running daemon thread took it) → `ANSWERED` (the daemon wrote the answer over
//! it). Whoever waits spins a bounded time (only with more than one CPU online: with one, the
//! other side cannot run while we spin), then sleeps on a futex of the state word after saying
//! so in its `*_sleeps` word; the other side wakes it only when that word is set (so a call
//! between two running sides makes no system call). Both sides check their `*_sleeps` and the
//! state in sequentially consistent order, and the futex wait itself sleeps only while the
//! state is still the one seen, so no wake-up is lost.
//!
//! The client spins for its answer only once the request is `PICKED`: then a daemon thread is
//! running it and the answer is the operation's time away. A request still `ASKED` after
//! [`ASKED_SPIN`] waits for a daemon thread that is not running (asleep, or waiting for a
//! CPU): spinning then only takes the CPU that thread needs, so the client sleeps at once.
//! With four programs and four daemon threads on two CPUs, spinning on `ASKED` made the
//! programs' small-file reads 3-4x slower than sleeping (`bench meta --procs 4`'s read
//! phase, docs/BENCHMARKS.md); with a CPU each, the daemon thread picks the request up
//! within the first microsecond and the client spins as before.
//!
//! No Rust reference to the shared bytes is ever made: the other process may write them at
//! any time (a misbehaving client), so they are copied in and out ([`Chan::put`],
//! [`Chan::get`]) and the daemon decodes a private copy.
//!
//! Every wait is bounded: the client gives up after [`CALL_LIMIT`] (EIO for the program) or
//! as soon as the daemon's socket hangs up; the daemon's wait ends when the client's socket
//! hangs up.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// Bytes of the head before the buffer.
pub const HEAD: usize = 64;
/// The most data one read or write carries (larger ones are split by the client).
pub const MAX_DATA: usize = 1 << 20;
/// Bytes of the buffer: the largest request or answer.
pub const BUF: usize = MAX_DATA + 4096;
/// Bytes of the whole slot.
pub const SLOT_BYTES: usize = HEAD + BUF;
/// The longest a client waits for one answer before the call fails with EIO.
pub const CALL_LIMIT: Duration = Duration::from_secs(120);
/// How long the client spins for the answer to a request a daemon thread has picked up
/// before it sleeps.
pub const CLIENT_SPIN: Duration = Duration::from_micros(40);
/// How long the client spins for a daemon thread to pick its request up before it sleeps.
pub const ASKED_SPIN: Duration = Duration::from_micros(1);
/// How long the daemon spins for the next request after an answer before it sleeps.
pub const SERVER_SPIN: Duration = Duration::from_micros(60);
/// How long a daemon thread that holds one of the long waits ([`long_waiters`]) looks for
/// the next request before it sleeps: busy for the first quarter of [`SERVER_SPIN`], then
/// yielding its CPU between looks.
///
/// A program that computes between its calls (`git add` compresses each file between
/// reading it and writing its object) came back to a sleeping daemon thread at a third of
/// its calls after 60 µs. Waking that thread, and then being woken for the answer, cost
/// 130 µs a call on average on a VM whose idle vCPUs wake slowly (`git add` of 8,000 files:
/// 2.4 s of its 7.6 s in such calls; docs/BENCHMARKS.md). Looking for 2 ms, with yields,
/// catches most of them; a yielding thread gives its CPU to any other thread that wants it.
pub const SERVER_LONG_SPIN: Duration = Duration::from_millis(2);
/// Daemon threads waiting long ([`SERVER_LONG_SPIN`]) now, across the daemon's connections.
static LONG_WAITERS: AtomicU32 = AtomicU32::new(0);

/// How many of a daemon's threads may wait long at once on a machine with `cpus` CPUs: one
/// for every two CPUs (none with one CPU, where spinning only delays the program). With
/// every thread of four programs on two CPUs waiting long, `bench meta --procs 4`'s creates
/// were 18 % slower: the waiting threads took turns on the CPUs the programs needed.
pub fn long_waiters(cpus: i64) -> u32 {
    if cpus > 1 {
        (cpus / 2).clamp(1, i64::from(u32::MAX)) as u32
    } else {
        0
    }
}

/// One of the [`long_waiters`] places of a count of them, given back when dropped.
struct LongWait(&'static AtomicU32);

impl LongWait {
    /// Takes a place of `count` if fewer than `budget` are taken.
    fn take(count: &'static AtomicU32, budget: u32) -> Option<LongWait> {
        count
            .fetch_update(SeqCst, SeqCst, |n| (n < budget).then_some(n + 1))
            .ok()
            .map(|_| LongWait(count))
    }
}

impl Drop for LongWait {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}
/// How often a sleeping side looks whether the other has gone.
const NAP: Duration = Duration::from_millis(50);

const ASKED: u32 = 1;
const ANSWERED: u32 = 2;
const PICKED: u32 = 3;

/// What a wait on the channel ends with, other than its answer.
#[derive(Debug, thiserror::Error)]
pub enum ChanError {
    /// The other side's socket hung up.
    #[error("the other side of the io channel has gone")]
    Gone,
    /// No answer within [`CALL_LIMIT`].
    #[error("no answer from the mount's daemon within {0:?}")]
    Timeout(Duration),
    /// The slot could not be made or mapped.
    #[error("io channel: {0}")]
    Os(#[from] std::io::Error),
    /// The memfd received is not a slot.
    #[error("io channel: the shared slot is {0} bytes, not {SLOT_BYTES}")]
    Size(u64),
}

/// Which end of the channel this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The program's end.
    Client,
    /// The daemon's end.
    Server,
}

/// One mapped slot.
#[derive(Debug)]
pub struct Chan {
    map: *mut u8,
    spin: bool,
    /// How many daemon threads may wait long at once ([`long_waiters`]).
    long: u32,
}

// SAFETY: the mapping is process-wide memory owned by the Chan; every access goes through the
// atomics of the head or byte copies, never through references, so moving the Chan to
// another thread is sound.
unsafe impl Send for Chan {}

impl Chan {
    /// A new slot in a memfd (the daemon's side): the mapping and the descriptor to hand to
    /// the client.
    pub fn create() -> Result<(Chan, OwnedFd), ChanError> {
        let fd = memfd(c"tierstack-io", SLOT_BYTES, 0)?;
        let chan = Self::map(fd.as_fd())?;
        Ok((chan, fd))
    }

    /// Maps the slot in `fd` (the client's side), after checking its size.
    pub fn attach(fd: BorrowedFd<'_>) -> Result<Chan, ChanError> {
        Self::map(fd)
    }

    fn map(fd: BorrowedFd<'_>) -> Result<Chan, ChanError> {
        let p = map_shared(fd, SLOT_BYTES, libc::PROT_READ | libc::PROT_WRITE)?;
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        Ok(Chan {
            map: p,
            spin: cpus > 1,
            long: long_waiters(cpus as i64),
        })
    }

    fn word(&self, i: usize) -> &AtomicU32 {
        // SAFETY: the head's first words are u32 atomics at 4-byte offsets inside the
        // mapping, which is page-aligned and lives as long as `self`; atomics may be shared
        // with another process through a shared mapping.
        unsafe { &*(self.map.add(i * 4) as *const AtomicU32) }
    }

    fn state(&self) -> &AtomicU32 {
        self.word(0)
    }

    fn sleeps(&self, side: Side) -> &AtomicU32 {
        self.word(if side == Side::Server { 1 } else { 2 })
    }

    fn len(&self) -> &AtomicU32 {
        self.word(3)
    }

    /// Copies `bytes` into the buffer at `at`; false if they do not fit.
    pub fn put(&mut self, at: usize, bytes: &[u8]) -> bool {
        if at.checked_add(bytes.len()).is_none_or(|end| end > BUF) {
            return false;
        }
        // SAFETY: the range [HEAD + at, HEAD + at + len) lies inside the mapping (checked
        // above); no reference to it exists.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.add(HEAD + at), bytes.len())
        };
        true
    }

    /// Copies the buffer's bytes at `at` into `out`; false if they lie past its end.
    pub fn get(&self, at: usize, out: &mut [u8]) -> bool {
        if at.checked_add(out.len()).is_none_or(|end| end > BUF) {
            return false;
        }
        // SAFETY: as in `put`, the range is inside the mapping and unreferenced.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.add(HEAD + at), out.as_mut_ptr(), out.len())
        };
        true
    }

    /// The client: the request of `len` bytes now in the buffer is sent; returns the
    /// answer's length once it is there. `gone` says whether the daemon's socket hung up
    /// (asked only while sleeping).
    pub fn call(&mut self, len: usize, gone: &dyn Fn() -> bool) -> Result<usize, ChanError> {
        self.len().store(len as u32, SeqCst);
        self.state().store(ASKED, SeqCst);
        if self.sleeps(Side::Server).load(SeqCst) != 0 {
            futex_wake(self.state());
        }
        self.wait_answer(gone)?;
        Ok(self.len().load(SeqCst) as usize)
    }

    /// The client: waits for the state to turn `ANSWERED`, spinning only while a daemon
    /// thread runs the request (see the module's head), up to [`CALL_LIMIT`].
    fn wait_answer(&self, gone: &dyn Fn() -> bool) -> Result<(), ChanError> {
        let start = Instant::now();
        let mut i = 0u32;
        loop {
            let s = self.state().load(SeqCst);
            if s == ANSWERED {
                return Ok(());
            }
            if self.spin {
                i = i.wrapping_add(1);
                // The clock is read every 32 looks.
                if !i.is_multiple_of(32) {
                    std::hint::spin_loop();
                    continue;
                }
                let limit = if s == PICKED { CLIENT_SPIN } else { ASKED_SPIN };
                if start.elapsed() < limit {
                    std::hint::spin_loop();
                    continue;
                }
            }
            self.sleeps(Side::Client).store(1, SeqCst);
            if self.state().load(SeqCst) == s {
                futex_wait(self.state(), s, NAP);
            }
            self.sleeps(Side::Client).store(0, SeqCst);
            if self.state().load(SeqCst) == ANSWERED {
                return Ok(());
            }
            if gone() {
                return Err(ChanError::Gone);
            }
            if start.elapsed() > CALL_LIMIT {
                return Err(ChanError::Timeout(CALL_LIMIT));
            }
        }
    }

    /// The daemon: waits for the next request; its length. Ends with [`ChanError::Gone`]
    /// when `gone` says the client's socket hung up.
    pub fn next_request(&mut self, gone: &dyn Fn() -> bool) -> Result<usize, ChanError> {
        loop {
            let cur = self.state().load(SeqCst);
            if cur == ASKED {
                // The client's spin now pays (see the module's head). Only this thread
                // moves the state on from ASKED: a client cannot see it answered early.
                self.state().store(PICKED, SeqCst);
                return Ok((self.len().load(SeqCst) as usize).min(BUF));
            }
            // Waits while the state stays `cur` (idle, or our last answer not yet replaced):
            // long if a place is free, so that a program that computes between its calls
            // finds this thread awake.
            let long = LongWait::take(&LONG_WAITERS, self.long);
            let spin = if long.is_some() {
                SERVER_LONG_SPIN
            } else {
                SERVER_SPIN
            };
            self.wait_for(cur, Side::Server, spin, long, Duration::MAX, gone)?;
        }
    }

    /// The daemon: the answer of `len` bytes now in the buffer is ready.
    pub fn answer(&mut self, len: usize) {
        self.len().store(len as u32, SeqCst);
        self.state().store(ANSWERED, SeqCst);
        if self.sleeps(Side::Client).load(SeqCst) != 0 {
            futex_wake(self.state());
        }
    }

    /// Waits until the state is no longer `from`: spins up to `spin` (then gives back the
    /// long wait's place, `long`), then sleeps (saying so in `side`'s word) in naps, asking
    /// `gone` after each, up to `limit`.
    fn wait_for(
        &self,
        from: u32,
        side: Side,
        spin: Duration,
        long: Option<LongWait>,
        limit: Duration,
        gone: &dyn Fn() -> bool,
    ) -> Result<(), ChanError> {
        let start = Instant::now();
        if self.spin {
            // Busy for the first quarter of `SERVER_SPIN` (the other side is running on
            // another CPU: its answer is a few hundred ns away); then yielding between
            // looks, so that when the CPUs are all taken the other side can run here instead
            // of waiting for a time slice.
            let mut i = 0u32;
            while self.state().load(SeqCst) == from {
                std::hint::spin_loop();
                i = i.wrapping_add(1);
                if i.is_multiple_of(64) {
                    let t = start.elapsed();
                    if t > spin {
                        break;
                    }
                    if t > SERVER_SPIN.min(spin) / 4 {
                        std::thread::yield_now();
                    }
                }
            }
        }
        drop(long);
        loop {
            if self.state().load(SeqCst) != from {
                return Ok(());
            }
            self.sleeps(side).store(1, SeqCst);
            if self.state().load(SeqCst) == from {
                futex_wait(self.state(), from, NAP);
            }
            self.sleeps(side).store(0, SeqCst);
            if self.state().load(SeqCst) != from {
                return Ok(());
            }
            if gone() {
                return Err(ChanError::Gone);
            }
            if start.elapsed() > limit {
                return Err(ChanError::Timeout(limit));
            }
        }
    }
}

impl Drop for Chan {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of SLOT_BYTES, unmapped once; no reference into
        // it outlives `self`.
        unsafe { libc::munmap(self.map.cast(), SLOT_BYTES) };
    }
}

/// A new memfd of `bytes` bytes named `name` (`flags` added to `MFD_CLOEXEC`).
pub(crate) fn memfd(
    name: &std::ffi::CStr,
    bytes: usize,
    flags: libc::c_uint,
) -> Result<OwnedFd, ChanError> {
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor returned is ours.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | flags) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: `raw` is a descriptor just returned to us and owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), bytes as libc::off_t) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(fd)
}

/// A shared mapping of the whole of `fd`, which must be `bytes` long (checked), with
/// protection `prot`; the caller unmaps it.
pub(crate) fn map_shared<T>(
    fd: BorrowedFd<'_>,
    bytes: usize,
    prot: libc::c_int,
) -> Result<*mut T, ChanError> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into `st`, a live local.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if st.st_size as u64 != bytes as u64 {
        return Err(ChanError::Size(st.st_size as u64));
    }
    // SAFETY: a new shared mapping of `bytes` of `fd`, which is that long; the kernel picks
    // the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(p.cast())
}

/// Sleeps while `*w == val`, at most `timeout` (a shared futex: the word is in a mapping
/// shared between processes).
fn futex_wait(w: &AtomicU32, val: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the u32 at `w` (a live atomic) and the timespec (a live
    // local); the unused arguments are null/0.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAIT,
            val,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

/// Wakes the sleepers on `w`.
fn futex_wake(w: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on the address of a live atomic; the other arguments are unused.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn one_long_wait_for_every_two_cpus_none_on_one() {
        assert_eq!(long_waiters(1), 0);
        assert_eq!(long_waiters(2), 1);
        assert_eq!(long_waiters(3), 1);
        assert_eq!(long_waiters(16), 8);
        // Places are taken up to the budget and given back when dropped.
        static COUNT: AtomicU32 = AtomicU32::new(0);
        let a = LongWait::take(&COUNT, 2);
        let b = LongWait::take(&COUNT, 2);
        assert!(a.is_some() && b.is_some());
        assert!(LongWait::take(&COUNT, 2).is_none(), "over the budget");
        drop(a);
        assert!(
            LongWait::take(&COUNT, 2).is_some(),
            "a place given back is taken again"
        );
        drop(b);
        assert_eq!(COUNT.load(SeqCst), 0);
        assert!(LongWait::take(&COUNT, 0).is_none(), "one CPU: never");
    }

    #[test]
    fn a_request_and_its_answer_cross_between_two_mappings() {
        let (mut server, fd) = Chan::create().expect("slot");
        let mut client = Chan::attach(fd.as_fd()).expect("attach");
        let t = std::thread::spawn(move || {
            for _ in 0..1000 {
                let n = server.next_request(&|| false).expect("request");
                let mut b = vec![0u8; n];
                assert!(server.get(0, &mut b));
                b.reverse();
                assert!(server.put(0, &b));
                server.answer(n);
            }
        });
        for i in 0..1000u32 {
            let req = [i.to_le_bytes(), (i * 3).to_le_bytes()].concat();
            assert!(client.put(0, &req));
            let n = client.call(req.len(), &|| false).expect("answer");
            let mut got = vec![0u8; n];
            assert!(client.get(0, &mut got));
            let mut want = req.clone();
            want.reverse();
            assert_eq!(got, want);
        }
        t.join().expect("server");
    }

    #[test]
    fn a_picked_up_request_is_waited_for_until_its_answer() {
        let (mut server, fd) = Chan::create().expect("slot");
        let mut client = Chan::attach(fd.as_fd()).expect("attach");
        let t = std::thread::spawn(move || {
            for i in 0..20u8 {
                let n = server.next_request(&|| false).expect("request");
                assert_eq!(n, 1);
                // Picked up: a slow operation, longer than the client's spins.
                std::thread::sleep(Duration::from_micros(100 * u64::from(i % 4)));
                assert!(server.put(0, &[i, i]));
                server.answer(2);
            }
        });
        for i in 0..20u8 {
            assert!(client.put(0, &[i]));
            let n = client.call(1, &|| false).expect("answer");
            let mut got = [0u8; 2];
            assert_eq!(n, 2, "answered, not merely picked up");
            assert!(client.get(0, &mut got));
            assert_eq!(got, [i, i]);
        }
        t.join().expect("server");
    }

    #[test]
    fn a_client_whose_daemon_has_gone_gets_an_error_not_a_hang() {
        let (_server, fd) = Chan::create().expect("slot");
        let mut client = Chan::attach(fd.as_fd()).expect("attach");
        let t = Instant::now();
        let r = client.call(1, &|| t.elapsed() > Duration::from_millis(200));
        assert!(matches!(r, Err(ChanError::Gone)), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn copies_outside_the_buffer_are_refused() {
        let (mut c, _fd) = Chan::create().expect("slot");
        assert!(!c.put(BUF - 1, b"ab"));
        assert!(c.put(BUF - 2, b"ab"));
        let mut two = [0u8; 2];
        assert!(c.get(BUF - 2, &mut two));
        assert_eq!(&two, b"ab");
        assert!(!c.get(usize::MAX, &mut two));
    }

    #[test]
    fn a_memfd_of_another_size_is_not_attached() {
        // SAFETY: memfd_create with a NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a descriptor just returned to us.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        assert!(matches!(Chan::attach(fd.as_fd()), Err(ChanError::Size(0))));
    }
}
