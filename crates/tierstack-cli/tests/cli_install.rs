//! `make install` and `make uninstall` through the real Makefile (issue 38), with the binary
//! under test: `make install DESTDIR=<tmp> PREFIX=/usr BIN=<it> PRELOAD=<the shim beside it>`
//! (given files are installed as they are: make runs no cargo, and `CARGO=false` would fail
//! it if it tried). Then, from the installed files: `--version` names the commit, `array
//! --help` runs, the binary and the shim are stripped and name their debug files (which
//! carry `.debug_info`, with the CRC the debuglink holds), every man page renders, the
//! completions parse and offer no hidden command, `tierstack run` finds the installed shim by
//! itself (`lib/tierstack`, and `lib64/tierstack` with LIBDIR=/usr/lib64), and `make
//! uninstall` leaves only empty folders.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{preload, repo_root, uffd_usable, BIN};

/// Runs `make TARGET DESTDIR=dest PREFIX=/usr EXTRA...` in the repository with the binary
/// under test; its output.
fn make(target: &str, dest: &Path, dist: &Path, extra: &[&str]) -> Output {
    Command::new("make")
        .current_dir(repo_root())
        // A make above us (make test) must not hand its jobserver or flags down.
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .arg("--no-print-directory")
        .arg(target)
        .arg(format!("DESTDIR={}", dest.display()))
        .arg("PREFIX=/usr")
        .arg(format!("BIN={BIN}"))
        .arg(format!("PRELOAD={}", preload().display()))
        .arg(format!("DIST={}", dist.display()))
        .arg("CARGO=false")
        .args(extra)
        .output()
        .expect("make not found: install make")
}

#[track_caller]
fn make_ok(target: &str, dest: &Path, dist: &Path, extra: &[&str]) -> String {
    let o = make(target, dest, dist, extra);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.status.success(),
        "make {target} {extra:?} failed:\n{text}"
    );
    text
}

