"""Faults during a diagnosis, end to end on the real control plane and MinIO (the setting of
test_e2e.py): the operator killed and restarted, an agent that dies, MinIO down during the
upload, the PerfDiagnosis deleted mid-way, two diagnoses on one job."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from perfdiag.operator.analyzer_job import job_name
from perfdiag.storage import open_storage
from tests.operator.e2e_support import (
    apply_diagnosis,
    condition,
    logs_on_failure,
    running_training,
    serving_operator,
    status_of,
    storage_secret,
    wait_phase,
    wait_reconciling,
    wait_webhook,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.usefixtures("e2e_env")]


@contextmanager
def _operator_process(ns: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`perfdiag operator` as its own process (so it can be SIGKILLed), webhook included."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "perfdiag.cli", "operator", "-n", ns, "--recheck-seconds", "1"],
            stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ), start_new_session=True,
        )  # fmt: skip
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def test_operator_killed_mid_capture_and_restarted(
    cluster: Any, kube_namespace: str, minio_server: Any, tmp_path: Path
) -> None:
    ns = kube_namespace
    storage_secret(cluster, ns, minio_server)
    log = tmp_path / "operator.log"
    with _operator_process(ns, log) as first:
        wait_webhook(cluster, ns)
        with running_training(cluster, ns, tmp_path) as training:
            apply_diagnosis(
                cluster, ns, "d", training.name, capture={"steps": 40, "timeoutSeconds": 240}
            )
            wait_phase(cluster, ns, "d", "Capturing", "Analyzing", "Succeeded")
            # The PlanSent Event follows the status write; a kill between the two loses it
            # (reconcile.py), so wait for it: the point here is that nothing is sent twice.
            cluster.wait_for(
                lambda: ("Normal", "PlanSent") in cluster.events(ns, "d"), "PlanSent", timeout=30
            )
            capturing = status_of(cluster, ns, "d")
            assert capturing["phase"] == "Capturing", capturing  # killed mid-capture
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
            plan = capturing["window"]["planId"]
            with _operator_process(ns, log):
                done = wait_phase(cluster, ns, "d", "Succeeded", "Failed")
            events = cluster.events(ns, "d")
            jobs = cluster.kube.kubectl("get", "jobs", "-n", ns, "-o", "json").stdout
    assert done["phase"] == "Succeeded", f"{done}\n{log.read_text()[-5000:]}"
    assert done["window"]["planId"] == plan  # the same plan, not a second capture
    assert done["workers"]["captured"] == 4
    assert done["verdict"]["status"] in ("degraded", "healthy")
    # Nothing ran twice: one plan sent, one analyzer Job, one verdict.
    reasons = [reason for _, reason in events]
    assert reasons.count("PlanSent") == 1, events
    assert reasons.count("AnalyzerStarted") == 1, events
    assert reasons.count("VerdictReady") == 1, events
    names = [j["metadata"]["name"] for j in json.loads(jobs)["items"]]
    assert names == [job_name("d", cluster.get(ns, "d")["metadata"]["uid"])]
    assert training.kubelet.job_attempts == {names[0]: 1}


def test_agent_dies_partial_verdict_names_its_ranks(
    cluster: Any, kube_namespace: str, minio_server: Any, tmp_path: Path
) -> None:
    ns = kube_namespace
    storage_secret(cluster, ns, minio_server)
    with serving_operator(cluster, ns), running_training(cluster, ns, tmp_path) as training:
        worker = f"{training.name}-worker-0"  # ranks 2 and 3
        training.kubelet.pods[worker].kill("perfdiag-agent", restart=False)
        apply_diagnosis(
            cluster, ns, "d", training.name, capture={"steps": 10, "timeoutSeconds": 30}
        )
        wait_phase(cluster, ns, "d", "Capturing")
        done = wait_phase(cluster, ns, "d", "Succeeded", "Failed", timeout=180)
        events = cluster.events(ns, "d")
    assert done["phase"] == "Succeeded", done
    # The dead agent's ranks never reported.
    assert done["workers"] == {
        "expected": 4, "captured": 2, "missing": 2, "reporting": 2, "failed": [], "stuck": []
    }  # fmt: skip
    verdict = done["verdict"]
    assert verdict["status"] == "incomplete", verdict
    assert {2, 3} <= set(verdict["culpritRanks"]), verdict
    assert ("Warning", "CaptureEnded") in events


def test_minio_down_during_upload(
    cluster: Any, kube_namespace: str, minio_server: Any, tmp_path: Path
) -> None:
    """MinIO stops as the window is captured: the agents' uploads fail and are retried, the
    operator says storage is unavailable and keeps trying; once MinIO is back the diagnosis
    completes with every worker, and what was uploaded before the outage is still there."""
    ns = kube_namespace
    # The agents give an S3 operation 2 s (instead of 60) before their own retry loop takes
    # over, so the outage shows in their logs.
    storage_secret(cluster, ns, minio_server, PERFDIAG_S3_RETRY_SECONDS="2")
    with serving_operator(cluster, ns), running_training(cluster, ns, tmp_path) as training:
        apply_diagnosis(
            cluster, ns, "d", training.name, capture={"steps": 10, "timeoutSeconds": 180}
        )
        capturing = wait_phase(cluster, ns, "d", "Capturing")
        prefix = capturing["artifacts"]["prefix"]
        before = set(open_storage(prefix).list(""))
        minio_server.stop()

        def agent_logs() -> str:
            return "".join(
                training.kubelet.pods[p].log_text("perfdiag-agent") for p in training.pods
            )

        try:
            cond = wait_reconciling(cluster, ns, "d", "StorageUnavailable", timeout=60)
            assert status_of(cluster, ns, "d")["phase"] == "Capturing"
            assert condition(status_of(cluster, ns, "d"), "Ready")["status"] == "False"
            retried = re.compile(r"rank \d: window for plan \S+ failed .*; retrying in")
            cluster.wait_for(
                lambda: retried.search(agent_logs()),
                "an agent retrying its window's upload",
                timeout=90,
            )
        finally:
            minio_server.start()
        done = wait_phase(cluster, ns, "d", "Succeeded", "Failed", timeout=240)
        after = set(open_storage(prefix).list(""))
    assert "storage unavailable" in cond["message"]
    assert done["phase"] == "Succeeded", done
    assert done["window"]["planId"] == capturing["window"]["planId"]
    assert done["workers"] == {
        "expected": 4, "captured": 4, "missing": 0, "reporting": 4, "failed": [], "stuck": []
    }  # fmt: skip
    assert done["verdict"]["status"] in ("degraded", "healthy"), done["verdict"]
    # Nothing lost: what was there before the outage, and every worker's summary after it.
    assert "plan.json" in before and before <= after
    assert {f"workers/{r}/summary.parquet" for r in range(4)} <= after


def test_deleted_mid_capture_and_mid_analysis(
    cluster: Any, kube_namespace: str, minio_server: Any, tmp_path: Path
) -> None:
    ns = kube_namespace
    storage_secret(cluster, ns, minio_server)
    with serving_operator(cluster, ns), running_training(cluster, ns, tmp_path) as training:
        # Mid-capture: a window far longer than the test.
        apply_diagnosis(
            cluster, ns, "long", training.name, capture={"steps": 1000, "timeoutSeconds": 600}
        )
        wait_phase(cluster, ns, "long", "Capturing")
        obj = cluster.wait_for(
            lambda: (o := cluster.get(ns, "long")) and o["metadata"].get("finalizers") and o,
            "the finalizer",
        )
        assert obj["metadata"]["finalizers"] == ["perfdiag.io/finalizer"]
        annotated = cluster.core.read_namespaced_pod(training.pods[0], ns).metadata.annotations
        assert "perfdiag.io/plan" in annotated
        cluster.kubectl("delete", "pdiag", "long", "-n", ns, "--timeout=60s")
        assert cluster.get(ns, "long") is None  # no stuck finalizer
        for pod in training.pods:
            annotations = cluster.core.read_namespaced_pod(pod, ns).metadata.annotations
            assert "perfdiag.io/plan" not in annotations
            assert "perfdiag.io/diagnosis" not in annotations

        # Mid-analysis: the analyzer Job is held (not scheduled) until the deletion.
        training.kubelet.hold_jobs = True
        apply_diagnosis(
            cluster, ns, "short", training.name, capture={"steps": 5, "timeoutSeconds": 120}
        )
        wait_phase(cluster, ns, "short", "Analyzing")
        uid = cluster.get(ns, "short")["metadata"]["uid"]
        name = job_name("short", uid)
        cluster.wait_for(
            lambda: cluster.kube.kubectl("get", "job", name, "-n", ns, check=False).returncode == 0,
            "the analyzer Job",
        )
        cluster.kubectl("delete", "pdiag", "short", "-n", ns, "--timeout=60s")
        assert cluster.get(ns, "short") is None
        gone = cluster.kube.kubectl("get", "job", name, "-n", ns, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_two_diagnoses_on_one_job(
    cluster: Any, kube_namespace: str, minio_server: Any, tmp_path: Path
) -> None:
    """The second waits, saying for which, and runs when the first's capture is over."""
    ns = kube_namespace
    storage_secret(cluster, ns, minio_server)
    with serving_operator(cluster, ns), running_training(cluster, ns, tmp_path) as training:
        apply_diagnosis(
            cluster, ns, "first", training.name, capture={"steps": 30, "timeoutSeconds": 240}
        )
        wait_phase(cluster, ns, "first", "Capturing")
        apply_diagnosis(
            cluster, ns, "second", training.name, capture={"steps": 10, "timeoutSeconds": 240}
        )
        cond = wait_reconciling(cluster, ns, "second", "WaitingForOtherDiagnosis")
        assert status_of(cluster, ns, "second")["phase"] == "Pending"
        first = wait_phase(cluster, ns, "first", "Succeeded", "Failed")
        second = wait_phase(cluster, ns, "second", "Succeeded", "Failed")
    assert "PerfDiagnosis first" in cond["message"]
    assert first["phase"] == "Succeeded" and second["phase"] == "Succeeded"
    assert first["window"]["planId"] != second["window"]["planId"]
    assert second["window"]["startTime"] >= first["window"]["completionTime"]
    assert second["workers"]["captured"] == 4


