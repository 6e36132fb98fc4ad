"""Keys of one diagnosis under its prefix (docs/design.md §3). The only place they are spelled."""

from __future__ import annotations

PLAN = "plan.json"
VERDICT = "verdict.json"
REPORT = "report.html"
TIMELINE = "timeline.json.gz"
BREAKDOWN = "breakdown.json"
TRIGGER = "trigger.json"  # what fired the capture (the slowdown trigger); absent on request
# The profiler's own log lines that `perfdiag run` kept out of the terminal (local output only).
NATIVE_LOG = "perfdiag-native.log"
WORKERS = "workers"

STATUS = "status.json"
SUMMARY = "summary.parquet"
EVENTS = "events.parquet"
HARDWARE = "hardware.parquet"
STACKS = "stacks.json"
FLIGHT_RECORDER = "flight_recorder.pkl"  # torch's Flight Recorder pickle, next to stacks.json


def worker_key(rank: int, name: str) -> str:
    return f"{WORKERS}/{rank}/{name}"


def rank_of_worker_key(key: str) -> int | None:
    """`workers/<rank>/<file>` → rank; anything else → None."""
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == WORKERS and parts[1].isascii() and parts[1].isdigit():
        return int(parts[1])
    return None
