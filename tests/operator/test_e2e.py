"""The product as users meet it, end to end on the real control plane: the Kubeflow example
PyTorchJob opted in, pods injected by the webhook (the apiserver calls it), `kubectl apply` of
a PerfDiagnosis, the plan reaching the hooks through the agents (which read it from storage)
or the downward-API file, the agents uploading to MinIO, the analyzer Job, the verdict in
status and in `kubectl get pdiag`.

The first test runs perfdiag's containers (the init container's hook copy, the agent sidecar,
the analyzer Job) from the image built from the Dockerfile, as its user 10001 in its own files;
the others run them from the development venv."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from perfdiag.collector.hook import spool
from perfdiag.storage import open_storage
from perfdiag_testing.fault_suite import FAULT_JOB
from tests.operator import monitoring_checks
from tests.operator.e2e_support import (
    FAULT_RANK,
    apply_diagnosis,
    logs_on_failure,
    running_training,
    serving_operator,
    storage_secret,
    wait_phase,
    wait_ready,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.usefixtures("e2e_env")]

CAPTURE_STEPS = 10
CAPTURE = {"steps": CAPTURE_STEPS, "timeoutSeconds": 240}
APPLY_TO_VERDICT_S = 60.0
"""The goal for `kubectl apply` → Ready=True on a job already running (docs/operator.md, "How
the plan reaches the ranks")."""
KUBELET_RESYNC_S = 600.0
"""The time-to-verdict test's kubelet refreshes the downward-API files only at a periodic
resync that comes after the test (a real kubelet's is 60–90 s, when its event-driven remount
missed the update): only the agents' reading of the pods' plans in storage can bring the plan
to the hooks, so the time measured is that path's, with the operator's default lead."""


def test_kubectl_apply_to_verdict(
    cluster: Any,
    kube_namespace: str,
    minio_server: Any,
    tmp_path: Path,
    perfdiag_image: Any,
    prometheus_server: Any,
) -> None:
    ns = kube_namespace
    storage_secret(cluster, ns, minio_server)
    with (
        serving_operator(cluster, ns),
        running_training(
            cluster, ns, tmp_path, perfdiag_image=perfdiag_image,
            downward_api_resync_s=KUBELET_RESYNC_S,
        ) as training,
    ):  # fmt: skip
        for pod in training.pods:  # the webhook injected every pod of the job
            spec = cluster.core.read_namespaced_pod(pod, ns).spec
            assert [c.name for c in spec.init_containers] == ["perfdiag-hook", "perfdiag-agent"]

        started = time.monotonic()
        apply_diagnosis(cluster, ns, "why-slow", training.name, capture=CAPTURE)
        with logs_on_failure(training):
            obj = wait_ready(cluster, ns, "why-slow")
        elapsed = time.monotonic() - started
        # The kubelet never refreshed the plan files: the plan came through the agents.
        plan_files = {pod: training.plan_file_of(pod).read_text() for pod in training.pods}
        ran_from_image = _ran_from_image(training, perfdiag_image)
        plan_id = obj["status"]["window"]["planId"]
        left = cluster.wait_for(
            lambda: _all_uploaded(training, plan_id), "the agents to empty the spools", timeout=30
        )
        table = cluster.kubectl("get", "pdiag", "-n", ns).stdout
        wide = cluster.kubectl("get", "pdiag", "why-slow", "-n", ns, "-o", "wide").stdout
        events = cluster.events(ns, "why-slow")
        # What the suite's Prometheus scraped from the operator meanwhile (the chart's
        # ServiceMonitor and alerting rules): read while the operator still runs.
        scraped = monitoring_checks.collect(
            prometheus_server, ns, "why-slow", trigger=False, outcome="degraded",
            alerts=("PerfdiagVerdictDegraded",),
        )  # fmt: skip

    # (printed here: the in-process operator's runner captures stdout while it runs)
    print(f"\ntime to verdict (kubectl apply → Ready=True): {elapsed:.1f} s "
          f"for a {CAPTURE_STEPS}-step window", flush=True)  # fmt: skip
    status = obj["status"]
    verdict = status["verdict"]
    assert status["phase"] == "Succeeded"
    assert elapsed < APPLY_TO_VERDICT_S, f"time to verdict {elapsed:.1f} s"
    assert plan_files == {pod: "" for pod in training.pods}, plan_files
    assert verdict["status"] == "degraded", verdict
    assert FAULT_RANK in verdict["culpritRanks"], verdict
    assert verdict["topFindings"][0]["ranks"] == [FAULT_RANK], verdict
    # Ranks 2 and 3 run in the worker pod (node rank 1, two processes per node).
    # (other ranks may be named too on a loaded host: the fault suite measures accuracy)
    assert f"{training.name}-worker-0" in verdict["culpritPods"], verdict
    assert status["workers"] == {
        "expected": 4, "captured": 4, "missing": 0, "reporting": 4, "failed": [], "stuck": []
    }  # fmt: skip
    # The artifacts are where status says.
    artifacts = status["artifacts"]
    prefix = artifacts["prefix"]
    assert prefix.startswith(f"s3://{minio_server.bucket}/perfdiag/{ns}/why-slow-")
    stored = json.loads(open_storage(prefix).get_text("verdict.json"))
    assert stored["status"] == "degraded"
    assert artifacts["verdict"] == f"{prefix}/verdict.json"
    # The plan is gone from the pods once the capture ended.
    for pod in training.pods:
        annotations = cluster.core.read_namespaced_pod(pod, ns).metadata.annotations or {}
        assert "perfdiag.io/plan" not in annotations
    # kubectl get pdiag: NAME TARGET PHASE VERDICT READY AGE.
    header, row = table.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "TARGET", "PHASE", "VERDICT", "READY"], table
    assert row.split()[:5] == ["why-slow", training.name, "Succeeded", "degraded", "True"], table
    assert "degraded" in wide
    reasons = {reason for _, reason in events}
    assert {
        "MeasuringStepRate", "PlanSent", "CaptureEnded", "AnalyzerStarted", "VerdictReady"
    } <= reasons, events  # fmt: skip
    # The step rate was measured first: every rank captured the same steps, planned ahead.
    assert status["window"]["startStep"] > status["watch"]["step"] > 0, status
    assert status["watch"]["stepsPerSecond"] > 0, status["watch"]
    # The training (root) wrote the windows, the agents (the image's 10001) uploaded them,
    # recorded it in their own folder and removed them: the spools keep nothing uploaded.
    assert [(rank, uid) for _pod, rank, uid in left] == [(r, 10001) for r in range(4)], left
    # Prometheus holds what the status says: the verdict, its findings and culprits, the
    # workers, the step rate measured; the operator counted one verdict and one analyzer Job;
    # the verdict's alert fired, naming the culprit.
    monitoring_checks.assert_matches_status(scraped, obj, percent=None)
    monitoring_checks.assert_counted(scraped, obj, trigger=False, pods=len(training.pods))
    [alert] = scraped.alerts["PerfdiagVerdictDegraded"]
    assert alert["culprits"] == verdict["culprits"] and alert["target"] == training.name, alert
    # perfdiag's containers ran from the image, the training with its own Python.
    assert ran_from_image == {
        **{(pod, c): True for pod in training.pods for c in ("perfdiag-hook", "perfdiag-agent")},
        **{(pod, "pytorch"): False for pod in training.pods},
        ("analyzer", "analyzer"): True,
    }, ran_from_image


