#!/usr/bin/env bash
# perfdiag's CUDA side on a GPU machine, in one call: live capture of CUDA faults through
# `perfdiag run`, the NVML sampler, window and dormant-hook overheads on a CUDA model, and the
# raw Kineto traces of a GPU window for comparing perfdiag's import with HTA's elsewhere.
#
#     scripts/gpu-check.sh [OUT]      # OUT: results folder (default $OUT, else a new one)
#
# Needs python3 with torch (CUDA), pyarrow, numpy, nvidia-ml-py and jinja2. Wheels of perfdiag's
# other dependencies may sit in .whl/ (a machine with no package index); they are installed into
# /tmp/perfdiag-site, perfdiag itself (with its C scanner) into /tmp/perfdiag-pkg. Each step has
# a time limit and a failed step does not stop the others. Everything lands in OUT/gpu-check.tar.gz
# plus OUT/summary.txt (the step log) and OUT/traces.tar.gz (one run's raw Kineto traces).
# TRAIN_ARGS: extra arguments for benchmarks/cuda_train.py (`--device cpu` tries the script
# without a GPU); REPEATS: runs per scenario (default 1); BENCHMARKS=0 skips the sampler and
# overhead benchmarks (a rerun of the verdicts alone); LOADED_REPEAT=N runs repeat N beside one
# busy process per core (a loaded host).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-${OUT:-$(mktemp -d)}}
RES=$(mktemp -d /tmp/perfdiag-gpu-check.XXXX)
SITE=/tmp/perfdiag-site PKG=/tmp/perfdiag-pkg
SUMMARY=$RES/summary.txt
step() { echo "== $(date +%T) $*" | tee -a "$SUMMARY"; }
note() { echo "$*" | tee -a "$SUMMARY"; }

step "machine"
{ nvidia-smi; nvidia-smi -q | head -60; uname -a; nproc; free -g; } >"$RES/machine.txt" 2>&1
python3 - <<'EOF' 2>&1 | tee -a "$SUMMARY"
import platform, torch
print(f"python {platform.python_version()} torch {torch.__version__} cuda {torch.version.cuda}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"gpu {p.name} {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, "
          f"{torch.cuda.device_count()} device(s)")
else:
    print("no CUDA device visible to torch")
EOF

step "install"
if compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$ROOT"/.whl/*.whl >"$RES/install.log" 2>&1 || note "wheel install failed"
fi
export PYTHONPATH=$SITE
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$PKG" "$ROOT" \
  >>"$RES/install.log" 2>&1 || note "perfdiag install failed (see install.log)"
export PYTHONPATH=$PKG:$SITE PYTHONUNBUFFERED=1
# Run from RES: the repository root on sys.path would shadow the installed package.
cd "$RES" || exit 1
python3 -c 'import perfdiag.engine.kineto._scan, perfdiag.cli; print("perfdiag installed, C scanner built")' \
  2>&1 | tail -1 | tee -a "$SUMMARY"
PERFDIAG=(python3 -m perfdiag.cli)

step "live capture: perfdiag run --nproc-per-node 2 of benchmarks/cuda_train.py, one run per scenario"
for repeat in $(seq "${REPEATS:-1}"); do
hogs=()
if [ "$repeat" = "${LOADED_REPEAT:-0}" ]; then
  for _ in $(seq "$(nproc)"); do python3 -c 'while True: pass' & hogs+=($!); done
  note "repeat $repeat: beside ${#hogs[@]} busy processes"
fi
for scenario in healthy gpu-compute host-bound memcpy; do
  run=run-$scenario$([ "$repeat" = 1 ] || echo "-$repeat")
  spool=()
  [ "$scenario$repeat" = gpu-compute1 ] && spool=(--spool "$RES/spool-$scenario")
  started=$(date +%s.%N)
  timeout 150 "${PERFDIAG[@]}" run --nproc-per-node 2 --quiet --out "$RES/$run" \
    "${spool[@]}" -- "$ROOT/benchmarks/cuda_train.py" --scenario "$scenario" ${TRAIN_ARGS:-} \
    >"$RES/$run.log" 2>&1
  rc=$?
  seconds=$(python3 -c "import time; print(f'{time.time() - $started:.0f}')")
  note "-- $run: exit $rc after ${seconds} s"
  python3 - "$RES/$run" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, sys
from pathlib import Path
import pyarrow.compute as pc
import pyarrow.parquet as pq
out = Path(sys.argv[1])
try:
    verdict = json.loads((out / "verdict.json").read_text())
except OSError as exc:
    sys.exit(f"   no verdict: {exc}")
print(f"   status {verdict.get('status')}: {verdict.get('summary', '')[:400]}")
for f in verdict.get("findings", [])[:4]:
    print(f"   finding {f.get('kind')} ranks {f.get('ranks')} {f.get('category')} "
          f"severity {f.get('severity')}: {str(f.get('function') or '')[:120]}")
for events in sorted(out.glob("workers/*/events.parquet")):
    table = pq.read_table(events, columns=["category", "dur_ns"])
    counts = table.group_by("category").aggregate([("category", "count"), ("dur_ns", "sum")])
    rows = sorted(zip(*(counts[c].to_pylist() for c in ("category", "category_count", "dur_ns_sum"))))
    print(f"   rank {events.parent.name} events: " + ", ".join(
        f"{c} {n} ({s / 1e6:.0f} ms)" for c, n, s in rows))
for hw in sorted(out.glob("workers/*/hardware.parquet"))[:1]:
    table = pq.read_table(hw)
    names = table.column("metric").unique().to_pylist() if "metric" in table.column_names else []
    print(f"   hardware rows {table.num_rows}, metrics: {sorted(map(str, names))}")
EOF
done
[ ${#hogs[@]} -gt 0 ] && kill "${hogs[@]}" 2>/dev/null
done

benchmark() {  # benchmark LIMIT_S NAME ARGS...: one benchmark, its output's tail in the summary
  local limit=$1 name=$2
  shift 2
  step "$name $*"
  timeout "$limit" python3 "$ROOT/benchmarks/$name.py" "$@" >"$RES/$name.txt" 2>&1
  note "exit $?"
  tail -40 "$RES/$name.txt" >>"$SUMMARY"
}
if [ "${BENCHMARKS:-1}" = 0 ]; then
  step "benchmarks skipped (BENCHMARKS=0)"
else
  benchmark 90 hardware_sampler --seconds 5
  benchmark 170 window_overhead --device cuda --repeats 1
  benchmark 60 hook_dormant --quick --device cuda
fi

step "pack"
mkdir -p "$DEST"
find "$RES"/spool-* -name '*.json' -size +0 2>/dev/null | head -20 >"$RES/traces.list"
tar czf "$DEST/traces.tar.gz" -C "$RES" -T <(sed "s|^$RES/||" "$RES/traces.list") 2>/dev/null
tar czf "$DEST/gpu-check.tar.gz" -C "$RES" --exclude='spool-*' .
cp "$SUMMARY" "$DEST/summary.txt"
ls -la "$DEST" | tee -a "$DEST/summary.txt"
