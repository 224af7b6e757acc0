//! One configuration for every command's defaults, in layers (the later wins):
//!
//! 1. the built-in default (clap's `default_value`, or what the code computes);
//! 2. the site's file, `$TIERSTACK_SYSCONFDIR/tierstack.toml` (`/etc/tierstack/tierstack.toml`);
//! 3. the user's file, `$XDG_CONFIG_HOME/tierstack/tierstack.toml` (`~/.config/...`);
//! 4. the file named by `TIERSTACK_CONFIG` (it must exist);
//! 5. the key's variable, `TIERSTACK_<SECTION>_<KEY>` (`TIERSTACK_MOUNT_DRAM=8G`);
//! 6. the flag on the command line.
//!
//! A key is `[section] name`, named after its command and flag (`[mount] drain_jobs` is
//! `tierstack mount --drain-jobs`): per command, since `mount --dram` and `run --dram` mean
//! different things. `[global]` holds what every command shares (runtime and log folders, log
//! filter): their variables are the ones the code has always read (`TIERSTACK_RUN_DIR`,
//! `TIERSTACK_LOG_DIR`, `TIERSTACK_LOG`), and a file value is passed on to the processes a
//! command starts (mount daemons) through them. Layers 2–5 become clap defaults before the
//! command line is parsed, so `--help` shows the effective default and a flag still wins.
//!
//! Each value is checked when it is read: a bad file is one line naming the file, line, key
//! and fix; an unknown section or key is an error (a misspelt key must not be ignored).
//! `tierstack config show [--json]` prints every key, its value and where it came from.
//! The tests set `TIERSTACK_SYSCONFDIR` and `XDG_CONFIG_HOME` (.cargo/config.toml), so an
//! installed site file never changes a test's defaults.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{Arg, Args, Command, Subcommand};
use serde::Serialize;

/// What a key's value must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `8G`, `512M`, a byte count.
    Size,
    /// `90s`, `10m`, `2h 30m`, seconds.
    Duration,
    /// A whole number.
    Count,
    /// A positive number (MB/s).
    Rate,
    /// `true` or `false`.
    Bool,
    /// An absolute path.
    Path,
    /// `ADDR:PORT`.
    Addr,
    /// One of the flag's possible values (taken from the command's definition).
    Choice,
    /// Free text (a log filter).
    Text,
}

/// One configuration key: `[section] name`, the flag it sets (`cmd`, `arg`; no command for a
/// `[global]` key) and its variable.
struct Key {
    section: &'static str,
    name: &'static str,
    cmd: &'static [&'static str],
    kind: Kind,
    /// The variable when it is not `TIERSTACK_<SECTION>_<NAME>`; `Some("")` for none.
    env: Option<&'static str>,
}

const fn key(section: &'static str, name: &'static str, kind: Kind) -> Key {
    Key {
        section,
        name,
        cmd: &[],
        kind,
        env: None,
    }
}

const fn flag(cmd: &'static [&'static str], name: &'static str, kind: Kind) -> Key {
    Key {
        section: cmd[0],
        name,
        cmd,
        kind,
        env: None,
    }
}

