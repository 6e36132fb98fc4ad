"""The image as built from the Dockerfile (the `perfdiag_image` fixture: buildah on a local
Debian base, see perfdiag_testing.image), run from its own files: the CLI, the hook folder the
webhook's init container copies, the agent and the analyzer as the image's user against the
suite's MinIO, and what the image must not hold."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perfdiag.operator.injection import (
    COPY_CONTAINER,
    HOOK_DIR,
    IMAGE_HOOK_DIR,
    InjectionConfig,
    inject,
)
from perfdiag.storage import open_storage
from perfdiag_testing.image import BuiltImage, run_in_image

ROOT = Path(__file__).resolve().parents[2]
SPOOL_WRITER = ROOT / "tests" / "engine" / "spool_writer.py"
SITE_PACKAGES = "usr/local/lib/python3.11/site-packages"

pytestmark = pytest.mark.timeout(1800)  # a cold first build: the base, then the image


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (
        f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def test_perfdiag_help_is_what_the_image_runs(perfdiag_image: BuiltImage, tmp_path: Path) -> None:
    assert perfdiag_image.entrypoint == ("perfdiag",)
    out = _ok(run_in_image(perfdiag_image, [], tmp_path / "c"))
    assert out.startswith("usage: perfdiag"), out
    assert "analyze" in out and "agent" in out and "operator" in out
    ids = _ok(run_in_image(perfdiag_image, ["id", "-u"], tmp_path / "id")).split()
    assert ids == ["10001"] and perfdiag_image.user == "10001:10001"


def _init_container_command() -> list[str]:
    pod = {
        "metadata": {"name": "p", "labels": {"perfdiag.io/inject": "true"}},
        "spec": {"containers": [{"name": "pytorch", "image": "x"}]},
    }
    patch = inject(pod, InjectionConfig(image="perfdiag", storage="s3://b/p", storage_secret="s"))
    assert patch is not None
    [copy] = [c for c in patch["spec"]["initContainers"] if c["name"] == COPY_CONTAINER]
    command: list[str] = copy["command"]
    return command


def test_hook_folder_copied_by_the_init_container_imports_without_torch(
    perfdiag_image: BuiltImage, tmp_path: Path
) -> None:
    assert (perfdiag_image.rootfs / IMAGE_HOOK_DIR.lstrip("/") / "sitecustomize.py").is_file()
    empty_dir = tmp_path / "hook"
    empty_dir.mkdir(mode=0o777)
    empty_dir.chmod(0o777)  # an emptyDir, as the kubelet makes it
    command = _init_container_command()
    assert command[:2] == ["cp", "-R"] and command[2].startswith(IMAGE_HOOK_DIR)
    _ok(run_in_image(perfdiag_image, command, tmp_path / "copy", mounts={HOOK_DIR: empty_dir}))
    assert (empty_dir / "sitecustomize.py").stat().st_uid == 10001
    # A plain Python (the image's Debian python3: neither perfdiag nor torch installed) with
    # the folder on PYTHONPATH, as the training container gets it; the hook installs itself.
    probe = (
        "import importlib.util, sys; "
        "assert importlib.util.find_spec('torch') is None, 'torch is there'; "
        "import perfdiag.collector.hook as h; "
        "print(h.__file__, 'sitecustomize' in sys.modules)"
    )
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o777)
    spool.chmod(0o777)
    env = {"PYTHONPATH": HOOK_DIR, "PERFDIAG_SPOOL": "/spool", "PERFDIAG_PLAN": "/spool/plan"}
    done = run_in_image(
        perfdiag_image,
        ["/usr/bin/python3", "-c", probe],
        tmp_path / "plain",
        user="1234:1234",  # a training image's user of its own
        env=env,
        mounts={HOOK_DIR: empty_dir, "/spool": spool},
    )
    out = _ok(done)
    assert out.split() == [f"{HOOK_DIR}/perfdiag/collector/hook/__init__.py", "True"], out
    assert "not loaded" not in done.stderr, done.stderr


def test_agent_and_analyzer_run_as_the_image_user_against_minio(
    perfdiag_image: BuiltImage,
    minio_server: Any,
    s3_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in minio_server.env().items():  # this process reads what they write
        monkeypatch.setenv(key, value)
    # The training side (this machine's Python with torch) writes a window into the spool.
    spool = tmp_path / "spool"
    spool.mkdir()
    spool.chmod(0o777)
    written = subprocess.run(
        [sys.executable, str(SPOOL_WRITER), str(spool), "--plan-id", "p1", "--steps", "4"],
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    _ok(written)
    env = minio_server.env()
    agent = ["perfdiag", "agent", "--spool", "/perfdiag/spool", "--storage", s3_prefix,
             "--once", "--no-raw"]  # fmt: skip
    _ok(run_in_image(perfdiag_image, agent, tmp_path / "agent", env=env,
                     mounts={"/perfdiag/spool": spool}))  # fmt: skip
    storage = open_storage(f"{s3_prefix}/p1")
    assert storage.exists("workers/0/summary.parquet")
    analyze = ["perfdiag", "analyze", f"{s3_prefix}/p1", "--quiet", "--expected-ranks", "1"]
    _ok(run_in_image(perfdiag_image, analyze, tmp_path / "analyzer", env=env))
    verdict = json.loads(storage.get_text("verdict.json"))
    # One rank of a tiny model: whether an expected-range finding makes it degraded depends on
    # the host's load; what matters here is a complete verdict, written as the image's user.
    assert verdict["status"] in ("healthy", "degraded"), verdict
    assert [w["state"] for w in verdict["workers"]] == ["ok"], verdict["workers"]
    assert storage.exists("report.html")


def test_the_image_holds_no_test_support_compiler_or_secrets(perfdiag_image: BuiltImage) -> None:
    root = perfdiag_image.rootfs
    site = root / SITE_PACKAGES
    assert (site / "perfdiag" / "cli" / "__init__.py").is_file()
    assert not (site / "perfdiag" / "testing").exists()
    assert not (site / "perfdiag_testing").exists()
    for package in ("pytest", "hypothesis", "torch", "mypy", "ruff", "_pytest"):
        assert not (site / package).exists(), package
    for folder in ("src", "wheels", "hook", "tests", "tmp/pd"):
        assert not (root / folder).exists(), folder
    for compiler in ("gcc", "cc", "x86_64-linux-gnu-gcc", "c99", "clang"):
        assert not (root / "usr" / "bin" / compiler).exists(), compiler
    secret_names = re.compile(r"SECRET|PASSWORD|TOKEN|ACCESS_KEY|CREDENTIAL", re.I)
    assert not [k for k in perfdiag_image.env if secret_names.search(k)], perfdiag_image.env
    # (third-party packages are left out: pycryptodome's self-tests carry published test keys)
    places = ["root", "home", "tmp", "opt", "etc", "usr/local/bin", f"{SITE_PACKAGES}/perfdiag"]
    found = []
    for place in places:
        for path in (root / place).rglob("*"):
            if path.is_symlink() or not path.is_file() or path.stat().st_size > 1_000_000:
                continue
            named = path.name in (".env", "credentials", "kubeconfig", "id_rsa", "id_ed25519")
            if named or b"PRIVATE KEY-----" in path.read_bytes():
                found.append(path)
    assert not found, found


def test_the_size_in_install_md_is_the_images(perfdiag_image: BuiltImage) -> None:
    """docs/install.md gives the image's size; it must stay within 15% of the built one."""
    text = (ROOT / "docs" / "install.md").read_text()
    documented = re.search(r"image size[^0-9]*([0-9]+) MB", text)
    assert documented, "docs/install.md: no 'image size … NNN MB'"
    built = re.fullmatch(r"([0-9.]+) ([kMG]B)", perfdiag_image.size)
    assert built, perfdiag_image.size
    megabytes = float(built.group(1)) * {"kB": 1e-3, "MB": 1.0, "GB": 1e3}[built.group(2)]
    print(f"\nimage {perfdiag_image.name}: {perfdiag_image.size}", flush=True)
    assert abs(megabytes - int(documented.group(1))) <= 0.15 * megabytes, (
        f"the image is {perfdiag_image.size}; docs/install.md says {documented.group(0)}"
    )
