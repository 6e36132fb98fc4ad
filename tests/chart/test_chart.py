"""The Helm chart rendered by the real helm: lint, values schema, and what each documented
variant produces (docs/install.md). Cluster checks are in test_chart_cluster.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.chart.chart_support import (
    CHART,
    RELEASE_NS,
    VARIANTS,
    by_kind,
    helm,
    objects,
    render,
)

# They render the chart with helm, one of the pinned test binaries.
pytestmark = pytest.mark.binaries


def test_helm_lint_strict() -> None:
    result = helm("lint", "--strict", str(CHART), "--set", "storage.uri=s3://bucket/p")
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_chart_crd_is_the_generated_one() -> None:
    """charts/perfdiag/crds/ holds exactly what `perfdiag crd` prints (scripts/sync-chart-crd.sh
    copies it)."""
    from perfdiag.api.crd import render_crd_yaml

    chart_copy = (CHART / "crds" / "perfdiagnosis.yaml").read_text()
    assert chart_copy == render_crd_yaml(), "run scripts/sync-chart-crd.sh"


def _values_paths(node: object, prefix: str = "") -> set[str]:
    if isinstance(node, dict) and node:
        out: set[str] = set()
        for key, value in node.items():
            out |= _values_paths(value, f"{prefix}.{key}" if prefix else key)
        return out
    return {prefix}


def _schema_has(schema: dict, path: str) -> bool:  # type: ignore[type-arg]
    node = schema
    for part in path.split("."):
        ref = node.get("$ref")
        if ref:
            node = schema_root["definitions"][ref.rsplit("/", 1)[1]]
        props = node.get("properties", {})
        if part in props:
            node = props[part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return False
    return True


schema_root = json.loads((CHART / "values.schema.json").read_text())


def test_values_schema_covers_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [p for p in sorted(_values_paths(values)) if not _schema_has(schema_root, p)]
    assert not missing, f"values without a schema: {missing}"


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("webhook.timeoutSeconds=11", "/webhook/timeoutSeconds"),
        ("webhook.certificates.mode=selfmade", "/webhook/certificates/mode"),
        ("storage.uri=http://not-s3", "/storage/uri"),
        ("watchNamespaces={Team_A}", "/watchNamespaces/0"),
        ("storage.accessKey=AKIA", "additional properties 'accessKey' not allowed"),
    ],
)
def test_values_schema_rejects(setting: str, complaint: str) -> None:
    result = helm("template", "pd", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0
    assert complaint in result.stderr


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_renders(variant: str) -> None:
    docs = objects(render(variant))
    [deployment] = by_kind(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"livenessProbe", "readinessProbe", "startupProbe"} <= set(container)
    assert container["args"][0] == "operator"
    # Credentials are never values: no ConfigMap but the Grafana dashboard's, no Secret except
    # the webhook's TLS one.
    for config in by_kind(docs, "ConfigMap"):
        assert set(config["data"]) == {"perfdiag.json"}, config["metadata"]
    for secret in by_kind(docs, "Secret"):
        assert secret["type"] == "kubernetes.io/tls"
        assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}


def _webhook(variant: str) -> dict:  # type: ignore[type-arg]
    [config] = by_kind(objects(render(variant)), "MutatingWebhookConfiguration")
    [hook] = config["webhooks"]
    return hook  # type: ignore[no-any-return]


def test_webhook_selects_opted_in_pods_outside_system_namespaces() -> None:
    hook = _webhook("defaults")
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] <= 10
    assert hook["objectSelector"] == {"matchLabels": {"perfdiag.io/inject": "true"}}
    [excluded] = hook["namespaceSelector"]["matchExpressions"]
    assert excluded["operator"] == "NotIn"
    assert set(excluded["values"]) == {RELEASE_NS, "kube-system"}
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "operations": ["CREATE"],
            "scope": "Namespaced",
        }
    ]
    # kopf's WebhookServer serves each admission handler at /<handler id>.
    import kopf

    from perfdiag.operator import webhook

    [handler] = [
        h
        for h in kopf.get_default_registry()._webhooks.get_all_handlers()
        if getattr(h.fn, "__name__", "") == webhook.inject_pod.__name__
    ]
    assert hook["clientConfig"]["service"]["path"] == f"/{handler.id}"
    assert hook["clientConfig"]["caBundle"]


def test_namespaced_mode_has_roles_only_in_listed_namespaces() -> None:
    docs = objects(render("namespaced"))
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    [cluster_role] = by_kind(docs, "ClusterRole")
    resources = {r for rule in cluster_role["rules"] for r in rule["resources"]}
    assert resources == {"customresourcedefinitions", "namespaces"}
    hook = _webhook("namespaced")
    included = [e for e in hook["namespaceSelector"]["matchExpressions"] if e["operator"] == "In"]
    assert included == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
    ]
    [deployment] = by_kind(docs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args


def test_no_rule_mentions_secrets() -> None:
    for variant in VARIANTS:
        docs = objects(render(variant))
        for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
            for rule in role["rules"]:
                assert "secrets" not in rule["resources"]
                assert "*" not in rule["resources"] and "*" not in rule["verbs"]


def test_storage_is_configured_by_reference() -> None:
    [deployment] = by_kind(objects(render("storage")), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PERFDIAG_STORAGE"] == "s3://ml-diagnostics/perfdiag"
    assert env["AWS_ENDPOINT_URL"] == "http://minio.minio:9000"
    assert env["PERFDIAG_STORAGE_SECRET"] == "perfdiag-storage"
    assert container["envFrom"] == [{"secretRef": {"name": "perfdiag-storage"}}]
    assert env["PERFDIAG_STORAGE_ENDPOINT"] == "http://minio.minio:9000"  # for the agents
    assert env["PERFDIAG_STORAGE_REGION"] == "us-east-1"


def test_the_operator_reads_every_value_the_chart_renders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rendered environment goes through OperatorConfig.from_env as the pod's would."""
    from perfdiag.operator.settings import OperatorConfig

    docs = objects(
        render(
            "storage",
            extra=(
                "--set", "agent.resources.requests.cpu=300m",
                "--set", "analyzer.resources.limits.memory=6Gi",
                "--set", "analyzer.activeDeadlineSeconds=1800",
                "--set", "analyzer.ttlSecondsAfterFinished=120",
            ),
        )
    )  # fmt: skip
    [deployment] = by_kind(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for var in container["env"]:
        monkeypatch.setenv(var["name"], var["value"])
    config = OperatorConfig.from_env()
    assert config.storage == "s3://ml-diagnostics/perfdiag"
    assert config.agent_resources.to_wire() == {
        "requests": {"cpu": "300m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert config.analyzer_resources.to_wire()["limits"] == {"memory": "6Gi"}
    assert (config.analyzer_deadline_seconds, config.analyzer_ttl_seconds) == (1800, 120)
    assert (config.storage_endpoint, config.storage_region) == (
        "http://minio.minio:9000",
        "us-east-1",
    )
    assert config.webhook is not None and not config.webhook.manage


def test_cert_manager_mode_injects_the_ca() -> None:
    docs = objects(render("cert-manager"))
    [certificate] = by_kind(docs, "Certificate")
    [config] = by_kind(docs, "MutatingWebhookConfiguration")
    annotation = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert annotation == f"{RELEASE_NS}/{certificate['metadata']['name']}"
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    assert not by_kind(docs, "Secret")


def test_generated_certificate_names_the_service(tmp_path: Path) -> None:
    docs = objects(render("defaults"))
    [secret] = by_kind(docs, "Secret")
    [service] = by_kind(docs, "Service")
    import base64

    pem = base64.b64decode(secret["data"]["tls.crt"])
    (tmp_path / "tls.crt").write_bytes(pem)
    text = subprocess.run(
        ["openssl", "x509", "-noout", "-text", "-in", str(tmp_path / "tls.crt")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"DNS:{service['metadata']['name']}.{RELEASE_NS}.svc" in text


def test_notes_tell_the_next_commands() -> None:
    out = helm("install", "pd", str(CHART), "--namespace", RELEASE_NS, "--dry-run=client").stdout
    notes = out.split("NOTES:", 1)[1]
    assert f"kubectl -n {RELEASE_NS} rollout status deployment/pd-perfdiag" in notes
    # The Secret comes first: the rollout cannot finish before the operator has it.
    assert notes.index("create secret generic") < notes.index("rollout status")
    assert "storage.uri is empty" in notes
    assert "perfdiag.io/inject" in notes
    configured = helm(
        "install",
        "pd",
        str(CHART),
        "--namespace",
        RELEASE_NS,
        "--dry-run=client",
        "--set",
        "storage.uri=s3://bucket/p",
    ).stdout.split("NOTES:", 1)[1]
    assert "storage.uri is empty" not in configured
