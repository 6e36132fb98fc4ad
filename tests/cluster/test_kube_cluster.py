"""The kube_cluster fixture: a real apiserver that kubectl and the Python client both reach."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import pytest
from kubernetes import client

from perfdiag_testing.kube import KubeCluster

pytestmark = pytest.mark.cluster


def test_kubectl_talks_to_the_apiserver_as_admin(kube_cluster: KubeCluster) -> None:
    who = json.loads(kube_cluster.kubectl("auth", "whoami", "-o", "json").stdout)
    assert who["status"]["userInfo"]["username"] == "admin"
    assert "system:masters" in who["status"]["userInfo"]["groups"]
    assert kube_cluster.kubectl("auth", "can-i", "*", "*").stdout.strip() == "yes"
    version = json.loads(kube_cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.")


def test_kubectl_check_raises_with_stderr(kube_cluster: KubeCluster) -> None:
    with pytest.raises(RuntimeError, match=r"NotFound|not found"):
        kube_cluster.kubectl("get", "configmap", "no-such-thing")
    result = kube_cluster.kubectl("get", "configmap", "no-such-thing", check=False)
    assert result.returncode != 0


def test_python_client_creates_and_reads_objects(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    with kube_cluster.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm"), data={"k": "v"})
        core.create_namespaced_config_map(kube_namespace, body)
        assert core.read_namespaced_config_map("cm", kube_namespace).data == {"k": "v"}
    listed = kube_cluster.kubectl("get", "configmap", "cm", "-n", kube_namespace, "-o", "json")
    assert json.loads(listed.stdout)["data"] == {"k": "v"}


def test_pods_are_admitted_without_service_account_tokens(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    """No controller-manager makes tokens, so the ServiceAccount admission plugin is off; pods
    are stored (and stay Pending: there is no kubelet)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": kube_namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    stored = json.loads(
        kube_cluster.kubectl("get", "pod", "p", "-n", kube_namespace, "-o", "json").stdout
    )
    assert stored["status"]["phase"] == "Pending"


def test_rbac_is_enforced_for_other_users(kube_cluster: KubeCluster) -> None:
    denied = kube_cluster.kubectl(
        "auth", "can-i", "list", "pods", "--as", "someone", check=False
    ).stdout.strip()
    assert denied == "no"


def test_serving_certificate_is_valid_for_loopback_names(kube_cluster: KubeCluster) -> None:
    context = ssl.create_default_context(cafile=str(kube_cluster.ca_file))  # verifies hostnames
    port = kube_cluster.server.rsplit(":", 1)[1]
    for host in ("127.0.0.1", "localhost"):
        # An SSL error would surface as URLError; any HTTP answer means TLS was accepted.
        try:
            with urllib.request.urlopen(f"https://{host}:{port}/livez", context=context) as resp:
                status = resp.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        assert status in (200, 401, 403), (host, status)


def test_kubeconfig_is_self_contained(kube_cluster: KubeCluster) -> None:
    text = kube_cluster.kubeconfig.read_text()
    assert "certificate-authority-data" in text and "client-key-data" in text
    assert kube_cluster.server in text
    assert kube_cluster.env()["KUBECONFIG"] == str(kube_cluster.kubeconfig)
