"""The slim pods the operator keeps (perfdiag.operator.pods): every decision reads the same
from a slim pod as from the whole one (pure)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from perfdiag.api.plan import Plan
from perfdiag.operator.coordination import (
    capture_lead,
    expected_ranks,
    plan_annotations,
    plan_of,
    pods_to_disarm,
    reads_successor,
)
from perfdiag.operator.injection import (
    InjectionConfig,
    follows_plan_successors,
    follows_pod_plan,
    inject,
    injected,
)
from perfdiag.operator.pods import slim_pod
from perfdiag.operator.targets import is_live

CONFIG = InjectionConfig(image="perfdiag:1", storage="s3://b/p", storage_secret="creds")
PLAN = Plan(id="d-uid", steps=5, deadline=datetime.now(timezone.utc) + timedelta(hours=1))


def _listed_pod(nproc: str, *, phase: str = "Running", armed: bool = False) -> dict[str, Any]:
    """A pod as the apiserver lists it after this version's webhook injected it."""
    pod: dict[str, Any] = {
        "metadata": {
            "name": "bert-worker-0",
            "uid": "u-1",
            "labels": {"perfdiag.io/inject": "true", "training.kubeflow.org/job-name": "bert"},
            "annotations": {"other.io/note": "x" * 500},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {"x": 1}}}] * 20,
        },
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox"}],
            "containers": [
                {"name": "sidecar", "image": "envoy", "env": [{"name": "A", "value": "1"}]},
                {
                    "name": "pytorch",
                    "image": "t",
                    "env": [
                        {"name": "RANK", "value": "0"},
                        {"name": "PET_NPROC_PER_NODE", "value": nproc},
                    ],
                },
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}] * 5},
    }
    patch = inject(pod, CONFIG)
    assert patch is not None
    pod["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    pod["spec"].update(patch["spec"])
    if armed:
        pod["metadata"]["annotations"].update(
            plan_annotations(PLAN, "d")["metadata"]["annotations"]
        )
    return pod


@pytest.mark.parametrize(
    ("nproc", "phase", "armed"),
    [("8", "Running", True), ("auto", "Pending", False), ("2", "Succeeded", True)],
)
def test_a_slim_pod_decides_as_the_whole_pod(nproc: str, phase: str, armed: bool) -> None:
    whole = _listed_pod(nproc, phase=phase, armed=armed)
    slim = slim_pod(whole)
    for read in (injected, follows_pod_plan, follows_plan_successors, is_live, plan_of):
        assert read(slim) == read(whole), read.__name__
    assert expected_ranks([slim]) == expected_ranks([whole])
    assert capture_lead([slim], 10.0) == capture_lead([whole], 10.0)
    ids = frozenset({PLAN.id})
    assert pods_to_disarm([slim], "d", ids) == pods_to_disarm([whole], "d", ids)
    assert reads_successor(slim, PLAN.id) == reads_successor(whole, PLAN.id) == armed
    assert slim["metadata"]["uid"] == "u-1"
    assert len(json.dumps(slim)) * 3 < len(json.dumps(whole))


def test_a_pod_being_deleted_stays_marked() -> None:
    whole = _listed_pod("1")
    whole["metadata"]["deletionTimestamp"] = "2026-11-27T12:00:00Z"
    assert not is_live(slim_pod(whole))
