#!/usr/bin/env bash
# Run the whole test suite (called by `make test`, which .ci/run calls).
# Cluster tests need etcd, kube-apiserver, kubectl, minio, helm and kubeconform: they are built
# once per machine by scripts/test-binaries.sh into ~/.cache/perfdiag/bin (see tests/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# Up to date first (scripts/setup.sh: nothing is done when nothing changed).
scripts/setup.sh
if [ -x scripts/test-binaries.sh ] && [ "${PERFDIAG_SKIP_CLUSTER_TESTS:-}" != 1 ]; then
  PERFDIAG_BIN_DIR=$(scripts/test-binaries.sh | tail -n 1)
  export PERFDIAG_BIN_DIR
fi
exec .venv/bin/pytest "$@"
