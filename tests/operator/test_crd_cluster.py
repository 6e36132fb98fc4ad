"""The generated CRD on a real kube-apiserver: install, explain, accept, reject, print."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.yaml"))
BAD = yaml.safe_load((ROOT / "tests" / "api" / "bad_examples.yaml").read_text())

pytestmark = pytest.mark.cluster


def test_explain_shows_the_descriptions(cluster: Any) -> None:
    spec = cluster.kubectl("explain", "perfdiagnosis.spec").stdout
    assert "A one-shot request: profile every worker" in spec
    assert re.search(r"target\s+<Object>\s+-required-", spec), spec
    assert "ttlSecondsAfterFinished" in spec
    steps = cluster.kubectl("explain", "pdiag.spec.capture.steps").stdout
    assert "Training steps (optimizer steps) to profile on every rank" in steps
    kind = cluster.kubectl("explain", "perfdiagnoses.spec.target.kind").stdout
    assert "PyTorchJob" in kind and "TrainJob" in kind and "Pods" in kind


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(cluster: Any, kube_namespace: str, path: Path) -> None:
    """Every example is accepted by the API server (a PyTorchJob example by the real Kubeflow
    CRD); a PerfDiagnosis gets the schema's defaults."""
    out = cluster.kubectl("apply", "-n", kube_namespace, "-f", str(path)).stdout
    assert "created" in out
    manifest = yaml.safe_load(path.read_text())
    if manifest["kind"] != "PerfDiagnosis":
        return
    stored = cluster.get(kube_namespace, manifest["metadata"]["name"])
    assert stored is not None
    assert stored["spec"]["capture"]["steps"] >= 1  # defaults applied by the server


@pytest.mark.parametrize("case", BAD, ids=lambda c: c["name"])
def test_bad_examples_are_rejected_naming_the_field(
    cluster: Any, kube_namespace: str, case: dict[str, Any]
) -> None:
    manifest = {
        "apiVersion": "perfdiag.io/v1alpha1",
        "kind": "PerfDiagnosis",
        "metadata": {"name": case["name"]},
        "spec": case["spec"],
    }
    result = cluster.kubectl(
        "create", "-n", kube_namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert result.returncode != 0, f"accepted: {case}"
    assert case["field"] in result.stderr, result.stderr
    assert cluster.get(kube_namespace, case["name"]) is None


def test_target_capture_and_storage_are_immutable(cluster: Any, kube_namespace: str) -> None:
    cluster.apply(
        kube_namespace, cluster.diagnosis("frozen", {"kind": "PyTorchJob", "name": "bert"})
    )
    changes = {
        "spec.target is immutable after creation": {
            "target": {"kind": "PyTorchJob", "name": "other"}
        },
        "spec.capture is immutable after creation": {"capture": {"steps": 3}},
        "spec.storage is immutable after creation": {"storage": {"bucket": "elsewhere"}},
        "spec.trigger is immutable after creation": {"trigger": {"slowdown": {"percent": 5}}},
    }
    for message, change in changes.items():
        result = cluster.kubectl(
            "patch", "pdiag", "frozen", "-n", kube_namespace, "--type=merge",
            "-p", yaml.safe_dump({"spec": change}), check=False,
        )  # fmt: skip
        assert result.returncode != 0 and message in result.stderr, (change, result.stderr)
    # What may change after creation does.
    cluster.kubectl(
        "patch", "pdiag", "frozen", "-n", kube_namespace, "--type=merge",
        "-p", '{"spec": {"ttlSecondsAfterFinished": 60, "analysis": {"reportSeverity": 0.1}}}',
    )  # fmt: skip
    stored = cluster.get(kube_namespace, "frozen")
    assert stored is not None and stored["spec"]["ttlSecondsAfterFinished"] == 60
    assert stored["spec"]["target"]["name"] == "bert"


def test_get_shows_the_columns(cluster: Any, kube_namespace: str) -> None:
    cluster.apply(kube_namespace, cluster.diagnosis("cols", {"kind": "TrainJob", "name": "llama"}))
    status = {
        "status": {
            "phase": "Succeeded",
            "verdict": {"status": "degraded", "summary": "rank 3 is slow"},
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "VerdictReady", "message": "done",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ],
        }
    }  # fmt: skip
    cluster.kubectl(
        "patch", "pdiag", "cols", "-n", kube_namespace, "--subresource=status", "--type=merge",
        "-p", yaml.safe_dump(status),
    )  # fmt: skip
    lines = cluster.kubectl("get", "pdiag", "-n", kube_namespace).stdout.splitlines()
    assert lines[0].split() == ["NAME", "TARGET", "PHASE", "VERDICT", "READY", "AGE"]
    assert lines[1].split()[:5] == ["cols", "llama", "Succeeded", "degraded", "True"]
    wide = cluster.kubectl("get", "perfdiag", "-n", kube_namespace, "-o", "wide").stdout
    assert wide.splitlines()[0].split() == [
        "NAME", "TARGET", "KIND", "PHASE", "VERDICT", "READY", "STEP-MS", "BASELINE-MS",
        "MESSAGE", "AGE",
    ]  # fmt: skip
    assert "TrainJob" in wide and "done" in wide


def test_a_trigger_is_accepted_with_its_defaults_and_shown_while_watching(
    cluster: Any, kube_namespace: str
) -> None:
    body = cluster.diagnosis(
        "watcher", {"kind": "PyTorchJob", "name": "bert"}, trigger={"slowdown": {"percent": 5}}
    )
    cluster.apply(kube_namespace, body)
    stored = cluster.get(kube_namespace, "watcher")
    assert stored is not None
    assert stored["spec"]["trigger"] == {"slowdown": {"percent": 5, "baselineSteps": 50}}
    explain = cluster.kubectl("explain", "pdiag.spec.trigger.slowdown.baselineSteps").stdout
    assert "Steps per mean step time" in explain
    status = {
        "status": {
            "phase": "Watching",
            "watch": {"planId": "w", "stepMs": 52.5, "baselineStepMs": 48.25, "step": 900,
                      "candidates": [{"step": 300, "stepMs": 48.25}]},
        }
    }  # fmt: skip
    cluster.kubectl(
        "patch", "pdiag", "watcher", "-n", kube_namespace, "--subresource=status",
        "--type=merge", "-p", yaml.safe_dump(status),
    )  # fmt: skip
    wide = cluster.kubectl("get", "pdiag", "watcher", "-n", kube_namespace, "-o", "wide").stdout
    row = wide.splitlines()[1].split()
    assert row[:3] == ["watcher", "bert", "PyTorchJob"] and "Watching" in row, wide
    assert "52.5" in row and "48.25" in row, wide
