#!/usr/bin/env bash
# `make test`, which .ci/run calls: set-up, lint, types and every test.
#
# On a machine that has not built the pinned test binaries yet (scripts/test-binaries.sh: etcd,
# kube-apiserver, kubectl, minio, helm, kubeconform from source, the longest part of a cold run),
# their build starts first, in the background, and goes on beside the Python set-up, lint, types
# and the tests that do not need them (pytest -m "not binaries"); the tests that do (-m binaries)
# run once it is done. With the binaries there it is one pytest session (scripts/run-tests.sh).
# Each session ends with its 20 slowest tests.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[test] $*" >&2; }

build_pid=''
stop_build() {
  [ -n "$build_pid" ] && kill -0 "$build_pid" 2>/dev/null && kill "$build_pid" 2>/dev/null
  return 0
}
trap stop_build EXIT

if [ "${PERFDIAG_SKIP_CLUSTER_TESTS:-}" != 1 ] && ! scripts/test-binaries.sh --check >/dev/null 2>&1; then
  build_log=$(mktemp -t perfdiag-test-binaries.XXXXXX)
  log "building the test binaries in the background (log: $build_log)"
  scripts/test-binaries.sh >"$build_log.dir" 2>"$build_log" &
  build_pid=$!
fi

scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
scripts/typecheck.sh

if [ -z "$build_pid" ]; then
  scripts/run-tests.sh --durations=20
  exit
fi

status=0
.venv/bin/pytest --durations=20 -m "not binaries" || status=$?
log "waiting for the test binaries (log: $build_log)"
if ! wait "$build_pid"; then
  build_pid=''
  tail -n 40 "$build_log" >&2
  log "error: building the test binaries failed"
  exit 1
fi
build_pid=''
PERFDIAG_BIN_DIR=$(tail -n 1 "$build_log.dir")
export PERFDIAG_BIN_DIR
.venv/bin/pytest --durations=20 -m binaries || status=$?
exit "$status"
