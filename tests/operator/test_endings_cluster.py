"""Every way a diagnosis ends leaves nothing on the target's pods, and a spec change after the
analysis is shown for what it is: the operator in-process on the real kube-apiserver and MinIO.

No kubelet, no training: the suite writes what the agents would (their status.json, stack
dumps) into the capture's storage, sets the pods' phase as the kubelet would, and plays the Job
controller for the analyzer Job (its status). The pods are created already injected (the
webhook's annotation), so the operator sends its plans to them as in a real cluster.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from perfdiag.api.verdict import Finding, StepTimes, Verdict, WindowInfo, WorkerInfo
from perfdiag.api.worker import WorkerStatus
from perfdiag.collector.pod_plan import PodPlanFollower
from perfdiag.operator.analyzer_job import job_name
from perfdiag.operator.coordination import plan_id, stacks_plan_id, watch_plan_id
from perfdiag.storage import layout, open_storage

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("capture_env")]

PLAN = "perfdiag.io/plan"
DIAGNOSIS = "perfdiag.io/diagnosis"
PODS = ("bert-master-0", "bert-worker-0")  # one rank each: 2 ranks expected
STEP_MS = 100.0
LEAD_SECONDS = 2


@pytest.fixture
def capture_env(operator_env: None, minio_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The operator's storage on the suite's MinIO, a short lead; returns the storage root."""
    if not minio_server.running():
        minio_server.start()
    for key, value in minio_server.env().items():
        monkeypatch.setenv(key, value)
    root = f"s3://{minio_server.bucket}/perfdiag"
    monkeypatch.setenv("PERFDIAG_STORAGE", root)
    monkeypatch.setenv("PERFDIAG_CAPTURE_LEAD_SECONDS", str(LEAD_SECONDS))
    return root


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Diagnosis:
    """One diagnosis of the PyTorchJob `bert` in `ns`, and what the suite plays around it."""

    cluster: Any
    ns: str
    name: str
    root: str

    # ---- the object --------------------------------------------------------------------------
    def obj(self) -> dict[str, Any]:
        found = self.cluster.get(self.ns, self.name)
        assert found is not None, f"{self.name} is gone"
        return dict(found)

    @property
    def uid(self) -> str:
        return str(self.obj()["metadata"]["uid"])

    @property
    def capture(self) -> str:
        return plan_id(self.name, self.uid)

    @property
    def prefix(self) -> str:
        return f"{self.root}/{self.ns}/{self.capture}"

    def wait_phase(self, *phases: str, timeout: float = 60.0) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status = (self.cluster.get(self.ns, self.name) or {}).get("status") or {}
            return status if status.get("phase") in phases else None

        status: dict[str, Any] = self.cluster.wait_for(
            probe, f"{self.name} in phase {' or '.join(phases)}", timeout=timeout
        )
        return status

    def stalled(self, reason: str) -> dict[str, Any]:
        status = self.wait_phase("Failed")
        cond = self.cluster.wait_condition(self.ns, self.name, "Stalled", "True", reason)
        return {**status, "stalled": cond}

    def patch_spec(self, spec: dict[str, Any]) -> None:
        self.cluster.kubectl(
            "patch", "pdiag", self.name, "-n", self.ns, "--type=merge",
            "-p", json.dumps({"spec": spec}),
        )  # fmt: skip

    # ---- the pods ------------------------------------------------------------------------------
    def notes(self) -> dict[str, dict[str, str]]:
        """Pod → what perfdiag's plan and diagnosis annotations hold on it."""
        found = {}
        for pod in self.cluster.core.list_namespaced_pod(self.ns).items:
            notes = pod.metadata.annotations or {}
            found[pod.metadata.name] = {k: v for k, v in notes.items() if k in (PLAN, DIAGNOSIS)}
        return found

    def plans(self) -> dict[str, str | None]:
        """Pod → the id of the plan on it."""
        return {
            pod: json.loads(notes[PLAN])["id"] if PLAN in notes else None
            for pod, notes in self.notes().items()
        }

    def stored_plans(self) -> dict[str, str | None]:
        """Pod → the id of the plan its agent reads in storage (its plan object, or the watch
        plan's successor)."""
        storage = open_storage(f"{self.root}/{self.ns}")
        found: dict[str, str | None] = {}
        for pod in self.cluster.core.list_namespaced_pod(self.ns).items:
            # The spool is not written: current_plan only reads storage.
            spool = Path("unused-spool")
            agent = PodPlanFollower(storage, pod.metadata.uid, spool, follow_successors=True)
            text = agent.current_plan()
            assert text is not None, "storage could not be read"
            found[pod.metadata.name] = json.loads(text)["id"] if text else None
        return found

    def wait_plans(self, plan: str) -> None:
        """Until every pod has the plan, on it and in storage (written first)."""
        self.cluster.wait_for(
            lambda: set(self.plans().values()) == {plan}, f"plan {plan} on every pod"
        )
        assert set(self.stored_plans().values()) == {plan}, self.stored_plans()

    def finish_pods(self, *pods: str) -> None:
        """The kubelet reports the pods' containers done (the job ended)."""
        for pod in pods or PODS:
            self.cluster.core.patch_namespaced_pod_status(
                pod, self.ns, {"status": {"phase": "Succeeded"}}
            )

    def assert_clean(self) -> None:
        """Nothing of perfdiag's plans is left on any pod, finished ones included, nor in the
        pods' plan objects in storage (removed first)."""
        self.cluster.wait_for(
            lambda: all(not notes for notes in self.notes().values()),
            f"no plan left by {self.name} on the pods",
        )
        assert set(self.stored_plans().values()) == {None}, self.stored_plans()

    # ---- what the agents write -----------------------------------------------------------------
    def report_step_rate(self, step: int = 100) -> None:
        """Every rank's status.json of the watch plan: its step and mean step time."""
        storage = open_storage(f"{self.prefix}-watch")
        now = time.time()
        for rank in range(len(PODS)):
            status = WorkerStatus(
                rank=rank, pod=PODS[rank], plan_id=watch_plan_id(self.capture), step=step,
                last_step_unix=now, updated_unix=now, mean_step_ms=STEP_MS,
                max_step_ms=STEP_MS, mean_steps=10,
            )  # fmt: skip
            storage.put_text(layout.worker_key(rank, layout.STATUS), status.model_dump_json())

    def arm(self) -> None:
        """Watching (the step rate measured) → Capturing: the capture plan on every pod."""
        self.wait_phase("Watching")
        self.wait_plans(watch_plan_id(self.capture))
        self.report_step_rate()
        self.wait_phase("Capturing")
        self.wait_plans(self.capture)

    def report_capture(self, phase: str, *, stalled_s: float = 0.0) -> None:
        storage = open_storage(self.prefix)
        now = time.time()
        for rank in range(len(PODS)):
            status = WorkerStatus(
                rank=rank, pod=PODS[rank], plan_id=self.capture, phase=phase,  # type: ignore[arg-type]
                step=130, last_step_unix=now - stalled_s, updated_unix=now,
            )  # fmt: skip
            storage.put_text(layout.worker_key(rank, layout.STATUS), status.model_dump_json())

    def write_verdict(self, text: str | None = None) -> None:
        verdict = Verdict(
            status="degraded",
            summary="Rank 1 is slowing the job",
            window=WindowInfo(
                start_step=120, steps=5, step_time_ms=StepTimes(median=100, max=150, per_rank={})
            ),
            workers=[WorkerInfo(rank=r, pod=PODS[r]) for r in range(len(PODS))],
            findings=[
                Finding(kind="slow_worker", category="cpu_op", ranks=[1], severity=0.3, message="m")
            ],
        )
        open_storage(self.prefix).put_text(
            layout.VERDICT, verdict.to_json() if text is None else text
        )

    # ---- the Job controller --------------------------------------------------------------------
    def job(self) -> str:
        name = job_name(self.name, self.uid)
        self.cluster.wait_for(lambda: self._read_job(name), f"the analyzer Job {name}", timeout=30)
        return name

    def _read_job(self, name: str) -> bool:
        try:
            self.cluster.batch.read_namespaced_job(name, self.ns)
        except self.cluster.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def finish_job(self, ok: bool) -> None:
        name = self.job()
        now = _now()

        def condition(type_: str, reason: str) -> dict[str, str]:
            return {"type": type_, "status": "True", "reason": reason, "message": "",
                    "lastProbeTime": now, "lastTransitionTime": now}  # fmt: skip

        self._job_status(name, {"startTime": now, "active": 1})
        if ok:
            done = {
                "active": 0, "succeeded": 1, "completionTime": now,
                "conditions": [condition("SuccessCriteriaMet", "CompletionsReached"),
                               condition("Complete", "CompletionsReached")],
            }  # fmt: skip
        else:
            done = {
                "active": 0, "failed": 2,
                "conditions": [condition("FailureTarget", "BackoffLimitExceeded"),
                               condition("Failed", "BackoffLimitExceeded")],
            }  # fmt: skip
        self._job_status(name, done)

    def _job_status(self, name: str, status: dict[str, Any]) -> None:
        self.cluster.batch.patch_namespaced_job_status(name, self.ns, {"status": status})


