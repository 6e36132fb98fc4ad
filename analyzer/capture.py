"""Loading a capture (DESIGN.md §3 layout) into one concatenated summary table.

Per-worker files are read in bulk by analyzer/worker_files.py; the summaries are concatenated
into a single Arrow table so the cross-worker stage never loops over ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
from pydantic import ValidationError

from perfdiag.analyzer.errors import NoCaptureError
from perfdiag.analyzer.worker_files import empty_summary, normalize_summary, read_worker_files
from perfdiag.api.breakdown import RankBreakdown
from perfdiag.api.plan import Plan
from perfdiag.api.trigger import Slowdown
from perfdiag.api.worker import WorkerStatus
from perfdiag.schema import WorkerMeta
from perfdiag.storage import Storage, StorageNotFound, layout

Progress = Callable[[str], None]

__all__ = ["Capture", "Progress", "empty_summary", "load_capture", "normalize_summary"]


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
    trigger: Slowdown | None = None
    notes: list[str] = field(default_factory=list)
    unreadable: dict[int, str] = field(default_factory=dict)
    """Ranks whose summary exists but cannot be read → why (they count as missing)."""
    collectives: pa.Table | None = None
    """Collective calls of every rank (analyzer/collectives.py), when the source has them."""
    trace_keys: dict[int, str] = field(default_factory=dict)
    """Rank → its Kineto trace key, for Kineto folders (the timeline re-reads a few)."""
    breakdown: dict[int, RankBreakdown] = field(default_factory=dict)
    """GPU time breakdown per rank (HTA's definitions), for Kineto folders: breakdown.json."""
    hardware_keys: dict[int, str] = field(default_factory=dict)
    """Rank → its hardware.parquet key; read only for the ranks a finding blames on their GPU
    (analyzer/throttle.py)."""

    @property
    def ranks(self) -> list[int]:
        return sorted(self.metas)


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

    files = read_worker_files(storage, by_rank, say)
    return Capture(
        source=storage.uri,
        kind="capture",
        summary=files.summary,
        metas=files.metas,
        statuses=files.statuses,
        stacks=files.stacks,
        flight_recorders=files.flight_recorders,
        plan=plan,
        trigger=_read_trigger(storage),
        notes=files.notes,
        unreadable=files.unreadable,
        hardware_keys={
            rank: layout.worker_key(rank, layout.HARDWARE)
            for rank, names in by_rank.items()
            if layout.HARDWARE in names
        },
    )


def _read_trigger(storage: Storage) -> Slowdown | None:
    try:
        text = storage.get_text(layout.TRIGGER)
    except StorageNotFound:
        return None
    try:
        return Slowdown.model_validate_json(text)
    except ValidationError:
        return None  # like the plan: it labels the verdict, the capture stands without it


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