/// Every key. A test checks that each flag exists in the command's definition.
const KEYS: &[Key] = &[
    Key {
        env: Some("TIERSTACK_RUN_DIR"),
        ..key("global", "run_dir", Kind::Path)
    },
    Key {
        env: Some("TIERSTACK_LOG_DIR"),
        ..key("global", "log_dir", Kind::Path)
    },
    Key {
        env: Some("TIERSTACK_LOG"),
        ..key("global", "log", Kind::Text)
    },
    flag(&["mount"], "dir", Kind::Path),
    flag(&["mount"], "drive_size", Kind::Size),
    flag(&["mount"], "dram", Kind::Size),
    flag(&["mount"], "vram", Kind::Size),
    flag(&["mount"], "gpu", Kind::Count),
    flag(&["mount"], "mode", Kind::Choice),
    flag(&["mount"], "drain_rate", Kind::Rate),
    flag(&["mount"], "drain_jobs", Kind::Count),
    flag(&["mount"], "drain_slots", Kind::Count),
    flag(&["mount"], "drain_slots_dir", Kind::Path),
    flag(&["mount"], "coherence", Kind::Duration),
    flag(&["mount"], "transport", Kind::Choice),
    flag(&["mount"], "metrics", Kind::Addr),
    flag(&["mount"], "on_stop", Kind::Choice),
    flag(&["mount"], "allow_other", Kind::Bool),
    flag(&["mount"], "cached_writes", Kind::Bool),
    flag(&["mount"], "no_poll", Kind::Bool),
    flag(&["umount"], "timeout", Kind::Duration),
    flag(&["drain"], "timeout", Kind::Duration),
    flag(&["run"], "dram", Kind::Size),
    // TIERSTACK_RUN_DIR has always named the runtime folder ([global] run_dir).
    Key {
        env: Some(""),
        ..flag(&["run"], "dir", Kind::Path)
    },
    flag(&["run"], "page", Kind::Size),
    flag(&["run"], "threshold", Kind::Size),
    flag(&["run"], "vram", Kind::Size),
    flag(&["run"], "gpu", Kind::Count),
    flag(&["run"], "no_compress", Kind::Bool),
    flag(&["run"], "metrics", Kind::Addr),
    flag(&["stage"], "jobs", Kind::Count),
    flag(&["stage"], "verify", Kind::Bool),
    flag(&["buffers"], "timeout", Kind::Duration),
    flag(&["slurm", "install"], "fast_dir", Kind::Path),
    flag(&["slurm", "install"], "pool_size", Kind::Size),
    flag(&["slurm", "install"], "stage_timeout", Kind::Duration),
    flag(&["slurm", "install"], "other_timeout", Kind::Duration),
    flag(&["slurm", "install"], "drain_rate", Kind::Rate),
    flag(&["exporter"], "listen", Kind::Addr),
];

impl Key {
    /// `mount.dram`.
    fn id(&self) -> String {
        format!("{}.{}", self.section, self.name)
    }

    /// Its variable, if it has one.
    fn var(&self) -> Option<String> {
        match self.env {
            Some("") => None,
            Some(v) => Some(v.to_string()),
            None => Some(format!(
                "TIERSTACK_{}_{}",
                self.section.to_ascii_uppercase(),
                self.name.to_ascii_uppercase()
            )),
        }
    }

    /// The flag's definition in `root`.
    fn arg<'a>(&self, root: &'a Command) -> Option<&'a Arg> {
        let mut c = root;
        for name in self.cmd {
            c = c.find_subcommand(name)?;
        }
        c.get_arguments().find(|a| a.get_id() == self.name)
    }

    /// `Ok(())` when `v` is a value of this key (`def` is the flag, for choices), else what
    /// is wrong and the fix.
    fn check(&self, v: &str, def: Option<&Arg>) -> std::result::Result<(), String> {
        match self.kind {
            Kind::Size => tierstack_common::parse_size(v)
                .map(drop)
                .map_err(|e| e.to_string()),
            Kind::Duration => tierstack_common::parse_duration(v)
                .map(drop)
                .map_err(|e| e.to_string()),
            Kind::Count => v
                .parse::<u32>()
                .map(drop)
                .map_err(|_| format!("'{v}' is not a whole number: give e.g. 4")),
            Kind::Rate => match v.parse::<f64>() {
                Ok(r) if r.is_finite() && r > 0.0 => Ok(()),
                _ => Err(format!("'{v}' is not a rate: give MB/s, e.g. 500")),
            },
            Kind::Bool => match v {
                "true" | "false" => Ok(()),
                _ => Err(format!("'{v}' is not true or false")),
            },
            Kind::Path => {
                if Path::new(v).is_absolute() {
                    Ok(())
                } else {
                    Err(format!(
                        "'{v}' is not an absolute path: give e.g. /var/tmp/tierstack"
                    ))
                }
            }
            Kind::Addr => match v.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
                _ => Err(format!("'{v}' is not ADDR:PORT: give e.g. 127.0.0.1:9464")),
            },
            Kind::Choice => {
                let names: Vec<String> = def
                    .map(|a| {
                        a.get_possible_values()
                            .iter()
                            .map(|p| p.get_name().to_string())
                            .collect()
                    })
                    .unwrap_or_default();
                if names.iter().any(|n| n == v) {
                    Ok(())
                } else {
                    Err(format!("'{v}' is not one of {}", names.join(", ")))
                }
            }
            Kind::Text => Ok(()),
        }
    }
}