@contextmanager
def diagnosing(
    cluster: Any, ns: str, root: str, name: str = "d", **spec: Any
) -> Iterator[Diagnosis]:
    """The job `bert` with its two injected pods, the operator serving `ns`, and `name`
    applied."""
    cluster.apply(ns, cluster.pytorchjob("bert"))
    for pod in PODS:
        cluster.core.create_namespaced_pod(
            ns,
            {
                "metadata": {
                    "name": pod,
                    "labels": cluster.pytorchjob_pod_labels("bert"),
                    "annotations": {"perfdiag.io/injected": "test"},
                },
                "spec": {
                    "containers": [{"name": "pytorch", "image": "pytorch:none"}],
                    # The agent as the webhook injects it: with the pod's uid, it reads the
                    # pod's plan from storage (the operator then plans with the short lead).
                    "initContainers": [
                        {
                            "name": "perfdiag-agent",
                            "image": "perfdiag:none",
                            "restartPolicy": "Always",
                            "env": [
                                {
                                    "name": "POD_UID",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}},
                                },
                                {"name": "PERFDIAG_PLAN_SUCCESSORS", "value": "1"},
                            ],
                        }
                    ],
                },
            },
        )
    with cluster.operator(ns):
        body = cluster.diagnosis(name, {"kind": "PyTorchJob", "name": "bert"}, **spec)
        cluster.apply(ns, body)
        yield Diagnosis(cluster, ns, name, root)


