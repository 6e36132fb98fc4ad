"""The kopf operator against a real kube-apiserver (kopf.testing.KopfRunner, in-process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("operator_env")]

OWN_PREFIXES = ("perfdiag.io/", "kubectl.kubernetes.io/")


def _assert_own_bookkeeping(obj: dict[str, Any]) -> None:
    """kopf wrote nothing under its default prefix: ours only."""
    meta = obj["metadata"]
    for key in meta.get("annotations") or {}:
        assert key.startswith(OWN_PREFIXES), key
    for finalizer in meta.get("finalizers") or []:
        assert finalizer == "perfdiag.io/finalizer", finalizer


def test_missing_target_stalls_then_recovers(cluster: Any, kube_namespace: str) -> None:
    ns = kube_namespace
    with cluster.operator(ns):
        cluster.apply(ns, cluster.diagnosis("d", {"kind": "PyTorchJob", "name": "bert"}))
        stalled = cluster.wait_condition(ns, "d", "Stalled", "True", "TargetNotFound")
        assert stalled["message"].startswith("PyTorchJob bert not found")
        assert cluster.condition(ns, "d", "Reconciling")["status"] == "False"
        obj = cluster.get(ns, "d")
        assert obj["status"]["phase"] == "Pending"
        assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]

        # The job appears (no pods yet: the training-operator would create them).
        cluster.apply(ns, cluster.pytorchjob("bert"))
        cluster.wait_condition(ns, "d", "Reconciling", "True", "WaitingForPods")
        assert cluster.condition(ns, "d", "Stalled")["status"] == "False"

        cluster.create_pods(
            ns, cluster.pytorchjob_pod_labels("bert"), "bert-master-0", "bert-worker-0"
        )
        cluster.create_pods(ns, cluster.pytorchjob_pod_labels("other"), "other-worker-0")
        resolved = cluster.wait_condition(ns, "d", "TargetResolved", "True", "TargetFound")
        assert resolved["message"] == "PyTorchJob bert: 2 pods found"
        obj = cluster.get(ns, "d")
        assert obj["status"]["target"]["pods"] == 2
        # Found, but these pods were created without perfdiag: refused, saying how to opt in.
        stalled = cluster.wait_condition(ns, "d", "Stalled", "True", "NotInjected")
        assert 'perfdiag.io/inject: "true"' in stalled["message"]
        assert "bert-master-0, bert-worker-0" in stalled["message"]
        assert cluster.condition(ns, "d", "Reconciling")["status"] == "False"
        assert cluster.condition(ns, "d", "Ready")["status"] == "False"
        obj = cluster.get(ns, "d")
        assert obj["status"]["phase"] == "Pending"
        _assert_own_bookkeeping(obj)
        assert not obj["metadata"].get("finalizers")  # nothing to clean up yet
        cluster.wait_events(
            ns,
            "d",
            [
                ("Warning", "TargetNotFound"),
                ("Normal", "WaitingForPods"),
                ("Normal", "TargetFound"),
            ],
        )


def test_trainjob_and_pod_targets(cluster: Any, kube_namespace: str) -> None:
    ns = kube_namespace
    cluster.apply(
        ns,
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "llama"},
            "spec": {"runtimeRef": {"name": "torch-distributed"}},
        },
    )
    jobset = {"jobset.sigs.k8s.io/jobset-name": "llama"}
    cluster.create_pods(
        ns,
        {**jobset, "jobset.sigs.k8s.io/replicatedjob-name": "node"},
        "llama-node-0-0",
        "llama-node-0-1",
    )
    cluster.create_pods(
        ns,
        {**jobset, "jobset.sigs.k8s.io/replicatedjob-name": "dataset-initializer"},
        "llama-init-0",
    )
    cluster.create_pods(ns, {"app": "resnet", "role": "worker"}, "resnet-0", "resnet-1", "resnet-2")
    with cluster.operator(ns):
        cluster.apply(ns, cluster.diagnosis("tj", {"kind": "TrainJob", "name": "llama"}))
        selector = {
            "matchLabels": {"app": "resnet"},
            "matchExpressions": [{"key": "role", "operator": "In", "values": ["worker"]}],
        }
        cluster.apply(ns, cluster.diagnosis("sel", {"kind": "Pods", "selector": selector}))
        cluster.apply(ns, cluster.diagnosis("one", {"kind": "Pods", "name": "resnet-1"}))
        cluster.apply(
            ns,
            cluster.diagnosis(
                "none", {"kind": "Pods", "selector": {"matchLabels": {"app": "nothing"}}}
            ),
        )
        found = {
            name: cluster.wait_condition(ns, name, "TargetResolved", "True")["message"]
            for name in ("tj", "sel", "one")
        }
        assert found == {
            "tj": "TrainJob llama: 2 pods found",
            "sel": "pods matching 'app=resnet,role in (worker)': 3 pods found",
            "one": "pod resnet-1: 1 pod found",
        }
        assert (
            cluster.get(ns, "sel")["status"]["target"]["selector"] == "app=resnet,role in (worker)"
        )
        cluster.wait_condition(ns, "none", "Stalled", "True", "TargetNotFound")
        # Pods appearing later are found by the recheck loop.
        cluster.create_pods(ns, {"app": "nothing"}, "late-0")
        cluster.wait_condition(ns, "none", "TargetResolved", "True", "TargetFound")


def test_restart_resumes_without_repeating_work(cluster: Any, kube_namespace: str) -> None:
    ns = kube_namespace
    with cluster.operator(ns):
        cluster.apply(ns, cluster.diagnosis("r", {"kind": "PyTorchJob", "name": "late"}))
        first = cluster.wait_condition(ns, "r", "Stalled", "True", "TargetNotFound")
    # Operator gone mid-reconcile (waiting for its target); the target appears meanwhile.
    cluster.apply(ns, cluster.pytorchjob("late"))
    cluster.create_pods(ns, cluster.pytorchjob_pod_labels("late"), "late-worker-0")
    assert cluster.condition(ns, "r", "Stalled") == first  # nobody reconciles while it is down

    with cluster.operator(ns) as second_run:
        resolved = cluster.wait_condition(ns, "r", "TargetResolved", "True", "TargetFound")
        cluster.wait_events(ns, "r", [("Warning", "TargetNotFound"), ("Normal", "TargetFound")])
    assert "Handler 'on_resume' succeeded" in second_run.output

    # A third start with nothing changed writes nothing and announces nothing.
    before = cluster.get(ns, "r")
    with cluster.operator(ns) as third_run:
        cluster.apply(ns, cluster.diagnosis("probe", {"kind": "PyTorchJob", "name": "late"}))
        cluster.wait_condition(ns, "probe", "TargetResolved", "True")  # the operator is working
    assert f"[{ns}/r] Handler 'on_resume' succeeded" in third_run.output
    after = cluster.get(ns, "r")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert cluster.condition(ns, "r", "TargetResolved") == resolved
    assert cluster.events(ns, "r") == [("Normal", "TargetFound"), ("Warning", "TargetNotFound")]


def test_spec_update_is_observed(cluster: Any, kube_namespace: str) -> None:
    ns = kube_namespace
    with cluster.operator(ns):
        cluster.apply(ns, cluster.diagnosis("u", {"kind": "PyTorchJob", "name": "nope"}))
        cluster.wait_condition(ns, "u", "Stalled", "True")
        cluster.kubectl(
            "patch",
            "pdiag",
            "u",
            "-n",
            ns,
            "--type=merge",
            "-p",
            '{"spec": {"analysis": {"minRatio": 1.5}}}',
        )
        cluster.wait_for(
            lambda: (cluster.get(ns, "u")["status"].get("observedGeneration") == 2
                     and cluster.condition(ns, "u", "Stalled")["observedGeneration"] == 2),
            "observedGeneration 2",
        )  # fmt: skip
        conditions = cluster.get(ns, "u")["status"]["conditions"]
        assert {c["type"]: c["observedGeneration"] for c in conditions} == {
            "Ready": 2, "Reconciling": 2, "Stalled": 2, "TargetResolved": 2
        }  # fmt: skip


def test_deletion_never_needs_the_operator_when_nothing_to_clean(
    cluster: Any, kube_namespace: str
) -> None:
    ns = kube_namespace
    with cluster.operator(ns):
        cluster.apply(ns, cluster.diagnosis("gone", {"kind": "PyTorchJob", "name": "nope"}))
        cluster.wait_condition(ns, "gone", "Stalled", "True")
    assert not cluster.get(ns, "gone")["metadata"].get("finalizers")
    # The operator is gone for good: deleting still completes at once.
    cluster.kubectl("delete", "pdiag", "gone", "-n", ns, "--timeout=20s")
    assert cluster.get(ns, "gone") is None


def _start_capture(cluster: Any, ns: str, name: str, plan_id: str) -> None:
    """What the capture controller (next step) does: plan on the pods, phase Capturing."""
    status = {"status": {"phase": "Capturing", "window": {"planId": plan_id, "steps": 10}}}
    cluster.kubectl(
        "patch",
        "pdiag",
        name,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )


def _plans(cluster: Any, ns: str) -> dict[str, str | None]:
    pods = cluster.core.list_namespaced_pod(ns).items
    return {p.metadata.name: (p.metadata.annotations or {}).get("perfdiag.io/plan") for p in pods}


def test_finalizer_only_while_capturing_and_deletion_cleans_the_plan(
    cluster: Any, kube_namespace: str
) -> None:
    ns = kube_namespace
    cluster.apply(ns, cluster.pytorchjob("bert"))
    plan = json.dumps({"id": "plan-1", "action": "capture", "steps": 10})
    labels = cluster.pytorchjob_pod_labels("bert")
    cluster.create_pods(ns, labels, "bert-0", "bert-1")
    cluster.core.patch_namespaced_pod(
        "bert-0", ns, {"metadata": {"annotations": {"perfdiag.io/plan": plan}}}
    )
    cluster.core.patch_namespaced_pod(
        "bert-1",
        ns,
        {"metadata": {"annotations": {"perfdiag.io/plan": plan.replace("plan-1", "other")}}},
    )
    with cluster.operator(ns):
        cluster.apply(ns, cluster.diagnosis("cap", {"kind": "PyTorchJob", "name": "bert"}))
        cluster.wait_condition(ns, "cap", "TargetResolved", "True")
        assert not cluster.get(ns, "cap")["metadata"].get("finalizers")
        _start_capture(cluster, ns, "cap", "plan-1")
        obj = cluster.wait_for(
            lambda: (o := cluster.get(ns, "cap")) and o["metadata"].get("finalizers") and o,
            "finalizer",
        )
        assert obj["metadata"]["finalizers"] == ["perfdiag.io/finalizer"]
        _assert_own_bookkeeping(obj)
        assert cluster.get(ns, "cap")["status"]["phase"] == "Capturing"  # never moved back
        cluster.kubectl("delete", "pdiag", "cap", "-n", ns, "--timeout=30s")
        assert cluster.get(ns, "cap") is None
        # Only this diagnosis' plan was removed.
        assert _plans(cluster, ns) == {"bert-0": None, "bert-1": plan.replace("plan-1", "other")}

        # Capturing → Failed: nothing left to clean, the finalizer goes (Analyzing keeps it:
        # the analyzer Job runs then).
        cluster.apply(ns, cluster.diagnosis("cap2", {"kind": "PyTorchJob", "name": "bert"}))
        cluster.wait_condition(ns, "cap2", "TargetResolved", "True")
        _start_capture(cluster, ns, "cap2", "plan-2")
        cluster.wait_for(lambda: cluster.get(ns, "cap2")["metadata"].get("finalizers"), "finalizer")
        cluster.kubectl(
            "patch",
            "pdiag",
            "cap2",
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status": {"phase": "Failed"}}',
        )
        cluster.wait_for(
            lambda: not cluster.get(ns, "cap2")["metadata"].get("finalizers"), "no finalizer"
        )

        cluster.apply(ns, cluster.diagnosis("stuck", {"kind": "PyTorchJob", "name": "bert"}))
        cluster.wait_condition(ns, "stuck", "TargetResolved", "True")
        _start_capture(cluster, ns, "stuck", "plan-3")
        cluster.wait_for(
            lambda: cluster.get(ns, "stuck")["metadata"].get("finalizers"), "finalizer"
        )

    # The operator is gone for good while a capture runs: deletion waits for the finalizer...
    cluster.kubectl("delete", "pdiag", "stuck", "-n", ns, "--wait=false")
    assert cluster.get(ns, "stuck")["metadata"].get("deletionTimestamp")
    # ...until the documented recovery (docs/operator.md) removes it.
    cluster.kubectl(
        "patch",
        "pdiag",
        "stuck",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":null}}',
    )
    cluster.wait_for(lambda: cluster.get(ns, "stuck") is None, "deleted after the recovery patch")


def test_deleting_a_capture_of_one_named_pod_takes_its_plan_off(
    cluster: Any, kube_namespace: str
) -> None:
    """A target named directly (kind Pods, name) has no selector in the status: the cleanup
    finds the pod through the spec."""
    ns = kube_namespace
    cluster.create_pods(ns, {"app": "solo"}, "solo-0", "solo-1")
    plan = json.dumps({"id": "plan-solo", "action": "capture", "steps": 10})
    for pod in ("solo-0", "solo-1"):
        cluster.core.patch_namespaced_pod(
            pod, ns, {"metadata": {"annotations": {"perfdiag.io/plan": plan}}}
        )
    with cluster.operator(ns):
        cluster.apply(ns, cluster.diagnosis("one", {"kind": "Pods", "name": "solo-0"}))
        cluster.wait_condition(ns, "one", "TargetResolved", "True")
        assert cluster.get(ns, "one")["status"]["target"].get("selector") is None
        _start_capture(cluster, ns, "one", "plan-solo")
        cluster.wait_for(lambda: cluster.get(ns, "one")["metadata"].get("finalizers"), "finalizer")
        cluster.kubectl("delete", "pdiag", "one", "-n", ns, "--timeout=30s")
        assert cluster.get(ns, "one") is None
        # The named pod's plan is gone; the other pod (not the target) keeps its own.
        assert _plans(cluster, ns) == {"solo-0": None, "solo-1": plan}


def test_finished_target_fails_and_ttl_deletes(cluster: Any, kube_namespace: str) -> None:
    ns = kube_namespace
    cluster.apply(ns, cluster.pytorchjob("done"))
    finished = {
        "status": {
            "conditions": [{"type": "Succeeded", "status": "True", "reason": "JobSucceeded"}]
        }
    }
    cluster.kubectl(
        "patch",
        "pytorchjob",
        "done",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(finished),
    )
    with cluster.operator(ns):
        cluster.apply(
            ns,
            cluster.diagnosis(
                "late", {"kind": "PyTorchJob", "name": "done"}, ttlSecondsAfterFinished=3600
            ),
        )
        stalled = cluster.wait_condition(ns, "late", "Stalled", "True", "TargetFinished")
        assert "has already finished (Succeeded)" in stalled["message"]
        obj = cluster.get(ns, "late")
        assert obj["status"]["phase"] == "Failed"
        assert obj["status"]["completionTime"]
        assert cluster.condition(ns, "late", "Reconciling")["status"] == "False"
        # The TTL may change after creation; a shorter one deletes the finished diagnosis.
        cluster.kubectl(
            "patch", "pdiag", "late", "-n", ns, "--type=merge",
            "-p", '{"spec": {"ttlSecondsAfterFinished": 0}}',
        )  # fmt: skip
        cluster.wait_for(lambda: cluster.get(ns, "late") is None, "deletion after the TTL")


def test_perfdiag_operator_command(cluster: Any, kube_namespace: str) -> None:
    """`perfdiag operator` runs the same handlers and stops cleanly on SIGINT/SIGTERM."""
    ns = kube_namespace
    process = subprocess.Popen(
        [sys.executable, "-m", "perfdiag.cli", "operator", "--namespace", ns, "--recheck-seconds", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        cluster.apply(ns, cluster.diagnosis("cli", {"kind": "Pods", "name": "w-0"}))
        cluster.wait_condition(ns, "cli", "Stalled", "True", "TargetNotFound")
        cluster.create_pods(ns, {"app": "x"}, "w-0")
        cluster.wait_condition(ns, "cli", "TargetResolved", "True")
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert "perfdiag operator started; rechecking every 1s" in output
