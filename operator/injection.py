"""What the pod mutating webhook adds to an opted-in training pod (pure; docs/design.md §1, §2).

A pod labelled perfdiag.io/inject="true" gets, at creation:
- an init container copying the hook folder of the perfdiag image into an emptyDir;
- in the training container: that folder first on PYTHONPATH (the user's own value kept after
  it; the hook's sitecustomize runs the user's sitecustomize too), PERFDIAG_SPOOL and
  PERFDIAG_PLAN, and the three volumes mounted;
- a shared spool emptyDir and a downward-API volume holding one file, the pod's plan annotation
  (the plan file);
- the agent as a native sidecar (an init container with restartPolicy Always, so the pod still
  completes when training ends), with the rank environment of the training container, the
  storage credentials from a Secret and modest resource requests, and POD_UID, with which it
  follows the pod's plan in storage (`follows_pod_plan`);
- the annotation perfdiag.io/injected=<version>, which makes a second invocation a no-op.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfdiag import __version__
from perfdiag.api.plan import PLAN_SUCCESSORS_ENV
from perfdiag.operator.settings import (
    DEFAULT_AGENT_RESOURCES,
    INJECT_LABEL,
    INJECTED_ANNOTATION,
    PLAN_ANNOTATION,
)

HOOK_VOLUME = "perfdiag-hook"
SPOOL_VOLUME = "perfdiag-spool"
PODINFO_VOLUME = "perfdiag-podinfo"
HOOK_DIR = "/perfdiag/hook"
SPOOL_DIR = "/perfdiag/spool"
PODINFO_DIR = "/perfdiag/podinfo"
PLAN_FILE_NAME = "plan"  # in the podinfo volume
PLAN_FILE = f"{PODINFO_DIR}/{PLAN_FILE_NAME}"
# The downward API projects one annotation as its raw value, and an absent one as an empty file:
# for `metadata.annotations['<key>']`, Kubernetes' pkg/fieldpath/fieldpath.go
# ExtractFieldPathAsString returns `accessor.GetAnnotations()[subscript]` (unquoted; Go's zero
# value "" when absent) and pkg/volume/downwardapi/downwardapi.go CollectData writes that string
# as the file's data. Only the whole map, `metadata.annotations`, becomes `key="value"` lines with
# Go %q quoting (fieldpath.FormatMap). (Older kubelets also sorted the lines of each file: the
# plan's canonical JSON is one line.) The kubelet rewrites the file atomically when the
# annotation changes.
PLAN_FIELD_PATH = f"metadata.annotations['{PLAN_ANNOTATION}']"
NODE_NAME_ENV = "PERFDIAG_NODE_NAME"
IMAGE_HOOK_DIR = "/opt/perfdiag/hook"  # where the Dockerfile puts the hook folder
COPY_CONTAINER = "perfdiag-hook"
AGENT_CONTAINER = "perfdiag-agent"
TRAINING_CONTAINER = "pytorch"  # the Kubeflow training operator's default container name
SPOOL_SIZE_LIMIT = "2Gi"
POD_UID_ENV = "POD_UID"  # `perfdiag agent --pod-uid` (its default)

# Rank environment the agent needs to know which ranks it serves (global ranks come from the
# spool; these name the node and the job for logs and status).
RANK_ENV = frozenset(
    {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK"}
)
RANK_ENV_PREFIXES = ("PET_",)


AGENT_RESOURCES = DEFAULT_AGENT_RESOURCES.to_wire()


@dataclass(frozen=True)
class InjectionConfig:
    image: str
    storage: str | None  # s3://bucket/prefix; the agent writes under <storage>/<namespace>/
    storage_secret: str
    keep_raw: bool = False
    resources: Mapping[str, Any] | None = None  # the agent's; default AGENT_RESOURCES
    # The operator's S3 endpoint and region, set as AWS_ENDPOINT_URL / AWS_REGION on the agent
    # (an env entry wins over the Secret's envFrom): the namespace's Secret then needs only the
    # credentials, and the agents write where the operator reads.
    storage_endpoint: str | None = None
    storage_region: str | None = None
    plan_poll_seconds: float | None = None  # the agent's --plan-poll; None: its default


def storage_env(endpoint: str | None, region: str | None) -> list[dict[str, Any]]:
    """AWS_ENDPOINT_URL / AWS_REGION entries for a container (agent, analyzer) when known."""
    env = []
    if endpoint:
        env.append({"name": "AWS_ENDPOINT_URL", "value": endpoint})
    if region:
        env.append({"name": "AWS_REGION", "value": region})
    return env


def opted_in(pod: Mapping[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(INJECT_LABEL) == "true")


def injected(pod: Mapping[str, Any]) -> bool:
    """Whether the webhook already injected this pod (the annotation, or the sidecar itself)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if INJECTED_ANNOTATION in annotations:
        return True
    spec = pod.get("spec") or {}
    names = {c.get("name") for c in [*spec.get("containers", []), *spec.get("initContainers", [])]}
    return AGENT_CONTAINER in names


