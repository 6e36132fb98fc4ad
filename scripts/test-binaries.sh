#!/usr/bin/env bash
# Provide pinned test binaries (etcd, kube-apiserver, kubectl, minio, helm,
# kubeconform) in a cache directory OUTSIDE the repository.
#
#   BIN=$(scripts/test-binaries.sh | tail -1)
#
# The last line of stdout is the absolute directory holding all six binaries;
# all progress goes to stderr.
#
# Cache: ${PERFDIAG_BIN_CACHE:-$HOME/.cache/perfdiag/bin}/<version-tag>/
#   The version tag encodes every pin below plus the host platform.  When all
#   six binaries are present and report the pinned version, the script only
#   prints the directory (well under a second: a binary's `--version` check
#   is remembered in <version-tag>/.<binary>.ok and only re-run when the
#   binary is newer than that stamp, or always with PERFDIAG_BIN_VERIFY=1).
#
# Where the binaries come from, per binary, first match wins:
#   1. PERFDIAG_ETCD, PERFDIAG_KUBE_APISERVER, PERFDIAG_KUBECTL, PERFDIAG_MINIO,
#      PERFDIAG_HELM, PERFDIAG_KUBECONFORM: path (or command name) of an
#      existing binary.
#   2. KUBEBUILDER_ASSETS: a directory that may contain etcd, kube-apiserver
#      and kubectl (e.g. from `setup-envtest use -p path`).
#   3. A build from source through the Go module proxy (needs `go`; a cold
#      build of all six takes ~20-40 min on 2 cores, mostly kube-apiserver,
#      minio and helm; later pin bumps reuse Go's build cache).
# Binaries from 1./2. are never copied into the pinned directory: when any
# are in effect, the printed directory is a sibling
# "<version-tag>+overrides-<hash>" of symlinks (overrides + pinned builds).
#
# Builds run one binary at a time (go build -p <nproc>, override with
# PERFDIAG_BUILD_JOBS) in a temporary directory under the cache root; each
# finished and verified binary is renamed into place, so an interrupted run
# never leaves a directory that looks complete and a re-run resumes with the
# binaries still missing.  A flock on <cache root>/.lock keeps concurrent
# invocations from building twice.  Build logs: <cache root>/.logs/<binary>.log
# Go's module and build caches stay at their usual places (go env GOMODCACHE
# GOCACHE).
set -euo pipefail

# ----------------------------------------------------------------- pins ----
K8S_VERSION=v1.37.1        # kube-apiserver + kubectl (k8s.io/kubernetes)
ETCD_VERSION=v3.7.3        # go.etcd.io/etcd/server/v3
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c   # github.com/minio/minio (final commit; repo archived, no semver tags)
HELM_VERSION=v4.3.1        # helm.sh/helm/v4
KUBECONFORM_VERSION=v0.8.0 # github.com/yannh/kubeconform

BINARIES=(etcd kube-apiserver kubectl minio helm kubeconform)

# ----------------------------------------------------------- helpers ------
log() { printf '[test-binaries] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

fmt_dur() { # seconds -> 1h2m3s / 4m5s / 6s
  local s=$1
  if ((s >= 3600)); then printf '%dh%dm%ds' $((s / 3600)) $((s % 3600 / 60)) $((s % 60))
  elif ((s >= 60)); then printf '%dm%ds' $((s / 60)) $((s % 60))
  else printf '%ds' "$s"; fi
}

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
  cat <<EOF

Options:
  -h, --help      this text
  --versions      print the pinned versions and the version tag, then exit
  --check         print the directory if every binary is there and exit 0; exit 1 (building
                  nothing) if one is missing
EOF
}

