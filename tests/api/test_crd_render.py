"""The CRD rendered from the models: committed file, CLI, structural-schema converter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel, Field

from perfdiag.api.crd import SchemaError, render_crd, render_crd_yaml, structural_schema
from perfdiag.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "crds" / "perfdiagnosis.yaml"


def test_committed_crd_is_the_rendering() -> None:
    assert COMMITTED.read_text() == render_crd_yaml(), (
        "crds/perfdiagnosis.yaml differs from the models; regenerate it with "
        "`perfdiag crd --output crds/perfdiagnosis.yaml`"
    )


def test_perfdiag_crd_prints_the_committed_file() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "perfdiag.cli", "crd"], capture_output=True, text=True, check=True
    ).stdout
    assert out == COMMITTED.read_text()


def test_perfdiag_crd_output_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "crd.yaml"
    assert cli_main(["crd", "--output", str(target)]) == 0
    assert target.read_text() == COMMITTED.read_text()


def test_perfdiag_crd_unwritable_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli_main(["crd", "--output", str(blocker / "crd.yaml")]) == 1
    assert "cannot write" in capsys.readouterr().err


def _nodes(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, prop in schema.get("properties", {}).items():
        found += _nodes(prop, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        found += _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found += _nodes(schema["additionalProperties"], f"{path}.*")
    return found


def test_schema_is_structural_and_described() -> None:
    crd = render_crd()
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    for path, node in _nodes(schema):
        assert "type" in node, path
        for banned in ("$ref", "anyOf", "allOf", "oneOf", "title", "const"):
            assert banned not in node, (path, banned)
        assert node.get("additionalProperties") is not False, path
        if path.startswith((".spec", ".status")) and not path.endswith(("[]", ".*")):
            assert node.get("description"), f"{path} has no description (kubectl explain)"
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["target"]
    assert spec["properties"]["capture"]["default"] == {}
    steps = spec["properties"]["capture"]["properties"]["steps"]
    assert (steps["default"], steps["minimum"], steps["maximum"]) == (10, 1, 1000)
    kinds = spec["properties"]["target"]["properties"]["kind"]["enum"]
    assert kinds == ["PyTorchJob", "TrainJob", "Pods"]
    rules = {r["rule"]: r for r in spec["x-kubernetes-validations"]}
    assert rules["self.target == oldSelf.target"]["message"].startswith(
        "spec.target is immutable after creation"
    )
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    # `gt` becomes OpenAPI v3's boolean exclusiveMinimum.
    ratio = spec["properties"]["analysis"]["properties"]["minExcessFraction"]
    assert (ratio["minimum"], ratio["exclusiveMinimum"]) == (0.0, True)


def test_names_columns_and_subresources() -> None:
    crd = render_crd()
    assert crd["metadata"]["name"] == "perfdiagnoses.perfdiag.io"
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["pdiag"]
    assert names["categories"] == ["perfdiag"]
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    default_columns = [
        c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")
    ]
    assert default_columns == ["Target", "Phase", "Verdict", "Ready", "Age"]
    wide = [c["name"] for c in version["additionalPrinterColumns"]]
    assert wide == [
        "Target", "Kind", "Phase", "Verdict", "Ready", "Reason", "Culprits", "Category",
        "Step-ms", "Baseline-ms", "Age",
    ]  # fmt: skip


def test_columns_hold_no_sentence() -> None:
    """A column is as wide as its longest value: none shows a message or a summary (those are
    for kubectl describe); the culprits column is a bounded text, not the rank list."""
    version = render_crd()["spec"]["versions"][0]
    paths = [c["jsonPath"] for c in version["additionalPrinterColumns"]]
    assert not [p for p in paths if p.endswith((".message", ".summary", "culpritRanks"))], paths
    verdict = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["verdict"]
    assert verdict["properties"]["culprits"]["maxLength"] <= 256


def test_storage_override_is_refused_at_admission() -> None:
    spec = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = {r["rule"]: r for r in spec["x-kubernetes-validations"]}
    refused = rules["!has(self.storage)"]
    assert refused["fieldPath"] == ".storage" and refused["reason"] == "FieldValueForbidden"
    assert refused["message"].startswith("spec.storage is not supported")
    assert "Not supported yet" in spec["properties"]["storage"]["description"]


def test_rendering_is_valid_yaml_with_a_header() -> None:
    text = render_crd_yaml()
    assert text.startswith("# GENERATED by `perfdiag crd`")
    assert yaml.safe_load(text) == render_crd()


class _Inner(BaseModel):
    """Inner doc."""

    x: int = Field(default=1, ge=0, description="An x.")


class _Outer(BaseModel):
    """Outer doc."""

    inner: _Inner | None = Field(default=None, description="Field doc wins.")
    fixed: Literal["a"] = "a"
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")


def test_converter_inlines_refs_and_drops_null() -> None:
    schema = structural_schema(_Outer)
    inner = schema["properties"]["inner"]
    assert inner["description"] == "Field doc wins."
    assert inner["type"] == "object"
    assert inner["properties"]["x"] == {
        "description": "An x.",
        "type": "integer",
        "default": 1,
        "minimum": 0,
    }
    assert "default" not in inner and "nullable" not in inner
    assert schema["properties"]["fixed"]["enum"] == ["a"]
    assert schema["properties"]["labels"]["additionalProperties"] == {"type": "string"}
    assert schema["description"] == "Outer doc."


class _Union(BaseModel):
    value: int | str


class _Untyped(BaseModel):
    value: Any


@pytest.mark.parametrize("model", [_Union, _Untyped])
def test_converter_refuses_what_is_not_structural(model: type[BaseModel]) -> None:
    with pytest.raises(SchemaError):
        structural_schema(model)
