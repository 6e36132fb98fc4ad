"""The end-to-end setting, shared by tests/operator/test_e2e*.py: the real control plane and
MinIO, the operator (with its pod webhook) in-process, the Kubeflow example PyTorchJob with an
injected slow rank, and the suite playing the training operator and the kubelet; and what the
tests do with a PerfDiagnosis there (apply it, wait for a phase, a condition, Ready)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from perfdiag.collector.hook import spool
from perfdiag.local.demo.scenarios import TRAIN_SCRIPT
from perfdiag_testing.image import BuiltImage
from perfdiag_testing.kubelet import KUBELET_LOG, LocalKubelet
from perfdiag_testing.local_images import PERFDIAG_IMAGE as PERFDIAG_IMAGE  # (re-exported)
from perfdiag_testing.local_images import TRAINING_IMAGE as TRAINING_IMAGE
from perfdiag_testing.local_images import base_env as base_env
from perfdiag_testing.local_images import images
from perfdiag_testing.processes import free_port
from perfdiag_testing.training_operator import PORT_NAME, pytorchjob_pods

KUBEFLOW = Path(__file__).resolve().parents[2].parent / "shared" / "kubeflow"
FAULT_RANK = 3
SCENARIO = "compute-straggler"


def demo_args(stop_file: Path) -> list[str]:
    """perfdiag's demo training: a slow rank; train until the test says stop."""
    return [
        f"--scenario={SCENARIO}",
        f"--fault-rank={FAULT_RANK}",
        f"--stop-file={stop_file}",
        "--max-seconds=900",
    ]


def pytorchjob(name: str, args: list[str]) -> dict[str, Any]:
    """example-cpu-demo.yaml (2 nodes × nprocPerNode 2 = 4 ranks), changed only where a test
    must: its name, the opt-in label on the pod templates, a free rendezvous port (the
    training operator reads it from the container port named pytorchjob-port) and the
    arguments of demo.py."""
    job: dict[str, Any] = yaml.safe_load((KUBEFLOW / "example-cpu-demo.yaml").read_text())
    job["metadata"]["name"] = name
    port = free_port()
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        template = replica["template"]
        template.setdefault("metadata", {}).setdefault("labels", {})["perfdiag.io/inject"] = "true"
        container = template["spec"]["containers"][0]
        assert container["command"] == ["torchrun", "demo.py"]  # the example as shipped
        container["command"] = [*container["command"], *args]
        container["ports"] = [{"name": PORT_NAME, "containerPort": port}]
    return job


@dataclass
class Training:
    name: str
    uid: str
    pods: list[str]
    kubelet: LocalKubelet
    stop_file: Path

    def spool_of(self, pod: str) -> Path:
        return self.kubelet.pods[pod].root / "volumes" / "perfdiag-spool"

    def plan_file_of(self, pod: str) -> Path:
        """The pod's downward-API plan file, as the kubelet wrote it."""
        return self.kubelet.pods[pod].root / "volumes" / "perfdiag-podinfo" / "plan"

    def steps(self) -> dict[int, int]:
        """Rank → last step seen in the spool heartbeats."""
        found: dict[int, int] = {}
        for pod in self.pods:
            if pod not in self.kubelet.pods:
                continue
            folder = self.spool_of(pod)
            for rank in spool.ranks_in(folder) if folder.exists() else []:
                beat = spool.read_json(spool.rank_dir(folder, rank) / spool.HEARTBEAT)
                if isinstance(beat, dict) and isinstance(beat.get("step"), int):
                    found[rank] = beat["step"]
        return found

    def logs(self) -> str:
        parts = []
        for name, pod in {**self.kubelet.pods, **self.kubelet.jobs}.items():
            failed = [KUBELET_LOG] if pod.log_text(KUBELET_LOG) else []
            for container in [*pod.containers, *failed]:
                parts.append(f"--- {name}/{container}\n{pod.log_text(container)[-3000:]}")
        return "\n".join(parts)


def storage_secret(cluster: Any, namespace: str, minio: Any, **extra: str) -> None:
    """The namespace's perfdiag-storage Secret (the agents' and the analyzer's credentials,
    plus `extra` variables)."""
    cluster.core.create_namespaced_secret(
        namespace,
        {"metadata": {"name": "perfdiag-storage"}, "stringData": {**minio.env(), **extra}},
    )


