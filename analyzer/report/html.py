"""report.html: one self-contained page (inline CSS and SVG, no script, no external URL)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from html import escape
from importlib import resources
from typing import Any

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
from perfdiag.api.verdict import RankRange, WorkerInfo

MAX_RANKS_SHOWN = 64
HEATMAP_ROWS = 20
MAX_WORKER_ROWS = 200
CATEGORY_ORDER = [
    "gpu_compute",
    "gpu_memory",
    "cpu_op",
    "python",
    "dataloader",
    "gc",
    "cuda_runtime",
    "annotation",
    "other",
    "idle",
    "communication",
]


def render_report(analysis: Analysis) -> str:
    verdict = analysis.verdict
    culprits = _culprits(analysis)
    shown = _ranks_shown(analysis, culprits)
    body = [
        _header(analysis),
        _findings_section(analysis.reported, "Findings", open_first=True),
        _step_section(analysis, culprits, shown),
        _breakdown_section(analysis, culprits, shown),
        _collectives_section(analysis, culprits, shown),
        _heatmap_section(analysis, culprits, shown),
        _workers_section(analysis),
        _details_section(analysis),
    ]
    css = resources.files("perfdiag.analyzer.report.html").joinpath("report.css").read_text()
    title = f"perfdiag — {verdict.status}: {verdict.summary}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title[:160])}</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{css}</style></head><body><main>{''.join(body)}"
        f"<footer>perfdiag {escape(__version__)} · generated "
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}</footer>"
        "</main></body></html>\n"
    )


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
        return everyone
    chosen = set(sorted(culprits)[: MAX_RANKS_SHOWN // 4])
    chosen |= set(list(analysis.account.missing)[: MAX_RANKS_SHOWN // 8])
    chosen |= set(list(analysis.account.stuck)[: MAX_RANKS_SHOWN // 8])
    steps = analysis.steps
    slowest = steps.ranks[np.argsort(-steps.median_ms)][: MAX_RANKS_SHOWN // 4]
    chosen |= {int(r) for r in slowest}
    rest = [r for r in everyone if r not in chosen]
    room = MAX_RANKS_SHOWN - len(chosen)
    if room > 0 and rest:
        picks = np.linspace(0, len(rest) - 1, num=min(room, len(rest))).round().astype(int)
        chosen |= {rest[i] for i in picks}
    return sorted(chosen)


def _header(analysis: Analysis) -> str:
    v = analysis.verdict
    window = v.window
    account = analysis.account
    facts = [
        ("source", escape(analysis.capture.source)),
        ("ranks analysed", f"{len(account.analysed)} of {len(account.expected)}"),
        ("window", f"{window.steps} steps from step {window.start_step}"),
        ("median step", ms(window.step_time_ms.median)),
        ("slowest rank's step", ms(window.step_time_ms.max)),
        ("peer groups", escape(analysis.groups.basis)),
    ]
    if analysis.capture.kind == "kineto":
        facts.append(("input", "Kineto trace files"))
    if analysis.capture.plan is not None:
        facts.append(("plan", escape(analysis.capture.plan.id)))
    fact_html = "".join(f"<span>{name}: <b>{value}</b></span>" for name, value in facts)
    fired = (
        f'<div class="trigger">Captured on a slowdown: {escape(v.trigger.describe())}</div>'
        if v.trigger is not None
        else ""
    )
    return (
        f'<header class="top"><h1>perfdiag report</h1>'
        f'<span class="badge {v.status}">{escape(v.status)}</span></header>'
        f"{fired}"
        f'<div class="summary {v.status}">{escape(v.summary)}</div>'
        f'<div class="facts">{fact_html}</div>'
    )


def _findings_section(reported: list[Reported], title: str, *, open_first: bool) -> str:
    if not reported:
        return (
            f'<section><h2>{escape(title)}</h2><p class="hint">No finding above the reporting '
            "threshold.</p></section>"
        )
    rows = []
    for n, item in enumerate(reported):
        f = item.finding
        where = ""
        if f.function:
            where += f'<div class="fn">{escape(f.function)}</div>'
        where += (
            f"<div>rank{'s' if len(f.ranks) != 1 else ''} {escape(format_ranks(f.ranks))}</div>"
        )
        evidence = _render_value(f.evidence)
        opened = " open" if open_first and n == 0 else ""
        rows.append(
            '<tr class="finding">'
            f'<td><div class="sev"><div class="track"><div class="fill" '
            f'style="width:{min(100.0, f.severity * 100):.1f}%"></div></div>{pct(f.severity)}</div></td>'
            f'<td class="kind">{escape(f.kind)}<br><span class="muted">{escape(f.category)}</span></td>'
            f'<td class="where">{where}</td>'
            f"<td>{escape(f.message)}</td></tr>"
            f'<tr class="evidence"><td></td><td colspan="3"><details{opened}><summary>evidence'
            f'</summary><div class="evwrap">{evidence}</div></details></td></tr>'
        )
    return (
        f'<section><h2>{escape(title)}</h2><p class="hint">Sorted by severity: the estimated '
        'fraction of step time lost.</p><table class="findings"><colgroup><col style="width:'
        '120px"><col style="width:150px"><col style="width:230px"><col></colgroup><thead>'
        "<tr><th>severity</th><th>kind</th><th>where</th><th>what, and what to check next</th>"
        f"</tr></thead><tbody>{''.join(rows)}"
        "</tbody></table></section>"
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


def _render_value(value: Any) -> str:
    """Evidence as readable HTML: scalars inline, nested objects as blocks, rows as tables."""
    if isinstance(value, dict):
        if not value:
            return '<span class="muted">—</span>'
        flat = [(k, v) for k, v in value.items() if not _is_complex(v)]
        nested = [(k, v) for k, v in value.items() if _is_complex(v)]
        parts = []
        if flat:
            chips = " · ".join(
                f'<span class="kv"><span class="muted">{escape(_label(k))}:</span> {_scalar(v)}</span>'
                for k, v in flat
            )
            parts.append(f'<div class="kvs">{chips}</div>')
        for k, v in nested:
            parts.append(
                f'<div class="sub"><div class="subhead">{escape(_label(k))}</div>{_render_value(v)}</div>'
            )
        return "".join(parts)
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            if any(_is_complex(x) for v in value for x in v.values()):
                return "".join(f'<div class="item">{_render_value(v)}</div>' for v in value)
            keys: list[str] = []
            for v in value:
                keys += [k for k in v if k not in keys]
            head = "".join(f"<th>{escape(_label(k))}</th>" for k in keys)
            body = "".join(
                "<tr>" + "".join(f"<td>{_scalar(v.get(k))}</td>" for k in keys) + "</tr>"
                for v in value
            )
            return f'<table class="ev"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        return escape(", ".join(str(v) for v in value)) or '<span class="muted">—</span>'
    return _scalar(value)


def _is_complex(value: Any) -> bool:
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and any(isinstance(v, dict | list) for v in value)


def _scalar(value: Any) -> str:
    if value is None:
        return '<span class="muted">—</span>'
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return escape(format_ranks(value))
        return escape(", ".join(str(v) for v in value)) or '<span class="muted">—</span>'
    return escape(str(value))


def _step_section(analysis: Analysis, culprits: set[int], shown: list[int]) -> str:
    steps = analysis.steps
    position = {int(r): i for i, r in enumerate(steps.ranks)}
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
    median = analysis.verdict.window.step_time_ms.median
    chart = bar_chart(bars, unit=" ms", reference=median, reference_label=f"median {ms(median)}")
    note = _shown_note(shown, analysis)
    return (
        '<section><h2>Step time per rank</h2><p class="hint">Median step time of each rank '
        "in the window. In synchronous data-parallel training every rank takes about as long as "
        "the slowest one — the breakdown below shows who works and who waits. "
        f'<span class="culprit">Red</span>: rank named in a finding.{note}</p>{chart}</section>'
    )


def _shown_note(shown: list[int], analysis: Analysis) -> str:
    total = len(analysis.account.expected)
    if len(shown) == total:
        return ""
    return (
        f" Showing {len(shown)} of {total} ranks: those named in findings, missing or stuck, the "
        "slowest, and an even sample of the rest."
    )


def _host(analysis: Analysis, rank: int) -> str:
    meta = analysis.capture.metas.get(rank)
    host = meta.host if meta else None
    return f" ({host})" if host else ""


def _breakdown_section(analysis: Analysis, culprits: set[int], shown: list[int]) -> str:
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
    position = {int(r): i for i, r in enumerate(features.ranks)}
    bars = []
    for rank in shown:
        if rank not in position:
            continue
        i = position[rank]
        segments = [(c, float(features.ms[i, col_of[c]])) for c in order]
        bars.append(
            StackedBar(
                label=str(rank),
                segments=segments,
                tooltip_prefix=f"rank {rank}",
                highlight=rank in culprits,
            )
        )
    chart = stacked_bars(bars, unit=" ms", categories=order)
    return (
        '<section><h2>Where each rank\'s step goes</h2><p class="hint">Mean ms per step by '
        "category on the critical path (overlaps removed: each instant is charged once; "
        "communication includes Python frames blocked on a collective). A culprit shows more "
        "work; the ranks waiting for it show more communication.</p>"
        f"{chart}</section>"
    )


def _collectives_section(analysis: Analysis, culprits: set[int], shown: list[int]) -> str:
    """Matched collectives per rank: time waiting for the last rank vs transfer."""
    result = analysis.collectives
    if result is None:
        return ""
    features = analysis.features
    per_rank = result.per_rank
    position = {int(r): i for i, r in enumerate(features.ranks)}
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
        return ""
    clocks = (
        "arrival times on the trace clocks"
        if result.instances.clock_aligned
        else "durations only (the ranks' clocks do not line up)"
    )
    return (
        '<section><h2>Collectives: waiting vs transfer</h2><p class="hint">'
        f"{result.instance_count} collectives matched across ranks (process group + "
        f"sequence number); mean ms per step of each rank's collective time, split by "
        f"{escape(clocks)} into the wait until the last rank arrived and the transfer after. "
        "The rank that arrives last waits least: long waits mark victims; a long transfer "
        "marks a slow link.</p>"
        f"{stacked_bars(bars, unit=' ms', categories=categories)}</section>"
    )


def _heatmap_section(analysis: Analysis, culprits: set[int], shown: list[int]) -> str:
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
    position = {int(r): i for i, r in enumerate(features.ranks)}
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
    chart = heatmap(labels, [str(r) for r in columns], cells, flagged_cols=flagged_ranks)
    return (
        '<section><h2>Top functions × rank (β)</h2><p class="hint">β: share of the window '
        "each function holds on the critical path. Rows: the functions with the largest β and "
        "those flagged as outliers (red outline: outlying against its peers, material and "
        "persistent). Hover a cell for values.</p>"
        f'<div class="heatwrap">{chart}</div></section>'
    )


def _workers_section(analysis: Analysis) -> str:
    account = analysis.account
    features = analysis.features
    position = {int(r): i for i, r in enumerate(features.ranks)}
    comm = features.wait_index if len(features.ranks) else None
    nw = features.non_wait_index
    verdict = analysis.verdict
    workers = verdict.workers
    # At most MAX_WORKER_ROWS rows, problems first: a row per missing or stuck worker and per
    # range of ranks with no file (verdict.missing), so that a world size claimed by the input,
    # far above the ranks it holds, does not make the page grow with it.
    problems: list[WorkerInfo | RankRange] = [w for w in workers if w.state != "ok"]
    problems += verdict.missing
    problems.sort(key=lambda p: p.rank if isinstance(p, WorkerInfo) else p.first)
    unlisted_problems = problems[MAX_WORKER_ROWS:]
    problems = problems[:MAX_WORKER_ROWS]
    healthy = [w for w in workers if w.state == "ok"]
    listed = problems + healthy[: max(0, MAX_WORKER_ROWS - len(problems))]
    listed.sort(key=lambda p: p.rank if isinstance(p, WorkerInfo) else p.first)
    rows = []
    for w in listed:
        if isinstance(w, RankRange):
            ranks = format_runs([(w.first, w.last)])
            rows.append(
                f'<tr><td class="num">{ranks}</td><td>—</td><td>—</td>'
                '<td class="state-missing">missing</td><td class="num">—</td>'
                f'<td class="num">—</td><td class="num">—</td><td>{escape(w.reason)}</td></tr>'
            )
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
        rows.append(
            f'<tr><td class="num">{w.rank}</td><td>{escape(w.host or "—")}</td>'
            f'<td>{escape(w.pod or "—")}</td><td class="state-{w.state}">{w.state}</td>'
            f'<td class="num">{step}</td><td class="num">{work}</td><td class="num">{wait}</td>'
            f"<td>{escape(note)}</td></tr>"
        )
    more = ""
    healthy_unlisted = len(healthy) - (len(listed) - len(problems))
    if unlisted_problems:
        runs = merge_runs(
            (p.rank, p.rank) if isinstance(p, WorkerInfo) else (p.first, p.last)
            for p in unlisted_problems
        )
        more += (
            f'<p class="hint">{run_count(runs)} more missing or stuck workers not listed '
            f"(ranks {escape(format_runs(runs))}).</p>"
        )
    if healthy_unlisted:
        more += f'<p class="hint">{healthy_unlisted} more healthy workers not listed.</p>'
    return (
        '<section><h2>Workers</h2><table class="workers"><thead><tr><th class="num">rank</th><th>host</th>'
        '<th>pod</th><th>state</th><th class="num">median step</th><th class="num">outside '
        'communication /step</th><th class="num">communication + waits /step</th><th>note</th></tr>'
        f"</thead><tbody>{''.join(rows)}</tbody></table>{more}</section>"
    )


def _details_section(analysis: Analysis) -> str:
    parts = ["<section><h2>Analysis details</h2>"]
    if analysis.below_threshold:
        below = sorted(analysis.below_threshold, key=lambda r: -r.finding.severity)[:10]
        parts.append(
            f"<details><summary>{len(analysis.below_threshold)} observation(s) below the "
            f"reporting threshold ({pct(analysis.thresholds.report_severity)})</summary>"
            + _findings_section(below, "Below threshold", open_first=False)
            + "</details>"
        )
    if analysis.capture.notes:
        notes = "".join(f"<li>{escape(n)}</li>" for n in analysis.capture.notes)
        parts.append(f"<details><summary>notes</summary><ul>{notes}</ul></details>")
    thresholds = json.dumps(analysis.thresholds.model_dump(by_alias=True), indent=2)
    parts.append(
        f"<details><summary>thresholds used</summary><pre>{escape(thresholds)}</pre></details>"
    )
    parts.append(
        f'<p class="hint">Expected ranges applied: {"GPU" if analysis.has_gpu else "CPU"} job. '
        f"Peer groups: {escape(analysis.groups.basis)}.</p></section>"
    )
    return "".join(parts)
