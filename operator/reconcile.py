"""One reconcile pass over one PerfDiagnosis: read, decide (pure functions), write.

Level-triggered and idempotent: it reads the object fresh, computes the status from the object
and the world, and writes only a difference, with the resourceVersion it read as a
precondition. Two passes racing (a change handler and the recheck loop, or two operator
replicas) cannot both apply the same transition: the loser gets 409 Conflict and recomputes
from the winner's status, where the transition is already done (a conflict with a change of
metadata alone, which decides nothing, is written again instead: `_write_status`). Events are posted after the
status write succeeded, so a transition is announced at most once (an operator killed between
the two loses the Event, never duplicates it); conditions are the record, Events the courtesy.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from perfdiag.api.diagnosis import (
    TERMINAL_PHASES,
    PerfDiagnosisSpec,
    PerfDiagnosisStatus,
    Target,
)
from perfdiag.api.plan import Plan, plan_successor_key, pod_plan_key
from perfdiag.api.trigger import Slowdown
from perfdiag.api.validation import validation_problems
from perfdiag.api.verdict import Verdict
from perfdiag.api.worker import WorkerStatus
from perfdiag.operator.analyzer_job import JobState, analyzer_job, job_name, job_state
from perfdiag.operator.coordination import (
    STACKS_SUFFIX,
    WATCH_SUFFIX,
    Action,
    Decision,
    World,
    decide,
    disarm_patch,
    namespace_storage,
    our_plan_ids,
    plan_annotations,
    plan_of,
    pods_to_disarm,
    reads_successor,
    stacks_plan_id,
    watch_plan_id,
)
from perfdiag.operator.kube import API_CONNECTIONS, ApiException, Kube, status_of
from perfdiag.operator.metrics import OperatorMetrics, error_reason, pass_record
from perfdiag.operator.pods import slim_pod
from perfdiag.operator.settings import OperatorConfig
from perfdiag.operator.status import (
    READY,
    RECONCILING,
    STALLED,
    Desired,
    Event,
    at_generation,
    compute_status,
    keep_transition_times,
    merge_conditions,
    merge_patch,
    now_utc,
    thresholds_applied,
    transition_events,
    ttl_expired,
)
from perfdiag.operator.targets import describe, is_live, pod_selector
from perfdiag.storage import Storage, StorageError, StorageNotFound, layout, open_storage

log = logging.getLogger("perfdiag.operator")

Outcome = Literal["gone", "unchanged", "updated", "deleted"]
MAX_CONFLICTS = 5
POD_PLAN_DELETERS = 32  # concurrent deletes of the pods' plan objects, each on its own connection
POD_PATCHERS = API_CONNECTIONS  # concurrent patches of the pods' plan annotations


class PodPlansRemain(RuntimeError):
    """The pods' plan objects could not be deleted from storage (an ending is retried)."""


class StillConflicting(RuntimeError):
    """Every try of a pass met a newer object (409 Conflict)."""


@dataclass(frozen=True)
class ActionStep:
    """What an action of a decision is carried out with: the object and what the decision
    was made from, and the decision."""

    obj: dict[str, Any]
    spec: PerfDiagnosisSpec
    status: PerfDiagnosisStatus  # before the decision
    generation: int
    now: datetime
    world: World
    decision: Decision

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"]["uid"])

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"

    def unless(self, storage_error: str | None) -> Decision | None:
        """None when there is no storage error; else the pass ends with the status saying
        storage is unavailable (retried at the next pass)."""
        if storage_error is None:
            return None
        return _storage_unavailable(self.status, self.generation, self.now, storage_error)


