//! No import circles inside a crate.
//!
//! For every crate under `crates/` this reads `src/` (with each `src/bin` program as a crate
//! of its own; not `tests/`, `examples/` or `benches/`) and builds two kinds of graph:
//!
//! * between the top-level modules, the children of `lib.rs`/`main.rs` (`src/foo.rs` and
//!   everything under `src/foo/` are `foo`; the crate root itself takes no part);
//! * inside every module folder, between its sibling submodules (`src/drain/meta.rs` and
//!   `src/drain/data.rs` are `drain::meta` and `drain::data`; `drain/mod.rs` takes no part).
//!
//! Module A depends on module B when A's files name `crate::B` (use-groups included), or,
//! between siblings, `super::B` or `crate::PARENT::B`. Comments, string literals and
//! `#[cfg(test)]` items, inline or `mod NAME;` files (test code may reach anywhere), are
//! left out; the scanner is in `layout/scan.rs`. Any cycle fails the test, printed as
//! `crate: a -> b -> a` with one example reference (file:line) for every edge, unless it is
//! in [`ALLOWED`]; every elementary cycle is listed, so one circle of three modules may
//! need several entries.

#[path = "layout/scan.rs"]
mod scan;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles tolerated for now, as (crate, cycle) with the cycle spelled as the failure prints
/// it, e.g. `("tierstack-fs", "fuse -> uring -> fuse")`. Each entry must be argued in
/// docs/ARCHITECTURE.md: why the circle is there and why it is not worth breaking.
const ALLOWED: &[(&str, &str)] = &[];

/// Stop listing a graph's cycles after this many; the circle is plain by then.
const MAX_CYCLES: usize = 200;

/// One file of a crate: its path from the repository root, its module path, what it names.
struct Source {
    shown: String,
    module: Vec<String>,
    scan: scan::Scan,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of `rel`, a file below the crate's module folder.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        return Vec::new();
    }
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

fn source(root: &Path, file: &Path, module: Vec<String>) -> Source {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
    let shown = file
        .strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string();
    let scan = scan::references(&text, &module);
    Source {
        shown,
        module,
        scan,
    }
}

/// `files` less those of modules declared as `#[cfg(test)] mod NAME;`.
fn without_tests(files: Vec<Source>) -> Vec<Source> {
    let tests: Vec<Vec<String>> = files
        .iter()
        .flat_map(|f| f.scan.test_mods.clone())
        .collect();
    let is_test = |f: &Source| tests.iter().any(|t| f.module.starts_with(t));
    files.into_iter().filter(|f| !is_test(f)).collect()
}

/// The crates (as label and files) under `crates/`: each library/binary tree, and each
/// program in `src/bin`.
fn units(root: &Path) -> Vec<(String, Vec<Source>)> {
    let mut units = Vec::new();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    crates.sort();
    for dir in crates.iter().filter(|d| d.join("src").is_dir()) {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (src, bin) = (dir.join("src"), dir.join("src/bin"));
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let lib = files.iter().filter(|f| !f.starts_with(&bin));
        let lib = lib.map(|f| source(root, f, module_path(f.strip_prefix(&src).unwrap_or(f))));
        units.push((name.clone(), without_tests(lib.collect())));
        let mut programs = Vec::new();
        rust_files(&bin, &mut programs);
        let mut by_program: BTreeMap<String, Vec<Source>> = BTreeMap::new();
        for f in &programs {
            let rel = f.strip_prefix(&bin).unwrap_or(f);
            let mut parts = rel.iter();
            let first = Path::new(parts.next().unwrap_or_default());
            let program = first
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let module = module_path(parts.as_path()); // `NAME.rs` and `NAME/main.rs`: root
            by_program
                .entry(program)
                .or_default()
                .push(source(root, f, module));
        }
        for (program, files) in by_program {
            units.push((format!("{name}/bin/{program}"), without_tests(files)));
        }
    }
    units
}

/// The graph among the children of module `level`: node names and, per edge, an example.
fn graph(
    files: &[Source],
    level: &[String],
) -> (BTreeSet<String>, BTreeMap<(String, String), String>) {
    let n = level.len();
    let inside: Vec<&Source> = files
        .iter()
        .filter(|f| f.module.len() > n && f.module.starts_with(level))
        .collect();
    let nodes: BTreeSet<String> = inside.iter().map(|f| f.module[n].clone()).collect();
    let mut edges = BTreeMap::new();
    for file in inside {
        for r in file
            .scan
            .refs
            .iter()
            .filter(|r| r.path.len() > n && r.path.starts_with(level))
        {
            let (from, to) = (&file.module[n], &r.path[n]);
            if from != to && nodes.contains(to) {
                let example = format!("{}:{} (crate::{})", file.shown, r.line, r.path.join("::"));
                edges.entry((from.clone(), to.clone())).or_insert(example);
            }
        }
    }
    (nodes, edges)
}

