//! The `#BB_LUA` directives of a job script: the words, the parser and the request it
//! yields.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::Result;
use tierstack_common::parse_size;

use crate::POOL;

// ---------------------------------------------------------------------------------------------
// Directives

/// `mode=` of a job's mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Sync,
    Async,
}

/// What a job script asks for in its `#BB_LUA` lines.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    pub pool: Option<String>,
    pub capacity: Option<u64>,
    pub stage_in: Vec<PathBuf>,
    pub stage_out: Vec<PathBuf>,
    pub mode: Option<Mode>,
    pub manifest: Option<PathBuf>,
    /// `node_local=SIZE`: a buffer of SIZE on each of the job's nodes, made by the Prolog.
    pub node_local: Option<u64>,
    /// `io=on|off`: whether the TaskProlog puts the job's tasks under the interception
    /// client (none given: on).
    pub io: Option<bool>,
}

/// Splits a directive line into words; a word may be written in double quotes (`\"`, `\\`).
pub(crate) fn words(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            '\\' if quoted => match chars.next() {
                Some(n) => cur.push(n),
                None => return Err("a '\\' ends the line".into()),
            },
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quoted {
        return Err("a '\"' is not closed".into());
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Parses the `#BB_LUA` lines of a job script: they come after the `#!` line, among the
/// leading comment lines (SLURM ignores those after the first command). Each is a list of
/// `KEY=VALUE` words: `pool=tierstack capacity=SIZE [stage_in=SRC]... [stage_out=DST]...
/// [mode=sync|async] [manifest=FILE] [io=on|off]`. Errors name the line and the fix.
pub fn parse_directives(script: &str) -> Result<Request, String> {
    let mut r = Request::default();
    for (i, raw) in script.lines().enumerate() {
        let line = raw.trim();
        if i == 0 && line.starts_with("#!") {
            continue;
        }
        if line.is_empty() {
            continue;
        }
        if !line.starts_with('#') {
            break;
        }
        let Some(rest) = line.strip_prefix("#BB_LUA") else {
            continue;
        };
        if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
            continue;
        }
        let n = i + 1;
        let ws = words(rest).map_err(|e| format!("#BB_LUA on line {n}: {e}: fix the quoting"))?;
        for w in ws {
            let Some((k, v)) = w.split_once('=') else {
                return Err(format!(
                    "#BB_LUA on line {n}: '{w}' is not KEY=VALUE: write e.g. capacity=1G"
                ));
            };
            if v.is_empty() {
                return Err(format!(
                    "#BB_LUA on line {n}: {k}= has no value: give one or remove it"
                ));
            }
            let once = |set: bool| -> Result<(), String> {
                if set {
                    Err(format!(
                        "#BB_LUA on line {n}: {k}= is given twice: keep one"
                    ))
                } else {
                    Ok(())
                }
            };
            match k {
                "pool" => {
                    once(r.pool.is_some())?;
                    if v != POOL {
                        return Err(format!(
                            "#BB_LUA on line {n}: pool={v} is unknown: use pool={POOL}"
                        ));
                    }
                    r.pool = Some(v.to_string());
                }
                "capacity" | "node_local" => {
                    let slot = if k == "capacity" {
                        &mut r.capacity
                    } else {
                        &mut r.node_local
                    };
                    once(slot.is_some())?;
                    let c = parse_size(v).map_err(|e| format!("#BB_LUA on line {n}: {e}"))?;
                    if c == 0 {
                        return Err(format!(
                            "#BB_LUA on line {n}: {k}=0: give a size such as 1G"
                        ));
                    }
                    *slot = Some(c);
                }
                "stage_in" => r.stage_in.push(abs(n, k, v)?),
                "stage_out" => r.stage_out.push(abs(n, k, v)?),
                "mode" => {
                    once(r.mode.is_some())?;
                    r.mode = Some(choice(n, k, v, [("sync", Mode::Sync), ("async", Mode::Async)])?);
                }
                "io" => {
                    once(r.io.is_some())?;
                    r.io = Some(choice(n, k, v, [("on", true), ("off", false)])?);
                }
                "manifest" => {
                    once(r.manifest.is_some())?;
                    r.manifest = Some(abs(n, k, v)?);
                }
                _ => {
                    return Err(format!(
                        "#BB_LUA on line {n}: unknown key '{k}': use pool, capacity, node_local, stage_in, stage_out, mode, manifest or io"
                    ))
                }
            }
        }
    }
    if r == Request::default() {
        return Ok(r);
    }
    if r.node_local.is_some() {
        if r.capacity.is_some() || r.pool.is_some() {
            return Err(format!(
                "#BB_LUA: node_local= (a buffer on each node) and pool={POOL} capacity= (one buffer staged by the controller) are two modes: give one"
            ));
        }
    } else if r.capacity.is_none() {
        return Err(format!(
            "#BB_LUA: no capacity= given: add e.g. '#BB_LUA pool={POOL} capacity=1G' (or node_local=1G for a buffer on each node)"
        ));
    } else if r.pool.is_none() {
        return Err(format!(
            "#BB_LUA: capacity= needs pool={POOL} on the same line: add it"
        ));
    }
    if r.manifest.is_some() && r.stage_in.len() != 1 {
        return Err(
            "#BB_LUA: manifest= lists paths relative to one stage_in= root: give exactly one stage_in="
                .into(),
        );
    }
    Ok(r)
}

/// The value of the word `v` among the two `choices` of key `k`; an unknown word names both.
fn choice<T: Copy>(n: usize, k: &str, v: &str, choices: [(&str, T); 2]) -> Result<T, String> {
    match choices.iter().find(|(w, _)| *w == v) {
        Some((_, t)) => Ok(*t),
        None => Err(format!(
            "#BB_LUA on line {n}: {k}={v} is unknown: use {k}={} or {k}={}",
            choices[0].0, choices[1].0
        )),
    }
}

pub(crate) fn abs(n: usize, k: &str, v: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(v);
    if !p.is_absolute() {
        return Err(format!(
            "#BB_LUA on line {n}: {k}={v} is not an absolute path: give the full path"
        ));
    }
    Ok(p)
}

pub(crate) fn read_request(script: &Path) -> Result<Request> {
    let text = fs::read(script).map_err(|e| {
        err!(
            "cannot read the job script {}: {e}: check SLURM's StateSaveLocation",
            script.display()
        )
    })?;
    parse_directives(&String::from_utf8_lossy(&text)).map_err(crate::SlurmError::Hook)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_directives() {
        let s = "#!/bin/bash\n#SBATCH -N1\n#BB_LUA pool=tierstack capacity=1G stage_in=/a/b\n#BB_LUA stage_out=\"/c d\" mode=async\necho hi\n#BB_LUA bogus=1\n";
        let r = parse_directives(s).unwrap();
        assert_eq!(r.capacity, Some(1 << 30));
        assert_eq!(r.stage_in, vec![PathBuf::from("/a/b")]);
        assert_eq!(r.stage_out, vec![PathBuf::from("/c d")]);
        assert_eq!(r.mode, Some(Mode::Async));
        assert_eq!(
            parse_directives("#!/bin/sh\necho\n").unwrap(),
            Request::default()
        );
        // The BurstBuffer field of `scontrol show job` (the Prolog's source) parses the same.
        let r = parse_directives("#BB_LUA node_local=2G stage_out=/o\n#BB_LUA mode=async").unwrap();
        assert_eq!(r.node_local, Some(2 << 30));
        assert_eq!(r.capacity, None);
        assert_eq!(r.io, None);
        let r = parse_directives("#BB_LUA pool=tierstack capacity=1G io=off").unwrap();
        assert_eq!(r.io, Some(false));
        let r = parse_directives("#BB_LUA node_local=1G\n#BB_LUA io=on").unwrap();
        assert_eq!(r.io, Some(true));
    }

    #[test]
    fn refuses_bad_directives() {
        for (s, want) in [
            ("#BB_LUA pool=tierstack capacity=1Q", "invalid size"),
            (
                "#BB_LUA pool=tierstack capacity=1G color=red",
                "unknown key 'color'",
            ),
            (
                "#BB_LUA pool=tierstack capacity=1G stage_in=rel",
                "not an absolute path",
            ),
            ("#BB_LUA pool=other capacity=1G", "use pool=tierstack"),
            ("#BB_LUA capacity=1G", "needs pool=tierstack"),
            ("#BB_LUA pool=tierstack", "no capacity="),
            (
                "#BB_LUA pool=tierstack capacity=1G node_local=1G",
                "two modes",
            ),
            ("#BB_LUA node_local=0", "node_local=0"),
            ("#BB_LUA pool=tierstack capacity=1G mode=fast", "mode=fast"),
            (
                "#BB_LUA pool=tierstack capacity=1G io=no",
                "use io=on or io=off",
            ),
            (
                "#BB_LUA pool=tierstack capacity=1G io=on io=off",
                "io= is given twice",
            ),
            (
                "#BB_LUA pool=tierstack capacity=1G manifest=/m",
                "exactly one stage_in",
            ),
        ] {
            let e = parse_directives(s).unwrap_err();
            assert!(e.contains(want), "{s}: {e}");
            assert!(!e.contains('\n'));
        }
    }
}
