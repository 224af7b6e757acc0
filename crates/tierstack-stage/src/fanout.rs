//! Stage-in fan-out: a job's inputs are read from the shared file system once and passed node
//! to node in a tree over TCP, instead of every node reading them (`stage in --fanout`).
//!
//! Every node of the job runs [`run`] at about the same time with the same node list. Each
//! plans the same stage itself (`plan_paths`: metadata only), sorted by source path, so only
//! file contents travel. Node 0 (the root) reads the sources; node `i > 0` receives from its
//! parent `(i - 1) / degree` ([`parent`]) and forwards every chunk to its own children while it
//! writes its copy (pipelined: the bytes reach the leaves about as soon as the root reads
//! them). On the wire, after a hello (`HELLO`, the plan's digest, the child's index) and the
//! parent's one-byte answer, each file is its bytes (length known from the plan) followed by
//! the xxh3-64 of those bytes as the sender saw them; each hop compares.
//!
//! Bounded waits everywhere: connecting to the parent and gathering the children each take at
//! most `timeout`; every read and write on a socket at most `timeout x (height + 1)` (a parent
//! may itself be waiting on its own parent and children before it sends anything). A node
//! whose parent is unreachable, stalls, closes early or sends bytes whose checksum differs
//! falls back to reading the rest from the shared file system itself, and goes on feeding its
//! own children from there; a child that stalls or goes away is dropped (it falls back the
//! same way). So a node that dies costs the others at most those bounds, and the shared
//! system the reads of the nodes that fell back.
//!
//! Each copy is written under a temporary name next to its destination, given the source's
//! mode and modification time, fsynced and renamed into place, as the stager does. With a
//! `read_back` path (where the destination shows inside a tierstack mount whose BACKING holds
//! it), every copy is read back there once and its checksum compared: the mount then holds the
//! inputs as clean cache of files already in its BACKING, so they are never drained anywhere.
//!
//! Where BACKING is the shared file system itself, a node's copy must not go there: each node
//! then copies into a node-local spool folder, without a read back, and the caller takes the
//! copies in through the mount's `adopt` request (see `tierstack_fs::core::adopt`) using
//! [`FanoutReport::copies`]; the root first [`publish`]es into BACKING the files BACKING does
//! not hold yet as they are (same size and mtime), once.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::Xxh3;

use super::copy::{create_tmp, finish_tmp};
use super::{io_err, plan_paths, FileJob, Plan, StageError, CHUNK};

/// First bytes of a child's hello.
const HELLO: &[u8; 8] = b"TSFANO1\n";

/// The parent of node `i` in a tree of `degree` children per node (node 0, the root, has
/// none; `degree` 0 means no tree: every node reads the shared file system itself).
pub fn parent(i: usize, degree: usize) -> Option<usize> {
    if i == 0 || degree == 0 {
        None
    } else {
        Some((i - 1) / degree)
    }
}

/// The children of node `i` among `n` nodes.
pub fn children(i: usize, n: usize, degree: usize) -> Vec<usize> {
    if degree == 0 {
        return Vec::new();
    }
    (i * degree + 1..=i * degree + degree)
        .filter(|c| *c < n)
        .collect()
}

/// Hops from the root to the deepest of `n` nodes.
pub fn height(n: usize, degree: usize) -> usize {
    (0..n)
        .map(|mut i| {
            let mut h = 0;
            while let Some(p) = parent(i, degree) {
                i = p;
                h += 1;
            }
            h
        })
        .max()
        .unwrap_or(0)
}

/// What one node does.
#[derive(Debug, Clone)]
pub struct FanoutSpec {
    /// The inputs on the shared file system (a file or a folder).
    pub src: PathBuf,
    /// Where this node's copy goes (as `stage SRC DST` has it), on the node itself.
    pub dst: PathBuf,
    /// The job's nodes, in the same order on every node: a host name or address, optionally
    /// with `:PORT`, or `NAME@ADDR[:PORT]`. Node 0 reads the shared file system.
    pub nodes: Vec<String>,
    /// This node's index in `nodes`.
    pub me: usize,
    /// Port of the nodes that name none.
    pub port: u16,
    /// Children per node (0: no tree, every node reads the shared file system).
    pub degree: usize,
    /// Bound on each wait (see the module's documentation).
    pub timeout: Duration,
    /// Where `dst` shows inside a tierstack mount: each copy is read back there once.
    pub read_back: Option<PathBuf>,
}

