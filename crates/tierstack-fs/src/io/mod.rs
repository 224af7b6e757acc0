//! The interception client's channel into the mount (`libtierstack_io.so`, crate
//! `tierstack-io`): a Unix socket beside the control socket (`<hash>.io`, see
//! [`io_socket_path`]), one thread per connected process serving its calls from a shared-memory
//! slot ([`tierstack_ioproto::Chan`]) through [`serve`], with no FUSE round trip.
//!
//! A connection is accepted from the mount's owner and root only (`SO_PEERCRED`; the socket
//! file is the owner's, mode 0600 unless the mount is shared). The caller's credentials are
//! those of the connect, never what a request says. The daemon answers with a hello (the
//! mountpoint it serves, so the client knows which paths are its), the slot's memfd and the
//! mount's change counters (`tierstack_ioproto::vers`, read-only for the client: what lets
//! it answer `stat` itself while nothing changed).
//! When the process goes (its socket hangs up: exit, `kill -9`, `exec`), every handle it
//! still held open is released, as the kernel would at its exit.

mod serve;

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::Notifier;
use tierstack_ioproto::{msg, Chan, Rep, Req};

use crate::fuse::{Caller, Op, TierFs};
use serve::{Handle, Server};

/// The interception client's socket of a mount whose control socket is `control`: the same
/// name with `.io2` for `.sock` (not `*.sock`: `top`, the exporter and `buffers` look for
/// control sockets by that extension). The `2` is the channel's version
/// ([`tierstack_ioproto::chan`]'s `PICKED` state came with it): a client library of
/// another version, still loaded in a job's tasks across an upgrade, names a socket that
/// no daemon of this version listens on, finds none, and goes through FUSE instead of
/// misreading the channel.
pub fn io_socket_path(control: &Path) -> PathBuf {
    control.with_extension("io2")
}

/// The listening channel of a mount.
pub struct IoServer {
    path: PathBuf,
    gate: Gate,
    _accept: JoinHandle<()>,
}

/// Closed once the daemon stops: each request is served holding it open (read), and
/// [`IoServer::close`] waits for those in flight (write), so nothing the client writes
/// lands after the stop made the mount durable; later requests are answered
/// [`Rep::Fallback`] (the kernel's path, which a stopping mount answers as it does).
type Gate = std::sync::Arc<parking_lot::RwLock<bool>>;

impl IoServer {
    /// Listens at `path` for clients of the mount at `mountpoint`, served by `fs` (its
    /// kernel entries invalidated through `notifier`); connections are accepted from `owner`
    /// and root. The socket is made only for the owner (and `chown`ed to them when the
    /// daemon runs as root for another user), or for everyone when `shared`.
    pub fn start(
        path: &Path,
        mountpoint: &Path,
        fs: TierFs,
        notifier: Notifier,
        owner: u32,
        shared: bool,
    ) -> io::Result<IoServer> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            path,
            std::fs::Permissions::from_mode(if shared { 0o666 } else { 0o600 }),
        )?;
        if rustix::process::geteuid().as_raw() != owner {
            std::os::unix::fs::chown(path, Some(owner), None)?;
        }
        let mut iofs = fs;
        // The client's handles never go through the kernel's page cache (see `refresh`).
        iofs.direct_writes = false;
        let mp = mountpoint.as_os_str().as_bytes().to_vec();
        let gate = Gate::default();
        let g = gate.clone();
        let accept = std::thread::Builder::new()
            .name("io-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Ok(conn) = conn else { continue };
                    if iofs.core.stopping() {
                        break;
                    }
                    let (fs, n, mp, g) = (iofs.clone(), notifier.clone(), mp.clone(), g.clone());
                    let _ = std::thread::Builder::new()
                        .name("io-client".into())
                        .spawn(move || {
                            if let Err(e) = connection(conn, &fs, &n, &mp, owner, &g) {
                                tracing::debug!("io client: {e}");
                            }
                        });
                }
            })?;
        Ok(IoServer {
            path: path.to_path_buf(),
            gate,
            _accept: accept,
        })
    }

    /// Stops serving: waits for the requests in flight; every later one is answered
    /// [`Rep::Fallback`]. The socket file is removed.
    pub fn close(&self) {
        *self.gate.write() = true;
        let _ = std::fs::remove_file(&self.path);
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for IoServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The peer's uid and gid (`SO_PEERCRED`).
pub(crate) fn peer(s: &UnixStream) -> io::Result<(u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a live local, and `len`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.uid, cred.gid))
}

/// Sends `bytes` with descriptors `fds` (one or two) attached (`SCM_RIGHTS`).
fn send_with_fds(s: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let fds = &fds[..fds.len().min(2)];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // Room for one control message of two descriptors, aligned as cmsghdr wants.
    let mut cbuf = [0u64; 8];
    let data_len = (fds.len() * 4) as u32;
    // SAFETY: an all-zero msghdr is a valid empty header, filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is pure arithmetic.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(data_len) } as _;
    // SAFETY: `msg` points at `cbuf`, large enough for one cmsghdr with 8 bytes of data
    // (CMSG_SPACE(8) <= 64), so CMSG_FIRSTHDR is non-null and its data has room for two
    // ints.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(data_len) as _;
        let at = libc::CMSG_DATA(c) as *mut i32;
        for (i, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(at.add(i), fd.as_raw_fd());
        }
    }
    // SAFETY: `msg` and everything it points at live for the call.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the peer of `s` has hung up (a look, never a wait).