/// Where a value came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// The built-in default.
    BuiltIn,
    /// A configuration file, at a line.
    File {
        /// The file.
        path: PathBuf,
        /// Its line (1-based).
        line: usize,
    },
    /// A variable.
    Env {
        /// Its name.
        name: String,
    },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::BuiltIn => f.write_str("built-in"),
            Source::File { path, line } => write!(f, "{}:{line}", path.display()),
            Source::Env { name } => write!(f, "${name}"),
        }
    }
}

/// A configuration file that was looked for.
#[derive(Clone, Debug, Serialize)]
pub struct FileSeen {
    /// Its path.
    pub path: PathBuf,
    /// Whether it was there (and read).
    pub read: bool,
    /// Which layer: site, user or `TIERSTACK_CONFIG`.
    pub layer: &'static str,
}

/// The loaded layers: each key's value and source when not built-in.
pub struct Config {
    set: BTreeMap<String, (String, Source)>,
    files: Vec<FileSeen>,
}

/// The site's file: `$TIERSTACK_SYSCONFDIR/tierstack.toml`, else `/etc/tierstack/tierstack.toml`.
fn site_file() -> PathBuf {
    std::env::var_os("TIERSTACK_SYSCONFDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/tierstack"))
        .join("tierstack.toml")
}

/// The user's file: `$XDG_CONFIG_HOME/tierstack/tierstack.toml`, else under `~/.config`.
fn user_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|h| h.is_absolute())
                .map(|h| h.join(".config"))
        })?;
    Some(base.join("tierstack").join("tierstack.toml"))
}

/// The 1-based line of byte `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.get(..at).map_or(0, |t| t.matches('\n').count()) + 1
}

/// A file's table: `[section]` → `name` → value, with their places.
type Spanned<T> = toml::Spanned<T>;
type Table = BTreeMap<Spanned<String>, BTreeMap<Spanned<String>, Spanned<toml::Value>>>;

/// A configuration error at a place in a file (usage error: exit 2).
fn bad(path: &Path, line: usize, what: impl std::fmt::Display) -> anyhow::Error {
    crate::usage(format!("{}:{line}: {what}", path.display()))
}

impl Config {
    /// No layer: every value built in (the internal processes).
    pub fn none() -> Config {
        Config {
            set: BTreeMap::new(),
            files: Vec::new(),
        }
    }

