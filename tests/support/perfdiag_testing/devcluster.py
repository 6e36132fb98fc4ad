"""`make cluster`: the suite's control plane to try perfdiag on, in the foreground.

Starts what the cluster tests start (etcd + kube-apiserver, MinIO, the suite's kubelet), installs
the Kubeflow CRDs and the chart, runs the operator (with its pod webhook) as a local process in
place of the chart's Deployment (nothing here runs Deployments), plays the Kubeflow training
operator for PyTorchJobs in `default`, prints how to use it, and on SIGINT/SIGTERM stops every
process it started and removes its folder.

Run as `python -P -m perfdiag_testing.devcluster` (-P: the repository root must not be an
import root, its operator/ would hide the standard library's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfdiag_testing.binaries import BinariesMissing, find_bin_dir
from perfdiag_testing.certs import make_serving_cert
from perfdiag_testing.kube import KubeCluster, start_kube_cluster
from perfdiag_testing.kubelet import LocalKubelet
from perfdiag_testing.local_images import PERFDIAG_IMAGE, base_env, images
from perfdiag_testing.minio_server import MinioServer, start_minio
from perfdiag_testing.processes import free_port
from perfdiag_testing.training_operator import pytorchjob_pods

REPO_ROOT = Path(__file__).resolve().parents[3]
KUBEFLOW = REPO_ROOT.parent / "shared" / "kubeflow"
KUBEFLOW_CRDS = ("kubeflow.org_pytorchjobs.yaml", "trainer.kubeflow.org_trainjobs.yaml")
NEEDED = ("etcd", "kube-apiserver", "kubectl", "minio", "helm")
NAMESPACE = "default"  # where the kubelet and the training operator are played
RELEASE, RELEASE_NAMESPACE = "perfdiag", "perfdiag-system"
READY_LINE = "perfdiag cluster ready"
POLL_S = 1.0

log = logging.getLogger("perfdiag.devcluster")


@dataclass
class DevCluster:
    workdir: Path
    kube: KubeCluster
    minio: MinioServer
    operator: subprocess.Popen[bytes]
    operator_log: Path
    kubelet: LocalKubelet

    def operator_state(self) -> str:
        code = self.operator.poll()
        state = "running" if code is None else f"exited {code}"
        return f"{state} (pid {self.operator.pid}, log {self.operator_log})"


def _install(kube: KubeCluster, minio: MinioServer, workdir: Path) -> None:
    """The Kubeflow CRDs, the chart (its CRD, RBAC, ServiceAccount; its Deployment is played by
    the local operator, so the chart's webhook is left to that operator) and the storage
    Secrets."""
    for name in KUBEFLOW_CRDS:
        kube.kubectl("apply", "--server-side", "-f", str(KUBEFLOW / name), timeout=120)
    helm_home = workdir / "helm"
    helm_env = {
        **os.environ,
        **kube.env(),
        **{f"HELM_{k}_HOME": str(helm_home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")},
    }
    storage = f"s3://{minio.bucket}/perfdiag"
    subprocess.run(
        [str(kube.bin_dir / "helm"), "install", RELEASE, str(REPO_ROOT / "charts" / "perfdiag"),
         "--namespace", RELEASE_NAMESPACE, "--create-namespace", "--set", "webhook.enabled=false",
         "--set", f"storage.uri={storage}", "--set", f"storage.endpoint={minio.url}"],
        env=helm_env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                 "crd/perfdiagnoses.perfdiag.io", "crd/pytorchjobs.kubeflow.org")  # fmt: skip
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "perfdiag-storage"},
        "stringData": minio.env(),
    }
    for namespace in (RELEASE_NAMESPACE, NAMESPACE):
        kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(secret))


def operator_env(
    kube: KubeCluster, minio: MinioServer, workdir: Path, *, image: str, recheck_s: float
) -> dict[str, str]:
    """The variables of a local `perfdiag operator` configured as the chart's container is:
    the cluster, MinIO as its storage, a webhook on loopback that kopf registers (the apiserver
    verifies it with the cluster's CA; its certificate is made in `workdir`)."""
    cert, key = make_serving_cert(
        kube.certs.ca_cert, kube.certs.ca_key, workdir / "webhook-tls", "perfdiag-webhook"
    )
    return {
        **kube.env(),
        **minio.env(),
        "PERFDIAG_STORAGE": f"s3://{minio.bucket}/perfdiag",
        "PERFDIAG_IMAGE": image,
        "PERFDIAG_RECHECK_SECONDS": f"{recheck_s:g}",
        "PERFDIAG_WEBHOOK_PORT": str(free_port()),
        "PERFDIAG_WEBHOOK_ADDR": "127.0.0.1",
        "PERFDIAG_WEBHOOK_CERT": str(cert),
        "PERFDIAG_WEBHOOK_KEY": str(key),
        "PERFDIAG_WEBHOOK_CA": str(kube.certs.ca_cert),
    }


def _start_operator(
    kube: KubeCluster, minio: MinioServer, workdir: Path
) -> tuple[subprocess.Popen[bytes], Path]:
    """`perfdiag operator` as the chart's container runs it (operator_env)."""
    env = {
        **os.environ,
        **operator_env(kube, minio, workdir, image=PERFDIAG_IMAGE, recheck_s=2),
    }
    log_path = workdir / "operator.log"
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "perfdiag"), "operator", "--all-namespaces"],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    return process, log_path


