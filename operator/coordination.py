"""Capture coordination: decisions from Pending (target found) to a verdict (pure).

  Pending ──arm──▶ Capturing ──all workers reported, deadline, or stuck workers' stacks in──▶
  Analyzing ──Job done──▶ Succeeded (Ready=True, status.verdict) | Failed (Stalled=True)

While capturing, workers whose step stops advancing (perfdiag.stall) get a `stacks` plan; their
dumps are copied into the capture before the analyzer runs (a hang verdict).

The reconciler reads the world (pods, worker status.json files, the analyzer Job,
verdict.json), calls `decide`, carries out its actions (write the plan on the pods, create
the Job, remove the plan), then writes the status. Every action is idempotent (the plan id is
derived from the object's uid; the Job name too), so an operator killed between an action and
the status write repeats the action harmlessly after a restart and nothing runs twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from perfdiag.api.diagnosis import (
    Artifacts,
    FindingSummary,
    PerfDiagnosisSpec,
    PerfDiagnosisStatus,
    VerdictStatusSummary,
    WindowStatus,
    WorkersStatus,
)
from perfdiag.api.plan import Plan
from perfdiag.api.verdict import Verdict
from perfdiag.api.worker import WorkerStatus
from perfdiag.operator.analyzer_job import JobState
from perfdiag.operator.injection import injected, training_container_index
from perfdiag.operator.settings import INJECT_LABEL, PLAN_ANNOTATION, PREFIX
from perfdiag.operator.status import READY, RECONCILING, STALLED, Desired, Event, merge_conditions
from perfdiag.stall import (
    DEFAULT_MIN_S,
    DEFAULT_STEP_FACTOR,
    StallPolicy,
    progress_from_mapping,
    stuck_ranks,
)
from perfdiag.storage import layout

DIAGNOSIS_ANNOTATION = f"{PREFIX}/diagnosis"  # beside the plan: which PerfDiagnosis wrote it
MAX_PLAN_ID = 128
TOP_FINDINGS = 5
STACKS_SUFFIX = "-stacks"
STACKS_WAIT_S = 30.0
"""How long the ranks have to answer a `stacks` plan (its deadline); the hooks answer within a
second or two, from their own thread, even while training is blocked."""


def plan_id(name: str, uid: str) -> str:
    """Deterministic per PerfDiagnosis object: re-arming after a restart sends the same id, which
    hooks that already took it ignore."""
    return f"{name[: MAX_PLAN_ID - len(uid) - 1 - len(STACKS_SUFFIX)]}-{uid}"


def stacks_plan_id(capture_plan: str) -> str:
    """The `stacks` plan sent when workers are stuck; the agents write its dumps under
    <storage>/<namespace>/<this id>/, the operator copies them into the capture's prefix."""
    return f"{capture_plan}{STACKS_SUFFIX}"


def capture_prefix(storage_root: str, namespace: str, plan: str) -> str:
    """<storage>/<namespace>/<plan id>: where the agents of the namespace's pods write (they
    get <storage>/<namespace> from the webhook and add the plan id)."""
    return f"{storage_root.rstrip('/')}/{namespace}/{plan}"


