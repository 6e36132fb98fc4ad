#!/usr/bin/env bash
# perfdiag on a GPU machine, in one call: GPU fault captures for the test suite first — every
# scenario of benchmarks/gpu_transformer_train.py (a GPT-style transformer, DDP over gloo, both
# ranks on one GPU, one fault on rank 1) × REPEATS, each through `perfdiag run --nproc-per-node
# 2 --keep-raw` as a user runs it — then, when asked, the NVML sampler and overhead benchmarks.
#
#     scripts/gpu-check.sh [OUT]      # OUT: results folder (default $OUT, else a new one)
#
# From a session with a GPU machine: run(command="scripts/gpu-check.sh $OUT", timeout_s=600).
# What comes back (at most 8 files of at most 15 MB): OUT/summary.txt (machine, one line per
# run — scenario, repeat, exit code, seconds, status, top finding (kind, ranks, category,
# function) and whether it is the verdict the scenario documents — and what did not fit),
# OUT/captures-<k>.tar.gz (logs/ and runs/<scenario>-<repeat>/: plan.json, verdict.json,
# run.json, expected.json, workers/<rank>/{summary,hardware,status}; events.parquet while there
# is room, first repeats first) and OUT/traces.tar.gz (raw Kineto traces of the first healthy and
# fp32 runs, gzipped). Make them test data here with
#
#     .venv/bin/python tests/support/perfdiag_testing/gpu_captures.py import \
#         tests/data/gpu-captures OUT/captures-*.tar.gz
#
# (tests/data/gpu-captures/<scenario>-<repeat>/ with expected.json from the scenario's
# documented verdict; docs/analysis.md "GPU fault classes").
#
# Time: 23–35 s per run on an H100 (CUDA start of two ranks, 3 warm-up + 8 profiled steps,
# the trace processed and analysed): 16 scenarios take ~425 s, one repeat of each per device
# call; a second call takes further repeats of a few (SCENARIOS=…; `gpu_captures.py import
# --repeat-offset 1` numbers them after the first call's). The loop starts no run once LOOP_BUDGET_S is spent (each run at most RUN_TIMEOUT s), so
# that the packing happens inside the device call's 10 minutes; first repeats of every
# scenario come first. Needs python3 with torch (CUDA), pyarrow, numpy, nvidia-ml-py and jinja2; wheels of
# perfdiag's other dependencies (pydantic, pydantic-settings, tenacity, …) sit in .whl/ on a
# machine with no package index (scripts/gpu-wheels.sh downloads them beforehand; .whl/ is
# git-ignored, so the device call carries it: carry [".whl"]) and are installed into
# /tmp/perfdiag-site, perfdiag itself (with its C scanner) into /tmp/perfdiag-pkg.
#
# Settings (environment): REPEATS (2); SCENARIOS (space-separated; default every transformer
# scenario); WARMUP_STEPS (3), CAPTURE_STEPS (8); RUN_TIMEOUT (90 s per run); LOOP_BUDGET_S
# (450); TRAIN_ARGS (extra arguments for the training script; `--device cpu` tries everything
# without a GPU); TRACES=0 spools no raw traces; MLP=1 adds the earlier MLP scenarios of
# benchmarks/cuda_train.py (mlp-healthy, mlp-gpu-compute, mlp-host-bound, mlp-memcpy);
# BENCHMARKS=1 adds hardware_sampler, window_overhead and hook_dormant on CUDA after the
# captures; LOADED_REPEAT=N runs repeat N beside one busy process per core; PYTHON (python3)
# and INSTALL=0 use that interpreter's perfdiag as it is installed.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-${OUT:-$(mktemp -d)}}
mkdir -p "$DEST" && DEST=$(cd "$DEST" && pwd)
RES=$(mktemp -d "${TMPDIR:-/tmp}/perfdiag-gpu-check.XXXX") # every file of every run, kept
SITE=/tmp/perfdiag-site PKG=/tmp/perfdiag-pkg
PY=${PYTHON:-python3}
TRAIN=$ROOT/benchmarks/gpu_transformer_train.py
CAPTURES=$ROOT/tests/support/perfdiag_testing/gpu_captures.py
REPEATS=${REPEATS:-2} WARMUP=${WARMUP_STEPS:-3} CAPTURE=${CAPTURE_STEPS:-8}
RUN_TIMEOUT=${RUN_TIMEOUT:-90} LOOP_BUDGET=${LOOP_BUDGET_S:-450}
SUMMARY=$DEST/summary.txt # written as the runs go: a cut-off call still brings it back
: >"$SUMMARY"
mkdir -p "$RES/logs" "$RES/runs" "$RES/spool"
step() { echo "== $(date +%T) $*" | tee -a "$SUMMARY"; }
note() { echo "$*" | tee -a "$SUMMARY"; }

