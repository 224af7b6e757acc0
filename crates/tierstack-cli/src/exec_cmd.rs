//! `tierstack exec MOUNT -- CMD`: runs CMD with the interception client
//! (`libtierstack_io.so`, crate `tierstack-io`) preloaded, so its calls on files under MOUNT
//! are served by the mount's daemon over shared memory instead of FUSE round trips. Its
//! children inherit it. The command replaces this process (its exit status is the
//! command's).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

/// `tierstack exec`'s arguments.
#[derive(Args)]
pub struct ExecArgs {
    /// The tierstack mount whose files the command reaches through the client.
    pub mount: PathBuf,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// The environment variable that lists the mounts and their io sockets
/// (`MOUNTPOINT=SOCKET`, `:`-separated).
const IO_VAR: &str = "TIERSTACK_IO";

/// `value` with `first` put before it, `:`-separated (an empty `value`: `first` alone).
fn prepend(first: &OsString, value: Option<OsString>) -> OsString {
    let mut out = first.clone();
    if let Some(v) = value.filter(|v| !v.is_empty()) {
        out.push(":");
        out.push(v);
    }
    out
}

/// The client's entry for the mount at `mp` served at `sock`.
pub fn io_entry(mp: &std::path::Path, sock: &std::path::Path) -> OsString {
    let mut e = mp.as_os_str().to_os_string();
    e.push("=");
    e.push(sock);
    e
}

/// Runs the command under the client; returns only on error.
pub fn exec(a: ExecArgs) -> Result<()> {
    if !a.mount.is_dir() {
        usage_bail!(
            "{} is not a folder: give the mountpoint of a tierstack mount",
            a.mount.display()
        );
    }
    let mp = tierstack_fs::mount::canonical_mountpoint(&a.mount)?;
    let sock = tierstack_fs::io::io_socket_path(&tierstack_fs::mount::socket_path(&mp));
    if !sock.exists() {
        bail!(
            "no tierstack mount at {} serves io clients (no {}): mount it with `tierstack mount`, or see `tierstack status {}`",
            mp.display(),
            sock.display(),
            mp.display()
        );
    }
    let lib = crate::run_cmd::find_lib("libtierstack_io.so", "TIERSTACK_IO_LIB")?;
    let Some((program, args)) = a.cmd.split_first() else {
        usage_bail!("no command given: tierstack exec MOUNT -- CMD [ARGS...]");
    };
    let err = std::process::Command::new(program)
        .args(args)
        .env(
            "LD_PRELOAD",
            prepend(&lib.into_os_string(), std::env::var_os("LD_PRELOAD")),
        )
        .env(
            IO_VAR,
            prepend(&io_entry(&mp, &sock), std::env::var_os(IO_VAR)),
        )
        .exec();
    bail!("cannot run {}: {err}", program.to_string_lossy())
}
