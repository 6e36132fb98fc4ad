"""The operator's control plane at scale: a PerfDiagnosis of N pods on the suite's real
apiserver and MinIO, with the ranks played by a synthetic load (docs/benchmarks.md, "Control
plane at scale"; used by benchmarks/control_plane_scale.py and
tests/operator/test_control_plane_scale.py).

What runs for real: etcd + kube-apiserver, MinIO, `perfdiag operator` as a local process (its
pod webhook served on loopback and called by the apiserver), `kubectl apply`. What is played:

- the pods: N pods labelled for injection and as one PyTorchJob's workers, created in a burst
  through the webhook, then marked Running (their status written as a kubelet would) without
  starting a container;
- the agents: each rank's `workers/<rank>/status.json` under the plan the operator published,
  rewritten every `heartbeat_s` (the agents' default rate: their step moved since the last
  one), with a steady step time; a rank reports `done` once its synthetic step passed the
  window;
- the Job controller: once the analyzer Job exists, a small verdict.json goes to the capture
  and the Job is marked Complete.

The synthetic ranks learn the plans from the diagnosis' status (one GET every `poll_s`), where
real agents read their pod's plan object: the operator writes the status after every pod's
plan, so they adopt each plan no earlier than real agents would.

Request counts come from the apiserver's own /metrics (apiserver_request_total), read before
and after; the requests this module makes in between are counted here and subtracted, so what
remains is the operator's.
"""

from __future__ import annotations

import io
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from perfdiag.api.diagnosis import GROUP, PLURAL, VERSION
from perfdiag.api.plan import Plan
from perfdiag.api.verdict import StepTimes, Verdict, WindowInfo
from perfdiag.api.worker import WorkerPhase, WorkerStatus
from perfdiag.collector.pod_plan import successor_key
from perfdiag.operator.analyzer_job import job_name
from perfdiag_testing.devcluster import operator_env
from perfdiag_testing.kube import KubeCluster
from perfdiag_testing.minio_server import MinioServer
from perfdiag_testing.processes import _death_signal_prefix

REPO_ROOT = Path(__file__).resolve().parents[3]
PERFDIAG_CRD = REPO_ROOT / "crds" / "perfdiagnosis.yaml"
JOB = "scale-train"
POD_LABELS = {
    "perfdiag.io/inject": "true",
    "training.kubeflow.org/job-name": JOB,
    "training.kubeflow.org/operator-name": "pytorchjob-controller",
    "training.kubeflow.org/replica-type": "worker",
}
SELECTOR = {k: v for k, v in POD_LABELS.items() if k != "perfdiag.io/inject"}
DIAGNOSIS = "scale"
LEAD_SECONDS = 10.0  # the operator's default capture lead, set explicitly to time the decision
TIMEOUT_SECONDS = 600  # capture.timeoutSeconds (the default), ditto
WEBHOOK = "perfdiag.io"


# ---- results ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Quantiles:
    count: int
    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class Burst:
    """N pod creations through the webhook."""

    pods: int
    seconds: float
    rejected: int  # creations the apiserver refused
    not_injected: int  # created without perfdiag (the webhook failed open, or was not called)
    client: Quantiles  # POST latency as the creating client saw it
    webhook: Quantiles  # the apiserver's own admission-webhook latency histogram
    fail_open: int  # apiserver_admission_webhook_fail_open_count
    rejections: tuple[str, ...]  # the first few refusals, as the client got them


@dataclass(frozen=True)
class Timeline:
    """Seconds after `kubectl apply` began (None: not reached)."""

    applied: float
    watching: float | None  # status.watch.planId visible
    decided: float | None  # the arming pass decided, after its reads (the plan deadline's clock)
    first_armed: float | None  # the first pod's agent could read the capture plan in storage
    armed: float | None  # every pod's agent could
    annotated: float | None  # status.window visible: written after every annotation
    collected: float | None  # phase Analyzing: every rank's window status read
    ready: float | None  # Ready=True


