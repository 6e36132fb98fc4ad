"""`workers/<rank>/status.json`: heartbeat and progress of one worker (docs/design.md §3)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

WorkerPhase = Literal["dormant", "armed", "capturing", "processing", "done", "failed"]


class BlockedIn(BaseModel):
    """Where the training thread was when its step was late (the hook's heartbeat)."""

    model_config = ConfigDict(extra="ignore")

    file: str
    line: int
    function: str
    collective: str | None = Field(
        default=None, description="The public torch.distributed call it was inside, if any."
    )


class WorkerStatus(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: int
    host: str | None = None
    pod: str | None = None
    plan_id: str | None = None
    phase: WorkerPhase = "dormant"
    step: int = Field(default=0, description="Last training step the hook saw.")
    last_step_unix: float | None = Field(default=None, description="When that step ended.")
    updated_unix: float
    files: list[str] = Field(default_factory=list, description="Keys written for this window.")
    error: str | None = None
    blocked_in: BlockedIn | None = Field(
        default=None,
        description="Set while the step is late (≥ 2 s): the training thread's innermost frame.",
    )
    mean_step_ms: float | None = Field(
        default=None, ge=0.0, description="Mean duration of the last `mean_steps` steps, ms."
    )
    max_step_ms: float | None = Field(
        default=None, ge=0.0, description="The longest of those steps, ms."
    )
    mean_steps: int | None = Field(
        default=None,
        ge=1,
        description="Steps in that mean (a `watch` plan's steps, else the hook's default).",
    )
