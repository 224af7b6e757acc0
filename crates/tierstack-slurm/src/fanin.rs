//! The Prolog's stage-in by fan-out (`#BB_LUA node_local=SIZE` on more than one node): the
//! job's inputs are read from the shared file system once, by the job's first node, and
//! passed node to node (`tierstack stage in SRC DST --fanout NODES`, crate
//! `tierstack-stage`'s `fanout`), instead of every node reading them.
//!
//! Every node's Prolog runs the same fan-out with the job's node list (`SLURM_JOB_NODELIST`,
//! or the job's `NodeList` from `scontrol show job` in a slurmd Prolog, which SLURM 22.05
//! does not give that variable; expanded by `scontrol show hostnames`, the same order on
//! every node; a node whose NodeAddr differs from its name is `NAME@ADDR`), as the job's
//! user.
//! A scratch buffer (no `stage_out=`) has a node-local BACKING: the copy goes there and is
//! read back through the mount. A buffer over the first `stage_out=` has the shared file
//! system as BACKING: each node's copy goes into the job's spool folder (`JOB/spool`, on the
//! node), node 0 writes into `stage_out=` the inputs it does not hold yet, once (they would
//! drain there anyway), and every node's mount adopts its copy as clean cache of that file:
//! nothing of it is drained. Where fan-out cannot run (one node, a `manifest=`, no node list,
//! a fan-out that fails) the node stages itself as before (`hooks::data_in`); the fan-out's
//! own fallbacks (an unreachable parent, a refused copy) read the shared file system too.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use crate::creds::{run_capture, tierstack_as_user};
use crate::error::Result;
use crate::state::{job_dir, load_state, set_state, JobState};
use crate::Common;

/// The TCP port a job's fan-out listens on: spread by job id over 40000-59999, so that jobs
/// sharing a node rarely meet on one port (a clash makes that node stage itself).
pub(crate) fn fanout_port(job_id: &str) -> u16 {
    let n: u64 = job_id
        .bytes()
        .filter(u8::is_ascii_digit)
        .fold(0u64, |a, d| {
            (a.wrapping_mul(10)).wrapping_add(u64::from(d - b'0'))
        });
    40000 + (n % 20000) as u16
}

/// The node names `scontrol show hostnames` printed, one a line.
pub(crate) fn host_names(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// Whether `scontrol show config` has `PrologFlags` with `Alloc`: only then do a job's
/// nodes run their Prologs together, at its start (else each when its first task starts
/// there, and a fan-out would wait for nodes that are not there yet).
pub(crate) fn prologs_run_together(config: &str) -> bool {
    config.lines().any(|l| {
        l.split_once('=').is_some_and(|(k, v)| {
            k.trim() == "PrologFlags"
                && v.split(',').any(|f| f.trim().eq_ignore_ascii_case("alloc"))
        })
    })
}

/// Why a job is staged by each node itself rather than by fan-out (None: fan out).
/// `together`: the nodes' Prologs run at once ([`prologs_run_together`]).
pub(crate) fn why_not_fan_out(
    nodes: &[String],
    me: &str,
    s: &JobState,
    together: bool,
) -> Option<String> {
    if s.stage_in.is_empty() {
        Some("nothing to stage in".into())
    } else if nodes.len() < 2 {
        Some("the job has one node".into())
    } else if !together {
        Some("without PrologFlags=Alloc the nodes' Prologs do not run together".into())
    } else if s.manifest.is_some() {
        Some("manifest= stages without fan-out".into())
    } else if !nodes
        .iter()
        .any(|n| n.split_once('@').map_or(n.as_str(), |(name, _)| name) == me)
    {
        Some(format!("this node ({me}) is not in the job's node list"))
    } else {
        None
    }
}

/// Each node's entry in the fan-out's node list: `NAME@ADDR` where `scontrol -o show node`
/// gives the node an address other than its name (NodeAddr), else the name.
pub(crate) fn entries(names: &[String], show_node: &str) -> Vec<String> {
    let addrs: std::collections::HashMap<&str, &str> = show_node
        .lines()
        .filter_map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(k).filter(|v| !v.is_empty()))
            };
            Some((field("NodeName=")?, field("NodeAddr=")?))
        })
        .collect();
    names
        .iter()
        .map(|n| match addrs.get(n.as_str()) {
            Some(a) if a != n => format!("{n}@{a}"),
            _ => n.clone(),
        })
        .collect()
}

/// The `NodeList=` of `scontrol show job` (None: not there or `(null)`).
pub(crate) fn node_list_field(text: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("NodeList="))
        .filter(|v| !v.is_empty() && *v != "(null)")
        .map(String::from)
}