/// One file this node copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Where the copy is.
    pub dst: PathBuf,
    /// Its path below the stage's DST (empty when DST is the file itself).
    pub rel: PathBuf,
    /// Its length.
    pub len: u64,
    /// The source's modification time, which the copy has (ns since the epoch).
    pub mtime_ns: i64,
    /// The source's permission bits, which the copy has.
    pub mode: u32,
    /// The xxh3-64 of its bytes (compared at every hop).
    pub xxh3: u64,
}

/// A modification time in ns since the epoch (times before it are negative).
pub fn time_ns(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

/// What one node did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FanoutReport {
    /// Files copied.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes received from the parent (a file whose checksum differed counts, and is read
    /// again from the shared file system).
    pub from_parent: u64,
    /// Bytes read from the shared file system.
    pub from_shared: u64,
    /// Bytes sent to children (all children together).
    pub forwarded: u64,
    /// The parent's name (None for the root and without a tree).
    pub parent: Option<String>,
    /// Children that connected and were served to the end.
    pub children_served: Vec<String>,
    /// Children expected but dropped (never connected, stalled or went away), with why.
    pub children_dropped: Vec<String>,
    /// Why this node read from the shared file system instead of its parent (None: it did
    /// not, or it is the root).
    pub fell_back: Option<String>,
    /// Bytes read back through the mount (0 without `read_back`).
    pub read_back_bytes: u64,
    /// Seconds the copy took, and the read back.
    pub copy_s: f64,
    /// Seconds of the read back through the mount.
    pub read_back_s: f64,
    /// Every file copied, in the plan's order.
    pub copies: Vec<Copied>,
}

fn refused(msg: String) -> StageError {
    StageError::Refused(msg)
}

/// The address part of a node list entry: `NAME@ADDR` names a node whose address differs
/// from its name (SLURM's NodeName and NodeAddr), else the entry is both.
pub fn entry_addr(entry: &str) -> &str {
    entry.split_once('@').map_or(entry, |(_, a)| a)
}

/// The name part of a node list entry (see [`entry_addr`]).
pub fn entry_name(entry: &str) -> &str {
    entry.split_once('@').map_or(entry, |(n, _)| n)
}

/// The address of node `i`: its entry with `:PORT`, else with `port`.
fn addr_of(spec: &FanoutSpec, i: usize) -> Result<SocketAddr, StageError> {
    let name = entry_addr(&spec.nodes[i]);
    let with_port = if name
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && !h.ends_with(':') && p.parse::<u16>().is_ok())
    {
        name.to_string()
    } else {
        format!("{name}:{}", spec.port)
    };
    with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            refused(format!(
                "stage --fanout: node {name} has no address: check the node list and /etc/hosts"
            ))
        })
}

/// The plan every node makes: folders and regular files only, files sorted by source path.
fn fanout_plan(src: &Path, dst: &Path) -> Result<Plan, StageError> {
    let mut plan = plan_paths(src, dst)?;
    let other = plan
        .links
        .first()
        .map(|l| (l.dst.clone(), "a symbolic link"))
        .or_else(|| {
            plan.hardlinks
                .first()
                .map(|h| (h.file.src.clone(), "a hard link"))
        })
        .or_else(|| {
            plan.specials
                .first()
                .map(|s| (s.src.clone(), s.kind.name()))
        });
    if let Some((p, what)) = other {
        return Err(refused(format!(
            "stage --fanout copies folders and regular files only, and {} is {what}: stage these inputs without --fanout",
            p.display()
        )));
    }
    plan.files.sort_by(|a, b| a.src.cmp(&b.src));
    Ok(plan)
}

/// A digest of what the plan copies (sources, sizes, times), so that nodes whose views of
/// the shared file system differ do not exchange bytes.
fn plan_digest(plan: &Plan) -> u64 {
    let mut h = Xxh3::new();
    for f in &plan.files {
        h.update(f.src.as_os_str().as_encoded_bytes());
        h.update(&[0]);
        h.update(&f.len.to_le_bytes());
        let t = f
            .mtime
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        h.update(&t.to_le_bytes());
    }
    h.digest()
}

/// Where this node's bytes come from.
enum Source {
    Parent(TcpStream),
    Shared,
}

