"""report.html: one self-contained page (inline CSS and SVG, no script, no external URL).

The page is the template report.html.j2 beside this module, rendered by Jinja2 with
autoescaping: this module gathers what it shows (plain values, escaped by the template; the
charts' SVG, escaped by analyzer/report/charts.py). Jinja2 is imported on the first rendering only.
"""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from perfdiag import __version__
from perfdiag.analyzer.compare.features import LEVEL_CATEGORY, LEVEL_FUNCTION
from perfdiag.analyzer.findings.reported import Reported
from perfdiag.analyzer.report.analysis import Analysis
from perfdiag.analyzer.report.charts import (
    CULPRIT,
    MISSING,
    NORMAL,
    STUCK,
    Bar,
    Cell,
    StackedBar,
    bar_chart,
    heatmap,
    stacked_bars,
)
from perfdiag.analyzer.text import format_ranks, ms, pct
from perfdiag.api.ranks import format_runs, merge_runs, run_count
from perfdiag.api.schema import CATEGORIES, IDLE
from perfdiag.api.taxonomy import COMMUNICATION
from perfdiag.api.verdict import RankRange, Verdict, WorkerInfo, WorkerRange

if TYPE_CHECKING:
    import jinja2

MAX_RANKS_SHOWN = 64
HEATMAP_ROWS = 20
MAX_WORKER_ROWS = 200
# The breakdown chart stacks a rank's own work first, then idle, then communication on top.
CATEGORY_ORDER = [*(c for c in CATEGORIES if c != COMMUNICATION), IDLE, COMMUNICATION]


