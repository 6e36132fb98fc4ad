"""Helpers for the operator's cluster tests: CRDs installed once, the operator run in-process
with kopf.testing.KopfRunner, objects read with the kubernetes client, waits that poll.

Tests get everything through the `cluster` fixture (conftest modules are not importable under
--import-mode=importlib)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kopf.testing import KopfRunner

from perfdiag.api.diagnosis import GROUP, PLURAL, VERSION

ROOT = Path(__file__).resolve().parents[2]
KUBEFLOW = ROOT.parent / "shared" / "kubeflow"
PERFDIAG_CRD = ROOT / "crds" / "perfdiagnosis.yaml"
KUBEFLOW_CRDS = (
    KUBEFLOW / "kubeflow.org_pytorchjobs.yaml",
    KUBEFLOW / "trainer.kubeflow.org_trainjobs.yaml",
)
RECHECK_SECONDS = 1.0

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    """Poll `probe` until it returns something truthy; fail saying what was awaited."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


class Cluster:
    """The test apiserver through the kubernetes client and kubectl."""

    def __init__(self, kube_cluster: Any) -> None:
        import kubernetes

        self.kube = kube_cluster
        client = kube_cluster.api_client()
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.batch = kubernetes.client.BatchV1Api(client)
        self.ApiException = kubernetes.client.ApiException

    wait_for = staticmethod(wait_for)

    def kubectl(self, *args: str, **kwargs: Any) -> Any:
        return self.kube.kubectl(*args, **kwargs)

    def apply(self, namespace: str, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            )
        except self.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def condition(self, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
        obj = self.get(namespace, name) or {}
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond["type"] == type_:
                return dict(cond)
        return None

    def wait_condition(
        self, namespace: str, name: str, type_: str, status: str, reason: str | None = None
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            cond = self.condition(namespace, name, type_)
            if cond and cond["status"] == status and reason in (None, cond["reason"]):
                return cond
            return None

        return wait_for(probe, f"{name}: {type_}={status} ({reason or 'any reason'})")

    def events(self, namespace: str, name: str) -> list[tuple[str, str]]:
        """(type, reason) of the operator's Events on a PerfDiagnosis."""
        items = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        ).items
        ours = [e for e in items if e.source and e.source.component == "perfdiag-operator"]
        return sorted((e.type, e.reason) for e in ours)

    def wait_events(self, namespace: str, name: str, expected: list[tuple[str, str]]) -> None:
        """Wait until the operator's Events on `name` are exactly `expected`, in any order (their
        timestamps have one-second resolution). Events are posted right after the status
        write they announce."""
        seen: list[list[tuple[str, str]]] = []

        def probe() -> bool:
            seen.append(self.events(namespace, name))
            return sorted(seen[-1]) == sorted(expected)

        try:
            wait_for(probe, f"events {expected} on {name}", timeout=15)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen: {seen[-1] if seen else None}") from None

    def create_pods(self, namespace: str, labels: dict[str, str], *names: str) -> None:
        for name in names:
            self.core.create_namespaced_pod(
                namespace,
                {
                    "metadata": {"name": name, "labels": labels},
                    "spec": {"containers": [{"name": "pytorch", "image": "pytorch:none"}]},
                },
            )

    @staticmethod
    @contextmanager
    def operator(namespace: str) -> Iterator[KopfRunner]:
        """The operator, as `kopf run -m perfdiag.operator.handlers`, serving one namespace
        (needs the `operator_env` fixture)."""
        args = ["run", "--standalone", "--namespace", namespace, "-m", "perfdiag.operator.handlers"]
        with KopfRunner(args, timeout=60) as runner:
            yield runner
        assert runner.exception is None, runner.output
        assert runner.exit_code == 0, runner.output

    @staticmethod
    def diagnosis(name: str, target: dict[str, Any], **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "PerfDiagnosis",
            "metadata": {"name": name},
            "spec": {"target": target, **spec},
        }

    @staticmethod
    def pytorchjob(name: str) -> dict[str, Any]:
        """The training-operator's own CPU example, renamed."""
        job: dict[str, Any] = yaml.safe_load((KUBEFLOW / "example-cpu-demo.yaml").read_text())
        job["metadata"]["name"] = name
        return job

    @staticmethod
    def pytorchjob_pod_labels(job: str) -> dict[str, str]:
        """The labels the training-operator puts on a PyTorchJob's pods."""
        return {
            "training.kubeflow.org/job-name": job,
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-type": "worker",
        }


@pytest.fixture(scope="session")
def crds_installed(kube_cluster: Any) -> Any:
    """The PerfDiagnosis CRD (the committed file) and the real Kubeflow CRDs."""
    for path in (PERFDIAG_CRD, *KUBEFLOW_CRDS):
        kube_cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(path), timeout=120
        )
    names = [
        yaml.safe_load(p.read_text())["metadata"]["name"] for p in (PERFDIAG_CRD, *KUBEFLOW_CRDS)
    ]
    kube_cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names]
    )
    return kube_cluster


