//! systemd's readiness protocol (sd_notify(3)) for the mount daemon: `READY=1` once a mount is
//! served, `STOPPING=1` when its stop begins, `STATUS=` lines that `systemctl status` shows,
//! and `MAINPID=` when the process systemd started leaves the mount to the daemon it spawned
//! (`tierstack mount` without `--foreground`).
//!
//! A message is one datagram to the Unix socket named by `NOTIFY_SOCKET`: a path, or an
//! abstract socket written `@name`. Only the process systemd started speaks: systemd 248 and
//! later give it its own pid in `SYSTEMD_EXEC_PID`, and a process that finds another pid there
//! is a descendant that inherited the variable (a `tierstack mount` in slurmd's Prolog would
//! otherwise tell systemd that slurmd is ready, or that its main process is the mount daemon).
//! Without `SYSTEMD_EXEC_PID` (older systemd, a test's socket) the process speaks.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

/// The variable that names systemd's socket.
pub const SOCKET_VAR: &str = "NOTIFY_SOCKET";
/// The variable that holds the pid of the process systemd started.
pub const EXEC_PID_VAR: &str = "SYSTEMD_EXEC_PID";

/// Where systemd listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    /// A socket file.
    Path(PathBuf),
    /// An abstract socket: its name without the leading `@`.
    Abstract(Vec<u8>),
}

/// The address the process `pid` notifies, given the values of `NOTIFY_SOCKET` and
/// `SYSTEMD_EXEC_PID`: none when there is no socket, when the socket is not a Unix one
/// (`vsock:` of a virtual machine's manager), or when `SYSTEMD_EXEC_PID` names another process.
pub fn addr_for(socket: Option<&OsStr>, exec_pid: Option<&OsStr>, pid: u32) -> Option<Addr> {
    let s = socket?.as_bytes();
    if let Some(p) = exec_pid {
        if p.to_str().and_then(|p| p.trim().parse::<u32>().ok()) != Some(pid) {
            return None;
        }
    }
    match s {
        [b'/', ..] => Some(Addr::Path(PathBuf::from(OsStr::from_bytes(s)))),
        [b'@', name @ ..] if !name.is_empty() => Some(Addr::Abstract(name.to_vec())),
        _ => None,
    }
}

/// The address this process notifies (from its environment), if any.
pub fn addr() -> Option<Addr> {
    addr_for(
        std::env::var_os(SOCKET_VAR).as_deref(),
        std::env::var_os(EXEC_PID_VAR).as_deref(),
        std::process::id(),
    )
}

/// Sends `state` (newline-separated `KEY=value` lines) to `addr` in one datagram.
pub fn send_to(addr: &Addr, state: &str) -> io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    let sent = match addr {
        Addr::Path(p) => sock.send_to(state.as_bytes(), p)?,
        Addr::Abstract(name) => {
            use std::os::linux::net::SocketAddrExt;
            let a = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &a)?
        }
    };
    if sent != state.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("sent {sent} of {} bytes", state.len()),
        ));
    }
    Ok(())
}

/// Sends `state` where this process's environment says; `Ok(false)` when it says nowhere.
pub fn notify(state: &str) -> io::Result<bool> {
    match addr() {
        Some(a) => send_to(&a, state).map(|()| true),
        None => Ok(false),
    }
}

/// [`notify`], a failure logged as a warning: a lost message never stops the mount (systemd
/// then times the start out and says so).
pub fn notify_logged(state: &str) -> bool {
    match notify(state) {
        Ok(sent) => sent,
        Err(e) => {
            tracing::warn!(
                "cannot notify systemd ({}={:?}): {e}",
                SOCKET_VAR,
                std::env::var_os(SOCKET_VAR).unwrap_or_default()
            );
            false
        }
    }
}

/// One `STATUS=` value: a single line (systemd shows one).
pub fn status_line(s: &str) -> String {
    s.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn os(s: &str) -> Option<&OsStr> {
        Some(OsStr::new(s))
    }

    #[test]
    fn the_address_comes_from_notify_socket_for_the_process_systemd_started() {
        assert_eq!(addr_for(None, None, 7), None);
        assert_eq!(
            addr_for(os("/run/systemd/notify"), None, 7),
            Some(Addr::Path("/run/systemd/notify".into()))
        );
        assert_eq!(
            addr_for(os("@/org/x/notify"), os("7"), 7),
            Some(Addr::Abstract(b"/org/x/notify".to_vec()))
        );
        // A descendant of the started process (a hook of another service) stays silent.
        assert_eq!(addr_for(os("/run/systemd/notify"), os("8"), 7), None);
        assert_eq!(addr_for(os("/run/systemd/notify"), os("x"), 7), None);
        // Not a Unix socket, or nothing after the @.
        assert_eq!(addr_for(os("vsock:2:1234"), None, 7), None);
        assert_eq!(addr_for(os("@"), None, 7), None);
        assert_eq!(addr_for(os(""), None, 7), None);
    }

    fn received(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).expect("a datagram");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn a_message_reaches_a_path_socket_and_an_abstract_one() {
        let t = tempfile::tempdir().expect("tmp");
        let p = t.path().join("notify");
        let sock = UnixDatagram::bind(&p).expect("bind");
        send_to(&Addr::Path(p), "READY=1\nSTATUS=serving").expect("send");
        assert_eq!(received(&sock), "READY=1\nSTATUS=serving");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("tierstack-notify-test-{}", std::process::id());
        let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .expect("abstract name");
        let sock = UnixDatagram::bind_addr(&a).expect("bind abstract");
        send_to(&Addr::Abstract(name.into_bytes()), "STOPPING=1").expect("send");
        assert_eq!(received(&sock), "STOPPING=1");
    }

    #[test]
    fn a_socket_nobody_listens_on_is_an_error() {
        let t = tempfile::tempdir().expect("tmp");
        assert!(send_to(&Addr::Path(t.path().join("none")), "READY=1").is_err());
    }
}