/// A child being fed.
struct Child {
    name: String,
    sock: TcpStream,
}

/// Connects to the parent (retrying until `timeout`), says hello, awaits its answer.
fn connect_parent(
    spec: &FanoutSpec,
    p: usize,
    digest: u64,
    io_bound: Duration,
) -> Result<TcpStream, String> {
    let addr = addr_of(spec, p).map_err(|e| e.to_string())?;
    let end = Instant::now() + spec.timeout;
    let mut sock = loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "no connection to {} within {} s",
                spec.nodes[p],
                spec.timeout.as_secs()
            ));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let say = |s: &mut TcpStream| -> io::Result<u8> {
        s.set_read_timeout(Some(io_bound))?;
        s.set_write_timeout(Some(io_bound))?;
        s.set_nodelay(true)?;
        let mut hello = HELLO.to_vec();
        hello.extend_from_slice(&digest.to_le_bytes());
        hello.extend_from_slice(&(spec.me as u64).to_le_bytes());
        s.write_all(&hello)?;
        let mut ok = [0u8];
        s.read_exact(&mut ok)?;
        Ok(ok[0])
    };
    match say(&mut sock) {
        Ok(1) => Ok(sock),
        Ok(_) => Err(format!(
            "{} sees other inputs (the shared file system changed between the nodes' looks)",
            spec.nodes[p]
        )),
        Err(e) => Err(format!("{} did not answer: {e}", spec.nodes[p])),
    }
}

