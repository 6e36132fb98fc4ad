"""The status of a PerfDiagnosis as pure functions of what the operator observed.

Conditions follow metav1.Condition and kstatus (what Flux and Argo CD read):
  Ready        True once the diagnosis succeeded (a verdict is in status).
  Reconciling  True while the operator is making progress or waiting for something that is
               expected to happen by itself (pods starting, workers capturing).
  Stalled      True when progress needs someone to act (the target does not exist, it finished
               before it could be diagnosed). Stalled and Reconciling are never both True.
  TargetResolved  (domain) whether the target's pods were found.
All four are always present, so `kubectl wait --for=condition=Stalled=false` works.
  ThresholdsApplied  (domain, once the analyzer Job was created) whether it was given the
               current spec.analysis: a capture is judged once, a later change is not applied.

Every pass judges the conditions again for the generation it handles, so each carries that
generation (observedGeneration), in Succeeded and Failed too.

A condition's lastTransitionTime only moves when its status changes, and a status computed
from an unchanged world equals the stored one: reconciling twice writes nothing the second time,
which is what makes a restarted operator resume without repeating work.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from perfdiag.api.diagnosis import (
    TERMINAL_PHASES,
    Condition,
    ConditionStatus,
    PerfDiagnosisSpec,
    PerfDiagnosisStatus,
    TargetStatus,
)
from perfdiag.operator.targets import TargetObservation

READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
TARGET_RESOLVED = "TargetResolved"
THRESHOLDS_APPLIED = "ThresholdsApplied"
OWN_CONDITIONS = frozenset({READY, RECONCILING, STALLED, TARGET_RESOLVED, THRESHOLDS_APPLIED})


@dataclass(frozen=True)
class Desired:
    """A condition as the operator wants it (without times and generation)."""

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the PerfDiagnosis."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def now_utc() -> datetime:
    """Now, to the second (what metav1.Time keeps)."""
    return datetime.now(timezone.utc).replace(microsecond=0)


def merge_conditions(
    current: Iterable[Condition], desired: Iterable[Desired], generation: int, now: datetime
) -> list[Condition]:
    """Set the desired conditions, keeping each one's lastTransitionTime while its status holds
    and keeping conditions this module does not own (written by other controllers) as they are.
    Order: the desired ones first, in the order given, then the others."""
    by_type = {c.type: c for c in current}
    out: list[Condition] = []
    wanted = list(desired)
    for want in wanted:
        old = by_type.get(want.type)
        since = old.last_transition_time if old is not None and old.status == want.status else now
        out.append(
            Condition(
                type=want.type,
                status=want.status,
                reason=want.reason,
                message=want.message,
                observed_generation=generation,
                last_transition_time=since,
            )
        )
    own = {w.type for w in wanted}
    out.extend(c for c in by_type.values() if c.type not in own)
    return out


def put_condition(
    current: Iterable[Condition], desired: Desired, generation: int, now: datetime
) -> list[Condition]:
    """`current` with `desired` set in the place of the condition of its type (appended when
    there is none), its lastTransitionTime kept while its status holds: a condition set by a
    later stage does not reorder the list (which would rewrite the object on every pass)."""
    conditions = list(current)
    condition = merge_conditions(conditions, [desired], generation, now)[0]
    at = next((i for i, c in enumerate(conditions) if c.type == desired.type), None)
    if at is None:
        return [*conditions, condition]
    conditions[at] = condition
    return conditions


def thresholds_applied(
    spec: PerfDiagnosisSpec, status: PerfDiagnosisStatus, generation: int, now: datetime
) -> PerfDiagnosisStatus:
    """The ThresholdsApplied condition, once the analyzer Job was created (status.analysis):
    True while spec.analysis is what the Job was given, False once it changed. Before the Job,
    a change of spec.analysis needs no condition: it applies (to the stuck rule of the capture
    under way and to the Job still to come)."""
    used = status.analysis
    if used is None:
        return status
    wanted = spec.analysis.to_wire()
    if wanted == used.thresholds:  # JSON numbers: 1 and 1.0 are the same threshold
        desired = Desired(
            THRESHOLDS_APPLIED,
            "True",
            "Applied",
            f"the analyzer Job was given spec.analysis of generation {used.generation}, "
            "unchanged since",
        )
    else:
        prefix = (status.artifacts.prefix if status.artifacts else None) or "<capture prefix>"
        desired = Desired(
            THRESHOLDS_APPLIED,
            "False",
            "ChangedAfterAnalysis",
            f"spec.analysis changed after the analyzer Job was created with generation "
            f"{used.generation}'s: a capture is judged once, so the change does not apply to "
            f"this one. Judge it again with `perfdiag analyze {prefix} --thresholds "
            f"'{json.dumps(wanted, sort_keys=True)}' --out DIR`, or create a new PerfDiagnosis",
        )
    return status.model_copy(
        update={"conditions": put_condition(status.conditions, desired, generation, now)}
    )


def at_generation(status: PerfDiagnosisStatus, generation: int) -> PerfDiagnosisStatus:
    """The status as the handling of `generation` leaves it: status.observedGeneration and each
    condition this operator owns carry that generation, in every phase. A pass judges every
    condition again (in Succeeded and Failed nothing that may still change in the spec changes
    them, and ThresholdsApplied says whether the verdict's thresholds are the current ones), so
    each holds for the generation handled; conditions of other writers are left as they are."""
    conditions = [
        c.model_copy(update={"observed_generation": generation})
        if c.type in OWN_CONDITIONS and c.observed_generation != generation
        else c
        for c in status.conditions
    ]
    return status.model_copy(update={"observed_generation": generation, "conditions": conditions})


def keep_transition_times(
    old: PerfDiagnosisStatus | None, new: PerfDiagnosisStatus
) -> PerfDiagnosisStatus:
    """`new` with each condition's lastTransitionTime taken from `old` where its status did not
    change. A reconcile computes the status in stages (target, then coordination), and a
    condition flipped by one stage and back by the next must not look like a transition: that
    would rewrite the object on every pass (and tell kstatus and Argo CD something changed)."""
    if old is None:
        return new
    before = {c.type: c for c in old.conditions}
    kept = []
    changed = False
    for condition in new.conditions:
        previous = before.get(condition.type)
        if (
            previous is not None
            and previous.status == condition.status
            and previous.last_transition_time != condition.last_transition_time
        ):
            condition = condition.model_copy(
                update={"last_transition_time": previous.last_transition_time}
            )
            changed = True
        kept.append(condition)
    return new.model_copy(update={"conditions": kept}) if changed else new


def _pending_conditions(obs: TargetObservation, recheck_seconds: float) -> list[Desired]:
    resolved = Desired(
        TARGET_RESOLVED, "True" if obs.state == "found" else "False", obs.reason, obs.message
    )
    if obs.state == "found":
        waiting = f"{obs.message}; waiting for the capture to start"
        return [
            Desired(READY, "False", "WaitingForCapture", waiting),
            Desired(RECONCILING, "True", "WaitingForCapture", waiting),
            Desired(STALLED, "False", obs.reason),
            resolved,
        ]
    if obs.state == "waiting_for_pods":
        return [
            Desired(READY, "False", obs.reason, obs.message),
            Desired(RECONCILING, "True", obs.reason, obs.message),
            Desired(STALLED, "False", obs.reason),
            resolved,
        ]
    if obs.state == "not_found":
        stalled = f"{obs.message}; checked again every {recheck_seconds:g}s"
        return [
            Desired(READY, "False", obs.reason, obs.message),
            Desired(RECONCILING, "False", obs.reason),
            Desired(STALLED, "True", obs.reason, stalled),
            resolved,
        ]
    # finished: nothing left to diagnose, ever
    return [
        Desired(READY, "False", obs.reason, obs.message),
        Desired(RECONCILING, "False", obs.reason),
        Desired(STALLED, "True", obs.reason, obs.message),
        resolved,
    ]


def compute_status(
    current: PerfDiagnosisStatus | None,
    *,
    generation: int,
    observation: TargetObservation,
    now: datetime,
    recheck_seconds: float,
) -> PerfDiagnosisStatus:
    """The status after observing the target. Never moves the phase backwards."""
    old = current if current is not None else PerfDiagnosisStatus()
    if old.phase in TERMINAL_PHASES:
        return old.model_copy(update={"observed_generation": generation})
    target = TargetStatus(selector=observation.selector, pods=len(observation.pods))
    update: dict[str, Any] = {
        "observed_generation": generation,
        "target": target,
        "start_time": old.start_time or now,
    }
    if old.phase == "Pending":
        desired = _pending_conditions(observation, recheck_seconds)
        if observation.state == "finished":
            update["phase"] = "Failed"
            update["completion_time"] = now
    else:
        # Watching/Capturing/Analyzing: the capture controller owns Ready/Reconciling/Stalled.
        desired = [
            d
            for d in _pending_conditions(observation, recheck_seconds)
            if d.type == TARGET_RESOLVED
        ]
    update["conditions"] = merge_conditions(old.conditions, desired, generation, now)
    return old.model_copy(update=update)


def transition_events(old: PerfDiagnosisStatus | None, new: PerfDiagnosisStatus) -> list[Event]:
    """Events for what changed: the target's resolution and the phase."""
    events: list[Event] = []
    before = old.condition(TARGET_RESOLVED) if old is not None else None
    after = new.condition(TARGET_RESOLVED)
    if after is not None and (
        before is None or (before.status, before.reason) != (after.status, after.reason)
    ):
        bad = after.reason in ("TargetNotFound", "TargetFinished")
        events.append(Event("Warning" if bad else "Normal", after.reason, after.message))
    old_phase = old.phase if old is not None else None
    if old_phase is not None and new.phase != old_phase:
        events.append(Event("Normal", new.phase, f"phase {old_phase} → {new.phase}"))
    return events


def needs_recheck(status: PerfDiagnosisStatus | None, spec: PerfDiagnosisSpec | None) -> bool:
    """Whether the operator must look at this diagnosis again by itself (not only on changes):
    every unfinished one (the target may appear, vanish or finish), and finished ones that have
    a TTL to enforce."""
    if status is None or status.phase not in TERMINAL_PHASES:
        return True
    return spec is not None and spec.ttl_seconds_after_finished is not None


def ttl_expired(spec: PerfDiagnosisSpec, status: PerfDiagnosisStatus | None, now: datetime) -> bool:
    if status is None or status.phase not in TERMINAL_PHASES:
        return False
    if spec.ttl_seconds_after_finished is None or status.completion_time is None:
        return False
    return now >= status.completion_time + timedelta(seconds=spec.ttl_seconds_after_finished)


def needs_cleanup(status: PerfDiagnosisStatus | None) -> bool:
    """Whether deleting the diagnosis leaves something behind to clean up, so the finalizer is
    needed: while watching or capturing (the plan annotation sits on the target pods) and
    analyzing (the analyzer Job runs; the garbage collector would delete it through its
    ownerReference, the operator stops it at once). Storage is kept on purpose."""
    return status is not None and status.phase in ("Watching", "Capturing", "Analyzing")


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) turning `old` into `new`; empty when they are equal."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif key not in old or before != value:
            patch[key] = value
    return patch
