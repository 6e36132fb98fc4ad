"""The chart against the real kube-apiserver of the test fixtures: kubeconform -strict with
schemas made offline from that apiserver's OpenAPI v3 (and the PerfDiagnosis CRD), server-side
apply of every variant, the RBAC of the chart's ServiceAccount (kubectl auth can-i --as), and
the operator run with that ServiceAccount's token exactly as the chart's Deployment runs it."""

from __future__ import annotations

import base64
import http.client
import json
import os
import secrets
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfdiag.operator.injection import InjectionConfig, inject
from perfdiag_testing.image import BuiltImage, run_in_image
from perfdiag_testing.kube import KubeCluster
from perfdiag_testing.kube_schemas import (
    fetch_openapi_v3,
    schema_location,
    write_builtin_schemas,
    write_crd_schemas,
)
from perfdiag_testing.processes import free_port
from tests.chart.chart_support import (
    CERT_MANAGER_KINDS,
    CHART,
    EXAMPLES,
    PROMETHEUS_OPERATOR_CRDS,
    ROOT,
    VARIANTS,
    by_kind,
    objects,
    render,
    tool,
)

pytestmark = pytest.mark.cluster

# The real Kubeflow CRDs (../shared/kubeflow): the PyTorchJob example is validated against them.
KUBEFLOW_CRDS = (
    ROOT.parent / "shared" / "kubeflow" / "kubeflow.org_pytorchjobs.yaml",
    ROOT.parent / "shared" / "kubeflow" / "trainer.kubeflow.org_trainjobs.yaml",
)


@pytest.fixture(scope="module")
def schemas(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kubeconform-schemas")
    docs = fetch_openapi_v3(kube_cluster.server, kube_cluster.ssl_context())
    assert len(write_builtin_schemas(docs, root)) > 50
    for path in (CHART / "crds" / "perfdiagnosis.yaml", *KUBEFLOW_CRDS, *PROMETHEUS_OPERATOR_CRDS):
        assert write_crd_schemas(yaml.safe_load(path.read_text()), root)
    return root


def kubeconform(schemas: Path, manifest: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            tool("kubeconform"),
            "-strict",
            "-summary",
            "-output=text",
            f"-schema-location={schema_location(schemas)}",
            *extra,
            "-",
        ],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_kubeconform_strict_accepts_each_variant(schemas: Path, variant: str) -> None:
    manifest = render(variant, extra=("--include-crds",))
    # cert-manager's CRDs are not available offline; its two kinds are skipped, and said so.
    skip = ("-skip=" + ",".join(CERT_MANAGER_KINDS),) if variant == "cert-manager" else ()
    result = kubeconform(schemas, manifest, *skip)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Invalid: 0, Errors: 0" in result.stdout


def test_kubeconform_strict_accepts_the_examples(schemas: Path) -> None:
    assert EXAMPLES
    manifest = "\n---\n".join(p.read_text() for p in EXAMPLES)
    result = kubeconform(schemas, manifest)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Valid: {len(EXAMPLES)}, Invalid: 0" in result.stdout


@pytest.mark.parametrize(
    ("mutate", "complaint"),
    [
        (lambda d: d["spec"]["capture"].update(stepz=3), "stepz"),
        (lambda d: d["spec"]["capture"].update(steps="ten"), "steps"),
        (lambda d: d["spec"].update(target={"kind": "Deployment", "name": "x"}), "kind"),
    ],
)
def test_kubeconform_rejects_a_broken_diagnosis(schemas: Path, mutate: Any, complaint: str) -> None:
    doc = yaml.safe_load(next(p for p in EXAMPLES if "trainjob" in p.name).read_text())
    mutate(doc)
    result = kubeconform(schemas, yaml.safe_dump(doc))
    assert result.returncode == 1
    assert complaint in result.stdout


@pytest.mark.parametrize(
    ("kind", "mutate", "complaint"),
    [
        (
            "ServiceMonitor",
            lambda d: d["spec"]["endpoints"][0].update(honorLabel=True),
            "honorLabel",
        ),
        (
            "PrometheusRule",
            lambda d: d["spec"]["groups"][0]["rules"][0].update(annotation={}),
            "annotation",
        ),
    ],
)
def test_kubeconform_judges_the_monitoring_kinds_by_their_crds(
    schemas: Path, kind: str, mutate: Any, complaint: str
) -> None:
    """The Prometheus Operator's CRDs (../shared/prometheus-operator) really are the schemas:
    a misspelt field or a wrong type is refused."""
    [doc] = by_kind(objects(render("monitoring")), kind)
    assert kubeconform(schemas, yaml.safe_dump(doc)).returncode == 0
    mutate(doc)
    result = kubeconform(schemas, yaml.safe_dump(doc))
    assert result.returncode == 1 and complaint in result.stdout, result.stdout


def test_kubeconform_rejects_an_unknown_field_in_a_builtin_kind(schemas: Path) -> None:
    docs = objects(render("defaults"))
    [deployment] = by_kind(docs, "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    result = kubeconform(schemas, yaml.safe_dump(deployment))
    assert result.returncode == 1
    assert "securityContex" in result.stdout


def _apply(cluster: KubeCluster, manifest: str) -> None:
    cluster.kubectl(
        "apply",
        "--server-side",
        "--field-manager=helm-test",
        "-f",
        "-",
        input=manifest,
        timeout=120,
    )


@pytest.fixture(scope="module")
def crd(kube_cluster: KubeCluster) -> None:
    """The chart's CRD, the real Kubeflow CRDs (so `can-i` resolves their resources) and the
    Prometheus Operator's (the monitoring variant's ServiceMonitor and PrometheusRule)."""
    paths = [CHART / "crds" / "perfdiagnosis.yaml", *KUBEFLOW_CRDS, *PROMETHEUS_OPERATOR_CRDS]
    for path in paths:
        kube_cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(path), timeout=120
        )
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in paths]
    kube_cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names]
    )


