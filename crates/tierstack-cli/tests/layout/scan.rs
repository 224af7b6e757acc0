//! A rough Rust scanner for the layout test: it drops comments, string and char literals,
//! and `#[cfg(test)]` items, and collects every `crate::`, `self::` and `super::` path
//! (use-groups expanded) resolved to an absolute module path.

/// One token: an identifier, `::`, or a single punctuation character.
pub struct Tok {
    pub text: String,
    pub line: usize,
}

/// One path mentioned in a file: the absolute module path (no leading `crate`) and its line.
pub struct Ref {
    pub path: Vec<String>,
    pub line: usize,
}

/// Tokens of `src`, with comments, literals and numbers left out.
pub fn tokenize(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    // Advance to just past the first `close` (with `hashes` '#' after it) from `i`.
    let skip_to = |mut i: usize, line: &mut usize, hashes: usize, escapes: bool| {
        while i < c.len() {
            match c[i] {
                '\\' if escapes => i += 1,
                '\n' => *line += 1,
                '"' if (1..=hashes).all(|h| at(i + h) == '#') => return i + 1 + hashes,
                _ => {}
            }
            i += 1;
        }
        i
    };
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_to(i + 1, &mut line, 0, true);
        } else if ch == '\'' {
            if at(i + 1) == '\\' {
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1; // a lifetime: its name follows as an identifier
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let raw = matches!(word.as_str(), "r" | "br" | "cr");
            if raw && (at(i) == '"' || (at(i) == '#' && matches!(at(i + 1), '"' | '#'))) {
                let hashes = (i..).take_while(|&k| at(k) == '#').count();
                i = skip_to(i + hashes + 1, &mut line, hashes, false);
            } else if word == "r" && at(i) == '#' {
                i += 1; // raw identifier `r#name`
            } else if !ch.is_ascii_digit() {
                out.push(Tok { text: word, line });
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push(Tok {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            out.push(Tok {
                text: ch.to_string(),
                line,
            });
            i += 1;
        }
    }
    out
}

fn text(toks: &[Tok], i: usize) -> &str {
    toks.get(i).map_or("", |t| t.text.as_str())
}

fn is_ident(s: &str) -> bool {
    s.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

/// The attribute starting at `#` in `i`: (index after it, is it a `cfg(test)`, is it inner).
fn attribute(toks: &[Tok], i: usize) -> Option<(usize, bool, bool)> {
    let inner = text(toks, i + 1) == "!";
    let open = i + 1 + usize::from(inner);
    if text(toks, open) != "[" {
        return None;
    }
    let (mut j, mut depth) = (open, 0);
    loop {
        match text(toks, j) {
            "[" => depth += 1,
            "]" if depth == 1 => break,
            "]" => depth -= 1,
            "" => return None,
            _ => {}
        }
        j += 1;
    }
    let body = &toks[open + 1..j];
    let words = |w: &str| body.iter().any(|t| t.text == w);
    let test = body.first().is_some_and(|t| t.text == "cfg") && words("test") && !words("not");
    Some((j + 1, test, inner))
}

/// The index of the first token at or after `j` that is not part of an outer attribute.
fn after_attributes(toks: &[Tok], mut j: usize) -> usize {
    while let Some((next, _, false)) = attribute(toks, j).filter(|_| text(toks, j) == "#") {
        j = next;
    }
    j
}

/// The name in `[pub[(..)]] mod NAME;` at `j`, if that is what starts there.
fn mod_file(toks: &[Tok], mut j: usize) -> Option<&str> {
    if text(toks, j) == "pub" {
        j += 1;
        if text(toks, j) == "(" {
            j += (j..toks.len())
                .take_while(|&k| text(toks, k) != ")")
                .count()
                + 1;
        }
    }
    let is_decl = text(toks, j) == "mod" && text(toks, j + 2) == ";";
    Some(text(toks, j + 1)).filter(|_| is_decl)
}

/// The index just after the item (or field, statement, arm) that starts at `j`.
fn skip_item(toks: &[Tok], j: usize) -> usize {
    let mut j = after_attributes(toks, j);
    let mut parens = 0usize;
    while j < toks.len() {
        match text(toks, j) {
            "(" | "[" => parens += 1,
            ")" | "]" => parens = parens.saturating_sub(1),
            ";" | "," if parens == 0 => return j + 1,
            "}" if parens == 0 => return j,
            "{" if parens == 0 => {
                let mut depth = 0usize;
                while j < toks.len() {
                    match text(toks, j) {
                        "{" => depth += 1,
                        "}" if depth == 1 => return j + 1,
                        "}" => depth -= 1,
                        _ => {}
                    }
                    j += 1;
                }
            }
            _ => {}
        }
        j += 1;
    }
    j
}

/// The use-tree (or plain path tail) at `j` under `base`: every path it names, and where it ends.
fn tree(toks: &[Tok], mut j: usize, mut base: Vec<String>) -> (Vec<Vec<String>>, usize) {
    match text(toks, j) {
        "{" => {
            let mut out = Vec::new();
            j += 1;
            while j < toks.len() && text(toks, j) != "}" {
                match text(toks, j) {
                    "," => j += 1,
                    "as" => j += 2,
                    _ => {
                        let (paths, next) = tree(toks, j, base.clone());
                        out.extend(paths);
                        j = next.max(j + 1);
                    }
                }
            }
            (out, j + 1)
        }
        id if is_ident(id) => {
            if id != "self" {
                base.push(id.to_string());
            }
            if text(toks, j + 1) == "::" {
                tree(toks, j + 2, base)
            } else {
                (vec![base], j + 1)
            }
        }
        _ => (vec![base], j),
    }
}

/// What one file names.
#[derive(Default)]
pub struct Scan {
    /// Every path to this crate's modules, outside `#[cfg(test)]` items.
    pub refs: Vec<Ref>,
    /// The modules it declares as `#[cfg(test)] mod NAME;`, kept in files of their own.
    pub test_mods: Vec<Vec<String>>,
}

/// What `src`, a file of module `module` (empty: the crate root), names.
pub fn references(src: &str, module: &[String]) -> Scan {
    let toks = tokenize(src);
    let (mut cur, mut inline) = (module.to_vec(), Vec::new());
    let mut out = Scan::default();
    let (mut depth, mut i) = (0usize, 0usize);
    while i < toks.len() {
        let t = text(&toks, i);
        let after_colons = i > 0 && text(&toks, i - 1) == "::";
        match t {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    cur = inline.pop().map(|(m, _)| m).unwrap_or_default();
                }
            }
            "#" => {
                if let Some((next, true, inner)) = attribute(&toks, i) {
                    if inner && depth == 0 {
                        return Scan::default();
                    }
                    if let Some(name) = mod_file(&toks, after_attributes(&toks, next)) {
                        out.test_mods
                            .push(cur.iter().cloned().chain([name.into()]).collect());
                    }
                    i = skip_item(&toks, next);
                    continue;
                }
            }
            "mod" if is_ident(text(&toks, i + 1)) && text(&toks, i + 2) == "{" => {
                inline.push((cur.clone(), depth));
                cur.push(text(&toks, i + 1).to_string());
                depth += 1;
                i += 3;
                continue;
            }
            "crate" | "self" | "super" if !after_colons && text(&toks, i + 1) == "::" => {
                let line = toks[i].line;
                let mut base = if t == "crate" {
                    Vec::new()
                } else {
                    cur.clone()
                };
                let mut j = i;
                while matches!(text(&toks, j), "crate" | "self" | "super")
                    && text(&toks, j + 1) == "::"
                {
                    if text(&toks, j) == "super" {
                        base.pop();
                    }
                    j += 2;
                }
                let (paths, next) = tree(&toks, j, base);
                out.refs
                    .extend(paths.into_iter().map(|path| Ref { path, line }));
                i = next.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}
