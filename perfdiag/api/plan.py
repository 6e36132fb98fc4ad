"""The plan: what the hook in every rank should do next (docs/design.md §3).

Writers (the CLI, the operator) build it with this model and write it in one canonical form,
`Plan.to_json()`, the only form the hook reads: the hook cannot import pydantic and reads that
form strictly with the standard library (`perfdiag.collector.hook.plan`); a test checks that it
reads back every plan as written.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PlanAction = Literal["capture", "stacks", "watch"]
Activity = Literal["cpu", "cuda"]

MAX_CAPTURE_STEPS = 1000
MAX_START_STEP = 10**12  # above any real step count; bounds what the hook must parse
DEFAULT_ACTIVITIES: tuple[Activity, ...] = ("cpu", "cuda")


class Plan(BaseModel):
    """A request to every rank: capture a window of steps, dump Python stacks, or (`watch`)
    report the mean step time over the last `steps` steps in the heartbeats, which a
    slowdown trigger compares with its baseline."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=128, description="New id = new request.")
    action: PlanAction = "capture"
    steps: int = Field(
        default=10,
        ge=1,
        le=MAX_CAPTURE_STEPS,
        description="capture: steps analysed; watch: steps per reported mean step time",
    )
    activities: list[Activity] = Field(default_factory=lambda: list(DEFAULT_ACTIVITIES))
    python_stacks: bool = False
    deadline: datetime = Field(description="RFC3339; a plan past its deadline is ignored.")
    start_step: int | None = Field(
        default=None,
        ge=0,
        le=MAX_START_STEP,
        description=(
            "Begin the window at this global step, so that every rank captures the same steps "
            "whenever it saw the plan; a rank already past it begins at its next step. "
            "Absent: each rank begins at its next step."
        ),
    )

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
        start_step: int | None = None,
    ) -> Plan:
        return cls(
            id=plan_id or uuid.uuid4().hex[:12],
            action=action,
            steps=steps,
            activities=activities if activities is not None else list(DEFAULT_ACTIVITIES),
            python_stacks=python_stacks,
            deadline=datetime.now(timezone.utc) + timedelta(seconds=timeout_s),
            start_step=start_step,
        )

    def to_json(self) -> str:
        """The canonical form: one line of ASCII JSON, keys sorted, `start_step` left out when
        absent (older hooks know no such field), the deadline in UTC to the second
        (YYYY-MM-DDTHH:MM:SSZ; a deadline without a UTC offset is taken as UTC)."""
        data = self.model_dump(mode="json", exclude_none=True)
        deadline = self.deadline
        if deadline.tzinfo is None:
            deadline = deadline.replace(tzinfo=timezone.utc)
        utc = deadline.astimezone(timezone.utc).replace(microsecond=0, tzinfo=None)
        data["deadline"] = f"{utc.isoformat()}Z"  # isoformat: the year always has 4 digits
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


def start_step_ahead(current_step: int, steps_per_second: float | None, lead_seconds: float) -> int:
    """The step a window should begin at so that every rank has seen the plan before reaching
    it: `lead_seconds` (how long the plan takes to reach every rank, plus the staleness of the
    step counts the writer saw) at the fastest rank's rate, and at least 2 steps ahead."""
    rate = steps_per_second if steps_per_second is not None and steps_per_second > 0 else 0.0
    return current_step + max(2, math.ceil(rate * lead_seconds) + 1)


POD_PLANS = "pod-plans"
"""Where the operator keeps each target pod's plan in storage, beside the captures of the pod's
namespace (`<storage>/<namespace>/pod-plans/<pod uid>.json`): the plan annotation's value, which
the pod's agent reads without waiting for the kubelet to refresh the downward-API file. Keyed by
the pod's uid, so that a pod re-created under the same name never reads an older pod's plan."""


def pod_plan_key(pod_uid: str) -> str:
    """The storage key (under the namespace's storage) of the plan of the pod with this uid."""
    if not pod_uid or "/" in pod_uid or pod_uid in (".", ".."):
        raise ValueError(f"not a pod uid: {pod_uid!r}")
    return f"{POD_PLANS}/{pod_uid}.json"


PLAN_SUCCESSORS = "plan-successors"
"""Where the operator puts the plan that follows a `watch` plan on every pod holding it
(`<storage>/<namespace>/plan-successors/<watch plan id>.json`): an agent whose pod's plan
object holds that watch plan, and that was told to (`perfdiag agent --plan-successors`), reads
this object too and gives its hooks the plan found there. The capture that ends a watch must
reach every pod within its lead; this way it is one write whatever the pods' count, where a
plan object per pod is one write per pod."""


PLAN_SUCCESSORS_ENV = "PERFDIAG_PLAN_SUCCESSORS"
"""Set to 1 by the operator's webhook on the agents it injects: they follow plan successors, so
the operator may arm them with one write (`perfdiag agent --plan-successors`)."""


def plan_successor_key(watch_plan_id: str) -> str:
    """The storage key (under the namespace's storage) of the plan that follows the watch plan
    with this id on every pod holding it."""
    if not watch_plan_id or "/" in watch_plan_id or watch_plan_id in (".", ".."):
        raise ValueError(f"not a plan id: {watch_plan_id!r}")
    return f"{PLAN_SUCCESSORS}/{watch_plan_id}.json"


WATCH_PLAN_DAYS = 30
"""A watch plan lasts as long as the training; its deadline only bounds it (and, while it sits
on the pods, keeps other diagnoses of the job waiting)."""


def watch_deadline(now: datetime) -> datetime:
    """The deadline of a `watch` plan made at `now`."""
    return now + timedelta(days=WATCH_PLAN_DAYS)