    /// Reads the files and variables (see the module's documentation). `root` is the
    /// command's definition (for the possible values of a choice).
    pub fn load(root: &Command) -> Result<Config> {
        let mut c = Config::none();
        let mut layers: Vec<(PathBuf, &'static str, bool)> = vec![(site_file(), "site", false)];
        if let Some(u) = user_file() {
            layers.push((u, "user", false));
        }
        if let Some(f) = std::env::var_os("TIERSTACK_CONFIG") {
            layers.push((PathBuf::from(f), "TIERSTACK_CONFIG", true));
        }
        for (path, layer, must) in layers {
            let text =
                match std::fs::read_to_string(&path) {
                    Ok(t) => t,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must => {
                        c.files.push(FileSeen {
                            path,
                            read: false,
                            layer,
                        });
                        continue;
                    }
                    Err(e) => {
                        return Err(crate::usage(format!(
                        "cannot read the configuration file {} ({layer}): {e}: fix or remove it{}",
                        path.display(),
                        if must { ", or unset TIERSTACK_CONFIG" } else { "" }
                    )))
                    }
                };
            c.read_file(root, &path, &text)?;
            c.files.push(FileSeen {
                path,
                read: true,
                layer,
            });
        }
        for k in KEYS {
            let Some(var) = k.var() else { continue };
            let Some(v) = std::env::var_os(&var) else {
                continue;
            };
            let v = v.to_string_lossy().into_owned();
            if k.kind == Kind::Text && v.is_empty() {
                continue;
            }
            k.check(&v, k.arg(root)).map_err(|e| {
                crate::usage(format!(
                    "{var}={v}: {e} (it sets [{}] {}): fix or unset it",
                    k.section, k.name
                ))
            })?;
            c.set.insert(k.id(), (v, Source::Env { name: var }));
        }
        Ok(c)
    }

    /// One file's keys, checked.
    fn read_file(&mut self, root: &Command, path: &Path, text: &str) -> Result<()> {
        let table: Table = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(1, |s| line_of(text, s.start));
            let msg = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
            bad(
                path,
                line,
                format!("{msg}: the file holds [section] lines and name = value lines (see `tierstack config show`)"),
            )
        })?;
        for (section, keys) in table {
            let line = line_of(text, section.span().start);
            let sec = section.get_ref().as_str();
            if !KEYS.iter().any(|k| k.section == sec) {
                let all: Vec<&str> = sections();
                return Err(bad(
                    path,
                    line,
                    format!(
                        "unknown section [{sec}]: the sections are {}",
                        all.join(", ")
                    ),
                ));
            }
            for (name, value) in keys {
                let line = line_of(text, name.span().start);
                let n = name.get_ref().as_str();
                let Some(k) = KEYS.iter().find(|k| k.section == sec && k.name == n) else {
                    let names: Vec<&str> = KEYS
                        .iter()
                        .filter(|k| k.section == sec)
                        .map(|k| k.name)
                        .collect();
                    return Err(bad(
                        path,
                        line,
                        format!(
                            "unknown key `{n}` in [{sec}]: the keys there are {}",
                            names.join(", ")
                        ),
                    ));
                };
                let v = match value.get_ref() {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(i) => i.to_string(),
                    toml::Value::Float(f) => f.to_string(),
                    toml::Value::Boolean(b) => b.to_string(),
                    other => {
                        return Err(bad(
                            path,
                            line,
                            format!(
                                "[{sec}] {n} is a {}: give a string, number or true/false",
                                other.type_str()
                            ),
                        ))
                    }
                };
                k.check(&v, k.arg(root))
                    .map_err(|e| bad(path, line, format!("[{sec}] {n}: {e}")))?;
                self.set.insert(
                    k.id(),
                    (
                        v,
                        Source::File {
                            path: path.to_path_buf(),
                            line,
                        },
                    ),
                );
            }
        }
        Ok(())
    }

    /// The command with each configured value as its flag's default, and the `[global]`
    /// values from files exported to this process's environment (so that the code that reads
    /// them, and the daemons this command starts, see them). Call before any thread starts.
    pub fn apply(&self, mut root: Command) -> Command {
        for k in KEYS {
            let Some((v, source)) = self.set.get(&k.id()) else {
                continue;
            };
            if k.cmd.is_empty() {
                if let (Some(var), Source::File { .. }) = (k.var(), source) {
                    std::env::set_var(var, v);
                }
                continue;
            }
            let v = v.clone();
            root = mut_flag(root, k, move |a| a.default_value(v).required(false));
        }
        root
    }

    /// Every key's effective value and source.
    fn rows(&self, root: &Command) -> Vec<Row> {
        KEYS.iter()
            .map(|k| {
                let (value, source) = match self.set.get(&k.id()) {
                    Some((v, s)) => (Some(v.clone()), s.clone()),
                    None => (built_in(k, root), Source::BuiltIn),
                };
                Row {
                    key: k.id(),
                    value,
                    source,
                    env: k.var(),
                    flag: k.arg(root).and_then(|a| a.get_long()).map(|l| {
                        let mut cmd = k.cmd.join(" ");
                        cmd.push_str(" --");
                        cmd.push_str(l);
                        cmd
                    }),
                }
            })
            .collect()
    }
}

/// The sections, in order.
fn sections() -> Vec<&'static str> {
    let mut all: Vec<&str> = Vec::new();
    for k in KEYS {
        if !all.contains(&k.section) {
            all.push(k.section);
        }
    }
    all
}

/// `f` applied to the flag of `k` in `root`.
fn mut_flag(root: Command, k: &Key, f: impl FnOnce(Arg) -> Arg) -> Command {
    fn go(c: Command, path: &[&str], name: &str, f: impl FnOnce(Arg) -> Arg) -> Command {
        match path.split_first() {
            None => {
                if c.get_arguments().any(|a| a.get_id() == name) {
                    c.mut_arg(name, f)
                } else {
                    c
                }
            }
            Some((first, rest)) => {
                if c.find_subcommand(first).is_some() {
                    c.mut_subcommand(*first, |s| go(s, rest, name, f))
                } else {
                    c
                }
            }
        }
    }
    go(root, k.cmd, k.name, f)
}

