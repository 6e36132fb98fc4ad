"""What the suite's control plane lacks for the chart's own operator, played as the real parts
would do it (docs/testing.md, "The documents' commands"):

- `OperatorDeployment`: the Deployment controller and the kubelet for the release's operator
  Deployment. Its one pod's container runs as a local process (the development venv's
  `perfdiag`, standing in for the image) with the Deployment's args and env, `envFrom` its
  Secret (a missing one holds the container back, as the kubelet's CreateContainerConfigError
  does, and is retried), its Secret volumes written as files at translated paths, and the
  ServiceAccount's credentials as a TokenRequest token (a kubeconfig, where a pod gets the
  token mounted). The pod has its own loopback address, so `0.0.0.0` in its args and env means
  that address. Once the readiness probe's port answers, the Deployment's status is written as
  the Deployment controller would (`kubectl rollout status` reads it).
- `inject`: the API server's call to the release's pod webhook. The webhook configuration
  names a Service, which nothing routes here (no cluster DNS, no kube-proxy): the suite sends
  the AdmissionReview the API server would send to the operator pod's webhook port, verifying
  the serving certificate against the configuration's caBundle for the Service's DNS name, and
  applies the JSONPatch it answers.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from perfdiag_testing.kube import KubeCluster
from perfdiag_testing.kubelet import expand

OPERATOR_ADDRESS = "127.0.0.250"  # the operator pod's own address (LocalKubelet counts up from 2)
POLL_S = 1.0
RESTART_DELAY_S = 5.0  # between two starts of the container (the kubelet backs off longer)


class OperatorDeployment:
    """Plays the Deployment `name` in `namespace` (one replica) until stopped."""

    def __init__(
        self,
        cluster: KubeCluster,
        namespace: str,
        name: str,
        *,
        entrypoint: str,
        workdir: Path,
        base_env: dict[str, str],
    ) -> None:
        """`entrypoint`: the image's ENTRYPOINT (`perfdiag`) on this machine."""
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.entrypoint = entrypoint
        self.workdir = workdir
        self.base_env = base_env
        self.log_path = workdir / "operator.log"
        self.waiting: str | None = None  # why the container has not started, as kubectl says
        self.process: subprocess.Popen[bytes] | None = None
        self.webhook_port: int | None = None
        self._reported_generation: int | None = None
        self._started_at = -RESTART_DELAY_S
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="operator-deployment", daemon=True)

    def start(self) -> OperatorDeployment:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)

    def log_tail(self, size: int = 6000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        waiting = f"(container waiting: {self.waiting})\n" if self.waiting else ""
        return waiting + text[-size:]

    # ---- the loop --------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            deployment = self._get("deployment", self.name)
            if deployment is None:
                continue
            if self.process is None or self.process.poll() is not None:
                if time.monotonic() - self._started_at >= RESTART_DELAY_S:
                    self._started_at = time.monotonic()
                    self._start(deployment)
            elif self._ready():
                self._report(deployment)

    def _get(self, kind: str, name: str) -> dict[str, Any] | None:
        result = self.cluster.kubectl(
            "get", kind, name, "-n", self.namespace, "-o", "json", check=False
        )
        return json.loads(result.stdout) if result.returncode == 0 else None

    def _start(self, deployment: dict[str, Any]) -> None:
        spec = deployment["spec"]["template"]["spec"]
        [container] = spec["containers"]
        try:
            own = self._env(container)
            mounts = self._volumes(spec, container)
        except LookupError as exc:
            self.waiting = f"CreateContainerConfigError: {exc}"
            return
        args = [_translate(_own_address(expand(a, own)), mounts) for a in container["args"]]
        env = {
            **self.base_env,
            **{key: _translate(_own_address(value), mounts) for key, value in own.items()},
            "KUBECONFIG": str(self._token_kubeconfig(spec["serviceAccountName"])),
        }
        self.webhook_port = _port(container, "webhook")
        self.waiting = None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [self.entrypoint, *args],
                env=env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def _env(self, container: dict[str, Any]) -> dict[str, str]:
        """The container's own variables: its Secrets' (envFrom), then its env (which wins)."""
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            ref = source["secretRef"]
            data = self._secret(ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise LookupError(f'secret "{ref["name"]}" not found')
            env.update(data)
        for var in container.get("env") or []:
            if "value" not in var:
                raise LookupError(f"env {var['name']}: only values are played here")
            env[var["name"]] = expand(var["value"], env)
        return env

    def _secret(self, name: str) -> dict[str, str] | None:
        secret = self._get("secret", name)
        if secret is None:
            return None
        return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}

    def _volumes(self, spec: dict[str, Any], container: dict[str, Any]) -> list[tuple[str, Path]]:
        """(mount path, host folder) of each mounted volume: Secrets written out, emptyDirs."""
        folders: dict[str, Path] = {}
        for volume in spec.get("volumes") or []:
            folder = self.workdir / "volumes" / volume["name"]
            folder.mkdir(parents=True, exist_ok=True)
            if "secret" in volume:
                data = self._secret(volume["secret"]["secretName"])
                if data is None:
                    raise LookupError(f'secret "{volume["secret"]["secretName"]}" not found')
                for key, value in data.items():
                    (folder / key).write_text(value)
            folders[volume["name"]] = folder
        mounts = [(m["mountPath"], folders[m["name"]]) for m in container["volumeMounts"]]
        return sorted(mounts, key=lambda mount: len(mount[0]), reverse=True)

    def _token_kubeconfig(self, service_account: str) -> Path:
        token = self.cluster.kubectl(
            "create", "token", service_account, "-n", self.namespace, "--duration=2h"
        ).stdout.strip()
        ca = base64.b64encode(self.cluster.ca_file.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "c", "cluster": {"server": self.cluster.server,
                                          "certificate-authority-data": ca}}
            ],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}],
            "current-context": "c",
        }  # fmt: skip
        path = self.workdir / "serviceaccount-kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    def _ready(self) -> bool:
        """The readiness probe: the webhook port accepts a connection."""
        if self.webhook_port is None:
            return False
        with socket.socket() as probe:
            probe.settimeout(1)
            return probe.connect_ex((OPERATOR_ADDRESS, self.webhook_port)) == 0

    def _report(self, deployment: dict[str, Any]) -> None:
        generation = deployment["metadata"]["generation"]
        if self._reported_generation == generation:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "observedGeneration": generation,
            "replicas": 1,
            "updatedReplicas": 1,
            "readyReplicas": 1,
            "availableReplicas": 1,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                 "message": "Deployment has minimum availability.",
                 "lastUpdateTime": now, "lastTransitionTime": now},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                 "message": f'ReplicaSet "{self.name}" has successfully progressed.',
                 "lastUpdateTime": now, "lastTransitionTime": now},
            ],
        }  # fmt: skip
        self.cluster.kubectl(
            "patch", "deployment", self.name, "-n", self.namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": status}),
        )  # fmt: skip
        self._reported_generation = generation


