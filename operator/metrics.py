"""The operator's Prometheus metrics (docs/operator.md, "Monitoring"), served on a port of their
own (PERFDIAG_METRICS_PORT) at /metrics.

Two kinds:

- **What the operator did**, counted as it happens (`OperatorMetrics`, one registry per operator
  run): diagnoses finished by phase and outcome, the time from a diagnosis' creation to its
  verdict, captures fired by a slowdown, reconcile errors by reason, analyzer Jobs (started,
  durations, failures), the pod webhook's admissions and fail-opens. The reconciler counts a
  transition after the status write that records it, and two passes cannot both write one
  (409 Conflict), so a transition is counted once per operator process.
- **What the operator knows about each diagnosis and its job**, read at scrape time from the
  objects themselves (`DiagnosesCollector` over a kopf index of every PerfDiagnosis): its phase,
  the job's step time and baseline (STEP-MS and BASELINE-MS), the slowdown ratio, the workers,
  the verdict, its top findings and the first culprit ranks. Nothing of it lives in the
  operator's memory: a restarted operator serves the same series once kopf has listed the
  objects, and a deleted diagnosis' series go with it.

Label sets stay bounded whatever the job's size: one set per diagnosis, never one per rank,
except the first MAX_CULPRIT_SERIES culprit ranks a verdict names and its MAX_STATUS_FINDINGS
top findings (whose `ranks` label is the status' short runs text, cut with a count).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import ValidationError

from perfdiag.api.diagnosis import (
    TERMINAL_PHASES,
    PerfDiagnosisSpec,
    PerfDiagnosisStatus,
    Phase,
)
from perfdiag.api.ranks import format_runs, rank_runs
from perfdiag.api.verdict import VerdictStatus
from perfdiag.operator.analyzer_job import JobState
from perfdiag.operator.kube import ApiException, status_of
from perfdiag.operator.status import READY, STALLED

log = logging.getLogger("perfdiag.operator.metrics")

PHASES: tuple[str, ...] = get_args(Phase)
VERDICT_STATUSES: tuple[str, ...] = get_args(VerdictStatus)
WORKER_STATES = ("expected", "reporting", "captured", "missing", "failed", "stuck")
MAX_CULPRIT_SERIES = 8
"""Culprit ranks of a verdict given a series of their own (the first ones); the rest are counted
in perfdiag_diagnosis_culprit_ranks and shown in the verdict's `culprits` label."""
MAX_LABEL_CHARS = 120
"""A label value made from free text (a function name) is cut to this length."""

TIME_TO_VERDICT_BUCKETS = (30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400, 604800)
"""Seconds from a diagnosis' creation to its verdict: a one-shot capture takes minutes, one
that waits for a slowdown (spec.trigger) may take days."""
ANALYZER_BUCKETS = (5, 10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600)

RECONCILE_ERRORS = (
    "StorageUnavailable",
    "Conflict",
    "ApiForbidden",
    "ApiNotFound",
    "ApiServerError",
    "ApiError",
    "Unexpected",
)
"""Reasons of perfdiag_reconcile_errors_total (every one is exported from the start, at 0)."""
ANALYZER_FAILURES = ("BackoffLimitExceeded", "DeadlineExceeded", "VerdictUnreadable")
"""Analyzer failure reasons exported from the start; the Job controller's other reasons (e.g.
PodFailurePolicy) appear when they happen."""
ADMISSION_RESULTS = ("injected", "already_injected", "no_storage", "error")
FAIL_OPEN_REASONS = ("NoStorage", "InjectionError")
"""Why the webhook admitted an opted-in pod without perfdiag: the operator has no storage
configured, or the injection raised (the pod is admitted unchanged: the webhook fails open)."""


# ---- what the operator did ---------------------------------------------------------------------


@dataclass(frozen=True)
class PassRecord:
    """What one written reconcile pass changed that the counters count (pure: `pass_record`)."""

    finished: tuple[str, str] | None = None  # (phase, outcome): verdict status, or the reason
    time_to_verdict: float | None = None  # seconds from creation to the verdict
    slowdown_fired: bool = False
    analyzer: tuple[str, float | None] | None = None  # the Job's (outcome, seconds) once over
    analyzer_failure: str | None = None  # why the analysis failed (the Job's reason…)


