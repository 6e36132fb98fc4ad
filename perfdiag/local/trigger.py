"""`perfdiag run --on-slowdown`: the training runs at full speed under a `watch` plan; when the
slowdown rule fires (perfdiag.api.slowdown), one window is captured on every rank from the same
step, analyzed, and the watch starts again, up to --max-captures times."""

from __future__ import annotations

import time

from perfdiag.api import Plan
from perfdiag.api.slowdown import SlowdownWatch
from perfdiag.api.trigger import Slowdown
from perfdiag.local.heartbeats import RankBeat
from perfdiag.local.progress import Progress
from perfdiag.local.window import POLL_S, WindowCoordinator
from perfdiag.storage import Storage, layout, open_storage


def capture_storage(root: Storage, index: int) -> Storage:
    """Each capture in its own folder of the output: capture-1, capture-2, …"""
    return open_storage(f"{root.uri.rstrip('/')}/capture-{index}")


def wait_for_slowdown(
    window: WindowCoordinator, watch: SlowdownWatch, progress: Progress
) -> Slowdown:
    """Feed the ranks' heartbeats to the rule until it fires (window.check raises when the
    training ends, is interrupted or hangs)."""
    while True:
        window.check()
        beats = window.beats()
        fired = [
            slowdown
            for report in (beat.step_report() for beat in beats.values())
            if report is not None and (slowdown := watch.observe(report)) is not None
        ]
        if fired:
            return max(fired, key=lambda slowdown: slowdown.percent_over)
        progress.status(watching_text(watch, beats))
        time.sleep(POLL_S)


def watching_text(watch: SlowdownWatch, beats: dict[int, RankBeat]) -> str:
    rule = watch.rule
    known = watch.baselines()
    if not known:
        at = max((beat.step for beat in beats.values()), default=0)
        return (
            f"watching for a {rule.percent:g}% slowdown: step {at}, the baseline needs "
            f"{rule.baseline_steps} steps after step {watch.after_step}…"
        )
    slowest = max(known, key=lambda b: b.mean_step_ms / b.baseline_step_ms)
    change = (slowest.mean_step_ms / slowest.baseline_step_ms - 1.0) * 100.0
    return (
        f"watching for a {rule.percent:g}% slowdown: step {slowest.step}, mean step "
        f"{slowest.mean_step_ms:.1f} ms on rank {slowest.rank} ({change:+.0f}% against its "
        f"baseline {slowest.baseline_step_ms:.1f} ms)…"
    )


def capture_on_slowdown(window: WindowCoordinator, fired: Slowdown, progress: Progress) -> Plan:
    """Record what fired, then plan the window ahead of the ranks."""
    window.storage.put_text(layout.TRIGGER, fired.model_dump_json())
    return window.capture_ahead(f"slowdown: {fired.describe()}")
