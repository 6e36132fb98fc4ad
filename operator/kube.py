"""The operator's Kubernetes API calls, thin (decisions live in targets.py and status.py).

kopf keeps its own connection for watching; these synchronous calls (the official client) run
in kopf's handler threads and the recheck loop's thread.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any, cast

import kubernetes as _kubernetes

from perfdiag.api.diagnosis import GROUP, KIND, PLURAL, VERSION, Target
from perfdiag.operator.pods import slim_pod
from perfdiag.operator.settings import COMPONENT
from perfdiag.operator.status import Event, now_utc
from perfdiag.operator.targets import JOB_KINDS, Lookup, TargetObservation, observe, pod_selector

# The generated client's signatures want its model classes; the operator speaks plain JSON.
kubernetes: Any = _kubernetes
ApiException: type[Exception] = kubernetes.client.ApiException
MERGE_PATCH = "application/merge-patch+json"
API_CONNECTIONS = 32
"""Connections kept to the apiserver: the reconciler patches that many pods at once (below it,
urllib3 opens and drops a connection for every request over the pool's size)."""
POD_PAGE = 1000
"""Pods per LIST page: a page is parsed and slimmed before the next is read, so a pass over
10,000 pods never holds them whole (a few MB a page instead of hundreds)."""


class NoCredentials(RuntimeError):
    """Neither a service account nor a usable kubeconfig."""


def new_api_client() -> Any:
    """A client for the cluster the operator runs in, or the one $KUBECONFIG names (read now,
    not when the kubernetes package was imported)."""
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        kubeconfig = os.environ.get("KUBECONFIG")
        try:
            kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
        except (kubernetes.config.ConfigException, OSError) as exc:
            where = f"KUBECONFIG={kubeconfig}" if kubeconfig else "~/.kube/config"
            raise NoCredentials(
                f"no Kubernetes credentials: not running in a pod, and {where}: {exc}"
            ) from exc
    config.connection_pool_maxsize = API_CONNECTIONS
    return kubernetes.client.ApiClient(config)


def status_of(exc: Exception) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _unless_gone(call: Callable[[], Any], gone: tuple[int, ...] = (404,)) -> Any:
    """What the call returns, or None when the API answers one of the `gone` statuses (404: no
    such object)."""
    try:
        return call()
    except ApiException as exc:
        if status_of(exc) in gone:
            return None
        raise


def _read_json(read: Callable[[], Any]) -> dict[str, Any] | None:
    """The object a read returns unparsed (`_preload_content=False`), None when it is gone."""
    response = _unless_gone(read)
    return None if response is None else cast(dict[str, Any], json.loads(response.data))


def _is_missing_kind(exc: Any) -> bool:
    """A 404 for a resource type the server does not serve (no CRD), not for a missing object."""
    try:
        details = json.loads(exc.body or "{}").get("details") or {}
    except (ValueError, AttributeError):
        return True  # "404 page not found": plain text, the route does not exist
    return not details.get("name")


class Kube:
    """The calls the operator makes, over one ApiClient."""

    def __init__(self, api_client: Any) -> None:
        self.core: Any = kubernetes.client.CoreV1Api(api_client)
        self.custom: Any = kubernetes.client.CustomObjectsApi(api_client)
        self.batch: Any = kubernetes.client.BatchV1Api(api_client)
        self.instance = os.environ.get("POD_NAME") or socket.gethostname()

    # ---- PerfDiagnosis ---------------------------------------------------------------------
    def get_diagnosis(self, namespace: str, name: str) -> dict[str, Any] | None:
        return cast(
            "dict[str, Any] | None",
            _unless_gone(
                lambda: self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name
                )
            ),
        )

    def patch_status(
        self, namespace: str, name: str, status_patch: Mapping[str, Any], resource_version: str
    ) -> dict[str, Any]:
        """Merge-patch the status subresource, only if the object is still at resource_version
        (409 Conflict otherwise: someone else changed it, recompute)."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": dict(status_patch)}
        obj = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, body, _content_type=MERGE_PATCH
        )
        return cast(dict[str, Any], obj)

    def delete_diagnosis(self, namespace: str, name: str, uid: str) -> None:
        _unless_gone(
            lambda: self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, body={"preconditions": {"uid": uid}}
            ),
            (404, 409),  # gone already, or a new object of the same name
        )

    def post_event(self, obj: Mapping[str, Any], event: Event) -> None:
        meta = obj["metadata"]
        stamp = now_utc().strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self.core.create_namespaced_event(meta["namespace"], body, _preload_content=False)

    # ---- target ----------------------------------------------------------------------------
    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods `selector` matches, slim (perfdiag.operator.pods), read POD_PAGE at a time."""
        pods: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            extra = {"_continue": token} if token else {}
            response = self.core.list_namespaced_pod(
                namespace, label_selector=selector, limit=POD_PAGE, _preload_content=False, **extra
            )
            page = json.loads(response.data)
            pods += [slim_pod(pod) for pod in page.get("items") or []]
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return pods

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _read_json(
            lambda: self.core.read_namespaced_pod(name, namespace, _preload_content=False)
        )

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        _unless_gone(
            lambda: self.core.patch_namespaced_pod(
                name, namespace, dict(patch), _content_type=MERGE_PATCH, _preload_content=False
            )
        )

    # ---- analyzer Job ----------------------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _read_json(
            lambda: self.batch.read_namespaced_job(name, namespace, _preload_content=False)
        )

    def create_job(self, namespace: str, job: Mapping[str, Any]) -> bool:
        """Create the Job; False when it exists already (created by an earlier pass)."""
        try:
            self.batch.create_namespaced_job(namespace, dict(job), _preload_content=False)
        except ApiException as exc:
            if status_of(exc) == 409:
                return False
            raise
        return True

    def delete_job(self, namespace: str, name: str) -> None:
        _unless_gone(
            lambda: self.batch.delete_namespaced_job(
                name, namespace, propagation_policy="Background", _preload_content=False
            )
        )

    def observe_target(
        self, namespace: str, target: Target
    ) -> tuple[TargetObservation, list[dict[str, Any]]]:
        """Read the target (job object, pods) and decide its state; with the target's pods as
        read (slim, finished ones too), which the rest of the pass decides on."""
        if target.kind == "Pods" and target.name is not None:
            pod = self.get_pod(namespace, target.name)
            if pod is None:
                return observe(target, lookup="missing"), []
            pods = [slim_pod(pod)]
            return observe(target, lookup="found", pods=pods), pods
        job: dict[str, Any] | None = None
        if target.kind in JOB_KINDS:
            kind = JOB_KINDS[target.kind]
            assert target.name is not None
            lookup: Lookup = "found"
            try:
                job = self.custom.get_namespaced_custom_object(
                    kind.group, kind.version, namespace, kind.plural, target.name
                )
            except ApiException as exc:
                if status_of(exc) != 404:
                    raise
                lookup = "kind_not_installed" if _is_missing_kind(exc) else "missing"
            if lookup != "found":
                return observe(target, lookup=lookup), []
        selector = pod_selector(target)
        assert selector is not None
        pods = self.list_pods(namespace, selector)
        return observe(target, lookup="found", job=job, pods=pods), pods
