#!/usr/bin/env bash
# Set up everything perfdiag needs on a fresh machine; idempotent and fast when already done.
#
# - A shared virtual environment with the dependencies, torch and the dev tools (~6 GB). It lives
#   outside the repository, keyed by the hash of pyproject.toml's dependencies, so every clone on
#   the machine reuses it. It never holds perfdiag itself.
# - This checkout's own small environment, `.venv` (a link to `.venv-<hash>` here): perfdiag
#   installed editable from this checkout (its C extension built here), the shared one's
#   packages added by a .pth, and its commands (pytest, mypy, ruff…). So `.venv/bin/python` runs
#   this checkout's code whatever other clones run setup.
# - Debian's chromium (headless checks of report.html), lua5.4 (Argo CD health check tests),
#   debootstrap and buildah (the image tests build the Dockerfile on a local Debian base,
#   scripts/image-base.sh), and gcc when there is no C compiler, when apt-get is available.
#
# Variables: PERFDIAG_VENV (use this venv path), PERFDIAG_PYTHON (interpreter, ≥ 3.10),
#            PERFDIAG_SKIP_APT=1 (do not install Debian packages).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
log() { echo "[setup] $*" >&2; }

python=${PERFDIAG_PYTHON:-python3}
# Python always runs isolated here (-I): the current folder, the repository root, must not be on
# sys.path, where its perfdiag/ folder (without the component folders) would be found first.
if ! "$python" -I -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  log "error: $python is missing or older than Python 3.10; set PERFDIAG_PYTHON"
  exit 1
fi