HANG_SCRIPT = Path(__file__).resolve().parents[1] / "e2e" / "hang_train.py"


def test_hang_stacks_plan_names_the_stuck_rank(
    cluster: Any, kube_namespace: str, minio_server: Any, tmp_path: Path
) -> None:
    """Rank 3 blocks before its gradient all-reduce, the others wait in it: every rank stops
    advancing, the operator asks for stacks, and the hang verdict names rank 3 and its pod."""
    ns = kube_namespace
    storage_secret(cluster, ns, minio_server)
    args = ["--mode=before-allreduce", "--rank=3", "--at-step=40", "--steps=100000000"]
    with (
        serving_operator(cluster, ns),
        running_training(cluster, ns, tmp_path, script=HANG_SCRIPT, args=args) as training,
    ):
        capture = {"steps": 10, "timeoutSeconds": 240}
        apply_diagnosis(
            cluster, ns, "stuck", training.name, capture=capture, analysis={"stuckAfterSeconds": 10}
        )
        status = lambda: json.dumps(status_of(cluster, ns, "stuck"), indent=1)  # noqa: E731
        with logs_on_failure(training, status):
            asked = wait_reconciling(cluster, ns, "stuck", "CollectingStacks", timeout=120)
        done = wait_phase(cluster, ns, "stuck", "Succeeded", "Failed", timeout=180)
        events = cluster.events(ns, "stuck")
        prefix = done["artifacts"]["prefix"]
        stored = open_storage(prefix).list("workers/")
    assert "rank(s) 0, 1, 2, 3 stopped advancing" in asked["message"], asked
    assert ("Warning", "WorkersStuck") in events
    assert done["phase"] == "Succeeded", done
    assert done["workers"]["stuck"] == [0, 1, 2, 3], done["workers"]
    verdict = done["verdict"]
    assert verdict["status"] == "hang", verdict
    assert verdict["culpritRanks"] == [3], verdict
    assert verdict["culpritPods"] == [f"{training.name}-worker-0"], verdict
    assert {f"workers/{r}/stacks.json" for r in range(4)} <= set(stored)
