//! The manifest (`SRC DST` per line, quotes and comments): parsing, the checks that every
//! path stays under its root, and planning a stage from it.

use std::collections::HashMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

use super::plan::{add_entry, canonical_prefix, check_dst_dir, check_duplicates, group_hard_links};
use super::{io_err, Plan, StageError};

/// One parsed manifest line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestLine {
    /// The line's number in the manifest, from 1.
    pub line: usize,
    /// The source path, as written.
    pub src: String,
    /// The destination path, as written (the source path when the line has one field).
    pub dst: String,
}

/// Parses a manifest: one `SRC DST` pair per line, separated by white space; a field holding
/// white space is written in double quotes (`\"` and `\\` inside them); a line with one field
/// copies that path to the same relative path; `#` starts a comment (outside quotes); blank
/// lines are skipped.
pub fn parse_manifest(text: &str) -> Result<Vec<ManifestLine>, StageError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let fields = split_fields(raw).map_err(|msg| StageError::Manifest {
            line,
            msg,
            others: 0,
        })?;
        match fields.len() {
            0 => {}
            1 => out.push(ManifestLine {
                line,
                src: fields[0].clone(),
                dst: fields[0].clone(),
            }),
            2 => out.push(ManifestLine {
                line,
                src: fields[0].clone(),
                dst: fields[1].clone(),
            }),
            n => {
                return Err(StageError::Manifest {
                    line,
                    msg: format!(
                        "{n} fields: write `SRC DST` (quote a path that holds spaces: \"my file\")"
                    ),
                    others: 0,
                })
            }
        }
    }
    Ok(out)
}

pub(super) fn split_fields(raw: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut chars = raw.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.peek() {
            None | Some('#') => break,
            Some('"') => {
                chars.next();
                let mut f = String::new();
                loop {
                    match chars.next() {
                        None => {
                            return Err(
                                "a quoted path has no closing '\"': close the quotes".to_string()
                            )
                        }
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => f.push(c),
                            None => {
                                return Err(
                                    "a quoted path ends with '\\': close the quotes".to_string()
                                )
                            }
                        },
                        Some(c) => f.push(c),
                    }
                }
                if chars.peek().is_some_and(|c| !c.is_whitespace()) {
                    return Err(
                        "text right after a closing '\"': separate the fields with a space"
                            .to_string(),
                    );
                }
                if f.is_empty() {
                    return Err("an empty path \"\": write `.` for the root itself".to_string());
                }
                fields.push(f);
            }
            Some(_) => {
                let mut f = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() {
                        break;
                    }
                    f.push(c);
                    chars.next();
                }
                fields.push(f);
            }
        }
    }
    Ok(fields)
}

/// Checks a manifest path lexically: relative, and its `..` never leave the root. Returns the
/// normalised relative path (empty for the root itself).
pub(super) fn check_relative(p: &str, side: &str, root: &Path) -> Result<PathBuf, String> {
    let path = Path::new(p);
    if path.is_absolute() {
        return Err(format!(
            "{side} path '{p}' is absolute: manifest paths are relative to the {side} root {}; write it relative to that root",
            root.display()
        ));
    }
    let mut out = PathBuf::new();
    let mut depth = 0usize;
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if depth == 0 {
                    return Err(format!(
                        "{side} path '{p}' escapes the {side} root {} with '..': manifest paths must stay under their root; stage from a higher root instead",
                        root.display()
                    ));
                }
                depth -= 1;
                out.pop();
            }
            Component::Normal(x) => {
                depth += 1;
                out.push(x);
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "{side} path '{p}' is absolute: write it relative to the {side} root {}",
                    root.display()
                ))
            }
        }
    }
    Ok(out)
}

