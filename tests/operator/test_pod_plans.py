"""The pods' plan objects in storage, as the reconciler writes and removes them around the plan
annotations (no cluster: a Kube that records its calls, a local folder as storage)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast, get_args

import pytest

from perfdiag.api.plan import Plan, plan_successor_key, pod_plan_key
from perfdiag.operator.coordination import Action, plan_annotations, watch_plan_id
from perfdiag.operator.injection import AGENT_CONTAINER
from perfdiag.operator.kube import Kube
from perfdiag.operator.reconcile import ACTION_HANDLERS, PodPlansRemain, Reconciler
from perfdiag.operator.settings import OperatorConfig
from perfdiag.storage.local import LocalStorage

UID = "0f2d6c1e-1111-2222-3333-444455556666"
PLAN = Plan(id=f"d-{UID}", steps=5, deadline=datetime.now(timezone.utc) + timedelta(hours=1))
WATCH = Plan(id=watch_plan_id(PLAN.id), action="watch", steps=5, deadline=PLAN.deadline)


class RecordingKube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.patches.append((name, patch))


def _pods(annotated: bool = False) -> list[dict[str, Any]]:
    notes = plan_annotations(PLAN, "d")["metadata"]["annotations"] if annotated else {}
    return [
        {"metadata": {"name": f"p{i}", "uid": f"uid-{i}", "annotations": dict(notes)}}
        for i in range(3)
    ]


def _reconciler(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Reconciler, RecordingKube]:
    monkeypatch.setenv("PERFDIAG_STORAGE", str(root))
    kube = RecordingKube()
    return Reconciler(cast(Kube, kube), OperatorConfig()), kube


def test_the_plan_goes_to_storage_first_then_on_the_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reconciler, kube = _reconciler(tmp_path / "store", monkeypatch)
    assert reconciler._send_plan("ns", "d", PLAN, _pods()) is None
    stored = LocalStorage(tmp_path / "store" / "ns")
    assert [stored.get_text(pod_plan_key(f"uid-{i}")) for i in range(3)] == [PLAN.to_json()] * 3
    assert sorted(name for name, _ in kube.patches) == ["p0", "p1", "p2"]
    # The ending: the objects go, then the annotations.
    assert reconciler._disarm("ns", "d", UID, None, _pods(annotated=True)) == 3
    assert not stored.exists(pod_plan_key("uid-0"))
    assert stored.list("pod-plans/") == []


def _watching_pods(successors: list[bool]) -> list[dict[str, Any]]:
    """Pods holding the watch plan of PLAN's diagnosis; `successors[i]`: whether pod i's agent
    follows the watch plan's successor (else it was injected by an earlier perfdiag)."""
    notes = plan_annotations(WATCH, "d")["metadata"]["annotations"]
    env = [{"name": "POD_UID"}]
    return [
        {
            "metadata": {"name": f"p{i}", "uid": f"uid-{i}", "annotations": dict(notes)},
            "spec": {
                "initContainers": [
                    {
                        "name": AGENT_CONTAINER,
                        "env": env + ([{"name": "PERFDIAG_PLAN_SUCCESSORS"}] if follows else []),
                    }
                ]
            },
        }
        for i, follows in enumerate(successors)
    ]


def test_a_capture_reaches_the_watching_pods_by_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture that ends a watch is written once, as the watch plan's successor, for every
    pod whose agent follows successors; a pod injected by an earlier perfdiag gets an object of
    its own. Every pod's annotation changes. The ending removes the successor too."""
    reconciler, kube = _reconciler(tmp_path / "store", monkeypatch)
    stored = LocalStorage(tmp_path / "store" / "ns")
    watch_id = WATCH.id
    for i in range(3):
        stored.put_text(pod_plan_key(f"uid-{i}"), WATCH.to_json())
    pods = _watching_pods([True, True, False])
    assert reconciler._send_plan("ns", "d", PLAN, pods, replacing=watch_id) is None
    assert stored.get_text(plan_successor_key(watch_id)) == PLAN.to_json()
    objects = [stored.get_text(pod_plan_key(f"uid-{i}")) for i in range(3)]
    assert objects == [WATCH.to_json(), WATCH.to_json(), PLAN.to_json()]
    assert sorted(name for name, _ in kube.patches) == ["p0", "p1", "p2"]
    # The ending: the pods' objects, then the successor, then the annotations.
    armed = _watching_pods([True, True, False])
    for pod in armed:
        pod["metadata"]["annotations"] = plan_annotations(PLAN, "d")["metadata"]["annotations"]
    assert reconciler._disarm("ns", "d", UID, None, armed) == 3
    assert stored.list("pod-plans/") == [] and stored.list("plan-successors/") == []


def test_a_watch_plan_is_sent_to_each_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a capture that ends a watch goes through a successor: the watch plan itself (and a
    stacks plan) is each pod's own object."""
    reconciler, _ = _reconciler(tmp_path / "store", monkeypatch)
    plan = WATCH
    assert reconciler._send_plan("ns", "d", plan, _pods()) is None
    stored = LocalStorage(tmp_path / "store" / "ns")
    assert [stored.get_text(pod_plan_key(f"uid-{i}")) for i in range(3)] == [plan.to_json()] * 3
    assert stored.list("plan-successors/") == []


def test_no_annotation_while_storage_cannot_take_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent reads the object and its fresh copy hides the kubelet's file: an annotation
    newer than the object would never reach that pod's hooks."""
    blocked = tmp_path / "store"
    blocked.mkdir()
    (blocked / "ns").write_text("a file where the namespace's folder should be")
    reconciler, kube = _reconciler(blocked, monkeypatch)
    error = reconciler._send_plan("ns", "d", PLAN, _pods())
    assert error is not None and kube.patches == []
    # An ending waits for storage (the pass is retried); a deletion goes on without it.
    with pytest.raises(PodPlansRemain):
        reconciler._disarm("ns", "d", UID, None, _pods(annotated=True))
    assert kube.patches == []
    assert reconciler._disarm("ns", "d", UID, None, _pods(annotated=True), best_effort=True) == 3
    assert len(kube.patches) == 3


def test_every_action_a_decision_can_list_has_a_handler() -> None:
    assert set(ACTION_HANDLERS) == set(get_args(Action))
