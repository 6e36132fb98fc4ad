"""Digests of everything the per-worker engine and `perfdiag analyze` write for the shared
traces, to show that a change to the engine leaves its outputs byte-identical.

    .venv/bin/python benchmarks/output_digest.py OUT.json [--compare BEFORE.json]

For each trace file (the two GPT-2 pairs, every shared HTA trace): the events table and the
summary of `read_kineto` + `summarize`, as Arrow IPC streams (schema metadata included, one
chunk per column); for
each GPT-2 trace, the agent's files (`process_window` on a spool window holding the trace as
the hook writes it, plain JSON, with a hook.json made from its ProfilerStep ranges); for each
set (the GPT-2 pairs, the HTA trace_diff pair, each other HTA folder), `perfdiag analyze`'s
verdict.json, breakdown.json, the text of timeline.json.gz and report.html without its
"generated" time. `--compare` prints every digest that differs and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
GPT2 = [TRACES / "gpu-gpt2" / "healthy", TRACES / "gpu-gpt2" / "fp32-rank1"]
HTA = TRACES / "hta"
_GENERATED = re.compile(rb"generated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ipc(table: pa.Table) -> bytes:
    """The table as an Arrow IPC stream, its columns in one chunk each (how a column is split
    in chunks is no part of its content, and Parquet files do not keep it)."""
    table = table.combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def trace_files() -> list[Path]:
    files = [path for folder in GPT2 for path in sorted(folder.glob("*.json.gz"))]
    return files + sorted(HTA.rglob("*.json.gz"))


def engine_digests(path: Path) -> dict[str, str]:
    from perfdiag.api.taxonomy import same_columns
    from perfdiag.engine.kineto import TraceError, read_kineto
    from perfdiag.engine.summary import summarize

    try:
        with same_columns():
            events, meta = read_kineto(path, rank=0 if "rank" not in path.name else None)
            summary = summarize(events, meta)
    except TraceError as exc:
        return {"error": str(exc)}
    return {"events": _sha(_ipc(events)), "summary": _sha(_ipc(summary))}


def agent_digests(path: Path, tmp: Path) -> dict[str, str]:
    """The agent's worker files for `path` as the window of a spool (plain trace.json)."""
    from perfdiag.collector.agent import process_window
    from perfdiag.collector.hook import spool
    from perfdiag.engine.kineto import load_trace, profiler_steps
    from perfdiag.storage import open_storage

    steps = profiler_steps(load_trace(path))
    folder = spool.window_dir(tmp / "spool", 0, "plan")
    folder.mkdir(parents=True)
    with gzip.open(path, "rb") as src, (folder / spool.TRACE).open("wb") as dst:
        shutil.copyfileobj(src, dst)
    hook = {"first_step": steps[0].number, "steps": len(steps) - 1, "pid": 1, "host": "h"}
    (folder / spool.HOOK_META).write_text(json.dumps(hook))
    store = tmp / "store"
    status = process_window(tmp / "spool", 0, "plan", open_storage(str(store)))
    out: dict[str, str] = {"phase": str(status.phase)}
    for key in status.files:
        out[key] = _sha((store / key).read_bytes())
    shutil.rmtree(tmp / "spool")
    shutil.rmtree(store)
    return out


def sets(tmp: Path) -> dict[str, Path]:
    found = {f"gpu-gpt2/{folder.name}": folder for folder in GPT2}
    pair = tmp / "hta-trace_diff"
    pair.mkdir()
    for rank, side in enumerate(("control", "test")):
        (pair / f"rank-{rank}.json.gz").symlink_to(HTA / "trace_diff" / side / f"{side}.json.gz")
    found["hta/trace_diff"] = pair
    for folder in sorted({p.parent for p in HTA.rglob("*.json.gz")}):
        if folder.parent.name != "trace_diff":
            found[f"hta/{folder.relative_to(HTA)}"] = folder
    return found


def analyze_digests(folder: Path, out: Path) -> dict[str, str]:
    perfdiag = str(Path(sys.executable).with_name("perfdiag"))
    done = subprocess.run(
        [perfdiag, "analyze", str(folder), "--out", str(out), "--quiet"],
        capture_output=True,
        check=False,
    )
    found = {"exit": str(done.returncode)}
    if done.returncode:
        found["stderr"] = _sha(done.stderr)
    for file in sorted(out.glob("*")) if out.exists() else []:
        data = file.read_bytes()
        if file.name.endswith(".gz"):
            data = gzip.decompress(data)
        if file.name.endswith(".html"):
            data = _GENERATED.sub(b"generated", data)
        found[file.name] = _sha(data)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--compare", type=Path, help="digests taken before, to compare with")
    args = parser.parse_args()
    digests: dict[str, dict[str, str]] = {}
    # A fixed folder: the outputs name the trace files' paths.
    tmp = Path(tempfile.gettempdir()) / "perfdiag-digest"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for path in trace_files():
            label = str(path.relative_to(TRACES))
            digests[f"engine {label}"] = engine_digests(path)
            if "gpu-gpt2" in label:
                digests[f"agent {label}"] = agent_digests(path, tmp)
        for label, folder in sets(tmp).items():
            digests[f"analyze {label}"] = analyze_digests(folder, tmp / "out" / label)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.write_text(json.dumps(digests, indent=1, sort_keys=True))
    print(f"{sum(len(d) for d in digests.values())} digests of {len(digests)} outputs → {args.out}")
    if args.compare:
        before = json.loads(args.compare.read_text())
        differ = [
            f"{what}: {key}"
            for what in sorted(set(before) | set(digests))
            for key in sorted(set(before.get(what, {})) | set(digests.get(what, {})))
            if before.get(what, {}).get(key) != digests.get(what, {}).get(key)
        ]
        print("\n".join(differ) or "identical to " + str(args.compare))
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