@contextmanager
def running_training(
    cluster: Any,
    namespace: str,
    workdir: Path,
    name: str = "torchrun-cpu",
    *,
    script: Path = TRAIN_SCRIPT,
    args: list[str] | None = None,
    node_of: Callable[[str], str] | None = None,
    perfdiag_image: BuiltImage | None = None,
    downward_api_resync_s: float | None = None,
) -> Iterator[Training]:
    """The PyTorchJob applied, its pods created as the training operator would, run by the
    local kubelet until the ranks are training; stopped (stop file, then the kubelet) after.
    Default training: perfdiag's demo with a slow rank (`demo_args`). `node_of`: the node each
    pod (by name) runs on (one node by default). `perfdiag_image`: perfdiag's containers (hook
    copy, agent, analyzer Job) run from the built image instead of the development venv.
    `downward_api_resync_s`: the kubelet refreshes the pods' downward-API files only that often
    (LocalKubelet); default: at every sync."""
    stop_file = workdir / f"{name}.stop"
    job = pytorchjob(name, demo_args(stop_file) if args is None else args)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))
    created = cluster.custom.get_namespaced_custom_object(
        "kubeflow.org", "v1", namespace, "pytorchjobs", name
    )
    pods = pytorchjob_pods(created)
    for pod in pods:
        cluster.core.create_namespaced_pod(namespace, pod)
    kubelet = LocalKubelet(
        cluster.kube.api_client(),
        namespace,
        workdir / "kubelet",
        images(workdir, script, perfdiag_image),
        base_env(),
        node_of=node_of,
        downward_api_resync_s=downward_api_resync_s,
    ).start()
    training = Training(name, created["metadata"]["uid"], [p["metadata"]["name"] for p in pods],
                        kubelet, stop_file)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            steps = training.steps()
            if len(steps) == 4 and min(steps.values()) >= 5:
                break
            if any(p.phase == "Failed" for p in kubelet.pods.values()):
                raise AssertionError(f"a training pod failed:\n{training.logs()}")
            time.sleep(0.5)
        else:
            raise AssertionError(f"the 4 ranks did not start training:\n{training.logs()}")
        yield training
    finally:
        stop_file.touch()
        time.sleep(1.0)
        kubelet.stop()


def wait_webhook(cluster: Any, ns: str) -> None:
    """Until the apiserver calls the operator's pod webhook (a dry-run pod gets the hook)."""
    probe_pod = {
        "metadata": {"name": "probe", "labels": {"perfdiag.io/inject": "true"}},
        "spec": {"containers": [{"name": "pytorch", "image": "x"}]},
    }

    def probe() -> bool:
        try:
            pod = cluster.core.create_namespaced_pod(ns, probe_pod, dry_run="All")
        except cluster.ApiException:
            return False
        return bool(pod.spec.init_containers)

    cluster.wait_for(probe, "the pod webhook", timeout=60)


@contextmanager
def serving_operator(cluster: Any, ns: str) -> Iterator[None]:
    """The operator in-process, once the apiserver calls its pod webhook."""
    with cluster.operator(ns):
        wait_webhook(cluster, ns)
        yield


def apply_diagnosis(cluster: Any, ns: str, name: str, job: str, **spec: Any) -> None:
    """`kubectl apply` of the PerfDiagnosis `name` of the PyTorchJob `job`; `spec`: the rest of
    its spec (capture, analysis, trigger…)."""
    cluster.apply(ns, cluster.diagnosis(name, {"kind": "PyTorchJob", "name": job}, **spec))


def status_of(cluster: Any, ns: str, name: str) -> dict[str, Any]:
    return dict((cluster.get(ns, name) or {}).get("status") or {})


def condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)


def wait_phase(
    cluster: Any, ns: str, name: str, *phases: str, timeout: float = 240
) -> dict[str, Any]:
    """Until `name` is in one of `phases`; returns its status."""

    def probe() -> dict[str, Any] | None:
        status = status_of(cluster, ns, name)
        return status if status.get("phase") in phases else None

    return cluster.wait_for(probe, f"{name} in phase {phases}", timeout=timeout)  # type: ignore[no-any-return]


def wait_reconciling(
    cluster: Any, ns: str, name: str, reason: str, timeout: float = 30
) -> dict[str, Any]:
    """Until `name`'s Reconciling condition gives `reason`; returns the condition."""

    def probe() -> dict[str, Any] | None:
        found = condition(status_of(cluster, ns, name), "Reconciling")
        return found if found and found["reason"] == reason else None

    return cluster.wait_for(probe, f"{name} reconciling: {reason}", timeout=timeout)  # type: ignore[no-any-return]


def wait_ready(cluster: Any, ns: str, name: str, timeout: float = 300) -> dict[str, Any]:
    """Until `name` is Ready=True (its verdict in status); fails at once when it failed.
    Returns the object."""

    def probe() -> dict[str, Any] | None:
        obj = cluster.get(ns, name) or {}
        status = obj.get("status") or {}
        if status.get("phase") == "Failed":
            raise AssertionError(f"diagnosis failed: {status}")
        ready = condition(status, "Ready")
        return obj if ready and ready["status"] == "True" else None

    return cluster.wait_for(probe, f"{name} Ready=True", timeout=timeout)  # type: ignore[no-any-return]


@contextmanager
def logs_on_failure(training: Training, *more: Callable[[], object]) -> Iterator[None]:
    """A failed wait inside says also what `more` gives and what the job's containers logged."""
    try:
        yield
    except AssertionError as exc:
        extra = "".join(f"\n{give()}" for give in more)
        raise AssertionError(f"{exc}{extra}\n{training.logs()}") from None
