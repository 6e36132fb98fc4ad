"""verdict.json (DESIGN.md §3). Stable: other tools and tests read these names and meanings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from perfdiag.api.trigger import Slowdown

VERDICT_SCHEMA = "perfdiag.verdict/v1"

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
FindingCategory = Literal[
    "gpu_compute",
    "gpu_memory",
    "communication",
    "cuda_runtime",
    "python",
    "cpu_op",
    "dataloader",
    "gc",
    "host",
    "gpu_hardware",
    "network",
]


class StepTimes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    median: float = Field(description="Median over ranks of each rank's median step time, ms.")
    max: float = Field(description="Slowest rank's median step time, ms.")
    per_rank: dict[str, float] = Field(description="Global rank (as a string) → median step ms.")


class WindowInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start_step: int
    steps: int
    step_time_ms: StepTimes


class WorkerInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: int
    host: str | None = None
    pod: str | None = None
    state: WorkerState = "ok"


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
    schema_: Literal["perfdiag.verdict/v1"] = Field(default="perfdiag.verdict/v1", alias="schema")
    status: VerdictStatus
    summary: str
    window: WindowInfo
    workers: list[WorkerInfo]
    findings: list[Finding] = Field(default_factory=list)
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

    def sorted(self) -> Verdict:
        """The contract: findings sorted by severity, descending."""
        return self.model_copy(
            update={"findings": sorted(self.findings, key=lambda f: f.severity, reverse=True)}
        )

    def to_json(self) -> str:
        # Absent, not null, when nothing fired the capture: readers of the earlier v1 keep
        # seeing the fields they know.
        exclude = {"trigger"} if self.trigger is None else None
        return self.model_dump_json(by_alias=True, indent=2, exclude=exclude)
