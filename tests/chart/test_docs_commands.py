"""Every shell block of docs/install.md, then of docs/operator.md, run in order as a reader would,
against a real control plane and the suite's MinIO (the convention: tests/chart/docs_support.py
and docs/testing.md, "The documents' commands").

The control plane is one of its own, started as the session's is: the documents use fixed names
(perfdiag-system, team-a, bert-pretrain) and install cluster-wide objects (a pod webhook, an
operator serving every namespace) that must not meet the other tests. What the documents assume
the reader has is set up first and said here: the Kubeflow training operator's CRDs, the
namespace team-a of the training jobs, the bucket of `storage.uri`, and, before "5. Run a
diagnosis", the job the diagnosis names, bert-pretrain, running opted in (the Kubeflow CPU
example, 2 pods × 2 ranks of perfdiag's demo training, its pods created as the training
operator would and injected by the release's webhook). What the control plane lacks is played
(tests/chart/played_operator.py, perfdiag_testing.kubelet): the operator Deployment's pod, the
webhook call through its Service, the training pods and the analyzer Job."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from perfdiag_testing.binaries import BinariesMissing, find_bin_dir
from perfdiag_testing.kube import KubeCluster, start_kube_cluster
from perfdiag_testing.kubelet import LocalKubelet
from perfdiag_testing.local_images import PERFDIAG_IMAGE, TRAINING_IMAGE, base_env, images
from perfdiag_testing.training_operator import pytorchjob_pods
from tests.chart.docs_support import Outcome, Substitution, blocks, run, scripts
from tests.chart.played_operator import OperatorDeployment, inject
from tests.operator.e2e_support import KUBEFLOW, Training, demo_args, pytorchjob

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "docs" / "install.md"
OPERATOR = ROOT / "docs" / "operator.md"
RELEASE_NS, RELEASE = "perfdiag-system", "perfdiag"  # as docs/install.md names them
TEAM_NS, JOB = "team-a", "bert-pretrain"
BUCKET = "ml-diagnostics"  # the bucket of docs/install.md's storage.uri
BLOCK_LIMIT_S = 240.0
DIAGNOSIS = "5. Run a diagnosis and read the verdict"  # docs/install.md
QUICK_START = "Quick start"  # docs/operator.md
DIAGNOSIS_LIMIT_S = 600.0  # blocks that wait for a whole diagnosis (their kubectl wait: 15 min)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]


@dataclass
class World:
    cluster: KubeCluster
    minio: Any
    workdir: Path
    env: dict[str, str]
    operator: OperatorDeployment
    training: Training | None = None
    outcomes: dict[str, list[Outcome]] = field(default_factory=dict)

    def diagnostics(self) -> str:
        parts = [f"--- the operator pod (played) ---\n{self.operator.log_tail()}"]
        if self.training is not None:
            parts.append(f"--- the training job's pods (played) ---\n{self.training.logs()}")
        return "\n".join(parts)


@pytest.fixture(scope="module")
def world(minio_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("docs-commands")
    bin_dir = _bin_dir()
    cluster = start_kube_cluster(bin_dir, workdir / "kube")
    try:
        for crd in ("kubeflow.org_pytorchjobs.yaml", "trainer.kubeflow.org_trainjobs.yaml"):
            cluster.kubectl("apply", "--server-side", "-f", str(KUBEFLOW / crd), timeout=120)
        cluster.kubectl("create", "namespace", TEAM_NS)
        client = minio_server.client()
        if not client.bucket_exists(BUCKET):
            client.make_bucket(BUCKET)
        home = workdir / "home"
        home.mkdir()
        env = {
            "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            **cluster.env(),
        }
        operator = OperatorDeployment(
            cluster,
            RELEASE_NS,
            RELEASE,
            entrypoint=str(Path(sys.executable).with_name("perfdiag")),
            workdir=workdir / "operator-pod",
            base_env=base_env(),
        ).start()
        world = World(cluster, minio_server, workdir, env, operator)
        try:
            yield world
        finally:
            if world.training is not None:
                world.training.stop_file.touch()
                world.training.kubelet.stop()
            operator.stop()
    finally:
        cluster.stop()


def _bin_dir() -> Path:
    try:
        return find_bin_dir(("etcd", "kube-apiserver", "kubectl", "helm"), repo_root=ROOT)
    except BinariesMissing as exc:
        pytest.fail(f"cannot start the test servers: {exc}", pytrace=False)


def credentials(minio: Any, ellipsis: str, endpoint: str) -> list[Substitution]:
    """The reader's credentials and S3 endpoint → the suite's MinIO (no cluster DNS here)."""
    return [
        Substitution(f"AWS_ACCESS_KEY_ID={ellipsis}", f"AWS_ACCESS_KEY_ID={minio.access_key}",
                     "the suite's MinIO credentials"),
        Substitution(f"AWS_SECRET_ACCESS_KEY={ellipsis}",
                     f"AWS_SECRET_ACCESS_KEY={minio.secret_key}", "the suite's MinIO credentials"),
        Substitution(endpoint, minio.url, "the suite's MinIO: nothing resolves cluster names here"),
    ]  # fmt: skip


def run_document(
    world: World,
    path: Path,
    changes: list[Substitution],
    before: dict[str, Callable[[World], None]] | None = None,
    limits: dict[str, float] | None = None,
) -> list[Outcome]:
    """Run the document's blocks in order until one fails. `before`: what the reader has
    before the first block under a heading; `limits`: longer time limits by heading."""
    before, limits = before or {}, limits or {}
    planned = scripts(blocks(path), changes)
    headings = {block.heading for block, _ in planned}
    missing = [h for h in [*before, *limits] if h not in headings]
    assert not missing, f"{path.name} has no heading {missing}: update the test"
    outcomes: list[Outcome] = []
    for block, script in planned:
        if script is None:
            print(f"not run: {block.name}: {block.not_run}")
            continue
        prepare = before.pop(block.heading, None)
        if prepare is not None:
            prepare(world)
        limit = limits.get(block.heading, BLOCK_LIMIT_S)
        outcome = run(block, script, cwd=ROOT, env=world.env, timeout=limit)
        print(f"ran {block.name} in {outcome.seconds:.1f} s: exit {outcome.returncode}")
        print("    " + outcome.output[-2000:].rstrip().replace("\n", "\n    "))
        outcomes.append(outcome)
        if not outcome.ok:
            break
    return outcomes


def start_training(world: World) -> None:
    """The job the diagnosis names, running: the PyTorchJob applied, its pods created by the
    training operator (played) through the release's webhook (the API server's call played),
    run by the suite's kubelet until every rank trains."""
    workdir = world.workdir / "training"
    stop_file = workdir / f"{JOB}.stop"
    cluster = world.cluster
    job = pytorchjob(JOB, demo_args(stop_file))
    cluster.kubectl("apply", "-n", TEAM_NS, "-f", "-", input=json.dumps(job))
    created = json.loads(
        cluster.kubectl("get", "pytorchjob", JOB, "-n", TEAM_NS, "-o", "json").stdout
    )
    port = world.operator.webhook_port
    assert port is not None, "the operator pod is not running"
    for pod in pytorchjob_pods(created):
        injected = inject(cluster, RELEASE, pod, port)
        cluster.kubectl("create", "-f", "-", input=json.dumps(injected))
    deployment = json.loads(
        cluster.kubectl("get", "deployment", RELEASE, "-n", RELEASE_NS, "-o", "json").stdout
    )
    perfdiag_image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    local = images(workdir)
    kubelet = LocalKubelet(
        cluster.api_client(),
        TEAM_NS,
        workdir / "kubelet",
        {perfdiag_image: local[PERFDIAG_IMAGE], TRAINING_IMAGE: local[TRAINING_IMAGE]},
        base_env(),
    ).start()
    names = [p["metadata"]["name"] for p in pytorchjob_pods(created)]
    training = Training(JOB, created["metadata"]["uid"], names, kubelet, stop_file)
    world.training = training

    def all_ranks_train() -> bool:
        steps = training.steps()
        failed = [p for p in kubelet.pods.values() if p.phase == "Failed"]
        assert not failed, f"a training pod failed:\n{training.logs()}"
        return len(steps) == 4 and min(steps.values()) >= 5

    _wait(all_ranks_train, "the 4 ranks of bert-pretrain training", 240)


