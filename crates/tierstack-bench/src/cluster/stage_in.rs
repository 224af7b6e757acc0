//! `bench cluster --stage-in`: N nodes stage the same inputs (files in the shared file
//! system) into node-local tierstack buffers, once with every node reading the shared system
//! itself (`stage in --fanout ... --fanout-degree 0`, what N separate stage-ins cost it) and
//! once by fan-out (a tree of 2 over the test bed's bridge). For each: what the shared
//! system's chunkservers served (bytes sent over their links) and read from their disks
//! after a `drop-caches`, the stage-in's time, every node's copy checked through its mount
//! against the inputs' checksums, the buffers' dirty bytes and pending operations (0: the
//! inputs are clean cache), and the inputs in the shared system unchanged (sizes, mtimes, no
//! new name) after every buffer was unmounted.

use std::time::Instant;

use serde::Serialize;

use super::{step_err, Bed, ClusterError, ClusterSpec};

/// Checksums (and sizes, mtimes) of every file under a folder, as JSON: `{rel: [size,
/// mtime_ns, sha256]}`; with a fourth argument, only sizes and mtimes (no reads).
const SUMS_PY: &str = r#"
import os, sys, json, hashlib
base, res = sys.argv[1], sys.argv[2]
meta_only = len(sys.argv) > 3
out = {}
for d, dirs, files in os.walk(base):
    dirs.sort()
    for f in sorted(files):
        p = os.path.join(d, f)
        st = os.stat(p)
        h = ''
        if not meta_only:
            m = hashlib.sha256()
            with open(p, 'rb') as fh:
                while True:
                    b = fh.read(1 << 20)
                    if not b:
                        break
                    m.update(b)
            h = m.hexdigest()
        out[os.path.relpath(p, base)] = [st.st_size, st.st_mtime_ns, h]
json.dump(out, open(res, 'w'), sort_keys=True)
"#;

/// Writes the inputs: `files` files of `size` bytes of random data each.
const MAKE_PY: &str = r#"
import os, sys
base, files, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(base, exist_ok=True)
for k in range(files):
    with open(os.path.join(base, 'in%d' % k), 'wb') as f:
        left = size
        while left > 0:
            n = min(left, 1 << 20)
            f.write(os.urandom(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())
"#;

/// One way of staging in.
#[derive(Debug, Clone, Serialize)]
pub struct StageInMode {
    /// `each node reads` or `fan-out (tree of K)`.
    pub mode: String,
    /// Children per node (0: none, every node reads the shared system).
    pub degree: usize,
    /// Seconds from the start until every node's stage-in returned.
    pub stage_in_s: f64,
    /// Bytes the chunkservers sent over their links during the stage-in (reads served).
    pub shared_sent_bytes: u64,
    /// Bytes read from the chunkservers' disks during the stage-in (after a drop-caches).
    pub shared_disk_read_bytes: u64,
    /// `shared_sent_bytes` over the inputs' bytes.
    pub sent_x_inputs: f64,
    /// `shared_disk_read_bytes` over the inputs' bytes.
    pub disk_read_x_inputs: f64,
    /// Bytes the nodes read from the shared system, as their stage-ins counted them.
    pub nodes_from_shared: u64,
    /// Bytes the nodes received from other nodes.
    pub nodes_from_parent: u64,
    /// Nodes that read the shared system themselves after a fan-out failed them.
    pub fell_back: usize,
    /// Nodes whose copy, read through their mount, matches every input's checksum.
    pub nodes_identical: usize,
    /// Dirty bytes and pending operations of all buffers after the stage-in (0: clean).
    pub dirty_bytes: u64,
    /// Journal rows waiting to drain, all buffers.
    pub pending_ops: u64,
    /// The inputs in the shared system after the buffers were unmounted: same names, sizes
    /// and mtimes as before.
    pub inputs_unchanged: bool,
}

/// The stage-in run.
#[derive(Debug, Clone, Serialize)]
pub struct StageInReport {
    /// Input files.
    pub files: usize,
    /// Bytes of each.
    pub file_size: u64,
    /// All input bytes.
    pub input_bytes: u64,
    /// Each way.
    pub modes: Vec<StageInMode>,
}

fn read_json(path: &std::path::Path) -> Result<serde_json::Value, ClusterError> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| step_err(format!("reading {}", path.display()), "no result"))
}

