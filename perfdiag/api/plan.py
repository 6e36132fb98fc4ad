"""The plan: what the hook in every rank should do next (DESIGN.md §3).

Writers (the CLI, the operator) build it with this model. The hook cannot import pydantic,
so it parses the same JSON with the standard library (`perfdiag.collector.hook_plan`); a test
keeps the two in agreement.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PlanAction = Literal["capture", "stacks"]
Activity = Literal["cpu", "cuda"]

MAX_CAPTURE_STEPS = 1000
DEFAULT_ACTIVITIES: tuple[Activity, ...] = ("cpu", "cuda")


class Plan(BaseModel):
    """A request to every rank: capture a window of steps, or dump Python stacks."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=128, description="New id = new request.")
    action: PlanAction = "capture"
    steps: int = Field(default=10, ge=1, le=MAX_CAPTURE_STEPS)
    activities: list[Activity] = Field(default_factory=lambda: list(DEFAULT_ACTIVITIES))
    python_stacks: bool = False
    deadline: datetime = Field(description="RFC3339; a plan past its deadline is ignored.")

    @classmethod
    def new(
        cls,
        *,
        action: PlanAction = "capture",
        steps: int = 10,
        activities: list[Activity] | None = None,
        python_stacks: bool = False,
        timeout_s: float = 600.0,
        plan_id: str | None = None,
    ) -> Plan:
        return cls(
            id=plan_id or uuid.uuid4().hex[:12],
            action=action,
            steps=steps,
            activities=activities if activities is not None else list(DEFAULT_ACTIVITIES),
            python_stacks=python_stacks,
            deadline=datetime.now(timezone.utc) + timedelta(seconds=timeout_s),
        )

    def to_json(self) -> str:
        data = self.model_dump(mode="json")
        data["deadline"] = self.deadline.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return json.dumps(data, sort_keys=True)

    def write_atomic(self, path: Path) -> None:
        """Write the plan file so that a reader never sees a partial file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".plan-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(self.to_json())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