/// The job's nodes as fan-out entries: `SLURM_JOB_NODELIST` where it is set (SLURM 22.05
/// sets it for PrologSlurmctld only), else the job's `NodeList` from `scontrol show job`
/// (None: scontrol failed).
fn job_nodes(id: &str) -> Option<Vec<String>> {
    let list = match std::env::var("SLURM_JOB_NODELIST") {
        Ok(l) if !l.is_empty() => l,
        _ => {
            let mut cmd = Command::new("scontrol");
            cmd.args(["show", "job", id]);
            let (ok, text) = run_capture(cmd, "scontrol show job", Duration::from_secs(30)).ok()?;
            node_list_field(&text).filter(|_| ok)?
        }
    };
    let mut cmd = Command::new("scontrol");
    cmd.args(["show", "hostnames", &list]);
    let (ok, text) = run_capture(cmd, "scontrol show hostnames", Duration::from_secs(30)).ok()?;
    let names = host_names(&text);
    if !ok || names.is_empty() {
        return None;
    }
    let mut cmd = Command::new("scontrol");
    cmd.args(["-o", "show", "node", &names.join(",")]);
    let shown = run_capture(cmd, "scontrol show node", Duration::from_secs(30))
        .ok()
        .filter(|(ok, _)| *ok)
        .map(|(_, t)| t)
        .unwrap_or_default();
    Some(entries(&names, &shown))
}

