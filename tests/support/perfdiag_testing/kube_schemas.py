"""JSON schemas for `kubeconform -strict`, made offline (kubeconform cannot download here).

Built-in kinds: the OpenAPI v3 documents the real kube-apiserver of the tests publishes
(`/openapi/v3/<group-version>`). Custom kinds: a CRD's `openAPIV3Schema` (e.g. the generated
crds/perfdiagnosis.yaml). Both are turned into standalone strict JSON schemas the way the
schemas kubeconform downloads by default are made (openapi2jsonschema --strict): references
inlined, `nullable` turned into a null type, int-or-string into a oneOf, and every object with
declared properties closed (additionalProperties: false) unless it preserves unknown fields.

Files are laid out for the kubeconform schema location `schema_location(root)`:
`<root>/<group>/<version>/<kind>.json`, with group `v1` for the core group (kubeconform's
`.Group` template variable is what precedes the slash in apiVersion, or all of it).
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REF_PREFIX = "#/components/schemas/"
# What a kubeconform run over the chart and the examples needs; more can be asked for.
DEFAULT_GROUP_VERSIONS = (
    "api/v1",
    "apis/apps/v1",
    "apis/batch/v1",
    "apis/rbac.authorization.k8s.io/v1",
    "apis/admissionregistration.k8s.io/v1",
    "apis/apiextensions.k8s.io/v1",
)
# Keywords with no meaning for validation here; dropped to keep the files small.
_DROPPED = ("description", "example", "externalDocs", "format")


def schema_location(root: Path) -> str:
    """The -schema-location argument that finds the files written under `root`."""
    return f"{root}/{{{{ .Group }}}}/{{{{ .ResourceAPIVersion }}}}/{{{{ .ResourceKind }}}}.json"


def _path_for(root: Path, group: str, version: str, kind: str) -> Path:
    return root / (group or "v1") / version / f"{kind.lower()}.json"


def _fetch_json(url: str, context: ssl.SSLContext) -> Any:
    with urllib.request.urlopen(url, timeout=30, context=context) as response:
        return json.load(response)


def fetch_openapi_v3(
    server: str, context: ssl.SSLContext, group_versions: Iterable[str] = DEFAULT_GROUP_VERSIONS
) -> dict[str, Any]:
    """The OpenAPI v3 documents of `group_versions` from a kube-apiserver, by group-version."""
    index = _fetch_json(f"{server}/openapi/v3", context)["paths"]
    docs: dict[str, Any] = {}
    for gv in group_versions:
        if gv not in index:
            raise KeyError(f"the API server publishes no OpenAPI v3 document for {gv}")
        docs[gv] = _fetch_json(server + index[gv]["serverRelativeURL"], context)
    return docs


def _strict(node: Any, resolve: Any) -> Any:
    """Convert one OpenAPI v3 / structural schema node into strict JSON schema."""
    if isinstance(node, list):
        return [_strict(item, resolve) for item in node]
    if not isinstance(node, Mapping):
        return node
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref is not None:
        return {**resolve(ref), **_strict(node, resolve)}
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and "$ref" in all_of[0]:
        # {allOf: [{$ref}], default: …}: how OpenAPI v3 attaches a default to a reference.
        del node["allOf"]
        return {**resolve(all_of[0]["$ref"]), **_strict(node, resolve)}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key in ("properties", "patternProperties"):
            out[key] = {name: _strict(sub, resolve) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not", "allOf", "anyOf", "oneOf"):
            out[key] = _strict(value, resolve) if not isinstance(value, bool) else value
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["oneOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _resolver(schemas: Mapping[str, Any]) -> Any:
    stack: list[str] = []

    def resolve(ref: str) -> dict[str, Any]:
        if not ref.startswith(REF_PREFIX):
            raise ValueError(f"unsupported reference {ref!r}")
        name = ref[len(REF_PREFIX) :]
        if name in stack:
            return {}  # a recursive type (JSONSchemaProps): accept anything below this point
        stack.append(name)
        try:
            result: dict[str, Any] = _strict(schemas[name], resolve)
            return result
        finally:
            stack.pop()

    return resolve


def write_builtin_schemas(docs: Mapping[str, Any], root: Path) -> list[Path]:
    """One strict schema per kind of the fetched documents; returns the files written."""
    written: list[Path] = []
    for doc in docs.values():
        schemas = doc.get("components", {}).get("schemas", {})
        resolve = _resolver(schemas)
        for name, schema in schemas.items():
            for gvk in schema.get("x-kubernetes-group-version-kind") or []:
                path = _path_for(root, gvk["group"], gvk["version"], gvk["kind"])
                if path.exists():
                    continue  # a kind listed in several documents (e.g. DeleteOptions)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(resolve(REF_PREFIX + name)))
                written.append(path)
    return written


def write_crd_schemas(crd: Mapping[str, Any], root: Path) -> list[Path]:
    """Strict schemas of every served version of a CustomResourceDefinition."""
    spec = crd["spec"]
    written: list[Path] = []
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        schema = _strict(version["schema"]["openAPIV3Schema"], _resolver({}))
        path = _path_for(root, spec["group"], version["name"], spec["names"]["kind"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(schema))
        written.append(path)
    return written
