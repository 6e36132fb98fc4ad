"""perfdiag.api.stall: when a rank counts as stuck (shared by perfdiag run, the operator and the
analyzer)."""

from __future__ import annotations

import pytest

from perfdiag.api.stall import (
    RankProgress,
    StallPolicy,
    StepClock,
    progress_from_mapping,
    stalled_s,
    stuck_ranks,
)


def test_limit_is_the_step_factor_times_the_median_step_within_the_bounds() -> None:
    policy = StallPolicy(min_s=60, step_factor=20, max_s=480)
    assert policy.limit_s(None) == 60  # no step time known yet: the lower bound
    assert policy.limit_s(0.1) == 60  # 20 fast steps are 2 s: the lower bound wins
    assert policy.limit_s(6.0) == 120
    assert policy.limit_s(60.0) == 480  # minute-long steps: still diagnosed within 8 min
    assert StallPolicy(min_s=600, max_s=480).limit_s(1.0) == 600  # min above max: min wins


def test_stuck_ranks_live_and_offline() -> None:
    now = 1000.0
    progress = [
        RankProgress(0, step=40, last_step_unix=now - 1, updated_unix=now - 0.5),
        RankProgress(1, step=31, last_step_unix=now - 90, updated_unix=now - 0.5),
        RankProgress(2, step=31, last_step_unix=now - 95, updated_unix=now - 60),  # silent
        RankProgress(3, step=31, last_step_unix=now - 95, updated_unix=now, exited=True),
        RankProgress(4, step=0, last_step_unix=None, updated_unix=now),  # never stepped
    ]
    live = stuck_ranks(progress, 60.0, now)
    assert sorted(live) == [1, 2]
    assert live[1].stalled_s == pytest.approx(90) and not live[1].silent
    assert live[2].silent
    # Offline (an analysis after the fact): as of each heartbeat's own time; rank 2's last
    # heartbeat came 35 s after its last step.
    offline = stuck_ranks(progress, 60.0)
    assert sorted(offline) == [1]
    assert stalled_s(progress[2]) == pytest.approx(35)


def test_step_clock_learns_the_median_step_from_heartbeats() -> None:
    clock = StepClock()
    assert clock.median_step_s() is None
    for second in range(5):
        clock.observe(
            [
                RankProgress(0, step=10 * second, last_step_unix=100.0 + second, updated_unix=0),
                RankProgress(1, step=5 * second, last_step_unix=100.0 + second, updated_unix=0),
            ]
        )
    # rank 0: 10 steps a second, rank 1: 5; the median of the samples (4 of each) is between.
    assert clock.median_step_s() == pytest.approx(0.15)
    # A heartbeat with the same step adds nothing (the rank did not advance).
    clock.observe([RankProgress(0, step=40, last_step_unix=104.0, updated_unix=0)])
    assert clock.median_step_s() == pytest.approx(0.15)


def test_progress_from_a_heartbeat_or_status_json() -> None:
    item = progress_from_mapping(
        3, {"step": 7, "last_step_unix": 5, "updated_unix": 6.5, "exited": True}
    )
    assert item == RankProgress(3, 7, 5.0, 6.5, exited=True)
    odd = progress_from_mapping(1, {"step": True, "last_step_unix": "x"})
    assert odd == RankProgress(1, 0, None, None)
