"""The shell blocks of a document, run in order as a reader would (tests/chart/test_docs_commands.py).

Convention (docs/testing.md, "The documents' commands"):
- every fenced block whose info string is `sh`, `bash` or `shell` is run, in document order,
  by `bash` with `set -euo pipefail`, from the repository root; other blocks (yaml, json, plain
  text) are not commands;
- a block that cannot run against the suite's control plane (it needs Docker and a registry, a
  GPU cluster, a value only the reader has) carries, on the last non-blank line before its
  opening fence, `<!-- not run by tests: REASON -->`; the reason is required, and a marker that
  is not followed by a shell block is an error;
- what the test must change in a command to run it here (an endpoint the suite cannot serve
  under that name, credentials) is a declared `Substitution`: each must occur in the document
  (else the test fails: the document changed) and every change is shown with the block when it
  fails. Nothing else is changed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

RUN_LANGUAGES = frozenset({"sh", "bash", "shell"})
MARKER = re.compile(r"^<!--\s*not run by tests:(?P<reason>.*?)-->\s*$")
FENCE = "```"
OUTPUT_TAIL = 6000


class DocumentError(ValueError):
    """The document breaks the convention (a stray marker, a marker without a reason...)."""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the opening fence, 1-based
    heading: str
    language: str
    text: str
    not_run: str | None  # the marker's reason

    @property
    def name(self) -> str:
        return f"{self.path.name}:{self.line} (under {self.heading!r})"


@dataclass(frozen=True)
class Substitution:
    """`text` in the document's commands becomes `value` when run here, because `why`."""

    text: str
    value: str
    why: str


@dataclass(frozen=True)
class Outcome:
    block: Block
    script: str
    returncode: int | None  # None: killed at the time limit
    output: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def report(self, changes: Sequence[Substitution]) -> str:
        """What failed, how, with what the block ran and printed."""
        how = (
            f"exited {self.returncode}"
            if self.returncode is not None
            else f"was still running after {self.seconds:.0f} s (stopped)"
        )
        used = [c for c in changes if c.value in self.script]
        lines = [f"{self.block.name} {how}", "--- the block as run (bash -euo pipefail) ---"]
        lines.append(self.script)
        if used:
            lines.append("--- substitutions in it ---")
            lines += [f"{c.text!r} → {c.value!r} ({c.why})" for c in used]
        lines.append("--- its output (stdout and stderr) ---")
        lines.append(self.output[-OUTPUT_TAIL:])
        return "\n".join(lines)


def blocks(path: Path) -> list[Block]:
    """The shell blocks of `path` in order, with their marker's reason when not run."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    heading = "(top)"
    pending: tuple[int, str] | None = None  # a marker waiting for its block
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        if line.startswith(FENCE):
            end = _closing_fence(lines, index, path)
            language = line[len(FENCE) :].strip().split(" ")[0]
            reason = None
            if pending is not None:
                if language not in RUN_LANGUAGES:
                    raise DocumentError(f"{path}:{pending[0]}: marker before a {language!r} block")
                reason, pending = pending[1], None
            if language in RUN_LANGUAGES:
                text = "\n".join(lines[index + 1 : end]) + "\n"
                found.append(Block(path, index + 1, heading, language, text, reason))
            index = end + 1
            continue
        marker = MARKER.match(line)
        if pending is not None and line:
            raise DocumentError(f"{path}:{pending[0]}: marker not followed by a shell block")
        if marker is not None:
            reason = marker.group("reason").strip()
            if not reason:
                raise DocumentError(f"{path}:{index + 1}: a marker must give its reason")
            pending = (index + 1, reason)
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
        index += 1
    if pending is not None:
        raise DocumentError(f"{path}:{pending[0]}: marker not followed by a shell block")
    return found


def _closing_fence(lines: list[str], start: int, path: Path) -> int:
    for index in range(start + 1, len(lines)):
        if lines[index].strip() == FENCE:
            return index
    raise DocumentError(f"{path}:{start + 1}: fenced block never closed")


def scripts(
    found: Iterable[Block], changes: Sequence[Substitution]
) -> list[tuple[Block, str | None]]:
    """Each block with the script to run (None: not run), the substitutions applied; raises
    DocumentError naming a substitution that occurs nowhere in the blocks to run."""
    planned: list[tuple[Block, str | None]] = []
    unused = list(changes)
    for block in found:
        if block.not_run is not None:
            planned.append((block, None))
            continue
        script = block.text
        for change in changes:
            if change.text in script:
                script = script.replace(change.text, change.value)
                unused = [c for c in unused if c is not change]
        planned.append((block, script))
    if unused:
        missing = ", ".join(repr(c.text) for c in unused)
        raise DocumentError(f"the commands no longer contain {missing}: update the test")
    return planned


def run(block: Block, script: str, *, cwd: Path, env: dict[str, str], timeout: float) -> Outcome:
    """`script` by bash -euo pipefail in its own process group (stopped whole at the limit)."""
    started = time.monotonic()
    process = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    code: int | None = None
    try:
        output, _ = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    finally:  # interrupted too: nothing of the block outlives it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return Outcome(block, script, code, output, time.monotonic() - started)
