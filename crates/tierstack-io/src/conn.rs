//! The mounts this process reaches through the client and its connection to each.
//!
//! `TIERSTACK_IO` names the mounts and their io sockets (`MOUNTPOINT=SOCKET`, `:`-separated).
//! A process connects to a mount at its first call under it (a process that never touches
//! the mount costs the daemon nothing): the daemon answers with the mountpoint it serves
//! (which must be the one named) and the shared slot. A forked child connects again at its
//! first call (the parent's slot is the parent's); a mount whose daemon has gone is marked
//! dead and its calls go through the kernel. A dead mount is tried again at most once a
//! second ([`RETRY_MS`]): a daemon mounted again at the same place (after a crash, a
//! restart) serves the process again. Each connection has an epoch; a handle opened under an
//! earlier one belongs to a daemon that has gone, and its calls fail with EIO (as a FUSE
//! descriptor of a dead mount does) instead of naming another file's handle.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use parking_lot::Mutex;
use tierstack_ioproto::msg::{MAX_DEPS, REP_HEAD};
use tierstack_ioproto::{Chan, Rep, Req, Versions, WireAttr};

use tierstack_ioproto::cache::{Cache, Kept};

/// The variable that names the io sockets.
pub const ENV: &str = "TIERSTACK_IO";

/// One mount served by the client.
pub struct Mount {
    /// Its mountpoint, canonical, without a trailing `/`.
    pub root: Vec<u8>,
    sock: Vec<u8>,
    conn: Mutex<Option<Conn>>,
    /// When the mount was last found dead (ms on the monotonic clock, 0: alive).
    dead_at: AtomicU64,
    /// The connection's epoch: raised at every connection made (see [`Mount::epoch`]).
    epoch: AtomicU32,
    dev: Mutex<Option<u64>>,
}

/// How long a dead mount is left alone before the next call tries to connect again.
pub const RETRY_MS: u64 = 1000;

/// The monotonic clock in ms (never 0).
fn now_ms() -> u64 {
    // SAFETY: an all-zero timespec is valid for clock_gettime to fill.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime writes one timespec, a live local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000).max(1)
}

struct Conn {
    chan: Chan,
    sock: OwnedFd,
    scratch: Vec<u8>,
    /// The mount's change counters (None: an older daemon sent none; nothing is kept).
    vers: Option<Versions>,
    /// What is kept of the daemon's answers (see [`tierstack_ioproto::cache`]).
    cache: Cache,
    /// When the daemon was last seen alive by a cached answer (ms, monotonic).
    seen_ms: u64,
}

/// How long answers are served from the cache before the daemon's socket is looked at
/// again: a daemon that has gone (its mount dead, or mounted again with a new table) is
/// noticed within this.
const ALIVE_MS: u64 = 50;

/// What a call came back with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Got {
    /// Done.
    Done,
    /// An errno.
    Err(i32),
    /// Attributes.
    Attr(WireAttr),
    /// A handle.
    Opened(u64, WireAttr),
    /// This many bytes read into the caller's buffer.
    Read(usize),
    /// Bytes written and the offset after them.
    Written(u32, u64),
}

/// Why a call is to be made through the kernel instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// The daemon leaves it to the kernel.
    Fallback,
    /// No connection (the daemon has gone or never answered).
    Dead,
}

static MOUNTS: OnceLock<Vec<Mount>> = OnceLock::new();
/// The process's umask as the client last saw it set (read once at start).
pub static UMASK: AtomicU32 = AtomicU32::new(0o022);