step "machine"
{ nvidia-smi; nvidia-smi -q | head -60; uname -a; nproc; free -g; } >"$RES/logs/machine.txt" 2>&1
"$PY" - "$RES/gpus" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import platform, sys, torch
print(f"python {platform.python_version()} torch {torch.__version__} cuda {torch.version.cuda}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"gpu {p.name} {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, "
          f"{torch.cuda.device_count()} device(s)")
else:
    print("no CUDA device visible to torch")
open(sys.argv[1], "w").write(str(torch.cuda.device_count()))
EOF
GPUS=$(cat "$RES/gpus" 2>/dev/null || echo 0)
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)

if [ "${INSTALL:-1}" != 0 ]; then
  step "install"
  if compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$ROOT"/.whl/*.whl >"$RES/logs/install.log" 2>&1 || note "wheel install failed"
  fi
  export PYTHONPATH=$SITE
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target "$PKG" "$ROOT" \
    >>"$RES/logs/install.log" 2>&1 || note "perfdiag install failed (see logs/install.log)"
  export PYTHONPATH=$PKG:$SITE
fi
export PYTHONUNBUFFERED=1
# Run from RES: the repository root on sys.path would shadow the installed package.
cd "$RES" || exit 1
PERFDIAG=("$PY" -m perfdiag.cli)
pack() {
  step "pack"
  "$PY" "$CAPTURES" pack --runs "$RES/runs" --logs "$RES/logs" --traces "$RES/spool" \
    --dest "$DEST" 2>&1 | tee -a "$SUMMARY"
  ls -l "$DEST" | tee -a "$SUMMARY"
}
if ! "$PY" -c 'import perfdiag.engine.kineto._scan, perfdiag.cli' >"$RES/logs/import.log" 2>&1; then
  note "perfdiag does not import (its wheels in .whl/?): $(tail -1 "$RES/logs/import.log")"
  pack
  exit 1
fi
note "perfdiag installed, C scanner built"

"$PY" "$TRAIN" --expectations --gpus "$GPUS" >"$RES/expectations.json" 2>"$RES/logs/expectations.log"
if [ -z "${SCENARIOS:-}" ]; then
  SCENARIOS=$("$PY" -c 'import json, sys; print(" ".join(e["scenario"] for e in json.load(open(sys.argv[1]))))' \
    "$RES/expectations.json")
  [ "${MLP:-0}" = 1 ] && SCENARIOS="$SCENARIOS mlp-healthy mlp-gpu-compute mlp-host-bound mlp-memcpy"
fi