@dataclass(frozen=True)
class ScaleResult:
    pods: int
    startup_seconds: float  # the operator started → its webhook called by the apiserver
    burst: Burst
    running_seconds: float  # every pod marked Running
    timeline: Timeline
    armed_pods: int  # pods whose agent read the capture plan in storage once the status said armed
    operator_peak_rss_mb: float
    operator_cpu_seconds: float  # during apply → Ready
    arming_read_seconds: float | None  # the arming pass' reads before it decided (its log)
    operator_requests: dict[str, int]  # "VERB resource[/sub]" → count, apply → Ready
    apiserver_latency: dict[str, Quantiles]  # verb → latency of every request, apply → Ready
    heartbeat_rounds: int
    heartbeat_round_seconds: float  # mean time to write one round of N statuses
    status_writes: int
    load_average: tuple[float, float, float]

    def requests_total(self) -> int:
        return sum(self.operator_requests.values())

    def to_json(self) -> str:
        from dataclasses import asdict

        return json.dumps(asdict(self), indent=2, sort_keys=True)


# ---- Prometheus text ------------------------------------------------------------------------
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(kube: KubeCluster) -> Samples:
    """The apiserver's /metrics (its own, through kubectl)."""
    text = kube.kubectl("get", "--raw", "/metrics", timeout=60).stdout
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def delta(before: Samples, after: Samples, name: str) -> Samples:
    return {
        key: value - before.get(key, 0.0)
        for key, value in after.items()
        if key[0] == name and value - before.get(key, 0.0) > 0
    }


def histogram_quantiles(buckets: dict[float, float]) -> Quantiles:
    """p50 and p99 from cumulative bucket counts (upper bound → count), interpolated inside
    the bucket as Prometheus' histogram_quantile does."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return Quantiles(0, None, None)

    def quantile(q: float) -> float:
        rank = q * total
        lower, below = 0.0, 0.0
        for bound in bounds:
            count = buckets[bound]
            if count >= rank:
                if bound == float("inf"):
                    return lower * 1000
                inside = count - below
                share = (rank - below) / inside if inside else 1.0
                return (lower + (bound - lower) * share) * 1000
            lower, below = bound, count
        return lower * 1000

    return Quantiles(int(total), round(quantile(0.5), 1), round(quantile(0.99), 1))


def bucket_sum(samples: Samples, keep: Callable[[dict[str, str]], bool]) -> dict[float, float]:
    buckets: dict[float, float] = {}
    for (_, labels), value in samples.items():
        found = dict(labels)
        if keep(found):
            bound = float(found["le"])
            buckets[bound] = buckets.get(bound, 0.0) + value
    return buckets


def client_quantiles(seconds: list[float]) -> Quantiles:
    if not seconds:
        return Quantiles(0, None, None)
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return Quantiles(
        len(ordered), round(statistics.median(ordered) * 1000, 1), round(p99 * 1000, 1)
    )


def request_key(verb: str, resource: str, subresource: str = "") -> str:
    return f"{verb} {resource}{'/' + subresource if subresource else ''}"


# ---- the operator process -------------------------------------------------------------------
@dataclass
class OperatorProcess:
    process: subprocess.Popen[bytes]
    log_path: Path

    def rss_mb(self) -> float:
        return _proc_status_kb(self.process.pid, "VmRSS") / 1024

    def peak_rss_mb(self) -> float:
        return _proc_status_kb(self.process.pid, "VmHWM") / 1024

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _proc_status_kb(pid: int, field_name: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return float(line.split()[1])
    return 0.0


def start_operator(
    kube: KubeCluster, minio: MinioServer, workdir: Path, namespace: str, recheck_s: float
) -> OperatorProcess:
    """`perfdiag operator -n <namespace>` as the chart's container runs it, its webhook on
    loopback (registered by kopf, verified by the apiserver with the cluster's CA)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PERFDIAG_")},
        **operator_env(kube, minio, workdir, image="perfdiag:scale", recheck_s=recheck_s),
        "PERFDIAG_CAPTURE_LEAD_SECONDS": str(LEAD_SECONDS),
    }
    log_path = workdir / "operator.log"
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            # pdeathsig: a run killed outright takes its operator with it.
            [*_death_signal_prefix(), str(Path(sys.executable).parent / "perfdiag"),
             "operator", "-n", namespace],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    return OperatorProcess(process, log_path)