/// The built-in value of `k`: its flag's default, or what the code computes for `[global]`.
fn built_in(k: &Key, root: &Command) -> Option<String> {
    match (k.section, k.name) {
        ("global", "run_dir") => Some(tierstack_fs::mount::run_dir().display().to_string()),
        ("global", "log_dir") => Some(tierstack_fs::mount::log_dir().display().to_string()),
        ("global", "log") => Some("warn".into()),
        _ => {
            let a = k.arg(root)?;
            let d: Vec<String> = a
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            if d.is_empty() && k.kind == Kind::Bool {
                return Some("false".into());
            }
            (!d.is_empty()).then(|| d.join(","))
        }
    }
}

/// The command with each configured flag's help naming its key and variable (`--help`, man
/// pages).
pub fn annotate(mut root: Command) -> Command {
    for k in KEYS.iter().filter(|k| !k.cmd.is_empty()) {
        let note = match k.var() {
            Some(v) => format!("[config: {}, env: {v}]", k.id()),
            None => format!("[config: {}]", k.id()),
        };
        root = mut_flag(root, k, move |a| {
            let help = a.get_help().map(|h| format!("{h} {note}"));
            let long = a.get_long_help().map(|h| format!("{h}\n\n{note}"));
            let mut a = a;
            if let Some(h) = help {
                a = a.help(h);
            }
            if let Some(h) = long {
                a = a.long_help(h);
            }
            a
        });
    }
    root
}

/// One line of `config show`.
#[derive(Serialize)]
struct Row {
    key: String,
    value: Option<String>,
    source: Source,
    env: Option<String>,
    flag: Option<String>,
}

/// `tierstack config …`.
#[derive(Subcommand)]
pub enum ConfigCmd {
    /// Every configuration key: its effective value and where it came from (built-in, a
    /// file and line, or a variable), and the files looked for.
    Show(ShowArgs),
}

