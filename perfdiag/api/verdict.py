"""verdict.json (docs/design.md §3). Stable: other tools and tests read these names and meanings."""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfdiag.api.ranks import Run, merge_runs, rank_runs, run_count
from perfdiag.api.trigger import Slowdown

VerdictSchema = Literal["perfdiag.verdict/v1"]
VERDICT_SCHEMA: VerdictSchema = get_args(VerdictSchema)[0]

VerdictStatus = Literal["healthy", "degraded", "hang", "incomplete"]
WorkerState = Literal["ok", "missing", "stuck"]
FindingKind = Literal[
    "slow_worker",
    "function_anomaly",
    "expected_range",
    "hang",
    "hardware",
    "imbalance",
    "slow_node",  # added in v1: most ranks of one machine slow together, for one cause
]
WorkCategory = Literal[
    "gpu_compute",
    "gpu_memory",
    "communication",
    "cuda_runtime",
    "python",
    "cpu_op",
    "dataloader",
    "gc",
]
"""Taxonomy categories of the work an event is charged to on the critical path (DESIGN.md §4,
perfdiag.api.taxonomy), each one a cause a finding can name; perfdiag.api.schema.Category adds those of
the events that are no known kind of work."""
FindingCategory = Literal[WorkCategory, "host", "gpu_hardware", "network"]
"""What a finding blames: a category of work, or the host, GPU or network beneath it. Its order
is the CRD's (status.verdict.topFindings[].category)."""
FINDING_CATEGORIES: tuple[FindingCategory, ...] = get_args(FindingCategory)


MAX_WORKER_ROWS = 1000
"""verdict.json lists at most this many workers one by one (`workers`, `per_rank`): a larger
capture lists those a finding names and those not ok, the others as ranges (`worker_ranges`)."""
MAX_FINDING_RANKS = 1000
"""A finding or observation names at most this many ranks in `ranks` (its evidence has them all
as runs, `rank_runs`, and their count, `ranks_total`)."""


class StepTimes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    median: float = Field(description="Median over ranks of each rank's median step time, ms.")
    max: float = Field(description="Slowest rank's median step time, ms.")
    per_rank: dict[str, float] = Field(
        description="Global rank (as a string) → median step ms: every analysed rank, or, in a "
        "capture of more than MAX_WORKER_ROWS workers, those with a row in `workers` and the "
        "slowest (`omitted` counts the others)."
    )
    omitted: int = Field(
        default=0,
        ge=0,
        description="Analysed ranks whose median step is not in `per_rank` (added in v1; "
        "absent when 0).",
    )


class WindowInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start_step: int
    steps: int
    step_time_ms: StepTimes


