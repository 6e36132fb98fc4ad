"""What the webhook adds to a pod (pure; the apiserver round trip is test_webhook_cluster.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from perfdiag.operator.injection import (
    AGENT_CONTAINER,
    HOOK_DIR,
    InjectionConfig,
    follows_plan_successors,
    follows_pod_plan,
    inject,
    injected,
    rank_env,
)

CONFIG = InjectionConfig(image="perfdiag:1", storage="s3://b/p", storage_secret="creds")


def _pod(env: list[dict[str, Any]] | None = None, *, label: str | None = "true") -> dict[str, Any]:
    labels = {"perfdiag.io/inject": label} if label is not None else {}
    return {
        "metadata": {"name": "p", "labels": labels},
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox"}],
            "containers": [
                {"name": "sidecar", "image": "envoy"},
                {"name": "pytorch", "image": "t", "env": env or []},
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }


def _apply(pod: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = {**pod, "metadata": {**pod["metadata"], "annotations": patch["metadata"]["annotations"]}}
    out["spec"] = {**pod["spec"], **patch["spec"]}
    return out


def test_only_opted_in_pods() -> None:
    assert inject(_pod(label=None), CONFIG) is None
    assert inject(_pod(label="false"), CONFIG) is None
    assert inject(_pod(), CONFIG) is not None


def test_idempotent() -> None:
    pod = _pod()
    patch = inject(pod, CONFIG)
    assert patch is not None
    once = _apply(pod, patch)
    assert injected(once)
    assert inject(once, CONFIG) is None
    # The sidecar alone (annotation stripped, e.g. a copied spec) also counts as injected.
    del once["metadata"]["annotations"]
    assert inject(once, CONFIG) is None


def test_training_container_and_user_lists_kept() -> None:
    pod = _pod([{"name": "PYTHONPATH", "value": "/app"}, {"name": "X", "value": "1"}])
    patch = inject(pod, CONFIG)
    assert patch is not None
    spec = patch["spec"]
    sidecar, training = spec["containers"]
    assert sidecar == {"name": "sidecar", "image": "envoy"}  # only the training container changes
    env = {e["name"]: e.get("value") for e in training["env"]}
    assert env["PYTHONPATH"] == f"{HOOK_DIR}:/app"
    assert env["X"] == "1"
    assert [c["name"] for c in spec["initContainers"]] == [
        "fetch",
        "perfdiag-hook",
        AGENT_CONTAINER,
    ]
    assert spec["volumes"][0]["name"] == "data"
    agent = spec["initContainers"][-1]
    assert "s3://b/p/$(POD_NAMESPACE)" in agent["args"]
    assert "--no-raw" in agent["args"]
    assert agent["envFrom"] == [{"secretRef": {"name": "creds", "optional": True}}]


def test_the_plan_file_is_the_plan_annotation_alone() -> None:
    """One downward-API item: the plan annotation, which the kubelet writes as its raw value
    (empty when absent); the hook and the agent read it where the podinfo volume is mounted."""
    patch = inject(_pod(), CONFIG)
    assert patch is not None
    spec = patch["spec"]
    podinfo = next(v for v in spec["volumes"] if v["name"] == "perfdiag-podinfo")
    assert podinfo == {
        "name": "perfdiag-podinfo",
        "downwardAPI": {
            "items": [
                {
                    "path": "plan",
                    "fieldRef": {"fieldPath": "metadata.annotations['perfdiag.io/plan']"},
                }
            ]
        },
    }
    training = spec["containers"][1]
    agent = spec["initContainers"][-1]
    for container in (training, agent):
        mount = next(m for m in container["volumeMounts"] if m["name"] == "perfdiag-podinfo")
        assert (mount["mountPath"], mount["readOnly"]) == ("/perfdiag/podinfo", True)
    env = {e["name"]: e.get("value") for e in training["env"]}
    assert env["PERFDIAG_PLAN"] == "/perfdiag/podinfo/plan"
    assert agent["args"][agent["args"].index("--plan-file") + 1] == "/perfdiag/podinfo/plan"


def test_user_pythonpath_from_a_source_is_kept_by_reference() -> None:
    source = {"configMapKeyRef": {"name": "cfg", "key": "path"}}
    patch = inject(_pod([{"name": "PYTHONPATH", "valueFrom": source}]), CONFIG)
    assert patch is not None
    env = patch["spec"]["containers"][1]["env"]
    names = [e["name"] for e in env]
    assert names.index("PERFDIAG_USER_PYTHONPATH") < names.index("PYTHONPATH")
    assert env[names.index("PERFDIAG_USER_PYTHONPATH")]["valueFrom"] == source
    assert env[names.index("PYTHONPATH")]["value"] == f"{HOOK_DIR}:$(PERFDIAG_USER_PYTHONPATH)"


def test_rank_env_copies_values_and_sources() -> None:
    index = {
        "fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        }
    }
    container = {
        "env": [
            {"name": "PET_NODE_RANK", "valueFrom": index},
            {"name": "RANK", "value": "0"},
            {"name": "LOCAL_RANK", "value": "0"},
            {"name": "SECRET_TOKEN", "value": "x"},
            {"name": "PET_NNODES", "value": "4"},
        ]
    }
    assert [e["name"] for e in rank_env(container)] == [
        "PET_NODE_RANK",
        "RANK",
        "LOCAL_RANK",
        "PET_NNODES",
    ]
    assert rank_env(container)[0]["valueFrom"] == index


def test_no_storage_configured_no_injection() -> None:
    """An agent with nowhere to write would only crash-loop in the pod."""
    assert inject(_pod(), InjectionConfig(image="i", storage=None, storage_secret="s")) is None


def test_agent_resources_and_storage_endpoint_from_the_operator() -> None:
    config = InjectionConfig(
        image="i",
        storage="s3://b/p",
        storage_secret="creds",
        resources={"requests": {"cpu": "50m"}, "limits": {"memory": "2Gi"}},
        storage_endpoint="http://minio.minio:9000",
        storage_region="eu-west-1",
    )
    patch = inject(_pod(), config)
    assert patch is not None
    [agent] = [c for c in patch["spec"]["initContainers"] if c["name"] == AGENT_CONTAINER]
    assert agent["resources"] == {"requests": {"cpu": "50m"}, "limits": {"memory": "2Gi"}}
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["AWS_ENDPOINT_URL"] == "http://minio.minio:9000"
    assert env["AWS_REGION"] == "eu-west-1"
    assert agent["envFrom"] == [{"secretRef": {"name": "creds", "optional": True}}]
    # Without an endpoint the Secret alone says where storage is.
    default = inject(_pod(), CONFIG)
    assert default is not None
    [agent] = [c for c in default["spec"]["initContainers"] if c["name"] == AGENT_CONTAINER]
    assert not {"AWS_ENDPOINT_URL", "AWS_REGION"} & {e["name"] for e in agent["env"]}
    assert agent["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}


def test_the_agent_follows_its_pods_plan_by_the_pods_uid() -> None:
    """The agent gets the pod's uid (POD_UID, `perfdiag agent --pod-uid`'s default), under
    which it reads the pod's plan from storage; the operator tells such pods from pods an
    earlier perfdiag injected (no POD_UID: the plan reaches those only through the kubelet)."""
    pod = _pod()
    patch = inject(pod, CONFIG)
    assert patch is not None
    agent = patch["spec"]["initContainers"][-1]
    [uid] = [e for e in agent["env"] if e["name"] == "POD_UID"]
    assert uid == {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
    assert follows_pod_plan(_apply(pod, patch))
    # It follows the watch plan's successor too (`perfdiag agent --plan-successors`); an agent
    # an earlier perfdiag injected, without the variable, needs an object of its own.
    assert {"name": "PERFDIAG_PLAN_SUCCESSORS", "value": "1"} in agent["env"]
    assert follows_plan_successors(_apply(pod, patch))
    without = _apply(pod, patch)
    without["spec"]["initContainers"][-1]["env"] = [
        e for e in agent["env"] if e["name"] != "PERFDIAG_PLAN_SUCCESSORS"
    ]
    assert follows_pod_plan(without) and not follows_plan_successors(without)
    earlier = _apply(pod, patch)
    earlier["spec"]["initContainers"][-1]["env"] = [
        e for e in agent["env"] if e["name"] != "POD_UID"
    ]
    assert not follows_pod_plan(earlier)
    assert not follows_pod_plan(pod)  # not injected
    assert not follows_plan_successors(earlier)
    # The operator's plan poll, when it sets one, is the agent's.
    slower = inject(pod, dataclasses.replace(CONFIG, plan_poll_seconds=12.5))
    assert slower is not None
    args = slower["spec"]["initContainers"][-1]["args"]
    assert args[args.index("--plan-poll") + 1] == "12.5"
    assert "--plan-poll" not in agent["args"]