def _port(container: dict[str, Any], name: str) -> int | None:
    for port in container.get("ports") or []:
        if port.get("name") == name:
            return int(port["containerPort"])
    return None


def _own_address(text: str) -> str:
    return text.replace("0.0.0.0", OPERATOR_ADDRESS)


def _translate(text: str, mounts: list[tuple[str, Path]]) -> str:
    for inside, host in mounts:
        if text == inside or text.startswith(inside.rstrip("/") + "/"):
            return str(host) + text[len(inside.rstrip("/")) :]
    return text


# ---- the API server's webhook call -----------------------------------------------------------


class _ServiceConnection(http.client.HTTPSConnection):
    """HTTPS to an address, verifying the certificate for another name (the Service's)."""

    def __init__(self, address: str, port: int, server_name: str, context: ssl.SSLContext):
        super().__init__(address, port, timeout=10, context=context)
        self._server_name, self._tls = server_name, context

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self._server_name)


def inject(
    cluster: KubeCluster, configuration: str, pod: dict[str, Any], port: int
) -> dict[str, Any]:
    """`pod` as the API server would store it after calling the webhook of the
    MutatingWebhookConfiguration `configuration` (its one webhook, a Service reference)."""
    stored = json.loads(
        cluster.kubectl("get", "mutatingwebhookconfiguration", configuration, "-o", "json").stdout
    )
    [webhook] = stored["webhooks"]
    service = webhook["clientConfig"]["service"]
    context = ssl.create_default_context(
        cadata=base64.b64decode(webhook["clientConfig"]["caBundle"]).decode()
    )
    namespace = pod["metadata"]["namespace"]
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"],
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kubeflow:training-operator"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
    server_name = f"{service['name']}.{service['namespace']}.svc"
    connection = _ServiceConnection(OPERATOR_ADDRESS, port, server_name, context)
    try:
        connection.request(
            "POST", service["path"], body=json.dumps(review),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        response = connection.getresponse()
        answer = json.loads(response.read())
    finally:
        connection.close()
    result = answer["response"]
    assert response.status == 200 and result["allowed"], answer
    patch = json.loads(base64.b64decode(result.get("patch", "") or "W10="))
    return apply_json_patch(pod, patch)


def apply_json_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add / replace / remove (what an admission webhook answers) on a copy."""
    result: dict[str, Any] = json.loads(json.dumps(document))
    for operation in operations:
        *parents, last = [
            part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]
        ]
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            index = len(target) if last == "-" else int(last)
            if operation["op"] == "add":
                target.insert(index, operation["value"])
            elif operation["op"] == "replace":
                target[index] = operation["value"]
            else:
                del target[index]
        elif operation["op"] in ("add", "replace"):
            target[last] = operation["value"]
        else:
            del target[last]
    return result
