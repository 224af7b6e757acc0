//! `tierstack gen-docs` (hidden), what `make install` asks of the binary it installs: the man
//! pages, made from the clap definition (clap_mangen), `tierstack.1` and one page per visible
//! subcommand (`tierstack-mount.1`, `tierstack-array-create.1`, ...), and the bash, zsh and
//! fish completions (clap_complete), so that both always match the installed binary.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap_complete::Shell;

/// `tierstack gen-docs`.
#[derive(clap::Args)]
#[group(required = true, multiple = true)]
pub struct GenDocsArgs {
    /// Write the man pages (section 1) into DIR, made if missing.
    #[arg(long, value_name = "DIR")]
    pub man: Option<PathBuf>,
    /// Write the shell completions into DIR, made if missing: `tierstack.bash`, `_tierstack`
    /// (zsh) and `tierstack.fish`.
    #[arg(long, value_name = "DIR")]
    pub completions: Option<PathBuf>,
}

/// The date of the commit the binary was built from (build.rs), for the pages' `.TH` line;
/// empty when the build had no git.
const COMMIT_DATE: &str = env!("TIERSTACK_COMMIT_DATE");

/// Writes what `a` asks for from `cmd`, the whole command line of `tierstack`.
pub fn gen_docs(cmd: clap::Command, a: GenDocsArgs) -> Result<()> {
    if let Some(dir) = &a.completions {
        make_dir(dir)?;
        let mut visible = without_hidden(&cmd);
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            clap_complete::generate_to(shell, &mut visible, "tierstack", dir).with_context(
                || format!("cannot write the {shell} completion into {}", dir.display()),
            )?;
        }
    }
    if let Some(dir) = &a.man {
        make_dir(dir)?;
        // No `help` subcommand in the pages: `--help` is on every page already.
        let mut cmd = cmd.bin_name("tierstack").disable_help_subcommand(true);
        cmd.build();
        let source = format!("tierstack {}", cmd.get_version().unwrap_or_default());
        man_pages(&cmd, dir, &source)?;
    }
    Ok(())
}

/// `cmd` (not built yet) without its hidden subcommands, at every depth: clap_complete offers
/// hidden subcommands too, and `tierstack <TAB>` should not list `mount-daemon` or
/// `gen-docs`. A command with no hidden subcommand below it is kept as it is; one with some is
/// made again from its name, help, version, aliases, arguments, groups and visible
/// subcommands, which is all a completion uses.
fn without_hidden(cmd: &clap::Command) -> clap::Command {
    fn has_hidden(cmd: &clap::Command) -> bool {
        cmd.get_subcommands()
            .any(|s| s.is_hide_set() || has_hidden(s))
    }
    if !has_hidden(cmd) {
        return cmd.clone();
    }
    let mut out = clap::Command::new(cmd.get_name().to_owned())
        .args(cmd.get_arguments().cloned())
        .groups(cmd.get_groups().cloned())
        .visible_aliases(
            cmd.get_visible_aliases()
                .map(str::to_owned)
                .collect::<Vec<_>>(),
        )
        .subcommands(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(without_hidden),
        );
    if let Some(about) = cmd.get_about() {
        out = out.about(about.clone());
    }
    if let Some(version) = cmd.get_version() {
        out = out.version(version.to_owned());
    }
    out
}

fn make_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))
}

/// The page of `cmd` and, depth first, of each of its subcommands that is not hidden (the
/// internal ones: `mount-daemon`, the benchmark workers, `gen-docs`). `cmd` is built, so each
/// subcommand's display name is its full name (`tierstack-array-create`).
fn man_pages(cmd: &clap::Command, dir: &Path, source: &str) -> Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages(sub, dir, source)?;
    }
    let man = clap_mangen::Man::new(cmd.clone())
        .date(COMMIT_DATE)
        .source(source)
        .manual("tierstack manual");
    man.generate_to(dir)
        .with_context(|| format!("cannot write {} into {}", man.get_filename(), dir.display()))?;
    Ok(())
}