run_one() { # run_one SCENARIO REPEAT ORDER: one `perfdiag run`, its line in the summary
  local scenario=$1 repeat=$2 order=$3 name=$1-$2 script args spool=() started rc seconds
  if [[ $scenario == mlp-* ]]; then
    script=$ROOT/benchmarks/cuda_train.py args=(--scenario "${scenario#mlp-}")
  else
    # The training ends two steps after the window: no time spent training past it.
    script=$TRAIN args=(--scenario "$scenario" --steps $((WARMUP + CAPTURE + 3)))
  fi
  if [ "${TRACES:-1}" != 0 ] && [ "$repeat" = 1 ] && [[ $scenario == healthy || $scenario == fp32 ]]; then
    spool=(--spool "$RES/spool/$name")
  fi
  started=$(date +%s%N)
  # perfdiag's own --timeout first: a window that never comes is reported, not killed.
  # shellcheck disable=SC2086 # TRAIN_ARGS is a list of words
  timeout -k 10 "$RUN_TIMEOUT" "${PERFDIAG[@]}" run --nproc-per-node 2 --quiet --keep-raw \
    --warmup-steps "$WARMUP" --capture-steps "$CAPTURE" --timeout $((RUN_TIMEOUT - 20)) \
    --out "$RES/runs/$name" "${spool[@]}" \
    -- "$script" "${args[@]}" ${TRAIN_ARGS:-} >"$RES/logs/$name.log" 2>&1
  rc=$?
  seconds=$((($(date +%s%N) - started) / 1000000000))
  note "$("$PY" "$CAPTURES" record "$RES/runs/$name" --scenario "$scenario" --repeat "$repeat" \
    --rc "$rc" --seconds "$seconds" --expectations "$RES/expectations.json" \
    --log "$RES/logs/$name.log" \
    --fact "order=$order" --fact "gpus=$GPUS" --fact "gpu=$GPU_NAME" --fact fault_rank=1 \
    --fact world=2 --fact "warmup_steps=$WARMUP" --fact "capture_steps=$CAPTURE" \
    --fact "loaded=$([ "$repeat" = "${LOADED_REPEAT:-0}" ] && echo 1 || echo 0)" 2>&1)"
  # The training's own lines: step times and what the fault rank set up.
  grep -h "_train: .* rank [0-9]*:" "$RES/logs/$name.log" | sed 's/^/     /' | tee -a "$SUMMARY"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    note "     timed out; processes on the GPU now: $(nvidia-smi --query-compute-apps=pid,name \
      --format=csv,noheader 2>/dev/null | tr '\n' ' ')"
  fi
  LONGEST=$((seconds > LONGEST ? seconds : LONGEST))
}

step "captures: $(echo "$SCENARIOS" | wc -w) scenarios × $REPEATS, warm-up $WARMUP + $CAPTURE steps, \
at most $RUN_TIMEOUT s a run, no run started after $LOOP_BUDGET s"
LOOP_STARTED=$(date +%s) LONGEST=20 ORDER=0
for repeat in $(seq "$REPEATS"); do
  hogs=()
  if [ "$repeat" = "${LOADED_REPEAT:-0}" ]; then
    for _ in $(seq "$(nproc)"); do "$PY" -c 'while True: pass' & hogs+=($!); done
    note "repeat $repeat: beside ${#hogs[@]} busy processes"
  fi
  for scenario in $SCENARIOS; do
    if (($(date +%s) - LOOP_STARTED + LONGEST > LOOP_BUDGET)); then
      note "$scenario #$repeat: not run (the loop's $LOOP_BUDGET s are spent)"
      continue
    fi
    ORDER=$((ORDER + 1))
    run_one "$scenario" "$repeat" "$ORDER"
  done
  [ ${#hogs[@]} -gt 0 ] && kill "${hogs[@]}" 2>/dev/null
done
note "captures took $(($(date +%s) - LOOP_STARTED)) s"

benchmark() { # benchmark LIMIT_S NAME ARGS...: one benchmark, its output's tail in the summary
  local limit=$1 name=$2
  shift 2
  step "$name $*"
  timeout "$limit" "$PY" "$ROOT/benchmarks/$name.py" "$@" >"$RES/logs/$name.txt" 2>&1
  note "exit $?"
  tail -40 "$RES/logs/$name.txt" >>"$SUMMARY"
}
if [ "${BENCHMARKS:-0}" = 1 ]; then
  benchmark 90 hardware_sampler --seconds 5
  benchmark 170 window_overhead --device cuda --repeats 1
  benchmark 60 hook_dormant --quick --device cuda
fi
pack