@pytest.fixture
def cluster(crds_installed: Any) -> Cluster:
    return Cluster(crds_installed)


@pytest.fixture
def operator_env(kube_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the in-process operator reads: the test cluster's kubeconfig, a short recheck."""
    for key, value in kube_cluster.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PERFDIAG_RECHECK_SECONDS", str(RECHECK_SECONDS))
    # Where captures would go (nothing is written before a capture is armed).
    monkeypatch.setenv("PERFDIAG_STORAGE", "s3://perfdiag-test/perfdiag")
    for key in [k for k in os.environ if k.startswith("PERFDIAG_WEBHOOK_")]:
        monkeypatch.delenv(key)


@pytest.fixture(scope="session")
def webhook_tls(kube_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A serving certificate for 127.0.0.1 signed by the test cluster's CA (the apiserver
    verifies the webhook with that CA, the caBundle kopf writes)."""
    from perfdiag_testing.certs import make_serving_cert

    return make_serving_cert(
        kube_cluster.certs.ca_cert,
        kube_cluster.certs.ca_key,
        tmp_path_factory.mktemp("webhook-tls"),
        "perfdiag-webhook",
    )


TEST_IMAGE = "perfdiag:test"


@pytest.fixture
def webhook_env(
    operator_env: None,
    kube_cluster: Any,
    webhook_tls: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """The operator serves the pod webhook on https://127.0.0.1:<free port> with the test CA,
    and injects agents writing to s3://<bucket>/perfdiag. Returns the storage root."""
    from perfdiag_testing.processes import free_port

    cert, key = webhook_tls
    monkeypatch.setenv("PERFDIAG_WEBHOOK_PORT", str(free_port()))
    monkeypatch.setenv("PERFDIAG_WEBHOOK_ADDR", "127.0.0.1")
    monkeypatch.setenv("PERFDIAG_WEBHOOK_CERT", str(cert))
    monkeypatch.setenv("PERFDIAG_WEBHOOK_KEY", str(key))
    monkeypatch.setenv("PERFDIAG_WEBHOOK_CA", str(kube_cluster.certs.ca_cert))
    monkeypatch.setenv("PERFDIAG_IMAGE", TEST_IMAGE)
    storage = "s3://perfdiag-test/perfdiag"
    monkeypatch.setenv("PERFDIAG_STORAGE", storage)
    return storage


@pytest.fixture
def operator_metrics(prometheus_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The in-process operator serves its metrics where the suite's Prometheus scrapes them
    (as the chart's ServiceMonitor says); returns that Prometheus."""
    monkeypatch.setenv("PERFDIAG_METRICS_PORT", str(prometheus_server.operator_port))
    monkeypatch.setenv("PERFDIAG_METRICS_ADDR", "127.0.0.1")
    return prometheus_server


@pytest.fixture
def e2e_env(
    webhook_env: str, minio_server: Any, operator_metrics: Any, monkeypatch: pytest.MonkeyPatch
) -> str:
    """The operator's storage: s3://<bucket>/perfdiag on the suite's MinIO (restarted if a test
    stopped it), its credentials in the operator's environment, its metrics scraped by the
    suite's Prometheus. Returns the storage root."""
    if not minio_server.running():
        minio_server.start()
    for key, value in minio_server.env().items():
        monkeypatch.setenv(key, value)
    root = f"s3://{minio_server.bucket}/perfdiag"
    monkeypatch.setenv("PERFDIAG_STORAGE", root)
    # The capture lead is the operator's default: the one a cluster gets.
    monkeypatch.delenv("PERFDIAG_CAPTURE_LEAD_SECONDS", raising=False)
    return root