CAPTURE = {"steps": 5, "timeoutSeconds": 600}


# ---- endings ----------------------------------------------------------------------------------


def test_succeeded_after_the_job_finished(
    cluster: Any, kube_namespace: str, capture_env: str
) -> None:
    """The job ends during its window, every rank capturing: its pods are finished (a finished
    pod keeps its annotations unless the operator takes them off), the capture is analyzed."""
    with diagnosing(cluster, kube_namespace, capture_env, capture=CAPTURE) as d:
        d.arm()
        d.report_capture("capturing")
        cluster.wait_for(
            lambda: d.obj()["status"]["workers"]["reporting"] == len(PODS), "the ranks' reports"
        )
        d.finish_pods()
        d.wait_phase("Analyzing")
        d.assert_clean()
        d.write_verdict()
        d.finish_job(ok=True)
        status = d.wait_phase("Succeeded")
        d.assert_clean()
    assert status["verdict"]["culprits"] == "1"
    assert not d.obj()["metadata"].get("finalizers")


def test_ended_before_the_window(cluster: Any, kube_namespace: str, capture_env: str) -> None:
    with diagnosing(cluster, kube_namespace, capture_env, capture=CAPTURE) as d:
        d.arm()
        d.finish_pods()
        status = d.stalled("EndedBeforeWindow")
        d.assert_clean()
    assert "nothing was captured" in status["stalled"]["message"]


