#!/usr/bin/env bash
# Set up everything perfdiag needs on a fresh machine; idempotent and fast when already done.
#
# - A virtual environment with perfdiag (editable), torch and the dev tools. It lives outside
#   the repository, keyed by the hash of pyproject.toml, so fresh clones on the same machine
#   reuse it (torch and its libraries are ~6 GB); `.venv` in the repository links to it.
# - Debian's chromium (headless checks of report.html) and lua5.4 (Argo CD health check
#   tests), and gcc when there is no C compiler, when apt-get is available.
#
# Variables: PERFDIAG_VENV (use this venv path), PERFDIAG_PYTHON (interpreter, ≥ 3.10),
#            PERFDIAG_SKIP_APT=1 (do not install Debian packages).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
log() { echo "[setup] $*" >&2; }

python=${PERFDIAG_PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
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

# Key the environment on what it installs (dependencies, interpreter), not on the whole file.
key=$("$python" - <<'PY' | sha256sum | cut -c1-12
import re, sys
text = open("pyproject.toml").read()
deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
extras = re.search(r"^\[project.optional-dependencies\](.*?)^\[", text, re.S | re.M).group(1)
print(deps, extras, sys.version)
PY
)
venv=${PERFDIAG_VENV:-$HOME/.cache/perfdiag/venv-$key}
mkdir -p "$(dirname "$venv")"

(
  flock 9
  if [ ! -f "$venv/.perfdiag-complete" ]; then
    log "creating $venv (first time on this machine: downloads torch, several minutes)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --upgrade --quiet pip setuptools wheel
    "$venv/bin/pip" install --progress-bar off -e "$root[dev]"
    touch "$venv/.perfdiag-complete"
  else
    # Reuse the environment; point the editable install at this checkout.
    "$venv/bin/pip" install --quiet --no-deps --no-build-isolation -e "$root"
  fi
) 9>"$venv.lock"

if [ -L .venv ] || [ ! -e .venv ]; then
  ln -sfn "$venv" .venv
fi

if [ "${PERFDIAG_SKIP_APT:-}" != 1 ] && ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "installing Debian chromium (headless report checks)"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2 \
      || log "warning: could not install chromium; report rendering tests will fail"
  else
    log "warning: chromium missing and apt-get unavailable (need root); report rendering tests will fail"
  fi
fi
# Debian's Lua 5.4: tests/gitops runs the Argo CD health check (docs/gitops/*.lua) with it.
if [ "${PERFDIAG_SKIP_APT:-}" != 1 ] && ! command -v lua5.4 >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "installing Debian lua5.4 (Argo CD health check tests)"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lua5.4 >&2 \
      || log "warning: could not install lua5.4; the Argo CD health check tests will fail"
  else
    log "warning: lua5.4 missing and apt-get unavailable (need root); Argo CD health check tests will fail"
  fi
fi
log "ready: $venv"
