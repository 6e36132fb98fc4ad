"""The operator's Prometheus metrics without a cluster: what a written pass counts (pure), the
per-diagnosis series made from statuses (bounded at 100,000 ranks), the exposition as
Prometheus parses it, and the /metrics endpoint served in an event loop. Scraped by a real
Prometheus during the end-to-end tests (tests/operator/test_e2e.py, test_e2e_trigger.py)."""

from __future__ import annotations

import asyncio
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from perfdiag.api.diagnosis import PerfDiagnosisStatus
from perfdiag.api.ranks import format_runs, rank_runs
from perfdiag.operator.analyzer_job import JobState, job_state
from perfdiag.operator.kube import ApiException
from perfdiag.operator.metrics import (
    MAX_CULPRIT_SERIES,
    DiagnosesCollector,
    DiagnosisView,
    OperatorMetrics,
    diagnosis_families,
    error_reason,
    pass_record,
    view_of,
)
from perfdiag.operator.metrics_server import MetricsServer

NOW = datetime(2026, 11, 22, 2, 0, 0, tzinfo=timezone.utc)
CREATED = NOW - timedelta(minutes=7)
SPEC = {"target": {"kind": "PyTorchJob", "name": "bert"}, "trigger": {"slowdown": {"percent": 25}}}


def _condition(type_: str, status: str, reason: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": "m",
            "lastTransitionTime": "2026-11-22T01:00:00Z"}  # fmt: skip


def _status(phase: str, **more: Any) -> PerfDiagnosisStatus:
    conditions = more.pop("conditions", [])
    return PerfDiagnosisStatus.model_validate(
        {"phase": phase, "startTime": CREATED.isoformat(), "conditions": conditions, **more}
    )


WATCH = {
    "planId": "d-uid-watch", "reporting": 4, "step": 1200, "stepMs": 62.5, "rank": 3,
    "baselineStepMs": 50.0, "baselineStep": 800, "stepsPerSecond": 16.0,
}  # fmt: skip
FIRED = {
    "rank": 3, "step": 1200, "meanStepMs": 62.5, "baselineStepMs": 50.0, "baselineStep": 800,
    "steps": 50, "thresholdPercent": 25.0,
}  # fmt: skip


def _verdict(ranks: list[int], status: str = "degraded") -> dict[str, Any]:
    finding = {"kind": "slow_worker", "category": "cpu_op", "function": "aten::mm",
               "ranks": ranks, "severity": 0.4, "message": "slow"}  # fmt: skip
    node = {**finding, "kind": "slow_node", "node": "node-b", "severity": 0.2}
    return {
        "status": status,
        "summary": "s",
        "topFindings": [finding, node],
        "culpritRanks": ranks,
        "culprits": format_runs(rank_runs(ranks)),
        "culpritPods": ["bert-worker-0"],
    }


def test_a_verdict_counts_the_outcome_the_time_and_the_analyzer_job() -> None:
    analyzing = _status("Analyzing", watch=WATCH)
    done = _status(
        "Succeeded", watch=WATCH, verdict=_verdict([3]), completionTime=NOW.isoformat(),
        conditions=[_condition("Ready", "True", "VerdictReady")],
    )  # fmt: skip
    job = job_state(
        {"status": {"startTime": "2026-11-22T01:58:00Z", "completionTime": "2026-11-22T01:58:41Z",
                    "conditions": [{"type": "Complete", "status": "True"}]}}
    )  # fmt: skip
    record = pass_record(analyzing, done, created=CREATED, job=job)
    assert record.finished == ("Succeeded", "degraded")
    assert record.time_to_verdict == 7 * 60
    assert record.analyzer == ("succeeded", 41.0)
    assert record.analyzer_failure is None and not record.slowdown_fired
    # The same status again (an unchanged pass, a restart): nothing more.
    again = pass_record(done, done, created=CREATED, job=job)
    assert again.finished is None and again.time_to_verdict is None and again.analyzer is None


