"""Tunable thresholds of the analysis: each one's name, default, bounds and description.

The analyzer reads them as `Thresholds` (perfdiag.api.thresholds); a PerfDiagnosis sets
them in `spec.analysis`, whose model (perfdiag.api.diagnosis.Analysis) is these fields made
optional, without defaults, so the analyzer's defaults apply to what is unset. Kept free of
numpy/pyarrow imports so the operator can embed the model in the CRD cheaply. Field names are
snake_case in Python and camelCase in YAML/JSON (the CRD's convention); both are accepted on
input.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from perfdiag.api.stall import DEFAULT_MIN_S, DEFAULT_STEP_FACTOR

_CONFIG = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class ExpectedRanges(BaseModel):
    """Upper bounds of β (fraction of window time on the critical path) per category.

    A category whose β exceeds its bound on all or most ranks is a job-wide problem
    (`expected_range` finding). None means no bound.
    """

    model_config = _CONFIG

    python: float | None = Field(default=0.01, ge=0.0, le=1.0, description="Bound for Python.")
    gc: float | None = Field(
        default=0.01, ge=0.0, le=1.0, description="Bound for garbage collection."
    )
    dataloader: float | None = Field(
        default=0.01, ge=0.0, le=1.0, description="Bound for data loading."
    )
    cuda_runtime: float | None = Field(
        default=0.01, ge=0.0, le=1.0, description="Bound for the CUDA runtime."
    )
    communication: float | None = Field(
        default=0.30, ge=0.0, le=1.0, description="Bound for communication."
    )

    def bounds(self) -> dict[str, float]:
        return {name: value for name, value in self.model_dump().items() if value is not None}


def _cpu_ranges() -> ExpectedRanges:
    # A CPU-only job has no GPU compute to hide host work under: its Python and communication
    # time sit on the critical path by construction. The healthy demo (4 gloo ranks of a small
    # MLP on 2 cores) spends 63–74% of its window in gloo:all_reduce (which runs on its own
    # thread, over the backward pass) and ~11% in Python frames. Bounds are set where the time
    # is clearly abnormal rather than where a GPU job would be.
    return ExpectedRanges(
        python=0.45, gc=0.05, dataloader=0.15, cuda_runtime=0.10, communication=0.85
    )


class Thresholds(BaseModel):
    """How sure and how large a difference must be before the analyzer reports it."""

    model_config = _CONFIG

    report_severity: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="Findings below this severity (fraction of step time lost) are not reported.",
    )
    min_excess_fraction: float = Field(
        default=0.05,
        gt=0.0,
        le=1.0,
        description="Materiality: excess over peers' median, as a fraction of the step time.",
    )
    min_robust_z: float = Field(
        default=3.5, gt=0.0, description="Robust z-score (median/MAD) an outlier must reach."
    )
    min_ratio: float = Field(
        default=1.25, ge=1.0, description="Ratio of a rank's time to its peers' median."
    )
    # A floor under the spread, so that a few near-identical peers do not make every
    # difference significant.
    noise_floor: float = Field(
        default=0.10,
        ge=0.0,
        description="Smallest spread assumed, as a fraction of the peers' median (run-to-run "
        "jitter).",
    )
    min_persistence: float = Field(
        default=0.65,
        gt=0.0,
        le=1.0,
        description="Fraction of the window's steps in which an outlier must show.",
    )
    step_excess_factor: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="A step counts as outlying when its excess reaches this share of the "
        "materiality threshold (and half of the window's mean excess).",
    )
    dominant_function_share: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="A slow worker's top function is also reported as a function_anomaly when "
        "it accounts for at least this share of the worker's excess.",
    )
    expected_range_rank_fraction: float = Field(
        default=0.75,
        gt=0.0,
        le=1.0,
        description="Share of ranks that must exceed a category's expected range for a "
        "job-wide expected_range finding.",
    )
    expected_ranges_gpu: ExpectedRanges = Field(
        default_factory=ExpectedRanges, description="Expected ranges for jobs with GPUs."
    )
    expected_ranges_cpu: ExpectedRanges = Field(
        default_factory=_cpu_ranges, description="Expected ranges for CPU-only jobs."
    )
    hardware_min_deviation: float = Field(
        default=0.10,
        gt=0.0,
        description="Relative deviation of a governing resource's mean (clock, bandwidth) "
        "from peers that counts as abnormal.",
    )
    role_split_jaccard: float = Field(
        default=0.8,
        gt=0.0,
        le=1.0,
        description="Ranks that each run significant functions the others never run, and whose "
        "sets of significant functions are less similar than this (Jaccard), form different "
        "peer groups (roles).",
    )
    stuck_after_seconds: float = Field(
        default=DEFAULT_MIN_S,
        gt=0.0,
        description="A live worker whose step has not advanced for this long is stuck.",
    )
    stuck_after_steps: float = Field(
        default=DEFAULT_STEP_FACTOR,
        gt=0.0,
        description="... or for this many median step times, whichever is longer.",
    )
