"""Capture coordination: decisions from Pending (target found) to a verdict (pure).

  Pending ──watch──▶ Watching ──slowdown: arm──▶ Capturing   (spec.trigger)
  Pending ──watch──▶ Watching ──step rate measured (or RATE_WAIT_S passed): arm──▶ Capturing
  Capturing ──all workers reported, deadline, or stuck workers' stacks in──▶
  Analyzing ──Job done──▶ Succeeded (Ready=True, status.verdict) | Failed (Stalled=True)
  Capturing ──the pods gone before any rank began its window──▶ Failed (EndedBeforeWindow)

Every ending (the capture over, Succeeded, Failed for any reason) carries the action "disarm":
this diagnosis' plans come off every target pod, the finished ones too (`pods_to_disarm`).

While capturing, workers whose step stops advancing (perfdiag.api.stall) get a `stacks` plan; their
dumps are copied into the capture before the analyzer runs (a hang verdict).

With spec.trigger, a `watch` plan goes first: the hooks report their mean step time over the
rule's steps, the agents upload it with their status, and the slowdown rule (perfdiag.api.slowdown,
its state kept in status.watch) judges the job's slowest rank at every pass. When it fires, the
capture plan begins at a step ahead of the ranks (`start_step`: every rank captures the same
steps, whenever the plan reaches it), and what fired is written into the capture as
trigger.json (the verdict carries it).

A plan reaches the ranks two ways: the pods' plan annotation, which the kubelet projects into
the downward-API file the hooks read (at its own pace, up to its 60–90 s periodic resync), and
the pods' plan objects in storage, which the agents read every `--plan-poll` seconds (5) and mirror for the hooks
(collector/pod_plan.py). The lead (`capture_lead`) covers the slower way any target pod
depends on: settings.DEFAULT_CAPTURE_LEAD_SECONDS when every pod's agent follows its plan in
storage, settings.KUBELET_CAPTURE_LEAD_SECONDS otherwise; it is counted from the ranks' step
extrapolated to now (`step_now`), so the age of the statuses the operator read needs no lead.

Without a trigger (a one-shot capture) the same watch plan goes first, only to measure the
ranks' step rate (condition reason MeasuringStepRate): the capture plan then begins the lead
ahead as well, since it reaches the pods as late. When no rate comes within RATE_WAIT_S, the
plan goes without a start step (each rank begins at its next step once it sees it).

The reconciler reads the world (pods, worker status.json files, the analyzer Job,
verdict.json), calls `decide`, carries out its actions (write the plan on the pods, create
the Job, remove the plan), then writes the status. Every action is idempotent (the plan id is
derived from the object's uid; the Job name too), so an operator killed between an action and
the status write repeats the action harmlessly after a restart and nothing runs twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from perfdiag.api.diagnosis import (
    MAX_BASELINE_CANDIDATES,
    MAX_STATUS_FINDINGS,
    AnalysisStatus,
    Artifacts,
    FindingSummary,
    FiredSlowdown,
    PerfDiagnosisSpec,
    PerfDiagnosisStatus,
    StepTime,
    VerdictStatusSummary,
    WatchStatus,
    WindowStatus,
    WorkersStatus,
)
from perfdiag.api.plan import Plan, start_step_ahead, watch_deadline
from perfdiag.api.ranks import format_runs, rank_runs
from perfdiag.api.slowdown import StepReport, Track, advance_job, job_report
from perfdiag.api.stall import StallPolicy, progress_from_mapping, stuck_ranks
from perfdiag.api.verdict import Finding, Verdict
from perfdiag.api.worker import WorkerStatus
from perfdiag.operator.analyzer_job import JobState
from perfdiag.operator.injection import (
    follows_plan_successors,
    follows_pod_plan,
    injected,
    training_container_index,
)
from perfdiag.operator.pods import NPROC_ENV
from perfdiag.operator.settings import (
    DEFAULT_CAPTURE_LEAD_SECONDS,
    DIAGNOSIS_ANNOTATION,
    INJECT_LABEL,
    KUBELET_CAPTURE_LEAD_SECONDS,
    PLAN_ANNOTATION,
)
from perfdiag.operator.status import READY, RECONCILING, STALLED, Desired, Event, merge_conditions
from perfdiag.storage import layout

MAX_PLAN_ID = 128
TOP_FINDINGS = MAX_STATUS_FINDINGS
STACKS_SUFFIX = "-stacks"
WATCH_SUFFIX = "-watch"
STACKS_WAIT_S = 30.0
"""How long the ranks have to answer a `stacks` plan (its deadline); the hooks answer within a
second or two, from their own thread, even while training is blocked."""
RATE_STEPS = 10
"""Steps per mean step time in the watch plan of a one-shot capture (it measures the rate)."""
RATE_WAIT_S = 120.0
"""How long a one-shot capture waits for the ranks' step rate before it sends its plan without
a start step: the watch plan reaches a pod within seconds through its agent, or, for a pod
injected by an earlier perfdiag, at the kubelet's periodic resync of its downward-API file
(60–90 s); then its agent uploads every few seconds."""
MAX_EXTRAPOLATION_S = 30.0
"""How far past the ranks' last reported step end `step_now` extrapolates: statuses are
seconds old (the agents upload every 5 s, the operator reads at each recheck); an older one is
from a job that stalled, whose step must not be pushed far ahead."""
MEASURING = "MeasuringStepRate"
ENDED_BEFORE_WINDOW = "EndedBeforeWindow"


def plan_id(name: str, uid: str) -> str:
    """Deterministic per PerfDiagnosis object: re-arming after a restart sends the same id, which
    hooks that already took it ignore."""
    return f"{name[: MAX_PLAN_ID - len(uid) - 1 - len(STACKS_SUFFIX)]}-{uid}"


def watch_plan_id(capture_plan: str) -> str:
    """The `watch` plan of spec.trigger; the agents upload its worker statuses under
    <storage>/<namespace>/<this id>/ (the capture's prefix + WATCH_SUFFIX)."""
    return f"{capture_plan}{WATCH_SUFFIX}"


def stacks_plan_id(capture_plan: str) -> str:
    """The `stacks` plan sent when workers are stuck; the agents write its dumps under
    <storage>/<namespace>/<this id>/, the operator copies them into the capture's prefix."""
    return f"{capture_plan}{STACKS_SUFFIX}"


def namespace_storage(storage_root: str, namespace: str) -> str:
    """<storage>/<namespace>: the agents' --storage in that namespace; the pods' plan objects
    (perfdiag.api.plan.pod_plan_key) and the captures' prefixes are under it."""
    return f"{storage_root.rstrip('/')}/{namespace}"


def capture_lead(pods: Sequence[Mapping[str, Any]], lead_seconds: float) -> float:
    """The lead for a capture on `pods`: `lead_seconds` when every pod's agent follows its plan
    in storage; else enough for the kubelet's periodic resync of the downward-API file, the
    only way the plan reaches the others."""
    if all(follows_pod_plan(pod) for pod in pods):
        return lead_seconds
    return max(lead_seconds, KUBELET_CAPTURE_LEAD_SECONDS)


def step_now(step: int, step_unix: float | None, rate: float | None, now: datetime) -> int:
    """The furthest rank's step now: its reported `step`, which ended at `step_unix`, plus the
    steps run since at `rate` (at most MAX_EXTRAPOLATION_S of them; none without a time or a
    rate). Never below `step`, so a lead counted from it never begins the window earlier."""
    if step_unix is None or rate is None or rate <= 0:
        return step
    elapsed = min(max(now.timestamp() - step_unix, 0.0), MAX_EXTRAPOLATION_S)
    return step + int(rate * elapsed)


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


def reads_successor(pod: Mapping[str, Any], watch_plan: str) -> bool:
    """Whether the pod gets the plan that follows `watch_plan` from that watch plan's successor
    object (perfdiag.api.plan.plan_successor_key), needing no object of its own: its annotation
    holds the watch plan (so its object does: the object is always written first) and its agent
    follows successors."""
    return plan_of(pod)[0] == watch_plan and follows_plan_successors(pod)


def loose_plan_id(text: str | None) -> str | None:
    """The id in a plan annotation, read without validating the rest: a plan this version
    would not write (an older or newer one) is still recognised as ours by its id."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    found = value.get("id") if isinstance(value, dict) else None
    return found if isinstance(found, str) else None


def our_plan_ids(name: str, uid: str, status: PerfDiagnosisStatus | None) -> frozenset[str]:
    """Every plan id this diagnosis may have put on pods: the ones its name and uid make
    (capture, watch, stacks), which need no status, and the ones its status names."""
    capture = plan_id(name, uid)
    ids = {capture, watch_plan_id(capture), stacks_plan_id(capture)}
    window = status.window.plan_id if status is not None and status.window else None
    if window is not None:
        ids |= {window, watch_plan_id(window), stacks_plan_id(window)}
    watch = status.watch.plan_id if status is not None and status.watch else None
    if watch is not None:
        ids.add(watch)
    return frozenset(ids)


def pods_to_disarm(
    pods: Iterable[Mapping[str, Any]], name: str, plan_ids: frozenset[str]
) -> list[str]:
    """The pods (live, finished or being deleted) that carry what this diagnosis put there: one
    of its plans, or its name alone in the diagnosis annotation (the plan already removed by
    hand). Another diagnosis' plan is never touched."""
    found = []
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        raw = annotations.get(PLAN_ANNOTATION)
        ours = (
            loose_plan_id(raw) in plan_ids if raw else annotations.get(DIAGNOSIS_ANNOTATION) == name
        )
        if ours:
            found.append(str(pod["metadata"]["name"]))
    return sorted(found)


def expected_ranks(pods: Sequence[Mapping[str, Any]]) -> int:
    """Ranks the target runs: per pod, the training container's PET_NPROC_PER_NODE (what the
    training operator sets from nprocPerNode) when it is a number, else 1."""
    total = 0
    for pod in pods:
        containers = list((pod.get("spec") or {}).get("containers") or [])
        if not containers:
            continue
        env = containers[training_container_index(containers)].get("env") or []
        value = next((v.get("value") for v in env if v.get("name") == NPROC_ENV), None)
        total += int(value) if isinstance(value, str) and value.isdigit() else 1
    return total


@dataclass(frozen=True)
class World:
    """What the reconciler read for one pass."""

    pods: list[dict[str, Any]] = field(default_factory=list)  # live target pods
    # Every target pod as read, finished ones too: an ending takes the plans off them all.
    target_pods: list[dict[str, Any]] = field(default_factory=list)
    workers: dict[int, WorkerStatus] = field(default_factory=dict)  # this plan's status.json
    storage_error: str | None = None  # reading storage failed (kept trying)
    job: JobState | None = None  # the analyzer Job, when it exists
    verdict: Verdict | None = None  # verdict.json, once the Job succeeded
    verdict_error: str | None = None
    stacks: frozenset[int] = frozenset()  # ranks whose stack dump (stacks plan) is in storage
    # While watching: the capture plan already in the capture's prefix, from a pass that sent
    # it but whose status write was lost (a conflict, a restart); sent again as it is.
    sent: Plan | None = None


Action = Literal[
    "watch", "arm", "record_trigger", "stacks", "launch_job", "disarm", "collect_stacks"
]


@dataclass(frozen=True)
class Situation:
    """What one decision starts from: the object's generation and spec, its status so far
    (after the target was observed), the world read for it, how messages name the target,
    and the decision's moment."""

    generation: int
    spec: PerfDiagnosisSpec
    status: PerfDiagnosisStatus
    world: World
    target: str
    now: datetime


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
    lead_seconds: float = DEFAULT_CAPTURE_LEAD_SECONDS,
) -> Decision:
    """The next status and the actions that lead there, for a diagnosis whose target was found
    (phase Pending), that waits for a slowdown or measures the step rate (Watching) or whose
    capture is under way (Capturing, Analyzing). `lead_seconds`: how far ahead of the ranks a
    window begins (settings.DEFAULT_CAPTURE_LEAD_SECONDS)."""
    at = Situation(generation, spec, status, world, target, now)
    if status.phase == "Pending":
        return _pending(at, name, uid, namespace, storage_root)
    if status.phase == "Watching":
        return _watching(at, lead_seconds)
    if status.phase == "Capturing":
        return _capturing(at)
    if status.phase == "Analyzing":
        return _analyzing(at)
    return Decision(status)


