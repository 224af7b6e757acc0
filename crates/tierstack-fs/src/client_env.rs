//! How a process is put under the interception client (`tierstack exec`, SLURM's TaskProlog):
//! the io socket a live mount serves ([`client_socket`]) and the environment that preloads
//! the client for it ([`client_env`]).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::error::{FsError, Result};
use crate::mount::{canonical_mountpoint, daemon_listens, socket_path};

use crate::io::io_socket_path;

/// The variable that preloads the client.
pub const PRELOAD_VAR: &str = "LD_PRELOAD";

/// The variable that lists the mounts and their io sockets (`MOUNTPOINT=SOCKET`,
/// `:`-separated), read by the client.
pub const IO_VAR: &str = "TIERSTACK_IO";

/// The canonical mountpoint of the tierstack mount at `mount` and the io socket its daemon
/// serves, checked to be live (the socket is there and a daemon listens on the mount's control
/// socket). The error is a sentence naming the problem and the fix.
pub fn client_socket(mount: &Path) -> Result<(PathBuf, PathBuf)> {
    if !mount.is_dir() {
        return Err(FsError::Config(format!(
            "{} is not a folder: give the mountpoint of a tierstack mount",
            mount.display()
        )));
    }
    let mp = canonical_mountpoint(mount)?;
    let sock = io_socket_path(&socket_path(&mp));
    let is_socket = std::fs::metadata(&sock).is_ok_and(|m| m.file_type().is_socket());
    if !is_socket || !daemon_listens(&mp) {
        return Err(FsError::Config(format!(
            "no tierstack mount at {} serves io clients (no {}, or its daemon is gone): mount it with `tierstack mount`, or see `tierstack status {}`",
            mp.display(),
            sock.display(),
            mp.display()
        )));
    }
    Ok((mp, sock))
}

/// The client's entry for the mount at `mp` served at `sock` (`MOUNTPOINT=SOCKET`).
fn io_entry(mp: &Path, sock: &Path) -> OsString {
    let mut e = mp.as_os_str().to_os_string();
    e.push("=");
    e.push(sock);
    e
}

/// `value` with `first` put before it, `:`-separated; `value` as it is when it already holds
/// `first` as one of its entries (`LD_PRELOAD` also splits at blanks).
fn prepend(first: &OsStr, value: Option<&OsStr>) -> OsString {
    let Some(v) = value.filter(|v| !v.is_empty()) else {
        return first.to_os_string();
    };
    let has = v
        .as_bytes()
        .split(|b| *b == b':' || b.is_ascii_whitespace())
        .any(|e| e == first.as_bytes());
    if has {
        return v.to_os_string();
    }
    let mut out = first.to_os_string();
    out.push(":");
    out.push(v);
    out
}

/// The environment that puts a process under the client `lib` for the mount at `mp` served at
/// `sock`, given the current `LD_PRELOAD` and `TIERSTACK_IO`: the library first in
/// `LD_PRELOAD`, the mount's entry first in `TIERSTACK_IO`, neither added twice (a task
/// started from a process already under the client).
pub fn client_env(
    lib: &Path,
    mp: &Path,
    sock: &Path,
    preload: Option<&OsStr>,
    io: Option<&OsStr>,
) -> [(&'static str, OsString); 2] {
    [
        (PRELOAD_VAR, prepend(lib.as_os_str(), preload)),
        (IO_VAR, prepend(&io_entry(mp, sock), io)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_puts_the_client_first_once() {
        // The two values for a given LD_PRELOAD and TIERSTACK_IO.
        let env = |preload: Option<&str>, io: Option<&str>| {
            let [(k1, v1), (k2, v2)] = client_env(
                Path::new("/l/libtierstack_io.so"),
                Path::new("/m"),
                Path::new("/run/x.io"),
                preload.map(OsStr::new),
                io.map(OsStr::new),
            );
            assert_eq!((k1, k2), ("LD_PRELOAD", "TIERSTACK_IO"));
            (v1.into_string().unwrap(), v2.into_string().unwrap())
        };
        let cases = [
            // Nothing there: the client alone.
            (None, Some(""), "/l/libtierstack_io.so", "/m=/run/x.io"),
            // Others there: the client first.
            (
                Some("/other.so"),
                Some("/n=/run/y.io"),
                "/l/libtierstack_io.so:/other.so",
                "/m=/run/x.io:/n=/run/y.io",
            ),
            // Already there (a task of a step started under the client): unchanged.
            (
                Some("/a.so /l/libtierstack_io.so"),
                Some("/n=/run/y.io:/m=/run/x.io"),
                "/a.so /l/libtierstack_io.so",
                "/n=/run/y.io:/m=/run/x.io",
            ),
        ];
        for (preload, io, want_preload, want_io) in cases {
            assert_eq!(
                env(preload, io),
                (want_preload.to_string(), want_io.to_string())
            );
        }
    }
}