# Derived pieces of the pins.
K8S_MINOR=${K8S_VERSION#v1.}; K8S_MINOR=${K8S_MINOR%%.*}
K8S_STAGING_VERSION=v0.${K8S_VERSION#v1.}          # v1.36.3 -> v0.36.3
HELM_MODULE=helm.sh/helm/${HELM_VERSION%%.*}       # helm.sh/helm/v4
if [[ $MINIO_VERSION =~ ^v0\.0\.0-([0-9]{14})-([0-9a-f]{12})$ ]]; then
  MINIO_TS=${BASH_REMATCH[1]} MINIO_COMMIT=${BASH_REMATCH[2]}
  MINIO_TAGPART=${MINIO_TS}-${MINIO_COMMIT}
else
  MINIO_TS='' MINIO_COMMIT='' MINIO_TAGPART=$MINIO_VERSION
fi

case "$(uname -s)" in Linux) OS=linux ;; Darwin) OS=darwin ;; *) OS=$(uname -s | tr '[:upper:]' '[:lower:]') ;; esac
case "$(uname -m)" in x86_64 | amd64) ARCH=amd64 ;; aarch64 | arm64) ARCH=arm64 ;; *) ARCH=$(uname -m) ;; esac

TAG="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_minio-${MINIO_TAGPART}_helm-${HELM_VERSION}_kubeconform-${KUBECONFORM_VERSION}_${OS}-${ARCH}"

case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  --versions)
    printf '%s %s\n' kubernetes "$K8S_VERSION" etcd "$ETCD_VERSION" minio "$MINIO_VERSION" \
      helm "$HELM_VERSION" kubeconform "$KUBECONFORM_VERSION" tag "$TAG"
    exit 0 ;;
  --check) CHECK_ONLY=1 ;;
  '') ;;
  *) usage >&2; exit 2 ;;
esac

ROOT=${PERFDIAG_BIN_CACHE:-${HOME:?HOME is not set}/.cache/perfdiag/bin}
mkdir -p "$ROOT" || die "cannot create cache root $ROOT"
ROOT=$(cd "$ROOT" && pwd -P)
BASE=$ROOT/$TAG

env_var_for() {
  case $1 in
    etcd) echo PERFDIAG_ETCD ;; kube-apiserver) echo PERFDIAG_KUBE_APISERVER ;;
    kubectl) echo PERFDIAG_KUBECTL ;; minio) echo PERFDIAG_MINIO ;;
    helm) echo PERFDIAG_HELM ;; kubeconform) echo PERFDIAG_KUBECONFORM ;;
  esac
}

pinned_version() {
  case $1 in
    etcd) echo "$ETCD_VERSION" ;; kube-apiserver | kubectl) echo "$K8S_VERSION" ;;
    minio) echo "$MINIO_VERSION" ;; helm) echo "$HELM_VERSION" ;; kubeconform) echo "$KUBECONFORM_VERSION" ;;
  esac
}

# Text the version output of a pinned build must contain.
expected_version_text() {
  case $1 in
    etcd) echo "etcd Version: ${ETCD_VERSION#v}" ;;
    kube-apiserver) echo "Kubernetes ${K8S_VERSION}" ;;
    kubectl) echo "Client Version: ${K8S_VERSION}" ;;
    minio) echo "${MINIO_COMMIT:-$MINIO_VERSION}" ;;
    helm) echo "Version:\"${HELM_VERSION}\"" ;;
    kubeconform) echo "${KUBECONFORM_VERSION}" ;;
  esac
}

if command -v timeout >/dev/null 2>&1; then TIMEOUT=(timeout 30); else TIMEOUT=(); fi

version_output() { # bin path -> prints version output, returns its status
  local bin=$1 path=$2
  case $bin in
    etcd | kube-apiserver | minio) "${TIMEOUT[@]}" "$path" --version ;;
    kubectl) "${TIMEOUT[@]}" "$path" version --client ;;
    helm) HELM_CONFIG_HOME=/nonexistent HELM_CACHE_HOME=/nonexistent HELM_DATA_HOME=/nonexistent \
      "${TIMEOUT[@]}" "$path" version ;;
    kubeconform) "${TIMEOUT[@]}" "$path" -v ;;
  esac </dev/null 2>&1
}