def wait_webhook(kube: KubeCluster, namespace: str, operator: OperatorProcess) -> None:
    """Until the apiserver calls the operator's webhook (a dry-run pod comes back injected)."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace, "labels": POD_LABELS},
        "spec": {"containers": [{"name": "pytorch", "image": "x"}]},
    }
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if operator.process.poll() is not None:
            raise RuntimeError(f"the operator exited:\n{operator.log_path.read_text()[-3000:]}")
        done = kube.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-",
            input=json.dumps(probe), check=False,
        )  # fmt: skip
        if done.returncode == 0 and json.loads(done.stdout)["spec"].get("initContainers"):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the webhook was never called:\n{operator.log_path.read_text()[-3000:]}")


# ---- pods -----------------------------------------------------------------------------------
class _Clients:
    """One kubernetes ApiClient per thread (each has its own connection pool)."""

    def __init__(self, kube: KubeCluster) -> None:
        self.kube = kube
        self.local = threading.local()

    def core(self) -> Any:
        import kubernetes

        if not hasattr(self.local, "core"):
            self.local.core = kubernetes.client.CoreV1Api(self.kube.api_client())
        return self.local.core


def pod_manifest(index: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{JOB}-worker-{index}", "labels": POD_LABELS},
        "spec": {"containers": [{"name": "pytorch", "image": "pytorch:none"}]},
    }


def create_pods(
    kube: KubeCluster, namespace: str, pods: int, threads: int, before: Samples
) -> tuple[Burst, list[dict[str, Any]]]:
    """Create `pods` pods at once from `threads` clients; returns the burst's figures and the
    created pods as listed after it."""
    clients = _Clients(kube)
    latencies: list[float] = []
    rejected = 0
    rejections: list[str] = []
    lock = threading.Lock()

    def create(index: int) -> None:
        nonlocal rejected
        began = time.monotonic()
        try:
            clients.core().create_namespaced_pod(
                namespace, pod_manifest(index), _preload_content=False
            )
        except Exception as exc:
            with lock:
                rejected += 1
                if len(rejections) < 3:
                    reason = getattr(exc, "reason", None) or type(exc).__name__
                    body = str(getattr(exc, "body", "") or exc)[:300]
                    rejections.append(f"{getattr(exc, 'status', '')} {reason}: {body}")
            return
        with lock:
            latencies.append(time.monotonic() - began)

    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(create, range(pods)))
    seconds = time.monotonic() - began
    after = scrape(kube)
    created = list_pods(kube, namespace)
    not_injected = sum(
        1 for p in created if "perfdiag.io/injected" not in (p["metadata"].get("annotations") or {})
    )
    webhook = bucket_sum(
        delta(before, after, "apiserver_admission_webhook_admission_duration_seconds_bucket"),
        lambda labels: "perfdiag" in labels.get("name", "") and labels.get("operation") == "CREATE",
    )
    fail_open = sum(
        delta(before, after, "apiserver_admission_webhook_fail_open_count_total").values()
    ) + sum(delta(before, after, "apiserver_admission_webhook_fail_open_count").values())
    burst = Burst(
        pods=pods,
        seconds=round(seconds, 2),
        rejected=rejected,
        not_injected=not_injected,
        client=client_quantiles(latencies),
        webhook=histogram_quantiles(webhook),
        fail_open=int(fail_open),
        rejections=tuple(rejections),
    )
    return burst, created


def list_pods(kube: KubeCluster, namespace: str) -> list[dict[str, Any]]:
    import kubernetes

    core: Any = kubernetes.client.CoreV1Api(kube.api_client())
    selector = ",".join(f"{k}={v}" for k, v in SELECTOR.items())
    response = core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(response.data)["items"]
    return items


def mark_running(kube: KubeCluster, namespace: str, names: list[str], threads: int) -> float:
    """Every pod Running, as a kubelet reports it (no container is started)."""
    clients = _Clients(kube)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def run(item: tuple[int, str]) -> None:
        index, name = item
        ip = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
        status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "startTime": now}
        clients.core().patch_namespaced_pod_status(
            name, namespace, {"status": status}, _preload_content=False
        )

    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(run, enumerate(names)))
    return time.monotonic() - began


def _stamp(modified: datetime | None) -> float:
    """An object's Last-Modified as Unix time (MinIO always sends it)."""
    assert modified is not None
    return modified.timestamp()


