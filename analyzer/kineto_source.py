"""A folder of Kineto Chrome traces (torch.profiler's export) as a capture.

Each trace is imported and summarized with the same engine the agent runs on workers
(`perfdiag.kineto.read_kineto`, `perfdiag.summary.summarize`), so the analysis that follows is
identical to the one of a perfdiag capture.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from perfdiag.analyzer.capture import Capture, empty_summary, normalize_summary
from perfdiag.analyzer.errors import CaptureError, NoCaptureError
from perfdiag.api.breakdown import RankBreakdown
from perfdiag.schema import WorkerMeta
from perfdiag.storage import Storage, layout

TRACE_SUFFIXES = (".json", ".json.gz")
# Our own outputs and control files are never traces.
_NOT_TRACES = {layout.PLAN, layout.VERDICT, layout.TIMELINE, layout.BREAKDOWN}


def find_traces(storage: Storage) -> list[str]:
    """Keys that may be Kineto traces, outside the capture layout."""
    return [
        key
        for key in storage.list()
        if key.endswith(TRACE_SUFFIXES)
        and key not in _NOT_TRACES
        and not key.startswith(f"{layout.WORKERS}/")
    ]


def load_kineto(storage: Storage, keys: list[str], say: Callable[[str], None]) -> Capture:
    from perfdiag.analyzer.collectives import collective_calls, empty_collectives
    from perfdiag.breakdown import gpu_breakdown
    from perfdiag.kineto import TraceError, read_kineto
    from perfdiag.summary import summarize

    tables: dict[int, pa.Table] = {}
    metas: dict[int, WorkerMeta] = {}
    files: dict[int, str] = {}
    breakdown: dict[int, RankBreakdown] = {}
    skipped: list[str] = []
    calls: list[pa.Table] = []  # one small table per rank
    say(f"importing {len(keys)} Kineto trace file(s) from {storage.uri}")
    with tempfile.TemporaryDirectory(prefix="perfdiag-kineto-") as tmp:
        for done, key in enumerate(keys, start=1):
            path = storage.local_path(key)
            if path is None:
                path = Path(tmp) / key.replace("/", "_")
                storage.get_file(key, path)
            try:
                events, meta = read_kineto(path)
            except TraceError as exc:
                skipped.append(f"{key}: {exc}")
                say(f"skipped {key}: {exc}")
                continue
            if meta.rank in files:
                raise CaptureError(
                    f"{storage.uri}: two traces for rank {meta.rank}: {files[meta.rank]} and {key}"
                    " (analyze one window at a time: move the other file away)"
                )
            files[meta.rank] = key
            tables[meta.rank] = normalize_summary(summarize(events, meta), storage.uri_of(key))
            metas[meta.rank] = meta
            calls.append(collective_calls(events))
            breakdown[meta.rank] = gpu_breakdown(events, meta.window.step_bounds_ns)
            say(f"summarized {done}/{len(keys)} traces (rank {meta.rank})")
    if not tables:
        detail = "; ".join(skipped[:5])
        raise NoCaptureError(
            f"no capture in {storage.uri}: found {len(keys)} JSON file(s) but none is a readable "
            f"Kineto trace ({detail})"
        )
    summary = pa.concat_tables([tables[r] for r in sorted(tables)]) if tables else empty_summary()
    return Capture(
        source=storage.uri,
        kind="kineto",
        summary=summary,
        metas=metas,
        notes=[f"skipped {s}" for s in skipped],
        breakdown=breakdown,
        collectives=pa.concat_tables(calls) if calls else empty_collectives(),
        trace_keys=files,
    )