/// Accepts this node's children until all came or `timeout` passed.
fn gather_children(
    spec: &FanoutSpec,
    listener: &TcpListener,
    want: &[usize],
    digest: u64,
    io_bound: Duration,
    report: &mut FanoutReport,
) -> Vec<Child> {
    let mut got: Vec<(usize, TcpStream)> = Vec::new();
    let end = Instant::now() + spec.timeout;
    if listener.set_nonblocking(true).is_err() {
        report
            .children_dropped
            .extend(want.iter().map(|c| format!("{}: listener", spec.nodes[*c])));
        return Vec::new();
    }
    while got.len() < want.len() && Instant::now() < end {
        match listener.accept() {
            Ok((mut s, _)) => {
                let hello = (|| -> io::Result<Option<usize>> {
                    s.set_nonblocking(false)?;
                    s.set_read_timeout(Some(spec.timeout))?;
                    s.set_write_timeout(Some(io_bound))?;
                    s.set_nodelay(true)?;
                    let mut b = [0u8; 24];
                    s.read_exact(&mut b)?;
                    let d = u64::from_le_bytes(b[8..16].try_into().unwrap_or_default());
                    let who = u64::from_le_bytes(b[16..24].try_into().unwrap_or_default()) as usize;
                    let known = &b[..8] == HELLO
                        && want.contains(&who)
                        && !got.iter().any(|(c, _)| *c == who);
                    if !known {
                        return Ok(None);
                    }
                    s.write_all(&[u8::from(d == digest)])?;
                    s.set_read_timeout(Some(io_bound))?;
                    Ok((d == digest).then_some(who))
                })();
                if let Ok(Some(who)) = hello {
                    got.push((who, s));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    for c in want {
        if !got.iter().any(|(g, _)| g == c) {
            report.children_dropped.push(format!(
                "{}: did not connect within {} s",
                spec.nodes[*c],
                spec.timeout.as_secs()
            ));
        }
    }
    got.sort_by_key(|(c, _)| *c);
    got.into_iter()
        .map(|(c, sock)| Child {
            name: spec.nodes[c].clone(),
            sock,
        })
        .collect()
}

/// Sends `buf` to every child; a child that fails is dropped with why.
fn forward(children: &mut Vec<Child>, buf: &[u8], report: &mut FanoutReport) {
    children.retain_mut(|c| match c.sock.write_all(buf) {
        Ok(()) => {
            report.forwarded += buf.len() as u64;
            true
        }
        Err(e) => {
            report.children_dropped.push(format!("{}: {e}", c.name));
            false
        }
    });
}

/// Reads `buf.len()` bytes of `job` at `off` from the shared file system.
fn read_shared(
    src: &mut Option<File>,
    job: &FileJob,
    off: u64,
    buf: &mut [u8],
) -> Result<(), StageError> {
    if src.is_none() {
        *src = Some(File::open(&job.src).map_err(io_err("open", &job.src))?);
    }
    let Some(f) = src.as_ref() else {
        return Ok(());
    };
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => {
                return Err(refused(format!(
                    "{} shrank while it was fanned out: run the stage again once it is complete",
                    job.src.display()
                )))
            }
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("read", &job.src)(e).into()),
        }
    }
    Ok(())
}

/// Switches to the shared file system, recording why (the first reason only).
fn fall_back(source: &mut Source, report: &mut FanoutReport, why: String) {
    if let Source::Parent(_) = source {
        report.fell_back.get_or_insert(why);
        *source = Source::Shared;
    }
}

/// Copies one file: from the source, to its temporary name and to the children; returns
/// its xxh3.
fn copy_one(
    job: &FileJob,
    source: &mut Source,
    children: &mut Vec<Child>,
    report: &mut FanoutReport,
    buf: &mut [u8],
) -> Result<u64, StageError> {
    let (out, tmp, guard) = create_tmp(job)?;
    let mut src: Option<File> = None;
    let mut h = Xxh3::new();
    let mut off = 0u64;
    while off < job.len {
        let n = (job.len - off).min(CHUNK as u64) as usize;
        let b = &mut buf[..n];
        let got = match source {
            Source::Parent(s) => s.read_exact(b).map_err(|e| e.to_string()),
            Source::Shared => Err(String::new()),
        };
        match got {
            Ok(()) => report.from_parent += n as u64,
            Err(e) => {
                if !e.is_empty() {
                    fall_back(source, report, format!("reading from the parent: {e}"));
                }
                read_shared(&mut src, job, off, b)?;
                report.from_shared += n as u64;
            }
        }
        out.write_all_at(b, off).map_err(io_err("write", &tmp))?;
        h.update(b);
        forward(children, b, report);
        off += n as u64;
    }
    let mine = h.digest();
    if let Source::Parent(s) = source {
        let mut t = [0u8; 8];
        match s.read_exact(&mut t) {
            Ok(()) if u64::from_le_bytes(t) == mine => {}
            Ok(()) => {
                // Bytes damaged on the way: this file again from the shared file system;
                // the children got the same damaged bytes, so they go their own way.
                fall_back(
                    source,
                    report,
                    format!("{}: checksum differs from the parent's", job.src.display()),
                );
                for c in children.drain(..) {
                    report
                        .children_dropped
                        .push(format!("{}: damaged bytes upstream", c.name));
                }
                drop(out);
                drop(guard);
                return copy_one(job, source, children, report, buf);
            }
            Err(e) => fall_back(source, report, format!("reading from the parent: {e}")),
        }
    }
    forward(children, &mine.to_le_bytes(), report);
    finish_tmp(out, &tmp, guard, job)?;
    report.files += 1;
    report.bytes += job.len;
    Ok(mine)
}

/// Reads `path` whole (retrying a missing name for `wait`: a mount shows names that appeared
/// in its BACKING within its coherence interval) and returns its length and xxh3.
pub fn read_through(path: &Path, wait: Duration) -> Result<(u64, u64), StageError> {
    let end = Instant::now() + wait;
    let mut f = loop {
        match File::open(path) {
            Ok(f) => break f,
            Err(e) if e.kind() == io::ErrorKind::NotFound && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(io_err("read back", path)(e).into()),
        }
    };
    let mut h = Xxh3::new();
    let mut buf = vec![0u8; CHUNK];
    let mut n = 0u64;
    loop {
        let k = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err("read back", path)(e).into()),
        };
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((n, h.digest()))
}

