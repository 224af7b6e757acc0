//! `tierstack stage in SRC DST --fanout NODES`: this node's part of a stage-in fan-out
//! (`tierstack_stage::fanout`). DST is where the job sees its inputs, inside a tierstack mount
//! whose BACKING is on the node itself (a node-local buffer without `stage_out=`): the copy
//! goes into BACKING at DST's place and is read back through the mount, so the buffer holds
//! it as clean cache of a file already in BACKING, which is never drained anywhere.
//!
//! With `--fanout-spool DIR` (a node-local folder; required where BACKING is a shared file
//! system, as a node-local buffer with `stage_out=` has it) the copy goes into DIR instead;
//! node 0 puts into BACKING each input BACKING does not hold yet as it is (once, for every
//! node), and every node has its mount adopt its copies (`tierstack_fs::mount::adopt`): clean
//! cache of BACKING's files, nothing written to BACKING by the other nodes, nothing drained.
//! A copy the mount refuses is left to BACKING: read back through the mount (from BACKING),
//! or, where BACKING never got the file, copied into the mount (a change, drained there).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;

use tierstack_fs::mount::AdoptAnswer;
use tierstack_stage::fanout;

/// The fan-out flags of `stage in`.
#[derive(Args, Default)]
pub struct FanoutArgs {
    /// Stage in with the other nodes of the job: NODES (host names or addresses, optionally
    /// with :PORT, or NAME@ADDR[:PORT]; in the same order on every node) run the same command at once; the first
    /// reads SRC from the shared file system and the bytes go node to node in a tree. DST
    /// must be inside a tierstack mount whose BACKING is on this node.
    #[arg(long, value_name = "NODES", value_delimiter = ',')]
    pub fanout: Option<Vec<String>>,
    /// This node's name in NODES (default: its host name).
    #[arg(long, value_name = "NAME", requires = "fanout")]
    pub fanout_me: Option<String>,
    /// TCP port the nodes listen on for their children.
    #[arg(long, default_value_t = 7711, requires = "fanout")]
    pub fanout_port: u16,
    /// Children per node in the tree (0: no tree, every node reads SRC itself).
    #[arg(long, default_value_t = 2, requires = "fanout")]
    pub fanout_degree: usize,
    /// Bound on each wait of the fan-out (reaching the parent, gathering the children; a
    /// stalled transfer waits this times the tree's height + 1); a node whose parent does
    /// not answer in time reads SRC from the shared file system itself.
    #[arg(long, default_value = "20s", requires = "fanout")]
    pub fanout_timeout: String,
    /// A node-local folder for this node's copy, which the mount then adopts as clean cache
    /// of BACKING's files (node 0 writes into BACKING, once, what is not there yet): needed
    /// where BACKING is a shared file system. The copies are removed from DIR at the end.
    #[arg(long, value_name = "DIR", requires = "fanout")]
    pub fanout_spool: Option<PathBuf>,
}

/// `p` with its deepest existing part made canonical (the rest, not yet made, joined on).
fn real_path(p: &Path) -> Option<PathBuf> {
    let mut at = p.to_path_buf();
    let mut rest = PathBuf::new();
    loop {
        if let Ok(c) = std::fs::canonicalize(&at) {
            return Some(c.join(&rest));
        }
        let name = at.file_name()?.to_owned();
        rest = Path::new(&name).join(&rest);
        at = at.parent()?.to_path_buf();
    }
}

/// The tierstack mount that holds `real` (a canonical path): its mount point.
fn mount_holding(real: &Path) -> Option<PathBuf> {
    tierstack_common::mounts::mounts()
        .into_iter()
        .filter(|m| m.source.starts_with("tierstack:") && real.starts_with(&m.point))
        .max_by_key(|m| m.point.as_os_str().len())
        .map(|m| m.point)
}

/// File systems a site shares between nodes: a fan-out's copy must not go there.
const SHARED_FS: &[&str] = &[
    "fuse",
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "cifs",
    "smb3",
    "ceph",
    "beegfs",
    "glusterfs",
];

