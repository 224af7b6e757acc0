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

/// The interception client's library (`TIERSTACK_IO_LIB`, else beside the binary as
/// [`crate::run_cmd::find_lib`] looks).
pub fn io_lib() -> Result<PathBuf> {
    crate::run_cmd::find_lib("libtierstack_io.so", "TIERSTACK_IO_LIB")
}

/// Runs the command under the client; returns only on error.
pub fn exec(a: ExecArgs) -> Result<()> {
    if !a.mount.is_dir() {
        usage_bail!(
            "{} is not a folder: give the mountpoint of a tierstack mount",
            a.mount.display()
        );
    }
    let (mp, sock) = tierstack_fs::client_env::client_socket(&a.mount)?;
    let lib = io_lib()?;
    let Some((program, args)) = a.cmd.split_first() else {
        usage_bail!("no command given: tierstack exec MOUNT -- CMD [ARGS...]");
    };
    let preload = std::env::var_os(tierstack_fs::client_env::PRELOAD_VAR);
    let io = std::env::var_os(tierstack_fs::client_env::IO_VAR);
    let err = std::process::Command::new(program)
        .args(args)
        .envs(tierstack_fs::client_env::client_env(
            &lib,
            &mp,
            &sock,
            preload.as_deref(),
            io.as_deref(),
        ))
        .exec();
    bail!("cannot run {}: {err}", program.to_string_lossy())
}