/// `root` joined with `rel`, or `root` itself for an empty `rel` (a stage of one file).
pub fn below(root: &Path, rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

/// Whether the file at `path` has `c`'s size and modification time (one `stat`; a missing
/// file has not).
pub fn holds(path: &Path, c: &Copied) -> bool {
    fs::metadata(path).is_ok_and(|m| {
        m.is_file() && m.len() == c.len && m.modified().ok().map(time_ns) == Some(c.mtime_ns)
    })
}

/// Writes the copy `c` to `to` (temporary name, its mode and mtime, fsync, rename), unless
/// `to` holds it already (same size and mtime): the root of a fan-out into buffers whose
/// BACKING is the shared file system puts each input there once, so that every node's copy
/// is the clean cache of a file in BACKING. Returns whether it wrote.
pub fn publish(c: &Copied, to: &Path) -> Result<bool, StageError> {
    if holds(to, c) {
        return Ok(false);
    }
    if let Some(d) = to.parent() {
        fs::create_dir_all(d).map_err(io_err("create the directory", d))?;
    }
    let job = FileJob {
        src: c.dst.clone(),
        dst: to.to_path_buf(),
        len: c.len,
        mode: c.mode,
        mtime: u64::try_from(c.mtime_ns)
            .ok()
            .map(|n| std::time::UNIX_EPOCH + Duration::from_nanos(n)),
        link_id: None,
    };
    let s = super::copy::copy_file(
        &job,
        true,
        &|_| {},
        &std::sync::atomic::AtomicBool::new(false),
    )?;
    if s.hash != Some(c.xxh3) {
        return Err(StageError::Verify {
            dst: c.dst.clone(),
            want: c.xxh3,
            got: s.hash.unwrap_or_default(),
        });
    }
    Ok(true)
}

/// Runs this node's part of the fan-out.
pub fn run(spec: &FanoutSpec) -> Result<FanoutReport, StageError> {
    if spec.me >= spec.nodes.len() {
        return Err(refused(format!(
            "stage --fanout: this node is not in the node list ({}): give --fanout-me NAME",
            spec.nodes.join(",")
        )));
    }
    let plan = fanout_plan(&spec.src, &spec.dst)?;
    let digest = plan_digest(&plan);
    let n = spec.nodes.len();
    let io_bound = spec.timeout * (height(n, spec.degree) as u32 + 1);
    let mut report = FanoutReport::default();
    let t0 = Instant::now();
    let kids = children(spec.me, n, spec.degree);
    // Listen first, so that children may connect while this node reaches its parent.
    let listener = if kids.is_empty() {
        None
    } else {
        let mut a = addr_of(spec, spec.me)?;
        a.set_ip(std::net::Ipv4Addr::UNSPECIFIED.into());
        Some(TcpListener::bind(a).map_err(|e| {
            refused(format!(
                "stage --fanout: cannot listen on port {}: {e}: give another --fanout-port",
                a.port()
            ))
        })?)
    };
    let mut source = Source::Shared;
    if let Some(p) = parent(spec.me, spec.degree) {
        report.parent = Some(spec.nodes[p].clone());
        match connect_parent(spec, p, digest, io_bound) {
            Ok(s) => source = Source::Parent(s),
            Err(why) => report.fell_back = Some(why),
        }
    }
    let mut feed = match &listener {
        Some(l) => gather_children(spec, l, &kids, digest, io_bound, &mut report),
        None => Vec::new(),
    };
    drop(listener);
    for d in &plan.dirs {
        fs::create_dir_all(&d.dst).map_err(io_err("create the directory", &d.dst))?;
    }
    let mut buf = vec![0u8; CHUNK];
    for job in &plan.files {
        let xxh3 = copy_one(job, &mut source, &mut feed, &mut report, &mut buf)?;
        let mtime_ns = match job.mtime {
            Some(t) => time_ns(t),
            None => fs::metadata(&job.dst)
                .and_then(|m| m.modified())
                .map(time_ns)
                .map_err(io_err("stat", &job.dst))?,
        };
        report.copies.push(Copied {
            dst: job.dst.clone(),
            rel: job
                .dst
                .strip_prefix(&spec.dst)
                .unwrap_or(Path::new(""))
                .to_path_buf(),
            len: job.len,
            mtime_ns,
            mode: job.mode,
            xxh3,
        });
    }
    for c in &feed {
        let _ = c.sock.shutdown(std::net::Shutdown::Write);
    }
    report
        .children_served
        .extend(feed.iter().map(|c| c.name.clone()));
    for d in plan.dirs.iter().rev() {
        if let Some(m) = d.mode {
            fs::set_permissions(&d.dst, fs::Permissions::from_mode(m))
                .map_err(io_err("set the mode of", &d.dst))?;
        }
    }
    report.copy_s = t0.elapsed().as_secs_f64();
    if let Some(rb) = &spec.read_back {
        let t1 = Instant::now();
        for c in &report.copies {
            let at = below(rb, &c.rel);
            let (len, got) = read_through(&at, Duration::from_secs(5))?;
            if got != c.xxh3 || len != c.len {
                return Err(StageError::Verify {
                    dst: at,
                    want: c.xxh3,
                    got,
                });
            }
            report.read_back_bytes += len;
        }
        report.read_back_s = t1.elapsed().as_secs_f64();
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_has_every_node_once_below_the_root() {
        for degree in 1..5 {
            for n in 1..40 {
                let mut seen = vec![0; n];
                for i in 0..n {
                    for c in children(i, n, degree) {
                        assert_eq!(parent(c, degree), Some(i));
                        seen[c] += 1;
                    }
                }
                assert_eq!(seen[0], 0);
                assert!(seen[1..].iter().all(|s| *s == 1), "n {n} degree {degree}");
            }
        }
        assert_eq!(height(1, 2), 0);
        assert_eq!(height(3, 2), 1);
        assert_eq!(height(4, 2), 2);
        assert_eq!(height(7, 2), 2);
        assert_eq!(height(8, 2), 3);
        assert_eq!(height(4, 1), 3);
        assert_eq!(parent(3, 0), None);
        assert!(children(0, 8, 0).is_empty());
    }

    fn spec(src: &Path, dst: &Path, me: usize, ports: &[u16], timeout: u64) -> FanoutSpec {
        FanoutSpec {
            src: src.to_path_buf(),
            dst: dst.to_path_buf(),
            nodes: ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
            me,
            port: 1,
            degree: 1,
            timeout: Duration::from_secs(timeout),
            read_back: None,
        }
    }

    fn free_ports(n: usize) -> Vec<u16> {
        let ls: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
            .collect();
        ls.iter()
            .map(|l| l.local_addr().expect("addr").port())
            .collect()
    }

    fn inputs(t: &Path) -> PathBuf {
        let src = t.join("src");
        fs::create_dir_all(src.join("sub")).expect("mkdir");
        let big: Vec<u8> = (0..3 * CHUNK + 17).map(|i| (i * 7 % 251) as u8).collect();
        fs::write(src.join("sub/big"), &big).expect("write");
        fs::write(src.join("a"), b"hello").expect("write");
        fs::write(src.join("empty"), b"").expect("write");
        src
    }

    #[test]
    fn a_chain_of_three_reads_the_inputs_once() {
        let t = tempfile::tempdir().expect("tmp");
        let src = inputs(t.path());
        let ports = free_ports(3);
        let hs: Vec<_> = (0..3)
            .map(|i| {
                let s = spec(&src, &t.path().join(format!("dst{i}")), i, &ports, 10);
                std::thread::spawn(move || run(&s))
            })
            .collect();
        let rs: Vec<FanoutReport> = hs
            .into_iter()
            .map(|h| h.join().expect("join").expect("run"))
            .collect();
        let total = (3 * CHUNK + 17 + 5) as u64;
        assert_eq!(rs[0].from_shared, total);
        for (i, r) in rs.iter().enumerate() {
            assert_eq!(r.files, 3);
            assert_eq!(r.bytes, total);
            assert!(r.fell_back.is_none(), "{r:?}");
            if i > 0 {
                assert_eq!(r.from_shared, 0, "{r:?}");
                assert_eq!(r.from_parent, total);
            }
            let d = t.path().join(format!("dst{i}"));
            assert_eq!(
                fs::read(d.join("sub/big")).expect("read"),
                fs::read(src.join("sub/big")).expect("read")
            );
            assert_eq!(
                fs::metadata(d.join("a")).expect("meta").modified().ok(),
                fs::metadata(src.join("a")).expect("meta").modified().ok()
            );
        }
        assert_eq!(
            rs[0].children_served,
            vec![format!("127.0.0.1:{}", ports[1])]
        );
    }

    #[test]
    fn a_dead_parent_makes_its_child_read_the_shared_system_within_the_bound() {
        let t = tempfile::tempdir().expect("tmp");
        let src = inputs(t.path());
        let ports = free_ports(3);
        // Node 1 never runs: node 0 drops it, node 2 falls back.
        let s0 = spec(&src, &t.path().join("dst0"), 0, &ports, 1);
        let s2 = spec(&src, &t.path().join("dst2"), 2, &ports, 1);
        let t0 = Instant::now();
        let h0 = std::thread::spawn(move || run(&s0));
        let r2 = run(&s2).expect("node 2");
        let r0 = h0.join().expect("join").expect("node 0");
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert!(r2.fell_back.is_some(), "{r2:?}");
        assert_eq!(r2.from_parent, 0);
        assert_eq!(r0.children_dropped.len(), 1, "{r0:?}");
        assert_eq!(
            fs::read(t.path().join("dst2/sub/big")).expect("read"),
            fs::read(src.join("sub/big")).expect("read")
        );
    }

    /// A parent that answers the hello, sends `payload`, then closes (or, with `stall`,
    /// keeps the connection open and silent for `stall` first).
    fn fake_parent(
        port: u16,
        payload: Vec<u8>,
        stall: Option<Duration>,
    ) -> std::thread::JoinHandle<()> {
        let l = TcpListener::bind(("127.0.0.1", port)).expect("bind");
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            let mut hello = [0u8; 24];
            s.read_exact(&mut hello).expect("hello");
            s.write_all(&[1]).expect("answer");
            let _ = s.write_all(&payload);
            if let Some(d) = stall {
                std::thread::sleep(d);
            }
        })
    }

    #[test]
    fn a_parent_that_dies_stalls_or_garbles_mid_stream_is_left_for_the_shared_system() {
        let t = tempfile::tempdir().expect("tmp");
        let src = inputs(t.path());
        // What a good parent sends (files sorted: a, empty, sub/big), cut in the middle of
        // sub/big.
        let mut good = Vec::new();
        for f in ["a", "empty"] {
            let b = fs::read(src.join(f)).expect("read");
            good.extend_from_slice(&b);
            good.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&b).to_le_bytes());
        }
        let cut = good.len() + CHUNK + 100;
        good.extend_from_slice(&fs::read(src.join("sub/big")).expect("read"));
        good.truncate(cut);
        let cases = [
            ("dies", good.clone(), None, CHUNK as u64 + 5),
            (
                "stalls",
                good,
                Some(Duration::from_secs(6)),
                CHUNK as u64 + 5,
            ),
            // The 5 garbled bytes of `a` were received (counted), then `a` read again.
            ("garbles", vec![0xAA; CHUNK], None, 5),
        ];
        for (what, payload, stall, from_parent) in cases {
            let ports = free_ports(2);
            let parent = fake_parent(ports[0], payload, stall);
            let dst = t.path().join(format!("dst-{what}"));
            let s1 = spec(&src, &dst, 1, &ports, 1);
            let t0 = Instant::now();
            let r = run(&s1).expect("node 1");
            // Bound: a stall is noticed after timeout x (height + 1) = 2 s.
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{what}: {:?}",
                t0.elapsed()
            );
            assert!(r.fell_back.is_some(), "{what}: {r:?}");
            // Whole chunks from the parent are kept; a partial chunk is read again.
            assert_eq!(r.from_parent, from_parent, "{what}: {r:?}");
            for f in ["a", "empty", "sub/big"] {
                assert_eq!(
                    fs::read(dst.join(f)).expect("read"),
                    fs::read(src.join(f)).expect("read"),
                    "{f} when the parent {what}"
                );
            }
            let _ = parent.join();
        }
    }

    #[test]
    fn an_entry_may_name_its_address_apart() {
        assert_eq!(entry_addr("n1@10.0.0.1:7711"), "10.0.0.1:7711");
        assert_eq!(entry_name("n1@10.0.0.1:7711"), "n1");
        assert_eq!(entry_addr("node3"), "node3");
        assert_eq!(entry_name("node3:7711"), "node3:7711");
        let mut s = spec(Path::new("/s"), Path::new("/d"), 0, &[7000], 1);
        s.nodes = vec!["n1@127.0.0.1:7001".into(), "n2@127.0.0.1".into()];
        assert_eq!(addr_of(&s, 0).expect("addr").port(), 7001);
        assert_eq!(addr_of(&s, 1).expect("addr").port(), 1);
    }

    #[test]
    fn links_are_refused_with_the_fix() {
        let t = tempfile::tempdir().expect("tmp");
        let src = inputs(t.path());
        std::os::unix::fs::symlink("a", src.join("ln")).expect("symlink");
        let e = fanout_plan(&src, &t.path().join("d")).expect_err("refused");
        assert!(e.to_string().contains("without --fanout"), "{e}");
    }
}
