"""What the end-to-end tests read from the suite's Prometheus, which scraped the operator during
the diagnosis (as the chart's ServiceMonitor says) and evaluated the chart's alerting rules: the
series a user's dashboard reads, compared with the PerfDiagnosis' status, the operator's
counters, the alerts, and every query of the chart's Grafana dashboard returning data."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from perfdiag.api.ranks import format_runs, rank_runs
from perfdiag.operator.metrics import MAX_CULPRIT_SERIES, MAX_LABEL_CHARS
from perfdiag_testing import monitoring
from perfdiag_testing.binaries import find_bin_dir
from perfdiag_testing.prometheus_server import PrometheusServer

ROOT = Path(__file__).resolve().parents[2]
MAX_SERIES_PER_DIAGNOSIS = 40
PER_DIAGNOSIS = (
    "perfdiag_diagnosis_info",
    "perfdiag_diagnosis_verdict",
    "perfdiag_diagnosis_finding_severity",
    "perfdiag_diagnosis_culprit",
    "perfdiag_diagnosis_culprit_ranks",
    "perfdiag_diagnosis_start_timestamp_seconds",
    "perfdiag_diagnosis_completion_timestamp_seconds",
    "perfdiag_job_workers",
    "perfdiag_job_step_seconds",
    "perfdiag_job_baseline_step_seconds",
    "perfdiag_job_slowdown_ratio",
    "perfdiag_job_slowdown_threshold_ratio",
    "perfdiag_job_steps_per_second",
    "perfdiag_job_furthest_step",
    "perfdiag_job_slowest_rank",
    "perfdiag_job_slowdown_detected_timestamp_seconds",
)
COUNTERS = {
    "finished": 'perfdiag_diagnoses_finished_total{phase="Succeeded", outcome="%s"}',
    "ttv_count": 'perfdiag_diagnosis_time_to_verdict_seconds_count{trigger="%s"}',
    "ttv_sum": 'perfdiag_diagnosis_time_to_verdict_seconds_sum{trigger="%s"}',
    "slowdown_captures": "perfdiag_slowdown_captures_total",
    "analyzer_started": "perfdiag_analyzer_jobs_started_total",
    "analyzer_done": 'perfdiag_analyzer_job_duration_seconds_count{outcome="succeeded"}',
    "injected": 'perfdiag_webhook_admissions_total{result="injected"}',
    "fail_open": "sum(perfdiag_webhook_fail_open_total)",
}


@dataclass
class Scraped:
    """What Prometheus held for one diagnosis once it had scraped its verdict."""

    series: dict[str, list[tuple[dict[str, str], float]]]
    counters: dict[str, float]
    alerts: dict[str, list[dict[str, str]]]
    panels: dict[str, int] = field(default_factory=dict)  # "panel/ref" → series returned
    series_count: int = 0  # every series of the diagnosis (its labels name it)


def _one(prometheus: PrometheusServer, expr: str) -> float:
    found = prometheus.values(expr)
    assert len(found) == 1, (expr, found)
    return found[0][1]


def collect(
    prometheus: PrometheusServer,
    ns: str,
    name: str,
    *,
    trigger: bool,
    outcome: str,
    alerts: tuple[str, ...],
    dashboard: bool = False,
) -> Scraped:
    """Wait until Prometheus scraped `name`'s verdict and the `alerts` fire for it, then read
    every per-diagnosis series, the counters and, with `dashboard`, every panel's query of the
    chart's dashboard with its variables set to this diagnosis. Call while the operator runs."""
    selector = f'namespace="{ns}", diagnosis="{name}"'
    prometheus.wait_for(
        lambda: prometheus.query(f"perfdiag_diagnosis_verdict{{{selector}}}"),
        f"the verdict of {ns}/{name}",
        timeout=30,
    )
    firing = {
        alert: prometheus.wait_for(
            lambda alert=alert: prometheus.firing(alert, namespace=ns, diagnosis=name),  # type: ignore[misc]
            f"alert {alert} firing for {ns}/{name}",
            timeout=30,
        )
        for alert in alerts
    }
    series = {metric: prometheus.values(f"{metric}{{{selector}}}") for metric in PER_DIAGNOSIS}
    mode = "slowdown" if trigger else "none"
    counters = {
        key: _one(prometheus, expr % (outcome if key == "finished" else mode))
        if "%s" in expr
        else _one(prometheus, expr)
        for key, expr in COUNTERS.items()
    }
    count = _one(prometheus, f"count({{{selector}}})")
    scraped = Scraped(series, counters, firing, series_count=int(count))
    if dashboard:
        scraped.panels = panels_with_data(prometheus, ns, name)
    return scraped


def panels_with_data(prometheus: PrometheusServer, ns: str, name: str) -> dict[str, int]:
    """How many series each query of the chart's dashboard returns, its variables set as a
    user who picked this diagnosis would."""
    helm = find_bin_dir(("helm",), repo_root=ROOT) / "helm"
    board = monitoring.dashboard(monitoring.render(helm, ROOT / "charts" / "perfdiag"))
    job = next(t for t in prometheus.scrape_configs if t["job_name"] != "apiserver")["job_name"]
    values = {"job": job, "namespace": ns, "diagnosis": name, "__range": "1h",
              "__rate_interval": "1m", "datasource": "prometheus"}  # fmt: skip
    return {
        f"{q.panel}/{q.ref}": len(prometheus.query(monitoring.fill(q.expr, values)))
        for q in monitoring.panel_queries(board)
    }


