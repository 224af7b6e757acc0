//! The packages of issue 38, built from the binary under test (nothing is compiled: `BIN=`
//! and `PRELOAD=` name the built files and `CARGO=false` would fail a make that tried cargo).
//!
//! - `make deb`: the .deb is built with dpkg-deb from `make install`'s tree, its control
//!   fields are checked, then (as root) it is installed with `dpkg -i`: the installed
//!   `/usr/bin/tierstack` names the commit, runs the demo's array part, `man -w` finds its
//!   page, and `dpkg --purge` removes every file dpkg listed. A guard purges the package when
//!   an assertion fails half-way; a `tierstack` package installed before the test makes it
//!   fail, never purge someone's install.
//! - `contrib/rpm/tierstack.spec`: where `rpmbuild` is (Debian's `rpm` package), a binary-only
//!   `rpmbuild -bb` and `rpm -qlp` listing the FHS layout (lib64 from rpm's `%{_libdir}`).
//!   The RPM is not installed.
//! - `contrib/spack` (Spack is not on CI's machines: `contrib/spack/test.sh` is the real
//!   `spack install`): `python3 -m py_compile` accepts `package.py`, and Python's `ast` reads
//!   what it declares: the class derives from a Spack build system, a `main` version from
//!   git, `rust` as a build dependency at Cargo.toml's `rust-version`, `binutils` (objcopy),
//!   and its install runs the project's `make install PREFIX=`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

mod common;
use common::{free_port, get_metrics, is_root, preload, repo_root, BIN};

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `cmd`, which must succeed; its standard output.
#[track_caller]
fn output_of(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(o.status.success(), "{cmd:?} failed: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The workspace version, as the Makefile reads it (`[workspace.package] version`).
fn workspace_version() -> String {
    let toml = std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("Cargo.toml");
    let section = toml
        .split("[workspace.package]")
        .nth(1)
        .expect("[workspace.package]");
    section
        .lines()
        .take_while(|l| !l.starts_with('['))
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "version").then(|| v.trim().trim_matches('"').to_string())
        })
        .expect("workspace version")
}

/// `make TARGET` in the repository with the binary under test, nothing built.
#[track_caller]
fn make_ok(target: &str, dist: &Path, extra: &[&str]) -> String {
    let o = Command::new("make")
        .current_dir(repo_root())
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .arg("--no-print-directory")
        .arg(target)
        .arg(format!("BIN={BIN}"))
        .arg(format!("PRELOAD={}", preload().display()))
        .arg(format!("DIST={}", dist.display()))
        .arg("CARGO=false")
        .args(extra)
        .output()
        .expect("make not found: install make");
    let t = text(&o);
    assert!(o.status.success(), "make {target} failed:\n{t}");
    t
}

