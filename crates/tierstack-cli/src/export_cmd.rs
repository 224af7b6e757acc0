//! `tierstack export MOUNT`: serves a live tierstack mount to other nodes over NFSv4 through
//! NFS-Ganesha's VFS backend (Debian's `nfs-ganesha` and `nfs-ganesha-vfs`).
//!
//! The export's files live in a folder beside the mount's control socket
//! (`<runtime folder>/<mount key>.export/`: `ganesha.conf`, `ganesha.pid`, `recovery/`),
//! removed when the export stops; NFS-Ganesha's log is kept beside the mount's log
//! (`<log folder>/<mount key>.export.log`). NFSv4 over TCP on one port (no rpcbind, no
//! mountd); `--nfs3` adds NFSv3, which registers with a running rpcbind (Ganesha exits at
//! start when it cannot). The export's pseudo path is the mount point itself (a client mounts `HOST:MOUNT`). Ganesha's VFS
//! backend names files by kernel file handles, which a FUSE mount gives out when the daemon
//! offers export support (`tierstack_fs::fuse`: LOOKUP of "." and "..", generations kept by
//! the fast tier's journal), so a handle outlives the kernel's inode cache and restarts of
//! Ganesha and of the mount daemon.
//! `tierstack export --stop MOUNT` stops it (SIGTERM, then SIGKILL after
//! [`STOP_WAIT`]). Every wait is bounded.

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use clap::Args;

/// The longest `export` waits for NFS-Ganesha to listen.
const START_WAIT: Duration = Duration::from_secs(30);
/// The longest `export --stop` waits for NFS-Ganesha to exit after SIGTERM (then SIGKILL).
const STOP_WAIT: Duration = Duration::from_secs(20);

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The tierstack mount to serve (a live mount of `tierstack mount`).
    pub mountpoint: PathBuf,
    /// The address NFS-Ganesha listens on (default: every address of the host).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0")]
    pub listen: String,
    /// The NFS port (clients other than Linux's name it: libnfs `nfs://HOST/PATH?nfsport=N`).
    #[arg(long, value_name = "N", default_value_t = 2049)]
    pub port: u16,
    /// Serve NFSv3 too (its MOUNT protocol on a port rpcbind hands out): needs rpcbind running
    /// (Debian's `rpcbind`, which nfs-ganesha installs); NFSv4 alone needs nothing else.
    #[arg(long)]
    pub nfs3: bool,
    /// Stay in the foreground: `tierstack export` becomes NFS-Ganesha (for systemd).
    #[arg(long)]
    pub foreground: bool,
    /// Stop the export of MOUNT.
    #[arg(long, conflicts_with = "foreground")]
    pub stop: bool,
}

/// Where one mount's export keeps its files.
struct ExportDir {
    dir: PathBuf,
    log: PathBuf,
}

impl ExportDir {
    fn of(mountpoint: &Path) -> ExportDir {
        ExportDir {
            dir: tierstack_fs::mount::socket_path(mountpoint).with_extension("export"),
            log: tierstack_fs::mount::log_path(mountpoint).with_extension("export.log"),
        }
    }
    fn conf(&self) -> PathBuf {
        self.dir.join("ganesha.conf")
    }
    fn log(&self) -> PathBuf {
        self.log.clone()
    }
    fn pidfile(&self) -> PathBuf {
        self.dir.join("ganesha.pid")
    }
    /// The NFS-Ganesha serving this export, if one runs: the pid in the pid file, alive, and
    /// started with this export's configuration.
    fn running(&self) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(self.pidfile())
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let conf = self.conf();
        let conf = conf.as_os_str().as_encoded_bytes();
        let ours = cmdline.split(|b| *b == 0).any(|a| a == conf);
        (ours && tierstack_common::process::alive(pid as u32)).then_some(pid)
    }
}

