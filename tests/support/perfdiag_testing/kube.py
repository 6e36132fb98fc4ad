"""A real Kubernetes control plane for tests: etcd + kube-apiserver on loopback, no kubelet,
no controller-manager, no scheduler. Admin access through a client certificate in system:masters.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from perfdiag_testing.certs import ControlPlaneCerts, make_control_plane_certs
from perfdiag_testing.processes import ServerProcess, ServerStartError, free_port

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # first address of SERVICE_CIDR: the `kubernetes` service
IN_CLUSTER_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
START_ATTEMPTS = 3  # new ports after an 'address already in use' race with another process


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class KubeCluster:
    """A running control plane. `kubeconfig` is an admin kubeconfig with everything embedded."""

    def __init__(
        self,
        *,
        bin_dir: Path,
        workdir: Path,
        certs: ControlPlaneCerts,
        etcd: ServerProcess,
        apiserver: ServerProcess,
        server: str,
        kubeconfig: Path,
        ready_seconds: float,
    ) -> None:
        self.bin_dir = bin_dir
        self.workdir = workdir
        self.certs = certs
        self.etcd = etcd
        self.apiserver = apiserver
        self.server = server
        self.kubeconfig = kubeconfig
        self.ca_file = certs.ca_cert
        self.ready_seconds = ready_seconds

    def env(self) -> dict[str, str]:
        """Variables that point kubectl, kopf and the kubernetes client at this cluster."""
        return {"KUBECONFIG": str(self.kubeconfig), "NO_PROXY": "127.0.0.1,localhost"}

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this cluster (text output). With check=True (default) a
        non-zero exit raises RuntimeError carrying kubectl's stderr."""
        kubectl = str(self.bin_dir / "kubectl")
        cache = self.workdir / "kubectl-cache"
        argv = [kubectl, f"--kubeconfig={self.kubeconfig}", f"--cache-dir={cache}", *args]
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **self.env()},
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr.strip()}"
            )
        return result

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient with admin rights on this cluster."""
        from kubernetes import config

        return config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )

    def ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting this cluster's CA and presenting the admin certificate."""
        context = ssl.create_default_context(cafile=str(self.certs.ca_cert))
        context.load_cert_chain(str(self.certs.admin_cert), str(self.certs.admin_key))
        return context

    def log_files(self) -> list[Path]:
        return [self.etcd.log_path, self.apiserver.log_path]

    def stop(self) -> None:
        self.apiserver.stop()
        self.etcd.stop()


def _write_kubeconfig(path: Path, server: str, certs: ControlPlaneCerts) -> None:
    def b64(file: Path) -> str:
        return base64.b64encode(file.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "perfdiag-test",
                "cluster": {"server": server, "certificate-authority-data": b64(certs.ca_cert)},
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": b64(certs.admin_cert),
                    "client-key-data": b64(certs.admin_key),
                },
            }
        ],
        "contexts": [
            {
                "name": "perfdiag-test",
                "context": {"cluster": "perfdiag-test", "user": "admin", "namespace": "default"},
            }
        ],
        "current-context": "perfdiag-test",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def _start_etcd(bin_dir: Path, workdir: Path) -> tuple[ServerProcess, str]:
    for attempt in range(1, START_ATTEMPTS + 1):
        client, peer = free_port(), free_port()
        data_dir = workdir / "etcd-data"
        shutil.rmtree(data_dir, ignore_errors=True)
        url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        etcd = ServerProcess(
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name=perfdiag-test",
                f"--data-dir={data_dir}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=perfdiag-test={peer_url}",
                "--unsafe-no-fsync",  # throwaway data: durability buys nothing here
                "--log-level=warn",
                f"--quota-backend-bytes={2 << 30}",
            ],
            workdir / "logs" / "etcd.log",
        )
        etcd.start()
        try:
            etcd.wait_ready(partial(_etcd_healthy, url), timeout=30, what="healthy")
            return etcd, url
        except ServerStartError as exc:
            etcd.stop(kill=True)
            if not exc.port_conflict or attempt == START_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _etcd_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(json.load(response).get("health") == "true")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _apiserver_ready(server: str, context: ssl.SSLContext) -> bool:
    # /readyz first; `default` exists shortly after (the bootstrap controller makes it) and
    # tests create objects there.
    return _http_ok(f"{server}/readyz", context) and _http_ok(
        f"{server}/api/v1/namespaces/default", context
    )


def _apiserver_argv(
    bin_dir: Path, workdir: Path, certs: ControlPlaneCerts, etcd_url: str, port: int
) -> list[str]:
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        # Kubernetes ≥ 1.37 refuses a loopback address in the `kubernetes` service endpoints;
        # nothing in the tests reaches the apiserver through that service.
        "--endpoint-reconciler-type=none",
        f"--secure-port={port}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--cert-dir={workdir / 'apiserver-certs'}",
        f"--tls-cert-file={certs.serving_cert}",
        f"--tls-private-key-file={certs.serving_key}",
        f"--client-ca-file={certs.ca_cert}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={certs.service_account_public_key}",
        f"--service-account-signing-key-file={certs.service_account_key}",
        "--authorization-mode=RBAC",
        # No controller-manager issues service-account tokens here.
        "--disable-admission-plugins=ServiceAccount",
        "--enable-priority-and-fairness=false",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


def start_kube_cluster(bin_dir: Path, workdir: Path, ready_timeout: float = 60) -> KubeCluster:
    """Start etcd and kube-apiserver under `workdir`; return once /readyz answers and the
    `default` namespace exists. Raises ServerStartError with the log tail otherwise."""
    started = time.monotonic()
    certs = make_control_plane_certs(
        workdir / "pki", ips=("127.0.0.1", SERVICE_IP), dns_names=IN_CLUSTER_NAMES
    )
    etcd, etcd_url = _start_etcd(bin_dir, workdir)
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            port = free_port()
            server = f"https://127.0.0.1:{port}"
            apiserver = ServerProcess(
                "kube-apiserver",
                _apiserver_argv(bin_dir, workdir, certs, etcd_url, port),
                workdir / "logs" / "kube-apiserver.log",
            )
            kubeconfig = workdir / "kubeconfig"
            _write_kubeconfig(kubeconfig, server, certs)
            cluster = KubeCluster(
                bin_dir=bin_dir,
                workdir=workdir,
                certs=certs,
                etcd=etcd,
                apiserver=apiserver,
                server=server,
                kubeconfig=kubeconfig,
                ready_seconds=0.0,
            )
            context = cluster.ssl_context()
            apiserver.start()
            try:
                apiserver.wait_ready(partial(_apiserver_ready, server, context), ready_timeout)
            except ServerStartError as exc:
                apiserver.stop(kill=True)
                if not exc.port_conflict or attempt == START_ATTEMPTS:
                    raise
                continue
            cluster.ready_seconds = time.monotonic() - started
            return cluster
    except BaseException:
        etcd.stop(kill=True)
        raise
    raise AssertionError("unreachable")
