#!/usr/bin/env bash
# contrib/spack/test.sh: the real check of tierstack's Spack package (issue 38), with a Spack
# checkout that you bring (Spack is no Debian package and CI has none; CI only checks that
# package.py compiles and declares what it must: crates/tierstack-cli/tests/cli_packages.rs).
#
#   SPACK_ROOT=/path/to/spack [SPACK_PYTHON=/path/to/venv/bin/python] contrib/spack/test.sh
#
# Everything happens in one temporary folder: Spack's user and system configuration
# (SPACK_USER_CONFIG_PATH, SPACK_SYSTEM_CONFIG_PATH: the compiler and the repository are
# registered there), its user cache (SPACK_USER_CACHE_PATH), a configuration scope of its own
# (config.yaml: install tree, stage, caches; packages.yaml), Python's bytecode
# (PYTHONPYCACHEPREFIX) and the install tree. It is removed at the end unless
# TIERSTACK_SPACK_KEEP=1. Nothing else changes: the script checks that `git status
# --ignored` of this checkout and of SPACK_ROOT (where it is a git checkout) are the same
# after the run as before it.
#
# What it does:
#  1. declares the machine's Rust (rustc and cargo: from PATH, else ~/.cargo/bin, else /usr/bin),
#     binutils (objcopy) and GNU make as externals with `buildable: false`: Spack builds none
#     of them (it could not without the network anyway), and registers the C compiler
#     (`spack compiler find`);
#  2. `spack repo add contrib/spack`, `spack info tierstack`, `spack spec tierstack@main`;
#  3. `spack install tierstack@main` from this checkout: the committed HEAD is pushed as
#     `main` into a bare repository in the temporary folder and TIERSTACK_GIT points the
#     recipe there (uncommitted changes are not built; package.py itself is read from the
#     working tree); cargo fetches the crates as it does for any build ($CARGO_HOME);
#  4. the installed binary: `tierstack --version` names HEAD's commit, `tierstack demo --only
#     array` runs, `man -M <prefix>/share/man tierstack` shows its page; then
#     `spack test run tierstack` (the recipe's own tests).
#
# Time bounds (seconds): TIERSTACK_SPACK_TIMEOUT for `spack install` (default 3600: a cold
# release build on 2 cores), 600 for each other step. Each step's time is printed, and the
# summary at the end lists them.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
: "${SPACK_ROOT:?set SPACK_ROOT to a Spack checkout (git clone of spack/spack)}"
spack_bin="$SPACK_ROOT/bin/spack"
[ -x "$spack_bin" ] || { echo "test.sh: no $spack_bin" >&2; exit 2; }
install_timeout=${TIERSTACK_SPACK_TIMEOUT:-3600}
step_timeout=600

# Spack's solver: clingo, importable by the Python that runs Spack (pip install clingo).
py=${SPACK_PYTHON:-python3}
if ! "$py" -c 'import clingo' 2>/dev/null; then
    echo "test.sh: $py cannot import clingo: python3 -m venv V && V/bin/pip install clingo," \
        "then SPACK_PYTHON=V/bin/python (or let Spack bootstrap it, which needs its network)" >&2
    exit 2
