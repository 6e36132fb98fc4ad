"""The slowdown trigger's rule (perfdiag.api.slowdown), fed with heartbeat reports."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from perfdiag.api.slowdown import HORIZON_SPANS, SlowdownWatch, StepReport
from perfdiag.api.trigger import SlowdownRule

N = 50


def feed(
    watch: SlowdownWatch, means: list[float], *, rank: int = 0, first: int = 60, every: int = 25
) -> list[int]:
    """Reports every `every` steps from step `first`; the steps at which the rule fired."""
    fired = []
    for index, mean in enumerate(means):
        step = first + index * every
        slowdown = watch.observe(StepReport(rank, step, mean, N, max_step_ms=mean))
        if slowdown is not None:
            fired.append(step)
    return fired


def test_a_steady_job_never_fires() -> None:
    watch = SlowdownWatch(SlowdownRule(percent=5))
    assert feed(watch, [20.0, 20.4, 19.8, 20.6, 20.1, 19.9, 20.5] * 10) == []


def test_a_lasting_slowdown_fires_on_its_second_report_with_the_numbers() -> None:
    watch = SlowdownWatch(SlowdownRule(percent=5))
    assert feed(watch, [20.0, 19.0, 19.5, 21.5]) == []  # +13%, once
    slowdown = watch.observe(StepReport(1, 200, 21.6, N, max_step_ms=21.6))
    assert slowdown is None  # another rank has no baseline yet
    slowdown = watch.observe(StepReport(0, 160, 21.8, N, max_step_ms=21.8))
    assert slowdown is not None
    assert (slowdown.rank, slowdown.step, slowdown.baseline_step) == (0, 160, 85)
    assert slowdown.baseline_step_ms == 19.0
    assert slowdown.percent_over == pytest.approx((21.8 / 19.0 - 1) * 100)
    assert "rank 0" in slowdown.describe() and "5%" in slowdown.describe()


def test_one_long_step_does_not_fire_it() -> None:
    watch = SlowdownWatch(SlowdownRule(percent=5))
    feed(watch, [20.0] * 4)
    # A 2 s step lifts the 50-step mean from 20 to 60 ms for 50 steps; the mean without the
    # longest step stays at 20.
    spike = (20.0 * 49 + 2000.0) / 50
    for step in (160, 185, 210):
        assert watch.observe(StepReport(0, step, spike, N, max_step_ms=2000.0)) is None


def test_a_stall_every_few_steps_fires_it() -> None:
    watch = SlowdownWatch(SlowdownRule(percent=5))
    feed(watch, [20.0] * 4)
    # Every third step takes 60 ms more: the mean without the longest is still 19 ms higher.
    mean = 20.0 + 60.0 / 3
    fired = [watch.observe(StepReport(0, step, mean, N, max_step_ms=80.0)) for step in (160, 185)]
    assert fired[0] is None and fired[1] is not None


def test_reports_of_another_mean_length_and_repeats_are_ignored() -> None:
    watch = SlowdownWatch(SlowdownRule(percent=5))
    feed(watch, [20.0] * 3)
    assert watch.observe(StepReport(0, 200, 40.0, 10)) is None  # the hook's default, not ours
    assert watch.observe(StepReport(0, 200, 40.0, N)) is None
    assert watch.observe(StepReport(0, 200, 40.0, N)) is None  # the same heartbeat again


def test_restart_forgets_the_baseline_and_skips_the_windows_steps() -> None:
    watch = SlowdownWatch(SlowdownRule(percent=5))
    feed(watch, [20.0] * 4)
    watch.restart(after_step=300)
    # Means that include steps up to 300 (the capture window's slower steps) do not count.
    assert watch.observe(StepReport(0, 340, 30.0, N)) is None
    assert watch.baselines() == []
    assert feed(watch, [30.0, 30.0, 30.0], first=400) == []  # the new speed is the baseline


def test_the_baseline_is_recent() -> None:
    watch = SlowdownWatch(SlowdownRule(percent=5))
    feed(watch, [10.0], first=60)
    # Long after the fast period the job runs at 20 ms: that is the baseline now.
    late = 60 + HORIZON_SPANS * N + 100
    assert feed(watch, [20.0, 20.0, 20.0], first=late) == []


def test_the_rule_is_validated() -> None:
    with pytest.raises(ValidationError):
        SlowdownRule(percent=0)
    with pytest.raises(ValidationError):
        SlowdownRule(percent=5, baseline_steps=5000)
    assert SlowdownRule(percent=5).factor == pytest.approx(1.05)


def test_the_pure_track_is_the_watch_and_stays_small() -> None:
    """`advance` (the state a PerfDiagnosis status keeps) decides as SlowdownWatch does, and
    `max_minima` bounds it."""
    from perfdiag.api.slowdown import Track, advance

    rule = SlowdownRule(percent=5)
    means = [20.0, 19.0, 19.5, 21.5, 20.2, 19.9, 21.9, 22.0, 18.0, 25.0, 25.5, 30.0]
    watch = SlowdownWatch(rule)
    track = Track()
    for index, mean in enumerate(means):
        report = StepReport(0, 60 + 25 * index, mean, N, max_step_ms=mean)
        track, fired = advance(track, report, rule)
        assert fired == watch.observe(report)
    assert track.baseline == (260, 18.0) and track.latest == (335, 30.0)
    rising = Track()
    for index in range(10):
        report = StepReport(0, 60 + 25 * index, 20.0 + index * 0.1, N, max_step_ms=20.0)
        rising, _ = advance(rising, report, SlowdownRule(percent=50), max_minima=4)
    assert len(rising.minima) == 4 and rising.minima[-1][0] == 60 + 25 * 9


def test_the_job_view_judges_the_slowest_rank_at_the_furthest_step() -> None:
    from perfdiag.api.slowdown import Track, advance_job, job_report

    rule = SlowdownRule(percent=5)
    reports = [
        StepReport(0, 100, 20.0, N, max_step_ms=20.0),
        StepReport(1, 98, 24.0, N, max_step_ms=60.0),  # without its longest: 1140 / 49
        StepReport(2, 101, 21.0, 10),  # another mean length: not judged
    ]
    job = job_report(reports, rule)
    assert job is not None and (job.rank, job.step) == (1, 100)
    assert job.typical_step_ms == pytest.approx(1140 / 49)
    track, fired = advance_job(Track(), reports, rule)
    assert fired is None and track.baseline == (100, pytest.approx(1140 / 49))
    assert advance_job(track, [], rule) == (track, None)


def test_reports_further_apart_than_the_horizon_still_keep_a_baseline() -> None:
    # A fast job seen every few seconds moves 1,500 steps between reports, more than 20 × 50.
    watch = SlowdownWatch(SlowdownRule(percent=5))
    assert feed(watch, [20.0, 20.0, 20.0], every=1500) == []
    assert feed(watch, [30.0, 30.0], first=60 + 3 * 1500, every=1500) == [60 + 4 * 1500]