pub fn run(a: ExportArgs) -> Result<()> {
    let mp = tierstack_fs::mount::canonical_mountpoint(&a.mountpoint)
        .with_context(|| format!("cannot export {}", a.mountpoint.display()))?;
    let ex = ExportDir::of(&mp);
    if a.stop {
        return stop(&mp, &ex);
    }
    let addr = listen_addr(&a.listen, a.port)?;
    if !rustix::process::geteuid().is_root() {
        return Err(anyhow!(
            "tierstack export needs root (NFS-Ganesha serves as root): run it with sudo"
        ));
    }
    let ganesha = find_ganesha()?;
    check_live_mount(&mp)?;
    if let Some(pid) = ex.running() {
        return Err(anyhow!(
            "{} is already exported (NFS-Ganesha pid {pid}): stop it first with `tierstack export --stop {}`",
            mp.display(),
            mp.display()
        ));
    }
    // A port someone else holds: say so now, not as a line in Ganesha's log.
    drop(TcpListener::bind(addr).map_err(|e| {
        anyhow!(
            "cannot listen on {addr} ({e}): stop the NFS server that holds it, or give another --port"
        )
    })?);
    if a.nfs3
        && TcpStream::connect_timeout(&([127, 0, 0, 1], 111).into(), Duration::from_secs(2))
            .is_err()
    {
        return Err(anyhow!(
            "--nfs3 needs rpcbind, which is not running: start it (systemctl start rpcbind, or rpcbind -w), or leave out --nfs3"
        ));
    }
    write_config(&ex, &mp, &a.listen, a.port, a.nfs3)?;
    let mut cmd = Command::new(&ganesha);
    cmd.arg("-F")
        .arg("-f")
        .arg(ex.conf())
        .arg("-L")
        .arg(ex.log())
        .arg("-p")
        .arg(ex.pidfile());
    if a.foreground {
        use std::os::unix::process::CommandExt;
        let e = cmd.exec();
        return Err(anyhow!("cannot run {}: {e}", ganesha.display()));
    }
    let spawned = spawn_detached(cmd).map_err(|e| anyhow!("cannot run {}: {e}", ganesha.display()));
    let child = spawned.and_then(|mut c| wait_listening(&mut c, addr, &ex).map(|()| c));
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&ex.dir);
            return Err(e);
        }
    };
    std::fs::write(ex.pidfile(), format!("{}\n", child.id()))
        .with_context(|| format!("cannot write {}", ex.pidfile().display()))?;
    let host = if addr.ip().is_unspecified() {
        "HOST".to_string()
    } else {
        addr.ip().to_string()
    };
    println!(
        "exported {} over {} at {host}:{} (NFS-Ganesha pid {}, port {}, log {}); stop with `tierstack export --stop {}`",
        mp.display(),
        if a.nfs3 { "NFSv3 and NFSv4" } else { "NFSv4" },
        mp.display(),
        child.id(),
        a.port,
        ex.log().display(),
        mp.display()
    );
    Ok(())
}

/// `ganesha.nfsd` on PATH (or in /usr/bin, /usr/sbin), with its VFS backend installed.
fn find_ganesha() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join("ganesha.nfsd"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow!(
                "ganesha.nfsd not found: install NFS-Ganesha and its VFS backend (Debian: apt-get install nfs-ganesha nfs-ganesha-vfs)"
            )
        })?;
    // Where distributions put Ganesha's backends; where one of these folders exists, the VFS
    // backend must be in it (elsewhere Ganesha's own error says what is missing).
    let dirs = [
        "/usr/lib/x86_64-linux-gnu/ganesha",
        "/usr/lib/aarch64-linux-gnu/ganesha",
        "/usr/lib64/ganesha",
        "/usr/lib/ganesha",
    ];
    let present: Vec<&Path> = dirs.iter().map(Path::new).filter(|d| d.is_dir()).collect();
    if !present.is_empty() && !present.iter().any(|d| d.join("libfsalvfs.so").exists()) {
        return Err(anyhow!(
            "NFS-Ganesha's VFS backend (libfsalvfs.so) is not installed: apt-get install nfs-ganesha-vfs"
        ));
    }
    Ok(found)
}

/// Fails unless a tierstack mount daemon answers for `mp` and `mp` is mounted.
fn check_live_mount(mp: &Path) -> Result<()> {
    let sock = tierstack_fs::mount::socket_path(mp);
    let live = tierstack_common::mounts::is_mounted(mp)
        && tierstack_fs::mount::status_at(&sock, Duration::from_secs(10)).is_some();
    if !live {
        return Err(anyhow!(
            "{} is not a live tierstack mount: mount it first (`tierstack mount BACKING {}`)",
            mp.display(),
            mp.display()
        ));
    }
    Ok(())
}

/// The socket address of `--listen` and `--port` (a usage error if it is not one).
fn listen_addr(listen: &str, port: u16) -> Result<SocketAddr> {
    (listen, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            crate::usage(format!(
                "--listen {listen} is not an address of this host: give an IP address such as 0.0.0.0 or 10.0.0.1"
            ))
        })
}

