"""The step a capture window begins at (the plan's start_step), from the ranks' heartbeats."""

from __future__ import annotations

from perfdiag.api.plan import Plan, start_step_ahead
from perfdiag.local.heartbeats import RankBeat
from perfdiag.local.window import WindowState


def beat(rank: int, step: int, at: float) -> RankBeat:
    return RankBeat(rank, step, "dormant", 4, rank, None, None, at)


def test_start_step_is_the_lead_time_ahead_at_the_current_rate() -> None:
    assert start_step_ahead(100, 30.0, 2.0) == 161
    assert start_step_ahead(100, 0.2, 2.0) == 102  # slow steps: still at least two ahead
    assert start_step_ahead(100, None, 2.0) == 102


def test_rate_is_the_fastest_ranks_over_its_last_heartbeat_interval() -> None:
    state = WindowState()
    assert state.steps_per_second() is None
    state.note_beat(0, beat(0, 1, 10.0))
    state.note_beat(0, beat(0, 1, 10.0))  # the same heartbeat read twice
    assert state.steps_per_second() is None
    state.note_beat(0, beat(0, 5, 11.0))  # start-up steps are slow…
    state.note_beat(0, beat(0, 35, 12.0))  # …the current rate is what matters
    state.note_beat(1, beat(1, 4, 11.0))
    state.note_beat(1, beat(1, 24, 12.0))
    assert state.steps_per_second() == 30.0


def test_start_step_travels_in_the_plan_json() -> None:
    plan = Plan.new(steps=3, start_step=42)
    assert Plan.model_validate_json(plan.to_json()).start_step == 42
    assert "start_step" not in Plan.new(steps=3).to_json()  # old readers see the old plan