class Release:
    def __init__(self, cluster: KubeCluster, name: str, namespace: str, docs: list[Any]) -> None:
        self.cluster, self.name, self.namespace, self.docs = cluster, name, namespace, docs
        [sa] = by_kind(docs, "ServiceAccount")
        self.user = f"system:serviceaccount:{namespace}:{sa['metadata']['name']}"
        self.sa = sa["metadata"]["name"]

    def can(self, verb: str, resource: str, namespace: str | None = None) -> bool:
        where = ["-n", namespace] if namespace else ["--all-namespaces"]
        result = self.cluster.kubectl(
            "auth", "can-i", verb, resource, *where, f"--as={self.user}", check=False
        )
        assert result.stdout.strip() in ("yes", "no"), result.stderr
        return result.stdout.strip() == "yes"


@pytest.fixture
def install(kube_cluster: KubeCluster, crd: None) -> Iterator[Any]:
    """helm template | kubectl apply --server-side into a fresh namespace; cluster-scoped
    objects (roles, the webhook configuration) are deleted afterwards so the webhook of one
    test never sees the pods of another."""
    releases: list[Release] = []

    def do(variant: str, *sets: str) -> Release:
        name = f"pd{secrets.token_hex(3)}"
        namespace = f"rel-{name}"
        kube_cluster.kubectl("create", "namespace", namespace)
        extra = tuple(a for s in sets for a in ("--set", s))
        docs = objects(render(variant, release=name, namespace=namespace, extra=extra))
        if variant == "cert-manager":
            docs = [d for d in docs if d["kind"] not in CERT_MANAGER_KINDS]
        _apply(kube_cluster, "\n---\n".join(yaml.safe_dump(d) for d in docs))
        release = Release(kube_cluster, name, namespace, docs)
        releases.append(release)
        return release

    yield do
    for release in releases:
        for doc in release.docs:
            if "namespace" not in doc["metadata"]:
                kind, name = doc["kind"], doc["metadata"]["name"]
                kube_cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)


