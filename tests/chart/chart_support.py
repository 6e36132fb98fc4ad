"""Rendering the chart with the real helm (test binaries) for the chart tests."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from perfdiag_testing.binaries import HELM_ENV, find_bin_dir

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "perfdiag"
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.yaml"))
RELEASE_NS = "perfdiag-system"

# The documented variants (docs/install.md; monitoring: docs/operator.md): name -> helm --set
# arguments.
VARIANTS: dict[str, list[str]] = {
    "defaults": [],
    "storage": [
        "storage.uri=s3://ml-diagnostics/perfdiag",
        "storage.endpoint=http://minio.minio:9000",
        "storage.region=us-east-1",
    ],
    "namespaced": ["watchNamespaces={team-a,team-b}", "storage.uri=s3://ml-diagnostics/perfdiag"],
    "cert-manager": ["webhook.certificates.mode=certManager"],
    "own-secret": [
        "webhook.certificates.mode=secret",
        "webhook.certificates.secretName=my-webhook-tls",
        "webhook.certificates.caBundle=LS0tLS1CRUdJTg==",
    ],
    "no-webhook": ["webhook.enabled=false"],
    # docs/operator.md, "Monitoring": every monitoring object on (each is off by default).
    "monitoring": [
        "metrics.service.enabled=true",
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.labels.release=kube-prometheus-stack",
        "metrics.dashboard.enabled=true",
    ],
}
# The Prometheus Operator's CRDs (../shared/prometheus-operator): the monitoring variant is
# validated against them (kubeconform, the API server).
PROMETHEUS_OPERATOR_CRDS = tuple(
    ROOT.parent / "shared" / "prometheus-operator" / f"monitoring.coreos.com_{plural}.yaml"
    for plural in ("servicemonitors", "prometheusrules")
)
CERT_MANAGER_KINDS = ("Certificate", "Issuer")


def tool(name: str) -> str:
    return str(find_bin_dir((name,), repo_root=ROOT) / name)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [tool("helm"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=HELM_ENV,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {result.returncode}: {result.stderr}")
    return result


def render(
    variant: str, *, release: str = "pd", namespace: str = RELEASE_NS, extra: tuple[str, ...] = ()
) -> str:
    sets = [a for s in VARIANTS[variant] for a in ("--set", s)]
    return helm("template", release, str(CHART), "--namespace", namespace, *sets, *extra).stdout


def objects(manifest: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(manifest) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]
