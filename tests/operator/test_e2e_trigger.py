"""spec.trigger end to end on the real control plane and MinIO (the setting of test_e2e.py): a
PerfDiagnosis that watches the job (phase Watching), one rank that turns slow mid-run, the
slowdown rule firing on the agents' step times, the capture planned ahead of the ranks, and the
verdict naming the slow rank with what fired it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perfdiag.storage import open_storage
from tests.operator import monitoring_checks
from tests.operator.e2e_support import (
    FAULT_RANK,
    apply_diagnosis,
    condition,
    logs_on_failure,
    running_training,
    serving_operator,
    status_of,
    storage_secret,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.usefixtures("e2e_env")]

BASELINE_STEPS = 10
PERCENT = 25  # the slow rank's tokenizer more than doubles the step; a loaded host's noise less


def test_a_slowdown_mid_run_fires_the_capture(
    cluster: Any, kube_namespace: str, minio_server: Any, tmp_path: Path, prometheus_server: Any
) -> None:
    ns = kube_namespace
    storage_secret(cluster, ns, minio_server)
    slow_file = tmp_path / "turn-slow"
    args = [
        "--scenario=slowdown",
        f"--fault-rank={FAULT_RANK}",
        f"--stop-file={tmp_path / 'torchrun-cpu.stop'}",  # running_training's stop file
        f"--slowdown-file={slow_file}",
        "--max-seconds=900",
    ]
    phases: list[str] = []
    with (
        serving_operator(cluster, ns),
        running_training(cluster, ns, tmp_path, args=args) as training,
    ):
        apply_diagnosis(
            cluster, ns, "on-slowdown", training.name,
            capture={"steps": 10, "timeoutSeconds": 240},
            trigger={"slowdown": {"percent": PERCENT, "baselineSteps": BASELINE_STEPS}},
        )  # fmt: skip

        def status() -> dict[str, Any]:
            found = status_of(cluster, ns, "on-slowdown")
            phase = found.get("phase")
            if phase and (not phases or phases[-1] != phase):
                phases.append(phase)
            if phase == "Failed":
                raise AssertionError(f"diagnosis failed: {found}\n{training.logs()}")
            return found

        def judged(after: int) -> dict[str, Any] | None:
            """Watching, with a baseline and a report judged after step `after`."""
            found = status()
            watch = found.get("watch") or {}
            ready = watch.get("baselineStepMs") and watch.get("ruleStep", -1) > after
            return watch if ready and found["phase"] == "Watching" else None

        with logs_on_failure(training, status):
            first = cluster.wait_for(
                lambda: judged(2 * BASELINE_STEPS), "a baseline while Watching", timeout=120
            )
            # Another report at the steady speed: nothing fires.
            watch = cluster.wait_for(
                lambda: judged(first["ruleStep"]), "a second report", timeout=60
            )
            # Every pod got the watch plan.
            for pod in training.pods:
                notes = cluster.core.read_namespaced_pod(pod, ns).metadata.annotations or {}
                plan = json.loads(notes["perfdiag.io/plan"])
                assert plan["action"] == "watch" and plan["steps"] == BASELINE_STEPS, plan
            slow_file.touch()  # rank FAULT_RANK turns slow from its next step

            def ready() -> dict[str, Any] | None:
                found = status()
                ready = condition(found, "Ready")
                return found if ready and ready["status"] == "True" else None

            final = cluster.wait_for(ready, "Ready=True", timeout=300)
        wanted = {"WatchStarted", "SlowdownDetected", "AnalyzerStarted", "VerdictReady"}
        # Events are posted after the status that records them: wait for them.
        events = cluster.wait_for(
            lambda: (
                (found := cluster.events(ns, "on-slowdown"))
                and wanted <= {reason for _, reason in found}
                and found
            ),
            "the diagnosis' events",
            timeout=60,
        )
        wide = cluster.kubectl("get", "pdiag", "on-slowdown", "-n", ns, "-o", "wide").stdout
        # What the suite's Prometheus scraped from the operator (the chart's ServiceMonitor and
        # alerting rules), and every query of the chart's Grafana dashboard for this diagnosis.
        scraped = monitoring_checks.collect(
            prometheus_server, ns, "on-slowdown", trigger=True, outcome="degraded",
            alerts=("PerfdiagJobSlowedDown", "PerfdiagVerdictDegraded"), dashboard=True,
        )  # fmt: skip
        diagnosis = cluster.get(ns, "on-slowdown") or {}

    print(f"\nbaseline before the slowdown: {watch}", flush=True)
    print(f"scraped: {monitoring_checks.describe(scraped)}", flush=True)
    assert phases[0] in ("Pending", "Watching") and "Watching" in phases, phases
    assert phases.index("Watching") < phases.index("Succeeded"), phases
    assert final["phase"] == "Succeeded", final
    fired = final["watch"]["slowdown"]
    assert fired["thresholdPercent"] == PERCENT and fired["steps"] == BASELINE_STEPS, fired
    assert fired["meanStepMs"] >= (1 + PERCENT / 100) * fired["baselineStepMs"], fired
    window = final["window"]
    assert window["startStep"] > fired["step"], (window, fired)
    verdict = final["verdict"]
    assert verdict["status"] == "degraded", verdict
    assert FAULT_RANK in verdict["culpritRanks"], verdict
    # (which finding comes first depends on the host's load: other ranks may be named too)
    assert any(FAULT_RANK in f["ranks"] for f in verdict["topFindings"]), verdict
    # What fired is in the capture and in the verdict.
    prefix = final["artifacts"]["prefix"]
    trigger = json.loads(open_storage(prefix).get_text("trigger.json"))
    assert trigger["step"] == fired["step"] and trigger["rank"] == fired["rank"]
    stored = json.loads(open_storage(prefix).get_text("verdict.json"))
    assert stored.get("trigger") and stored["trigger"]["step"] == fired["step"], stored
    reasons = [reason for _, reason in events]
    assert {"WatchStarted", "SlowdownDetected", "AnalyzerStarted", "VerdictReady"} <= set(
        reasons
    ), events
    # kubectl get -o wide shows the step time and the baseline.
    header = wide.splitlines()[0].split()
    assert "STEP-MS" in header and "BASELINE-MS" in header, wide
    # The plan is gone from the pods once the capture ended.
    for pod in training.pods:
        annotations = cluster.core.read_namespaced_pod(pod, ns).metadata.annotations or {}
        assert "perfdiag.io/plan" not in annotations
    # Prometheus holds STEP-MS and BASELINE-MS, the ratio, the rule's threshold, the verdict,
    # findings and culprits as the status says; the slowdown and the verdict alerted; every
    # panel of the dashboard has data for this diagnosis.
    monitoring_checks.assert_matches_status(scraped, diagnosis, percent=PERCENT)
    monitoring_checks.assert_counted(scraped, diagnosis, trigger=True, pods=len(training.pods))
    [slowed] = scraped.alerts["PerfdiagJobSlowedDown"]
    assert slowed["target"] == training.name and "× its baseline" in slowed["_description"]
    empty = [panel for panel, found in scraped.panels.items() if not found]
    assert scraped.panels and not empty, scraped.panels