/// Follows the existing part of `root/rel` and refuses it if a symbolic link leads out of the
/// (canonical) root.
pub(super) fn check_inside(
    root_canon: &Path,
    root: &Path,
    rel: &Path,
    side: &str,
    p: &str,
) -> Result<(), String> {
    let mut cur = root.to_path_buf();
    for c in rel.components() {
        cur.push(c);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                let real = fs::canonicalize(&cur).map_err(|e| {
                    format!(
                        "{side} path '{p}': the symbolic link {} cannot be followed ({e}): fix or remove the link",
                        cur.display()
                    )
                })?;
                if !real.starts_with(root_canon) {
                    return Err(format!(
                        "{side} path '{p}' goes through the symbolic link {} to {}, outside the {side} root {}: stage the real path under a root that holds it",
                        cur.display(),
                        real.display(),
                        root.display()
                    ));
                }
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    Ok(())
}

/// Plans a manifest: each line's SRC is resolved against `src_root` and its DST against
/// `dst_root`. Every line is checked before anything is planned; the first refusal is
/// returned (with how many other lines were refused).
pub fn plan_manifest(src_root: &Path, dst_root: &Path, text: &str) -> Result<Plan, StageError> {
    let lines = parse_manifest(text)?;
    if lines.is_empty() {
        return Err(StageError::Refused(
            "the manifest lists nothing to copy: write one `SRC DST` line per file or directory"
                .to_string(),
        ));
    }
    match fs::metadata(src_root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(StageError::Refused(format!(
                "with --manifest, SRC {} must be a directory (the root the manifest's sources are relative to)",
                src_root.display()
            )))
        }
        Err(_) => {
            return Err(StageError::Refused(format!(
                "source root {} does not exist: check the path",
                src_root.display()
            )))
        }
    }
    check_dst_dir(dst_root)?;
    let src_canon = fs::canonicalize(src_root).map_err(io_err("resolve", src_root))?;
    let dst_canon = canonical_prefix(dst_root).map_err(io_err("resolve", dst_root))?;

    let mut resolved = Vec::new();
    let mut first: Option<(usize, String)> = None;
    let mut refused = 0usize;
    for l in &lines {
        let check = || -> Result<(PathBuf, PathBuf, bool), String> {
            let s = check_relative(&l.src, "source", src_root)?;
            let d = check_relative(&l.dst, "destination", dst_root)?;
            check_inside(&src_canon, src_root, &s, "source", &l.src)?;
            check_inside(&dst_canon, dst_root, &d, "destination", &l.dst)?;
            let sp = src_root.join(&s);
            if fs::symlink_metadata(&sp).is_err() {
                return Err(format!(
                    "source '{}' does not exist under {}: fix the line or the source root",
                    l.src,
                    src_root.display()
                ));
            }
            let into = l.dst.ends_with('/') || d.as_os_str().is_empty();
            Ok((sp, dst_root.join(&d), into))
        };
        match check() {
            Ok(r) => resolved.push((l.line, r)),
            Err(msg) => {
                refused += 1;
                if first.is_none() {
                    first = Some((l.line, msg));
                }
            }
        }
    }
    if let Some((line, msg)) = first {
        return Err(StageError::Manifest {
            line,
            msg,
            others: refused - 1,
        });
    }
    let mut plan = Plan::default();
    let mut line_of: HashMap<PathBuf, usize> = HashMap::new();
    for (line, (sp, dp, into)) in resolved {
        let before = (plan.files.len(), plan.links.len(), plan.specials.len());
        add_entry(&mut plan, &sp, &dp, into).map_err(|e| match e {
            StageError::Refused(msg) => StageError::Manifest {
                line,
                msg,
                others: 0,
            },
            o => o,
        })?;
        for f in &plan.files[before.0..] {
            line_of.entry(f.dst.clone()).or_insert(line);
        }
        for l in &plan.links[before.1..] {
            line_of.entry(l.dst.clone()).or_insert(line);
        }
        for x in &plan.specials[before.2..] {
            line_of.entry(x.dst.clone()).or_insert(line);
        }
    }
    group_hard_links(&mut plan);
    check_duplicates(&plan, |d| line_of.get(d).copied())?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_quotes_and_comments() {
        let m = parse_manifest(
            "# inputs\n\n a.dat  b.dat \n\"with space\" out/x # trailing\nsame\n\"q\\\"d\" d\n",
        )
        .unwrap();
        assert_eq!(
            m,
            vec![
                ManifestLine {
                    line: 3,
                    src: "a.dat".into(),
                    dst: "b.dat".into()
                },
                ManifestLine {
                    line: 4,
                    src: "with space".into(),
                    dst: "out/x".into()
                },
                ManifestLine {
                    line: 5,
                    src: "same".into(),
                    dst: "same".into()
                },
                ManifestLine {
                    line: 6,
                    src: "q\"d".into(),
                    dst: "d".into()
                },
            ]
        );
        assert!(parse_manifest("a b c\n").is_err());
        assert!(parse_manifest("\"open b\n").is_err());
    }

    #[test]
    fn relative_paths_stay_under_their_root() {
        let r = Path::new("/root");
        assert_eq!(
            check_relative("a/../b", "source", r).unwrap(),
            PathBuf::from("b")
        );
        assert_eq!(
            check_relative("./a/./c", "source", r).unwrap(),
            PathBuf::from("a/c")
        );
        assert_eq!(check_relative(".", "source", r).unwrap(), PathBuf::new());
        assert!(check_relative("../x", "source", r).is_err());
        assert!(check_relative("a/../../x", "source", r).is_err());
        assert!(check_relative("/etc/passwd", "source", r).is_err());
    }
}
