"""The control plane at a few hundred pods (docs/benchmarks.md, "Control plane at scale"; the
full figures come from benchmarks/control_plane_scale.py): the operator as a local process on
the real apiserver and MinIO, its webhook taking a burst of pod creations, every pod armed, the
ranks' synthetic status reports collected, Ready; the operator's API requests, read from the
apiserver's own metrics, stay a fixed number per pod plus a fixed number per pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from perfdiag_testing.scale_load import install_crd, run_scale

PODS = 300
RECHECK_S = 2.0


@pytest.mark.cluster
def test_arming_and_requests_stay_per_pod_at_300_pods(
    kube_cluster: Any, minio_server: Any, kube_namespace: str, tmp_path: Path
) -> None:
    if not minio_server.running():
        minio_server.start()
    install_crd(kube_cluster)
    result = run_scale(
        kube_cluster, minio_server, tmp_path, kube_namespace, PODS,
        recheck_s=RECHECK_S, heartbeat_s=5.0, timeout_s=240,
    )  # fmt: skip
    burst, timeline, requests = result.burst, result.timeline, result.operator_requests
    summary = result.to_json()

    # The webhook: every pod created and injected, none through the fail-open path.
    assert (burst.rejected, burst.not_injected, burst.fail_open) == (0, 0, 0), summary
    # Armed: every pod's agent read the capture plan in storage once the status said so.
    assert result.armed_pods == PODS, summary
    assert timeline.decided is not None and timeline.armed is not None, summary
    assert timeline.ready is not None, summary

    # Per pod: one annotation patch for the watch plan, one for the capture plan, one to take
    # it off at the end; nothing else the operator sends grows with the pods.
    assert requests.get("PATCH pods", 0) <= 3 * PODS, summary
    per_pass = {k: v for k, v in requests.items() if k != "PATCH pods"}
    passes = (timeline.ready or 0.0) / RECHECK_S + 10  # rechecks + change-driven passes
    # A pass reads the diagnosis and the target (a GET, one LIST of the pods: 1,000 a page),
    # and writes at most a status, an Event or two, the Job: far fewer than 10 per pass.
    assert sum(per_pass.values()) <= 10 * passes, summary
    assert requests.get("LIST pods", 0) <= passes, summary
    assert not [k for k in requests if k.startswith("GET pods")], summary  # no GET per pod
