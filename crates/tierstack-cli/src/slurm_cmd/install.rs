//! Installing and removing the Slurm plugin files (the Lua script and its configuration).

use std::fs;
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use tierstack_bench::{fmt_size, parse_size};

use super::creds::exe;
use super::state::write_atomic;
use super::{CONF_TEMPLATE, LUA_TEMPLATE, MARKER, POOL};

// ---------------------------------------------------------------------------------------------
// install / uninstall

pub(super) fn lua_quote(s: &str) -> String {
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

pub(super) fn install(
    conf: &Path,
    fast: &Path,
    pool: &str,
    stage_timeout: u64,
    other_timeout: u64,
) -> Result<()> {
    let pool_bytes = parse_size(pool).map_err(|e| anyhow!("--pool-size: {e}"))?;
    if pool_bytes < 1 << 20 {
        bail!("--pool-size {pool} is smaller than 1M: give e.g. 2G");
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
    let exe = exe()?;
    let lua = LUA_TEMPLATE
        .replace("\"@TIERSTACK@\"", &lua_quote(&exe.to_string_lossy()))
        .replace("\"@FAST_DIR@\"", &lua_quote(&fast.to_string_lossy()))
        .replace("\"@POOL_SIZE@\"", &lua_quote(&pool_bytes.to_string()))
        .replace("@STAGE_TIMEOUT@", &stage_timeout.to_string())
        .replace("@OTHER_TIMEOUT@", &other_timeout.to_string());
    let bbconf = CONF_TEMPLATE
        .replace("@STAGE_TIMEOUT@", &stage_timeout.to_string())
        .replace("@OTHER_TIMEOUT@", &other_timeout.to_string());
    let files = [
        (conf.join("burst_buffer.lua"), lua),
        (conf.join("burst_buffer.conf"), bbconf),
    ];
    // Refuse before writing anything if a file is someone else's.
    for (p, _) in &files {
        if let Ok(old) = fs::read_to_string(p) {
            if !old.contains(MARKER) {
                bail!(
                    "{} exists and was not written by tierstack: move it away (or merge it by hand) and run install again",
                    p.display()
                );
            }
        }
    }
    fs::create_dir_all(fast.join("jobs")).map_err(|e| {
        anyhow!(
            "cannot create {}: {e}: give a --fast-dir on a writable file system",
            fast.join("jobs").display()
        )
    })?;
    for (p, text) in &files {
        write_atomic(p, text.as_bytes(), 0o644)?;
    }
    println!(
        "wrote {} and {} (pool {POOL} of {}, buffers in {})",
        files[0].0.display(),
        files[1].0.display(),
        fmt_size(pool_bytes),
        fast.display()
    );
    let slurm_conf = conf.join("slurm.conf");
    let has = fs::read_to_string(&slurm_conf)
        .map(|t| {
            t.lines().any(|l| {
                let l: String = l
                    .split('#')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .collect();
                l.eq_ignore_ascii_case("BurstBufferType=burst_buffer/lua")
            })
        })
        .unwrap_or(false);
    if !has {
        println!(
            "add this line to {} and restart slurmctld: BurstBufferType=burst_buffer/lua",
            slurm_conf.display()
        );
    } else {
        println!("slurm.conf has BurstBufferType=burst_buffer/lua: run `scontrol reconfigure` (or restart slurmctld)");
    }
    Ok(())
}

pub(super) fn uninstall(conf: &Path) -> Result<()> {
    let mut removed = 0;
    for name in ["burst_buffer.lua", "burst_buffer.conf"] {
        let p = conf.join(name);
        match fs::read_to_string(&p) {
            Ok(t) if t.contains(MARKER) => {
                fs::remove_file(&p).map_err(|e| {
                    anyhow!("cannot remove {}: {e}: remove it by hand", p.display())
                })?;
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
        "removed {removed} file(s) from {}; remove BurstBufferType=burst_buffer/lua from slurm.conf and restart slurmctld",
        conf.display()
    );
    Ok(())
}
