"""Where the pinned test binaries are (built by scripts/test-binaries.sh, cached per machine)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

BIN_DIR_VARIABLE = "PERFDIAG_BIN_DIR"
ALL_BINARIES = ("etcd", "kube-apiserver", "kubectl", "minio", "helm", "kubeconform")
HELM_ENV = {
    "HELM_CONFIG_HOME": "/nonexistent",
    "HELM_CACHE_HOME": "/nonexistent",
    "HELM_DATA_HOME": "/nonexistent",
    "PATH": "/usr/bin:/bin",
}
"""helm's environment in the suite: no user configuration, cache, repositories or plugins."""

HOW_TO_BUILD = (
    "Build them once per machine with `scripts/test-binaries.sh` (its last line is the directory; "
    "a cold build takes a while) and export PERFDIAG_BIN_DIR=<that directory>, or run the suite "
    "through `make test` / `scripts/run-tests.sh`, which do both. To skip the cluster tests on "
    "purpose, set PERFDIAG_SKIP_CLUSTER_TESTS=1."
)


class BinariesMissing(RuntimeError):
    """The binaries the real servers need are not there; the message says how to get them."""


def _cached_dir(repo_root: Path) -> Path | None:
    """The directory scripts/test-binaries.sh fills for its current pins, if it already exists.

    Lets `pytest` run directly (without scripts/run-tests.sh) once the binaries were built;
    never builds anything itself.
    """
    script = repo_root / "scripts" / "test-binaries.sh"
    if not script.is_file():
        return None
    result = subprocess.run(
        ["bash", str(script), "--versions"], capture_output=True, text=True, check=False
    )
    tags = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("tag ")]
    if result.returncode != 0 or not tags:
        return None
    cache_root = os.environ.get("PERFDIAG_BIN_CACHE") or str(Path.home() / ".cache/perfdiag/bin")
    return Path(cache_root) / tags[0]


def find_bin_dir(
    needed: Iterable[str], repo_root: Path | None = None, environ: Mapping[str, str] | None = None
) -> Path:
    """The directory holding `needed`: $PERFDIAG_BIN_DIR, else the cache of the pinned build."""
    env = os.environ if environ is None else environ
    needed = tuple(needed)
    configured = env.get(BIN_DIR_VARIABLE)
    if configured:
        directory, origin = Path(configured), f"{BIN_DIR_VARIABLE}={configured}"
    else:
        cached = _cached_dir(repo_root) if repo_root is not None else None
        if cached is None:
            raise BinariesMissing(
                f"{BIN_DIR_VARIABLE} is not set. The cluster tests need "
                f"{', '.join(needed)}: {HOW_TO_BUILD}"
            )
        directory, origin = cached, f"the pinned build cache {cached} ({BIN_DIR_VARIABLE} unset)"
    missing = [name for name in needed if not os.access(directory / name, os.X_OK)]
    if missing:
        raise BinariesMissing(
            f"{', '.join(missing)} not found (or not executable) in {origin}. {HOW_TO_BUILD}"
        )
    return directory.resolve()