def _failed(
    at: Situation, reason: str, message: str, actions: Sequence[Action] = (), **update: Any
) -> Decision:
    """The diagnosis ends without a verdict: phase Failed, Stalled with `reason`, a Warning
    event, its plans taken off the pods (whatever phase it ends in); `update`: more of the
    status that changes with it."""
    status, generation, now = at.status, at.generation, at.now
    new = status.model_copy(
        update={
            "phase": "Failed",
            "completion_time": now,
            **update,
            "conditions": _conds(status, _stalled(reason, message), generation, now),
        }
    )
    ending: list[Action] = ["disarm", *(a for a in actions if a != "disarm")]
    return Decision(new, ending, events=[Event("Warning", reason, message)])


def _pending(
    at: Situation, name: str, uid: str, namespace: str, storage_root: str | None
) -> Decision:
    status, world, target, now, generation = at.status, at.world, at.target, at.now, at.generation

    def hold(desired: list[Desired]) -> Decision:
        return Decision(
            status.model_copy(update={"conditions": _conds(status, desired, generation, now)})
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

    return _start_watch(at, storage_root, namespace, mine)


def capture_plan(
    spec: PerfDiagnosisSpec,
    plan: str,
    now: datetime,
    start_step: int | None = None,
    lead_s: float = 0.0,
) -> Plan:
    """The capture plan; a window that begins ahead (`start_step`) gets the lead on top of the
    capture's timeout."""
    return Plan(
        id=plan,
        action="capture",
        steps=spec.capture.steps,
        activities=list(spec.capture.activities),
        python_stacks=spec.capture.python_stacks,
        deadline=now + timedelta(seconds=spec.capture.timeout_seconds + lead_s),
        start_step=start_step,
    )


def watch_plan(spec: PerfDiagnosisSpec, capture: str, now: datetime) -> Plan:
    """The watch plan: the slowdown rule's (spec.trigger), or, for a one-shot capture, the one
    that measures the step rate (RATE_STEPS)."""
    steps = spec.trigger.slowdown.baseline_steps if spec.trigger is not None else RATE_STEPS
    return Plan(
        id=watch_plan_id(capture),
        action="watch",
        steps=steps,
        deadline=watch_deadline(now),
    )


def _start_watch(at: Situation, storage_root: str, namespace: str, capture: str) -> Decision:
    spec, status, world, now, generation = at.spec, at.status, at.world, at.now, at.generation
    plan = watch_plan(spec, capture, now)
    expected = expected_ranks(world.pods)
    if spec.trigger is not None:
        rule = spec.trigger.slowdown
        reason, event = "Watching", "WatchStarted"
        message = (
            f"plan {plan.id} sent to {len(world.pods)} pod(s): watching {expected} rank(s) for "
            f"a {rule.percent:g}% slowdown (mean step over {rule.baseline_steps} steps)"
        )
    else:
        reason = event = MEASURING
        message = (
            f"plan {plan.id} sent to {len(world.pods)} pod(s): measuring the step rate of "
            f"{expected} rank(s), to begin the {spec.capture.steps}-step window at the same "
            "step on every rank"
        )
    new = status.model_copy(
        update={
            "phase": "Watching",
            "watch": WatchStatus(plan_id=plan.id, start_time=now),
            "workers": WorkersStatus(expected=expected),
            "artifacts": Artifacts(prefix=capture_prefix(storage_root, namespace, capture)),
            "conditions": _conds(status, _running(reason, message), generation, now),
        }
    )
    return Decision(new, ["watch"], plan, [Event("Normal", event, message)])


def step_reports(workers: Mapping[int, WorkerStatus]) -> list[StepReport]:
    """The workers' step times, as the slowdown rule reads them."""
    return [
        StepReport(rank, w.step, w.mean_step_ms, w.mean_steps, w.max_step_ms)
        for rank, w in sorted(workers.items())
        if w.mean_step_ms is not None and w.mean_steps is not None
    ]


def _track(watch: WatchStatus) -> Track:
    return Track(
        minima=tuple((c.step, c.step_ms) for c in watch.candidates),
        last_step=watch.rule_step if watch.rule_step is not None else -1,
        over=watch.over,
    )


def _furthest(workers: Mapping[int, WorkerStatus]) -> tuple[int, float | None]:
    """The job's furthest step and when it ended (unix seconds, when the worker said)."""
    if not workers:
        return 0, None
    ahead = max(workers.values(), key=lambda w: (w.step, w.last_step_unix or 0.0))
    return ahead.step, ahead.last_step_unix


def _step_rate(
    watch: WatchStatus,
    reports: Sequence[StepReport],
    step: int,
    step_unix: float | None,
    now: datetime,
) -> float | None:
    """The job's step rate: from the fastest rank's mean step, and from the furthest step's
    progress since the last pass (timed by the workers' step ends); the higher of the two (a
    window that begins later is safe, one that begins before a rank has the plan is not)."""
    rates = [1000.0 / r.mean_step_ms for r in reports if r.mean_step_ms > 0]
    ended = step_unix if step_unix is not None else now.timestamp()
    if watch.rate_step is not None and watch.rate_time is not None and step > watch.rate_step:
        elapsed = ended - watch.rate_time.timestamp()
        if elapsed > 0:
            rates.append((step - watch.rate_step) / elapsed)
    if not rates:
        return watch.steps_per_second
    return max(rates)


def _capture_of(watch: WatchStatus) -> str | None:
    """The capture plan's id, from the watch plan's (None: the status lost its watch plan)."""
    return watch.plan_id[: -len(WATCH_SUFFIX)] if watch.plan_id else None


def _step_advanced(
    watch: WatchStatus, world: World, step: int, step_unix: float | None, now: datetime
) -> dict[str, Any]:
    """The watch status' furthest step and when it ended, when the job moved past the last
    one measured (the step rate is measured from there); else nothing changes."""
    if world.workers and (watch.rate_step is None or step > watch.rate_step):
        ended = datetime.fromtimestamp(step_unix, tz=timezone.utc) if step_unix is not None else now
        return {"step": step, "rate_step": step, "rate_time": ended}
    return {}


def _capture_sent(
    at: Situation, watch: WatchStatus, plan: Plan, expected: int, message: str
) -> PerfDiagnosisStatus:
    """Watching ends with the capture plan sent: phase Capturing, its window, the ranks
    expected."""
    status, generation, now = at.status, at.generation, at.now
    return status.model_copy(
        update={
            "phase": "Capturing",
            "watch": watch,
            "window": WindowStatus(
                plan_id=plan.id,
                start_step=plan.start_step,
                steps=plan.steps,
                deadline=plan.deadline.replace(microsecond=0),
                start_time=now,
            ),
            "workers": WorkersStatus(expected=expected),
            "conditions": _conds(status, _running("Capturing", message), generation, now),
        }
    )


def _sent_already(at: Situation, watch: WatchStatus, sent: Plan) -> Decision:
    """Watching ends with the capture plan an earlier pass sent (World.sent) and could not
    record: that plan, unchanged, to the pods that lack it, whatever this pass would decide
    now (a rank that read it must not find another start step on its pod)."""
    world = at.world
    expected = expected_ranks(world.pods)
    begins = (
        f"from step {sent.start_step}"
        if sent.start_step is not None
        else "each rank from its next step"
    )
    message = (
        f"plan {sent.id} sent to {len(world.pods)} pod(s): capturing {sent.steps} steps "
        f"{begins} on {expected} rank(s), deadline {sent.deadline:%H:%M:%SZ}"
    )
    new = _capture_sent(at, watch, sent, expected, message)
    return Decision(new, ["arm"], sent, [Event("Normal", "PlanSent", message)])


def _watch_ended(at: Situation, gone: str | None) -> Decision:
    """Watching ends without a capture: the target's pods are gone (`gone` says how far it
    got), or the status lost its watch plan (`gone` None)."""
    if gone is not None:
        reason, message = "TargetGone", f"{gone}; nothing was captured"
    else:
        reason = "NoWatch"
        message = "phase Watching without a watch plan (status.watch.planId is unset)"
    return _failed(at, reason, message)


def _watching(at: Situation, lead_seconds: float) -> Decision:
    spec, status, world, target, now = at.spec, at.status, at.world, at.target, at.now
    if spec.trigger is None:
        return _measuring(at, lead_seconds)
    watch = status.watch or WatchStatus()
    rule = spec.trigger.slowdown.rule()
    capture = _capture_of(watch)
    if not world.pods or capture is None:
        gone = f"the pods of {target} are gone before a {rule.percent:g}% slowdown"
        return _watch_ended(at, gone if capture is not None else None)

    reports = step_reports(world.workers)
    track, fired = advance_job(_track(watch), reports, rule, max_minima=MAX_BASELINE_CANDIDATES)
    step, step_unix = _furthest(world.workers)
    rate = _step_rate(watch, reports, step, step_unix, now)
    latest = track.latest
    update: dict[str, Any] = {
        "reporting": len(world.workers),
        "over": track.over,
        "rule_step": track.last_step if track.last_step >= 0 else None,
        "candidates": [StepTime(step=s, step_ms=ms) for s, ms in track.minima],
        "baseline_step": track.baseline[0] if track.baseline else None,
        "baseline_step_ms": track.baseline[1] if track.baseline else None,
        "steps_per_second": round(rate, 3) if rate is not None else None,
    }
    slowest = job_report(reports, rule)
    if latest is not None and slowest is not None and track.last_step != watch.rule_step:
        update.update({"step_ms": round(latest[1], 3), "rank": slowest.rank})
    update.update(_step_advanced(watch, world, step, step_unix, now))
    new_watch = watch.model_copy(update=update)
    if world.sent is not None and world.sent.id == capture:
        if fired is not None:
            slowdown = FiredSlowdown.model_validate(fired.model_dump())
            new_watch = new_watch.model_copy(update={"slowdown": slowdown})
        return _sent_already(at, new_watch, world.sent)

    if fired is not None:
        lead = capture_lead(world.pods, lead_seconds)
        start = start_step_ahead(step_now(step, step_unix, rate, now), rate, lead)
        plan = capture_plan(spec, capture, now, start_step=start, lead_s=lead)
        new_watch = new_watch.model_copy(
            update={"slowdown": FiredSlowdown.model_validate(fired.model_dump())}
        )
        message = (
            f"slowdown: {fired.describe()}; plan {capture} sent: capturing "
            f"{spec.capture.steps} steps from step {start}"
        )
        new = _capture_sent(at, new_watch, plan, expected_ranks(world.pods), message)
        return Decision(
            new, ["record_trigger", "arm"], plan, [Event("Warning", "SlowdownDetected", message)]
        )

    if new_watch.baseline_step_ms is None:
        progress = (
            f"watching for a {rule.percent:g}% slowdown: {len(world.workers)} rank(s) "
            f"reporting, the baseline needs {rule.baseline_steps} steps"
        )
    else:
        change = ((new_watch.step_ms or 0.0) / new_watch.baseline_step_ms - 1.0) * 100.0
        progress = (
            f"watching for a {rule.percent:g}% slowdown: step {new_watch.step}, step time "
            f"{new_watch.step_ms:.1f} ms on rank {new_watch.rank} ({change:+.0f}% against the "
            f"baseline {new_watch.baseline_step_ms:.1f} ms of step {new_watch.baseline_step})"
        )
    return _still_watching(at, capture, watch, new_watch, progress, "Watching")


def _measuring(at: Situation, lead_seconds: float) -> Decision:
    """A one-shot capture measuring the step rate (phase Watching, reason MeasuringStepRate):
    once a rank reported, the capture plan begins the lead ahead of the furthest step at the
    job's rate; when no rate came within RATE_WAIT_S, it goes without a start step."""
    spec, status, world, target, now = at.spec, at.status, at.world, at.target, at.now
    watch = status.watch or WatchStatus()
    capture = _capture_of(watch)
    if not world.pods or capture is None:
        reached = f" (last reported step {watch.step})" if watch.step is not None else ""
        gone = f"the pods of {target} are gone before the capture began{reached}"
        return _watch_ended(at, gone if capture is not None else None)

    reports = step_reports(world.workers)
    step, step_unix = _furthest(world.workers)
    rate = _step_rate(watch, reports, step, step_unix, now) if world.workers else None
    update: dict[str, Any] = {
        "reporting": len(world.workers),
        "steps_per_second": round(rate, 3) if rate is not None else None,
    }
    update.update(_step_advanced(watch, world, step, step_unix, now))
    new_watch = watch.model_copy(update=update)
    expected = expected_ranks(world.pods)
    if world.sent is not None and world.sent.id == capture:
        return _sent_already(at, new_watch, world.sent)
    waited = (now - watch.start_time).total_seconds() if watch.start_time is not None else 0.0

    if (rate is not None and rate > 0) or waited >= RATE_WAIT_S:
        if rate is not None and rate > 0:
            lead = capture_lead(world.pods, lead_seconds)
            start = start_step_ahead(step_now(step, step_unix, rate, now), rate, lead)
            plan = capture_plan(spec, capture, now, start_step=start, lead_s=lead)
            message = (
                f"step rate {rate:.3g} steps/s at step {step} ({len(world.workers)} rank(s) "
                f"reporting): plan {capture} sent to {len(world.pods)} pod(s): capturing "
                f"{spec.capture.steps} steps from step {start} ({lead:g} s ahead) on "
                f"{expected} rank(s), deadline {plan.deadline:%H:%M:%SZ}"
            )
            kind: Literal["Normal", "Warning"] = "Normal"
        else:
            plan = capture_plan(spec, capture, now)
            heard = (
                f"{len(world.workers)} rank(s) reported, at step {step}, without a step time"
                if world.workers
                else "no rank reported"
            )
            message = (
                f"the step rate could not be measured within {RATE_WAIT_S:g} s ({heard}): plan "
                f"{capture} sent to {len(world.pods)} pod(s) without a start step: capturing "
                f"{spec.capture.steps} steps on {expected} rank(s), each from its next step "
                "once its pod's plan file shows the plan (the ranks' windows may cover "
                f"different steps), deadline {plan.deadline:%H:%M:%SZ}"
            )
            kind = "Warning"
        new = _capture_sent(at, new_watch, plan, expected, message)
        return Decision(new, ["arm"], plan, [Event(kind, "PlanSent", message)])

    progress = (
        f"measuring the step rate before planning the capture: {len(world.workers)}/{expected} "
        f"rank(s) reporting ({max(RATE_WAIT_S - waited, 0.0):.0f} s left before the plan goes "
        "without a start step)"
    )
    return _still_watching(at, capture, watch, new_watch, progress, MEASURING)


def _still_watching(
    at: Situation,
    capture: str,
    watch: WatchStatus,
    new_watch: WatchStatus,
    progress: str,
    reason: str,
) -> Decision:
    """Watching goes on: the new watch status, the watch plan sent again to any pod created
    since, the progress in the conditions."""
    spec, status, world, now, generation = at.spec, at.status, at.world, at.now, at.generation
    if world.storage_error:
        progress += f"; storage unavailable, retrying: {world.storage_error}"
        reason = "StorageUnavailable"
    actions: list[Action] = []
    resend: Plan | None = None
    if watch.plan_id is not None and any(plan_of(p)[0] != watch.plan_id for p in world.pods):
        actions, resend = ["watch"], watch_plan(spec, capture, now)  # a pod (re)created since
    new = status.model_copy(
        update={
            "watch": new_watch,
            "workers": (status.workers or WorkersStatus()).model_copy(
                update={"reporting": len(world.workers)}
            ),
            "conditions": _conds(status, _running(reason, progress), generation, now),
        }
    )
    return Decision(new, actions, resend)


def stall_policy(spec: PerfDiagnosisSpec) -> StallPolicy:
    """The analyzer's stuck rule (perfdiag.api.stall) with the diagnosis' thresholds; the analyzer
    Job gets the same thresholds, so both call the same ranks stuck."""
    thresholds = spec.analysis.thresholds()
    return StallPolicy(
        min_s=thresholds.stuck_after_seconds, step_factor=thresholds.stuck_after_steps
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


def _reached(status: PerfDiagnosisStatus, world: World) -> int | None:
    """The furthest step the ranks reported: in the capture's statuses, else while watching."""
    steps = [w.step for w in world.workers.values()]
    if status.watch is not None and status.watch.step is not None:
        steps.append(status.watch.step)
    return max(steps) if steps else None


def ended_before_window_message(window: WindowStatus, reached: int | None, target: str) -> str:
    """The job ended (its pods are gone) before any rank began its window."""
    at = f"at step {reached} " if reached is not None else ""
    if window.start_step is not None:
        last = window.start_step + (window.steps or 1) - 1
        began = f"before the window (steps {window.start_step}–{last}) began"
    else:
        began = "before any rank began its window"
    unknown = "" if reached is not None else " (no rank reported its step)"
    return (
        f"{target} ended {at}{began}{unknown}: nothing was captured; create a new "
        "PerfDiagnosis while the job has more steps to run"
    )


def _capturing(at: Situation) -> Decision:
    spec, status, world, target, now = at.spec, at.status, at.world, at.target, at.now
    generation = at.generation
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

    began = any(
        w.phase in ("capturing", "processing", "done", "failed") for w in world.workers.values()
    )
    reached = _reached(status, world)
    if gone and not began and (window.start_step is None or (reached or 0) < window.start_step):
        return _failed(
            at,
            ENDED_BEFORE_WINDOW,
            ended_before_window_message(window, reached, target),
            workers=counts(expected),
            window=window.model_copy(update={"completion_time": now}),
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
                "analysis": analysis_record(spec, generation),
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


def _finding_summaries(findings: Sequence[Finding]) -> list[FindingSummary]:
    """The first TOP_FINDINGS, without their evidence (verdict.json has it)."""
    return [
        FindingSummary(
            kind=f.kind,
            category=f.category,
            function=f.function,
            ranks=list(f.ranks),
            node=node if isinstance(node := f.evidence.get("node"), str) and node else None,
            severity=f.severity,
            message=f.message,
        )
        for f in findings[:TOP_FINDINGS]
    ]


def verdict_summary(verdict: Verdict) -> VerdictStatusSummary:
    ordered = verdict.sorted()
    findings = ordered.findings
    # The ranks findings name (not job-wide expected ranges: a verdict of an earlier v1 has them
    # among its findings, a later one among its observations, which name no culprit), the
    # workers that are missing, and stuck workers only when no finding singles out the ranks
    # holding the others up (in a hang every rank is stuck; the hang finding names the culprits).
    culprits = {r for f in findings if f.kind != "expected_range" for r in f.ranks}
    culprits |= {r for first, last in verdict.rank_runs("missing") for r in range(first, last + 1)}
    if not culprits:
        culprits = {w.rank for w in verdict.workers if w.state == "stuck"}
    pods = {w.rank: w.pod for w in verdict.workers if w.pod}
    return VerdictStatusSummary(
        status=verdict.status,
        summary=verdict.summary,
        top_findings=_finding_summaries(findings),
        culprit_ranks=sorted(culprits),
        culprits=format_runs(rank_runs(culprits)) or None,
        culprit_pods=sorted({pods[r] for r in culprits if r in pods}),
        observations=_finding_summaries(ordered.observations),
    )


def analysis_record(spec: PerfDiagnosisSpec, generation: int) -> AnalysisStatus:
    """What the analyzer Job created in this pass is given: this generation's spec.analysis."""
    return AnalysisStatus(generation=generation, thresholds=spec.analysis.to_wire())


def _analyzing(at: Situation) -> Decision:
    spec, status, world, now, generation = at.spec, at.status, at.world, at.now, at.generation
    job = world.job
    if not (status.artifacts and status.artifacts.prefix):
        # Only a status written by hand gets here: there is no capture to analyze.
        message = "phase Analyzing without a capture (status.artifacts.prefix is unset)"
        return _failed(at, "NoCapture", message)
    if job is None:  # not created yet, or deleted since: created now, with the current thresholds
        relaunched = status.model_copy(update={"analysis": analysis_record(spec, generation)})
        return Decision(relaunched, ["launch_job"])
    if job.outcome == "running":
        return Decision(status)
    if job.outcome == "failed":
        message = f"the analyzer Job failed ({job.reason}): {job.message or 'see its pod logs'}"
        return _failed(at, "AnalyzerFailed", message)
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
        return _failed(at, "VerdictUnreadable", message)
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
    return Decision(new, ["disarm"], events=[event])


def plan_annotations(plan: Plan, diagnosis: str) -> dict[str, Any]:
    return {
        "metadata": {
            "annotations": {PLAN_ANNOTATION: plan.to_json(), DIAGNOSIS_ANNOTATION: diagnosis}
        }
    }


def disarm_patch() -> dict[str, Any]:
    return {"metadata": {"annotations": {PLAN_ANNOTATION: None, DIAGNOSIS_ANNOTATION: None}}}
