"""The pods the Kubeflow training operator (v1) creates for a PyTorchJob, for tests that play it.

Follows kubeflow/training-operator pkg/controller.v1/pytorch (pod naming, labels, ownerReference
and the environment of envvar.go / elastic.go): one pod per replica, named
`<job>-<replica type lowercased>-<index>`, the labels the operator's selector uses, and in every
container MASTER_ADDR (the master pod's service name), MASTER_PORT (the container port named
`pytorchjob-port`, default 23456), WORLD_SIZE, RANK, PYTHONUNBUFFERED and, for torchrun, the
PET_* variables (PET_NPROC_PER_NODE from spec.nprocPerNode, PET_NNODES, PET_NODE_RANK,
PET_MASTER_ADDR, PET_MASTER_PORT).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

OPERATOR_NAME = "pytorchjob-controller"
DEFAULT_PORT = 23456
PORT_NAME = "pytorchjob-port"
REPLICA_ORDER = ("Master", "Worker")


def _port(job: Mapping[str, Any]) -> int:
    master = job["spec"]["pytorchReplicaSpecs"].get("Master") or {}
    for container in master.get("template", {}).get("spec", {}).get("containers", []):
        for port in container.get("ports") or []:
            if port.get("name") == PORT_NAME:
                return int(port["containerPort"])
    return DEFAULT_PORT


def pytorchjob_pods(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod manifests for every replica of the PyTorchJob (it must have metadata.uid)."""
    meta = job["metadata"]
    name = meta["name"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    nproc = str(job["spec"].get("nprocPerNode") or "1")
    replicas = [
        (rtype, i)
        for rtype in REPLICA_ORDER
        for i in range(specs.get(rtype, {}).get("replicas", 0) or 0)
    ]
    nnodes = len(replicas)
    world = nnodes * int(nproc) if nproc.isdigit() else nnodes
    master_addr = f"{name}-master-0"
    port = _port(job)
    pods = []
    for rank, (rtype, index) in enumerate(replicas):
        template = copy.deepcopy(specs[rtype]["template"])
        pod_meta = template.get("metadata") or {}
        labels = {
            **(pod_meta.get("labels") or {}),
            "training.kubeflow.org/job-name": name,
            "training.kubeflow.org/operator-name": OPERATOR_NAME,
            "training.kubeflow.org/replica-type": rtype.lower(),
            "training.kubeflow.org/replica-index": str(index),
        }
        if rtype == "Master":
            labels["training.kubeflow.org/job-role"] = "master"
        env = [
            {"name": "MASTER_PORT", "value": str(port)},
            {"name": "MASTER_ADDR", "value": master_addr},
            {"name": "WORLD_SIZE", "value": str(world)},
            {"name": "RANK", "value": str(rank)},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": "PET_NPROC_PER_NODE", "value": nproc},
            {"name": "PET_NNODES", "value": str(nnodes)},
            {"name": "PET_NODE_RANK", "value": str(rank)},
            {"name": "PET_MASTER_ADDR", "value": master_addr},
            {"name": "PET_MASTER_PORT", "value": str(port)},
        ]
        spec = template["spec"]
        for container in spec["containers"]:
            container["env"] = [*(container.get("env") or []), *env]
        spec.setdefault("restartPolicy", specs[rtype].get("restartPolicy", "OnFailure"))
        if spec["restartPolicy"] == "ExitCode":
            spec["restartPolicy"] = "Never"
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-{rtype.lower()}-{index}",
                    "namespace": meta.get("namespace"),
                    "labels": labels,
                    "annotations": dict(pod_meta.get("annotations") or {}),
                    "ownerReferences": [
                        {
                            "apiVersion": "kubeflow.org/v1",
                            "kind": "PyTorchJob",
                            "name": name,
                            "uid": meta["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": spec,
            }
        )
    return pods
