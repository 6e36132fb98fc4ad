"""The chart's monitoring as the suite's Prometheus takes it: the chart rendered by the real helm
with every monitoring object on, its PrometheusRule's groups as a rules file, a scrape
configuration made from its ServiceMonitor (what the Prometheus Operator would generate for
one target), and its Grafana dashboard's queries with the dashboard's variables filled in.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from perfdiag_testing.binaries import HELM_ENV

RELEASE = "perfdiag"
RELEASE_NAMESPACE = "perfdiag-system"
MONITORING_VALUES = (
    "metrics.service.enabled=true",
    "metrics.serviceMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
    "metrics.dashboard.enabled=true",
)


def render(
    helm: Path,
    chart: Path,
    *sets: str,
    release: str = RELEASE,
    namespace: str = RELEASE_NAMESPACE,
) -> list[dict[str, Any]]:
    """`helm template` of the chart with MONITORING_VALUES and `sets`, as objects."""
    args = [a for s in (*MONITORING_VALUES, *sets) for a in ("--set", s)]
    result = subprocess.run(
        [str(helm), "template", release, str(chart), "--namespace", namespace, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=HELM_ENV,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm template exited {result.returncode}: {result.stderr}")
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    if len(found) != 1:
        raise AssertionError(f"expected one {kind} in the chart, found {len(found)}")
    return found[0]


def rule_groups(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The PrometheusRule's spec: a rules file as Prometheus and promtool read it."""
    spec: dict[str, Any] = one(docs, "PrometheusRule")["spec"]
    return spec


def operator_scrape_config(docs: list[dict[str, Any]], target: str) -> dict[str, Any]:
    """The scrape configuration the Prometheus Operator makes of the ServiceMonitor, for one
    target (`host:port`, the operator's metrics port): job = the Service's name, the target
    labelled with the Service's namespace, honor_labels and the path as the ServiceMonitor says
    (the scrape interval is the suite's: every second)."""
    monitor = one(docs, "ServiceMonitor")
    [endpoint] = monitor["spec"]["endpoints"]
    service = next(
        d
        for d in docs
        if d["kind"] == "Service"
        and all(
            d["metadata"].get("labels", {}).get(k) == v
            for k, v in monitor["spec"]["selector"]["matchLabels"].items()
        )
    )
    port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
    assert port["targetPort"] == "metrics", port  # the Deployment's named container port
    return {
        "job_name": service["metadata"]["name"],
        "metrics_path": endpoint.get("path", "/metrics"),
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "static_configs": [
            {"targets": [target], "labels": {"namespace": service["metadata"]["namespace"]}}
        ],
    }


def apiserver_scrape_config(server: str, ca: Path, cert: Path, key: Path) -> dict[str, Any]:
    """kube-prometheus' `apiserver` job, for the suite's kube-apiserver (admin certificate)."""
    return {
        "job_name": "apiserver",
        "scheme": "https",
        "tls_config": {"ca_file": str(ca), "cert_file": str(cert), "key_file": str(key)},
        "static_configs": [{"targets": [server.removeprefix("https://")]}],
    }


def dashboard(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The Grafana dashboard the chart's ConfigMap holds."""
    config = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    )
    [text] = config["data"].values()
    parsed: dict[str, Any] = json.loads(text)
    return parsed


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref: str
    expr: str


def panel_queries(board: Mapping[str, Any]) -> list[PanelQuery]:
    """Every query of every panel (rows' panels included)."""
    found = []
    for panel in _panels(board):
        for target in panel.get("targets") or []:
            found.append(PanelQuery(panel["title"], target["refId"], target["expr"]))
    return found


def _panels(board: Mapping[str, Any]) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    for panel in board.get("panels") or []:
        panels.append(panel)
        panels.extend(panel.get("panels") or [])
    return panels


VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?::\w+)?\}")


def variables_used(expr: str) -> set[str]:
    return {a or b for a, b in VARIABLE.findall(expr)}


def fill(expr: str, values: Mapping[str, str]) -> str:
    """`expr` with the dashboard's variables ($name, ${name}) replaced as Grafana would."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return VARIABLE.sub(value, expr)
