"""A folder of Kineto Chrome traces (torch.profiler's export) as a capture.

Each trace is imported and summarized with the same engine the agent runs on workers
(`perfdiag.engine.kineto.read_kineto`, `perfdiag.engine.summary.summarize`), so the analysis that follows is
identical to the one of a perfdiag capture.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from perfdiag.analyzer.errors import CaptureError, NoCaptureError
from perfdiag.analyzer.load.capture import Capture
from perfdiag.analyzer.load.collective_calls import collective_calls, empty_collectives
from perfdiag.analyzer.load.timeline_events import keep_timeline_events
from perfdiag.analyzer.load.worker_files import empty_summary, normalize_summary
from perfdiag.analyzer.load.worker_table import WorkerMetas
from perfdiag.api.breakdown import RankBreakdown
from perfdiag.api.limits import rank_problem
from perfdiag.api.schema import WorkerMeta
from perfdiag.api.taxonomy import same_columns
from perfdiag.engine.allocator import release_memory, system_allocator
from perfdiag.engine.breakdown import gpu_breakdown
from perfdiag.engine.kineto import TraceError, read_kineto
from perfdiag.engine.kineto.events import rank_from_name
from perfdiag.engine.summary import summarize
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


@dataclass
class _Imported:
    """What the analysis keeps of one trace file: its summary and a few small tables."""

    key: str
    meta: WorkerMeta
    timeline_events: Path
    summary: pa.Table
    calls: pa.Table
    breakdown: RankBreakdown


def load_kineto(
    storage: Storage, keys: list[str], say: Callable[[str], None], jobs: int = 1
) -> Capture:
    """The traces under `keys` as a capture, `jobs` files read at a time."""
    kept: dict[int, Path] = {}  # rank → its timeline events (Capture.timeline_events)
    scratch = tempfile.TemporaryDirectory(prefix="perfdiag-timeline-")
    try:
        capture = _load(storage, keys, say, Path(scratch.name), kept, jobs)
    except BaseException:
        scratch.cleanup()
        raise
    capture.timeline_events = kept
    capture.scratch = scratch
    return capture


def _load(
    storage: Storage,
    keys: list[str],
    say: Callable[[str], None],
    scratch: Path,
    kept: dict[int, Path],
    jobs: int,
) -> Capture:
    tables: dict[int, pa.Table] = {}
    metas: dict[int, WorkerMeta] = {}
    files: dict[int, str] = {}
    breakdown: dict[int, RankBreakdown] = {}
    skipped: list[str] = []
    calls: list[pa.Table] = []  # one small table per rank
    unreadable: dict[int, str] = {}  # rank (from the file name) → why its trace was skipped
    say(f"importing {len(keys)} Kineto trace file(s) from {storage.uri}")
    # `jobs` files at a time (default one): each file's events are dropped once it is
    # summarized and its timeline events written, so the memory is that of `jobs` files,
    # whatever the folder holds. More than one saves wall time where cores are idle (the
    # scanner, Arrow and numpy release the GIL) and none on a busy host (docs/benchmarks.md).
    # The pool lets an error cancel the files not started yet.
    workers = max(1, min(jobs, len(keys)))
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="perfdiag-kineto-"))
        pool = ThreadPoolExecutor(workers, thread_name_prefix="perfdiag-kineto")
        # On an error the files not started yet are not read (then the folder goes).
        stack.callback(pool.shutdown, wait=True, cancel_futures=True)
        results = pool.map(
            lambda n_key: _import(storage, n_key[1], Path(tmp), scratch / f"{n_key[0]}.arrow"),
            enumerate(keys),
        )
        for done, (key, result) in enumerate(zip(keys, results, strict=True), start=1):
            if isinstance(result, str):
                skipped.append(f"{key}: {result}")
                say(f"skipped {key}: {result}")
                named = rank_from_name(Path(key))
                if named is not None and rank_problem(named) is None:
                    unreadable.setdefault(named, result)
                continue
            rank = result.meta.rank
            if rank in files:
                raise CaptureError(
                    f"{storage.uri}: two traces for rank {rank}: {files[rank]} and {key}"
                    " (analyze one window at a time: move the other file away)"
                )
            files[rank] = key
            tables[rank] = result.summary
            metas[rank] = result.meta
            calls.append(result.calls)
            breakdown[rank] = result.breakdown
            kept[rank] = result.timeline_events
            say(f"summarized {done}/{len(keys)} traces (rank {rank})")
    if not tables:
        detail = "; ".join(skipped[:5])
        raise NoCaptureError(
            f"no capture in {storage.uri}: found {len(keys)} JSON file(s) but none is a readable "
            f"Kineto trace ({detail})"
        )
    summary = pa.concat_tables([tables[r] for r in sorted(tables)]) if tables else empty_summary()
    notes = [f"skipped {s}" for s in skipped]
    return Capture(
        source=storage.uri,
        kind="kineto",
        summary=summary,
        metas=WorkerMetas.of(metas),
        notes=notes,
        input_notes=list(notes),
        # A rank whose trace was read from another file is not missing.
        unreadable={r: why for r, why in sorted(unreadable.items()) if r not in metas},
        breakdown=breakdown,
        collectives=pa.concat_tables(calls) if calls else empty_collectives(),
        trace_keys=files,
    )


def _import(storage: Storage, key: str, tmp: Path, keep: Path) -> _Imported | str:
    """One trace file imported and summarized, the events the timeline shows of it written to
    `keep`; a string says why it was skipped."""

    try:
        return _import_file(storage, key, tmp, keep)
    finally:
        release_memory()  # what reading the trace freed, before the next one is read


def _import_file(storage: Storage, key: str, tmp: Path, keep: Path) -> _Imported | str:
    local = storage.local_path(key)
    path = local or tmp / key.replace("/", "_")
    if local is None:
        storage.get_file(key, path)
    # The import and the summary ask about the same columns; their many short-lived buffers
    # come from the C library's allocator, which release_memory() trims after each file.
    with system_allocator(), same_columns():
        try:
            events, meta = read_kineto(path)
        except TraceError as exc:
            return str(exc)
        finally:
            if local is None:
                path.unlink(missing_ok=True)  # the copy of a remote file is no longer needed
        keep_timeline_events(events, keep)
        return _Imported(
            key=key,
            meta=meta,
            timeline_events=keep,
            summary=normalize_summary(summarize(events, meta), storage.uri_of(key)),
            calls=collective_calls(events),
            breakdown=gpu_breakdown(events, meta.window.step_bounds_ns),
        )