/// Every elementary cycle (up to [`MAX_CYCLES`]), each starting at its least node.
fn cycles(
    nodes: &BTreeSet<String>,
    edges: &BTreeMap<(String, String), String>,
) -> Vec<Vec<String>> {
    fn walk<'a>(
        adj: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        out: &mut Vec<Vec<String>>,
    ) {
        let (start, last) = (path[0], path[path.len() - 1]);
        for &next in adj.get(last).into_iter().flatten() {
            if out.len() >= MAX_CYCLES {
                return;
            }
            if next == start {
                out.push(path.iter().map(|s| s.to_string()).collect());
            } else if next > start && !path.contains(&next) {
                path.push(next);
                walk(adj, path, out);
                path.pop();
            }
        }
    }
    let mut adj: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        adj.entry(from.as_str()).or_default().push(to.as_str());
    }
    let mut out = Vec::new();
    for start in nodes {
        walk(&adj, &mut vec![start.as_str()], &mut out);
    }
    out
}

#[test]
fn no_import_cycles_inside_a_crate() {
    let root = repo_root();
    let (mut failures, mut seen) = (Vec::new(), BTreeSet::new());
    for (name, files) in units(&root) {
        let mut levels: BTreeSet<Vec<String>> = BTreeSet::from([Vec::new()]);
        for f in &files {
            levels.extend((1..f.module.len()).map(|k| f.module[..k].to_vec()));
        }
        for level in &levels {
            let (nodes, edges) = graph(&files, level);
            let found = cycles(&nodes, &edges);
            let full = |m: &str| {
                level
                    .iter()
                    .map(String::as_str)
                    .chain([m])
                    .collect::<Vec<_>>()
                    .join("::")
            };
            for cycle in &found {
                let closed: Vec<&String> = cycle.iter().chain(cycle.first()).collect();
                let spelled = closed
                    .iter()
                    .map(|m| full(m))
                    .collect::<Vec<_>>()
                    .join(" -> ");
                seen.insert((name.clone(), spelled.clone()));
                if ALLOWED.contains(&(name.as_str(), spelled.as_str())) {
                    continue;
                }
                let mut text = format!("{name}: {spelled}");
                for pair in closed.windows(2) {
                    let example = &edges[&(pair[0].clone(), pair[1].clone())];
                    text.push_str(&format!(
                        "\n    {} -> {}: {example}",
                        full(pair[0]),
                        full(pair[1])
                    ));
                }
                failures.push(text);
            }
            if found.len() >= MAX_CYCLES {
                failures.push(format!(
                    "{name}: (stopped listing after {MAX_CYCLES} cycles)"
                ));
            }
        }
    }
    for (name, cycle) in ALLOWED {
        if !seen.contains(&(name.to_string(), cycle.to_string())) {
            failures.push(format!(
                "{name}: {cycle}\n    allowed but gone: take it out of ALLOWED"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} import cycle(s) inside crates:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn scanner_reads_groups_and_skips_comments_and_tests() {
    let src = "use crate::{a::{x, y}, b::z as w, self as me};\n\
               // crate::c::gone\n/* crate::d::gone */ let s = \"crate::e\";\n\
               #[cfg(test)]\nmod tests { use crate::f::gone; }\n\
               pub(super) fn g() { super::sib::h(); $crate::m::n!(); }\n\
               mod inner { use super::super::k; }\n\
               #[cfg(test)]\n#[path = \"t.rs\"]\npub(crate) mod more;\n";
    let scan = scan::references(src, &["p".into(), "q".into()]);
    assert_eq!(scan.test_mods, [["p", "q", "more"]]);
    let found: Vec<String> = scan
        .refs
        .iter()
        .map(|r| format!("{}:{}", r.line, r.path.join("::")))
        .collect();
    assert_eq!(
        found,
        [
            "1:a::x",
            "1:a::y",
            "1:b::z",
            "1:",
            "6:p::sib::h",
            "6:m::n",
            "7:p::k"
        ]
    );
}
