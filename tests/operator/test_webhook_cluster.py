"""The pod mutating webhook, called by the real kube-apiserver over TLS (test CA): kopf's
WebhookServer in the in-process operator, the MutatingWebhookConfiguration kopf manages."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from perfdiag.operator.injection import AGENT_CONTAINER, COPY_CONTAINER

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("webhook_env")]

CONFIGURATION = "perfdiag.io"


def _training_pod(name: str, *, inject: bool = True) -> dict[str, Any]:
    """A pod as the Kubeflow training operator creates it for a PyTorchJob replica."""
    labels = {
        "training.kubeflow.org/job-name": "demo",
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "0",
    }
    if inject:
        labels["perfdiag.io/inject"] = "true"
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "pytorch-cpu:py3.8",
                    "command": ["torchrun", "demo.py"],
                    "env": [
                        {"name": "PYTHONPATH", "value": "/workspace/lib"},
                        {"name": "MASTER_PORT", "value": "23456"},
                        {"name": "MASTER_ADDR", "value": "demo-master-0"},
                        {"name": "WORLD_SIZE", "value": "2"},
                        {"name": "RANK", "value": "1"},
                        {"name": "PET_MASTER_ADDR", "value": "demo-master-0"},
                        {"name": "PET_NPROC_PER_NODE", "value": "2"},
                        {"name": "PET_NNODES", "value": "2"},
                        {"name": "PET_NODE_RANK", "value": "1"},
                        {"name": "HF_HOME", "value": "/cache"},
                    ],
                },
                {"name": "logger", "image": "busybox"},
            ]
        },
    }


def _wait_for_webhook(cluster: Any, ns: str) -> None:
    """Until the apiserver calls the webhook (kopf writes the configuration after its server
    listens; the apiserver picks configurations up within a second)."""

    def probe() -> bool:
        pod = cluster.core.create_namespaced_pod(ns, _training_pod("probe"), dry_run="All")
        names = [c.name for c in pod.spec.init_containers or []]
        return AGENT_CONTAINER in names

    cluster.wait_for(probe, "the apiserver calling the pod webhook", timeout=60)


def test_apiserver_injects_opted_in_pods(cluster: Any, kube_namespace: str) -> None:
    ns = kube_namespace
    with cluster.operator(ns):
        _wait_for_webhook(cluster, ns)
        config = cluster.kube.kubectl(
            "get", "mutatingwebhookconfiguration", CONFIGURATION, "-o", "json"
        )
        hooks = json.loads(config.stdout)["webhooks"]
        assert len(hooks) == 1
        hook = hooks[0]
        assert hook["failurePolicy"] == "Ignore"
        assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:")
        assert hook["clientConfig"]["caBundle"]
        assert hook["objectSelector"] == {
            "matchExpressions": [
                {"key": "perfdiag.io/inject", "operator": "In", "values": ["true"]}
            ]
        }
        assert hook["rules"][0]["operations"] == ["CREATE"]
        assert hook["rules"][0]["resources"] == ["pods"]

        cluster.core.create_namespaced_pod(ns, _training_pod("w-0"))
        cluster.core.create_namespaced_pod(ns, _training_pod("plain", inject=False))
        pod = cluster.core.read_namespaced_pod("w-0", ns).to_dict()
        plain = cluster.core.read_namespaced_pod("plain", ns).to_dict()

    assert pod["metadata"]["annotations"]["perfdiag.io/injected"]
    spec = pod["spec"]
    # Volumes: the hook folder, the spool, the plan file: the plan annotation alone, which the
    # kubelet writes as its raw value (the apiserver accepts the subscripted field path).
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["perfdiag-hook"]["empty_dir"] is not None
    assert volumes["perfdiag-spool"]["empty_dir"] is not None
    items = volumes["perfdiag-podinfo"]["downward_api"]["items"]
    assert [{key: value for key, value in i.items() if value is not None} for i in items] == [
        {
            "path": "plan",
            "field_ref": {
                "api_version": "v1",  # the apiserver's default
                "field_path": "metadata.annotations['perfdiag.io/plan']",
            },
        }
    ]
    init = {c["name"]: c for c in spec["init_containers"]}
    assert [c["name"] for c in spec["init_containers"]] == [COPY_CONTAINER, AGENT_CONTAINER]
    assert init[COPY_CONTAINER]["image"] == "perfdiag:test"
    assert init[COPY_CONTAINER]["command"][-2:] == ["/opt/perfdiag/hook/.", "/perfdiag/hook/"]
    agent = init[AGENT_CONTAINER]
    assert agent["restart_policy"] == "Always"  # a native sidecar: the pod still completes
    assert agent["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert agent["args"][:5] == ["agent", "--spool", "/perfdiag/spool", "--plan-file",
                                 "/perfdiag/podinfo/plan"]  # fmt: skip
    assert "s3://perfdiag-test/perfdiag/$(POD_NAMESPACE)" in agent["args"]
    agent_env = {e["name"]: e for e in agent["env"]}
    for name, value in [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "demo-master-0"),
        ("MASTER_PORT", "23456"),
        ("PET_NPROC_PER_NODE", "2"),
        ("PET_NODE_RANK", "1"),
    ]:
        assert agent_env[name]["value"] == value
    assert "HF_HOME" not in agent_env and "PYTHONPATH" not in agent_env
    assert agent_env["POD_NAME"]["value_from"]["field_ref"]["field_path"] == "metadata.name"
    assert agent["env_from"][0]["secret_ref"] == {"name": "perfdiag-storage", "optional": True}

    training, logger = spec["containers"]
    assert logger["name"] == "logger" and logger["env"] is None  # other containers untouched
    env = {e["name"]: e["value"] for e in training["env"]}
    node = next(e for e in training["env"] if e["name"] == "PERFDIAG_NODE_NAME")
    assert node["value_from"]["field_ref"]["field_path"] == "spec.nodeName"  # the machine
    assert env["PYTHONPATH"] == "/perfdiag/hook:/workspace/lib"  # the user's path kept
    assert env["PERFDIAG_SPOOL"] == "/perfdiag/spool"
    assert env["PERFDIAG_PLAN"] == "/perfdiag/podinfo/plan"
    assert env["HF_HOME"] == "/cache"
    mounts = {m["name"]: m for m in training["volume_mounts"]}
    assert mounts["perfdiag-hook"]["read_only"] is True
    assert mounts["perfdiag-podinfo"]["mount_path"] == "/perfdiag/podinfo"

    # Pods that did not opt in are never touched.
    assert not (plain["metadata"]["annotations"] or {})
    assert plain["spec"]["init_containers"] is None
    assert [c["name"] for c in plain["spec"]["containers"]] == ["pytorch", "logger"]


def test_reinvocation_is_idempotent(cluster: Any, kube_namespace: str) -> None:
    """A pod that already carries the injection (re-invocation, or a pod re-created from an
    injected spec) goes through unchanged."""
    ns = kube_namespace
    with cluster.operator(ns):
        _wait_for_webhook(cluster, ns)
        first = cluster.core.create_namespaced_pod(ns, _training_pod("a"))
        again = copy.deepcopy(cluster.kube.api_client().sanitize_for_serialization(first))
        again["metadata"] = {
            "name": "b",
            "labels": again["metadata"]["labels"],
            "annotations": again["metadata"]["annotations"],
        }
        second = cluster.core.create_namespaced_pod(ns, again)
    assert [c.name for c in second.spec.init_containers] == [COPY_CONTAINER, AGENT_CONTAINER]
    assert len(second.spec.volumes) == len(first.spec.volumes)
    assert [e.name for e in second.spec.containers[0].env] == [
        e.name for e in first.spec.containers[0].env
    ]


WEBHOOK = "inject.pods.perfdiag.io"  # the webhook's name, kopf's as the chart's
FAIL_OPEN = f'apiserver_admission_webhook_fail_open_count{{name="{WEBHOOK}"}}'


def test_failure_policy_ignore_when_operator_is_down(
    cluster: Any, kube_namespace: str, prometheus_server: Any
) -> None:
    """The configuration stays (persistent) while no webhook answers; pods are still created,
    without perfdiag, rather than refused. The API server counts the fail-open, the suite's
    Prometheus scrapes it and the chart's PerfdiagWebhookFailingOpen fires."""
    ns = kube_namespace
    with cluster.operator(ns):
        _wait_for_webhook(cluster, ns)
    before = sum(value for _, value in prometheus_server.values(FAIL_OPEN))
    pod = cluster.core.create_namespaced_pod(ns, _training_pod("late"))
    assert pod.spec.init_containers is None
    assert not (pod.metadata.annotations or {}).get("perfdiag.io/injected")
    cluster.kube.kubectl("get", "mutatingwebhookconfiguration", CONFIGURATION)
    prometheus_server.wait_for(
        lambda: sum(value for _, value in prometheus_server.values(FAIL_OPEN)) > before,
        "the API server's fail-open count",
    )
    [alert] = prometheus_server.wait_for(
        lambda: prometheus_server.firing("PerfdiagWebhookFailingOpen", name=WEBHOOK),
        "PerfdiagWebhookFailingOpen (the API server's count)",
    )
    assert "the API server could not reach the webhook" in alert["_description"], alert