def test_target_gone_while_measuring(cluster: Any, kube_namespace: str, capture_env: str) -> None:
    with diagnosing(cluster, kube_namespace, capture_env, capture=CAPTURE) as d:
        d.wait_phase("Watching")
        d.wait_plans(watch_plan_id(d.capture))
        d.finish_pods()
        d.stalled("TargetGone")
        d.assert_clean()


def test_target_gone_while_watching_for_a_slowdown(
    cluster: Any, kube_namespace: str, capture_env: str
) -> None:
    trigger = {"slowdown": {"percent": 10}}
    with diagnosing(cluster, kube_namespace, capture_env, capture=CAPTURE, trigger=trigger) as d:
        d.wait_phase("Watching")
        d.wait_plans(watch_plan_id(d.capture))
        d.finish_pods()
        d.stalled("TargetGone")
        d.assert_clean()


def test_analyzer_failed(cluster: Any, kube_namespace: str, capture_env: str) -> None:
    with diagnosing(cluster, kube_namespace, capture_env, capture=CAPTURE) as d:
        d.arm()
        d.report_capture("done")
        d.wait_phase("Analyzing")
        d.assert_clean()
        d.finish_job(ok=False)
        d.stalled("AnalyzerFailed")
        d.assert_clean()


def test_verdict_unreadable(cluster: Any, kube_namespace: str, capture_env: str) -> None:
    with diagnosing(cluster, kube_namespace, capture_env, capture=CAPTURE) as d:
        d.arm()
        d.report_capture("done")
        d.wait_phase("Analyzing")
        d.write_verdict("{not a verdict")
        d.finish_job(ok=True)
        d.stalled("VerdictUnreadable")
        d.assert_clean()


def test_capture_timed_out(cluster: Any, kube_namespace: str, capture_env: str) -> None:
    """No rank reports before the capture's deadline (lead + timeoutSeconds): the plan goes,
    the analysis runs on what there is."""
    capture = {"steps": 5, "timeoutSeconds": 10}
    with diagnosing(cluster, kube_namespace, capture_env, capture=capture) as d:
        d.arm()
        status = d.wait_phase("Analyzing", timeout=60)
        d.assert_clean()
        assert status["workers"]["missing"] == len(PODS)
        d.finish_job(ok=False)
        d.stalled("AnalyzerFailed")
        d.assert_clean()


def test_stuck_ranks_stacks_plan(cluster: Any, kube_namespace: str, capture_env: str) -> None:
    """Stuck ranks get a stacks plan (another id on the pods); it goes once the dumps are in."""
    analysis = {"stuckAfterSeconds": 1}
    with diagnosing(cluster, kube_namespace, capture_env, capture=CAPTURE, analysis=analysis) as d:
        d.arm()
        d.report_capture("capturing", stalled_s=120)
        d.wait_plans(stacks_plan_id(d.capture))
        dumps = open_storage(f"{d.prefix}-stacks")
        for rank in range(len(PODS)):
            dumps.put_text(layout.worker_key(rank, layout.STACKS), "{}")
        d.wait_phase("Analyzing")
        d.assert_clean()


def test_deleted_while_measuring(cluster: Any, kube_namespace: str, capture_env: str) -> None:
    with diagnosing(cluster, kube_namespace, capture_env, capture=CAPTURE) as d:
        d.wait_phase("Watching")
        d.wait_plans(watch_plan_id(d.capture))
        cluster.wait_for(lambda: d.obj()["metadata"].get("finalizers"), "the finalizer")
        cluster.kubectl("delete", "pdiag", d.name, "-n", d.ns, "--timeout=30s")
        d.assert_clean()


def test_deleted_while_capturing_with_a_finished_pod(
    cluster: Any, kube_namespace: str, capture_env: str
) -> None:
    """One pod finished, the other still runs: deletion takes the plan off both."""
    with diagnosing(cluster, kube_namespace, capture_env, capture=CAPTURE) as d:
        d.arm()
        d.finish_pods(PODS[0])
        cluster.wait_for(lambda: d.obj()["metadata"].get("finalizers"), "the finalizer")
        cluster.kubectl("delete", "pdiag", d.name, "-n", d.ns, "--timeout=30s")
        d.assert_clean()


