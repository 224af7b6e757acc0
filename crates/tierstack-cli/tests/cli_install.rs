//! `make install` and `make uninstall` through the real Makefile (issue 38), with the binary
//! under test: `make install DESTDIR=<tmp> PREFIX=/usr BIN=<it> PRELOAD=<the shim beside it>`
//! (given files are installed as they are: make runs no cargo, and `CARGO=false` would fail
//! it if it tried). Then, from the installed files: `--version` names the commit, `array
//! --help` runs, the binary and the shim are stripped and name their debug files (which
//! carry `.debug_info`, with the CRC the debuglink holds), every man page renders, the
//! completions parse and offer no hidden command, `tierstack run` finds the installed shim by
//! itself (`lib/tierstack`, and `lib64/tierstack` with LIBDIR=/usr/lib64), the installed
//! binary's `slurm install` writes its own path (not the build tree's) into the Prolog,
//! Epilog and Lua script, and `make uninstall` leaves only empty folders.
//!
//! The drop-ins (`usr/lib/{sysusers.d,tmpfiles.d,udev/rules.d,sysctl.d}`) are checked with
//! the tools that read them, never on the host itself: `systemd-sysusers --root=TMP` makes the
//! `tierstack` group in a temporary root; `systemd-tmpfiles --create --root=TMP` makes the
//! folders with their modes (the commented-out `enable_uring` line, uncommented, writes a
//! file standing in for the kernel's parameter), `--clean` with an upstream-style `/var/tmp`
//! ageing line keeps the fast tiers; `sysctl --dry-run -p` reads the sysctl file (and its
//! commented-out line, uncommented) without writing; and `udevadm test` runs the rule with the
//! distribution's own rules in a private mount namespace (`unshare --mount`) whose `/dev`,
//! `/run` and `/etc/group` are the test's, on nodes it made there: `/dev/userfaultfd` becomes
//! 0660 group tierstack, `/dev/fuse` keeps the distribution's mode with group tierstack, and
//! 0660 with the site's uncommented line. `udevadm verify` runs too where udev has it (254+).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{is_root, preload, repo_root, uffd_usable, BIN};

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