# Pinned build present and reporting the pinned version?
check_pinned() { # bin path
  local out
  [[ -f $2 && -x $2 ]] || return 1
  out=$(version_output "$1" "$2") || return 1
  [[ $out == *"$(expected_version_text "$1")"* ]]
}

# A pinned binary that passed check_pinned and has not changed since.
stamp_fresh() { # bin
  local b=$BASE/$1 st=$BASE/.$1.ok
  [[ ${PERFDIAG_BIN_VERIFY:-0} != 1 && -f $st && -f $b && -x $b && ! $b -nt $st ]]
}
stamp() { touch "$BASE/.$1.ok" 2>/dev/null || true; }

# ------------------------------------------------------- overrides --------
declare -A OVERRIDE=()
for bin in "${BINARIES[@]}"; do
  var=$(env_var_for "$bin")
  val=${!var:-}
  if [[ -n $val ]]; then
    if [[ $val != */* ]]; then
      resolved=$(command -v -- "$val" 2>/dev/null) ||
        die "$var=$val: no such command on PATH (set it to the path of a working $bin binary, or unset it to build $bin $(pinned_version "$bin") from source)"
      val=$resolved
    fi
    [[ -f $val && -x $val ]] ||
      die "$var=$val is not an executable file (set it to the path of a working $bin binary, or unset it to build $bin $(pinned_version "$bin") from source)"
    [[ $val == /* ]] || val=$(cd "$(dirname -- "$val")" && pwd -P)/$(basename -- "$val")
    OVERRIDE[$bin]=$val
  fi
done
if [[ -n ${KUBEBUILDER_ASSETS:-} ]]; then
  if [[ -d $KUBEBUILDER_ASSETS ]]; then
    kba=$(cd "$KUBEBUILDER_ASSETS" && pwd -P)
    for bin in etcd kube-apiserver kubectl; do
      if [[ -z ${OVERRIDE[$bin]:-} && -f $kba/$bin && -x $kba/$bin ]]; then OVERRIDE[$bin]=$kba/$bin; fi
    done
  else
    log "warning: KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS is not a directory; ignoring it"
  fi
fi

if ((${#OVERRIDE[@]})); then
  hash_input=''
  for bin in "${BINARIES[@]}"; do
    if [[ -n ${OVERRIDE[$bin]:-} ]]; then hash_input+="$bin=${OVERRIDE[$bin]}"$'\n'; fi
  done
  if command -v sha256sum >/dev/null 2>&1; then h=$(printf '%s' "$hash_input" | sha256sum)
  elif command -v shasum >/dev/null 2>&1; then h=$(printf '%s' "$hash_input" | shasum -a 256)
  else h=$(printf '%s' "$hash_input" | cksum); fi
  OUT=$ROOT/$TAG+overrides-${h:0:12}
else
  OUT=$BASE
fi

# ----------------------------------------------------- fast path ----------
# Check every binary in parallel; collect the pinned ones that must be built.
declare -A PIDS=()
for bin in "${BINARIES[@]}"; do
  if [[ -n ${OVERRIDE[$bin]:-} ]]; then
    (
      out=$(version_output "$bin" "${OVERRIDE[$bin]}") ||
        { log "ERROR: override $bin=${OVERRIDE[$bin]} does not run ('$bin' version check failed):"; printf '%s\n' "$out" | tail -5 >&2; exit 1; }
      [[ $out == *"$(pinned_version "$bin")"* || $out == *"$(expected_version_text "$bin")"* ]] ||
        log "note: using $bin from ${OVERRIDE[$bin]} ($(printf '%s' "$out" | head -1)); pinned is $(pinned_version "$bin")"
      exit 0
    ) &
  elif stamp_fresh "$bin"; then
    continue
  else
    check_pinned "$bin" "$BASE/$bin" &
  fi
  PIDS[$bin]=$!
done
MISSING=()
for bin in "${BINARIES[@]}"; do
  [[ -n ${PIDS[$bin]:-} ]] || continue
  if wait "${PIDS[$bin]}"; then
    [[ -n ${OVERRIDE[$bin]:-} ]] || stamp "$bin"
  else
    if [[ -n ${OVERRIDE[$bin]:-} ]]; then
      die "the binary given for $bin (${OVERRIDE[$bin]}) does not work; fix or unset $(env_var_for "$bin")${KUBEBUILDER_ASSETS:+ / KUBEBUILDER_ASSETS}"
    fi
    MISSING+=("$bin")
  fi
done

link_overlay() { # populate $OUT (only when overrides are in effect)
  [[ $OUT != "$BASE" ]] || return 0
  mkdir -p "$OUT"
  local bin target cur
  for bin in "${BINARIES[@]}"; do
    target=${OVERRIDE[$bin]:-$BASE/$bin}
    cur=$(readlink -- "$OUT/$bin" 2>/dev/null || true)
    [[ $cur == "$target" ]] && continue
    ln -sfn -- "$target" "$OUT/.$bin.tmp.$$"
    mv -f -- "$OUT/.$bin.tmp.$$" "$OUT/$bin"
  done
}

if ((${#MISSING[@]} == 0)); then
  link_overlay
  printf '%s\n' "$OUT"
  exit 0
fi

# ---------------------------------------------------------- slow path -----
if [[ ${CHECK_ONLY:-} == 1 ]]; then
  log "not built yet: ${MISSING[*]}"
  exit 1
fi

how_to_provide() {
  local bin=$1 var
  var=$(env_var_for "$bin")
  case $bin in
    etcd | kube-apiserver | kubectl)
      echo "provide it by hand with $var=/path/to/$bin, or KUBEBUILDER_ASSETS=<dir containing etcd, kube-apiserver, kubectl> (e.g. from setup-envtest), and re-run" ;;
    *) echo "provide it by hand with $var=/path/to/$bin and re-run" ;;
  esac
}

if ! command -v go >/dev/null 2>&1; then
  for bin in "${MISSING[@]}"; do log "  missing: $bin $(pinned_version "$bin") -> $(how_to_provide "$bin")"; done
  die "'go' is not on PATH, so ${MISSING[*]} cannot be built from source (see above)"
fi

LOCKFILE=$ROOT/.lock
if command -v flock >/dev/null 2>&1; then
  exec 9>"$LOCKFILE"
  if ! flock -n 9; then
    log "another test-binaries.sh run holds $LOCKFILE (probably building); waiting for it..."
    flock 9
  fi
  # Re-check: the other run may have built what we need.
  STILL=()
  for bin in "${MISSING[@]}"; do
    if check_pinned "$bin" "$BASE/$bin"; then stamp "$bin"; else STILL+=("$bin"); fi
  done
  MISSING=("${STILL[@]+"${STILL[@]}"}")
  if ((${#MISSING[@]} == 0)); then
    link_overlay
    printf '%s\n' "$OUT"
    exit 0
  fi
  # We hold the lock: leftovers of interrupted runs are garbage.
  chmod -R u+w "$ROOT"/.tmp.* 2>/dev/null || true
  rm -rf "$ROOT"/.tmp.* 2>/dev/null || true
else
  log "warning: flock(1) not found; not locking against concurrent runs"
fi

mkdir -p "$BASE" "$ROOT/.logs"
WORK=$(mktemp -d "$ROOT/.tmp.XXXXXX")
BUILD_PID=''
kill_tree() { # pid: kill a build we started, children first
  local c
  for c in $( (pgrep -P "$1" || ps -o pid= --ppid "$1") 2>/dev/null); do kill_tree "$c"; done
  kill "$1" 2>/dev/null || true
}
cleanup() {
  if [[ -n $BUILD_PID ]] && kill -0 "$BUILD_PID" 2>/dev/null; then
    kill_tree "$BUILD_PID"
    wait "$BUILD_PID" 2>/dev/null || true
  fi
  # Module-cache style read-only dirs are never created here, but be safe.
  chmod -R u+w "$WORK" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM
mkdir -p "$WORK/out"

JOBS=${PERFDIAG_BUILD_JOBS:-$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}
# Build for this host, statically, from the module proxy, ignoring any
# go.work / GOFLAGS / cross-compilation settings of the caller.
export CGO_ENABLED=0 GOWORK=off GO111MODULE=on GOFLAGS=-buildvcs=false
unset GOOS GOARCH GOARM GO386 GOMIPS GOPPC64 2>/dev/null || true
GOBUILD=(go build -mod=mod -p "$JOBS" -trimpath)
GOINSTALL=(go install -p "$JOBS" -trimpath)

# Run a command in the background with its output in a log file, printing a
# heartbeat every minute. Sets BUILD_RC.
run_logged() { # logfile description cmd...
  local logf=$1 what=$2 t0 last now
  shift 2
  printf '+ %s\n' "$*" >>"$logf"
  "$@" >>"$logf" 2>&1 &
  BUILD_PID=$!
  t0=$(date +%s); last=$t0
  while kill -0 "$BUILD_PID" 2>/dev/null; do
    sleep 1
    now=$(date +%s)
    if ((now - last >= 60)); then
      log "  ... still building $what ($(fmt_dur $((now - t0))) elapsed)"
      last=$now
    fi
  done
  BUILD_RC=0
  wait "$BUILD_PID" || BUILD_RC=$?
  BUILD_PID=''
  return 0
}

# Create a throwaway main module in $1 that depends on the given module.
new_wrapper() { # dir
  mkdir -p "$1"
  printf 'module perfdiag.invalid/testbinaries\n' >"$1/go.mod"
}

# Copy the `godebug` settings of a dependency's go.mod into the wrapper, so
# the binary gets the runtime defaults upstream builds get.
copy_godebug() { # upstream-go.mod
  local kv
  while read -r kv; do
    if [[ -n $kv ]]; then go mod edit -godebug="$kv" || return 1; fi
  done < <(awk '
    /^godebug[ \t]*\(/ { inblk = 1; next }
    inblk && /^\)/ { inblk = 0; next }
    inblk { sub(/\/\/.*/, ""); if (NF) print $1; next }
    /^godebug[ \t]/ { sub(/\/\/.*/, ""); print $2 }' "$1")
}