@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - {"namespaced"}))
def test_server_side_apply_of_each_variant(install: Any, variant: str) -> None:
    release = install(variant)
    for doc in release.docs:
        meta = doc["metadata"]
        where = ["-n", meta["namespace"]] if "namespace" in meta else []
        got = json.loads(
            release.cluster.kubectl("get", doc["kind"], meta["name"], *where, "-o", "json").stdout
        )
        assert got["metadata"]["labels"]["app.kubernetes.io/instance"] == release.name
    if variant != "no-webhook":
        [config] = by_kind(release.docs, "MutatingWebhookConfiguration")
        stored = json.loads(
            release.cluster.kubectl(
                "get", "mutatingwebhookconfiguration", config["metadata"]["name"], "-o", "json"
            ).stdout
        )
        assert stored["webhooks"][0]["timeoutSeconds"] <= 10
        assert stored["webhooks"][0]["failurePolicy"] == "Ignore"


# What the operator does (operator/kube.py, and kopf around it), namespace-scoped.
NEEDED = [
    ("get", "perfdiagnoses.perfdiag.io"),
    ("list", "perfdiagnoses.perfdiag.io"),
    ("watch", "perfdiagnoses.perfdiag.io"),
    ("patch", "perfdiagnoses.perfdiag.io"),
    ("delete", "perfdiagnoses.perfdiag.io"),
    ("patch", "perfdiagnoses.perfdiag.io/status"),
    ("get", "pods"),
    ("list", "pods"),
    ("patch", "pods"),
    ("get", "jobs.batch"),
    ("create", "jobs.batch"),
    ("delete", "jobs.batch"),
    ("get", "pytorchjobs.kubeflow.org"),
    ("get", "trainjobs.trainer.kubeflow.org"),
    ("create", "events"),
]
NOT_NEEDED = [
    ("get", "secrets"),
    ("list", "secrets"),
    ("create", "pods"),
    ("delete", "pods"),
    ("update", "perfdiagnoses.perfdiag.io"),
    ("create", "perfdiagnoses.perfdiag.io"),
    ("patch", "deployments.apps"),
    ("create", "rolebindings.rbac.authorization.k8s.io"),
    ("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io"),
]


def test_cluster_wide_rbac_is_what_the_operator_needs_and_no_more(
    install: Any, kube_namespace: str
) -> None:
    release = install("storage")
    for verb, resource in NEEDED:
        assert release.can(verb, resource, kube_namespace), f"cannot {verb} {resource}"
        assert release.can(verb, resource), f"cannot {verb} {resource} in all namespaces"
    assert release.can("list", "customresourcedefinitions.apiextensions.k8s.io")
    for verb, resource in NOT_NEEDED:
        assert not release.can(verb, resource, kube_namespace), f"can {verb} {resource}"
    # Secrets: neither elsewhere nor in its own namespace (it reads its credentials by envFrom).
    assert not release.can("get", "secrets", "kube-system")
    assert not release.can("get", "secrets", release.namespace)
    assert not release.can("list", "secrets")
    assert not release.can("list", "namespaces")


def test_namespaced_rbac_stops_at_the_listed_namespaces(
    install: Any, kube_cluster: KubeCluster
) -> None:
    team = f"team-{secrets.token_hex(3)}"
    other = f"other-{secrets.token_hex(3)}"
    for ns in (team, other):
        kube_cluster.kubectl("create", "namespace", ns)
    release = install("namespaced", f"watchNamespaces={{{team}}}")
    for verb, resource in NEEDED:
        assert release.can(verb, resource, team), f"cannot {verb} {resource} in {team}"
        assert not release.can(verb, resource, other), f"can {verb} {resource} in {other}"
    assert not release.can("list", "pods")  # not cluster-wide
    assert release.can("list", "namespaces")  # kopf finds the namespaces it serves
    assert not release.can("get", "secrets", team)
    assert not release.can("get", "secrets", other)