def plan_of(pod: Mapping[str, Any]) -> tuple[str | None, str | None, datetime | None]:
    """(plan id, diagnosis name, deadline) of the plan annotation on a pod."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(PLAN_ANNOTATION)
    if not raw:
        return None, None, None
    try:
        plan = Plan.model_validate_json(raw)
    except ValueError:
        return None, annotations.get(DIAGNOSIS_ANNOTATION), None
    return plan.id, annotations.get(DIAGNOSIS_ANNOTATION), plan.deadline


def expected_ranks(pods: Sequence[Mapping[str, Any]]) -> int:
    """Ranks the target runs: per pod, the training container's PET_NPROC_PER_NODE (what the
    training operator sets from nprocPerNode) when it is a number, else 1."""
    total = 0
    for pod in pods:
        containers = list((pod.get("spec") or {}).get("containers") or [])
        if not containers:
            continue
        env = containers[training_container_index(containers)].get("env") or []
        value = next((v.get("value") for v in env if v.get("name") == "PET_NPROC_PER_NODE"), None)
        total += int(value) if isinstance(value, str) and value.isdigit() else 1
    return total


def pod_names(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted(str(p["metadata"]["name"]) for p in pods)


@dataclass(frozen=True)
class World:
    """What the reconciler read for one pass."""

    pods: list[dict[str, Any]] = field(default_factory=list)  # live target pods
    workers: dict[int, WorkerStatus] = field(default_factory=dict)  # this plan's status.json
    storage_error: str | None = None  # reading storage failed (kept trying)
    job: JobState | None = None  # the analyzer Job, when it exists
    verdict: Verdict | None = None  # verdict.json, once the Job succeeded
    verdict_error: str | None = None
    stacks: frozenset[int] = frozenset()  # ranks whose stack dump (stacks plan) is in storage


Action = Literal["arm", "stacks", "launch_job", "disarm", "collect_stacks"]


@dataclass
class Decision:
    status: PerfDiagnosisStatus
    actions: list[Action] = field(default_factory=list)
    plan: Plan | None = None
    events: list[Event] = field(default_factory=list)


def _conds(
    status: PerfDiagnosisStatus, desired: list[Desired], generation: int, now: datetime
) -> list[Any]:
    return merge_conditions(status.conditions, desired, generation, now)


def _running(reason: str, message: str) -> list[Desired]:
    return [
        Desired(READY, "False", reason, message),
        Desired(RECONCILING, "True", reason, message),
        Desired(STALLED, "False", reason),
    ]


def _stalled(reason: str, message: str) -> list[Desired]:
    return [
        Desired(READY, "False", reason, message),
        Desired(RECONCILING, "False", reason),
        Desired(STALLED, "True", reason, message),
    ]


def not_injected_message(pods: Sequence[str], target: str) -> str:
    shown = ", ".join(pods[:5]) + (f" and {len(pods) - 5} more" if len(pods) > 5 else "")
    return (
        f"{len(pods)} pod(s) of {target} run without perfdiag ({shown}): perfdiag is injected "
        f'when a pod is created. Opt in by labelling the pod template {INJECT_LABEL}: "true" '
        "(for a PyTorchJob: spec.pytorchReplicaSpecs.<Master|Worker>.template.metadata.labels), "
        "check that the perfdiag operator's webhook is running, and restart the job; this "
        "diagnosis starts by itself once every target pod is injected"
    )


def decide(
    *,
    name: str,
    uid: str,
    namespace: str,
    generation: int,
    spec: PerfDiagnosisSpec,
    status: PerfDiagnosisStatus,
    world: World,
    storage_root: str | None,
    target: str,
    now: datetime,
) -> Decision:
    """The next status and the actions that lead there, for a diagnosis whose target was found
    (phase Pending) or whose capture is under way (Capturing, Analyzing)."""
    if status.phase == "Pending":
        return _pending(
            name, uid, namespace, generation, spec, status, world, storage_root, target, now
        )
    if status.phase == "Capturing":
        return _capturing(generation, spec, status, world, now)
    if status.phase == "Analyzing":
        return _analyzing(generation, status, world, now)
    return Decision(status)


def _pending(
    name: str,
    uid: str,
    namespace: str,
    generation: int,
    spec: PerfDiagnosisSpec,
    status: PerfDiagnosisStatus,
    world: World,
    storage_root: str | None,
    target: str,
    now: datetime,
) -> Decision:
    def hold(desired: list[Desired]) -> Decision:
        return Decision(
            status.model_copy(update={"conditions": _conds(status, desired, generation, now)})
        )

    if spec.storage is not None:
        return hold(
            _stalled(
                "StorageOverrideUnsupported",
                "spec.storage is not supported for Kubernetes captures yet: the agents write "
                "to the operator's storage (set when the pods were injected); remove "
                "spec.storage (create a new PerfDiagnosis)",
            )
        )
    if storage_root is None:
        return hold(
            _stalled(
                "NoStorage",
                "the operator has no storage configured (PERFDIAG_STORAGE=s3://bucket/prefix)",
            )
        )
    bare = [str(p["metadata"]["name"]) for p in world.pods if not injected(p)]
    if bare:
        return hold(_stalled("NotInjected", not_injected_message(sorted(bare), target)))
    mine = plan_id(name, uid)
    for pod in world.pods:
        other, owner, deadline = plan_of(pod)
        if other is not None and other != mine and (deadline is None or deadline > now):
            who = f"PerfDiagnosis {owner}" if owner else f"plan {other}"
            message = (
                f"{target} is being diagnosed by {who} (pod {pod['metadata']['name']}); "
                "one diagnosis runs at a time per job: this one starts when that one's capture "
                f"ends (at the latest {deadline:%Y-%m-%dT%H:%M:%SZ})"
                if deadline
                else f"{target} is being diagnosed by {who}; this one waits for it"
            )
            return hold(_running("WaitingForOtherDiagnosis", message))

    plan = Plan(
        id=mine,
        action="capture",
        steps=spec.capture.steps,
        activities=list(spec.capture.activities),
        python_stacks=spec.capture.python_stacks,
        deadline=now + timedelta(seconds=spec.capture.timeout_seconds),
    )
    expected = expected_ranks(world.pods)
    message = (
        f"plan {mine} sent to {len(world.pods)} pod(s): capturing {spec.capture.steps} steps on "
        f"{expected} rank(s), deadline {plan.deadline:%H:%M:%SZ}"
    )
    new = status.model_copy(
        update={
            "phase": "Capturing",
            "window": WindowStatus(
                plan_id=mine,
                steps=spec.capture.steps,
                deadline=plan.deadline.replace(microsecond=0),
                start_time=now,
            ),
            "workers": WorkersStatus(expected=expected),
            "artifacts": Artifacts(prefix=capture_prefix(storage_root, namespace, mine)),
            "conditions": _conds(status, _running("Capturing", message), generation, now),
        }
    )
    return Decision(new, ["arm"], plan, [Event("Normal", "PlanSent", message)])


def stall_policy(spec: PerfDiagnosisSpec) -> StallPolicy:
    """The analyzer's stuck rule (perfdiag.stall) with the diagnosis' thresholds; the analyzer
    Job gets the same thresholds, so both call the same ranks stuck."""
    analysis = spec.analysis
    return StallPolicy(
        min_s=analysis.stuck_after_seconds or DEFAULT_MIN_S,
        step_factor=analysis.stuck_after_steps or DEFAULT_STEP_FACTOR,
    )


def stuck_workers(
    workers: Mapping[int, WorkerStatus], policy: StallPolicy, now: datetime
) -> list[int]:
    """Ranks whose step has not advanced for the stall limit (and whose window is not over)."""
    progress = [
        progress_from_mapping(rank, w.model_dump())
        for rank, w in workers.items()
        if w.phase not in ("done", "failed")
    ]
    return sorted(stuck_ranks(progress, policy.limit_s(None), now.timestamp()))


def _stacks_requested(world: World, capture_plan: str | None) -> datetime | None:
    """The deadline of our stacks plan when it sits on the pods (it was sent), else None."""
    if capture_plan is None:
        return None
    wanted = stacks_plan_id(capture_plan)
    for pod in world.pods:
        found, _, deadline = plan_of(pod)
        if found == wanted and deadline is not None:
            return deadline
    return None


def _capturing(
    generation: int,
    spec: PerfDiagnosisSpec,
    status: PerfDiagnosisStatus,
    world: World,
    now: datetime,
) -> Decision:
    window = status.window or WindowStatus()
    workers = status.workers or WorkersStatus()
    expected = workers.expected or 0
    done = sorted(r for r, w in world.workers.items() if w.phase == "done")
    failed = sorted(r for r, w in world.workers.items() if w.phase == "failed")
    stuck = stuck_workers(world.workers, stall_policy(spec), now)
    stacks_deadline = _stacks_requested(world, window.plan_id)
    finished = len(done) + len(failed)
    deadline_passed = window.deadline is not None and now >= window.deadline
    gone = not world.pods

    def counts(missing: int) -> WorkersStatus:
        return WorkersStatus(
            expected=expected,
            captured=len(done),
            missing=missing,
            reporting=len(world.workers),
            failed=failed,
            stuck=stuck,
        )

    progress = f"{len(done)}/{expected} worker(s) captured"
    if failed:
        progress += f", rank(s) {', '.join(map(str, failed))} failed"
    if stuck:
        progress += f", rank(s) {', '.join(map(str, stuck))} not advancing"
    if stacks_deadline is not None:
        progress += f", {len(world.stacks)} stack dump(s) in"
    if world.storage_error:
        progress += f"; storage unavailable, retrying: {world.storage_error}"
    reporting = set(world.workers) - set(done) - set(failed)
    stacks_in = stacks_deadline is not None and (
        (reporting and reporting <= world.stacks) or now >= stacks_deadline
    )

    if (expected and finished >= expected) or deadline_passed or gone or stacks_in:
        missing = max(expected - len(done), 0)
        why = (
            "every worker reported"
            if expected and finished >= expected
            else "the target's pods are gone"
            if gone
            else f"rank(s) {', '.join(map(str, stuck))} stuck; stack dumps collected"
            if stacks_in
            else "the capture deadline passed"
        )
        message = f"{why} ({progress}); analyzing"
        new = status.model_copy(
            update={
                "phase": "Analyzing",
                "workers": counts(missing),
                "window": window.model_copy(update={"completion_time": now}),
                "conditions": _conds(status, _running("Analyzing", message), generation, now),
            }
        )
        events = [Event("Normal" if not missing else "Warning", "CaptureEnded", message)]
        actions: list[Action] = ["disarm", "launch_job"]
        if stacks_deadline is not None:
            actions.insert(1, "collect_stacks")
        return Decision(new, actions, events=events)

    if stuck and stacks_deadline is None and window.plan_id is not None:
        plan = Plan(
            id=stacks_plan_id(window.plan_id),
            action="stacks",
            deadline=now + timedelta(seconds=STACKS_WAIT_S),
        )
        message = (
            f"rank(s) {', '.join(map(str, stuck))} stopped advancing; asking every rank for its "
            "Python stacks"
        )
        new = status.model_copy(
            update={
                "workers": counts(0),
                "conditions": _conds(
                    status, _running("CollectingStacks", message), generation, now
                ),
            }
        )
        return Decision(new, ["stacks"], plan, [Event("Warning", "WorkersStuck", message)])

    reason = "StorageUnavailable" if world.storage_error else "Capturing"
    new = status.model_copy(
        update={
            "workers": counts(0),
            "conditions": _conds(
                status, _running(reason, f"capturing: {progress}"), generation, now
            ),
        }
    )
    return Decision(new)


def verdict_summary(verdict: Verdict) -> VerdictStatusSummary:
    findings = verdict.sorted().findings
    top = [
        FindingSummary(
            kind=f.kind,
            category=f.category,
            function=f.function,
            ranks=list(f.ranks),
            severity=f.severity,
            message=f.message,
        )
        for f in findings[:TOP_FINDINGS]
    ]
    # The ranks findings name (not job-wide expected ranges), the workers that are missing, and
    # stuck workers only when no finding singles out the ranks holding the others up (in a hang
    # every rank is stuck; the hang finding names the culprits).
    culprits = {r for f in findings if f.kind != "expected_range" for r in f.ranks}
    culprits |= {w.rank for w in verdict.workers if w.state == "missing"}
    if not culprits:
        culprits = {w.rank for w in verdict.workers if w.state == "stuck"}
    pods = {w.rank: w.pod for w in verdict.workers if w.pod}
    return VerdictStatusSummary(
        status=verdict.status,
        summary=verdict.summary,
        top_findings=top,
        culprit_ranks=sorted(culprits),
        culprit_pods=sorted({pods[r] for r in culprits if r in pods}),
    )


def _analyzing(
    generation: int, status: PerfDiagnosisStatus, world: World, now: datetime
) -> Decision:
    job = world.job
    if not (status.artifacts and status.artifacts.prefix):
        # Only a status written by hand gets here: there is no capture to analyze.
        message = "phase Analyzing without a capture (status.artifacts.prefix is unset)"
        new = status.model_copy(
            update={
                "phase": "Failed",
                "completion_time": now,
                "conditions": _conds(status, _stalled("NoCapture", message), generation, now),
            }
        )
        return Decision(new, events=[Event("Warning", "NoCapture", message)])
    if job is None:
        return Decision(status, ["launch_job"])
    if job.outcome == "running":
        return Decision(status)
    if job.outcome == "failed":
        message = f"the analyzer Job failed ({job.reason}): {job.message or 'see its pod logs'}"
        new = status.model_copy(
            update={
                "phase": "Failed",
                "completion_time": now,
                "conditions": _conds(status, _stalled("AnalyzerFailed", message), generation, now),
            }
        )
        return Decision(new, events=[Event("Warning", "AnalyzerFailed", message)])
    if world.verdict is None:
        if world.storage_error:  # storage down: keep trying
            return Decision(
                status.model_copy(
                    update={
                        "conditions": _conds(
                            status,
                            _running(
                                "StorageUnavailable",
                                f"the analyzer finished; reading verdict.json failed, retrying: "
                                f"{world.storage_error}",
                            ),
                            generation,
                            now,
                        )
                    }
                )
            )
        message = f"the analyzer Job succeeded but verdict.json is unusable: {world.verdict_error}"
        new = status.model_copy(
            update={
                "phase": "Failed",
                "completion_time": now,
                "conditions": _conds(
                    status, _stalled("VerdictUnreadable", message), generation, now
                ),
            }
        )
        return Decision(new, events=[Event("Warning", "VerdictUnreadable", message)])
    summary = verdict_summary(world.verdict)
    prefix = (status.artifacts.prefix if status.artifacts else None) or ""
    artifacts = Artifacts(
        prefix=prefix,
        verdict=f"{prefix}/{layout.VERDICT}",
        report=f"{prefix}/{layout.REPORT}",
        timeline=f"{prefix}/{layout.TIMELINE}",
    )
    message = f"{summary.status}: {summary.summary}"
    new = status.model_copy(
        update={
            "phase": "Succeeded",
            "completion_time": now,
            "verdict": summary,
            "artifacts": artifacts,
            "conditions": _conds(
                status,
                [
                    Desired(READY, "True", "VerdictReady", message),
                    Desired(RECONCILING, "False", "VerdictReady"),
                    Desired(STALLED, "False", "VerdictReady"),
                ],
                generation,
                now,
            ),
        }
    )
    event = Event("Normal" if summary.status == "healthy" else "Warning", "VerdictReady", message)
    return Decision(new, events=[event])


def plan_annotations(plan: Plan, diagnosis: str) -> dict[str, Any]:
    return {
        "metadata": {
            "annotations": {PLAN_ANNOTATION: plan.to_json(), DIAGNOSIS_ANNOTATION: diagnosis}
        }
    }


def disarm_patch() -> dict[str, Any]:
    return {"metadata": {"annotations": {PLAN_ANNOTATION: None, DIAGNOSIS_ANNOTATION: None}}}
