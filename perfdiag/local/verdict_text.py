"""The verdict as a person reads it in a terminal (verdict.json holds the same, for tools)."""

from __future__ import annotations

import textwrap

from perfdiag.analyzer.text import short
from perfdiag.api import Verdict
from perfdiag.api.ranks import runs_phrase
from perfdiag.local.terminal import safe_text

_MAX_FINDINGS = 5
_MAX_OBSERVATIONS = 3


def render_verdict(verdict: Verdict, *, location: str | None = None) -> str:
    """A short block: status and summary, step time per rank, top findings, where files are."""
    lines = [f"perfdiag verdict: {verdict.status.upper()}"]
    if verdict.trigger is not None:
        lines += textwrap.wrap(
            f"captured on a slowdown: {verdict.trigger.describe()}",
            width=96,
            initial_indent="  ",
            subsequent_indent="    ",
        )
    lines += textwrap.wrap(verdict.summary, width=96, initial_indent="  ", subsequent_indent="  ")
    culprits = {rank for finding in verdict.findings[:1] for rank in finding.ranks}
    not_captured = _states(verdict)
    per_rank = verdict.window.step_time_ms.per_rank
    if per_rank:
        cells = []
        for rank_text, ms in sorted(per_rank.items(), key=lambda item: int(item[0])):
            mark = " <" if int(rank_text) in culprits else ""
            cells.append(f"{rank_text}: {ms:.1f}{mark}")
        lines.append(
            f"  step time, ms (median of steps {verdict.window.start_step}"
            f"–{verdict.window.start_step + verdict.window.steps - 1}, per rank):"
        )
        lines += textwrap.wrap(
            "   ".join(cells), width=96, initial_indent="    ", subsequent_indent="    "
        )
    if not_captured:
        lines += textwrap.wrap(
            f"workers not captured: {not_captured}",
            width=96,
            initial_indent="  ",
            subsequent_indent="    ",
        )
    if verdict.findings:
        lines.append("  findings (most severe first):")
        for index, finding in enumerate(verdict.findings[:_MAX_FINDINGS], start=1):
            ranks = ",".join(str(rank) for rank in finding.ranks) or "-"
            where = f" {short(finding.function)}" if finding.function else ""
            head = (
                f"{index}. {finding.kind} · {finding.category} · rank {ranks} · "
                f"severity {finding.severity:.2f}{where}"
            )
            lines += textwrap.wrap(
                head, width=96, initial_indent="    ", subsequent_indent="       "
            )
            lines += textwrap.wrap(
                finding.message, width=96, initial_indent="       ", subsequent_indent="       "
            )
        if len(verdict.findings) > _MAX_FINDINGS:
            lines.append(f"    … {len(verdict.findings) - _MAX_FINDINGS} more in verdict.json")
    if verdict.observations:
        lines.append(
            "  the whole job (observations against expected ranges, not a fault of any part):"
        )
        for finding in verdict.observations[:_MAX_OBSERVATIONS]:
            lines += textwrap.wrap(
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


def _states(verdict: Verdict) -> str:
    """'ranks 3-7,9 missing; rank 4 stuck': each state's ranks as ranges (the rows of
    `workers` and the ranges of `missing`), the first few runs only; '' when all are ok."""
    parts = []
    for state in ("missing", "stuck"):
        runs = verdict.rank_runs(state)
        if runs:
            parts.append(f"{runs_phrase(runs)} {state}")
    return "; ".join(parts)
