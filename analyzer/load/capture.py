"""The capture the cross-worker stage reads (docs/design.md §3 layout), once loaded
(analyzer/load/capture_folder.py, analyzer/load/kineto_source.py), and the notes one analysis of
it gathers.

Per-worker files are read in bulk by analyzer/load/worker_files.py; the summaries are concatenated
into a single Arrow table so the cross-worker stage never loops over ranks.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from perfdiag.analyzer.load.worker_table import WorkerMetas, WorkerStatuses
from perfdiag.api.breakdown import RankBreakdown
from perfdiag.api.plan import Plan
from perfdiag.api.trigger import Slowdown
from perfdiag.storage import layout


@dataclass
class Capture:
    """Everything the cross-worker stage reads, for the ranks that produced it."""

    source: str
    kind: Literal["capture", "kineto"]
    summary: pa.Table
    metas: WorkerMetas
    """Rank → WorkerMeta of the analysed ranks (given as a dict, kept as columns)."""
    statuses: WorkerStatuses = field(default_factory=lambda: WorkerStatuses.of({}))
    stacks: dict[int, Any] = field(default_factory=dict)
    flight_recorders: dict[int, bytes] = field(default_factory=dict)
    """Rank → torch Flight Recorder pickle (flight_recorder.pkl), when the hook dumped one."""
    plan: Plan | None = None
    trigger: Slowdown | None = None
    notes: list[str] = field(default_factory=list)
    """What loading the capture found to say: the first of an analysis' notes (`Notes.of`)."""
    input_notes: list[str] = field(default_factory=list)
    """The inputs loading could not use and why (also in `notes`); the timeline adds those it
    meets (analyzer/report/timeline.py)."""
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
    hardware_ranks: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    """Ranks whose folder holds a hardware.parquet, ascending; read only for the ranks a
    finding blames on their GPU (analyzer/findings/throttle.py)."""

    event_ranks: NDArray[np.int64] | None = None
    """Ranks whose folder holds an events.parquet, ascending (None: not listed, e.g. a capture
    made in memory): the others' raw events are not asked for, one request each."""

    def __post_init__(self) -> None:
        # Callers with a few ranks (Kineto folders, tests) give dicts of objects.
        self.metas = WorkerMetas.of(self.metas)
        self.statuses = WorkerStatuses.of(self.statuses)

    @property
    def ranks(self) -> NDArray[np.int64]:
        """The analysed ranks, ascending."""
        return self.metas.ranks

    def may_have_events(self, rank: int) -> bool:
        """Whether the rank's events.parquet may be in the capture."""
        if self.event_ranks is None:
            return True
        at = int(np.searchsorted(self.event_ranks, rank))
        return at < len(self.event_ranks) and bool(self.event_ranks[at] == rank)

    def hardware_key(self, rank: int) -> str | None:
        at = int(np.searchsorted(self.hardware_ranks, rank))
        found = at < len(self.hardware_ranks) and self.hardware_ranks[at] == rank
        return layout.worker_key(rank, layout.HARDWARE) if found else None

    def close(self) -> None:
        """Remove the temporary files the capture holds (`scratch`)."""
        self.timeline_events = {}
        if self.scratch is not None:
            self.scratch.cleanup()
            self.scratch = None


@dataclass
class Notes:
    """The notes of one analysis, gathered as its stages run: `shown` in the report; `inputs`,
    the inputs the analysis could not use and why, in verdict.json's notes too."""

    shown: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, capture: Capture) -> Notes:
        """The notes of an analysis of `capture`, starting with what loading it found."""
        return cls(list(capture.notes), list(capture.input_notes))

    def add(self, *notes: str) -> None:
        """Notes for the report."""
        self.shown.extend(notes)

    def add_first(self, note: str) -> None:
        """A note the report says before the others (the host's condition)."""
        self.shown.insert(0, note)

    def add_input(self, note: str) -> None:
        """An input the analysis could not use (once, however many readers met it)."""
        if note not in self.inputs:
            self.inputs.append(note)
