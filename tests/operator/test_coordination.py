"""Capture coordination decisions (pure): arm, follow, deadline, analyzer Job, verdict."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from perfdiag.api.diagnosis import PerfDiagnosisSpec, PerfDiagnosisStatus
from perfdiag.api.plan import Plan
from perfdiag.api.verdict import (
    Finding,
    RankRange,
    StepTimes,
    Verdict,
    WindowInfo,
    WorkerInfo,
)
from perfdiag.api.worker import WorkerStatus
from perfdiag.operator.analyzer_job import (
    analyzer_job,
    job_name,
    job_state,
    memory_needed,
    sized_for_workers,
)
from perfdiag.operator.coordination import (
    MAX_EXTRAPOLATION_S,
    RATE_STEPS,
    RATE_WAIT_S,
    World,
    capture_lead,
    decide,
    expected_ranks,
    our_plan_ids,
    plan_annotations,
    plan_id,
    pods_to_disarm,
    stacks_plan_id,
    step_now,
    verdict_summary,
    watch_plan_id,
)
from perfdiag.operator.settings import DEFAULT_CAPTURE_LEAD_SECONDS, KUBELET_CAPTURE_LEAD_SECONDS

NOW = datetime(2026, 11, 22, 2, 0, 0, tzinfo=timezone.utc)
UID = "0f2d6c1e-1111-2222-3333-444455556666"
ROOT = "s3://b/perfdiag"
SPEC = PerfDiagnosisSpec.model_validate(
    {"target": {"kind": "PyTorchJob", "name": "bert"}, "capture": {"steps": 10}}
)


def _pod(
    name: str,
    *,
    injected: bool = True,
    nproc: str = "2",
    follows: bool = True,
    **annotations: str,
) -> dict[str, Any]:
    """A target pod; injected, it has the agent as this version's webhook adds it (`follows`:
    with POD_UID, reading its plan from storage; False: as an earlier perfdiag injected it)."""
    notes = dict(annotations)
    spec: dict[str, Any] = {
        "containers": [{"name": "pytorch", "env": [{"name": "PET_NPROC_PER_NODE", "value": nproc}]}]
    }
    if injected:
        notes["perfdiag.io/injected"] = "0.1.0"
        env = [{"name": "POD_NAME"}, *([{"name": "POD_UID"}] if follows else [])]
        spec["initContainers"] = [{"name": "perfdiag-agent", "env": env}]
    return {"metadata": {"name": name, "annotations": notes}, "spec": spec}


def _decide(
    status: PerfDiagnosisStatus,
    world: World,
    *,
    now: datetime = NOW,
    spec: PerfDiagnosisSpec = SPEC,
) -> Any:
    return decide(
        name="d",
        uid=UID,
        namespace="ns",
        generation=1,
        spec=spec,
        status=status,
        world=world,
        storage_root=ROOT,
        target="PyTorchJob bert",
        now=now,
    )


def _cond(status: PerfDiagnosisStatus, type_: str) -> tuple[str, str, str]:
    cond = status.condition(type_)
    assert cond is not None
    return cond.status, cond.reason, cond.message


def test_arm_writes_a_deterministic_plan() -> None:
    world = World(pods=[_pod("bert-master-0"), _pod("bert-worker-0")])
    measuring = _decide(PerfDiagnosisStatus(), world)
    assert measuring.actions == ["watch"]  # a one-shot capture measures the step rate first
    reporting = World(pods=world.pods, workers=_watchers(300, {0: 50.0}, NOW))
    decision = _decide(measuring.status, reporting)
    assert decision.actions == ["arm"]
    assert decision.plan.id == plan_id("d", UID) == f"d-{UID}"
    assert decision.plan.steps == 10
    status = decision.status
    assert status.phase == "Capturing"
    assert status.workers.expected == 4
    assert status.artifacts.prefix == f"{ROOT}/ns/d-{UID}"
    assert _cond(status, "Reconciling")[:2] == ("True", "Capturing")
    assert [e.reason for e in decision.events] == ["PlanSent"]
    # Re-arming after a restart sends the same id (the hooks ignore a plan id they took).
    assert _decide(measuring.status, reporting).plan.id == decision.plan.id


def test_pods_without_perfdiag_are_refused_with_how_to_opt_in() -> None:
    world = World(pods=[_pod("bert-master-0"), _pod("bert-worker-0", injected=False)])
    decision = _decide(PerfDiagnosisStatus(), world)
    assert decision.actions == []
    assert decision.status.phase == "Pending"
    stalled, reason, message = _cond(decision.status, "Stalled")
    assert (stalled, reason) == ("True", "NotInjected")
    assert "bert-worker-0" in message and 'perfdiag.io/inject: "true"' in message


def test_second_diagnosis_waits_for_the_first() -> None:
    other = Plan.new(plan_id="first-uid", timeout_s=300)
    annotations = plan_annotations(other, "first")["metadata"]["annotations"]
    world = World(pods=[_pod("bert-master-0", **annotations), _pod("bert-worker-0")])
    decision = _decide(PerfDiagnosisStatus(), world, now=datetime.now(timezone.utc))
    assert decision.actions == []
    status, reason, message = _cond(decision.status, "Reconciling")
    assert (status, reason) == ("True", "WaitingForOtherDiagnosis")
    assert "PerfDiagnosis first" in message
    # Once that plan's deadline has passed, it no longer blocks.
    later = datetime.now(timezone.utc) + timedelta(seconds=301)
    assert _decide(PerfDiagnosisStatus(), world, now=later).actions == ["watch"]


def _capturing(
    expected: int = 4, deadline: datetime = NOW + timedelta(seconds=60)
) -> PerfDiagnosisStatus:
    return PerfDiagnosisStatus.model_validate(
        {
            "phase": "Capturing",
            "window": {"planId": f"d-{UID}", "steps": 10, "deadline": deadline.isoformat()},
            "workers": {"expected": expected},
            "artifacts": {"prefix": f"{ROOT}/ns/d-{UID}"},
        }
    )


def _worker(rank: int, phase: str = "done", stalled: float = 0.0) -> WorkerStatus:
    """A status.json written just now, whose step last advanced `stalled` seconds ago."""
    t = NOW.timestamp()
    return WorkerStatus(
        rank=rank, plan_id=f"d-{UID}", phase=phase,  # type: ignore[arg-type]
        step=20, last_step_unix=t - stalled, updated_unix=t,
    )  # fmt: skip


def test_capture_progress_then_analysis_when_all_reported() -> None:
    pods = [_pod("a"), _pod("b")]
    partial = _decide(
        _capturing(), World(pods=pods, workers={0: _worker(0), 1: _worker(1, "capturing")})
    )
    assert partial.actions == []
    assert partial.status.phase == "Capturing"
    assert partial.status.workers.captured == 1
    assert partial.status.workers.reporting == 2
    assert "1/4 worker(s) captured" in _cond(partial.status, "Reconciling")[2]

    workers = {r: _worker(r) for r in range(4)}
    done = _decide(_capturing(), World(pods=pods, workers=workers))
    assert done.actions == ["disarm", "launch_job"]
    assert done.status.phase == "Analyzing"
    assert done.status.workers.model_dump() == {
        "expected": 4, "captured": 4, "missing": 0, "reporting": 4, "failed": [], "stuck": []
    }  # fmt: skip


def test_deadline_counts_missing() -> None:
    pods = [_pod("a"), _pod("b")]
    workers = {0: _worker(0), 1: _worker(1), 2: _worker(2, "capturing", stalled=5.0)}
    before = _decide(_capturing(), World(pods=pods, workers=workers))
    assert before.actions == []
    assert "2/4 worker(s) captured" in _cond(before.status, "Reconciling")[2]
    after = _decide(
        _capturing(deadline=NOW - timedelta(seconds=1)), World(pods=pods, workers=workers)
    )
    assert after.actions == ["disarm", "launch_job"]
    assert after.status.workers.model_dump() == {
        "expected": 4, "captured": 2, "missing": 2, "reporting": 3, "failed": [], "stuck": []
    }  # fmt: skip
    assert after.events[0].type == "Warning"
    assert "deadline passed" in after.events[0].message


def test_stuck_workers_get_a_stacks_plan_then_the_capture_ends() -> None:
    pods = [_pod("a"), _pod("b")]
    workers = {r: _worker(r, "armed", stalled=61.0 if r == 3 else 0.5) for r in range(4)}
    decision = _decide(_capturing(), World(pods=pods, workers=workers))
    assert decision.actions == ["stacks"]
    assert decision.plan.action == "stacks"
    assert decision.plan.id == f"d-{UID}-stacks"
    assert _cond(decision.status, "Reconciling")[1] == "CollectingStacks"
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "WorkersStuck")]
    assert decision.status.workers.stuck == [3]
    assert decision.status.workers.to_wire()["stuck"] == [3]
    # The spec's stuckAfterSeconds moves the limit (the analyzer Job gets the same).
    patient = SPEC.model_copy(
        update={"analysis": SPEC.analysis.model_copy(update={"stuck_after_seconds": 120.0})}
    )
    assert _decide(_capturing(), World(pods=pods, workers=workers), spec=patient).actions == []

    # The stacks plan sits on the pods: wait for the dumps, then analyze with them.
    notes = plan_annotations(decision.plan, "d")["metadata"]["annotations"]
    armed = [_pod("a", **notes), _pod("b", **notes)]
    waiting = _decide(_capturing(), World(pods=armed, workers=workers, stacks=frozenset({0, 1})))
    assert waiting.actions == []
    assert "2 stack dump(s) in" in _cond(waiting.status, "Reconciling")[2]
    ended = _decide(_capturing(), World(pods=armed, workers=workers, stacks=frozenset(range(4))))
    assert ended.actions == ["disarm", "collect_stacks", "launch_job"]
    assert "rank(s) 3 stuck" in ended.events[0].message
    # Ranks that never answer do not hold the analysis past the stacks plan's deadline.
    late = NOW + timedelta(seconds=31)
    workers_late = {
        r: w.model_copy(update={"updated_unix": late.timestamp()}) for r, w in workers.items()
    }
    assert _decide(_capturing(), World(pods=armed, workers=workers_late), now=late).actions == [
        "disarm", "collect_stacks", "launch_job"
    ]  # fmt: skip


def test_storage_outage_is_a_condition_not_a_failure() -> None:
    decision = _decide(_capturing(), World(pods=[_pod("a")], storage_error="connection refused"))
    assert decision.status.phase == "Capturing"
    status, reason, message = _cond(decision.status, "Reconciling")
    assert (status, reason) == ("True", "StorageUnavailable")
    assert "connection refused" in message


def _verdict() -> Verdict:
    return Verdict(
        status="degraded",
        summary="Rank 3 is slowing the job",
        window=WindowInfo(
            start_step=1, steps=10, step_time_ms=StepTimes(median=1, max=2, per_rank={})
        ),
        workers=[WorkerInfo(rank=r, pod=f"p-{r // 2}") for r in range(4)],
        findings=[
            Finding(
                kind="expected_range",
                category="python",
                ranks=[0, 1, 2, 3],
                severity=0.1,
                message="m",
            ),
            Finding(
                kind="slow_worker",
                category="cpu_op",
                function="aten::mm",
                ranks=[3],
                severity=0.5,
                message="s",
            ),
        ],
    )


def test_verdict_summary_names_culprit_ranks_and_pods() -> None:
    summary = verdict_summary(_verdict())
    assert summary.culprit_ranks == [3]
    assert summary.culprit_pods == ["p-1"]
    assert [f.kind for f in summary.top_findings] == ["slow_worker", "expected_range"]


def test_verdict_summary_names_missing_workers_of_rows_and_ranges() -> None:
    verdict = _verdict()
    workers = [*verdict.workers[:3], WorkerInfo(rank=4, pod="p-2", state="missing")]
    missing = [RankRange(first=3, last=3, reason="no file"), RankRange(first=5, last=6, reason="x")]
    summary = verdict_summary(verdict.model_copy(update={"workers": workers, "missing": missing}))
    assert summary.culprit_ranks == [3, 4, 5, 6]
    assert summary.culprit_pods == ["p-2"]


def _analyzing() -> PerfDiagnosisStatus:
    status = _capturing()
    return status.model_copy(update={"phase": "Analyzing"})


def test_analyzer_job_outcomes() -> None:
    from perfdiag.operator.analyzer_job import JobState

    assert _decide(_analyzing(), World()).actions == ["launch_job"]  # lost Job: create again
    assert _decide(_analyzing(), World(job=JobState("running"))).status.phase == "Analyzing"
    failed = _decide(_analyzing(), World(job=JobState("failed", "BackoffLimitExceeded", "boom")))
    assert failed.status.phase == "Failed"
    assert _cond(failed.status, "Stalled")[:2] == ("True", "AnalyzerFailed")
    assert "BackoffLimitExceeded" in _cond(failed.status, "Stalled")[2]
    ok = _decide(_analyzing(), World(job=JobState("succeeded"), verdict=_verdict()))
    assert ok.status.phase == "Succeeded"
    assert _cond(ok.status, "Ready")[:2] == ("True", "VerdictReady")
    assert ok.status.artifacts.verdict == f"{ROOT}/ns/d-{UID}/verdict.json"
    assert ok.status.verdict.culprit_ranks == [3]
    bad = _decide(_analyzing(), World(job=JobState("succeeded"), verdict_error="not JSON"))
    assert bad.status.phase == "Failed"
    assert _cond(bad.status, "Stalled")[1] == "VerdictUnreadable"


def test_analyzer_job_manifest() -> None:
    diag = {"metadata": {"name": "d" * 70, "namespace": "ns", "uid": UID}}
    job = analyzer_job(
        diag, prefix="s3://b/x", expected_ranks=4, image="img", storage_secret="creds",
        deadline_seconds=900, ttl_seconds=3600,
    )  # fmt: skip
    assert len(job["metadata"]["name"]) <= 63
    assert job["metadata"]["name"] == job_name("d" * 70, UID)
    owner = job["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("PerfDiagnosis", UID, True)
    spec = job["spec"]
    assert spec["activeDeadlineSeconds"] == 900 and spec["ttlSecondsAfterFinished"] == 3600
    container = spec["template"]["spec"]["containers"][0]
    assert container["args"] == ["analyze", "s3://b/x", "--quiet", "--expected-ranks", "4"]
    assert container["resources"]["requests"]["cpu"] == "500m"
    tuned = analyzer_job(
        diag, prefix="s3://b/x", expected_ranks=None, image="img", storage_secret="creds",
        deadline_seconds=900, ttl_seconds=3600, thresholds={"minRatio": 1.5},
    )  # fmt: skip
    assert tuned["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "analyze", "s3://b/x", "--quiet", "--thresholds", '{"minRatio": 1.5}'
    ]  # fmt: skip
    failed = {
        "status": {
            "conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]
        }
    }
    assert job_state(failed).outcome == "failed" and job_state(failed).reason == "DeadlineExceeded"
    assert job_state({"status": {}}).outcome == "running"


def test_the_analyzer_memory_follows_the_workers_past_the_configured_limit() -> None:
    configured = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    assert sized_for_workers(configured, 100_000) == configured  # 2.5 GiB fits
    assert sized_for_workers(configured, None) == configured
    sized = sized_for_workers(configured, 1_000_000)
    need = f"{-(-memory_needed(1_000_000) // 2**20)}Mi"
    assert need == "16649Mi"  # 1 GiB + 16 KiB a worker: 16.3 GiB over the measured 11.5 GB
    assert sized == {"requests": {"cpu": "500m", "memory": need}, "limits": {"memory": need}}
    assert configured["limits"]["memory"] == "4Gi"  # not modified in place
    generous = {"requests": {"memory": "32Gi"}, "limits": {"memory": "8Gi"}}
    assert sized_for_workers(generous, 1_000_000)["requests"]["memory"] == "32Gi"
    diag = {"metadata": {"name": "d", "namespace": "ns", "uid": UID}}
    job = analyzer_job(
        diag, prefix="s3://b/x", expected_ranks=1_000_000, image="img", storage_secret="creds",
        deadline_seconds=900, ttl_seconds=3600,
    )  # fmt: skip
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["memory"] == need


def test_analyzer_job_resources_and_storage_endpoint() -> None:
    diag = {"metadata": {"name": "d", "namespace": "ns", "uid": UID}}
    job = analyzer_job(
        diag, prefix="s3://b/x", expected_ranks=2, image="img", storage_secret="creds",
        deadline_seconds=60, ttl_seconds=0,
        resources={"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "8Gi"}},
        storage_endpoint="http://minio.minio:9000", storage_region="eu-west-1",
    )  # fmt: skip
    assert (
        job["spec"]["activeDeadlineSeconds"] == 60 and job["spec"]["ttlSecondsAfterFinished"] == 0
    )
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "1Gi"},
        "limits": {"memory": "8Gi"},
    }
    assert container["env"] == [
        {"name": "AWS_ENDPOINT_URL", "value": "http://minio.minio:9000"},
        {"name": "AWS_REGION", "value": "eu-west-1"},
    ]
    assert container["envFrom"] == [{"secretRef": {"name": "creds", "optional": True}}]


def test_expected_ranks_from_pod_env() -> None:
    assert expected_ranks([_pod("a", nproc="8"), _pod("b", nproc="auto")]) == 9


# ---- spec.trigger: Pending → Watching → Capturing ------------------------------------------

TRIGGERED = PerfDiagnosisSpec.model_validate(
    {
        "target": {"kind": "PyTorchJob", "name": "bert"},
        "capture": {"steps": 10, "timeoutSeconds": 300},
        "trigger": {"slowdown": {"percent": 10, "baselineSteps": 20}},
    }
)
WATCH_ID = f"d-{UID}-watch"


def _watch_step(
    status: PerfDiagnosisStatus, world: World, *, now: datetime, lead: float = 90.0
) -> Any:
    """One reconcile pass: the status goes to the API server and back between passes."""
    decision = decide(
        name="d", uid=UID, namespace="ns", generation=1, spec=TRIGGERED,
        status=PerfDiagnosisStatus.model_validate(status.to_wire()), world=world,
        storage_root=ROOT, target="PyTorchJob bert", now=now, lead_seconds=lead,
    )  # fmt: skip
    return decision


def _watchers(step: int, means: dict[int, float], at: datetime) -> dict[int, WorkerStatus]:
    """The watch plan's status.json of each rank: its mean over the last 20 steps (every step
    alike, so the longest equals the mean)."""
    t = at.timestamp()
    return {
        rank: WorkerStatus(
            rank=rank,
            plan_id=WATCH_ID,
            phase="dormant",
            step=step,
            last_step_unix=t,
            updated_unix=t,
            mean_step_ms=mean,
            max_step_ms=mean,
            mean_steps=20,
        )
        for rank, mean in means.items()
    }


def _watching_pods() -> list[dict[str, Any]]:
    plan = Plan(id=WATCH_ID, action="watch", steps=20, deadline=NOW + timedelta(days=30))
    notes = plan_annotations(plan, "d")["metadata"]["annotations"]
    return [_pod("bert-master-0", **notes), _pod("bert-worker-0", **notes)]


def _start_watching() -> PerfDiagnosisStatus:
    world = World(pods=[_pod("bert-master-0"), _pod("bert-worker-0")])
    decision = _watch_step(PerfDiagnosisStatus(), world, now=NOW)
    status: PerfDiagnosisStatus = decision.status
    return status


def test_a_trigger_sends_a_watch_plan_first() -> None:
    world = World(pods=[_pod("bert-master-0"), _pod("bert-worker-0")])
    decision = _watch_step(PerfDiagnosisStatus(), world, now=NOW)
    assert decision.actions == ["watch"]
    plan = decision.plan
    assert (plan.id, plan.action, plan.steps) == (WATCH_ID, "watch", 20)
    assert plan.deadline >= NOW + timedelta(days=7)  # as long as the training
    status = decision.status
    assert status.phase == "Watching"
    assert status.watch.plan_id == WATCH_ID
    assert status.window is None
    assert status.workers.expected == 4
    # The capture's prefix is known already; the watch's statuses go beside it.
    assert status.artifacts.prefix == f"{ROOT}/ns/d-{UID}"
    assert _cond(status, "Reconciling")[:2] == ("True", "Watching")
    assert [e.reason for e in decision.events] == ["WatchStarted"]
    assert "10% slowdown" in decision.events[0].message
    # Deterministic, and under the plan id's limit for the longest names.
    assert _watch_step(PerfDiagnosisStatus(), world, now=NOW).plan.id == WATCH_ID
    long_name = watch_plan_id(plan_id("x" * 253, UID))
    assert len(long_name) <= 128 and len(stacks_plan_id(plan_id("x" * 253, UID))) <= 128


def test_steady_step_times_do_not_fire() -> None:
    status = _start_watching()
    pods = _watching_pods()
    means = [50.0, 49.0, 50.5, 51.0, 49.5, 50.2, 52.0, 50.0]
    for index, mean in enumerate(means):
        at = NOW + timedelta(seconds=15 * (index + 1))
        workers = _watchers(100 + 40 * index, {0: mean, 1: mean, 2: mean - 1, 3: mean}, at)
        decision = _watch_step(status, World(pods=pods, workers=workers), now=at)
        assert decision.actions == [], decision.status.watch
        status = decision.status
        assert status.phase == "Watching"
    watch = status.watch
    # The job's step time is its slowest rank's; the baseline its shortest in 20 × 20 steps.
    assert watch.baseline_step_ms == 49.0 and watch.baseline_step == 140
    assert watch.step_ms == 50.0 and watch.step == 380 and watch.rank == 0
    assert watch.over == 0 and watch.slowdown is None
    assert watch.steps_per_second == pytest.approx(1000 / 49, abs=0.01)  # the fastest rank
    assert len(watch.candidates) <= 3
    message = _cond(status, "Reconciling")[2]
    assert "step time 50.0 ms on rank 0" in message and "baseline 49.0 ms" in message
    # Reports the rule does not judge (the hook's default mean before it took the plan) count
    # as reporting but set no baseline.
    fresh = _start_watching()
    other = _watchers(60, {0: 50.0}, NOW)
    other[0] = other[0].model_copy(update={"mean_steps": 50})
    first = _watch_step(fresh, World(pods=pods, workers=other), now=NOW).status
    assert first.watch.baseline_step_ms is None and first.watch.reporting == 1
    assert "the baseline needs 20 steps" in _cond(first, "Reconciling")[2]


def test_a_slowdown_fires_a_capture_ahead_of_the_ranks() -> None:
    status = _start_watching()
    pods = _watching_pods()
    timeline = [(100, 50.0), (200, 50.0), (300, 60.0), (400, 62.0)]
    decisions = []
    for index, (step, slow) in enumerate(timeline):
        at = NOW + timedelta(seconds=15 * (index + 1))
        workers = _watchers(step, {0: 50.0, 1: 50.0, 2: 50.0, 3: slow}, at)
        decision = _watch_step(status, World(pods=pods, workers=workers), now=at)
        decisions.append(decision)
        status = decision.status
    assert [d.actions for d in decisions[:3]] == [[], [], []]
    assert decisions[2].status.watch.over == 1  # once over: not yet
    fired = decisions[3]
    assert fired.actions == ["record_trigger", "arm"]
    assert fired.status.phase == "Capturing"
    slowdown = fired.status.watch.slowdown
    assert (slowdown.rank, slowdown.step, slowdown.mean_step_ms) == (3, 400, 62.0)
    assert (slowdown.baseline_step_ms, slowdown.baseline_step, slowdown.steps) == (50.0, 100, 20)
    assert slowdown.threshold_percent == 10.0
    # The capture plan: the same id as a one-shot capture, beginning 90 s ahead at the job's
    # rate (20 steps/s: the fastest rank's mean of 50 ms), the lead on top of the timeout.
    plan = fired.plan
    assert (plan.id, plan.action, plan.steps) == (f"d-{UID}", "capture", 10)
    assert plan.start_step == 400 + 20 * 90 + 1
    at = NOW + timedelta(seconds=60)
    assert plan.deadline == at + timedelta(seconds=300 + 90)
    window = fired.status.window
    assert (window.plan_id, window.start_step, window.steps) == (f"d-{UID}", plan.start_step, 10)
    assert fired.status.artifacts.prefix == f"{ROOT}/ns/d-{UID}"
    assert [(e.type, e.reason) for e in fired.events] == [("Warning", "SlowdownDetected")]
    assert "rank 3" in fired.events[0].message and f"from step {plan.start_step}" in (
        fired.events[0].message
    )
    # The status keeps the slowdown in camelCase (the verdict's trigger.json is the model's).
    wire = fired.status.to_wire()["watch"]["slowdown"]
    assert wire["meanStepMs"] == 62.0 and wire["thresholdPercent"] == 10.0
    # A shorter lead (the operator's setting) plans the window nearer.
    replay = _watch_step(
        decisions[2].status,
        World(pods=pods, workers=_watchers(400, {0: 50.0, 3: 62.0}, at)),
        now=at,
        lead=5.0,
    )
    assert replay.plan.start_step == 400 + 20 * 5 + 1


def test_watching_resends_the_plan_to_a_new_pod_and_fails_when_the_pods_are_gone() -> None:
    status = _start_watching()
    pods = [*_watching_pods()[:1], _pod("bert-worker-0")]  # recreated without the plan
    decision = _watch_step(status, World(pods=pods), now=NOW + timedelta(seconds=15))
    assert decision.actions == ["watch"]
    assert decision.plan.id == WATCH_ID and decision.plan.action == "watch"
    assert decision.status.phase == "Watching"

    gone = _watch_step(status, World(pods=[]), now=NOW + timedelta(seconds=30))
    assert gone.status.phase == "Failed"
    assert gone.actions == ["disarm"]
    assert _cond(gone.status, "Stalled")[:2] == ("True", "TargetGone")
    assert "before a 10% slowdown" in gone.events[0].message


# ---- one-shot: Pending → Watching (measuring the step rate) → Capturing ----------------------


def _one_shot(status: PerfDiagnosisStatus, world: World, *, now: datetime) -> Any:
    """One reconcile pass of a diagnosis without a trigger (status through the wire)."""
    return _decide(PerfDiagnosisStatus.model_validate(status.to_wire()), world, now=now)


def _measuring_pods() -> list[dict[str, Any]]:
    plan = Plan(id=WATCH_ID, action="watch", steps=RATE_STEPS, deadline=NOW + timedelta(days=30))
    notes = plan_annotations(plan, "d")["metadata"]["annotations"]
    return [_pod("bert-master-0", **notes), _pod("bert-worker-0", **notes)]


def test_a_one_shot_capture_measures_the_step_rate_then_plans_ahead() -> None:
    world = World(pods=[_pod("bert-master-0"), _pod("bert-worker-0")])
    first = _one_shot(PerfDiagnosisStatus(), world, now=NOW)
    assert first.actions == ["watch"]
    assert (first.plan.id, first.plan.action, first.plan.steps) == (WATCH_ID, "watch", RATE_STEPS)
    status = first.status
    assert status.phase == "Watching"
    assert status.watch.plan_id == WATCH_ID and status.window is None
    assert status.artifacts.prefix == f"{ROOT}/ns/d-{UID}"
    assert _cond(status, "Reconciling")[:2] == ("True", "MeasuringStepRate")
    assert [e.reason for e in first.events] == ["MeasuringStepRate"]
    assert "measuring the step rate of 4 rank(s)" in first.events[0].message

    # No rank heard from yet: keep measuring.
    pods = _measuring_pods()
    waiting = _one_shot(status, World(pods=pods), now=NOW + timedelta(seconds=15))
    assert waiting.actions == [] and waiting.status.phase == "Watching"
    message = _cond(waiting.status, "Reconciling")[2]
    assert "0/4 rank(s) reporting" in message and "105 s left" in message

    # One rank's mean step (50 ms: 20 steps/s) is enough: the window begins the lead ahead
    # (the default: every pod's agent follows its plan in storage).
    at = NOW + timedelta(seconds=30)
    lead = DEFAULT_CAPTURE_LEAD_SECONDS
    workers = _watchers(300, {0: 50.0, 1: 52.0}, at)
    armed = _one_shot(waiting.status, World(pods=pods, workers=workers), now=at)
    assert armed.actions == ["arm"]
    plan = armed.plan
    assert (plan.id, plan.action, plan.steps) == (f"d-{UID}", "capture", 10)
    assert plan.start_step == 300 + 20 * lead + 1
    assert plan.deadline == at + timedelta(seconds=SPEC.capture.timeout_seconds + lead)
    new = armed.status
    assert new.phase == "Capturing"
    assert (new.window.plan_id, new.window.start_step, new.window.steps) == (
        f"d-{UID}", plan.start_step, 10
    )  # fmt: skip
    assert new.watch.steps_per_second == 20.0 and new.watch.step == 300
    assert new.workers.expected == 4
    reason, message = _cond(new, "Reconciling")[1:]
    assert reason == "Capturing"
    assert f"from step {plan.start_step}" in message and "20 steps/s at step 300" in message
    assert [(e.type, e.reason) for e in armed.events] == [("Normal", "PlanSent")]


def test_a_capture_plan_already_sent_is_sent_again_unchanged() -> None:
    """A pass that armed but lost its status write (a conflict, a restart) left the plan in the
    capture's prefix: the next pass, later, with another rate, keeps that plan, start step and
    deadline, and sends it only where it is missing."""
    status = _one_shot(PerfDiagnosisStatus(), World(pods=[_pod("a")]), now=NOW).status
    pods = _measuring_pods()
    at = NOW + timedelta(seconds=30)
    armed = _one_shot(status, World(pods=pods, workers=_watchers(300, {0: 50.0}, at)), now=at)
    later = at + timedelta(seconds=20)
    faster = World(pods=pods, workers=_watchers(900, {0: 25.0}, later), sent=armed.plan)
    again = _one_shot(status, faster, now=later)
    assert again.actions == ["arm"]
    assert again.plan == armed.plan
    window = again.status.window
    assert (window.plan_id, window.start_step) == (armed.plan.id, armed.plan.start_step)
    assert again.status.phase == "Capturing"
    assert f"from step {armed.plan.start_step}" in _cond(again.status, "Reconciling")[2]
    # Another diagnosis' plan in that place (never written by this one) is not taken.
    other = armed.plan.model_copy(update={"id": "other"})
    fresh = _one_shot(status, World(pods=pods, workers=faster.workers, sent=other), now=later)
    assert fresh.plan.start_step != armed.plan.start_step


def test_a_triggered_capture_already_sent_is_sent_again_unchanged() -> None:
    status = _watch_step(PerfDiagnosisStatus(), World(pods=[_pod("a")]), now=NOW).status
    sent = Plan(id=f"d-{UID}", steps=10, start_step=1234, deadline=NOW + timedelta(hours=1))
    again = _watch_step(status, World(pods=[_pod("a")], sent=sent), now=NOW)
    assert (again.actions, again.plan) == (["arm"], sent)
    assert again.status.window.start_step == 1234


def test_a_one_shot_capture_measures_the_rate_from_progress() -> None:
    """Ranks that report steps but no mean step time yet: the rate from two passes."""
    status = _one_shot(PerfDiagnosisStatus(), World(pods=[_pod("a")]), now=NOW).status
    pods = _measuring_pods()

    def bare(step: int, at: datetime) -> dict[int, WorkerStatus]:
        t = at.timestamp()
        return {0: WorkerStatus(rank=0, plan_id=WATCH_ID, step=step, last_step_unix=t,
                                updated_unix=t)}  # fmt: skip

    at = NOW + timedelta(seconds=10)
    once = _one_shot(status, World(pods=pods, workers=bare(100, at)), now=at)
    assert once.actions == [] and once.status.watch.rate_step == 100
    later = at + timedelta(seconds=20)
    twice = _one_shot(once.status, World(pods=pods, workers=bare(180, later)), now=later)
    assert twice.actions == ["arm"]
    assert twice.plan.start_step == 180 + 4 * DEFAULT_CAPTURE_LEAD_SECONDS + 1  # 80 in 20 s


def test_a_one_shot_capture_without_a_rate_falls_back_to_no_start_step() -> None:
    status = _one_shot(PerfDiagnosisStatus(), World(pods=[_pod("a")]), now=NOW).status
    pods = _measuring_pods()
    before = NOW + timedelta(seconds=RATE_WAIT_S - 1)
    assert _one_shot(status, World(pods=pods), now=before).actions == []
    at = NOW + timedelta(seconds=RATE_WAIT_S)
    fallback = _one_shot(status, World(pods=pods), now=at)
    assert fallback.actions == ["arm"]
    assert fallback.plan.start_step is None
    assert fallback.plan.deadline == at + timedelta(seconds=SPEC.capture.timeout_seconds)
    assert fallback.status.phase == "Capturing" and fallback.status.window.start_step is None
    message = _cond(fallback.status, "Reconciling")[2]
    assert f"could not be measured within {RATE_WAIT_S:g} s (no rank reported)" in message
    assert "without a start step" in message
    assert [(e.type, e.reason) for e in fallback.events] == [("Warning", "PlanSent")]
    # A rank that reports its step but never advances gives no rate either.
    t = at.timestamp()
    still = {0: WorkerStatus(rank=0, plan_id=WATCH_ID, step=7, updated_unix=t)}
    quiet = _one_shot(status, World(pods=pods, workers=still), now=at)
    assert quiet.plan.start_step is None
    assert "1 rank(s) reported, at step 7, without a step time" in quiet.events[0].message


def test_a_one_shot_capture_resends_the_watch_plan_and_fails_when_the_pods_are_gone() -> None:
    status = _one_shot(PerfDiagnosisStatus(), World(pods=[_pod("a")]), now=NOW).status
    pods = [*_measuring_pods()[:1], _pod("bert-worker-0")]  # recreated without the plan
    again = _one_shot(status, World(pods=pods), now=NOW + timedelta(seconds=15))
    assert again.actions == ["watch"] and again.plan.id == WATCH_ID
    assert again.plan.steps == RATE_STEPS
    gone = _one_shot(status, World(pods=[]), now=NOW + timedelta(seconds=30))
    assert gone.status.phase == "Failed" and gone.actions == ["disarm"]
    assert _cond(gone.status, "Stalled")[:2] == ("True", "TargetGone")
    assert "gone before the capture began" in gone.events[0].message


def _capturing_ahead(start_step: int | None, watch_step: int | None) -> PerfDiagnosisStatus:
    wire = _capturing().to_wire()
    if start_step is not None:
        wire["window"]["startStep"] = start_step
    if watch_step is not None:
        wire["watch"] = {"planId": WATCH_ID, "step": watch_step}
    return PerfDiagnosisStatus.model_validate(wire)


def test_a_job_that_ends_before_its_window_says_so_with_the_step_reached() -> None:
    armed = {r: _worker(r, "armed").model_copy(update={"step": 200 + r * 4}) for r in range(4)}
    ended = _decide(_capturing_ahead(260, 190), World(pods=[], workers=armed))
    assert ended.actions == ["disarm"]
    status = ended.status
    assert status.phase == "Failed" and status.completion_time == NOW
    stalled, reason, message = _cond(status, "Stalled")
    assert (stalled, reason) == ("True", "EndedBeforeWindow")
    assert "PyTorchJob bert ended at step 212 before the window (steps 260–269) began" in message
    assert _cond(status, "Ready")[:2] == ("False", "EndedBeforeWindow")
    assert [(e.type, e.reason) for e in ended.events] == [("Warning", "EndedBeforeWindow")]
    assert status.workers.missing == 4 and status.workers.reporting == 4

    # No capture status: the step last seen while measuring.
    unseen = _decide(_capturing_ahead(260, 190), World(pods=[]))
    assert "ended at step 190 before the window (steps 260–269)" in unseen.events[0].message
    # Without a start step and nothing heard: before any rank began.
    blind = _decide(_capturing_ahead(None, None), World(pods=[]))
    assert blind.status.phase == "Failed"
    assert "ended before any rank began its window (no rank reported its step)" in (
        blind.events[0].message
    )
    # A rank that captured, or one past the start step: the capture is analyzed as before.
    some = {**armed, 1: _worker(1, "done")}
    assert _decide(_capturing_ahead(260, 190), World(pods=[], workers=some)).actions == [
        "disarm", "launch_job"
    ]  # fmt: skip
    past = {0: _worker(0, "armed").model_copy(update={"step": 265})}
    assert _decide(_capturing_ahead(260, 190), World(pods=[], workers=past)).status.phase == (
        "Analyzing"
    )


# ---- every ending takes the diagnosis' plans off the pods -------------------------------------


def test_every_ending_disarms() -> None:
    """Whatever way a diagnosis ends (a verdict, or failed for any reason), its decision takes
    its plans off the pods: the reconciler then removes them from every target pod, finished
    ones included."""
    from perfdiag.operator.analyzer_job import JobState

    no_prefix = _analyzing().model_copy(update={"artifacts": None})
    lost_watch = PerfDiagnosisStatus(phase="Watching")
    endings = {
        "Succeeded": _decide(_analyzing(), World(job=JobState("succeeded"), verdict=_verdict())),
        "AnalyzerFailed": _decide(_analyzing(), World(job=JobState("failed", "DeadlineExceeded"))),
        "VerdictUnreadable": _decide(
            _analyzing(), World(job=JobState("succeeded"), verdict_error="not JSON")
        ),
        "NoCapture": _decide(no_prefix, World(job=JobState("running"))),
        "EndedBeforeWindow": _decide(_capturing_ahead(260, 190), World(pods=[])),
        "TargetGone": _decide(
            PerfDiagnosisStatus(phase="Watching", watch={"planId": WATCH_ID}), World(pods=[])
        ),
        "NoWatch": _decide(lost_watch, World(pods=[_pod("a")])),
    }
    for reason, decision in endings.items():
        assert decision.status.phase in ("Succeeded", "Failed"), reason
        assert decision.actions == ["disarm"], (reason, decision.actions)
        if reason != "Succeeded":
            assert _cond(decision.status, "Stalled")[:2] == ("True", reason)
    # The capture over (every rank reported, the deadline passed, the pods gone): the plan goes
    # before the analysis.
    timed_out = _decide(_capturing(deadline=NOW - timedelta(seconds=1)), World(pods=[_pod("a")]))
    assert timed_out.status.phase == "Analyzing" and timed_out.actions[0] == "disarm"


def test_pods_to_disarm_are_those_carrying_this_diagnosis_plans() -> None:
    capture = plan_id("d", UID)
    ours = our_plan_ids("d", UID, None)  # no status needed: name and uid make the ids
    assert ours == {capture, watch_plan_id(capture), stacks_plan_id(capture)}
    # A status written by another version or by hand names its own plans; they count too.
    handwritten = PerfDiagnosisStatus.model_validate({"window": {"planId": "plan-1"}})
    assert {"plan-1", "plan-1-watch", "plan-1-stacks"} <= our_plan_ids("d", UID, handwritten)

    def plan(id_: str, diagnosis: str = "d") -> dict[str, str]:
        note = json.dumps({"id": id_, "action": "capture", "steps": 10, "future": True})
        return {"perfdiag.io/plan": note, "perfdiag.io/diagnosis": diagnosis}

    finished = _pod("finished", **plan(capture))
    finished["status"] = {"phase": "Succeeded"}
    pods = [
        _pod("watching", **plan(watch_plan_id(capture))),
        _pod("stacks", **plan(stacks_plan_id(capture))),
        finished,
        _pod("other", **plan("other-plan", "other")),
        _pod("same-name-new-object", **plan("d-another-uid")),  # d re-created: not ours
        _pod("name-only", **{"perfdiag.io/diagnosis": "d"}),  # the plan removed by hand
        _pod("unreadable", **{"perfdiag.io/plan": "{not json", "perfdiag.io/diagnosis": "d"}),
        _pod("bare"),
    ]
    assert pods_to_disarm(pods, "d", ours) == ["finished", "name-only", "stacks", "watching"]


# ---- observations and the short culprit list ---------------------------------------------------


def test_observations_are_neither_culprits_nor_top_findings() -> None:
    verdict = _verdict()
    slow, job_wide = verdict.findings[1], verdict.findings[0]
    later = verdict.model_copy(
        update={
            "findings": [slow],
            "observations": [
                job_wide,
                job_wide.model_copy(update={"category": "communication", "severity": 0.3}),
            ],
        }
    )
    summary = verdict_summary(later)
    assert summary.culprit_ranks == [3] and summary.culprits == "3"
    assert [f.kind for f in summary.top_findings] == ["slow_worker"]
    assert [(f.kind, f.category) for f in summary.observations] == [
        ("expected_range", "communication"),
        ("expected_range", "python"),
    ]  # most severe first
    # Bounded, like the top findings.
    many = later.model_copy(update={"observations": [job_wide] * 40})
    assert len(verdict_summary(many).observations) == 5
    # Without observations (a verdict of an earlier v1), the status has none.
    assert verdict_summary(verdict).observations == []


def test_culprits_text_is_short_for_any_number_of_ranks() -> None:
    verdict = _verdict()
    missing = [RankRange(first=4, last=99_999, reason="no file")]
    many = verdict_summary(verdict.model_copy(update={"missing": missing}))
    assert many.culprits == "3-99999"
    scattered = [
        Finding(kind="slow_worker", category="cpu_op", ranks=list(range(0, 4000, 2)),
                severity=0.5, message="m")
    ]  # fmt: skip
    text = verdict_summary(verdict.model_copy(update={"findings": scattered})).culprits
    assert text is not None and text.endswith("… (2000 ranks)") and len(text) < 80
    healthy = verdict.model_copy(update={"status": "healthy", "findings": []})
    assert verdict_summary(healthy).culprits is None


# ---- the thresholds the analyzer Job was given ----------------------------------------------


def test_the_analyzer_job_records_the_thresholds_it_was_given() -> None:
    strict = SPEC.model_copy(
        update={"analysis": SPEC.analysis.model_copy(update={"report_severity": 0.2})}
    )
    workers = {r: _worker(r) for r in range(4)}
    done = decide(
        name="d", uid=UID, namespace="ns", generation=3, spec=strict, status=_capturing(),
        world=World(pods=[_pod("a")], workers=workers), storage_root=ROOT,
        target="PyTorchJob bert", now=NOW,
    )  # fmt: skip
    assert done.actions == ["disarm", "launch_job"]
    assert done.status.analysis is not None
    assert done.status.analysis.to_wire() == {
        "generation": 3,
        "thresholds": {"reportSeverity": 0.2},
    }
    # A Job lost while analyzing is created again with the thresholds of that pass.
    relaunched = _decide(done.status, World())
    assert relaunched.actions == ["launch_job"]
    assert relaunched.status.analysis.to_wire() == {"generation": 1, "thresholds": {}}


def test_the_lead_covers_the_slowest_way_the_plan_reaches_a_pod() -> None:
    """Every pod's agent follows its plan in storage: the configured lead. One pod injected by
    an earlier perfdiag (its agent has no POD_UID): the plan reaches it only at the kubelet's
    refresh of its downward-API file, and the lead covers the kubelet's periodic resync."""
    new, old = _pod("bert-master-0"), _pod("bert-worker-0", follows=False)
    assert capture_lead([new, new], 10.0) == 10.0
    assert capture_lead([new, old], 10.0) == KUBELET_CAPTURE_LEAD_SECONDS == 90.0
    assert capture_lead([new, old], 120.0) == 120.0  # a longer setting stays
    # Through decide: the same one-shot capture on such a job plans its window 90 s ahead.
    status = _one_shot(PerfDiagnosisStatus(), World(pods=[_pod("a")]), now=NOW).status
    notes = _measuring_pods()[0]["metadata"]["annotations"]
    pods = [_pod("bert-master-0", **notes), _pod("bert-worker-0", follows=False, **notes)]
    at = NOW + timedelta(seconds=30)
    armed = _one_shot(status, World(pods=pods, workers=_watchers(300, {0: 50.0}, at)), now=at)
    assert armed.plan.start_step == 300 + 20 * 90 + 1
    assert "(90 s ahead)" in armed.events[0].message


