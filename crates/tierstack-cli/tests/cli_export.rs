//! `tierstack export`: a real tierstack mount served over NFSv4 by a real NFS-Ganesha (VFS
//! backend), used by a real client from another network namespace. This host's kernel has
//! no NFS client, so the client is libnfs's user-space one (`nfs-cp`, `nfs-cat`, `nfs-ls` of
//! Debian's libnfs-utils) run with `ip netns exec` in a namespace of its own, joined to the
//! host's by a veth pair (10.251.N.1 on the host, where Ganesha listens, 10.251.N.2 in the
//! client's namespace). File handles are checked with a minimal NFSv4.0 client below (a
//! COMPOUND of PUTROOTFH, LOOKUPs and GETFH for a handle, PUTFH and READ with the anonymous
//! stateid to use it) and, underneath Ganesha, with name_to_handle_at/open_by_handle_at on the
//! mount itself.
//!
//! Needs root and /dev/fuse (without them it says SKIP), and then NFS-Ganesha with its VFS
//! backend, libnfs-utils and `ip` (`.ci/run` installs them): without those it fails, naming
//! the packages.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::{detach, is_mounted, ok, random, root_with_fuse, s, serial, ts};

/// rpcbind, which NFSv3 needs (`export --nfs3`): started here if it is not running, and
/// then stopped at the end.
struct Rpcbind(Option<std::process::Child>);

impl Rpcbind {
    fn ensure() -> Rpcbind {
        let up = || {
            TcpStream::connect_timeout(&([127, 0, 0, 1], 111).into(), Duration::from_secs(1))
                .is_ok()
        };
        if up() {
            return Rpcbind(None);
        }
        let child = Command::new("rpcbind")
            .args(["-f", "-w"])
            .spawn()
            .expect("rpcbind not found: apt-get install rpcbind (nfs-ganesha depends on it)");
        let t0 = Instant::now();
        while !up() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(up(), "rpcbind did not listen on port 111");
        Rpcbind(Some(child))
    }
}

impl Drop for Rpcbind {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A network namespace for the client, joined to this one by a veth pair; removed on drop.
struct Netns {
    name: String,
    host_if: String,
    host_ip: String,
}

fn sh(cmd: &[&str]) -> Output {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", cmd[0]))
}

#[track_caller]
fn must(cmd: &[&str]) {
    let o = sh(cmd);
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

impl Netns {
    fn new() -> Netns {
        let id = std::process::id();
        let n = id % 250 + 1;
        let ns = Netns {
            name: format!("tsexp{id}"),
            host_if: format!("tsxh{}", id % 100_000),
            host_ip: format!("10.251.{n}.1"),
        };
        let client_if = format!("tsxc{}", id % 100_000);
        let client_ip = format!("10.251.{n}.2/30");
        must(&["ip", "netns", "add", &ns.name]);
        must(&[
            "ip",
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &client_if,
        ]);
        must(&["ip", "link", "set", &client_if, "netns", &ns.name]);
        must(&[
            "ip",
            "addr",
            "add",
            &format!("{}/30", ns.host_ip),
            "dev",
            &ns.host_if,
        ]);
        must(&["ip", "link", "set", &ns.host_if, "up"]);
        let inside = |args: &[&str]| {
            let mut v = vec!["ip", "netns", "exec", &ns.name];
            v.extend_from_slice(args);
            must(&v);
        };
        inside(&["ip", "addr", "add", &client_ip, "dev", &client_if]);
        inside(&["ip", "link", "set", &client_if, "up"]);
        inside(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// Runs `args` in the client's namespace (bounded at 60 s).
    fn run(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, "timeout", "60"])
            .args(args)
            .output()
            .expect("ip netns exec")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.name]);
        let _ = sh(&["ip", "link", "del", &self.host_if]);
    }
}

/// The mount and its export, taken down however the test ends.
struct Served {
    mnt: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = ts(&["export", "--stop", s(&self.mnt)]);
        if is_mounted(&self.mnt) {
            let _ = ts(&["umount", s(&self.mnt), "--timeout", "60s"]);
        }
        detach(&self.mnt, None);
    }
}

/// Fails, naming the packages, unless the export's programs are here.
fn needs_programs() {
    for (prog, pkg) in [
        ("ganesha.nfsd", "nfs-ganesha nfs-ganesha-vfs"),
        ("nfs-cp", "libnfs-utils"),
        ("ip", "iproute2"),
    ] {
        let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
            .any(|d| d.join(prog).is_file());
        assert!(
            found,
            "{prog} not found: apt-get install {pkg} (.ci/run does)"
        );
    }
}

