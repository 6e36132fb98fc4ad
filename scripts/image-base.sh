#!/usr/bin/env bash
# Provide the two local base images the test suite builds the Dockerfile on, without Docker
# and without an image registry:
#
#   scripts/image-base.sh            # last two lines: PYTHON_IMAGE=<name>, BUILD_IMAGE=<name>
#
# They stand in for the Dockerfile's defaults (python:3.11-slim and python:3.11):
#   python  Debian bookworm (debootstrap --variant=minbase from Debian's package archive) with
#           Debian's Python 3.11, made the image's Python the way the official image has it:
#           a virtual environment at /usr/local (python, pip and site-packages under /usr/local,
#           /usr/local/bin first on PATH), pip from PyPI;
#   build   the same plus Debian's gcc, libc6-dev and python3-dev (the wheel builds a C
#           extension).
# Both are committed with Debian's buildah into a container storage of their own (storage
# driver vfs; no daemon): every buildah call of the suite passes the same --root/--runroot,
# printed by `scripts/image-base.sh --storage-flags`.
#
# Cache: ${PERFDIAG_IMAGE_CACHE:-$HOME/.cache/perfdiag/image}/ (outside the repository, once
#   per machine): storage/ (the container storage), .lock, .logs/. The images are tagged with a
#   key of everything that goes into them (suite, packages, pip version, this recipe's
#   revision); when both are there the script only prints their names (well under a second).
#   A cold run takes ~1-2 min (debootstrap ~40 s, the compiler ~10 s, commits). A flock on
#   .lock keeps concurrent runs from building twice.
#
# Needs root, debootstrap and buildah (scripts/setup.sh installs both from Debian) and access to
# the Debian archive (PERFDIAG_DEBIAN_MIRROR, default http://deb.debian.org/debian) and PyPI.
set -euo pipefail

# ------------------------------------------------------------------ recipe ----
SUITE=bookworm
RUNTIME_PACKAGES=python3,python3-venv,ca-certificates
BUILD_PACKAGES=(gcc libc6-dev python3-dev)
PIP_VERSION=26.3
RECIPE_REVISION=1   # bump when the steps below change what ends up in the images
MIRROR=${PERFDIAG_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${PERFDIAG_IMAGE_CACHE:-$HOME/.cache/perfdiag/image}
REPOSITORY=localhost/perfdiag-base

log() { printf '[image-base] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

storage_flags=(--root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs)
key=$(printf '%s\n' "$SUITE" "$RUNTIME_PACKAGES" "${BUILD_PACKAGES[*]}" "$PIP_VERSION" \
  "$RECIPE_REVISION" "$(uname -m)" | sha256sum | cut -c1-12)
python_image=$REPOSITORY:python-$key
build_image=$REPOSITORY:build-$key


# The CA bundle this machine trusts: the suite mounts it over the build stage's during
# `buildah bud`, so that pip reaches PyPI wherever this machine does (through a TLS-inspecting
# proxy too), without anything of the machine's ending up in an image.
host_ca_bundle() {
  local f
  for f in "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt; do
    [ -n "$f" ] && [ -f "$f" ] && { echo "$f"; return; }
  done
  die "no CA bundle found (PIP_CERT, SSL_CERT_FILE, /etc/ssl/certs/ca-certificates.crt)"
}

bah() { buildah "${storage_flags[@]}" "$@"; }
have() { bah inspect --type image "$1" >/dev/null 2>&1; }

done_already() { have "$python_image" && have "$build_image"; }

case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  --storage-flags) printf '%s\n' "${storage_flags[@]}"; exit 0 ;;
  --ca-bundle) host_ca_bundle; exit 0 ;;
  --names) printf 'PYTHON_IMAGE=%s\nBUILD_IMAGE=%s\n' "$python_image" "$build_image"; exit 0 ;;
  '') ;;
  *) die "unknown option $1 (see --help)" ;;
esac

if ! done_already; then
  [ "$(id -u)" = 0 ] || die "building the base images needs root (debootstrap, chroot)"
  command -v debootstrap >/dev/null || die "debootstrap missing: scripts/setup.sh installs it"
  command -v buildah >/dev/null || die "buildah missing: scripts/setup.sh installs it"
  mkdir -p "$CACHE/.logs"
  exec 9>"$CACHE/.lock"
  flock 9
fi

# A root filesystem tree → an image (the tree's files as one layer, plus the image config).
commit_tree() { # tree image
  local tree=$1 image=$2 ctr mnt
  ctr=$(bah from scratch)
  mnt=$(bah mount "$ctr")
  cp -a "$tree/." "$mnt/"
  bah umount "$ctr" >/dev/null
  bah config --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$ctr"
  bah commit --quiet --rm "$ctr" "$image" >/dev/null
}

# What an image should not carry from the build of its tree.
clean_tree() { # tree
  local tree=$1
  rm -rf "$tree"/var/cache/apt/archives/*.deb "$tree"/var/lib/apt/lists/* \
    "$tree"/var/cache/debconf/*-old "$tree"/var/log/*.log "$tree"/root/.cache \
    "$tree"/dev/* "$tree"/tmp/* "$tree"/run/*
  : >"$tree/etc/resolv.conf"  # the engine provides it at run time
  find "$tree/usr" -name __pycache__ -type d -prune -exec rm -rf {} +
}

if ! done_already; then
  started=$(date +%s)
  work=$CACHE/tmp-$$
  rm -rf "$CACHE"/tmp-*
  mkdir -p "$work"
  trap 'rm -rf "$work"' EXIT
  log "making the base images $python_image and $build_image (once per machine, ~1-2 min)"
  log "debootstrap --variant=minbase $SUITE from $MIRROR (log: $CACHE/.logs/debootstrap.log)"
  debootstrap --variant=minbase --include="$RUNTIME_PACKAGES" "$SUITE" "$work/python" "$MIRROR" \
    >"$CACHE/.logs/debootstrap.log" 2>&1 || die "debootstrap failed: see $CACHE/.logs/debootstrap.log"
  # The image's Python at /usr/local, as in the official python images: `python` and `pip` on
  # PATH, pip installing into /usr/local/lib/python3.11/site-packages (Debian's own Python
  # refuses `pip install` outside a virtual environment, PEP 668).
  chroot "$work/python" /usr/bin/python3 -m venv /usr/local
  # pip trusts what this machine trusts (a proxy's CA may be among it), for this call only.
  cp "$(host_ca_bundle)" "$work/python/tmp/host-ca.crt"
  chroot "$work/python" /usr/bin/env REQUESTS_CA_BUNDLE=/tmp/host-ca.crt \
    /usr/local/bin/pip install --quiet --no-cache-dir "pip==$PIP_VERSION" \
    >"$CACHE/.logs/pip.log" 2>&1 || die "pip from PyPI failed: see $CACHE/.logs/pip.log"
  cp -a "$work/python" "$work/build"
  clean_tree "$work/python"
  commit_tree "$work/python" "$python_image"
  log "the compiler: apt-get install ${BUILD_PACKAGES[*]} (log: $CACHE/.logs/apt.log)"
  chroot "$work/build" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends ${BUILD_PACKAGES[*]}" \
    >"$CACHE/.logs/apt.log" 2>&1 || die "apt-get in the build tree failed: see $CACHE/.logs/apt.log"
  clean_tree "$work/build"
  commit_tree "$work/build" "$build_image"
  log "done in $(($(date +%s) - started)) s"
fi
printf 'PYTHON_IMAGE=%s\nBUILD_IMAGE=%s\n' "$python_image" "$build_image"
