"""What `perfdiag run` says while ranks have not counted a training step: how steps are counted
only when that explains what is seen, never to a rank that is merely slow to start."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from perfdiag.collector.hook import spool
from perfdiag.local import window as window_module
from perfdiag.local.first_step import (
    NO_STEP_NOTE_AFTER_S,
    no_rank_stepped_text,
    silent_ranks_text,
)
from perfdiag.local.progress import Progress
from perfdiag.local.window import MISSING_RANK_GRACE_S, WindowCoordinator, WindowSettings
from perfdiag.storage.local import LocalStorage

HINT = "perfdiag.collector.step()"


def test_no_rank_at_its_first_step_is_said_as_it_is() -> None:
    text = no_rank_stepped_text(61.4, 4, 4)
    assert text == (
        "no rank has reached its first training step yet (61 s since the start; 4 of 4 rank "
        "processes running); waiting…"
    )
    assert HINT not in text and "(61 s since the start); waiting…" in no_rank_stepped_text(
        61, 4, None
    )


def test_a_rank_without_steps_is_told_how_steps_count_only_when_its_peers_went_on() -> None:
    far = silent_ranks_text({0: 40, 1: 38, 3: 40}, 4, [2])
    assert far.startswith("only 3 of 4 ranks report to perfdiag; capturing those (rank 2 ")
    assert "counted no step while rank 0 counted 40" in far and HINT in far
    # Peers at their first step wait for the silent rank in a collective: it is only late.
    late = silent_ranks_text({0: 1, 1: 1}, 4, [2, 3])
    assert late.endswith("(ranks 2, 3 have not reached the first step yet)") and HINT not in late
    unnamed = silent_ranks_text({0: 0}, 2, [])
    assert unnamed.endswith("(the other rank has not reached the first step yet)")


class _FakeTime:
    """The window module's clock: each sleep moves it on and lets `on_tick` write heartbeats."""

    def __init__(self, on_tick: Callable[[float], None]) -> None:
        self.now = 0.0
        self.on_tick = on_tick

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_800_000_000.0 + self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.on_tick(self.now)


def _beat(spool_dir: Path, rank: int, step: int, at: float) -> None:
    path = spool.rank_dir(spool_dir, rank) / spool.HEARTBEAT
    path.parent.mkdir(parents=True, exist_ok=True)
    beat = {"rank": rank, "step": step, "phase": "dormant", "updated_unix": at, "world_size": 2}
    path.write_text(json.dumps(beat))


def _wait_for_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, beats: Callable[[Path, float], None]
) -> list[str]:
    """The progress lines of `wait_for_ranks` for two ranks whose heartbeats `beats` writes as
    the simulated time passes."""
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    clock = _FakeTime(lambda now: beats(spool_dir, now))
    fake = SimpleNamespace(monotonic=clock.monotonic, time=clock.time, sleep=clock.sleep)
    monkeypatch.setattr(window_module, "time", fake)
    settings = WindowSettings(
        local_ranks=2,
        warmup_steps=5,
        capture_steps=3,
        python_stacks=False,
        keep_raw=False,
        timeout_s=600,
        sample_hardware=False,
    )
    stream = io.StringIO()
    coordinator = WindowCoordinator(
        settings,
        spool_dir,
        tmp_path / "plan.json",
        LocalStorage(tmp_path / "out"),
        Progress(stream, clock=clock.monotonic),
    )
    coordinator.wait_for_ranks()
    return [line for line in stream.getvalue().splitlines() if "waiting for 2" not in line]


def test_ranks_slow_to_start_are_not_told_to_call_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ranks at 10% of a CPU: a DDP job's first step comes after 3 minutes."""

    def beats(spool_dir: Path, now: float) -> None:
        if now >= 180:
            _beat(spool_dir, 0, 1, now)
            _beat(spool_dir, 1, 1, now)

    lines = _wait_for_ranks(tmp_path, monkeypatch, beats)
    assert lines[0].startswith(
        f"perfdiag: no rank has reached its first training step yet ({NO_STEP_NOTE_AFTER_S:.0f} s"
    )
    assert lines[1].startswith("perfdiag: 2 ranks running")
    assert not [line for line in lines if HINT in line]


def test_a_rank_left_behind_by_its_peers_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def beats(spool_dir: Path, now: float) -> None:
        _beat(spool_dir, 0, int(now * 10), now)  # rank 1 never reports

    lines = _wait_for_ranks(tmp_path, monkeypatch, beats)
    assert len(lines) == 2, lines
    assert lines[0].startswith("perfdiag: only 1 of 2 ranks report to perfdiag; capturing those")
    # rank 0 counts 10 steps a second: it is hundreds of steps on when the grace ends.
    assert re.search(r"\(the other rank counted no step while rank 0 counted \d{3}: ", lines[0])
    assert HINT in lines[0] and MISSING_RANK_GRACE_S * 10 >= 100
