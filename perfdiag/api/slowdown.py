"""The slowdown trigger (EROICA's online mode), as pure decisions on the ranks' heartbeats.

Each rank's hook reports, about once a second, the mean and the longest duration of its last N
steps (a `watch` plan sets N). The rule judges the mean without the longest step, so that one
long step (a checkpoint, a stall already over) does not fire it, while a slowdown of every
step, or of every few steps, does. A rank's baseline is the shortest such mean among its reports
of the last HORIZON_SPANS × N steps (and at least the last HORIZON_REPORTS reports); the rule fires when a rank's mean is `percent` above its
baseline in `confirmations` consecutive reports. The local runner and the operator feed it the
same reports.

The rule's state for one series of reports is a `Track`: small, immutable and serializable
(the operator keeps the job's track in the PerfDiagnosis status between passes). `advance`
feeds it one report; `SlowdownWatch` keeps a track per rank (the local runner), `advance_job`
one track for the whole job, fed with its slowest rank (the operator).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from perfdiag.api.trigger import Slowdown, SlowdownRule

HORIZON_SPANS = 20
HORIZON_REPORTS = 20
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


@dataclass(frozen=True)
class Track:
    """The rule's state for one series of reports.

    `minima` holds the candidates for the baseline among the reports of the horizon, as
    (step, mean without the longest step), in step order with ascending means: a report
    removes the earlier ones it undercuts (they can never be the baseline again). The first is
    the baseline (the shortest mean of the horizon, the earliest of equals), the last the
    latest report. `over`: consecutive reports over the threshold."""

    minima: tuple[tuple[int, float], ...] = ()
    last_step: int = -1
    over: int = 0

    @property
    def baseline(self) -> tuple[int, float] | None:
        return self.minima[0] if self.minima else None

    @property
    def latest(self) -> tuple[int, float] | None:
        return self.minima[-1] if self.minima else None


def counts(report: StepReport, rule: SlowdownRule, after_step: int = 0) -> bool:
    """Whether the rule judges this report: a mean of the rule's length, of steps after
    `after_step` (the reports of other lengths come before the hook took the watch plan)."""
    return (
        report.mean_steps == rule.baseline_steps
        and report.typical_step_ms > 0
        and report.step - report.mean_steps >= after_step
    )


def advance(
    track: Track,
    report: StepReport,
    rule: SlowdownRule,
    *,
    after_step: int = 0,
    max_minima: int | None = None,
) -> tuple[Track, Slowdown | None]:
    """The track after one report, and the Slowdown when the rule fires on it (on every report
    from the `confirmations`-th consecutive one over the threshold on). A report the rule does
    not judge, or a repeat (its step has not advanced), leaves the track as it was.

    `max_minima` bounds the candidates kept (a status must stay small): beyond it the oldest
    go, so a job whose mean rose in more than that many consecutive reports is judged against
    a later baseline."""
    if not counts(report, rule, after_step) or report.step <= track.last_step:
        return track, None
    # At least HORIZON_REPORTS reports back too: reports come seconds apart (the operator's
    # passes), so a fast job can move more than the horizon's steps between two of them.
    gap = report.step - track.last_step if track.last_step >= 0 else 0
    horizon_start = report.step - max(HORIZON_SPANS * rule.baseline_steps, HORIZON_REPORTS * gap)
    minima = [m for m in track.minima if m[0] >= horizon_start]
    best = minima[0] if minima else None
    current = report.typical_step_ms
    while minima and minima[-1][1] > current:
        minima.pop()
    minima.append((report.step, current))
    if max_minima is not None and len(minima) > max_minima:
        minima = minima[len(minima) - max_minima :]
    if best is None or current < rule.factor * best[1]:
        return Track(tuple(minima), report.step, 0), None
    new = Track(tuple(minima), report.step, track.over + 1)
    if new.over < rule.confirmations:
        return new, None
    return new, Slowdown(
        rank=report.rank,
        step=report.step,
        mean_step_ms=current,
        baseline_step_ms=best[1],
        baseline_step=best[0],
        steps=rule.baseline_steps,
        threshold_percent=rule.percent,
    )


def job_report(reports: Iterable[StepReport], rule: SlowdownRule) -> StepReport | None:
    """The job's report: its slowest rank's (the longest mean without the longest step, among
    the reports the rule judges), at the job's furthest step. In synchronous training every
    rank waits for the slowest, so this is the job's step time."""
    judged = [r for r in reports if counts(r, rule)]
    if not judged:
        return None
    slowest = max(judged, key=lambda r: (r.typical_step_ms, -r.rank))
    return replace(slowest, step=max(r.step for r in judged))


def advance_job(
    track: Track,
    reports: Iterable[StepReport],
    rule: SlowdownRule,
    *,
    max_minima: int | None = None,
) -> tuple[Track, Slowdown | None]:
    """The rule over the whole job: one track fed with the job's report (`job_report`); the
    Slowdown names the slowest rank."""
    report = job_report(reports, rule)
    if report is None:
        return track, None
    return advance(track, report, rule, max_minima=max_minima)


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
        self._tracks: dict[int, Track] = {}

    def restart(self, after_step: int) -> None:
        """Forget everything: a new baseline from means of steps after `after_step` (a capture
        window's profiled steps are slower and must not count either way)."""
        self.after_step = after_step
        self._tracks.clear()

    def observe(self, report: StepReport) -> Slowdown | None:
        if not counts(report, self.rule, self.after_step):
            return None
        track = self._tracks.get(report.rank, Track())
        self._tracks[report.rank], fired = advance(
            track, report, self.rule, after_step=self.after_step
        )
        return fired

    def baselines(self) -> list[RankBaseline]:
        """Each rank's latest mean and its baseline (for progress lines and status)."""
        out = []
        for rank, track in sorted(self._tracks.items()):
            if track.baseline is not None and track.latest is not None:
                step, mean = track.latest
                out.append(RankBaseline(rank, step, mean, track.baseline[1]))
        return out
