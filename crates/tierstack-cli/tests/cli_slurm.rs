//! `tierstack slurm` end to end on a real SLURM 22.05 (slurmctld + slurmd from Debian's
//! packages, installed here if missing) in a scratch folder with its own slurm.conf, the
//! daemons stopped by pid at the end. Jobs are submitted as an unprivileged user (SLURM refuses
//! burst buffers to root). Prints SKIP with the reason and passes where SLURM cannot run
//! (not root, no FUSE, packages not installable).
//!
//! Authentication is auth/none + cred/none (SLURM.md: works in 22.05, tests only), so the test
//! needs no munged of its own.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{is_root, random, serial, BIN};

const USER: &str = "tsbbuser";

fn sh(cmd: &str) -> Output {
    Command::new("bash")
        .args(["-c", cmd])
        .stdin(Stdio::null())
        .output()
        .expect("bash runs")
}

fn skip(why: &str) {
    println!("SKIP: {why}");
}

/// Installs SLURM if missing; Err(reason) when it cannot.
fn ensure_slurm() -> Result<(), String> {
    if !is_root() {
        return Err("not root: the test starts slurmctld/slurmd and mounts FUSE".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("no /dev/fuse".into());
    }
    let have = || {
        ["slurmctld", "slurmd", "sbatch"]
            .iter()
            .all(|b| sh(&format!("command -v {b}")).status.success())
            && Path::new("/usr/lib/x86_64-linux-gnu/slurm-wlm/burst_buffer_lua.so").exists()
    };
    if !have() {
        let pk = "slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins";
        let o = sh(&format!(
            "export DEBIAN_FRONTEND=noninteractive; timeout 150 apt-get install -y -qq --no-install-recommends {pk} >/dev/null 2>&1 || \
             {{ timeout 120 apt-get update -qq >/dev/null 2>&1 && timeout 150 apt-get install -y -qq --no-install-recommends {pk} >/dev/null 2>&1; }}"
        ));
        if !o.status.success() || !have() {
            return Err(format!("cannot install SLURM with apt-get ({pk})"));
        }
    }
    if !sh(&format!("id -u {USER}")).status.success() {
        let o = sh(&format!("useradd -M -s /bin/bash {USER}"));
        if !o.status.success() {
            return Err(format!("cannot create user {USER}"));
        }
    }
    Ok(())
}

fn user_id() -> (u32, u32) {
    let u = String::from_utf8_lossy(&sh(&format!("id -u {USER}")).stdout)
        .trim()
        .parse()
        .expect("uid");
    let g = String::from_utf8_lossy(&sh(&format!("id -g {USER}")).stdout)
        .trim()
        .parse()
        .expect("gid");
    (u, g)
}

struct Slurm {
    root: PathBuf,
    conf: PathBuf,
    fast: PathBuf,
    /// Compute nodes in namespaces of their own (empty: this host is the node).
    nodes: Vec<String>,
    /// Their mount namespaces (`/proc/PID/ns/mnt` of their slurmd).
    node_ns: Vec<PathBuf>,
    /// Held until the daemons are stopped (fields drop after `Drop::drop`).
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Slurm {
    /// A SLURM whose one node is this host.
    fn start() -> Slurm {
        Slurm::start_nodes(&[])
    }

    /// A SLURM with `nodes` as its compute nodes: one slurmd each in a UTS and mount namespace
    /// of its own (its hostname is the node name; per-node spool, pid and log under
    /// ROOT/NAME bound over ROOT/node, its node-local buffers in ROOT/NAME/fastnode bound over
    /// FAST/node, and its tierstack runtime folder over /run/tierstack), on 127.0.0.1 with a
    /// port each. With no names, one slurmd in this host's namespaces.
    fn start_nodes(nodes: &[&str]) -> Slurm {
        // One SLURM at a time (`make test` runs this file's tests in parallel threads): they
        // would compete for the 2 CPUs the node has, and timings are asserted.
        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let serial = serial();
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = PathBuf::from(format!(
            "/var/tmp/tierstack-slurm-test-{}-{n}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&root);
        for d in ["etc", "state", "spool", "log", "fast", "home"] {
            fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        for n in nodes {
            for d in ["spool", "fastnode", "run"] {
                fs::create_dir_all(root.join(n).join(d)).expect("mkdir");
            }
        }
        if !nodes.is_empty() {
            for d in ["node", "fast/node"] {
                fs::create_dir_all(root.join(d)).expect("mkdir");
            }
            fs::create_dir_all("/run/tierstack").expect("mkdir /run/tierstack");
        }
        for d in ["", "etc", "home"] {
            fs::set_permissions(root.join(d), fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let (uid, gid) = user_id();
        std::os::unix::fs::chown(root.join("home"), Some(uid), Some(gid)).expect("chown");
        let host = String::from_utf8_lossy(&sh("hostname -s").stdout)
            .trim()
            .to_string();
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let port = 20000 + ((std::process::id() % 5000) * 4 + n * 2) % 20000;
        let r = root.display().to_string();
        let node_lines = if nodes.is_empty() {
            format!(
                "SlurmdSpoolDir={r}/spool\nSlurmdPidFile={r}/slurmd.pid\nSlurmdLogFile={r}/log/slurmd.log\n\
                 NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN\n\
                 PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP\n"
            )
        } else {
            // Alloc: every node's Prolog runs at the job's start, together, so that the
            // stage-in fans out (without it a node's Prolog waits for its first task).
            let mut l = format!(
                "SlurmdSpoolDir={r}/node/spool\nSlurmdPidFile={r}/node/slurmd.pid\nSlurmdLogFile={r}/node/slurmd.log\nPrologFlags=Alloc\n"
            );
            for (i, n) in nodes.iter().enumerate() {
                l += &format!(
                    "NodeName={n} NodeHostname={n} NodeAddr=127.0.0.1 Port={} CPUs=1 RealMemory=500 State=UNKNOWN\n",
                    port + 2 + i as u32
                );
            }
            l + &format!(
                "PartitionName=debug Nodes={} Default=YES MaxTime=INFINITE State=UP\n",
                nodes.join(",")
            )
        };
        let conf = format!(
            "ClusterName=tstest\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={port}\nSlurmdPort={}\n\
SlurmUser=root\nSlurmdUser=root\nAuthType=auth/none\nCredType=cred/none\n\
StateSaveLocation={r}/state\nSlurmctldPidFile={r}/slurmctld.pid\n\
SlurmctldLogFile={r}/log/slurmctld.log\nSlurmctldDebug=info\nSlurmdDebug=info\n\
ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
AccountingStorageType=accounting_storage/none\nSchedulerType=sched/backfill\nSchedulerParameters=bf_interval=1\n\
SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nReturnToService=2\nMailProg=/bin/true\n\
BurstBufferType=burst_buffer/lua\nDebugFlags=BurstBuffer\nMpiDefault=none\n\
JobSubmitPlugins=lua\nProlog={r}/etc/tierstack_prolog.sh\nEpilog={r}/etc/tierstack_epilog.sh\n\
TaskProlog={r}/etc/tierstack_task_prolog.sh\n{node_lines}",
            port + 1
        );
        fs::write(root.join("etc/slurm.conf"), conf).expect("write slurm.conf");
        let mut s = Slurm {
            conf: root.join("etc"),
            fast: root.join("fast"),
            root,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            node_ns: Vec::new(),
            _serial: serial,
        };
        // The installer under test writes burst_buffer.lua and .conf, job_submit.lua, the
        // Prolog/Epilog and the TaskProlog that slurm.conf above names.
        let text = s.install(&[]);
        assert!(
            text.contains("has BurstBufferType=burst_buffer/lua and the rest"),
            "{text}"
        );
        let c = s.conf.join("slurm.conf");
        let mut start = format!("slurmctld -f {} -i", c.display());
        if nodes.is_empty() {
            start += &format!(" && slurmd -f {}", c.display());
        }
        for n in nodes {
            start += &format!(
                " && unshare --uts --mount --propagation private --fork sh -c \
                 'hostname {n} && mount --bind {r}/{n} {r}/node && mount --bind {r}/{n}/fastnode {r}/fast/node \
                 && mount --bind {r}/{n}/run /run/tierstack && exec slurmd -f {}'",
                c.display()
            );
        }
        let o = sh(&start);
        assert!(
            o.status.success(),
            "start: {}{}",
            String::from_utf8_lossy(&o.stderr),
            s.logs()
        );
        // Bounded wait for the nodes to be idle.
        let t = Instant::now();
        loop {
            let o = s.client("sinfo -h -o %T");
            if String::from_utf8_lossy(&o.stdout).trim() == "idle" {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "node not idle: {}",
                s.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        // The nodes' mount namespaces: what is left in them at the end is stopped.
        for n in nodes {
            let pid = fs::read_to_string(s.root.join(n).join("slurmd.pid")).unwrap_or_default();
            if let Ok(ns) = fs::read_link(format!("/proc/{}/ns/mnt", pid.trim())) {
                s.node_ns.push(ns);
            }
        }
        assert_eq!(
            s.node_ns.len(),
            nodes.len(),
            "slurmd of a node did not start{}",
            s.logs()
        );
        s
    }

    /// Runs `tierstack slurm install` for this SLURM (pool 2G, short timeouts) with `extra`
    /// arguments; returns what it printed. burst_buffer.lua is read at every hook call, so a
    /// new install applies to the next hook.
    fn install(&self, extra: &[&str]) -> String {
        let o = Command::new(BIN)
            .args(["slurm", "install", "--conf-dir"])
            .arg(&self.conf)
            .arg("--fast-dir")
            .arg(&self.fast)
            .args([
                "--pool-size",
                "2G",
                "--stage-timeout",
                "120",
                "--other-timeout",
                "60",
            ])
            .args(extra)
            .output()
            .expect("run install");
        assert!(
            o.status.success(),
            "install: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The job's state as `squeue -o %T` prints it ("" once it left the queue).
    fn state(&self, id: &str) -> String {
        let o = self.client(&format!("squeue -h -j {id} -o %T"));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// Waits (bounded) until the job is in `want`; panics with the logs otherwise.
    fn wait_state(&self, id: &str, want: &str, secs: u64) {
        let t = Instant::now();
        loop {
            let st = self.state(id);
            if st == want {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "job {id} is '{st}', never {want}{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Submits a job script as the user; returns the job id.
    fn submit(&self, args: &str, script: &Path) -> String {
        let o = self.user(&format!("sbatch -o /dev/null {args} {}", script.display()));
        assert!(
            o.status.success(),
            "sbatch: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        job_id(&o)
    }

    /// `sbatch --wait ARGS SCRIPT` as the user, the job's output in home/PREFIX-ID.out;
    /// returns sbatch's result and the text of every home/PREFIX-* file.
    fn submit_wait(&self, prefix: &str, args: &str, script: &Path) -> (Output, Vec<String>) {
        let home = self.root.join("home");
        let o = self.user(&format!(
            "sbatch --wait -o {}/{prefix}-%j.out {args} {}",
            home.display(),
            script.display()
        ));
        // `sbatch --wait` returns once the job's base state is final, which SLURM 22.05 sets
        // before post_run and data_out have run (seen here: DST read before the stage-out
        // began). What a user waits for is the end of the stage-out: the job no longer in
        // COMPLETING or STAGE_OUT, and its buffer torn down.
        let id = job_id(&o);
        if o.status.success() && !id.is_empty() {
            self.wait_stage_out(&id);
        }
        let outs = fs::read_dir(&home)
            .expect("home")
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{prefix}-"))
            })
            .map(|e| fs::read_to_string(e.path()).unwrap_or_default())
            .collect();
        (o, outs)
    }

    /// Waits (at most 90 s) until job `id` has left COMPLETING and STAGE_OUT and its buffer
    /// folder is gone (teardown ran).
    fn wait_stage_out(&self, id: &str) {
        let t = Instant::now();
        let mut said = false;
        loop {
            let o = self.client(&format!("squeue -h -j {id} -o %T"));
            let st = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let busy = st.contains("STAGE_OUT")
                || st.contains("COMPLETING")
                || st.contains("RUNNING")
                || st.contains("CONFIGURING");
            let buffer = self.fast.join("jobs").join(id).exists();
            if !busy && buffer && !said {
                // What README tells users to poll: record where it would be too early.
                println!("job {id}: squeue says '{st}' while its buffer still exists");
                said = true;
            }
            if !busy && !buffer {
                println!(
                    "job {id}: stage-out over {:.1} s after sbatch --wait returned ({st})",
                    t.elapsed().as_secs_f64()
                );
                return;
            }
            if t.elapsed() > Duration::from_secs(90) {
                println!("job {id}: still {st} 90 s after sbatch --wait returned");
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A SLURM client command as root.
    fn client(&self, cmd: &str) -> Output {
        sh(&format!(
            "SLURM_CONF={} timeout 60 {cmd}",
            self.conf.join("slurm.conf").display()
        ))
    }

    /// A SLURM client command as the unprivileged user.
    fn user(&self, cmd: &str) -> Output {
        sh(&format!(
            "cd {} && runuser -u {USER} -- env SLURM_CONF={} timeout 120 {cmd}",
            self.root.join("home").display(),
            self.conf.join("slurm.conf").display()
        ))
    }

    fn logs(&self) -> String {
        let ctl = fs::read_to_string(self.root.join("log/slurmctld.log")).unwrap_or_default();
        let tail: Vec<&str> = ctl.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("\n--- slurmctld.log (tail)\n{}", tail.join("\n"))
    }

    fn script(&self, name: &str, body: &str) -> PathBuf {
        let p = self.root.join("home").join(name);
        let mut f = fs::File::create(&p).expect("script");
        f.write_all(body.as_bytes()).expect("write script");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    /// Waits (bounded) until `squeue` no longer lists the job.
    fn wait_gone(&self, id: &str, secs: u64) {
        let t = Instant::now();
        loop {
            let o = self.client(&format!("squeue -h -j {id} -o %T"));
            if String::from_utf8_lossy(&o.stdout).trim().is_empty() {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "job {id} still there: {}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Teardown runs right after the job leaves the queue: wait for it (bounded).
    fn no_buffers_left(&self) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20)
            && fs::read_dir(self.fast.join("jobs")).is_ok_and(|mut r| r.next().is_some())
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        println!(
            "buffers gone {:.1} s after the check began",
            t.elapsed().as_secs_f64()
        );
        let jobs: Vec<_> = fs::read_dir(self.fast.join("jobs"))
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(jobs.is_empty(), "buffers left: {jobs:?}");
        let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
        assert!(
            !mounts.contains(&*self.fast.to_string_lossy()),
            "mount left behind: {mounts}"
        );
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // Stop the daemons by pid, bounded.
        let mut pid_files = vec![PathBuf::from("slurmctld.pid"), PathBuf::from("slurmd.pid")];
        pid_files.extend(self.nodes.iter().map(|n| Path::new(n).join("slurmd.pid")));
        for f in pid_files {
            if let Ok(p) = fs::read_to_string(self.root.join(f)) {
                if let Ok(pid) = p.trim().parse::<i32>() {
                    // SAFETY: kill(2) on a pid read from the daemon's own pid file.
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                    let t = Instant::now();
                    while Path::new(&format!("/proc/{pid}")).exists()
                        && t.elapsed() < Duration::from_secs(10)
                    {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    if Path::new(&format!("/proc/{pid}")).exists() {
                        // SAFETY: as above.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            }
        }
        // slurmstepd processes of our jobs can outlive slurmd (waiting to report to it): ours
        // are those whose working folder is under our scratch folder.
        if let Ok(rd) = fs::read_dir("/proc") {
            for e in rd.flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                    continue;
                };
                let comm = fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                let cwd = fs::read_link(e.path().join("cwd")).unwrap_or_default();
                if comm.trim() == "slurmstepd" && cwd.starts_with(&self.root) {
                    // SAFETY: kill(2) on a slurmstepd of this test's own jobs.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                // Anything still in a node's mount namespace (a mount daemon or drain of a
                // failed test): the namespace and its mounts go with the last of them.
                let ns = fs::read_link(e.path().join("ns/mnt")).unwrap_or_default();
                if self.node_ns.contains(&ns) {
                    // SAFETY: kill(2) on a process in this test's own node namespace.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        // Any mount of ours left (a failed test) is detached before removal.
        let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
        for l in mounts.lines() {
            if let Some(mp) = l.split_whitespace().nth(1) {
                if mp.starts_with(&*self.fast.to_string_lossy()) {
                    let _ = sh(&format!("umount -l {mp}"));
                }
            }
        }
        if std::env::var_os("TIERSTACK_KEEP").is_none() {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

/// Pids of processes whose command line contains every one of `words`.
fn pids_with(words: &[&str]) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if words.iter().all(|w| cmd.contains(w)) {
                out.push(pid);
            }
        }
    }
    out
}

/// Writes `mib` MiB of pseudo-random data (seeded) to `p`, owned by the test user.
fn write_data(p: &Path, mib: usize, seed: u64) {
    let mut f = fs::File::create(p).expect("create");
    for i in 0..mib {
        f.write_all(&random(1 << 20, seed + i as u64))
            .expect("write");
    }
    let (uid, gid) = user_id();
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).expect("chown");
}

fn job_id(o: &Output) -> String {
    let text = String::from_utf8_lossy(&o.stdout);
    text.split_whitespace()
        .last()
        .unwrap_or("")
        .trim()
        .to_string()
}

#[test]
fn slurm_burst_buffer_end_to_end() {
    if let Err(why) = ensure_slurm() {
        skip(&why);
        return;
    }
    let t0 = Instant::now();
    let s = Slurm::start();
    let (uid, gid) = user_id();
    let home = s.root.join("home");

    // pools hook: the pool SLURM accounts capacity against.
    let o = Command::new(BIN)
        .args(["slurm", "pools", "--pool-size", "2G"])
        .output()
        .expect("pools");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("pools json");
    assert_eq!(v["pools"][0]["id"], "tierstack");
    assert_eq!(v["pools"][0]["quantity"], 2u64 << 30);

    // --- Round trip: stage in, the job checks in.bin and writes out.bin, stage out.
    let src_dir = home.join("src");
    fs::create_dir(&src_dir).expect("mkdir");
    let src = src_dir.join("in.bin");
    let input = random(5 << 20, 7);
    fs::write(&src, &input).expect("write src");
    let reference = home.join("ref.bin");
    let output = random(3 << 20, 11);
    fs::write(&reference, &output).expect("write ref");
    for p in [&src_dir, &src, &reference] {
        std::os::unix::fs::chown(p, Some(uid), Some(gid)).expect("chown");
    }
    let dst = home.join("dst");
    let job = s.script(
        "round.sh",
        &format!(
            "#!/bin/bash\n#BB_LUA pool=tierstack capacity=1G stage_in={src} stage_out={dst}\nset -e\n\
             echo dir=$TIERSTACK_DIR\ncmp \"$TIERSTACK_DIR/in.bin\" {src}\ncp {reference} \"$TIERSTACK_DIR/out.bin\"\necho job-ok\n",
            src = src.display(),
            dst = dst.display(),
            reference = reference.display()
        ),
    );
    let (o, out_files) = s.submit_wait("round", "", &job);
    assert!(
        o.status.success(),
        "sbatch --wait: {} {} job output: {out_files:?}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        s.logs()
    );
    assert!(
        out_files.iter().any(|t| t.contains("job-ok")),
        "{out_files:?}"
    );
    let got = fs::read(dst.join("out.bin")).unwrap_or_else(|e| {
        panic!(
            "DST/out.bin: {e}; DST holds {:?}; job output {out_files:?}{}",
            fs::read_dir(&dst).map(|r| r
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect::<Vec<_>>()),
            s.logs()
        )
    });
    assert!(
        got == output,
        "DST/out.bin differs from what the job wrote: {} bytes vs {}, first difference at {:?}{}",
        got.len(),
        output.len(),
        got.iter().zip(&output).position(|(a, b)| a != b),
        s.logs()
    );
    let meta = fs::metadata(dst.join("out.bin")).expect("meta");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.uid(), uid, "out.bin belongs to the job's user");
    s.no_buffers_left();
    // No hook may sit until SLURM's timeout (60 s here).
    assert!(
        t0.elapsed() < Duration::from_secs(45),
        "round trip took {:.1} s{}",
        t0.elapsed().as_secs_f64(),
        s.logs()
    );
    println!("round trip ok after {:.1} s", t0.elapsed().as_secs_f64());

    // --- A full pool keeps the next job pending (not failed) until the first one's buffer
    // is torn down; without stage_in the buffer is scratch plus stage_out.
    let mut ids = Vec::new();
    for name in ["a", "b"] {
        let job = s.script(
            &format!("{name}.sh"),
            &format!(
                "#!/bin/bash\n#BB_LUA pool=tierstack capacity=1500M stage_out={}\nset -e\nsleep 3\necho {name} > \"$TIERSTACK_DIR/{name}.txt\"\n",
                home.join(format!("out-{name}")).display()
            ),
        );
        let o = s.user(&format!("sbatch -o /dev/null {}", job.display()));
        assert!(
            o.status.success(),
            "sbatch: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        ids.push(job_id(&o));
    }
    let t = Instant::now();
    loop {
        let a = s.client(&format!("squeue -h -j {} -o %T", ids[0]));
        let b = s.client(&format!("squeue -h -j {} -o %T:%r", ids[1]));
        let (a, b) = (
            String::from_utf8_lossy(&a.stdout).trim().to_string(),
            String::from_utf8_lossy(&b.stdout).trim().to_string(),
        );
        if a == "RUNNING" {
            assert!(
                b.starts_with("PENDING"),
                "second job {b} while the first runs with the pool full"
            );
            println!("pool full: first job {a}, second {b}");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "first job never ran: {a} / {b}{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    s.wait_gone(&ids[0], 60);
    s.wait_gone(&ids[1], 60);
    for name in ["a", "b"] {
        let got =
            fs::read_to_string(home.join(format!("out-{name}/{name}.txt"))).unwrap_or_default();
        assert_eq!(got, format!("{name}\n"), "job {name}'s output{}", s.logs());
    }
    s.no_buffers_left();
    println!(
        "pool-full case ok after {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // --- sbatch --bb "pool=tierstack ..." works like the #BB_LUA line: SLURM 22.05 copies the
    // --bb text into the script as it is, and the installed job_submit.lua adds the #BB_LUA.
    let dst_bb = home.join("dst-bb");
    let plain = s.script(
        "plain.sh",
        &format!(
            "#!/bin/bash\nset -e\ncmp \"$TIERSTACK_DIR/in.bin\" {src}\ncp {reference} \"$TIERSTACK_DIR/out.bin\"\necho job-ok\n",
            src = src.display(),
            reference = reference.display()
        ),
    );
    let (o, outs) = s.submit_wait(
        "plain",
        &format!(
            "--bb 'pool=tierstack capacity=1G stage_in={} stage_out={}'",
            src.display(),
            dst_bb.display()
        ),
        &plain,
    );
    assert!(
        o.status.success() && outs.iter().any(|t| t.contains("job-ok")),
        "sbatch --bb: {} {} {outs:?}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        s.logs()
    );
    let got = fs::read(dst_bb.join("out.bin")).expect("--bb: DST/out.bin");
    assert!(got == output, "--bb: DST/out.bin differs");
    assert!(fs::read(dst_bb.join("in.bin")).expect("in.bin") == input);
    s.no_buffers_left();
    // A bad word in --bb fails sbatch like the same #BB_LUA line.
    let o = s.user(&format!(
        "sbatch -o /dev/null --bb 'pool=tierstack capacity=1G colour=red' {}",
        plain.display()
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("unknown key 'colour'"),
        "sbatch --bb said: {err}"
    );
    println!("sbatch --bb ok after {:.1} s", t0.elapsed().as_secs_f64());

    // --- Stage-in progress in `scontrol show bbstat` while data_in runs (320 MiB written).
    let big = home.join("big.bin");
    write_data(&big, 320, 99);
    // From the disk, not the page cache, so the stage-in lasts long enough to be seen.
    let _ = fs::write("/proc/sys/vm/drop_caches", "3");
    let quick = s.script("quick.sh", "#!/bin/bash\ntrue\n");
    let id = s.submit(
        &format!(
            "--bb 'pool=tierstack capacity=1G stage_in={}'",
            big.display()
        ),
        &quick,
    );
    let t = Instant::now();
    let mut seen = Vec::new();
    loop {
        let o = s.client("scontrol show bbstat");
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        if let Some(line) = text.lines().find(|l| l.starts_with(&format!("job {id}:"))) {
            if line.contains("state staging-in stage_in") {
                let pct: f64 = line
                    .split("stage_in ")
                    .nth(1)
                    .and_then(|x| x.split('%').next())
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(-1.0);
                if pct > 0.0 && pct < 100.0 && !seen.iter().any(|(p, _)| *p == pct) {
                    seen.push((pct, line.to_string()));
                }
            }
        }
        if s.state(&id).is_empty() || seen.len() >= 3 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "job {id} stage-in never ended{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("bbstat during stage-in: {seen:#?}");
    if seen.is_empty() && t.elapsed() < Duration::from_secs(3) {
        // Staged between two looks at bbstat (a fast disk): nothing to see, nothing wrong.
        println!(
            "stage-in took {:.1} s: too quick to watch",
            t.elapsed().as_secs_f64()
        );
    } else {
        assert!(
            !seen.is_empty(),
            "no stage-in progress between 0 and 100 % seen in bbstat{}",
            s.logs()
        );
        assert!(
            seen[0].1.contains("of 320.0 MiB staged, source 1 of 1"),
            "{}",
            seen[0].1
        );
    }
    s.wait_gone(&id, 90);
    s.no_buffers_left();
    fs::remove_file(&big).expect("rm big");
    println!(
        "bbstat progress ok after {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // scontrol show bbstat runs the get_status hook.
    let o = s.client("scontrol show bbstat");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("pool tierstack:") && text.contains("2.0 GiB"),
        "bbstat: {text}"
    );

    // --- A bad directive makes sbatch fail with one line naming it.
    let bad = s.script(
        "bad.sh",
        "#!/bin/bash\n#BB_LUA pool=tierstack capacity=1G colour=red\ntrue\n",
    );
    let o = s.user(&format!("sbatch -o /dev/null {}", bad.display()));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "bad directive accepted");
    assert!(err.contains("unknown key 'colour'"), "sbatch said: {err}");
    let bad = s.script(
        "bad2.sh",
        "#!/bin/bash\n#BB_LUA pool=tierstack capacity=1G stage_in=/nonexistent/x\ntrue\n",
    );
    let o = s.user(&format!("sbatch -o /dev/null {}", bad.display()));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("/nonexistent/x does not exist"),
        "sbatch said: {err}"
    );

    // --- A source the job's user may not read (root's 0600 file): the job is held with the
    // reason, scancel cleans up.
    let secret = s.root.join("secret.bin");
    fs::write(&secret, b"root only").expect("secret");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).expect("chmod");
    let held = s.script(
        "held.sh",
        &format!(
            "#!/bin/bash\n#BB_LUA pool=tierstack capacity=1G stage_in={} stage_out={}\ntrue\n",
            secret.display(),
            home.join("dst2").display()
        ),
    );
    let o = s.user(&format!("sbatch -o /dev/null {}", held.display()));
    assert!(
        o.status.success(),
        "sbatch: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let id = job_id(&o);
    let t = Instant::now();
    let reason = loop {
        let o = s.client(&format!("squeue -h -j {id} -o %r"));
        let r = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if r.contains("cannot be read") {
            break r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(40),
            "job {id} not held, reason '{r}'{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    println!("held with reason: {reason}");
    assert!(s.client(&format!("scancel {id}")).status.success());
    s.wait_gone(&id, 60);
    s.no_buffers_left();
    assert!(!home.join("dst2").join("secret.bin").exists());
    println!("all done after {:.1} s", t0.elapsed().as_secs_f64());
}

/// Stage-out under failures, with the drain limited to 10 MB/s so that it lasts a few
/// seconds: a second exclusive job runs while the first is in stage-out; scancel during
/// stage-out keeps every file already staged out whole; kill -9 of the `tierstack umount` and
/// then of the mount daemon during data_out: the hook mounts the buffer again and the drain
/// resumes. Then the node-local mode (Prolog/Epilog).
#[test]
fn slurm_stage_out_failures_and_node_local() {
    if let Err(why) = ensure_slurm() {
        skip(&why);
        return;
    }
    let t0 = Instant::now();
    let s = Slurm::start();
    let home = s.root.join("home");
    s.install(&["--drain-rate", "10"]);

    // --- A second job (exclusive, with a buffer of its own) runs while the first stages out.
    let writer = |name: &str, mib: usize, dst: &Path, extra: &str| {
        s.script(
            &format!("{name}.sh"),
            &format!(
                "#!/bin/bash\n#BB_LUA pool=tierstack capacity=1G stage_out={}\n{extra}set -e\n\
                 for i in $(seq 0 {}); do head -c {}M /dev/urandom > \"$TIERSTACK_DIR/f$i.bin\"; done\n\
                 sha256sum \"$TIERSTACK_DIR\"/f*.bin | sed 's|  .*/|  |' > \"$TIERSTACK_DIR/sums\"\n",
                dst.display(),
                mib / 10 - 1,
                10
            ),
        )
    };
    let da = home.join("out-a");
    let db = home.join("out-b");
    let a = writer("so-a", 60, &da, "");
    let b = s.script(
        "so-b.sh",
        &format!(
            "#!/bin/bash\n#BB_LUA pool=tierstack capacity=500M stage_out={}\necho b > \"$TIERSTACK_DIR/b.txt\"\n",
            db.display()
        ),
    );
    let ida = s.submit("--exclusive", &a);
    s.wait_state(&ida, "RUNNING", 30);
    let idb = s.submit("--exclusive", &b);
    s.wait_state(&ida, "STAGE_OUT", 30);
    let t = Instant::now();
    let mut b_ran = false;
    while s.state(&ida) == "STAGE_OUT" && t.elapsed() < Duration::from_secs(60) {
        let sb = s.state(&idb);
        if sb == "RUNNING" || sb == "COMPLETING" || sb == "STAGE_OUT" || sb.is_empty() {
            b_ran = true;
            println!("job {idb} is '{sb}' while job {ida} stages out");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        b_ran,
        "the second job did not run during the first one's stage-out{}",
        s.logs()
    );
    s.wait_gone(&ida, 60);
    s.wait_gone(&idb, 60);
    let check_sums = |d: &Path| -> usize {
        let sums = fs::read_to_string(d.join("sums")).expect("sums");
        let mut n = 0;
        for l in sums.lines() {
            let (want, name) = l.split_once("  ").expect("sum line");
            let o = sh(&format!("sha256sum {}", d.join(name).display()));
            let got = String::from_utf8_lossy(&o.stdout);
            assert!(got.starts_with(want), "{name} differs after stage-out");
            n += 1;
        }
        n
    };
    assert_eq!(check_sums(&da), 6);
    assert_eq!(fs::read_to_string(db.join("b.txt")).expect("b.txt"), "b\n");
    s.no_buffers_left();
    println!(
        "second job during stage-out ok after {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // --- scancel during stage-out: SLURM 22.05 lets data_out finish (everything arrives);
    // `scancel --hurry` runs teardown with hurry=true at once: the files already staged out
    // stay whole, the rest is dropped, nothing half written is left, the buffer is removed.
    for (k, hurry) in [("c", ""), ("h", "--hurry ")] {
        let dc = home.join(format!("out-{k}"));
        let c = writer(&format!("so-{k}"), 80, &dc, "");
        let idc = s.submit("", &c);
        s.wait_state(&idc, "STAGE_OUT", 60);
        let t = Instant::now();
        // Staged out = there with all its bytes: the namespace journal creates a file in DST
        // (empty) before its data drains, and the data arrives by a rename when complete.
        let whole = |d: &Path| -> Vec<(String, String)> {
            let mut v: Vec<(String, String)> = fs::read_dir(d)
                .map(|r| {
                    r.flatten()
                        .filter(|e| {
                            !e.file_name()
                                .to_string_lossy()
                                .starts_with(".tierstack-tmp")
                                && e.metadata().is_ok_and(|m| m.len() == 10 << 20)
                        })
                        .map(|e| {
                            let o = sh(&format!("sha256sum {}", e.path().display()));
                            (
                                e.file_name().to_string_lossy().into_owned(),
                                String::from_utf8_lossy(&o.stdout).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            v.sort();
            v
        };
        let done_before = loop {
            let v = whole(&dc);
            if !v.is_empty() {
                break v;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "nothing staged out{}",
                s.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(s.state(&idc), "STAGE_OUT", "stage-out ended before scancel");
        assert!(s.client(&format!("scancel {hurry}{idc}")).status.success());
        s.wait_gone(&idc, 60);
        s.no_buffers_left();
        let left: Vec<(String, u64)> = fs::read_dir(&dc)
            .expect("dc")
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().map(|m| m.len()).unwrap_or(0),
                )
            })
            .collect();
        let names: Vec<&String> = done_before.iter().map(|(n, _)| n).collect();
        println!("after scancel {hurry}in stage-out: {names:?} were out, {left:?} are there");
        let after = whole(&dc);
        for f in &done_before {
            assert!(
                after.contains(f),
                "{} was staged out before scancel and is gone or changed",
                f.0
            );
        }
        assert!(
            left.iter().all(|(n, _)| !n.starts_with(".tierstack-tmp")),
            "half-drained temporary files left: {left:?}"
        );
        // No output is half there: whole, or (--hurry, data dropped) created empty.
        for (n, len) in &left {
            if n.ends_with(".bin") {
                assert!(*len == 10 << 20 || *len == 0, "{n} has {len} bytes");
            }
        }
        if hurry.is_empty() {
            assert_eq!(check_sums(&dc), 8, "plain scancel: every output staged out");
        }
    }
    println!(
        "scancel during stage-out ok after {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // --- kill -9 during data_out: first the hook's `tierstack umount`, then the mount
    // daemon; the hook mounts the buffer again over its fast tier and the drain resumes.
    let dd = home.join("out-d");
    let d = writer("so-d", 60, &dd, "");
    let idd = s.submit("", &d);
    s.wait_state(&idd, "STAGE_OUT", 60);
    let mnt = s.fast.join("jobs").join(&idd).join("mnt");
    let mnt_s = mnt.to_string_lossy().into_owned();
    let find = |words: &[&str]| -> i32 {
        let t = Instant::now();
        loop {
            if let Some(p) = pids_with(words).first() {
                return *p;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "no process {words:?}{}",
                s.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let umount = find(&[BIN, "umount", &mnt_s]);
    // SAFETY: kill(2) on the test's own job's umount process.
    unsafe { libc::kill(umount, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(500));
    let o = Command::new(BIN)
        .args(["status", &mnt_s, "--json"])
        .output()
        .expect("status");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let daemon = v["pid"].as_i64().unwrap_or(0) as i32;
    assert!(daemon > 0, "no daemon pid for {mnt_s}{}", s.logs());
    assert_eq!(
        s.state(&idd),
        "STAGE_OUT",
        "stage-out ended before the kill"
    );
    // SAFETY: kill(2) on the test's own job's mount daemon.
    unsafe { libc::kill(daemon, libc::SIGKILL) };
    println!("killed umount {umount} and mount daemon {daemon} of job {idd} in stage-out");
    s.wait_gone(&idd, 90);
    assert_eq!(
        check_sums(&dd),
        6,
        "job {idd}'s outputs after the kills{}",
        s.logs()
    );
    s.no_buffers_left();
    println!(
        "kill -9 during data_out ok after {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // --- Node-local mode: the Prolog mounts a buffer on the node and stages in, the job sees
    // it as $TIERSTACK_DIR, the Epilog drains it in the background after the job.
    let dn = home.join("out-n");
    let src = home.join("n-in.bin");
    write_data(&src, 2, 5);
    let n = s.script(
        "node.sh",
        &format!(
            "#!/bin/bash\n#BB_LUA node_local=256M stage_in={src} stage_out={dn}\nset -e\n\
             case \"$TIERSTACK_DIR\" in {fast}/node/jobs/*) ;; *) echo bad dir $TIERSTACK_DIR; exit 1;; esac\n\
             grep -q \" $TIERSTACK_DIR fuse\" /proc/mounts\ncmp \"$TIERSTACK_DIR/n-in.bin\" {src}\n\
             head -c 3M /dev/urandom > \"$TIERSTACK_DIR/n-out.bin\"\ncp \"$TIERSTACK_DIR/n-out.bin\" {home}/n-ref.bin\necho node-ok\n",
            src = src.display(),
            dn = dn.display(),
            fast = s.fast.display(),
            home = home.display()
        ),
    );
    let (o, outs) = s.submit_wait("node", "", &n);
    assert!(
        o.status.success() && outs.iter().any(|t| t.contains("node-ok")),
        "node-local job: {} {} {outs:?}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        s.logs()
    );
    let t = Instant::now();
    let node_jobs = s.fast.join("node/jobs");
    while t.elapsed() < Duration::from_secs(30)
        && fs::read_dir(&node_jobs).is_ok_and(|mut r| r.next().is_some())
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "node-local buffer drained {:.1} s after the job",
        t.elapsed().as_secs_f64()
    );
    let want = fs::read(home.join("n-ref.bin")).expect("n-ref");
    assert!(fs::read(dn.join("n-out.bin")).expect("DN/n-out.bin") == want);
    assert!(fs::read(dn.join("n-in.bin")).expect("DN/n-in.bin") == fs::read(&src).expect("src"));
    let left: Vec<_> = fs::read_dir(&node_jobs)
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "node-local buffers left: {left:?}");
    s.no_buffers_left();
    println!(
        "node-local job ok after {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // --- node_local= with a stage_out the user may not write: the controller's setup hook
    // holds the job with the reason before any node's Prolog runs.
    let bad = s.script(
        "node-bad.sh",
        "#!/bin/bash\n#BB_LUA node_local=256M stage_out=/root/tierstack-denied\ntrue\n",
    );
    let idbad = s.submit("", &bad);
    let t = Instant::now();
    loop {
        let o = s.client(&format!("squeue -h -j {idbad} -o %r"));
        let r = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if r.contains("stage_out=/root/tierstack-denied") {
            println!("node-local job held: {r}");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "job {idbad} not held, reason '{r}'{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(s.client(&format!("scancel {idbad}")).status.success());
    s.wait_gone(&idbad, 30);
    assert!(!Path::new("/root/tierstack-denied").exists());

    // --- A node-local drain killed after the Epilog (kill -9 of the background drain and of
    // the mount daemon) is started again by the next job's Epilog on the node; nothing lost.
    let dk = home.join("out-k");
    let k = s.script(
        "node-k.sh",
        &format!(
            "#!/bin/bash\n#BB_LUA node_local=256M stage_out={}\nset -e\n\
             for i in $(seq 0 7); do head -c 10M /dev/urandom > \"$TIERSTACK_DIR/f$i.bin\"; done\n\
             sha256sum \"$TIERSTACK_DIR\"/f*.bin | sed 's|  .*/|  |' > \"$TIERSTACK_DIR/sums\"\n",
            dk.display()
        ),
    );
    // Not sbatch --wait: it polls every few seconds, and the drain (80 MiB at 10 MB/s)
    // must still run when the test looks for it.
    let idk = s.submit("", &k);
    s.wait_gone(&idk, 60);
    let kdir = node_jobs.join(&idk);
    let kmnt = kdir.join("mnt").to_string_lossy().into_owned();
    let drainer = find(&[BIN, "node-drain", &idk]);
    // SAFETY: kill(2) on the test's own job's background drain.
    unsafe { libc::kill(drainer, libc::SIGKILL) };
    let o = Command::new(BIN)
        .args(["status", &kmnt, "--json"])
        .output()
        .expect("status");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let daemon = v["pid"].as_i64().unwrap_or(0) as i32;
    assert!(
        daemon > 0,
        "node-local daemon of job {idk} already gone: {v}"
    );
    // SAFETY: kill(2) on the test's own job's mount daemon.
    unsafe { libc::kill(daemon, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        kdir.exists(),
        "the buffer of job {idk} was gone before the kill"
    );
    println!("killed node-drain {drainer} and daemon {daemon} of job {idk}");
    let next = s.script("next.sh", "#!/bin/bash\ntrue\n");
    let (o, _) = s.submit_wait("next", "", &next);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(40) && kdir.exists() {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !kdir.exists(),
        "job {idk}'s node-local drain was not resumed{}",
        s.logs()
    );
    assert_eq!(
        check_sums(&dk),
        8,
        "job {idk}'s outputs after the resumed drain"
    );
    s.no_buffers_left();
    println!("all done after {:.1} s", t0.elapsed().as_secs_f64());
}

/// Node-local mode on two compute nodes: two slurmd, each in a UTS and mount namespace of its
/// own (one host, 127.0.0.1, a port each). A `-N 2` job with `node_local=` gets a buffer on
/// each node from its Prolog (inputs staged in on both), its tasks on both nodes see their own
/// node's buffer as $TIERSTACK_DIR, and each node's Epilog drains it to the shared stage_out.
#[test]
fn slurm_node_local_two_nodes() {
    if let Err(why) = ensure_slurm() {
        skip(&why);
        return;
    }
    let t0 = Instant::now();
    let s = Slurm::start_nodes(&["n1", "n2"]);
    let home = s.root.join("home");
    let src = home.join("in.bin");
    write_data(&src, 2, 3);
    let dst = home.join("dst");
    let job = s.script(
        "multi.sh",
        &format!(
            "#!/bin/bash\n#SBATCH -N 2\n#BB_LUA node_local=128M stage_in={src} stage_out={dst}\nset -e\n\
             srun -N2 -n2 bash -c 'cmp \"$TIERSTACK_DIR/in.bin\" {src} && grep -q \" $TIERSTACK_DIR fuse\" /proc/mounts \
             && hostname > \"$TIERSTACK_DIR/host-$SLURMD_NODENAME.txt\" \
             && cp \"$TIERSTACK_DIR/../fanin-0.json\" {home}/fanin-$SLURMD_NODENAME.json && echo task on $(hostname) ok'\necho multi-ok\n",
            src = src.display(),
            dst = dst.display(),
            home = home.display()
        ),
    );
    let (o, outs) = s.submit_wait("multi", "", &job);
    assert!(
        o.status.success()
            && outs.iter().any(|t| t.contains("task on n1 ok")
                && t.contains("task on n2 ok")
                && t.contains("multi-ok")),
        "two-node job: {} {} {outs:?}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        s.logs()
    );
    // Each node's Epilog drains its buffer in the background: wait for both (bounded).
    let t = Instant::now();
    let empty = |n: &str| {
        fs::read_dir(s.root.join(n).join("fastnode/jobs")).is_ok_and(|mut r| r.next().is_none())
    };
    while t.elapsed() < Duration::from_secs(30) && !(empty("n1") && empty("n2")) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        empty("n1") && empty("n2"),
        "node-local buffers left{}",
        s.logs()
    );
    for n in ["n1", "n2"] {
        let got = fs::read_to_string(dst.join(format!("host-{n}.txt"))).unwrap_or_default();
        assert_eq!(got, format!("{n}\n"), "node {n}'s output in DST");
    }
    assert!(fs::read(dst.join("in.bin")).expect("in.bin") == fs::read(&src).expect("src"));
    // The Prologs staged in by fan-out: n1 read the shared file system, n2 got the bytes from
    // n1; both buffers adopted the copy as clean cache of stage_out's in.bin, which n1 wrote
    // there once.
    let len = fs::metadata(&src).expect("src").len();
    let fanin = |n: &str| -> serde_json::Value {
        let p = home.join(format!("fanin-{n}.json"));
        serde_json::from_str(&fs::read_to_string(&p).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{}: {e}{}", p.display(), s.logs()))
    };
    let (a, b) = (fanin("n1"), fanin("n2"));
    assert_eq!(a["from_shared"], len, "{a}");
    assert_eq!(a["published_files"], 1, "{a}");
    assert_eq!(b["from_parent"], len, "{b}");
    assert_eq!(b["from_shared"], 0, "{b}");
    for r in [&a, &b] {
        assert_eq!(r["adopted_files"], 1, "{r}");
        assert_eq!(r["copied_into_mount"], 0, "{r}");
    }
    s.no_buffers_left();
    println!("two nodes ok after {:.1} s", t0.elapsed().as_secs_f64());
}

/// install is idempotent, refuses to overwrite a file it did not write, uninstall removes only
/// its own files; a slurm.conf without the plugin line gets the exact line to add.
#[test]
fn install_and_uninstall() {
    let d = tempfile::tempdir().expect("tempdir");
    let conf = d.path().join("etc");
    fs::create_dir(&conf).expect("mkdir");
    fs::write(conf.join("slurm.conf"), "ClusterName=x\n").expect("slurm.conf");
    let fast = d.path().join("fast");
    let install = || {
        Command::new(BIN)
            .args(["slurm", "install", "--conf-dir"])
            .arg(&conf)
            .arg("--fast-dir")
            .arg(&fast)
            .args(["--pool-size", "2G"])
            .output()
            .expect("install")
    };
    let o = install();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    // The slurm.conf lines to add, each exact.
    for want in [
        "BurstBufferType=burst_buffer/lua".to_string(),
        "JobSubmitPlugins=lua".to_string(),
        format!("Prolog={}", conf.join("tierstack_prolog.sh").display()),
        format!("Epilog={}", conf.join("tierstack_epilog.sh").display()),
        format!(
            "TaskProlog={}",
            conf.join("tierstack_task_prolog.sh").display()
        ),
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("add this line") && l.ends_with(&format!(": {want}"))),
            "{want} not asked for: {text}"
        );
    }
    let names = [
        "burst_buffer.lua",
        "burst_buffer.conf",
        "job_submit.lua",
        "tierstack_prolog.sh",
        "tierstack_epilog.sh",
        "tierstack_task_prolog.sh",
    ];
    let lua = fs::read_to_string(conf.join("burst_buffer.lua")).expect("lua");
    assert!(lua.contains(BIN) && lua.contains("2147483648") && !lua.contains('@'));
    let prolog = fs::read_to_string(conf.join("tierstack_prolog.sh")).expect("prolog");
    assert!(prolog.contains(BIN) && prolog.contains("slurm prolog") && !prolog.contains('@'));
    let task = fs::read_to_string(conf.join("tierstack_task_prolog.sh")).expect("task prolog");
    assert!(task.contains(BIN) && task.contains("slurm task-prolog") && !task.contains('@'));
    // Whatever happens, the TaskProlog exits 0 and prints no line to the task.
    for dir in ["", "/nonexistent", "/"] {
        let o = Command::new("sh")
            .arg(conf.join("tierstack_task_prolog.sh"))
            .env("TIERSTACK_DIR", dir)
            .output()
            .expect("task prolog");
        assert!(o.status.success() && o.stdout.is_empty(), "{dir}: {o:?}");
    }
    let mode = fs::metadata(conf.join("tierstack_epilog.sh"))
        .expect("epilog")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "the Epilog is executable");
    let before: Vec<String> = names
        .iter()
        .map(|n| fs::read_to_string(conf.join(n)).expect("installed"))
        .collect();
    let o = install();
    assert!(o.status.success());
    for (n, b) in names.iter().zip(&before) {
        assert_eq!(&fs::read_to_string(conf.join(n)).expect("again"), b, "{n}");
    }
    // With the lines in slurm.conf, install asks for nothing.
    fs::write(
        conf.join("slurm.conf"),
        format!(
            "ClusterName=x\nBurstBufferType=burst_buffer/lua\nJobSubmitPlugins=lua\nProlog={}\nEpilog={}\ntaskprolog={}\n",
            conf.join("tierstack_prolog.sh").display(),
            conf.join("tierstack_epilog.sh").display(),
            conf.join("tierstack_task_prolog.sh").display()
        ),
    )
    .expect("slurm.conf");
    let o = install();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && !text.contains("add this line"),
        "{text}"
    );
    // Bad input: one line, non-zero exit, nothing written.
    let o = Command::new(BIN)
        .args([
            "slurm",
            "install",
            "--conf-dir",
            "/nonexistent",
            "--pool-size",
            "2G",
        ])
        .output()
        .expect("install");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.lines().count() == 1 && err.contains("not a folder"),
        "{err}"
    );
    let o = Command::new(BIN)
        .args(["slurm", "uninstall", "--conf-dir"])
        .arg(&conf)
        .output()
        .expect("uninstall");
    assert!(o.status.success());
    for n in names {
        assert!(!conf.join(n).exists(), "{n} left by uninstall");
    }
    assert!(conf.join("slurm.conf").exists());
    // A site's own job_submit.lua is kept (install says what to merge) and uninstall keeps it.
    fs::write(conf.join("job_submit.lua"), "-- the site's\n").expect("write");
    let o = install();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && text.contains("kept"), "{text}");
    assert_eq!(
        fs::read_to_string(conf.join("job_submit.lua")).expect("site's"),
        "-- the site's\n"
    );
    let o = Command::new(BIN)
        .args(["slurm", "uninstall", "--conf-dir"])
        .arg(&conf)
        .output()
        .expect("uninstall");
    assert!(o.status.success() && conf.join("job_submit.lua").exists());
    fs::remove_file(conf.join("job_submit.lua")).expect("rm");
    // A burst_buffer.conf of the site's own is never overwritten.
    fs::write(conf.join("burst_buffer.conf"), "StageInTimeout=5\n").expect("write");
    let o = install();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("not written by tierstack"),
        "{err}"
    );
    assert!(!conf.join("burst_buffer.lua").exists(), "half-installed");
    assert_eq!(
        fs::read_to_string(conf.join("burst_buffer.conf")).expect("conf"),
        "StageInTimeout=5\n"
    );
}

/// `bench io --launcher srun` in an sbatch job: the ranks run as a job step of the job's
/// allocation (srun, PMIx) and the rows come back as with mpirun; the report says how the
/// ranks were started.
#[test]
fn bench_io_ranks_as_a_job_step() {
    if let Err(why) = ensure_slurm() {
        skip(&why);
        return;
    }
    if !sh("command -v mpicc && command -v mpirun").status.success() {
        skip("no MPI (apt-get install openmpi-bin libopenmpi-dev)");
        return;
    }
    let s = Slurm::start();
    let home = s.root.join("home");
    let out = home.join("io.json");
    let script = s.script(
        "io.sh",
        &format!(
            "#!/bin/sh\nset -e\nmkdir -p {}\n{BIN} bench io --launcher srun --ranks 2 --block 1M --size-per-rank 4M --reps 2 --target {} --timeout 120 --json > {}\n",
            home.join("io").display(),
            home.join("io").display(),
            out.display()
        ),
    );
    let (o, outs) = s.submit_wait("io", "-n 2", &script);
    let text = fs::read_to_string(&out).unwrap_or_default();
    assert!(
        o.status.success() && !text.is_empty(),
        "job failed: {}\n{}{}",
        String::from_utf8_lossy(&o.stderr),
        outs.join("\n"),
        s.logs()
    );
    let j: serde_json::Value = serde_json::from_str(&text).expect("bench io JSON");
    assert_eq!(j["host"]["launcher"], "srun", "{text}");
    let rows = j["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{text}");
    assert_eq!(rows[0]["ranks"], 2);
    assert_eq!(rows[0]["reps"], 2);
    assert!(
        rows[0]["write_mibps"].as_f64().expect("write") > 0.0,
        "{text}"
    );
    assert_eq!(rows[0]["read_errors"], 0, "{text}");
}

/// The content of file `i` that the io jobs write (and the test checks at stage_out).
fn io_file(i: usize) -> Vec<u8> {
    (0..(i + 1) * 300_000)
        .map(|j| ((j * 7 + i) % 251) as u8)
        .collect()
}

/// The TaskProlog puts every task of a job with a buffer under the interception client: the
/// batch script and an srun task get `LD_PRELOAD` (once) and `TIERSTACK_IO` for the buffer, a
/// Python program's files go through the client (the mount counts its clients and calls) and
/// reach the stage_out destination intact. `#BB_LUA io=off` leaves the tasks alone.
#[test]
fn slurm_task_prolog_puts_tasks_under_the_io_client() {
    if let Err(why) = ensure_slurm() {
        skip(&why);
        return;
    }
    if !sh("command -v python3").status.success() {
        skip("no python3");
        return;
    }
    let s = Slurm::start();
    let home = s.root.join("home");
    // A bad io= is refused at submission, in one line.
    let bad = s.script(
        "io-bad.sh",
        "#!/bin/bash\n#BB_LUA pool=tierstack capacity=1G io=maybe\ntrue\n",
    );
    let o = s.user(&format!("sbatch -o /dev/null {}", bad.display()));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("io=maybe is unknown: use io=on or io=off"),
        "sbatch said: {err}"
    );
    // The program writes and reads back its files, then asks the mount's status while it is
    // still connected (`during`, its clients). The daemon adds a client's calls to io_calls
    // when it goes: `after` is the status once no client is left (bounded), asked from
    // outside the client.
    let status = |name: &str| {
        format!(
            "def status(name):\n\
             \x20   env = dict(os.environ)\n\
             \x20   env.pop('LD_PRELOAD', None)\n\
             \x20   out = subprocess.run(['{BIN}', 'status', os.environ['TIERSTACK_DIR'], '--json'], env=env, check=True, stdout=subprocess.PIPE).stdout\n\
             \x20   with open('{}-%s.json' % name, 'wb') as f:\n\
             \x20       f.write(out)\n\
             \x20   return json.loads(out)\n",
            home.join(format!("status-{name}")).display()
        )
    };
    for (name, io) in [("on", ""), ("off", " io=off")] {
        let dst = home.join(format!("dst-{name}"));
        let prog = home.join(format!("prog-{name}.py"));
        fs::write(
            &prog,
            format!(
                "import json, os, subprocess\n{}\
                 d = os.environ['TIERSTACK_DIR']\n\
                 os.mkdir(d + '/sub')\n\
                 for i in range(4):\n\
                 \x20   data = bytes((j * 7 + i) % 251 for j in range((i + 1) * 300000))\n\
                 \x20   with open(d + '/sub/f%d.bin' % i, 'wb') as f:\n\
                 \x20       f.write(data)\n\
                 \x20   with open(d + '/sub/f%d.bin' % i, 'rb') as f:\n\
                 \x20       assert f.read() == data\n\
                 status('during')\n",
                status(name)
            ),
        )
        .expect("write program");
        let after = home.join(format!("after-{name}.py"));
        fs::write(
            &after,
            format!(
                "import json, os, subprocess, time\n{}\
                 for _ in range(100):\n\
                 \x20   if status('after')['io_clients'] == 0:\n\
                 \x20       break\n\
                 \x20   time.sleep(0.1)\n",
                status(name)
            ),
        )
        .expect("write program");
        let job = s.script(
            &format!("io-{name}.sh"),
            &format!(
                "#!/bin/bash\n#BB_LUA pool=tierstack capacity=1G stage_out={dst}{io}\nset -e\n\
                 echo \"batch LD_PRELOAD=$LD_PRELOAD\"\necho \"batch TIERSTACK_IO=$TIERSTACK_IO\"\n\
                 echo \"batch TIERSTACK_IO_OFF=$TIERSTACK_IO_OFF\"\n\
                 srun -n1 bash -c 'echo \"step LD_PRELOAD=$LD_PRELOAD\"'\n\
                 python3 {prog}\nenv -u LD_PRELOAD python3 {after}\necho job-ok\n",
                dst = dst.display(),
                prog = prog.display(),
                after = after.display()
            ),
        );
        let (o, outs) = s.submit_wait(&format!("io-{name}"), "", &job);
        let out = outs.join("\n");
        assert!(
            o.status.success() && out.contains("job-ok"),
            "job io={name}: {} {}\n{out}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            s.logs()
        );
        let read = |when: &str| -> serde_json::Value {
            let p = home.join(format!("status-{name}-{when}.json"));
            let text = fs::read_to_string(&p).expect("status written by the job");
            serde_json::from_str(&text).expect("status JSON")
        };
        let clients = read("during")["io_clients"].as_u64();
        let calls = read("after")["io_calls"].as_u64();
        let line = |prefix: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .unwrap_or_default()
                .to_string()
        };
        let (batch, step) = (line("batch LD_PRELOAD="), line("step LD_PRELOAD="));
        println!(
            "io={name}: io_clients {clients:?} while the program ran, io_calls {calls:?} after; \
             batch LD_PRELOAD '{batch}', step '{step}'"
        );
        if name == "on" {
            assert!(
                clients.is_some_and(|c| c > 0) && calls.is_some_and(|c| c > 10),
                "no io through the client:\n{out}"
            );
            for v in [&batch, &step] {
                assert_eq!(
                    v.matches("libtierstack_io.so").count(),
                    1,
                    "LD_PRELOAD of a task: {out}"
                );
            }
            let io = line("batch TIERSTACK_IO=");
            assert!(
                io.starts_with(&format!("{}/", s.fast.join("jobs").display()))
                    && io.contains("/mnt=")
                    && io.ends_with(".io2"),
                "{out}"
            );
        } else {
            assert_eq!((clients, calls), (Some(0), Some(0)), "io=off:\n{out}");
            assert!(
                !batch.contains("libtierstack_io") && !step.contains("libtierstack_io"),
                "{out}"
            );
            assert_eq!(line("batch TIERSTACK_IO_OFF="), "1", "{out}");
        }
        for i in 0..4 {
            let got = fs::read(dst.join(format!("sub/f{i}.bin"))).unwrap_or_default();
            assert!(
                got == io_file(i),
                "io={name}: DST/sub/f{i}.bin has {} bytes, not what the job wrote{}",
                got.len(),
                s.logs()
            );
        }
    }
    s.no_buffers_left();
}