// ----------------------------------------------------------------- a minimal NFSv4.0 client

/// One operation of a COMPOUND.
enum Nfs4Op<'a> {
    PutRootFh,
    Lookup(&'a str),
    GetFh,
    PutFh(&'a [u8]),
    Read(u64, u32),
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn put_opaque(b: &mut Vec<u8>, v: &[u8]) {
    put_u32(b, v.len() as u32);
    b.extend_from_slice(v);
    b.resize(b.len().next_multiple_of(4), 0);
}

struct XdrIn<'a>(&'a [u8]);

impl XdrIn<'_> {
    fn u32(&mut self) -> u32 {
        let (h, t) = self.0.split_at(4);
        self.0 = t;
        u32::from_be_bytes(h.try_into().expect("4 bytes"))
    }
    fn opaque(&mut self) -> Vec<u8> {
        let n = self.u32() as usize;
        let v = self.0[..n].to_vec();
        self.0 = &self.0[n.next_multiple_of(4)..];
        v
    }
}

/// Sends one COMPOUND (AUTH_SYS as root) to the NFSv4 server at `addr`: the handle of the
/// last GETFH and the data of the last READ, or the NFS4ERR status of the operation that
/// failed.
fn compound(addr: SocketAddr, ops: &[Nfs4Op]) -> Result<(Vec<u8>, Vec<u8>), u32> {
    let mut b = Vec::new();
    for v in [0x7453_0001u32, 0, 2, 100_003, 4, 1] {
        put_u32(&mut b, v); // xid, CALL, RPC version 2, NFS, version 4, COMPOUND
    }
    let mut cred = Vec::new();
    put_u32(&mut cred, 0); // stamp
    put_opaque(&mut cred, b"tierstack-test");
    for v in [0, 0, 0] {
        put_u32(&mut cred, v); // uid, gid, no other groups
    }
    put_u32(&mut b, 1); // AUTH_SYS
    put_opaque(&mut b, &cred);
    put_u32(&mut b, 0); // verifier: AUTH_NONE
    put_u32(&mut b, 0);
    put_opaque(&mut b, b""); // tag
    put_u32(&mut b, 0); // minor version 0
    put_u32(&mut b, ops.len() as u32);
    for op in ops {
        match op {
            Nfs4Op::PutRootFh => put_u32(&mut b, 24),
            Nfs4Op::Lookup(name) => {
                put_u32(&mut b, 15);
                put_opaque(&mut b, name.as_bytes());
            }
            Nfs4Op::GetFh => put_u32(&mut b, 10),
            Nfs4Op::PutFh(fh) => {
                put_u32(&mut b, 22);
                put_opaque(&mut b, fh);
            }
            Nfs4Op::Read(off, count) => {
                put_u32(&mut b, 25);
                b.extend_from_slice(&[0u8; 16]); // the anonymous stateid
                b.extend_from_slice(&off.to_be_bytes());
                put_u32(&mut b, *count);
            }
        }
    }
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut rec = (0x8000_0000u32 | b.len() as u32).to_be_bytes().to_vec();
    rec.extend_from_slice(&b);
    conn.write_all(&rec).expect("send");
    let mut reply = Vec::new();
    loop {
        let mut mark = [0u8; 4];
        conn.read_exact(&mut mark).expect("reply");
        let mark = u32::from_be_bytes(mark);
        let mut frag = vec![0u8; (mark & 0x7fff_ffff) as usize];
        conn.read_exact(&mut frag).expect("reply");
        reply.extend_from_slice(&frag);
        if mark & 0x8000_0000 != 0 {
            break;
        }
    }
    let mut x = XdrIn(&reply);
    let (_xid, msg, accepted) = (x.u32(), x.u32(), x.u32());
    assert_eq!((msg, accepted), (1, 0), "RPC reply refused");
    let _verf = (x.u32(), x.opaque());
    assert_eq!(x.u32(), 0, "RPC call not accepted");
    let _status = x.u32();
    let _tag = x.opaque();
    let n = x.u32();
    let (mut fh, mut data) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (op, status) = (x.u32(), x.u32());
        if status != 0 {
            return Err(status);
        }
        match op {
            10 => fh = x.opaque(),
            25 => {
                let _eof = x.u32();
                data = x.opaque();
            }
            _ => {}
        }
    }
    Ok((fh, data))
}

