# tierstack's Spack package (issue 38): `spack repo add <checkout>/contrib/spack`, then
# `spack install tierstack@main`. contrib/spack/README.md has the run that was made with it,
# and contrib/spack/test.sh repeats it in a temporary folder.

import os

import spack
import spack.directives
from spack.package import *

try:  # Spack 1.0 and later: the build systems live in the builtin package repository.
    from spack_repo.builtin.build_systems.makefile import MakefilePackage
except ImportError:  # before 1.0, `spack.package` exports them.
    pass


def _default_git():
    """The repository this recipe is part of (contrib/spack/packages/tierstack/ is four levels
    below its root), so that `spack install tierstack@main` builds the clone the repository
    was added from; None when the recipe is read from elsewhere (Spack's copy of it in an
    install prefix)."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.realpath(os.path.join(here, "..", "..", "..", ".."))
    is_checkout = os.path.exists(os.path.join(root, ".git"))
    if is_checkout and os.path.isfile(os.path.join(root, "Makefile")):
        return "file://" + root
    return None


def _c_is_a_dependency():
    """Whether this Spack models the C compiler as a dependency (`c`): a real virtual since
    1.0, a language since 0.23. Before, every package gets its compiler and the solver has no
    `c` (a develop snapshot of mid-2024 knows only `cxx` and `fortran`)."""
    if getattr(spack, "spack_version_info", (0,)) >= (1,):
        return True
    return "c" in getattr(spack.directives, "SUPPORTED_LANGUAGES", ())


class Tierstack(MakefilePackage):
    """A user-space tiered memory and storage accelerator for HPC nodes: memory beyond DRAM
    for unmodified programs (`tierstack run`, userfaultfd and an LD_PRELOAD shim), a FUSE
    burst-buffer mount that drains to the parallel file system (`tierstack mount`), and a
    user-space RAID over local drives (`tierstack array`), with SLURM burst_buffer/lua hooks.
    """

    # The repository to fetch `main` from: $TIERSTACK_GIT (a URL or file:// path) where set,
    # else the clone this recipe is in.
    git = os.environ.get("TIERSTACK_GIT") or _default_git()

    license("Apache-2.0")

    version("main", branch="main")

    # Cargo.toml's `rust-version`. `cargo` fetches the crates of Cargo.lock from crates.io
    # (or wherever $CARGO_HOME's configuration points: a vendored source for offline sites).
    depends_on("rust@1.80:", type="build")
    # C: the bundled SQLite (libsqlite3-sys) and reed-solomon-erasure's SIMD code (cc crate).
    depends_on("c", type="build", when=_c_is_a_dependency())
    # objcopy: `make install` splits the debug info out and strips the binary and the shim.
    depends_on("binutils", type="build")
    # No libfuse: the binary speaks /dev/fuse itself (fuser without its libfuse feature), and
    # git is optional (build.rs names the commit in --version when the source is a clone).

    conflicts("platform=darwin", msg="tierstack needs Linux (userfaultfd, FUSE, io_uring)")
    conflicts("platform=windows", msg="tierstack needs Linux (userfaultfd, FUSE, io_uring)")

    def setup_build_environment(self, env):
        # The build stays in the stage even where the caller's environment names another
        # target folder (the Makefile follows $CARGO_TARGET_DIR as cargo does).
        env.set("CARGO_TARGET_DIR", join_path(self.stage.source_path, "target"))

    def build(self, spec, prefix):
        # The release build of the binary and the preload shim, to Cargo.lock's versions.
        cargo = Executable(spec["rust"].prefix.bin.cargo)
        cargo(
            "build",
            "--release",
            "--locked",
            "-p",
            "tierstack-cli",
            "-p",
            "tierstack-preload",
            f"-j{make_jobs}",
        )

    def install(self, spec, prefix):
        # The project's own install: the stripped binary and shim with their debug info split
        # out, the man pages and completions the binary writes, the SLURM files, the Grafana
        # dashboard and the systemd units (installed, not enabled), under the prefix.
        make("install", f"PREFIX={prefix}")

    # `spack test run tierstack`: the installed binary names its version and runs the demo's
    # RAID part (file drives in a temporary folder; no root, no FUSE).
    def test_version(self):
        """tierstack --version names itself and its commit"""
        out = Executable(self.prefix.bin.tierstack)("--version", output=str, error=str)
        # build.rs: `tierstack 0.1.0 (git abc1234, date)`, `(git unknown)` from a tarball.
        assert out.startswith("tierstack ") and "(git " in out, out

    def test_demo_array(self):
        """tierstack demo --only array runs"""
        Executable(self.prefix.bin.tierstack)("demo", "--only", "array", output=str, error=str)