prepare_k8s() { # -> $WORK/k8s wrapper module (shared by kube-apiserver and kubectl)
  local d=$WORK/k8s gomod godir staging=0 line lhs rhs lpath lver rpath rver
  [[ -f $d/.ready ]] && return 0
  new_wrapper "$d"
  cd "$d" || return 1
  # k8s.io/kubernetes replaces its staging modules (k8s.io/api, ...) with
  # ./staging/src/... paths, which do not exist in the module proxy's copy.
  # Read its go.mod and point each such replacement at the published
  # k8s.io/<name> v0.<minor>.<patch> module instead.
  gomod=$(go list -m -f '{{.GoMod}}' "k8s.io/kubernetes@$K8S_VERSION") || return 1
  [[ -f $gomod ]] || { echo "cannot read go.mod of k8s.io/kubernetes@$K8S_VERSION" >&2; return 1; }
  godir=$(awk '$1 == "go" { print $2; exit }' "$gomod")
  go mod edit -go="$godir" -require="k8s.io/kubernetes@$K8S_VERSION" || return 1
  copy_godebug "$gomod" || return 1
  while IFS= read -r line; do
    lhs=${line%%=>*} rhs=${line#*=>}
    read -r lpath _ <<<"$lhs"
    read -r rpath rver <<<"$rhs"
    if [[ $rpath == ./* || $rpath == ../* ]]; then
      if [[ $rpath == "./staging/src/$lpath" ]]; then
        go mod edit -replace="$lpath=$lpath@$K8S_STAGING_VERSION" || return 1
        staging=$((staging + 1))
      else
        echo "unexpected local replace in k8s.io/kubernetes go.mod: $line" >&2
        return 1
      fi
    else
      read -r lpath lver <<<"$lhs"
      go mod edit -replace="$lpath${lver:+@$lver}=$rpath${rver:+@$rver}" || return 1
    fi
  done < <(awk '
    /^replace[ \t]*\(/ { inblk = 1; next }
    inblk && /^\)/ { inblk = 0; next }
    inblk && /=>/ { sub(/\/\/.*/, ""); print; next }
    /^replace[ \t].*=>/ { sub(/^replace[ \t]+/, ""); sub(/\/\/.*/, ""); print }' "$gomod" |
    sed -E 's/^[[:space:]]+//; s/[[:space:]]+$//; s/[[:space:]]+=>[[:space:]]+/ => /')
  ((staging > 0)) || { echo "found no staging replace directives in k8s.io/kubernetes@$K8S_VERSION go.mod" >&2; return 1; }
  echo "wrapper module replaces $staging staging modules with @$K8S_STAGING_VERSION" >&2
  go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION" || return 1
  touch .ready
}