fn hung_up(s: &UnixStream) -> bool {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: poll reads and writes one pollfd, a live local, and does not wait (timeout 0).
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// Serves one client process until it goes.
fn connection(
    s: UnixStream,
    fs: &TierFs,
    notifier: &Notifier,
    mountpoint: &[u8],
    owner: u32,
    gate: &Gate,
) -> io::Result<()> {
    let (uid, gid) = peer(&s)?;
    if uid != owner && uid != 0 {
        return Err(io::Error::other(format!(
            "io client of uid {uid} refused: only the mount's owner ({owner}) and root"
        )));
    }
    let (mut chan, memfd) = Chan::create().map_err(io::Error::other)?;
    // The slot, then the change counters (read-only for the client) where there are some.
    let mut fds = vec![memfd.as_fd()];
    fds.extend(fs.core.versions_fd());
    send_with_fds(&s, mountpoint, &fds)?;
    drop(memfd);
    s.set_read_timeout(Some(Duration::from_millis(1)))?;
    let server = Server {
        fs,
        // A diagnostic switch for measurements only (the kernel view goes stale without).
        notifier: std::env::var_os("TIERSTACK_IO_NO_INVAL")
            .is_none()
            .then_some(notifier),
        caller: Caller { uid, gid },
    };
    let mut open: HashMap<(u64, u64), u32> = HashMap::new();
    fs.core.io_client(true);
    // Counted in batches: one shared atomic add per call would be a cache line the clients'
    // threads fight over.
    let mut calls = 0u64;
    let mut req = Vec::new();
    let mut data = Vec::new();
    let mut out = vec![0u8; msg::REP_HEAD + tierstack_ioproto::chan::MAX_DATA];
    let gone = || hung_up(&s) || fs.core.stop_forced();
    while let Ok(n) = chan.next_request(&gone) {
        req.resize(n, 0);
        if !chan.get(0, &mut req) {
            break;
        }
        let open_gate = gate.read();
        let (rep, handle) = match Req::decode(&req) {
            _ if *open_gate => (Rep::Fallback, Handle::None),
            Some(r) => server.serve(r, &mut data),
            None => (Rep::Err(libc::EINVAL), Handle::None),
        };
        match handle {
            Handle::Opened(ino, fh) => *open.entry((ino, fh)).or_default() += 1,
            Handle::Closed(ino, fh) => {
                if let Some(c) = open.get_mut(&(ino, fh)) {
                    *c -= 1;
                    if *c == 0 {
                        open.remove(&(ino, fh));
                    }
                }
            }
            Handle::None => {}
        }
        let len = rep
            .encode_into(&mut out)
            .or_else(|| Rep::Err(libc::EIO).encode_into(&mut out))
            .unwrap_or(0);
        if !chan.put(0, &out[..len]) {
            break;
        }
        // A handle that may have written is released before the answer: its release (the
        // inode row, the drain's queue) takes microseconds, and a program that closes a file
        // it wrote usually asks again at once (the next create of a tar or a checkpoint). Its
        // next request would then wait for this thread to finish the release, after the
        // client had gone to sleep (it sleeps once its request waits more than a microsecond
        // to be picked up), and each wake-up of a sleeping client costs tens of microseconds
        // on a VM whose idle vCPUs halt. Released first, the close's answer comes those
        // microseconds later, while the client spins for it (its request is picked up), and
        // the next request finds this thread waiting for it (docs/BENCHMARKS.md, thirtieth
        // session: creates under the client 1.6-2.7x there).
        // A read-only handle's release is next to nothing: it stays after the answer.
        let release = match handle {
            Handle::Closed(ino, fh) => {
                Some((ino, fh, crate::refresh::may_write(fuser::FileHandle(fh))))
            }
            _ => None,
        };
        if let Some((ino, fh, true)) = release {
            server.release(ino, fh);
        }
        chan.answer(len);
        if let Some((ino, fh, false)) = release {
            server.release(ino, fh);
        }
        drop(open_gate);
        calls += 1;
        if calls == 256 {
            fs.core.add_io_calls(calls);
            calls = 0;
        }
    }
    fs.core.add_io_calls(calls);
    fs.core.io_client(false);
    // The process has gone: what it held open is closed, as its exit would (unless the
    // mount has stopped: then nothing is written any more).
    let open_gate = gate.read();
    if *open_gate {
        return Ok(());
    }
    for ((ino, fh), count) in open {
        for _ in 0..count {
            let (_, then) = fs.answer(Op::Release { ino, fh }, Caller { uid, gid });
            fs.after_reply(then);
        }
    }
    Ok(())
}