def _condition_reason(status: PerfDiagnosisStatus, type_: str) -> str:
    found = next((c for c in status.conditions if c.type == type_), None)
    return found.reason if found is not None and found.reason else ""


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max((end - start).total_seconds(), 0.0)


def pass_record(
    old: PerfDiagnosisStatus | None,
    new: PerfDiagnosisStatus,
    *,
    created: datetime | None,
    job: JobState | None = None,
) -> PassRecord:
    """The transitions from `old` to `new` that are counted: the diagnosis finished (and how),
    its verdict came (after how long since `created`), a slowdown fired its capture, its
    analyzer Job ended (`job`: the Job's state as this pass read it)."""
    before = old.phase if old is not None else "Pending"
    finished: tuple[str, str] | None = None
    time_to_verdict: float | None = None
    analyzer: tuple[str, float | None] | None = None
    failure: str | None = None
    if new.phase in TERMINAL_PHASES and before not in TERMINAL_PHASES:
        if new.phase == "Succeeded" and new.verdict is not None:
            finished = ("Succeeded", str(new.verdict.status))
            time_to_verdict = _seconds(created or new.start_time, new.completion_time)
        else:
            finished = (new.phase, _condition_reason(new, STALLED) or "Unknown")
        if before == "Analyzing" and job is not None and job.outcome != "running":
            analyzer = (job.outcome, _seconds(job.started, job.finished))
        reason = finished[1]
        if reason == "AnalyzerFailed":
            failure = job.reason if job is not None and job.reason else "Failed"
        elif reason == "VerdictUnreadable":
            failure = reason
    fired = (
        new.watch is not None
        and new.watch.slowdown is not None
        and (old is None or old.watch is None or old.watch.slowdown is None)
    )
    return PassRecord(finished, time_to_verdict, fired, analyzer, failure)


def error_reason(exc: BaseException) -> str:
    """The reason label of a reconcile pass that raised `exc`."""
    if isinstance(exc, ApiException):
        code = status_of(exc)
        if code == 409:
            return "Conflict"
        if code == 403:
            return "ApiForbidden"
        if code == 404:
            return "ApiNotFound"
        if code is not None and code >= 500:
            return "ApiServerError"
        return "ApiError"
    return "Unexpected"