/// Standard output and error of `o`.
fn text_of(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `cmd` to its end; its output (it must exist).
fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// The mode bits (permissions and sticky bit), owner and group of `p`.
fn mode_of(p: &Path) -> (u32, u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert!(m.is_dir(), "{} is not a folder", p.display());
    (m.mode() & 0o7777, m.uid(), m.gid())
}

/// `text` with the one line that starts with `#` + `start` uncommented (it must have it).
fn uncommented(text: &str, start: &str) -> String {
    let want = format!("#{start}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with(&want)).count(),
        1,
        "one commented-out line starting with {start:?}"
    );
    text.lines()
        .map(|l| {
            l.strip_prefix('#')
                .filter(|r| r.starts_with(start))
                .unwrap_or(l)
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// sysusers.d: `systemd-sysusers --root` makes a system group `tierstack` in a copy of this
/// host's /etc/group (the host's own is never written), and a second run changes nothing.
/// The group file, for the udev check.
fn check_sysusers(conf: &Path, tmp: &Path) -> PathBuf {
    let root = tmp.join("sysusers-root");
    std::fs::create_dir_all(root.join("etc")).expect("mkdir");
    let group = root.join("etc/group");
    std::fs::copy("/etc/group", &group).expect("copy /etc/group");
    let host_group = std::fs::read("/etc/group").expect("read /etc/group");
    let sysusers = || {
        output_of(
            Command::new("systemd-sysusers")
                .arg(format!("--root={}", root.display()))
                .arg(conf),
        )
    };
    sysusers();
    let text = std::fs::read_to_string(&group).expect("group");
    let line = text
        .lines()
        .find(|l| l.starts_with("tierstack:"))
        .unwrap_or_else(|| panic!("no tierstack group made:\n{text}"));
    let gid: u32 = line
        .split(':')
        .nth(2)
        .and_then(|g| g.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    // A system group (below SYS_GID_MAX, 999 on Debian and Fedora).
    assert!(gid > 0 && gid < 1000, "not a system group: {line}");
    sysusers();
    assert_eq!(std::fs::read_to_string(&group).expect("group"), text);
    assert_eq!(std::fs::read("/etc/group").expect("read"), host_group);
    group
}

/// tmpfiles.d: the folders with the modes the code expects; the commented-out enable_uring
/// and idle-polling lines, uncommented, write Y and 200000 (into the temporary root);
/// `--clean` under an upstream-style 30-day /var/tmp line keeps the fast tiers' old files and
/// removes others.
fn check_tmpfiles(conf: &Path, tmp: &Path) {
    let root = tmp.join("tmpfiles-root");
    std::fs::create_dir_all(&root).expect("mkdir");
    let tmpfiles = |args: &[&str], files: &[&Path]| {
        let o = run(Command::new("systemd-tmpfiles")
            .args(args)
            .arg(format!("--root={}", root.display()))
            .args(files));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() && err.trim().is_empty(),
            "systemd-tmpfiles {args:?} {files:?}: {err}"
        );
    };
    tmpfiles(&["--create"], &[conf]);
    for (dir, mode) in [
        ("run/tierstack", 0o755),
        ("var/log/tierstack", 0o755),
        ("var/tmp/tierstack", 0o700),
    ] {
        assert_eq!(
            mode_of(&root.join(dir)),
            (mode, 0, 0),
            "{dir}: mode, owner, group"
        );
    }
    assert!(
        !root.join("sys").exists(),
        "the enable_uring and idle-polling lines are site choices, off"
    );

    // The site-choice lines (commented out), each uncommented alone: it writes its value into
    // the temporary root's parameter, never the host's.
    let text = std::fs::read_to_string(conf).expect("tmpfiles conf");
    for (i, (param, before, after)) in [
        ("sys/module/fuse/parameters/enable_uring", "N", "Y"),
        (
            "sys/module/haltpoll/parameters/guest_halt_poll_ns",
            "0",
            "200000",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let one = tmp.join(format!("tmpfiles-site-{i}.conf"));
        std::fs::write(&one, uncommented(&text, &format!("w /{param} "))).expect("write");
        let at = root.join(param);
        std::fs::create_dir_all(at.parent().expect("parent")).expect("mkdir");
        std::fs::write(&at, format!("{before}\n")).expect("write");
        let host = std::fs::read_to_string(format!("/{param}")).ok();
        tmpfiles(&["--create"], &[&one]);
        assert_eq!(std::fs::read_to_string(&at).expect("read").trim(), after);
        assert_eq!(
            std::fs::read_to_string(format!("/{param}")).ok(),
            host,
            "the host's {param} is left alone"
        );
    }

    // Fedora's and upstream's tmp.conf age /var/tmp after 30 days (Debian 13's too); `m:` ages
    // by mtime alone, which the test can set back (ctime it cannot).
    let ageing = tmp.join("var-tmp.conf");
    std::fs::write(&ageing, "q /var/tmp 1777 root root m:30d\n").expect("write");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60 * 86400);
    let kept = [
        "var/tmp/tierstack/0123456789abcdef/drive0",
        "var/tmp/tierstack-1000/0123456789abcdef/drive0",
        "var/tmp/tierstack-slurm/jobs/42/drive0",
    ];
    let aged = "var/tmp/someone-else/old";
    for f in kept.iter().chain([&aged]) {
        let p = root.join(f);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, b"undrained").expect("write");
        std::fs::File::options()
            .write(true)
            .open(&p)
            .and_then(|f| f.set_modified(old))
            .expect("set mtime");
    }
    tmpfiles(&["--clean"], &[&ageing, conf]);
    assert!(
        !root.join(aged).exists(),
        "the ageing line removes old files"
    );
    for f in kept {
        assert!(root.join(f).exists(), "{f} aged out of /var/tmp");
    }
}

/// sysctl.d: `sysctl --dry-run -p` reads the file (nothing active: it prints nothing) and its
/// commented-out line, uncommented (the key exists, the syntax is sysctl's), writing nothing.
fn check_sysctl(conf: &Path, tmp: &Path) {
    let key = Path::new("/proc/sys/vm/unprivileged_userfaultfd");
    let before = std::fs::read_to_string(key).ok();
    let dry = |file: &Path| {
        let o = run(Command::new("sysctl").args(["--dry-run", "-p"]).arg(file));
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(
            o.status.success() && err.is_empty(),
            "sysctl -p {}: {err}",
            file.display()
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(dry(conf), "", "the sysctl line stays commented out");
    let text = std::fs::read_to_string(conf).expect("sysctl conf");
    let on = tmp.join("sysctl-on.conf");
    std::fs::write(&on, uncommented(&text, "vm.unprivileged_userfaultfd")).expect("write");
    assert_eq!(dry(&on), "vm.unprivileged_userfaultfd = 1");
    assert_eq!(std::fs::read_to_string(key).ok(), before, "--dry-run wrote");
}

/// The device number (`MAJOR:MINOR`) of the misc device `name`, if the kernel has it.
fn misc_dev(name: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/devices/virtual/misc/{name}/dev"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// The udev rule, through `udevadm test` in a private mount namespace (see the module's
/// comment). `group` holds the tierstack group (from systemd-sysusers).
fn check_udev(rule: &Path, group: &Path, tmp: &Path) {
    if have("udevadm")
        && run(Command::new("udevadm").args(["verify", "--help"]))
            .status
            .success()
    {
        let o = run(Command::new("udevadm")
            .args(["verify", "--resolve-names=never"])
            .arg(rule));
        assert!(o.status.success(), "udevadm verify: {}", text_of(&o));
    }
    if !is_root() {
        eprintln!("SKIP: the udev rule's run needs root (a private mount namespace)");
        return;
    }
    let fuse = misc_dev("fuse").expect("the fuse misc device (/sys/devices/virtual/misc/fuse)");
    let uffd = misc_dev("userfaultfd");
    if uffd.is_none() {
        eprintln!("NOTE: no /dev/userfaultfd in this kernel (before 6.1): its rule is not run");
    }
    let text = std::fs::read_to_string(rule).expect("rule");
    let site = tmp.join("site.rules");
    std::fs::write(&site, uncommented(&text, "KERNEL==\"fuse\"")).expect("write");
    let out = tmp.join("udev");
    std::fs::create_dir_all(&out).expect("mkdir");
    // Inside the namespace: /run, /dev and /etc/udev/rules.d are the test's tmpfs, /etc/group
    // is `group`; the rule is in /run/udev/rules.d (as a package's would be in /usr/lib),
    // then the site's copy of it in /etc/udev/rules.d under the same name.
    let script = r#"set -e
rule=$1 group=$2 site=$3 out=$4 fuse=$5 uffd=$6
name=${rule##*/}
mount -t tmpfs tmpfs /run
mkdir -p /run/udev/rules.d
cp "$rule" /run/udev/rules.d/
if [ -d /etc/udev/rules.d ]; then mount -t tmpfs tmpfs /etc/udev/rules.d; fi
mount --bind "$group" /etc/group
mount -t tmpfs -o mode=755 tmpfs /dev
mknod -m 666 /dev/null c 1 3
nodes() {
  rm -f /dev/fuse /dev/userfaultfd
  mknod -m 600 /dev/fuse c "${fuse%:*}" "${fuse#*:}"
  if [ -n "$uffd" ]; then mknod -m 600 /dev/userfaultfd c "${uffd%:*}" "${uffd#*:}"; fi
}
nodes
udevadm test --action=add /sys/devices/virtual/misc/fuse >"$out/fuse.log" 2>&1
if [ -n "$uffd" ]; then
  udevadm test --action=add /sys/devices/virtual/misc/userfaultfd >"$out/uffd.log" 2>&1
  echo "userfaultfd $(stat -c '%a %G' /dev/userfaultfd)"
fi
echo "fuse $(stat -c '%a %G' /dev/fuse)"
nodes
cp "$site" "/etc/udev/rules.d/$name"
udevadm test --action=add /sys/devices/virtual/misc/fuse >"$out/site.log" 2>&1
echo "site-fuse $(stat -c '%a %G' /dev/fuse)"
"#;
    let installed_rule = tmp.join("rule").join(rule.file_name().expect("name"));
    std::fs::create_dir_all(installed_rule.parent().expect("parent")).expect("mkdir");
    std::fs::copy(rule, &installed_rule).expect("copy");
    let o = run(Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(&installed_rule)
        .arg(group)
        .arg(&site)
        .arg(&out)
        .arg(&fuse)
        .arg(uffd.as_deref().unwrap_or("")));
    let logs: String = ["fuse.log", "uffd.log", "site.log"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(out.join(f)).ok())
        .collect();
    assert!(
        o.status.success(),
        "udevadm test in a private namespace failed: {}\n{logs}",
        text_of(&o)
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    let got = |dev: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(dev)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {dev} line: {stdout}"))
            .to_string()
    };
    // udev's complaints about a rule file start with its path; applied rules with the device.
    let name = rule.file_name().and_then(|n| n.to_str()).expect("name");
    for l in logs.lines() {
        assert!(
            !(l.starts_with('/') && l.contains(&format!("/{name}:"))),
            "udev does not take the rule: {l}"
        );
    }
    assert!(
        logs.contains(&format!("{name}:")) && logs.contains("GROUP"),
        "the rule was not applied:\n{logs}"
    );
    // The distribution's 0666 stays (50-udev-default.rules): only the group changes.
    assert_eq!(got("fuse"), "666 tierstack");
    if uffd.is_some() {
        assert_eq!(got("userfaultfd"), "660 tierstack");
    }
    assert_eq!(got("site-fuse"), "660 tierstack");
}

/// The drop-ins are installed where systemd and udev read a package's (PREFIX=/usr) and the
/// tools that read them take them (see the module's comment).
fn check_dropins(usr: &Path, tmp: &Path) {
    let lib = usr.join("lib");
    let files = [
        lib.join("sysusers.d/tierstack.conf"),
        lib.join("tmpfiles.d/tierstack.conf"),
        lib.join("udev/rules.d/60-tierstack.rules"),
        lib.join("sysctl.d/60-tierstack.conf"),
    ];
    for f in &files {
        assert!(f.is_file(), "{} not installed", f.display());
    }
    let group = check_sysusers(&files[0], tmp);
    check_tmpfiles(&files[1], tmp);
    check_sysctl(&files[3], tmp);
    check_udev(&files[2], &group, tmp);
}

/// The installed binary's `slurm install` writes its own path into the Prolog, the Epilog
/// and the Lua script (what SLURM runs), not the build tree's.
fn check_slurm_install(bin: &Path, tmp: &Path) {
    let (conf, fast) = (tmp.join("slurm-conf"), tmp.join("slurm-fast"));
    std::fs::create_dir_all(&conf).expect("mkdir");
    output_of(
        Command::new(bin)
            .args(["slurm", "install", "--conf-dir"])
            .arg(&conf)
            .arg("--fast-dir")
            .arg(&fast),
    );
    let installed = bin.canonicalize().expect("installed binary");
    let built = Path::new(BIN).canonicalize().expect("built binary");
    assert_ne!(installed, built);
    for (file, quoted) in [
        (
            "tierstack_prolog.sh",
            format!("exec '{}' slurm prolog ", installed.display()),
        ),
        (
            "tierstack_epilog.sh",
            format!("exec '{}' slurm epilog ", installed.display()),
        ),
        (
            "tierstack_task_prolog.sh",
            format!("'{}' slurm task-prolog", installed.display()),
        ),
        ("burst_buffer.lua", format!("\"{}\"", installed.display())),
    ] {
        let text = std::fs::read_to_string(conf.join(file)).expect("written");
        assert!(
            text.contains(&quoted),
            "{file} does not run {quoted}:\n{text}"
        );
        assert!(
            !text.contains(&*built.to_string_lossy()),
            "{file} names the build tree's binary"
        );
        if file.ends_with(".sh") {
            output_of(Command::new("sh").arg("-n").arg(conf.join(file)));
        }
    }
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
        "slurm/task_prolog.sh",
        "grafana/tierstack.json",
    ] {
        assert!(
            usr.join("share/tierstack").join(f).is_file(),
            "share/tierstack/{f} not installed"
        );
    }
    for unit in [
        "tierstack@.service",
        "tierstack-recover.service",
        "tierstack-exporter.service",
    ] {
        let text = std::fs::read_to_string(usr.join("lib/systemd/system").join(unit))
            .unwrap_or_else(|e| panic!("{unit} not installed: {e}"));
        assert!(
            text.contains("ExecStart=/usr/bin/tierstack ") && !text.contains("@BINDIR@"),
            "{unit} names the installed binary: {text}"
        );
    }
    check_run_finds(&bin, &lib);
    check_dropins(&usr, tmp.path());
    check_slurm_install(&bin, tmp.path());

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