def _by(series: list[tuple[dict[str, str], float]], label: str) -> dict[str, float]:
    return {labels[label]: value for labels, value in series}


def _only(series: list[tuple[dict[str, str], float]], what: str) -> float:
    assert len(series) == 1, (what, series)
    return series[0][1]


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def assert_matches_status(scraped: Scraped, obj: dict[str, Any], *, percent: float | None) -> None:
    """The series a dashboard reads hold what the PerfDiagnosis' status says."""
    status = obj["status"]
    s = scraped.series
    [(info, one)] = s["perfdiag_diagnosis_info"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (info["phase"], info["reason"], one) == (status["phase"], ready["reason"], 1.0), info
    assert (info["target_kind"], info["target"]) == (
        obj["spec"]["target"]["kind"], obj["spec"]["target"]["name"]
    )  # fmt: skip
    assert _only(s["perfdiag_diagnosis_start_timestamp_seconds"], "start") == _time(
        status["startTime"]
    )
    assert _only(s["perfdiag_diagnosis_completion_timestamp_seconds"], "end") == _time(
        status["completionTime"]
    )
    verdict = status["verdict"]
    [(labels, one)] = s["perfdiag_diagnosis_verdict"]
    assert (labels["status"], labels.get("culprits", ""), one) == (
        verdict["status"], verdict["culprits"], 1.0
    )  # fmt: skip
    assert _only(s["perfdiag_diagnosis_culprit_ranks"], "culprits") == len(verdict["culpritRanks"])
    culprits = sorted(int(labels["rank"]) for labels, _ in s["perfdiag_diagnosis_culprit"])
    assert culprits == sorted(verdict["culpritRanks"])[:MAX_CULPRIT_SERIES]
    findings = sorted(s["perfdiag_diagnosis_finding_severity"], key=lambda f: f[0]["position"])
    assert [
        # (Prometheus keeps no empty label: an empty node or function is no label)
        (f["position"], f["kind"], f["category"], f["ranks"], f.get("node", ""),
         f.get("function", ""), value)
        for f, value in findings
    ] == [
        (str(i), f["kind"], f["category"], format_runs(rank_runs(f["ranks"])),
         f.get("node") or "", (f.get("function") or "")[:MAX_LABEL_CHARS], f["severity"])
        for i, f in enumerate(verdict["topFindings"], start=1)
    ]  # fmt: skip
    workers = _by(s["perfdiag_job_workers"], "state")
    want = dict(status["workers"])
    want["failed"], want["stuck"] = len(want["failed"]), len(want["stuck"])
    assert workers == {k: float(v) for k, v in want.items()}, (workers, want)
    watch = status["watch"]
    assert _only(s["perfdiag_job_steps_per_second"], "rate") == watch["stepsPerSecond"]
    assert _only(s["perfdiag_job_furthest_step"], "step") == watch["step"]
    if percent is None:
        for metric in ("perfdiag_job_step_seconds", "perfdiag_job_slowdown_threshold_ratio"):
            assert not s[metric], (metric, s[metric])
        return
    # STEP-MS and BASELINE-MS, the ratio and the rule's threshold.
    step = _only(s["perfdiag_job_step_seconds"], "step time")
    baseline = _only(s["perfdiag_job_baseline_step_seconds"], "baseline")
    assert step == watch["stepMs"] / 1000 and baseline == watch["baselineStepMs"] / 1000
    assert abs(_only(s["perfdiag_job_slowdown_ratio"], "ratio") - step / baseline) < 1e-9
    assert _only(s["perfdiag_job_slowdown_threshold_ratio"], "threshold") == 1 + percent / 100
    assert _only(s["perfdiag_job_slowest_rank"], "rank") == watch["rank"]
    assert _only(s["perfdiag_job_slowdown_detected_timestamp_seconds"], "fired") == _time(
        status["window"]["startTime"]
    )


def assert_counted(scraped: Scraped, obj: dict[str, Any], *, trigger: bool, pods: int) -> None:
    """The operator's counters after one diagnosis ran to its verdict."""
    c = scraped.counters
    status = obj["status"]
    assert 0 < scraped.series_count <= MAX_SERIES_PER_DIAGNOSIS, scraped.series_count
    assert c["finished"] == 1, c
    assert c["ttv_count"] == 1, c
    created = _time(obj["metadata"]["creationTimestamp"])
    assert abs(c["ttv_sum"] - (_time(status["completionTime"]) - created)) <= 1.0, (c, status)
    assert c["slowdown_captures"] == (1 if trigger else 0), c
    assert c["analyzer_started"] == 1 and c["analyzer_done"] == 1, c
    assert c["injected"] >= pods, c  # the job's pods, and the dry runs that probed the webhook
    assert c["fail_open"] == 0, c


def describe(scraped: Scraped) -> str:
    return json.dumps(
        {"counters": scraped.counters, "alerts": scraped.alerts, "panels": scraped.panels},
        indent=1,
        default=str,
    )