def test_failures_count_their_reason() -> None:
    analyzing = _status("Analyzing")
    failed = _status(
        "Failed", conditions=[_condition("Stalled", "True", "AnalyzerFailed")],
        completionTime=NOW.isoformat(),
    )  # fmt: skip
    job = JobState("failed", "DeadlineExceeded", started=NOW - timedelta(seconds=900),
                   finished=NOW)  # fmt: skip
    record = pass_record(analyzing, failed, created=CREATED, job=job)
    assert record.finished == ("Failed", "AnalyzerFailed")
    assert record.analyzer == ("failed", 900.0)
    assert record.analyzer_failure == "DeadlineExceeded"
    gone = _status("Failed", conditions=[_condition("Stalled", "True", "TargetGone")])
    record = pass_record(_status("Watching"), gone, created=CREATED)
    assert record.finished == ("Failed", "TargetGone") and record.analyzer_failure is None


def test_a_slowdown_that_fires_is_counted_once() -> None:
    watching = _status("Watching", watch=WATCH)
    capturing = _status("Capturing", watch={**WATCH, "slowdown": FIRED})
    assert pass_record(watching, capturing, created=CREATED).slowdown_fired
    assert not pass_record(capturing, capturing, created=CREATED).slowdown_fired


def test_reconcile_error_reasons() -> None:
    assert error_reason(ApiException(status=409)) == "Conflict"
    assert error_reason(ApiException(status=403)) == "ApiForbidden"
    assert error_reason(ApiException(status=503)) == "ApiServerError"
    assert error_reason(ApiException(status=422)) == "ApiError"
    assert error_reason(ValueError("x")) == "Unexpected"


def _samples(families: list[Any]) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = "".join(
        f"# TYPE {f.name} gauge\n"
        + "".join(
            f"{s.name}{{{','.join(f'{k}={_quote(v)}' for k, v in s.labels.items())}}} {s.value}\n"
            for s in f.samples
        )
        for f in families
    )
    parsed: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            parsed.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return parsed


def _quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def test_a_watched_job_and_its_verdict_as_series() -> None:
    status = {
        "phase": "Succeeded",
        "startTime": CREATED.isoformat(),
        "completionTime": NOW.isoformat(),
        "conditions": [_condition("Ready", "True", "VerdictReady")],
        "watch": {**WATCH, "slowdown": FIRED},
        "window": {"planId": "d-uid", "startTime": (NOW - timedelta(minutes=3)).isoformat()},
        "workers": {"expected": 4, "captured": 4, "reporting": 4},
        "verdict": _verdict([3]),
    }
    view = view_of("team-a", "bert-slow", SPEC, status)
    series = _samples(diagnosis_families([view]))
    job = {"namespace": "team-a", "diagnosis": "bert-slow", "target_kind": "PyTorchJob",
           "target": "bert"}  # fmt: skip
    assert series["perfdiag_job_step_seconds"] == [(job, 0.0625)]
    assert series["perfdiag_job_baseline_step_seconds"] == [(job, 0.05)]
    assert series["perfdiag_job_slowdown_ratio"] == [(job, 1.25)]
    assert series["perfdiag_job_slowdown_threshold_ratio"] == [(job, 1.25)]
    assert series["perfdiag_job_slowest_rank"] == [(job, 3.0)]
    assert series["perfdiag_job_slowdown_detected_timestamp_seconds"] == [
        (job, (NOW - timedelta(minutes=3)).timestamp())
    ]
    assert series["perfdiag_diagnosis_info"] == [
        ({**job, "phase": "Succeeded", "reason": "VerdictReady"}, 1.0)
    ]
    assert series["perfdiag_diagnosis_verdict"] == [
        ({**job, "status": "degraded", "culprits": "3"}, 1.0)
    ]
    assert series["perfdiag_diagnosis_culprit"] == [({**job, "rank": "3"}, 1.0)]
    first, second = series["perfdiag_diagnosis_finding_severity"]
    assert first == ({**job, "position": "1", "kind": "slow_worker", "category": "cpu_op",
                      "ranks": "3", "node": "", "function": "aten::mm"}, 0.4)  # fmt: skip
    assert second[0]["node"] == "node-b" and second[0]["kind"] == "slow_node"
    workers = {labels["state"]: value for labels, value in series["perfdiag_job_workers"]}
    assert workers == {"expected": 4, "reporting": 4, "captured": 4, "missing": 0, "failed": 0,
                       "stuck": 0}  # fmt: skip
    phases = {labels["phase"]: value for labels, value in series["perfdiag_diagnoses"]}
    assert phases["Succeeded"] == 1 and sum(phases.values()) == 1 and len(phases) == 6