/// `dpkg -s tierstack` succeeds: the package is installed (or half-installed).
fn deb_installed() -> bool {
    Command::new("dpkg")
        .args(["-s", "tierstack"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Purges the package when dropped (a failed assertion included), unless `done`.
struct Purge {
    done: bool,
    /// The test made the group (through the postinst): removed again at the end, though a
    /// real purge keeps it.
    drop_group: bool,
}

/// Whether group `name` exists.
fn has_group(name: &str) -> bool {
    Command::new("getent")
        .args(["group", name])
        .output()
        .is_ok_and(|o| o.status.success())
}

impl Drop for Purge {
    fn drop(&mut self) {
        if !self.done && deb_installed() {
            let o = Command::new("dpkg").args(["--purge", "tierstack"]).output();
            match o {
                Ok(o) if o.status.success() => eprintln!("cleanup: purged tierstack"),
                Ok(o) => eprintln!("cleanup: dpkg --purge tierstack failed: {}", text(&o)),
                Err(e) => eprintln!("cleanup: dpkg: {e}"),
            }
        }
        if self.drop_group && has_group("tierstack") {
            let _ = Command::new("groupdel").arg("tierstack").output();
        }
    }
}

#[test]
fn deb_builds_installs_and_purges() {
    if !have("dpkg-deb") {
        eprintln!("NOTE: no dpkg-deb here (not a Debian host): the .deb is not tested");
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dist = tmp.path().join("dist");
    let t0 = Instant::now();
    // zstd: 1 s where the default xz takes 45 (on 2 cores) for the 100 MB tree.
    make_ok("deb", &dist, &["DEB_COMPRESS=zstd"]);
    let arch = output_of(Command::new("dpkg").arg("--print-architecture"));
    let version = workspace_version();
    let deb = dist.join(format!("tierstack_{version}_{}.deb", arch.trim()));
    assert!(deb.is_file(), "{} not built", deb.display());
    eprintln!("make deb: {:.1} s", t0.elapsed().as_secs_f64());

    // Its control fields, from the template.
    let field = |f: &str| output_of(Command::new("dpkg-deb").arg("-f").arg(&deb).arg(f));
    assert_eq!(field("Package").trim(), "tierstack");
    assert_eq!(field("Version").trim(), version);
    assert_eq!(field("Architecture").trim(), arch.trim());
    assert_eq!(field("Depends").trim(), "libc6, fuse3");
    assert_eq!(field("Recommends").trim(), "man-db");
    assert!(!field("Maintainer").trim().is_empty());
    let size: u64 = field("Installed-Size")
        .trim()
        .parse()
        .expect("Installed-Size");
    assert!(size > 1000, "Installed-Size {size} KiB");
    // Files owned by root (--root-owner-group), one maintainer script (the group), no make
    // uninstall list.
    let contents = output_of(Command::new("dpkg-deb").arg("-c").arg(&deb));
    for line in contents.lines() {
        assert!(line.contains(" root/root "), "not root's: {line}");
        assert!(!line.ends_with("/installed-files"), "{line}");
    }
    let control = output_of(Command::new("dpkg-deb").arg("-I").arg(&deb));
    assert!(control.contains("postinst"), "no postinst: {control}");
    for script in ["prerm", "postrm", "preinst"] {
        assert!(!control.contains(script), "a {script}: {control}");
    }

    if !is_root() {
        eprintln!("NOTE: not root: the .deb is built but not installed");
        return;
    }
    assert!(
        !deb_installed(),
        "a tierstack package is already installed on this machine (dpkg -s tierstack): this \
         test installs and purges its own and will not remove yours; remove it \
         (dpkg --purge tierstack) or run the test elsewhere"
    );
    let had_group = has_group("tierstack");
    let mut guard = Purge {
        done: false,
        drop_group: !had_group,
    };
    let t0 = Instant::now();
    output_of(Command::new("dpkg").arg("-i").arg(&deb));
    eprintln!("dpkg -i: {:.1} s", t0.elapsed().as_secs_f64());
    // The postinst made the group the udev rule and the SLURM hooks name.
    assert!(has_group("tierstack"), "no group tierstack after dpkg -i");

    let listed: Vec<PathBuf> = output_of(Command::new("dpkg").args(["-L", "tierstack"]))
        .lines()
        .filter(|l| l.starts_with('/'))
        .map(PathBuf::from)
        .collect();
    for want in [
        "/usr/bin/tierstack",
        "/usr/lib/tierstack/libtierstack_preload.so",
        "/usr/lib/tierstack/libtierstack_io.so",
        "/usr/share/man/man1/tierstack.1",
        "/usr/lib/systemd/system/tierstack@.service",
        "/usr/share/tierstack/slurm/prolog.sh",
        "/usr/share/tierstack/slurm/task_prolog.sh",
        "/usr/lib/debug/usr/bin/tierstack.debug",
        "/usr/lib/sysusers.d/tierstack.conf",
        "/usr/lib/tmpfiles.d/tierstack.conf",
        "/usr/lib/udev/rules.d/60-tierstack.rules",
        "/usr/lib/sysctl.d/60-tierstack.conf",
    ] {
        assert!(
            listed.iter().any(|p| p == Path::new(want)),
            "dpkg -L tierstack does not list {want}"
        );
    }

    // The installed binary is the one under test and names its commit.
    let bin = Path::new("/usr/bin/tierstack");
    let v = output_of(Command::new(bin).arg("--version"));
    assert_eq!(v, output_of(Command::new(BIN).arg("--version")));
    assert!(
        v.starts_with(&format!("tierstack {version} (git ")),
        "--version: {v}"
    );
    let demo_dir = tempfile::tempdir().expect("tmp");
    let t0 = Instant::now();
    let demo = Command::new(bin)
        .args(["demo", "--only", "array", "--dir"])
        .arg(demo_dir.path())
        .output()
        .expect("run the installed tierstack");
    assert!(
        demo.status.success(),
        "installed tierstack demo --only array failed:\n{}",
        text(&demo)
    );
    eprintln!(
        "installed demo --only array: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // The installed exporter answers a scrape (what the packaged tierstack-exporter.service
    // runs), with no mount on the node.
    let port = free_port();
    let rd = tempfile::tempdir().expect("tmp");
    let mut exp = Command::new(bin)
        .args(["exporter", "--listen", &format!("127.0.0.1:{port}")])
        .env("TIERSTACK_RUN_DIR", rd.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the installed exporter");
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if t0.elapsed() > std::time::Duration::from_secs(20) {
            let _ = exp.kill();
            panic!("the installed exporter does not listen on port {port}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (head, body) = get_metrics(port);
    let _ = exp.kill();
    let _ = exp.wait();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        body.contains("tierstack_exporter_mounts 0"),
        "the installed exporter's scrape:\n{body}"
    );
    let page = output_of(Command::new("man").args(["-w", "tierstack"]));
    assert!(
        page.trim().starts_with("/usr/share/man/man1/tierstack.1"),
        "man -w tierstack: {page}"
    );
    // The units are installed, not enabled (the postinst makes the group only).
    assert!(
        !Path::new("/etc/systemd/system/multi-user.target.wants/tierstack-recover.service")
            .exists()
    );

    // Purge: every file dpkg listed is gone, and the package's own folders.
    let files: Vec<&PathBuf> = listed
        .iter()
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| !m.is_dir()))
        .collect();
    assert!(files.len() > 40, "dpkg lists only {} files", files.len());
    output_of(Command::new("dpkg").args(["--purge", "tierstack"]));
    guard.done = true;
    assert!(!deb_installed(), "dpkg -s tierstack after the purge");
    let left: Vec<&&PathBuf> = files.iter().filter(|p| p.exists()).collect();
    assert!(left.is_empty(), "dpkg --purge left {left:?}");
    for dir in [
        "/usr/lib/tierstack",
        "/usr/share/tierstack",
        "/usr/lib/debug/usr/lib/tierstack",
    ] {
        assert!(!Path::new(dir).exists(), "dpkg --purge left {dir}");
    }
}

#[test]
fn rpm_spec_builds_the_fhs_layout() {
    let spec = repo_root().join("contrib/rpm/tierstack.spec");
    let text_of_spec = std::fs::read_to_string(&spec).expect("contrib/rpm/tierstack.spec");
    let version = workspace_version();
    assert!(
        text_of_spec
            .lines()
            .any(|l| l.starts_with("Version:") && l.split_whitespace().nth(1) == Some(&version)),
        "the spec's Version: is not the workspace's {version}"
    );
    if !have("rpmbuild") {
        eprintln!("NOTE: no rpmbuild here (apt-get install rpm): the spec is not built");
        return;
    }
    let libdir = output_of(Command::new("rpm").args(["--eval", "%{_libdir}"]));
    let libdir = libdir.trim();
    if cfg!(target_arch = "x86_64") {
        assert_eq!(libdir, "/usr/lib64", "rpm's %{{_libdir}} on x86_64");
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let top = tmp.path().join("rpmbuild");
    let t0 = Instant::now();
    let o = Command::new("rpmbuild")
        .current_dir(repo_root())
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .args(["-bb", "--nodeps"])
        // zstd payload: faster than rpm's default gzip -9 for the 100 MB tree.
        .arg("--define")
        .arg("_binary_payload w3.zstdio")
        .arg("--define")
        .arg(format!("_topdir {}", top.display()))
        .arg("--define")
        .arg("tierstack_prebuilt 1")
        .arg("--define")
        .arg(format!("tierstack_srcdir {}", repo_root().display()))
        .arg("--define")
        .arg(format!("tierstack_bin {BIN}"))
        .arg("--define")
        .arg(format!("tierstack_preload {}", preload().display()))
        .arg(&spec)
        .output()
        .expect("rpmbuild");
    assert!(o.status.success(), "rpmbuild -bb failed:\n{}", text(&o));
    eprintln!("rpmbuild -bb: {:.1} s", t0.elapsed().as_secs_f64());
    let rpms: Vec<PathBuf> = std::fs::read_dir(top.join("RPMS"))
        .expect("RPMS")
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "rpm"))
        .collect();
    assert_eq!(rpms.len(), 1, "one RPM: {rpms:?}");
    let name = rpms[0].file_name().and_then(|n| n.to_str()).expect("name");
    assert!(
        name.starts_with(&format!("tierstack-{version}-1")),
        "{name}"
    );

    // Its scripts make the group (rpm before 4.19) and reload udev's rules.
    let scripts = output_of(
        Command::new("rpm")
            .arg("-qp")
            .arg("--scripts")
            .arg(&rpms[0]),
    );
    assert!(
        scripts.contains("groupadd -r tierstack") && scripts.contains("udevadm control --reload"),
        "rpm --scripts:\n{scripts}"
    );
    let list = output_of(Command::new("rpm").arg("-qlp").arg(&rpms[0]));
    let has = |p: &str| list.lines().any(|l| l == p);
    for want in [
        "/usr/bin/tierstack".to_string(),
        format!("{libdir}/tierstack/libtierstack_preload.so"),
        format!("{libdir}/tierstack/libtierstack_io.so"),
        "/usr/share/bash-completion/completions/tierstack".to_string(),
        "/usr/share/zsh/site-functions/_tierstack".to_string(),
        "/usr/share/fish/vendor_completions.d/tierstack.fish".to_string(),
        "/usr/share/tierstack/slurm/burst_buffer.lua".to_string(),
        "/usr/share/tierstack/grafana/tierstack.json".to_string(),
        "/usr/lib/systemd/system/tierstack@.service".to_string(),
        "/usr/lib/systemd/system/tierstack-recover.service".to_string(),
        "/usr/lib/systemd/system/tierstack-exporter.service".to_string(),
        "/usr/lib/sysusers.d/tierstack.conf".to_string(),
        "/usr/lib/tmpfiles.d/tierstack.conf".to_string(),
        "/usr/lib/udev/rules.d/60-tierstack.rules".to_string(),
        "/usr/lib/sysctl.d/60-tierstack.conf".to_string(),
        "/usr/lib/debug/usr/bin/tierstack.debug".to_string(),
        format!("/usr/lib/debug{libdir}/tierstack/libtierstack_preload.so.debug"),
    ] {
        assert!(has(&want), "rpm -qlp does not list {want}:\n{list}");
    }
    for page in [
        "tierstack.1",
        "tierstack-mount.1",
        "tierstack-array-create.1",
    ] {
        let p = format!("/usr/share/man/man1/{page}");
        assert!(
            list.lines().any(|l| l == p || l == format!("{p}.gz")),
            "rpm -qlp does not list {p}*:\n{list}"
        );
    }
    assert!(
        !list.lines().any(|l| l.ends_with("/installed-files")),
        "make uninstall's list is packaged"
    );
    assert!(
        !list.lines().any(|l| l.starts_with("/usr/lib/tierstack")),
        "the shim is packaged in /usr/lib, not {libdir}"
    );
    let reqs = output_of(
        Command::new("rpm")
            .args(["-qp", "--requires"])
            .arg(&rpms[0]),
    );
    assert!(reqs.lines().any(|l| l.trim() == "fuse3"), "{reqs}");
}

/// Reads `contrib/spack/packages/tierstack/package.py` with Python's `ast` (it is not run: it
/// imports Spack) and prints what it declares as JSON: the classes and their bases, the
/// positional and keyword arguments (as source text) of each `version` and `depends_on`
/// directive in the class body, the `make` calls of its `install` method and its
/// `install_targets`. py_compile first, its bytecode in a temporary folder (argv[2]).
const PACKAGE_PY_READER: &str = r#"
import ast, json, os, py_compile, sys

path, cfile = sys.argv[1], sys.argv[2]
py_compile.compile(path, cfile=cfile, doraise=True)
tree = ast.parse(open(path).read(), path)

def call(node):
    return {
        "func": ast.unparse(node.func),
        "args": [a.value if isinstance(a, ast.Constant) else ast.unparse(a) for a in node.args],
        "kwargs": {k.arg: (k.value.value if isinstance(k.value, ast.Constant) else ast.unparse(k.value))
                   for k in node.keywords},
    }

classes = []
for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
    directives = [call(st.value) for st in cls.body
                  if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)]
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    install_make = []
    if "install" in methods:
        install_make = [call(c) for c in ast.walk(methods["install"])
                        if isinstance(c, ast.Call) and ast.unparse(c.func) == "make"]
    targets = None
    for st in cls.body:
        if isinstance(st, ast.Assign) and any(ast.unparse(t) == "install_targets" for t in st.targets):
            targets = ast.unparse(st.value)
    classes.append({
        "name": cls.name,
        "bases": [ast.unparse(b) for b in cls.bases],
        "docstring": ast.get_docstring(cls) or "",
        "directives": directives,
        "methods": sorted(methods),
        "install_make": install_make,
        "install_targets": targets,
    })
print(json.dumps({"classes": classes}))
"#;

/// The Spack build system classes a package may derive from (those of Spack 0.x's
/// `spack.build_systems` and 1.x's `spack_repo.builtin.build_systems` that fit a Makefile
/// or cargo project).
const SPACK_BUILD_SYSTEMS: &[&str] = &["MakefilePackage", "CargoPackage", "Package"];

/// The `rust-version` of Cargo.toml's `[workspace.package]`.
fn workspace_rust_version() -> String {
    let toml = std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("Cargo.toml");
    toml.split("[workspace.package]")
        .nth(1)
        .expect("[workspace.package]")
        .lines()
        .take_while(|l| !l.starts_with('['))
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "rust-version").then(|| v.trim().trim_matches('"').to_string())
        })
        .expect("workspace rust-version")
}

