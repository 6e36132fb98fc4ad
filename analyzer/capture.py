"""Loading a capture (DESIGN.md §3 layout) into one concatenated summary table.

Per-worker files are fetched in parallel (S3 latency dominates there); the summaries are
concatenated into a single Arrow table so the cross-worker stage never loops over ranks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
from pydantic import ValidationError

from perfdiag.analyzer.errors import CaptureError, NoCaptureError
from perfdiag.api.breakdown import RankBreakdown
from perfdiag.api.plan import Plan
from perfdiag.api.worker import WorkerStatus
from perfdiag.parquet_io import table_from_bytes
from perfdiag.schema import SUMMARY_SCHEMA, SUMMARY_SCHEMA_ID, WorkerMeta, read_meta
from perfdiag.storage import Storage, StorageNotFound, layout

Progress = Callable[[str], None]

# Worker files smaller than this are fetched by up to this many threads at once.
_FETCH_THREADS = 16
_PROGRESS_EVERY_S = 1.0


@dataclass
class Capture:
    """Everything the cross-worker stage reads, for the ranks that produced it."""

    source: str
    kind: Literal["capture", "kineto"]
    summary: pa.Table
    metas: dict[int, WorkerMeta]
    statuses: dict[int, WorkerStatus] = field(default_factory=dict)
    stacks: dict[int, Any] = field(default_factory=dict)
    flight_recorders: dict[int, bytes] = field(default_factory=dict)
    """Rank → torch Flight Recorder pickle (flight_recorder.pkl), when the hook dumped one."""
    plan: Plan | None = None
    notes: list[str] = field(default_factory=list)
    unreadable: dict[int, str] = field(default_factory=dict)
    """Ranks whose summary exists but cannot be read → why (they count as missing)."""
    collectives: pa.Table | None = None
    """Collective calls of every rank (analyzer/collectives.py), when the source has them."""
    trace_keys: dict[int, str] = field(default_factory=dict)
    """Rank → its Kineto trace key, for Kineto folders (the timeline re-reads a few)."""
    breakdown: dict[int, RankBreakdown] = field(default_factory=dict)
    """GPU time breakdown per rank (HTA's definitions), for Kineto folders: breakdown.json."""

    @property
    def ranks(self) -> list[int]:
        return sorted(self.metas)


def empty_summary() -> pa.Table:
    return SUMMARY_SCHEMA.empty_table()


def normalize_summary(table: pa.Table, origin: str) -> pa.Table:
    """The columns of SUMMARY_SCHEMA, in order and type, without file metadata.

    Columns added later by the engine (nullable by the version rule) are dropped here.
    """
    missing = [name for name in SUMMARY_SCHEMA.names if name not in table.column_names]
    if missing:
        raise CaptureError(f"{origin}: summary lacks column(s) {', '.join(missing)}")
    try:
        return table.select(SUMMARY_SCHEMA.names).cast(SUMMARY_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise CaptureError(f"{origin}: summary columns have unexpected types: {exc}") from exc


def load_capture(storage: Storage, progress: Progress | None = None) -> Capture:
    """Read the capture under `storage`, or a folder of Kineto traces when there is none."""
    say = progress or (lambda _msg: None)
    worker_keys = storage.list(f"{layout.WORKERS}/")
    by_rank: dict[int, set[str]] = {}
    for key in worker_keys:
        rank = layout.rank_of_worker_key(key)
        if rank is not None:
            by_rank.setdefault(rank, set()).add(key.rsplit("/", 1)[1])
    plan = _read_plan(storage)
    if not by_rank and plan is None:
        from perfdiag.analyzer.kineto_source import find_traces, load_kineto

        traces = find_traces(storage)
        if traces:
            return load_kineto(storage, traces, say)
        raise NoCaptureError(
            f"no capture in {storage.uri}: looked for {layout.PLAN}, "
            f"{layout.WORKERS}/<rank>/{layout.SUMMARY} and Kineto traces (*.json, *.json.gz)"
        )

    summary_ranks = sorted(r for r, names in by_rank.items() if layout.SUMMARY in names)
    say(f"loading {len(summary_ranks)} worker summaries from {storage.uri}")
    tables: dict[int, pa.Table] = {}
    metas: dict[int, WorkerMeta] = {}
    statuses: dict[int, WorkerStatus] = {}
    stacks: dict[int, Any] = {}
    notes: list[str] = []

    unreadable: dict[int, str] = {}

    flight_recorders: dict[int, bytes] = {}

    def fetch(rank: int) -> tuple[int, pa.Table | None, WorkerMeta | None, Any, Any]:
        names = by_rank[rank]
        table = meta = None
        if layout.SUMMARY in names:
            try:
                table, meta = _read_summary(storage, rank)
            except CaptureError as exc:
                # One bad file must not sink the diagnosis of all the others.
                unreadable[rank] = str(exc)
        status = _read_json(storage, layout.worker_key(rank, layout.STATUS), names)
        stack = _read_json(storage, layout.worker_key(rank, layout.STACKS), names)
        if layout.FLIGHT_RECORDER in names:
            try:
                recorded = storage.get_bytes(layout.worker_key(rank, layout.FLIGHT_RECORDER))
            except StorageNotFound:
                pass
            else:
                flight_recorders[rank] = recorded
        return rank, table, meta, status, stack

    loaded = 0
    last_report = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, min(_FETCH_THREADS, len(by_rank)))) as pool:
        for rank, table, meta, status, stack in pool.map(fetch, sorted(by_rank)):
            if table is not None and meta is not None:
                tables[rank] = table
                metas[rank] = meta
                loaded += 1
                now = time.monotonic()
                if now - last_report >= _PROGRESS_EVERY_S:
                    say(f"loaded {loaded}/{len(summary_ranks)} workers")
                    last_report = now
            if status is not None:
                try:
                    statuses[rank] = WorkerStatus.model_validate(status)
                except ValidationError as exc:
                    notes.append(f"ignored unreadable status of rank {rank}: {_first_error(exc)}")
            if stack is not None:
                stacks[rank] = stack
    if summary_ranks:
        say(f"loaded {loaded}/{len(summary_ranks)} workers")
    summary = pa.concat_tables([tables[r] for r in sorted(tables)]) if tables else empty_summary()
    return Capture(
        source=storage.uri,
        kind="capture",
        summary=summary,
        metas=metas,
        statuses=statuses,
        stacks=stacks,
        flight_recorders=flight_recorders,
        plan=plan,
        notes=notes,
        unreadable=unreadable,
    )