k8s_ldflags() {
  local date kv pkg
  date=$(go list -m -f '{{with .Time}}{{.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' "k8s.io/kubernetes@$K8S_VERSION" 2>/dev/null || true)
  printf '%s' "-s -w"
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    for kv in "gitVersion=$K8S_VERSION" "gitMajor=1" "gitMinor=$K8S_MINOR" "gitTreeState=clean" ${date:+"buildDate=$date"}; do
      printf ' -X %s.%s' "$pkg" "$kv"
    done
  done
}

build_k8s_cmd() { # name outdir
  prepare_k8s || return 1
  cd "$WORK/k8s"
  # Same build tags as upstream's hack/lib/golang.sh for release binaries.
  "${GOBUILD[@]}" -tags selinux,notest,grpcnotrace -ldflags "$(k8s_ldflags)" -o "$2/$1" "k8s.io/kubernetes/cmd/$1"
}

build_etcd() { # outdir
  local d=$WORK/etcd gomod
  new_wrapper "$d"
  cd "$d"
  # The etcd binary's main package lives in the (unpublished) root module of
  # the etcd repo and is a one-liner around server/v3/etcdmain.Main.
  gomod=$(go list -m -f '{{.GoMod}}' "go.etcd.io/etcd/server/v3@$ETCD_VERSION") || return 1
  go mod edit -go="$(awk '$1 == "go" { print $2; exit }' "$gomod")" -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  cat >main.go <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  go get "go.etcd.io/etcd/server/v3/etcdmain@$ETCD_VERSION" || return 1
  "${GOBUILD[@]}" -ldflags "-s -w" -o "$1/etcd" .
}