@dataclass
class Reconciler:
    """Serializes passes per object inside this process (conflicts handle the rest)."""

    kube: Kube
    config: OperatorConfig
    clock: Callable[[], datetime] = now_utc
    metrics: OperatorMetrics | None = None  # counted after the writes they count

    def __post_init__(self) -> None:
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def reconcile(self, namespace: str, name: str) -> Outcome:
        try:
            return self._reconcile(namespace, name)
        except StillConflicting:
            if self.metrics is not None:
                self.metrics.reconcile_error("Conflict")
            raise
        except Exception as exc:
            if self.metrics is not None:
                self.metrics.reconcile_error(error_reason(exc))
            raise

    def _reconcile(self, namespace: str, name: str) -> Outcome:
        with self._lock(namespace, name):
            for _ in range(MAX_CONFLICTS):
                try:
                    return self._once(namespace, name)
                except ApiException as exc:
                    if status_of(exc) != 409:
                        raise
                    log.debug("%s/%s changed while reconciling; recomputing", namespace, name)
            raise StillConflicting(
                f"{namespace}/{name}: still conflicting after {MAX_CONFLICTS} tries"
            )

    def _once(self, namespace: str, name: str) -> Outcome:
        obj = self.kube.get_diagnosis(namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return "gone"
        meta = obj["metadata"]
        generation = int(meta.get("generation", 1))
        raw_status: dict[str, Any] = obj.get("status") or {}
        old = PerfDiagnosisStatus.model_validate(raw_status) if raw_status else None
        now = self.clock()
        extra_events: list[Event] = []
        job: JobState | None = None  # the analyzer Job as this pass read it
        try:
            spec = PerfDiagnosisSpec.model_validate(obj.get("spec") or {})
        except ValidationError as exc:
            # The CRD's schema admits nothing the models reject; this guards version skew.
            new = _invalid_spec_status(old, generation, now, exc)
        else:
            if ttl_expired(spec, old, now):
                log.info("%s/%s: ttlSecondsAfterFinished passed; deleting", namespace, name)
                self.kube.delete_diagnosis(namespace, name, meta["uid"])
                return "deleted"
            if old is not None and old.phase in TERMINAL_PHASES:
                new = old.model_copy(update={"observed_generation": generation})
            else:
                began = time.monotonic()
                observation, target_pods = self.kube.observe_target(namespace, spec.target)
                new = compute_status(
                    old,
                    generation=generation,
                    observation=observation,
                    now=now,
                    recheck_seconds=self.config.recheck_seconds,
                )
                capture_started = new.phase in ("Watching", "Capturing", "Analyzing")
                if capture_started or (new.phase == "Pending" and observation.state == "found"):
                    world = self._world(namespace, name, meta["uid"], new, target_pods)
                    read_s = time.monotonic() - began
                    # The decision's moment is after the reads: a start step is extrapolated to
                    # it, and the lead counts from it.
                    now = self.clock()
                    decision = self._coordinate(obj, spec, new, generation, now, world)
                    if decision.actions:
                        log.info(
                            "%s/%s: decided %s after reading %d pod(s) and %d worker "
                            "status(es) in %.2f s",
                            namespace, name, ",".join(decision.actions), len(world.pods),
                            len(world.workers), read_s,
                        )  # fmt: skip
                    new, extra_events, job = decision.status, decision.events, world.job
            new = thresholds_applied(spec, new, generation, now)
        new = keep_transition_times(old, at_generation(new, generation))
        if self.metrics is not None:
            self.metrics.storage_unavailable(new)
        # Diff the normalized forms: fields this version does not know are left alone.
        patch = merge_patch(old.to_wire() if old is not None else {}, new.to_wire())
        if not patch:
            return "unchanged"
        written = self._write_status(obj, patch)
        if self.metrics is not None:
            record = pass_record(old, new, created=_created(meta), job=job)
            self.metrics.record(record, trigger=spec_has_trigger(obj))
        for event in [*extra_events, *transition_events(old, new)]:
            self._post(written, event)
        return "updated"

    def _write_status(self, read: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
        """Write the status patch computed from `read`, on that version of the object. A 409
        whose newer object differs only in metadata the pass does not read (labels,
        annotations: kopf's own bookkeeping after a handler) is written again on the newer
        version: recomputing would redo what the pass already did to the pods. Any other
        change is raised, and the pass recomputed."""
        meta = read["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        version = meta["resourceVersion"]
        for _ in range(MAX_CONFLICTS):
            try:
                return self.kube.patch_status(namespace, name, patch, version)
            except ApiException as exc:
                if status_of(exc) != 409:
                    raise
                newer = self.kube.get_diagnosis(namespace, name)
                if newer is None or not _same_inputs(read, newer):
                    raise
                log.debug(
                    "%s/%s: metadata changed meanwhile; status written again", namespace, name
                )
                version = newer["metadata"]["resourceVersion"]
        raise StillConflicting(f"{namespace}/{name}: still conflicting after {MAX_CONFLICTS} tries")

    # ---- capture coordination ----------------------------------------------------------------
    def _coordinate(
        self,
        obj: dict[str, Any],
        spec: PerfDiagnosisSpec,
        status: PerfDiagnosisStatus,
        generation: int,
        now: datetime,
        world: World,
    ) -> Decision:
        meta = obj["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        decision = decide(
            name=name,
            uid=uid,
            namespace=namespace,
            generation=generation,
            spec=spec,
            status=status,
            world=world,
            storage_root=self.config.storage,
            target=describe(spec.target),
            now=now,
            lead_seconds=self.config.effective_capture_lead,
        )
        step = ActionStep(obj, spec, status, generation, now, world, decision)
        for action in decision.actions:
            stopped = ACTION_HANDLERS[action](self, step)
            if stopped is not None:
                return stopped
        return decision

    # ---- the decision's actions (ACTION_HANDLERS): None goes on, a Decision ends the pass ----
    def _watch(self, step: ActionStep) -> Decision | None:
        plan = step.decision.plan
        assert plan is not None
        return step.unless(self._send_plan(step.namespace, step.name, plan, step.world.pods))

    def _record_trigger(self, step: ActionStep) -> Decision | None:
        watch, artifacts = step.decision.status.watch, step.decision.status.artifacts
        assert watch is not None and watch.slowdown is not None and artifacts is not None
        fired = Slowdown.model_validate(watch.slowdown.model_dump(by_alias=False))
        try:
            _open_storage(artifacts.prefix or "").put_text(layout.TRIGGER, fired.model_dump_json())
        except StorageError as exc:
            log.warning("%s: cannot write %s: %s", step.describe(), layout.TRIGGER, exc)
            return step.unless(str(exc))
        return None

    def _arm(self, step: ActionStep) -> Decision | None:
        plan, artifacts = step.decision.plan, step.decision.status.artifacts
        assert plan is not None and artifacts is not None
        prefix = artifacts.prefix or ""
        try:
            # First: a pass that arms again (its status write lost) finds the plan here and
            # sends it unchanged (World.sent).
            _open_storage(prefix).put_text(layout.PLAN, plan.to_json())
        except StorageError as exc:
            log.warning("%s: cannot write the plan to %s: %s", step.describe(), prefix, exc)
            return step.unless(str(exc))
        sent = self._send_plan(
            step.namespace, step.name, plan, step.world.pods, replacing=watch_plan_id(plan.id)
        )
        return step.unless(sent)

    def _stacks(self, step: ActionStep) -> Decision | None:
        plan = step.decision.plan
        assert plan is not None
        return step.unless(self._send_plan(step.namespace, step.name, plan, step.world.pods))

    def _collect_stacks(self, step: ActionStep) -> Decision | None:
        status = step.status
        prefix = (status.artifacts.prefix if status.artifacts else None) or ""
        try:
            copied = _collect_stacks(prefix)
        except StorageError as exc:
            log.warning("%s: stack dumps not copied: %s", step.describe(), exc)
            return step.unless(str(exc))
        log.info("%s: %d stack dump(s) added to the capture", step.describe(), copied)
        return None

    def _disarm_all(self, step: ActionStep) -> Decision | None:
        # Every target pod, not only the live ones: a job that finished keeps its pods, and
        # what this diagnosis put on them must not outlive it.
        try:
            self._disarm(step.namespace, step.name, step.uid, step.status, step.world.target_pods)
        except PodPlansRemain as exc:
            return step.unless(str(exc))  # nothing of the ending is done; decided again
        return None

    def _launch_job(self, step: ActionStep) -> Decision | None:
        artifacts = step.decision.status.artifacts
        workers = step.decision.status.workers
        job = analyzer_job(
            step.obj,
            prefix=(artifacts.prefix if artifacts else None) or "",
            expected_ranks=workers.expected if workers else None,
            image=self.config.image,
            storage_secret=self.config.storage_secret,
            deadline_seconds=self.config.analyzer_deadline_seconds,
            ttl_seconds=self.config.analyzer_ttl_seconds,
            thresholds=step.spec.analysis.to_wire(),
            resources=self.config.analyzer_resources.to_wire(),
            storage_endpoint=self.config.storage_endpoint,
            storage_region=self.config.storage_region,
        )
        if self.kube.create_job(step.namespace, job):
            if self.metrics is not None:
                self.metrics.analyzer_started.inc()
            step.decision.events.append(
                Event("Normal", "AnalyzerStarted", f"Job {job['metadata']['name']} started")
            )
        return None

    def _world(
        self,
        namespace: str,
        name: str,
        uid: str,
        status: PerfDiagnosisStatus,
        target_pods: list[dict[str, Any]],
    ) -> World:
        """What the decision needs beyond the object: the target's pods as this pass read
        them, and what the phase reads from storage and the analyzer Job."""
        world = World(pods=[p for p in target_pods if is_live(p)], target_pods=target_pods)
        prefix = status.artifacts.prefix if status.artifacts else None
        if prefix is None or status.phase == "Pending":
            return world
        try:
            if status.phase == "Watching":
                watch = status.watch.plan_id if status.watch else None
                storage = _open_storage(f"{prefix}{WATCH_SUFFIX}")
                workers = _worker_statuses(storage, watch)
                return replace(world, workers=workers, sent=_sent_plan(_open_storage(prefix)))
            storage = _open_storage(prefix)
            if status.phase == "Capturing":
                workers = _worker_statuses(
                    storage, status.window.plan_id if status.window else None
                )
                stacks = _stack_dumps(prefix, status, world.pods)
                return replace(world, workers=workers, stacks=stacks)
            raw_job = self.kube.get_job(namespace, job_name(name, uid))
            job = job_state(raw_job) if raw_job is not None else None
            if job is None or job.outcome != "succeeded":
                return replace(world, job=job)
            try:
                verdict = Verdict.model_validate_json(storage.get_text(layout.VERDICT))
            except StorageNotFound:
                missing = f"{prefix}/{layout.VERDICT} is missing"
                return replace(world, job=job, verdict_error=missing)
            except ValueError as exc:
                return replace(world, job=job, verdict_error=str(exc).splitlines()[0])
            return replace(world, job=job, verdict=verdict)
        except StorageError as exc:
            raw_job = (
                self.kube.get_job(namespace, job_name(name, uid))
                if status.phase == "Analyzing"
                else None
            )
            job = job_state(raw_job) if raw_job is not None else None
            return replace(world, job=job, storage_error=str(exc))

    def _target_pods(self, namespace: str, target: Target) -> list[dict[str, Any]]:
        """The target's pods: the named pod, or the pods its selector matches."""
        selector = pod_selector(target)
        if selector is None:
            assert target.name is not None
            pod = self.kube.get_pod(namespace, target.name)
            return [slim_pod(pod)] if pod is not None else []
        return self.kube.list_pods(namespace, selector)

    def _send_plan(
        self,
        namespace: str,
        name: str,
        plan: Plan,
        pods: list[dict[str, Any]],
        *,
        replacing: str | None = None,
    ) -> str | None:
        """Give `pods` the plan: first in storage, which their agents read within seconds, then
        the plan annotation, which the kubelet projects into the downward-API file (the way for
        agents that do not follow storage, and the fallback). With `replacing` (the watch plan
        a capture ends), the plan is written once as that watch plan's successor, which is how
        every pod holding the watch plan, whose agent follows successors, gets it (one write at
        any count of pods); the other pods get an object of their own. Returns the storage
        error, before any annotation is written: an agent that reads storage must never find
        an older plan there than the annotation's. A pod whose annotation holds this plan's id
        already has it (its object was written before the annotation, and a plan id is sent
        with one content): one write each per plan."""
        pods = [pod for pod in pods if plan_of(pod)[0] != plan.id]
        if not pods:
            return None
        began = time.monotonic()
        text = plan.to_json()
        own = pods
        if replacing is not None and self.config.storage:
            error = self._write_successor(namespace, replacing, text)
            if error is not None:
                log.warning("%s/%s: cannot write the plan's successor: %s", namespace, name, error)
                return error
            own = [pod for pod in pods if not reads_successor(pod, replacing)]
        error = self._write_pod_plans(namespace, own, text)
        if error is not None:
            log.warning("%s/%s: cannot write the pods' plan: %s", namespace, name, error)
            return error
        written = time.monotonic()
        patch = plan_annotations(plan, name)
        self._patch_pods(namespace, [str(pod["metadata"]["name"]) for pod in pods], patch)
        log.info(
            "%s/%s: plan %s sent to %d pod(s): %d through the successor, %d objects, in %.1f s; "
            "annotations in %.1f s",
            namespace, name, plan.id, len(pods), len(pods) - len(own), len(own),
            written - began, time.monotonic() - written,
        )  # fmt: skip
        return None

    def _write_successor(self, namespace: str, watch_plan: str, text: str) -> str | None:
        """Write `text` as the successor of `watch_plan`; the storage error, if any."""
        uri = namespace_storage(self.config.storage or "", namespace)
        try:
            _open_storage(uri).put_text(plan_successor_key(watch_plan), text)
        except StorageError as exc:
            return str(exc)
        return None

    def _patch_pods(self, namespace: str, names: list[str], patch: dict[str, Any]) -> None:
        """The same merge patch on every pod, a few at a time: one request each, and the pass
        (which holds this diagnosis' lock and writes its status after) waits for the last, so
        at 10,000 pods one-by-one would take minutes. The first error is raised."""
        if len(names) <= 1:
            for pod in names:
                self.kube.patch_pod(namespace, pod, patch)
            return
        with ThreadPoolExecutor(max_workers=POD_PATCHERS) as pool:
            list(pool.map(lambda pod: self.kube.patch_pod(namespace, pod, patch), names))

    def _write_pod_plans(
        self, namespace: str, pods: list[dict[str, Any]], text: str | None
    ) -> str | None:
        """Write (`text`) or delete (None) the plan objects of `pods`; the first storage error,
        if any. The writes go as one put_many (S3: pipelined on a few kept-alive connections,
        ~0.1 ms of the operator's CPU each)."""
        if not pods or not self.config.storage:
            return None
        keys = [pod_plan_key(str(pod["metadata"]["uid"])) for pod in pods]
        if text is None:
            return self._delete_plan_objects(namespace, keys)
        data = text.encode()
        uri = namespace_storage(self.config.storage, namespace)
        written = _open_storage(uri).put_many([(key, data) for key in keys])
        return next((str(error) for error in written if error is not None), None)

    def _delete_plan_objects(self, namespace: str, keys: list[str]) -> str | None:
        """Delete these plan objects, POD_PLAN_DELETERS at a time (one request each), each
        deleter with a storage client of its own: one client keeps a few connections, and
        requests beyond them would each open and drop one. The first error, if any; what is
        not there is deleted."""
        if not keys or not self.config.storage:
            return None
        uri = namespace_storage(self.config.storage, namespace)
        clients = threading.local()

        def delete(key: str) -> str | None:
            try:
                storage: Storage | None = getattr(clients, "storage", None)
                if storage is None:
                    storage = clients.storage = _open_storage(uri)
                storage.delete(key)
            except StorageNotFound:
                return None  # deleting what is not there
            except (StorageError, OSError) as exc:  # a local folder's delete raises OSError
                return str(exc)
            return None

        with ThreadPoolExecutor(max_workers=POD_PLAN_DELETERS) as pool:
            errors = [e for e in pool.map(delete, keys) if e is not None]
        return errors[0] if errors else None

    def _disarm(
        self,
        namespace: str,
        name: str,
        uid: str,
        status: PerfDiagnosisStatus | None,
        pods: list[dict[str, Any]],
        *,
        best_effort: bool = False,
    ) -> int:
        """Take this diagnosis' plan objects out of storage, then its plan and diagnosis
        annotations off `pods`; how many pods changed. When storage cannot be reached it raises
        PodPlansRemain before touching an annotation (the pass is retried: an agent would
        otherwise keep reading a plan whose window has not begun yet, once storage is back);
        with `best_effort` (the object is being deleted) it logs and goes on, and what stays is
        bounded by the plan's deadline and replaced by the pod's next plan."""
        plan_ids = our_plan_ids(name, uid, status)
        names = pods_to_disarm(pods, name, plan_ids)
        wanted = set(names)  # a set: 10,000 pods against a list would be 10^8 comparisons
        armed = [pod for pod in pods if str(pod["metadata"]["name"]) in wanted]
        # The pods' objects first: one left holding a watch plan whose successor is gone
        # would take the watch plan up again until its own object goes.
        error = self._write_pod_plans(namespace, armed, None) or self._delete_plan_objects(
            namespace, [plan_successor_key(i) for i in sorted(plan_ids) if i.endswith(WATCH_SUFFIX)]
        )
        if error is not None:
            if not best_effort:
                raise PodPlansRemain(f"the pods' plans could not be removed from storage: {error}")
            log.warning("%s/%s: the pods' plan objects stay in storage: %s", namespace, name, error)
        self._patch_pods(namespace, list(names), disarm_patch())
        return len(names)

    def _post(self, obj: dict[str, Any], event: Event) -> None:
        try:
            self.kube.post_event(obj, event)
        except ApiException as exc:  # an Event is a courtesy; the status is already written
            log.warning("could not post event %s: %s", event.reason, exc)

    def cleanup(
        self,
        namespace: str,
        name: str,
        uid: str,
        status: PerfDiagnosisStatus | None,
        spec: PerfDiagnosisSpec | None = None,
    ) -> int:
        """Before the diagnosis is deleted: remove its plan from its target pods, so a capture
        that has not started yet never starts, and delete its analyzer Job (the garbage
        collector would, through the ownerReference; doing it now stops the work at once).
        The pods are the spec's target (a named pod has no selector in the status), else the
        status' selector. Returns how many pods were changed."""
        self.kube.delete_job(namespace, job_name(name, uid))
        if spec is not None:
            pods = self._target_pods(namespace, spec.target)
        else:
            selector = status.target.selector if status and status.target else None
            if selector is None:
                return 0
            pods = self.kube.list_pods(namespace, selector)
        return self._disarm(namespace, name, uid, status, pods, best_effort=True)


ACTION_HANDLERS: dict[Action, Callable[[Reconciler, ActionStep], Decision | None]] = {
    "watch": Reconciler._watch,
    "record_trigger": Reconciler._record_trigger,
    "arm": Reconciler._arm,
    "stacks": Reconciler._stacks,
    "collect_stacks": Reconciler._collect_stacks,
    "disarm": Reconciler._disarm_all,
    "launch_job": Reconciler._launch_job,
}
"""What each action of a decision does, in the order the decision lists them."""


def _created(meta: dict[str, Any]) -> datetime | None:
    """The object's creationTimestamp."""
    try:
        return datetime.fromisoformat(str(meta["creationTimestamp"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None


def spec_has_trigger(obj: dict[str, Any]) -> bool:
    """Whether the diagnosis waits for a slowdown (spec.trigger)."""
    return bool((obj.get("spec") or {}).get("trigger"))


def _same_inputs(read: dict[str, Any], newer: dict[str, Any]) -> bool:
    """Whether `newer` is `read` but for metadata a pass does not decide on: the same
    generation, spec, status and deletion mark."""
    old_meta, new_meta = read["metadata"], newer["metadata"]
    return (
        old_meta.get("uid") == new_meta.get("uid")
        and old_meta.get("generation") == new_meta.get("generation")
        and old_meta.get("deletionTimestamp") == new_meta.get("deletionTimestamp")
        and read.get("spec") == newer.get("spec")
        and (read.get("status") or {}) == (newer.get("status") or {})
    )


def _sent_plan(storage: Storage) -> Plan | None:
    """The capture plan already in the capture's prefix (layout.PLAN), written by a pass that
    armed but whose status write was lost; None when there is none."""
    try:
        return Plan.model_validate_json(storage.get_text(layout.PLAN))
    except StorageNotFound:
        return None
    except ValueError:
        log.warning("%s/%s is not a plan; ignored", storage.uri, layout.PLAN)
        return None


def _worker_statuses(storage: Storage, plan_id: str | None) -> dict[int, WorkerStatus]:
    """Every worker's status.json of this plan (older plans' files are ignored). One GET per
    rank at every pass, through the storage's bulk read (S3: pipelined on kept-alive
    connections), or 10,000 ranks take most of a minute."""
    keys: list[str] = []
    ranks: list[int] = []
    for key in storage.list(f"{layout.WORKERS}/"):
        rank = layout.rank_of_worker_key(key)
        if rank is not None and key.endswith(f"/{layout.STATUS}"):
            keys.append(key)
            ranks.append(rank)
    found: dict[int, WorkerStatus] = {}
    for rank, key, data in zip(ranks, keys, storage.get_many(keys), strict=True):
        if isinstance(data, StorageNotFound):
            continue  # removed since the listing
        if isinstance(data, StorageError):
            raise data
        try:
            worker = WorkerStatus.model_validate_json(data)
        except ValueError:
            log.warning("%s/%s is not a worker status; ignored", storage.uri, key)
            continue
        if worker.plan_id in (None, plan_id):
            found[rank] = worker
    return found


OPERATOR_S3_RETRY_SECONDS = "5"


def _open_storage(uri: str) -> Storage:
    """Storage for the operator's own reads and writes. An S3 operation gives up after 5 s of
    transient failures (PERFDIAG_S3_RETRY_SECONDS overrides): the operator looks again at every
    recheck anyway, and one diagnosis' outage must not hold the recheck loop (sequential) for a
    minute; the condition StorageUnavailable then says so at once."""
    if uri.startswith("s3://"):
        from perfdiag.storage.s3 import (  # minio: only when S3 is used
            RETRY_SECONDS_VARIABLE,
            S3Storage,
        )

        env = dict(os.environ)
        env.setdefault(RETRY_SECONDS_VARIABLE, OPERATOR_S3_RETRY_SECONDS)
        return S3Storage.from_uri(uri, environ=env)
    return open_storage(uri)


def _stack_dumps(
    prefix: str, status: PerfDiagnosisStatus, pods: list[dict[str, Any]]
) -> frozenset[int]:
    """Ranks whose answer to our stacks plan is in storage (only once that plan was sent)."""
    plan_id = status.window.plan_id if status.window else None
    if plan_id is None:
        return frozenset()
    wanted = stacks_plan_id(plan_id)
    if not any(plan_of(pod)[0] == wanted for pod in pods):
        return frozenset()
    keys = _open_storage(f"{prefix}{STACKS_SUFFIX}").list(f"{layout.WORKERS}/")
    return frozenset(
        rank
        for key in keys
        if key.endswith(f"/{layout.STACKS}")
        and (rank := layout.rank_of_worker_key(key)) is not None
    )


def _collect_stacks(prefix: str) -> int:
    """Copy the stack dumps of the stacks plan into the capture, where the analyzer reads them
    (idempotent: same key, same bytes)."""
    source = _open_storage(f"{prefix}{STACKS_SUFFIX}")
    target = _open_storage(prefix)
    copied = 0
    for key in source.list(f"{layout.WORKERS}/"):
        if key.endswith(f"/{layout.STACKS}"):
            target.put_bytes(key, source.get_bytes(key))
            copied += 1
    return copied


def _storage_unavailable(
    status: PerfDiagnosisStatus, generation: int, now: datetime, error: str
) -> Decision:
    desired = [
        Desired(READY, "False", "StorageUnavailable", f"storage unavailable, retrying: {error}"),
        Desired(
            RECONCILING, "True", "StorageUnavailable", f"storage unavailable, retrying: {error}"
        ),
        Desired(STALLED, "False", "StorageUnavailable"),
    ]
    return Decision(
        status.model_copy(
            update={"conditions": merge_conditions(status.conditions, desired, generation, now)}
        )
    )


def _invalid_spec_status(
    old: PerfDiagnosisStatus | None, generation: int, now: datetime, exc: ValidationError
) -> PerfDiagnosisStatus:
    message = f"invalid spec: {validation_problems(exc)}"
    base = old if old is not None else PerfDiagnosisStatus()
    desired = [
        Desired(READY, "False", "InvalidSpec", message),
        Desired(RECONCILING, "False", "InvalidSpec"),
        Desired(STALLED, "True", "InvalidSpec", message),
    ]
    return base.model_copy(
        update={
            "observed_generation": generation,
            "start_time": base.start_time or now,
            "conditions": merge_conditions(base.conditions, desired, generation, now),
        }
    )
