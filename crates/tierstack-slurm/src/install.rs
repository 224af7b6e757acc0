//! Installing and removing the Slurm plugin files (the Lua script and its configuration).

use std::fs;
use std::path::Path;

use crate::error::Result;
use tierstack_common::fmt_size;

use crate::creds::invoked_exe;
use crate::state::write_atomic;
use crate::{
    CONF_TEMPLATE, EPILOG_TEMPLATE, JOB_SUBMIT_TEMPLATE, LUA_TEMPLATE, MARKER, POOL,
    PROLOG_TEMPLATE, TASK_PROLOG_TEMPLATE,
};

// ---------------------------------------------------------------------------------------------
// install / uninstall

pub(crate) fn lua_quote(s: &str) -> String {
    let mut o = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Single-quotes a word for sh.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// What `tierstack slurm install` writes into SLURM's configuration.
pub struct Settings<'a> {
    /// SLURM's configuration folder (where slurm.conf is).
    pub conf: &'a Path,
    /// Folder of the per-job buffers.
    pub fast: &'a Path,
    /// Size of the `tierstack` pool, as given (`2G`).
    pub pool: &'a str,
    /// StageInTimeout and StageOutTimeout, in seconds.
    pub stage_timeout: u64,
    /// OtherTimeout, in seconds.
    pub other_timeout: u64,
    /// Each buffer's drain rate limit in MB/s (none: unlimited).
    pub drain_rate: Option<f64>,
}

/// The files `install` writes into the configuration folder, by name.
const FILES: [&str; 6] = [
    "burst_buffer.lua",
    "burst_buffer.conf",
    "job_submit.lua",
    "tierstack_prolog.sh",
    "tierstack_epilog.sh",
    "tierstack_task_prolog.sh",
];

/// The slurm.conf keys that name a script `install` writes: the key, the script, what it is
/// for and how a site's own script must run it when the key names another one.
const SCRIPT_KEYS: [(&str, &str, &str, &str); 3] = [
    (
        "Prolog",
        "tierstack_prolog.sh",
        "for node_local= buffers",
        "with SLURM's environment",
    ),
    (
        "Epilog",
        "tierstack_epilog.sh",
        "for node_local= buffers",
        "with SLURM's environment",
    ),
    (
        "TaskProlog",
        "tierstack_task_prolog.sh",
        "for the io client in the jobs' tasks",
        "with the task's environment, printing what it prints",
    ),
];

