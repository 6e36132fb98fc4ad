"""What the ranks of this node are doing, read from their spool heartbeats."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from perfdiag.api.slowdown import StepReport
from perfdiag.collector.hook import spool


@dataclass(frozen=True)
class RankBeat:
    rank: int
    step: int
    phase: str
    world_size: int | None
    local_rank: int | None
    plan_id: str | None
    error: str | None
    updated_unix: float | None
    mean_step_ms: float | None = None
    """The hook's mean step time over its last `mean_steps` steps (the slowdown trigger's)."""
    mean_steps: int | None = None
    max_step_ms: float | None = None
    """The longest of those steps."""

    def step_report(self) -> StepReport | None:
        if self.mean_step_ms is None or self.mean_steps is None:
            return None
        return StepReport(
            self.rank, self.step, self.mean_step_ms, self.mean_steps, self.max_step_ms
        )


def read_beats(spool_dir: Path) -> dict[int, RankBeat]:
    """The latest heartbeat of every rank that has written one (rank → beat)."""
    beats: dict[int, RankBeat] = {}
    for rank in spool.ranks_in(spool_dir):
        data = spool.read_json(spool.rank_dir(spool_dir, rank) / spool.HEARTBEAT)
        if not isinstance(data, dict):
            continue
        beats[rank] = RankBeat(
            rank=rank,
            step=_int(data.get("step")) or 0,
            phase=str(data.get("phase") or "dormant"),
            world_size=_int(data.get("world_size")),
            local_rank=_int(data.get("local_rank")),
            plan_id=data.get("plan_id") if isinstance(data.get("plan_id"), str) else None,
            error=data.get("error") if isinstance(data.get("error"), str) else None,
            updated_unix=_float(data.get("updated_unix")),
            mean_step_ms=_float(data.get("mean_step_ms")),
            mean_steps=_int(data.get("mean_steps")),
            max_step_ms=_float(data.get("max_step_ms")),
        )
    return beats


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def steps_text(beats: dict[int, RankBeat]) -> str:
    """'rank 0: 12, rank 1: 12, …' (compact when all equal)."""
    steps = {beat.step for beat in beats.values()}
    if len(steps) == 1:
        return f"all at step {steps.pop()}"
    return ", ".join(f"rank {rank}: {beat.step}" for rank, beat in sorted(beats.items()))