def test_an_injection_that_fails_admits_the_pod_and_says_so(
    cluster: Any,
    kube_namespace: str,
    operator_metrics: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exception in the injection (here: made to raise) fails open too: the pod is created
    unchanged instead of refused (kopf would answer an exception with a denial, which
    failurePolicy Ignore does not cover), the operator counts it, and the chart's
    PerfdiagWebhookFailingOpen fires naming the reason."""
    from perfdiag.operator import webhook

    prometheus = operator_metrics
    ns = kube_namespace
    with cluster.operator(ns):
        _wait_for_webhook(cluster, ns)
        prometheus.wait_for(  # scraped at 0 before the failure, so that increase() sees it
            lambda: prometheus.values(
                'perfdiag_webhook_fail_open_total{reason="InjectionError"} == 0'
            ),
            "the operator's fail-open counter at 0",
        )

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("injection broke")

        monkeypatch.setattr(webhook, "inject", broken)
        pod = cluster.core.create_namespaced_pod(ns, _training_pod("unlucky"))
        assert pod.spec.init_containers is None
        assert not (pod.metadata.annotations or {}).get("perfdiag.io/injected")
        [alert] = prometheus.wait_for(
            lambda: prometheus.firing("PerfdiagWebhookFailingOpen", reason="InjectionError"),
            "PerfdiagWebhookFailingOpen (the operator's count)",
        )
        counted = prometheus.values('perfdiag_webhook_admissions_total{result="error"}')
    assert "the operator says: InjectionError" in alert["_description"], alert
    assert [value for _, value in counted] == [1.0], counted
