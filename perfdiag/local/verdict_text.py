"""The verdict as a person reads it in a terminal (verdict.json holds the same, for tools)."""

from __future__ import annotations

import textwrap

from perfdiag.analyzer.text import short
from perfdiag.api import Verdict
from perfdiag.api.ranks import format_runs, rank_runs, runs_phrase
from perfdiag.local.terminal import safe_text

_MAX_FINDINGS = 5
_MAX_OBSERVATIONS = 3
_MAX_STEP_CELLS = 64
"""Ranks whose step time is printed one by one; a larger job shows the culprits and the
slowest (the terminal stays a screenful whatever the number of ranks)."""
_SLOWEST_SHOWN = 8


def _wrap(
    text: str, width: int = 96, *, initial_indent: str = "", subsequent_indent: str = ""
) -> list[str]:
    """Lines of at most `width`, never breaking a word: a kernel or function name stays whole,
    to be searched for and copied."""
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=initial_indent,
        subsequent_indent=subsequent_indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def render_verdict(verdict: Verdict, *, location: str | None = None) -> str:
    """A short block: status and summary, step time per rank, top findings, where files are."""
    lines = [f"perfdiag verdict: {verdict.status.upper()}"]
    if verdict.trigger is not None:
        lines += _wrap(
            f"captured on a slowdown: {verdict.trigger.describe()}",
            width=96,
            initial_indent="  ",
            subsequent_indent="    ",
        )
    lines += _wrap(verdict.summary, width=96, initial_indent="  ", subsequent_indent="  ")
    culprits = {rank for finding in verdict.findings[:1] for rank in finding.ranks}
    not_captured = _states(verdict)
    named = {rank for finding in verdict.findings[:_MAX_FINDINGS] for rank in finding.ranks}
    lines += _step_times(verdict, culprits, named)
    if not_captured:
        lines += _wrap(
            f"workers not captured: {not_captured}",
            width=96,
            initial_indent="  ",
            subsequent_indent="    ",
        )
    if verdict.findings:
        lines.append("  findings (most severe first):")
        for index, finding in enumerate(verdict.findings[:_MAX_FINDINGS], start=1):
            ranks = format_runs(rank_runs(finding.ranks)) or "-"
            where = f" {short(finding.function)}" if finding.function else ""
            head = (
                f"{index}. {finding.kind} · {finding.category} · rank {ranks} · "
                f"severity {finding.severity:.2f}{where}"
            )
            lines += _wrap(head, width=96, initial_indent="    ", subsequent_indent="       ")
            lines += _wrap(
                finding.message, width=96, initial_indent="       ", subsequent_indent="       "
            )
        if len(verdict.findings) > _MAX_FINDINGS:
            lines.append(f"    … {len(verdict.findings) - _MAX_FINDINGS} more in verdict.json")
    if verdict.observations:
        lines.append(
            "  the whole job (observations against expected ranges, not a fault of any part):"
        )
        for finding in verdict.observations[:_MAX_OBSERVATIONS]:
            lines += _wrap(
                f"- {finding.category}: {finding.message}",
                width=96,
                initial_indent="    ",
                subsequent_indent="      ",
            )
    if location:
        base = location.rstrip("/")
        lines.append(f"  verdict: {base}/verdict.json")
        lines.append(f"  report:  {base}/report.html")
    # Names and messages come from the traces: no escape sequence of theirs reaches a terminal.
    return safe_text("\n".join(lines))


def _step_times(verdict: Verdict, culprits: set[int], named: set[int]) -> list[str]:
    """Each rank's median step time (`culprits` marked); for a large job the median, and the
    step times of the slowest ranks and of those the findings shown name."""
    times = verdict.window.step_time_ms
    if not times.per_rank:
        return []
    steps = (
        f"steps {verdict.window.start_step}–{verdict.window.start_step + verdict.window.steps - 1}"
    )
    items = sorted(((int(r), ms) for r, ms in times.per_rank.items()))
    ranks = len(items) + times.omitted
    if ranks <= _MAX_STEP_CELLS:
        head = f"step time, ms (median of {steps}, per rank):"
    else:
        slowest = sorted(items, key=lambda item: -item[1])[:_SLOWEST_SHOWN]
        items = sorted({*slowest, *((r, ms) for r, ms in items if r in named)})
        head = (
            f"step time, ms (median of {steps}): {times.median:.1f} over {ranks:,} ranks "
            f"(median); the slowest ranks and those the findings name:"
        )
    cells = [f"{rank}: {ms:.1f}{' <' if rank in culprits else ''}" for rank, ms in items]
    text = "   ".join(cells)
    return [
        *_wrap(head, width=96, initial_indent="  ", subsequent_indent="    "),
        *_wrap(text, width=96, initial_indent="    ", subsequent_indent="    "),
    ]


def _states(verdict: Verdict) -> str:
    """'ranks 3-7,9 missing; rank 4 stuck': each state's ranks as ranges (the rows of
    `workers` and the ranges of `missing`), the first few runs only; '' when all are ok."""
    parts = []
    for state in ("missing", "stuck"):
        runs = verdict.rank_runs(state)
        if runs:
            parts.append(f"{runs_phrase(runs)} {state}")
    return "; ".join(parts)
