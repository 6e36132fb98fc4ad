"""Building verdict.json (docs/design.md §3): status, the one-sentence summary, window, workers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from perfdiag.analyzer.compare.features import StepTimes
from perfdiag.analyzer.findings.reported import Reported
from perfdiag.analyzer.load.capture import Capture
from perfdiag.analyzer.load.workers import WorkerAccount, missing_ranges, worker_infos
from perfdiag.analyzer.report.analysis import Analysis
from perfdiag.analyzer.text import ms, pct, ranks_phrase
from perfdiag.api.ranks import format_runs, rank_runs
from perfdiag.api.thresholds import Thresholds
from perfdiag.api.verdict import (
    MAX_FINDING_RANKS,
    MAX_WORKER_ROWS,
    Finding,
    Verdict,
    VerdictStatus,
    WindowInfo,
)
from perfdiag.api.verdict import StepTimes as StepTimesModel

MAX_FINDING_RUNS = 100
"""Runs of ranks a bounded finding's evidence spells out (the rest counted)."""


SLOWEST_LISTED = 20
"""In a capture of more than MAX_WORKER_ROWS workers, per_rank lists the rows' ranks and these
many of the slowest."""


def window_info(
    capture: Capture, steps: StepTimes, listed: Sequence[int] | None = None
) -> WindowInfo:
    """The window and its step times; `listed`: the ranks whose step times to give when not
    all are (None: all)."""
    medians = steps.median_ms if len(steps.ranks) else np.zeros(0)
    chosen = np.ones(len(steps.ranks), bool)
    if listed is not None and len(steps.ranks) > MAX_WORKER_ROWS:
        chosen = np.isin(steps.ranks, np.asarray(listed, np.int64))
        chosen[np.argsort(-medians, kind="stable")[:SLOWEST_LISTED]] = True
    per_rank = {
        str(int(r)): round(float(m), 3)
        for r, m in zip(steps.ranks[chosen], medians[chosen], strict=True)
    }
    if len(capture.metas):
        start_step, n_steps = capture.metas.window_start()
    else:
        start_step = 0
        # A stacks plan (a hang before any window) captured no steps.
        n_steps = capture.plan.steps if capture.plan and capture.plan.action == "capture" else 0
    return WindowInfo(
        start_step=start_step,
        steps=n_steps,
        step_time_ms=StepTimesModel(
            # The lower median: a value one rank had, never the midpoint of two.
            median=round(float(np.sort(medians)[(len(medians) - 1) // 2]), 3)
            if len(medians)
            else 0.0,
            max=round(float(np.max(medians)), 3) if len(medians) else 0.0,
            per_rank=per_rank,
            omitted=int(len(medians) - chosen.sum()),
        ),
    )


def status_of(account: WorkerAccount, reported: list[Reported]) -> VerdictStatus:
    if account.stuck:
        return "hang"
    if account.missing:
        return "incomplete"
    return "degraded" if reported else "healthy"


def summary_sentence(
    status: VerdictStatus,
    account: WorkerAccount,
    reported: list[Reported],
    window: WindowInfo,
    thresholds: Thresholds,
) -> str:
    parts: list[str] = []
    hang = [r for r in reported if r.finding.kind == "hang"]
    others = [r for r in reported if r.finding.kind != "hang"]
    if hang:
        parts.append(_strip(hang[0].headline))
    if account.missing:
        missing = sorted(account.missing)
        verb = "is" if len(missing) == 1 else "are"
        why = f" ({account.missing[missing[0]]})" if len(missing) == 1 else ""
        parts.append(f"{ranks_phrase(missing, capital=True)} {verb} missing{why}")
    n = len(account.analysed)
    if others:
        text = _strip(others[0].headline)
        lead = set(others[0].finding.ranks)
        # A function_anomaly or hardware finding inside the lead slow worker is the same
        # story, not another one.
        more = [
            r
            for r in others[1:]
            if not (
                r.finding.kind in ("function_anomaly", "hardware") and set(r.finding.ranks) <= lead
            )
        ]
        if more:
            text += f" ({len(more)} more finding{'s' if len(more) > 1 else ''} in the report)"
        parts.append(text)
    elif n:
        who = {1: "The rank looks", 2: "Both ranks look"}.get(n, f"All {n} ranks look")
        if parts:
            who = f"the {n} analysed rank{'s' if n > 1 else ''} look{'s' if n == 1 else ''}"
        parts.append(
            f"{who} healthy: no finding above the reporting threshold "
            f"({pct(thresholds.report_severity)} of step time); median step "
            f"{ms(window.step_time_ms.median)}"
        )
    elif not hang:
        parts.append(
            "No worker produced a summary to analyse"
            if not parts
            else "no worker produced a summary to analyse"
        )
    if not parts:
        return f"Status {status}."
    return "; ".join([parts[0], *(_continued(p) for p in parts[1:])]) + "."


def _observed(observations: Sequence[Reported]) -> str:
    """' The job as a whole: …' — the largest whole-job observation, said after the status
    sentence so that it never reads as the reason for it."""
    if not observations:
        return ""
    lead = max(observations, key=lambda r: r.finding.severity)
    more = len(observations) - 1
    tail = f" ({more} more observation{'s' if more > 1 else ''} in the report)" if more else ""
    return f" The job as a whole (advice, not a fault): {_continued(_strip(lead.headline))}{tail}."


def _continued(clause: str) -> str:
    """A headline placed after a semicolon: 'Rank 2 is…' → 'rank 2 is…'."""
    first = clause.split(" ", 1)[0]
    if first in ("Rank", "Ranks", "All", "The", "Both"):
        return clause[0].lower() + clause[1:]
    return clause


def _strip(text: str) -> str:
    return text.rstrip(". ")


def verdict_of(analysis: Analysis) -> Verdict:
    """verdict.json of `analysis`, with every input note its stages have added so far: built
    last, once the timeline has read what it reads."""
    return build_verdict(
        analysis.capture,
        analysis.account,
        analysis.steps,
        analysis.reported,
        analysis.thresholds,
        analysis.observations,
        input_notes=analysis.notes.inputs,
        host_note=analysis.host_note,
    )


def build_verdict(
    capture: Capture,
    account: WorkerAccount,
    steps: StepTimes,
    reported: list[Reported],
    thresholds: Thresholds,
    observations: Sequence[Reported] = (),
    *,
    input_notes: Sequence[str] = (),
    host_note: str | None = None,
) -> Verdict:
    """verdict.json, once everything it says is known: `input_notes`, the inputs the analysis
    could not use (analyzer/load/capture.py `Notes.inputs`); `host_note`, the host's CPU
    condition that names no rank (analyzer/signals/cpu_cause.py), said in the summary too."""
    status = status_of(account, [r for r in reported if r.finding.kind != "hang"])
    if account.stuck:
        status = "hang"
    ordered = sorted(reported, key=lambda r: -r.finding.severity)
    workers, ranges = worker_infos(
        capture, account, [rank for r in ordered for rank in r.finding.ranks]
    )
    window = window_info(capture, steps, [w.rank for w in workers] if ranges else None)
    sentence = summary_sentence(status, account, reported, window, thresholds)
    host = [host_note] if host_note is not None else []
    fired = (
        [f"Captured on a slowdown: {capture.trigger.describe()}."]
        if capture.trigger is not None
        else []
    )
    verdict = Verdict(
        status=status,
        summary=" ".join([sentence + _observed(observations), *host]),
        trigger=capture.trigger,
        window=window,
        workers=workers,
        worker_ranges=ranges,
        missing=missing_ranges(account),
        findings=listed_findings(reported),
        observations=listed_findings(observations),
        notes=[*fired, *host, *input_notes, *unreadable_notes(capture)],
    )
    return verdict.sorted()


def listed_findings(reported: Sequence[Reported]) -> list[Finding]:
    """The findings as verdict.json lists them: in the order given, ranks bounded."""
    return [bounded_ranks(r.finding) for r in reported]


def bounded_ranks(finding: Finding) -> Finding:
    """The finding naming at most MAX_FINDING_RANKS ranks (the lowest); its evidence then has
    them all as runs and their count. An observation of a whole job of 1,000,000 ranks would
    otherwise list them all."""
    if len(finding.ranks) <= MAX_FINDING_RANKS:
        return finding
    ranks = sorted(finding.ranks)
    evidence = {
        **finding.evidence,
        "ranks_total": len(ranks),
        "rank_runs": format_runs(rank_runs(ranks), max_runs=MAX_FINDING_RUNS),
    }
    return finding.model_copy(update={"ranks": ranks[:MAX_FINDING_RANKS], "evidence": evidence})


def unreadable_notes(capture: Capture) -> list[str]:
    """The ranks whose summary exists but could not be read, and why."""
    # A Kineto folder's unreadable traces are among the input notes already.
    return [
        f"rank {rank} not analysed: {why}"
        for rank, why in capture.unreadable.items()
        if rank not in capture.metas and capture.kind == "capture"
    ]
