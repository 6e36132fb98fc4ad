"""When is a rank stuck? One decision shared by `perfdiag run`, the operator and the analyzer.

A rank is stuck when its training step has not advanced for well past the median step time:
`limit = clamp(step_factor × median step, min_s, max_s)`. The lower bound keeps a slow step
(a checkpoint, a long evaluation) from being called a hang; the upper bound makes sure a job
with minute-long steps is still diagnosed before the collective library's own watchdog kills it
(NCCL's default timeout is 10 min). A rank that has not counted a step yet is never stuck by
this rule (there is no step time to judge it by). Plain data and functions: no I/O, no numpy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

DEFAULT_MIN_S = 60.0
DEFAULT_STEP_FACTOR = 20.0
DEFAULT_MAX_S = 480.0
HEARTBEAT_STALE_S = 15.0
"""A heartbeat older than this (the hook writes one a second) means the process is not
answering: gone, frozen, or holding the GIL."""


@dataclass(frozen=True)
class StallPolicy:
    min_s: float = DEFAULT_MIN_S
    step_factor: float = DEFAULT_STEP_FACTOR
    max_s: float = DEFAULT_MAX_S

    def limit_s(self, median_step_s: float | None) -> float:
        """Seconds without a new step after which a rank is stuck."""
        by_steps = self.step_factor * median_step_s if median_step_s else 0.0
        return min(max(self.min_s, by_steps), max(self.max_s, self.min_s))


@dataclass(frozen=True)
class RankProgress:
    """What a heartbeat (spool heartbeat.json, or a worker's status.json) says about a rank."""

    rank: int
    step: int
    last_step_unix: float | None
    """When its latest step began (None: no step counted yet)."""
    updated_unix: float | None
    """When the heartbeat was written."""
    exited: bool = False


@dataclass(frozen=True)
class StuckRank:
    rank: int
    step: int
    stalled_s: float
    """Seconds since its step last advanced."""
    silent: bool
    """Its heartbeats stopped too (no stack dump can be expected from it)."""


def stalled_s(progress: RankProgress, now: float | None = None) -> float | None:
    """Seconds the rank's step has not advanced, as of `now` (default: its own heartbeat's
    time, which is what an analysis after the fact must use)."""
    if progress.last_step_unix is None:
        return None
    at = now if now is not None else progress.updated_unix
    if at is None:
        return None
    return max(0.0, at - progress.last_step_unix)


def stuck_ranks(
    progress: Iterable[RankProgress],
    limit_s: float,
    now: float | None = None,
    *,
    stale_s: float = HEARTBEAT_STALE_S,
) -> dict[int, StuckRank]:
    """Ranks stalled for at least `limit_s`. With `now` (a live decision) a rank whose
    heartbeat is older than `stale_s` counts as silent; without it the heartbeat's own time
    is used (offline analysis). Ranks whose process exited are never stuck."""
    found: dict[int, StuckRank] = {}
    for item in progress:
        if item.exited:
            continue
        stalled = stalled_s(item, now)
        if stalled is None or stalled < limit_s:
            continue
        silent = (
            now is not None and item.updated_unix is not None and now - item.updated_unix > stale_s
        )
        found[item.rank] = StuckRank(item.rank, item.step, stalled, silent)
    return found


@dataclass
class StepClock:
    """Median step time of a job, learnt from successive heartbeats of its ranks.

    `observe` takes each rank's (step, last_step_unix) whenever it is read; every advance
    gives (Δ time / Δ steps) as one step-time sample, kept in a bounded window per rank."""

    keep: int = 64
    _last: dict[int, tuple[int, float]] = field(default_factory=dict)
    _samples: dict[int, list[float]] = field(default_factory=dict)

    def observe(self, progress: Iterable[RankProgress]) -> None:
        for item in progress:
            if item.last_step_unix is None:
                continue
            previous = self._last.get(item.rank)
            self._last[item.rank] = (item.step, item.last_step_unix)
            if previous is None or item.step <= previous[0]:
                continue
            per_step = (item.last_step_unix - previous[1]) / (item.step - previous[0])
            if per_step > 0 and math.isfinite(per_step):
                samples = self._samples.setdefault(item.rank, [])
                samples.append(per_step)
                del samples[: -self.keep]

    def median_step_s(self) -> float | None:
        everything = [s for samples in self._samples.values() for s in samples]
        return statistics.median(everything) if everything else None


def progress_from_mapping(rank: int, data: Mapping[str, object]) -> RankProgress:
    """A RankProgress from a heartbeat/status JSON object (tolerant of missing fields)."""

    def number(key: str) -> float | None:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)

    step = data.get("step")
    return RankProgress(
        rank=rank,
        step=step if isinstance(step, int) and not isinstance(step, bool) else 0,
        last_step_unix=number("last_step_unix"),
        updated_unix=number("updated_unix"),
        exited=data.get("exited") is True,
    )
