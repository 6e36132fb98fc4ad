"""Messages for a training that failed: torchrun's exit code, the failed ranks, the first
failure's own last lines (its traceback), and the last lines of the output."""

from __future__ import annotations

import re

# torchrun's failure summary lists each failed rank as "rank : 2 (local_rank: 2)" followed by
# "exitcode : 1 (pid: 123)"; the first failure comes under "Root Cause".
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")

SHOWN_LINES = 50
ROOT_CAUSE_LINES = 25


def failed_ranks(lines: list[str]) -> tuple[dict[int, int], int | None]:
    """(global rank → exit code, the first failed rank) from torchrun's failure summary."""
    found: dict[int, int] = {}
    rank: int | None = None
    root: int | None = None
    in_root_cause = False
    for line in lines:
        if "Root Cause" in line:
            in_root_cause = True
        if match := _RANK.match(line):
            rank = int(match.group(1))
            if in_root_cause and root is None:
                root = rank
        elif (match := _EXITCODE.match(line)) and rank is not None:
            found[rank] = int(match.group(1))
            rank = None
    return found, root


def training_failed_message(code: int, output: list[str], steps_seen: int) -> str:
    ranks, root = failed_ranks(output)
    who = ""
    if ranks:
        ordered = sorted(ranks.items(), key=lambda item: (item[0] != root, item[0]))
        who = ": " + ", ".join(
            f"rank {rank} exited with code {exit_code}"
            + (" (the first failure)" if rank == root and len(ranks) > 1 else "")
            for rank, exit_code in ordered
        )
    parts = [
        f"the training failed (torchrun exit code {code}){who}, after {steps_seen} steps "
        "seen by perfdiag."
    ]
    # torch prefixes what a rank prints about its uncaught exception with "[rank<N>]:".
    own = [line for line in output if root is not None and line.startswith(f"[rank{root}]:")]
    if own:
        parts.append(f"Last lines of rank {root}:\n{_quote(own[-ROOT_CAUSE_LINES:])}")
        parts.append(f"Last lines of the output:\n{_quote(output[-ROOT_CAUSE_LINES:])}")
    else:
        parts.append(f"Last lines of its output:\n{_quote(output[-SHOWN_LINES:])}")
    return "\n".join(parts)


def _quote(lines: list[str]) -> str:
    return "\n".join(f"    | {line}" for line in lines) or "    (no output)"