/// The NFSv4 handle of `path` (absolute, under the export's pseudo root).
fn handle_of(addr: SocketAddr, path: &Path) -> Vec<u8> {
    let names: Vec<String> = path
        .components()
        .skip(1)
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let mut ops = vec![Nfs4Op::PutRootFh];
    ops.extend(names.iter().map(|n| Nfs4Op::Lookup(n)));
    ops.push(Nfs4Op::GetFh);
    compound(addr, &ops).expect("GETFH").0
}

/// `len` bytes at 0 of the file with NFSv4 handle `fh` (the NFS4ERR status on failure).
fn read_by_handle(addr: SocketAddr, fh: &[u8], len: u32) -> Result<Vec<u8>, u32> {
    compound(addr, &[Nfs4Op::PutFh(fh), Nfs4Op::Read(0, len)]).map(|r| r.1)
}

// ----------------------------------------------------------------- the mount's own handles

/// The kernel file handle (type, bytes) of `path` on its FUSE mount.
fn kernel_handle(path: &Path) -> (i32, Vec<u8>) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path");
    let mut buf = vec![0u8; 8 + 128];
    buf[..4].copy_from_slice(&128u32.to_ne_bytes());
    let mut mount_id = 0;
    // SAFETY: `buf` is a struct file_handle with room for 128 bytes of handle, as its
    // handle_bytes says; the path is a NUL-terminated string.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    let n = u32::from_ne_bytes(buf[..4].try_into().expect("4")) as usize;
    let t = i32::from_ne_bytes(buf[4..8].try_into().expect("4"));
    (t, buf[8..8 + n].to_vec())
}

/// The contents of the file with kernel handle `h` on the mount at `mnt`.
fn read_kernel_handle(mnt: &Path, h: &(i32, Vec<u8>)) -> std::io::Result<Vec<u8>> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let dir = std::fs::File::open(mnt)?;
    let mut buf = Vec::with_capacity(8 + h.1.len());
    buf.extend_from_slice(&(h.1.len() as u32).to_ne_bytes());
    buf.extend_from_slice(&h.0.to_ne_bytes());
    buf.extend_from_slice(&h.1);
    // SAFETY: `buf` is a struct file_handle as name_to_handle_at gave it; `dir` is open.
    let fd = unsafe {
        libc::open_by_handle_at(dir.as_raw_fd(), buf.as_mut_ptr().cast(), libc::O_RDONLY)
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

fn daemon_pid(mnt: &Path) -> u32 {
    let j: serde_json::Value =
        serde_json::from_str(&ok(&["status", s(mnt), "--json"])).expect("status json");
    j["pid"].as_u64().expect("pid") as u32
}

fn dev_of(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).expect("stat").dev()
}

