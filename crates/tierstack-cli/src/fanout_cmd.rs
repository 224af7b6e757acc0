//! `tierstack stage in SRC DST --fanout NODES`: this node's part of a stage-in fan-out
//! (`tierstack_stage::fanout`). DST is where the job sees its inputs, inside a tierstack mount
//! whose BACKING is on the node itself (a node-local buffer without `stage_out=`): the copy
//! goes into BACKING at DST's place and is read back through the mount, so the buffer holds
//! it as clean cache of a file already in BACKING, which is never drained anywhere.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;

use tierstack_stage::fanout;

/// The fan-out flags of `stage in`.
#[derive(Args, Default)]
pub struct FanoutArgs {
    /// Stage in with the other nodes of the job: NODES (host names or addresses, optionally
    /// with :PORT, in the same order on every node) run the same command at once; the first
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
    let Some(me) = nodes
        .iter()
        .position(|n| n == &me_name || n.rsplit_once(':').is_some_and(|(h, _)| h == me_name))
    else {
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
    if SHARED_FS
        .iter()
        .any(|s| kind == *s || kind.starts_with("fuse."))
    {
        usage_bail!(
            "the buffer at {} is over {} ({kind}), a shared file system: --fanout copies into BACKING, so it needs a node-local BACKING (a node_local buffer without stage_out=); stage in without --fanout",
            mnt.display(),
            st.backing.display()
        );
    }
    // The mount point as mountinfo names it is canonical already.
    let rel = real_dst.strip_prefix(&mnt).unwrap_or(Path::new(""));
    let mut into = st.backing.join(rel).into_os_string();
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
        read_back: Some(real_dst),
    };
    let t = std::time::Instant::now();
    let r = fanout::run(&spec)?;
    let secs = t.elapsed().as_secs_f64();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "direction": "in",
                "fanout": true,
                "node": spec.nodes[me],
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
    }
    Ok(())
}