class WorkerInfo(BaseModel):
    """One worker the capture holds a file of (its summary or trace, status, an unreadable
    file), or one with a state of its own (stuck)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(description="Global rank.")
    host: str | None = Field(default=None, description="Its host (node), when a file names it.")
    pod: str | None = Field(default=None, description="Its pod, when a file names it.")
    state: WorkerState = Field(
        default="ok",
        description="ok: analysed; missing: not analysed (its window failed, its file is "
        "unreadable, it stopped before its summary; the report and the notes say why); stuck: "
        "its training step stopped advancing.",
    )


class RankRange(BaseModel):
    """Consecutive ranks first … last, expected but missing for the same reason."""

    model_config = ConfigDict(extra="forbid")

    first: int = Field(ge=0, description="First rank of the range.")
    last: int = Field(ge=0, description="Last rank of the range, inclusive (first for one rank).")
    reason: str = Field(description="Why these ranks were not analysed.")

    @model_validator(mode="after")
    def _ordered(self) -> RankRange:
        if self.last < self.first:
            raise ValueError(f"last rank {self.last} is below first rank {self.first}")
        return self

    def ranks(self) -> range:
        return range(self.first, self.last + 1)


class WorkerRange(BaseModel):
    """Consecutive ranks first … last in one state, none of them with a row in `workers`."""

    model_config = ConfigDict(extra="forbid")

    first: int = Field(ge=0, description="First rank of the range.")
    last: int = Field(ge=0, description="Last rank of the range, inclusive (first for one rank).")
    state: WorkerState = Field(description="The state of every rank of the range.")

    @model_validator(mode="after")
    def _ordered(self) -> WorkerRange:
        if self.last < self.first:
            raise ValueError(f"last rank {self.last} is below first rank {self.first}")
        return self


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: FindingKind
    category: FindingCategory
    function: str | None = None
    ranks: list[int]
    severity: float = Field(ge=0.0, le=1.0, description="Estimated fraction of step time lost.")
    evidence: dict[str, Any] = Field(default_factory=dict)
    message: str


class Verdict(BaseModel):
    schema_: VerdictSchema = Field(default=VERDICT_SCHEMA, alias="schema")
    status: VerdictStatus
    summary: str
    window: WindowInfo
    workers: list[WorkerInfo] = Field(
        description="One row per expected rank that the capture holds a file of (analysed, or "
        "missing with a reason of its own) or that is stuck, ascending by rank; the expected "
        "ranks with no file at all are in `missing`. When there are more than MAX_WORKER_ROWS "
        "such ranks, rows only for the ranks a finding names and those not ok (at most "
        "MAX_WORKER_ROWS), the others in `worker_ranges`."
    )
    worker_ranges: list[WorkerRange] = Field(
        default_factory=list,
        description="The ranks of `workers` that have no row there (a capture of more than "
        "MAX_WORKER_ROWS workers), as ranges of consecutive ranks in one state, ascending and "
        "disjoint; with `workers` and `missing` they cover every expected rank once (added in "
        "v1; absent when empty).",
    )
    missing: list[RankRange] = Field(
        default_factory=list,
        description="Expected ranks (the caller's, a stated world size) of which the capture "
        "holds no file at all, as ranges of consecutive ranks, ascending and disjoint; none of "
        "them has a row in `workers`. The verdict stays as small as the capture when a job "
        "claims far more ranks than were captured (added in v1; absent when empty).",
    )
    findings: list[Finding] = Field(
        default_factory=list,
        description="What makes a part of the job (a rank, a node, a link) slower or stuck "
        "against its peers or its own past, most severe first: any one makes the status "
        "`degraded`.",
    )
    observations: list[Finding] = Field(
        default_factory=list,
        description="Whole-job efficiency observations, kind `expected_range`: every rank alike "
        "spends more of its step in a category than a well-running job of its kind (Python "
        "overhead, kernel launches, communication). Advice about the job as a whole, never a "
        "reason for `degraded` (added in v1; absent when empty).",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="What the analysis saw about the conditions of the window that names no "
        "rank, e.g. an oversubscribed host (added in v1).",
    )
    trigger: Slowdown | None = Field(
        default=None,
        description="The slowdown that fired this capture; absent for a capture on request "
        "(added in v1).",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _ranges_apart(self) -> Verdict:
        rows = sorted(w.rank for w in self.workers)
        for field_name, ranges in (
            ("missing", self.missing),
            ("worker_ranges", self.worker_ranges),
        ):
            previous = -1
            for item in ranges:
                if item.first <= previous:
                    raise ValueError(
                        f"{field_name} ranks {item.first}-{item.last} overlap or precede the "
                        "range before"
                    )
                previous = item.last
                at = bisect_left(rows, item.first)
                if at < len(rows) and rows[at] <= item.last:
                    raise ValueError(f"rank {rows[at]} is both in workers and in {field_name}")
        spans = [(r.first, r.last) for r in self.worker_ranges]
        spans += [(m.first, m.last) for m in self.missing]
        if run_count(merge_runs(spans)) != run_count(spans):
            raise ValueError("a rank is both in worker_ranges and in missing")
        return self

    def rank_runs(self, state: WorkerState) -> list[Run]:
        """The ranks in `state` as runs of consecutive ranks (first, last), ascending: the rows
        of `workers` and the `worker_ranges` in that state, and for "missing" the ranges of
        `missing` too."""
        runs = [
            *rank_runs(w.rank for w in self.workers if w.state == state),
            *((r.first, r.last) for r in self.worker_ranges if r.state == state),
        ]
        if state == "missing":
            runs += [(m.first, m.last) for m in self.missing]
        return merge_runs(runs)

    def expected_ranks(self) -> int:
        """How many ranks the verdict expected: its rows and its ranges."""
        return (
            len(self.workers)
            + sum(r.last - r.first + 1 for r in self.worker_ranges)
            + sum(m.last - m.first + 1 for m in self.missing)
        )

    def sorted(self) -> Verdict:
        """The contract: findings sorted by severity, descending."""
        return self.model_copy(
            update={
                "findings": sorted(self.findings, key=lambda f: f.severity, reverse=True),
                "observations": sorted(self.observations, key=lambda f: f.severity, reverse=True),
            }
        )

    def to_json(self) -> str:
        # Absent, not null or empty, when nothing fired the capture or no expected rank is
        # without a file: readers of the earlier v1 keep seeing the fields they know.
        exclude: dict[str, Any] = {"trigger": True} if self.trigger is None else {}
        for name in ("missing", "observations", "worker_ranges"):
            if not getattr(self, name):
                exclude[name] = True
        if not self.window.step_time_ms.omitted:
            exclude["window"] = {"step_time_ms": {"omitted"}}
        return self.model_dump_json(by_alias=True, indent=2, exclude=exclude or None)