def test_series_stay_bounded_at_100000_ranks() -> None:
    """A job of 100,000 ranks whose verdict names half of them, in findings naming tens of
    thousands each: a few dozen series, whose label values stay short."""
    ranks = list(range(0, 100_000, 2))
    verdict = _verdict(ranks, status="hang")
    verdict["topFindings"] = [
        {**verdict["topFindings"][0], "ranks": ranks[i::5], "function": "f" * 5000}
        for i in range(5)
    ]
    status = {
        "phase": "Succeeded",
        "watch": WATCH,
        "workers": {"expected": 100_000, "captured": 99_000, "missing": 1000, "reporting": 99_000,
                    "stuck": ranks[:1000], "failed": ranks[:10]},
        "verdict": verdict,
    }  # fmt: skip
    views = [view_of("ns", f"big-{i}", SPEC, status) for i in range(3)]
    series = _samples(diagnosis_families(views))
    per_diagnosis = sum(len(s) for s in series.values()) - len(series["perfdiag_diagnoses"])
    assert per_diagnosis <= 3 * 40, {name: len(s) for name, s in series.items()}
    assert len(series["perfdiag_diagnosis_culprit"]) == 3 * MAX_CULPRIT_SERIES
    assert series["perfdiag_diagnosis_culprit_ranks"][0][1] == 50_000
    for samples in series.values():
        for labels, _ in samples:
            assert all(len(value) <= 256 for value in labels.values()), labels


def test_an_unreadable_object_is_still_shown() -> None:
    """A spec or status this version cannot read: the target as written, no status."""
    view = view_of("ns", "odd", {"target": {"kind": "Pods", "name": "p"}, "x": 1}, {"phase": 7})
    assert view == DiagnosisView("ns", "odd", "Pods", "p", None, None)
    series = _samples(diagnosis_families([view]))
    assert series["perfdiag_diagnosis_info"] == [
        ({"namespace": "ns", "diagnosis": "odd", "target_kind": "Pods", "target": "p",
          "phase": "Pending", "reason": ""}, 1.0)
    ]  # fmt: skip


def test_the_exposition_has_every_counter_from_the_start() -> None:
    metrics = OperatorMetrics()
    metrics.registry.register(DiagnosesCollector(lambda: []))
    text = generate_latest(metrics.registry).decode()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert {
        "perfdiag_diagnoses_finished_total",
        "perfdiag_diagnosis_time_to_verdict_seconds_bucket",
        "perfdiag_slowdown_captures_total",
        "perfdiag_reconcile_errors_total",
        "perfdiag_analyzer_jobs_started_total",
        "perfdiag_analyzer_job_duration_seconds_count",
        "perfdiag_analyzer_job_failures_total",
        "perfdiag_webhook_admissions_total",
        "perfdiag_webhook_fail_open_total",
        "perfdiag_diagnoses",
    } <= names
    assert 'perfdiag_webhook_fail_open_total{reason="InjectionError"} 0.0' in text


def test_metrics_are_served_in_the_event_loop() -> None:
    metrics = OperatorMetrics()
    metrics.admitted("injected")

    async def scrape() -> str:
        server = MetricsServer(metrics.registry, "127.0.0.1", 0)
        await server.start()
        try:
            url = server.url
            return await asyncio.to_thread(lambda: urllib.request.urlopen(url).read().decode())
        finally:
            await server.stop()

    text = asyncio.run(scrape())
    assert 'perfdiag_webhook_admissions_total{result="injected"} 1.0' in text


@pytest.mark.parametrize("reason", ["NoStorage", "InjectionError"])
def test_fail_open_reasons_are_known(reason: str) -> None:
    metrics = OperatorMetrics()
    metrics.failed_open(reason)
    assert metrics.fail_open.labels(reason)._value.get() == 1
