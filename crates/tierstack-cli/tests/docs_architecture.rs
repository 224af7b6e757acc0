//! docs/ARCHITECTURE.md matches the repository: every path it names in backticks under
//! `crates/`, `contrib/`, `docs/` or `fuzz/` exists (file or folder), and it links nowhere
//! outside the repository.

use std::path::{Path, PathBuf};

const PREFIXES: [&str; 4] = ["crates/", "contrib/", "docs/", "fuzz/"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn architecture() -> String {
    let path = repo_root().join("docs/ARCHITECTURE.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The text outside fenced code blocks (whose backticks do not delimit inline code).
fn without_fences(doc: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Every inline code span that names a repository path, first word only.
fn backticked_paths(doc: &str) -> Vec<String> {
    without_fences(doc)
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|span| span.split_whitespace().next())
        .filter(|word| PREFIXES.iter().any(|p| word.starts_with(p)))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_backticked_path_exists() {
    let doc = architecture();
    let paths = backticked_paths(&doc);
    assert!(
        paths.len() >= 20,
        "expected the code map to name many paths, found {}: {paths:?}",
        paths.len()
    );
    let root = repo_root();
    let mut missing: Vec<&str> = paths
        .iter()
        .map(String::as_str)
        .filter(|p| !root.join(p.trim_end_matches('/')).exists())
        .collect();
    missing.sort_unstable();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md names paths that do not exist:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn no_links_outside_the_repository() {
    let doc = architecture();
    let bad: Vec<(usize, &str)> = doc
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains("http://") || l.contains("https://"))
        .map(|(i, l)| (i + 1, l))
        .collect();
    assert!(
        bad.is_empty(),
        "docs/ARCHITECTURE.md links outside the repository:\n{}",
        bad.iter()
            .map(|(n, l)| format!("  line {n}: {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn extraction_finds_inline_paths_only() {
    let doc = "a `crates/x/src/lib.rs` b `docs/` c `cargo test` d\n```\n`crates/fenced`\n```\n";
    assert_eq!(backticked_paths(doc), vec!["crates/x/src/lib.rs", "docs/"]);
}