# ---- the synthetic agents, the poller, the Job controller -----------------------------------
@dataclass
class _Observed:
    """What the poller saw of the diagnosis, with when (monotonic)."""

    status: dict[str, Any] = field(default_factory=dict)
    watching: float | None = None
    window: float | None = None
    analyzing: float | None = None
    ready: float | None = None
    failed: str | None = None
    armed_pods: int = 0
    first_armed: float | None = None
    armed: float | None = None
    decided: float | None = None


class _Load:
    """The poller, the synthetic agents and the Job controller, in threads."""

    def __init__(
        self,
        kube: KubeCluster,
        minio: MinioServer,
        namespace: str,
        ranks: list[str],
        *,
        heartbeat_s: float,
        step_ms: float,
        poll_s: float,
        writers: int,
    ) -> None:
        import kubernetes
        import urllib3
        from minio import Minio

        self.kube, self.minio, self.namespace, self.ranks = kube, minio, namespace, ranks
        self.heartbeat_s, self.step_ms, self.poll_s = heartbeat_s, step_ms, poll_s
        self.writers = writers
        client = kube.api_client()
        self.custom: Any = kubernetes.client.CustomObjectsApi(client)
        self.batch: Any = kubernetes.client.BatchV1Api(client)
        self.s3 = Minio(
            minio.endpoint,
            access_key=minio.access_key,
            secret_key=minio.secret_key,
            secure=False,
            http_client=urllib3.PoolManager(maxsize=writers + 4),
        )
        self.requests: Counter[str] = Counter()  # this module's apiserver requests
        self.seen = _Observed()
        self.stop = threading.Event()
        self.began_unix = time.time()
        self.began = time.monotonic()
        self.rounds: list[float] = []
        self.writes = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()

    # -- time
    def _mono_of_unix(self, unix: float) -> float:
        return self.began + (unix - self.began_unix)

    def step_now(self) -> int:
        return int((time.time() - self.began_unix) * 1000 / self.step_ms) + 1000

    # -- the poller
    def poll(self) -> None:
        while not self.stop.is_set():
            try:
                self._poll_once()
            except Exception as exc:  # shown in the result; the run then times out
                self.errors.append(f"poll: {exc!r}")
            self.stop.wait(self.poll_s)

    def _poll_once(self) -> None:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, DIAGNOSIS
        )
        self.requests[request_key("GET", PLURAL)] += 1
        status: dict[str, Any] = obj.get("status") or {}
        now = time.monotonic()
        seen = self.seen
        seen.status = status
        if seen.watching is None and (status.get("watch") or {}).get("planId"):
            seen.watching = now
        if seen.window is None and (status.get("window") or {}).get("planId"):
            seen.window = now
            self._time_arming(status)
        if seen.analyzing is None and status.get("phase") in ("Analyzing", "Succeeded"):
            seen.analyzing = now
            self._complete_job(obj)
        if status.get("phase") == "Failed":
            seen.failed = json.dumps(status.get("conditions"))
        for cond in status.get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True" and not seen.ready:
                seen.ready = now

    def _time_arming(self, status: dict[str, Any]) -> None:
        """Every pod's plan as its agent reads it right after the status said armed (before the
        capture can end and take it away): the pod's object, or the successor of the watch plan
        it holds (perfdiag.collector.pod_plan, the agent's own reading). How many pods get the
        capture plan, and when the first and the last of them could: a pod's plan is there once
        every object it reads was written."""
        plan_id = status["window"]["planId"]
        prefix = f"perfdiag/{self.namespace}/"
        objects = list(self.s3.list_objects(self.minio.bucket, prefix=f"{prefix}pod-plans/"))
        by_content: dict[str, list[float]] = {}
        for o in objects:
            by_content.setdefault(str(o.etag), []).append(_stamp(o.last_modified))
        stamps: list[float] = []
        for etag, written in by_content.items():
            sample = next(o for o in objects if str(o.etag) == etag)
            text = self._read(str(sample.object_name))
            successor = successor_key(text)
            if successor is not None:
                # Listed, not HEAD: a listing gives the time to the millisecond.
                key = f"{prefix}{successor}"
                found = [o for o in self.s3.list_objects(self.minio.bucket, prefix=key)]
                if not found:
                    continue  # no successor: these pods keep the watch plan
                text = self._read(key)
                written = [max(w, _stamp(found[0].last_modified)) for w in written]
            plan = Plan.model_validate_json(text)
            if plan.id != plan_id:
                continue
            stamps += written
            if plan.deadline is not None:
                decided = plan.deadline.timestamp() - TIMEOUT_SECONDS - LEAD_SECONDS
                self.seen.decided = self._mono_of_unix(decided)
        if not stamps:
            self.errors.append(f"no pod reads the capture plan {plan_id}")
            return
        self.seen.armed_pods = len(stamps)
        self.seen.first_armed = self._mono_of_unix(min(stamps))
        self.seen.armed = self._mono_of_unix(max(stamps))

    def _read(self, key: str) -> bytes:
        answer = self.s3.get_object(self.minio.bucket, key)
        try:
            return bytes(answer.read())
        finally:
            answer.close()
            answer.release_conn()

    def _complete_job(self, obj: dict[str, Any]) -> None:
        """The Job controller: the analyzer Job's verdict written, the Job marked Complete."""
        meta = obj["metadata"]
        name = job_name(meta["name"], meta["uid"])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                self.batch.read_namespaced_job(name, self.namespace, _preload_content=False)
                self.requests[request_key("GET", "jobs")] += 1
                break
            except Exception:
                self.requests[request_key("GET", "jobs")] += 1
                time.sleep(0.2)
        prefix = str(obj["status"]["artifacts"]["prefix"])
        verdict = Verdict(
            status="healthy",
            summary="synthetic",
            workers=[],
            window=WindowInfo(
                start_step=1, steps=10, step_time_ms=StepTimes(median=1, max=1, per_rank={})
            ),
        )
        self._put(f"{prefix}/verdict.json", verdict.to_json())
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {"status": "True", "lastProbeTime": stamp, "lastTransitionTime": stamp}
        self.batch.patch_namespaced_job_status(
            name,
            self.namespace,
            {
                "status": {
                    "startTime": stamp,
                    "completionTime": stamp,
                    "succeeded": 1,
                    "conditions": [
                        {**condition, "type": "SuccessCriteriaMet", "reason": "CompletionsReached"},
                        {**condition, "type": "Complete", "reason": "CompletionsReached"},
                    ],
                }
            },
            _preload_content=False,
        )
        self.requests[request_key("PATCH", "jobs", "status")] += 1

    # -- the agents
    def _put(self, uri: str, text: str) -> None:
        assert uri.startswith(f"s3://{self.minio.bucket}/")
        key = uri.removeprefix(f"s3://{self.minio.bucket}/")
        data = text.encode()
        self.s3.put_object(self.minio.bucket, key, io.BytesIO(data), len(data))

    def agents(self) -> None:
        with ThreadPoolExecutor(max_workers=self.writers) as pool:
            while not self.stop.is_set():
                began = time.monotonic()
                work = self._round()
                if work:
                    try:
                        list(pool.map(lambda item: self._put(*item), work))
                    except Exception as exc:
                        self.errors.append(f"status write: {exc!r}")
                    with self._lock:
                        self.writes += len(work)
                        self.rounds.append(time.monotonic() - began)
                self.stop.wait(max(0.0, self.heartbeat_s - (time.monotonic() - began)))

    def _round(self) -> list[tuple[str, str]]:
        """One heartbeat of every rank, under the plan its pod has now (none: no status)."""
        status = self.seen.status
        prefix = (status.get("artifacts") or {}).get("prefix")
        if not prefix:
            return []
        window = status.get("window") or {}
        watch = status.get("watch") or {}
        step = self.step_now()
        now = time.time()
        if window.get("planId"):
            plan_id, folder = str(window["planId"]), str(prefix)
            start = int(window.get("startStep") or step)
            steps = int(window.get("steps") or 10)
            phase: WorkerPhase = (
                "done" if step >= start + steps else "capturing" if step >= start else "armed"
            )
        elif watch.get("planId"):
            plan_id, folder, phase = str(watch["planId"]), f"{prefix}-watch", "armed"
        else:
            return []
        work = []
        for rank, pod in enumerate(self.ranks):
            text = WorkerStatus(
                rank=rank, pod=pod, plan_id=plan_id, phase=phase, step=step,
                last_step_unix=now, updated_unix=now, mean_step_ms=self.step_ms,
                max_step_ms=self.step_ms * 1.1, mean_steps=10,
            ).model_dump_json()  # fmt: skip
            work.append((f"{folder}/workers/{rank}/status.json", text))
        return work

    @contextmanager
    def running(self) -> Iterator[None]:
        threads = [
            threading.Thread(target=self.poll, name="poller", daemon=True),
            threading.Thread(target=self.agents, name="agents", daemon=True),
        ]
        for thread in threads:
            thread.start()
        try:
            yield
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=60)


