"""The PerfDiagnosis pydantic models: examples, rejections, wire format, analyzer agreement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from perfdiag.api import PerfDiagnosis, PerfDiagnosisSpec, PerfDiagnosisStatus
from perfdiag.api.diagnosis import Analysis, ExpectedRangesOverride

ROOT = Path(__file__).resolve().parents[2]
# The PerfDiagnosis examples (docs/examples also holds an opted-in PyTorchJob, which
# kubeconform validates in tests/chart).
EXAMPLES = sorted(
    path
    for path in (ROOT / "docs" / "examples").glob("*.yaml")
    if yaml.safe_load(path.read_text()).get("kind") == "PerfDiagnosis"
)
BAD = yaml.safe_load((Path(__file__).parent / "bad_examples.yaml").read_text())


def _errors(exc: ValidationError) -> list[str]:
    return [
        "spec." + ".".join(str(part) for part in err["loc"]) + ": " + err["msg"]
        for err in exc.errors()
    ]


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    manifest = yaml.safe_load(path.read_text())
    diagnosis = PerfDiagnosis.model_validate(manifest)
    assert diagnosis.api_version == "perfdiag.io/v1alpha1"
    assert diagnosis.kind == "PerfDiagnosis"
    # What the models keep of a manifest is what it says (nothing silently dropped).
    assert _subset(manifest["spec"], diagnosis.spec.to_wire())


def _subset(small: Any, big: Any) -> bool:
    if isinstance(small, dict):
        return isinstance(big, dict) and all(
            k in big and _subset(v, big[k]) for k, v in small.items()
        )
    return bool(small == big)


@pytest.mark.parametrize("case", BAD, ids=lambda c: c["name"])
def test_bad_examples_are_rejected_naming_the_field(case: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as caught:
        PerfDiagnosisSpec.model_validate(case["spec"])
    messages = _errors(caught.value)
    assert any(case["field"] in message for message in messages), messages


def test_defaults_and_camel_case_wire_format() -> None:
    spec = PerfDiagnosisSpec.model_validate({"target": {"kind": "PyTorchJob", "name": "bert"}})
    assert spec.to_wire() == {
        "target": {"kind": "PyTorchJob", "name": "bert"},
        "capture": {
            "steps": 10,
            "activities": ["cpu", "cuda"],
            "pythonStacks": False,
            "timeoutSeconds": 600,
            "keepRawEvents": False,
        },
        "analysis": {},
    }
    # snake_case names are accepted too (Python callers).
    same = PerfDiagnosisSpec(
        target={"kind": "PyTorchJob", "name": "bert"}, ttl_seconds_after_finished=5
    )  # type: ignore[arg-type]
    assert same.to_wire()["ttlSecondsAfterFinished"] == 5


def test_repeated_activity_is_rejected() -> None:
    with pytest.raises(ValidationError, match="must not repeat"):
        PerfDiagnosisSpec.model_validate(
            {"target": {"kind": "Pods", "name": "w-0"}, "capture": {"activities": ["cpu", "cpu"]}}
        )


def test_status_round_trip_tolerates_unknown_fields() -> None:
    wire = {
        "observedGeneration": 3,
        "phase": "Succeeded",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "VerdictReady",
                "message": "",
                "observedGeneration": 3,
                "lastTransitionTime": "2026-01-02T03:04:05Z",
            }
        ],
        "verdict": {
            "status": "degraded",
            "summary": "rank 3 is slow",
            "topFindings": [
                {
                    "kind": "slow_worker",
                    "category": "gpu_compute",
                    "ranks": [3],
                    "severity": 0.4,
                    "message": "rank 3 spends 40% more time in GEMMs",
                }
            ],
            "culpritRanks": [3],
            "culpritPods": ["bert-worker-1"],
        },
        "artifacts": {"prefix": "s3://b/p", "verdict": "s3://b/p/verdict.json"},
        "fieldOfANewerOperator": {"x": 1},
    }
    status = PerfDiagnosisStatus.model_validate(wire)
    out = status.to_wire()
    del wire["fieldOfANewerOperator"]
    assert out["conditions"][0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert _subset(wire, out)
    assert status.condition("Ready") is not None
    assert status.condition("Stalled") is None


def test_analysis_mirrors_the_analyzer_thresholds() -> None:
    """spec.analysis is handed to the analyzer as its Thresholds: same names, same bounds."""
    from perfdiag.api.thresholds import ExpectedRanges, Thresholds

    for mirror, original in ((Analysis, Thresholds), (ExpectedRangesOverride, ExpectedRanges)):
        assert set(mirror.model_fields) == set(original.model_fields), mirror.__name__
        ours = mirror.model_json_schema(by_alias=True)["properties"]
        theirs = original.model_json_schema(by_alias=True)["properties"]
        assert set(ours) == set(theirs)  # same camelCase names on the wire
        for name, schema in theirs.items():
            branches = schema.get("anyOf", [schema])
            bounds = {k: v for b in branches for k, v in b.items() if "imum" in k}
            our_branches = ours[name].get("anyOf", [ours[name]])
            our_bounds = {k: v for b in our_branches for k, v in b.items() if "imum" in k}
            assert our_bounds == bounds, name
    # A full override is accepted by the analyzer as is.
    every = {
        name: (0.5 if name not in ("expected_ranges_gpu", "expected_ranges_cpu") else None)
        for name in Analysis.model_fields
    }
    every["min_ratio"] = 1.5
    every["min_robust_z"] = 3.0
    analysis = Analysis.model_validate(
        {**every, "expected_ranges_gpu": {"python": 0.02}, "expected_ranges_cpu": {"gc": 0.1}}
    )
    thresholds = Thresholds.model_validate(analysis.to_wire())
    assert thresholds.report_severity == 0.5
    assert thresholds.expected_ranges_gpu.python == 0.02
    assert analysis.thresholds() == thresholds
    # Unset fields keep the analyzer's defaults.
    assert Thresholds.model_validate(Analysis().to_wire()) == Thresholds()
    assert Analysis().thresholds() == Thresholds()
    # One description each: the CRD's is the analyzer's, saying that unset means its default.
    for name, field in Thresholds.model_fields.items():
        assert field.description, name
        assert (Analysis.model_fields[name].description or "").startswith(field.description)
