"""`workers/<rank>/status.json`: heartbeat and progress of one worker (DESIGN.md §3)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

WorkerPhase = Literal["dormant", "armed", "capturing", "processing", "done", "failed"]


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