build_minio() { # outdir
  local ld="-s -w"
  if [[ -n $MINIO_TS ]]; then
    local t=$MINIO_TS
    local rfc="${t:0:4}-${t:4:2}-${t:6:2}T${t:8:2}:${t:10:2}:${t:12:2}Z"
    local p=github.com/minio/minio/cmd
    # What minio's buildscripts/gen-ldflags.go sets for a non-release build.
    ld+=" -X $p.Version=$rfc -X $p.ReleaseTag=DEVELOPMENT.${rfc//:/-} -X $p.CopyrightYear=${t:0:4}"
    ld+=" -X $p.CommitID=$MINIO_COMMIT -X $p.ShortCommitID=$MINIO_COMMIT"
  fi
  cd "$WORK"
  GOBIN=$1 "${GOINSTALL[@]}" -tags kqueue -ldflags "$ld" "github.com/minio/minio@$MINIO_VERSION"
}

build_helm() { # outdir
  cd "$WORK"
  GOBIN=$1 "${GOINSTALL[@]}" -ldflags "-s -w -X $HELM_MODULE/internal/version.version=$HELM_VERSION" \
    "$HELM_MODULE/cmd/helm@$HELM_VERSION"
}

build_kubeconform() { # outdir
  cd "$WORK"
  GOBIN=$1 "${GOINSTALL[@]}" -ldflags "-s -w -X main.version=$KUBECONFORM_VERSION" \
    "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
}