def render_report(analysis: Analysis, verdict: Verdict) -> str:
    """report.html of `analysis`, whose verdict.json is `verdict` (analyzer/report/verdict.py
    `verdict_of`)."""
    culprits = _culprits(analysis)
    shown = _ranks_shown(analysis, culprits)
    below = sorted(analysis.below_threshold, key=lambda r: -r.finding.severity)[:10]
    return _template().render(
        title=f"perfdiag — {verdict.status}: {verdict.summary}"[:160],
        css=resources.files("perfdiag.analyzer.report").joinpath("report.css").read_text(),
        verdict=verdict,
        facts=_facts(analysis, verdict),
        findings=[_finding_row(item) for item in analysis.reported],
        observations=[_finding_row(item) for item in analysis.observations],
        ranks_shown=len(shown),
        ranks_total=len(analysis.account.expected),
        step_chart=_step_chart(analysis, verdict, culprits, shown),
        breakdown_chart=_breakdown_chart(analysis, culprits, shown),
        collectives=_collectives(analysis, culprits, shown),
        heatmap_chart=_heatmap_chart(analysis, culprits, shown),
        workers=_workers(analysis, verdict),
        below=[_finding_row(item) for item in below],
        below_count=len(analysis.below_threshold),
        report_severity=pct(analysis.thresholds.report_severity),
        notes=[*analysis.notes.shown, *(n for n in verdict.notes if n not in analysis.notes.shown)],
        thresholds=json.dumps(analysis.thresholds.model_dump(by_alias=True), indent=2),
        has_gpu=analysis.has_gpu,
        peer_groups=analysis.groups.basis,
        version=__version__,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


@functools.cache
def _template() -> jinja2.Template:
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("perfdiag.analyzer.report", "."),
        bytecode_cache=_bytecode_cache(),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    return environment.get_template("report.html.j2")


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """The template compiled once per user and Jinja version, in the temporary directory:
    compiling it takes ~35 ms of every `perfdiag analyze`. Best effort: a directory that cannot
    be made or written leaves the report compiled each time, never fails it."""
    import jinja2

    class BestEffortCache(jinja2.FileSystemBytecodeCache):
        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            with contextlib.suppress(OSError):
                super().dump_bytecode(bucket)

    try:
        return BestEffortCache()
    except (OSError, RuntimeError):  # RuntimeError: a directory owned by someone else
        return None


def _culprits(analysis: Analysis) -> set[int]:
    ranks: set[int] = set()
    for reported in analysis.reported:
        if reported.finding.kind in (
            "slow_worker",
            "slow_node",
            "function_anomaly",
            "hardware",
            "hang",
        ):
            ranks.update(reported.finding.ranks)
    return ranks


def _ranks_shown(analysis: Analysis, culprits: set[int]) -> list[int]:
    """All ranks when few; else the flagged ones, the slowest, and an even sample."""
    everyone = analysis.account.expected
    if len(everyone) <= MAX_RANKS_SHOWN:
        shown: list[int] = everyone.tolist()
        return shown
    chosen = set(sorted(culprits)[: MAX_RANKS_SHOWN // 4])
    chosen |= set(analysis.account.missing.first(MAX_RANKS_SHOWN // 8))
    chosen |= set(list(analysis.account.stuck)[: MAX_RANKS_SHOWN // 8])
    steps = analysis.steps
    slowest = steps.ranks[np.argsort(-steps.median_ms)][: MAX_RANKS_SHOWN // 4]
    chosen |= {int(r) for r in slowest}
    rest = everyone[~np.isin(everyone, np.fromiter(chosen, np.int64, len(chosen)))]
    room = MAX_RANKS_SHOWN - len(chosen)
    if room > 0 and len(rest):
        picks = np.linspace(0, len(rest) - 1, num=min(room, len(rest))).round().astype(int)
        chosen |= {int(r) for r in rest[picks]}
    return sorted(chosen)


class _Positions:
    """Rank → its row in an ascending array of ranks (a dict of a million ranks costs 100 MB)."""

    def __init__(self, ranks: np.ndarray) -> None:
        self.ranks = ranks

    def get(self, rank: int) -> int | None:
        at = int(np.searchsorted(self.ranks, rank))
        return at if at < len(self.ranks) and self.ranks[at] == rank else None

    def __contains__(self, rank: int) -> bool:
        return self.get(rank) is not None

    def __getitem__(self, rank: int) -> int:
        at = self.get(rank)
        if at is None:
            raise KeyError(rank)
        return at


def _facts(analysis: Analysis, verdict: Verdict) -> list[tuple[str, str]]:
    window = verdict.window
    account = analysis.account
    facts = [
        ("source", analysis.capture.source),
        ("ranks analysed", f"{len(account.analysed)} of {len(account.expected)}"),
        ("window", f"{window.steps} steps from step {window.start_step}"),
        ("median step", ms(window.step_time_ms.median)),
        ("slowest rank's step", ms(window.step_time_ms.max)),
        ("peer groups", analysis.groups.basis),
    ]
    if analysis.capture.kind == "kineto":
        facts.append(("input", "Kineto trace files"))
    if analysis.capture.plan is not None:
        facts.append(("plan", analysis.capture.plan.id))
    return facts


@dataclass(frozen=True)
class _FindingRow:
    bar_percent: str
    """The severity bar's width."""
    severity: str
    kind: str
    category: str
    function: str | None
    ranks: str
    message: str
    evidence: Evidence


def _finding_row(item: Reported) -> _FindingRow:
    f = item.finding
    return _FindingRow(
        bar_percent=f"{min(100.0, f.severity * 100):.1f}",
        severity=pct(f.severity),
        kind=f.kind,
        category=f.category,
        function=f.function or None,
        ranks=f"rank{'s' if len(f.ranks) != 1 else ''} {format_ranks(f.ranks)}",
        message=f.message,
        evidence=_evidence(f.evidence),
    )


LABELS = {
    "beta": "β",
    "peers_median_beta": "peers' median β",
    "ms_per_step": "ms/step",
    "peers_median_ms_per_step": "peers' median ms/step",
    "best_peer_ms_per_step": "best peer ms/step",
    "excess_ms_per_step": "excess ms/step",
    "robust_z": "robust z",
    "ratio_to_peers": "× peers' median",
    "steps_outlying": "steps outlying",
    "step_ms": "step ms",
    "non_communication_ms_per_step": "outside communication ms/step",
    "peers_median_non_communication_ms_per_step": "peers' median outside communication ms/step",
    "wait_ms_per_step": "extra wait ms/step",
    "unexplained_ms_per_step": "unexplained ms/step",
    "mu": "μ",
    "peers_median_mu": "peers' median μ",
    "sigma": "σ",
    "peers_sigma": "peers' σ",
    "bound_beta": "expected β ≤",
    "median_beta": "median β",
    "mean_beta": "mean β",
    "discounted_beta": "discounted β",
}


def _label(key: str) -> str:
    return LABELS.get(key, key.replace("_", " "))


@dataclass(frozen=True)
class _Fields:
    """An object: its scalars inline (label, text), then its nested values as blocks."""

    kind: ClassVar[str] = "fields"
    chips: list[tuple[str, str | None]]
    blocks: list[tuple[str, Evidence]]


@dataclass(frozen=True)
class _Items:
    """A list of objects with nested values: one block each."""

    kind: ClassVar[str] = "items"
    items: list[Evidence]


@dataclass(frozen=True)
class _Table:
    """A list of flat objects: a row each, a column per key."""

    kind: ClassVar[str] = "table"
    head: list[str]
    rows: list[list[str | None]]


Evidence = _Fields | _Items | _Table | str | None
"""A finding's evidence as the report shows it; None: a muted dash."""


def _evidence(value: Any) -> Evidence:
    """Evidence as readable blocks: scalars inline, nested objects as blocks, rows as tables."""
    if isinstance(value, dict):
        if not value:
            return None
        return _Fields(
            chips=[(_label(k), _scalar(v)) for k, v in value.items() if not _is_complex(v)],
            blocks=[(_label(k), _evidence(v)) for k, v in value.items() if _is_complex(v)],
        )
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            if any(_is_complex(x) for v in value for x in v.values()):
                return _Items([_evidence(v) for v in value])
            keys: list[str] = []
            for v in value:
                keys += [k for k in v if k not in keys]
            rows = [[_scalar(v.get(k)) for k in keys] for v in value]
            return _Table(head=[_label(k) for k in keys], rows=rows)
        return ", ".join(str(v) for v in value) or None
    return _scalar(value)


def _is_complex(value: Any) -> bool:
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and any(isinstance(v, dict | list) for v in value)


def _scalar(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return format_ranks(value)
        return ", ".join(str(v) for v in value) or None
    return str(value)


def _step_chart(analysis: Analysis, verdict: Verdict, culprits: set[int], shown: list[int]) -> str:
    steps = analysis.steps
    position = _Positions(steps.ranks)
    medians = steps.median_ms
    bars = []
    for rank in shown:
        host = _host(analysis, rank)
        if rank in analysis.account.stuck:
            stuck = analysis.account.stuck[rank]
            bars.append(
                Bar(
                    str(rank),
                    None,
                    STUCK,
                    f"rank {rank}{host}: stuck at step {stuck.step}",
                    "stuck",
                )
            )
            continue
        if rank not in position:
            why = analysis.account.missing.get(rank, "no summary")
            bars.append(
                Bar(str(rank), None, MISSING, f"rank {rank}{host}: missing — {why}", "missing")
            )
            continue
        i = position[rank]
        row = steps.durations_ms[i]
        tip = (
            f"rank {rank}{host}: median step {medians[i]:.2f} ms "
            f"(min {np.nanmin(row):.2f}, max {np.nanmax(row):.2f}, {int(steps.counts[i])} steps)"
        )
        is_culprit = rank in culprits
        bars.append(
            Bar(
                str(rank),
                float(medians[i]),
                CULPRIT if is_culprit else NORMAL,
                tip,
                "slow" if is_culprit else "",
            )
        )
    median = verdict.window.step_time_ms.median
    return bar_chart(bars, unit=" ms", reference=median, reference_label=f"median {ms(median)}")


def _host(analysis: Analysis, rank: int) -> str:
    meta = analysis.capture.metas.get(rank)
    host = meta.host if meta else None
    return f" ({host})" if host else ""


def _breakdown_chart(analysis: Analysis, culprits: set[int], shown: list[int]) -> str:
    """The category breakdown per rank; empty without category columns."""
    features = analysis.features
    cat_cols = np.flatnonzero(features.level == LEVEL_CATEGORY)
    if not len(features.ranks) or not len(cat_cols):
        return ""
    col_of = {features.categories[k]: int(k) for k in cat_cols}
    # Waiting (communication, and Python frames blocked on a collective) is one segment.
    col_of["communication"] = features.wait_index
    present = list(col_of)
    order = [c for c in CATEGORY_ORDER if c in present] + sorted(
        c for c in present if c not in CATEGORY_ORDER
    )
    position = _Positions(features.ranks)
    held = _held_back_ms(analysis)
    if held:
        order = (
            [*order[:-1], HELD_BACK, order[-1]]
            if order[-1] == COMMUNICATION
            else [*order, HELD_BACK]
        )
    bars = []
    for rank in shown:
        if rank not in position:
            continue
        i = position[rank]
        segments = [(c, float(features.ms[i, col_of[c]]) if c in col_of else 0.0) for c in order]
        if rank in held:
            segments = _with_held_back(segments, held[rank])
        bars.append(
            StackedBar(
                label=str(rank),
                segments=segments,
                tooltip_prefix=f"rank {rank}",
                highlight=rank in culprits,
            )
        )
    return stacked_bars(bars, unit=" ms", categories=order)


HELD_BACK = "host (held back)"
"""The breakdown's segment of a rank its host held back (a CPU quota, a CPU taken by others):
that time is inside its categories on the critical path (a throttled thread's op lasts longer),
so it is carved out of its own work, in proportion."""


def _held_back_ms(analysis: Analysis) -> dict[int, float]:
    """ms per step each rank named with a host cause lost to its host."""
    return {w.rank: w.excess_ms for w in analysis.fusion.slow if w.root_category == "host"}


def _with_held_back(segments: list[tuple[str, float]], held_ms: float) -> list[tuple[str, float]]:
    own = sum(v for c, v in segments if c not in (COMMUNICATION, HELD_BACK))
    carved = min(held_ms, own)
    keep = (own - carved) / own if own > 0 else 0.0
    return [
        (c, carved if c == HELD_BACK else v if c == COMMUNICATION else v * keep)
        for c, v in segments
    ]


@dataclass(frozen=True)
class _Collectives:
    matched: int
    """Collectives matched across ranks."""
    clocks: str
    """How their wait and transfer were split."""
    chart: str


def _collectives(analysis: Analysis, culprits: set[int], shown: list[int]) -> _Collectives | None:
    """Matched collectives per rank: time waiting for the last rank vs transfer."""
    result = analysis.collectives
    if result is None:
        return None
    features = analysis.features
    per_rank = result.per_rank
    position = _Positions(features.ranks)
    categories = ["transfer", "waiting for the last rank"]
    bars = []
    for rank in shown:
        i = position.get(rank)
        if i is None or not per_rank.calls[i]:
            continue
        bw = per_rank.busbw_mu[i]
        bandwidth = f", {bw:.1f} GB/s bus bandwidth" if np.isfinite(bw) else ""
        prefix = (
            f"rank {rank} (arrived last in {pct(float(per_rank.last_share[i]))} of "
            f"{int(per_rank.calls[i])} calls{bandwidth})"
        )
        bars.append(
            StackedBar(
                label=str(rank),
                segments=[
                    ("transfer", float(per_rank.transfer_ms[i])),
                    ("waiting for the last rank", float(per_rank.wait_ms[i])),
                ],
                tooltip_prefix=prefix,
                highlight=rank in culprits,
            )
        )
    if not bars:
        return None
    clocks = (
        "arrival times on the trace clocks"
        if result.instances.clock_aligned
        else "durations only (the ranks' clocks do not line up)"
    )
    chart = stacked_bars(bars, unit=" ms", categories=categories)
    return _Collectives(matched=result.instance_count, clocks=clocks, chart=chart)


def _heatmap_chart(analysis: Analysis, culprits: set[int], shown: list[int]) -> str:
    """The top functions × ranks heatmap of β; empty without function columns."""
    features = analysis.features
    dev = analysis.deviations
    fn_cols = np.flatnonzero(features.level == LEVEL_FUNCTION)
    if not len(features.ranks) or not len(fn_cols):
        return ""
    beta = features.beta
    flagged_cols = fn_cols[dev.outlying[:, fn_cols].any(axis=0)]
    flagged_cols = flagged_cols[np.argsort(-beta[:, flagged_cols].max(axis=0))][: HEATMAP_ROWS // 2]
    rest = [k for k in fn_cols[np.argsort(-beta[:, fn_cols].max(axis=0))] if k not in flagged_cols]
    rows = sorted(
        [*flagged_cols.tolist(), *rest[: HEATMAP_ROWS - len(flagged_cols)]],
        key=lambda k: -float(beta[:, k].max()),
    )
    position = _Positions(features.ranks)
    columns = [r for r in shown if r in position]
    cells = []
    for k in rows:
        row = []
        for rank in columns:
            i = position[rank]
            ref = dev.ref[i, k]
            step = features.mean_step_ms[i]
            peers = (
                f"; peers' median β {ref / step:.4f} ({ref:.2f} ms/step)"
                if np.isfinite(ref) and step
                else ""
            )
            flagged = bool(dev.outlying[i, k])
            tip = (
                f"rank {rank} · {features.label(k)} · β {beta[i, k]:.4f} "
                f"({features.ms[i, k]:.2f} ms/step){peers}{' · OUTLIER' if flagged else ''}"
            )
            row.append(Cell(float(beta[i, k]), tip, flagged))
        cells.append(row)
    labels = [features.label(k) for k in rows]
    flagged_ranks = {j for j, r in enumerate(columns) if r in culprits}
    return heatmap(labels, [str(r) for r in columns], cells, flagged_cols=flagged_ranks)


@dataclass(frozen=True)
class _WorkerRow:
    ranks: str
    host: str
    pod: str
    state: str
    step: str
    work: str
    wait: str
    note: str


@dataclass(frozen=True)
class _Workers:
    rows: list[_WorkerRow]
    unlisted_problems: int  # missing or stuck workers beyond the rows
    unlisted_problem_ranks: str  # their ranks, as runs
    unlisted_healthy: int
    less_cpu_wait: bool  # the ranks' sampled waits for a CPU are taken out of their own time


def _workers(analysis: Analysis, verdict: Verdict) -> _Workers:
    account = analysis.account
    features = analysis.features
    position = _Positions(features.ranks)
    comm = features.wait_index if len(features.ranks) else None
    nw = features.non_wait_index
    workers = verdict.workers
    # At most MAX_WORKER_ROWS rows, problems first: a row per missing or stuck worker and per
    # range of ranks with no file (verdict.missing), so that a world size claimed by the input,
    # far above the ranks it holds, does not make the page grow with it.
    problems: list[WorkerInfo | RankRange | WorkerRange] = [w for w in workers if w.state != "ok"]
    problems += verdict.missing
    problems += [r for r in verdict.worker_ranges if r.state != "ok"]
    problems.sort(key=lambda p: p.rank if isinstance(p, WorkerInfo) else p.first)
    unlisted_problems = problems[MAX_WORKER_ROWS:]
    problems = problems[:MAX_WORKER_ROWS]
    healthy = [w for w in workers if w.state == "ok"]
    listed = problems + healthy[: max(0, MAX_WORKER_ROWS - len(problems))]
    listed.sort(key=lambda p: p.rank if isinstance(p, WorkerInfo) else p.first)
    # Healthy workers without a row in verdict.json (a capture of more than it lists).
    ranged_ok = sum(r.last - r.first + 1 for r in verdict.worker_ranges if r.state == "ok")
    rows = []
    for w in listed:
        if isinstance(w, RankRange | WorkerRange):
            ranks = format_runs([(w.first, w.last)])
            state = w.state if isinstance(w, WorkerRange) else "missing"
            reason = w.reason if isinstance(w, RankRange) else "—"
            rows.append(_WorkerRow(ranks, "—", "—", state, "—", "—", "—", reason))
            continue
        i = position.get(w.rank)
        step = ms(float(analysis.steps.median_ms[i])) if i is not None else "—"
        work = ms(float(features.ms[i, nw])) if i is not None else "—"
        wait = ms(float(features.ms[i, comm])) if i is not None and comm is not None else "—"
        note = account.missing.get(w.rank, "")
        if w.rank in account.stuck:
            s = account.stuck[w.rank]
            note = f"step {s.step} not advancing for {s.stalled_s:.0f} s" + (
                f"; top of stack: {s.stack[0]}" if s.stack else ""
            )
        host, pod = w.host or "—", w.pod or "—"
        rows.append(_WorkerRow(str(w.rank), host, pod, w.state, step, work, wait, note))
    runs = merge_runs(
        (p.rank, p.rank) if isinstance(p, WorkerInfo) else (p.first, p.last)
        for p in unlisted_problems
    )
    return _Workers(
        rows=rows,
        unlisted_problems=run_count(runs),
        unlisted_problem_ranks=format_runs(runs),
        unlisted_healthy=len(healthy) - (len(listed) - len(problems)) + ranged_ok,
        less_cpu_wait=features.cpu_wait is not None,
    )
