//! `bench cluster --stage-in`: N nodes stage the same inputs (files in the shared file
//! system) into node-local tierstack buffers, once with every node reading the shared system
//! itself (`stage in --fanout ... --fanout-degree 0`, what N separate stage-ins cost it),
//! once by fan-out (a tree of 2 over the test bed's bridge), and once by the SLURM Prolog
//! itself (`tierstack slurm prolog` on every node, a stand-in `scontrol` answering for a
//! `node_local` job with `stage_out=` in the shared system: buffers over the shared system,
//! the copies adopted as clean cache, node 0 writing the inputs into stage_out once). For each: what the shared
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
    /// Bytes the buffers' drains wrote after a `drain --wait` (0: nothing of the inputs is
    /// drained).
    pub drained_bytes: u64,
    /// Files the buffers adopted as clean cache of BACKING's (the Prolog's way: BACKING is
    /// stage_out, on the shared system), all nodes.
    pub adopted_files: u64,
    /// Files node 0 wrote into BACKING for the others to adopt (once each).
    pub published_files: u64,
    /// The Prolog's way: stage_out holds exactly the inputs afterwards.
    pub stage_out_identical: Option<bool>,
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

/// Whether two `SUMS_PY` listings name the same files with the same sizes, mtimes and bytes.
fn same_files(want: &serde_json::Value, got: &serde_json::Value) -> bool {
    want.as_object().is_some_and(|w| {
        got.as_object().is_some_and(|g| {
            w.len() == g.len()
                && w.iter()
                    .all(|(name, v)| g.get(name).is_some_and(|x| x == v))
        })
    })
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
    // The SLURM Prolog's way: `tierstack slurm prolog` itself on every node, for a job of user
    // nobody with
    // `#BB_LUA node_local=... stage_in=/mnt/pfs/inputs stage_out=/mnt/pfs/si2-out` (its
    // buffers over the shared system); `scontrol` is a stand-in that answers for that job
    // (the test bed's SLURM, when up, is not asked: it has no burst buffer plugin here).
    let fake = work.join("fakebin/scontrol");
    let nodelist = format!("node[1-{}]", spec.nodes);
    let hosts: String = names.iter().map(|n| format!("{n}\\n")).collect();
    let script = format!(
        "#!/bin/sh\n# Written by bench cluster --stage-in: scontrol for one job's Prolog.\ncase \"$*\" in\n\
         \"show job \"*) printf 'JobId=%s JobName=si\\n   NodeList={nodelist}\\n   BurstBuffer=#BB_LUA node_local=512M stage_in=/mnt/pfs/inputs stage_out=/mnt/pfs/si2-out\\n' \"$SLURM_JOB_ID\" ;;\n\
         \"show hostnames \"*) printf '{hosts}' ;;\n\
         \"show config\") echo 'PrologFlags = Alloc' ;;\n\
         *) : ;;\nesac\n"
    );
    std::fs::create_dir_all(work.join("fakebin"))
        .and_then(|()| std::fs::write(&fake, script))
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))
        })
        .map_err(|e| step_err(format!("writing {}", fake.display()), e.to_string()))?;
    let prolog_env = format!(
        "PATH={r}/fakebin:$PATH SLURM_JOB_ID=92 SLURM_JOB_UID=65534 SLURM_JOB_GID=65534 SLURMD_NODENAME=$(hostname)"
    );
    // The job's user (root may not use burst buffers): nobody, who owns stage_out.
    bed.exec(
        "making the Prolog job's stage_out",
        "ctl",
        "mkdir -p /mnt/pfs/si2-out && chown 65534:65534 /mnt/pfs/si2-out",
    )?;
    let hook = "--fast-dir /var/tmp/si2/fast --pool-size 1G --timeout 5m";
    for (k, degree) in [0usize, 2, 2].into_iter().enumerate() {
        let tag = format!("si{k}");
        let prolog = k == 2;
        // Where each node's buffer is, and where the inputs show in it.
        let (mnt, view) = if prolog {
            let m = "/var/tmp/si2/fast/node/jobs/92/mnt".to_string();
            (m.clone(), m)
        } else {
            (format!("/mnt/{tag}"), format!("/mnt/{tag}/inputs"))
        };
        if !prolog {
            bed.exec(
                "mounting a node-local buffer on every node",
                &all,
                &format!("mkdir -p {mnt} /var/tmp/{tag}/back && {exe} mount /var/tmp/{tag}/back {mnt} --dir /var/tmp/{tag}/tier"),
            )?;
        }
        bed.run("dropping caches", &["drop-caches", "--root", &broot])?;
        let (sent0, read0) = (
            bed.io_stat("TESTBED_IO_SENT_BYTES"),
            bed.io_stat("TESTBED_IO_READ_BYTES"),
        );
        let t = Instant::now();
        let cmd = if prolog {
            format!(
                "{prolog_env} {exe} slurm prolog {hook} > {r}/results/{tag}-prolog-$(hostname).txt 2>&1 || {{ tail -3 {r}/results/{tag}-prolog-$(hostname).txt >&2; exit 1; }}; cp /var/tmp/si2/fast/node/jobs/92/fanin-0.json {r}/results/{tag}-$(hostname).json"
            )
        } else {
            format!(
                "{exe} stage in /mnt/pfs/inputs {mnt}/inputs/ --fanout {all} --fanout-degree {degree} --fanout-timeout 20s --json > {r}/results/{tag}-$(hostname).json"
            )
        };
        bed.exec(
            if prolog {
                "the SLURM Prolog on every node"
            } else {
                "the stage-in on every node"
            },
            &all,
            &cmd,
        )?;
        let stage_in_s = t.elapsed().as_secs_f64();
        let sent = bed.io_stat("TESTBED_IO_SENT_BYTES").saturating_sub(sent0);
        let read = bed.io_stat("TESTBED_IO_READ_BYTES").saturating_sub(read0);
        // Each node's copy as its buffer shows it, and the buffer's state after a drain
        // (which must find nothing to write).
        bed.exec(
            "checking every node's copy through its mount",
            &all,
            &format!("python3 {r}/sums.py {view} {r}/results/{tag}-sums-$(hostname).json && {exe} drain {mnt} --wait --timeout 2m && {exe} status {mnt} --json > {r}/results/{tag}-status-$(hostname).json"),
        )?;
        let (mut from_shared, mut from_parent, mut fell_back, mut identical) = (0, 0, 0, 0);
        let (mut dirty_bytes, mut pending_ops, mut drained_bytes) = (0, 0, 0);
        let (mut adopted_files, mut published_files) = (0, 0);
        for n in &names {
            let s = read_json(&work.join(format!("results/{tag}-{n}.json")))?;
            let u = |k: &str| s.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            from_shared += u("from_shared");
            from_parent += u("from_parent");
            adopted_files += u("adopted_files");
            published_files += u("published_files");
            fell_back += usize::from(s.get("fell_back").is_some_and(|x| !x.is_null()))
                + usize::from(s.get("fanout").is_some_and(|x| x == false));
            let got = read_json(&work.join(format!("results/{tag}-sums-{n}.json")))?;
            identical += usize::from(same_files(&want, &got));
            let st = read_json(&work.join(format!("results/{tag}-status-{n}.json")))?;
            let u = |k: &str| st.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            dirty_bytes += u("dirty_bytes");
            pending_ops += u("pending_ops");
            drained_bytes += u("drained_bytes");
        }
        bed.exec(
            if prolog {
                "the SLURM Epilog on every node (drain, unmount, remove)"
            } else {
                "tierstack umount on every node"
            },
            &all,
            &if prolog {
                format!("{prolog_env} {exe} slurm epilog --wait {hook}")
            } else {
                format!("{exe} umount {mnt} --timeout 5m")
            },
        )?;
        bed.exec(
            "listing the inputs again",
            "ctl",
            &format!("python3 {r}/sums.py /mnt/pfs/inputs {r}/results/inputs-meta-{tag}.json m"),
        )?;
        let before = read_json(&work.join("results/inputs-meta0.json"))?;
        let after = read_json(&work.join(format!("results/inputs-meta-{tag}.json")))?;
        // The Prolog's stage_out holds the inputs once, as they are.
        let stage_out_identical = if prolog {
            bed.exec(
                "checking stage_out",
                "ctl",
                &format!("python3 {r}/sums.py /mnt/pfs/si2-out {r}/results/{tag}-out.json"),
            )?;
            Some(same_files(
                &want,
                &read_json(&work.join(format!("results/{tag}-out.json")))?,
            ))
        } else {
            None
        };
        let x = |b: u64| b as f64 / input_bytes.max(1) as f64;
        modes.push(StageInMode {
            mode: if prolog {
                format!("Prolog, tree of {degree}")
            } else if degree == 0 {
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
            drained_bytes,
            adopted_files,
            published_files,
            stage_out_identical,
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