def _wait(probe: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _assert_ran(
    world: World, path: Path, outcomes: list[Outcome], changes: list[Substitution]
) -> None:
    assert outcomes, f"no block of {path.name} ran"
    last = outcomes[-1]
    if not last.ok:
        raise AssertionError(f"{last.report(changes)}\n{world.diagnostics()}")
    planned = [b for b in blocks(path) if b.not_run is None]
    assert len(outcomes) == len(planned)


def install_changes(world: World) -> list[Substitution]:
    return credentials(world.minio, "...", "http://minio.minio:9000")


@pytest.fixture(scope="module")
def installed(world: World) -> list[Outcome]:
    """docs/install.md run (once per module: docs/operator.md follows it)."""
    if "install" not in world.outcomes:
        world.outcomes["install"] = run_document(
            world,
            INSTALL,
            install_changes(world),
            before={DIAGNOSIS: start_training},
            limits={DIAGNOSIS: DIAGNOSIS_LIMIT_S},
        )
    return world.outcomes["install"]


def test_install_md_runs_as_written(world: World, installed: list[Outcome]) -> None:
    _assert_ran(world, INSTALL, installed, install_changes(world))


def test_operator_md_runs_after_install_md(world: World, installed: list[Outcome]) -> None:
    if not (installed and installed[-1].ok and len(installed) == _runnable(INSTALL)):
        pytest.fail("docs/install.md did not run to its end (see its test)", pytrace=False)
    changes = credentials(world.minio, "…", "https://minio.example:9000")
    outcomes = run_document(world, OPERATOR, changes, limits={QUICK_START: DIAGNOSIS_LIMIT_S})
    _assert_ran(world, OPERATOR, outcomes, changes)


def _runnable(path: Path) -> int:
    return sum(1 for b in blocks(path) if b.not_run is None)