/// Stages the job's inputs in by fan-out when it can; returns false when it did not (the
/// caller stages each node itself). A fan-out that fails is reported and returns false.
pub(crate) fn fan_in(id: &str, c: &Common) -> Result<bool> {
    let me = std::env::var("SLURMD_NODENAME")
        .ok()
        .or_else(|| {
            fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_default();
    let nodes = job_nodes(id).unwrap_or_default();
    let (dir, mut s) = load_state(c, id)?;
    // Why a node staged itself is kept with the job's buffer (`fanin-0.json`), as the
    // fan-out's report is when it ran.
    let not = |why: String| {
        let _ = fs::write(
            dir.join("fanin-0.json"),
            serde_json::json!({"fanout": false, "why": why, "nodes": nodes, "me": me}).to_string(),
        );
        println!("job {id}: staging in on this node itself: {why}");
        Ok(false)
    };
    let together = nodes.len() > 1 && {
        let mut cmd = Command::new("scontrol");
        cmd.args(["show", "config"]);
        run_capture(cmd, "scontrol show config", Duration::from_secs(30))
            .is_ok_and(|(ok, text)| ok && prologs_run_together(&text))
    };
    if let Some(why) = why_not_fan_out(&nodes, &me, &s, together) {
        return not(why);
    }
    set_state(&dir, &mut s, "staging-in")?;
    let mut spool = None;
    if !s.stage_out.is_empty() {
        // BACKING is the shared file system: the copy goes to a node-local spool.
        let p = dir.join("spool");
        if !p.is_dir() {
            fs::create_dir(&p)
                .map_err(|e| err!("cannot create {}: {e}: check --fast-dir", p.display()))?;
        }
        std::os::unix::fs::chown(&p, Some(s.uid), Some(s.gid))
            .and_then(|()| fs::set_permissions(&p, fs::Permissions::from_mode(0o700)))
            .map_err(|e| err!("cannot give {} to the job's user: {e}", p.display()))?;
        spool = Some(p);
    }
    let mut into = job_dir(c, id)?.join("mnt").into_os_string();
    into.push("/");
    let list = nodes.join(",");
    let port = fanout_port(id).to_string();
    let (mut files, mut from_shared, mut adopted) = (0u64, 0u64, 0u64);
    for (i, src) in s.stage_in.clone().iter().enumerate() {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "stage".as_ref(),
            "in".as_ref(),
            src.as_os_str(),
            into.as_os_str(),
            "--fanout".as_ref(),
            list.as_ref(),
            "--fanout-me".as_ref(),
            me.as_ref(),
            "--fanout-port".as_ref(),
            port.as_ref(),
            "--json".as_ref(),
        ];
        if let Some(p) = &spool {
            args.push("--fanout-spool".as_ref());
            args.push(p.as_os_str());
        }
        let what = format!("stage_in={} by fan-out", src.display());
        let msg = match tierstack_as_user(&args, &s, &what, c) {
            Ok(m) => m,
            Err(e) => return not(e.to_string()),
        };
        // What this node's part did, kept with the job's buffer (`fanin-I.json`).
        let _ = fs::write(dir.join(format!("fanin-{i}.json")), &msg);
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&msg) {
            let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            files += n("files");
            from_shared += n("from_shared");
            adopted += n("adopted_files");
        }
    }
    if let Some(p) = &spool {
        let _ = fs::remove_dir_all(p);
    }
    set_state(&dir, &mut s, "staged-in")?;
    println!(
        "job {id}: staged in {files} files by fan-out over {} nodes ({} read from the shared file system here{})",
        nodes.len(),
        tierstack_common::fmt_size(from_shared),
        if spool.is_some() {
            format!(", {adopted} adopted as clean cache")
        } else {
            String::new()
        }
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directives::Mode;
    use std::path::PathBuf;

    fn job(stage_in: &[&str], manifest: Option<&str>) -> JobState {
        JobState {
            uid: 1000,
            gid: 1000,
            capacity: 1 << 30,
            mode: Mode::Sync,
            stage_in: stage_in.iter().map(PathBuf::from).collect(),
            stage_out: vec![PathBuf::from("/pfs/out")],
            manifest: manifest.map(PathBuf::from),
            backing: PathBuf::from("/pfs/out"),
            state: "set-up".into(),
        }
    }

    #[test]
    fn the_port_is_the_same_on_every_node_and_in_range() {
        assert_eq!(fanout_port("123"), fanout_port("123"));
        assert_eq!(fanout_port("123"), 40123);
        assert_eq!(fanout_port("20001"), 40001);
        assert_ne!(fanout_port("5"), fanout_port("6"));
        for id in ["0", "19999", "4294967295", "12_3"] {
            assert!((40000..60000).contains(&fanout_port(id)), "{id}");
        }
    }

    #[test]
    fn the_node_list_is_the_jobs_not_the_requested_one() {
        let text = "JobId=7 JobName=x\n   ReqNodeList=(null) ExcNodeList=(null)\n   NodeList=n[1-2]\n   BatchHost=n1\n";
        assert_eq!(node_list_field(text).as_deref(), Some("n[1-2]"));
        assert_eq!(node_list_field("NodeList=(null)"), None);
        assert_eq!(node_list_field("JobId=7"), None);
    }

    #[test]
    fn host_names_are_the_lines_of_scontrol() {
        assert_eq!(
            host_names("node1\nnode2\n\n node3 \n"),
            vec!["node1", "node2", "node3"]
        );
        assert!(host_names("").is_empty());
    }

    #[test]
    fn nodes_whose_address_is_not_their_name_get_it() {
        let names: Vec<String> = ["n1", "n2", "n3"].iter().map(|s| s.to_string()).collect();
        let shown = "NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=h1\n\
                     NodeName=n2 NodeAddr=n2 NodeHostName=n2\n";
        assert_eq!(entries(&names, shown), vec!["n1@127.0.0.1", "n2", "n3"]);
        let nodes = entries(&names, shown);
        assert_eq!(
            why_not_fan_out(&nodes, "n1", &job(&["/pfs/in"], None), true),
            None
        );
    }

    #[test]
    fn a_job_fans_out_only_on_several_nodes_without_a_manifest() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].iter().map(|s| s.to_string()).collect();
        assert_eq!(
            why_not_fan_out(&nodes, "n2", &job(&["/pfs/in"], None), true),
            None
        );
        let one = vec!["n1".to_string()];
        assert!(why_not_fan_out(&one, "n1", &job(&["/pfs/in"], None), true).is_some());
        assert!(why_not_fan_out(&[], "n1", &job(&["/pfs/in"], None), true).is_some());
        assert!(why_not_fan_out(&nodes, "n2", &job(&[], None), true).is_some());
        assert!(why_not_fan_out(&nodes, "n2", &job(&["/pfs/in"], Some("/m")), true).is_some());
        assert!(why_not_fan_out(&nodes, "n9", &job(&["/pfs/in"], None), true).is_some());
        assert!(why_not_fan_out(&nodes, "n2", &job(&["/pfs/in"], None), false).is_some());
    }

    #[test]
    fn prologs_run_together_only_with_alloc() {
        assert!(prologs_run_together(
            "Prolog = /x\nPrologFlags             = Alloc,Contain\n"
        ));
        assert!(prologs_run_together("PrologFlags = contain,alloc"));
        assert!(!prologs_run_together("PrologFlags             = (null)\n"));
        assert!(!prologs_run_together(
            "PrologFlags = Contain\nPrologEpilogTimeout = 65534"
        ));
    }
}