/// The slurm.conf settings (key and value, lower case) found in `text`, comments dropped.
fn conf_settings(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let l = l.split('#').next().unwrap_or("").trim();
            let (k, v) = l.split_once('=')?;
            Some((k.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect()
}

/// `tierstack slurm install`: writes the Lua script, burst_buffer.conf, job_submit.lua, the
/// Prolog/Epilog and the TaskProlog into SLURM's configuration folder.
pub fn install(a: &Settings) -> Result<()> {
    let (conf, fast, pool) = (a.conf, a.fast, a.pool);
    let pool_bytes = crate::pool_bytes(pool)?;
    if pool_bytes < 1 << 20 {
        bail!("--pool-size {pool} is smaller than 1M: give e.g. 2G");
    }
    if let Some(r) = a.drain_rate {
        if !(r.is_finite() && r > 0.0) {
            bail!("--drain-rate {r} is not a positive number of MB/s: give e.g. 200");
        }
    }
    if !conf.is_dir() {
        bail!(
            "--conf-dir {} is not a folder: give SLURM's configuration folder (where slurm.conf is)",
            conf.display()
        );
    }
    if !fast.is_absolute() {
        bail!(
            "--fast-dir {} is not absolute: give the full path",
            fast.display()
        );
    }
    // The path as invoked (a Spack view's or a module's symlink stays valid across upgrades).
    let exe = invoked_exe()?;
    let rate = a.drain_rate.map(|r| r.to_string()).unwrap_or_default();
    let lua = LUA_TEMPLATE
        .replace("\"@TIERSTACK@\"", &lua_quote(&exe.to_string_lossy()))
        .replace("\"@FAST_DIR@\"", &lua_quote(&fast.to_string_lossy()))
        .replace("\"@POOL_SIZE@\"", &lua_quote(&pool_bytes.to_string()))
        .replace("\"@DRAIN_RATE@\"", &lua_quote(&rate))
        .replace("@STAGE_TIMEOUT@", &a.stage_timeout.to_string())
        .replace("@OTHER_TIMEOUT@", &a.other_timeout.to_string());
    let bbconf = CONF_TEMPLATE
        .replace("@STAGE_TIMEOUT@", &a.stage_timeout.to_string())
        .replace("@OTHER_TIMEOUT@", &a.other_timeout.to_string());
    let shell = |t: &str| {
        t.replace("@TIERSTACK@", &sh_quote(&exe.to_string_lossy()))
            .replace("@FAST_DIR@", &sh_quote(&fast.to_string_lossy()))
            .replace("@POOL_SIZE@", &pool_bytes.to_string())
            .replace("@STAGE_TIMEOUT@", &a.stage_timeout.to_string())
            .replace(
                "@DRAIN_RATE@",
                &if rate.is_empty() {
                    String::new()
                } else {
                    format!(" --drain-rate {rate}")
                },
            )
    };
    let texts = [
        lua,
        bbconf,
        JOB_SUBMIT_TEMPLATE.to_string(),
        shell(PROLOG_TEMPLATE),
        shell(EPILOG_TEMPLATE),
        shell(TASK_PROLOG_TEMPLATE),
    ];
    let mut files: Vec<(std::path::PathBuf, String)> = Vec::new();
    // Refuse before writing anything if a file is someone else's; a site's own
    // job_submit.lua is kept (the --bb translation is then theirs to merge).
    let mut kept_job_submit = false;
    for (name, text) in FILES.iter().zip(texts) {
        let p = conf.join(name);
        if let Ok(old) = fs::read_to_string(&p) {
            if !old.contains(MARKER) {
                if *name == "job_submit.lua" {
                    kept_job_submit = true;
                    continue;
                }
                bail!(
                    "{} exists and was not written by tierstack: move it away (or merge it by hand) and run install again",
                    p.display()
                );
            }
        }
        files.push((p, text));
    }
    fs::create_dir_all(fast.join("jobs")).map_err(|e| {
        err!(
            "cannot create {}: {e}: give a --fast-dir on a writable file system",
            fast.join("jobs").display()
        )
    })?;
    for (p, text) in &files {
        let mode = if p.extension().is_some_and(|e| e == "sh") {
            0o755
        } else {
            0o644
        };
        write_atomic(p, text.as_bytes(), mode)?;
    }
    println!(
        "wrote {} (pool {POOL} of {}, buffers in {})",
        files
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        fmt_size(pool_bytes),
        fast.display()
    );
    if kept_job_submit {
        println!(
            "kept {}: it is the site's own; for `sbatch --bb \"pool={POOL} ...\"` merge the --bb translation of contrib/slurm/job_submit.lua into it",
            conf.join("job_submit.lua").display()
        );
    }
    let slurm_conf = conf.join("slurm.conf");
    let settings = conf_settings(&fs::read_to_string(&slurm_conf).unwrap_or_default());
    let get = |k: &str| {
        settings
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    let mut missing = Vec::new();
    let mut notes = 0;
    if !get("burstbuffertype").is_some_and(|v| v.eq_ignore_ascii_case("burst_buffer/lua")) {
        missing.push("BurstBufferType=burst_buffer/lua".to_string());
    }
    if !kept_job_submit
        && !get("jobsubmitplugins").is_some_and(|v| {
            v.split(',')
                .any(|p| matches!(p.trim(), "lua" | "job_submit/lua"))
        })
    {
        missing.push("JobSubmitPlugins=lua".to_string());
    }
    for (key, name, purpose, how) in SCRIPT_KEYS {
        let want = conf.join(name);
        // slurm.conf keys are case-blind: `conf_settings` lowers them.
        match get(&key.to_ascii_lowercase()) {
            Some(v) if Path::new(&v) == want => {}
            Some(v) => {
                notes += 1;
                println!(
                    "slurm.conf has {key}={v}: {purpose}, run {} from it ({how})",
                    want.display()
                )
            }
            None => missing.push(format!("{key}={}", want.display())),
        }
    }
    if missing.is_empty() && notes == 0 {
        println!("slurm.conf has BurstBufferType=burst_buffer/lua and the rest: run `scontrol reconfigure` (or restart slurmctld)");
    } else {
        for l in &missing {
            println!(
                "add this line to {} and restart slurmctld and slurmd: {l}",
                slurm_conf.display()
            );
        }
    }
    Ok(())
}

/// `tierstack slurm uninstall`: removes the files `install` wrote (only those with its marker).
pub fn uninstall(conf: &Path) -> Result<()> {
    let mut removed = 0;
    for name in FILES {
        let p = conf.join(name);
        match fs::read_to_string(&p) {
            Ok(t) if t.contains(MARKER) => {
                fs::remove_file(&p)
                    .map_err(|e| err!("cannot remove {}: {e}: remove it by hand", p.display()))?;
                removed += 1;
            }
            Ok(_) => eprintln!(
                "tierstack: kept {}: it was not written by tierstack",
                p.display()
            ),
            Err(_) => {}
        }
    }
    println!(
        "removed {removed} file(s) from {}; remove BurstBufferType=burst_buffer/lua, JobSubmitPlugins=lua and the Prolog/Epilog/TaskProlog lines naming tierstack_prolog.sh/tierstack_epilog.sh/tierstack_task_prolog.sh from slurm.conf and restart slurmctld and slurmd",
        conf.display()
    );
    Ok(())
}