def _token_kubeconfig(cluster: KubeCluster, release: Release, path: Path) -> Path:
    """A kubeconfig with a real token of the chart's ServiceAccount (TokenRequest API)."""
    token = cluster.kubectl(
        "create", "token", release.sa, "-n", release.namespace, "--duration=1h"
    ).stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority-data": base64.b64encode(
                        cluster.ca_file.read_bytes()
                    ).decode(),
                },
            }
        ],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _wait(probe: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def test_operator_runs_under_the_chart_service_account_token(
    install: Any,
    kube_cluster: KubeCluster,
    minio_server: Any,
    tmp_path: Path,
    perfdiag_image: BuiltImage,
) -> None:
    """The chart's Deployment command and environment (webhook enabled, with the chart's
    generated certificate), with the ServiceAccount's own token instead of admin: the webhook
    server answers an AdmissionReview with the chart's values, kopf leaves the chart's
    MutatingWebhookConfiguration alone (PERFDIAG_WEBHOOK_MANAGE=false; the chart's RBAC could
    not let it write one), a diagnosis of a missing pod stalls (status, events), one of an
    injected pod arms the capture (plan in storage and on the pod), deleting it while
    capturing takes the plan off the pod again (the finalizer), and a third one runs to its
    verdict: capture in storage, window ended and plan removed, analyzer Job created and
    watched, verdict, artifacts, Ready and Events written. Nothing in the log is Forbidden."""
    team = f"team-{secrets.token_hex(3)}"
    kube_cluster.kubectl("create", "namespace", team)
    storage = f"s3://{minio_server.bucket}/chart-{secrets.token_hex(3)}"
    release = install(
        "namespaced",
        f"watchNamespaces={{{team}}}",
        f"storage.uri={storage}",
        "storage.endpoint=http://minio.example:9000",
        "agent.resources.requests.cpu=250m",
    )
    sa_kubeconfig = _token_kubeconfig(kube_cluster, release, tmp_path / "sa-kubeconfig")
    whoami = subprocess.run(
        [tool("kubectl"), f"--kubeconfig={sa_kubeconfig}", "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == release.user

    [deployment] = by_kind(release.docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.update(minio_server.env())  # what envFrom of the credentials Secret gives the pod
    env["PERFDIAG_RECHECK_SECONDS"] = "1"
    # The webhook TLS Secret as the pod mounts it, and a free port instead of the pod's own.
    assert env["PERFDIAG_WEBHOOK_MANAGE"] == "false"
    [tls] = [d for d in by_kind(release.docs, "Secret") if d["type"] == "kubernetes.io/tls"]
    for key in ("tls.crt", "tls.key"):
        (tmp_path / key).write_bytes(base64.b64decode(tls["data"][key]))
    ca_pem = base64.b64decode(tls["data"]["ca.crt"]).decode()
    port = free_port()
    env.update(
        PERFDIAG_WEBHOOK_CERT=str(tmp_path / "tls.crt"),
        PERFDIAG_WEBHOOK_KEY=str(tmp_path / "tls.key"),
        PERFDIAG_WEBHOOK_PORT=str(port),
        PERFDIAG_WEBHOOK_ADDR="127.0.0.1",
    )
    # The metrics port the chart sets (8081 on all addresses), here a free one on loopback.
    assert (env["PERFDIAG_METRICS_PORT"], env["PERFDIAG_METRICS_ADDR"]) == ("8081", "0.0.0.0")
    metrics_port = free_port()
    env.update(PERFDIAG_METRICS_PORT=str(metrics_port), PERFDIAG_METRICS_ADDR="127.0.0.1")
    [config] = by_kind(release.docs, "MutatingWebhookConfiguration")
    config_name = config["metadata"]["name"]
    before = json.loads(
        kube_cluster.kubectl(
            "get", "mutatingwebhookconfiguration", config_name, "-o", "json"
        ).stdout
    )
    args = [a for a in container["args"] if not a.startswith("--liveness")]
    args = [a if not a.startswith("--recheck-seconds") else "--recheck-seconds=1" for a in args]
    log = tmp_path / "operator.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("perfdiag")), *args],
            env={**os.environ, **env, "KUBECONFIG": str(sa_kubeconfig)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        try:
            _exercise_webhook(port, ca_pem, team, storage)
            _exercise_operator(kube_cluster, team, storage, minio_server, perfdiag_image, tmp_path)
            _check_metrics(metrics_port, team)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\noperator log:\n{log.read_text()[-6000:]}") from exc
        assert proc.poll() is None, log.read_text()[-4000:]  # still running
        text = log.read_text()
        # How a 403 shows in the log: kopf's APIForbiddenError and the API's reason both read
        # "Forbidden", an error repr has status=403, aiohttp's access log has the status after
        # the request line. A bare "403" is no sign: a timestamp's milliseconds may read 403.
        for sign in ("Forbidden", "status=403", '" 403 '):
            assert sign not in text, text[-4000:]
        after = json.loads(
            kube_cluster.kubectl(
                "get", "mutatingwebhookconfiguration", config_name, "-o", "json"
            ).stdout
        )
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert after["webhooks"] == before["webhooks"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _check_metrics(port: int, ns: str) -> None:
    """The operator's /metrics under the chart's settings: the webhook's admission, the
    diagnoses (one stalled, one with its verdict) and the analyzer Job it started."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    verdict = _wait(
        lambda: next(
            (line for line in text.splitlines() if line.startswith("perfdiag_diagnosis_verdict{")),
            None,
        ),
        "the verdict in /metrics",
        1,
    )
    assert f'namespace="{ns}"' in verdict and 'diagnosis="complete"' in verdict, verdict
    for line in (
        'perfdiag_webhook_admissions_total{result="injected"} 1.0',
        "perfdiag_analyzer_jobs_started_total 1.0",
        'perfdiag_diagnoses{phase="Succeeded"} 1.0',
        'perfdiag_diagnoses{phase="Pending"} 1.0',
    ):
        assert line in text.splitlines(), (line, text)


def _exercise_webhook(port: int, ca_pem: str, ns: str, storage: str) -> None:
    """An AdmissionReview as the API server sends it, over TLS verified with the chart's CA:
    the answer injects the agent with the chart's resources and storage endpoint."""
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b6c9e1e-2f4e-4f0e-9a55-6d7b8f1c2a3d",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "worker-9",
            "namespace": ns,
            "operation": "CREATE",
            "userInfo": {"username": "test"},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "worker-9",
                    "namespace": ns,
                    "labels": {"perfdiag.io/inject": "true"},
                },
                "spec": {"containers": [{"name": "pytorch", "image": "pytorch:none"}]},
            },
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
    context = ssl.create_default_context(cadata=ca_pem)
    context.check_hostname = False  # the certificate names the Service; the chain is verified

    def answer() -> Any:
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        try:
            connection.request(
                "POST",
                "/inject.pods",
                body=json.dumps(review),
                headers={"Content-Type": "application/json"},
            )
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        except (OSError, http.client.HTTPException):
            return None  # not listening yet
        finally:
            connection.close()

    status, body = _wait(answer, "the webhook server", 60)
    assert status == 200, body
    result = body["response"]
    assert result["allowed"] is True and result["patchType"] == "JSONPatch", result
    patch = json.loads(base64.b64decode(result["patch"]))
    [init] = [op["value"] for op in patch if op["path"] == "/spec/initContainers"]
    [agent] = [c for c in init if c["name"] == "perfdiag-agent"]
    assert agent["resources"]["requests"]["cpu"] == "250m"  # agent.resources from the chart
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["AWS_ENDPOINT_URL"] == "http://minio.example:9000"  # storage.endpoint
    assert f"{storage}/$(POD_NAMESPACE)" in agent["args"]


def _get(cluster: KubeCluster, ns: str, kind: str, name: str) -> Any:
    result = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def _condition(obj: Any, type_: str) -> Any:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return cond
    return None


def _exercise_operator(
    cluster: KubeCluster,
    ns: str,
    storage: str,
    minio_server: Any,
    image: BuiltImage,
    scratch: Path,
) -> None:
    def diagnosis(name: str, target: dict[str, Any]) -> str:
        return json.dumps(
            {
                "apiVersion": "perfdiag.io/v1alpha1",
                "kind": "PerfDiagnosis",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"target": target},
            }
        )

    cluster.kubectl(
        "apply", "-f", "-", input=diagnosis("missing", {"kind": "Pods", "name": "nope"})
    )
    stalled = _wait(
        lambda: _condition(_get(cluster, ns, "pdiag", "missing"), "Stalled"), "status", 90
    )
    assert stalled["status"] == "True" and stalled["reason"] == "TargetNotFound"
    events = cluster.kubectl("get", "events", "-n", ns, "-o", "json").stdout
    assert "TargetNotFound" in events

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "worker-0",
            "namespace": ns,
            "labels": {"perfdiag.io/inject": "true", "app": "w"},
        },
        "spec": {"containers": [{"name": "pytorch", "image": "pytorch:none"}]},
    }
    # What the webhook would have made of it (its pure decision, perfdiag.operator.injection).
    patch = inject(pod, InjectionConfig(image="perfdiag:test", storage=storage, storage_secret="s"))
    assert patch is not None
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(pod.get(key), dict):
            pod[key] = {**pod[key], **value}
        else:
            pod[key] = value
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=diagnosis("armed", {"kind": "Pods", "selector": {"matchLabels": {"app": "w"}}}),
    )
    _report_step_rate(cluster, ns, "armed", minio_server)
    armed = _wait(
        lambda: (
            (_get(cluster, ns, "pdiag", "armed") or {}).get("status", {}).get("phase")
            == "Capturing"
        ),
        "phase Capturing",
        90,
    )
    assert armed
    worker = _get(cluster, ns, "pod", "worker-0")
    assert "perfdiag.io/plan" in worker["metadata"]["annotations"]
    obj = _get(cluster, ns, "pdiag", "armed")
    assert "perfdiag.io/finalizer" in obj["metadata"]["finalizers"]
    prefix = obj["status"]["artifacts"]["prefix"]
    assert prefix.startswith(storage)
    key = prefix[len(f"s3://{minio_server.bucket}/") :] + "/plan.json"
    minio_server.client().stat_object(minio_server.bucket, key)

    cluster.kubectl("delete", "pdiag", "armed", "-n", ns, "--wait=true", timeout=90)
    worker = _get(cluster, ns, "pod", "worker-0")
    assert "perfdiag.io/plan" not in (worker["metadata"].get("annotations") or {})

    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=diagnosis("complete", {"kind": "Pods", "selector": {"matchLabels": {"app": "w"}}}),
    )
    _report_step_rate(cluster, ns, "complete", minio_server)
    _complete_capture(cluster, ns, "complete", minio_server, image, scratch)


