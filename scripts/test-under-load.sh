#!/usr/bin/env bash
# The test command (.ci/run) N times in a row (default 2) beside a CPU hog, one busy process per
# core, in a fresh clone of this checkout's HEAD with ../shared beside it. A test that passes
# only on a quiet machine waits for a guess instead of its condition (tests/README.md).
#
#     scripts/test-under-load.sh [N]      # ~30 min a run on 2 cores; logs in the printed folder
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${1:-2}
WORK=$(mktemp -d /tmp/perfdiag-under-load.XXXX)
git clone -q "$ROOT" "$WORK/x" || exit 1
ln -s "$(cd "$ROOT/../shared" && pwd)" "$WORK/shared"
hogs=()
for _ in $(seq "$(nproc)"); do python3 -c 'while True: pass' & hogs+=($!); done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
echo "$(git -C "$WORK/x" log --oneline -1); beside ${#hogs[@]} busy processes; logs in $WORK"
rc=0
for n in $(seq "$RUNS"); do
  echo "== run $n/$RUNS at $(date +%T), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd "$WORK/x" && .ci/run) >"$WORK/run$n.log" 2>&1
  status=$?
  echo "   exit $status: $(grep -E '^=+ .* in [0-9.]+s' "$WORK/run$n.log" | tail -1)"
  [ "$status" = 0 ] || rc=$status
done
exit "$rc"