def _all_uploaded(training: Any, plan_id: str) -> list[tuple[str, int, int]] | None:
    """(pod, rank, owner of its upload record) once no rank's window of `plan_id` is left in
    the spools and each has its record; else None."""
    found = []
    for pod in training.pods:
        folder = training.spool_of(pod)
        for rank in spool.ranks_in(folder):
            record = spool.uploaded_window_mark(folder, rank, plan_id)
            if spool.window_dir(folder, rank, plan_id).exists() or not record.exists():
                return None
            found.append((pod, rank, record.stat().st_uid))
    return sorted(found, key=lambda row: row[1])


def _ran_from_image(training: Any, image: Any) -> dict[tuple[str, str], bool]:
    """(pod, container) → whether it ran in the image's files; the hook files the training
    imported were copied by the image's user. The analyzer Job's pod is ("analyzer", …)."""
    found: dict[tuple[str, str], bool] = {}
    for name, pod in training.kubelet.pods.items():
        for container, proc in pod.containers.items():
            found[(name, container)] = str(image.rootfs) in proc.argv
        hook = pod.root / "volumes" / "perfdiag-hook" / "sitecustomize.py"
        assert hook.stat().st_uid == int(image.user.split(":")[0]), name
    [job] = training.kubelet.jobs.values()
    [(container, proc)] = job.containers.items()
    found[("analyzer", container)] = str(image.rootfs) in proc.argv
    return found


def test_a_slow_node_is_named_with_its_pods(
    cluster: Any, kube_namespace: str, minio_server: Any, tmp_path: Path
) -> None:
    """The job's two pods on two nodes; both ranks of the worker pod's node do extra work: one
    slow_node finding names that node (spec.nodeName, through the downward API), its pod and
    its ranks, not two slow workers."""
    ns = kube_namespace
    storage_secret(cluster, ns, minio_server)
    stop_file = tmp_path / "slow-node.stop"
    args = ["--fault=slow-node", "--fault-ranks=2,3", "--extra-repeats=24",
            f"--stop-file={stop_file}", "--max-seconds=900"]  # fmt: skip
    with (
        serving_operator(cluster, ns),
        running_training(
            cluster,
            ns,
            tmp_path,
            "slow-node",
            script=FAULT_JOB,
            args=args,
            node_of=lambda pod: "node-b" if "-worker-" in pod else "node-a",
        ) as training,
    ):
        apply_diagnosis(cluster, ns, "which-node", training.name, capture=CAPTURE)
        with logs_on_failure(training):
            status = wait_phase(cluster, ns, "which-node", "Succeeded", "Failed", timeout=300)
        prefix = status.get("artifacts", {}).get("prefix")
    assert status["phase"] == "Succeeded", status
    stored = json.loads(open_storage(prefix).get_text("verdict.json"))
    hosts = {w["rank"]: w["host"] for w in stored["workers"]}
    assert hosts == {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}, stored["workers"]
    nodes = [f for f in stored["findings"] if f["kind"] == "slow_node"]
    assert nodes, stored["findings"]
    assert nodes[0]["ranks"] == [2, 3] and nodes[0]["evidence"]["node"] == "node-b"
    assert nodes[0]["evidence"]["pods"] == [f"{training.name}-worker-0"]
    assert not [f for f in stored["findings"] if f["kind"] == "slow_worker" and 2 in f["ranks"]]
