"""Session fixtures of the real control plane (docs/design.md §6); see docs/testing.md.

- `kube_cluster`: etcd + kube-apiserver on loopback, admin kubeconfig (perfdiag_testing.kube).
- `minio_server`: MinIO on loopback with generated credentials and a fresh bucket.
- `s3_prefix`: a fresh `s3://bucket/<random>` URI per test; `kube_namespace`: a fresh namespace.
- `prometheus_server`: Debian's Prometheus on loopback, scraping the port the in-process operator
  serves its metrics on (`.operator_port`) as the chart's ServiceMonitor says, and the
  kube-apiserver; evaluating the chart's alerting rules (perfdiag_testing.monitoring).
- `perfdiag_image`: the image built from the Dockerfile with buildah on a local Debian base
  (perfdiag_testing.image), and its root filesystem. A build that fails FAILS the tests using
  it (never a skip); its name, size and build time are printed at the end.

Tests using them are marked `cluster` automatically (and should say so with
@pytest.mark.cluster). Missing binaries make those tests FAIL with a message saying how to build
them; only PERFDIAG_SKIP_CLUSTER_TESTS=1, set by a person (never by .ci/run), skips them.
Server logs live in a session folder that is deleted after a green session and kept (path
printed at the end) after a failed one.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from perfdiag_testing.binaries import BinariesMissing, find_bin_dir
from perfdiag_testing.image import BuiltImage, ImageBuildFailed, build_image
from perfdiag_testing.kube import KubeCluster, start_kube_cluster
from perfdiag_testing.minio_server import MinioServer, start_minio
from perfdiag_testing.processes import free_port
from perfdiag_testing.prometheus_server import PrometheusMissing, PrometheusServer, find_prometheus

REPO_ROOT = Path(__file__).resolve().parents[1]
SKIP_VARIABLE = "PERFDIAG_SKIP_CLUSTER_TESTS"
CLUSTER_FIXTURES = frozenset(
    {"kube_cluster", "minio_server", "s3_prefix", "kube_namespace", "prometheus_server"}
)

_workdir_key = pytest.StashKey[Path]()
_notes_key = pytest.StashKey[list[str]]()


def _skip_requested() -> bool:
    return os.environ.get(SKIP_VARIABLE) == "1"


@pytest.hookimpl(tryfirst=True)  # before `-m` selection reads the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(
        reason=f"{SKIP_VARIABLE}=1: cluster tests skipped on request (CI never sets it)"
    )
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
        # `make test` runs the tests without this marker while a fresh machine builds them.
        if item.get_closest_marker("cluster") is not None:
            item.add_marker(pytest.mark.binaries)
        if _skip_requested() and item.get_closest_marker("cluster") is not None:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_notes_key] = []


_exit_status_key = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_exit_status_key] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave without interpreter finalization, as the `perfdiag` command does (see
    perfdiag.cli.exit_now: pyarrow can abort at exit after reading Parquet), so a passing run
    never ends in SIGABRT. Everything pytest reports is written by now."""
    status = config.stash.get(_exit_status_key, None)
    if status is not None:
        from perfdiag.cli import exit_now

        exit_now(status)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    notes = terminalreporter.config.stash.get(_notes_key, [])
    if notes:
        terminalreporter.write_sep("-", "perfdiag test servers and image")
        for line in notes:
            terminalreporter.write_line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    workdir = item.config.stash.get(_workdir_key, None)
    if report.failed and workdir is not None and item.get_closest_marker("cluster") is not None:
        logs = sorted(workdir.glob("*/logs/*.log"))
        if logs:
            report.sections.append(
                ("perfdiag test servers", "server logs (kept): " + ", ".join(map(str, logs)))
            )
    return report