build_one() { # bin outdir
  case $1 in
    etcd) build_etcd "$2" ;;
    kube-apiserver | kubectl) build_k8s_cmd "$1" "$2" ;;
    minio) build_minio "$2" ;;
    helm) build_helm "$2" ;;
    kubeconform) build_kubeconform "$2" ;;
  esac
}

hint() { # rough cold-build durations on 2 cores
  case $1 in
    kube-apiserver | minio | helm) echo " (cold build, this takes several minutes)" ;;
    etcd) echo " (cold build, about a minute or two)" ;;
    *) echo "" ;;
  esac
}

log "cache: $BASE"
log "to build: ${MISSING[*]} (go $(go env GOVERSION), -p $JOBS; logs in $ROOT/.logs/)"
log "a cold build of all six takes ~20-40 min on 2 cores; to skip, provide prebuilt binaries via PERFDIAG_<NAME> / KUBEBUILDER_ASSETS (see --help)"
T_ALL=$(date +%s)
FAILED=()
declare -A TOOK=()
for bin in "${BINARIES[@]}"; do
  [[ " ${MISSING[*]} " == *" $bin "* ]] || continue
  logf=$ROOT/.logs/$bin.log
  : >"$logf"
  log "building $bin $(pinned_version "$bin")$(hint "$bin")..."
  t0=$(date +%s)
  run_logged "$logf" "$bin" build_one "$bin" "$WORK/out"
  cd "$ROOT"
  dt=$(($(date +%s) - t0))
  if ((BUILD_RC != 0)) || [[ ! -x $WORK/out/$bin ]]; then
    log "FAILED to build $bin $(pinned_version "$bin") after $(fmt_dur "$dt") (exit $BUILD_RC); last lines of $logf:"
    tail -n 25 "$logf" | sed 's/^/    /' >&2
    log "  -> $(how_to_provide "$bin")"
    FAILED+=("$bin")
    continue
  fi
  if ! check_pinned "$bin" "$WORK/out/$bin"; then
    log "FAILED: freshly built $bin does not report version $(pinned_version "$bin"); its output:"
    version_output "$bin" "$WORK/out/$bin" | head -5 | sed 's/^/    /' >&2 || true
    log "  -> $(how_to_provide "$bin")"
    FAILED+=("$bin")
    continue
  fi
  chmod 0755 "$WORK/out/$bin"
  rm -f "$BASE/.$bin.ok"
  mv -f "$WORK/out/$bin" "$BASE/$bin" # same filesystem: atomic
  stamp "$bin"
  TOOK[$bin]=$dt
  log "built $bin $(pinned_version "$bin") in $(fmt_dur "$dt")"
done

if ((${#TOOK[@]})); then
  summary=''
  for bin in "${BINARIES[@]}"; do
    if [[ -n ${TOOK[$bin]:-} ]]; then summary+=" $bin=$(fmt_dur "${TOOK[$bin]}")"; fi
  done
  log "build times:$summary; total $(fmt_dur $(($(date +%s) - T_ALL)))"
fi
if ((${#FAILED[@]})); then
  die "could not build: ${FAILED[*]} (see messages above; logs in $ROOT/.logs/)"
fi

link_overlay
printf '%s\n' "$OUT"
