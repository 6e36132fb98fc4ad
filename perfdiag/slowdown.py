"""The slowdown trigger (EROICA's online mode), as pure decisions on the ranks' heartbeats.

Each rank's hook reports, about once a second, the mean and the longest duration of its last N
steps (a `watch` plan sets N). The rule judges the mean without the longest step, so that one
long step (a checkpoint, a stall already over) does not fire it, while a slowdown of every
step, or of every few steps, does. A rank's baseline is the shortest such mean among its reports
of the last HORIZON_SPANS × N steps; the rule fires when a rank's mean is `percent` above its
baseline in `confirmations` consecutive reports. The local runner and the operator feed it the
same reports.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from perfdiag.api.trigger import Slowdown, SlowdownRule

HORIZON_SPANS = 20
"""The baseline is the shortest mean of the last HORIZON_SPANS × N steps: recent, so that a job
that settled at a new speed for that long is judged against it."""


@dataclass(frozen=True)
class StepReport:
    """What one heartbeat says about a rank's step time."""

    rank: int
    step: int
    mean_step_ms: float
    mean_steps: int
    max_step_ms: float | None = None

    @property
    def typical_step_ms(self) -> float:
        """The mean without the longest step (the mean itself when that is unknown)."""
        n = self.mean_steps
        if self.max_step_ms is None or n < 2:
            return self.mean_step_ms
        return max((self.mean_step_ms * n - self.max_step_ms) / (n - 1), 0.0)


@dataclass
class _RankTrack:
    reports: deque[tuple[int, float]] = field(default_factory=deque)  # (step, mean ms)
    last_step: int = -1
    over: int = 0


@dataclass(frozen=True)
class RankBaseline:
    rank: int
    step: int
    mean_step_ms: float
    baseline_step_ms: float


class SlowdownWatch:
    """Feeds on reports; `observe` returns the Slowdown that fires the rule, once."""

    def __init__(self, rule: SlowdownRule, *, after_step: int = 0) -> None:
        self.rule = rule
        self.after_step = after_step
        self._tracks: dict[int, _RankTrack] = {}

    def restart(self, after_step: int) -> None:
        """Forget everything: a new baseline from means of steps after `after_step` (a capture
        window's profiled steps are slower and must not count either way)."""
        self.after_step = after_step
        self._tracks.clear()

    def observe(self, report: StepReport) -> Slowdown | None:
        rule = self.rule
        if (
            report.mean_steps != rule.baseline_steps
            or report.typical_step_ms <= 0
            or report.step - report.mean_steps < self.after_step
        ):
            return None
        track = self._tracks.setdefault(report.rank, _RankTrack())
        if report.step <= track.last_step:
            return None  # the same report again (the step has not advanced)
        track.last_step = report.step
        horizon = HORIZON_SPANS * rule.baseline_steps
        while track.reports and track.reports[0][0] < report.step - horizon:
            track.reports.popleft()
        best = min(track.reports, key=lambda r: r[1]) if track.reports else None
        current = report.typical_step_ms
        track.reports.append((report.step, current))
        if best is None or current < rule.factor * best[1]:
            track.over = 0
            return None
        track.over += 1
        if track.over < rule.confirmations:
            return None
        return Slowdown(
            rank=report.rank,
            step=report.step,
            mean_step_ms=current,
            baseline_step_ms=best[1],
            baseline_step=best[0],
            steps=rule.baseline_steps,
            threshold_percent=rule.percent,
        )

    def baselines(self) -> list[RankBaseline]:
        """Each rank's latest mean and its baseline (for progress lines and status)."""
        out = []
        for rank, track in sorted(self._tracks.items()):
            if track.reports:
                step, mean = track.reports[-1]
                out.append(RankBaseline(rank, step, mean, min(m for _, m in track.reports)))
        return out
