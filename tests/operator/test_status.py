"""Status and conditions as pure functions (no cluster)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfdiag.api.diagnosis import Condition, PerfDiagnosisSpec, PerfDiagnosisStatus
from perfdiag.operator.status import (
    STALLED,
    THRESHOLDS_APPLIED,
    Desired,
    at_generation,
    compute_status,
    keep_transition_times,
    merge_patch,
    needs_cleanup,
    needs_recheck,
    put_condition,
    thresholds_applied,
    transition_events,
    ttl_expired,
)
from perfdiag.operator.targets import TargetObservation

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
NOT_FOUND = TargetObservation("not_found", "TargetNotFound", "PyTorchJob bert not found", "sel")
FOUND = TargetObservation(
    "found", "TargetFound", "PyTorchJob bert: 2 pods found", "sel", ("a", "b")
)
WAITING = TargetObservation("waiting_for_pods", "WaitingForPods", "no pods yet", "sel")
FINISHED = TargetObservation("finished", "TargetFinished", "PyTorchJob bert has finished", "sel")


def _compute(
    old: PerfDiagnosisStatus | None, obs: TargetObservation, now: datetime = T0, generation: int = 1
) -> PerfDiagnosisStatus:
    return compute_status(old, generation=generation, observation=obs, now=now, recheck_seconds=15)


def _conditions(status: PerfDiagnosisStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_missing_target_is_stalled_not_reconciling() -> None:
    status = _compute(None, NOT_FOUND)
    assert status.phase == "Pending"
    assert status.observed_generation == 1
    assert _conditions(status) == {
        "Ready": ("False", "TargetNotFound"),
        "Reconciling": ("False", "TargetNotFound"),
        "Stalled": ("True", "TargetNotFound"),
        "TargetResolved": ("False", "TargetNotFound"),
    }
    stalled = status.condition("Stalled")
    assert stalled is not None and "checked again every 15s" in stalled.message
    assert all(
        c.observed_generation == 1 and c.last_transition_time == T0 for c in status.conditions
    )


def test_found_target_is_reconciling() -> None:
    status = _compute(None, FOUND)
    assert _conditions(status) == {
        "Ready": ("False", "WaitingForCapture"),
        "Reconciling": ("True", "WaitingForCapture"),
        "Stalled": ("False", "TargetFound"),
        "TargetResolved": ("True", "TargetFound"),
    }
    assert status.target is not None and status.target.pods == 2 and status.target.selector == "sel"


def test_waiting_for_pods_is_reconciling() -> None:
    assert _conditions(_compute(None, WAITING))["Reconciling"] == ("True", "WaitingForPods")
    assert _conditions(_compute(None, WAITING))["Stalled"] == ("False", "WaitingForPods")


def test_finished_target_fails_for_good() -> None:
    status = _compute(None, FINISHED)
    assert status.phase == "Failed" and status.completion_time == T0
    assert _conditions(status)["Stalled"] == ("True", "TargetFinished")
    # Terminal: a later observation changes nothing but observedGeneration.
    later = _compute(status, FOUND, now=T0 + timedelta(minutes=5), generation=2)
    assert later.model_copy(update={"observed_generation": 1}) == status
    assert later.observed_generation == 2


def test_recovery_moves_transition_times_only_for_changed_conditions() -> None:
    stalled = _compute(None, NOT_FOUND)
    later = T0 + timedelta(minutes=1)
    recovered = _compute(stalled, FOUND, now=later)
    times = {c.type: c.last_transition_time for c in recovered.conditions}
    assert times == {"Ready": T0, "Reconciling": later, "Stalled": later, "TargetResolved": later}
    assert recovered.start_time == T0


def test_a_condition_flipped_and_back_within_one_reconcile_keeps_its_time() -> None:
    """The reconciler's stages (target, then coordination, e.g. NotInjected) may flip Stalled
    and set it back: the stored status must not change when nothing did."""
    from perfdiag.operator.status import merge_conditions

    not_injected = [Desired(STALLED, "True", "NotInjected", "pods lack the hook")]
    stored = _compute(None, FOUND)
    stored = stored.model_copy(
        update={"conditions": merge_conditions(stored.conditions, not_injected, 1, T0)}
    )
    later = T0 + timedelta(minutes=5)
    staged = _compute(stored, FOUND, now=later)  # the target stage: Stalled False at `later`
    final = staged.model_copy(
        update={"conditions": merge_conditions(staged.conditions, not_injected, 1, later)}
    )
    assert {c.last_transition_time for c in final.conditions if c.type == STALLED} == {later}
    kept = keep_transition_times(stored, final)
    assert kept == stored
    assert merge_patch(stored.to_wire(), kept.to_wire()) == {}
    # A real transition keeps its new time.
    recovered = _compute(stored, FOUND, now=later)
    assert keep_transition_times(stored, recovered) == recovered


def test_same_world_same_status() -> None:
    """Reconciling again with nothing changed produces an identical status: nothing to write."""
    first = _compute(None, NOT_FOUND)
    again = _compute(first, NOT_FOUND, now=T0 + timedelta(hours=1))
    assert again == first
    assert merge_patch(first.to_wire(), again.to_wire()) == {}
    assert transition_events(first, again) == []


def test_events_on_transitions_only() -> None:
    stalled = _compute(None, NOT_FOUND)
    assert [(e.type, e.reason) for e in transition_events(None, stalled)] == [
        ("Warning", "TargetNotFound")
    ]
    found = _compute(stalled, FOUND)
    assert [(e.type, e.reason) for e in transition_events(stalled, found)] == [
        ("Normal", "TargetFound")
    ]
    failed = _compute(found, FINISHED)
    assert [(e.type, e.reason) for e in transition_events(found, failed)] == [
        ("Warning", "TargetFinished"),
        ("Normal", "Failed"),
    ]


def test_later_phases_are_not_moved_back() -> None:
    capturing = PerfDiagnosisStatus.model_validate(
        {"phase": "Capturing", "conditions": [
            {"type": "Reconciling", "status": "True", "reason": "Capturing", "lastTransitionTime": "2026-01-01T11:00:00Z"}
        ]}
    )  # fmt: skip
    status = _compute(capturing, NOT_FOUND)
    assert status.phase == "Capturing"
    conditions = _conditions(status)
    assert conditions["Reconciling"] == ("True", "Capturing")  # owned by the capture controller
    assert conditions["TargetResolved"] == ("False", "TargetNotFound")
    assert "Stalled" not in conditions


def test_recheck_cleanup_and_ttl() -> None:
    spec = PerfDiagnosisSpec.model_validate({"target": {"kind": "PyTorchJob", "name": "b"}})
    ttl_spec = spec.model_copy(update={"ttl_seconds_after_finished": 60})
    pending = _compute(None, FOUND)
    failed = _compute(None, FINISHED)
    assert needs_recheck(None, spec) and needs_recheck(pending, spec)
    assert not needs_recheck(failed, spec) and needs_recheck(failed, ttl_spec)
    assert not ttl_expired(ttl_spec, failed, T0 + timedelta(seconds=59))
    assert ttl_expired(ttl_spec, failed, T0 + timedelta(seconds=60))
    assert not ttl_expired(spec, failed, T0 + timedelta(days=9))
    assert not ttl_expired(ttl_spec, pending, T0 + timedelta(days=9))
    assert not needs_cleanup(None) and not needs_cleanup(pending)
    assert needs_cleanup(pending.model_copy(update={"phase": "Capturing"}))
    assert needs_cleanup(pending.model_copy(update={"phase": "Analyzing"}))  # the Job runs


def _apply(doc: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _apply(out[key], value)
        else:
            out[key] = value
    return out


_leaf = st.one_of(
    st.integers(0, 3), st.sampled_from(["x", "y"]), st.lists(st.integers(0, 2), max_size=2)
)
_json = st.recursive(
    _leaf, lambda c: st.dictionaries(st.sampled_from("abcd"), c, max_size=3), max_leaves=8
)
_docs = st.dictionaries(st.sampled_from("abcdef"), _json, max_size=4)


# The machine is shared with other test runs: no timing-based health checks.
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=200)
@given(_docs, _docs)
def test_merge_patch_turns_old_into_new(old: dict[str, Any], new: dict[str, Any]) -> None:
    patch = merge_patch(old, new)
    assert _apply(old, patch) == new
    assert (patch == {}) == (old == new)


# ---- generations -----------------------------------------------------------------------------


def test_every_condition_carries_the_generation_handled() -> None:
    """A pass judges every condition again for the generation it handles, in a final phase
    too; another writer's condition keeps its own."""
    failed = _compute(None, FINISHED)
    foreign = Condition(
        type="Audited", status="True", reason="Seen", observed_generation=1,
        last_transition_time=T0,
    )  # fmt: skip
    stored = failed.model_copy(update={"conditions": [*failed.conditions, foreign]})
    later = at_generation(_compute(stored, FOUND, generation=2), 2)
    assert later.observed_generation == 2
    assert {c.type: c.observed_generation for c in later.conditions} == {
        "Ready": 2, "Reconciling": 2, "Stalled": 2, "TargetResolved": 2, "Audited": 1,
    }  # fmt: skip
    # Nothing but the generation changed: same statuses, same transition times.
    assert _conditions(later) == _conditions(stored)
    assert [c.last_transition_time for c in later.conditions] == [
        c.last_transition_time for c in stored.conditions
    ]
    assert at_generation(later, 2) == later  # handled again: nothing to write