/// Runs both ways on a test bed that is up.
pub(super) fn run(
    bed: &Bed,
    spec: &ClusterSpec,
    files: usize,
    size: u64,
) -> Result<StageInReport, ClusterError> {
    let work = bed.root.join("bench");
    let r = work.display().to_string();
    for (name, text) in [("sums.py", SUMS_PY), ("make.py", MAKE_PY)] {
        let p = work.join(name);
        std::fs::write(&p, text)
            .map_err(|e| step_err(format!("writing {}", p.display()), e.to_string()))?;
    }
    let broot = bed.root_arg();
    bed.exec(
        "writing the inputs into the shared system",
        "ctl",
        &format!("python3 {r}/make.py /mnt/pfs/inputs {files} {size} && python3 {r}/sums.py /mnt/pfs/inputs {r}/results/inputs.json"),
    )?;
    let want = read_json(&work.join("results/inputs.json"))?;
    bed.exec(
        "listing the inputs",
        "ctl",
        &format!("python3 {r}/sums.py /mnt/pfs/inputs {r}/results/inputs-meta0.json m"),
    )?;
    let input_bytes = files as u64 * size;
    let names: Vec<String> = (1..=spec.nodes).map(|i| format!("node{i}")).collect();
    let all = names.join(",");
    let exe = spec.exe.display();
    let mut modes = Vec::new();
    for (k, degree) in [0usize, 2].into_iter().enumerate() {
        let tag = format!("si{k}");
        let mnt = format!("/mnt/{tag}");
        bed.exec(
            "mounting a node-local buffer on every node",
            &all,
            &format!("mkdir -p {mnt} /var/tmp/{tag}/back && {exe} mount /var/tmp/{tag}/back {mnt} --dir /var/tmp/{tag}/tier"),
        )?;
        bed.run("dropping caches", &["drop-caches", "--root", &broot])?;
        let (sent0, read0) = (
            bed.io_stat("TESTBED_IO_SENT_BYTES"),
            bed.io_stat("TESTBED_IO_READ_BYTES"),
        );
        let t = Instant::now();
        bed.exec(
            "the stage-in on every node",
            &all,
            &format!(
                "{exe} stage in /mnt/pfs/inputs {mnt}/inputs/ --fanout {all} --fanout-degree {degree} --fanout-timeout 20s --json > {r}/results/{tag}-$(hostname).json"
            ),
        )?;
        let stage_in_s = t.elapsed().as_secs_f64();
        let sent = bed.io_stat("TESTBED_IO_SENT_BYTES").saturating_sub(sent0);
        let read = bed.io_stat("TESTBED_IO_READ_BYTES").saturating_sub(read0);
        // Each node's copy as its buffer shows it, and the buffer's state.
        bed.exec(
            "checking every node's copy through its mount",
            &all,
            &format!("python3 {r}/sums.py {mnt}/inputs {r}/results/{tag}-sums-$(hostname).json && {exe} status {mnt} --json > {r}/results/{tag}-status-$(hostname).json"),
        )?;
        let (mut from_shared, mut from_parent, mut fell_back, mut identical) = (0, 0, 0, 0);
        let (mut dirty_bytes, mut pending_ops) = (0, 0);
        for n in &names {
            let s = read_json(&work.join(format!("results/{tag}-{n}.json")))?;
            let u = |k: &str| s.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            from_shared += u("from_shared");
            from_parent += u("from_parent");
            fell_back += usize::from(s.get("fell_back").is_some_and(|x| !x.is_null()));
            let got = read_json(&work.join(format!("results/{tag}-sums-{n}.json")))?;
            let same = want.as_object().is_some_and(|w| {
                got.as_object().is_some_and(|g| {
                    w.len() == g.len()
                        && w.iter().all(|(name, v)| {
                            // Same size, same mtime (the copy keeps the source's), same bytes.
                            g.get(name).is_some_and(|x| x == v)
                        })
                })
            });
            identical += usize::from(same);
            let st = read_json(&work.join(format!("results/{tag}-status-{n}.json")))?;
            let u = |k: &str| st.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            dirty_bytes += u("dirty_bytes");
            pending_ops += u("pending_ops");
        }
        bed.exec(
            "tierstack umount on every node",
            &all,
            &format!("{exe} umount {mnt} --timeout 5m"),
        )?;
        bed.exec(
            "listing the inputs again",
            "ctl",
            &format!("python3 {r}/sums.py /mnt/pfs/inputs {r}/results/inputs-meta-{tag}.json m"),
        )?;
        let before = read_json(&work.join("results/inputs-meta0.json"))?;
        let after = read_json(&work.join(format!("results/inputs-meta-{tag}.json")))?;
        let x = |b: u64| b as f64 / input_bytes.max(1) as f64;
        modes.push(StageInMode {
            mode: if degree == 0 {
                "each node reads".into()
            } else {
                format!("fan-out (tree of {degree})")
            },
            degree,
            stage_in_s,
            shared_sent_bytes: sent,
            shared_disk_read_bytes: read,
            sent_x_inputs: x(sent),
            disk_read_x_inputs: x(read),
            nodes_from_shared: from_shared,
            nodes_from_parent: from_parent,
            fell_back,
            nodes_identical: identical,
            dirty_bytes,
            pending_ops,
            inputs_unchanged: before == after,
        });
    }
    Ok(StageInReport {
        files,
        file_size: size,
        input_bytes,
        modes,
    })
}

/// The stage-in part of the report as a table.
pub fn table(s: &StageInReport) -> String {
    let mut t = format!(
        "stage-in of {} files x {} ({} in all) into every node's buffer\n",
        s.files,
        crate::fmt_size(s.file_size),
        crate::fmt_size(s.input_bytes)
    );
    t += &format!(
        "{:<20} {:>10} {:>14} {:>8} {:>14} {:>8} {:>10} {:>6} {:>9}\n",
        "mode",
        "stage-in s",
        "shared sent",
        "x inputs",
        "disk read",
        "x inputs",
        "identical",
        "dirty",
        "inputs"
    );
    for m in &s.modes {
        t += &format!(
            "{:<20} {:>10.2} {:>14} {:>8.2} {:>14} {:>8.2} {:>10} {:>6} {:>9}\n",
            m.mode,
            m.stage_in_s,
            crate::fmt_size(m.shared_sent_bytes),
            m.sent_x_inputs,
            crate::fmt_size(m.shared_disk_read_bytes),
            m.disk_read_x_inputs,
            m.nodes_identical,
            m.dirty_bytes + m.pending_ops,
            if m.inputs_unchanged {
                "unchanged"
            } else {
                "CHANGED"
            }
        );
    }
    t
}