def test_the_window_is_planned_from_the_step_the_ranks_reached_by_now() -> None:
    """The statuses are seconds old when the operator reads them: the furthest step is carried
    forward at the job's rate from when it ended, so the lead need not cover their age; never
    backwards (a clock behind), never more than MAX_EXTRAPOLATION_S (a job that stalled)."""
    ended = NOW.timestamp()
    assert step_now(300, ended, 20.0, NOW + timedelta(seconds=4)) == 380
    assert step_now(300, ended, 20.0, NOW - timedelta(seconds=4)) == 300
    assert step_now(300, ended, 20.0, NOW + timedelta(hours=1)) == 300 + 20 * 30
    assert MAX_EXTRAPOLATION_S == 30.0
    assert step_now(300, None, 20.0, NOW) == step_now(300, ended, None, NOW) == 300
    # In a pass: statuses 4 s old at 20 steps/s begin the window 80 steps further.
    status = _one_shot(PerfDiagnosisStatus(), World(pods=[_pod("a")]), now=NOW).status
    pods = _measuring_pods()
    reported = NOW + timedelta(seconds=30)
    read = reported + timedelta(seconds=4)
    workers = _watchers(300, {0: 50.0}, reported)
    armed = _one_shot(status, World(pods=pods, workers=workers), now=read)
    assert armed.plan.start_step == 300 + 80 + 20 * DEFAULT_CAPTURE_LEAD_SECONDS + 1