def training_container_index(containers: list[dict[str, Any]]) -> int:
    """The container running the ranks: the one named "pytorch", else the first."""
    for index, container in enumerate(containers):
        if container.get("name") == TRAINING_CONTAINER:
            return index
    return 0


def rank_env(container: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The training container's rank variables, as they are (value or valueFrom), in order."""
    return [
        copy.deepcopy(dict(var))
        for var in container.get("env") or []
        if var.get("name") in RANK_ENV or str(var.get("name", "")).startswith(RANK_ENV_PREFIXES)
    ]


def _with_env(env: list[dict[str, Any]], name: str, value: str) -> list[dict[str, Any]]:
    return [*[v for v in env if v.get("name") != name], {"name": name, "value": value}]


def _training_env(env: list[dict[str, Any]]) -> list[dict[str, Any]]:
    user = next((v for v in env if v.get("name") == "PYTHONPATH"), None)
    if user is not None and "valueFrom" in user:
        # Kubernetes expands $(VAR) from variables defined earlier in the list: keep the user's
        # under another name and refer to it.
        kept = {**user, "name": "PERFDIAG_USER_PYTHONPATH"}
        env = [kept if v is user else v for v in env]
        path = f"{HOOK_DIR}:$(PERFDIAG_USER_PYTHONPATH)"
    elif user is not None and user.get("value"):
        path = f"{HOOK_DIR}:{user['value']}"
    else:
        path = HOOK_DIR
    env = _with_env(env, "PYTHONPATH", path)
    env = _with_env(env, "PERFDIAG_SPOOL", SPOOL_DIR)
    env = _with_env(env, "PERFDIAG_PLAN", PLAN_FILE)
    # The machine the pod runs on: the analysis groups slow ranks by it (a slow node).
    return [
        *[v for v in env if v.get("name") != NODE_NAME_ENV],
        {"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]


def _agent(training: Mapping[str, Any], config: InjectionConfig) -> dict[str, Any]:
    # One diagnosis = one prefix <storage>/<namespace>/<plan id>/ (the plan id names it).
    args = ["agent", "--spool", SPOOL_DIR, "--plan-file", PLAN_FILE]
    args += ["--storage", f"{config.storage}/$(POD_NAMESPACE)"]
    if not config.keep_raw:
        args.append("--no-raw")
    if config.plan_poll_seconds is not None:
        args += ["--plan-poll", f"{config.plan_poll_seconds:g}"]
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # The agent reads the pod's plan from storage under this uid (perfdiag.api.plan
        # pod_plan_key): the plan reaches the hooks without waiting for the kubelet.
        {"name": POD_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        # It follows plan successors too: the operator arms such pods with one write.
        {"name": PLAN_SUCCESSORS_ENV, "value": "1"},
        *rank_env(training),
        *storage_env(config.storage_endpoint, config.storage_region),
    ]
    return {
        "name": AGENT_CONTAINER,
        "image": config.image,
        "args": args,
        "env": env,
        "envFrom": [{"secretRef": {"name": config.storage_secret, "optional": True}}],
        "restartPolicy": "Always",  # native sidecar: ends with the pod, restarts if it dies
        "resources": copy.deepcopy(dict(config.resources or AGENT_RESOURCES)),
        "volumeMounts": [
            {"name": SPOOL_VOLUME, "mountPath": SPOOL_DIR},
            {"name": PODINFO_VOLUME, "mountPath": PODINFO_DIR, "readOnly": True},
        ],
    }


def _hook_copy(config: InjectionConfig) -> dict[str, Any]:
    return {
        "name": COPY_CONTAINER,
        "image": config.image,
        "command": ["cp", "-R", f"{IMAGE_HOOK_DIR}/.", f"{HOOK_DIR}/"],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        "volumeMounts": [{"name": HOOK_VOLUME, "mountPath": HOOK_DIR}],
    }


def _volumes() -> list[dict[str, Any]]:
    return [
        {"name": HOOK_VOLUME, "emptyDir": {}},
        {"name": SPOOL_VOLUME, "emptyDir": {"sizeLimit": SPOOL_SIZE_LIMIT}},
        {
            "name": PODINFO_VOLUME,
            "downwardAPI": {
                "items": [{"path": PLAN_FILE_NAME, "fieldRef": {"fieldPath": PLAN_FIELD_PATH}}]
            },
        },
    ]


def inject(pod: Mapping[str, Any], config: InjectionConfig) -> dict[str, Any] | None:
    """The merge patch that injects perfdiag into `pod`, or None when there is nothing to do
    (not opted in, already injected, no containers, or no storage for the agent to write to:
    the operator then refuses diagnoses with NoStorage). Lists are replaced whole."""
    if not opted_in(pod) or injected(pod) or not config.storage:
        return None
    spec = pod.get("spec") or {}
    containers = copy.deepcopy(list(spec.get("containers") or []))
    if not containers:
        return None
    index = training_container_index(containers)
    training = containers[index]
    training["env"] = _training_env(list(training.get("env") or []))
    training["volumeMounts"] = [
        *(training.get("volumeMounts") or []),
        {"name": HOOK_VOLUME, "mountPath": HOOK_DIR, "readOnly": True},
        {"name": SPOOL_VOLUME, "mountPath": SPOOL_DIR},
        {"name": PODINFO_VOLUME, "mountPath": PODINFO_DIR, "readOnly": True},
    ]
    init = [
        *copy.deepcopy(list(spec.get("initContainers") or [])),
        _hook_copy(config),
        _agent(training, config),
    ]
    volumes = [*copy.deepcopy(list(spec.get("volumes") or [])), *_volumes()]
    return {
        "metadata": {"annotations": {INJECTED_ANNOTATION: __version__}},
        "spec": {"containers": containers, "initContainers": init, "volumes": volumes},
    }


def follows_pod_plan(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's agent reads the pod's plan from storage (it was injected with POD_UID):
    then a plan reaches its hooks within seconds; otherwise (a pod injected by an earlier
    perfdiag) only through the kubelet's refresh of the downward-API file."""
    return _agent_has_env(pod, POD_UID_ENV)


def follows_plan_successors(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's agent also reads the successor of the watch plan its pod holds
    (perfdiag.api.plan.plan_successor_key; injected with PERFDIAG_PLAN_SUCCESSORS): a pod
    injected by an earlier perfdiag needs its own plan object."""
    return follows_pod_plan(pod) and _agent_has_env(pod, PLAN_SUCCESSORS_ENV)


def _agent_has_env(pod: Mapping[str, Any], name: str) -> bool:
    spec = pod.get("spec") or {}
    for container in spec.get("initContainers") or []:
        if container.get("name") == AGENT_CONTAINER:
            return any(env.get("name") == name for env in container.get("env") or [])
    return False