def _judged(thresholds: dict[str, Any], generation: int = 1) -> PerfDiagnosisStatus:
    return PerfDiagnosisStatus.model_validate(
        {
            "phase": "Succeeded",
            "analysis": {"generation": generation, "thresholds": thresholds},
            "artifacts": {"prefix": "s3://b/p/ns/d-uid"},
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "VerdictReady",
                 "lastTransitionTime": "2026-01-01T11:00:00Z", "observedGeneration": generation},
            ],
        }
    )  # fmt: skip


def test_thresholds_applied_says_whether_the_verdict_used_the_current_analysis() -> None:
    spec = PerfDiagnosisSpec.model_validate(
        {"target": {"kind": "PyTorchJob", "name": "b"}, "analysis": {"reportSeverity": 0.2}}
    )
    # Before the analyzer Job exists, a change of spec.analysis applies: no condition.
    assert thresholds_applied(spec, PerfDiagnosisStatus(phase="Capturing"), 2, T0).conditions == []

    same = thresholds_applied(spec, _judged({"reportSeverity": 0.2}), 2, T0)
    applied = same.condition(THRESHOLDS_APPLIED)
    assert applied is not None and (applied.status, applied.reason) == ("True", "Applied")
    assert "generation 1, unchanged since" in applied.message
    assert [c.type for c in same.conditions] == ["Ready", THRESHOLDS_APPLIED]  # appended

    changed = thresholds_applied(spec, _judged({"reportSeverity": 0.05}), 2, T0 + timedelta(1))
    stale = changed.condition(THRESHOLDS_APPLIED)
    assert stale is not None and (stale.status, stale.reason) == ("False", "ChangedAfterAnalysis")
    assert stale.observed_generation == 2
    assert "perfdiag analyze s3://b/p/ns/d-uid --thresholds '{\"reportSeverity\": 0.2}'" in (
        stale.message
    )
    assert changed.condition("Ready") == _judged({}).condition("Ready")  # the verdict stays
    # JSON numbers: a threshold read back as 1 is the 1.0 the spec holds.
    whole = spec.model_copy(
        update={"analysis": spec.analysis.model_copy(update={"report_severity": 1.0})}
    )
    again = thresholds_applied(whole, _judged({"reportSeverity": 1}), 2, T0)
    assert again.condition(THRESHOLDS_APPLIED).status == "True"  # type: ignore[union-attr]


def test_put_condition_keeps_the_order_and_the_transition_time() -> None:
    stored = _compute(None, NOT_FOUND)
    order = [c.type for c in stored.conditions]
    same = put_condition(stored.conditions, Desired(STALLED, "True", "TargetNotFound", "m"), 2,
                         T0 + timedelta(hours=1))  # fmt: skip
    assert [c.type for c in same] == order
    moved = next(c for c in same if c.type == STALLED)
    assert moved.last_transition_time == T0 and moved.observed_generation == 2