# A C compiler: installing perfdiag builds the fast Kineto reader's scanner (a C extension).
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
  if [ "${PERFDIAG_SKIP_APT:-}" != 1 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "installing Debian gcc (perfdiag builds a C extension)"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >&2
  else
    log "error: no C compiler (cc or gcc); install one: perfdiag builds a C extension"
    exit 1
  fi
fi

# Key the shared environment on what it installs (dependencies, interpreter), not on the whole file.
key=$("$python" -I - <<'PY' | sha256sum | cut -c1-12
import re, sys
text = open("pyproject.toml").read()
deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
extras = re.search(r"^\[project.optional-dependencies\](.*?)^\[", text, re.S | re.M).group(1)
print(deps, extras, sys.version)
PY
)
venv=${PERFDIAG_VENV:-$HOME/.cache/perfdiag/venv-$key}
mkdir -p "$(dirname "$venv")"

# The installed package is a tree of links to this checkout (setuptools' strict editable mode:
# the component folders map into perfdiag/, and operator/ is a namespace folder, which the
# lenient mode's import hook cannot resolve). Its folders are links to the checkout's folders
# (build_own), so only an entry added to or removed from perfdiag/ itself makes a new one.
package_entries() {
  ls -a perfdiag | grep -v '^__pycache__$'
}

# This checkout's own environment: named by the shared one and by what the install builds, so
# that a change to either makes a new one beside the old and swaps the `.venv` link to it.
own=.venv-$( (echo "$venv"; cat pyproject.toml setup.py scripts/setup.sh perfdiag/engine/kineto/_scan.c; package_entries) | sha256sum | cut -c1-12)

# The shared environment's packages: the dependencies and the dev extra, never perfdiag itself
# (a checkout's code is installed only into that checkout's environment).
requirements() {
  "$python" -I - <<'PY'
import re
text = open("pyproject.toml").read()
for name in (r"^dependencies", r"^dev"):
    block = re.search(name + r" = \[(.*?)^\]", text, re.S | re.M).group(1)
    for line in block.splitlines():
        print(*re.findall(r'^\s*"([^"]+)"', line))
PY
}

site_packages() { "$1/bin/python" -I -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

# Builds this checkout's environment in $1 (beside .venv, not yet used): a venv without pip of
# its own whose .pth adds the shared site-packages after its own, perfdiag installed editable
# into it (no dependencies; this also builds the C extension in this checkout), and the shared
# environment's commands (pytest, mypy, ruff, pip…) run by this environment's interpreter.
build_own() {
  local dir=$1 sp name src so
  rm -rf "$dir"
  "$venv/bin/python" -I -m venv --without-pip "$dir"
  sp=$(site_packages "$dir")
  echo "import site; site.addsitedir('$(site_packages "$venv")')" >"$sp/perfdiag-shared-deps.pth"
  # The build rewrites the extension in place: give running processes' mapped copy its own inode.
  for so in perfdiag/engine/kineto/_scan.*.so; do
    [ -f "$so" ] && cp -p "$so" "$so.tmp" && mv -f "$so.tmp" "$so"
  done
  # setuptools explains the strict mode at length on every install: shown only if it fails.
  if ! "$dir/bin/python" -I -m pip install --quiet --no-deps --no-build-isolation \
    --config-settings editable_mode=strict -e "$root" >"$dir.install.log" 2>&1; then
    cat "$dir.install.log" >&2
    exit 1
  fi
  rm -f "$dir.install.log"
  # setuptools links each file; each folder of the tree becomes a link to the checkout's folder
  # instead, so that a module added or moved inside one is importable at once.
  local tree sub name
  tree=$(head -n 1 "$sp"/__editable__.perfdiag-*.pth)/perfdiag
  for sub in "$tree"/*; do
    name=$(basename "$sub")
    [ -d "$sub" ] && [ "$name" != __pycache__ ] || continue
    if [ -d "perfdiag/$name" ]; then src=$root/perfdiag/$name; else src=$root/$name; fi
    [ -d "$src" ] || { log "error: no folder $src for $sub"; exit 1; }
    # No trailing slash: a link already there is replaced, never followed into the checkout.
    rm -rf "$sub" && ln -s "$src" "$sub"
  done
  # Once perfdiag is installed: the suite's support package (test kubelet, servers, synthetic
  # traces) on the path, development only; and perfdiag imported from the installed tree at
  # start-up: `python -m`/`-c` in the repository root put the root first on sys.path, where
  # perfdiag/ lacks the component folders.
  printf '%s\nimport perfdiag\n' "$root/tests/support" >"$sp/perfdiag-dev.pth"
  for src in "$venv"/bin/*; do
    name=$(basename "$src")
    case "$name" in python* | activate* | Activate.ps1 | perfdiag) continue ;; esac
    [ -e "$dir/bin/$name" ] && continue
    if [ ! -L "$src" ] && head -n 1 "$src" | grep -q "^#!$venv/bin/python"; then
      sed "1s|^#!$venv/bin/python[0-9.]*|#!$root/.venv/bin/python|" "$src" >"$dir/bin/$name"
      chmod +x "$dir/bin/$name"
    else
      ln -s "$src" "$dir/bin/$name"  # a native program (ruff) or a script of its own
    fi
  done
  # Its own scripts and activate name the stable path, .venv, not this folder.
  grep -rlI -- "$root/$dir" "$dir/bin" | xargs -r sed -i "s|$root/$dir|$root/.venv|g"
  "$dir/bin/python" -I - "$root" <<'PY'
import os, sys
import perfdiag, perfdiag.analyzer, perfdiag.engine.kineto._scan
root = sys.argv[1]
for module in (perfdiag, perfdiag.analyzer, perfdiag.engine.kineto._scan):
    if not os.path.realpath(module.__file__).startswith(root + os.sep):
        sys.exit(f"[setup] error: {module.__name__} resolves to {module.__file__}, outside {root}")
PY
  touch "$dir/.perfdiag-complete"
}

(
  flock 9
  if [ ! -f "$venv/.perfdiag-complete" ]; then
    log "creating $venv (first time on this machine: downloads torch, several minutes)"
    rm -rf "$venv"
    "$python" -I -m venv "$venv"
    "$venv/bin/pip" install --upgrade --quiet pip "setuptools>=77" wheel
    requirements >"$venv.requirements"
    "$venv/bin/pip" install --progress-bar off -r "$venv.requirements"
    rm -f "$venv.requirements"
    touch "$venv/.perfdiag-complete"
  fi

  if [ -e .venv ] && [ ! -L .venv ]; then
    log "warning: .venv is not a link made by this script; leaving it as it is"
  elif [ "$(readlink .venv 2>/dev/null)" != "$own" ] || [ ! -f "$own/.perfdiag-complete" ]; then
    log "making this checkout's environment $own (dependencies from $venv)"
    previous=$(readlink .venv 2>/dev/null || true)
    build_own "$own"
    # Swapped in by a rename, so a command running .venv/bin/... sees the old one or the new one.
    ln -sfn "$own" .venv.new && mv -T .venv.new .venv
    if ! .venv/bin/perfdiag --help >/dev/null || ! .venv/bin/pytest --version >/dev/null 2>&1; then
      [ -n "$previous" ] && ln -sfn "$previous" .venv.new && mv -T .venv.new .venv
      log "error: the new environment's commands do not run; .venv is back to ${previous:-nothing}"
      exit 1
    fi
    for old in .venv-*; do
      [ "$old" != "$own" ] && [ -d "$old" ] && rm -rf "$old"
    done
  fi

  # Environments made before each checkout had its own held perfdiag editable in the shared one,
  # pointing at whichever checkout ran setup last; the shared one keeps only the dependencies.
  if compgen -G "$(site_packages "$venv")/perfdiag-*.dist-info" >/dev/null; then
    log "removing perfdiag from the shared $venv (each checkout installs its own)"
    "$venv/bin/pip" uninstall --quiet --yes perfdiag >&2
  fi
) 9>"$venv.lock"

# Debian's tools the suite runs, installed in one apt-get call for whichever are missing:
# chromium (headless checks of report.html), lua5.4 (the Argo CD health check, docs/gitops/*.lua),
# debootstrap and buildah (the image tests build the Dockerfile on a local Debian base,
# scripts/image-base.sh; buildah's vfs storage needs no daemon), prometheus (the suite's
# Prometheus scrapes the operator in the end-to-end tests; its promtool checks the chart's rules).
debian_tools=(chromium:chromium lua5.4:lua5.4 debootstrap:debootstrap buildah:buildah prometheus:prometheus)
missing=()
for tool in "${debian_tools[@]}"; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
if [ "${PERFDIAG_SKIP_APT:-}" != 1 ] && [ "${#missing[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "installing Debian ${missing[*]} (the suite's report, Argo CD, image and monitoring tests)"
    { apt-get update -qq >&2 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        "${missing[@]}" >&2; } ||
      log "warning: could not install ${missing[*]}; the tests that run them will fail"
  else
    log "warning: ${missing[*]} missing and apt-get unavailable (need root); the tests that run them will fail"
  fi
fi
log "ready: .venv -> $own (dependencies: $venv)"