# ---- generations ------------------------------------------------------------------------------


def _generations(obj: dict[str, Any]) -> dict[str, int]:
    return {c["type"]: c["observedGeneration"] for c in obj["status"]["conditions"]}


def test_an_analysis_change_after_the_verdict_is_shown_not_applied(
    cluster: Any, kube_namespace: str, capture_env: str
) -> None:
    """spec.analysis may change at any time; once the analyzer Job was created, a change is not
    applied to the capture (judged once): ThresholdsApplied says so, with how to judge it
    again. Every condition carries the generation the operator handled."""
    analysis = {"reportSeverity": 0.05}
    with diagnosing(cluster, kube_namespace, capture_env, capture=CAPTURE, analysis=analysis) as d:
        d.arm()
        d.report_capture("done")
        d.wait_phase("Analyzing")
        d.write_verdict()
        d.finish_job(ok=True)
        before = d.wait_phase("Succeeded")
        applied = cluster.wait_condition(d.ns, d.name, "ThresholdsApplied", "True", "Applied")
        assert before["analysis"] == {"generation": 1, "thresholds": analysis}
        assert _generations(d.obj()) == {
            "Ready": 1, "Reconciling": 1, "Stalled": 1, "TargetResolved": 1,
            "ThresholdsApplied": 1,
        }  # fmt: skip

        ready_before = cluster.condition(d.ns, d.name, "Ready")
        d.patch_spec({"analysis": {"reportSeverity": 0.2}})
        stale = cluster.wait_condition(
            d.ns, d.name, "ThresholdsApplied", "False", "ChangedAfterAnalysis"
        )
        assert f"perfdiag analyze {d.prefix} --thresholds" in stale["message"]
        obj = cluster.wait_for(
            lambda: (o := d.obj())["status"]["observedGeneration"] == 2 and o, "generation 2"
        )
        assert set(_generations(obj).values()) == {2}, obj["status"]["conditions"]
        after = obj["status"]
        assert after["verdict"] == before["verdict"] and after["phase"] == "Succeeded"
        assert after["analysis"] == before["analysis"]  # what the verdict was judged with
        assert cluster.condition(d.ns, d.name, "Ready") == {**ready_before, "observedGeneration": 2}

        # A change of something else (the TTL) leaves the verdict's thresholds stale; the same
        # thresholds as the Job's make them current again.
        d.patch_spec({"ttlSecondsAfterFinished": 3600})
        cluster.wait_for(
            lambda: set(_generations(d.obj()).values()) == {3}, "every condition at generation 3"
        )
        assert cluster.condition(d.ns, d.name, "ThresholdsApplied")["status"] == "False"
        d.patch_spec({"analysis": analysis})
        again = cluster.wait_condition(d.ns, d.name, "ThresholdsApplied", "True", "Applied")
        assert again["observedGeneration"] == 4 and again["message"] == applied["message"]


def test_an_analysis_change_while_capturing_applies(
    cluster: Any, kube_namespace: str, capture_env: str
) -> None:
    """Before the analyzer Job exists, the change applies: the Job gets the new thresholds."""
    with diagnosing(cluster, kube_namespace, capture_env, capture=CAPTURE) as d:
        d.arm()
        d.patch_spec({"analysis": {"reportSeverity": 0.2}})
        cluster.wait_for(
            lambda: set(_generations(d.obj()).values()) == {2}, "every condition at generation 2"
        )
        d.report_capture("done")
        status = d.wait_phase("Analyzing")
        assert status["analysis"] == {"generation": 2, "thresholds": {"reportSeverity": 0.2}}
        job = cluster.batch.read_namespaced_job(d.job(), d.ns)
        args = job.spec.template.spec.containers[0].args
        assert args[args.index("--thresholds") + 1] == '{"reportSeverity": 0.2}'
        applied = cluster.wait_condition(d.ns, d.name, "ThresholdsApplied", "True", "Applied")
        assert applied["observedGeneration"] == 2
