"""A status write that meets a newer object (409 Conflict) on the real apiserver: the capture
plan already on the pods stays the one every pod has, with one start step (the reconciler in
this process, its storage a local folder, its clock advancing a second at every reading)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from perfdiag.api.diagnosis import GROUP, PLURAL, VERSION
from perfdiag.api.plan import Plan, pod_plan_key
from perfdiag.api.worker import WorkerStatus
from perfdiag.collector.pod_plan import PodPlanFollower
from perfdiag.operator import kube as kube_module
from perfdiag.operator.kube import MERGE_PATCH, Kube
from perfdiag.operator.reconcile import Reconciler
from perfdiag.operator.settings import PLAN_ANNOTATION, OperatorConfig
from perfdiag.storage import layout
from perfdiag.storage.local import LocalStorage

PODS = 6
LABELS = {"app": "conflicted"}
T0 = datetime(2026, 11, 27, 12, 0, 0, tzinfo=timezone.utc)


class Clock:
    """A second later at every reading: a pass recomputed after a conflict decides later."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


class ConflictingKube(Kube):
    """The real API, but the object is changed (`change`) right before the first status write
    that arms: that write then meets the apiserver's 409. Records the plans sent to the pods."""

    def __init__(self, api_client: Any, change: dict[str, Any]) -> None:
        super().__init__(api_client)
        self.change = change
        self.conflicts = 0
        self.sent: list[tuple[str, Plan]] = []

    def patch_status(
        self, namespace: str, name: str, status_patch: Mapping[str, Any], resource_version: str
    ) -> dict[str, Any]:
        if "window" in status_patch and self.conflicts == 0:
            self.conflicts += 1
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, self.change, _content_type=MERGE_PATCH
            )
        return super().patch_status(namespace, name, status_patch, resource_version)

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        raw = patch["metadata"]["annotations"].get(PLAN_ANNOTATION)
        if raw:
            self.sent.append((name, Plan.model_validate_json(raw)))
        super().patch_pod(namespace, name, patch)


def _injected_pod(name: str) -> dict[str, Any]:
    """A pod as this version's webhook leaves it (its agent reads the pod's plan object, and
    the watch plan's successor)."""
    return {
        "metadata": {
            "name": name,
            "labels": LABELS,
            "annotations": {"perfdiag.io/injected": "0.1.0"},
        },
        "spec": {
            "initContainers": [
                {
                    "name": "perfdiag-agent",
                    "image": "agent:none",
                    "env": [
                        {"name": "POD_UID"},
                        {"name": "PERFDIAG_PLAN_SUCCESSORS", "value": "1"},
                    ],
                }
            ],
            "containers": [
                {
                    "name": "pytorch",
                    "image": "pytorch:none",
                    "env": [{"name": "PET_NPROC_PER_NODE", "value": "1"}],
                }
            ],
        },
    }


@pytest.mark.cluster
@pytest.mark.parametrize(
    "change",
    [
        {"metadata": {"labels": {"touched": "yes"}}},  # metadata only (as kopf's own writes)
        {"spec": {"analysis": {"stuckAfterSeconds": 90}}},  # a new generation
    ],
    ids=["metadata", "spec"],
)
def test_a_conflict_never_sends_the_pods_another_start_step(
    cluster: Any,
    kube_namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: dict[str, Any],
) -> None:
    ns = kube_namespace
    root = tmp_path / "store"
    monkeypatch.setenv("PERFDIAG_STORAGE", str(root))
    monkeypatch.setattr(kube_module, "POD_PAGE", 4)  # the pods are listed in pages
    names = [f"w-{i}" for i in range(PODS)]
    for name in names:
        cluster.core.create_namespaced_pod(ns, _injected_pod(name))
    diagnosis = cluster.diagnosis(
        "d", {"kind": "Pods", "selector": {"matchLabels": LABELS}}, capture={"steps": 10}
    )
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, diagnosis)
    clock = Clock()
    kube = ConflictingKube(cluster.kube.api_client(), change)
    reconciler = Reconciler(kube, OperatorConfig.from_env(), clock=clock)

    assert reconciler.reconcile(ns, "d") == "updated"  # the watch plan: measuring the rate
    status = cluster.get(ns, "d")["status"]
    assert status["phase"] == "Watching"
    prefix = status["artifacts"]["prefix"]
    watching = LocalStorage(Path(f"{prefix}-watch"))
    for rank in range(PODS):
        report = WorkerStatus(
            rank=rank, plan_id=status["watch"]["planId"], phase="armed", step=1000,
            last_step_unix=clock.now.timestamp(), updated_unix=clock.now.timestamp(),
            mean_step_ms=100.0, mean_steps=10,
        )  # fmt: skip
        watching.put_text(layout.worker_key(rank, layout.STATUS), report.model_dump_json())

    assert reconciler.reconcile(ns, "d") == "updated"  # arms; its first status write: 409
    assert kube.conflicts == 1
    window = cluster.get(ns, "d")["status"]["window"]
    start = window["startStep"]
    assert start is not None
    capture = [(pod, plan) for pod, plan in kube.sent if plan.id == window["planId"]]
    # Every pod got the capture plan once, and that plan is the one the status says.
    assert sorted(pod for pod, _ in capture) == names
    assert {plan.start_step for _, plan in capture} == {start}
    on_pods = [
        Plan.model_validate_json(
            cluster.core.read_namespaced_pod(name, ns).metadata.annotations[PLAN_ANNOTATION]
        )
        for name in names
    ]
    assert {plan.start_step for plan in on_pods} == {start}
    stored = LocalStorage(root / ns)
    uids = [cluster.core.read_namespaced_pod(name, ns).metadata.uid for name in names]
    # What each pod's agent reads: the watch plan's successor, written once for every pod.
    read = [
        PodPlanFollower(stored, u, tmp_path, follow_successors=True).current_plan() for u in uids
    ]
    assert {Plan.model_validate_json(text or b"").start_step for text in read} == {start}
    assert {Plan.model_validate_json(stored.get_text(pod_plan_key(u))).action for u in uids} == {
        "watch"
    }
    sent = Plan.model_validate_json(LocalStorage(Path(prefix)).get_text(layout.PLAN))
    assert sent.start_step == start
