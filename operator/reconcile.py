"""One reconcile pass over one PerfDiagnosis: read, decide (pure functions), write.

Level-triggered and idempotent: it reads the object fresh, computes the status from the object
and the world, and writes only a difference, with the resourceVersion it read as a
precondition. Two passes racing (a change handler and the recheck loop, or two operator
replicas) cannot both apply the same transition: the loser gets 409 Conflict and recomputes
from the winner's status, where the transition is already done. Events are posted after the
status write succeeded, so a transition is announced at most once (an operator killed between
the two loses the Event, never duplicates it); conditions are the record, Events the courtesy.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from perfdiag.api.diagnosis import TERMINAL_PHASES, PerfDiagnosisSpec, PerfDiagnosisStatus
from perfdiag.operator.kube import ApiException, Kube, status_of
from perfdiag.operator.settings import PLAN_ANNOTATION, OperatorConfig
from perfdiag.operator.status import (
    READY,
    RECONCILING,
    STALLED,
    Desired,
    Event,
    compute_status,
    merge_conditions,
    merge_patch,
    now_utc,
    transition_events,
    ttl_expired,
)

log = logging.getLogger("perfdiag.operator")

Outcome = Literal["gone", "unchanged", "updated", "deleted"]
MAX_CONFLICTS = 5


@dataclass
class Reconciler:
    """Serializes passes per object inside this process (conflicts handle the rest)."""

    kube: Kube
    config: OperatorConfig
    clock: Callable[[], datetime] = now_utc

    def __post_init__(self) -> None:
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def reconcile(self, namespace: str, name: str) -> Outcome:
        with self._lock(namespace, name):
            for _ in range(MAX_CONFLICTS):
                try:
                    return self._once(namespace, name)
                except ApiException as exc:
                    if status_of(exc) != 409:
                        raise
                    log.debug("%s/%s changed while reconciling; recomputing", namespace, name)
            raise RuntimeError(f"{namespace}/{name}: still conflicting after {MAX_CONFLICTS} tries")

    def _once(self, namespace: str, name: str) -> Outcome:
        obj = self.kube.get_diagnosis(namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return "gone"
        meta = obj["metadata"]
        generation = int(meta.get("generation", 1))
        raw_status: dict[str, Any] = obj.get("status") or {}
        old = PerfDiagnosisStatus.model_validate(raw_status) if raw_status else None
        now = self.clock()
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
                new = compute_status(
                    old,
                    generation=generation,
                    observation=self.kube.observe_target(namespace, spec.target),
                    now=now,
                    recheck_seconds=self.config.recheck_seconds,
                )
        # Diff the normalized forms: fields this version does not know are left alone.
        patch = merge_patch(old.to_wire() if old is not None else {}, new.to_wire())
        if not patch:
            return "unchanged"
        written = self.kube.patch_status(namespace, name, patch, meta["resourceVersion"])
        for event in transition_events(old, new):
            self._post(written, event)
        return "updated"

    def _post(self, obj: dict[str, Any], event: Event) -> None:
        try:
            self.kube.post_event(obj, event)
        except ApiException as exc:  # an Event is a courtesy; the status is already written
            log.warning("could not post event %s: %s", event.reason, exc)

    def cleanup(self, namespace: str, status: PerfDiagnosisStatus | None) -> int:
        """Remove this diagnosis' plan from its target pods (before it is deleted), so a capture
        that has not started yet never starts. Returns how many pods were changed."""
        plan_id = status.window.plan_id if status and status.window else None
        selector = status.target.selector if status and status.target else None
        if plan_id is None or selector is None:
            return 0
        changed = 0
        for pod in self.kube.list_pods(namespace, selector):
            annotations = pod["metadata"].get("annotations") or {}
            if _plan_id(annotations.get(PLAN_ANNOTATION)) == plan_id:
                patch = {"metadata": {"annotations": {PLAN_ANNOTATION: None}}}
                self.kube.patch_pod(namespace, pod["metadata"]["name"], patch)
                changed += 1
        return changed


def _plan_id(text: str | None) -> str | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    plan_id = value.get("id") if isinstance(value, dict) else None
    return plan_id if isinstance(plan_id, str) else None


def _invalid_spec_status(
    old: PerfDiagnosisStatus | None, generation: int, now: datetime, exc: ValidationError
) -> PerfDiagnosisStatus:
    message = "invalid spec: " + "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
    )
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