/// `tierstack config show`.
#[derive(Args)]
pub struct ShowArgs {
    /// One JSON object: {"files": [...], "keys": [...]}.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tierstack config …` with the loaded configuration.
pub fn run(c: ConfigCmd, cfg: &Config, root: &Command) -> Result<()> {
    let ConfigCmd::Show(a) = c;
    let rows = cfg.rows(root);
    if a.json {
        let out = serde_json::json!({ "files": cfg.files, "keys": rows });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    for f in &cfg.files {
        println!(
            "# {} file {}: {}",
            f.layer,
            f.path.display(),
            if f.read { "read" } else { "absent" }
        );
    }
    let w = rows.iter().map(|r| r.key.len()).max().unwrap_or(0);
    let vw = rows
        .iter()
        .map(|r| r.value.as_deref().unwrap_or("(unset)").len())
        .max()
        .unwrap_or(0)
        .min(40);
    for r in &rows {
        let v = r.value.as_deref().unwrap_or("(unset)");
        let env = match (&r.source, r.env.as_deref()) {
            (Source::Env { .. }, _) | (_, None) => String::new(),
            (_, Some(e)) => format!("  (${e})"),
        };
        println!("{:w$}  {v:vw$}  {}{env}", r.key, r.source);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn root() -> Command {
        crate::Cli::command()
    }

    /// Reads `text` as one file (no variables, no other file).
    fn read(text: &str) -> Result<Config> {
        let mut c = Config::none();
        c.read_file(&root(), Path::new("/etc/t.toml"), text)?;
        Ok(c)
    }

    #[test]
    fn every_key_names_a_flag_of_its_command() {
        let root = root();
        for k in KEYS.iter().filter(|k| !k.cmd.is_empty()) {
            let a = k.arg(&root);
            assert!(a.is_some(), "{} names no flag", k.id());
            assert!(
                a.and_then(|a| a.get_long()).is_some(),
                "{} is positional",
                k.id()
            );
            if k.kind == Kind::Choice {
                assert!(!a
                    .map(|a| a.get_possible_values())
                    .unwrap_or_default()
                    .is_empty());
            }
            // Every built-in default is a value of its own kind.
            if let Some(d) = built_in(k, &root) {
                assert_eq!(k.check(&d, a), Ok(()), "{}'s default {d}", k.id());
            }
        }
        let vars: Vec<String> = KEYS.iter().filter_map(|k| k.var()).collect();
        let mut dedup = vars.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(vars.len(), dedup.len(), "two keys share a variable");
    }

    #[test]
    fn a_file_sets_defaults_and_the_flag_still_wins() {
        let c = read("[mount]\ndram = \"3G\"\ndrain_jobs = 9\ncached_writes = true\n")
            .expect("valid file");
        let cmd = c.apply(root());
        let m = cmd
            .clone()
            .try_get_matches_from(["tierstack", "mount", "/b", "/m"])
            .expect("parses");
        let (_, m) = m.subcommand().expect("mount");
        assert_eq!(m.get_one::<String>("dram").map(String::as_str), Some("3G"));
        assert_eq!(m.get_one::<usize>("drain_jobs"), Some(&9));
        assert_eq!(m.get_one::<bool>("cached_writes"), Some(&true));
        let m = cmd
            .try_get_matches_from(["tierstack", "mount", "--dram", "5G", "/b", "/m"])
            .expect("parses");
        let (_, m) = m.subcommand().expect("mount");
        assert_eq!(m.get_one::<String>("dram").map(String::as_str), Some("5G"));
        let rows = c.rows(&root());
        let r = rows.iter().find(|r| r.key == "mount.dram").expect("row");
        assert_eq!(
            r.source,
            Source::File {
                path: "/etc/t.toml".into(),
                line: 2
            }
        );
        let r = rows.iter().find(|r| r.key == "mount.mode").expect("row");
        assert_eq!(
            (r.value.as_deref(), &r.source),
            (Some("sync"), &Source::BuiltIn)
        );
    }

    #[test]
    fn a_required_flag_takes_its_default_from_the_file() {
        let c = read("[run]\ndram = \"64M\"\n").expect("valid file");
        let m = c
            .apply(root())
            .try_get_matches_from(["tierstack", "run", "--", "true"])
            .expect("run without --dram parses");
        let (_, m) = m.subcommand().expect("run");
        assert_eq!(m.get_one::<String>("dram").map(String::as_str), Some("64M"));
    }

    #[test]
    fn bad_files_name_the_line_the_key_and_the_fix() {
        let e = |t: &str| read(t).err().map(|e| e.to_string()).unwrap_or_default();
        let m = e("# site\n[mount]\ndram = \"1X\"\n");
        assert!(
            m.starts_with("/etc/t.toml:3: [mount] dram: invalid size '1X'"),
            "{m}"
        );
        let m = e("[mount]\ndramm = \"1G\"\n");
        assert!(m.contains(":2: unknown key `dramm` in [mount]"), "{m}");
        assert!(m.contains("dram"), "{m}");
        let m = e("[mounts]\ndram = \"1G\"\n");
        assert!(m.contains(":1: unknown section [mounts]"), "{m}");
        let m = e("[mount]\nmode = \"fast\"\n");
        assert!(m.contains("not one of sync, async"), "{m}");
        let m = e("[mount]\ndram = [1]\n");
        assert!(m.contains("is a array"), "{m}");
        let m = e("[mount]\ndram = \n");
        assert!(m.starts_with("/etc/t.toml:2:"), "{m}");
        let m = e("[umount]\ntimeout = \"forever\"\n");
        assert!(m.contains("invalid duration"), "{m}");
        let m = e("[mount]\ndir = \"relative\"\n");
        assert!(m.contains("absolute path"), "{m}");
        let m = e("[mount]\nmetrics = \"9464\"\n");
        assert!(m.contains("ADDR:PORT"), "{m}");
        // A usage error: exit 2.
        let err = read("[x]\n").err().expect("error");
        let code = err
            .chain()
            .find_map(|c| c.downcast_ref::<crate::Exit>())
            .map(|x| x.code);
        assert_eq!(code, Some(2));
    }

    #[test]
    fn help_names_the_key_and_variable() {
        let mut cmd = annotate(root());
        let help = cmd
            .find_subcommand_mut("mount")
            .map(|m| m.render_help().to_string())
            .unwrap_or_default();
        assert!(
            help.contains("[config: mount.dram, env: TIERSTACK_MOUNT_DRAM]"),
            "{help}"
        );
    }
}