/// The mounts of `TIERSTACK_IO` that answered (made at the first call).
pub fn mounts() -> &'static [Mount] {
    MOUNTS.get_or_init(|| {
        // SAFETY: umask has no preconditions; the value is put back at once.
        let m = unsafe { libc::umask(0o022) };
        // SAFETY: as above.
        unsafe { libc::umask(m) };
        UMASK.store(m, Relaxed);
        let list = std::env::var_os(ENV).unwrap_or_default();
        let mut out = Vec::new();
        use std::os::unix::ffi::OsStrExt;
        for entry in list.as_bytes().split(|&b| b == b':') {
            let Some(eq) = entry.iter().rposition(|&b| b == b'=') else {
                continue;
            };
            let (mut root, sock) = (entry[..eq].to_vec(), &entry[eq + 1..]);
            while root.len() > 1 && root.last() == Some(&b'/') {
                root.pop();
            }
            if root.first() != Some(&b'/') || sock.is_empty() {
                continue;
            }
            out.push(Mount {
                root,
                sock: sock.to_vec(),
                conn: Mutex::new(None),
                dead_at: AtomicU64::new(0),
                epoch: AtomicU32::new(0),
                dev: Mutex::new(None),
            });
        }
        // SAFETY: the handlers are plain functions of this library; registering them has
        // no other precondition.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_parent),
                Some(after_fork_child),
            )
        };
        out
    })
}

/// An `O_PATH | O_CLOEXEC` descriptor of `path`.
fn open_path(path: &[u8]) -> Option<RawFd> {
    let c = std::ffi::CString::new(path).ok()?;
    let open =
        crate::real!(open: fn(*const libc::c_char, libc::c_int, libc::c_uint) -> libc::c_int);
    // SAFETY: open of a NUL-terminated path.
    let fd = unsafe {
        open(
            c.as_ptr(),
            libc::O_PATH | libc::O_CLOEXEC | libc::O_DIRECTORY,
            0,
        )
    };
    (fd >= 0).then_some(fd)
}

/// Connects to the io socket at `sock`: the mountpoint it serves and the connection.
fn connect(sock: &[u8]) -> Option<(Vec<u8>, Conn)> {
    // SAFETY: socket() has no memory preconditions.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return None;
    }
    // SAFETY: `raw` was just returned to us.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an all-zero sockaddr_un is valid (family set below).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if sock.len() >= addr.sun_path.len() {
        return None;
    }
    for (d, s) in addr.sun_path.iter_mut().zip(sock) {
        *d = *s as libc::c_char;
    }
    // SAFETY: connect reads `addr`, a live local of the size given.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return None;
    }
    let (root, memfd, versfd) = recv_hello(fd.as_fd())?;
    let chan = Chan::attach(memfd.as_fd()).ok()?;
    let vers = versfd.and_then(|v| Versions::attach(v.as_fd()).ok());
    Some((
        root,
        Conn {
            chan,
            sock: fd,
            scratch: Vec::with_capacity(4096),
            vers,
            cache: Cache::default(),
            seen_ms: now_ms(),
        },
    ))
}

/// The daemon's hello: the mountpoint, with the slot's memfd attached and, from a daemon
/// that keeps them, its change counters'. Bounded by a 5 s receive timeout.
fn recv_hello(fd: std::os::fd::BorrowedFd<'_>) -> Option<(Vec<u8>, OwnedFd, Option<OwnedFd>)> {
    let tv = libc::timeval {
        tv_sec: 5,
        tv_usec: 0,
    };
    // SAFETY: setsockopt reads a timeval, a live local.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let mut buf = vec![0u8; 4096];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid; it is filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: recvmsg writes into `buf` and `cbuf` through `msg`, all live locals.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n <= 0 {
        return None;
    }
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR reads its control fields.
    let c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    if c.is_null() {
        return None;
    }
    // SAFETY: `c` points into `cbuf`, a header recvmsg wrote.
    let (level, kind) = unsafe { ((*c).cmsg_level, (*c).cmsg_type) };
    if level != libc::SOL_SOCKET || kind != libc::SCM_RIGHTS {
        return None;
    }
    // SAFETY: `c` points into `cbuf`, a header recvmsg wrote.
    let len = unsafe { (*c).cmsg_len } as usize;
    // SAFETY: CMSG_LEN is pure arithmetic.
    let ints = len.saturating_sub(unsafe { libc::CMSG_LEN(0) } as usize) / 4;
    let mut fds = Vec::new();
    for i in 0..ints.min(2) {
        // SAFETY: an SCM_RIGHTS message of `len` bytes carries `ints` ints after its header.
        let raw = unsafe { std::ptr::read_unaligned((libc::CMSG_DATA(c) as *const i32).add(i)) };
        // SAFETY: the kernel installed `raw` in this process for us.
        fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
    }
    let mut fds = fds.into_iter();
    let memfd = fds.next()?;
    let versfd = fds.next();
    buf.truncate(n as usize);
    while buf.last() == Some(&b'/') && buf.len() > 1 {
        buf.pop();
    }
    Some((buf, memfd, versfd))
}

