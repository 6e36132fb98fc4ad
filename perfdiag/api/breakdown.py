"""breakdown.json: each rank's GPU time split the way HTA's temporal breakdown splits it.

Written by `perfdiag analyze … --out OUT` for folders of Kineto traces, so the numbers can be
held side by side with Holistic Trace Analysis' `get_temporal_breakdown` (docs/engine.md,
"GPU time breakdown", says how each share is computed and where the two tools differ).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BREAKDOWN_SCHEMA = "perfdiag.breakdown/v1"


class RankBreakdown(BaseModel):
    """Shares of the rank's GPU span; null shares: the rank has no GPU activity."""

    model_config = ConfigDict(extra="forbid")

    span_s: float = Field(
        ge=0.0,
        description="From the start of the rank's first GPU activity to the end of its last, "
        "seconds (HTA's 'kernel_time'); 0 without GPU activity.",
    )
    gpu_compute: float | None = Field(
        ge=0.0, le=1.0, description="Time some compute kernel runs / span (HTA 'compute_time')."
    )
    communication: float | None = Field(
        ge=0.0,
        le=1.0,
        description="Time an NCCL kernel runs and no compute kernel or memcpy/memset does / span.",
    )
    gpu_memory: float | None = Field(
        ge=0.0,
        le=1.0,
        description="Time a memcpy/memset runs and no compute kernel does / span.",
    )
    gpu_other: float | None = Field(
        ge=0.0,
        le=1.0,
        description="The rest of HTA's non-compute time: CUDA synchronization records on the GPU "
        "while nothing above runs / span. communication + gpu_memory + gpu_other is HTA's "
        "'non_compute_time'.",
    )
    idle: float | None = Field(
        ge=0.0, le=1.0, description="Time no GPU activity runs / span (HTA 'idle_time')."
    )


class Breakdown(BaseModel):
    schema_: Literal["perfdiag.breakdown/v1"] = Field(
        default="perfdiag.breakdown/v1", alias="schema"
    )
    ranks: dict[str, RankBreakdown] = Field(description="Global rank (as a string) → breakdown.")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)