pub fn stage_in(src: &Path, dst: &Path, f: &FanoutArgs, json: bool) -> Result<()> {
    let Some(nodes) = f.fanout.clone().filter(|n| !n.is_empty()) else {
        usage_bail!("--fanout needs the job's nodes, e.g. --fanout node1,node2,node3");
    };
    let timeout = tierstack_common::parse_duration(&f.fanout_timeout)
        .map_err(|e| crate::usage(format!("--fanout-timeout: {e}")))?;
    if timeout.is_zero() {
        usage_bail!("--fanout-timeout 0: give a bound such as 20s");
    }
    let me_name = match &f.fanout_me {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .context("cannot read this node's host name: give --fanout-me")?,
    };
    let Some(me) = nodes.iter().position(|n| {
        n == &me_name
            || fanout::entry_name(n) == me_name
            || n.rsplit_once(':').is_some_and(|(h, _)| h == me_name)
    }) else {
        usage_bail!(
            "this node ({me_name}) is not in --fanout {}: give --fanout-me with its name there",
            nodes.join(",")
        );
    };
    let dst_abs = std::path::absolute(dst).context("cannot make DST absolute")?;
    let real_dst = real_path(&dst_abs).unwrap_or(dst_abs);
    let Some(mnt) = mount_holding(&real_dst) else {
        usage_bail!(
            "{} is not inside a tierstack mount: --fanout stages into a node-local buffer; give a path under its mount point",
            dst.display()
        );
    };
    let st = tierstack_fs::mount::status(&mnt)
        .with_context(|| format!("cannot ask the mount at {} for its BACKING", mnt.display()))?;
    let kind = tierstack_common::mounts::fs_type_of(&st.backing).unwrap_or_default();
    if f.fanout_spool.is_none()
        && SHARED_FS
            .iter()
            .any(|s| kind == *s || kind.starts_with("fuse."))
    {
        usage_bail!(
            "the buffer at {} is over {} ({kind}), a shared file system: --fanout would copy into BACKING; give --fanout-spool DIR (a node-local folder) so the mount adopts the copies, or stage in without --fanout",
            mnt.display(),
            st.backing.display()
        );
    }
    // The mount point as mountinfo names it is canonical already.
    let rel = real_dst.strip_prefix(&mnt).unwrap_or(Path::new(""));
    let mut into = f
        .fanout_spool
        .as_deref()
        .unwrap_or(&st.backing)
        .join(rel)
        .into_os_string();
    if dst.as_os_str().as_encoded_bytes().last() == Some(&b'/') {
        into.push("/");
    }
    let spec = fanout::FanoutSpec {
        src: src.to_path_buf(),
        dst: PathBuf::from(into),
        nodes,
        me,
        port: f.fanout_port,
        degree: f.fanout_degree,
        timeout,
        read_back: f.fanout_spool.is_none().then(|| real_dst.clone()),
    };
    let t = std::time::Instant::now();
    let mut r = fanout::run(&spec)?;
    let adopted = match &f.fanout_spool {
        Some(spool) => {
            let at = Adopting {
                mnt: &mnt,
                rel_dst: rel,
                backing: &st.backing,
                root: me == 0,
                // Node 0 publishes once it has its own copy: long enough for it to reach its
                // parent-less end and write the inputs into BACKING.
                wait: timeout * (fanout::height(spec.nodes.len(), spec.degree) as u32 + 2),
            };
            let a = adopt_all(&at, &mut r);
            remove_spool(spool, &r.copies);
            a?
        }
        None => AdoptReport::default(),
    };
    let secs = t.elapsed().as_secs_f64();
    let node = &spec.nodes[me];
    print_report(node, &r, &adopted, f.fanout_spool.is_some(), secs, json);
    Ok(())
}

/// Prints what this node's part of the fan-out did (one JSON object with `json`).
fn print_report(
    node: &str,
    r: &fanout::FanoutReport,
    adopted: &AdoptReport,
    spooled: bool,
    secs: f64,
    json: bool,
) {
    if json {
        println!(
            "{}",
            serde_json::json!({
                "direction": "in",
                "fanout": true,
                "node": node,
                "parent": r.parent,
                "files": r.files,
                "bytes": r.bytes,
                "from_parent": r.from_parent,
                "from_shared": r.from_shared,
                "forwarded": r.forwarded,
                "children_served": r.children_served,
                "children_dropped": r.children_dropped,
                "fell_back": r.fell_back,
                "read_back_bytes": r.read_back_bytes,
                "copy_s": r.copy_s,
                "read_back_s": r.read_back_s,
                "adopted_files": adopted.files,
                "adopted_bytes": adopted.bytes,
                "published_files": adopted.published,
                "published_bytes": adopted.published_bytes,
                "left_to_backing": adopted.left_to_backing,
                "copied_into_mount": adopted.copied_into_mount,
                "refusals": adopted.refusals,
                "seconds": secs,
            })
        );
    } else {
        println!(
            "staged in {} files ({}) by fan-out in {secs:.2} s: {} from the shared file system, {} from {}, {} forwarded to {} node(s){}",
            r.files,
            tierstack_bench::fmt_size(r.bytes),
            tierstack_bench::fmt_size(r.from_shared),
            tierstack_bench::fmt_size(r.from_parent),
            r.parent.as_deref().unwrap_or("no parent"),
            tierstack_bench::fmt_size(r.forwarded),
            r.children_served.len(),
            r.fell_back
                .as_deref()
                .map(|w| format!("; read the shared file system itself: {w}"))
                .unwrap_or_default()
        );
        for d in &r.children_dropped {
            println!("dropped child {d}");
        }
        if spooled {
            println!(
                "adopted {} files ({}) as clean cache; wrote {} files into BACKING; {} left to BACKING, {} copied into the mount",
                adopted.files,
                tierstack_bench::fmt_size(adopted.bytes),
                adopted.published,
                adopted.left_to_backing,
                adopted.copied_into_mount
            );
            for w in &adopted.refusals {
                println!("not adopted: {w}");
            }
        }
    }
}