/// Keeps what `rep`, the answer to `req`, says with counts (see [`tierstack_ioproto::cache`]).
fn keep(cache: &mut Cache, req: &Req<'_>, rep: &Rep<'_>, now_ms: u64) {
    match (req, rep) {
        (Req::Stat { base, path, .. }, Rep::Known { attr, deps })
        | (Req::Open { base, path, .. }, Rep::Opened { attr, deps, .. }) => {
            cache.keep_attr(*base, path, attr, deps)
        }
        (Req::Stat { base, path, .. }, Rep::Absent { deps, ttl_ms }) => {
            cache.keep_absent(*base, path, deps, *ttl_ms, now_ms)
        }
        (Req::Close { .. } | Req::Fstat { .. }, Rep::Known { attr, deps }) => {
            cache.keep_node_deps(attr, deps)
        }
        _ => {}
    }
}

/// Closes a descriptor this library opened (nothing for -1).
fn close_raw(fd: RawFd) {
    if fd >= 0 {
        // SAFETY: the C library's close of a descriptor this library opened and owns.
        unsafe { crate::real!(close: fn(libc::c_int) -> libc::c_int)(fd) };
    }
}

/// Whether the peer of `fd` hung up (a look, never a wait).
fn hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: poll of one pollfd, a live local, without waiting.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0
}

impl Mount {
    /// Makes `req` (with `data` after its head for a write), reading a data answer into
    /// `into`.
    pub fn call(&self, req: &Req<'_>, data: &[u8], into: &mut [u8]) -> Result<Got, Miss> {
        self.call_in(None, req, data, into)
    }

    /// As [`Mount::call`], for a handle opened under connection `epoch`: a handle of a
    /// daemon that has gone gets EIO (its number may name another file in the new daemon).
    pub fn call_on(
        &self,
        epoch: u32,
        req: &Req<'_>,
        data: &[u8],
        into: &mut [u8],
    ) -> Result<Got, Miss> {
        self.call_in(Some(epoch), req, data, into)
    }