#[test]
fn spack_package_compiles_and_declares_its_build() {
    let dir = repo_root().join("contrib/spack");
    let package = dir.join("packages/tierstack/package.py");
    assert!(package.is_file(), "{} missing", package.display());

    // The repository's namespace, which `spack repo add` registers.
    let repo_yaml =
        std::fs::read_to_string(dir.join("repo.yaml")).expect("contrib/spack/repo.yaml");
    let namespace = repo_yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("namespace:"))
        .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\''));
    assert_eq!(namespace, Some("tierstack"), "repo.yaml:\n{repo_yaml}");

    let tmp = tempfile::tempdir().expect("tmp");
    let o = Command::new("python3")
        .arg("-c")
        .arg(PACKAGE_PY_READER)
        .arg(&package)
        .arg(tmp.path().join("package.pyc"))
        .output()
        .expect("python3 not found: install python3");
    assert!(
        o.status.success(),
        "python3 could not compile or parse {}:\n{}",
        package.display(),
        text(&o)
    );
    assert!(
        tmp.path().join("package.pyc").is_file(),
        "py_compile wrote no bytecode"
    );
    let read: serde_json::Value = serde_json::from_slice(&o.stdout).expect("the reader's JSON");

    // Spack names a package's class after its folder: tierstack -> Tierstack.
    let classes = read["classes"].as_array().expect("classes");
    let class = classes
        .iter()
        .find(|c| c["name"] == "Tierstack")
        .unwrap_or_else(|| panic!("no class Tierstack in package.py: {classes:?}"));
    let bases: Vec<&str> = class["bases"]
        .as_array()
        .expect("bases")
        .iter()
        .filter_map(|b| b.as_str())
        .collect();
    assert!(
        bases.iter().any(|b| SPACK_BUILD_SYSTEMS.contains(b)),
        "Tierstack derives from {bases:?}, none of Spack's build systems {SPACK_BUILD_SYSTEMS:?}"
    );
    assert!(
        !class["docstring"].as_str().unwrap_or("").trim().is_empty(),
        "no docstring: `spack info` shows it as the description"
    );

    let directives = class["directives"].as_array().expect("directives");
    let named = |f: &str| -> Vec<&serde_json::Value> {
        directives.iter().filter(|d| d["func"] == f).collect()
    };
    // A version from git: `main`, its branch.
    let versions = named("version");
    assert!(
        versions
            .iter()
            .any(|v| v["args"][0] == "main" && v["kwargs"]["branch"] == "main"),
        "no version(\"main\", branch=\"main\"): {versions:?}"
    );

    // Build dependencies: rust at Cargo.toml's rust-version, binutils (objcopy for make
    // install), each of type build.
    let deps = named("depends_on");
    let dep = |name: &str| -> &serde_json::Value {
        deps.iter()
            .copied()
            .find(|d| {
                d["args"][0]
                    .as_str()
                    .is_some_and(|s| s == name || s.starts_with(&format!("{name}@")))
            })
            .unwrap_or_else(|| panic!("no depends_on(\"{name}...\"): {deps:?}"))
    };
    let rust = dep("rust");
    let msrv = workspace_rust_version();
    assert_eq!(
        rust["args"][0],
        format!("rust@{msrv}:"),
        "the rust dependency is not Cargo.toml's rust-version {msrv}"
    );
    for name in ["rust", "binutils"] {
        assert_eq!(
            dep(name)["kwargs"]["type"],
            "build",
            "depends_on(\"{name}\") is not type=\"build\""
        );
    }
    // No libfuse: the binary speaks /dev/fuse itself.
    assert!(
        !deps
            .iter()
            .any(|d| d["args"][0].as_str().is_some_and(|s| s.contains("fuse"))),
        "a fuse dependency: {deps:?}"
    );

    // The install is the project's own: make install PREFIX=<prefix>.
    let make_calls = class["install_make"].as_array().expect("install_make");
    let by_method = make_calls.iter().any(|c| {
        let args = c["args"].as_array().expect("args");
        args.first().is_some_and(|a| a == "install")
            && args
                .iter()
                .any(|a| a.as_str().is_some_and(|s| s.contains("PREFIX=")))
    });
    let by_targets = class["install_targets"]
        .as_str()
        .is_some_and(|t| t.contains("'install'") && t.contains("PREFIX="));
    assert!(
        by_method || by_targets,
        "install does not run `make install PREFIX=...`: install() calls make as \
         {make_calls:?}, install_targets = {}",
        class["install_targets"]
    );

    // The real check is a script: it must at least parse.
    let script = dir.join("test.sh");
    let o = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .expect("bash");
    assert!(
        o.status.success(),
        "bash -n {}: {}",
        script.display(),
        text(&o)
    );
}