class OperatorMetrics:
    """The operator's counters and histograms, in a registry of their own (one per operator run,
    so that operators run one after another in one process, as in the tests, start at zero)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes…
        PlatformCollector(registry=r)  # python_info
        self.finished = Counter(
            "perfdiag_diagnoses_finished",
            "Diagnoses that ended: phase Succeeded with the verdict's status as outcome, or "
            "phase Failed with the Stalled condition's reason as outcome.",
            ["phase", "outcome"],
            registry=r,
        )
        self.time_to_verdict = Histogram(
            "perfdiag_diagnosis_time_to_verdict_seconds",
            "Seconds from a PerfDiagnosis' creation to its verdict in status; trigger: slowdown "
            "(spec.trigger: the wait for the slowdown included) or none.",
            ["trigger"],
            buckets=TIME_TO_VERDICT_BUCKETS,
            registry=r,
        )
        self.slowdown_captures = Counter(
            "perfdiag_slowdown_captures",
            "Captures started because a watched job slowed down (spec.trigger.slowdown fired).",
            registry=r,
        )
        self.reconcile_errors = Counter(
            "perfdiag_reconcile_errors",
            "Reconcile passes that failed or could not reach storage, by reason.",
            ["reason"],
            registry=r,
        )
        self.analyzer_started = Counter(
            "perfdiag_analyzer_jobs_started", "Analyzer Jobs created.", registry=r
        )
        self.analyzer_duration = Histogram(
            "perfdiag_analyzer_job_duration_seconds",
            "Seconds an analyzer Job ran (its start to its completion or failure), by outcome.",
            ["outcome"],
            buckets=ANALYZER_BUCKETS,
            registry=r,
        )
        self.analyzer_failures = Counter(
            "perfdiag_analyzer_job_failures",
            "Analyses that gave no verdict: the Job controller's reason for a failed Job, or "
            "VerdictUnreadable.",
            ["reason"],
            registry=r,
        )
        self.admissions = Counter(
            "perfdiag_webhook_admissions",
            "Pods the mutating webhook was asked about (dry runs included), by result.",
            ["result"],
            registry=r,
        )
        self.fail_open = Counter(
            "perfdiag_webhook_fail_open",
            "Opted-in pods the webhook admitted without perfdiag, by reason.",
            ["reason"],
            registry=r,
        )
        # Every known label value from the start: a rate() or an alert sees 0, not nothing.
        for outcome in VERDICT_STATUSES:
            self.finished.labels("Succeeded", outcome)
        self.finished.labels("Failed", "AnalyzerFailed")
        for trigger in ("none", "slowdown"):
            self.time_to_verdict.labels(trigger)
        for reason in RECONCILE_ERRORS:
            self.reconcile_errors.labels(reason)
        for outcome in ("succeeded", "failed"):
            self.analyzer_duration.labels(outcome)
        for reason in ANALYZER_FAILURES:
            self.analyzer_failures.labels(reason)
        for result in ADMISSION_RESULTS:
            self.admissions.labels(result)
        for reason in FAIL_OPEN_REASONS:
            self.fail_open.labels(reason)

    def record(self, record: PassRecord, *, trigger: bool) -> None:
        if record.finished is not None:
            self.finished.labels(*record.finished).inc()
        if record.time_to_verdict is not None:
            self.time_to_verdict.labels("slowdown" if trigger else "none").observe(
                record.time_to_verdict
            )
        if record.slowdown_fired:
            self.slowdown_captures.inc()
        if record.analyzer is not None:
            outcome, seconds = record.analyzer
            if seconds is not None:
                self.analyzer_duration.labels(outcome).observe(seconds)
        if record.analyzer_failure is not None:
            self.analyzer_failures.labels(record.analyzer_failure).inc()

    def storage_unavailable(self, status: PerfDiagnosisStatus) -> None:
        """A pass that could not reach storage (the status says StorageUnavailable)."""
        if _condition_reason(status, READY) == "StorageUnavailable":
            self.reconcile_errors.labels("StorageUnavailable").inc()

    def reconcile_error(self, reason: str) -> None:
        self.reconcile_errors.labels(reason).inc()

    def admitted(self, result: str) -> None:
        self.admissions.labels(result).inc()

    def failed_open(self, reason: str) -> None:
        self.fail_open.labels(reason).inc()


# ---- what the operator knows about each diagnosis ------------------------------------------------


@dataclass(frozen=True)
class DiagnosisView:
    """One PerfDiagnosis as the metrics read it (the value of the operator's kopf index)."""

    namespace: str
    name: str
    target_kind: str
    target: str
    trigger_percent: float | None
    status: PerfDiagnosisStatus | None


def view_of(
    namespace: str, name: str, spec: Mapping[str, Any] | None, status: Mapping[str, Any] | None
) -> DiagnosisView:
    """The view of an object's spec and status (a spec or status this version cannot read is
    shown with what can be: its target's kind and name, no status)."""
    raw_spec = dict(spec or {})
    found = raw_spec.get("target")
    raw_target: dict[str, Any] = found if isinstance(found, dict) else {}
    kind, target = str(raw_target.get("kind") or ""), str(raw_target.get("name") or "")
    percent = None
    try:
        parsed = PerfDiagnosisSpec.model_validate(raw_spec)
    except ValidationError:
        pass
    else:
        kind, target = parsed.target.kind, parsed.target.name or ""
        percent = parsed.trigger.slowdown.percent if parsed.trigger is not None else None
    try:
        current = PerfDiagnosisStatus.model_validate(dict(status)) if status else None
    except ValidationError:
        current = None
    return DiagnosisView(namespace, name, kind, target, percent, current)


def _timestamp(when: datetime | None) -> float | None:
    return when.timestamp() if when is not None else None


class _Families:
    """The gauge families of one scrape, filled diagnosis by diagnosis."""

    JOB_LABELS = ("namespace", "diagnosis", "target_kind", "target")

    def __init__(self) -> None:
        job = list(self.JOB_LABELS)
        self.by_phase = GaugeMetricFamily(
            "perfdiag_diagnoses", "PerfDiagnosis objects by phase.", labels=["phase"]
        )
        self.info = GaugeMetricFamily(
            "perfdiag_diagnosis_info",
            "1 for each PerfDiagnosis: its phase and the reason of its Ready condition.",
            labels=[*job, "phase", "reason"],
        )
        self.created = GaugeMetricFamily(
            "perfdiag_diagnosis_start_timestamp_seconds",
            "When the operator began the diagnosis (status.startTime), unix seconds.",
            labels=job,
        )
        self.completed = GaugeMetricFamily(
            "perfdiag_diagnosis_completion_timestamp_seconds",
            "When the diagnosis succeeded or failed (status.completionTime), unix seconds.",
            labels=job,
        )
        self.step = GaugeMetricFamily(
            "perfdiag_job_step_seconds",
            "The job's current step time (status.watch.stepMs, the STEP-MS column): its slowest "
            "rank's mean step over the rule's steps, without the longest.",
            labels=job,
        )
        self.baseline = GaugeMetricFamily(
            "perfdiag_job_baseline_step_seconds",
            "The job's baseline step time (status.watch.baselineStepMs, BASELINE-MS): the "
            "shortest recent step time.",
            labels=job,
        )
        self.ratio = GaugeMetricFamily(
            "perfdiag_job_slowdown_ratio",
            "The job's step time over its baseline (1.25: 25% slower).",
            labels=job,
        )
        self.threshold = GaugeMetricFamily(
            "perfdiag_job_slowdown_threshold_ratio",
            "The ratio at which spec.trigger.slowdown fires (1 + percent / 100).",
            labels=job,
        )
        self.rate = GaugeMetricFamily(
            "perfdiag_job_steps_per_second",
            "The job's step rate (status.watch.stepsPerSecond).",
            labels=job,
        )
        self.furthest = GaugeMetricFamily(
            "perfdiag_job_furthest_step",
            "The furthest training step the job's ranks reported (status.watch.step).",
            labels=job,
        )
        self.slowest = GaugeMetricFamily(
            "perfdiag_job_slowest_rank",
            "The rank whose step time is the job's (status.watch.rank).",
            labels=job,
        )
        self.fired = GaugeMetricFamily(
            "perfdiag_job_slowdown_detected_timestamp_seconds",
            "When spec.trigger.slowdown fired and the capture was planned, unix seconds.",
            labels=job,
        )
        self.workers = GaugeMetricFamily(
            "perfdiag_job_workers",
            "The job's ranks in the diagnosis by state: expected, reporting, captured, missing, "
            "failed, stuck (status.workers).",
            labels=[*job, "state"],
        )
        self.verdict = GaugeMetricFamily(
            "perfdiag_diagnosis_verdict",
            "1 for a diagnosis with a verdict: its status (healthy, degraded, hang, incomplete) "
            "and its culprit ranks as short runs (the CULPRITS column).",
            labels=[*job, "status", "culprits"],
        )
        self.culprit_count = GaugeMetricFamily(
            "perfdiag_diagnosis_culprit_ranks",
            "How many ranks the verdict names as culprits.",
            labels=job,
        )
        self.culprit = GaugeMetricFamily(
            "perfdiag_diagnosis_culprit",
            f"1 for each of the first {MAX_CULPRIT_SERIES} culprit ranks the verdict names.",
            labels=[*job, "rank"],
        )
        self.finding = GaugeMetricFamily(
            "perfdiag_diagnosis_finding_severity",
            "The verdict's top findings (position 1 is the most severe): the estimated fraction "
            "of step time lost, with the finding's kind, category, ranks (short runs), node "
            "(slow_node findings) and function.",
            labels=[*job, "position", "kind", "category", "ranks", "node", "function"],
        )

    def add(self, view: DiagnosisView) -> None:
        job = [view.namespace, view.name, view.target_kind, view.target]
        status = view.status or PerfDiagnosisStatus()
        self.info.add_metric([*job, status.phase, _condition_reason(status, READY)], 1.0)
        if (started := _timestamp(status.start_time)) is not None:
            self.created.add_metric(job, started)
        if (completed := _timestamp(status.completion_time)) is not None:
            self.completed.add_metric(job, completed)
        watch = status.watch
        if watch is not None:
            if watch.step_ms is not None:
                self.step.add_metric(job, watch.step_ms / 1000.0)
            if watch.baseline_step_ms is not None:
                self.baseline.add_metric(job, watch.baseline_step_ms / 1000.0)
            if watch.step_ms is not None and watch.baseline_step_ms:
                self.ratio.add_metric(job, watch.step_ms / watch.baseline_step_ms)
            if watch.steps_per_second is not None:
                self.rate.add_metric(job, watch.steps_per_second)
            if watch.step is not None:
                self.furthest.add_metric(job, float(watch.step))
            if watch.rank is not None:
                self.slowest.add_metric(job, float(watch.rank))
            if watch.slowdown is not None:
                when = status.window.start_time if status.window is not None else None
                if (fired := _timestamp(when)) is not None:
                    self.fired.add_metric(job, fired)
        if view.trigger_percent is not None:
            self.threshold.add_metric(job, 1.0 + view.trigger_percent / 100.0)
        workers = status.workers
        if workers is not None:
            counts = {
                "expected": workers.expected,
                "reporting": workers.reporting,
                "captured": workers.captured,
                "missing": workers.missing,
                "failed": len(workers.failed),
                "stuck": len(workers.stuck),
            }
            for state in WORKER_STATES:
                if (count := counts[state]) is not None:
                    self.workers.add_metric([*job, state], float(count))
        verdict = status.verdict
        if verdict is None:
            return
        culprits = verdict.culprits or format_runs(rank_runs(verdict.culprit_ranks))
        self.verdict.add_metric([*job, verdict.status, culprits], 1.0)
        self.culprit_count.add_metric(job, float(len(verdict.culprit_ranks)))
        for rank in sorted(verdict.culprit_ranks)[:MAX_CULPRIT_SERIES]:
            self.culprit.add_metric([*job, str(rank)], 1.0)
        for position, finding in enumerate(verdict.top_findings, start=1):
            labels = [
                str(position),
                finding.kind,
                finding.category,
                format_runs(rank_runs(finding.ranks)),
                finding.node or "",
                (finding.function or "")[:MAX_LABEL_CHARS],
            ]
            self.finding.add_metric([*job, *labels], finding.severity)

    def families(self, phases: Mapping[str, int]) -> list[Metric]:
        for phase in PHASES:
            self.by_phase.add_metric([phase], float(phases.get(phase, 0)))
        return [
            self.by_phase,
            self.info,
            self.created,
            self.completed,
            self.step,
            self.baseline,
            self.ratio,
            self.threshold,
            self.rate,
            self.furthest,
            self.slowest,
            self.fired,
            self.workers,
            self.verdict,
            self.culprit_count,
            self.culprit,
            self.finding,
        ]


def diagnosis_families(views: Iterable[DiagnosisView]) -> list[Metric]:
    """The per-diagnosis gauges of one scrape (pure)."""
    families = _Families()
    phases: dict[str, int] = {}
    for view in sorted(views, key=lambda v: (v.namespace, v.name)):
        families.add(view)
        phase = view.status.phase if view.status is not None else "Pending"
        phases[phase] = phases.get(phase, 0) + 1
    return families.families(phases)


class DiagnosesCollector(Collector):
    """The per-diagnosis gauges, made at each scrape from `views` (the kopf index)."""

    def __init__(self, views: Callable[[], Iterable[DiagnosisView]]) -> None:
        self._views = views

    def describe(self) -> list[Metric]:
        return []  # nothing to read before the operator runs; no check of names at register

    def collect(self) -> Iterator[Metric]:
        yield from diagnosis_families(list(self._views()))