    /// The epoch of the current connection (the one a handle opened now belongs to).
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Relaxed)
    }

    fn mark_dead(&self) {
        self.dead_at.store(now_ms(), Relaxed);
    }

    fn call_in(
        &self,
        epoch: Option<u32>,
        req: &Req<'_>,
        data: &[u8],
        into: &mut [u8],
    ) -> Result<Got, Miss> {
        let dead = self.dead_at.load(Relaxed);
        if dead != 0 && now_ms().saturating_sub(dead) < RETRY_MS {
            return match epoch {
                Some(_) => Ok(Got::Err(libc::EIO)),
                None => Err(Miss::Dead),
            };
        }
        let mut guard = self.conn.lock();
        if guard.is_none() {
            if self.dead_at.load(Relaxed) != 0 {
                // A daemon mounted here again is another mount: its root, its device.
                self.reopen_root();
            }
            let root_fd = self.open_root();
            let reachable = root_fd >= 0;
            close_raw(root_fd);
            match connect(&self.sock) {
                Some((root, c)) if root == self.root && reachable => {
                    *guard = Some(c);
                    self.epoch.fetch_add(1, Relaxed);
                    self.dead_at.store(0, Relaxed);
                }
                _ => {
                    self.mark_dead();
                    return match epoch {
                        Some(_) => Ok(Got::Err(libc::EIO)),
                        None => Err(Miss::Dead),
                    };
                }
            }
        }
        if epoch.is_some_and(|e| e != self.epoch.load(Relaxed)) {
            return Ok(Got::Err(libc::EIO));
        }
        let Some(c) = guard.as_mut() else {
            return Err(Miss::Dead);
        };
        req.encode(&mut c.scratch);
        let ok = c.chan.put(0, &c.scratch) && c.chan.put(c.scratch.len(), data);
        if !ok {
            return Err(Miss::Fallback);
        }
        let sock = c.sock.as_raw_fd();
        let len = c.scratch.len() + data.len();
        match c.chan.call(len, &|| hung_up(sock)) {
            Ok(_) => {}
            Err(tierstack_ioproto::ChanError::Timeout(_)) => {
                // Its answer may still come: this connection is not to be used again.
                *guard = None;
                self.mark_dead();
                return Ok(Got::Err(libc::EIO));
            }
            Err(_) => {
                *guard = None;
                self.mark_dead();
                return match epoch {
                    Some(_) => Ok(Got::Err(libc::EIO)),
                    None => Err(Miss::Dead),
                };
            }
        }
        let mut head = [0u8; REP_HEAD + MAX_DEPS * 12];
        if !c.chan.get(0, &mut head[..REP_HEAD]) {
            return Ok(Got::Err(libc::EIO));
        }
        if let Some(n) = Rep::data_len(&head) {
            let n = n.min(into.len());
            if !c.chan.get(REP_HEAD, &mut into[..n]) {
                return Ok(Got::Err(libc::EIO));
            }
            return Ok(Got::Read(n));
        }
        let more = Rep::deps_len(&head).min(head.len() - REP_HEAD);
        if !c.chan.get(REP_HEAD, &mut head[REP_HEAD..REP_HEAD + more]) {
            return Ok(Got::Err(libc::EIO));
        }
        let rep = Rep::decode(&head[..REP_HEAD + more]);
        if let (Some(rep), Some(_)) = (&rep, &c.vers) {
            c.seen_ms = now_ms();
            keep(&mut c.cache, req, rep, c.seen_ms);
        }
        Ok(match rep {
            Some(Rep::Done) => Got::Done,
            Some(Rep::Err(e)) => Got::Err(e),
            Some(Rep::Fallback) => return Err(Miss::Fallback),
            Some(Rep::Attr(a)) => Got::Attr(a),
            Some(Rep::Known { attr, .. }) => match req {
                Req::Close { .. } => Got::Done,
                _ => Got::Attr(attr),
            },
            Some(Rep::Absent { .. }) => Got::Err(libc::ENOENT),
            Some(Rep::Opened { fh, attr, .. }) => Got::Opened(fh, attr),
            Some(Rep::Written { n, end }) => Got::Written(n, end),
            Some(Rep::Data(_)) | None => Got::Err(libc::EIO),
        })
    }

    /// The attributes of `path` from node `base` (or ENOENT) as kept from an earlier
    /// answer and still true (see [`tierstack_ioproto::cache`]); None: the daemon is to be asked.
    pub fn kept_path(&self, base: u64, path: &[u8], follow: bool) -> Option<Result<WireAttr, i32>> {
        let mut guard = self.conn.lock();
        let c = self.alive(&mut guard)?;
        match c
            .cache
            .path(c.vers.as_ref()?, base, path, follow, now_ms())?
        {
            Kept::Attr(a) => Some(Ok(a)),
            Kept::Absent => Some(Err(libc::ENOENT)),
        }
    }

    /// The attributes of node `ino`, opened under connection `epoch`, as kept and still
    /// true; None: the daemon is to be asked.
    pub fn kept_node(&self, epoch: u32, ino: u64) -> Option<WireAttr> {
        let mut guard = self.conn.lock();
        if epoch != self.epoch.load(Relaxed) {
            return None;
        }
        let c = self.alive(&mut guard)?;
        c.cache.node(c.vers.as_ref()?, ino)
    }

    /// The connection, if its daemon is still there: looked at (a poll of its socket) at
    /// most every [`ALIVE_MS`]; a connection whose daemon has gone is dropped with what it
    /// kept.
    fn alive<'g>(&self, guard: &'g mut Option<Conn>) -> Option<&'g mut Conn> {
        let now = now_ms();
        let c = guard.as_mut()?;
        if now.saturating_sub(c.seen_ms) < ALIVE_MS {
            return guard.as_mut();
        }
        if hung_up(c.sock.as_raw_fd()) {
            let old = guard.take();
            crate::outside(|| {
                drop(old);
                Some(())
            });
            self.mark_dead();
            return None;
        }
        let c = guard.as_mut()?;
        c.seen_ms = now;
        Some(c)
    }

    /// The mount's device number (`st_dev` of its root), once connected.
    pub fn dev(&self) -> Option<u64> {
        if let Some(d) = *self.dev.lock() {
            return Some(d);
        }
        let fd = self.open_root();
        if fd < 0 {
            return None;
        }
        // SAFETY: an all-zero stat is valid for fstat to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let fstat = crate::real!(fstat: fn(libc::c_int, *mut libc::stat) -> libc::c_int);
        // SAFETY: fstat of the O_PATH descriptor just opened, into a live local.
        let rc = unsafe { fstat(fd, &mut st) };
        close_raw(fd);
        if rc != 0 {
            return None;
        }
        *self.dev.lock() = Some(st.st_dev);
        Some(st.st_dev)
    }

    /// A new `O_PATH | O_CLOEXEC` descriptor of the mountpoint, the caller's to close (-1
    /// if it cannot be opened). A virtual descriptor is one: `umount` sees the mount busy
    /// while the program holds a file open, and only then (the client keeps no descriptor
    /// of its own on the mount).
    pub fn open_root(&self) -> RawFd {
        open_path(&self.root).unwrap_or(-1)
    }

    /// Forgets the mount's device (the mount it named has gone).
    fn reopen_root(&self) {
        *self.dev.lock() = None;
    }

    /// Holds this mount's connection across a fork (see `before_fork`).
    fn lock_for_fork(&self) {
        std::mem::forget(self.conn.lock());
    }
}