fi
export SPACK_PYTHON=$py

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tierstack-spack.XXXXXX")
cleanup() {
    if [ "${TIERSTACK_SPACK_KEEP:-0}" = 1 ]; then
        echo "kept $tmp"
    else
        chmod -R u+w "$tmp" 2>/dev/null || true
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT

export SPACK_USER_CONFIG_PATH=$tmp/user
export SPACK_USER_CACHE_PATH=$tmp/cache
export SPACK_SYSTEM_CONFIG_PATH=$tmp/system
export PYTHONPYCACHEPREFIX=$tmp/pycache
unset CARGO_TARGET_DIR SPACK_ENV SPACK_DISABLE_LOCAL_CONFIG
scope=$tmp/scope
mkdir -p "$scope" "$SPACK_USER_CONFIG_PATH" "$SPACK_SYSTEM_CONFIG_PATH" "$SPACK_USER_CACHE_PATH"
# What must not change: this checkout (its ignored build folders aside: a build of your own
# may be running) and the Spack checkout, ignored files included (Spack writes its defaults
# there: etc/spack, opt/spack, var/spack/cache, when not told otherwise).
checkouts_status() {
    git -C "$repo" status --porcelain --ignored=no
    if git -C "$SPACK_ROOT" rev-parse --git-dir >/dev/null 2>&1; then
        git -C "$SPACK_ROOT" status --porcelain --ignored
    fi
}
status_before=$(checkouts_status)

summary=()
# step NAME TIMEOUT CMD...: runs CMD under `timeout`, prints and records its time.
step() {
    local name=$1 limit=$2
    shift 2
    echo
    echo "=== $name: $*"
    local t0=$SECONDS rc=0
    timeout --kill-after=30 "$limit" "$@" || rc=$?
    local dt=$((SECONDS - t0))
    summary+=("$(printf '%-28s %5d s  rc=%d' "$name" "$dt" "$rc")")
    if [ "$rc" -ne 0 ]; then
        [ "$rc" -eq 124 ] && echo "test.sh: $name ran past its $limit s" >&2
        echo "test.sh: $name failed (rc=$rc)" >&2
        printf '%s\n' "${summary[@]}" >&2
        exit 1
    fi
}
# Spack with the scope (an array: `timeout` runs programs, not shell functions).
spack=("$spack_bin" -C "$scope")

# ---- 1. the externals and the compiler ----------------------------------------------------
# tool NAME: its path, from PATH, else ~/.cargo/bin, else /usr/bin.
tool() {
    local p
    if p=$(command -v "$1"); then
        echo "$p"
    elif [ -x "$HOME/.cargo/bin/$1" ]; then
        echo "$HOME/.cargo/bin/$1"
    elif [ -x "/usr/bin/$1" ]; then
        echo "/usr/bin/$1"
    else
        echo "test.sh: no $1 found (PATH, ~/.cargo/bin, /usr/bin)" >&2
        exit 2
    fi
}
rustc=$(tool rustc)
rust_prefix=$(dirname "$(dirname "$rustc")")
[ -x "$rust_prefix/bin/cargo" ] || { echo "test.sh: no cargo beside $rustc" >&2; exit 2; }
rust_version=$("$rustc" --version | awk '{print $2}')
objcopy=$(tool objcopy)
binutils_version=$("$objcopy" --version | head -1 | awk '{print $NF}')
gmake=$(tool make)
"$gmake" --version | head -1 | grep -q '^GNU Make' || {
    echo "test.sh: $gmake is not GNU make" >&2
    exit 2
}
gmake_version=$("$gmake" --version | head -1 | awk '{print $3}')

cat >"$scope/config.yaml" <<EOF
config:
  install_tree:
    root: $tmp/opt
  build_stage:
  - $tmp/stage
  test_stage: $tmp/test-stage
  source_cache: $tmp/cache/source
  misc_cache: $tmp/cache/misc
  build_jobs: $(nproc)
EOF
cat >"$scope/packages.yaml" <<EOF
packages:
  rust:
    buildable: false
    externals:
    - spec: rust@$rust_version
      prefix: $rust_prefix
  binutils:
    buildable: false
    externals:
    - spec: binutils@$binutils_version
      prefix: $(dirname "$(dirname "$objcopy")")
  gmake:
    buildable: false
    externals:
    - spec: gmake@$gmake_version
      prefix: $(dirname "$(dirname "$gmake")")
EOF
echo "scope $scope:"
cat "$scope/config.yaml" "$scope/packages.yaml"

# A bare repository with this checkout's HEAD as `main`: what `spack install tierstack@main`
# fetches (git clone, as from the project's own repository).
head=$(git -C "$repo" rev-parse HEAD)
git init -q --bare "$tmp/src.git"
git -C "$repo" push -q "$tmp/src.git" "HEAD:refs/heads/main"
export TIERSTACK_GIT=file://$tmp/src.git
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
    echo "NOTE: the checkout has uncommitted changes: they are not built (HEAD ${head:0:12} is)"
fi

step "spack --version" "$step_timeout" "$spack_bin" --version
step "spack compiler find" "$step_timeout" "${spack[@]}" compiler find --scope user
# ---- 2. the recipe ------------------------------------------------------------------------
step "spack repo add" "$step_timeout" "${spack[@]}" repo add --scope user "$repo/contrib/spack"
step "spack info" "$step_timeout" "${spack[@]}" info tierstack
step "spack spec" "$step_timeout" "${spack[@]}" spec tierstack@main
# ---- 3. the install -----------------------------------------------------------------------
step "spack install" "$install_timeout" "${spack[@]}" install --fail-fast tierstack@main
prefix=$("${spack[@]}" location -i tierstack@main)
echo "installed in $prefix"

# ---- 4. the installed files ---------------------------------------------------------------
bin=$prefix/bin/tierstack
version=$("$bin" --version)
echo "$version"
case "$version" in
*"(git ${head:0:7}"*) ;;
*) echo "test.sh: --version does not name HEAD ${head:0:7}: $version" >&2; exit 1 ;;
esac
mkdir -p "$tmp/demo"
step "tierstack demo --only array" "$step_timeout" "$bin" demo --only array --dir "$tmp/demo"
page=$(man -M "$prefix/share/man" -w tierstack)
[ "$page" = "$prefix/share/man/man1/tierstack.1" ] || {
    echo "test.sh: man -M $prefix/share/man -w tierstack: $page" >&2
    exit 1
}
MANPAGER=cat MANWIDTH=80 man -M "$prefix/share/man" tierstack 2>/dev/null | head -n 12
MANPAGER=cat man -M "$prefix/share/man" tierstack 2>/dev/null | grep -q '^NAME' || {
    echo "test.sh: man -M $prefix/share/man tierstack shows no NAME section" >&2
    exit 1
}
for f in lib/tierstack/libtierstack_preload.so share/bash-completion/completions/tierstack \
    share/tierstack/slurm/burst_buffer.lua lib/systemd/system/tierstack@.service; do
    [ -f "$prefix/$f" ] || { echo "test.sh: $prefix/$f not installed" >&2; exit 1; }
done
step "spack test run" "$step_timeout" "${spack[@]}" test run tierstack

status_after=$(checkouts_status)
[ "$status_before" = "$status_after" ] || {
    echo "test.sh: a checkout changed during the run (tierstack's, then Spack's):" >&2
    diff <(echo "$status_before") <(echo "$status_after") >&2 || true
    exit 1
}

echo
echo "=== tierstack's Spack package: all steps passed"
spack_commit=$(git -C "$SPACK_ROOT" rev-parse --short=10 HEAD 2>/dev/null || echo 'no git')
echo "spack: $("$spack_bin" --version) ($SPACK_ROOT, $spack_commit)"
echo "externals: rust@$rust_version at $rust_prefix, binutils@$binutils_version," \
    "gmake@$gmake_version"
printf '%s\n' "${summary[@]}"