/// Writes, reads and lists through NFS from the client's namespace; the data reaches BACKING
/// at `umount`; a file handle survives a restart of NFS-Ganesha and, underneath it, a restart
/// of the mount daemon (so does Ganesha's own handle where the remounted FUSE mount got its
/// device number back, which Ganesha's handles carry; the path works either way).
#[test]
fn a_client_in_another_namespace_writes_reads_and_keeps_its_handles() {
    if !root_with_fuse() {
        return;
    }
    needs_programs();
    let _g = serial();
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().canonicalize().expect("canonical");
    let (backing, mnt, fast) = (root.join("backing"), root.join("mnt"), root.join("fast"));
    for d in [&backing, &mnt] {
        std::fs::create_dir(d).expect("mkdir");
    }
    let mount = || {
        ok(&[
            "mount",
            s(&backing),
            s(&mnt),
            "--dir",
            s(&fast),
            "--dram",
            "128M",
        ])
    };
    mount();
    let served = Served { mnt: mnt.clone() };
    let net = Netns::new();
    let port = common::free_port().to_string();
    let _rpcbind = Rpcbind::ensure();
    let export = || {
        ok(&[
            "export",
            s(&mnt),
            "--listen",
            &net.host_ip,
            "--port",
            &port,
            "--nfs3",
        ])
    };
    let out = export();
    assert!(out.contains("exported"), "{out}");
    let addr: SocketAddr = format!("{}:{port}", net.host_ip).parse().expect("addr");
    // NFSv3 for libnfs's tools: their NFSv4 WRITE (libnfs 4.0) fails for writes of more than
    // about 4 KB ("Failed to write to dest file", no WRITE reaches the server), against a plain
    // folder too. NFSv4 is checked by the handle client and an `nfs-cat` below.
    let url = |name: &str| format!("nfs://{}{}/{name}", net.host_ip, mnt.display());
    let url4 = |name: &str| {
        format!(
            "nfs://{}{}/{name}?version=4&nfsport={port}",
            net.host_ip,
            mnt.display()
        )
    };

    // Write with nfs-cp, read back with nfs-cat, list with nfs-ls, from the other namespace.
    let data = random((3 << 20) + 123, 40);
    let src = root.join("src.bin");
    std::fs::write(&src, &data).expect("write");
    let o = net.run(&["nfs-cp", s(&src), &url("data.bin")]);
    assert!(
        o.status.success(),
        "nfs-cp: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = net.run(&["nfs-cat", &url("data.bin")]);
    assert!(
        o.status.success(),
        "nfs-cat: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.stdout == data,
        "nfs-cat read {} bytes, not what nfs-cp wrote",
        o.stdout.len()
    );
    let o = net.run(&["nfs-cat", &url4("data.bin")]);
    assert!(
        o.stdout == data,
        "nfs-cat over NFSv4: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = net.run(&["nfs-ls", &url("")]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("data.bin"),
        "nfs-ls: {o:?}"
    );
    assert_eq!(std::fs::read(mnt.join("data.bin")).expect("read"), data);

    // A handle, used as is after Ganesha restarts.
    let fh = handle_of(addr, &mnt.join("data.bin"));
    assert_eq!(read_by_handle(addr, &fh, 65536), Ok(data[..65536].to_vec()));
    ok(&["export", "--stop", s(&mnt)]);
    export();
    assert_eq!(
        read_by_handle(addr, &fh, 65536),
        Ok(data[..65536].to_vec()),
        "the handle did not survive a restart of NFS-Ganesha"
    );

    // The mount daemon restarts (SIGTERM: a stop, then a new mount over the same fast tier).
    let kh = kernel_handle(&mnt.join("data.bin"));
    assert_eq!(kh.1.len(), 12, "FUSE handle: node id and generation");
    assert_ne!(&kh.1[8..], &[0; 4], "generation 0");
    let dev = dev_of(&mnt);
    ok(&["export", "--stop", s(&mnt)]);
    let pid = daemon_pid(&mnt);
    // SAFETY: kill(2) of the mount daemon this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let t0 = Instant::now();
    while (is_mounted(&mnt) || Path::new(&format!("/proc/{pid}")).exists())
        && t0.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!is_mounted(&mnt), "the daemon did not stop on SIGTERM");
    mount();
    // Underneath Ganesha: the kernel handle finds the file on the new mount (LOOKUP of "."
    // with the same node id and generation).
    assert_eq!(
        read_kernel_handle(&mnt, &kh).expect("open_by_handle_at after the restart"),
        data
    );
    export();
    let o = net.run(&["nfs-cat", &url("data.bin")]);
    assert!(
        o.stdout == data,
        "nfs-cat after the daemon's restart: {:?}",
        o.stderr
    );
    if dev_of(&mnt) == dev {
        assert_eq!(
            read_by_handle(addr, &fh, 65536),
            Ok(data[..65536].to_vec()),
            "the NFS handle did not survive a restart of the mount daemon"
        );
    } else {
        eprintln!(
            "NOTE: the new FUSE mount has another device number ({dev} -> {}): NFS-Ganesha's handles carry it, so the old NFS handle is stale (the path and the kernel handle work)",
            dev_of(&mnt)
        );
    }

    // A second file after the restart; both reach BACKING at umount (which drains).
    let more = random(100_000, 41);
    std::fs::write(&src, &more).expect("write");
    let o = net.run(&["nfs-cp", s(&src), &url("more.bin")]);
    assert!(
        o.status.success(),
        "nfs-cp: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    ok(&["export", "--stop", s(&mnt)]);
    ok(&["umount", s(&mnt)]);
    assert_eq!(
        std::fs::read(backing.join("data.bin")).expect("BACKING"),
        data
    );
    assert_eq!(
        std::fs::read(backing.join("more.bin")).expect("BACKING"),
        more
    );
    drop(served);
}

/// Bad input: one line naming the problem and its fix, a non-zero exit (2 for usage).
#[test]
fn export_refuses_what_it_cannot_serve() {
    if !root_with_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let o = ts(&["export", s(tmp.path())]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is not a live tierstack mount") || err.contains("ganesha.nfsd not found"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let o = ts(&["export", "--stop", s(tmp.path())]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not exported"));
    let o = ts(&["export", s(tmp.path()), "--listen", "not an address"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--listen"), "{err}");
    let o = ts(&["export", s(tmp.path()), "--stop", "--foreground"]);
    assert_eq!(o.status.code(), Some(2));
}