/// What runs first before a fork (set once by the interposed functions: the promotion of
/// every virtual descriptor, so the child inherits real ones).
static BEFORE_FORK: OnceLock<fn()> = OnceLock::new();

/// Sets what runs first before a fork (once; later calls change nothing).
pub fn on_fork(f: fn()) {
    let _ = BEFORE_FORK.set(f);
}

/// `pthread_atfork`'s prepare handler: the hook of [`on_fork`], then every connection held
/// so that none is in use across the fork.
extern "C" fn before_fork() {
    if let Some(f) = BEFORE_FORK.get() {
        f();
    }
    for m in MOUNTS.get().map(|v| v.as_slice()).unwrap_or(&[]) {
        m.lock_for_fork();
    }
}

/// The process's credentials changed (`setuid` and the like): the daemon checks a caller's
/// credentials at the connect, so every connection is made again at its next call.
pub fn credentials_changed() {
    for m in MOUNTS.get().map(|v| v.as_slice()).unwrap_or(&[]) {
        let old = m.conn.lock().take();
        crate::outside(|| {
            drop(old);
            Some(())
        });
    }
}

extern "C" fn after_fork_parent() {
    for m in MOUNTS.get().map(|v| v.as_slice()).unwrap_or(&[]) {
        // SAFETY: `before_fork` locked every connection in this thread and forgot the guard.
        unsafe { m.conn.force_unlock() };
    }
}

extern "C" fn after_fork_child() {
    for m in MOUNTS.get().map(|v| v.as_slice()).unwrap_or(&[]) {
        // SAFETY: as in the parent: the lock was taken by `before_fork` in this thread.
        unsafe { m.conn.force_unlock() };
        // The parent's slot and socket are the parent's: the child connects anew. Dropping
        // the copies unmaps the slot and closes the child's copy of the socket (the
        // parent's stays open).
        let old = m.conn.lock().take();
        crate::outside(|| {
            drop(old);
            Some(())
        });
    }
}
