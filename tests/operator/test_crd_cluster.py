"""The generated CRD on a real kube-apiserver: install, explain, accept, reject, print."""

from __future__ import annotations

import json
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


def test_target_capture_and_trigger_are_immutable(cluster: Any, kube_namespace: str) -> None:
    cluster.apply(
        kube_namespace, cluster.diagnosis("frozen", {"kind": "PyTorchJob", "name": "bert"})
    )
    changes = {
        "spec.target is immutable after creation": {
            "target": {"kind": "PyTorchJob", "name": "other"}
        },
        "spec.capture is immutable after creation": {"capture": {"steps": 3}},
        "spec.storage is not supported": {"storage": {"bucket": "elsewhere"}},
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


def test_a_storage_override_is_refused_naming_the_field(cluster: Any, kube_namespace: str) -> None:
    """The agents' storage is fixed when the pods are injected: the API server refuses
    spec.storage at once rather than accepting a diagnosis that could only stall."""
    body = cluster.diagnosis(
        "elsewhere",
        {"kind": "PyTorchJob", "name": "bert"},
        storage={"bucket": "ml-diagnostics", "secretRef": {"name": "s3"}},
    )
    result = cluster.kubectl(
        "create", "-n", kube_namespace, "-f", "-", input=yaml.safe_dump(body), check=False
    )
    assert result.returncode != 0
    assert "spec.storage: Forbidden: spec.storage is not supported" in result.stderr, result.stderr
    assert "remove spec.storage" in result.stderr
    assert cluster.get(kube_namespace, "elsewhere") is None
    explain = " ".join(cluster.kubectl("explain", "pdiag.spec.storage").stdout.split())
    assert "Not supported yet: refused by the API server" in explain, explain


SUMMARY = (
    "Rank 3 is slowing the job: its aten::mm takes 2.4× its peers' median on every step of the "
    "window (38% of its step), with no time stolen by the host; the others wait for it in "
    "all_reduce. Check what else runs on its GPU and its node, compare its input shapes with "
    "the other ranks', and look at the report's timeline for where the extra time goes; the "
    "finding is robust over 10 steps (z 12.4) and names 1 of 4 ranks, on pod llama-node-0-1 "
    "of node b."
)


def test_get_shows_the_columns(cluster: Any, kube_namespace: str) -> None:
    cluster.apply(kube_namespace, cluster.diagnosis("cols", {"kind": "TrainJob", "name": "llama"}))
    finding = {
        "kind": "slow_worker",
        "category": "cpu_op",
        "ranks": [3],
        "severity": 0.38,
        "message": SUMMARY,
    }
    status = {
        "status": {
            "phase": "Succeeded",
            "verdict": {"status": "degraded", "summary": SUMMARY, "topFindings": [finding],
                        "culpritRanks": [3], "culprits": "3"},
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "VerdictReady",
                 "message": f"degraded: {SUMMARY}", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ],
        }
    }  # fmt: skip
    assert len(SUMMARY) > 400
    cluster.kubectl(
        "patch", "pdiag", "cols", "-n", kube_namespace, "--subresource=status", "--type=merge",
        "-p", yaml.safe_dump(status),
    )  # fmt: skip
    lines = cluster.kubectl("get", "pdiag", "-n", kube_namespace).stdout.splitlines()
    assert lines[0].split() == ["NAME", "TARGET", "PHASE", "VERDICT", "READY", "AGE"]
    assert lines[1].split()[:5] == ["cols", "llama", "Succeeded", "degraded", "True"]
    wide = cluster.kubectl("get", "perfdiag", "-n", kube_namespace, "-o", "wide").stdout
    header, row = wide.splitlines()
    assert header.split() == [
        "NAME", "TARGET", "KIND", "PHASE", "VERDICT", "READY", "REASON", "CULPRITS", "CATEGORY",
        "STEP-MS", "BASELINE-MS", "AGE",
    ]  # fmt: skip
    assert row.split()[:9] == [
        "cols", "llama", "TrainJob", "Succeeded", "degraded", "True", "VerdictReady", "3", "cpu_op"
    ]  # fmt: skip
    # The sentences stay in kubectl describe: a row is as short as its header.
    assert len(row) <= len(header) + 8 and SUMMARY[:20] not in wide, wide
    assert SUMMARY in cluster.kubectl("describe", "pdiag", "cols", "-n", kube_namespace).stdout


def test_the_served_columns_hold_no_sentence(cluster: Any) -> None:
    """The printer columns as the API server serves them: none shows a condition's message or
    the verdict's summary (hundreds of characters), and the culprits are a bounded text."""
    crd = json.loads(
        cluster.kubectl("get", "crd", "perfdiagnoses.perfdiag.io", "-o", "json").stdout
    )
    [version] = crd["spec"]["versions"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert not [p for p in columns.values() if p.endswith((".message", ".summary"))], columns
    assert columns["Culprits"] == ".status.verdict.culprits"
    assert columns["Category"] == ".status.verdict.topFindings[0].category"
    assert columns["Reason"] == '.status.conditions[?(@.type=="Ready")].reason'
    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert schema["verdict"]["properties"]["culprits"]["maxLength"] <= 256


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