@pytest.fixture(scope="session")
def cluster_workdir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """Session folder for certificates, data and logs of the test servers."""
    workdir = Path(tempfile.mkdtemp(prefix="perfdiag-servers-"))
    request.config.stash[_workdir_key] = workdir
    yield workdir
    notes = request.config.stash[_notes_key]
    if request.session.testsfailed and any(workdir.glob("*/logs/*.log")):
        # Keep logs, certificates and kubeconfig for the post-mortem; drop the bulky data.
        for data in (
            *workdir.glob("*/etcd-data"),
            *workdir.glob("*/minio-data"),
            *workdir.glob("prometheus/data"),
        ):
            shutil.rmtree(data, ignore_errors=True)
        logs = ", ".join(str(path) for path in sorted(workdir.glob("*/logs")))
        notes.append(f"session failed: server logs kept in {logs or workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def _bin_dir(needed: tuple[str, ...]) -> Path:
    if _skip_requested():
        pytest.skip(f"{SKIP_VARIABLE}=1: cluster tests skipped on request")
    try:
        return find_bin_dir(needed, repo_root=REPO_ROOT)
    except BinariesMissing as exc:
        problem = str(exc)
    pytest.fail(f"cannot start the test servers: {problem}", pytrace=False)


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest, cluster_workdir: Path) -> Iterator[KubeCluster]:
    """A real etcd + kube-apiserver; `.kubectl(...)`, `.api_client()`, `.kubeconfig`."""
    bin_dir = _bin_dir(("etcd", "kube-apiserver", "kubectl"))
    cluster = start_kube_cluster(bin_dir, cluster_workdir / "kube")
    request.config.stash[_notes_key].append(
        f"kube-apiserver {cluster.server} ready {cluster.ready_seconds:.1f} s after start "
        "(certificates, etcd, apiserver)"
    )
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def minio_server(request: pytest.FixtureRequest, cluster_workdir: Path) -> Iterator[MinioServer]:
    """A real MinIO with a fresh bucket; `.env()` holds the standard AWS_* variables."""
    bin_dir = _bin_dir(("minio",))
    server = start_minio(bin_dir / "minio", cluster_workdir / "minio")
    request.config.stash[_notes_key].append(
        f"minio {server.url} ready {server.ready_seconds:.1f} s after start"
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def prometheus_server(
    request: pytest.FixtureRequest, cluster_workdir: Path, kube_cluster: KubeCluster
) -> Iterator[PrometheusServer]:
    """A real Prometheus scraping the operator's metrics port (`.operator_port`, where the
    in-process operator of the tests serves them) and the kube-apiserver, every second, and
    evaluating the chart's PrometheusRule."""
    from perfdiag_testing import monitoring

    helm = _bin_dir(("helm",)) / "helm"
    try:
        binary = find_prometheus()
    except PrometheusMissing as exc:
        pytest.fail(f"cannot start Prometheus: {exc}", pytrace=False)
    docs = monitoring.render(helm, REPO_ROOT / "charts" / "perfdiag")
    port = free_port()
    certs = kube_cluster.certs
    server = PrometheusServer(
        binary,
        cluster_workdir / "prometheus",
        [
            monitoring.operator_scrape_config(docs, f"127.0.0.1:{port}"),
            monitoring.apiserver_scrape_config(
                kube_cluster.server, certs.ca_cert, certs.admin_cert, certs.admin_key
            ),
        ],
        monitoring.rule_groups(docs),
    )
    server.operator_port = port
    server.start()
    request.config.stash[_notes_key].append(
        f"prometheus {server.url} ready {server.ready_seconds:.1f} s after start"
    )
    yield server
    server.stop()


@pytest.fixture
def s3_prefix(minio_server: MinioServer) -> str:
    """A fresh, empty `s3://<bucket>/<random>` location on the session's MinIO."""
    if not minio_server.running():
        # A test that stopped MinIO and failed before restarting it must not break the next.
        minio_server.start()
    return f"s3://{minio_server.bucket}/t-{secrets.token_hex(6)}"


@pytest.fixture
def kube_namespace(kube_cluster: KubeCluster) -> str:
    """A fresh namespace. Not deleted: without a controller-manager it would stay Terminating;
    the whole cluster goes at the end of the session."""
    name = f"t-{secrets.token_hex(5)}"
    kube_cluster.kubectl("create", "namespace", name)
    return name


@pytest.fixture(scope="session")
def perfdiag_image(request: pytest.FixtureRequest) -> BuiltImage:
    """The image of this checkout (built once per change of what the Dockerfile copies)."""
    try:
        image = build_image(REPO_ROOT)
    except ImageBuildFailed as exc:
        pytest.fail(f"the image did not build: {exc}", pytrace=False)
    how = f"built in {image.build_seconds:.0f} s" if image.build_seconds else "reused (unchanged)"
    request.config.stash[_notes_key].append(f"image {image.name}: {image.size}, {how}")
    return image