def _read_summary(storage: Storage, rank: int) -> tuple[pa.Table, WorkerMeta]:
    key = layout.worker_key(rank, layout.SUMMARY)
    origin = storage.uri_of(key)
    try:
        table = table_from_bytes(storage.get_bytes(key))
    except (pa.ArrowInvalid, OSError) as exc:
        raise CaptureError(f"{origin}: not a readable Parquet file: {exc}") from exc
    try:
        meta = read_meta(table.schema, SUMMARY_SCHEMA_ID)
    except (ValueError, ValidationError, KeyError) as exc:
        raise CaptureError(f"{origin}: {exc}") from exc
    if meta.rank != rank:
        raise CaptureError(f"{origin}: file says rank {meta.rank}, its key says rank {rank}")
    if not meta.window.step_bounds_ns:
        raise CaptureError(f"{origin}: the window has no steps")
    table = normalize_summary(table, origin)
    # The key is authoritative for the rank column too (one file = one worker).
    return table.set_column(0, "rank", pa.array([rank] * table.num_rows, pa.int32())), meta


def _read_plan(storage: Storage) -> Plan | None:
    try:
        text = storage.get_text(layout.PLAN)
    except StorageNotFound:
        return None
    try:
        return Plan.model_validate_json(text)
    except ValidationError:
        # The plan only labels the report; a capture with an odd plan is still analysable.
        return None


def _read_json(storage: Storage, key: str, names: set[str]) -> Any:
    if key.rsplit("/", 1)[1] not in names:
        return None
    try:
        return json.loads(storage.get_bytes(key))
    except (StorageNotFound, ValueError):
        return None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
