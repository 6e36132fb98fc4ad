"""Messages for a training that failed: torchrun's exit code, the failed ranks, its last lines."""

from __future__ import annotations

import re

# torchrun's failure summary lists each failed rank as "rank : 2 (local_rank: 2)" followed by
# "exitcode : 1 (pid: 123)".
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def failed_ranks(lines: list[str]) -> dict[int, int]:
    """Global rank → exit code, from torchrun's failure summary in the output."""
    found: dict[int, int] = {}
    rank: int | None = None
    for line in lines:
        if match := _RANK.match(line):
            rank = int(match.group(1))
        elif (match := _EXITCODE.match(line)) and rank is not None:
            found[rank] = int(match.group(1))
            rank = None
    return found


def training_failed_message(code: int, tail: list[str], steps_seen: int) -> str:
    ranks = failed_ranks(tail)
    who = ""
    if ranks:
        who = ": " + ", ".join(
            f"rank {rank} exited with code {exit_code}" for rank, exit_code in sorted(ranks.items())
        )
    shown = "\n".join(f"    | {line}" for line in tail) or "    (no output)"
    return (
        f"the training failed (torchrun exit code {code}){who}, after {steps_seen} steps "
        f"seen by perfdiag. Last lines of its output:\n{shown}"
    )