def _wait_webhook(kube: KubeCluster, process: subprocess.Popen[bytes], timeout: float) -> None:
    """Until the apiserver calls the operator's pod webhook (a dry-run pod gets the hook)."""
    probe = json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probe", "labels": {"perfdiag.io/inject": "true"}},
        "spec": {"containers": [{"name": "pytorch", "image": "x"}]},
    })  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the operator exited {process.returncode}")
        done = kube.kubectl("create", "-n", NAMESPACE, "--dry-run=server", "-o", "json",
                            "-f", "-", input=probe, check=False)  # fmt: skip
        if done.returncode == 0 and json.loads(done.stdout)["spec"].get("initContainers"):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the operator's pod webhook did not answer within {timeout:g} s")


def _play_training_operator(kube: KubeCluster, stop: threading.Event) -> None:
    """Create the pods of each new PyTorchJob in NAMESPACE, as the training operator does."""
    import kubernetes

    client = kube.api_client()
    custom: Any = kubernetes.client.CustomObjectsApi(client)
    core: Any = kubernetes.client.CoreV1Api(client)
    done: set[str] = set()
    while not stop.wait(POLL_S):
        try:
            jobs = custom.list_namespaced_custom_object(
                "kubeflow.org", "v1", NAMESPACE, "pytorchjobs"
            )["items"]
            for job in jobs:
                uid = job["metadata"]["uid"]
                if uid not in done:
                    for pod in pytorchjob_pods(job):
                        with contextlib.suppress(kubernetes.client.ApiException):
                            core.create_namespaced_pod(NAMESPACE, pod)
                    done.add(uid)
        except Exception:
            log.exception("training operator: sync failed")


@contextlib.contextmanager
def dev_cluster(workdir: Path, bin_dir: Path) -> Iterator[DevCluster]:
    """Everything started in `workdir`, stopped (in reverse order) when the block ends."""
    with contextlib.ExitStack() as stack:
        kube = start_kube_cluster(bin_dir, workdir / "kube")
        stack.callback(kube.stop)
        minio = start_minio(bin_dir / "minio", workdir / "minio")
        stack.callback(minio.stop)
        _install(kube, minio, workdir)
        operator, operator_log = _start_operator(kube, minio, workdir)
        stack.callback(_stop_process, operator)
        _wait_webhook(kube, operator, timeout=60)
        kubelet = LocalKubelet(
            kube.api_client(), NAMESPACE, workdir / "kubelet", images(workdir), base_env()
        ).start()
        stack.callback(kubelet.stop)
        stop = threading.Event()
        player = threading.Thread(target=_play_training_operator, args=(kube, stop), daemon=True)
        player.start()
        stack.callback(player.join, 10)
        stack.callback(stop.set)
        yield DevCluster(workdir, kube, minio, operator, operator_log, kubelet)


def _stop_process(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def usage(cluster: DevCluster) -> str:
    """What `make cluster` prints once ready."""
    kubeconfig = cluster.kube.kubeconfig
    return "\n".join([
        f"{READY_LINE}: KUBECONFIG={kubeconfig}",
        f"  apiserver {cluster.kube.server}, MinIO {cluster.minio.url} "
        f"(bucket {cluster.minio.bucket}), state in {cluster.workdir}",
        f"  operator: {cluster.operator_state()}",
        f"  the suite's kubelet runs the pods of namespace {NAMESPACE!r} as local processes",
        "In another shell:",
        f"  export KUBECONFIG={kubeconfig}",
        "  kubectl apply -f docs/examples/pytorchjob-opted-in.yaml",
        "  kubectl apply -f docs/examples/pytorchjob.yaml",
        "  kubectl get perfdiagnosis -w",
        "Ctrl-C (or SIGTERM) stops everything and removes the state.",
    ])  # fmt: skip


class _Stop(Exception):
    pass


def _raise_stop(signum: int, _frame: Any) -> None:
    # Once: a second Ctrl-C must not cut the cleanup short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise _Stop(signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make cluster", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        bin_dir = find_bin_dir(NEEDED, repo_root=REPO_ROOT)
    except BinariesMissing as exc:
        print(f"make cluster: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    workdir = Path(tempfile.mkdtemp(prefix="perfdiag-cluster-"))
    try:
        print(f"starting etcd, kube-apiserver, MinIO, the operator in {workdir} ...", flush=True)
        with dev_cluster(workdir, bin_dir) as cluster:
            print(usage(cluster), flush=True)
            while cluster.operator.poll() is None:
                time.sleep(POLL_S)
            print(f"the operator exited: see {cluster.operator_log}", file=sys.stderr)
            return 1
    except _Stop:
        print("stopping ...", flush=True)
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        print("stopped; state removed", flush=True)


if __name__ == "__main__":
    sys.exit(main())
