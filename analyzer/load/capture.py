"""Loading a capture (docs/design.md §3 layout) into one concatenated summary table.

Per-worker files are read in bulk by analyzer/load/worker_files.py; the summaries are concatenated
into a single Arrow table so the cross-worker stage never loops over ranks.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import pyarrow as pa
from pydantic import BaseModel, ValidationError

from perfdiag.analyzer.errors import NoCaptureError
from perfdiag.analyzer.load.worker_files import empty_summary, normalize_summary, read_worker_files
from perfdiag.api.breakdown import RankBreakdown
from perfdiag.api.limits import rank_problem
from perfdiag.api.plan import Plan
from perfdiag.api.schema import WorkerMeta
from perfdiag.api.trigger import Slowdown
from perfdiag.api.validation import validation_problems
from perfdiag.api.worker import WorkerStatus
from perfdiag.storage import Storage, StorageError, StorageNotFound, layout

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
    input_notes: list[str] = field(default_factory=list)
    """The inputs the analysis could not use and why (also in `notes`): verdict.json's notes."""
    unreadable: dict[int, str] = field(default_factory=dict)
    """Ranks whose summary exists but cannot be read → why (they count as missing)."""
    collectives: pa.Table | None = None
    """Collective calls of every rank (analyzer/compare/collectives.py), when the source has them."""
    trace_keys: dict[int, str] = field(default_factory=dict)
    """Rank → its Kineto trace key, for Kineto folders."""
    timeline_events: dict[int, Path] = field(default_factory=dict)
    """Rank → the events its timeline lanes show (analyzer/load/timeline_events.py), for
    Kineto folders: kept by the import in an Arrow IPC file under `scratch`, so that no trace is
    read twice and no rank's events stay in memory while the others are read."""
    scratch: tempfile.TemporaryDirectory[str] | None = None
    """The temporary folder of `timeline_events`; removed by `close()`."""
    breakdown: dict[int, RankBreakdown] = field(default_factory=dict)
    """GPU time breakdown per rank (HTA's definitions), for Kineto folders: breakdown.json."""
    hardware_keys: dict[int, str] = field(default_factory=dict)
    """Rank → its hardware.parquet key; read only for the ranks a finding blames on their GPU
    (analyzer/findings/throttle.py)."""

    @property
    def ranks(self) -> list[int]:
        return sorted(self.metas)

    def close(self) -> None:
        """Remove the temporary files the capture holds (`scratch`)."""
        self.timeline_events = {}
        if self.scratch is not None:
            self.scratch.cleanup()
            self.scratch = None


def load_capture(storage: Storage, progress: Progress | None = None, jobs: int = 1) -> Capture:
    """Read the capture under `storage`, or a folder of Kineto traces when there is none (read
    `jobs` trace files at a time)."""
    say = progress or (lambda _msg: None)
    worker_keys = storage.list(f"{layout.WORKERS}/")
    by_rank: dict[int, set[str]] = {}
    refused: dict[str, str] = {}  # worker folder → why it is not read
    for key in worker_keys:
        rank = layout.rank_of_worker_key(key)
        if rank is None:
            continue
        problem = rank_problem(rank)
        if problem is not None:
            refused.setdefault(key.rsplit("/", 1)[0], problem)
            continue
        by_rank.setdefault(rank, set()).add(key.rsplit("/", 1)[1])
    notes = [f"ignored {storage.uri_of(folder)}/: {problem}" for folder, problem in refused.items()]
    plan = _read_plan(storage, notes)
    if not by_rank:
        from perfdiag.analyzer.load.kineto_source import find_traces, load_kineto

        traces = [] if plan is not None else find_traces(storage)
        if traces:
            return load_kineto(storage, traces, say, jobs)
        if plan is not None:
            # What a run interrupted before any worker wrote a file leaves: nothing to analyse.
            raise NoCaptureError(
                f"no capture in {storage.uri}: {layout.PLAN} is there but no worker wrote a "
                f"file under {layout.WORKERS}/ (the run was interrupted before the window?)"
            )
        looked = (
            f"looked for {layout.PLAN}, {layout.WORKERS}/<rank>/{layout.SUMMARY} and Kineto "
            "traces (*.json, *.json.gz)"
        )
        raise NoCaptureError(f"no capture in {storage.uri}: {'; '.join([looked, *notes])}")

    files = read_worker_files(storage, by_rank, say)
    notes += files.notes
    return Capture(
        source=storage.uri,
        kind="capture",
        summary=files.summary,
        metas=files.metas,
        statuses=files.statuses,
        stacks=files.stacks,
        flight_recorders=files.flight_recorders,
        plan=plan,
        trigger=_read_trigger(storage, notes),
        notes=notes,
        input_notes=list(notes),
        unreadable=files.unreadable,
        hardware_keys={
            rank: layout.worker_key(rank, layout.HARDWARE)
            for rank, names in by_rank.items()
            if layout.HARDWARE in names
        },
    )


def _read_trigger(storage: Storage, notes: list[str]) -> Slowdown | None:
    # Like the plan: it labels the verdict, the capture stands without it.
    return _read_optional(storage, layout.TRIGGER, Slowdown, notes)


def _read_plan(storage: Storage, notes: list[str]) -> Plan | None:
    # The plan only labels the report; a capture with an odd plan is still analysable.
    return _read_optional(storage, layout.PLAN, Plan, notes)


M = TypeVar("M", bound=BaseModel)


def _read_optional(storage: Storage, key: str, model: type[M], notes: list[str]) -> M | None:
    """The document `key`, or None when it is absent or unusable (then a note says why)."""
    origin = storage.uri_of(key)
    try:
        text = storage.get_bytes(key)
    except StorageNotFound:
        return None
    except StorageError as exc:
        notes.append(f"ignored {origin}: {exc}")
        return None
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        notes.append(f"ignored {origin}: {validation_problems(exc, limit=1)}")
        return None
