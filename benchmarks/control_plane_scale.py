"""The operator's control plane at 1,000 and 10,000 pods (docs/benchmarks.md, "Control plane
at scale").

    .venv/bin/python -P benchmarks/control_plane_scale.py --pods 1000 [--pods 10000] \
        [--recheck-seconds 15] [--heartbeat-seconds 5] [--json out.json]

Starts the suite's etcd + kube-apiserver and MinIO (perfdiag_testing, the binaries of
scripts/test-binaries.sh), installs the CRD, and for each --pods N, in a namespace of its own:
starts `perfdiag operator` as a local process with its pod webhook on loopback, creates N pods
in one burst through that webhook, marks them Running without starting anything, `kubectl
apply`s a PerfDiagnosis of them and plays the ranks' status reports (every rank every
--heartbeat-seconds, as the agents send them) and the analyzer Job until it is Ready
(perfdiag_testing.scale_load). Prints one table per run and, with --json, every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from perfdiag_testing.binaries import BinariesMissing, find_bin_dir
from perfdiag_testing.kube import start_kube_cluster
from perfdiag_testing.minio_server import start_minio
from perfdiag_testing.scale_load import ScaleResult, install_crd, run_scale

REPO_ROOT = Path(__file__).resolve().parents[1]


def _s(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f} s"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def table(result: ScaleResult, servers_s: float) -> str:
    t, b = result.timeline, result.burst
    armed_after_decision = (
        None if t.armed is None or t.decided is None else round(t.armed - t.decided, 2)
    )
    writes_only = (
        None if t.armed is None or t.first_armed is None else round(t.armed - t.first_armed, 2)
    )
    n = result.pods
    requests = result.operator_requests
    rows = [
        ("pods", f"{n:,}"),
        ("etcd + kube-apiserver + MinIO up", f"{servers_s:.1f} s"),
        ("operator started → webhook called", f"{result.startup_seconds:.1f} s"),
        (
            "webhook burst: pods created",
            f"{b.pods - b.rejected:,}/{b.pods:,} in {b.seconds:.1f} s, "
            f"{b.rejected} rejected, {b.not_injected} not injected, {b.fail_open} failed open",
        ),
        *[("  refused", reason) for reason in b.rejections],
        ("  POST pod latency p50 / p99 (client)", f"{_ms(b.client.p50_ms)} / {_ms(b.client.p99_ms)}"),
        ("  webhook latency p50 / p99 (apiserver)", f"{_ms(b.webhook.p50_ms)} / {_ms(b.webhook.p99_ms)}"),
        ("pods marked Running", f"{result.running_seconds:.1f} s"),
        ("kubectl apply returned", _s(t.applied)),
        ("watch plan in status (Watching)", _s(t.watching)),
        ("arming pass decided (after its reads)", _s(t.decided)),
        ("  of which the pass read the pods and statuses", _s(result.arming_read_seconds)),
        ("first pod's capture plan readable in storage", _s(t.first_armed)),
        ("every pod's capture plan readable in storage (armed)", _s(t.armed)),
        ("  armed after the decision / writes alone", f"{_s(armed_after_decision)} / {_s(writes_only)}"),
        ("every annotation written (status.window seen)", _s(t.annotated)),
        ("window's statuses collected (Analyzing)", _s(t.collected)),
        ("Ready", _s(t.ready)),
        ("pods whose agent reads the capture plan", f"{result.armed_pods:,}/{n:,}"),
        ("operator peak RSS (since start)", f"{result.operator_peak_rss_mb:.0f} MB"),
        ("operator CPU, apply → Ready", f"{result.operator_cpu_seconds:.1f} s"),
        (
            "operator API requests, apply → Ready",
            f"{result.requests_total():,} ({result.requests_total() / n:.2f} per pod, "
            f"{result.requests_total() / max(t.ready or 1.0, 1.0):.1f}/s)",
        ),
        *[(f"  {key}", f"{count:,} ({count / n:.3f} per pod)") for key, count in requests.items()],
        *[
            (f"apiserver {verb} latency p50 / p99", f"{_ms(q.p50_ms)} / {_ms(q.p99_ms)} ({q.count:,})")
            for verb, q in result.apiserver_latency.items()
        ],
        (
            "synthetic status reports",
            f"{result.status_writes:,} in {result.heartbeat_rounds} rounds, "
            f"{result.heartbeat_round_seconds:.1f} s per round of {n:,}",
        ),
        ("load average (1, 5, 15 min) at the end", " ".join(f"{x:.2f}" for x in result.load_average)),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, action="append", help="pods (repeatable)")
    parser.add_argument("--recheck-seconds", type=float, default=15.0,
                        help="the operator's recheck (default 15, the operator's own)")  # fmt: skip
    parser.add_argument("--heartbeat-seconds", type=float, default=5.0,
                        help="seconds between two status reports of a rank (default 5)")  # fmt: skip
    parser.add_argument("--step-ms", type=float, default=100.0, help="the ranks' step time")
    parser.add_argument("--threads", type=int, default=16,
                        help="concurrent clients of the pod burst and the status writers")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=1200.0, help="per run, seconds")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep the servers' folder")
    args = parser.parse_args(argv)
    sizes = args.pods or [1000]
    try:
        bin_dir = find_bin_dir(("etcd", "kube-apiserver", "kubectl", "minio"), repo_root=REPO_ROOT)
    except BinariesMissing as exc:
        print(f"control_plane_scale: {exc}", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="perfdiag-scale-"))
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}; servers in {workdir}")
    results = []
    began = time.monotonic()
    kube = start_kube_cluster(bin_dir, workdir / "kube")
    try:
        minio = start_minio(bin_dir / "minio", workdir / "minio")
        try:
            install_crd(kube)
            servers_s = time.monotonic() - began
            for n in sizes:
                namespace = f"scale-{n}"
                kube.kubectl("create", "namespace", namespace)
                print(f"\n== {n:,} pods", flush=True)
                result = run_scale(
                    kube, minio, workdir / namespace, namespace, n,
                    recheck_s=args.recheck_seconds, heartbeat_s=args.heartbeat_seconds,
                    step_ms=args.step_ms, threads=args.threads, timeout_s=args.timeout,
                    progress=lambda line: print(f"   {line}", flush=True),
                )  # fmt: skip
                print(table(result, servers_s), flush=True)
                results.append(asdict(result))
                if args.json:
                    args.json.write_text(json.dumps(results, indent=2))
        finally:
            minio.stop()
    finally:
        kube.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
