"""Target resolution decisions (no cluster): selectors and the state of a target."""

from __future__ import annotations

from typing import Any

import pytest

from perfdiag.api.diagnosis import Target
from perfdiag.operator.targets import format_selector, observe, pod_selector


def _target(**fields: Any) -> Target:
    return Target.model_validate(fields)


def _pod(name: str, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def test_pod_selectors_of_each_kind() -> None:
    assert pod_selector(_target(kind="PyTorchJob", name="bert")) == (
        "training.kubeflow.org/job-name=bert,"
        "training.kubeflow.org/operator-name=pytorchjob-controller"
    )
    assert pod_selector(_target(kind="TrainJob", name="llama")) == (
        "jobset.sigs.k8s.io/jobset-name=llama,jobset.sigs.k8s.io/replicatedjob-name=node"
    )
    assert pod_selector(_target(kind="Pods", name="w-0")) is None
    selector = {
        "matchLabels": {"b": "2", "a": "1"},
        "matchExpressions": [
            {"key": "role", "operator": "In", "values": ["master", "worker"]},
            {"key": "zone", "operator": "NotIn", "values": ["x"]},
            {"key": "gpu", "operator": "Exists"},
            {"key": "debug", "operator": "DoesNotExist"},
        ],
    }
    assert pod_selector(_target(kind="Pods", selector=selector)) == (
        "a=1,b=2,role in (master,worker),zone notin (x),gpu,!debug"
    )
    assert format_selector({"y": "1", "x": "2"}) == "x=2,y=1"


def test_missing_job_and_missing_kind() -> None:
    target = _target(kind="PyTorchJob", name="bert")
    missing = observe(target, lookup="missing")
    assert (missing.state, missing.reason) == ("not_found", "TargetNotFound")
    assert missing.message == "PyTorchJob bert not found"
    no_crd = observe(target, lookup="kind_not_installed")
    assert no_crd.state == "not_found"
    assert "pytorchjobs.kubeflow.org/v1" in no_crd.message and "not installed" in no_crd.message


def test_job_without_pods_is_waiting_not_stalled() -> None:
    obs = observe(_target(kind="TrainJob", name="llama"), lookup="found", job={}, pods=[])
    assert (obs.state, obs.reason) == ("waiting_for_pods", "WaitingForPods")


def test_found_counts_live_pods_only() -> None:
    pods = [_pod("w-1"), _pod("w-0", "Pending"), _pod("old", "Succeeded"), _pod("x", deleting=True)]
    obs = observe(_target(kind="PyTorchJob", name="bert"), lookup="found", job={}, pods=pods)
    assert obs.state == "found"
    assert obs.pods == ("w-0", "w-1")
    assert obs.message == "PyTorchJob bert: 2 pods found"


@pytest.mark.parametrize(
    ("kind", "condition"),
    [("PyTorchJob", "Succeeded"), ("PyTorchJob", "Failed"), ("TrainJob", "Complete")],
)
def test_finished_job(kind: str, condition: str) -> None:
    job = {
        "status": {
            "conditions": [
                {"type": "Running", "status": "False"},
                {"type": condition, "status": "True"},
            ]
        }
    }
    obs = observe(_target(kind=kind, name="j"), lookup="found", job=job, pods=[_pod("w-0")])
    assert (obs.state, obs.reason) == ("finished", "TargetFinished")
    assert condition in obs.message


def test_running_job_condition_is_not_finished() -> None:
    job = {"status": {"conditions": [{"type": "Succeeded", "status": "False"}]}}
    obs = observe(_target(kind="PyTorchJob", name="j"), lookup="found", job=job, pods=[_pod("w")])
    assert obs.state == "found"


def test_pods_selector_matching_nothing_is_not_found() -> None:
    obs = observe(
        _target(kind="Pods", selector={"matchLabels": {"app": "x"}}), lookup="found", pods=[]
    )
    assert (obs.state, obs.reason) == ("not_found", "TargetNotFound")
    assert "app=x" in obs.message


def test_single_pod_by_name() -> None:
    target = _target(kind="Pods", name="w-0")
    assert observe(target, lookup="missing").state == "not_found"
    assert observe(target, lookup="found", pods=[_pod("w-0", "Failed")]).state == "finished"
    found = observe(target, lookup="found", pods=[_pod("w-0")])
    assert (found.state, found.pods, found.selector) == ("found", ("w-0",), None)