/// Writes NFS-Ganesha's configuration for exporting `mp` (NFSv4, and NFSv3 with `nfs3`, over
/// TCP; root not squashed, numeric owners, no grace period) into the export's folder.
fn write_config(ex: &ExportDir, mp: &Path, listen: &str, port: u16, nfs3: bool) -> Result<()> {
    let m = mp.to_str().filter(|m| !m.contains(['"', '\n', '\\'])).ok_or_else(|| {
        anyhow!(
            "cannot export {}: NFS-Ganesha's configuration cannot name a path that is not UTF-8 or holds a quote, backslash or newline: mount the buffer at a plainer path",
            mp.display()
        )
    })?;
    let recovery = ex.dir.join("recovery");
    std::fs::create_dir_all(&recovery)
        .with_context(|| format!("cannot make {}", recovery.display()))?;
    if let Some(d) = ex.log.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("cannot make {}", d.display()))?;
    }
    // Each export's log starts empty (a failed start's error names its lines).
    let _ = std::fs::remove_file(&ex.log);
    let protocols = if nfs3 { "3, 4" } else { "4" };
    let conf = format!(
        "# Written by `tierstack export`; rewritten at each export.
NFS_CORE_PARAM {{
    Protocols = {protocols};
    NFS_Port = {port};
    Bind_Addr = {listen};
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
}}
NFSV4 {{
    # No grace period after a restart: clients go on at once (handles stay valid; open and
    # lock state is not reclaimed).
    Graceless = true;
    RecoveryRoot = \"{recovery}\";
    Only_Numeric_Owners = true;
}}
NFS_KRB5 {{
    Active_krb5 = false;
}}
EXPORT {{
    Export_Id = 1;
    Path = \"{m}\";
    Pseudo = \"{m}\";
    Access_Type = RW;
    Squash = No_Root_Squash;
    SecType = sys;
    Protocols = {protocols};
    Transports = TCP;
    FSAL {{
        Name = VFS;
    }}
}}
",
        recovery = recovery.display()
    );
    std::fs::write(ex.conf(), conf).with_context(|| format!("cannot write {}", ex.conf().display()))
}

/// Starts `cmd` in a session of its own, its output discarded (it logs to its log file).
fn spawn_detached(mut cmd: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    cmd.spawn()
}

/// Waits (up to [`START_WAIT`]) until NFS-Ganesha accepts connections at `addr`. If it exits
/// or never listens, the error carries the serious lines of its log.
fn wait_listening(child: &mut Child, addr: SocketAddr, ex: &ExportDir) -> Result<()> {
    let probe = if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    };
    let t0 = Instant::now();
    loop {
        if TcpStream::connect_timeout(&probe, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || t0.elapsed() > START_WAIT {
            if exited.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            return Err(anyhow!(
                "NFS-Ganesha {} ({}): see {}",
                match exited {
                    Some(st) => format!("exited at start ({st})"),
                    None => format!("did not listen on {addr} within {} s", START_WAIT.as_secs()),
                },
                log_errors(&ex.log()),
                ex.log().display()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last few serious lines of Ganesha's log (not its usual complaints about D-Bus and
/// Kerberos, which a tierstack export does without).
fn log_errors(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(":CRIT :") || l.contains(":MAJ :") || l.contains(":FATAL :"))
        .filter(|l| !l.contains(":DBUS :") && !l.contains("principal nfs"))
        .filter(|l| !l.contains("Cannot register") && !l.contains("krb5"))
        .collect();
    let last: Vec<String> = lines
        .iter()
        .rev()
        .take(3)
        .rev()
        .map(|l| l.rsplit_once("] ").map_or(*l, |(_, m)| m).to_string())
        .collect();
    if last.is_empty() {
        "no error in its log".into()
    } else {
        last.join("; ")
    }
}

/// `export --stop`: SIGTERM to this export's NFS-Ganesha, SIGKILL after [`STOP_WAIT`].
fn stop(mp: &Path, ex: &ExportDir) -> Result<()> {
    let Some(pid) = ex.running() else {
        return Err(anyhow!(
            "{} is not exported (no NFS-Ganesha of `tierstack export` runs for it)",
            mp.display()
        ));
    };
    let alive = || tierstack_common::process::alive(pid as u32);
    // SAFETY: kill(2) of the NFS-Ganesha this export started (its command line names the
    // export's own configuration file, checked by `running`).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let t0 = Instant::now();
    while alive() && t0.elapsed() < STOP_WAIT {
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive() {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let t1 = Instant::now();
        while alive() && t1.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if alive() {
        return Err(anyhow!(
            "NFS-Ganesha (pid {pid}) did not exit after SIGTERM and SIGKILL: look at the process (a hung mount?)"
        ));
    }
    let _ = std::fs::remove_dir_all(&ex.dir);
    println!("stopped the export of {}", mp.display());
    Ok(())
}