def _report_step_rate(cluster: KubeCluster, ns: str, name: str, minio_server: Any) -> None:
    """A one-shot diagnosis measures the step rate first (phase Watching, a watch plan on the
    pod): the worker's step time lands in storage, as its agent would upload it, so that the
    operator plans the capture from it."""
    from perfdiag.api.worker import WorkerStatus
    from perfdiag.storage import layout, open_storage

    def measuring() -> dict[str, Any] | None:
        found = (_get(cluster, ns, "pdiag", name) or {}).get("status") or {}
        watch = found.get("watch") or {}
        return found if found.get("phase") == "Watching" and watch.get("planId") else None

    watching = _wait(measuring, "phase Watching (measuring the step rate)", 90)
    worker = _get(cluster, ns, "pod", "worker-0")
    plan = json.loads(worker["metadata"]["annotations"]["perfdiag.io/plan"])
    assert plan["action"] == "watch" and plan["id"] == watching["watch"]["planId"], plan
    now = time.time()
    report = WorkerStatus(
        rank=0, plan_id=plan["id"], step=40, last_step_unix=now, updated_unix=now,
        mean_step_ms=100.0, max_step_ms=110.0, mean_steps=plan["steps"],
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as env:
        for key, value in minio_server.env().items():
            env.setenv(key, value)
        watch_prefix = f"{watching['artifacts']['prefix']}-watch"
        open_storage(watch_prefix).put_text(
            layout.worker_key(0, layout.STATUS), report.model_dump_json()
        )


def _complete_capture(
    cluster: KubeCluster,
    ns: str,
    name: str,
    minio_server: Any,
    image: BuiltImage,
    scratch: Path,
) -> None:
    """The rest of a diagnosis under the ServiceAccount: the worker's capture lands in storage
    (as its agent would write it), the operator ends the window, takes the plan off the pod and
    creates the analyzer Job; the suite runs the Job's command in the image built from the
    Dockerfile, as its user, as the kubelet would, and marks
    it complete; the operator reads verdict.json and writes the verdict, artifacts and Events."""
    from perfdiag.api.schema import SUMMARY_SCHEMA, SUMMARY_SCHEMA_ID, with_meta
    from perfdiag.api.worker import WorkerStatus
    from perfdiag.engine.parquet_io import table_to_bytes
    from perfdiag.storage import layout, open_storage
    from tests.analyzer.conftest import SyntheticJob

    def status() -> dict[str, Any]:
        return (_get(cluster, ns, "pdiag", name) or {}).get("status") or {}

    capturing = _wait(lambda: status() if status().get("phase") == "Capturing" else None,
                      "phase Capturing", 90)  # fmt: skip
    plan_id, prefix = capturing["window"]["planId"], capturing["artifacts"]["prefix"]
    table, metas = SyntheticJob(n_ranks=1, seed=7).build()
    summary = table.replace_schema_metadata(None).cast(
        with_meta(SUMMARY_SCHEMA, SUMMARY_SCHEMA_ID, metas[0])
    )
    now = time.time()
    done = WorkerStatus(
        rank=0, plan_id=plan_id, phase="done", step=30, last_step_unix=now, updated_unix=now,
        files=[layout.worker_key(0, layout.SUMMARY)],
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as env:
        for key, value in minio_server.env().items():
            env.setenv(key, value)
        storage = open_storage(prefix)
        storage.put_bytes(layout.worker_key(0, layout.SUMMARY), table_to_bytes(summary))
        storage.put_text(layout.worker_key(0, layout.STATUS), done.model_dump_json())

    def analyzer_job() -> dict[str, Any] | None:
        jobs = json.loads(cluster.kubectl("get", "jobs", "-n", ns, "-o", "json").stdout)["items"]
        return jobs[0] if jobs else None

    job = _wait(analyzer_job, "the analyzer Job the operator creates", 90)
    assert status()["phase"] == "Analyzing"
    worker = _get(cluster, ns, "pod", "worker-0")
    assert "perfdiag.io/plan" not in (worker["metadata"].get("annotations") or {})
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][:2] == ["analyze", prefix], container["args"]
    # The kubelet's part: run the container's command (with the Secret's credentials; the
    # chart's endpoint is not this MinIO), then report the Job complete.
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run = run_in_image(image, [*image.entrypoint, *container["args"]], scratch / "analyzer",
                       env=minio_server.env())  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    complete = [
        {"type": kind, "status": "True", "reason": "CompletionsReached", "message": "",
         "lastProbeTime": ended, "lastTransitionTime": ended}
        for kind in ("SuccessCriteriaMet", "Complete")
    ]  # fmt: skip
    job_name = job["metadata"]["name"]
    for patch in (
        {"status": {"startTime": started, "active": 1}},
        {"status": {"active": 0, "succeeded": 1, "completionTime": ended, "conditions": complete}},
    ):
        cluster.kubectl(
            "patch", "job", job_name, "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps(patch),
        )  # fmt: skip
    final = _wait(lambda: status() if status().get("phase") == "Succeeded" else None,
                  "phase Succeeded with the verdict", 90)  # fmt: skip
    assert final["verdict"]["status"] == "healthy", final["verdict"]
    assert final["artifacts"]["verdict"] == f"{prefix}/verdict.json"
    assert _condition(_get(cluster, ns, "pdiag", name), "Ready")["status"] == "True"
    events = cluster.kubectl("get", "events", "-n", ns, "-o", "json").stdout
    for reason in ("PlanSent", "CaptureEnded", "AnalyzerStarted", "VerdictReady"):
        assert reason in events, reason