/// Every file (not folder) below `dir`, symbolic links included.
fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let t = e.file_type().expect("file type");
            if t.is_dir() {
                todo.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Runs `cmd`, which must succeed; its standard output.
#[track_caller]
fn output_of(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The ELF sections of `path`: name, type and contents (empty for NOBITS).
fn sections(path: &Path) -> Vec<(String, u32, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let elf = goblin::elf::Elf::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    elf.section_headers
        .iter()
        .map(|sh| {
            let name = elf.shdr_strtab.get_at(sh.sh_name).unwrap_or("").to_string();
            let data = match sh.file_range() {
                Some(r) if sh.sh_type != goblin::elf::section_header::SHT_NOBITS => {
                    bytes[r].to_vec()
                }
                _ => Vec::new(),
            };
            (name, sh.sh_type, data)
        })
        .collect()
}

/// The CRC-32 (IEEE) that `.gnu_debuglink` holds for its debug file.
fn crc32(data: &[u8]) -> u32 {
    let table: Vec<u32> = (0..256u32)
        .map(|i| {
            (0..8).fold(i, |c, _| {
                if c & 1 != 0 {
                    (c >> 1) ^ 0xEDB8_8320
                } else {
                    c >> 1
                }
            })
        })
        .collect();
    !data.iter().fold(!0u32, |c, &b| {
        table[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8)
    })
}

/// `stripped` has no `.debug_info` and a `.gnu_debuglink` naming `debug` by its file name with
/// its CRC; `debug` carries `.debug_info`.
fn check_split(stripped: &Path, debug: &Path) {
    let secs = sections(stripped);
    assert!(
        !secs.iter().any(|(n, _, _)| n.starts_with(".debug_info")),
        "{} is not stripped: it has .debug_info",
        stripped.display()
    );
    let link = &secs
        .iter()
        .find(|(n, _, _)| n == ".gnu_debuglink")
        .unwrap_or_else(|| panic!("{} has no .gnu_debuglink", stripped.display()))
        .2;
    let name_len = link
        .iter()
        .position(|&b| b == 0)
        .expect("NUL-terminated name");
    let want = debug.file_name().and_then(|n| n.to_str()).expect("name");
    assert_eq!(std::str::from_utf8(&link[..name_len]), Ok(want));
    let crc_at = (name_len + 1).next_multiple_of(4);
    let crc = u32::from_le_bytes(link[crc_at..crc_at + 4].try_into().expect("crc"));
    let debug_bytes = std::fs::read(debug).expect("read debug file");
    assert_eq!(
        crc,
        crc32(&debug_bytes),
        "{}: debuglink CRC",
        stripped.display()
    );
    let dsecs = sections(debug);
    assert!(
        dsecs
            .iter()
            .any(|(n, _, d)| n == ".debug_info" && !d.is_empty()),
        "{} carries no .debug_info",
        debug.display()
    );
}

/// `--version` names the commit (or says `unknown` in a build without git) and is the
/// version of the binary under test; `array --help` runs.
fn check_binary(bin: &Path) {
    let v = output_of(Command::new(bin).arg("--version"));
    assert_eq!(v, output_of(Command::new(BIN).arg("--version")));
    let v = v.trim();
    let rest = v
        .strip_prefix(concat!("tierstack ", env!("CARGO_PKG_VERSION"), " (git "))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("--version: {v}"));
    if rest != "unknown" {
        let (hash, date) = rest
            .split_once(", ")
            .unwrap_or_else(|| panic!("--version: {v}"));
        assert!(
            hash.len() >= 7 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
            "{v}"
        );
        let d: Vec<&str> = date.split('-').collect();
        assert!(
            d.len() == 3 && d.iter().all(|p| p.parse::<u32>().is_ok()),
            "{v}"
        );
        let known = Command::new("git")
            .current_dir(repo_root())
            .args(["cat-file", "-e", &format!("{hash}^{{commit}}")])
            .status();
        assert!(
            known.is_ok_and(|s| s.success()),
            "{hash} is no commit of this repository"
        );
    } else {
        eprintln!("NOTE: built without git: {v}");
    }
    let help = output_of(Command::new(bin).args(["array", "--help"]));
    assert!(help.contains("create"), "{help}");
}

/// A page per visible command, none for the hidden ones; every page renders (man, else groff,
/// else it has its `.TH` line), and `man -M` finds a page by name.
fn check_man(man1: &Path) {
    for page in [
        "tierstack.1",
        "tierstack-mount.1",
        "tierstack-run.1",
        "tierstack-array-create.1",
        "tierstack-bench-mem.1",
        "tierstack-slurm-install.1",
    ] {
        assert!(man1.join(page).is_file(), "{page} not installed");
    }
    for hidden in [
        "tierstack-mount-daemon.1",
        "tierstack-gen-docs.1",
        "tierstack-bench-mem-worker.1",
        "tierstack-slurm-node-drain.1",
        "tierstack-help.1",
    ] {
        assert!(!man1.join(hidden).exists(), "{hidden} is installed");
    }
    let pages = files_below(man1);
    let (man, groff) = (have("man"), have("groff"));
    if !man && !groff {
        eprintln!("NOTE: neither man nor groff here (apt-get install man-db): checking .TH only");
    }
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("read page");
        assert!(
            text.lines().any(|l| l.starts_with(".TH ")),
            "{}: no .TH",
            page.display()
        );
        if groff {
            let o = Command::new("groff")
                .args(["-man", "-Tutf8", "-ww", "-z"])
                .arg(page)
                .output()
                .expect("groff");
            assert!(
                o.status.success() && o.stderr.is_empty(),
                "groff {}: {}",
                page.display(),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        if man {
            let out = output_of(man_cmd().arg("-l").arg(page));
            assert!(
                out.contains("NAME") && out.contains("SYNOPSIS"),
                "{}: {out}",
                page.display()
            );
        }
    }
    if man {
        let share_man = man1.parent().expect("mandir");
        let out = output_of(man_cmd().arg("-M").arg(share_man).arg("tierstack"));
        assert!(out.contains("tierstack-mount(1)"), "man tierstack: {out}");
    }
}

fn man_cmd() -> Command {
    let mut c = Command::new("man");
    c.env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .env("MANWIDTH", "100");
    c
}

/// The three completions exist; bash's parses and completes `tierstack ar` to `array` and
/// offers no hidden command; zsh's and fish's parse where those shells are.
fn check_completions(share: &Path) {
    let bash = share.join("bash-completion/completions/tierstack");
    let zsh = share.join("zsh/site-functions/_tierstack");
    let fish = share.join("fish/vendor_completions.d/tierstack.fish");
    for f in [&bash, &zsh, &fish] {
        assert!(
            std::fs::metadata(f).is_ok_and(|m| m.len() > 0),
            "{} missing or empty",
            f.display()
        );
    }
    output_of(Command::new("bash").arg("-n").arg(&bash));
    let complete = |words: &str| {
        let script = format!(
            "source '{}'; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _tierstack tierstack \"${{COMP_WORDS[-1]}}\" \"${{COMP_WORDS[-2]}}\"; echo \"${{COMPREPLY[*]}}\"",
            bash.display()
        );
        output_of(Command::new("bash").arg("-c").arg(script))
    };
    assert_eq!(complete("tierstack ar").trim(), "array");
    let top = complete("tierstack ''");
    for cmd in ["array", "run", "mount", "top"] {
        assert!(
            top.split_whitespace().any(|w| w == cmd),
            "{cmd} not offered: {top}"
        );
    }
    for hidden in ["mount-daemon", "gen-docs"] {
        assert!(
            !top.split_whitespace().any(|w| w == hidden),
            "{hidden} offered: {top}"
        );
    }
    if have("zsh") {
        output_of(Command::new("zsh").arg("-n").arg(&zsh));
    }
    if have("fish") {
        output_of(Command::new("fish").arg("--no-execute").arg(&fish));
    }
}

/// The installed `tierstack run`, with no TIERSTACK_PRELOAD, runs a program with the shim
/// installed at `lib` (found relative to the binary).
fn check_run_finds(bin: &Path, lib: &Path) {
    if !uffd_usable() {
        return;
    }
    let run = |prog: &[&str]| {
        let mut c = Command::new(bin);
        c.env_remove("TIERSTACK_PRELOAD").env_remove("LD_PRELOAD");
        c.args(["run", "--dram", "64M", "--"]).args(prog);
        output_of(&mut c)
    };
    run(&["/bin/true"]);
    let seen = run(&["/bin/sh", "-c", "printf %s \"$LD_PRELOAD\""]);
    let first = seen.split(':').next().unwrap_or("");
    assert_eq!(
        Path::new(first),
        lib.canonicalize().expect("installed shim")
    );
}

/// `make uninstall` removes every file install wrote (folders may stay, empty); a second
/// uninstall says that nothing is installed there.
fn check_uninstall(dest: &Path, dist: &Path, extra: &[&str]) {
    make_ok("uninstall", dest, dist, extra);
    let left = files_below(dest);
    assert!(left.is_empty(), "make uninstall left files: {left:?}");
    let o = make("uninstall", dest, dist, extra);
    assert!(!o.status.success(), "a second uninstall should fail");
    assert!(String::from_utf8_lossy(&o.stderr).contains("installed-files"));
}

#[test]
fn make_install_then_uninstall() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (dest, dist) = (tmp.path().join("root"), tmp.path().join("dist"));
    make_ok("install", &dest, &dist, &[]);
    let usr = dest.join("usr");
    let bin = usr.join("bin/tierstack");
    let lib = usr.join("lib/tierstack/libtierstack_preload.so");
    check_binary(&bin);
    check_split(&bin, &usr.join("lib/debug/usr/bin/tierstack.debug"));
    check_split(
        &lib,
        &usr.join("lib/debug/usr/lib/tierstack/libtierstack_preload.so.debug"),
    );
    check_man(&usr.join("share/man/man1"));
    check_completions(&usr.join("share"));
    for f in [
        "slurm/burst_buffer.lua",
        "slurm/burst_buffer.conf",
        "slurm/job_submit.lua",
        "slurm/prolog.sh",
        "slurm/epilog.sh",
        "grafana/tierstack.json",
    ] {
        assert!(
            usr.join("share/tierstack").join(f).is_file(),
            "share/tierstack/{f} not installed"
        );
    }
    for unit in ["tierstack@.service", "tierstack-recover.service"] {
        let text = std::fs::read_to_string(usr.join("lib/systemd/system").join(unit))
            .unwrap_or_else(|e| panic!("{unit} not installed: {e}"));
        assert!(
            text.contains("ExecStart=/usr/bin/tierstack ") && !text.contains("@BINDIR@"),
            "{unit} names the installed binary: {text}"
        );
    }
    check_run_finds(&bin, &lib);

    // Installed again over a tree that holds a file of an older install (in its list): that
    // file goes, the rest is as before.
    let manifest = usr.join("share/tierstack/installed-files");
    let stale = usr.join("share/man/man1/tierstack-gone.1");
    std::fs::write(&stale, ".TH old\n").expect("write");
    let mut list = std::fs::read_to_string(&manifest).expect("manifest");
    list.push_str("/usr/share/man/man1/tierstack-gone.1\n");
    std::fs::write(&manifest, list).expect("write");
    make_ok("install", &dest, &dist, &[]);
    assert!(
        !stale.exists(),
        "reinstall kept a file the new install does not write"
    );
    check_uninstall(&dest, &dist, &[]);

    // A lib64 layout (RPM's): the binary finds the shim in ../lib64/tierstack.
    let dest64 = tmp.path().join("root64");
    make_ok("install", &dest64, &dist, &["LIBDIR=/usr/lib64"]);
    let lib64 = dest64.join("usr/lib64/tierstack/libtierstack_preload.so");
    assert!(lib64.is_file() && !dest64.join("usr/lib/tierstack").exists());
    check_run_finds(&dest64.join("usr/bin/tierstack"), &lib64);
    check_uninstall(&dest64, &dist, &["LIBDIR=/usr/lib64"]);
}
