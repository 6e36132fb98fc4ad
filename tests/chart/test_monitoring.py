"""The chart's monitoring (docs/operator.md, "Monitoring"), rendered by the real helm: each
object off by default, the ServiceMonitor scraping the operator's metrics port, the alerting
rules checked and unit-tested by promtool (tests/chart/alerts_test.yaml fires every alert), the
Grafana dashboard a valid dashboard whose every query reads series the operator exports and
parses in the suite's Prometheus. kubeconform and the API server validate the monitoring variant
against the Prometheus Operator's CRDs (test_chart_cluster.py); the end-to-end tests run every
panel's query against a Prometheus that scraped a real diagnosis (tests/operator/test_e2e*.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from perfdiag.operator.metrics import DiagnosesCollector, OperatorMetrics, view_of
from perfdiag_testing import monitoring
from perfdiag_testing.prometheus_server import (
    PrometheusMissing,
    PrometheusServer,
    find_prometheus,
    find_promtool,
)
from tests.chart.chart_support import CHART, VARIANTS, by_kind, objects, render, tool

# They render the chart with helm, one of the pinned test binaries.
pytestmark = pytest.mark.binaries

ALERTS_TEST = Path(__file__).with_name("alerts_test.yaml")
DASHBOARD = CHART / "dashboards" / "perfdiag.json"
MONITORING_KINDS = ("ServiceMonitor", "PrometheusRule")


def _promtool() -> Path:
    try:
        return find_promtool(find_prometheus())
    except PrometheusMissing as exc:
        pytest.fail(str(exc), pytrace=False)


def _monitoring_docs(*sets: str) -> list[dict[str, Any]]:
    return monitoring.render(Path(tool("helm")), CHART, *sets)


def test_monitoring_is_off_by_default_and_metrics_are_served() -> None:
    docs = objects(render("defaults"))
    assert not [d for d in docs if d["kind"] in MONITORING_KINDS]
    assert not by_kind(docs, "ConfigMap")
    assert [s["metadata"]["name"] for s in by_kind(docs, "Service")] == ["pd-perfdiag-webhook"]
    [deployment] = by_kind(docs, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["PERFDIAG_METRICS_PORT"], env["PERFDIAG_METRICS_ADDR"]) == ("8081", "0.0.0.0")
    assert {"name": "metrics", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    # metrics.enabled=false: no port, and none of the monitoring objects even if asked for.
    off = objects(render("monitoring", extra=("--set", "metrics.enabled=false")))
    assert not [d for d in off if d["kind"] in (*MONITORING_KINDS, "ConfigMap")]
    [deployment] = by_kind(off, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert "PERFDIAG_METRICS_PORT" not in {e["name"] for e in container["env"]}
    assert "metrics" not in {p["name"] for p in container["ports"]}


def test_the_service_monitor_scrapes_the_operator_keeping_the_diagnosis_namespace() -> None:
    docs = objects(render("monitoring"))
    [monitor] = by_kind(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    services = [
        s
        for s in by_kind(docs, "Service")
        if all(
            s["metadata"]["labels"].get(k) == v
            for k, v in monitor["spec"]["selector"]["matchLabels"].items()
        )
    ]
    assert [s["metadata"]["name"] for s in services] == ["pd-perfdiag-metrics"]  # not the webhook
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    # The series' `namespace` is the diagnosis' own: Prometheus must not rename it.
    assert endpoint["honorLabels"] is True
    [deployment] = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]
    assert all(
        pod["metadata"]["labels"][k] == v for k, v in services[0]["spec"]["selector"].items()
    )
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert services[0]["spec"]["ports"][0]["targetPort"] == "metrics" and "metrics" in ports
    [rule] = by_kind(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_dashboard_config_map_is_the_dashboard_for_grafana_s_sidecar() -> None:
    docs = _monitoring_docs(
        "metrics.dashboard.namespace=monitoring", "metrics.dashboard.annotations.grafana_folder=ML"
    )
    [config] = by_kind(docs, "ConfigMap")
    assert config["metadata"]["namespace"] == "monitoring"
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config["metadata"]["annotations"] == {"grafana_folder": "ML"}
    assert json.loads(config["data"]["perfdiag.json"]) == json.loads(DASHBOARD.read_text())


def _rules_dir(tmp_path: Path) -> Path:
    """The chart's rules as promtool reads them, beside a copy of alerts_test.yaml (rendered
    as the release `perfdiag` in perfdiag-system: the names the unit tests use)."""
    groups = monitoring.rule_groups(_monitoring_docs())
    (tmp_path / "perfdiag-rules.yaml").write_text(yaml.safe_dump(groups, sort_keys=False))
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    return tmp_path


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    folder = _rules_dir(tmp_path)
    result = subprocess.run(
        [str(_promtool()), "check", "rules", str(folder / "perfdiag-rules.yaml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


def test_promtool_unit_tests_fire_every_alert(tmp_path: Path) -> None:
    folder = _rules_dir(tmp_path)
    result = subprocess.run(
        [str(_promtool()), "test", "rules", ALERTS_TEST.name],
        cwd=folder, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # Every alert of the chart has a case where it fires, with its labels and text.
    alerts = {
        rule["alert"]
        for group in monitoring.rule_groups(_monitoring_docs())["groups"]
        for rule in group["rules"]
    }
    cases = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    fired = {
        case["alertname"]
        for test in cases
        for case in test["alert_rule_test"]
        if case["exp_alerts"] and all(a.get("exp_annotations") for a in case["exp_alerts"])
    }
    assert alerts == fired == {
        "PerfdiagJobSlowedDown", "PerfdiagVerdictDegraded", "PerfdiagVerdictHang",
        "PerfdiagDiagnosisFailed", "PerfdiagWebhookFailingOpen", "PerfdiagOperatorDown",
    }  # fmt: skip


def test_a_broken_rule_fails_promtool(tmp_path: Path) -> None:
    """promtool really judges: the unit tests fail against a rule that lost its threshold."""
    folder = _rules_dir(tmp_path)
    rules = folder / "perfdiag-rules.yaml"
    rules.write_text(rules.read_text().replace('status="hang"', 'status="degraded"'))
    result = subprocess.run(
        [str(_promtool()), "test", "rules", ALERTS_TEST.name],
        cwd=folder, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode != 0 and "PerfdiagVerdictHang" in result.stdout + result.stderr


def _exported_names() -> set[str]:
    """Every series name the operator exports, one diagnosis of every kind of data shown."""
    status = {
        "phase": "Succeeded", "startTime": "2026-11-22T01:00:00Z",
        "completionTime": "2026-11-22T02:00:00Z",
        "watch": {"step": 5, "stepMs": 60.0, "rank": 1, "baselineStepMs": 50.0,
                  "stepsPerSecond": 2.0, "slowdown": {"rank": 1, "step": 5, "meanStepMs": 60.0,
                  "baselineStepMs": 50.0, "baselineStep": 2, "steps": 2,
                  "thresholdPercent": 10.0}},
        "window": {"startTime": "2026-11-22T01:30:00Z"},
        "workers": {"expected": 2},
        "verdict": {"status": "degraded", "summary": "s", "culpritRanks": [1],
                    "topFindings": [{"kind": "slow_worker", "category": "cpu_op", "ranks": [1],
                                     "severity": 0.3, "message": "m"}]},
    }  # fmt: skip
    spec = {"target": {"kind": "PyTorchJob", "name": "j"}, "trigger": {"slowdown": {"percent": 10}}}
    metrics = OperatorMetrics()
    view = view_of("ns", "d", spec, status)
    metrics.registry.register(DiagnosesCollector(lambda: [view]))
    text = generate_latest(metrics.registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


OUTSIDE = {"up", "apiserver_admission_webhook_fail_open_count"}  # Prometheus', the API server's


def test_dashboard_and_rules_read_only_series_that_exist() -> None:
    exported = _exported_names() | OUTSIDE
    board = json.loads(DASHBOARD.read_text())
    exprs = [q.expr for q in monitoring.panel_queries(board)]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    groups = monitoring.rule_groups(_monitoring_docs())["groups"]
    exprs += [rule["expr"] for group in groups for rule in group["rules"]]
    read = {
        name
        for expr in exprs
        for name in re.findall(r"\b(perfdiag_[a-z_]+|up|apiserver_[a-z_]+)\b", expr)
    }
    assert read - exported == set(), sorted(read - exported)
    # ... and the dashboard shows every per-job series the operator exports.
    shown = {n for n in read if n.startswith("perfdiag_")}
    per_job = {n for n in exported if n.startswith(("perfdiag_job_", "perfdiag_diagnosis_"))}
    per_job -= {"perfdiag_diagnosis_time_to_verdict_seconds_bucket",
                "perfdiag_diagnosis_time_to_verdict_seconds_count",
                "perfdiag_diagnosis_time_to_verdict_seconds_sum",
                "perfdiag_diagnosis_time_to_verdict_seconds_created",
                "perfdiag_diagnosis_start_timestamp_seconds",
                "perfdiag_diagnosis_completion_timestamp_seconds",
                "perfdiag_diagnosis_culprit", "perfdiag_diagnosis_culprit_ranks",
                "perfdiag_job_furthest_step", "perfdiag_job_slowest_rank",
                "perfdiag_job_slowdown_detected_timestamp_seconds"}  # fmt: skip
    assert per_job <= shown, sorted(per_job - shown)


def test_the_dashboard_is_a_valid_grafana_dashboard() -> None:
    """What Grafana needs to load it from the sidecar's file, and to draw each panel: no Grafana
    can be installed here, so its model is checked (and its queries run in Prometheus)."""
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "perfdiag-operator" and len(board["uid"]) <= 40
    assert board["title"] and isinstance(board["schemaVersion"], int)
    assert board["schemaVersion"] >= 36
    assert "id" not in board or board["id"] is None  # provisioned dashboards get their own id
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = [p for p in board["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), ids
    known_types = {"timeseries", "stat", "table", "row", "gauge", "bargauge"}
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        assert panel["type"] in known_types, panel["type"]
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])}  # fmt: skip
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["title"] and panel["description"], panel
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["expr"].strip()
            used = monitoring.variables_used(target["expr"])
            assert used <= set(variables) | {"__range", "__rate_interval"}, (panel["title"], used)
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == "${datasource}"
            assert monitoring.variables_used(variable["query"]["query"]) <= set(variables)


@pytest.mark.cluster
def test_every_dashboard_query_parses_in_prometheus(prometheus_server: PrometheusServer) -> None:
    """Each panel's and each variable's query, its variables filled in, is accepted by the
    suite's Prometheus (the end-to-end tests then check that each returns data)."""
    board = json.loads(DASHBOARD.read_text())
    values = {"job": ".*", "namespace": ".*", "diagnosis": ".*", "datasource": "prometheus",
              "__range": "1h", "__rate_interval": "1m"}  # fmt: skip
    for query in monitoring.panel_queries(board):
        prometheus_server.query(monitoring.fill(query.expr, values))
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"]["query"])
            assert inner, variable["query"]
            selector = monitoring.fill(inner.group(1), values)
            prometheus_server.api("series", **{"match[]": selector})


def test_the_monitoring_variant_is_documented() -> None:
    """docs/operator.md names every value the monitoring variant sets."""
    text = (CHART.parents[1] / "docs" / "operator.md").read_text()
    for setting in VARIANTS["monitoring"]:
        assert setting.split("=")[0].rsplit(".labels.", 1)[0] in text, setting