class _Sampler:
    """The operator's RSS every half second (its peak: VmHWM at the end)."""

    def __init__(self, operator: OperatorProcess) -> None:
        self.operator = operator
        self.stop = threading.Event()
        self.peak = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self.peak = max(self.peak, self.operator.rss_mb())
            except OSError:
                return


# ---- the whole run --------------------------------------------------------------------------
def install_crd(kube: KubeCluster) -> None:
    kube.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(PERFDIAG_CRD), timeout=120
    )
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                 "crd/perfdiagnoses.perfdiag.io")  # fmt: skip


def diagnosis_manifest() -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PerfDiagnosis",
        "metadata": {"name": DIAGNOSIS},
        "spec": {
            "target": {"kind": "Pods", "selector": {"matchLabels": SELECTOR}},
            "capture": {"steps": 10, "timeoutSeconds": TIMEOUT_SECONDS},
        },
    }


def run_scale(
    kube: KubeCluster,
    minio: MinioServer,
    workdir: Path,
    namespace: str,
    pods: int,
    *,
    recheck_s: float = 15.0,
    heartbeat_s: float = 5.0,
    step_ms: float = 100.0,
    threads: int = 16,
    timeout_s: float = 900.0,
    progress: Callable[[str], None] = lambda _: None,
) -> ScaleResult:
    """Start the operator in `namespace` (which must exist, the CRD installed), create `pods`
    pods through its webhook, mark them Running, `kubectl apply` a PerfDiagnosis of them and
    play the ranks and the Job controller until it is Ready (or `timeout_s`)."""
    before_start = time.monotonic()
    operator = start_operator(kube, minio, workdir, namespace, recheck_s)
    try:
        wait_webhook(kube, namespace, operator)
        startup = time.monotonic() - before_start
        progress(f"operator up, webhook called after {startup:.1f} s")
        burst, created = create_pods(kube, namespace, pods, threads, scrape(kube))
        progress(f"{pods} pods created in {burst.seconds:.1f} s")
        names = [str(p["metadata"]["name"]) for p in created]
        running = mark_running(kube, namespace, names, threads)
        progress(f"{len(names)} pods Running in {running:.1f} s")
        load = _Load(kube, minio, namespace, sorted(names, key=_index),
                     heartbeat_s=heartbeat_s, step_ms=step_ms, poll_s=0.25,
                     writers=threads)  # fmt: skip
        sampler = _Sampler(operator)
        sampler.thread.start()
        before = scrape(kube)
        cpu_before = operator.cpu_seconds()
        began = time.monotonic()
        kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(diagnosis_manifest()))
        # kubectl apply of a new object: a GET (404) then the POST.
        load.requests[request_key("GET", PLURAL)] += 1
        load.requests[request_key("POST", PLURAL)] += 1
        applied = time.monotonic() - began
        load.began, load.began_unix = time.monotonic(), time.time()
        with load.running():
            deadline = time.monotonic() + timeout_s
            last = ""
            while time.monotonic() < deadline and load.seen.ready is None:
                if load.seen.failed or load.errors:
                    raise RuntimeError(f"the run failed: {load.seen.failed} {load.errors[:3]}")
                if operator.process.poll() is not None:
                    raise RuntimeError(f"operator exited:\n{operator.log_path.read_text()[-3000:]}")
                phase = str(load.seen.status.get("phase"))
                if phase != last:
                    progress(f"{time.monotonic() - began:6.1f} s  phase {phase}")
                    last = phase
                time.sleep(0.2)
        cpu = operator.cpu_seconds() - cpu_before
        after = scrape(kube)
        sampler.stop.set()
        peak = max(sampler.peak, operator.peak_rss_mb())
        if load.seen.ready is None:
            raise RuntimeError(f"not Ready after {timeout_s:g} s: {load.seen.status}")
    finally:
        operator.stop()

    def since(moment: float | None) -> float | None:
        return None if moment is None else round(moment - began, 2)

    seen = load.seen
    timeline = Timeline(
        applied=round(applied, 2),
        watching=since(seen.watching),
        decided=since(seen.decided),
        first_armed=since(seen.first_armed),
        armed=since(seen.armed),
        annotated=since(seen.window),
        collected=since(seen.analyzing),
        ready=since(seen.ready),
    )
    requests: Counter[str] = Counter()
    for (_, labels), value in delta(before, after, "apiserver_request_total").items():
        found = dict(labels)
        if found.get("resource"):
            key = request_key(found["verb"], found["resource"], found.get("subresource", ""))
            requests[key] += int(value)
    requests.subtract(load.requests)
    latency: dict[str, Quantiles] = {}
    durations = delta(before, after, "apiserver_request_duration_seconds_bucket")
    for verb in sorted({dict(labels)["verb"] for _, labels in durations}):
        if verb in ("WATCH", "CONNECT"):
            continue
        latency[verb] = histogram_quantiles(bucket_sum(durations, _verb_is(verb)))
    rounds = load.rounds
    return ScaleResult(
        pods=pods,
        startup_seconds=round(startup, 2),
        burst=burst,
        running_seconds=round(running, 2),
        timeline=timeline,
        armed_pods=seen.armed_pods,
        operator_peak_rss_mb=round(peak, 1),
        operator_cpu_seconds=round(cpu, 2),
        arming_read_seconds=arming_read_seconds(operator.log_path.read_text(errors="replace")),
        operator_requests={k: v for k, v in sorted(requests.items()) if v > 0},
        apiserver_latency=latency,
        heartbeat_rounds=len(rounds),
        heartbeat_round_seconds=round(statistics.mean(rounds), 2) if rounds else 0.0,
        status_writes=load.writes,
        load_average=os.getloadavg(),
    )


ARMING_LOG = re.compile(
    r"decided (?:\w+,)*arm\b.* after reading \d+ pod\(s\) and \d+ worker status\(es\) in "
    r"([\d.]+) s"
)


def arming_read_seconds(log: str) -> float | None:
    """How long the pass that armed read the pods and the ranks' statuses before deciding,
    from the operator's log line (the last pass that armed)."""
    found = ARMING_LOG.findall(log)
    return float(found[-1]) if found else None


def _verb_is(verb: str) -> Callable[[dict[str, str]], bool]:
    return lambda labels: labels.get("verb") == verb


def _index(name: str) -> int:
    return int(name.rsplit("-", 1)[1])
