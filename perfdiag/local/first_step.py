"""What perfdiag says about ranks that have not counted a training step yet.

perfdiag sees a rank from its first step on (the hook writes heartbeats from there), so before
that it cannot tell a slow start (imports, data preparation, compilation, a CPU quota) from a
loop whose steps it does not count (no torch optimizer, no `perfdiag.collector.step()`). How
steps are counted is only said where it explains what is seen: the training ended without a
step counted, or a rank counted none while its peers went on counting theirs for the whole
grace period (ranks that wait for each other in collectives cannot get that far apart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

NO_STEP_NOTE_AFTER_S = 60.0
"""After this long with no rank at its first step, say so (once)."""
PEER_STEPS_FOR_HINT = 3
"""A rank with no step while a peer has counted this many is not merely late to start."""

NO_STEPS_HINT = (
    "perfdiag counts a step at each torch.optim optimizer.step(); a loop without a torch "
    "optimizer must call perfdiag.collector.step() once per iteration"
)


def no_rank_stepped_text(waited_s: float, ranks: int, running: int | None) -> str:
    """No rank has reached its first step `waited_s` after the start; `running` of the `ranks`
    rank processes exist (None: unknown)."""
    processes = f"; {running} of {ranks} rank processes running" if running is not None else ""
    return (
        f"no rank has reached its first training step yet ({waited_s:.0f} s since the start"
        f"{processes}); waiting…"
    )


def silent_ranks_text(steps: Mapping[int, int], expected: int, silent: Sequence[int]) -> str:
    """Some ranks report (`steps`: rank → step), the others have not for the grace period:
    they are left out of the window. `silent` names them when known."""
    head = f"only {len(steps)} of {expected} ranks report to perfdiag; capturing those"
    count = len(silent) or expected - len(steps)
    who = _ranks(silent) if silent else _others(count)
    furthest = max(steps.values(), default=0)
    if furthest >= PEER_STEPS_FOR_HINT:
        return (
            f"{head} ({who} counted no step while rank {_furthest_rank(steps)} counted "
            f"{furthest}: a rank counts none when the hook did not load in it or its loop steps "
            f"no torch optimizer; {NO_STEPS_HINT})"
        )
    has = "has" if count == 1 else "have"
    return f"{head} ({who} {has} not reached the first step yet)"


def _ranks(ranks: Sequence[int]) -> str:
    listed = ", ".join(str(rank) for rank in sorted(ranks))
    return f"rank {listed}" if len(ranks) == 1 else f"ranks {listed}"


def _others(count: int) -> str:
    return "the other rank" if count == 1 else f"the other {count} ranks"


def _furthest_rank(steps: Mapping[int, int]) -> int:
    return max(sorted(steps), key=lambda rank: steps[rank])