/// Where the copies of a spooled fan-out go.
struct Adopting<'a> {
    /// The mount point (canonical).
    mnt: &'a Path,
    /// DST below it.
    rel_dst: &'a Path,
    /// The mount's BACKING.
    backing: &'a Path,
    /// This node reads the shared file system (node 0): it writes into BACKING what is not
    /// there yet.
    root: bool,
    /// How long a copy whose file is not in BACKING (or the mount's view) yet is asked for
    /// again.
    wait: std::time::Duration,
}

/// What the mount did with the copies.
#[derive(Default)]
struct AdoptReport {
    files: u64,
    bytes: u64,
    published: u64,
    published_bytes: u64,
    /// Refused: the mount shows BACKING's file, read back through it.
    left_to_backing: u64,
    /// Refused with no such file in BACKING: copied into the mount (drained there).
    copied_into_mount: u64,
    refusals: Vec<String>,
}

/// Publishes (node 0) and has the mount adopt every copy; a refused copy is left to BACKING
/// (read back through the mount) or, where the mount shows no such file, copied into it.
fn adopt_all(at: &Adopting, r: &mut fanout::FanoutReport) -> Result<AdoptReport> {
    let mut out = AdoptReport::default();
    if at.root {
        for c in &r.copies {
            let to = fanout::below(&at.backing.join(at.rel_dst), &c.rel);
            if fanout::publish(c, &to)? {
                out.published += 1;
                out.published_bytes += c.len;
            }
        }
    }
    let end = std::time::Instant::now() + at.wait;
    for c in &r.copies {
        let rel = fanout::below(at.rel_dst, &c.rel);
        let claim = tierstack_fs::core::adopt::Claim {
            len: c.len,
            mtime_ns: c.mtime_ns,
            xxh3: c.xxh3,
        };
        let refused = loop {
            // Reading a large copy takes the daemon a while: a generous bound per request.
            let limit = std::time::Duration::from_secs(60 + (c.len >> 26));
            match tierstack_fs::mount::adopt(at.mnt, &rel, &c.dst, &claim, limit)
                .with_context(|| format!("cannot ask the mount at {} to adopt", at.mnt.display()))?
            {
                AdoptAnswer::Adopted(a) => {
                    out.files += 1;
                    out.bytes += a.bytes + a.held;
                    break None;
                }
                AdoptAnswer::Refused { retry: true, .. } if std::time::Instant::now() < end => {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                AdoptAnswer::Refused { why, kind, .. } => break Some((why, kind)),
            }
        };
        let Some((why, kind)) = refused else { continue };
        let in_mount = fanout::below(&at.mnt.join(at.rel_dst), &c.rel);
        match fallback(&kind) {
            Fallback::ReadThrough => {
                // The mount shows BACKING's file (perhaps newer than the copy): the job sees
                // that, cached by this read.
                fanout::read_through(&in_mount, std::time::Duration::ZERO)?;
                out.left_to_backing += 1;
            }
            Fallback::CopyIn => {
                // No such file in the mount (BACKING never got it), or the mount shows an
                // older version than BACKING's (which is the copy): the copy goes in as a
                // change, drained to BACKING as it is there.
                let _ = std::fs::remove_file(&in_mount);
                fanout::publish(c, &in_mount)?;
                out.copied_into_mount += 1;
            }
            Fallback::Leave => {}
        }
        out.refusals.push(why);
    }
    Ok(out)
}

/// What a node does with a copy its mount refused.
#[derive(Debug, PartialEq, Eq)]
enum Fallback {
    /// Read the file through the mount: it shows BACKING's (cached from there).
    ReadThrough,
    /// Copy it into the mount (a change, drained to BACKING).
    CopyIn,
    /// Leave the mount's own version (the job changed it).
    Leave,
}

/// The fallback for a refusal of kind `kind` (`tierstack_fs::core::adopt::Refusal::kind`).
fn fallback(kind: &str) -> Fallback {
    match kind {
        "missing" | "mount_stale" => Fallback::CopyIn,
        "changed" | "open_for_writing" => Fallback::Leave,
        _ => Fallback::ReadThrough,
    }
}

/// Removes the spooled copies and the folders they leave empty (up to the spool itself).
fn remove_spool(spool: &Path, copies: &[fanout::Copied]) {
    for c in copies {
        let _ = std::fs::remove_file(&c.dst);
        let mut d = c.dst.parent();
        while let Some(p) = d.filter(|p| p.starts_with(spool) && *p != spool) {
            if std::fs::remove_dir(p).is_err() {
                break;
            }
            d = p.parent();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_copy_is_left_to_backing_unless_the_mount_lacks_it_or_shows_it_stale() {
        assert_eq!(fallback("backing_differs"), Fallback::ReadThrough);
        assert_eq!(fallback("changed_meanwhile"), Fallback::ReadThrough);
        assert_eq!(fallback("not_owner"), Fallback::ReadThrough);
        assert_eq!(fallback("copy_differs"), Fallback::ReadThrough);
        assert_eq!(fallback("missing"), Fallback::CopyIn);
        assert_eq!(fallback("mount_stale"), Fallback::CopyIn);
        assert_eq!(fallback("changed"), Fallback::Leave);
        assert_eq!(fallback("open_for_writing"), Fallback::Leave);
    }
}
